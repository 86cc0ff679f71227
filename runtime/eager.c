/* eager.c: the step graph run the way torch eager runs an optimizer.
 *
 * One op at a time, over one whole tensor at a time, every intermediate
 * materialised in memory, as torch's for-loop (foreach=False) path does:
 * `exp_avg.lerp_(grad, 1 - beta1)` reads two tensors and writes one. This is
 * the baseline the compiled step is measured against, so it is plain C
 * loops that the C compiler vectorises, with torch eager's one trick and no
 * other: an op whose only use is a store into a buffer writes straight into
 * the buffer (torch's in-place ops), when no later op reads the buffer's
 * old value. It runs the unoptimized graph, and its results are the
 * interpreter's, bit for bit.
 *
 * Reductions see every tensor before any value that reads them is made: as
 * in torch, clip_grad_norm finishes its norms over all grads before it
 * scales any. Values are staged as in the interpreter; all stores happen in
 * the last stage, so a skipped step (non-finite grads) stores nothing. */
#include "rt.h"

#include <math.h>
#include <string.h>

typedef struct {
  const Graph *g;
  int n;
  int *stage;
  int last;       /* the last stage: stores happen in it */
  int *last_use;  /* the last instruction reading each value */
  Ref *in_place;  /* the store that value i is written into directly, or NOREF */
  bool *cross;    /* read in a later stage than it is made: kept for the whole group */
} Sched;

/* Decides where each value lives: the same decisions drive the run and the
 * traffic model. */
static void sched_init(Sched *s, const Graph *g) {
  int n = g->nins;
  s->g = g;
  s->n = n;
  s->stage = calloc((size_t)n + 1, sizeof(int));
  s->last_use = calloc((size_t)n + 1, sizeof(int));
  s->in_place = malloc(sizeof(Ref) * ((size_t)n + 1));
  s->cross = calloc((size_t)n + 1, sizeof(bool));
  ASSERT(s->stage && s->last_use && s->in_place && s->cross);
  s->last = 0;
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    int st = 0;
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      st = MAX(st, s->stage[x->args[k]]);
      s->last_use[x->args[k]] = i;
    }
    s->stage[i] = x->op == OP_REDUCE ? st + 1 : st;
    s->in_place[i] = NOREF;
    if (x->op == OP_STORE || x->op == OP_REDUCE)
      s->last = MAX(s->last, st);
  }
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      const Ins *a = &g->ins[x->args[k]];
      /* stores run in the last stage, so what they store lives until then */
      int used_in = x->op == OP_STORE ? s->last : s->stage[i] - (x->op == OP_REDUCE);
      if (a->scope == SCOPE_ELEM && s->stage[x->args[k]] < used_in)
        s->cross[x->args[k]] = true;
    }
  }
  /* In place: v's one use is `store @b, v`, v has b's type, v is made in
   * the last stage, and nothing after v reads a load of b. */
  for (int i = 0; i < n; i++) {
    const Ins *x = &g->ins[i];
    if (x->op != OP_STORE)
      continue;
    Ref v = x->args[0];
    const Ins *y = &g->ins[v];
    if (y->scope != SCOPE_ELEM || y->op == OP_LOAD || graph_count_uses(g, v) != 1 || y->type != g->bufs[x->buf].type ||
        s->stage[v] != s->last)
      continue;
    bool ok = true;
    for (int j = 0; j < n && ok; j++)
      if (g->ins[j].op == OP_LOAD && g->ins[j].buf == x->buf && s->last_use[j] > v)
        ok = false;
    if (ok)
      s->in_place[v] = i;
  }
}

static void sched_free(Sched *s) {
  free(s->stage);
  free(s->last_use);
  free(s->in_place);
  free(s->cross);
}

static bool is_arith(const Ins *x) {
  return x->op != OP_LOAD && x->op != OP_STORE && x->op != OP_REDUCE && x->scope == SCOPE_ELEM;
}

