/* emit_llvm.c: the phase plan as LLVM IR, through the LLVM-C API.
 *
 * Each phase becomes one function over a range of the chunk table:
 *
 *   void optc_phaseK(const Chunk *chunks, i64 n, void *const *bufs,
 *                    const Scalar *step, const Scalar *tvals, double *partials)
 *
 * bufs is the tensor table (plan.h, layout_tensor_bufs): tensor t's
 * element 0 of buffer b at bufs[t * nbufs + b], so the tensors may be the
 * caller's own allocations. The element loop is written in explicit
 * vectors of W = 16 elements, so that it vectorizes whatever the optimizer
 * decides (zmm with AVX-512, two ymm with AVX2), followed by one masked
 * vector (masked loads and stores: nothing past the chunk is touched) for
 * a chunk's last len % 16 elements. Every op is the IEEE op the interpreter performs on
 * each lane: no fast-math flags, no contraction, sqrt and fma as the exact
 * intrinsics, and bf16/f16 rounding and the stochastic-rounding hash in
 * integer ops, exactly as numerics.h writes them. A reduction keeps 8 f64
 * lanes (element j into lane j % 8) and combines them in numerics.h's tree.
 */
#include "emit.h"

#include <llvm-c/Analysis.h>

LLVMValueRef operand(E *e, Ref r) {
  const Ins *x = &e->g->ins[r];
  if (x->scope == SCOPE_STEP || (x->scope == SCOPE_TENSOR && x->op == OP_REDUCE)) {
    ASSERT(e->splat[r]);
    return e->splat[r];
  }
  ASSERT(e->val[r]);
  return e->val[r];
}

/* Operand r of instruction i: a step value's canonical-NaN copy where i is
 * FL_CLEAN (a NaN's payload there is never seen, and a clean one keeps the
 * holds after it fast). */
static LLVMValueRef operand_of(E *e, Ref i, Ref r) {
  if ((e->fl[i] & FL_CLEAN) && e->csplat[r])
    return e->csplat[r];
  return operand(e, r);
}

static LLVMRealPredicate fpred(Op op) {
  switch (op) {
  case OP_EQ: return LLVMRealOEQ;
  case OP_NE: return LLVMRealUNE; /* C's !=: true when either is NaN */
  case OP_LT: return LLVMRealOLT;
  case OP_LE: return LLVMRealOLE;
  case OP_GT: return LLVMRealOGT;
  default: return LLVMRealOGE;
  }
}

static LLVMIntPredicate ipred(Op op) {
  switch (op) {
  case OP_EQ: return LLVMIntEQ;
  case OP_NE: return LLVMIntNE;
  case OP_LT: return LLVMIntSLT;
  case OP_LE: return LLVMIntSLE;
  case OP_GT: return LLVMIntSGT;
  default: return LLVMIntSGE;
  }
}

/* tailpos, per chunk: the remainder regions of torch's loop ranges that
 * this chunk can touch, as optc_tailpos computes them. A range holds at
 * least OPTC_TORCH_GRAIN / 2 elements, more than a chunk, so a chunk meets
 * at most two: the one holding its first element and the next. Each region
 * is [t, e): offsets count from t. */
static LLVMValueRef tail_regions(E *e, LLVMValueRef width, LLVMValueRef threads, LLVMValueRef numel) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef i64 = e->ti64;
  LLVMValueRef one = LLVMConstInt(i64, 1, 0), grain = LLVMConstInt(i64, OPTC_TORCH_GRAIN, 0);
  width = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, width, one, ""), one, width, "");
  LLVMValueRef split = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGT, threads, one, ""),
                                    LLVMBuildICmp(b, LLVMIntSGE, numel, grain, ""), "");
  LLVMValueRef ranges = LLVMBuildSDiv(b, LLVMBuildAdd(b, numel, LLVMConstInt(i64, OPTC_TORCH_GRAIN - 1, 0), ""),
                                      grain, "");
  ranges = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSGT, ranges, threads, ""), threads, ranges, "");
  ranges = LLVMBuildSelect(b, split, ranges, one, "");
  LLVMValueRef size = LLVMBuildSDiv(b, LLVMBuildSub(b, LLVMBuildAdd(b, numel, ranges, ""), one, ""), ranges, "");
  size = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, size, one, ""), one, size, "");
  LLVMValueRef r0 = LLVMBuildMul(b, LLVMBuildSDiv(b, e->start, size, ""), size, "");
  LLVMValueRef v = LLVMGetUndef(vec(i64, 4));
  for (int k = 0; k < 2; k++) {
    LLVMValueRef lo = k == 0 ? r0 : LLVMBuildAdd(b, r0, size, "");
    LLVMValueRef hi = LLVMBuildAdd(b, lo, size, "");
    hi = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, hi, numel, ""), hi, numel, "");
    hi = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, hi, lo, ""), lo, hi, "");
    LLVMValueRef body = LLVMBuildAdd(b, lo, LLVMBuildMul(b, LLVMBuildSDiv(b, LLVMBuildSub(b, hi, lo, ""), width, ""),
                                                        width, ""), "");
    v = LLVMBuildInsertElement(b, v, body, LLVMConstInt(e->ti32, (unsigned)(2 * k), 0), "");
    v = LLVMBuildInsertElement(b, v, hi, LLVMConstInt(e->ti32, (unsigned)(2 * k + 1), 0), "");
  }
  return v;
}

/* The element's offset into its remainder region, or -1, for W lanes. */
static LLVMValueRef tailpos(E *e, LLVMValueRef regions, const Loop *lp) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef lanes[W];
  for (int i = 0; i < W; i++)
    lanes[i] = LLVMConstInt(e->ti64, (unsigned long long)i, 0);
  LLVMValueRef r = splat_const(LLVMConstInt(e->ti64, (unsigned long long)-1, 1), W);
  if (lp->plain)
    return r;
  LLVMValueRef idx = LLVMBuildAdd(b, broadcast(e, LLVMBuildAdd(b, e->start, e->j, "")), LLVMConstVector(lanes, W), "");
  for (int k = 1; k >= 0; k--) {
    LLVMValueRef t = broadcast(e, LLVMBuildExtractElement(b, regions, LLVMConstInt(e->ti32, (unsigned)(2 * k), 0), ""));
    LLVMValueRef end = broadcast(e, LLVMBuildExtractElement(b, regions, LLVMConstInt(e->ti32, (unsigned)(2 * k + 1), 0), ""));
    LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGE, idx, t, ""), LLVMBuildICmp(b, LLVMIntSLT, idx, end, ""), "");
    r = LLVMBuildSelect(b, in, LLVMBuildSub(b, idx, t, ""), r, "");
  }
  return r;
}

/* The value a store's words come from: its operand, or i where that is
 * cvt(cvt(i) : f32) : bf16 (a hold stored, which emit_round_bf16 gives i's
 * words). */
Ref stored_value(const Graph *g, const Ins *store) {
  Ref a = store->args[0];
  const Ins *v = &g->ins[a];
  if (v->op == OP_CVT && g->ins[v->args[0]].op == OP_CVT && g->ins[v->args[0]].type == TY_F32)
    return g->ins[v->args[0]].args[0];
  return a;
}

static bool is_stored(const E *e, Ref i) {
  for (Ref k = i + 1; k < e->ph->hi; k++)
    if (e->g->ins[k].op == OP_STORE && stored_value(e->g, &e->g->ins[k]) == i)
      return true;
  return false;
}

/* Whether a later op reads bf16 value i as f32 (other than to store it). */
bool read_back(const E *e, Ref i) {
  const Graph *g = e->g;
  for (Ref k = i + 1; k < e->ph->hi; k++) {
    const Ins *w = &g->ins[k];
    if (w->op != OP_CVT || w->args[0] != i || (w->type != TY_F32 && w->type != TY_F64))
      continue;
    for (Ref u = k + 1; u < e->ph->hi; u++) {
      const Ins *x = &g->ins[u];
      for (int a = 0; a < op_info[x->op].nargs; a++)
        if (x->args[a] == k && !(x->op == OP_CVT && x->type == TY_BF16))
          return true;
    }
  }
  return false;
}

/* cvt %v : bf16 (instruction i), the first half of a hold or a store's
 * rounding. The bf16 bits are numerics.h's. A later cvt back to f32 takes
 * the rounded f32 bits (rnd) instead of widening them again: the NaN case
 * left out where the hold is FL_FAST. cvt(cvt(h : f32) : bf16) of a bf16 h
 * whose NaNs are canonical is h itself. */
