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

enum { W = 16, PREFETCH = 512 };

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
  LLVMValueRef *cscalar; /* (nins) step values with any NaN made 0x7fc00000 | sign */
  LLVMValueRef *csplat;  /* (nins) their splats, per chunk */
  LLVMValueRef *rnd;     /* (nins) a cvt to bf16: the rounded value as f32 bits */
  LLVMValueRef *lerp_w;  /* (nins) a lerp by a step value: the fma's weight, splat */
  LLVMValueRef *lerp_lo; /* (nins) ... and whether |w| < 0.5, splat */
  LLVMValueRef *recip;   /* (nins) a div taken as a multiply (recip_div): 1/c at entry */
  LLVMValueRef *rsplat;  /* (nins) ... its splat, per chunk */
  LLVMValueRef recip_ok; /* NULL, or whether every such multiply rounds as its div this call */
  Ref tab_u, tab_o;      /* a 16-bit value and a bf16 hold that is a function of it alone (tab_find), or NOREF */
  uint8_t *intab;        /* (nins) 1: what lies between them, computed only in the build; 2: tab_u as f32 */
  LLVMValueRef tab;      /* the table: 65536 f32 bits, tab_o's rounding for each bit pattern of tab_u */
  LLVMValueRef tab_ok;   /* NULL, or whether this call built it (it is large enough) */
  Ref *tie;              /* (nins) a hold tie_find took: the 16-bit-derived f32 its op reads, else NOREF */
  LLVMValueRef tie_ok;   /* NULL, or whether no such hold rounds a tie this call (tie_check) */
  uint8_t *fl;           /* (nins) FL_* of the phase being emitted */
  uint8_t *stage;        /* (nins) its stage in the pipelined loop: divides and square roots before it (stages) */
  Ref *cross;            /* (nins) the values a stage reads of an earlier one */
  int ncross, nstages;
  bool has_tailpos;      /* the phase's body computes tailpos */
  bool avx512;           /* the target has AVX-512F (vrsqrt14ps) */
  bool avx512bw;         /* ... and AVX-512BW (vpermw): bf16 packed and widened in one op */
  bool bf16cvt;          /* ... and AVX512-BF16 and DQ: vcvtneps2bf16 (the pipelined loop's fast pass) */
  bool amd;              /* an AMD CPU (znver*): no table (tab_find), holds half up (tie_find), no
                          * software prefetch (prefetch) */
  LLVMValueRef special;  /* the fast pass's (Loop.cvt) lanes vcvtneps2bf16 does not round as numerics.h (NULL: none yet) */
  LLVMValueRef *loads;   /* (nins) the fast pass's loads, which its exact redo (Loop.reuse_loads) reuses */
  bool perm_ok;          /* without AVX-512: the phase may widen in lane_elem's order (perm_find) */
  bool perm;             /* ... and the body being emitted does: f32 lane d holds element lane_elem(d) (body_begin) */
  LLVMValueRef perm_pack, perm_widen, odd_words; /* vpermw's operands, loaded at entry */
} E;

/* A loop's variant: what its body (emit_body, emit_stage, emit_ins) is
 * emitted with. emit_phase gives each loop over a chunk's vectors its own
 * (vec_loop); the variants differ in how a value is computed, never in its
 * bits. */
typedef struct {
  bool plain;       /* the chunk is in none of torch's loop remainders (chunk_hit): tailpos is -1 in every
                     * lane, and bf16 may widen in lane_elem's order (perm_find) */
  bool tab;         /* tab_o is looked up in the table (tab_find), and what lies between is not computed */
  bool tie;         /* tie_find's holds round half up (tie_check passed this call) */
  bool recip;       /* a divide by a step value multiplies by its reciprocal (recip_div) */
  bool cvt;         /* the pipelined loop's fast pass: stored bf16 round by vcvtneps2bf16 (cvt_pays) */
  bool reuse_loads; /* ... and its exact redo, which takes the fast pass's loads */
} Loop;

/* What emit_phase knows about a value before it emits the body (analyze).
 * The point is the bf16 hold, cvt(cvt(x : bf16) : f32): rounding x in its
 * f32 bits with the NaN case left out is a third of optc_f32_to_bf16's
 * work, and gives a NaN back as itself when its low 16 payload bits are
 * zero, where numerics.h gives 0x7fc0 | sign. The two differ only in a
 * NaN's payload, never in its sign, and a payload is seen only by a few
 * uses: a store of an f32 or f64, a reduction. So a hold skips the NaN
 * case (FL_FAST) when its operand's NaNs have clean low bits (FL_P) and
 * no such use sees its result through NaN-propagating arithmetic
 * (FL_SENS). A 16-bit store packs with the NaN case, so the bits in memory
 * are numerics.h's either way. */
enum {
  FL_SENS = 1,  /* a NaN's payload here reaches an f32/f64 store or a reduction */
  FL_CLEAN = 2, /* its step-value operands may be canonical-NaN copies (cscalar) */
  FL_P = 4,     /* as f32, any NaN here has its low 16 payload bits zero */
  FL_FAST = 8,  /* a cvt to bf16 whose f32 uses may skip the NaN case */
  FL_CANON = 16 /* a bf16 value whose NaNs are 0x7fc0 | sign: not a load */
};

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

