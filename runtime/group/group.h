/* group.h: a parameter group in memory (flat buffers, one per graph
 * buffer), the executor that steps it (a backend with its compiled
 * program, or the public API's step, include/optc.h), and the values of a
 * graph's runtime inputs. */
#pragma once
#include "exec.h"
#include "frontend.h"
#include "optc.h"
#include "tensor.h"

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

/* ---- group.c: the values of a graph's runtime inputs --------------------------------
 * Each INPUT takes, in order: a value the runtime provides (step, ...), a
 * --set NAME=VALUE, or its default. */

/* Fills vals[g->nins] (entries for INPUT refs). Unknown --set names and
 * out-of-range values are errors; so is an input with no value. */
int inputs_resolve(const Graph *g, const Binding *sets, int nsets, const Binding *provided,
                   int nprovided, double *vals);
/* Parses NAME=VALUE (a number, or true/false) from the command line. */
bool parse_set(const char *s, Binding *out);
