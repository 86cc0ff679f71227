/* test_tokenizer.c: the Llama 4 tokenizer against torchtune's own output.
 *
 *   test_tokenizer MODEL GOLDEN
 *
 * MODEL is torchtune's tiktoken_small_llama4.model and GOLDEN is
 * tests/tokenizer/golden.jsonl, written by tests/tokenizer/gen_golden.py from
 * torchtune's Llama4Tokenizer and Llama4Transform. Every golden must match
 * exactly: the pattern string, the special tokens, encode with and without
 * bos/eos, decode under each flag pair, long texts (torchtune's 25,000 and
 * 400,000-character cuts), the chat format with its masks and truncation, and
 * the pre-tokenizer's pieces. Then malformed vocabulary files must fail with
 * positioned errors, and the encode speed is printed (not asserted).
 * Exits 0 when every check passes. */
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"

static void write_file(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0)
    die(path);
}

/* ---- helpers -------------------------------------------------------------------- */

/* The ids of a JSON array of integers, into out (emptied first). */
static void json_ids(const json_t *a, Ids *out) {
  out->n = 0;
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) ids_push(out, (int32_t)json_integer_value(v));
}

static bool ids_equal(const Ids *a, const Ids *b) {
  return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, sizeof(int32_t) * (size_t)a->n) == 0);
}

/* Prints where two id lists first differ. */
static void ids_diff(const char *what, const Ids *want, const Ids *got) {
  int i = 0;
  while (i < want->n && i < got->n && want->v[i] == got->v[i])
    i++;
  printf("  %s: %d ids wanted, %d got; first difference at %d (want %d, got %d)\n", what, want->n, got->n, i,
         i < want->n ? want->v[i] : -1, i < got->n ? got->v[i] : -1);
}

/* The text of a JSON string (it may hold NULs). */
static const char *json_text(const json_t *s, size_t *len) {
  *len = json_string_length(s);
  return json_string_value(s);
}

static uint64_t fnv1a64(const Ids *ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < ids->n; i++)
    for (int k = 0; k < 4; k++) {
      h ^= ((uint32_t)ids->v[i] >> (8 * k)) & 0xff;
      h *= 0x100000001b3ull;
    }
  return h;
}

/* The four decodes a golden holds: decode_{t,f}{s,k}, null where torchtune
 * raises. */
static void check_decodes(const Bpe *b, const json_t *g, const Ids *ids, const char *label) {
  static const char *keys[] = {"decode_ts", "decode_tk", "decode_fs", "decode_fk"};
  for (int k = 0; k < 4; k++) {
    const json_t *want = json_object_get(g, keys[k]);
    Buf out = {0};
    buf_puts(&out, "pre");
    capture_begin();
    int rc = bpe_decode(b, ids->v, ids->n, k < 2, k % 2 == 0, &out);
    const char *msg = capture_end();
    if (json_is_null(want)) {
      CHECK(rc == -1 && out.len == 3, "%s: %s must fail", label, keys[k]);
      CHECK(strstr(msg, "not in the vocabulary") != NULL, "%s: message '%s'", label, msg);
    } else {
      size_t n;
      const char *s = json_text(want, &n);
      CHECK(rc == 0 && out.len == n + 3 && memcmp(out.data + 3, s, n) == 0, "%s: %s is '%s', want '%s'", label,
            keys[k], out.data ? out.data + 3 : "", s);
    }
    buf_free(&out);
  }
}

/* ---- the goldens ---------------------------------------------------------------------- */