/* The eager executor's traffic per element: each op reads its
 * per-element operands and writes its result; a store that is not done in
 * place copies (reads and writes); a reduction reads its operand. */
double eager_traffic(const Graph *g) {
  Sched s;
  sched_init(&s, g);
  double bytes = 0;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_ELEM && x->op != OP_REDUCE)
      continue;
    if (x->op == OP_LOAD)
      continue;
    if (x->op == OP_STORE) {
      Ref v = x->args[0];
      if (s.in_place[v] != i)
        bytes += type_size((Type)g->ins[v].type) + type_size((Type)g->bufs[x->buf].type);
      continue;
    }
    Ref seen[3] = {NOREF, NOREF, NOREF};
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      Ref a = x->args[k];
      if (g->ins[a].scope != SCOPE_ELEM || a == seen[0] || a == seen[1])
        continue;
      seen[k] = a;
      bytes += type_size((Type)g->ins[a].type);
    }
    if (x->op != OP_REDUCE)
      bytes += type_size((Type)x->type);
  }
  sched_free(&s);
  return bytes;
}

/* ---- running ------------------------------------------------------------------- */

/* A run of one tensor's elements, as the chunk table has them: the whole
 * tensor, or (on a shard) the part of it the shard holds. */
typedef struct {
  int tensor;      /* index in the group: the stochastic-rounding hash reads it */
  int64_t flat;    /* first element in the flat buffers */
  int64_t start;   /* first element, counted within the tensor */
  int64_t n;
  int64_t c0, c1;  /* its chunks */
} Piece;

typedef struct {
  Sched s;
  const Graph *g;
  const GroupLayout *l;
  void *const *tbufs; /* (ntensors x nbufs) tensor table (layout_tensor_bufs) */
  const double *inputs;
  const Reducer *reducer;
  ThreadPool *pool; /* NULL: one thread */
  Scalar *step;   /* (nins) step values */
  void **arr;     /* (nins) this tensor's elements of each value */
  bool *owned;    /* arr[i] is a temporary of this tensor's (not a view) */
  void **group;   /* (nins) group-wide arrays of the values read across stages,
                     as pointers indexed by flat index */
  void **group_mem; /* (nins) their allocations */
  bool *keep;     /* (nins) value i lives in a group-wide array */
  Ref *donated_to; /* (nins) foreach: the later value that took over value i's array, or NOREF */
  double *part;   /* (nchunks) reduction partials */
  Piece *pieces;  /* the runs of one tensor's elements inside the layout's range */
  int npieces;
} Eager;

static void *elem_ptr(void *base, Type t, int64_t i) { return (char *)base + i * type_size(t); }

/* The piece's first element in graph buffer b. */
static void *piece_ptr(const Eager *e, int b, const Piece *pc) {
  void *base = e->tbufs[(size_t)pc->tensor * (size_t)e->g->nbufs + (size_t)b];
  return elem_ptr(base, (Type)e->g->bufs[b].type, pc->start);
}

static void *alloc_arr(int64_t n, Type t) {
  void *p = aligned_alloc(64, ((size_t)(n ? n : 1) * (size_t)type_size(t) + 63) / 64 * 64);
  ASSERT(p);
  return p;
}

typedef struct {
  const void *p; /* array, or NULL for a scalar */
  Scalar s;
  Type t;
} Operand;

static Operand operand(const Eager *e, Ref r, int64_t off) {
  const Ins *x = &e->g->ins[r];
  Operand o = {.t = (Type)x->type};
  if (x->scope == SCOPE_ELEM)
    o.p = elem_ptr(e->arr[r], o.t, off);
  else
    o.s = e->step[r];
  return o;
}

/* The typed loops, for the ops and types optimizers use; any other
 * combination goes element by element through interp_apply. */
