/* dce.c: dead code elimination.
 *
 * A value is live when a store or a live value uses it, and so is a
 * reduction to step scope: its value is one of the step's results
 * (StepResult.red; optc.grad_norm's whole point). Everything else goes,
 * inputs included, and so do state buffers that no live load or store
 * names: the executor then never allocates or streams them. */
#include "passes.h"

#include <string.h>

void pass_dce(Graph *g) {
  int n = g->nins;
  bool *live = arena_alloc(g->arena, (size_t)n + 1);
  /* An input that starts a state buffer is read by the runtime. */
  NameMap names = {0}; /* built at the first buffer that needs it */
  for (int b = 0; b < g->nbufs; b++)
    if (g->bufs[b].init == INIT_INPUT) {
      if (!names.slots)
        graph_value_map(g, &names);
      Ref r = namemap_get(&names, g->bufs[b].init_input, strlen(g->bufs[b].init_input));
      if (r != NOREF && (g->ins[r].op == OP_INPUT || g->ins[r].op == OP_OPTION))
        live[r] = true;
    }
  for (int i = n - 1; i >= 0; i--) {
    Ins *x = &g->ins[i];
    if ((op_info[x->op].flags & F_SIDE) || (x->op == OP_REDUCE && x->to == SCOPE_STEP))
      live[i] = true;
    if (!live[i])
      continue;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      live[x->args[k]] = true;
    if (x->dep != NOREF)
      live[x->dep] = true;
  }
  graph_compact(g, live);

  /* Drop state buffers nothing uses, and renumber the rest. */
  int *used = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nbufs + 1));
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].buf >= 0)
      used[g->ins[i].buf] = 1;
  int *map = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nbufs + 1));
  int nb = 0;
  for (int b = 0; b < g->nbufs; b++) {
    if (!used[b] && g->bufs[b].kind == BUF_STATE) {
      map[b] = -1;
      continue;
    }
    map[b] = nb;
    g->bufs[nb++] = g->bufs[b];
  }
  g->nbufs = nb;
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].buf >= 0)
      g->ins[i].buf = map[g->ins[i].buf];
}
