/* coll_mpi.c: collectives for CPU ranks under mpirun (Open MPI 4.1).
 *
 * Reductions are optc's own, built from nonblocking point-to-point calls,
 * so that they sum in rank order (coll.h) and move bf16 as bf16:
 * - reduce-scatter, "pairwise": every rank sends block p of its input to
 *   rank p, and rank p adds the N contributions to its block, x_0 first.
 *   Blocks go in chunks of CHUNK_BYTES per peer, two chunks in flight: the
 *   next chunk is posted before the current one is summed. Each rank sends
 *   and receives (N-1)/N of its input, as a ring does, but a ring's partial
 *   sums start at a different rank for every block.
 * - all-reduce: the same reduce-scatter over blocks of count*b/N elements
 *   followed by an all-gather; small ones (N * bytes <= SMALL_ALL_REDUCE)
 *   gather every rank's buffer with MPI_Allgather and sum on every rank.
 * Data movement has no order to keep: all-gather, broadcast and barrier
 * are the library's (MPI_Allgather, MPI_Bcast, MPI_Barrier). optc's own
 * all-gather (each rank's block straight to every other rank) measured
 * as fast as MPI_Allgather (bench/results.md, "Collectives").
 *
 * Open MPI 4.1's MPI_Reduce_scatter_block is deterministic from run to run
 * (its algorithm is a fixed function of the world size and the count: the
 * benchmark sees the same bits twice), but its order is not rank order
 * from 3 ranks on, and it measured several times slower than the pairwise
 * one (bench/results.md); it runs only when forced.
 *
 * Errors: the communicator returns them (MPI_ERRORS_RETURN), and each is
 * printed with file:line, the call and MPI_Error_string. A rank that dies
 * (kill -9, or exiting non-zero after an error) makes mpirun end the job
 * within about a second, naming the rank and its exit code or signal
 * ("mpirun noticed that process rank 1 ... exited on signal 9"), and
 * mpirun exits non-zero (137, or the rank's code); the others are killed
 * wherever they wait. A rank that hangs but lives is caught only by the
 * timeout (coll_set_timeout, $OPTC_COLL_TIMEOUT): the waiting ranks fail,
 * naming the ranks they wait for, exit non-zero, and mpirun ends the job. */
#include "coll.h"

#include "base.h"

#include <limits.h>
#include <mpi.h>
#include <string.h>
#include <math.h>
#include <time.h>

enum {
  /* Per peer and pipeline stage of a reduce-scatter: well inside L2 (1 MB
   * here), and not so small that each message's cost shows; 128 to 512 KB
   * measured alike (bench/results.md, "Collectives"). */
  CHUNK_BYTES = 256 << 10,
  PIECE_BYTES = 1 << 30,       /* the largest single message: MPI counts are int */
  SMALL_ALL_REDUCE = 64 << 10, /* gather-and-sum all-reduce up to size*count bytes */
  TAG_RS = 1,
  TAG_AG = 2,
};

typedef struct {
  Coll base;
  MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD that returns errors */
  const char *op; /* the collective in progress, for messages */
  bool failed;    /* some call failed: the peers may be gone */
  char *stage;    /* (2, size, CHUNK_BYTES): the reduce-scatter's receive chunks */
  char *small;    /* (SMALL_ALL_REDUCE): a small all-reduce's gathered buffers */
  MPI_Request *reqs; /* (2, 2 * size): two pipeline stages of requests */
  int *peer;         /* (2, 2 * size): the rank each request waits for; -1: any */
  int64_t *off, *len; /* (size + 1): blocks */
  const void **in;    /* (size): the inputs of a reduction, in rank order */
} CollMpi;

static int live;      /* MPI Colls not yet freed */
static bool we_init;  /* MPI_Init was ours, so MPI_Finalize is too */

static CollMpi *as_mpi(Coll *c) { return (CollMpi *)c; }

static int mpi_fail(CollMpi *m, const char *file, int line, const char *call, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, msg, &n) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  m->failed = true;
  error("%s:%d: %.*s: %s (rank %d of %d, %s)", file, line, (int)strcspn(call, "("), call, msg,
        m->base.rank, m->base.size, m->op);
  return -1;
}

