/* test_gpu: the GPU backend on a real device gives the interpreter's bytes
 * (meson suite `gpu`). Exits 77, meson's "skipped", with the reason, where
 * there is no NVRTC, no driver or no device.
 *
 * - Every built-in optimizer (with its graph-changing options) x clipping
 *   on and off x the three dtype layouts x stochastic rounding on and off
 *   (bf16 layouts), over tensors of 0, 1, 15, 16, 17 and 100003 elements
 *   and forty small ones, two steps (the second with grads_finite = -1):
 *   every byte of every buffer and the step-scope reductions equal
 *   interp_step's. Compiled for the device's own arch.
 * - A program with every op, type and scope the emitter renders, exact;
 *   and one with pow, exp and log per element, where CUDA's libm may
 *   differ from glibc's: its largest difference is printed, not judged.
 * - Each chunk's partials alone (a one-chunk layout), where the fold of a
 *   whole group would round a wrong lane order away.
 * - Non-finite grads skip the step; unaligned buffers take the one-by-one
 *   path; 64-bit indices, over base addresses moved back (a chunk at flat
 *   index 3 * 2^30, element 5 * 2^30 of its tensor), and, where the
 *   device has the memory, for real: a 2^31 + 12411-element group whose
 *   chunks across 2^31 are stepped and checked. */
#include "exec.h"
#include "steplib.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

/* The largest difference in units in the last place between two f32
 * buffers (NaN against anything but NaN counts as 2^31). */
static int64_t max_ulps(const float *a, const float *b, int64_t n, int64_t *where) {
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t ia = (int32_t)optc_f32_bits(a[i]), ib = (int32_t)optc_f32_bits(b[i]);
    ia = ia < 0 ? INT32_MIN - ia : ia; /* sign-magnitude to a monotonic line */
    ib = ib < 0 ? INT32_MIN - ib : ib;
    int64_t d = a[i] != a[i] || b[i] != b[i] ? ((a[i] != a[i]) != (b[i] != b[i]) ? INT32_MAX : 0) : llabs(ia - ib);
    if (d > worst)
      worst = d, *where = i;
  }
  return worst;
}

/* ---- programs ------------------------------------------------------------------------------ */

