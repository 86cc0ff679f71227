/* train.c: the full_finetune_distributed recipe, as torchtune runs it, with
 * the optimizer step compiled (compile.optimizer_step) or eager.
 *
 *   for each step:
 *     zero_grad; for each of gradient_accumulation_steps micro-batches:
 *       forward + backward (summed CE: grads of the summed loss accumulate)
 *     all-reduce the loss sum and the non-ignored token count
 *     the FSDP step: reduce-scatter the grads, scale_grads by 1/num_tokens
 *       (the reduce-scatter sums), clip_grad_norm, the optimizer, all-gather
 *     log: loss, lr, grad norm, tokens_per_second_per_gpu, peak memory
 *     checkpoint every save_every_n_steps and at the end
 *
 * Every rank holds the full params for forward and backward and its slice
 * of the optimizer states; the step's bits do not depend on the world size
 * given the same summed gradients. */
#include "../compiler/passes.h"
#include "coll.h"
#include "data.h"
#include "rt.h"

#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
  /* recipe */
  Recipe *r;
  const char *output_dir, *log_dir, *ckpt_dir;
  const char *init_checkpoint; /* checkpointer.checkpoint_files[0] in checkpoint_dir, if any */
  long steps_per_epoch, total_steps, max_steps, save_every, log_every, eval_every;
  bool resume, compiled;
  /* machinery */
  Coll *coll;
  int rank, world;
  Graph *g, *unopt;
  Executor ex;
  Fsdp f;
  L4Config cfg;
  L4Model *model;
  int ntensors;
  L4Tensor *tensors;
  float **p32, **g32;  /* (ntensors) the model's views: into f.params/f.grads when fp32, else working copies */
  float *pwork, *gwork; /* f32 working copies when params/grads are bf16 */
  Tokenizer tok;
  Dataset *data;
  DataLoader *train, *heldout;
  double *inputs;
  Schedule sched;
  double base_lr;
  /* progress */
  long step; /* optimizer steps done */
  double t_fwdbwd, t_opt, t_coll, t_eval;
  bool options_only; /* bench: no checkpoints, no metrics */
} Trainer;

/* ---- ${key} interpolation, as OmegaConf does for torchtune's configs ------------------- */

static const char *expand(Trainer *t, const char *s) {
  if (!s || !strstr(s, "${"))
    return s;
  Buf b = {0};
  while (*s) {
    const char *open = strstr(s, "${");
    if (!open) {
      buf_puts(&b, s);
      break;
    }
    buf_put(&b, s, (size_t)(open - s));
    const char *close = strchr(open, '}');
    if (!close) {
      buf_puts(&b, open);
      break;
    }
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(close - open - 2), open + 2);
    const YamlNode *v = yaml_get(t->r->root, key);
    buf_puts(&b, v && v->kind == YAML_SCALAR ? v->str : "");
    s = close + 1;
  }
  const char *out = arena_strdup(t->r->arena, b.data ? b.data : "");
  buf_free(&b);
  return out;
}

static const char *str_at(Trainer *t, const YamlNode *map, const char *key, const char *what, const char *def) {
  const YamlNode *v = yaml_get(map, key);
  const char *s;
  if (yaml_is_null(v))
    return def;
  if (!yaml_string(v, what, &s))
    return NULL;
  return expand(t, s);
}

static void mkdir_p(const char *dir) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(tmp, 0755);
      *p = '/';
    }
  mkdir(tmp, 0755);
}

/* ---- memory: fail fast when the recipe cannot fit ------------------------------------- */

static double mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  double kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1)
      break;
  fclose(f);
  return kb * 1024;
}

static double peak_rss(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss * 1024;
}

/* What one rank holds: full params and grads (forward and backward use
 * them), f32 working copies of both when they are 16-bit, the slice of
 * the optimizer states, and the activations of one micro-batch. */
