/* llama4.c: the Llama 4 text decoder's configuration, parameter table,
 * init, and workspace. The forward and backward passes live in
 * llama4_impl.h, which this file includes once for float and once for
 * double. */
#include "llama4.h"

#include "blas.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A bug (a caller breaking the contract), not a user's mistake. */
#define L4_CHECK(c, ...)                                              \
  do {                                                                \
    if (!(c)) {                                                       \
      fprintf(stderr, "%s:%d: llama4: ", __FILE__, __LINE__);         \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
      abort();                                                        \
    }                                                                 \
  } while (0)

/* The output head's softmax over the vocabulary keeps its max and its sum
 * in this many lanes (vectorizable; combined in lane order). */
#define HEAD_LANES 16

/* A phase's row tasks take this many tokens each: the GEMMs' M, and what
 * makes the work of a phase independent of the thread count. */
#define L4_ROW_BLOCK 64

/* Tokens that go through the output head at once: all of them when their
 * (rows, V) logits fit in 2^25 elements (128 MiB), else a multiple of
 * L4_ROW_BLOCK (at Scout's V = 202048, 128 rows), so the logits never exist
 * for a large batch at once. lm_head's gradient sums over a block's rows
 * at once. Each block's GEMMs pack all of lm_head again, so a block must
 * not be small; nor so large that its logits leave the cache. 128 rows
 * measured fastest (bench/results.md, "Measurements behind the emitters'
 * choices"). */
static size_t head_block_rows(size_t n, size_t V) {
  size_t r = ((size_t)1 << 25) / V;
  r = r < L4_ROW_BLOCK ? L4_ROW_BLOCK : r / L4_ROW_BLOCK * L4_ROW_BLOCK;
  return r < n ? r : n;
}

/* Rows of a weight gradient (out, in) per task: at least 32768 elements
 * and 64 rows, so each GEMM is worth a task. A function of the shape
 * alone, never of the thread count. */
static int wgrad_chunk_rows(int out, int in) {
  int r = 32768 / (in > 0 ? in : 1);
  r = r < 64 ? 64 : r;
  return r < out ? r : out;
}

/* One expert's rows [r0, r0 + rows) of the expert-ordered tokens: an item
 * of the routed experts' forward. */
typedef struct { int32_t expert, r0, rows; } L4Item;

#define L4_PI 3.14159265358979323846

/* A layer's tensors, in HF's module order: self_attn's, then the
 * feed-forward's, then the two norms. An MoE layer's feed-forward is
 * experts, router, shared_expert; a dense layer's is one SwiGLU MLP. */
enum { T_WQ, T_WK, T_WV, T_WO, T_FFN };
enum { T_GATE_UP = T_FFN, T_DOWN, T_ROUTER, T_SGATE, T_SUP, T_SDOWN, T_MOE_NORMS };
enum { T_MGATE = T_FFN, T_MUP, T_MDOWN, T_DENSE_NORMS };
#define T_MOE_COUNT (T_MOE_NORMS + 2)
#define T_DENSE_COUNT (T_DENSE_NORMS + 2)
#define T_EMBED 0
#define T_LAYER(c, l) layer_first(c, l)
#define T_NORM(c) layer_first(c, (c)->num_layers)
#define T_LM_HEAD(c) (T_NORM(c) + 1)

struct L4Model {
  L4Config c;
  int max_batch, max_seq;
  size_t elem;         /* sizeof(float) or sizeof(double): the precision it runs */
  void *acts;          /* activations and scratch, bound by acts_bind_f32/_f64 */
  size_t acts_bytes;
  double *inv_freq;    /* (hd/2) RoPE frequencies after llama3 scaling */
  /* routing of the last run, and the batch's positions */
  int32_t *choice;     /* (L, N) chosen expert per token */
  int32_t *order;      /* (L, N) token indices grouped by expert, ascending within one */
  int32_t *offsets;    /* (L, E+1) expert e's tokens are order[offsets[e] .. offsets[e+1]) */
  int32_t *cursor;     /* (E) scratch for the grouping */
  int32_t *pos;        /* (N) positions of this batch */
  int32_t *chunk_id;   /* (N) pos / attention_chunk_size */
  size_t ints_bytes;
  L4Item *items;       /* (N + E) the routed forward's items */
  double *row_loss;    /* (N) each token's cross-entropy */
  int32_t *head_idx;   /* (N) the rows whose target counts, in order: what the output head runs */
  /* the threads: a pool's, or the caller's alone (pool NULL, one slot) */
  ThreadPool *pool;
  int nslots;
  void *scratch;       /* (nslots, 2, max_seq, max_seq) attention scores per thread */
  int ac;              /* activation checkpointing: one layer's activations kept, each recomputed in backward */
  L4Hooks hooks;       /* a sharded caller's, around each unit (l4_set_hooks) */
  int hooks_failed;    /* a hook returned -1 in this run */
};

