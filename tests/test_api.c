/* test_api: liboptc through include/optc.h alone (linked against the
 * shared library, nothing else of optc).
 *
 * - steps over tensors that are separate allocations, sized so that every
 *   tail is short, with nothing past their ends touched (guard bytes);
 * - the numbers: SGD and AdamW computed here in plain C as torch computes
 *   them (fp32, IEEE sqrt: torch_cpu avx2), bit for bit, over 3 steps;
 * - a schedule: lr changes between runs, same step object;
 * - threads: a step on its own pool and on one the caller gives it;
 * - clipping: NORM against GIVEN with the norm NORM reported, and
 *   optc.grad_norm's sum of squares;
 * - nonfinite grads: PROPAGATE, SKIP, ERROR;
 * - a sharded group (optc_step_run_shard): 2 and 3 ranks, each owning one
 *   slice or a piece of each of three units (ranges; and the norm's
 *   partials unit by unit first, optc_step_partials), as threads with
 *   their own step objects over one flat group, give the one-rank run's
 *   bytes and norm, clipping included, and skip together;
 * - bad input: every one an error code and a message, never an exit. */
#include "optc.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

enum { NT = 4, GUARD = 64 };
static const int64_t numel[NT] = {7, 1, 1000, 4097};

static uint64_t rng = 12345;
static float uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0) * 2 - 1;
}

/* n floats with GUARD poisoned floats after them */
static float *alloc_tensor(int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n + GUARD));
  for (int64_t i = 0; i < n + GUARD; i++)
    p[i] = i < n ? uniform() : -12345.0f;
  return p;
}

static int guards_intact(float *p, int64_t n) {
  for (int64_t i = n; i < n + GUARD; i++)
    if (p[i] != -12345.0f)
      return 0;
  return 1;
}

typedef struct {
  float *param[NT], *grad[NT], *state[4][NT];
  void *pp[NT], *gp[NT], *sp[4 * NT];
  optc_buffers b;
} Tensors;

static void tensors_init(Tensors *t, int nstates) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < NT; i++) {
    t->pp[i] = t->param[i] = alloc_tensor(numel[i]);
    t->gp[i] = t->grad[i] = alloc_tensor(numel[i]);
    for (int k = 0; k < nstates; k++) {
      t->state[k][i] = alloc_tensor(numel[i]);
      memset(t->state[k][i], 0, sizeof(float) * (size_t)numel[i]);
      t->sp[k * NT + i] = t->state[k][i];
    }
  }
  t->b = (optc_buffers){.ntensors = NT, .numel = numel, .param = t->pp, .grad = t->gp, .state = t->sp};
}

static void tensors_free(Tensors *t) {
  for (int i = 0; i < NT; i++) {
    free(t->param[i]);
    free(t->grad[i]);
    for (int k = 0; k < 4; k++)
      free(t->state[k][i]);
  }
}

static int all_guards(Tensors *t, int nstates) {
  int ok = 1;
  for (int i = 0; i < NT; i++) {
    ok &= guards_intact(t->param[i], numel[i]) && guards_intact(t->grad[i], numel[i]);
    for (int k = 0; k < nstates; k++)
      ok &= guards_intact(t->state[k][i], numel[i]);
  }
  return ok;
}

static int bits_equal(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* SGD with momentum 0.9, dampening 0.1, weight decay 0.01, as torch's
 * for-loop computes it in fp32: grad.add(param, alpha=wd) is one fma, and
 * so are buf.mul_(m).add_(grad, alpha=1-d) and param.add_(buf, alpha=-lr). */
static void test_sgd(void) {
  optc_scalar opts[] = {{"momentum", 0.9}, {"dampening", 0.1}, {"weight_decay", 0.01}};
  optc_spec spec = optc_spec_default("torch.optim.SGD");
  spec.options = opts;
  spec.noptions = 3;
  optc_step *s = NULL;
  optc_error err;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_OK, "SGD builds: %s", err.message);
  if (!s)
    return;
  CHECK(optc_step_num_states(s) == 1 && !strcmp(optc_step_state_name(s, 0), "momentum_buffer"),
        "SGD keeps one state, momentum_buffer");
  Tensors t;
  tensors_init(&t, 1);
  float *p0[NT], *buf[NT];
  for (int i = 0; i < NT; i++) {
    p0[i] = malloc(sizeof(float) * (size_t)numel[i]);
    buf[i] = calloc((size_t)numel[i], sizeof(float));
    memcpy(p0[i], t.param[i], sizeof(float) * (size_t)numel[i]);
  }
  int same = 1;
  for (int step = 1; step <= 3; step++) {
    double lr = 0.1 / step; /* a schedule: no rebuild */
    optc_scalar sc[] = {{"lr", lr}, {"step", step}};
    optc_result res;
    CHECK(optc_step_run(s, &t.b, sc, 2, step, &res, &err) == OPTC_OK, "SGD step %d: %s", step, err.message);
    for (int i = 0; i < NT; i++)
      for (int64_t j = 0; j < numel[i]; j++) {
        float g = fmaf((float)0.01, p0[i][j], t.grad[i][j]);
        float b = step == 1 ? g : fmaf((float)(1 - 0.1), g, buf[i][j] * (float)0.9);
        buf[i][j] = b;
        p0[i][j] = fmaf((float)-lr, b, p0[i][j]);
        same &= bits_equal(p0[i][j], t.param[i][j]) && bits_equal(b, t.state[0][i][j]);
      }
  }
  CHECK(same, "SGD: torch's bits over 3 steps, lr changing");
  CHECK(all_guards(&t, 1), "SGD: nothing past any tensor's end was touched");
  /* a build decision cannot change at run time */
  optc_scalar zero[] = {{"lr", 0.1}, {"step", 4}, {"momentum", 0.0}};
  CHECK(optc_step_run(s, &t.b, zero, 3, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "momentum"),
        "momentum 0 on a step built with momentum: %s", err.message);
  optc_scalar unknown[] = {{"lr", 0.1}, {"step", 4}, {"betas", 0.9}};
  CHECK(optc_step_run(s, &t.b, unknown, 3, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "betas"),
        "an unknown scalar: %s", err.message);
  optc_scalar neg[] = {{"lr", -1.0}, {"step", 4}};
  CHECK(optc_step_run(s, &t.b, neg, 2, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "lr"),
        "lr out of range: %s", err.message);
  for (int i = 0; i < NT; i++)
    free(p0[i]), free(buf[i]);
  tensors_free(&t);
  optc_step_free(s);
}

