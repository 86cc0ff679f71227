/* fsdp_run.c: a model's units over a sharded group, as FSDP2 runs them.
 *
 * The model (llama4.h) calls a hook before and after each unit's use. Here
 * they do what torchtune's FSDP2 does around a wrapped module:
 *
 *   forward begin    the unit's params all-gathered into a span (16-bit:
 *                    and widened to f32, what the model reads); the next
 *                    unit's gather is started, to run while this one
 *                    computes (prefetch)
 *   forward end      its params freed (fsdp_reshard_after_forward: True),
 *                    or kept for the backward (False)
 *   backward begin   its params gathered again if freed (the next unit's
 *                    started, as in forward); a zeroed f32 span for its grads
 *   backward end     on the last micro-batch of a step: its grads rounded to
 *                    their dtype and reduce-scattered into the shard, while
 *                    the next unit's backward runs; both spans freed
 *
 * The collectives run on a communication thread, in the order the hooks
 * ask for them, which is the same on every rank; the model's thread waits
 * only for a unit it is about to use. At most two units' params (the one
 * in use and the next) and two units' grads (the one being computed and
 * the one going out) are whole at once. A run's last hook waits for every
 * collective, so that between runs the Coll is the caller's again.
 *
 * With gradient accumulation a unit's grads stay whole until the step's
 * last micro-batch, so that they are summed in the order an unsharded run
 * sums them (micro-batches, then ranks): the bits never change. Spans come
 * from free lists, so a step allocates nothing once the first has run. On
 * one rank an f32 unit is its own span: the params are read, and the grads
 * written, in place in the shard. */
#include "dist.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* A free list of span buffers of one size. */
typedef struct {
  size_t bytes;
  void **free;
  int nfree, cap;
  int out, most_out; /* held now, and at most */
} Spans;

typedef enum { JOB_GATHER, JOB_REDUCE, JOB_STEP } JobKind;
typedef struct {
  JobKind kind;
  int u;
} Job;

/* A unit's params: not there, asked for (a gather queued or running), there. */
enum { P_NONE, P_ASKED, P_READY };

struct FsdpRun {
  Fsdp *f;
  FsdpRunOptions o;
  Type pt, gt;
  int ntensors, nunits;
  float **params, **grads; /* (ntensors) the pointers the model runs with */
  /* per unit: its params as f32 (what the model reads: a gather's span,
   * a widened copy, or the part in place) and their state; its f32 grads
   * while they accumulate or go out, and whether they are going out */
  float **pf32;
  int *pstate;
  float **gspan;
  bool *reducing;
  double *step_t0, *step_t1; /* (nunits) when each unit's step ran, this step */
  double bwd_end;            /* when this step's backward ended */
  Spans wide, narrow; /* f32 spans, and 16-bit ones */
  int micro, nmicro;  /* this micro-batch of the step's */
  /* the communication thread and its queue; without one (a Coll that
   * cannot be called from another thread) the jobs run at once */
  bool threaded, stop;
  pthread_t thread;
  pthread_mutex_t mu; /* everything below, the spans and the per-unit state */
  pthread_cond_t cv;  /* a job queued, or one done */
  Job *queue;
  int qhead, qlen, qcap;
  bool busy;       /* the thread is running a job */
  int nreducing;   /* reduces queued or running */
  bool failed;
  FsdpRunStats st;
};

static void *spans_get(FsdpRun *r, Spans *s) {
  void *p = s->nfree ? s->free[--s->nfree] : coll_mem_alloc(r->f->coll, s->bytes);
  if (p)
    s->out++, s->most_out = MAX(s->most_out, s->out);
  return p;
}

static void spans_put(Spans *s, void *p) {
  if (!p)
    return;
  if (s->nfree == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 8;
    s->free = realloc(s->free, sizeof(void *) * (size_t)s->cap);
    ASSERT(s->free);
  }
  s->free[s->nfree++] = p;
  s->out--;
}

static void spans_free(FsdpRun *r, Spans *s) {
  for (int i = 0; i < s->nfree; i++)
    coll_mem_free(r->f->coll, s->free[i]);
  free(s->free);
  memset(s, 0, sizeof *s);
}

/* Whether unit spans of type t are the shard's parts themselves: one rank, f32. */
static bool in_place(const FsdpRun *r, Type t) { return r->f->world == 1 && t == TY_F32; }

