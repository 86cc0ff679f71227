/* fused_ref.h: the hand-written fused AdamW the bench compares against. */
#pragma once
#include <stdint.h>

typedef enum { FUSED_FP32, FUSED_BF16, FUSED_BF16_FP32_STATES } FusedLayout;

/* The step's scalars, computed once per step on the host, as torch's
 * fused kernel receives them. */
typedef struct {
  float grad_mul;  /* world_size / num_tokens, times the clip coefficient */
  float keep;      /* 1 - lr * weight_decay */
  float w1, w2;    /* 1 - beta1, 1 - beta2 */
  float beta2, eps;
  float step_size; /* lr / (1 - beta1^t) */
  float bc2_sqrt;  /* sqrt(1 - beta2^t) */
} FusedAdamW;

/* Elements [lo, hi) of flat buffers p, g, m, v. */
void fused_adamw(FusedLayout layout, void *p, const void *g, void *m, void *v, int64_t lo, int64_t hi,
                 const FusedAdamW *s);
/* Sum over [lo, hi) of (g * scale)^2, in f64. */
double fused_sumsq(FusedLayout layout, const void *g, int64_t lo, int64_t hi, float scale);
/* STREAM's copy (a = b) and triad (a = b + s*c) over [lo, hi). */
void stream_copy(double *restrict a, const double *restrict b, int64_t lo, int64_t hi);
void stream_triad(double *restrict a, const double *restrict b, const double *restrict c, double s, int64_t lo,
                  int64_t hi);
/* In place: a = a + s*b over [lo, hi). */
void stream_update(double *restrict a, const double *restrict b, double s, int64_t lo, int64_t hi);
