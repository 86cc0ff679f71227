/* exec_cuda.c: runs a compiled step on a GPU through the CUDA driver API.
 *
 * The driver is compiler/cuda/driver.c's, dlopened: an optc without a driver
 * or a device runs as before, and the GPU entry points say why in one line.
 * Device 0's primary context, the one the CUDA runtime (and so PyTorch)
 * uses, is made current on the calling thread by every entry point.
 *
 * A step is cpu_step's, launch for call: the host evaluates each ^stepK
 * segment with the interpreter's arithmetic and uploads the step values,
 * one launch per phase runs every chunk (cpb chunks per block), and the
 * chunk partials come back and are folded on the host in chunk order, so
 * the reductions have the interpreter's bits. A step-scope reduction that
 * is not finite skips the rest of the step, as does grads_finite == 0
 * (with grads_finite < 0, the optc_nonfinite kernel finds out first). */
#include "exec.h"

#include <math.h>
#include <string.h>

/* ---- device memory ----------------------------------------------------------------------- */

CudaPtr cuda_malloc(size_t bytes) {
  CUdeviceptr p = 0;
  if (!cuda_device0() || !CU_CHECK(cudrv.MemAlloc(&p, bytes ? bytes : 1)))
    return 0;
  return p;
}

void cuda_free(CudaPtr p) {
  if (p && cuda_device0())
    CU_CHECK(cudrv.MemFree(p));
}

int cuda_memcpy_htod(CudaPtr dst, const void *src, size_t bytes) {
  return cuda_device0() && (bytes == 0 || CU_CHECK(cudrv.MemcpyHtoD(dst, src, bytes))) ? 0 : -1;
}

int cuda_memcpy_dtoh(void *dst, CudaPtr src, size_t bytes) {
  return cuda_device0() && (bytes == 0 || CU_CHECK(cudrv.MemcpyDtoH(dst, src, bytes))) ? 0 : -1;
}

double cuda_copy_ms(CudaPtr dst, CudaPtr src, size_t bytes, int reps) {
  if (!cuda_device0() || !cudrv.EventElapsedTime)
    return -1;
  CUevent a, b;
  if (!CU_CHECK(cudrv.EventCreate(&a, 0)) || !CU_CHECK(cudrv.EventCreate(&b, 0)))
    return -1;
  float ms = -1;
  bool ok = CU_CHECK(cudrv.MemcpyDtoD(dst, src, bytes)) && CU_CHECK(cudrv.EventRecord(a, NULL));
  for (int i = 0; ok && i < reps; i++)
    ok = CU_CHECK(cudrv.MemcpyDtoD(dst, src, bytes));
  ok = ok && CU_CHECK(cudrv.EventRecord(b, NULL)) && CU_CHECK(cudrv.EventSynchronize(b)) &&
       CU_CHECK(cudrv.EventElapsedTime(&ms, a, b));
  cudrv.EventDestroy(a);
  cudrv.EventDestroy(b);
  return ok ? ms / reps : -1;
}

/* ---- the executor ------------------------------------------------------------------------- */

_Static_assert(sizeof(Chunk) == 40 && sizeof(Scalar) == 8, "OptcChunk and OptcScalar in emit_cuda.c mirror these");

/* One launch covers at most this many chunks; more go in several. */
enum { MAX_GRID = 1 << 30 };

struct CudaExec {
  const Graph *g;
  const GroupLayout *l;
  CUmodule mod;
  int nkernels;
  CUfunction *fn;       /* (nkernels) optc_phaseK..., then optc_nonfinite */
  CudaKernel *kernels;  /* (nkernels) a copy of the program's launch facts */
  int maxred;
  CUdeviceptr *bufs;    /* (nbufs) the flat buffers, when it has them */
  bool have_bufs;       /* allocated here, or bound */
  bool own_bufs;        /* allocated here: freed here */
  CUdeviceptr *table;   /* (ntensors * nbufs) tensor t's element 0 of buffer b at [t * nbufs + b] */
  CUdeviceptr d_bufs;   /* the table, as the kernels read it */
  CUstream stream;      /* where it launches: NULL, the default stream */
  CUdeviceptr d_chunks, d_step, d_tvals, d_partials;
  Scalar *step;         /* (nins) host copies */
  Scalar *tvals;        /* (ntensors * nins) */
  double *partials;     /* (nchunks * maxred), page-locked */
  bool profile;
  double *phase_ms;     /* (nkernels) the last step's time of each kernel, when profiling */
};

