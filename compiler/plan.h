/* plan.h: what every executor consumes. A parameter group laid out in flat
 * buffers with a chunk table, the values a step runs with, and the
 * reference interpreter that defines what a step computes. */
#pragma once
#include "ir.h"
#include "numerics.h"

/* ---- layout.c: flat buffers and the chunk table ------------------------------
 * The tensors of a group sit one after another in one flat buffer per graph
 * buffer, each starting on OPTC_TENSOR_ALIGN. A chunk is a run of elements
 * of one tensor inside one reduction block: executors run chunks, and a
 * reduction has one f64 partial per chunk, summed in chunk order. */
typedef struct {
  int32_t tensor; /* the tensor's index in the group */
  int32_t block;  /* flat / OPTC_REDUCE_BLOCK */
  int64_t start;  /* first element, counted within the tensor */
  int64_t len;    /* 1 .. OPTC_REDUCE_BLOCK elements */
  int64_t flat;   /* first element's index in the flat buffers */
} Chunk;

typedef struct {
  int ntensors;
  int64_t *numel;  /* (ntensors) */
  int64_t *offset; /* (ntensors) flat index of each tensor's element 0 */
  int64_t total;   /* flat length: the end of the last tensor */
  Chunk *chunks;   /* the chunks inside [lo, hi) of the flat buffer */
  int64_t nchunks;
  int64_t lo, hi;
} GroupLayout;

/* Lays out n tensors and cuts the chunks of the whole group. The caller
 * frees with layout_free. */
void layout_init(GroupLayout *l, int n, const int64_t *numel);
/* Recuts the chunks to those inside the flat range [lo, hi), e.g. a shard;
 * lo must be a multiple of OPTC_REDUCE_BLOCK. */
void layout_restrict(GroupLayout *l, int64_t lo, int64_t hi);
void layout_free(GroupLayout *l);

/* ---- the values one step runs with ------------------------------------------ */
typedef struct {
  const double *inputs; /* (g->nins) the value of each INPUT instruction, by its ref */
  /* What the producer of the grads learned while writing them: 1 all finite,
   * 0 some NaN or Inf, -1 unknown (the executor finds out). */
  int grads_finite;
} StepArgs;

typedef struct {
  bool skipped;   /* non-finite grads: nothing was stored */
  int nred;       /* step-scope reductions, in graph order */
  double red[8];  /* their values (e.g. the grad sum of squares) */
} StepResult;

/* ---- interp.c: the reference interpreter ------------------------------------
 * Runs one step of graph g over the chunks of layout l. bufs[b] is the flat
 * buffer of g->bufs[b], of its element type. Each value is computed in its
 * declared type, exactly; every store lands only after every reduction is
 * known, and not at all when a grad is non-finite. Returns 0, or -1 with an
 * error printed. */
int interp_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args,
                StepResult *res);
/* Folds instruction i when its operands are all constants, computing
 * exactly as a step would; false when it cannot. */
bool interp_fold(const Graph *g, Ref i, double *out);
