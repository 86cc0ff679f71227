/* test_ckpt.c: HF checkpoint directories (runtime/io/ckpt.c).
 *   - torchtune's filename_format expansion, and its mistakes;
 *   - huggingface_hub's sizes ("5GB") and its shard grouping;
 *   - a sharded directory written, its index, and read back through the
 *     index, whole and in element ranges, with dtype conversion;
 *   - every kind of bad checkpoint (a missing, extra or mis-shaped tensor,
 *     an index that disagrees with the shards, a corrupt shard) is refused
 *     with messages that name the tensor and the file;
 *   - the streaming load of a 6-shard, 192 MB checkpoint, whose peak RSS
 *     must stay within the destination buffer plus a few MB.
 * Prints what it checked; exits 0 when every check passes. */
#include "train.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../testlib.h"

static const char *at(const char *fmt, ...) PRINTF(1, 2);
static char paths[64][512];
static int next_path;
/* test_dir/..., in one of 64 rotating buffers: a caller keeps a copy of any
 * it needs for long */
static const char *at(const char *fmt, ...) {
  char *p = paths[next_path++ % 64];
  int n = snprintf(p, 512, "%s/", test_dir);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p + n, (size_t)(512 - n), fmt, ap);
  va_end(ap);
  return p;
}

/* Every needle is in the message. */
static bool mentions(const char *msg, const char *const *needles, int n) {
  for (int i = 0; i < n; i++)
    if (!strstr(msg, needles[i])) {
      printf("    message lacks '%s': %s", needles[i], msg);
      return false;
    }
  return true;
}

/* ---- filename_format ------------------------------------------------------------ */

static void test_format(void) {
  char **f, why[512];
  int n;
  CHECK(ckpt_format_files("model-{}-of-{}.safetensors", "00050", &f, &n, why, sizeof why) == 0);
  if (CHECK(n == 50)) {
    CHECK(strcmp(f[0], "model-00001-of-00050.safetensors") == 0);
    CHECK(strcmp(f[49], "model-00050-of-00050.safetensors") == 0);
    ckpt_strings_free(f, n);
  }
  /* torchtune's docstring example */
  CHECK(ckpt_format_files("file_{}_of_{}.safetensors", "00003", &f, &n, why, sizeof why) == 0 && n == 3 &&
        strcmp(f[2], "file_00003_of_00003.safetensors") == 0);
  ckpt_strings_free(f, n);
  /* the padding is max_filename's width, whatever its value */
  CHECK(ckpt_format_files("m{}of{}", "012", &f, &n, why, sizeof why) == 0 && n == 12 && strcmp(f[0], "m001of012") == 0 &&
        strcmp(f[11], "m012of012") == 0);
  ckpt_strings_free(f, n);
  CHECK(ckpt_format_files("{}-{}", "7", &f, &n, why, sizeof why) == 0 && n == 7 && strcmp(f[6], "7-7") == 0);
  ckpt_strings_free(f, n);
  /* numbered placeholders and literal braces, as str.format reads them */
  CHECK(ckpt_format_files("{{x}}{1}_{0}", "02", &f, &n, why, sizeof why) == 0 && n == 2 && strcmp(f[0], "{x}02_01") == 0);
  ckpt_strings_free(f, n);
  static const struct {
    const char *fmt, *max, *why;
  } bad[] = {
      {"model-{}.safetensors", "00050", "1 placeholder"},
      {"{}-{}-{}", "00050", "more than two"},
      {"model-{i}-of-{n}", "00050", "placeholder '{i}'"},
      {"model-{:05d}-of-{}", "00050", "placeholder '{:05d}'"},
      {"model-{}-of-{}}", "00050", "single '}'"},
      {"model-{}-of-{", "00050", "without '}'"},
      {"{0}-{}", "00050", "mixes"},
      {"model-{}-of-{}", "00000", "names no files"},
      {"model-{}-of-{}", "", "not a file number"},
      {"model-{}-of-{}", "12a", "not a file number"},
  };
  for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
    why[0] = 0;
    bool refused = ckpt_format_files(bad[i].fmt, bad[i].max, &f, &n, why, sizeof why) == -1 && !f && n == 0;
    if (!CHECK(refused && strstr(why, bad[i].why)))
      printf("    '%s' with '%s': %s\n", bad[i].fmt, bad[i].max, why);
  }
  printf("ok  filename_format: torchtune's expansion (zfill to len(max_filename)), %zu mistakes refused\n", ARRAY_LEN(bad));
}

