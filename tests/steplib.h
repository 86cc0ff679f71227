/* steplib.h: what the backend tests share beside testlib.h: the seeded data
 * they step, byte comparison of flat buffers, the matrix of optimizers and
 * layouts they run, and building a step graph from recipe or .optir text.
 * Header-only; a test includes it once. */
#pragma once
#include "passes.h"
#include "group.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testlib.h"

/* ---- data: xorshift64, the same sequence in every test and on every machine ---------------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;
TESTLIB_FN double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}
TESTLIB_FN float normalf(void) {
  double u = uniform() + 1e-300, v = uniform();
  return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* Normal values times scale, in t's dtype (f32 or bf16). */
TESTLIB_FN void fill(Tensor *t, float scale) {
  for (int64_t i = 0; i < t->numel; i++) {
    float v = normalf() * scale;
    if (t->dtype == TY_BF16)
      ((uint16_t *)t->data)[i] = optc_f32_to_bf16(v);
    else
      ((float *)t->data)[i] = v;
  }
}

/* One group: the odd sizes, one large tensor, forty small ones; params
 * t0..t45 in pt, grads tK.grad in gt. */
TESTLIB_FN void make_tensors(TensorFile *tf, Type pt, Type gt) {
  int64_t sizes[6 + 40] = {0, 1, 15, 16, 17, 100003};
  for (int i = 0; i < 40; i++)
    sizes[6 + i] = 1 + (i * 7) % 40;
  for (int i = 0; i < 46; i++) {
    char name[32];
    snprintf(name, sizeof name, "t%d", i);
    fill(tf_add(tf, name, pt, 1, &sizes[i]), 1.0f);
    snprintf(name, sizeof name, "t%d.grad", i);
    fill(tf_add(tf, name, gt, 1, &sizes[i]), 0.3f);
  }
}

/* Element 777 of make_tensors' t5.grad made NaN (kind 0) or +inf (kind 1). */
TESTLIB_FN void poison_grad(TensorFile *tf, int kind) {
  Tensor *gt = tf_find(tf, "t5.grad");
  ASSERT(gt);
  float bad = kind == 0 ? NAN : INFINITY;
  if (gt->dtype == TY_BF16)
    ((uint16_t *)gt->data)[777] = optc_f32_to_bf16(bad);
  else
    ((float *)gt->data)[777] = bad;
}

/* 64-byte aligned memory (the size rounded up, as aligned_alloc wants). */
TESTLIB_FN void *alloc64(size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  ASSERT(p);
  return p;
}

/* Whether g's n-element flat buffers a and b hold the same bytes; the first
 * difference is printed under what. */
TESTLIB_FN bool same_bytes(const Graph *g, int64_t n, void *const *a, void *const *b, const char *what) {
  for (int k = 0; k < g->nbufs; k++) {
    size_t bytes = (size_t)buffer_bytes(g, k, n);
    if (memcmp(a[k], b[k], bytes) != 0) {
      const char *pa = a[k], *pb = b[k];
      size_t at = 0;
      while (at < bytes && pa[at] == pb[at])
        at++;
      printf("  %s: @%s differs first at byte %zu (element %zu)\n", what, g->bufs[k].name, at,
             (size_t)((double)at / buffer_elem_bytes(g, k)));
      return false;
    }
  }
  return true;
}

/* ---- the matrix the backends are checked over: every built-in optimizer with its
 * graph-changing options, and the three dtype layouts (low: bf16 params) ---------------- */

