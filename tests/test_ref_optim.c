/* test_ref_optim.c: the C reference optimizers (ref_optim.c) against torch.
 *
 * Build and run alone:
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -ffp-contract=off -Wall -Wextra -Werror \
 *       tests/test_ref_optim.c tests/ref_optim.c -lm -o /tmp/t && /tmp/t
 *
 * Every expected value comes from torch itself: tests/gen_ref_cases.py ran
 * torch.optim (foreach=False, or fused=True; Lion: lion-pytorch's update_fn
 * op by op in torch) on inputs both sides draw from the same generator
 * (draw() below and there), and wrote what torch stored after the first and
 * the last step to ref_cases.h. The reference runs the same steps (fresh
 * grads each step, torchtune's scale_grads and clip_grad_norm_ given the
 * norm torch computed, torch's thread count) and must store the same bits:
 * any NaN matches any NaN, nothing else is tolerated. A mismatch prints how
 * many elements differ, the largest difference in ulps and where.
 *
 * The cases where torch's for-loop takes the sqrt of an f32 tensor ran on
 * an AVX-512 CPU, so their sqrt is MKL's: the reference computes it with
 * the CPU's own VRSQRT14, and without AVX-512F ref_run says so (-2) and the
 * case is skipped. If every case is skipped the test exits 77.
 *
 * Also from torch: each optimizer's defaults, and the f32 -> bf16/f16
 * conversions. What torch does not fix (how a NaN is stored) is checked
 * against optc's own convention. */
#include "ref_optim.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CASE_MAXT = 3, CASE_MAXSTEP = 5 };

/* One torch run; ref_cases.h holds them. */
typedef struct {
  const char *name;
  RefHyper h;                             /* every hyperparameter torch ran with */
  RefDType pdt, sdt;                      /* params and grads; states */
  int fused;                              /* fused=True, else the for-loop */
  RefSqrt sqrt;                           /* the for-loop's f32 sqrt on the CPU torch ran on */
  double num_tokens, world_size;          /* scale_grads: grad *= world_size / num_tokens */
  double max_norm;                        /* > 0: clip_grad_norm_(max_norm) */
  double norm[CASE_MAXSTEP];              /* torch's total norm at each step, when clipping */
  int nsteps, first_too;                  /* results stored after the last step, and step 1 if first_too */
  int ntensors;
  int64_t sizes[CASE_MAXT];
  uint64_t seed;                          /* draw()'s */
  int grad_log2;                          /* grads lie in [-2^grad_log2, 2^grad_log2) */
  int specials;                           /* NaN, +-inf, +-0, a subnormal in tensor 1's grads */
  const char *const *expect;              /* per stored step, per tensor: param, then states, in hex */
} RefCase;

#include "ref_cases.h"

static int checks, failures, skipped;

/* ---- the inputs, drawn as gen_ref_cases.py draws them ----------------------------- */

static uint64_t mix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Element i of tensor t: what 0 is the param, 1 + s step s's grad. A 24-bit
 * signed integer over 2^23, times 2^(top_log2 - e), e in 0..3: exact in f32. */
static float draw(uint64_t seed, int t, int what, int64_t i, int top_log2) {
  uint64_t u = mix64((seed << 40) ^ ((uint64_t)t << 36) ^ ((uint64_t)what << 32) ^ (uint64_t)i);
  int64_t mant = (int64_t)(u >> 40) - (1 << 23);
  int e = (int)((u >> 8) & 3);
  return (float)ldexp((double)mant, top_log2 - e - 23);
}

/* gen_ref_cases.py's SPECIALS, at these indices of tensor 1's grads */
static float special(int64_t i, int *is) {
  *is = 1;
  switch (i) {
  case 3: return NAN;
  case 5: return INFINITY;
  case 6: return -INFINITY;
  case 7: return -0.0f;
  case 8: return 0.0f;
  case 9: return 0x1p-130f;
  }
  *is = 0;
  return 0.0f;
}

/* ---- comparing stored bits ------------------------------------------------------------ */

static int is_nan_bits(RefDType dt, uint32_t b) {
  switch (dt) {
  case REF_BF16: return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
  case REF_F16: return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
  case REF_F32: break;
  }
  return (b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu) != 0;
}

