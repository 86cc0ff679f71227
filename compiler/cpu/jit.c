/* jit.c: the CPU backend's driver. Builds the module (emit_llvm.c), runs
 * default<O3> for the target CPU's name and features, emits an object,
 * caches it on disk, and links it with LLJIT.
 *
 * The object, not the IR, is what the cache keeps and what LLJIT links, so
 * a cache hit costs one link: no IR is built or optimized. */
#include "llvm_emit.h"

#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm/Config/llvm-config.h>
#include <string.h>

struct CpuProgram {
  LLVMOrcLLJITRef jit;
  int nphases;
  PhaseFn *phase;
};

static int ncompiles;

int cpu_compile_count(void) { return ncompiles; }
bool cpu_backend_available(void) { return true; }

static void llvm_init(void) {
  static bool done;
  if (done)
    return;
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
  done = true;
}

/* Prints an LLVM error with where it came from, and consumes it. */
static bool llvm_failed(LLVMErrorRef err, const char *what) {
  if (!err)
    return false;
  char *msg = LLVMGetErrorMessage(err);
  error("LLVM: %s: %s", what, msg);
  LLVMDisposeErrorMessage(msg);
  return true;
}

typedef struct {
  char *triple, *cpu, *features;
} Target;

/* x86 CPUs LLVM knows by name that have AVX-512F. A CPU named without
 * features gets "+avx512f" spelled out, so that the emitter, which reads the
 * feature string, uses AVX-512 instructions (VRSQRT14PS) where the CPU has
 * them; LLVM's C API has no query for what a CPU name implies. All but the
 * Xeon Phis (knl, knm) also have AVX-512BW, which the emitter's bf16
 * conversions use (VPERMW), and DQ; those from cooperlake on have
 * AVX512-BF16 as well (VCVTNEPS2BF16, for stored bf16). */
static const struct {
  const char *cpu, *features;
} avx512_cpus[] = {
    {"knl", "+avx512f"}, {"knm", "+avx512f"},
#define BW "+avx512f,+avx512bw,+avx512dq"
#define BF16 BW ",+avx512bf16"
    {"skylake-avx512", BW}, {"skx", BW}, {"cascadelake", BW}, {"cooperlake", BF16}, {"cannonlake", BW},
    {"icelake-client", BW}, {"icelake-server", BW}, {"tigerlake", BW}, {"rocketlake", BW},
    {"sapphirerapids", BF16}, {"emeraldrapids", BF16}, {"graniterapids", BF16}, {"graniterapids-d", BF16},
    {"diamondrapids", BF16}, {"znver4", BF16}, {"znver5", BF16}, {"x86-64-v4", BW},
#undef BF16
#undef BW
};

static char *named_cpu_features(const char *cpu) {
  for (size_t i = 0; i < ARRAY_LEN(avx512_cpus); i++)
    if (strcmp(avx512_cpus[i].cpu, cpu) == 0)
      return LLVMCreateMessage(avx512_cpus[i].features);
  return LLVMCreateMessage("");
}

/* The CPU a compile targets: the one it names, else $OPTC_CPU (a name, as
 * --cpu: the code another CPU would run, e.g. haswell's on an AVX-512
 * machine, for every compile in the process), else the host. */
static void target_init(Target *t, const CpuTarget *ct) {
  const char *env = getenv("OPTC_CPU");
  const char *cpu = ct && ct->cpu ? ct->cpu : env && *env ? env : NULL;
  t->triple = LLVMGetDefaultTargetTriple();
  t->cpu = cpu ? LLVMCreateMessage(cpu) : LLVMGetHostCPUName();
  t->features = ct && ct->features ? LLVMCreateMessage(ct->features)
                : cpu               ? named_cpu_features(cpu)
                                    : LLVMGetHostCPUFeatures();
}

static void target_free(Target *t) {
  LLVMDisposeMessage(t->triple);
  LLVMDisposeMessage(t->cpu);
  LLVMDisposeMessage(t->features);
}

static LLVMTargetMachineRef make_tm(const Target *t) {
  char *err = NULL;
  LLVMTargetRef target;
  if (LLVMGetTargetFromTriple(t->triple, &target, &err)) {
    error("LLVM: no target for %s: %s", t->triple, err);
    LLVMDisposeMessage(err);
    return NULL;
  }
  return LLVMCreateTargetMachine(target, t->triple, t->cpu, t->features, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                 LLVMCodeModelDefault);
}

