/* data.c: tokenizers (bytes, Llama 4), torchtune's datasets and message
 * transforms over hfdata.c's rows, text files, the synthetic instruction
 * set, packing, and the sharded, seeded loader. */
#include "data.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* ---- splitmix64 ------------------------------------------------------------- */

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *s) { return mix64(*s += 0x9E3779B97F4A7C15ull); }

/* Uniform in [0, n), n >= 1, by rejection, so no modulo bias. */
static uint64_t rand_below(uint64_t *s, uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do
    x = splitmix64(s);
  while (x >= limit);
  return x % n;
}

static int rand_range(uint64_t *s, int lo, int hi) { return lo + (int)rand_below(s, (uint64_t)(hi - lo + 1)); }


/* ---- tokenizers --------------------------------------------------------------- */

Tokenizer tokenizer_byte(void) { return (Tokenizer){TOKENIZER_BYTE, BYTE_VOCAB, BYTE_BOS, BYTE_EOS, BYTE_PAD, 0, NULL}; }

/* Vocabularies are loaded once per process and shared, by path: a Bpe is
 * immutable and safe to use from any number of threads, and a process may
 * build the same tokenizer many times (optc bench step's runs, the data
 * and training commands). Each tokenizer holds a reference; the last
 * tokenizer_free frees the vocabulary. */
static struct {
  char *path;
  Bpe *bpe;
  int refs;
} *vocabs;
static int nvocabs;
static pthread_mutex_t vocab_lock = PTHREAD_MUTEX_INITIALIZER;

static Bpe *vocab_get(const char *path) {
  pthread_mutex_lock(&vocab_lock);
  Bpe *b = NULL;
  for (int i = 0; i < nvocabs && !b; i++)
    if (vocabs[i].bpe && !strcmp(vocabs[i].path, path))
      b = vocabs[i].bpe, vocabs[i].refs++;
  if (!b && (b = bpe_load(path))) {
    vocabs = realloc(vocabs, sizeof(*vocabs) * (size_t)(nvocabs + 1));
    ASSERT(vocabs);
    vocabs[nvocabs].path = strdup(path);
    ASSERT(vocabs[nvocabs].path);
    vocabs[nvocabs].bpe = b;
    vocabs[nvocabs++].refs = 1;
  }
  pthread_mutex_unlock(&vocab_lock);
  return b;
}

void tokenizer_free(Tokenizer *t) {
  if (!t->bpe)
    return;
  pthread_mutex_lock(&vocab_lock);
  for (int i = 0; i < nvocabs; i++)
    if (vocabs[i].bpe == t->bpe && --vocabs[i].refs == 0) {
      bpe_free(vocabs[i].bpe);
      free(vocabs[i].path);
      vocabs[i] = vocabs[--nvocabs];
      break;
    }
  pthread_mutex_unlock(&vocab_lock);
  t->bpe = NULL;
}

/* Checks that every key of map is in keys[]; the message names the key. */
static bool check_keys(const YamlNode *map, const char *where, const char *component,
                       const char *const *keys, int nkeys) {
  for (int i = 0; i < map->n; i++) {
    int k = 0;
    while (k < nkeys && strcmp(keys[k], map->keys[i]) != 0)
      k++;
    if (k < nkeys)
      continue;
    Buf b = {0};
    for (int j = 0; j < nkeys; j++)
      buf_printf(&b, "%s%s", j ? ", " : "", keys[j]);
    error_at(map->key_pos[i], "unknown key '%s.%s' for %s; expected one of: %s", where, map->keys[i],
             component, b.data);
    buf_free(&b);
    return false;
  }
  return true;
}

static const char *const llama4_transform = "torchtune.models.llama4.llama4_transform";

bool tokenizer_from_config(const YamlNode *node, Tokenizer *out) {
  static const char *const byte_keys[] = {"_component_", "max_seq_len"};
  static const char *const l4_keys[] = {"_component_",         "path",           "max_seq_len", "image_size",
                                        "max_num_tiles",       "special_tokens_path", "prompt_template"};
  if (node->kind != YAML_MAP) {
    error_at(node->pos, "tokenizer: expected a mapping");
    return false;
  }
  const YamlNode *c = yaml_get(node, "_component_");
  const char *comp = NULL;
  if (!c) {
    error_at(node->pos, "tokenizer: missing _component_");
    return false;
  }
  if (!yaml_string(c, "tokenizer._component_", &comp))
    return false;
  bool l4 = strcmp(comp, llama4_transform) == 0;
  if (!l4 && strcmp(comp, "optc.tokenizers.byte_tokenizer") != 0) {
    error_at(c->pos, "tokenizer._component_: unknown tokenizer '%s'; expected optc.tokenizers.byte_tokenizer or %s",
             comp, llama4_transform);
    return false;
  }
  if (l4 ? !check_keys(node, "tokenizer", comp, l4_keys, (int)ARRAY_LEN(l4_keys))
         : !check_keys(node, "tokenizer", comp, byte_keys, (int)ARRAY_LEN(byte_keys)))
    return false;
  Tokenizer t = tokenizer_byte();
  if (l4) {
    t = (Tokenizer){TOKENIZER_LLAMA4, LLAMA4_VOCAB, LLAMA4_BOS, LLAMA4_EOS, LLAMA4_PAD, 8192, NULL};
    /* what would change the text: torchtune's defaults only */
    static const char *const text_keys[] = {"special_tokens_path", "prompt_template"};
    static const char *const why[] = {
        "a tokenizer.json's special tokens are not supported; optc uses Llama 4's canonical ones (torchtune's default)",
        "prompt templates are not supported (torchtune's default, null, is what optc computes)"};
    for (size_t k = 0; k < ARRAY_LEN(text_keys); k++) {
      const YamlNode *v = yaml_get(node, text_keys[k]);
      if (v && !yaml_is_null(v)) {
        error_at(v->pos, "tokenizer.%s: %s", text_keys[k], why[k]);
        return false;
      }
    }
    long dummy;
    if (yaml_get(node, "image_size") &&
        !yaml_int_in(yaml_get(node, "image_size"), "tokenizer.image_size", 1, INT32_MAX, &dummy))
      return false;
    if (yaml_get(node, "max_num_tiles") &&
        !yaml_int_in(yaml_get(node, "max_num_tiles"), "tokenizer.max_num_tiles", 1, INT32_MAX, &dummy))
      return false;
  }
  const YamlNode *m = yaml_get(node, "max_seq_len");
  if (m) {
    t.max_seq_len = 0;
    if (!yaml_is_null(m)) {
      long v;
      if (!yaml_int_in(m, "tokenizer.max_seq_len", 2, 1 << 20, &v))
        return false;
      t.max_seq_len = (int)v;
    }
  }
  if (l4) {
    const YamlNode *p = yaml_get(node, "path");
    const char *path;
    if (!p) {
      error_at(node->pos, "tokenizer: %s needs path: the tiktoken tokenizer.model file", comp);
      return false;
    }
    if (!yaml_string(p, "tokenizer.path", &path))
      return false;
    FILE *f = fopen(path, "rb");
    if (!f) {
      error_at(p->pos, "tokenizer.path: cannot open '%s': %s", path, strerror(errno));
      return false;
    }
    fclose(f);
    t.bpe = vocab_get(path);
    if (!t.bpe) {
      note_at(p->pos, "the tokenizer named here");
      return false;
    }
  }
  *out = t;
  return true;
}

