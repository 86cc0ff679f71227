/* frontend.h: torchtune-shaped recipes (YAML, through libyaml) and the step
 * graph they imply: scale_grads -> clip_grad_norm -> the optimizer body. */
#pragma once
#include "ir.h"

/* ---- yaml.c: a YAML document as a tree with source positions ------------- */
typedef enum { YAML_NULL, YAML_SCALAR, YAML_SEQ, YAML_MAP } YamlKind;

typedef struct YamlNode YamlNode;
struct YamlNode {
  YamlKind kind;
  const char *str;  /* SCALAR: the text */
  bool plain;       /* SCALAR: written without quotes */
  int n;            /* SEQ: items; MAP: pairs */
  YamlNode **items; /* SEQ items, or MAP values */
  const char **keys;     /* MAP keys */
  SrcPos *key_pos;       /* MAP key positions */
  SrcPos pos;
};

/* Parses src into a tree in arena a; NULL (error printed) on bad YAML. */
YamlNode *yaml_load(const SrcFile *src, Arena *a);
YamlNode *yaml_get(const YamlNode *map, const char *key);
int yaml_index(const YamlNode *map, const char *key);
/* Sets map[key] = value, appending the key when absent. */
void yaml_set(YamlNode *map, const char *key, YamlNode *value, Arena *a);
YamlNode *yaml_scalar(Arena *a, const char *s, bool plain, SrcPos pos);
/* Removes map[key]; false when absent. */
bool yaml_remove(YamlNode *map, const char *key);
/* Resolves OmegaConf's ${a.b} interpolations in place: a whole value takes the
 * named node (and its type), ${x} inside a string its text. A reference to no
 * key (or a resolver such as ${oc.env:X}) stays as written, an error only where
 * the value is used; false (error printed) on a cycle. */
bool yaml_interpolate(YamlNode *root, Arena *a);
/* Appends n as block-style YAML that yaml_load reads back to the same tree. */
void yaml_print(Buf *b, const YamlNode *n);
/* Where an unresolved ${...} starts in scalar n's text, or NULL. */
const char *yaml_unresolved(const YamlNode *n);
bool yaml_is_null(const YamlNode *n);
/* Typed reads; `what` names the key in messages (e.g. "optimizer.lr"). */
bool yaml_double(const YamlNode *n, const char *what, double *out);
bool yaml_int(const YamlNode *n, const char *what, long *out);
/* An integer in [lo, hi]; one outside (a long or not) is an error at n that
 * names the range. */
bool yaml_int_in(const YamlNode *n, const char *what, long lo, long hi, long *out);
bool yaml_bool(const YamlNode *n, const char *what, bool *out);
bool yaml_string(const YamlNode *n, const char *what, const char **out);

/* ---- builtins.c (generated): the bundled configs in recipes/configs, by
 * torchtune's --config name ------------------------------------------------- */
typedef struct {
  const char *name; /* llama4/scout_17B_16E_full */
  const char *path; /* recipes/configs/NAME.yaml, for messages */
  const char *text;
} BuiltinConfig;
extern const BuiltinConfig builtin_configs[];
extern const int num_builtin_configs;

/* ---- frontend.c: recipes ------------------------------------------------- */
typedef struct {
  bool model, loss, optimizer_step, scale_grads;
} CompileFlags;

/* What a NaN or infinite grad does: SKIP the step (optc's default in a
 * recipe), fail with ERROR, or PROPAGATE as torch does (the step runs). */
typedef enum { NONFINITE_SKIP, NONFINITE_ERROR, NONFINITE_PROPAGATE } NonfiniteMode;

/* The torch CPU build whose bits a step reproduces: which kernels torch
 * dispatches to (ATen's CPU capability) and which sqrt its MKL computes.
 * `torch_cpu: auto` (the default) is what torch and MKL pick on this
 * machine: avx512 on an Intel CPU with AVX-512 F/BW/VL/DQ, else avx2. */
typedef enum { TORCH_CPU_AVX512, TORCH_CPU_AVX2 } TorchCpu;
TorchCpu torch_cpu_host(void);
const char *torch_cpu_name(TorchCpu c);

