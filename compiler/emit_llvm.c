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
#include "llvm_emit.h"

#include <llvm-c/Analysis.h>
#include <string.h>

enum { W = 16 };

typedef struct {
  LLVMContextRef c;
  LLVMModuleRef m;
  LLVMBuilderRef b;
  const Graph *g;
  const PlanPhase *ph;
  LLVMTypeRef tvoid, ti1, ti16, ti32, ti64, tf32, tf64, tptr;
  LLVMValueRef *val;     /* (nins) per-element values of the body being emitted */
  LLVMValueRef *scalar;  /* (nins) step-scope values, loaded at entry */
  LLVMValueRef *tscalar; /* (nins) tensor-scope reductions, loaded per chunk */
  LLVMValueRef *splat;   /* (nins) splats of the above, per chunk */
  LLVMValueRef *bufptr;  /* (nbufs) the chunk's first element of each buffer */
  LLVMValueRef *srkey;   /* (nins) the chunk's stochastic-rounding key of each cvt_sr */
  LLVMValueRef *tail;    /* (nins) tailpos: the chunk's <4 x i64> remainder regions {t0, e0, t1, e1} */
  LLVMValueRef mask;     /* NULL, or the tail's <W x i1> */
  LLVMValueRef j;        /* first element of this vector, within the chunk */
  LLVMValueRef start;    /* the chunk's first element within its tensor */
  bool avx512;           /* the target has AVX-512F (vrsqrt14ps) */
} E;

/* ---- types and constants --------------------------------------------------------- */

static LLVMTypeRef scalar_type(E *e, Type t) {
  switch (t) {
  case TY_BOOL: return e->ti1;
  case TY_I32: return e->ti32;
  case TY_I64: return e->ti64;
  case TY_F16: case TY_BF16: return e->ti16; /* carried as their bits */
  case TY_F32: return e->tf32;
  case TY_F64: return e->tf64;
  default: unreachable();
  }
}

static LLVMTypeRef vec(LLVMTypeRef t, int n) { return LLVMVectorType(t, (unsigned)n); }
static LLVMTypeRef vtype(E *e, Type t) { return vec(scalar_type(e, t), W); }

static LLVMValueRef splat_const(LLVMValueRef c, int n) {
  LLVMValueRef v[W];
  for (int i = 0; i < n; i++)
    v[i] = c;
  return LLVMConstVector(v, (unsigned)n);
}

static LLVMValueRef ci32(E *e, uint32_t x) { return splat_const(LLVMConstInt(e->ti32, x, 0), W); }
static LLVMValueRef cf32(E *e, float x) { return splat_const(LLVMConstReal(e->tf32, x), W); }

/* A value broadcast to all W lanes. */
static LLVMValueRef broadcast(E *e, LLVMValueRef s) {
  LLVMTypeRef vt = vec(LLVMTypeOf(s), W);
  LLVMValueRef v = LLVMBuildInsertElement(e->b, LLVMGetUndef(vt), s, LLVMConstInt(e->ti32, 0, 0), "");
  return LLVMBuildShuffleVector(e->b, v, LLVMGetUndef(vt), LLVMConstNull(vec(e->ti32, W)), "");
}

static LLVMValueRef call_intrinsic(E *e, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args,
                                   int nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  ASSERT(id != 0);
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(e->m, id, over, (size_t)nover);
  LLVMTypeRef ft = LLVMGlobalGetValueType(fn);
  return LLVMBuildCall2(e->b, ft, fn, args, (unsigned)nargs, "");
}

static LLVMValueRef unary_intrinsic(E *e, const char *name, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  return call_intrinsic(e, name, &t, 1, &x, 1);
}

/* ---- bf16 and f16, as numerics.h, lane by lane --------------------------------------- */

static LLVMValueRef bf16_to_f32(E *e, LLVMValueRef h) {
  LLVMValueRef u = LLVMBuildZExt(e->b, h, vec(e->ti32, W), "");
  return LLVMBuildBitCast(e->b, LLVMBuildShl(e->b, u, ci32(e, 16), ""), vec(e->tf32, W), "");
}

static LLVMValueRef f32_to_bf16(E *e, LLVMValueRef f) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef u = LLVMBuildBitCast(b, f, vec(e->ti32, W), "");
  LLVMValueRef hi = LLVMBuildLShr(b, u, ci32(e, 16), "");
  LLVMValueRef isnan = LLVMBuildICmp(b, LLVMIntUGT, LLVMBuildAnd(b, u, ci32(e, 0x7fffffff), ""), ci32(e, 0x7f800000), "");
  LLVMValueRef nanv = LLVMBuildOr(b, LLVMBuildAnd(b, hi, ci32(e, 0x8000), ""), ci32(e, 0x7fc0), "");
  LLVMValueRef r = LLVMBuildAdd(b, LLVMBuildAdd(b, u, ci32(e, 0x7fff), ""), LLVMBuildAnd(b, hi, ci32(e, 1), ""), "");
  r = LLVMBuildLShr(b, r, ci32(e, 16), "");
  return LLVMBuildTrunc(b, LLVMBuildSelect(b, isnan, nanv, r, ""), vec(e->ti16, W), "");
}

