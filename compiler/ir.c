/* ir.c: scope and op tables, and the graph builder. */
#include "ir.h"

#include <string.h>

const char *const scope_names[NUM_SCOPES] = {"step", "tensor", "block", "elem"};
const char *const red_names[NUM_REDS] = {"sum", "sumsq", "max", "absmax"};
const char *const bufkind_names[NUM_BUFKINDS] = {"param", "grad", "state"};

const OpInfo op_info[NUM_OPS] = {
#define OP(e, s, n, t, sc, f) [OP_##e] = {s, n, t, sc, f},
#include "ops.def"
#undef OP
};

static bool name_eq(const char *name, const char *s, size_t n) {
  return strlen(name) == n && memcmp(name, s, n) == 0;
}

bool scope_from_name(const char *s, size_t n, Scope *out) {
  for (int i = 0; i < NUM_SCOPES; i++)
    if (name_eq(scope_names[i], s, n))
      return *out = (Scope)i, true;
  return false;
}

bool op_from_name(const char *s, size_t n, Op *out) {
  for (int i = 0; i < NUM_OPS; i++)
    if (name_eq(op_info[i].name, s, n))
      return *out = (Op)i, true;
  return false;
}

Graph *graph_new(Arena *a) {
  Graph *g = arena_alloc(a, sizeof(Graph));
  g->arena = a;
  return g;
}

static const char *dup_or_null(Arena *a, const char *s) { return s ? arena_strdup(a, s) : NULL; }

Graph *graph_clone(const Graph *g, Arena *a) {
  Graph *c = graph_new(a);
  c->nphases = g->nphases;
  c->block = g->block;
  c->block_lead = dup_or_null(a, g->block_lead);
  c->block_trail = dup_or_null(a, g->block_trail);
  c->src = g->src;
  c->tail = dup_or_null(a, g->tail);
  arena_grow(a, (void **)&c->bufs, &c->capbufs, g->nbufs, sizeof(Buffer));
  for (int i = 0; i < g->nbufs; i++) {
    Buffer b = g->bufs[i];
    b.name = arena_strdup(a, b.name);
    b.init_input = dup_or_null(a, b.init_input);
    b.lead = dup_or_null(a, b.lead);
    b.trail = dup_or_null(a, b.trail);
    c->bufs[i] = b;
  }
  c->nbufs = g->nbufs;
  arena_grow(a, (void **)&c->ins, &c->capins, g->nins, sizeof(Ins));
  for (int i = 0; i < g->nins; i++) {
    Ins x = g->ins[i];
    x.name = dup_or_null(a, x.name);
    x.lead = dup_or_null(a, x.lead);
    x.trail = dup_or_null(a, x.trail);
    c->ins[i] = x;
  }
  c->nins = g->nins;
  return c;
}

int graph_find_buffer(const Graph *g, const char *name) {
  for (int i = 0; i < g->nbufs; i++)
    if (strcmp(g->bufs[i].name, name) == 0)
      return i;
  return -1;
}

Ref graph_find_value(const Graph *g, const char *name) {
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].name && strcmp(g->ins[i].name, name) == 0)
      return i;
  return NOREF;
}

Ref graph_find_input(const Graph *g, const char *name) {
  Ref r = graph_find_value(g, name);
  if (r != NOREF && g->ins[r].op != OP_INPUT && g->ins[r].op != OP_OPTION)
    return NOREF;
  return r;
}

int graph_add_buffer(Graph *g, const char *name, BufKind kind, Type type) {
  arena_grow(g->arena, (void **)&g->bufs, &g->capbufs, g->nbufs + 1, sizeof(Buffer));
  Buffer *b = &g->bufs[g->nbufs];
  *b = (Buffer){.name = arena_strdup(g->arena, name), .kind = kind, .type = type};
  return g->nbufs++;
}

