/* data.c: the byte tokenizer, datasets (alpaca JSONL, text files, the
 * synthetic instruction set), packing, and the sharded, seeded loader. */
#include "data.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
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

/* ---- the tokenizer ------------------------------------------------------------ */

Tokenizer tokenizer_byte(void) { return (Tokenizer){BYTE_VOCAB, BYTE_BOS, BYTE_EOS, BYTE_PAD, 0}; }

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

bool tokenizer_from_config(const YamlNode *node, Tokenizer *out) {
  static const char *const keys[] = {"_component_", "max_seq_len"};
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
  if (strcmp(comp, "optc.tokenizers.byte_tokenizer") != 0) {
    error_at(c->pos, "tokenizer._component_: unknown tokenizer '%s'; expected optc.tokenizers.byte_tokenizer",
             comp);
    return false;
  }
  if (!check_keys(node, "tokenizer", comp, keys, (int)ARRAY_LEN(keys)))
    return false;
  *out = tokenizer_byte();
  const YamlNode *m = yaml_get(node, "max_seq_len");
  if (m && !yaml_is_null(m)) {
    long v;
    if (!yaml_int(m, "tokenizer.max_seq_len", &v))
      return false;
    if (v < 2 || v > (1 << 20)) {
      error_at(m->pos, "tokenizer.max_seq_len: %ld is out of range [2, %d]", v, 1 << 20);
      return false;
    }
    out->max_seq_len = (int)v;
  }
  return true;
}

int tokenizer_encode(const Tokenizer *t, const char *s, int n, int32_t *out) {
  (void)t;
  for (int i = 0; i < n; i++)
    out[i] = (unsigned char)s[i];
  return n;
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, bool skip_special, Buf *out) {
  for (int i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      buf_putc(out, (char)id);
    } else if (id == t->bos_id || id == t->eos_id || id == t->pad_id) {
      if (!skip_special)
        buf_puts(out, id == t->bos_id ? "<bos>" : id == t->eos_id ? "<eos>" : "<pad>");
    } else {
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

/* Appends rows [lo, hi) of src to dst (both unpacked). */
static void rows_append(Rows *dst, const Rows *src, int lo, int hi) {
  for (int i = lo; i < hi; i++)
    rows_add(dst, src->tok + src->off[i], src->tgt + src->off[i], NULL, NULL, rows_len(src, i));
}

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
  int64_t ntok = 0, counted = 0;
  for (int s = 0; s < 2; s++) {
    const Rows *r = &ds->split[s];
    for (int64_t t = 0; t < r->ntok; t++) {
      ntok += r->tok[t] != ds->pad_id || r->tgt[t] != -100;
      counted += r->tgt[t] != -100;
    }
  }
  buf_printf(out, "%s: %d train + %d held-out %s, %lld tokens, %lld counted, packed: %s", ds->name,
             ds->split[0].n, ds->split[1].n, ds->packed ? "packs" : "samples", (long long)ntok,
             (long long)counted, ds->packed ? "yes" : "no");
  if (ds->truncated)
    buf_printf(out, ", %d truncated", ds->truncated);
  if (ds->bad_lines)
    buf_printf(out, ", %d malformed lines skipped", ds->bad_lines);
}

/* What one dataset block asks for, read from its keys. */
typedef struct {
  const Tokenizer *tok;
  int L;
  PromptTemplate tpl;
  bool train_on_input, skip_bad;
  const char *col_instruction, *col_input, *col_output;
  Rows *out;      /* unpacked samples, in order */
  int *truncated; /* counts samples cut at L */
} SampleSink;

/* One alpaca sample: bos, prompt, response, eos, shifted targets. */
static void add_alpaca_sample(SampleSink *sk, const char *instruction, const char *input, const char *output,
                              size_t output_len) {
  Buf p = {0};
  prompt_format(sk->tpl, instruction, input, &p);
  int64_t n64 = 1 + (int64_t)p.len + (int64_t)output_len + 1;
  int n = (int)MIN(n64, (int64_t)sk->L);
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n * 2);
  ASSERT(tok);
  int32_t *tgt = tok + n;
  /* masked[t]: token t is no one's target. The prompt (and bos) unless
   * train_on_input; a truncating eos always. */
  int P = 1 + (int)MIN((int64_t)p.len, (int64_t)n - 1);
  tok[0] = sk->tok->bos_id;
  tokenizer_encode(sk->tok, p.data, P - 1, tok + 1);
  int R = (int)MIN((int64_t)output_len, (int64_t)(n - P));
  tokenizer_encode(sk->tok, output, R, tok + P);
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
}

