/* test_data.c: the data layer. The byte tokenizer, torchtune's alpaca prompt
 * text and loss mask, packing (positions and segments), the seeded shuffle,
 * sharding across ranks (1 rank and 2 ranks see the same global batches),
 * malformed JSONL lines reported by line, missing files, unknown keys, text
 * files, and the synthetic dataset (deterministic, held-out split disjoint).
 * Exits 0 when every check passes; run it under ASan+UBSan too. */
#include "../runtime/data.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static int nchecks, nfailed;

/* Failures go to stdout, since stderr is redirected while a message is
 * being captured. */
#define CHECK(c) check((c), __LINE__, #c)
static bool check(bool ok, int line, const char *what) {
  nchecks++;
  if (!ok) {
    printf("test_data.c:%d: FAILED: %s\n", line, what);
    fflush(stdout);
    nfailed++;
  }
  return ok;
}

static void die(const char *what) {
  printf("test_data: %s: %s\n", what, strerror(errno));
  exit(2);
}

static char dir[64];
static Arena *arena;

typedef struct {
  char s[256];
} Path;

static Path in_dir(const char *name) {
  Path p;
  snprintf(p.s, sizeof p.s, "%s/%s", dir, name);
  return p;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0)
    die(path);
}

/* ---- capturing stderr ------------------------------------------------------- */

static int saved_stderr = -1;
static char captured[16384];

static void capture_begin(void) {
  fflush(stderr);
  int fd = open(in_dir("stderr.txt").s, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || (saved_stderr = dup(2)) < 0 || dup2(fd, 2) < 0)
    die("redirecting stderr");
  close(fd);
}

static const char *capture_end(void) {
  fflush(stderr);
  if (dup2(saved_stderr, 2) < 0)
    die("restoring stderr");
  close(saved_stderr);
  FILE *f = fopen(in_dir("stderr.txt").s, "rb");
  if (!f)
    die("reading the captured stderr");
  size_t n = fread(captured, 1, sizeof captured - 1, f);
  captured[n] = 0;
  fclose(f);
  return captured;
}

/* ---- YAML blocks --------------------------------------------------------------- */

/* The `dataset:` node of a recipe text; the text lives in the arena, since
 * errors point into it. */
static const YamlNode *block(const char *text, const char *key) {
  SrcFile *src = arena_alloc(arena, sizeof(SrcFile));
  src->name = "test.yaml";
  src->text = arena_strdup(arena, text);
  src->len = strlen(text);
  YamlNode *root = yaml_load(src, arena);
  if (!root || !yaml_get(root, key)) {
    printf("test_data: bad test YAML:\n%s\n", text);
    exit(2);
  }
  return yaml_get(root, key);
}

static Dataset *load(const char *text, int L) {
  Tokenizer tok = tokenizer_byte();
  return dataset_from_config(block(text, "dataset"), &tok, L);
}

/* A load that must fail; returns the captured messages. */
static const char *load_fails(const char *text, int L) {
  capture_begin();
  Dataset *ds = load(text, L);
  const char *msg = capture_end();
  CHECK(ds == NULL);
  dataset_free(ds);
  return msg;
}

static char *decode(const int32_t *ids, int n) {
  Tokenizer tok = tokenizer_byte();
  Buf b = {0};
  if (tokenizer_decode(&tok, ids, n, false, &b) < 0)
    buf_puts(&b, "<?>");
  buf_putc(&b, 0);
  char *s = arena_strdup(arena, b.data);
  buf_free(&b);
  return s;
}

static int counted(DataRow r) {
  int c = 0;
  for (int t = 0; t < r.len; t++)
    c += r.targets[t] != -100;
  return c;
}

static bool rows_equal(DataRow a, DataRow b) {
  return a.len == b.len && !memcmp(a.tokens, b.tokens, sizeof(int32_t) * (size_t)a.len) &&
         !memcmp(a.targets, b.targets, sizeof(int32_t) * (size_t)a.len);
}

/* ---- the tokenizer --------------------------------------------------------------- */

