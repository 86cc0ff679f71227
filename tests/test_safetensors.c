/* test_safetensors.c: st_write and st_read round trips, and st_read on
 * malformed files built byte by byte. Every rejected file must give -1, an
 * empty TensorFile and exactly one error line that names the tensor at fault;
 * nothing may crash or read out of bounds (run it under ASan+UBSan).
 * Exits 0 when every check passes; prints what it checked on stdout. */
#include "tensor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testlib.h"

/* True if msg is exactly one line starting "optc: error: ". */
static bool one_error_line(const char *msg) {
  const char *nl = strchr(msg, '\n');
  return strncmp(msg, "optc: error: ", 13) == 0 && nl && nl[1] == 0;
}

/* ---- files ------------------------------------------------------------------ */

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
    die(path);
}

static bool same_file(const char *a, const char *b) {
  size_t na, nb;
  char *pa = file_read(a, &na), *pb = file_read(b, &nb);
  bool same = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
  free(pa);
  free(pb);
  return same;
}

/* Files in test_dir whose name contains ".tmp.": what a non-atomic write leaves. */
static int count_tmp_files(void) {
  DIR *d = opendir(test_dir);
  if (!d)
    die(test_dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

/* ---- round trips ------------------------------------------------------------ */

static void fill_pattern(Tensor *t, int seed) {
  unsigned char *p = t->data;
  for (int64_t i = 0; i < tensor_nbytes(t); i++)
    p[i] = t->dtype == TY_BOOL ? (unsigned char)((i + seed) % 2)
                               : (unsigned char)(seed * 37 + i * 11 + 1);
}

static bool tensors_equal(const Tensor *a, const Tensor *b) {
  if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->ndim != b->ndim ||
      a->numel != b->numel)
    return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i])
      return false;
  return memcmp(a->data, b->data, (size_t)tensor_nbytes(a)) == 0;
}

/* Every dtype, a scalar, an empty tensor and the most dims, with metadata. */
static void build_sample(TensorFile *tf) {
  static const struct {
    const char *name;
    Type dtype;
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
  } specs[] = {
      {"model.layers.0.w", TY_F32, 2, {2, 3}},
      {"model.layers.0.b", TY_F64, 1, {3}},
      {"emb.weight", TY_BF16, 2, {4, 2}},
      {"head.f16", TY_F16, 3, {1, 1, 5}},
      {"step", TY_I64, 0, {0}},
      {"empty.idx", TY_I32, 2, {0, 3}},
      {"mask", TY_BOOL, 1, {3}},
      {"eight.dims", TY_F32, 8, {1, 2, 1, 1, 1, 1, 1, 2}},
      {"Gewicht.\xc3\xbc", TY_I32, 1, {2}}, /* a UTF-8 name */
  };
  for (int i = 0; i < (int)ARRAY_LEN(specs); i++) {
    Tensor *t = tf_add(tf, specs[i].name, specs[i].dtype, specs[i].ndim, specs[i].shape);
    if (!CHECK(t != NULL))
      continue;
    fill_pattern(t, i);
  }
  tf_set_meta(tf, "format", "pt");
  tf_set_meta(tf, "step", "41");
  tf_set_meta(tf, "note", "caf\xc3\xa9 \"quoted\" \\ back");
  tf_set_meta(tf, "step", "42"); /* replaces, keeping the place */
}

