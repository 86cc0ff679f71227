/* train.c: the full_finetune_distributed recipe, as torchtune runs it, with
 * the optimizer step compiled (compile.optimizer_step) or eager.
 *
 *   for each step:
 *     for each of gradient_accumulation_steps micro-batches:
 *       forward + backward (summed CE: grads of the summed loss accumulate),
 *       unit by unit as FSDP2 runs a model (fsdp_run.c): each unit's params
 *       all-gathered before its use and freed after, its grads
 *       reduce-scattered after its backward on the last micro-batch
 *     all-reduce the loss sum and the non-ignored token count
 *     the step over this rank's shard: scale_grads by 1/num_tokens (the
 *       reduce-scatter sums), clip_grad_norm, the optimizer
 *     log: loss, lr, grad norm, tokens_per_second_per_gpu, peak memory
 *     checkpoint every save_every_n_steps and at the end
 *
 * A rank holds its shard of the params, the reduced grads and the optimizer
 * states (fsdp.c), and of the whole model only the units in use; the bits do
 * not depend on the world size given the same summed gradients. */
#include "train.h"

#include "blas.h"
#include "data.h"
#include "passes.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
  /* recipe */
  Recipe *r;              /* the optimizer spec and the document */
  const TrainConfig *tc;  /* the rest: model, batch, how long */
  const char *output_dir, *log_dir, *ckpt_dir;
  CkptConfig ck;      /* the checkpointer block; ckpt_dir is its output_dir */
  const char *hf_config; /* checkpoint_dir/config.json when there is one */
  bool multimodal;    /* a Llama4ForConditionalGeneration checkpoint: the decoder under language_model. */
  CkptDir src;        /* the checkpoint loaded, kept open when it has tensors passed through */
  bool have_src;
  long steps_per_epoch, total_steps, max_steps, save_every, log_every, eval_every;
  bool resume, compiled;
  /* machinery */
  Coll *coll;
  int rank, world;
  Graph *g, *unopt;
  Executor ex;
  Executor ex_unit;   /* optimizer_in_bwd on the collectives' thread: the step on that thread alone */
  bool in_bwd;        /* optimizer_in_bwd: each unit stepped once its grads are in (step_unit) */
  bool norm_in_bwd;   /* else the step's norm pass, unit by unit, once each unit's grads are in */
  Fsdp f;
  L4Config cfg;
  L4Model *model;
  ThreadPool *pool; /* the model's phases; the BLAS runs single-threaded inside them */
  int ntensors;
  L4Tensor *tensors;
  FsdpRun *run;       /* the model's units over f: its hooks, and the params and grads it runs with */
  Tokenizer tok;
  Dataset *data;
  DataLoader *train, *heldout;
  double *inputs;
  Schedule sched;
  double base_lr;
  /* progress */
  long step; /* optimizer steps done */
  double t_fwdbwd, t_opt, t_coll, t_eval;
  double t_units, t_units_waited; /* the units' gathers and reduces: their time, and what the model waited */
  double t_opt_hidden;            /* optimizer_in_bwd: of t_opt, what ran beside the backward */
  bool options_only; /* bench: no checkpoints, no metrics */
} Trainer;

/* ---- the recipe's keys (their ${key} references resolved when it loaded) -------------- */

static const char *str_at(const YamlNode *map, const char *key, const char *what, const char *def) {
  const YamlNode *v = yaml_get(map, key);
  const char *s;
  if (yaml_is_null(v))
    return def;
  return yaml_string(v, what, &s) ? s : NULL;
}

/* ---- memory: fail fast when the recipe cannot fit ------------------------------------- */

/* The bytes a /proc file gives for `KEY: N kB` (0 when it has none). */
static double proc_kb_bytes(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  char line[256];
  size_t n = strlen(key);
  double kb = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%lf", &kb) == 1)
      break;
  fclose(f);
  return kb * 1024;
}

static double mem_available(void) { return proc_kb_bytes("/proc/meminfo", "MemAvailable"); }

static double peak_rss(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss * 1024;
}

/* This process's resident bytes now, 0 where /proc has none. */
static double resident_now(void) { return proc_kb_bytes("/proc/self/status", "VmRSS"); }

/* optc's fsdp_overlap: the units' collectives on a thread of their own,
 * beside the compute: auto (the default) when the ranks span several
 * machines, whose network moves the data while the cores compute; on one
 * machine a collective is the cores copying memory, which only competes
 * with the compute (measured: bench/results.md). */
static bool fsdp_overlap(const Recipe *r, const Coll *coll, bool *ok) {
  const YamlNode *v = yaml_get(r->root, "fsdp_overlap");
  *ok = true;
  if (!v || yaml_is_null(v) || (v->kind == YAML_SCALAR && !strcmp(v->str, "auto")))
    return coll && coll_hosts(coll) > 1;
  const char *x = v->kind == YAML_SCALAR ? v->str : "";
  bool yes = !strcmp(x, "true") || !strcmp(x, "True"), no = !strcmp(x, "false") || !strcmp(x, "False");
  if (!yes && !no) {
    error_at(v->pos, "fsdp_overlap: expected auto, true or false, found '%s'", x);
    *ok = false;
  }
  return yes;
}

/* enable_activation_checkpointing, torchtune's default False. */
static bool activation_checkpointing(const Recipe *r, bool *ok) {
  const YamlNode *v = yaml_get(r->root, "enable_activation_checkpointing");
  bool b = false;
  *ok = !v || yaml_is_null(v) || yaml_bool(v, "enable_activation_checkpointing", &b);
  return b;
}

/* fsdp_reshard_after_forward, torchtune's default True. */
static bool reshard_after_forward(const Recipe *r, bool *ok) {
  const YamlNode *v = yaml_get(r->root, "fsdp_reshard_after_forward");
  bool b = true;
  *ok = !v || yaml_is_null(v) || yaml_bool(v, "fsdp_reshard_after_forward", &b);
  return b;
}