static void test_tokenizer(void) {
  Tokenizer tok = tokenizer_byte();
  CHECK(tok.vocab_size == 259 && tok.bos_id == 256 && tok.eos_id == 257 && tok.pad_id == 258);
  const char text[] = "h\xc3\xa9llo\n\x01\xff\x7f end";
  int n = (int)sizeof text - 1;
  int32_t ids[64];
  CHECK(tokenizer_encode(&tok, text, n, ids) == n);
  CHECK(ids[0] == 'h' && ids[1] == 0xc3 && ids[7] == 0x01 && ids[8] == 0xff);
  Buf b = {0};
  CHECK(tokenizer_decode(&tok, ids, n, false, &b) == 0);
  CHECK(b.len == (size_t)n && memcmp(b.data, text, (size_t)n) == 0);
  buf_free(&b);
  int32_t sp[] = {256, 'a', 257, 258};
  CHECK(tokenizer_decode(&tok, sp, 4, false, &b) == 0 && strcmp(b.data, "<bos>a<eos><pad>") == 0);
  buf_free(&b);
  CHECK(tokenizer_decode(&tok, sp, 4, true, &b) == 0 && strcmp(b.data, "a") == 0);
  buf_free(&b);
  int32_t bad[] = {'a', 259};
  CHECK(tokenizer_decode(&tok, bad, 2, false, &b) == -1);
  buf_free(&b);

  Tokenizer t2;
  CHECK(tokenizer_from_config(block("tokenizer:\n  _component_: optc.tokenizers.byte_tokenizer\n"
                                    "  max_seq_len: 128\n", "tokenizer"), &t2));
  CHECK(t2.max_seq_len == 128 && t2.vocab_size == 259);
  capture_begin();
  CHECK(!tokenizer_from_config(block("tokenizer:\n  _component_: optc.tokenizers.byte_tokenizer\n"
                                     "  path: /x\n", "tokenizer"), &t2));
  CHECK(strstr(capture_end(), "test.yaml:3:3: error: unknown key 'tokenizer.path'") != NULL);
  capture_begin();
  CHECK(!tokenizer_from_config(block("tokenizer:\n  _component_: torchtune.models.llama3.llama3_tokenizer\n",
                                     "tokenizer"), &t2));
  CHECK(strstr(capture_end(), "unknown tokenizer") != NULL);
}

/* ---- alpaca ------------------------------------------------------------------------ */

static const char *const prompt_with_input =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nTranslate.\n\n### Input:\nbonjour\n\n### Response:\n";
static const char *const prompt_no_input =
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nName a color.\n\n### Response:\n";

static void test_prompt_text(void) {
  Buf b = {0};
  prompt_format(TEMPLATE_ALPACA, "Translate.", "bonjour", &b);
  CHECK(strcmp(b.data, prompt_with_input) == 0);
  buf_free(&b);
  prompt_format(TEMPLATE_ALPACA, "Name a color.", "", &b);
  CHECK(strcmp(b.data, prompt_no_input) == 0);
  buf_free(&b);
  prompt_format(TEMPLATE_ALPACA, "Name a color.", NULL, &b);
  CHECK(strcmp(b.data, prompt_no_input) == 0);
  buf_free(&b);
  prompt_format(TEMPLATE_COMPACT, "Translate.", "bonjour", &b);
  CHECK(strcmp(b.data, "### Instruction:\nTranslate.\n\n### Input:\nbonjour\n\n### Response:\n") == 0);
  buf_free(&b);
}

/* Checks one alpaca row against its prompt and response: the layout and
 * exactly which targets count. */
static void check_alpaca_row(DataRow r, const char *prompt, const char *response, bool train_on_input) {
  int P = 1 + (int)strlen(prompt), R = (int)strlen(response), n = P + R + 1;
  if (!CHECK(r.len == n))
    return;
  CHECK(r.tokens[0] == 256 && r.tokens[n - 1] == 257);
  CHECK(strncmp(decode(r.tokens + 1, P - 1), prompt, (size_t)(P - 1)) == 0);
  CHECK(strcmp(decode(r.tokens + P, R), response) == 0);
  CHECK(r.positions == NULL && r.segments == NULL);
  bool ok = true;
  int first = train_on_input ? 0 : P - 1;
  for (int t = 0; t < n; t++) {
    int want = t >= first && t <= n - 2 ? r.tokens[t + 1] : -100;
    ok &= r.targets[t] == want;
  }
  CHECK(ok);
  CHECK(counted(r) == (train_on_input ? n - 1 : R + 1)); /* the response and the eos */
  CHECK(r.targets[n - 2] == 257);
}

