/* lanes.c: the arithmetic of one vector of W lanes, as LLVM IR: types and
 * constants, bf16 and f16 exactly as numerics.h rounds them, stochastic
 * rounding's hash, torch's f32 sqrt on AVX-512 (numerics_mkl.h), and each
 * op per type. No fast-math flags, no contraction: every lane is the IEEE
 * op the interpreter performs. */
#include "emit.h"

/* ---- types and constants --------------------------------------------------------- */

LLVMTypeRef scalar_type(E *e, Type t) {
  switch (t) {
  case TY_BOOL: return e->ti1;
  case TY_I32: return e->ti32;
  case TY_I64: return e->ti64;
  case TY_F16: case TY_BF16: return e->ti16; /* carried as their bits */
  case TY_F32: return e->tf32;
  case TY_F64: return e->tf64;
  case TY_U8: case TY_U4: return e->ti32; /* a code is a table index in a lane; i8 in memory (mem_type) */
  default: unreachable();
  }
}

LLVMValueRef splat_const(LLVMValueRef c, int n) {
  LLVMValueRef v[W];
  for (int i = 0; i < n; i++)
    v[i] = c;
  return LLVMConstVector(v, (unsigned)n);
}

LLVMValueRef ci32(E *e, uint32_t x) { return splat_const(LLVMConstInt(e->ti32, x, 0), W); }

static LLVMValueRef cf32(E *e, float x) { return splat_const(LLVMConstReal(e->tf32, x), W); }

/* A value broadcast to all W lanes. */
LLVMValueRef broadcast(E *e, LLVMValueRef s) {
  LLVMTypeRef vt = vec(LLVMTypeOf(s), W);
  LLVMValueRef v = LLVMBuildInsertElement(e->b, LLVMGetUndef(vt), s, LLVMConstInt(e->ti32, 0, 0), "");
  return LLVMBuildShuffleVector(e->b, v, LLVMGetUndef(vt), LLVMConstNull(vec(e->ti32, W)), "");
}

LLVMValueRef call_intrinsic(E *e, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args,
                            int nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  ASSERT(id != 0);
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(e->m, id, over, (size_t)nover);
  LLVMTypeRef ft = LLVMGlobalGetValueType(fn);
  return LLVMBuildCall2(e->b, ft, fn, args, (unsigned)nargs, "");
}

LLVMValueRef unary_intrinsic(E *e, const char *name, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  return call_intrinsic(e, name, &t, 1, &x, 1);
}

/* ---- bf16 and f16, as numerics.h, lane by lane --------------------------------------- */

/* v's 16 i32 lanes as 16 i16, each lane's low half (its high half zero,
 * or each lane 0 or -1: the pack saturates) in memory's order. */
static LLVMValueRef pack_words(E *e, LLVMValueRef v) {
  LLVMBuilderRef b = e->b;
  if (!e->perm)
    return LLVMBuildTrunc(b, v, vec(e->ti16, W), "");
  LLVMValueRef w = LLVMBuildBitCast(b, v, vec(e->ti16, 2 * W), "");
  LLVMValueRef idx[W];
  for (int n = 0; n < W; n++) /* lane_elem is its own inverse */
    idx[n] = LLVMConstInt(e->ti32, 2 * lane_elem(n), 0);
  return LLVMBuildShuffleVector(b, w, LLVMGetUndef(LLVMTypeOf(w)), LLVMConstVector(idx, W), "");
}

/* With AVX-512BW a bf16 vector is widened, and packed, by one vpermw: its
 * word indices and zeroing mask come from globals the optimizer cannot see
 * through (a constant one would become a shuffle, which is lowered as a
 * zero-extension and a shift, or a shift and vpmovdw: two or three ops). */