#define MPI_CHECK(m, call) \
  do { \
    int rc_ = (call); \
    if (rc_ != MPI_SUCCESS) \
      return mpi_fail(m, __FILE__, __LINE__, #call, rc_); \
  } while (0)

/* The MPI type of t, or MPI_DATATYPE_NULL where MPI has none (bf16). */
static MPI_Datatype mpi_type(CollType t) {
  switch (t) {
  case COLL_F32: return MPI_FLOAT;
  case COLL_F64: return MPI_DOUBLE;
  case COLL_I64: return MPI_INT64_T;
  case COLL_I32: return MPI_INT32_T;
  case COLL_BF16: return MPI_DATATYPE_NULL;
  default: unreachable();
  }
}

/* ---- waiting, with the optional timeout --------------------------------------------- */
static int wait_all(CollMpi *m, int n, MPI_Request *reqs, const int *peer) {
  if (n == 0)
    return 0;
  if (m->base.timeout <= 0 && !m->base.polite) {
    MPI_CHECK(m, MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE));
    return 0;
  }
  double deadline = m->base.timeout > 0 ? now_seconds() + m->base.timeout : INFINITY;
  long nap = 2000; /* ns: doubling to 0.5 ms, so that a long wait wakes rarely */
  for (;;) {
    int done = 0;
    MPI_CHECK(m, MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done)
      return 0;
    if (now_seconds() > deadline)
      break;
    if (m->base.polite) { /* leave the core to the compute beside this thread */
      nanosleep(&(struct timespec){0, nap}, NULL);
      nap = MIN(2 * nap, 500000L);
    }
  }
  /* Name the ranks whose requests are still pending. */
  Buf b = {0};
  for (int i = 0; i < n; i++) {
    int done = 0;
    if (MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done)
      continue;
    if (peer[i] < 0) {
      buf_printf(&b, "%sthe other ranks", b.len ? ", " : "");
      break;
    }
    bool seen = false; /* among the pending: MPI_Test nulled the done */
    for (int j = 0; j < i; j++)
      seen |= reqs[j] != MPI_REQUEST_NULL && peer[j] == peer[i];
    if (!seen)
      buf_printf(&b, "%srank %d", b.len ? ", " : "", peer[i]);
  }
  m->failed = true;
  error("%s:%d: timed out after %g s waiting for %s (rank %d of %d, %s)", __FILE__, __LINE__,
        m->base.timeout, b.len ? b.data : "?", m->base.rank, m->base.size, m->op);
  buf_free(&b);
  return -1;
}

/* ---- reduce-scatter: pairwise, in rank order ----------------------------------------- */
typedef struct {
  CollMpi *m;
  const char *send;
  int64_t elems; /* per chunk */
  size_t es;
} RsPlan;

static char *stage_slot(CollMpi *m, int set, int p) {
  return m->stage + ((size_t)set * (size_t)m->base.size + (size_t)p) * CHUNK_BYTES;
}

/* Posts chunk k: its receives from every peer into stage set k % 2, and
 * chunk k of block p to each rank p. */
static int rs_post(RsPlan *pl, int64_t k, int *nreq) {
  CollMpi *m = pl->m;
  int N = m->base.size, r = m->base.rank, set = (int)(k % 2), n = 0;
  MPI_Request *reqs = m->reqs + set * 2 * N;
  int *peer = m->peer + set * 2 * N;
  int64_t at = k * pl->elems;
  if (at < m->len[r]) {
    int bytes = (int)((size_t)MIN(pl->elems, m->len[r] - at) * pl->es);
    for (int s = 1; s < N; s++) {
      int p = (r - s + N) % N;
      peer[n] = p;
      MPI_CHECK(m, MPI_Irecv(stage_slot(m, set, p), bytes, MPI_BYTE, p, TAG_RS, m->comm, &reqs[n++]));
    }
  }
  for (int s = 1; s < N; s++) {
    int p = (r + s) % N;
    if (at >= m->len[p])
      continue;
    int bytes = (int)((size_t)MIN(pl->elems, m->len[p] - at) * pl->es);
    peer[n] = p;
    MPI_CHECK(m, MPI_Isend(pl->send + (size_t)(m->off[p] + at) * pl->es, bytes, MPI_BYTE, p, TAG_RS,
                           m->comm, &reqs[n++]));
  }
  *nreq = n;
  return 0;
}

/* recv = the rank-order reduction of block r (m->off, m->len, elements) of
 * every rank's send. recv may be send's own block (in place). */
