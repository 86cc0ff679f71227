/* partition.c: cuts the step into phases, one pass over memory each.
 *
 * A value that reads a step-scope (or tensor-scope) reduction cannot be
 * computed in the pass that produces the reduction: the reduction is known
 * only once every element has been seen. So values are staged: stage 0
 * needs no reduction, stage s+1 reads a reduction of stage-s values.
 * Phase k is one element loop computing what the reductions of stage k+1
 * need, and in the last phase, everything the stores need. Between phases,
 * ^stepK holds the step-scope values (clip coefficient, ...) that phase k
 * reads.
 *
 * A per-element value needed by several phases (the scaled grad: its
 * squares in phase 0, the update in phase 1) is recomputed from loads in
 * each phase. Storing it in phase k and reading it back later would move
 * 2 * its size per element; recomputing moves the loads it depends on that
 * the later phase does not read anyway. For every step graph optc builds
 * recomputing is cheaper (the loads are the grad, which is smaller than the
 * f32 value it becomes), and the choice is checked: the pass reports an
 * error rather than silently moving more bytes, if storing ever wins.
 *
 * Every store lands in the last phase, so that every load in every phase
 * reads the buffers as they were before the step.
 *
 * A reduction to block scope (a quantized state's absmax) starts no phase:
 * a block is a few hundred elements inside one chunk, so the phase that
 * needs it computes it there, in a loop over the block before the values
 * that read it (lower.c's block stages). It is a per-element value here,
 * copied into each phase that needs it like any other. */
#include "passes.h"

#include <string.h>

/* How many times its size recomputing may grow a graph. */
enum { MAX_GROWTH = 16 };

/* A value the element loops read as computed before them: a step value, or
 * a reduction over a tensor or the group. */
static bool is_global(const Ins *x) { return x->scope == SCOPE_STEP || (x->op == OP_REDUCE && x->to != SCOPE_BLOCK); }

/* A reduction that ends a phase. */
static bool is_phase_reduce(const Ins *x) { return x->op == OP_REDUCE && x->to != SCOPE_BLOCK; }