int tokenizer_encode(const Tokenizer *t, const char *s, size_t n, bool add_bos, bool add_eos, Ids *out) {
  if (t->kind == TOKENIZER_LLAMA4)
    return bpe_encode(t->bpe, s, n, add_bos, add_eos, out);
  int n0 = out->n;
  if (add_bos)
    ids_push(out, t->bos_id);
  for (size_t i = 0; i < n; i++)
    ids_push(out, (unsigned char)s[i]);
  if (add_eos)
    ids_push(out, t->eos_id);
  return out->n - n0;
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, bool truncate_at_eos, bool skip_special,
                     Buf *out) {
  if (t->kind == TOKENIZER_LLAMA4)
    return bpe_decode(t->bpe, ids, n, truncate_at_eos, skip_special, out);
  if (truncate_at_eos) { /* torchtune's rule: an eos at ids[0] truncates nothing */
    int k = 0;
    while (k < n && ids[k] != t->eos_id)
      k++;
    if (k > 0 && k < n)
      n = k;
  }
  for (int i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      buf_putc(out, (char)id);
    } else if (id == t->bos_id || id == t->eos_id || id == t->pad_id) {
      if (!skip_special)
        buf_puts(out, id == t->bos_id ? "<bos>" : id == t->eos_id ? "<eos>" : "<pad>");
    } else {
      error("cannot decode token id %d: the byte tokenizer's ids are 0..%d", id, BYTE_VOCAB - 1);
      return -1;
    }
  }
  return 0;
}

/* ---- prompts -------------------------------------------------------------------- */

void prompt_format(PromptTemplate tpl, const char *instruction, const char *input, Buf *out) {
  bool has_input = input && *input;
  if (tpl == TEMPLATE_ALPACA)
    buf_puts(out, has_input ? "Below is an instruction that describes a task, paired with an input that "
                              "provides further context. Write a response that appropriately completes "
                              "the request.\n\n"
                            : "Below is an instruction that describes a task. Write a response that "
                              "appropriately completes the request.\n\n");
  buf_printf(out, "### Instruction:\n%s\n\n", instruction);
  if (has_input)
    buf_printf(out, "### Input:\n%s\n\n", input);
  buf_puts(out, "### Response:\n");
}


/* ---- rows ------------------------------------------------------------------------
 * A list of rows in flat arrays: row i is [off[i], off[i+1]). pos and seg are
 * kept only for packed rows. */
typedef struct {
  int32_t *tok, *tgt, *pos, *seg;
  int64_t ntok, captok;
  int64_t *off; /* (n + 1) */
  int n, cap;
  bool has_pos;
} Rows;

static void rows_init(Rows *r, bool has_pos) {
  *r = (Rows){0};
  r->has_pos = has_pos;
  r->cap = 64;
  r->off = malloc(sizeof(int64_t) * (size_t)(r->cap + 1));
  ASSERT(r->off);
  r->off[0] = 0;
}

static void rows_free(Rows *r) {
  free(r->tok);
  free(r->tgt);
  free(r->pos);
  free(r->seg);
  free(r->off);
  *r = (Rows){0};
}

static void *grow(void *p, int64_t n, size_t elt) {
  p = realloc(p, (size_t)n * elt);
  ASSERT(p);
  return p;
}

/* Appends one row; pos and seg are read only when r keeps them. */
static void rows_add(Rows *r, const int32_t *tok, const int32_t *tgt, const int32_t *pos, const int32_t *seg,
                     int len) {
  if (r->ntok + len > r->captok) {
    int64_t cap = r->captok ? r->captok : 4096;
    while (cap < r->ntok + len)
      cap *= 2;
    r->tok = grow(r->tok, cap, sizeof(int32_t));
    r->tgt = grow(r->tgt, cap, sizeof(int32_t));
    if (r->has_pos) {
      r->pos = grow(r->pos, cap, sizeof(int32_t));
      r->seg = grow(r->seg, cap, sizeof(int32_t));
    }
    r->captok = cap;
  }
  if (r->n == r->cap) {
    r->cap *= 2;
    r->off = grow(r->off, r->cap + 1, sizeof(int64_t));
  }
  memcpy(r->tok + r->ntok, tok, sizeof(int32_t) * (size_t)len);
  memcpy(r->tgt + r->ntok, tgt, sizeof(int32_t) * (size_t)len);
  if (r->has_pos) {
    memcpy(r->pos + r->ntok, pos, sizeof(int32_t) * (size_t)len);
    memcpy(r->seg + r->ntok, seg, sizeof(int32_t) * (size_t)len);
  }
  r->ntok += len;
  r->off[++r->n] = r->ntok;
}

static int rows_len(const Rows *r, int i) { return (int)(r->off[i + 1] - r->off[i]); }

/* Appends rows [lo, hi) of src to dst (both packed, or both not). */
static void rows_append(Rows *dst, const Rows *src, int lo, int hi) {
  ASSERT(dst->has_pos == src->has_pos);
  for (int i = lo; i < hi; i++) {
    int64_t o = src->off[i];
    rows_add(dst, src->tok + o, src->tgt + o, src->has_pos ? src->pos + o : NULL, src->has_pos ? src->seg + o : NULL,
             rows_len(src, i));
  }
}

/* What torchtune's PackedDataset pads a pack with: its padding_idx, which
 * torchtune's dataset builders leave at the default, 0 (not the tokenizer's
 * pad_id, which only the unpacked collate uses). */
enum { PACK_PAD = 0 };

/* Greedy packing of unpacked rows [lo, hi) of src into rows of exactly L
 * (torchtune's PackedDataset, split_across_pack=False). */
static void rows_pack(Rows *dst, const Rows *src, int lo, int hi, int L, int32_t pad) {
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)L * 4);
  ASSERT(tok);
  int32_t *tgt = tok + L, *pos = tok + 2 * L, *seg = tok + 3 * L;
  int fill = 0, nseg = 0;
  for (int i = lo; i <= hi; i++) {
    int n = i < hi ? rows_len(src, i) : 0;
    ASSERT(n <= L);
    if (fill > 0 && (i == hi || fill + n > L)) {
      for (int t = fill; t < L; t++) {
        tok[t] = pad;
        tgt[t] = -100;
        pos[t] = MIN(pos[fill - 1] + (t - fill) + 1, L - 1);
        seg[t] = nseg;
      }
      rows_add(dst, tok, tgt, pos, seg, L);
      fill = nseg = 0;
    }
    if (i == hi)
      break;
    memcpy(tok + fill, src->tok + src->off[i], sizeof(int32_t) * (size_t)n);
    memcpy(tgt + fill, src->tgt + src->off[i], sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) {
      pos[fill + t] = t;
      seg[fill + t] = nseg;
    }
    fill += n;
    nseg++;
  }
  free(tok);
}


/* ---- datasets -------------------------------------------------------------------- */

struct Dataset {
  Rows split[2]; /* SPLIT_TRAIN, SPLIT_HELDOUT */
  int64_t ntokens[2]; /* the samples' tokens, before packing */
  bool packed;
  int max_seq_len;
  int32_t pad_id;
  int bad_lines, truncated;
  const char *name; /* static: the component's short name */
};

int dataset_num_samples(const Dataset *ds, DataSplit split) {
  return split == SPLIT_ALL ? ds->split[0].n + ds->split[1].n : ds->split[split].n;
}
bool dataset_packed(const Dataset *ds) { return ds->packed; }
int dataset_max_seq_len(const Dataset *ds) { return ds->max_seq_len; }
int dataset_bad_lines(const Dataset *ds) { return ds->bad_lines; }
int dataset_truncated(const Dataset *ds) { return ds->truncated; }

void dataset_free(Dataset *ds) {
  if (!ds)
    return;
  rows_free(&ds->split[0]);
  rows_free(&ds->split[1]);
  free(ds);
}

DataRow dataset_row(const Dataset *ds, DataSplit split, int i) {
  const Rows *r = &ds->split[0];
  if (split == SPLIT_HELDOUT || (split == SPLIT_ALL && i >= r->n)) {
    if (split == SPLIT_ALL)
      i -= r->n;
    r = &ds->split[1];
  }
  ASSERT(i >= 0 && i < r->n);
  int64_t o = r->off[i];
  return (DataRow){r->tok + o, r->tgt + o, r->has_pos ? r->pos + o : NULL, r->has_pos ? r->seg + o : NULL,
                   rows_len(r, i)};
}