/* AdamW's first three steps in fp32 with IEEE sqrt (torch_cpu avx2). */
static void test_adamw(void) {
  optc_scalar opts[] = {{"weight_decay", 0.01}};
  optc_spec spec = optc_spec_default("adamw");
  spec.options = opts;
  spec.noptions = 1;
  spec.torch_cpu = "avx2";
  optc_step *s = NULL;
  optc_error err;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_OK, "AdamW builds: %s", err.message);
  if (!s)
    return;
  CHECK(optc_step_num_states(s) == 2, "AdamW keeps exp_avg and exp_avg_sq (%d)", optc_step_num_states(s));
  CHECK(optc_step_bytes_per_element(s) == 28, "AdamW fp32 moves 28 bytes per element (%d)", optc_step_bytes_per_element(s));
  Tensors t;
  tensors_init(&t, 2);
  int same = 1;
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  float *p[NT], *m[NT], *v[NT];
  for (int i = 0; i < NT; i++) {
    p[i] = malloc(sizeof(float) * (size_t)numel[i]);
    m[i] = calloc((size_t)numel[i], sizeof(float));
    v[i] = calloc((size_t)numel[i], sizeof(float));
    memcpy(p[i], t.param[i], sizeof(float) * (size_t)numel[i]);
  }
  /* step 1 on the step's own 2 threads, step 2 on a caller's pool of 3, step 3 on its own again */
  optc_pool *pool = optc_pool_new(3);
  CHECK(pool && optc_pool_threads(pool) == 3, "a pool of 3 threads");
  for (int step = 1; step <= 3; step++) {
    optc_scalar sc[] = {{"step", step}};
    if (step >= 2)
      CHECK(optc_step_set_pool(s, step == 2 ? pool : NULL, &err) == OPTC_OK, "set_pool: %s", err.message);
    CHECK(optc_step_run(s, &t.b, sc, 1, 2, NULL, &err) == OPTC_OK, "AdamW step %d: %s", step, err.message);
    double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step), ss = lr / bc1, bc2s = pow(bc2, 0.5);
    for (int i = 0; i < NT; i++)
      for (int64_t j = 0; j < numel[i]; j++) {
        float g = t.grad[i][j];
        float pp = p[i][j] * (float)(1 - lr * wd);
        float w = (float)(1 - b1);
        m[i][j] = fmaf(w, g - m[i][j], m[i][j]);
        v[i][j] = fmaf((float)(1 - b2) * g, g, v[i][j] * (float)b2);
        float denom = sqrtf(v[i][j]) / (float)bc2s + (float)eps;
        p[i][j] = pp + ((float)-ss * m[i][j]) / denom;
        same &= bits_equal(p[i][j], t.param[i][j]) && bits_equal(m[i][j], t.state[0][i][j]) &&
                bits_equal(v[i][j], t.state[1][i][j]);
      }
  }
  CHECK(same, "AdamW: torch's bits over 3 steps, on its own threads and on the caller's pool");
  optc_pool_free(pool);
  CHECK(optc_pool_new(5000) == NULL, "a pool of 5000 threads is refused");
  CHECK(optc_step_set_pool(NULL, NULL, &err) == OPTC_ERR_INVALID, "set_pool without a step: %s", err.message);
  CHECK(all_guards(&t, 2), "AdamW: nothing past any tensor's end was touched");
  for (int i = 0; i < NT; i++)
    free(p[i]), free(m[i]), free(v[i]);
  tensors_free(&t);
  optc_step_free(s);
}