static LLVMValueRef emit_round_bf16(E *e, Ref i, LLVMValueRef v, Type from, const Loop *lp) {
  const Graph *g = e->g;
  LLVMBuilderRef b = e->b;
  const Ins *y = &g->ins[g->ins[i].args[0]];
  if (y->op == OP_CVT && from == TY_F32 && g->ins[y->args[0]].type == TY_BF16 &&
      (!in_body(&g->ins[y->args[0]]) || (e->fl[y->args[0]] & FL_CANON)))
    return operand_of(e, i, y->args[0]);
  LLVMValueRef f = from == TY_F64 ? LLVMBuildFPTrunc(b, v, vtype(e, TY_F32), "") : v;
  if (lp->cvt && is_stored(e, i)) /* cvt_pays */
    return round_bf16_cvt(e, i, f);
  bool half_up = lp->tie && e->tie[i] != NOREF;
  LLVMValueRef sum = bf16_round_sum(e, LLVMBuildBitCast(b, f, vec(e->ti32, W), ""), half_up);
  LLVMValueRef fast = LLVMBuildAnd(b, sum, ci32(e, 0xffff0000u), "");
  /* An FL_FAST hold's f32 is fast; what is packed (its high halves) may
   * then come from the sum, one op fewer where nothing else uses fast
   * (vpermw is opaque to the optimizer: it would keep the and) */
  LLVMValueRef low = (e->fl[i] & FL_FAST) ? sum : fast;
  Ref a = g->ins[i].args[0];
  LLVMValueRef exact;
  if (in_body(&g->ins[a]) ? (e->fl[a] & FL_P) : (e->fl[i] & FL_CLEAN)) {
    /* a NaN came through as itself: quiet it and clear its payload (its
     * low 16 bits are zero: the sum did not carry into its high half) */
    if (!e->avx512 && (e->fl[i] & FL_FAST)) {
      /* the same on the packed words, half the vectors, the NaN test
       * included: a NaN's word is its high half, sign | 0x7f80 | a nonzero
       * 7-bit payload (its low 16 bits were zero), and any other value
       * rounds to a finite word or an infinity, so NaN <=> (w & 0x7fff) >
       * 0x7f80; it becomes sign | 0x7fc0 by subtracting (w & 0x7fff) -
       * 0x7fc0, which leaves the sign. Five ops for 16 elements. */
      e->rnd[i] = fast;
      LLVMValueRef w = bf16_pack(e, low);
      LLVMValueRef mag = LLVMBuildAnd(b, w, splat_const(LLVMConstInt(e->ti16, 0x7fff, 0), W), "");
      LLVMValueRef nan = LLVMBuildICmp(b, LLVMIntSGT, mag, splat_const(LLVMConstInt(e->ti16, 0x7f80, 0), W), "");
      LLVMValueRef d = LLVMBuildSub(b, mag, splat_const(LLVMConstInt(e->ti16, 0x7fc0, 0), W), "");
      return LLVMBuildSub(b, w, LLVMBuildAnd(b, LLVMBuildSExt(b, nan, vec(e->ti16, W), ""), d, ""), "");
    }
    LLVMValueRef q;
    if (e->avx512) { /* (low & c1) | c2 in one vpternlogd, masked by the NaN test */
      LLVMValueRef args[4] = {low, ci32(e, 0xffc0ffffu), ci32(e, 0x00400000), LLVMConstInt(e->ti32, 0xea, 0)};
      q = call_intrinsic(e, "llvm.x86.avx512.pternlog.d.512", NULL, 0, args, 4);
    } else {
      q = LLVMBuildOr(b, LLVMBuildAnd(b, low, ci32(e, 0xffc0ffffu), ""), ci32(e, 0x00400000), "");
    }
    exact = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, f, f, ""), q, low, "");
  } else {
    exact = bf16_round_exact(e, f, low);
  }
  e->rnd[i] = (e->fl[i] & FL_FAST) ? fast : exact;
  return bf16_pack(e, exact);
}

/* One instruction of the element computation, as W lanes, in loop lp. */
LLVMValueRef emit_ins(E *e, Ref i, const Loop *lp) {
  const Ins *x = &e->g->ins[i];
  LLVMBuilderRef b = e->b;
  Type t = (Type)x->type;
  Op op = (Op)x->op;
  LLVMValueRef a[3] = {0};
  Type at[3] = {TY_VOID, TY_VOID, TY_VOID};
  for (int k = 0; k < op_info[op].nargs; k++) {
    a[k] = operand_of(e, i, x->args[k]);
    at[k] = (Type)e->g->ins[x->args[k]].type;
  }
  if (op == OP_LERP && e->lerp_w[i]) {
    /* the weight is a step value: its branch of torch's lerp was chosen per chunk */
    LLVMValueRef d = LLVMBuildFSub(b, a[1], a[0], "");
    LLVMValueRef args[3] = {e->lerp_w[i], d, LLVMBuildSelect(b, e->lerp_lo[i], a[0], a[1], "")};
    LLVMTypeRef vt = LLVMTypeOf(d);
    return call_intrinsic(e, "llvm.fma", &vt, 1, args, 3);
  }
  switch (op_info[op].type_rule) {
  case TR_LEAF:
    if (op == OP_CONST) {
      LLVMValueRef c = type_is_float(t) ? LLVMConstReal(scalar_type(e, t), x->imm)
                                        : LLVMConstInt(scalar_type(e, t), (unsigned long long)(int64_t)x->imm, 1);
      if (t == TY_BF16 || t == TY_F16) { /* a 16-bit constant, as its bits */
        uint16_t h = t == TY_BF16 ? optc_f32_to_bf16((float)x->imm) : optc_f32_to_f16((float)x->imm);
        c = LLVMConstInt(e->ti16, h, 0);
      }
      return splat_const(c, W);
    }
    unreachable(); /* inputs are step scope */
  case TR_ARITH: {
    if (op == OP_DIV && lp->recip && e->rsplat[i])
      return LLVMBuildFMul(b, a[0], e->rsplat[i], "");
    if (t == TY_F32 || t == TY_F64)
      return arith(e, op, a);
    LLVMValueRef f[3];
    for (int k = 0; k < op_info[op].nargs; k++)
      f[k] = to_f32(e, a[k], t);
    return from_f32(e, arith(e, op, f), t);
  }
  case TR_CMP:
    if (type_is_int(at[0]))
      return LLVMBuildICmp(b, ipred(op), a[0], a[1], "");
    if (at[0] == TY_BF16 || at[0] == TY_F16)
      a[0] = to_f32(e, a[0], at[0]), a[1] = to_f32(e, a[1], at[0]);
    return LLVMBuildFCmp(b, fpred(op), a[0], a[1], "");
  case TR_TEST: {
    LLVMValueRef f = at[0] == TY_BF16 || at[0] == TY_F16 ? to_f32(e, a[0], at[0]) : a[0];
    LLVMValueRef inf = fconst(LLVMTypeOf(f), 1.0 / 0.0);
    return LLVMBuildFCmp(b, LLVMRealOLT, unary_intrinsic(e, "llvm.fabs", f), inf, "");
  }
  case TR_LOGIC:
    if (op == OP_NOT)
      return LLVMBuildNot(b, a[0], "");
    return op == OP_AND ? LLVMBuildAnd(b, a[0], a[1], "") : LLVMBuildOr(b, a[0], a[1], "");
  case TR_SELECT: return LLVMBuildSelect(b, a[0], a[1], a[2], "");
  case TR_CVT:
    if (t == TY_BF16 && (at[0] == TY_F32 || at[0] == TY_F64))
      return emit_round_bf16(e, i, a[0], at[0], lp);
    if (at[0] == TY_BF16 && (t == TY_F32 || t == TY_F64) && e->rnd[x->args[0]]) {
      LLVMValueRef f = LLVMBuildBitCast(b, e->rnd[x->args[0]], vtype(e, TY_F32), "");
      return t == TY_F64 ? LLVMBuildFPExt(b, f, vtype(e, TY_F64), "") : f;
    }
    return convert(e, a[0], at[0], t);
  case TR_CVTSR: {
    LLVMValueRef bits = sr_bits(e, e->srkey[i]);
    return t == TY_BF16 ? f32_to_bf16_sr(e, a[0], bits) : f32_to_f16_sr(e, a[0], bits);
  }
  case TR_TAILPOS: return tailpos(e, e->tail[i], lp);
  case TR_LOOKUP: {
    const CodeBook *cb = codebook((Book)x->book);
    return table_lookup(e, cb->q, cb->n, a[0]);
  }
  case TR_SEARCH: return code_search(e, codebook((Book)x->book), a[0]);
  default: unreachable();
  }
}

/* ---- memory ---------------------------------------------------------------------------- */

/* A buffer element's type in memory: a code's byte (two u4 a byte), else its lane's. */
LLVMTypeRef mem_type(E *e, Type t) { return type_is_code(t) ? e->ti8 : scalar_type(e, t); }

static LLVMValueRef elem_addr(E *e, int buf) {
  Type t = (Type)e->g->bufs[buf].type;
  LLVMValueRef j = e->j;
  if (t == TY_U4) /* j is a multiple of W: whole bytes */
    j = LLVMBuildUDiv(e->b, j, LLVMConstInt(e->ti64, 2, 0), "");
  return LLVMBuildGEP2(e->b, mem_type(e, t), e->bufptr[buf], &j, 1, "");
}

/* The memory may be the caller's (include/optc.h), so in the tail, past
 * the chunk's last element, nothing is read or written: masked loads (the
 * lanes past it read as zero) and masked stores. */
/* A software prefetch of buf, PREFETCH elements ahead of the vector at
 * e->j, into every cache level. The hardware's prefetchers keep up with a
 * loop whose every element is a few cycles; they fall behind this one,
 * whose chains of divides and roundings take ~100 cycles per vector, so
 * few of its loads are in flight at once; 512 elements ahead was the best
 * distance measured. Past the chunk's end it reads the tensor's next
 * chunk, which this thread runs next; a prefetch never faults. Not on
 * AMD's cores, whose prefetchers keep up: the step measured faster there
 * without it (bench/results.md, "Measurements behind the emitters'
 * choices"). */