void dataset_describe(const Dataset *ds, Buf *out) {
  int64_t counted = 0;
  for (int s = 0; s < 2; s++) {
    const Rows *r = &ds->split[s];
    for (int64_t t = 0; t < r->ntok; t++)
      counted += r->tgt[t] != -100;
  }
  buf_printf(out, "%s: %d train + %d held-out %s, %lld tokens, %lld counted, packed: %s", ds->name,
             ds->split[0].n, ds->split[1].n, ds->packed ? "packs" : "samples",
             (long long)(ds->ntokens[0] + ds->ntokens[1]), (long long)counted, ds->packed ? "yes" : "no");
  if (ds->truncated)
    buf_printf(out, ", %d truncated", ds->truncated);
  if (ds->bad_lines)
    buf_printf(out, ", %d malformed lines skipped", ds->bad_lines);
}

static void dump_ints(Buf *out, const char *key, const int32_t *v, int n, bool first) {
  buf_printf(out, "%s\"%s\": [", first ? "" : ", ", key);
  for (int i = 0; i < n; i++)
    buf_printf(out, "%s%d", i ? ", " : "", v[i]);
  buf_putc(out, ']');
}

void dataset_dump_row(const Dataset *ds, DataSplit split, int i, Buf *out) {
  DataRow r = dataset_row(ds, split, i);
  buf_putc(out, '{');
  dump_ints(out, "tokens", r.tokens, r.len, true);
  dump_ints(out, "labels", r.targets, r.len, false);
  if (r.positions) {
    dump_ints(out, "input_pos", r.positions, r.len, false);
    /* seq_lens: the segments' lengths, the padding's last */
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)(r.len + 1));
    ASSERT(lens);
    int k = 0;
    for (int t = 0; t < r.len; t++) {
      if (t == 0 || r.segments[t] != r.segments[t - 1])
        lens[k++] = 0;
      lens[k - 1]++;
    }
    dump_ints(out, "seq_lens", lens, k, false);
    free(lens);
  }
  buf_puts(out, "}\n");
}

/* ---- samples ------------------------------------------------------------------------
 * What one dataset block asks for, read from its keys, and where its
 * samples go. */
typedef struct {
  const Tokenizer *tok;
  int L;
  PromptTemplate tpl;
  bool train_on_input, skip_bad;
  Rows *out;      /* unpacked samples, in order */
  int *truncated; /* counts samples cut at L */
} SampleSink;

/* Appends one sample of tokens and torchtune's mask: cut at L as
 * torchtune's truncate() (the last token made eos, masked), then
 * targets[t] = mask[t+1] ? -100 : tokens[t+1] and the last -100. */
static void add_masked_sample(SampleSink *sk, int32_t *tok, bool *mask, int n) {
  if (n > sk->L) {
    n = sk->L;
    tok[n - 1] = sk->tok->eos_id;
    mask[n - 1] = true;
    (*sk->truncated)++;
  }
  int32_t *tgt = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  ASSERT(tgt);
  for (int t = 0; t < n; t++)
    tgt[t] = t + 1 < n && !mask[t + 1] ? tok[t + 1] : -100;
  rows_add(sk->out, tok, tgt, NULL, NULL, n);
  free(tgt);
}

/* One chat through Llama4Transform.tokenize_messages (no cut: the cut
 * above gives torchtune's tokens and mask, which stop adding messages once
 * max_seq_len is reached and then cut the same prefix). false (error
 * printed) on text that is not UTF-8, which JSON's strings never are. */
static bool add_chat_sample(SampleSink *sk, const ChatMessage *m, int n) {
  ChatTokens ct;
  if (llama4_tokenize_messages(sk->tok->bpe, m, n, NULL, &ct) != 0)
    return false;
  add_masked_sample(sk, ct.tokens, ct.mask, ct.n);
  chat_tokens_free(&ct);
  return true;
}

/* One alpaca sample. Byte tokenizer: bos, prompt, response, eos, the prompt
 * masked unless train_on_input. Llama 4: AlpacaToMessages's user and
 * assistant messages. */
static bool add_alpaca_sample(SampleSink *sk, const char *instruction, const char *input, const char *output,
                              size_t output_len) {
  Buf p = {0};
  prompt_format(sk->tpl, instruction, input, &p);
  if (sk->tok->kind == TOKENIZER_LLAMA4) {
    ChatMessage m[2] = {{"user", p.data, false, true}, {"assistant", output, false, true}};
    chat_mask_messages(m, 2, sk->train_on_input ? TRAIN_ON_ALL : TRAIN_ON_ASSISTANT);
    bool ok = add_chat_sample(sk, m, 2);
    buf_free(&p);
    return ok;
  }
  int64_t n64 = 1 + (int64_t)p.len + (int64_t)output_len + 1;
  int n = (int)MIN(n64, (int64_t)sk->L);
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n * 2);
  ASSERT(tok);
  int32_t *tgt = tok + n;
  /* masked[t]: token t is no one's target. The prompt (and bos) unless
   * train_on_input; a truncating eos always. */
  int P = 1 + (int)MIN((int64_t)p.len, (int64_t)n - 1);
  tok[0] = sk->tok->bos_id;
  for (int i = 0; i < P - 1; i++)
    tok[1 + i] = (unsigned char)p.data[i];
  int R = (int)MIN((int64_t)output_len, (int64_t)(n - P));
  for (int i = 0; i < R; i++)
    tok[P + i] = (unsigned char)output[i];
  if (P + R < n)
    tok[n - 1] = sk->tok->eos_id;
  bool cut = n64 > sk->L;
  if (cut) {
    tok[n - 1] = sk->tok->eos_id;
    (*sk->truncated)++;
  }
  int first = sk->train_on_input ? 1 : P; /* first token that is a target */
  for (int t = 0; t < n; t++) {
    int next = t + 1;
    bool counted = next < n && next >= first && !(cut && next == n - 1);
    tgt[t] = counted ? tok[next] : -100;
  }
  rows_add(sk->out, tok, tgt, NULL, NULL, n);
  free(tok);
  buf_free(&p);
  return true;
}

/* Whether path can be read; else an error at the recipe key that names it
 * (file_read's own error has no position). hfdata.c uses it too. */
bool data_can_open(const char *path, SrcPos at, const char *what) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    error_at(at, "%s: cannot open '%s': %s", what, path, strerror(errno));
    return false;
  }
  fclose(f);
  return true;
}

/* encode(file, bos, eos), in windows of L tokens with their next tokens. */
static bool load_text_file(SampleSink *sk, const char *path, SrcPos at, const char *what) {
  if (!data_can_open(path, at, what))
    return false;
  size_t len;
  char *text = file_read(path, &len);
  if (!text)
    return false;
  if (len > (size_t)INT32_MAX - 2) {
    error_at(at, "%s: '%s' is larger than 2 GiB", what, path);
    free(text);
    return false;
  }
  Ids stream = {0};
  bool ok = tokenizer_encode(sk->tok, text, len, true, true, &stream) >= 0;
  if (!ok)
    note_at(at, "in the file '%s' named here", path);
  int64_t n = stream.n;
  for (int64_t s = 0; ok && s + 1 < n; s += sk->L) {
    int m = (int)MIN((int64_t)sk->L, n - 1 - s);
    rows_add(sk->out, stream.v + s, stream.v + s + 1, NULL, NULL, m);
  }
  ids_free(&stream);
  free(text);
  return ok;
}

/* ---- the synthetic instruction set ------------------------------------------------ */

typedef struct {
  char *instruction, *input, *output;
} SynSample;

static const char *const syn_words[] = {
    "red",  "blue",  "green", "cat",   "dog",  "bird",  "fish",  "tree",  "sun",   "moon",  "star",
    "rain", "snow",  "wind",  "fire",  "stone", "river", "hill",  "road",  "house", "door",  "book",
    "milk", "bread", "apple", "lemon", "tiger", "horse", "mouse", "cloud", "sea",   "sand",
};