static void test_meta(const Bpe *b, const json_t *g) {
  CHECK(strcmp(json_string_value(json_object_get(g, "pattern")), LLAMA4_PATTERN) == 0,
        "LLAMA4_PATTERN is not torchtune's O200K_PATTERN");
  CHECK(bpe_base_vocab_size(b) == json_integer_value(json_object_get(g, "base_vocab_size")), "base_vocab_size");
  CHECK(bpe_vocab_size(b) == json_integer_value(json_object_get(g, "vocab_size")), "vocab_size");
  CHECK(json_integer_value(json_object_get(g, "bos_id")) == LLAMA4_BOS, "bos");
  CHECK(json_integer_value(json_object_get(g, "eos_id")) == LLAMA4_EOS, "eos");
  CHECK(json_integer_value(json_object_get(g, "pad_id")) == LLAMA4_PAD, "pad");
  const json_t *sp = json_object_get(g, "special_tokens");
  CHECK(json_object_size(sp) == LLAMA4_NUM_SPECIAL, "%zu special tokens", json_object_size(sp));
  const char *name;
  json_t *v;
  json_object_foreach((json_t *)sp, name, v) {
    int32_t id = (int32_t)json_integer_value(v);
    const char *mine = bpe_special_name(b, id);
    CHECK(mine && strcmp(mine, name) == 0, "special %d is '%s', want '%s'", id, mine ? mine : "(none)", name);
    CHECK(bpe_special_id(b, name) == id, "special id of '%s'", name);
    int len;
    const char *bytes = bpe_token_bytes(b, id, &len);
    CHECK(bytes && len == (int)strlen(name) && memcmp(bytes, name, (size_t)len) == 0, "bytes of %d", id);
  }
  struct {
    int32_t id;
    const char *name;
  } named[] = {{LLAMA4_HEADER_START, "<|header_start|>"}, {LLAMA4_HEADER_END, "<|header_end|>"},
               {LLAMA4_EOM, "<|eom|>"}, {LLAMA4_EOT, "<|eot|>"}, {LLAMA4_STEP, "<|step|>"},
               {LLAMA4_IMAGE, "<|image|>"}, {LLAMA4_PATCH, "<|patch|>"}, {LLAMA4_IMAGE_START, "<|image_start|>"},
               {LLAMA4_IMAGE_END, "<|image_end|>"}, {LLAMA4_TILE_X_SEPARATOR, "<|tile_x_separator|>"},
               {LLAMA4_TILE_Y_SEPARATOR, "<|tile_y_separator|>"},
               {LLAMA4_REASONING_START, "<|reasoning_thinking_start|>"},
               {LLAMA4_REASONING_END, "<|reasoning_thinking_end|>"}, {LLAMA4_FIM_PREFIX, "<|fim_prefix|>"},
               {LLAMA4_FIM_MIDDLE, "<|fim_middle|>"}, {LLAMA4_FIM_SUFFIX, "<|fim_suffix|>"}};
  for (size_t i = 0; i < ARRAY_LEN(named); i++)
    CHECK(json_integer_value(json_object_get(sp, named[i].name)) == named[i].id, "%s", named[i].name);
  CHECK(bpe_special_name(b, LLAMA4_FIRST_SPECIAL - 1) == NULL && bpe_special_name(b, LLAMA4_VOCAB) == NULL &&
            bpe_special_id(b, "<|nope|>") == -1,
        "outside the specials");
}

static void test_encode(const Bpe *b, const json_t *g) {
  size_t len;
  const char *text = json_text(json_object_get(g, "text"), &len);
  Ids want = {0}, got = {0};
  json_ids(json_object_get(g, "ids"), &want);
  int rc = bpe_encode(b, text, len, true, true, &got);
  if (!CHECK(rc == want.n && ids_equal(&want, &got), "encode '%s'", text))
    ids_diff("with bos/eos", &want, &got);
  json_ids(json_object_get(g, "ids_bare"), &want);
  got.n = 0;
  rc = bpe_encode(b, text, len, false, false, &got);
  if (!CHECK(rc == want.n && ids_equal(&want, &got), "encode bare '%s'", text))
    ids_diff("bare", &want, &got);
  json_ids(json_object_get(g, "ids"), &want);
  check_decodes(b, g, &want, text);
  ids_free(&want);
  ids_free(&got);
}