/* Distance in ulps on the ordered integer line (+0 and -0 are 1 apart). */
static int64_t ulps(RefDType dt, uint32_t a, uint32_t b) {
  int bits = dt == REF_F32 ? 32 : 16;
  uint32_t sign = 1u << (bits - 1);
  int64_t x = (a & sign) ? -(int64_t)(a & (sign - 1)) - 1 : (int64_t)a;
  int64_t y = (b & sign) ? -(int64_t)(b & (sign - 1)) - 1 : (int64_t)b;
  return x > y ? x - y : y - x;
}

static uint32_t stored_bits(RefDType dt, const void *base, int64_t i) {
  if (dt == REF_F32) {
    uint32_t u;
    memcpy(&u, (const char *)base + 4 * i, 4);
    return u;
  }
  return ((const uint16_t *)base)[i];
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* One buffer of n elements against its expected hex string. */
static void check_buffer(const RefCase *c, int step, int t, const char *what, RefDType dt, const void *got,
                         int64_t n, const char *want) {
  const int digits = dt == REF_F32 ? 8 : 4;
  checks++;
  if ((int64_t)strlen(want) != n * digits) {
    failures++;
    printf("FAIL %s step %d tensor %d %s: ref_cases.h has %zu hex digits, want %" PRId64
           " (regenerate it with tests/gen_ref_cases.py)\n",
           c->name, step, t, what, strlen(want), n * digits);
    return;
  }
  int64_t bad = 0, worst_at = -1, worst = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t w = 0;
    for (int k = 0; k < digits; k++)
      w = w << 4 | (uint32_t)hexval(want[i * digits + k]);
    uint32_t g = stored_bits(dt, got, i);
    if (g == w || (is_nan_bits(dt, g) && is_nan_bits(dt, w)))
      continue;
    int64_t d = is_nan_bits(dt, g) || is_nan_bits(dt, w) ? INT64_MAX : ulps(dt, g, w);
    if (bad++ == 0 || d > worst)
      worst = d, worst_at = i;
  }
  if (bad == 0)
    return;
  failures++;
  uint32_t w = 0;
  for (int k = 0; k < digits; k++)
    w = w << 4 | (uint32_t)hexval(want[worst_at * digits + k]);
  float gv = ref_load(dt, got, worst_at);
  float wv = dt == REF_F32 ? 0 : dt == REF_BF16 ? ref_bf16_to_f32((uint16_t)w) : ref_f16_to_f32((uint16_t)w);
  if (dt == REF_F32)
    memcpy(&wv, &w, sizeof wv);
  printf("FAIL %s step %d tensor %d (%" PRId64 " elements) %s: %" PRId64 " differ from torch; largest %s%" PRId64
         " ulp at [%" PRId64 "]: got %.9g (0x%0*" PRIx32 "), torch %.9g (0x%0*" PRIx32 ")\n",
         c->name, step, t, n, what, bad, worst == INT64_MAX ? "(NaN vs number) " : "",
         worst == INT64_MAX ? (int64_t)0 : worst, worst_at, gv, digits, stored_bits(dt, got, worst_at), wv, digits,
         w);
}

/* ---- one case --------------------------------------------------------------------------- */

static void *alloc_elems(int64_t n, RefDType dt) { return calloc((size_t)(n > 0 ? n : 1), (size_t)ref_dtype_size(dt)); }