static void syn_letters(uint64_t *st, int lo, int hi, Buf *b) {
  int n = rand_range(st, lo, hi);
  for (int i = 0; i < n; i++)
    buf_putc(b, (char)('a' + rand_below(st, 26)));
}

/* One sample of a task chosen uniformly; in, out get the input and output. */
static void syn_one(uint64_t *st, Buf *ins, Buf *in, Buf *out) {
  int task = (int)rand_below(st, 12);
  switch (task) {
  case 0: {
    int a = rand_range(st, 0, 99), b = rand_range(st, 0, 99);
    buf_puts(ins, "Add the two numbers.");
    buf_printf(in, "%d + %d", a, b);
    buf_printf(out, "%d", a + b);
    break;
  }
  case 1: {
    int a = rand_range(st, 0, 99), b = rand_range(st, 0, a);
    buf_puts(ins, "Subtract the second number from the first.");
    buf_printf(in, "%d - %d", a, b);
    buf_printf(out, "%d", a - b);
    break;
  }
  case 2: {
    int a = rand_range(st, 0, 99), b = rand_range(st, 0, 98);
    b += b >= a;
    buf_puts(ins, "Which number is larger?");
    buf_printf(in, "%d %d", a, b);
    buf_printf(out, "%d", MAX(a, b));
    break;
  }
  case 3: {
    int a = rand_range(st, 0, 49), b = rand_range(st, 0, 49);
    buf_printf(ins, "What is %d plus %d?", a, b);
    buf_printf(out, "%d", a + b);
    break;
  }
  case 4: {
    int a = rand_range(st, 0, 998);
    buf_printf(ins, "What number comes after %d?", a);
    buf_printf(out, "%d", a + 1);
    break;
  }
  case 5:
    buf_puts(ins, "Repeat the input exactly.");
    syn_letters(st, 3, 8, in);
    buf_puts(out, in->data);
    break;
  case 6:
    buf_puts(ins, "Reverse the letters.");
    syn_letters(st, 3, 8, in);
    for (size_t i = in->len; i-- > 0;)
      buf_putc(out, in->data[i]);
    break;
  case 7: {
    buf_puts(ins, "Convert the text to upper case.");
    int n = rand_range(st, 2, 3);
    for (int i = 0; i < n; i++)
      buf_printf(in, "%s%s", i ? " " : "", syn_words[rand_below(st, ARRAY_LEN(syn_words))]);
    for (size_t i = 0; i < in->len; i++)
      buf_putc(out, in->data[i] >= 'a' && in->data[i] <= 'z' ? (char)(in->data[i] - 'a' + 'A') : in->data[i]);
    break;
  }
  case 8:
    buf_puts(ins, "Count the letters.");
    syn_letters(st, 1, 12, in);
    buf_printf(out, "%zu", in->len);
    break;
  case 9: {
    buf_puts(ins, "Sort the letters alphabetically.");
    syn_letters(st, 3, 8, in);
    int count[26] = {0};
    for (size_t i = 0; i < in->len; i++)
      count[in->data[i] - 'a']++;
    for (int c = 0; c < 26; c++)
      for (int k = 0; k < count[c]; k++)
        buf_putc(out, (char)('a' + c));
    break;
  }
  case 10:
  case 11: {
    /* counting runs: long answers, each number predictable from the last */
    int k = rand_range(st, 3, 8), up = task == 10;
    int a = up ? rand_range(st, 0, 990) : rand_range(st, k - 1, 999), b = up ? a + k - 1 : a - k + 1;
    buf_printf(ins, "Count %s from %d to %d.", up ? "up" : "down", a, b);
    for (int i = 0; i < k; i++)
      buf_printf(out, "%s%d", i ? " " : "", up ? a + i : a - i);
    break;
  }
  default: unreachable();
  }
}

/* FNV-1a over a, a unit separator, then b. */
static uint64_t hash_pair(const char *a, const char *b) {
  uint64_t h = fnv1a(a, strlen(a), FNV1A_BASIS);
  h = fnv1a("\x1f", 1, h);
  return fnv1a(b, strlen(b), h);
}

/* n samples with distinct (instruction, input), in generation order. NULL
 * (error printed) when they cannot be found. The caller frees with
 * syn_free(s, n). */
static SynSample *syn_generate(int n, uint64_t seed) {
  SynSample *s = calloc((size_t)n, sizeof(SynSample));
  int cap = 16;
  while (cap < 2 * n)
    cap *= 2;
  int *table = malloc(sizeof(int) * (size_t)cap); /* sample index + 1, or 0 */
  ASSERT(s && table);
  memset(table, 0, sizeof(int) * (size_t)cap);
  uint64_t st = mix64(seed ^ 0x53594e5448455449ull); /* "SYNTHETI" */
  int have = 0;
  int64_t tries = 0, max_tries = 64 * (int64_t)n + 4096;
  Buf ins = {0}, in = {0}, out = {0};
  while (have < n && tries++ < max_tries) {
    ins.len = in.len = out.len = 0;
    buf_reserve(&ins, 0), buf_reserve(&in, 0), buf_reserve(&out, 0);
    ins.data[0] = in.data[0] = out.data[0] = 0;
    syn_one(&st, &ins, &in, &out);
    uint64_t h = hash_pair(ins.data, in.data);
    int slot = (int)(h & (uint64_t)(cap - 1));
    bool dup = false;
    while (table[slot]) {
      const SynSample *o = &s[table[slot] - 1];
      if (strcmp(o->instruction, ins.data) == 0 && strcmp(o->input, in.data) == 0) {
        dup = true;
        break;
      }
      slot = (slot + 1) & (cap - 1);
    }
    if (dup)
      continue;
    s[have] = (SynSample){xstrdup(ins.data), xstrdup(in.data), xstrdup(out.data)};
    table[slot] = ++have;
  }
  buf_free(&ins), buf_free(&in), buf_free(&out);
  free(table);
  if (have < n) {
    error("synthetic_alpaca: found only %d distinct samples of the %d asked for", have, n);
    for (int i = 0; i < have; i++)
      free(s[i].instruction), free(s[i].input), free(s[i].output);
    free(s);
    return NULL;
  }
  return s;
}

static void syn_free(SynSample *s, int n) {
  for (int i = 0; i < n; i++)
    free(s[i].instruction), free(s[i].input), free(s[i].output);
  free(s);
}

typedef struct {
  const SynSample *s;
  int n;
} SynFile;

static int syn_fill(FILE *f, void *ctx) {
  const SynFile *sf = ctx;
  for (int i = 0; i < sf->n; i++) {
    json_t *o = json_pack("{s:s, s:s, s:s}", "instruction", sf->s[i].instruction, "input", sf->s[i].input,
                          "output", sf->s[i].output);
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!line)
      return -1;
    int rc = fputs(line, f) < 0 || fputc('\n', f) == EOF ? -1 : 0;
    free(line);
    if (rc)
      return -1;
  }
  return 0;
}

int synthetic_alpaca_write(const char *path, int num_samples, uint64_t seed) {
  SynSample *s = syn_generate(num_samples, seed);
  if (!s)
    return -1;
  SynFile sf = {s, num_samples};
  int rc = file_write_atomic_with(path, syn_fill, &sf);
  syn_free(s, num_samples);
  return rc;
}


/* ---- the dataset block ------------------------------------------------------------- */

enum { DS_ALPACA, DS_ALPACA_CLEANED, DS_INSTRUCT, DS_CHAT, DS_TEXT, DS_SYNTHETIC };

#define HF_KEYS "_component_", "source", "data_files", "split", "packed", "train_on_input", "filter_fn", \
                "on_bad_line", "holdout_fraction"

