/* drop_grad_writeback.c: torch leaves the scaled and clipped grads in
 * p.grad, so the step graph stores them; but nothing reads them after the
 * step, so the store (and what only fed it) goes, unless the recipe keeps
 * them (write_back_grads: true marks the buffer `writeback`). For bf16
 * AdamW that is 2 of 16 bytes per element. */
#include "passes.h"

bool pass_drop_grad_writeback(Graph *g) {
  bool *keep = arena_alloc(g->arena, (size_t)g->nins + 1);
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    keep[i] = !(x->op == OP_STORE && g->bufs[x->buf].kind == BUF_GRAD && !g->bufs[x->buf].writeback);
  }
  graph_compact(g, keep);
  pass_dce(g);
  return true;
}