/* The same three programs as test_cuda_emu's. */
static const char sink_optir[] =
    "param @param : bf16\ngrad @grad : bf16\nstate @m : f16 = 0.0\nstate @acc : f64 = 0.0\n"
    "state @w : f32 = param\n%seed = input 11 : i64\n%step = input in [1.0, inf) : f64\n"
    "%stepi = cvt %step : i64\n%half = const 0.5 : f32\n%one = const 1.0 : f32\n%oned = const 1.0 : f64\n"
    "%zi = const 0 : i32\n%g = load @grad : bf16\n%gf = cvt %g : f32\n"
    "%tn2 = reduce sumsq %gf to tensor : f64\n%tmax = reduce max %gf to tensor : f64\n"
    "%amax = reduce absmax %gf to step : f64\n%gd = cvt %gf : f64\n"
    "%r64 = reduce sumsq %gd to step : f64\n%r64f = cvt %r64 : f32\n%gsum = reduce sum %g to step : f64\n"
    "%tn = sqrt %tn2 : f64\n%tnf = cvt %tn : f32\n%tden = add %tnf, %one : f32\n"
    "%tmaxf = cvt %tmax : f32\n%amaxf = cvt %amax : f32\n%gsumf = cvt %gsum : f32\n"
    "%pb = load @param : bf16\n%p = cvt %pb : f32\n%q = div %gf, %tden : f32\n%ab = abs %q : f32\n"
    "%sg = sign %q : f32\n%mn = min %q, %half : f32\n%mx = max %mn, %tmaxf : f32\n"
    "%f = fma %q, %half, %p : f32\n%lp = lerp %p, %q, %sg : f32\n%c1 = lt %q, %half : bool\n"
    "%c2 = isfinite %f : bool\n%c3 = and %c1, %c2 : bool\n%c4 = not %c3 : bool\n"
    "%c5 = ge %ab, %amaxf : bool\n%c6 = or %c4, %c5 : bool\n%sel = select %c6, %lp, %f : f32\n"
    "%rs = rsqrt %tden : f32\n%neg = neg %rs : f32\n%qi = cvt %q : i32\n%k = cvt %p : i64\n"
    "%c7 = ne %qi, %zi : bool\n%qk = cvt %qi : i64\n%c8 = le %qk, %k : bool\n%c9 = and %c7, %c8 : bool\n"
    "%qif = cvt %qi : f32\n%u = add %sel, %qif : f32\n%u2 = mul %u, %neg : f32\n"
    "%u3 = sub %u2, %mx : f32\n%u4 = select %c9, %u2, %u3 : f32\n%u5a = mul %u4, %gsumf : f32\n"
    "%u5 = div %u5a, %r64f : f32\n%acc0 = load @acc : f64\n%qd = cvt %u5 : f64\n"
    "%acc1 = add %acc0, %qd : f64\nstore @acc, %acc1\n%m0 = load @m : f16\n%mh = cvt %q : f16\n"
    "%m1 = add %m0, %mh : f16\n%m2 = mul %m1, %m1 : f16\n%mb = cvt %m2 : bf16\n%mbf = cvt %mb : f32\n"
    "store @m, %m1\n%w0 = load @w : f32\n%w0b = cvt %w0 : bf16\n%wq = cvt %q : bf16\n"
    "%w1 = sub %w0b, %wq : bf16\n%w1f = cvt %w1 : f32\n%w2 = add %w1f, %mbf : f32\n"
    "%wsr = cvt_sr %w2, %seed, %stepi : bf16\n%wsrf = cvt %wsr : f32\nstore @w, %wsrf\n"
    "%pd = cvt %acc1 : bf16\n%pdf = cvt %pd : f32\n%pn = add %p, %pdf : f32\n"
    "%pn2 = div %pn, %tden : f32\n%hsr = cvt_sr %pn2, %seed, %stepi : f16\n%hb = cvt %hsr : bf16\n"
    "store @param, %hb\n";

static const char transc_optir[] =
    "param @param : f32\ngrad @grad : f32\n%one = const 1.0 : f32\n%g = load @grad : f32\n%p = load @param : f32\n"
    "%a = abs %g : f32\n%e = exp %g : f32\n%a1 = add %a, %one : f32\n%l = log %a1 : f32\n%pw = pow %a1, %p : f32\n"
    "%pd = cvt %p : f64\n%ed = exp %pd : f64\n%edf = cvt %ed : f32\n%s1 = add %e, %l : f32\n"
    "%s2 = add %s1, %pw : f32\n%s3 = mul %s2, %edf : f32\nstore @param, %s3\n";

static const char stored_optir[] =
    "param @param : bf16\ngrad @grad : bf16\nstate @m : f32 = 0.0\n%g = load @grad : bf16\n%gf = cvt %g : f32\n"
    "%m0 = load @m : f32\n%b = input 0.9 : f64\n%bf = cvt %b : f32\n%m1 = fma %m0, %bf, %gf : f32\nstore @m, %m1\n"
    "%p0 = load @param : bf16\n%p0f = cvt %p0 : f32\n%lr = input 0.01 : f64\n%lrf = cvt %lr : f32\n"
    "%p1f = fma %m1, %lrf, %p0f : f32\n%p1 = cvt %p1f : bf16\nstore @param, %p1\n"
    "%gsq = reduce sumsq %gf to step : f64\n%mmax = reduce absmax %m1 to step : f64\n";

static double compile_ms;
static int ncompiles;
static int red_lanes; /* CudaTarget.red_lanes of the programs compiled (0: the default) */

static CudaProgram *compile_program(const Graph *g) {
  CompileTimes t = {0};
  double t0 = now_seconds();
  CudaProgram *p = cuda_compile(g, &(CudaTarget){.red_lanes = red_lanes, .no_cache = true}, &t);
  compile_ms += (now_seconds() - t0) * 1e3;
  ncompiles++;
  return p;
}

