/* test_data.c: the data layer. The byte and Llama 4 tokenizers, torchtune's
 * alpaca prompt text and loss mask, packing (positions and segments, each
 * block of a list on its own), the seeded shuffle, sharding across ranks (1
 * rank and 2 ranks see the same global batches), malformed JSONL lines
 * reported by line, JSON array files, missing files, unknown keys, text
 * files, the synthetic dataset (deterministic, held-out split disjoint); the
 * Parquet reader (every codec and page version against pyarrow's values, the
 * malformed files, a mutation sweep, Snappy), split strings against
 * datasets' own results (tests/data/splits.jsonl), and data file inference
 * in a dataset directory.
 *   test_data TESTS_DIR   (tests/, for tests/data and tests/tokenizer)
 * Exits 0 when every check passes; run it under ASan+UBSan too. */
#include "data.h"
#include "parquet.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testlib.h"

static Arena *arena;
static const char *tests_dir; /* argv[1] */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0)
    die(path);
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
  if (tokenizer_decode(&tok, ids, n, false, false, &b) < 0)
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
  Ids ids = {0};
  CHECK(tokenizer_encode(&tok, text, (size_t)n, false, false, &ids) == n);
  CHECK(ids.v[0] == 'h' && ids.v[1] == 0xc3 && ids.v[7] == 0x01 && ids.v[8] == 0xff);
  Buf b = {0};
  CHECK(tokenizer_decode(&tok, ids.v, n, false, false, &b) == 0);
  CHECK(b.len == (size_t)n && memcmp(b.data, text, (size_t)n) == 0);
  buf_free(&b);
  ids.n = 0;
  CHECK(tokenizer_encode(&tok, text, 3, true, true, &ids) == 5 && ids.v[0] == 256 && ids.v[4] == 257);
  ids.n = 0;
  CHECK(tokenizer_encode(&tok, "", 0, true, true, &ids) == 2); /* bytes: bos and eos even for nothing */
  ids_free(&ids);
  int32_t sp[] = {256, 'a', 257, 258};
  CHECK(tokenizer_decode(&tok, sp, 4, false, false, &b) == 0 && strcmp(b.data, "<bos>a<eos><pad>") == 0);
  buf_free(&b);
  CHECK(tokenizer_decode(&tok, sp, 4, false, true, &b) == 0 && strcmp(b.data, "a") == 0);
  buf_free(&b);
  CHECK(tokenizer_decode(&tok, sp, 4, true, false, &b) == 0 && strcmp(b.data, "<bos>a") == 0);
  buf_free(&b);
  int32_t bad[] = {'a', 259};
  capture_begin();
  CHECK(tokenizer_decode(&tok, bad, 2, false, false, &b) == -1);
  CHECK(strstr(capture_end(), "cannot decode token id 259") != NULL);
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
  /* torchtune's alpaca_dataset trains on the input by default */
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 0), prompt_with_input, "hello", true);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 1), prompt_no_input, "Blue.", true);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 2), prompt_no_input, "Red \xc3\xa9", true);
  check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 3), prompt_no_input, "x", true);
  dataset_free(ds);
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                        "  train_on_input: false\n", p.s);
  ds = load(y, 512);
  if (CHECK(ds != NULL)) {
    check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 0), prompt_with_input, "hello", false);
    check_alpaca_row(dataset_row(ds, SPLIT_TRAIN, 3), prompt_no_input, "x", false);
    dataset_free(ds);
  }

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
                        "  template: compact\n  train_on_input: false\n", p.s);
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
  CHECK(strstr(msg, "dataset: warning: skipped 4 malformed lines") != NULL);

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
  /* alpaca_dataset's default source is tatsu-lab/alpaca, from the hub cache */
  msg = load_fails("dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  packed: False\n", 128);
  CHECK(strstr(msg, "the Hugging Face dataset 'tatsu-lab/alpaca' is not in the local hub cache") != NULL);
  msg = load_fails("dataset:\n  _component_: torchtune.datasets.instruct_dataset\n", 128);
  CHECK(strstr(msg, "test.yaml:2:16: error: dataset._component_: torchtune.datasets.instruct_dataset needs a "
                    "tokenizer with a chat format") != NULL);
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
      while (t < L && r.tokens[t] != 0) {
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
        if (t < L && r.tokens[t] == 0 && next < dataset_num_samples(flat, split))
          fits &= dataset_row(flat, split, next).len > L - t;
      }
      /* the pad tail (PackedDataset pads with 0): its own segment, target -100, positions continuing (capped) */
      for (int k = t; k < L && ok; k++)
        ok &= r.tokens[k] == 0 && r.targets[k] == -100 && r.segments[k] == seg &&
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
                          "  template: compact\n  holdout_fraction: 0.1\n  train_on_input: false\n", p.s);
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

