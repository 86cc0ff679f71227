/* cse.c: common subexpression elimination.
 *
 * Two instructions with the same op, type, operands and attributes compute
 * the same value: later uses take the first. Loads are pure here (a load
 * reads the buffer as it was before the step), so two loads of one buffer
 * are one value. Commutative operands are compared as a set. Stores,
 * inputs and options are never merged. */
#include "passes.h"

#include <string.h>

typedef struct {
  uint8_t op, type, red, to, book;
  int32_t buf;
  Ref a[3];
  uint64_t imm; /* bits of the constant */
} Key;

static Key key_of(const Graph *g, Ref i) {
  const Ins *x = &g->ins[i];
  Key k;
  memset(&k, 0, sizeof k); /* padding too: keys are compared with memcmp */
  k.op = x->op;
  k.type = x->type;
  k.red = x->red;
  k.to = x->to;
  k.book = x->book;
  k.buf = x->buf;
  for (int j = 0; j < 3; j++)
    k.a[j] = x->args[j];
  if ((op_info[x->op].flags & F_COMMUTE) && k.a[0] > k.a[1]) {
    Ref t = k.a[0];
    k.a[0] = k.a[1];
    k.a[1] = t;
  }
  if (x->op == OP_CONST)
    memcpy(&k.imm, &x->imm, 8);
  return k;
}

static uint64_t hash(const Key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k; i++)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool pass_cse(Graph *g) {
  int cap = 16;
  while (cap < 2 * g->nins)
    cap *= 2;
  Ref *table = arena_alloc(g->arena, sizeof(Ref) * (size_t)cap);
  Key *keys = arena_alloc(g->arena, sizeof(Key) * (size_t)(g->nins + 1));
  /* same[i]: the earlier value i merged into, else i. Operands are renamed
   * through it as the walk reaches them, in one pass: a merged value's
   * users all come after it. */
  Ref *same = arena_alloc(g->arena, sizeof(Ref) * (size_t)(g->nins + 1));
  for (int s = 0; s < cap; s++)
    table[s] = NOREF;
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    same[i] = i;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      x->args[k] = same[x->args[k]];
    if (x->dep != NOREF)
      x->dep = same[x->dep];
    if (x->op == OP_STORE || x->op == OP_INPUT || x->op == OP_OPTION)
      continue;
    keys[i] = key_of(g, i);
    uint64_t h = hash(&keys[i]);
    int s = (int)(h & (uint64_t)(cap - 1));
    for (;; s = (s + 1) & (cap - 1)) {
      if (table[s] == NOREF) {
        table[s] = i;
        break;
      }
      if (memcmp(&keys[table[s]], &keys[i], sizeof(Key)) == 0) {
        Ref first = table[s];
        if (!g->ins[first].name && x->name)
          g->ins[first].name = x->name, x->name = NULL;
        same[i] = first; /* later keys see first where they named i */
        break;
      }
    }
  }
  return true;
}