static LLVMValueRef f16_to_f32(E *e, LLVMValueRef h) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef x = LLVMBuildZExt(b, h, vec(e->ti32, W), "");
  LLVMValueRef sign = LLVMBuildShl(b, LLVMBuildAnd(b, x, ci32(e, 0x8000), ""), ci32(e, 16), "");
  LLVMValueRef ex = LLVMBuildAnd(b, LLVMBuildLShr(b, x, ci32(e, 10), ""), ci32(e, 0x1f), "");
  LLVMValueRef m = LLVMBuildAnd(b, x, ci32(e, 0x3ff), "");
  LLVMValueRef m13 = LLVMBuildShl(b, m, ci32(e, 13), "");
  LLVMValueRef special = LLVMBuildOr(b, LLVMBuildOr(b, sign, ci32(e, 0x7f800000), ""), m13, "");
  LLVMValueRef normal = LLVMBuildOr(
      b, LLVMBuildOr(b, sign, LLVMBuildShl(b, LLVMBuildAdd(b, ex, ci32(e, 112), ""), ci32(e, 23), ""), ""), m13, "");
  /* zero or subnormal: m * 2^-24, exact, with the sign */
  LLVMValueRef mag = LLVMBuildFMul(b, LLVMBuildUIToFP(b, m, vec(e->tf32, W), ""), cf32(e, 5.9604644775390625e-8f), "");
  LLVMValueRef neg = LLVMBuildICmp(b, LLVMIntNE, sign, ci32(e, 0), "");
  LLVMValueRef sub = LLVMBuildSelect(b, neg, LLVMBuildFNeg(b, mag, ""), mag, "");
  LLVMValueRef bits = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, ex, ci32(e, 0x1f), ""), special, normal, "");
  LLVMValueRef f = LLVMBuildBitCast(b, bits, vec(e->tf32, W), "");
  return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, ex, ci32(e, 0), ""), sub, f, "");
}

/* |x| * 2^24 rounded to nearest even by the 2^23 trick; |x| < 2^-14. */
static LLVMValueRef f16_subnormal_count(E *e, LLVMValueRef ax, bool floor) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef q = LLVMBuildFMul(b, LLVMBuildBitCast(b, ax, vec(e->tf32, W), ""), cf32(e, 16777216.0f), "");
  LLVMValueRef r = LLVMBuildFSub(b, LLVMBuildFAdd(b, q, cf32(e, 8388608.0f), ""), cf32(e, 8388608.0f), "");
  if (floor)
    r = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, r, q, ""), LLVMBuildFSub(b, r, cf32(e, 1.0f), ""), r, "");
  return r;
}

static LLVMValueRef f32_to_f16(E *e, LLVMValueRef f) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef u = LLVMBuildBitCast(b, f, vec(e->ti32, W), "");
  LLVMValueRef sign = LLVMBuildAnd(b, LLVMBuildLShr(b, u, ci32(e, 16), ""), ci32(e, 0x8000), "");
  LLVMValueRef ax = LLVMBuildAnd(b, u, ci32(e, 0x7fffffff), "");
  LLVMValueRef nan = LLVMBuildOr(b, sign, ci32(e, 0x7e00), "");
  LLVMValueRef inf = LLVMBuildOr(b, sign, ci32(e, 0x7c00), "");
  LLVMValueRef sub = LLVMBuildOr(
      b, sign, LLVMBuildFPToUI(b, f16_subnormal_count(e, ax, false), vec(e->ti32, W), ""), "");
  LLVMValueRef t = LLVMBuildAdd(b, LLVMBuildAdd(b, ax, ci32(e, 0xfff), ""),
                                LLVMBuildAnd(b, LLVMBuildLShr(b, ax, ci32(e, 13), ""), ci32(e, 1), ""), "");
  LLVMValueRef norm = LLVMBuildOr(b, sign, LLVMBuildLShr(b, LLVMBuildSub(b, t, ci32(e, 112u << 23), ""), ci32(e, 13), ""), "");
  LLVMValueRef r = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntULT, ax, ci32(e, 0x38800000), ""), sub, norm, "");
  r = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGE, ax, ci32(e, 0x477ff000), ""), inf, r, "");
  r = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGT, ax, ci32(e, 0x7f800000), ""), nan, r, "");
  return LLVMBuildTrunc(b, r, vec(e->ti16, W), "");
}

