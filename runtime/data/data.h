/* data.h: what the model trains on. Tokenizers (optc's byte tokenizer and
 * torchtune's Llama 4 transform), datasets read from torchtune-shaped
 * `dataset:` blocks (torchtune's alpaca, chat and instruct datasets over
 * JSON, JSON Lines and Parquet files or the local Hugging Face hub cache;
 * plain text; optc's built-in synthetic instruction set), packing, and a
 * loader that shuffles with a seed and shards batches across data-parallel
 * ranks.
 *
 * Every sample is held as tokens and targets, and the targets are what
 * torchtune's SFTDataset yields as "labels": already shifted, targets[t] is
 * the label of token t+1 (or -100, not counted), and the last token of a
 * sample has none. torchtune's recipe feeds them to the loss unshifted, and
 * so does optc. Rows are never shifted across sample boundaries, so in a
 * packed row no sample predicts the next sample's first token.
 *
 * Determinism: the shuffle, the synthetic data and the packing depend only
 * on the seeds and the inputs (integer PRNG, no floating point), never on the
 * machine, the thread count or the world size. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base.h"
#include "yamltree.h"
#include "llama4.h"
#include "tokenizer.h"

/* ---- data.c: tokenizers ------------------------------------------------------
 * optc.tokenizers.byte_tokenizer: ids 0..255 are the bytes of the UTF-8
 * text, then bos 256, eos 257, pad 258; vocab 259 (scout_tiny_full.yaml's
 * vocab_size).
 *
 * torchtune.models.llama4.llama4_transform: Llama 4's tiktoken BPE
 * (tokenizer.h) and Llama4Transform's chat format; bos 200000, eos 200001,
 * pad 200018 (<|finetune_right_pad|>), vocab 202048, so the model's
 * vocab_size must be 202048 too: the ids are torchtune's, never remapped. */
enum { BYTE_BOS = 256, BYTE_EOS = 257, BYTE_PAD = 258, BYTE_VOCAB = 259 };

typedef enum { TOKENIZER_BYTE, TOKENIZER_LLAMA4 } TokenizerKind;

typedef struct {
  TokenizerKind kind;
  int vocab_size, bos_id, eos_id, pad_id;
  int max_seq_len; /* tokenizer.max_seq_len; 0: None (no truncation) */
  Bpe *bpe;        /* LLAMA4: the vocabulary (shared; tokenizer_free) */
} Tokenizer;

/* The byte tokenizer with no max_seq_len. */
Tokenizer tokenizer_byte(void);
/* Reads a `tokenizer:` block:
 *   {_component_: optc.tokenizers.byte_tokenizer, max_seq_len: N (null)}
 *   {_component_: torchtune.models.llama4.llama4_transform, path: FILE,
 *    max_seq_len: N (8192, llama4_transform's default; null: None),
 *    image_size, max_num_tiles (images only: accepted, they change no text),
 *    special_tokens_path: null, prompt_template: null (anything else would
 *    change the text, and is an error)}
 * A relative path is taken from the working directory. false (error printed
 * at the key) on anything else. The caller frees with tokenizer_free. A
 * vocabulary is loaded once per process and shared by every tokenizer of its
 * path (a Bpe is immutable): tokenizer_free drops one reference. */
bool tokenizer_from_config(const YamlNode *node, Tokenizer *out);
void tokenizer_free(Tokenizer *t);
/* torchtune's encode(text, add_bos, add_eos): appends the ids of s[0..n) to
 * out and returns how many, or -1 (error printed; Llama 4: text that is not
 * UTF-8). The byte tokenizer gives bos and eos even for empty text; Llama 4,
 * as torchtune, gives nothing for it. */
int tokenizer_encode(const Tokenizer *t, const char *s, size_t n, bool add_bos, bool add_eos, Ids *out);
/* torchtune's decode(ids, truncate_at_eos, skip_special_tokens), appended to
 * out. The byte tokenizer writes its specials as <bos>, <eos>, <pad> unless
 * skip_special. -1 (error printed) on an id outside the vocabulary. */
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, bool truncate_at_eos, bool skip_special,
                     Buf *out);

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

/* ---- hfdata.c: load_dataset -----------------------------------------------------
 * What torchtune's SFTDataset gets from datasets.load_dataset(source,
 * data_files=..., split=...), read the way datasets reads it:
 * - source: json | parquet, with data_files: FILE, [FILE, ...] or
 *   {SPLIT: FILE or [FILE, ...]} (a string or a list is the split "train";
 *   glob patterns match sorted). A JSON file whose first byte (after a BOM)
 *   is '[' is one array of objects (or of strings: {"text": s} each);
 *   otherwise it is JSON Lines, one object per line, blank lines ignored.
 * - source: FILE (.jsonl, .json or .parquet): optc's shorthand for one file.
 * - source: DIR, or a hub name OWNER/NAME: the data files of a directory, or
 *   of the dataset's snapshot in the local hub cache (HF_HUB_CACHE, else
 *   HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
 *   XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; there
 *   datasets--OWNER--NAME/snapshots/REV, REV from refs/main), with
 *   datasets' inference: the most common data extension (parquet on a
 *   tie), and splits from data/{split}-NNNNN-of-NNNNN* names, else from
 *   train/validation/test keywords in directory names, then file names,
 *   else all train. A dataset not in the cache is an error that says how to
 *   download it; optc never downloads. (README.md `configs:` are not read.)
 * - split: SPLIT, SPLIT[A:B] with absolute or percent bounds (negative from
 *   the end), (closest) or (pct1_dropremainder) rounding, and subs joined
 *   by '+', with datasets' ReadInstruction rules and messages exactly.
 * Columns are the union of the rows' keys (JSON) or the schema's (Parquet). */
