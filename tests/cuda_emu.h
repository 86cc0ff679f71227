/* cuda_emu.h: enough CUDA for the host C++ compiler to build and run the
 * exact .cu text that compiler/cuda/emit_cuda.c writes, so that the GPU
 * backend's kernels, and the executor that drives them, are checked on a
 * machine with no GPU (tests/test_cuda_emu.c).
 *
 * Two uses:
 *   c++ -std=c++17 -shared -fPIC -include cuda_emu.h step.cu -o step.so
 *       a kernel module: the kernels, and optc_emu_run, which runs one
 *       launch of one of them;
 *   c++ -std=c++17 -shared -fPIC -DOPTC_EMU_DRIVER -x c++ cuda_emu.h -o libcuda_emu.so
 *       a stand-in for libcuda.so.1 (runtime/exec/exec_cuda.c opens it when
 *       OPTC_LIBCUDA names it): device memory is host memory, a "module
 *       image" is the path of a kernel module, which cuModuleLoadDataEx
 *       dlopens, and cuLaunchKernel calls its optc_emu_run.
 *
 * How a launch runs: the blocks one after another; within a block, every
 * thread is a fiber (ucontext) with its own stack, and the fibers run one
 * at a time, each until it reaches __syncthreads() or returns. When every
 * thread that has not returned waits at the barrier, all go on. The order
 * in which the fibers run alternates between rounds (0..n-1, then n-1..0),
 * so a kernel that reads shared memory that another thread writes without
 * a barrier between them reads stale data in one of the two orders.
 * __shared__ variables are function statics: one block runs at a time, so
 * they are the block's. threadIdx, blockIdx, blockDim and gridDim are
 * globals, set before each fiber resumes.
 *
 * What the emulation cannot show:
 * - timing, occupancy, coalescing, bank conflicts, register pressure and
 *   spills (test_nvrtc checks spills with ptxas; bench/gpu_check.sh times);
 * - races between threads that really run at once: warps interleave here
 *   only at barriers, so a race inside a barrier interval (two threads
 *   writing one word, a read-modify-write) always comes out the same way;
 *   warp-synchronous code (shuffles, __syncwarp, atomics) is not emulated;
 * - the device's own arithmetic: powf, expf and logf here are glibc's (the
 *   device's differ by an ulp or two), and sqrtf and / are the host's IEEE
 *   ops, which NVRTC's --prec-sqrt=true --prec-div=true match but which
 *   the emulation cannot prove;
 * - the CUDA compiler itself (NVRTC's front end, ptxas): test_nvrtc
 *   compiles the same text for sm_80 and sm_90;
 * - the driver: memory is malloc'd, copies are memcpy, launches are
 *   synchronous, and errors the real driver would raise (bad launch
 *   sizes, out-of-range addresses, misaligned vector accesses) are not
 *   raised here: a misaligned float4 load just works on x86.
 *
 * Kernels are called through one function type (emit_cuda.c gives every
 * kernel the same parameters), cast from the dlsym'd symbol. */
#ifndef OPTC_CUDA_EMU_H
#define OPTC_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++: compile with c++ -std=c++17"
#endif

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

/* ---- the language -------------------------------------------------------------------- */

/* CUDA's math functions are glibc's here. Declared rather than taken from
 * <math.h>, whose C++ form (all of <cmath>) would be most of each
 * module's compile time. */
