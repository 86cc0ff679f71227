/* test_cuda_emu: the GPU backend, without a GPU.
 *
 *   test_cuda_emu CUDA_EMU_H CXX [CXX ARGS...]
 *
 * The CUDA C that emit_cuda.c writes for each program is compiled, as it
 * is, by the host C++ compiler (meson passes its own) with tests/cuda_emu.h
 * into a kernel module, and runtime/exec/exec_cuda.c runs it through a
 * stand-in driver built from the same header (OPTC_LIBCUDA). So the
 * kernels' indexing, vector and tail paths, shared-memory staging,
 * barriers and lanes, and the executor's uploads, launches and folds are
 * all checked here; cuda_emu.h says what this cannot show.
 *
 * - Every built-in optimizer (with its graph-changing options) x clipping
 *   on and off x the three dtype layouts x stochastic rounding on and off
 *   (bf16 layouts): tensors of 0, 1, 15, 16, 17 and 100003 elements and
 *   forty small ones, two steps (the second with grads_finite = -1, so the
 *   optc_nonfinite kernel runs): every byte of every buffer, and the
 *   step-scope reductions, equal the interpreter's.
 * - A program with every op, type and scope the emitter renders (f16,
 *   bf16, f32 and f64 buffers, tensor-scope reductions, five reductions in
 *   one phase), one with pow, exp and log per element (exact here: both
 *   sides use glibc), and one whose phase stores and reduces.
 * - Unaligned buffers (the one-by-one path everywhere), 64-bit indices
 *   (a chunk past 2^31 in the flat buffers and past 2^32 in its tensor,
 *   over moved-back base pointers), non-finite grads (skipped as the
 *   interpreter skips), and the text: the same program emits the same
 *   bytes twice. */
#include "exec.h"
#include "steplib.h"

#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *emu_h;
static char **cxx;
static int ncxx;

/* ---- programs ------------------------------------------------------------------------------ */

/* Every op, type and scope the emitter renders; no NaN is made on the way
 * (NaN bits are the hardware's own, and differ between CPUs and GPUs). */
