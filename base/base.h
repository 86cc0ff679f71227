/* base.h: the layer everything else stands on. Arenas, growable byte
 * buffers, positioned diagnostics, whole-file I/O with atomic writes, the
 * element types that the IR and tensor files share, and small helpers. */
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A bug, not a user's mistake: print where and abort. */
#define unreachable() \
  (fprintf(stderr, "%s:%d: internal error: unreachable\n", __FILE__, __LINE__), abort())
#define ASSERT(c) \
  ((c) ? (void)0 : (fprintf(stderr, "%s:%d: internal error: assertion '%s' failed\n", \
                            __FILE__, __LINE__, #c), abort()))

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF(f, a)
#endif

/* ---- base.c: element types ------------------------------------------------
 * What one element of a buffer or a tensor is: the IR's value types and the
 * dtypes of the tensors a file holds. */
/* u8 and u4 are the codes of a quantized state (compiler/ir.h, code books):
 * unsigned, 8 and 4 bits; a u4 tensor holds two a byte, element 2k in the
 * high nibble of byte k and 2k + 1 in the low one (torchao's packing). They
 * are neither ints nor floats: only loads, stores, lookup and search take
 * them. */
typedef enum { TY_VOID, TY_BOOL, TY_I32, TY_I64, TY_F16, TY_BF16, TY_F32, TY_F64, TY_U8, TY_U4, NUM_TYPES } Type;

extern const char *const type_names[NUM_TYPES];
int type_size(Type t); /* bytes per element; 0 for void; 1 for u4, whose byte holds two */
int type_bits(Type t); /* bits per element: 4 for u4 */
bool type_is_float(Type t);
bool type_is_int(Type t);
bool type_is_code(Type t); /* u8, u4 */
/* The type named s[0..n) (f32, bf16, i64, ...; not void). */
bool type_from_name(const char *s, size_t n, Type *out);

/* ---- base.c: arenas ------------------------------------------------------
 * Memory that lives as long as one compile. Everything allocated from an
 * arena is zeroed, and is freed at once by arena_free. */
typedef struct Arena Arena;
Arena *arena_new(void);
void arena_free(Arena *a);
void *arena_alloc(Arena *a, size_t n);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
PRINTF(2, 3) char *arena_printf(Arena *a, const char *fmt, ...);
/* Grows *p (an array of *cap elements of size elt) to hold at least n. */
void arena_grow(Arena *a, void **p, int *cap, int n, size_t elt);

/* ---- base.c: growable byte buffers (malloc'd; the owner calls buf_free) -- */
typedef struct {
  char *data; /* NUL-terminated while len < cap */
  size_t len, cap;
} Buf;
void buf_reserve(Buf *b, size_t extra);
void buf_put(Buf *b, const void *p, size_t n);
void buf_puts(Buf *b, const char *s);
void buf_putc(Buf *b, char c);
PRINTF(2, 3) void buf_printf(Buf *b, const char *fmt, ...);
void buf_vprintf(Buf *b, const char *fmt, va_list ap);
void buf_free(Buf *b);

/* ---- base.c: diagnostics -------------------------------------------------
 * A user's mistake is reported as `file:line:col: error: msg`, followed by
 * the source line and a caret when the text is at hand. */
typedef struct {
  const char *name; /* the path, as the user gave it */
  const char *text; /* the whole file, NUL-terminated; may be NULL */
  size_t len;
} SrcFile;

typedef struct {
  const SrcFile *file; /* NULL: no position */
  int line, col;       /* 1-based */
} SrcPos;

PRINTF(2, 3) void error_at(SrcPos pos, const char *fmt, ...);
void verror_at(SrcPos pos, const char *fmt, va_list ap);
PRINTF(2, 3) void note_at(SrcPos pos, const char *fmt, ...);
/* An error with no source position: `optc: error: msg`. */
PRINTF(1, 2) void error(const char *fmt, ...);
/* Sends this thread's diagnostics to b (appended) instead of stderr, until
 * called with NULL: the public API returns them as error messages. */
void diag_capture(Buf *b);
/* Raw text to where diagnostics go (stderr, or the capture). */
PRINTF(1, 2) void diag_printf(const char *fmt, ...);
/* Computes line and column of byte offset off in f. */
SrcPos srcpos_of(const SrcFile *f, size_t off);

/* ---- base.c: files -------------------------------------------------------- */
/* Reads a whole file; returns a malloc'd NUL-terminated buffer, or NULL with
 * an error already printed. */
char *file_read(const char *path, size_t *len);
/* The same, printing nothing when the file cannot be read. */
char *file_read_quiet(const char *path, size_t *len);
/* Writes to PATH.tmp.PID, fsyncs, and renames over path, so that a reader
 * never sees a half-written file. Returns 0, or -1 with an error printed. */
int file_write_atomic(const char *path, const void *data, size_t n);
/* Same, but the content is produced by a callback writing to a FILE. */
int file_write_atomic_with(const char *path, int (*fill)(FILE *f, void *ctx), void *ctx);

/* Seconds on a monotonic clock. */
double now_seconds(void);

/* Shortest decimal text that reads back as exactly x (as a double, or as a
 * float when as_f32). Writes at most 32 bytes into out. */
void fmt_double(char *out, double x, bool as_f32);

/* ---- base.c: small helpers ---------------------------------------------------------------- */
/* strdup for bookkeeping (names, paths), which is small next to the data:
 * running out of memory there aborts, as the arenas do. NULL gives "". */
char *xstrdup(const char *s);
bool ends_with(const char *s, const char *suffix);
/* Makes dir and the directories above it (mkdir -p); any already there are
 * fine, and a failure shows when dir is used. */
void mkdir_p(const char *dir);
/* FNV-1a over n bytes, from h: FNV1A_BASIS to start a hash, or a previous
 * result to go on with it. */
#define FNV1A_BASIS 0xcbf29ce484222325ull
uint64_t fnv1a(const void *p, size_t n, uint64_t h);
