/* ref_optim.c: reference optimizer steps; see ref_optim.h for what torch
 * computes.
 *
 * The for-loop is written as torch runs it: one C function per torch op,
 * each a loop over the whole tensor that rounds its results to the
 * tensor's dtype, so that every intermediate lives in a tensor (Ten) as
 * it does in torch. The fused kernels are written as they run: one loop
 * over the elements, with the math in f32 locals.
 *
 * Every multiply-add that torch fuses is an explicit fmaf; no other
 * multiply may be fused with an add: the pragmas below say so to GCC and
 * clang, and every product that meets an add goes through mulf/muld, whose
 * volatile store rounds it even under clang -ffp-contract=fast (which
 * ignores pragmas). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "ref_optim.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define REF_X86 1
#else
#define REF_X86 0
#endif

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "ref_optim.c needs float arithmetic evaluated in float (FLT_EVAL_METHOD == 0)"
#endif

/* ---- storage -------------------------------------------------------------- */

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float ref_bf16_to_f32(uint16_t h) { return of_bits((uint32_t)h << 16); }

uint16_t ref_f32_to_bf16(float f) {
  uint32_t u = bits_of(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return (uint16_t)(sign | 0x7fc0u);
  /* Round to nearest, ties to even, on the low 16 bits. A carry out of the
   * mantissa bumps the exponent, and a carry into the all-ones exponent
   * gives infinity, as it should. */
  uint32_t low = u & 0xffffu;
  uint32_t hi = u >> 16;
  if (low > 0x8000u || (low == 0x8000u && (hi & 1u)))
    hi += 1u;
  return (uint16_t)hi;
}

float ref_f16_to_f32(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  if (e == 0x1f)
    return of_bits(sign | 0x7f800000u | ((uint32_t)m << 13));
  /* every f16 is exact in double and in float */
  double a = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), e - 25);
  return sign ? -(float)a : (float)a;
}

/* In double: |f| is exact there, scaling by a power of two is exact, and
 * rint rounds to nearest even (the default mode) on the 11 bits kept. */
uint16_t ref_f32_to_f16(float f) {
  uint16_t sign = (uint16_t)((bits_of(f) >> 16) & 0x8000u);
  if (isnan(f))
    return (uint16_t)(sign | 0x7e00u);
  double a = fabs((double)f);
  if (a == INFINITY)
    return (uint16_t)(sign | 0x7c00u);
  if (a < 0x1p-14) /* subnormal steps of 2^-24; 1024 of them is the least normal, 0x0400 */
    return (uint16_t)(sign | (uint16_t)rint(a * 0x1p24));
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  int ex = e - 1;
  double q = rint(ldexp(a, 10 - ex)); /* 11 significant bits: [1024, 2048] */
  if (q == 2048.0) {
    q = 1024.0;
    ex++;
  }
  if (ex > 15)
    return (uint16_t)(sign | 0x7c00u);
  return (uint16_t)(sign | (uint16_t)((ex + 15) << 10) | (uint16_t)(q - 1024.0));
}

int ref_dtype_size(RefDType dt) { return dt == REF_F32 ? 4 : 2; }

float ref_load(RefDType dt, const void *base, int64_t i) {
  switch (dt) {
  case REF_BF16: return ref_bf16_to_f32(((const uint16_t *)base)[i]);
  case REF_F16: return ref_f16_to_f32(((const uint16_t *)base)[i]);
  case REF_F32: break;
  }
  return ((const float *)base)[i];
}

void ref_store(RefDType dt, void *base, int64_t i, float v) {
  switch (dt) {
  case REF_BF16: ((uint16_t *)base)[i] = ref_f32_to_bf16(v); return;
  case REF_F16: ((uint16_t *)base)[i] = ref_f32_to_f16(v); return;
  case REF_F32: break;
  }
  ((float *)base)[i] = v;
}

float ref_round(RefDType dt, float v) {
  switch (dt) {
  case REF_BF16: return ref_bf16_to_f32(ref_f32_to_bf16(v));
  case REF_F16: return ref_f16_to_f32(ref_f32_to_f16(v));
  case REF_F32: break;
  }
  return v;
}

/* ---- arithmetic ------------------------------------------------------------- */

