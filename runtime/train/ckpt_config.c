/* ckpt_config.c: what a checkpoint directory is, before any tensor is
 * read: the recipe's checkpointer block (torchtune's FullModelHFCheckpointer
 * arguments, its filename_format expansion, huggingface_hub's sizes), and
 * the model's config.json, read (HF's Llama4TextConfig keys and defaults,
 * against the recipe's model block) and written (for a run that started
 * from no checkpoint). */
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ---- sizes: huggingface_hub's parse_size_to_int ---------------------------------------- */

/* size = NUMBER UNIT, UNIT = TB | GB | MB | KB (any case, powers of ten),
 * spaces around either; or a bare integer of bytes (hub takes an int). */
bool ckpt_parse_size(const char *s, int64_t *out) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    n--;
  char buf[64];
  if (n == 0 || n >= sizeof buf)
    return false;
  memcpy(buf, s, n);
  buf[n] = 0;
  char *end;
  if (buf[0] >= '0' && buf[0] <= '9') {
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (*end == 0 && errno == 0 && v > 0) {
      *out = v;
      return true;
    }
  }
  if (n < 3)
    return false;
  static const struct { const char *unit; double mult; } units[] = {
      {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}};
  char unit[3] = {(char)(buf[n - 2] & ~0x20), (char)(buf[n - 1] & ~0x20), 0};
  double mult = 0;
  for (size_t i = 0; i < ARRAY_LEN(units); i++)
    if (strcmp(unit, units[i].unit) == 0)
      mult = units[i].mult;
  if (mult == 0)
    return false;
  buf[n - 2] = 0;
  char *num = buf;
  while (*num == ' ')
    num++;
  double v = strtod(num, &end);
  while (*end == ' ')
    end++;
  if (end == num || *end || !(v * mult >= 1) || v * mult > 9e18)
    return false;
  *out = (int64_t)(v * mult); /* int(value * multiplier) truncates, as here */
  return true;
}

/* ---- torchtune's FormattedCheckpointFiles ------------------------------------------------- */

/* filename_format's text with each placeholder replaced: args[0] for the
 * first "{}" (or "{0}"), args[1] for the second; "{{" and "}}" are braces.
 * Python's str.format rules, for the plain placeholders torchtune uses. */
static int format2(const char *fmt, const char *a0, const char *a1, Buf *out, char *why, size_t whylen) {
  int auto_next = 0, nplace = 0;
  bool manual = false;
  for (const char *p = fmt; *p; p++) {
    if (*p == '{' && p[1] == '{') {
      buf_putc(out, '{');
      p++;
      continue;
    }
    if (*p == '}' && p[1] == '}') {
      buf_putc(out, '}');
      p++;
      continue;
    }
    if (*p == '}') {
      snprintf(why, whylen, "single '}' in '%s' (write '}}' for a brace)", fmt);
      return -1;
    }
    if (*p != '{') {
      buf_putc(out, *p);
      continue;
    }
    const char *close = strchr(p, '}');
    if (!close) {
      snprintf(why, whylen, "'{' without '}' in '%s'", fmt);
      return -1;
    }
    int len = (int)(close - p - 1), idx;
    if (len == 0) {
      if (manual) {
        snprintf(why, whylen, "'%s' mixes '{}' and numbered placeholders", fmt);
        return -1;
      }
      idx = auto_next++;
    } else if (len == 1 && (p[1] == '0' || p[1] == '1')) {
      if (auto_next) {
        snprintf(why, whylen, "'%s' mixes '{}' and numbered placeholders", fmt);
        return -1;
      }
      manual = true;
      idx = p[1] - '0';
    } else {
      snprintf(why, whylen,
               "placeholder '{%.*s}' in '%s': torchtune formats with two positional arguments, so "
               "each placeholder is '{}'",
               len, p + 1, fmt);
      return -1;
    }
    if (idx > 1) {
      snprintf(why, whylen, "'%s' has more than two placeholders", fmt);
      return -1;
    }
    buf_puts(out, idx == 0 ? a0 : a1);
    nplace++;
    p = close;
  }
  if (nplace != 2) {
    snprintf(why, whylen, "'%s' has %d placeholder%s; it needs exactly two, e.g. model-{}-of-{}.safetensors",
             fmt, nplace, nplace == 1 ? "" : "s");
    return -1;
  }
  return 0;
}

/* [fmt.format(str(i + 1).zfill(len(max_filename)), max_filename) for i in range(int(max_filename))] */
int ckpt_format_files(const char *fmt, const char *max_filename, char ***out, int *n, char *why, size_t whylen) {
  *out = NULL;
  *n = 0;
  size_t width = strlen(max_filename);
  if (width == 0 || width > 9 || strspn(max_filename, "0123456789") != width) {
    snprintf(why, whylen, "max_filename '%s' is not a file number such as \"00050\"", max_filename);
    return -1;
  }
  long count = strtol(max_filename, NULL, 10);
  if (count < 1) {
    snprintf(why, whylen, "max_filename '%s' names no files", max_filename);
    return -1;
  }
  if (count > 99999) { /* a list of names allocated up front */
    snprintf(why, whylen, "max_filename '%s' is out of range [1, 99999] files", max_filename);
    return -1;
  }
  char **names = calloc((size_t)count + 1, sizeof(char *));
  ASSERT(names);
  for (long i = 0; i < count; i++) {
    char num[32];
    snprintf(num, sizeof num, "%0*ld", (int)width, i + 1);
    Buf b = {0};
    if (format2(fmt, num, max_filename, &b, why, whylen) != 0) {
      buf_free(&b);
      ckpt_strings_free(names, (int)i);
      return -1;
    }
    names[i] = xstrdup(b.data ? b.data : "");
    buf_free(&b);
  }
  *out = names;
  *n = (int)count;
  return 0;
}