/* ---- sizes and shards ---------------------------------------------------------------- */

static void test_sizes(void) {
  int64_t v;
  CHECK(ckpt_parse_size("5GB", &v) && v == 5000000000);
  CHECK(ckpt_parse_size(" 5gb ", &v) && v == 5000000000);
  CHECK(ckpt_parse_size("200KB", &v) && v == 200000);
  CHECK(ckpt_parse_size("0.5MB", &v) && v == 500000);
  CHECK(ckpt_parse_size("1TB", &v) && v == 1000000000000);
  CHECK(ckpt_parse_size("1 MB", &v) && v == 1000000);
  CHECK(ckpt_parse_size("4096", &v) && v == 4096);
  const char *bad[] = {"5GiB", "GB", "-1MB", "5XB", "", "0", "0KB", "1e400GB"};
  for (size_t i = 0; i < ARRAY_LEN(bad); i++)
    if (!CHECK(!ckpt_parse_size(bad[i], &v)))
      printf("    accepted '%s'\n", bad[i]);
  printf("ok  sizes as huggingface_hub's parse_size_to_int reads them\n");
}

static bool plan_is(const int64_t *sizes, int n, int64_t max, const int *want, int want_n) {
  int got[16];
  int ns = ckpt_plan_shards(sizes, n, max, got);
  bool ok = ns == want_n;
  for (int i = 0; i < n; i++)
    ok = ok && got[i] == want[i];
  if (!ok) {
    printf("    got %d shards:", ns);
    for (int i = 0; i < n; i++)
      printf(" %d", got[i]);
    printf("\n");
  }
  return ok;
}

static void test_plan(void) {
  /* hub's docstring: [6, 6, 2, 6, 2, 2] GB at 10 GB -> [6], [6+2], [6+2+2] */
  int64_t a[] = {6, 6, 2, 6, 2, 2};
  CHECK(plan_is(a, 6, 10, (int[]){0, 1, 1, 2, 2, 2}, 3));
  /* a tensor over the limit is a shard of its own, appended when met: the
   * shard being filled comes after it */
  int64_t b[] = {1, 12, 2, 9, 3};
  CHECK(plan_is(b, 5, 10, (int[]){1, 0, 1, 2, 3}, 4));
  /* exactly full is not over */
  int64_t c[] = {5, 5, 5};
  CHECK(plan_is(c, 3, 10, (int[]){0, 0, 1}, 2));
  /* everything fits: one shard (model.safetensors) */
  int64_t d[] = {1, 0, 3, 0};
  CHECK(plan_is(d, 4, 100, (int[]){0, 0, 0, 0}, 1));
  /* two big ones in a row, then small ones */
  int64_t e[] = {20, 30, 1, 1};
  CHECK(plan_is(e, 4, 10, (int[]){0, 1, 2, 2}, 3));
  char name[64];
  ckpt_shard_name(0, 1, name, sizeof name);
  CHECK(strcmp(name, "model.safetensors") == 0);
  ckpt_shard_name(2, 3, name, sizeof name);
  CHECK(strcmp(name, "model-00003-of-00003.safetensors") == 0);
  printf("ok  shard grouping as huggingface_hub's split_state_dict_into_shards_factory\n");
}

/* ---- a sharded directory --------------------------------------------------------------- */

typedef struct {
  const char *name;
  Type dtype;
  int ndim;
  int64_t shape[3];
} Spec;

