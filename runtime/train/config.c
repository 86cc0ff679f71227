/* config.c: the training runtime's part of a recipe: the model block
 * (torchtune's Llama 4 builders, read into the model's own L4Config), the
 * batch and how long to train, torch.compile's flags. The optimizer spec is
 * the compiler's (frontend.c), which also checked every top-level key's
 * kind; the ranges and the meaning of these keys are checked here. */
#include "train.h"

#include <string.h>

/* ---- the model block ------------------------------------------------------------------- */

static const KeySpec model_keys[] = {
    {"_component_", K_STR}, {"vocab_size", K_INT}, {"num_layers", K_INT}, {"num_heads", K_INT},
    {"num_kv_heads", K_INT}, {"embed_dim", K_INT}, {"head_dim", K_INT}, {"hidden_dim", K_INT},
    {"shared_hidden_dim", K_INT}, {"num_experts", K_INT}, {"experts_per_token", K_INT},
    {"use_shared_expert", K_BOOL}, {"use_qk_norm", K_BOOL}, {"skip_rope_interval", K_INT},
    {"moe_every_n_layers", K_INT}, {"attention_chunk_size", K_INT}, {"max_seq_len", K_INT},
    {"rope_base", K_ANY}, {"rope_scale_factor", K_ANY}, {"rope_low_freq_factor", K_ANY},
    {"rope_high_freq_factor", K_ANY}, {"rope_old_context_len", K_INT}, {"norm_eps", K_ANY},
    {"tie_word_embeddings", K_BOOL}, {"attn_dropout", K_ANY}, {"mlp_hidden_dim", K_INT},
    {"use_scaled_rope", K_BOOL},
    /* the builders' trainability and vision flags: the text decoder trains either way */
    {"decoder_trainable", K_ANY}, {"encoder_trainable", K_ANY}, {"fusion_trainable", K_ANY}, {"image_size", K_ANY},
};

/* The builders a model block may name: torchtune's two presets (llama4.c's
 * l4_config_scout and l4_config_maverick), and the generic decoder, which
 * takes Scout's values for what it does not give. */
static const char *const generic_builder = "torchtune.models.llama4.llama4_decoder";

/* One key of the block: where it goes in L4Config, and its kind. The
 * RoPE's factor and use_scaled_rope are read apart (a factor <= 0 is the
 * model's plain RoPE). */
typedef enum { MF_INT, MF_LONG, MF_DOUBLE, MF_BOOL } FieldKind;
typedef struct {
  const char *key;
  size_t off;
  FieldKind kind;
} ModelField;

#define MF(k, kind) {#k, offsetof(L4Config, k), kind}
static const ModelField model_fields[] = {
    MF(vocab_size, MF_INT), MF(num_layers, MF_INT), MF(num_heads, MF_INT), MF(num_kv_heads, MF_INT),
    MF(embed_dim, MF_INT), MF(head_dim, MF_INT), MF(hidden_dim, MF_INT), MF(shared_hidden_dim, MF_INT),
    MF(num_experts, MF_INT), MF(experts_per_token, MF_INT), MF(use_shared_expert, MF_BOOL),
    MF(use_qk_norm, MF_BOOL), MF(skip_rope_interval, MF_INT), MF(moe_every_n_layers, MF_INT),
    MF(attention_chunk_size, MF_INT), MF(max_seq_len, MF_LONG), MF(rope_base, MF_DOUBLE),
    {"rope_scale_factor", 0, MF_DOUBLE}, MF(rope_low_freq_factor, MF_DOUBLE), MF(rope_high_freq_factor, MF_DOUBLE),
    MF(rope_old_context_len, MF_INT), MF(norm_eps, MF_DOUBLE), MF(tie_word_embeddings, MF_BOOL),
    MF(mlp_hidden_dim, MF_INT), {"use_scaled_rope", 0, MF_BOOL},
};
#undef MF

