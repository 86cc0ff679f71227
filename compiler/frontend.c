/* frontend.c: a torchtune-shaped recipe -> the step graph it implies.
 *
 * The graph is built in three stages, as torchtune runs them:
 *   1. scale_grads:    g <- g * (world_size / num_tokens)
 *   2. clip_grad_norm: g <- g * min(1, max_norm / (sqrt(sum g^2) + 1e-6))
 *   3. the optimizer body, from recipes/optimizers/NAME.optir
 * The body is written in f32; the recipe's dtypes retype its buffers, with a
 * conversion after each load and before each store. A quantized state
 * (optimizer_state_dtype int8 or int4) is read through its code book and
 * block scale and written back quantized instead (quant_load, quant_store). */
#include "frontend.h"
#include "passes.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/* ---- built-in optimizers --------------------------------------------------- */

typedef struct {
  const char *component; /* the _component_ a recipe names */
  const char *body;      /* recipes/optimizers/BODY.optir */
} Component;

static const Component components[] = {
    {"torch.optim.AdamW", "adamw"},     {"torch.optim.Adam", "adam"},
    {"torch.optim.SGD", "sgd"},         {"torch.optim.Adagrad", "adagrad"},
    {"torch.optim.RMSprop", "rmsprop"}, {"optc.Lion", "lion"}, {"optc.grad_norm", "grad_norm"},
    {"torchao.optim.AdamW8bit", "adamw_lowbit"}, {"torchao.optim.AdamW4bit", "adamw_lowbit"},
    {"optc.torch.AdamW8bit", "adamw_lowbit"},    {"optc.torch.AdamW4bit", "adamw_lowbit"},
};

/* The bodies whose states may be quantized, and what their components
 * quantize by default: torchao's AdamW8bit 8 bits in blocks of 256, its
 * AdamW4bit 4 bits in blocks of 128. */
static bool is_lowbit(const char *body) { return strcmp(body, "adamw_lowbit") == 0; }
static int lowbit_default_bits(const char *component) { return ends_with(component, "4bit") ? 4 : 8; }

/* Keys torch accepts that choose an implementation, not the math. optc
 * always runs its own fused kernel, so they are checked and set aside. */
static const char *const impl_keys[] = {"foreach", "fused", "capturable", "differentiable"};

/* The bodies' own knobs for torch's rounding on the CPU, set from the recipe's
 * torch_cpu and dtypes (bind_torch_cpu) or at run time (torch_threads): not
 * optimizer keys. */
static const char *const torch_cpu_knobs[] = {"mkl_sqrt", "mkl_sqrt_ex", "lowp", "lowp_state", "fused_vec", "torch_vec",
                                              "torch_threads"};

static bool is_torch_cpu_knob(const char *name) {
  for (size_t k = 0; k < ARRAY_LEN(torch_cpu_knobs); k++)
    if (strcmp(torch_cpu_knobs[k], name) == 0)
      return true;
  return false;
}

TorchCpu torch_cpu_host(void) {
  /* What differs is MKL's f32 sqrt, and MKL picks its kernels by the CPU's
   * vendor as well as its features: its AVX-512 path (ATen's AVX512
   * capability needs F, BW, VL and DQ too) on Intel's CPUs, its generic
   * kernel on every CPU that is not Intel's, whatever its features (an AMD
   * EPYC with AVX-512 runs it). This is a guess made without torch;
   * optc.torch and the tests ask torch itself (optc.torch.torch_cpu). */
  __builtin_cpu_init();
  if (!__builtin_cpu_is("intel"))
    return TORCH_CPU_AMD;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return TORCH_CPU_AVX512;
  return TORCH_CPU_AVX2;
}

const char *torch_cpu_name(TorchCpu c) {
  return c == TORCH_CPU_AVX512 ? "avx512" : c == TORCH_CPU_AMD ? "amd" : "avx2";
}

static const BuiltinOptimizer *find_builtin(const char *name) {
  for (int i = 0; i < num_builtin_optimizers; i++)
    if (strcmp(builtin_optimizers[i].name, name) == 0)
      return &builtin_optimizers[i];
  return NULL;
}

/* Loads an .optir body: a built-in by name, or a file by path. */
static Graph *load_body(const char *name, Arena *a) {
  SrcFile *src = arena_alloc(a, sizeof(SrcFile));
  const BuiltinOptimizer *b = find_builtin(name);
  if (b) {
    src->name = b->path;
    src->text = b->text;
    src->len = strlen(b->text);
  } else {
    size_t len;
    char *text = file_read(name, &len);
    if (!text)
      return NULL;
    src->name = arena_strdup(a, name);
    src->text = arena_strndup(a, text, len);
    src->len = len;
    free(text);
  }
  Graph *g = ir_parse(src, a);
  if (!g || !ir_verify(g))
    return NULL;
  return g;
}

Graph *optir_load(const char *path, Arena *a) { return load_body(path, a); }

/* ---- recipe schema ----------------------------------------------------------- */

/* Every top-level key a recipe may have: torchtune's full_finetune_distributed
 * keys, and optc's own (marked). Sections read by the training runtime are
 * type-checked here and read in full there. */
static const KeySpec top_keys[] = {
    {"output_dir", K_STR}, {"tokenizer", K_MAP}, {"dataset", K_MAP_OR_SEQ}, {"seed", K_INT_OR_NULL},
    {"shuffle", K_BOOL}, {"model", K_MAP}, {"checkpointer", K_MAP},
    {"resume_from_checkpoint", K_BOOL}, {"batch_size", K_INT}, {"epochs", K_INT},
    {"optimizer", K_MAP}, {"lr_scheduler", K_MAP_OR_NULL}, {"loss", K_MAP},
    {"max_steps_per_epoch", K_INT_OR_NULL}, {"gradient_accumulation_steps", K_INT},
    {"clip_grad_norm", K_NUM_OR_NULL}, {"fsdp_cpu_offload", K_BOOL}, {"compile", K_BOOL_OR_MAP},
    {"dtype", K_STR}, {"metric_logger", K_MAP}, {"log_every_n_steps", K_INT},
    {"run_val_every_n_steps", K_INT_OR_NULL}, {"save_every_n_steps", K_INT_OR_NULL},
    {"collate_fn", K_STR}, {"fsdp_reshard_after_forward", K_BOOL}, {"optimizer_in_bwd", K_BOOL},
    {"enable_activation_checkpointing", K_BOOL},
    /* optc */
    {"optimizer_state_dtype", K_STR}, {"master_weights", K_BOOL}, {"stochastic_rounding", K_BOOL},
    {"nonfinite_grads", K_STR}, {"max_steps", K_INT_OR_NULL}, {"write_back_grads", K_BOOL},
    {"torch_cpu", K_STR}, {"clip_norm_given", K_BOOL}, {"fsdp_overlap", K_ANY}, {"compensation", K_STR},
    /* torchtune's, accepted but not used by optc: where the work runs, how it
     * is split across devices, what is logged or profiled, and validation,
     * none of which changes the trained weights */
    {"device", K_STR},
    {"enable_activation_offloading", K_BOOL}, {"activation_offloading_use_streams", K_BOOL},
    {"log_peak_memory_stats", K_BOOL}, {"log_level", K_ANY},
    {"profiler", K_MAP_OR_NULL}, {"tensor_parallel_dim", K_INT}, {"tensor_parallel_plan", K_MAP_OR_NULL},
    {"data_parallel_shard_dim", K_INT}, {"data_parallel_replicate_dim", K_INT},
    {"context_parallel_dim", K_INT}, {"custom_sharded_layers", K_ANY}, {"cudnn_deterministic_mode", K_BOOL},
    {"dataset_val", K_ANY}, {"batch_size_val", K_ANY}, {"ac_mode", K_ANY}, {"ac_option", K_ANY},
    {"enable_async_checkpointing", K_BOOL}, {"profile_memory", K_BOOL}, {"memory_efficient_fsdp_wrap", K_BOOL},
    {"low_cpu_ram", K_BOOL}, {"enable_fp8_training", K_BOOL}, {"fp8_recipe_name", K_ANY},
    {"resize_token_embeddings", K_BOOL},
};
/* where the keys that optc does not use begin in top_keys */
static const char *const first_unused_key = "device";