/* A small model: sizes chosen so that a 1000-byte limit gives several shards. */
static const Spec specs[] = {
    {"model.embed_tokens.weight", TY_F32, 2, {20, 8}},          /* 640 B */
    {"model.layers.0.self_attn.q_proj.weight", TY_F32, 2, {8, 8}}, /* 256 */
    {"model.layers.0.feed_forward.experts.gate_up_proj", TY_F32, 3, {2, 8, 16}}, /* 1024: alone */
    {"model.layers.0.input_layernorm.weight", TY_F32, 1, {8}},   /* 32 */
    {"model.norm.weight", TY_BF16, 1, {8}},                      /* 16 */
    {"lm_head.weight", TY_F32, 2, {20, 8}},                      /* 640 */
};
enum { NSPEC = ARRAY_LEN(specs) };

static int64_t numel_of(const Spec *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++)
    n *= s->shape[i];
  return n;
}

static float value(int t, int64_t i) { return (float)(t * 1000 + i) * 0.25f; }

/* The tensors' data, and views of them. */
static void *data[NSPEC];
static StView views[NSPEC];

static void make_views(void) {
  for (int t = 0; t < NSPEC; t++) {
    int64_t n = numel_of(&specs[t]);
    data[t] = malloc((size_t)n * 4 + 1);
    for (int64_t i = 0; i < n; i++) {
      if (specs[t].dtype == TY_BF16)
        ((uint16_t *)data[t])[i] = optc_f32_to_bf16(value(t, i));
      else
        ((float *)data[t])[i] = value(t, i);
    }
    views[t] = (StView){.name = specs[t].name, .dtype = specs[t].dtype, .ndim = specs[t].ndim, .data = data[t]};
    memcpy(views[t].shape, specs[t].shape, sizeof specs[t].shape);
  }
}

static void mkdir_or_die(const char *p) {
  if (mkdir(p, 0755) != 0 && errno != EEXIST)
    die(p);
}

/* Wants for every spec, into fresh f32 buffers (bufs[t]). */
static void make_wants(CkptWant *w, float **bufs) {
  for (int t = 0; t < NSPEC; t++) {
    int64_t n = numel_of(&specs[t]);
    bufs[t] = calloc((size_t)n + 1, sizeof(float));
    w[t] = (CkptWant){specs[t].name, specs[t].ndim, specs[t].shape, TY_F32, bufs[t], 0, n};
  }
}

static void free_bufs(float **bufs) {
  for (int t = 0; t < NSPEC; t++)
    free(bufs[t]);
}

