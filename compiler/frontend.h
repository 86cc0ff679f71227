/* frontend.h: torchtune-shaped recipes (YAML, through libyaml) and the step
 * graph they imply: scale_grads -> clip_grad_norm -> the optimizer body. */
#pragma once
#include "ir.h"
#include "yamltree.h"

/* ---- frontend.c: recipes ------------------------------------------------- */
/* What a NaN or infinite grad does: SKIP the step (optc's default in a
 * recipe), fail with ERROR, or PROPAGATE as torch does (the step runs). */
typedef enum { NONFINITE_SKIP, NONFINITE_ERROR, NONFINITE_PROPAGATE } NonfiniteMode;

/* The torch CPU build whose bits a step reproduces: which kernels torch
 * dispatches to (ATen's CPU capability) and which sqrt its MKL computes.
 * `torch_cpu: auto` (the default) is what torch and MKL pick on this
 * machine: avx512 on an Intel CPU with AVX-512 F/BW/VL/DQ, else avx2. */
/* Which torch build's CPU bits a step gives: its f32 sqrt is MKL's, and MKL
 * picks that by the CPU (numerics_mkl.h): AVX512 on Intel's AVX-512 CPUs,
 * AVX2 (IEEE's sqrt) on Intel's others, AMD on CPUs MKL does not take for
 * Intel's (its generic kernel, from the CPU's own RSQRTPS). */
typedef enum { TORCH_CPU_AVX512, TORCH_CPU_AVX2, TORCH_CPU_AMD } TorchCpu;
TorchCpu torch_cpu_host(void);
const char *torch_cpu_name(TorchCpu c);

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
  /* optimizer_state_dtype int8 or int4: the states quantized block-wise
   * (codes of this many bits, an f32 scale per block_size elements;
   * state_dtype is then unused); 0: plain states of state_dtype */
  int state_bits;
  int block_size;
  bool master_weights, stochastic_rounding;
  bool kahan; /* compensation: kahan: a 16-bit param's rounding error kept in a state of its dtype */
  /* the step around the optimizer */
  bool has_clip;
  double clip_grad_norm;
  bool clip_norm_given;  /* optc key: the total norm is the input grad_norm_given; no reduction */
  bool measure_only;     /* optc.grad_norm: the scaled grads' sum of squares, nothing stored */
  long seed;             /* the run's seed: stochastic rounding's stream (the training runtime's too) */
  bool has_seed;
  bool write_back_grads; /* optc key: keep scaled/clipped grads in memory */
  bool fused;            /* optimizer.fused: torch's fused=True kernel's bits, else its for-loop's */
  TorchCpu torch_cpu;    /* optc key torch_cpu */
  NonfiniteMode nonfinite;
  /* torchtune keys this recipe has that do not change what optc computes
   * (tensor_parallel_dim, profiler, ...): commands list them once */
  const char **unused_keys;
  int nunused;
} Recipe;

/* Prints the recipe's unused torchtune keys in one line, if any. */
void recipe_note_unused(const Recipe *r);
/* Whether path names a recipe file (.yaml, .yml) rather than an .optir. */
bool recipe_is_yaml(const char *path);

/* Reads a recipe file and applies `key.sub=value` overrides (and
 * torchtune's `~key`). The recipe and all it points to live in arena a.
 * NULL (error printed) on any mistake. */
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