L4Config l4_config_scout(void) {
  L4Config c = {
    .vocab_size = 202048, .num_layers = 48, .num_heads = 40, .num_kv_heads = 8,
    .embed_dim = 5120, .head_dim = 128, .hidden_dim = 8192, .shared_hidden_dim = 8192,
    .num_experts = 16, .moe_every_n_layers = 1, .mlp_hidden_dim = 0,
    .skip_rope_interval = 4, .use_qk_norm = 1,
    .attention_chunk_size = 8192, .rope_base = 500000.0, .rope_scale_factor = 16.0,
    .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 1.0, .rope_old_context_len = 8192,
    .norm_eps = 1e-5, .attn_temperature_tuning = 1, .attn_floor_scale = 8192.0,
    .attn_scale = 0.1,
    .experts_per_token = 1, .use_shared_expert = 1, .tie_word_embeddings = 0,
    .max_seq_len = 10485760, .component = "torchtune.models.llama4.llama4_scout_17b_16e",
  };
  return c;
}

L4Config l4_config_maverick(void) {
  L4Config c = l4_config_scout();
  c.num_experts = 128, c.moe_every_n_layers = 2, c.mlp_hidden_dim = 16384;
  c.use_qk_norm = 0, c.rope_scale_factor = 0;
  c.max_seq_len = 1048576, c.component = "torchtune.models.llama4.llama4_maverick_17b_128e";
  return c;
}

int l4_layer_uses_rope(const L4Config *c, int l) {
  return c->skip_rope_interval <= 0 || (l + 1) % c->skip_rope_interval != 0;
}

int l4_layer_is_moe(const L4Config *c, int l) {
  return c->moe_every_n_layers <= 1 || (l + 1) % c->moe_every_n_layers == 0;
}

/* MoE layers among layers 0..l-1: those with (j + 1) % n == 0, j + 1 <= l. */
static int moe_layers_before(const L4Config *c, int l) {
  return c->moe_every_n_layers <= 1 ? l : l / c->moe_every_n_layers;
}

/* The index of layer l's first tensor in l4_tensors order; at l =
 * num_layers, that of the final norm. */
static int layer_first(const L4Config *c, int l) {
  return 1 + l * T_DENSE_COUNT + moe_layers_before(c, l) * (T_MOE_COUNT - T_DENSE_COUNT);
}

static void tensor_set(L4Tensor *t, int ndim, int64_t d0, int64_t d1, int64_t d2,
                       const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->name, sizeof t->name, fmt, ap);
  va_end(ap);
  t->ndim = ndim;
  t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
  t->numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
}