static void prefetch(E *e, int buf) {
  if (e->mask || e->amd || type_is_code((Type)e->g->bufs[buf].type))
    return;
  LLVMTypeRef et = scalar_type(e, (Type)e->g->bufs[buf].type);
  LLVMValueRef at = LLVMBuildAdd(e->b, e->j, LLVMConstInt(e->ti64, PREFETCH, 0), "");
  LLVMTypeRef over[1] = {e->tptr};
  LLVMValueRef args[4] = {LLVMBuildGEP2(e->b, et, e->bufptr[buf], &at, 1, ""), LLVMConstInt(e->ti32, 0, 0),
                          LLVMConstInt(e->ti32, 3, 0), LLVMConstInt(e->ti32, 1, 0)};
  call_intrinsic(e, "llvm.prefetch", over, 1, args, 4);
}

LLVMValueRef load_vec(E *e, int buf) {
  Type t = (Type)e->g->bufs[buf].type;
  prefetch(e, buf);
  if (t == TY_U4)
    return u4_load(e, elem_addr(e, buf), e->mask);
  if (t == TY_U8) { /* bytes, widened to the lanes' i32 */
    LLVMTypeRef vb = vec(e->ti8, W);
    LLVMValueRef v;
    if (e->mask) {
      LLVMTypeRef over[2] = {vb, e->tptr};
      LLVMValueRef args[4] = {elem_addr(e, buf), LLVMConstInt(e->ti32, 1, 0), e->mask, LLVMConstNull(vb)};
      v = call_intrinsic(e, "llvm.masked.load", over, 2, args, 4);
    } else {
      v = LLVMBuildLoad2(e->b, vb, elem_addr(e, buf), "");
      LLVMSetAlignment(v, 1);
    }
    return LLVMBuildZExt(e->b, v, vec(e->ti32, W), "");
  }
  LLVMTypeRef vt = vtype(e, t);
  unsigned align = (unsigned)type_size(t);
  if (e->mask) {
    LLVMTypeRef over[2] = {vt, e->tptr};
    LLVMValueRef args[4] = {elem_addr(e, buf), LLVMConstInt(e->ti32, align, 0), e->mask, LLVMConstNull(vt)};
    return call_intrinsic(e, "llvm.masked.load", over, 2, args, 4);
  }
  LLVMValueRef v = LLVMBuildLoad2(e->b, vt, elem_addr(e, buf), "");
  LLVMSetAlignment(v, align);
  return v;
}

void store_vec(E *e, int buf, LLVMValueRef v) {
  Type t = (Type)e->g->bufs[buf].type;
  LLVMValueRef p = elem_addr(e, buf);
  if (t == TY_U4) {
    u4_store(e, p, v, e->mask);
    return;
  }
  if (t == TY_U8) {
    v = LLVMBuildTrunc(e->b, v, vec(e->ti8, W), "");
    if (e->mask) {
      LLVMTypeRef over[2] = {vec(e->ti8, W), e->tptr};
      LLVMValueRef args[4] = {v, p, LLVMConstInt(e->ti32, 1, 0), e->mask};
      call_intrinsic(e, "llvm.masked.store", over, 2, args, 4);
      return;
    }
    LLVMValueRef s = LLVMBuildStore(e->b, v, p);
    LLVMSetAlignment(s, 1);
    return;
  }
  unsigned align = (unsigned)type_size(t);
  if (e->mask) {
    LLVMTypeRef over[2] = {vtype(e, t), e->tptr};
    LLVMValueRef args[4] = {v, p, LLVMConstInt(e->ti32, align, 0), e->mask};
    call_intrinsic(e, "llvm.masked.store", over, 2, args, 4);
    return;
  }
  LLVMValueRef s = LLVMBuildStore(e->b, v, p);
  LLVMSetAlignment(s, align);
}

static bool red_is_max(RedKind k) { return k == RED_MAX || k == RED_ABSMAX; }

/* Adds this vector's terms to a reduction's 8 lanes: elements j..j+7 then
 * j+8..j+15, in order, each into lane (element % 8). */
static LLVMValueRef accumulate(E *e, Ref r, LLVMValueRef acc) {
  const Ins *x = &e->g->ins[r];
  LLVMBuilderRef b = e->b;
  RedKind k = (RedKind)x->red;
  Type at = (Type)e->g->ins[x->args[0]].type;
  LLVMValueRef v = operand(e, x->args[0]);
  if (at == TY_BF16 || at == TY_F16)
    v = to_f32(e, v, at);
  if (at != TY_F64)
    v = LLVMBuildFPExt(b, v, vtype(e, TY_F64), "");
  if (k == RED_SUMSQ)
    v = LLVMBuildFMul(b, v, v, "");
  if (k == RED_ABSMAX)
    v = unary_intrinsic(e, "llvm.fabs", v);
  if (e->mask)
    v = LLVMBuildSelect(b, e->mask, v, fconst(vtype(e, TY_F64), red_is_max(k) ? -1.0 / 0.0 : 0.0), "");
  for (int half = 0; half < W / OPTC_REDUCE_LANES; half++) {
    LLVMValueRef idx[OPTC_REDUCE_LANES];
    for (int l = 0; l < OPTC_REDUCE_LANES; l++)
      idx[l] = LLVMConstInt(e->ti32, (unsigned)(half * OPTC_REDUCE_LANES + l), 0);
    LLVMValueRef part = LLVMBuildShuffleVector(b, v, LLVMGetUndef(LLVMTypeOf(v)), LLVMConstVector(idx, OPTC_REDUCE_LANES), "");
    acc = red_is_max(k) ? max_nan(e, acc, part, false) : LLVMBuildFAdd(b, acc, part, "");
  }
  return acc;
}

/* ---- NaN payloads, before a body is emitted (FL_*, above E) --------------------------- */

static void analyze(E *e) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  uint8_t *fl = e->fl;
  memset(fl, 0, (size_t)g->nins);
  /* backward: which values' payloads a store or a reduction sees */
  for (Ref i = ph->hi - 1; i >= ph->lo; i--) {
    const Ins *x = &g->ins[i];
    if (!in_body(x))
      continue;
    Type t = (Type)x->type;
    int first = 0, last = -1; /* the operands whose payload this use passes on or sees */
    switch (op_info[x->op].type_rule) {
    case TR_STORE:
      if (!is16((Type)g->bufs[x->buf].type))
        last = 0;
      break;
    case TR_REDUCE: last = 0; break;
    case TR_ARITH:
      if ((fl[i] & FL_SENS) && !is16(t) && x->op != OP_SIGN)
        last = op_info[x->op].nargs - 1;
      break;
    case TR_SELECT:
      if (fl[i] & FL_SENS)
        first = 1, last = 2;
      break;
    case TR_CVT: {
      Type from = (Type)g->ins[x->args[0]].type;
      /* to bf16: a hold whose result is seen rounds exactly, so its operand
       * is not; f32/f64 and out of bf16: the payload goes through */
      if ((fl[i] & FL_SENS) && type_is_float(from) && (t == TY_F32 || t == TY_F64) && from != TY_F16)
        last = 0;
      break;
    }
    default: break;
    }
    for (int k = first; k <= last; k++)
      fl[x->args[k]] |= FL_SENS;
  }
  /* forward: clean NaNs, fast holds, canonical bf16 */
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (!in_body(x))
      continue;
    if (!(fl[i] & FL_SENS))
      fl[i] |= FL_CLEAN;
    Type t = (Type)x->type;
    bool p = false;
#define P_OF(r) (in_body(&g->ins[r]) ? (fl[r] & FL_P) != 0 : (fl[i] & FL_CLEAN) != 0)
    switch (op_info[x->op].type_rule) {
    case TR_LOAD: p = t == TY_BF16; break;
    case TR_LEAF: p = true; break;
    case TR_ARITH:
      if (is16(t)) {
        p = true; /* computed in f32 and rounded by numerics.h */
      } else if (x->op == OP_SIGN) {
        p = true;
      } else if (!(op_info[x->op].flags & F_TRANSC)) {
        p = true;
        for (int k = 0; k < op_info[x->op].nargs; k++)
          p &= P_OF(x->args[k]);
      }
      break;
    case TR_SELECT: p = P_OF(x->args[1]) && P_OF(x->args[2]); break;
    case TR_CVT: {
      Ref a = x->args[0];
      Type from = (Type)g->ins[a].type;
      if (from == TY_BF16 || type_is_int(from) || is16(t))
        p = true;
      else if (from == TY_F16)
        p = in_body(&g->ins[a]) ? (fl[a] & FL_CANON) != 0 : true;
      else
        p = P_OF(a);
      if (t == TY_BF16 && (from == TY_F32 || from == TY_F64) && !(fl[i] & FL_SENS) && P_OF(a))
        fl[i] |= FL_FAST;
      break;
    }
    case TR_CVTSR: p = true; break;
    default: break;
    }
#undef P_OF
    if (p)
      fl[i] |= FL_P;
    bool canon = is16(t) && x->op != OP_LOAD;
    if (x->op == OP_SELECT)
      for (int k = 1; k <= 2; k++)
        canon &= !in_body(&g->ins[x->args[k]]) || (fl[x->args[k]] & FL_CANON);
    if (canon)
      fl[i] |= FL_CANON;
  }
}

