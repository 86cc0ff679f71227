/* driver.h: the CUDA driver API, opened with dlopen at run time and never
 * linked, for every part of optc that talks to a GPU: the GPU executor
 * (runtime/exec/exec_cuda.c), the NCCL collectives (runtime/dist/
 * coll_nccl.c) and NVRTC's choice of arch (the device's). An optc without
 * a driver or a device runs as before, and the GPU entry points say why in
 * one line. The driver is libcuda.so.1, or the library $OPTC_LIBCUDA names
 * (tests/cuda_emu.h builds a stand-in). Declared here, so that no cuda.h is
 * needed to build. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream; /* cudaStream_t, which NCCL takes */
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_NOT_READY = 600,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
  CU_STREAM_NON_BLOCKING = 1,
};

/* X(field, symbol, parameters): the versioned symbols are the ones cuda.h's
 * #defines pick (cuMemAlloc is cuMemAlloc_v2, ...). Every driver has these. */
#define CUDA_DRIVER_API(X) \
  X(Init, "cuInit", (unsigned flags)) \
  X(DriverGetVersion, "cuDriverGetVersion", (int *v)) \
  X(DeviceGetCount, "cuDeviceGetCount", (int *n)) \
  X(DeviceGet, "cuDeviceGet", (CUdevice *d, int ordinal)) \
  X(DeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice d)) \
  X(DeviceGetAttribute, "cuDeviceGetAttribute", (int *v, int attr, CUdevice d)) \
  X(DeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *bytes, CUdevice d)) \
  X(MemGetInfo, "cuMemGetInfo_v2", (size_t *free, size_t *total)) \
  X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *c, CUdevice d)) \
  X(CtxSetCurrent, "cuCtxSetCurrent", (CUcontext c)) \
  X(CtxSynchronize, "cuCtxSynchronize", (void)) \
  X(StreamSynchronize, "cuStreamSynchronize", (CUstream s)) \
  X(ModuleLoadDataEx, "cuModuleLoadDataEx", (CUmodule *m, const void *image, unsigned n, int *opts, void **vals)) \
  X(ModuleUnload, "cuModuleUnload", (CUmodule m)) \
  X(ModuleGetFunction, "cuModuleGetFunction", (CUfunction *f, CUmodule m, const char *name)) \
  X(MemAlloc, "cuMemAlloc_v2", (CUdeviceptr *p, size_t bytes)) \
  X(MemFree, "cuMemFree_v2", (CUdeviceptr p)) \
  X(MemAllocHost, "cuMemAllocHost_v2", (void **p, size_t bytes)) \
  X(MemFreeHost, "cuMemFreeHost", (void *p)) \
  X(MemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr dst, const void *src, size_t bytes)) \
  X(MemcpyDtoH, "cuMemcpyDtoH_v2", (void *dst, CUdeviceptr src, size_t bytes)) \
  X(MemcpyDtoD, "cuMemcpyDtoD_v2", (CUdeviceptr dst, CUdeviceptr src, size_t bytes)) \
  X(MemsetD8, "cuMemsetD8_v2", (CUdeviceptr p, unsigned char v, size_t n)) \
  X(LaunchKernel, "cuLaunchKernel", \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, \
     CUstream s, void **params, void **extra)) \
  X(EventCreate, "cuEventCreate", (CUevent *e, unsigned flags)) \
  X(EventRecord, "cuEventRecord", (CUevent e, CUstream s)) \
  X(EventSynchronize, "cuEventSynchronize", (CUevent e)) \
  X(EventDestroy, "cuEventDestroy_v2", (CUevent e)) \
  X(GetErrorName, "cuGetErrorName", (CUresult r, const char **s)) \
  X(GetErrorString, "cuGetErrorString", (CUresult r, const char **s))

/* ... and what the NCCL collectives use besides: NULL where a driver (such
 * as the tests' stand-in) lacks one; coll_nccl.c checks. */
#define CUDA_DRIVER_API_COLL(X) \
  X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice d)) \
  X(StreamCreate, "cuStreamCreate", (CUstream *s, unsigned flags)) \
  X(StreamDestroy, "cuStreamDestroy_v2", (CUstream s)) \
  X(StreamQuery, "cuStreamQuery", (CUstream s)) \
  X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s)) \
  X(ModuleLoadData, "cuModuleLoadData", (CUmodule *m, const void *image))

typedef struct {
#define CUDA_DRIVER_FIELD(f, sym, params) CUresult (*f) params;
  CUDA_DRIVER_API(CUDA_DRIVER_FIELD)
  CUDA_DRIVER_API_COLL(CUDA_DRIVER_FIELD)
#undef CUDA_DRIVER_FIELD
  CUresult (*EventElapsedTime)(float *ms, CUevent a, CUevent b); /* _v2 since 12.8, the plain one before */
  void *lib;
  CUdevice dev;  /* device 0, once cuda_device0 has made its context */
  CUcontext ctx; /* its primary context */
  bool ok;       /* device 0 and its context are there */
} CudaDriver;

/* ---- driver.c --------------------------------------------------------------------------- */
/* The driver's entry points; filled by cuda_driver_load. */
extern CudaDriver cudrv;

/* Opens the driver and reads its entry points, once per process. false
 * with the reason in why (one line: no driver, or one without a symbol). */
bool cuda_driver_load(char *why, size_t n);
/* The driver, with device 0's primary context (the one the CUDA runtime
 * and PyTorch use) current on the calling thread; false, the reason
 * printed, when there is no driver or no device. */
bool cuda_device0(void);
/* Whether a driver and a device are there; why not, in one line, in why. */
bool cuda_device_available(char *why, size_t n);
/* The arch of device 0, e.g. sm_90; false (why set) when there is none. */
bool cuda_device_arch(char *arch, size_t n, char *why, size_t whyn);
/* One line: the device's name, arch, memory and driver version. */
bool cuda_device_describe(char *out, size_t n);
/* Device 0's free and total memory, in bytes. */
bool cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Every driver call: on failure, file:line, the call, and the driver's
 * name and text for the error; evaluates to whether it succeeded. */
#define CU_CHECK(call) cu_check((call), #call, __FILE__, __LINE__)
bool cu_check(CUresult r, const char *call, const char *file, int line);
/* The driver's text for an error, never NULL. */
const char *cu_errstr(CUresult r);
