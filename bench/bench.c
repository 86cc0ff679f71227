/* bench.c: `optc bench optimizer`: the optimizer step, four ways, on one
 * machine, in one run, against the memory bandwidth a STREAM-style copy and
 * triad reach in the same run.
 *
 *   eager            the front end's graph, op by op, tensor by tensor
 *                    (torch's for-loop path)
 *   foreach          the same, each op over every tensor (torch's foreach)
 *   fused-reference  a hand-written fused AdamW loop, -O3 -march=native
 *                    (torch's fused=True); AdamW only
 *   compiled         optc's CPU backend; and its GPU backend when a GPU is
 *                    visible (a row of its own, against the device's copy
 *                    bandwidth: the CPU's ceiling says nothing about it)
 *
 * Bandwidth is counted with the traffic model's bytes (the compiled plan's
 * bytes per element, the least the step can move), so the strategies are
 * compared on the same useful work; eager's own traffic is shown beside it.
 * The strategies run in turns: two warm-up rounds, then --reps timed ones; a
 * round times the in-place update once and each strategy's step once, in
 * an order that rotates, and % of the update is the median of each round's
 * own ratio (a shared VM's bandwidth drifts by half within a minute; the
 * update timed beside the step moves with it). Times are the median and
 * spread over the rounds. The workload is the tensor-size mix of the
 * recipe's model (Scout's by default), scaled to --params elements, at least
 * 1 GiB of buffers by default so that no cache holds it. */
#include "passes.h"
#include "bench.h"

#include "args.h"
#include "tools.h"
#include "fused_ref.h"

#include <jansson.h>
#include <linux/perf_event.h>
#include <math.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef OPTC_LLVM_VERSION
#define LLVM_VERSION_TEXT OPTC_LLVM_VERSION
#else
#define LLVM_VERSION_TEXT "none"
#endif

static const char usage[] =
    "usage: optc bench optimizer [options]\n"
    "\n"
    "Times one optimizer step four ways in one run, against the machine's\n"
    "memory bandwidth measured in the same run:\n"
    "  eager            the step graph op by op, tensor by tensor (torch's for-loop)\n"
    "  foreach          op by op over every tensor at once (torch's foreach)\n"
    "  fused-reference  a hand-written fused AdamW loop, -O3 -march=native (AdamW only)\n"
    "  compiled         optc's compiled step (LLVM, multithreaded); and on the GPU\n"
    "                   (NVRTC) when one is visible, against its device-to-device copy\n"
    "\n"
    "options:\n"
    "  --config FILE        a recipe: its optimizer, dtypes, clipping and model's tensor mix\n"
    "                       (default: AdamW over Llama 4 Scout's tensor mix)\n"
    "  --params N           elements in the group (default: enough for 1 GiB of buffers);\n"
    "                       suffixes k, M, G\n"
    "  --layout L           fp32, bf16 or bf16-fp32states (default fp32; overrides the recipe)\n"
    "  --clip               clip_grad_norm 1.0 (adds the norm pass)\n"
    "  --threads N          threads for compiled, fused-reference and the ceiling (default: all cores)\n"
    "  --cpu NAME           compile the compiled step for another CPU (e.g. haswell: AVX2 only);\n"
    "                       without it the step runs through the public API (include/optc.h)\n"
    "  --reps N             timed rounds (default 5), after 2 warm-up ones: a round runs\n"
    "                       each strategy once, and the in-place update beside them\n"
    "  --strategies LIST    comma-separated subset (default: all four)\n"
    "  --json FILE          also write the results as JSON\n"
    "  --plot FILE.png      also plot them (gnuplot)\n"
    "  -h, --help           this text\n";

typedef enum { S_EAGER, S_FOREACH, S_FUSED, S_COMPILED, NUM_STRATEGIES } Strategy;
static const char *const strategy_names[NUM_STRATEGIES] = {"eager", "foreach", "fused-reference", "compiled"};

