/* test_coll.c: the collectives against values computed here, bit for bit.
 *
 *   test_coll --local                 world size 1
 *   mpirun -np N test_coll --mpi      N CPU ranks (2 and 3: blocks that do
 *                                     and do not divide evenly)
 *   mpirun -np N test_coll --nccl     N GPU ranks (built with -DCOLL_TEST_NCCL;
 *                                     exits 77, skipped, without a GPU)
 *
 * Every rank computes every rank's inputs, so the expected results are
 * plain loops here: rank-order sums (bf16 through f32, rounded once) and
 * maxima. The checks: reduce-scatter, all-gather (also in place),
 * all-reduce sum and max (small and large paths, NaN and signed zeros),
 * broadcast from every root and barrier, for f32, bf16, f64, i64 and i32,
 * at counts that are 0, odd, and span several pipeline chunks; repeated
 * calls give the same bits, and all ranks the same all-reduce bits; the
 * library's collectives, forced, give the same results where the order
 * cannot show; and the algorithms chosen for large buffers. */
#include "base.h"
#include "coll.h"
#include "numerics.h"

#include <math.h>
#include <string.h>
#include <time.h>

static Coll *C;
static int N, ME;
static int failures;

/* ---- inputs ---------------------------------------------------------------------- */
static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Element i of rank k's input for a test seeded seed. Floats have a
 * mantissa and a binary exponent in [-12, 12], so that the order of a sum
 * changes its bits; `special` mixes in NaNs (payload naming the rank),
 * infinities and signed zeros. */
static void value(void *out, CollType t, uint64_t seed, int k, int64_t i, bool special) {
  uint64_t h = mix(seed * 1000003u + (uint64_t)k * 7919u + mix((uint64_t)i));
  double v = ldexp((double)(int64_t)(h >> 11) - 0x1p52, (int)(mix(h) % 25) - 12 - 52);
  if (special)
    switch (h % 16) {
    case 0: v = NAN; break;
    case 1: v = INFINITY; break;
    case 2: v = -INFINITY; break;
    case 3: v = 0.0; break;
    case 4: v = -0.0; break;
    default: break;
    }
  switch (t) {
  case COLL_F32: {
    float f = (float)v;
    if (f != f) {
      uint32_t u = 0x7fc00000u | (uint32_t)(k + 1); /* a payload per rank */
      memcpy(&f, &u, 4);
    }
    memcpy(out, &f, 4);
    break;
  }
  case COLL_F64: {
    if (v != v) {
      uint64_t u = 0x7ff8000000000000ull | (uint64_t)(k + 1);
      memcpy(&v, &u, 8);
    }
    memcpy(out, &v, 8);
    break;
  }
  case COLL_BF16: {
    uint16_t b = v != v ? (uint16_t)(0x7fc0 | (k + 1)) : optc_f32_to_bf16((float)v);
    memcpy(out, &b, 2);
    break;
  }
  case COLL_I64: {
    int64_t x = (int64_t)h; /* sums wrap */
    memcpy(out, &x, 8);
    break;
  }
  case COLL_I32: {
    int32_t x = (int32_t)(uint32_t)h;
    memcpy(out, &x, 4);
    break;
  }
  default: unreachable();
  }
}

static void fill(void *buf, CollType t, uint64_t seed, int k, int64_t from, int64_t n, bool special) {
  size_t es = coll_type_size(t);
  for (int64_t i = 0; i < n; i++)
    value((char *)buf + (size_t)i * es, t, seed, k, from + i, special);
}

/* ---- the expected results: plain rank-order loops --------------------------------- */
/* The larger of a and b; a NaN wins, the first one; of equal values, a. */
static bool takes_over(double a, double b) { return a == a && (b != b || a < b); }