double buffer_elem_bytes(const Graph *g, int b) {
  const Buffer *x = &g->bufs[b];
  double e = type_bits((Type)x->type) / 8.0;
  return x->per_block && g->block > 0 ? e / g->block : e;
}

int64_t buffer_bytes(const Graph *g, int b, int64_t n) {
  const Buffer *x = &g->bufs[b];
  if (x->per_block && g->block > 0)
    n = (n + g->block - 1) / g->block;
  return x->type == TY_U4 ? (n + 1) / 2 : n * type_size((Type)x->type);
}

int64_t buffer_offset(const Graph *g, int b, int64_t i) {
  const Buffer *x = &g->bufs[b];
  if (x->per_block && g->block > 0) {
    ASSERT(i % g->block == 0);
    i /= g->block;
  }
  if (x->type == TY_U4) {
    ASSERT(i % 2 == 0);
    return i / 2;
  }
  return i * type_size((Type)x->type);
}

int graph_count_uses(const Graph *g, Ref r) {
  int n = 0;
  for (int i = r + 1; i < g->nins; i++)
    for (int k = 0; k < op_info[g->ins[i].op].nargs; k++)
      n += g->ins[i].args[k] == r;
  return n;
}

/* FNV-1a */
static uint32_t name_hash(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

void namemap_init(NameMap *m, Arena *a) {
  *m = (NameMap){.arena = a, .cap = 16};
  m->slots = arena_alloc(a, sizeof(NameSlot) * (size_t)m->cap);
}

/* The slot holding s, or the empty slot where it would go. */
static NameSlot *namemap_slot(const NameMap *m, const char *s, size_t n, uint32_t h) {
  for (uint32_t i = h & (uint32_t)(m->cap - 1);; i = (i + 1) & (uint32_t)(m->cap - 1)) {
    NameSlot *e = &m->slots[i];
    if (!e->s || (e->hash == h && e->n == n && memcmp(e->s, s, n) == 0))
      return e;
  }
}

int namemap_get(const NameMap *m, const char *s, size_t n) {
  NameSlot *e = namemap_slot(m, s, n, name_hash(s, n));
  return e->s ? e->val : -1;
}

int namemap_add(NameMap *m, const char *s, size_t n, int v) {
  ASSERT(v >= 0 && s);
  uint32_t h = name_hash(s, n);
  NameSlot *e = namemap_slot(m, s, n, h);
  if (e->s)
    return e->val;
  *e = (NameSlot){s, n, h, v};
  if (++m->n * 2 > m->cap) {
    /* rehash into twice the room; the old slots stay in the arena */
    NameMap old = *m;
    m->cap *= 2;
    m->slots = arena_alloc(m->arena, sizeof(NameSlot) * (size_t)m->cap);
    for (int i = 0; i < old.cap; i++)
      if (old.slots[i].s)
        *namemap_slot(m, old.slots[i].s, old.slots[i].n, old.slots[i].hash) = old.slots[i];
  }
  return -1;
}

void graph_value_map(const Graph *g, NameMap *m) {
  namemap_init(m, g->arena);
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].name)
      namemap_add(m, g->ins[i].name, strlen(g->ins[i].name), i);
}

Ref ir_emit(Graph *g, Op op, Type type, int nargs, const Ref *args) {
  ASSERT(nargs == op_info[op].nargs);
  arena_grow(g->arena, (void **)&g->ins, &g->capins, g->nins + 1, sizeof(Ins));
  Ins *x = &g->ins[g->nins];
  *x = (Ins){.op = op, .type = type, .seg = -1, .buf = -1, .dep = NOREF,
             .args = {NOREF, NOREF, NOREF}};
  Scope s = SCOPE_STEP;
  for (int k = 0; k < nargs; k++) {
    ASSERT(args[k] >= 0 && args[k] < g->nins);
    x->args[k] = args[k];
    s = MAX(s, (Scope)g->ins[args[k]].scope);
  }
  x->scope = op_info[op].scope_rule == SR_ELEM || op_info[op].scope_rule == SR_MEM ? SCOPE_ELEM : s;
  return g->nins++;
}

