/* parquet.c: Parquet's footer (Thrift's compact protocol), pages, levels,
 * PLAIN and dictionary values, and the Snappy and ZSTD codecs. Every read
 * is bounds-checked against the file; see parquet.h. */
#include "parquet.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

/* Pages and dictionaries larger than this are refused: no real dataset page
 * comes near it, and a corrupt size must not become a huge allocation. */
#define PQ_MAX_PAGE ((int64_t)1 << 30)

enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICTIONARY = 2, PAGE_DATA_V2 = 3 };
enum { ENC_PLAIN = 0, ENC_PLAIN_DICTIONARY = 2, ENC_RLE = 3, ENC_BIT_PACKED = 4, ENC_RLE_DICTIONARY = 8 };
enum { CODEC_UNCOMPRESSED = 0, CODEC_SNAPPY = 1, CODEC_ZSTD = 6 };

static const char *const pq_codec_names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
static const char *const pq_encoding_names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                             "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                             "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
static const char *const pq_type_names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
                                         "FIXED_LEN_BYTE_ARRAY"};

static const char *name_of(const char *const *names, size_t n, int64_t v) {
  return v >= 0 && (size_t)v < n ? names[v] : "unknown";
}
#define CODEC_NAME(v) name_of(pq_codec_names, ARRAY_LEN(pq_codec_names), v)
#define ENCODING_NAME(v) name_of(pq_encoding_names, ARRAY_LEN(pq_encoding_names), v)

typedef struct {
  int leaf;         /* the column chunk index in each row group; -1 when nested */
  int max_def;      /* 0 (REQUIRED) or 1 (OPTIONAL) */
  int32_t type_len; /* FIXED_LEN_BYTE_ARRAY */
} ColInfo;

typedef struct {
  int64_t num_rows;
  int64_t *chunk_meta; /* (nleaves) byte offsets of each chunk's ColumnMetaData in the footer copy */
} RowGroup;

typedef struct {
  int32_t type, codec;
  int64_t num_values, total_compressed, data_off, dict_off; /* dict_off -1: none */
  bool has_type, has_codec, has_num_values, has_total, has_data_off;
} ChunkMeta;

struct ParquetFile {
  char *path;
  uint8_t *data;
  size_t size;
  size_t footer_off, footer_len; /* the FileMetaData bytes */
  int64_t num_rows;
  int ncols, nleaves;
  PqColumn *cols;
  ColInfo *info;
  char *names; /* the column names, one block */
  int ngroups;
  RowGroup *groups;
  Buf *sink; /* parquet_read_column's messages go here when set (parquet_quiet) */
};

/* A mistake in f: printed, or kept in f->sink. */
PRINTF(2, 3) static void pq_error(const ParquetFile *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (f && f->sink) {
    buf_vprintf(f->sink, fmt, ap);
    buf_putc(f->sink, '\n');
  } else {
    Buf b = {0};
    buf_vprintf(&b, fmt, ap);
    error("%s", b.data);
    buf_free(&b);
  }
  va_end(ap);
}

void parquet_quiet(ParquetFile *f, Buf *sink) { f->sink = sink; }

int64_t parquet_num_rows(const ParquetFile *f) { return f->num_rows; }
int parquet_num_columns(const ParquetFile *f) { return f->ncols; }
const PqColumn *parquet_column(const ParquetFile *f, int i) {
  ASSERT(i >= 0 && i < f->ncols);
  return &f->cols[i];
}
int parquet_find_column(const ParquetFile *f, const char *name) {
  for (int i = 0; i < f->ncols; i++)
    if (strcmp(f->cols[i].name, name) == 0)
      return i;
  return -1;
}

/* ---- Thrift's compact protocol -------------------------------------------------
 * A reader over [p, end) of the file. The first mistake is recorded and
 * every later read returns zeros, so a parse checks `failed` once per
 * struct. Field headers: a byte (delta << 4 | type), or (0 | type) then a
 * zigzag varint field id; integers are zigzag varints. */

enum { T_STOP = 0, T_TRUE = 1, T_FALSE = 2, T_BYTE = 3, T_I16 = 4, T_I32 = 5, T_I64 = 6, T_DOUBLE = 7,
       T_BINARY = 8, T_LIST = 9, T_SET = 10, T_MAP = 11, T_STRUCT = 12 };

typedef struct ParquetFile ParquetFile;
typedef struct {
  const uint8_t *p, *end, *file; /* file: byte 0 of the file, for offsets in messages */
  const char *path, *what;       /* what: the structure being read, for messages */
  bool failed;
  int depth;
  const ParquetFile *pf; /* where messages go */
} Thrift;

PRINTF(2, 3) static void pq_error(const ParquetFile *f, const char *fmt, ...);

PRINTF(2, 3) static void th_fail(Thrift *t, const char *fmt, ...) {
  if (t->failed)
    return;
  t->failed = true;
  Buf b = {0};
  va_list ap;
  va_start(ap, fmt);
  buf_vprintf(&b, fmt, ap);
  va_end(ap);
  pq_error(t->pf, "%s: malformed Parquet %s at byte %lld: %s", t->path, t->what, (long long)(t->p - t->file), b.data);
  buf_free(&b);
  t->p = t->end;
}

static uint64_t th_varint(Thrift *t) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (t->p >= t->end) {
      th_fail(t, "the data ends inside a number");
      return 0;
    }
    uint8_t c = *t->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80))
      return v;
  }
  th_fail(t, "a number is longer than 10 bytes");
  return 0;
}