static const char sink_optir[] =
    "param @param : bf16\n"
    "grad @grad : bf16\n"
    "state @m : f16 = 0.0\n"
    "state @acc : f64 = 0.0\n"
    "state @w : f32 = param\n"
    "%seed = input 11 : i64\n"
    "%step = input in [1.0, inf) : f64\n"
    "%stepi = cvt %step : i64\n"
    "%half = const 0.5 : f32\n"
    "%one = const 1.0 : f32\n"
    "%oned = const 1.0 : f64\n"
    "%zi = const 0 : i32\n"
    "%g = load @grad : bf16\n"
    "%gf = cvt %g : f32\n"
    "%tn2 = reduce sumsq %gf to tensor : f64\n"
    "%tmax = reduce max %gf to tensor : f64\n"
    "%amax = reduce absmax %gf to step : f64\n"
    "%gd = cvt %gf : f64\n"
    "%r64 = reduce sumsq %gd to step : f64\n"
    "%r64f = cvt %r64 : f32\n"
    "%gsum = reduce sum %g to step : f64\n"
    "%tn = sqrt %tn2 : f64\n"
    "%tnf = cvt %tn : f32\n"
    "%tden = add %tnf, %one : f32\n"
    "%tmaxf = cvt %tmax : f32\n"
    "%amaxf = cvt %amax : f32\n"
    "%gsumf = cvt %gsum : f32\n"
    "%pb = load @param : bf16\n"
    "%p = cvt %pb : f32\n"
    "%q = div %gf, %tden : f32\n"
    "%ab = abs %q : f32\n"
    "%sg = sign %q : f32\n"
    "%mn = min %q, %half : f32\n"
    "%mx = max %mn, %tmaxf : f32\n"
    "%f = fma %q, %half, %p : f32\n"
    "%lp = lerp %p, %q, %sg : f32\n"
    "%c1 = lt %q, %half : bool\n"
    "%c2 = isfinite %f : bool\n"
    "%c3 = and %c1, %c2 : bool\n"
    "%c4 = not %c3 : bool\n"
    "%c5 = ge %ab, %amaxf : bool\n"
    "%c6 = or %c4, %c5 : bool\n"
    "%sel = select %c6, %lp, %f : f32\n"
    "%rs = rsqrt %tden : f32\n"
    "%neg = neg %rs : f32\n"
    "%qi = cvt %q : i32\n"
    "%k = cvt %p : i64\n"
    "%c7 = ne %qi, %zi : bool\n"
    "%qk = cvt %qi : i64\n"
    "%c8 = le %qk, %k : bool\n"
    "%c9 = and %c7, %c8 : bool\n"
    "%qif = cvt %qi : f32\n"
    "%u = add %sel, %qif : f32\n"
    "%u2 = mul %u, %neg : f32\n"
    "%u3 = sub %u2, %mx : f32\n"
    "%u4 = select %c9, %u2, %u3 : f32\n"
    "%u5a = mul %u4, %gsumf : f32\n"
    "%u5 = div %u5a, %r64f : f32\n"
    "%acc0 = load @acc : f64\n"
    "%qd = cvt %u5 : f64\n"
    "%acc1 = add %acc0, %qd : f64\n"
    "store @acc, %acc1\n"
    "%m0 = load @m : f16\n"
    "%mh = cvt %q : f16\n"
    "%m1 = add %m0, %mh : f16\n"
    "%m2 = mul %m1, %m1 : f16\n"
    "%mb = cvt %m2 : bf16\n"
    "%mbf = cvt %mb : f32\n"
    "store @m, %m1\n"
    "%w0 = load @w : f32\n"
    "%w0b = cvt %w0 : bf16\n"
    "%wq = cvt %q : bf16\n"
    "%w1 = sub %w0b, %wq : bf16\n"
    "%w1f = cvt %w1 : f32\n"
    "%w1a = abs %w1f : f32\n"
    "%w1s = sqrt_mkl %w1a : f32\n"
    "%tw = const 3 : i64\n"
    "%tt = const 2 : i64\n"
    "%tp = tailpos %tw, %tt : i64\n"
    "%tpf = cvt %tp : f32\n"
    "%w1t = fma %w1s, %tpf, %w1f : f32\n"
    "%w2 = add %w1t, %mbf : f32\n"
    "%wsr = cvt_sr %w2, %seed, %stepi : bf16\n"
    "%wsrf = cvt %wsr : f32\n"
    "store @w, %wsrf\n"
    "%pd = cvt %acc1 : bf16\n"
    "%pdf = cvt %pd : f32\n"
    "%pn = add %p, %pdf : f32\n"
    "%pn2 = div %pn, %tden : f32\n"
    "%hsr = cvt_sr %pn2, %seed, %stepi : f16\n"
    "%hb = cvt %hsr : bf16\n"
    "store @param, %hb\n";

/* pow, exp and log per element, in f32 and f64: exact against the
 * interpreter only where both use one libm (here; not on a GPU). */
static const char transc_optir[] =
    "param @param : f32\n"
    "grad @grad : f32\n"
    "%one = const 1.0 : f32\n"
    "%g = load @grad : f32\n"
    "%p = load @param : f32\n"
    "%a = abs %g : f32\n"
    "%e = exp %g : f32\n"
    "%a1 = add %a, %one : f32\n"
    "%l = log %a1 : f32\n"
    "%pw = pow %a1, %p : f32\n"
    "%pd = cvt %p : f64\n"
    "%ed = exp %pd : f64\n"
    "%edf = cvt %ed : f32\n"
    "%s1 = add %e, %l : f32\n"
    "%s2 = add %s1, %pw : f32\n"
    "%s3 = mul %s2, %edf : f32\n"
    "store @param, %s3\n";

/* A phase that stores and reduces: the update and, for the record, the
 * grad's sum of squares and the largest new state, in one pass
 * (the reduction kernel's own loads and stores, one element a thread). */