/* out = x_0 op x_1 op ... op x_{N-1} at global element index i. */
static void expect_elem(void *out, CollType t, CollRed op, uint64_t seed, int64_t i, bool special) {
  size_t es = coll_type_size(t);
  char x[8], win[8];
  float fa = 0;
  double da = 0;
  uint64_t ua = 0;
  for (int k = 0; k < N; k++) {
    value(x, t, seed, k, i, special);
    float f;
    double d;
    uint16_t b;
    int64_t i64;
    int32_t i32;
    bool take = k == 0;
    switch (t) {
    case COLL_F32:
      memcpy(&f, x, 4);
      if (op == COLL_SUM)
        fa = k == 0 ? f : fa + f;
      else
        take |= takes_over(fa, f), fa = take ? f : fa;
      break;
    case COLL_F64:
      memcpy(&d, x, 8);
      if (op == COLL_SUM)
        da = k == 0 ? d : da + d;
      else
        take |= takes_over(da, d), da = take ? d : da;
      break;
    case COLL_BF16: /* widened to f32, summed there */
      memcpy(&b, x, 2);
      f = optc_bf16_to_f32(b);
      if (op == COLL_SUM)
        fa = k == 0 ? f : fa + f;
      else
        take |= takes_over(fa, f), fa = take ? f : fa;
      break;
    case COLL_I64:
      memcpy(&i64, x, 8);
      if (op == COLL_SUM)
        ua = k == 0 ? (uint64_t)i64 : ua + (uint64_t)i64;
      else
        take |= (int64_t)ua < i64, ua = take ? (uint64_t)i64 : ua;
      break;
    case COLL_I32:
      memcpy(&i32, x, 4);
      if (op == COLL_SUM)
        ua = k == 0 ? (uint32_t)i32 : (uint32_t)(ua + (uint32_t)i32);
      else
        take |= (int32_t)(uint32_t)ua < i32, ua = take ? (uint32_t)i32 : ua;
      break;
    default: unreachable();
    }
    if (take)
      memcpy(win, x, es); /* a max is one of the inputs, bit for bit */
  }
  if (op == COLL_MAX) {
    memcpy(out, win, es);
    return;
  }
  /* A NaN sum is the canonical NaN. */
  uint32_t nan32 = 0x7fc00000u;
  uint64_t nan64 = 0x7ff8000000000000ull;
  switch (t) {
  case COLL_F32: memcpy(out, fa != fa ? (void *)&nan32 : (void *)&fa, 4); break;
  case COLL_F64: memcpy(out, da != da ? (void *)&nan64 : (void *)&da, 8); break;
  case COLL_BF16: {
    uint16_t r = fa != fa ? 0x7fc0 : optc_f32_to_bf16(fa); /* rounded once */
    memcpy(out, &r, 2);
    break;
  }
  case COLL_I64: memcpy(out, &ua, 8); break;
  case COLL_I32: {
    uint32_t r = (uint32_t)ua;
    memcpy(out, &r, 4);
    break;
  }
  default: unreachable();
  }
}

/* ---- checking --------------------------------------------------------------------- */
static void hexbits(char *s, const void *p, size_t es) {
  uint64_t u = 0;
  memcpy(&u, p, es);
  snprintf(s, 24, "0x%0*llx", (int)(2 * es), (unsigned long long)u);
}

/* Compares n elements of got with want bit for bit; reports the first
 * difference and how many there are. */
static bool same(const char *what, CollType t, int64_t count, const void *got, const void *want, int64_t n) {
  size_t es = coll_type_size(t);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    const char *g = (const char *)got + (size_t)i * es, *w = (const char *)want + (size_t)i * es;
    if (memcmp(g, w, es) != 0)
      bad++, first = first < 0 ? i : first;
  }
  if (bad == 0)
    return true;
  char g[24], w[24];
  hexbits(g, (const char *)got + (size_t)first * es, es);
  hexbits(w, (const char *)want + (size_t)first * es, es);
  fprintf(stderr, "FAIL rank %d of %d: %s %s count %lld: %lld of %lld elements differ, first at %lld: got %s, want %s\n",
          ME, N, what, coll_type_name(t), (long long)count, (long long)bad, (long long)n, (long long)first, g, w);
  failures++;
  return false;
}

static void check(bool ok, const char *fmt, ...) PRINTF(2, 3);
static void check(bool ok, const char *fmt, ...) {
  if (ok)
    return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL rank %d of %d: ", ME, N);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures++;
}

/* A Coll buffer of bytes holding host's contents (NULL for 0 bytes, which
 * the collectives must accept). */
static void *dev_from(const void *host, size_t bytes) {
  if (bytes == 0)
    return NULL;
  void *d = coll_mem_alloc(C, bytes);
  ASSERT(d);
  if (coll_mem_put(C, d, host, bytes) != 0)
    exit(1);
  return d;
}