static int64_t th_zigzag(Thrift *t) {
  uint64_t v = th_varint(t);
  return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

static int32_t th_i32(Thrift *t) {
  int64_t v = th_zigzag(t);
  if (v < INT32_MIN || v > INT32_MAX) {
    th_fail(t, "%lld does not fit in a 32-bit field", (long long)v);
    return 0;
  }
  return (int32_t)v;
}

/* A binary field: its bytes stay in the file. */
static const uint8_t *th_binary(Thrift *t, size_t *len) {
  uint64_t n = th_varint(t);
  if (t->failed)
    return *len = 0, NULL;
  if (n > (uint64_t)(t->end - t->p)) {
    th_fail(t, "a %llu-byte string runs past the end of the %s", (unsigned long long)n, t->what);
    return *len = 0, NULL;
  }
  const uint8_t *s = t->p;
  t->p += n;
  *len = (size_t)n;
  return s;
}

/* A list or set header: its element type and count. Every element takes at
 * least one byte, so a count beyond the bytes left is an error. */
static int64_t th_list(Thrift *t, int *elem) {
  if (t->p >= t->end) {
    th_fail(t, "the data ends inside a list header");
    return 0;
  }
  uint8_t h = *t->p++;
  *elem = h & 15;
  uint64_t n = h >> 4;
  if (n == 15)
    n = th_varint(t);
  if (!t->failed && n > (uint64_t)(t->end - t->p)) {
    th_fail(t, "a list of %llu elements cannot fit in the %lld bytes left", (unsigned long long)n,
            (long long)(t->end - t->p));
    return 0;
  }
  return t->failed ? 0 : (int64_t)n;
}

/* The next field of a struct: false at its end (STOP). *last is the struct's
 * previous field id (0 at its start). */
static bool th_field(Thrift *t, int *last, int *id, int *type) {
  if (t->failed)
    return false;
  if (t->p >= t->end) {
    th_fail(t, "the data ends inside a struct");
    return false;
  }
  uint8_t h = *t->p++;
  *type = h & 15;
  if (*type == T_STOP)
    return false;
  int delta = h >> 4;
  if (delta)
    *id = *last + delta;
  else {
    int64_t v = th_zigzag(t);
    if (v < -32768 || v > 32767)
      th_fail(t, "field id %lld is out of range", (long long)v);
    *id = (int)v;
  }
  if (*type > T_STRUCT)
    th_fail(t, "unknown field type %d", *type);
  *last = *id;
  return !t->failed;
}

static void th_skip(Thrift *t, int type, bool in_container);

static void th_skip_struct(Thrift *t) {
  if (++t->depth > 64) {
    th_fail(t, "structs nested more than 64 deep");
    return;
  }
  int last = 0, id, type;
  while (th_field(t, &last, &id, &type))
    th_skip(t, type, false);
  t->depth--;
}

/* Skips one value. A bool field keeps its value in its header; a bool in a
 * list is one byte. */
static void th_skip(Thrift *t, int type, bool in_container) {
  if (t->failed)
    return;
  switch (type) {
  case T_TRUE:
  case T_FALSE:
  case T_BYTE:
    if (type == T_BYTE || in_container) {
      if (t->p >= t->end)
        th_fail(t, "the data ends inside a value");
      else
        t->p++;
    }
    break;
  case T_I16:
  case T_I32:
  case T_I64: th_varint(t); break;
  case T_DOUBLE:
    if (t->end - t->p < 8)
      th_fail(t, "the data ends inside a double");
    else
      t->p += 8;
    break;
  case T_BINARY: {
    size_t n;
    th_binary(t, &n);
    break;
  }
  case T_LIST:
  case T_SET: {
    int elem;
    int64_t n = th_list(t, &elem);
    if (++t->depth > 64) {
      th_fail(t, "lists nested more than 64 deep");
      return;
    }
    for (int64_t i = 0; i < n && !t->failed; i++)
      th_skip(t, elem, true);
    t->depth--;
    break;
  }
  case T_MAP: {
    uint64_t n = th_varint(t);
    if (!n || t->failed)
      break;
    if (t->p >= t->end || n > (uint64_t)(t->end - t->p) / 2) {
      th_fail(t, "a map of %llu entries cannot fit in the bytes left", (unsigned long long)n);
      break;
    }
    uint8_t kv = *t->p++;
    if (++t->depth > 64) {
      th_fail(t, "maps nested more than 64 deep");
      return;
    }
    for (uint64_t i = 0; i < n && !t->failed; i++) {
      th_skip(t, kv >> 4, true);
      th_skip(t, kv & 15, true);
    }
    t->depth--;
    break;
  }
  case T_STRUCT: th_skip_struct(t); break;
  default: th_fail(t, "unknown value type %d", type);
  }
}

/* Typed reads of a field whose header said `type`: a mismatch is an error. */
static int64_t th_int_field(Thrift *t, int type, const char *name) {
  if (type != T_I32 && type != T_I64 && type != T_I16 && type != T_BYTE) {
    th_fail(t, "field %s should be an integer, found type %d", name, type);
    return 0;
  }
  if (type == T_BYTE) {
    if (t->p >= t->end)
      return th_fail(t, "the data ends inside %s", name), 0;
    return (int8_t)*t->p++;
  }
  return type == T_I64 ? th_zigzag(t) : th_i32(t);
}

static bool th_expect(Thrift *t, int type, int want, const char *name) {
  if (type != want)
    th_fail(t, "field %s has type %d, expected %d", name, type, want);
  return !t->failed;
}

/* ---- the footer -------------------------------------------------------------------- */

typedef struct {
  int32_t type, type_len, repetition, num_children, converted;
  bool has_type, has_repetition, logical_text;
  const uint8_t *name;
  size_t name_len;
  bool has_name;
} SchemaElem;

/* LogicalType is a union; STRING (1), ENUM (4) and JSON (12) are text. */
static bool read_logical_text(Thrift *t) {
  int last = 0, id, type;
  bool text = false;
  t->depth++;
  while (th_field(t, &last, &id, &type)) {
    text |= id == 1 || id == 4 || id == 12;
    th_skip(t, type, false);
  }
  t->depth--;
  return text;
}

static void read_schema_elem(Thrift *t, SchemaElem *e) {
  *e = (SchemaElem){.converted = -1};
  int last = 0, id, type;
  while (th_field(t, &last, &id, &type)) {
    switch (id) {
    case 1: e->type = (int32_t)th_int_field(t, type, "SchemaElement.type"), e->has_type = true; break;
    case 2: e->type_len = (int32_t)th_int_field(t, type, "SchemaElement.type_length"); break;
    case 3:
      e->repetition = (int32_t)th_int_field(t, type, "SchemaElement.repetition_type");
      e->has_repetition = true;
      break;
    case 4:
      if (th_expect(t, type, T_BINARY, "SchemaElement.name"))
        e->name = th_binary(t, &e->name_len), e->has_name = true;
      break;
    case 5: e->num_children = (int32_t)th_int_field(t, type, "SchemaElement.num_children"); break;
    case 6: e->converted = (int32_t)th_int_field(t, type, "SchemaElement.converted_type"); break;
    case 10:
      if (th_expect(t, type, T_STRUCT, "SchemaElement.logicalType"))
        e->logical_text = read_logical_text(t);
      break;
    default: th_skip(t, type, false);
    }
  }
  if (!t->failed && !e->has_name)
    th_fail(t, "a schema element has no name");
}

/* The schema: element 0 is the root; each top-level child is a column,
 * nested when it is a group or repeated. */
static bool read_schema(ParquetFile *f, Thrift *t) {
  int elem;
  int64_t n = th_list(t, &elem);
  if (t->failed || !th_expect(t, elem, T_STRUCT, "FileMetaData.schema"))
    return false;
  if (n < 1) {
    th_fail(t, "the schema is empty");
    return false;
  }
  SchemaElem *e = calloc((size_t)n, sizeof(SchemaElem));
  ASSERT(e);
  t->depth++;
  for (int64_t i = 0; i < n && !t->failed; i++)
    read_schema_elem(t, &e[i]);
  t->depth--;
  bool ok = !t->failed;
  if (ok && (e[0].num_children < 0 || e[0].num_children > n - 1)) {
    th_fail(t, "the schema root claims %d children of %lld elements", e[0].num_children, (long long)n - 1);
    ok = false;
  }
  if (ok) {
    f->ncols = e[0].num_children;
    f->cols = calloc((size_t)f->ncols + 1, sizeof(PqColumn));
    f->info = calloc((size_t)f->ncols + 1, sizeof(ColInfo));
    size_t names = 0;
    for (int64_t i = 0; i < n; i++)
      names += e[i].name_len + 1;
    f->names = malloc(names);
    ASSERT(f->cols && f->info && f->names);
    size_t at = 0;
    int64_t i = 1;
    int leaves = 0;
    for (int c = 0; c < f->ncols && ok; c++) {
      if (i >= n) {
        th_fail(t, "the schema has fewer elements than its root's children");
        ok = false;
        break;
      }
      SchemaElem *s = &e[i];
      memcpy(f->names + at, s->name, s->name_len);
      f->names[at + s->name_len] = 0;
      PqColumn *col = &f->cols[c];
      col->name = f->names + at;
      at += s->name_len + 1;
      col->optional = s->repetition == 1;
      col->nested = s->num_children > 0 || s->repetition == 2;
      f->info[c].leaf = col->nested ? -1 : leaves;
      f->info[c].max_def = col->optional ? 1 : 0;
      f->info[c].type_len = s->type_len;
      if (!col->nested) {
        if (!s->has_type || s->type < 0 || s->type > PQ_FIXED_LEN_BYTE_ARRAY) {
          th_fail(t, "column '%s' has no valid physical type", col->name);
          ok = false;
          break;
        }
        col->type = (PqType)s->type;
        col->text = s->type == PQ_BYTE_ARRAY &&
                    (s->logical_text || s->converted == 0 || s->converted == 4 || s->converted == 19);
      }
      /* the field's subtree: count its leaves, skip its elements */
      int64_t pending = 1;
      while (pending > 0 && ok) {
        if (i >= n) {
          th_fail(t, "column '%s' claims more schema elements than there are", col->name);
          ok = false;
          break;
        }
        pending--;
        if (e[i].num_children < 0 || e[i].num_children > n) {
          th_fail(t, "schema element %lld has %d children", (long long)i, e[i].num_children);
          ok = false;
          break;
        }
        if (e[i].num_children == 0)
          leaves++;
        pending += e[i].num_children;
        i++;
      }
    }
    if (ok && i != n) {
      th_fail(t, "the schema has %lld elements beyond its root's children", (long long)(n - i));
      ok = false;
    }
    f->nleaves = leaves;
  }
  free(e);
  return ok;
}

/* A ColumnChunk: keeps where its ColumnMetaData is, to read it when the
 * column is. */
static void read_column_chunk(ParquetFile *f, Thrift *t, int64_t *meta_at) {
  int last = 0, id, type;
  *meta_at = -1;
  while (th_field(t, &last, &id, &type)) {
    if (id == 1) {
      th_fail(t, "a column chunk is in another file (file_path), which optc does not read");
    } else if (id == 3 && th_expect(t, type, T_STRUCT, "ColumnChunk.meta_data")) {
      *meta_at = t->p - f->data;
      t->depth++;
      th_skip_struct(t);
      t->depth--;
    } else if (id == 8) {
      th_fail(t, "a column chunk is encrypted, which optc does not read");
    } else {
      th_skip(t, type, false);
    }
  }
  if (!t->failed && *meta_at < 0)
    th_fail(t, "a column chunk has no meta_data");
}

static void read_row_group(ParquetFile *f, Thrift *t, RowGroup *g) {
  int last = 0, id, type;
  bool have_cols = false, have_rows = false;
  while (th_field(t, &last, &id, &type)) {
    if (id == 1 && th_expect(t, type, T_LIST, "RowGroup.columns")) {
      if (have_cols) { /* a second list would replace (and leak) the first */
        th_fail(t, "a row group lists its columns twice");
        return;
      }
      int elem;
      int64_t n = th_list(t, &elem);
      if (!th_expect(t, elem, T_STRUCT, "RowGroup.columns"))
        return;
      if (n != f->nleaves) {
        th_fail(t, "a row group has %lld column chunks, but the schema has %d columns", (long long)n, f->nleaves);
        return;
      }
      g->chunk_meta = calloc((size_t)n + 1, sizeof(int64_t));
      ASSERT(g->chunk_meta);
      t->depth++;
      for (int64_t i = 0; i < n && !t->failed; i++)
        read_column_chunk(f, t, &g->chunk_meta[i]);
      t->depth--;
      have_cols = true;
    } else if (id == 3) {
      g->num_rows = th_int_field(t, type, "RowGroup.num_rows");
      have_rows = true;
    } else {
      th_skip(t, type, false);
    }
  }
  if (!t->failed && (!have_cols || !have_rows))
    th_fail(t, "a row group has no %s", have_cols ? "num_rows" : "columns");
  if (!t->failed && g->num_rows < 0)
    th_fail(t, "a row group has %lld rows", (long long)g->num_rows);
}

static bool read_file_metadata(ParquetFile *f) {
  Thrift t = {f->data + f->footer_off, f->data + f->footer_off + f->footer_len, f->data, f->path, "footer",
              .pf = f};
  int last = 0, id, type;
  bool have_schema = false, seen_schema = false, have_rows = false, have_groups = false;
  while (th_field(&t, &last, &id, &type)) {
    if (id == 2 && th_expect(&t, type, T_LIST, "FileMetaData.schema")) {
      if (seen_schema) {
        th_fail(&t, "the footer gives the schema twice");
        break;
      }
      seen_schema = true;
      have_schema = read_schema(f, &t);
    } else if (id == 3) {
      f->num_rows = th_int_field(&t, type, "FileMetaData.num_rows");
      have_rows = true;
    } else if (id == 4 && th_expect(&t, type, T_LIST, "FileMetaData.row_groups")) {
      if (!have_schema || have_groups) {
        th_fail(&t, have_groups ? "the footer lists the row groups twice" : "the row groups come before the schema");
        break;
      }
      int elem;
      int64_t n = th_list(&t, &elem);
      if (!th_expect(&t, elem, T_STRUCT, "FileMetaData.row_groups"))
        break;
      f->groups = calloc((size_t)n + 1, sizeof(RowGroup));
      ASSERT(f->groups);
      f->ngroups = (int)n;
      t.depth++;
      for (int64_t i = 0; i < n && !t.failed; i++)
        read_row_group(f, &t, &f->groups[i]);
      t.depth--;
      have_groups = true;
    } else if (id == 8) {
      th_fail(&t, "the file is encrypted, which optc does not read");
    } else {
      th_skip(&t, type, false);
    }
  }
  if (t.failed)
    return false;
  if (!have_schema || !have_rows || !have_groups) {
    th_fail(&t, "the footer has no %s", !have_schema ? "schema" : !have_rows ? "num_rows" : "row_groups");
    return false;
  }
  int64_t sum = 0;
  for (int g = 0; g < f->ngroups; g++) {
    if (f->groups[g].num_rows > INT64_MAX - sum) {
      th_fail(&t, "the row groups' row counts overflow");
      return false;
    }
    sum += f->groups[g].num_rows;
  }
  if (sum != f->num_rows || f->num_rows < 0) {
    error("%s: malformed Parquet footer: num_rows is %lld, but the row groups hold %lld", f->path,
          (long long)f->num_rows, (long long)sum);
    return false;
  }
  /* Each row takes some bits of the file, except in an all-null column,
   * which datasets do not have: a count far beyond the file's size is a
   * corrupt footer, not a huge allocation. */
  if (f->num_rows > INT32_MAX || f->num_rows > (int64_t)f->size * 64 + 4096) {
    error("%s: malformed Parquet footer: it claims %lld rows in a %zu-byte file", f->path, (long long)f->num_rows,
          f->size);
    return false;
  }
  return true;
}

void parquet_close(ParquetFile *f) {
  if (!f)
    return;
  for (int g = 0; g < f->ngroups; g++)
    free(f->groups[g].chunk_meta);
  free(f->groups);
  free(f->cols);
  free(f->info);
  free(f->names);
  free(f->data);
  free(f->path);
  free(f);
}

/* Checks the magic at both ends and the footer's length, then parses it. */
static ParquetFile *open_data(ParquetFile *f) {
  const char *path = f->path;
  if (f->size < 12) {
    error("%s: not a Parquet file: %zu bytes is too short (a Parquet file starts and ends with PAR1)", path, f->size);
    goto fail;
  }
  if (memcmp(f->data, "PAR1", 4) != 0) {
    error("%s: not a Parquet file: it does not start with the magic PAR1", path);
    goto fail;
  }
  if (memcmp(f->data + f->size - 4, "PARE", 4) == 0) {
    error("%s: the Parquet footer is encrypted (PARE), which optc does not read", path);
    goto fail;
  }
  if (memcmp(f->data + f->size - 4, "PAR1", 4) != 0) {
    error("%s: not a whole Parquet file: it does not end with the magic PAR1 (truncated?)", path);
    goto fail;
  }
  const uint8_t *lp = f->data + f->size - 8;
  uint32_t flen = (uint32_t)lp[0] | (uint32_t)lp[1] << 8 | (uint32_t)lp[2] << 16 | (uint32_t)lp[3] << 24;
  if (flen == 0 || flen > f->size - 12) {
    error("%s: malformed Parquet file: the footer length %u at byte %zu does not fit in the %zu-byte file", path,
          flen, f->size - 8, f->size);
    goto fail;
  }
  f->footer_len = flen;
  f->footer_off = f->size - 8 - flen;
  if (!read_file_metadata(f))
    goto fail;
  return f;
fail:
  parquet_close(f);
  return NULL;
}

ParquetFile *parquet_open(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    error("cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  Buf b = {0};
  char chunk[1 << 16];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, fp)) > 0)
    buf_put(&b, chunk, got);
  bool rerr = ferror(fp);
  fclose(fp);
  if (rerr) {
    error("%s: read error: %s", path, strerror(errno));
    buf_free(&b);
    return NULL;
  }
  ParquetFile *f = calloc(1, sizeof(ParquetFile));
  ASSERT(f);
  f->path = strdup(path);
  ASSERT(f->path);
  f->data = (uint8_t *)b.data;
  f->size = b.len;
  return open_data(f);
}