/* A malformed line: an error, or (skip) a warning for the first few. */
static void bad_line(SrcPos pos, bool skip, int nbad, const char *fmt, ...) PRINTF(4, 5);
static void bad_line(SrcPos pos, bool skip, int nbad, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!skip) {
    verror_at(pos, fmt, ap);
  } else if (nbad <= 10) {
    fprintf(stderr, "%s:%d:%d: warning: ", pos.file->name, pos.line, pos.col);
    vfprintf(stderr, fmt, ap);
    fputs(" (line skipped)\n", stderr);
  }
  va_end(ap);
}

/* Opens path for a dataset, reporting failure at the YAML key that named it. */
static char *read_data_file(const char *path, SrcPos at, const char *what, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    error_at(at, "%s: cannot open '%s': %s", what, path, strerror(errno));
    return NULL;
  }
  fclose(f);
  return file_read(path, len);
}

/* Reads one field of a JSONL object: a string, or (optional) absent/null. */
static bool json_field(json_t *obj, const char *key, bool optional, const char **out, size_t *len,
                       const char **why) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) {
    *out = NULL, *len = 0;
    if (!optional)
      *why = v ? "is null" : "is missing";
    return optional;
  }
  if (!json_is_string(v)) {
    *why = "is not a string";
    return false;
  }
  *out = json_string_value(v);
  *len = json_string_length(v);
  return true;
}

/* Grammar: one JSON object per line; blank lines are ignored. */
static bool load_alpaca_jsonl(SampleSink *sk, const char *path, SrcPos at, const char *what, int *nbad) {
  size_t len;
  char *text = read_data_file(path, at, what, &len);
  if (!text)
    return false;
  SrcFile src = {path, text, len};
  bool ok = true;
  int bad_here = 0;
  size_t i = 0;
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
    i = 3;
  for (int line = 1; i < len && ok; line++) {
    size_t s = i;
    while (i < len && text[i] != '\n')
      i++;
    size_t e = i++;
    if (e > s && text[e - 1] == '\r')
      e--;
    size_t k = s;
    while (k < e && (text[k] == ' ' || text[k] == '\t'))
      k++;
    if (k == e)
      continue;
    SrcPos pos = {&src, line, (int)(k - s) + 1};
    json_error_t err;
    json_t *obj = json_loadb(text + s, e - s, 0, &err);
    const char *why = NULL, *field = NULL, *ins, *inp, *out;
    size_t ilen, nlen, olen;
    if (!obj) {
      pos.col = MAX(err.position, 1);
      bad_here++;
      bad_line(pos, sk->skip_bad, *nbad + bad_here, "malformed JSON: %s", err.text);
      ok = sk->skip_bad;
      continue;
    }
    /* jansson rejects \u0000 unless asked, so the strings hold no NUL. */
    if (!json_is_object(obj))
      why = "a line must be a JSON object";
    else if (json_field(obj, field = sk->col_instruction, false, &ins, &ilen, &why) &&
             json_field(obj, field = sk->col_input, true, &inp, &nlen, &why) &&
             json_field(obj, field = sk->col_output, false, &out, &olen, &why))
      field = NULL;
    if (why) {
      bad_here++;
      if (field)
        bad_line(pos, sk->skip_bad, *nbad + bad_here, "\"%s\" %s", field, why);
      else
        bad_line(pos, sk->skip_bad, *nbad + bad_here, "%s", why);
      ok = sk->skip_bad;
    } else {
      add_alpaca_sample(sk, ins, inp, out, olen);
    }
    json_decref(obj);
  }
  if (ok && bad_here)
    fprintf(stderr, "%s: warning: skipped %d malformed line%s\n", path, bad_here, bad_here == 1 ? "" : "s");
  *nbad += bad_here;
  free(text);
  return ok;
}

