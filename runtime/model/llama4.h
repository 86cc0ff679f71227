/* llama4.h: the Llama 4 text decoder (HF Llama4TextModel + lm_head), forward
 * and backward on the CPU, matmuls through BLAS.
 *
 * Parameters are HF's tensors with HF's names and shapes, so a checkpoint
 * loads by name. The caller owns them: it passes one pointer per tensor, in
 * l4_tensors order, usually views into a flat (FSDP) buffer. The model owns
 * only its activation workspace.
 *
 * The model is compiled twice from llama4_impl.h: in float, which training
 * uses, and in double, which the gradient check uses. A model is created for
 * one precision and runs only in it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, head_dim;
  int hidden_dim;          /* routed experts' SwiGLU width H */
  int shared_hidden_dim;   /* shared expert's width Hs */
  int num_experts;
  /* Layer l is MoE (routed experts + shared expert) when moe_every_n_layers
   * <= 1 or (l + 1) % moe_every_n_layers == 0, else a dense SwiGLU MLP of
   * width mlp_hidden_dim Hm (Maverick: 2 and 16384; Scout: 1, every layer
   * MoE, and mlp_hidden_dim unused). */
  int moe_every_n_layers, mlp_hidden_dim;
  /* Layer l is NoPE when (l + 1) % skip_rope_interval == 0; <= 0: every
   * layer uses RoPE. QK-norm and the chunked mask apply on RoPE layers only;
   * attention_chunk_size <= 0 turns chunking off. */
  int skip_rope_interval, use_qk_norm, attention_chunk_size;
  /* llama3-style scaled RoPE; rope_scale_factor <= 0 means plain RoPE. */
  double rope_base, rope_scale_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_old_context_len;
  double norm_eps;
  /* On NoPE layers q *= log1p(floor((pos + 1) / attn_floor_scale)) * attn_scale + 1. */
  int attn_temperature_tuning; double attn_floor_scale, attn_scale;
  /* What the model is built with but does not vary: a recipe's model block
   * (torchtune's builder) and a config.json may name them, and must give
   * these values (the model's router is top-1, every MoE layer has a shared
   * expert, lm_head is its own tensor). */
  int experts_per_token;   /* 1 */
  int use_shared_expert;   /* 1 */
  int tie_word_embeddings; /* 0 */
  /* torchtune's max_seq_len (HF's max_position_embeddings): the longest
   * sequence the RoPE tables are meant for; the model itself takes any T. */
  long max_seq_len;
  const char *component;   /* the builder a recipe named (torchtune.models.llama4...), or NULL */
} L4Config;

typedef struct { char name[128]; int ndim; int64_t shape[3]; int64_t numel; } L4Tensor;

/* One micro-batch of B rows of T tokens. Packed rows carry several
 * sequences: a token attends only to earlier tokens of its own segment, and
 * the caller restarts positions at 0 in each segment. */
typedef struct {
  const int32_t *tokens;    /* (B, T) ids in [0, V) */
  const int32_t *targets;   /* (B, T) ids in [0, V), or -100: not counted */
  const int32_t *positions; /* (B, T) >= 0, or NULL: 0..T-1 in every row */
  const int32_t *segments;  /* (B, T) segment ids, or NULL: one sequence per row */
  int B, T;
} L4Batch;

/* ---- llama4.c: configuration and parameters ------------------------------ */
/* Llama 4 Scout's text decoder (Llama-4-Scout-17B-16E), temperature tuning on.
 * Small test configs start from it and change the dims. */
L4Config l4_config_scout(void);
/* Llama 4 Maverick's (Llama-4-Maverick-17B-128E): 128 experts in every
 * second layer, dense layers of 16384 between, no QK-norm, plain RoPE,
 * temperature tuning on. */
L4Config l4_config_maverick(void);
/* 1 when layer l applies RoPE (and the chunked mask, and QK-norm). */
int l4_layer_uses_rope(const L4Config *c, int l);
/* 1 when layer l's feed-forward is the MoE, 0 when it is a dense MLP. */
int l4_layer_is_moe(const L4Config *c, int l);
/* The parameter tensors in a fixed order (embed, then layer 0's, ..., then
 * norm, lm_head), with HF names; returns the count and fills out[] when not
 * NULL. Within a layer the order is HF's module order: q, k, v, o, then on
 * an MoE layer experts.gate_up_proj, experts.down_proj, router, shared
 * gate, up, down, on a dense one feed_forward.gate_proj, up_proj,
 * down_proj, then input_layernorm, post_attention_layernorm. */
int l4_tensors(const L4Config *c, L4Tensor *out);
int64_t l4_param_count(const L4Config *c);
/* HF-style init: normal(0, 0.02) for linear/embedding/expert weights, ones
 * for norm weights. Each tensor draws from its own splitmix64 stream keyed by
 * (seed, tensor index), so the result depends on nothing else. */
void l4_init_params(const L4Config *c, float *const *params, uint64_t seed);
/* The same for tensors [t0, t1) alone (params[t] read only for those):
 * their values are l4_init_params's. */
void l4_init_tensors(const L4Config *c, float *const *params, uint64_t seed, int t0, int t1);

/* ---- llama4.c: the model --------------------------------------------------- */
/* A model holds one batch's activations: it runs one batch at a time, and
 * separate threads need separate models. */
typedef struct L4Model L4Model;
/* Checks dims (divisibility, evenness of head_dim, ...) and returns NULL with
 * a message in err (size errlen) when they do not fit. Otherwise allocates
 * the activation workspace for batches up to max_batch x max_seq, in float.
 * The caller frees the model with l4_free. */
