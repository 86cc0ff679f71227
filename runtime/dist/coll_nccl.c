/* coll_nccl.c: collectives for GPU ranks, one GPU per rank, launched by
 * mpirun. The ncclUniqueId travels over a coll_mpi; buffers are device
 * pointers; every call runs on the Coll's stream and returns after it is
 * synchronized.
 *
 * NCCL moves the data; the arithmetic is optc's, so that sums are in rank
 * order and bf16 is summed in f32 and rounded once (coll.h), the same bits
 * as coll_mpi.c (NCCL's own reductions add in ring or tree order and round
 * bf16 at every hop):
 * - reduce-scatter: in one NCCL group, each rank ncclSends block p to rank
 *   p and ncclRecvs the N-1 contributions to its own block into a staging
 *   buffer; a kernel then folds them x_0 first. Blocks larger than the
 *   staging slots go in chunks, which the stream runs in order.
 * - all-reduce: that reduce-scatter over blocks of count*b/N elements, then
 *   one grouped ncclBroadcast per block; small ones (N * bytes <=
 *   SMALL_ALL_REDUCE) ncclAllGather everything and fold on every rank.
 * - all-gather, broadcast: ncclAllGather, ncclBroadcast. Barrier: an
 *   ncclAllReduce of one int.
 * The kernels are compiled with NVRTC (dlopened as the GPU backend opens
 * it: gpu.h) when the Coll is made, for the arch the GPU backend would
 * choose (compiler/cuda/nvrtc.c); the CUDA driver
 * API (allocation, streams, modules, launches) is the backend's, dlopened
 * (compiler/cuda/driver.h), never linked. */
#include "coll.h"

#include "base.h"
#include "driver.h"
#include "gpu.h"

#include <nccl.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

enum {
  SLOT_MAX_BYTES = 32 << 20,   /* one peer's chunk in the staging buffer */
  STAGE_MAX_BYTES = 256 << 20, /* all slots together, when N is large */
  SMALL_ALL_REDUCE = 64 << 10, /* gather-and-fold all-reduce up to size*count bytes */
  THREADS = 256,
};

/* ---- the kernels: rank-order folds ---------------------------------------------------
 * out[i] = x_0[i] op ... op x_{N-1}[i], with x_me = own[i] and the other
 * ranks' x_k = stage[k * stride + i]. Arithmetic as coll_local.c's
 * coll_reduce_host, bf16 rounding as numerics.h's optc_f32_to_bf16, and a
 * NaN sum the canonical NaN. */
static const char kernel_src[] =
    "typedef unsigned short u16;\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "__device__ float widen(u16 h) { return __uint_as_float((u32)h << 16); }\n"
    "__device__ float widen(float x) { return x; }\n"
    "__device__ double widen(double x) { return x; }\n"
    "__device__ u64 widen(u64 x) { return x; }\n"
    "__device__ u32 widen(u32 x) { return x; }\n"
    "__device__ long long widen(long long x) { return x; }\n"
    "__device__ int widen(int x) { return x; }\n"
    "__device__ u16 round_bf16(float f) {\n"
    "  u32 u = __float_as_uint(f);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u)\n"
    "    return 0x7fc0u;\n"
    "  u += 0x7fffu + ((u >> 16) & 1u);\n"
    "  return (u16)(u >> 16);\n"
    "}\n"
    "__device__ float canon(float a) { return a != a ? __uint_as_float(0x7fc00000u) : a; }\n"
    "__device__ double canon(double a) { return a != a ? __longlong_as_double(0x7ff8000000000000ll) : a; }\n"
    "__device__ u16 top_bf16(float f) { return (u16)(__float_as_uint(f) >> 16); }\n"
    "template <class A> __device__ A add(A a, A b) { return a + b; }\n"
    "template <class A> __device__ A max_nan(A a, A b) { return a != a ? a : b != b ? b : a < b ? b : a; }\n"
    "template <class A> __device__ A same(A a) { return a; }\n"
    "#define FOLD(name, T, A, op, narrow)                                                     \\\n"
    "  extern \"C\" __global__ void name(T *out, const T *own, const T *stage, long long stride, \\\n"
    "                                   long long n, int nranks, int me) {                     \\\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;           \\\n"
    "         i += (long long)gridDim.x * blockDim.x) {                                        \\\n"
    "      A a = widen(me == 0 ? own[i] : stage[i]);                                           \\\n"
    "      for (int k = 1; k < nranks; k++)                                                    \\\n"
    "        a = op<A>(a, widen(k == me ? own[i] : stage[k * stride + i]));                    \\\n"
    "      out[i] = narrow(a);                                                                 \\\n"
    "    }                                                                                     \\\n"
    "  }\n"
    "FOLD(sum_f32, float, float, add, canon)\n"
    "FOLD(sum_f64, double, double, add, canon)\n"
    "FOLD(sum_bf16, u16, float, add, round_bf16)\n"
    "FOLD(sum_i64, u64, u64, add, same)\n"
    "FOLD(sum_i32, u32, u32, add, same)\n"
    "FOLD(max_f32, float, float, max_nan, same)\n"
    "FOLD(max_f64, double, double, max_nan, same)\n"
    "FOLD(max_bf16, u16, float, max_nan, top_bf16)\n"
    "FOLD(max_i64, long long, long long, max_nan, same)\n"
    "FOLD(max_i32, int, int, max_nan, same)\n";

