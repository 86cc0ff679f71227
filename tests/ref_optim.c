/* ref_optim.c: reference optimizer steps; see ref_optim.h for the semantics.
 *
 * Every f32 operation below is written as its own expression so that it is
 * rounded once. No multiply may be fused with an add into an FMA: build
 * with -ffp-contract=off; the pragmas below say the same to GCC and clang,
 * and every product also goes through mulf/muld, whose volatile store
 * rounds it even under clang -ffp-contract=fast (which ignores pragmas). */
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

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "ref_optim.c needs float arithmetic evaluated in float (FLT_EVAL_METHOD == 0)"
#endif

/* ---- storage -------------------------------------------------------------- */

float ref_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t ref_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
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

float ref_load(RefDType dt, const void *base, int64_t i) {
  if (dt == REF_BF16)
    return ref_bf16_to_f32(((const uint16_t *)base)[i]);
  return ((const float *)base)[i];
}

void ref_store(RefDType dt, void *base, int64_t i, float v) {
  if (dt == REF_BF16)
    ((uint16_t *)base)[i] = ref_f32_to_bf16(v);
  else
    ((float *)base)[i] = v;
}

float ref_round(RefDType dt, float v) {
  return dt == REF_BF16 ? ref_bf16_to_f32(ref_f32_to_bf16(v)) : v;
}

/* ---- element ops ------------------------------------------------------------ */

/* a * b, rounded to float (or double) before any later add can see it. */
static float mulf(float a, float b) {
  volatile float r = a * b;
  return r;
}

static double muld(double a, double b) {
  volatile double r = a * b;
  return r;
}

/* torch's scalar lerp: weight small ? self + w*(end - self) : end - (end - self)*(1 - w) */
static float lerp_f(float self, float end, float w) {
  float diff = end - self;
  if (fabsf(w) < 0.5f) {
    float t = mulf(w, diff);
    return self + t;
  }
  float omw = 1.0f - w;
  float t = mulf(diff, omw);
  return end - t;
}

/* torch.maximum: NaN if either operand is NaN, else the larger. */
static float max_f(float a, float b) {
  if (isnan(a))
    return a;
  if (isnan(b))
    return b;
  return a < b ? b : a;
}

/* torch.sign: (0 < x) - (x < 0); NaN and -0.0 give +0.0. */
static float sign_f(float x) { return (float)((0.0f < x) - (x < 0.0f)); }

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

/* ---- optimizers: one tensor, grads already scaled/clipped in gs[] ------------- */

static void step_adam(const RefHyper *h, int decoupled, RefDType pdt, RefDType sdt, RefTensor *t,
                      const float *gs, double step) {
  const int wd_on = h->weight_decay != 0.0;
  const float keepf = (float)(1.0 - muld(h->lr, h->weight_decay));
  const float wdf = (float)h->weight_decay;
  const float w1f = (float)(1.0 - h->beta1);
  const float beta2f = (float)h->beta2;
  const float w2f = (float)(1.0 - h->beta2);
  const double bc1 = 1.0 - pow(h->beta1, step);
  const double bc2 = 1.0 - pow(h->beta2, step);
  const double step_size = h->lr / bc1;
  const float bc2_sqrtf = (float)pow(bc2, 0.5);
  const float epsf = (float)h->eps;
  const float neg_step_sizef = (float)(-step_size);

  for (int64_t i = 0; i < t->n; i++) {
    float g = gs[i];
    if (h->maximize)
      g = -g;
    float p = ref_load(pdt, t->p, i);
    if (wd_on) {
      if (decoupled) {
        p = mulf(p, keepf);
      } else {
        float wp = mulf(wdf, p);
        g = g + wp;
      }
    }
    float m = ref_load(sdt, t->s[0], i);
    m = lerp_f(m, g, w1f);
    ref_store(sdt, t->s[0], i, m);

    float v = ref_load(sdt, t->s[1], i);
    float vd = mulf(v, beta2f);
    float gw = mulf(w2f, g);
    float ggw = mulf(gw, g);
    v = vd + ggw;
    ref_store(sdt, t->s[1], i, v);

    float vhat = v;
    if (h->amsgrad) {
      float vmax = ref_load(sdt, t->s[2], i);
      vmax = max_f(vmax, v);
      ref_store(sdt, t->s[2], i, vmax);
      vhat = vmax;
    }
    float root = sqrtf(vhat);
    float scaled = root / bc2_sqrtf;
    float denom = scaled + epsf;
    float num = mulf(neg_step_sizef, m);
    float upd = num / denom;
    p = p + upd;
    ref_store(pdt, t->p, i, p);
  }
}

