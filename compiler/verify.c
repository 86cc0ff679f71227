/* verify.c: the rules every step graph obeys, before and after each pass.
 *
 * - SSA: every operand is defined on an earlier line.
 * - types: as each op's type rule in ops.def says.
 * - scopes: loads and stores are per element, or per block for a per-block
 *   buffer; a reduction narrows scope; a block reduction is a max.
 * - codes (u8, u4): only loads, stores, lookup and search take them.
 * - buffers: loads and stores name declared buffers; at most one store each.
 * - after partition: each value lives in the right segment, and a phase
 *   never consumes a reduction it produces itself.
 */
#include "ir.h"

#include <math.h>
#include <string.h>

typedef struct {
  Graph *g;
  char names[3][48];
  int nextname;
} Verifier;

/* A printable name for value r: its SSA name, or its line. */
static const char *vname(Verifier *v, Ref r) {
  char *s = v->names[v->nextname++ % 3];
  const Ins *x = &v->g->ins[r];
  if (x->name)
    snprintf(s, 48, "%%%.40s", x->name);
  else
    snprintf(s, 48, "the %s result #%d", op_info[x->op].name, r);
  return s;
}

PRINTF(3, 4) static bool fail(Verifier *v, Ref at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror_at(v->g->ins[at].pos, fmt, ap);
  va_end(ap);
  return false;
}

static Type ty(Verifier *v, Ref r) { return (Type)v->g->ins[r].type; }