static int check_memory(Trainer *t, int batch, int seq) {
  const Recipe *r = t->r;
  double params = (double)l4_param_count(&t->cfg);
  double per = ceil(params / t->world / OPTC_REDUCE_BLOCK) * OPTC_REDUCE_BLOCK;
  double full = per * t->world;
  double pb = full * type_size(r->param_dtype), gb = full * type_size(r->grad_dtype);
  double work = (r->param_dtype != TY_F32 ? full * 4 : 0) + (r->grad_dtype != TY_F32 ? full * 4 : 0);
  double states = 0;
  for (int b = 0; b < t->g->nbufs; b++)
    if (t->g->bufs[b].kind == BUF_STATE)
      states += per * type_size(t->g->bufs[b].type);
  /* activations: about what l4_create allocates for this batch, estimated
   * per token from the dims (the model is not built yet) */
  double D = t->cfg.embed_dim, H = MAX(t->cfg.hidden_dim, t->cfg.shared_hidden_dim), V = t->cfg.vocab_size;
  double acts = (double)batch * seq * (t->cfg.num_layers * (20 * D + 6 * H) + 64 * V / seq + 4 * D) * 4;
  double need = pb + gb + work + states + acts;
  double avail = mem_available() / t->world;
  if (avail > 0 && need > avail) {
    if (t->rank != 0) /* every rank stops; one says why */
      return -1;
    error("%s needs %.1f GiB per rank (params %.1f + grads %.1f + f32 working copies %.1f + optimizer states %.1f + "
          "activations %.1f GiB) for %.0f parameters on %d rank%s; this machine has %.1f GiB available per rank",
          r->path, need / (1 << 30), pb / (1 << 30), gb / (1 << 30), work / (1 << 30), states / (1 << 30),
          acts / (1 << 30), params, t->world, t->world == 1 ? "" : "s", avail / (1 << 30));
    return -1;
  }
  return 0;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

typedef struct {
  Trainer *t;
  ParamGroup *pg;
} Saving;

/* Model: the params under HF's names, in the recipe's dtype. Optimizer:
 * each param's states under torch's state_dict names and NAME.step.
 * Recipe state: where the run is. All three are written to temporary
 * names and renamed, and `latest` names the directory only once they are. */
static int save_checkpoint(Trainer *t) {
  const Graph *g = t->g;
  ParamGroup pg;
  int64_t *numel = malloc(sizeof(int64_t) * (size_t)t->ntensors);
  for (int i = 0; i < t->ntensors; i++)
    numel[i] = t->tensors[i].numel;
  if (group_alloc(&pg, g, t->ntensors, numel) != 0) {
    free(numel);
    return -1;
  }
  free(numel);
  int rc = fsdp_store(&t->f, &pg); /* every rank takes part in the gather */
  if (rc != 0 || t->rank != 0) {
    group_free(&pg);
    return rc;
  }
  char dir[4096], path[4200];
  snprintf(dir, sizeof dir, "%s/step_%ld", t->ckpt_dir, t->step);
  mkdir_p(dir);
  TensorFile model = {0}, opt = {0};
  for (int i = 0; i < t->ntensors && rc == 0; i++) {
    const L4Tensor *lt = &t->tensors[i];
    for (int b = 0; b < g->nbufs && rc == 0; b++) {
      const Buffer *buf = &g->bufs[b];
      if (buf->kind == BUF_GRAD)
        continue;
      char name[256];
      if (buf->kind == BUF_PARAM)
        snprintf(name, sizeof name, "%s", lt->name);
      else
        snprintf(name, sizeof name, "%s.%s", lt->name, buf->name);
      Tensor *x = tf_add(buf->kind == BUF_PARAM ? &model : &opt, name, (Type)buf->type, lt->ndim, lt->shape);
      if (!x) {
        rc = -1;
        break;
      }
      size_t es = (size_t)type_size(buf->type);
      memcpy(x->data, (char *)pg.bufs[b] + (size_t)pg.layout.offset[i] * es, (size_t)x->numel * es);
    }
    char sname[256];
    snprintf(sname, sizeof sname, "%s.step", lt->name);
    Tensor *st = tf_add(&opt, sname, TY_F32, 0, NULL);
    if (st)
      *(float *)st->data = (float)t->f.step;
  }
  char num[64];
  snprintf(num, sizeof num, "%ld", t->step);
  tf_set_meta(&model, "format", "pt");
  tf_set_meta(&model, "optc.step", num);
  tf_set_meta(&opt, "optc.step", num);
  tf_set_meta(&opt, "optc.optimizer", t->r->component);
  snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
  if (rc == 0)
    rc = st_write(path, &model);
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  if (rc == 0)
    rc = st_write(path, &opt);
  if (rc == 0) {
    json_t *state = json_pack("{s:I, s:I, s:I, s:I, s:I}", "step", (json_int_t)t->step, "epoch",
                              (json_int_t)dataloader_epoch(t->train), "batch", (json_int_t)dataloader_batch_index(t->train),
                              "world_size", (json_int_t)t->world, "seed", (json_int_t)t->r->seed);
    char *text = json_dumps(state, JSON_INDENT(2));
    snprintf(path, sizeof path, "%s/recipe_state.json", dir);
    rc = file_write_atomic(path, text, strlen(text));
    free(text);
    json_decref(state);
  }
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/latest", t->ckpt_dir);
    char rel[64];
    snprintf(rel, sizeof rel, "step_%ld\n", t->step);
    rc = file_write_atomic(path, rel, strlen(rel));
  }
  tf_free(&model);
  tf_free(&opt);
  group_free(&pg);
  if (rc == 0)
    fprintf(stderr, "optc: checkpoint %s\n", dir);
  return rc;
}