/* torchtune's keys for features optc lacks, whose value would change what is
 * computed: refused, naming the feature. `if_true` ones only when set. */
static const struct {
  const char *key, *feature;
  bool if_true;
} refused_keys[] = {
    {"save_adapter_weights_only", "LoRA (optc does full finetuning only)", false},
    {"quantizer", "quantization-aware training (QAT)", false},
    {"teacher_model", "knowledge distillation", false},
    {"kd_loss", "knowledge distillation", false},
    {"ref_checkpointer", "preference training (DPO/PPO)", false},
    {"resize_token_embeddings", "resizing the token embeddings to the tokenizer", true},
    {"enable_fp8_training", "fp8 training", true},
};

static int key_index(const KeySpec *keys, int n, const char *key) {
  for (int i = 0; i < n; i++)
    if (strcmp(keys[i].key, key) == 0)
      return i;
  return -1;
}

static bool refused_feature(const char *key) {
  for (size_t k = 0; k < ARRAY_LEN(refused_keys); k++)
    if (strcmp(refused_keys[k].key, key) == 0)
      return true;
  return false;
}

static bool refuse_features(const YamlNode *root) {
  for (size_t k = 0; k < ARRAY_LEN(refused_keys); k++) {
    int i = yaml_index(root, refused_keys[k].key);
    if (i < 0)
      continue;
    bool on = true;
    if (refused_keys[k].if_true && (yaml_is_null(root->items[i]) || !yaml_bool(root->items[i], refused_keys[k].key, &on)))
      on = false;
    if (on) {
      error_at(root->key_pos[i], "%s: optc does not support %s", refused_keys[k].key, refused_keys[k].feature);
      return false;
    }
  }
  const YamlNode *c = yaml_get(root, "collate_fn");
  if (c && c->kind == YAML_SCALAR && strcmp(c->str, "torchtune.data.padded_collate_sft") != 0) {
    error_at(c->pos, "collate_fn: optc batches as torchtune.data.padded_collate_sft does; '%s' is not supported",
             c->str);
    return false;
  }
  return true;
}

/* Whether some value in n refers to top-level key `key` (${key} or ${key.x}):
 * then key is the config's own variable, as torchtune's configs use them. */
static bool is_referenced(const YamlNode *n, const char *key) {
  if (n->kind == YAML_SEQ || n->kind == YAML_MAP) {
    for (int i = 0; i < n->n; i++)
      if (is_referenced(n->items[i], key))
        return true;
    return false;
  }
  size_t k = strlen(key);
  for (const char *p = n->kind == YAML_SCALAR ? strstr(n->str, "${") : NULL; p; p = strstr(p + 2, "${"))
    if (strncmp(p + 2, key, k) == 0 && (p[2 + k] == '}' || p[2 + k] == '.'))
      return true;
  return false;
}

static bool is_top_key(const char *key) { return key_index(top_keys, ARRAY_LEN(top_keys), key) >= 0; }

/* The root without the keys other values refer to, for the key check. */
static YamlNode *without_variables(const YamlNode *root, Arena *a) {
  YamlNode *m = arena_alloc(a, sizeof(YamlNode));
  *m = *root;
  m->n = 0;
  m->items = arena_alloc(a, sizeof(YamlNode *) * (size_t)(root->n + 1));
  m->keys = arena_alloc(a, sizeof(char *) * (size_t)(root->n + 1));
  m->key_pos = arena_alloc(a, sizeof(SrcPos) * (size_t)(root->n + 1));
  for (int i = 0; i < root->n; i++)
    if (is_top_key(root->keys[i]) || !is_referenced(root, root->keys[i])) {
      m->items[m->n] = root->items[i];
      m->keys[m->n] = root->keys[i];
      m->key_pos[m->n++] = root->key_pos[i];
    }
  return m;
}

static void note_unused_keys(Recipe *r) {
  int first = key_index(top_keys, ARRAY_LEN(top_keys), first_unused_key);
  r->unused_keys = arena_alloc(r->arena, sizeof(char *) * (size_t)(r->root->n + 1));
  for (int i = 0; i < r->root->n; i++)
    if (key_index(top_keys, ARRAY_LEN(top_keys), r->root->keys[i]) >= first)
      r->unused_keys[r->nunused++] = r->root->keys[i];
}

void recipe_note_unused(const Recipe *r) {
  if (!r->nunused)
    return;
  Buf b = {0};
  for (int i = 0; i < r->nunused; i++)
    buf_printf(&b, "%s%s", i ? ", " : "", r->unused_keys[i]);
  diag_printf("optc: note: %s: not used by optc: %s\n", r->path, b.data);
  buf_free(&b);
}

static bool parse_dtype(const YamlNode *n, const char *what, Type *out) {
  const char *s;
  if (!yaml_string(n, what, &s))
    return false;
  static const struct { const char *name; Type t; } names[] = {
      {"fp32", TY_F32}, {"float32", TY_F32}, {"f32", TY_F32},
      {"bf16", TY_BF16}, {"bfloat16", TY_BF16},
      {"fp16", TY_F16}, {"float16", TY_F16}, {"f16", TY_F16},
  };
  for (size_t i = 0; i < ARRAY_LEN(names); i++)
    if (strcmp(names[i].name, s) == 0)
      return *out = names[i].t, true;
  error_at(n->pos, "%s: unknown dtype '%s'; expected fp32, bf16 or fp16", what, s);
  return false;
}

/* ---- the optimizer section --------------------------------------------------- */

static void bind(Recipe *r, const char *name, double v) {
  for (int i = 0; i < r->nbindings; i++)
    if (strcmp(r->bindings[i].name, name) == 0) {
      r->bindings[i].value = v;
      return;
    }
  arena_grow(r->arena, (void **)&r->bindings, &r->capbindings, r->nbindings + 1, sizeof(Binding));
  r->bindings[r->nbindings++] = (Binding){name, v};
}

static const Binding *find_binding(const Recipe *r, const char *name) {
  for (int i = 0; i < r->nbindings; i++)
    if (strcmp(r->bindings[i].name, name) == 0)
      return &r->bindings[i];
  return NULL;
}

static bool in_range(const Range *rg, double v) {
  if (!rg->set)
    return !isnan(v);
  return (rg->lo_open ? v > rg->lo : v >= rg->lo) && (rg->hi_open ? v < rg->hi : v <= rg->hi);
}

static void format_range(char *out, size_t n, const Range *rg) {
  char lo[40], hi[40];
  fmt_double(lo, rg->lo, false);
  fmt_double(hi, rg->hi, false);
  snprintf(out, n, "%c%s, %s%c", rg->lo_open ? '(' : '[', lo, hi, rg->hi_open ? ')' : ']');
}