static void test_write_read(void) {
  const char *dir = at("sharded");
  mkdir_or_die(dir);
  int ns;
  CHECK(ckpt_write_model(dir, views, NSPEC, 1000, &ns) == 0);
  /* 640 | 256+32+16 ... : [embed] [q, ln, norm]... as hub groups them */
  int64_t sizes[NSPEC];
  int shard_of[NSPEC];
  for (int t = 0; t < NSPEC; t++)
    sizes[t] = numel_of(&specs[t]) * type_size(specs[t].dtype);
  int want_ns = ckpt_plan_shards(sizes, NSPEC, 1000, shard_of);
  CHECK(ns == want_ns && ns >= 3);
  /* the index: every tensor, in the shard the plan gives, and the total */
  json_error_t je;
  json_t *idx = json_load_file(at("sharded/model.safetensors.index.json"), 0, &je);
  if (CHECK(idx != NULL)) {
    json_t *wm = json_object_get(idx, "weight_map");
    CHECK(json_object_size(wm) == NSPEC);
    int64_t total = 0;
    for (int t = 0; t < NSPEC; t++) {
      char name[64];
      ckpt_shard_name(shard_of[t], ns, name, sizeof name);
      const char *got = json_string_value(json_object_get(wm, specs[t].name));
      CHECK(got && strcmp(got, name) == 0);
      total += sizes[t];
    }
    CHECK(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) == total);
    json_decref(idx);
  }
  for (int s = 0; s < ns; s++) {
    char name[64];
    ckpt_shard_name(s, ns, name, sizeof name);
    StFile f;
    if (CHECK(st_open(at("sharded/%s", name), &f) == 0)) {
      CHECK(f.n >= 1);
      const char *fmt = tf_get_meta(&f.meta, "format");
      CHECK(fmt && strcmp(fmt, "pt") == 0);
      st_close(&f);
    }
  }
  /* read back through the index: every value, bf16 widened exactly */
  CkptDir d;
  if (CHECK(ckpt_dir_open(&d, dir, NULL, 0) == 0)) {
    CHECK(d.indexed && d.nfiles == ns && d.nnames == NSPEC);
    CkptWant w[NSPEC];
    float *bufs[NSPEC];
    make_wants(w, bufs);
    CHECK(ckpt_dir_load(&d, w, NSPEC, NULL) == 0);
    bool same = true;
    for (int t = 0; t < NSPEC; t++)
      for (int64_t i = 0; i < numel_of(&specs[t]); i++)
        same &= bufs[t][i] == (specs[t].dtype == TY_BF16 ? optc_bf16_to_f32(optc_f32_to_bf16(value(t, i)))
                                                         : value(t, i));
    CHECK(same);
    free_bufs(bufs);
    /* a range: elements [5, 17) of the embedding, nothing else touched */
    float part[160] = {0};
    CkptWant r = {specs[0].name, 2, specs[0].shape, TY_F32, part, 5, 17};
    CHECK(ckpt_dir_load(&d, &r, 1, "model.embed_tokens") == 0);
    same = part[4] == 0 && part[17] == 0;
    for (int i = 5; i < 17; i++)
      same &= part[i] == value(0, i);
    CHECK(same);
    /* f32 to bf16 rounds to nearest even, as torch's .to(bfloat16) */
    uint16_t h[160];
    CkptWant rb = {specs[0].name, 2, specs[0].shape, TY_BF16, h, 0, 160};
    CHECK(ckpt_dir_load(&d, &rb, 1, "model.embed_tokens") == 0);
    same = true;
    for (int i = 0; i < 160; i++)
      same &= h[i] == optc_f32_to_bf16(value(0, i));
    CHECK(same);
    ckpt_dir_close(&d);
  }
  /* the same listed explicitly, as checkpoint_files lists them */
  char **files, why[256];
  int nf;
  char maxname[8];
  snprintf(maxname, sizeof maxname, "%05d", ns);
  CHECK(ckpt_format_files("model-{}-of-{}.safetensors", maxname, &files, &nf, why, sizeof why) == 0);
  if (CHECK(ckpt_dir_open(&d, dir, (const char *const *)files, nf) == 0))
    ckpt_dir_close(&d);
  ckpt_strings_free(files, nf);
  /* one shard when it fits: model.safetensors, no index */
  const char *one = at("single");
  mkdir_or_die(one);
  CHECK(ckpt_write_model(one, views, NSPEC, (int64_t)5e9, &ns) == 0 && ns == 1);
  CHECK(access(at("single/model.safetensors"), F_OK) == 0);
  CHECK(access(at("single/model.safetensors.index.json"), F_OK) != 0);
  if (CHECK(ckpt_dir_open(&d, one, NULL, 0) == 0)) {
    CHECK(!d.indexed && d.nfiles == 1 && d.nnames == NSPEC);
    ckpt_dir_close(&d);
  }
  printf("ok  a %d-shard directory and its index written as huggingface_hub writes them, read back through the "
         "index, whole, in ranges and converted\n",
         want_ns);
}

/* ---- bad checkpoints ---------------------------------------------------------------------------- */

static void copy_dir(const char *from, const char *to) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
  if (system(cmd) != 0)
    die(cmd);
}

/* Loading dir with the wants for the specs (spec k reshaped, or dropped
 * when k < 0, or one more when extra) fails, and every needle is in the
 * messages. */