static bool is16(Type t) { return t == TY_BF16 || t == TY_F16; }
static bool in_body(const Ins *x) { return x->scope == SCOPE_ELEM; }

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

/* Without AVX-512 an f32 vector is two ymm, and widening 16 bf16 in order
 * takes two vpmovzxwd and two shifts; vpunpck{l,h}wd against zero widen
 * them in two ops, each within its 128-bit lanes: elements 0-3 and 8-11
 * into the first ymm, 4-7 and 12-15 into the second. vpackusdw packs that
 * order back in one op (no vpermq). So where every lane is on its own (a
 * phase perm_find accepts), f32 lane d holds element lane_elem(d), and a
 * 16-bit vector is always in memory's order. */
static unsigned lane_elem(int d) { return (unsigned)((d & 4) * 2 + (d & 8) / 2 + (d & 3)); }

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
static LLVMValueRef bf16_to_f32(E *e, LLVMValueRef h) {
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
static LLVMValueRef bf16_round_sum(E *e, LLVMValueRef u, bool half_up) {
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

static LLVMValueRef bf16_round_bits(E *e, LLVMValueRef u) {
  return LLVMBuildAnd(e->b, bf16_round_sum(e, u, false), ci32(e, 0xffff0000u), "");
}

/* optc_f32_to_bf16 in the f32 bits: the rounded bits, or the quiet NaN
 * (0x7fc0 | sign) << 16. */
static LLVMValueRef bf16_round_exact(E *e, LLVMValueRef f, LLVMValueRef fast) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef u = LLVMBuildBitCast(b, f, vec(e->ti32, W), "");
  LLVMValueRef nan = LLVMBuildOr(b, LLVMBuildAnd(b, u, ci32(e, 0x80000000u), ""), ci32(e, 0x7fc00000), "");
  return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, f, f, ""), nan, fast, "");
}