static void test_encode_long(const Bpe *b, const json_t *g) {
  const char *name = json_string_value(json_object_get(g, "name"));
  Buf text = {0};
  size_t i;
  json_t *seg;
  json_array_foreach(json_object_get(g, "segments"), i, seg) {
    size_t n;
    const char *s = json_text(json_array_get(seg, 0), &n);
    for (json_int_t k = json_integer_value(json_array_get(seg, 1)); k > 0; k--)
      buf_put(&text, s, n);
  }
  Ids got = {0}, head = {0}, tail = {0};
  int rc = bpe_encode(b, text.data, text.len, true, true, &got);
  json_ids(json_object_get(g, "head"), &head);
  json_ids(json_object_get(g, "tail"), &tail);
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a64(&got));
  CHECK(rc == got.n && got.n == json_integer_value(json_object_get(g, "n")), "%s: %d ids", name, got.n);
  CHECK(strcmp(hash, json_string_value(json_object_get(g, "ids_fnv1a64"))) == 0, "%s: hash", name);
  CHECK(got.n >= head.n && memcmp(got.v, head.v, sizeof(int32_t) * (size_t)head.n) == 0, "%s: head", name);
  CHECK(got.n >= tail.n && memcmp(got.v + got.n - tail.n, tail.v, sizeof(int32_t) * (size_t)tail.n) == 0,
        "%s: tail", name);
  Buf back = {0};
  rc = bpe_decode(b, got.v, got.n, true, true, &back);
  bool same = rc == 0 && back.len == text.len && memcmp(back.data, text.data, text.len) == 0;
  CHECK(same == json_is_true(json_object_get(g, "roundtrip")), "%s: round trip", name);
  buf_free(&back);
  buf_free(&text);
  ids_free(&got);
  ids_free(&head);
  ids_free(&tail);
}

static void test_decode(const Bpe *b, const json_t *g) {
  Ids ids = {0};
  json_ids(json_object_get(g, "ids"), &ids);
  char label[64];
  snprintf(label, sizeof label, "decode of %d ids from %d", ids.n, ids.n ? ids.v[0] : -1);
  check_decodes(b, g, &ids, label);
  ids_free(&ids);
}

static MaskingStrategy strategy_of(const char *s) {
  return strcmp(s, "train_on_all") == 0 ? TRAIN_ON_ALL : strcmp(s, "train_on_last") == 0 ? TRAIN_ON_LAST
                                                                                          : TRAIN_ON_ASSISTANT;
}

static void test_chat(const Bpe *b, const json_t *g) {
  const char *name = json_string_value(json_object_get(g, "name"));
  const json_t *msgs = json_object_get(g, "messages");
  int n = (int)json_array_size(msgs);
  ChatMessage *m = calloc((size_t)n + 1, sizeof(ChatMessage));
  ASSERT(m);
  for (int i = 0; i < n; i++) {
    const json_t *x = json_array_get(msgs, (size_t)i);
    m[i].role = json_string_value(json_object_get(x, "role"));
    m[i].content = json_string_value(json_object_get(x, "content"));
    m[i].eot = json_is_true(json_object_get(x, "eot"));
    m[i].masked = !json_is_true(json_object_get(x, "masked")); /* chat_mask_messages must set it */
  }
  chat_mask_messages(m, n, strategy_of(json_string_value(json_object_get(g, "strategy"))));
  for (int i = 0; i < n; i++)
    CHECK(m[i].masked == json_is_true(json_object_get(json_array_get(msgs, (size_t)i), "masked")),
          "%s: message %d masked", name, i);
  ChatOptions opt = {
      .max_seq_len = (int)json_integer_value(json_object_get(g, "max_seq_len")),
      .no_end_tokens = !json_is_true(json_object_get(g, "add_end_tokens")),
      .truncate_left = strcmp(json_string_value(json_object_get(g, "truncation_type")), "left") == 0,
  };
  ChatTokens out;
  int rc = llama4_tokenize_messages(b, m, n, &opt, &out);
  Ids want = {0}, got = {.v = out.tokens, .n = out.n};
  json_ids(json_object_get(g, "tokens"), &want);
  if (!CHECK(rc == 0 && ids_equal(&want, &got), "%s: tokens", name))
    ids_diff(name, &want, &got);
  const json_t *mask = json_object_get(g, "mask");
  bool mask_ok = (int)json_array_size(mask) == out.n;
  for (int i = 0; mask_ok && i < out.n; i++)
    mask_ok = out.mask[i] == json_is_true(json_array_get(mask, (size_t)i));
  CHECK(mask_ok, "%s: mask", name);
  chat_tokens_free(&out);
  ids_free(&want);
  free(m);
}