static void expect_load_fails(const char *what, const char *dir, const CkptWant *w, int n, const char *const *needles,
                              int nneedles) {
  CkptDir d;
  capture_begin();
  int rc = ckpt_dir_open(&d, dir, NULL, 0);
  if (rc == 0) {
    rc = ckpt_dir_load(&d, w, n, NULL);
    ckpt_dir_close(&d);
  }
  const char *msg = capture_end();
  bool ok = CHECK(rc == -1) && CHECK(strncmp(msg, "optc: error: ", 13) == 0) && CHECK(mentions(msg, needles, nneedles));
  printf("%s  %s: %.*s\n", ok ? "ok" : "FAILED", what, (int)strcspn(msg, "\n"), msg);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0)
    die(path);
}

static void test_bad(void) {
  char good[512], bad[512];
  snprintf(good, sizeof good, "%s", at("sharded"));
  snprintf(bad, sizeof bad, "%s", at("bad_index"));
  CkptWant w[NSPEC + 1];
  float *bufs[NSPEC];
  make_wants(w, bufs);
  char shard0[64], shard1[64];
  int64_t sizes[NSPEC];
  int shard_of[NSPEC];
  for (int t = 0; t < NSPEC; t++)
    sizes[t] = numel_of(&specs[t]) * type_size(specs[t].dtype);
  int ns = ckpt_plan_shards(sizes, NSPEC, 1000, shard_of);
  ckpt_shard_name(shard_of[1], ns, shard0, sizeof shard0); /* q_proj's */
  ckpt_shard_name(shard_of[2], ns, shard1, sizeof shard1); /* gate_up_proj's */

  /* a tensor the model needs and no shard has */
  int64_t extra_shape[2] = {8, 8};
  w[NSPEC] = (CkptWant){"model.layers.0.self_attn.k_proj.weight", 2, extra_shape, TY_F32, bufs[1], 0, 64};
  expect_load_fails("missing tensor", good, w, NSPEC + 1,
                    (const char *[]){"model.layers.0.self_attn.k_proj.weight", "missing", good, "F32 [8, 8]"}, 4);
  /* a tensor a shard has and the model does not */
  expect_load_fails("unexpected tensor", good, w + 1, NSPEC - 1,
                    (const char *[]){"unexpected tensor 'model.embed_tokens.weight'", ".safetensors"}, 2);
  /* a shape that differs */
  int64_t wrong[2] = {8, 4};
  CkptWant ws[NSPEC];
  memcpy(ws, w, sizeof ws);
  ws[1].shape = wrong;
  ws[1].hi = 32;
  expect_load_fails("mis-shaped tensor", good, ws, NSPEC,
                    (const char *[]){"model.layers.0.self_attn.q_proj.weight", shard0, "F32 [8, 8]", "needs F32 [8, 4]"}, 4);
  /* an integer tensor where a weight goes */
  const char *idir = at("ints");
  mkdir_or_die(idir);
  int32_t iv[64] = {0};
  StView iview = {.name = specs[1].name, .dtype = TY_I32, .ndim = 2, .shape = {8, 8}, .data = iv};
  CHECK(ckpt_write_model(idir, &iview, 1, (int64_t)5e9, NULL) == 0);
  expect_load_fails("integer weights", idir, &w[1], 1, (const char *[]){specs[1].name, "I32", "model.safetensors"}, 3);

  /* the index names a file that is not there */
  copy_dir(good, bad);
  char p[600];
  snprintf(p, sizeof p, "%s/%s", bad, shard1);
  unlink(p);
  expect_load_fails("index names a missing shard", bad, w, NSPEC, (const char *[]){"cannot open", shard1}, 2);
  /* the index places a tensor in the wrong shard */
  copy_dir(good, bad);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", bad);
  json_error_t je;
  json_t *idx = json_load_file(p, 0, &je);
  json_object_set_new(json_object_get(idx, "weight_map"), specs[1].name, json_string(shard1));
  json_dump_file(idx, p, JSON_INDENT(2));
  expect_load_fails("index disagrees with a shard", bad, w, NSPEC,
                    (const char *[]){"model.safetensors.index.json", specs[1].name, shard0, shard1}, 4);
  /* a tensor in a shard that the index does not list */
  json_object_del(json_object_get(idx, "weight_map"), specs[1].name);
  json_dump_file(idx, p, JSON_INDENT(2));
  expect_load_fails("shard holds a tensor the index lacks", bad, w, NSPEC,
                    (const char *[]){specs[1].name, shard0, "is not in"}, 3);
  json_decref(idx);
  /* an index that is not one */
  write_text(p, "{\"metadata\": {}, \"weight_map\": [1, 2]}");
  expect_load_fails("index without a weight_map", bad, w, NSPEC, (const char *[]){"weight_map", p}, 2);
  write_text(p, "{\"weight_map\": {\"a\": ");
  expect_load_fails("index that is not JSON", bad, w, NSPEC, (const char *[]){p}, 1);
  /* a tensor in two shards, with no index to say which */
  copy_dir(good, bad);
  unlink(p);
  const char *dupdir = at("bad_index/model-00009-of-00009.safetensors");
  StView dupv = views[1];
  CHECK(st_write_views(dupdir, &dupv, 1, NULL, 0) == 0);
  expect_load_fails("tensor in two shards", bad, w, NSPEC,
                    (const char *[]){"in both", specs[1].name, shard0, "model-00009-of-00009.safetensors"}, 4);

  /* corrupt shards: truncated, and a header that is not JSON */
  copy_dir(good, bad);
  snprintf(p, sizeof p, "%s/%s", bad, shard1);
  struct stat st;
  if (stat(p, &st) != 0 || truncate(p, st.st_size - 100) != 0)
    die("truncate");
  expect_load_fails("truncated shard", bad, w, NSPEC, (const char *[]){shard1, "truncated"}, 2);
  copy_dir(good, bad);
  int fd = open(p, O_WRONLY);
  if (fd < 0 || pwrite(fd, "#!oops", 6, 9) != 6)
    die("corrupting a shard");
  close(fd);
  expect_load_fails("shard with a corrupt header", bad, w, NSPEC, (const char *[]){shard1, "not valid JSON"}, 2);
  copy_dir(good, bad);
  fd = open(p, O_WRONLY);
  unsigned char huge[8] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
  if (fd < 0 || pwrite(fd, huge, 8, 0) != 8)
    die("corrupting a shard");
  close(fd);
  expect_load_fails("shard with a wild header length", bad, w, NSPEC, (const char *[]){shard1, "header"}, 2);
  /* a file that changed after its header was read: the data is short */
  copy_dir(good, bad);
  CkptDir d;
  if (CHECK(ckpt_dir_open(&d, bad, NULL, 0) == 0)) {
    if (truncate(p, 200) != 0)
      die("truncate");
    capture_begin();
    int rc = ckpt_dir_load(&d, w, NSPEC, NULL);
    const char *msg = capture_end();
    CHECK(rc == -1 && mentions(msg, (const char *[]){shard1, "file ended", specs[2].name}, 3));
    ckpt_dir_close(&d);
  }
  /* many problems: the first dozen printed, the rest counted */
  CkptWant many[40];
  int64_t sh[1] = {3};
  char names[40][32];
  for (int i = 0; i < 40; i++) {
    snprintf(names[i], sizeof names[i], "not.there.%d", i);
    many[i] = (CkptWant){names[i], 1, sh, TY_F32, bufs[0], 0, 3};
  }
  expect_load_fails("forty missing tensors", good, many, 40, (const char *[]){"not.there.0", "more problems"}, 2);
  free_bufs(bufs);
}