static void to_host(void *host, const void *dev, size_t bytes) {
  if (coll_mem_get(C, host, dev, bytes) != 0)
    exit(1);
}

static void must(int rc) {
  if (rc != 0)
    exit(1); /* the error is printed; mpirun ends the others */
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ASSERT(p);
  return p;
}

static const CollType all_types[] = {COLL_F32, COLL_BF16, COLL_F64, COLL_I64, COLL_I32};

/* ---- the tests -------------------------------------------------------------------- */
static void test_reduce_scatter(CollType t, int64_t count, uint64_t seed) {
  size_t es = coll_type_size(t), whole = (size_t)(count * N) * es, block = (size_t)count * es;
  char *in = xmalloc(whole), *want = xmalloc(block), *got = xmalloc(block), *again = xmalloc(block);
  fill(in, t, seed, ME, 0, count * N, false);
  for (int64_t i = 0; i < count; i++)
    expect_elem(want + (size_t)i * es, t, COLL_SUM, seed, ME * count + i, false);
  void *dsend = dev_from(in, whole), *drecv = dev_from(got, block);
  must(coll_reduce_scatter_sum(C, dsend, drecv, count, t));
  to_host(got, drecv, block);
  same("reduce_scatter", t, count, got, want, count);
  must(coll_reduce_scatter_sum(C, dsend, drecv, count, t));
  to_host(again, drecv, block);
  same("reduce_scatter (repeated)", t, count, again, got, count);
  coll_mem_free(C, dsend), coll_mem_free(C, drecv);
  free(in), free(want), free(got), free(again);
}

static void test_all_gather(CollType t, int64_t count, uint64_t seed, bool in_place) {
  size_t es = coll_type_size(t), whole = (size_t)(count * N) * es, block = (size_t)count * es;
  char *want = xmalloc(whole), *got = xmalloc(whole);
  for (int k = 0; k < N; k++)
    fill(want + (size_t)(k * count) * es, t, seed, k, 0, count, false);
  void *drecv, *dsend;
  if (in_place) {
    memset(got, 0, whole);
    memcpy(got + (size_t)(ME * count) * es, want + (size_t)(ME * count) * es, block);
    drecv = dev_from(got, whole);
    dsend = drecv ? (char *)drecv + (size_t)(ME * count) * es : NULL;
  } else {
    memset(got, 0, whole);
    drecv = dev_from(got, whole);
    dsend = dev_from(want + (size_t)(ME * count) * es, block);
  }
  must(coll_all_gather(C, dsend, drecv, count, t));
  to_host(got, drecv, whole);
  same(in_place ? "all_gather (in place)" : "all_gather", t, count, got, want, count * N);
  if (!in_place)
    coll_mem_free(C, dsend);
  coll_mem_free(C, drecv);
  free(want), free(got);
}

static void test_all_reduce(CollType t, CollRed op, int64_t count, uint64_t seed, bool special) {
  size_t es = coll_type_size(t), bytes = (size_t)count * es;
  char *in = xmalloc(bytes), *want = xmalloc(bytes), *got = xmalloc(bytes), *r0 = xmalloc(bytes);
  const char *name = op == COLL_SUM ? "all_reduce_sum" : "all_reduce_max";
  fill(in, t, seed, ME, 0, count, special);
  for (int64_t i = 0; i < count; i++)
    expect_elem(want + (size_t)i * es, t, op, seed, i, special);
  void *d = dev_from(in, bytes);
  must(op == COLL_SUM ? coll_all_reduce_sum(C, d, count, t) : coll_all_reduce_max(C, d, count, t));
  to_host(got, d, bytes);
  same(name, t, count, got, want, count);
  /* Every rank has rank 0's bits. */
  must(coll_broadcast(C, d, (int64_t)bytes, 0));
  to_host(r0, d, bytes);
  same("all_reduce result against rank 0's", t, count, got, r0, count);
  /* And the same again. */
  must(coll_mem_put(C, d, in, bytes));
  must(op == COLL_SUM ? coll_all_reduce_sum(C, d, count, t) : coll_all_reduce_max(C, d, count, t));
  to_host(r0, d, bytes);
  same("all_reduce (repeated)", t, count, r0, got, count);
  coll_mem_free(C, d);
  free(in), free(want), free(got), free(r0);
}