static void free_bufs(CudaExec *x) {
  if (x->own_bufs)
    for (int b = 0; b < x->g->nbufs; b++)
      if (x->bufs[b])
        CU_CHECK(cudrv.MemFree(x->bufs[b]));
  memset(x->bufs, 0, sizeof(CUdeviceptr) * (size_t)x->g->nbufs);
  x->own_bufs = x->have_bufs = false;
}

void cuda_exec_free(CudaExec *x) {
  if (!x)
    return;
  if (cudrv.ok && cudrv.CtxSetCurrent(cudrv.ctx) == CUDA_SUCCESS) {
    if (x->bufs)
      free_bufs(x);
    CUdeviceptr *d[] = {&x->d_bufs, &x->d_chunks, &x->d_step, &x->d_tvals, &x->d_partials};
    for (size_t i = 0; i < ARRAY_LEN(d); i++)
      if (*d[i])
        CU_CHECK(cudrv.MemFree(*d[i]));
    if (x->partials)
      CU_CHECK(cudrv.MemFreeHost(x->partials));
    if (x->mod)
      CU_CHECK(cudrv.ModuleUnload(x->mod));
  }
  free(x->fn);
  free(x->kernels);
  free(x->phase_ms);
  free(x->bufs);
  free(x->table);
  free(x->step);
  free(x->tvals);
  free(x);
}

static bool alloc(CUdeviceptr *p, size_t bytes) { return CU_CHECK(cudrv.MemAlloc(p, bytes ? bytes : 8)); }