static LLVMValueRef mix32(E *e, LLVMValueRef x, bool vector) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef c16 = vector ? ci32(e, 16) : LLVMConstInt(e->ti32, 16, 0);
  LLVMValueRef c15 = vector ? ci32(e, 15) : LLVMConstInt(e->ti32, 15, 0);
  LLVMValueRef m1 = vector ? ci32(e, 0x7feb352d) : LLVMConstInt(e->ti32, 0x7feb352d, 0);
  LLVMValueRef m2 = vector ? ci32(e, 0x846ca68b) : LLVMConstInt(e->ti32, 0x846ca68b, 0);
  x = LLVMBuildXor(b, x, LLVMBuildLShr(b, x, c16, ""), "");
  x = LLVMBuildMul(b, x, m1, "");
  x = LLVMBuildXor(b, x, LLVMBuildLShr(b, x, c15, ""), "");
  x = LLVMBuildMul(b, x, m2, "");
  return LLVMBuildXor(b, x, LLVMBuildLShr(b, x, c16, ""), "");
}

/* optc_sr_key(seed, step, tensor), once per chunk */
static LLVMValueRef sr_key(E *e, LLVMValueRef seed, LLVMValueRef step, LLVMValueRef tensor) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef c32 = LLVMConstInt(e->ti64, 32, 0);
  LLVMValueRef k = mix32(e, LLVMBuildXor(b, LLVMBuildTrunc(b, seed, e->ti32, ""), LLVMConstInt(e->ti32, 0x9e3779b9, 0), ""), false);
  k = mix32(e, LLVMBuildXor(b, k, LLVMBuildTrunc(b, LLVMBuildLShr(b, seed, c32, ""), e->ti32, ""), ""), false);
  k = mix32(e, LLVMBuildXor(b, k, LLVMBuildTrunc(b, step, e->ti32, ""), ""), false);
  k = mix32(e, LLVMBuildXor(b, k, LLVMBuildTrunc(b, LLVMBuildLShr(b, step, c32, ""), e->ti32, ""), ""), false);
  return mix32(e, LLVMBuildXor(b, k, tensor, ""), false);
}

/* optc_sr_bits(key, i) for the W elements of this vector */
static LLVMValueRef sr_bits(E *e, LLVMValueRef key) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef lanes[W];
  for (int i = 0; i < W; i++)
    lanes[i] = LLVMConstInt(e->ti64, (unsigned long long)i, 0);
  LLVMValueRef idx = LLVMBuildAdd(b, broadcast(e, LLVMBuildAdd(b, e->start, e->j, "")), LLVMConstVector(lanes, W), "");
  LLVMValueRef lo = LLVMBuildTrunc(b, idx, vec(e->ti32, W), "");
  LLVMValueRef hi = LLVMBuildTrunc(b, LLVMBuildLShr(b, idx, splat_const(LLVMConstInt(e->ti64, 32, 0), W), ""),
                                   vec(e->ti32, W), "");
  LLVMValueRef inner = mix32(e, LLVMBuildXor(b, lo, LLVMBuildMul(b, hi, ci32(e, 0x85ebca6b), ""), ""), true);
  return mix32(e, LLVMBuildXor(b, broadcast(e, key), inner, ""), true);
}

static LLVMValueRef f32_to_bf16_sr(E *e, LLVMValueRef f, LLVMValueRef bits) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef u = LLVMBuildBitCast(b, f, vec(e->ti32, W), "");
  LLVMValueRef special = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildAnd(b, u, ci32(e, 0x7f800000), ""), ci32(e, 0x7f800000), "");
  LLVMValueRef r = LLVMBuildLShr(b, LLVMBuildAdd(b, u, LLVMBuildAnd(b, bits, ci32(e, 0xffff), ""), ""), ci32(e, 16), "");
  r = LLVMBuildTrunc(b, r, vec(e->ti16, W), "");
  return LLVMBuildSelect(b, special, f32_to_bf16(e, f), r, "");
}