static void step_sgd(const RefHyper *h, RefDType pdt, RefDType sdt, RefTensor *t, const float *gs,
                     double step) {
  const int wd_on = h->weight_decay != 0.0;
  const int mom_on = h->momentum != 0.0;
  const int first = step == 1.0;
  const float wdf = (float)h->weight_decay;
  const float momf = (float)h->momentum;
  const float undampf = (float)(1.0 - h->dampening);
  const float neg_lrf = (float)(-h->lr);

  for (int64_t i = 0; i < t->n; i++) {
    float g = gs[i];
    if (h->maximize)
      g = -g;
    float p = ref_load(pdt, t->p, i);
    if (wd_on) {
      float wp = mulf(wdf, p);
      g = g + wp;
    }
    if (mom_on) {
      float buf;
      if (first) {
        buf = g;
      } else {
        float b0 = ref_load(sdt, t->s[0], i);
        float bd = mulf(b0, momf);
        float gd = mulf(undampf, g);
        buf = bd + gd;
      }
      ref_store(sdt, t->s[0], i, buf);
      if (h->nesterov) {
        float mb = mulf(momf, buf);
        g = g + mb;
      } else {
        g = buf;
      }
    }
    float upd = mulf(neg_lrf, g);
    p = p + upd;
    ref_store(pdt, t->p, i, p);
  }
}

static void step_lion(const RefHyper *h, RefDType pdt, RefDType sdt, RefTensor *t, const float *gs) {
  const int wd_on = h->weight_decay != 0.0;
  const float keepf = (float)(1.0 - muld(h->lr, h->weight_decay));
  const float beta1f = (float)h->beta1;
  const float w1f = (float)(1.0 - h->beta1);
  const float beta2f = (float)h->beta2;
  const float w2f = (float)(1.0 - h->beta2);
  const float neg_lrf = (float)(-h->lr);

  for (int64_t i = 0; i < t->n; i++) {
    float g = gs[i];
    if (h->maximize)
      g = -g;
    float p = ref_load(pdt, t->p, i);
    if (wd_on)
      p = mulf(p, keepf);
    float m0 = ref_load(sdt, t->s[0], i);
    float mb1 = mulf(m0, beta1f);
    float gw1 = mulf(w1f, g);
    float c = mb1 + gw1;
    float u = sign_f(c);
    float upd = mulf(neg_lrf, u);
    p = p + upd;
    ref_store(pdt, t->p, i, p);
    float mb2 = mulf(m0, beta2f);
    float gw2 = mulf(w2f, g);
    float m1 = mb2 + gw2;
    ref_store(sdt, t->s[0], i, m1);
  }
}

static void step_adagrad(const RefHyper *h, RefDType pdt, RefDType sdt, RefTensor *t,
                         const float *gs, double step) {
  const int wd_on = h->weight_decay != 0.0;
  const float wdf = (float)h->weight_decay;
  const double clr = h->lr / (1.0 + muld((step - 1.0), h->lr_decay));
  const float neg_clrf = (float)(-clr);
  const float epsf = (float)h->eps;

  for (int64_t i = 0; i < t->n; i++) {
    float g = gs[i];
    if (h->maximize)
      g = -g;
    float p = ref_load(pdt, t->p, i);
    if (wd_on) {
      float wp = mulf(wdf, p);
      g = g + wp;
    }
    float s = ref_load(sdt, t->s[0], i);
    float gg = mulf(g, g);
    s = s + gg;
    ref_store(sdt, t->s[0], i, s);
    float root = sqrtf(s);
    float std = root + epsf;
    float num = mulf(neg_clrf, g);
    float upd = num / std;
    p = p + upd;
    ref_store(pdt, t->p, i, p);
  }
}