LLVMValueRef bf16_to_f32(E *e, LLVMValueRef h) {
  LLVMBuilderRef b = e->b;
  if (e->avx512bw) {
    LLVMValueRef lanes[2 * W];
    for (int i = 0; i < 2 * W; i++)
      lanes[i] = i < W ? LLVMConstInt(e->ti32, (unsigned)i, 0) : LLVMGetUndef(e->ti32);
    LLVMValueRef wide = LLVMBuildShuffleVector(b, h, LLVMGetUndef(LLVMTypeOf(h)), LLVMConstVector(lanes, 2 * W), "");
    LLVMValueRef args[2] = {wide, e->perm_widen};
    LLVMValueRef p = call_intrinsic(e, "llvm.x86.avx512.permvar.hi.512", NULL, 0, args, 2);
    p = LLVMBuildSelect(b, e->odd_words, p, LLVMConstNull(vec(e->ti16, 2 * W)), "");
    return LLVMBuildBitCast(b, p, vec(e->tf32, W), "");
  }
  if (e->perm) { /* words {0, h[lane_elem(d)]}: two vpunpck{l,h}wd */
    LLVMValueRef idx[2 * W];
    for (int d = 0; d < W; d++) {
      idx[2 * d] = LLVMConstInt(e->ti32, 0, 0);
      idx[2 * d + 1] = LLVMConstInt(e->ti32, W + lane_elem(d), 0);
    }
    LLVMValueRef wide = LLVMBuildShuffleVector(b, LLVMConstNull(LLVMTypeOf(h)), h, LLVMConstVector(idx, 2 * W), "");
    return LLVMBuildBitCast(b, wide, vec(e->tf32, W), "");
  }
  LLVMValueRef u = LLVMBuildZExt(b, h, vec(e->ti32, W), "");
  return LLVMBuildBitCast(b, LLVMBuildShl(b, u, ci32(e, 16), ""), vec(e->tf32, W), "");
}

/* optc_f32_to_bf16 without its NaN case, kept in place: the f32 bits with
 * the low 16 rounded off to nearest even (u + 0x7fff + lsb, then the low
 * half cleared). A NaN whose low 16 payload bits are zero comes out as
 * itself; any other NaN may not (a signaling one can become infinity, one
 * with a full payload carries into the sign). bf16_round_sum is the sum
 * before the low half is cleared: its high half is the same. */
LLVMValueRef bf16_round_sum(E *e, LLVMValueRef u, bool half_up) {
  LLVMBuilderRef b = e->b;
  if (half_up) /* no tie this call (tie_check): half up is to even */
    return LLVMBuildAdd(b, u, ci32(e, 0x8000), "");
  if (e->avx512) {
    /* the bias as a choice of two constants: vptestmd and a masked move */
    LLVMValueRef odd = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, u, ci32(e, 0x10000), ""), ci32(e, 0), "");
    return LLVMBuildAdd(b, u, LLVMBuildSelect(b, odd, ci32(e, 0x8000), ci32(e, 0x7fff), ""), "");
  }
  LLVMValueRef lsb = LLVMBuildAnd(b, LLVMBuildLShr(b, u, ci32(e, 16), ""), ci32(e, 1), "");
  return LLVMBuildAdd(b, LLVMBuildAdd(b, u, ci32(e, 0x7fff), ""), lsb, "");
}

LLVMValueRef bf16_round_bits(E *e, LLVMValueRef u) {
  return LLVMBuildAnd(e->b, bf16_round_sum(e, u, false), ci32(e, 0xffff0000u), "");
}

/* optc_f32_to_bf16 in the f32 bits: the rounded bits, or the quiet NaN
 * (0x7fc0 | sign) << 16. */
LLVMValueRef bf16_round_exact(E *e, LLVMValueRef f, LLVMValueRef fast) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef u = LLVMBuildBitCast(b, f, vec(e->ti32, W), "");
  LLVMValueRef nan = LLVMBuildOr(b, LLVMBuildAnd(b, u, ci32(e, 0x80000000u), ""), ci32(e, 0x7fc00000), "");
  return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, f, f, ""), nan, fast, "");
}

