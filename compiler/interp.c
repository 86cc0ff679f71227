/* interp.c: the reference interpreter. It defines what a step graph means;
 * every backend must produce its bytes.
 *
 * - Each value is computed in its declared type: f64 as double, f32 as
 *   float, one rounding per op, no contraction into fused multiply-adds
 *   (the build passes -ffp-contract=off). Arithmetic on bf16 or f16 values
 *   computes in f32 and rounds the result to nearest even.
 * - A reduction sums (or maxes) each chunk in f64 in 8 lanes (element j into
 *   lane j % 8, as numerics.h defines), then the chunk partials in chunk
 *   order: per tensor for tensor scope, over the whole group for step scope.
 * - Values are evaluated in stages: stage 0 needs no reduction; a value that
 *   reads a reduction of stage-s values is in stage s+1. The interpreter
 *   sweeps the elements once per stage, recomputing what it needs from the
 *   loads, and stores only in the last sweep. Loads therefore always see the
 *   buffers as they were before the step.
 * - A reduction to block scope is a max over the elements of one block
 *   (exact in any order; with a NaN among them, the default NaN), known
 *   before anything that reads it. Within a
 *   sweep the interpreter takes each block of a chunk in block stages (as
 *   the plan does): pass b computes what needs b block reductions, and the
 *   last pass recomputes every value and stores.
 * - Codes: `lookup` is the code book's entry, `search` numerics_quant.h's
 *   optc_code_search, torchao's algorithm itself (the backends search the
 *   thresholds instead, which give the same codes).
 */
#include "numerics_quant.h"
#include "plan.h"

#include <math.h>
#include <string.h>

typedef Scalar V;

typedef struct {
  const Graph *g;
  const GroupLayout *l;
  void *const *tbufs; /* (ntensors x nbufs): tensor t's element 0 of buffer b at [t * nbufs + b] */
  const double *inputs;
  int *stage;     /* (nins) */
  V *step;        /* (nins) step-scope values */
  V *tensor;      /* (ntensors * nins) tensor-scope values */
  V *blockv;      /* (nins) block-scope values of the block being evaluated */
  V *elem;        /* (nins) the element being evaluated */
  int *bstage;    /* (nins) block stages: the block reductions on a value's longest path */
  int max_bstage;
  double *part;   /* (nchunks) partials of the reduction being accumulated */
  const Reducer *reducer;
  int max_stage;
} Interp;

/* ---- per-type arithmetic -------------------------------------------------- */

static float as_f32(V v, Type t) {
  switch (t) {
  case TY_F32: return v.f;
  case TY_BF16: return optc_bf16_to_f32(v.h);
  case TY_F16: return optc_f16_to_f32(v.h);
  case TY_F64: return (float)v.d;
  default: return (float)v.i;
  }
}

static double as_f64(V v, Type t) {
  switch (t) {
  case TY_F64: return v.d;
  case TY_F32: case TY_BF16: case TY_F16: return (double)as_f32(v, t);
  default: return (double)v.i;
  }
}

static V from_f32(float f, Type t) {
  V v = {0};
  switch (t) {
  case TY_F32: v.f = f; break;
  case TY_BF16: v.h = optc_f32_to_bf16(f); break;
  case TY_F16: v.h = optc_f32_to_f16(f); break;
  default: unreachable();
  }
  return v;
}

/* Float to integer: toward zero, NaN to 0, saturating at the type's range. */
static int64_t to_int(double d, Type t) {
  double lo = t == TY_I32 ? -2147483648.0 : -9223372036854775808.0;
  double hi = t == TY_I32 ? 2147483647.0 : 9223372036854775807.0;
  if (isnan(d))
    return 0;
  if (d <= lo)
    return (int64_t)lo;
  if (d >= hi)
    return t == TY_I32 ? 2147483647 : INT64_MAX;
  return (int64_t)d;
}

static V convert(V a, Type from, Type to) {
  V v = {0};
  if (from == to)
    return a;
  if (type_is_float(from) && type_is_float(to)) {
    if (to == TY_F64)
      v.d = as_f64(a, from);
    else if (from == TY_F64)
      v = from_f32((float)a.d, to); /* f64 -> 16-bit rounds through f32 */
    else
      v = from_f32(as_f32(a, from), to);
    return v;
  }
  if (type_is_float(from)) {
    v.i = to_int(as_f64(a, from), to);
    return v;
  }
  int64_t i = from == TY_I32 ? (int32_t)a.i : a.i;
  if (to == TY_F64)
    v.d = (double)i;
  else if (type_is_float(to))
    v = from_f32((float)i, to);
  else
    v.i = to == TY_I32 ? (int32_t)i : i;
  return v;
}