/* Runs default<O3> on m; false (m disposed) on failure. */
static bool optimize_module(LLVMModuleRef m, LLVMTargetMachineRef tm, CompileTimes *times) {
  double t0 = now_seconds();
  LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
  /* The element loop is already 16 lanes wide and memory-bound: unrolling
   * it again only doubles the code to select instructions for. */
  LLVMPassBuilderOptionsSetLoopUnrolling(opts, 0);
  LLVMErrorRef err = LLVMRunPasses(m, "default<O3>", tm, opts);
  LLVMDisposePassBuilderOptions(opts);
  if (llvm_failed(err, "default<O3>")) {
    LLVMDisposeModule(m);
    return false;
  }
  if (times)
    times->opt += (now_seconds() - t0) * 1e3;
  return true;
}

/* Builds the module; with `optimize`, runs default<O3> on it. */
static LLVMModuleRef build(const Graph *g, LLVMContextRef c, LLVMTargetMachineRef tm, const Target *t, bool optimize,
                           CompileTimes *times) {
  double t0 = now_seconds();
  if (!block_phases_supported(g))
    return NULL;
  LLVMModuleRef m = llvm_emit_module(g, c, t->cpu, t->features);
  LLVMSetTarget(m, t->triple);
  LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(tm);
  char *dls = LLVMCopyStringRepOfTargetData(dl);
  LLVMSetDataLayout(m, dls);
  LLVMDisposeMessage(dls);
  LLVMDisposeTargetData(dl);
  /* every function: this CPU's name and features, so O3 sees its vectors */
  for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f)) {
    if (LLVMIsDeclaration(f))
      continue;
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(c, "target-cpu", 10, t->cpu, (unsigned)strlen(t->cpu)));
    if (*t->features)
      LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                              LLVMCreateStringAttribute(c, "target-features", 15, t->features,
                                                        (unsigned)strlen(t->features)));
  }
  if (times)
    times->build += (now_seconds() - t0) * 1e3;
  if (optimize && !optimize_module(m, tm, times))
    return NULL;
  return m;
}

/* The cache key: everything the object depends on. The module the emitter
 * made (before O3) is part of it, as a 128-bit hash of its text: a build of
 * optc whose emitter changed, with the same version, must not take the old
 * emitter's objects from the disk cache. */
static char *cache_key(const Graph *g, const Target *t, LLVMModuleRef m) {
  Buf k = {0};
  char *text = LLVMPrintModuleToString(m);
  size_t tn = strlen(text);
  uint64_t h0 = fnv1a(text, tn, FNV1A_BASIS), h1 = fnv1a(text, tn, 0x9e3779b97f4a7c15ull);
  LLVMDisposeMessage(text);
  buf_printf(&k, "optc %s cpu-object llvm %s\ntriple %s\ncpu %s\nfeatures %s\nmodule %016llx%016llx\n",
             OPTC_VERSION, LLVM_VERSION_STRING, t->triple, t->cpu, t->features, (unsigned long long)h0,
             (unsigned long long)h1);
  ir_print(g, &k);
  return k.data;
}

