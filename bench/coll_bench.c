/* coll_bench.c: reduce-scatter and all-gather bandwidth of coll_mpi.c,
 * the library's collectives (MPI_Reduce_scatter_block, MPI_Allgather)
 * against optc's own, and the one coll_mpi.c picks.
 *
 *   mpirun -np 2 coll_bench [MB ...]      (default: 64 256)
 *
 * The size is the whole buffer on each rank, as nccl-tests counts it: a
 * reduce-scatter's input and an all-gather's output, S bytes; each rank's
 * block is S/N. Times are of the slowest rank, the median and the best
 * over the iterations; the bandwidths are from the median:
 *   algbw = S / time
 *   busbw = algbw * (N-1)/N   (the bytes each rank must send or receive,
 *                             over time: nccl-tests' bus bandwidth)
 * It also checks that the library's reduce-scatter gives the same bits
 * twice, and whether they are the rank-order sum's. */
#include "base.h"
#include "coll.h"

#include "args.h"

#include <string.h>

enum { MAX_ITERS = 20 };

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Deterministic values of varied magnitude, so that the order of a sum shows. */
static void fill(void *buf, int64_t n, CollType t, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    float v = (float)((int64_t)(s >> 40) - (1 << 23)) * 0x1p-20f * (float)(1 + (s & 7) * 100);
    if (t == COLL_F32)
      ((float *)buf)[i] = v;
    else {
      uint32_t u;
      memcpy(&u, &v, 4);
      ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
    }
  }
}

typedef struct {
  Coll *c;
  bool gather; /* all-gather, else reduce-scatter */
  void *send, *recv;
  int64_t count; /* per block */
  CollType t;
} Case;

static int run_once(Case *k) {
  return k->gather ? coll_all_gather(k->c, k->send, k->recv, k->count, k->t)
                   : coll_reduce_scatter_sum(k->c, k->send, k->recv, k->count, k->t);
}

/* Seconds of the slowest rank: the median and the best of iters; -1 on error. */
static double time_case(Case *k, int iters, double *best) {
  double t[MAX_ITERS];
  if (run_once(k) != 0) /* warm-up: pages touched, connections made */
    return -1;
  for (int i = 0; i < iters; i++) {
    if (coll_barrier(k->c) != 0)
      return -1;
    double t0 = now_seconds();
    if (run_once(k) != 0)
      return -1;
    t[i] = now_seconds() - t0;
    if (coll_all_reduce_max(k->c, &t[i], 1, COLL_F64) != 0)
      return -1;
  }
  qsort(t, (size_t)iters, sizeof *t, cmp_double);
  *best = t[0];
  return t[iters / 2];
}

static double memcpy_gbs(size_t bytes) {
  char *a = malloc(bytes), *b = malloc(bytes);
  ASSERT(a && b);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double best = 1e30;
  for (int i = 0; i < 3; i++) {
    double t0 = now_seconds();
    memcpy(b, a, bytes);
    best = MIN(best, now_seconds() - t0);
  }
  free(a);
  free(b);
  return (double)bytes / best / 1e9;
}

