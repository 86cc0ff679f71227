/* exec_cpu.c: runs a compiled step on the CPU.
 *
 * A thread pool splits each phase's chunk table into contiguous ranges,
 * one per thread; each chunk writes its own reduction partials, and the
 * partials are folded in chunk order afterwards, so the result does not
 * depend on the number of threads. Between phases the host folds the
 * step-scope reductions and evaluates the step values of the next
 * ^stepK segment with the interpreter's own arithmetic. */
#include "rt.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* ---- the thread pool ------------------------------------------------------------- */

struct ThreadPool {
  int n;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  void (*fn)(void *ctx, int64_t lo, int64_t hi);
  void *ctx;
  int64_t total;
  unsigned generation;
  int pending;
  bool stop;
};

typedef struct {
  ThreadPool *pool;
  int index;
} Worker;

static void run_share(ThreadPool *p, int i) {
  int64_t lo = p->total * i / p->n, hi = p->total * (i + 1) / p->n;
  if (lo < hi)
    p->fn(p->ctx, lo, hi);
}

static void *worker_main(void *arg) {
  Worker *w = arg;
  ThreadPool *p = w->pool;
  unsigned seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (p->generation == seen && !p->stop)
      pthread_cond_wait(&p->work, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      break;
    }
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    run_share(p, w->index);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0)
      pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
  }
  free(w);
  return NULL;
}

int pool_default_threads(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    return MAX(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

ThreadPool *pool_create(int n) {
  ThreadPool *p = calloc(1, sizeof *p);
  ASSERT(p);
  p->n = n < 1 ? pool_default_threads() : n;
  p->threads = calloc((size_t)p->n, sizeof(pthread_t));
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  /* the caller's thread is worker 0 */
  for (int i = 1; i < p->n; i++) {
    Worker *w = malloc(sizeof *w);
    ASSERT(w);
    *w = (Worker){p, i};
    if (pthread_create(&p->threads[i], NULL, worker_main, w) != 0) {
      error("cannot start thread %d of %d", i, p->n);
      free(w);
      p->n = i;
      break;
    }
  }
  return p;
}

int pool_size(const ThreadPool *p) { return p->n; }

void pool_run(ThreadPool *p, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx, int64_t total) {
  if (p->n == 1 || total <= 1) {
    if (total > 0)
      fn(ctx, 0, total);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->total = total;
  p->pending = p->n - 1;
  p->generation++;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  run_share(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->pending > 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void pool_free(ThreadPool *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++)
    pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  free(p->threads);
  free(p);
}

/* ---- a compiled step ----------------------------------------------------------------- */

typedef struct {
  PhaseFn fn;
  const GroupLayout *l;
  void *const *bufs;
  const Scalar *step, *tvals;
  double *partials;
  int nred;
} PhaseRun;

static void run_range(void *ctx, int64_t lo, int64_t hi) {
  PhaseRun *r = ctx;
  r->fn(r->l->chunks + lo, hi - lo, r->bufs, r->step, r->tvals, r->partials + lo * r->nred);
}

static bool grads_all_finite(const Graph *g, const GroupLayout *l, void *const *tbufs) {
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind != BUF_GRAD)
      continue;
    Type t = (Type)g->bufs[b].type;
    for (int64_t c = 0; c < l->nchunks; c++) {
      const Chunk *ch = &l->chunks[c];
      const void *p = tbufs[(size_t)ch->tensor * (size_t)g->nbufs + (size_t)b];
      for (int64_t i = ch->start; i < ch->start + ch->len; i++) {
        float v = t == TY_F32 ? ((const float *)p)[i]
                  : t == TY_BF16 ? optc_bf16_to_f32(((const uint16_t *)p)[i])
                  : t == TY_F16  ? optc_f16_to_f32(((const uint16_t *)p)[i])
                                 : (float)((const double *)p)[i];
        if (!isfinite(v))
          return false;
      }
    }
  }
  return true;
}

int cpu_step(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *bufs,
             const StepArgs *args, StepResult *res) {
  void **t = layout_tensor_bufs(l, g, bufs);
  int rc = cpu_step_t(prog, pool, g, l, t, args, res);
  free(t);
  return rc;
}

int cpu_step_t(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *bufs,
               const StepArgs *args, StepResult *res) {
  const Plan *p = g->plan;
  memset(res, 0, sizeof *res);
  const Reducer *red = args ? args->reducer : NULL;
  const GroupLayout *gl = red ? red->global : l; /* the chunks the reductions fold over */
  bool ok = !args || args->propagate || args->grads_finite != 0;
  if (ok && (!args || (!args->propagate && args->grads_finite < 0)))
    ok = grads_all_finite(g, l, bufs);
  if (red)
    ok = red->all(red->ctx, ok);
  int maxred = 1;
  for (int k = 0; k < p->nphases; k++)
    maxred = MAX(maxred, p->phases[k].nreds);
  Scalar *step = calloc((size_t)g->nins + 1, sizeof(Scalar));
  Scalar *tvals = calloc(((size_t)gl->ntensors + 1) * ((size_t)g->nins + 1), sizeof(Scalar));
  double *partials = malloc(sizeof(double) * ((size_t)l->nchunks + 1) * (size_t)maxred);
  double *global = red ? malloc(sizeof(double) * ((size_t)gl->nchunks + 1) * (size_t)maxred) : partials;
  double *per_tensor = malloc(sizeof(double) * ((size_t)gl->ntensors + 1));
  ASSERT(step && tvals && partials && global && per_tensor);
  for (int k = 0; ok && k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    interp_eval_steps(g, ph->step_lo, ph->step_hi, args ? args->inputs : NULL, step);
    PhaseRun run = {cpu_program_phase(prog, k), l, bufs, step, tvals, partials, ph->nreds ? ph->nreds : 1};
    pool_run(pool, run_range, &run, l->nchunks);
    if (ph->nreds && red)
      red->gather(red->ctx, partials, l->nchunks, run.nred, global);
    for (int i = 0; i < ph->nreds; i++) {
      Ref r = ph->reds[i];
      RedKind kind = (RedKind)g->ins[r].red;
      bool is_max = kind == RED_MAX || kind == RED_ABSMAX;
      if (g->ins[r].to == SCOPE_STEP) {
        double acc = layout_fold(global, gl->nchunks, run.nred, i, is_max);
        step[r].d = acc;
        if (res->nred < (int)ARRAY_LEN(res->red))
          res->red[res->nred++] = acc;
        if (!isfinite(acc) && !(args && args->propagate) && gl->nchunks > 0)
          ok = false;
      } else {
        layout_fold_tensors(gl, global, run.nred, i, is_max, per_tensor);
        for (int t = 0; t < gl->ntensors; t++)
          tvals[(size_t)t * (size_t)g->nins + (size_t)r].d = per_tensor[t];
      }
    }
  }
  res->skipped = !ok;
  free(step);
  free(tvals);
  if (global != partials)
    free(global);
  free(partials);
  free(per_tensor);
  return 0;
}