ParquetFile *parquet_open_bytes(const char *name, const void *data, size_t n) {
  ParquetFile *f = calloc(1, sizeof(ParquetFile));
  ASSERT(f);
  f->path = strdup(name);
  f->data = malloc(n ? n : 1);
  ASSERT(f->path && f->data);
  if (n)
    memcpy(f->data, data, n);
  f->size = n;
  return open_data(f);
}

/* ---- Snappy --------------------------------------------------------------------------
 * The raw format: a varint of the uncompressed length, then elements, each a
 * tag byte whose low 2 bits say: 00 a literal (length - 1 in the upper 6
 * bits, or in the 1-4 bytes that follow when those say 60-63), 01 a copy of
 * 4-11 bytes from an offset of 11 bits, 10 a copy of 1-64 bytes from a
 * 16-bit offset, 11 the same from a 32-bit offset. Copies may overlap what
 * they write (offset < length repeats a pattern). */

int snappy_decode(const uint8_t *src, size_t n, uint8_t *out, size_t want, const char **why) {
  const uint8_t *p = src, *end = src + n;
  uint64_t len = 0;
  int shift = 0;
  for (;;) {
    if (p >= end || shift > 31)
      return *why = "a bad length header", -1;
    uint8_t c = *p++;
    len |= (uint64_t)(c & 0x7f) << shift;
    shift += 7;
    if (!(c & 0x80))
      break;
  }
  if (len != want)
    return *why = "its length header disagrees with the page's uncompressed size", -1;
  size_t o = 0;
  while (p < end) {
    uint8_t tag = *p++;
    size_t length, offset;
    switch (tag & 3) {
    case 0: {
      length = tag >> 2;
      if (length >= 60) {
        size_t k = length - 59;
        if ((size_t)(end - p) < k)
          return *why = "a literal's length runs past the end", -1;
        length = 0;
        for (size_t i = 0; i < k; i++)
          length |= (size_t)p[i] << (8 * i);
        p += k;
      }
      length += 1;
      if (length > (size_t)(end - p))
        return *why = "a literal runs past the end of the input", -1;
      if (length > want - o)
        return *why = "a literal runs past the uncompressed size", -1;
      memcpy(out + o, p, length);
      p += length;
      o += length;
      continue;
    }
    case 1:
      if (p >= end)
        return *why = "a copy's offset is missing", -1;
      length = 4 + ((tag >> 2) & 7);
      offset = (size_t)(tag >> 5) << 8 | *p++;
      break;
    case 2:
      if (end - p < 2)
        return *why = "a copy's offset is missing", -1;
      length = 1 + (tag >> 2);
      offset = (size_t)p[0] | (size_t)p[1] << 8;
      p += 2;
      break;
    default:
      if (end - p < 4)
        return *why = "a copy's offset is missing", -1;
      length = 1 + (tag >> 2);
      offset = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
      p += 4;
      break;
    }
    if (offset == 0 || offset > o)
      return *why = "a copy reaches before the start of the output", -1;
    if (length > want - o)
      return *why = "a copy runs past the uncompressed size", -1;
    for (size_t i = 0; i < length; i++, o++)
      out[o] = out[o - offset];
  }
  if (o != want)
    return *why = "it ends before the uncompressed size", -1;
  return 0;
}