typedef struct {
  bool ran;
  double ms_median, ms_min, ms_max;
  double moved_bytes_per_elem; /* the strategy's own traffic */
  double cycles_per_elem;      /* every thread's cycles over the timed steps, per element per step */
  double pct_update;           /* the median over rounds of its GB/s over the round's in-place update */
  char note[96];
} Result;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of n values (sorted here). */
static double median_of(double *x, int n) {
  qsort(x, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/* The result of reps timed steps (ms, sorted here): median and spread. */
static Result timed_result(double *times, int reps, double moved_bytes_per_elem) {
  double median = median_of(times, reps);
  return (Result){true, median, times[0], times[reps - 1], moved_bytes_per_elem, 0, 0, ""};
}

/* One row of the JSON's results[]: the fields tests/bench/schema.py checks,
 * GB/s at the traffic model's bytes, and the percentage of ceiling_gbps
 * (the CPU's triad, or the GPU's copy). */
static json_t *result_json(const char *strategy, const char *backend, const char *layout, bool clip, const Result *x,
                           double elems, double plan_bytes, double ceiling_gbps, const Result *eager) {
  double gbps = elems * plan_bytes / (x->ms_median * 1e-3) / 1e9;
  json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "strategy", strategy, "backend",
                        backend, "layout", layout, "clip", clip, "ms_median", x->ms_median, "ms_min", x->ms_min, "ms_max",
                        x->ms_max, "gbps", gbps, "pct_of_triad", ceiling_gbps > 0 ? 100 * gbps / ceiling_gbps : 0,
                        "params_per_s", elems / (x->ms_median * 1e-3), "moved_bytes_per_element",
                        x->moved_bytes_per_elem);
  if (eager->ran)
    json_object_set_new(o, "speedup_vs_eager", json_real(eager->ms_median / x->ms_median));
  return o;
}

/* ---- STREAM-style ceiling ------------------------------------------------------------- */

typedef struct {
  double *a, *b, *c;
  double s;
  int kind; /* 0 copy, 1 triad, 2 update, 3 fill */
} Stream;

static void stream_range(void *ctx, int64_t lo, int64_t hi) {
  Stream *st = ctx;
  if (st->kind == 0)
    stream_copy(st->a, st->b, lo, hi);
  else if (st->kind == 1)
    stream_triad(st->a, st->b, st->c, st->s, lo, hi);
  else if (st->kind == 2)
    stream_update(st->a, st->b, 1e-9, lo, hi);
  else
    for (int64_t i = lo; i < hi; i++)
      st->a[i] = 1.0, st->b[i] = 2.0, st->c[i] = 0.5;
}

/* Three arrays of n doubles, first touched by the threads that use the pages. */
static Stream stream_new(ThreadPool *pool, int64_t n) {
  Stream st = {malloc(sizeof(double) * (size_t)n), malloc(sizeof(double) * (size_t)n),
               malloc(sizeof(double) * (size_t)n), 3.0, 3};
  ASSERT(st.a && st.b && st.c);
  pool_run(pool, stream_range, &st, n);
  return st;
}

static void stream_free(Stream *st) {
  free(st->a);
  free(st->b);
  free(st->c);
}

/* GB/s of one run of a kind over n elements (STREAM's bytes). */
static double stream_once(ThreadPool *pool, Stream *st, int64_t n, int kind) {
  st->kind = kind;
  double t0 = now_seconds();
  pool_run(pool, stream_range, st, n);
  double dt = now_seconds() - t0;
  return (double)n * (kind == 0 ? 16 : 24) / dt / 1e9;
}

/* Best of reps, as STREAM reports: GB/s of copy (16 B/elem), triad (24)
 * and the in-place update (24). STREAM counts the bytes a loop asks for;
 * copy and triad also make DRAM read each written line first
 * (write-allocate), which they do not count, so an in-place loop like the
 * optimizer's can count more GB/s than triad. update shows that ceiling. */
static void measure_ceiling(ThreadPool *pool, Stream *st, int64_t n, int reps, double *copy, double *triad,
                            double *update) {
  double *best[3] = {copy, triad, update};
  *copy = *triad = *update = 0;
  for (int r = 0; r < reps + 1; r++)
    for (int kind = 0; kind < 3; kind++) {
      double gbps = stream_once(pool, st, n, kind);
      if (r > 0) /* the first round warms up */
        *best[kind] = MAX(*best[kind], gbps);
    }
}

/* ---- cycles ----------------------------------------------------------------------------------
 * Cycles per element: what every thread of the process spent on a step,
 * per element. From the CPU's cycle counter through perf_event_open where
 * the kernel allows it (opened before the thread pool, so that its threads
 * inherit it); else the process's CPU time times the clock, which a chain
 * of dependent adds (one cycle each on any x86-64) measures. */

typedef struct {
  int fd;          /* the perf counter, or -1 */
  double hz;       /* the measured clock, for the fallback */
  const char *how; /* what the figures come from */
} Cycles;

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double thread_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The clock this thread runs at: n dependent register adds take n cycles
 * (a chain of immediate adds does not: some CPUs fold those at rename).
 * Best of five, so that a preemption does not count. */
static double measure_hz(void) {
  double best = 0;
#if defined(__x86_64__)
  for (int rep = 0; rep < 5; rep++) {
    const long n = 20000000;
    double t0 = thread_seconds();
    long x = 0, one = 1;
    for (long i = 0; i < n / 8; i++)
      __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                       "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
                       : "+r"(x)
                       : "r"(one));
    double dt = thread_seconds() - t0;
    if (dt > 0)
      best = MAX(best, (double)n / dt);
  }
#endif
  return best;
}

static void cycles_init(Cycles *c) {
  struct perf_event_attr a = {.type = PERF_TYPE_HARDWARE, .size = sizeof a, .config = PERF_COUNT_HW_CPU_CYCLES,
                              .inherit = 1, .exclude_kernel = 1, .exclude_hv = 1};
  c->fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
  c->hz = 0;
  c->how = "perf counters (user-mode cycles)";
  if (c->fd < 0) {
    c->hz = measure_hz();
    c->how = c->hz > 0 ? "CPU time x the clock (no perf counters here)" : "nothing (no perf counters, no clock)";
  }
}

