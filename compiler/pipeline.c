/* pipeline.c: the passes, in the order they run. */
#include "passes.h"
#include "plan.h"

#include <string.h>

static bool run_verify(Graph *g) { return ir_verify(g); }
static bool run_dce(Graph *g) { return pass_dce(g), true; }
static bool run_plan(Graph *g) {
  g->plan = plan_build(g);
  return g->plan != NULL;
}

const Pass pipeline_passes[] = {
    {"verify", "check types, scopes, SSA order and stores", run_verify},
    {"canonicalize", "fold constants; identities that keep every bit", pass_canonicalize},
    {"cse", "one value per distinct computation", pass_cse},
    {"dce", "drop what no store or reduction needs", run_dce},
    {"hoist", "step-scope values ahead of the element loop", pass_hoist},
    {"drop-grad-writeback", "no store of scaled grads nobody reads", pass_drop_grad_writeback},
    {"partition", "phases at step-scope reductions; recompute across phases", pass_partition},
    {"plan", "buffers, reductions and bytes per element of each phase", run_plan},
};
const int pipeline_num_passes = ARRAY_LEN(pipeline_passes);

int pipeline_find_pass(const char *name) {
  for (int i = 0; i < pipeline_num_passes; i++)
    if (strcmp(pipeline_passes[i].name, name) == 0)
      return i;
  return -1;
}

static void dump(const Graph *g, FILE *f, const char *title) {
  fprintf(f, "// ----- IR Dump %s -----\n", title);
  ir_print_file(g, f);
}

bool pipeline_run(Graph *g, const PipelineOptions *opt) {
  if (opt->dump_input && opt->dump)
    dump(g, opt->dump, "Before Passes");
  for (int i = 0; i < pipeline_num_passes; i++) {
    const Pass *p = &pipeline_passes[i];
    if (!p->run(g))
      return false;
    if (opt->verify_each && !ir_verify(g)) {
      fprintf(stderr, "optc: internal error: the IR is invalid after pass '%s'\n", p->name);
      return false;
    }
    if (opt->dump_after && opt->dump &&
        (strcmp(opt->dump_after, "all") == 0 || strcmp(opt->dump_after, p->name) == 0)) {
      char title[96];
      snprintf(title, sizeof title, "After %s", p->name);
      dump(g, opt->dump, title);
    }
  }
  return true;
}