/* Limits on the model block: each dim an int (the model's L4Config), at most
 * MODEL_MAX_LAYERS layers, real-valued keys finite, and at most 2^48
 * parameters in all, so that every tensor's numel, their sum and the bytes
 * of any buffer of them are exact in int64. */
#define MODEL_MAX_LAYERS 4096
#define MODEL_MAX_REAL 1e30
#define MODEL_MAX_PARAMS ((double)((int64_t)1 << 48))

/* Where a message about key k (else k2) of the model section points: at its
 * value when the recipe gives it, else at the section. */
static SrcPos model_pos(const YamlNode *n, const char *k, const char *k2) {
  const YamlNode *v = yaml_get(n, k);
  if (!v && k2)
    v = yaml_get(n, k2);
  return v ? v->pos : n->pos;
}

/* The parameter count, as inventory.c lays the tensors out, in doubles (which
 * cannot overflow at these dims): two V x D embeddings, and per layer the
 * attention, two norms and a MoE (router, E experts of 3 D x H, the shared
 * expert) or a dense SwiGLU of 3 D x Hm. Over the limit, the message points at
 * the largest term's widest key. */
static bool check_model_size(const L4Config *m, const YamlNode *n) {
  double D = (double)m->embed_dim, L = (double)m->num_layers;
  double nmoe = m->moe_every_n_layers <= 1 ? L : (double)(m->num_layers / m->moe_every_n_layers);
  double q = (double)m->num_heads * m->head_dim, kv = (double)m->num_kv_heads * m->head_dim;
  struct { double n; const char *keys[4]; } terms[] = {
      {2 * (double)m->vocab_size * D + D, {"vocab_size", "embed_dim"}},
      {L * (2 * q * D + 2 * kv * D + 2 * D), {"num_layers", "num_heads", "head_dim", "embed_dim"}},
      {nmoe * (double)m->num_experts * D * (1 + 3 * (double)m->hidden_dim), {"num_experts", "hidden_dim", "embed_dim"}},
      {m->use_shared_expert ? nmoe * 3 * (double)m->shared_hidden_dim * D : 0, {"shared_hidden_dim", "embed_dim"}},
      {(L - nmoe) * 3 * (double)m->mlp_hidden_dim * D, {"mlp_hidden_dim", "embed_dim"}},
  };
  double total = 0;
  int big = 0;
  for (int i = 0; i < (int)ARRAY_LEN(terms); i++) {
    total += terms[i].n;
    if (terms[i].n > terms[big].n)
      big = i;
  }
  if (total <= MODEL_MAX_PARAMS)
    return true;
  const YamlNode *at = NULL;
  long widest = 0;
  for (int k = 0; k < 4 && terms[big].keys[k]; k++) {
    const YamlNode *v = yaml_get(n, terms[big].keys[k]);
    long x;
    if (v && v->kind == YAML_SCALAR && yaml_int(v, terms[big].keys[k], &x) && x > widest)
      at = v, widest = x;
  }
  Buf b = {0};
  for (int k = 0; k < 4 && terms[big].keys[k]; k++)
    buf_printf(&b, "%s%s", k ? " x " : "", terms[big].keys[k]);
  error_at(at ? at->pos : n->pos,
           "model: %.4g parameters (%.4g of them from %s) is out of range [1, 2^48 = %.0f]: the model does not fit "
           "in memory or int64",
           total, terms[big].n, b.data, MODEL_MAX_PARAMS);
  buf_free(&b);
  return false;
}

/* The model block into *out: the preset the component names, with every
 * key the block gives. false (error printed at the key) on a mistake. */