/* Cycles so far: counted, or CPU seconds times the clock. */
static double cycles_now(const Cycles *c) {
  if (c->fd >= 0) {
    uint64_t v = 0;
    return read(c->fd, &v, sizeof v) == (ssize_t)sizeof v ? (double)v : 0;
  }
  return cpu_seconds() * c->hz;
}

/* ---- the workload ------------------------------------------------------------------------- */

typedef struct {
  ParamGroup *pg;
  uint64_t seed;
} Fill;

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill_range(void *ctx, int64_t lo, int64_t hi) {
  Fill *f = ctx;
  const Graph *g = f->pg->g;
  uint64_t s = f->seed ^ (uint64_t)lo * 0x632be59bd9b4e019ull;
  for (int b = 0; b < g->nbufs; b++) {
    Type t = (Type)g->bufs[b].type;
    BufKind k = g->bufs[b].kind;
    if (type_is_code(t) || g->bufs[b].per_block)
      continue; /* a quantized state: codes 0, scales 0 (group_alloc's zeros), torchao's start */
    for (int64_t i = lo; i < hi; i++) {
      /* params ~ U(-1, 1), grads ~ U(-0.01, 0.01), states 0 (v >= 0) */
      float u = (float)((splitmix(&s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
      float v = k == BUF_PARAM ? u : k == BUF_GRAD ? u * 0.01f : 0.0f;
      if (t == TY_F32)
        ((float *)f->pg->bufs[b])[i] = v;
      else if (t == TY_BF16)
        ((uint16_t *)f->pg->bufs[b])[i] = optc_f32_to_bf16(v);
      else if (t == TY_F16)
        ((uint16_t *)f->pg->bufs[b])[i] = optc_f32_to_f16(v);
      else
        ((double *)f->pg->bufs[b])[i] = v;
    }
  }
}

/* The model's tensor sizes (torchtune's layout, which its FSDP shards),
 * scaled to about n elements in all, each at least 1. */
static int64_t *scaled_mix(const L4Config *m, int64_t n, int *count) {
  InvTensor *inv;
  int k = inventory_tensors(m, true, &inv);
  double total = 0;
  for (int i = 0; i < k; i++)
    total += (double)inv[i].numel;
  int64_t *sizes = malloc(sizeof(int64_t) * (size_t)k);
  ASSERT(sizes);
  for (int i = 0; i < k; i++)
    sizes[i] = MAX(1, (int64_t)llround((double)inv[i].numel * (double)n / total));
  free(inv);
  *count = k;
  return sizes;
}

/* ---- the fused reference, multithreaded ---------------------------------------------------- */

typedef struct {
  FusedLayout layout;
  void *p, *g, *m, *v;
  FusedAdamW s;
  float scale;
  double *partial; /* per thread share, for the norm */
  ThreadPool *pool;
  int64_t n;
} FusedRun;

static void fused_update(void *ctx, int64_t lo, int64_t hi) {
  FusedRun *f = ctx;
  fused_adamw(f->layout, f->p, f->g, f->m, f->v, lo, hi, &f->s);
}

static void fused_norm(void *ctx, int64_t lo, int64_t hi) {
  FusedRun *f = ctx;
  int share = (int)(lo * pool_size(f->pool) / (f->n ? f->n : 1));
  f->partial[share] = fused_sumsq(f->layout, f->g, lo, hi, f->scale);
}

/* One fused AdamW step over the flat buffers (padding included: it is
 * zeros, and a fused kernel over a flat buffer would do the same). */
static void fused_step(FusedRun *f, const Graph *g, const double *in, double step, bool clip) {
  Ref lr = graph_find_input(g, "lr"), b1 = graph_find_input(g, "beta1"), b2 = graph_find_input(g, "beta2");
  Ref eps = graph_find_input(g, "eps"), wd = graph_find_input(g, "weight_decay");
  double L = in[lr], B1 = in[b1], B2 = in[b2], WD = wd != NOREF ? in[wd] : 0;
  f->scale = 1.0f; /* world_size / num_tokens = 1 in the bench */
  float coef = 1.0f;
  if (clip) {
    int nt = pool_size(f->pool);
    double parts[1024] = {0};
    f->partial = parts;
    pool_run(f->pool, fused_norm, f, f->n);
    double ss = 0;
    for (int i = 0; i < nt; i++)
      ss += parts[i];
    coef = (float)MIN(1.0, 1.0 / (sqrt(ss) + 1e-6));
  }
  f->s = (FusedAdamW){.grad_mul = f->scale * coef, .keep = (float)(1 - L * WD), .w1 = (float)(1 - B1),
                      .w2 = (float)(1 - B2), .beta2 = (float)B2, .eps = (float)in[eps],
                      .step_size = (float)(L / (1 - pow(B1, step))), .bc2_sqrt = (float)sqrt(1 - pow(B2, step))};
  pool_run(f->pool, fused_update, f, f->n);
}

/* ---- the machine ------------------------------------------------------------------------------ */

static void cpu_model(char *out, size_t n) {
  snprintf(out, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10)) {
      char *c = strchr(line, ':');
      if (c) {
        c += 2;
        c[strcspn(c, "\n")] = 0;
        snprintf(out, n, "%s", c);
      }
      break;
    }
  fclose(f);
}

static bool cpu_flag(const char *flag) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return false;
  char line[8192];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    if (!strncmp(line, "flags", 5)) {
      char pat[64];
      snprintf(pat, sizeof pat, " %s ", flag);
      strcat(line, " ");
      found = strstr(line, pat) != NULL;
      break;
    }
  fclose(f);
  return found;
}

static int64_t parse_count(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s)
    return -1;
  if (*end == 'k' || *end == 'K')
    v *= 1e3, end++;
  else if (*end == 'M')
    v *= 1e6, end++;
  else if (*end == 'G')
    v *= 1e9, end++;
  return *end || v < 1 ? -1 : (int64_t)v;
}