/* Clipping: the norm computed in the step, the same norm given, and
 * optc.grad_norm's measure, all agree; NORM and GIVEN give the same bytes. */
static void test_clip(void) {
  optc_spec spec = optc_spec_default("torch.optim.SGD");
  spec.clip = OPTC_CLIP_NORM;
  optc_step *norm = NULL, *given = NULL, *measure = NULL;
  optc_error err;
  CHECK(optc_step_new(&spec, &norm, &err) == OPTC_OK, "SGD clip NORM: %s", err.message);
  spec.clip = OPTC_CLIP_GIVEN;
  CHECK(optc_step_new(&spec, &given, &err) == OPTC_OK, "SGD clip GIVEN: %s", err.message);
  optc_spec m = optc_spec_default("optc.grad_norm");
  CHECK(optc_step_new(&m, &measure, &err) == OPTC_OK, "optc.grad_norm: %s", err.message);
  if (!norm || !given || !measure)
    return;
  Tensors a, b;
  rng = 777;
  tensors_init(&a, 0);
  rng = 777;
  tensors_init(&b, 0);
  optc_scalar scale[] = {{"grad_scale", 0.25}};
  optc_result rm, ra, rb;
  CHECK(optc_step_run(measure, &a.b, scale, 1, 1, &rm, &err) == OPTC_OK, "measure: %s", err.message);
  optc_scalar sa[] = {{"lr", 0.1}, {"max_norm", 0.5}, {"grad_scale", 0.25}};
  CHECK(optc_step_run(norm, &a.b, sa, 3, 2, &ra, &err) == OPTC_OK, "NORM: %s", err.message);
  CHECK(ra.grad_sumsq == rm.grad_sumsq && ra.grad_norm == sqrt(rm.grad_sumsq) && ra.grad_norm > 0.5,
        "the step's norm is optc.grad_norm's: %.17g, %.17g", ra.grad_norm, sqrt(rm.grad_sumsq));
  optc_scalar sb[] = {{"lr", 0.1}, {"max_norm", 0.5}, {"grad_scale", 0.25}, {"grad_norm_given", ra.grad_norm}};
  CHECK(optc_step_run(given, &b.b, sb, 4, 3, &rb, &err) == OPTC_OK, "GIVEN: %s", err.message);
  int same = 1;
  for (int i = 0; i < NT; i++)
    same &= memcmp(a.param[i], b.param[i], sizeof(float) * (size_t)numel[i]) == 0;
  CHECK(same && rb.grad_norm == ra.grad_norm, "NORM and GIVEN give the same bytes");
  optc_scalar none[] = {{"lr", 0.1}, {"max_norm", 0.5}};
  CHECK(optc_step_run(given, &b.b, none, 2, 1, &rb, &err) == OPTC_ERR_INVALID && strstr(err.message, "grad_norm_given"),
        "GIVEN without the norm: %s", err.message);
  tensors_free(&a);
  tensors_free(&b);
  optc_step_free(norm);
  optc_step_free(given);
  optc_step_free(measure);
}

static void test_nonfinite(void) {
  optc_nonfinite modes[] = {OPTC_NONFINITE_PROPAGATE, OPTC_NONFINITE_SKIP, OPTC_NONFINITE_ERROR};
  for (int k = 0; k < 3; k++) {
    optc_spec spec = optc_spec_default("torch.optim.SGD");
    spec.nonfinite = modes[k];
    optc_step *s = NULL;
    optc_error err;
    CHECK(optc_step_new(&spec, &s, &err) == OPTC_OK, "SGD nonfinite %d: %s", k, err.message);
    if (!s)
      continue;
    Tensors t;
    tensors_init(&t, 0);
    t.grad[2][500] = NAN;
    float before = t.param[3][7];
    optc_scalar sc[] = {{"lr", 0.1}};
    optc_result res;
    optc_status st = optc_step_run(s, &t.b, sc, 1, 1, &res, &err);
    if (k == 0)
      CHECK(st == OPTC_OK && !res.skipped && isnan(t.param[2][500]) && t.param[3][7] != before,
            "PROPAGATE: the step runs and the NaN spreads, as in torch");
    else if (k == 1)
      CHECK(st == OPTC_OK && res.skipped && !isnan(t.param[2][500]) && t.param[3][7] == before,
            "SKIP: nothing changes, and it says so");
    else
      CHECK(st == OPTC_ERR_NONFINITE && t.param[3][7] == before && strstr(err.message, "non-finite"),
            "ERROR: an error, nothing changed: %s", err.message);
    tensors_free(&t);
    optc_step_free(s);
  }
}

/* SKIP finds a NaN or an Inf wherever it sits: in the first element of a
 * tensor, inside a vector, in the scalar tail after the last whole vector
 * of a chunk, in a 16-bit or an f32 grad; with clip (the norm pass is the
 * check) and without (a pass over the grads of its own). */
