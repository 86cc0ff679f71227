/* ref_optim.h: independent plain-C reference implementations of the
 * torch.optim update rules (AdamW, Adam, SGD, Adagrad, RMSprop) and of Lion
 * (as lion-pytorch), plus torchtune's scale_grads and
 * torch.nn.utils.clip_grad_norm_, for checking optc's IR interpreter.
 *
 * Shares no code with compiler/: it is written from what torch 2.15
 * computes on the CPU, as its Python code paths call it (for-loop:
 * foreach=False, fused=False: _single_tensor_adam, _single_tensor_sgd,
 * _single_tensor_adagrad, _single_tensor_rmsprop; lion-pytorch's update_fn;
 * fused=True: aten's FusedAdamKernel, FusedSGDKernel, FusedAdagradKernel),
 * and how each of torch's CPU kernels rounds, as tests/torch/probe_ops.py,
 * probe_fused.py and probe_sqrt.py measured it by running torch.
 *
 * ---- What torch computes ----------------------------------------------------
 *
 * Scalars. Hyperparameters are Python floats (doubles). Scalar math (1 -
 * lr*wd, 1 - beta, beta**step, bias corrections, lr/bc1, bc2**0.5,
 * Adagrad's clr) is double; a scalar becomes a float where a kernel takes
 * it (its opmath type), and a 16-bit kernel rounds some scalars to its
 * dtype as well (below).
 *
 * Tensors. Params, grads and states are stored as f32, bf16 or f16 (bf16
 * and f16 round to nearest even, overflow to infinity, a NaN becomes the
 * dtype's quiet NaN with its sign: 0x7fc0, 0x7e00, as optc stores it;
 * torch's NaN payloads differ, e.g. its vector maximum makes all-ones
 * NaNs, and are not modelled). Every kernel widens its
 * inputs to f32, computes in f32 and rounds its result once to its output's
 * dtype. An op's computation dtype is the promotion of its operands' dtypes
 * (bf16 with f32 is f32: torch's CPU TensorIterator casts the bf16 operand
 * up, so such an op is an f32 op even when it writes a bf16 tensor); an
 * out-of-place op's result has that dtype.
 *
 * The for-loop (torch's op-by-op code), each torch op one kernel call:
 *   x.mul_(c)                 x * f32(c)
 *   x / c                     x / f32(c)
 *   x.add_(c)                 x + f32(c); on a 16-bit op, f32(c) rounded to
 *                             the dtype first
 *   x.add(y, alpha=a),        fma(a, y, x), a = f32(alpha), and on a 16-bit
 *   x.add_(y, alpha=a)        op a is rounded to the dtype. Except in the
 *                             scalar tails of torch's 16-bit loops, which
 *                             compute x + dtype(a*y): the loop over a
 *                             tensor of n elements is at::parallel_for over
 *                             the tensor (OpenMP: when n >= 32768 and
 *                             threads > 1, min(threads, ceil(n/32768))
 *                             ranges of ceil(n/ranges) elements, else one),
 *                             each range in blocks of 32 elements from its
 *                             start; its last (size % 32) elements are its
 *                             tail. So the bits depend on torch's thread
 *                             count. f32 ops have no such tails.
 *   x.addcmul_(t1, t2, v)     fma(f32(v)*t1, t2, x)  (the product v*t1 in f32)
 *   x.addcdiv_(t1, t2, v)     x + (f32(v)*t1) / t2
 *   x.lerp_(end, w)           w = f32(w), d = end - x:
 *                             |w| < 0.5 ? fma(w, d, x) : fma(w - 1, d, end)
 *   x.sqrt()                  f32 tensors: IEEE sqrt with torch_cpu avx2,
 *                             MKL's vsSqrt with avx512 (REF_SQRT_MKL):
 *                             y = rsqrt14(x) (VRSQRT14), s = x*y, h = 0.5*y,
 *                             e = fma(-s, s, x), r = fma(e, h, s), with x
 *                             scaled by 2^48 (r by 2^-24) below 2^-102;
 *                             0, -0, +inf give x, x < 0 gives 0x7fc00000,
 *                             a NaN is quieted. With amd (REF_SQRT_MKL_EX),
 *                             MKL's generic kernel: y = rsqrtps(x) (the
 *                             CPU's own), s = x*y, h = y*0.5, e = 0.5 - s*h,
 *                             s1 = s*e + s, h1 = e*h + h, d = x - s1*s1,
 *                             r = d*h1 + s1, each op rounded (no fma), for
 *                             normal x up to 0x7f7ff000; a NaN quieted,
 *                             x < 0 (but -0) 0x7fc00000, else IEEE sqrt.
 *                             16-bit tensors: IEEE sqrt.
 *   torch.maximum(a, b)       NaN if either is NaN, else the larger
 *   x.sign_()                 (0 < x) - (x < 0): sign(NaN) = sign(-0) = +0
 * and each result is stored in its tensor (rounded to its dtype) before the
 * next op reads it. With pdt, sdt below the param and state dtypes (the
 * grads have the params' dtype in a recipe; g is the grad after the
 * prelude, g = -g first if maximize; each line one torch op):
 *   ADAMW  p.mul_(1 - lr*wd) if wd != 0; m.lerp_(g, 1 - beta1);
 *          v.mul_(beta2); v.addcmul_(g, g, 1 - beta2);
 *          amsgrad: torch.maximum(vmax, v, out=vmax), vhat = vmax, else v;
 *          bc1 = 1 - beta1**step; bc2 = 1 - beta2**step; ss = lr/bc1;
 *          d = vhat.sqrt(); d = d / bc2**0.5; d.add_(eps);
 *          p.addcdiv_(m, d, -ss)
 *   ADAM   as ADAMW, but weight decay is g = g.add(p, alpha=wd)
 *   SGD    g = g.add(p, alpha=wd) if wd != 0; momentum != 0: on step 1
 *          buf = g.clone(), else buf.mul_(momentum); buf.add_(g, alpha=1 -
 *          dampening); g = nesterov ? g.add(buf, alpha=momentum) : buf;
 *          p.add_(g, alpha=-lr)
 *   LION   p.mul_(1 - lr*wd) if wd != 0; u = m.clone(); u.mul_(beta1);
 *          u = u.add(g, alpha=1 - beta1); u.sign_(); p.add_(u, alpha=-lr);
 *          m.mul_(beta2); m.add_(g, alpha=1 - beta2)
 *   ADAGRAD g = g.add(p, alpha=wd) if wd != 0;
 *          clr = lr / (1 + (step - 1)*lr_decay); s.addcmul_(g, g, 1);
 *          d = s.sqrt(); d.add_(eps); p.addcdiv_(g, d, -clr)
 *   RMSPROP g = g.add(p, alpha=wd) if wd != 0; sq.mul_(alpha);
 *          sq.addcmul_(g, g, 1 - alpha); centered: ga.lerp_(g, 1 - alpha),
 *          a = sq.addcmul(ga, ga, -1), a = a.sqrt(); else a = sq.sqrt();
 *          a.add_(eps); momentum > 0: buf.mul_(momentum);
 *          buf.addcdiv_(g, a, 1); p.add_(buf, alpha=-lr);
 *          else p.addcdiv_(g, a, -lr)
 * With f32 states and 16-bit params (optc's optimizer_state_dtype; torch
 * runs it when the states are made f32, except lerp_, which refuses mixed
 * dtypes) an op between a state and a 16-bit tensor is an f32 op, as torch
 * promotes it: no 16-bit tails, alphas in f32, an f32 result for
 * g.add(buf). SGD's first step uses buf = g.clone() itself, in the grad's
 * dtype, and stores it in the state's.
 *
 * The fused kernels (fused=True; AdamW, Adam, SGD, Adagrad) load each
 * element, widened to f32, compute it in f32 registers and round only what
 * they store; a value stored to a state is used unrounded afterwards in
 * the same element. Scalars are f32. The kernel's vector code leaves the
 * last n % V elements of each tensor to scalar code, V = 8 for f32 params
 * and 16 for 16-bit params, and the two contract the multiply-adds
 * differently ("vector" / "scalar" below; fma(a, b, c) is a*b + c rounded
 * once, every other op rounds to f32):
 *   ADAMW/ADAM  p = p*f32(1 - lr*wd) (AdamW, wd != 0) or g = fma(p, wd, g)
 *          (Adam, wd != 0); m = lerp(m, g, 1 - beta1) as above;
 *          c = (1 - beta2)*g; vector: v = fma(c, g, v*beta2),
 *          scalar: v = fma(v, beta2, c*g); vmax as the for-loop;
 *          d = sqrt(vhat) / f32(bc2**0.5) + eps (IEEE sqrt);
 *          p = p + (f32(-ss)*m) / d
 *   SGD    g = fma(p, wd, g) if wd != 0; momentum != 0: step 1 buf = g,
 *          else vector: buf = fma(1 - dampening, g, buf*momentum),
 *          scalar: buf = fma(buf, momentum, g*(1 - dampening));
 *          g = nesterov ? fma(buf, momentum, g) : buf; p = fma(g, -lr, p)
 *   ADAGRAD g = fma(p, wd, g) if wd != 0; s = fma(g, g, s);
 *          p = p - (f32(clr)*g) / (sqrt(s) + eps)
 *
 * The prelude, for both (torchtune's recipe, on the grads' dtype gdt):
 *   scale_grads: scale = f32(1/f32(num_tokens)) * f32(world_size) in f32
 *          (world_size / num_tokens on an int tensor is reciprocal() *
 *          world_size); g = gdt(g * scale).
 *   clip_grad_norm_(max_norm), when max_norm > 0: total = the 2-norm of
 *          every grad of the group after scaling (computed here in double,
 *          element by element, tensor after tensor; or given), as a 0-dim
 *          tensor of gdt: t = gdt(f32(total)); den = gdt(t + gdt(1e-6));
 *          coef = gdt(gdt(1/den) * f32(max_norm)) (max_norm / tensor is
 *          reciprocal() * max_norm); coef = min(coef, 1), NaN-propagating;
 *          g = gdt(g * coef).
 * The caller's grad buffers are never modified.
 *
 * Usage: fill a RefHyper from ref_defaults(kind) and override fields; for
 * each tensor, allocate ref_state_count(h) state buffers (in the order and
 * with the names of ref_state_name), fill each with ref_state_init(h, i)
 * (stored in the state dtype) before the first step, then call ref_run
 * (or ref_step) with step = 1, 2, 3, ...
 */
