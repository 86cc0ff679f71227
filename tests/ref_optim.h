/* ref_optim.h: independent plain-C reference implementations of the
 * torch.optim update rules (AdamW, Adam, SGD, Adagrad, RMSprop) and of Lion
 * (as lion-pytorch), plus torchtune's scale_grads and
 * torch.nn.utils.clip_grad_norm_, for checking optc's IR interpreter.
 *
 * Shares no code with compiler/: it is written from torch's single-tensor
 * code paths (foreach=False, fused=False: _single_tensor_adam,
 * _single_tensor_sgd, _single_tensor_adagrad, _single_tensor_rmsprop) and
 * lion-pytorch's update.
 *
 * Element semantics (followed literally, in this order; ref_optim.c must be
 * built without floating-point contraction, -ffp-contract=off):
 * - Hyperparameters are doubles (Python floats). Scalar math (1 - lr*wd,
 *   1 - beta, beta**step, bias corrections, lr/bc1, pow(bc2, 0.5), Adagrad's
 *   clr) is done in double; each scalar is rounded to float where torch
 *   hands it to a float tensor kernel.
 * - Tensor math is f32, one rounding per operation:
 *     mul_(s)                 x * (float)s
 *     add_(t, alpha=a)        x + (float)a * t
 *     addcmul_(t1, t2, v)     x + ((float)v * t1) * t2
 *     addcdiv_(t1, t2, v)     x + ((float)v * t1) / t2
 *     lerp_(end, w)           wf = (float)w; |wf| < 0.5 ? x + wf*(end - x)
 *                                                      : end - (end - x)*(1 - wf)
 *     sqrt in float; maximum is NaN-propagating; sign(x) = (0 < x) - (x < 0)
 *     (so sign(NaN) = sign(-0.0) = +0.0).
 * - Storage: params, grads and states are each f32 or bf16. A load widens
 *   exactly; all math is f32; each store rounds to the storage type
 *   (bf16: round to nearest even, overflow to infinity, NaN -> 0x7fc0 with
 *   its sign). A value stored to a state is still used unrounded later in
 *   the same step (the step graph's SSA value), as is the grad.
 * - Grads: g is read from storage, scaled by (float)world_size /
 *   (float)num_tokens (computed in float, as torchtune's scale_grads) and
 *   rounded to the grad's storage type; if max_norm > 0, clipped as
 *   clip_grad_norm_: total = sqrt(sum of (double)g*(double)g over every
 *   element of every tensor, in element order, tensor after tensor, in
 *   double), coef = min(1.0, max_norm / (total + 1e-6)) in double,
 *   g = g * (float)coef, rounded to the grad's storage type again. The
 *   caller's grad buffers are never modified.
 *
 * Optimizers (g below is the grad after scaling/clipping):
 *   ADAMW  g = maximize ? -g : g; if wd != 0: p = p * (float)(1 - lr*wd);
 *          m = lerp(m, g, 1 - beta1); v = v*(float)beta2 + ((float)(1-beta2)*g)*g;
 *          if amsgrad: vmax = max(vmax, v), vhat = vmax else vhat = v;
 *          bc1 = 1 - beta1**step; bc2 = 1 - beta2**step; step_size = lr/bc1;
 *          denom = sqrt(vhat) / (float)pow(bc2, 0.5) + (float)eps;
 *          p = p + ((float)(-step_size) * m) / denom
 *   ADAM   as ADAMW, but weight decay is L2 (after the maximize negation):
 *          if wd != 0: g = g + (float)wd * p; p is not scaled.
 *   SGD    g = maximize ? -g : g; if wd != 0: g = g + (float)wd * p;
 *          if momentum != 0: buf = (step == 1) ? g
 *                                 : buf*(float)momentum + (float)(1-dampening)*g;
 *                            g = nesterov ? g + (float)momentum*buf : buf;
 *          p = p + (float)(-lr) * g
 *   LION   g = maximize ? -g : g; if wd != 0: p = p * (float)(1 - lr*wd);
 *          u = sign(m*(float)beta1 + (float)(1-beta1)*g); p = p + (float)(-lr)*u;
 *          m = m*(float)beta2 + (float)(1-beta2)*g
 *   ADAGRAD g as SGD's (maximize, wd); clr = lr / (1 + (step-1)*lr_decay);
 *          sum = sum + g*g; std = sqrt(sum) + (float)eps;
 *          p = p + ((float)(-clr) * g) / std
 *   RMSPROP g as SGD's (maximize, wd); sq = sq*(float)alpha + ((float)(1-alpha)*g)*g;
 *          centered: ga = lerp(ga, g, 1-alpha); avg = sqrt(sq - ga*ga)
 *          else avg = sqrt(sq); avg = avg + (float)eps;
 *          momentum > 0: buf = buf*(float)momentum + g/avg; p = p + (float)(-lr)*buf
 *          else p = p + ((float)(-lr)*g) / avg
 *
 * Usage: fill a RefHyper from ref_defaults(kind) and override fields; for
 * each tensor, allocate ref_state_count(h) state buffers (in the order and
 * with the names of ref_state_name), fill each with ref_state_init(h, i)
 * (stored in the state dtype) before the first step, then call ref_step
 * with step = 1, 2, 3, ...
 */