/* Whether the phase may widen bf16 in lane_elem's order (e->perm): no
 * AVX-512, and nothing that sees a lane's place or moves a value between
 * an f32 lane and a 16-bit one but the loads' widening and the stores'
 * packing. So: every buffer bf16 (an f32 load would be in order), no
 * reduction (its sums are in element order), no stochastic rounding (a
 * function of the element's index), and tailpos only where it is folded
 * to -1 (Loop.plain: body_begin sets perm per loop), no f16 (its conversions
 * zero-extend in order), no select of 16-bit values (its condition is in
 * f32 lanes), and no table (tab_gather indexes in order). */
static bool perm_find(const E *e) {
  const Graph *g = e->g;
  if (e->avx512 || e->tab_o != NOREF || e->ph->nreds > 0)
    return false;
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (!in_body(x))
      continue;
    if ((x->op == OP_LOAD || x->op == OP_STORE) && g->bufs[x->buf].type != TY_BF16)
      return false;
    if (x->op == OP_CVT_SR || x->type == TY_F16 ||
        (x->op == OP_SELECT && is16((Type)x->type)))
      return false;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      if (g->ins[x->args[k]].type == TY_F16)
        return false;
  }
  return true;
}

/* Chunk (plan.h) as LLVM sees it: {tensor, block, start, len, flat, numel}. */
LLVMTypeRef chunk_type(E *e) {
  return LLVMStructTypeInContext(e->c, (LLVMTypeRef[]){e->ti32, e->ti32, e->ti64, e->ti64, e->ti64, e->ti64}, 6, 0);
}

/* Splats of the step values and their canonical-NaN copies, in the
 * current block (per chunk, and in a table's build). */
void splat_step_values(E *e) {
  for (int r = 0; r < e->g->nins; r++) {
    if (e->scalar[r])
      e->splat[r] = broadcast(e, e->scalar[r]);
    if (e->cscalar[r])
      e->csplat[r] = broadcast(e, e->cscalar[r]);
  }
}

/* The loop body: W elements from j (masked in the tail). Loads come first,
 * so a load never sees a store of this step. Returns the new accumulators. */
/* The instructions of one stage (0, 1, or -1 for all) for the vector at
 * e->j. Loads are stage 0 and come first, so a load never sees a store of
 * this step. */
static void emit_stage(E *e, LLVMValueRef *acc, int stage, const Loop *lp) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  if (stage <= 0)
    for (Ref i = ph->lo; i < ph->hi; i++)
      if (g->ins[i].op == OP_LOAD) {
        e->val[i] = lp->reuse_loads ? e->loads[i] : load_vec(e, g->ins[i].buf);
        e->loads[i] = e->val[i];
      }
  int nred = 0;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    bool mine = stage < 0 || e->stage[i] == stage;
    if (x->op == OP_REDUCE) {
      if (mine)
        acc[nred] = accumulate(e, i, acc[nred]);
      nred++;
    } else if (!mine) {
      continue;
    } else if (x->op == OP_STORE) {
      store_vec(e, x->buf, operand(e, x->args[0]));
    } else if (lp->tab && e->intab[i] == 1) {
      continue;
    } else if (lp->tab && i == e->tab_o) {
      tab_gather(e);
    } else if (x->op != OP_LOAD && x->scope != SCOPE_STEP) {
      e->val[i] = emit_ins(e, i, lp);
    }
  }
}

void forget(E *e) {
  memset(e->val, 0, sizeof(LLVMValueRef) * (size_t)e->g->nins);
  memset(e->rnd, 0, sizeof(LLVMValueRef) * (size_t)e->g->nins);
}

/* Before a body of loop lp: the lane order its bf16 widen in (perm_find;
 * not where a tailpos reads the lanes in element order, unless it is -1
 * throughout). */
static void body_begin(E *e, const Loop *lp) { e->perm = e->perm_ok && (lp->plain || !e->has_tailpos); }

/* The whole body for the vector at e->j (masked where e->mask is set). */
static void emit_body(E *e, LLVMValueRef *acc, const Loop *lp) {
  forget(e);
  emit_stage(e, acc, -1, lp);
}

/* Splits the body in stages at each divide or square root (a long latency,
 * and the divider's throughput): a value's stage is the number of them on
 * its longest path from the loads, at most MAX_STAGES - 1. The pipelined
 * loop runs stage s of vector k - s beside the others, so the core overlaps
 * the vectors' chains without holding a whole vector's worth of waiting
 * instructions in its scheduler. Returns the number of stages (below 2:
 * not pipelined). */
enum { MAX_STAGES = 3 }; /* vec_loop has the measurements */

static int stages(E *e, const Loop *lp) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  int n[MAX_STAGES] = {0};
  /* AVX2's 16 vector registers hold two stages' values, not three: the
   * third spills */
  int most = e->avx512 ? MAX_STAGES : 2;
  memset(e->stage, 0, (size_t)g->nins);
  e->ncross = 0;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (!in_body(x))
      continue;
    int d = 0;
    if (lp->tab && e->intab[i] == 1)
      continue;
    if (lp->tab && i == e->tab_o) { /* a gather: a load's latency, from L2 */
      d = MIN(e->stage[e->tab_u] + 1, most - 1);
    } else {
      for (int k = 0; k < op_info[x->op].nargs; k++)
        if (in_body(&g->ins[x->args[k]]))
          d = MAX(d, e->stage[x->args[k]]);
      if (x->op == OP_DIV || x->op == OP_SQRT || x->op == OP_RSQRT || x->op == OP_SQRT_MKL || x->op == OP_SQRT_MKL_EX)
        d = MIN(d + 1, most - 1);
    }
    e->stage[i] = (uint8_t)d;
    if (x->op != OP_LOAD)
      n[d]++;
  }
  int ns = 0;
  while (ns < most && n[ns])
    ns++;
  if (ns < 2)
    return 0;
  /* what a stage reads of an earlier one: operands, and the bf16 a
   * rounding of a widening looks through (emit_round_bf16) */
  uint8_t *seen = calloc((size_t)g->nins + 1, 1);
  ASSERT(seen);
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (!in_body(x) || !e->stage[i] || (lp->tab && e->intab[i] == 1))
      continue;
    bool gather = lp->tab && i == e->tab_o;
    for (int k = 0; k < (gather ? 1 : op_info[x->op].nargs); k++) {
      Ref r = gather ? e->tab_u : x->args[k];
      Ref rs[2] = {r, NOREF};
      if (!gather && x->op == OP_CVT && g->ins[r].op == OP_CVT)
        rs[1] = g->ins[r].args[0];
      for (int q = 0; q < 2; q++)
        if (rs[q] != NOREF && in_body(&g->ins[rs[q]]) && e->stage[rs[q]] < e->stage[i] && !seen[rs[q]]) {
          seen[rs[q]] = 1;
          e->cross[e->ncross++] = rs[q];
        }
    }
  }
  free(seen);
  return ns;
}

/* One iteration k of the pipelined loop: stages hi..lo, stage s on vector
 * k - s (masked by mask[s] where that vector may be past the chunk's
 * full vectors). h holds the values stages hand on: h[d * nx + c] (and
 * hr, their rounded bits) is cross value c of the iteration d back; this
 * iteration's go to d = 0. */
void pipe_iter(E *e, LLVMValueRef *acc, LLVMValueRef k, int lo, int hi, LLVMValueRef *mask, LLVMValueRef *h,
               LLVMValueRef *hr, const Loop *lp) {
  int nx = e->ncross;
  for (int s = hi; s >= lo; s--) {
    forget(e);
    for (int c = 0; c < nx; c++) {
      int a = e->stage[e->cross[c]];
      if (a < s)
        e->val[e->cross[c]] = h[(s - a) * nx + c], e->rnd[e->cross[c]] = hr[(s - a) * nx + c];
    }
    e->j = LLVMBuildMul(e->b, LLVMBuildSub(e->b, k, LLVMConstInt(e->ti64, (unsigned)s, 0), ""),
                        LLVMConstInt(e->ti64, W, 0), "");
    e->mask = mask ? mask[s] : NULL;
    emit_stage(e, acc, s, lp);
    for (int c = 0; c < nx; c++)
      if (e->stage[e->cross[c]] == s)
        h[c] = e->val[e->cross[c]], hr[c] = e->rnd[e->cross[c]];
  }
  e->mask = NULL;
}

/* After an iteration: what was d back is d + 1 back. */
static void pipe_shift(E *e, int ns, LLVMValueRef *h, LLVMValueRef *hr) {
  int nx = e->ncross;
  for (int d = ns - 1; d >= 1; d--) {
    memcpy(h + d * nx, h + (d - 1) * nx, sizeof(LLVMValueRef) * (size_t)nx);
    memcpy(hr + d * nx, hr + (d - 1) * nx, sizeof(LLVMValueRef) * (size_t)nx);
  }
}

/* mask[s] for iteration k: whether vector k - s is one of the chunk's nvec
 * full vectors (NULL where it is vector 0, which is). */
static void pipe_masks(E *e, LLVMValueRef k, LLVMValueRef nvec, int lo, int hi, LLVMValueRef *mask) {
  for (int s = lo; s <= hi; s++) {
    LLVMValueRef v = LLVMBuildSub(e->b, k, LLVMConstInt(e->ti64, (unsigned)s, 0), "");
    mask[s] = LLVMIsConstant(v) && LLVMConstIntGetSExtValue(v) == 0
                  ? NULL
                  : broadcast(e, LLVMBuildICmp(e->b, LLVMIntSLT, v, nvec, ""));
  }
}