void rank_memory(const TrainConfig *tc, const L4Config *c, const Graph *g, int world, int batch, int seq,
                 int threads, bool overlap, RankMemory *m) {
  const Recipe *r = tc->r;
  /* the shards as fsdp_init lays them out, in the model's units */
  int n = l4_tensors(c, NULL), nunits = l4_units(c, NULL);
  L4Tensor *tt = malloc(sizeof(L4Tensor) * (size_t)n);
  int64_t *numel = malloc(sizeof(int64_t) * (size_t)n);
  int *first = malloc(sizeof(int) * (size_t)(nunits + 1));
  ASSERT(tt && numel && first);
  l4_tensors(c, tt);
  l4_units(c, first);
  for (int i = 0; i < n; i++)
    numel[i] = tt[i].numel;
  int64_t most;
  double shard = (double)fsdp_plan(n, numel, nunits, first, world, graph_align(g), &most) + OPTC_TENSOR_ALIGN;
  *m = (RankMemory){0};
  for (int b = 0; b < g->nbufs; b++) {
    double bytes = shard * buffer_elem_bytes(g, b); /* a quantized state: its codes, its scale per block */
    if (g->bufs[b].kind == BUF_PARAM)
      m->params += bytes;
    else if (g->bufs[b].kind == BUF_GRAD)
      m->grads += bytes;
    else
      m->states += bytes;
  }
  /* the units in use: the spans fsdp_run.c's hooks hold at most at once */
  bool ok;
  FsdpRunOptions o = {.reshard_after_forward = reshard_after_forward(r, &ok), .training = true, .overlap = overlap};
  fsdp_run_plan_spans(&o, r->param_dtype, r->grad_dtype, world, nunits, (int)tc->gradient_accumulation_steps,
                      &m->wide, &m->narrow);
  m->span_elems = (double)most + 1;
  m->spans = m->span_elems * (4.0 * m->wide + 2.0 * m->narrow);
  m->acts = (double)l4_workspace_bytes_ac(c, batch, seq, threads, activation_checkpointing(r, &ok));
  m->process = resident_now();
  m->total = m->params + m->grads + m->states + m->spans + m->acts + m->process;
  free(tt);
  free(numel);
  free(first);
}

/* Fails fast when a rank's holdings (rank_memory) exceed what the machine
 * has available per rank. */
static int check_memory(Trainer *t, int batch, int seq) {
  const Recipe *r = t->r;
  const TrainConfig *tc = t->tc;
  RankMemory m;
  bool ok;
  rank_memory(tc, &t->cfg, t->g, t->world, batch, seq, MAX(1, pool_default_threads() / t->world),
              fsdp_overlap(r, t->coll, &ok), &m);
  if (!ok)
    return -1;
  double avail = mem_available() / t->world;
  if (avail > 0 && m.total > avail) {
    if (t->rank != 0) /* every rank stops; one says why */
      return -1;
    error("%s needs %.1f GiB per rank (the shards of the params %.1f + grads %.1f + optimizer states %.1f, the "
          "units in use %.1f, activations %.1f, the process %.1f GiB) for %.0f parameters on %d rank%s; this "
          "machine has %.1f GiB available per rank",
          r->path, m.total / (1 << 30), m.params / (1 << 30), m.grads / (1 << 30), m.states / (1 << 30),
          m.spans / (1 << 30), m.acts / (1 << 30), m.process / (1 << 30), (double)l4_param_count(&t->cfg), t->world,
          t->world == 1 ? "" : "s", avail / (1 << 30));
    /* What would: the fewest ranks with a machine like this one each
     * (the shards shrink with the ranks; the units in use, the
     * activations and the process do not). */
    double machine = mem_available();
    int threads = pool_default_threads(), need = 0;
    RankMemory x, most; /* most: on very many ranks, where the shards are nearly nothing */
    rank_memory(tc, &t->cfg, t->g, 4096, batch, seq, threads, fsdp_overlap(r, t->coll, &ok), &most);
    double floor = most.spans + most.acts + most.process;
    for (int n = t->world; n <= 4096 && !need && most.total <= machine; n = n < 64 ? n + 1 : n * 2) {
      rank_memory(tc, &t->cfg, t->g, n, batch, seq, threads, fsdp_overlap(r, t->coll, &ok), &x);
      if (x.total <= machine)
        need = n;
    }
    if (need)
      fprintf(stderr, "optc: %d ranks of one such machine each would hold it: %.1f GiB each (shards %.1f, units in "
                      "use %.1f, activations %.1f GiB); a multi-node MPI job: mpirun -np %d --hostfile HOSTS optc run "
                      "--mpi-rank full_finetune_distributed --config %s\n",
              need, x.total / (1 << 30), (x.params + x.grads + x.states) / (1 << 30), x.spans / (1 << 30),
              x.acts / (1 << 30), need, r->path);
    else
      fprintf(stderr, "optc: on any number of ranks each needs at least %.1f GiB: the units in use (the largest "
                      "unit's params and grads whole, %.0f elements, as f32) %.1f GiB, activations %.1f GiB and the "
                      "process; this machine has %.1f GiB%s\n",
              floor / (1 << 30), most.span_elems, most.spans / (1 << 30), most.acts / (1 << 30),
              machine / (1 << 30),
              most.acts > machine / 8 && !activation_checkpointing(r, &ok)
                  ? " (enable_activation_checkpointing=true keeps one layer's activations)"
                  : "");
    return -1;
  }
  return 0;
}

/* ---- checkpoints -----------------------------------------------------------------------
 * output_dir/step_N/, as torchtune's FullModelHFCheckpointer writes it:
 *   config.json (and the other small files of checkpoint_dir), copied, or
 *     written from the dims when the run did not start from a checkpoint
 *   model.safetensors, or model-NNNNN-of-NNNNN.safetensors shards of at
 *     most checkpointer.max_shard_size and model.safetensors.index.json
 *     (HF's names, the params' own dtype)
 *   optimizer.safetensors: each param's states under torch's state names
 *     and NAME.step
 *   recipe_state.json: where the run is
 * Everything goes into a hidden temporary directory, each file under a
 * temporary name renamed when written, and the directory is renamed to
 * step_N when complete; `latest` names it only then. */

/* The decoder's tensors as the checkpoint names them: HF's, under
 * language_model. in a Llama4ForConditionalGeneration checkpoint. */
static const char *hf_prefix(const Trainer *t) { return t->multimodal ? "language_model." : ""; }

static bool is_opt_buf(const Buffer *b) { return b->kind != BUF_PARAM && b->kind != BUF_GRAD; }

/* The params and the optimizer states of a checkpoint, gathered while
 * rank 0 writes them. The writer asks for the params tensor by tensor in
 * its files' order (ckpt_write_model's: shards in order, tensors in order
 * within each), then for optimizer.safetensors' tensors, state after
 * state. Each tensor is pieces of its unit held by the ranks in rank order
 * (fsdp.c); each piece comes by one broadcast from its rank, into one
 * piece of scratch. The other ranks run the same schedule of broadcasts
 * (gather_finish), and so does rank 0 after the writer, whatever it
 * managed, so no rank waits for one that stopped. Every rank holds at
 * most one unit's part beyond its own shard, never the model or all the
 * states. */