static void test_round_trip(void) {
  TensorFile tf = {0};
  build_sample(&tf);
  CHECK(tf.n == 9 && tf.nmeta == 3);
  CHECK(strcmp(tf.meta_keys[1], "step") == 0 && strcmp(tf_get_meta(&tf, "step"), "42") == 0);
  CHECK(tf_get_meta(&tf, "absent") == NULL);
  CHECK(tf_find(&tf, "step") && tf_find(&tf, "step")->numel == 1);
  CHECK(tf_find(&tf, "empty.idx") && tf_find(&tf, "empty.idx")->numel == 0);
  CHECK(tf_find(&tf, "absent") == NULL);

  Path a_path = in_dir("a.safetensors");
  const char *a = a_path.s;
  CHECK(st_write(a, &tf) == 0);
  CHECK(count_tmp_files() == 0);

  /* The layout on disk: N a multiple of 8, the header padded with spaces,
   * the data right after it. */
  size_t len;
  unsigned char *raw = (unsigned char *)file_read(a, &len);
  if (CHECK(raw && len >= 8)) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
      n = n << 8 | raw[i];
    int64_t data = 0;
    for (int i = 0; i < tf.n; i++)
      data += tensor_nbytes(&tf.tensors[i]);
    CHECK(n % 8 == 0 && 8 + n + (uint64_t)data == len);
    CHECK(raw[8] == '{');
    CHECK(strstr((char *)raw + 8, "\"__metadata__\":{\"format\":\"pt\"") == (char *)raw + 9);
    size_t end = 8 + n;
    while (end > 8 && raw[end - 1] == ' ')
      end--;
    CHECK(raw[end - 1] == '}' && 8 + n - end < 8);
    CHECK(memcmp(raw + 8 + n, tf.tensors[0].data, (size_t)tensor_nbytes(&tf.tensors[0])) == 0);
  }
  free(raw);

  TensorFile back = {0};
  CHECK(st_read(a, &back) == 0);
  CHECK(back.n == tf.n && back.nmeta == tf.nmeta);
  for (int i = 0; i < tf.n && i < back.n; i++) {
    CHECK(tensors_equal(&tf.tensors[i], &back.tensors[i]));
    CHECK(back.tensors[i].data && (uintptr_t)back.tensors[i].data % 64 == 0);
  }
  for (int i = 0; i < tf.nmeta && i < back.nmeta; i++)
    CHECK(strcmp(tf.meta_keys[i], back.meta_keys[i]) == 0 &&
          strcmp(tf.meta_vals[i], back.meta_vals[i]) == 0);

  /* Writing what was read gives the same bytes. */
  Path b_path = in_dir("b.safetensors");
  const char *b = b_path.s;
  CHECK(st_write(b, &back) == 0);
  CHECK(same_file(a, b));
  printf("ok  round trip: %d tensors (F64 F32 BF16 F16 I64 I32 BOOL, a scalar, an empty tensor, "
         "8 dims), %d metadata keys, byte-identical data and rewrite\n",
         back.n, back.nmeta);
  tf_free(&back);
  CHECK(back.n == 0 && back.tensors == NULL && back.meta_keys == NULL);

  /* A write that fails leaves the old file as it was, and no temporary. */
  Tensor *w = tf_find(&tf, "model.layers.0.b");
  w->numel = 5;
  capture_begin();
  int rc = st_write(b, &tf);
  const char *msg = capture_end();
  w->numel = 3;
  CHECK(rc == -1 && one_error_line(msg) && strstr(msg, "'model.layers.0.b'"));
  CHECK(same_file(a, b) && count_tmp_files() == 0);

  /* A write into a directory that does not exist fails and leaves nothing. */
  Path nodir_path = in_dir("no/such/dir/c.safetensors");
  const char *nodir = nodir_path.s;
  capture_begin();
  rc = st_write(nodir, &tf);
  msg = capture_end();
  struct stat st;
  CHECK(rc == -1 && one_error_line(msg) && strstr(msg, "No such file or directory"));
  CHECK(stat(in_dir("no").s, &st) != 0 && errno == ENOENT && count_tmp_files() == 0);
  printf("ok  atomic write: no PATH.tmp.* left; a failed write keeps the old file; "
         "a missing directory gives -1: %s",
         msg);
  tf_free(&tf);
  CHECK(tf.n == 0 && tf.tensors == NULL && tf.nmeta == 0);
}

/* st_open reads the header only; st_read_at reads any byte range of a
 * tensor; st_write_views writes tensors it does not own, from memory or
 * copied from an open file, and gives the bytes st_write gives. */