static int64_t span_len(const FsdpRun *r, int u) { return r->f->units[u].S * r->f->world; }

/* Points the model's params[t] (or grads[t]) of unit u's tensors into span, or at nothing. */
static void point(FsdpRun *r, float **ptrs, int u, float *span) {
  const FsdpUnit *x = &r->f->units[u];
  for (int t = x->t0; t < x->t1; t++)
    ptrs[t] = span ? span + (r->f->full.offset[t] - x->base) : NULL;
}

/* ---- the jobs (on the communication thread, or at once) ------------------------------ */

/* Unit u's params, gathered and widened: spans taken under mu, the
 * collective and the widening outside it. */
static int job_gather(FsdpRun *r, int u) {
  Fsdp *f = r->f;
  int64_t n = span_len(r, u);
  if (in_place(r, r->pt)) {
    r->pf32[u] = fsdp_part(f, f->pbuf, u);
    return 0;
  }
  pthread_mutex_lock(&r->mu);
  void *src = f->world == 1 ? fsdp_part(f, f->pbuf, u) : spans_get(r, r->pt == TY_F32 ? &r->wide : &r->narrow);
  float *wide = r->pt == TY_F32 ? src : spans_get(r, &r->wide);
  if (!src || !wide) { /* out of memory: nothing held */
    if (r->pt != TY_F32) {
      spans_put(&r->wide, wide);
      if (f->world > 1)
        spans_put(&r->narrow, src);
    }
    wide = NULL;
  }
  pthread_mutex_unlock(&r->mu);
  r->pf32[u] = wide;
  if (!wide)
    return -1;
  double t0 = now_seconds();
  int rc = 0;
  if (f->world > 1) { /* 16-bit on one rank: widened straight from the part */
    rc = fsdp_gather(f, u, f->pbuf, src);
    r->st.gathered_bytes += (double)n * type_size(r->pt);
  }
  if (r->pt != TY_F32) { /* widened, the 16-bit gather is done with */
    const uint16_t *h = src;
    bool bf = r->pt == TY_BF16;
    for (int64_t i = 0; rc == 0 && i < n; i++)
      wide[i] = bf ? optc_bf16_to_f32(h[i]) : optc_f16_to_f32(h[i]);
    if (f->world > 1) {
      pthread_mutex_lock(&r->mu);
      spans_put(&r->narrow, src);
      pthread_mutex_unlock(&r->mu);
    }
  }
  r->st.gathers++;
  r->st.gather_s += now_seconds() - t0;
  return rc;
}

/* Unit u's grads in their dtype, summed over the ranks into the shard (on
 * one rank in place, where a NaN still becomes the canonical one); its
 * spans freed. */
