/* rt.h: the runtime. Parameter groups in flat buffers, the executors that
 * run a compiled step over them, and the commands built on both. */
#pragma once
#include "codegen.h"
#include "gpu.h"
#include "frontend.h"
#include "plan.h"
#include "llama4.h"
#include "tensor.h"
#include "optc.h"

typedef struct ThreadPool ThreadPool; /* exec_cpu.c */

typedef enum { BACKEND_INTERP, BACKEND_EAGER, BACKEND_CPU, BACKEND_CUDA, NUM_BACKENDS } Backend;
extern const char *const backend_names[NUM_BACKENDS];
bool backend_from_name(const char *s, Backend *out);

/* ---- group.c: a parameter group in memory --------------------------------------
 * The tensors that share one step graph, laid into one flat buffer per graph
 * buffer (param, grad, each state). */
typedef struct {
  const Graph *g;
  GroupLayout layout;
  int ntensors;
  char **names;   /* (ntensors) parameter names */
  Tensor *shapes; /* (ntensors) name, dtype and shape of each param; no data */
  void **bufs;    /* (g->nbufs) flat buffers of layout.total elements, 64-byte aligned */
  double step;    /* optimizer steps taken so far */
  bool have_step; /* some step count was read */
} ParamGroup;

/* Gathers the params of tf (every NAME with a NAME.grad) into a group for
 * graph g: params and grads copied in, states read where tf has them and
 * otherwise initialised as torch does, and the step count read from
 * NAME.step or `step`. grads_finite is set to what the copy saw (1 or 0).
 * 0, or -1 with an error naming the tensor. The caller frees with group_free. */
int group_from_file(ParamGroup *pg, const Graph *g, const TensorFile *tf, const double *inputs,
                    int *grads_finite);
/* A group of n tensors named t0, t1, ... with zeroed buffers (states at
 * zero whatever their init): for benchmarks. */
int group_alloc(ParamGroup *pg, const Graph *g, int n, const int64_t *numel);
/* Writes params, states and NAME.step (f32, as torch keeps it) into out,
 * with every tensor of `in` that is neither a param, a grad nor a state
 * copied through. */
int group_to_file(const ParamGroup *pg, const TensorFile *in, TensorFile *out);
void group_free(ParamGroup *pg);

/* ---- exec_cpu.c: compiled steps on the CPU -------------------------------------------- */
/* n threads, the caller's included; n < 1: one per core available. */
ThreadPool *pool_create(int n);
int pool_size(const ThreadPool *p);
int pool_default_threads(void);
/* Calls fn on contiguous parts of [0, total), one per thread, and waits. */
void pool_run(ThreadPool *p, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx, int64_t total);
/* Whether no grad buffer of g holds an Inf or a NaN in layout l's chunks
 * (tbufs: the tensor table, layout_tensor_bufs), in a vector pass on pool
 * (NULL: this thread). The compiled and the eager executors' check. */
bool grads_all_finite(ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *tbufs);
void pool_free(ThreadPool *p);
/* One step of a planned graph: each phase over every chunk, the step values
 * and reductions folded between phases on the host. */
int cpu_step(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *bufs,
             const StepArgs *args, StepResult *res);
/* The same over a tensor table (layout_tensor_bufs): what the compiled
 * kernels address. */
int cpu_step_t(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l, void *const *tbufs,
               const StepArgs *args, StepResult *res);
/* Whether g's first phase only sums over the grads (a norm pass: it
 * stores nothing and its reductions are all step-scope), with *width sums
 * a chunk. */
bool cpu_first_phase_reduces(const Graph *g, int *width);
/* That phase alone over l's chunks: their partials (l->nchunks x width),
 * what a later cpu_step_t takes as StepArgs.first_partials. */
int cpu_step_partials_t(CpuProgram *prog, ThreadPool *pool, const Graph *g, const GroupLayout *l,
                        void *const *tbufs, const double *inputs, double *partials);