/* a * b, rounded to float (or double) before any later add can see it. */
static float mulf(float a, float b) {
  volatile float r = a * b;
  return r;
}

static double muld(double a, double b) {
  volatile double r = a * b;
  return r;
}

/* torch's CPU lerp: one fused multiply-add, from whichever end is nearer. */
static float lerp_f(float self, float end, float w) {
  float d = end - self;
  return fabsf(w) < 0.5f ? fmaf(w, d, self) : fmaf(w - 1.0f, d, end);
}

/* torch.maximum: NaN if either operand is NaN, else the larger. */
static float max_f(float a, float b) {
  if (isnan(a))
    return a;
  if (isnan(b))
    return b;
  return a < b ? b : a;
}

/* torch.clamp(x, max=hi): NaN stays NaN. */
static float clamp_max_f(float x, float hi) { return isnan(x) ? x : x > hi ? hi : x; }

/* torch.sign: (0 < x) - (x < 0); NaN and -0.0 give +0.0. */
static float sign_f(float x) { return (float)((0.0f < x) - (x < 0.0f)); }

/* ---- MKL's sqrt, on the CPU's own rsqrt14 ------------------------------------ */

#if REF_X86
__attribute__((target("avx512f"))) static float rsqrt14_hw(float x) {
  __m128 v = _mm_set_ss(x);
  return _mm_cvtss_f32(_mm_rsqrt14_ss(v, v));
}
#endif

int ref_sqrt_mkl_supported(void) {
#if REF_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
#else
  return 0;
#endif
}

/* MKL vsSqrt (HA) on AVX-512: rsqrt14, then one Newton step on the square
 * root with two fmas; tiny inputs are scaled by 4^24 first. */
float ref_sqrt_mkl(float x) {
#if REF_X86
  if (!ref_sqrt_mkl_supported())
    return NAN;
  if (isnan(x))
    return of_bits(bits_of(x) | 0x00400000u);
  if (x == 0.0f || x == INFINITY)
    return x;
  if (x < 0.0f)
    return of_bits(0x7fc00000u);
  float back = 1.0f;
  if (x < 0x1p-102f) {
    x = mulf(x, 0x1p48f);
    back = 0x1p-24f;
  }
  float y = rsqrt14_hw(x);
  float s = mulf(x, y), h = mulf(0.5f, y);
  float e = fmaf(-s, s, x);
  return mulf(fmaf(e, h, s), back);
#else
  (void)x;
  return NAN;
#endif
}

/* MKL's generic kernel (mkl_vml_kernel_sSqrt_EXHAynn), as its instructions
 * run: RSQRTSS for the seed, then mulss/subss/addss one at a time. */
float ref_sqrt_mkl_ex(float x) {
#if REF_X86
  uint32_t u = bits_of(x);
  if (isnan(x))
    return of_bits(u | 0x00400000u);
  if (x == 0.0f || x == INFINITY)
    return x;
  if (x < 0.0f)
    return of_bits(0x7fc00000u);
  if (u < 0x00800000u || u > 0x7f7ff000u) /* subnormal, or where x - s1*s1 could overflow */
    return sqrtf(x);
  float y = _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(x)));
  /* mulf rounds each product before the add or subtract sees it: no fma */
  float s = mulf(x, y), h = mulf(y, 0.5f);
  float e = 0.5f - mulf(s, h);
  float s1 = mulf(s, e) + s, h1 = mulf(e, h) + h;
  float d = x - mulf(s1, s1);
  return mulf(d, h1) + s1;
#else
  (void)x;
  return NAN;
#endif
}

/* ---- torch's CPU loops --------------------------------------------------------- */

enum { TORCH_GRAIN = 32768, TORCH_TAIL_BLOCK = 32 };

int64_t ref_torch_tail(int64_t i, int64_t n, int threads) {
  /* at::parallel_for under OpenMP: min(threads, ceil(n / grain)) ranges of
   * ceil(n / ranges) elements; one range below the grain */
  int64_t lo = 0, hi = n;
  if (threads > 1 && n >= TORCH_GRAIN) {
    int64_t ranges = (n + TORCH_GRAIN - 1) / TORCH_GRAIN;
    if (ranges > threads)
      ranges = threads;
    int64_t chunk = (n + ranges - 1) / ranges;
    lo = i / chunk * chunk;
    hi = lo + chunk < n ? lo + chunk : n;
  }
  int64_t vec_end = lo + (hi - lo) / TORCH_TAIL_BLOCK * TORCH_TAIL_BLOCK;
  return i < vec_end ? -1 : i - vec_end;
}

