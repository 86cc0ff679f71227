/* tokenizer.c: the Llama 4 tokenizer: tiktoken's vocabulary file, the O200K
 * pre-tokenizer through PCRE2, byte-pair merges by rank, torchtune's special
 * tokens, decode, and the Llama4Transform chat format. */
#include "tokenizer.h"

#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Copied from torchtune/models/llama4/_tokenizer.py (O200K_PATTERN). */
const char LLAMA4_PATTERN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|"
    "'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|"
    "'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* torchtune's TikTokenBaseTokenizer constants: text is encoded in slices of
 * this many characters, and runs of (non-)whitespace are cut at this length
 * (tiktoken issue 195: its merge is quadratic in a piece's length). */
enum { MAX_ENCODE_CHARS = 400000, MAX_NO_WHITESPACE_CHARS = 25000 };

/* The longest vocabulary line read; real vocabularies' lines are under 200. */
enum { MAX_LINE = 4096 };

/* Llama 4's special ids come after the ranks, so a vocabulary may not reach them. */
enum { MAX_RANKS = LLAMA4_FIRST_SPECIAL };

#define NO_RANK UINT32_MAX

struct Bpe {
  int n;              /* ranked tokens */
  uint32_t *off;      /* (n + 1): rank r's bytes are bytes[off[r] .. off[r+1]) */
  unsigned char *bytes;
  uint32_t *slot;     /* (mask + 1): rank + 1 of the token hashed there, 0 empty */
  uint32_t mask;
  uint32_t byte_rank[256];
  uint32_t *pair_rank; /* (65536): the rank of bytes a, b at [a << 8 | b], or NO_RANK */
  pcre2_code *re;
  char *special[LLAMA4_NUM_SPECIAL]; /* names, in one block at special[0] */
};

/* ---- the rank table ----------------------------------------------------------
 * Open addressing over the tokens' bytes, probed linearly. */

/* Eight bytes at a time, a short tail in at most two loads (which may
 * overlap: n is hashed too), then murmur3's finalizer, so that every input
 * bit reaches the low bits that index the table. */
static uint64_t hash_bytes(const unsigned char *s, size_t n) {
  const uint64_t m = 0xff51afd7ed558ccdull;
  uint64_t h = (uint64_t)n * 0x9e3779b97f4a7c15ull, w;
  for (; n >= 8; s += 8, n -= 8) {
    memcpy(&w, s, 8);
    h = (h ^ w) * m;
    h ^= h >> 32;
  }
  if (n >= 4) {
    uint32_t lo, hi;
    memcpy(&lo, s, 4);
    memcpy(&hi, s + n - 4, 4);
    h ^= (uint64_t)hi << 32 | lo;
  } else if (n) {
    h ^= (uint64_t)s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16;
  }
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  h *= m;
  return h ^ (h >> 33);
}

/* The slot holding s[0..n) (its value is then nonzero), or the empty slot
 * where it would go. */
static uint32_t *rank_slot(uint32_t *slot, uint32_t mask, const uint32_t *off, const unsigned char *bytes,
                           const unsigned char *s, size_t n) {
  for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
    uint32_t v = slot[i];
    if (!v)
      return &slot[i];
    uint32_t a = off[v - 1], e = off[v];
    if (e - a == n && memcmp(bytes + a, s, n) == 0)
      return &slot[i];
  }
}

static inline uint32_t rank_of(const Bpe *b, const unsigned char *s, size_t n) {
  if (n == 2)
    return b->pair_rank[s[0] << 8 | s[1]];
  uint32_t v = *rank_slot(b->slot, b->mask, b->off, b->bytes, s, n);
  return v ? v - 1 : NO_RANK;
}

/* ---- Llama 4's special tokens ---------------------------------------------------
 * torchtune's LLAMA4_SPECIAL_TOKENS: named ids, and ranges of reserved names
 * numbered from a first index (get_reserved_special_tokens). */

