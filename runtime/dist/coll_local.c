/* coll_local.c: the collectives interface (dispatch, types, the rank-order
 * reduction every implementation uses on the host) and its world-size-1
 * implementation, where every collective is a copy. */
#include "coll.h"

#include "base.h"
#include "numerics.h"

#include <string.h>

static const struct {
  const char *name;
  size_t size;
} types[COLL_NTYPES] = {
    [COLL_F32] = {"f32", 4}, [COLL_F64] = {"f64", 8}, [COLL_BF16] = {"bf16", 2},
    [COLL_I64] = {"i64", 8}, [COLL_I32] = {"i32", 4},
};

size_t coll_type_size(CollType t) {
  ASSERT((unsigned)t < COLL_NTYPES);
  return types[t].size;
}

const char *coll_type_name(CollType t) {
  ASSERT((unsigned)t < COLL_NTYPES);
  return types[t].name;
}

/* ---- dispatch ----------------------------------------------------------------- */
int coll_rank(const Coll *c) { return c->rank; }
int coll_size(const Coll *c) { return c->size; }
const char *coll_name(const Coll *c) { return c->impl->name; }

int coll_reduce_scatter_sum(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  ASSERT(count >= 0 && (unsigned)t < COLL_NTYPES);
  return count ? c->impl->reduce_scatter(c, send, recv, count, t) : 0;
}

int coll_all_gather(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  ASSERT(count >= 0 && (unsigned)t < COLL_NTYPES);
  return count ? c->impl->all_gather(c, send, recv, count, t) : 0;
}

int coll_all_reduce_sum(Coll *c, void *buf, int64_t count, CollType t) {
  ASSERT(count >= 0 && (unsigned)t < COLL_NTYPES);
  return count ? c->impl->all_reduce(c, buf, count, t, COLL_SUM) : 0;
}

int coll_all_reduce_max(Coll *c, void *buf, int64_t count, CollType t) {
  ASSERT(count >= 0 && (unsigned)t < COLL_NTYPES);
  return count ? c->impl->all_reduce(c, buf, count, t, COLL_MAX) : 0;
}

int coll_broadcast(Coll *c, void *buf, int64_t bytes, int root) {
  ASSERT(bytes >= 0 && root >= 0 && root < c->size);
  return bytes ? c->impl->broadcast(c, buf, bytes, root) : 0;
}

int coll_barrier(Coll *c) { return c->impl->barrier(c); }

void coll_free(Coll *c) {
  if (c)
    c->impl->free(c);
}

void *coll_mem_alloc(Coll *c, size_t bytes) { return c->impl->mem_alloc(c, bytes); }

void coll_mem_free(Coll *c, void *p) {
  if (p)
    c->impl->mem_free(c, p);
}

int coll_mem_put(Coll *c, void *dst, const void *host_src, size_t bytes) {
  return bytes ? c->impl->mem_put(c, dst, host_src, bytes) : 0;
}

int coll_mem_get(Coll *c, void *host_dst, const void *src, size_t bytes) {
  return bytes ? c->impl->mem_get(c, host_dst, src, bytes) : 0;
}

const char *coll_algorithm(const Coll *c, CollOp op, int64_t count, CollType t) {
  return c->impl->algorithm(c, op, count, t);
}

void coll_force_algorithm(Coll *c, CollAlgo a) { c->algo = a; }
void coll_set_timeout(Coll *c, double seconds) { c->timeout = seconds > 0 ? seconds : 0; }
bool coll_threads_ok(const Coll *c) { return c->threads_ok; }
int coll_hosts(const Coll *c) { return c->hosts > 0 ? c->hosts : 1; }
void coll_set_polite(Coll *c, bool on) { c->polite = on; }

void coll_blocks(int64_t count, int size, int64_t *off, int64_t *len) {
  /* count*b/size without the product overflowing: count = q*size + m. */
  int64_t q = count / size, m = count % size;
  for (int b = 0; b <= size; b++) {
    int64_t at = q * b + m * b / size;
    if (b < size)
      off[b] = at;
    if (b > 0)
      len[b - 1] = at - off[b - 1];
  }
}

double coll_default_timeout(void) {
  const char *s = getenv("OPTC_COLL_TIMEOUT");
  double v = s ? strtod(s, NULL) : 0;
  return v > 0 ? v : 0;
}