/* Appends the base64 of s[0..n) to out. */
static void put_b64(Buf *out, const unsigned char *s, size_t n) {
  static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t q = 0; q < n; q += 3) {
    uint32_t v = (uint32_t)s[q] << 16 | (q + 1 < n ? (uint32_t)s[q + 1] << 8 : 0) | (q + 2 < n ? s[q + 2] : 0);
    buf_printf(out, "%c%c%c%c", b64[v >> 18], b64[(v >> 12) & 63], q + 1 < n ? b64[(v >> 6) & 63] : '=',
               q + 2 < n ? b64[v & 63] : '=');
  }
}

/* A pieces golden, checked with a vocabulary of its text's substrings (every
 * one of 2+ bytes a token, as gen_golden.py made it), where each piece comes
 * back as one id: the ids spell the pre-tokenizer's split. */
static void test_pieces(const json_t *g) {
  size_t len;
  const char *text = json_text(json_object_get(g, "text"), &len);
  const unsigned char *s = (const unsigned char *)text;
  Buf vocab = {0};
  int rank = 0;
  for (int c = 0; c < 256; c++) {
    unsigned char x = (unsigned char)c;
    put_b64(&vocab, &x, 1);
    buf_printf(&vocab, " %d\n", rank++);
  }
  for (size_t i = 0; i < len; i++)
    for (size_t j = i + 2; j <= len; j++) {
      bool seen = false; /* the same bytes earlier in the text */
      for (size_t k = 0; k < i && !seen; k++)
        seen = memcmp(s + k, s + i, j - i) == 0;
      if (seen)
        continue;
      put_b64(&vocab, s + i, j - i);
      buf_printf(&vocab, " %d\n", rank++);
    }
  write_file(in_dir("pieces.tiktoken").s, vocab.data, vocab.len);
  buf_free(&vocab);
  Bpe *b = bpe_load(in_dir("pieces.tiktoken").s);
  if (!CHECK(b != NULL, "the pieces vocabulary of '%s' loads", text))
    return;
  Ids got = {0};
  bpe_encode(b, text, len, false, false, &got);
  const json_t *want = json_object_get(g, "pieces");
  bool ok = got.n == (int)json_array_size(want);
  for (int i = 0; ok && i < got.n; i++) {
    int plen;
    const char *p = bpe_token_bytes(b, got.v[i], &plen);
    size_t wlen;
    const char *w = json_text(json_array_get(want, (size_t)i), &wlen);
    ok = p && (size_t)plen == wlen && memcmp(p, w, wlen) == 0;
  }
  if (!CHECK(ok, "pieces of '%s'", text)) {
    printf("  got:");
    for (int i = 0; i < got.n; i++) {
      int plen;
      const char *p = bpe_token_bytes(b, got.v[i], &plen);
      printf(" [%.*s]", plen, p);
    }
    printf("\n");
  }
  ids_free(&got);
  bpe_free(b);
}