static void test_broadcast(int64_t bytes, int root, uint64_t seed) {
  char *want = xmalloc((size_t)bytes), *got = xmalloc((size_t)bytes);
  for (int64_t i = 0; i < bytes; i++)
    want[i] = (char)mix(seed + (uint64_t)i);
  if (ME == root)
    memcpy(got, want, (size_t)bytes);
  else
    memset(got, 0, (size_t)bytes);
  void *d = dev_from(got, (size_t)bytes);
  must(coll_broadcast(C, d, bytes, root));
  to_host(got, d, (size_t)bytes);
  check(bytes == 0 || memcmp(got, want, (size_t)bytes) == 0, "broadcast of %lld bytes from %d differs",
        (long long)bytes, root);
  coll_mem_free(C, d);
  free(want), free(got);
}

/* Rank 0 arrives 0.2 s late: nobody may leave before. */
static void test_barrier(void) {
  must(coll_barrier(C));
  double t0 = now_seconds();
  if (ME == 0)
    nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
  must(coll_barrier(C));
  double waited = now_seconds() - t0;
  check(N == 1 || waited >= 0.19, "barrier returned after %.3f s, before rank 0 arrived (0.2 s)", waited);
}

/* Small integers sum exactly in any order, so the library's reductions
 * must agree with the rank-order ones; data movement must agree always. */
static void test_forced_library(void) {
  int64_t count = 70001;
  size_t bytes = (size_t)count * 4;
  float *in = xmalloc(bytes * (size_t)N), *a = xmalloc(bytes), *b = xmalloc(bytes);
  for (int64_t i = 0; i < count * N; i++)
    in[i] = (float)((int64_t)(mix((uint64_t)(ME * 31 + 1) * 1000003u + (uint64_t)i) % 2001) - 1000);
  void *dsend = dev_from(in, bytes * (size_t)N), *drecv = dev_from(a, bytes);
  for (int k = 0; k < 2; k++) {
    coll_force_algorithm(C, k ? COLL_ALGO_OWN : COLL_ALGO_LIBRARY);
    must(coll_reduce_scatter_sum(C, dsend, drecv, count, COLL_F32));
    to_host(k ? b : a, drecv, bytes);
  }
  same("reduce_scatter library against own", COLL_F32, count, a, b, count);
  for (int k = 0; k < 2; k++) {
    coll_force_algorithm(C, k ? COLL_ALGO_OWN : COLL_ALGO_LIBRARY);
    must(coll_mem_put(C, drecv, in, bytes));
    must(coll_all_reduce_sum(C, drecv, count, COLL_F32));
    to_host(k ? b : a, drecv, bytes);
  }
  same("all_reduce library against own", COLL_F32, count, a, b, count);
  coll_force_algorithm(C, COLL_ALGO_LIBRARY);
  test_all_gather(COLL_F32, count, 77, false);
  test_all_gather(COLL_BF16, 3, 78, true);
  coll_force_algorithm(C, COLL_ALGO_AUTO);
  coll_mem_free(C, dsend), coll_mem_free(C, drecv);
  free(in), free(a), free(b);
}

/* What each implementation uses for 64 MB (coll_bench.c measured why). */
static void test_algorithms(void) {
  int64_t big = (64 << 20) / 4 / N;
  const char *rs = coll_algorithm(C, COLL_OP_REDUCE_SCATTER, big, COLL_F32);
  const char *ag = coll_algorithm(C, COLL_OP_ALL_GATHER, big, COLL_F32);
  const char *ar = coll_algorithm(C, COLL_OP_ALL_REDUCE, big * N, COLL_F32);
  const char *want_rs = "local:copy", *want_ag = "local:copy", *want_ar = "local:copy";
  if (strcmp(coll_name(C), "mpi") == 0) {
    want_rs = "own:pairwise";
    want_ag = "library:MPI_Allgather";
    want_ar = "own:pairwise reduce_scatter+all_gather";
  } else if (strcmp(coll_name(C), "nccl") == 0) {
    want_rs = "own:ncclSend/ncclRecv+sum";
    want_ag = "library:ncclAllGather";
    want_ar = "own:ncclSend/ncclRecv+sum, ncclBroadcast";
  }
  check(strcmp(rs, want_rs) == 0, "64 MB reduce_scatter uses %s, expected %s", rs, want_rs);
  check(strcmp(ag, want_ag) == 0, "64 MB all_gather uses %s, expected %s", ag, want_ag);
  check(strcmp(ar, want_ar) == 0, "64 MB all_reduce uses %s, expected %s", ar, want_ar);
  coll_force_algorithm(C, COLL_ALGO_LIBRARY);
  check(N == 1 || strncmp(coll_algorithm(C, COLL_OP_REDUCE_SCATTER, big, COLL_BF16), "own", 3) == 0,
        "bf16 sums must stay optc's own when the library is forced");
  coll_force_algorithm(C, COLL_ALGO_AUTO);
}