/* ---- the for-loop: tensors and torch's ops on them ------------------------------- */

/* A tensor as the for-loop sees it: n values, each already rounded to dt. */
typedef struct {
  RefDType dt;
  int64_t n;
  float *v;
} Ten;

/* One tensor's step: its scratch tensors (freed together) and how torch runs. */
enum { MAX_TEMPS = 24 };
typedef struct {
  Ten temps[MAX_TEMPS];
  int ntemps;
  int failed;
  const RefRun *run;
} Ctx;

static Ten *ten_new(Ctx *c, RefDType dt, int64_t n) {
  if (c->ntemps == MAX_TEMPS) {
    c->failed = 1;
    return NULL;
  }
  Ten *t = &c->temps[c->ntemps];
  t->v = malloc((n > 0 ? (size_t)n : 1) * sizeof(float));
  if (!t->v) {
    c->failed = 1;
    return NULL;
  }
  c->ntemps++;
  t->dt = dt;
  t->n = n;
  return t;
}

static void ctx_free(Ctx *c) {
  for (int k = 0; k < c->ntemps; k++)
    free(c->temps[k].v);
  c->ntemps = 0;
}

static int is16(RefDType dt) { return dt != REF_F32; }

/* torch's type promotion between two float dtypes */
static RefDType promote(RefDType a, RefDType b) { return a == b ? a : REF_F32; }

/* The value a 16-bit op computes with for a Python scalar it rounds. */
static float scalar_in(RefDType cdt, double c) { return ref_round(cdt, (float)c); }

static Ten *t_load(Ctx *c, RefDType dt, const void *base, int64_t n) {
  Ten *t = ten_new(c, dt, n);
  if (t)
    for (int64_t i = 0; i < n; i++)
      t->v[i] = ref_load(dt, base, i);
  return t;
}

static void t_save(const Ten *t, void *base) {
  for (int64_t i = 0; i < t->n; i++)
    ref_store(t->dt, base, i, t->v[i]);
}

/* x.clone(), or -x */
static Ten *t_copy(Ctx *c, const Ten *x, float sign) {
  Ten *t = ten_new(c, x->dt, x->n);
  if (t)
    for (int64_t i = 0; i < x->n; i++)
      t->v[i] = sign < 0 ? -x->v[i] : x->v[i];
  return t;
}

/* x.mul_(s) */
static void t_mul_(Ten *x, double s) {
  float sf = (float)s;
  for (int64_t i = 0; i < x->n; i++)
    x->v[i] = ref_round(x->dt, x->v[i] * sf);
}

/* out = self + alpha * other: self.add(other, alpha) when out is a new
 * tensor of the promoted dtype, self.add_(other, alpha) when out is self */
static void t_add_alpha(const Ctx *c, Ten *out, const Ten *self, const Ten *other, double alpha) {
  RefDType cdt = promote(self->dt, other->dt);
  float a = is16(cdt) ? scalar_in(cdt, alpha) : (float)alpha;
  for (int64_t i = 0; i < self->n; i++) {
    float r;
    if (is16(cdt) && ref_torch_tail(i, self->n, c->run->threads) >= 0)
      r = self->v[i] + ref_round(cdt, mulf(a, other->v[i]));
    else
      r = fmaf(a, other->v[i], self->v[i]);
    out->v[i] = ref_round(out->dt, r);
  }
}

static Ten *t_add(Ctx *c, const Ten *self, const Ten *other, double alpha) {
  Ten *t = ten_new(c, promote(self->dt, other->dt), self->n);
  if (t)
    t_add_alpha(c, t, self, other, alpha);
  return t;
}

static void t_add_(const Ctx *c, Ten *self, const Ten *other, double alpha) { t_add_alpha(c, self, self, other, alpha); }

/* x.add_(s) */
static void t_add_scalar_(Ten *x, double s) {
  float sf = is16(x->dt) ? scalar_in(x->dt, s) : (float)s;
  for (int64_t i = 0; i < x->n; i++)
    x->v[i] = ref_round(x->dt, x->v[i] + sf);
}

