/* canonicalize.c: constant folding and algebraic identities that keep every
 * result bit for bit (NaN payloads aside).
 *
 *   op(const, ...)        -> const, computed by the interpreter's arithmetic
 *   select(c?, a, b)      -> a or b        select(c, a, a) -> a
 *   x * 1, 1 * x, x / 1   -> x             x * -1 -> neg x
 *   x + -0.0, x - 0.0     -> x             (x + 0.0 is not x: -0 + 0 = +0)
 *   neg neg x, not not x  -> x             min(x, x), max(x, x) -> x
 *   cvt x : T (x is T)    -> x
 *   and/or with a constant
 *   store @b, (load @b)   -> nothing: the buffer keeps its bytes
 *   hold x, @b            -> cvt (cvt x : b's dtype) : x's type, when b is narrower;
 *                            else x (a graph from the front end has none left)
 * Commutative ops get their constant operand second, so that CSE sees
 * x*c and c*x as one value. Values made dead stay for DCE. */
#include "passes.h"
#include "plan.h"

#include <math.h>
#include <string.h>

static bool is_const(const Graph *g, Ref r, double v) {
  const Ins *x = &g->ins[r];
  return x->op == OP_CONST && x->imm == v && signbit(x->imm) == signbit(v);
}

static bool is_const_op(const Graph *g, Ref r) { return g->ins[r].op == OP_CONST; }

/* What instruction i simplifies to: another value, or NOREF. May rewrite i
 * in place instead (fold, x * -1). */
static Ref simplify(Graph *g, Ref i) {
  Ins *x = &g->ins[i];
  Ref *a = x->args;
  double v;
  if (x->op != OP_CONST && interp_fold(g, i, &v)) {
    x->op = OP_CONST;
    x->imm = v;
    a[0] = a[1] = a[2] = NOREF;
    return NOREF;
  }
  if ((op_info[x->op].flags & F_COMMUTE) && is_const_op(g, a[0]) && !is_const_op(g, a[1])) {
    Ref t = a[0];
    a[0] = a[1];
    a[1] = t;
  }
  bool fl = type_is_float((Type)x->type);
  switch (x->op) {
  case OP_SELECT:
    if (is_const_op(g, a[0]))
      return g->ins[a[0]].imm != 0 ? a[1] : a[2];
    if (a[1] == a[2])
      return a[1];
    break;
  case OP_MUL:
    if (fl && is_const(g, a[1], 1.0))
      return a[0];
    if (fl && is_const(g, a[1], -1.0)) {
      x->op = OP_NEG;
      a[1] = NOREF;
    }
    break;
  case OP_DIV:
    if (fl && is_const(g, a[1], 1.0))
      return a[0];
    break;
  case OP_ADD:
    if (fl && is_const(g, a[1], -0.0))
      return a[0];
    break;
  case OP_SUB:
    if (fl && is_const(g, a[1], 0.0))
      return a[0];
    break;
  case OP_NEG:
    if (g->ins[a[0]].op == OP_NEG)
      return g->ins[a[0]].args[0];
    break;
  case OP_NOT:
    if (g->ins[a[0]].op == OP_NOT)
      return g->ins[a[0]].args[0];
    break;
  case OP_MIN:
  case OP_MAX:
    if (a[0] == a[1])
      return a[0];
    break;
  case OP_AND:
  case OP_OR:
    if (is_const_op(g, a[1])) {
      bool c = g->ins[a[1]].imm != 0;
      if (c == (x->op == OP_AND))
        return a[0]; /* x and true, x or false */
      return a[1];   /* x and false, x or true */
    }
    break;
  case OP_CVT:
    if (g->ins[a[0]].type == x->type)
      return a[0];
    break;
  default:
    break;
  }
  return NOREF;
}

static bool run(Graph *g) {
  ir_lower_holds(g, true);
  bool *keep = arena_alloc(g->arena, (size_t)g->nins + 1);
  /* same[i]: what value i simplified to, else i. Operands are renamed
   * through it as the walk reaches them, in one pass: a value's users all
   * come after it. */
  Ref *same = arena_alloc(g->arena, sizeof(Ref) * (size_t)(g->nins + 1));
  NameMap names = {0}; /* each name's first holder before the pass; built when first asked */
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    keep[i] = true;
    same[i] = i;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      x->args[k] = same[x->args[k]];
    if (x->dep != NOREF)
      x->dep = same[x->dep];
    if (x->op == OP_STORE) {
      const Ins *v = &g->ins[x->args[0]];
      keep[i] = !(v->op == OP_LOAD && v->buf == x->buf);
      continue;
    }
    if (x->op == OP_LOAD || x->op == OP_INPUT || x->op == OP_OPTION || x->op == OP_REDUCE)
      continue;
    Ref to = simplify(g, i);
    if (to != NOREF) {
      /* Keep the more telling name: the replaced value's, if the survivor
       * has none and no earlier value has it (names only move to earlier
       * values, so no earlier value has it now if none had it before). */
      if (!g->ins[to].name && x->name && !names.slots)
        graph_value_map(g, &names);
      if (!g->ins[to].name && x->name && namemap_get(&names, x->name, strlen(x->name)) == i) {
        g->ins[to].name = x->name;
        x->name = NULL;
      }
      same[i] = to;
    }
  }
  graph_compact(g, keep);
  ir_infer_scopes(g);
  return true;
}

bool pass_canonicalize(Graph *g) { return run(g); }
