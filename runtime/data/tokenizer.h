/* tokenizer.h: the Llama 4 tokenizer, computing what torchtune's
 * Llama4Tokenizer and Llama4Transform compute, token for token and mask bit
 * for mask bit (tests/tokenizer/golden.jsonl holds torchtune's own output).
 *
 * It is tiktoken's byte-level BPE:
 * - a vocabulary file of `base64-token rank` lines (tiktoken's format);
 * - text cut into pieces by Llama 4's O200K regex (LLAMA4_PATTERN, through
 *   PCRE2 with JIT);
 * - each piece that is not itself a token merged pair by pair, always the
 *   adjacent pair whose merged bytes have the lowest rank (the leftmost on a
 *   tie);
 * - Llama 4's 2048 special tokens at ids 200000..202047, named and numbered as
 *   torchtune's LLAMA4_SPECIAL_TOKENS.
 *
 * Text only: images, and the <|image|>/<|patch|>/tile tokens that stand for
 * them, are out of scope, and so are prompt templates (torchtune's default,
 * None, is what this computes).
 *
 * Text is UTF-8 and given with its length (it may hold NULs). A Bpe is
 * immutable once loaded: any number of threads may encode and decode with one
 * Bpe at the same time. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

/* ---- tokenizer.c: Llama 4's special tokens ---------------------------------
 * The ids torchtune gives them; the rest of the 2048 are reserved names
 * (<|text_post_train_reserved_special_token_8|> .. _68|>,
 * <|vision_reserved_special_token_7|> .. _1047|>, <|reserved_special_token_0|>
 * .. _903|>), all of which bpe_special_name knows. */
enum {
  LLAMA4_BOS = 200000, /* <|begin_of_text|> */
  LLAMA4_EOS = 200001, /* <|end_of_text|> */
  LLAMA4_FIM_PREFIX = 200002,
  LLAMA4_FIM_MIDDLE = 200003,
  LLAMA4_FIM_SUFFIX = 200004,
  LLAMA4_HEADER_START = 200005,
  LLAMA4_HEADER_END = 200006,
  LLAMA4_EOM = 200007, /* end of message: the turn goes on (tool calls) */
  LLAMA4_EOT = 200008, /* end of turn */
  LLAMA4_STEP = 200009,
  LLAMA4_PAD = 200018, /* <|finetune_right_pad|>: torchtune's pad_id */
  LLAMA4_IMAGE_START = 200080,
  LLAMA4_IMAGE_END = 200081,
  LLAMA4_TILE_X_SEPARATOR = 200084,
  LLAMA4_TILE_Y_SEPARATOR = 200085,
  LLAMA4_IMAGE = 200090,
  LLAMA4_PATCH = 200092,
  LLAMA4_REASONING_START = 201142,
  LLAMA4_REASONING_END = 201143,
  LLAMA4_FIRST_SPECIAL = 200000,
  LLAMA4_NUM_SPECIAL = 2048,
  LLAMA4_VOCAB = 202048, /* tiktoken's n_vocab: the largest id + 1 */
};

/* torchtune's O200K_PATTERN, byte for byte (the test compares it with the
 * string torchtune holds). PCRE2 gets it with \s and \S spelled out as the
 * Unicode White_Space set that tiktoken's Rust regex means by them; see
 * tokenizer.c. */
extern const char LLAMA4_PATTERN[];

/* ---- tokenizer.c: the vocabulary ------------------------------------------- */
typedef struct Bpe Bpe;

/* Reads a tiktoken vocabulary: lines `TOKEN RANK`, TOKEN the token's bytes in
 * standard padded base64, RANK a decimal integer, separated by spaces or tabs;
 * empty lines are skipped and a line may end in \r\n. The ranks must be
 * exactly 0..N-1 with N <= 200000 (the special ids follow), no token may
 * appear twice, and every single byte must be a token. On a malformed file
 * prints `path:line:col: error: ...` and returns NULL; never exits. The caller
 * frees the Bpe with bpe_free. */
Bpe *bpe_load(const char *path);
void bpe_free(Bpe *b);
/* The number of ranked tokens (torchtune's base_vocab_size). */
int bpe_base_vocab_size(const Bpe *b);
/* torchtune's vocab_size: the largest id + 1, LLAMA4_VOCAB. */
int bpe_vocab_size(const Bpe *b);
/* The bytes of token id (a rank or a special id) and their count in *len, or
 * NULL when id is neither. The bytes belong to b. */
const char *bpe_token_bytes(const Bpe *b, int32_t id, int *len);
/* The name of special id ("<|eot|>"), or NULL when id is not special. */
const char *bpe_special_name(const Bpe *b, int32_t id);
/* The id of a special token's name, or -1. */
int32_t bpe_special_id(const Bpe *b, const char *name);

/* ---- tokenizer.c: token id lists -------------------------------------------
 * malloc'd and growable; the owner calls ids_free. A zeroed Ids is empty. */