typedef enum { HF_COL_OK, HF_COL_NESTED, HF_COL_BINARY, HF_COL_UNREADABLE } HfColumnKind;

/* A column optc cannot read (nested, binary, or a Parquet page it cannot
 * decode) is an error only when a dataset reads it, as torchtune's reads
 * only the columns it names: why holds the reader's message. */
typedef struct {
  const char *name;
  HfColumnKind kind;
  const char *why; /* UNREADABLE: the message, else NULL */
} HfColumn;

/* Where a row came from: JSON: the line and column its object starts at;
 * Parquet: line 0, and its row index in the file. */
typedef struct {
  int file, line, col;
  int64_t index;
} HfRowPos;

/* Rows as JSON objects, column -> value, in order. The files' texts are
 * kept for messages. malloc'd; the owner calls hf_table_free. */
typedef struct {
  json_t **rows;   /* (n) */
  HfRowPos *pos;   /* (n) */
  int n, cap;
  SrcFile *files;  /* (nfiles) */
  int nfiles;
  HfColumn *cols;  /* (ncols) */
  int ncols;
} HfTable;

/* Loads what the block's source, data_files and split keys name (source
 * defaults to default_source, which may be NULL). With skip_bad, malformed
 * JSON lines are warned about, counted in *bad_lines and dropped; otherwise
 * the first is an error. false, with the error printed at the key, on any
 * mistake. */
bool hf_load(const YamlNode *node, const char *where, const char *default_source, bool skip_bad, int *bad_lines,
             HfTable *out);
void hf_table_free(HfTable *t);
int hf_find_column(const HfTable *t, const char *name);
/* A problem with row i: FILE:LINE:COL: error (JSON), `optc: error: FILE: row
 * N:` (Parquet), or a warning that the row is skipped. */
PRINTF(4, 5) void hf_row_message(const HfTable *t, int i, bool warning, const char *fmt, ...);
/* The hub cache directory, as above, appended to out. */
void hf_hub_cache_dir(Buf *out);

/* One sub of a split string. */
typedef struct {
  char split[128];
  bool has_from, has_to;
  int64_t from, to;
  bool pct;  /* percent bounds (both, when either has a %) */
  bool pct1; /* (pct1_dropremainder); else (closest) */
} SplitSpec;
/* Parses spec into at most max subs; their count, or -1 with datasets'
 * message in why. */
int split_parse(const char *spec, SplitSpec *out, int max, char *why, size_t whylen);
/* The rows [*from, *to) of a split of n rows that s selects (empty when
 * from >= to); -1 with the message in why (pct1_dropremainder under 100 rows). */
int split_absolute(const SplitSpec *s, int64_t n, int64_t *from, int64_t *to, char *why, size_t whylen);
/* (data.c) Whether path can be read; else an error at the recipe key that
 * names it, at (file_read's own has no position). */
bool data_can_open(const char *path, SrcPos at, const char *what);