/* ---- the Llama 4 tokenizer through data.h ------------------------------------------------------- */

static Path src_path(const char *rel) {
  Path p;
  snprintf(p.s, sizeof p.s, "%s/%s", tests_dir, rel);
  return p;
}

/* A Llama 4 tokenizer block over the small test vocabulary. */
static bool llama4_tok(Tokenizer *t, const char *extra) {
  char y[1024];
  snprintf(y, sizeof y, "tokenizer:\n  _component_: torchtune.models.llama4.llama4_transform\n  path: %s\n%s",
           src_path("tokenizer/tiktoken_small_llama4.model").s, extra);
  return tokenizer_from_config(block(y, "tokenizer"), t);
}

static void test_llama4_tokenizer(void) {
  Tokenizer t;
  if (!CHECK(llama4_tok(&t, "")))
    return;
  /* llama4_transform's defaults: max_seq_len 8192, Llama 4's ids */
  CHECK(t.kind == TOKENIZER_LLAMA4 && t.max_seq_len == 8192 && t.vocab_size == 202048 && t.bos_id == 200000 &&
        t.eos_id == 200001 && t.pad_id == 200018);
  /* torchtune's own ids for its test sentence (tests/data/golden/tokenize_lines.ids, line 1) */
  const char *text = "I can see the sun. But even if I cannot see the sun, I know that it exists.";
  static const int32_t want[] = {200000, 73,  503, 655, 262, 376, 110, 46,  691, 721, 428, 270, 1122, 655,
                                 262,    376, 110, 44,  270, 687, 334, 312, 522, 511, 115, 46,  200001};
  Ids ids = {0};
  CHECK(tokenizer_encode(&t, text, strlen(text), true, true, &ids) == (int)ARRAY_LEN(want) &&
        !memcmp(ids.v, want, sizeof want));
  Buf b = {0};
  CHECK(tokenizer_decode(&t, ids.v, ids.n, true, true, &b) == 0 && !strcmp(b.data, text));
  buf_free(&b);
  ids.n = 0;
  CHECK(tokenizer_encode(&t, "", 0, true, true, &ids) == 0); /* torchtune: no ids for no text */
  ids_free(&ids);
  tokenizer_free(&t);
  Tokenizer t2;
  CHECK(llama4_tok(&t2, "  max_seq_len: null\n  image_size: 336\n  max_num_tiles: 16\n  special_tokens_path: null\n"
                        "  prompt_template: null\n") && t2.max_seq_len == 0);
  tokenizer_free(&t2);
  capture_begin();
  CHECK(!llama4_tok(&t2, "  prompt_template: torchtune.data.ChatMLTemplate\n"));
  CHECK(strstr(capture_end(), "test.yaml:4:20: error: tokenizer.prompt_template: prompt templates are not supported") !=
        NULL);
  capture_begin();
  CHECK(!tokenizer_from_config(block("tokenizer:\n  _component_: torchtune.models.llama4.llama4_transform\n",
                                     "tokenizer"), &t2));
  CHECK(strstr(capture_end(), "needs path") != NULL);
  Path bad = in_dir("bad.model");
  write_file(bad.s, "QUJD 0\nnot-base64! 1\n");
  char y[512];
  snprintf(y, sizeof y, "tokenizer:\n  _component_: torchtune.models.llama4.llama4_transform\n  path: %s\n", bad.s);
  capture_begin();
  CHECK(!tokenizer_from_config(block(y, "tokenizer"), &t2));
  const char *msg = capture_end();
  CHECK(strstr(msg, "bad.model:2:4: error: bad base64") != NULL && strstr(msg, "note: the tokenizer named here"));
}

/* A dataset block with the Llama 4 tokenizer. */
static Dataset *load_l4(const char *text, int L) {
  Tokenizer t;
  if (!llama4_tok(&t, ""))
    return NULL;
  Dataset *ds = dataset_from_config(block(text, "dataset"), &t, L);
  tokenizer_free(&t);
  return ds;
}

static const char *load_l4_fails(const char *text, int L) {
  capture_begin();
  Dataset *ds = load_l4(text, L);
  const char *msg = capture_end();
  CHECK(ds == NULL);
  dataset_free(ds);
  return msg;
}

/* Llama 4's chat format for an alpaca sample: the tokens, the mask as
 * labels, truncation; the same rows from JSON, JSON Lines and Parquet. */