static void test_goldens(const Bpe *b, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    die(path);
  char *line = NULL;
  size_t cap = 0;
  int counts[6] = {0};
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    json_error_t err;
    json_t *g = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &err);
    if (!g) {
      printf("test_tokenizer: %s:%d: %s\n", path, err.line, err.text);
      exit(2);
    }
    const char *kind = json_string_value(json_object_get(g, "kind"));
    if (strcmp(kind, "meta") == 0)
      test_meta(b, g), counts[0]++;
    else if (strcmp(kind, "encode") == 0)
      test_encode(b, g), counts[1]++;
    else if (strcmp(kind, "encode_long") == 0)
      test_encode_long(b, g), counts[2]++;
    else if (strcmp(kind, "decode") == 0)
      test_decode(b, g), counts[3]++;
    else if (strcmp(kind, "chat") == 0)
      test_chat(b, g), counts[4]++;
    else if (strcmp(kind, "pieces") == 0)
      test_pieces(g), counts[5]++;
    else
      CHECK(false, "unknown golden kind '%s'", kind);
    json_decref(g);
  }
  free(line);
  fclose(f);
  printf("goldens: %d meta, %d encode, %d long, %d decode, %d chat, %d pieces\n", counts[0], counts[1], counts[2],
         counts[3], counts[4], counts[5]);
  CHECK(counts[0] == 1 && counts[1] >= 60 && counts[2] >= 1 && counts[3] >= 1 && counts[4] >= 10 && counts[5] >= 1,
        "golden file incomplete");
}

/* ---- errors ------------------------------------------------------------------------ */

/* A vocabulary of the 256 single bytes (ranks 0..255), then extra lines. */
static void write_vocab(const char *name, const char *extra) {
  Buf v = {0};
  for (int c = 0; c < 256; c++) {
    unsigned char x = (unsigned char)c;
    put_b64(&v, &x, 1);
    buf_printf(&v, " %d\n", c);
  }
  buf_puts(&v, extra);
  write_file(in_dir(name).s, v.data, v.len);
  buf_free(&v);
}

/* A load that must fail with `name:want` in its message (want: "line:col:
 * error: text"). */
static void load_fails(const char *name, const char *want) {
  capture_begin();
  Bpe *b = bpe_load(in_dir(name).s);
  const char *msg = capture_end();
  CHECK(b == NULL, "%s loaded", name);
  bpe_free(b);
  char full[512];
  snprintf(full, sizeof full, "%s:%s", in_dir(name).s, want);
  CHECK(strstr(msg, full) != NULL, "%s: message\n%s\nlacks '%s'", name, msg, full);
}