typedef struct {
  int b, t, r;       /* buffer b's elements of tensor t that rank r holds */
  int64_t lo, hi;    /* flat */
} GatherPiece;

typedef struct {
  Trainer *t;
  GatherPiece *sched;  /* the broadcasts, in order */
  int n, next;         /* next: the first not done */
  void *scratch;
  bool failed;         /* a broadcast failed: no more */
} Gather;

/* Appends buffer b's pieces of tensor i, in rank order. */
static void gather_plan(Gather *gs, int b, int i) {
  Fsdp *f = &gs->t->f;
  int u = fsdp_unit_of(f, i);
  const FsdpUnit *x = &f->units[u];
  int64_t a = f->full.offset[i], e = a + f->full.numel[i];
  for (int r = 0; r < f->world; r++) {
    int64_t lo = MAX(a, fsdp_part_start(x, r)), hi = MIN(e, fsdp_part_start(x, r + 1));
    if (hi > lo)
      gs->sched[gs->n++] = (GatherPiece){b, i, r, lo, hi};
  }
}

/* Broadcasts the next piece; returns where it is. */
static const char *gather_next(Gather *gs) {
  Trainer *t = gs->t;
  Fsdp *f = &t->f;
  const GatherPiece *p = &gs->sched[gs->next];
  int u = fsdp_unit_of(f, p->t);
  /* (a quantized state's codes and scales: a block's bytes from a block's start) */
  char *own = (char *)fsdp_part(f, p->b, u) + buffer_bytes(f->g, p->b, p->lo - fsdp_part_start(&f->units[u], p->r));
  char *buf = p->r == t->rank ? own : gs->scratch;
  if (t->world > 1 && coll_broadcast(t->coll, buf, buffer_bytes(f->g, p->b, p->hi - p->lo), p->r) != 0) {
    gs->failed = true;
    return NULL;
  }
  gs->next++;
  return buf;
}

static void gather_finish(Gather *gs) {
  while (!gs->failed && gs->next < gs->n)
    gather_next(gs);
}

/* StView.fill for view src_index = b * ntensors + i: buffer b of tensor i,
 * whose pieces are the schedule's next ones. */
static int gather_fill(void *ctx, const StView *v, FILE *out) {
  Gather *gs = ctx;
  Trainer *t = gs->t;
  int b = v->src_index / t->ntensors, i = v->src_index % t->ntensors;
  int64_t done = 0;
  while (gs->next < gs->n && gs->sched[gs->next].b == b && gs->sched[gs->next].t == i) {
    size_t n = (size_t)buffer_bytes(t->g, b, gs->sched[gs->next].hi - gs->sched[gs->next].lo);
    const char *p = gs->failed ? NULL : gather_next(gs);
    if (!p || fwrite(p, 1, n, out) != n)
      return -1;
    done += (int64_t)n;
  }
  ASSERT(done == buffer_bytes(t->g, b, t->f.full.numel[i])); /* the writer asked in the planned order */
  return 0;
}