static void test_nonfinite_anywhere(void) {
  static const int64_t n[3] = {3, 70, 5000};
  const int64_t spots[][2] = {{0, 0}, {0, 2}, {1, 0}, {1, 33}, {1, 69}, {2, 4095}, {2, 4096}, {2, 4999}};
  const float bads[3] = {NAN, INFINITY, -INFINITY};
  for (int dt = 0; dt < 2; dt++)
    for (int clip = 0; clip < 2; clip++) {
      optc_spec spec = optc_spec_default("torch.optim.SGD");
      spec.param_dtype = spec.grad_dtype = spec.state_dtype = dt ? OPTC_BF16 : OPTC_F32;
      spec.clip = clip ? OPTC_CLIP_NORM : OPTC_CLIP_NONE;
      spec.nonfinite = OPTC_NONFINITE_SKIP;
      optc_step *s = NULL;
      optc_error err;
      CHECK(optc_step_new(&spec, &s, &err) == OPTC_OK, "SGD %s: %s", dt ? "bf16" : "f32", err.message);
      if (!s)
        continue;
      size_t es = dt ? 2 : 4;
      int bad_seen = 0, cases = 0;
      for (int k = -1; k < (int)(sizeof spots / sizeof spots[0]); k++)
        for (int b = 0; b < (k < 0 ? 1 : 3); b++) {
          void *param[3], *grad[3], *before[3];
          for (int t = 0; t < 3; t++) {
            param[t] = malloc(es * (size_t)n[t]);
            grad[t] = malloc(es * (size_t)n[t]);
            before[t] = malloc(es * (size_t)n[t]);
            for (int64_t i = 0; i < n[t]; i++) {
              float pv = 0.25f + 0.001f * (float)i, gv = 0.01f * (float)((i % 7) - 3);
              if (dt) {
                uint32_t pu, gu;
                memcpy(&pu, &pv, 4);
                memcpy(&gu, &gv, 4);
                ((uint16_t *)param[t])[i] = (uint16_t)(pu >> 16);
                ((uint16_t *)grad[t])[i] = (uint16_t)(gu >> 16);
              } else {
                ((float *)param[t])[i] = pv;
                ((float *)grad[t])[i] = gv;
              }
            }
            memcpy(before[t], param[t], es * (size_t)n[t]);
          }
          if (k >= 0) {
            int t = (int)spots[k][0];
            int64_t i = spots[k][1];
            if (dt) {
              uint32_t u;
              memcpy(&u, &bads[b], 4);
              ((uint16_t *)grad[t])[i] = (uint16_t)(u >> 16);
            } else {
              ((float *)grad[t])[i] = bads[b];
            }
          }
          optc_buffers bb = {.ntensors = 3, .numel = n, .param = param, .grad = grad};
          optc_scalar sc[] = {{"lr", 0.1}, {"max_norm", 1.0}};
          optc_result res;
          optc_status st = optc_step_run(s, &bb, sc, clip ? 2 : 1, 1, &res, &err);
          int same = 1;
          for (int t = 0; t < 3; t++)
            same &= memcmp(before[t], param[t], es * (size_t)n[t]) == 0;
          cases++;
          bad_seen += st == OPTC_OK && res.skipped == (k >= 0) && same == (k >= 0);
          for (int t = 0; t < 3; t++) {
            free(param[t]);
            free(grad[t]);
            free(before[t]);
          }
        }
      CHECK(bad_seen == cases, "SKIP, %s grads, clip %s: %d of %d cases right (a clean step runs; "
            "NaN, +Inf, -Inf at 8 places are skipped with nothing written)", dt ? "bf16" : "f32",
            clip ? "norm" : "none", bad_seen, cases);
      optc_step_free(s);
    }
}