static void run_case(const RefCase *c) {
  const int ns = ref_state_count(&c->h);
  RefTensor t[CASE_MAXT];
  void *grads[CASE_MAXT], *gcopy[CASE_MAXT];
  memset(t, 0, sizeof t);
  for (int k = 0; k < c->ntensors; k++) {
    int64_t n = c->sizes[k];
    t[k].n = n;
    t[k].p = alloc_elems(n, c->pdt);
    grads[k] = alloc_elems(n, c->pdt);
    gcopy[k] = alloc_elems(n, c->pdt);
    t[k].g = grads[k];
    for (int64_t i = 0; i < n; i++)
      ref_store(c->pdt, t[k].p, i, draw(c->seed, k, 0, i, 1));
    for (int j = 0; j < ns; j++) {
      t[k].s[j] = alloc_elems(n, c->sdt);
      for (int64_t i = 0; i < n; i++)
        ref_store(c->sdt, t[k].s[j], i, ref_state_init(&c->h, j));
    }
  }
  RefRun run = ref_run_defaults();
  run.fused = c->fused;
  run.sqrt = c->sqrt;
  run.threads = REF_CASES_THREADS;
  run.num_tokens = c->num_tokens;
  run.world_size = c->world_size;
  run.max_norm = c->max_norm;
  const char *const *want = c->expect;
  int ok = 1;
  for (int step = 1; step <= c->nsteps && ok; step++) {
    for (int k = 0; k < c->ntensors; k++) {
      for (int64_t i = 0; i < t[k].n; i++) {
        int is;
        float v = special(i, &is);
        ref_store(c->pdt, grads[k], i, c->specials && k == 1 && is ? v : draw(c->seed, k, step, i, c->grad_log2));
      }
      memcpy(gcopy[k], grads[k], (size_t)t[k].n * (size_t)ref_dtype_size(c->pdt));
    }
    run.grad_norm = c->max_norm > 0 ? c->norm[step - 1] : -1.0;
    double r = ref_run(&c->h, c->pdt, c->pdt, c->sdt, t, c->ntensors, step, &run);
    if (r == -2.0) {
      skipped++;
      printf("%-44s skipped: torch's f32 sqrt here is MKL's AVX-512 one, and this CPU has no AVX-512F\n",
             c->name);
      ok = 0;
      break;
    }
    checks++;
    if (r < 0 || (c->max_norm > 0 && r != c->norm[step - 1])) {
      failures++;
      printf("FAIL %s step %d: ref_run returned %.17g\n", c->name, step, r);
      ok = 0;
      break;
    }
    for (int k = 0; k < c->ntensors; k++) {
      checks++;
      if (memcmp(gcopy[k], grads[k], (size_t)t[k].n * (size_t)ref_dtype_size(c->pdt)) != 0) {
        failures++;
        printf("FAIL %s step %d: ref_run modified tensor %d's grads\n", c->name, step, k);
      }
    }
    if (!(step == c->nsteps || (step == 1 && c->first_too)))
      continue;
    for (int k = 0; k < c->ntensors; k++) {
      check_buffer(c, step, k, "param", c->pdt, t[k].p, t[k].n, *want++);
      for (int j = 0; j < ns; j++)
        check_buffer(c, step, k, ref_state_name(&c->h, j), c->sdt, t[k].s[j], t[k].n, *want++);
    }
  }
  if (ok)
    printf("%-44s torch's bits, %d steps\n", c->name, c->nsteps);
  for (int k = 0; k < c->ntensors; k++) {
    free(t[k].p);
    free(grads[k]);
    free(gcopy[k]);
    for (int j = 0; j < ns; j++)
      free(t[k].s[j]);
  }
}

/* ---- what else torch fixes ---------------------------------------------------------------- */

static void expect(int ok, const char *what) {
  checks++;
  if (!ok) {
    failures++;
    printf("FAIL %s\n", what);
  }
}

static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Rounding to bf16 and f16 as Tensor.to does, and f16 widening as .float() does. */
static void test_rounding(void) {
  for (size_t i = 0; i < sizeof ref_case_rounding / sizeof ref_case_rounding[0]; i++) {
    const uint32_t *r = ref_case_rounding[i];
    uint16_t b = ref_f32_to_bf16(f32_of(r[0])), h = ref_f32_to_f16(f32_of(r[0]));
    uint32_t hw = bits_of(ref_f16_to_f32(h));
    checks++;
    if (b != r[1] || h != r[2] || hw != r[3]) {
      failures++;
      printf("FAIL rounding 0x%08" PRIx32 ": bf16 0x%04x, f16 0x%04x widened 0x%08" PRIx32
             "; torch: 0x%04" PRIx32 ", 0x%04" PRIx32 ", 0x%08" PRIx32 "\n",
             r[0], b, h, hw, r[1], r[2], r[3]);
    }
  }
  expect(bits_of(ref_bf16_to_f32(0xbf82)) == 0xbf820000u, "bf16 widening");
}

/* How a NaN is stored is optc's convention (the quiet NaN with its sign), not
 * torch's, whose payloads vary: NaN matches any NaN in the comparisons. */