static void test_alpaca(void) {
  Path p = in_dir("alpaca.jsonl"), q = in_dir("mapped.jsonl");
  write_file(p.s, "{\"instruction\": \"Translate.\", \"input\": \"bonjour\", \"output\": \"hello\"}\n"
                  "{\"instruction\": \"Name a color.\", \"input\": \"\", \"output\": \"Blue.\"}\n"
                  "\n"
                  "{\"instruction\": \"Name a color.\", \"output\": \"Red \\u00e9\"}\r\n"
                  "{\"instruction\": \"Name a color.\", \"input\": null, \"output\": \"x\"}");
  char y[1024];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n", p.s);
  Dataset *ds = load(y, 512);
  if (!CHECK(ds != NULL))
    return;
  CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 4 && dataset_num_samples(ds, SPLIT_HELDOUT) == 0);
  CHECK(!dataset_packed(ds) && dataset_bad_lines(ds) == 0 && dataset_truncated(ds) == 0);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 0), prompt_with_input, "hello", false);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 1), prompt_no_input, "Blue.", false);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 2), prompt_no_input, "Red \xc3\xa9", false);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 3), prompt_no_input, "x", false);
  dataset_free(ds);

  /* source: json + data_files (a list), train_on_input, column_map, holdout */
  write_file(q.s, "{\"q\": \"Name a color.\", \"a\": \"Blue.\"}\n{\"q\": \"Translate.\", \"ctx\": \"bonjour\", "
                  "\"a\": \"hello\"}\n");
  snprintf(y, sizeof y,
           "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: json\n"
           "  data_files: [%s, %s]\n  train_on_input: true\n  split: train\n"
           "  column_map: {instruction: q, input: ctx, output: a}\n  holdout_fraction: 0.5\n",
           q.s, q.s);
  ds = load(y, 512);
  if (CHECK(ds != NULL)) {
    CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 2 && dataset_num_samples(ds, SPLIT_HELDOUT) == 2);
    CHECK(dataset_num_samples(ds, SPLIT_ALL) == 4);
    check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 0), prompt_no_input, "Blue.", true);
    check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 1), prompt_with_input, "hello", true);
    check_alpaca_row(dataset_row(ds, SPLIT_HELDOUT, 0), prompt_no_input, "Blue.", true);
    CHECK(rows_equal(dataset_row(ds, SPLIT_ALL, 3), dataset_row(ds, SPLIT_HELDOUT, 1)));
    dataset_free(ds);
  }

  /* Truncation: cut at L, the last token becomes eos, which does not count. */
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                        "  template: compact\n", p.s);
  int L = 60; /* the first sample's compact prompt is 63 bytes; the second's 46 */
  ds = load(y, L);
  if (CHECK(ds != NULL)) {
    DataRow r = dataset_row(ds, SPLIT_TRAIN, 0);
    CHECK(r.len == L && r.tokens[L - 1] == 257 && counted(r) == 0);
    r = dataset_row(ds, SPLIT_TRAIN, 1); /* bos + 46: "Blue." fits, its eos too */
    CHECK(r.len == 1 + 46 + 5 + 1 && counted(r) == 6);
    CHECK(dataset_truncated(ds) == 1);
    dataset_free(ds);
  }
  ds = load(y, 52); /* second sample: bos + 46 + "Blue", then eos in place of '.' */
  if (CHECK(ds != NULL)) {
    DataRow r = dataset_row(ds, SPLIT_TRAIN, 1);
    CHECK(r.len == 52 && r.tokens[51] == 257 && r.tokens[50] == 'e');
    CHECK(counted(r) == 4 && r.targets[46] == 'B' && r.targets[49] == 'e' && r.targets[50] == -100);
    dataset_free(ds);
  }
}

/* ---- malformed lines, missing files, bad keys ------------------------------------------ */

static void test_bad_lines(void) {
  Path p = in_dir("bad.jsonl");
  write_file(p.s, "{\"instruction\": \"a\", \"output\": \"b\"}\n"
                  "{\"instruction\": \"a\", \"output\": }\n"
                  "\n"
                  "[1, 2]\n"
                  "{\"instruction\": 5, \"output\": \"b\"}\n"
                  "{\"instruction\": \"c\", \"output\": \"d\"}\n"
                  "{\"instruction\": \"c\"}\n");
  char y[512], want[300];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                        "  on_bad_line: skip\n", p.s);
  capture_begin();
  Dataset *ds = load(y, 256);
  const char *msg = capture_end();
  if (CHECK(ds != NULL)) {
    CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 2 && dataset_bad_lines(ds) == 4);
    dataset_free(ds);
  }
  snprintf(want, sizeof want, "%s:2:32: warning: malformed JSON", p.s);
  CHECK(strstr(msg, want) != NULL);
  snprintf(want, sizeof want, "%s:4:1: warning: a line must be a JSON object", p.s);
  CHECK(strstr(msg, want) != NULL);
  snprintf(want, sizeof want, "%s:5:1: warning: \"instruction\" is not a string", p.s);
  CHECK(strstr(msg, want) != NULL);
  snprintf(want, sizeof want, "%s:7:1: warning: \"output\" is missing", p.s);
  CHECK(strstr(msg, want) != NULL);
  snprintf(want, sizeof want, "%s: warning: skipped 4 malformed lines", p.s);
  CHECK(strstr(msg, want) != NULL);

  /* error mode (the default): the first bad line stops the load */
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n", p.s);
  msg = load_fails(y, 256);
  snprintf(want, sizeof want, "%s:2:32: error: malformed JSON:", p.s);
  CHECK(strstr(msg, want) != NULL);
  CHECK(strstr(msg, ":4:") == NULL);
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                        "  on_bad_line: error\n", p.s);
  CHECK(strstr(load_fails(y, 256), want) != NULL);
}