CudaExec *cuda_exec_create(const CudaProgram *p, const Graph *g, const GroupLayout *l, char *err, size_t errn) {
  char why[256];
  if (!cuda_device_available(why, sizeof why)) {
    snprintf(err, errn, "%s", why);
    return NULL;
  }
  if (!cuda_device0()) {
    snprintf(err, errn, "cannot make the CUDA context current");
    return NULL;
  }
  if (!g->plan || p->nkernels != g->plan->nphases + 1) {
    snprintf(err, errn, "the program does not belong to this graph (%d kernels for %d phases)", p->nkernels,
             g->plan ? g->plan->nphases : 0);
    return NULL;
  }
  CudaExec *x = calloc(1, sizeof *x);
  ASSERT(x);
  x->g = g;
  x->l = l;
  x->nkernels = p->nkernels;
  x->fn = calloc((size_t)p->nkernels, sizeof(CUfunction));
  x->kernels = malloc(sizeof(CudaKernel) * (size_t)p->nkernels);
  x->phase_ms = calloc((size_t)p->nkernels, sizeof(double));
  x->bufs = calloc((size_t)g->nbufs + 1, sizeof(CUdeviceptr));
  x->table = calloc((size_t)l->ntensors * (size_t)g->nbufs + 1, sizeof(CUdeviceptr));
  x->step = calloc((size_t)g->nins + 1, sizeof(Scalar));
  x->tvals = calloc(((size_t)l->ntensors + 1) * ((size_t)g->nins + 1), sizeof(Scalar));
  ASSERT(x->fn && x->kernels && x->bufs && x->table && x->step && x->tvals);
  memcpy(x->kernels, p->kernels, sizeof(CudaKernel) * (size_t)p->nkernels);
  x->maxred = 1;
  for (int k = 0; k < p->nkernels; k++)
    x->maxred = MAX(x->maxred, p->kernels[k].nred);

  /* the module: the cubin, else the PTX (the driver compiles it) */
  char jit_log[8192] = "";
  int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {jit_log, (void *)(uintptr_t)sizeof jit_log};
  const void *image = p->cubin_len ? p->cubin : (const void *)p->ptx;
  if (!image) {
    snprintf(err, errn, "the program has neither a cubin nor PTX");
    goto fail;
  }
  if (!CU_CHECK(cudrv.ModuleLoadDataEx(&x->mod, image, 2, opts, vals))) {
    snprintf(err, errn, "cannot load the %s for %s%s%s", p->cubin_len ? "cubin" : "PTX", p->arch,
             *jit_log ? ": " : "", jit_log);
    goto fail;
  }
  for (int k = 0; k < p->nkernels; k++)
    if (!CU_CHECK(cudrv.ModuleGetFunction(&x->fn[k], x->mod, p->kernels[k].name))) {
      snprintf(err, errn, "the module has no kernel %s", p->kernels[k].name);
      goto fail;
    }

  /* buffers, the chunk table, and room for step values, tensor values and partials */
  size_t nchunks = (size_t)l->nchunks;
  bool ok = alloc(&x->d_bufs, sizeof(CUdeviceptr) * ((size_t)l->ntensors * (size_t)g->nbufs + 1)) &&
            alloc(&x->d_chunks, sizeof(Chunk) * nchunks) && alloc(&x->d_step, sizeof(Scalar) * (size_t)(g->nins + 1)) &&
            alloc(&x->d_tvals, sizeof(Scalar) * ((size_t)l->ntensors + 1) * ((size_t)g->nins + 1)) &&
            alloc(&x->d_partials, sizeof(double) * (nchunks + 1) * (size_t)x->maxred) &&
            CU_CHECK(cudrv.MemAllocHost((void **)&x->partials, sizeof(double) * (nchunks + 1) * (size_t)x->maxred));
  if (ok && nchunks)
    ok = CU_CHECK(cudrv.MemcpyHtoD(x->d_chunks, l->chunks, sizeof(Chunk) * nchunks));
  if (!ok) {
    snprintf(err, errn, "out of device memory for the chunk table of %lld chunks", (long long)l->nchunks);
    goto fail;
  }
  return x;
fail:
  cuda_exec_free(x);
  return NULL;
}

/* The tensor table the kernels read, from x->table. */
static bool upload_table(CudaExec *x) {
  size_t n = (size_t)x->l->ntensors * (size_t)x->g->nbufs;
  return n == 0 || CU_CHECK(cudrv.MemcpyHtoD(x->d_bufs, x->table, sizeof(CUdeviceptr) * n));
}

/* The tensor table of the flat buffers x->bufs. */
static bool put_table(CudaExec *x) {
  const Graph *g = x->g;
  for (int t = 0; t < x->l->ntensors; t++)
    for (int b = 0; b < g->nbufs; b++)
      x->table[(size_t)t * (size_t)g->nbufs + (size_t)b] =
          x->bufs[b] + (CUdeviceptr)buffer_offset(g, b, x->l->offset[t]);
  return upload_table(x);
}

/* The executor's own flat buffers, zeroed, allocated when first needed
 * (so that a bound executor never holds a second copy). */
static bool ensure_bufs(CudaExec *x) {
  if (x->have_bufs)
    return true;
  const Graph *g = x->g;
  x->own_bufs = x->have_bufs = true;
  for (int b = 0; b < g->nbufs; b++) {
    size_t bytes = (size_t)buffer_bytes(g, b, x->l->total);
    if (!alloc(&x->bufs[b], bytes) || !CU_CHECK(cudrv.MemsetD8(x->bufs[b], 0, bytes ? bytes : 8))) {
      error("out of device memory for @%s (%lld elements)", g->bufs[b].name, (long long)x->l->total);
      free_bufs(x);
      return false;
    }
  }
  return put_table(x);
}

