/* optc.h: the public C API of liboptc.
 *
 * liboptc builds the fused optimizer step of one parameter group (an
 * optimizer, with grad scaling and clipping in front of it, for one layout:
 * the dtypes of params, grads and states), compiles it for the CPU (LLVM)
 * or for CUDA (NVRTC), and runs it in place on memory the caller owns.
 * Every number it writes is what torch.optim writes (see README, "Torch's
 * bits").
 *
 *   optc_step *s;
 *   optc_error err;
 *   optc_spec spec = optc_spec_default("torch.optim.AdamW");
 *   spec.param_dtype = spec.grad_dtype = spec.state_dtype = OPTC_BF16;
 *   if (optc_step_new(&spec, &s, &err) != OPTC_OK) ... err.message ...
 *   ... allocate each state as optc_step_state_* says ...
 *   optc_buffers buffers = {ntensors, numel, params, grads, states, NULL};
 *   optc_scalar sc[] = {{"lr", 1e-4}, {"step", 1}};
 *   optc_result res;
 *   int threads = 0; (every core this process may use)
 *   if (optc_step_run(s, &buffers, sc, 2, threads, &res, &err) != OPTC_OK) ...
 *   optc_step_free(s);
 *
 * Conventions:
 * - Every function that can fail returns an optc_status and, when err is
 *   not NULL, fills *err with the code and a message (for a recipe, with
 *   file:line:col and the source line). Bad input never exits or aborts
 *   the process, and a failed call changes nothing the caller owns.
 * - Hyperparameters are runtime scalars, named as torch names them (lr,
 *   beta1, beta2, eps, weight_decay, momentum, dampening, alpha, lr_decay,
 *   initial_accumulator_value, step) plus the prelude's (num_tokens,
 *   world_size, grad_scale, max_norm, grad_norm_given) and torch_threads
 *   (torch's intra-op thread count, which some 16-bit for-loop bits depend
 *   on: give torch.get_num_threads()).
 *   Changing one between runs never recompiles. Only what changes the
 *   graph is fixed when a step is built: the optimizer, the dtypes, fused,
 *   clip, the bool options (amsgrad, maximize, nesterov, centered), and
 *   whether weight_decay and momentum are zero.
 * - A step object may be run from one thread at a time; different step
 *   objects are independent. Compiled code is cached in memory and on disk
 *   ($XDG_CACHE_HOME/optc, or ~/.cache/optc; OPTC_CACHE=0 turns it off), so
 *   building the same step again takes well under a millisecond. The code
 *   is for this CPU, or for the one OPTC_CPU names (an LLVM CPU name, e.g.
 *   haswell: its AVX2 code on an AVX-512 machine).
 *
 * Versioning: the shared library's soname is liboptc.so.OPTC_ABI_VERSION;
 * it changes when this header changes incompatibly. */
#ifndef OPTC_H
#define OPTC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPTC_ABI_VERSION 0
#define OPTC_VERSION_STRING "0.2.0"

/* The library's version, "0.2.0". */
const char *optc_version(void);

/* ---- errors ------------------------------------------------------------------ */
typedef enum {
  OPTC_OK = 0,
  OPTC_ERR_INVALID = 1,   /* a bad argument: NULL where a value is needed, a count out of range,
                             an unknown scalar name, a buffer table that does not fit the step */
  OPTC_ERR_SPEC = 2,      /* the recipe or spec does not make a step: an unknown optimizer or key,
                             a value out of torch's range, an option this optimizer lacks */
  OPTC_ERR_COMPILE = 3,   /* the backend could not compile it, or was not built in */
  OPTC_ERR_DEVICE = 4,    /* CUDA: no driver or device, or a launch failed */
  OPTC_ERR_NONFINITE = 5, /* a NaN or infinite grad, with nonfinite = OPTC_NONFINITE_ERROR */
} optc_status;

typedef struct {
  optc_status code;
  char message[4096]; /* NUL-terminated; empty when code is OPTC_OK */
} optc_error;