/* ---- the rank-order reduction ------------------------------------------------------
 * A tile of elements is accumulated in a local array, rank by rank, and
 * stored at the end: the inner loops run over contiguous elements, and out
 * may be one of the inputs. Each element's sum is its own, so vector code
 * gives the same bits; the build compiles this file with -O3, which
 * vectorizes the bf16 loops (3x faster than -O2's scalar code). */
enum { TILE = 512 };

/* A sum that is NaN is stored as the canonical quiet NaN: which NaN an
 * add returns depends on its operands' order in the machine code (x86) or
 * on the device (a GPU's is 0x7fffffff). */
#define NAN_F32 (optc_bits_f32(0x7fc00000u))
#define NAN_F64 (f64_bits(0x7ff8000000000000ull))

static inline double f64_bits(uint64_t u) {
  double d;
  memcpy(&d, &u, 8);
  return d;
}

/* optc_max_nan in the element's own type, so that the result is one of
 * the inputs bit for bit (NaN payloads included). */
static inline float max_f32(float a, float b) { return a != a ? a : b != b ? b : a < b ? b : a; }
static inline double max_f64(double a, double b) { return a != a ? a : b != b ? b : a < b ? b : a; }

static void tile_f32(float *out, const void *const *in, int n, int64_t lo, int m, CollRed op) {
  float acc[TILE];
  memcpy(acc, (const float *)in[0] + lo, (size_t)m * 4);
  for (int k = 1; k < n; k++) {
    const float *x = (const float *)in[k] + lo;
    if (op == COLL_SUM)
      for (int j = 0; j < m; j++)
        acc[j] += x[j];
    else
      for (int j = 0; j < m; j++)
        acc[j] = max_f32(acc[j], x[j]);
  }
  if (op == COLL_SUM)
    for (int j = 0; j < m; j++)
      acc[j] = acc[j] != acc[j] ? NAN_F32 : acc[j];
  memcpy(out + lo, acc, (size_t)m * 4);
}

static void tile_f64(double *out, const void *const *in, int n, int64_t lo, int m, CollRed op) {
  double acc[TILE];
  memcpy(acc, (const double *)in[0] + lo, (size_t)m * 8);
  for (int k = 1; k < n; k++) {
    const double *x = (const double *)in[k] + lo;
    if (op == COLL_SUM)
      for (int j = 0; j < m; j++)
        acc[j] += x[j];
    else
      for (int j = 0; j < m; j++)
        acc[j] = max_f64(acc[j], x[j]);
  }
  if (op == COLL_SUM)
    for (int j = 0; j < m; j++)
      acc[j] = acc[j] != acc[j] ? NAN_F64 : acc[j];
  memcpy(out + lo, acc, (size_t)m * 8);
}

/* Sums in f32 and rounds once (a NaN sum is 0x7fc0); a max is one of the
 * inputs, so its bits are the widened input's top half (NaN payloads
 * included). */
static void tile_bf16(uint16_t *out, const void *const *in, int n, int64_t lo, int m, CollRed op) {
  float acc[TILE];
  const uint16_t *x = (const uint16_t *)in[0] + lo;
  for (int j = 0; j < m; j++)
    acc[j] = optc_bf16_to_f32(x[j]);
  for (int k = 1; k < n; k++) {
    x = (const uint16_t *)in[k] + lo;
    if (op == COLL_SUM)
      for (int j = 0; j < m; j++)
        acc[j] += optc_bf16_to_f32(x[j]);
    else
      for (int j = 0; j < m; j++)
        acc[j] = max_f32(acc[j], optc_bf16_to_f32(x[j]));
  }
  if (op == COLL_SUM)
    for (int j = 0; j < m; j++)
      out[lo + j] = acc[j] != acc[j] ? 0x7fc0 : optc_f32_to_bf16(acc[j]);
  else
    for (int j = 0; j < m; j++)
      out[lo + j] = (uint16_t)(optc_f32_bits(acc[j]) >> 16);
}

/* Integers wrap: the sums are taken unsigned. */
static void tile_i64(int64_t *out, const void *const *in, int n, int64_t lo, int m, CollRed op) {
  uint64_t acc[TILE];
  memcpy(acc, (const int64_t *)in[0] + lo, (size_t)m * 8);
  for (int k = 1; k < n; k++) {
    const int64_t *x = (const int64_t *)in[k] + lo;
    if (op == COLL_SUM)
      for (int j = 0; j < m; j++)
        acc[j] += (uint64_t)x[j];
    else
      for (int j = 0; j < m; j++)
        acc[j] = (int64_t)acc[j] < x[j] ? (uint64_t)x[j] : acc[j];
  }
  memcpy(out + lo, acc, (size_t)m * 8);
}