/* The bf16 in the high half of each lane. */
LLVMValueRef bf16_pack(E *e, LLVMValueRef bits) {
  LLVMBuilderRef b = e->b;
  if (e->avx512bw) {
    LLVMValueRef args[2] = {LLVMBuildBitCast(b, bits, vec(e->ti16, 2 * W), ""), e->perm_pack};
    LLVMValueRef p = call_intrinsic(e, "llvm.x86.avx512.permvar.hi.512", NULL, 0, args, 2);
    LLVMValueRef lanes[W];
    for (int i = 0; i < W; i++)
      lanes[i] = LLVMConstInt(e->ti32, (unsigned)i, 0);
    return LLVMBuildShuffleVector(b, p, LLVMGetUndef(LLVMTypeOf(p)), LLVMConstVector(lanes, W), "");
  }
  return pack_words(e, LLVMBuildLShr(b, bits, ci32(e, 16), ""));
}

static LLVMValueRef f32_to_bf16(E *e, LLVMValueRef f) {
  LLVMValueRef u = LLVMBuildBitCast(e->b, f, vec(e->ti32, W), "");
  return bf16_pack(e, bf16_round_exact(e, f, bf16_round_bits(e, u)));
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
LLVMValueRef sr_key(E *e, LLVMValueRef seed, LLVMValueRef step, LLVMValueRef tensor) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef c32 = LLVMConstInt(e->ti64, 32, 0);
  LLVMValueRef k = mix32(e, LLVMBuildXor(b, LLVMBuildTrunc(b, seed, e->ti32, ""), LLVMConstInt(e->ti32, 0x9e3779b9, 0), ""), false);
  k = mix32(e, LLVMBuildXor(b, k, LLVMBuildTrunc(b, LLVMBuildLShr(b, seed, c32, ""), e->ti32, ""), ""), false);
  k = mix32(e, LLVMBuildXor(b, k, LLVMBuildTrunc(b, step, e->ti32, ""), ""), false);
  k = mix32(e, LLVMBuildXor(b, k, LLVMBuildTrunc(b, LLVMBuildLShr(b, step, c32, ""), e->ti32, ""), ""), false);
  return mix32(e, LLVMBuildXor(b, k, tensor, ""), false);
}

/* optc_sr_bits(key, i) for the W elements of this vector */
LLVMValueRef sr_bits(E *e, LLVMValueRef key) {
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

LLVMValueRef f32_to_bf16_sr(E *e, LLVMValueRef f, LLVMValueRef bits) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef u = LLVMBuildBitCast(b, f, vec(e->ti32, W), "");
  LLVMValueRef special = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildAnd(b, u, ci32(e, 0x7f800000), ""), ci32(e, 0x7f800000), "");
  LLVMValueRef r = LLVMBuildLShr(b, LLVMBuildAdd(b, u, LLVMBuildAnd(b, bits, ci32(e, 0xffff), ""), ""), ci32(e, 16), "");
  r = LLVMBuildTrunc(b, r, vec(e->ti16, W), "");
  return LLVMBuildSelect(b, special, f32_to_bf16(e, f), r, "");
}