L4Model *l4_create(const L4Config *c, int max_batch, int max_seq, char *err, size_t errlen);
/* The same, in double: for gradient checks (l4_*_f64 only). */
L4Model *l4_create_f64(const L4Config *c, int max_batch, int max_seq, char *err, size_t errlen);
void l4_free(L4Model *m);
/* Bytes of activation workspace l4_create allocated, for memory reports. */
size_t l4_workspace_bytes(const L4Model *m);
/* ... and what l4_create would allocate for c at max_batch x max_seq, with
 * the attention scratch of `threads` threads (l4_set_pool), without
 * creating it: for memory plans. */
size_t l4_workspace_bytes_for(const L4Config *c, int max_batch, int max_seq, int threads);
/* ... with activation checkpointing on (ac 1) or off. */
size_t l4_workspace_bytes_ac(const L4Config *c, int max_batch, int max_seq, int threads, int ac);
/* Activation checkpointing (torchtune's enable_activation_checkpointing):
 * the forward keeps each layer's input alone, and each layer's backward
 * first recomputes its forward from it, in the one layer's worth of
 * activations the workspace then has (reallocated here). The same bits as
 * without; the last layer's activations are still there, so it is not
 * recomputed. 0, or -1 when the new workspace cannot be allocated (the
 * model is unchanged). */
int l4_set_checkpointing(L4Model *m, int on);
/* Runs the model's phases on pool's threads from now on (NULL: on the
 * caller's alone, the default), with the BLAS called from each thread
 * single-threaded; the pool is the caller's, shared with whatever else
 * uses it between runs (the compiled optimizer step), and must outlive the
 * model's runs. The results are the same bits for any pool size. 0, or -1
 * when the per-thread scratch cannot be allocated (the model is unchanged). */
typedef struct ThreadPool ThreadPool;
int l4_set_pool(L4Model *m, ThreadPool *pool);

/* ---- FSDP's units --------------------------------------------------------
 * torchtune's recipe wraps each decoder layer in FSDP, and the model's root
 * holds the rest: here the embedding is unit 0, layer l is unit 1 + l, and
 * the final norm with the output projection is unit L + 1. Unit u's tensors
 * are [first[u], first[u + 1]) in l4_tensors order; returns L + 2 and fills
 * first (L + 3 entries) when not NULL. */
int l4_units(const L4Config *c, int *first);

/* What a sharded caller does around each unit's use in a run (l4_set_hooks):
 * begin gathers the unit's params (and in backward makes its grads ready)
 * and points the run's params[t] / grads[t] of the unit's tensors at them;
 * end may free them again, and in backward hands the unit's grads on. The
 * run reads a unit's params only between its begin and end. Order, for L
 * layers: forward 0, 1, ..., L; then the head, L + 1, begins its forward
 * and, with grads, at once its backward (the head's forward and backward
 * run block by block together), whose end comes before backward L, ...,
 * 0; a forward alone (grads NULL) ends L + 1 as a forward. With activation
 * checkpointing a layer's backward recomputes its forward first, inside
 * the backward's begin and end. A hook returns 0, or -1 to stop the run,
 * which then returns NaN. */
typedef enum { L4_FORWARD, L4_BACKWARD } L4Pass;
typedef struct {
  int (*begin)(void *ctx, int unit, L4Pass pass);
  int (*end)(void *ctx, int unit, L4Pass pass);
  void *ctx;
} L4Hooks;
/* The hooks every later run calls (NULL: none, the default). Copied. */
void l4_set_hooks(L4Model *m, const L4Hooks *h);

/* params[i], grads[i] point at tensor i's data (row-major), in l4_tensors
 * order. Runs forward, and backward when grads is not NULL. Returns the SUM
 * of the token losses, sets *ntokens (when not NULL) to the number of counted
 * targets, and ADDS the gradients of that sum into grads, so gradient
 * accumulation is a loop. The caller divides by the token count. */
double l4_run(L4Model *m, float *const *params, float *const *grads, const L4Batch *b,
              int64_t *ntokens);
double l4_run_f64(L4Model *m, double *const *params, double *const *grads, const L4Batch *b,
                  int64_t *ntokens);
/* l4_run on B plain rows of T tokens. */
double l4_forward_backward(L4Model *m, float *const *params, float *const *grads,
                           const int32_t *tokens, const int32_t *targets, int B, int T,
                           int64_t *ntokens);
/* Forward only (evaluation), same return convention. */
double l4_forward(L4Model *m, float *const *params, const int32_t *tokens,
                  const int32_t *targets, int B, int T, int64_t *ntokens);
double l4_forward_backward_f64(L4Model *m, double *const *params, double *const *grads,
                               const int32_t *tokens, const int32_t *targets, int B, int T,
                               int64_t *ntokens);
double l4_forward_f64(L4Model *m, double *const *params, const int32_t *tokens,
                      const int32_t *targets, int B, int T, int64_t *ntokens);
/* The routed expert each token of the last run chose in layer l: (B*T)
 * entries, valid until the next run; NULL for a dense layer, which routes
 * nothing. For load statistics and for tests. */
const int32_t *l4_expert_choice(const L4Model *m, int l);

/* ---- inventory.c: a recipe's parameter tensors ---------------------------------------- */
typedef struct {
  char name[160];
  int ndim;
  int64_t shape[3];
  int64_t numel;
} InvTensor;

/* The model's parameter tensors: HF's layout (what optc's model holds and
 * its checkpoints name), or torchtune's (what torchtune's FSDP shards).
 * *out is malloc'd; returns the count. */
int inventory_tensors(const L4Config *m, bool torchtune, InvTensor **out);