static const struct {
  const char *component, *name, *default_source;
  const char *keys[16];
} ds_components[] = {
    [DS_ALPACA] = {"torchtune.datasets.alpaca_dataset", "alpaca_dataset", "tatsu-lab/alpaca",
                   {HF_KEYS, "column_map", "template"}},
    [DS_ALPACA_CLEANED] = {"torchtune.datasets.alpaca_cleaned_dataset", "alpaca_cleaned_dataset",
                           "yahma/alpaca-cleaned", {HF_KEYS, "column_map", "template"}},
    [DS_INSTRUCT] = {"torchtune.datasets.instruct_dataset", "instruct_dataset", NULL,
                     {HF_KEYS, "column_map", "new_system_prompt"}},
    [DS_CHAT] = {"torchtune.datasets.chat_dataset", "chat_dataset", NULL,
                 {HF_KEYS, "conversation_column", "conversation_style", "new_system_prompt"}},
    [DS_TEXT] = {"optc.datasets.text_file", "text_file", NULL, {"_component_", "path", "packed", "holdout_fraction"}},
    [DS_SYNTHETIC] = {"optc.datasets.synthetic_alpaca", "synthetic_alpaca", NULL,
                      {"_component_", "num_samples", "seed", "holdout_fraction", "packed", "template",
                       "train_on_input"}},
};

static int nkeys(const char *const *keys) {
  int n = 0;
  while (n < 16 && keys[n])
    n++;
  return n;
}

static const char *key_path(const char *where, const char *key, char *buf, size_t n) {
  snprintf(buf, n, "%s.%s", where, key);
  return buf;
}

/* Optional keys: absent or null leaves *out alone. */
static bool opt_bool(const YamlNode *node, const char *where, const char *key, bool *out) {
  const YamlNode *n = yaml_get(node, key);
  char path[256];
  return yaml_is_null(n) || yaml_bool(n, key_path(where, key, path, sizeof path), out);
}

static bool opt_long(const YamlNode *node, const char *where, const char *key, long lo, long hi, long *out) {
  const YamlNode *n = yaml_get(node, key);
  char path[256];
  return yaml_is_null(n) || yaml_int_in(n, key_path(where, key, path, sizeof path), lo, hi, out);
}

static bool opt_double(const YamlNode *node, const char *where, const char *key, double *out) {
  const YamlNode *n = yaml_get(node, key);
  char path[256];
  return yaml_is_null(n) || yaml_double(n, key_path(where, key, path, sizeof path), out);
}

static bool opt_string(const YamlNode *node, const char *where, const char *key, const char **out) {
  const YamlNode *n = yaml_get(node, key);
  char path[256];
  return !n || yaml_is_null(n) || yaml_string(n, key_path(where, key, path, sizeof path), out);
}

static bool read_template(const YamlNode *node, const char *where, PromptTemplate *tpl) {
  const YamlNode *n = yaml_get(node, "template");
  char path[256];
  const char *s;
  if (!n || yaml_is_null(n))
    return true;
  if (!yaml_string(n, key_path(where, "template", path, sizeof path), &s))
    return false;
  if (strcmp(s, "alpaca") == 0)
    *tpl = TEMPLATE_ALPACA;
  else if (strcmp(s, "compact") == 0)
    *tpl = TEMPLATE_COMPACT;
  else {
    error_at(n->pos, "%s: unknown template '%s'; expected alpaca or compact", path, s);
    return false;
  }
  return true;
}

/* column_map: keys from want[] (required ones first nreq), values strings;
 * the mapped names go to cols[]. */
static bool read_column_map(const YamlNode *node, const char *where, const char *comp, const char *const *want,
                            int nwant, int nreq, const char **cols) {
  const YamlNode *cm = yaml_get(node, "column_map");
  char path[256], p2[300];
  if (!cm || yaml_is_null(cm))
    return true;
  snprintf(path, sizeof path, "%s.column_map", where);
  if (cm->kind != YAML_MAP) {
    error_at(cm->pos, "%s: expected a mapping", path);
    return false;
  }
  if (!check_keys(cm, path, comp, want, nwant))
    return false;
  for (int i = 0; i < nwant; i++) {
    const YamlNode *v = yaml_get(cm, want[i]);
    snprintf(p2, sizeof p2, "%s.%s", path, want[i]);
    if (!v && i < nreq) { /* torchtune's message transforms insist */
      error_at(cm->pos, "%s: Expected a key of '%s' in column_map", path, want[i]);
      return false;
    }
    if (v && !yaml_string(v, p2, &cols[i]))
      return false;
  }
  return true;
}

/* What a block's rows become: the columns it reads, by role. */
typedef struct {
  int kind;
  const char *col[3];          /* alpaca: instruction, input, output; instruct: input, output; chat: conversations */
  const char *system_prompt;   /* new_system_prompt, or NULL */
  bool openai;                 /* chat: conversation_style */
} RowPlan;

/* A row's value of column name: NULL when absent or null. */
static json_t *row_get(const HfTable *t, int i, const char *name) {
  json_t *v = json_object_get(t->rows[i], name);
  return v && !json_is_null(v) ? v : NULL;
}

/* Turns row i into a sample. false with *why set (a static or row-local
 * message, in buf) when the row is malformed; a UTF-8 failure prints its
 * own error and sets *fatal. */