static int save_checkpoint(Trainer *t) {
  const Graph *g = t->g;
  Fsdp *f = &t->f;
  Gather gs = {.t = t};
  char tmp[4200], dir[4200], path[4300];
  snprintf(tmp, sizeof tmp, "%s/.step_%ld.tmp.%ld", t->ckpt_dir, t->step, (long)getpid());
  snprintf(dir, sizeof dir, "%s/step_%ld", t->ckpt_dir, t->step);
  int nviews = t->ntensors + (t->have_src ? ckpt_dir_others(&t->src, hf_prefix(t), NULL) : 0);
  int nopt = t->ntensors * (g->nbufs + 1);
  StView *views = calloc((size_t)MAX(nviews, nopt) + 1, sizeof(StView));
  char (*names)[256] = calloc((size_t)MAX(nviews, nopt) + 1, 256);
  int64_t *nbytes = calloc((size_t)nviews + 1, sizeof(int64_t));
  int *shard_of = calloc((size_t)nviews + 1, sizeof(int));
  gs.sched = calloc((size_t)t->ntensors * (size_t)g->nbufs * (size_t)t->world + 1, sizeof(GatherPiece));
  ASSERT(views && names && nbytes && shard_of && gs.sched);
  /* the model's views, on every rank: the order the writer fills them in
   * is the order of the broadcasts */
  Type pt = (Type)g->bufs[f->pbuf].type;
  for (int i = 0; i < t->ntensors; i++) {
    const L4Tensor *lt = &t->tensors[i];
    snprintf(names[i], sizeof names[i], "%s%s", hf_prefix(t), lt->name);
    views[i] = (StView){.name = names[i], .dtype = pt, .ndim = lt->ndim, .src_index = f->pbuf * t->ntensors + i,
                        .fill = gather_fill, .fill_ctx = &gs};
    memcpy(views[i].shape, lt->shape, sizeof(int64_t) * (size_t)lt->ndim);
  }
  if (t->have_src) /* a multimodal checkpoint's vision tower and projector, unchanged */
    ckpt_dir_others(&t->src, hf_prefix(t), views + t->ntensors);
  for (int i = 0; i < nviews; i++) {
    nbytes[i] = type_size(views[i].dtype);
    for (int k = 0; k < views[i].ndim; k++)
      nbytes[i] *= views[i].shape[k];
  }
  int ns = MAX(1, ckpt_plan_shards(nbytes, nviews, t->ck.max_shard_size, shard_of));
  for (int sh = 0; sh < ns; sh++)
    for (int i = 0; i < t->ntensors; i++)
      if (shard_of[i] == sh)
        gather_plan(&gs, f->pbuf, i);
  for (int b = 0; b < g->nbufs; b++) /* optimizer.safetensors: state-major */
    if (is_opt_buf(&g->bufs[b]))
      for (int i = 0; i < t->ntensors; i++)
        gather_plan(&gs, b, i);
  size_t most = 0;
  for (int k = 0; k < gs.n; k++)
    most = MAX(most, (size_t)buffer_bytes(f->g, gs.sched[k].b, gs.sched[k].hi - gs.sched[k].lo));
  int64_t short_of_memory = 0;
  if (t->world > 1) { /* every rank goes on, or none does */
    gs.scratch = coll_mem_alloc(t->coll, most + 1);
    short_of_memory = gs.scratch == NULL;
    if (coll_all_reduce_max(t->coll, &short_of_memory, 1, COLL_I64) != 0)
      gs.failed = true;
  }
  int rc = 0;
  if (short_of_memory || gs.failed) {
    error("%s gathering the model and its optimizer states for the checkpoint",
          gs.failed ? "a collective failed" : "out of memory");
    rc = -1;
    goto out;
  }
  if (t->rank != 0)
    goto out;
  mkdir_p(t->ckpt_dir);
  ckpt_clean_stale(t->ckpt_dir);
  ckpt_remove_tree(tmp);
  if (mkdir(tmp, 0755) != 0) {
    error("cannot create '%s': %s", tmp, strerror(errno));
    rc = -1;
    goto out;
  }
  /* the model */
  rc = ckpt_write_model(tmp, views, nviews, t->ck.max_shard_size, NULL);
  /* config.json: torchtune copies checkpoint_dir's small files */
  if (rc == 0 && t->hf_config) {
    rc = ckpt_copy_files(t->ck.checkpoint_dir, tmp);
  } else if (rc == 0) {
    char *text = hf_config_text(&t->cfg, pt, t->tc->model.max_seq_len);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    rc = file_write_atomic(path, text, strlen(text));
    free(text);
  }
  /* the optimizer */
  int n = 0;
  float stepf = (float)f->step;
  for (int b = 0; b < g->nbufs; b++) /* state-major: the order the pieces come in */
    for (int i = 0; i < t->ntensors && is_opt_buf(&g->bufs[b]); i++) {
      const L4Tensor *lt = &t->tensors[i];
      snprintf(names[n], sizeof names[n], "%s.%s", lt->name, g->bufs[b].name);
      views[n] = (StView){.name = names[n], .dtype = (Type)g->bufs[b].type, .ndim = lt->ndim,
                          .src_index = b * t->ntensors + i, .fill = gather_fill, .fill_ctx = &gs};
      memcpy(views[n].shape, lt->shape, sizeof(int64_t) * (size_t)lt->ndim);
      if (g->bufs[b].per_block || g->bufs[b].type == TY_U4) { /* flat, as the group's files hold them */
        views[n].dtype = g->bufs[b].type == TY_U4 ? TY_U8 : (Type)g->bufs[b].type;
        views[n].ndim = 1;
        views[n].shape[0] = buffer_bytes(f->g, b, f->full.numel[i]) / type_size(views[n].dtype);
      }
      n++;
    }
  for (int i = 0; i < t->ntensors; i++) {
    snprintf(names[n], sizeof names[n], "%s.step", t->tensors[i].name);
    views[n] = (StView){.name = names[n], .dtype = TY_F32, .ndim = 0, .data = &stepf};
    n++;
  }
  char num[64];
  snprintf(num, sizeof num, "%ld", t->step);
  const char *meta[] = {"optc.step", num, "optc.optimizer", t->r->component};
  snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
  if (rc == 0)
    rc = st_write_views(path, views, n, meta, 2);
  if (rc == 0) {
    json_t *state = json_pack("{s:I, s:I, s:I, s:I, s:I}", "step", (json_int_t)t->step, "epoch",
                              (json_int_t)dataloader_epoch(t->train), "batch", (json_int_t)dataloader_batch_index(t->train),
                              "world_size", (json_int_t)t->world, "seed", (json_int_t)t->r->seed);
    char *text = json_dumps(state, JSON_INDENT(2));
    snprintf(path, sizeof path, "%s/recipe_state.json", tmp);
    rc = file_write_atomic(path, text, strlen(text));
    free(text);
    json_decref(state);
  }
  if (rc == 0)
    rc = ckpt_commit_dir(tmp, dir);
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/latest", t->ckpt_dir);
    char rel[64];
    snprintf(rel, sizeof rel, "step_%ld\n", t->step);
    rc = file_write_atomic(path, rel, strlen(rel));
  }
  if (rc == 0 && t->ck.keep_last_n > 0)
    ckpt_prune(t->ckpt_dir, t->ck.keep_last_n);
  if (rc != 0)
    ckpt_remove_tree(tmp);
  else
    fprintf(stderr, "optc: checkpoint %s\n", dir);
out:
  gather_finish(&gs); /* the broadcasts rank 0's writer did not ask for (all of them, elsewhere) */
  if (gs.failed)
    rc = -1;
  coll_mem_free(t->coll, gs.scratch);
  free(gs.sched);
  free(views);
  free(names);
  free(nbytes);
  free(shard_of);
  return rc;
}

/* This rank's pieces of each optimizer state, and the step, from
 * DIR/optimizer.safetensors. */
static int load_optimizer(Trainer *t, const char *dir) {
  const Graph *g = t->g;
  Fsdp *f = &t->f;
  char path[4300];
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  CkptDir d;
  if (ckpt_file_open(&d, path) != 0)
    return -1;
  int nw = t->ntensors * (g->nbufs + 1);
  CkptWant *w = calloc((size_t)nw + 1, sizeof(CkptWant));
  char (*names)[256] = calloc((size_t)nw + 1, 256);
  float *steps = calloc((size_t)t->ntensors + 1, sizeof(float));
  int64_t *flat = calloc((size_t)nw + 1, sizeof(int64_t)); /* a quantized state's stored length */
  ASSERT(w && names && steps && flat);
  int n = 0;
  for (int i = 0; i < t->ntensors; i++) {
    const L4Tensor *lt = &t->tensors[i];
    int64_t lo, hi;
    fsdp_piece(f, i, &lo, &hi);
    for (int b = 0; b < g->nbufs; b++) {
      if (!is_opt_buf(&g->bufs[b]))
        continue;
      snprintf(names[n], sizeof names[n], "%s.%s", lt->name, g->bufs[b].name);
      /* the table's pointer is the tensor's element 0, for the elements this rank holds */
      void *dst = f->table[(size_t)i * (size_t)g->nbufs + (size_t)b];
      const Buffer *x = &g->bufs[b];
      if (x->per_block || x->type == TY_U4) {
        /* stored flat, as save_checkpoint writes it: codes two a byte, or a
         * scale a block; this rank's pieces start on a block */
        Type st = x->type == TY_U4 ? TY_U8 : (Type)x->type;
        int64_t es = type_size(st);
        flat[n] = buffer_bytes(f->g, b, lt->numel) / es;
        w[n] = (CkptWant){names[n], 1, &flat[n], st, dst, buffer_bytes(f->g, b, lo) / es,
                          buffer_bytes(f->g, b, hi) / es};
      } else
        w[n] = (CkptWant){names[n], lt->ndim, lt->shape, (Type)x->type, dst, lo, hi};
      n++;
    }
    snprintf(names[n], sizeof names[n], "%s.step", lt->name);
    w[n] = (CkptWant){names[n], 0, NULL, TY_F32, &steps[i], 0, 1};
    n++;
  }
  int rc = ckpt_dir_load(&d, w, n, NULL);
  if (rc == 0)
    f->step = steps[0];
  ckpt_dir_close(&d);
  free(w);
  free(names);
  free(steps);
  free(flat);
  return rc;
}

