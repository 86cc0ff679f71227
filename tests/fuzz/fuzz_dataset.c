/* fuzz_dataset.c: the dataset readers behind a `dataset:` block: JSON
 * arrays and JSON Lines (and Parquet) read as datasets.load_dataset reads
 * them, then torchtune's alpaca, instruct and chat datasets over the rows,
 * tokenized and packed.
 *
 * Input: one selector byte, then the data file's bytes. The selector picks
 *   bits 0-2: the dataset: alpaca (byte tokenizer), alpaca, instruct
 *             (question/answer), chat sharegpt, chat openai (Llama 4's
 *             tokenizer: tests/tokenizer/tiktoken_small_llama4.model),
 *             text_file, alpaca over Parquet, alpaca_cleaned
 *   bits 3-4: the split: train, train[:50%], train[1:-1], train[:3]+train[-2:]
 *   bit 5:    packed
 *   bit 6:    on_bad_line: skip
 * Every row built is dumped. Malformed data is an error (or a skipped
 * row), never a crash. */
#include "data.h"
#include "fuzz.h"

static Tokenizer llama4;
static bool have_llama4;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *path = getenv("OPTC_FUZZ_TOKENIZER");
  char def[1024];
  snprintf(def, sizeof def, "%s/tests/tokenizer/tiktoken_small_llama4.model", OPTC_SOURCE_ROOT);
  if (!path)
    path = def;
  Arena *a = arena_new();
  char *y = arena_printf(a, "_component_: torchtune.models.llama4.llama4_transform\npath: \"%s\"\nmax_seq_len: 96\n",
                         path);
  SrcFile src = {"tokenizer.yaml", y, strlen(y)};
  YamlNode *n = yaml_load(&src, a);
  have_llama4 = n && tokenizer_from_config(n, &llama4);
  if (!have_llama4)
    fprintf(stderr, "fuzz_dataset: no Llama 4 tokenizer at %s (set OPTC_FUZZ_TOKENIZER); byte tokenizer only\n",
            path);
  arena_free(a);
  return 0;
}

static const char *const splits[] = {"train", "train[:50%]", "train[1:-1]", "train[:3]+train[-2:]"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t sel = data[0];
  int kind = sel & 7;
  bool parquet = kind == 6;
  const char *path = fuzz_file(parquet ? "in.parquet" : kind == 5 ? "in.txt" : "in.jsonl", data + 1, size - 1);
  Buf y = {0};
  const Tokenizer *tok = &llama4;
  Tokenizer byte = tokenizer_byte();
  if (kind == 0 || kind == 5 || !have_llama4)
    tok = &byte;
  static const char *const comps[] = {
      "torchtune.datasets.alpaca_dataset", "torchtune.datasets.alpaca_dataset",
      "torchtune.datasets.instruct_dataset", "torchtune.datasets.chat_dataset",
      "torchtune.datasets.chat_dataset", "optc.datasets.text_file",
      "torchtune.datasets.alpaca_dataset", "torchtune.datasets.alpaca_cleaned_dataset"};
  buf_printf(&y, "_component_: %s\n", comps[kind]);
  if (kind == 5) {
    buf_printf(&y, "path: \"%s\"\n", path);
  } else {
    buf_printf(&y, "source: %s\ndata_files: \"%s\"\nsplit: \"%s\"\n", parquet ? "parquet" : "json", path,
               splits[(sel >> 3) & 3]);
    if (sel & 0x40)
      buf_puts(&y, "on_bad_line: skip\n");
  }
  if (kind == 2)
    buf_puts(&y, "column_map: {input: question, output: answer}\n");
  if (kind == 3)
    buf_puts(&y, "conversation_column: conversations\nconversation_style: sharegpt\n");
  if (kind == 4)
    buf_puts(&y, "conversation_column: messages\nconversation_style: openai\n");
  if (sel & 0x20)
    buf_puts(&y, "packed: true\n");
  fuzz_quiet_begin();
  Arena *a = arena_new();
  SrcFile src = {"dataset.yaml", y.data, y.len};
  YamlNode *n = yaml_load(&src, a);
  FUZZ_CHECK(n, "the harness's YAML does not load:\n%s", y.data);
  Dataset *ds = dataset_from_config(n, tok, 64);
  if (ds) {
    Buf out = {0};
    dataset_describe(ds, &out);
    for (int s = SPLIT_TRAIN; s <= SPLIT_HELDOUT; s++) {
      int rows = dataset_num_samples(ds, (DataSplit)s);
      for (int i = 0; i < rows && i < 64; i++) {
        DataRow r = dataset_row(ds, (DataSplit)s, i);
        FUZZ_CHECK(r.len >= 0 && r.len <= 64, "row %d has %d tokens, max_seq_len 64", i, r.len);
        dataset_dump_row(ds, (DataSplit)s, i, &out);
      }
    }
    buf_free(&out);
    dataset_free(ds);
  }
  arena_free(a);
  fuzz_quiet_end();
  buf_free(&y);
  return 0;
}
