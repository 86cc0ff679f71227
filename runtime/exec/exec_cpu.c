/* exec_cpu.c: runs a compiled step on the CPU.
 *
 * A thread pool splits each phase's chunk table into contiguous ranges,
 * one per thread; each chunk writes its own reduction partials, and the
 * partials are folded in chunk order afterwards, so the result does not
 * depend on the number of threads. Between phases the host folds the
 * step-scope reductions and evaluates the step values of the next
 * ^stepK segment with the interpreter's own arithmetic. */
#include "exec.h"

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

/* ---- the grads' finiteness, before anything is stored --------------------------------- */

/* Whether any of n floats, as unsigned words of the type's width, has its
 * exponent field all ones (Inf or NaN). Written over 16-byte vectors, four
 * at a time, which every x86-64 CPU holds in registers (SSE2) even at -O2:
 * the pass is one read of the grads at memory speed. Reading alone, cores
 * reach less of the memory's bandwidth than the in-place update does, so
 * it prefetches 512 elements ahead; wider vectors gained nothing
 * (bench/results.md, "Measurements behind the emitters' choices"). */
#define NONFINITE_SCAN(name, T, V)                                                                 \
  static bool name(const T *p, int64_t n, T em) {                                                 \
    typedef T vec __attribute__((vector_size(16)));                                                \
    typedef V mask __attribute__((vector_size(16)));                                               \
    enum { L = 16 / sizeof(T) };                                                                   \
    mask any = {0};                                                                                \
    int64_t i = 0;                                                                                 \
    for (; i + 4 * L <= n; i += 4 * L) {                                                           \
      __builtin_prefetch(p + i + 512);                                                             \
      vec a, b, c, d;                                                                              \
      memcpy(&a, p + i, 16);                                                                       \
      memcpy(&b, p + i + L, 16);                                                                   \
      memcpy(&c, p + i + 2 * L, 16);                                                               \
      memcpy(&d, p + i + 3 * L, 16);                                                               \
      any |= ((a & em) == em) | ((b & em) == em) | ((c & em) == em) | ((d & em) == em);            \
    }                                                                                              \
    bool found = false;                                                                            \
    for (int k = 0; k < L; k++)                                                                    \
      found |= any[k] != 0;                                                                        \
    for (; i < n; i++)                                                                             \
      found |= (p[i] & em) == em;                                                                  \
    return found;                                                                                  \
  }
NONFINITE_SCAN(nonfinite16, uint16_t, int16_t)
NONFINITE_SCAN(nonfinite32, uint32_t, int32_t)
NONFINITE_SCAN(nonfinite64, uint64_t, int64_t)

typedef struct {
  const Graph *g;
  const GroupLayout *l;
  void *const *tbufs;
  int found; /* set by any thread that saw an Inf or a NaN */
} FiniteScan;

static void scan_range(void *ctx, int64_t lo, int64_t hi) {
  FiniteScan *s = ctx;
  const Graph *g = s->g;
  for (int64_t c = lo; c < hi && !__atomic_load_n(&s->found, __ATOMIC_RELAXED); c++) {
    const Chunk *ch = &s->l->chunks[c];
    for (int b = 0; b < g->nbufs; b++) {
      if (g->bufs[b].kind != BUF_GRAD)
        continue;
      Type t = (Type)g->bufs[b].type;
      const char *p = s->tbufs[(size_t)ch->tensor * (size_t)g->nbufs + (size_t)b];
      p += ch->start * type_size(t);
      bool bad = t == TY_BF16  ? nonfinite16((const uint16_t *)p, ch->len, 0x7f80)
                 : t == TY_F16 ? nonfinite16((const uint16_t *)p, ch->len, 0x7c00)
                 : t == TY_F32 ? nonfinite32((const uint32_t *)p, ch->len, 0x7f800000u)
                               : nonfinite64((const uint64_t *)p, ch->len, 0x7ff0000000000000ull);
      if (bad)
        __atomic_store_n(&s->found, 1, __ATOMIC_RELAXED);
    }
  }
}

bool grads_all_finite(ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *tbufs) {
  FiniteScan s = {g, l, tbufs, 0};
  if (pool)
    pool_run(pool, scan_range, &s, l->nchunks);
  else
    scan_range(&s, 0, l->nchunks);
  return !s.found;
}