int l4_tensors(const L4Config *c, L4Tensor *out) {
  int64_t V = c->vocab_size, D = c->embed_dim, QD = (int64_t)c->num_heads * c->head_dim,
          KVD = (int64_t)c->num_kv_heads * c->head_dim, E = c->num_experts,
          H = c->hidden_dim, Hs = c->shared_hidden_dim, Hm = c->mlp_hidden_dim;
  int n = T_LM_HEAD(c) + 1;
  if (!out) return n;
  tensor_set(&out[T_EMBED], 2, V, D, 0, "model.embed_tokens.weight");
  for (int l = 0; l < c->num_layers; l++) {
    L4Tensor *t = &out[T_LAYER(c, l)];
    const char *a = "model.layers.%d.self_attn", *f = "model.layers.%d.feed_forward";
    char p[64], q[64];
    snprintf(p, sizeof p, a, l);
    snprintf(q, sizeof q, f, l);
    tensor_set(&t[T_WQ], 2, QD, D, 0, "%s.q_proj.weight", p);
    tensor_set(&t[T_WK], 2, KVD, D, 0, "%s.k_proj.weight", p);
    tensor_set(&t[T_WV], 2, KVD, D, 0, "%s.v_proj.weight", p);
    tensor_set(&t[T_WO], 2, D, QD, 0, "%s.o_proj.weight", p);
    int norms = T_DENSE_NORMS;
    if (l4_layer_is_moe(c, l)) {
      tensor_set(&t[T_GATE_UP], 3, E, D, 2 * H, "%s.experts.gate_up_proj", q);
      tensor_set(&t[T_DOWN], 3, E, H, D, "%s.experts.down_proj", q);
      tensor_set(&t[T_ROUTER], 2, E, D, 0, "%s.router.weight", q);
      tensor_set(&t[T_SGATE], 2, Hs, D, 0, "%s.shared_expert.gate_proj.weight", q);
      tensor_set(&t[T_SUP], 2, Hs, D, 0, "%s.shared_expert.up_proj.weight", q);
      tensor_set(&t[T_SDOWN], 2, D, Hs, 0, "%s.shared_expert.down_proj.weight", q);
      norms = T_MOE_NORMS;
    } else {
      tensor_set(&t[T_MGATE], 2, Hm, D, 0, "%s.gate_proj.weight", q);
      tensor_set(&t[T_MUP], 2, Hm, D, 0, "%s.up_proj.weight", q);
      tensor_set(&t[T_MDOWN], 2, D, Hm, 0, "%s.down_proj.weight", q);
    }
    tensor_set(&t[norms], 1, D, 0, 0, "model.layers.%d.input_layernorm.weight", l);
    tensor_set(&t[norms + 1], 1, D, 0, 0, "model.layers.%d.post_attention_layernorm.weight", l);
  }
  tensor_set(&out[T_NORM(c)], 1, D, 0, 0, "model.norm.weight");
  tensor_set(&out[T_LM_HEAD(c)], 2, V, D, 0, "lm_head.weight");
  return n;
}

int64_t l4_param_count(const L4Config *c) {
  int n = l4_tensors(c, NULL);
  L4Tensor *t = malloc(sizeof(L4Tensor) * (size_t)n);
  L4_CHECK(t, "out of memory");
  l4_tensors(c, t);
  int64_t sum = 0;
  for (int i = 0; i < n; i++) sum += t[i].numel;
  free(t);
  return sum;
}

/* ---- init: splitmix64 + Box-Muller ----------------------------------------- */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* uniform in (0, 1]: never 0, so log() in Box-Muller stays finite */
static double uniform_open(uint64_t *s) { return ((splitmix64(s) >> 11) + 1) * 0x1.0p-53; }

void l4_init_params(const L4Config *c, float *const *params, uint64_t seed) {
  l4_init_tensors(c, params, seed, 0, l4_tensors(c, NULL));
}

void l4_init_tensors(const L4Config *c, float *const *params, uint64_t seed, int t0, int t1) {
  int n = l4_tensors(c, NULL);
  L4Tensor *t = malloc(sizeof(L4Tensor) * (size_t)n);
  L4_CHECK(t, "out of memory");
  l4_tensors(c, t);
  L4_CHECK(0 <= t0 && t0 <= t1 && t1 <= n, "tensors [%d, %d) of %d", t0, t1, n);
  for (int i = t0; i < t1; i++) {
    float *p = params[i];
    if (t[i].ndim == 1) { /* the norms' weights, and nothing else, are vectors */
      for (int64_t j = 0; j < t[i].numel; j++) p[j] = 1.0f;
      continue;
    }
    uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1));
    for (int64_t j = 0; j < t[i].numel; j += 2) {
      double r = sqrt(-2.0 * log(uniform_open(&s))), th = 2.0 * L4_PI * uniform_open(&s);
      p[j] = (float)(0.02 * r * cos(th));
      if (j + 1 < t[i].numel) p[j + 1] = (float)(0.02 * r * sin(th));
    }
  }
  free(t);
}

/* ---- scaled RoPE frequencies -----------------------------------------------
 * HF's _compute_llama3_parameters: inv_freq[i] = base^(-2i/hd), then
 *   wavelen < old/high  -> f              (high frequencies kept)
 *   wavelen > old/low   -> f / factor     (low frequencies stretched)
 *   otherwise           -> (1 - s) f / factor + s f,
 *                          s = (old/wavelen - low) / (high - low)
 * Scout has low == high, so the middle band is the single point
 * wavelen == old, where HF would divide by zero; there we take f / factor. */