/* x.lerp_(end, w) */
static void t_lerp_(Ten *x, const Ten *end, double w) {
  float wf = (float)w;
  for (int64_t i = 0; i < x->n; i++)
    x->v[i] = ref_round(x->dt, lerp_f(x->v[i], end->v[i], wf));
}

/* out = self + value * t1 * t2: self.addcmul_(t1, t2, value) when out is
 * self, self.addcmul(t1, t2, value) when out is new */
static void t_addcmul_to(Ten *out, const Ten *self, const Ten *t1, const Ten *t2, double value) {
  float vf = (float)value;
  for (int64_t i = 0; i < self->n; i++)
    out->v[i] = ref_round(out->dt, fmaf(mulf(vf, t1->v[i]), t2->v[i], self->v[i]));
}

/* self.addcdiv_(t1, t2, value) */
static void t_addcdiv_(Ten *self, const Ten *t1, const Ten *t2, double value) {
  float vf = (float)value;
  for (int64_t i = 0; i < self->n; i++)
    self->v[i] = ref_round(self->dt, self->v[i] + mulf(vf, t1->v[i]) / t2->v[i]);
}

/* x.sqrt_() */
static void t_sqrt_(const Ctx *c, Ten *x) {
  int mkl = x->dt == REF_F32 && c->run->sqrt == REF_SQRT_MKL;
  int mkl_ex = x->dt == REF_F32 && c->run->sqrt == REF_SQRT_MKL_EX;
  for (int64_t i = 0; i < x->n; i++)
    x->v[i] = ref_round(x->dt, mkl ? ref_sqrt_mkl(x->v[i]) : mkl_ex ? ref_sqrt_mkl_ex(x->v[i]) : sqrtf(x->v[i]));
}

static Ten *t_sqrt(Ctx *c, const Ten *x) {
  Ten *t = t_copy(c, x, 1.0f);
  if (t)
    t_sqrt_(c, t);
  return t;
}

/* x / s, into x (the callers' x is a temporary) */
static void t_div_scalar_(Ten *x, double s) {
  float sf = (float)s;
  for (int64_t i = 0; i < x->n; i++)
    x->v[i] = ref_round(x->dt, x->v[i] / sf);
}

/* torch.maximum(a, b, out=a) */
static void t_maximum_(Ten *a, const Ten *b) {
  for (int64_t i = 0; i < a->n; i++)
    a->v[i] = ref_round(a->dt, max_f(a->v[i], b->v[i]));
}

/* x.sign_() */
static void t_sign_(Ten *x) {
  for (int64_t i = 0; i < x->n; i++)
    x->v[i] = sign_f(x->v[i]);
}

/* ---- the for-loop: _single_tensor_* ----------------------------------------------- */
/* p and the states s[] are the stored tensors (written back by the caller);
 * g is the grad after the prelude. Each returns 0, or -1 when a scratch
 * tensor could not be allocated. */

static int loop_adam(Ctx *c, const RefHyper *h, int decoupled, Ten *p, Ten *g, Ten **s, double step) {
  if (h->maximize)
    g = t_copy(c, g, -1.0f);
  if (!g)
    return -1;
  if (h->weight_decay != 0.0) {
    if (decoupled)
      t_mul_(p, 1.0 - muld(h->lr, h->weight_decay));
    else if (!(g = t_add(c, g, p, h->weight_decay)))
      return -1;
  }
  Ten *m = s[0], *v = s[1];
  t_lerp_(m, g, 1.0 - h->beta1);
  t_mul_(v, h->beta2);
  t_addcmul_to(v, v, g, g, 1.0 - h->beta2);
  Ten *vhat = v;
  if (h->amsgrad) {
    t_maximum_(s[2], v);
    vhat = s[2];
  }
  double bc1 = 1.0 - pow(h->beta1, step), bc2 = 1.0 - pow(h->beta2, step);
  double step_size = h->lr / bc1, bc2_sqrt = pow(bc2, 0.5);
  Ten *denom = t_sqrt(c, vhat);
  if (!denom)
    return -1;
  t_div_scalar_(denom, bc2_sqrt);
  t_add_scalar_(denom, h->eps);
  t_addcdiv_(p, m, denom, -step_size);
  return 0;
}

