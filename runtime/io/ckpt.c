/* ckpt.c: Hugging Face checkpoint directories, as torchtune's
 * FullModelHFCheckpointer reads them and huggingface_hub's
 * save_torch_state_dict (which it calls) writes them.
 *
 *   DIR/config.json                      the model (Llama4TextConfig, or a
 *                                        Llama4Config with it under text_config)
 *   DIR/model.safetensors                one shard, when the weights fit in one
 *   DIR/model-00001-of-0000N.safetensors ...or N shards of <= max_shard_size
 *   DIR/model.safetensors.index.json     {"metadata": {"total_size": BYTES},
 *                                         "weight_map": {NAME: SHARD, ...}}
 *
 * Reading streams: every shard's header is read and checked first (the
 * names, dtypes and shapes against the model's, the index against the
 * headers), then each tensor's bytes go from its file straight to where
 * the caller keeps it, one file after another; memory beyond the caller's
 * buffers is a few MB of conversion scratch, whatever the shard size.
 *
 * Writing: each file under a temporary name, renamed when complete, into a
 * hidden temporary directory that is renamed to step_N when everything is
 * in it (ckpt_commit_dir). */
#include "ckpt.h"

#include "numerics.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME "model.safetensors.index.json"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void ckpt_strings_free(char **s, int n) {
  for (int i = 0; i < n; i++)
    free(s[i]);
  free(s);
}

/* "[2, 3]" */
static void put_shape(Buf *b, int ndim, const int64_t *shape) {
  buf_putc(b, '[');
  for (int i = 0; i < ndim; i++)
    buf_printf(b, "%s%lld", i ? ", " : "", (long long)shape[i]);
  buf_putc(b, ']');
}

/* ---- shards: huggingface_hub's split_state_dict_into_shards_factory ---------------------------- */

int ckpt_plan_shards(const int64_t *nbytes, int n, int64_t max, int *shard_of) {
  /* hub appends to shard_list: a tensor over max at once, as a shard of
   * its own; the shard being filled when the next tensor would take it
   * past max, and at the end. A shard's number is its place in that list,
   * known for a filled shard only when it closes. */
  int *number = malloc(sizeof(int) * ((size_t)n + 1)); /* open shard k -> its number */
  bool *alone = calloc((size_t)n + 1, sizeof(bool));
  ASSERT(number && alone);
  int nshards = 0, open = -1, nopen = 0;
  int64_t size = 0;
  for (int i = 0; i < n; i++) {
    if (nbytes[i] > max) {
      shard_of[i] = nshards++;
      alone[i] = true;
      continue;
    }
    if (open >= 0 && size + nbytes[i] > max) {
      number[open] = nshards++;
      open = -1;
    }
    if (open < 0) {
      open = nopen++;
      size = 0;
    }
    shard_of[i] = open;
    size += nbytes[i];
  }
  if (open >= 0)
    number[open] = nshards++;
  for (int i = 0; i < n; i++)
    if (!alone[i])
      shard_of[i] = number[shard_of[i]];
  free(number);
  free(alone);
  return nshards;
}