/* ---- group.c: executors ---------------------------------------------------------------
 * What runs a group's steps: a backend with its compiled program. The
 * interpreter and the cpu backend run the optimized graph; eager runs the
 * graph as the front end built it. */
typedef struct {
  Backend backend;
  const Graph *g;        /* the graph this executor runs */
  CpuProgram *cpu;
  ThreadPool *pool;      /* cpu: its own; eager: the caller's (executor_share_pool), or NULL: one thread */
  bool pool_shared;      /* the pool is the caller's: not freed here */
  CudaProgram *cuda;     /* the cuda backend's program, and */
  CudaExec *cuda_exec;   /* its executor, made at the first step (it needs the layout) */
  CompileTimes times;
  optc_step *api;        /* the public API's step (include/optc.h), when it runs the steps */
  int api_threads;
} Executor;

/* `optimized` has been through the pipeline; `unoptimized` is the front
 * end's graph (eager runs it). threads < 1: one per core. */
int executor_init(Executor *x, Backend b, const Graph *optimized, const Graph *unoptimized, int threads,
                  const CpuTarget *target);
/* Runs an eager executor's steps on the caller's pool (which outlives it). */
void executor_share_pool(Executor *x, ThreadPool *pool);
/* An executor whose steps run through the public API (include/optc.h), as
 * a library user's do: api (which x takes, and frees) was built from the
 * recipe g was built from, whose buffers and inputs it matches by name.
 * CPU and CUDA targets; threads as optc_step_run takes them, or the
 * caller's pool (not NULL: the one the model's loops run on), which the
 * step then shares. */
void executor_init_api(Executor *x, optc_step *api, const Graph *g, int threads, ThreadPool *pool);
int executor_step(Executor *x, ParamGroup *pg, const StepArgs *args, StepResult *res);
/* A step of x->api over flat-indexed buffers of layout full (g's buffers:
 * element i of tensor t at flat[b] + full->offset[t] + i), on one rank's
 * slice when shard is not NULL. */
int executor_api_step(Executor *x, const GroupLayout *full, void *const *flat, const double *inputs,
                      const optc_shard *shard, StepResult *res);
/* The same over a tensor table of g's buffers (layout_tensor_bufs). */
int executor_api_step_t(Executor *x, const GroupLayout *full, void *const *tbufs, const double *inputs,
                        const optc_shard *shard, StepResult *res);
/* optc_step_partials through x->api: the first phase's partials of the shard's chunks. */
int executor_api_partials_t(Executor *x, const GroupLayout *full, void *const *tbufs, const double *inputs,
                            const optc_shard *shard, double *partials);
void executor_free(Executor *x);

/* ---- eager.c: torch eager's way of running a step ------------------------------------
 * The unoptimized graph, one op at a time over one tensor at a time, every
 * intermediate materialised. Same results as interp_step, bit for bit. */
int eager_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res);
/* The same, op-major with `foreach` (each op over every tensor, as torch's
 * _foreach_ ops), else tensor-major (torch's for-loop); with a pool, each
 * op over a large tensor is split across its threads, as torch's are. */
int eager_run(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res,
              bool foreach, ThreadPool *pool);
/* The same over a tensor table (layout_tensor_bufs). */
int eager_run_t(const Graph *g, const GroupLayout *l, void *const *tbufs, const StepArgs *args, StepResult *res,
                bool foreach, ThreadPool *pool);
/* Bytes per element that eager_step moves. */
double eager_traffic(const Graph *g);

/* ---- group.c: the values of a graph's runtime inputs --------------------------------
 * Each INPUT takes, in order: a value the runtime provides (step, ...), a
 * --set NAME=VALUE, or its default. */

/* Fills vals[g->nins] (entries for INPUT refs). Unknown --set names and
 * out-of-range values are errors; so is an input with no value. */
int inputs_resolve(const Graph *g, const Binding *sets, int nsets, const Binding *provided,
                   int nprovided, double *vals);