static void test_bad_input(void) {
  optc_step *s = NULL;
  optc_error err;
  optc_spec spec = optc_spec_default("torch.optim.Adamax");
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_ERR_SPEC && strstr(err.message, "Adamax") && !s,
        "an unknown optimizer: %s", err.message);
  optc_scalar bad[] = {{"betas", 0.9}};
  spec = optc_spec_default("torch.optim.AdamW");
  spec.options = bad;
  spec.noptions = 1;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_ERR_SPEC && strstr(err.message, "betas"), "a scalar betas: %s",
        err.message);
  optc_scalar lr[] = {{"lr", -0.5}};
  spec.options = lr;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_ERR_SPEC && strstr(err.message, "out of range"),
        "a negative lr: %s", err.message);
  spec = optc_spec_default("torch.optim.RMSprop");
  spec.fused = 1;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_ERR_SPEC && strstr(err.message, "fused"), "fused RMSprop: %s",
        err.message);
  spec = optc_spec_default("sgd");
  spec.param_dtype = (optc_dtype)9;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_ERR_INVALID, "a bad dtype: %s", err.message);
  CHECK(optc_step_new(NULL, &s, &err) == OPTC_ERR_INVALID, "no spec");
  const char *yaml = "optimizer:\n  _component_: torch.optim.AdamW\n  lr: [1, 2]\n";
  CHECK(optc_step_from_recipe("r.yaml", yaml, NULL, 0, OPTC_TARGET_CPU, &s, &err) == OPTC_ERR_SPEC &&
            strstr(err.message, "r.yaml:3:"),
        "a recipe's error has its position: %s", err.message);
  const char *ov[] = {"optimizer.lr=0.5", "clip_grad_norm=1.0"};
  yaml = "optimizer:\n  _component_: torch.optim.AdamW\n";
  CHECK(optc_step_from_recipe("r.yaml", yaml, ov, 2, OPTC_TARGET_CPU, &s, &err) == OPTC_OK && s,
        "a recipe with overrides: %s", err.message);
  if (s) {
    CHECK(strstr(optc_step_ir(s), "max_norm") && strstr(optc_step_plan(s), "phase 1"), "its IR and plan");
    optc_buffers b = {.ntensors = 1};
    CHECK(optc_step_run(s, &b, NULL, 0, 1, NULL, &err) == OPTC_ERR_INVALID, "a NULL numel table: %s", err.message);
    int64_t n1 = 5;
    void *null[2] = {NULL, NULL}; /* AdamW's two states: state[k * ntensors + t] */
    b = (optc_buffers){.ntensors = 1, .numel = &n1, .param = null, .grad = null, .state = null};
    optc_scalar sc[] = {{"step", 1}};
    CHECK(optc_step_run(s, &b, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "NULL"),
          "NULL tensor pointers: %s", err.message);
    int64_t n0 = 0;
    b.numel = &n0;
    CHECK(optc_step_run(s, &b, sc, 1, 1, NULL, &err) == OPTC_OK, "an empty tensor may be NULL: %s", err.message);
    CHECK(optc_step_run(s, &b, NULL, 0, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "step"),
          "no step: %s", err.message);
    optc_step_free(s);
  }
  spec = optc_spec_default("sgd");
  spec.target = OPTC_TARGET_CUDA;
  optc_status st = optc_step_new(&spec, &s, &err);
  CHECK(st == OPTC_OK || st == OPTC_ERR_COMPILE, "CUDA builds or says why: %s", err.message);
  optc_step_free(s);
}

/* ---- a sharded group: ranks as threads ------------------------------------------ */
enum { SNT = 5, MAXRANKS = 3 };
static const int64_t snumel[SNT] = {5000, 3, 9001, 4097, 1};

typedef struct {
  int world;
  pthread_barrier_t bar;
  const double *part[MAXRANKS]; /* each rank's partials, while a gather runs */
  int64_t npart[MAXRANKS], first[MAXRANKS];
  int flag[MAXRANKS];
  const optc_shard *sh[MAXRANKS]; /* each rank's shard: where its ranges' chunks go */
} World;

typedef struct {
  World *w;
  int rank;
  optc_step *s;
  optc_buffers b;
  optc_shard sh;
  bool two_part; /* the norm's partials range by range first (optc_step_partials), then the step with them */
  const optc_scalar *sc;
  int nsc;
  optc_status st;
  optc_result res;
  int tiled; /* the chunks' places (first, nglobal) tiled the group */
  char msg[sizeof(optc_error)];
} Rank;

/* An all-gather in rank order; it checks that the ranks' chunks tile the group's. */
static int rank_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                       double *global) {
  Rank *r = ctx;
  World *w = r->w;
  w->part[r->rank] = local;
  w->npart[r->rank] = nlocal * width;
  w->first[r->rank] = first;
  pthread_barrier_wait(&w->bar);
  int64_t at = 0;
  for (int k = 0; k < w->world; k++) {
    if (w->first[k] * width != at)
      r->tiled = 0;
    memcpy(global + at, w->part[k], sizeof(double) * (size_t)w->npart[k]);
    at += w->npart[k];
  }
  if (at != nglobal * width)
    r->tiled = 0;
  pthread_barrier_wait(&w->bar); /* every rank has read every slot */
  return 0;
}

/* The same for ranks that each own a piece of every unit (optc_shard's
 * ranges): each range's chunks put at optc_chunk_index's place; the places
 * must tile the group. */
static int ranges_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                         double *global) {
  Rank *r = ctx;
  World *w = r->w;
  w->part[r->rank] = local;
  w->npart[r->rank] = nlocal;
  w->sh[r->rank] = &r->sh;
  pthread_barrier_wait(&w->bar);
  char *seen = calloc((size_t)nglobal + 1, 1);
  int64_t placed = 0;
  if (optc_chunk_index(SNT, snumel, r->sh.ranges[0]) != first)
    r->tiled = 0;
  for (int k = 0; k < w->world; k++) {
    const optc_shard *sh = w->sh[k];
    int64_t at = 0;
    for (int q = 0; q < sh->nranges; q++) {
      int64_t c0 = optc_chunk_index(SNT, snumel, sh->ranges[2 * q]), c1 = optc_chunk_index(SNT, snumel, sh->ranges[2 * q + 1]);
      for (int64_t c = c0; c < c1; c++, at++) {
        if (seen[c]++)
          r->tiled = 0;
        memcpy(global + c * width, w->part[k] + at * width, sizeof(double) * (size_t)width);
        placed++;
      }
    }
    if (at != w->npart[k])
      r->tiled = 0;
  }
  if (placed != nglobal)
    r->tiled = 0;
  free(seen);
  pthread_barrier_wait(&w->bar);
  return 0;
}