void ckpt_shard_name(int k, int n, char *buf, size_t len) {
  if (n == 1)
    snprintf(buf, len, "model.safetensors");
  else
    snprintf(buf, len, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/* ---- reading a checkpoint directory ---------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp(((const CkptName *)a)->name, ((const CkptName *)b)->name);
}

static const CkptName *lookup(const CkptDir *d, const char *name) {
  CkptName key = {.name = name};
  return bsearch(&key, d->names, (size_t)d->nnames, sizeof(CkptName), by_name);
}

/* A shard's name as the index has it, without the directory. */
static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* {"metadata": {...}, "weight_map": {NAME: FILE, ...}}: the file of each
 * name, as a JSON object owned by the caller. */
static json_t *read_index(const char *path) {
  json_error_t je;
  json_t *idx = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!idx) {
    error("%s:%d:%d: %s", path, je.line, je.column, je.text);
    return NULL;
  }
  json_t *wm = json_object_get(idx, "weight_map");
  if (!json_is_object(wm)) {
    error("%s: no \"weight_map\" object (HF's index maps each tensor to its shard)", path);
    json_decref(idx);
    return NULL;
  }
  const char *k;
  json_t *v;
  json_object_foreach(wm, k, v) {
    if (!json_is_string(v) || !json_string_length(v) || strchr(json_string_value(v), '/')) {
      error("%s: weight_map['%s'] is not a file name", path, k);
      json_decref(idx);
      return NULL;
    }
  }
  json_incref(wm);
  json_decref(idx);
  return wm;
}

/* The files of a directory with no list given: the index's, else
 * model.safetensors, else model-NNNNN-of-NNNNN.safetensors (what optc
 * wrote before it sharded). */
static int default_files(const char *dir, const json_t *wm, char ***out, int *n) {
  *out = NULL;
  *n = 0;
  int cap = 0;
  if (wm) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
      bool dup = false;
      for (int i = 0; i < *n && !dup; i++)
        dup = strcmp((*out)[i], json_string_value(v)) == 0;
      if (dup)
        continue;
      if (*n == cap) {
        cap = cap ? 2 * cap : 16;
        *out = realloc(*out, sizeof(char *) * (size_t)cap);
        ASSERT(*out);
      }
      (*out)[(*n)++] = xstrdup(json_string_value(v));
    }
  } else {
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (access(p, F_OK) == 0) {
      *out = malloc(sizeof(char *));
      ASSERT(*out);
      (*out)[(*n)++] = xstrdup("model.safetensors");
      return 0;
    }
    DIR *dd = opendir(dir);
    if (!dd) {
      error("cannot open the checkpoint directory '%s': %s", dir, strerror(errno));
      return -1;
    }
    for (struct dirent *e; (e = readdir(dd));) {
      int a, b, len = 0;
      if (sscanf(e->d_name, "model-%5d-of-%5d.safetensors%n", &a, &b, &len) == 2 && len == (int)strlen(e->d_name)) {
        if (*n == cap) {
          cap = cap ? 2 * cap : 16;
          *out = realloc(*out, sizeof(char *) * (size_t)cap);
          ASSERT(*out);
        }
        (*out)[(*n)++] = xstrdup(e->d_name);
      }
    }
    closedir(dd);
    if (*n == 0) {
      error("%s: no model.safetensors, " INDEX_NAME " or model-NNNNN-of-NNNNN.safetensors", dir);
      return -1;
    }
  }
  qsort(*out, (size_t)*n, sizeof(char *), cmp_str);
  return 0;
}

/* The index against the headers: every name it maps is in the file it
 * names, and every name a header has is mapped to that file. */
static int check_index(const CkptDir *d, const json_t *wm, const char *ipath) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)wm, k, v) {
    const char *file = json_string_value(v);
    int f = -1;
    for (int i = 0; i < d->nfiles && f < 0; i++)
      if (strcmp(base_name(d->files[i].path), file) == 0)
        f = i;
    if (f < 0) {
      error("%s: tensor '%s' is in '%s', which checkpoint_files does not list", ipath, k, file);
      return -1;
    }
    const CkptName *e = lookup(d, k);
    if (!e || e->file != f) {
      if (e)
        error("%s: tensor '%s' is in %s, but the index says %s", ipath, k, base_name(d->files[e->file].path), file);
      else
        error("%s: tensor '%s' should be in %s, which has no such tensor", ipath, k, file);
      return -1;
    }
  }
  for (int i = 0; i < d->nnames; i++) {
    if (!json_object_get(wm, d->names[i].name)) {
      error("%s: tensor '%s' is not in %s", d->files[d->names[i].file].path, d->names[i].name, ipath);
      return -1;
    }
  }
  return 0;
}