/* ---- the checkpointer block -------------------------------------------------------------- */

static const char *const ckpt_keys[] = {
    "_component_", "checkpoint_dir", "checkpoint_files", "recipe_checkpoint", "output_dir", "model_type",
    "adapter_checkpoint", "resume_from_checkpoint", "should_load_recipe_state", "safe_serialization",
    "keep_last_n_checkpoints", "enable_dcp", "max_shard_size",
};

/* v's string (${key} references were resolved when the recipe loaded), or
 * NULL after an error at v */
static const char *str_of(const YamlNode *v, const char *what) {
  const char *s;
  return yaml_string(v, what, &s) ? s : NULL;
}

/* checkpoint_files: [FILE, ...] | {filename_format: FMT, max_filename: "NNNNN"} */
static int parse_files(const Recipe *r, const YamlNode *v, CkptConfig *c) {
  if (yaml_is_null(v))
    return 0;
  if (v->kind == YAML_SEQ) {
    c->files = arena_alloc(r->arena, sizeof(char *) * ((size_t)v->n + 1));
    for (int i = 0; i < v->n; i++) {
      const char *s = str_of(v->items[i], "checkpointer.checkpoint_files");
      if (!s)
        return -1;
      c->files[c->nfiles++] = s;
    }
  } else if (v->kind == YAML_MAP) {
    for (int i = 0; i < v->n; i++)
      if (strcmp(v->keys[i], "filename_format") != 0 && strcmp(v->keys[i], "max_filename") != 0) {
        error_at(v->key_pos[i], "checkpointer.checkpoint_files: unknown key '%s'; expected filename_format and max_filename",
                 v->keys[i]);
        return -1;
      }
    const YamlNode *f = yaml_get(v, "filename_format"), *m = yaml_get(v, "max_filename");
    if (!f || !m) {
      error_at(v->pos, "checkpointer.checkpoint_files: must pass 'filename_format' and 'max_filename' keys to "
                       "generate checkpoint filenames (as torchtune requires)");
      return -1;
    }
    const char *fmt = str_of(f, "checkpointer.checkpoint_files.filename_format");
    if (!fmt)
      return -1;
    /* torchtune: "`max_filename` must be a string"; unquoted, YAML makes 00050 a number */
    if (m->kind != YAML_SCALAR || m->plain) {
      error_at(m->pos, "checkpointer.checkpoint_files.max_filename must be a string, as torchtune requires: quote it "
                       "(max_filename: \"%s\")",
               m->kind == YAML_SCALAR ? m->str : "00050");
      return -1;
    }
    char **names, why[512];
    int n;
    if (ckpt_format_files(fmt, m->str, &names, &n, why, sizeof why) != 0) {
      error_at(f->pos, "checkpointer.checkpoint_files: %s", why);
      return -1;
    }
    c->files = arena_alloc(r->arena, sizeof(char *) * ((size_t)n + 1));
    for (int i = 0; i < n; i++)
      c->files[c->nfiles++] = arena_strdup(r->arena, names[i]);
    ckpt_strings_free(names, n);
  } else {
    error_at(v->pos, "checkpointer.checkpoint_files: expected a list of files or {filename_format, max_filename}");
    return -1;
  }
  /* torchtune sorts the paths, so the order given does not matter */
  qsort(c->files, (size_t)c->nfiles, sizeof(char *), cmp_str);
  for (int i = 1; i < c->nfiles; i++)
    if (strcmp(c->files[i], c->files[i - 1]) == 0) {
      error_at(v->pos, "checkpointer.checkpoint_files: '%s' is listed twice", c->files[i]);
      return -1;
    }
  return 0;
}