static void rope_frequencies(const L4Config *c, double *f) {
  int half = c->head_dim / 2;
  for (int i = 0; i < half; i++) {
    double inv = 1.0 / pow(c->rope_base, (2.0 * i) / c->head_dim);
    if (c->rope_scale_factor > 0) {
      double factor = c->rope_scale_factor, old = c->rope_old_context_len;
      double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      double wavelen = 2.0 * L4_PI / inv;
      if (wavelen < old / hi) {
        /* keep */
      } else if (wavelen > old / lo || hi == lo) {
        inv = inv / factor;
      } else {
        double s = (old / wavelen - lo) / (hi - lo);
        inv = (1.0 - s) * inv / factor + s * inv;
      }
    }
    f[i] = inv;
  }
}

/* ---- the loops' machine code ---------------------------------------------------
 * The per-token loops (norms, RoPE, SwiGLU, softmax, cross-entropy) are
 * built three times, for AVX-512, AVX2 and baseline x86-64, and the loader
 * picks the one this CPU runs. No clone contracts a multiply-add, and each
 * sum's order is fixed in the source (8 lanes), so every clone gives the
 * same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define L4_VEC __attribute__((optimize("O3"), target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define L4_VEC
#endif

/* e^x in float, within 1.4 ulp of the exact value (Cephes' expf
 * polynomial), written so that the compiler vectorises it: libm's expf is
 * a call per element. Clamped to [-87, 88]. */
static inline float l4_expf(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  q = q * r * r + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return q * scale;
}

/* ---- FSDP units and their hooks ------------------------------------------------ */
int l4_units(const L4Config *c, int *first) {
  int L = c->num_layers;
  if (first) {
    first[0] = T_EMBED;
    for (int l = 0; l <= L; l++)
      first[1 + l] = T_LAYER(c, l);
    first[L + 2] = T_LM_HEAD(c) + 1;
  }
  return L + 2;
}

void l4_set_hooks(L4Model *m, const L4Hooks *h) { m->hooks = h ? *h : (L4Hooks){0}; }

/* Calls a hook unless one has failed in this run; 0 when the run goes on. */
static int hook(L4Model *m, int begin, int unit, L4Pass pass) {
  int (*fn)(void *, int, L4Pass) = begin ? m->hooks.begin : m->hooks.end;
  if (m->hooks_failed || !fn)
    return m->hooks_failed ? -1 : 0;
  if (fn(m->hooks.ctx, unit, pass) != 0)
    m->hooks_failed = 1;
  return m->hooks_failed ? -1 : 0;
}

/* ---- the two precisions ------------------------------------------------------- */
#define REAL float
#define SUF(name) name##_f32
#define GEMM cblas_sgemm
#define R_EXP l4_expf
#define R_LOG logf
#define R_SQRT sqrtf
#include "llama4_impl.h"
#undef REAL
#undef SUF
#undef GEMM
#undef R_EXP
#undef R_LOG
#undef R_SQRT

#define REAL double
#define SUF(name) name##_f64
#define GEMM cblas_dgemm
#define R_EXP exp
#define R_LOG log
#define R_SQRT sqrt
#include "llama4_impl.h"
#undef REAL
#undef SUF
#undef GEMM
#undef R_EXP
#undef R_LOG
#undef R_SQRT

/* ---- create / free -------------------------------------------------------------- */
static int config_check(const L4Config *c, int max_batch, int max_seq, char *err,
                        size_t errlen) {
#define BAD(...) return snprintf(err, errlen, "llama4: " __VA_ARGS__), 0
  struct { const char *name; int v; } pos[] = {
    {"vocab_size", c->vocab_size}, {"num_layers", c->num_layers},
    {"num_heads", c->num_heads}, {"num_kv_heads", c->num_kv_heads},
    {"embed_dim", c->embed_dim}, {"head_dim", c->head_dim},
    {"hidden_dim", c->hidden_dim}, {"shared_hidden_dim", c->shared_hidden_dim},
    {"num_experts", c->num_experts}, {"max_batch", max_batch}, {"max_seq", max_seq},
  };
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0) BAD("%s must be positive, got %d", pos[i].name, pos[i].v);
  /* layer 0 is dense whenever moe_every_n_layers > 1 */
  if (c->moe_every_n_layers > 1 && c->mlp_hidden_dim <= 0)
    BAD("mlp_hidden_dim must be positive, got %d: moe_every_n_layers %d makes layers dense",
        c->mlp_hidden_dim, c->moe_every_n_layers);
  if (c->num_heads % c->num_kv_heads != 0)
    BAD("num_heads (%d) must be a multiple of num_kv_heads (%d) for grouped-query attention",
        c->num_heads, c->num_kv_heads);
  if (c->head_dim % 2 != 0)
    BAD("head_dim (%d) must be even: RoPE rotates pairs of features", c->head_dim);
  /* HF sizes q_proj by num_heads*head_dim independently, but Scout and
   * torchtune's builders tie them; a mismatch is a typo in a config. */
  if ((int64_t)c->num_heads * c->head_dim != c->embed_dim)
    BAD("embed_dim (%d) must equal num_heads (%d) * head_dim (%d)", c->embed_dim,
        c->num_heads, c->head_dim);
  if (!(c->norm_eps > 0)) BAD("norm_eps must be positive, got %g", c->norm_eps);
  if (!(c->rope_base > 1)) BAD("rope_base must be > 1, got %g", c->rope_base);
  if (c->rope_scale_factor > 0 &&
      (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor >= c->rope_low_freq_factor) ||
       c->rope_old_context_len <= 0))
    BAD("rope scaling needs 0 < low_freq_factor (%g) <= high_freq_factor (%g) and "
        "old_context_len > 0 (%d)", c->rope_low_freq_factor, c->rope_high_freq_factor,
        c->rope_old_context_len);
  if (c->attn_temperature_tuning && !(c->attn_floor_scale > 0))
    BAD("attn_floor_scale must be positive, got %g", c->attn_floor_scale);
  if ((int64_t)max_batch * max_seq > INT32_MAX) BAD("max_batch * max_seq is too large");
  return 1;