static bool row_sample(SampleSink *sk, const RowPlan *rp, const HfTable *t, int i, char *buf, size_t bn,
                       const char **why, bool *fatal) {
  *why = NULL;
  *fatal = false;
  if (rp->kind == DS_ALPACA || rp->kind == DS_ALPACA_CLEANED) {
    json_t *ins = row_get(t, i, rp->col[0]), *in = row_get(t, i, rp->col[1]), *out = row_get(t, i, rp->col[2]);
    const char *bad = !ins ? rp->col[0] : !json_is_string(ins) ? rp->col[0] : !out ? rp->col[2]
                      : !json_is_string(out) ? rp->col[2] : in && !json_is_string(in) ? rp->col[1] : NULL;
    if (bad) {
      json_t *v = row_get(t, i, bad);
      snprintf(buf, bn, "\"%s\" %s", bad, !v ? (json_object_get(t->rows[i], bad) ? "is null" : "is missing")
                                           : "is not a string");
      *why = buf;
      return false;
    }
    if (!add_alpaca_sample(sk, json_string_value(ins), in ? json_string_value(in) : NULL, json_string_value(out),
                           json_string_length(out)))
      return *fatal = true, false;
    return true;
  }
  ChatMessage m[257];
  int n = 0;
  if (rp->system_prompt)
    m[n++] = (ChatMessage){"system", rp->system_prompt, true, true};
  if (rp->kind == DS_INSTRUCT) {
    json_t *in = row_get(t, i, rp->col[0]), *out = row_get(t, i, rp->col[1]);
    const char *bad = !in || !json_is_string(in) ? rp->col[0] : !out || !json_is_string(out) ? rp->col[1] : NULL;
    if (bad) {
      json_t *v = row_get(t, i, bad);
      snprintf(buf, bn, "\"%s\" %s", bad, v ? "is not a string" : json_object_get(t->rows[i], bad) ? "is null"
                                                                                                   : "is missing");
      *why = buf;
      return false;
    }
    m[n++] = (ChatMessage){"user", json_string_value(in), false, true};
    m[n++] = (ChatMessage){"assistant", json_string_value(out), false, true};
  } else {
    json_t *conv = row_get(t, i, rp->col[0]);
    if (!conv || !json_is_array(conv)) {
      snprintf(buf, bn, "\"%s\" %s", rp->col[0], conv ? "is not a list of messages" : "is missing or null");
      *why = buf;
      return false;
    }
    size_t nm = json_array_size(conv);
    for (size_t k = 0; k < nm; k++) {
      json_t *msg = json_array_get(conv, k);
      const char *role, *text;
      if (!json_is_object(msg)) {
        snprintf(buf, bn, "\"%s\"[%zu] is not an object", rp->col[0], k);
        *why = buf;
        return false;
      }
      if (!rp->openai) {
        static const char *const from[] = {"system", "human", "gpt"}, *const to[] = {"system", "user", "assistant"};
        json_t *f = json_object_get(msg, "from"), *v = json_object_get(msg, "value");
        int r = 0;
        while (r < 3 && !(json_is_string(f) && !strcmp(json_string_value(f), from[r])))
          r++;
        if (r == 3 || !json_is_string(v)) {
          snprintf(buf, bn, r == 3 ? "\"%s\"[%zu]: \"from\" must be system, human or gpt (ShareGPT)"
                                   : "\"%s\"[%zu]: \"value\" is not a string", rp->col[0], k);
          *why = buf;
          return false;
        }
        role = to[r];
        text = json_string_value(v);
      } else {
        json_t *r = json_object_get(msg, "role"), *c = json_object_get(msg, "content");
        if (!json_is_string(r)) {
          snprintf(buf, bn, "\"%s\"[%zu]: \"role\" is not a string", rp->col[0], k);
          *why = buf;
          return false;
        }
        role = json_string_value(r);
        text = NULL;
        if (json_is_string(c)) {
          text = json_string_value(c);
        } else if (json_is_array(c)) {
          /* OpenAIToMessages: text parts kept, image_url parts loaded (not here) */
          text = "";
          int parts = 0;
          for (size_t q = 0; q < json_array_size(c); q++) {
            json_t *part = json_array_get(c, q), *ty = json_object_get(part, "type");
            const char *tys = json_is_string(ty) ? json_string_value(ty) : "";
            if (!strcmp(tys, "text")) {
              json_t *tx = json_object_get(part, "text");
              if (!json_is_string(tx)) {
                snprintf(buf, bn, "\"%s\"[%zu]: a text part's \"text\" is not a string", rp->col[0], k);
                *why = buf;
                return false;
              }
              text = json_string_value(tx);
              parts++;
            } else if (!strcmp(tys, "image_url")) {
              snprintf(buf, bn, "\"%s\"[%zu]: images are not supported (text only)", rp->col[0], k);
              *why = buf;
              return false;
            }
          }
          if (parts > 1) {
            snprintf(buf, bn, "\"%s\"[%zu]: %d text parts in one message are not supported (one, or a string)",
                     rp->col[0], k, parts);
            *why = buf;
            return false;
          }
        }
        if (!text) {
          snprintf(buf, bn, "\"%s\"[%zu]: \"content\" is not a string or a list of parts", rp->col[0], k);
          *why = buf;
          return false;
        }
      }
      if (rp->system_prompt && !strcmp(role, "system"))
        continue;
      if (n == (int)ARRAY_LEN(m)) {
        snprintf(buf, bn, "\"%s\": more than %d messages", rp->col[0], (int)ARRAY_LEN(m) - 1);
        *why = buf;
        return false;
      }
      /* OpenAIToMessages: tool output does not end the turn, nor does an
       * assistant message followed by one */
      bool eot = true;
      if (rp->openai) {
        json_t *nx = k + 1 < nm ? json_object_get(json_array_get(conv, k + 1), "role") : NULL;
        const char *nr = json_is_string(nx) ? json_string_value(nx) : "";
        if (!strcmp(role, "tool") || !strcmp(role, "ipython"))
          eot = false;
        else if (!strcmp(role, "assistant") && (!strcmp(nr, "tool") || !strcmp(nr, "ipython")))
          eot = false;
      }
      m[n++] = (ChatMessage){role, text, false, eot};
    }
  }
  /* torchtune's validate_messages */
  if (n < 2) {
    snprintf(buf, bn, "Messages must be at least length 2, but got %d messages", n);
    *why = buf;
    return false;
  }
  const char *last = "assistant";
  for (int k = 0; k < n; k++) {
    const char *r = m[k].role;
    if (!strcmp(r, "assistant") && strcmp(last, "user") && strcmp(last, "tool") && strcmp(last, "ipython"))
      snprintf(buf, bn, "Assistant message before expected user, tool or ipython message at index %d in messages", k);
    else if (!strcmp(r, "user") && !strcmp(last, "user"))
      snprintf(buf, bn, "Two consecutive user messages at index %d and %d in messages", k, k - 1);
    else if (!strcmp(r, "system") && k > 0)
      snprintf(buf, bn, "System message at index %d in messages, but system messages must come first", k);
    else if (!strcmp(r, "tool") || !strcmp(r, "ipython"))
      snprintf(buf, bn, "Tool or ipython message at index %d must follow an ipython message", k);
    else {
      last = r;
      continue;
    }
    *why = buf;
    return false;
  }
  chat_mask_messages(m, n, sk->train_on_input ? TRAIN_ON_ALL : TRAIN_ON_ASSISTANT);
  if (!add_chat_sample(sk, m, n))
    return *fatal = true, false;
  return true;
}

/* The columns a plan reads must be in the table (torchtune: a KeyError on
 * the first sample), and readable. */
static bool check_columns(const HfTable *t, const RowPlan *rp, const YamlNode *node, const char *where) {
  int need = rp->kind == DS_CHAT ? 1 : rp->kind == DS_INSTRUCT ? 2 : 3;
  for (int k = 0; k < need; k++) {
    if (rp->kind <= DS_ALPACA_CLEANED && k == 1)
      continue; /* AlpacaToMessages: input only when the row has it */
    int c = hf_find_column(t, rp->col[k]);
    Buf names = {0};
    for (int j = 0; j < t->ncols; j++)
      buf_printf(&names, "%s%s", j ? ", " : "", t->cols[j].name);
    if (c < 0 && t->n > 0) {
      const char *keys = rp->kind == DS_CHAT ? "conversation_column" : "column_map";
      const YamlNode *kn = yaml_get(node, keys);
      error_at(kn ? kn->pos : node->pos, "%s: the data has no column '%s' (its columns: %s); set %s", where,
               rp->col[k], names.len ? names.data : "none", keys);
    } else if (c >= 0 && t->cols[c].kind == HF_COL_UNREADABLE) {
      error("%s", t->cols[c].why);
      note_at(node->pos, "%s reads the column '%s'", where, rp->col[k]);
      c = -1;
    } else if (c >= 0 && t->cols[c].kind != HF_COL_OK) {
      error_at(node->pos, "%s: column '%s' is %s in a Parquet file, which optc does not read (flat string and "
               "number columns only)", where, rp->col[k], t->cols[c].kind == HF_COL_NESTED ? "nested (a list or "
               "struct)" : "binary (not a string)");
      c = -1;
    } else {
      c = 0;
    }
    buf_free(&names);
    if (c < 0 && t->n > 0)
      return false;
  }
  /* an image column makes torchtune's instruct and ShareGPT transforms multimodal */
  if ((rp->kind == DS_INSTRUCT || (rp->kind == DS_CHAT && !rp->openai)) && hf_find_column(t, "image") >= 0) {
    error_at(node->pos, "%s: the data has an 'image' column, which makes torchtune's transform load images; optc "
             "is text only", where);
    return false;
  }
  return true;
}

/* The rows of a Hugging Face-style block, each through the plan. */
static bool load_hf_rows(SampleSink *sk, const RowPlan *rp, const YamlNode *node, const char *where,
                         const char *default_source, int *bad_lines) {
  HfTable t;
  if (!hf_load(node, where, default_source, sk->skip_bad, bad_lines, &t))
    return false;
  bool ok = check_columns(&t, rp, node, where);
  int bad_here = 0;
  char buf[512];
  for (int i = 0; i < t.n && ok; i++) {
    const char *why;
    bool fatal;
    if (row_sample(sk, rp, &t, i, buf, sizeof buf, &why, &fatal))
      continue;
    if (fatal) {
      ok = false;
      break;
    }
    bad_here++;
    if (!sk->skip_bad || *bad_lines + bad_here <= 10)
      hf_row_message(&t, i, sk->skip_bad, "%s", why);
    ok = sk->skip_bad;
  }
  *bad_lines += bad_here;
  if (ok && *bad_lines) /* JSON's are lines, Parquet's rows */
    diag_printf("%s: warning: skipped %d malformed %s%s\n", where, *bad_lines,
                t.n && !t.pos[0].line ? "row" : "line", *bad_lines == 1 ? "" : "s");
  hf_table_free(&t);
  return ok;
}

