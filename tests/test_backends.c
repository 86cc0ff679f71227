/* test_backends: the compiled CPU step gives the interpreter's bytes.
 *
 * - Every built-in optimizer (with its graph-changing options) x clipping on
 *   and off x the three dtype layouts x stochastic rounding on and off (for
 *   the bf16 layouts, where it applies), on one group that mixes tensors of
 *   0, 1, 15, 16, 17 and 100003 elements with forty small ones, for two
 *   steps, with 1, 2 and 3 threads: every byte of every buffer equals the
 *   interpreter's.
 * - The disk cache: a second compile is a hit and compiles nothing; a
 *   truncated or corrupted entry is detected, rebuilt, and the program
 *   still runs right.
 * - 64-bit indexing, without 8 GB: a chunk whose flat index is past 2^31
 *   and whose index within its tensor is past 2^32 (which the
 *   stochastic-rounding hash reads), over buffers whose base pointers are
 *   moved back by as much; the kernel and the interpreter must agree.
 * - The for-loop AdamW's exp_avg_sq.sqrt() / bias_correction2_sqrt on bf16,
 *   which the kernel multiplies by the reciprocal when a check of this
 *   step's divisor says that rounds the same (emit_llvm.c, recip_div): over
 *   every bf16 bit pattern of exp_avg_sq, at steps where the check passes
 *   and steps where it fails, with both of torch's sqrts, on this CPU's code
 *   and haswell's, the kernel gives the interpreter's bytes; and fused=True's
 *   body on the same data (its stores of every NaN and Inf). Again on 9
 *   times the patterns at three steps, where each thread's call is large
 *   enough that on AVX-512 the kernel looks the whole denominator up in a
 *   table it computes for all 65536 exp_avg_sq (emit_llvm.c, tab_find; an
 *   AMD CPU's code has none, so skylake-avx512's runs too where the host
 *   can run it), and
 *   haswell's code rounds its holds of one op half up where none of their
 *   65536 inputs is a tie, at two of them, and to even at the third,
 *   whose exp_avg_sq * beta2 has ties (tie_find). */
#include "steplib.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool same_buffers(const Graph *g, const ParamGroup *a, const ParamGroup *b, const char *what) {
  return same_bytes(g, a->layout.total, a->bufs, b->bufs, what);
}

static void matrix_case(const char *name, const char *yaml) {
  Arena *arena = arena_new();
  Graph *g = build_recipe(yaml, arena);
  CHECK(g, "%s: recipe", name);
  if (!g || !pipeline_run(g, &(PipelineOptions){0})) {
    arena_free(arena);
    return;
  }
  Type pt = (Type)g->bufs[0].type, gt = (Type)g->bufs[1].type;
  TensorFile tf = {0};
  make_tensors(&tf, pt, gt);
  double *vals = step1_inputs(g, true);
  ParamGroup ref, run[3];
  int finite;
  ASSERT(group_from_file(&ref, g, &tf, vals, &finite) == 0);
  for (int t = 0; t < 3; t++)
    ASSERT(group_from_file(&run[t], g, &tf, vals, &finite) == 0);
  CpuTarget target = {.no_cache = true};
  CompileTimes times = {0};
  CpuProgram *prog = cpu_compile(g, &target, &times);
  CHECK(prog, "%s: compile", name);
  /* the same graph for a CPU without AVX-512 (MKL's sqrt from the rsqrt14
   * table, not the instruction): run here, on whatever this CPU is */
  CpuTarget avx2 = {.cpu = "haswell", .no_cache = true};
  CpuProgram *prog2 = cpu_compile(g, &avx2, NULL);
  CHECK(prog2, "%s: compile for haswell", name);
  ThreadPool *pools[3] = {pool_create(1), pool_create(2), pool_create(3)};
  Ref sref = graph_find_input(g, "step");
  bool ok = prog != NULL && prog2 != NULL;
  for (int step = 1; ok && step <= 2; step++) {
    if (sref != NOREF)
      vals[sref] = step;
    StepArgs args = {vals, finite};
    StepResult r0, r1;
    interp_step(g, &ref.layout, ref.bufs, &args, &r0);
    for (int t = 0; t < 3; t++) {
      /* threads 1 and 3 run the host's code, 2 the haswell code */
      cpu_step(t == 1 ? prog2 : prog, pools[t], g, &run[t].layout, run[t].bufs, &args, &r1);
      char what[160];
      snprintf(what, sizeof what, "%s step %d, %d thread%s%s", name, step, t + 1, t ? "s" : "",
               t == 1 ? " (haswell)" : "");
      bool same = same_buffers(g, &ref, &run[t], what) && r0.nred == r1.nred &&
                  (r0.nred == 0 || memcmp(r0.red, r1.red, sizeof(double) * (size_t)r0.nred) == 0);
      CHECK(same, "%s: cpu differs from the interpreter", what);
      ok &= same;
    }
  }
  printf("%-40s %s (compile %.1f ms)\n", name, ok ? "identical" : "DIFFERENT",
         times.build + times.opt + times.codegen + times.link);
  for (int t = 0; t < 3; t++) {
    pool_free(pools[t]);
    group_free(&run[t]);
  }
  group_free(&ref);
  cpu_program_free(prog);
  cpu_program_free(prog2);
  free(vals);
  tf_free(&tf);
  arena_free(arena);
}