static const struct {
  int32_t id;
  const char *name;
} special_names[] = {
    {200000, "<|begin_of_text|>"},
    {200001, "<|end_of_text|>"},
    {200002, "<|fim_prefix|>"},
    {200003, "<|fim_middle|>"},
    {200004, "<|fim_suffix|>"},
    {200005, "<|header_start|>"},
    {200006, "<|header_end|>"},
    {200007, "<|eom|>"},
    {200008, "<|eot|>"},
    {200009, "<|step|>"},
    {200010, "<|text_post_train_reserved_special_token_0|>"},
    {200011, "<|text_post_train_reserved_special_token_1|>"},
    {200012, "<|text_post_train_reserved_special_token_2|>"},
    {200013, "<|text_post_train_reserved_special_token_3|>"},
    {200014, "<|text_post_train_reserved_special_token_4|>"},
    {200015, "<|text_post_train_reserved_special_token_5|>"},
    {200016, "<|text_post_train_reserved_special_token_6|>"},
    {200017, "<|text_post_train_reserved_special_token_7|>"},
    {200018, "<|finetune_right_pad|>"},
    {200080, "<|image_start|>"},
    {200081, "<|image_end|>"},
    {200082, "<|vision_reserved_special_token_0|>"},
    {200083, "<|vision_reserved_special_token_1|>"},
    {200084, "<|tile_x_separator|>"},
    {200085, "<|tile_y_separator|>"},
    {200086, "<|vision_reserved_special_token_2|>"},
    {200087, "<|vision_reserved_special_token_3|>"},
    {200088, "<|vision_reserved_special_token_4|>"},
    {200089, "<|vision_reserved_special_token_5|>"},
    {200090, "<|image|>"},
    {200091, "<|vision_reserved_special_token_6|>"},
    {200092, "<|patch|>"},
    {201134, "<|reasoning_reserved_special_token_0|>"},
    {201135, "<|reasoning_reserved_special_token_1|>"},
    {201136, "<|reasoning_reserved_special_token_2|>"},
    {201137, "<|reasoning_reserved_special_token_3|>"},
    {201138, "<|reasoning_reserved_special_token_4|>"},
    {201139, "<|reasoning_reserved_special_token_5|>"},
    {201140, "<|reasoning_reserved_special_token_6|>"},
    {201141, "<|reasoning_reserved_special_token_7|>"},
    {201142, "<|reasoning_thinking_start|>"},
    {201143, "<|reasoning_thinking_end|>"},
};

static const struct {
  int32_t first, end; /* ids [first, end) */
  const char *prefix; /* the name is <|{prefix}{start + id - first}|> */
  int start;
} special_ranges[] = {
    {200019, 200080, "text_post_train_reserved_special_token_", 8},
    {200093, 201134, "vision_reserved_special_token_", 7},
    {201144, 202048, "reserved_special_token_", 0},
};

static void specials_build(Bpe *b) {
  Buf names = {0};
  size_t at[LLAMA4_NUM_SPECIAL];
  for (int i = 0; i < LLAMA4_NUM_SPECIAL; i++)
    at[i] = SIZE_MAX;
  for (size_t i = 0; i < ARRAY_LEN(special_names); i++) {
    at[special_names[i].id - LLAMA4_FIRST_SPECIAL] = names.len;
    buf_puts(&names, special_names[i].name);
    buf_putc(&names, 0);
  }
  for (size_t r = 0; r < ARRAY_LEN(special_ranges); r++)
    for (int32_t id = special_ranges[r].first; id < special_ranges[r].end; id++) {
      at[id - LLAMA4_FIRST_SPECIAL] = names.len;
      buf_printf(&names, "<|%s%d|>", special_ranges[r].prefix, special_ranges[r].start + id - special_ranges[r].first);
      buf_putc(&names, 0);
    }
  for (int i = 0; i < LLAMA4_NUM_SPECIAL; i++) {
    ASSERT(at[i] != SIZE_MAX);
    b->special[i] = names.data + at[i];
  }
  ASSERT(b->special[0] == names.data);
}

const char *bpe_special_name(const Bpe *b, int32_t id) {
  if (id < LLAMA4_FIRST_SPECIAL || id >= LLAMA4_FIRST_SPECIAL + LLAMA4_NUM_SPECIAL)
    return NULL;
  return b->special[id - LLAMA4_FIRST_SPECIAL];
}

int32_t bpe_special_id(const Bpe *b, const char *name) {
  for (int i = 0; i < LLAMA4_NUM_SPECIAL; i++)
    if (strcmp(b->special[i], name) == 0)
      return LLAMA4_FIRST_SPECIAL + i;
  return -1;
}

/* ---- the pattern for PCRE2 ---------------------------------------------------
 * tiktoken matches LLAMA4_PATTERN with Rust's fancy-regex, where \s is
 * Unicode's White_Space property. PCRE2's \s (with PCRE2_UCP) also matches
 * U+180E, which White_Space lost in Unicode 6.3, so \s and \S are spelled out
 * as White_Space itself: inside a class its members, outside a class in
 * brackets of their own. */

#define WHITE_SPACE "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

static char *pattern_for_pcre2(void) {
  Buf b = {0};
  bool in_class = false;
  for (const char *p = LLAMA4_PATTERN; *p; p++) {
    if (p[0] == '\\' && (p[1] == 's' || p[1] == 'S')) {
      ASSERT(!(in_class && p[1] == 'S'));
      buf_puts(&b, in_class ? WHITE_SPACE : p[1] == 's' ? "[" WHITE_SPACE "]" : "[^" WHITE_SPACE "]");
      p++;
    } else if (p[0] == '\\') {
      buf_put(&b, p, 2);
      p++;
    } else {
      if (*p == '[')
        in_class = true;
      else if (*p == ']')
        in_class = false;
      buf_putc(&b, *p);
    }
  }
  return b.data;
}

static bool regex_compile(Bpe *b, const char *path) {
  char *pat = pattern_for_pcre2();
  int err;
  PCRE2_SIZE at;
  b->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
  free(pat);
  if (!b->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    error("%s: pcre2_compile of the Llama 4 pattern failed at offset %zu: %s", path, (size_t)at, (char *)msg);
    return false;
  }
  /* Without JIT (PCRE2 built without it, or no executable memory) the
   * interpreter gives the same matches, only slower. */
  (void)pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE);
  return true;
}

