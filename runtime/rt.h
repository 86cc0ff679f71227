/* rt.h: the runtime. Parameter groups in flat buffers, the executors that
 * run a compiled step over them, and the commands built on both. */
#pragma once
#include "../compiler/frontend.h"
#include "../compiler/plan.h"
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
/* Writes params, states and NAME.step (f32, as torch keeps it) into out,
 * with every tensor of `in` that is neither a param, a grad nor a state
 * copied through. */
int group_to_file(const ParamGroup *pg, const TensorFile *in, TensorFile *out);
void group_free(ParamGroup *pg);

/* Runs one step of the group's graph with a backend. */
int group_step(ParamGroup *pg, Backend b, const StepArgs *args, StepResult *res);

/* ---- eager.c: torch eager's way of running a step ------------------------------------
 * The unoptimized graph, one op at a time over one tensor at a time, every
 * intermediate materialised. Same results as interp_step, bit for bit. */
int eager_step(const Graph *g, const GroupLayout *l, void *const *bufs, const StepArgs *args, StepResult *res);
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
