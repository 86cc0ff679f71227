/* numerics_mkl.h: torch's CPU sqrt for f32, bit for bit, where torch calls
 * Intel MKL (VML vsSqrt, high accuracy) on an AVX-512 CPU.
 *
 * numerics.h includes this after its bf16/f16 helpers: it uses
 * optc_f32_bits, optc_bits_f32 and OPTC_FN from there. Like numerics.h it
 * is plain C99 that also compiles as CUDA C, and calls no libm.
 *
 * Why: MKL's sqrt is not IEEE sqrt. About 0.6% of the f32 inputs come out
 * 1 ulp low (the largest error is 0.56 ulp), so a backend that wants
 * torch's bits on such a machine must compute what MKL computes.
 *
 * What MKL computes, for x in [2^-102, FLT_MAX]:
 *
 *   y = rsqrt14(x)          VRSQRT14PS, an approximation of 1/sqrt(x)
 *   s = x * y               rounded to f32
 *   h = 0.5f * y            exact
 *   e = fma(-s, s, x)       x - s*s, rounded once
 *   r = fma(e, h, s)        s + e*h, rounded once
 *
 * Below 2^-102 (bits < 0x0c800000, subnormals included) e would lose bits
 * to underflow, so the input is scaled by a power of 4 first:
 * sqrt(x) = sqrt(x * 2^48) * 2^-24, both multiplications exact. The
 * outputs cannot tell MKL's own threshold and scale apart from these: any
 * threshold from 0x0c800000 up and any scale 4^k with 13 <= k <= 50 (as
 * far as was tried) give the same bits; k = 12 does not (two subnormals).
 * The unscaled sequence differs from torch below 2^-102 (5.8 million
 * inputs), the highest being 0x0c7fffff.
 *
 * Special cases (everything above is for finite x > 0):
 *   +0, -0, +inf    x itself (the sequence would give NaN from 0 * inf)
 *   x < 0           0x7fc00000, a positive quiet NaN; -inf and negative
 *                   subnormals too (x86's own default NaN is 0xffc00000)
 *   NaN             x quieted: x | 0x00400000, sign and payload kept
 *
 * rsqrt14, as VRSQRT14PS computes it with DAZ and FTZ off (Intel's
 * reference model, RECIP14.c, 2015, BSD-licensed; a copy ships in
 * Valgrind's sources). Write a positive finite x as 4^n * z, z in [1, 4).
 * [1, 2) and [2, 4) are each cut into 32 equal segments, and on each
 * rsqrt(z) is a line c - d * (z - mid), mid the segment's middle, z
 * truncated to 16 significant bits, the result truncated to 17 significant
 * bits. In integers, with z's 23 fraction bits f:
 *
 *   t = ((f >> 8) & 0x3ff) - 512      z - mid, in units of 2^-15 on [1, 2)
 *                                     and 2^-14 on [2, 4)
 *   v = 128 * c - d * t               rsqrt(z) * 2^26, in [2^25, 2^26)
 *   rsqrt14(x) = (v & ~0x1ff) * 2^-26 * 2^-n
 *
 * For a normal x the segment is bits 23..18 of x: bit 23, the exponent's
 * lowest bit, is 1 for z in [1, 2) and 0 for [2, 4); bits 22..18 are f's
 * top five. z = 1 exactly (x a power of 4) gives exactly 2^-n. A subnormal
 * is first normalized. Then: +-0 gives +-inf, +inf gives +0, any other
 * x < 0 the default NaN 0xffc00000, and a NaN is quieted (x | 0x00400000).
 * The 64 (c, d) pairs below are the 128 coefficients of RECIP14.c's
 * RSQRT14_Coeff table, reordered by that 6-bit index.
 *
 * Verified on an Intel Xeon with AVX-512 (MKL 2024.2 in torch 2.15.0):
 * - optc_rsqrt14_f32 against _mm512_rsqrt14_ps on all 2^32 inputs, NaNs
 *   included, bit for bit: 0 mismatches;
 * - optc_sqrt_mkl_f32 against torch.sqrt of a contiguous f32 tensor
 *   (torch.set_num_threads(2), chunks of 2^26) on all 2^32 inputs: 0
 *   mismatches; strided, small and in-place tensors, and x ** 0.5, take
 *   the same MKL path;
 * - optc_fma_f32's host path against the FMA instruction on 1.7e8 inputs
 *   chosen near cancellation, halfway cases and subnormal results.
 * tests/torch/probe_sqrt.py repeats the first two (--all for all inputs).
 *
 * torch's sqrt with MKL_ENABLE_INSTRUCTIONS set (same special cases and
 * NaNs as above; not reproduced here, since both start from rsqrtps, whose
 * 12-bit result is not specified bit for bit and differs between vendors):
 * - AVX2: IEEE sqrt on subnormals and on [2^-104, FLT_MAX] (all inputs
 *   checked), but not on [2^-126, 2^-104), where 1887413 inputs are 1 ulp
 *   off. It computes, as checked on all of [1, 4) and on every third
 *   positive normal (7.1e8 inputs):
 *     y = rsqrtps(x); s = x*y; h = 0.5f*y; e = fma(-s, h, 0.5f);
 *     s1 = fma(s, e, s); h1 = fma(h, e, h); d = fma(-s1, s1, x);
 *     r = fma(d, h1, s1)
 *   presumably off for tiny x because its residual d underflows.
 * - SSE4_2: the same sequence with every product and sum rounded apart
 *   (no FMA), 1 ulp off IEEE on 17% of [1, 4); checked on all of [1, 4)
 *   and on 2^24 random inputs in [2^-100, 0x7f7ff000]. Subnormals and
 *   x >= 0x7f7ff001 get IEEE sqrt; normals below 2^-100 were not studied.
 */