static void step_rmsprop(const RefHyper *h, RefDType pdt, RefDType sdt, RefTensor *t,
                         const float *gs) {
  const int wd_on = h->weight_decay != 0.0;
  const int mom_on = h->momentum > 0.0;
  const int i_buf = mom_on ? 1 : -1;
  const int i_ga = h->centered ? (mom_on ? 2 : 1) : -1;
  const float wdf = (float)h->weight_decay;
  const float alphaf = (float)h->alpha;
  const float wf = (float)(1.0 - h->alpha);
  const float epsf = (float)h->eps;
  const float momf = (float)h->momentum;
  const float neg_lrf = (float)(-h->lr);

  for (int64_t i = 0; i < t->n; i++) {
    float g = gs[i];
    if (h->maximize)
      g = -g;
    float p = ref_load(pdt, t->p, i);
    if (wd_on) {
      float wp = mulf(wdf, p);
      g = g + wp;
    }
    float sq = ref_load(sdt, t->s[0], i);
    float sqd = mulf(sq, alphaf);
    float gw = mulf(wf, g);
    float ggw = mulf(gw, g);
    sq = sqd + ggw;
    ref_store(sdt, t->s[0], i, sq);

    float ms = sq;
    if (h->centered) {
      float ga = ref_load(sdt, t->s[i_ga], i);
      ga = lerp_f(ga, g, wf);
      ref_store(sdt, t->s[i_ga], i, ga);
      float ga2 = mulf(ga, ga);
      ms = sq - ga2;
    }
    float root = sqrtf(ms);
    float avg = root + epsf;

    float upd;
    if (mom_on) {
      float b = ref_load(sdt, t->s[i_buf], i);
      float bd = mulf(b, momf);
      float ga = g / avg;
      b = bd + ga;
      ref_store(sdt, t->s[i_buf], i, b);
      upd = mulf(neg_lrf, b);
    } else {
      float num = mulf(neg_lrf, g);
      upd = num / avg;
    }
    p = p + upd;
    ref_store(pdt, t->p, i, p);
  }
}

/* ---- the step --------------------------------------------------------------------- */

double ref_step(const RefHyper *h, RefDType pdt, RefDType gdt, RefDType sdt, RefTensor *t,
                int ntensors, double step, double num_tokens, double world_size,
                double max_norm) {
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

  /* scale_grads: scale = world_size / num_tokens in float, grad *= scale,
   * held in the grad's dtype. */
  const float wsf = (float)world_size;
  const float ntf = (float)num_tokens;
  const float scale = wsf / ntf;
  for (int k = 0; k < ntensors; k++)
    for (int64_t i = 0; i < t[k].n; i++) {
      float g = ref_load(gdt, t[k].g, i);
      float gsc = mulf(g, scale);
      gs[k][i] = ref_round(gdt, gsc);
    }

  /* clip_grad_norm_: f64 sum of squares in element order, tensor after tensor. */
  double total = 0.0;
  if (max_norm > 0.0) {
    double sumsq = 0.0;
    for (int k = 0; k < ntensors; k++)
      for (int64_t i = 0; i < t[k].n; i++) {
        double d = (double)gs[k][i];
        double dd = muld(d, d);
        sumsq = sumsq + dd;
      }
    total = sqrt(sumsq);
    double coef = max_norm / (total + 1e-6);
    if (coef > 1.0) /* min(1.0, coef), NaN-propagating as torch.clamp */
      coef = 1.0;
    const float coeff = (float)coef;
    for (int k = 0; k < ntensors; k++)
      for (int64_t i = 0; i < t[k].n; i++) {
        float gc = mulf(gs[k][i], coeff);
        gs[k][i] = ref_round(gdt, gc);
      }
  }

  for (int k = 0; k < ntensors; k++) {
    switch (h->kind) {
    case REF_ADAMW: step_adam(h, 1, pdt, sdt, &t[k], gs[k], step); break;
    case REF_ADAM: step_adam(h, 0, pdt, sdt, &t[k], gs[k], step); break;
    case REF_SGD: step_sgd(h, pdt, sdt, &t[k], gs[k], step); break;
    case REF_LION: step_lion(h, pdt, sdt, &t[k], gs[k]); break;
    case REF_ADAGRAD: step_adagrad(h, pdt, sdt, &t[k], gs[k], step); break;
    case REF_RMSPROP: step_rmsprop(h, pdt, sdt, &t[k], gs[k]); break;
    }
  }

  for (int k = 0; k < ntensors; k++)
    free(gs[k]);
  free(gs);
  return max_norm > 0.0 ? total : 0.0;
}