static int rs_own(CollMpi *m, const void *send, void *recv, CollType t, CollRed op) {
  int N = m->base.size, r = m->base.rank;
  RsPlan pl = {m, send, (int64_t)(CHUNK_BYTES / coll_type_size(t)), coll_type_size(t)};
  int64_t maxlen = 0;
  for (int b = 0; b < N; b++)
    maxlen = MAX(maxlen, m->len[b]);
  int64_t nchunks = (maxlen + pl.elems - 1) / pl.elems;
  int nreq[2] = {0, 0};
  if (nchunks > 0 && rs_post(&pl, 0, &nreq[0]) != 0)
    return -1;
  for (int64_t k = 0; k < nchunks; k++) {
    int set = (int)(k % 2);
    if (k + 1 < nchunks && rs_post(&pl, k + 1, &nreq[1 - set]) != 0)
      return -1;
    if (wait_all(m, nreq[set], m->reqs + set * 2 * N, m->peer + set * 2 * N) != 0)
      return -1;
    int64_t at = k * pl.elems;
    if (at >= m->len[r])
      continue;
    for (int p = 0; p < N; p++)
      m->in[p] = p == r ? pl.send + (size_t)(m->off[r] + at) * pl.es : stage_slot(m, set, p);
    coll_reduce_host((char *)recv + (size_t)at * pl.es, m->in, N, MIN(pl.elems, m->len[r] - at), t, op);
  }
  return 0;
}

/* ---- all-gather: pairwise ------------------------------------------------------------
 * Block b is m->off[b], m->len[b] bytes of recv; this rank's comes from
 * send (which may be recv's own block). */
static int ag_own(CollMpi *m, const void *send, void *recv) {
  int N = m->base.size, r = m->base.rank;
  char *out = recv;
  const char *mine = send;
  int64_t maxlen = 0;
  for (int b = 0; b < N; b++)
    maxlen = MAX(maxlen, m->len[b]);
  for (int64_t at = 0; at < maxlen; at += PIECE_BYTES) {
    int n = 0;
    for (int s = 1; s < N; s++) {
      int p = (r - s + N) % N;
      if (at >= m->len[p])
        continue;
      m->peer[n] = p;
      MPI_CHECK(m, MPI_Irecv(out + m->off[p] + at, (int)MIN((int64_t)PIECE_BYTES, m->len[p] - at), MPI_BYTE, p,
                             TAG_AG, m->comm, &m->reqs[n++]));
    }
    for (int s = 1; s < N && at < m->len[r]; s++) {
      int p = (r + s) % N;
      m->peer[n] = p;
      MPI_CHECK(m, MPI_Isend(mine + at, (int)MIN((int64_t)PIECE_BYTES, m->len[r] - at), MPI_BYTE, p, TAG_AG,
                             m->comm, &m->reqs[n++]));
    }
    if (wait_all(m, n, m->reqs, m->peer) != 0)
      return -1;
  }
  if (mine != out + m->off[r])
    memmove(out + m->off[r], mine, (size_t)m->len[r]);
  return 0;
}

/* ---- the collectives --------------------------------------------------------------- */
/* The library's collectives take int counts; beyond, optc's own run. */
static bool library_can(CollType t, int64_t count) {
  return mpi_type(t) != MPI_DATATYPE_NULL && count <= INT_MAX;
}

/* The library's all-gather unless optc's own is forced (or the bytes are
 * beyond an int): the two measured alike (bench/results.md), and the
 * library's has latency-bound algorithms for small messages and many
 * ranks. */
static bool ag_library(const Coll *c, int64_t count, CollType t) {
  return c->algo != COLL_ALGO_OWN && count * (int64_t)coll_type_size(t) <= INT_MAX;
}

static bool reduce_library(const Coll *c, int64_t count, CollType t) {
  return c->algo == COLL_ALGO_LIBRARY && library_can(t, count);
}

/* A library collective: blocking, or nonblocking and waited for when a
 * timeout is set. */
#define LIBRARY_CALL(m, blocking, nonblocking, ...) \
  do { \
    if ((m)->base.timeout <= 0) { \
      MPI_CHECK(m, blocking(__VA_ARGS__)); \
    } else { \
      MPI_CHECK(m, nonblocking(__VA_ARGS__, &(m)->reqs[0])); \
      (m)->peer[0] = -1; \
      if (wait_all(m, 1, (m)->reqs, (m)->peer) != 0) \
        return -1; \
    } \
  } while (0)