static void test_llama4_alpaca(void) {
  char y[1024];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: json\n"
                        "  data_files: %s\n  train_on_input: false\n", src_path("data/alpaca_small.json").s);
  Dataset *ds = load_l4(y, 8192);
  if (!CHECK(ds != NULL))
    return;
  CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 16);
  DataRow r = dataset_row(ds, SPLIT_TRAIN, 2); /* "What is the capital of France?" -> "Paris." */
  /* bos, the user header and prompt, eot: masked; the assistant's header,
   * "Paris.", eot: trained; the end eos: masked and last */
  CHECK(r.tokens[0] == LLAMA4_BOS && r.tokens[1] == LLAMA4_HEADER_START && r.tokens[r.len - 1] == LLAMA4_EOS);
  CHECK(r.tokens[r.len - 2] == LLAMA4_EOT && r.targets[r.len - 1] == -100 && r.targets[r.len - 2] == -100);
  int eot = 0, first = -1;
  for (int t = 0; t < r.len; t++) {
    eot += r.tokens[t] == LLAMA4_EOT;
    if (first < 0 && r.targets[t] != -100)
      first = t;
  }
  CHECK(eot == 2);
  /* the first label is the assistant header's start (the user's eot is masked) */
  CHECK(first > 0 && r.tokens[first] == LLAMA4_EOT && r.targets[first] == LLAMA4_HEADER_START);
  bool shifted = true;
  for (int t = first; t < r.len - 2; t++)
    shifted &= r.targets[t] == r.tokens[t + 1];
  CHECK(shifted && r.targets[r.len - 3] == LLAMA4_EOT);
  Buf b = {0};
  Tokenizer tk;
  llama4_tok(&tk, "");
  CHECK(tokenizer_decode(&tk, r.tokens, r.len, true, false, &b) == 0);
  CHECK(strstr(b.data, "<|header_start|>assistant<|header_end|>\n\nParis.<|eot|>") != NULL);
  buf_free(&b);
  /* truncation at L: the last token becomes eos, masked */
  Dataset *cut = load_l4(y, 40);
  if (CHECK(cut != NULL)) {
    DataRow c = dataset_row(cut, SPLIT_TRAIN, 2);
    CHECK(c.len == 40 && c.tokens[39] == LLAMA4_EOS && c.targets[39] == -100 && c.targets[38] == -100 &&
          !memcmp(c.tokens, r.tokens, sizeof(int32_t) * 39));
    CHECK(dataset_truncated(cut) == 16);
    dataset_free(cut);
  }
  /* the same rows as JSON Lines, and from each Parquet file */
  Path jl = in_dir("alpaca.jsonl");
  FILE *f = fopen(jl.s, "wb");
  json_t *arr = json_load_file(src_path("data/alpaca_small.json").s, 0, NULL);
  for (size_t i = 0; arr && i < json_array_size(arr); i++) {
    char *line = json_dumps(json_array_get(arr, i), JSON_COMPACT);
    fprintf(f, "%s\n", line);
    free(line);
  }
  json_decref(arr);
  fclose(f);
  static const char *const sources[] = {"json", "parquet", "parquet", "parquet"};
  const char *files[] = {jl.s, "data/alpaca_small.snappy.parquet", "data/alpaca_small.zstd.parquet",
                         "data/alpaca_small.mapped.parquet"};
  for (int k = 0; k < 4; k++) {
    snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                          "  data_files: %s\n  train_on_input: false\n%s", sources[k], k ? src_path(files[k]).s : files[k],
             k == 3 ? "  column_map: {instruction: q, input: ctx, output: a}\n" : "");
    Dataset *d2 = load_l4(y, 8192);
    bool same = d2 && dataset_num_samples(d2, SPLIT_TRAIN) == 16;
    for (int i = 0; same && i < 16; i++)
      same = rows_equal(dataset_row(ds, SPLIT_TRAIN, i), dataset_row(d2, SPLIT_TRAIN, i));
    CHECK(same);
    dataset_free(d2);
  }
  tokenizer_free(&tk);
  dataset_free(ds);

  /* a list of blocks: each packed on its own (torchtune's ConcatDataset of
   * PackedDatasets), so no pack mixes the two */
  snprintf(y, sizeof y,
           "dataset:\n  - _component_: torchtune.datasets.alpaca_dataset\n    source: json\n    data_files: %s\n"
           "    split: train[:3]\n    packed: true\n  - _component_: torchtune.datasets.alpaca_dataset\n"
           "    source: json\n    data_files: %s\n    split: train[3:6]\n    packed: true\n",
           src_path("data/alpaca_small.json").s, src_path("data/alpaca_small.json").s);
  Dataset *one = load_l4(y, 4096);
  if (CHECK(one != NULL)) {
    CHECK(dataset_packed(one) && dataset_num_samples(one, SPLIT_TRAIN) == 2);
    DataRow p = dataset_row(one, SPLIT_TRAIN, 0);
    int segs = p.segments[p.len - 1] + 1;
    CHECK(segs == 4 && p.tokens[p.len - 1] == 0 && p.targets[p.len - 1] == -100); /* 3 samples and padding 0 */
    Buf d = {0};
    dataset_dump_row(one, SPLIT_TRAIN, 0, &d);
    CHECK(strstr(d.data, "\"seq_lens\": [") != NULL && strstr(d.data, "\"input_pos\": [0, 1, 2") != NULL);
    buf_free(&d);
    dataset_free(one);
  }
}

