/* train.h: the full_finetune_distributed recipe: a recipe's training keys
 * (config.c), the learning-rate schedule (sched.c), the checkpointer block
 * and the model's config.json (ckpt_config.c), and the training loop with
 * its memory plan (train.c). */
#pragma once
#include "ckpt.h"
#include "dist.h"
#include "frontend.h"
#include "llama4.h"

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