/* ---- checks ------------------------------------------------------------------------------------ */

/* Two steps on the device and in the interpreter, from the same tensors;
 * the second with grads_finite = -1. exact: bytes equal; else the largest
 * ulp difference of the f32 param is printed. */
static bool run_case(const char *name, const Graph *g, Type pt, Type gt, bool exact) {
  CudaProgram *prog = compile_program(g);
  CHECK(prog, "%s: compiles", name);
  if (!prog)
    return false;
  TensorFile tf = {0};
  rng = 0x2545f4914f6cdd1dull;
  make_tensors(&tf, pt, gt);
  double *vals = step1_inputs(g, true);
  ParamGroup ref, run;
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0 && group_from_file(&run, g, &tf, vals, &finite) == 0);
  char err[512];
  CudaExec *x = cuda_exec_create(prog, g, &run.layout, err, sizeof err);
  CHECK(x, "%s: cuda_exec_create: %s", name, err);
  bool ok = x && cuda_exec_upload(x, run.bufs) == 0;
  Ref sref = graph_find_input(g, "step");
  for (int step = 1; ok && step <= 2; step++) {
    if (sref != NOREF)
      vals[sref] = step;
    StepArgs args = {vals, step == 2 ? -1 : finite};
    StepResult r0, r1;
    interp_step(g, &ref.layout, ref.bufs, &args, &r0);
    ok = cuda_step(x, &args, &r1) == 0 && cuda_exec_download(x, run.bufs) == 0;
    CHECK(ok, "%s step %d: cuda_step", name, step);
    char what[160];
    snprintf(what, sizeof what, "%s step %d", name, step);
    if (!exact && ok) {
      int64_t where = 0, u = max_ulps(ref.bufs[0], run.bufs[0], ref.layout.total, &where);
      printf("  %s: largest difference %lld ulp (element %lld), CUDA's libm against glibc's\n", what, (long long)u,
             (long long)where);
      memcpy(ref.bufs[0], run.bufs[0], (size_t)ref.layout.total * 4); /* go on from the same params */
      continue;
    }
    bool same = ok && same_bytes(g, ref.layout.total, ref.bufs, run.bufs, what) && r0.nred == r1.nred &&
                r0.skipped == r1.skipped &&
                (r0.nred == 0 || memcmp(r0.red, r1.red, sizeof(double) * (size_t)r0.nred) == 0);
    CHECK(same, "%s: the GPU step differs from the interpreter", what);
    ok &= same;
  }
  printf("%-44s %s\n", name, !exact ? "ran (not exact by design)" : ok ? "identical" : "DIFFERENT");
  cuda_exec_free(x);
  cuda_program_free(prog);
  group_free(&ref);
  group_free(&run);
  free(vals);
  tf_free(&tf);
  return ok;
}

/* Each chunk alone: its partials are then the step-scope reductions. */
static void test_chunk_partials(const char *name, const Graph *g, Type pt, Type gt) {
  CudaProgram *prog = compile_program(g);
  CHECK(prog, "%s: compiles", name);
  if (!prog)
    return;
  TensorFile tf = {0};
  rng = 7;
  make_tensors(&tf, pt, gt);
  double *vals = step1_inputs(g, true);
  ParamGroup ref;
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0);
  char err[512];
  /* one executor owns the device buffers; one per chunk runs on them */
  CudaExec *owner = cuda_exec_create(prog, g, &ref.layout, err, sizeof err);
  CHECK(owner && cuda_exec_upload(owner, ref.bufs) == 0, "%s: upload: %s", name, err);
  CudaPtr dev[8] = {0};
  for (int b = 0; owner && b < g->nbufs; b++)
    dev[b] = cuda_exec_buffer(owner, b);
  int64_t same = 0, n = ref.layout.nchunks;
  for (int64_t k = 0; owner && k < n; k++) {
    GroupLayout one = ref.layout;
    one.chunks = &ref.layout.chunks[k];
    one.nchunks = 1;
    StepArgs args = {vals, finite};
    StepResult r0, r1;
    interp_step(g, &one, ref.bufs, &args, &r0);
    CudaExec *x = cuda_exec_create(prog, g, &one, err, sizeof err);
    bool ok = x && cuda_exec_bind(x, dev) == 0 && cuda_step(x, &args, &r1) == 0 && r0.nred == r1.nred &&
              !memcmp(r0.red, r1.red, sizeof(double) * (size_t)r0.nred);
    if (!ok && same == k)
      printf("  chunk %lld (tensor %d, %lld elements): %.17g against the interpreter's %.17g\n", (long long)k,
             one.chunks->tensor, (long long)one.chunks->len, r1.red[0], r0.red[0]);
    same += ok;
    cuda_exec_free(x);
  }
  CHECK(same == n, "%s: %lld of %lld chunk partials equal the interpreter's", name, (long long)same, (long long)n);
  printf("%-44s %s\n", name, same == n ? "every chunk's partials identical" : "DIFFERENT");
  cuda_exec_free(owner);
  cuda_program_free(prog);
  group_free(&ref);
  free(vals);
  tf_free(&tf);
}