static int job_reduce(FsdpRun *r, int u) {
  Fsdp *f = r->f;
  int64_t n = span_len(r, u);
  float *g = r->gspan[u];
  void *send = g;
  double t0 = now_seconds();
  if (r->gt != TY_F32) {
    pthread_mutex_lock(&r->mu);
    send = f->world == 1 ? fsdp_part(f, f->gbuf, u) : spans_get(r, &r->narrow);
    pthread_mutex_unlock(&r->mu);
    if (!send)
      return -1;
    uint16_t *h = send;
    bool bf = r->gt == TY_BF16;
    for (int64_t i = 0; i < n; i++)
      h[i] = bf ? optc_f32_to_bf16(g[i]) : optc_f32_to_f16(g[i]);
  }
  int rc = fsdp_reduce(f, u, send);
  r->st.reduces++;
  r->st.reduced_bytes += (double)n * type_size(r->gt);
  r->st.reduce_s += now_seconds() - t0;
  pthread_mutex_lock(&r->mu);
  if (send != g && send != fsdp_part(f, f->gbuf, u))
    spans_put(&r->narrow, send);
  if (!in_place(r, r->gt))
    spans_put(&r->wide, g);
  r->gspan[u] = NULL;
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* Unit u's piece of the optimizer step, by the caller's step_unit. */
static int job_step(FsdpRun *r, int u) {
  double t0 = now_seconds();
  int rc = r->o.step_unit(r->o.step_ctx, u);
  double t1 = now_seconds();
  r->step_t0[u] = t0, r->step_t1[u] = t1;
  r->st.step_s += t1 - t0;
  r->st.steps++;
  return rc;
}

/* Runs a job; then, under mu, records what it did and wakes the waiters. */
static void job_run(FsdpRun *r, Job j) {
  int rc = j.kind == JOB_GATHER ? job_gather(r, j.u) : j.kind == JOB_REDUCE ? job_reduce(r, j.u) : job_step(r, j.u);
  pthread_mutex_lock(&r->mu);
  if (rc != 0)
    r->failed = true;
  if (j.kind == JOB_GATHER)
    r->pstate[j.u] = P_READY;
  else if (j.kind == JOB_REDUCE)
    r->reducing[j.u] = false, r->nreducing--;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

static void *comm_main(void *arg) {
  FsdpRun *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (r->qlen == 0 && !r->stop)
      pthread_cond_wait(&r->cv, &r->mu);
    if (r->qlen == 0)
      break;
    Job j = r->queue[r->qhead];
    r->qhead = (r->qhead + 1) % r->qcap, r->qlen--;
    r->busy = true;
    bool skip = r->failed; /* after a failure the peers may be gone: run nothing more */
    pthread_mutex_unlock(&r->mu);
    if (skip) {
      pthread_mutex_lock(&r->mu);
      if (j.kind == JOB_GATHER)
        r->pstate[j.u] = P_READY;
      else if (j.kind == JOB_REDUCE)
        r->reducing[j.u] = false, r->nreducing--;
    } else {
      job_run(r, j);
      pthread_mutex_lock(&r->mu);
    }
    r->busy = false;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* Queues a job (called with mu held), or runs it at once without a thread. */
static void job_queue(FsdpRun *r, JobKind kind, int u) {
  if (kind == JOB_GATHER)
    r->pstate[u] = P_ASKED;
  else if (kind == JOB_REDUCE)
    r->reducing[u] = true, r->nreducing++;
  if (!r->threaded) { /* the model's thread runs it: all of it waited for */
    pthread_mutex_unlock(&r->mu);
    double t0 = now_seconds();
    job_run(r, (Job){kind, u});
    pthread_mutex_lock(&r->mu);
    r->st.wait_s += now_seconds() - t0;
    return;
  }
  if (r->qlen == r->qcap) {
    Job *q = malloc(sizeof(Job) * (size_t)(2 * r->qcap));
    ASSERT(q);
    for (int i = 0; i < r->qlen; i++)
      q[i] = r->queue[(r->qhead + i) % r->qcap];
    free(r->queue);
    r->queue = q, r->qhead = 0, r->qcap *= 2;
  }
  r->queue[(r->qhead + r->qlen) % r->qcap] = (Job){kind, u};
  r->qlen++;
  pthread_cond_broadcast(&r->cv);
}

/* Waits on cv (with mu held), the model's thread's time counted as waiting. */
static void wait_cv(FsdpRun *r) {
  double t0 = now_seconds();
  pthread_cond_wait(&r->cv, &r->mu);
  r->st.wait_s += now_seconds() - t0;
}

/* ---- what the hooks ask for (the model's thread, mu held) ------------------------------ */

static void ask_params(FsdpRun *r, int u) {
  if (u >= 0 && u < r->nunits && r->pstate[u] == P_NONE)
    job_queue(r, JOB_GATHER, u);
}

static int params_ready(FsdpRun *r, int u) {
  ask_params(r, u);
  while (r->pstate[u] != P_READY && !r->failed)
    wait_cv(r);
  if (r->failed)
    return -1;
  point(r, r->params, u, r->pf32[u]);
  return 0;
}

static void params_free(FsdpRun *r, int u) {
  if (r->pstate[u] != P_READY)
    return;
  if (!in_place(r, r->pt)) /* an f32 gather, or the widened copy */
    spans_put(&r->wide, r->pf32[u]);
  r->pf32[u] = NULL;
  r->pstate[u] = P_NONE;
  point(r, r->params, u, NULL);
}

/* Unit u's f32 grads span, zeroed on the step's first micro-batch; with
 * another unit's grads still going out, after them. */
static int grads_ready(FsdpRun *r, int u) {
  Fsdp *f = r->f;
  if (!r->gspan[u]) {
    ASSERT(r->micro == 0); /* a unit's grads live from the first micro-batch to the last */
    while (r->nreducing > 1 && !r->failed) /* two units' grads at once, at most */
      wait_cv(r);
    r->gspan[u] = in_place(r, r->gt) ? fsdp_part(f, f->gbuf, u) : spans_get(r, &r->wide);
    if (!r->gspan[u] || r->failed)
      return -1;
    memset(r->gspan[u], 0, sizeof(float) * (size_t)span_len(r, u));
  }
  point(r, r->grads, u, r->gspan[u]);
  return 0;
}

/* Waits for every job: the Coll is the caller's again. */
static int drain(FsdpRun *r) {
  while ((r->qlen > 0 || r->busy || r->nreducing > 0) && !r->failed)
    wait_cv(r);
  while (r->threaded && (r->qlen > 0 || r->busy)) /* after a failure: the jobs it skips */
    pthread_cond_wait(&r->cv, &r->mu);
  return r->failed ? -1 : 0;
}

/* The unit the model needs after u in this pass, to prefetch: forward
 * goes up, backward down; the embedding's backward reads no params. */
static int next_unit(const FsdpRun *r, int u, L4Pass pass) {
  if (pass == L4_FORWARD)
    return u + 1 < r->nunits ? u + 1 : -1;
  return u - 1 >= 1 ? u - 1 : -1;
}

static int hook_begin(void *ctx, int u, L4Pass pass) {
  FsdpRun *r = ctx;
  pthread_mutex_lock(&r->mu);
  int rc = r->failed ? -1 : 0;
  bool need = !(pass == L4_BACKWARD && u == 0); /* the embedding's backward adds rows, reads none */
  if (rc == 0 && need) {
    ask_params(r, u);
    /* the next unit's gather, to run while this one computes (the head's
     * forward runs into its backward: the backward's first) */
    if (r->threaded)
      ask_params(r, u == r->nunits - 1 && r->o.training ? u - 1 : next_unit(r, u, pass));
    rc = params_ready(r, u);
  }
  if (rc == 0 && pass == L4_BACKWARD)
    rc = grads_ready(r, u);
  pthread_mutex_unlock(&r->mu);
  return rc;
}

static int hook_end(void *ctx, int u, L4Pass pass) {
  FsdpRun *r = ctx;
  pthread_mutex_lock(&r->mu);
  int rc = r->failed ? -1 : 0;
  if (rc == 0 && pass == L4_BACKWARD) {
    point(r, r->grads, u, NULL);
    if (r->micro + 1 == r->nmicro) {
      job_queue(r, JOB_REDUCE, u);
      if (r->o.step_unit) /* its piece of the step, once its grads are in */
        job_queue(r, JOB_STEP, u);
    }
  }
  /* forward: freed unless the backward is to find them; backward: done */
  if (pass == L4_BACKWARD || r->o.reshard_after_forward || !r->o.training)
    params_free(r, u);
  /* the run's last hook: every collective done before the caller's own */
  if ((pass == L4_BACKWARD && u == 0) || (pass == L4_FORWARD && u == r->nunits - 1)) {
    bool steps = pass == L4_BACKWARD && r->o.step_unit && r->micro + 1 == r->nmicro;
    r->bwd_end = now_seconds();
    if (drain(r) != 0)
      rc = -1;
    /* of the units' steps, what ran before the backward ended was hidden behind it */
    for (int k = 0; steps && r->threaded && k < r->nunits; k++)
      r->st.step_hidden_s += MAX(0.0, MIN(r->step_t1[k], r->bwd_end) - r->step_t0[k]);
    if (pass == L4_FORWARD) /* a forward alone: a prefetch it did not use */
      for (int k = 0; k < r->nunits; k++)
        params_free(r, k);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* ---- the run ---------------------------------------------------------------------------- */

FsdpRun *fsdp_run_create(Fsdp *f, const FsdpRunOptions *o) {
  FsdpRun *r = calloc(1, sizeof *r);
  ASSERT(r);
  r->f = f;
  r->o = *o;
  r->pt = (Type)f->g->bufs[f->pbuf].type;
  r->gt = (Type)f->g->bufs[f->gbuf].type;
  r->ntensors = f->full.ntensors;
  r->nunits = f->nunits;
  r->params = calloc((size_t)r->ntensors + 1, sizeof(float *));
  r->grads = calloc((size_t)r->ntensors + 1, sizeof(float *));
  r->pf32 = calloc((size_t)f->nunits + 1, sizeof(float *));
  r->pstate = calloc((size_t)f->nunits + 1, sizeof(int));
  r->gspan = calloc((size_t)f->nunits + 1, sizeof(float *));
  r->reducing = calloc((size_t)f->nunits + 1, sizeof(bool));
  r->step_t0 = calloc((size_t)f->nunits + 1, sizeof(double));
  r->step_t1 = calloc((size_t)f->nunits + 1, sizeof(double));
  ASSERT(r->step_t0 && r->step_t1);
  r->qcap = 16;
  r->queue = malloc(sizeof(Job) * (size_t)r->qcap);
  ASSERT(r->params && r->grads && r->pf32 && r->pstate && r->gspan && r->reducing && r->queue);
  r->wide.bytes = (size_t)(f->most + 1) * sizeof(float);
  r->narrow.bytes = (size_t)(f->most + 1) * sizeof(uint16_t);
  r->nmicro = 1;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  /* a thread of its own for the collectives, when there are peers and the
   * Coll may be called from it; its waits sleep, leaving the cores to the
   * model */
  if (o->overlap && f->world > 1 && coll_threads_ok(f->coll) &&
      pthread_create(&r->thread, NULL, comm_main, r) == 0) {
    r->threaded = true;
    coll_set_polite(f->coll, true);
  }
  return r;
}

void fsdp_run_free(FsdpRun *r) {
  if (!r)
    return;
  pthread_mutex_lock(&r->mu);
  drain(r);
  r->stop = true;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  if (r->threaded)
    pthread_join(r->thread, NULL);
  for (int u = 0; u < r->nunits; u++) {
    params_free(r, u);
    if (r->gspan[u] && !in_place(r, r->gt))
      spans_put(&r->wide, r->gspan[u]);
  }
  spans_free(r, &r->wide);
  spans_free(r, &r->narrow);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r->params);
  free(r->grads);
  free(r->pf32);
  free(r->pstate);
  free(r->gspan);
  free(r->reducing);
  free(r->step_t0);
  free(r->step_t1);
  free(r->queue);
  free(r);
}

L4Hooks fsdp_run_hooks(FsdpRun *r) { return (L4Hooks){hook_begin, hook_end, r}; }
float *const *fsdp_run_params(FsdpRun *r) { return r->params; }
float *const *fsdp_run_grads(FsdpRun *r) { return r->grads; }

void fsdp_run_micro(FsdpRun *r, int micro, int nmicro) {
  r->micro = micro;
  r->nmicro = nmicro;
}

void fsdp_run_set_training(FsdpRun *r, bool training) { r->o.training = training; }

bool fsdp_run_failed(const FsdpRun *r) { return r->failed; }
bool fsdp_run_threaded(const FsdpRun *r) { return r->threaded; }

FsdpRunStats fsdp_run_stats(FsdpRun *r) {
  pthread_mutex_lock(&r->mu);
  FsdpRunStats s = r->st;
  s.threaded = r->threaded;
  s.spans_wide = r->wide.most_out, s.spans_narrow = r->narrow.most_out;
  s.span_bytes = (double)r->wide.most_out * (double)r->wide.bytes + (double)r->narrow.most_out * (double)r->narrow.bytes;
  pthread_mutex_unlock(&r->mu);
  return s;
}

void fsdp_run_plan_spans(const FsdpRunOptions *o, Type pt, Type gt, int world, int nunits, int accum, int *wide,
                         int *narrow) {
  /* per unit held: its params as f32 (unless read in place) and its grads
   * as f32 (unless written in place); one collective at a time has a
   * 16-bit span besides (a 16-bit gather before it is widened, or 16-bit
   * grads going out), on several ranks */
  int wp = pt == TY_F32 && world == 1 ? 0 : 1, wg = gt == TY_F32 && world == 1 ? 0 : 1;
  /* the most units held at once. Their params: the one in use and, with
   * the collectives beside the compute (on several ranks), the next; or,
   * kept for the backward, all. Their grads: the one being computed, or
   * all while a step accumulates. The collectives run one after another,
   * so a unit's grads going out and the next params coming in are never
   * held together: one more span, either way. */
  bool async = o->overlap && world > 1;
  int params = o->reshard_after_forward ? (async ? 2 : 1) : nunits;
  int grads = accum > 1 ? nunits : 1;
  *wide = params * wp + grads * wg;
  *narrow = world > 1 && (pt != TY_F32 || gt != TY_F32) ? 1 : 0;
}
