/* coll.h: collectives across the ranks of a training job. One interface,
 * three implementations: coll_local.c (world size 1), coll_mpi.c (CPU ranks
 * under mpirun) and coll_nccl.c (GPU ranks, launched by mpirun as well).
 * FSDP uses two of them per step: gradients are reduce-scattered (summed)
 * into each rank's slice, and parameters all-gathered from the slices.
 *
 * Determinism. Every reduction is taken in rank order, left to right:
 *
 *   out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{N-1}[i]
 *
 * where x_k is rank k's contribution, whichever rank computes it and
 * whichever algorithm moves the data. The result is therefore a function of
 * the inputs and the world size only: the same bits on every run, on every
 * rank (an all-reduce gives all ranks the same bits), for any message size,
 * and from all three implementations.
 * - f32 and f64 add in their own type, round to nearest even at each step.
 * - bf16 is widened to f32, summed in f32 in the order above and rounded
 *   once to nearest even (optc_f32_to_bf16). Data travels as bf16; only
 *   the owner of a block accumulates.
 * - A sum that is NaN is stored as the canonical quiet NaN (f32
 *   0x7fc00000, f64 0x7ff8000000000000, bf16 0x7fc0): which NaN an add
 *   returns depends on the order of its operands in machine code (x86) or
 *   on the device (a GPU's is 0x7fffffff).
 * - i64 and i32 add modulo 2^64 and 2^32.
 * - max is m = x_0, then m = optc_max_nan(m, x_k) for k = 1..N-1: a NaN
 *   wins (the first in rank order), otherwise the larger, and of equal
 *   values (+0 and -0) the earlier. The result is always one of the inputs,
 *   bit for bit.
 *
 * The library's own reductions (MPI_Reduce_scatter_block, ncclReduceScatter)
 * are used only when coll_force_algorithm asks for them (the benchmark
 * does): they add in their own orders, and NCCL rounds bf16 at every hop.
 *
 * Calls are collective: every rank makes the same calls with the same
 * counts, types and roots, in the same order. They return when the
 * result is in place. 0, or -1 with an error printed as `FILE:LINE: CALL:
 * the library's message (rank R of N, OP)`; after an error the Coll can
 * only be freed (which then skips MPI_Finalize: it would wait for ranks
 * that may be gone), and the caller should exit non-zero (mpirun then
 * stops every other rank). Counts are elements; a count of 0 is a no-op and its
 * buffers may be NULL. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Coll Coll;

typedef enum { COLL_F32, COLL_F64, COLL_BF16, COLL_I64, COLL_I32, COLL_NTYPES } CollType;
typedef enum { COLL_SUM, COLL_MAX } CollRed;
typedef enum { COLL_OP_REDUCE_SCATTER, COLL_OP_ALL_GATHER, COLL_OP_ALL_REDUCE, COLL_OP_BROADCAST } CollOp;
/* Who moves the data: the implementation's choice, the library's collective
 * (MPI_Allgather, ncclAllGather, ...) or optc's own, built from
 * point-to-point calls. */
typedef enum { COLL_ALGO_AUTO, COLL_ALGO_LIBRARY, COLL_ALGO_OWN } CollAlgo;

/* ---- coll_local.c: the interface every implementation shares -------------- */
size_t coll_type_size(CollType t);
const char *coll_type_name(CollType t);

int coll_rank(const Coll *c);
int coll_size(const Coll *c);
const char *coll_name(const Coll *c); /* "local", "mpi" or "nccl" */

/* send: (size, count) blocks; recv: (count). Rank r receives the rank-order
 * sum of block r of every rank's send. send and recv must not overlap,
 * except on one rank of the host collectives (local, mpi), where recv may
 * be send (in place). */
int coll_reduce_scatter_sum(Coll *c, const void *send, void *recv, int64_t count, CollType t);
/* send: (count); recv: (size, count), block k from rank k. send may be
 * recv + rank * count elements (in place). */
int coll_all_gather(Coll *c, const void *send, void *recv, int64_t count, CollType t);
/* buf: (count), in place; every rank gets the same bits. max serves
 * non-finite flags and the like. */
int coll_all_reduce_sum(Coll *c, void *buf, int64_t count, CollType t);
int coll_all_reduce_max(Coll *c, void *buf, int64_t count, CollType t);
/* buf: (bytes), from root's to everyone's. */
int coll_broadcast(Coll *c, void *buf, int64_t bytes, int root);
int coll_barrier(Coll *c);
/* Frees c and what it holds; the last MPI-based Coll also finalizes MPI if
 * it initialised it. NULL is a no-op. */
void coll_free(Coll *c);

/* Where a Coll's buffers live: host memory (local, mpi) or memory on the
 * rank's GPU (nccl). coll_mem_alloc returns zeroed memory, 64-byte aligned,
 * or NULL with an error printed; the caller frees it with coll_mem_free. */
