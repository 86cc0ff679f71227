/* safetensors.c: the safetensors format, read and written whole, or (for
 * checkpoints larger than memory) a header first and the data on demand.
 *
 * Layout (huggingface/safetensors, README "Format"):
 *
 *   file    = N:u64le  header:N bytes  data
 *   header  = a JSON object in UTF-8, possibly padded on the right with spaces:
 *             { ["__metadata__": { KEY: STRING, ... },]
 *               NAME: { "dtype": DTYPE, "shape": [DIM, ...], "data_offsets": [BEGIN, END] },
 *               ... }
 *   DTYPE   = "F64" | "F32" | "BF16" | "F16" | "I64" | "I32" | "BOOL"
 *             (the format has more, e.g. "F8_E4M3" or "U8"; optc has no Type for them)
 *   data    = the tensors' bytes, little-endian and row-major; a tensor's bytes are
 *             [BEGIN, END), counted from the first byte after the header
 *
 * The reader accepts what the reference implementation accepts, so that a file
 * we read is one torch reads: N is at most 100 MB and fits in the file, END -
 * BEGIN is numel * element size, and the tensors, sorted by offset, tile the
 * data exactly: no overlap, no hole, and no unused bytes at the end.
 *
 * The writer puts "__metadata__" first (when there is any), then the tensors
 * in order with their data back to back, and pads N to a multiple of 8 so that
 * the data starts 8-byte aligned, as the reference writer does. */
#include "tensor.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tensor bytes are copied as they lie in the file, which is only right on a
 * host with the format's byte order. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian, and this file copies it as is"
#endif

enum {
  MAX_HEADER = 100 * 1000 * 1000, /* the reference reader's limit */
  DATA_ALIGN = 64,                /* a cache line; enough for any vector load */
};

/* ---- dtypes ----------------------------------------------------------------- */

static const char *const dtype_names[NUM_TYPES] = {
    [TY_BOOL] = "BOOL", [TY_I32] = "I32", [TY_I64] = "I64", [TY_F16] = "F16",
    [TY_BF16] = "BF16", [TY_F32] = "F32", [TY_F64] = "F64", [TY_U8] = "U8",
    /* u4 has none: safetensors has no 4-bit dtype (a file holds its bytes as U8) */
};

const char *st_dtype_name(Type t) { return (unsigned)t < NUM_TYPES ? dtype_names[t] : NULL; }

bool st_dtype_from_name(const char *s, Type *out) {
  for (int t = 0; t < NUM_TYPES; t++) {
    if (dtype_names[t] && strcmp(dtype_names[t], s) == 0) {
      *out = (Type)t;
      return true;
    }
  }
  return false;
}

int64_t tensor_nbytes(const Tensor *t) { return t->numel * type_size(t->dtype); }

/* Computes the element count and byte size of a shape. False if a dim is
 * negative or the bytes do not fit in an int64. A zero dim makes the tensor
 * empty however large the others are, so it is looked for first. */
static bool shape_size(Type dtype, int ndim, const int64_t *shape, int64_t *numel,
                       int64_t *nbytes) {
  ASSERT(type_size(dtype) > 0);
  bool empty = false;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return false;
    empty |= shape[i] == 0;
  }
  int64_t n = empty ? 0 : 1;
  for (int i = 0; i < ndim && n; i++) {
    if (n > INT64_MAX / shape[i])
      return false;
    n *= shape[i];
  }
  if (n > INT64_MAX / type_size(dtype))
    return false;
  *numel = n;
  *nbytes = n * type_size(dtype);
  return true;
}

/* "[2, 3]"; "[]" for a scalar. */
static void put_shape(Buf *b, int ndim, const int64_t *shape) {
  buf_putc(b, '[');
  for (int i = 0; i < ndim; i++)
    buf_printf(b, "%s%lld", i ? ", " : "", (long long)shape[i]);
  buf_putc(b, ']');
}

/* ---- errors and memory ------------------------------------------------------ */

/* Prints "optc: error: PATH: tensor 'NAME': MESSAGE", without the tensor part
 * when tensor is NULL. */