LLVMValueRef f32_to_f16_sr(E *e, LLVMValueRef f, LLVMValueRef bits) {
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

/* optc_sqrt_mkl_ex_f32 on W lanes: this CPU's rsqrtps (SSE's, four lanes a
 * call: torch's MKL kernel is SSE2, and the table is the CPU's, whatever
 * the encoding), the Newton step in separate f32 ops, then the rare lanes. */
static LLVMValueRef sqrt_mkl_ex(E *e, LLVMValueRef x) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef vf = vec(e->tf32, W), vi = vec(e->ti32, W);
  LLVMValueRef part[W / 4];
  for (int q = 0; q < W / 4; q++) {
    LLVMValueRef idx[4];
    for (int i = 0; i < 4; i++)
      idx[i] = LLVMConstInt(e->ti32, (unsigned long long)(4 * q + i), 0);
    LLVMValueRef piece = LLVMBuildShuffleVector(b, x, LLVMGetUndef(vf), LLVMConstVector(idx, 4), "");
    part[q] = call_intrinsic(e, "llvm.x86.sse.rsqrt.ps", NULL, 0, &piece, 1);
  }
  for (int n = W / 4; n > 1; n /= 2) /* pairs of pieces, into one vector of W lanes */
    for (int q = 0; q < n / 2; q++) {
      int len = 2 * (W / n);
      LLVMValueRef idx[W];
      for (int i = 0; i < len; i++)
        idx[i] = LLVMConstInt(e->ti32, (unsigned long long)i, 0);
      part[q] = LLVMBuildShuffleVector(b, part[2 * q], part[2 * q + 1], LLVMConstVector(idx, (unsigned)len), "");
    }
  LLVMValueRef y = part[0];
  LLVMValueRef half = cf32(e, 0.5f);
  LLVMValueRef s = LLVMBuildFMul(b, x, y, ""), h = LLVMBuildFMul(b, y, half, "");
  LLVMValueRef err = LLVMBuildFSub(b, half, LLVMBuildFMul(b, s, h, ""), "");
  LLVMValueRef s1 = LLVMBuildFAdd(b, LLVMBuildFMul(b, s, err, ""), s, "");
  LLVMValueRef h1 = LLVMBuildFAdd(b, LLVMBuildFMul(b, err, h, ""), h, "");
  LLVMValueRef d = LLVMBuildFSub(b, x, LLVMBuildFMul(b, s1, s1, ""), "");
  LLVMValueRef r = LLVMBuildFAdd(b, LLVMBuildFMul(b, d, h1, ""), s1, "");
  /* the rare lanes, as numerics_mkl.h's */
  LLVMValueRef u = LLVMBuildBitCast(b, x, vi, "");
  LLVMValueRef fast = LLVMBuildICmp(b, LLVMIntULE, LLVMBuildSub(b, u, ci32(e, 0x00800000), ""),
                                    ci32(e, 0x7f7ff000 - 0x00800000), "");
  LLVMValueRef mag = LLVMBuildAnd(b, u, ci32(e, 0x7fffffff), "");
  LLVMValueRef rare = unary_intrinsic(e, "llvm.sqrt", x);
  LLVMValueRef neg = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, u, ci32(e, 0), ""),
                                  LLVMBuildICmp(b, LLVMIntNE, mag, ci32(e, 0), ""), "");
  rare = LLVMBuildSelect(b, neg, fbits(e, 0x7fc00000), rare, "");
  LLVMValueRef quiet = LLVMBuildBitCast(b, LLVMBuildOr(b, u, ci32(e, 0x00400000), ""), vf, "");
  rare = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGT, mag, ci32(e, 0x7f800000), ""), quiet, rare, "");
  return LLVMBuildSelect(b, fast, r, rare, "");
}

/* ---- per-type arithmetic ------------------------------------------------------------- */

LLVMValueRef to_f32(E *e, LLVMValueRef v, Type t) {
  if (t == TY_BF16)
    return bf16_to_f32(e, v);
  if (t == TY_F16)
    return f16_to_f32(e, v);
  return v;
}

LLVMValueRef from_f32(E *e, LLVMValueRef v, Type t) {
  if (t == TY_BF16)
    return f32_to_bf16(e, v);
  if (t == TY_F16)
    return f32_to_f16(e, v);
  return v;
}

/* torch.maximum / torch.minimum: NaN first, then std::max / std::min. */
LLVMValueRef max_nan(E *e, LLVMValueRef a, LLVMValueRef x, bool is_min) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef pick = is_min ? LLVMBuildFCmp(b, LLVMRealOLT, x, a, "") : LLVMBuildFCmp(b, LLVMRealOLT, a, x, "");
  LLVMValueRef r = LLVMBuildSelect(b, pick, x, a, "");
  r = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), x, r, "");
  return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, a, a, ""), a, r, "");
}

LLVMValueRef fconst(LLVMTypeRef vt, double x) {
  LLVMTypeRef et = LLVMGetElementType(vt);
  return splat_const(LLVMConstReal(et, x), (int)LLVMGetVectorSize(vt));
}

/* One arithmetic op on float vectors of one type (f32 or f64). */
LLVMValueRef arith(E *e, Op op, LLVMValueRef *a) {
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
  case OP_SQRT_MKL_EX:
    if (LLVMGetElementType(vt) == e->tf64)
      return unary_intrinsic(e, "llvm.sqrt", a[0]);
    return sqrt_mkl_ex(e, a[0]);
  default: unreachable();
  }
}

LLVMValueRef convert(E *e, LLVMValueRef v, Type from, Type to) {
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