extern "C" {
float sqrtf(float) noexcept;
double sqrt(double) noexcept;
float fabsf(float) noexcept;
double fabs(double) noexcept;
float fmaf(float, float, float) noexcept;
double fma(double, double, double) noexcept;
float powf(float, float) noexcept;
double pow(double, double) noexcept;
float expf(float) noexcept;
double exp(double) noexcept;
float logf(float) noexcept;
double log(double) noexcept;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static

struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) double2 {
  double x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline double2 make_double2(double x, double y) { return double2{x, y}; }

static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* PTX's cvt.rn.bf16x2.f32 d, hi, lo, which emit_cuda.c's optc_cvt_bf16x2
 * is on sm_80 and later: each float rounded to nearest even (subnormals
 * kept, no .ftz; overflow to infinity), hi into the high half of d. A NaN
 * gives the canonical NaN 0x7fff, as the hardware does, so that a kernel
 * that kept it, instead of selecting numerics.h's 0x7fc0 | sign, would
 * differ from the interpreter here too. */
static inline uint32_t optc_emu_cvt_rn_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return 0x7fffu;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
static inline uint32_t optc_cvt_bf16x2(float hi, float lo) {
  return optc_emu_cvt_rn_bf16(hi) << 16 | optc_emu_cvt_rn_bf16(lo);
}

#ifndef OPTC_EMU_DRIVER
static uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace optc_emu {

enum { STACK_BYTES = 256 * 1024, RUNNABLE = 0, WAITING = 1, DONE = 2 };

typedef void (*Kernel)(const void *chunks, long long nchunks, void *const *bufs, const void *step,
                       const void *tvals, double *partials);

struct Fiber {
  ucontext_t ctx;
  char *stack;
  int state;
};

static Fiber *fibers;
static unsigned nfibers;
static ucontext_t scheduler;
static unsigned current;
static Kernel kernel;
static void **params;

static void fiber_main() {
  unsigned me = current;
  kernel(*(const void **)params[0], *(long long *)params[1], *(void *const **)params[2],
         *(const void **)params[3], *(const void **)params[4], *(double **)params[5]);
  fibers[me].state = DONE; /* uc_link returns to the scheduler */
}

static void barrier() {
  Fiber *f = &fibers[current];
  f->state = WAITING;
  swapcontext(&f->ctx, &scheduler);
}

/* A fresh fiber that will run the kernel from its start. (Apart from
 * run_block: getcontext returns twice, which -Wclobbered dislikes in a
 * loop.) */
__attribute__((noinline)) static int start_fiber(Fiber *f) {
  if (!f->stack || getcontext(&f->ctx) != 0)
    return -1;
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = STACK_BYTES;
  f->ctx.uc_link = &scheduler;
  makecontext(&f->ctx, fiber_main, 0);
  f->state = RUNNABLE;
  return 0;
}

/* One block: every thread a fiber, run until all have returned. */
static int run_block(unsigned threads) {
  if (threads > nfibers) {
    fibers = (Fiber *)realloc(fibers, sizeof(Fiber) * threads);
    for (unsigned t = nfibers; t < threads; t++)
      fibers[t].stack = (char *)malloc(STACK_BYTES);
    nfibers = threads;
  }
  for (unsigned t = 0; t < threads; t++)
    if (start_fiber(&fibers[t]) != 0)
      return -1;
  for (unsigned round = 0;; round++) {
    for (unsigned k = 0; k < threads; k++) {
      unsigned t = round % 2 ? threads - 1 - k : k;
      if (fibers[t].state != RUNNABLE)
        continue;
      current = t;
      threadIdx = uint3{t, 0, 0};
      swapcontext(&scheduler, &fibers[t].ctx);
    }
    bool waiting = false;
    for (unsigned t = 0; t < threads; t++)
      if (fibers[t].state == WAITING)
        fibers[t].state = RUNNABLE, waiting = true;
    if (!waiting)
      return 0;
  }
}

/* The fibers go when the module is unloaded (cuModuleUnload's dlclose). */
__attribute__((destructor)) static void free_fibers() {
  for (unsigned t = 0; t < nfibers; t++)
    free(fibers[t].stack);
  free(fibers);
  fibers = NULL;
  nfibers = 0;
}

} // namespace optc_emu

static inline void __syncthreads() { optc_emu::barrier(); }

/* One launch: grid blocks of `block` threads, one after another. params
 * as cuLaunchKernel takes them: a pointer to each argument. */
extern "C" int optc_emu_run(void *kernel, unsigned grid, unsigned block, void **params) {
  optc_emu::kernel = (optc_emu::Kernel)kernel;
  optc_emu::params = params;
  gridDim = uint3{grid, 1, 1};
  blockDim = uint3{block, 1, 1};
  for (unsigned b = 0; b < grid; b++) {
    blockIdx = uint3{b, 0, 0};
    if (optc_emu::run_block(block) != 0)
      return -1;
  }
  return 0;
}

#endif /* !OPTC_EMU_DRIVER */

/* numerics.h's device path (__float_as_uint, __device__ functions) is what
 * NVRTC compiles; take the same path here. */
#define __CUDACC__ 1

/* ---- the driver stand-in ----------------------------------------------------------------- */
#ifdef OPTC_EMU_DRIVER

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { EMU_ERROR_INVALID_IMAGE = 200, EMU_ERROR_NOT_FOUND = 500, EMU_ERROR_LAUNCH_FAILED = 719 };

struct EmuFunction {
  void *sym;
  int (*run)(void *, unsigned, unsigned, void **);
  EmuFunction *next;
};
struct EmuModule {
  void *dl;
  EmuFunction *fns;
};

extern "C" {
CUresult cuInit(unsigned) { return 0; }
CUresult cuDriverGetVersion(int *v) { return *v = 13000, 0; }
CUresult cuDeviceGetCount(int *n) { return *n = 1, 0; }
CUresult cuDeviceGet(int *d, int) { return *d = 0, 0; }
CUresult cuDeviceGetName(char *name, int len, int) { return snprintf(name, (size_t)len, "optc host emulation"), 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int) {
  *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 1 : 0; /* sm_90, one "SM" */
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int) { return *bytes = (size_t)1 << 30, 0; }
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) { return *free_bytes = *total = (size_t)1 << 30, 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int) {
  static int context;
  return *c = &context, 0;
}
CUresult cuCtxSetCurrent(void *) { return 0; }
CUresult cuCtxSynchronize() { return 0; }
CUresult cuStreamSynchronize(void *) { return 0; }

CUresult cuModuleLoadDataEx(EmuModule **m, const void *image, unsigned, int *, void **) {
  void *dl = dlopen((const char *)image, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    fprintf(stderr, "cuda_emu: %s\n", dlerror());
    return EMU_ERROR_INVALID_IMAGE;
  }
  *m = (EmuModule *)calloc(1, sizeof(EmuModule));
  (*m)->dl = dl;
  return 0;
}
CUresult cuModuleUnload(EmuModule *m) {
  while (m->fns) {
    EmuFunction *f = m->fns;
    m->fns = f->next;
    free(f);
  }
  dlclose(m->dl);
  free(m);
  return 0;
}
CUresult cuModuleGetFunction(EmuFunction **f, EmuModule *m, const char *name) {
  void *sym = dlsym(m->dl, name), *run = dlsym(m->dl, "optc_emu_run");
  if (!sym || !run)
    return EMU_ERROR_NOT_FOUND;
  EmuFunction *fn = (EmuFunction *)calloc(1, sizeof(EmuFunction));
  fn->sym = sym;
  fn->run = (int (*)(void *, unsigned, unsigned, void **))run;
  fn->next = m->fns;
  m->fns = fn;
  *f = fn;
  return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  void *q = aligned_alloc(256, (bytes + 255) / 256 * 256);
  *p = (CUdeviceptr)(uintptr_t)q;
  return q ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}
CUresult cuMemFree_v2(CUdeviceptr p) { return free((void *)(uintptr_t)p), 0; }
CUresult cuMemAllocHost_v2(void **p, size_t bytes) { return (*p = malloc(bytes ? bytes : 1)) ? 0 : 2; }
CUresult cuMemFreeHost(void *p) { return free(p), 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  return memcpy((void *)(uintptr_t)dst, src, n), 0;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return memcpy(dst, (void *)(uintptr_t)src, n), 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n), 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { return memset((void *)(uintptr_t)p, v, n), 0; }

CUresult cuLaunchKernel(EmuFunction *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned, void *, void **kparams, void **) {
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || bx == 0 || bx > 1024 || gx == 0)
    return 1; /* CUDA_ERROR_INVALID_VALUE */
  return f->run(f->sym, gx, bx, kparams) == 0 ? 0 : EMU_ERROR_LAUNCH_FAILED;
}

CUresult cuEventCreate(double **e, unsigned) { return (*e = (double *)calloc(1, sizeof(double))) ? 0 : 2; }
CUresult cuEventRecord(double *e, void *) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *e = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
  return 0;
}
CUresult cuEventSynchronize(double *) { return 0; }
CUresult cuEventElapsedTime_v2(float *ms, double *a, double *b) { return *ms = (float)(*b - *a), 0; }
CUresult cuEventDestroy_v2(double *e) { return free(e), 0; }

CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == EMU_ERROR_INVALID_IMAGE ? "CUDA_ERROR_INVALID_IMAGE"
       : r == EMU_ERROR_NOT_FOUND   ? "CUDA_ERROR_NOT_FOUND"
                                    : "CUDA_ERROR_EMULATED";
  return 0;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == EMU_ERROR_INVALID_IMAGE ? "the module could not be loaded (cuda_emu: dlopen failed)"
                                    : "an error of the emulated driver";
  return 0;
}
} /* extern "C" */

#endif /* OPTC_EMU_DRIVER */
#endif /* OPTC_CUDA_EMU_H */