static PRINTF(3, 4) void st_error(const char *path, const char *tensor, const char *fmt, ...) {
  Buf b = {0};
  buf_printf(&b, "%s: ", path);
  if (tensor)
    buf_printf(&b, "tensor '%s': ", tensor);
  va_list ap;
  va_start(ap, fmt);
  buf_vprintf(&b, fmt, ap);
  va_end(ap);
  error("%s", b.data);
  buf_free(&b);
}

static void grow(void **p, int *cap, int n, size_t elt) {
  if (n <= *cap)
    return;
  int ncap = *cap ? *cap : 8;
  while (ncap < n) {
    ASSERT(ncap <= INT32_MAX / 2);
    ncap *= 2;
  }
  void *np = realloc(*p, (size_t)ncap * elt);
  ASSERT(np);
  *p = np;
  *cap = ncap;
}

/* A DATA_ALIGN-aligned buffer of n bytes, uninitialized, freed with free().
 * At least one byte is allocated, so that an empty tensor's data is not NULL.
 * Tensor data can be gigabytes, so failure is reported, not aborted on:
 * returns NULL with an error printed. */
static void *alloc_data(const char *path, const char *tensor, int64_t n) {
  void *p = NULL;
  int rc = (uint64_t)n > SIZE_MAX - DATA_ALIGN ? ENOMEM
                                               : posix_memalign(&p, DATA_ALIGN, n ? (size_t)n : 1);
  if (rc != 0) {
    st_error(path, tensor, "cannot allocate %lld bytes: %s", (long long)n, strerror(rc));
    return NULL;
  }
  return p;
}

/* ---- tensor files in memory ------------------------------------------------- */

/* Appends a tensor that takes ownership of name and data. */
static Tensor *tf_push(TensorFile *tf, char *name, Type dtype, int ndim, const int64_t *shape,
                       int64_t numel, void *data) {
  grow((void **)&tf->tensors, &tf->cap, tf->n + 1, sizeof(Tensor));
  Tensor *t = &tf->tensors[tf->n++];
  *t = (Tensor){.name = name, .dtype = dtype, .ndim = ndim, .numel = numel, .data = data};
  if (ndim > 0)
    memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
  return t;
}

static void meta_push(TensorFile *tf, const char *key, const char *value) {
  /* Keys and values share capmeta, so both grow from the same old cap. */
  int cap = tf->capmeta;
  grow((void **)&tf->meta_keys, &tf->capmeta, tf->nmeta + 1, sizeof(char *));
  grow((void **)&tf->meta_vals, &cap, tf->nmeta + 1, sizeof(char *));
  tf->meta_keys[tf->nmeta] = xstrdup(key);
  tf->meta_vals[tf->nmeta] = xstrdup(value);
  tf->nmeta++;
}

void tf_free(TensorFile *tf) {
  for (int i = 0; i < tf->n; i++) {
    free(tf->tensors[i].name);
    free(tf->tensors[i].data);
  }
  for (int i = 0; i < tf->nmeta; i++) {
    free(tf->meta_keys[i]);
    free(tf->meta_vals[i]);
  }
  free(tf->tensors);
  free(tf->meta_keys);
  free(tf->meta_vals);
  *tf = (TensorFile){0};
}

Tensor *tf_find(const TensorFile *tf, const char *name) {
  for (int i = 0; i < tf->n; i++)
    if (strcmp(tf->tensors[i].name, name) == 0)
      return &tf->tensors[i];
  return NULL;
}

Tensor *tf_add(TensorFile *tf, const char *name, Type dtype, int ndim, const int64_t *shape) {
  ASSERT(name && (shape || ndim == 0));
  if (tf_find(tf, name)) {
    error("tensor '%s' is already in the tensor file", name);
    return NULL;
  }
  if (!st_dtype_name(dtype)) {
    error("tensor '%s': type %d has no safetensors dtype", name, (int)dtype);
    return NULL;
  }
  if (ndim < 0 || ndim > TENSOR_MAX_DIMS) {
    error("tensor '%s': %d dims; a tensor has 0 to %d", name, ndim, TENSOR_MAX_DIMS);
    return NULL;
  }
  int64_t numel, nbytes;
  if (!shape_size(dtype, ndim, shape, &numel, &nbytes)) {
    Buf b = {0};
    put_shape(&b, ndim, shape);
    error("tensor '%s': shape %s has a negative dim or more than 2^63 bytes of %s", name, b.data,
          st_dtype_name(dtype));
    buf_free(&b);
    return NULL;
  }
  void *data = alloc_data("tf_add", name, nbytes);
  if (!data)
    return NULL;
  memset(data, 0, (size_t)nbytes);
  return tf_push(tf, xstrdup(name), dtype, ndim, shape, numel, data);
}