static LLVMValueRef f32_to_f16_sr(E *e, LLVMValueRef f, LLVMValueRef bits) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef vf = vec(e->tf32, W), vi = vec(e->ti32, W);
  LLVMValueRef u = LLVMBuildBitCast(b, f, vi, "");
  LLVMValueRef sign = LLVMBuildAnd(b, LLVMBuildLShr(b, u, ci32(e, 16), ""), ci32(e, 0x8000), "");
  LLVMValueRef ax = LLVMBuildAnd(b, u, ci32(e, 0x7fffffff), "");
  /* subnormal range: floor(q) + (24 random bits as a fraction < frac(q)) */
  LLVMValueRef q = LLVMBuildFMul(b, LLVMBuildBitCast(b, ax, vf, ""), cf32(e, 16777216.0f), "");
  LLVMValueRef fl = f16_subnormal_count(e, ax, true);
  LLVMValueRef frac = LLVMBuildFSub(b, q, fl, "");
  LLVMValueRef r = LLVMBuildFMul(b, LLVMBuildUIToFP(b, LLVMBuildLShr(b, bits, ci32(e, 8), ""), vf, ""),
                                 cf32(e, 5.9604644775390625e-8f), "");
  LLVMValueRef up = LLVMBuildZExt(b, LLVMBuildFCmp(b, LLVMRealOLT, r, frac, ""), vi, "");
  LLVMValueRef sub = LLVMBuildOr(b, sign, LLVMBuildAdd(b, LLVMBuildFPToUI(b, fl, vi, ""), up, ""), "");
  sub = LLVMBuildTrunc(b, sub, vec(e->ti16, W), "");
  /* normal range: add random bits below the kept mantissa, truncate */
  LLVMValueRef t = LLVMBuildAnd(b, LLVMBuildAdd(b, ax, LLVMBuildAnd(b, bits, ci32(e, 0x1fff), ""), ""), ci32(e, ~0x1fffu), "");
  LLVMValueRef signed_t = LLVMBuildOr(b, t, LLVMBuildShl(b, sign, ci32(e, 16), ""), "");
  LLVMValueRef norm = f32_to_f16(e, LLVMBuildBitCast(b, signed_t, vf, ""));
  LLVMValueRef res = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntULT, ax, ci32(e, 0x38800000), ""), sub, norm, "");
  return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGE, ax, ci32(e, 0x47800000), ""), f32_to_f16(e, f), res, "");
}

/* ---- torch's f32 sqrt on AVX-512 (numerics_mkl.h), lane by lane ------------------------ */

static LLVMValueRef fbits(E *e, uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return cf32(e, f);
}

/* VRSQRT14PS of a positive normal x, from the 64-segment table in integer
 * ops and a gather: for a CPU without AVX-512. */
static LLVMValueRef rsqrt14_emulated(E *e, LLVMValueRef x) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef vi = vec(e->ti32, W);
  LLVMValueRef u = LLVMBuildBitCast(b, x, vi, "");
  LLVMValueRef be = LLVMBuildAdd(b, LLVMBuildLShr(b, u, ci32(e, 23), ""), ci32(e, 64), "");
  LLVMValueRef f = LLVMBuildAnd(b, u, ci32(e, 0x007fffff), "");
  LLVMValueRef ex = LLVMBuildSub(b, ci32(e, 222), LLVMBuildLShr(b, LLVMBuildAdd(b, be, ci32(e, 1), ""), ci32(e, 1), ""), "");
  LLVMValueRef odd = LLVMBuildAnd(b, be, ci32(e, 1), "");
  LLVMValueRef idx = LLVMBuildOr(b, LLVMBuildShl(b, odd, ci32(e, 5), ""), LLVMBuildLShr(b, f, ci32(e, 18), ""), "");
  LLVMValueRef tab = LLVMGetNamedGlobal(e->m, "optc_rsqrt14_tab");
  if (!tab) {
    LLVMValueRef init[64];
    for (int i = 0; i < 64; i++)
      init[i] = LLVMConstInt(e->ti32, optc_rsqrt14_tab[i], 0);
    LLVMTypeRef at = LLVMArrayType2(e->ti32, 64);
    tab = LLVMAddGlobal(e->m, at, "optc_rsqrt14_tab");
    LLVMSetInitializer(tab, LLVMConstArray2(e->ti32, init, 64));
    LLVMSetGlobalConstant(tab, 1);
    LLVMSetLinkage(tab, LLVMPrivateLinkage);
  }
  LLVMValueRef ptrs = LLVMBuildGEP2(b, e->ti32, tab, &idx, 1, "");
  LLVMValueRef mask = splat_const(LLVMConstInt(e->ti1, 1, 0), W);
  LLVMTypeRef over[2] = {vi, LLVMTypeOf(ptrs)};
  LLVMValueRef gargs[4] = {ptrs, LLVMConstInt(e->ti32, 4, 0), mask, LLVMGetUndef(vi)};
  LLVMValueRef k = call_intrinsic(e, "llvm.masked.gather", over, 2, gargs, 4);
  LLVMValueRef t = LLVMBuildSub(b, LLVMBuildAnd(b, LLVMBuildLShr(b, f, ci32(e, 8), ""), ci32(e, 0x3ff), ""), ci32(e, 512), "");
  LLVMValueRef v = LLVMBuildSub(b, LLVMBuildMul(b, LLVMBuildLShr(b, k, ci32(e, 10), ""), ci32(e, 128), ""),
                                LLVMBuildMul(b, LLVMBuildAnd(b, k, ci32(e, 0x3ff), ""), t, ""), "");
  LLVMValueRef mant = LLVMBuildShl(b, LLVMBuildAnd(b, LLVMBuildLShr(b, v, ci32(e, 9), ""), ci32(e, 0xffff), ""), ci32(e, 7), "");
  LLVMValueRef r = LLVMBuildOr(b, LLVMBuildShl(b, ex, ci32(e, 23), ""), mant, "");
  /* z = 1 exactly: 2^-n */
  LLVMValueRef one = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, f, ci32(e, 0), ""),
                                  LLVMBuildICmp(b, LLVMIntNE, odd, ci32(e, 0), ""), "");
  r = LLVMBuildSelect(b, one, LLVMBuildShl(b, LLVMBuildAdd(b, ex, ci32(e, 1), ""), ci32(e, 23), ""), r, "");
  return LLVMBuildBitCast(b, r, vec(e->tf32, W), "");
}