int ckpt_dir_open(CkptDir *d, const char *dir, const char *const *files, int nfiles) {
  memset(d, 0, sizeof *d);
  d->dir = xstrdup(dir);
  char ipath[4200];
  snprintf(ipath, sizeof ipath, "%s/" INDEX_NAME, dir);
  json_t *wm = NULL;
  if (access(ipath, F_OK) == 0 && !(wm = read_index(ipath)))
    goto fail;
  d->indexed = wm != NULL;
  char **names = NULL;
  int n = 0;
  if (nfiles == 0) {
    if (default_files(dir, wm, &names, &n) != 0)
      goto fail;
    files = (const char *const *)names;
    nfiles = n;
  }
  d->files = calloc((size_t)nfiles + 1, sizeof(StFile));
  ASSERT(d->files);
  int total = 0;
  for (int i = 0; i < nfiles; i++) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    if (st_open(p, &d->files[i]) != 0) {
      ckpt_strings_free(names, n);
      goto fail;
    }
    d->nfiles++;
    total += d->files[i].n;
  }
  ckpt_strings_free(names, n);
  d->names = calloc((size_t)total + 1, sizeof(CkptName));
  ASSERT(d->names);
  for (int f = 0; f < d->nfiles; f++)
    for (int i = 0; i < d->files[f].n; i++)
      d->names[d->nnames++] = (CkptName){d->files[f].entries[i].name, f, i};
  qsort(d->names, (size_t)d->nnames, sizeof(CkptName), by_name);
  for (int i = 1; i < d->nnames; i++)
    if (strcmp(d->names[i].name, d->names[i - 1].name) == 0) {
      error("%s: tensor '%s' is in both %s and %s", dir, d->names[i].name,
            base_name(d->files[d->names[i - 1].file].path), base_name(d->files[d->names[i].file].path));
      goto fail;
    }
  if (wm && check_index(d, wm, ipath) != 0)
    goto fail;
  json_decref(wm);
  return 0;
fail:
  json_decref(wm);
  ckpt_dir_close(d);
  return -1;
}

int ckpt_file_open(CkptDir *d, const char *path) {
  memset(d, 0, sizeof *d);
  const char *slash = strrchr(path, '/');
  d->dir = slash ? strndup(path, (size_t)(slash - path)) : xstrdup(".");
  ASSERT(d->dir);
  d->files = calloc(1, sizeof(StFile));
  ASSERT(d->files);
  if (st_open(path, &d->files[0]) != 0) {
    ckpt_dir_close(d);
    return -1;
  }
  d->nfiles = 1;
  d->names = calloc((size_t)d->files[0].n + 1, sizeof(CkptName));
  ASSERT(d->names);
  for (int i = 0; i < d->files[0].n; i++)
    d->names[d->nnames++] = (CkptName){d->files[0].entries[i].name, 0, i};
  /* st_open refuses a name twice in one header */
  qsort(d->names, (size_t)d->nnames, sizeof(CkptName), by_name);
  return 0;
}

void ckpt_dir_close(CkptDir *d) {
  for (int i = 0; i < d->nfiles; i++)
    st_close(&d->files[i]);
  free(d->files);
  free(d->names);
  free(d->dir);
  memset(d, 0, sizeof *d);
}

const StEntry *ckpt_dir_find(const CkptDir *d, const char *name, int *file, int *entry) {
  const CkptName *e = lookup(d, name);
  if (!e)
    return NULL;
  if (file)
    *file = e->file;
  if (entry)
    *entry = e->entry;
  return &d->files[e->file].entries[e->entry];
}

static bool owned(const char *name, const char *prefix) { return !prefix || strncmp(name, prefix, strlen(prefix)) == 0; }

int ckpt_dir_others(const CkptDir *d, const char *own_prefix, StView *out) {
  int n = 0;
  if (!own_prefix)
    return 0;
  for (int f = 0; f < d->nfiles; f++)
    for (int i = 0; i < d->files[f].n; i++) {
      const StEntry *e = &d->files[f].entries[i];
      if (owned(e->name, own_prefix))
        continue;
      if (out) {
        out[n] = (StView){.name = e->name, .dtype = e->dtype, .ndim = e->ndim, .src = &d->files[f], .src_index = i};
        memcpy(out[n].shape, e->shape, sizeof e->shape);
      }
      n++;
    }
  return n;
}