/* The bf16 in the high half of each lane. */
static LLVMValueRef bf16_pack(E *e, LLVMValueRef bits) {
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
static Ref stored_value(const Graph *g, const Ins *store) {
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
static bool read_back(const E *e, Ref i) {
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

/* Whether the loop being emitted takes the vcvtneps2bf16 fast pass: where
 * every bf16 it stores is a rounding (fused=True's bits; the for-loop's
 * too, whose exp_avg and exp_avg_sq are read back, widened from the
 * words: one vpermw for the integer rounding's four ops). Not in the loop
 * that looks the denominator up (tab_find), where the gather held the
 * for-loop back all the same: on Zen 4 the Scout recipe's step went
 * 2.24-2.60 -> 2.19-2.99 ms (2M params, one thread). Without the table,
 * AdamW bf16's for-loop bits, 16M params on two threads: 8.2-10.2 ->
 * 7.6-8.2 ms, where fused bits took 7.3-8.0. */
static bool cvt_pays(const E *e, const Loop *lp) {
  const Graph *g = e->g;
  int n = 0;
  for (Ref k = e->ph->lo; k < e->ph->hi; k++) {
    const Ins *x = &g->ins[k];
    if (x->op != OP_STORE || g->bufs[x->buf].type != TY_BF16)
      continue;
    Ref r = stored_value(g, x);
    if (g->ins[r].op != OP_CVT || g->ins[r].type != TY_BF16 || (lp->tab && read_back(e, r)))
      return false;
    n++;
  }
  return n > 0;
}

/* A stored bf16 in the pipelined loop's fast pass (vec_loop): vcvtneps2bf16
 * rounds every finite normal f32 and infinity to nearest even, numerics.h's
 * bits, in one op where the integer rounding and vpermw's pack are five.
 * It treats a subnormal input as zero and keeps a NaN's payload: one
 * vfpclassps marks those lanes in e->special, and an iteration with any
 * is redone the exact way, its stores too, before it hands anything on. */
static LLVMValueRef round_bf16_cvt(E *e, Ref i, LLVMValueRef f) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef words = call_intrinsic(e, "llvm.x86.avx512bf16.cvtneps2bf16.512", NULL, 0, &f, 1);
  words = LLVMBuildBitCast(b, words, vec(e->ti16, W), "");
  LLVMValueRef args[2] = {f, LLVMConstInt(e->ti32, 0xa1, 0)}; /* QNaN | denormal | SNaN */
  LLVMValueRef odd = call_intrinsic(e, "llvm.x86.avx512.fpclass.ps.512", NULL, 0, args, 2);
  e->special = e->special ? LLVMBuildOr(b, e->special, odd, "") : odd;
  /* what a later cvt back to f32 reads (exact where the lane is not special) */
  e->rnd[i] = LLVMBuildBitCast(b, bf16_to_f32(e, words), vec(e->ti32, W), "");
  return words;
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
static LLVMValueRef emit_ins(E *e, Ref i, const Loop *lp) {
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
/* A software prefetch of buf, PREFETCH elements ahead of the vector at
 * e->j, into every cache level. The hardware's prefetchers keep up with a
 * loop whose every element is a few cycles; they fall behind this one,
 * whose chains of divides and roundings take ~100 cycles per vector, so
 * few of its loads are in flight at once. Measured on 64M params, 2
 * threads (bench/results.md): bf16 43 -> 39 ms, fp32 44 -> 37 ms; 512
 * elements ahead was the best of 256 to 2048 in both. Past the chunk's end
 * it reads the tensor's next chunk, which this thread runs next; a
 * prefetch never faults. Not on AMD's cores, whose prefetchers keep up:
 * on Zen 4 (64M params, 2 threads, the two compiles run in turns in one
 * process) the Scout recipe's step was 1-5% faster without, in for-loop
 * and fused bits and in fp32, and the same with clip or AVX2's code. */
static void prefetch(E *e, int buf) {
  if (e->mask || e->amd)
    return;
  LLVMTypeRef et = scalar_type(e, (Type)e->g->bufs[buf].type);
  LLVMValueRef at = LLVMBuildAdd(e->b, e->j, LLVMConstInt(e->ti64, PREFETCH, 0), "");
  LLVMTypeRef over[1] = {e->tptr};
  LLVMValueRef args[4] = {LLVMBuildGEP2(e->b, et, e->bufptr[buf], &at, 1, ""), LLVMConstInt(e->ti32, 0, 0),
                          LLVMConstInt(e->ti32, 3, 0), LLVMConstInt(e->ti32, 1, 0)};
  call_intrinsic(e, "llvm.prefetch", over, 1, args, 4);
}

static LLVMValueRef load_vec(E *e, int buf) {
  Type t = (Type)e->g->bufs[buf].type;
  prefetch(e, buf);
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

/* ---- a function of one bf16, as a table ------------------------------------------------- */

/* In torch's for-loop AdamW on bf16 tensors, every op rounds to bf16, so
 * denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) is a
 * function of exp_avg_sq's 16 bits and two step values: 65536 results, a
 * square root, a divide, an add and three roundings each. tab_find finds
 * such a value: a bf16 hold (tab_o) computed from one 16-bit value (tab_u)
 * and step values alone, with a divide or square root on the way and
 * nothing between the two used elsewhere. The call then computes it once
 * for every bit pattern of tab_u, with the very code the loop would run,
 * into a table on its stack (tab_build), and the loop gathers it: a shift
 * and a vpgatherdd where that was ~20 vector ops and two divider ops.
 * Measured (64M params of the Scout's mix, 2 threads): 29.4 -> 25.5 ms a
 * step. The build, 4096 vectors of the cone, costs about what the table
 * saves on 128K elements: a call takes it from CPU_TABLE_MIN (codegen.h),
 * where 512K params on 2 threads were 5% faster. */
static void forget(E *e);

/* Chunk (plan.h) as LLVM sees it: {tensor, block, start, len, flat, numel}. */
static LLVMTypeRef chunk_type(E *e) {
  return LLVMStructTypeInContext(e->c, (LLVMTypeRef[]){e->ti32, e->ti32, e->ti64, e->ti64, e->ti64, e->ti64}, 6, 0);
}

/* Splats of the step values and their canonical-NaN copies, in the
 * current block (per chunk, and in a table's build). */
static void splat_step_values(E *e) {
  for (int r = 0; r < e->g->nins; r++) {
    if (e->scalar[r])
      e->splat[r] = broadcast(e, e->scalar[r]);
    if (e->cscalar[r])
      e->csplat[r] = broadcast(e, e->cscalar[r]);
  }
}

static bool tabulable(const Ins *x) {
  switch (x->op) {
  case OP_LOAD: case OP_STORE: case OP_REDUCE: case OP_CVT_SR: case OP_TAILPOS: case OP_LERP: return false;
  default: return in_body(x);
  }
}

static void tab_find(E *e) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  e->tab_u = e->tab_o = NOREF;
  memset(e->intab, 0, (size_t)g->nins);
  /* AVX-512 only: where AVX2's gathers are slow (Haswell, Zen 3) LLVM
   * makes scalar loads of them, and no AVX2 machine here measures it. Nor
   * on AMD's AVX-512 (Zen 4): a zmm vpgatherdd is ~32 cycles there, and
   * runs beside nothing, so the loop that divides is the faster (Zen 4,
   * AdamW bf16, 1M params, one thread: 3.29-4.06 -> 2.91-3.24 cycles per
   * element; 16M on two threads, 8.8-10.4 -> 8.2-10.2 ms), and faster
   * again with vcvtneps2bf16 (cvt_pays) */
  if (!e->avx512 || e->amd)
    return;
  uint8_t *cone = calloc((size_t)g->nins + 1, 2), *anc = cone + g->nins;
  ASSERT(cone);
  int best = 0;
  for (Ref u = ph->lo; u < ph->hi; u++) {
    if (!in_body(&g->ins[u]) || g->ins[u].type != TY_BF16)
      continue;
    /* what is computed from u and step values alone */
    memset(cone, 0, (size_t)g->nins);
    for (Ref i = u + 1; i < ph->hi; i++) {
      const Ins *x = &g->ins[i];
      if (!tabulable(x))
        continue;
      if (x->op == OP_CVT && x->type == TY_F32 && x->args[0] == u) {
        cone[i] = 2; /* u as f32: its bits, free in the loop */
        continue;
      }
      bool any = false, ok = true;
      for (int k = 0; k < op_info[x->op].nargs; k++) {
        const Ins *y = &g->ins[x->args[k]];
        if (x->args[k] == u || cone[x->args[k]])
          any = true;
        else if (y->scope != SCOPE_STEP && y->op != OP_CONST)
          ok = false;
      }
      cone[i] = ok && any;
    }
    for (Ref o = u + 1; o < ph->hi; o++) {
      const Ins *x = &g->ins[o];
      if (!cone[o] || x->op != OP_CVT || x->type != TY_BF16)
        continue;
      /* o's own part of the cone: used only within it, and worth a table */
      memset(anc, 0, (size_t)g->nins);
      anc[o] = 1;
      int cost = 0;
      for (Ref i = o; i > u; i--) {
        if (!anc[i])
          continue;
        Op op = (Op)g->ins[i].op;
        cost += op == OP_DIV || op == OP_SQRT || op == OP_SQRT_MKL || op == OP_RSQRT ? 16 : 1;
        for (int k = 0; k < op_info[op].nargs; k++)
          if (cone[g->ins[i].args[k]] == 1)
            anc[g->ins[i].args[k]] = 1;
      }
      bool closed = cost >= 16;
      for (Ref j = ph->lo; closed && j < ph->hi; j++) {
        const Ins *y = &g->ins[j];
        for (int k = 0; k < op_info[y->op].nargs; k++) {
          Ref r = y->args[k];
          if (r == o ? y->op != OP_CVT || y->type != TY_F32 : anc[r] && !anc[j])
            closed = false;
        }
      }
      if (closed && cost > best) {
        best = cost;
        e->tab_u = u, e->tab_o = o;
        for (Ref i = u + 1; i < o; i++)
          e->intab[i] = cone[i] == 2 ? 2 : anc[i];
      }
    }
  }
  free(cone);
}

/* Once per call, in the entry block: whether the call's chunks hold
 * CPU_TABLE_MIN elements, and if so the table (4096 vectors of the cone). */
/* In the entry block: whether the call's chunks hold at least min
 * elements (the sum of their lengths, counted until it gets there). Leaves
 * the builder in a new block, with *from that block. */
static LLVMValueRef call_at_least(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks, long min,
                                  LLVMBasicBlockRef *from) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  LLVMTypeRef chunk_t = chunk_type(e);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
  LLVMBasicBlockRef sum = LLVMAppendBasicBlockInContext(c, fn, "count");
  LLVMBasicBlockRef sum_body = LLVMAppendBasicBlockInContext(c, fn, "count.body");
  LLVMBasicBlockRef count_exit = LLVMAppendBasicBlockInContext(c, fn, "count.exit");
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), one = LLVMConstInt(e->ti64, 1, 0);
  LLVMBuildBr(b, sum);
  LLVMPositionBuilderAtEnd(b, sum);
  LLVMValueRef ci = LLVMBuildPhi(b, e->ti64, "c"), tot = LLVMBuildPhi(b, e->ti64, "n");
  LLVMValueRef big = LLVMBuildICmp(b, LLVMIntSGE, tot, LLVMConstInt(e->ti64, (unsigned long long)min, 0), "");
  LLVMValueRef more = LLVMBuildICmp(b, LLVMIntSLT, ci, nchunks, "");
  LLVMBuildCondBr(b, LLVMBuildAnd(b, more, LLVMBuildNot(b, big, ""), ""), sum_body, count_exit);
  LLVMPositionBuilderAtEnd(b, sum_body);
  LLVMValueRef chp = LLVMBuildGEP2(b, chunk_t, chunks, &ci, 1, "");
  LLVMValueRef len = LLVMBuildLoad2(b, e->ti64, LLVMBuildStructGEP2(b, chunk_t, chp, 3, ""), "len");
  LLVMValueRef cnext = LLVMBuildAdd(b, ci, one, ""), tnext = LLVMBuildAdd(b, tot, len, "");
  LLVMBuildBr(b, sum);
  LLVMAddIncoming(ci, (LLVMValueRef[]){zero, cnext}, (LLVMBasicBlockRef[]){pre, sum_body}, 2);
  LLVMAddIncoming(tot, (LLVMValueRef[]){zero, tnext}, (LLVMBasicBlockRef[]){pre, sum_body}, 2);
  LLVMPositionBuilderAtEnd(b, count_exit);
  *from = count_exit;
  return big;
}

/* The 16 bit patterns 16k .. 16k + 15, as i32 lanes. */
static LLVMValueRef patterns(E *e, LLVMValueRef k) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef lanes[W];
  for (int l = 0; l < W; l++)
    lanes[l] = LLVMConstInt(e->ti32, (unsigned)l, 0);
  LLVMValueRef base = LLVMBuildTrunc(b, LLVMBuildMul(b, k, LLVMConstInt(e->ti64, W, 0), ""), e->ti32, "");
  return LLVMBuildAdd(b, broadcast(e, base), LLVMConstVector(lanes, W), "");
}

/* Once per call, in the entry block: whether the call's chunks hold
 * CPU_TABLE_MIN elements, and if so the table (4096 vectors of the cone). */
static void tab_build(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  LLVMTypeRef tt = LLVMArrayType2(e->ti32, 65536);
  e->tab = LLVMBuildAlloca(b, tt, "tab");
  LLVMSetAlignment(e->tab, 64);
  LLVMBasicBlockRef count_exit;
  LLVMValueRef big = call_at_least(e, fn, chunks, nchunks, CPU_TABLE_MIN, &count_exit);
  LLVMBasicBlockRef build = LLVMAppendBasicBlockInContext(c, fn, "tab.build");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, fn, "tab.done");
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), one = LLVMConstInt(e->ti64, 1, 0);
  e->tab_ok = big;
  LLVMBuildCondBr(b, big, build, done);
  /* the build: vector k holds the patterns 16k .. 16k + 15 */
  LLVMPositionBuilderAtEnd(b, build);
  LLVMValueRef k = LLVMBuildPhi(b, e->ti64, "k");
  splat_step_values(e);
  LLVMValueRef pat = patterns(e, k);
  forget(e);
  e->mask = NULL;
  const Loop lp = {0};
  e->val[e->tab_u] = LLVMBuildTrunc(b, pat, vtype(e, TY_BF16), "");
  e->rnd[e->tab_u] = LLVMBuildShl(b, pat, ci32(e, 16), "");
  for (Ref i = e->tab_u + 1; i <= e->tab_o; i++)
    if (e->intab[i] || i == e->tab_o)
      e->val[i] = emit_ins(e, i, &lp);
  LLVMValueRef at = LLVMBuildMul(b, k, LLVMConstInt(e->ti64, W, 0), "");
  LLVMValueRef st = LLVMBuildStore(b, e->rnd[e->tab_o], LLVMBuildGEP2(b, e->ti32, e->tab, &at, 1, ""));
  LLVMSetAlignment(st, 64);
  LLVMValueRef knext = LLVMBuildAdd(b, k, one, "");
  LLVMAddIncoming(k, (LLVMValueRef[]){zero, knext}, (LLVMBasicBlockRef[]){count_exit, build}, 2);
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, knext, LLVMConstInt(e->ti64, 65536 / W, 0), ""), build, done);
  LLVMPositionBuilderAtEnd(b, done);
  forget(e);
}