static int loop_sgd(Ctx *c, const RefHyper *h, Ten *p, Ten *g, Ten **s, double step) {
  if (h->maximize && !(g = t_copy(c, g, -1.0f)))
    return -1;
  if (h->weight_decay != 0.0 && !(g = t_add(c, g, p, h->weight_decay)))
    return -1;
  if (h->momentum != 0.0) {
    Ten *buf = s[0];
    if (step == 1.0) {
      /* buf = torch.clone(grad): the stored state holds its values, and
       * this step goes on with the clone, in the grad's dtype */
      for (int64_t i = 0; i < g->n; i++)
        buf->v[i] = ref_round(buf->dt, g->v[i]);
      buf = t_copy(c, g, 1.0f);
      if (!buf)
        return -1;
    } else {
      t_mul_(buf, h->momentum);
      t_add_(c, buf, g, 1.0 - h->dampening);
    }
    if (h->nesterov) {
      if (!(g = t_add(c, g, buf, h->momentum)))
        return -1;
    } else {
      g = buf;
    }
  }
  t_add_(c, p, g, -h->lr);
  return 0;
}

/* lion-pytorch's update_fn; maximize as torch's optimizers do it */
static int loop_lion(Ctx *c, const RefHyper *h, Ten *p, Ten *g, Ten **s) {
  if (h->maximize && !(g = t_copy(c, g, -1.0f)))
    return -1;
  Ten *m = s[0];
  if (h->weight_decay != 0.0)
    t_mul_(p, 1.0 - muld(h->lr, h->weight_decay));
  Ten *u = t_copy(c, m, 1.0f);
  if (!u)
    return -1;
  t_mul_(u, h->beta1);
  if (!(u = t_add(c, u, g, 1.0 - h->beta1)))
    return -1;
  t_sign_(u);
  t_add_(c, p, u, -h->lr);
  t_mul_(m, h->beta2);
  t_add_(c, m, g, 1.0 - h->beta2);
  return 0;
}

static int loop_adagrad(Ctx *c, const RefHyper *h, Ten *p, Ten *g, Ten **s, double step) {
  if (h->maximize && !(g = t_copy(c, g, -1.0f)))
    return -1;
  if (h->weight_decay != 0.0 && !(g = t_add(c, g, p, h->weight_decay)))
    return -1;
  double clr = h->lr / (1.0 + muld(step - 1.0, h->lr_decay));
  Ten *sum = s[0];
  t_addcmul_to(sum, sum, g, g, 1.0);
  Ten *std = t_sqrt(c, sum);
  if (!std)
    return -1;
  t_add_scalar_(std, h->eps);
  t_addcdiv_(p, g, std, -clr);
  return 0;
}

static int loop_rmsprop(Ctx *c, const RefHyper *h, Ten *p, Ten *g, Ten **s) {
  const int mom_on = h->momentum > 0.0;
  Ten *sq = s[0], *buf = mom_on ? s[1] : NULL, *ga = h->centered ? s[mom_on ? 2 : 1] : NULL;
  if (h->maximize && !(g = t_copy(c, g, -1.0f)))
    return -1;
  if (h->weight_decay != 0.0 && !(g = t_add(c, g, p, h->weight_decay)))
    return -1;
  t_mul_(sq, h->alpha);
  t_addcmul_to(sq, sq, g, g, 1.0 - h->alpha);
  Ten *avg;
  if (h->centered) {
    t_lerp_(ga, g, 1.0 - h->alpha);
    if (!(avg = ten_new(c, promote(sq->dt, ga->dt), sq->n)))
      return -1;
    t_addcmul_to(avg, sq, ga, ga, -1.0);
    t_sqrt_(c, avg);
  } else if (!(avg = t_sqrt(c, sq))) {
    return -1;
  }
  t_add_scalar_(avg, h->eps);
  if (mom_on) {
    t_mul_(buf, h->momentum);
    t_addcdiv_(buf, g, avg, 1.0);
    t_add_(c, p, buf, -h->lr);
  } else {
    t_addcdiv_(p, g, avg, -h->lr);
  }
  return 0;
}