#undef BAD
}

/* The int workspace: choice and order (L, N), offsets (L, E+1), cursor (E),
 * pos, chunk_id and head_idx (N). */
static size_t ints_bytes(const L4Config *c, size_t N) {
  size_t L = c->num_layers, E = c->num_experts;
  return (2 * L * N + L * (E + 1) + E + 3 * N) * sizeof(int32_t);
}

static L4Model *model_create(const L4Config *c, int max_batch, int max_seq, size_t elem,
                             char *err, size_t errlen) {
  if (errlen) err[0] = 0;
  if (!config_check(c, max_batch, max_seq, err, errlen)) return NULL;
  L4Model *m = calloc(1, sizeof *m);
  if (!m) return snprintf(err, errlen, "llama4: out of memory"), NULL;
  m->c = *c;
  m->max_batch = max_batch, m->max_seq = max_seq, m->elem = elem;
  size_t numel = elem == sizeof(float) ? acts_bind_f32(m, NULL, NULL)
                                       : acts_bind_f64(m, NULL, NULL);
  size_t N = (size_t)max_batch * max_seq, L = c->num_layers, E = c->num_experts;
  m->acts_bytes = numel * elem;
  m->ints_bytes = ints_bytes(c, N);
  m->acts = malloc(m->acts_bytes);
  int32_t *ints = malloc(m->ints_bytes);
  m->inv_freq = malloc(sizeof(double) * (size_t)(c->head_dim / 2));
  m->items = malloc(sizeof(L4Item) * (N + E));
  m->row_loss = malloc(sizeof(double) * N);
  m->nslots = 1;
  m->scratch = malloc(elem * 2 * (size_t)max_seq * max_seq);
  if (!m->acts || !ints || !m->inv_freq || !m->items || !m->row_loss || !m->scratch) {
    snprintf(err, errlen, "llama4: cannot allocate %zu bytes of activations",
             m->acts_bytes + m->ints_bytes);
    free(ints);
    l4_free(m);
    return NULL;
  }
  m->choice = ints;
  m->order = m->choice + L * N;
  m->offsets = m->order + L * N;
  m->cursor = m->offsets + L * (E + 1);
  m->pos = m->cursor + E;
  m->chunk_id = m->pos + N;
  m->head_idx = m->chunk_id + N;
  rope_frequencies(c, m->inv_freq);
  blas_init();
  return m;
}

/* The caller frees the model, its workspace included, with l4_free. */
L4Model *l4_create(const L4Config *c, int max_batch, int max_seq, char *err, size_t errlen) {
  return model_create(c, max_batch, max_seq, sizeof(float), err, errlen);
}

L4Model *l4_create_f64(const L4Config *c, int max_batch, int max_seq, char *err,
                       size_t errlen) {
  return model_create(c, max_batch, max_seq, sizeof(double), err, errlen);
}

void l4_free(L4Model *m) {
  if (!m) return;
  free(m->acts);
  free(m->choice); /* the start of the int workspace */
  free(m->inv_freq);
  free(m->items);
  free(m->row_loss);
  free(m->scratch);
  free(m);
}

