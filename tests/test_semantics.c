/* test_semantics: what a step computes, three ways.
 *
 * Over every built-in optimizer (with its graph-changing options), clipping
 * on and off, and the three dtype layouts (fp32; bf16 everything; bf16
 * params and grads with fp32 states), on tensors of 0, 1, 7, 4097 and
 * 3x5x7 elements, for 5 steps:
 *
 * 1. the reference interpreter on the front end's graph agrees with the
 *    independent C implementations of torch's update rules (ref_optim.c),
 *    with the difference reported in ulps;
 * 2. the interpreter gives identical bytes on the optimized graph (after the
 *    whole pass pipeline) and on the unoptimized one;
 * 3. the eager executor, tensor by tensor and op by op over all tensors
 *    (foreach), gives identical bytes to the interpreter.
 *
 * Tolerance for 1: ref_optim.c follows the same op-by-op f32 semantics as
 * the IR (one rounding per op, scalars rounded from f64 where torch passes
 * them to a float kernel), so without clipping they agree exactly. With
 * clipping the reference sums the squares in element order while optc sums
 * 4096-element blocks and then the block partials (so that the result does
 * not depend on the world size); the f64 norms can differ in the last bits,
 * and the f32 clip coefficient, rarely, by one ulp. That ulp reaches every
 * value, so with clipping we allow 4 ulps in f32 storage and 1 ulp in bf16
 * storage. */
#include "../compiler/passes.h"
#include "../runtime/rt.h"
#include "ref_optim.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static int failures, checks;

typedef struct {
  const char *name;
  const char *yaml; /* the optimizer section */
  RefHyper h;
} OptCase;