int ckpt_config(const Recipe *r, const char *default_out, CkptConfig *c) {
  *c = (CkptConfig){.output_dir = default_out, .max_shard_size = (int64_t)5e9};
  const YamlNode *ck = yaml_get(r->root, "checkpointer");
  if (yaml_is_null(ck))
    return 0;
  c->pos = ck->pos;
  if (ck->kind != YAML_MAP) {
    error_at(ck->pos, "checkpointer: expected a mapping");
    return -1;
  }
  for (int i = 0; i < ck->n; i++) {
    bool known = false;
    for (size_t k = 0; k < ARRAY_LEN(ckpt_keys); k++)
      known |= strcmp(ck->keys[i], ckpt_keys[k]) == 0;
    if (!known) {
      error_at(ck->key_pos[i], "checkpointer: unknown key '%s' (FullModelHFCheckpointer takes checkpoint_dir, "
                               "checkpoint_files, model_type, output_dir, recipe_checkpoint, ...)",
               ck->keys[i]);
      return -1;
    }
  }
  const YamlNode *v;
  const char *s;
  if ((v = yaml_get(ck, "_component_"))) {
    if (!(s = str_of(v, "checkpointer._component_")))
      return -1;
    if (strcmp(s, "torchtune.training.FullModelHFCheckpointer") != 0 &&
        strcmp(s, "torchtune.training.checkpointing.FullModelHFCheckpointer") != 0) {
      error_at(v->pos, "checkpointer._component_: optc reads and writes HF checkpoints "
                       "(torchtune.training.FullModelHFCheckpointer), not '%s'",
               s);
      return -1;
    }
  }
  if ((v = yaml_get(ck, "model_type"))) {
    if (!(s = str_of(v, "checkpointer.model_type")))
      return -1;
    if (strcmp(s, "LLAMA4") != 0) {
      error_at(v->pos, "checkpointer.model_type: optc's model is Llama 4 (LLAMA4), not '%s'", s);
      return -1;
    }
  }
  if ((v = yaml_get(ck, "checkpoint_dir")) && !yaml_is_null(v) &&
      !(c->checkpoint_dir = str_of(v, "checkpointer.checkpoint_dir")))
    return -1;
  if ((v = yaml_get(ck, "output_dir")) && !yaml_is_null(v) &&
      !(c->output_dir = str_of(v, "checkpointer.output_dir")))
    return -1;
  if (parse_files(r, yaml_get(ck, "checkpoint_files"), c) != 0)
    return -1;
  /* checkpoint_files (even []) says where the weights come from: without
   * a checkpoint_dir that is a mistake, not a random start */
  int fi = yaml_index(ck, "checkpoint_files");
  if (fi >= 0 && !yaml_is_null(ck->items[fi]) && !c->checkpoint_dir) {
    error_at(ck->key_pos[fi], "checkpointer.checkpoint_files: given without a checkpoint_dir to find %s in; give "
                              "checkpointer.checkpoint_dir, or remove checkpoint_files to start from random weights",
             c->nfiles ? "them" : "the model's files");
    return -1;
  }
  /* recipe_checkpoint and adapter_checkpoint: torchtune warns that it
   * ignores the first and the second is for LoRA; the recipe state is
   * always output_dir/step_N's. Both are read for their type only. */
  const char *ignored[] = {"recipe_checkpoint", "adapter_checkpoint"};
  for (size_t i = 0; i < ARRAY_LEN(ignored); i++)
    if ((v = yaml_get(ck, ignored[i])) && !yaml_is_null(v) && !yaml_string(v, ignored[i], &s))
      return -1;
  bool b;
  const char *resumes[] = {"resume_from_checkpoint", "should_load_recipe_state"};
  for (size_t i = 0; i < ARRAY_LEN(resumes); i++)
    if ((v = yaml_get(ck, resumes[i]))) {
      if (!yaml_bool(v, resumes[i], &b))
        return -1;
      c->resume |= b;
    }
  if ((v = yaml_get(ck, "safe_serialization"))) {
    if (!yaml_bool(v, "checkpointer.safe_serialization", &b))
      return -1;
    if (!b) {
      error_at(v->pos, "checkpointer.safe_serialization: optc writes safetensors only");
      return -1;
    }
  }
  if ((v = yaml_get(ck, "enable_dcp"))) {
    if (!yaml_bool(v, "checkpointer.enable_dcp", &b))
      return -1;
    if (b) {
      error_at(v->pos, "checkpointer.enable_dcp: optc reads and writes HF safetensors directories, not DCP");
      return -1;
    }
  }
  if ((v = yaml_get(ck, "keep_last_n_checkpoints")) && !yaml_is_null(v)) {
    if (!yaml_int_in(v, "checkpointer.keep_last_n_checkpoints", 1, INT32_MAX, &c->keep_last_n))
      return -1;
  }
  /* optc's key: torchtune passes max_shard_size="5GB" to save_checkpoint */
  if ((v = yaml_get(ck, "max_shard_size")) && !yaml_is_null(v)) {
    if (v->kind != YAML_SCALAR || !ckpt_parse_size(v->str, &c->max_shard_size)) {
      error_at(v->pos, "checkpointer.max_shard_size: expected a size such as 5GB, 500MB or 200KB (powers of ten, as "
                       "huggingface_hub reads them) or a number of bytes");
      return -1;
    }
  }
  return 0;
}

/* ---- config.json ------------------------------------------------------------------------- */

/* Typed reads of a config.json key; absent or null gives the default
 * (Llama4TextConfig's), *present tells which. */
typedef struct {
  const char *path;
  const json_t *o;
  const char *pre; /* "text_config." or "" */
} Cfg;

static int cfg_int(const Cfg *c, const char *key, long def, long *out, bool *present) {
  const json_t *v = json_object_get(c->o, key);
  if (present)
    *present = v && !json_is_null(v);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_integer(v)) {
    *out = (long)json_integer_value(v);
    return 0;
  }
  if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 1e15) {
    *out = (long)json_real_value(v);
    return 0;
  }
  error("%s: %s%s is not an integer", c->path, c->pre, key);
  return -1;
}

static int cfg_num(const Cfg *c, const char *key, double def, double *out) {
  const json_t *v = json_object_get(c->o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_number(v)) {
    error("%s: %s%s is not a number", c->path, c->pre, key);
    return -1;
  }
  *out = json_number_value(v);
  return 0;
}

/* Llama 4's configs have written attn_temperature_tuning both as a bool
 * and as a number (nonzero: on). */