#define BIN_F32(EXPR) \
  do { \
    const float *a = A.p, *b = B.p; \
    float av = A.s.f, bv = B.s.f; \
    if (a && b) for (int64_t i = 0; i < n; i++) { float x = a[i], y = b[i]; o[i] = (EXPR); } \
    else if (a) for (int64_t i = 0; i < n; i++) { float x = a[i], y = bv; o[i] = (EXPR); } \
    else for (int64_t i = 0; i < n; i++) { float x = av, y = b[i]; o[i] = (EXPR); } \
  } while (0)

#define UN_F32(EXPR) \
  do { \
    const float *a = A.p; \
    for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); } \
  } while (0)

static bool fast_f32(Op op, float *o, Operand A, Operand B, Operand C, int64_t n) {
  if (A.t != TY_F32 || (!A.p && !B.p))
    return false;
  switch (op) {
  case OP_ADD: BIN_F32(x + y); return true;
  case OP_SUB: BIN_F32(x - y); return true;
  case OP_MUL: BIN_F32(x * y); return true;
  case OP_DIV: BIN_F32(x / y); return true;
  case OP_MAX: BIN_F32(x != x ? x : y != y ? y : (x < y ? y : x)); return true;
  case OP_MIN: BIN_F32(x != x ? x : y != y ? y : (y < x ? y : x)); return true;
  case OP_NEG: if (!A.p) return false; UN_F32(-x); return true;
  case OP_ABS: if (!A.p) return false; UN_F32(fabsf(x)); return true;
  case OP_SQRT: if (!A.p) return false; UN_F32(sqrtf(x)); return true;
  case OP_SIGN: if (!A.p) return false; UN_F32((float)((0.0f < x) - (x < 0.0f))); return true;
  case OP_SQRT_MKL: if (!A.p) return false; UN_F32(optc_sqrt_mkl_f32(x)); return true;
  case OP_FMA: {
    if (!A.p || !B.p || !C.p)
      return false;
    const float *a = A.p, *b = B.p, *c = C.p;
    for (int64_t i = 0; i < n; i++) o[i] = fmaf(a[i], b[i], c[i]);
    return true;
  }
  case OP_LERP: {
    /* torch.lerp with a scalar weight, both ends tensors */
    if (!A.p || !B.p || C.p)
      return false;
    const float *a = A.p, *b = B.p;
    float w = C.s.f;
    for (int64_t i = 0; i < n; i++) o[i] = optc_lerpf(a[i], b[i], w);
    return true;
  }
  default: return false;
  }
}

static bool fast_cvt(void *o, Type to, Operand A, int64_t n) {
  if (!A.p)
    return false;
  if (A.t == TY_BF16 && to == TY_F32) {
    const uint16_t *a = A.p;
    float *out = o;
    for (int64_t i = 0; i < n; i++) out[i] = optc_bf16_to_f32(a[i]);
    return true;
  }
  if (A.t == TY_F32 && to == TY_BF16) {
    const float *a = A.p;
    uint16_t *out = o;
    for (int64_t i = 0; i < n; i++) out[i] = optc_f32_to_bf16(a[i]);
    return true;
  }
  if (A.t == TY_F16 && to == TY_F32) {
    const uint16_t *a = A.p;
    float *out = o;
    for (int64_t i = 0; i < n; i++) out[i] = optc_f16_to_f32(a[i]);
    return true;
  }
  if (A.t == TY_F32 && to == TY_F16) {
    const float *a = A.p;
    uint16_t *out = o;
    for (int64_t i = 0; i < n; i++) out[i] = optc_f32_to_f16(a[i]);
    return true;
  }
  return false;
}

static Scalar at(Operand o, int64_t i) {
  if (!o.p)
    return o.s;
  Scalar v = {0};
  switch (o.t) {
  case TY_F64: v.d = ((const double *)o.p)[i]; break;
  case TY_F32: v.f = ((const float *)o.p)[i]; break;
  case TY_BF16: case TY_F16: v.h = ((const uint16_t *)o.p)[i]; break;
  case TY_BOOL: v.i = ((const uint8_t *)o.p)[i]; break;
  case TY_I32: v.i = ((const int32_t *)o.p)[i]; break;
  case TY_I64: v.i = ((const int64_t *)o.p)[i]; break;
  default: unreachable();
  }
  return v;
}