void tf_set_meta(TensorFile *tf, const char *key, const char *value) {
  ASSERT(key && value);
  for (int i = 0; i < tf->nmeta; i++) {
    if (strcmp(tf->meta_keys[i], key) == 0) {
      char *v = xstrdup(value);
      free(tf->meta_vals[i]);
      tf->meta_vals[i] = v;
      return;
    }
  }
  meta_push(tf, key, value);
}

const char *tf_get_meta(const TensorFile *tf, const char *key) {
  for (int i = 0; i < tf->nmeta; i++)
    if (strcmp(tf->meta_keys[i], key) == 0)
      return tf->meta_vals[i];
  return NULL;
}

/* ---- reading ---------------------------------------------------------------- */

/* One header entry, checked but not yet loaded. */
typedef struct {
  const char *name; /* the JSON key; lives as long as Reader.header */
  Type dtype;
  int ndim;
  int64_t shape[TENSOR_MAX_DIMS];
  int64_t numel, nbytes;
  int64_t begin, end; /* data_offsets, relative to the data region */
  int index;          /* place in the header, to keep the sort stable */
} Entry;

typedef struct {
  const char *path;
  FILE *f;
  int64_t file_size;
  int64_t header_len; /* N */
  int64_t data_len;   /* file_size - 8 - N */
  json_t *header;
  Entry *entries; /* in header order until check_layout sorts them */
  int nentries;
} Reader;

static int open_file(Reader *r) {
  r->f = fopen(r->path, "rb");
  if (!r->f) {
    error("cannot open '%s': %s", r->path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fileno(r->f), &st) != 0) {
    error("cannot stat '%s': %s", r->path, strerror(errno));
    return -1;
  }
  /* A directory opens fine but cannot be read; a pipe has no size to check
   * the offsets against. */
  if (!S_ISREG(st.st_mode)) {
    st_error(r->path, NULL, "not a regular file");
    return -1;
  }
  r->file_size = (int64_t)st.st_size;
  return 0;
}

/* Reads n bytes at the current position; what = what they are, for the
 * message. A short read here means the file shrank after fstat. */
static int read_exact(Reader *r, const char *tensor, void *p, size_t n, const char *what) {
  if (n == 0 || fread(p, 1, n, r->f) == n)
    return 0;
  if (ferror(r->f))
    st_error(r->path, tensor, "cannot read %s: %s", what, strerror(errno));
  else
    st_error(r->path, tensor, "file ended inside %s (was it changed while being read?)", what);
  return -1;
}

/* file = N:u64le header:N bytes ... */
static int read_header(Reader *r) {
  if (r->file_size < 8) {
    st_error(r->path, NULL, "file is %lld bytes, too short to hold the 8-byte header length",
             (long long)r->file_size);
    return -1;
  }
  unsigned char len8[8];
  if (read_exact(r, NULL, len8, 8, "the header length") != 0)
    return -1;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--)
    n = n << 8 | len8[i];
  if (n == 0) {
    st_error(r->path, NULL, "header length is 0; even an empty header is \"{}\"");
    return -1;
  }
  if (n > MAX_HEADER) {
    st_error(r->path, NULL,
             "oversized header: the length field says %llu bytes, and the limit is %d "
             "(is this a safetensors file?)",
             (unsigned long long)n, MAX_HEADER);
    return -1;
  }
  if (n > (uint64_t)(r->file_size - 8)) {
    st_error(r->path, NULL,
             "header length %llu is larger than the %lld bytes that follow it (is the file "
             "truncated?)",
             (unsigned long long)n, (long long)(r->file_size - 8));
    return -1;
  }
  r->header_len = (int64_t)n;
  r->data_len = r->file_size - 8 - r->header_len;

  char *text = malloc(n);
  if (!text) {
    st_error(r->path, NULL, "cannot allocate %llu bytes for the header", (unsigned long long)n);
    return -1;
  }
  if (read_exact(r, NULL, text, n, "the header") != 0) {
    free(text);
    return -1;
  }
  /* jansson keeps the last of two equal keys unless told otherwise, which
   * would silently drop a tensor. DECODE_ANY lets a non-object parse, so
   * that it gets our own message below. */
  json_error_t err;
  r->header = json_loadb(text, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
  free(text);
  if (!r->header) {
    if (json_error_code(&err) == json_error_duplicate_key)
      st_error(r->path, NULL, "a name appears twice in the header (%s)", err.text);
    else
      st_error(r->path, NULL, "header is not valid JSON: %s (at byte %d of the header)", err.text,
               err.position);
    return -1;
  }
  if (!json_is_object(r->header)) {
    st_error(r->path, NULL, "header is not a JSON object");
    return -1;
  }
  return 0;
}