static void test_config_errors(void) {
  const char *msg = load_fails("dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n"
                               "  source: /nonexistent/optc/alpaca.jsonl\n", 128);
  CHECK(strstr(msg, "test.yaml:3:11: error: dataset.source: cannot open '/nonexistent/optc/alpaca.jsonl': "
                    "No such file or directory") != NULL);
  msg = load_fails("dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: json\n"
                   "  data_files: /nonexistent/a.jsonl\n", 128);
  CHECK(strstr(msg, "test.yaml:4:15: error: dataset.data_files: cannot open") != NULL);
  msg = load_fails("dataset:\n  _component_: optc.datasets.text_file\n  path: /nonexistent/t.txt\n", 128);
  CHECK(strstr(msg, "error: dataset.path: cannot open '/nonexistent/t.txt'") != NULL);
  msg = load_fails("dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  packed: False\n", 128);
  CHECK(strstr(msg, "needs source") != NULL);
  msg = load_fails("dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: tatsu-lab/alpaca\n",
                   128);
  CHECK(strstr(msg, "Hugging Face") != NULL);
  msg = load_fails("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_sample: 10\n", 128);
  CHECK(strstr(msg, "test.yaml:3:3: error: unknown key 'dataset.num_sample' for optc.datasets.synthetic_alpaca")
        != NULL);
  msg = load_fails("dataset:\n  _component_: optc.datasets.nope\n", 128);
  CHECK(strstr(msg, "unknown dataset 'optc.datasets.nope'") != NULL);
  msg = load_fails("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  holdout_fraction: 1.5\n", 128);
  CHECK(strstr(msg, "holdout_fraction") != NULL);
  msg = load_fails("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  template: chatml\n", 128);
  CHECK(strstr(msg, "unknown template 'chatml'") != NULL);
  msg = load_fails("dataset:\n  - _component_: optc.datasets.synthetic_alpaca\n    num_samples: 20\n"
                   "  - _component_: optc.datasets.synthetic_alpaca\n    num_samples: 20\n    packed: true\n", 128);
  CHECK(strstr(msg, "dataset[1]: packed is true here") != NULL);
  msg = load_fails("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_samples: x\n", 128);
  CHECK(strstr(msg, "test.yaml:3:16: error: dataset.num_samples: expected an integer") != NULL);
}

/* ---- packing ------------------------------------------------------------------------------- */

static void test_packing(void) {
  const int L = 128;
  Dataset *flat = load("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_samples: 300\n"
                       "  holdout_fraction: 0.2\n", L);
  Dataset *packed = load("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_samples: 300\n"
                         "  holdout_fraction: 0.2\n  packed: True\n", L);
  if (!CHECK(flat && packed))
    return;
  CHECK(dataset_packed(packed) && !dataset_packed(flat));
  for (int s = 0; s < 2; s++) {
    DataSplit split = s ? SPLIT_HELDOUT : SPLIT_TRAIN;
    int next = 0; /* the next unpacked sample expected */
    bool ok = true, fits = true;
    int npacks = dataset_num_samples(packed, split);
    for (int i = 0; i < npacks; i++) {
      DataRow r = dataset_row(packed, split, i);
      ok &= r.len == L && r.positions && r.segments;
      if (!ok)
        break;
      int t = 0, seg = 0;
      /* each segment: one sample, positions 0.., the sample's own tokens and targets */
      while (t < L && r.tokens[t] != 258) {
        ok &= r.segments[t] == seg && next < dataset_num_samples(flat, split);
        if (!ok)
          break;
        DataRow u = dataset_row(flat, split, next++);
        for (int k = 0; k < u.len; k++)
          ok &= t + k < L && r.positions[t + k] == k && r.segments[t + k] == seg &&
                r.tokens[t + k] == u.tokens[k] && r.targets[t + k] == u.targets[k];
        t += u.len;
        seg++;
        /* greedy: the next sample did not fit in what is left */
        if (t < L && r.tokens[t] == 258 && next < dataset_num_samples(flat, split))
          fits &= dataset_row(flat, split, next).len > L - t;
      }
      /* the pad tail: its own segment, target -100, positions continuing (capped) */
      for (int k = t; k < L && ok; k++)
        ok &= r.tokens[k] == 258 && r.targets[k] == -100 && r.segments[k] == seg &&
              r.positions[k] == MIN(r.positions[t - 1] + (k - t) + 1, L - 1);
    }
    CHECK(ok);
    CHECK(fits);
    CHECK(next == dataset_num_samples(flat, split)); /* every sample packed once, in order */
  }
  CHECK(dataset_num_samples(packed, SPLIT_TRAIN) < dataset_num_samples(flat, SPLIT_TRAIN));

  /* The loader hands packed rows over whole, with positions and segments. */
  LoaderOptions o = {.batch_size = 3, .shuffle = true, .seed = 7, .world_size = 1, .drop_last = true};
  DataLoader *dl = dataloader_create(packed, SPLIT_TRAIN, &o);
  L4Batch b;
  if (CHECK(dl && dataloader_next(dl, &b) == 1)) {
    int n;
    const int *rows = dataloader_last_rows(dl, &n);
    CHECK(b.B == 3 && b.T == L && b.positions && b.segments && n == 3);
    DataRow r = dataset_row(packed, SPLIT_TRAIN, rows[1]);
    CHECK(!memcmp(b.positions + L, r.positions, sizeof(int32_t) * L) &&
          !memcmp(b.segments + L, r.segments, sizeof(int32_t) * L) &&
          !memcmp(b.targets + L, r.targets, sizeof(int32_t) * L));
  }
  dataloader_free(dl);

  /* A sample longer than max_seq_len is cut before packing. */
  Dataset *cut = load("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_samples: 50\n"
                      "  template: alpaca\n  packed: true\n", 100);
  if (CHECK(cut != NULL)) {
    CHECK(dataset_truncated(cut) == 50 && dataset_num_samples(cut, SPLIT_TRAIN) == 45);
    DataRow r = dataset_row(cut, SPLIT_TRAIN, 0);
    CHECK(r.len == 100 && r.segments[99] == 0 && r.positions[99] == 99 && r.tokens[99] == 257);
    dataset_free(cut);
  }
  dataset_free(flat);
  dataset_free(packed);
}