static bool check_types(Verifier *v, Ref i) {
  Graph *g = v->g;
  Ins *x = &g->ins[i];
  const OpInfo *info = &op_info[x->op];
  const char *op = info->name;
  Type t = (Type)x->type;
  Ref *a = x->args;
  if (info->type_rule != TR_LOAD && info->type_rule != TR_STORE && info->type_rule != TR_LOOKUP &&
      info->type_rule != TR_SEARCH) {
    if (type_is_code(t) && x->op != OP_CONST)
      return fail(v, i, "'%s' does not make codes (%s): a code is a load's, a constant or 'search''s", op,
                  type_names[t]);
    for (int k = 0; k < info->nargs; k++)
      if (type_is_code(ty(v, a[k])))
        return fail(v, i, "'%s' does not take codes; %s is %s (a code's value is 'lookup BOOK' of it)", op,
                    vname(v, a[k]), type_names[ty(v, a[k])]);
  }
  switch (info->type_rule) {
  case TR_LEAF:
    if (t == TY_VOID)
      return fail(v, i, "'%s' needs a result type", op);
    if (x->op == OP_OPTION && t != TY_BOOL)
      return fail(v, i, "an option is a bool, not %s", type_names[t]);
    if (x->op == OP_OPTION && x->dep != NOREF && g->ins[x->dep].op != OP_INPUT)
      return fail(v, i, "nonzero() takes an input, and %s is not one", vname(v, x->dep));
    if (x->op == OP_INPUT && x->has_imm && x->range.set) {
      const Range *r = &x->range;
      double d = x->imm;
      bool ok = (r->lo_open ? d > r->lo : d >= r->lo) && (r->hi_open ? d < r->hi : d <= r->hi);
      if (!ok)
        return fail(v, i, "the default of %s lies outside its range", vname(v, i));
    }
    return true;
  case TR_LOAD:
    if (x->buf < 0 || x->buf >= g->nbufs)
      return fail(v, i, "load of an undeclared buffer");
    if (t != g->bufs[x->buf].type)
      return fail(v, i, "load of '@%s' must have its element type %s, not %s", g->bufs[x->buf].name,
                  type_names[g->bufs[x->buf].type], type_names[t]);
    return true;
  case TR_STORE:
    if (x->buf < 0 || x->buf >= g->nbufs)
      return fail(v, i, "store to an undeclared buffer");
    if (ty(v, a[0]) != g->bufs[x->buf].type)
      return fail(v, i, "store to '@%s' (%s) of %s, which is %s; convert it first with cvt",
                  g->bufs[x->buf].name, type_names[g->bufs[x->buf].type], vname(v, a[0]),
                  type_names[ty(v, a[0])]);
    return true;
  case TR_ARITH:
    if (!type_is_float(t))
      return fail(v, i, "'%s' computes on floats, not %s", op, type_names[t]);
    for (int k = 0; k < info->nargs; k++)
      if (ty(v, a[k]) != t)
        return fail(v, i, "operand %d of '%s' is %s, which is %s, but the result is %s", k + 1, op,
                    vname(v, a[k]), type_names[ty(v, a[k])], type_names[t]);
    return true;
  case TR_CMP:
    if (t != TY_BOOL)
      return fail(v, i, "'%s' gives a bool, not %s", op, type_names[t]);
    if (ty(v, a[0]) != ty(v, a[1]))
      return fail(v, i, "'%s' compares %s (%s) with %s (%s); the types must match", op,
                  vname(v, a[0]), type_names[ty(v, a[0])], vname(v, a[1]), type_names[ty(v, a[1])]);
    if (ty(v, a[0]) == TY_BOOL)
      return fail(v, i, "'%s' compares numbers, not bools", op);
    return true;
  case TR_TEST:
    if (t != TY_BOOL)
      return fail(v, i, "'%s' gives a bool, not %s", op, type_names[t]);
    if (!type_is_float(ty(v, a[0])))
      return fail(v, i, "'%s' takes a float, and %s is %s", op, vname(v, a[0]), type_names[ty(v, a[0])]);
    return true;
  case TR_LOGIC:
    if (t != TY_BOOL)
      return fail(v, i, "'%s' gives a bool, not %s", op, type_names[t]);
    for (int k = 0; k < info->nargs; k++)
      if (ty(v, a[k]) != TY_BOOL)
        return fail(v, i, "operand %d of '%s' must be bool; %s is %s", k + 1, op, vname(v, a[k]),
                    type_names[ty(v, a[k])]);
    return true;
  case TR_SELECT:
    if (ty(v, a[0]) != TY_BOOL)
      return fail(v, i, "the condition of 'select' must be bool; %s is %s", vname(v, a[0]),
                  type_names[ty(v, a[0])]);
    if (ty(v, a[1]) != t || ty(v, a[2]) != t)
      return fail(v, i, "both choices of 'select' must have the result type %s (%s is %s, %s is %s)",
                  type_names[t], vname(v, a[1]), type_names[ty(v, a[1])], vname(v, a[2]),
                  type_names[ty(v, a[2])]);
    return true;
  case TR_CVT:
    if (t == TY_VOID || t == TY_BOOL || ty(v, a[0]) == TY_BOOL)
      return fail(v, i, "'cvt' converts between numeric types, not %s to %s", type_names[ty(v, a[0])],
                  type_names[t]);
    return true;
  case TR_CVTSR:
    if (t != TY_BF16 && t != TY_F16)
      return fail(v, i, "'cvt_sr' rounds to bf16 or f16, not %s", type_names[t]);
    if (ty(v, a[0]) != TY_F32)
      return fail(v, i, "'cvt_sr' rounds an f32; %s is %s", vname(v, a[0]), type_names[ty(v, a[0])]);
    if (ty(v, a[1]) != TY_I64 || ty(v, a[2]) != TY_I64)
      return fail(v, i, "'cvt_sr' takes an i64 seed and an i64 step after the value");
    return true;
  case TR_HOLD:
    if (x->buf < 0 || x->buf >= g->nbufs)
      return fail(v, i, "hold in an undeclared buffer");
    if (!type_is_float(t) || ty(v, a[0]) != t)
      return fail(v, i, "'hold' keeps a float's type; %s is %s and the result %s", vname(v, a[0]),
                  type_names[ty(v, a[0])], type_names[t]);
    return true;
  case TR_TAILPOS:
    if (t != TY_I64 || ty(v, a[0]) != TY_I64 || ty(v, a[1]) != TY_I64)
      return fail(v, i, "'tailpos' takes an i64 vector width and an i64 thread count and gives an i64");
    return true;
  case TR_LOOKUP: {
    if (x->book >= NUM_BOOKS)
      return fail(v, i, "'lookup' of an unknown code book %d", x->book);
    Book b = (Book)x->book;
    if (t != TY_F32)
      return fail(v, i, "'lookup %s' gives an f32, not %s", codebook(b)->name, type_names[t]);
    if (ty(v, a[0]) != book_code_type(b))
      return fail(v, i, "'lookup %s' takes its %d codes as %s; %s is %s", codebook(b)->name, codebook(b)->n,
                  type_names[book_code_type(b)], vname(v, a[0]), type_names[ty(v, a[0])]);
    return true;
  }
  case TR_SEARCH: {
    if (x->book >= NUM_BOOKS)
      return fail(v, i, "'search' of an unknown code book %d", x->book);
    Book b = (Book)x->book;
    if (ty(v, a[0]) != TY_F32)
      return fail(v, i, "'search %s' takes an f32; %s is %s", codebook(b)->name, vname(v, a[0]), type_names[ty(v, a[0])]);
    if (t != book_code_type(b))
      return fail(v, i, "'search %s' gives its %d codes as %s, not %s", codebook(b)->name, codebook(b)->n,
                  type_names[book_code_type(b)], type_names[t]);
    return true;
  }
  case TR_REDUCE:
    if (t != TY_F64)
      return fail(v, i, "a reduction accumulates in f64; its result type is f64, not %s", type_names[t]);
    if (!type_is_float(ty(v, a[0])))
      return fail(v, i, "'reduce' takes a float, and %s is %s", vname(v, a[0]), type_names[ty(v, a[0])]);
    return true;
  }
  unreachable();
}