#ifndef OPTC_NUMERICS_MKL_H
#define OPTC_NUMERICS_MKL_H

/* a*b + c rounded once. On the host without libm: the product of two f32
 * is exact in f64; the f64 sum is made round-to-odd from its exact error
 * (TwoSum), and round-to-odd in 53 bits then round-to-nearest-even in 24
 * is the correctly rounded result (Boldo and Melquiond, 2008). */
OPTC_FN float optc_fma_f32(float a, float b, float c) {
#ifdef __CUDACC__
  return fmaf(a, b, c);
#else
  double p = (double)a * (double)b, dc = (double)c;
  double s = p + dc, bb = s - p;
  double err = (p - (s - bb)) + (dc - bb);
  uint64_t sb;
  memcpy(&sb, &s, 8);
  if (err != 0 && !(sb & 1) && (sb & 0x7ff0000000000000ull) != 0x7ff0000000000000ull) {
    sb += (err > 0) == (s > 0) ? 1 : (uint64_t)-1; /* one ulp toward the exact sum */
    memcpy(&s, &sb, 8);
  }
  return (float)s;
#endif
}

/* ---- rsqrt14 ---------------------------------------------------------------- */
/* (c, d) of each segment as c << 10 | d: c < 2^19, d < 2^10. */
#define OPTC_RSQ14(c, d) (((uint32_t)(c) << 10) | (uint32_t)(d))

#ifdef __CUDACC__
#define OPTC_TABLE static __device__ const
#else
#define OPTC_TABLE static const
#endif

/* Indexed by bits 23..18 of a normal x: 0..31 are z in [2, 4), 32..63 are
 * z in [1, 2), each in order of z. */