/* A JSON integer >= 0. */
static bool get_count(const json_t *v, int64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return false;
  *out = (int64_t)json_integer_value(v);
  return true;
}

/* "dtype": DTYPE */
static int parse_dtype(Reader *r, Entry *e, const json_t *obj) {
  const json_t *v = json_object_get(obj, "dtype");
  if (!v) {
    st_error(r->path, e->name, "missing \"dtype\"");
    return -1;
  }
  if (!json_is_string(v)) {
    st_error(r->path, e->name, "\"dtype\" is not a string");
    return -1;
  }
  if (!st_dtype_from_name(json_string_value(v), &e->dtype)) {
    st_error(r->path, e->name,
             "unsupported dtype \"%s\" (optc reads F64, F32, BF16, F16, I64, I32, BOOL)",
             json_string_value(v));
    return -1;
  }
  return 0;
}

/* "shape": [DIM, ...], each DIM an integer >= 0 */
static int parse_shape(Reader *r, Entry *e, const json_t *obj) {
  const json_t *v = json_object_get(obj, "shape");
  if (!v) {
    st_error(r->path, e->name, "missing \"shape\"");
    return -1;
  }
  if (!json_is_array(v)) {
    st_error(r->path, e->name, "\"shape\" is not an array");
    return -1;
  }
  size_t ndim = json_array_size(v);
  if (ndim > TENSOR_MAX_DIMS) {
    st_error(r->path, e->name, "shape has %zu dims; optc supports at most %d", ndim,
             TENSOR_MAX_DIMS);
    return -1;
  }
  e->ndim = (int)ndim;
  for (size_t i = 0; i < ndim; i++) {
    const json_t *d = json_array_get(v, i);
    if (!get_count(d, &e->shape[i])) {
      if (json_is_integer(d))
        st_error(r->path, e->name, "shape[%zu] is %lld; a dim must not be negative", i,
                 (long long)json_integer_value(d));
      else
        st_error(r->path, e->name, "shape[%zu] is not an integer", i);
      return -1;
    }
  }
  if (!shape_size(e->dtype, e->ndim, e->shape, &e->numel, &e->nbytes)) {
    Buf b = {0};
    put_shape(&b, e->ndim, e->shape);
    st_error(r->path, e->name, "%s %s would take more than 2^63 bytes", st_dtype_name(e->dtype),
             b.data);
    buf_free(&b);
    return -1;
  }
  return 0;
}

/* "data_offsets": [BEGIN, END], 0 <= BEGIN <= END <= data_len,
 * END - BEGIN = numel * element size */