/* ---- the loader ------------------------------------------------------------------------------ */

/* The rows of every batch of one epoch, in order; returns the count. */
static int epoch_rows(DataLoader *dl, int *out, int *batches) {
  L4Batch b;
  int n = 0, nb = 0;
  while (dataloader_next(dl, &b)) {
    int k;
    const int *rows = dataloader_last_rows(dl, &k);
    memcpy(out + n, rows, sizeof(int) * (size_t)k);
    n += k;
    nb++;
  }
  if (batches)
    *batches = nb;
  return n;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void test_loader(void) {
  Dataset *ds = load("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_samples: 203\n"
                     "  seed: 3\n  holdout_fraction: 0.1\n", 128);
  if (!CHECK(ds != NULL))
    return;
  int n = dataset_num_samples(ds, SPLIT_TRAIN); /* 183 */
  CHECK(n == 183 && dataset_num_samples(ds, SPLIT_HELDOUT) == 20);
  static int a[1024], b[1024], c[1024];
  LoaderOptions o = {.batch_size = 4, .shuffle = true, .seed = 1234, .world_size = 1, .drop_last = true};

  /* Same seed, two loaders: the same order, epoch after epoch. */
  DataLoader *d1 = dataloader_create(ds, SPLIT_TRAIN, &o), *d2 = dataloader_create(ds, SPLIT_TRAIN, &o);
  int nb;
  CHECK(dataloader_num_batches(d1) == 45);
  CHECK(epoch_rows(d1, a, &nb) == 180 && nb == 45);
  CHECK(epoch_rows(d2, b, NULL) == 180 && !memcmp(a, b, sizeof(int) * 180));
  CHECK(dataloader_epoch(d1) == 1);
  CHECK(epoch_rows(d1, c, NULL) == 180 && memcmp(a, c, sizeof(int) * 180) != 0); /* a new order */
  CHECK(epoch_rows(d2, b, NULL) == 180 && !memcmp(b, c, sizeof(int) * 180));
  /* a permutation: distinct rows */
  memcpy(b, a, sizeof(int) * 180);
  qsort(b, 180, sizeof(int), cmp_int);
  bool distinct = true;
  for (int i = 1; i < 180; i++)
    distinct &= b[i] != b[i - 1] && b[i] >= 0 && b[i] < n;
  CHECK(distinct);
  /* seek: batch 3 of epoch 1 */
  dataloader_seek(d2, 1, 3);
  L4Batch bt;
  int k;
  CHECK(dataloader_next(d2, &bt) == 1 && !memcmp(dataloader_last_rows(d2, &k), c + 12, sizeof(int) * 4));
  dataloader_free(d1);
  dataloader_free(d2);
  /* another seed, another order; no shuffle, the file order */
  o.seed = 1235;
  d1 = dataloader_create(ds, SPLIT_TRAIN, &o);
  epoch_rows(d1, b, NULL);
  CHECK(memcmp(a, b, sizeof(int) * 180) != 0);
  dataloader_free(d1);
  o.shuffle = false;
  d1 = dataloader_create(ds, SPLIT_TRAIN, &o);
  epoch_rows(d1, b, NULL);
  bool identity = true;
  for (int i = 0; i < 180; i++)
    identity &= b[i] == i;
  CHECK(identity);
  dataloader_free(d1);

  /* Unpacked batches: T is the longest row; shorter rows are padded with
   * pad and target -100. */
  o.shuffle = true;
  o.seed = 1234;
  d1 = dataloader_create(ds, SPLIT_TRAIN, &o);
  CHECK(dataloader_next(d1, &bt) == 1 && bt.B == 4 && !bt.positions && !bt.segments);
  const int *rows = dataloader_last_rows(d1, &k);
  int T = 0;
  bool padded = true;
  for (int i = 0; i < 4; i++)
    T = MAX(T, dataset_row(ds, SPLIT_TRAIN, rows[i]).len);
  for (int i = 0; i < 4; i++) {
    DataRow r = dataset_row(ds, SPLIT_TRAIN, rows[i]);
    padded &= !memcmp(bt.tokens + i * T, r.tokens, sizeof(int32_t) * (size_t)r.len);
    padded &= !memcmp(bt.targets + i * T, r.targets, sizeof(int32_t) * (size_t)r.len);
    for (int t = r.len; t < T; t++)
      padded &= bt.tokens[i * T + t] == 258 && bt.targets[i * T + t] == -100;
  }
  CHECK(bt.T == T && padded);
  dataloader_free(d1);

  /* Sharding: global step s of a 2-rank run (1 micro-batch each) covers the
   * same rows as step s of a 1-rank run with 2 accumulation steps. */
  LoaderOptions o1 = {.batch_size = 4, .shuffle = true, .seed = 99, .rank = 0, .world_size = 1, .drop_last = true};
  LoaderOptions r0 = o1, r1 = o1;
  r0.world_size = r1.world_size = 2;
  r1.rank = 1;
  DataLoader *one = dataloader_create(ds, SPLIT_TRAIN, &o1);
  DataLoader *z0 = dataloader_create(ds, SPLIT_TRAIN, &r0), *z1 = dataloader_create(ds, SPLIT_TRAIN, &r1);
  CHECK(dataloader_num_batches(one) / 2 == dataloader_num_batches(z0));
  CHECK(dataloader_num_batches(z0) == dataloader_num_batches(z1) && dataloader_num_batches(z0) == 22);
  for (int epoch = 0; epoch < 2; epoch++) {
    bool same = true, disjoint = true;
    int steps = 0;
    for (int s = 0; s < dataloader_num_batches(z0); s++) {
      int g1[8], g2[8], m;
      L4Batch x;
      CHECK(dataloader_next(one, &x) == 1);
      memcpy(g1, dataloader_last_rows(one, &m), sizeof(int) * 4);
      CHECK(dataloader_next(one, &x) == 1);
      memcpy(g1 + 4, dataloader_last_rows(one, &m), sizeof(int) * 4);
      CHECK(dataloader_next(z0, &x) == 1);
      memcpy(g2, dataloader_last_rows(z0, &m), sizeof(int) * 4);
      CHECK(dataloader_next(z1, &x) == 1);
      memcpy(g2 + 4, dataloader_last_rows(z1, &m), sizeof(int) * 4);
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
          disjoint &= g2[i] != g2[4 + j];
      same &= !memcmp(g1, g2, sizeof g1); /* rank r holds micro-batch 2s + r */
      qsort(g1, 8, sizeof(int), cmp_int);
      qsort(g2, 8, sizeof(int), cmp_int);
      same &= !memcmp(g1, g2, sizeof g1);
      steps++;
    }
    CHECK(same && disjoint && steps == 22);
    L4Batch x;
    /* the 1-rank run has one odd micro-batch left; the 2-rank runs are done */
    CHECK(dataloader_next(one, &x) == 1 && dataloader_next(one, &x) == 0);
    CHECK(dataloader_next(z0, &x) == 0 && dataloader_next(z1, &x) == 0);
  }
  dataloader_free(one);
  dataloader_free(z0);
  dataloader_free(z1);

  /* Held-out loader, no drop_last, 3 ranks: every held-out row exactly once,
   * the last micro-batch short. */
  static int seen[64];
  memset(seen, 0, sizeof seen);
  int total = 0;
  for (int r = 0; r < 3; r++) {
    LoaderOptions e = {.batch_size = 3, .rank = r, .world_size = 3, .drop_last = false};
    DataLoader *ev = dataloader_create(ds, SPLIT_HELDOUT, &e);
    int got = epoch_rows(ev, a, &nb);
    CHECK(nb == (r == 0 ? 3 : 2)); /* 7 micro-batches: ranks get 3, 2, 2 */
    for (int i = 0; i < got; i++)
      seen[a[i]]++;
    total += got;
    dataloader_free(ev);
  }
  bool once = total == 20;
  for (int i = 0; i < 20; i++)
    once &= seen[i] == 1;
  CHECK(once);

  /* Too few rows for one batch on every rank. */
  LoaderOptions big = {.batch_size = 100, .world_size = 2, .drop_last = true};
  capture_begin();
  CHECK(dataloader_create(ds, SPLIT_TRAIN, &big) == NULL);
  CHECK(strstr(capture_end(), "fewer than batch_size 100 x 2 ranks") != NULL);
  dataset_free(ds);
}

/* ---- text files --------------------------------------------------------------------------------- */

static void test_text_file(void) {
  Path p = in_dir("text.txt");
  char text[301];
  for (int i = 0; i < 300; i++)
    text[i] = (char)('a' + i % 26);
  text[300] = 0;
  write_file(p.s, text);
  char y[512];
  snprintf(y, sizeof y, "dataset:\n  _component_: optc.datasets.text_file\n  path: %s\n", p.s);
  Dataset *ds = load(y, 64);
  if (!CHECK(ds != NULL))
    return;
  /* stream: bos + 300 bytes + eos = 302 tokens, 301 targets: 4 rows of 64 and one of 45 */
  CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 5);
  int32_t stream[302];
  int pos = 0, targets = 0;
  bool ok = true;
  for (int i = 0; i < 5; i++) {
    DataRow r = dataset_row(ds, SPLIT_TRAIN, i);
    ok &= r.len == (i < 4 ? 64 : 45);
    memcpy(stream + pos, r.tokens, sizeof(int32_t) * (size_t)r.len);
    for (int t = 0; t + 1 < r.len; t++)
      ok &= r.targets[t] == r.tokens[t + 1];
    targets += counted(r);
    pos += r.len;
    if (i > 0)
      ok &= dataset_row(ds, SPLIT_TRAIN, i - 1).targets[63] == r.tokens[0];
  }
  CHECK(ok && targets == 301 && pos == 301);
  CHECK(stream[0] == 256 && stream[1] == 'a' && stream[300] == text[299]);
  CHECK(dataset_row(ds, SPLIT_TRAIN, 4).targets[44] == 257);
  dataset_free(ds);
}