/* ---- holds that round no tie ----------------------------------------------------------- */

/* Rounding f32 bits to the nearest bf16, ties to even, is u + 0x7fff + lsb
 * with the lsb (u >> 16) & 1: without AVX-512 the hold is five ops, a
 * shift, an and, two adds and the low half cleared. Half up, u + 0x8000,
 * drops the shift, the and and an add, and gives the same bits unless u's
 * low half is 0x8000, a tie. A bf16 hold of a product, quotient or square
 * root whose only per-element operand is a bf16 value (the for-loop's
 * p * (1 - lr * wd), v * beta2, sqrt(v), d * (1 / bias_correction2_sqrt))
 * has 65536 possible inputs: tie_find finds such holds, and tie_check
 * computes each one's op on all 65536, with the code the loop runs, once
 * per call; where none rounds a tie, the loop rounds them half up
 * (Loop.tie). Ties do occur: v * beta2 has 3062 with beta2 0.95, none
 * with 0.999; d + bf16(eps), a sum of two bf16, has them every step, so
 * sums are left out. Without AVX-512 (a hold is five ops there), and on
 * AMD's AVX-512, which has no table (tab_find) and where a hold is four:
 * AdamW bf16's for-loop bits on Zen 4, 1M params, one thread, 2.80-3.12
 * -> 2.31-2.54 cycles per element. Not on Intel's, unmeasured there: its
 * large calls look the denominator up, which subsumes most of the holds.
 * Returns how many it found. */