/* Reads params (and, when opt is set, optimizer states) from safetensors
 * files with HF names into a whole group on every rank, then loads the
 * slices. */
static int load_checkpoint(Trainer *t, const char *model_path, const char *opt_path) {
  const Graph *g = t->g;
  TensorFile mf = {0}, of = {0};
  if (st_read(model_path, &mf) != 0)
    return -1;
  if (opt_path && st_read(opt_path, &of) != 0) {
    tf_free(&mf);
    return -1;
  }
  ParamGroup pg;
  int64_t *numel = malloc(sizeof(int64_t) * (size_t)t->ntensors);
  for (int i = 0; i < t->ntensors; i++)
    numel[i] = t->tensors[i].numel;
  int rc = group_alloc(&pg, g, t->ntensors, numel);
  free(numel);
  for (int i = 0; rc == 0 && i < t->ntensors; i++) {
    const L4Tensor *lt = &t->tensors[i];
    for (int b = 0; rc == 0 && b < g->nbufs; b++) {
      const Buffer *buf = &g->bufs[b];
      if (buf->kind == BUF_GRAD || (buf->kind == BUF_STATE && !opt_path))
        continue;
      char name[256];
      if (buf->kind == BUF_PARAM)
        snprintf(name, sizeof name, "%s", lt->name);
      else
        snprintf(name, sizeof name, "%s.%s", lt->name, buf->name);
      const Tensor *x = tf_find(buf->kind == BUF_PARAM ? &mf : &of, name);
      if (!x) {
        error("%s: no tensor '%s'", buf->kind == BUF_PARAM ? model_path : opt_path, name);
        rc = -1;
        break;
      }
      if (x->numel != lt->numel || x->dtype != buf->type) {
        error("%s: '%s' is %s with %lld elements; the recipe needs %s with %lld", buf->kind == BUF_PARAM ? model_path : opt_path,
              name, st_dtype_name(x->dtype), (long long)x->numel, type_names[buf->type], (long long)lt->numel);
        rc = -1;
        break;
      }
      size_t es = (size_t)type_size(buf->type);
      memcpy((char *)pg.bufs[b] + (size_t)pg.layout.offset[i] * es, x->data, (size_t)x->numel * es);
    }
  }
  if (rc == 0 && opt_path) {
    char sname[256];
    snprintf(sname, sizeof sname, "%s.step", t->tensors[0].name);
    const Tensor *st = tf_find(&of, sname);
    pg.step = st && st->dtype == TY_F32 ? *(const float *)st->data : 0;
  }
  if (rc == 0)
    rc = fsdp_load(&t->f, &pg, false);
  group_free(&pg);
  tf_free(&mf);
  tf_free(&of);
  return rc;
}

/* ---- the views the model reads and writes ------------------------------------------------ */

