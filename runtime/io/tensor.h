/* tensor.h: named host tensors and the safetensors files that hold them.
 * A checkpoint, an optimizer state or a test's inputs is a TensorFile: an
 * ordered list of tensors plus string metadata, read and written whole. */
#pragma once
#include "base.h" /* Type, type_size */

#define TENSOR_MAX_DIMS 8

typedef struct {
  char *name; /* malloc'd */
  Type dtype; /* TY_F64, TY_F32, TY_BF16, TY_F16, TY_I64, TY_I32 or TY_BOOL */
  int ndim;   /* 0 for a scalar */
  int64_t shape[TENSOR_MAX_DIMS];
  int64_t numel; /* product of shape[0..ndim); 1 for a scalar */
  void *data;    /* (numel * type_size(dtype)) bytes, row-major, 64-byte
                    aligned, owned by the tensor; never NULL */
} Tensor;

typedef struct {
  Tensor *tensors; /* in data order (reader) or insertion order (writer) */
  int n, cap;
  char **meta_keys, **meta_vals; /* "__metadata__": string -> string, in order */
  int nmeta, capmeta;
} TensorFile;

/* ---- safetensors.c: files -------------------------------------------------- */

/* Reads a safetensors file into *out (whose old contents are not freed: pass
 * a zeroed or freed TensorFile). Tensors come in the order their data lies in
 * the file. Returns 0; or -1 with one error printed, naming the file, the
 * tensor when there is one, and the problem, and *out left zeroed.
 * The caller frees *out with tf_free. */
int st_read(const char *path, TensorFile *out);

/* Writes tf atomically (PATH.tmp.PID, fsync, rename), tensors in order, the
 * header padded with spaces so that the data starts 8-byte aligned. Returns
 * 0, or -1 with one error printed and path untouched. */
int st_write(const char *path, const TensorFile *tf);

/* ---- safetensors.c: a file's header, its data on demand --------------------
 * For checkpoints larger than memory: st_open reads and checks the header
 * (every check st_read makes, data layout included) and keeps the file
 * open; st_read_at copies any byte range of one tensor to the caller's
 * memory, so a tensor can go straight to where it lives. */
typedef struct {
  char *name; /* malloc'd */
  Type dtype;
  int ndim;
  int64_t shape[TENSOR_MAX_DIMS];
  int64_t numel, nbytes;
  int64_t begin; /* where its data starts, from the start of the file */
} StEntry;

typedef struct {
  char *path; /* malloc'd copy, for messages */
  FILE *f;
  int64_t file_size;
  StEntry *entries; /* (n) in data order */
  int n;
  TensorFile meta; /* "__metadata__" only: no tensors */
} StFile;

/* Opens path and reads its header into *out. Returns 0; or -1 with one
 * error printed (as st_read prints them) and *out zeroed. The caller
 * closes with st_close. */
int st_open(const char *path, StFile *out);
/* Reads n bytes of entry i's data, from byte off of it, into dst. 0, or -1
 * with an error naming the file and the tensor (a short read: the file
 * changed after st_open). */
int st_read_at(const StFile *f, int i, int64_t off, int64_t n, void *dst);
/* The index of the entry called name, or -1. Linear in f->n. */
int st_find(const StFile *f, const char *name);
void st_close(StFile *f);

/* ---- safetensors.c: writing tensors it does not own -------------------------- */
/* One tensor to write: its bytes at data, or, when src is set, the bytes of
 * entry src_index of an open file (a tensor passed through unchanged, read
 * and written a few MB at a time; the caller has matched dtype and shape),
 * or, when fill is set, what fill writes to f: exactly the tensor's bytes
 * (tensors that arrive in pieces, such as the slices of other ranks), 0 or
 * -1 when it could not. */
typedef struct StView {
  const char *name;
  Type dtype;
  int ndim;
  int64_t shape[TENSOR_MAX_DIMS];
  const void *data;
  const StFile *src;
  int src_index; /* with src: its entry; with fill: fill's own number for this tensor */
  int (*fill)(void *ctx, const struct StView *v, FILE *f);
  void *fill_ctx;
} StView;

/* Writes the n tensors in order, as st_write does (atomically; the same
 * checks first), with metadata meta[2k] = meta[2k + 1] for k < nmeta. */
int st_write_views(const char *path, const StView *v, int n, const char *const *meta, int nmeta);

/* ---- safetensors.c: tensor files in memory ---------------------------------- */

/* Frees every name, buffer and array, and leaves *tf zeroed. */
void tf_free(TensorFile *tf);

/* The tensor called name, or NULL. Linear in tf->n. */
Tensor *tf_find(const TensorFile *tf, const char *name);

/* Appends a tensor with zeroed data; the name is copied. Returns NULL, with an
 * error printed, if the name is taken, the dtype or shape is invalid, or the
 * data cannot be allocated. The pointer is valid until the next tf_add. */
Tensor *tf_add(TensorFile *tf, const char *name, Type dtype, int ndim, const int64_t *shape);

/* Adds key = value, or replaces the value of an existing key in place.
 * Both strings are copied. */
void tf_set_meta(TensorFile *tf, const char *key, const char *value);

/* The value of key, or NULL. */
const char *tf_get_meta(const TensorFile *tf, const char *key);

/* ---- safetensors.c: dtypes ------------------------------------------------- */

/* The safetensors name of t ("F32", "BF16", "BOOL", ...), or NULL for a type
 * that has none (TY_VOID). */
const char *st_dtype_name(Type t);

/* Looks up a safetensors dtype name; false for one optc does not support. */
bool st_dtype_from_name(const char *s, Type *out);

/* Bytes of data: numel * type_size(dtype). */
int64_t tensor_nbytes(const Tensor *t);