int main(int argc, char **argv) {
  char err[512];
  Coll *c = coll_mpi(&argc, &argv, err, sizeof err);
  if (!c) {
    error("%s", err);
    return 1;
  }
  int N = coll_size(c), me = coll_rank(c);
  int64_t mbs[16];
  int nsizes = 0;
  for (int i = 1; i < argc && nsizes < 16; i++) {
    long mb;
    if (!parse_long(argv[i], 1, 1 << 20, &mb)) {
      error("coll_bench: a size is a whole number of MB from 1 to %d, not '%s'", 1 << 20, argv[i]);
      coll_free(c);
      return 2;
    }
    mbs[nsizes++] = mb;
  }
  if (nsizes == 0)
    mbs[nsizes++] = 64, mbs[nsizes++] = 256;

  if (me == 0) {
    printf("coll_bench: %d ranks; sizes are bytes per rank (the whole buffer); median of the slowest rank\n", N);
    printf("single-core memcpy, 64 MB: %.1f GB/s\n\n", memcpy_gbs(64 << 20));
    printf("%-15s %-5s %8s  %-34s %9s %9s %11s %11s\n", "op", "type", "size", "algorithm", "median ms", "best ms",
           "algbw GB/s", "busbw GB/s");
  }
  int rc = 0;
  for (int si = 0; si < nsizes && rc == 0; si++) {
    int64_t bytes = mbs[si] << 20;
    int iters = bytes <= (64 << 20) ? 9 : 5;
    for (int g = 0; g < 2 && rc == 0; g++) {
      for (int ti = 0; ti < 2 && rc == 0; ti++) {
        CollType t = ti ? COLL_BF16 : COLL_F32;
        int64_t count = bytes / (int64_t)coll_type_size(t) / N;
        void *whole = coll_mem_alloc(c, (size_t)(count * N) * coll_type_size(t));
        void *block = coll_mem_alloc(c, (size_t)count * coll_type_size(t));
        if (!whole || !block) {
          rc = 1;
          break;
        }
        fill(g ? block : whole, g ? count : count * N, t, (uint64_t)me + 1);
        Case k = {c, g == 1, g ? block : whole, g ? whole : block, count, t};
        for (int a = 0; a < 2 && rc == 0; a++) {
          CollAlgo algo = a ? COLL_ALGO_OWN : COLL_ALGO_LIBRARY;
          coll_force_algorithm(c, algo);
          const char *name = coll_algorithm(c, g ? COLL_OP_ALL_GATHER : COLL_OP_REDUCE_SCATTER, count, t);
          /* MPI has no bf16: its "library" run would be optc's own again. */
          if (algo == COLL_ALGO_LIBRARY && strncmp(name, "library", 7) != 0)
            continue;
          double best = 0, s = time_case(&k, iters, &best);
          if (s < 0) {
            rc = 1;
            break;
          }
          double alg = (double)(count * N) * (double)coll_type_size(t) / s / 1e9;
          if (me == 0)
            printf("%-15s %-5s %5lld MB  %-34s %9.2f %9.2f %11.2f %11.2f\n", g ? "all_gather" : "reduce_scatter",
                   coll_type_name(t), (long long)mbs[si], name, s * 1e3, best * 1e3, alg, alg * (N - 1) / N);
        }
        coll_force_algorithm(c, COLL_ALGO_AUTO);
        if (me == 0)
          printf("%-15s %-5s %5lld MB  coll_mpi.c uses %s\n", g ? "all_gather" : "reduce_scatter",
                 coll_type_name(t), (long long)mbs[si],
                 coll_algorithm(c, g ? COLL_OP_ALL_GATHER : COLL_OP_REDUCE_SCATTER, count, t));
        coll_mem_free(c, whole);
        coll_mem_free(c, block);
      }
    }
  }

  /* Is the library's reduce-scatter repeatable, and in rank order? */
  if (rc == 0) {
    int64_t count = (1 << 20) / N;
    float *send = coll_mem_alloc(c, (size_t)(count * N) * 4);
    float *r1 = coll_mem_alloc(c, (size_t)count * 4), *r2 = coll_mem_alloc(c, (size_t)count * 4);
    float *own = coll_mem_alloc(c, (size_t)count * 4);
    ASSERT(send && r1 && r2 && own);
    fill(send, count * N, COLL_F32, (uint64_t)me + 7);
    coll_force_algorithm(c, COLL_ALGO_LIBRARY);
    rc |= coll_reduce_scatter_sum(c, send, r1, count, COLL_F32);
    rc |= coll_reduce_scatter_sum(c, send, r2, count, COLL_F32);
    coll_force_algorithm(c, COLL_ALGO_OWN);
    rc |= coll_reduce_scatter_sum(c, send, own, count, COLL_F32);
    int flags[2] = {memcmp(r1, r2, (size_t)count * 4) != 0, memcmp(r1, own, (size_t)count * 4) != 0};
    rc |= coll_all_reduce_max(c, flags, 2, COLL_I32);
    if (rc == 0 && me == 0)
      printf("\nlibrary reduce-scatter (f32, 4 MB): same bits twice: %s; same bits as the rank-order sum: %s\n",
             flags[0] ? "no" : "yes", flags[1] ? "no" : "yes");
    coll_mem_free(c, send);
    coll_mem_free(c, r1);
    coll_mem_free(c, r2);
    coll_mem_free(c, own);
  }
  if (rc != 0)
    return 1; /* without coll_free: mpirun ends the job */
  coll_free(c);
  return 0;
}