/* Reads one numeric hyperparameter into the input of the same name. */
static bool bind_number(Recipe *r, const Ins *in, const YamlNode *v, const char *what) {
  double d;
  if (!yaml_double(v, what, &d))
    return false;
  if (!in_range(&in->range, d)) {
    char rg[96];
    format_range(rg, sizeof rg, &in->range);
    error_at(v->pos, "%s: %s is out of range %s for %s", what, v->str, rg, r->component);
    return false;
  }
  bind(r, in->name, d);
  return true;
}

static bool parse_optimizer(Recipe *r, YamlNode *n) {
  const YamlNode *comp = yaml_get(n, "_component_");
  if (!comp) {
    error_at(n->pos, "optimizer: missing _component_ (e.g. torch.optim.AdamW)");
    return false;
  }
  if (!yaml_string(comp, "optimizer._component_", &r->component))
    return false;
  const char *body = NULL;
  for (size_t i = 0; i < ARRAY_LEN(components); i++)
    if (strcmp(components[i].component, r->component) == 0)
      body = components[i].body;
  if (!body && ends_with(r->component, ".optir"))
    body = r->component;
  if (!body) {
    Buf list = {0};
    for (size_t i = 0; i < ARRAY_LEN(components); i++)
      buf_printf(&list, "%s%s", i ? ", " : "", components[i].component);
    error_at(comp->pos, "optimizer._component_: unknown optimizer '%s'; expected one of: %s, or a path to an .optir file",
             r->component, list.data);
    buf_free(&list);
    return false;
  }
  /* Adam with decoupled weight decay is AdamW, as in torch. */
  const YamlNode *dwd = yaml_get(n, "decoupled_weight_decay");
  bool decoupled = false;
  if (dwd && !yaml_bool(dwd, "optimizer.decoupled_weight_decay", &decoupled))
    return false;
  if (dwd && strcmp(body, "adam") != 0) {
    error_at(dwd->pos, "optimizer.decoupled_weight_decay applies to torch.optim.Adam only");
    return false;
  }
  if (decoupled)
    body = "adamw";
  /* foreach and fused choose torch's implementation. foreach gives the
   * for-loop's bits; fused selects the fused kernel's own body. */
  bool impl_on[2] = {false, false};
  for (int k = 0; k < 2; k++) {
    const char *key = k ? "fused" : "foreach";
    const YamlNode *v = yaml_get(n, key);
    char what[64];
    snprintf(what, sizeof what, "optimizer.%s", key);
    if (v && !yaml_is_null(v) && !yaml_bool(v, what, &impl_on[k]))
      return false;
  }
  if (impl_on[0] && impl_on[1]) {
    error_at(yaml_get(n, "fused")->pos, "optimizer.fused: `fused` and `foreach` cannot be `True` together (as in torch)");
    return false;
  }
  r->fused = impl_on[1];
  if (r->fused) {
    const char *fb = arena_printf(r->arena, "%s_fused", body);
    if (!find_builtin(fb)) {
      error_at(yaml_get(n, "fused")->pos, "optimizer.fused: %s has no fused CPU kernel in torch", r->component);
      return false;
    }
    body = fb;
  }
  r->optimizer_name = body;
  Graph *g = load_body(body, r->arena);
  if (!g)
    return false;
  if (decoupled) /* keep Adam's default of no weight decay */
    bind(r, "weight_decay", 0.0);
  r->optimizer_src = g->src;
  r->body = g;
  r->optimizer = n;
  for (int i = 0; i < n->n; i++) {
    const char *key = n->keys[i];
    const YamlNode *v = n->items[i];
    char what[128];
    snprintf(what, sizeof what, "optimizer.%s", key);
    if (strcmp(key, "_component_") == 0 || strcmp(key, "decoupled_weight_decay") == 0)
      continue;
    bool impl = false;
    for (size_t k = 0; k < ARRAY_LEN(impl_keys); k++)
      impl |= strcmp(impl_keys[k], key) == 0;
    if (impl) {
      bool dummy;
      if (!yaml_is_null(v) && !yaml_bool(v, what, &dummy))
        return false;
      continue;
    }
    if (is_lowbit(body) && strcmp(key, "block_size") == 0) {
      /* torchao's block_size: a power of two that divides OPTC_REDUCE_BLOCK */
      long bs;
      if (!yaml_int_in(v, what, 16, 4096, &bs))
        return false;
      if (bs & (bs - 1)) {
        error_at(v->pos, "%s: %ld is not a power of two; optc's blocks are 16, 32, ... 4096 elements", what, bs);
        return false;
      }
      r->block_size = (int)bs;
      continue;
    }
    if (is_lowbit(body) && strcmp(key, "bf16_stochastic_round") == 0) {
      /* torchao rounds bf16 params stochastically with torch's RNG; optc
       * with its own stream, keyed on the recipe's seed */
      bool on;
      if (!yaml_bool(v, what, &on))
        return false;
      r->stochastic_rounding |= on && r->param_dtype == TY_BF16;
      continue;
    }
    Ref in = graph_find_input(g, key);
    if (strcmp(key, "betas") == 0 && graph_find_input(g, "beta1") != NOREF) {
      if (v->kind != YAML_SEQ || v->n != 2) {
        error_at(v->pos, "%s: expected a list of two numbers, like [0.9, 0.999]", what);
        return false;
      }
      for (int k = 0; k < 2; k++) {
        char w[140];
        snprintf(w, sizeof w, "%s[%d]", what, k);
        if (!bind_number(r, &g->ins[graph_find_input(g, k ? "beta2" : "beta1")], v->items[k], w))
          return false;
      }
      continue;
    }
    if (in != NOREF && strcmp(key, "step") != 0 && !is_torch_cpu_knob(key)) {
      const Ins *x = &g->ins[in];
      if (x->op == OP_INPUT) {
        if (!bind_number(r, x, v, what))
          return false;
        continue;
      }
      if (x->op == OP_OPTION && x->dep == NOREF) {
        bool on;
        if (!yaml_bool(v, what, &on))
          return false;
        bind(r, x->name, on);
        continue;
      }
    }
    /* Unknown: list what this optimizer takes. */
    Buf list = {0};
    bool has_betas = graph_find_input(g, "beta1") != NOREF && graph_find_input(g, "beta2") != NOREF;
    for (int k = 0; k < g->nins; k++) {
      const Ins *x = &g->ins[k];
      if ((x->op == OP_INPUT || (x->op == OP_OPTION && x->dep == NOREF)) && strcmp(x->name, "step") &&
          !is_torch_cpu_knob(x->name) && !(has_betas && (!strcmp(x->name, "beta1") || !strcmp(x->name, "beta2"))))
        buf_printf(&list, "%s, ", x->name);
      if (has_betas && x->op == OP_INPUT && !strcmp(x->name, "beta1"))
        buf_puts(&list, "betas, ");
    }
    if (is_lowbit(body))
      buf_puts(&list, "block_size, bf16_stochastic_round, ");
    for (size_t k = 0; k < ARRAY_LEN(impl_keys); k++)
      buf_printf(&list, "%s%s", impl_keys[k], k + 1 < ARRAY_LEN(impl_keys) ? ", " : "");
    error_at(n->key_pos[i], "unknown key '%s' for %s; expected one of: %s", what, r->component, list.data);
    buf_free(&list);
    return false;
  }
  /* quantized states: torchao's AdamW8bit and AdamW4bit quantize unless
   * the recipe gives a float optimizer_state_dtype (torchao's plain states,
   * of a tensor it does not quantize); no other body quantizes */
  const YamlNode *sd = yaml_get(r->root, "optimizer_state_dtype");
  if (is_lowbit(body)) {
    if (!sd)
      r->state_bits = lowbit_default_bits(r->component);
    if (!r->block_size)
      r->block_size = (r->state_bits ? r->state_bits : lowbit_default_bits(r->component)) == 4 ? 128 : 256;
  } else if (r->state_bits) {
    error_at(sd->pos, "optimizer_state_dtype: int%d states are torchao's AdamW8bit and AdamW4bit (their arithmetic, "
             "their code books); set optimizer._component_: torchao.optim.AdamW%dbit", r->state_bits, r->state_bits);
    return false;
  }
  /* torch.optim.SGD: "Nesterov momentum requires a momentum and zero dampening". */
  if (strcmp(body, "sgd") == 0 || strcmp(body, "sgd_fused") == 0) {
    const YamlNode *nv = yaml_get(n, "nesterov");
    const Binding *bn = find_binding(r, "nesterov"), *bm = find_binding(r, "momentum"),
                  *bd = find_binding(r, "dampening");
    bool nesterov = bn && bn->value != 0;
    double momentum = bm ? bm->value : 0, dampening = bd ? bd->value : 0;
    if (nesterov && (momentum <= 0 || dampening != 0)) {
      error_at(nv->pos, "optimizer.nesterov: Nesterov momentum requires a momentum and zero dampening");
      return false;
    }
  }
  return true;
}