/* ---- ZSTD, through Debian's libzstd.so.1 ---------------------------------------------------
 * Its stable ABI: ZSTD_decompress(dst, cap, src, n) returns the size written
 * or an error code that ZSTD_isError recognises. */

static struct {
  pthread_once_t once;
  size_t (*decompress)(void *, size_t, const void *, size_t);
  unsigned (*is_error)(size_t);
  const char *(*error_name)(size_t);
  char why[256];
} zstd = {PTHREAD_ONCE_INIT};

static void zstd_load(void) {
  void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(zstd.why, sizeof zstd.why, "%s", dlerror());
    return;
  }
  *(void **)&zstd.decompress = dlsym(h, "ZSTD_decompress");
  *(void **)&zstd.is_error = dlsym(h, "ZSTD_isError");
  *(void **)&zstd.error_name = dlsym(h, "ZSTD_getErrorName");
  if (!zstd.decompress || !zstd.is_error || !zstd.error_name) {
    snprintf(zstd.why, sizeof zstd.why, "libzstd.so.1 lacks ZSTD_decompress");
    zstd.decompress = NULL;
  }
}

/* ---- pages ---------------------------------------------------------------------------------- */

/* Where a column read is, for messages. */
typedef struct {
  ParquetFile *f;
  const PqColumn *col;
  int group;
  int64_t page_at; /* the page header's byte offset */
} Where;