static const char stored_optir[] =
    "param @param : bf16\n"
    "grad @grad : bf16\n"
    "state @m : f32 = 0.0\n"
    "%g = load @grad : bf16\n"
    "%gf = cvt %g : f32\n"
    "%m0 = load @m : f32\n"
    "%b = input 0.9 : f64\n"
    "%bf = cvt %b : f32\n"
    "%m1 = fma %m0, %bf, %gf : f32\n"
    "store @m, %m1\n"
    "%p0 = load @param : bf16\n"
    "%p0f = cvt %p0 : f32\n"
    "%lr = input 0.01 : f64\n"
    "%lrf = cvt %lr : f32\n"
    "%p1f = fma %m1, %lrf, %p0f : f32\n"
    "%p1 = cvt %p1f : bf16\n"
    "store @param, %p1\n"
    "%gsq = reduce sumsq %gf to step : f64\n"
    "%mmax = reduce absmax %m1 to step : f64\n";

/* ---- building kernel modules ---------------------------------------------------------------- */

/* Runs the commands, at most `jobs` at once; false if any failed. */
static bool run_all(char ***argvs, int n, int jobs) {
  bool ok = true;
  int running = 0, next = 0;
  while (next < n || running > 0) {
    while (running < jobs && next < n) {
      pid_t pid = fork();
      ASSERT(pid >= 0);
      if (pid == 0) {
        execvp(argvs[next][0], argvs[next]);
        fprintf(stderr, "cannot run %s\n", argvs[next][0]);
        _exit(127);
      }
      next++, running++;
    }
    int status;
    if (wait(&status) > 0) {
      running--;
      ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
  }
  return ok;
}

/* The compiler's command line: cxx ARGS... EXTRA... (NULL-terminated). */
static char **command(const char *const *extra, int nextra) {
  char **argv = calloc((size_t)(ncxx + nextra + 1), sizeof(char *));
  ASSERT(argv);
  for (int i = 0; i < ncxx; i++)
    argv[i] = cxx[i];
  for (int i = 0; i < nextra; i++)
    argv[ncxx + i] = strdup(extra[i]);
  return argv;
}

static char **module_command(const char *src, const char *so) {
  const char *extra[] = {"-std=c++17", "-O1", "-fPIC", "-shared", "-fno-strict-aliasing", "-ffp-contract=off",
                         "-Wall", "-Wextra", "-Wno-unused-function", "-Wno-unknown-pragmas",
                         "-Wno-unused-parameter", "-include", emu_h, "-x", "c++", src, "-o", so};
  return command(extra, (int)ARRAY_LEN(extra));
}

static void free_command(char **argv) {
  for (int i = ncxx; argv[i]; i++)
    free(argv[i]);
  free(argv);
}

/* ---- one case --------------------------------------------------------------------------------- */

typedef struct {
  char name[128];
  Arena *arena;
  Graph *g;
  char *source;
  CudaKernel *kernels;
  char cu[256], so[256];
} Case;

static bool case_init(Case *c, const char *name, Graph *g, Arena *a, int index, const CudaTarget *t) {
  snprintf(c->name, sizeof c->name, "%s", name);
  c->arena = a;
  c->g = g;
  CHECK(g != NULL, "%s: the program builds", name);
  if (!g)
    return false;
  Buf src = {0}, again = {0};
  c->kernels = calloc((size_t)g->plan->nphases + 1, sizeof(CudaKernel));
  ASSERT(c->kernels);
  bool ok = cuda_emit(g, t, &src, c->kernels) == 0 && cuda_emit(g, t, &again, NULL) == 0;
  CHECK(ok, "%s: cuda_emit", name);
  CHECK(ok && src.len == again.len && !memcmp(src.data, again.data, src.len), "%s: the same text twice", name);
  c->source = src.data;
  buf_free(&again);
  snprintf(c->cu, sizeof c->cu, "%s", in_dirf("case%d.cu", index).s);
  snprintf(c->so, sizeof c->so, "%s", in_dirf("case%d.so", index).s);
  return ok && file_write_atomic(c->cu, src.data, src.len) == 0;
}

static void case_free(Case *c) {
  free(c->source);
  free(c->kernels);
  arena_free(c->arena);
}

/* The emulated program: its "cubin" is the kernel module's path. */
static CudaProgram emu_program(const Case *c) {
  CudaProgram p = {.source = c->source, .cubin = (void *)c->so, .cubin_len = strlen(c->so) + 1,
                   .nkernels = c->g->plan->nphases + 1, .kernels = c->kernels};
  snprintf(p.arch, sizeof p.arch, "emulated");
  return p;
}

/* Two steps of case c on the executor and on the interpreter, from the
 * same tensors; the second says grads_finite = -1. */
static void run_case(const Case *c, Type pt, Type gt) {
  const Graph *g = c->g;
  TensorFile tf = {0};
  rng = 0x2545f4914f6cdd1dull;
  make_tensors(&tf, pt, gt);
  double *vals = step1_inputs(g, true);
  ParamGroup ref, run;
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0);
  ASSERT(group_from_file(&run, g, &tf, vals, &finite) == 0);
  CudaProgram prog = emu_program(c);
  char err[512];
  CudaExec *x = cuda_exec_create(&prog, g, &run.layout, err, sizeof err);
  CHECK(x, "%s: cuda_exec_create: %s", c->name, err);
  bool ok = x && cuda_exec_upload(x, run.bufs) == 0;
  Ref sref = graph_find_input(g, "step");
  for (int step = 1; ok && step <= 2; step++) {
    if (sref != NOREF)
      vals[sref] = step;
    StepArgs args = {vals, step == 2 ? -1 : finite};
    StepResult r0, r1;
    interp_step(g, &ref.layout, ref.bufs, &args, &r0);
    ok = cuda_step(x, &args, &r1) == 0 && cuda_exec_download(x, run.bufs) == 0;
    CHECK(ok, "%s step %d: cuda_step", c->name, step);
    char what[160];
    snprintf(what, sizeof what, "%s step %d", c->name, step);
    bool same = ok && same_bytes(g, ref.layout.total, ref.bufs, run.bufs, what) && r0.nred == r1.nred &&
                r0.skipped == r1.skipped &&
                (r0.nred == 0 || memcmp(r0.red, r1.red, sizeof(double) * (size_t)r0.nred) == 0);
    CHECK(same, "%s: the emulated GPU step differs from the interpreter", what);
    ok &= same;
  }
  printf("%-44s %s\n", c->name, ok ? "identical" : "DIFFERENT");
  cuda_exec_free(x);
  group_free(&ref);
  group_free(&run);
  free(vals);
  tf_free(&tf);
}