/* ---- streaming: peak RSS -------------------------------------------------------------------------- */

static long vm_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f)
    return -1;
  char line[256];
  long kb = -1;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0 && line[n] == ':')
      kb = strtol(line + n + 1, NULL, 10);
  fclose(f);
  return kb;
}

/* Resets VmHWM to the current RSS (Linux >= 4.0). */
static bool reset_peak(void) {
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0)
    return false;
  bool ok = write(fd, "5", 1) == 1;
  close(fd);
  return ok;
}

static void test_streaming(void) {
  enum { SHARDS = 6, PER = 32 << 20, TENSORS_PER = 4 };
  const int64_t total = (int64_t)SHARDS * PER;
  const char *dir = at("big");
  mkdir_or_die(dir);
  /* write shard by shard from one shard-sized buffer: 24 tensors of 8 MB
   * in bf16 and f32 */
  char *buf = malloc(PER);
  if (!buf)
    die("malloc");
  StView v[TENSORS_PER];
  char names[SHARDS * TENSORS_PER][48];
  int64_t shapes[SHARDS * TENSORS_PER][2];
  for (int s = 0; s < SHARDS; s++) {
    for (int k = 0; k < TENSORS_PER; k++) {
      int t = s * TENSORS_PER + k;
      snprintf(names[t], sizeof names[t], "model.layers.%d.w%d", s, k);
      Type ty = t % 2 ? TY_BF16 : TY_F32;
      int64_t numel = (PER / TENSORS_PER) / type_size(ty);
      shapes[t][0] = numel / 1024;
      shapes[t][1] = 1024;
      char *p = buf + (size_t)k * (PER / TENSORS_PER);
      for (int64_t i = 0; i < numel; i++) {
        float x = (float)((t * 7 + i) % 1000) - 500;
        if (ty == TY_BF16)
          ((uint16_t *)p)[i] = optc_f32_to_bf16(x);
        else
          ((float *)p)[i] = x;
      }
      v[k] = (StView){.name = names[t], .dtype = ty, .ndim = 2, .shape = {shapes[t][0], 1024}, .data = p};
    }
    char name[64];
    ckpt_shard_name(s, SHARDS, name, sizeof name);
    if (st_write_views(at("big/%s", name), v, TENSORS_PER, NULL, 0) != 0)
      die("writing a big shard");
  }
  free(buf);
  /* the destination: every tensor as the model keeps it, mapped and
   * touched so that it is resident: first in the dtype stored (a bf16
   * recipe), then all f32 (an fp32 recipe: the bf16 ones widened through
   * the conversion scratch) */
  for (int mode = 0; mode < 2; mode++) {
    CkptWant w[SHARDS * TENSORS_PER];
    size_t bytes = 0;
    for (int t = 0; t < SHARDS * TENSORS_PER; t++) {
      Type ty = mode == 1 ? TY_F32 : t % 2 ? TY_BF16 : TY_F32;
      w[t] = (CkptWant){names[t], 2, shapes[t], ty, (void *)bytes, 0, shapes[t][0] * 1024};
      bytes += (size_t)(shapes[t][0] * 1024 * type_size(ty));
    }
    char *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED)
      die("mmap");
    memset(dst, 0, bytes);
    for (int t = 0; t < SHARDS * TENSORS_PER; t++)
      w[t].dst = dst + (size_t)w[t].dst;
    long rss0 = vm_kb("VmRSS");
    bool can_reset = reset_peak();
    CkptDir d;
    double t0 = now_seconds();
    if (CHECK(ckpt_dir_open(&d, dir, NULL, 0) == 0)) {
      CHECK(d.nfiles == SHARDS && !d.indexed);
      CHECK(ckpt_dir_load(&d, w, SHARDS * TENSORS_PER, NULL) == 0);
      ckpt_dir_close(&d);
    }
    double secs = now_seconds() - t0;
    long peak = vm_kb("VmHWM");
    bool same = true;
    for (int t = 0; t < SHARDS * TENSORS_PER && same; t++) {
      const char *p = w[t].dst;
      for (int64_t i = 0; i < w[t].hi; i += 4099) {
        float x = (float)((t * 7 + i) % 1000) - 500;
        if (t % 2) /* stored in bf16 */
          x = optc_bf16_to_f32(optc_f32_to_bf16(x));
        same &= w[t].dtype == TY_BF16 ? ((const uint16_t *)p)[i] == optc_f32_to_bf16(x) : ((const float *)p)[i] == x;
      }
    }
    CHECK(same);
    long over = peak - rss0;
    printf("%s  streaming load (%s): %d shards of %d MB (%lld MB on disk) into a resident %zu MB buffer in %.2f s: "
           "peak RSS %.1f MB, %.1f MB above the RSS with the buffer resident, before loading%s\n",
           same ? "ok" : "FAILED", mode ? "bf16 widened to f32" : "as stored", SHARDS, PER >> 20,
           (long long)(total >> 20), bytes >> 20, secs, peak / 1024.0, over / 1024.0,
           can_reset ? "" : " [VmHWM not resettable: bound not checked]");
#if !defined(__SANITIZE_ADDRESS__)
    /* the bound: the buffer plus less than one shard (headers, and 8 MB of
     * conversion scratch at most) */
    if (can_reset)
      CHECK(over < (PER >> 10));
#endif
    munmap(dst, bytes);
  }
}