static void put(void *o, Type t, int64_t i, Scalar v) {
  switch (t) {
  case TY_F64: ((double *)o)[i] = v.d; break;
  case TY_F32: ((float *)o)[i] = v.f; break;
  case TY_BF16: case TY_F16: ((uint16_t *)o)[i] = v.h; break;
  case TY_BOOL: ((uint8_t *)o)[i] = (uint8_t)v.i; break;
  case TY_I32: ((int32_t *)o)[i] = (int32_t)v.i; break;
  case TY_I64: ((int64_t *)o)[i] = v.i; break;
  default: unreachable();
  }
}

/* One op over elements [0, n) of tensor t, whose first element is `start`
 * within the tensor, written to o. */
/* Elements [lo, hi) of one op over a piece. */
static void run_op_range(Eager *e, Ref i, void *o, const Piece *pc, int64_t lo, int64_t hi) {
  const Ins *x = &e->g->ins[i];
  Type t = (Type)x->type;
  Operand a[3] = {{0}};
  for (int k = 0; k < op_info[x->op].nargs; k++)
    a[k] = operand(e, x->args[k], lo);
  void *out = elem_ptr(o, t, lo);
  int64_t n = hi - lo;
  if (t == TY_F32 && fast_f32((Op)x->op, out, a[0], a[1], a[2], n))
    return;
  if (x->op == OP_CVT && fast_cvt(out, t, a[0], n))
    return;
  Scalar args[3];
  for (int64_t k = 0; k < n; k++) {
    for (int j = 0; j < op_info[x->op].nargs; j++)
      args[j] = at(a[j], k);
    put(out, t, k, interp_apply(e->g, i, args, pc->tensor, pc->start + lo + k, e->l->numel[pc->tensor]));
  }
}

typedef struct {
  Eager *e;
  Ref i;
  void *o;
  const Piece *pc;
} OpRun;

static void op_range(void *ctx, int64_t lo, int64_t hi) {
  OpRun *r = ctx;
  run_op_range(r->e, r->i, r->o, r->pc, lo, hi);
}

/* One op over a whole tensor; large tensors are split across the threads,
 * as torch's at::parallel_for does (its grain is 32768 elements). */
static void run_op(Eager *e, Ref i, void *o, const Piece *pc) {
  if (e->pool && pc->n >= 32768) {
    OpRun r = {e, i, o, pc};
    pool_run(e->pool, op_range, &r, pc->n);
  } else {
    run_op_range(e, i, o, pc, 0, pc->n);
  }
}

/* The chunk partials of a reduction over this piece's elements. */
static void run_reduce(Eager *e, Ref r, const Piece *pc) {
  const Ins *x = &e->g->ins[r];
  const GroupLayout *l = e->l;
  RedKind k = (RedKind)x->red;
  Ref a = x->args[0];
  Type t = (Type)e->g->ins[a].type;
  for (int64_t c = pc->c0; c < pc->c1; c++) {
    const Chunk *ch = &l->chunks[c];
    int64_t off = ch->flat - pc->flat;
    Operand o = operand(e, a, off);
    bool is_max = k == RED_MAX || k == RED_ABSMAX;
    double lanes[OPTC_REDUCE_LANES];
    for (int j = 0; j < OPTC_REDUCE_LANES; j++)
      lanes[j] = is_max ? -INFINITY : 0.0;
    for (int64_t j = 0; j < ch->len; j++) {
      double v = interp_scalar_to_double(at(o, j), t);
      double *acc = &lanes[j % OPTC_REDUCE_LANES];
      switch (k) {
      case RED_SUM: *acc += v; break;
      case RED_SUMSQ: *acc += v * v; break;
      case RED_MAX: *acc = optc_max_nan(*acc, v); break;
      case RED_ABSMAX: *acc = optc_max_nan(*acc, fabs(v)); break;
      default: unreachable();
      }
    }
    e->part[c] = optc_lanes_combine(lanes, is_max);
  }
}