/* torch.maximum / torch.minimum: NaN-propagating, else std::max / std::min. */
static float maxf_(float a, float b) { return a != a ? a : b != b ? b : (a < b ? b : a); }
static float minf_(float a, float b) { return a != a ? a : b != b ? b : (b < a ? b : a); }
static double maxd_(double a, double b) { return a != a ? a : b != b ? b : (a < b ? b : a); }
static double mind_(double a, double b) { return a != a ? a : b != b ? b : (b < a ? b : a); }

static float arith_f(Op op, float a, float b, float c) {
  switch (op) {
  case OP_ADD: return a + b;
  case OP_SUB: return a - b;
  case OP_MUL: return a * b;
  case OP_DIV: return a / b;
  case OP_MIN: return minf_(a, b);
  case OP_MAX: return maxf_(a, b);
  case OP_POW: return powf(a, b);
  case OP_NEG: return -a;
  case OP_ABS: return fabsf(a);
  case OP_SQRT: return sqrtf(a);
  case OP_SIGN: return (float)((0.0f < a) - (a < 0.0f));
  case OP_RSQRT: return 1.0f / sqrtf(a);
  case OP_EXP: return expf(a);
  case OP_LOG: return logf(a);
  case OP_FMA: return fmaf(a, b, c);
  case OP_LERP: return optc_lerpf(a, b, c);
  case OP_SQRT_MKL: return optc_sqrt_mkl_f32(a);
  case OP_SQRT_MKL_EX: return optc_sqrt_mkl_ex_f32(a);
  default: unreachable();
  }
}

static double arith_d(Op op, double a, double b, double c) {
  switch (op) {
  case OP_ADD: return a + b;
  case OP_SUB: return a - b;
  case OP_MUL: return a * b;
  case OP_DIV: return a / b;
  case OP_MIN: return mind_(a, b);
  case OP_MAX: return maxd_(a, b);
  case OP_POW: return pow(a, b);
  case OP_NEG: return -a;
  case OP_ABS: return fabs(a);
  case OP_SQRT: return sqrt(a);
  case OP_SIGN: return (double)((0.0 < a) - (a < 0.0));
  case OP_RSQRT: return 1.0 / sqrt(a);
  case OP_EXP: return exp(a);
  case OP_LOG: return log(a);
  case OP_FMA: return fma(a, b, c);
  case OP_LERP: return optc_lerpd(a, b, c);
  case OP_SQRT_MKL:
  case OP_SQRT_MKL_EX: return sqrt(a); /* MKL's f64 sqrt is IEEE */
  default: unreachable();
  }
}

static bool compare(Op op, double a, double b) {
  switch (op) {
  case OP_EQ: return a == b;
  case OP_NE: return a != b;
  case OP_LT: return a < b;
  case OP_LE: return a <= b;
  case OP_GT: return a > b;
  case OP_GE: return a >= b;
  default: unreachable();
  }
}

/* The element a value reads: its tensor and index, for loads, for the
 * stochastic-rounding hash and for tailpos. */
typedef struct {
  int tensor;
  int64_t index; /* within the tensor */
  int64_t flat;  /* in the flat buffers */
  int64_t numel; /* the tensor's elements */
} Where;

static const void *tensor_base(const Interp *in, int buf, int tensor) {
  return in->tbufs[(size_t)tensor * (size_t)in->g->nbufs + (size_t)buf];
}

/* The index of element w in buffer b: its block's for a per-block buffer. */
static int64_t mem_index(const Interp *in, int b, Where w) {
  return in->g->bufs[b].per_block ? w.index / in->g->block : w.index;
}

static V load(const Interp *in, const Ins *x, Where w) {
  const void *p = tensor_base(in, x->buf, w.tensor);
  int64_t i = mem_index(in, x->buf, w);
  V v = {0};
  switch ((Type)x->type) {
  case TY_F64: v.d = ((const double *)p)[i]; break;
  case TY_F32: v.f = ((const float *)p)[i]; break;
  case TY_BF16: case TY_F16: v.h = ((const uint16_t *)p)[i]; break;
  case TY_U8: v.i = ((const uint8_t *)p)[i]; break;
  case TY_U4: v.i = (((const uint8_t *)p)[i / 2] >> (i % 2 ? 0 : 4)) & 15; break;
  default: unreachable();
  }
  return v;
}