/* A loop over the chunk's full vectors, from the current block; returns
 * the first element it left (a multiple of W), with the accumulators in
 * acc_out, valid in the block it ends in (left unterminated). Pipelined
 * (e->nstages >= 2): iteration k runs stage s of vector k - s for every s,
 * the values between stages carried in phis as many iterations as their
 * stages are apart. At most three stages (the bf16 for-loop AdamW's sqrt,
 * and divide, in stages of their own): three ran faster than two, and a
 * fourth gained little for a compile a quarter longer (bench/results.md,
 * "Measurements behind the emitters' choices"). */
static LLVMValueRef vec_loop(E *e, LLVMValueRef fn, LLVMValueRef len, bool piped, const Loop *lp,
                             LLVMValueRef *acc_in, LLVMValueRef *acc_out) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  int nred = e->ph->nreds;
  LLVMTypeRef vacc = vec(e->tf64, OPTC_REDUCE_LANES);
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), wv = LLVMConstInt(e->ti64, W, 0), one = LLVMConstInt(e->ti64, 1, 0);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
  LLVMValueRef acc[16], accphi[16];
  e->mask = NULL;
  body_begin(e, lp);
  if (!piped) {
    LLVMBasicBlockRef cond = LLVMAppendBasicBlockInContext(c, fn, "vec");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c, fn, "vec.body");
    LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(c, fn, "vec.exit");
    LLVMBuildBr(b, cond);
    LLVMPositionBuilderAtEnd(b, cond);
    LLVMValueRef j = LLVMBuildPhi(b, e->ti64, "j");
    for (int r = 0; r < nred; r++)
      accphi[r] = LLVMBuildPhi(b, vacc, "acc");
    LLVMValueRef jnext = LLVMBuildAdd(b, j, wv, "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, jnext, len, ""), body, exit);
    LLVMPositionBuilderAtEnd(b, body);
    e->j = j;
    memcpy(acc, accphi, sizeof(LLVMValueRef) * (size_t)nred);
    emit_body(e, acc, lp);
    LLVMBasicBlockRef body_end = LLVMGetInsertBlock(b);
    LLVMBuildBr(b, cond);
    LLVMAddIncoming(j, (LLVMValueRef[]){zero, jnext}, (LLVMBasicBlockRef[]){pre, body_end}, 2);
    for (int r = 0; r < nred; r++)
      LLVMAddIncoming(accphi[r], (LLVMValueRef[]){acc_in[r], acc[r]}, (LLVMBasicBlockRef[]){pre, body_end}, 2);
    LLVMPositionBuilderAtEnd(b, exit);
    memcpy(acc_out, accphi, sizeof(LLVMValueRef) * (size_t)nred);
    return j;
  }
  /* Pipelined over ns stages: ns - 1 filling iterations (k = 0..ns-2,
   * stages k..0), the loop (k = ns-1 while k < nvec: every stage), then
   * ns - 1 draining iterations (stages ns-1..d+1). A filling or draining
   * stage whose vector is past the chunk's full vectors runs masked off:
   * nothing loaded or stored, its reductions' terms the identity. */
  int ns = e->nstages, nx = e->ncross;
  LLVMValueRef *h = calloc((size_t)(2 * ns * nx + 1), sizeof(LLVMValueRef)), *hr = h + ns * nx;
  LLVMValueRef *ph = calloc((size_t)(2 * ns * nx + 1), sizeof(LLVMValueRef)), *phr = ph + ns * nx;
  ASSERT(h && ph);
  LLVMValueRef mask[MAX_STAGES];
  LLVMBasicBlockRef fill = LLVMAppendBasicBlockInContext(c, fn, "pipe.fill");
  LLVMBasicBlockRef cond = LLVMAppendBasicBlockInContext(c, fn, "pipe");
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c, fn, "pipe.body");
  LLVMBasicBlockRef drain = LLVMAppendBasicBlockInContext(c, fn, "pipe.drain");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(c, fn, "pipe.exit");
  LLVMValueRef nvec = LLVMBuildSDiv(b, len, wv, "nvec");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSGT, nvec, zero, ""), fill, exit);
  LLVMPositionBuilderAtEnd(b, fill);
  memcpy(acc, acc_in, sizeof(LLVMValueRef) * (size_t)nred);
  for (int k = 0; k < ns - 1; k++) {
    LLVMValueRef kv = LLVMConstInt(e->ti64, (unsigned)k, 0);
    pipe_masks(e, kv, nvec, 0, k, mask);
    pipe_iter(e, acc, kv, 0, k, mask, h, hr, lp);
    pipe_shift(e, ns, h, hr);
  }
  LLVMBasicBlockRef fill_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, cond);
  /* the loop: k is the vector whose stage 0 is next */
  LLVMPositionBuilderAtEnd(b, cond);
  LLVMValueRef kphi = LLVMBuildPhi(b, e->ti64, "k");
  for (int q = nx; q < ns * nx; q++) { /* d >= 1 */
    for (int w = 0; w < 2; w++) {
      LLVMValueRef *src = w ? hr : h, *dst = w ? phr : ph;
      if (!src[q])
        continue;
      dst[q] = LLVMBuildPhi(b, LLVMTypeOf(src[q]), "x");
      LLVMAddIncoming(dst[q], &src[q], &fill_end, 1);
    }
  }
  for (int r = 0; r < nred; r++) {
    accphi[r] = LLVMBuildPhi(b, vacc, "acc");
    LLVMAddIncoming(accphi[r], &acc[r], &fill_end, 1);
  }
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, kphi, nvec, ""), body, drain);
  LLVMPositionBuilderAtEnd(b, body);
  memcpy(h, ph, sizeof(LLVMValueRef) * (size_t)(2 * ns * nx));
  memcpy(acc, accphi, sizeof(LLVMValueRef) * (size_t)nred);
  if (e->bf16cvt && nred == 0 && cvt_pays(e, lp))
    pipe_iter_cvt(e, fn, kphi, h, hr, lp);
  else
    pipe_iter(e, acc, kphi, 0, ns - 1, NULL, h, hr, lp);
  pipe_shift(e, ns, h, hr);
  LLVMBasicBlockRef body_end = LLVMGetInsertBlock(b);
  LLVMValueRef knext = LLVMBuildAdd(b, kphi, one, "");
  LLVMValueRef k0 = LLVMConstInt(e->ti64, (unsigned)(ns - 1), 0);
  LLVMAddIncoming(kphi, (LLVMValueRef[]){k0, knext}, (LLVMBasicBlockRef[]){fill_end, body_end}, 2);
  for (int q = nx; q < 2 * ns * nx; q++) {
    if (q >= ns * nx && q < ns * nx + nx)
      continue; /* hr's d = 0 */
    if (ph[q]) {
      ASSERT(h[q]);
      LLVMAddIncoming(ph[q], &h[q], &body_end, 1);
    }
  }
  for (int r = 0; r < nred; r++)
    LLVMAddIncoming(accphi[r], &acc[r], &body_end, 1);
  LLVMBuildBr(b, cond);
  /* draining: the last vectors' later stages */
  LLVMPositionBuilderAtEnd(b, drain);
  memcpy(h, ph, sizeof(LLVMValueRef) * (size_t)(2 * ns * nx));
  memcpy(acc, accphi, sizeof(LLVMValueRef) * (size_t)nred);
  for (int d = 0; d < ns - 1; d++) {
    LLVMValueRef kv = LLVMBuildAdd(b, kphi, LLVMConstInt(e->ti64, (unsigned)d, 0), "");
    pipe_masks(e, kv, nvec, d + 1, ns - 1, mask);
    pipe_iter(e, acc, kv, d + 1, ns - 1, mask, h, hr, lp);
    pipe_shift(e, ns, h, hr);
  }
  LLVMValueRef jend = LLVMBuildMul(b, nvec, wv, "");
  LLVMBasicBlockRef drain_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, exit);
  LLVMPositionBuilderAtEnd(b, exit);
  LLVMValueRef j = LLVMBuildPhi(b, e->ti64, "j");
  LLVMAddIncoming(j, (LLVMValueRef[]){zero, jend}, (LLVMBasicBlockRef[]){pre, drain_end}, 2);
  for (int r = 0; r < nred; r++) {
    acc_out[r] = LLVMBuildPhi(b, vacc, "acc");
    LLVMAddIncoming(acc_out[r], (LLVMValueRef[]){acc_in[r], acc[r]}, (LLVMBasicBlockRef[]){pre, drain_end}, 2);
  }
  free(h);
  free(ph);
  return j;
}

static LLVMValueRef combine_lanes(E *e, LLVMValueRef acc, RedKind k) {
  LLVMValueRef l[OPTC_REDUCE_LANES];
  for (int i = 0; i < OPTC_REDUCE_LANES; i++)
    l[i] = LLVMBuildExtractElement(e->b, acc, LLVMConstInt(e->ti32, (unsigned)i, 0), "");
  LLVMValueRef (*op)(LLVMBuilderRef, LLVMValueRef, LLVMValueRef, const char *) = LLVMBuildFAdd;
  if (red_is_max(k)) {
    /* max_nan on scalars: build it through the vector helper's logic */
    LLVMValueRef s[8];
    for (int i = 0; i < 4; i++)
      s[i] = max_nan(e, l[2 * i], l[2 * i + 1], false);
    s[4] = max_nan(e, s[0], s[1], false);
    s[5] = max_nan(e, s[2], s[3], false);
    return max_nan(e, s[4], s[5], false);
  }
  LLVMValueRef a = op(e->b, op(e->b, l[0], l[1], ""), op(e->b, l[2], l[3], ""), "");
  LLVMValueRef c = op(e->b, op(e->b, l[4], l[5], ""), op(e->b, l[6], l[7], ""), "");
  return op(e->b, a, c, "");
}

