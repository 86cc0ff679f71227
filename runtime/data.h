/* data.h: what the model trains on. A byte-level tokenizer, datasets read
 * from torchtune-shaped `dataset:` blocks (alpaca JSONL, plain text, and
 * optc's built-in synthetic instruction set), packing, and a loader that
 * shuffles with a seed and shards batches across data-parallel ranks.
 *
 * Every sample is held as tokens with their targets already shifted, so the
 * model sees exactly what torchtune's recipe computes: targets[t] is the
 * label of token t+1 (or -100, not counted), and the last token of a sample
 * has no target. Rows are never shifted across sample boundaries, so in a
 * packed row no sample predicts the next sample's first token.
 *
 * Determinism: the shuffle, the synthetic data and the packing depend only
 * on the seeds and the inputs (integer PRNG, no floating point), never on the
 * machine, the thread count or the world size. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "base.h"
#include "frontend.h"
#include "model/llama4.h"

/* ---- data.c: the byte tokenizer --------------------------------------------
 * optc.tokenizers.byte_tokenizer: ids 0..255 are the bytes of the UTF-8
 * text, then bos 256, eos 257, pad 258; vocab 259 (scout_tiny_full.yaml's
 * vocab_size). */
enum { BYTE_BOS = 256, BYTE_EOS = 257, BYTE_PAD = 258, BYTE_VOCAB = 259 };

typedef struct {
  int vocab_size, bos_id, eos_id, pad_id;
  int max_seq_len; /* tokenizer.max_seq_len; 0: not set */
} Tokenizer;

/* The byte tokenizer with no max_seq_len. */
Tokenizer tokenizer_byte(void);
/* Reads a `tokenizer:` block: {_component_: optc.tokenizers.byte_tokenizer,
 * max_seq_len: N}. false (error printed at the key) on anything else. */
bool tokenizer_from_config(const YamlNode *node, Tokenizer *out);
/* Writes the n ids of s[0..n) into out (room for n) and returns n. */
int tokenizer_encode(const Tokenizer *t, const char *s, int n, int32_t *out);
/* Appends the text of ids to out: bytes as themselves, specials as <bos>,
 * <eos>, <pad>, or nothing when skip_special. -1 on an id outside the vocab. */
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, bool skip_special, Buf *out);

/* ---- data.c: prompts ---------------------------------------------------------
 * TEMPLATE_ALPACA is torchtune's AlpacaToMessages text, byte for byte:
 *   with an input:
 *     "Below is an instruction that describes a task, paired with an input that
 *     provides further context. Write a response that appropriately completes the
 *     request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
 *   without one (input absent, null or ""):
 *     "Below is an instruction that describes a task. Write a response that
 *     appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
 * TEMPLATE_COMPACT is the same without the opening sentence ("### Instruction:\n..."),
 * about 110 bytes shorter: what a 128-token model can afford. */
typedef enum { TEMPLATE_ALPACA, TEMPLATE_COMPACT } PromptTemplate;
/* Appends the prompt for one sample to out; input may be NULL or "". */
void prompt_format(PromptTemplate tpl, const char *instruction, const char *input, Buf *out);

/* ---- data.c: datasets ----------------------------------------------------------
 * A dataset is two lists of rows fixed when it is built: the training split
 * and the held-out split (the last holdout_fraction of the samples in file or
 * generation order, split before packing so a pack never mixes the two).
 *
 * One alpaca sample, with P = 1 + prompt bytes and R = response bytes:
 *   tokens  = bos, prompt, response, eos                  (n = P + R + 1)
 *   targets[t] = tokens[t+1] for t in [P-1, n-2], -100 elsewhere
 * so the R response tokens and the eos count, predicted from the position
 * before each, and no prompt token does (train_on_input: false; with true,
 * every t in [0, n-2] counts). A sample longer than max_seq_len is cut to
 * max_seq_len with its last token replaced by eos, which does not count
 * (torchtune's truncate()).
 *
 * A text file is the stream bos, bytes, eos, cut into windows: row i has
 * tokens stream[iL .. iL+L) and targets stream[iL+1 .. iL+L+1), L =
 * max_seq_len, so every target counts and each token after the first is
 * predicted exactly once (the last row may be shorter).
 *
 * Packed (`packed: true`): rows are filled greedily in order, as torchtune's
 * PackedDataset with split_across_pack=False; a sample that does not fit in
 * what is left of a row starts the next one. Each row is exactly max_seq_len
 * wide: segment k of a row is its k-th sample, positions restart at 0 in
 * each, and the tail is pad (target -100) in one more segment, its positions
 * continuing from the last sample's, capped at max_seq_len - 1. Unpacked
 * rows are one sample each; the loader pads them to the batch's longest.
 *
 * The `dataset:` block (a list of blocks is concatenated; all must agree on
 * `packed`). Every component takes
 *   packed: bool (false), holdout_fraction: number in [0, 1) (0; see each).
 * _component_:
 *   torchtune.datasets.alpaca_dataset
 *     source: PATH.jsonl | json     data_files: PATH | [PATH, ...] (with source json)
 *     column_map: {instruction, input, output}   train_on_input: bool (false)
 *     split: train   template: alpaca | compact (alpaca)   on_bad_line: error | skip (error)
 *   optc.datasets.text_file
 *     path: PATH
 *   optc.datasets.synthetic_alpaca
 *     num_samples: int (4000)   seed: int (0)   holdout_fraction (0.1)
 *     template (compact)   train_on_input (false)
 * A JSONL line that is not an object with string "instruction" and "output"
 * (and "input" a string, null or absent) is reported as FILE:LINE:COL; with
 * on_bad_line: skip it is dropped and counted, otherwise it is an error.
 * Blank lines are ignored. Relative paths are taken from the working
 * directory. An unknown key, a missing file, or no training samples is an
 * error. */
