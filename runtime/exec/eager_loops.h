/* eager_loops.h: the eager executor's typed loops, one per op and type.
 *
 * Each loop is one op over a block of contiguous elements, written so that
 * the C compiler vectorizes it (eager.c is built -O3 -march=native): no
 * per-element dispatch, no calls. The arithmetic is the interpreter's,
 * operation for operation: -ffp-contract=off, and fmaf only where the IR
 * says fma (lerp and fma). The output may be the same memory as an input
 * (an in-place op), element for element, never shifted: hence ivdep.
 * Included by eager.c only. */
#ifndef OPTC_EAGER_LOOPS_H
#define OPTC_EAGER_LOOPS_H

#include "exec.h"

#include <math.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef struct {
  const void *p; /* the block's first element, or NULL for a scalar */
  Scalar s;
  Type t;
} Operand;

#define IVDEP _Pragma("GCC ivdep")

#define BIN_F32(EXPR) \
  do { \
    const float *a = A.p, *b = B.p; \
    float av = A.s.f, bv = B.s.f; \
    if (a && b) { IVDEP for (int64_t i = 0; i < n; i++) { float x = a[i], y = b[i]; o[i] = (EXPR); } } \
    else if (a) { IVDEP for (int64_t i = 0; i < n; i++) { float x = a[i], y = bv; o[i] = (EXPR); } } \
    else { IVDEP for (int64_t i = 0; i < n; i++) { float x = av, y = b[i]; o[i] = (EXPR); } } \
  } while (0)

#define UN_F32(EXPR) \
  do { \
    const float *a = A.p; \
    IVDEP for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); } \
  } while (0)

/* optc_rsqrt14_f32 of a positive normal x without branches (what
 * VRSQRT14PS computes), so that it vectorizes where AVX-512 is absent; any
 * other x gives some value that the caller discards. */
static inline float eager_rsqrt14_normal(float x) {
  uint32_t u = optc_f32_bits(x);
  uint32_t b = (u >> 23) + 64, f = u & 0x007fffffu;
  uint32_t ex = 222u - ((b + 1) >> 1);
  uint32_t k = optc_rsqrt14_tab[((b & 1) << 5) | ((f >> 18) & 31u)];
  int t = (int)((f >> 8) & 0x3ffu) - 512;
  int v = (int)(k >> 10) * 128 - (int)(k & 0x3ffu) * t;
  uint32_t r = (ex << 23) | ((((uint32_t)v >> 9) & 0xffffu) << 7);
  return optc_bits_f32(f == 0 && (b & 1) ? (ex + 1) << 23 : r);
}

/* optc_sqrt_mkl_f32 (torch's f32 sqrt on AVX-512) on every lane at once:
 * the same rsqrt14, the same two fmas and the same scaling, then its
 * special cases chosen by select instead of branches. */
static inline float eager_sqrt_mkl_lane(float x) {
  uint32_t u = optc_f32_bits(x), mag = u & 0x7fffffffu;
  bool small = u < 0x0c800000u; /* x < 2^-102 */
  float xs = small ? x * optc_bits_f32(0x57800000u) : x;
  float y = eager_rsqrt14_normal(xs);
  float s = xs * y, h = 0.5f * y;
  float e = fmaf(-s, s, xs);
  float r = fmaf(e, h, s);
  r = small ? r * optc_bits_f32(0x33800000u) : r;
  r = (u >> 31) ? optc_bits_f32(0x7fc00000u) : r;
  r = mag == 0 || u == 0x7f800000u ? x : r;
  return mag > 0x7f800000u ? optc_bits_f32(u | 0x00400000u) : r;
}

static void eager_sqrt_mkl(float *o, const float *a, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  /* VRSQRT14PS itself, as the compiled step uses it (emit_llvm.c's sqrt_mkl) */
  const __m512i small_lim = _mm512_set1_epi32(0x0c800000), absm = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x00400000);
  const __m512 up = _mm512_castsi512_ps(_mm512_set1_epi32(0x57800000));
  const __m512 down = _mm512_castsi512_ps(_mm512_set1_epi32(0x33800000));
  const __m512 half = _mm512_set1_ps(0.5f), nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(a + i);
    __m512i u = _mm512_castps_si512(x), mag = _mm512_and_si512(u, absm);
    __mmask16 small = _mm512_cmplt_epu32_mask(u, small_lim);
    __m512 xs = _mm512_mask_mul_ps(x, small, x, up);
    __m512 y = _mm512_rsqrt14_ps(xs);
    __m512 s = _mm512_mul_ps(xs, y), h = _mm512_mul_ps(half, y);
    __m512 e = _mm512_fnmadd_ps(s, s, xs); /* fma(-s, s, xs) */
    __m512 r = _mm512_fmadd_ps(e, h, s);
    r = _mm512_mask_mul_ps(r, small, r, down);
    r = _mm512_mask_mov_ps(r, _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512()), nan);
    __mmask16 keep = _mm512_cmpeq_epi32_mask(mag, _mm512_setzero_si512()) | _mm512_cmpeq_epi32_mask(u, inf);
    r = _mm512_mask_mov_ps(r, keep, x);
    r = _mm512_mask_mov_ps(r, _mm512_cmpgt_epu32_mask(mag, inf), _mm512_castsi512_ps(_mm512_or_si512(u, quiet)));
    _mm512_storeu_ps(o + i, r);
  }
  for (; i < n; i++)
    o[i] = optc_sqrt_mkl_f32(a[i]);
