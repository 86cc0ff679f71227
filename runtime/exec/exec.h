/* exec.h: the executors: what runs a planned step over a parameter group's
 * memory. The thread pool and the compiled CPU step (exec_cpu.c), the
 * compiled GPU step through the CUDA driver (exec_cuda.c), both in liboptc,
 * and torch eager's way, op by op (eager.c: built apart, vectorized for
 * this machine, and not in liboptc). The interpreter's step is plan.h's. */
#pragma once
#include "cpu.h"
#include "driver.h"
#include "gpu.h"
#include "plan.h"

typedef struct ThreadPool ThreadPool;

/* ---- exec_cpu.c: compiled steps on the CPU -------------------------------------------- */
/* n threads, the caller's included; n < 1: one per core available. */
ThreadPool *pool_create(int n);
int pool_size(const ThreadPool *p);
int pool_default_threads(void);
/* Calls fn on contiguous parts of [0, total), one per thread, and waits. */
void pool_run(ThreadPool *p, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx, int64_t total);
/* Whether no grad buffer of g holds an Inf or a NaN in layout l's chunks
 * (tbufs: the tensor table, layout_tensor_bufs), in a vector pass on pool
 * (NULL: this thread). The compiled and the eager executors' check. */
bool grads_all_finite(ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *tbufs);
void pool_free(ThreadPool *p);
/* One step of a planned graph: each phase over every chunk, the step values
 * and reductions folded between phases on the host. */
int cpu_step(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *bufs,
             const StepArgs *args, StepResult *res);
/* The same over a tensor table (layout_tensor_bufs): what the compiled
 * kernels address. */
int cpu_step_t(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *tbufs,
               const StepArgs *args, StepResult *res);
/* Whether g's first phase only sums over the grads (a norm pass: it
 * stores nothing and its reductions are all step-scope), with *width sums
 * a chunk. */
bool cpu_first_phase_reduces(const Graph *g, int *width);
/* That phase alone over l's chunks: their partials (l->nchunks x width),
 * what a later cpu_step_t takes as StepArgs.first_partials. */
int cpu_step_partials_t(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l,
                        void *const *tbufs, const double *inputs, double *partials);

/* ---- exec_cuda.c: running a program on a device --------------------------------------
 * Through compiler/cuda/driver.h's driver, dlopened on first use; device
 * 0's primary context (the one the CUDA runtime and PyTorch use) is made
 * current on the calling thread. */
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

/* ---- eager.c: torch eager's way of running a step ------------------------------------
 * The unoptimized graph, one op at a time over one tensor at a time, every
 * intermediate materialised. Same results as interp_step, bit for bit. */
int eager_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res);
/* The same, op-major with `foreach` (each op over every tensor, as torch's
 * _foreach_ ops), else tensor-major (torch's for-loop); with a pool, each
 * op over a large tensor is split across its threads, as torch's are. */
int eager_run(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res,
              bool foreach, ThreadPool *pool);
/* The same over a tensor table (layout_tensor_bufs). */
int eager_run_t(const Graph *g, const GroupLayout *l, void *const *tbufs, const StepArgs *args, StepResult *res,
                bool foreach, ThreadPool *pool);
/* Bytes per element that eager_step moves. */
double eager_traffic(const Graph *g);