/* ---- torchtune's chat and instruct datasets -------------------------------------------------- */

static void test_chat_rows(void) {
  Path p = in_dir("chat.jsonl");
  write_file(p.s,
             "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}, "
             "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
             "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, "
             "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
  char y[1024];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.chat_dataset\n  source: %s\n"
                        "  conversation_column: messages\n  conversation_style: openai\n", p.s);
  Dataset *ds = load_l4(y, 512);
  if (CHECK(ds != NULL)) {
    CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 3);
    /* a content list of one text part is that text */
    CHECK(rows_equal(dataset_row(ds, SPLIT_TRAIN, 0), dataset_row(ds, SPLIT_TRAIN, 2)));
    dataset_free(ds);
  }
  /* new_system_prompt replaces the conversation's system message */
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.chat_dataset\n  source: %s\n"
                        "  conversation_column: messages\n  conversation_style: openai\n"
                        "  new_system_prompt: sys\n", p.s);
  ds = load_l4(y, 512);
  Dataset *plain = NULL;
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.chat_dataset\n  source: %s\n"
                        "  conversation_column: messages\n  conversation_style: openai\n", p.s);
  plain = load_l4(y, 512);
  if (CHECK(ds && plain))
    CHECK(rows_equal(dataset_row(ds, SPLIT_TRAIN, 0), dataset_row(plain, SPLIT_TRAIN, 1)) &&
          rows_equal(dataset_row(ds, SPLIT_TRAIN, 1), dataset_row(plain, SPLIT_TRAIN, 1)));
  dataset_free(ds);
  dataset_free(plain);
  /* an image column makes torchtune's instruct transform multimodal */
  Path q = in_dir("qa.jsonl");
  write_file(q.s, "{\"input\": \"q\", \"output\": \"a\", \"image\": \"x.png\"}\n");
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.instruct_dataset\n  source: %s\n", q.s);
  CHECK(strstr(load_l4_fails(y, 512), "the data has an 'image' column") != NULL);
  write_file(q.s, "{\"input\": \"q\", \"output\": 5}\n");
  CHECK(strstr(load_l4_fails(y, 512), "qa.jsonl:1:1: error: \"output\" is not a string") != NULL);
  /* a Parquet row's problem names the row */
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: parquet\n"
                        "  data_files: %s\n  column_map: {instruction: q, output: n}\n",
           src_path("data/alpaca_small.mapped.parquet").s);
  CHECK(strstr(load_l4_fails(y, 512), "alpaca_small.mapped.parquet: row 0: \"n\" is null") != NULL);
}

/* ---- JSON array files, and positions ------------------------------------------------------------ */

static void test_json_array(void) {
  Path p = in_dir("arr.json");
  write_file(p.s, "[\n  {\"instruction\": \"a\", \"output\": \"b\"},\n  {\"instruction\": \"c\",\n   \"output\": 7}\n]\n");
  char y[512];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: json\n"
                        "  data_files: %s\n", p.s);
  char want[400];
  snprintf(want, sizeof want, "%s:3:3: error: \"output\" is not a string", p.s);
  CHECK(strstr(load_fails(y, 256), want) != NULL);
  write_file(p.s, "[{\"instruction\": \"a\", \"output\": \"b\"},\n {\"instruction\": \"c\" \"output\": \"d\"}]");
  snprintf(want, sizeof want, "%s:2:", p.s);
  const char *msg = load_fails(y, 256);
  CHECK(strstr(msg, want) != NULL && strstr(msg, "error: malformed JSON") != NULL);
  write_file(p.s, "[{\"instruction\": \"a\", \"output\": \"b\"}] x");
  CHECK(strstr(load_fails(y, 256), "unexpected text after the JSON array") != NULL);
  write_file(p.s, "[{\"instruction\": \"a\", \"output\": \"b\"}, 3]");
  CHECK(strstr(load_fails(y, 256), "must all be objects") != NULL);
  write_file(p.s, "[{\"instruction\": \"a\", \"output\": \"b\"}");
  CHECK(strstr(load_fails(y, 256), "the array is not closed") != NULL);
  /* strings become a "text" column */
  write_file(p.s, "\xEF\xBB\xBF[\"one\", \"two\"]");
  CHECK(strstr(load_fails(y, 256), "the data has no column 'instruction' (its columns: text)") != NULL);
  write_file(p.s, "[\n  {\"instruction\": \"a\", \"output\": \"b\"}\n]\n");
  Dataset *ds = load(y, 256);
  CHECK(ds && dataset_num_samples(ds, SPLIT_TRAIN) == 1);
  dataset_free(ds);
}

