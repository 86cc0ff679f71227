/* numerics.h: the bit-level arithmetic every backend must agree on.
 *
 * The reference interpreter, the eager executor, the LLVM backend and the
 * CUDA emitter all round, convert and hash exactly as written here. This
 * header is plain C that also compiles as CUDA C: the CUDA emitter pastes it
 * into every generated kernel source, and the LLVM emitter builds the same
 * integer sequences.
 *
 * Rounding to 16-bit floats:
 * - bf16 and f16, round to nearest even; overflow gives infinity.
 * - A NaN becomes the canonical quiet NaN of the target with its sign
 *   (bf16 0x7fc0, f16 0x7e00), so that every backend gives the same bits.
 * - Stochastic rounding rounds |x| up to the next representable magnitude
 *   with probability (|x| - trunc(|x|)) / ulp, from 32 bits of a
 *   counter-based hash of (seed, step, tensor index, element index).
 *
 * torch's own arithmetic, where it is not one IEEE op (tests/torch/probe_ops.py
 * found each of these by running torch):
 * - lerp: torch's CPU lerp is one fused multiply-add, in its vector loops
 *   and its scalar tails alike.
 * - sqrt_mkl: torch's f32 tensor sqrt is MKL's, which on AVX-512 is not
 *   correctly rounded (numerics_mkl.h).
 * - tailpos: where torch's CPU loops leave an element to scalar code, which
 *   for some ops on bf16 and f16 rounds differently from the vector code.
 */
#ifndef OPTC_NUMERICS_H
#define OPTC_NUMERICS_H

#ifndef __CUDACC_RTC__
#include <math.h>
#include <stdint.h>
#include <string.h>
#else /* NVRTC has no <stdint.h> */
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#endif

#ifdef __CUDACC__
#define OPTC_FN static __device__ __forceinline__
#else
#define OPTC_FN static inline
#endif

/* Every reduction sums fixed blocks of this many elements of a group's flat
 * buffer (also cut where a tensor ends) in f64, element by element, and
 * then sums the block partials in order. Shards, threads and GPU blocks all
 * start on a multiple of it, so the result is the same for any world size
 * and any thread count. */
#define OPTC_REDUCE_BLOCK 4096
/* Within a chunk, element j is summed into lane j % OPTC_REDUCE_LANES, each
 * lane in element order, in f64; the chunk's partial is then the lanes
 * combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Independent lanes let a
 * CPU keep them in one vector register (and a GPU in eight threads); the
 * fixed combine keeps every backend's bits the same. */
#define OPTC_REDUCE_LANES 8
/* Each tensor starts at a multiple of this many elements in a flat buffer:
 * 64 bytes of f32, so vector loads are aligned. */
#define OPTC_TENSOR_ALIGN 16

OPTC_FN uint32_t optc_f32_bits(float f) {
#ifdef __CUDACC__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

OPTC_FN float optc_bits_f32(uint32_t u) {
#ifdef __CUDACC__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

OPTC_FN double optc_max_nan(double a, double b) { return a != a ? a : b != b ? b : (a < b ? b : a); }

/* The chunk partial from its lanes: sums (is_max 0) or maxima (is_max 1). */
OPTC_FN double optc_lanes_combine(const double *l, int is_max) {
  if (is_max)
    return optc_max_nan(optc_max_nan(optc_max_nan(l[0], l[1]), optc_max_nan(l[2], l[3])),
                        optc_max_nan(optc_max_nan(l[4], l[5]), optc_max_nan(l[6], l[7])));
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* ---- bf16 ---------------------------------------------------------------- */
OPTC_FN float optc_bf16_to_f32(uint16_t h) { return optc_bits_f32((uint32_t)h << 16); }

OPTC_FN uint16_t optc_f32_to_bf16(float f) {
  uint32_t u = optc_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- f16 ------------------------------------------------------------------ */
OPTC_FN float optc_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f)
    return optc_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) /* zero or subnormal: m * 2^-24, exact in f32 */
    return optc_bits_f32(sign) + (sign ? -1.0f : 1.0f) * ((float)m * 5.9604644775390625e-8f);
  return optc_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* |x| below 2^-14, as a count of f16 subnormal steps (2^-24), rounded to
 * nearest even by the 2^23 trick; exact since |x| * 2^24 < 1024. */
OPTC_FN uint32_t optc_f16_subnormal_rne(uint32_t ax) {
  float q = optc_bits_f32(ax) * 16777216.0f;
  float big = 8388608.0f;
  return (uint32_t)((q + big) - big);
}

OPTC_FN uint16_t optc_f32_to_f16(float f) {
  uint32_t u = optc_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) /* >= 65520: rounds to infinity */
    return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) /* below 2^-14: zero or subnormal */
    return (uint16_t)(sign | optc_f16_subnormal_rne(ax));
  ax += 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | ((ax - (112u << 23)) >> 13));
}

