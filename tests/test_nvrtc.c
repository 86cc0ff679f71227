/* test_nvrtc: the GPU backend's CUDA C compiles with NVRTC, with no GPU.
 *
 * - Every built-in optimizer (with its graph-changing options) x the three
 *   dtype layouts x clipping on and off, for sm_80 and sm_90 (and with
 *   stochastic rounding for sm_90): a non-empty cubin, and ptxas -v
 *   reports every kernel with at most SPILL_SLACK bytes of spill stores
 *   and loads. ptxas's occupancy heuristic is not the same on every host:
 *   on an AMD EPYC (Zen 4) host, the same NVRTC 13.0 and the same source
 *   capped rmsprop_centered_momentum bf16/fp32-states's sm_80 kernel at 80
 *   registers and spilled 4 bytes, where the Intel hosts before it spilled
 *   none. What this guards against, the emitter's register pressure
 *   blowing up, spills far more; AdamW's kernels have their own register
 *   bounds below.
 * - compute_90 gives PTX and no cubin (NVRTC's empty cubin is noticed); an
 *   arch newer than NVRTC knows falls back to PTX for the newest it knows;
 *   an unknown arch is an error; no arch and no device gives sm_90.
 * - The disk cache: a second compile is a hit, with the same cubin; a
 *   truncated entry is a miss and is rebuilt.
 * - The Scout recipe's kernels, with their registers, are printed. */
#include "exec.h"
#include "steplib.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static double total_ms;
static int ncompiled;

/* One 8-byte stack slot: what ptxas may trade for occupancy (above). */
enum { SPILL_SLACK = 8 };
static int nspilled; /* kernels with any spill, within the slack */

/* Compiles g for arch: a cubin, every kernel without spills beyond SPILL_SLACK. */
static void check_compile(const char *name, const Graph *g, const char *arch) {
  CudaTarget t = {.arch = arch, .no_cache = true};
  double t0 = now_seconds();
  CudaProgram *p = cuda_compile(g, &t, NULL);
  double ms = (now_seconds() - t0) * 1e3;
  total_ms += ms;
  ncompiled++;
  CHECK(p, "%s %s: compiles", name, arch);
  if (!p)
    return;
  CHECK(p->cubin && p->cubin_len > 4 && !memcmp(p->cubin, "\177ELF", 4), "%s %s: a cubin (ELF)", name, arch);
  CHECK(!strcmp(p->arch, arch), "%s: compiled for %s, not %s", name, p->arch, arch);
  int regs = 0;
  bool clean = true;
  for (int k = 0; k < p->nkernels; k++) {
    const CudaKernel *c = &p->kernels[k];
    CHECK(c->regs > 0 && c->spill_stores <= SPILL_SLACK && c->spill_loads <= SPILL_SLACK &&
              c->stack <= 2 * SPILL_SLACK,
          "%s %s %s: %d registers, %d bytes spill stores, %d spill loads, %d stack", name, arch, c->name, c->regs,
          c->spill_stores, c->spill_loads, c->stack);
    clean &= c->spill_stores == 0 && c->spill_loads == 0;
    nspilled += c->spill_stores || c->spill_loads;
    regs = MAX(regs, c->regs);
  }
  printf("%-44s %-6s %6.0f ms  %3d registers at most, %s\n", name, arch, ms, regs, clean ? "no spills" : "SPILLS");
  cuda_program_free(p);
}

/* Under ASan, NVRTC's own allocations (it runs in this process) make each
 * compile about ten times slower (7-8 s), and it is not our code that is
 * checked there: the sanitized run compiles every seventh case (7 is prime
 * to the layouts' case counts, so the optimizer, layout, clip and
 * stochastic rounding all vary), for sm_90 only. The plain build compiles them all. */
#if defined(__SANITIZE_ADDRESS__)
enum { MATRIX_STRIDE = 7, MATRIX_SM80 = 0 };
#else
enum { MATRIX_STRIDE = 1, MATRIX_SM80 = 1 };
#endif