/* ---- split strings: datasets' results on the same strings ------------------------------------------ */

static void test_splits(void) {
  json_error_t err;
  FILE *f = fopen(src_path("data/splits.jsonl").s, "rb");
  if (!CHECK(f != NULL))
    return;
  char line[4096];
  int n = 0, bad = 0;
  while (fgets(line, sizeof line, f)) {
    json_t *rec = json_loads(line, 0, &err);
    if (!rec)
      continue;
    const char *spec = json_string_value(json_object_get(rec, "spec"));
    int64_t rows = json_integer_value(json_object_get(rec, "n"));
    json_t *ranges = json_object_get(rec, "ranges");
    const char *error = json_string_value(json_object_get(rec, "error"));
    SplitSpec s[16];
    char why[256] = "";
    int k = split_parse(spec, s, 16, why, sizeof why);
    bool any = false, ok = true;
    int64_t from[16], to[16];
    for (int i = 0; i < k && ok; i++) {
      ok = split_absolute(&s[i], rows, &from[i], &to[i], why, sizeof why) == 0;
      any |= from[i] != to[i];
    }
    char got[300];
    if (k >= 0 && ok && !any)
      snprintf(got, sizeof got, "Instruction \"%s\" corresponds to no data!", spec);
    else
      snprintf(got, sizeof got, "%s", why);
    bool pass;
    if (error) { /* the same message, except Python's own int() errors */
      bool failed = k < 0 || !ok || !any;
      pass = failed && (strncmp(error, "invalid literal for int()", 25) == 0 || strcmp(got, error) == 0);
    } else {
      pass = k == (int)json_array_size(ranges) && ok;
      for (int i = 0; pass && i < k; i++) {
        json_t *r = json_array_get(ranges, (size_t)i);
        pass = s[i].split[0] && from[i] == json_integer_value(json_array_get(r, 0)) &&
               to[i] == json_integer_value(json_array_get(r, 1));
      }
    }
    if (!pass && bad++ < 5)
      printf("split '%s' over %lld rows: got %s, datasets: %s\n", spec, (long long)rows, k < 0 || !ok ? got : "ranges",
             error ? error : "ranges");
    n++;
    json_decref(rec);
  }
  fclose(f);
  CHECK(n > 400 && bad == 0);
  printf("splits: %d strings x sizes as datasets has them\n", n);
  /* "all" is every split; slices into a small file */
  Path p = in_dir("ten.jsonl");
  Buf b = {0};
  for (int i = 0; i < 10; i++)
    buf_printf(&b, "{\"instruction\": \"i%d\", \"output\": \"o%d\"}\n", i, i);
  write_file(p.s, b.data);
  buf_free(&b);
  char y[512];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                        "  split: train[-3:]+train[:10%%]\n", p.s);
  Dataset *ds = load(y, 256), *all = NULL;
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n"
                        "  split: all\n", p.s);
  all = load(y, 256);
  if (CHECK(ds && all)) {
    CHECK(dataset_num_samples(ds, SPLIT_TRAIN) == 4 && dataset_num_samples(all, SPLIT_TRAIN) == 10);
    CHECK(rows_equal(dataset_row(ds, SPLIT_TRAIN, 0), dataset_row(all, SPLIT_TRAIN, 7)) &&
          rows_equal(dataset_row(ds, SPLIT_TRAIN, 3), dataset_row(all, SPLIT_TRAIN, 0)));
  }
  dataset_free(ds);
  dataset_free(all);
}

/* ---- data file inference in a dataset directory (a hub snapshot's rules) ------------------------------- */

static void mkdirs(const char *path) {
  char p[1024];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(p, 0700);
      *s = '/';
    }
  mkdir(p, 0700);
}

/* Files (relative to a new directory) holding one alpaca row each: the
 * splits datasets would infer, listed by the unknown-split message. */