/* One tensor's for-loop step: load, run the ops, store. */
static int loop_step(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t, const float *gs,
                     double step, const RefRun *run) {
  Ctx c = {.run = run};
  int ns = ref_state_count(h), rc = -1;
  Ten *p = t_load(&c, pdt, t->p, t->n), *s[REF_MAX_STATES] = {0};
  Ten *g = ten_new(&c, gdt, t->n);
  for (int k = 0; k < ns; k++)
    s[k] = t_load(&c, sdt, t->s[k], t->n);
  if (c.failed)
    goto out;
  memcpy(g->v, gs, (size_t)t->n * sizeof(float));
  switch (h->kind) {
  case REF_ADAMW: rc = loop_adam(&c, h, 1, p, g, s, step); break;
  case REF_ADAM: rc = loop_adam(&c, h, 0, p, g, s, step); break;
  case REF_SGD: rc = loop_sgd(&c, h, p, g, s, step); break;
  case REF_LION: rc = loop_lion(&c, h, p, g, s); break;
  case REF_ADAGRAD: rc = loop_adagrad(&c, h, p, g, s, step); break;
  case REF_RMSPROP: rc = loop_rmsprop(&c, h, p, g, s); break;
  }
  if (rc == 0 && !c.failed) {
    t_save(p, t->p);
    for (int k = 0; k < ns; k++)
      t_save(s[k], t->s[k]);
  }
out:
  ctx_free(&c);
  return rc == 0 && !c.failed ? 0 : -1;
}

/* ---- the fused kernels: one element at a time, in f32 ------------------------------- */

/* Whether element i of an n-element tensor is left to the kernel's scalar code. */
static int fused_scalar(int64_t i, int64_t n, RefDType pdt) {
  int64_t vec = is16(pdt) ? 16 : 8;
  return i >= n - n % vec;
}

static void fused_adam(const RefHyper *h, int decoupled, RefDType pdt, RefDType sdt, RefTensor *t, const float *gs,
                       double step) {
  const int wd_on = h->weight_decay != 0.0;
  const float keepf = (float)(1.0 - muld(h->lr, h->weight_decay)), wdf = (float)h->weight_decay;
  const float w1f = (float)(1.0 - h->beta1), beta2f = (float)h->beta2, w2f = (float)(1.0 - h->beta2);
  const double bc1 = 1.0 - pow(h->beta1, step), bc2 = 1.0 - pow(h->beta2, step);
  const float bc2_sqrtf = (float)pow(bc2, 0.5), epsf = (float)h->eps;
  const float neg_step_sizef = (float)(-(h->lr / bc1));
  for (int64_t i = 0; i < t->n; i++) {
    float g = h->maximize ? -gs[i] : gs[i];
    float p = ref_load(pdt, t->p, i);
    if (wd_on && decoupled)
      p = mulf(p, keepf);
    else if (wd_on)
      g = fmaf(p, wdf, g);
    float m = lerp_f(ref_load(sdt, t->s[0], i), g, w1f);
    ref_store(sdt, t->s[0], i, m);
    float v0 = ref_load(sdt, t->s[1], i), cg = mulf(w2f, g);
    float v = fused_scalar(i, t->n, pdt) ? fmaf(v0, beta2f, mulf(cg, g)) : fmaf(cg, g, mulf(v0, beta2f));
    ref_store(sdt, t->s[1], i, v);
    if (h->amsgrad) {
      v = max_f(ref_load(sdt, t->s[2], i), v);
      ref_store(sdt, t->s[2], i, v);
    }
    float denom = sqrtf(v) / bc2_sqrtf + epsf;
    p = p + mulf(neg_step_sizef, m) / denom;
    ref_store(pdt, t->p, i, p);
  }
}

static void fused_sgd(const RefHyper *h, RefDType pdt, RefDType sdt, RefTensor *t, const float *gs, double step) {
  const float wdf = (float)h->weight_decay, momf = (float)h->momentum;
  const float undampf = (float)(1.0 - h->dampening), neg_lrf = (float)(-h->lr);
  for (int64_t i = 0; i < t->n; i++) {
    float g = h->maximize ? -gs[i] : gs[i];
    float p = ref_load(pdt, t->p, i);
    if (h->weight_decay != 0.0)
      g = fmaf(p, wdf, g);
    if (h->momentum != 0.0) {
      float buf;
      if (step == 1.0) {
        buf = g;
      } else {
        float b0 = ref_load(sdt, t->s[0], i);
        buf = fused_scalar(i, t->n, pdt) ? fmaf(b0, momf, mulf(g, undampf)) : fmaf(undampf, g, mulf(b0, momf));
      }
      ref_store(sdt, t->s[0], i, buf);
      g = h->nesterov ? fmaf(buf, momf, g) : buf;
    }
    ref_store(pdt, t->p, i, fmaf(g, neg_lrf, p));
  }
}