static int write_text(FILE *f, void *ctx) { return fputs(ctx, f) < 0 ? -1 : 0; }

/* ---- the GPU row ------------------------------------------------------------------------------ */

typedef struct {
  Result res;
  double copy_gbps; /* device-to-device copy, counted as read + write */
  double compile_ms;
  char device[256];
} GpuResult;

/* The compiled step on GPU 0, on the same values (uploaded once: the
 * params stay on the device, as they do in a GPU finetune), with the
 * device's copy bandwidth as its ceiling. False when no GPU is visible, or
 * (the reason in out->res.note) when it fails. */
static bool bench_gpu(const Graph *g, ParamGroup *pg, double *vals, int reps, GpuResult *out) {
  char why[256];
  if (!cuda_nvrtc_available(why, sizeof why) || !cuda_device_available(why, sizeof why))
    return false; /* no GPU visible: no row */
  cuda_device_describe(out->device, sizeof out->device);
  CompileTimes t = {0};
  CudaProgram *prog = cuda_compile(g, &(CudaTarget){.no_cache = true}, &t);
  char err[512] = "compile failed";
  CudaExec *x = prog ? cuda_exec_create(prog, g, &pg->layout, err, sizeof err) : NULL;
  if (!x || cuda_exec_upload(x, pg->bufs) != 0) {
    snprintf(out->res.note, sizeof out->res.note, "n/a: %.80s", err);
    cuda_exec_free(x);
    cuda_program_free(prog);
    return false;
  }
  out->compile_ms = t.build + t.codegen;
  Ref sref = graph_find_input(g, "step");
  double *times = calloc((size_t)reps, sizeof(double));
  bool ok = true;
  for (int rep = -2; ok && rep < reps; rep++) {
    if (sref != NOREF)
      vals[sref] = rep + 3;
    StepResult sr;
    double t0 = now_seconds();
    ok = cuda_step(x, &(StepArgs){vals, 1}, &sr) == 0;
    if (rep >= 0)
      times[rep] = (now_seconds() - t0) * 1e3;
  }
  if (ok) {
    out->res = timed_result(times, reps, g->plan->bytes_per_element);
    size_t bytes = (size_t)pg->layout.total * 4;
    CudaPtr a = cuda_malloc(bytes), b = cuda_malloc(bytes);
    double ms = a && b ? cuda_copy_ms(b, a, bytes, 10) : -1;
    out->copy_gbps = ms > 0 ? 2.0 * (double)bytes / (ms * 1e6) : 0;
    cuda_free(a);
    cuda_free(b);
  } else {
    snprintf(out->res.note, sizeof out->res.note, "n/a: the step failed on the GPU");
  }
  free(times);
  cuda_exec_free(x);
  cuda_program_free(prog);
  return ok;
}

/* ---- the command ---------------------------------------------------------------------------------- */