#else
  IVDEP for (; i < n; i++) o[i] = eager_sqrt_mkl_lane(a[i]);
#endif
}

/* One f32 op over n elements into o; false: not one of these. */
static bool eager_f32(Op op, float *o, Operand A, Operand B, Operand C, int64_t n) {
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
  case OP_SQRT_MKL: if (!A.p) return false; eager_sqrt_mkl(o, A.p, n); return true;
  case OP_SQRT_MKL_EX: if (!A.p) return false; UN_F32(optc_sqrt_mkl_ex_f32(x)); return true;
  case OP_FMA: {
    if (!A.p || !B.p || !C.p || B.t != TY_F32 || C.t != TY_F32)
      return false;
    const float *a = A.p, *b = B.p, *c = C.p;
    IVDEP for (int64_t i = 0; i < n; i++) o[i] = fmaf(a[i], b[i], c[i]);
    return true;
  }
  case OP_LERP: {
    /* torch.lerp with a scalar weight, both ends tensors: optc_lerpf with
     * its branch on the weight taken once */
    if (!A.p || !B.p || C.p || B.t != TY_F32 || C.t != TY_F32)
      return false;
    const float *a = A.p, *b = B.p;
    float w = C.s.f;
    if (w < 0.5f && w > -0.5f) {
      IVDEP for (int64_t i = 0; i < n; i++) o[i] = fmaf(w, b[i] - a[i], a[i]);
    } else {
      float w1 = w - 1.0f;
      IVDEP for (int64_t i = 0; i < n; i++) o[i] = fmaf(w1, b[i] - a[i], b[i]);
    }
    return true;
  }
  default: return false;
  }
}

/* The float conversions between f32 and bf16 or f16; false: another pair. */
static bool eager_cvt(void *o, Type to, const void *src, Type from, int64_t n) {
  if (from == TY_BF16 && to == TY_F32) {
    const uint16_t *a = src;
    float *out = o;
    IVDEP for (int64_t i = 0; i < n; i++) out[i] = optc_bf16_to_f32(a[i]);
    return true;
  }
  if (from == TY_F32 && to == TY_BF16) {
    const float *a = src;
    uint16_t *out = o;
    IVDEP for (int64_t i = 0; i < n; i++) out[i] = optc_f32_to_bf16(a[i]);
    return true;
  }
  if (from == TY_F16 && to == TY_F32) {
    const uint16_t *a = src;
    float *out = o;
    IVDEP for (int64_t i = 0; i < n; i++) out[i] = optc_f16_to_f32(a[i]);
    return true;
  }
  if (from == TY_F32 && to == TY_F16) {
    const float *a = src;
    uint16_t *out = o;
    IVDEP for (int64_t i = 0; i < n; i++) out[i] = optc_f32_to_f16(a[i]);
    return true;
  }
  return false;
}

/* A reduction's lanes over n f32 elements, element j into lane j % 8 (the
 * block starts on a multiple of 8 within its chunk), each lane in element
 * order, in f64: interp's partials. */
static void eager_reduce_f32(RedKind k, double *lanes, const float *a, int64_t n) {
  int64_t j = 0;
  switch (k) {
  case RED_SUM:
    for (; j + OPTC_REDUCE_LANES <= n; j += OPTC_REDUCE_LANES)
      for (int l = 0; l < OPTC_REDUCE_LANES; l++) lanes[l] += (double)a[j + l];
    for (; j < n; j++) lanes[j % OPTC_REDUCE_LANES] += (double)a[j];
    return;
  case RED_SUMSQ:
    for (; j + OPTC_REDUCE_LANES <= n; j += OPTC_REDUCE_LANES)
      for (int l = 0; l < OPTC_REDUCE_LANES; l++) {
        double v = (double)a[j + l];
        lanes[l] += v * v;
      }
    for (; j < n; j++) {
      double v = (double)a[j];
      lanes[j % OPTC_REDUCE_LANES] += v * v;
    }
    return;
  case RED_MAX:
    for (; j < n; j++) lanes[j % OPTC_REDUCE_LANES] = optc_max_nan(lanes[j % OPTC_REDUCE_LANES], (double)a[j]);
    return;
  case RED_ABSMAX:
    for (; j < n; j++)
      lanes[j % OPTC_REDUCE_LANES] = optc_max_nan(lanes[j % OPTC_REDUCE_LANES], fabs((double)a[j]));
    return;
  default: unreachable();
  }
}

#endif