void *coll_mem_alloc(Coll *c, size_t bytes);
void coll_mem_free(Coll *c, void *p);
/* Copies between host memory and a Coll's buffer. 0, or -1 with an error printed. */
int coll_mem_put(Coll *c, void *dst, const void *host_src, size_t bytes);
int coll_mem_get(Coll *c, void *host_dst, const void *src, size_t bytes);

/* The algorithm a call of op with count elements (bytes for a broadcast)
 * of type t would use, e.g. "own:pairwise" or "library:MPI_Allgather". */
const char *coll_algorithm(const Coll *c, CollOp op, int64_t count, CollType t);
/* For benchmarks and tests: make every call use the library's collectives or
 * optc's own where both exist (AUTO restores the measured choice). Sums by
 * the library are not in rank order; bf16 sums always stay optc's own. */
void coll_force_algorithm(Coll *c, CollAlgo a);
/* A call that waits longer than this for its peers fails, naming the ranks
 * it waits for. 0 (the default, or $OPTC_COLL_TIMEOUT seconds) waits
 * forever: a rank that dies is reported by mpirun, which ends the job. */
void coll_set_timeout(Coll *c, double seconds);

/* out[i] = in[0][i] op in[1][i] op ... op in[n-1][i], in that order, as the
 * header comment defines it. out may be any in[k] (the same elements):
 * each tile of elements is read whole before it is written. */
void coll_reduce_host(void *out, const void *const *in, int n, int64_t count, CollType t, CollRed op);

/* World size 1: every collective is a copy (a sum of one rank still stores
 * a NaN as the canonical one). The caller frees with coll_free. */
Coll *coll_local(void);

/* ---- coll_mpi.c: CPU ranks under mpirun -------------------------------------
 * Initialises MPI if nobody has (and then finalizes it when the last MPI
 * Coll is freed), on a duplicate of MPI_COMM_WORLD that returns errors
 * rather than aborting. NULL with the reason in err on failure. */
Coll *coll_mpi(int *argc, char ***argv, char *err, size_t errlen);

/* ---- coll_nccl.c: GPU ranks under mpirun --------------------------------------
 * One GPU per rank: device, or when device < 0 the rank's index among the
 * ranks on its node modulo the GPUs there. The ncclUniqueId travels over
 * MPI (a coll_mpi that this Coll holds and frees). Buffers are device
 * pointers (CUdeviceptr values); calls run on the Coll's own stream and
 * return after it is synchronized. NULL with the reason in err on failure. */
Coll *coll_nccl(int *argc, char ***argv, int device, char *err, size_t errlen);

/* ---- for implementations ------------------------------------------------------ */
typedef struct {
  const char *name;
  int (*reduce_scatter)(Coll *c, const void *send, void *recv, int64_t count, CollType t);
  int (*all_gather)(Coll *c, const void *send, void *recv, int64_t count, CollType t);
  int (*all_reduce)(Coll *c, void *buf, int64_t count, CollType t, CollRed op);
  int (*broadcast)(Coll *c, void *buf, int64_t bytes, int root);
  int (*barrier)(Coll *c);
  const char *(*algorithm)(const Coll *c, CollOp op, int64_t count, CollType t);
  void *(*mem_alloc)(Coll *c, size_t bytes);
  void (*mem_free)(Coll *c, void *p);
  int (*mem_put)(Coll *c, void *dst, const void *src, size_t bytes);
  int (*mem_get)(Coll *c, void *dst, const void *src, size_t bytes);
  void (*free)(Coll *c);
} CollImpl;

/* The first member of each implementation's state. */
struct Coll {
  const CollImpl *impl;
  int rank, size;
  CollAlgo algo;
  double timeout;  /* seconds; 0: none */
  bool threads_ok; /* calls may come from any one thread at a time (coll_threads_ok) */
  int hosts;       /* the machines the ranks are on (coll_hosts) */
  bool polite;     /* waits sleep between polls (coll_set_polite) */
};

/* The machines the ranks run on (ranks that share memory count as one).
 * On one, a collective is the cores copying memory; across several the
 * network moves it while the cores do something else. */
int coll_hosts(const Coll *c);
/* Whether calls may come from another thread than the one that made c
 * (never two at once): what a communication thread beside the compute
 * needs. local: yes; mpi: when MPI gave MPI_THREAD_SERIALIZED; nccl: no. */
bool coll_threads_ok(const Coll *c);
/* Waits for peers poll with a short sleep in between instead of spinning,
 * so that a thread that waits for the network leaves the core to the
 * compute beside it (mpi; the others do not wait). */
void coll_set_polite(Coll *c, bool on);

/* Splits count elements into size blocks as all-reduce does: block b is
 * [count*b/size, count*(b+1)/size). */
void coll_blocks(int64_t count, int size, int64_t *off, int64_t *len);
/* Host memory, for local and mpi: 64-byte aligned and zeroed. */
void *coll_host_alloc(Coll *c, size_t bytes);
void coll_host_free(Coll *c, void *p);
int coll_host_copy(Coll *c, void *dst, const void *src, size_t bytes);
/* The timeout from $OPTC_COLL_TIMEOUT, or 0. */
double coll_default_timeout(void);