static int mpi_reduce_scatter(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  CollMpi *m = as_mpi(c);
  m->op = "reduce_scatter";
  if (c->size == 1) { /* as the local collective: in place or not (fsdp's one-rank grads are) */
    coll_reduce_host(recv, &send, 1, count, t, COLL_SUM);
    return 0;
  }
  if (reduce_library(c, count, t)) {
    LIBRARY_CALL(m, MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, send, recv, (int)count, mpi_type(t), MPI_SUM, m->comm);
    return 0;
  }
  for (int b = 0; b < c->size; b++)
    m->off[b] = b * count, m->len[b] = count;
  return rs_own(m, send, recv, t, COLL_SUM);
}

static int mpi_all_gather(Coll *c, const void *send, void *recv, int64_t count, CollType t) {
  CollMpi *m = as_mpi(c);
  size_t es = coll_type_size(t);
  m->op = "all_gather";
  if (ag_library(c, count, t)) {
    /* Bytes: MPI has no bf16, and moving data needs none. */
    int bytes = (int)((size_t)count * es);
    const void *src = send == (char *)recv + (size_t)(c->rank * count) * es ? MPI_IN_PLACE : send;
    LIBRARY_CALL(m, MPI_Allgather, MPI_Iallgather, src, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, m->comm);
    return 0;
  }
  for (int b = 0; b < c->size; b++)
    m->off[b] = b * count * (int64_t)es, m->len[b] = count * (int64_t)es;
  return ag_own(m, send, recv);
}

static int mpi_all_reduce(Coll *c, void *buf, int64_t count, CollType t, CollRed op) {
  CollMpi *m = as_mpi(c);
  int N = c->size;
  size_t es = coll_type_size(t);
  m->op = op == COLL_SUM ? "all_reduce_sum" : "all_reduce_max";
  if (reduce_library(c, count, t)) {
    LIBRARY_CALL(m, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, buf, (int)count, mpi_type(t), op == COLL_SUM ? MPI_SUM : MPI_MAX,
                 m->comm);
    return 0;
  }
  size_t bytes = (size_t)count * es;
  if ((size_t)N * bytes <= SMALL_ALL_REDUCE) {
    LIBRARY_CALL(m, MPI_Allgather, MPI_Iallgather, buf, (int)bytes, MPI_BYTE, m->small, (int)bytes, MPI_BYTE, m->comm);
    for (int p = 0; p < N; p++)
      m->in[p] = m->small + (size_t)p * bytes;
    coll_reduce_host(buf, m->in, N, count, t, op);
    return 0;
  }
  coll_blocks(count, N, m->off, m->len);
  if (rs_own(m, buf, (char *)buf + (size_t)m->off[c->rank] * es, t, op) != 0)
    return -1;
  for (int b = 0; b < N; b++)
    m->off[b] *= (int64_t)es, m->len[b] *= (int64_t)es;
  return ag_own(m, (char *)buf + m->off[c->rank], buf);
}

static int mpi_broadcast(Coll *c, void *buf, int64_t bytes, int root) {
  CollMpi *m = as_mpi(c);
  m->op = "broadcast";
  for (int64_t at = 0; at < bytes; at += PIECE_BYTES)
    LIBRARY_CALL(m, MPI_Bcast, MPI_Ibcast, (char *)buf + at, (int)MIN((int64_t)PIECE_BYTES, bytes - at), MPI_BYTE, root, m->comm);
  return 0;
}

static int mpi_barrier(Coll *c) {
  CollMpi *m = as_mpi(c);
  m->op = "barrier";
  LIBRARY_CALL(m, MPI_Barrier, MPI_Ibarrier, m->comm);
  return 0;
}

static const char *mpi_algorithm(const Coll *c, CollOp op, int64_t count, CollType t) {
  switch (op) {
  case COLL_OP_REDUCE_SCATTER:
    return reduce_library(c, count, t) ? "library:MPI_Reduce_scatter_block" : "own:pairwise";
  case COLL_OP_ALL_GATHER:
    return ag_library(c, count, t) ? "library:MPI_Allgather" : "own:pairwise";
  case COLL_OP_ALL_REDUCE:
    if (reduce_library(c, count, t))
      return "library:MPI_Allreduce";
    return (size_t)c->size * (size_t)count * coll_type_size(t) <= SMALL_ALL_REDUCE
               ? "own:allgather+sum"
               : "own:pairwise reduce_scatter+all_gather";
  case COLL_OP_BROADCAST: return "library:MPI_Bcast";
  }
  unreachable();
}