OPTC_TABLE uint32_t optc_rsqrt14_tab[64] = {
    OPTC_RSQ14(367881,  707), OPTC_RSQ14(362349,  675), OPTC_RSQ14(357056,  647), OPTC_RSQ14(351992,  619),
    OPTC_RSQ14(347136,  595), OPTC_RSQ14(342475,  571), OPTC_RSQ14(337997,  549), OPTC_RSQ14(333693,  527),
    OPTC_RSQ14(329545,  509), OPTC_RSQ14(325551,  491), OPTC_RSQ14(321697,  473), OPTC_RSQ14(317977,  457),
    OPTC_RSQ14(314385,  441), OPTC_RSQ14(310910,  427), OPTC_RSQ14(307549,  413), OPTC_RSQ14(304295,  401),
    OPTC_RSQ14(301139,  389), OPTC_RSQ14(298079,  377), OPTC_RSQ14(295115,  365), OPTC_RSQ14(292237,  355),
    OPTC_RSQ14(289439,  345), OPTC_RSQ14(286722,  335), OPTC_RSQ14(284080,  325), OPTC_RSQ14(281508,  317),
    OPTC_RSQ14(279006,  309), OPTC_RSQ14(276569,  301), OPTC_RSQ14(274195,  293), OPTC_RSQ14(271882,  285),
    OPTC_RSQ14(269625,  279), OPTC_RSQ14(267425,  271), OPTC_RSQ14(265276,  265), OPTC_RSQ14(263178,  259),
    OPTC_RSQ14(520261, 1001), OPTC_RSQ14(512437,  955), OPTC_RSQ14(504953,  915), OPTC_RSQ14(497790,  877),
    OPTC_RSQ14(490922,  841), OPTC_RSQ14(484331,  807), OPTC_RSQ14(478001,  775), OPTC_RSQ14(471909,  747),
    OPTC_RSQ14(466046,  719), OPTC_RSQ14(460397,  693), OPTC_RSQ14(454947,  669), OPTC_RSQ14(449688,  647),
    OPTC_RSQ14(444606,  625), OPTC_RSQ14(439694,  603), OPTC_RSQ14(434939,  585), OPTC_RSQ14(430335,  567),
    OPTC_RSQ14(425875,  549), OPTC_RSQ14(421551,  533), OPTC_RSQ14(417355,  517), OPTC_RSQ14(413284,  501),
    OPTC_RSQ14(409329,  487), OPTC_RSQ14(405487,  473), OPTC_RSQ14(401748,  461), OPTC_RSQ14(398111,  449),
    OPTC_RSQ14(394571,  437), OPTC_RSQ14(391127,  425), OPTC_RSQ14(387770,  415), OPTC_RSQ14(384498,  403),
    OPTC_RSQ14(381307,  393), OPTC_RSQ14(378194,  385), OPTC_RSQ14(375155,  375), OPTC_RSQ14(372190,  367),
};

/* VRSQRT14PS, one lane. Integer ops only, so the FP environment does not
 * matter (the instruction's DAZ-off behaviour is what is modelled). */
OPTC_FN float optc_rsqrt14_f32(float x) {
  uint32_t u = optc_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return optc_bits_f32(u | 0x00400000u);
  if ((u & 0x7fffffffu) == 0)
    return optc_bits_f32(u | 0x7f800000u);
  if (u >> 31)
    return optc_bits_f32(0xffc00000u);
  if (u == 0x7f800000u)
    return 0.0f;
  /* b: the biased exponent plus 64, so that a normalized subnormal's stays
   * positive; x = 2^(b - 191) * (1 + f/2^23). */
  uint32_t b = (u >> 23) + 64, f = u & 0x007fffffu;
  if (u < 0x00800000u) {
    b++;
    while (!(f & 0x00800000u)) {
      f <<= 1;
      b--;
    }
    f &= 0x007fffffu;
  }
  /* z = x / 4^n in [1, 4), with n = (b + 1)/2 - 96 (halved, floored);
   * rsqrt(z) in (0.5, 1] has biased exponent 126, so the result's is
   * 126 - n. */
  uint32_t ex = 222u - ((b + 1) >> 1);
  if (f == 0 && (b & 1))
    return optc_bits_f32((ex + 1) << 23); /* z = 1 */
  uint32_t k = optc_rsqrt14_tab[((b & 1) << 5) | (f >> 18)];
  int t = (int)((f >> 8) & 0x3ffu) - 512;
  int v = (int)(k >> 10) * 128 - (int)(k & 0x3ffu) * t;
  return optc_bits_f32((ex << 23) | ((((uint32_t)v >> 9) & 0xffffu) << 7));
}

/* ---- sqrt as torch on an AVX-512 CPU ------------------------------------- */
OPTC_FN float optc_sqrt_mkl_f32(float x) {
  uint32_t u = optc_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return optc_bits_f32(u | 0x00400000u);
  if ((u & 0x7fffffffu) == 0 || u == 0x7f800000u)
    return x;
  if (u >> 31)
    return optc_bits_f32(0x7fc00000u);
  float down = 1.0f;
  if (u < 0x0c800000u) { /* x < 2^-102 */
    x *= optc_bits_f32(0x57800000u); /* 2^48 */
    down = optc_bits_f32(0x33800000u); /* 2^-24 */
  }
  float y = optc_rsqrt14_f32(x);
  float s = x * y, h = 0.5f * y;
  float e = optc_fma_f32(-s, s, x);
  return optc_fma_f32(e, h, s) * down;
}