static int tie_find(E *e) {
  const Graph *g = e->g;
  for (int i = 0; i < g->nins; i++)
    e->tie[i] = NOREF;
  if (e->avx512 && !e->amd)
    return 0;
  int n = 0;
  uint8_t *grad = calloc((size_t)g->nins + 1, 1); /* a grad, or a hold of one op on one */
  ASSERT(grad);
  for (Ref h = e->ph->lo; h < e->ph->hi; h++) {
    const Ins *x = &g->ins[h];
    if (x->op == OP_LOAD && g->bufs[x->buf].kind == BUF_GRAD)
      grad[h] = 1;
    if (x->op != OP_CVT || x->type != TY_BF16 || !in_body(x))
      continue;
    const Ins *a = &g->ins[x->args[0]];
    /* a product, quotient or square root: an add of two bf16 values is
     * exact in f32, and often a tie (d + bf16(eps) is, every step) */
    bool op_ok = a->op == OP_MUL || a->op == OP_DIV || a->op == OP_SQRT || a->op == OP_SQRT_MKL;
    if (!in_body(a) || a->type != TY_F32 || !op_ok)
      continue;
    Ref src = NOREF;
    bool ok = true;
    for (int k = 0; k < op_info[a->op].nargs; k++) {
      Ref r = a->args[k];
      const Ins *y = &g->ins[r];
      if (!in_body(y))
        ok &= y->scope == SCOPE_STEP; /* not a tensor-scope value: it is loaded per chunk */
      else if (y->op != OP_CVT || g->ins[y->args[0]].type != TY_BF16 || (src != NOREF && src != r))
        ok = false;
      else
        src = r;
    }
    /* not the grads, nor their holds of one op: scale_grads and the clip
     * multiply them by a new value every step, and ties are common there
     * (1 / num_tokens, a power of two, rounds 256 of the 65536 to a tie in
     * the subnormals; the clip's coefficient is a bf16, whose products
     * with a bf16 are exact) */
    if (ok && src != NOREF && grad[g->ins[src].args[0]]) {
      grad[h] = 1;
      continue;
    }
    if (ok && src != NOREF) {
      e->tie[h] = src;
      n++;
    }
  }
  free(grad);
  return n;
}