/* ---- reading the vocabulary ------------------------------------------------------ */

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

/* Decodes standard padded base64 s[0..n) onto out. Returns -1, or the offset
 * in s of the first character that is wrong (n when the length is). */
static long b64_decode(const char *s, size_t n, Buf *out) {
  size_t pad = 0;
  while (pad < 2 && pad < n && s[n - 1 - pad] == '=')
    pad++;
  for (size_t i = 0; i < n - pad; i++)
    if (b64_value((unsigned char)s[i]) < 0)
      return (long)i;
  if (n % 4 != 0 || n == 0)
    return (long)n;
  for (size_t i = 0; i < n; i += 4) {
    uint32_t v = 0;
    int k = 0;
    for (; k < 4 && i + (size_t)k < n - pad; k++)
      v |= (uint32_t)b64_value((unsigned char)s[i + (size_t)k]) << (18 - 6 * k);
    unsigned char o[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
    buf_put(out, o, k == 4 ? 3 : (size_t)k - 1);
  }
  return -1;
}

typedef struct {
  uint32_t off, len; /* the token's bytes in the pool */
  uint32_t rank;
  int line, rank_col; /* where the line is, and its rank in it (0-based) */
} Entry;

static SrcPos pos_at(const SrcFile *f, int line, size_t col0) { return (SrcPos){f, line, (int)col0 + 1}; }

/* Parses one line, s[0..n) without its newline, onto the entries. false
 * with an error printed. */
static bool parse_line(const SrcFile *f, int line, const char *s, size_t n, Buf *pool, Entry *e) {
  size_t i = 0;
  while (i < n && (s[i] == ' ' || s[i] == '\t'))
    i++;
  size_t t0 = i;
  while (i < n && s[i] != ' ' && s[i] != '\t')
    i++;
  size_t t1 = i;
  while (i < n && (s[i] == ' ' || s[i] == '\t'))
    i++;
  size_t r0 = i;
  while (i < n && s[i] != ' ' && s[i] != '\t')
    i++;
  size_t r1 = i;
  while (i < n && (s[i] == ' ' || s[i] == '\t'))
    i++;
  if (t0 == t1) {
    error_at(pos_at(f, line, t0), "expected a base64 token and its rank");
    return false;
  }
  if (r0 == r1) {
    error_at(pos_at(f, line, r0), "missing rank after the token");
    return false;
  }
  if (i < n) {
    error_at(pos_at(f, line, i), "unexpected text after the rank");
    return false;
  }
  e->off = (uint32_t)pool->len;
  long bad = b64_decode(s + t0, t1 - t0, pool);
  if (bad >= 0) {
    if ((size_t)bad == t1 - t0)
      error_at(pos_at(f, line, t0), "bad base64: %zu characters is not a whole number of 4-character groups",
               t1 - t0);
    else
      error_at(pos_at(f, line, t0 + (size_t)bad), "bad base64: unexpected character '%c'", s[t0 + (size_t)bad]);
    return false;
  }
  e->len = (uint32_t)(pool->len - e->off);
  uint64_t r = 0;
  for (size_t k = r0; k < r1; k++) {
    if (s[k] < '0' || s[k] > '9') {
      error_at(pos_at(f, line, k), "the rank must be a decimal integer");
      return false;
    }
    r = r * 10 + (uint64_t)(s[k] - '0');
    if (r >= MAX_RANKS) {
      error_at(pos_at(f, line, r0), "rank %.*s is out of range: ranks must be below %d, where Llama 4's "
               "special tokens begin", (int)(r1 - r0), s + r0, MAX_RANKS);
      return false;
    }
  }
  e->rank = (uint32_t)r;
  e->line = line;
  e->rank_col = (int)r0;
  return true;
}

/* Checks the entries (ranks dense and unique, tokens unique, every byte a
 * token) and builds the rank-ordered table into b. */
static bool build_table(Bpe *b, const SrcFile *f, const Entry *e, int n, const Buf *pool) {
  SrcFile whole = {f->name, NULL, 0}; /* for errors about the file, not a line */
  if (n == 0) {
    error_at(pos_at(&whole, 1, 0), "the vocabulary is empty");
    return false;
  }
  /* Unique ranks below n are exactly 0..n-1. */
  int *first = malloc(sizeof(int) * (size_t)n); /* the entry that gave each rank, or -1 */
  ASSERT(first);
  for (int r = 0; r < n; r++)
    first[r] = -1;
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    if (e[i].rank >= (uint32_t)n) {
      error_at(pos_at(f, e[i].line, (size_t)e[i].rank_col),
               "rank %u is out of range: the %d tokens of this file must have the ranks 0..%d, each once", e[i].rank,
               n, n - 1);
      ok = false;
    } else if (first[e[i].rank] >= 0) {
      const Entry *p = &e[first[e[i].rank]];
      error_at(pos_at(f, e[i].line, (size_t)e[i].rank_col), "rank %u is given twice", e[i].rank);
      note_at(pos_at(f, p->line, (size_t)p->rank_col), "rank %u was first given here", e[i].rank);
      ok = false;
    } else {
      first[e[i].rank] = i;
    }
  }
  free(first);
  if (!ok)
    return false;

  b->n = n;
  b->off = malloc(sizeof(uint32_t) * ((size_t)n + 1));
  b->bytes = malloc(pool->len + 1);
  ASSERT(b->off && b->bytes);
  uint32_t *len = calloc((size_t)n, sizeof(uint32_t));
  ASSERT(len);
  for (int i = 0; i < n; i++)
    len[e[i].rank] = e[i].len;
  b->off[0] = 0;
  for (int r = 0; r < n; r++)
    b->off[r + 1] = b->off[r] + len[r];
  for (int i = 0; i < n; i++)
    memcpy(b->bytes + b->off[e[i].rank], pool->data + e[i].off, e[i].len);
  free(len);

  uint32_t cap = 16;
  while (cap < 2 * (uint32_t)n)
    cap *= 2;
  b->mask = cap - 1;
  b->slot = calloc(cap, sizeof(uint32_t));
  ASSERT(b->slot);
  for (int i = 0; i < n; i++) {
    uint32_t r = e[i].rank;
    uint32_t *s = rank_slot(b->slot, b->mask, b->off, b->bytes, b->bytes + b->off[r], b->off[r + 1] - b->off[r]);
    if (*s) {
      error_at(pos_at(f, e[i].line, 0), "duplicate token (rank %u has the same bytes)", *s - 1);
      for (int k = 0; k < n; k++)
        if (e[k].rank == *s - 1)
          note_at(pos_at(f, e[k].line, 0), "rank %u is given here", *s - 1);
      return false;
    }
    *s = r + 1;
  }
  /* Most lookups are of two bytes: the merges start from byte pairs. */
  b->pair_rank = malloc(sizeof(uint32_t) * 65536);
  ASSERT(b->pair_rank);
  for (int c = 0; c < 65536; c++) {
    unsigned char two[2] = {(unsigned char)(c >> 8), (unsigned char)c};
    uint32_t v = *rank_slot(b->slot, b->mask, b->off, b->bytes, two, 2);
    b->pair_rank[c] = v ? v - 1 : NO_RANK;
  }
  for (int c = 0; c < 256; c++) {
    unsigned char byte = (unsigned char)c;
    b->byte_rank[c] = rank_of(b, &byte, 1);
    if (b->byte_rank[c] == NO_RANK) {
      error_at(pos_at(&whole, 1, 0), "the vocabulary has no token for the byte 0x%02x: a byte-level BPE needs "
               "all 256", c);
      return false;
    }
  }
  return true;
}

