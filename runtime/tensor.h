/* tensor.h: named host tensors and the safetensors files that hold them.
 * A checkpoint, an optimizer state or a test's inputs is a TensorFile: an
 * ordered list of tensors plus string metadata, read and written whole. */
#pragma once
#include "../compiler/ir.h" /* Type, type_size, base.h */

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