static void test_open_views(void) {
  TensorFile tf = {0};
  build_sample(&tf);
  Path a_path = in_dir("v.safetensors");
  const char *a = a_path.s;
  CHECK(st_write(a, &tf) == 0);
  StFile f;
  if (!CHECK(st_open(a, &f) == 0))
    return;
  CHECK(f.n == tf.n && f.meta.nmeta == tf.nmeta && strcmp(tf_get_meta(&f.meta, "step"), "42") == 0);
  /* entries in data order, which is tf's order as written */
  int64_t at = -1;
  bool ordered = true, found = true;
  for (int i = 0; i < f.n; i++) {
    ordered &= f.entries[i].begin >= at;
    at = f.entries[i].begin;
    int k = st_find(&f, tf.tensors[i].name);
    found &= k >= 0 && f.entries[k].numel == tf.tensors[i].numel && f.entries[k].dtype == tf.tensors[i].dtype;
  }
  CHECK(ordered && found && st_find(&f, "absent") == -1);
  int w = st_find(&f, "model.layers.0.w");
  unsigned char part[8];
  CHECK(w >= 0 && st_read_at(&f, w, 4, 8, part) == 0 &&
        memcmp(part, (char *)tf_find(&tf, "model.layers.0.w")->data + 4, 8) == 0);
  /* views: every tensor but the first from memory, the first copied from f */
  StView v[16];
  for (int i = 0; i < tf.n; i++) {
    const Tensor *t = &tf.tensors[i];
    v[i] = (StView){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
    memcpy(v[i].shape, t->shape, sizeof t->shape);
  }
  v[0].data = NULL;
  v[0].src = &f;
  v[0].src_index = st_find(&f, v[0].name);
  const char *meta[6];
  for (int i = 0; i < tf.nmeta; i++) {
    meta[2 * i] = tf.meta_keys[i];
    meta[2 * i + 1] = tf.meta_vals[i];
  }
  Path b_path = in_dir("w.safetensors");
  CHECK(st_write_views(b_path.s, v, tf.n, meta, tf.nmeta) == 0);
  CHECK(same_file(a, b_path.s) && count_tmp_files() == 0);
  /* a file that shrank after st_open: the read names the file and the tensor */
  if (truncate(a, 40) != 0)
    die("truncate");
  capture_begin();
  int rc = st_read_at(&f, w, 0, 24, part);
  const char *msg = capture_end();
  CHECK(rc == -1 && one_error_line(msg) && strstr(msg, "'model.layers.0.w'") && strstr(msg, "v.safetensors"));
  st_close(&f);
  CHECK(f.n == 0 && f.entries == NULL && f.f == NULL);
  printf("ok  st_open + st_read_at: header only, any byte range; st_write_views from memory and from an open "
         "file gives st_write's bytes; a file cut after st_open: %s",
         msg);
  tf_free(&tf);
}

static void test_empty_file(void) {
  TensorFile tf = {0}, back = {0};
  Path p_path = in_dir("empty.safetensors");
  const char *p = p_path.s;
  CHECK(st_write(p, &tf) == 0);
  size_t len;
  char *raw = file_read(p, &len);
  CHECK(raw && len == 16 && memcmp(raw, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
  free(raw);
  CHECK(st_read(p, &back) == 0 && back.n == 0 && back.nmeta == 0);
  tf_free(&back);
  printf("ok  empty tensor file: written as 8 + \"{}\" padded to 8, read back\n");
}

static void test_api_errors(void) {
  TensorFile tf = {0};
  int64_t shape[2] = {2, 2};
  CHECK(tf_add(&tf, "x", TY_F32, 2, shape) != NULL);
  capture_begin();
  Tensor *t = tf_add(&tf, "x", TY_F16, 1, shape);
  const char *msg = capture_end();
  CHECK(t == NULL && tf.n == 1 && one_error_line(msg) && strstr(msg, "'x'"));

  int64_t neg[1] = {-3};
  capture_begin();
  t = tf_add(&tf, "neg", TY_F32, 1, neg);
  msg = capture_end();
  CHECK(t == NULL && tf.n == 1 && one_error_line(msg) && strstr(msg, "'neg'"));

  capture_begin();
  t = tf_add(&tf, "void", TY_VOID, 0, NULL);
  msg = capture_end();
  CHECK(t == NULL && one_error_line(msg));

  /* jansson refuses a name that is not UTF-8; st_write must say so. */
  CHECK(tf_add(&tf, "bad\xff", TY_F32, 0, NULL) != NULL);
  capture_begin();
  int rc = st_write(in_dir("bad.safetensors").s, &tf);
  msg = capture_end();
  CHECK(rc == -1 && one_error_line(msg) && strstr(msg, "UTF-8"));
  CHECK(access(in_dir("bad.safetensors").s, F_OK) != 0 && count_tmp_files() == 0);
  tf_free(&tf);

  for (int ty = TY_BOOL; ty < NUM_TYPES; ty++) {
    if (ty == TY_U4) { /* no 4-bit dtype in safetensors */
      CHECK(st_dtype_name(TY_U4) == NULL);
      continue;
    }
    Type back;
    CHECK(st_dtype_from_name(st_dtype_name((Type)ty), &back) && back == (Type)ty);
  }
  Type dummy;
  CHECK(st_dtype_name(TY_VOID) == NULL && !st_dtype_from_name("F8_E4M3", &dummy));
  printf("ok  API errors: duplicate tf_add, negative dim, void dtype, non-UTF-8 name; "
         "dtype names\n");
}

/* ---- hand-built files ------------------------------------------------------- */

/* Headers are written with ' for ", so that they read as JSON; fix_quotes
 * turns them into the real thing. */
static char *fix_quotes(const char *s) {
  char *p = strdup(s);
  if (!p)
    die("strdup");
  for (char *q = p; *q; q++)
    if (*q == '\'')
      *q = '"';
  return p;
}

typedef struct {
  const char *what;
  const char *raw; /* when set: the whole file is these rawlen bytes */
  size_t rawlen;
  const char *header; /* JSON, with ' for " */
  bool has_len;       /* the length field is len, not the header's length */
  uint64_t len;
  int data;              /* bytes of data after the header */
  int cut;               /* > 0: keep this many bytes; < 0: drop -cut bytes at the end */
  const char *expect[3]; /* the message contains each */
} FileSpec;

#define LEN(n) .has_len = true, .len = (n)

/* The file image of s: N:u64le, header, data. */
static void build_file(const FileSpec *s, Buf *out) {
  if (s->raw) {
    buf_put(out, s->raw, s->rawlen);
    return;
  }
  char *header = fix_quotes(s->header);
  uint64_t n = s->has_len ? s->len : strlen(header);
  for (int i = 0; i < 8; i++)
    buf_putc(out, (char)(n >> (8 * i)));
  buf_puts(out, header);
  for (int i = 0; i < s->data; i++)
    buf_putc(out, (char)i);
  if (s->cut > 0 && (size_t)s->cut < out->len)
    out->len = (size_t)s->cut;
  if (s->cut < 0 && (size_t)-s->cut <= out->len)
    out->len -= (size_t)-s->cut;
  free(header);
}

/* A file torch could have written: the header lists tensors in another order
 * than their data, has no padding and puts the metadata in the middle. */
static void test_foreign_layout(void) {
  static const float a[2] = {1.5f, -2.0f};
  static const int64_t b = 42;
  FileSpec s = {.header = "{'b':{'dtype':'I64','shape':[],'data_offsets':[8,16]},"
                          "'__metadata__':{'format':'pt'},"
                          "'z':{'dtype':'F16','shape':[0, 7],'data_offsets':[8,8],'extra':1},"
                          "'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}"};
  Buf img = {0};
  build_file(&s, &img);
  buf_put(&img, a, sizeof a);
  buf_put(&img, &b, sizeof b);
  Path p_path = in_dir("foreign.safetensors");
  const char *p = p_path.s;
  write_bytes(p, img.data, img.len);
  buf_free(&img);

  TensorFile tf = {0};
  CHECK(st_read(p, &tf) == 0);
  if (CHECK(tf.n == 3)) {
    CHECK(strcmp(tf.tensors[0].name, "a") == 0 && tf.tensors[0].dtype == TY_F32);
    CHECK(memcmp(tf.tensors[0].data, a, sizeof a) == 0);
    CHECK(strcmp(tf.tensors[1].name, "z") == 0 && tf.tensors[1].numel == 0 &&
          tf.tensors[1].ndim == 2 && tf.tensors[1].shape[1] == 7 && tf.tensors[1].data);
    CHECK(strcmp(tf.tensors[2].name, "b") == 0 && tf.tensors[2].ndim == 0 &&
          tf.tensors[2].numel == 1 && *(int64_t *)tf.tensors[2].data == 42);
  }
  CHECK(tf.nmeta == 1 && strcmp(tf_get_meta(&tf, "format"), "pt") == 0);
  tf_free(&tf);

  FileSpec nullmeta = {.header = "{'__metadata__':null}"};
  Buf img2 = {0};
  build_file(&nullmeta, &img2);
  write_bytes(p, img2.data, img2.len);
  buf_free(&img2);
  CHECK(st_read(p, &tf) == 0 && tf.n == 0 && tf.nmeta == 0);
  tf_free(&tf);
  printf("ok  foreign layout: tensors come in data order, unpadded header, metadata in the "
         "middle, an empty tensor, an unknown key, \"__metadata__\": null\n");
}

#define W_F32_2x2 "'w':{'dtype':'F32','shape':[2,2],'data_offsets':[0,16]}"

static const FileSpec bad_files[] = {
    {"empty file", .raw = "", .rawlen = 0, .expect = {"too short"}},
    {"5-byte file", .raw = "\x10\0\0\0\0", .rawlen = 5, .expect = {"too short"}},
    {"header length 0", .header = "", LEN(0), .expect = {"header length is 0"}},
    {"header length 2^40", .header = "{" W_F32_2x2 "}", LEN(1ull << 40), .data = 16,
     .expect = {"oversized header"}},
    {"header length past the end", .header = "{" W_F32_2x2 "}", LEN(1000), .data = 16,
     .expect = {"larger than"}},
    {"file cut inside the header", .header = "{" W_F32_2x2 "}", .data = 16, .cut = 8 + 20,
     .expect = {"larger than", "truncated"}},
    {"file cut inside the data", .header = "{" W_F32_2x2 "}", .data = 16, .cut = -7,
     .expect = {"'w'", "lies outside the file"}},
    {"offsets beyond the end",
     .header = "{'w':{'dtype':'F32','shape':[250],'data_offsets':[0,1000]}}", .data = 16,
     .expect = {"'w'", "lies outside the file"}},
    {"overlapping offsets",
     .header = "{'a':{'dtype':'F32','shape':[4],'data_offsets':[0,16]},"
               "'b':{'dtype':'F32','shape':[4],'data_offsets':[8,24]}}",
     .data = 24, .expect = {"'a'", "'b'", "overlap"}},
    {"empty tensor inside another",
     .header = "{'a':{'dtype':'F32','shape':[4],'data_offsets':[0,16]},"
               "'e':{'dtype':'F32','shape':[0],'data_offsets':[8,8]}}",
     .data = 16, .expect = {"'a'", "'e'", "overlap"}},
    {"hole between tensors",
     .header = "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
               "'b':{'dtype':'F32','shape':[2],'data_offsets':[16,24]}}",
     .data = 24, .expect = {"'a'", "'b'", "hole"}},
    {"hole before the first tensor",
     .header = "{'a':{'dtype':'F32','shape':[2],'data_offsets':[8,16]}}", .data = 16,
     .expect = {"'a'", "hole"}},
    {"trailing bytes", .header = "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}",
     .data = 16, .expect = {"'a'", "8 unused bytes at the end"}},
    {"data but no tensors", .header = "{}", .data = 8, .expect = {"no tensors"}},
    {"dtype F8_E4M3", .header = "{'w':{'dtype':'F8_E4M3','shape':[2],'data_offsets':[0,2]}}",
     .data = 2, .expect = {"'w'", "unsupported dtype", "F8_E4M3"}},
    {"dtype Q4", .header = "{'w':{'dtype':'Q4','shape':[2],'data_offsets':[0,2]}}", .data = 2,
     .expect = {"'w'", "unsupported dtype"}},
    {"dtype not a string", .header = "{'w':{'dtype':4,'shape':[2],'data_offsets':[0,8]}}",
     .data = 8, .expect = {"'w'", "\"dtype\" is not a string"}},
    {"dtype missing", .header = "{'w':{'shape':[2],'data_offsets':[0,8]}}", .data = 8,
     .expect = {"'w'", "missing \"dtype\""}},
    {"shape missing", .header = "{'w':{'dtype':'F32','data_offsets':[0,8]}}", .data = 8,
     .expect = {"'w'", "missing \"shape\""}},
    {"data_offsets missing", .header = "{'w':{'dtype':'F32','shape':[2]}}", .data = 8,
     .expect = {"'w'", "missing \"data_offsets\""}},
    {"size mismatch", .header = "{'layer.0.w':{'dtype':'F32','shape':[2,2],'data_offsets':[0,12]}}",
     .data = 12,
     .expect = {"'layer.0.w'", "data_offsets [0, 12) hold 12 bytes, but F32 [2, 2] needs 16"}},
    {"negative dim", .header = "{'w':{'dtype':'F32','shape':[-1,4],'data_offsets':[0,16]}}",
     .data = 16, .expect = {"'w'", "shape[0] is -1"}},
    {"fractional dim", .header = "{'w':{'dtype':'F32','shape':[2.0],'data_offsets':[0,8]}}",
     .data = 8, .expect = {"'w'", "shape[0] is not an integer"}},
    {"shape not an array", .header = "{'w':{'dtype':'F32','shape':2,'data_offsets':[0,8]}}",
     .data = 8, .expect = {"'w'", "\"shape\" is not an array"}},
    {"nine dims",
     .header = "{'w':{'dtype':'F32','shape':[1,1,1,1,1,1,1,1,2],'data_offsets':[0,8]}}", .data = 8,
     .expect = {"'w'", "at most 8"}},
    {"numel * size overflows",
     .header = "{'w':{'dtype':'F64','shape':[4611686018427387904,4],'data_offsets':[0,8]}}",
     .data = 8, .expect = {"'w'", "2^63"}},
    {"bytes overflow",
     .header = "{'w':{'dtype':'F64','shape':[2305843009213693952],'data_offsets':[0,8]}}",
     .data = 8, .expect = {"'w'", "2^63"}},
    {"offsets begin after end", .header = "{'w':{'dtype':'F32','shape':[2],'data_offsets':[8,0]}}",
     .data = 8, .expect = {"'w'", "begin after"}},
    {"negative offset", .header = "{'w':{'dtype':'F32','shape':[2],'data_offsets':[-8,0]}}",
     .data = 8, .expect = {"'w'", "negative offset"}},
    {"three offsets", .header = "{'w':{'dtype':'F32','shape':[2],'data_offsets':[0,8,8]}}",
     .data = 8, .expect = {"'w'", "two integers"}},
    {"offset too big for JSON",
     .header = "{'w':{'dtype':'F32','shape':[2],'data_offsets':[0,99999999999999999999]}}",
     .data = 8, .expect = {"not valid JSON", "too big integer"}},
    {"non-JSON header", .header = "{not json}   ", .expect = {"not valid JSON"}},
    {"header not an object", .header = "[1, 2]  ", .expect = {"not a JSON object"}},
    {"entry not an object", .header = "{'w':5}", .expect = {"'w'", "not an object"}},
    {"duplicate names",
     .header = "{'dup.w':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
               "'dup.w':{'dtype':'F32','shape':[2],'data_offsets':[8,16]}}",
     .data = 16, .expect = {"dup.w", "appears twice"}},
    {"header not UTF-8", .header = "{'w\xff':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}",
     .data = 8, .expect = {"not valid JSON"}},
    {"__metadata__ not an object", .header = "{'__metadata__':[1]}",
     .expect = {"\"__metadata__\" is not an object"}},
    {"__metadata__ value not a string", .header = "{'__metadata__':{'step':1}}",
     .expect = {"'step'", "not a string"}},
};

static void expect_rejected(const char *what, const char *path, const char *const *expect,
                            int nexpect, bool print) {
  TensorFile tf = {.n = 99}; /* st_read must clear it */
  capture_begin();
  int rc = st_read(path, &tf);
  const char *msg = capture_end();
  bool ok = CHECK(rc == -1);
  ok &= CHECK(tf.n == 0 && tf.tensors == NULL && tf.nmeta == 0 && tf.meta_keys == NULL);
  ok &= CHECK(one_error_line(msg));
  ok &= CHECK(strstr(msg, path) != NULL);
  for (int i = 0; i < nexpect && expect[i]; i++)
    if (!CHECK(strstr(msg, expect[i]) != NULL))
      ok = false, printf("    wanted \"%s\" in the message\n", expect[i]);
  if (!ok || print)
    printf("%s  %s: %s", ok ? "ok" : "FAILED", what, msg);
  if (rc == 0)
    tf_free(&tf);
}

static void test_bad_files(void) {
  Path p_path = in_dir("bad.safetensors");
  const char *p = p_path.s;
  for (size_t i = 0; i < ARRAY_LEN(bad_files); i++) {
    Buf img = {0};
    build_file(&bad_files[i], &img);
    write_bytes(p, img.data, img.len);
    buf_free(&img);
    expect_rejected(bad_files[i].what, p, bad_files[i].expect, 3, true);
  }
  const char *missing[] = {"cannot open", "No such file or directory"};
  expect_rejected("missing file", in_dir("missing.safetensors").s, missing, 2, true);
  const char *isdir[] = {"not a regular file"};
  expect_rejected("a directory", test_dir, isdir, 1, true);
}

/* Every proper prefix of a valid file is rejected with one message. */
static void test_every_truncation(void) {
  size_t len;
  char *whole = file_read(in_dir("a.safetensors").s, &len);
  if (!CHECK(whole != NULL))
    return;
  Path p_path = in_dir("cut.safetensors");
  const char *p = p_path.s;
  int before = nfailed;
  for (size_t n = 0; n < len; n++) {
    write_bytes(p, whole, n);
    expect_rejected("truncated", p, NULL, 0, false);
  }
  free(whole);
  printf("%s  every truncation of a.safetensors (0 to %zu bytes) is rejected\n",
         nfailed == before ? "ok" : "FAILED", len - 1);
}

/* Random byte changes must never crash the reader, and whatever it accepts
 * must be consistent. A fixed seed keeps failures reproducible. */
static void test_corruption(void) {
  size_t len;
  char *whole = file_read(in_dir("a.safetensors").s, &len);
  if (!CHECK(whole != NULL))
    return;
  char *img = malloc(len);
  if (!img)
    die("malloc");
  Path p_path = in_dir("fuzz.safetensors");
  const char *p = p_path.s;
  uint64_t rng = 0x9e3779b97f4a7c15u;
  int accepted = 0, rounds = 3000, before = nfailed;
  static const char junk[] = "{}[]\",:0123456789- eE.\xff";
  for (int r = 0; r < rounds; r++) {
    memcpy(img, whole, len);
    int nflips = 1 + r % 4;
    for (int k = 0; k < nflips; k++) {
      rng = rng * 6364136223846793005u + 1442695040888963407u;
      size_t at = (size_t)(rng >> 33) % len;
      /* Half the time a byte that means something to JSON. */
      img[at] = (rng & 1) ? junk[(rng >> 8) % (sizeof junk - 1)] : (char)(rng >> 16);
    }
    write_bytes(p, img, len);
    TensorFile tf = {0};
    capture_begin();
    int rc = st_read(p, &tf);
    const char *msg = capture_end();
    if (rc == 0) {
      accepted++;
      CHECK(msg[0] == 0);
      int64_t total = 0;
      for (int i = 0; i < tf.n; i++) {
        const Tensor *t = &tf.tensors[i];
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
          numel *= t->shape[d];
        CHECK(t->numel == numel && t->data);
        total += tensor_nbytes(t);
      }
      CHECK(total <= (int64_t)len);
      tf_free(&tf);
    } else {
      CHECK(rc == -1 && one_error_line(msg) && tf.n == 0);
    }
  }
  free(img);
  free(whole);
  printf("%s  %d randomly corrupted copies: %d accepted consistently, the rest rejected with "
         "one message\n",
         nfailed == before ? "ok" : "FAILED", rounds, accepted);
}

int main(void) {
  test_dir_make("test_safetensors");
  test_round_trip();
  test_open_views();
  test_empty_file();
  test_api_errors();
  test_foreign_layout();
  test_bad_files();
  test_every_truncation();
  test_corruption();
  test_dir_remove();
  printf("%s: %d checks, %d failed\n", nfailed ? "FAIL" : "PASS", nchecks, nfailed);
  return nfailed ? 1 : 0;
}
