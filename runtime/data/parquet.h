/* parquet.h: a reader for the flat Parquet files datasets are kept in (one
 * row per sample; string, integer, float and bool columns), as Hugging Face
 * and pyarrow write them.
 *
 * What it reads:
 * - the footer: Thrift compact-protocol FileMetaData (schema, row groups,
 *   column chunks), and each page's PageHeader;
 * - top-level primitive columns, REQUIRED or OPTIONAL (definition levels in
 *   the RLE/bit-packed hybrid); a column inside a list or struct is listed
 *   (nested) but reading it is an error;
 * - types BOOLEAN, INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY;
 * - encodings PLAIN, PLAIN_DICTIONARY and RLE_DICTIONARY (a dictionary page
 *   first), and RLE for booleans;
 * - data pages v1 and v2, any number of row groups and pages;
 * - codecs UNCOMPRESSED, SNAPPY (decoded here) and ZSTD (Debian's
 *   libzstd.so.1, opened with dlopen when a ZSTD page is first met, so
 *   building needs no zstd headers).
 * Anything else (GZIP, encryption, other encodings) is a clear error.
 *
 * Every length, offset and count in the file is checked against the bytes
 * that are there: a truncated or malformed file is an error naming the file
 * and the byte offset, never a crash. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

typedef enum {
  PQ_BOOLEAN,
  PQ_INT32,
  PQ_INT64,
  PQ_INT96,
  PQ_FLOAT,
  PQ_DOUBLE,
  PQ_BYTE_ARRAY,
  PQ_FIXED_LEN_BYTE_ARRAY,
} PqType;

/* A top-level field of the schema. */
typedef struct {
  const char *name;
  PqType type;   /* when !nested */
  bool optional; /* may hold nulls */
  bool nested;   /* a group or a repeated field: not readable here */
  bool text;     /* BYTE_ARRAY annotated STRING, ENUM or JSON (else raw bytes) */
} PqColumn;

typedef struct ParquetFile ParquetFile;

/* ---- parquet.c ----------------------------------------------------------------
 * Reads path whole and parses its footer. NULL, with `optc: error: PATH: ...`
 * printed, on any mistake. The caller frees with parquet_close. */
ParquetFile *parquet_open(const char *path);
/* The same from n bytes in memory (copied), named `name` in messages. */
ParquetFile *parquet_open_bytes(const char *name, const void *data, size_t n);
void parquet_close(ParquetFile *f);
int64_t parquet_num_rows(const ParquetFile *f);
int parquet_num_columns(const ParquetFile *f);
const PqColumn *parquet_column(const ParquetFile *f, int i);
/* The index of the top-level column called name, or -1. */
int parquet_find_column(const ParquetFile *f, const char *name);

/* One column, all row groups in order: value i is row i's. malloc'd; the
 * owner calls pq_values_free. */
typedef struct {
  int64_t n;      /* rows */
  bool *valid;    /* (n) false: null */
  int64_t *ints;  /* (n) BOOLEAN (0, 1), INT32, INT64 */
  double *reals;  /* (n) FLOAT, DOUBLE */
  int64_t *off;   /* (n + 1) BYTE_ARRAY: row i is bytes[off[i] .. off[i+1]) (empty when null) */
  char *bytes;
} PqValues;

/* Reads column col (not nested) into out. 0, or -1 with the error printed
 * (`optc: error: PATH: column NAME, row group G, page at byte B: ...`). */
int parquet_read_column(ParquetFile *f, int col, PqValues *out);
void pq_values_free(PqValues *v);
/* From now on parquet_read_column's messages are appended to sink (one per
 * line) instead of printed; NULL prints them again. */
void parquet_quiet(ParquetFile *f, Buf *sink);

/* Snappy's raw block format (what Parquet's SNAPPY pages hold): decodes
 * src[0..n) into out, which must come to exactly want bytes. 0, or -1 with
 * *why set to a static message. For tests. */
int snappy_decode(const uint8_t *src, size_t n, uint8_t *out, size_t want, const char **why);
