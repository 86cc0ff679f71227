/* fused_ref.c: a hand-written fused AdamW step, the analogue of torch's
 * fused=True kernel: one loop, every buffer read and written once, built
 * with -O3 -march=native and FP contraction on, as a C programmer would
 * write it. It is the yardstick the compiled step is held against in
 * `optc bench`; it covers AdamW (with scale_grads and clipping) in the
 * three layouts and nothing else, and its results are close to, not
 * bit-identical with, the interpreter's. */
#include "fused_ref.h"

#include "numerics.h"

#include <math.h>

static inline float ld(const void *p, int64_t i, int bf16) {
  return bf16 ? optc_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void st(void *p, int64_t i, float x, int bf16) {
  if (bf16)
    ((uint16_t *)p)[i] = optc_f32_to_bf16(x);
  else
    ((float *)p)[i] = x;
}

/* The loop body is written once and instantiated per layout, so that each
 * instance has constant types and vectorizes. */
#define ADAMW_LOOP(NAME, PT, PB, GT, GB, ST, SB) \
  static void NAME(PT *restrict pp, const GT *restrict gp, ST *restrict mp, ST *restrict vp, int64_t lo, \
                   int64_t hi, const FusedAdamW *sc) { \
    const FusedAdamW s = *sc; /* in registers: the buffers cannot alias it */ \
    for (int64_t i = lo; i < hi; i++) { \
      float g = ld(gp, i, GB) * s.grad_mul; \
      float p = ld(pp, i, PB) * s.keep; \
      float m = ld(mp, i, SB); \
      m = m + s.w1 * (g - m); \
      float v = ld(vp, i, SB) * s.beta2 + s.w2 * g * g; \
      float denom = sqrtf(v) / s.bc2_sqrt + s.eps; \
      st(pp, i, p - s.step_size * m / denom, PB); \
      st(mp, i, m, SB); \
      st(vp, i, v, SB); \
    } \
  }

ADAMW_LOOP(adamw_fp32, float, 0, float, 0, float, 0)
ADAMW_LOOP(adamw_bf16, uint16_t, 1, uint16_t, 1, uint16_t, 1)
ADAMW_LOOP(adamw_bf16_fp32_states, uint16_t, 1, uint16_t, 1, float, 0)

void fused_adamw(FusedLayout layout, void *pp, const void *gp, void *mp, void *vp, int64_t lo, int64_t hi,
                 const FusedAdamW *s) {
  switch (layout) {
  case FUSED_FP32: adamw_fp32(pp, gp, mp, vp, lo, hi, s); break;
  case FUSED_BF16: adamw_bf16(pp, gp, mp, vp, lo, hi, s); break;
  case FUSED_BF16_FP32_STATES: adamw_bf16_fp32_states(pp, gp, mp, vp, lo, hi, s); break;
  }
}

/* Sum of squares of the scaled grads in 8 independent lanes, so that the
 * loop vectorizes without reassociating anything. */
double fused_sumsq(FusedLayout layout, const void *gp, int64_t lo, int64_t hi, float scale) {
  double lanes[8] = {0};
  int bf16 = layout != FUSED_FP32;
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8)
    for (int k = 0; k < 8; k++) {
      double g = ld(gp, i + k, bf16) * scale;
      lanes[k] += g * g;
    }
  for (; i < hi; i++) {
    double g = ld(gp, i, bf16) * scale;
    lanes[0] += g * g;
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/* STREAM's copy and triad, built the same way, for the bandwidth ceiling. */
void stream_copy(double *restrict a, const double *restrict b, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i++)
    a[i] = b[i];
}

void stream_triad(double *restrict a, const double *restrict b, const double *restrict c, double s, int64_t lo,
                  int64_t hi) {
  for (int64_t i = lo; i < hi; i++)
    a[i] = b[i] + s * c[i];
}

/* In place, a = a + s*b: every byte it counts is a byte DRAM moves (no
 * write-allocate reads), like the optimizer's in-place updates. */
void stream_update(double *restrict a, const double *restrict b, double s, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i++)
    a[i] = a[i] + s * b[i];
}