int bench_optimizer(int argc, char **argv) {
  const char *config = NULL, *layout = NULL, *json_path = NULL, *plot_path = NULL, *strategies = NULL, *cpu_name = NULL;
  int64_t nparams = 0;
  int threads = 0, reps = 5;
  bool clip = false;
  Args p;
  args_init(&p, "optc bench optimizer", argc, argv);
  const char *v;
  while (args_next(&p)) {
    if (args_help(&p)) {
      fputs(usage, stdout);
      return 0;
    } else if (args_flag(&p, "--clip")) {
      clip = true;
    } else if (args_value(&p, "--config", &config) || args_value(&p, "--layout", &layout) ||
               args_value(&p, "--json", &json_path) || args_value(&p, "--plot", &plot_path) ||
               args_value(&p, "--cpu", &cpu_name) || args_value(&p, "--strategies", &strategies) ||
               args_int(&p, "--threads", 1, 1024, &threads) || args_int(&p, "--reps", 1, 1000000, &reps)) {
    } else if (args_value(&p, "--params", &v)) {
      if (v && (nparams = parse_count(v)) < 1) {
        error("--params needs a positive count, like 64M, not '%s'", v);
        p.rc = 2;
      }
    } else {
      args_unknown(&p);
    }
  }
  if (p.rc)
    return p.rc;
  const char *dtype = "fp32", *states = NULL;
  if (layout) {
    if (!strcmp(layout, "fp32"))
      dtype = "fp32";
    else if (!strcmp(layout, "bf16"))
      dtype = "bf16";
    else if (!strcmp(layout, "bf16-fp32states"))
      dtype = "bf16", states = "fp32";
    else {
      error("unknown --layout '%s'; expected fp32, bf16 or bf16-fp32states", layout);
      return 2;
    }
  }
  bool run[NUM_STRATEGIES] = {true, true, true, true};
  if (strategies) {
    memset(run, 0, sizeof run);
    char *list = strdup(strategies);
    for (char *save, *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
      int k = 0;
      while (k < NUM_STRATEGIES && strcmp(strategy_names[k], s))
        k++;
      if (k == NUM_STRATEGIES) {
        error("unknown strategy '%s'; expected eager, foreach, fused-reference or compiled", s);
        free(list);
        return 2;
      }
      run[k] = true;
    }
    free(list);
  }

  /* The recipe: the given one with --layout/--clip applied, or AdamW over
   * Scout's tensor mix. */
  Arena *arena = arena_new();
  const char *ov[4];
  int nov = 0;
  char ov_dtype[64], ov_states[64];
  if (layout) {
    snprintf(ov_dtype, sizeof ov_dtype, "dtype=%s", dtype);
    ov[nov++] = ov_dtype;
    snprintf(ov_states, sizeof ov_states, "optimizer_state_dtype=%s", states ? states : dtype);
    ov[nov++] = ov_states;
  }
  if (clip)
    ov[nov++] = "clip_grad_norm=1.0";
  static const char default_recipe[] =
      "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 2e-5\n  fused: False\ndtype: fp32\n"
      "model:\n  _component_: torchtune.models.llama4.llama4_scout_17b_16e\n";
  TrainConfig tc;
  Recipe *r = config ? recipe_open(config, ov, nov, arena, &tc) : recipe_from_text("<bench>", default_recipe, ov, nov, arena);
  if (r && !config && train_config_read(r, &tc) != 0)
    r = NULL;
  if (!r) {
    arena_free(arena);
    return 1;
  }
  clip = r->has_clip;
  Graph *g = frontend_build(r);
  if (!g) {
    arena_free(arena);
    return 1;
  }
  Graph *unopt = graph_clone(g, arena);
  if (!pipeline_run(g, &(PipelineOptions){0})) {
    arena_free(arena);
    return 1;
  }
  L4Config model = tc.has_model ? tc.model : l4_config_scout(); /* no model: Scout's mix */
  double bytes_per_buffer_elem = 0;
  for (int b = 0; b < g->nbufs; b++)
    bytes_per_buffer_elem += buffer_elem_bytes(g, b);
  if (!nparams)
    nparams = ((int64_t)1 << 30) / bytes_per_buffer_elem + 1;
  int ntensors;
  int64_t *sizes = scaled_mix(&model, nparams, &ntensors);
  Cycles cyc;
  cycles_init(&cyc); /* before the pool, whose threads inherit the counter */
  ThreadPool *pool = pool_create(threads);
  threads = pool_size(pool);

  ParamGroup pg;
  if (group_alloc(&pg, g, ntensors, sizes) != 0) {
    pool_free(pool);
    free(sizes);
    arena_free(arena);
    return 1;
  }
  int64_t n = pg.layout.total;
  Fill fill = {&pg, 12345};
  pool_run(pool, fill_range, &fill, n);
  double plan_bytes = g->plan->bytes_per_element;
  double eager_bytes = eager_traffic(unopt);

  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("optc bench optimizer: %s, %s params/grads, %s states%s\n", r->component, type_names[r->param_dtype],
         type_names[r->state_dtype], clip ? ", clip_grad_norm" : "");
  printf("  %lld elements in %d tensors (%s's mix), %.2f GiB of buffers; %d thread%s on %s\n",
         (long long)pg.layout.total, ntensors, model.component, (double)n * bytes_per_buffer_elem / (1 << 30), threads,
         threads == 1 ? "" : "s", cpu);
  printf("  traffic model: %g bytes/element compiled (%d phase%s), %g eager\n", plan_bytes, g->plan->nphases,
         g->plan->nphases == 1 ? "" : "s", eager_bytes);

  /* compile: cold (no cache), then cached */
  CompileTimes cold = {0}, warm = {0};
  CpuProgram *prog = NULL;
  Executor api = {0}; /* the compiled step through include/optc.h */
  double compile_cold = 0, compile_cached = 0;
  if (run[S_COMPILED] && cpu_backend_available()) {
    CpuTarget nocache = {.cpu = cpu_name, .no_cache = true}, target = {.cpu = cpu_name};
    CpuProgram *first = cpu_compile(g, &nocache, &cold);
    prog = first ? cpu_compile(g, &target, &warm) : NULL;
    if (first && prog) {
      /* that one populated the cache; time a compile that hits it */
      cpu_program_free(prog);
      warm = (CompileTimes){0};
      prog = cpu_compile(g, &target, &warm);
    }
    cpu_program_free(first);
    /* The step runs as a library user's does, through the public API (the
     * compile above hit the cache that the API's build hits too). --cpu
     * compiles for another CPU, which only the compiler's own target takes. */
    if (prog && !cpu_name) {
      optc_step *s;
      optc_error err;
      if (optc_step_from_recipe(r->path, r->src.text, (const char *const *)r->overrides, r->noverrides,
                                OPTC_TARGET_CPU, &s, &err) != OPTC_OK) {
        fprintf(stderr, "%s\n", err.message);
        cpu_program_free(prog);
        prog = NULL;
      } else {
        executor_init_api(&api, s, g, threads, pool);
      }
    }
    compile_cold = cold.build + cold.opt + cold.codegen + cold.link;
    compile_cached = warm.build + warm.opt + warm.codegen + warm.link;
  }

  double copy_gbps, triad_gbps, update_gbps;
  int64_t nstream = MAX(n, (int64_t)16 << 20);
  Stream st = stream_new(pool, nstream);
  measure_ceiling(pool, &st, nstream, 3, &copy_gbps, &triad_gbps, &update_gbps);
  printf("  ceiling: copy %.1f GB/s, triad %.1f GB/s, in-place update %.1f GB/s (STREAM-style, %d threads, same run)\n",
         copy_gbps, triad_gbps, update_gbps, threads);
  /* remembered for `optc plan`'s default bandwidth */
  if (n * bytes_per_buffer_elem >= (int64_t)1 << 30) {
    char rec[256];
    snprintf(rec, sizeof rec, "{\"copy_gbps\": %.3f, \"triad_gbps\": %.3f, \"update_gbps\": %.3f, \"threads\": %d}\n",
             copy_gbps, triad_gbps, update_gbps, threads);
    cache_mkdir();
    char *path = cache_path("bench", "bandwidth");
    file_write_atomic(path, rec, strlen(rec));
    free(path);
  }

  double *vals = calloc((size_t)g->nins + 1, sizeof(double));
  double *vals_un = calloc((size_t)unopt->nins + 1, sizeof(double));
  Binding first = {"step", 1};
  inputs_resolve(g, NULL, 0, &first, 1, vals);
  inputs_resolve(unopt, NULL, 0, &first, 1, vals_un);
  Ref sref = graph_find_input(g, "step"), sref_un = graph_find_input(unopt, "step");
  bool adamw = !strcmp(r->optimizer_name, "adamw") || !strcmp(r->optimizer_name, "adamw_fused");
  FusedLayout fl = r->param_dtype == TY_F32 ? FUSED_FP32 : r->state_dtype == TY_F32 ? FUSED_BF16_FP32_STATES : FUSED_BF16;
  bool fused_ok = adamw && r->param_dtype == r->grad_dtype && (r->param_dtype == TY_F32 || r->param_dtype == TY_BF16) &&
                  (r->state_dtype == TY_F32 || r->state_dtype == TY_BF16) && !r->master_weights &&
                  !r->stochastic_rounding;
  int pb = 0, gb = 1, mb = graph_find_buffer(g, "exp_avg"), vb = graph_find_buffer(g, "exp_avg_sq");
  FusedRun fr = {fl, pg.bufs[pb], pg.bufs[gb], mb >= 0 ? pg.bufs[mb] : NULL, vb >= 0 ? pg.bufs[vb] : NULL};
  fr.pool = pool;
  fr.n = n;

  Result res[NUM_STRATEGIES] = {0};
  int order[NUM_STRATEGIES], nrun = 0; /* the strategies that run, in a round's first order */
  for (int s = 0; s < NUM_STRATEGIES; s++) {
    if (!run[s])
      continue;
    if (s == S_FUSED && !fused_ok)
      snprintf(res[s].note, sizeof res[s].note, "n/a: written for AdamW without SR or master weights");
    else if (s == S_COMPILED && !prog)
      snprintf(res[s].note, sizeof res[s].note, "n/a: %s", cpu_backend_available() ? "compile failed" : "built without LLVM");
    else
      order[nrun++] = s;
  }
  double *times = calloc((size_t)(NUM_STRATEGIES * reps), sizeof(double)), *upd = calloc((size_t)reps, sizeof(double));
  double cycles[NUM_STRATEGIES] = {0}, step = 0;
  ASSERT(times && upd);
  for (int rep = -2; rep < reps; rep++) {
    double u = stream_once(pool, &st, nstream, 2);
    if (rep >= 0)
      upd[rep] = u;
    for (int q = 0; q < nrun; q++) {
      int s = order[(q + rep + 2) % nrun];
      step += 1;
      if (sref != NOREF)
        vals[sref] = step;
      if (sref_un != NOREF)
        vals_un[sref_un] = step;
      StepResult sr;
      double c0 = cycles_now(&cyc);
      double t0 = now_seconds();
      switch ((Strategy)s) {
      case S_EAGER:
        pg.g = unopt;
        eager_run(unopt, &pg.layout, pg.bufs, &(StepArgs){vals_un, 1}, &sr, false, pool);
        break;
      case S_FOREACH:
        pg.g = unopt;
        eager_run(unopt, &pg.layout, pg.bufs, &(StepArgs){vals_un, 1}, &sr, true, pool);
        break;
      case S_FUSED: fused_step(&fr, g, vals, step, clip); break;
      case S_COMPILED:
        pg.g = g;
        if (api.api)
          executor_step(&api, &pg, &(StepArgs){vals, 1}, &sr);
        else
          cpu_step(prog, pool, g, &pg.layout, pg.bufs, &(StepArgs){vals, 1}, &sr);
        break;
      default: unreachable();
      }
      double dt = (now_seconds() - t0) * 1e3;
      double dc = cycles_now(&cyc) - c0;
      if (rep >= 0)
        times[s * reps + rep] = dt, cycles[s] += dc;
    }
  }
  for (int q = 0; q < nrun; q++) {
    int s = order[q];
    double *t = times + s * reps, *pct = calloc((size_t)reps, sizeof(double));
    ASSERT(pct);
    for (int k = 0; k < reps; k++) /* this round's step over this round's update */
      pct[k] = 100 * (double)n * plan_bytes / (t[k] * 1e-3) / 1e9 / upd[k];
    res[s] = timed_result(t, reps, s <= S_FOREACH ? eager_bytes : plan_bytes);
    res[s].pct_update = median_of(pct, reps);
    res[s].cycles_per_elem = cycles[s] / ((double)reps * (double)n);
    free(pct);
  }
  double upd_median = median_of(upd, reps), upd_min = upd[0], upd_max = upd[reps - 1];
  printf("  in-place update once a round, beside the steps: median %.1f GB/s (%.1f-%.1f)\n\n", upd_median, upd_min,
         upd_max);
  free(times);
  free(upd);
  stream_free(&st);
  pg.g = g;
  GpuResult gpu = {0};
  bool gpu_ran = run[S_COMPILED] && bench_gpu(g, &pg, vals, reps, &gpu);

  /* the table */
  double elems = (double)n;
  const char *layout_name = layout ? layout : type_names[r->param_dtype];
  printf("  %-16s %10s %14s %9s %9s %9s %12s %10s %9s\n", "strategy", "ms", "spread", "GB/s", "% triad", "% update",
         "params/s", "vs eager", "cyc/elem");
  json_t *results = json_array();
  for (int s = 0; s < NUM_STRATEGIES; s++) {
    if (!run[s])
      continue;
    if (!res[s].ran) {
      printf("  %-16s %s\n", strategy_names[s], res[s].note);
      continue;
    }
    double gbps = elems * plan_bytes / (res[s].ms_median * 1e-3) / 1e9;
    double pct = 100 * gbps / triad_gbps;
    double speedup = res[S_EAGER].ran ? res[S_EAGER].ms_median / res[s].ms_median : 0;
    char spread[48], vs[24];
    snprintf(spread, sizeof spread, "%.1f-%.1f", res[s].ms_min, res[s].ms_max);
    if (res[S_EAGER].ran)
      snprintf(vs, sizeof vs, "%.2fx", speedup);
    else
      snprintf(vs, sizeof vs, "-");
    printf("  %-16s %10.2f %14s %9.1f %8.1f%% %8.1f%% %12.3g %10s %9.2f\n", strategy_names[s], res[s].ms_median, spread,
           gbps, pct, res[s].pct_update, elems / (res[s].ms_median * 1e-3), vs, res[s].cycles_per_elem);
    json_t *o = result_json(strategy_names[s], "cpu", layout_name, clip, &res[s], elems, plan_bytes, triad_gbps,
                            &res[S_EAGER]);
    json_object_set_new(o, "pct_of_update", json_real(res[s].pct_update));
    json_object_set_new(o, "cycles_per_element", json_real(res[s].cycles_per_elem));
    json_array_append_new(results, o);
  }
  if (gpu_ran) {
    double gbps = elems * plan_bytes / (gpu.res.ms_median * 1e-3) / 1e9;
    double pct = gpu.copy_gbps > 0 ? 100 * gbps / gpu.copy_gbps : 0;
    double speedup = res[S_EAGER].ran ? res[S_EAGER].ms_median / gpu.res.ms_median : 0;
    char spread[48];
    snprintf(spread, sizeof spread, "%.2f-%.2f", gpu.res.ms_min, gpu.res.ms_max);
    printf("  %-16s %10.3f %14s %9.1f %19s %12.3g %9.2fx\n", "compiled (cuda)", gpu.res.ms_median, spread, gbps, "",
           elems / (gpu.res.ms_median * 1e-3), speedup);
    printf("    on %s: %.0f GB/s device copy, %.1f%% of it; NVRTC compile %.0f ms\n", gpu.device, gpu.copy_gbps, pct,
           gpu.compile_ms);
    json_t *o = result_json("compiled", "cuda", layout_name, clip, &gpu.res, elems, plan_bytes, gpu.copy_gbps,
                            &res[S_EAGER]);
    json_object_set_new(o, "ceiling", json_string("device-to-device copy (pct_of_triad is % of it)"));
    json_object_set_new(o, "ceiling_gbps", json_real(gpu.copy_gbps));
    json_object_set_new(o, "device", json_string(gpu.device));
    json_object_set_new(o, "compile_ms", json_real(gpu.compile_ms));
    json_array_append_new(results, o);
  } else if (gpu.res.note[0]) {
    printf("  %-16s %s\n", "compiled (cuda)", gpu.res.note);
  }
  printf("\n  cyc/elem: every thread's cycles per element per step, from %s", cyc.how);
  if (cyc.fd < 0 && cyc.hz > 0)
    printf(", %.2f GHz", cyc.hz / 1e9);
  printf("\n");
  if (prog)
    printf("  compile%s%s: %.1f ms cold (LLVM build %.1f, O3 %.1f, codegen %.1f, link %.1f); %.2f ms from the disk cache\n",
           cpu_name ? " for " : "", cpu_name ? cpu_name : "", compile_cold, cold.build, cold.opt, cold.codegen, cold.link,
           compile_cached);

  int rc = 0;
  if (json_path || plot_path) {
    struct utsname un;
    uname(&un);
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *root = json_pack(
        "{s:{s:s, s:i, s:i, s:s, s:s, s:b, s:b}, s:{s:f, s:f, s:f}, s:o, s:{s:f, s:f}, s:{s:s, s:s, s:I, s:i, s:f, s:f}}",
        "machine", "cpu", cpu, "cores", pool_default_threads(), "threads", threads, "kernel", un.release, "date", date,
        "avx2", cpu_flag("avx2"), "avx512f", cpu_flag("avx512f"), "ceiling", "copy_gbps", copy_gbps, "triad_gbps",
        triad_gbps, "update_gbps", update_gbps, "results", results, "compile_ms", "cold", compile_cold, "cached", compile_cached, "workload",
        "optimizer", r->component, "model", model.component, "elements", (json_int_t)n, "tensors", ntensors,
        "bytes_per_element", plan_bytes, "eager_bytes_per_element", eager_bytes);
    json_object_set_new(root, "optc", json_pack("{s:s, s:s}", "version", OPTC_VERSION, "llvm", LLVM_VERSION_TEXT));
    /* the update timed once a round beside the steps: what pct_of_update divides by, round by round */
    json_object_set_new(json_object_get(root, "ceiling"), "update_in_rounds_gbps",
                        json_pack("{s:f, s:f, s:f}", "median", upd_median, "min", upd_min, "max", upd_max));
    if (json_path) {
      char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
      if (file_write_atomic_with(json_path, write_text, text) != 0)
        rc = 1;
      free(text);
    }
    if (plot_path && rc == 0) {
      /* a bar per strategy, and the copy and triad ceilings as lines */
      Buf script = {0};
      buf_printf(&script,
                 "set terminal pngcairo size 900,520 font ',11'\nset output '%s.tmp.png'\n"
                 "set title 'optc bench optimizer: %s, %s, %lld elements, %d threads'\n"
                 "set ylabel 'GB/s (traffic-model bytes)'\nset style fill solid 0.8\nset boxwidth 0.6\n"
                 "set yrange [0:%g]\nset xtics nomirror\nset grid ytics\n"
                 "plot '-' using 0:2:xtic(1) with boxes lc rgb '#4477aa' title 'step', "
                 "%g with lines lw 2 lc rgb '#cc3311' title 'triad %.1f GB/s', "
                 "%g with lines lw 2 dt 2 lc rgb '#ee7733' title 'copy %.1f GB/s', "
                 "%g with lines lw 2 dt 3 lc rgb '#009988' title 'in-place update %.1f GB/s'\n",
                 plot_path, r->component, layout_name, (long long)n, threads,
                 MAX(MAX(copy_gbps, triad_gbps), update_gbps) * 1.25, triad_gbps, triad_gbps, copy_gbps, copy_gbps,
                 update_gbps, update_gbps);
      for (int s = 0; s < NUM_STRATEGIES; s++)
        if (res[s].ran)
          buf_printf(&script, "\"%s\" %g\n", strategy_names[s], elems * plan_bytes / (res[s].ms_median * 1e-3) / 1e9);
      buf_puts(&script, "e\n");
      FILE *gp = popen("gnuplot 2>&1", "w");
      int prc = -1;
      if (gp) {
        fputs(script.data, gp);
        prc = pclose(gp);
      }
      char tmp[4096];
      snprintf(tmp, sizeof tmp, "%s.tmp.png", plot_path);
      if (prc != 0 || rename(tmp, plot_path) != 0) {
        error("gnuplot could not draw %s (is gnuplot installed? apt-get install gnuplot-nox)", plot_path);
        unlink(tmp);
        rc = 1;
      }
      buf_free(&script);
    }
    json_decref(root);
  } else {
    json_decref(results);
  }
  free(vals);
  free(vals_un);
  cpu_program_free(prog);
  executor_free(&api);
  group_free(&pg);
  pool_free(pool);
  free(sizes);
  arena_free(arena);
  return rc;
}