/* The step-scope value of a reduction: this layout's chunk partials, or,
 * on a shard, every rank's in global order. */
static double fold_partials(const Eager *e, RedKind k) {
  bool is_max = k == RED_MAX || k == RED_ABSMAX;
  if (!e->reducer)
    return layout_fold(e->part, e->l->nchunks, 1, 0, is_max);
  const GroupLayout *gl = e->reducer->global;
  double *global = malloc(sizeof(double) * ((size_t)gl->nchunks + 1));
  ASSERT(global);
  e->reducer->gather(e->reducer->ctx, e->part, e->l->nchunks, 1, global);
  double v = layout_fold(global, gl->nchunks, 1, 0, is_max);
  free(global);
  return v;
}

static void eval_step_values(Eager *e, int stage) {
  const Graph *g = e->g;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_STEP || e->s.stage[i] != stage || x->op == OP_REDUCE)
      continue;
    if (x->op == OP_CONST)
      e->step[i] = interp_scalar_from_double(x->imm, (Type)x->type);
    else if (x->op == OP_INPUT)
      e->step[i] = interp_scalar_from_double(e->inputs ? e->inputs[i] : x->imm, (Type)x->type);
    else {
      Scalar args[3];
      for (int k = 0; k < op_info[x->op].nargs; k++)
        args[k] = e->step[x->args[k]];
      e->step[i] = interp_apply(g, i, args, 0, 0, 0);
    }
  }
}

/* Stage `stage` for one tensor: its ops in order; in the last stage, its stores. */
static void release(Eager *e, Ref a) {
  if (e->owned[a]) {
    free(e->arr[a]);
    e->arr[a] = NULL;
    e->owned[a] = false;
  }
}

/* Points value r at a piece's elements: a load at its buffer, a value kept
 * for the group at its group-wide array. */
static void bind(Eager *e, Ref r, const Piece *pc) {
  const Ins *x = &e->g->ins[r];
  int64_t base = pc->flat;
  if (e->group[r])
    e->arr[r] = elem_ptr(e->group[r], (Type)x->type, base);
  else if (e->donated_to[r] != NOREF) /* same memory, same type */
    e->arr[r] = elem_ptr(e->group[e->donated_to[r]], (Type)x->type, base);
  else if (x->op == OP_LOAD)
    e->arr[r] = piece_ptr(e, x->buf, pc);
}

