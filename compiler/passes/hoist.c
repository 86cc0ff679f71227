/* hoist.c: step-scope values that need no reduction (bias corrections,
 * step_size, the grad scale, f32 copies of hyperparameters) move ahead of
 * every per-element value. They are computed once per step, on the host,
 * never in the element loop. Everything else keeps its order. */
#include "passes.h"

bool pass_hoist(Graph *g) {
  int n = g->nins;
  /* A step value "needs a reduction" when one of its operands does or is one. */
  bool *late = arena_alloc(g->arena, (size_t)n + 1);
  Ref *order = arena_alloc(g->arena, sizeof(Ref) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    late[i] = x->op == OP_REDUCE;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      late[i] |= late[x->args[k]];
  }
  int m = 0;
  for (int i = 0; i < n; i++)
    if (g->ins[i].scope == SCOPE_STEP && !late[i] && g->ins[i].op != OP_STORE)
      order[m++] = i;
  for (int i = 0; i < n; i++)
    if (!(g->ins[i].scope == SCOPE_STEP && !late[i] && g->ins[i].op != OP_STORE))
      order[m++] = i;
  graph_permute(g, order);
  return true;
}