/* Loads a step value from step[r] (a Scalar: 8 bytes, the value at offset 0). */
static LLVMValueRef load_scalar(E *e, LLVMValueRef base, LLVMValueRef index, Type t) {
  LLVMValueRef p = LLVMBuildGEP2(e->b, e->ti64, base, &index, 1, "");
  if (t == TY_BOOL || t == TY_I32) {
    LLVMValueRef v = LLVMBuildLoad2(e->b, e->ti64, p, "");
    return t == TY_BOOL ? LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstInt(e->ti64, 0, 0), "")
                        : LLVMBuildTrunc(e->b, v, e->ti32, "");
  }
  return LLVMBuildLoad2(e->b, scalar_type(e, t), p, "");
}

/* vpermw's word indices (pack: the high word of each lane, to the low half;
 * widen: word i to the high half of lane i) and its zeroing mask (the odd
 * words), as globals of the module: loaded once per call. */
static void load_perms(E *e) {
  LLVMTypeRef vw = vec(e->ti16, 2 * W);
  LLVMValueRef pack[2 * W], widen[2 * W];
  for (int i = 0; i < 2 * W; i++) {
    pack[i] = LLVMConstInt(e->ti16, (unsigned)(2 * (i % W) + 1), 0);
    widen[i] = LLVMConstInt(e->ti16, (unsigned)(i / 2), 0);
  }
  struct { const char *name; LLVMTypeRef t; LLVMValueRef init; LLVMValueRef *out; } gl[] = {
      {"optc_bf16_pack", vw, LLVMConstVector(pack, 2 * W), &e->perm_pack},
      {"optc_bf16_widen", vw, LLVMConstVector(widen, 2 * W), &e->perm_widen},
      {"optc_bf16_odd", e->ti32, LLVMConstInt(e->ti32, 0xaaaaaaaau, 0), &e->odd_words},
  };
  for (size_t k = 0; k < ARRAY_LEN(gl); k++) {
    LLVMValueRef v = LLVMGetNamedGlobal(e->m, gl[k].name);
    if (!v) {
      v = LLVMAddGlobal(e->m, gl[k].t, gl[k].name);
      LLVMSetInitializer(v, gl[k].init);
      LLVMSetAlignment(v, 64);
    }
    *gl[k].out = LLVMBuildLoad2(e->b, gl[k].t, v, gl[k].name);
  }
  e->odd_words = LLVMBuildBitCast(e->b, e->odd_words, vec(e->ti1, 2 * W), "");
}

/* A step value with any NaN made the canonical quiet one of its sign. */
static LLVMValueRef canonical_nan(E *e, LLVMValueRef s) {
  LLVMBuilderRef b = e->b;
  bool d = LLVMTypeOf(s) == e->tf64;
  LLVMTypeRef it = d ? e->ti64 : e->ti32;
  LLVMValueRef u = LLVMBuildBitCast(b, s, it, "");
  LLVMValueRef sign = LLVMBuildAnd(b, u, LLVMConstInt(it, d ? 0x8000000000000000ull : 0x80000000u, 0), "");
  LLVMValueRef q = LLVMBuildOr(b, sign, LLVMConstInt(it, d ? 0x7ff8000000000000ull : 0x7fc00000u, 0), "");
  return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, s, s, ""), LLVMBuildBitCast(b, q, LLVMTypeOf(s), ""), s, "");
}

/* Whether the chunk meets a remainder region of any tailpos in the phase
 * (an i1), or NULL when the phase has none. */
static LLVMValueRef chunk_hit(E *e, LLVMValueRef len) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef lo = e->start, hi = LLVMBuildAdd(b, lo, len, "");
  LLVMValueRef hit = NULL;
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    if (e->g->ins[i].op != OP_TAILPOS)
      continue;
    for (int k = 0; k < 2; k++) {
      LLVMValueRef t = LLVMBuildExtractElement(b, e->tail[i], LLVMConstInt(e->ti32, (unsigned)(2 * k), 0), "");
      LLVMValueRef end = LLVMBuildExtractElement(b, e->tail[i], LLVMConstInt(e->ti32, (unsigned)(2 * k + 1), 0), "");
      LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, lo, end, ""), LLVMBuildICmp(b, LLVMIntSGT, hi, t, ""), "");
      hit = hit ? LLVMBuildOr(b, hit, in, "") : in;
    }
  }
  return hit;
}