/* ---- overrides: key.sub=value ------------------------------------------------ */

static bool has_component(const YamlNode *n) { return n && n->kind == YAML_MAP && yaml_get(n, "_component_"); }

/* ~a.b.c removes a key, as torchtune's command line does: not a component, and
 * a section left empty goes with it. */
static bool remove_path(YamlNode *map, char *path, SrcPos pos, const char *whole) {
  char *dot = strchr(path, '.');
  if (dot)
    *dot = 0;
  YamlNode *v = yaml_get(map, path);
  if (!v || (dot && v->kind != YAML_MAP)) {
    error_at(pos, "cannot remove '%s': the config has no such key", whole);
    return false;
  }
  if (dot) {
    if (!remove_path(v, dot + 1, pos, whole))
      return false;
    if (v->n > 0)
      return true;
  }
  if (has_component(v) || strcmp(path, "_component_") == 0) {
    error_at(pos, "cannot remove '%s': removing a component from the command line is not supported", whole);
    return false;
  }
  yaml_remove(map, path);
  return true;
}

static bool apply_override(Recipe *r, const char *ov) {
  SrcFile *src = arena_alloc(r->arena, sizeof(SrcFile));
  src->name = "<command line>";
  src->text = arena_strdup(r->arena, ov);
  src->len = strlen(ov);
  if (ov[0] == '~') {
    char *path = arena_strdup(r->arena, ov + 1);
    *strchrnul(path, '=') = 0;
    if (!*path) {
      error_at((SrcPos){src, 1, 1}, "override '%s' names no key to remove", ov);
      return false;
    }
    const char *whole = arena_strdup(r->arena, path);
    return remove_path(r->root, path, (SrcPos){src, 1, 2}, whole);
  }
  const char *eq = strchr(ov, '=');
  /* as torchtune's: optimizer=torch.optim.SGD names the section's component
   * (lr_scheduler=null still drops the section) */
  if (eq && !memchr(ov, '.', (size_t)(eq - ov)) && strcmp(eq + 1, "null") != 0 && strcmp(eq + 1, "None") != 0) {
    char *k = arena_strndup(r->arena, ov, (size_t)(eq - ov));
    if (has_component(yaml_get(r->root, k)))
      ov = arena_printf(r->arena, "%s._component_%s", k, eq), eq = strchr(ov, '=');
  }
  if (!eq || eq == ov) {
    error_at((SrcPos){src, 1, 1}, "override '%s' is not key=value", ov);
    return false;
  }
  SrcPos vpos = {src, 1, (int)(eq - ov) + 2};
  char *path = arena_strndup(r->arena, ov, (size_t)(eq - ov));
  YamlNode *map = r->root;
  char *save = NULL;
  int col = 1;
  for (char *part = strtok_r(path, ".", &save); part; part = strtok_r(NULL, ".", &save)) {
    char *rest = strtok_r(NULL, "", &save);
    if (!rest) {
      /* The value is read as YAML, so that lists and quoted strings work. */
      SrcFile *vs = arena_alloc(r->arena, sizeof(SrcFile));
      vs->name = "<command line>";
      vs->text = arena_strdup(r->arena, eq + 1);
      vs->len = strlen(eq + 1);
      YamlNode *v = vs->len ? yaml_load(vs, r->arena) : yaml_scalar(r->arena, "", true, vpos);
      if (!v)
        return false;
      if (v->kind == YAML_SCALAR && v->plain && strcmp(v->str, "None") == 0)
        v->kind = YAML_NULL; /* torchtune reads None on its command line as null */
      v->pos = vpos;
      for (int i = 0; v->kind == YAML_SEQ && i < v->n; i++)
        v->items[i]->pos = vpos;
      if (map == r->root) {
        bool known = is_top_key(part) || is_referenced(r->root, part) || refused_feature(part);
        if (!known) {
          error_at((SrcPos){src, 1, col}, "unknown override key '%s'", part);
          return false;
        }
      }
      yaml_set(map, part, v, r->arena);
      return true;
    }
    YamlNode *next = yaml_get(map, part);
    if (!next || next->kind != YAML_MAP) {
      if (map == r->root) {
        bool known = refused_feature(part) || is_referenced(r->root, part);
        for (size_t k = 0; k < ARRAY_LEN(top_keys); k++)
          known |= strcmp(top_keys[k].key, part) == 0 &&
                   (top_keys[k].kind == K_MAP || top_keys[k].kind == K_MAP_OR_NULL || top_keys[k].kind == K_ANY ||
                    top_keys[k].kind == K_BOOL_OR_MAP || top_keys[k].kind == K_MAP_OR_SEQ);
        if (!known) {
          error_at((SrcPos){src, 1, col}, "unknown override key '%s'", part);
          return false;
        }
      }
      next = arena_alloc(r->arena, sizeof(YamlNode));
      next->kind = YAML_MAP;
      next->pos = (SrcPos){src, 1, col};
      yaml_set(map, part, next, r->arena);
    }
    map = next;
    col += (int)strlen(part) + 1;
    save = rest;
  }
  return true;
}

/* ---- recipe_load ------------------------------------------------------------- */

bool recipe_is_yaml(const char *path) { return ends_with(path, ".yaml") || ends_with(path, ".yml"); }

Recipe *recipe_load(const char *path, const char *const *overrides, int noverrides, Arena *a) {
  size_t len;
  char *text = file_read(path, &len);
  if (!text)
    return NULL;
  Recipe *r = recipe_from_text(path, text, overrides, noverrides, a);
  free(text);
  return r;
}