/* ---- sqrt as torch on a CPU MKL does not take for Intel's ---------------- */
/* MKL's dispatcher (mkl_vml_serv_cpu_detect) gives a CPU that is not Intel's
 * its generic kernel, mkl_vml_kernel_sSqrt_EXHAynn, whatever its features:
 * torch on an AMD EPYC (torch 2.15.0, MKL 2024.2) runs it, and this model
 * equals torch.sqrt there on all 2^32 inputs, NaNs bit for bit (1 and 2
 * threads, every tensor length and offset tried: the vector body and the
 * tail are one sequence). It starts from the CPU's own RSQRTPS, whose
 * table is the CPU's (AMD's differs from Intel's, and may differ between
 * AMD's generations), so the model runs that instruction: its bits are the
 * bits torch gets on this CPU. Then one Newton step in separate f32 ops,
 * no fma (the kernel is SSE2):
 *
 *   y = rsqrtps(x), s = x*y, h = y*0.5, e = 0.5 - s*h
 *   s1 = s*e + s, h1 = e*h + h, d = x - s1*s1, r = d*h1 + s1
 *
 * for x from the smallest normal to 0x7f7ff000; the other inputs are its
 * rare lanes: NaN quieted (x + x: sign and payload kept), +inf and +-0
 * themselves, any other x < 0 (-inf and negative subnormals too) the
 * positive quiet NaN 0x7fc00000, and positive subnormals and x above
 * 0x7f7ff000 IEEE's sqrt. With MXCSR's defaults (round to nearest, no FTZ
 * or DAZ), which MKL sets for the call. The host runs RSQRTPS itself; a GPU
 * has none, and looks this CPU's up in a table emit_cuda.c writes into the
 * kernel's source (optc_rsqrtps_from_tab): the same bits. */
/* Its fast lanes, and there, given the seed y = rsqrtps(x), the Newton step. */
OPTC_FN int optc_mkl_ex_fast(uint32_t u) { return u - 0x00800000u <= 0x7f7ff000u - 0x00800000u; }
OPTC_FN float optc_mkl_ex_newton(float x, float y) {
  float s = x * y, h = y * 0.5f;
  float e = 0.5f - s * h;
  float s1 = s * e + s, h1 = e * h + h;
  float d = x - s1 * s1;
  return d * h1 + s1;
}

/* Its rare lanes, given IEEE's sqrt of x. */
OPTC_FN float optc_mkl_ex_rare(float x, float ieee) {
  uint32_t u = optc_f32_bits(x), mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u)
    return optc_bits_f32(u | 0x00400000u);
  if ((u >> 31) && mag != 0)
    return optc_bits_f32(0x7fc00000u);
  return ieee;
}

/* RSQRTPS of a positive normal x reads only the exponent's parity and the
 * top 12 fraction bits, and rsqrtps(4^n z) = 2^-n rsqrtps(z) exactly: a
 * table of 8192 of its results (at z in [1, 4), made on the CPU whose
 * RSQRTPS it is: emit_cuda.c does, for the GPU) gives every other. */
enum { OPTC_RSQRTPS_TAB = 8192 };
OPTC_FN uint32_t optc_rsqrtps_tab_input(uint32_t i) { return ((i >> 12) ? 127u : 128u) << 23 | (i & 0xfffu) << 11; }
OPTC_FN float optc_rsqrtps_from_tab(const uint32_t *tab, float x) {
  uint32_t u = optc_f32_bits(x), b = u >> 23, odd = b & 1u;
  int n = ((int)b - (odd ? 127 : 128)) / 2;
  return optc_bits_f32(tab[odd << 12 | (u >> 11 & 0xfffu)] - (uint32_t)n * (1u << 23));
}

#if !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

OPTC_FN float optc_rsqrtps_f32(float x) { return _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(x))); }

OPTC_FN float optc_sqrt_mkl_ex_f32(float x) {
  if (optc_mkl_ex_fast(optc_f32_bits(x)))
    return optc_mkl_ex_newton(x, optc_rsqrtps_f32(x));
  return optc_mkl_ex_rare(x, _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))));
}
#endif

#endif
