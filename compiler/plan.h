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
 * reduction has one f64 partial per chunk, summed in chunk order.
 *
 * A graph with a block (block scope: a quantized state's scales) starts
 * each tensor on a multiple of its block instead (graph_align). The block
 * divides OPTC_REDUCE_BLOCK, so every chunk, and every shard's range (on
 * the OPTC_REDUCE_BLOCK grid), then starts on a block of its tensor: a
 * block never straddles two chunks, two threads or two ranks, and each
 * chunk computes its blocks' reductions alone. A per-block buffer's flat
 * form has one element per block of the flat index (flat / block), a u4
 * one a byte per two flat elements. */
typedef struct {
  int32_t tensor; /* the tensor's index in the group */
  int32_t block;  /* flat / OPTC_REDUCE_BLOCK */
  int64_t start;  /* first element, counted within the tensor */
  int64_t len;    /* 1 .. OPTC_REDUCE_BLOCK elements */
  int64_t flat;   /* first element's index in the flat buffers */
  int64_t numel;  /* the tensor's elements (tailpos reads it) */
} Chunk;

typedef struct {
  int ntensors;
  int64_t align;   /* where each tensor starts: a multiple of this (OPTC_TENSOR_ALIGN, or graph_align) */
  int64_t *numel;  /* (ntensors) */
  int64_t *offset; /* (ntensors) flat index of each tensor's element 0 */
  int64_t total;   /* flat length: the end of the last tensor, padded to
                      OPTC_TENSOR_ALIGN; flat buffers hold this many */
  Chunk *chunks;   /* the chunks inside [lo, hi) of the flat buffer (layout_select: of its ranges) */
  int64_t nchunks;
  int64_t lo, hi;
} GroupLayout;

/* Where n tensors of numel elements start in the flat buffers (offset[t],
 * when offset is not NULL), one after another from OPTC_TENSOR_ALIGN
 * boundaries (layout_offsets_a: from multiples of align, a multiple of
 * OPTC_TENSOR_ALIGN that divides OPTC_REDUCE_BLOCK); returns the padded
 * flat length. */
int64_t layout_offsets(int n, const int64_t *numel, int64_t *offset);
int64_t layout_offsets_a(int n, const int64_t *numel, int64_t align, int64_t *offset);
/* Where graph g's tensors start: OPTC_TENSOR_ALIGN, or its block. */
int64_t graph_align(const Graph *g);
/* Lays out n tensors and cuts the chunks of the whole group (layout_init_a:
 * tensors from multiples of align; a graph's layout takes graph_align(g)).
 * The caller frees with layout_free. */
void layout_init(GroupLayout *l, int n, const int64_t *numel);
void layout_init_a(GroupLayout *l, int n, const int64_t *numel, int64_t align);
/* Recuts the chunks to those inside the flat range [lo, hi), e.g. a shard;
 * lo must be a multiple of OPTC_REDUCE_BLOCK. */
void layout_restrict(GroupLayout *l, int64_t lo, int64_t hi);
/* The same for the union of nranges ranges [ranges[2k], ranges[2k+1]),
 * ascending and apart, each end a place that cuts no chunk
 * (layout_is_cut): a shard that owns a piece of each of several units.
 * lo and hi become the first range's start and the last one's end. */
void layout_select(GroupLayout *l, int nranges, const int64_t *ranges);
/* The index of l's first chunk at or after flat index `flat` (nchunks past the last). */
int64_t layout_chunk_at(const GroupLayout *l, int64_t flat);
/* Whether flat index x is a chunk boundary: a multiple of
 * OPTC_REDUCE_BLOCK, or outside every tensor's interior. */
bool layout_is_cut(const GroupLayout *l, int64_t x);
void layout_free(GroupLayout *l);
/* The tensor table of flat buffers: for tensor t and graph buffer b, where
 * the tensor's element 0 sits in flat[b] (flat-indexed: element i of
 * tensor t at flat[b][offset[t] + i]), at [t * g->nbufs + b]. Executors
 * address memory through such a table, so a caller's tensors need not be
 * one allocation (include/optc.h). malloc'd; the caller frees it. */
void **layout_tensor_bufs(const GroupLayout *l, const Graph *g, void *const *flat);

/* Folds chunk partials in chunk order (chunk c's at part[c * width + idx]):
 * sums, or NaN-propagating maxima. The whole group's value... */
double layout_fold(const double *part, int64_t nchunks, int width, int idx, bool is_max);
/* ...or each tensor's, into out[t] for the tensors of l (l's chunks). */
void layout_fold_tensors(const GroupLayout *l, const double *part, int width, int idx, bool is_max, double *out);

/* ---- across ranks ---------------------------------------------------------------
 * On one rank of a sharded group, the chunks of a reduction are spread over
 * the ranks. An executor hands its chunk partials to the reducer, gets back
 * every rank's in global chunk order, and folds those: the bits do not
 * depend on the world size. */
typedef struct {
  const GroupLayout *global; /* the whole group: its chunks, in global order */
  /* local (nlocal x width) -> global (global->nchunks x width) */
  int (*gather)(void *ctx, const double *local, int64_t nlocal, int width, double *global);
  /* 1 when every rank's local flag is 1 */
  int (*all)(void *ctx, int local);
  void *ctx;
} Reducer;