/* ---- converting while reading ------------------------------------------------------------------------ */

static bool is_float(Type t) { return t == TY_F32 || t == TY_BF16 || t == TY_F16 || t == TY_F64; }

/* n elements of type s at src to type t at dst: widening is exact, and
 * narrowing rounds to nearest even once (from f64, through f32), as
 * torch's .to(dtype) does for the weights a recipe loads in its dtype. */
static void convert(Type t, void *dst, Type s, const void *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double x;
    switch (s) {
    case TY_F32: x = ((const float *)src)[i]; break;
    case TY_BF16: x = optc_bf16_to_f32(((const uint16_t *)src)[i]); break;
    case TY_F16: x = optc_f16_to_f32(((const uint16_t *)src)[i]); break;
    case TY_F64: x = ((const double *)src)[i]; break;
    default: unreachable();
    }
    switch (t) {
    case TY_F32: ((float *)dst)[i] = (float)x; break;
    case TY_BF16: ((uint16_t *)dst)[i] = optc_f32_to_bf16((float)x); break;
    case TY_F16: ((uint16_t *)dst)[i] = optc_f32_to_f16((float)x); break;
    case TY_F64: ((double *)dst)[i] = x; break;
    default: unreachable();
    }
  }
}

enum { CONVERT_ELEMS = 1 << 20 }; /* elements converted per read: 8 MB of f64 at most */

/* Elements [w->lo, w->hi) of the tensor at file f's entry i into w->dst. */
static int load_one(const StFile *f, int i, const CkptWant *w, void *scratch) {
  const StEntry *e = &f->entries[i];
  int64_t ss = type_size(e->dtype), ds = type_size(w->dtype);
  if (e->dtype == w->dtype)
    return st_read_at(f, i, w->lo * ss, (w->hi - w->lo) * ss, (char *)w->dst + w->lo * ds);
  for (int64_t at = w->lo; at < w->hi; at += CONVERT_ELEMS) {
    int64_t m = MIN((int64_t)CONVERT_ELEMS, w->hi - at);
    if (st_read_at(f, i, at * ss, m * ss, scratch) != 0)
      return -1;
    convert(w->dtype, (char *)w->dst + at * ds, e->dtype, scratch, m);
  }
  return 0;
}

typedef struct {
  int file, entry, want;
  int64_t begin;
} Job;

static int by_place(const void *pa, const void *pb) {
  const Job *a = pa, *b = pb;
  if (a->file != b->file)
    return a->file - b->file;
  return a->begin < b->begin ? -1 : a->begin > b->begin;
}

enum { MAX_REPORTED = 12 };

/* One problem with the checkpoint: the first few are printed, the rest counted. */
static PRINTF(2, 3) void problem(int *nbad, const char *fmt, ...) {
  if (++*nbad > MAX_REPORTED)
    return;
  va_list ap;
  va_start(ap, fmt);
  Buf b = {0};
  buf_vprintf(&b, fmt, ap);
  va_end(ap);
  error("%s", b.data);
  buf_free(&b);
}