Bpe *bpe_load(const char *path) {
  size_t len;
  char *text = file_read(path, &len);
  if (!text)
    return NULL;
  SrcFile f = {path, text, len};
  /* A line too long to show is reported without its text. */
  SrcFile f_bare = {path, NULL, 0};
  Bpe *b = calloc(1, sizeof(Bpe));
  ASSERT(b);
  int cap = 1024, n = 0;
  Entry *e = malloc(sizeof(Entry) * (size_t)cap);
  ASSERT(e);
  Buf pool = {0};
  bool ok = true;
  int line = 1;
  for (size_t at = 0; at < len && ok; line++) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t end = nl ? (size_t)(nl - text) : len, next = nl ? end + 1 : len;
    if (end - at > MAX_LINE) {
      error_at(pos_at(&f_bare, line, 0), "line is %zu bytes long; a vocabulary line holds at most %d", end - at,
               MAX_LINE);
      ok = false;
      break;
    }
    if (end > at && text[end - 1] == '\r')
      end--;
    if (end > at) {
      if (n == MAX_RANKS) {
        error_at(pos_at(&f, line, 0), "more than %d tokens: Llama 4's special tokens begin at id %d", MAX_RANKS,
                 MAX_RANKS);
        ok = false;
        break;
      }
      if (n == cap) {
        cap *= 2;
        e = realloc(e, sizeof(Entry) * (size_t)cap);
        ASSERT(e);
      }
      ok = parse_line(&f, line, text + at, end - at, &pool, &e[n++]);
    }
    at = next;
  }
  ok = ok && build_table(b, &f, e, n, &pool) && regex_compile(b, path);
  free(e);
  buf_free(&pool);
  free(text);
  if (!ok) {
    bpe_free(b);
    return NULL;
  }
  specials_build(b);
  return b;
}

void bpe_free(Bpe *b) {
  if (!b)
    return;
  free(b->off);
  free(b->bytes);
  free(b->slot);
  free(b->pair_rank);
  free(b->special[0]);
  pcre2_code_free(b->re);
  free(b);
}

int bpe_base_vocab_size(const Bpe *b) { return b->n; }

int bpe_vocab_size(const Bpe *b) {
  (void)b;
  return LLAMA4_VOCAB;
}

const char *bpe_token_bytes(const Bpe *b, int32_t id, int *len) {
  if (id >= 0 && id < b->n) {
    *len = (int)(b->off[id + 1] - b->off[id]);
    return (const char *)b->bytes + b->off[id];
  }
  const char *s = bpe_special_name(b, id);
  if (s)
    *len = (int)strlen(s);
  return s;
}