/* ---- the values one step runs with ------------------------------------------ */
typedef struct {
  const double *inputs; /* (g->nins) the value of each INPUT instruction, by its ref */
  /* What the producer of the grads learned while writing them: 1 all finite,
   * 0 some NaN or Inf, -1 unknown (the executor finds out). */
  int grads_finite;
  const Reducer *reducer; /* NULL: the layout holds the whole group */
  /* torch's behaviour: NaN and Inf are not looked for, in the grads or in
   * a step-scope reduction; the step runs and they spread */
  bool propagate;
  /* The first phase's chunk partials of this layout, computed already
   * (cpu_step_partials_t: FSDP computes a unit's norm as soon as its grads
   * are in); that phase is then not run again. NULL: run it. */
  const double *first_partials;
} StepArgs;

typedef struct {
  bool skipped;   /* non-finite grads: nothing was stored */
  int nred;       /* step-scope reductions, in graph order */
  double red[8];  /* their values (e.g. the grad sum of squares) */
} StepResult;

/* One value of any IR type. */
typedef union {
  double d;   /* f64 */
  float f;    /* f32 */
  uint16_t h; /* bf16, f16: the bits */
  int64_t i;  /* i32, i64, bool */
} Scalar;

/* ---- interp.c: the reference interpreter ------------------------------------
 * Runs one step of graph g over the chunks of layout l. bufs[b] is the flat
 * buffer of g->bufs[b], of its element type. Each value is computed in its
 * declared type, exactly; every store lands only after every reduction is
 * known, and not at all when a grad is non-finite. Returns 0, or -1 with an
 * error printed. */
int interp_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args,
                StepResult *res);
/* The same over a tensor table (layout_tensor_bufs): tensor t's element 0 of
 * buffer b at tbufs[t * g->nbufs + b]. */
int interp_step_t(const Graph *g, const GroupLayout *l, void *const *tbufs, const StepArgs *args,
                  StepResult *res);
/* Folds instruction i when its operands are all constants, computing
 * exactly as a step would; false when it cannot. */
bool interp_fold(const Graph *g, Ref i, double *out);
/* Computes instruction i (an arithmetic, logic, select, conversion or
 * tailpos op) on operand values `args`, for element `index` of `tensor`, of
 * `numel` elements (which only stochastic rounding and tailpos read). Other
 * executors use it where they have no faster loop of their own, so they
 * agree with the interpreter by construction. */
Scalar interp_apply(const Graph *g, Ref i, const Scalar *args, int tensor, int64_t index, int64_t numel);
/* Evaluates the step-scope values among instructions [lo, hi) into
 * step[], in order: what the host computes between phases (^stepK). */
void interp_eval_steps(const Graph *g, Ref lo, Ref hi, const double *inputs, Scalar *step);
/* A double (a constant, an input) as a value of type t, and back. */
Scalar interp_scalar_from_double(double d, Type t);
double interp_scalar_to_double(Scalar v, Type t);

/* ---- lower.c: the phase plan -------------------------------------------------
 * What a partitioned step graph asks of memory, phase by phase. Both
 * backends consume it unchanged.
 *
 * A phase with reductions to block scope runs each block of a chunk in
 * stages (its block stages, nbstages of them): stage s computes the values
 * that need s block reductions on their longest path, over the block's
 * elements, and ends with the block reductions of them; the block-scope
 * values of stage s + 1 (a scale from its absmax) follow, once per block.
 * A value of an earlier stage that a later one reads is kept per element
 * of the block (the backends' scratch, a block of a few hundred elements:
 * it stays in the L1 cache), so nothing is loaded or computed twice. */
typedef struct {
  int buf;   /* index into Graph.bufs */
  Type type;
  double bytes; /* per element of a tensor: buffer_elem_bytes */
} PlanBuf;

typedef struct {
  int index;
  Ref step_lo, step_hi; /* ^stepK: the step values computed before this phase */
  Ref lo, hi;           /* ^phaseK: the element computation, in order */
  PlanBuf *reads, *writes;
  int nreads, nwrites;
  Ref *reds; /* the reductions this phase accumulates (over tensors or the group: its partials) */
  int nreds;
  Ref *breds; /* its reductions to block scope, computed inside it */
  int nbreds;
  int nbstages;             /* 1 + the most block reductions on a path through it */
  double bytes_per_element; /* reads + writes, each buffer once (a fraction with codes and scales) */
  int nops;                 /* arithmetic per element (loads and stores excluded) */
} PlanPhase;

typedef struct Plan {
  const Graph *g;
  PlanPhase *phases;
  int nphases;
  double bytes_per_element;
  uint8_t *bstage; /* (nins) each value's block stage in its phase (0 where the phase has none) */
} Plan;

/* The plan of a partitioned graph, in g's arena. NULL (error printed) when
 * the graph is not partitioned. */
Plan *plan_build(const Graph *g);
/* Text and JSON forms; `eager` is the eager executor's traffic per element
 * for comparison, or negative to leave it out. */
void plan_print(const Plan *p, double eager, Buf *out);
void plan_print_json(const Plan *p, double eager, Buf *out);