int ckpt_dir_load(const CkptDir *d, const CkptWant *w, int n, const char *own_prefix) {
  int nbad = 0;
  Job *jobs = calloc((size_t)n + 1, sizeof(Job));
  bool *wanted = calloc((size_t)d->nnames + 1, sizeof(bool));
  ASSERT(jobs && wanted);
  int njobs = 0;
  for (int k = 0; k < n; k++) {
    const CkptName *nm = lookup(d, w[k].name);
    Buf want = {0};
    buf_printf(&want, "%s ", st_dtype_name(w[k].dtype));
    put_shape(&want, w[k].ndim, w[k].shape);
    if (!nm) {
      problem(&nbad, "%s: tensor '%s' is missing: no file of the checkpoint%s holds it (the model needs %s)", d->dir,
              w[k].name, d->indexed ? " or its " INDEX_NAME : "", want.data);
      buf_free(&want);
      continue;
    }
    wanted[nm - d->names] = true;
    const StFile *f = &d->files[nm->file];
    const StEntry *e = &f->entries[nm->entry];
    bool same = e->ndim == w[k].ndim;
    for (int i = 0; same && i < e->ndim; i++)
      same = e->shape[i] == w[k].shape[i];
    Buf have = {0};
    buf_printf(&have, "%s ", st_dtype_name(e->dtype));
    put_shape(&have, e->ndim, e->shape);
    if (!same)
      problem(&nbad, "%s: tensor '%s' is %s; the model needs %s", f->path, w[k].name, have.data, want.data);
    else if (!is_float(e->dtype) && e->dtype != w[k].dtype) /* (a quantized state's codes: as stored) */
      problem(&nbad, "%s: tensor '%s' is %s; optc reads F32, BF16, F16 or F64 weights", f->path, w[k].name, have.data);
    else {
      ASSERT(0 <= w[k].lo && w[k].lo <= w[k].hi && w[k].hi <= e->numel);
      jobs[njobs++] = (Job){nm->file, nm->entry, k, e->begin};
    }
    buf_free(&have);
    buf_free(&want);
  }
  for (int i = 0; i < d->nnames; i++)
    if (!wanted[i] && owned(d->names[i].name, own_prefix))
      problem(&nbad, "%s: unexpected tensor '%s': it is not a parameter of the model", d->files[d->names[i].file].path,
              d->names[i].name);
  free(wanted);
  if (nbad) {
    if (nbad > MAX_REPORTED)
      error("%s: ... and %d more problems with the checkpoint", d->dir, nbad - MAX_REPORTED);
    free(jobs);
    return -1;
  }
  /* file by file, front to back */
  qsort(jobs, (size_t)njobs, sizeof(Job), by_place);
  void *scratch = NULL;
  int rc = 0;
  for (int j = 0; j < njobs && rc == 0; j++) {
    const CkptWant *x = &w[jobs[j].want];
    const StFile *f = &d->files[jobs[j].file];
    if (f->entries[jobs[j].entry].dtype != x->dtype && !scratch) {
      scratch = malloc((size_t)CONVERT_ELEMS * 8);
      ASSERT(scratch);
    }
    rc = load_one(f, jobs[j].entry, x, scratch);
  }
  free(scratch);
  free(jobs);
  return rc;
}

/* ---- writing a checkpoint directory ----------------------------------------------------------------- */

int ckpt_write_model(const char *dir, const StView *v, int n, int64_t max_shard, int *nshards) {
  int64_t *nbytes = malloc(sizeof(int64_t) * ((size_t)n + 1));
  int *shard_of = malloc(sizeof(int) * ((size_t)n + 1));
  ASSERT(nbytes && shard_of);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = 1;
    for (int k = 0; k < v[i].ndim; k++)
      numel *= v[i].shape[k];
    nbytes[i] = numel * type_size(v[i].dtype);
    total += nbytes[i];
  }
  int ns = ckpt_plan_shards(nbytes, n, max_shard, shard_of);
  if (ns == 0)
    ns = 1; /* no tensors: one empty file */
  StView *part = malloc(sizeof(StView) * ((size_t)n + 1));
  ASSERT(part);
  static const char *const meta[] = {"format", "pt"};
  int rc = 0;
  for (int s = 0; s < ns && rc == 0; s++) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (shard_of[i] == s)
        part[m++] = v[i];
    char name[64], path[4200];
    ckpt_shard_name(s, ns, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rc = st_write_views(path, part, m, meta, 1);
  }
  if (rc == 0 && ns > 1) {
    /* as save_torch_state_dict writes it: shards in order, tensors in
     * order within each */
    json_t *wm = json_object();
    for (int s = 0; s < ns; s++) {
      char name[64];
      ckpt_shard_name(s, ns, name, sizeof name);
      for (int i = 0; i < n; i++)
        if (shard_of[i] == s)
          json_object_set_new(wm, v[i].name, json_string(name));
    }
    json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    char *text = json_dumps(idx, JSON_INDENT(2));
    json_decref(idx);
    ASSERT(text);
    char path[4200];
    snprintf(path, sizeof path, "%s/" INDEX_NAME, dir);
    rc = file_write_atomic(path, text, strlen(text));
    free(text);
  }
  free(part);
  free(nbytes);
  free(shard_of);
  if (nshards)
    *nshards = ns;
  return rc;
}