int cuda_exec_bind(CudaExec *x, const CudaPtr *bufs) {
  if (!cuda_device0())
    return -1;
  free_bufs(x);
  for (int b = 0; b < x->g->nbufs; b++)
    x->bufs[b] = bufs[b];
  x->have_bufs = true;
  return put_table(x) ? 0 : -1;
}

int cuda_exec_bind_tensors(CudaExec *x, const CudaPtr *table) {
  if (!cuda_device0())
    return -1;
  free_bufs(x);
  x->have_bufs = true; /* the caller's, not flat: cuda_exec_upload has nothing to copy to */
  memcpy(x->table, table, sizeof(CUdeviceptr) * (size_t)x->l->ntensors * (size_t)x->g->nbufs);
  return upload_table(x) ? 0 : -1;
}

void cuda_exec_set_stream(CudaExec *x, void *stream) { x->stream = (CUstream)stream; }

CudaPtr cuda_exec_buffer(CudaExec *x, int b) {
  return b >= 0 && b < x->g->nbufs && cuda_device0() && ensure_bufs(x) ? x->bufs[b] : 0;
}

static int copy_bufs(CudaExec *x, void *const *host, bool up) {
  if (!cuda_device0() || !ensure_bufs(x))
    return -1;
  for (int b = 0; b < x->g->nbufs; b++) {
    size_t bytes = (size_t)buffer_bytes(x->g, b, x->l->total);
    if (bytes && !CU_CHECK(up ? cudrv.MemcpyHtoD(x->bufs[b], host[b], bytes) : cudrv.MemcpyDtoH(host[b], x->bufs[b], bytes)))
      return -1;
  }
  return 0;
}

int cuda_exec_upload(CudaExec *x, void *const *bufs) { return copy_bufs(x, bufs, true); }
int cuda_exec_download(CudaExec *x, void *const *bufs) { return copy_bufs(x, bufs, false); }

void cuda_exec_profile(CudaExec *x, bool on) { x->profile = on; }
double cuda_exec_kernel_ms(const CudaExec *x) {
  double ms = 0;
  for (int k = 0; k < x->nkernels; k++)
    ms += x->phase_ms[k];
  return ms;
}
double cuda_exec_phase_ms(const CudaExec *x, int k) { return k >= 0 && k < x->nkernels ? x->phase_ms[k] : 0; }

/* Kernel k over every chunk, cpb chunks per block, in launches of at most
 * MAX_GRID chunks; the partials land in d_partials, nred per chunk. */
static bool launch(CudaExec *x, int k) {
  const CudaKernel *kk = &x->kernels[k];
  int64_t n = x->l->nchunks;
  CUevent a = NULL, b = NULL;
  if (x->profile && cudrv.EventElapsedTime) {
    if (!CU_CHECK(cudrv.EventCreate(&a, 0)) || !CU_CHECK(cudrv.EventCreate(&b, 0)) || !CU_CHECK(cudrv.EventRecord(a, NULL)))
      return false;
  }
  bool ok = true;
  for (int64_t lo = 0; ok && lo < n; lo += MAX_GRID) {
    long long count = (long long)MIN(n - lo, (int64_t)MAX_GRID);
    CUdeviceptr chunks = x->d_chunks + (CUdeviceptr)lo * sizeof(Chunk);
    CUdeviceptr partials = x->d_partials + (CUdeviceptr)lo * (CUdeviceptr)MAX(kk->nred, 1) * sizeof(double);
    void *params[] = {&chunks, &count, &x->d_bufs, &x->d_step, &x->d_tvals, &partials};
    unsigned blocks = (unsigned)((count + kk->cpb - 1) / kk->cpb);
    ok = CU_CHECK(cudrv.LaunchKernel(x->fn[k], blocks, 1, 1, (unsigned)kk->threads, 1, 1, 0, x->stream, params, NULL));
  }
  if (a) {
    float ms = 0;
    ok = ok && CU_CHECK(cudrv.EventRecord(b, NULL)) && CU_CHECK(cudrv.EventSynchronize(b)) &&
         CU_CHECK(cudrv.EventElapsedTime(&ms, a, b));
    x->phase_ms[k] = ms;
    cudrv.EventDestroy(a);
    cudrv.EventDestroy(b);
  }
  return ok;
}

