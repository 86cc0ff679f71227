/* pipeline.c: the passes, in the order they run. */
#include "passes.h"

#include <string.h>

static bool run_verify(Graph *g) { return ir_verify(g); }

const Pass pipeline_passes[] = {
    {"verify", "check types, scopes, SSA order and stores", run_verify},
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