static void test_matrix(void) {
  MatrixCase mc;
  for (int i = 0; matrix_case_at(i, &mc); i += MATRIX_STRIDE) {
    Arena *a = arena_new();
    Graph *g = build_yaml(mc.yaml, a);
    CHECK(g, "%s: the recipe builds", mc.name);
    if (g) {
      if (!mc.sr && MATRIX_SM80)
        check_compile(mc.name, g, "sm_80");
      check_compile(mc.name, g, "sm_90");
    }
    arena_free(a);
  }
}

static void test_arches(void) {
  Arena *a = arena_new();
  Graph *g = build_yaml("optimizer:\n  _component_: torch.optim.AdamW\ndtype: bf16\nclip_grad_norm: 1.0\n", a);
  ASSERT(g);
  /* PTX only: NVRTC's empty cubin for a virtual arch */
  CudaProgram *p = cuda_compile(g, &(CudaTarget){.arch = "compute_90", .no_cache = true}, NULL);
  CHECK(p && !p->cubin && p->cubin_len == 0 && p->ptx && strstr(p->ptx, ".target sm_90"),
        "compute_90: PTX for sm_90 and no cubin");
  CHECK(p && p->kernels[0].regs == -1, "compute_90: no ptxas report");
  cuda_program_free(p);
  /* newer than NVRTC knows: PTX for the newest it does */
  p = cuda_compile(g, &(CudaTarget){.arch = "sm_990", .no_cache = true}, NULL);
  CHECK(p && !p->cubin && !strncmp(p->arch, "compute_", 8) && p->ptx, "sm_990: falls back to PTX (%s)",
        p ? p->arch : "failed");
  if (p)
    printf("sm_990 -> %s, PTX only\n", p->arch);
  cuda_program_free(p);
  /* nonsense */
  p = cuda_compile(g, &(CudaTarget){.arch = "gfx90a", .no_cache = true}, NULL);
  CHECK(!p, "gfx90a: an error");
  cuda_program_free(p);
  /* no arch: the device's, else sm_90 */
  char why[256], arch[32] = "sm_90";
  bool dev = cuda_device_arch(arch, sizeof arch, why, sizeof why);
  p = cuda_compile(g, &(CudaTarget){.no_cache = true}, NULL);
  CHECK(p && !strcmp(p->arch, arch), "no arch: %s (%s)", arch, dev ? "the device's" : why);
  cuda_program_free(p);
  /* the emit entry points */
  Buf ptx = {0}, cubin = {0}, src = {0};
  CudaTarget t = {.arch = "sm_90", .no_cache = true};
  CHECK(cuda_emit_source(g, &t, &src) == 0 && strstr(src.data, "optc_phase1("), "--emit=cuda");
  CHECK(cuda_emit_ptx(g, &t, &ptx) == 0 && ptx.len && strstr(ptx.data, ".entry optc_phase0"), "--emit=ptx");
  CHECK(cuda_emit_cubin(g, &t, &cubin) == 0 && cubin.len > 4 && !memcmp(cubin.data, "\177ELF", 4), "--emit=cubin");
  CHECK(cuda_emit_cubin(g, &(CudaTarget){.arch = "compute_90", .no_cache = true}, &cubin) != 0,
        "--emit=cubin for compute_90: an error, not an empty file");
  buf_free(&ptx);
  buf_free(&cubin);
  buf_free(&src);
  arena_free(a);
}