CpuProgram *cpu_compile(const Graph *g, const CpuTarget *ct, CompileTimes *times) {
  llvm_init();
  if (!g->plan) {
    error("cpu backend: the graph has no plan (run the pass pipeline first)");
    return NULL;
  }
  Target t;
  target_init(&t, ct);
  CpuProgram *p = NULL;
  char *key = NULL;
  void *obj = NULL;
  size_t objlen = 0;
  LLVMTargetMachineRef tm = make_tm(&t);
  if (!tm)
    goto out;
  LLVMContextRef c = LLVMContextCreate();
  LLVMModuleRef m = build(g, c, tm, &t, false, times);
  if (!m) {
    LLVMContextDispose(c);
    LLVMDisposeTargetMachine(tm);
    goto out;
  }
  key = cache_key(g, &t, m);
  bool use_cache = !(ct && ct->no_cache);
  bool hit = use_cache && cache_get("cpu", key, &obj, &objlen);
  if (times)
    times->cache_hit = hit;
  if (hit) {
    LLVMDisposeModule(m);
    LLVMContextDispose(c);
    LLVMDisposeTargetMachine(tm);
  } else {
    if (!optimize_module(m, tm, times)) {
      LLVMContextDispose(c);
      LLVMDisposeTargetMachine(tm);
      goto out;
    }
    double t0 = now_seconds();
    char *err = NULL;
    LLVMMemoryBufferRef mb;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &err, &mb)) {
      error("LLVM: object emission failed: %s", err);
      LLVMDisposeMessage(err);
      LLVMDisposeModule(m);
      LLVMContextDispose(c);
      LLVMDisposeTargetMachine(tm);
      goto out;
    }
    objlen = LLVMGetBufferSize(mb);
    obj = malloc(objlen + 1);
    ASSERT(obj);
    memcpy(obj, LLVMGetBufferStart(mb), objlen);
    LLVMDisposeMemoryBuffer(mb);
    LLVMDisposeModule(m);
    LLVMContextDispose(c);
    LLVMDisposeTargetMachine(tm);
    if (times)
      times->codegen += (now_seconds() - t0) * 1e3;
    if (use_cache)
      cache_put("cpu", key, obj, objlen);
    ncompiles++;
  }
  /* link */
  double t0 = now_seconds();
  p = calloc(1, sizeof(CpuProgram));
  ASSERT(p);
  p->nphases = g->plan->nphases;
  p->phase = calloc((size_t)p->nphases + 1, sizeof(PhaseFn));
  LLVMOrcLLJITBuilderRef jb = LLVMOrcCreateLLJITBuilder();
  if (llvm_failed(LLVMOrcCreateLLJIT(&p->jit, jb), "creating LLJIT"))
    goto fail;
  /* the kernels may call libm (pow, exp, log at element scope) */
  LLVMOrcDefinitionGeneratorRef gen;
  if (llvm_failed(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(p->jit), NULL,
                                                                        NULL),
                  "process symbols"))
    goto fail;
  LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(p->jit), gen);
  LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, objlen, "optc.o");
  if (llvm_failed(LLVMOrcLLJITAddObjectFile(p->jit, LLVMOrcLLJITGetMainJITDylib(p->jit), mb), "linking the object"))
    goto fail;
  for (int k = 0; k < p->nphases; k++) {
    char name[32];
    snprintf(name, sizeof name, "optc_phase%d", k);
    LLVMOrcExecutorAddress addr;
    if (llvm_failed(LLVMOrcLLJITLookup(p->jit, &addr, name), name))
      goto fail;
    p->phase[k] = (PhaseFn)(uintptr_t)addr;
  }
  if (times)
    times->link += (now_seconds() - t0) * 1e3;
  goto out;
fail:
  cpu_program_free(p);
  p = NULL;
out:
  free(obj);
  free(key);
  target_free(&t);
  return p;
}

PhaseFn cpu_program_phase(const CpuProgram *p, int k) { return k < p->nphases ? p->phase[k] : NULL; }

void cpu_program_free(CpuProgram *p) {
  if (!p)
    return;
  if (p->jit)
    llvm_failed(LLVMOrcDisposeLLJIT(p->jit), "disposing LLJIT");
  free(p->phase);
  free(p);
}

static int emit_text(const Graph *g, const CpuTarget *ct, bool optimize, bool assembly, Buf *out) {
  llvm_init();
  if (!g->plan) {
    error("cpu backend: the graph has no plan");
    return -1;
  }
  Target t;
  target_init(&t, ct);
  int rc = -1;
  LLVMTargetMachineRef tm = make_tm(&t);
  if (!tm)
    goto out;
  LLVMContextRef c = LLVMContextCreate();
  LLVMModuleRef m = build(g, c, tm, &t, optimize, NULL);
  if (m) {
    if (assembly) {
      char *err = NULL;
      LLVMMemoryBufferRef mb;
      if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMAssemblyFile, &err, &mb)) {
        error("LLVM: assembly emission failed: %s", err);
        LLVMDisposeMessage(err);
      } else {
        buf_put(out, LLVMGetBufferStart(mb), LLVMGetBufferSize(mb));
        LLVMDisposeMemoryBuffer(mb);
        rc = 0;
      }
    } else {
      char *s = LLVMPrintModuleToString(m);
      buf_puts(out, s);
      LLVMDisposeMessage(s);
      rc = 0;
    }
    LLVMDisposeModule(m);
  }
  LLVMContextDispose(c);
  LLVMDisposeTargetMachine(tm);
out:
  target_free(&t);
  return rc;
}

int cpu_emit_llvm(const Graph *g, const CpuTarget *t, bool optimized, Buf *out) {
  return emit_text(g, t, optimized, false, out);
}

int cpu_emit_asm(const Graph *g, const CpuTarget *t, Buf *out) { return emit_text(g, t, true, true, out); }