static void emit_phase(E *e, int k) {
  const Graph *g = e->g;
  LLVMContextRef c = e->c;
  LLVMBuilderRef b = e->b;
  const PlanPhase *ph = e->ph;
  LLVMTypeRef params[6] = {e->tptr, e->ti64, e->tptr, e->tptr, e->tptr, e->tptr};
  LLVMTypeRef fty = LLVMFunctionType(e->tvoid, params, 6, 0);
  char name[32];
  snprintf(name, sizeof name, "optc_phase%d", k);
  LLVMValueRef fn = LLVMAddFunction(e->m, name, fty);
  /* probe-stack: a table's 256 KiB frame (tab_build) touches each page in
   * turn, so a small thread stack faults on its guard page, not past it */
  const char *attrs[][2] = {{"min-legal-vector-width", "512"}, {"prefer-vector-width", "512"},
                            {"probe-stack", "inline-asm"}};
  for (size_t i = 0; i < ARRAY_LEN(attrs); i++)
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(c, attrs[i][0], (unsigned)strlen(attrs[i][0]), attrs[i][1],
                                                      (unsigned)strlen(attrs[i][1])));
  unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
  for (unsigned p = 0; p < 6; p++)
    if (p != 1)
      LLVMAddAttributeAtIndex(fn, p + 1, LLVMCreateEnumAttribute(c, noalias, 0));
  LLVMValueRef chunks = LLVMGetParam(fn, 0), nchunks = LLVMGetParam(fn, 1), bufs = LLVMGetParam(fn, 2);
  LLVMValueRef step = LLVMGetParam(fn, 3), tvals = LLVMGetParam(fn, 4), partials = LLVMGetParam(fn, 5);

  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c, fn, "entry");
  LLVMBasicBlockRef chunk_cond = LLVMAppendBasicBlockInContext(c, fn, "chunk");
  LLVMBasicBlockRef chunk_body = LLVMAppendBasicBlockInContext(c, fn, "chunk.body");
  LLVMBasicBlockRef vec_cond = LLVMAppendBasicBlockInContext(c, fn, "vec");
  LLVMBasicBlockRef tail_check = LLVMAppendBasicBlockInContext(c, fn, "tail.check");
  LLVMBasicBlockRef tail = LLVMAppendBasicBlockInContext(c, fn, "tail");
  LLVMBasicBlockRef chunk_end = LLVMAppendBasicBlockInContext(c, fn, "chunk.end");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(c, fn, "exit");

  /* entry: the step values this phase reads, once */
  LLVMPositionBuilderAtEnd(b, entry);
  memset(e->scalar, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    for (int a = 0; a < op_info[x->op].nargs; a++) {
      Ref r = x->args[a];
      const Ins *y = &g->ins[r];
      if (y->scope == SCOPE_STEP && !e->scalar[r])
        e->scalar[r] = load_scalar(e, step, LLVMConstInt(e->ti64, (unsigned long long)r, 0), (Type)y->type);
    }
  }
  analyze(e);
  bool blocks = block_phase(e);
  LLVMValueRef scratch[256];
  if (blocks) {
    ASSERT(ph->nreds == 0); /* block_phases_supported */
    e->tab_o = e->tab_u = NOREF;
    block_scratch(e, scratch);
  } else {
    tab_find(e);
  }
  e->perm_ok = !blocks && perm_find(e);
  e->has_tailpos = false;
  for (Ref i = ph->lo; i < ph->hi; i++)
    e->has_tailpos |= g->ins[i].op == OP_TAILPOS && in_body(&g->ins[i]);
  const Loop general = {0}; /* any chunk, no check made */
  body_begin(e, &general);
  if (e->avx512bw)
    load_perms(e);
  memset(e->cscalar, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  for (int r = 0; r < g->nins; r++)
    if (e->scalar[r] && (g->ins[r].type == TY_F32 || g->ins[r].type == TY_F64))
      e->cscalar[r] = canonical_nan(e, e->scalar[r]);
  memset(e->recip, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  e->recip_ok = NULL;
  for (Ref i = ph->lo; i < ph->hi && e->tab_o == NOREF && !blocks; i++) /* a table subsumes it */
    if (recip_div(g, i)) {
      LLVMValueRef cv = e->scalar[g->ins[i].args[1]];
      e->recip[i] = LLVMBuildFDiv(b, LLVMConstReal(e->tf32, 1.0), cv, "recip");
      LLVMValueRef ok = recip_check(e, cv, e->recip[i]);
      e->recip_ok = e->recip_ok ? LLVMBuildAnd(b, e->recip_ok, ok, "") : ok;
    }
  e->tab_ok = NULL;
  if (e->tab_o != NOREF)
    tab_build(e, fn, chunks, nchunks);
  e->tie_ok = NULL;
  if (!blocks && tie_find(e))
    tie_check(e, fn, chunks, nchunks);
  /* the loop that multiplies and rounds half up, where both checks pass */
  LLVMValueRef fast_ok = e->recip_ok && e->tie_ok ? LLVMBuildAnd(b, e->recip_ok, e->tie_ok, "") : e->tie_ok;
  LLVMBasicBlockRef entry_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, chunk_cond);

  /* for each chunk */
  LLVMPositionBuilderAtEnd(b, chunk_cond);
  LLVMValueRef ci = LLVMBuildPhi(b, e->ti64, "c");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, ci, nchunks, ""), chunk_body, exit);

  LLVMPositionBuilderAtEnd(b, chunk_body);
  LLVMTypeRef chunk_t = chunk_type(e);
  LLVMValueRef chp = LLVMBuildGEP2(b, chunk_t, chunks, &ci, 1, "");
  LLVMValueRef tensor = LLVMBuildLoad2(b, e->ti32, LLVMBuildStructGEP2(b, chunk_t, chp, 0, ""), "tensor");
  e->start = LLVMBuildLoad2(b, e->ti64, LLVMBuildStructGEP2(b, chunk_t, chp, 2, ""), "start");
  LLVMValueRef len = LLVMBuildLoad2(b, e->ti64, LLVMBuildStructGEP2(b, chunk_t, chp, 3, ""), "len");
  LLVMValueRef flat = LLVMBuildLoad2(b, e->ti64, LLVMBuildStructGEP2(b, chunk_t, chp, 4, ""), "flat");
  LLVMValueRef numel = LLVMBuildLoad2(b, e->ti64, LLVMBuildStructGEP2(b, chunk_t, chp, 5, ""), "numel");
  /* bufs is the tensor table: tensor t's element 0 of buffer b at
   * bufs[t * nbufs + b] */
  LLVMValueRef row = LLVMBuildMul(b, LLVMBuildZExt(b, tensor, e->ti64, ""), LLVMConstInt(e->ti64, (unsigned)g->nbufs, 0), "");
  for (int bi = 0; bi < g->nbufs; bi++) {
    LLVMValueRef idx = LLVMBuildAdd(b, row, LLVMConstInt(e->ti64, (unsigned)bi, 0), "");
    LLVMValueRef base = LLVMBuildLoad2(b, e->tptr, LLVMBuildGEP2(b, e->tptr, bufs, &idx, 1, ""), "");
    Type bt = (Type)g->bufs[bi].type;
    LLVMValueRef at = e->start; /* the chunk's first element: a whole byte, a whole block (layout.c) */
    if (g->bufs[bi].per_block)
      at = LLVMBuildUDiv(b, at, LLVMConstInt(e->ti64, (unsigned)g->block, 0), "");
    if (bt == TY_U4)
      at = LLVMBuildUDiv(b, at, LLVMConstInt(e->ti64, 2, 0), "");
    e->bufptr[bi] = LLVMBuildGEP2(b, mem_type(e, bt), base, &at, 1, "");
  }
  (void)flat;
  /* per chunk: splats of step values, tensor-scope reductions, SR keys */
  memset(e->splat, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  memset(e->csplat, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  memset(e->lerp_w, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  memset(e->rsplat, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  splat_step_values(e);
  for (int r = 0; r < g->nins; r++)
    if (e->recip[r])
      e->rsplat[r] = broadcast(e, e->recip[r]);
  LLVMValueRef trow = LLVMBuildMul(b, LLVMBuildZExt(b, tensor, e->ti64, ""), LLVMConstInt(e->ti64, (unsigned)g->nins, 0), "");
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    for (int a = 0; a < op_info[x->op].nargs; a++) {
      Ref r = x->args[a];
      if (g->ins[r].scope == SCOPE_TENSOR && g->ins[r].op == OP_REDUCE && !e->splat[r]) {
        LLVMValueRef idx = LLVMBuildAdd(b, trow, LLVMConstInt(e->ti64, (unsigned)r, 0), "");
        e->splat[r] = broadcast(e, load_scalar(e, tvals, idx, TY_F64));
      }
    }
    if (x->op == OP_CVT_SR)
      e->srkey[i] = sr_key(e, e->scalar[x->args[1]], e->scalar[x->args[2]], tensor);
    if (x->op == OP_TAILPOS)
      e->tail[i] = tail_regions(e, e->scalar[x->args[0]], e->scalar[x->args[1]], numel);
    if (x->op == OP_LERP && (x->type == TY_F32 || x->type == TY_F64) && e->scalar[x->args[2]]) {
      /* torch's lerp picks its formula by |w| < 0.5: once per chunk for a step w */
      LLVMValueRef w = (e->fl[i] & FL_CLEAN) ? e->cscalar[x->args[2]] : e->scalar[x->args[2]];
      LLVMTypeRef st = LLVMTypeOf(w);
      LLVMValueRef lo = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOLT, w, LLVMConstReal(st, 0.5), ""),
                                     LLVMBuildFCmp(b, LLVMRealOGT, w, LLVMConstReal(st, -0.5), ""), "");
      e->lerp_lo[i] = broadcast(e, lo);
      e->lerp_w[i] = broadcast(e, LLVMBuildSelect(b, lo, w, LLVMBuildFSub(b, w, LLVMConstReal(st, 1.0), ""), ""));
    }
  }
  LLVMBuildBr(b, vec_cond);

  /* full vectors, then the last len % W elements masked */
  int nred = ph->nreds;
  LLVMValueRef acc0[16], acc_v[16], acc_g[16], acc_tc[16], acc_tail[16];
  ASSERT(nred <= 16);
  LLVMTypeRef vacc = vec(e->tf64, OPTC_REDUCE_LANES);
  for (int r = 0; r < nred; r++)
    acc0[r] = fconst(vacc, red_is_max((RedKind)g->ins[ph->reds[r]].red) ? -1.0 / 0.0 : 0.0);
  LLVMPositionBuilderAtEnd(b, vec_cond);
  if (blocks) {
    /* block by block, in block stages (blocks.c); no reductions over the group */
    block_chunk(e, fn, len, scratch);
    LLVMBuildBr(b, chunk_end);
    LLVMDeleteBasicBlock(tail_check);
    LLVMDeleteBasicBlock(tail);
    LLVMPositionBuilderAtEnd(b, chunk_end);
    LLVMValueRef cnext = LLVMBuildAdd(b, ci, LLVMConstInt(e->ti64, 1, 0), "");
    LLVMBuildBr(b, chunk_cond);
    LLVMAddIncoming(ci, (LLVMValueRef[]){LLVMConstInt(e->ti64, 0, 0), cnext},
                    (LLVMBasicBlockRef[]){entry_end, chunk_end}, 2);
    LLVMPositionBuilderAtEnd(b, exit);
    LLVMBuildRetVoid(b);
    return;
  }
  e->nstages = stages(e, &general);
  bool piped = e->nstages >= 2;
  LLVMValueRef jv, jg = NULL, jr = NULL, jt = NULL, jh = NULL;
  LLVMValueRef acc_r[16], acc_t[16], acc_h[16];
  LLVMBasicBlockRef from_v, from_g = NULL, from_r = NULL, from_t = NULL, from_h = NULL;
  LLVMValueRef hit = chunk_hit(e, len);
  if (hit) {
    /* A chunk in none of torch's loop remainders (almost every chunk of a
     * large tensor) has tailpos -1 in every lane: a loop of its own, with
     * that folded in. */
    LLVMBasicBlockRef plain = LLVMAppendBasicBlockInContext(c, fn, "vec.plain");
    LLVMBasicBlockRef mixed = LLVMAppendBasicBlockInContext(c, fn, "vec.tailpos");
    LLVMBuildCondBr(b, hit, mixed, plain);
    LLVMPositionBuilderAtEnd(b, mixed);
    jg = vec_loop(e, fn, len, false, &general, acc0, acc_g);
    from_g = LLVMGetInsertBlock(b);
    LLVMBuildBr(b, tail_check);
    LLVMPositionBuilderAtEnd(b, plain);
  }
  /* the loops below: over the chunks in no remainder, where there are any */
  const Loop loops = {.plain = hit != NULL};
  if (e->tab_ok) {
    /* the full vectors with the table, where this call built it; else
     * the dividing loop below, not pipelined: each loop more is compile
     * time, and a third one, recip_div's, cost a fifth more */
    LLVMBasicBlockRef look = LLVMAppendBasicBlockInContext(c, fn, "vec.tab");
    LLVMBasicBlockRef other = LLVMAppendBasicBlockInContext(c, fn, "vec.notab");
    LLVMBuildCondBr(b, e->tab_ok, look, other);
    LLVMPositionBuilderAtEnd(b, look);
    Loop tab = loops;
    tab.tab = true;
    e->nstages = stages(e, &tab);
    jt = vec_loop(e, fn, len, e->nstages >= 2, &tab, acc0, acc_t);
    e->nstages = stages(e, &loops);
    from_t = LLVMGetInsertBlock(b);
    LLVMBuildBr(b, tail_check);
    LLVMPositionBuilderAtEnd(b, other);
  }
  if (fast_ok) {
    /* the full vectors with tie_find's holds rounded half up (and the
     * multiplies, where there are any), where this call's checks passed */
    LLVMBasicBlockRef fast = LLVMAppendBasicBlockInContext(c, fn, "vec.halfup");
    LLVMBasicBlockRef other = LLVMAppendBasicBlockInContext(c, fn, "vec.even");
    LLVMBuildCondBr(b, fast_ok, fast, other);
    LLVMPositionBuilderAtEnd(b, fast);
    Loop half_up = loops;
    half_up.recip = e->recip_ok != NULL;
    half_up.tie = true;
    jh = vec_loop(e, fn, len, piped, &half_up, acc0, acc_h);
    from_h = LLVMGetInsertBlock(b);
    LLVMBuildBr(b, tail_check);
    LLVMPositionBuilderAtEnd(b, other);
  }
  if (e->recip_ok) {
    /* the full vectors with the multiplies, where this call's check passed
     * (on all but ~1 step in 2000 of AdamW's bias corrections); else the
     * divides, in a loop that is not pipelined, the rare case that need
     * not be fast: the compile takes a fifth less */
    LLVMBasicBlockRef mul = LLVMAppendBasicBlockInContext(c, fn, "vec.recip");
    LLVMBasicBlockRef div = LLVMAppendBasicBlockInContext(c, fn, "vec.div");
    LLVMBuildCondBr(b, e->recip_ok, mul, div);
    LLVMPositionBuilderAtEnd(b, mul);
    Loop recip = loops;
    recip.recip = true;
    jr = vec_loop(e, fn, len, piped, &recip, acc0, acc_r);
    from_r = LLVMGetInsertBlock(b);
    LLVMBuildBr(b, tail_check);
    LLVMPositionBuilderAtEnd(b, div);
  }
  jv = vec_loop(e, fn, len, piped && !e->recip_ok && !fast_ok, &loops, acc0, acc_v);
  from_v = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, tail_check);

  LLVMPositionBuilderAtEnd(b, tail_check);
  LLVMValueRef jphi = LLVMBuildPhi(b, e->ti64, "j.tail");
  LLVMAddIncoming(jphi, &jv, &from_v, 1);
  if (jg)
    LLVMAddIncoming(jphi, &jg, &from_g, 1);
  if (jr)
    LLVMAddIncoming(jphi, &jr, &from_r, 1);
  if (jt)
    LLVMAddIncoming(jphi, &jt, &from_t, 1);
  if (jh)
    LLVMAddIncoming(jphi, &jh, &from_h, 1);
  for (int r = 0; r < nred; r++) {
    acc_tc[r] = LLVMBuildPhi(b, vacc, "acc.tail");
    LLVMAddIncoming(acc_tc[r], &acc_v[r], &from_v, 1);
    if (jg)
      LLVMAddIncoming(acc_tc[r], &acc_g[r], &from_g, 1);
    if (jr)
      LLVMAddIncoming(acc_tc[r], &acc_r[r], &from_r, 1);
    if (jt)
      LLVMAddIncoming(acc_tc[r], &acc_t[r], &from_t, 1);
    if (jh)
      LLVMAddIncoming(acc_tc[r], &acc_h[r], &from_h, 1);
  }
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, jphi, len, ""), tail, chunk_end);
  LLVMPositionBuilderAtEnd(b, tail);
  LLVMValueRef lanes[W];
  for (int i = 0; i < W; i++)
    lanes[i] = LLVMConstInt(e->ti64, (unsigned)i, 0);
  LLVMValueRef rem = broadcast(e, LLVMBuildSub(b, len, jphi, ""));
  e->mask = LLVMBuildICmp(b, LLVMIntSLT, LLVMConstVector(lanes, W), rem, "mask");
  e->j = jphi;
  memcpy(acc_tail, acc_tc, sizeof(LLVMValueRef) * (size_t)nred);
  body_begin(e, &general);
  emit_body(e, acc_tail, &general);
  e->mask = NULL;
  LLVMBasicBlockRef tail_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, chunk_end);

  /* the chunk's partials */
  LLVMPositionBuilderAtEnd(b, chunk_end);
  for (int r = 0; r < nred; r++) {
    LLVMValueRef fin = LLVMBuildPhi(b, vacc, "");
    LLVMValueRef vals[2] = {acc_tc[r], acc_tail[r]};
    LLVMBasicBlockRef from[2] = {tail_check, tail_end};
    LLVMAddIncoming(fin, vals, from, 2);
    LLVMValueRef partial = combine_lanes(e, fin, (RedKind)g->ins[ph->reds[r]].red);
    LLVMValueRef idx = LLVMBuildAdd(b, LLVMBuildMul(b, ci, LLVMConstInt(e->ti64, (unsigned)nred, 0), ""),
                                    LLVMConstInt(e->ti64, (unsigned)r, 0), "");
    LLVMBuildStore(b, partial, LLVMBuildGEP2(b, e->tf64, partials, &idx, 1, ""));
  }
  LLVMValueRef cnext = LLVMBuildAdd(b, ci, LLVMConstInt(e->ti64, 1, 0), "");
  LLVMBuildBr(b, chunk_cond);

  /* the phis' incoming edges, now that every block exists */
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0);
  LLVMAddIncoming(ci, (LLVMValueRef[]){zero, cnext}, (LLVMBasicBlockRef[]){entry_end, chunk_end}, 2);

  LLVMPositionBuilderAtEnd(b, exit);
  LLVMBuildRetVoid(b);
}