static void mpi_free(Coll *c) {
  CollMpi *m = as_mpi(c);
  /* After a failure the peers may be gone, and MPI_Comm_free and
   * MPI_Finalize wait for them: the process should exit instead, and
   * mpirun ends the job. */
  if (!m->failed) {
    int rc = MPI_Comm_free(&m->comm);
    if (rc != MPI_SUCCESS)
      mpi_fail(m, __FILE__, __LINE__, "MPI_Comm_free", rc);
  }
  if (--live == 0 && we_init && !m->failed) {
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS)
      mpi_fail(m, __FILE__, __LINE__, "MPI_Finalize", rc);
  }
  free(m->stage);
  free(m->small);
  free(m->reqs);
  free(m->peer);
  free(m->off);
  free(m->len);
  free(m->in);
  free(m);
}

static const CollImpl mpi_impl = {
    .name = "mpi",
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .algorithm = mpi_algorithm,
    .mem_alloc = coll_host_alloc,
    .mem_free = coll_host_free,
    .mem_put = coll_host_copy,
    .mem_get = coll_host_copy,
    .free = mpi_free,
};

/* Writes "FILE:LINE: CALL: message" into err. */
static void init_fail(char *err, size_t errlen, int line, const char *call, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, msg, &n) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, line, call, msg);
}

#define INIT_CHECK(call, name) \
  do { \
    int rc_ = (call); \
    if (rc_ != MPI_SUCCESS) { \
      init_fail(err, errlen, __LINE__, name, rc_); \
      goto fail; \
    } \
  } while (0)

/* The caller frees with coll_free. */
Coll *coll_mpi(int *argc, char ***argv, char *err, size_t errlen) {
  int inited = 0, finalized = 0, provided = 0;
  CollMpi *m = NULL;
  INIT_CHECK(MPI_Finalized(&finalized), "MPI_Finalized");
  if (finalized) {
    snprintf(err, errlen, "%s:%d: MPI was finalized already; it cannot start again", __FILE__, __LINE__);
    return NULL;
  }
  INIT_CHECK(MPI_Initialized(&inited), "MPI_Initialized");
  if (!inited) {
    /* One thread at a time calls MPI, not always the one that called
     * this: FSDP's communication thread (fsdp_run.c) runs beside the
     * compute, and the main thread calls only while it is idle. */
    INIT_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    we_init = true;
  } else {
    INIT_CHECK(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  m = calloc(1, sizeof *m);
  ASSERT(m);
  m->base.impl = &mpi_impl;
  m->base.threads_ok = provided >= MPI_THREAD_SERIALIZED;
  m->base.timeout = coll_default_timeout();
  m->op = "init";
  INIT_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm), "MPI_Comm_dup");
  INIT_CHECK(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  INIT_CHECK(MPI_Comm_rank(m->comm, &m->base.rank), "MPI_Comm_rank");
  INIT_CHECK(MPI_Comm_size(m->comm, &m->base.size), "MPI_Comm_size");
  /* the hosts: how many ranks are first among those sharing their memory */
  MPI_Comm shared;
  int lrank = 0, first = 0;
  INIT_CHECK(MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared), "MPI_Comm_split_type");
  INIT_CHECK(MPI_Comm_rank(shared, &lrank), "MPI_Comm_rank");
  MPI_Comm_free(&shared);
  first = lrank == 0;
  INIT_CHECK(MPI_Allreduce(&first, &m->base.hosts, 1, MPI_INT, MPI_SUM, m->comm), "MPI_Allreduce");
  size_t N = (size_t)m->base.size;
  m->stage = aligned_alloc(64, 2 * N * CHUNK_BYTES);
  m->small = aligned_alloc(64, SMALL_ALL_REDUCE);
  m->reqs = calloc(4 * N, sizeof *m->reqs);
  m->peer = calloc(4 * N, sizeof *m->peer);
  m->off = calloc(N + 1, sizeof *m->off);
  m->len = calloc(N + 1, sizeof *m->len);
  m->in = calloc(N, sizeof *m->in);
  if (!m->stage || !m->small || !m->reqs || !m->peer || !m->off || !m->len || !m->in) {
    snprintf(err, errlen, "%s:%d: out of memory for %zu ranks' buffers", __FILE__, __LINE__, N);
    goto fail;
  }
  live++;
  return &m->base;
fail:
  if (m) {
    free(m->stage);
    free(m->small);
    free(m->reqs);
    free(m->peer);
    free(m->off);
    free(m->len);
    free(m->in);
    free(m);
  }
  return NULL;
}