static void check_inference(const char *name, const char *const *files, int n, const char *want_splits,
                            const char *split, int want_rows) {
  Path d = in_dir(name);
  for (int i = 0; i < n; i++) {
    char full[600];
    snprintf(full, sizeof full, "%s/%s", d.s, files[i]);
    char *slash = strrchr(full, '/');
    *slash = 0;
    mkdirs(full);
    *slash = '/';
    write_file(full, strstr(files[i], ".parquet") ? "" : "{\"instruction\": \"a\", \"output\": \"b\"}\n");
  }
  char y[700];
  snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n  split: nope\n", d.s);
  const char *msg = load_fails(y, 256);
  char want[300];
  snprintf(want, sizeof want, "Should be one of [%s]", want_splits);
  if (!CHECK(strstr(msg, want) != NULL))
    printf("  %s: %s", name, msg);
  if (split) {
    snprintf(y, sizeof y, "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: %s\n  split: %s\n",
             d.s, split);
    Dataset *ds = load(y, 256);
    CHECK(ds && dataset_num_samples(ds, SPLIT_TRAIN) == want_rows);
    dataset_free(ds);
  }
}

static void test_inference(void) {
  static const char *const flat[] = {"alpaca_data_cleaned.json", "README.md", "dataset_info.json", ".hidden.json"};
  check_inference("inf_flat", flat, 4, "'train'", "train", 1);
  static const char *const shard[] = {"data/train-00000-of-00002-ab.jsonl", "data/train-00001-of-00002-cd.jsonl",
                                      "data/test-00000-of-00001.jsonl", "data/extra.split-00000-of-00001.jsonl"};
  check_inference("inf_shard", shard, 4, "'train', 'test', 'extra.split'", "train", 2);
  static const char *const dirs[] = {"train/a.json", "train/b.json", "dev-set/c.jsonl", "my_test/d.json",
                                     "other/train_e.json"};
  check_inference("inf_dirs", dirs, 5, "'train', 'validation', 'test'", "validation", 1);
  static const char *const names[] = {"train.jsonl", "data-train-2.json", "valid.json", "eval.jsonl", "retrain.json",
                                      "__pycache__/test.json"};
  check_inference("inf_names", names, 6, "'train', 'validation', 'test'", "train", 2);
  /* the most common extension wins, parquet on a tie: here json */
  static const char *const mixed[] = {"a.json", "b.json", "c.parquet"};
  check_inference("inf_mixed", mixed, 3, "'train'", "train", 2);
}

/* ---- the Parquet reader -------------------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  Buf b = {0};
  char chunk[4096];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
    buf_put(&b, chunk, got);
  fclose(f);
  *n = b.len;
  return b.data;
}

/* Reads every column of a Parquet file in memory; the count read, or -1
 * when it did not open. Messages go to the capture. */
static int read_all_columns(const char *name, const void *data, size_t n) {
  ParquetFile *f = parquet_open_bytes(name, data, n);
  if (!f)
    return -1;
  int ok = 0;
  for (int c = 0; c < parquet_num_columns(f); c++) {
    PqValues v;
    if (!parquet_column(f, c)->nested && parquet_read_column(f, c, &v) == 0) {
      ok++;
      pq_values_free(&v);
    }
  }
  parquet_close(f);
  return ok;
}