/* optc_sqrt_mkl_f32 on W lanes: rsqrt14, one fma Newton step, a power-of-4
 * scaling below 2^-102, then the special cases. */
static LLVMValueRef sqrt_mkl(E *e, LLVMValueRef x) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef vf = vec(e->tf32, W), vi = vec(e->ti32, W);
  LLVMValueRef u = LLVMBuildBitCast(b, x, vi, "");
  LLVMValueRef small = LLVMBuildICmp(b, LLVMIntULT, u, ci32(e, 0x0c800000), "");
  LLVMValueRef xs = LLVMBuildSelect(b, small, LLVMBuildFMul(b, x, fbits(e, 0x57800000), ""), x, "");
  LLVMValueRef y;
  if (e->avx512) {
    LLVMValueRef args[3] = {xs, LLVMConstNull(vf), LLVMConstInt(e->ti16, 0xffff, 0)};
    y = call_intrinsic(e, "llvm.x86.avx512.rsqrt14.ps.512", NULL, 0, args, 3);
  } else {
    y = rsqrt14_emulated(e, xs);
  }
  LLVMValueRef s = LLVMBuildFMul(b, xs, y, "");
  LLVMValueRef h = LLVMBuildFMul(b, cf32(e, 0.5f), y, "");
  LLVMValueRef fe[3] = {LLVMBuildFNeg(b, s, ""), s, xs};
  LLVMValueRef err = call_intrinsic(e, "llvm.fma", &vf, 1, fe, 3);
  LLVMValueRef fr[3] = {err, h, s};
  LLVMValueRef r = call_intrinsic(e, "llvm.fma", &vf, 1, fr, 3);
  r = LLVMBuildSelect(b, small, LLVMBuildFMul(b, r, fbits(e, 0x33800000), ""), r, "");
  LLVMValueRef mag = LLVMBuildAnd(b, u, ci32(e, 0x7fffffff), "");
  LLVMValueRef neg = LLVMBuildICmp(b, LLVMIntSLT, u, ci32(e, 0), "");
  r = LLVMBuildSelect(b, neg, fbits(e, 0x7fc00000), r, "");
  LLVMValueRef keep = LLVMBuildOr(b, LLVMBuildICmp(b, LLVMIntEQ, mag, ci32(e, 0), ""),
                                  LLVMBuildICmp(b, LLVMIntEQ, u, ci32(e, 0x7f800000), ""), "");
  r = LLVMBuildSelect(b, keep, x, r, "");
  LLVMValueRef quiet = LLVMBuildBitCast(b, LLVMBuildOr(b, u, ci32(e, 0x00400000), ""), vf, "");
  return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGT, mag, ci32(e, 0x7f800000), ""), quiet, r, "");
}

/* ---- per-type arithmetic ------------------------------------------------------------- */

static LLVMValueRef to_f32(E *e, LLVMValueRef v, Type t) {
  if (t == TY_BF16)
    return bf16_to_f32(e, v);
  if (t == TY_F16)
    return f16_to_f32(e, v);
  return v;
}

static LLVMValueRef from_f32(E *e, LLVMValueRef v, Type t) {
  if (t == TY_BF16)
    return f32_to_bf16(e, v);
  if (t == TY_F16)
    return f32_to_f16(e, v);
  return v;
}

/* torch.maximum / torch.minimum: NaN first, then std::max / std::min. */
static LLVMValueRef max_nan(E *e, LLVMValueRef a, LLVMValueRef x, bool is_min) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef pick = is_min ? LLVMBuildFCmp(b, LLVMRealOLT, x, a, "") : LLVMBuildFCmp(b, LLVMRealOLT, a, x, "");
  LLVMValueRef r = LLVMBuildSelect(b, pick, x, a, "");
  r = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), x, r, "");
  return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, a, a, ""), a, r, "");
}

