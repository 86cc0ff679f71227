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

/* Whether this optc was built with NVRTC (meson -Dcuda); why not in why. */
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