/* Once per call, in the entry block, after the step values' reciprocals
 * (the loop that rounds half up multiplies by them): whether the call holds
 * CPU_TIE_MIN elements, and if so whether none of tie_find's holds rounds
 * a tie on any of the 65536 inputs (e->tie_ok). */
static void tie_check(E *e, LLVMValueRef fn, LLVMValueRef chunks, LLVMValueRef nchunks) {
  LLVMBuilderRef b = e->b;
  LLVMContextRef c = e->c;
  const Graph *g = e->g;
  LLVMBasicBlockRef count_exit;
  LLVMValueRef big = call_at_least(e, fn, chunks, nchunks, CPU_TIE_MIN, &count_exit);
  LLVMBasicBlockRef check = LLVMAppendBasicBlockInContext(c, fn, "tie.check");
  LLVMBasicBlockRef checked = LLVMAppendBasicBlockInContext(c, fn, "tie.checked");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, fn, "tie.done");
  LLVMValueRef zero = LLVMConstInt(e->ti64, 0, 0), one = LLVMConstInt(e->ti64, 1, 0);
  LLVMTypeRef vb = vec(e->ti1, W);
  LLVMBuildCondBr(b, big, check, done);
  /* vector k: the patterns 16k .. 16k + 15 as f32, into every such op */
  LLVMPositionBuilderAtEnd(b, check);
  LLVMValueRef k = LLVMBuildPhi(b, e->ti64, "k"), acc = LLVMBuildPhi(b, vb, "tie");
  splat_step_values(e);
  for (int r = 0; r < g->nins; r++)
    if (e->recip[r])
      e->rsplat[r] = broadcast(e, e->recip[r]);
  forget(e);
  e->mask = NULL;
  const Loop lp = {.recip = true}; /* as the loop that rounds half up */
  LLVMValueRef f = LLVMBuildBitCast(b, LLVMBuildShl(b, patterns(e, k), ci32(e, 16), ""), vec(e->tf32, W), "");
  LLVMValueRef any = acc;
  for (Ref h = e->ph->lo; h < e->ph->hi; h++) {
    if (e->tie[h] == NOREF)
      continue;
    Ref a = g->ins[h].args[0];
    e->val[e->tie[h]] = f;
    LLVMValueRef u = LLVMBuildBitCast(b, emit_ins(e, a, &lp), vec(e->ti32, W), "");
    LLVMValueRef t = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildAnd(b, u, ci32(e, 0xffff), ""), ci32(e, 0x8000), "");
    any = LLVMBuildOr(b, any, t, "");
  }
  forget(e);
  LLVMValueRef knext = LLVMBuildAdd(b, k, one, "");
  LLVMBasicBlockRef check_end = LLVMGetInsertBlock(b);
  LLVMAddIncoming(k, (LLVMValueRef[]){zero, knext}, (LLVMBasicBlockRef[]){count_exit, check_end}, 2);
  LLVMAddIncoming(acc, (LLVMValueRef[]){LLVMConstNull(vb), any}, (LLVMBasicBlockRef[]){count_exit, check_end}, 2);
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, knext, LLVMConstInt(e->ti64, 65536 / W, 0), ""), check, checked);
  LLVMPositionBuilderAtEnd(b, checked);
  LLVMTypeRef iw = LLVMIntTypeInContext(c, W);
  LLVMValueRef none = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildBitCast(b, any, iw, ""), LLVMConstInt(iw, 0, 0), "");
  LLVMBuildBr(b, done);
  LLVMPositionBuilderAtEnd(b, done);
  e->tie_ok = LLVMBuildPhi(b, e->ti1, "tie.ok");
  LLVMAddIncoming(e->tie_ok, (LLVMValueRef[]){LLVMConstInt(e->ti1, 0, 0), none},
                  (LLVMBasicBlockRef[]){count_exit, checked}, 2);
}

