/* fuzz_api.c: the public C API (include/optc.h) with arguments drawn from
 * the fuzz bytes.
 *
 * Input: a mode byte, then
 *   mode even: an optc_spec: optimizer, dtypes, fused, clip, nonfinite,
 *              torch_cpu, target and up to 4 options (named from torch's
 *              hyperparameters and a few bytes of the input), each field
 *              sometimes out of its enum's range;
 *   mode odd:  a recipe for optc_step_from_recipe: its text up to a NUL,
 *              then NUL-separated overrides (at most 4), then nothing more:
 *              the run's choices come from a hash of the text.
 * A step that builds is queried (in and out of range) and run twice on 0-3
 * small tensors in the caller's memory with random scalars, the second run
 * sometimes on one rank's slice (optc_step_run_shard, the other ranks'
 * partials zero), which must leave the tensors outside the slice as they were. The buffers end
 * at a guard page (64-byte aligned, as torch's are), so the compiled code,
 * which no sanitizer sees, faults if it writes past a tensor's end.
 * Properties, from optc.h's conventions: bad input returns an error code,
 * never aborts; every status is an optc_status with a message when not
 * OK; a failed run changes nothing the caller owns, and a skipped one
 * (non-finite grads, SKIP) no param or state.
 *
 * The disk cache is off (OPTC_CACHE=0) unless XDG_CACHE_HOME or OPTC_CACHE
 * is set: run.sh points XDG_CACHE_HOME at its scratch directory. */
#include <math.h>
#include <sys/mman.h>

#include "fuzz.h"
#include "optc.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!getenv("XDG_CACHE_HOME") && !getenv("OPTC_CACHE"))
    setenv("OPTC_CACHE", "0", 1);
  return 0;
}

/* ---- memory that ends at a guard page ---------------------------------------- */
typedef struct {
  void *map;
  size_t maplen;
  void *p;
} Guarded;

static void *guarded_alloc(Guarded *g, size_t nbytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (nbytes + 63) / 64 * 64;
  size_t span = (body + page - 1) / page * page;
  if (span == 0)
    span = page;
  g->maplen = span + page;
  g->map = mmap(NULL, g->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g->map == MAP_FAILED)
    abort();
  if (mprotect((char *)g->map + span, page, PROT_NONE) != 0)
    abort();
  g->p = (char *)g->map + span - body;
  return g->p;
}

static void guarded_free(Guarded *g) {
  if (g->map)
    munmap(g->map, g->maplen);
  *g = (Guarded){0};
}

/* ---- drawing arguments ------------------------------------------------------- */
static const char *const optimizers[] = {
    "torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD", "torch.optim.Adagrad", "torch.optim.RMSprop",
    "optc.Lion", "optc.grad_norm", "adamw", "adam", "sgd", "adagrad", "rmsprop", "lion", "grad_norm",
    "torch.optim.LBFGS", "", "Adam W", "../recipes/optimizers/adamw.optir"};
static const char *const option_names[] = {
    "lr", "betas", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening", "alpha", "lr_decay",
    "initial_accumulator_value", "amsgrad", "maximize", "nesterov", "centered", "decoupled_weight_decay",
    "foreach", "capturable", "differentiable", "fused", "step", "max_norm", "_component_", "lr.x"};
static const char *const scalar_names[] = {"lr", "step", "beta1", "beta2", "eps", "weight_decay", "momentum",
                                           "grad_scale", "max_norm", "num_tokens", "world_size", "torch_threads",
                                           "grad_norm_given", "amsgrad", "bogus"};

static double draw_value(FuzzIn *in) {
  static const double table[] = {0, 1, -1, 0.5, 1e-3, 0.9, 0.999, 1e-8, 2, 10, 1e30, -1e30, 1e-300, INFINITY,
                                 -INFINITY, NAN, 3, 100, 0.1, 4096};
  uint8_t k = fuzz_u8(in);
  if (k < 200)
    return table[k % ARRAY_LEN(table)];
  return fuzz_f64(in);
}