static void fused_adagrad(const RefHyper *h, RefDType pdt, RefDType sdt, RefTensor *t, const float *gs,
                          double step) {
  const float wdf = (float)h->weight_decay, epsf = (float)h->eps;
  const float clrf = (float)(h->lr / (1.0 + muld(step - 1.0, h->lr_decay)));
  for (int64_t i = 0; i < t->n; i++) {
    float g = h->maximize ? -gs[i] : gs[i];
    float p = ref_load(pdt, t->p, i);
    if (h->weight_decay != 0.0)
      g = fmaf(p, wdf, g);
    float s = fmaf(g, g, ref_load(sdt, t->s[0], i));
    ref_store(sdt, t->s[0], i, s);
    float std = sqrtf(s) + epsf;
    ref_store(pdt, t->p, i, p - mulf(clrf, g) / std);
  }
}

/* ---- hyperparameters and states ---------------------------------------------- */

RefHyper ref_defaults(RefOptim kind) {
  RefHyper h;
  memset(&h, 0, sizeof h);
  h.kind = kind;
  switch (kind) {
  case REF_ADAMW:
  case REF_ADAM:
    h.lr = 1e-3;
    h.beta1 = 0.9;
    h.beta2 = 0.999;
    h.eps = 1e-8;
    h.weight_decay = kind == REF_ADAMW ? 1e-2 : 0.0;
    break;
  case REF_SGD:
    h.lr = 1e-3;
    break;
  case REF_LION:
    h.lr = 1e-4;
    h.beta1 = 0.9;
    h.beta2 = 0.99;
    break;
  case REF_ADAGRAD:
    h.lr = 1e-2;
    h.eps = 1e-10;
    break;
  case REF_RMSPROP:
    h.lr = 1e-2;
    h.alpha = 0.99;
    h.eps = 1e-8;
    break;
  }
  return h;
}

const char *ref_optim_name(RefOptim kind) {
  switch (kind) {
  case REF_ADAMW: return "adamw";
  case REF_ADAM: return "adam";
  case REF_SGD: return "sgd";
  case REF_LION: return "lion";
  case REF_ADAGRAD: return "adagrad";
  case REF_RMSPROP: return "rmsprop";
  }
  return "?";
}

int ref_has_fused(RefOptim kind) {
  return kind == REF_ADAMW || kind == REF_ADAM || kind == REF_SGD || kind == REF_ADAGRAD;
}

/* Fills names[] (at most REF_MAX_STATES) and returns the count. */
static int state_list(const RefHyper *h, const char *names[REF_MAX_STATES]) {
  int n = 0;
  switch (h->kind) {
  case REF_ADAMW:
  case REF_ADAM:
    names[n++] = "exp_avg";
    names[n++] = "exp_avg_sq";
    if (h->amsgrad)
      names[n++] = "max_exp_avg_sq";
    break;
  case REF_SGD:
    if (h->momentum != 0.0)
      names[n++] = "momentum_buffer";
    break;
  case REF_LION:
    names[n++] = "exp_avg";
    break;
  case REF_ADAGRAD:
    names[n++] = "sum";
    break;
  case REF_RMSPROP:
    names[n++] = "square_avg";
    if (h->momentum > 0.0)
      names[n++] = "momentum_buffer";
    if (h->centered)
      names[n++] = "grad_avg";
    break;
  }
  return n;
}

int ref_state_count(const RefHyper *h) {
  const char *names[REF_MAX_STATES];
  return state_list(h, names);
}

const char *ref_state_name(const RefHyper *h, int i) {
  const char *names[REF_MAX_STATES];
  int n = state_list(h, names);
  return i >= 0 && i < n ? names[i] : NULL;
}

int ref_state_index(const RefHyper *h, const char *name) {
  const char *names[REF_MAX_STATES];
  int n = state_list(h, names);
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0)
      return i;
  return -1;
}