static void store(const Interp *in, const Ins *x, V v, Where w) {
  void *p = (void *)tensor_base(in, x->buf, w.tensor);
  int64_t i = mem_index(in, x->buf, w);
  switch ((Type)in->g->bufs[x->buf].type) {
  case TY_F64: ((double *)p)[i] = v.d; break;
  case TY_F32: ((float *)p)[i] = v.f; break;
  case TY_BF16: case TY_F16: ((uint16_t *)p)[i] = v.h; break;
  case TY_U8: ((uint8_t *)p)[i] = (uint8_t)v.i; break;
  case TY_U4: {
    /* element 2k in the high nibble of byte k; the other nibble kept */
    uint8_t *q = (uint8_t *)p + i / 2;
    *q = (uint8_t)(i % 2 ? (*q & 0xf0) | (v.i & 15) : (*q & 0x0f) | (v.i & 15) << 4);
    break;
  }
  default: unreachable();
  }
}

static V *tensor_val(const Interp *in, int tensor, Ref r) {
  return &in->tensor[(size_t)tensor * (size_t)in->g->nins + (size_t)r];
}

/* The value of operand r as seen from an element of `tensor`. */
static V operand(const Interp *in, Ref r, int tensor) {
  switch ((Scope)in->g->ins[r].scope) {
  case SCOPE_STEP: return in->step[r];
  case SCOPE_TENSOR: return *tensor_val(in, tensor, r);
  case SCOPE_BLOCK: return in->blockv[r];
  default: return in->elem[r];
  }
}

/* Computes op on operand values a of types at, giving type t; book is a
 * lookup's or search's code book. */
static V eval_op(Op op, Type t, const V *a, const Type *at, Where w, Book book) {
  V v = {0};
  switch (op_info[op].type_rule) {
  case TR_LOOKUP: {
    const CodeBook *cb = codebook(book);
    ASSERT(a[0].i >= 0 && a[0].i < cb->n);
    v.f = cb->q[a[0].i];
    return v;
  }
  case TR_SEARCH: {
    const CodeBook *cb = codebook(book);
    v.i = optc_code_search(cb->q, cb->n, a[0].f);
    return v;
  }
  case TR_ARITH:
    if (t == TY_F64)
      v.d = arith_d(op, a[0].d, a[1].d, a[2].d);
    else
      v = from_f32(arith_f(op, as_f32(a[0], t), as_f32(a[1], t), as_f32(a[2], t)), t);
    return v;
  case TR_CMP:
    if (type_is_int(at[0]))
      v.i = compare(op, (double)a[0].i, (double)a[1].i) ? 1 : 0;
    else
      v.i = compare(op, as_f64(a[0], at[0]), as_f64(a[1], at[0]));
    return v;
  case TR_TEST:
    v.i = isfinite(as_f64(a[0], at[0])) ? 1 : 0;
    return v;
  case TR_LOGIC:
    v.i = op == OP_AND ? (a[0].i && a[1].i) : op == OP_OR ? (a[0].i || a[1].i) : !a[0].i;
    return v;
  case TR_SELECT: return a[0].i ? a[1] : a[2];
  case TR_CVT: return convert(a[0], at[0], t);
  case TR_CVTSR: {
    uint32_t key = optc_sr_key((uint64_t)a[1].i, (uint64_t)a[2].i, (uint32_t)w.tensor);
    uint32_t bits = optc_sr_bits(key, (uint64_t)w.index);
    v.h = t == TY_BF16 ? optc_f32_to_bf16_sr(a[0].f, bits) : optc_f32_to_f16_sr(a[0].f, bits);
    return v;
  }
  case TR_TAILPOS:
    v.i = optc_tailpos(w.index, w.numel, a[0].i, a[1].i);
    return v;
  default: unreachable();
  }
}

/* Computes instruction i (not a leaf, load, store or reduce). */
static V eval(const Interp *in, Ref i, Where w) {
  const Ins *x = &in->g->ins[i];
  V a[3] = {{0}};
  Type at[3] = {TY_VOID, TY_VOID, TY_VOID};
  for (int k = 0; k < op_info[x->op].nargs; k++) {
    a[k] = operand(in, x->args[k], w.tensor);
    at[k] = (Type)in->g->ins[x->args[k]].type;
  }
  return eval_op((Op)x->op, (Type)x->type, a, at, w, (Book)x->book);
}