/* The model from a checkpoint directory (files: checkpoint_files; none:
 * the directory's index or model.safetensors), every rank reading its
 * pieces straight into its shard, file by file; with opt, the optimizer
 * states too. The directory stays open when it has tensors optc passes
 * through (a multimodal checkpoint's vision tower), for save_checkpoint. */
static int load_checkpoint(Trainer *t, const char *dir, const char *const *files, int nfiles, bool opt) {
  Fsdp *f = &t->f;
  CkptDir d;
  if (ckpt_dir_open(&d, dir, files, nfiles) != 0)
    return -1;
  Type pt = (Type)t->g->bufs[f->pbuf].type;
  CkptWant *w = calloc((size_t)t->ntensors + 1, sizeof(CkptWant));
  char (*names)[256] = calloc((size_t)t->ntensors + 1, 256);
  ASSERT(w && names);
  for (int i = 0; i < t->ntensors; i++) {
    const L4Tensor *lt = &t->tensors[i];
    snprintf(names[i], sizeof names[i], "%s%s", hf_prefix(t), lt->name);
    int64_t lo, hi;
    fsdp_piece(f, i, &lo, &hi);
    w[i] = (CkptWant){names[i], lt->ndim, lt->shape, pt, f->table[(size_t)i * (size_t)t->g->nbufs + (size_t)f->pbuf],
                      lo, hi};
  }
  const char *own = t->multimodal ? hf_prefix(t) : NULL;
  int rc = ckpt_dir_load(&d, w, t->ntensors, own);
  free(w);
  free(names);
  if (rc == 0 && own && ckpt_dir_others(&d, own, NULL) > 0) {
    if (t->have_src)
      ckpt_dir_close(&t->src);
    t->src = d;
    t->have_src = true;
  } else {
    ckpt_dir_close(&d);
  }
  if (rc == 0 && opt)
    rc = load_optimizer(t, dir);
  return rc;
}

/* resume_from_checkpoint: the directory `latest` names, and where the run was. */
static int resume_checkpoint(Trainer *t) {
  char path[4200];
  snprintf(path, sizeof path, "%s/latest", t->ckpt_dir);
  char *latest = file_read_quiet(path, NULL);
  if (!latest) {
    error("resume_from_checkpoint: no checkpoint to resume in %s (no 'latest' file)", t->ckpt_dir);
    return -1;
  }
  latest[strcspn(latest, "\n")] = 0;
  if (!latest[0] || strchr(latest, '/')) {
    error("%s: '%s' is not a checkpoint directory's name (step_N)", path, latest);
    free(latest);
    return -1;
  }
  char dir[4200], sp[4300];
  snprintf(dir, sizeof dir, "%s/%s", t->ckpt_dir, latest);
  free(latest);
  snprintf(sp, sizeof sp, "%s/recipe_state.json", dir);
  if (load_checkpoint(t, dir, NULL, 0, true) != 0)
    return -1;
  json_error_t je;
  json_t *st = json_load_file(sp, 0, &je);
  if (!st) {
    error("%s:%d: %s", sp, je.line, je.text);
    return -1;
  }
  /* a missing or mistyped field must not resume at step 0 (and save over
   * the checkpoints from there) */
  static const char *const keys[] = {"step", "epoch", "batch", "world_size"};
  long v[ARRAY_LEN(keys)];
  for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
    json_t *x = json_object_get(st, keys[i]);
    if (!json_is_integer(x) || json_integer_value(x) < 0) {
      error("%s: \"%s\" is not a non-negative integer", sp, keys[i]);
      json_decref(st);
      return -1;
    }
    v[i] = (long)json_integer_value(x);
  }
  json_decref(st);
  t->step = v[0];
  long epoch = v[1], batch = v[2], was = v[3];
  if (was != t->world) {
    error("%s was saved by %ld rank%s; resume it with --nproc %ld", dir, was, was == 1 ? "" : "s", was);
    return -1;
  }
  dataloader_seek(t->train, (int)epoch, (int)batch);
  if (t->rank == 0)
    fprintf(stderr, "optc: resuming %s at step %ld\n", dir, t->step);
  return 0;
}

/* The checkpointer block, and the model's dims: checkpoint_dir/config.json's
 * when there is one (the recipe's model block must agree with it on every
 * dim it gives), else the recipe's. */
static int setup_checkpointer(Trainer *t) {
  Recipe *r = t->r;
  if (ckpt_config(r, t->output_dir, &t->ck) != 0)
    return -1;
  t->ckpt_dir = t->ck.output_dir;
  t->resume |= t->ck.resume;
  if (t->ck.checkpoint_dir) {
    const char *p = arena_printf(r->arena, "%s/config.json", t->ck.checkpoint_dir);
    if (access(p, F_OK) == 0)
      t->hf_config = p;
  }
  if (t->hf_config) {
    /* torchtune: the output must not be checkpoint_dir or inside it, since
     * checkpoint_dir's files are copied into every output */
    mkdir_p(t->ckpt_dir);
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(t->ck.checkpoint_dir, a) && realpath(t->ckpt_dir, b)) {
      size_t n = strlen(a);
      if (strncmp(a, b, n) == 0 && (b[n] == 0 || b[n] == '/' || strcmp(a, "/") == 0)) {
        error_at(t->ck.pos, "checkpointer.output_dir %s is checkpoint_dir %s or inside it; torchtune refuses that, "
                            "since checkpoint_dir's files are copied into each checkpoint",
                 t->ckpt_dir, t->ck.checkpoint_dir);
        return -1;
      }
    }
  }
  return ckpt_model_config(t->tc, t->hf_config, &t->cfg, &t->multimodal);
}

/* ---- evaluation -------------------------------------------------------------------------------- */