/* Whether the first phase's norm sees every non-finite grad, so that the
 * step's check of it (skipped when not finite) is the grads' check and no
 * pass of its own is needed: the phase stores nothing, and one of its
 * step-scope sums of squares is non-finite whenever a grad element is. A
 * value is non-finite wherever a grad is when it is the grad's load, or a
 * cvt to a float, neg, abs, sqrt, add, sub, mul or fma of such a value
 * (whatever the other operands: Inf times 0 is NaN, Inf minus Inf is NaN),
 * or a div with it as the dividend; a sum of squares of one is Inf or NaN.
 * A select, min, max or a divisor could hide it, so they end the trace. */
static bool norm_checks_grads(const Graph *g) {
  const Plan *p = g->plan;
  if (p->nphases < 2 || p->phases[0].nwrites > 0 || g->nbufs > 64)
    return false;
  const PlanPhase *ph = &p->phases[0];
  uint64_t all = 0;
  for (int b = 0; b < g->nbufs; b++)
    if (g->bufs[b].kind == BUF_GRAD)
      all |= 1ull << b;
  if (!all)
    return false;
  uint64_t *seen = calloc((size_t)(ph->hi - ph->lo) + 1, sizeof(uint64_t)); /* grads each value passes on */
  ASSERT(seen);
  bool ok = false;
  for (Ref i = ph->lo; i < ph->hi && !ok; i++) {
    const Ins *x = &g->ins[i];
    uint64_t m = 0;
    int nargs = op_info[x->op].nargs;
    for (int k = 0; k < nargs; k++) {
      Ref a = x->args[k];
      if (a < ph->lo || a >= ph->hi)
        continue;
      switch (x->op) {
      case OP_CVT: m |= type_is_float((Type)x->type) ? seen[a - ph->lo] : 0; break;
      case OP_NEG: case OP_ABS: case OP_SQRT: case OP_ADD: case OP_SUB: case OP_MUL: case OP_FMA:
      case OP_REDUCE: m |= seen[a - ph->lo]; break;
      case OP_DIV: m |= k == 0 ? seen[a - ph->lo] : 0; break;
      default: break;
      }
    }
    if (x->op == OP_LOAD && g->bufs[x->buf].kind == BUF_GRAD)
      m = 1ull << x->buf;
    seen[i - ph->lo] = m;
    ok = x->op == OP_REDUCE && x->red == RED_SUMSQ && x->to == SCOPE_STEP && (m & all) == all;
  }
  free(seen);
  return ok;
}

bool cpu_first_phase_reduces(const Graph *g, int *width) {
  const Plan *p = g->plan;
  if (p->nphases < 2 || p->phases[0].nwrites > 0 || p->phases[0].nreds == 0)
    return false;
  for (int i = 0; i < p->phases[0].nreds; i++) /* step-scope sums alone: nothing per tensor */
    if (g->ins[p->phases[0].reds[i]].to != SCOPE_STEP)
      return false;
  *width = p->phases[0].nreds;
  return true;
}

int cpu_step_partials_t(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l,
                        void *const *tbufs, const double *inputs, double *partials) {
  int width;
  ASSERT(cpu_first_phase_reduces(g, &width));
  const PlanPhase *ph = &g->plan->phases[0];
  Scalar *step = calloc((size_t)g->nins + 1, sizeof(Scalar));
  Scalar *tvals = calloc(((size_t)l->ntensors + 1) * ((size_t)g->nins + 1), sizeof(Scalar)); /* none yet */
  ASSERT(step && tvals);
  interp_eval_steps(g, ph->step_lo, ph->step_hi, inputs, step);
  PhaseRun run = {cpu_program_phase(prog, 0), l, tbufs, step, tvals, partials, width};
  pool_run(pool, run_range, &run, l->nchunks);
  free(step);
  free(tvals);
  return 0;
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
  if (ok && (!args || (!args->propagate && args->grads_finite < 0)) && !norm_checks_grads(g))
    ok = grads_all_finite(pool, g, l, bufs);
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
    if (k == 0 && args && args->first_partials) /* computed already, chunk by chunk */
      memcpy(partials, args->first_partials, sizeof(double) * (size_t)l->nchunks * (size_t)run.nred);
    else
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