static void test_matrix(void) {
  MatrixCase c;
  for (int i = 0; matrix_case_at(i, &c); i++)
    matrix_case(c.name, c.yaml);
}

/* ---- the disk cache ---------------------------------------------------------------------- */

static void test_cache(void) {
  test_dir_make("optc_cache");
  setenv("XDG_CACHE_HOME", test_dir, 1);
  setenv("OPTC_CACHE", "1", 1);
  Arena *arena = arena_new();
  Graph *g = build_recipe("optimizer:\n  _component_: torch.optim.AdamW\ndtype: fp32\nclip_grad_norm: 1.0\n", arena);
  ASSERT(g && pipeline_run(g, &(PipelineOptions){0}));
  int before = cpu_compile_count();
  CompileTimes t1 = {0}, t2 = {0}, t3 = {0};
  CpuProgram *a = cpu_compile(g, NULL, &t1);
  CHECK(a && !t1.cache_hit && cpu_compile_count() == before + 1, "first compile builds");
  CpuProgram *b = cpu_compile(g, NULL, &t2);
  CHECK(b && t2.cache_hit && cpu_compile_count() == before + 1, "second compile is a cache hit");
  printf("cache: cold %.1f ms, hit %.2f ms\n", t1.build + t1.opt + t1.codegen + t1.link, t2.link);
  Buf key = {0};
  /* the entry's path: the only file in the cache directory */
  char cmd[512];
  char *path = NULL;
  FILE *ls;
  snprintf(cmd, sizeof cmd, "ls %s", in_dir("optc/cpu-*").s);
  ls = popen(cmd, "r");
  char line[1024] = {0};
  if (ls && fgets(line, sizeof line, ls)) {
    line[strcspn(line, "\n")] = 0;
    path = strdup(line);
  }
  if (ls)
    pclose(ls);
  CHECK(path != NULL, "the cache entry exists");
  if (path) {
    /* truncate it: the next compile must notice and rebuild */
    struct stat st;
    stat(path, &st);
    CHECK(truncate(path, st.st_size / 2) == 0, "truncate");
    CpuProgram *c = cpu_compile(g, NULL, &t3);
    CHECK(c && !t3.cache_hit && cpu_compile_count() == before + 2, "a truncated entry is rebuilt");
    cpu_program_free(c);
    /* flip one byte of the payload (near the end): rebuilt again */
    FILE *f = fopen(path, "r+b");
    ASSERT(f);
    fseek(f, -100, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(ch ^ 0x5a, f);
    fclose(f);
    CompileTimes t4 = {0};
    c = cpu_compile(g, NULL, &t4);
    CHECK(c && !t4.cache_hit && cpu_compile_count() == before + 3, "a corrupted entry is rebuilt");
    /* and the rebuilt program works: one step against the interpreter */
    TensorFile tf = {0};
    make_tensors(&tf, TY_F32, TY_F32);
    double *vals = step1_inputs(g, false);
    ParamGroup p1, p2;
    int fin;
    ASSERT(group_from_file(&p1, g, &tf, vals, &fin) == 0 && group_from_file(&p2, g, &tf, vals, &fin) == 0);
    StepArgs args = {vals, fin};
    StepResult r;
    ThreadPool *pool = pool_create(2);
    interp_step(g, &p1.layout, p1.bufs, &args, &r);
    cpu_step(c, pool, g, &p2.layout, p2.bufs, &args, &r);
    CHECK(same_buffers(g, &p1, &p2, "after rebuild"), "the rebuilt program matches the interpreter");
    pool_free(pool);
    group_free(&p1);
    group_free(&p2);
    free(vals);
    tf_free(&tf);
    cpu_program_free(c);
    /* OPTC_CACHE=0: no lookup, a compile every time */
    setenv("OPTC_CACHE", "0", 1);
    CompileTimes t5 = {0};
    c = cpu_compile(g, NULL, &t5);
    CHECK(c && !t5.cache_hit && cpu_compile_count() == before + 4, "OPTC_CACHE=0 compiles");
    cpu_program_free(c);
    setenv("OPTC_CACHE", "1", 1);
    unlink(path);
    free(path);
  }
  buf_free(&key);
  cpu_program_free(a);
  cpu_program_free(b);
  test_dir_remove();
  arena_free(arena);
}

/* ---- 64-bit indices ------------------------------------------------------------------------- */

static void test_index64(void) {
  Arena *arena = arena_new();
  Graph *g = build_recipe("optimizer:\n  _component_: torch.optim.AdamW\ndtype: bf16\noptimizer_state_dtype: fp32\n"
                   "stochastic_rounding: true\nclip_grad_norm: 1.0\nseed: 3\n",
                   arena);
  ASSERT(g && pipeline_run(g, &(PipelineOptions){0}));
  CpuTarget target = {.no_cache = true};
  CpuProgram *prog = cpu_compile(g, &target, NULL);
  ASSERT(prog);
  /* Two copies of the same 1000 real elements of each buffer. */
  enum { N = 1000 };
  const int64_t FLAT = (int64_t)3 << 30;  /* 3 * 2^30 > 2^31 */
  const int64_t START = (int64_t)5 << 30; /* > 2^32: the hash's high word */
  void *mem[2][8], *bufs[2][8];
  for (int copy = 0; copy < 2; copy++)
    for (int b = 0; b < g->nbufs; b++) {
      int es = type_size(g->bufs[b].type);
      mem[copy][b] = aligned_alloc(64, ((size_t)(N + 64) * (size_t)es + 63) / 64 * 64);
      /* the kernel adds FLAT elements back */
      bufs[copy][b] = (char *)mem[copy][b] - FLAT * es;
    }
  rng = 99;
  for (int b = 0; b < g->nbufs; b++) {
    int es = type_size(g->bufs[b].type);
    for (int i = 0; i < N + 16; i++) {
      float v = g->bufs[b].kind == BUF_STATE && !strcmp(g->bufs[b].name, "exp_avg_sq") ? fabsf(normalf()) : normalf();
      if (es == 2)
        ((uint16_t *)mem[0][b])[i] = optc_f32_to_bf16(v);
      else
        ((float *)mem[0][b])[i] = v;
    }
    memcpy(mem[1][b], mem[0][b], (size_t)(N + 16) * (size_t)es);
  }
  int64_t numel = START + N;
  GroupLayout l = {.ntensors = 1, .numel = &numel, .offset = (int64_t[]){FLAT - START}, .total = FLAT + N + 16};
  Chunk chunks[1] = {{.tensor = 0, .block = (int32_t)(FLAT / OPTC_REDUCE_BLOCK), .start = START, .len = N, .flat = FLAT,
                        .numel = START + N}};
  l.chunks = chunks;
  l.nchunks = 1;
  double *vals = step1_inputs(g, false);
  StepArgs args = {vals, 1};
  StepResult r0, r1;
  interp_step(g, &l, bufs[0], &args, &r0);
  ThreadPool *pool = pool_create(1);
  cpu_step(prog, pool, g, &l, bufs[1], &args, &r1);
  bool same = true;
  for (int b = 0; b < g->nbufs; b++)
    same &= memcmp(mem[0][b], mem[1][b], (size_t)(N + 16) * (size_t)type_size(g->bufs[b].type)) == 0;
  CHECK(same, "64-bit flat index and >2^32 element index: kernel and interpreter agree");
  CHECK(r0.nred == 1 && r1.nred == 1 && r0.red[0] == r1.red[0] && r0.red[0] > 0, "the reduction agrees");
  /* the high word of the index changes the stochastic rounding: with
   * START below 2^32 the params come out different */
  printf("index64: flat %lld, element %lld: %s\n", (long long)FLAT, (long long)START, same ? "identical" : "DIFFERENT");
  pool_free(pool);
  for (int copy = 0; copy < 2; copy++)
    for (int b = 0; b < g->nbufs; b++)
      free(mem[copy][b]);
  free(vals);
  cpu_program_free(prog);
  arena_free(arena);
}

/* ---- a divide by a step value, as a multiply ------------------------------------------------ */

static uint32_t hold_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

/* emit_llvm.c's recip_check, written again: whether bf16(m / c) ==
 * bf16(m * (1 / c)) for the 128 significands m of a bf16 in [1, 2). */
static bool recip_rounds_same(float c) {
  volatile float r = 1.0f / c;
  for (int k = 0; k < 128; k++) {
    volatile float m = 1.0f + (float)k / 128.0f, q = m / c, p = m * r;
    if (hold_bits(q) != hold_bits(p))
      return false;
  }
  return c >= 0x1p-40f && c <= 0x1p40f;
}

static void test_recip(void) {
  static const char *const cpus[] = {"avx2", "avx512"};
  static const struct {
    double beta2;
    int step;
  } steps[] = {{0.999, 1}, {0.999, 2}, {0.999, 2934}, {0.999, 4923}, {0.9999, 775}, {0.9999, 2402}, {0.95, 7}};
  /* every bf16 bit pattern, and a tail; the for-loop's again with each
   * pattern 9 times, so that each of 2 threads' calls is large enough to
   * look its denominator up in a table (CPU_TABLE_MIN) */
  enum { N = 65536 + 37, NT = 9 * 65536 + 37 };
  _Static_assert(NT / 2 - OPTC_REDUCE_BLOCK >= CPU_TABLE_MIN, "a call too small for the table");
  int by_kind[2] = {0, 0};
  for (int ci = 0; ci < 6; ci++) {
    /* and fused=True's body on the same data: every NaN and Inf of the
     * states through its stores */
    bool fused = ci == 2 || ci == 3, big = ci >= 4;
    Arena *arena = arena_new();
    char yaml[256];
    snprintf(yaml, sizeof yaml,
             "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 0.01\n  weight_decay: 0.1\n  fused: %s\n"
             "dtype: bf16\ntorch_cpu: %s\nnonfinite_grads: propagate\n",
             fused ? "True" : "False", cpus[ci % 2]);
    Graph *g = build_recipe(yaml, arena);
    ASSERT(g && pipeline_run(g, &(PipelineOptions){0}));
    /* and, for the table, an Intel AVX-512 CPU's code where this one runs
     * it: an AMD CPU's own has no table (emit_llvm.c, tab_find) */
    static const char *const code[3] = {"this CPU's", "haswell", "skylake-avx512"};
    CpuProgram *progs[3] = {cpu_compile(g, &(CpuTarget){.no_cache = true}, NULL),
                            cpu_compile(g, &(CpuTarget){.cpu = "haswell", .no_cache = true}, NULL)};
    int nprogs = 2;
    if (big && __builtin_cpu_supports("avx512bw"))
      progs[nprogs++] = cpu_compile(g, &(CpuTarget){.cpu = "skylake-avx512", .no_cache = true}, NULL);
    for (int k = 0; k < nprogs; k++)
      ASSERT(progs[k]);
    int64_t numel = big ? NT : N;
    GroupLayout l;
    layout_init(&l, 1, &numel);
    ThreadPool *pool = pool_create(2);
    void *init[8], *bufs[4][8];
    rng = 7;
    for (int b = 0; b < g->nbufs; b++) {
      size_t bytes = (size_t)l.total * (size_t)type_size(g->bufs[b].type);
      init[b] = alloc64(bytes);
      uint16_t *h = init[b];
      bool sq = !strcmp(g->bufs[b].name, "exp_avg_sq");
      for (int64_t i = 0; i < l.total; i++) {
        h[i] = sq ? (uint16_t)i : optc_f32_to_bf16(normalf() * (g->bufs[b].kind == BUF_GRAD ? 1e-2f : 1.0f));
        /* one element in 16 stores subnormals: a subnormal param (or 0)
         * with no grad and no exp_avg comes out p * (1 - lr * wd), and a
         * subnormal exp_avg_sq beta2 * v (vcvtneps2bf16 flushes them:
         * emit_llvm.c, round_bf16_cvt) */
        if (i % 16 == 5 && !sq)
          h[i] = g->bufs[b].kind == BUF_PARAM ? (uint16_t)(((i >> 4) & 0x7f) | (((i >> 11) & 1) << 15)) : 0;
      }
      for (int k = 0; k < 4; k++)
        bufs[k][b] = alloc64(bytes);
    }
    Ref sref = graph_find_input(g, "step"), bref = graph_find_input(g, "beta2");
    ASSERT(sref != NOREF && bref != NOREF);
    bool ok = true;
    for (size_t si = 0; si < ARRAY_LEN(steps); si++) {
      /* three steps' tables: step 1's, 2934's, and beta2 0.95's, where
       * exp_avg_sq * beta2 rounds a tie on 3062 of its 65536 inputs, so
       * without AVX-512 the holds round to even (tie_find) */
      if (big && si != 0 && si != 2 && si != 6)
        continue;
      double *vals = step1_inputs(g, false);
      vals[sref] = steps[si].step;
      vals[bref] = steps[si].beta2;
      bool mul = recip_rounds_same((float)sqrt(1.0 - pow(steps[si].beta2, steps[si].step)));
      by_kind[mul] += !fused && !big;
      for (int k = 0; k <= nprogs; k++)
        for (int b = 0; b < g->nbufs; b++)
          memcpy(bufs[k][b], init[b], (size_t)l.total * (size_t)type_size(g->bufs[b].type));
      StepArgs args = {vals, 1};
      StepResult r;
      interp_step(g, &l, bufs[0], &args, &r);
      for (int k = 0; k < nprogs; k++) {
        cpu_step(progs[k], pool, g, &l, bufs[k + 1], &args, &r);
        char what[128];
        snprintf(what, sizeof what, "recip: %s, torch_cpu %s, beta2 %g, step %d (%s), %s code",
                 fused ? "fused" : "for-loop", cpus[ci % 2], steps[si].beta2, steps[si].step,
                 fused ? "divides" : big ? "a large call: table, or half up" : mul ? "multiplies" : "divides", code[k]);
        bool same = same_bytes(g, l.total, bufs[0], bufs[k + 1], what);
        CHECK(same, "%s: the kernel differs from the interpreter", what);
        ok &= same;
      }
      free(vals);
    }
    printf("recip: %s, torch_cpu %s, %zu steps over every bf16 exp_avg_sq%s: %s\n", fused ? "fused" : "for-loop",
           cpus[ci % 2], big ? 3 : ARRAY_LEN(steps), big ? " (9 times: the table)" : "",
           ok ? "identical" : "DIFFERENT");
    for (int b = 0; b < g->nbufs; b++) {
      free(init[b]);
      for (int k = 0; k < 4; k++)
        free(bufs[k][b]);
    }
    pool_free(pool);
    layout_free(&l);
    for (int k = 0; k < nprogs; k++)
      cpu_program_free(progs[k]);
    arena_free(arena);
  }
  /* both of the kernel's loops ran */
  CHECK(by_kind[0] > 0 && by_kind[1] > 0, "recip: steps that divide (%d) and steps that multiply (%d)", by_kind[0],
        by_kind[1]);
}

/* ---- MKL's generic sqrt (torch_cpu: amd) --------------------------------------------------- */

/* sqrt_mkl_ex, compiled for this CPU (and for haswell, whose AVX2 code an
 * AVX-512 CPU runs too), against numerics_mkl.h's optc_sqrt_mkl_ex_f32 on
 * every f32 in [1, 4) (all 2^23 significands with both exponent parities:
 * RSQRTPS reads no more of its input), every exponent's edges, the rare
 * lanes (zeros, subnormals, the top of the range, infinities, NaNs with
 * payloads) and random bit patterns. Both take this CPU's RSQRTPS, so
 * they agree wherever they run; torch's bits are checked by tests/torch. */
static void test_sqrt_mkl_ex(void) {
  const char *text = "param @param : f32\ngrad @grad : f32\n%g = load @grad : f32\n"
                     "%r = sqrt_mkl_ex %g : f32\nstore @param, %r\n";
  Arena *arena = arena_new();
  Graph *g = build_optir("<sqrt_mkl_ex>", text, arena);
  ASSERT(g);
  enum { SPAN = 1 << 24, EDGES = 256 * 64, RANDOM = 1 << 20 };
  int64_t n = SPAN + EDGES + RANDOM;
  GroupLayout l;
  layout_init(&l, 1, &n);
  float *in = alloc64((size_t)l.total * 4), *out = alloc64((size_t)l.total * 4);
  int64_t k = 0;
  for (uint32_t i = 0; i < SPAN; i++) /* [1, 4): 0x3f800000 .. 0x407fffff */
    ((uint32_t *)in)[k++] = 0x3f800000u + i;
  for (uint32_t e = 0; e < 256; e++) /* each exponent's lowest and highest significands, both signs */
    for (uint32_t j = 0; j < 64; j++) {
      uint32_t mant = j < 16 ? j : j < 32 ? 0x7fffffu - (j - 16) : (0x400000u + (j - 32) * 4099u) & 0x7fffffu;
      ((uint32_t *)in)[k++] = (j & 1u) << 31 ^ (e << 23 | mant);
    }
  rng = 1234;
  for (int i = 0; i < RANDOM; i++)
    ((uint32_t *)in)[k++] = (uint32_t)(uniform() * 4294967296.0);
  static const char *const cpus[] = {NULL, "haswell"};
  ThreadPool *pool = pool_create(2);
  for (int c = 0; c < 2; c++) {
    CpuProgram *prog = cpu_compile(g, &(CpuTarget){.cpu = cpus[c], .no_cache = true}, NULL);
    ASSERT(prog);
    memset(out, 0, (size_t)l.total * 4);
    void *bufs[2];
    bufs[graph_find_buffer(g, "param")] = out;
    bufs[graph_find_buffer(g, "grad")] = in;
    StepArgs args = {NULL, 1};
    StepResult r;
    cpu_step(prog, pool, g, &l, bufs, &args, &r);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
      float want = optc_sqrt_mkl_ex_f32(in[i]);
      if (optc_f32_bits(want) != optc_f32_bits(out[i]) && bad++ == 0)
        first = i;
    }
    CHECK(bad == 0, "sqrt_mkl_ex (%s code): %lld of %lld differ from numerics_mkl.h, first 0x%08x: 0x%08x vs 0x%08x",
          cpus[c] ? cpus[c] : "this CPU's", (long long)bad, (long long)n, first < 0 ? 0 : optc_f32_bits(in[first]),
          first < 0 ? 0 : optc_f32_bits(out[first]), first < 0 ? 0 : optc_f32_bits(optc_sqrt_mkl_ex_f32(in[first])));
    cpu_program_free(prog);
  }
  /* the GPU's RSQRTPS, a table of this CPU's 8192 answers, is this CPU's:
   * every input of the test above, and every exponent's every top-12 bits */
  uint32_t tab[OPTC_RSQRTPS_TAB];
  for (uint32_t i = 0; i < OPTC_RSQRTPS_TAB; i++)
    tab[i] = optc_f32_bits(optc_rsqrtps_f32(optc_bits_f32(optc_rsqrtps_tab_input(i))));
  int64_t tab_bad = 0, tab_n = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = optc_f32_bits(in[i]);
    if (u - 0x00800000u < 0x7f000000u) /* positive normal */
      tab_n++, tab_bad += optc_f32_bits(optc_rsqrtps_from_tab(tab, in[i])) != optc_f32_bits(optc_rsqrtps_f32(in[i]));
  }
  for (uint32_t b = 1; b < 255; b++)
    for (uint32_t top = 0; top < 4096; top++) {
      uint32_t u = b << 23 | top << 11 | (uint32_t)(uniform() * 2048.0);
      tab_n++, tab_bad += optc_f32_bits(optc_rsqrtps_from_tab(tab, optc_bits_f32(u))) !=
                          optc_f32_bits(optc_rsqrtps_f32(optc_bits_f32(u)));
    }
  CHECK(tab_bad == 0, "RSQRTPS from its 8192-entry table differs from the instruction on %lld of %lld inputs",
        (long long)tab_bad, (long long)tab_n);
  /* and the model against IEEE's sqrt: within an ulp on [1, 4) (at the
   * bottom of the normals its unscaled Newton step is further off, as
   * torch's is), and IEEE's on the rare lanes that are not NaN or < 0 */
  int64_t off = 0, far = 0, rare_bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float x = in[i], m = optc_sqrt_mkl_ex_f32(x), ieee = sqrtf(x);
    uint32_t u = optc_f32_bits(x);
    bool fast = u - 0x00800000u <= 0x7f7ff000u - 0x00800000u;
    long long d = llabs((long long)optc_f32_bits(m) - (long long)optc_f32_bits(ieee));
    if (fast && d) {
      off++;
      far += i < SPAN && d > 1;
    }
    if (!fast && !(isnan(x) || (u >> 31 && (u & 0x7fffffffu))) && optc_f32_bits(m) != optc_f32_bits(ieee))
      rare_bad++;
  }
  CHECK(far == 0, "sqrt_mkl_ex is more than 1 ulp from IEEE's sqrt at %lld inputs in [1, 4)", (long long)far);
  CHECK(rare_bad == 0, "sqrt_mkl_ex's rare lanes are not IEEE's sqrt (%lld)", (long long)rare_bad);
  printf("sqrt_mkl_ex: %lld inputs, this CPU's and haswell's code equal numerics_mkl.h's model; %lld of them 1 ulp "
         "from IEEE's sqrt\n", (long long)n, (long long)off);
  pool_free(pool);
  free(in);
  free(out);
  layout_free(&l);
  arena_free(arena);
}

int main(void) {
  test_sqrt_mkl_ex();
  test_recip();
  test_index64();
  test_cache();
  test_matrix();
  printf("test_backends: %d checks, %d failed\n", nchecks, nfailed);
  return nfailed != 0;
}