/* One block's samples, unpacked, split into train and held-out (and packed
 * when the block says so: each block of a list is packed on its own). */
typedef struct {
  Rows train, held;
  int64_t ntokens[2];
  bool packed;
  int bad_lines, truncated;
  const char *name;
} Part;

static bool build_part(const YamlNode *node, const char *where, const Tokenizer *tok, int L, Part *part) {
  char path[256];
  if (node->kind != YAML_MAP) {
    error_at(node->pos, "%s: expected a mapping", where);
    return false;
  }
  const YamlNode *c = yaml_get(node, "_component_");
  const char *comp;
  if (!c) {
    error_at(node->pos, "%s: missing _component_ (e.g. optc.datasets.synthetic_alpaca)", where);
    return false;
  }
  if (!yaml_string(c, key_path(where, "_component_", path, sizeof path), &comp))
    return false;
  int kind = 0;
  while (kind < (int)ARRAY_LEN(ds_components) && strcmp(ds_components[kind].component, comp) != 0)
    kind++;
  if (kind == (int)ARRAY_LEN(ds_components)) {
    Buf names = {0};
    for (size_t k = 0; k < ARRAY_LEN(ds_components); k++)
      buf_printf(&names, "%s%s", k ? ", " : "", ds_components[k].component);
    error_at(c->pos, "%s: unknown dataset '%s'; expected one of: %s", path, comp, names.data);
    buf_free(&names);
    return false;
  }
  if (!check_keys(node, where, comp, ds_components[kind].keys, nkeys(ds_components[kind].keys)))
    return false;
  part->name = ds_components[kind].name;
  bool hf = kind <= DS_CHAT;

  /* torchtune's defaults: alpaca trains on the input, instruct and chat do not */
  bool packed = false, train_on_input = kind == DS_ALPACA || kind == DS_ALPACA_CLEANED;
  double frac = kind == DS_SYNTHETIC ? 0.1 : 0.0;
  if (!opt_bool(node, where, "packed", &packed) || !opt_bool(node, where, "train_on_input", &train_on_input) ||
      !opt_double(node, where, "holdout_fraction", &frac))
    return false;
  if (!(frac >= 0 && frac < 1)) {
    error_at(yaml_get(node, "holdout_fraction")->pos, "%s.holdout_fraction: %g is not in [0, 1)", where, frac);
    return false;
  }
  if (packed && tok->max_seq_len == 0 && (hf || L > (1 << 20))) { /* optc data: no max_seq_len, no width */
    error_at(yaml_get(node, "packed")->pos, "%s.packed: packing needs tokenizer.max_seq_len (torchtune: "
             "\"PackedDataset requires a max_seq_len to be set on the tokenizer.\")", where);
    return false;
  }
  if ((kind == DS_CHAT || kind == DS_INSTRUCT) && tok->kind != TOKENIZER_LLAMA4) {
    error_at(c->pos, "%s: %s needs a tokenizer with a chat format (%s); the byte tokenizer has none", path, comp,
             llama4_transform);
    return false;
  }
  const YamlNode *ff = yaml_get(node, "filter_fn");
  if (ff && !yaml_is_null(ff)) {
    error_at(ff->pos, "%s.filter_fn: a Python filter cannot run in optc; filter the data file instead", where);
    return false;
  }
  part->packed = packed;

  Rows all;
  rows_init(&all, false);
  SampleSink sk = {tok, L, kind == DS_SYNTHETIC ? TEMPLATE_COMPACT : TEMPLATE_ALPACA, train_on_input, false, &all,
                   &part->truncated};
  if (!read_template(node, where, &sk.tpl))
    goto fail;

  if (kind == DS_SYNTHETIC) {
    long n = 4000, seed = 0;
    if (!opt_long(node, where, "num_samples", 1, 1000000, &n) || !opt_long(node, where, "seed", 0, UINT32_MAX, &seed))
      goto fail;
    SynSample *s = syn_generate((int)n, (uint64_t)seed);
    if (!s)
      goto fail;
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
      ok = add_alpaca_sample(&sk, s[i].instruction, s[i].input, s[i].output, strlen(s[i].output));
    syn_free(s, (int)n);
    if (!ok)
      goto fail;
  } else if (kind == DS_TEXT) {
    const YamlNode *p = yaml_get(node, "path");
    const char *file;
    if (!p) {
      error_at(node->pos, "%s: optc.datasets.text_file needs path: FILE", where);
      goto fail;
    }
    if (!yaml_string(p, key_path(where, "path", path, sizeof path), &file) ||
        !load_text_file(&sk, file, p->pos, path))
      goto fail;
  } else {
    const YamlNode *b = yaml_get(node, "on_bad_line");
    const char *s;
    if (b && !yaml_is_null(b)) {
      if (!yaml_string(b, key_path(where, "on_bad_line", path, sizeof path), &s))
        goto fail;
      if (strcmp(s, "skip") != 0 && strcmp(s, "error") != 0) {
        error_at(b->pos, "%s: expected skip or error, found '%s'", path, s);
        goto fail;
      }
      sk.skip_bad = strcmp(s, "skip") == 0;
    }
    RowPlan rp = {kind, {NULL, NULL, NULL}, NULL, false};
    if (kind == DS_ALPACA || kind == DS_ALPACA_CLEANED) {
      static const char *const want[] = {"instruction", "output", "input"};
      const char *cols[3] = {"instruction", "output", "input"};
      if (!read_column_map(node, where, comp, want, 3, 2, cols))
        goto fail;
      rp.col[0] = cols[0], rp.col[1] = cols[2], rp.col[2] = cols[1];
    } else if (kind == DS_INSTRUCT) {
      static const char *const want[] = {"input", "output"};
      const char *cols[2] = {"input", "output"};
      if (!read_column_map(node, where, comp, want, 2, 2, cols))
        goto fail;
      rp.col[0] = cols[0], rp.col[1] = cols[1];
    } else {
      const char *style = NULL;
      if (!opt_string(node, where, "conversation_column", &rp.col[0]) ||
          !opt_string(node, where, "conversation_style", &style))
        goto fail;
      if (!rp.col[0] || !style) {
        error_at(node->pos, "%s: chat_dataset needs conversation_column and conversation_style (sharegpt or openai)",
                 where);
        goto fail;
      }
      if (strcmp(style, "sharegpt") && strcmp(style, "openai")) {
        error_at(yaml_get(node, "conversation_style")->pos, "%s.conversation_style: Unsupported conversation style: "
                 "%s (sharegpt or openai)", where, style);
        goto fail;
      }
      rp.openai = !strcmp(style, "openai");
    }
    if (!opt_string(node, where, "new_system_prompt", &rp.system_prompt))
      goto fail;
    if (!load_hf_rows(&sk, &rp, node, where, ds_components[kind].default_source, &part->bad_lines))
      goto fail;
  }

  int nheld = (int)floor(frac * all.n + 0.5), ntrain = all.n - nheld;
  rows_init(&part->train, packed);
  rows_init(&part->held, packed);
  for (int s = 0; s < 2; s++) {
    Rows *dst = s ? &part->held : &part->train;
    int lo = s ? ntrain : 0, hi = s ? all.n : ntrain;
    if (packed)
      rows_pack(dst, &all, lo, hi, L, PACK_PAD);
    else
      rows_append(dst, &all, lo, hi);
    part->ntokens[s] = all.off[hi] - all.off[lo];
  }
  rows_free(&all);
  return true;
fail:
  rows_free(&all);
  return false;
}