typedef struct {
  const char *name;
  const char *yaml;
  RefDType p, g, s;
} Layout;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static double normal(void) {
  double u = uniform() + 1e-300, v = uniform();
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static Type ty(RefDType d) { return d == REF_BF16 ? TY_BF16 : TY_F32; }

/* Distance in ulps between two stored values of type t. */
static double ulp_diff(const void *a, const void *b, Type t, int64_t i) {
  int64_t x, y;
  if (t == TY_F32) {
    int32_t u, v;
    memcpy(&u, (const char *)a + 4 * i, 4);
    memcpy(&v, (const char *)b + 4 * i, 4);
    x = u < 0 ? INT32_MIN - (int64_t)u : u;
    y = v < 0 ? INT32_MIN - (int64_t)v : v;
  } else {
    int16_t u, v;
    memcpy(&u, (const char *)a + 2 * i, 2);
    memcpy(&v, (const char *)b + 2 * i, 2);
    x = u < 0 ? INT16_MIN - (int64_t)u : u;
    y = v < 0 ? INT16_MIN - (int64_t)v : v;
  }
  return (double)llabs(x - y);
}

static Graph *build(const char *yaml, Arena *a) {
  char path[] = "/tmp/optc_semXXXXXX.yaml";
  int fd = mkstemps(path, 5);
  ASSERT(fd >= 0);
  ASSERT(write(fd, yaml, strlen(yaml)) == (ssize_t)strlen(yaml));
  close(fd);
  Recipe *r = recipe_load(path, NULL, 0, a);
  unlink(path);
  return r ? frontend_build(r) : NULL;
}

static const int64_t sizes[][3] = {{0}, {1}, {7}, {4097}, {3, 5, 7}};
static const int ndims[] = {1, 1, 1, 1, 3};
enum { NT = 5, STEPS = 5 };

static ThreadPool *pool;

static void run_case(const OptCase *oc, const Layout *lay, bool clip) {
  char yaml[2048];
  snprintf(yaml, sizeof yaml, "%s\n%s%s", oc->yaml, lay->yaml, clip ? "clip_grad_norm: 1.0\n" : "");
  Arena *arena = arena_new();
  Graph *g0 = build(yaml, arena);
  if (!g0) {
    printf("FAIL %s/%s: the recipe did not build\n", oc->name, lay->name);
    failures++;
    arena_free(arena);
    return;
  }
  Graph *g1 = graph_clone(g0, arena);
  if (!pipeline_run(g1, &(PipelineOptions){.verify_each = true})) {
    printf("FAIL %s/%s: the pipeline failed\n", oc->name, lay->name);
    failures++;
    arena_free(arena);
    return;
  }
  /* params and grads; grads large enough that clipping engages */
  TensorFile tf = {0};
  RefTensor rt[NT];
  memset(rt, 0, sizeof rt);
  for (int t = 0; t < NT; t++) {
    char name[32];
    snprintf(name, sizeof name, "w%d", t);
    Tensor *p = tf_add(&tf, name, ty(lay->p), ndims[t], sizes[t]);
    int64_t n = p->numel;
    for (int64_t i = 0; i < n; i++) {
      float v = (float)normal();
      if (lay->p == REF_BF16)
        ((uint16_t *)p->data)[i] = optc_f32_to_bf16(v);
      else
        ((float *)p->data)[i] = v;
    }
    snprintf(name, sizeof name, "w%d.grad", t);
    Tensor *gr = tf_add(&tf, name, ty(lay->g), ndims[t], sizes[t]);
    for (int64_t i = 0; i < n; i++) {
      float v = (float)(normal() * 0.2);
      if (lay->g == REF_BF16)
        ((uint16_t *)gr->data)[i] = optc_f32_to_bf16(v);
      else
        ((float *)gr->data)[i] = v;
    }
  }
  Binding sets[] = {{"num_tokens", 3.0}};
  ParamGroup pa, pb, pc, pd;
  double *va = calloc((size_t)g0->nins + 1, sizeof(double));
  double *vb = calloc((size_t)g1->nins + 1, sizeof(double));
  Binding step1 = {"step", 1};
  int fa, fb, fc;
  ASSERT(inputs_resolve(g0, sets, 1, &step1, 1, va) == 0);
  ASSERT(inputs_resolve(g1, sets, 1, &step1, 1, vb) == 0);
  ASSERT(group_from_file(&pa, g0, &tf, va, &fa) == 0);
  ASSERT(group_from_file(&pb, g1, &tf, vb, &fb) == 0);
  ASSERT(group_from_file(&pc, g0, &tf, va, &fc) == 0);
  ASSERT(group_from_file(&pd, g0, &tf, va, &fc) == 0);
  /* The reference gets its own copies, from the interpreter's initial state. */
  int pbuf = -1, gbuf = -1;
  for (int b = 0; b < g0->nbufs; b++) {
    if (g0->bufs[b].kind == BUF_PARAM)
      pbuf = b;
    if (g0->bufs[b].kind == BUF_GRAD)
      gbuf = b;
  }
  int nstates = ref_state_count(&oc->h);
  for (int t = 0; t < NT; t++) {
    int64_t n = pa.layout.numel[t], off = pa.layout.offset[t];
    rt[t].n = n;
    size_t pe = (size_t)type_size(ty(lay->p)), ge = (size_t)type_size(ty(lay->g)), se = (size_t)type_size(ty(lay->s));
    rt[t].p = malloc(n * pe + 1);
    void *gcopy = malloc(n * ge + 1);
    memcpy(gcopy, (char *)pa.bufs[gbuf] + off * ge, n * ge);
    rt[t].g = gcopy;
    memcpy(rt[t].p, (char *)pa.bufs[pbuf] + off * pe, n * pe);
    for (int k = 0; k < nstates; k++) {
      rt[t].s[k] = malloc(n * se + 1);
      int b = graph_find_buffer(g0, ref_state_name(&oc->h, k));
      if (b < 0) {
        printf("FAIL %s/%s: the graph has no state '%s'\n", oc->name, lay->name, ref_state_name(&oc->h, k));
        failures++;
        goto out;
      }
      memcpy(rt[t].s[k], (char *)pa.bufs[b] + off * se, n * se);
    }
  }
  double worst = 0;
  const char *worst_at = "";
  /* Each step gets the same fresh grads, as a new backward would give: the
   * unoptimized graph leaves the scaled grads in its grad buffer, as torch
   * leaves them in p.grad. */
  size_t gbytes = (size_t)pa.layout.total * (size_t)type_size(g0->bufs[gbuf].type);
  void *grads0 = malloc(gbytes + 1);
  memcpy(grads0, pa.bufs[gbuf], gbytes);
  for (int step = 1; step <= STEPS; step++) {
    memcpy(pa.bufs[gbuf], grads0, gbytes);
    memcpy(pc.bufs[gbuf], grads0, gbytes);
    memcpy(pd.bufs[gbuf], grads0, gbytes);
    Ref sr0 = graph_find_input(g0, "step"), sr1 = graph_find_input(g1, "step");
    if (sr0 != NOREF)
      va[sr0] = step;
    if (sr1 != NOREF)
      vb[sr1] = step;
    StepResult ra, rb, rc;
    StepArgs aa = {va, fa}, ab = {vb, fb};
    ASSERT(interp_step(g0, &pa.layout, pa.bufs, &aa, &ra) == 0);
    ASSERT(interp_step(g1, &pb.layout, pb.bufs, &ab, &rb) == 0);
    ASSERT(eager_step(g0, &pc.layout, pc.bufs, &aa, &rc) == 0);
    ASSERT(eager_run(g0, &pd.layout, pd.bufs, &aa, &rc, true, pool) == 0);
    ref_step(&oc->h, lay->p, lay->g, lay->s, rt, NT, step, 3.0, 1.0, clip ? 1.0 : 0.0);
    /* 2 and 3: identical bytes in every buffer but the grads (the
     * unoptimized graph writes the scaled grads back, as torch does) */
    for (int b = 0; b < g0->nbufs; b++) {
      if (g0->bufs[b].kind == BUF_GRAD)
        continue;
      int b1 = graph_find_buffer(g1, g0->bufs[b].name);
      size_t bytes = (size_t)pa.layout.total * (size_t)type_size(g0->bufs[b].type);
      checks += 2;
      if (b1 < 0 || memcmp(pa.bufs[b], pb.bufs[b1], bytes) != 0) {
        printf("FAIL %s/%s%s step %d: @%s differs between the optimized and unoptimized graphs\n", oc->name,
               lay->name, clip ? "/clip" : "", step, g0->bufs[b].name);
        failures++;
      }
      if (memcmp(pa.bufs[b], pc.bufs[b], bytes) != 0) {
        printf("FAIL %s/%s%s step %d: @%s differs between eager and the interpreter\n", oc->name, lay->name,
               clip ? "/clip" : "", step, g0->bufs[b].name);
        failures++;
      }
      checks++;
      if (memcmp(pa.bufs[b], pd.bufs[b], bytes) != 0) {
        printf("FAIL %s/%s%s step %d: @%s differs between eager foreach and the interpreter\n", oc->name,
               lay->name, clip ? "/clip" : "", step, g0->bufs[b].name);
        failures++;
      }
    }
    /* 1: the interpreter against the independent reference, in ulps */
    for (int t = 0; t < NT; t++) {
      int64_t off = pa.layout.offset[t];
      for (int k = -1; k < nstates; k++) {
        int b = k < 0 ? pbuf : graph_find_buffer(g0, ref_state_name(&oc->h, k));
        Type bt = (Type)g0->bufs[b].type;
        const void *mine = (char *)pa.bufs[b] + off * type_size(bt);
        const void *ref = k < 0 ? rt[t].p : rt[t].s[k];
        for (int64_t i = 0; i < rt[t].n; i++) {
          double u = ulp_diff(mine, ref, bt, i);
          if (u > worst) {
            worst = u;
            worst_at = g0->bufs[b].name;
          }
        }
      }
    }
  }
  checks++;
  double tol = !clip ? 0 : lay->p == REF_BF16 || lay->s == REF_BF16 ? 1 : 4;
  printf("%-26s %-16s %-6s interp vs reference: max %g ulp%s%s\n", oc->name, lay->name, clip ? "clip" : "",
         worst, worst > 0 ? " in @" : "", worst > 0 ? worst_at : "");
  if (worst > tol) {
    printf("FAIL: more than the %g ulp allowed\n", tol);
    failures++;
  }
  free(grads0);
out:
  for (int t = 0; t < NT; t++) {
    free(rt[t].p);
    free((void *)rt[t].g);
    for (int k = 0; k < REF_MAX_STATES; k++)
      free(rt[t].s[k]);
  }
  group_free(&pa);
  group_free(&pb);
  group_free(&pc);
  group_free(&pd);
  free(va);
  free(vb);
  tf_free(&tf);
  arena_free(arena);
}

int main(void) {
  OptCase cases[] = {
      {"adamw", "optimizer:\n  _component_: torch.optim.AdamW\n", ref_defaults(REF_ADAMW)},
      {"adamw_amsgrad_maximize",
       "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 2e-3\n  betas: [0.8, 0.95]\n  eps: 1e-6\n"
       "  weight_decay: 0.1\n  amsgrad: true\n  maximize: true\n",
       ref_defaults(REF_ADAMW)},
      {"adam_amsgrad_wd", "optimizer:\n  _component_: torch.optim.Adam\n  weight_decay: 0.1\n  amsgrad: true\n",
       ref_defaults(REF_ADAM)},
      {"sgd", "optimizer:\n  _component_: torch.optim.SGD\n  lr: 0.1\n", ref_defaults(REF_SGD)},
      {"sgd_momentum_dampening_wd",
       "optimizer:\n  _component_: torch.optim.SGD\n  lr: 0.05\n  momentum: 0.9\n  dampening: 0.1\n"
       "  weight_decay: 0.01\n",
       ref_defaults(REF_SGD)},
      {"sgd_nesterov_maximize",
       "optimizer:\n  _component_: torch.optim.SGD\n  lr: 0.05\n  momentum: 0.9\n  nesterov: true\n  maximize: true\n",
       ref_defaults(REF_SGD)},
      {"lion", "optimizer:\n  _component_: optc.Lion\n  lr: 1e-4\n  betas: [0.9, 0.99]\n  weight_decay: 0.1\n",
       ref_defaults(REF_LION)},
      {"adagrad_full",
       "optimizer:\n  _component_: torch.optim.Adagrad\n  lr: 0.05\n  lr_decay: 0.01\n"
       "  initial_accumulator_value: 0.1\n  weight_decay: 0.1\n  eps: 1e-8\n",
       ref_defaults(REF_ADAGRAD)},
      {"rmsprop", "optimizer:\n  _component_: torch.optim.RMSprop\n", ref_defaults(REF_RMSPROP)},
      {"rmsprop_centered_momentum_wd",
       "optimizer:\n  _component_: torch.optim.RMSprop\n  lr: 2e-3\n  alpha: 0.9\n  eps: 1e-6\n"
       "  weight_decay: 0.01\n  momentum: 0.9\n  centered: true\n",
       ref_defaults(REF_RMSPROP)},
  };
  /* The reference's hyperparameters, matching each recipe. */
  RefHyper *h;
  h = &cases[1].h, h->lr = 2e-3, h->beta1 = 0.8, h->beta2 = 0.95, h->eps = 1e-6, h->weight_decay = 0.1,
  h->amsgrad = 1, h->maximize = 1;
  h = &cases[2].h, h->weight_decay = 0.1, h->amsgrad = 1;
  h = &cases[3].h, h->lr = 0.1;
  h = &cases[4].h, h->lr = 0.05, h->momentum = 0.9, h->dampening = 0.1, h->weight_decay = 0.01;
  h = &cases[5].h, h->lr = 0.05, h->momentum = 0.9, h->nesterov = 1, h->maximize = 1;
  h = &cases[6].h, h->lr = 1e-4, h->beta1 = 0.9, h->beta2 = 0.99, h->weight_decay = 0.1;
  h = &cases[7].h, h->lr = 0.05, h->lr_decay = 0.01, h->initial_accumulator_value = 0.1, h->weight_decay = 0.1,
  h->eps = 1e-8;
  h = &cases[9].h, h->lr = 2e-3, h->alpha = 0.9, h->eps = 1e-6, h->weight_decay = 0.01, h->momentum = 0.9,
  h->centered = 1;
  Layout layouts[] = {
      {"fp32", "dtype: fp32\n", REF_F32, REF_F32, REF_F32},
      {"bf16", "dtype: bf16\n", REF_BF16, REF_BF16, REF_BF16},
      {"bf16-fp32states", "dtype: bf16\noptimizer_state_dtype: fp32\n", REF_BF16, REF_BF16, REF_F32},
  };
  pool = pool_create(3);
  for (size_t c = 0; c < ARRAY_LEN(cases); c++)
    for (size_t l = 0; l < ARRAY_LEN(layouts); l++)
      for (int clip = 0; clip < 2; clip++)
        run_case(&cases[c], &layouts[l], clip);
  pool_free(pool);
  printf("test_semantics: %d checks, %d failed\n", checks, failures);
  return failures != 0;
}