/* Parses NAME=VALUE (a number, or true/false) from the command line. */
bool parse_set(const char *s, Binding *out);

/* ---- inventory.c: a recipe's parameter tensors ---------------------------------------- */
typedef struct {
  char name[160];
  int ndim;
  int64_t shape[3];
  int64_t numel;
} InvTensor;

/* The model's parameter tensors: HF's layout (what optc's model holds and
 * its checkpoints name), or torchtune's (what torchtune's FSDP shards).
 * *out is malloc'd; returns the count. */
int inventory_tensors(const L4Config *m, bool torchtune, InvTensor **out);

/* ---- bench/bench.c: optc bench ------------------------------------------------------------ */
int bench_optimizer(int argc, char **argv);
/* bench/step.c: optc bench step */
int bench_step(int argc, char **argv);
/* bench/plan.c: optc plan */
int cmd_plan(int argc, char **argv);

/* ---- sched.c: learning-rate schedules ---------------------------------------------------- */
typedef enum { SCHED_CONSTANT, SCHED_COSINE_WARMUP } SchedKind;

typedef struct {
  SchedKind kind;
  long warmup, total; /* steps */
  double num_cycles;
} Schedule;

/* The recipe's lr_scheduler (constant when absent); total_steps is what
 * torchtune would pass as num_training_steps, unless the recipe gives it. */
int sched_from_recipe(const Recipe *r, long total_steps, Schedule *out);
/* The lr of optimizer step `step` (from 1), as torch's LambdaLR gives it. */
double sched_lr(const Schedule *s, double base_lr, long step);

/* ---- fsdp.c: a group sharded as FSDP2 shards a model, and its step ---------------------------
 * The tensors form units, each sharded on its own over the ranks; a rank
 * holds its part of every unit of every buffer (fsdp.c says how). */
typedef struct Coll Coll; /* coll.h */

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
 * shard of one buffer, and in *most the largest span. */
int64_t fsdp_plan(int n, const int64_t *numel, int nunits, const int *first, int world, int64_t *most);
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

/* ---- config.c: the training runtime's part of a recipe ------------------------------------------
 * What a recipe says beside the optimizer spec (frontend.h's Recipe, which
 * holds the document and the seed): the model, the batch, how long to
 * train, torch.compile's flags. */
typedef struct {
  bool model, loss, optimizer_step, scale_grads; /* torchtune's compile: block */
} CompileFlags;

typedef struct {
  Recipe *r; /* the recipe this was read from: the optimizer spec (frontend_build binds its inputs) */
  long batch_size, gradient_accumulation_steps, epochs, max_steps_per_epoch, max_steps;
  bool shuffle, fsdp_cpu_offload;
  CompileFlags compile;
  bool has_model;
  L4Config model; /* the model block: its builder's preset with the keys it gives */
} TrainConfig;

/* Reads r's training keys (torchtune's defaults for those absent). 0, or
 * -1 with an error at the key. */
int train_config_read(Recipe *r, TrainConfig *out);

/* ---- ckpt_config.c: a checkpoint directory before its tensors --------------------------------------
 * The recipe's checkpointer block (torchtune's FullModelHFCheckpointer) and
 * the model's config.json. */

/* The recipe's checkpointer block. */
typedef struct {
  const char *checkpoint_dir; /* NULL when not given */
  const char **files;         /* (nfiles) checkpoint_files, formatted and sorted, in checkpoint_dir */
  int nfiles;
  const char *output_dir;
  int64_t max_shard_size;     /* bytes; optc's key max_shard_size, default "5GB" (5e9) */
  long keep_last_n;           /* keep_last_n_checkpoints; 0: keep all */
  bool resume;                /* resume_from_checkpoint or should_load_recipe_state in the block */
  SrcPos pos;
} CkptConfig;

/* Reads r's checkpointer block into *out (arena-allocated; its ${key}
 * references were resolved when r loaded). output_dir defaults to
 * default_out. 0, or -1 with an error at the key. */