/* Instruction i of stage `stage` for one piece. */
static void run_one(Eager *e, int stage, Ref i, const Piece *pc) {
  const Graph *g = e->g;
  const Ins *x = &g->ins[i];
  int64_t n = pc->n;
  for (int k = 0; k < op_info[x->op].nargs; k++)
    bind(e, x->args[k], pc);
  if (x->op == OP_REDUCE) {
    if (e->s.stage[i] == stage + 1 && g->ins[x->args[0]].scope == SCOPE_ELEM)
      run_reduce(e, i, pc);
    return;
  }
  if (x->op == OP_STORE) {
    if (stage != e->s.last)
      return;
    Ref v = x->args[0];
    const Ins *y = &g->ins[v];
    Type bt = (Type)g->bufs[x->buf].type;
    void *dst = piece_ptr(e, x->buf, pc);
    if (e->s.in_place[v] == i)
      return;
    if (y->scope == SCOPE_ELEM) {
      memcpy(dst, e->arr[v], (size_t)n * (size_t)type_size(bt));
      if (e->s.last_use[v] == i)
        release(e, v);
    } else {
      for (int64_t k = 0; k < n; k++)
        put(dst, bt, k, e->step[v]);
    }
    return;
  }
  if (e->s.stage[i] != stage || !is_arith(x))
    return;
  /* Where the result goes: the buffer (in place), the group-wide array
   * (read in a later stage, or foreach), or this tensor's temporary. */
  void *o;
  Type t0 = (Type)x->type;
  /* torch's in-place ops (x.mul_(s)): an operand that dies here, of the
   * result's type, gives its memory to the result */
  Ref donor = NOREF;
  for (int k = 0; k < op_info[x->op].nargs && donor == NOREF; k++) {
    Ref a = x->args[k];
    if (e->s.last_use[a] == i && g->ins[a].type == x->type && !e->s.cross[a] &&
        (e->owned[a] || (e->keep[i] && e->keep[a] && e->group[a])))
      donor = a;
  }
  if (e->s.in_place[i] != NOREF) {
    o = piece_ptr(e, g->ins[e->s.in_place[i]].buf, pc);
  } else if (e->keep[i]) {
    if (!e->group[i]) {
      if (donor != NOREF && e->group[donor] && !e->s.cross[i]) {
        e->group[i] = e->group[donor];
        e->group_mem[i] = e->group_mem[donor];
        e->group[donor] = e->group_mem[donor] = NULL;
        e->donated_to[donor] = i;
      } else {
        e->group_mem[i] = alloc_arr(e->l->hi - e->l->lo, t0);
        e->group[i] = elem_ptr(e->group_mem[i], t0, -e->l->lo); /* indexed by flat index */
      }
    }
    bind(e, i, pc);
    o = e->arr[i];
  } else if (donor != NOREF && e->owned[donor]) {
    o = e->arr[donor];
    e->owned[donor] = false;
    e->arr[i] = o;
    e->owned[i] = true;
  } else {
    o = alloc_arr(n, t0);
    e->arr[i] = o;
    e->owned[i] = true;
  }
  run_op(e, i, o, pc);
  if (e->s.in_place[i] != NOREF)
    e->arr[i] = o;
  /* Free this tensor's temporaries after their last use, as torch's
   * refcounts do. */
  for (int k = 0; k < op_info[x->op].nargs; k++)
    if (e->s.last_use[x->args[k]] == i)
      release(e, x->args[k]);
}

/* torch's for-loop: each tensor, all its ops. */
static void run_stage_per_tensor(Eager *e, int stage) {
  for (int p = 0; p < e->npieces; p++)
    for (int i = 0; i < e->g->nins; i++)
      run_one(e, stage, i, &e->pieces[p]);
}

/* torch's foreach: each op, over all tensors; every intermediate is a list
 * of tensors, freed after its last use. */
static void run_stage_foreach(Eager *e, int stage) {
  const Graph *g = e->g;
  for (int i = 0; i < g->nins; i++) {
    for (int p = 0; p < e->npieces; p++)
      run_one(e, stage, i, &e->pieces[p]);
    const Ins *x = &g->ins[i];
    bool ran = e->s.stage[i] == stage || (x->op == OP_STORE && stage == e->s.last);
    for (int k = 0; ran && k < op_info[x->op].nargs; k++) {
      Ref a = x->args[k];
      if (e->s.last_use[a] == i && !e->s.cross[a] && e->group_mem[a]) {
        free(e->group_mem[a]);
        e->group[a] = e->group_mem[a] = NULL;
      }
    }
  }
}

int eager_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res) {
  return eager_run(g, l, bufs, args, res, false, NULL);
}

int eager_run(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res,
              bool foreach, ThreadPool *pool) {
  void **t = layout_tensor_bufs(l, g, bufs);
  int rc = eager_run_t(g, l, t, args, res, foreach, pool);
  free(t);
  return rc;
}

