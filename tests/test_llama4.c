/* test_llama4: the Llama 4 decoder's forward and backward.
 *
 * 1. Gradients, in double, against central differences for every parameter
 *    kind, on a plain batch and on a packed one (segments, positions past
 *    8191 so the NoPE temperature is not 1), for a Scout-shaped config
 *    (every layer MoE) and for configs with Maverick's dense layers in
 *    between (with and without QK-norm and RoPE scaling).
 * 2. The float model's loss against llama4_naive.c, an independent
 *    plain-loop forward, across the config switches (chunking, NoPE layers,
 *    QK-norm, RoPE scaling, temperature, packing, dense layers).
 * 3. Accumulation, float against double gradients, all-ignored batches
 *    (Scout- and Maverick-shaped), rejected dims, Scout's and Maverick's
 *    tensor tables.
 * 4. Threads: on pools of 2 and 3 threads the loss and every gradient are
 *    the bits of the caller's thread alone, float and double, on batches of
 *    several row blocks, split experts and output-head blocks.
 * 5. FSDP's hooks: with every unit's params and grads only valid between
 *    its hooks, the bits of a run without them, in the documented order;
 *    a failing hook stops the run.
 * 6. Activation checkpointing: the bits of a run that keeps every layer's
 *    activations, Scout- and Maverick-shaped, accumulating.
 * Then one timed forward+backward, printed, never asserted.
 * Exits 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama4.h"
#include "blas.h"
#include "exec.h" /* the thread pool */

double l4_naive_loss(const L4Config *c, int ntensors, const char *const *names,
                     const double *const *params, const int32_t *tokens,
                     const int32_t *targets, const int32_t *positions, const int32_t *segments,
                     int B, int T, int64_t *ntokens);

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
      printf(__VA_ARGS__);                                 \
      printf("\n");                                        \
      failures++;                                          \
    }                                                      \
  } while (0)

