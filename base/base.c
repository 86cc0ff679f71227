/* base.c: element types, arenas, buffers, diagnostics, files and small helpers. */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- element types ------------------------------------------------------------ */

const char *const type_names[NUM_TYPES] = {"void", "bool", "i32", "i64", "f16", "bf16", "f32", "f64", "u8", "u4"};

int type_size(Type t) {
  static const int size[NUM_TYPES] = {0, 1, 4, 8, 2, 2, 4, 8, 1, 1};
  return size[t];
}

int type_bits(Type t) { return t == TY_U4 ? 4 : 8 * type_size(t); }

bool type_is_float(Type t) { return t == TY_F16 || t == TY_BF16 || t == TY_F32 || t == TY_F64; }
bool type_is_int(Type t) { return t == TY_I32 || t == TY_I64; }
bool type_is_code(Type t) { return t == TY_U8 || t == TY_U4; }

bool type_from_name(const char *s, size_t n, Type *out) {
  for (int t = TY_BOOL; t < NUM_TYPES; t++)
    if (strlen(type_names[t]) == n && memcmp(type_names[t], s, n) == 0)
      return *out = (Type)t, true;
  return false;
}

/* ---- arenas --------------------------------------------------------------- */

typedef struct Block {
  struct Block *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
} Block;

struct Arena {
  Block *head;
};

enum { BLOCK_SIZE = 64 * 1024 };

Arena *arena_new(void) {
  Arena *a = calloc(1, sizeof(Arena));
  ASSERT(a);
  return a;
}