static int parse_offsets(Reader *r, Entry *e, const json_t *obj) {
  const json_t *v = json_object_get(obj, "data_offsets");
  if (!v) {
    st_error(r->path, e->name, "missing \"data_offsets\"");
    return -1;
  }
  if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
      !json_is_integer(json_array_get(v, 1))) {
    st_error(r->path, e->name, "\"data_offsets\" is not an array of two integers");
    return -1;
  }
  if (!get_count(json_array_get(v, 0), &e->begin) || !get_count(json_array_get(v, 1), &e->end)) {
    st_error(r->path, e->name, "data_offsets [%lld, %lld) has a negative offset",
             (long long)json_integer_value(json_array_get(v, 0)),
             (long long)json_integer_value(json_array_get(v, 1)));
    return -1;
  }
  if (e->begin > e->end) {
    st_error(r->path, e->name, "data_offsets [%lld, %lld) begin after they end",
             (long long)e->begin, (long long)e->end);
    return -1;
  }
  if (e->end > r->data_len) {
    st_error(r->path, e->name,
             "lies outside the file: data_offsets [%lld, %lld), but the data after the header "
             "is %lld bytes (is the file truncated?)",
             (long long)e->begin, (long long)e->end, (long long)r->data_len);
    return -1;
  }
  if (e->end - e->begin != e->nbytes) {
    Buf b = {0};
    put_shape(&b, e->ndim, e->shape);
    st_error(r->path, e->name, "data_offsets [%lld, %lld) hold %lld bytes, but %s %s needs %lld",
             (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin),
             st_dtype_name(e->dtype), b.data, (long long)e->nbytes);
    buf_free(&b);
    return -1;
  }
  return 0;
}

/* NAME: { "dtype": ..., "shape": ..., "data_offsets": ... }; other keys are
 * ignored, as the reference reader ignores them. */
static int parse_entry(Reader *r, Entry *e, const json_t *obj) {
  if (!json_is_object(obj)) {
    st_error(r->path, e->name, "header entry is not an object");
    return -1;
  }
  if (parse_dtype(r, e, obj) != 0 || parse_shape(r, e, obj) != 0 || parse_offsets(r, e, obj) != 0)
    return -1;
  return 0;
}

/* "__metadata__": { KEY: STRING, ... }. null is taken as no metadata, as the
 * reference reader takes it. */
static int parse_metadata(Reader *r, const json_t *obj, TensorFile *tf) {
  if (json_is_null(obj))
    return 0;
  if (!json_is_object(obj)) {
    st_error(r->path, NULL, "\"__metadata__\" is not an object");
    return -1;
  }
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    if (!json_is_string(v)) {
      st_error(r->path, NULL, "\"__metadata__\" value of '%s' is not a string", key);
      return -1;
    }
    meta_push(tf, key, json_string_value(v));
  }
  return 0;
}

static int parse_header(Reader *r, TensorFile *tf) {
  r->entries = calloc(json_object_size(r->header) + 1, sizeof(Entry));
  if (!r->entries) {
    st_error(r->path, NULL, "cannot allocate the list of %zu tensors", json_object_size(r->header));
    return -1;
  }
  /* jansson (>= 2.8) iterates an object in the order its keys were read. */
  const char *key;
  json_t *v;
  json_object_foreach(r->header, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      if (parse_metadata(r, v, tf) != 0)
        return -1;
      continue;
    }
    Entry *e = &r->entries[r->nentries];
    e->name = key;
    e->index = r->nentries++;
    if (parse_entry(r, e, v) != 0)
      return -1;
  }
  return 0;
}

static int by_offset(const void *pa, const void *pb) {
  const Entry *a = pa, *b = pb;
  if (a->begin != b->begin)
    return a->begin < b->begin ? -1 : 1;
  if (a->end != b->end)
    return a->end < b->end ? -1 : 1;
  return a->index - b->index;
}

/* Sorted by offset, the tensors must tile [0, data_len) exactly. Empty tensors
 * fit at any boundary. */
static int check_layout(Reader *r) {
  qsort(r->entries, (size_t)r->nentries, sizeof(Entry), by_offset);
  int64_t at = 0;
  const Entry *prev = NULL;
  for (int i = 0; i < r->nentries; i++) {
    const Entry *e = &r->entries[i];
    if (e->begin < at) {
      st_error(r->path, NULL, "tensors '%s' [%lld, %lld) and '%s' [%lld, %lld) overlap", prev->name,
               (long long)prev->begin, (long long)prev->end, e->name, (long long)e->begin,
               (long long)e->end);
      return -1;
    }
    if (e->begin > at) {
      if (prev)
        st_error(r->path, NULL,
                 "hole: bytes [%lld, %lld) between tensors '%s' and '%s' belong to no tensor",
                 (long long)at, (long long)e->begin, prev->name, e->name);
      else
        st_error(r->path, NULL, "hole: bytes [0, %lld) before tensor '%s' belong to no tensor",
                 (long long)e->begin, e->name);
      return -1;
    }
    at = e->end;
    prev = e;
  }
  if (at < r->data_len) {
    if (prev)
      st_error(r->path, NULL, "%lld unused bytes at the end of the file, after tensor '%s'",
               (long long)(r->data_len - at), prev->name);
    else
      st_error(r->path, NULL, "%lld bytes of data after the header, but no tensors",
               (long long)r->data_len);
    return -1;
  }
  return 0;
}

