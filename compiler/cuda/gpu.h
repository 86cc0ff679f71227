/* cuda.h: the GPU backend. The phase plan becomes CUDA C (emit_cuda.c),
 * NVRTC compiles it into a cubin, or PTX where it cannot make a cubin for
 * the arch (nvrtc.c), and the CUDA driver API, opened with dlopen at run
 * time, runs it over a parameter group held in device memory
 * (exec_cuda.c). Nothing here links against libcuda: an optc built with
 * NVRTC runs everywhere, and says so in one line where there is no driver
 * or no device.
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
#include "driver.h"

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

/* ---- exec_cuda.c: running a program on a device --------------------------------------
 * The driver is libcuda.so.1 (or $OPTC_LIBCUDA), opened with dlopen on first
 * use; device 0's primary context (the one the CUDA runtime and PyTorch
 * use) is made current on the calling thread. */
typedef uint64_t CudaPtr; /* a device address (CUdeviceptr) */
typedef struct CudaExec CudaExec;

/* An executor for program p over graph g's group laid out as l (both must
 * outlive it): it loads the module and uploads the chunk table. Its flat
 * buffers (one per graph buffer, l->total elements, zeroed) are allocated
 * when first needed, unless cuda_exec_bind gives it the caller's. NULL
 * with the reason in err on failure. cuda_exec_free frees all of it. */
CudaExec *cuda_exec_create(const CudaProgram *p, const Graph *g, const GroupLayout *l, char *err, size_t errn);
/* Host flat buffers (l->total elements each, in g's buffer order) to the
 * device and back. 0, or -1 with an error printed. */
int cuda_exec_upload(CudaExec *x, void *const *bufs);
int cuda_exec_download(CudaExec *x, void *const *bufs);
/* Runs on the caller's device buffers instead of its own (PyTorch tensors'
 * data_ptr(), or base addresses moved back for an index test): bufs[b] is
 * the flat buffer of graph buffer b, and stays the caller's to free. The
 * executor's own buffers are freed. */
int cuda_exec_bind(CudaExec *x, const CudaPtr *bufs);
/* Runs on the caller's tensors, each its own allocation: table[t * nbufs +
 * b] is tensor t's element 0 of graph buffer b (layout_tensor_bufs' order).
 * The executor's own buffers are freed. */
int cuda_exec_bind_tensors(CudaExec *x, const CudaPtr *table);
/* Launches go on this CUstream (NULL: the default stream), and a step
 * waits for it before it reads reductions back and before it returns. */
void cuda_exec_set_stream(CudaExec *x, void *stream);
CudaPtr cuda_exec_buffer(CudaExec *x, int b); /* 0 (error printed) if none */
/* One step, as cpu_step: the step values computed on the host with the
 * interpreter's arithmetic, one launch per phase over every chunk, the
 * partials folded on the host in chunk order. Returns after the device is
 * done. 0, or -1 with an error printed. */
int cuda_step(CudaExec *x, const StepArgs *args, StepResult *res);
/* With profiling on, each launch is timed with events; the sum of the last
 * step's kernels is cuda_exec_kernel_ms. */
void cuda_exec_profile(CudaExec *x, bool on);
double cuda_exec_kernel_ms(const CudaExec *x);
/* ... and of kernel k alone (phase k, or nphases: optc_nonfinite); 0 if it did not run */
double cuda_exec_phase_ms(const CudaExec *x, int k);
void cuda_exec_free(CudaExec *x);

/* Device memory for tests and benchmarks. 0 (error printed) on failure. */
CudaPtr cuda_malloc(size_t bytes);
void cuda_free(CudaPtr p);
int cuda_memcpy_htod(CudaPtr dst, const void *src, size_t bytes);
int cuda_memcpy_dtoh(void *dst, CudaPtr src, size_t bytes);
/* Milliseconds for reps device-to-device copies of bytes (cuMemcpyDtoD,
 * event-timed): the bandwidth ceiling a streaming kernel can reach. */
double cuda_copy_ms(CudaPtr dst, CudaPtr src, size_t bytes, int reps);
