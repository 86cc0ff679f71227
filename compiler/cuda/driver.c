/* driver.c: the CUDA driver API, dlopened (driver.h), and device 0.
 *
 * The entry points are read once per process; device 0's primary context
 * is retained once, and made current on the calling thread by each entry
 * point that needs it (cuda_device0), since the caller's threads (PyTorch's,
 * a training loop's) may be any. */
#include "driver.h"

#include "base.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

CudaDriver cudrv;

static struct {
  pthread_once_t load_once, dev_once;
  bool loaded, dev_ok;
  char load_why[256]; /* why the driver did not load */
  char dev_why[256];  /* why there is no device 0, when there is none */
} st = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void load_symbols(void) {
  const char *path = getenv("OPTC_LIBCUDA");
  if (!path || !*path)
    path = "libcuda.so.1";
  cudrv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!cudrv.lib) {
    snprintf(st.load_why, sizeof st.load_why, "no CUDA driver: cannot open %s (%s)", path, dlerror());
    return;
  }
#define LOAD(f, sym, params) \
  if (!(*(void **)&cudrv.f = dlsym(cudrv.lib, sym))) { \
    snprintf(st.load_why, sizeof st.load_why, "the CUDA driver %s has no %s", path, sym); \
    return; \
  }
  CUDA_DRIVER_API(LOAD)
#undef LOAD
#define LOAD_IF_THERE(f, sym, params) *(void **)&cudrv.f = dlsym(cudrv.lib, sym);
  CUDA_DRIVER_API_COLL(LOAD_IF_THERE)
#undef LOAD_IF_THERE
  *(void **)&cudrv.EventElapsedTime = dlsym(cudrv.lib, "cuEventElapsedTime_v2");
  if (!cudrv.EventElapsedTime)
    *(void **)&cudrv.EventElapsedTime = dlsym(cudrv.lib, "cuEventElapsedTime");
  st.loaded = true;
}

bool cuda_driver_load(char *why, size_t n) {
  pthread_once(&st.load_once, load_symbols);
  if (!st.loaded && why && n)
    snprintf(why, n, "%s", st.load_why);
  return st.loaded;
}

static void open_device0(void) {
  if (!cuda_driver_load(st.dev_why, sizeof st.dev_why))
    return;
  const char *name = NULL, *str = NULL;
  CUresult r = cudrv.Init(0);
  int n = 0;
  if (r == CUDA_SUCCESS)
    r = cudrv.DeviceGetCount(&n);
  if (r != CUDA_SUCCESS) {
    cudrv.GetErrorName(r, &name);
    cudrv.GetErrorString(r, &str);
    snprintf(st.dev_why, sizeof st.dev_why, "no CUDA device: cuInit: %s (%s)", name ? name : "?", str ? str : "?");
    return;
  }
  if (n == 0) {
    snprintf(st.dev_why, sizeof st.dev_why, "no CUDA device visible (the driver counts 0)");
    return;
  }
  r = cudrv.DeviceGet(&cudrv.dev, 0);
  if (r == CUDA_SUCCESS)
    r = cudrv.DevicePrimaryCtxRetain(&cudrv.ctx, cudrv.dev);
  if (r != CUDA_SUCCESS) {
    cudrv.GetErrorName(r, &name);
    snprintf(st.dev_why, sizeof st.dev_why, "CUDA device 0 has no context: %s", name ? name : "?");
    return;
  }
  st.dev_ok = cudrv.ok = true;
}

bool cuda_device0(void) {
  pthread_once(&st.dev_once, open_device0);
  if (!st.dev_ok) {
    error("%s", st.dev_why);
    return false;
  }
  return cudrv.CtxSetCurrent(cudrv.ctx) == CUDA_SUCCESS;
}

bool cu_check(CUresult r, const char *call, const char *file, int line) {
  if (r == CUDA_SUCCESS)
    return true;
  const char *name = NULL, *str = NULL;
  cudrv.GetErrorName(r, &name);
  cudrv.GetErrorString(r, &str);
  diag_printf("%s:%d: CUDA error %d %s: %s: %s\n", file, line, r, name ? name : "?", str ? str : "?", call);
  return false;
}

const char *cu_errstr(CUresult r) {
  const char *s = NULL;
  if (!cudrv.GetErrorString || cudrv.GetErrorString(r, &s) != CUDA_SUCCESS || !s)
    s = "unknown CUDA error";
  return s;
}

bool cuda_device_available(char *why, size_t n) {
  pthread_once(&st.dev_once, open_device0);
  if (why && n)
    snprintf(why, n, "%s", st.dev_ok ? "a CUDA device is visible" : st.dev_why);
  return st.dev_ok;
}

bool cuda_device_arch(char *arch, size_t n, char *why, size_t whyn) {
  if (!cuda_device_available(why, whyn))
    return false;
  int major = 0, minor = 0;
  if (cudrv.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cudrv.dev) != CUDA_SUCCESS ||
      cudrv.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cudrv.dev) != CUDA_SUCCESS) {
    snprintf(why, whyn, "cannot read device 0's compute capability");
    return false;
  }
  snprintf(arch, n, "sm_%d%d", major, minor);
  return true;
}

bool cuda_device_describe(char *out, size_t n) {
  char why[256], arch[16];
  if (!cuda_device_arch(arch, sizeof arch, why, sizeof why)) {
    snprintf(out, n, "%s", why);
    return false;
  }
  char name[128] = "?";
  size_t mem = 0;
  int version = 0, sms = 0;
  cudrv.DeviceGetName(name, sizeof name, cudrv.dev);
  cudrv.DeviceTotalMem(&mem, cudrv.dev);
  cudrv.DriverGetVersion(&version);
  cudrv.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cudrv.dev);
  snprintf(out, n, "%s (%s, %d SMs, %.1f GiB), driver %d.%d", name, arch, sms, (double)mem / (1 << 30),
           version / 1000, version % 1000 / 10);
  return true;
}

bool cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
  return cuda_device0() && CU_CHECK(cudrv.MemGetInfo(free_bytes, total_bytes));
}