Scalar interp_apply(const Graph *g, Ref i, const Scalar *args, int tensor, int64_t index, int64_t numel) {
  const Ins *x = &g->ins[i];
  Type at[3] = {TY_VOID, TY_VOID, TY_VOID};
  for (int k = 0; k < op_info[x->op].nargs; k++)
    at[k] = (Type)g->ins[x->args[k]].type;
  return eval_op((Op)x->op, (Type)x->type, args, at, (Where){.tensor = tensor, .index = index, .numel = numel},
                 (Book)x->book);
}

/* An integer input given a double outside int64's range (or NaN) saturates:
 * the plain cast would be undefined behaviour. */
Scalar interp_scalar_from_double(double d, Type t) {
  if (type_is_float(t))
    return convert((V){.d = d}, TY_F64, t);
  int64_t i = isnan(d) ? 0 : d >= 0x1p63 ? INT64_MAX : d < -0x1p63 ? INT64_MIN : (int64_t)d;
  return (V){.i = i};
}

double interp_scalar_to_double(Scalar v, Type t) { return type_is_float(t) ? as_f64(v, t) : (double)v.i; }

/* ---- staging ------------------------------------------------------------------ */

static bool is_block_reduce(const Ins *x) { return x->op == OP_REDUCE && x->to == SCOPE_BLOCK; }

static void compute_stages(Interp *in) {
  const Graph *g = in->g;
  in->max_stage = in->max_bstage = 0;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    int s = 0, b = 0;
    for (int k = 0; k < op_info[x->op].nargs; k++) {
      s = MAX(s, in->stage[x->args[k]]);
      b = MAX(b, in->bstage[x->args[k]]);
    }
    bool phase_reduce = x->op == OP_REDUCE && !is_block_reduce(x);
    in->stage[i] = phase_reduce ? s + 1 : s;
    in->bstage[i] = is_block_reduce(x) ? b + 1 : phase_reduce ? 0 : b;
    in->max_bstage = MAX(in->max_bstage, in->bstage[i]);
    if (x->op == OP_STORE || phase_reduce)
      in->max_stage = MAX(in->max_stage, phase_reduce ? s : in->stage[i]);
  }
}

/* Tensor-scope values of stage s (reductions excepted), once per tensor. */
static void eval_tensor_values(Interp *in, int s) {
  const Graph *g = in->g;
  for (int t = 0; t < in->l->ntensors; t++)
    for (int i = 0; i < g->nins; i++) {
      const Ins *x = &g->ins[i];
      if (x->scope == SCOPE_TENSOR && in->stage[i] == s && x->op != OP_REDUCE)
        *tensor_val(in, t, i) = eval(in, i, (Where){.tensor = t});
    }
}

/* Step-scope values of stage s (reductions excepted), once per step. */
static void eval_step_values(Interp *in, int s) {
  const Graph *g = in->g;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_STEP || in->stage[i] != s || x->op == OP_REDUCE)
      continue;
    V v = {0};
    if (x->op == OP_CONST || x->op == OP_OPTION) {
      v = type_is_float((Type)x->type) ? convert((V){.d = x->imm}, TY_F64, (Type)x->type) : (V){.i = (int64_t)x->imm};
    } else if (x->op == OP_INPUT) {
      double d = in->inputs ? in->inputs[i] : x->imm;
      v = type_is_float((Type)x->type) ? convert((V){.d = d}, TY_F64, (Type)x->type) : (V){.i = (int64_t)d};
    } else {
      v = eval(in, i, (Where){0});
    }
    in->step[i] = v;
  }
}

static double red_term(RedKind k, double x) {
  switch (k) {
  case RED_SUM: return x;
  case RED_SUMSQ: return x * x;
  case RED_MAX: return x;
  case RED_ABSMAX: return fabs(x);
  default: unreachable();
  }
}

static double red_combine(RedKind k, double acc, double x) {
  return k == RED_SUM || k == RED_SUMSQ ? acc + x : maxd_(acc, x);
}

static double red_init(RedKind k) { return k == RED_SUM || k == RED_SUMSQ ? 0.0 : -INFINITY; }

