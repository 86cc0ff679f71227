/* dist.h: a parameter group across ranks: sharded as FSDP2 shards a model
 * (fsdp.c), the model's units gathered and reduced around their use
 * (fsdp_run.c), and the ranks started under mpirun (launch.c). The
 * collectives they run on are coll.h's. */
#pragma once
#include "coll.h"
#include "group.h"
#include "llama4.h"

/* ---- fsdp.c: a group sharded as FSDP2 shards a model, and its step ---------------------------
 * The tensors form units, each sharded on its own over the ranks; a rank
 * holds its part of every unit of every buffer (fsdp.c says how). */
typedef struct {
  int t0, t1;       /* its tensors [t0, t1) */
  int64_t flo, fhi; /* its elements' flat range: the first tensor's start, the last one's end */
  int64_t base, S;  /* its span [base, base + world S): rank r's part [base + r S, base + (r + 1) S) */
  int64_t at;       /* where this rank's part starts in its shard (elements) */
} FsdpUnit;

/* The flat index where rank r's part of unit u starts. */
static inline int64_t fsdp_part_start(const FsdpUnit *u, int r) { return u->base + u->S * r; }

typedef struct {
  Coll *coll;
  int rank, world;
  const Graph *g;       /* the optimized graph, whose buffers these are */
  int pbuf, gbuf;       /* its param and grad buffers */
  GroupLayout full;     /* every tensor of the group */
  GroupLayout shard;    /* this rank's chunks: its piece of each unit */
  int nunits;
  FsdpUnit *units;      /* (nunits) */
  int64_t nshard;       /* a shard's elements: the units' S, summed */
  int64_t most;         /* the largest span, world * S */
  int64_t *ranges;      /* (2 * nranges) this rank's pieces, ascending: what its step runs */
  int nranges;
  int64_t *nchunks_of;  /* (world) each rank's chunks */
  GroupLayout *unit_shard; /* (nunits) this rank's chunks of each unit, made when first stepped alone */
  int64_t *unit_c0;     /* (nunits + 1) where each unit's chunks begin among the shard's */
  double *first;        /* the step's first phase's partials over the shard, unit by unit (fsdp_unit_partials) */
  bool *first_done;     /* (nunits) this step's are in */
  void **mem;           /* (nbufs) this rank's shard of each buffer: unit u's part at units[u].at */
  void **table;         /* (ntensors * nbufs) tensor t's element 0 of buffer b, for the shard's elements */
  void *grads_in;       /* fsdp_load's whole grads as spans, reduced by every fsdp_step (optc exec) */
  Reducer reducer;      /* chunk partials across ranks, in global order */
  double step;
} Fsdp;

/* Lays out n tensors in units (unit u: tensors [first[u], first[u + 1]);
 * nunits 0: the group is one) over the ranks of coll and allocates the
 * shards, zeroed. The caller frees with fsdp_free. */
int fsdp_init(Fsdp *f, Coll *coll, const Graph *g, int n, const int64_t *numel, int nunits, const int *first);
void fsdp_free(Fsdp *f);
/* What fsdp_init would lay out, without a Coll: the elements of a rank's
 * shard of one buffer, and in *most the largest span (tensors from
 * multiples of align: graph_align of the step's graph). */
int64_t fsdp_plan(int n, const int64_t *numel, int nunits, const int *first, int world, int64_t align,
                  int64_t *most);
/* This rank's part of unit u in buffer b: units[u].S elements. */
void *fsdp_part(Fsdp *f, int b, int u);
/* The unit of tensor t, and the elements [lo, hi) of it this rank holds. */
int fsdp_unit_of(const Fsdp *f, int t);
void fsdp_piece(const Fsdp *f, int t, int64_t *lo, int64_t *hi);
/* Every rank's part of unit u of buffer b into span (world * S elements,
 * flat index x at span[x - base]); one rank: a copy unless span is the
 * part. Collective. */
int fsdp_gather(Fsdp *f, int u, int b, void *span);
/* The rank-order sum of every rank's grads span of unit u into this rank's
 * part of the reduced grads; in place on one rank when span is the part.
 * Collective. */
int fsdp_reduce(Fsdp *f, int u, void *span);
/* From a whole group (every rank holds the same): each rank's pieces of the
 * params and states, and the grads, which only the rank with
 * contribute_grads adds in (the others add -0.0, so the sum is exact),
 * reduced into the pieces by every fsdp_step. */
int fsdp_load(Fsdp *f, const ParamGroup *pg, bool contribute_grads);
/* Gathers params and states back into a whole group on every rank. */
int fsdp_store(Fsdp *f, ParamGroup *pg);
/* One step of x over every rank's pieces, the reductions folded across
 * ranks; the grads are in the shard (after fsdp_load: reduced first). */