int ckpt_config(const Recipe *r, const char *default_out, CkptConfig *out);
/* torchtune's FormattedCheckpointFiles: filename_format has two {}
 * placeholders; file i (from 1) is fmt.format(str(i).zfill(len(max)), max),
 * for int(max) files. *out is malloc'd (ckpt_strings_free). 0, or -1 with
 * the reason in why. */
int ckpt_format_files(const char *fmt, const char *max_filename, char ***out, int *n, char *why, size_t whylen);
void ckpt_strings_free(char **s, int n);
/* huggingface_hub's parse_size_to_int ("5GB" = 5e9 bytes; TB GB MB KB),
 * or a number of bytes. */
bool ckpt_parse_size(const char *s, int64_t *out);
/* Reads HF's Llama4TextConfig keys (under text_config when there is one:
 * Llama4ForConditionalGeneration, *multimodal set, tensors under
 * language_model), with HF's defaults for absent ones. -1 with an error
 * naming the key when optc's model cannot be that model (top-k > 1,
 * tied embeddings, ...). */
int hf_config_read(const char *path, L4Config *out, bool *multimodal);
/* The model's dims: config.json's (config_path, NULL for none), where every
 * dim the recipe's model block gives must agree (an error at the key when
 * not), else the recipe's. */
int ckpt_model_config(const TrainConfig *tc, const char *config_path, L4Config *out, bool *multimodal);
/* A Llama4ForCausalLM config.json for c with weights in dtype; malloc'd. */
char *hf_config_text(const L4Config *c, Type dtype, long max_positions);

/* ---- ckpt.c: HF checkpoint directories (torchtune's FullModelHFCheckpointer) ---------------------
 * config.json, one model.safetensors or model-NNNNN-of-NNNNN.safetensors
 * shards with model.safetensors.index.json; read shard by shard straight
 * into the caller's buffers, written in huggingface_hub's shards. */

/* huggingface_hub's split_state_dict_into_shards_factory: tensors in order
 * fill a shard until the next would take it past max; a tensor over max is
 * a shard of its own, numbered when met, ahead of the shard being filled.
 * Sets shard_of[i] (from 0) and returns the shard count. */
int ckpt_plan_shards(const int64_t *nbytes, int n, int64_t max, int *shard_of);
/* model.safetensors when n == 1, else model-%05d-of-%05d.safetensors (k from 0). */
void ckpt_shard_name(int k, int n, char *buf, size_t len);

/* A checkpoint directory's shards, headers read, files open. */
typedef struct {
  const char *name; /* an StFile entry's */
  int file, entry;
} CkptName;

typedef struct {
  char *dir;
  StFile *files;
  int nfiles;
  CkptName *names; /* (nnames) every tensor, sorted by name */
  int nnames;
  bool indexed; /* model.safetensors.index.json was read and checked */
} CkptDir;

/* Opens dir's files (nfiles == 0: the index's, else model.safetensors,
 * else model-*-of-*.safetensors) and checks the index, when there is one,
 * against their headers. 0, or -1 with an error naming the file and the
 * tensor. The caller closes with ckpt_dir_close. */
int ckpt_dir_open(CkptDir *d, const char *dir, const char *const *files, int nfiles);
/* The same for one safetensors file, with no index (optimizer.safetensors). */
int ckpt_file_open(CkptDir *d, const char *path);
void ckpt_dir_close(CkptDir *d);
const StEntry *ckpt_dir_find(const CkptDir *d, const char *name, int *file, int *entry);

/* A tensor to load: elements [lo, hi) of it, converted to dtype, land at
 * dst + lo elements (dst is where element 0 would be). */
typedef struct {
  const char *name;
  int ndim;
  const int64_t *shape;
  Type dtype;
  void *dst;
  int64_t lo, hi;
} CkptWant;