typedef struct Dataset Dataset;

typedef enum { SPLIT_TRAIN, SPLIT_HELDOUT, SPLIT_ALL } DataSplit;

/* Builds the dataset a `dataset:` (or `dataset_val:`) block describes, its
 * samples cut at max_seq_len (> 1). NULL, with the error printed at the
 * offending key, on any mistake (node NULL: no block). The caller frees
 * with dataset_free. */
Dataset *dataset_from_config(const YamlNode *node, const Tokenizer *tok, int max_seq_len);
void dataset_free(Dataset *ds);
/* Rows (samples, or packs when packed) in a split. SPLIT_ALL is the training
 * rows followed by the held-out ones: what a `dataset_val:` block yields. */
int dataset_num_samples(const Dataset *ds, DataSplit split);
bool dataset_packed(const Dataset *ds);
int dataset_max_seq_len(const Dataset *ds);
/* JSONL lines skipped as malformed (on_bad_line: skip). */
int dataset_bad_lines(const Dataset *ds);
/* Samples cut at max_seq_len before packing. */
int dataset_truncated(const Dataset *ds);

/* One row, borrowed from the dataset. positions and segments are NULL for an
 * unpacked row (0..len-1, one sequence). */
typedef struct {
  const int32_t *tokens, *targets, *positions, *segments;
  int len;
} DataRow;
DataRow dataset_row(const Dataset *ds, DataSplit split, int i);
/* One line for logs: "synthetic_alpaca: 3600 train + 400 held-out samples,
 * 298765 tokens, 71234 counted, packed: no". */
void dataset_describe(const Dataset *ds, Buf *out);

/* ---- data.c: optc.datasets.synthetic_alpaca ---------------------------------
 * A deterministic instruction set generated by code, for the byte-level tiny
 * configs: twelve tasks drawn uniformly (add, subtract, the larger of two
 * numbers, "What is a plus b?", "What number comes after n?", count up, count
 * down, copy, reverse, upper case, count and sort letters), every
 * (instruction, input) distinct, so the held-out tail shares no prompt with
 * the training samples. Seeded by splitmix64: the same on every machine.
 * With the compact template a sample is 53..113 tokens (about 80), of which
 * about 8 count (the response and eos); the default 4000 samples are 3600
 * train + 400 held out. On scout_tiny_full's model (batch 4, lr 3e-3) the
 * held-out loss falls from 5.55 to about 3.1 in 100 steps (the responses'
 * byte unigram entropy is 3.3), at about 0.1 s a step on 2 cores.
 *
 * Writes the samples, in generation order, as alpaca JSONL (atomically:
 * PATH.tmp.PID, then rename). Loading that file with alpaca_dataset,
 * template: compact and the same holdout_fraction gives the same dataset.
 * 0, or -1 with an error printed. */
int synthetic_alpaca_write(const char *path, int num_samples, uint64_t seed);

/* ---- data.c: the loader ---------------------------------------------------------
 * Micro-batches of batch_size rows. Each epoch e orders the split's rows by a
 * permutation that depends only on (seed, e) (Fisher-Yates over splitmix64;
 * identity when !shuffle). Micro-batch k of the epoch holds rows
 * perm[k*B .. k*B+B); rank r of world_size N gets micro-batches k = r, r+N,
 * r+2N, ... in order, so its j-th batch is k = j*N + r.
 *
 * A global step with A gradient-accumulation steps consumes micro-batches
 * [s*N*A, (s+1)*N*A): a 1-rank run with N*A accumulation steps sees exactly the
 * rows an N-rank run with A sees, whatever N. With drop_last (training) an
 * epoch has floor(floor(rows/B)/N) batches on every rank; without it (eval)
 * the last micro-batch may be short and the first ceil(rows/B) mod N ranks get
 * one more batch than the rest. */
typedef struct {
  int batch_size;
  bool shuffle;
  uint64_t seed;
  int rank, world_size; /* 0 <= rank < world_size */
  bool drop_last;
} LoaderOptions;

typedef struct DataLoader DataLoader;
/* NULL (error printed) when a training split has fewer rows than one batch on
 * every rank. The dataset must outlive the loader; the caller frees with
 * dataloader_free. */
DataLoader *dataloader_create(const Dataset *ds, DataSplit split, const LoaderOptions *o);
void dataloader_free(DataLoader *dl);
/* Fills *out with this rank's next micro-batch and returns 1, or returns 0 at
 * the end of an epoch, after which the next call starts the next epoch. The
 * arrays belong to the loader and hold until the next call. Unpacked: T is the
 * batch's longest row (pad, target -100, after the shorter ones); positions and
 * segments are NULL. Packed: T = max_seq_len, positions and segments set. */
int dataloader_next(DataLoader *dl, L4Batch *out);
/* Batches per epoch on this rank. */
int dataloader_num_batches(const DataLoader *dl);
/* The epoch the next batch comes from, and its index in that epoch. */
int dataloader_epoch(const DataLoader *dl);
int dataloader_batch_index(const DataLoader *dl);
/* Continues from batch `batch` of epoch `epoch` (resuming a checkpoint). */
void dataloader_seek(DataLoader *dl, int epoch, int batch);
/* The dataset row indices (into the split) of this rank's last batch, and its
 * row count: for tests and logs. */
const int *dataloader_last_rows(const DataLoader *dl, int *n);