/* ---- the special cases ------------------------------------------------------------------------ */

/* Each chunk alone: a step over a one-chunk layout reports that chunk's
 * partials as its step-scope reductions (0 + p is p), which the fold of a
 * whole group would round away. */
static void test_chunk_partials(const Case *c, Type pt, Type gt) {
  const Graph *g = c->g;
  TensorFile tf = {0};
  rng = 7;
  make_tensors(&tf, pt, gt);
  double *vals = step1_inputs(g, true);
  ParamGroup ref, run;
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0 && group_from_file(&run, g, &tf, vals, &finite) == 0);
  CudaProgram prog = emu_program(c);
  CudaPtr dev[8];
  for (int b = 0; b < g->nbufs; b++)
    dev[b] = (CudaPtr)(uintptr_t)run.bufs[b];
  int64_t same = 0, n = ref.layout.nchunks;
  for (int64_t k = 0; k < n; k++) {
    GroupLayout one = ref.layout;
    one.chunks = &ref.layout.chunks[k];
    one.nchunks = 1;
    StepArgs args = {vals, finite};
    StepResult r0, r1;
    char err[512];
    interp_step(g, &one, ref.bufs, &args, &r0);
    CudaExec *x = cuda_exec_create(&prog, g, &one, err, sizeof err);
    bool ok = x && cuda_exec_bind(x, dev) == 0 && cuda_step(x, &args, &r1) == 0 && r0.nred == r1.nred &&
              !memcmp(r0.red, r1.red, sizeof(double) * (size_t)r0.nred);
    if (!ok && same == k)
      printf("  chunk %lld (tensor %d, %lld elements): %.17g against the interpreter's %.17g\n", (long long)k,
             one.chunks->tensor, (long long)one.chunks->len, r1.red[0], r0.red[0]);
    same += ok;
    cuda_exec_free(x);
  }
  CHECK(same == n, "%s: %lld of %lld chunk partials equal the interpreter's", c->name, (long long)same, (long long)n);
  printf("%-44s %s\n", c->name, same == n ? "every chunk's partials identical" : "DIFFERENT");
  group_free(&ref);
  group_free(&run);
  free(vals);
  tf_free(&tf);
}