static void bind_model(Trainer *t) {
  const Recipe *r = t->r;
  t->p32 = calloc((size_t)t->ntensors, sizeof(float *));
  t->g32 = calloc((size_t)t->ntensors, sizeof(float *));
  if (r->param_dtype != TY_F32)
    t->pwork = calloc((size_t)t->f.P, sizeof(float));
  if (r->grad_dtype != TY_F32)
    t->gwork = calloc((size_t)t->f.P, sizeof(float));
  for (int i = 0; i < t->ntensors; i++) {
    int64_t off = t->f.full.offset[i];
    t->p32[i] = (t->pwork ? t->pwork : (float *)t->f.params) + off;
    t->g32[i] = (t->gwork ? t->gwork : (float *)t->f.grads) + off;
  }
}

/* 16-bit params are widened for the model after every step. */
static void params_to_f32(Trainer *t) {
  if (!t->pwork)
    return;
  const uint16_t *p = t->f.params;
  bool bf = t->r->param_dtype == TY_BF16;
  for (int64_t i = 0; i < t->f.P; i++)
    t->pwork[i] = bf ? optc_bf16_to_f32(p[i]) : optc_f16_to_f32(p[i]);
}

/* f32 grads are rounded (to nearest even) into 16-bit grads, as autocast's
 * backward leaves them in the params' dtype. */
static void grads_from_f32(Trainer *t) {
  if (!t->gwork)
    return;
  uint16_t *gr = t->f.grads;
  bool bf = t->r->grad_dtype == TY_BF16;
  for (int64_t i = 0; i < t->f.P; i++)
    gr[i] = bf ? optc_f32_to_bf16(t->gwork[i]) : optc_f32_to_f16(t->gwork[i]);
}

static void zero_grads(Trainer *t) {
  memset(t->gwork ? (void *)t->gwork : t->f.grads, 0,
         (size_t)t->f.P * (t->gwork ? sizeof(float) : (size_t)type_size(t->r->grad_dtype)));
}

/* ---- evaluation -------------------------------------------------------------------------------- */