static bool read_model(const YamlNode *n, L4Config *out) {
  const YamlNode *comp = yaml_get(n, "_component_");
  if (!comp || comp->kind != YAML_SCALAR) {
    error_at(comp ? comp->pos : n->pos, "model: missing _component_");
    return false;
  }
  const char *tail = strrchr(comp->str, '.') ? strrchr(comp->str, '.') + 1 : comp->str;
  if (strncmp(tail, "lora_", 5) == 0 || strncmp(tail, "qlora_", 6) == 0) {
    error_at(comp->pos, "model._component_: %s is a LoRA model; optc does full finetuning only (LoRA is not supported)",
             comp->str);
    return false;
  }
  if (!yaml_check_keys(n, model_keys, ARRAY_LEN(model_keys), "model"))
    return false;
  const L4Config scout = l4_config_scout(), maverick = l4_config_maverick();
  bool is_maverick = strcmp(comp->str, maverick.component) == 0;
  bool preset = strcmp(comp->str, scout.component) == 0 || is_maverick;
  if (!preset && strcmp(comp->str, generic_builder) != 0) {
    error_at(comp->pos, "model._component_: unknown model '%s'; expected %s, %s or %s", comp->str, scout.component,
             maverick.component, generic_builder);
    return false;
  }
  L4Config m = is_maverick ? maverick : scout;
  m.component = comp->str;
  m.head_dim = 0; /* derived below unless given */
  /* torchtune's builders: Scout's RoPE is scaled by 16, Maverick's plain
   * (use_scaled_rope False), whatever rope_scale_factor says */
  double factor = 16;
  bool scaled = !is_maverick;
  for (size_t i = 0; i < ARRAY_LEN(model_fields); i++) {
    const ModelField *f = &model_fields[i];
    const YamlNode *v = yaml_get(n, f->key);
    char what[64];
    snprintf(what, sizeof what, "model.%s", f->key);
    if (!v) {
      static const char *const required[] = {"vocab_size", "num_layers", "num_heads", "num_kv_heads",
                                             "embed_dim", "hidden_dim", "num_experts"};
      for (size_t k = 0; !preset && k < ARRAY_LEN(required); k++)
        if (strcmp(required[k], f->key) == 0) {
          error_at(n->pos, "model: %s needs '%s'", generic_builder, f->key);
          return false;
        }
      continue;
    }
    bool is_factor = strcmp(f->key, "rope_scale_factor") == 0, is_scaled = strcmp(f->key, "use_scaled_rope") == 0;
    char *p = (char *)&m + f->off;
    if (f->kind == MF_DOUBLE) {
      double d;
      if (!yaml_double(v, what, &d))
        return false;
      if (!(d > 0 && d <= MODEL_MAX_REAL)) {
        error_at(v->pos, "%s: %s is out of range (0, 1e30]", what, v->str);
        return false;
      }
      *(is_factor ? &factor : (double *)p) = d;
    } else if (f->kind == MF_BOOL) {
      bool b;
      if (!yaml_bool(v, what, &b))
        return false;
      if (is_scaled)
        scaled = b;
      else
        *(int *)p = b;
    } else {
      /* the model's dims are ints; the layer count bounds the tensor count */
      long x, hi = strcmp(f->key, "num_layers") == 0 ? MODEL_MAX_LAYERS : INT32_MAX;
      if (!yaml_int_in(v, what, 1, hi, &x))
        return false;
      if (f->kind == MF_LONG)
        *(long *)p = x;
      else
        *(int *)p = (int)x;
    }
  }
  m.rope_scale_factor = scaled ? factor : 0;
  if (!yaml_get(n, "shared_hidden_dim"))
    m.shared_hidden_dim = m.hidden_dim;
  if (m.moe_every_n_layers > 1 && m.mlp_hidden_dim <= 0) {
    error_at(model_pos(n, "moe_every_n_layers", NULL),
             "model: moe_every_n_layers %d needs mlp_hidden_dim, the dense layers' width", m.moe_every_n_layers);
    return false;
  }
  if (!m.head_dim) {
    if (m.embed_dim % m.num_heads) {
      error_at(model_pos(n, "num_heads", "embed_dim"), "model: embed_dim %d is not divisible by num_heads %d",
               m.embed_dim, m.num_heads);
      return false;
    }
    m.head_dim = m.embed_dim / m.num_heads;
  }
  if (m.num_heads % m.num_kv_heads) {
    error_at(model_pos(n, "num_kv_heads", "num_heads"), "model: num_heads %d is not divisible by num_kv_heads %d",
             m.num_heads, m.num_kv_heads);
    return false;
  }
  if (m.head_dim % 2) {
    error_at(model_pos(n, "head_dim", "num_heads"), "model: head_dim %d must be even for RoPE", m.head_dim);
    return false;
  }
  if (m.experts_per_token > m.num_experts) {
    error_at(model_pos(n, "experts_per_token", "num_experts"), "model: experts_per_token %d exceeds num_experts %d",
             m.experts_per_token, m.num_experts);
    return false;
  }
  if (m.experts_per_token != 1) {
    error_at(model_pos(n, "experts_per_token", NULL),
             "model: optc's Llama 4 router is top-1 (experts_per_token: 1), as Scout's is");
    return false;
  }
  if ((double)m.num_heads * m.head_dim > INT32_MAX) {
    error_at(model_pos(n, "head_dim", "num_heads"),
             "model: num_heads x head_dim (%d x %d) is out of range [1, %d], the query projection's width",
             m.num_heads, m.head_dim, INT32_MAX);
    return false;
  }
  if (!check_model_size(&m, n))
    return false;
  *out = m;
  return true;
}