/* Buffers moved off 16-byte alignment: every access goes one by one. */
static void test_unaligned(const Case *c) {
  const Graph *g = c->g;
  TensorFile tf = {0};
  make_tensors(&tf, TY_BF16, TY_BF16);
  double *vals = step1_inputs(g, false);
  ParamGroup ref;
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0);
  void *mem[8], *bufs[8];
  CudaPtr dev[8];
  for (int b = 0; b < g->nbufs; b++) {
    size_t es = (size_t)type_size(g->bufs[b].type), bytes = (size_t)ref.layout.total * es;
    mem[b] = alloc64(bytes + 64);
    bufs[b] = (char *)mem[b] + es; /* one element off */
    memcpy(bufs[b], ref.bufs[b], bytes);
    dev[b] = (CudaPtr)(uintptr_t)bufs[b]; /* emulated device memory is host memory */
  }
  CudaProgram prog = emu_program(c);
  char err[512];
  CudaExec *x = cuda_exec_create(&prog, g, &ref.layout, err, sizeof err);
  CHECK(x, "unaligned: cuda_exec_create: %s", err);
  if (x) {
    StepArgs args = {vals, finite};
    StepResult r0, r1;
    bool ok = cuda_exec_bind(x, dev) == 0 && cuda_step(x, &args, &r1) == 0;
    interp_step(g, &ref.layout, ref.bufs, &args, &r0);
    ok = ok && same_bytes(g, ref.layout.total, ref.bufs, bufs, "unaligned") && r0.nred == r1.nred &&
         (r0.nred == 0 || r0.red[0] == r1.red[0]);
    CHECK(ok, "%s, unaligned buffers: the one-by-one path equals the interpreter", c->name);
    printf("%-44s %s\n", "unaligned buffers", ok ? "identical" : "DIFFERENT");
    cuda_exec_free(x);
  }
  for (int b = 0; b < g->nbufs; b++)
    free(mem[b]);
  group_free(&ref);
  free(vals);
  tf_free(&tf);
}

/* A chunk at flat index 3 * 2^30 of a tensor's element 5 * 2^30, over
 * 1000 real elements behind base pointers moved back by as much. */