/* A NaN grad with grads_finite = -1, an infinite one said to be finite. */
static void test_nonfinite(const Graph *g) {
  CudaProgram *prog = compile_program(g);
  CHECK(prog, "nonfinite: compiles");
  for (int kind = 0; prog && kind < 2; kind++) {
    TensorFile tf = {0};
    make_tensors(&tf, (Type)g->bufs[0].type, (Type)g->bufs[1].type);
    poison_grad(&tf, kind);
    double *vals = step1_inputs(g, false);
    ParamGroup ref, run;
    int finite;
    ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0 && group_from_file(&run, g, &tf, vals, &finite) == 0);
    char err[512];
    CudaExec *x = cuda_exec_create(prog, g, &run.layout, err, sizeof err);
    CHECK(x, "nonfinite: cuda_exec_create: %s", err);
    if (x) {
      StepArgs args = {vals, kind == 0 ? -1 : 1};
      StepResult r0, r1;
      interp_step(g, &ref.layout, ref.bufs, &args, &r0);
      bool ok = cuda_exec_upload(x, run.bufs) == 0 && cuda_step(x, &args, &r1) == 0 &&
                cuda_exec_download(x, run.bufs) == 0;
      ok = ok && r0.skipped && r1.skipped && same_bytes(g, ref.layout.total, ref.bufs, run.bufs, "nonfinite");
      CHECK(ok, "a %s grad: the step is skipped, nothing stored", kind ? "infinite" : "NaN");
      printf("%-44s %s\n", kind ? "infinite grad, grads_finite 1: skipped" : "NaN grad, grads_finite -1: skipped",
             ok ? "identical" : "DIFFERENT");
      cuda_exec_free(x);
    }
    group_free(&ref);
    group_free(&run);
    free(vals);
    tf_free(&tf);
  }
  cuda_program_free(prog);
}

/* Device buffers one element off 16-byte alignment. */
static void test_unaligned(const Graph *g) {
  CudaProgram *prog = compile_program(g);
  CHECK(prog, "unaligned: compiles");
  if (!prog)
    return;
  TensorFile tf = {0};
  make_tensors(&tf, (Type)g->bufs[0].type, (Type)g->bufs[1].type);
  double *vals = step1_inputs(g, false);
  ParamGroup ref, out;
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0 && group_from_file(&out, g, &tf, vals, &finite) == 0);
  CudaPtr mem[8] = {0}, dev[8];
  bool ok = true;
  for (int b = 0; b < g->nbufs; b++) {
    size_t es = (size_t)type_size(g->bufs[b].type), bytes = (size_t)ref.layout.total * es;
    mem[b] = cuda_malloc(bytes + 64);
    dev[b] = mem[b] + es;
    ok &= mem[b] && cuda_memcpy_htod(dev[b], ref.bufs[b], bytes) == 0;
  }
  char err[512];
  CudaExec *x = ok ? cuda_exec_create(prog, g, &ref.layout, err, sizeof err) : NULL;
  StepArgs args = {vals, finite};
  StepResult r0, r1;
  ok = x && cuda_exec_bind(x, dev) == 0 && cuda_step(x, &args, &r1) == 0;
  for (int b = 0; ok && b < g->nbufs; b++)
    ok = cuda_memcpy_dtoh(out.bufs[b], dev[b], (size_t)ref.layout.total * (size_t)type_size(g->bufs[b].type)) == 0;
  interp_step(g, &ref.layout, ref.bufs, &args, &r0);
  ok = ok && same_bytes(g, ref.layout.total, ref.bufs, out.bufs, "unaligned") && r0.red[0] == r1.red[0];
  CHECK(ok, "unaligned buffers: the one-by-one path equals the interpreter");
  printf("%-44s %s\n", "unaligned buffers", ok ? "identical" : "DIFFERENT");
  cuda_exec_free(x);
  for (int b = 0; b < g->nbufs; b++)
    cuda_free(mem[b]);
  cuda_program_free(prog);
  group_free(&ref);
  group_free(&out);
  free(vals);
  tf_free(&tf);
}