/* ---- torch's sqrt of an f32 tensor on AVX-512: MKL's ------------------------- */
#include "numerics_mkl.h"

/* ---- torch's lerp ---------------------------------------------------------- */
/* torch.lerp(a, b, w) on the CPU: a + w*(b - a) when |w| < 0.5, else
 * b - (b - a)*(1 - w), each one fused multiply-add (the second as
 * fma(w - 1, b - a, b)). */
OPTC_FN float optc_lerpf(float a, float b, float w) {
  float d = b - a;
  return (w < 0.5f && w > -0.5f) ? fmaf(w, d, a) : fmaf(w - 1.0f, d, b);
}

OPTC_FN double optc_lerpd(double a, double b, double w) {
  double d = b - a;
  return (w < 0.5 && w > -0.5) ? fma(w, d, a) : fma(w - 1.0, d, b);
}

/* ---- torch's CPU loops --------------------------------------------------------
 * An elementwise op on a contiguous tensor of n elements runs, in torch,
 * over `threads` ranges when n >= OPTC_TORCH_GRAIN (at::parallel_for:
 * min(threads, ceil(n / grain)) ranges of ceil(n / ranges) elements), each
 * range in vector iterations of `width` elements and then a scalar
 * remainder (TensorIterator's vectorized_loop). Returns element i's offset
 * into its range's remainder, or -1 when a vector iteration computes it. */
#define OPTC_TORCH_GRAIN 32768

OPTC_FN int64_t optc_tailpos(int64_t i, int64_t n, int64_t width, int64_t threads) {
  int64_t b = 0, e = n;
  if (threads > 1 && n >= OPTC_TORCH_GRAIN) {
    int64_t ranges = (n + OPTC_TORCH_GRAIN - 1) / OPTC_TORCH_GRAIN;
    if (ranges > threads)
      ranges = threads;
    int64_t size = (n + ranges - 1) / ranges;
    b = i / size * size;
    e = b + size < n ? b + size : n;
  }
  if (width < 1)
    width = 1;
  int64_t body = b + (e - b) / width * width;
  return i < body ? -1 : i - body;
}

/* ---- the stochastic-rounding hash ---------------------------------------- */
/* lowbias32 (C. Wellons): a 32-bit mixer with good avalanche. */
OPTC_FN uint32_t optc_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* One key per (seed, step, tensor): computed once per tensor per step. */
OPTC_FN uint32_t optc_sr_key(uint64_t seed, uint64_t step, uint32_t tensor) {
  uint32_t k = optc_mix32((uint32_t)seed ^ 0x9e3779b9u);
  k = optc_mix32(k ^ (uint32_t)(seed >> 32));
  k = optc_mix32(k ^ (uint32_t)step);
  k = optc_mix32(k ^ (uint32_t)(step >> 32));
  return optc_mix32(k ^ tensor);
}

/* 32 random bits for element i (counted within its tensor). */
OPTC_FN uint32_t optc_sr_bits(uint32_t key, uint64_t i) {
  uint32_t lo = (uint32_t)i, hi = (uint32_t)(i >> 32);
  return optc_mix32(key ^ optc_mix32(lo ^ (hi * 0x85ebca6bu)));
}

OPTC_FN uint16_t optc_f32_to_bf16_sr(float f, uint32_t bits) {
  uint32_t u = optc_f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) /* Inf and NaN round as usual */
    return optc_f32_to_bf16(f);
  /* Adding below the kept bits and truncating rounds the magnitude up with
   * probability equal to the dropped fraction. */
  return (uint16_t)((u + (bits & 0xffffu)) >> 16);
}

OPTC_FN uint16_t optc_f32_to_f16_sr(float f, uint32_t bits) {
  uint32_t u = optc_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t ax = u & 0x7fffffffu;
  if (ax >= 0x7f800000u || ax >= 0x47800000u) /* NaN, Inf, or >= 65536 */
    return optc_f32_to_f16(f);
  if (ax < 0x38800000u) {
    /* Subnormal range: q = |x| / 2^-24 and its fraction are exact in f32;
     * round q up when 24 random bits, as a fraction, fall below it. */
    float q = optc_bits_f32(ax) * 16777216.0f;
    float big = 8388608.0f;
    float fl = (q + big) - big;
    if (fl > q)
      fl -= 1.0f; /* the 2^23 trick rounds to nearest; we need the floor */
    float frac = q - fl;
    float r = (float)(bits >> 8) * 5.9604644775390625e-8f;
    uint32_t n = (uint32_t)fl + (r < frac ? 1u : 0u);
    return (uint16_t)(sign | n);
  }
  /* Normal range: add random bits below the 10 kept mantissa bits, then
   * truncate; the result is exactly an f16 value (or 65536, which is inf). */
  uint32_t t = (ax + (bits & 0x1fffu)) & ~0x1fffu;
  return optc_f32_to_f16(optc_bits_f32(sign ? t | 0x80000000u : t));
}

#endif