/* ---- building a step ---------------------------------------------------------- */
/* OPTC_U8 and OPTC_U4 are quantized states' codes (8 bits, or 4 bits two
 * a byte: element 2k in byte k's high nibble), each block of
 * optc_step_state_block elements with an f32 scale in a state of its own
 * (NAME.scale); as a spec's state_dtype they ask for torchao's AdamW8bit or
 * AdamW4bit states. */
typedef enum { OPTC_F32 = 0, OPTC_BF16 = 1, OPTC_F16 = 2, OPTC_U8 = 3, OPTC_U4 = 4 } optc_dtype;
typedef enum { OPTC_TARGET_CPU = 0, OPTC_TARGET_CUDA = 1 } optc_target;

/* What a NaN or infinite grad does. PROPAGATE is torch's behaviour: the
 * step runs and the NaNs spread. SKIP leaves params, states and the step
 * count unchanged and reports it; ERROR does the same and fails. */
typedef enum { OPTC_NONFINITE_PROPAGATE = 0, OPTC_NONFINITE_SKIP = 1, OPTC_NONFINITE_ERROR = 2 } optc_nonfinite;

/* clip_grad_norm_ in front of the optimizer. NORM: the step computes the
 * total norm of its grads (after scaling) in a first pass over them, then
 * clips and steps in a second. GIVEN: the caller gives the total norm as
 * the scalar grad_norm_given (e.g. summed over several steps' groups: see
 * optc.grad_norm below) and the step is one pass. */
typedef enum { OPTC_CLIP_NONE = 0, OPTC_CLIP_NORM = 1, OPTC_CLIP_GIVEN = 2 } optc_clip;

/* One name=value: a bool option ("amsgrad", 1) or a hyperparameter's
 * value at build time ("momentum", 0.9), which also sets the default the
 * runs use when they do not give it. */
typedef struct {
  const char *name;
  double value;
} optc_scalar;

typedef struct {
  const char *optimizer;  /* torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, torch.optim.Adagrad,
                             torch.optim.RMSprop, optc.Lion (or adamw, adam, sgd, adagrad, rmsprop, lion);
                             or optc.grad_norm: no optimizer, the run only measures the grads' (scaled)
                             sum of squares into optc_result.grad_sumsq and writes nothing */
  optc_dtype param_dtype, grad_dtype, state_dtype;
  int fused;              /* 1: the bits of torch's fused=True kernel; 0: the for-loop's */
  optc_clip clip;         /* clip_grad_norm_ before the optimizer (scalar max_norm) */
  int write_back_grads;   /* 1: store the scaled/clipped grads back into the grad buffers */
  optc_nonfinite nonfinite;
  const char *torch_cpu;  /* the torch CPU build whose bits to give: "avx512", "avx2", NULL = this CPU's */
  optc_target target;
  const optc_scalar *options; /* noptions build-time options and hyperparameters; also the
                                 recipe's stochastic_rounding (1), seed and kahan (1:
                                 compensation: kahan) */
  int noptions;
} optc_spec;

/* A spec for optimizer with torch's defaults: f32 everywhere, for-loop,
 * no clip, nonfinite PROPAGATE, the CPU target. */
optc_spec optc_spec_default(const char *optimizer);

typedef struct optc_step optc_step;

/* Builds and compiles the step a spec describes. *out is freed with
 * optc_step_free. */
optc_status optc_step_new(const optc_spec *spec, optc_step **out, optc_error *err);
/* The same from a torchtune-shaped recipe's text (the optimizer section,
 * dtype, optimizer_state_dtype, clip_grad_norm, ...: README, "Recipes"),
 * with torchtune-style key=value overrides; `name` is used in messages. */
optc_status optc_step_from_recipe(const char *name, const char *yaml, const char *const *overrides,
                                  int noverrides, optc_target target, optc_step **out, optc_error *err);
void optc_step_free(optc_step *s);

/* ---- what a step keeps per tensor --------------------------------------------- */
/* The optimizer's states, in the order optc_buffers.state takes them, with
 * torch's state_dict names (exp_avg, exp_avg_sq, max_exp_avg_sq,
 * momentum_buffer, sum, square_avg, grad_avg) and dtypes. */