typedef struct {
  int32_t *v;
  int n, cap;
} Ids;
void ids_push(Ids *ids, int32_t id);
void ids_free(Ids *ids);

/* ---- tokenizer.c: encode and decode -----------------------------------------
 * torchtune's Llama4Tokenizer.encode(text, add_bos, add_eos): appends the ids
 * of text[0..len) to out, bos first and eos last when asked, and returns how
 * many it appended. As in torchtune:
 * - special-token text in the input ("<|eot|>") is encoded as ordinary text;
 * - empty text gives no ids at all, not even bos and eos;
 * - text is cut every 400,000 characters, and a run of more than 25,000
 *   whitespace or non-whitespace characters (Python's str.isspace) is cut
 *   every 25,000, and the pieces are encoded apart.
 * Returns -1, appending nothing, when text is not valid UTF-8, or when PCRE2
 * fails on it (a match limit); the error is printed. */
int bpe_encode(const Bpe *b, const char *text, size_t len, bool add_bos, bool add_eos, Ids *out);

/* torchtune's Llama4Tokenizer.decode(ids, truncate_at_eos, skip_special_tokens)
 * (torchtune's defaults: both true), appending the text to out:
 * - truncate_at_eos drops the first eos and all after it, unless that eos is
 *   ids[0] (torchtune tests `if k:`, and k = 0 is false);
 * - bytes that are not UTF-8 become U+FFFD as Python's errors="replace" makes
 *   them, one per maximal ill-formed subsequence;
 * - skip_special then removes, from the text, each `<|header_start|>...
 *   <|header_end|>\n\n` and then each `<|...|>` (no newline inside either),
 *   whether it came from a special id or from ordinary text.
 * Returns 0, or -1 (out unchanged, error printed) on an id that is neither a
 * rank nor a special id. */
int bpe_decode(const Bpe *b, const int32_t *ids, int n, bool truncate_at_eos, bool skip_special, Buf *out);

/* ---- tokenizer.c: the chat format --------------------------------------------
 * torchtune's Message, the fields that matter for text. */
typedef struct {
  const char *role;    /* "system", "user", "assistant", "ipython" or "tool" (NUL-terminated) */
  const char *content; /* the text, UTF-8, NUL-terminated: one {"type": "text"} item */
  bool masked;         /* true: not trained on (Message.masked; torchtune's default false) */
  bool eot;            /* true: the message ends with <|eot|>, false: with <|eom|>
                        * (Message.eot; torchtune's default true) */
} ChatMessage;

/* torchtune's MaskingStrategy; train_on_input=True is TRAIN_ON_ALL, and
 * train_on_input=False is TRAIN_ON_ASSISTANT (the default). */
typedef enum { TRAIN_ON_ASSISTANT, TRAIN_ON_ALL, TRAIN_ON_LAST } MaskingStrategy;

/* torchtune's mask_messages: sets every message's masked flag. System
 * messages are always masked; TRAIN_ON_ASSISTANT masks all but assistant
 * messages; TRAIN_ON_ALL masks none else (text has no media); TRAIN_ON_LAST
 * masks all but the last assistant message. */
void chat_mask_messages(ChatMessage *m, int n, MaskingStrategy s);

/* Llama4Tokenizer's options. A zeroed ChatOptions is Llama4Transform's
 * default: no max_seq_len, end tokens added, right truncation. */
typedef struct {
  int max_seq_len;    /* torchtune's max_seq_len; 0: None */
  bool no_end_tokens; /* add_end_tokens=False: for generation (inference=True) */
  bool truncate_left; /* truncation_type="left" (Llama4Tokenizer only; Llama4Transform
                       * always truncates right) */
} ChatOptions;

/* A chat's tokens and loss mask: mask[i] true means token i is not trained on
 * (torchtune's mask). malloc'd; the owner calls chat_tokens_free. */
typedef struct {
  int32_t *tokens; /* (n) */
  bool *mask;      /* (n) */
  int n;
} ChatTokens;

/* Llama4Transform.tokenize_messages(messages, add_end_tokens): fills out with
 *   <|begin_of_text|>                                   mask true
 *   then per message:                                   mask = message.masked
 *     <|header_start|> role.strip() <|header_end|> "\n\n"
 *     content.strip()
 *     <|eot|> if eot else <|eom|>   (not on the last message when no_end_tokens)
 *   and, unless no_end_tokens, <|end_of_text|>          mask true
 * each text part encoded alone. With max_seq_len, messages stop once the
 * tokens reach it, the list is cut to max_seq_len, and, unless no_end_tokens,
 * its last token is made <|end_of_text|> and its mask true. Returns 0, or -1
 * when some text is not valid UTF-8 (error printed; out is zeroed). */
int llama4_tokenize_messages(const Bpe *b, const ChatMessage *m, int n, const ChatOptions *opt,
                             ChatTokens *out);
void chat_tokens_free(ChatTokens *t);