/* One rank's own: a zeroed global with its chunks at first (the all-reduce form). */
static int solo_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                       double *global) {
  (void)ctx;
  memset(global, 0, sizeof(double) * (size_t)(nglobal * width));
  memcpy(global + first * width, local, sizeof(double) * (size_t)(nlocal * width));
  return 0;
}

static int solo_all(void *ctx, int local) { return (void)ctx, local; }

static int rank_all(void *ctx, int local) {
  Rank *r = ctx;
  World *w = r->w;
  w->flag[r->rank] = local;
  pthread_barrier_wait(&w->bar);
  int all = 1;
  for (int k = 0; k < w->world; k++)
    all &= w->flag[k];
  pthread_barrier_wait(&w->bar);
  return all;
}

static void *rank_main(void *arg) {
  Rank *r = arg;
  optc_error err = {0};
  double *part = NULL;
  if (r->two_part) {
    /* each range on its own, as FSDP has each unit's grads in turn: its
     * chunks' partials at their place among the shard's */
    int width = optc_step_partials_width(r->s);
    int64_t n = 0;
    for (int q = 0; q < r->sh.nranges; q++)
      n += optc_chunk_index(SNT, snumel, r->sh.ranges[2 * q + 1]) - optc_chunk_index(SNT, snumel, r->sh.ranges[2 * q]);
    part = calloc((size_t)(n + 1) * (size_t)(width > 0 ? width : 1), sizeof(double));
    r->st = width > 0 ? OPTC_OK : OPTC_ERR_INVALID;
    int64_t at = 0;
    for (int q = 0; q < r->sh.nranges && r->st == OPTC_OK; q++) {
      optc_shard one = r->sh;
      one.nranges = 1, one.ranges = r->sh.ranges + 2 * q;
      r->st = optc_step_partials(r->s, &r->b, &one, r->sc, r->nsc, 1, part + at * width, &err);
      at += optc_chunk_index(SNT, snumel, one.ranges[1]) - optc_chunk_index(SNT, snumel, one.ranges[0]);
    }
    r->sh.partials = part;
  }
  if (!r->two_part || r->st == OPTC_OK)
    r->st = optc_step_run_shard(r->s, &r->b, &r->sh, r->sc, r->nsc, 1, &r->res, &err);
  snprintf(r->msg, sizeof r->msg, "%s", err.message);
  free(part);
  return NULL;
}

typedef struct {
  int64_t offset[SNT], total;
  float *flat[4]; /* param, grad, exp_avg, exp_avg_sq */
  void *ptr[4][SNT];
} Flat;

static void flat_init(Flat *f, uint64_t seed, int nan_at) {
  f->total = optc_flat_layout(SNT, snumel, f->offset);
  rng = seed;
  for (int k = 0; k < 4; k++) {
    f->flat[k] = calloc((size_t)f->total, sizeof(float));
    for (int t = 0; t < SNT; t++) {
      for (int64_t i = 0; k < 2 && i < snumel[t]; i++)
        f->flat[k][f->offset[t] + i] = uniform();
      f->ptr[k][t] = f->flat[k] + f->offset[t];
    }
  }
  if (nan_at >= 0)
    f->flat[1][nan_at] = NAN;
}

static void flat_free(Flat *f) {
  for (int k = 0; k < 4; k++)
    free(f->flat[k]);
}

static int flat_equal(const Flat *a, const Flat *b) {
  for (int k = 0; k < 4; k++)
    if (memcmp(a->flat[k], b->flat[k], sizeof(float) * (size_t)a->total) != 0)
      return 0;
  return 1;
}

/* Each rank's ranges when the group is three FSDP units, tensors {0, 1},
 * {2} and {3, 4}, each sharded on its own as fsdp.c shards them: from the
 * block below the unit's start, S = its share rounded up to a block. */
static int unit_ranges(const Flat *f, int world, int rank, int64_t *out) {
  static const int first[4] = {0, 2, 3, SNT};
  int n = 0;
  for (int u = 0; u < 3; u++) {
    int64_t flo = f->offset[first[u]], fhi = f->offset[first[u + 1] - 1] + snumel[first[u + 1] - 1];
    int64_t base = flo / OPTC_REDUCE_BLOCK * OPTC_REDUCE_BLOCK;
    int64_t S = ((fhi - base + world - 1) / world + OPTC_REDUCE_BLOCK - 1) / OPTC_REDUCE_BLOCK * OPTC_REDUCE_BLOCK;
    int64_t lo = base + S * rank, hi = lo + S;
    lo = lo < flo ? flo : lo > fhi ? fhi : lo;
    hi = hi > fhi ? fhi : hi < lo ? lo : hi;
    if (hi > lo)
      out[2 * n] = lo, out[2 * n + 1] = hi, n++;
  }
  return n;
}