static void test_cache(void) {
  test_dir_make("optc_nvrtc_cache");
  setenv("XDG_CACHE_HOME", test_dir, 1);
  setenv("OPTC_CACHE", "1", 1);
  Arena *a = arena_new();
  Graph *g = build_yaml("optimizer:\n  _component_: torch.optim.AdamW\ndtype: fp32\nclip_grad_norm: 1.0\n", a);
  ASSERT(g);
  CudaTarget t = {.arch = "sm_90"};
  int before = cuda_compile_count();
  CompileTimes t1 = {0}, t2 = {0}, t3 = {0};
  CudaProgram *p1 = cuda_compile(g, &t, &t1);
  CHECK(p1 && !t1.cache_hit && cuda_compile_count() == before + 1, "first compile runs NVRTC");
  CudaProgram *p2 = cuda_compile(g, &t, &t2);
  CHECK(p2 && t2.cache_hit && cuda_compile_count() == before + 1, "second compile is a cache hit");
  CHECK(p1 && p2 && p1->cubin_len == p2->cubin_len && !memcmp(p1->cubin, p2->cubin, p1->cubin_len) &&
            p2->ptx && !strcmp(p1->ptx, p2->ptx) && p2->kernels[1].regs == p1->kernels[1].regs,
        "the hit holds the same cubin, PTX and ptxas report");
  printf("cache: NVRTC %.1f ms, hit %.2f ms\n", t1.build + t1.codegen, t2.build + t2.codegen);
  char cmd[512], path[1024] = "";
  snprintf(cmd, sizeof cmd, "ls %s", in_dir("optc/cuda-*").s);
  FILE *ls = popen(cmd, "r");
  if (ls && fgets(path, sizeof path, ls))
    path[strcspn(path, "\n")] = 0;
  if (ls)
    pclose(ls);
  CHECK(*path, "the cache entry exists");
  if (*path) {
    struct stat st;
    CHECK(stat(path, &st) == 0 && truncate(path, st.st_size / 2) == 0, "truncate the entry");
    CudaProgram *p3 = cuda_compile(g, &t, &t3);
    CHECK(p3 && !t3.cache_hit && cuda_compile_count() == before + 2 && p3->cubin_len == p1->cubin_len,
          "a truncated entry is rebuilt");
    cuda_program_free(p3);
  }
  cuda_program_free(p1);
  cuda_program_free(p2);
  test_dir_remove();
  arena_free(a);
}

/* Kernel `name`'s PTX instructions (body lines that begin with an opcode or
 * a predicate and end in ';'), and in *nop how many of them are `op`. */
static int ptx_count(const char *ptx, const char *name, const char *op, int *nop) {
  char head[96];
  snprintf(head, sizeof head, ".entry %s(", name);
  const char *p = strstr(ptx, head);
  int n = 0;
  *nop = 0;
  if (!p)
    return -1;
  for (p = strchr(p, '\n'); p && p[1] != '}'; p = strchr(p + 1, '\n')) {
    const char *s = p + 1, *end = strchr(s, '\n');
    while (*s == ' ' || *s == '\t')
      s++;
    if (!end || end == s || end[-1] != ';' || !(*s == '@' || (*s >= 'a' && *s <= 'z')))
      continue;
    n++;
    if (*s == '@') /* the predicate, then the opcode */
      s += strcspn(s, " \t"), s += strspn(s, " \t");
    *nop += !strncmp(s, op, strlen(op));
  }
  return n;
}

