/* fuzz_tokenizer.c: the Llama 4 tokenizer: its tiktoken vocabulary reader,
 * and encode/decode.
 *
 * Input: one mode byte, then the rest R.
 *   mode odd:  R is a vocabulary file (`base64 rank` lines) for bpe_load;
 *              one that loads encodes and decodes a short text.
 *   mode even: R is text for the small test vocabulary
 *              (tests/tokenizer/tiktoken_small_llama4.model): the property
 *              is that text that encodes (valid UTF-8) decodes back to the
 *              same bytes (no truncation, specials kept); then the chat
 *              format tokenizes it as a user message.
 * Malformed vocabularies and text are errors, never crashes. */
#include "fuzz.h"
#include "tokenizer.h"

static Bpe *small;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *path = getenv("OPTC_FUZZ_TOKENIZER");
  char def[1024];
  snprintf(def, sizeof def, "%s/tests/tokenizer/tiktoken_small_llama4.model", OPTC_SOURCE_ROOT);
  small = bpe_load(path ? path : def);
  if (!small) {
    fprintf(stderr, "fuzz_tokenizer: cannot load %s (set OPTC_FUZZ_TOKENIZER)\n", path ? path : def);
    exit(1);
  }
  return 0;
}

static void roundtrip(const Bpe *b, const char *text, size_t len, bool check) {
  Ids ids = {0};
  int n = bpe_encode(b, text, len, true, true, &ids);
  if (n >= 0) {
    FUZZ_CHECK(n == ids.n, "bpe_encode returned %d but appended %d", n, ids.n);
    Buf out = {0};
    /* bos and eos are ids[0] and ids[n-1] when there is text */
    int first = n > 0, count = n > 0 ? n - 2 : 0;
    FUZZ_CHECK(count >= 0, "bpe_encode gave %d ids for %zu bytes", n, len);
    FUZZ_CHECK(bpe_decode(b, n > 0 ? ids.v + first : NULL, count, false, false, &out) == 0,
               "decode of encode's ids failed");
    if (check)
      FUZZ_CHECK(out.len == len && memcmp(out.data ? out.data : "", text, len) == 0,
                 "decode(encode(text)) != text (%zu bytes in, %zu out)", len, out.len);
    buf_free(&out);
    Buf out2 = {0};
    bpe_decode(b, ids.v, ids.n, true, true, &out2);
    buf_free(&out2);
  }
  ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t mode = data[0];
  fuzz_quiet_begin();
  if (mode & 1) {
    const char *path = fuzz_file("vocab.model", data + 1, size - 1);
    Bpe *b = bpe_load(path);
    if (b) {
      static const char text[] = "Hello, world! 123 \xc3\xa9t\xc3\xa9 <|eot|>\n\n  tabs\tend";
      roundtrip(b, text, sizeof text - 1, true);
      FUZZ_CHECK(bpe_base_vocab_size(b) <= LLAMA4_FIRST_SPECIAL, "%d ranked tokens", bpe_base_vocab_size(b));
      bpe_free(b);
    }
  } else {
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    roundtrip(small, text, len, true);
    /* random ids: decode must refuse the ones that are not tokens */
    Ids ids = {0};
    for (size_t i = 0; i + 4 <= len && ids.n < 16; i += 4) {
      int32_t id;
      memcpy(&id, text + i, 4);
      ids_push(&ids, id % (LLAMA4_VOCAB + 8));
    }
    Buf out = {0};
    bpe_decode(small, ids.v, ids.n, mode & 2, mode & 4, &out);
    buf_free(&out);
    ids_free(&ids);
    char *content = fuzz_text((const uint8_t *)text, len);
    ChatMessage m[2] = {{"user", content, false, true}, {"assistant", "ok", false, (mode & 8) != 0}};
    ChatOptions opt = {.max_seq_len = (mode & 16) ? 8 : 0, .no_end_tokens = mode & 32, .truncate_left = mode & 64};
    ChatTokens ct = {0};
    if (llama4_tokenize_messages(small, m, 2, &opt, &ct) == 0)
      chat_tokens_free(&ct);
    free(content);
  }
  fuzz_quiet_end();
  return 0;
}