static void tile_i32(int32_t *out, const void *const *in, int n, int64_t lo, int m, CollRed op) {
  uint32_t acc[TILE];
  memcpy(acc, (const int32_t *)in[0] + lo, (size_t)m * 4);
  for (int k = 1; k < n; k++) {
    const int32_t *x = (const int32_t *)in[k] + lo;
    if (op == COLL_SUM)
      for (int j = 0; j < m; j++)
        acc[j] += (uint32_t)x[j];
    else
      for (int j = 0; j < m; j++)
        acc[j] = (int32_t)acc[j] < x[j] ? (uint32_t)x[j] : acc[j];
  }
  memcpy(out + lo, acc, (size_t)m * 4);
}

void coll_reduce_host(void *out, const void *const *in, int n, int64_t count, CollType t, CollRed op) {
  ASSERT(n >= 1);
  for (int64_t lo = 0; lo < count; lo += TILE) {
    int m = (int)MIN((int64_t)TILE, count - lo);
    switch (t) {
    case COLL_F32: tile_f32(out, in, n, lo, m, op); break;
    case COLL_F64: tile_f64(out, in, n, lo, m, op); break;
    case COLL_BF16: tile_bf16(out, in, n, lo, m, op); break;
    case COLL_I64: tile_i64(out, in, n, lo, m, op); break;
    case COLL_I32: tile_i32(out, in, n, lo, m, op); break;
    default: unreachable();
    }
  }
}

/* ---- host memory, for local and mpi ------------------------------------------------- */
void *coll_host_alloc(Coll *c, size_t bytes) {
  (void)c;
  size_t n = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, n ? n : 64);
  if (!p) {
    error("cannot allocate %zu bytes", bytes);
    return NULL;
  }
  memset(p, 0, n ? n : 64);
  return p;
}

void coll_host_free(Coll *c, void *p) {
  (void)c;
  free(p);
}

int coll_host_copy(Coll *c, void *dst, const void *src, size_t bytes) {
  (void)c;
  memmove(dst, src, bytes);
  return 0;
}

/* ---- world size 1 ------------------------------------------------------------------
 * Copies; a sum of one rank still stores a NaN as the canonical one. */
static int local_reduce_scatter(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  (void)c;
  coll_reduce_host(recv, &send, 1, count, t, COLL_SUM);
  return 0;
}

static int local_all_gather(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  (void)c;
  memmove(recv, send, (size_t)count * coll_type_size(t));
  return 0;
}

static int local_all_reduce(Coll *c, void *buf, int64_t count, CollType t, CollRed op) {
  (void)c;
  const void *in = buf;
  if (op == COLL_SUM)
    coll_reduce_host(buf, &in, 1, count, t, COLL_SUM);
  return 0;
}

static int local_broadcast(Coll *c, void *buf, int64_t bytes, int root) {
  (void)c, (void)buf, (void)bytes, (void)root;
  return 0;
}

static int local_barrier(Coll *c) {
  (void)c;
  return 0;
}

static const char *local_algorithm(const Coll *c, CollOp op, int64_t count, CollType t) {
  (void)c, (void)op, (void)count, (void)t;
  return "local:copy";
}

static void local_free(Coll *c) { free(c); }

static const CollImpl local_impl = {
    .name = "local",
    .reduce_scatter = local_reduce_scatter,
    .all_gather = local_all_gather,
    .all_reduce = local_all_reduce,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .algorithm = local_algorithm,
    .mem_alloc = coll_host_alloc,
    .mem_free = coll_host_free,
    .mem_put = coll_host_copy,
    .mem_get = coll_host_copy,
    .free = local_free,
};

/* The caller frees with coll_free. */
Coll *coll_local(void) {
  Coll *c = calloc(1, sizeof *c);
  ASSERT(c);
  *c = (Coll){.impl = &local_impl, .rank = 0, .size = 1, .timeout = coll_default_timeout(), .threads_ok = true, .hosts = 1};
  return c;
}