/* The bf16 AdamW step rounds on the hardware's conversion (cvt.rn.bf16x2.f32,
 * emit_cuda.c's optc_cvt_bf16x2, and one select for numerics.h's NaN) instead
 * of numerics.h's integer rounding, and a store of a held value takes its
 * high half. Bounded: PTX instructions per copy of the element loop (once
 * the body is small, NVVM unswitches the loop on lerp's weight, |w| < 0.5:
 * two copies, counted by AdamW's one sqrt per element) and registers.
 * NVRTC 13.0 when the bounds were set; SASS is the cubin's .text / 16:
 *                         before (numerics.h)             after
 *                         PTX       SASS  regs            PTX           SASS  regs
 *   bf16       sm_80     1811 x1    1768   59     1805 x2 (903 each)   1944   59
 *              sm_90     1811 x1    1792   60     1805 x2 (903 each)   1960   59
 *   bf16 clip  sm_80     1924 x1    1856   59     1926 x2 (963 each)   2016   59
 *   (phase 1)  sm_90     1924 x1    1872   60     1926 x2 (963 each)   2040   59
 *   bf16 fused sm_80     1740 x2    2136   74     1391 x2 (696 each)   1920   70
 *              sm_90     1740 x2    2152   74     1391 x2 (696 each)   1936   70
 * With lerp made branch-free for the comparison alone (one copy each, nvcc):
 * bf16 sm_90 1768 -> 1117 PTX, 1760 -> 1240 SASS; clip phase 1 1881 -> 1182
 * PTX; fused 1705 -> 1362 PTX.
 * Then (issue 14, on an H200) a hold that only f32 arithmetic reads skips
 * the NaN select (the GPU's arithmetic makes its own canonical NaN), the
 * pointers are loaded once per chunk and the four 16-byte loads issued
 * together, 128 threads per block: PTX per copy 903 -> 629 (bf16, sm_80 and
 * sm_90), 963 -> 652 (clip), 696 -> 622 (fused); registers 59 -> 69, 59 ->
 * 69, 70 -> 78 (the loads in flight; 128-thread blocks keep 7 per SM). */
static void test_bf16_adamw(void) {
#define ADAMW "optimizer:\n  _component_: torch.optim.AdamW\n"
  static const struct {
    const char *name, *yaml, *kernel, *arch;
    int max_ptx, max_regs;
  } cases[] = {
      {"bf16", ADAMW "dtype: bf16\n", "optc_phase0", "sm_80", 680, 72},
      {"bf16", ADAMW "dtype: bf16\n", "optc_phase0", "sm_90", 680, 72},
      {"bf16 clip", ADAMW "dtype: bf16\nclip_grad_norm: 1.0\n", "optc_phase1", "sm_90", 700, 72},
      {"bf16 fused", ADAMW "  fused: True\ndtype: bf16\n", "optc_phase0", "sm_90", 680, 80},
  };
#undef ADAMW
  for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
    const char *name = cases[i].name, *arch = cases[i].arch;
    Arena *a = arena_new();
    Graph *g = build_yaml(cases[i].yaml, a);
    CHECK(g, "AdamW %s builds", name);
    CudaProgram *p = g ? cuda_compile(g, &(CudaTarget){.arch = arch, .no_cache = true}, NULL) : NULL;
    CHECK(p && p->ptx, "AdamW %s %s compiles", name, arch);
    if (p && p->ptx) {
      int nsqrt = 0, ncvt = 0, regs = -1;
      int n = ptx_count(p->ptx, cases[i].kernel, "sqrt.rn.f32", &nsqrt);
      ptx_count(p->ptx, cases[i].kernel, "cvt.rn.bf16x2.f32", &ncvt);
      int copies = MAX(nsqrt / 8, 1);
      for (int k = 0; k < p->nkernels; k++)
        if (!strcmp(p->kernels[k].name, cases[i].kernel))
          regs = p->kernels[k].regs;
      printf("AdamW %-10s %s %s: %4d PTX instructions (%d cop%s, %d each), %d registers\n", name, arch,
             cases[i].kernel, n, copies, copies == 1 ? "y" : "ies", n / copies, regs);
      CHECK(ncvt > 0, "AdamW %s %s: rounds with cvt.rn.bf16x2.f32", name, arch);
      CHECK(n > 0 && n / copies <= cases[i].max_ptx, "AdamW %s %s: %d PTX instructions per copy, at most %d", name,
            arch, n / copies, cases[i].max_ptx);
      CHECK(regs > 0 && regs <= cases[i].max_regs, "AdamW %s %s: %d registers, at most %d", name, arch, regs,
            cases[i].max_regs);
    }
    cuda_program_free(p);
    arena_free(a);
  }
}

/* The norm pass with 2, 4 and 8 lanes a thread (CudaTarget.red_lanes):
 * each lane's elements in one load as wide as the lanes (a bf16 pair in a
 * u32, four in a v2.u32, eight in a v4.u32; f32 in v2 and v4), no spills,
 * its registers for the record. The bits are test_cuda_emu's. */