/* Element e of a chunk (at w): its values of stage <= s and block stage
 * <= bs, and its stores when `store`. */
static void eval_element(Interp *in, int s, int bs, Where w, bool store_now) {
  const Graph *g = in->g;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_ELEM || in->stage[i] > s || in->bstage[i] > bs)
      continue;
    if (x->op == OP_LOAD)
      in->elem[i] = load(in, x, w);
    else if (x->op == OP_STORE) {
      if (store_now)
        store(in, x, operand(in, x->args[0], w.tensor), w);
    } else
      in->elem[i] = eval(in, i, w);
  }
}

/* Adds element e's term of reduction r to its lane. */
static void accumulate(Interp *in, Ref r, Where w, double *lanes, int64_t e) {
  const Graph *g = in->g;
  RedKind rk = (RedKind)g->ins[r].red;
  Ref a = g->ins[r].args[0];
  double v = as_f64(operand(in, a, w.tensor), (Type)g->ins[a].type);
  double *lane = &lanes[e % OPTC_REDUCE_LANES];
  *lane = red_combine(rk, *lane, red_term(rk, v));
}

/* One block [b0, b1) of chunk ch in block stages (stage <= s): pass bs
 * computes the block values of block stage bs, then the elements' values
 * of block stage <= bs and the block reductions of them; the last pass
 * stores and accumulates the chunk's reduction r. */
static void sweep_block(Interp *in, int s, Ref r, bool final, const Chunk *ch, int64_t b0, int64_t b1,
                        double *lanes) {
  const Graph *g = in->g;
  int64_t numel = in->l->numel[ch->tensor];
  Where wb = {ch->tensor, ch->start + b0, ch->flat + b0, numel};
  for (int bs = 0; bs <= in->max_bstage; bs++) {
    for (int i = 0; i < g->nins; i++) {
      const Ins *x = &g->ins[i];
      if (x->scope != SCOPE_BLOCK || in->stage[i] > s || x->op == OP_STORE)
        continue;
      if (is_block_reduce(x) && in->bstage[i] == bs + 1) /* this pass accumulates it */
        in->blockv[i].d = red_init((RedKind)x->red);
      else if (is_block_reduce(x) || in->bstage[i] != bs)
        continue;
      else if (x->op == OP_LOAD)
        in->blockv[i] = load(in, x, wb);
      else
        in->blockv[i] = eval(in, i, wb);
    }
    bool last = bs == in->max_bstage;
    for (int64_t e = b0; e < b1; e++) {
      Where w = {ch->tensor, ch->start + e, ch->flat + e, numel};
      eval_element(in, s, bs, w, final && last);
      for (int i = 0; i < g->nins; i++) {
        const Ins *x = &g->ins[i];
        if (is_block_reduce(x) && in->stage[i] <= s && in->bstage[i] == bs + 1) {
          Ref a = x->args[0];
          double v = as_f64(operand(in, a, w.tensor), (Type)g->ins[a].type);
          in->blockv[i].d = red_combine((RedKind)x->red, in->blockv[i].d, red_term((RedKind)x->red, v));
        }
      }
      if (last && r != NOREF)
        accumulate(in, r, w, lanes, e);
    }
    /* a block's max with a NaN in it is the default NaN, whichever NaN it
     * met first (as the backends, whose lanes meet them in other orders) */
    for (int i = 0; i < g->nins; i++)
      if (is_block_reduce(&g->ins[i]) && in->stage[i] <= s && in->bstage[i] == bs + 1 && isnan(in->blockv[i].d))
        in->blockv[i].d = NAN;
  }
  if (final) /* the block's own stores (its scale), every load of the block done */
    for (int i = 0; i < g->nins; i++) {
      const Ins *x = &g->ins[i];
      if (x->op == OP_STORE && x->scope == SCOPE_BLOCK && in->stage[i] <= s)
        store(in, x, operand(in, x->args[0], ch->tensor), wb);
    }
}

/* One sweep over every element, evaluating stage <= s; with `final`, the
 * stores happen. Accumulates reduction `r` (if not NOREF) per chunk. */
