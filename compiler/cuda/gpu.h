/* gpu.h: the GPU backend. The phase plan becomes CUDA C (emit_cuda.c), and
 * NVRTC compiles it into a cubin, or PTX where it cannot make a cubin for
 * the arch (nvrtc.c). The CUDA driver API, opened with dlopen at run time
 * (driver.h), runs it over a parameter group held in device memory
 * (runtime/exec/exec_cuda.c). Nothing here links against libcuda: an optc
 * built with NVRTC runs everywhere, and says so in one line where there is
 * no driver or no device.
 *
 * The kernels keep the CPU backend's contract (codegen.h's PhaseFn): phase
 * k is `optc_phaseK(chunks, nchunks, bufs, step, tvals, partials)` over
 * every chunk (one block per chunk, or per 16 chunks in a phase with
 * reductions: CudaKernel.cpb), and chunk c's partial of the phase's i-th
 * reduction goes to partials[c * nred + i]. The host folds the partials in
 * chunk order, exactly as exec_cpu.c does, so every backend gives the
 * interpreter's bits. */
#pragma once
#include "codegen.h"

/* ---- emit_cuda.c: the plan as CUDA C ------------------------------------------------ */
typedef struct {
  const char *arch;  /* sm_90, sm_80, ... or compute_90 for PTX only; NULL: the visible
                        device's arch, else sm_90 */
  int threads;       /* threads per block of an element-wise phase; 0: 128 */
  int red_threads;   /* ... of a phase with reductions, 8 / red_lanes per chunk; 0: 128 */
  int red_lanes;     /* lanes of its chunk each thread of a phase with reductions takes, in
                        one load of as many elements: 1, 2, 4 or 8; 0: 1 */
  int min_blocks;    /* blocks per SM an element-wise kernel is compiled for (its
                        register budget, __launch_bounds__); 0: 1, no bound
                        beyond the block size (8 made larger optimizers spill) */
  bool no_cache;     /* also off when OPTC_CACHE=0 */
} CudaTarget;

enum { CUDA_VEC = 8 }; /* elements per thread per step: one 16-byte vector of bf16, two of f32 */

/* What the executor needs to launch one kernel of a program. */
typedef struct {
  char name[32];    /* optc_phaseK, or optc_nonfinite */
  int threads;      /* threads per block; the grid is one block per cpb chunks */
  int smem;         /* static shared memory, bytes */
  int nred;         /* partials per chunk (1 for optc_nonfinite) */
  int cpb;          /* chunks per block: 1, or threads * red_lanes / 8 in a phase with reductions */
  /* from ptxas -v (nvrtc.c); -1 where unknown (PTX only, or not compiled) */
  int regs, spill_stores, spill_loads, stack;
} CudaKernel;

/* The CUDA C of a planned graph: numerics.h pasted in, one kernel per
 * phase, then optc_nonfinite (the grad check for grads_finite < 0). The
 * kernels' launch facts go to kernels[0 .. nphases] when it is not NULL.
 * 0, or -1 with an error printed. */
int cuda_emit(const Graph *g, const CudaTarget *t, Buf *out, CudaKernel *kernels);
/* The text of numerics.h, embedded at build time (numerics_h.c). */
extern const char optc_numerics_h[];

/* ---- nvrtc.c: CUDA C -> PTX -> cubin ------------------------------------------------- */
typedef struct CudaProgram {
  char arch[24];         /* what NVRTC compiled for: sm_90, or compute_90 for PTX only */
  char *source;          /* the CUDA C, NUL-terminated */
  char *ptx;             /* NUL-terminated; NULL on a cache hit made without it */
  size_t ptx_len;
  void *cubin;           /* NULL when PTX is all there is (the driver JIT-compiles it) */
  size_t cubin_len;
  char *log;             /* NVRTC's log: ptxas's register, spill and stack lines */
  int nkernels;          /* nphases + 1 */
  CudaKernel *kernels;
  int nvrtc_major, nvrtc_minor;
  CompileTimes times;
} CudaProgram;

/* NVRTC is opened with dlopen when the CUDA backend first needs it, never
 * linked: the CPU path never touches it, and liboptc loads where there is
 * none. Its C API is declared here, the calls optc makes, so that no
 * toolkit is needed to build. Looked for, in order:
 *   $OPTC_NVRTC, a path to the library: that one alone;
 *   the directories nvrtc_search_dirs was given (optc.torch gives the lib
 *     folders of torch's NVIDIA wheels in its environment);
 *   $CUDA_HOME/lib64, /usr/local/cuda/lib64;
 *   the loader's own path (LD_LIBRARY_PATH, ldconfig's cache);
 * in each place libnvrtc.so.13, then libnvrtc.so.12. */
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
enum { NVRTC_SUCCESS = 0 };