bool pass_partition(Graph *g) {
  pass_dce(g);
  int n = g->nins;
  int *stage = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1));
  int last = 0;
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    int s = 0;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      s = MAX(s, stage[x->args[k]]);
    stage[i] = is_phase_reduce(x) ? s + 1 : s;
    if (x->op == OP_STORE)
      last = MAX(last, s);
    if (is_phase_reduce(x))
      last = MAX(last, s);
    if (x->op == OP_REDUCE && g->ins[x->args[0]].scope == SCOPE_TENSOR) {
      error_at(x->pos, "a reduction of tensor-scope values is not supported by the compiled backends");
      return false;
    }
    if (is_phase_reduce(x) && g->ins[x->args[0]].scope == SCOPE_BLOCK) {
      error_at(x->pos, "a reduction of block-scope values to %s is not supported by the compiled backends",
               scope_names[x->to]);
      return false;
    }
    if ((x->op == OP_STORE || x->op == OP_REDUCE) && s >= IR_MAX_PHASES) {
      error_at(x->pos, "this %s waits for a chain of %d reductions, each a pass over memory; a step has at most %d",
               op_info[x->op].name, s, IR_MAX_PHASES);
      return false;
    }
  }
  int nphases = last + 1;
  /* need[k * n + i]: phase k computes per-element value i */
  bool *need = arena_alloc(g->arena, (size_t)nphases * (size_t)n + 1);
  for (int k = 0; k < nphases; k++) {
    bool *nk = need + (size_t)k * (size_t)n;
    for (int i = n - 1; i >= 0; i--) {
      const Ins *x = &g->ins[i];
      bool root = (is_phase_reduce(x) && stage[i] == k + 1) || (x->op == OP_STORE && k == last);
      if (!root && !nk[i])
        continue;
      nk[i] = true;
      for (int a = 0; a < op_info[x->op].nargs; a++)
        if (!is_global(&g->ins[x->args[a]]))
          nk[x->args[a]] = true;
    }
  }
  /* Recompute or spill: what each later phase must load again to recompute
   * its copies, against writing and reading the values it copies. */
  bool *placed = arena_alloc(g->arena, (size_t)n + 1);
  bool *fresh_use = arena_alloc(g->arena, (size_t)n + 1); /* used by a value this phase computes fresh */
  for (int k = 0; k < nphases; k++) {
    const bool *nk = need + (size_t)k * (size_t)n;
    int recompute = 0, spill = 0;
    bool *loads_here = arena_alloc(g->arena, (size_t)g->nbufs + 1);
    memset(fresh_use, 0, (size_t)n + 1);
    for (int j = 0; j < n; j++) {
      const Ins *y = &g->ins[j];
      if (!nk[j] || placed[j])
        continue;
      if (y->op == OP_LOAD)
        loads_here[y->buf] = true;
      for (int a = 0; a < op_info[y->op].nargs; a++)
        fresh_use[y->args[a]] = true;
    }
    for (int i = 0; i < n; i++) {
      const Ins *x = &g->ins[i];
      if (!nk[i] || !placed[i])
        continue;
      if (x->op == OP_LOAD && !loads_here[x->buf]) {
        recompute += type_size((Type)x->type);
        loads_here[x->buf] = true;
      }
      /* a copied value used by something this phase computes fresh */
      if (fresh_use[i])
        spill += 2 * type_size((Type)x->type);
    }
    if (spill < recompute) {
      error("partition: phase %d would move %d bytes/element recomputing, %d spilling; spilling is not implemented",
            k, recompute, spill);
      return false;
    }
    for (int i = 0; i < n; i++)
      placed[i] |= nk[i];
  }

  /* Emit: ^step0, ^phase0, ^step1, ^phase1, ... Each step value once, in
   * its stage's ^stepK; each per-element value in every phase that needs
   * it. Count first: recomputing is meant to copy a few loads and what
   * they feed, and a graph that would copy far more is refused rather than
   * grown without bound. */
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    bool step_op = x->scope == SCOPE_STEP && x->op != OP_REDUCE && x->op != OP_STORE;
    for (int k = 0; k < nphases; k++)
      total += step_op ? stage[i] == k : need[(size_t)k * (size_t)n + (size_t)i];
  }
  if (total > (size_t)MAX_GROWTH * (size_t)n + 4096) {
    error("partition: recomputing per-element values in each of %d phases would take %zu instructions, "
          "over %d times the graph's %d; spilling is not implemented", nphases, total, MAX_GROWTH, n);
    return false;
  }
  Ins *out = arena_alloc(g->arena, sizeof(Ins) * (total + 1));
  int m = 0;
  Ref *gmap = arena_alloc(g->arena, sizeof(Ref) * (size_t)(n + 1)); /* step values, reductions */
  Ref *pmap = arena_alloc(g->arena, sizeof(Ref) * (size_t)(n + 1)); /* this phase's element values */
  memset(placed, 0, (size_t)n + 1);
  for (int i = 0; i < n; i++)
    gmap[i] = pmap[i] = NOREF;
  for (int k = 0; k < nphases; k++) {
    const bool *nk = need + (size_t)k * (size_t)n;
    for (int pass = 0; pass < 2; pass++) {
      for (int i = 0; i < n; i++) {
        const Ins *x = &g->ins[i];
        bool step_op = x->scope == SCOPE_STEP && x->op != OP_REDUCE && x->op != OP_STORE;
        if (pass == 0 ? !(step_op && stage[i] == k) : (step_op || !nk[i]))
          continue;
        Ins y = *x;
        for (int a = 0; a < op_info[x->op].nargs; a++) {
          const Ins *arg = &g->ins[x->args[a]];
          y.args[a] = is_global(arg) ? gmap[x->args[a]] : pmap[x->args[a]];
          ASSERT(y.args[a] != NOREF);
        }
        if (x->dep != NOREF)
          y.dep = gmap[x->dep];
        y.seg = (int16_t)(2 * k + pass);
        if (pass == 1 && placed[i]) {
          /* a recomputed copy */
          y.name = x->name ? arena_printf(g->arena, "%s.p%d", x->name, k) : NULL;
          y.lead = NULL;
          y.trail = NULL;
        }
        if (pass == 1)
          placed[i] = true;
        out[m] = y;
        if (pass == 0 || is_phase_reduce(x))
          gmap[i] = m;
        else
          pmap[i] = m;
        m++;
      }
    }
    for (int i = 0; i < n; i++)
      pmap[i] = NOREF;
  }
  ASSERT((size_t)m == total);
  g->ins = out;
  g->nins = m;
  g->capins = (int)total + 1;
  g->nphases = nphases;
  ir_infer_scopes(g);
  return true;
}