static void test_index64(const Case *c) {
  const Graph *g = c->g;
  enum { N = 1000 };
  const int64_t FLAT = (int64_t)3 << 30, START = (int64_t)5 << 30;
  void *mem[2][8], *bufs[2][8];
  CudaPtr dev[8];
  rng = 99;
  for (int b = 0; b < g->nbufs; b++) {
    int es = type_size(g->bufs[b].type);
    for (int copy = 0; copy < 2; copy++) {
      mem[copy][b] = alloc64((size_t)(N + 64) * (size_t)es);
      bufs[copy][b] = (char *)mem[copy][b] - FLAT * es;
    }
    for (int i = 0; i < N + 16; i++) {
      float v = !strcmp(g->bufs[b].name, "exp_avg_sq") ? fabsf(normalf()) : normalf();
      if (es == 2)
        ((uint16_t *)mem[0][b])[i] = optc_f32_to_bf16(v);
      else
        ((float *)mem[0][b])[i] = v;
    }
    memcpy(mem[1][b], mem[0][b], (size_t)(N + 16) * (size_t)es);
    dev[b] = (CudaPtr)(uintptr_t)bufs[1][b];
  }
  int64_t numel = START + N;
  GroupLayout l = {.ntensors = 1, .numel = &numel, .offset = (int64_t[]){FLAT - START}, .total = FLAT + N + 16};
  Chunk chunks[1] = {{.tensor = 0, .block = (int32_t)(FLAT / OPTC_REDUCE_BLOCK), .start = START, .len = N, .flat = FLAT,
                        .numel = START + N}};
  l.chunks = chunks;
  l.nchunks = 1;
  double *vals = step1_inputs(g, false);
  StepArgs args = {vals, 1};
  StepResult r0, r1 = {0};
  interp_step(g, &l, bufs[0], &args, &r0);
  CudaProgram prog = emu_program(c);
  char err[512];
  bool same = false;
  CudaExec *x = cuda_exec_create(&prog, g, &l, err, sizeof err);
  CHECK(x, "index64: cuda_exec_create: %s", err);
  if (x) {
    same = cuda_exec_bind(x, dev) == 0 && cuda_step(x, &args, &r1) == 0;
    for (int b = 0; same && b < g->nbufs; b++)
      same &= memcmp(mem[0][b], mem[1][b], (size_t)(N + 16) * (size_t)type_size(g->bufs[b].type)) == 0;
    cuda_exec_free(x);
  }
  CHECK(same, "64-bit flat index and >2^32 element index: kernels and interpreter agree");
  CHECK(r0.nred == 1 && r1.nred == 1 && r0.red[0] == r1.red[0] && r0.red[0] > 0, "the reduction agrees");
  printf("%-44s %s\n", "index64 (flat 3*2^30, element 5*2^30)", same ? "identical" : "DIFFERENT");
  for (int copy = 0; copy < 2; copy++)
    for (int b = 0; b < g->nbufs; b++)
      free(mem[copy][b]);
  free(vals);
}

/* A NaN grad with grads_finite = -1 (optc_nonfinite finds it), and an
 * infinite one that the producer called finite (the clip norm is not
 * finite): both skip the step, as the interpreter does. */
static void test_nonfinite(const Case *c) {
  const Graph *g = c->g;
  for (int kind = 0; kind < 2; kind++) {
    TensorFile tf = {0};
    make_tensors(&tf, (Type)g->bufs[0].type, (Type)g->bufs[1].type);
    poison_grad(&tf, kind);
    double *vals = step1_inputs(g, false);
    ParamGroup ref, run;
    int finite;
    ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0 && group_from_file(&run, g, &tf, vals, &finite) == 0);
    CudaProgram prog = emu_program(c);
    char err[512];
    CudaExec *x = cuda_exec_create(&prog, g, &run.layout, err, sizeof err);
    CHECK(x, "nonfinite: cuda_exec_create: %s", err);
    if (x) {
      StepArgs args = {vals, kind == 0 ? -1 : 1};
      StepResult r0, r1;
      interp_step(g, &ref.layout, ref.bufs, &args, &r0);
      bool ok = cuda_exec_upload(x, run.bufs) == 0 && cuda_step(x, &args, &r1) == 0 &&
                cuda_exec_download(x, run.bufs) == 0;
      ok = ok && r0.skipped && r1.skipped && same_bytes(g, ref.layout.total, ref.bufs, run.bufs, "nonfinite");
      CHECK(ok, "a %s grad (grads_finite %d): the step is skipped, nothing stored", kind ? "infinite" : "NaN",
            args.grads_finite);
      printf("%-44s %s\n", kind ? "infinite grad, grads_finite 1: skipped" : "NaN grad, grads_finite -1: skipped",
             ok ? "identical" : "DIFFERENT");
      cuda_exec_free(x);
    }
    group_free(&ref);
    group_free(&run);
    free(vals);
    tf_free(&tf);
  }
}