static void test_parquet_types(void) {
  json_t *want = json_load_file(src_path("data/parquet/types.expected.json").s, 0, NULL);
  if (!CHECK(want != NULL))
    return;
  static const char *const names[] = {"none.v1", "none.v2", "snappy.v1", "snappy.v2", "zstd.v1", "zstd.v2"};
  for (size_t k = 0; k < ARRAY_LEN(names); k++) {
    char rel[128];
    snprintf(rel, sizeof rel, "data/parquet/types.%s.parquet", names[k]);
    ParquetFile *f = parquet_open(src_path(rel).s);
    if (!CHECK(f != NULL))
      continue;
    CHECK(parquet_num_rows(f) == 7 && parquet_num_columns(f) == 7);
    bool same = true;
    const char *key;
    json_t *col;
    json_object_foreach(want, key, col) {
      int c = parquet_find_column(f, key);
      PqValues v;
      if (c < 0 || parquet_read_column(f, c, &v) != 0) {
        same = false;
        continue;
      }
      const PqColumn *pc = parquet_column(f, c);
      same &= pc->optional == (strcmp(key, "req") != 0) && !pc->nested;
      for (int64_t i = 0; i < v.n; i++) {
        json_t *x = json_array_get(col, (size_t)i);
        if (json_is_null(x))
          same &= !v.valid[i];
        else if (json_is_string(x))
          same &= v.valid[i] && pc->text && (size_t)(v.off[i + 1] - v.off[i]) == json_string_length(x) &&
                  !memcmp(v.bytes + v.off[i], json_string_value(x), json_string_length(x));
        else if (json_is_boolean(x))
          same &= v.valid[i] && v.ints[i] == json_is_true(x);
        else if (json_is_integer(x))
          same &= v.valid[i] && v.ints[i] == json_integer_value(x);
        else
          same &= v.valid[i] && v.reals[i] == json_real_value(x);
      }
      pq_values_free(&v);
    }
    if (!CHECK(same))
      printf("  types.%s.parquet differs from pyarrow's values\n", names[k]);
    parquet_close(f);
  }
  json_decref(want);
  /* the small writer's good files */
  static const struct {
    const char *file;
    const char *values[4];
  } mini[] = {{"mini_plain", {"alpha", "beta", "gamma"}}, {"mini_optional", {"alpha", "beta", "gamma", NULL}},
              {"mini_dict", {"b", "a", "b"}}, {"mini_snappy", {"alpha", "beta", "gamma"}}};
  for (size_t k = 0; k < ARRAY_LEN(mini); k++) {
    char rel[128];
    snprintf(rel, sizeof rel, "data/parquet/%s.parquet", mini[k].file);
    ParquetFile *f = parquet_open(src_path(rel).s);
    PqValues v;
    bool ok = f && parquet_read_column(f, 0, &v) == 0;
    int nv = k == 1 ? 4 : 3;
    for (int i = 0; ok && i < nv; i++)
      ok = mini[k].values[i] ? v.valid[i] && (size_t)(v.off[i + 1] - v.off[i]) == strlen(mini[k].values[i]) &&
                                   !memcmp(v.bytes + v.off[i], mini[k].values[i], strlen(mini[k].values[i]))
                             : !v.valid[i];
    CHECK(ok);
    if (f && ok)
      pq_values_free(&v);
    parquet_close(f);
  }
  ParquetFile *nested = parquet_open(src_path("data/parquet/nested.parquet").s);
  if (CHECK(nested != NULL)) {
    CHECK(parquet_num_columns(nested) == 2 && parquet_column(nested, 0)->nested && !parquet_column(nested, 1)->nested);
    PqValues v;
    capture_begin();
    CHECK(parquet_read_column(nested, 0, &v) == -1);
    CHECK(strstr(capture_end(), "column 'conversations' is nested") != NULL);
    CHECK(parquet_read_column(nested, 1, &v) == 0 && v.n == 1 && v.ints[0] == 1);
    pq_values_free(&v);
    parquet_close(nested);
  }
}

static void test_parquet_malformed(void) {
  static const struct {
    const char *file, *message;
  } bad[] = {
      {"bad_magic", "does not start with the magic PAR1"},
      {"bad_tail", "does not end with the magic PAR1"},
      {"truncated", "does not end with the magic PAR1"},
      {"short", "8 bytes is too short"},
      {"bad_footer_len", "the footer length 1048576 at byte 119 does not fit in the 127-byte file"},
      {"bad_footer", "malformed Parquet footer at byte"},
      {"bad_offset", "its pages (byte 1073741824, 43 bytes) are outside the file's data"},
      {"bad_chunk_len", "are outside the file's data"},
      {"bad_page_size", "page at byte 4: the page's 4000 bytes run past its column chunk"},
      {"bad_snappy", "SNAPPY data is corrupt"},
      {"bad_dict_index", "dictionary index 9 is out of range (the dictionary has 2 values)"},
      {"bad_def_levels", "the definition levels end after 2 of 4 values"},
      {"bad_value_len", "value 0 (1000 bytes) runs past the page"},
      {"bad_rows", "num_rows is 5, but the row groups hold 3"},
      {"bad_num_values", "has 2 values for 3 rows"},
      {"bad_type", "is BYTE_ARRAY, but the schema says INT64"},
      {"bad_schema", "the schema root claims 7 children of 1 elements"},
      {"gzip", "the GZIP codec is not supported"},
      {"delta", "the DELTA_BINARY_PACKED encoding is not supported"},
  };
  for (size_t k = 0; k < ARRAY_LEN(bad); k++) {
    char rel[128];
    snprintf(rel, sizeof rel, "data/parquet/%s.parquet", bad[k].file);
    size_t n;
    char *data = slurp(src_path(rel).s, &n);
    if (!CHECK(data != NULL))
      continue;
    capture_begin();
    int got = read_all_columns(rel, data, n);
    const char *msg = capture_end();
    bool ok = (got == -1 || (got < 3 && strstr(msg, "error:"))) && strstr(msg, rel) && strstr(msg, bad[k].message);
    if (!CHECK(ok))
      printf("  %s: %d, %s", rel, got, msg);
    free(data);
  }
  /* Every truncation and every single-byte change of a few files is an
   * error or a read, never a crash (ASan checks every access). */
  static const char *const sweep[] = {"data/parquet/mini_dict.parquet", "data/parquet/mini_optional.parquet",
                                      "data/parquet/mini_snappy.parquet", "data/parquet/types.snappy.v1.parquet"};
  long reads = 0, tries = 0;
  for (size_t k = 0; k < ARRAY_LEN(sweep); k++) {
    size_t n;
    char *data = slurp(src_path(sweep[k]).s, &n);
    if (!CHECK(data != NULL))
      continue;
    capture_begin();
    size_t step = n > 1000 ? 7 : 1; /* the big file: every 7th byte */
    for (size_t len = 0; len <= n; len += step, tries++)
      reads += read_all_columns("sweep", data, len) > 0;
    static const unsigned char vals[] = {0x00, 0xff, 0x7f, 0x01};
    for (size_t i = 0; i < n; i += step) {
      unsigned char o = (unsigned char)data[i];
      for (size_t v = 0; v < ARRAY_LEN(vals) + 1; v++, tries++) {
        data[i] = (char)(v < ARRAY_LEN(vals) ? vals[v] : o ^ 0x10);
        reads += read_all_columns("sweep", data, n) > 0;
      }
      data[i] = (char)o;
    }
    capture_end();
    free(data);
  }
  printf("parquet sweep: %ld damaged files read without a crash (%ld still read)\n", tries, reads);
  CHECK(tries > 1000);
}