Recipe *recipe_from_text(const char *name, const char *text, const char *const *overrides, int noverrides,
                         Arena *a) {
  Recipe *r = arena_alloc(a, sizeof(Recipe));
  r->arena = a;
  r->path = arena_strdup(a, name);
  r->src.name = r->path;
  r->src.text = arena_strdup(a, text);
  r->src.len = strlen(text);
  r->overrides = arena_alloc(a, sizeof(char *) * (size_t)(noverrides + 1));
  for (int i = 0; i < noverrides; i++)
    r->overrides[i] = arena_strdup(a, overrides[i]);
  r->noverrides = noverrides;
  r->root = yaml_load(&r->src, a);
  if (!r->root)
    return NULL;
  if (r->root->kind != YAML_MAP) {
    error_at(r->root->pos, "a recipe is a mapping of keys to values");
    return NULL;
  }
  for (int i = 0; i < noverrides; i++)
    if (!apply_override(r, overrides[i]))
      return NULL;
  YamlNode *root = r->root;
  r->config = without_variables(root, a);
  if (!yaml_interpolate(root, a) || !refuse_features(root) ||
      !yaml_check_keys(r->config, top_keys, ARRAY_LEN(top_keys), ""))
    return NULL;
  note_unused_keys(r);

  /* defaults, as torchtune's recipe has them */
  r->param_dtype = TY_BF16;
  r->nonfinite = NONFINITE_SKIP;
  YamlNode *v;
  if ((v = yaml_get(root, "dtype")) && !parse_dtype(v, "dtype", &r->param_dtype))
    return NULL;
  r->grad_dtype = r->param_dtype;
  r->state_dtype = r->param_dtype;
  if ((v = yaml_get(root, "optimizer_state_dtype"))) {
    if (v->kind == YAML_SCALAR && (strcmp(v->str, "int8") == 0 || strcmp(v->str, "int4") == 0))
      r->state_bits = v->str[3] - '0';
    else if (!parse_dtype(v, "optimizer_state_dtype", &r->state_dtype)) {
      note_at(v->pos, "or int8, int4: block-quantized states (torchao.optim.AdamW8bit, AdamW4bit)");
      return NULL;
    }
  }
  if ((v = yaml_get(root, "master_weights")))
    yaml_bool(v, "master_weights", &r->master_weights);
  if ((v = yaml_get(root, "stochastic_rounding")))
    yaml_bool(v, "stochastic_rounding", &r->stochastic_rounding);
  if ((v = yaml_get(root, "write_back_grads")))
    yaml_bool(v, "write_back_grads", &r->write_back_grads);
  /* the seed's range is torchtune's set_seed's, a uint32; stochastic
   * rounding keys its stream on it */
  if ((v = yaml_get(root, "seed")) && !yaml_is_null(v)) {
    if (!yaml_int_in(v, "seed", 0, UINT32_MAX, &r->seed))
      return NULL;
    r->has_seed = true;
  }
  if ((v = yaml_get(root, "clip_grad_norm")) && !yaml_is_null(v)) {
    if (!yaml_double(v, "clip_grad_norm", &r->clip_grad_norm))
      return NULL;
    if (!(r->clip_grad_norm > 0) || isinf(r->clip_grad_norm)) {
      error_at(v->pos, "clip_grad_norm: %s is out of range (0, inf); use null to turn clipping off", v->str);
      return NULL;
    }
    r->has_clip = true;
  }
  r->torch_cpu = torch_cpu_host();
  if ((v = yaml_get(root, "torch_cpu"))) {
    const char *c;
    if (!yaml_string(v, "torch_cpu", &c))
      return NULL;
    if (strcmp(c, "avx512") == 0)
      r->torch_cpu = TORCH_CPU_AVX512;
    else if (strcmp(c, "avx2") == 0)
      r->torch_cpu = TORCH_CPU_AVX2;
    else if (strcmp(c, "amd") == 0)
      r->torch_cpu = TORCH_CPU_AMD;
    else if (strcmp(c, "auto") != 0) {
      error_at(v->pos, "torch_cpu: expected auto, avx512, avx2 or amd, found '%s'", c);
      return NULL;
    }
  }
  if ((v = yaml_get(root, "nonfinite_grads"))) {
    if (strcmp(v->str, "skip") == 0)
      r->nonfinite = NONFINITE_SKIP;
    else if (strcmp(v->str, "error") == 0)
      r->nonfinite = NONFINITE_ERROR;
    else if (strcmp(v->str, "propagate") == 0)
      r->nonfinite = NONFINITE_PROPAGATE;
    else {
      error_at(v->pos, "nonfinite_grads: expected skip, error or propagate, found '%s'", v->str);
      return NULL;
    }
  }
  if ((v = yaml_get(root, "clip_norm_given")))
    yaml_bool(v, "clip_norm_given", &r->clip_norm_given);
  if ((v = yaml_get(root, "compensation"))) {
    if (strcmp(v->str, "kahan") == 0)
      r->kahan = true;
    else if (strcmp(v->str, "none") != 0) {
      error_at(v->pos, "compensation: expected kahan or none, found '%s'", v->str);
      return NULL;
    }
    if (r->kahan && r->param_dtype != TY_BF16 && r->param_dtype != TY_F16) {
      error_at(v->pos, "compensation: kahan keeps a 16-bit param's rounding error; dtype is %s",
               type_names[r->param_dtype]);
      return NULL;
    }
    if (r->kahan && r->master_weights) {
      error_at(v->pos, "compensation: kahan and master_weights both keep the bits a 16-bit param loses; choose one");
      return NULL;
    }
  }
  YamlNode *opt = yaml_get(root, "optimizer");
  if (!opt) {
    error_at(root->pos, "the recipe has no 'optimizer' section");
    return NULL;
  }
  if (!parse_optimizer(r, opt))
    return NULL;
  if (r->kahan && r->stochastic_rounding) {
    error_at(yaml_get(root, "compensation")->pos,
             "compensation: kahan and stochastic rounding both keep small updates; choose one");
    return NULL;
  }
  r->measure_only = strcmp(r->optimizer_name, "grad_norm") == 0;
  return r;
}

/* ---- building the step graph ------------------------------------------------- */

typedef struct {
  Recipe *r;
  Graph *g;
  int param, grad, master; /* buffer indices; master is -1 without master weights */
  int kahan;               /* compensation: kahan's state, or -1 */
  Ref seed, step_i;        /* for stochastic rounding, made on first use */
  Ref step;                /* the body's %step */
} Builder;

static Ref named(Builder *b, Ref v, const char *name, const char *lead) {
  ir_name(b->g, v, name);
  if (lead)
    b->g->ins[v].lead = arena_strdup(b->g->arena, lead);
  return v;
}

static Ref input(Builder *b, const char *name, double def, Range rg, const char *trail) {
  Ref r = ir_input(b->g, name, TY_F64);
  Ins *x = &b->g->ins[r];
  x->imm = def;
  x->has_imm = true;
  x->range = rg;
  if (trail)
    x->trail = arena_strdup(b->g->arena, trail);
  return r;
}

/* The value as a buffer of type t holds it: rounded to t and back when t is
 * narrower than f32, as torch's tensor of that dtype would hold it. */
static Ref as_held(Builder *b, Ref v, Type t, const char *name) {
  if (t == TY_F32)
    return named(b, v, name, NULL);
  if (b->g->ins[v].name && !strcmp(b->g->ins[v].name, name))
    ir_name(b->g, v, arena_printf(b->g->arena, "%s_f32", name));
  Ref n = ir_cvt(b->g, v, t);
  return named(b, ir_cvt(b->g, n, TY_F32), name, NULL);
}

/* Rounds an f32 result for a store into a buffer of type t. */
static Ref round_for(Builder *b, Ref v, Type t, bool stochastic) {
  if (t == TY_F32)
    return v;
  if (t == TY_F64)
    return ir_cvt(b->g, v, TY_F64);
  if (!stochastic)
    return ir_cvt(b->g, v, t);
  if (b->step == NOREF) {
    Range rg = {true, 1, INFINITY, false, true};
    b->step = input(b, "step", 1.0, rg, NULL);
    b->g->ins[b->step].has_imm = false;
  }
  if (b->seed == NOREF) {
    b->seed = ir_input(b->g, "seed", TY_I64);
    b->g->ins[b->seed].imm = (double)b->r->seed;
    b->g->ins[b->seed].has_imm = true;
    b->g->ins[b->seed].trail = arena_strdup(b->g->arena, "  # stochastic rounding: the run's seed");
    b->step_i = named(b, ir_cvt(b->g, b->step, TY_I64), "step_i64", NULL);
  }
  Ref args[3] = {v, b->seed, b->step_i};
  return ir_emit(b->g, OP_CVT_SR, t, 3, args);
}