/* Three steps of AdamW with clipping on `world` ranks (0: optc_step_run);
 * with units, each rank owns a piece of each of three units; two_part
 * (with units): the norm's partials unit by unit first, then the step. */
static void shard_run_units(Flat *f, int world, const char *nonfinite, optc_result *last, bool units, bool two_part) {
  optc_spec spec = optc_spec_default("adamw");
  spec.clip = OPTC_CLIP_NORM;
  spec.nonfinite = strcmp(nonfinite, "skip") == 0 ? OPTC_NONFINITE_SKIP : OPTC_NONFINITE_PROPAGATE;
  optc_error err;
  int n = world ? world : 1;
  optc_step *s[MAXRANKS] = {0};
  for (int r = 0; r < n; r++)
    CHECK(optc_step_new(&spec, &s[r], &err) == OPTC_OK, "adamw clip: %s", err.message);
  void *state[2 * SNT];
  for (int t = 0; t < SNT; t++)
    state[t] = f->ptr[2][t], state[SNT + t] = f->ptr[3][t];
  optc_buffers b = {.ntensors = SNT, .numel = snumel, .param = f->ptr[0], .grad = f->ptr[1], .state = state};
  World w = {.world = n};
  pthread_barrier_init(&w.bar, NULL, (unsigned)n);
  int64_t S = ((f->total + n - 1) / n + OPTC_REDUCE_BLOCK - 1) / OPTC_REDUCE_BLOCK * OPTC_REDUCE_BLOCK;
  for (int step = 1; step <= 3 && s[n - 1]; step++) {
    optc_scalar sc[] = {{"lr", 0.01}, {"weight_decay", 0.1}, {"max_norm", 0.5}, {"step", step}};
    if (!world) {
      CHECK(optc_step_run(s[0], &b, sc, 4, 2, last, &err) == OPTC_OK, "one rank: %s", err.message);
      continue;
    }
    Rank rk[MAXRANKS];
    pthread_t th[MAXRANKS];
    int64_t ranges[MAXRANKS][6];
    for (int r = 0; r < n; r++) {
      int64_t lo = S * r, hi = lo + S < f->total ? lo + S : f->total;
      rk[r] = (Rank){.w = &w, .rank = r, .s = s[r], .b = b, .sc = sc, .nsc = 4, .tiled = 1};
      rk[r].sh = (optc_shard){lo, hi > lo ? hi : lo, rank_gather, rank_all, &rk[r]};
      if (units) {
        rk[r].sh.nranges = unit_ranges(f, n, r, ranges[r]);
        rk[r].sh.ranges = ranges[r];
        rk[r].sh.gather = ranges_gather;
        rk[r].two_part = two_part;
      }
      pthread_create(&th[r], NULL, rank_main, &rk[r]);
    }
    for (int r = 0; r < n; r++)
      pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
      CHECK(rk[r].st == OPTC_OK, "rank %d of %d: %s", r, n, rk[r].msg);
      CHECK(rk[r].tiled, "rank %d of %d: the ranks' (first, nlocal) tile the group's nglobal chunks", r, n);
      CHECK(memcmp(&rk[r].res.grad_norm, &rk[0].res.grad_norm, sizeof(double)) == 0 &&
                rk[r].res.skipped == rk[0].res.skipped,
            "rank %d of %d agrees with rank 0 on the norm and the skip", r, n);
    }
    *last = rk[0].res;
  }
  pthread_barrier_destroy(&w.bar);
  for (int r = 0; r < n; r++)
    optc_step_free(s[r]);
}

static void shard_run(Flat *f, int world, const char *nonfinite, optc_result *last) {
  shard_run_units(f, world, nonfinite, last, false, false);
}