/* ---- directories ------------------------------------------------------------------------------------- */

/* torchtune's SUFFIXES_TO_NOT_COPY: weights and their indexes, adapters */
static const char *const no_copy[] = {".pt", ".pth", ".bin", ".safetensors", INDEX_NAME, "pytorch_model.bin.index.json",
                                      "adapter_config", "adapter_model"};

static int copy_file(const char *src, const char *dst) {
  size_t n;
  char *data = file_read(src, &n);
  if (!data)
    return -1;
  int rc = file_write_atomic(dst, data, n);
  free(data);
  return rc;
}

/* torchtune's copy_files: every file under src but weights, dotfiles and
 * files over 100 MiB, at the same relative path under dst, unless there. */
int ckpt_copy_files(const char *src, const char *dst) {
  DIR *d = opendir(src);
  if (!d) {
    error("cannot open '%s': %s", src, strerror(errno));
    return -1;
  }
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    char sp[4200], dp[4200];
    snprintf(sp, sizeof sp, "%s/%s", src, e->d_name);
    snprintf(dp, sizeof dp, "%s/%s", dst, e->d_name);
    struct stat st;
    if (stat(sp, &st) != 0)
      continue;
    if (S_ISDIR(st.st_mode)) {
      if (mkdir(dp, 0755) != 0 && errno != EEXIST) {
        error("cannot create '%s': %s", dp, strerror(errno));
        rc = -1;
      } else {
        rc = ckpt_copy_files(sp, dp);
      }
      continue;
    }
    bool skip = !S_ISREG(st.st_mode) || st.st_size > 100 * 1024 * 1024 || access(dp, F_OK) == 0;
    for (size_t k = 0; k < ARRAY_LEN(no_copy) && !skip; k++)
      skip = ends_with(e->d_name, no_copy[k]);
    if (!skip)
      rc = copy_file(sp, dp);
  }
  closedir(d);
  return rc;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

int ckpt_remove_tree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0)
    return errno == ENOENT ? 0 : -1;
  if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    error("cannot remove '%s': %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

int ckpt_commit_dir(const char *tmp, const char *final) {
  /* the files in tmp are fsynced; so is its entry, before it gets its name */
  fsync_dir(tmp);
  char old[4200];
  old[0] = 0;
  struct stat st;
  if (stat(final, &st) == 0) {
    /* a checkpoint of the same step (a rerun): swapped with the new one in
     * one step, so that final is never missing, then removed */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
      snprintf(old, sizeof old, "%s", tmp);
    } else {
      snprintf(old, sizeof old, "%s.old.%ld", final, (long)getpid());
      ckpt_remove_tree(old);
      if (rename(final, old) != 0) {
        error("cannot move the old '%s' aside: %s", final, strerror(errno));
        return -1;
      }
    }
  }
  if (strcmp(old, tmp) != 0 && rename(tmp, final) != 0) {
    error("cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
    if (old[0])
      rename(old, final);
    return -1;
  }
  char parent[4200];
  snprintf(parent, sizeof parent, "%s", final);
  char *slash = strrchr(parent, '/');
  if (slash)
    *slash = 0;
  fsync_dir(slash ? parent : ".");
  if (old[0])
    ckpt_remove_tree(old);
  return 0;
}

/* Whether process pid may still be writing an entry last modified at
 * mtime. Not when there is no such process; not when it is a zombie (a rank
 * killed under mpirun, orphaned where PID 1 does not reap: its files are
 * closed, it will write nothing more); not when it started after the entry
 * was last written (the pid was reused). Without /proc, kill -0 decides. */
static bool pid_may_write(long pid, time_t mtime) {
  if (pid <= 0 || pid == (long)getpid())
    return pid > 0;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
    return false;
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return errno != ENOENT;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* pid (comm) state ppid ... : comm may hold spaces and ')', so from the last ')' */
  char *p = strrchr(buf, ')');
  char state = 0;
  unsigned long long start = 0;
  if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state,
                   &start) != 2)
    return true;
  if (state == 'Z' || state == 'X')
    return false;
  /* its start, in seconds since the epoch: boot time (btime) plus ticks */
  FILE *sf = fopen("/proc/stat", "r");
  long long btime = -1;
  for (char line[256]; sf && fgets(line, sizeof line, sf);)
    if (sscanf(line, "btime %lld", &btime) == 1)
      break;
  if (sf)
    fclose(sf);
  long hz = sysconf(_SC_CLK_TCK);
  if (btime < 0 || hz <= 0)
    return true;
  long long started = btime + (long long)(start / (unsigned long long)hz);
  return started <= (long long)mtime + 1; /* +1: btime and mtime are whole seconds */
}