/* A key-shaped name of 1-8 bytes (is_key's alphabet), or one from names. */
static const char *draw_name(FuzzIn *in, const char *const *names, size_t n, char buf[16]) {
  uint8_t k = fuzz_u8(in);
  if (k < 240)
    return names[k % n];
  static const char alpha[] = "abcdefghijklmnopqrstuvwxyz_.0123456789AZ";
  int len = 1 + fuzz_u8(in) % 8;
  for (int i = 0; i < len; i++)
    buf[i] = alpha[fuzz_u8(in) % (sizeof alpha - 1)];
  buf[len] = 0;
  return buf;
}

static bool valid_status(optc_status st) { return st >= OPTC_OK && st <= OPTC_ERR_NONFINITE; }

static void check_err(optc_status st, const optc_error *err) {
  FUZZ_CHECK(valid_status(st), "status %d", (int)st);
  FUZZ_CHECK(err->code == st, "err.code %d, status %d", (int)err->code, (int)st);
  FUZZ_CHECK(memchr(err->message, 0, sizeof err->message), "err.message is not NUL-terminated");
  FUZZ_CHECK(st == OPTC_OK ? err->message[0] == 0 : err->message[0] != 0, "status %d with message '%s'", (int)st,
             err->message);
}

static int dtype_size(optc_dtype d) { return d == OPTC_F32 ? 4 : 2; }

/* ---- running a step ------------------------------------------------------------ */
enum { MAX_TENSORS = 3, MAX_STATES = 8 };

/* One rank alone: the other ranks' partials are zeros (an all-reduce of a zeroed global). */
static int solo_gather(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                       double *global) {
  (void)ctx;
  FUZZ_CHECK(first >= 0 && nlocal >= 0 && first + nlocal <= nglobal, "chunks [%lld, +%lld) of %lld",
             (long long)first, (long long)nlocal, (long long)nglobal);
  memset(global, 0, sizeof(double) * (size_t)(nglobal * width));
  memcpy(global + first * width, local, sizeof(double) * (size_t)(nlocal * width));
  return 0;
}

static int solo_all(void *ctx, int local) { return (void)ctx, local; }