/* The host reads partials only after the stream's launches are done (a
 * copy on the default stream does not wait for a non-blocking one). */
static bool sync_stream(CudaExec *x) { return !x->stream || CU_CHECK(cudrv.StreamSynchronize(x->stream)); }

int cuda_step(CudaExec *x, const StepArgs *args, StepResult *res) {
  const Graph *g = x->g;
  const GroupLayout *l = x->l;
  const Plan *p = g->plan;
  memset(res, 0, sizeof *res);
  memset(x->phase_ms, 0, sizeof(double) * (size_t)x->nkernels);
  if (!cuda_device0() || !ensure_bufs(x))
    return -1;
  size_t nchunks = (size_t)l->nchunks;
  bool ok = !args || args->propagate || args->grads_finite != 0;
  if (ok && (!args || (!args->propagate && args->grads_finite < 0)) && nchunks) {
    /* optc_nonfinite: one flag per chunk */
    if (!launch(x, p->nphases) || !sync_stream(x) ||
        !CU_CHECK(cudrv.MemcpyDtoH(x->partials, x->d_partials, sizeof(double) * nchunks)))
      return -1;
    for (size_t c = 0; c < nchunks; c++)
      ok &= x->partials[c] == 0;
  }
  bool tvals_dirty = true;
  for (int k = 0; ok && k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    interp_eval_steps(g, ph->step_lo, ph->step_hi, args ? args->inputs : NULL, x->step);
    if (!CU_CHECK(cudrv.MemcpyHtoD(x->d_step, x->step, sizeof(Scalar) * (size_t)g->nins)))
      return -1;
    if (tvals_dirty && l->ntensors && g->nins && !CU_CHECK(cudrv.MemcpyHtoD(x->d_tvals, x->tvals,
                                                sizeof(Scalar) * (size_t)l->ntensors * (size_t)g->nins)))
      return -1;
    tvals_dirty = false;
    if (nchunks && !launch(x, k))
      return -1;
    int nred = ph->nreds;
    if (!nred)
      continue;
    if (nchunks && (!sync_stream(x) ||
                    !CU_CHECK(cudrv.MemcpyDtoH(x->partials, x->d_partials, sizeof(double) * nchunks * (size_t)nred))))
      return -1;
    /* exec_cpu.c's fold, line for line */
    for (int i = 0; i < nred; i++) {
      Ref r = ph->reds[i];
      RedKind kind = (RedKind)g->ins[r].red;
      bool is_max = kind == RED_MAX || kind == RED_ABSMAX;
      if (g->ins[r].to == SCOPE_STEP) {
        double acc = is_max ? -INFINITY : 0.0;
        for (size_t c = 0; c < nchunks; c++) {
          double v = x->partials[c * (size_t)nred + (size_t)i];
          acc = is_max ? optc_max_nan(acc, v) : acc + v;
        }
        x->step[r].d = acc;
        if (res->nred < (int)ARRAY_LEN(res->red))
          res->red[res->nred++] = acc;
        if (!isfinite(acc) && !(args && args->propagate) && nchunks > 0)
          ok = false;
      } else {
        for (int t = 0; t < l->ntensors; t++)
          x->tvals[(size_t)t * (size_t)g->nins + (size_t)r].d = is_max ? -INFINITY : 0.0;
        for (size_t c = 0; c < nchunks; c++) {
          double *acc = &x->tvals[(size_t)l->chunks[c].tensor * (size_t)g->nins + (size_t)r].d;
          double v = x->partials[c * (size_t)nred + (size_t)i];
          *acc = is_max ? optc_max_nan(*acc, v) : *acc + v;
        }
        tvals_dirty = true;
      }
    }
  }
  res->skipped = !ok;
  return (x->stream ? sync_stream(x) : CU_CHECK(cudrv.CtxSynchronize())) ? 0 : -1;
}