int l4_set_pool(L4Model *m, ThreadPool *pool) {
  int slots = blas_pool_threads(pool);
  void *s = malloc(m->elem * 2 * (size_t)m->max_seq * m->max_seq * (size_t)slots);
  if (!s) return -1;
  free(m->scratch);
  m->scratch = s, m->pool = pool, m->nslots = slots;
  return 0;
}

size_t l4_workspace_bytes(const L4Model *m) {
  size_t N = (size_t)m->max_batch * m->max_seq;
  return m->acts_bytes + m->ints_bytes + (N + m->c.num_experts) * sizeof(L4Item) + N * sizeof(double) +
         m->elem * 2 * (size_t)m->max_seq * m->max_seq * (size_t)m->nslots;
}

int l4_set_checkpointing(L4Model *m, int on) {
  on = !!on;
  if (on == m->ac) return 0;
  int was = m->ac;
  m->ac = on;
  size_t numel = m->elem == sizeof(float) ? acts_bind_f32(m, NULL, NULL) : acts_bind_f64(m, NULL, NULL);
  void *acts = malloc(numel * m->elem);
  if (!acts) {
    m->ac = was;
    return -1;
  }
  free(m->acts);
  m->acts = acts, m->acts_bytes = numel * m->elem;
  return 0;
}

size_t l4_workspace_bytes_for(const L4Config *c, int max_batch, int max_seq, int threads) {
  return l4_workspace_bytes_ac(c, max_batch, max_seq, threads, 0);
}

size_t l4_workspace_bytes_ac(const L4Config *c, int max_batch, int max_seq, int threads, int ac) {
  L4Model m = {.c = *c, .max_batch = max_batch, .max_seq = max_seq, .elem = sizeof(float), .ac = !!ac};
  m.acts_bytes = acts_bind_f32(&m, NULL, NULL) * sizeof(float);
  m.ints_bytes = ints_bytes(c, (size_t)max_batch * max_seq);
  m.nslots = threads > 0 ? threads : 1;
  return l4_workspace_bytes(&m);
}

const int32_t *l4_expert_choice(const L4Model *m, int l) {
  L4_CHECK(l >= 0 && l < m->c.num_layers, "layer %d out of range", l);
  if (!l4_layer_is_moe(&m->c, l)) return NULL;
  return m->choice + (size_t)l * m->max_batch * m->max_seq;
}

/* ---- entry points ------------------------------------------------------------------- */
double l4_run(L4Model *m, float *const *params, float *const *grads, const L4Batch *b,
              int64_t *ntokens) {
  L4_CHECK(m->elem == sizeof(float), "l4_run on a model created by l4_create_f64");
  return model_run_f32(m, params, grads, b, ntokens);
}

double l4_run_f64(L4Model *m, double *const *params, double *const *grads, const L4Batch *b,
                  int64_t *ntokens) {
  L4_CHECK(m->elem == sizeof(double), "l4_run_f64 on a model created by l4_create");
  return model_run_f64(m, params, grads, b, ntokens);
}

double l4_forward_backward(L4Model *m, float *const *params, float *const *grads,
                           const int32_t *tokens, const int32_t *targets, int B, int T,
                           int64_t *ntokens) {
  L4Batch b = {.tokens = tokens, .targets = targets, .B = B, .T = T};
  L4_CHECK(grads, "l4_forward_backward needs grads");
  return l4_run(m, params, grads, &b, ntokens);
}

double l4_forward(L4Model *m, float *const *params, const int32_t *tokens,
                  const int32_t *targets, int B, int T, int64_t *ntokens) {
  L4Batch b = {.tokens = tokens, .targets = targets, .B = B, .T = T};
  return l4_run(m, params, NULL, &b, ntokens);
}

double l4_forward_backward_f64(L4Model *m, double *const *params, double *const *grads,
                               const int32_t *tokens, const int32_t *targets, int B, int T,
                               int64_t *ntokens) {
  L4Batch b = {.tokens = tokens, .targets = targets, .B = B, .T = T};
  L4_CHECK(grads, "l4_forward_backward_f64 needs grads");
  return l4_run_f64(m, params, grads, &b, ntokens);
}

double l4_forward_f64(L4Model *m, double *const *params, const int32_t *tokens,
                      const int32_t *targets, int B, int T, int64_t *ntokens) {
  L4Batch b = {.tokens = tokens, .targets = targets, .B = B, .T = T};
  return l4_run_f64(m, params, NULL, &b, ntokens);
}