#ifndef REF_OPTIM_H
#define REF_OPTIM_H

#include <stdint.h>

typedef enum { REF_F32, REF_BF16 } RefDType;

typedef enum { REF_ADAMW, REF_ADAM, REF_SGD, REF_LION, REF_ADAGRAD, REF_RMSPROP } RefOptim;

typedef struct {
  RefOptim kind;
  /* torch's names. beta1/beta2 are betas[0]/betas[1] (AdamW, Adam, Lion). */
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening, alpha, lr_decay,
      initial_accumulator_value;
  int amsgrad, maximize, nesterov, centered; /* 0 or 1 */
} RefHyper;

#define REF_MAX_STATES 3

typedef struct {
  int64_t n;                  /* elements */
  void *p;                    /* param, in the param dtype; updated in place */
  const void *g;              /* grad, in the grad dtype; never modified */
  void *s[REF_MAX_STATES];    /* states, in the state dtype, in ref_state_name order */
} RefTensor;

/* torch's defaults for kind (lion-pytorch's for LION: lr 1e-4, betas (0.9, 0.99),
 * weight_decay 0). Every unused field is 0. */
RefHyper ref_defaults(RefOptim kind);

/* "adamw", "adam", "sgd", "lion", "adagrad", "rmsprop". */
const char *ref_optim_name(RefOptim kind);

/* The states torch keeps per param (without "step"), in torch's insertion
 * order, which is the order of RefTensor.s:
 *   ADAMW/ADAM: exp_avg, exp_avg_sq, then max_exp_avg_sq if amsgrad
 *   SGD:        momentum_buffer if momentum != 0, else none
 *   LION:       exp_avg
 *   ADAGRAD:    sum
 *   RMSPROP:    square_avg, then momentum_buffer if momentum > 0,
 *               then grad_avg if centered */
int ref_state_count(const RefHyper *h);
const char *ref_state_name(const RefHyper *h, int i); /* NULL if out of range */
int ref_state_index(const RefHyper *h, const char *name); /* -1 if absent */
/* Initial value of state i: 0, or initial_accumulator_value for Adagrad's sum. */
float ref_state_init(const RefHyper *h, int i);

/* One optimizer step over ntensors tensors (one param group). step is this
 * step's count after the increment (1 on the first step). Applies
 * scale_grads(num_tokens, world_size) (num_tokens = world_size = 1 is the
 * identity) and, if max_norm > 0, clip_grad_norm(max_norm), then the
 * optimizer. Updates params and states in place; the grads are not
 * modified. Returns the total grad norm (after scaling) when clipping,
 * else 0. Returns -1 if a scratch allocation fails (nothing is updated). */
double ref_step(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t,
                int ntensors, double step, double num_tokens, double world_size,
                double max_norm);

/* Storage helpers (independent of compiler/numerics.h). */
float ref_bf16_to_f32(uint16_t h);
uint16_t ref_f32_to_bf16(float f); /* RNE; NaN -> 0x7fc0 | sign */
float ref_load(RefDType dt, const void *base, int64_t i);
void ref_store(RefDType dt, void *base, int64_t i, float v);
/* Rounds v to dt and widens it back (identity for REF_F32). */
float ref_round(RefDType dt, float v);

#endif