int optc_step_num_states(const optc_step *s);
const char *optc_step_state_name(const optc_step *s, int k);
optc_dtype optc_step_state_dtype(const optc_step *s, int k);
/* How state k starts, as torch creates it: OPTC_INIT_ZERO (zeros_like(p)),
 * OPTC_INIT_VALUE (full_like(p, value): Adagrad's initial_accumulator_value,
 * as built) or OPTC_INIT_PARAM (a copy of the param: master weights). */
typedef enum { OPTC_INIT_ZERO = 0, OPTC_INIT_VALUE = 1, OPTC_INIT_PARAM = 2 } optc_init;
optc_init optc_step_state_init(const optc_step *s, int k, double *value);
/* A quantized state's: its block (state k is one f32 per block of this many
 * elements: NAME.scale), or 0 (one element per element); the bytes it holds
 * for a tensor of numel elements (codes, scales, or numel elements). */
int optc_step_state_block(const optc_step *s, int k);
int64_t optc_step_state_bytes(const optc_step *s, int k, int64_t numel);
/* A code book's entries (dyn8s, dyn8u, dyn4s, lin4u, lin8s, lin8u: torchao's
 * and bitsandbytes' maps, compiler/ir.h) into values (256 or 16 floats, when
 * values is not NULL); returns their count, or 0 for an unknown name. */
int optc_code_book(const char *name, float *values);
/* The runtime scalars the step reads, and each one's default (NaN: it has
 * none and must be given, as "step" must). */
int optc_step_num_scalars(const optc_step *s);
const char *optc_step_scalar_name(const optc_step *s, int i, double *dflt);
/* Bytes one run moves per element (the traffic model), and the step's IR
 * and phase plan as text (a pointer into the step, valid until it is freed).
 * With quantized states the traffic is a fraction (half a byte per 4-bit
 * code, a scale per block): optc_step_bytes_per_element rounds it up,
 * optc_step_traffic gives it exactly. */
int optc_step_bytes_per_element(const optc_step *s);
double optc_step_traffic(const optc_step *s);
const char *optc_step_ir(const optc_step *s);
const char *optc_step_plan(const optc_step *s);

/* ---- running a step ----------------------------------------------------------- */
/* The caller's memory: ntensors tensors, each contiguous, in the dtypes the
 * step was built for. param[t] and grad[t] point at tensor t's first
 * element; state[k * ntensors + t] at its state k's (k in optc_step_state_*
 * order). A tensor with numel 0 may have NULL pointers. Nothing is copied:
 * the run reads and writes these in place. */
typedef struct {
  int ntensors;
  const int64_t *numel;  /* (ntensors) */
  void *const *param;    /* (ntensors) */
  void *const *grad;     /* (ntensors) */
  void *const *state;    /* (nstates * ntensors) */
  void *stream;          /* CUDA: a CUstream, or NULL for the default stream; CPU: ignored */
} optc_buffers;

typedef struct {
  double grad_norm;  /* the total grad norm the step used (computed, or given), or NaN without clipping */
  double grad_sumsq; /* the sum of squares of the scaled grads it computed (CLIP_NORM, optc.grad_norm),
                        in f64 over fixed 4096-element blocks: sums of several steps' add up to the
                        sum over all their tensors, the same for any thread count */
  int skipped;       /* 1: non-finite grads, nothing was written (SKIP and ERROR) */
} optc_result;

/* One optimizer step. scalars override the defaults by name (unknown names
 * are an error; names the optimizer declares but this build does not read,
 * such as momentum when it was built zero, are accepted if they keep the
 * build's choice). grad_scale, when given (> 0), multiplies the grads (as
 * an f32 0-dim tensor in torch would); else they are multiplied by
 * world_size / num_tokens as torchtune's scale_grads does (1 by default).
 * threads: 0 for every core this process may use (CPU only). The call
 * returns when the step is done (CUDA: queued on the stream and, when it
 * clips, synchronized for the norm). */