int fsdp_step(Fsdp *f, Executor *x, const double *inputs, StepResult *res);
/* Whether x can take the step's first phase (clip_grad_norm's norm) unit
 * by unit: a compiled step whose first phase only sums over the grads. */
bool fsdp_can_partials(const Fsdp *f, const Executor *x);
/* That phase over this rank's piece of unit u, as soon as its grads are
 * reduced (inputs: the step's); the next fsdp_step, once every unit's are
 * in, takes them instead of running the phase: the same bits. */
int fsdp_unit_partials(Fsdp *f, Executor *x, int u, const double *inputs);
/* The same over this rank's piece of unit u alone, with no collective: for
 * a graph with no step-scope reduction, whose grads are not checked
 * (nonfinite_grads: propagate), so that no rank waits for another. */
int fsdp_step_unit(Fsdp *f, Executor *x, int u, const double *inputs, StepResult *res);

/* ---- fsdp_run.c: a model's units over a sharded group ---------------------------------------
 * The model's hooks (llama4.h) doing what FSDP2 does around each wrapped
 * module: a unit's params gathered before its use and freed after, its
 * grads reduce-scattered after its backward (fsdp_run.c says when). */
typedef struct FsdpRun FsdpRun;
typedef struct {
  bool reshard_after_forward; /* torchtune's fsdp_reshard_after_forward: free a unit's params after its forward */
  bool training;              /* a forward is followed by its backward (false: every forward frees) */
  bool overlap;               /* the collectives on a thread of their own, the next unit's gather started early */
  /* When set (optimizer_in_bwd): steps unit u's piece once its grads are
   * reduced, on the step's last micro-batch, on the collectives' thread
   * (beside the backward of the units before it) or at once. 0, or -1. */
  int (*step_unit)(void *ctx, int u);
  void *step_ctx;
} FsdpRunOptions;
typedef struct {
  long gathers, reduces;           /* units gathered and reduced */
  double gathered_bytes, reduced_bytes;
  double gather_s, reduce_s;       /* seconds in them, widening and rounding included */
  double wait_s;                   /* seconds the model's thread waited for them: what was not hidden */
  long steps;                      /* units stepped in the backward (step_unit) */
  double step_s, step_hidden_s;    /* seconds in their steps, and of those before the backward ended */
  bool threaded;                   /* they ran on a communication thread */
  int spans_wide, spans_narrow;    /* spans held at once, at most: f32 and 16-bit */
  double span_bytes;               /* their bytes */
} FsdpRunStats;
/* Over f (whose units are the model's, l4_units). The caller frees with fsdp_run_free. */
FsdpRun *fsdp_run_create(Fsdp *f, const FsdpRunOptions *o);
void fsdp_run_free(FsdpRun *r);
/* The hooks for l4_set_hooks, and the params and grads arrays for l4_run,
 * which the hooks point into the spans of the units in use. */
L4Hooks fsdp_run_hooks(FsdpRun *r);
float *const *fsdp_run_params(FsdpRun *r);
float *const *fsdp_run_grads(FsdpRun *r);
/* Before each micro-batch's run: its index of the step's nmicro (the
 * grads are zeroed on the first and reduced on the last). */
void fsdp_run_micro(FsdpRun *r, int micro, int nmicro);
void fsdp_run_set_training(FsdpRun *r, bool training);
/* A collective or an allocation failed in a hook (the run returned NaN). */
bool fsdp_run_failed(const FsdpRun *r);
/* The collectives (and step_unit) run on a thread of their own. */
bool fsdp_run_threaded(const FsdpRun *r);
FsdpRunStats fsdp_run_stats(FsdpRun *r);
/* The spans a run holds at once, at most, with options o, params and grads
 * of types pt and gt, on `world` ranks, nunits units and `accum`
 * micro-batches a step: f32 ones (*wide) and 16-bit ones (*narrow), each
 * of the largest span's size. What fsdp_run.c's hooks take, counted. */
void fsdp_run_plan_spans(const FsdpRunOptions *o, Type pt, Type gt, int world, int nunits, int accum, int *wide,
                         int *narrow);

/* ---- launch.c: --nproc ---------------------------------------------------------------------- */
/* Runs `mpirun -np nproc optc ARGS... --mpi-rank` and returns its exit
 * status; each rank gets --threads threads_per_rank when > 0. */
int launch_mpirun(int nproc, int argc, char **argv, int threads_per_rank);
/* The same for the command `optc CMD [SUB] ARGS...` each rank runs, with
 * ARGS being the launching command's own without its --nproc N. */
int launch_ranks(int nproc, const char *cmd, const char *sub, int argc, char **argv, int threads_per_rank);