static void run_step(optc_step *s, FuzzIn *in) {
  /* the queries, in range and out of it */
  int nstates = optc_step_num_states(s);
  FUZZ_CHECK(nstates >= 0 && nstates <= MAX_STATES, "%d states", nstates);
  for (int k = -1; k <= nstates; k++) {
    double v = 0;
    const char *name = optc_step_state_name(s, k);
    FUZZ_CHECK((k >= 0 && k < nstates) == (name != NULL), "state %d of %d: name %p", k, nstates, (void *)name);
    optc_step_state_dtype(s, k);
    optc_step_state_init(s, k, &v);
    optc_step_state_init(s, k, NULL);
  }
  int nscalars = optc_step_num_scalars(s);
  for (int i = -1; i <= nscalars; i++) {
    double d;
    const char *name = optc_step_scalar_name(s, i, &d);
    FUZZ_CHECK((i >= 0 && i < nscalars) == (name != NULL), "scalar %d of %d: name %p", i, nscalars, (void *)name);
  }
  optc_step_bytes_per_element(s);
  FUZZ_CHECK(optc_step_ir(s) && optc_step_plan(s), "no IR or plan text");

  int n = fuzz_u8(in) % (MAX_TENSORS + 1);
  int64_t numel[MAX_TENSORS];
  Guarded mem[MAX_TENSORS][2 + MAX_STATES] = {{{0}}};
  void *param[MAX_TENSORS], *grad[MAX_TENSORS], *state[MAX_STATES * MAX_TENSORS];
  /* the dtypes, from the step: param and grad from the IR's buffers */
  const char *ir = optc_step_ir(s);
  optc_dtype pd = strstr(ir, "param @param : bf16") ? OPTC_BF16 : strstr(ir, "param @param : f16") ? OPTC_F16 : OPTC_F32;
  optc_dtype gd = strstr(ir, "grad @grad : bf16") ? OPTC_BF16 : strstr(ir, "grad @grad : f16") ? OPTC_F16 : OPTC_F32;
  for (int t = 0; t < n; t++) {
    uint8_t k = fuzz_u8(in);
    numel[t] = k < 16 ? 0 : k < 200 ? k % 40 : 1000 + k;
    int sizes[2 + MAX_STATES];
    sizes[0] = dtype_size(pd);
    sizes[1] = dtype_size(gd);
    for (int j = 0; j < nstates; j++)
      sizes[2 + j] = dtype_size(optc_step_state_dtype(s, j));
    for (int j = 0; j < 2 + nstates; j++) {
      size_t nb = (size_t)numel[t] * (size_t)sizes[j];
      void *p = numel[t] == 0 && (k & 1) ? NULL : guarded_alloc(&mem[t][j], nb);
      /* values: small bit patterns from the input, so some are NaN or inf */
      for (size_t b = 0; p && b < nb; b++)
        ((uint8_t *)p)[b] = (uint8_t)(b % (size_t)sizes[j] == (size_t)sizes[j] - 1 ? 0x3c + (fuzz_u8(in) & 0x83)
                                                                                      : fuzz_u8(in));
      if (j == 0)
        param[t] = p;
      else if (j == 1)
        grad[t] = p;
      else
        state[(size_t)(j - 2) * (size_t)n + (size_t)t] = p;
    }
  }
  optc_buffers bufs = {.ntensors = n, .numel = numel, .param = param, .grad = grad, .state = state};
  for (int rep = 0; rep < 2; rep++) {
    optc_scalar sc[8];
    char names[8][16];
    int nsc = fuzz_u8(in) % 9;
    for (int i = 0; i < nsc; i++) {
      uint8_t k = fuzz_u8(in);
      sc[i].name = k < 128 && nscalars > 0 ? optc_step_scalar_name(s, k % nscalars, NULL)
                                           : draw_name(in, scalar_names, ARRAY_LEN(scalar_names), names[i]);
      sc[i].value = draw_value(in);
    }
    /* what the caller owns, before */
    size_t total = 0;
    for (int t = 0; t < n; t++)
      for (int j = 0; j < 2 + nstates; j++)
        total += mem[t][j].p ? mem[t][j].maplen : 0;
    uint8_t *before = malloc(total + 1), *q = before;
    for (int t = 0; t < n; t++)
      for (int j = 0; j < 2 + nstates; j++)
        if (mem[t][j].map) {
          memcpy(q, mem[t][j].map, mem[t][j].maplen - (size_t)sysconf(_SC_PAGESIZE));
          q += mem[t][j].maplen;
        }
    optc_result res;
    optc_error err;
    /* the second run, sometimes: one rank's slice of the group (optc_step_run_shard), the
     * other ranks' chunks zero; a slice off the block grid or past the end is refused */
    uint8_t how = fuzz_u8(in);
    int64_t offset[4] = {0}, flat_total = optc_flat_layout(n, numel, offset);
    optc_shard slice = {(how & 2) ? OPTC_REDUCE_BLOCK * (int64_t)(how >> 6) : 0, 0, solo_gather, solo_all, NULL};
    slice.hi = slice.lo + (int64_t)fuzz_u8(in) * 8;
    bool sharded = rep == 1 && (how & 1);
    optc_status st = sharded ? optc_step_run_shard(s, &bufs, &slice, sc, nsc, fuzz_u8(in) % 3, &res, &err)
                             : optc_step_run(s, &bufs, sc, nsc, fuzz_u8(in) % 3, &res, &err);
    check_err(st, &err);
    FUZZ_CHECK(!sharded || st != OPTC_OK || (slice.lo % OPTC_REDUCE_BLOCK == 0 && slice.hi <= flat_total),
               "a slice [%lld, %lld) of %lld elements ran", (long long)slice.lo, (long long)slice.hi,
               (long long)flat_total);
    /* a sharded run writes nothing of the elements outside its slice */
    if (sharded && st == OPTC_OK && !res.skipped) {
      q = before;
      for (int t = 0; t < n; t++)
        for (int j = 0; j < 2 + nstates; j++)
          if (mem[t][j].map) {
            int64_t lo = MAX(slice.lo, offset[t]) - offset[t], hi = MIN(slice.hi, offset[t] + numel[t]) - offset[t];
            size_t nb = mem[t][j].maplen - (size_t)sysconf(_SC_PAGESIZE);
            if (hi <= lo) /* untouched tensor: every byte as it was */
              FUZZ_CHECK(memcmp(q, mem[t][j].map, nb) == 0,
                         "a slice [%lld, %lld) run changed tensor %d (flat %lld..%lld), buffer %d", (long long)slice.lo,
                         (long long)slice.hi, t, (long long)offset[t], (long long)(offset[t] + numel[t]), j);
            q += mem[t][j].maplen;
          }
    }
    /* a failed run changes nothing; a skipped one (non-finite grads) no param or state */
    if (st != OPTC_OK || res.skipped) {
      q = before;
      for (int t = 0; t < n; t++)
        for (int j = 0; j < 2 + nstates; j++)
          if (mem[t][j].map) {
            FUZZ_CHECK((st == OPTC_OK && j == 1) || memcmp(q, mem[t][j].map, mem[t][j].maplen - (size_t)sysconf(_SC_PAGESIZE)) == 0,
                       "a %s run (status %d: %s) changed tensor %d's buffer %d", st ? "failed" : "skipped", (int)st,
                       err.message, t, j);
            q += mem[t][j].maplen;
          }
    }
    free(before);
  }
  /* NULL arguments */
  optc_error err;
  check_err(optc_step_run(s, NULL, NULL, 0, 1, NULL, &err), &err);
  optc_step_run(s, &bufs, NULL, 1, 1, NULL, NULL);
  for (int t = 0; t < n; t++)
    for (int j = 0; j < 2 + nstates; j++)
      guarded_free(&mem[t][j]);
}