/* Checks every want against the headers (missing, mis-shaped, not a float
 * dtype) and every tensor under own_prefix (NULL: all) against the wants
 * (unexpected), printing each problem with its file; then reads the data
 * file by file, front to back. 0, or -1. */
int ckpt_dir_load(const CkptDir *d, const CkptWant *w, int n, const char *own_prefix);
/* The tensors of d not under own_prefix (NULL: none), as views copying
 * from d's open files; fills out when not NULL and returns the count. */
int ckpt_dir_others(const CkptDir *d, const char *own_prefix, StView *out);

/* Writes v to dir in shards of max_shard bytes (ckpt_plan_shards), each
 * with {"format": "pt"}, and the index when there are several. */
int ckpt_write_model(const char *dir, const StView *v, int n, int64_t max_shard, int *nshards);
/* torchtune's copy_files: what src holds but weights, dotfiles and files
 * over 100 MiB, copied to dst (files already there are kept). */
int ckpt_copy_files(const char *src, const char *dst);
/* Renames the complete directory tmp to final; a final already there is
 * swapped out in one rename and removed. */
int ckpt_commit_dir(const char *tmp, const char *final);
/* Removes the .step_N.tmp.PID directories (and latest.tmp.PID files) of
 * writers no longer running: killed mid-save, whether gone, a zombie nobody
 * reaped, or a pid since reused by a process younger than the entry. */
int ckpt_clean_stale(const char *out_dir);
/* Removes all but the keep newest step_N directories of out_dir (and never
 * the one `latest` names), each renamed to a hidden .step_N.tmp.PID first, so
 * that a kill mid-removal leaves nothing ckpt_clean_stale does not remove. */
int ckpt_prune(const char *out_dir, long keep);
int ckpt_remove_tree(const char *path);

/* ---- train.c: the full_finetune_distributed recipe -------------------------------------------- */
typedef struct {
  long steps;  /* > 0: run this many steps (bench), else the recipe's */
  bool bench;  /* no checkpoints or metrics */
  bool eval;   /* held-out loss before and after */
  bool quiet;  /* no progress output */
} TrainOptions;

typedef struct {
  double first_loss, last_loss, heldout_before, heldout_after, tokens_per_second;
  double t_fwdbwd, t_coll, t_opt; /* seconds: the model's compute; collectives it waited for; the optimizer */
  double t_opt_hidden;            /* of t_opt, what ran beside the backward (optimizer_in_bwd) */
  double t_units, t_units_waited; /* the units' gathers and reduce-scatters, and what of them was waited for */
  FsdpRunStats units;
  long steps;
  double *losses; /* when set: each step's loss, up to max_losses */
  int nlosses, max_losses;
} TrainResult;

/* Trains on the ranks of coll (every rank calls it). 0, or -1 with an error printed. */
int train_run(const TrainConfig *tc, Coll *coll, const TrainOptions *opt, TrainResult *out);

/* What one rank of optc run holds, in bytes: its shards of the params,
 * the reduced grads and the optimizer states (fsdp_plan), the spans of the
 * units in use (fsdp_run_plan_spans: whole params, their f32 copies, whole
 * grads), the model's activation workspace for batch x seq with the
 * attention scratch of `threads` threads, and the process itself
 * (libraries, LLVM, the recipe): the caller's resident memory when it
 * calls, so optc plan calls it after compiling the step, as a rank has.
 * overlap: the units' collectives run beside the compute (fsdp_overlap),
 * which holds the next unit's params and the last unit's grads too.
 * optc run checks it against the memory available; optc plan prints it. */
typedef struct {
  double params, grads, states; /* this rank's shards of them */
  double spans;                 /* the units in use: their params (and f32 copies) and grads, whole */
  double acts, process, total;
  int wide, narrow;             /* the spans: f32 and 16-bit, of span_bytes / 4 elements */
  double span_elems;
} RankMemory;
void rank_memory(const TrainConfig *tc, const L4Config *c, const Graph *g, int world, int batch, int seq,
                 int threads, bool overlap, RankMemory *m);