/* low: only with 16-bit params; no_sr: not with stochastic rounding */
__attribute__((unused)) static const struct { const char *name, *yaml; bool low, no_sr; } opts[] = {
    {"adamw", "optimizer:\n  _component_: torch.optim.AdamW\n"},
    {"adamw_amsgrad_maximize", "optimizer:\n  _component_: torch.optim.AdamW\n  amsgrad: true\n  maximize: true\n"},
    {"adam_wd", "optimizer:\n  _component_: torch.optim.Adam\n  weight_decay: 0.1\n"},
    {"sgd", "optimizer:\n  _component_: torch.optim.SGD\n  lr: 0.1\n"},
    {"sgd_nesterov", "optimizer:\n  _component_: torch.optim.SGD\n  lr: 0.1\n  momentum: 0.9\n  nesterov: true\n"},
    {"sgd_dampening_wd",
     "optimizer:\n  _component_: torch.optim.SGD\n  lr: 0.1\n  momentum: 0.8\n  dampening: 0.3\n  weight_decay: 0.01\n"},
    {"lion", "optimizer:\n  _component_: optc.Lion\n  weight_decay: 0.1\n"},
    {"adagrad", "optimizer:\n  _component_: torch.optim.Adagrad\n  lr_decay: 0.01\n  initial_accumulator_value: 0.1\n"},
    {"rmsprop", "optimizer:\n  _component_: torch.optim.RMSprop\n"},
    {"rmsprop_centered_momentum",
     "optimizer:\n  _component_: torch.optim.RMSprop\n  centered: true\n  momentum: 0.9\n  weight_decay: 0.01\n"},
    /* torch's fused=True kernels */
    {"adamw_fused", "optimizer:\n  _component_: torch.optim.AdamW\n  fused: true\n  amsgrad: true\n"},
    {"adam_fused_wd", "optimizer:\n  _component_: torch.optim.Adam\n  fused: true\n  weight_decay: 0.1\n"},
    {"sgd_fused_momentum",
     "optimizer:\n  _component_: torch.optim.SGD\n  fused: true\n  lr: 0.1\n  momentum: 0.8\n  dampening: 0.3\n"},
    {"adagrad_fused", "optimizer:\n  _component_: torch.optim.Adagrad\n  fused: true\n  weight_decay: 0.1\n"},
    /* torchao's AdamW8bit and AdamW4bit: quantized states (the bf16/fp32-states layout: plain fp32 ones) */
    {"adamw8bit", "optimizer:\n  _component_: torchao.optim.AdamW8bit\n  weight_decay: 0.1\n"},
    {"adamw4bit_amsgrad_b64",
     "optimizer:\n  _component_: torchao.optim.AdamW4bit\n  amsgrad: true\n  block_size: 64\n  betas: [0.3, 0.6]\n"},
    /* compensated bf16: the param's rounding error kept in a state */
    {"adamw8bit_kahan", "optimizer:\n  _component_: torchao.optim.AdamW8bit\ncompensation: kahan\n", true, true},
    {"adamw_fused_kahan", "optimizer:\n  _component_: torch.optim.AdamW\n  fused: true\ncompensation: kahan\n", true,
     true},
};
__attribute__((unused)) static const struct { const char *name, *yaml; bool low; } layouts[] = {
    {"fp32", "dtype: fp32\n", false},
    {"bf16", "dtype: bf16\n", true},
    {"bf16/fp32-states", "dtype: bf16\noptimizer_state_dtype: fp32\n", true},
};

/* Case i of the matrix (opts x layouts x clip off/on x, for the bf16
 * layouts, stochastic rounding off/on): its name and recipe text. False past
 * the last case. */
typedef struct {
  char name[128], yaml[1024];
  size_t opt, layout; /* indices into opts and layouts */
  bool clip, sr;
} MatrixCase;
TESTLIB_FN bool matrix_case_at(int i, MatrixCase *c) {
  for (size_t o = 0; o < ARRAY_LEN(opts); o++)
    for (size_t l = 0; l < ARRAY_LEN(layouts); l++)
      for (int clip = 0; clip < 2; clip++)
        for (int sr = 0; sr < (layouts[l].low && !opts[o].no_sr ? 2 : 1); sr++)
          if ((!opts[o].low || layouts[l].low) && i-- == 0) {
            *c = (MatrixCase){.opt = o, .layout = l, .clip = clip, .sr = sr};
            snprintf(c->name, sizeof c->name, "%s %s%s%s", opts[o].name, layouts[l].name, clip ? " clip" : "",
                     sr ? " sr" : "");
            snprintf(c->yaml, sizeof c->yaml, "%s%s%s%s", opts[o].yaml, layouts[l].yaml,
                     clip ? "clip_grad_norm: 0.5\n" : "", sr ? "stochastic_rounding: true\nseed: 42\n" : "");
            return true;
          }
  return false;
}

/* g's runtime inputs for step 1 (and num_tokens 7 when with_tokens and g
 * has it; torch_threads 2, so that torch's 16-bit loop tails fall inside
 * the 100003-element tensor too), the rest at their defaults; malloc'd,
 * the caller frees. */
TESTLIB_FN double *step1_inputs(const Graph *g, bool with_tokens) {
  double *vals = calloc((size_t)g->nins + 1, sizeof(double));
  Binding sets[2];
  int nsets = 0;
  if (with_tokens && graph_find_input(g, "num_tokens") != NOREF)
    sets[nsets++] = (Binding){"num_tokens", 7};
  if (graph_find_input(g, "torch_threads") != NOREF)
    sets[nsets++] = (Binding){"torch_threads", 2};
  Binding first = {"step", 1};
  ASSERT(vals && inputs_resolve(g, sets, nsets, &first, 1, vals) == 0);
  return vals;
}

/* ---- step graphs ------------------------------------------------------------------------------ */

/* The front end's graph of a recipe's text, before the passes. */
TESTLIB_FN Graph *build_recipe(const char *yaml, Arena *a) {
  Recipe *r = recipe_from_text("<test recipe>", yaml, NULL, 0, a);
  return r ? frontend_build(r) : NULL;
}

/* ... and after them: what the backends compile. */
TESTLIB_FN Graph *build_yaml(const char *yaml, Arena *a) {
  Graph *g = build_recipe(yaml, a);
  return g && pipeline_run(g, &(PipelineOptions){0}) ? g : NULL;
}

/* An .optir program's text, specialised with its defaults, after the passes. */
TESTLIB_FN Graph *build_optir(const char *name, const char *text, Arena *a) {
  SrcFile *src = arena_alloc(a, sizeof(SrcFile));
  src->name = name;
  src->text = text;
  src->len = strlen(text);
  Graph *g = ir_parse(src, a);
  if (g)
    g = optir_specialize(g, NULL, 0, a);
  return g && pipeline_run(g, &(PipelineOptions){0}) ? g : NULL;
}