/* Stages 1 and 2: the gradient the optimizer sees, in f32. */
static Ref build_prelude(Builder *b) {
  Recipe *r = b->r;
  Graph *g = b->g;
  Type gd = r->grad_dtype;
  Range pos_open = {true, 0, INFINITY, true, true};
  Range at_least_one = {true, 1, INFINITY, false, true};
  Ref nt = input(b, "num_tokens", 1.0, pos_open, "  # tokens counted in the loss, summed over ranks");
  named(b, nt, "num_tokens",
        "# scale_grads: grad *= world_size / num_tokens, as torchtune's scale_grads\n"
        "# (world_size is 1 where the reduce-scatter sums instead of averaging)\n");
  Ref ws = input(b, "world_size", 1.0, at_least_one, NULL);
  Ref raw = named(b, ir_load(g, b->grad), "grad_in", NULL);
  Ref gf = gd == TY_F32 ? raw : named(b, ir_cvt(g, raw, TY_F32), "grad_f32", NULL);
  /* torch: world_size / num_tokens, num_tokens an int64 tensor, is
   * num_tokens.reciprocal() * world_size, in float32 */
  Ref ws32 = ir_cvt(g, ws, TY_F32);
  Ref nt32 = ir_cvt(g, nt, TY_F32);
  Ref rnt = ir_op2(g, OP_DIV, named(b, ir_const(g, TY_F32, 1.0), "one_f32", NULL), nt32);
  Ref tokens_scale = ir_op2(g, OP_MUL, rnt, ws32);
  /* a scale given as such (an f32 0-dim tensor's value) replaces it */
  Ref given_scale = input(b, "grad_scale", -1.0, (Range){0}, "  # > 0: the grads' scale itself; else world_size / num_tokens");
  Ref zero = named(b, ir_const(g, TY_F64, 0.0), "zero", NULL);
  Ref scale = named(b, ir_op3(g, OP_SELECT, ir_op2(g, OP_GT, given_scale, zero), ir_cvt(g, given_scale, TY_F32),
                              tokens_scale), "scale", NULL);
  Ref gs = named(b, ir_op2(g, OP_MUL, gf, scale), "grad_scaled", NULL);
  gs = as_held(b, gs, gd, r->has_clip || r->measure_only ? "grad_scaled" : "grad");
  if (r->measure_only) {
    named(b, ir_reduce(g, RED_SUMSQ, SCOPE_STEP, gs), "grad_sumsq", NULL);
    return gs;
  }
  if (!r->has_clip)
    return gs;
  Range pos = {true, 0, INFINITY, true, true};
  Ref mn = input(b, "max_norm", r->clip_grad_norm, pos, NULL);
  named(b, mn, "max_norm",
        "\n# clip_grad_norm: total = sqrt(sum of grad^2 over every element of every tensor on every rank)\n"
        "# grad *= min(1, max_norm / (total + 1e-6)), as torch.nn.utils.clip_grad_norm_\n");
  Ref norm;
  if (r->clip_norm_given) {
    /* the caller's total norm (over several groups, or torch's own): one
     * pass, no reduction */
    norm = input(b, "grad_norm_given", 0.0, (Range){0}, "  # the total norm, computed elsewhere");
    g->ins[norm].has_imm = false;
  } else {
    Ref ss = named(b, ir_reduce(g, RED_SUMSQ, SCOPE_STEP, gs), "grad_sumsq", NULL);
    Ref total = named(b, ir_op1(g, OP_SQRT, ss), "grad_norm", NULL);
    /* A total norm computed elsewhere (torch's own, in a test) replaces
     * this one when it is given: non-negative. */
    Ref given = input(b, "grad_norm_given", -1.0, (Range){0}, "  # < 0: use the norm computed here");
    norm = named(b, ir_op3(g, OP_SELECT, ir_op2(g, OP_GE, given, zero), given, total), "total_norm", NULL);
  }
  /* torch's total_norm is a 0-dim tensor of the grads' dtype, and
   * max_norm / (total_norm + 1e-6) is (total_norm + 1e-6).reciprocal() *
   * max_norm: each op rounds to that dtype (1e-6 too, on a 16-bit tensor);
   * the python float max_norm multiplies in f32. */
  Type nd = gd == TY_F64 ? TY_F32 : gd;
  Ref tn = ir_cvt(g, norm, nd);
  Ref den = ir_op2(g, OP_ADD, tn, named(b, ir_const(g, nd, 1e-6), "clip_eps", NULL));
  Ref rec = ir_op2(g, OP_DIV, named(b, ir_const(g, nd, 1.0), "one_norm", NULL), den);
  Ref ratio32 = ir_op2(g, OP_MUL, nd == TY_F32 ? rec : ir_cvt(g, rec, TY_F32), ir_cvt(g, mn, TY_F32));
  Ref ratio = nd == TY_F32 ? ratio32 : ir_cvt(g, ratio32, nd);
  /* torch.clamp(clip_coef, max=1.0) */
  Ref coef = named(b, ir_op2(g, OP_MIN, ratio, ir_const(g, nd, 1.0)), "clip_coef", NULL);
  Ref coef32 = nd == TY_F32 ? coef : ir_cvt(g, coef, TY_F32);
  Ref gc = ir_op2(g, OP_MUL, gs, coef32);
  return as_held(b, gc, gd, "grad");
}

static const char *unique_name(Graph *g, const char *name) {
  if (!name || graph_find_value(g, name) == NOREF)
    return name;
  for (int k = 1;; k++) {
    char *s = arena_printf(g->arena, "%s.%d", name, k);
    if (graph_find_value(g, s) == NOREF)
      return s;
  }
}

/* Resolves what the options decided: a select on a constant condition
 * becomes its choice, boolean logic on constants folds, and a store of
 * a buffer's own unchanged value goes. DCE then drops the unused. */
static void resolve_options(Graph *g) {
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    Ins *a0 = x->args[0] != NOREF ? &g->ins[x->args[0]] : NULL;
    Ins *a1 = x->args[1] != NOREF ? &g->ins[x->args[1]] : NULL;
    if (x->op == OP_SELECT && a0->op == OP_CONST) {
      ir_replace_uses(g, i, x->args[a0->imm != 0 ? 1 : 2], i + 1);
    } else if (x->op == OP_NOT && a0->op == OP_CONST) {
      x->op = OP_CONST, x->imm = a0->imm == 0, x->args[0] = NOREF;
    } else if ((x->op == OP_AND || x->op == OP_OR) && a0->op == OP_CONST && a1->op == OP_CONST) {
      x->imm = x->op == OP_AND ? (a0->imm != 0 && a1->imm != 0) : (a0->imm != 0 || a1->imm != 0);
      x->op = OP_CONST, x->args[0] = x->args[1] = NOREF;
    } else if ((x->op == OP_AND || x->op == OP_OR) && (a0->op == OP_CONST || a1->op == OP_CONST)) {
      /* false and x, true or x: the constant decides; else x decides */
      const Ins *c = a0->op == OP_CONST ? a0 : a1;
      Ref other = a0->op == OP_CONST ? x->args[1] : x->args[0];
      if ((c->imm != 0) == (x->op == OP_OR)) {
        x->imm = c->imm != 0;
        x->op = OP_CONST, x->args[0] = x->args[1] = NOREF;
      } else {
        ir_replace_uses(g, i, other, i + 1);
      }
    }
  }
  bool *keep = arena_alloc(g->arena, (size_t)g->nins + 1);
  for (int i = 0; i < g->nins; i++) {
    Ins *x = &g->ins[i];
    keep[i] = !(x->op == OP_STORE && g->ins[x->args[0]].op == OP_LOAD && g->ins[x->args[0]].buf == x->buf);
  }
  graph_compact(g, keep);
}