static const char *const fold_names[2][COLL_NTYPES] = {
    [COLL_SUM] = {[COLL_F32] = "sum_f32", [COLL_F64] = "sum_f64", [COLL_BF16] = "sum_bf16",
                  [COLL_I64] = "sum_i64", [COLL_I32] = "sum_i32"},
    [COLL_MAX] = {[COLL_F32] = "max_f32", [COLL_F64] = "max_f64", [COLL_BF16] = "max_bf16",
                  [COLL_I64] = "max_i64", [COLL_I32] = "max_i32"},
};

/* ---- state --------------------------------------------------------------------------- */
typedef struct {
  Coll base;
  Coll *mpi;          /* the bootstrap (MPI), freed with this Coll */
  const char *op;     /* the collective in progress, for messages */
  bool failed;        /* some call failed: the peers may be gone */
  CUdevice dev;
  CUcontext ctx;      /* the device's primary context */
  bool have_ctx;
  CUstream stream;
  CUmodule module;
  CUfunction fold[2][COLL_NTYPES];
  int nsm;            /* multiprocessors, for grid sizes */
  ncclComm_t comm;
  CUdeviceptr stage;  /* (size, slot bytes): other ranks' chunks */
  size_t slot;        /* bytes per rank in stage */
  CUdeviceptr flag;   /* (1) int: the barrier's all-reduce */
  int64_t *off, *len; /* (size + 1): blocks */
} CollNccl;

static CollNccl *as_nccl(Coll *c) { return (CollNccl *)c; }

static int cu_fail(CollNccl *n, const char *file, int line, const char *call, CUresult rc) {
  n->failed = true;
  error("%s:%d: %s: %s (rank %d of %d, %s)", file, line, call, cu_errstr(rc), n->base.rank, n->base.size, n->op);
  return -1;
}

static int nccl_fail(CollNccl *n, const char *file, int line, const char *call, ncclResult_t rc) {
  const char *last = n->comm ? ncclGetLastError(n->comm) : NULL;
  n->failed = true;
  error("%s:%d: %s: %s%s%s (rank %d of %d, %s)", file, line, call, ncclGetErrorString(rc), last && *last ? ": " : "",
        last ? last : "", n->base.rank, n->base.size, n->op);
  return -1;
}