/* Mean CE over the held-out split, across ranks. */
static double evaluate(Trainer *t) {
  if (!t->heldout)
    return NAN;
  double t0 = now_seconds();
  double sums[2] = {0, 0};
  L4Batch b;
  /* Every rank runs as many forwards as the rank with the most batches
   * (some have one more), since each gathers the units with all of them;
   * the extra ones see a token whose target is ignored: no loss, no count. */
  int64_t most = dataloader_num_batches(t->heldout);
  if (coll_all_reduce_max(t->coll, &most, 1, COLL_I64) != 0)
    return NAN;
  int32_t pad_token = 0, pad_target = -100;
  const L4Batch pad = {.tokens = &pad_token, .targets = &pad_target, .B = 1, .T = 1};
  fsdp_run_set_training(t->run, false); /* every forward frees its units */
  bool more = true; /* this rank's loader has not ended its epoch */
  for (int64_t k = 0; k < most; k++) {
    int64_t n;
    more = more && dataloader_next(t->heldout, &b) == 1;
    sums[0] += l4_run(t->model, fsdp_run_params(t->run), NULL, more ? &b : &pad, &n);
    sums[1] += (double)n;
  }
  if (more) { /* the end of its epoch, so that the next evaluation starts over */
    int end = dataloader_next(t->heldout, &b);
    ASSERT(end == 0);
  }
  fsdp_run_set_training(t->run, true);
  if (fsdp_run_failed(t->run))
    return NAN;
  coll_all_reduce_sum(t->coll, sums, 2, COLL_F64);
  t->t_eval += now_seconds() - t0;
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

/* ---- setup ----------------------------------------------------------------------------------------- */

static int step_unit(void *ctx, int u); /* the loop's, below */

/* The step's executor on `threads` threads, of pool when not NULL: the
 * compiled step through the public API (include/optc.h), built from the
 * recipe as a library user builds it, or the runtime's own eager one. */
static int make_executor(Trainer *t, Executor *x, int threads, ThreadPool *pool) {
  Recipe *r = t->r;
  if (!t->compiled) {
    if (executor_init(x, BACKEND_EAGER, t->g, t->unopt, threads, NULL) != 0)
      return -1;
    if (pool)
      executor_share_pool(x, pool);
    return 0;
  }
  optc_step *api;
  optc_error err;
  if (optc_step_from_recipe(r->path, r->src.text, (const char *const *)r->overrides, r->noverrides, OPTC_TARGET_CPU,
                            &api, &err) != OPTC_OK) {
    fprintf(stderr, "%s\n", err.message);
    return -1;
  }
  executor_init_api(x, api, t->g, threads, pool);
  return 0;
}

/* The seeded initialisation (l4_init_params's values, every rank the
 * same), unit by unit: the unit made whole in one f32 span, and this
 * rank's part kept, rounded to the params' dtype. */
static void init_params(Trainer *t, uint64_t seed) {
  Fsdp *f = &t->f;
  Type pt = (Type)t->g->bufs[f->pbuf].type;
  float *span = malloc(sizeof(float) * (size_t)(f->most + 1));
  float **at = calloc((size_t)t->ntensors + 1, sizeof(float *));
  ASSERT(span && at);
  for (int u = 0; u < f->nunits; u++) {
    const FsdpUnit *x = &f->units[u];
    memset(span, 0, sizeof(float) * (size_t)(x->S * f->world));
    for (int i = x->t0; i < x->t1; i++)
      at[i] = span + (f->full.offset[i] - x->base);
    l4_init_tensors(&t->cfg, at, seed, x->t0, x->t1);
    const float *mine = span + x->S * f->rank;
    void *part = fsdp_part(f, f->pbuf, u);
    for (int64_t i = 0; i < x->S; i++) {
      if (pt == TY_F32)
        ((float *)part)[i] = mine[i];
      else
        ((uint16_t *)part)[i] = pt == TY_BF16 ? optc_f32_to_bf16(mine[i]) : optc_f32_to_f16(mine[i]);
    }
  }
  free(at);
  free(span);
}

static int setup(Trainer *t) {
  Recipe *r = t->r;
  const TrainConfig *tc = t->tc;
  YamlNode *root = r->root;
  if (!tc->has_model) {
    error("%s: the recipe has no model section", r->path);
    return -1;
  }
  t->output_dir = str_at(root, "output_dir", "output_dir", "/tmp/optc");
  const YamlNode *ml = yaml_get(root, "metric_logger");
  t->log_dir = ml ? str_at(ml, "log_dir", "metric_logger.log_dir", NULL) : NULL;
  if (!t->log_dir)
    t->log_dir = arena_printf(r->arena, "%s/logs", t->output_dir);
  const YamlNode *v;
  bool b;
  if ((v = yaml_get(root, "resume_from_checkpoint")) && yaml_bool(v, "resume_from_checkpoint", &b))
    t->resume = b;
  long l;
  t->log_every = 1;
  if ((v = yaml_get(root, "log_every_n_steps"))) {
    if (!yaml_int_in(v, "log_every_n_steps", 1, INT32_MAX, &l))
      return -1;
    t->log_every = l;
  }
  if ((v = yaml_get(root, "save_every_n_steps")) && !yaml_is_null(v)) {
    if (!yaml_int_in(v, "save_every_n_steps", 1, INT32_MAX, &l))
      return -1;
    t->save_every = l;
  }
  if ((v = yaml_get(root, "run_val_every_n_steps")) && !yaml_is_null(v)) {
    if (!yaml_int_in(v, "run_val_every_n_steps", 1, INT32_MAX, &l))
      return -1;
    t->eval_every = l;
  }
  t->compiled = tc->compile.optimizer_step;
  t->max_steps = tc->max_steps;
  if (!t->output_dir || setup_checkpointer(t) != 0)
    return -1;

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
  int seq = (int)MIN(tc->model.max_seq_len, 2048);
  if (check_memory(t, (int)tc->batch_size, seq) != 0)
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
  LoaderOptions lo = {(int)tc->batch_size, tc->shuffle, (uint64_t)r->seed, t->rank, t->world, true};
  t->train = dataloader_create(t->data, SPLIT_TRAIN, &lo);
  if (!t->train)
    return -1;
  if (dataset_num_samples(t->data, SPLIT_HELDOUT) > 0) {
    LoaderOptions eo = {(int)tc->batch_size, false, 0, t->rank, t->world, false};
    t->heldout = dataloader_create(t->data, SPLIT_HELDOUT, &eo);
  }
  long batches = dataloader_num_batches(t->train);
  t->steps_per_epoch = batches / tc->gradient_accumulation_steps;
  if (tc->max_steps_per_epoch > 0)
    t->steps_per_epoch = MIN(t->steps_per_epoch, tc->max_steps_per_epoch);
  if (t->steps_per_epoch < 1) {
    error("%s: one step needs %ld micro-batches of %ld on each of %d ranks; the dataset has %d training rows", r->path,
          tc->gradient_accumulation_steps, tc->batch_size, t->world, dataset_num_samples(t->data, SPLIT_TRAIN));
    return -1;
  }
  /* torchtune: num_training_steps = epochs * steps_per_epoch; max_steps only stops early */
  t->total_steps = tc->epochs * t->steps_per_epoch;
  if (sched_from_recipe(r, t->total_steps, &t->sched) != 0)
    return -1;

  /* the model, its parameters in one sharded group */
  char why[512];
  t->model = l4_create(&t->cfg, (int)tc->batch_size, seq, why, sizeof why);
  if (!t->model) {
    error("%s: %s", r->path, why);
    return -1;
  }
  bool ac_ok;
  if (activation_checkpointing(r, &ac_ok) && l4_set_checkpointing(t->model, 1) != 0) {
    error("%s: out of memory for the checkpointed activations", r->path);
    return -1;
  }
  if (!ac_ok)
    return -1;
  t->ntensors = l4_tensors(&t->cfg, NULL);
  t->tensors = calloc((size_t)t->ntensors, sizeof(L4Tensor));
  l4_tensors(&t->cfg, t->tensors);
  int64_t *numel = malloc(sizeof(int64_t) * (size_t)t->ntensors);
  int nunits = l4_units(&t->cfg, NULL);
  int *unit_first = malloc(sizeof(int) * (size_t)(nunits + 1));
  ASSERT(numel && unit_first);
  for (int i = 0; i < t->ntensors; i++)
    numel[i] = t->tensors[i].numel;
  l4_units(&t->cfg, unit_first);
  int rc = fsdp_init(&t->f, t->coll, t->g, t->ntensors, numel, nunits, unit_first);
  free(numel);
  free(unit_first);
  if (rc != 0)
    return -1;
  /* the model runs unit by unit over the shards, as FSDP2 runs it */
  bool ok;
  bool ok2;
  FsdpRunOptions ro = {.reshard_after_forward = reshard_after_forward(r, &ok), .training = true,
                       .overlap = fsdp_overlap(r, t->coll, &ok2)};
  if (!ok || !ok2)
    return -1;
  /* optimizer_in_bwd: each unit's piece stepped once its grads are in,
   * beside the backward of the units before it. Only where nothing global
   * stands in the way: clip_grad_norm's norm needs every grad first, and
   * so does a skip over a NaN or Inf anywhere. */
  const YamlNode *ib = yaml_get(root, "optimizer_in_bwd");
  if (ib && !yaml_is_null(ib) && !yaml_bool(ib, "optimizer_in_bwd", &t->in_bwd))
    return -1;
  if (t->in_bwd && (r->has_clip || r->nonfinite != NONFINITE_PROPAGATE)) {
    error_at(ib->pos, "optimizer_in_bwd: True steps each layer as soon as its grads are in, before %s: set %s",
             r->has_clip ? "clip_grad_norm's global norm exists" : "a NaN or Inf in a later layer is seen",
             r->has_clip ? "clip_grad_norm: null (torchtune refuses the two together too)"
                         : "nonfinite_grads: propagate (torch's behaviour: no skip)");
    return -1;
  }
  int threads = MAX(1, pool_default_threads() / t->world);
  /* the model's matmuls and loops on optc's pool, each BLAS call on one
   * thread (blas_init): no BLAS threads spinning between calls */
  t->pool = pool_create(threads);
  if (!t->pool || l4_set_pool(t->model, t->pool) != 0) {
    error("cannot start %d threads for the model", threads);
    return -1;
  }
  /* one pool: the model's and the step's (eager too: torch's for-loop runs
   * on all of torch's threads) */
  if (make_executor(t, &t->ex, threads, t->pool) != 0)
    return -1;
  /* Without optimizer_in_bwd, a clipping step's first phase, the norm,
   * runs unit by unit as each unit's grads come in (the grads are in the
   * cache then), and the step after the backward takes its partials: a
   * compiled step only (eager runs the norm with the rest). */
  t->norm_in_bwd = !t->in_bwd && fsdp_can_partials(&t->f, &t->ex);
  if (t->in_bwd || t->norm_in_bwd)
    ro.step_unit = step_unit, ro.step_ctx = t;
  t->run = fsdp_run_create(&t->f, &ro);
  L4Hooks hooks = fsdp_run_hooks(t->run);
  l4_set_hooks(t->model, &hooks);
  /* that work on the collectives' thread: a step of its own there, one
   * thread (the model's pool runs the backward meanwhile) */
  if (ro.step_unit && fsdp_run_threaded(t->run) && make_executor(t, &t->ex_unit, 1, NULL) != 0)
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
    if (resume_checkpoint(t) != 0)
      return -1;
  } else if (t->ck.nfiles > 0) {
    if (load_checkpoint(t, t->ck.checkpoint_dir, t->ck.files, t->ck.nfiles, false) != 0)
      return -1;
  } else {
    init_params(t, (uint64_t)(r->has_seed ? r->seed : 0));
  }
  return 0;
}