Dataset *dataset_from_config(const YamlNode *node, const Tokenizer *tok, int max_seq_len) {
  ASSERT(max_seq_len > 1);
  if (!node) {
    error("the recipe has no dataset: block (e.g. {_component_: optc.datasets.synthetic_alpaca})");
    return NULL;
  }
  int nparts = node->kind == YAML_SEQ ? node->n : 1;
  if (node->kind == YAML_SEQ && nparts == 0) {
    error_at(node->pos, "dataset: the list is empty");
    return NULL;
  }
  Dataset *ds = calloc(1, sizeof(Dataset));
  ASSERT(ds);
  ds->max_seq_len = max_seq_len;
  ds->pad_id = tok->pad_id;
  bool ok = true;
  for (int i = 0; i < nparts && ok; i++) {
    const YamlNode *n = node->kind == YAML_SEQ ? node->items[i] : node;
    char where[32];
    if (node->kind == YAML_SEQ)
      snprintf(where, sizeof where, "dataset[%d]", i);
    else
      snprintf(where, sizeof where, "dataset");
    Part p = {0};
    ok = build_part(n, where, tok, max_seq_len, &p);
    if (!ok)
      break;
    if (i == 0) {
      rows_init(&ds->split[0], p.packed);
      rows_init(&ds->split[1], p.packed);
    } else if (p.packed != ds->packed) {
      /* torchtune's ConcatDataset: "can't process a mix of packed and non-packed datasets" */
      error_at(n->pos, "%s: packed is %s here but %s in dataset[0]; a list's datasets must all be packed or all not",
               where, p.packed ? "true" : "false", ds->packed ? "true" : "false");
      ok = false;
    }
    ds->packed = p.packed;
    ds->name = nparts > 1 ? "concat_dataset" : p.name;
    ds->bad_lines += p.bad_lines;
    ds->truncated += p.truncated;
    if (ok) {
      rows_append(&ds->split[0], &p.train, 0, p.train.n);
      rows_append(&ds->split[1], &p.held, 0, p.held.n);
      ds->ntokens[0] += p.ntokens[0];
      ds->ntokens[1] += p.ntokens[1];
    }
    rows_free(&p.train);
    rows_free(&p.held);
  }
  if (ok && ds->split[0].n == 0) {
    error_at(node->pos, "dataset: no training samples");
    ok = false;
  }
  if (!ok) {
    dataset_free(ds);
    return NULL;
  }
  return ds;
}

/* ---- the loader ------------------------------------------------------------------------ */

struct DataLoader {
  const Dataset *ds;
  DataSplit split;
  LoaderOptions o;
  int nrows, nbatches;
  int *perm, perm_epoch; /* the order of perm_epoch */
  int epoch, batch;      /* the next batch */
  int32_t *tok, *tgt, *pos, *seg; /* (batch_size, max_seq_len) */
  int *rows, nlast;
};

DataLoader *dataloader_create(const Dataset *ds, DataSplit split, const LoaderOptions *o) {
  ASSERT(o->batch_size >= 1 && o->world_size >= 1 && o->rank >= 0 && o->rank < o->world_size);
  int nrows = dataset_num_samples(ds, split);
  int B = o->batch_size, N = o->world_size;
  int nmicro = o->drop_last ? nrows / B : (nrows + B - 1) / B;
  int nb = o->drop_last ? nmicro / N : (nmicro > o->rank ? (nmicro - o->rank + N - 1) / N : 0);
  if (o->drop_last && nb == 0) {
    error("dataset: %d %s in the %s split, fewer than batch_size %d x %d rank%s", nrows,
          ds->packed ? "packs" : "samples", split == SPLIT_HELDOUT ? "held-out" : "training", B, N,
          N == 1 ? "" : "s");
    return NULL;
  }
  DataLoader *dl = calloc(1, sizeof(DataLoader));
  ASSERT(dl);
  dl->ds = ds;
  dl->split = split;
  dl->o = *o;
  dl->nrows = nrows;
  dl->nbatches = nb;
  dl->perm = malloc(sizeof(int) * (size_t)MAX(nrows, 1));
  dl->perm_epoch = -1;
  size_t cells = (size_t)B * (size_t)ds->max_seq_len;
  dl->tok = malloc(sizeof(int32_t) * cells * 4);
  dl->rows = malloc(sizeof(int) * (size_t)B);
  ASSERT(dl->perm && dl->tok && dl->rows);
  dl->tgt = dl->tok + cells;
  dl->pos = dl->tok + 2 * cells;
  dl->seg = dl->tok + 3 * cells;
  return dl;
}

void dataloader_free(DataLoader *dl) {
  if (!dl)
    return;
  free(dl->perm);
  free(dl->tok);
  free(dl->rows);
  free(dl);
}

/* The order of epoch e: Fisher-Yates driven by splitmix64 seeded from
 * mix(seed ^ mix(e + 1)), so it depends on nothing but (seed, e). */
static void make_perm(DataLoader *dl, int epoch) {
  for (int i = 0; i < dl->nrows; i++)
    dl->perm[i] = i;
  if (dl->o.shuffle) {
    uint64_t st = mix64(dl->o.seed ^ mix64((uint64_t)epoch + 1));
    for (int i = dl->nrows - 1; i > 0; i--) {
      int j = (int)rand_below(&st, (uint64_t)i + 1);
      int t = dl->perm[i];
      dl->perm[i] = dl->perm[j];
      dl->perm[j] = t;
    }
  }
  dl->perm_epoch = epoch;
}

int dataloader_next(DataLoader *dl, L4Batch *out) {
  if (dl->batch >= dl->nbatches) {
    dl->epoch++;
    dl->batch = 0;
    return 0;
  }
  if (dl->perm_epoch != dl->epoch)
    make_perm(dl, dl->epoch);
  int B = dl->o.batch_size, L = dl->ds->max_seq_len;
  int64_t k = (int64_t)dl->batch * dl->o.world_size + dl->o.rank;
  int lo = (int)(k * B), hi = (int)MIN(k * B + B, (int64_t)dl->nrows);
  ASSERT(lo < hi);
  int nb = hi - lo, T = 0;
  for (int i = 0; i < nb; i++) {
    dl->rows[i] = dl->perm[lo + i];
    T = MAX(T, dataset_row(dl->ds, dl->split, dl->rows[i]).len);
  }
  if (dl->ds->packed)
    T = L;
  for (int i = 0; i < nb; i++) {
    DataRow r = dataset_row(dl->ds, dl->split, dl->rows[i]);
    size_t o = (size_t)i * T;
    memcpy(dl->tok + o, r.tokens, sizeof(int32_t) * (size_t)r.len);
    memcpy(dl->tgt + o, r.targets, sizeof(int32_t) * (size_t)r.len);
    if (r.positions) {
      memcpy(dl->pos + o, r.positions, sizeof(int32_t) * (size_t)r.len);
      memcpy(dl->seg + o, r.segments, sizeof(int32_t) * (size_t)r.len);
    }
    for (int t = r.len; t < T; t++) {
      dl->tok[o + t] = dl->ds->pad_id;
      dl->tgt[o + t] = -100;
    }
  }
  dl->nlast = nb;
  *out = (L4Batch){dl->tok, dl->tgt, dl->ds->packed ? dl->pos : NULL, dl->ds->packed ? dl->seg : NULL, nb, T};
  dl->batch++;
  return 1;
}

int dataloader_num_batches(const DataLoader *dl) { return dl->nbatches; }
int dataloader_epoch(const DataLoader *dl) { return dl->epoch; }
int dataloader_batch_index(const DataLoader *dl) { return dl->batch; }

void dataloader_seek(DataLoader *dl, int epoch, int batch) {
  ASSERT(epoch >= 0 && batch >= 0 && batch <= dl->nbatches);
  dl->epoch = epoch;
  dl->batch = batch;
}

const int *dataloader_last_rows(const DataLoader *dl, int *n) {
  *n = dl->nlast;
  return dl->rows;
}