void arena_free(Arena *a) {
  if (!a)
    return;
  for (Block *b = a->head, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  free(a);
}

void *arena_alloc(Arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  Block *b = a->head;
  if (!b || b->size - b->used < n) {
    size_t size = n > BLOCK_SIZE / 4 ? n : BLOCK_SIZE;
    Block *nb = malloc(sizeof(Block) + size);
    ASSERT(nb);
    nb->used = 0;
    nb->size = size;
    /* A big block goes behind the current one, so the current one keeps
     * serving small requests. */
    if (b && size != BLOCK_SIZE) {
      nb->next = b->next;
      b->next = nb;
    } else {
      nb->next = b;
      a->head = nb;
    }
    b = nb;
  }
  void *p = b->data + b->used;
  b->used += n;
  memset(p, 0, n);
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc(a, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

void arena_grow(Arena *a, void **p, int *cap, int n, size_t elt) {
  if (n <= *cap)
    return;
  int ncap = *cap ? *cap : 16;
  while (ncap < n)
    ncap *= 2;
  void *np = arena_alloc(a, (size_t)ncap * elt);
  if (*p)
    memcpy(np, *p, (size_t)*cap * elt);
  *p = np;
  *cap = ncap;
}

/* ---- buffers -------------------------------------------------------------- */

void buf_reserve(Buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap)
    return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1)
    cap *= 2;
  b->data = realloc(b->data, cap);
  ASSERT(b->data);
  b->cap = cap;
}

void buf_put(Buf *b, const void *p, size_t n) {
  buf_reserve(b, n);
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
}

void buf_puts(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

void buf_putc(Buf *b, char c) { buf_put(b, &c, 1); }

void buf_vprintf(Buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  buf_reserve(b, (size_t)n);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void buf_printf(Buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void buf_free(Buf *b) {
  free(b->data);
  *b = (Buf){0};
}

/* ---- diagnostics ---------------------------------------------------------- */

SrcPos srcpos_of(const SrcFile *f, size_t off) {
  SrcPos p = {f, 1, 1};
  if (!f->text)
    return p;
  for (size_t i = 0; i < off && i < f->len; i++) {
    if (f->text[i] == '\n') {
      p.line++;
      p.col = 1;
    } else {
      p.col++;
    }
  }
  return p;
}

/* Where diagnostics go: stderr, or this thread's capture buffer. */
static _Thread_local Buf *capture;

void diag_capture(Buf *b) { capture = b; }

void diag_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (capture)
    buf_vprintf(capture, fmt, ap);
  else
    vfprintf(stderr, fmt, ap);
  va_end(ap);
}

/* Prints the source line of pos and a caret under its column. Tabs are kept
 * in the caret line, so that the caret lines up in a terminal. */
static void print_source_line(SrcPos pos) {
  const char *t = pos.file->text;
  if (!t || pos.line < 1)
    return;
  const char *end = t + pos.file->len;
  const char *s = t;
  for (int l = 1; l < pos.line && s < end; s++)
    if (*s == '\n')
      l++;
  if (s >= end && pos.line > 1 && s > t && s[-1] == '\n')
    return;
  const char *e = s;
  while (e < end && *e != '\n')
    e++;
  diag_printf("  %.*s\n  ", (int)(e - s), s);
  for (int i = 1; i < pos.col && s + i - 1 < e; i++)
    diag_printf("%c", s[i - 1] == '\t' ? '\t' : ' ');
  diag_printf("^\n");
}

static void vreport(SrcPos pos, const char *kind, const char *fmt, va_list ap) {
  if (pos.file)
    diag_printf("%s:%d:%d: %s: ", pos.file->name, pos.line, pos.col, kind);
  else
    diag_printf("optc: %s: ", kind);
  if (capture)
    buf_vprintf(capture, fmt, ap);
  else
    vfprintf(stderr, fmt, ap);
  diag_printf("\n");
  if (pos.file)
    print_source_line(pos);
}

void verror_at(SrcPos pos, const char *fmt, va_list ap) { vreport(pos, "error", fmt, ap); }

void error_at(SrcPos pos, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(pos, "error", fmt, ap);
  va_end(ap);
}

void note_at(SrcPos pos, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(pos, "note", fmt, ap);
  va_end(ap);
}

void error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport((SrcPos){0}, "error", fmt, ap);
  va_end(ap);
}

/* ---- files ---------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len, bool quiet) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (!quiet)
      error("cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  Buf b = {0};
  char tmp[65536];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
    buf_put(&b, tmp, n);
  if (ferror(f)) {
    if (!quiet)
      error("cannot read '%s': %s", path, strerror(errno));
    fclose(f);
    buf_free(&b);
    return NULL;
  }
  fclose(f);
  if (!b.data)
    buf_reserve(&b, 0), b.data[0] = 0;
  if (len)
    *len = b.len;
  return b.data;
}

char *file_read(const char *path, size_t *len) { return read_all(path, len, false); }
char *file_read_quiet(const char *path, size_t *len) { return read_all(path, len, true); }

typedef struct {
  const void *data;
  size_t n;
} Bytes;

static int fill_bytes(FILE *f, void *ctx) {
  Bytes *b = ctx;
  return fwrite(b->data, 1, b->n, f) == b->n ? 0 : -1;
}

int file_write_atomic(const char *path, const void *data, size_t n) {
  Bytes b = {data, n};
  return file_write_atomic_with(path, fill_bytes, &b);
}

int file_write_atomic_with(const char *path, int (*fill)(FILE *f, void *ctx), void *ctx) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 32);
  ASSERT(tmp);
  snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    error("cannot create '%s': %s", tmp, strerror(errno));
    free(tmp);
    return -1;
  }
  int rc = fill(f, ctx);
  if (rc == 0 && fflush(f) != 0)
    rc = -1;
  if (rc == 0 && fsync(fileno(f)) != 0)
    rc = -1;
  int saved = errno;
  if (fclose(f) != 0 && rc == 0) {
    rc = -1;
    saved = errno;
  }
  if (rc == 0 && rename(tmp, path) != 0) {
    rc = -1;
    saved = errno;
  }
  if (rc != 0) {
    error("cannot write '%s': %s", path, saved ? strerror(saved) : "write failed");
    unlink(tmp);
  }
  free(tmp);
  return rc;
}

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- numbers -------------------------------------------------------------- */

void fmt_double(char *out, double x, bool as_f32) {
  if (isnan(x)) {
    strcpy(out, "nan");
    return;
  }
  if (isinf(x)) {
    strcpy(out, x < 0 ? "-inf" : "inf");
    return;
  }
  /* an f32's text is the float's: from the double it came from, the
   * shortest text can differ (1.1717382534e19 prints as 1.17173825e+19, which
   * reads back as the same float but then prints as 1.1717382e+19) */
  if (as_f32 && fabs(x) <= FLT_MAX)
    x = (double)(float)x;
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(out, 32, "%.*g", prec, x);
    double y = strtod(out, NULL);
    if (as_f32 ? (float)y == (float)x : y == x)
      break;
  }
  /* Make sure a float never reads back as an integer literal. */
  if (!strpbrk(out, ".eni"))
    strcat(out, ".0");
}

/* ---- small helpers --------------------------------------------------------------------------- */

char *xstrdup(const char *s) {
  char *p = strdup(s ? s : "");
  ASSERT(p);
  return p;
}

bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

void mkdir_p(const char *dir) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(tmp, 0755);
      *p = '/';
    }
  mkdir(tmp, 0755);
}

uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ s[i]) * 1099511628211ull;
  return h;
}