static bool check_scopes(Verifier *v, Ref i) {
  Graph *g = v->g;
  Ins *x = &g->ins[i];
  if (x->op == OP_STORE && g->bufs[x->buf].per_block && g->ins[x->args[0]].scope > SCOPE_BLOCK)
    return fail(v, i, "'@%s' holds one value per block, and %s is per element", g->bufs[x->buf].name,
                vname(v, x->args[0]));
  if ((x->op == OP_LOAD || x->op == OP_STORE) && g->bufs[x->buf].per_block && !g->block)
    return fail(v, i, "'@%s' is per block, but the graph has no block size", g->bufs[x->buf].name);
  if (x->op != OP_REDUCE)
    return true;
  Scope from = (Scope)g->ins[x->args[0]].scope;
  if (x->to >= from)
    return fail(v, i, "a reduction must narrow scope, but %s is at %s scope and the target is %s",
                vname(v, x->args[0]), scope_names[from], scope_names[x->to]);
  if (x->to == SCOPE_BLOCK && !g->block)
    return fail(v, i, "a reduction to block needs the graph's block size ('block N')");
  if (x->to == SCOPE_BLOCK && x->red != RED_MAX && x->red != RED_ABSMAX)
    return fail(v, i, "a reduction to block is max or absmax (exact in any order), not %s", red_names[x->red]);
  return true;
}

/* After partition: step values are computed between phases, element values
 * inside them, and a reduction is read only after its phase ends. */
static bool check_segments(Verifier *v) {
  Graph *g = v->g;
  int prev = -1;
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    if (x->seg < 0 || x->seg >= 2 * g->nphases)
      return fail(v, i, "after partition every line must be under a ^stepN or ^phaseN label");
    if (x->seg < prev)
      return fail(v, i, "segments out of order");
    prev = x->seg;
    bool in_loop = x->seg % 2 == 1;
    bool loop_value = x->scope != SCOPE_STEP || x->op == OP_REDUCE || x->op == OP_STORE;
    if (loop_value && !in_loop)
      return fail(v, i, "%s is computed per element but sits in ^step%d", vname(v, i), x->seg / 2);
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      Ins *a = &g->ins[x->args[k]];
      int ready = a->op == OP_REDUCE && a->to != SCOPE_BLOCK ? a->seg + 1 : a->seg; /* a block's is its phase's */
      if (ready > x->seg)
        return fail(v, i, "%s is read in the phase that reduces it; it is ready only after phase %d",
                    vname(v, x->args[k]), a->seg / 2);
    }
  }
  return true;
}

bool ir_verify(Graph *g) {
  Verifier v = {.g = g};
  int nstores[64] = {0};
  int *stores = g->nbufs <= 64 ? nstores : arena_alloc(g->arena, sizeof(int) * (size_t)g->nbufs);
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    if (x->op >= NUM_OPS)
      return fail(&v, i, "bad op number %d", x->op);
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      if (x->args[k] < 0 || x->args[k] >= g->nins)
        return fail(&v, i, "operand %d of '%s' is missing", k + 1, op_info[x->op].name);
      if (x->args[k] >= i)
        return fail(&v, i, "%s is used before it is defined", vname(&v, x->args[k]));
      if (g->ins[x->args[k]].op == OP_STORE)
        return fail(&v, i, "a store has no value to use");
    }
    if (x->dep != NOREF && x->dep >= i)
      return fail(&v, i, "%s is used before it is defined", vname(&v, x->dep));
    if (!check_types(&v, i))
      return false;
  }
  ir_infer_scopes(g);
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    if (!check_scopes(&v, i))
      return false;
    if (x->op == OP_STORE && ++stores[x->buf] > 1)
      return fail(&v, i, "'@%s' is stored twice; a step stores each buffer at most once",
                  g->bufs[x->buf].name);
  }
  NameMap names = {0}; /* built at the first buffer that needs it */
  for (int i = 0; i < g->nbufs; i++) {
    Buffer *b = &g->bufs[i];
    if (b->init == INIT_INPUT) {
      if (!names.slots)
        graph_value_map(g, &names);
      Ref r = namemap_get(&names, b->init_input, strlen(b->init_input));
      if (r == NOREF || g->ins[r].op != OP_INPUT) {
        error_at(b->pos, "initial value of '@%s' names '%%%s', which is not an input", b->name,
                 b->init_input);
        return false;
      }
    }
  }
  if (g->nphases > 0 && !check_segments(&v))
    return false;
  return true;
}