optc_status optc_step_run(optc_step *s, const optc_buffers *b, const optc_scalar *scalars, int nscalars,
                          int threads, optc_result *res, optc_error *err);

/* ---- torch's arithmetic ------------------------------------------------------- */
/* torch.sqrt of a float32 CPU tensor, as optc computes it for a torch_cpu
 * ("avx512", "avx2", "amd"; NULL or "auto": this CPU's guess): MKL's
 * AVX-512 kernel, IEEE's sqrt, or MKL's generic kernel, which starts from
 * this CPU's RSQRTPS. y[i] = sqrt(x[i]) for n values. A caller with torch
 * compares it with torch's own to learn which torch_cpu gives its bits
 * (optc.torch.torch_cpu does). */
optc_status optc_torch_sqrt(const char *torch_cpu, const float *x, float *y, int64_t n, optc_error *err);

/* ---- threads --------------------------------------------------------------------- */
/* A step runs on a pool of threads. By default each step object makes its
 * own, of optc_step_run's `threads`. A caller with loops of its own (a
 * training loop's model) makes one pool and gives it to every step, so that
 * the process has one set of threads; idle ones wait on a condition
 * variable, never spin. A pool runs one thing at a time: give it to steps
 * that run one after another, not at once. */
typedef struct optc_pool optc_pool;
/* threads < 1: one per core this process may use; more than 1024: NULL.
 * Fewer when not all could be started (optc_pool_threads says). */
optc_pool *optc_pool_new(int threads);
int optc_pool_threads(const optc_pool *p);
/* Once no step uses it any more (each freed, or given another pool). */
void optc_pool_free(optc_pool *p);
/* Runs s's steps on p from now on (NULL: on its own pool again), and
 * optc_step_run's `threads` is then not read. CPU target only. */
optc_status optc_step_set_pool(optc_step *s, optc_pool *p, optc_error *err);

/* ---- NVRTC, the CUDA target's compiler ------------------------------------------ */
/* liboptc opens NVRTC when a CUDA step is first built, and never needs it
 * for the CPU. It looks, in order, at $OPTC_NVRTC (a path to the library:
 * that one alone), at the directories given here, at $CUDA_HOME/lib64 and
 * /usr/local/cuda/lib64, then on the loader's path (LD_LIBRARY_PATH,
 * ldconfig's cache); in each, for libnvrtc.so.13, then libnvrtc.so.12.
 * optc.torch gives the lib folders of torch's NVIDIA wheels in its
 * environment. */
/* dirs: ':'-separated directories to look in first. Only before NVRTC is
 * first looked for: OPTC_ERR_INVALID after (nothing changed). */
optc_status optc_nvrtc_dirs(const char *dirs, optc_error *err);
/* Looks for NVRTC if that was not done yet, and writes one line to buf
 * (n bytes, truncated to fit): "NVRTC 13.0 (/path/to/libnvrtc.so.13)", or
 * why a CUDA step cannot be built. 1 when NVRTC is there, 0 when not. */
int optc_nvrtc_info(char *buf, size_t n);

/* ---- a group sharded over ranks (FSDP) ------------------------------------------ */
/* Under FSDP each of N ranks owns a slice of a group's elements and steps
 * only that slice. optc lays a group's tensors one after another in "flat"
 * indices, each tensor starting on a multiple of OPTC_TENSOR_ALIGN;
 * optc_flat_layout writes tensor t's first flat index to offset[t] and
 * returns the flat length. A rank's slice [lo, hi) starts on a multiple of
 * OPTC_REDUCE_BLOCK, the block of the step-scope sums (the grad norm). */
#define OPTC_REDUCE_BLOCK 4096
#define OPTC_TENSOR_ALIGN 16
int64_t optc_flat_layout(int ntensors, const int64_t *numel, int64_t *offset);

/* A step with quantized states (optc_step_state_block > 0) starts each
 * tensor on a multiple of its block instead, so that no block straddles two
 * chunks or two ranks: its layout is optc_step_flat_layout's, its chunks
 * optc_step_chunk_index's (optc_step_align: where its tensors start, 16 or
 * the block). */