/* Mean CE over the held-out split, across ranks. */
static double evaluate(Trainer *t) {
  if (!t->heldout)
    return NAN;
  double t0 = now_seconds();
  double sums[2] = {0, 0};
  L4Batch b;
  while (dataloader_next(t->heldout, &b) == 1) {
    int64_t n;
    sums[0] += l4_run(t->model, t->p32, NULL, &b, &n);
    sums[1] += (double)n;
  }
  coll_all_reduce_sum(t->coll, sums, 2, COLL_F64);
  t->t_eval += now_seconds() - t0;
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

/* ---- setup ----------------------------------------------------------------------------------------- */

static int setup(Trainer *t) {
  Recipe *r = t->r;
  YamlNode *root = r->root;
  if (!r->has_model) {
    error("%s: the recipe has no model section", r->path);
    return -1;
  }
  t->cfg = inventory_l4_config(&r->model);
  t->output_dir = str_at(t, root, "output_dir", "output_dir", "/tmp/optc");
  const YamlNode *ck = yaml_get(root, "checkpointer");
  t->ckpt_dir = ck ? str_at(t, ck, "output_dir", "checkpointer.output_dir", t->output_dir) : t->output_dir;
  const YamlNode *ml = yaml_get(root, "metric_logger");
  t->log_dir = ml ? str_at(t, ml, "log_dir", "metric_logger.log_dir", NULL) : NULL;
  if (!t->log_dir)
    t->log_dir = arena_printf(r->arena, "%s/logs", t->output_dir);
  const YamlNode *v;
  bool b;
  if ((v = yaml_get(root, "resume_from_checkpoint")) && yaml_bool(v, "resume_from_checkpoint", &b))
    t->resume = b;
  long l;
  t->log_every = 1;
  if ((v = yaml_get(root, "log_every_n_steps")) && yaml_int(v, "log_every_n_steps", &l))
    t->log_every = MAX(1, l);
  if ((v = yaml_get(root, "save_every_n_steps")) && !yaml_is_null(v) && yaml_int(v, "save_every_n_steps", &l))
    t->save_every = l;
  if ((v = yaml_get(root, "run_val_every_n_steps")) && !yaml_is_null(v) && yaml_int(v, "run_val_every_n_steps", &l))
    t->eval_every = l;
  t->compiled = r->compile.optimizer_step;
  t->max_steps = r->max_steps;
  if (ck) {
    const YamlNode *files = yaml_get(ck, "checkpoint_files");
    const char *cdir = str_at(t, ck, "checkpoint_dir", "checkpointer.checkpoint_dir", NULL);
    if (files && files->kind == YAML_SEQ && files->n > 0 && files->items[0]->kind == YAML_SCALAR && cdir)
      t->init_checkpoint = arena_printf(r->arena, "%s/%s", cdir, expand(t, files->items[0]->str));
  }

  /* the step graph: compiled, or the front end's graph run eagerly */
  t->g = frontend_build(r);
  if (!t->g)
    return -1;
  t->unopt = graph_clone(t->g, r->arena);
  if (!pipeline_run(t->g, &(PipelineOptions){0}))
    return -1;

  /* the data, from the tokenizer's max_seq_len */
  const YamlNode *tn = yaml_get(root, "tokenizer");
  if (!tn) {
    error("%s: the recipe has no tokenizer section (e.g. {_component_: optc.tokenizers.byte_tokenizer, max_seq_len: 128})",
          r->path);
    return -1;
  }
  int seq = (int)MIN(r->model.max_seq_len, 2048);
  if (check_memory(t, (int)r->batch_size, seq) != 0)
    return -1;
  if (!tokenizer_from_config(tn, &t->tok))
    return -1;
  if (t->tok.max_seq_len > 0)
    seq = MIN(seq, t->tok.max_seq_len);
  if (t->tok.vocab_size > t->cfg.vocab_size) {
    error("the tokenizer's vocabulary (%d) is larger than model.vocab_size (%d)", t->tok.vocab_size, t->cfg.vocab_size);
    return -1;
  }
  t->data = dataset_from_config(yaml_get(root, "dataset"), &t->tok, seq);
  if (!t->data)
    return -1;
  LoaderOptions lo = {(int)r->batch_size, r->shuffle, (uint64_t)r->seed, t->rank, t->world, true};
  t->train = dataloader_create(t->data, SPLIT_TRAIN, &lo);
  if (!t->train)
    return -1;
  if (dataset_num_samples(t->data, SPLIT_HELDOUT) > 0) {
    LoaderOptions eo = {(int)r->batch_size, false, 0, t->rank, t->world, false};
    t->heldout = dataloader_create(t->data, SPLIT_HELDOUT, &eo);
  }
  long batches = dataloader_num_batches(t->train);
  t->steps_per_epoch = batches / r->gradient_accumulation_steps;
  if (r->max_steps_per_epoch > 0)
    t->steps_per_epoch = MIN(t->steps_per_epoch, r->max_steps_per_epoch);
  if (t->steps_per_epoch < 1) {
    error("%s: one step needs %ld micro-batches of %ld on each of %d ranks; the dataset has %d training rows", r->path,
          r->gradient_accumulation_steps, r->batch_size, t->world, dataset_num_samples(t->data, SPLIT_TRAIN));
    return -1;
  }
  /* torchtune: num_training_steps = epochs * steps_per_epoch; max_steps only stops early */
  t->total_steps = r->epochs * t->steps_per_epoch;
  if (sched_from_recipe(r, t->total_steps, &t->sched) != 0)
    return -1;

  /* the model, its parameters in one sharded group */
  char why[512];
  t->model = l4_create(&t->cfg, (int)r->batch_size, seq, why, sizeof why);
  if (!t->model) {
    error("%s: %s", r->path, why);
    return -1;
  }
  t->ntensors = l4_tensors(&t->cfg, NULL);
  t->tensors = calloc((size_t)t->ntensors, sizeof(L4Tensor));
  l4_tensors(&t->cfg, t->tensors);
  int64_t *numel = malloc(sizeof(int64_t) * (size_t)t->ntensors);
  for (int i = 0; i < t->ntensors; i++)
    numel[i] = t->tensors[i].numel;
  int rc = fsdp_init(&t->f, t->coll, t->g, t->ntensors, numel);
  free(numel);
  if (rc != 0)
    return -1;
  bind_model(t);
  int threads = MAX(1, pool_default_threads() / t->world);
  openblas_set_num_threads(threads);
  if (executor_init(&t->ex, t->compiled ? BACKEND_CPU : BACKEND_EAGER, t->g, t->unopt, threads, NULL) != 0)
    return -1;
  t->inputs = calloc((size_t)t->g->nins + 1, sizeof(double));
  Binding first = {"step", 1};
  if (inputs_resolve(t->g, NULL, 0, &first, 1, t->inputs) != 0)
    return -1;
  Ref lr = graph_find_input(t->g, "lr");
  t->base_lr = lr != NOREF ? t->inputs[lr] : 0;

  /* the weights: a checkpoint to resume, the recipe's checkpoint files, or
   * a seeded initialisation (every rank the same) */
  if (t->resume) {
    char path[4200];
    snprintf(path, sizeof path, "%s/latest", t->ckpt_dir);
    char *latest = file_read_quiet(path, NULL);
    if (!latest) {
      error("resume_from_checkpoint: no checkpoint to resume in %s (no 'latest' file)", t->ckpt_dir);
      return -1;
    }
    latest[strcspn(latest, "\n")] = 0;
    char dir[4200], mp[4300], op[4300], sp[4300];
    snprintf(dir, sizeof dir, "%s/%s", t->ckpt_dir, latest);
    free(latest);
    snprintf(mp, sizeof mp, "%s/model-00001-of-00001.safetensors", dir);
    snprintf(op, sizeof op, "%s/optimizer.safetensors", dir);
    snprintf(sp, sizeof sp, "%s/recipe_state.json", dir);
    if (load_checkpoint(t, mp, op) != 0)
      return -1;
    json_error_t je;
    json_t *st = json_load_file(sp, 0, &je);
    if (!st) {
      error("%s:%d: %s", sp, je.line, je.text);
      return -1;
    }
    t->step = (long)json_integer_value(json_object_get(st, "step"));
    long epoch = (long)json_integer_value(json_object_get(st, "epoch"));
    long batch = (long)json_integer_value(json_object_get(st, "batch"));
    long was = (long)json_integer_value(json_object_get(st, "world_size"));
    json_decref(st);
    if (was != t->world) {
      error("%s was saved by %ld rank%s; resume it with --nproc %ld", dir, was, was == 1 ? "" : "s", was);
      return -1;
    }
    dataloader_seek(t->train, (int)epoch, (int)batch);
    if (t->rank == 0)
      fprintf(stderr, "optc: resuming %s at step %ld\n", dir, t->step);
  } else if (t->init_checkpoint && access(t->init_checkpoint, R_OK) == 0) {
    if (load_checkpoint(t, t->init_checkpoint, NULL) != 0)
      return -1;
  } else {
    float **full = calloc((size_t)t->ntensors, sizeof(float *));
    float *buf = t->pwork ? t->pwork : t->f.params;
    for (int i = 0; i < t->ntensors; i++)
      full[i] = buf + t->f.full.offset[i];
    l4_init_params(&t->cfg, full, (uint64_t)(r->has_seed ? r->seed : 0));
    free(full);
    if (t->pwork) { /* round the f32 init to the params' dtype, then widen back */
      uint16_t *p = t->f.params;
      for (int64_t i = 0; i < t->f.P; i++)
        p[i] = r->param_dtype == TY_BF16 ? optc_f32_to_bf16(t->pwork[i]) : optc_f32_to_f16(t->pwork[i]);
    }
  }
  params_to_f32(t);
  return 0;
}

/* ---- the loop ---------------------------------------------------------------------------------------- */

typedef struct {
  double loss, lr, grad_norm, tokens, seconds;
  bool skipped;
} StepLog;

static int train_step(Trainer *t, StepLog *log) {
  const Recipe *r = t->r;
  double t0 = now_seconds();
  zero_grads(t);
  double sums[2] = {0, 0}; /* loss, tokens */
  for (long a = 0; a < r->gradient_accumulation_steps; a++) {
    L4Batch b;
    if (dataloader_next(t->train, &b) != 1 && dataloader_next(t->train, &b) != 1) {
      error("the training loader gave no batch");
      return -1;
    }
    int64_t n;
    sums[0] += l4_run(t->model, t->p32, t->g32, &b, &n);
    sums[1] += (double)n;
  }
  grads_from_f32(t);
  double t1 = now_seconds();
  if (coll_all_reduce_sum(t->coll, sums, 2, COLL_F64) != 0)
    return -1;
  /* the reduce-scatter sums the ranks' grads of summed losses: scale_grads
   * by 1 / (all ranks' counted tokens), torchtune's normalisation */
  Ref nt = graph_find_input(t->g, "num_tokens"), ws = graph_find_input(t->g, "world_size");
  Ref sr = graph_find_input(t->g, "step"), lr = graph_find_input(t->g, "lr");
  if (nt != NOREF)
    t->inputs[nt] = MAX(1.0, sums[1]);
  if (ws != NOREF)
    t->inputs[ws] = 1.0;
  if (sr != NOREF)
    t->inputs[sr] = t->f.step + 1;
  log->lr = sched_lr(&t->sched, t->base_lr, t->step + 1);
  if (lr != NOREF)
    t->inputs[lr] = log->lr;
  double t2 = now_seconds();
  StepResult res;
  if (fsdp_step(&t->f, &t->ex, t->inputs, &res) != 0)
    return -1;
  double t3 = now_seconds();
  if (!res.skipped)
    params_to_f32(t);
  if (res.skipped && r->nonfinite == NONFINITE_ERROR) {
    error("step %ld: non-finite gradients (nonfinite_grads: error)", t->step + 1);
    return -1;
  }
  t->step++;
  log->loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  log->tokens = sums[1];
  log->grad_norm = r->has_clip && res.nred > 0 ? sqrt(res.red[0]) : NAN;
  log->skipped = res.skipped;
  log->seconds = now_seconds() - t0;
  t->t_fwdbwd += t1 - t0;
  t->t_coll += t2 - t1;
  t->t_opt += t3 - t2;
  return 0;
}

static void progress(const Trainer *t, const StepLog *log, long last) {
  int width = 30, done = (int)(width * t->step / MAX(1, last));
  fprintf(stderr, "\r  %ld/%ld [", t->step, last);
  for (int i = 0; i < width; i++)
    fputc(i < done ? '=' : i == done ? '>' : ' ', stderr);
  fprintf(stderr, "] loss %.4f  lr %.3g  %.0f tok/s/rank ", log->loss, log->lr,
          log->tokens / (log->seconds * t->world));
  fflush(stderr);
}

int train_run(Recipe *r, Coll *coll, const TrainOptions *opt, TrainResult *out) {
  Trainer t = {.r = r, .coll = coll, .rank = coll_rank(coll), .world = coll_size(coll)};
  t.options_only = opt && opt->bench;
  int rc = -1;
  FILE *metrics = NULL;
  if (setup(&t) != 0)
    goto out;
  long last = t.total_steps;
  if (t.max_steps > 0)
    last = MIN(last, t.max_steps);
  if (opt && opt->steps > 0)
    last = MIN(t.step + opt->steps, t.total_steps);
  bool talk = t.rank == 0 && !(opt && opt->quiet);
  bool tty = talk && isatty(2);
  if (talk) {
    Buf d = {0};
    dataset_describe(t.data, &d);
    fprintf(stderr, "optc run: %s, %ld parameters in %d tensors, %d rank%s, optimizer %s (%s)\n", r->path,
            (long)l4_param_count(&t.cfg), t.ntensors, t.world, t.world == 1 ? "" : "s", r->component,
            t.compiled ? "compiled" : "eager");
    fprintf(stderr, "  data: %s\n  %ld steps of %ld micro-batches x %ld rows x %d ranks; %ld steps per epoch\n", d.data,
            last - t.step, r->gradient_accumulation_steps, r->batch_size, t.world, t.steps_per_epoch);
    buf_free(&d);
  }
  if (t.rank == 0 && !t.options_only) {
    mkdir_p(t.log_dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t.log_dir);
    metrics = fopen(path, t.resume ? "a" : "w");
    if (!metrics) {
      error("cannot write %s", path);
      goto out;
    }
  }
  double tokens = 0, seconds = 0, first_loss = NAN, last_loss = NAN;
  double held0 = opt && opt->eval ? evaluate(&t) : NAN;
  if (talk && !isnan(held0))
    fprintf(stderr, "  held-out loss before: %.4f\n", held0);
  while (t.step < last) {
    StepLog log;
    if (train_step(&t, &log) != 0)
      goto out;
    tokens += log.tokens;
    seconds += log.seconds;
    if (isnan(first_loss))
      first_loss = log.loss;
    last_loss = log.loss;
    if (out && out->losses && t.step - 1 < out->max_losses)
      out->losses[out->nlosses++] = log.loss;
    double peak = peak_rss();
    if (metrics) {
      /* JSON has no NaN: a missing value is null */
      char loss[32], gn[32];
      snprintf(loss, sizeof loss, isfinite(log.loss) ? "%.9g" : "null", log.loss);
      snprintf(gn, sizeof gn, isfinite(log.grad_norm) ? "%.9g" : "null", log.grad_norm);
      fprintf(metrics,
              "{\"step\": %ld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens\": %.0f, "
              "\"tokens_per_second_per_gpu\": %.6g, \"peak_memory_gib\": %.4f, \"skipped\": %s}\n",
              t.step, loss, log.lr, gn, log.tokens, log.tokens / (log.seconds * t.world), peak / (1 << 30),
              log.skipped ? "true" : "false");
      fflush(metrics);
    }
    if (tty)
      progress(&t, &log, last);
    else if (talk && (t.step % t.log_every == 0 || t.step == last))
      fprintf(stderr, "  step %ld/%ld  loss %.4f  lr %.4g  grad_norm %.4g  %.0f tokens/s/rank  peak %.2f GiB%s\n",
              t.step, last, log.loss, log.lr, log.grad_norm, log.tokens / (log.seconds * t.world), peak / (1 << 30),
              log.skipped ? "  (skipped: non-finite grads)" : "");
    if (t.eval_every > 0 && t.step % t.eval_every == 0) {
      double h = evaluate(&t);
      if (talk)
        fprintf(stderr, "%s  held-out loss at step %ld: %.4f\n", tty ? "\n" : "", t.step, h);
    }
    if (!t.options_only && t.save_every > 0 && t.step % t.save_every == 0 && t.step != last)
      if (save_checkpoint(&t) != 0)
        goto out;
  }
  if (tty)
    fputc('\n', stderr);
  if (!t.options_only && save_checkpoint(&t) != 0)
    goto out;
  double held = opt && opt->eval ? evaluate(&t) : NAN;
  if (talk) {
    fprintf(stderr, "  loss %.4f -> %.4f over %ld steps; %.0f tokens/s/rank (%s optimizer)\n", first_loss, last_loss,
            t.step, tokens / (seconds * t.world), t.compiled ? "compiled" : "eager");
    if (!isnan(held))
      fprintf(stderr, "  held-out loss: %.4f -> %.4f\n", held0, held);
    fprintf(stderr, "  time: forward+backward %.2f s, collectives %.2f s, optimizer %.2f s, eval %.2f s\n", t.t_fwdbwd,
            t.t_coll, t.t_opt, t.t_eval);
  }
  if (out) {
    out->first_loss = first_loss;
    out->last_loss = last_loss;
    out->heldout_before = held0;
    out->heldout_after = held;
    out->tokens_per_second = tokens / (seconds * t.world);
    out->t_fwdbwd = t.t_fwdbwd;
    out->t_coll = t.t_coll;
    out->t_opt = t.t_opt;
    out->steps = t.step;
  }
  rc = 0;
out:
  if (metrics)
    fclose(metrics);
  if (t.model)
    l4_free(t.model);
  if (t.train)
    dataloader_free(t.train);
  if (t.heldout)
    dataloader_free(t.heldout);
  if (t.data)
    dataset_free(t.data);
  if (t.f.g)
    fsdp_free(&t.f);
  executor_free(&t.ex);
  free(t.tensors);
  free(t.p32);
  free(t.g32);
  free(t.pwork);
  free(t.gwork);
  free(t.inputs);
  return rc;
}