PRINTF(2, 3) static int page_fail(const Where *w, const char *fmt, ...) {
  Buf b = {0};
  va_list ap;
  va_start(ap, fmt);
  buf_vprintf(&b, fmt, ap);
  va_end(ap);
  pq_error(w->f, "%s: column '%s', row group %d, page at byte %lld: %s", w->f->path, w->col->name, w->group,
        (long long)w->page_at, b.data);
  buf_free(&b);
  return -1;
}

/* Decompresses src[0..n) into a new buffer of exactly want bytes (a copy
 * when uncompressed). NULL with the error printed. */
static uint8_t *decompress(const Where *w, int codec, const uint8_t *src, size_t n, size_t want) {
  uint8_t *out = malloc(want ? want : 1);
  if (!out) {
    page_fail(w, "cannot allocate %zu bytes", want);
    return NULL;
  }
  const char *why = NULL;
  if (codec == CODEC_UNCOMPRESSED) {
    if (n != want)
      why = "its compressed and uncompressed sizes differ, but it is not compressed";
    else if (n)
      memcpy(out, src, n);
  } else if (codec == CODEC_SNAPPY) {
    (void)snappy_decode(src, n, out, want, &why);
  } else if (codec == CODEC_ZSTD) {
    pthread_once(&zstd.once, zstd_load);
    if (!zstd.decompress) {
      free(out);
      page_fail(w, "the page is ZSTD-compressed, and libzstd.so.1 (Debian's libzstd1) cannot be loaded: %s",
                zstd.why);
      return NULL;
    }
    size_t r = zstd.decompress(out, want, src, n);
    if (zstd.is_error(r)) {
      free(out);
      page_fail(w, "ZSTD data is corrupt: %s", zstd.error_name(r));
      return NULL;
    }
    if (r != want)
      why = "it decompresses to a size other than its header's";
  } else {
    free(out);
    page_fail(w, "the %s codec is not supported (optc reads UNCOMPRESSED, SNAPPY and ZSTD; pyarrow: "
                 "compression='snappy')", CODEC_NAME(codec));
    return NULL;
  }
  if (why) {
    free(out);
    page_fail(w, "%s data is corrupt: %s", CODEC_NAME(codec), why);
    return NULL;
  }
  return out;
}

typedef struct {
  int32_t type, uncompressed, compressed;
  bool has_type, has_uncompressed, has_compressed;
  /* v1 and dictionary */
  int32_t num_values, encoding, def_encoding;
  bool has_num_values;
  /* v2 */
  int32_t num_nulls, num_rows, def_len, rep_len;
  bool is_compressed;
} PageHeader;

static void read_data_page_header(Thrift *t, PageHeader *h, bool v2) {
  int last = 0, id, type;
  t->depth++;
  while (th_field(t, &last, &id, &type)) {
    int64_t v = 0;
    if (type == T_TRUE || type == T_FALSE) {
      if (v2 && id == 7)
        h->is_compressed = type == T_TRUE;
      continue;
    }
    if (id > (v2 ? 6 : 4)) {
      th_skip(t, type, false);
      continue;
    }
    v = th_int_field(t, type, "DataPageHeader");
    if (v < INT32_MIN || v > INT32_MAX)
      th_fail(t, "a page header field is out of range");
    int32_t x = (int32_t)v;
    if (id == 1)
      h->num_values = x, h->has_num_values = true;
    else if (!v2 && id == 2)
      h->encoding = x;
    else if (!v2 && id == 3)
      h->def_encoding = x;
    else if (v2 && id == 2)
      h->num_nulls = x;
    else if (v2 && id == 3)
      h->num_rows = x;
    else if (v2 && id == 4)
      h->encoding = x;
    else if (v2 && id == 5)
      h->def_len = x;
    else if (v2 && id == 6)
      h->rep_len = x;
  }
  t->depth--;
}

static void read_page_header(Thrift *t, PageHeader *h) {
  *h = (PageHeader){.is_compressed = true, .def_encoding = ENC_RLE};
  int last = 0, id, type;
  while (th_field(t, &last, &id, &type)) {
    switch (id) {
    case 1: h->type = (int32_t)th_int_field(t, type, "PageHeader.type"), h->has_type = true; break;
    case 2:
      h->uncompressed = (int32_t)th_int_field(t, type, "PageHeader.uncompressed_page_size");
      h->has_uncompressed = true;
      break;
    case 3:
      h->compressed = (int32_t)th_int_field(t, type, "PageHeader.compressed_page_size");
      h->has_compressed = true;
      break;
    case 5:
    case 7:
      if (th_expect(t, type, T_STRUCT, "PageHeader.data_page_header"))
        read_data_page_header(t, h, false); /* a dictionary page's fields 1, 2 are the same */
      break;
    case 8:
      if (th_expect(t, type, T_STRUCT, "PageHeader.data_page_header_v2"))
        read_data_page_header(t, h, true);
      break;
    default: th_skip(t, type, false);
    }
  }
  if (t->failed)
    return;
  if (!h->has_type || !h->has_uncompressed || !h->has_compressed)
    th_fail(t, "a page header lacks its type or sizes");
  else if (h->uncompressed < 0 || h->compressed < 0 || h->uncompressed > PQ_MAX_PAGE)
    th_fail(t, "a page header has sizes %d and %d", h->compressed, h->uncompressed);
  else if ((h->type == PAGE_DATA || h->type == PAGE_DATA_V2 || h->type == PAGE_DICTIONARY) &&
           (!h->has_num_values || h->num_values < 0))
    th_fail(t, "a page header has no valid num_values");
}