static void test_snappy(void) {
  uint8_t out[64];
  const char *why = NULL;
  /* "abcabcabcabc": a 3-byte literal, then a copy of 9 from offset 3 (overlapping) */
  static const uint8_t ok[] = {12, 2 << 2, 'a', 'b', 'c', 1 | ((9 - 4) << 2), 3};
  CHECK(snappy_decode(ok, sizeof ok, out, 12, &why) == 0 && !memcmp(out, "abcabcabcabc", 12));
  /* a 2-byte-offset copy, and a literal with a 1-byte length */
  uint8_t lit[80] = {70, 60 << 2, 65 - 1};
  for (int i = 0; i < 65; i++)
    lit[3 + i] = (uint8_t)('A' + i % 26);
  lit[68] = 2 | ((5 - 1) << 2), lit[69] = 65, lit[70] = 0;
  uint8_t big[70];
  CHECK(snappy_decode(lit, 71, big, 70, &why) == 0 && !memcmp(big + 65, lit + 3, 5));
  static const uint8_t zero_off[] = {5, 0, 'a', 1, 0};
  CHECK(snappy_decode(zero_off, sizeof zero_off, out, 5, &why) == -1 && strstr(why, "before the start"));
  static const uint8_t far[] = {6, 0, 'a', 1 | (1 << 2), 9};
  CHECK(snappy_decode(far, sizeof far, out, 6, &why) == -1 && strstr(why, "before the start"));
  static const uint8_t over[] = {2, 4 << 2, 'a', 'b', 'c', 'd', 'e'};
  CHECK(snappy_decode(over, sizeof over, out, 2, &why) == -1 && strstr(why, "past the uncompressed size"));
  static const uint8_t cut[] = {5, 4 << 2, 'a', 'b'};
  CHECK(snappy_decode(cut, sizeof cut, out, 5, &why) == -1 && strstr(why, "past the end of the input"));
  static const uint8_t shortout[] = {5, 0, 'a'};
  CHECK(snappy_decode(shortout, sizeof shortout, out, 5, &why) == -1 && strstr(why, "ends before"));
  static const uint8_t hdr[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  CHECK(snappy_decode(hdr, sizeof hdr, out, 5, &why) == -1);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    printf("usage: test_data TESTS_DIR\n");
    return 2;
  }
  tests_dir = argv[1];
  /* a hub cache that holds nothing: no test reads the machine's own */
  setenv("HF_HUB_CACHE", "/nonexistent/optc-test-hub", 1);
  test_dir_make("test_data");
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
  test_llama4_tokenizer();
  test_llama4_alpaca();
  test_chat_rows();
  test_json_array();
  test_splits();
  test_inference();
  test_parquet_types();
  test_parquet_malformed();
  test_snappy();
  test_dir_remove();
  arena_free(arena);
  printf("%s: %d checks, %d failed\n", nfailed ? "FAIL" : "PASS", nchecks, nfailed);
  return nfailed ? 1 : 0;
}