/* ---- the test's own random numbers ------------------------------------------------- */
static uint64_t rng_state = 12345;
static uint64_t rng_u64(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_uniform(void) { return ((rng_u64() >> 11) + 1) * 0x1.0p-53; }
static double rng_normal(void) {
  return sqrt(-2 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform());
}
static int rng_int(int n) { return (int)(rng_u64() % (uint64_t)n); }

static void *xcalloc(size_t n, size_t s) {
  void *p = calloc(n ? n : 1, s);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

/* ---- parameters in both precisions ----------------------------------------------------- */
typedef struct {
  int n;
  L4Tensor *t;
  const char **names;
  double **p, **g;  /* double params and grads */
  float **pf, **gf; /* float copies of the same values */
} Params;

static int is_norm(const char *name) { return strstr(name, "norm.weight") != NULL; }

/* Weights normal(0, std), norm weights 1 + normal(0, 0.2), so that no
 * gradient is symmetric by accident; the float copy holds the same values. */
static Params params_create(const L4Config *c, double std) {
  Params P = {0};
  P.n = l4_tensors(c, NULL);
  P.t = xcalloc((size_t)P.n, sizeof(L4Tensor));
  l4_tensors(c, P.t);
  P.names = xcalloc((size_t)P.n, sizeof(char *));
  P.p = xcalloc((size_t)P.n, sizeof(double *));
  P.g = xcalloc((size_t)P.n, sizeof(double *));
  P.pf = xcalloc((size_t)P.n, sizeof(float *));
  P.gf = xcalloc((size_t)P.n, sizeof(float *));
  for (int i = 0; i < P.n; i++) {
    size_t k = (size_t)P.t[i].numel;
    P.names[i] = P.t[i].name;
    P.p[i] = xcalloc(k, sizeof(double));
    P.g[i] = xcalloc(k, sizeof(double));
    P.pf[i] = xcalloc(k, sizeof(float));
    P.gf[i] = xcalloc(k, sizeof(float));
    for (size_t j = 0; j < k; j++) {
      float v = (float)(is_norm(P.t[i].name) ? 1 + 0.2 * rng_normal() : std * rng_normal());
      P.pf[i][j] = v;
      P.p[i][j] = v;
    }
  }
  return P;
}

static void params_zero_grads(Params *P) {
  for (int i = 0; i < P->n; i++) {
    memset(P->g[i], 0, sizeof(double) * (size_t)P->t[i].numel);
    memset(P->gf[i], 0, sizeof(float) * (size_t)P->t[i].numel);
  }
}

static void params_free(Params *P) {
  for (int i = 0; i < P->n; i++) free(P->p[i]), free(P->g[i]), free(P->pf[i]), free(P->gf[i]);
  free(P->p), free(P->g), free(P->pf), free(P->gf), free(P->names), free(P->t);
}

static double naive(const L4Config *c, const Params *P, const L4Batch *b, int64_t *nt) {
  return l4_naive_loss(c, P->n, P->names, (const double *const *)P->p, b->tokens, b->targets,
                       b->positions, b->segments, b->B, b->T, nt);
}

/* the small config every check starts from */
static L4Config small_config(void) {
  L4Config c = l4_config_scout();
  c.vocab_size = 23, c.num_layers = 4, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 4;
  c.embed_dim = 16, c.hidden_dim = 8, c.shared_hidden_dim = 8, c.num_experts = 16;
  c.attention_chunk_size = 4;
  /* RoPE frequencies 1 and 0.1 (wavelengths 6.3 and 63): with old context
   * 32 and factors 1..8 the first is in the smoothed band, the second is
   * divided by the factor */
  c.rope_base = 100, c.rope_scale_factor = 4, c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 8, c.rope_old_context_len = 32;
  return c;
}

/* small_config with dense layers 0 and 2 between MoE layers 1 and 3,
 * wider than the experts (12 vs 8) so that a mixed-up width shows */
static L4Config dense_config(void) {
  L4Config c = small_config();
  c.moe_every_n_layers = 2, c.mlp_hidden_dim = 12;
  return c;
}

/* Maverick's shape: dense_config, no QK-norm, RoPE unscaled */
static L4Config maverick_config(void) {
  L4Config c = dense_config();
  c.use_qk_norm = 0, c.rope_scale_factor = 0;
  return c;
}

enum { B_ = 2, T_ = 10 };
typedef struct {
  int32_t tok[B_ * T_], tgt[B_ * T_], pos[B_ * T_], seg[B_ * T_];
  L4Batch plain, packed;
} Batches;

/* plain: two rows of 10 tokens, three targets ignored. packed: the same
 * tokens, row 1 holding two sequences of 6 and 4 tokens, the first at
 * positions 8188..8193 so the temperature steps past 1 inside it. */
static void batches_make(Batches *bb, int V) {
  for (int i = 0; i < B_ * T_; i++) {
    bb->tok[i] = rng_int(V);
    bb->tgt[i] = rng_int(V);
    bb->pos[i] = i % T_;
    bb->seg[i] = 0;
  }
  bb->tgt[3] = bb->tgt[12] = bb->tgt[19] = -100;
  for (int t = 0; t < T_; t++) {
    bb->seg[T_ + t] = t < 6 ? 7 : 9;
    bb->pos[T_ + t] = t < 6 ? 8188 + t : t - 6;
  }
  bb->plain = (L4Batch){.tokens = bb->tok, .targets = bb->tgt, .B = B_, .T = T_};
  bb->packed = (L4Batch){.tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                         .segments = bb->seg, .B = B_, .T = T_};
}

/* ---- 1. gradient check ------------------------------------------------------------------ */
static const char *const kinds[] = {
  "embed_tokens", "input_layernorm", "post_attention_layernorm", "model.norm", "q_proj",
  "k_proj", "v_proj", "o_proj", "router", "experts.gate_up_proj", "experts.down_proj",
  "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj", "lm_head",
  "feed_forward.gate_proj", "feed_forward.up_proj", "feed_forward.down_proj",
};
enum { NKINDS = sizeof kinds / sizeof kinds[0], K_GATE_UP = 9, K_DOWN = 10 };

static int kind_of(const char *name) {
  for (int k = 0; k < NKINDS; k++)
    if (strstr(name, kinds[k])) return k;
  return -1;
}

static int layer_of(const char *name) {
  int l = -1;
  if (sscanf(name, "model.layers.%d.", &l) != 1) return -1;
  return l;
}

static int same_routing(const L4Model *m, const L4Config *c, const int32_t *base, int n) {
  for (int l = 0; l < c->num_layers; l++)
    if (l4_layer_is_moe(c, l) &&
        memcmp(l4_expert_choice(m, l), base + (size_t)l * n, sizeof(int32_t) * (size_t)n))
      return 0;
  return 1;
}

#define GRAD_TOL 1e-6
/* |grad| below this is compared absolutely, to GRAD_TOL * GRAD_FLOOR = 1e-9:
 * the 4-point stencil's own error reaches ~1e-10 (router weights, whose
 * sigmoid makes the higher derivatives large), and which side of 1e-10 it
 * lands on depends on the BLAS kernels' rounding (a 7.2e-5 router grad was
 * off by 1.0e-10 on an AMD Zen 4's OpenBLAS, a 1e-4 floor's 1.02e-6) */
#define GRAD_FLOOR 1e-3

static void grad_check(const char *label, L4Config c, const L4Batch *b) {
  char err[256];
  L4Model *m = l4_create_f64(&c, b->B, b->T, err, sizeof err);
  CHECK(m, "%s", err);
  if (!m) return;
  Params P = params_create(&c, 0.5);
  int n = b->B * b->T, L = c.num_layers, E = c.num_experts;
  int64_t nt;
  double loss = l4_run_f64(m, P.p, P.g, b, &nt);
  printf("grad check (%s): loss %.6f over %lld tokens\n", label, loss, (long long)nt);

  /* routing of the unperturbed run; per layer the busiest and an empty expert */
  int32_t *route = xcalloc((size_t)L * n, sizeof(int32_t));
  int busiest[16], empty[16], nempty = 0;
  for (int l = 0; l < L; l++) {
    const int32_t *choice = l4_expert_choice(m, l);
    busiest[l] = empty[l] = -1;
    if (!l4_layer_is_moe(&c, l)) {
      CHECK(!choice, "layer %d is dense but has an expert choice", l);
      printf("  layer %d (%s): dense MLP\n", l, l4_layer_uses_rope(&c, l) ? "RoPE" : "NoPE");
      continue;
    }
    memcpy(route + (size_t)l * n, choice, sizeof(int32_t) * (size_t)n);
    int cnt[64] = {0};
    for (int t = 0; t < n; t++) cnt[route[(size_t)l * n + t]]++;
    busiest[l] = 0, empty[l] = -1;
    for (int e = 0; e < E; e++) {
      if (cnt[e] > cnt[busiest[l]]) busiest[l] = e;
      if (cnt[e] == 0 && empty[l] < 0) empty[l] = e;
    }
    printf("  layer %d (%s): expert tokens", l, l4_layer_uses_rope(&c, l) ? "RoPE" : "NoPE");
    for (int e = 0; e < E; e++) printf(" %d", cnt[e]);
    printf("\n");
  }

  /* an expert that got no tokens has exactly zero gradients */
  for (int i = 0; i < P.n; i++) {
    int l = layer_of(P.t[i].name), k = kind_of(P.t[i].name);
    if (l < 0 || (k != K_GATE_UP && k != K_DOWN) || empty[l] < 0) continue;
    nempty++;
    size_t per = (size_t)(P.t[i].numel / E), bad = 0;
    for (size_t j = 0; j < per; j++) bad += P.g[i][(size_t)empty[l] * per + j] != 0;
    CHECK(bad == 0, "%s: expert %d got no tokens but %zu gradient entries are nonzero",
          P.t[i].name, empty[l], bad);
  }
  printf("  %d expert tensors of experts that got no tokens: gradients exactly zero\n", nempty);
  CHECK(nempty > 0, "no layer left an expert without tokens; the check needs one");

  double maxerr[NKINDS] = {0}, maxerr2[NKINDS] = {0};
  int checked[NKINDS] = {0}, present[NKINDS] = {0}, skipped = 0;
  for (int i = 0; i < P.n; i++) {
    int k = kind_of(P.t[i].name), l = layer_of(P.t[i].name);
    CHECK(k >= 0, "unclassified tensor %s", P.t[i].name);
    if (k < 0) continue;
    present[k]++;
    for (int s = 0; s < 6; s++) {
      int64_t j = rng_u64() % (uint64_t)P.t[i].numel;
      if (k == 0) /* a row some token looks up */
        j = (int64_t)b->tokens[rng_int(n)] * c.embed_dim + rng_int(c.embed_dim);
      if (k == K_GATE_UP || k == K_DOWN) { /* mostly the busiest expert; one entry of an empty one */
        int64_t per = P.t[i].numel / E;
        int e = s == 5 && empty[l] >= 0 ? empty[l] : busiest[l];
        j = e * per + (int64_t)(rng_u64() % (uint64_t)per);
      }
      /* two stencils: the plain central difference at h = 1e-6 (printed),
       * whose rounding noise is about eps*|loss|/h ~ 1e-8 absolute, and the
       * 4-point one at h = 1e-4, error O(h^4) and noise ~1e-10, which the
       * tolerance applies to */
      double *w = &P.p[i][j], orig = *w, f[6];
      const double steps[6] = {1e-6, -1e-6, 2e-4, 1e-4, -1e-4, -2e-4};
      int flip = 0;
      for (int q = 0; q < 6; q++) {
        *w = orig + steps[q] * fmax(1.0, fabs(orig));
        f[q] = l4_run_f64(m, P.p, NULL, b, NULL);
        flip |= !same_routing(m, &c, route, n);
      }
      *w = orig;
      if (flip) {
        skipped++;
        continue;
      }
      double h = fmax(1.0, fabs(orig)), ana = P.g[i][j];
      double num2 = (f[0] - f[1]) / (2e-6 * h);
      double num = (8 * (f[3] - f[4]) - (f[2] - f[5])) / (12e-4 * h);
      double e2 = fabs(num2 - ana) / fmax(GRAD_FLOOR, fmax(fabs(num2), fabs(ana)));
      double e = fabs(num - ana) / fmax(GRAD_FLOOR, fmax(fabs(num), fabs(ana)));
      if (e2 > maxerr2[k]) maxerr2[k] = e2;
      if (e > maxerr[k]) maxerr[k] = e;
      checked[k]++;
      CHECK(e < GRAD_TOL, "%s[%lld]: analytic %.10g numeric %.10g (rel err %.3g)", P.t[i].name,
            (long long)j, ana, num, e);
    }
  }
  for (int k = 0; k < NKINDS; k++) {
    if (!present[k]) continue;
    printf("  %-26s %3d entries  max rel err %.2e  (2-point, h=1e-6: %.2e)\n", kinds[k],
           checked[k], maxerr[k], maxerr2[k]);
    CHECK(checked[k] > 0, "no entry of kind %s was checked", kinds[k]);
  }
  printf("  skipped %d entries whose perturbation changed a top-1 choice\n", skipped);
  free(route);
  params_free(&P);
  l4_free(m);
}

/* ---- 2. forward against the naive reference ----------------------------------------------- */
typedef struct {
  double f32, f64, ref;
} Losses;

static Losses losses_of(const L4Config *c, Params *P, const L4Batch *b) {
  char err[256];
  Losses r = {0};
  L4Model *mf = l4_create(c, b->B, b->T, err, sizeof err);
  L4Model *md = l4_create_f64(c, b->B, b->T, err, sizeof err);
  CHECK(mf && md, "%s", err);
  if (!mf || !md) return l4_free(mf), l4_free(md), r;
  int64_t n1, n2, n3;
  r.f32 = l4_run(mf, P->pf, NULL, b, &n1);
  r.f64 = l4_run_f64(md, P->p, NULL, b, &n2);
  r.ref = naive(c, P, b, &n3);
  CHECK(n1 == n3 && n2 == n3, "token counts %lld %lld vs naive %lld", (long long)n1,
        (long long)n2, (long long)n3);
  l4_free(mf);
  l4_free(md);
  return r;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

static Losses forward_case(const char *label, const L4Config *c, Params *P, const L4Batch *b) {
  Losses r = losses_of(c, P, b);
  printf("  %-40s naive %.9f  f32 rel diff %.2e  f64 rel diff %.2e\n", label, r.ref,
         rel(r.f32, r.ref), rel(r.f64, r.ref));
  CHECK(rel(r.f32, r.ref) < 1e-5, "%s: float loss %.9g vs naive %.9g", label, r.f32, r.ref);
  CHECK(rel(r.f64, r.ref) < 1e-11, "%s: double loss %.15g vs naive %.15g", label, r.f64, r.ref);
  return r;
}

static void forward_check(Batches *bb) {
  printf("forward check against llama4_naive.c:\n");
  L4Config c = small_config();
  Params P = params_create(&c, 0.3);
  Losses base = forward_case("base (chunk 4, NoPE layer 3)", &c, &P, &bb->plain);

  L4Config v = c;
  v.attention_chunk_size = 0;
  Losses nochunk = forward_case("no chunking", &v, &P, &bb->plain);
  CHECK(rel(nochunk.f32, base.f32) > 1e-4, "the chunk mask does not change the loss");
  v = c, v.attention_chunk_size = 3;
  Losses chunk3 = forward_case("chunk 3", &v, &P, &bb->plain);
  CHECK(rel(chunk3.f32, base.f32) > 1e-4, "the chunk size does not change the loss");
  v = c, v.skip_rope_interval = 1;
  Losses allnope = forward_case("every layer NoPE", &v, &P, &bb->plain);
  CHECK(rel(allnope.f32, base.f32) > 1e-4, "NoPE layers do not change the loss");
  v = c, v.skip_rope_interval = 0;
  Losses allrope = forward_case("every layer RoPE", &v, &P, &bb->plain);
  CHECK(rel(allrope.f32, base.f32) > 1e-4, "the NoPE layer does not change the loss");
  v = c, v.use_qk_norm = 0;
  Losses noqk = forward_case("no QK-norm", &v, &P, &bb->plain);
  CHECK(rel(noqk.f32, base.f32) > 1e-4, "QK-norm does not change the loss");
  v = c, v.rope_scale_factor = 0;
  Losses plainrope = forward_case("RoPE unscaled", &v, &P, &bb->plain);
  CHECK(rel(plainrope.f32, base.f32) > 1e-6, "RoPE scaling does not change the loss");
  v = c, v.rope_base = 500000, v.rope_scale_factor = 16, v.rope_low_freq_factor = 1;
  v.rope_high_freq_factor = 1, v.rope_old_context_len = 8192;
  forward_case("Scout's RoPE (500000, x16)", &v, &P, &bb->plain);

  Losses packed = forward_case("packed, temperature on", &c, &P, &bb->packed);
  v = c, v.attn_temperature_tuning = 0;
  Losses packed_nt = forward_case("packed, temperature off", &v, &P, &bb->packed);
  CHECK(rel(packed.f32, packed_nt.f32) > 1e-6,
        "the temperature does not change the loss past position 8191");

  /* a packed row is the sum of its sequences run alone */
  double parts = 0;
  int32_t *tok = bb->tok, *tgt = bb->tgt, *pos = bb->pos;
  L4Batch r0 = {.tokens = tok, .targets = tgt, .B = 1, .T = T_};
  L4Batch s1 = {.tokens = tok + T_, .targets = tgt + T_, .positions = pos + T_, .B = 1, .T = 6};
  L4Batch s2 = {.tokens = tok + T_ + 6, .targets = tgt + T_ + 6, .B = 1, .T = 4};
  L4Batch *pieces[] = {&r0, &s1, &s2};
  for (int i = 0; i < 3; i++) parts += losses_of(&c, &P, pieces[i]).f64;
  printf("  packed row vs its sequences alone: rel diff %.2e\n", rel(packed.f64, parts));
  CHECK(rel(packed.f64, parts) < 1e-12, "packed %.15g vs separate %.15g", packed.f64, parts);
  params_free(&P);

  /* dense layers: Maverick's every-second-layer MoE, then its shape (QK-norm
   * and RoPE scaling off, which leave the tensor table as it is) */
  L4Config d = dense_config();
  Params Pd = params_create(&d, 0.3);
  Losses dense = forward_case("dense layers 0, 2; MoE 1, 3", &d, &Pd, &bb->plain);
  v = maverick_config();
  Losses mav = forward_case("Maverick-shaped: no QK-norm, plain RoPE", &v, &Pd, &bb->plain);
  CHECK(rel(mav.f32, dense.f32) > 1e-4, "QK-norm and scaling do not change a dense config's loss");
  forward_case("Maverick-shaped, packed", &v, &Pd, &bb->packed);
  v.attention_chunk_size = 0, v.skip_rope_interval = 2;
  forward_case("Maverick-shaped, NoPE 1, 3, no chunks", &v, &Pd, &bb->plain);
  params_free(&Pd);
  /* other interleavings: MoE in layer 2 only; no MoE layer at all */
  const struct { int every; const char *label; } inter[] = {
    {3, "MoE every 3rd layer (layer 2)"}, {5, "MoE every 5th layer (none of 4)"},
  };
  for (int i = 0; i < 2; i++) {
    v = small_config();
    v.moe_every_n_layers = inter[i].every, v.mlp_hidden_dim = 6;
    Params Pv = params_create(&v, 0.3);
    forward_case(inter[i].label, &v, &Pv, &bb->plain);
    params_free(&Pv);
  }
}

/* ---- 3. contracts -------------------------------------------------------------------------- */
/* Gradients accumulate, the float build's match the double build's, and an
 * all-ignored batch is a no-op, on config c. */
static void precision_checks(const char *label, L4Config c, Batches *bb) {
  printf("  %s:\n", label);
  Params P = params_create(&c, 0.3);
  char err[256];
  L4Model *mf = l4_create(&c, B_, T_, err, sizeof err);
  L4Model *md = l4_create_f64(&c, B_, T_, err, sizeof err);
  CHECK(mf && md, "%s", err);
  if (!mf || !md) return;

  /* gradients accumulate: two calls give twice one call */
  int64_t nt;
  double worst32 = 0, worst64 = 0, l1 = l4_run(mf, P.pf, P.gf, &bb->packed, &nt);
  l4_run_f64(md, P.p, P.g, &bb->packed, &nt);
  Params once = params_create(&c, 0.3);
  for (int i = 0; i < P.n; i++) {
    memcpy(once.gf[i], P.gf[i], sizeof(float) * (size_t)P.t[i].numel);
    memcpy(once.g[i], P.g[i], sizeof(double) * (size_t)P.t[i].numel);
  }
  double l2 = l4_run(mf, P.pf, P.gf, &bb->packed, &nt);
  l4_run_f64(md, P.p, P.g, &bb->packed, &nt);
  CHECK(l1 == l2, "the same batch gave losses %.9g and %.9g", l1, l2);
  for (int i = 0; i < P.n; i++) {
    double s32 = 0, s64 = 0, d32 = 0, d64 = 0;
    for (int64_t j = 0; j < P.t[i].numel; j++) {
      s32 = fmax(s32, fabs(once.gf[i][j])), s64 = fmax(s64, fabs(once.g[i][j]));
      d32 = fmax(d32, fabs(P.gf[i][j] - 2.0 * once.gf[i][j]));
      d64 = fmax(d64, fabs(P.g[i][j] - 2.0 * once.g[i][j]));
    }
    if (s32 > 0) worst32 = fmax(worst32, d32 / s32);
    if (s64 > 0) worst64 = fmax(worst64, d64 / s64);
  }
  printf("    accumulation: |g2 - 2 g1| / max|g1| <= %.2e (f32), %.2e (f64)\n", worst32, worst64);
  CHECK(worst32 < 1e-5 && worst64 < 1e-12, "gradients do not accumulate");
  /* the float build's gradients are the double build's, to float accuracy */
  double worst = 0;
  const char *where = "";
  for (int i = 0; i < P.n; i++) {
    double s = 0, d = 0;
    for (int64_t j = 0; j < P.t[i].numel; j++) {
      s = fmax(s, fabs(once.g[i][j]));
      d = fmax(d, fabs(once.gf[i][j] - once.g[i][j]));
    }
    if (s > 0 && d / s > worst) worst = d / s, where = P.t[i].name;
  }
  printf("    f32 vs f64 gradients: max |gf - g| / max|g| %.2e (%s)\n", worst, where);
  CHECK(worst < 1e-4, "float gradients differ from double ones by %.3g in %s", worst, where);
  params_free(&once);

  /* every target ignored: loss 0, no gradient */
  params_zero_grads(&P);
  int32_t none[B_ * T_];
  for (int i = 0; i < B_ * T_; i++) none[i] = -100;
  L4Batch nb = bb->packed;
  nb.targets = none;
  double l0 = l4_run(mf, P.pf, P.gf, &nb, &nt);
  size_t nonzero = 0;
  for (int i = 0; i < P.n; i++)
    for (int64_t j = 0; j < P.t[i].numel; j++) nonzero += P.gf[i][j] != 0;
  printf("    all targets -100: loss %g, %lld tokens, %zu nonzero gradient entries\n", l0,
         (long long)nt, nonzero);
  CHECK(l0 == 0 && nt == 0 && nonzero == 0, "an all-ignored batch is not a no-op");
  l4_free(mf);
  l4_free(md);
  params_free(&P);
}

static void contract_checks(Batches *bb) {
  printf("contracts:\n");
  precision_checks("Scout-shaped", small_config(), bb);
  precision_checks("Maverick-shaped", maverick_config(), bb);
  char err[256];

  /* dims that do not fit */
  enum { NBAD = 8 };
  struct { const char *what, *expect; L4Config c; } bad[NBAD];
  for (int i = 0; i < NBAD; i++) bad[i].c = small_config();
  bad[0].what = "embed_dim != num_heads*head_dim", bad[0].expect = "embed_dim";
  bad[0].c.embed_dim = 20;
  bad[1].what = "num_heads % num_kv_heads", bad[1].expect = "num_kv_heads";
  bad[1].c.num_kv_heads = 3;
  bad[2].what = "odd head_dim", bad[2].expect = "even";
  bad[2].c.head_dim = 5, bad[2].c.num_heads = 4, bad[2].c.embed_dim = 20;
  bad[3].what = "zero experts", bad[3].expect = "num_experts";
  bad[3].c.num_experts = 0;
  bad[4].what = "zero kv heads", bad[4].expect = "num_kv_heads";
  bad[4].c.num_kv_heads = 0;
  bad[5].what = "zero norm_eps", bad[5].expect = "norm_eps";
  bad[5].c.norm_eps = 0;
  bad[6].what = "dense layers of width 0", bad[6].expect = "mlp_hidden_dim";
  bad[6].c.moe_every_n_layers = 2, bad[6].c.mlp_hidden_dim = 0;
  bad[7].what = "dense layers of width -4", bad[7].expect = "mlp_hidden_dim";
  bad[7].c.moe_every_n_layers = 3, bad[7].c.mlp_hidden_dim = -4;
  for (int i = 0; i < NBAD; i++) {
    err[0] = 0;
    L4Model *m = l4_create(&bad[i].c, 1, 4, err, sizeof err);
    printf("  rejects %-32s \"%s\"\n", bad[i].what, err);
    CHECK(!m && strstr(err, bad[i].expect), "%s: not rejected with a message naming %s",
          bad[i].what, bad[i].expect);
    l4_free(m);
  }

  /* Scout's table: HF's 579 tensors, 107,769,861,120 parameters */
  L4Config s = l4_config_scout();
  int ns = l4_tensors(&s, NULL);
  int64_t np = l4_param_count(&s);
  printf("  Scout: %d tensors, %lld parameters\n", ns, (long long)np);
  CHECK(ns == 579 && np == 107769861120LL, "Scout's tensor table is wrong");
  L4Tensor *t = xcalloc((size_t)ns, sizeof(L4Tensor));
  l4_tensors(&s, t);
  CHECK(!strcmp(t[5].name, "model.layers.0.feed_forward.experts.gate_up_proj") &&
            t[5].shape[0] == 16 && t[5].shape[1] == 5120 && t[5].shape[2] == 16384,
        "gate_up_proj is %s (%lld, %lld, %lld)", t[5].name, (long long)t[5].shape[0],
        (long long)t[5].shape[1], (long long)t[5].shape[2]);
  CHECK(!strcmp(t[ns - 1].name, "lm_head.weight"), "last tensor is %s", t[ns - 1].name);
  free(t);
  /* without dense layers mlp_hidden_dim is not looked at */
  s.mlp_hidden_dim = -1;
  CHECK(l4_param_count(&s) == np, "mlp_hidden_dim changes an all-MoE table");
  L4Model *sm = l4_create(&s, 1, 1, err, sizeof err);
  CHECK(sm, "an all-MoE config with mlp_hidden_dim -1 is rejected: %s", err);
  l4_free(sm);

  /* Maverick's: HF's 507 tensors (24 MoE layers of 12, 24 dense of 9),
   * 400,711,848,960 parameters, as Llama4ForCausalLM has them */
  L4Config mv = l4_config_maverick();
  ns = l4_tensors(&mv, NULL);
  np = l4_param_count(&mv);
  printf("  Maverick: %d tensors, %lld parameters\n", ns, (long long)np);
  CHECK(ns == 507 && np == 400711848960LL, "Maverick's tensor table is wrong");
  t = xcalloc((size_t)ns, sizeof(L4Tensor));
  l4_tensors(&mv, t);
  const struct { int i; const char *name; int64_t d0, d1, d2; } want[] = {
    {5, "model.layers.0.feed_forward.gate_proj.weight", 16384, 5120, 0},
    {6, "model.layers.0.feed_forward.up_proj.weight", 16384, 5120, 0},
    {7, "model.layers.0.feed_forward.down_proj.weight", 5120, 16384, 0},
    {9, "model.layers.0.post_attention_layernorm.weight", 5120, 0, 0},
    {14, "model.layers.1.feed_forward.experts.gate_up_proj", 128, 5120, 16384},
    {21, "model.layers.1.post_attention_layernorm.weight", 5120, 0, 0},
    {22, "model.layers.2.self_attn.q_proj.weight", 5120, 5120, 0},
    {505, "model.norm.weight", 5120, 0, 0},
    {506, "lm_head.weight", 202048, 5120, 0},
  };
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    const L4Tensor *w = &t[want[k].i];
    CHECK(!strcmp(w->name, want[k].name) && w->shape[0] == want[k].d0 &&
              (w->ndim < 2 || w->shape[1] == want[k].d1) && (w->ndim < 3 || w->shape[2] == want[k].d2),
          "Maverick tensor %d is %s (%lld, %lld, %lld), expected %s", want[k].i, w->name,
          (long long)w->shape[0], (long long)w->shape[1], (long long)w->shape[2], want[k].name);
  }
  free(t);

  /* HF init: norms 1, weights with std 0.02, the same for the same seed */
  L4Config inits[2] = {small_config(), maverick_config()};
  for (int k = 0; k < 2; k++) {
    L4Config *ci = &inits[k];
    Params A = params_create(ci, 1), Bp = params_create(ci, 1);
    l4_init_params(ci, A.pf, 7);
    l4_init_params(ci, Bp.pf, 7);
    double ss = 0;
    int64_t cnt = 0, same = 1, ones = 1;
    for (int i = 0; i < A.n; i++)
      for (int64_t j = 0; j < A.t[i].numel; j++) {
        same &= A.pf[i][j] == Bp.pf[i][j];
        if (is_norm(A.t[i].name)) ones &= A.pf[i][j] == 1.0f;
        else ss += (double)A.pf[i][j] * A.pf[i][j], cnt++;
      }
    printf("  init (%s): std %.4f over %lld weights\n", k ? "Maverick-shaped" : "Scout-shaped",
           sqrt(ss / cnt), (long long)cnt);
    CHECK(same && ones && fabs(sqrt(ss / cnt) - 0.02) < 0.001, "l4_init_params is off");
    params_free(&A);
    params_free(&Bp);
  }
}

/* ---- 4. threads ---------------------------------------------------------------------------- */
/* One forward+backward of config c on a B x T batch (positions restarting
 * in the middle of each row, so segments and chunks matter) with a pool of
 * `threads` (0: none); the loss and the float (or double) gradients. */
typedef struct {
  double loss;
  int n;
  float **gf;
  double **gd;
} ThreadRun;

static ThreadRun thread_run(const L4Config *c, Params *P, int B, int T, int threads, int f64) {
  char err[256];
  L4Model *m = f64 ? l4_create_f64(c, B, T, err, sizeof err) : l4_create(c, B, T, err, sizeof err);
  CHECK(m, "%s", err);
  ThreadRun r = {0};
  if (!m) return r;
  ThreadPool *pool = threads ? pool_create(threads) : NULL;
  CHECK(l4_set_pool(m, pool) == 0, "l4_set_pool failed");
  int n = B * T;
  int32_t *tok = xcalloc((size_t)n, sizeof(int32_t)), *tgt = xcalloc((size_t)n, sizeof(int32_t));
  int32_t *pos = xcalloc((size_t)n, sizeof(int32_t)), *seg = xcalloc((size_t)n, sizeof(int32_t));
  uint64_t keep = rng_state;
  rng_state = 99; /* the same batch for every run */
  for (int i = 0; i < n; i++) {
    int t = i % T, cut = T / 2 + 3;
    tok[i] = rng_int(c->vocab_size);
    tgt[i] = rng_int(5) == 0 ? -100 : rng_int(c->vocab_size);
    seg[i] = t < cut ? 0 : 1;
    pos[i] = t < cut ? t : t - cut;
  }
  rng_state = keep;
  L4Batch b = {.tokens = tok, .targets = tgt, .positions = pos, .segments = seg, .B = B, .T = T};
  r.n = P->n;
  if (f64) {
    r.gd = xcalloc((size_t)P->n, sizeof(double *));
    for (int i = 0; i < P->n; i++) r.gd[i] = xcalloc((size_t)P->t[i].numel, sizeof(double));
    r.loss = l4_run_f64(m, P->p, r.gd, &b, NULL);
  } else {
    r.gf = xcalloc((size_t)P->n, sizeof(float *));
    for (int i = 0; i < P->n; i++) r.gf[i] = xcalloc((size_t)P->t[i].numel, sizeof(float));
    r.loss = l4_run(m, P->pf, r.gf, &b, NULL);
  }
  l4_free(m);
  pool_free(pool);
  free(tok), free(tgt), free(pos), free(seg);
  return r;
}

static void thread_run_free(ThreadRun *r) {
  for (int i = 0; i < r->n; i++) {
    if (r->gf) free(r->gf[i]);
    if (r->gd) free(r->gd[i]);
  }
  free(r->gf), free(r->gd);
}

static void thread_case(const char *label, L4Config c, int B, int T) {
  Params P = params_create(&c, 0.05);
  for (int f64 = 0; f64 < 2; f64++) {
    ThreadRun base = thread_run(&c, &P, B, T, 0, f64);
    for (int threads = 2; threads <= 3; threads++) {
      ThreadRun r = thread_run(&c, &P, B, T, threads, f64);
      size_t differ = 0;
      const char *where = "";
      for (int i = 0; i < P.n && base.n; i++) {
        size_t k = (size_t)P.t[i].numel * (f64 ? sizeof(double) : sizeof(float));
        const void *x = f64 ? (const void *)base.gd[i] : (const void *)base.gf[i];
        const void *y = f64 ? (const void *)r.gd[i] : (const void *)r.gf[i];
        if (memcmp(x, y, k)) differ++, where = P.t[i].name;
      }
      printf("  %s, %s, %d threads: loss %.9g (alone %.9g), %zu tensors' gradients differ\n", label,
             f64 ? "f64" : "f32", threads, r.loss, base.loss, differ);
      CHECK(r.loss == base.loss && differ == 0, "%s (%s): %d threads differ from one (%s)", label,
            f64 ? "f64" : "f32", threads, where);
      thread_run_free(&r);
    }
    thread_run_free(&base);
  }
  params_free(&P);
}

static void thread_checks(void) {
  printf("threads:\n");
  /* 4 x 80 tokens: five row blocks, experts of more than a block */
  L4Config c = small_config();
  c.num_experts = 3, c.attention_chunk_size = 16;
  thread_case("Scout-shaped, 320 tokens", c, 4, 80);
  L4Config d = maverick_config();
  d.num_experts = 2;
  thread_case("Maverick-shaped, 320 tokens", d, 4, 80);
  /* a vocabulary whose logits come in blocks of 64 rows */
  L4Config v = small_config();
  v.vocab_size = 300000;
  thread_case("V = 300000, head blocks of 64 rows", v, 2, 100);
}

/* ---- 5. FSDP's hooks ----------------------------------------------------------------------
 * A hook that does what FSDP does to the pointers: between a unit's begin
 * and end its params and grads are copies in buffers of the hook's own,
 * and outside them the run's pointers point at nothing (NULL), so a read
 * of a unit outside its hooks crashes. The loss and every gradient must be
 * the bits of a run without hooks, and the hooks come in the documented
 * order. */
typedef struct {
  const L4Config *c;
  int n, nunits, first[64];
  float **params, **grads;     /* the run's pointer arrays */
  float *const *src;           /* where the params live */
  float **gacc;                /* where each unit's grads are added up */
  float **pbuf, **gbuf;        /* (n) the unit's copies while it is in use */
  char log[512];
  int fail_at;                 /* the call number that returns -1, or -1 */
  int calls;
} HookCtx;

static int hk_begin(void *ctx, int u, L4Pass pass) {
  HookCtx *h = ctx;
  size_t len = strlen(h->log);
  snprintf(h->log + len, sizeof h->log - len, "%s%d ", pass == L4_FORWARD ? "f" : "b", u);
  if (h->calls++ == h->fail_at)
    return -1;
  for (int t = h->first[u]; t < h->first[u + 1]; t++) {
    L4Tensor tt[1024];
    l4_tensors(h->c, tt);
    size_t bytes = sizeof(float) * (size_t)tt[t].numel;
    if (!h->pbuf[t]) {
      h->pbuf[t] = xcalloc((size_t)tt[t].numel, sizeof(float));
      memcpy(h->pbuf[t], h->src[t], bytes);
    }
    h->params[t] = h->pbuf[t];
    if (pass == L4_BACKWARD) {
      if (!h->gbuf[t])
        h->gbuf[t] = xcalloc((size_t)tt[t].numel, sizeof(float));
      h->grads[t] = h->gbuf[t];
    }
  }
  return 0;
}

static int hk_end(void *ctx, int u, L4Pass pass) {
  HookCtx *h = ctx;
  size_t len = strlen(h->log);
  snprintf(h->log + len, sizeof h->log - len, "%s%d. ", pass == L4_FORWARD ? "F" : "B", u);
  if (h->calls++ == h->fail_at)
    return -1;
  L4Tensor tt[1024];
  l4_tensors(h->c, tt);
  for (int t = h->first[u]; t < h->first[u + 1]; t++) {
    free(h->pbuf[t]);
    h->pbuf[t] = NULL;
    h->params[t] = NULL;
    if (pass == L4_BACKWARD) {
      for (int64_t i = 0; i < tt[t].numel; i++)
        h->gacc[t][i] += h->gbuf[t][i];
      free(h->gbuf[t]);
      h->gbuf[t] = NULL;
      h->grads[t] = NULL;
    }
  }
  return 0;
}

static void hooks_check(void) {
  printf("hooks:\n");
  L4Config c = small_config();
  c.num_layers = 3;
  Params P = params_create(&c, 0.05);
  Batches bb;
  batches_make(&bb, c.vocab_size);
  char err[256];
  L4Model *m = l4_create(&c, 2, 10, err, sizeof err);
  CHECK(m, "%s", err);
  params_zero_grads(&P);
  int64_t n0, n1;
  double want = l4_run(m, P.pf, P.gf, &bb.packed, &n0);
  HookCtx h = {.c = &c, .n = P.n, .src = P.pf, .fail_at = -1};
  h.nunits = l4_units(&c, h.first);
  CHECK(h.nunits == c.num_layers + 2 && h.first[0] == 0 && h.first[h.nunits] == P.n,
        "units: %d, tensors [%d, %d)", h.nunits, h.first[0], h.first[h.nunits]);
  h.params = xcalloc((size_t)P.n, sizeof(float *));
  h.grads = xcalloc((size_t)P.n, sizeof(float *));
  h.pbuf = xcalloc((size_t)P.n, sizeof(float *));
  h.gbuf = xcalloc((size_t)P.n, sizeof(float *));
  h.gacc = xcalloc((size_t)P.n, sizeof(float *));
  for (int t = 0; t < P.n; t++)
    h.gacc[t] = xcalloc((size_t)P.t[t].numel, sizeof(float));
  l4_set_hooks(m, &(L4Hooks){hk_begin, hk_end, &h});
  double got = l4_run(m, h.params, h.grads, &bb.packed, &n1);
  CHECK(memcmp(&got, &want, sizeof got) == 0 && n0 == n1, "hooked loss %.17g vs %.17g", got, want);
  int bad = 0;
  for (int t = 0; t < P.n; t++)
    bad += memcmp(h.gacc[t], P.gf[t], sizeof(float) * (size_t)P.t[t].numel) != 0;
  CHECK(bad == 0, "%d tensors' grads differ from the run without hooks", bad);
  const char *order = "f0 F0. f1 F1. f2 F2. f3 F3. f4 b4 B4. b3 B3. b2 B2. b1 B1. b0 B0. ";
  CHECK(strcmp(h.log, order) == 0, "hook order: %s", h.log);
  h.log[0] = 0;
  double fwd = l4_run(m, h.params, NULL, &bb.packed, &n1);
  CHECK(strcmp(h.log, "f0 F0. f1 F1. f2 F2. f3 F3. f4 F4. ") == 0 && isfinite(fwd), "forward alone: %s", h.log);
  h.log[0] = 0, h.calls = 0, h.fail_at = 5;
  double stopped = l4_run(m, h.params, h.grads, &bb.packed, &n1);
  CHECK(isnan(stopped) && strcmp(h.log, "f0 F0. f1 F1. f2 F2. ") == 0, "a failing hook stops the run: %g, %s",
        stopped, h.log);
  for (int t = 0; t < P.n; t++)
    free(h.pbuf[t]), free(h.gbuf[t]), free(h.gacc[t]);
  free(h.params), free(h.grads), free(h.pbuf), free(h.gbuf), free(h.gacc);
  l4_free(m);
  params_free(&P);
  printf("  %s\n", failures ? "failed" : "ok");
}

/* ---- 6. activation checkpointing --------------------------------------------------------
 * One layer's activations kept, each layer's forward recomputed in its
 * backward: the loss and every gradient are the bits of the run that keeps
 * them all, on a pool of 2 threads, Scout- and Maverick-shaped (dense
 * layers between MoE ones), with accumulation over two batches, and the
 * workspace is smaller. */
static void checkpoint_case(const char *label, L4Config c) {
  Params P = params_create(&c, 0.05);
  Batches bb;
  batches_make(&bb, c.vocab_size);
  char err[256];
  ThreadPool *pool = pool_create(2);
  L4Model *keep = l4_create(&c, 2, 10, err, sizeof err), *ck = l4_create(&c, 2, 10, err, sizeof err);
  CHECK(keep && ck && l4_set_pool(keep, pool) == 0 && l4_set_pool(ck, pool) == 0, "%s", err);
  size_t before = l4_workspace_bytes(ck);
  CHECK(l4_set_checkpointing(ck, 1) == 0, "l4_set_checkpointing");
  CHECK(l4_workspace_bytes(ck) < before &&
            l4_workspace_bytes(ck) == l4_workspace_bytes_ac(&c, 2, 10, 2, 1),
        "%s: checkpointed workspace %zu bytes, %zu without", label, l4_workspace_bytes(ck), before);
  float **g2 = xcalloc((size_t)P.n, sizeof(float *));
  for (int t = 0; t < P.n; t++)
    g2[t] = xcalloc((size_t)P.t[t].numel, sizeof(float));
  params_zero_grads(&P);
  int64_t n0, n1;
  double a = l4_run(keep, P.pf, P.gf, &bb.packed, &n0) + l4_run(keep, P.pf, P.gf, &bb.plain, &n0);
  double b = l4_run(ck, P.pf, g2, &bb.packed, &n1) + l4_run(ck, P.pf, g2, &bb.plain, &n1);
  int bad = 0;
  for (int t = 0; t < P.n; t++)
    bad += memcmp(g2[t], P.gf[t], sizeof(float) * (size_t)P.t[t].numel) != 0;
  CHECK(memcmp(&a, &b, sizeof a) == 0 && bad == 0, "%s: checkpointed loss %.17g vs %.17g, %d tensors' grads differ",
        label, b, a, bad);
  for (int t = 0; t < P.n; t++)
    free(g2[t]);
  free(g2);
  l4_free(keep);
  l4_free(ck);
  pool_free(pool);
  params_free(&P);
}

static void checkpoint_check(void) {
  printf("activation checkpointing:\n");
  L4Config c = small_config();
  c.num_layers = 4;
  checkpoint_case("Scout-shaped", c);
  checkpoint_case("Maverick-shaped", maverick_config());
  printf("  %s\n", failures ? "failed" : "ok");
}

/* ---- timing (printed, never asserted) ----------------------------------------------------- */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void timing(int moe_every, int threads) {
  L4Config c = l4_config_scout();
  c.vocab_size = 259, c.num_layers = 4, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16;
  c.embed_dim = 64, c.hidden_dim = 64, c.shared_hidden_dim = 64, c.num_experts = 16;
  c.attention_chunk_size = 64, c.moe_every_n_layers = moe_every, c.mlp_hidden_dim = 128;
  enum { B = 4, T = 128 };
  char err[256];
  L4Model *m = l4_create(&c, B, T, err, sizeof err);
  CHECK(m, "%s", err);
  if (!m) return;
  ThreadPool *pool = threads > 1 ? pool_create(threads) : NULL;
  l4_set_pool(m, pool);
  Params P = params_create(&c, 0.02);
  int32_t *tok = xcalloc(B * T, sizeof(int32_t)), *tgt = xcalloc(B * T, sizeof(int32_t));
  for (int i = 0; i < B * T; i++) tok[i] = rng_int(259), tgt[i] = rng_int(259);
  int64_t nt;
  l4_forward_backward(m, P.pf, P.gf, tok, tgt, B, T, &nt); /* warm up */
  int reps = 5;
  double t0 = now(), loss = 0;
  for (int r = 0; r < reps; r++) loss = l4_forward_backward(m, P.pf, P.gf, tok, tgt, B, T, &nt);
  double dt = (now() - t0) / reps;
  double t1 = now();
  for (int r = 0; r < reps; r++) l4_forward(m, P.pf, tok, tgt, B, T, &nt);
  double df = (now() - t1) / reps;
  printf("timing: D=64 L=4 E=16 H=64 %sV=259 B=%d T=%d (%lld params, %.1f MiB workspace), %d thread%s: "
         "forward+backward %.2f ms (%.0f tokens/s), forward %.2f ms, loss/token %.4f\n",
         moe_every > 1 ? "Hm=128 (layers 0, 2 dense) " : "", B, T, (long long)l4_param_count(&c), l4_workspace_bytes(m) / 1048576.0,
         threads, threads == 1 ? "" : "s", dt * 1e3, B * T / dt, df * 1e3, loss / nt);
  free(tok), free(tgt);
  params_free(&P);
  l4_free(m);
  pool_free(pool);
}

int main(void) {
  Batches bb;
  batches_make(&bb, small_config().vocab_size);
  grad_check("plain rows", small_config(), &bb.plain);
  grad_check("packed rows", small_config(), &bb.packed);
  grad_check("dense layers 0, 2, plain rows", dense_config(), &bb.plain);
  grad_check("Maverick-shaped, plain rows", maverick_config(), &bb.plain);
  grad_check("Maverick-shaped, packed rows", maverick_config(), &bb.packed);
  forward_check(&bb);
  contract_checks(&bb);
  thread_checks();
  hooks_check();
  checkpoint_check();
  printf("%s\n", blas_describe(2));
  timing(1, 1);
  timing(1, 2);
  timing(2, 2);
  if (failures) {
    printf("test_llama4: %d check(s) FAILED\n", failures);
    return 1;
  }
  printf("test_llama4: all checks passed\n");
  return 0;
}