int main(int argc, char **argv) {
  char err[512] = "";
  const char *mode = argc > 1 ? argv[1] : "--local";
  if (strcmp(mode, "--local") == 0)
    C = coll_local();
  else if (strcmp(mode, "--mpi") == 0)
    C = coll_mpi(&argc, &argv, err, sizeof err);
#ifdef COLL_TEST_NCCL
  else if (strcmp(mode, "--nccl") == 0) {
    C = coll_nccl(&argc, &argv, -1, err, sizeof err);
    if (!C && strstr(err, "no GPU")) {
      printf("skipped: %s\n", err);
      return 77;
    }
  }
#endif
  else {
    fprintf(stderr, "usage: test_coll --local | --mpi | --nccl\n");
    return 2;
  }
  if (!C) {
    error("%s", err);
    return 1;
  }
  N = coll_size(C), ME = coll_rank(C);
  double t0 = now_seconds();

  uint64_t seed = 1;
  const int64_t rs_counts[] = {0, 1, 2, 3, 7, 100, 4097, 65537, 140001};
  const int64_t ag_counts[] = {0, 1, 3, 1000, 65537};
  /* Small (gathered) and large (reduce-scattered) all-reduces, and counts
   * below, at and above the world size. */
  const int64_t ar_counts[] = {0, 1, 2, 3, 5, 1000, 5001, 16411, 300007};
  for (size_t ti = 0; ti < ARRAY_LEN(all_types); ti++) {
    CollType t = all_types[ti];
    for (size_t i = 0; i < ARRAY_LEN(rs_counts); i++)
      test_reduce_scatter(t, rs_counts[i], seed++);
    for (size_t i = 0; i < ARRAY_LEN(ag_counts); i++) {
      test_all_gather(t, ag_counts[i], seed++, false);
      test_all_gather(t, ag_counts[i], seed++, true);
    }
    for (size_t i = 0; i < ARRAY_LEN(ar_counts); i++) {
      test_all_reduce(t, COLL_SUM, ar_counts[i], seed++, false);
      test_all_reduce(t, COLL_MAX, ar_counts[i], seed++, true);
    }
  }
  /* NaN, infinities and signed zeros in sums. */
  test_all_reduce(COLL_BF16, COLL_SUM, 40000, seed++, true);
  test_all_reduce(COLL_F64, COLL_SUM, 40000, seed++, true);
  test_all_reduce(COLL_F32, COLL_SUM, 40000, seed++, true);
  /* A large buffer: 16 MB per rank, many chunks. */
  test_reduce_scatter(COLL_F32, (4 << 20) / N + 1, seed++);
  test_reduce_scatter(COLL_BF16, (4 << 20) / N + 3, seed++);

  const int64_t bc_bytes[] = {0, 1, 13, 100003, (3 << 20) + 5};
  for (int root = 0; root < N; root++)
    for (size_t i = 0; i < ARRAY_LEN(bc_bytes); i++)
      test_broadcast(bc_bytes[i], root, seed++);
  test_barrier();
  test_forced_library();
  test_algorithms();

  /* Everyone passes, or the job fails. */
  int bad = failures;
  must(coll_all_reduce_max(C, &bad, 1, COLL_I32));
  if (ME == 0)
    printf("%s: %d rank%s, %s (%.2f s)\n", coll_name(C), N, N == 1 ? "" : "s", bad ? "FAILED" : "all checks passed",
           now_seconds() - t0);
  coll_free(C);
  return bad ? 1 : 0;
}