/* Random values into the window [0, n) of each buffer; exp_avg_sq >= 0. */
static void fill_window(const Graph *g, void **mem, int64_t n) {
  for (int b = 0; b < g->nbufs; b++) {
    int es = type_size(g->bufs[b].type);
    for (int64_t i = 0; i < n; i++) {
      float v = !strcmp(g->bufs[b].name, "exp_avg_sq") ? fabsf(normalf()) : normalf();
      if (es == 2)
        ((uint16_t *)mem[b])[i] = optc_f32_to_bf16(v);
      else
        ((float *)mem[b])[i] = v;
    }
  }
}

/* 64-bit indices over base addresses moved back: a chunk at flat index
 * 3 * 2^30, element 5 * 2^30 of its tensor, over 1000 real elements. */
static void test_index64_moved(const Graph *g) {
  CudaProgram *prog = compile_program(g);
  CHECK(prog, "index64: compiles");
  if (!prog)
    return;
  enum { N = 1000 };
  const int64_t FLAT = (int64_t)3 << 30, START = (int64_t)5 << 30;
  void *mem[8], *bufs[8], *back[8];
  CudaPtr dmem[8], dev[8];
  rng = 99;
  for (int b = 0; b < g->nbufs; b++) {
    int es = type_size(g->bufs[b].type);
    mem[b] = alloc64((size_t)(N + 64) * (size_t)es);
    back[b] = alloc64((size_t)(N + 64) * (size_t)es);
    bufs[b] = (char *)mem[b] - FLAT * es;
  }
  fill_window(g, mem, N + 16);
  bool ok = true;
  for (int b = 0; b < g->nbufs; b++) {
    size_t es = (size_t)type_size(g->bufs[b].type);
    dmem[b] = cuda_malloc((size_t)(N + 64) * es);
    dev[b] = dmem[b] - (CudaPtr)FLAT * es;
    ok &= dmem[b] && cuda_memcpy_htod(dmem[b], mem[b], (size_t)(N + 16) * es) == 0;
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
  char err[512];
  CudaExec *x = ok ? cuda_exec_create(prog, g, &l, err, sizeof err) : NULL;
  ok = x && cuda_exec_bind(x, dev) == 0 && cuda_step(x, &args, &r1) == 0;
  for (int b = 0; ok && b < g->nbufs; b++)
    ok = cuda_memcpy_dtoh(back[b], dmem[b], (size_t)(N + 16) * (size_t)type_size(g->bufs[b].type)) == 0;
  interp_step(g, &l, bufs, &args, &r0);
  for (int b = 0; ok && b < g->nbufs; b++)
    ok = memcmp(mem[b], back[b], (size_t)(N + 16) * (size_t)type_size(g->bufs[b].type)) == 0;
  ok = ok && r0.nred == 1 && r1.nred == 1 && r0.red[0] == r1.red[0];
  CHECK(ok, "64-bit flat index and >2^32 element index (moved-back bases): device and interpreter agree");
  printf("%-44s %s\n", "index64, moved-back bases", ok ? "identical" : "DIFFERENT");
  cuda_exec_free(x);
  for (int b = 0; b < g->nbufs; b++) {
    cuda_free(dmem[b]);
    free(mem[b]);
    free(back[b]);
  }
  free(vals);
  cuda_program_free(prog);
}

/* 64-bit indices for real: device buffers of 2^31 + 12411 elements, the
 * chunks from 2^31 - 4096 on stepped, against the interpreter over the
 * same window on the host. */
static void test_index64_real(const Graph *g) {
  const int64_t numel = ((int64_t)1 << 31) + 12411, lo = ((int64_t)1 << 31) - OPTC_REDUCE_BLOCK;
  size_t need = 0, free_bytes = 0, total = 0;
  GroupLayout l;
  layout_init(&l, 1, &numel);
  for (int b = 0; b < g->nbufs; b++)
    need += (size_t)l.total * (size_t)type_size(g->bufs[b].type);
  if (!cuda_mem_info(&free_bytes, &total) || free_bytes < need + ((size_t)2 << 30)) {
    printf("%-44s skipped: needs %.1f GiB of device memory, %.1f free\n", "index64, real", need / 1073741824.0,
           free_bytes / 1073741824.0);
    layout_free(&l);
    return;
  }
  layout_restrict(&l, lo, l.total);
  CudaProgram *prog = compile_program(g);
  CHECK(prog, "index64 real: compiles");
  int64_t n = l.total - lo;
  void *mem[8], *host[8], *back[8];
  rng = 5;
  for (int b = 0; b < g->nbufs; b++) {
    int es = type_size(g->bufs[b].type);
    mem[b] = alloc64((size_t)(n + 64) * (size_t)es);
    back[b] = alloc64((size_t)(n + 64) * (size_t)es);
    host[b] = (char *)mem[b] - lo * es;
  }
  fill_window(g, mem, n);
  double *vals = step1_inputs(g, false);
  StepArgs args = {vals, -1};
  StepResult r0, r1 = {0};
  char err[512];
  CudaExec *x = prog ? cuda_exec_create(prog, g, &l, err, sizeof err) : NULL;
  bool ok = x != NULL;
  for (int b = 0; ok && b < g->nbufs; b++) {
    size_t es = (size_t)type_size(g->bufs[b].type);
    CudaPtr d = cuda_exec_buffer(x, b); /* allocated here: numel-long */
    ok = d && cuda_memcpy_htod(d + (CudaPtr)lo * es, mem[b], (size_t)n * es) == 0;
  }
  double t0 = now_seconds();
  ok = ok && cuda_step(x, &args, &r1) == 0;
  double ms = (now_seconds() - t0) * 1e3;
  for (int b = 0; ok && b < g->nbufs; b++) {
    size_t es = (size_t)type_size(g->bufs[b].type);
    ok = cuda_memcpy_dtoh(back[b], cuda_exec_buffer(x, b) + (CudaPtr)lo * es, (size_t)n * es) == 0;
  }
  interp_step(g, &l, host, &args, &r0);
  for (int b = 0; ok && b < g->nbufs; b++)
    ok = memcmp(mem[b], back[b], (size_t)n * (size_t)type_size(g->bufs[b].type)) == 0;
  ok = ok && r0.nred == r1.nred && r0.red[0] == r1.red[0];
  CHECK(ok, "64-bit indices on real buffers of %lld elements: device and interpreter agree", (long long)numel);
  printf("%-44s %s (%lld chunks from flat %lld, %.1f ms)\n", "index64, real", ok ? "identical" : "DIFFERENT",
         (long long)l.nchunks, (long long)lo, ms);
  cuda_exec_free(x);
  for (int b = 0; b < g->nbufs; b++) {
    free(mem[b]);
    free(back[b]);
  }
  free(vals);
  cuda_program_free(prog);
  layout_free(&l);
}

/* ---- the matrix ---------------------------------------------------------------------------------- */

int main(void) {
  char why[256], desc[256];
  if (!cuda_nvrtc_available(why, sizeof why)) {
    printf("SKIP: %s\n", why);
    return 77;
  }
  if (!cuda_device_available(why, sizeof why)) {
    printf("SKIP: %s\n", why);
    return 77;
  }
  double t0 = now_seconds();
  cuda_device_describe(desc, sizeof desc);
  printf("device: %s\n", desc);
  setenv("OPTC_CACHE", "0", 1);
  MatrixCase mc;
  for (int i = 0; matrix_case_at(i, &mc); i++) {
    Arena *a = arena_new();
    Graph *g = build_yaml(mc.yaml, a);
    CHECK(g, "%s: the recipe builds", mc.name);
    if (g) {
      run_case(mc.name, g, (Type)g->bufs[0].type, (Type)g->bufs[1].type, true);
      if (mc.opt < 2 && mc.clip)
        test_chunk_partials(mc.name, g, (Type)g->bufs[0].type, (Type)g->bufs[1].type);
    }
    arena_free(a);
  }
  Arena *a = arena_new();
  Graph *g = build_optir("sink.optir", sink_optir, a);
  CHECK(g, "the every-op program builds");
  if (g) {
    run_case("every op (f16, bf16, f32, f64, tensor scope)", g, TY_BF16, TY_BF16, true);
    test_chunk_partials("every op: chunk partials", g, TY_BF16, TY_BF16);
  }
  g = build_optir("transc.optir", transc_optir, a);
  if (g)
    run_case("pow, exp, log per element", g, TY_F32, TY_F32, false);
  g = build_optir("stored.optir", stored_optir, a);
  CHECK(g, "the program that stores and reduces in one phase builds");
  if (g) {
    run_case("stores in a phase with reductions", g, TY_BF16, TY_BF16, true);
    test_chunk_partials("stores and reductions: chunk partials", g, TY_BF16, TY_BF16);
  }
  arena_free(a);

  a = arena_new();
  g = build_yaml("optimizer:\n  _component_: torch.optim.AdamW\ndtype: bf16\nclip_grad_norm: 0.5\n"
                 "stochastic_rounding: true\nseed: 42\n", a);
  ASSERT(g);
  test_nonfinite(g);
  test_unaligned(g);
  arena_free(a);
  /* the norm pass with 2, 4 and 8 lanes a thread, each lane's elements loaded together */
  static const char *const lanes_yaml[] = {
      "optimizer:\n  _component_: torch.optim.AdamW\ndtype: bf16\nclip_grad_norm: 0.5\nstochastic_rounding: true\n"
      "seed: 42\n",
      "optimizer:\n  _component_: torch.optim.AdamW\ndtype: fp32\nclip_grad_norm: 0.5\n"};
  for (red_lanes = 2; red_lanes <= 8; red_lanes *= 2)
    for (size_t k = 0; k < ARRAY_LEN(lanes_yaml); k++) {
      a = arena_new();
      g = build_yaml(lanes_yaml[k], a);
      ASSERT(g);
      char name[96];
      snprintf(name, sizeof name, "adamw %s clip, %d lanes a thread", k ? "fp32" : "bf16 sr", red_lanes);
      run_case(name, g, (Type)g->bufs[0].type, (Type)g->bufs[1].type, true);
      test_chunk_partials(name, g, (Type)g->bufs[0].type, (Type)g->bufs[1].type);
      if (!k)
        test_unaligned(g);
      arena_free(a);
    }
  red_lanes = 0;
  a = arena_new();
  g = build_yaml("optimizer:\n  _component_: torch.optim.AdamW\ndtype: bf16\noptimizer_state_dtype: fp32\n"
                 "stochastic_rounding: true\nclip_grad_norm: 1.0\nseed: 3\n", a);
  ASSERT(g);
  test_index64_moved(g);
  test_index64_real(g);
  arena_free(a);
  printf("%d NVRTC compiles, %.0f ms each on average\n", ncompiles, compile_ms / MAX(ncompiles, 1));
  printf("test_gpu: %d checks, %d failed (%.1f s)\n", nchecks, nfailed, now_seconds() - t0);
  return nfailed != 0;
}