/* ---- data.c: datasets ----------------------------------------------------------
 * A dataset is two lists of rows fixed when it is built: the training split
 * and the held-out split (the last holdout_fraction of the samples in file or
 * generation order, split before packing so a pack never mixes the two).
 *
 * With the Llama 4 tokenizer a sample is what torchtune's SFTDataset yields:
 * the message transform's messages (below), Llama4Transform's
 * tokenize_messages (tokens and mask, tokenizer.h), truncated to
 * max_seq_len as torchtune truncates (the last token then eos, masked), and
 *   targets[t] = mask[t+1] ? -100 : tokens[t+1],   targets[n-1] = -100.
 * torchtune.datasets.alpaca_dataset (AlpacaToMessages): a user message of
 *   torchtune's alpaca prompt (prompt_format, with the input when the row
 *   has a non-empty one), then an assistant message of the output; every
 *   message trained on with train_on_input (torchtune's default, true), else
 *   only the assistant's.
 * torchtune.datasets.instruct_dataset (InputOutputToMessages): user = the
 *   input column, assistant = the output column (column_map: {input, output}),
 *   after a masked system message of new_system_prompt if given;
 *   train_on_input false by default.
 * torchtune.datasets.chat_dataset: conversation_column holds a list of
 *   messages; conversation_style sharegpt ({from: system|human|gpt, value})
 *   or openai ({role, content}, content a string or a list holding one
 *   {type: text, text} part; a tool/ipython message ends its turn with eom,
 *   and so does an assistant message followed by one); new_system_prompt
 *   replaces the conversation's system messages; train_on_input false.
 * Then torchtune's validate_messages: at least two messages, a system message
 *   only first, no two user messages in a row, an assistant message only
 *   after a user (or tool) message, and no tool/ipython message (torchtune's
 *   chat transforms never mark one as following a tool call, so it rejects
 *   them all). A row that breaks a rule, or lacks a column, is reported at
 *   its FILE:LINE:COL (or FILE: row N), an error, or with on_bad_line: skip
 *   a warning and a dropped row.
 *
 * With the byte tokenizer an alpaca sample, with P = 1 + prompt bytes and
 * R = response bytes, is
 *   tokens  = bos, prompt, response, eos                  (n = P + R + 1)
 *   targets[t] = tokens[t+1] for t in [P-1, n-2], -100 elsewhere
 * so the R response tokens and the eos count, predicted from the position
 * before each, and no prompt token does (train_on_input: false; with true,
 * every t in [0, n-2] counts). A sample longer than max_seq_len is cut to
 * max_seq_len with its last token replaced by eos, which does not count.
 * (Chat and instruct datasets need the Llama 4 tokenizer's chat format.)
 *
 * A text file is the stream encode(file, bos, eos), cut into windows: row i
 * has tokens stream[iL .. iL+L) and targets stream[iL+1 .. iL+L+1), L =
 * max_seq_len, so every target counts and each token after the first is
 * predicted exactly once (the last row may be shorter).
 *
 * Packed (`packed: true`; torchtune then needs tokenizer.max_seq_len): each
 * block's rows are filled greedily in order, as torchtune's PackedDataset
 * with split_across_pack=False; a sample that does not fit in what is left
 * of a row starts the next one. Each row is exactly max_seq_len wide:
 * segment k of a row is its k-th sample, positions restart at 0 in each, and
 * the tail is PackedDataset's padding (token 0, target -100) in one more
 * segment, its positions continuing from the last sample's, capped at
 * max_seq_len - 1. Unpacked rows are one sample each; the loader pads them
 * to the batch's longest with the tokenizer's pad_id.
 *
 * The `dataset:` block. A list of blocks is torchtune's ConcatDataset: each
 * block built (and packed) on its own, then their rows in order; all must
 * agree on `packed`. Every component takes packed: bool (false) and optc's
 * holdout_fraction: number in [0, 1) (0; see each). _component_:
 *   torchtune.datasets.alpaca_dataset, torchtune.datasets.alpaca_cleaned_dataset
 *     source (tatsu-lab/alpaca; yahma/alpaca-cleaned), data_files, split (train),
 *     column_map: {instruction, output[, input]}, train_on_input (true),
 *     filter_fn: null, and optc's template: alpaca | compact (alpaca) and
 *     on_bad_line: error | skip (error)
 *   torchtune.datasets.instruct_dataset
 *     source, data_files, split, column_map: {input, output}, train_on_input
 *     (false), new_system_prompt, filter_fn: null, on_bad_line
 *   torchtune.datasets.chat_dataset
 *     source, data_files, split, conversation_column, conversation_style:
 *     sharegpt | openai, train_on_input (false), new_system_prompt,
 *     filter_fn: null, on_bad_line
 *   optc.datasets.text_file
 *     path: PATH
 *   optc.datasets.synthetic_alpaca
 *     num_samples: int (4000)   seed: int (0)   holdout_fraction (0.1)
 *     template (compact)   train_on_input (false)
 * Relative paths are taken from the working directory. An unknown key, a
 * missing file, or no training samples is an error. */
typedef struct Dataset Dataset;

typedef enum { SPLIT_TRAIN, SPLIT_HELDOUT, SPLIT_ALL } DataSplit;

/* Builds the dataset a `dataset:` (or `dataset_val:`) block describes, its
 * samples cut at max_seq_len (> 1). NULL, with the error printed at the
 * offending key, on any mistake (node NULL: no block). The caller frees
 * with dataset_free; tok must outlive the call only. */
Dataset *dataset_from_config(const YamlNode *node, const Tokenizer *tok, int max_seq_len);
void dataset_free(Dataset *ds);
/* Rows (samples, or packs when packed) in a split. SPLIT_ALL is the training
 * rows followed by the held-out ones: what a `dataset_val:` block yields. */
int dataset_num_samples(const Dataset *ds, DataSplit split);
bool dataset_packed(const Dataset *ds);
int dataset_max_seq_len(const Dataset *ds);
/* Lines and rows skipped as malformed (on_bad_line: skip). */
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
/* Row i as one JSON line (with its newline), as torchtune's dataset yields
 * it: {"tokens": [...], "labels": [...]}, and for a pack also "input_pos"
 * and "seq_lens" (PackedDataset's, the padding's length last when there is
 * padding). */
void dataset_dump_row(const Dataset *ds, DataSplit split, int i, Buf *out);

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