static LLVMValueRef fconst(LLVMTypeRef vt, double x) {
  LLVMTypeRef et = LLVMGetElementType(vt);
  return splat_const(LLVMConstReal(et, x), (int)LLVMGetVectorSize(vt));
}

/* One arithmetic op on float vectors of one type (f32 or f64). */
static LLVMValueRef arith(E *e, Op op, LLVMValueRef *a) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef vt = LLVMTypeOf(a[0]);
  switch (op) {
  case OP_ADD: return LLVMBuildFAdd(b, a[0], a[1], "");
  case OP_SUB: return LLVMBuildFSub(b, a[0], a[1], "");
  case OP_MUL: return LLVMBuildFMul(b, a[0], a[1], "");
  case OP_DIV: return LLVMBuildFDiv(b, a[0], a[1], "");
  case OP_MIN: return max_nan(e, a[0], a[1], true);
  case OP_MAX: return max_nan(e, a[0], a[1], false);
  case OP_POW: return call_intrinsic(e, "llvm.pow", &vt, 1, a, 2);
  case OP_NEG: return LLVMBuildFNeg(b, a[0], "");
  case OP_ABS: return unary_intrinsic(e, "llvm.fabs", a[0]);
  case OP_SQRT: return unary_intrinsic(e, "llvm.sqrt", a[0]);
  case OP_RSQRT: return LLVMBuildFDiv(b, fconst(vt, 1.0), unary_intrinsic(e, "llvm.sqrt", a[0]), "");
  case OP_EXP: return unary_intrinsic(e, "llvm.exp", a[0]);
  case OP_LOG: return unary_intrinsic(e, "llvm.log", a[0]);
  case OP_FMA: return call_intrinsic(e, "llvm.fma", &vt, 1, a, 3);
  case OP_SIGN: {
    /* (0 < x) - (x < 0): NaN and both zeros give +0 */
    LLVMValueRef zero = fconst(vt, 0.0), one = fconst(vt, 1.0);
    LLVMValueRef gt = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, zero, a[0], ""), one, zero, "");
    LLVMValueRef lt = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, a[0], zero, ""), one, zero, "");
    return LLVMBuildFSub(b, gt, lt, "");
  }
  case OP_LERP: {
    /* torch's CPU lerp: fma(w, b-a, a) when |w| < 0.5, else fma(w-1, b-a, b) */
    LLVMValueRef d = LLVMBuildFSub(b, a[1], a[0], "");
    LLVMValueRef small = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOLT, a[2], fconst(vt, 0.5), ""),
                                      LLVMBuildFCmp(b, LLVMRealOGT, a[2], fconst(vt, -0.5), ""), "");
    LLVMValueRef w = LLVMBuildSelect(b, small, a[2], LLVMBuildFSub(b, a[2], fconst(vt, 1.0), ""), "");
    LLVMValueRef base = LLVMBuildSelect(b, small, a[0], a[1], "");
    LLVMValueRef args[3] = {w, d, base};
    return call_intrinsic(e, "llvm.fma", &vt, 1, args, 3);
  }
  case OP_SQRT_MKL:
    if (LLVMGetElementType(vt) == e->tf64)
      return unary_intrinsic(e, "llvm.sqrt", a[0]); /* MKL's f64 sqrt is IEEE */
    return sqrt_mkl(e, a[0]);
  default: unreachable();
  }
}

static LLVMValueRef convert(E *e, LLVMValueRef v, Type from, Type to) {
  LLVMBuilderRef b = e->b;
  if (from == to)
    return v;
  if (type_is_float(from) && type_is_float(to)) {
    if (from == TY_F64) /* to a 16-bit type: through f32, as the interpreter */
      return from_f32(e, LLVMBuildFPTrunc(b, v, vtype(e, TY_F32), ""), to);
    LLVMValueRef f = to_f32(e, v, from);
    return to == TY_F64 ? LLVMBuildFPExt(b, f, vtype(e, TY_F64), "") : from_f32(e, f, to);
  }
  if (type_is_float(from)) {
    /* toward zero, NaN to 0, saturating: llvm.fptosi.sat is exactly that */
    LLVMValueRef f = from == TY_F64 ? v : to_f32(e, v, from);
    LLVMTypeRef over[2] = {vtype(e, to), LLVMTypeOf(f)};
    return call_intrinsic(e, "llvm.fptosi.sat", over, 2, &f, 1);
  }
  if (type_is_float(to)) {
    if (to == TY_F64)
      return LLVMBuildSIToFP(b, v, vtype(e, TY_F64), "");
    return from_f32(e, LLVMBuildSIToFP(b, v, vtype(e, TY_F32), ""), to);
  }
  return from == TY_I32 ? LLVMBuildSExt(b, v, vtype(e, to), "") : LLVMBuildTrunc(b, v, vtype(e, to), "");
}