Ref ir_const(Graph *g, Type t, double v) {
  Ref r = ir_emit(g, OP_CONST, t, 0, NULL);
  g->ins[r].imm = v;
  return r;
}

Ref ir_input(Graph *g, const char *name, Type t) {
  Ref r = ir_emit(g, OP_INPUT, t, 0, NULL);
  g->ins[r].name = arena_strdup(g->arena, name);
  return r;
}

Ref ir_load(Graph *g, int buf) {
  Ref r = ir_emit(g, OP_LOAD, g->bufs[buf].type, 0, NULL);
  g->ins[r].buf = buf;
  g->ins[r].scope = g->bufs[buf].per_block ? SCOPE_BLOCK : SCOPE_ELEM;
  return r;
}

void ir_store(Graph *g, int buf, Ref v) {
  Ref r = ir_emit(g, OP_STORE, TY_VOID, 1, &v);
  g->ins[r].buf = buf;
  g->ins[r].scope = g->bufs[buf].per_block ? SCOPE_BLOCK : SCOPE_ELEM;
}

/* The result type an op gets from its operands, for the builder. */
static Type result_type(const Graph *g, Op op, const Ref *args) {
  switch (op_info[op].type_rule) {
  case TR_CMP: case TR_TEST: case TR_LOGIC: return TY_BOOL;
  case TR_SELECT: return (Type)g->ins[args[1]].type;
  case TR_REDUCE: return TY_F64;
  default: return (Type)g->ins[args[0]].type;
  }
}

Ref ir_op1(Graph *g, Op op, Ref a) {
  Ref args[3] = {a, NOREF, NOREF};
  return ir_emit(g, op, result_type(g, op, args), 1, args);
}

Ref ir_op2(Graph *g, Op op, Ref a, Ref b) {
  Ref args[2] = {a, b};
  return ir_emit(g, op, result_type(g, op, args), 2, args);
}

Ref ir_op3(Graph *g, Op op, Ref a, Ref b, Ref c) {
  Ref args[3] = {a, b, c};
  return ir_emit(g, op, result_type(g, op, args), 3, args);
}

Ref ir_cvt(Graph *g, Ref a, Type to) { return ir_emit(g, OP_CVT, to, 1, &a); }

Ref ir_reduce(Graph *g, RedKind k, Scope to, Ref a) {
  Ref r = ir_emit(g, OP_REDUCE, TY_F64, 1, &a);
  g->ins[r].red = k;
  g->ins[r].to = to;
  g->ins[r].scope = to;
  return r;
}

Ref ir_lookup(Graph *g, Book b, Ref code) {
  Ref r = ir_emit(g, OP_LOOKUP, TY_F32, 1, &code);
  g->ins[r].book = (uint8_t)b;
  return r;
}

Ref ir_search(Graph *g, Book b, Ref y) {
  Ref r = ir_emit(g, OP_SEARCH, book_code_type(b), 1, &y);
  g->ins[r].book = (uint8_t)b;
  return r;
}

Ref ir_name(Graph *g, Ref r, const char *name) {
  g->ins[r].name = name ? arena_strdup(g->arena, name) : NULL;
  return r;
}

void ir_replace_uses(Graph *g, Ref from, Ref to, Ref start) {
  for (int i = MAX(start, 0); i < g->nins; i++) {
    Ins *x = &g->ins[i];
    for (int k = 0; k < op_info[x->op].nargs; k++)
      if (x->args[k] == from)
        x->args[k] = to;
    if (x->dep == from)
      x->dep = to;
  }
}