static const Binding *find_in(const Binding *b, int n, const char *name) {
  for (int i = n - 1; i >= 0; i--)
    if (strcmp(b[i].name, name) == 0)
      return &b[i];
  return NULL;
}

/* Binds a body's options to the given choices (or their defaults), in a
 * copy, and drops what they switch off. */
Graph *optir_specialize(const Graph *src, const Binding *b, int n, Arena *a) {
  Graph *body = graph_clone(src, a);
  for (int i = 0; i < body->nins; i++) {
    Ins *x = &body->ins[i];
    if (x->op != OP_OPTION)
      continue;
    const Binding *bd = find_in(b, n, x->name);
    double v = x->imm;
    if (bd) {
      v = bd->value;
    } else if (x->dep != NOREF) {
      const Ins *dep = &body->ins[x->dep];
      const Binding *db = find_in(b, n, dep->name);
      v = (db ? db->value : dep->imm) != 0;
    }
    x->op = OP_CONST;
    x->imm = v != 0;
    x->dep = NOREF;
  }
  resolve_options(body);
  pass_dce(body);
  return body;
}

/* Stage 3: the body, copied in with its buffers retyped. */
/* A quantized state's read, as torchao's dequant_with_qmap: the code
 * book's value of each code times its block's scale. */
static Ref quant_load(Builder *b, int codes, int scale, Book book) {
  Graph *g = b->g;
  const char *name = g->bufs[codes].name;
  Ref c = named(b, ir_load(g, codes), unique_name(g, arena_printf(g->arena, "%s_codes", name)), NULL);
  Ref s = named(b, ir_load(g, scale), unique_name(g, arena_printf(g->arena, "%s_scale_in", name)), NULL);
  Ref q = named(b, ir_lookup(g, book, c), unique_name(g, arena_printf(g->arena, "%s_q", name)), NULL);
  return ir_op2(g, OP_MUL, q, s);
}

/* A quantized state's write, as torchao's scale_tensor and
 * quantize_{8,4}bit_with_qmap: each block's scale is its absmax clamped to
 * at least 1e-12 (f32), and each element the code of its value over the
 * scale (a true f32 divide). */
static void quant_store(Builder *b, int codes, int scale, Book book, Ref v) {
  Graph *g = b->g;
  const char *name = g->bufs[codes].name;
  Ref amax = named(b, ir_reduce(g, RED_ABSMAX, SCOPE_BLOCK, v), unique_name(g, arena_printf(g->arena, "%s_absmax", name)),
                   NULL);
  Ref least = graph_find_value(g, "scale_min");
  if (least == NOREF)
    least = named(b, ir_const(g, TY_F32, 1e-12), "scale_min", NULL);
  Ref sc = named(b, ir_op2(g, OP_MAX, ir_cvt(g, amax, TY_F32), least),
                 unique_name(g, arena_printf(g->arena, "%s_scale", name)), NULL);
  Ref y = named(b, ir_op2(g, OP_DIV, v, sc), unique_name(g, arena_printf(g->arena, "%s_unit", name)), NULL);
  Ref c = named(b, ir_search(g, book, y), unique_name(g, arena_printf(g->arena, "%s_code", name)), NULL);
  ir_store(g, codes, c);
  ir_store(g, scale, sc);
}

/* The code book of a quantized state, as torchao picks it: signed for the
 * first moment, unsigned for a state that is never negative. */
static Book state_book(int bits, bool nonneg) {
  return bits == 8 ? (nonneg ? BOOK_DYN8U : BOOK_DYN8S) : (nonneg ? BOOK_LIN4U : BOOK_DYN4S);
}