static int cfg_bool(const Cfg *c, const char *key, bool def, bool *out) {
  const json_t *v = json_object_get(c->o, key);
  if (!v || json_is_null(v))
    *out = def;
  else if (json_is_boolean(v))
    *out = json_is_true(v);
  else if (json_is_number(v))
    *out = json_number_value(v) != 0;
  else {
    error("%s: %s%s is not true or false", c->path, c->pre, key);
    return -1;
  }
  return 0;
}

static const char *cfg_str(const Cfg *c, const char *key) {
  const json_t *v = json_object_get(c->o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool positive(const Cfg *c, const char *key, long v) {
  if (v > 0)
    return true;
  error("%s: %s%s is %ld; it must be positive", c->path, c->pre, key, v);
  return false;
}

/* The limits the recipe's model block has (frontend.c): the model's dims
 * are ints, at most 4096 layers. */
static bool at_most(const Cfg *c, const char *key, long v, long hi) {
  if (v <= hi)
    return true;
  error("%s: %s%s is %ld; it is out of range [1, %ld]", c->path, c->pre, key, v, hi);
  return false;
}

/* The RoPE: transformers 5's rope_parameters {rope_type, rope_theta, factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings}, or
 * the older rope_theta beside rope_scaling {rope_type | type, ...}. Plain
 * ("default") or Llama 3's scaling; nothing else is Llama 4's. */
static int read_rope(const Cfg *c, L4Config *l) {
  const json_t *rp = json_object_get(c->o, "rope_parameters");
  const json_t *rs = json_object_get(c->o, "rope_scaling");
  const json_t *p = json_is_object(rp) ? rp : json_is_object(rs) ? rs : NULL;
  const char *pkey = p == rp ? "rope_parameters" : "rope_scaling";
  double theta;
  if (cfg_num(c, "rope_theta", 500000.0, &theta) != 0)
    return -1;
  l->rope_scale_factor = 0;
  if (p) {
    Cfg pc = {c->path, p, pkey};
    char pre[64];
    snprintf(pre, sizeof pre, "%s%s.", c->pre, pkey);
    pc.pre = pre;
    if (json_object_get(p, "rope_theta") && cfg_num(&pc, "rope_theta", theta, &theta) != 0)
      return -1;
    const char *type = cfg_str(&pc, "rope_type");
    if (!type)
      type = cfg_str(&pc, "type");
    if (!type)
      type = "default";
    if (strcmp(type, "llama3") == 0) {
      long old;
      if (cfg_num(&pc, "factor", 8.0, &l->rope_scale_factor) != 0 ||
          cfg_num(&pc, "low_freq_factor", 1.0, &l->rope_low_freq_factor) != 0 ||
          cfg_num(&pc, "high_freq_factor", 4.0, &l->rope_high_freq_factor) != 0 ||
          cfg_int(&pc, "original_max_position_embeddings", 8192, &old, NULL) != 0)
        return -1;
      l->rope_old_context_len = (int)old;
      if (!(l->rope_scale_factor > 0) || old <= 0) {
        error("%s: %s%s: factor and original_max_position_embeddings must be positive", c->path, c->pre, pkey);
        return -1;
      }
    } else if (strcmp(type, "default") != 0) {
      error("%s: %s%s.rope_type is '%s'; Llama 4's RoPE is plain (default) or llama3", c->path, c->pre, pkey, type);
      return -1;
    }
  } else if (rs && !json_is_null(rs)) {
    error("%s: %srope_scaling is not an object", c->path, c->pre);
    return -1;
  }
  if (!(theta > 0)) {
    error("%s: %srope_theta must be positive", c->path, c->pre);
    return -1;
  }
  l->rope_base = theta;
  return 0;
}

/* no_rope_layers [1 = RoPE, 0 = NoPE per layer] must be every k-th layer
 * NoPE (optc's skip_rope_interval), or all RoPE. */
static int read_nope(const Cfg *c, long layers, L4Config *l) {
  long interval;
  if (cfg_int(c, "no_rope_layer_interval", 4, &interval, NULL) != 0)
    return -1;
  /* Meta's params.json spells it nope_layer_interval */
  if (!json_object_get(c->o, "no_rope_layer_interval") && json_object_get(c->o, "nope_layer_interval") &&
      cfg_int(c, "nope_layer_interval", 4, &interval, NULL) != 0)
    return -1;
  const json_t *list = json_object_get(c->o, "no_rope_layers");
  if (!list || json_is_null(list) || (json_is_array(list) && json_array_size(list) == 0)) {
    if (interval <= 0) {
      error("%s: %sno_rope_layer_interval is %ld; it must be positive", c->path, c->pre, interval);
      return -1;
    }
    l->skip_rope_interval = (int)interval;
    return 0;
  }
  if (!json_is_array(list) || (long)json_array_size(list) < layers) {
    error("%s: %sno_rope_layers must be a list of at least num_hidden_layers (%ld) 0s and 1s", c->path, c->pre, layers);
    return -1;
  }
  long k = 0; /* the first NoPE layer, + 1 */
  for (long i = 0; i < layers && !k; i++)
    if (json_is_integer(json_array_get(list, (size_t)i)) && json_integer_value(json_array_get(list, (size_t)i)) == 0)
      k = i + 1;
  for (long i = 0; i < layers; i++) {
    const json_t *e = json_array_get(list, (size_t)i);
    if (!json_is_integer(e) || (json_integer_value(e) != 0 && json_integer_value(e) != 1)) {
      error("%s: %sno_rope_layers[%ld] is not 0 or 1", c->path, c->pre, i);
      return -1;
    }
    bool nope = k && (i + 1) % k == 0;
    if ((json_integer_value(e) == 0) != nope) {
      error("%s: %sno_rope_layers: layer %ld %s RoPE, but optc's model has NoPE on every k-th layer only "
            "(here k = %ld, from the first NoPE layer)",
            c->path, c->pre, i, nope ? "uses" : "skips", k);
      return -1;
    }
  }
  l->skip_rope_interval = (int)k; /* 0: every layer uses RoPE */
  return 0;
}

int hf_config_read(const char *path, L4Config *out, bool *multimodal) {
  *multimodal = false;
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (je.line <= 0)
      error("cannot read '%s': %s", path, je.text);
    else
      error("%s:%d:%d: %s", path, je.line, je.column, je.text);
    return -1;
  }
  int rc = -1;
  if (!json_is_object(root)) {
    error("%s: not a JSON object", path);
    goto out;
  }
  Cfg c = {path, root, ""};
  const json_t *tc = json_object_get(root, "text_config");
  if (json_is_object(tc)) {
    /* Llama4ForConditionalGeneration: the decoder's config nested, its
     * tensors under language_model. */
    *multimodal = true;
    c = (Cfg){path, tc, "text_config."};
  }
  const char *mt = cfg_str(&c, "model_type");
  if (mt && strcmp(mt, "llama4_text") != 0 && strcmp(mt, "llama4") != 0) {
    error("%s: %smodel_type is '%s'; optc's model is Llama 4 (llama4_text)", path, c.pre, mt);
    goto out;
  }
  const char *act = cfg_str(&c, "hidden_act");
  if (act && strcmp(act, "silu") != 0) {
    error("%s: %shidden_act is '%s'; Llama 4's SwiGLU uses silu", path, c.pre, act);
    goto out;
  }
  L4Config *l = out;
  *l = l4_config_scout();
  l->component = NULL;
  bool tie = false;
  long vocab, layers, heads, kv, hidden, head_dim, inter, inter_mlp, experts, topk, chunk, step, floor_scale, maxpos;
  bool has_kv, has_head_dim, has_chunk, qk, tune, bias = false;
  if (cfg_int(&c, "vocab_size", 202048, &vocab, NULL) || cfg_int(&c, "num_hidden_layers", 48, &layers, NULL) ||
      cfg_int(&c, "num_attention_heads", 40, &heads, NULL) || cfg_int(&c, "hidden_size", 5120, &hidden, NULL) ||
      cfg_int(&c, "num_key_value_heads", 8, &kv, &has_kv) ||
      cfg_int(&c, "head_dim", 128, &head_dim, &has_head_dim) ||
      cfg_int(&c, "intermediate_size", 8192, &inter, NULL) || cfg_int(&c, "intermediate_size_mlp", 16384, &inter_mlp, NULL) ||
      cfg_int(&c, "num_local_experts", 16, &experts, NULL) ||
      cfg_int(&c, "num_experts_per_tok", 1, &topk, NULL) ||
      cfg_int(&c, "attention_chunk_size", 8192, &chunk, &has_chunk) ||
      cfg_int(&c, "interleave_moe_layer_step", 1, &step, NULL) || cfg_int(&c, "floor_scale", 8192, &floor_scale, NULL) ||
      cfg_int(&c, "max_position_embeddings", 131072, &maxpos, NULL) || cfg_num(&c, "rms_norm_eps", 1e-5, &l->norm_eps) ||
      cfg_num(&c, "attn_scale", 0.1, &l->attn_scale) || cfg_bool(&c, "use_qk_norm", true, &qk) ||
      cfg_bool(&c, "attn_temperature_tuning", true, &tune) ||
      cfg_bool(&c, "tie_word_embeddings", false, &tie) ||
      cfg_bool(&c, "attention_bias", false, &bias))
    goto out;
  /* an explicit null chunk size turns chunking off; absent is HF's 8192 */
  if (json_is_null(json_object_get(c.o, "attention_chunk_size")))
    chunk = 0;
  (void)has_chunk;
  if (!has_kv && json_is_null(json_object_get(c.o, "num_key_value_heads")))
    kv = heads; /* HF: None means as many as the query heads */
  if (!has_head_dim && json_is_null(json_object_get(c.o, "head_dim")))
    head_dim = heads ? hidden / heads : 0;
  if (!positive(&c, "vocab_size", vocab) || !positive(&c, "num_hidden_layers", layers) ||
      !positive(&c, "num_attention_heads", heads) || !positive(&c, "num_key_value_heads", kv) ||
      !positive(&c, "hidden_size", hidden) || !positive(&c, "head_dim", head_dim) ||
      !positive(&c, "intermediate_size", inter) || !positive(&c, "num_local_experts", experts) ||
      !positive(&c, "interleave_moe_layer_step", step) || !positive(&c, "floor_scale", floor_scale))
    goto out;
  if (!at_most(&c, "vocab_size", vocab, INT32_MAX) || !at_most(&c, "num_hidden_layers", layers, 4096) ||
      !at_most(&c, "num_attention_heads", heads, INT32_MAX) || !at_most(&c, "num_key_value_heads", kv, INT32_MAX) ||
      !at_most(&c, "hidden_size", hidden, INT32_MAX) || !at_most(&c, "head_dim", head_dim, INT32_MAX) ||
      !at_most(&c, "intermediate_size", inter, INT32_MAX) || !at_most(&c, "intermediate_size_mlp", inter_mlp, INT32_MAX) ||
      !at_most(&c, "num_local_experts", experts, INT32_MAX) || !at_most(&c, "attention_chunk_size", chunk, INT32_MAX) ||
      !at_most(&c, "interleave_moe_layer_step", step, INT32_MAX) ||
      !at_most(&c, "num_attention_heads x head_dim", heads * head_dim, INT32_MAX))
    goto out;
  if (topk != 1) {
    error("%s: %snum_experts_per_tok is %ld; optc's Llama 4 router is top-1, as Scout's is", path, c.pre, topk);
    goto out;
  }
  if (bias) {
    error("%s: %sattention_bias is true; Llama 4's projections have no bias", path, c.pre);
    goto out;
  }
  /* MoE layers: HF's moe_layers, else range(step - 1, layers, step); the
   * rest are dense, intermediate_size_mlp wide. optc's model takes every
   * step-th layer (moe_every_n_layers), so a list must be that pattern. */
  const json_t *moe = json_object_get(c.o, "moe_layers");
  if (json_is_array(moe)) {
    long first = -1;
    for (size_t k = 0; k < json_array_size(moe); k++) {
      const json_t *e = json_array_get(moe, k);
      if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= layers) {
        error("%s: %smoe_layers[%zu] is not a layer index below num_hidden_layers (%ld)", path, c.pre, k, layers);
        goto out;
      }
      if (first < 0 || json_integer_value(e) < first)
        first = (long)json_integer_value(e);
    }
    step = first < 0 ? 0 : first + 1;
    for (long i = 0; i < layers; i++) {
      bool listed = false;
      for (size_t k = 0; k < json_array_size(moe); k++)
        listed |= json_integer_value(json_array_get(moe, k)) == i;
      if (step <= 0 || listed != ((i + 1) % step == 0)) {
        error("%s: %smoe_layers: layer %ld is %s, but optc's model has a mixture of experts on every k-th layer "
              "only (interleave_moe_layer_step)",
              path, c.pre, i, listed ? "MoE" : "dense");
        goto out;
      }
    }
  }
  if (step > 1 && !positive(&c, "intermediate_size_mlp", inter_mlp))
    goto out;
  /* at most 2^48 parameters, as the recipe's model block: counted in
   * doubles, which cannot overflow at these dims */
  double D = (double)hidden, nmoe = step <= 1 ? (double)layers : (double)(layers / step);
  double params = 2 * (double)vocab * D + D +
                  (double)layers * (2 * (double)(heads + kv) * (double)head_dim * D + 2 * D) +
                  nmoe * ((double)experts * D * (1 + 3 * (double)inter) + 3 * (double)inter * D) +
                  ((double)layers - nmoe) * 3 * (double)inter_mlp * D;
  if (params > (double)((int64_t)1 << 48)) {
    error("%s: %.4g parameters is out of range [1, 2^48]: the model does not fit in memory or int64", path, params);
    goto out;
  }
  l->vocab_size = (int)vocab;
  l->num_layers = (int)layers;
  l->num_heads = (int)heads;
  l->num_kv_heads = (int)kv;
  l->embed_dim = (int)hidden;
  l->head_dim = (int)head_dim;
  l->hidden_dim = (int)inter;
  l->shared_hidden_dim = (int)inter; /* HF's shared expert is Llama4TextMLP(config): intermediate_size */
  l->num_experts = (int)experts;
  l->moe_every_n_layers = (int)step;
  l->mlp_hidden_dim = (int)inter_mlp;
  l->use_qk_norm = qk;
  l->attention_chunk_size = (int)MAX(chunk, 0);
  l->attn_temperature_tuning = tune;
  l->attn_floor_scale = (double)floor_scale;
  if (read_rope(&c, l) != 0 || read_nope(&c, layers, l) != 0)
    goto out;
  /* layer_types, when written, must be what HF derives from the above */
  const json_t *lt = json_object_get(c.o, "layer_types");
  if (json_is_array(lt)) {
    for (long i = 0; i < layers; i++) {
      const json_t *e = json_array_get(lt, (size_t)i);
      const char *want = l4_layer_uses_rope(l, (int)i) && l->attention_chunk_size > 0 ? "chunked_attention"
                                                                                       : "full_attention";
      if (!json_is_string(e) || strcmp(json_string_value(e), want) != 0) {
        error("%s: %slayer_types[%ld] is %s; with no_rope_layers and attention_chunk_size as given, HF's "
              "Llama 4 has '%s' there",
              path, c.pre, i, json_is_string(e) ? json_string_value(e) : "not a string", want);
        goto out;
      }
    }
  }
  l->experts_per_token = (int)topk;
  l->tie_word_embeddings = tie;
  l->max_seq_len = maxpos;
  if (tie) {
    error("%s: %stie_word_embeddings is true; optc's model keeps lm_head.weight apart from the embedding", path,
          c.pre);
    goto out;
  }
  rc = 0;
out:
  json_decref(root);
  return rc;
}