static void test_nan_convention(void) {
  static const struct { uint32_t in; uint16_t bf16, f16; } t[] = {
      {0x7fc00000, 0x7fc0, 0x7e00}, {0xffc00001, 0xffc0, 0xfe00}, /* -NaN keeps its sign */
      {0x7f800001, 0x7fc0, 0x7e00},                              /* a signalling NaN is quieted */
      {0x7fffffff, 0x7fc0, 0x7e00},                              /* must not carry into the sign */
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    uint16_t b = ref_f32_to_bf16(f32_of(t[i].in)), h = ref_f32_to_f16(f32_of(t[i].in));
    checks++;
    if (b != t[i].bf16 || h != t[i].f16) {
      failures++;
      printf("FAIL NaN 0x%08" PRIx32 ": bf16 0x%04x, f16 0x%04x; want 0x%04x, 0x%04x\n", t[i].in, b, h, t[i].bf16,
             t[i].f16);
    }
  }
}

/* ref_defaults against inspect.signature(torch.optim.X.__init__) (Lion: lion-pytorch's). */
static void test_defaults(void) {
  for (int k = REF_ADAMW; k <= REF_RMSPROP; k++) {
    RefHyper a = ref_defaults((RefOptim)k), b = ref_case_defaults[k];
    char what[64];
    snprintf(what, sizeof what, "%s defaults are torch's", ref_optim_name((RefOptim)k));
    expect(a.kind == b.kind && a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
               a.weight_decay == b.weight_decay && a.momentum == b.momentum && a.dampening == b.dampening &&
               a.alpha == b.alpha && a.lr_decay == b.lr_decay &&
               a.initial_accumulator_value == b.initial_accumulator_value && a.amsgrad == b.amsgrad &&
               a.maximize == b.maximize && a.nesterov == b.nesterov && a.centered == b.centered,
           what);
  }
}

static int names_are(const RefHyper *h, const char *const *want, int n) {
  if (ref_state_count(h) != n || ref_state_name(h, n) != NULL)
    return 0;
  for (int i = 0; i < n; i++)
    if (strcmp(ref_state_name(h, i), want[i]) != 0 || ref_state_index(h, want[i]) != i)
      return 0;
  return 1;
}

/* State names and order: torch's state dict insertion order (gen_ref_cases.py
 * checks that torch keeps exactly these). */
static void test_state_names(void) {
  RefHyper h = ref_defaults(REF_ADAMW);
  static const char *const adam2[] = {"exp_avg", "exp_avg_sq"};
  static const char *const adam3[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  expect(names_are(&h, adam2, 2), "AdamW state names");
  h.amsgrad = 1;
  expect(names_are(&h, adam3, 3), "AdamW amsgrad state names");
  h = ref_defaults(REF_SGD);
  expect(names_are(&h, NULL, 0), "SGD without momentum has no state");
  h.momentum = 0.9;
  static const char *const sgd[] = {"momentum_buffer"};
  expect(names_are(&h, sgd, 1), "SGD state names");
  h = ref_defaults(REF_LION);
  static const char *const lion[] = {"exp_avg"};
  expect(names_are(&h, lion, 1), "Lion state names");
  h = ref_defaults(REF_ADAGRAD);
  h.initial_accumulator_value = 0.25;
  static const char *const adagrad[] = {"sum"};
  expect(names_are(&h, adagrad, 1) && ref_state_init(&h, 0) == 0.25f, "Adagrad state names and init");
  h = ref_defaults(REF_RMSPROP);
  static const char *const rms1[] = {"square_avg"};
  static const char *const rms3[] = {"square_avg", "momentum_buffer", "grad_avg"};
  static const char *const rms2[] = {"square_avg", "grad_avg"};
  expect(names_are(&h, rms1, 1) && ref_state_init(&h, 0) == 0.0f, "RMSprop state names");
  h.centered = 1;
  expect(names_are(&h, rms2, 2), "RMSprop centered state names");
  h.momentum = 0.9;
  expect(names_are(&h, rms3, 3), "RMSprop centered+momentum state names");
  expect(ref_state_index(&h, "exp_avg") == -1, "absent state index");
}

int main(void) {
  test_rounding();
  test_nan_convention();
  test_defaults();
  test_state_names();
  const int ncases = (int)(sizeof ref_cases / sizeof ref_cases[0]);
  for (int i = 0; i < ncases; i++)
    run_case(&ref_cases[i]);
  printf("test_ref_optim: %d cases from torch %s (%d skipped), %d checks, %d failed\n", ncases, REF_CASES_TORCH,
         skipped, checks, failures);
  if (failures)
    return 1;
  return skipped == ncases ? 77 : 0;
}