static bool copy_body(Builder *b, const Graph *body, Ref grad) {
  Recipe *r = b->r;
  Graph *g = b->g;
  int *bufmap = arena_alloc(g->arena, sizeof(int) * (size_t)(body->nbufs + 1));
  int *scalemap = arena_alloc(g->arena, sizeof(int) * (size_t)(body->nbufs + 1)); /* a quantized state's scales, or -1 */
  for (int i = 0; i < body->nbufs; i++) {
    const Buffer *bb = &body->bufs[i];
    scalemap[i] = -1;
    if (bb->kind == BUF_PARAM) {
      bufmap[i] = b->param;
    } else if (bb->kind == BUF_GRAD) {
      bufmap[i] = b->grad;
    } else {
      bool quant = r->state_bits && bb->type == TY_F32;
      const char *sname = arena_printf(g->arena, "%s.scale", bb->name);
      if (graph_find_buffer(g, bb->name) >= 0 || (quant && graph_find_buffer(g, sname) >= 0)) {
        error_at(bb->pos, "state '@%s' clashes with a buffer the recipe adds", bb->name);
        return false;
      }
      if (quant && (bb->init != INIT_CONST || bb->init_value != 0)) {
        error_at(bb->pos, "state '@%s' starts at a value other than zero, which optc does not quantize", bb->name);
        return false;
      }
      Type t = bb->type == TY_F32 ? r->state_dtype : (Type)bb->type;
      if (quant)
        t = r->state_bits == 8 ? TY_U8 : TY_U4;
      int k = graph_add_buffer(g, bb->name, BUF_STATE, t);
      Buffer *nb = &g->bufs[k];
      nb->init = bb->init;
      nb->init_value = bb->init_value;
      nb->init_input = bb->init_input ? arena_strdup(g->arena, bb->init_input) : NULL;
      nb->nonneg = bb->nonneg;
      nb->pos = bb->pos;
      bufmap[i] = k;
      if (quant) {
        /* codes 0 and scales 0: torchao's zeros (each code's value times 0) */
        g->block = r->block_size;
        scalemap[i] = graph_add_buffer(g, sname, BUF_STATE, TY_F32);
        g->bufs[scalemap[i]].per_block = true;
        g->bufs[scalemap[i]].pos = bb->pos;
      }
    }
  }
  Ref *map = arena_alloc(g->arena, sizeof(Ref) * (size_t)(body->nins + 1));
  b->step = graph_find_input(body, "step");
  for (int i = 0; i < body->nins; i++) {
    const Ins *x = &body->ins[i];
    Ref args[3];
    for (int k = 0; k < op_info[x->op].nargs; k++)
      args[k] = map[x->args[k]];
    Ref out = NOREF;
    Ref first = g->nins; /* the comment before the line goes on the first emitted */
    switch (x->op) {
    case OP_LOAD: {
      const Buffer *bb = &body->bufs[x->buf];
      if (bb->kind == BUF_GRAD) {
        if (bb->type != TY_F32) {
          error_at(x->pos, "an optimizer body computes in f32; declare @%s as f32", bb->name);
          return false;
        }
        map[i] = grad;
        continue;
      }
      if (scalemap[x->buf] >= 0) {
        out = quant_load(b, bufmap[x->buf], scalemap[x->buf], state_book(r->state_bits, bb->nonneg));
        break;
      }
      int nb = bb->kind == BUF_PARAM && b->master >= 0 ? b->master : bufmap[x->buf];
      out = ir_load(g, nb);
      if (bb->kind == BUF_PARAM && b->kahan >= 0) {
        /* the param as compensated: its value plus the rounding error it lost */
        ir_name(g, out, unique_name(g, "param_in"));
        Ref comp = named(b, ir_load(g, b->kahan), unique_name(g, "kahan_comp_in"), NULL);
        out = ir_op2(g, OP_ADD, ir_cvt(g, out, TY_F32), ir_cvt(g, comp, TY_F32));
        break;
      }
      if (g->bufs[nb].type != bb->type) {
        ir_name(g, out, unique_name(g, arena_printf(g->arena, "%s_in", g->bufs[nb].name)));
        out = ir_cvt(g, out, (Type)bb->type);
      }
      break;
    }
    case OP_STORE: {
      const Buffer *bb = &body->bufs[x->buf];
      Ref v = args[0];
      if (scalemap[x->buf] >= 0) {
        quant_store(b, bufmap[x->buf], scalemap[x->buf], state_book(r->state_bits, bb->nonneg), v);
      } else if (bb->kind == BUF_PARAM && b->kahan >= 0) {
        /* p = bf16(v), and the error of that rounding kept for the next
         * step (exact in f32: v less its rounding), rounded to the param's
         * dtype itself */
        Type pt = g->bufs[b->param].type;
        Ref pr = named(b, ir_cvt(g, v, pt), unique_name(g, "param_rounded"), NULL);
        ir_store(g, b->param, pr);
        Ref err = named(b, ir_op2(g, OP_SUB, v, ir_cvt(g, pr, TY_F32)), unique_name(g, "kahan_err"), NULL);
        ir_store(g, b->kahan, ir_cvt(g, err, pt));
      } else if (bb->kind == BUF_PARAM && b->master >= 0) {
        ir_store(g, b->master, v);
        v = round_for(b, v, g->bufs[b->param].type, r->stochastic_rounding);
        ir_store(g, b->param, v);
      } else {
        int nb = bufmap[x->buf];
        bool sr = bb->kind == BUF_PARAM && r->stochastic_rounding;
        ir_store(g, nb, g->bufs[nb].type == bb->type ? v : round_for(b, v, g->bufs[nb].type, sr));
      }
      g->ins[first].lead = x->lead ? arena_strdup(g->arena, x->lead) : NULL;
      g->ins[g->nins - 1].trail = x->trail ? arena_strdup(g->arena, x->trail) : NULL;
      continue;
    }
    case OP_HOLD: {
      const Buffer *bb = &body->bufs[x->buf];
      if ((bb->kind == BUF_PARAM && b->kahan >= 0) || scalemap[x->buf] >= 0) {
        /* a compensated param is held in f32 (its error is kept apart),
         * and a quantized state in f32 until it is stored */
        map[i] = args[0];
        continue;
      }
      out = ir_emit(g, OP_HOLD, (Type)x->type, 1, args);
      g->ins[out].buf = bb->kind == BUF_PARAM && b->master >= 0 ? b->master : bufmap[x->buf];
      break;
    }
    case OP_INPUT: {
      const Binding *bd = find_binding(r, x->name);
      if (graph_find_value(g, x->name) != NOREF) {
        error_at(x->pos, "input '%%%s' clashes with one the recipe adds", x->name);
        return false;
      }
      out = ir_emit(g, OP_INPUT, (Type)x->type, 0, NULL);
      Ins *y = &g->ins[out];
      y->imm = bd ? bd->value : x->imm;
      y->has_imm = bd || x->has_imm;
      y->range = x->range;
      break;
    }
    default:
      out = ir_emit(g, (Op)x->op, (Type)x->type, op_info[x->op].nargs, args);
      g->ins[out].imm = x->imm;
      g->ins[out].red = x->red;
      g->ins[out].to = x->to;
      g->ins[out].scope = x->op == OP_REDUCE ? x->to : g->ins[out].scope;
      break;
    }
    Ins *y = &g->ins[out];
    y->name = unique_name(g, x->name);
    g->ins[first].lead = x->lead ? arena_strdup(g->arena, x->lead) : NULL;
    y->trail = x->trail ? arena_strdup(g->arena, x->trail) : NULL;
    y->pos = x->pos;
    if (x->op == OP_INPUT && b->step != NOREF && i == b->step)
      b->step = out;
    map[i] = out;
  }
  return true;
}

/* What the body's torch-build inputs and options are on r->torch_cpu:
 *   mkl_sqrt        for-loop sqrt of f32 tensors: MKL's AVX-512 one
 *   mkl_sqrt_ex     ... MKL's generic one (torch_cpu amd)
 *   lowp            16-bit tensors: the scalar tails of torch's 16-bit loops
 *                   (every 32 elements on both builds: torch_vec's default)
 *   lowp_state      with lowp, whether the states are 16-bit too: torch
 *                   promotes an op between a 16-bit and an f32 tensor to f32
 *   fused_vec       a fused kernel leaves numel % fused_vec elements of each
 *                   tensor to scalar code (on both builds)
 * (tests/torch/probe_ops.py and probe_fused.py measured each, under
 * ATEN_CPU_CAPABILITY=avx512 and avx2). */
static void bind_torch_cpu(Recipe *r) {
  bool avx512 = r->torch_cpu == TORCH_CPU_AVX512;
  bool lowp = r->param_dtype == TY_BF16 || r->param_dtype == TY_F16;
  bind(r, "mkl_sqrt", !r->fused && avx512 && r->state_dtype == TY_F32);
  bind(r, "mkl_sqrt_ex", !r->fused && r->torch_cpu == TORCH_CPU_AMD && r->state_dtype == TY_F32);
  bind(r, "lowp", lowp);
  bind(r, "lowp_state", r->state_dtype == r->param_dtype);
  bind(r, "fused_vec", lowp ? 16 : 8);
}

Graph *frontend_build(Recipe *r) {
  Graph *g = graph_new(r->arena);
  g->src = &r->src;
  Builder b = {.r = r, .g = g, .master = -1, .kahan = -1, .seed = NOREF, .step_i = NOREF, .step = NOREF};
  b.param = graph_add_buffer(g, "param", BUF_PARAM, r->param_dtype);
  b.grad = graph_add_buffer(g, "grad", BUF_GRAD, r->grad_dtype);
  if (r->master_weights && r->param_dtype != TY_F32) {
    b.master = graph_add_buffer(g, "master", BUF_STATE, TY_F32);
    g->bufs[b.master].init = INIT_PARAM;
  }
  if (r->kahan)
    b.kahan = graph_add_buffer(g, "kahan_comp", BUF_STATE, r->param_dtype); /* optimi's name */
  Ref grad = build_prelude(&b);
  /* torch leaves the scaled (and clipped) grads in p.grad. The graph says
   * so; the drop-grad-writeback pass removes the store unless the recipe
   * keeps them (write_back_grads), since nobody reads them. */
  ir_store(g, b.grad, r->grad_dtype == TY_F32 ? grad : ir_cvt(g, grad, r->grad_dtype));
  g->ins[g->nins - 1].lead = arena_strdup(g->arena, "# p.grad holds the scaled grads afterwards, as in torch\n");
  g->bufs[b.grad].writeback = r->write_back_grads;
  bind_torch_cpu(r);
  if (!copy_body(&b, optir_specialize(r->body, r->bindings, r->nbindings, r->arena), grad))
    return NULL;
  /* torch's for-loop rounds where the body holds; its fused kernels never */
  ir_lower_holds(g, !r->fused);
  pass_dce(g);
  if (!ir_verify(g))
    return NULL;
  return g;
}