#ifndef REF_OPTIM_H
#define REF_OPTIM_H

#include <stdint.h>

typedef enum { REF_F32, REF_BF16, REF_F16 } RefDType;

typedef enum { REF_ADAMW, REF_ADAM, REF_SGD, REF_LION, REF_ADAGRAD, REF_RMSPROP } RefOptim;

/* The for-loop's sqrt of an f32 tensor: IEEE's (torch_cpu avx2) or MKL's
 * (avx512). */
typedef enum { REF_SQRT_IEEE, REF_SQRT_MKL, REF_SQRT_MKL_EX } RefSqrt;

typedef struct {
  RefOptim kind;
  /* torch's names. beta1/beta2 are betas[0]/betas[1] (AdamW, Adam, Lion). */
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening, alpha, lr_decay,
      initial_accumulator_value;
  int amsgrad, maximize, nesterov, centered; /* 0 or 1 */
} RefHyper;

/* How torch runs the step, and the prelude's inputs. */
typedef struct {
  int fused;          /* 1: the fused=True kernel (AdamW, Adam, SGD, Adagrad); 0: the for-loop */
  RefSqrt sqrt;       /* the for-loop's f32 sqrt */
  int threads;        /* torch's intra-op threads (at::get_num_threads()), >= 1 */
  double num_tokens, world_size; /* scale_grads */
  double max_norm;    /* > 0: clip_grad_norm_(max_norm) */
  double grad_norm;   /* >= 0: clip with this total norm instead of computing it */
} RefRun;

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