static void sweep(Interp *in, int s, Ref r, bool final) {
  const Graph *g = in->g;
  const GroupLayout *l = in->l;
  for (int64_t c = 0; c < l->nchunks; c++) {
    const Chunk *ch = &l->chunks[c];
    RedKind rk = r != NOREF ? (RedKind)g->ins[r].red : RED_SUM;
    double lanes[OPTC_REDUCE_LANES];
    for (int k = 0; k < OPTC_REDUCE_LANES; k++)
      lanes[k] = red_init(rk);
    if (g->block) {
      /* blocks of the tensor: the chunk starts on one (layout.c) */
      ASSERT(ch->start % g->block == 0);
      for (int64_t b0 = 0; b0 < ch->len; b0 += g->block)
        sweep_block(in, s, r, final, ch, b0, MIN(b0 + g->block, ch->len), lanes);
    } else {
      for (int64_t e = 0; e < ch->len; e++) {
        Where w = {ch->tensor, ch->start + e, ch->flat + e, l->numel[ch->tensor]};
        eval_element(in, s, 0, w, final);
        if (r != NOREF)
          accumulate(in, r, w, lanes, e);
      }
    }
    if (r != NOREF)
      in->part[c] = optc_lanes_combine(lanes, rk == RED_MAX || rk == RED_ABSMAX);
  }
}

/* Folds the chunk partials of reduction r, in chunk order; a reduction of
 * tensor-scope values folds them in tensor order. */
static void fold(Interp *in, Ref r) {
  const Graph *g = in->g;
  const GroupLayout *l = in->l;
  RedKind k = (RedKind)g->ins[r].red;
  Ref a = g->ins[r].args[0];
  if (g->ins[a].scope == SCOPE_TENSOR) {
    double acc = red_init(k);
    for (int t = 0; t < l->ntensors; t++)
      acc = red_combine(k, acc, red_term(k, as_f64(*tensor_val(in, t, a), (Type)g->ins[a].type)));
    in->step[r].d = acc;
    return;
  }
  bool is_max = k == RED_MAX || k == RED_ABSMAX;
  const double *part = in->part;
  double *global = NULL;
  if (in->reducer) {
    l = in->reducer->global;
    global = malloc(sizeof(double) * ((size_t)l->nchunks + 1));
    ASSERT(global);
    in->reducer->gather(in->reducer->ctx, in->part, in->l->nchunks, 1, global);
    part = global;
  }
  if (g->ins[r].to == SCOPE_STEP) {
    in->step[r].d = layout_fold(part, l->nchunks, 1, 0, is_max);
  } else {
    double *per = malloc(sizeof(double) * ((size_t)l->ntensors + 1));
    ASSERT(per);
    layout_fold_tensors(l, part, 1, 0, is_max, per);
    for (int t = 0; t < l->ntensors; t++)
      tensor_val(in, t, r)->d = per[t];
    free(per);
  }
  free(global);
}

static bool grads_finite(const Interp *in) {
  const Graph *g = in->g;
  const GroupLayout *l = in->l;
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind != BUF_GRAD)
      continue;
    Type t = (Type)g->bufs[b].type;
    for (int64_t c = 0; c < l->nchunks; c++)
      for (int64_t e = 0; e < l->chunks[c].len; e++) {
        const void *p = tensor_base(in, b, l->chunks[c].tensor);
        int64_t f = l->chunks[c].start + e;
        V v = {0};
        if (t == TY_F64)
          v.d = ((const double *)p)[f];
        else if (t == TY_F32)
          v.f = ((const float *)p)[f];
        else
          v.h = ((const uint16_t *)p)[f];
        if (!isfinite(as_f64(v, t)))
          return false;
      }
  }
  return true;
}

int interp_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args,
                StepResult *res) {
  void **t = layout_tensor_bufs(l, g, bufs);
  int rc = interp_step_t(g, l, t, args, res);
  free(t);
  return rc;
}