float ref_state_init(const RefHyper *h, int i) {
  if (h->kind == REF_ADAGRAD && i == 0)
    return (float)h->initial_accumulator_value;
  return 0.0f;
}

/* ---- the step --------------------------------------------------------------------- */

RefRun ref_run_defaults(void) {
  return (RefRun){.fused = 0, .sqrt = REF_SQRT_IEEE, .threads = 1, .num_tokens = 1.0, .world_size = 1.0,
                  .max_norm = 0.0, .grad_norm = -1.0};
}

double ref_run(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t, int ntensors,
               double step, const RefRun *run) {
  if (run->fused && !ref_has_fused(h->kind))
    return -3.0;
  if (!run->fused && run->sqrt == REF_SQRT_MKL && !ref_sqrt_mkl_supported())
    return -2.0;
  float **gs = calloc(ntensors > 0 ? (size_t)ntensors : 1, sizeof *gs);
  if (!gs)
    return -1.0;
  for (int k = 0; k < ntensors; k++) {
    gs[k] = malloc((t[k].n > 0 ? (size_t)t[k].n : 1) * sizeof(float));
    if (!gs[k]) {
      for (int j = 0; j < k; j++)
        free(gs[j]);
      free(gs);
      return -1.0;
    }
  }

  /* scale_grads: grad *= world_size / num_tokens, a 0-dim f32 tensor
   * computed as num_tokens.reciprocal() * world_size */
  const float scale = mulf(1.0f / (float)run->num_tokens, (float)run->world_size);
  for (int k = 0; k < ntensors; k++)
    for (int64_t i = 0; i < t[k].n; i++)
      gs[k][i] = ref_round(gdt, ref_load(gdt, t[k].g, i) * scale);

  /* clip_grad_norm_: the norm as a 0-dim tensor of the grads' dtype, then
   * clip_coef = (total + 1e-6).reciprocal() * max_norm, clamped to 1 */
  double total = 0.0;
  if (run->max_norm > 0.0) {
    if (run->grad_norm >= 0.0) {
      total = run->grad_norm;
    } else {
      double sumsq = 0.0;
      for (int k = 0; k < ntensors; k++)
        for (int64_t i = 0; i < t[k].n; i++)
          sumsq = sumsq + muld((double)gs[k][i], (double)gs[k][i]);
      total = sqrt(sumsq);
    }
    float tn = ref_round(gdt, (float)total);
    float den = ref_round(gdt, tn + scalar_in(gdt, 1e-6));
    float rec = ref_round(gdt, 1.0f / den);
    float coef = clamp_max_f(ref_round(gdt, rec * (float)run->max_norm), 1.0f);
    for (int k = 0; k < ntensors; k++)
      for (int64_t i = 0; i < t[k].n; i++)
        gs[k][i] = ref_round(gdt, gs[k][i] * coef);
  }

  int rc = 0;
  for (int k = 0; k < ntensors && rc == 0; k++) {
    if (!run->fused) {
      rc = loop_step(h, pdt, gdt, sdt, &t[k], gs[k], step, run);
      continue;
    }
    switch (h->kind) {
    case REF_ADAMW: fused_adam(h, 1, pdt, sdt, &t[k], gs[k], step); break;
    case REF_ADAM: fused_adam(h, 0, pdt, sdt, &t[k], gs[k], step); break;
    case REF_SGD: fused_sgd(h, pdt, sdt, &t[k], gs[k], step); break;
    case REF_ADAGRAD: fused_adagrad(h, pdt, sdt, &t[k], gs[k], step); break;
    case REF_LION:
    case REF_RMSPROP: break; /* ref_has_fused said no above */
    }
  }

  for (int k = 0; k < ntensors; k++)
    free(gs[k]);
  free(gs);
  if (rc != 0)
    return -1.0;
  return run->max_norm > 0.0 ? total : 0.0;
}

double ref_step(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t,
                int ntensors, double step, double num_tokens, double world_size,
                double max_norm) {
  RefRun run = ref_run_defaults();
  run.num_tokens = num_tokens;
  run.world_size = world_size;
  run.max_norm = max_norm;
  return ref_run(h, pdt, gdt, sdt, t, ntensors, step, &run);
}