/* ---- the loop ---------------------------------------------------------------------------------------- */

/* The step's inputs: num_tokens (all ranks' counted tokens: the
 * reduce-scatter sums the ranks' grads of summed losses, so scale_grads is
 * by 1 / that, torchtune's normalisation), the step count and the lr. */
static void step_inputs(Trainer *t, double tokens, double *lr_out) {
  Ref nt = graph_find_input(t->g, "num_tokens"), ws = graph_find_input(t->g, "world_size");
  Ref sr = graph_find_input(t->g, "step"), lr = graph_find_input(t->g, "lr");
  if (nt != NOREF)
    t->inputs[nt] = MAX(1.0, tokens);
  if (ws != NOREF)
    t->inputs[ws] = 1.0;
  if (sr != NOREF)
    t->inputs[sr] = t->f.step + 1;
  *lr_out = sched_lr(&t->sched, t->base_lr, t->step + 1);
  if (lr != NOREF)
    t->inputs[lr] = *lr_out;
}

/* Unit u's piece of the step once its grads are in (FsdpRunOptions.step_unit):
 * all of it (optimizer_in_bwd), or the first phase, clip_grad_norm's norm
 * (the step after the backward takes those partials). On the collectives'
 * thread on a 1-thread executor of its own (the model's pool is the
 * backward's), else at once on the run's. */