/* ---- building a step --------------------------------------------------------- */
static optc_status from_spec(FuzzIn *in, optc_step **s, optc_error *err) {
  optc_spec spec = optc_spec_default(optimizers[fuzz_u8(in) % ARRAY_LEN(optimizers)]);
  uint8_t k = fuzz_u8(in);
  spec.param_dtype = (optc_dtype)(k & 3);
  spec.grad_dtype = (optc_dtype)((k >> 2) & 3);
  spec.state_dtype = (optc_dtype)((k >> 4) & 3);
  spec.fused = (k >> 6) & 1;
  spec.write_back_grads = k >> 7;
  k = fuzz_u8(in);
  spec.clip = (optc_clip)(k & 3);
  spec.nonfinite = (optc_nonfinite)((k >> 2) & 3);
  static const char *const cpus[] = {NULL, "avx2", "avx512", "auto", "sse"};
  spec.torch_cpu = cpus[(k >> 4) % ARRAY_LEN(cpus)];
  spec.target = (k >> 7) ? (optc_target)(fuzz_u8(in) % 3) : OPTC_TARGET_CPU;
  optc_scalar opts[4];
  char names[4][16];
  spec.noptions = fuzz_u8(in) % 5;
  for (int i = 0; i < spec.noptions; i++) {
    opts[i].name = draw_name(in, option_names, ARRAY_LEN(option_names), names[i]);
    opts[i].value = draw_value(in);
  }
  spec.options = spec.noptions ? opts : NULL;
  return optc_step_new(&spec, s, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzIn in = {data, size};
  uint8_t mode = fuzz_u8(&in);
  optc_step *s = NULL;
  optc_error err;
  optc_status st;
  char *text = NULL;
  if (mode & 1) {
    text = fuzz_text(in.p, in.n);
    const char *ov[4];
    int nov = 0;
    size_t len = strlen(text);
    for (size_t i = len; i < in.n && nov < 4; i += strlen(text + i + 1) + 1)
      ov[nov++] = text + i + 1;
    st = optc_step_from_recipe("fuzz.yaml", text, ov, nov, (mode & 2) ? OPTC_TARGET_CUDA : OPTC_TARGET_CPU, &s, &err);
    /* the run's choices: a hash of the text, spread over 64 bytes */
    static uint8_t choices[64];
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < in.n; i++)
      h = (h ^ in.p[i]) * 1099511628211ull;
    for (size_t i = 0; i < sizeof choices; i++) {
      h ^= h >> 29, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 32;
      choices[i] = (uint8_t)h;
    }
    in = (FuzzIn){choices, sizeof choices};
  } else {
    st = from_spec(&in, &s, &err);
  }
  check_err(st, &err);
  FUZZ_CHECK((st == OPTC_OK) == (s != NULL), "status %d, step %p", (int)st, (void *)s);
  if (s)
    run_step(s, &in);
  optc_step_free(s);
  free(text);
  return 0;
}