static void test_errors(const Bpe *model) {
  /* The 256 bytes are lines 1..256, so an extra line is line 257. */
  write_vocab("ok.tiktoken", "aGk= 256\r\n\nIGhp 257\n"); /* "hi", " hi" */
  Bpe *b = bpe_load(in_dir("ok.tiktoken").s);
  if (CHECK(b != NULL, "a vocabulary with \\r\\n and an empty line loads")) {
    Ids ids = {0};
    bpe_encode(b, "hi hi", 5, false, false, &ids);
    CHECK(ids.n == 2 && ids.v[0] == 256 && ids.v[1] == 257, "hi hi -> %d ids", ids.n);
    ids_free(&ids);
    bpe_free(b);
  }
  write_vocab("b64char.tiktoken", "aG*p 256\n");
  load_fails("b64char.tiktoken", "257:3: error: bad base64: unexpected character '*'");
  write_vocab("b64len.tiktoken", "aGk 256\n");
  load_fails("b64len.tiktoken", "257:1: error: bad base64: 3 characters");
  write_vocab("b64pad.tiktoken", "a=k= 256\n");
  load_fails("b64pad.tiktoken", "257:2: error: bad base64: unexpected character '='");
  write_vocab("norank.tiktoken", "aGk=\n");
  load_fails("norank.tiktoken", "257:5: error: missing rank");
  write_vocab("norank2.tiktoken", "aGk=   \n");
  load_fails("norank2.tiktoken", "257:8: error: missing rank");
  write_vocab("badrank.tiktoken", "aGk= 25x\n");
  load_fails("badrank.tiktoken", "257:8: error: the rank must be a decimal integer");
  write_vocab("negrank.tiktoken", "aGk= -1\n");
  load_fails("negrank.tiktoken", "257:6: error: the rank must be a decimal integer");
  write_vocab("extra.tiktoken", "aGk= 256 7\n");
  load_fails("extra.tiktoken", "257:10: error: unexpected text after the rank");
  write_vocab("blank.tiktoken", "  \n");
  load_fails("blank.tiktoken", "257:3: error: expected a base64 token and its rank");
  write_vocab("duptok.tiktoken", "aGk= 256\naGk= 257\n");
  load_fails("duptok.tiktoken", "258:1: error: duplicate token (rank 256 has the same bytes)");
  write_vocab("duprank.tiktoken", "aGk= 256\naGV5 256\n");
  load_fails("duprank.tiktoken", "258:6: error: rank 256 is given twice");
  CHECK(strstr(captured, ":257:6: note: rank 256 was first given here") != NULL, "duplicate rank note:\n%s",
        captured);
  write_vocab("gap.tiktoken", "aGk= 256\naGV5 258\n");
  load_fails("gap.tiktoken", "258:6: error: rank 258 is out of range: the 258 tokens");
  write_vocab("huge.tiktoken", "aGk= 300000\n");
  load_fails("huge.tiktoken", "257:6: error: rank 300000 is out of range");
  write_file(in_dir("empty.tiktoken").s, "", 0);
  load_fails("empty.tiktoken", "1:1: error: the vocabulary is empty");
  write_file(in_dir("newlines.tiktoken").s, "\n\n\r\n", 4);
  load_fails("newlines.tiktoken", "1:1: error: the vocabulary is empty");
  write_file(in_dir("nobytes.tiktoken").s, "aGk= 0\naGV5 1\n", 14);
  load_fails("nobytes.tiktoken", "1:1: error: the vocabulary has no token for the byte 0x00");
  Buf longline = {0};
  for (int i = 0; i < 5000; i++)
    buf_putc(&longline, 'A');
  buf_puts(&longline, " 256\n");
  write_vocab("longline.tiktoken", longline.data);
  buf_free(&longline);
  load_fails("longline.tiktoken", "257:1: error: line is 5004 bytes long");
  capture_begin();
  b = bpe_load(in_dir("missing.tiktoken").s);
  const char *msg = capture_end();
  CHECK(b == NULL && strstr(msg, "cannot open") != NULL, "a missing file: %s", msg);

  /* Text that is not UTF-8, and ids outside the vocabulary. */
  Ids ids = {0};
  ids_push(&ids, 7);
  capture_begin();
  int rc = bpe_encode(model, "ok \xff bad", 8, true, true, &ids);
  msg = capture_end();
  CHECK(rc == -1 && ids.n == 1 && strstr(msg, "byte 3 is 0xff") != NULL, "bad UTF-8: %d, %s", rc, msg);
  capture_begin();
  rc = bpe_encode(model, "\xed\xa0\x80", 3, false, false, &ids); /* a surrogate */
  capture_end();
  CHECK(rc == -1 && ids.n == 1, "a surrogate is not UTF-8");
  ChatMessage m[] = {{"user", "fine", false, true}, {"assistant", "bad \xc3", false, true}};
  ChatTokens ct;
  capture_begin();
  rc = llama4_tokenize_messages(model, m, 2, NULL, &ct);
  capture_end();
  CHECK(rc == -1 && ct.n == 0 && ct.tokens == NULL, "a chat with bad UTF-8");
  ids_free(&ids);
}

/* ---- speed ----------------------------------------------------------------------------- */

/* English-like text: words drawn by a fixed xorshift from a list weighted
 * toward the common ones, with punctuation, numbers and paragraphs. */
