/* l4_hf_check: one forward and backward of optc's Llama 4 model, in double,
 * on weights and a batch from files, for tests/torch/test_llama4_hf.py,
 * which runs transformers' Llama4ForCausalLM beside it.
 *
 *   l4_hf_check WEIGHTS BATCH OUT
 *
 * WEIGHTS is a safetensors file of HF-named tensors (F32 or F64), exactly
 * those l4_tensors lists, with the L4Config in its metadata: one key per
 * field, by the field's name (vocab_size, moe_every_n_layers, rope_base,
 * ...); a field not given keeps l4_config_scout's value, a key that is no
 * field is an error. BATCH holds tokens and targets, (B, T) I32 or I64, and
 * optionally positions and segments. OUT gets loss (the summed token loss,
 * F64 scalar), ntokens (I64 scalar) and, under each parameter's name, its
 * gradient of that sum in F64. Exits 1, with a message, on any mistake. */
#include "train.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define FIELD(f, is_double) {#f, offsetof(L4Config, f), is_double}
static const struct {
  const char *name;
  size_t off;
  int is_double;
} fields[] = {
  FIELD(vocab_size, 0), FIELD(num_layers, 0), FIELD(num_heads, 0), FIELD(num_kv_heads, 0),
  FIELD(embed_dim, 0), FIELD(head_dim, 0), FIELD(hidden_dim, 0), FIELD(shared_hidden_dim, 0),
  FIELD(num_experts, 0), FIELD(moe_every_n_layers, 0), FIELD(mlp_hidden_dim, 0),
  FIELD(skip_rope_interval, 0), FIELD(use_qk_norm, 0), FIELD(attention_chunk_size, 0),
  FIELD(rope_base, 1), FIELD(rope_scale_factor, 1), FIELD(rope_low_freq_factor, 1),
  FIELD(rope_high_freq_factor, 1), FIELD(rope_old_context_len, 0), FIELD(norm_eps, 1),
  FIELD(attn_temperature_tuning, 0), FIELD(attn_floor_scale, 1), FIELD(attn_scale, 1),
};
#undef FIELD

static int config_from_meta(const char *path, const TensorFile *tf, L4Config *c) {
  *c = l4_config_scout();
  for (int k = 0; k < tf->nmeta; k++) {
    const char *key = tf->meta_keys[k], *val = tf->meta_vals[k];
    size_t i = 0;
    while (i < ARRAY_LEN(fields) && strcmp(fields[i].name, key) != 0)
      i++;
    if (i == ARRAY_LEN(fields)) {
      error("%s: metadata key '%s' is no L4Config field", path, key);
      return -1;
    }
    char *end;
    double v = strtod(val, &end);
    if (end == val || *end) {
      error("%s: metadata %s = '%s' is not a number", path, key, val);
      return -1;
    }
    char *p = (char *)c + fields[i].off;
    if (fields[i].is_double) {
      *(double *)p = v;
    } else if (v != (int)v) {
      error("%s: metadata %s = '%s' is not an integer", path, key, val);
      return -1;
    } else {
      *(int *)p = (int)v;
    }
  }
  return 0;
}

/* dst (n doubles) from t's F32 or F64 data */
static void to_f64(double *dst, const Tensor *t) {
  for (int64_t j = 0; j < t->numel; j++)
    dst[j] = t->dtype == TY_F64 ? ((const double *)t->data)[j] : ((const float *)t->data)[j];
}

/* The (B, T) ids called name, as int32, into a malloc'd array the caller
 * frees; NULL when absent and optional. */