static void test_red_lanes(void) {
  static const struct {
    const char *layout;
    int lanes;
    const char *load;
  } cases[] = {{"bf16", 2, "ld.global.cs.u32"},    {"bf16", 4, "ld.global.cs.v2.u32"},
               {"bf16", 8, "ld.global.cs.v4.u32"}, {"fp32", 2, "ld.global.cs.v2.f32"},
               {"fp32", 4, "ld.global.cs.v4.f32"}};
  for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
    char yaml[160];
    snprintf(yaml, sizeof yaml, "optimizer:\n  _component_: torch.optim.AdamW\ndtype: %s\nclip_grad_norm: 1.0\n",
             cases[i].layout);
    Arena *a = arena_new();
    Graph *g = build_yaml(yaml, a);
    ASSERT(g);
    CudaProgram *p = cuda_compile(g, &(CudaTarget){.arch = "sm_90", .red_lanes = cases[i].lanes, .no_cache = true},
                                  NULL);
    CHECK(p && p->ptx, "AdamW %s clip, %d lanes a thread: compiles", cases[i].layout, cases[i].lanes);
    if (p && p->ptx) {
      int nload = 0;
      int n = ptx_count(p->ptx, "optc_phase0", cases[i].load, &nload);
      const CudaKernel *k = &p->kernels[0];
      printf("norm pass %s, %d lanes a thread: %d PTX instructions, %d %s, %d registers, %d/%d bytes spilled\n",
             cases[i].layout, cases[i].lanes, n, nload, cases[i].load, k->regs, k->spill_stores, k->spill_loads);
      CHECK(nload > 0, "norm pass %s, %d lanes: loads with %s", cases[i].layout, cases[i].lanes, cases[i].load);
      CHECK(k->regs > 0 && k->spill_stores == 0 && k->spill_loads == 0, "norm pass %s, %d lanes: no spills",
            cases[i].layout, cases[i].lanes);
    }
    cuda_program_free(p);
    arena_free(a);
  }
}

/* The real recipe's kernels, for the record. */
static void report_scout(const char *root) {
  char path[1024];
  snprintf(path, sizeof path, "%s/recipes/configs/llama4/scout_17B_16E_full.yaml", root);
  Arena *a = arena_new();
  Recipe *r = recipe_load(path, NULL, 0, a);
  Graph *g = r ? frontend_build(r) : NULL;
  CHECK(g && pipeline_run(g, &(PipelineOptions){0}), "%s builds", path);
  if (g && g->plan) {
    CompileTimes times = {0};
    CudaProgram *p = cuda_compile(g, &(CudaTarget){.arch = "sm_90", .no_cache = true}, &times);
    CHECK(p, "the Scout recipe compiles");
    if (p) {
      Buf b = {0};
      cuda_program_report(p, &b);
      printf("Scout (%s): emit %.2f ms, NVRTC %.1f ms\n%s", path, times.build, times.codegen, b.data);
      buf_free(&b);
      cuda_program_free(p);
    }
  }
  arena_free(a);
}

int main(int argc, char **argv) {
  char why[256];
  if (!cuda_nvrtc_available(why, sizeof why)) {
    printf("SKIP: %s\n", why);
    return 77;
  }
  printf("%s\n", why);
  setenv("OPTC_CACHE", "0", 1);
  test_arches();
  test_cache();
  setenv("OPTC_CACHE", "0", 1);
  report_scout(argc > 1 ? argv[1] : ".");
  test_bf16_adamw();
  test_red_lanes();
  test_matrix();
  printf("%d compiles, %.0f ms each on average; %d kernel%s spilled (at most %d bytes each)\n", ncompiled,
         total_ms / MAX(ncompiled, 1), nspilled, nspilled == 1 ? "" : "s", SPILL_SLACK);
  printf("test_nvrtc: %d checks, %d failed\n", nchecks, nfailed);
  return nfailed != 0;
}