static LLVMValueRef operand(E *e, Ref r) {
  const Ins *x = &e->g->ins[r];
  if (x->scope == SCOPE_STEP || (x->scope == SCOPE_TENSOR && x->op == OP_REDUCE)) {
    ASSERT(e->splat[r]);
    return e->splat[r];
  }
  ASSERT(e->val[r]);
  return e->val[r];
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
static LLVMValueRef tailpos(E *e, LLVMValueRef regions) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef lanes[W];
  for (int i = 0; i < W; i++)
    lanes[i] = LLVMConstInt(e->ti64, (unsigned long long)i, 0);
  LLVMValueRef idx = LLVMBuildAdd(b, broadcast(e, LLVMBuildAdd(b, e->start, e->j, "")), LLVMConstVector(lanes, W), "");
  LLVMValueRef r = splat_const(LLVMConstInt(e->ti64, (unsigned long long)-1, 1), W);
  for (int k = 1; k >= 0; k--) {
    LLVMValueRef t = broadcast(e, LLVMBuildExtractElement(b, regions, LLVMConstInt(e->ti32, (unsigned)(2 * k), 0), ""));
    LLVMValueRef end = broadcast(e, LLVMBuildExtractElement(b, regions, LLVMConstInt(e->ti32, (unsigned)(2 * k + 1), 0), ""));
    LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGE, idx, t, ""), LLVMBuildICmp(b, LLVMIntSLT, idx, end, ""), "");
    r = LLVMBuildSelect(b, in, LLVMBuildSub(b, idx, t, ""), r, "");
  }
  return r;
}

/* One instruction of the element computation, as W lanes. */
static LLVMValueRef emit_ins(E *e, Ref i) {
  const Ins *x = &e->g->ins[i];
  LLVMBuilderRef b = e->b;
  Type t = (Type)x->type;
  Op op = (Op)x->op;
  LLVMValueRef a[3] = {0};
  Type at[3] = {TY_VOID, TY_VOID, TY_VOID};
  for (int k = 0; k < op_info[op].nargs; k++) {
    a[k] = operand(e, x->args[k]);
    at[k] = (Type)e->g->ins[x->args[k]].type;
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
  case TR_CVT: return convert(e, a[0], at[0], t);
  case TR_CVTSR: {
    LLVMValueRef bits = sr_bits(e, e->srkey[i]);
    return t == TY_BF16 ? f32_to_bf16_sr(e, a[0], bits) : f32_to_f16_sr(e, a[0], bits);
  }
  case TR_TAILPOS: return tailpos(e, e->tail[i]);
  default: unreachable();
  }
}

/* ---- memory ---------------------------------------------------------------------------- */

static LLVMValueRef elem_addr(E *e, int buf) {
  LLVMTypeRef et = scalar_type(e, (Type)e->g->bufs[buf].type);
  return LLVMBuildGEP2(e->b, et, e->bufptr[buf], &e->j, 1, "");
}

/* The memory may be the caller's (include/optc.h), so in the tail, past
 * the chunk's last element, nothing is read or written: masked loads (the
 * lanes past it read as zero) and masked stores. */