/* tab_o in the loop: its rounded bits from the table, at tab_u's 16 bits. */
static void tab_gather(E *e) {
  LLVMBuilderRef b = e->b;
  Ref u = e->tab_u, o = e->tab_o;
  LLVMValueRef idx = e->rnd[u] ? LLVMBuildLShr(b, e->rnd[u], ci32(e, 16), "")
                               : LLVMBuildZExt(b, operand(e, u), vec(e->ti32, W), "");
  LLVMValueRef ptrs = LLVMBuildGEP2(b, e->ti32, e->tab, &idx, 1, "");
  LLVMValueRef ones[W];
  for (int l = 0; l < W; l++)
    ones[l] = LLVMConstInt(e->ti1, 1, 0);
  LLVMTypeRef over[2] = {vec(e->ti32, W), LLVMTypeOf(ptrs)};
  LLVMValueRef args[4] = {ptrs, LLVMConstInt(e->ti32, 4, 0), LLVMConstVector(ones, W), LLVMGetUndef(vec(e->ti32, W))};
  LLVMValueRef bits = call_intrinsic(e, "llvm.masked.gather", over, 2, args, 4);
  e->rnd[o] = bits;
  e->val[o] = LLVMBuildTrunc(b, LLVMBuildLShr(b, bits, ci32(e, 16), ""), vtype(e, TY_BF16), "");
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

static void forget(E *e) {
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
   * third spills (the bf16 loop went from 207 to 219 instructions) */
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
      if (x->op == OP_DIV || x->op == OP_SQRT || x->op == OP_RSQRT || x->op == OP_SQRT_MKL)
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
static void pipe_iter(E *e, LLVMValueRef *acc, LLVMValueRef k, int lo, int hi, LLVMValueRef *mask,
                      LLVMValueRef *h, LLVMValueRef *hr, const Loop *lp) {
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

/* The loop's iteration k with AVX512-BF16 (no reductions): a fast pass
 * whose stored bf16 round by vcvtneps2bf16 (round_bf16_cvt), then, in
 * the rare iteration where one of them met a NaN or a subnormal, the
 * iteration again the exact way from the same loaded vectors and handed-on
 * values: its stores are written again and what it hands on is the redo's.
 * One branch an iteration, after everything, so the fast pass is one block
 * for the scheduler (a branch at each rounding made the Zen 4 loop 25%
 * slower than no vcvtneps2bf16 at all). */
static void pipe_iter_cvt(E *e, LLVMValueRef fn, LLVMValueRef k, LLVMValueRef *h, LLVMValueRef *hr, const Loop *lp) {
  LLVMBuilderRef b = e->b;
  int ns = e->nstages, nx = e->ncross;
  LLVMValueRef *in = calloc((size_t)(2 * ns * nx + 2 * nx + 1), sizeof(LLVMValueRef)), *fast = in + 2 * ns * nx;
  ASSERT(in);
  memcpy(in, h, sizeof(LLVMValueRef) * (size_t)(2 * ns * nx));
  Loop fast_pass = *lp, redo_pass = *lp;
  fast_pass.cvt = true;
  redo_pass.reuse_loads = true;
  e->special = NULL;
  pipe_iter(e, NULL, k, 0, ns - 1, NULL, h, hr, &fast_pass);
  if (!e->special) { /* nothing stored is bf16 */
    free(in);
    return;
  }
  memcpy(fast, h, sizeof(LLVMValueRef) * (size_t)nx);
  memcpy(fast + nx, hr, sizeof(LLVMValueRef) * (size_t)nx);
  LLVMValueRef any = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildBitCast(b, e->special, e->ti16, ""),
                                   LLVMConstInt(e->ti16, 0, 0), "");
  LLVMBasicBlockRef at = LLVMGetInsertBlock(b);
  LLVMBasicBlockRef redo = LLVMAppendBasicBlockInContext(e->c, fn, "pipe.exact");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(e->c, fn, "pipe.next");
  LLVMValueRef br = LLVMBuildCondBr(b, any, redo, join);
  LLVMMetadataRef w[3] = {LLVMMDStringInContext2(e->c, "branch_weights", 14),
                          LLVMValueAsMetadata(LLVMConstInt(e->ti32, 1, 0)),
                          LLVMValueAsMetadata(LLVMConstInt(e->ti32, 1 << 20, 0))};
  LLVMSetMetadata(br, LLVMGetMDKindIDInContext(e->c, "prof", 4),
                  LLVMMetadataAsValue(e->c, LLVMMDNodeInContext2(e->c, w, 3)));
  LLVMPositionBuilderAtEnd(b, redo);
  memcpy(h, in, sizeof(LLVMValueRef) * (size_t)(2 * ns * nx));
  pipe_iter(e, NULL, k, 0, ns - 1, NULL, h, hr, &redo_pass);
  LLVMBasicBlockRef redo_end = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, join);
  LLVMPositionBuilderAtEnd(b, join);
  for (int q = 0; q < 2 * nx; q++) {
    LLVMValueRef *slot = q < nx ? &h[q] : &hr[q - nx];
    if (!fast[q] && !*slot)
      continue;
    ASSERT(fast[q] && *slot && LLVMTypeOf(fast[q]) == LLVMTypeOf(*slot));
    LLVMValueRef p = LLVMBuildPhi(b, LLVMTypeOf(fast[q]), "");
    LLVMAddIncoming(p, (LLVMValueRef[]){fast[q], *slot}, (LLVMBasicBlockRef[]){at, redo_end}, 2);
    *slot = p;
  }
  free(in);
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
 * stages are apart. Three stages (the bf16 for-loop AdamW's sqrt, and
 * divide, in stages of their own) against two: 64M params, 2 threads,
 * 35.7-36.0 -> 33.3-33.6 ms for-loop bits, 31.8-32.4 -> 30.2-30.3 fused;
 * four were ~2% faster again but compiled the Scout recipe in 51 ms. */
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

/* ---- a divide by a step value, as a multiply where that is exact ---------------------- */

/* Whether div i is d / c in f32 with c a step value, d a bf16 hold of a
 * square root, and every use of the quotient a rounding to bf16: the
 * for-loop AdamW's exp_avg_sq.sqrt() / bias_correction2_sqrt on bf16
 * tensors. Then bf16(d * RN(1/c)) is bf16(d / c) for every d as soon as it
 * is for the 128 significands of a bf16 in [1, 2), with c in [2^-40,
 * 2^40]: d is a zero, an Inf or a NaN (the same either way, c > 0), or a
 * normal in [2^-76, 2^65] (an f32's square root in 8 bits), so the
 * quotient and the product are normal, and scaling d by 2^k scales both
 * and their roundings by 2^k. recip_check tests the 128 once per call (a
 * thread's share of a step); the loop multiplies only where they agree. */
static bool recip_div(const Graph *g, Ref i) {
  const Ins *x = &g->ins[i];
  if (x->op != OP_DIV || x->type != TY_F32 || !in_body(x))
    return false;
  const Ins *c = &g->ins[x->args[1]], *h = &g->ins[x->args[0]];
  if (c->scope != SCOPE_STEP || c->type != TY_F32 || h->op != OP_CVT || h->type != TY_F32 || !in_body(h))
    return false;
  const Ins *y = &g->ins[h->args[0]];
  if (y->op != OP_CVT || y->type != TY_BF16 || !in_body(y))
    return false;
  const Ins *z = &g->ins[y->args[0]];
  if ((z->op != OP_SQRT && z->op != OP_SQRT_MKL) || z->type != TY_F32 || !in_body(z))
    return false;
  for (Ref u = i + 1; u < g->nins; u++)
    for (int k = 0; k < op_info[g->ins[u].op].nargs; k++)
      if (g->ins[u].args[k] == i && (g->ins[u].op != OP_CVT || g->ins[u].type != TY_BF16))
        return false;
  return true;
}

/* Whether bf16(m / c) == bf16(m * r) for the 128 significands m of a bf16
 * in [1, 2), and c is in [2^-40, 2^40] (not for a NaN): an i1. */
static LLVMValueRef recip_check(E *e, LLVMValueRef c, LLVMValueRef r) {
  LLVMBuilderRef b = e->b;
  LLVMTypeRef iw = LLVMIntTypeInContext(e->c, W);
  LLVMValueRef cs = broadcast(e, c), rs = broadcast(e, r), differ = NULL;
  for (int k = 0; k < 128; k += W) {
    LLVMValueRef m[W];
    for (int l = 0; l < W; l++)
      m[l] = LLVMConstReal(e->tf32, 1.0 + (k + l) / 128.0);
    LLVMValueRef mv = LLVMConstVector(m, W);
    LLVMValueRef q = LLVMBuildBitCast(b, LLVMBuildFDiv(b, mv, cs, ""), vec(e->ti32, W), "");
    LLVMValueRef p = LLVMBuildBitCast(b, LLVMBuildFMul(b, mv, rs, ""), vec(e->ti32, W), "");
    LLVMValueRef ne = LLVMBuildICmp(b, LLVMIntNE, bf16_round_bits(e, q), bf16_round_bits(e, p), "");
    differ = differ ? LLVMBuildOr(b, differ, ne, "") : ne;
  }
  LLVMValueRef same = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildBitCast(b, differ, iw, ""), LLVMConstInt(iw, 0, 0), "");
  LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOGE, c, LLVMConstReal(e->tf32, 0x1p-40), ""),
                                 LLVMBuildFCmp(b, LLVMRealOLE, c, LLVMConstReal(e->tf32, 0x1p40), ""), "");
  return LLVMBuildAnd(b, in, same, "");
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
  tab_find(e);
  e->perm_ok = perm_find(e);
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
  for (Ref i = ph->lo; i < ph->hi && e->tab_o == NOREF; i++) /* a table subsumes it */
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
  if (tie_find(e))
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
    e->bufptr[bi] = LLVMBuildGEP2(b, scalar_type(e, (Type)g->bufs[bi].type), base, &e->start, 1, "");
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
     * the dividing loop below, not pipelined (the Scout recipe compiles in
     * 42-45 ms cold; with a third loop, recip_div's, in 52-58) */
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
     * divides, in a loop that is not pipelined: it compiles in half the
     * time (the Scout recipe's step in 41 ms cold, not 53) */
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