/* ---- the recipe's model block against config.json -------------------------------------------- */

/* What the recipe's model block spells out, beside what config.json says. */
typedef struct {
  const char *key, *hf; /* model.KEY; config.json's name */
  enum { F_INT, F_DBL } kind;
  size_t off; /* in L4Config */
} DimKey;

#define DI(k, h, f) {#k, h, F_INT, offsetof(L4Config, f)}
#define DD(k, h, f) {#k, h, F_DBL, offsetof(L4Config, f)}
static const DimKey dim_keys[] = {
    DI(vocab_size, "vocab_size", vocab_size),
    DI(num_layers, "num_hidden_layers", num_layers),
    DI(num_heads, "num_attention_heads", num_heads),
    DI(num_kv_heads, "num_key_value_heads", num_kv_heads),
    DI(embed_dim, "hidden_size", embed_dim),
    DI(head_dim, "head_dim", head_dim),
    DI(hidden_dim, "intermediate_size", hidden_dim),
    DI(shared_hidden_dim, "intermediate_size (HF's shared expert is as wide as each expert)", shared_hidden_dim),
    DI(num_experts, "num_local_experts", num_experts),
    DI(moe_every_n_layers, "interleave_moe_layer_step", moe_every_n_layers),
    DI(mlp_hidden_dim, "intermediate_size_mlp", mlp_hidden_dim),
    DI(use_qk_norm, "use_qk_norm", use_qk_norm),
    DI(skip_rope_interval, "no_rope_layers", skip_rope_interval),
    DI(attention_chunk_size, "attention_chunk_size", attention_chunk_size),
    DD(rope_base, "rope_theta", rope_base),
    DD(rope_scale_factor, "rope_scaling.factor", rope_scale_factor),
    DD(rope_low_freq_factor, "rope_scaling.low_freq_factor", rope_low_freq_factor),
    DD(rope_high_freq_factor, "rope_scaling.high_freq_factor", rope_high_freq_factor),
    DI(rope_old_context_len, "rope_scaling.original_max_position_embeddings", rope_old_context_len),
    DD(norm_eps, "rms_norm_eps", norm_eps),
};
#undef DI
#undef DD