/* ---- ids -------------------------------------------------------------------------- */

static void ids_reserve(Ids *ids, int extra) {
  if (ids->n + extra <= ids->cap)
    return;
  int cap = ids->cap ? ids->cap : 64;
  while (cap < ids->n + extra)
    cap *= 2;
  ids->v = realloc(ids->v, sizeof(int32_t) * (size_t)cap);
  ASSERT(ids->v);
  ids->cap = cap;
}

void ids_push(Ids *ids, int32_t id) {
  ids_reserve(ids, 1);
  ids->v[ids->n++] = id;
}

void ids_free(Ids *ids) {
  free(ids->v);
  *ids = (Ids){0};
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

/* The length of the well-formed sequence at s[0..n) (n >= 1), or 0 when it
 * is not one, with its code point in *cp. */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned char c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf)
    len = 2;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else
    return 0;
  if (n < len || s[1] < lo || s[1] > hi)
    return 0;
  uint32_t v = c & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if (i > 1 && (s[i] & 0xc0) != 0x80)
      return 0;
    v = v << 6 | (s[i] & 0x3f);
  }
  *cp = v;
  return len;
}

/* The offset of the first byte of s[0..n) that does not start a well-formed
 * sequence, or n. */
static size_t utf8_check(const unsigned char *s, size_t n) {
  uint32_t cp;
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    size_t l = utf8_seq(s + i, n - i, &cp);
    if (!l)
      return i;
    i += l;
  }
  return n;
}