/* ---- the rest ------------------------------------------------------------------------------ */

int train_config_read(Recipe *r, TrainConfig *out) {
  *out = (TrainConfig){.r = r, .batch_size = 1, .gradient_accumulation_steps = 1, .epochs = 1};
  const YamlNode *root = r->root, *v;
  if ((v = yaml_get(root, "fsdp_cpu_offload")))
    yaml_bool(v, "fsdp_cpu_offload", &out->fsdp_cpu_offload);
  if ((v = yaml_get(root, "shuffle")))
    yaml_bool(v, "shuffle", &out->shuffle);
  /* Ranges that keep every product of them (tokens = batch_size x
   * max_seq_len, steps = epochs x steps per epoch) well inside int64. */
  struct { const char *key; long *out; long lo, hi; } ints[] = {
      {"batch_size", &out->batch_size, 1, 1 << 16},
      {"gradient_accumulation_steps", &out->gradient_accumulation_steps, 1, 1 << 20},
      {"epochs", &out->epochs, 1, 1 << 20},
      {"max_steps_per_epoch", &out->max_steps_per_epoch, 1, INT32_MAX},
      {"max_steps", &out->max_steps, 1, INT32_MAX},
  };
  for (size_t i = 0; i < ARRAY_LEN(ints); i++)
    if ((v = yaml_get(root, ints[i].key)) && !yaml_is_null(v) &&
        !yaml_int_in(v, ints[i].key, ints[i].lo, ints[i].hi, ints[i].out))
      return -1;
  /* compile: a bool sets all four; a dict takes torchtune's defaults. */
  if ((v = yaml_get(root, "compile"))) {
    if (v->kind == YAML_SCALAR) {
      bool on;
      yaml_bool(v, "compile", &on);
      out->compile = (CompileFlags){on, on, on, on};
    } else {
      static const KeySpec compile_keys[] = {
          {"model", K_BOOL}, {"loss", K_BOOL}, {"optimizer_step", K_BOOL}, {"scale_grads", K_BOOL}};
      if (!yaml_check_keys(v, compile_keys, ARRAY_LEN(compile_keys), "compile"))
        return -1;
      out->compile = (CompileFlags){true, true, false, true};
      bool *flags[] = {&out->compile.model, &out->compile.loss, &out->compile.optimizer_step,
                       &out->compile.scale_grads};
      for (size_t i = 0; i < ARRAY_LEN(compile_keys); i++) {
        const YamlNode *f = yaml_get(v, compile_keys[i].key);
        if (f)
          yaml_bool(f, compile_keys[i].key, flags[i]);
      }
    }
  }
  if ((v = yaml_get(root, "model"))) {
    if (!read_model(v, &out->model))
      return -1;
    out->has_model = true;
  }
  return 0;
}