static void reader_close(Reader *r) {
  /* Nothing was written, so a failing fclose loses nothing. */
  if (r->f)
    fclose(r->f);
  json_decref(r->header);
  free(r->entries);
}

/* Everything but the data: the header parsed and checked, the entries in
 * data order, the file kept open for st_read_at. */
int st_open(const char *path, StFile *out) {
  *out = (StFile){0};
  Reader r = {.path = path};
  StFile sf = {0};
  int rc = -1;
  if (open_file(&r) == 0 && read_header(&r) == 0 && parse_header(&r, &sf.meta) == 0 &&
      check_layout(&r) == 0) {
    sf.path = xstrdup(path);
    sf.f = r.f;
    r.f = NULL;
    sf.file_size = r.file_size;
    sf.n = r.nentries;
    sf.entries = calloc((size_t)sf.n + 1, sizeof(StEntry));
    ASSERT(sf.entries);
    for (int i = 0; i < sf.n; i++) {
      const Entry *e = &r.entries[i];
      StEntry *d = &sf.entries[i];
      *d = (StEntry){.name = xstrdup(e->name), .dtype = e->dtype, .ndim = e->ndim, .numel = e->numel,
                     .nbytes = e->nbytes, .begin = 8 + r.header_len + e->begin};
      memcpy(d->shape, e->shape, sizeof d->shape);
    }
    rc = 0;
  }
  reader_close(&r);
  if (rc == 0)
    *out = sf;
  else
    tf_free(&sf.meta);
  return rc;
}

int st_read_at(const StFile *sf, int i, int64_t off, int64_t n, void *dst) {
  ASSERT(i >= 0 && i < sf->n);
  const StEntry *e = &sf->entries[i];
  ASSERT(off >= 0 && n >= 0 && off <= e->nbytes - n);
  int fd = fileno(sf->f);
  char *p = dst;
  while (n > 0) {
    ssize_t got = pread(fd, p, (size_t)MIN(n, (int64_t)1 << 30), (off_t)(e->begin + off));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      st_error(sf->path, e->name, "cannot read its data: %s", strerror(errno));
      return -1;
    }
    if (got == 0) {
      st_error(sf->path, e->name, "file ended inside its data (was it changed while being read?)");
      return -1;
    }
    p += got;
    off += got;
    n -= got;
  }
  return 0;
}

int st_find(const StFile *sf, const char *name) {
  for (int i = 0; i < sf->n; i++)
    if (strcmp(sf->entries[i].name, name) == 0)
      return i;
  return -1;
}

void st_close(StFile *sf) {
  if (sf->f)
    fclose(sf->f);
  for (int i = 0; i < sf->n; i++)
    free(sf->entries[i].name);
  free(sf->entries);
  free(sf->path);
  tf_free(&sf->meta);
  *sf = (StFile){0};
}

/* The data region is tiled in data order, so it is read front to back. */
int st_read(const char *path, TensorFile *out) {
  *out = (TensorFile){0};
  StFile sf;
  if (st_open(path, &sf) != 0)
    return -1;
  TensorFile tf = sf.meta; /* the metadata moves over; tensors follow */
  sf.meta = (TensorFile){0};
  int rc = 0;
  for (int i = 0; i < sf.n && rc == 0; i++) {
    const StEntry *e = &sf.entries[i];
    void *data = alloc_data(path, e->name, e->nbytes);
    if (!data || st_read_at(&sf, i, 0, e->nbytes, data) != 0) {
      free(data);
      rc = -1;
      break;
    }
    tf_push(&tf, xstrdup(e->name), e->dtype, e->ndim, e->shape, e->numel, data);
  }
  st_close(&sf);
  if (rc == 0)
    *out = tf;
  else
    tf_free(&tf);
  return rc;
}