/* ---- the synthetic dataset ----------------------------------------------------------------------- */

/* The prompt part of an alpaca row: the tokens before the first counted
 * target's position + 1. */
static char *prompt_of(DataRow r) {
  int t = 0;
  while (t < r.len && r.targets[t] == -100)
    t++;
  return decode(r.tokens + 1, t); /* without the bos */
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_synthetic(void) {
  const char *y = "dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  num_samples: 4000\n  seed: 0\n";
  Dataset *a = load(y, 128), *b = load(y, 128);
  Dataset *c = load("dataset:\n  _component_: optc.datasets.synthetic_alpaca\n  seed: 1\n", 128);
  if (!CHECK(a && b && c))
    return;
  int ntr = dataset_num_samples(a, SPLIT_TRAIN), nho = dataset_num_samples(a, SPLIT_HELDOUT);
  CHECK(ntr == 3600 && nho == 400 && dataset_truncated(a) == 0);
  bool same = true, differs = false;
  int maxlen = 0, minlen = 1 << 30;
  for (int i = 0; i < ntr + nho; i++) {
    DataRow ra = dataset_row(a, SPLIT_ALL, i);
    same &= rows_equal(ra, dataset_row(b, SPLIT_ALL, i));
    differs |= !rows_equal(ra, dataset_row(c, SPLIT_ALL, i));
    maxlen = MAX(maxlen, ra.len);
    minlen = MIN(minlen, ra.len);
  }
  CHECK(same && differs);
  CHECK(maxlen < 128); /* fits the tiny config's max_seq_len, untruncated */
  printf("synthetic_alpaca: rows of %d..%d tokens\n", minlen, maxlen);

  /* held-out prompts never occur in training */
  char **train = malloc(sizeof(char *) * (size_t)ntr);
  for (int i = 0; i < ntr; i++)
    train[i] = prompt_of(dataset_row(a, SPLIT_TRAIN, i));
  qsort(train, (size_t)ntr, sizeof(char *), cmp_str);
  bool distinct = true, disjoint = true;
  for (int i = 1; i < ntr; i++)
    distinct &= strcmp(train[i - 1], train[i]) != 0;
  for (int i = 0; i < nho; i++) {
    char *h = prompt_of(dataset_row(a, SPLIT_HELDOUT, i));
    disjoint &= bsearch(&h, train, (size_t)ntr, sizeof(char *), cmp_str) == NULL;
  }
  CHECK(distinct && disjoint);
  free(train);

  /* The answers are right: check every addition and upper-casing. */
  int nadd = 0, nupper = 0;
  bool right = true;
  for (int i = 0; i < ntr; i++) {
    DataRow r = dataset_row(a, SPLIT_TRAIN, i);
    const char *s = decode(r.tokens, r.len);
    int x, y2, z;
    char word[64];
    if (sscanf(s, "<bos>### Instruction:\nAdd the two numbers.\n\n### Input:\n%d + %d\n\n### Response:\n%d<eos>",
               &x, &y2, &z) == 3) {
      right &= x + y2 == z;
      nadd++;
    }
    const char *u = "<bos>### Instruction:\nConvert the text to upper case.\n\n### Input:\n";
    if (!strncmp(s, u, strlen(u))) {
      const char *in = s + strlen(u), *out = strstr(in, "### Response:\n") + 14;
      size_t k = 0;
      while (in[k] != '\n' && k < sizeof word - 1)
        k++;
      for (size_t j = 0; j < k; j++)
        right &= out[j] == (in[j] == ' ' ? ' ' : in[j] - 'a' + 'A');
      right &= !strcmp(out + k, "<eos>");
      nupper++;
    }
  }
  CHECK(right && nadd > 200 && nupper > 200);

  /* Written as JSONL and read back by alpaca_dataset: the same dataset. */
  Path p = in_dir("syn.jsonl");
  CHECK(synthetic_alpaca_write(p.s, 4000, 0) == 0);
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p.s, (long)getpid());
  CHECK(access(p.s, F_OK) == 0 && access(tmp, F_OK) != 0); /* renamed into place */
  char yy[512];
  snprintf(yy, sizeof yy, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                          "  template: compact\n  holdout_fraction: 0.1\n", p.s);
  Dataset *d = load(yy, 128);
  if (CHECK(d != NULL)) {
    same = dataset_num_samples(d, SPLIT_TRAIN) == ntr && dataset_num_samples(d, SPLIT_HELDOUT) == nho;
    for (int i = 0; same && i < ntr + nho; i++)
      same &= rows_equal(dataset_row(a, SPLIT_ALL, i), dataset_row(d, SPLIT_ALL, i));
    CHECK(same);
    dataset_free(d);
  }
  Buf desc = {0};
  dataset_describe(a, &desc);
  printf("%s\n", desc.data);
  CHECK(strstr(desc.data, "synthetic_alpaca: 3600 train + 400 held-out samples") != NULL);
  buf_free(&desc);

  /* A list of blocks is one dataset, the parts' splits concatenated. */
  Dataset *cat = load("dataset:\n  - _component_: optc.datasets.synthetic_alpaca\n    num_samples: 4000\n"
                      "  - _component_: optc.datasets.synthetic_alpaca\n    seed: 1\n", 128);
  if (CHECK(cat != NULL)) {
    CHECK(dataset_num_samples(cat, SPLIT_TRAIN) == 7200 && dataset_num_samples(cat, SPLIT_HELDOUT) == 800);
    CHECK(rows_equal(dataset_row(cat, SPLIT_TRAIN, 3600), dataset_row(c, SPLIT_TRAIN, 0)));
    CHECK(rows_equal(dataset_row(cat, SPLIT_HELDOUT, 400), dataset_row(c, SPLIT_HELDOUT, 0)));
    dataset_free(cat);
  }
  dataset_free(a);
  dataset_free(b);
  dataset_free(c);
}

static void remove_dir(void) {
  const char *names[] = {"alpaca.jsonl", "mapped.jsonl", "bad.jsonl", "text.txt", "syn.jsonl", "stderr.txt"};
  for (size_t i = 0; i < ARRAY_LEN(names); i++)
    unlink(in_dir(names[i]).s);
  rmdir(dir);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/test_data.XXXXXX");
  if (!mkdtemp(dir))
    die("mkdtemp");
  arena = arena_new();
  test_tokenizer();
  test_prompt_text();
  test_alpaca();
  test_bad_lines();
  test_config_errors();
  test_packing();
  test_loader();
  test_text_file();
  test_synthetic();
  remove_dir();
  arena_free(arena);
  printf("%s: %d checks, %d failed\n", nfailed ? "FAIL" : "PASS", nchecks, nfailed);
  return nfailed ? 1 : 0;
}