int optc_step_align(const optc_step *s);
int64_t optc_step_flat_layout(const optc_step *s, int ntensors, const int64_t *numel, int64_t *offset);

/* This rank's slice and the two collectives a sharded step needs. optc cuts
 * the group into chunks (a chunk: the part of one tensor inside one
 * OPTC_REDUCE_BLOCK block), nglobal of them in flat order, and keeps one
 * f64 partial sum per chunk (width values each):
 * - gather: every rank's partials to every rank. local holds this rank's
 *   chunks, nlocal x width values, which are the group's chunks
 *   [first, first + nlocal); global (nglobal x width) receives every
 *   rank's at their places (an all-gather in rank order, or an all-reduce
 *   sum of a zeroed global with local put at first, give the same). The
 *   step folds them in chunk order, so its norm has the same bits for any
 *   number of ranks.
 * - all: 1 when every rank's local is 1 (the grads are finite everywhere);
 *   every rank then skips a step together.
 * Each returns 0 (gather) or the answer (all), or -1 on a failed collective. */
typedef struct {
  int64_t lo, hi;
  int (*gather)(void *ctx, const double *local, int64_t first, int64_t nlocal, int64_t nglobal, int width,
                double *global);
  int (*all)(void *ctx, int local);
  void *ctx;
  /* A rank that owns a piece of each of several FSDP units (each decoder
   * layer sharded on its own, as FSDP2 does): nranges > 0 replaces [lo, hi)
   * with the ranges [ranges[2k], ranges[2k+1]), ascending and apart, each
   * end a chunk boundary (a multiple of OPTC_REDUCE_BLOCK, or not inside
   * any tensor), so that every chunk is one rank's. local then holds the
   * chunks of each range in turn, and `first` is the first one's index:
   * optc_chunk_index finds where each range's chunks go in global. */
  int nranges;
  const int64_t *ranges;
  /* When not NULL: the step's first phase's partials over this shard's
   * chunks, computed already by optc_step_partials (its chunks in order,
   * optc_step_partials_width values each); the run does not compute them
   * again. CPU only. */
  const double *partials;
} optc_shard;

/* A sharded step in two parts, for a caller that has a rank's grads piece
 * by piece (FSDP's units, as each one's backward ends). When the step's
 * first phase only sums over the grads (clip_grad_norm's norm), that phase
 * can run over each piece (a shard of the piece's ranges) as soon as its
 * grads are in, writing its chunks' partials, and the step later runs with
 * them (optc_shard.partials): the same bits as running it all at once.
 * optc_step_partials_width gives the sums per chunk, or 0 when the step
 * has no such phase (no clipping) or is not on the CPU. The scalars must be
 * those the step will run with. */
int optc_step_partials_width(const optc_step *s);
optc_status optc_step_partials(optc_step *s, const optc_buffers *b, const optc_shard *shard,
                               const optc_scalar *scalars, int nscalars, int threads, double *partials,
                               optc_error *err);

/* The index, among a group's chunks in flat order, of the first chunk at
 * or after flat index `flat` (the group's chunk count past its end); the
 * same in a step's own layout. */
int64_t optc_chunk_index(int ntensors, const int64_t *numel, int64_t flat);
int64_t optc_step_chunk_index(const optc_step *s, int ntensors, const int64_t *numel, int64_t flat);

/* optc_step_run over one rank's slice: b describes the whole group
 * (ntensors and numel of every tensor), its pointers flat-indexed (tensor
 * t's element i at param[t] + i, for the flat indices in [lo, hi) only: the
 * rest is never touched, and may be another rank's memory). Every rank
 * calls it with the same scalars. CPU only. */
optc_status optc_step_run_shard(optc_step *s, const optc_buffers *b, const optc_shard *shard,
                                const optc_scalar *scalars, int nscalars, int threads, optc_result *res,
                                optc_error *err);

#ifdef __cplusplus
}
#endif
#endif