static LLVMValueRef load_vec(E *e, int buf) {
  Type t = (Type)e->g->bufs[buf].type;
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

static void store_vec(E *e, int buf, LLVMValueRef v) {
  Type t = (Type)e->g->bufs[buf].type;
  LLVMValueRef p = elem_addr(e, buf);
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

/* The loop body: W elements from j (masked in the tail). Loads come first,
 * so a load never sees a store of this step. Returns the new accumulators. */
static void emit_body(E *e, LLVMValueRef *acc) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  memset(e->val, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  for (Ref i = ph->lo; i < ph->hi; i++)
    if (g->ins[i].op == OP_LOAD)
      e->val[i] = load_vec(e, g->ins[i].buf);
  int nred = 0;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->op == OP_REDUCE) {
      acc[nred] = accumulate(e, i, acc[nred]);
      nred++;
    } else if (x->op == OP_STORE) {
      store_vec(e, x->buf, operand(e, x->args[0]));
    } else if (x->op != OP_LOAD && x->scope != SCOPE_STEP) {
      e->val[i] = emit_ins(e, i);
    }
  }
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
  const char *attrs[][2] = {{"min-legal-vector-width", "512"}, {"prefer-vector-width", "512"}};
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
  LLVMBasicBlockRef vec_body = LLVMAppendBasicBlockInContext(c, fn, "vec.body");
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
  LLVMBuildBr(b, chunk_cond);

  /* for each chunk */
  LLVMPositionBuilderAtEnd(b, chunk_cond);
  LLVMValueRef ci = LLVMBuildPhi(b, e->ti64, "c");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, ci, nchunks, ""), chunk_body, exit);

  LLVMPositionBuilderAtEnd(b, chunk_body);
  LLVMTypeRef chunk_t =
      LLVMStructTypeInContext(c, (LLVMTypeRef[]){e->ti32, e->ti32, e->ti64, e->ti64, e->ti64, e->ti64}, 6, 0);
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
    e->bufptr[bi] = LLVMBuildGEP2(b, scalar_type(e, (Type)g->bufs[bi].type), base, &e->start, 1, "");
  }
  (void)flat;
  /* per chunk: splats of step values, tensor-scope reductions, SR keys */
  memset(e->splat, 0, sizeof(LLVMValueRef) * (size_t)g->nins);
  for (int r = 0; r < g->nins; r++)
    if (e->scalar[r])
      e->splat[r] = broadcast(e, e->scalar[r]);
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
  }
  LLVMBuildBr(b, vec_cond);

  /* full vectors */
  int nred = ph->nreds;
  LLVMValueRef acc0[16], acc_phi[16], acc_body[16], acc_tail[16];
  ASSERT(nred <= 16);
  LLVMTypeRef vacc = vec(e->tf64, OPTC_REDUCE_LANES);
  for (int r = 0; r < nred; r++)
    acc0[r] = fconst(vacc, red_is_max((RedKind)g->ins[ph->reds[r]].red) ? -1.0 / 0.0 : 0.0);
  LLVMPositionBuilderAtEnd(b, vec_cond);
  LLVMValueRef jphi = LLVMBuildPhi(b, e->ti64, "j");
  for (int r = 0; r < nred; r++)
    acc_phi[r] = LLVMBuildPhi(b, vacc, "acc");
  LLVMValueRef jnext = LLVMBuildAdd(b, jphi, LLVMConstInt(e->ti64, W, 0), "");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, jnext, len, ""), vec_body, tail_check);

  LLVMPositionBuilderAtEnd(b, vec_body);
  e->j = jphi;
  e->mask = NULL;
  memcpy(acc_body, acc_phi, sizeof(LLVMValueRef) * (size_t)nred);
  emit_body(e, acc_body);
  LLVMBasicBlockRef vec_body_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, vec_cond);

  /* the last len % W elements, masked */
  LLVMPositionBuilderAtEnd(b, tail_check);
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, jphi, len, ""), tail, chunk_end);
  LLVMPositionBuilderAtEnd(b, tail);
  LLVMValueRef lanes[W];
  for (int i = 0; i < W; i++)
    lanes[i] = LLVMConstInt(e->ti64, (unsigned)i, 0);
  LLVMValueRef rem = broadcast(e, LLVMBuildSub(b, len, jphi, ""));
  e->mask = LLVMBuildICmp(b, LLVMIntSLT, LLVMConstVector(lanes, W), rem, "mask");
  e->j = jphi;
  memcpy(acc_tail, acc_phi, sizeof(LLVMValueRef) * (size_t)nred);
  emit_body(e, acc_tail);
  LLVMBasicBlockRef tail_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, chunk_end);

  /* the chunk's partials */
  LLVMPositionBuilderAtEnd(b, chunk_end);
  for (int r = 0; r < nred; r++) {
    LLVMValueRef fin = LLVMBuildPhi(b, vacc, "");
    LLVMValueRef vals[2] = {acc_phi[r], acc_tail[r]};
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
  LLVMAddIncoming(ci, (LLVMValueRef[]){zero, cnext}, (LLVMBasicBlockRef[]){entry, chunk_end}, 2);
  LLVMAddIncoming(jphi, (LLVMValueRef[]){zero, jnext}, (LLVMBasicBlockRef[]){chunk_body, vec_body_end}, 2);
  for (int r = 0; r < nred; r++)
    LLVMAddIncoming(acc_phi[r], (LLVMValueRef[]){acc0[r], acc_body[r]}, (LLVMBasicBlockRef[]){chunk_body, vec_body_end}, 2);

  LLVMPositionBuilderAtEnd(b, exit);
  LLVMBuildRetVoid(b);
}

LLVMModuleRef llvm_emit_module(const Graph *g, LLVMContextRef c, const char *features) {
  const Plan *p = g->plan;
  ASSERT(p);
  E e = {.c = c, .g = g, .avx512 = features && strstr(features, "+avx512f")};
  e.m = LLVMModuleCreateWithNameInContext("optc", c);
  e.b = LLVMCreateBuilderInContext(c);
  e.tvoid = LLVMVoidTypeInContext(c);
  e.ti1 = LLVMInt1TypeInContext(c);
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
  ASSERT(e.val && e.scalar && e.tscalar && e.splat && e.srkey && e.tail && e.bufptr);
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