/* The Llama 4 text decoder's dimensions, with torchtune's builder names. */
typedef struct {
  const char *component;
  long vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, head_dim;
  long hidden_dim;        /* each routed expert's SwiGLU width */
  long shared_hidden_dim; /* the shared expert's width */
  long num_experts, experts_per_token;
  bool use_shared_expert, use_qk_norm;
  long skip_rope_interval; /* every Nth layer has no RoPE (NoPE) */
  long moe_every_n_layers; /* MoE in layers i with (i + 1) % n == 0; the rest dense SwiGLU */
  long mlp_hidden_dim;     /* the dense layers' width (Maverick) */
  bool use_scaled_rope;    /* Scout's llama3-style scaled RoPE; Maverick's is plain */
  long attention_chunk_size, max_seq_len;
  double rope_base, rope_scale_factor, rope_low_freq_factor, rope_high_freq_factor;
  long rope_old_context_len;
  double norm_eps;
  bool tie_word_embeddings;
} ModelConfig;

/* The recipe's value for one input or option of the optimizer body. */
typedef struct {
  const char *name;
  double value;
} Binding;

typedef struct {
  const char *path;
  SrcFile src;
  /* the key=value / ~key overrides it was loaded with (src + these is the
   * recipe: what optc_step_from_recipe takes to build the same step) */
  const char **overrides;
  int noverrides;
  Arena *arena;
  YamlNode *root;
  /* root without the config's own variables (keys only other values refer
   * to, such as model_dir): what it configures, all references resolved */
  YamlNode *config;
  /* optimizer */
  const char *component;      /* as written, e.g. torch.optim.AdamW */
  const char *optimizer_name; /* built-in body name, e.g. adamw, or a path */
  const SrcFile *optimizer_src;
  YamlNode *optimizer;
  Graph *body; /* the parsed optimizer body */
  Binding *bindings;
  int nbindings, capbindings;
  /* precision: buffer element types */
  Type param_dtype, grad_dtype, state_dtype;
  bool master_weights, stochastic_rounding;
  /* the step around the optimizer */
  bool has_clip;
  double clip_grad_norm;
  bool clip_norm_given;  /* optc key: the total norm is the input grad_norm_given; no reduction */
  bool measure_only;     /* optc.grad_norm: the scaled grads' sum of squares, nothing stored */
  long batch_size, gradient_accumulation_steps, epochs, max_steps_per_epoch, max_steps;
  long seed;
  bool has_seed;
  bool shuffle, fsdp_cpu_offload;
  bool write_back_grads; /* optc key: keep scaled/clipped grads in memory */
  bool fused;            /* optimizer.fused: torch's fused=True kernel's bits, else its for-loop's */
  TorchCpu torch_cpu;    /* optc key torch_cpu */
  CompileFlags compile;
  NonfiniteMode nonfinite;
  bool has_model;
  ModelConfig model;
  /* torchtune keys this recipe has that do not change what optc computes
   * (tensor_parallel_dim, profiler, ...): commands list them once */
  const char **unused_keys;
  int nunused;
} Recipe;

/* Prints the recipe's unused torchtune keys in one line, if any. */
void recipe_note_unused(const Recipe *r);
/* The bundled config a name like llama4/scout_17B_16E_full names (as
 * torchtune's --config does), or NULL. */
const BuiltinConfig *recipe_bundled(const char *name);
/* Whether CONFIG names a recipe: a .yaml/.yml file or a bundled config. */
bool recipe_is_config(const char *config);

/* Reads a recipe and applies `key.sub=value` overrides (and torchtune's
 * `~key`). A path that is no file but a bundled config's name loads that
 * config. The recipe and all it points to live in arena a. NULL (error
 * printed) on any mistake. */
Recipe *recipe_load(const char *path, const char *const *overrides, int noverrides, Arena *a);
/* The same from text in memory; `name` is used in messages. */
Recipe *recipe_from_text(const char *name, const char *text, const char *const *overrides, int noverrides,
                         Arena *a);
/* Builds the step graph a recipe implies, options resolved. */
Graph *frontend_build(Recipe *r);
/* Reads an .optir file (or a built-in by name) into arena a. */
Graph *optir_load(const char *path, Arena *a);
/* A copy of g with each option bound (by name in b, else its default) and
 * folded away, and what the choices switch off dropped. */
Graph *optir_specialize(const Graph *g, const Binding *b, int n, Arena *a);

/* ---- builtins.c (generated): the optimizer bodies in recipes/optimizers --- */
typedef struct {
  const char *name; /* adamw, adam, ... */
  const char *path; /* recipes/optimizers/NAME.optir, for messages */
  const char *text;
} BuiltinOptimizer;
extern const BuiltinOptimizer builtin_optimizers[];
extern const int num_builtin_optimizers;