static void test_shard(void) {
  Flat one, many;
  optc_result r1, rn;
  flat_init(&one, 99, -1);
  shard_run(&one, 0, "propagate", &r1);
  CHECK(r1.grad_norm > 0.5, "the norm clips: %g", r1.grad_norm);
  for (int world = 2; world <= MAXRANKS; world++) {
    for (int units = 0; units < 3; units++) {
      flat_init(&many, 99, -1);
      shard_run_units(&many, world, "propagate", &rn, units > 0, units == 2);
      CHECK(flat_equal(&one, &many) && rn.grad_norm == r1.grad_norm && rn.grad_sumsq == r1.grad_sumsq,
            "%d ranks%s give one rank's bytes and norm (%.17g vs %.17g)", world,
            units == 2   ? ", each a piece of three units, the norm's partials unit by unit first,"
            : units == 1 ? ", each a piece of three units,"
                         : "",
            rn.grad_norm, r1.grad_norm);
      flat_free(&many);
    }
  }
  flat_free(&one);
  /* a NaN grad in the last rank's slice: with SKIP every rank skips, and nothing changes */
  Flat before, after;
  flat_init(&before, 5, -1);
  flat_init(&after, 5, -1);
  after.flat[1][after.offset[3] + 4000] = NAN;
  before.flat[1][before.offset[3] + 4000] = NAN;
  shard_run(&after, 3, "skip", &rn);
  CHECK(rn.skipped && flat_equal(&before, &after), "3 ranks skip a NaN grad together, nothing written");
  flat_free(&before);
  flat_free(&after);
  /* one slice on its own, with the all-reduce form of gather: only its elements change */
  Flat whole, part;
  flat_init(&whole, 3, -1);
  flat_init(&part, 3, -1);
  {
    optc_spec sp = optc_spec_default("sgd");
    optc_step *s1 = NULL;
    optc_error e1;
    CHECK(optc_step_new(&sp, &s1, &e1) == OPTC_OK, "sgd: %s", e1.message);
    optc_buffers bw = {.ntensors = SNT, .numel = snumel, .param = part.ptr[0], .grad = part.ptr[1]};
    optc_shard slice = {2 * OPTC_REDUCE_BLOCK, 4 * OPTC_REDUCE_BLOCK, solo_gather, solo_all, NULL};
    optc_scalar sc1[] = {{"lr", 0.5}};
    CHECK(s1 && optc_step_run_shard(s1, &bw, &slice, sc1, 1, 1, NULL, &e1) == OPTC_OK, "a slice alone: %s", e1.message);
    int64_t changed_out = 0, changed_in = 0;
    for (int64_t i = 0; i < whole.total; i++) {
      int in = i >= slice.lo && i < slice.hi, diff = whole.flat[0][i] != part.flat[0][i];
      changed_in += in && diff, changed_out += !in && diff;
    }
    CHECK(changed_out == 0 && changed_in > 4000, "only the slice's params change (%lld inside, %lld outside)",
          (long long)changed_in, (long long)changed_out);
    optc_step_free(s1);
  }
  flat_free(&whole);
  flat_free(&part);
  /* bad slices */
  optc_spec spec = optc_spec_default("sgd");
  optc_step *s = NULL;
  optc_error err;
  CHECK(optc_step_new(&spec, &s, &err) == OPTC_OK, "sgd: %s", err.message);
  Flat f;
  flat_init(&f, 1, -1);
  optc_buffers b = {.ntensors = SNT, .numel = snumel, .param = f.ptr[0], .grad = f.ptr[1]};
  optc_scalar sc[] = {{"lr", 0.1}};
  optc_shard bad = {100, 5000, rank_gather, rank_all, NULL};
  CHECK(optc_step_run_shard(s, &b, &bad, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "4096"),
        "a slice off the block grid: %s", err.message);
  bad = (optc_shard){0, f.total + 1, rank_gather, rank_all, NULL};
  CHECK(optc_step_run_shard(s, &b, &bad, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID, "a slice past the end: %s",
        err.message);
  bad = (optc_shard){0, 4096, NULL, rank_all, NULL};
  CHECK(optc_step_run_shard(s, &b, &bad, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "gather"),
        "no gather: %s", err.message);
  CHECK(optc_step_run_shard(s, &b, NULL, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID, "no shard: %s", err.message);
  int64_t cut[4] = {0, 4096, 4096 + 100, 8192}; /* 4196 is inside tensor 2 and off the grid */
  bad = (optc_shard){0, 0, rank_gather, rank_all, NULL, 2, cut};
  CHECK(optc_step_run_shard(s, &b, &bad, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "range 1"),
        "a range that cuts a chunk: %s", err.message);
  int64_t back[4] = {4096, 8192, 0, 4096};
  bad = (optc_shard){0, 0, rank_gather, rank_all, NULL, 2, back};
  CHECK(optc_step_run_shard(s, &b, &bad, sc, 1, 1, NULL, &err) == OPTC_ERR_INVALID && strstr(err.message, "range 1"),
        "ranges out of order: %s", err.message);
  double dummy[8];
  CHECK(optc_step_partials_width(s) == 0 &&
            optc_step_partials(s, &b, &(optc_shard){0, 4096, solo_gather, solo_all, NULL}, sc, 1, 1, dummy, &err) ==
                OPTC_ERR_INVALID,
        "SGD without clipping has no norm phase to run alone: %s", err.message);
  int64_t between[2] = {f.offset[1], f.offset[2]}; /* tensor 1 alone: its ends cut no chunk */
  bad = (optc_shard){0, 0, solo_gather, solo_all, NULL, 1, between};
  CHECK(optc_step_run_shard(s, &b, &bad, sc, 1, 1, NULL, &err) == OPTC_OK, "a range between tensors: %s", err.message);
  flat_free(&f);
  optc_step_free(s);
}

int main(void) {
  printf("liboptc %s\n", optc_version());
  test_sgd();
  test_adamw();
  test_clip();
  test_nonfinite();
  test_nonfinite_anywhere();
  test_shard();
  test_bad_input();
  printf("test_api: %d checks, %d failed\n", nchecks, nfailed);
  return nfailed != 0;
}