static void english(Buf *out, size_t bytes) {
  static const char *words[] = {
      "the", "of", "and", "to", "a", "in", "is", "that", "it", "was", "for", "on", "are", "with", "as", "his",
      "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what", "some", "we",
      "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each",
      "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write",
      "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more",
      "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know",
      "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "Tokenizer",
      "training", "optimizer", "gradient", "language", "model's", "don't", "it's", "understanding", "London",
      "September", "government", "information", "development", "international", "considering"};
  uint64_t s = 0x9e3779b97f4a7c15ull;
  int in_sentence = 0;
  while (out->len < bytes) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    size_t w = (size_t)((s >> 8) % ARRAY_LEN(words));
    w = (size_t)((s >> 40) % 4 == 0 ? w : w % 40);
    if (in_sentence == 0) {
      char cap[32];
      snprintf(cap, sizeof cap, "%s", words[w]);
      cap[0] = (char)(cap[0] >= 'a' && cap[0] <= 'z' ? cap[0] - 32 : cap[0]);
      buf_puts(out, cap);
    } else {
      buf_putc(out, ' ');
      buf_puts(out, words[w]);
    }
    if ((s >> 20) % 97 == 0)
      buf_printf(out, " %d", (int)((s >> 30) % 100000));
    in_sentence++;
    if (in_sentence > 6 && (s >> 50) % 8 == 0) {
      buf_puts(out, (s >> 12) % 5 == 0 ? "?" : (s >> 14) % 7 == 0 ? "!" : ".");
      buf_puts(out, (s >> 16) % 6 == 0 ? "\n\n" : " ");
      in_sentence = 0;
    } else if ((s >> 56) % 16 == 0) {
      buf_putc(out, ',');
    }
  }
}

static void test_speed(const Bpe *b) {
  Buf text = {0};
  english(&text, 4 << 20);
  Ids ids = {0};
  double best = 1e30;
  int nids = 0;
  for (int rep = 0; rep < 3; rep++) {
    ids.n = 0;
    double t0 = now_seconds();
    bpe_encode(b, text.data, text.len, false, false, &ids);
    best = MIN(best, now_seconds() - t0);
  }
  nids = ids.n;
  Buf back = {0};
  double t0 = now_seconds();
  bpe_decode(b, ids.v, ids.n, false, false, &back);
  double dec = now_seconds() - t0;
  CHECK(back.len == text.len && memcmp(back.data, text.data, text.len) == 0, "the speed text round-trips");
  buf_free(&back);
  /* As a data loader calls it: one document of about 2 KB at a time. */
  ids.n = 0;
  t0 = now_seconds();
  int ndocs = 0;
  for (size_t at = 0; at < text.len; ndocs++) {
    size_t n = MIN((size_t)2048, text.len - at);
    while (at + n < text.len && ((unsigned char)text.data[at + n] & 0xc0) == 0x80)
      n++;
    bpe_encode(b, text.data + at, n, true, true, &ids);
    at += n;
  }
  double docs = now_seconds() - t0;
  printf("speed: encode %.1f MB/s (%.1f MB of English-like text, %d ids, %.2f bytes per id); "
         "in %d 2 KB documents %.1f MB/s; decode %.1f MB/s; one thread\n",
         (double)text.len / best / 1e6, (double)text.len / 1e6, nids, (double)text.len / nids, ndocs,
         (double)text.len / docs / 1e6, (double)text.len / dec / 1e6);
  ids_free(&ids);
  buf_free(&text);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    printf("usage: test_tokenizer MODEL GOLDEN\n");
    return 2;
  }
  test_dir_make("test_tokenizer");
  Bpe *b = bpe_load(argv[1]);
  if (!b) {
    printf("test_tokenizer: cannot load %s\n", argv[1]);
    return 2;
  }
  test_goldens(b, argv[2]);
  test_errors(b);
  test_speed(b);
  bpe_free(b);
  test_dir_remove();
  printf("%s: %d checks, %d failed\n", nfailed ? "FAIL" : "PASS", nchecks, nfailed);
  return nfailed ? 1 : 0;
}