/* Whether torch has a fused=True CPU kernel for kind. */
int ref_has_fused(RefOptim kind);

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

/* The for-loop, IEEE sqrt, one thread, no norm given, no scaling or clipping. */
RefRun ref_run_defaults(void);

/* One optimizer step over ntensors tensors (one param group), as torch
 * runs it (see the top of this file). step is this step's count after the
 * increment (1 on the first step). Updates params and states in place;
 * the grads are not modified. Returns the total grad norm (after scaling;
 * the given one if run->grad_norm >= 0) when clipping, else 0. Returns
 * -2, updating nothing, if run->sqrt is REF_SQRT_MKL and this CPU has no
 * AVX-512 (ref_sqrt_mkl_supported: the check is "skipped"), -3 if
 * run->fused and kind has no fused kernel; -1 if a scratch allocation
 * fails (tensors before the one that failed are updated). */
double ref_run(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t, int ntensors,
               double step, const RefRun *run);

/* ref_run with ref_run_defaults(), num_tokens, world_size and max_norm. */
double ref_step(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t,
                int ntensors, double step, double num_tokens, double world_size,
                double max_norm);

/* MKL's f32 sqrt as torch calls it on AVX-512, computed with the CPU's own
 * VRSQRT14SS; available when ref_sqrt_mkl_supported() (x86 with AVX-512F),
 * else NaN. */
int ref_sqrt_mkl_supported(void);
float ref_sqrt_mkl(float x);
/* MKL's generic vsSqrt kernel (what it runs on CPUs that are not Intel's),
 * on this CPU's own RSQRTSS; x86 only (NaN elsewhere). */
float ref_sqrt_mkl_ex(float x);

/* The offset of element i of an n-element tensor into the scalar tail of
 * its range in torch's 16-bit loops (blocks of 32, threads as above), or
 * -1 when a vector iteration computes it. */
int64_t ref_torch_tail(int64_t i, int64_t n, int threads);

/* Storage helpers (independent of compiler/numerics.h). */
float ref_bf16_to_f32(uint16_t h);
uint16_t ref_f32_to_bf16(float f); /* RNE; NaN -> 0x7fc0 | sign */
float ref_f16_to_f32(uint16_t h);
uint16_t ref_f32_to_f16(float f);  /* RNE; NaN -> 0x7e00 | sign */
float ref_load(RefDType dt, const void *base, int64_t i);
void ref_store(RefDType dt, void *base, int64_t i, float v);
/* Rounds v to dt and widens it back (identity for REF_F32). */
float ref_round(RefDType dt, float v);
int ref_dtype_size(RefDType dt); /* bytes per element */

#endif