/* Python's str.isspace: bidirectional class WS, B or S, or category Zs. */
static bool py_isspace(uint32_t c) {
  if (c < 0x80)
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
  return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Appends s[0..n) decoded as Python's bytes.decode("utf-8", "replace") does:
 * each maximal prefix of a well-formed sequence that cannot be completed, and
 * each byte that starts none, becomes one U+FFFD. */
static void utf8_replace(const unsigned char *s, size_t n, Buf *out) {
  size_t i = 0;
  while (i < n) {
    size_t run = i;
    while (run < n && s[run] < 0x80)
      run++;
    buf_put(out, s + i, run - i);
    if ((i = run) >= n)
      break;
    uint32_t cp;
    size_t l = utf8_seq(s + i, n - i, &cp);
    if (l) {
      buf_put(out, s + i, l);
      i += l;
      continue;
    }
    /* How many bytes form a valid prefix: the lead byte, then continuation
     * bytes while they are in range. */
    unsigned char c = s[i];
    size_t need = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 1;
    size_t k = 1;
    if (need > 1 && k < n - i) {
      unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
      unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
      if (s[i + 1] >= lo && s[i + 1] <= hi) {
        k = 2;
        while (k < need && k < n - i && (s[i + k] & 0xc0) == 0x80)
          k++;
      }
    }
    buf_puts(out, "\xef\xbf\xbd");
    i += k;
  }
}

/* ---- byte-pair merges ----------------------------------------------------------------------
 * tiktoken's _byte_pair_merge: parts start as single bytes; repeatedly the
 * adjacent pair whose joined bytes have the lowest rank is joined, the
 * leftmost such pair on a tie; stop when no adjacent pair is a token. Short
 * pieces use tiktoken's own arrays (quadratic, but tiny); long ones a heap
 * keyed by (rank, offset), which picks the same pair each time. */

enum { SMALL_PIECE = 128 };

typedef struct {
  uint32_t rank, node, version; /* node: the left part's first byte */
} HeapItem;

/* What one encode call owns: the match data and scratch for long pieces. */
typedef struct {
  const Bpe *b;
  Ids *out;
  pcre2_match_data *md;
  uint32_t *next, *prev, *tok, *rank, *version; /* (cap) */
  HeapItem *heap;                               /* (2 cap) */
  size_t cap;
} Encoder;

static void merge_small(const Bpe *b, const unsigned char *p, int n, Ids *out) {
  uint32_t start[SMALL_PIECE + 1], tok[SMALL_PIECE], rank[SMALL_PIECE];
  for (int i = 0; i < n; i++) {
    start[i] = (uint32_t)i;
    tok[i] = b->byte_rank[p[i]];
    rank[i] = i + 1 < n ? rank_of(b, p + i, 2) : NO_RANK;
  }
  start[n] = (uint32_t)n;
  int m = n; /* parts; rank[i] joins part i and i + 1 */
  for (;;) {
    uint32_t best = NO_RANK;
    int at = -1;
    for (int i = 0; i + 1 < m; i++)
      if (rank[i] < best)
        best = rank[i], at = i;
    if (at < 0)
      break;
    tok[at] = best;
    memmove(&start[at + 1], &start[at + 2], sizeof(uint32_t) * (size_t)(m - at - 1));
    memmove(&tok[at + 1], &tok[at + 2], sizeof(uint32_t) * (size_t)(m - at - 2));
    memmove(&rank[at + 1], &rank[at + 2], sizeof(uint32_t) * (size_t)(m - at - 2));
    m--;
    rank[at] = at + 1 < m ? rank_of(b, p + start[at], start[at + 2] - start[at]) : NO_RANK;
    if (at > 0)
      rank[at - 1] = rank_of(b, p + start[at - 1], start[at + 1] - start[at - 1]);
  }
  ids_reserve(out, m);
  for (int i = 0; i < m; i++)
    out->v[out->n++] = (int32_t)tok[i];
}

static bool heap_less(HeapItem a, HeapItem b) { return a.rank < b.rank || (a.rank == b.rank && a.node < b.node); }

static void heap_push(HeapItem *h, size_t *n, HeapItem x) {
  size_t i = (*n)++;
  while (i > 0 && heap_less(x, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = x;
}

static HeapItem heap_pop(HeapItem *h, size_t *n) {
  HeapItem top = h[0], x = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n)
      break;
    if (c + 1 < *n && heap_less(h[c + 1], h[c]))
      c++;
    if (!heap_less(h[c], x))
      break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
  return top;
}

static void *grow_array(void *p, size_t n, size_t elt) {
  p = realloc(p, n * elt);
  ASSERT(p);
  return p;
}

/* Parts are nodes of a list: node i starts at byte i (a joined part keeps
 * its left node) and is followed by next[i] (n: none); rank[i] joins it with
 * its successor, and version[i] counts its changes, so that stale heap
 * entries are skipped. */
static void merge_large(Encoder *e, const unsigned char *p, uint32_t n) {
  const Bpe *b = e->b;
  if (e->cap < n) {
    e->cap = n;
    e->next = grow_array(e->next, n, sizeof(uint32_t));
    e->prev = grow_array(e->prev, n, sizeof(uint32_t));
    e->tok = grow_array(e->tok, n, sizeof(uint32_t));
    e->rank = grow_array(e->rank, n, sizeof(uint32_t));
    e->version = grow_array(e->version, n, sizeof(uint32_t));
    e->heap = grow_array(e->heap, 2 * (size_t)n, sizeof(HeapItem));
  }
  uint32_t *next = e->next, *prev = e->prev, *tok = e->tok, *rank = e->rank, *ver = e->version;
  size_t nh = 0;
  for (uint32_t i = 0; i < n; i++) {
    next[i] = i + 1;
    prev[i] = i - 1; /* UINT32_MAX for node 0 */
    tok[i] = b->byte_rank[p[i]];
    ver[i] = 0;
    rank[i] = i + 1 < n ? rank_of(b, p + i, 2) : NO_RANK;
    if (rank[i] != NO_RANK)
      heap_push(e->heap, &nh, (HeapItem){rank[i], i, 0});
  }
  while (nh) {
    HeapItem h = heap_pop(e->heap, &nh);
    uint32_t i = h.node;
    if (ver[i] != h.version || rank[i] != h.rank)
      continue;
    uint32_t j = next[i];
    tok[i] = h.rank;
    next[i] = next[j];
    if (next[j] < n)
      prev[next[j]] = i;
    ver[j] = UINT32_MAX; /* j is gone: its entries never match again */
    /* The pairs (i, next) and (prev, i) changed. */
    uint32_t pair[2] = {prev[i], i};
    for (int k = 0; k < 2; k++) {
      uint32_t q = pair[k];
      if (q == UINT32_MAX)
        continue;
      uint32_t r = next[q];
      ver[q]++;
      rank[q] = r < n ? rank_of(b, p + q, (next[r] < n ? next[r] : n) - q) : NO_RANK;
      if (rank[q] != NO_RANK)
        heap_push(e->heap, &nh, (HeapItem){rank[q], q, ver[q]});
    }
  }
  ids_reserve(e->out, (int)n);
  for (uint32_t i = 0; i < n; i = next[i])
    e->out->v[e->out->n++] = (int32_t)tok[i];
}

/* One regex match: the piece's own rank when it is a token, else its merges. */
static void encode_piece(Encoder *e, const unsigned char *p, size_t n) {
  uint32_t r = rank_of(e->b, p, n);
  if (r != NO_RANK)
    ids_push(e->out, (int32_t)r);
  else if (n <= SMALL_PIECE)
    merge_small(e->b, p, (int)n, e->out);
  else
    merge_large(e, p, (uint32_t)n);
}

/* tiktoken's encode of one slice (valid UTF-8): every match of the pattern
 * in turn, each encoded alone. Text the pattern skipped would be dropped, as
 * tiktoken drops it; but every character matches some alternative. */
static bool encode_slice(Encoder *e, const unsigned char *s, size_t n) {
  size_t off = 0;
  while (off < n) {
    int rc = pcre2_match(e->b->re, s, n, off, PCRE2_NO_UTF_CHECK, e->md, NULL);
    /* The JIT's stack is the machine's, 32 KiB; the interpreter's is the heap. */
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(e->b->re, s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      error("pcre2_match failed at byte %zu of the text: %s", off, (char *)msg);
      return false;
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    if (ov[1] == ov[0]) { /* an empty match: not in this pattern, but step on */
      off = ov[1] + 1;
      while (off < n && (s[off] & 0xc0) == 0x80)
        off++;
      continue;
    }
    encode_piece(e, s + ov[0], ov[1] - ov[0]);
    off = ov[1];
  }
  return true;
}

/* torchtune's slicing: 400,000 characters at a time, each slice cut where a
 * run of whitespace or of non-whitespace passes 25,000 characters
 * (_split_long_repetitions). */
static bool encode_text(Encoder *e, const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t slice = i;
    bool space = false;
    long run = 0;
    for (long chars = 0; i < n && chars < MAX_ENCODE_CHARS; chars++) {
      uint32_t c = s[i];
      size_t l = c < 0x80 ? 1 : utf8_seq(s + i, n - i, &c);
      bool sp = py_isspace(c);
      if (chars == 0)
        space = sp;
      if (sp != space) {
        run = 1;
        space = sp;
      } else if (++run > MAX_NO_WHITESPACE_CHARS) {
        if (!encode_slice(e, s + slice, i - slice))
          return false;
        slice = i;
        run = 1;
      }
      i += l;
    }
    if (!encode_slice(e, s + slice, i - slice))
      return false;
  }
  return true;
}

int bpe_encode(const Bpe *b, const char *text, size_t len, bool add_bos, bool add_eos, Ids *out) {
  if (len == 0)
    return 0;
  const unsigned char *s = (const unsigned char *)text;
  size_t bad = utf8_check(s, len);
  if (bad != len) {
    error("cannot encode text that is not UTF-8: byte %zu is 0x%02x", bad, s[bad]);
    return -1;
  }
  int n0 = out->n;
  Encoder e = {.b = b, .out = out, .md = pcre2_match_data_create_from_pattern(b->re, NULL)};
  ASSERT(e.md);
  if (add_bos)
    ids_push(out, LLAMA4_BOS);
  bool ok = encode_text(&e, s, len);
  if (ok && add_eos)
    ids_push(out, LLAMA4_EOS);
  pcre2_match_data_free(e.md);
  free(e.next);
  free(e.prev);
  free(e.tok);
  free(e.rank);
  free(e.version);
  free(e.heap);
  if (!ok) {
    out->n = n0;
    return -1;
  }
  return out->n - n0;
}

/* ---- decode ------------------------------------------------------------------------------ */

static bool starts_with(const char *s, size_t n, const char *lit, size_t k) { return n >= k && memcmp(s, lit, k) == 0; }

/* Where a match of `<|...|>` (Python's <\|.*?\|>: no newline inside) that
 * starts at s[0] ends, or 0 when none does. */
static size_t special_match(const char *s, size_t n) {
  if (!starts_with(s, n, "<|", 2))
    return 0;
  for (size_t j = 2; j < n && s[j] != '\n'; j++)
    if (j + 1 < n && s[j] == '|' && s[j + 1] == '>')
      return j + 2;
  return 0;
}

/* The same for <\|header_start\|>.*?<\|header_end\|>\n\n. */
static size_t header_match(const char *s, size_t n) {
  static const char start[] = "<|header_start|>", end[] = "<|header_end|>\n\n";
  if (!starts_with(s, n, start, sizeof start - 1))
    return 0;
  for (size_t j = sizeof start - 1; j < n; j++) {
    if (starts_with(s + j, n - j, end, sizeof end - 1))
      return j + sizeof end - 1;
    if (s[j] == '\n')
      return 0;
  }
  return 0;
}

/* re.sub(pattern, "", s) for a matcher of the above kind. */
static void remove_matches(const char *s, size_t n, size_t (*match)(const char *, size_t), Buf *out) {
  size_t i = 0;
  while (i < n) {
    size_t m = s[i] == '<' ? match(s + i, n - i) : 0;
    if (m) {
      i += m;
      continue;
    }
    const char *lt = memchr(s + i + 1, '<', n - i - 1);
    size_t to = lt ? (size_t)(lt - s) : n;
    buf_put(out, s + i, to - i);
    i = to;
  }
}

int bpe_decode(const Bpe *b, const int32_t *ids, int n, bool truncate_at_eos, bool skip_special, Buf *out) {
  /* torchtune: k = ids.index(eos); `if k:` truncates, so an eos at ids[0]
   * keeps everything, later eos included. */
  if (truncate_at_eos) {
    int k = 0;
    while (k < n && ids[k] != LLAMA4_EOS)
      k++;
    if (k > 0 && k < n)
      n = k;
  }
  Buf raw = {0}, text = {0};
  for (int i = 0; i < n; i++) {
    int len;
    const char *s = bpe_token_bytes(b, ids[i], &len);
    if (!s) {
      error("cannot decode token id %d: it is not in the vocabulary (ranks 0..%d, special ids %d..%d)", ids[i],
            b->n - 1, LLAMA4_FIRST_SPECIAL, LLAMA4_VOCAB - 1);
      buf_free(&raw);
      return -1;
    }
    buf_put(&raw, s, (size_t)len);
  }
  utf8_replace((const unsigned char *)raw.data, raw.len, &text);
  buf_free(&raw);
  if (skip_special) {
    Buf t2 = {0};
    remove_matches(text.data, text.len, header_match, &t2);
    remove_matches(t2.data, t2.len, special_match, out);
    buf_free(&t2);
  } else if (text.len) {
    buf_put(out, text.data, text.len);
  }
  buf_free(&text);
  return 0;
}

/* ---- the chat format ----------------------------------------------------------------------- */

void chat_mask_messages(ChatMessage *m, int n, MaskingStrategy s) {
  bool marked_last = false;
  for (int i = n - 1; i >= 0; i--) {
    bool assistant = strcmp(m[i].role, "assistant") == 0;
    if (strcmp(m[i].role, "system") == 0)
      m[i].masked = true;
    else if (s == TRAIN_ON_LAST) {
      m[i].masked = !(assistant && !marked_last);
      marked_last |= assistant;
    } else if (s == TRAIN_ON_ALL)
      m[i].masked = false; /* torchtune: role == "user" and contains_media */
    else
      m[i].masked = !assistant;
  }
}

/* Python's str.strip() of the UTF-8 text s: the bounds of what remains. */
static void py_strip(const char *s, size_t *lo, size_t *hi) {
  const unsigned char *u = (const unsigned char *)s;
  size_t a = *lo, e = *hi;
  while (a < e) {
    uint32_t c = u[a];
    size_t l = c < 0x80 ? 1 : utf8_seq(u + a, e - a, &c);
    if (!l || !py_isspace(c))
      break;
    a += l;
  }
  while (e > a) {
    size_t k = e - 1;
    while (k > a && (u[k] & 0xc0) == 0x80)
      k--;
    uint32_t c = u[k];
    size_t l = c < 0x80 ? 1 : utf8_seq(u + k, e - k, &c);
    if (l != e - k || !py_isspace(c))
      break;
    e = k;
  }
  *lo = a;
  *hi = e;
}

static int encode_stripped(const Bpe *b, const char *s, Ids *out) {
  size_t lo = 0, hi = strlen(s);
  py_strip(s, &lo, &hi);
  return bpe_encode(b, s + lo, hi - lo, false, false, out);
}

/* torchtune's truncate(), less its last step (making the last item eos),
 * which the caller does: keeps the first max items, or the last when left. */
static void truncate_ids(Ids *t, int max, bool left) {
  if (t->n <= max)
    return;
  if (left)
    memmove(t->v, t->v + (t->n - max), sizeof(int32_t) * (size_t)max);
  t->n = max;
}

int llama4_tokenize_messages(const Bpe *b, const ChatMessage *m, int n, const ChatOptions *opt,
                             ChatTokens *out) {
  static const ChatOptions defaults = {0};
  if (!opt)
    opt = &defaults;
  ASSERT(opt->max_seq_len >= 0);
  *out = (ChatTokens){0};
  bool add_end = !opt->no_end_tokens;
  Ids tok = {0}, mask = {0}, nl = {0}; /* mask: 0 or 1 per token, as ids */
  bool ok = bpe_encode(b, "\n\n", 2, false, false, &nl) >= 0;
  ids_push(&tok, LLAMA4_BOS);
  ids_push(&mask, 1);
  for (int i = 0; i < n && ok; i++) {
    int n0 = tok.n;
    ids_push(&tok, LLAMA4_HEADER_START);
    ok = encode_stripped(b, m[i].role, &tok) >= 0;
    ids_push(&tok, LLAMA4_HEADER_END);
    for (int k = 0; k < nl.n; k++)
      ids_push(&tok, nl.v[k]);
    ok = ok && encode_stripped(b, m[i].content, &tok) >= 0;
    if (add_end || i < n - 1)
      ids_push(&tok, m[i].eot ? LLAMA4_EOT : LLAMA4_EOM);
    for (int k = n0; k < tok.n; k++)
      ids_push(&mask, m[i].masked);
    if (opt->max_seq_len && tok.n >= opt->max_seq_len)
      break;
  }
  ids_free(&nl);
  if (!ok) {
    ids_free(&tok);
    ids_free(&mask);
    return -1;
  }
  if (add_end) {
    ids_push(&tok, LLAMA4_EOS);
    ids_push(&mask, 1);
  }
  if (opt->max_seq_len) {
    truncate_ids(&tok, opt->max_seq_len, opt->truncate_left);
    truncate_ids(&mask, opt->max_seq_len, opt->truncate_left);
    if (add_end && tok.n) {
      tok.v[tok.n - 1] = LLAMA4_EOS;
      mask.v[mask.n - 1] = 1;
    }
  }
  ASSERT(tok.n == mask.n);
  out->n = tok.n;
  out->tokens = tok.v;
  out->mask = malloc(sizeof(bool) * (size_t)(tok.n ? tok.n : 1));
  ASSERT(out->mask);
  for (int i = 0; i < tok.n; i++)
    out->mask[i] = mask.v[i] != 0;
  ids_free(&mask);
  return 0;
}

void chat_tokens_free(ChatTokens *t) {
  free(t->tokens);
  free(t->mask);
  *t = (ChatTokens){0};
}