int interp_step_t(const Graph *g, const GroupLayout *l, void *const *tbufs, const StepArgs *args,
                  StepResult *res) {
  if (g->nbufs > 0 && l->ntensors > 0 && !tbufs) {
    error("interpreter: no buffers");
    return -1;
  }
  for (int i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_OPTION) {
      error("interpreter: option '%%%s' is unresolved; build the graph from a recipe", g->ins[i].name);
      return -1;
    }
  if (g->block && l->align % g->block != 0) {
    error("interpreter: the group's tensors start on multiples of %lld, not of the graph's block %d",
          (long long)l->align, g->block);
    return -1;
  }
  Interp in = {.g = g, .l = l, .tbufs = tbufs, .inputs = args ? args->inputs : NULL,
               .reducer = args ? args->reducer : NULL};
  size_t n = (size_t)g->nins + 1;
  in.stage = calloc(n, sizeof(int));
  in.bstage = calloc(n, sizeof(int));
  in.step = calloc(n, sizeof(V));
  in.elem = calloc(n, sizeof(V));
  in.blockv = calloc(n, sizeof(V));
  int ntensors = in.reducer ? in.reducer->global->ntensors : l->ntensors;
  in.tensor = calloc(n * (size_t)(ntensors + 1), sizeof(V));
  in.part = calloc((size_t)l->nchunks + 1, sizeof(double));
  ASSERT(in.stage && in.bstage && in.step && in.elem && in.blockv && in.tensor && in.part);
  memset(res, 0, sizeof *res);
  compute_stages(&in);

  bool ok = !args || args->propagate || args->grads_finite != 0;
  if (ok && (!args || (!args->propagate && args->grads_finite < 0)))
    ok = grads_finite(&in);
  if (in.reducer)
    ok = in.reducer->all(in.reducer->ctx, ok);
  for (int s = 0; ok && s <= in.max_stage; s++) {
    eval_step_values(&in, s);
    eval_tensor_values(&in, s);
    /* Reductions over stage-s values, each in its own sweep: they become
     * stage s+1 values. */
    for (int r = 0; r < g->nins; r++) {
      if (g->ins[r].op != OP_REDUCE || is_block_reduce(&g->ins[r]) || in.stage[r] != s + 1)
        continue;
      if (g->ins[g->ins[r].args[0]].scope == SCOPE_ELEM)
        sweep(&in, s, r, false);
      fold(&in, r);
      if (g->ins[r].to == SCOPE_STEP) {
        if (res->nred < (int)ARRAY_LEN(res->red))
          res->red[res->nred++] = in.step[r].d;
        if (!isfinite(in.step[r].d) && !(args && args->propagate) && l->nchunks > 0)
          ok = false;
      }
    }
  }
  if (ok)
    sweep(&in, in.max_stage, NOREF, true);
  res->skipped = !ok;
  free(in.stage);
  free(in.bstage);
  free(in.step);
  free(in.elem);
  free(in.blockv);
  free(in.tensor);
  free(in.part);
  return 0;
}

/* ---- constant folding, with the interpreter's own arithmetic ------------------ */

static V imm_value(const Ins *x) {
  if (type_is_float((Type)x->type))
    return convert((V){.d = x->imm}, TY_F64, (Type)x->type);
  return (V){.i = (int64_t)x->imm};
}

bool interp_fold(const Graph *g, Ref i, double *out) {
  const Ins *x = &g->ins[i];
  const OpInfo *info = &op_info[x->op];
  if (!(info->flags & F_FOLD))
    return false;
  for (int k = 0; k < info->nargs; k++)
    if (g->ins[x->args[k]].op != OP_CONST)
      return false;
  /* eval()'s arithmetic on the constants themselves: nothing sized by the
   * graph, so that folding a whole graph stays linear */
  V a[3] = {{0}};
  Type at[3] = {TY_VOID, TY_VOID, TY_VOID};
  for (int k = 0; k < info->nargs; k++) {
    a[k] = imm_value(&g->ins[x->args[k]]);
    at[k] = (Type)g->ins[x->args[k]].type;
  }
  V v = eval_op((Op)x->op, (Type)x->type, a, at, (Where){0}, (Book)x->book);
  *out = type_is_float((Type)x->type) ? as_f64(v, (Type)x->type) : (double)v.i;
  return true;
}

void interp_eval_steps(const Graph *g, Ref lo, Ref hi, const double *inputs, Scalar *step) {
  for (Ref i = lo; i < hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope != SCOPE_STEP || x->op == OP_REDUCE || x->op == OP_STORE)
      continue;
    if (x->op == OP_CONST || x->op == OP_OPTION)
      step[i] = imm_value(x);
    else if (x->op == OP_INPUT)
      step[i] = interp_scalar_from_double(inputs ? inputs[i] : x->imm, (Type)x->type);
    else {
      Scalar a[3] = {{0}};
      for (int k = 0; k < op_info[x->op].nargs; k++)
        a[k] = step[x->args[k]];
      step[i] = interp_apply(g, i, a, 0, 0, 0);
    }
  }
}