/* ---- writing ---------------------------------------------------------------- */

typedef struct {
  const StView *v;
  int n;
  char *header;      /* compact JSON from json_dumps */
  size_t header_len; /* strlen(header) */
  size_t padded;     /* N: header_len rounded up to a multiple of 8 */
} Writer;

/* jansson refuses a string that is not UTF-8, or fails for want of memory;
 * for names this small the first is what happens. */
static int set_string(const char *path, json_t *obj, const char *key, const char *value) {
  json_t *s = json_string(value);
  if (!s || json_object_set_new(obj, key, s) != 0) {
    st_error(path, NULL, "'%s' = '%s' is not valid UTF-8", key, value);
    return -1;
  }
  return 0;
}

/* Checks that v can be written, sets *nbytes, and returns its header entry,
 * or NULL with an error printed. */
static json_t *tensor_entry(const char *path, const StView *v, int64_t offset, int64_t *nbytes) {
  const char *dtype = st_dtype_name(v->dtype);
  if (!dtype) {
    st_error(path, v->name, "type %d has no safetensors dtype", (int)v->dtype);
    return NULL;
  }
  int64_t numel;
  if (v->ndim < 0 || v->ndim > TENSOR_MAX_DIMS ||
      !shape_size(v->dtype, v->ndim, v->shape, &numel, nbytes)) {
    st_error(path, v->name, "its %d-dim shape is not a valid shape", v->ndim);
    return NULL;
  }
  if (v->src) {
    /* a tensor passed through: the caller matched it to its source */
    ASSERT(v->src_index >= 0 && v->src_index < v->src->n);
    ASSERT(v->src->entries[v->src_index].nbytes == *nbytes);
  } else if (!v->data && !v->fill && *nbytes > 0) {
    st_error(path, v->name, "has no data");
    return NULL;
  }
  json_t *shape = json_array();
  json_t *e = json_object();
  if (!shape || !e) {
    json_decref(shape);
    json_decref(e);
    st_error(path, v->name, "out of memory building the header");
    return NULL;
  }
  bool ok = true;
  for (int i = 0; i < v->ndim; i++)
    ok = ok && json_array_append_new(shape, json_integer(v->shape[i])) == 0;
  /* set_new takes the value even when it fails, so shape is not leaked. */
  ok = ok && json_object_set_new(e, "dtype", json_string(dtype)) == 0;
  ok = json_object_set_new(e, "shape", shape) == 0 && ok;
  ok = ok && json_object_set_new(
                 e, "data_offsets",
                 json_pack("[I,I]", (json_int_t)offset, (json_int_t)(offset + *nbytes))) == 0;
  if (!ok) {
    json_decref(e);
    st_error(path, v->name, "out of memory building the header");
    return NULL;
  }
  return e;
}

/* { "__metadata__": {...}, NAME: {...}, ... } in the order of v. */
static json_t *build_header(const char *path, const StView *v, int n, const char *const *meta,
                            int nmeta) {
  int64_t offset = 0;
  json_t *root = json_object();
  json_t *md = nmeta ? json_object() : NULL;
  if (!root || (nmeta && !md))
    goto oom;
  for (int i = 0; i < nmeta; i++)
    if (set_string(path, md, meta[2 * i], meta[2 * i + 1]) != 0)
      goto fail;
  if (md) {
    int rc = json_object_set_new(root, "__metadata__", md);
    md = NULL; /* taken, even on failure */
    if (rc != 0)
      goto oom;
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(v[i].name, "__metadata__") == 0) {
      st_error(path, v[i].name, "the name is reserved for the metadata");
      goto fail;
    }
    if (json_object_get(root, v[i].name)) {
      st_error(path, v[i].name, "appears twice");
      goto fail;
    }
    int64_t nbytes;
    json_t *e = tensor_entry(path, &v[i], offset, &nbytes);
    if (!e)
      goto fail;
    if (json_object_set_new(root, v[i].name, e) != 0) {
      st_error(path, v[i].name, "the name is not valid UTF-8");
      goto fail;
    }
    offset += nbytes;
  }
  return root;
