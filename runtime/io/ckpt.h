/* ckpt.h: HF checkpoint directories of safetensors files (tensor.h), read
 * and written as torchtune's FullModelHFCheckpointer does. */
#pragma once
#include "tensor.h"

/* ---- ckpt.c: HF checkpoint directories (torchtune's FullModelHFCheckpointer) ---------------------
 * config.json, one model.safetensors or model-NNNNN-of-NNNNN.safetensors
 * shards with model.safetensors.index.json; read shard by shard straight
 * into the caller's buffers, written in huggingface_hub's shards. */

/* huggingface_hub's split_state_dict_into_shards_factory: tensors in order
 * fill a shard until the next would take it past max; a tensor over max is
 * a shard of its own, numbered when met, ahead of the shard being filled.
 * Sets shard_of[i] (from 0) and returns the shard count. */
int ckpt_plan_shards(const int64_t *nbytes, int n, int64_t max, int *shard_of);
/* model.safetensors when n == 1, else model-%05d-of-%05d.safetensors (k from 0). */
void ckpt_shard_name(int k, int n, char *buf, size_t len);

/* A checkpoint directory's shards, headers read, files open. */
typedef struct {
  const char *name; /* an StFile entry's */
  int file, entry;
} CkptName;

typedef struct {
  char *dir;
  StFile *files;
  int nfiles;
  CkptName *names; /* (nnames) every tensor, sorted by name */
  int nnames;
  bool indexed; /* model.safetensors.index.json was read and checked */
} CkptDir;

/* Opens dir's files (nfiles == 0: the index's, else model.safetensors,
 * else model-*-of-*.safetensors) and checks the index, when there is one,
 * against their headers. 0, or -1 with an error naming the file and the
 * tensor. The caller closes with ckpt_dir_close. */
int ckpt_dir_open(CkptDir *d, const char *dir, const char *const *files, int nfiles);
/* The same for one safetensors file, with no index (optimizer.safetensors). */
int ckpt_file_open(CkptDir *d, const char *path);
void ckpt_dir_close(CkptDir *d);
const StEntry *ckpt_dir_find(const CkptDir *d, const char *name, int *file, int *entry);

/* A tensor to load: elements [lo, hi) of it, converted to dtype, land at
 * dst + lo elements (dst is where element 0 would be). */
typedef struct {
  const char *name;
  int ndim;
  const int64_t *shape;
  Type dtype;
  void *dst;
  int64_t lo, hi;
} CkptWant;

/* Checks every want against the headers (missing, mis-shaped, not a float
 * dtype) and every tensor under own_prefix (NULL: all) against the wants
 * (unexpected), printing each problem with its file; then reads the data
 * file by file, front to back. 0, or -1. */
int ckpt_dir_load(const CkptDir *d, const CkptWant *w, int n, const char *own_prefix);
/* The tensors of d not under own_prefix (NULL: none), as views copying
 * from d's open files; fills out when not NULL and returns the count. */
int ckpt_dir_others(const CkptDir *d, const char *own_prefix, StView *out);

/* Writes v to dir in shards of max_shard bytes (ckpt_plan_shards), each
 * with {"format": "pt"}, and the index when there are several. */
int ckpt_write_model(const char *dir, const StView *v, int n, int64_t max_shard, int *nshards);
/* torchtune's copy_files: what src holds but weights, dotfiles and files
 * over 100 MiB, copied to dst (files already there are kept). */
int ckpt_copy_files(const char *src, const char *dst);
/* Renames the complete directory tmp to final; a final already there is
 * swapped out in one rename and removed. */
int ckpt_commit_dir(const char *tmp, const char *final);
/* Removes the .step_N.tmp.PID directories (and latest.tmp.PID files) of
 * writers no longer running: killed mid-save, whether gone, a zombie nobody
 * reaped, or a pid since reused by a process younger than the entry. */
int ckpt_clean_stale(const char *out_dir);
/* Removes all but the keep newest step_N directories of out_dir (and never
 * the one `latest` names), each renamed to a hidden .step_N.tmp.PID first, so
 * that a kill mid-removal leaves nothing ckpt_clean_stale does not remove. */
int ckpt_prune(const char *out_dir, long keep);
int ckpt_remove_tree(const char *path);
/* Frees n malloc'd strings and the array. */
void ckpt_strings_free(char **s, int n);