/* ckpt_clean_stale removes what a writer killed mid-save left, and nothing a
 * live writer still owns: a pid that is gone, a zombie (what a rank killed
 * under mpirun becomes where PID 1 reaps no orphans), and a live pid younger
 * than its entry (reused) are stale; our own pid and a live older one not. */
static void test_clean_stale(void) {
  mkdir_or_die(at("stale"));
  pid_t zombie = fork(), live, gone = fork();
  if (zombie == 0 || gone == 0)
    _exit(0);
  if ((live = fork()) == 0) {
    pause();
    _exit(0);
  }
  CHECK(zombie > 0 && live > 0 && gone > 0);
  CHECK(waitpid(gone, NULL, 0) == gone); /* gone; the zombie is left unreaped */
  for (int i = 0; i < 200; i++) {        /* until the zombie has exited */
    char path[64], buf[256] = {0};
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)zombie);
    FILE *f = fopen(path, "r");
    if (!f)
      break;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (strstr(buf, ") Z"))
      break;
    usleep(10000);
  }
  struct { const char *name; long pid; bool stays; int age; } cases[] = {
      {".step_3.tmp.%ld", (long)zombie, false, 0},
      {".step_4.tmp.%ld", (long)gone, false, 0},
      {".step_5.tmp.%ld", (long)getpid(), true, 0},
      {".step_6.tmp.%ld", (long)live, true, 0},
      {".step_7.tmp.%ld", (long)live, false, 3600}, /* written an hour before live started */
      {"latest.tmp.%ld", (long)zombie, false, 0},
      {"step_8.keep.%ld", (long)zombie, true, 0}, /* not a name a save uses */
  };
  int n = (int)(sizeof cases / sizeof cases[0]);
  char names[16][128];
  for (int i = 0; i < n; i++) {
    snprintf(names[i], sizeof names[i], cases[i].name, cases[i].pid);
    const char *p = at("stale/%s", names[i]);
    if (cases[i].name[0] == 'l')
      write_text(p, "step_2");
    else
      mkdir_or_die(p);
    if (cases[i].age) {
      struct timespec ts[2] = {{.tv_sec = time(NULL) - cases[i].age}, {.tv_sec = time(NULL) - cases[i].age}};
      CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
    }
  }
  CHECK(ckpt_clean_stale(at("stale")) == 0);
  for (int i = 0; i < n; i++) {
    struct stat st;
    bool there = stat(at("stale/%s", names[i]), &st) == 0;
    if (there != cases[i].stays)
      printf("  clean_stale: %s %s\n", names[i], there ? "was kept" : "was removed");
    CHECK(there == cases[i].stays);
  }
  kill(live, SIGKILL);
  waitpid(live, NULL, 0);
  waitpid(zombie, NULL, 0);
  printf("ok  clean_stale: a gone, a zombie and a reused pid's saves removed; ours and a live writer's kept\n");
}

int main(void) {
  test_dir_make("test_ckpt");
  make_views();
  test_format();
  test_sizes();
  test_plan();
  test_write_read();
  test_bad();
  test_streaming();
  test_clean_stale();
  for (int t = 0; t < NSPEC; t++)
    free(data[t]);
  test_dir_remove();
  printf("%s: %d checks, %d failed\n", nfailed ? "FAIL" : "PASS", nchecks, nfailed);
  return nfailed ? 1 : 0;
}