/* ---- the matrix ---------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_cuda_emu CUDA_EMU_H CXX [CXX ARGS...]\n");
    return 2;
  }
  double t0 = now_seconds();
  emu_h = argv[1];
  cxx = argv + 2;
  ncxx = argc - 2;
  test_dir_make("optc_cuda_emu");
  setenv("OPTC_CACHE", "0", 1);

  /* every case's program and source */
  int cap = 256, n = 0;
  Case *cases = calloc((size_t)cap, sizeof(Case));
  ASSERT(cases);
  MatrixCase mc;
  for (int i = 0; matrix_case_at(i, &mc); i++) {
    Arena *a = arena_new();
    ASSERT(n < cap);
    case_init(&cases[n], mc.name, build_yaml(mc.yaml, a), a, n, NULL);
    n++;
  }
  int nmatrix = n;
  /* the reduction phases with 2, 4 and 8 lanes a thread (CudaTarget.red_lanes): the clipped
   * cases of every layout and both norms' kinds of reduction */
  int lanes0 = n;
  for (int i = 0; matrix_case_at(i, &mc); i++) {
    if (!strstr(mc.name, " clip") || (!strstr(mc.name, "adamw") && !strstr(mc.name, "lion")))
      continue;
    bool all = !strcmp(mc.name, "adamw bf16 clip sr") || !strcmp(mc.name, "adamw fp32 clip");
    for (int lanes = 2; lanes <= (all ? 8 : 2); lanes *= 2) {
      Arena *a = arena_new();
      ASSERT(n < cap);
      char name[160];
      snprintf(name, sizeof name, "%.100s, %d lanes a thread", mc.name, lanes);
      case_init(&cases[n], name, build_yaml(mc.yaml, a), a, n, &(CudaTarget){.red_lanes = lanes});
      n++;
    }
  }
  int lanes1 = n;
  Arena *a = arena_new();
  int sink = n;
  case_init(&cases[n], "every op (f16, bf16, f32, f64, tensor scope)", build_optir("sink.optir", sink_optir, a), a, n,
            NULL);
  n++;
  a = arena_new();
  int sink2 = n;
  case_init(&cases[n], "every op, 2 lanes a thread", build_optir("sink.optir", sink_optir, a), a, n,
            &(CudaTarget){.red_lanes = 2});
  n++;
  a = arena_new();
  int sink8 = n;
  case_init(&cases[n], "every op, 8 lanes a thread", build_optir("sink.optir", sink_optir, a), a, n,
            &(CudaTarget){.red_lanes = 8});
  n++;
  a = arena_new();
  int transc = n;
  case_init(&cases[n], "pow, exp, log per element", build_optir("transc.optir", transc_optir, a), a, n, NULL);
  n++;
  a = arena_new();
  int stored = n;
  case_init(&cases[n], "stores in a phase with reductions", build_optir("stored.optir", stored_optir, a), a, n, NULL);
  n++;
  a = arena_new();
  int stored4 = n;
  case_init(&cases[n], "stores in a phase with reductions, 4 lanes", build_optir("stored.optir", stored_optir, a), a, n,
            &(CudaTarget){.red_lanes = 4});
  n++;
  double t1 = now_seconds();

  /* the driver stand-in and every kernel module, in parallel */
  char driver[300];
  snprintf(driver, sizeof driver, "%s", in_dir("libcuda_emu.so").s);
  char ***cmds = calloc((size_t)n + 1, sizeof(char **));
  ASSERT(cmds);
  const char *drv_extra[] = {"-std=c++17", "-O1", "-fPIC", "-shared", "-DOPTC_EMU_DRIVER", "-Wall", "-Wextra",
                             "-x", "c++", emu_h, "-o", driver, "-ldl"};
  cmds[0] = command(drv_extra, (int)ARRAY_LEN(drv_extra));
  int ncmds = 1;
  for (int i = 0; i < n; i++)
    if (cases[i].source)
      cmds[ncmds++] = module_command(cases[i].cu, cases[i].so);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  bool built = run_all(cmds, ncmds, (int)MAX(1, MIN(cpus, 8)));
  for (int i = 0; i < ncmds; i++)
    free_command(cmds[i]);
  free(cmds);
  CHECK(built, "every kernel module and the driver stand-in compile with %s", cxx[0]);
  double t2 = now_seconds();
  printf("emitted %d programs in %.2f s; compiled them with %s in %.1f s\n", n, t1 - t0, cxx[0], t2 - t1);

  if (built) {
    setenv("OPTC_LIBCUDA", driver, 1);
    char why[256], desc[256];
    CHECK(cuda_device_available(why, sizeof why), "the emulated driver loads: %s", why);
    cuda_device_describe(desc, sizeof desc);
    printf("device: %s\n", desc);
    for (int i = 0; i < nmatrix; i++)
      if (cases[i].g)
        run_case(&cases[i], (Type)cases[i].g->bufs[0].type, (Type)cases[i].g->bufs[1].type);
    for (int i = lanes0; i < lanes1; i++)
      if (cases[i].g)
        run_case(&cases[i], (Type)cases[i].g->bufs[0].type, (Type)cases[i].g->bufs[1].type);
    int sinks[] = {sink, sink2, sink8};
    for (size_t k = 0; k < ARRAY_LEN(sinks); k++)
      if (cases[sinks[k]].g)
        run_case(&cases[sinks[k]], TY_BF16, TY_BF16);
    if (cases[transc].g)
      run_case(&cases[transc], TY_F32, TY_F32);
    if (cases[stored].g)
      run_case(&cases[stored], TY_BF16, TY_BF16);
    if (cases[stored4].g)
      run_case(&cases[stored4], TY_BF16, TY_BF16);
    /* adamw bf16 clip sr: the 64-bit, unaligned and non-finite cases */
    int adamw_bf16 = 0;
    while (adamw_bf16 < nmatrix && strcmp(cases[adamw_bf16].name, "adamw bf16 clip sr"))
      adamw_bf16++;
    ASSERT(adamw_bf16 < nmatrix);
    for (int i = 0; i < nmatrix; i++)
      if (strstr(cases[i].name, "adamw") == cases[i].name && strstr(cases[i].name, " clip") && cases[i].g)
        test_chunk_partials(&cases[i], (Type)cases[i].g->bufs[0].type, (Type)cases[i].g->bufs[1].type);
    if (cases[sink].g)
      test_chunk_partials(&cases[sink], TY_BF16, TY_BF16);
    if (cases[stored].g)
      test_chunk_partials(&cases[stored], TY_BF16, TY_BF16);
    for (int i = lanes0; i < lanes1; i++)
      if (cases[i].g && strstr(cases[i].name, "adamw") == cases[i].name)
        test_chunk_partials(&cases[i], (Type)cases[i].g->bufs[0].type, (Type)cases[i].g->bufs[1].type);
    test_unaligned(&cases[adamw_bf16]);
    for (int i = lanes0; i < lanes1; i++) /* one element off: every lane loads one by one */
      if (cases[i].g && strstr(cases[i].name, "adamw bf16 clip sr, ") == cases[i].name)
        test_unaligned(&cases[i]);
    test_nonfinite(&cases[adamw_bf16]);
    int adamw_mixed = 0;
    while (adamw_mixed < nmatrix && strcmp(cases[adamw_mixed].name, "adamw bf16/fp32-states clip sr"))
      adamw_mixed++;
    ASSERT(adamw_mixed < nmatrix);
    test_index64(&cases[adamw_mixed]);
  }
  for (int i = 0; i < n; i++)
    case_free(&cases[i]);
  free(cases);
  test_dir_remove();
  printf("test_cuda_emu: %d checks, %d failed (%.1f s)\n", nchecks, nfailed, now_seconds() - t0);
  return nfailed != 0;
}