/* ---- levels and values ------------------------------------------------------------------------ */

/* The RLE/bit-packed hybrid: n values of bw bits (0..32) from [p, end).
 * A run header is a varint: (count << 1) for count repeats of one value in
 * ceil(bw/8) bytes, or (groups << 1 | 1) for groups * 8 values bit-packed
 * LSB first. Bits past the n-th value are padding. */
static int rle_decode(const Where *w, const uint8_t *p, const uint8_t *end, int bw, uint32_t *out, int64_t n,
                      const char *what) {
  int64_t i = 0;
  while (i < n) {
    uint64_t h = 0;
    int shift = 0;
    for (;;) {
      if (p >= end)
        return page_fail(w, "the %s end after %lld of %lld values", what, (long long)i, (long long)n);
      uint8_t c = *p++;
      h |= (uint64_t)(c & 0x7f) << shift;
      shift += 7;
      if (!(c & 0x80))
        break;
      if (shift > 63)
        return page_fail(w, "a bad run header in the %s", what);
    }
    if (h & 1) {
      uint64_t groups = h >> 1;
      if (groups == 0)
        return page_fail(w, "an empty bit-packed run in the %s", what);
      if (bw > 0 && groups > (uint64_t)(end - p) / (uint64_t)bw)
        return page_fail(w, "a bit-packed run of the %s runs past the page", what);
      uint64_t count = groups * 8;
      int64_t take = (int64_t)MIN(count, (uint64_t)(n - i));
      uint64_t bit = 0;
      for (int64_t k = 0; k < take; k++) {
        uint64_t v = 0;
        for (int b = 0; b < bw; b++, bit++)
          v |= (uint64_t)((p[bit >> 3] >> (bit & 7)) & 1) << b;
        out[i++] = (uint32_t)v;
      }
      p += groups * (uint64_t)bw;
    } else {
      uint64_t count = h >> 1;
      if (count == 0)
        return page_fail(w, "an empty run in the %s", what);
      int nb = (bw + 7) / 8;
      if (end - p < nb)
        return page_fail(w, "a run of the %s runs past the page", what);
      uint64_t v = 0;
      for (int b = 0; b < nb; b++)
        v |= (uint64_t)p[b] << (8 * b);
      p += nb;
      if (bw < 32 && v >> bw)
        return page_fail(w, "a run value %llu of the %s does not fit in %d bits", (unsigned long long)v, what, bw);
      int64_t take = (int64_t)MIN(count, (uint64_t)(n - i));
      for (int64_t k = 0; k < take; k++)
        out[i++] = (uint32_t)v;
    }
  }
  return 0;
}

/* A column being filled: rows [0, at) are done. */
typedef struct {
  PqValues *v;
  int64_t at;
  Buf bytes;
} Sink;

/* The dictionary: its values, PLAIN-decoded. */
typedef struct {
  int64_t n;
  int64_t *ints;
  double *reals;
  int64_t *off; /* (n + 1) into bytes */
  Buf bytes;
  bool present;
} Dict;

static void dict_free(Dict *d) {
  free(d->ints);
  free(d->reals);
  free(d->off);
  buf_free(&d->bytes);
  *d = (Dict){0};
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* PLAIN values of the column's type: k of them from [p, end), each handed
 * to put(ctx, index, int, real, bytes, len). */
typedef void (*PutFn)(void *ctx, int64_t i, int64_t iv, double rv, const uint8_t *s, size_t len);

static int plain_decode(const Where *w, PqType type, int32_t type_len, const uint8_t *p, const uint8_t *end,
                        int64_t k, PutFn put, void *ctx) {
  size_t avail = (size_t)(end - p);
  switch (type) {
  case PQ_BOOLEAN:
    if ((uint64_t)k > (uint64_t)avail * 8)
      return page_fail(w, "%lld booleans need more than the page's %zu bytes", (long long)k, avail);
    for (int64_t i = 0; i < k; i++)
      put(ctx, i, (p[i >> 3] >> (i & 7)) & 1, 0, NULL, 0);
    return 0;
  case PQ_INT32:
  case PQ_FLOAT:
    if ((uint64_t)k > avail / 4)
      return page_fail(w, "%lld 4-byte values need more than the page's %zu bytes", (long long)k, avail);
    for (int64_t i = 0; i < k; i++) {
      uint32_t u = le32(p + 4 * i);
      float fl;
      memcpy(&fl, &u, 4);
      put(ctx, i, (int32_t)u, fl, NULL, 0);
    }
    return 0;
  case PQ_INT64:
  case PQ_DOUBLE:
    if ((uint64_t)k > avail / 8)
      return page_fail(w, "%lld 8-byte values need more than the page's %zu bytes", (long long)k, avail);
    for (int64_t i = 0; i < k; i++) {
      uint64_t u = le64(p + 8 * i);
      double d;
      memcpy(&d, &u, 8);
      put(ctx, i, (int64_t)u, d, NULL, 0);
    }
    return 0;
  case PQ_BYTE_ARRAY:
    for (int64_t i = 0; i < k; i++) {
      if (end - p < 4)
        return page_fail(w, "value %lld's length runs past the page", (long long)i);
      uint32_t len = le32(p);
      p += 4;
      if (len > (uint64_t)(end - p))
        return page_fail(w, "value %lld (%u bytes) runs past the page", (long long)i, len);
      put(ctx, i, 0, 0, p, len);
      p += len;
    }
    return 0;
  case PQ_FIXED_LEN_BYTE_ARRAY:
    if (type_len < 0 || (type_len > 0 && (uint64_t)k > avail / (uint64_t)type_len))
      return page_fail(w, "%lld values of %d bytes need more than the page's %zu bytes", (long long)k, type_len, avail);
    for (int64_t i = 0; i < k; i++)
      put(ctx, i, 0, 0, p + (size_t)i * (size_t)type_len, (size_t)type_len);
    return 0;
  case PQ_INT96:
    return page_fail(w, "INT96 columns are not supported");
  }
  return page_fail(w, "unknown physical type");
}

static void put_dict(void *ctx, int64_t i, int64_t iv, double rv, const uint8_t *s, size_t len) {
  Dict *d = ctx;
  d->ints[i] = iv;
  d->reals[i] = rv;
  if (len)
    buf_put(&d->bytes, s, len);
  d->off[i + 1] = (int64_t)d->bytes.len;
}

typedef struct {
  Sink *s;
  const uint32_t *rows; /* (k) the row each value goes to, relative to s->at */
} PutRows;

static void put_row(void *ctx, int64_t i, int64_t iv, double rv, const uint8_t *s, size_t len) {
  PutRows *pr = ctx;
  int64_t r = pr->s->at + pr->rows[i];
  pr->s->v->ints[r] = iv;
  pr->s->v->reals[r] = rv;
  pr->s->v->valid[r] = true;
  if (pr->s->v->off) { /* rows come in order, so the bytes do too */
    if (len)
      buf_put(&pr->s->bytes, s, len);
    pr->s->v->off[r + 1] = (int64_t)pr->s->bytes.len;
  }
}

/* One data page's values: n slots, def[i] says which hold a value. */
static int decode_values(const Where *w, ColInfo *ci, Sink *s, const Dict *dict, int encoding, const uint8_t *p,
                         const uint8_t *end, const uint32_t *def, int64_t n) {
  const PqColumn *col = w->col;
  uint32_t *rows = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
  ASSERT(rows);
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++)
    if (!def || def[i] == (uint32_t)ci->max_def)
      rows[k++] = (uint32_t)i;
  /* BYTE_ARRAY offsets: a null row's range is empty, so each row's end is
   * set in order, values and nulls alike. */
  int rc = 0;
  PutRows pr = {s, rows};
  if (encoding == ENC_PLAIN) {
    rc = plain_decode(w, col->type, ci->type_len, p, end, k, put_row, &pr);
  } else if (encoding == ENC_PLAIN_DICTIONARY || encoding == ENC_RLE_DICTIONARY) {
    if (!dict->present) {
      rc = page_fail(w, "a dictionary-encoded page, but the column chunk has no dictionary page");
    } else if (k > 0 && p >= end) {
      rc = page_fail(w, "the dictionary indices are missing");
    } else if (k > 0) {
      int bw = *p++;
      if (bw > 32) {
        rc = page_fail(w, "dictionary index width %d is over 32 bits", bw);
      } else {
        uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)k);
        ASSERT(idx);
        rc = rle_decode(w, p, end, bw, idx, k, "dictionary indices");
        for (int64_t i = 0; i < k && rc == 0; i++) {
          if (idx[i] >= (uint64_t)dict->n) {
            rc = page_fail(w, "dictionary index %u is out of range (the dictionary has %lld values)", idx[i],
                           (long long)dict->n);
            break;
          }
          int64_t j = idx[i];
          put_row(&pr, i, dict->ints[j], dict->reals[j], (const uint8_t *)dict->bytes.data + dict->off[j],
                  (size_t)(dict->off[j + 1] - dict->off[j]));
        }
        free(idx);
      }
    }
  } else if (encoding == ENC_RLE && col->type == PQ_BOOLEAN) {
    if (end - p < 4) {
      rc = page_fail(w, "RLE booleans lack their length");
    } else {
      uint32_t len = le32(p);
      p += 4;
      if (len > (uint64_t)(end - p)) {
        rc = page_fail(w, "RLE booleans' length %u runs past the page", len);
      } else {
        uint32_t *b = malloc(sizeof(uint32_t) * (size_t)(k ? k : 1));
        ASSERT(b);
        rc = rle_decode(w, p, p + len, 1, b, k, "booleans");
        for (int64_t i = 0; i < k && rc == 0; i++)
          put_row(&pr, i, b[i], 0, NULL, 0);
        free(b);
      }
    }
  } else {
    rc = page_fail(w, "the %s encoding is not supported (optc reads PLAIN and dictionary pages)",
                   ENCODING_NAME(encoding));
  }
  /* a null's range is empty: it ends where the row before it ends */
  if (rc == 0 && s->v->off)
    for (int64_t i = 0; i < n; i++)
      if (!s->v->valid[s->at + i])
        s->v->off[s->at + i + 1] = s->v->off[s->at + i];
  free(rows);
  return rc;
}