LLVMModuleRef llvm_emit_module(const Graph *g, LLVMContextRef c, const char *cpu, const char *features) {
  const Plan *p = g->plan;
  ASSERT(p);
  E e = {.c = c, .g = g, .avx512 = features && strstr(features, "+avx512f"),
         .avx512bw = features && strstr(features, "+avx512f") && strstr(features, "+avx512bw"),
         .bf16cvt = features && strstr(features, "+avx512f") && strstr(features, "+avx512bw") &&
                    strstr(features, "+avx512bf16") && strstr(features, "+avx512dq"),
         .amd = cpu && strncmp(cpu, "znver", 5) == 0};
  e.m = LLVMModuleCreateWithNameInContext("optc", c);
  e.b = LLVMCreateBuilderInContext(c);
  e.tvoid = LLVMVoidTypeInContext(c);
  e.ti1 = LLVMInt1TypeInContext(c);
  e.ti8 = LLVMInt8TypeInContext(c);
  e.ti16 = LLVMInt16TypeInContext(c);
  e.ti32 = LLVMInt32TypeInContext(c);
  e.ti64 = LLVMInt64TypeInContext(c);
  e.tf32 = LLVMFloatTypeInContext(c);
  e.tf64 = LLVMDoubleTypeInContext(c);
  e.tptr = LLVMPointerTypeInContext(c, 0);
  size_t n = (size_t)g->nins + 1;
  e.val = calloc(n, sizeof(LLVMValueRef));
  e.scalar = calloc(n, sizeof(LLVMValueRef));
  e.tscalar = calloc(n, sizeof(LLVMValueRef));
  e.splat = calloc(n, sizeof(LLVMValueRef));
  e.srkey = calloc(n, sizeof(LLVMValueRef));
  e.tail = calloc(n, sizeof(LLVMValueRef));
  e.bufptr = calloc((size_t)g->nbufs + 1, sizeof(LLVMValueRef));
  e.cscalar = calloc(n, sizeof(LLVMValueRef));
  e.csplat = calloc(n, sizeof(LLVMValueRef));
  e.rnd = calloc(n, sizeof(LLVMValueRef));
  e.loads = calloc(n, sizeof(LLVMValueRef));
  e.lerp_w = calloc(n, sizeof(LLVMValueRef));
  e.lerp_lo = calloc(n, sizeof(LLVMValueRef));
  e.recip = calloc(n, sizeof(LLVMValueRef));
  e.rsplat = calloc(n, sizeof(LLVMValueRef));
  e.fl = calloc(n, 1);
  e.stage = calloc(n, 1);
  e.cross = calloc(n, sizeof(Ref));
  e.intab = calloc(n, 1);
  e.tie = calloc(n, sizeof(Ref));
  ASSERT(e.val && e.scalar && e.tscalar && e.splat && e.srkey && e.tail && e.bufptr);
  ASSERT(e.cscalar && e.csplat && e.rnd && e.lerp_w && e.lerp_lo && e.recip && e.rsplat && e.fl && e.stage &&
         e.cross && e.intab && e.tie);
  for (int k = 0; k < p->nphases; k++) {
    e.ph = &p->phases[k];
    emit_phase(&e, k);
  }
  free(e.val);
  free(e.scalar);
  free(e.tscalar);
  free(e.splat);
  free(e.srkey);
  free(e.tail);
  free(e.bufptr);
  free(e.cscalar);
  free(e.csplat);
  free(e.rnd);
  free(e.loads);
  free(e.lerp_w);
  free(e.lerp_lo);
  free(e.recip);
  free(e.rsplat);
  free(e.fl);
  free(e.stage);
  free(e.cross);
  free(e.intab);
  free(e.tie);
  LLVMDisposeBuilder(e.b);
  char *msg = NULL;
  if (LLVMVerifyModule(e.m, LLVMReturnStatusAction, &msg)) {
    fprintf(stderr, "%s:%d: internal error: the emitted LLVM IR does not verify:\n%s\n", __FILE__, __LINE__, msg);
    LLVMDisposeMessage(msg);
    abort();
  }
  LLVMDisposeMessage(msg);
  return e.m;
}