int eager_run_t(const Graph *g, const GroupLayout *l, void *const *tbufs, const StepArgs *args, StepResult *res,
                bool foreach, ThreadPool *pool) {
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_OPTION) {
      error("eager: option '%%%s' is unresolved", g->ins[i].name);
      return -1;
    }
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_REDUCE && g->ins[i].to != SCOPE_STEP) {
      error_at(g->ins[i].pos, "eager: reductions to tensor scope are not supported; use --backend interp or cpu");
      return -1;
    }
  Eager e = {.g = g, .l = l, .tbufs = tbufs, .inputs = args ? args->inputs : NULL, .pool = pool,
             .reducer = args ? args->reducer : NULL};
  sched_init(&e.s, g);
  size_t n = (size_t)g->nins + 1;
  e.step = calloc(n, sizeof(Scalar));
  e.arr = calloc(n, sizeof(void *));
  e.owned = calloc(n, sizeof(bool));
  e.group = calloc(n, sizeof(void *));
  e.keep = calloc(n, sizeof(bool));
  e.donated_to = malloc(n * sizeof(Ref));
  ASSERT(e.donated_to);
  for (size_t i = 0; i < n; i++)
    e.donated_to[i] = NOREF;
  e.part = calloc((size_t)l->nchunks + 1, sizeof(double));
  e.group_mem = calloc(n, sizeof(void *));
  e.pieces = calloc((size_t)l->nchunks + 1, sizeof(Piece));
  ASSERT(e.step && e.arr && e.owned && e.part && e.group_mem && e.pieces);
  /* the pieces: runs of consecutive chunks of one tensor */
  for (int64_t c = 0; c < l->nchunks; c++) {
    const Chunk *ch = &l->chunks[c];
    Piece *last = e.npieces ? &e.pieces[e.npieces - 1] : NULL;
    if (last && last->tensor == ch->tensor && last->flat + last->n == ch->flat) {
      last->n += ch->len;
      last->c1 = c + 1;
    } else {
      e.pieces[e.npieces++] = (Piece){ch->tensor, ch->flat, ch->start, ch->len, c, c + 1};
    }
  }
  /* Values read across stages live in group-wide arrays (torch keeps them
   * as tensors: p.grad after scale_grads); with foreach, every
   * intermediate does. */
  for (int i = 0; i < g->nins; i++)
    e.keep[i] = e.s.cross[i] || (foreach && is_arith(&g->ins[i]));
  memset(res, 0, sizeof *res);
  bool ok = !args || args->propagate || args->grads_finite != 0;
  if (ok && (!args || (!args->propagate && args->grads_finite < 0))) {
    for (int b = 0; b < g->nbufs && ok; b++)
      if (g->bufs[b].kind == BUF_GRAD)
        for (int p = 0; p < e.npieces && ok; p++)
          for (int64_t k = 0; k < e.pieces[p].n && ok; k++) {
            Operand o = {.p = piece_ptr(&e, b, &e.pieces[p]), .t = (Type)g->bufs[b].type};
            ok = isfinite(interp_scalar_to_double(at(o, k), o.t));
          }
  }
  if (e.reducer)
    ok = e.reducer->all(e.reducer->ctx, ok);
  for (int s = 0; ok && s <= e.s.last; s++) {
    eval_step_values(&e, s);
    if (foreach)
      run_stage_foreach(&e, s);
    else
      run_stage_per_tensor(&e, s);
    for (int r = 0; r < g->nins; r++) {
      if (g->ins[r].op != OP_REDUCE || e.s.stage[r] != s + 1)
        continue;
      e.step[r].d = fold_partials(&e, (RedKind)g->ins[r].red);
      if (res->nred < (int)ARRAY_LEN(res->red))
        res->red[res->nred++] = e.step[r].d;
      if (!isfinite(e.step[r].d) && !(args && args->propagate) && (e.reducer ? e.reducer->global : l)->nchunks > 0)
        ok = false;
    }
  }
  res->skipped = !ok;
  for (size_t i = 0; i < n; i++) {
    if (e.owned[i])
      free(e.arr[i]);
    free(e.group_mem[i]);
  }
  free(e.group);
  free(e.keep);
  free(e.donated_to);
  free(e.step);
  free(e.arr);
  free(e.owned);
  free(e.part);
  free(e.pieces);
  free(e.group_mem);
  sched_free(&e.s);
  return 0;
}