#define COLL_CU(n, fn, args) \
  do { \
    CUresult rc_ = cudrv.fn args; \
    if (rc_ != CUDA_SUCCESS) \
      return cu_fail(n, __FILE__, __LINE__, "cu" #fn, rc_); \
  } while (0)

#define NCCL_CHECK(n, call) \
  do { \
    ncclResult_t rc_ = (call); \
    if (rc_ != ncclSuccess) \
      return nccl_fail(n, __FILE__, __LINE__, #call, rc_); \
  } while (0)

static ncclDataType_t nccl_type(CollType t) {
  switch (t) {
  case COLL_F32: return ncclFloat32;
  case COLL_F64: return ncclFloat64;
  case COLL_BF16: return ncclBfloat16;
  case COLL_I64: return ncclInt64;
  case COLL_I32: return ncclInt32;
  default: unreachable();
  }
}

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* Waits for the stream, watching NCCL's asynchronous errors and the
 * timeout; on either the communicator is aborted, so that the kernels
 * waiting for a peer end. */
static int stream_wait(CollNccl *n) {
  double deadline = n->base.timeout > 0 ? now_seconds() + n->base.timeout : 0;
  for (;;) {
    CUresult q = cudrv.StreamQuery(n->stream);
    if (q == CUDA_SUCCESS)
      return 0;
    if (q != CUDA_ERROR_NOT_READY)
      return cu_fail(n, __FILE__, __LINE__, "cuStreamQuery", q);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(n, ncclCommGetAsyncError(n->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      nccl_fail(n, __FILE__, __LINE__, "ncclCommGetAsyncError", async);
      break;
    }
    if (deadline > 0 && now_seconds() > deadline) {
      n->failed = true;
      error("%s:%d: timed out after %g s waiting for the other ranks (rank %d of %d, %s)", __FILE__, __LINE__,
            n->base.timeout, n->base.rank, n->base.size, n->op);
      break;
    }
    sched_yield();
  }
  ncclCommAbort(n->comm);
  n->comm = NULL;
  return -1;
}

/* Makes the staging buffer hold size slots of at least bytes each (at
 * most the slot limit); returns the slot size. */
static int stage_reserve(CollNccl *n, size_t bytes, size_t *slot) {
  size_t N = (size_t)n->base.size;
  size_t cap = MIN((size_t)SLOT_MAX_BYTES, MAX((size_t)1 << 20, STAGE_MAX_BYTES / N));
  size_t want = MIN(cap, (bytes + 255) / 256 * 256);
  if (want > n->slot) {
    if (n->stage) {
      if (stream_wait(n) != 0)
        return -1;
      COLL_CU(n, MemFree, (n->stage));
      n->stage = 0;
      n->slot = 0;
    }
    COLL_CU(n, MemAlloc, (&n->stage, want * N));
    n->slot = want;
  }
  *slot = n->slot;
  return 0;
}

static int launch_fold(CollNccl *n, CollType t, CollRed op, CUdeviceptr out, CUdeviceptr own, CUdeviceptr stage,
                       long long stride, long long count) {
  int nranks = n->base.size, me = n->base.rank;
  void *args[] = {&out, &own, &stage, &stride, &count, &nranks, &me};
  long long blocks = MIN((count + THREADS - 1) / THREADS, (long long)n->nsm * 8);
  COLL_CU(n, LaunchKernel, (n->fold[op][t], (unsigned)MAX(blocks, 1LL), 1, 1, THREADS, 1, 1, 0, n->stream, args, NULL));
  return 0;
}

/* recv = the rank-order fold of block r (n->off, n->len, elements) of
 * every rank's send; recv may be send's own block. Enqueued, not waited. */
static int rs_own(CollNccl *n, const void *send, void *recv, CollType t, CollRed op) {
  int N = n->base.size, r = n->base.rank;
  size_t es = coll_type_size(t), slot;
  int64_t maxlen = 0;
  for (int b = 0; b < N; b++)
    maxlen = MAX(maxlen, n->len[b]);
  if (stage_reserve(n, (size_t)maxlen * es, &slot) != 0)
    return -1;
  int64_t elems = (int64_t)(slot / es);
  for (int64_t at = 0; at < maxlen; at += elems) {
    NCCL_CHECK(n, ncclGroupStart());
    for (int s = 1; s < N; s++) {
      int p = (r + s) % N;
      if (at < n->len[p])
        NCCL_CHECK(n, ncclSend((const char *)send + (size_t)(n->off[p] + at) * es,
                               (size_t)MIN(elems, n->len[p] - at), nccl_type(t), p, n->comm, n->stream));
    }
    for (int s = 1; s < N && at < n->len[r]; s++) {
      int p = (r - s + N) % N;
      NCCL_CHECK(n, ncclRecv((void *)(uintptr_t)(n->stage + (size_t)p * slot), (size_t)MIN(elems, n->len[r] - at),
                             nccl_type(t), p, n->comm, n->stream));
    }
    NCCL_CHECK(n, ncclGroupEnd());
    if (at < n->len[r] &&
        launch_fold(n, t, op, dptr(recv) + (size_t)at * es, dptr(send) + (size_t)(n->off[r] + at) * es, n->stage,
                    elems, MIN(elems, n->len[r] - at)) != 0)
      return -1;
  }
  return 0;
}

/* ---- the collectives ------------------------------------------------------------------- */
static int use_context(CollNccl *n, const char *op) {
  n->op = op;
  COLL_CU(n, CtxSetCurrent, (n->ctx));
  return 0;
}

static bool library_reduce(const Coll *c, CollType t) { return c->algo == COLL_ALGO_LIBRARY && t != COLL_BF16; }

static int nccl_reduce_scatter(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  CollNccl *n = as_nccl(c);
  if (use_context(n, "reduce_scatter") != 0)
    return -1;
  if (library_reduce(c, t)) {
    NCCL_CHECK(n, ncclReduceScatter(send, recv, (size_t)count, nccl_type(t), ncclSum, n->comm, n->stream));
  } else {
    for (int b = 0; b < c->size; b++)
      n->off[b] = b * count, n->len[b] = count;
    if (rs_own(n, send, recv, t, COLL_SUM) != 0)
      return -1;
  }
  return stream_wait(n);
}

static int nccl_all_gather(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  CollNccl *n = as_nccl(c);
  int N = c->size, r = c->rank;
  size_t bytes = (size_t)count * coll_type_size(t);
  if (use_context(n, "all_gather") != 0)
    return -1;
  if (c->algo != COLL_ALGO_OWN) {
    NCCL_CHECK(n, ncclAllGather(send, recv, (size_t)count, nccl_type(t), n->comm, n->stream));
    return stream_wait(n);
  }
  char *out = recv;
  NCCL_CHECK(n, ncclGroupStart());
  for (int s = 1; s < N; s++) {
    NCCL_CHECK(n, ncclSend(send, bytes, ncclUint8, (r + s) % N, n->comm, n->stream));
    NCCL_CHECK(n, ncclRecv(out + (size_t)((r - s + N) % N) * bytes, bytes, ncclUint8, (r - s + N) % N, n->comm,
                           n->stream));
  }
  NCCL_CHECK(n, ncclGroupEnd());
  if (send != out + (size_t)r * bytes)
    COLL_CU(n, MemcpyDtoDAsync, (dptr(out) + (size_t)r * bytes, dptr(send), bytes, n->stream));
  return stream_wait(n);
}

static int nccl_all_reduce(Coll *c, void *buf, int64_t count, CollType t, CollRed op) {
  CollNccl *n = as_nccl(c);
  int N = c->size, r = c->rank;
  size_t es = coll_type_size(t), bytes = (size_t)count * es, slot;
  if (use_context(n, op == COLL_SUM ? "all_reduce_sum" : "all_reduce_max") != 0)
    return -1;
  if (library_reduce(c, t)) {
    NCCL_CHECK(n, ncclAllReduce(buf, buf, (size_t)count, nccl_type(t), op == COLL_SUM ? ncclSum : ncclMax, n->comm,
                                n->stream));
    return stream_wait(n);
  }
  if ((size_t)N * bytes <= SMALL_ALL_REDUCE) {
    /* Everyone's buffer into the staging slots, rank k's at k * count. */
    if (stage_reserve(n, (size_t)N * bytes, &slot) != 0)
      return -1;
    NCCL_CHECK(n, ncclAllGather(buf, (void *)(uintptr_t)n->stage, (size_t)count, nccl_type(t), n->comm, n->stream));
    if (launch_fold(n, t, op, dptr(buf), n->stage + (size_t)r * bytes, n->stage, count, count) != 0)
      return -1;
    return stream_wait(n);
  }
  coll_blocks(count, N, n->off, n->len);
  if (rs_own(n, buf, (char *)buf + (size_t)n->off[r] * es, t, op) != 0)
    return -1;
  NCCL_CHECK(n, ncclGroupStart());
  for (int b = 0; b < N; b++) {
    char *block = (char *)buf + (size_t)n->off[b] * es;
    if (n->len[b] > 0)
      NCCL_CHECK(n, ncclBroadcast(block, block, (size_t)n->len[b] * es, ncclUint8, b, n->comm, n->stream));
  }
  NCCL_CHECK(n, ncclGroupEnd());
  return stream_wait(n);
}

static int nccl_broadcast(Coll *c, void *buf, int64_t bytes, int root) {
  CollNccl *n = as_nccl(c);
  if (use_context(n, "broadcast") != 0)
    return -1;
  NCCL_CHECK(n, ncclBroadcast(buf, buf, (size_t)bytes, ncclUint8, root, n->comm, n->stream));
  return stream_wait(n);
}

static int nccl_barrier(Coll *c) {
  CollNccl *n = as_nccl(c);
  if (use_context(n, "barrier") != 0)
    return -1;
  void *flag = (void *)(uintptr_t)n->flag;
  NCCL_CHECK(n, ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, n->comm, n->stream));
  return stream_wait(n);
}

static const char *nccl_algorithm(const Coll *c, CollOp op, int64_t count, CollType t) {
  switch (op) {
  case COLL_OP_REDUCE_SCATTER:
    return library_reduce(c, t) ? "library:ncclReduceScatter" : "own:ncclSend/ncclRecv+sum";
  case COLL_OP_ALL_GATHER: return c->algo == COLL_ALGO_OWN ? "own:ncclSend/ncclRecv" : "library:ncclAllGather";
  case COLL_OP_ALL_REDUCE:
    if (library_reduce(c, t))
      return "library:ncclAllReduce";
    return (size_t)c->size * (size_t)count * coll_type_size(t) <= SMALL_ALL_REDUCE
               ? "own:ncclAllGather+sum"
               : "own:ncclSend/ncclRecv+sum, ncclBroadcast";
  case COLL_OP_BROADCAST: return "library:ncclBroadcast";
  }
  unreachable();
}

/* ---- device memory -------------------------------------------------------------------- */
static void *nccl_mem_alloc(Coll *c, size_t bytes) {
  CollNccl *n = as_nccl(c);
  CUdeviceptr p = 0;
  n->op = "mem_alloc";
  CUresult rc = cudrv.CtxSetCurrent(n->ctx);
  if (rc == CUDA_SUCCESS)
    rc = cudrv.MemAlloc(&p, bytes ? bytes : 1);
  if (rc == CUDA_SUCCESS && (rc = cudrv.MemsetD8(p, 0, bytes ? bytes : 1)) != CUDA_SUCCESS)
    cudrv.MemFree(p);
  if (rc != CUDA_SUCCESS) {
    error("%s:%d: cannot allocate %zu bytes on the GPU: %s (rank %d of %d)", __FILE__, __LINE__, bytes,
          cu_errstr(rc), c->rank, c->size);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

static void nccl_mem_free(Coll *c, void *p) {
  CollNccl *n = as_nccl(c);
  CUresult rc = cudrv.MemFree(dptr(p));
  if (rc != CUDA_SUCCESS)
    error("%s:%d: cuMemFree: %s (rank %d of %d)", __FILE__, __LINE__, cu_errstr(rc), n->base.rank, n->base.size);
}

static int nccl_mem_put(Coll *c, void *dst, const void *src, size_t bytes) {
  CollNccl *n = as_nccl(c);
  if (use_context(n, "mem_put") != 0)
    return -1;
  COLL_CU(n, MemcpyHtoD, (dptr(dst), src, bytes));
  return 0;
}

static int nccl_mem_get(Coll *c, void *dst, const void *src, size_t bytes) {
  CollNccl *n = as_nccl(c);
  if (use_context(n, "mem_get") != 0)
    return -1;
  COLL_CU(n, MemcpyDtoH, (dst, dptr(src), bytes));
  return 0;
}

/* ---- making and freeing ------------------------------------------------------------------ */
static void nccl_free(Coll *c) {
  CollNccl *n = as_nccl(c);
  if (n->have_ctx)
    cudrv.CtxSetCurrent(n->ctx);
  if (n->comm) {
    /* After a failure the peers may be gone: abort rather than wait. */
    ncclResult_t rc = n->failed ? ncclCommAbort(n->comm) : ncclCommDestroy(n->comm);
    if (rc != ncclSuccess)
      error("%s:%d: ncclCommDestroy: %s (rank %d of %d)", __FILE__, __LINE__, ncclGetErrorString(rc), c->rank,
            c->size);
  }
  if (n->stage)
    cudrv.MemFree(n->stage);
  if (n->flag)
    cudrv.MemFree(n->flag);
  if (n->module)
    cudrv.ModuleUnload(n->module);
  if (n->stream)
    cudrv.StreamDestroy(n->stream);
  if (n->have_ctx)
    cudrv.DevicePrimaryCtxRelease(n->dev);
  /* MPI_Finalize waits for every rank: after a failure the process should
   * exit instead, and mpirun ends the job. */
  if (!n->failed)
    coll_free(n->mpi);
  free(n->off);
  free(n->len);
  free(n);
}

static const CollImpl nccl_impl = {
    .name = "nccl",
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .algorithm = nccl_algorithm,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_put = nccl_mem_put,
    .mem_get = nccl_mem_get,
    .free = nccl_free,
};

/* The arch to compile for: the device's own as a cubin when NVRTC knows it,
 * else PTX for the newest arch NVRTC knows, which the driver compiles. */
static void pick_arch(int major, int minor, char *arch, size_t n, bool *ptx) {
  int want = major * 10 + minor, best = nvrtc_newest_arch(want);
  *ptx = best != want;
  snprintf(arch, n, "%s_%d", *ptx ? "compute" : "sm", best > 0 ? best : want);
}

/* Compiles kernel_src for the device into n->module. 0, or -1 with the
 * reason (NVRTC's log and the source included) in err. */
static int compile_folds(CollNccl *n, int major, int minor, char *err, size_t errlen) {
  if (!nvrtc_load(err, errlen))
    return -1;
  char arch[32], opt[64];
  bool ptx = false;
  pick_arch(major, minor, arch, sizeof arch, &ptx);
  snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
  /* No contraction and no flush to zero: the host's bits. */
  const char *opts[] = {opt, "--fmad=false", "--ftz=false", "--std=c++17"};
  nvrtcProgram prog;
  nvrtcResult rc = nvrtc.CreateProgram(&prog, kernel_src, "coll_folds.cu", 0, NULL, NULL);
  if (rc != NVRTC_SUCCESS) {
    snprintf(err, errlen, "%s:%d: nvrtcCreateProgram: %s", __FILE__, __LINE__, nvrtc.GetErrorString(rc));
    return -1;
  }
  rc = nvrtc.CompileProgram(prog, (int)ARRAY_LEN(opts), opts);
  if (rc != NVRTC_SUCCESS) {
    size_t loglen = 0;
    char *log = NULL;
    if (nvrtc.GetProgramLogSize(prog, &loglen) == NVRTC_SUCCESS && (log = calloc(1, loglen + 1)))
      nvrtc.GetProgramLog(prog, log);
    snprintf(err, errlen, "%s:%d: nvrtcCompileProgram (%s): %s\n%s\n--- coll_folds.cu ---\n%s", __FILE__, __LINE__,
             arch, nvrtc.GetErrorString(rc), log ? log : "", kernel_src);
    free(log);
    nvrtc.DestroyProgram(&prog);
    return -1;
  }
  size_t size = 0;
  char *image = NULL;
  rc = ptx ? nvrtc.GetPTXSize(prog, &size) : nvrtc.GetCUBINSize(prog, &size);
  if (rc == NVRTC_SUCCESS) {
    image = calloc(1, size + 1); /* PTX is text: NUL-terminated */
    ASSERT(image);
    rc = ptx ? nvrtc.GetPTX(prog, image) : nvrtc.GetCUBIN(prog, image);
  }
  nvrtc.DestroyProgram(&prog);
  if (rc != NVRTC_SUCCESS) {
    snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN",
             nvrtc.GetErrorString(rc));
    free(image);
    return -1;
  }
  CUresult cr = cudrv.ModuleLoadData(&n->module, image);
  free(image);
  if (cr != CUDA_SUCCESS) {
    snprintf(err, errlen, "%s:%d: cuModuleLoadData (%s): %s", __FILE__, __LINE__, arch, cu_errstr(cr));
    return -1;
  }
  for (int op = 0; op < 2; op++)
    for (int t = 0; t < COLL_NTYPES; t++)
      if ((cr = cudrv.ModuleGetFunction(&n->fold[op][t], n->module, fold_names[op][t])) != CUDA_SUCCESS) {
        snprintf(err, errlen, "%s:%d: cuModuleGetFunction(%s): %s", __FILE__, __LINE__, fold_names[op][t],
                 cu_errstr(cr));
        return -1;
      }
  return 0;
}

#define INIT_CU(fn, args) \
  do { \
    CUresult rc_ = cudrv.fn args; \
    if (rc_ != CUDA_SUCCESS) { \
      snprintf(err, errlen, "%s%s:%d: cu" #fn ": %s", rc_ == CUDA_ERROR_NO_DEVICE ? "no GPU: " : "", __FILE__, \
               __LINE__, cu_errstr(rc_)); \
      goto local_fail; \
    } \
  } while (0)

/* This rank's index among the ranks on its host. -1 on error (printed). */
static int local_rank(Coll *mpi) {
  int N = coll_size(mpi), me = coll_rank(mpi);
  enum { NAME = 64 };
  char *names = calloc((size_t)N, NAME);
  ASSERT(names);
  char *mine = names + (size_t)me * NAME;
  gethostname(mine, NAME - 1);
  int rank = -1;
  if (coll_all_gather(mpi, mine, names, NAME / 4, COLL_I32) == 0) {
    rank = 0;
    for (int k = 0; k < me; k++)
      rank += strncmp(names + (size_t)k * NAME, mine, NAME) == 0;
  }
  free(names);
  return rank;
}

/* The caller frees with coll_free. */
Coll *coll_nccl(int *argc, char ***argv, int device, char *err, size_t errlen) {
  Coll *mpi = coll_mpi(argc, argv, err, errlen);
  if (!mpi)
    return NULL;
  CollNccl *n = calloc(1, sizeof *n);
  ASSERT(n);
  n->base = (Coll){.impl = &nccl_impl, .rank = coll_rank(mpi), .size = coll_size(mpi),
                   .timeout = coll_default_timeout(), .hosts = coll_hosts(mpi)};
  n->mpi = mpi;
  n->op = "init";
  n->off = calloc((size_t)n->base.size + 1, sizeof *n->off);
  n->len = calloc((size_t)n->base.size + 1, sizeof *n->len);
  ASSERT(n->off && n->len);
  int lrank = local_rank(mpi);
  if (lrank < 0) {
    snprintf(err, errlen, "%s:%d: cannot exchange host names over MPI", __FILE__, __LINE__);
    goto fail;
  }

  /* The steps up to the kernels can fail on one rank only: all ranks learn
   * whether any did before the collective ncclCommInitRank. */
  int ndev = 0, major = 0, minor = 0;
  err[0] = 0;
  char why[256];
  if (!cuda_driver_load(why, sizeof why)) {
    snprintf(err, errlen, "no GPU: %s", why);
    goto local_fail;
  }
  if (!cudrv.StreamCreate || !cudrv.StreamDestroy || !cudrv.StreamQuery || !cudrv.MemcpyDtoDAsync ||
      !cudrv.ModuleLoadData || !cudrv.DevicePrimaryCtxRelease) {
    snprintf(err, errlen, "%s:%d: the CUDA driver lacks a stream, async copy or module entry point", __FILE__,
             __LINE__);
    goto local_fail;
  }
  INIT_CU(Init, (0));
  INIT_CU(DeviceGetCount, (&ndev));
  if (ndev == 0) {
    snprintf(err, errlen, "no GPU: the CUDA driver sees no device");
    goto local_fail;
  }
  int ord = device >= 0 ? device : lrank % ndev;
  INIT_CU(DeviceGet, (&n->dev, ord));
  INIT_CU(DevicePrimaryCtxRetain, (&n->ctx, n->dev));
  n->have_ctx = true;
  INIT_CU(CtxSetCurrent, (n->ctx));
  INIT_CU(DeviceGetAttribute, (&n->nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, n->dev));
  INIT_CU(DeviceGetAttribute, (&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, n->dev));
  INIT_CU(DeviceGetAttribute, (&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, n->dev));
  INIT_CU(StreamCreate, (&n->stream, CU_STREAM_NON_BLOCKING));
  INIT_CU(MemAlloc, (&n->flag, sizeof(int)));
  INIT_CU(MemsetD8, (n->flag, 0, sizeof(int)));
  if (compile_folds(n, major, minor, err, errlen) != 0)
    goto local_fail;
local_fail:;
  /* {failed, no GPU}, over all ranks: "no GPU" anywhere makes every rank
   * say so (a test then skips on every rank). */
  int mine[2] = {err[0] != 0, strncmp(err, "no GPU", 6) == 0}, any[2] = {mine[0], mine[1]};
  if (coll_all_reduce_max(mpi, any, 2, COLL_I32) != 0) {
    snprintf(err, errlen, "%s:%d: cannot agree over MPI on the GPU setup", __FILE__, __LINE__);
    goto fail;
  }
  if (any[0]) {
    if (!mine[0])
      snprintf(err, errlen, "%s%s:%d: another rank could not set up its GPU", any[1] ? "no GPU: " : "", __FILE__,
               __LINE__);
    /* every rank knows and no NCCL communicator exists: MPI closes normally */
    nccl_free(&n->base);
    return NULL;
  }

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t rc = n->base.rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
  int id_bad = rc != ncclSuccess;
  if (coll_all_reduce_max(mpi, &id_bad, 1, COLL_I32) != 0 || coll_broadcast(mpi, &id, sizeof id, 0) != 0) {
    snprintf(err, errlen, "%s:%d: cannot send the ncclUniqueId over MPI", __FILE__, __LINE__);
    goto fail;
  }
  if (id_bad) {
    snprintf(err, errlen, "%s:%d: ncclGetUniqueId on rank 0: %s", __FILE__, __LINE__, ncclGetErrorString(rc));
    goto fail;
  }
  rc = ncclCommInitRank(&n->comm, n->base.size, id, n->base.rank);
  if (rc != ncclSuccess) {
    snprintf(err, errlen, "%s:%d: ncclCommInitRank: %s", __FILE__, __LINE__, ncclGetErrorString(rc));
    n->comm = NULL;
    goto fail;
  }
  return &n->base;
fail:
  n->failed = true; /* no NCCL yet, or a broken one: abort, and leave MPI to the exit */
  nccl_free(&n->base);
  return NULL;
}