/* X(field, symbol, return type, parameters) */
#define NVRTC_API(X) \
  X(GetErrorString, "nvrtcGetErrorString", const char *, (nvrtcResult r)) \
  X(Version, "nvrtcVersion", nvrtcResult, (int *major, int *minor)) \
  X(GetNumSupportedArchs, "nvrtcGetNumSupportedArchs", nvrtcResult, (int *n)) \
  X(GetSupportedArchs, "nvrtcGetSupportedArchs", nvrtcResult, (int *archs)) \
  X(CreateProgram, "nvrtcCreateProgram", nvrtcResult, \
    (nvrtcProgram *p, const char *src, const char *name, int nheaders, const char *const *headers, \
     const char *const *include_names)) \
  X(DestroyProgram, "nvrtcDestroyProgram", nvrtcResult, (nvrtcProgram *p)) \
  X(CompileProgram, "nvrtcCompileProgram", nvrtcResult, (nvrtcProgram p, int n, const char *const *options)) \
  X(GetPTXSize, "nvrtcGetPTXSize", nvrtcResult, (nvrtcProgram p, size_t *n)) \
  X(GetPTX, "nvrtcGetPTX", nvrtcResult, (nvrtcProgram p, char *ptx)) \
  X(GetCUBINSize, "nvrtcGetCUBINSize", nvrtcResult, (nvrtcProgram p, size_t *n)) \
  X(GetCUBIN, "nvrtcGetCUBIN", nvrtcResult, (nvrtcProgram p, char *cubin)) \
  X(GetProgramLogSize, "nvrtcGetProgramLogSize", nvrtcResult, (nvrtcProgram p, size_t *n)) \
  X(GetProgramLog, "nvrtcGetProgramLog", nvrtcResult, (nvrtcProgram p, char *log))

typedef struct {
#define NVRTC_FIELD(f, sym, ret, params) ret(*f) params;
  NVRTC_API(NVRTC_FIELD)
#undef NVRTC_FIELD
} CudaNvrtc;

/* NVRTC's entry points; filled by nvrtc_load. */
extern CudaNvrtc nvrtc;
/* Finds and opens NVRTC, once per process: false, with why it is not
 * there in one line, when it is not found (or this optc was built with
 * -Dcuda=disabled). */
bool nvrtc_load(char *why, size_t n);
/* Directories (':'-separated) to look in before $CUDA_HOME and the
 * system; false (nothing changed) once NVRTC has been looked for. */
bool nvrtc_search_dirs(const char *dirs);
/* Whether NVRTC is there (nvrtc_load): in why, "NVRTC 13.0 (its path)",
 * or why not. */
bool cuda_nvrtc_available(char *why, size_t n);
/* Compiles every phase of a planned graph. The cubin is cached on disk
 * (kind "cuda"), keyed by the source, the arch, NVRTC's version and optc's.
 * NULL (error printed, with NVRTC's log and the numbered source when the
 * compile fails) on failure. The caller frees with cuda_program_free. */
CudaProgram *cuda_compile(const Graph *g, const CudaTarget *t, CompileTimes *times);
void cuda_program_free(CudaProgram *p);
/* How many times cuda_compile ran NVRTC (cache hits not counted). */
int cuda_compile_count(void);
/* The program's kernels, one line each: registers, spills, stack, block
 * size, shared memory. */
void cuda_program_report(const CudaProgram *p, Buf *out);
/* The newest arch NVRTC compiles for at or below want (90 for sm_90): a
 * cubin of want when it is want itself, else PTX of it, which the driver
 * compiles. 0 when there is none; -1 (error printed) when NVRTC fails or
 * this build has none. The GPU backend's choice and the NCCL collectives'. */
int nvrtc_newest_arch(int want);
/* For optc compile --target cuda --emit=cuda|ptx|cubin: the bytes to write. */
int cuda_emit_source(const Graph *g, const CudaTarget *t, Buf *out);
int cuda_emit_ptx(const Graph *g, const CudaTarget *t, Buf *out);
int cuda_emit_cubin(const Graph *g, const CudaTarget *t, Buf *out);