/* Model keys that are no dims: a model block of only these gives none. */
static bool is_dim_key(const char *k) {
  return strcmp(k, "_component_") != 0 && strcmp(k, "max_seq_len") != 0 && strcmp(k, "attn_dropout") != 0;
}

int ckpt_model_config(const TrainConfig *tc, const char *config_path, L4Config *out, bool *multimodal) {
  *multimodal = false;
  const L4Config rc = tc->model;
  if (!config_path) {
    *out = rc;
    return 0;
  }
  L4Config hf;
  bool hf_multimodal;
  if (hf_config_read(config_path, &hf, &hf_multimodal) != 0)
    return -1;
  *multimodal = hf_multimodal;
  const YamlNode *m = yaml_get(tc->r->root, "model");
  int bad = 0;
  for (int i = 0; m && m->kind == YAML_MAP && i < m->n; i++) {
    const char *k = m->keys[i];
    if (!is_dim_key(k))
      continue;
    const DimKey *d = NULL;
    for (size_t j = 0; j < ARRAY_LEN(dim_keys); j++)
      if (strcmp(dim_keys[j].key, k) == 0)
        d = &dim_keys[j];
    char mine[64], theirs[64];
    bool same = true;
    if (d && d->kind == F_INT) {
      int a = *(const int *)((const char *)&rc + d->off), b = *(const int *)((const char *)&hf + d->off);
      same = a == b;
      snprintf(mine, sizeof mine, "%d", a);
      snprintf(theirs, sizeof theirs, "%d", b);
    } else if (d) {
      double a = *(const double *)((const char *)&rc + d->off), b = *(const double *)((const char *)&hf + d->off);
      same = a == b;
      fmt_double(mine, a, false);
      fmt_double(theirs, b, false);
      if (strcmp(k, "rope_scale_factor") != 0 && strncmp(k, "rope_", 5) == 0 && hf.rope_scale_factor <= 0)
        same = true; /* no scaling in config.json: the scaling keys are moot; the factor says it */
    } else if (strcmp(k, "experts_per_token") == 0) {
      same = rc.experts_per_token == hf.experts_per_token;
      snprintf(mine, sizeof mine, "%d", rc.experts_per_token);
      snprintf(theirs, sizeof theirs, "%d", hf.experts_per_token);
    } else if (strcmp(k, "use_scaled_rope") == 0) {
      same = (rc.rope_scale_factor > 0) == (hf.rope_scale_factor > 0);
      snprintf(mine, sizeof mine, "%s", rc.rope_scale_factor > 0 ? "true" : "false");
      snprintf(theirs, sizeof theirs, "%s", hf.rope_scale_factor > 0 ? "llama3 scaling" : "plain RoPE");
    } else if (strcmp(k, "tie_word_embeddings") == 0) {
      same = rc.tie_word_embeddings == hf.tie_word_embeddings;
      snprintf(mine, sizeof mine, "%s", rc.tie_word_embeddings ? "true" : "false");
      snprintf(theirs, sizeof theirs, "%s", hf.tie_word_embeddings ? "true" : "false");
    } else if (strcmp(k, "use_shared_expert") == 0) {
      same = rc.use_shared_expert;
      snprintf(mine, sizeof mine, "false");
      snprintf(theirs, sizeof theirs, "a shared expert in every MoE layer");
    } else {
      continue; /* a key the frontend took that config.json has no say in */
    }
    if (!same) {
      const char *hfname = d ? d->hf : k;
      if (d && strcmp(k, "rope_scale_factor") == 0 && hf.rope_scale_factor <= 0)
        snprintf(theirs, sizeof theirs, "none (plain RoPE)");
      error_at(m->key_pos[i], "model.%s is %s, but %s has %s%s = %s", k, mine, config_path,
               hf_multimodal ? "text_config." : "", hfname, theirs);
      bad++;
    }
  }
  if (bad)
    return -1;
  *out = hf;
  return 0;
}