oom:
  st_error(path, NULL, "out of memory building the header");
fail:
  json_decref(md);
  json_decref(root);
  return NULL;
}

enum { COPY_CHUNK = 16 << 20 }; /* bytes of a passed-through tensor in memory at once */

/* The fill callback of file_write_atomic_with: N, header, padding, data. */
static int write_file(FILE *f, void *ctx) {
  const Writer *w = ctx;
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)w->padded >> (8 * i));
  if (fwrite(len8, 1, 8, f) != 8 || fwrite(w->header, 1, w->header_len, f) != w->header_len)
    return -1;
  for (size_t i = w->header_len; i < w->padded; i++)
    if (fputc(' ', f) == EOF)
      return -1;
  char *chunk = NULL;
  int rc = 0;
  for (int i = 0; i < w->n && rc == 0; i++) {
    const StView *v = &w->v[i];
    if (v->fill) {
      rc = v->fill(v->fill_ctx, v, f);
      continue;
    }
    if (!v->src) {
      int64_t numel = 1;
      for (int d = 0; d < v->ndim; d++)
        numel *= v->shape[d];
      size_t n = (size_t)(numel * type_size(v->dtype));
      if (n > 0 && fwrite(v->data, 1, n, f) != n)
        rc = -1;
      continue;
    }
    int64_t total = v->src->entries[v->src_index].nbytes;
    if (!chunk && total > 0 && !(chunk = malloc(COPY_CHUNK)))
      return -1;
    for (int64_t at = 0; at < total && rc == 0; at += COPY_CHUNK) {
      int64_t m = MIN((int64_t)COPY_CHUNK, total - at);
      if (st_read_at(v->src, v->src_index, at, m, chunk) != 0 || fwrite(chunk, 1, (size_t)m, f) != (size_t)m)
        rc = -1;
    }
  }
  free(chunk);
  return rc;
}

int st_write_views(const char *path, const StView *v, int n, const char *const *meta, int nmeta) {
  /* Everything that can be wrong with the tensors is found here, before a
   * temporary file exists. */
  json_t *root = build_header(path, v, n, meta, nmeta);
  if (!root)
    return -1;
  Writer w = {.v = v, .n = n, .header = json_dumps(root, JSON_COMPACT)};
  json_decref(root);
  if (!w.header) {
    st_error(path, NULL, "out of memory printing the header");
    return -1;
  }
  w.header_len = strlen(w.header);
  w.padded = (w.header_len + 7) & ~(size_t)7;
  int rc = -1;
  if (w.padded > MAX_HEADER)
    st_error(path, NULL, "the header would be %zu bytes, over the %d that readers accept", w.padded,
             MAX_HEADER);
  else
    rc = file_write_atomic_with(path, write_file, &w);
  free(w.header);
  return rc;
}

int st_write(const char *path, const TensorFile *tf) {
  StView *v = calloc((size_t)tf->n + 1, sizeof(StView));
  const char **meta = calloc(2 * (size_t)tf->nmeta + 1, sizeof(char *));
  ASSERT(v && meta);
  for (int i = 0; i < tf->n; i++) {
    const Tensor *t = &tf->tensors[i];
    int64_t numel, nbytes;
    if (st_dtype_name(t->dtype) &&
        (t->ndim < 0 || t->ndim > TENSOR_MAX_DIMS ||
         !shape_size(t->dtype, t->ndim, t->shape, &numel, &nbytes) || numel != t->numel)) {
      st_error(path, t->name, "numel %lld does not match its %d-dim shape", (long long)t->numel, t->ndim);
      free(v);
      free(meta);
      return -1;
    }
    v[i] = (StView){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
    if (t->ndim > 0 && t->ndim <= TENSOR_MAX_DIMS)
      memcpy(v[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  }
  for (int i = 0; i < tf->nmeta; i++) {
    meta[2 * i] = tf->meta_keys[i];
    meta[2 * i + 1] = tf->meta_vals[i];
  }
  int rc = st_write_views(path, v, tf->n, meta, tf->nmeta);
  free(v);
  free(meta);
  return rc;
}