/* ---- column chunks ----------------------------------------------------------------------------- */

static bool read_chunk_meta(ParquetFile *f, int64_t at, ChunkMeta *m, const PqColumn *col, int group) {
  Thrift t = {f->data + at, f->data + f->footer_off + f->footer_len, f->data, f->path, "column metadata",
              .pf = f};
  *m = (ChunkMeta){.dict_off = -1};
  int last = 0, id, type;
  while (th_field(&t, &last, &id, &type)) {
    switch (id) {
    case 1: m->type = (int32_t)th_int_field(&t, type, "ColumnMetaData.type"), m->has_type = true; break;
    case 4: m->codec = (int32_t)th_int_field(&t, type, "ColumnMetaData.codec"), m->has_codec = true; break;
    case 5: m->num_values = th_int_field(&t, type, "ColumnMetaData.num_values"), m->has_num_values = true; break;
    case 7: m->total_compressed = th_int_field(&t, type, "ColumnMetaData.total_compressed_size"), m->has_total = true;
      break;
    case 9: m->data_off = th_int_field(&t, type, "ColumnMetaData.data_page_offset"), m->has_data_off = true; break;
    case 11: m->dict_off = th_int_field(&t, type, "ColumnMetaData.dictionary_page_offset"); break;
    default: th_skip(&t, type, false);
    }
  }
  if (t.failed)
    return false;
  if (!m->has_type || !m->has_codec || !m->has_num_values || !m->has_total || !m->has_data_off) {
    pq_error(f, "%s: malformed Parquet footer: column '%s' in row group %d lacks a required field", f->path, col->name,
          group);
    return false;
  }
  if (m->type != (int32_t)col->type) {
    pq_error(f, "%s: malformed Parquet footer: column '%s' in row group %d is %s, but the schema says %s", f->path,
          col->name, group, name_of(pq_type_names, ARRAY_LEN(pq_type_names), m->type),
          name_of(pq_type_names, ARRAY_LEN(pq_type_names), col->type));
    return false;
  }
  return true;
}