/* A Llama4ForCausalLM's config.json for c: the keys transformers writes,
 * with the RoPE both as transformers 5 writes it (rope_parameters) and as
 * earlier versions read it (rope_theta, rope_scaling). */
char *hf_config_text(const L4Config *c, Type dtype, long max_positions) {
  json_t *o = json_object();
  json_t *moe = json_array(), *nope = json_array(), *types = json_array();
  for (int i = 0; i < c->num_layers; i++) {
    if (l4_layer_is_moe(c, i))
      json_array_append_new(moe, json_integer(i));
    json_array_append_new(nope, json_integer(l4_layer_uses_rope(c, i)));
    json_array_append_new(types, json_string(l4_layer_uses_rope(c, i) && c->attention_chunk_size > 0
                                                 ? "chunked_attention"
                                                 : "full_attention"));
  }
  json_t *rope = json_object(), *scaling = NULL;
  if (c->rope_scale_factor > 0) {
    scaling = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", c->rope_scale_factor,
                        "low_freq_factor", c->rope_low_freq_factor, "high_freq_factor", c->rope_high_freq_factor,
                        "original_max_position_embeddings", c->rope_old_context_len);
    json_object_update(rope, scaling);
  } else {
    json_object_set_new(rope, "rope_type", json_string("default"));
  }
  json_object_set_new(rope, "rope_theta", json_real(c->rope_base));
  const char *dt = dtype == TY_BF16 ? "bfloat16" : dtype == TY_F16 ? "float16" : "float32";
  json_object_set_new(o, "architectures", json_pack("[s]", "Llama4ForCausalLM"));
  json_object_set_new(o, "model_type", json_string("llama4_text"));
  json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
  json_object_set_new(o, "hidden_size", json_integer(c->embed_dim));
  json_object_set_new(o, "intermediate_size", json_integer(c->hidden_dim));
  json_object_set_new(o, "intermediate_size_mlp", json_integer(c->moe_every_n_layers > 1 ? c->mlp_hidden_dim
                                                                                      : 2 * c->hidden_dim));
  json_object_set_new(o, "num_hidden_layers", json_integer(c->num_layers));
  json_object_set_new(o, "num_attention_heads", json_integer(c->num_heads));
  json_object_set_new(o, "num_key_value_heads", json_integer(c->num_kv_heads));
  json_object_set_new(o, "head_dim", json_integer(c->head_dim));
  json_object_set_new(o, "hidden_act", json_string("silu"));
  json_object_set_new(o, "max_position_embeddings", json_integer(max_positions));
  json_object_set_new(o, "rms_norm_eps", json_real(c->norm_eps));
  json_object_set_new(o, "num_local_experts", json_integer(c->num_experts));
  json_object_set_new(o, "num_experts_per_tok", json_integer(1));
  json_object_set_new(o, "interleave_moe_layer_step", json_integer(MAX(1, c->moe_every_n_layers)));
  json_object_set_new(o, "moe_layers", moe);
  json_object_set_new(o, "use_qk_norm", json_boolean(c->use_qk_norm));
  json_object_set_new(o, "no_rope_layers", nope);
  json_object_set_new(o, "no_rope_layer_interval", json_integer(c->skip_rope_interval > 0 ? c->skip_rope_interval : 4));
  json_object_set_new(o, "attention_chunk_size",
                      c->attention_chunk_size > 0 ? json_integer(c->attention_chunk_size) : json_null());
  json_object_set_new(o, "layer_types", types);
  json_object_set_new(o, "attn_temperature_tuning", json_boolean(c->attn_temperature_tuning));
  json_object_set_new(o, "floor_scale", json_integer((json_int_t)c->attn_floor_scale));
  json_object_set_new(o, "attn_scale", json_real(c->attn_scale));
  json_object_set_new(o, "rope_parameters", rope);
  json_object_set_new(o, "rope_theta", json_real(c->rope_base));
  json_object_set_new(o, "rope_scaling", scaling ? scaling : json_null());
  json_object_set_new(o, "attention_bias", json_false());
  json_object_set_new(o, "tie_word_embeddings", json_false());
  json_object_set_new(o, "dtype", json_string(dt));
  json_object_set_new(o, "torch_dtype", json_string(dt));
  char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
  json_decref(o);
  ASSERT(text);
  size_t n = strlen(text);
  char *withnl = realloc(text, n + 2);
  ASSERT(withnl);
  withnl[n] = '\n';
  withnl[n + 1] = 0;
  return withnl;
}