static int batch_ids(const char *path, const TensorFile *tf, const char *name, bool required, int *B,
                     int *T, int32_t **out) {
  *out = NULL;
  const Tensor *t = tf_find(tf, name);
  if (!t) {
    if (required)
      error("%s: no tensor '%s'", path, name);
    return required ? -1 : 0;
  }
  if (t->ndim != 2 || (t->dtype != TY_I32 && t->dtype != TY_I64)) {
    error("%s: %s must be (B, T) I32 or I64", path, name);
    return -1;
  }
  if (*B && (t->shape[0] != *B || t->shape[1] != *T)) {
    error("%s: %s is (%lld, %lld), tokens (%d, %d)", path, name, (long long)t->shape[0],
          (long long)t->shape[1], *B, *T);
    return -1;
  }
  *B = (int)t->shape[0], *T = (int)t->shape[1];
  *out = malloc(sizeof(int32_t) * (size_t)t->numel);
  ASSERT(*out);
  for (int64_t j = 0; j < t->numel; j++)
    (*out)[j] = t->dtype == TY_I32 ? ((const int32_t *)t->data)[j] : (int32_t)((const int64_t *)t->data)[j];
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: l4_hf_check WEIGHTS.safetensors BATCH.safetensors OUT.safetensors\n");
    return 2;
  }
  const char *wpath = argv[1], *bpath = argv[2], *opath = argv[3];
  TensorFile wf = {0}, bf = {0}, of = {0};
  L4Config c;
  L4Tensor *ts = NULL;
  double **p = NULL, **g = NULL;
  int32_t *tok = NULL, *tgt = NULL, *pos = NULL, *seg = NULL;
  L4Model *m = NULL;
  int rc = 1, n = 0, B = 0, T = 0;
  char err[256];
  if (st_read(wpath, &wf) != 0 || st_read(bpath, &bf) != 0 || config_from_meta(wpath, &wf, &c) != 0)
    goto out;

  /* the weights: exactly the model's tensors, by name and shape */
  n = l4_tensors(&c, NULL);
  ts = calloc((size_t)n, sizeof *ts);
  p = calloc((size_t)n, sizeof *p);
  g = calloc((size_t)n, sizeof *g);
  ASSERT(ts && p && g);
  l4_tensors(&c, ts);
  if (wf.n != n) {
    error("%s: %d tensors; the config's model has %d", wpath, wf.n, n);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    const Tensor *t = tf_find(&wf, ts[i].name);
    if (!t) {
      error("%s: no tensor '%s'", wpath, ts[i].name);
      goto out;
    }
    bool same = t->ndim == ts[i].ndim && (t->dtype == TY_F32 || t->dtype == TY_F64);
    for (int k = 0; same && k < t->ndim; k++)
      same = t->shape[k] == ts[i].shape[k];
    if (!same) {
      error("%s: %s is not F32/F64 of the model's shape (%lld, %lld, %lld)", wpath, ts[i].name,
            (long long)ts[i].shape[0], (long long)ts[i].shape[1], (long long)ts[i].shape[2]);
      goto out;
    }
    p[i] = malloc(sizeof(double) * (size_t)ts[i].numel);
    g[i] = calloc((size_t)ts[i].numel, sizeof(double));
    ASSERT(p[i] && g[i]);
    to_f64(p[i], t);
  }

  if (batch_ids(bpath, &bf, "tokens", true, &B, &T, &tok) != 0 ||
      batch_ids(bpath, &bf, "targets", true, &B, &T, &tgt) != 0 ||
      batch_ids(bpath, &bf, "positions", false, &B, &T, &pos) != 0 ||
      batch_ids(bpath, &bf, "segments", false, &B, &T, &seg) != 0)
    goto out;
  for (int j = 0; j < B * T; j++)
    if (tok[j] < 0 || tok[j] >= c.vocab_size || (tgt[j] != -100 && (tgt[j] < 0 || tgt[j] >= c.vocab_size)) ||
        (pos && pos[j] < 0)) {
      error("%s: token %d, target %d or position at %d is out of range", bpath, tok[j], tgt[j], j);
      goto out;
    }

  m = l4_create_f64(&c, B, T, err, sizeof err);
  if (!m) {
    error("%s: %s", wpath, err);
    goto out;
  }
  L4Batch b = {.tokens = tok, .targets = tgt, .positions = pos, .segments = seg, .B = B, .T = T};
  int64_t ntokens;
  double loss = l4_run_f64(m, p, g, &b, &ntokens);

  Tensor *t = tf_add(&of, "loss", TY_F64, 0, NULL);
  ASSERT(t);
  *(double *)t->data = loss;
  t = tf_add(&of, "ntokens", TY_I64, 0, NULL);
  ASSERT(t);
  *(int64_t *)t->data = ntokens;
  for (int i = 0; i < n; i++) {
    t = tf_add(&of, ts[i].name, TY_F64, ts[i].ndim, ts[i].shape);
    ASSERT(t);
    memcpy(t->data, g[i], sizeof(double) * (size_t)ts[i].numel);
  }
  if (st_write(opath, &of) != 0)
    goto out;
  rc = 0;
out:
  l4_free(m);
  for (int i = 0; p && i < n; i++)
    free(p[i]), free(g[i]);
  free(p), free(g), free(ts), free(tok), free(tgt), free(pos), free(seg);
  tf_free(&wf), tf_free(&bf), tf_free(&of);
  return rc;
}