/* Reads one column chunk into rows [s->at, s->at + rows) of the sink. */
static int read_chunk(ParquetFile *f, int c, int g, Sink *s) {
  ColInfo *ci = &f->info[c];
  const PqColumn *col = &f->cols[c];
  ChunkMeta m;
  if (!read_chunk_meta(f, f->groups[g].chunk_meta[ci->leaf], &m, col, g))
    return -1;
  Where w = {f, col, g, -1};
  int64_t rows = f->groups[g].num_rows;
  if (m.num_values != rows) {
    pq_error(f, "%s: column '%s' in row group %d has %lld values for %lld rows", f->path, col->name, g,
          (long long)m.num_values, (long long)rows);
    return -1;
  }
  int64_t start = m.dict_off > 0 && m.dict_off < m.data_off ? m.dict_off : m.data_off;
  int64_t data_end = (int64_t)f->footer_off; /* pages lie between the magic and the footer */
  if (start < 4 || start >= data_end || m.total_compressed < 0 || m.total_compressed > data_end - start) {
    pq_error(f, "%s: column '%s' in row group %d: its pages (byte %lld, %lld bytes) are outside the file's data "
          "(bytes 4 to %lld)", f->path, col->name, g, (long long)start, (long long)m.total_compressed,
          (long long)data_end);
    return -1;
  }
  const uint8_t *pos = f->data + start, *end = pos + m.total_compressed;
  Dict dict = {0};
  int64_t done = 0;
  int rc = 0;
  uint32_t *def = NULL;
  while (done < rows && rc == 0) {
    w.page_at = pos - f->data;
    if (pos >= end) {
      rc = page_fail(&w, "the column chunk ends after %lld of its %lld values", (long long)done, (long long)rows);
      break;
    }
    Thrift t = {pos, end, f->data, f->path, "page header", .pf = f};
    PageHeader h;
    read_page_header(&t, &h);
    if (t.failed) {
      rc = -1;
      break;
    }
    const uint8_t *body = t.p;
    if (h.compressed > end - body) {
      rc = page_fail(&w, "the page's %d bytes run past its column chunk", h.compressed);
      break;
    }
    pos = body + h.compressed;
    if (h.type == PAGE_INDEX)
      continue;
    if (h.type == PAGE_DICTIONARY) {
      if (dict.present || done > 0) {
        rc = page_fail(&w, "a second dictionary page, or one after the data");
        break;
      }
      if (h.encoding != ENC_PLAIN && h.encoding != ENC_PLAIN_DICTIONARY) {
        rc = page_fail(&w, "a dictionary page in the %s encoding", ENCODING_NAME(h.encoding));
        break;
      }
      uint8_t *raw = decompress(&w, m.codec, body, (size_t)h.compressed, (size_t)h.uncompressed);
      if (!raw) {
        rc = -1;
        break;
      }
      if ((int64_t)h.num_values > (int64_t)h.uncompressed * 8 + 8) {
        free(raw);
        rc = page_fail(&w, "a dictionary of %d values in %d bytes", h.num_values, h.uncompressed);
        break;
      }
      dict.n = h.num_values;
      dict.ints = calloc((size_t)dict.n + 1, sizeof(int64_t));
      dict.reals = calloc((size_t)dict.n + 1, sizeof(double));
      dict.off = calloc((size_t)dict.n + 1, sizeof(int64_t));
      ASSERT(dict.ints && dict.reals && dict.off);
      dict.present = true;
      rc = plain_decode(&w, col->type, ci->type_len, raw, raw + h.uncompressed, dict.n, put_dict, &dict);
      free(raw);
      continue;
    }
    if (h.type != PAGE_DATA && h.type != PAGE_DATA_V2) {
      rc = page_fail(&w, "unknown page type %d", h.type);
      break;
    }
    int64_t n = h.num_values;
    if (n > rows - done) {
      rc = page_fail(&w, "the page holds %lld values, more than the %lld rows left in the row group", (long long)n,
                     (long long)(rows - done));
      break;
    }
    const uint8_t *vals, *vend;
    uint8_t *raw = NULL;
    free(def);
    def = ci->max_def ? malloc(sizeof(uint32_t) * (size_t)(n ? n : 1)) : NULL;
    if (h.type == PAGE_DATA) {
      raw = decompress(&w, m.codec, body, (size_t)h.compressed, (size_t)h.uncompressed);
      if (!raw) {
        rc = -1;
        break;
      }
      vals = raw;
      vend = raw + h.uncompressed;
      if (ci->max_def) {
        if (h.def_encoding != ENC_RLE) {
          free(raw);
          rc = page_fail(&w, "definition levels in the %s encoding (optc reads RLE)", ENCODING_NAME(h.def_encoding));
          break;
        }
        if (vend - vals < 4) {
          free(raw);
          rc = page_fail(&w, "the definition levels lack their length");
          break;
        }
        uint32_t len = le32(vals);
        vals += 4;
        if (len > (uint64_t)(vend - vals)) {
          free(raw);
          rc = page_fail(&w, "the definition levels' length %u runs past the page", len);
          break;
        }
        rc = rle_decode(&w, vals, vals + len, 1, def, n, "definition levels");
        vals += len;
      }
    } else {
      if (h.rep_len != 0 || h.def_len < 0 || h.def_len > h.compressed || (!ci->max_def && h.def_len != 0) ||
          h.def_len > h.uncompressed) {
        rc = page_fail(&w, "bad level lengths (repetition %d, definition %d) for a flat column", h.rep_len, h.def_len);
        break;
      }
      if (ci->max_def)
        rc = rle_decode(&w, body, body + h.def_len, 1, def, n, "definition levels");
      if (rc)
        break;
      size_t cn = (size_t)(h.compressed - h.def_len), un = (size_t)(h.uncompressed - h.def_len);
      raw = decompress(&w, h.is_compressed ? m.codec : CODEC_UNCOMPRESSED, body + h.def_len, cn, un);
      if (!raw) {
        rc = -1;
        break;
      }
      vals = raw;
      vend = raw + un;
    }
    if (rc == 0 && def)
      for (int64_t i = 0; i < n && rc == 0; i++)
        if (def[i] > (uint32_t)ci->max_def)
          rc = page_fail(&w, "definition level %u is over the column's maximum %d", def[i], ci->max_def);
    if (rc == 0)
      rc = decode_values(&w, ci, s, &dict, h.encoding, vals, vend, def, n);
    free(raw);
    s->at += n;
    done += n;
  }
  free(def);
  dict_free(&dict);
  return rc;
}

int parquet_read_column(ParquetFile *f, int c, PqValues *out) {
  ASSERT(c >= 0 && c < f->ncols);
  *out = (PqValues){0};
  const PqColumn *col = &f->cols[c];
  if (col->nested) {
    pq_error(f, "%s: column '%s' is nested (a list or a struct); optc reads flat columns only", f->path, col->name);
    return -1;
  }
  int64_t n = f->num_rows;
  out->n = n;
  out->valid = calloc((size_t)n + 1, sizeof(bool));
  out->ints = calloc((size_t)n + 1, sizeof(int64_t));
  out->reals = calloc((size_t)n + 1, sizeof(double));
  ASSERT(out->valid && out->ints && out->reals);
  Sink s = {out, 0, {0}};
  if (col->type == PQ_BYTE_ARRAY || col->type == PQ_FIXED_LEN_BYTE_ARRAY) {
    out->off = calloc((size_t)n + 1, sizeof(int64_t));
    ASSERT(out->off);
  }
  for (int g = 0; g < f->ngroups; g++) {
    int64_t at = s.at;
    if (read_chunk(f, c, g, &s) != 0) {
      buf_free(&s.bytes);
      pq_values_free(out);
      return -1;
    }
    ASSERT(s.at == at + f->groups[g].num_rows);
  }
  buf_putc(&s.bytes, 0);
  out->bytes = s.bytes.data;
  return 0;
}

void pq_values_free(PqValues *v) {
  free(v->valid);
  free(v->ints);
  free(v->reals);
  free(v->off);
  free(v->bytes);
  *v = (PqValues){0};
}