void graph_compact(Graph *g, const bool *keep) {
  Ref *map = arena_alloc(g->arena, sizeof(Ref) * (size_t)(g->nins ? g->nins : 1));
  int n = 0;
  for (int i = 0; i < g->nins; i++) {
    if (!keep[i]) {
      map[i] = NOREF;
      continue;
    }
    map[i] = n;
    Ins x = g->ins[i];
    for (int k = 0; k < op_info[x.op].nargs; k++) {
      ASSERT(map[x.args[k]] != NOREF);
      x.args[k] = map[x.args[k]];
    }
    if (x.dep != NOREF)
      x.dep = map[x.dep];
    g->ins[n++] = x;
  }
  g->nins = n;
}

void graph_permute(Graph *g, const Ref *order) {
  int n = g->nins;
  Ref *inv = arena_alloc(g->arena, sizeof(Ref) * (size_t)(n ? n : 1));
  Ins *old = arena_alloc(g->arena, sizeof(Ins) * (size_t)(n ? n : 1));
  if (n)
    memcpy(old, g->ins, sizeof(Ins) * (size_t)n);
  for (int i = 0; i < n; i++)
    inv[order[i]] = i;
  for (int i = 0; i < n; i++) {
    Ins x = old[order[i]];
    for (int k = 0; k < op_info[x.op].nargs; k++) {
      x.args[k] = inv[x.args[k]];
      ASSERT(x.args[k] < i);
    }
    if (x.dep != NOREF)
      x.dep = inv[x.dep];
    g->ins[i] = x;
  }
}

void ir_lower_holds(Graph *g, bool keep) {
  int extra = 0;
  for (int i = 0; i < g->nins; i++)
    extra += g->ins[i].op == OP_HOLD;
  if (extra == 0)
    return;
  int cap = g->nins + extra + 1;
  Ins *out = arena_alloc(g->arena, sizeof(Ins) * (size_t)cap);
  Ref *map = arena_alloc(g->arena, sizeof(Ref) * (size_t)(g->nins + 1));
  const char *lead = NULL; /* the comment above a dropped hold goes to the next line */
  int n = 0;
  for (int i = 0; i < g->nins; i++) {
    Ins x = g->ins[i];
    for (int k = 0; k < op_info[x.op].nargs; k++)
      x.args[k] = map[x.args[k]];
    if (x.dep != NOREF)
      x.dep = map[x.dep];
    if (lead && !x.lead)
      x.lead = lead;
    lead = NULL;
    if (x.op == OP_HOLD) {
      Type bt = (Type)g->bufs[x.buf].type;
      if (!keep || type_size(bt) >= type_size((Type)x.type)) {
        map[i] = x.args[0];
        lead = x.lead;
        continue;
      }
      /* round to the buffer's dtype, then widen back */
      out[n] = (Ins){.op = OP_CVT, .type = (uint8_t)bt, .scope = x.scope, .seg = x.seg, .buf = -1,
                     .dep = NOREF, .args = {x.args[0], NOREF, NOREF}, .pos = x.pos, .lead = x.lead};
      x.lead = NULL;
      x.op = OP_CVT;
      x.args[0] = n++;
      x.buf = -1;
    }
    map[i] = n;
    out[n++] = x;
  }
  g->ins = out;
  g->nins = n;
  g->capins = cap;
}

void ir_infer_scopes(Graph *g) {
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    switch (op_info[x->op].scope_rule) {
    case SR_STEP: x->scope = SCOPE_STEP; break;
    case SR_ELEM: x->scope = SCOPE_ELEM; break;
    case SR_MEM: x->scope = x->buf >= 0 && x->buf < g->nbufs && g->bufs[x->buf].per_block ? SCOPE_BLOCK : SCOPE_ELEM; break;
    case SR_REDUCE: x->scope = x->to; break;
    case SR_WIDEST: {
      Scope s = SCOPE_STEP;
      for (int k = 0; k < op_info[x->op].nargs; k++)
        s = MAX(s, (Scope)g->ins[x->args[k]].scope);
      x->scope = s;
      break;
    }
    }
  }
}