/* bos, the file's bytes, eos, in windows of L tokens with their next tokens. */
static bool load_text_file(SampleSink *sk, const char *path, SrcPos at, const char *what) {
  size_t len;
  char *text = read_data_file(path, at, what, &len);
  if (!text)
    return false;
  if (len > (size_t)INT32_MAX - 2) {
    error_at(at, "%s: '%s' is larger than 2 GiB", what, path);
    free(text);
    return false;
  }
  int64_t n = (int64_t)len + 2;
  int32_t *stream = malloc(sizeof(int32_t) * (size_t)n);
  ASSERT(stream);
  stream[0] = sk->tok->bos_id;
  tokenizer_encode(sk->tok, text, (int)len, stream + 1);
  stream[n - 1] = sk->tok->eos_id;
  for (int64_t s = 0; s + 1 < n; s += sk->L) {
    int m = (int)MIN((int64_t)sk->L, n - 1 - s);
    rows_add(sk->out, stream + s, stream + s + 1, NULL, NULL, m);
  }
  free(stream);
  free(text);
  return true;
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

static uint64_t fnv1a(const char *a, const char *b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *s = a; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  h = (h ^ 0x1f) * 0x100000001b3ull;
  for (const char *s = b; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static char *xstrdup(const char *s) {
  char *p = strdup(s ? s : "");
  ASSERT(p);
  return p;
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
    uint64_t h = fnv1a(ins.data, in.data);
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

enum { DS_ALPACA, DS_TEXT, DS_SYNTHETIC };

static const struct {
  const char *component, *name;
  const char *keys[12];
} ds_components[] = {
    [DS_ALPACA] = {"torchtune.datasets.alpaca_dataset", "alpaca_dataset",
                   {"_component_", "source", "data_files", "column_map", "train_on_input", "packed", "split",
                    "template", "on_bad_line", "holdout_fraction"}},
    [DS_TEXT] = {"optc.datasets.text_file", "text_file", {"_component_", "path", "packed", "holdout_fraction"}},
    [DS_SYNTHETIC] = {"optc.datasets.synthetic_alpaca", "synthetic_alpaca",
                      {"_component_", "num_samples", "seed", "holdout_fraction", "packed", "template",
                       "train_on_input"}},
};

static int nkeys(const char *const *keys) {
  int n = 0;
  while (n < 12 && keys[n])
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

static bool opt_long(const YamlNode *node, const char *where, const char *key, long *out) {
  const YamlNode *n = yaml_get(node, key);
  char path[256];
  return yaml_is_null(n) || yaml_int(n, key_path(where, key, path, sizeof path), out);
}

static bool opt_double(const YamlNode *node, const char *where, const char *key, double *out) {
  const YamlNode *n = yaml_get(node, key);
  char path[256];
  return yaml_is_null(n) || yaml_double(n, key_path(where, key, path, sizeof path), out);
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

/* One block's samples, unpacked, split into train and held-out. */
typedef struct {
  Rows train, held;
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
    error_at(c->pos, "%s: unknown dataset '%s'; expected %s, %s or %s", path, comp,
             ds_components[DS_SYNTHETIC].component, ds_components[DS_ALPACA].component,
             ds_components[DS_TEXT].component);
    return false;
  }
  if (!check_keys(node, where, comp, ds_components[kind].keys, nkeys(ds_components[kind].keys)))
    return false;
  part->name = ds_components[kind].name;

  bool packed = false, train_on_input = false;
  double frac = kind == DS_SYNTHETIC ? 0.1 : 0.0;
  if (!opt_bool(node, where, "packed", &packed) || !opt_bool(node, where, "train_on_input", &train_on_input) ||
      !opt_double(node, where, "holdout_fraction", &frac))
    return false;
  if (!(frac >= 0 && frac < 1)) {
    error_at(yaml_get(node, "holdout_fraction")->pos, "%s.holdout_fraction: %g is not in [0, 1)", where, frac);
    return false;
  }
  part->packed = packed;

  Rows all;
  rows_init(&all, false);
  SampleSink sk = {tok, L, kind == DS_SYNTHETIC ? TEMPLATE_COMPACT : TEMPLATE_ALPACA, train_on_input, false,
                   "instruction", "input", "output", &all, &part->truncated};
  if (!read_template(node, where, &sk.tpl))
    goto fail;

  if (kind == DS_SYNTHETIC) {
    long n = 4000, seed = 0;
    if (!opt_long(node, where, "num_samples", &n) || !opt_long(node, where, "seed", &seed))
      goto fail;
    if (n < 1 || n > 1000000) {
      error_at(yaml_get(node, "num_samples")->pos, "%s.num_samples: %ld is out of range [1, 1000000]", where, n);
      goto fail;
    }
    SynSample *s = syn_generate((int)n, (uint64_t)seed);
    if (!s)
      goto fail;
    for (int i = 0; i < n; i++)
      add_alpaca_sample(&sk, s[i].instruction, s[i].input, s[i].output, strlen(s[i].output));
    syn_free(s, (int)n);
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
    /* on_bad_line, split, column_map */
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
    const YamlNode *sp = yaml_get(node, "split");
    if (sp && !yaml_is_null(sp)) {
      if (!yaml_string(sp, key_path(where, "split", path, sizeof path), &s))
        goto fail;
      if (strcmp(s, "train") != 0) {
        error_at(sp->pos, "%s: only 'train' is supported; hold samples out with holdout_fraction", path);
        goto fail;
      }
    }
    const YamlNode *cm = yaml_get(node, "column_map");
    if (cm && !yaml_is_null(cm)) {
      static const char *const cols[] = {"instruction", "input", "output"};
      const char **dst[] = {&sk.col_instruction, &sk.col_input, &sk.col_output};
      snprintf(path, sizeof path, "%s.column_map", where);
      if (cm->kind != YAML_MAP) {
        error_at(cm->pos, "%s: expected a mapping", path);
        goto fail;
      }
      if (!check_keys(cm, path, comp, cols, 3))
        goto fail;
      for (int i = 0; i < 3; i++) {
        const YamlNode *v = yaml_get(cm, cols[i]);
        char p2[300];
        snprintf(p2, sizeof p2, "%s.%s", path, cols[i]);
        if (v && !yaml_string(v, p2, dst[i]))
          goto fail;
      }
    }
    /* The files: source: PATH, or source: json with data_files: PATH | [PATH, ...]. */
    const YamlNode *src = yaml_get(node, "source"), *df = yaml_get(node, "data_files");
    const char *source = NULL;
    if (src && !yaml_string(src, key_path(where, "source", path, sizeof path), &source))
      goto fail;
    if (df) {
      if (source && strcmp(source, "json") != 0) {
        error_at(src->pos, "%s.source: with data_files, source must be json, not '%s'", where, source);
        goto fail;
      }
      int nf = df->kind == YAML_SEQ ? df->n : 1;
      if (nf == 0) {
        error_at(df->pos, "%s.data_files: the list is empty", where);
        goto fail;
      }
      for (int i = 0; i < nf; i++) {
        const YamlNode *f = df->kind == YAML_SEQ ? df->items[i] : df;
        const char *file;
        if (df->kind == YAML_SEQ)
          snprintf(path, sizeof path, "%s.data_files[%d]", where, i);
        else
          snprintf(path, sizeof path, "%s.data_files", where);
        if (!yaml_string(f, path, &file) || !load_alpaca_jsonl(&sk, file, f->pos, path, &part->bad_lines))
          goto fail;
      }
    } else if (source) {
      if (strcmp(source, "json") == 0) {
        error_at(src->pos, "%s.source: json needs data_files: PATH", where);
        goto fail;
      }
      FILE *f = fopen(source, "rb");
      if (!f && strchr(source, '/') && !strchr(source, '.') && errno == ENOENT) {
        error_at(src->pos,
                 "%s.source: '%s' looks like a Hugging Face dataset, and optc reads local files only; "
                 "give source: PATH.jsonl (or use optc.datasets.synthetic_alpaca)",
                 where, source);
        goto fail;
      }
      if (f)
        fclose(f);
      key_path(where, "source", path, sizeof path);
      if (!load_alpaca_jsonl(&sk, source, src->pos, path, &part->bad_lines))
        goto fail;
    } else {
      error_at(node->pos,
               "%s: alpaca_dataset needs source: PATH.jsonl or data_files: PATH (optc reads local files "
               "only; optc.datasets.synthetic_alpaca is built in)",
               where);
      goto fail;
    }
  }

  int nheld = (int)floor(frac * all.n + 0.5), ntrain = all.n - nheld;
  rows_init(&part->train, false);
  rows_init(&part->held, false);
  rows_append(&part->train, &all, 0, ntrain);
  rows_append(&part->held, &all, ntrain, all.n);
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
  Rows train, held;
  rows_init(&train, false);
  rows_init(&held, false);
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
    if (i > 0 && p.packed != ds->packed) {
      error_at(n->pos, "%s: packed is %s here but %s in dataset[0]; the datasets of a list are packed together",
               where, p.packed ? "true" : "false", ds->packed ? "true" : "false");
      ok = false;
    }
    ds->packed = p.packed;
    ds->name = nparts > 1 ? "concat_dataset" : p.name;
    ds->bad_lines += p.bad_lines;
    ds->truncated += p.truncated;
    rows_append(&train, &p.train, 0, p.train.n);
    rows_append(&held, &p.held, 0, p.held.n);
    rows_free(&p.train);
    rows_free(&p.held);
  }
  if (ok && train.n == 0) {
    error_at(node->pos, "dataset: no training samples");
    ok = false;
  }
  if (!ok) {
    rows_free(&train);
    rows_free(&held);
    free(ds);
    return NULL;
  }
  if (ds->packed) {
    rows_init(&ds->split[0], true);
    rows_init(&ds->split[1], true);
    rows_pack(&ds->split[0], &train, 0, train.n, max_seq_len, tok->pad_id);
    rows_pack(&ds->split[1], &held, 0, held.n, max_seq_len, tok->pad_id);
    rows_free(&train);
    rows_free(&held);
  } else {
    ds->split[0] = train;
    ds->split[1] = held;
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