static int step_unit(void *ctx, int u) {
  Trainer *t = ctx;
  Executor *x = fsdp_run_threaded(t->run) ? &t->ex_unit : &t->ex;
  StepResult res;
  return t->in_bwd ? fsdp_step_unit(&t->f, x, u, t->inputs, &res) : fsdp_unit_partials(&t->f, x, u, t->inputs);
}

/* Targets counted in a loss: what l4_run's ntokens will say. */
static double batch_tokens(const L4Batch *b) {
  double n = 0;
  for (int i = 0; i < b->B * b->T; i++)
    n += b->targets[i] != -100;
  return n;
}

typedef struct {
  double loss, lr, grad_norm, tokens, seconds;
  bool skipped;
} StepLog;

static int train_step(Trainer *t, StepLog *log) {
  const Recipe *r = t->r;
  const TrainConfig *tc = t->tc;
  double t0 = now_seconds();
  FsdpRunStats s0 = fsdp_run_stats(t->run);
  double sums[2] = {0, 0}, counted = 0; /* loss, tokens; tokens counted before the runs */
  for (long a = 0; a < tc->gradient_accumulation_steps; a++) {
    L4Batch b;
    if (dataloader_next(t->train, &b) != 1 && dataloader_next(t->train, &b) != 1) {
      error("the training loader gave no batch");
      return -1;
    }
    int64_t n;
    counted += batch_tokens(&b);
    if ((t->in_bwd || t->norm_in_bwd) && a + 1 == tc->gradient_accumulation_steps) {
      /* the units are stepped (or normed) in this backward: the step's inputs first */
      double all = counted;
      if (coll_all_reduce_sum(t->coll, &all, 1, COLL_F64) != 0)
        return -1;
      step_inputs(t, all, &log->lr);
    }
    fsdp_run_micro(t->run, (int)a, (int)tc->gradient_accumulation_steps);
    sums[0] += l4_run(t->model, fsdp_run_params(t->run), fsdp_run_grads(t->run), &b, &n);
    sums[1] += (double)n;
    if (fsdp_run_failed(t->run))
      return -1;
  }
  double t1 = now_seconds();
  FsdpRunStats s1 = fsdp_run_stats(t->run);
  /* what the model's thread did not compute: the units' collectives, and
   * with optimizer_in_bwd the steps that were not hidden behind it */
  double waited = s1.wait_s - s0.wait_s;
  t->t_units += s1.gather_s - s0.gather_s + s1.reduce_s - s0.reduce_s;
  if (coll_all_reduce_sum(t->coll, sums, 2, COLL_F64) != 0)
    return -1;
  ASSERT(sums[1] == counted || !t->in_bwd || t->world > 1); /* one rank: what l4_run counted */
  double t2 = now_seconds(), t3;
  /* the step's work done in the backward, and what of it was hidden */
  double stepped = s1.step_s - s0.step_s, hidden = s1.step_hidden_s - s0.step_hidden_s;
  StepResult res = {0};
  if (t->in_bwd) { /* stepped in the backward, unit by unit */
    t->f.step += 1;
    t3 = t2;
  } else {
    step_inputs(t, sums[1], &log->lr);
    if (fsdp_step(&t->f, &t->ex, t->inputs, &res) != 0)
      return -1;
    t3 = now_seconds();
  }
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
  /* the model's thread waited for the units' collectives, and for the
   * steps in the backward that were not hidden behind it */
  t->t_fwdbwd += t1 - t0 - waited;
  t->t_units_waited += waited - (stepped - hidden);
  t->t_coll += t2 - t1 + waited - (stepped - hidden);
  t->t_opt += t3 - t2 + stepped;
  t->t_opt_hidden += hidden;
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

int train_run(const TrainConfig *tc, Coll *coll, const TrainOptions *opt, TrainResult *out) {
  Recipe *r = tc->r;
  Trainer t = {.r = r, .tc = tc, .coll = coll, .rank = coll_rank(coll), .world = coll_size(coll)};
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
    fprintf(stderr, "  %s\n", blas_describe(pool_size(t.pool)));
    fprintf(stderr, "  data: %s\n  %ld steps of %ld micro-batches x %ld rows x %d ranks; %ld steps per epoch\n", d.data,
            last - t.step, tc->gradient_accumulation_steps, tc->batch_size, t.world, t.steps_per_epoch);
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
    if (t.run) {
      FsdpRunStats s = fsdp_run_stats(t.run);
      fprintf(stderr,
              "  units: %ld gathers, %ld reduce-scatters, %.2f s, %.2f s of it waited for (%s); at most %d f32 and "
              "%d 16-bit spans held, %.1f MiB\n",
              s.gathers, s.reduces, s.gather_s + s.reduce_s, s.wait_s,
              s.threaded ? "on a thread of their own" : "on the model's thread", s.spans_wide, s.spans_narrow,
              s.span_bytes / (1 << 20));
      if (t.in_bwd || t.norm_in_bwd)
        fprintf(stderr, "  %s: %ld units in the backward, %.2f s, %.2f s of it beside the backward\n",
                t.in_bwd ? "optimizer_in_bwd, each unit stepped" : "the step's norm, unit by unit", s.steps,
                s.step_s, s.step_hidden_s);
    }
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
    out->t_opt_hidden = t.t_opt_hidden;
    out->t_units = t.t_units;
    out->t_units_waited = t.t_units_waited;
    out->units = fsdp_run_stats(t.run);
    out->steps = t.step;
  }
  rc = 0;
out:
  if (metrics)
    fclose(metrics);
  if (t.model)
    l4_free(t.model);
  if (t.pool)
    pool_free(t.pool);
  if (t.train)
    dataloader_free(t.train);
  if (t.heldout)
    dataloader_free(t.heldout);
  if (t.data)
    dataset_free(t.data);
  if (t.have_src)
    ckpt_dir_close(&t.src);
  fsdp_run_free(t.run); /* its spans are the Coll's memory: before fsdp_free's */
  if (t.f.g)
    fsdp_free(&t.f);
  executor_free(&t.ex);
  if (t.ex_unit.g)
    executor_free(&t.ex_unit);
  free(t.tensors);
  free(t.inputs);
  return rc;
}