int ckpt_clean_stale(const char *out_dir) {
  DIR *d = opendir(out_dir);
  if (!d)
    return 0;
  int rc = 0;
  for (struct dirent *e; (e = readdir(d));) {
    long step, pid;
    int len = 0;
    /* a save's directory, or the new `latest` it was writing */
    if ((sscanf(e->d_name, ".step_%ld.tmp.%ld%n", &step, &pid, &len) != 2 || len != (int)strlen(e->d_name)) &&
        (sscanf(e->d_name, "latest.tmp.%ld%n", &pid, &len) != 1 || len != (int)strlen(e->d_name)))
      continue;
    /* a writer that died mid-save */
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
    struct stat st;
    if (pid > 0 && lstat(p, &st) == 0 && !pid_may_write(pid, st.st_mtime))
      rc |= ckpt_remove_tree(p);
  }
  closedir(d);
  return rc;
}

/* step_N with N all digits: what torchtune's pattern ^step_(\d+) finds and
 * prune_surplus_checkpoints sorts by N. */
static long step_of(const char *name) {
  if (strncmp(name, "step_", 5) != 0 || !name[5] || strspn(name + 5, "0123456789") != strlen(name + 5))
    return -1;
  return strtol(name + 5, NULL, 10);
}

static int by_long_desc(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The newest `keep` step_N directories stay, and always the one `latest`
 * names: a run resumed from step_4 may find a complete step_8 that a killed
 * run renamed but never named in `latest`, and must not prune its own newer
 * save in step_8's favour. Each removed directory first gets a hidden
 * temporary name (as ckpt_clean_stale removes), so that a kill mid-removal
 * leaves no half step_N. */
int ckpt_prune(const char *out_dir, long keep) {
  if (keep < 1)
    return 0;
  DIR *d = opendir(out_dir);
  if (!d)
    return 0;
  char p[4200];
  snprintf(p, sizeof p, "%s/latest", out_dir);
  char *text = file_read_quiet(p, NULL);
  long latest = -1;
  if (text) {
    text[strcspn(text, "\n")] = 0;
    latest = step_of(text);
    free(text);
  }
  if (latest >= 0)
    keep--;
  long *steps = NULL;
  int n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    long s = step_of(e->d_name);
    if (s < 0 || s == latest)
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      steps = realloc(steps, sizeof(long) * (size_t)cap);
      ASSERT(steps);
    }
    steps[n++] = s;
  }
  closedir(d);
  if (n > 1)
    qsort(steps, (size_t)n, sizeof(long), by_long_desc);
  int rc = 0;
  for (int i = (int)keep; i < n; i++) {
    char hidden[4200];
    snprintf(p, sizeof p, "%s/step_%ld", out_dir, steps[i]);
    snprintf(hidden, sizeof hidden, "%s/.step_%ld.tmp.%ld", out_dir, steps[i], (long)getpid());
    ckpt_remove_tree(hidden);
    rc |= ckpt_remove_tree(rename(p, hidden) == 0 ? hidden : p);
  }
  free(steps);
  return rc;
}
