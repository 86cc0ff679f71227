/* hfdata.c: what torchtune's datasets read, read as Hugging Face's
 * load_dataset(source, data_files=..., split=...) reads it: local JSON,
 * JSON Lines and Parquet files, datasets in the local hub cache, and split
 * strings with slices. See data.h. */
#include "data.h"
#include "parquet.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <glob.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

/* ---- split strings -------------------------------------------------------------
 * datasets' ReadInstruction.from_spec: `sub (+ sub)*`, subs separated by
 * \s*\+\s*, each matching
 *   ^(\w+(\.\w+)*)(\[((-?[\d_]+)(%)?)?:((-?[\d_]+)(%)?)?\])?(\(([^)]*)\))?$
 * with the numbers read by Python's int() (underscores only between digits). */

static bool word_char(unsigned char c) {
  return c == '_' || (c >= '0' && c <= '9') || (unsigned)((c | 32) - 'a') < 26u || c >= 0x80;
}

/* int() of s[0..n): an optional '-', digits with single '_' between them. */
static bool py_int(const char *s, size_t n, int64_t *out) {
  size_t i = 0;
  bool neg = false;
  if (i < n && s[i] == '-')
    neg = true, i++;
  if (i == n)
    return false;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < n; i++) {
    if (s[i] == '_') {
      if (!prev_digit || i + 1 == n)
        return false;
      prev_digit = false;
      continue;
    }
    if (s[i] < '0' || s[i] > '9')
      return false;
    if (v > (INT64_MAX - 9) / 10)
      return false; /* beyond any dataset: treated as malformed */
    v = v * 10 + (s[i] - '0');
    prev_digit = true;
  }
  *out = neg ? -v : v;
  return true;
}

PRINTF(3, 4) static int split_fail(char *why, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, n, fmt, ap);
  va_end(ap);
  return -1;
}

/* One sub: the regex above, by hand. */
static int parse_sub(const char *s, size_t n, SplitSpec *o, char *why, size_t wn) {
  *o = (SplitSpec){0};
  size_t i = 0;
  /* \w+(\.\w+)* */
  for (;;) {
    size_t w0 = i;
    while (i < n && word_char((unsigned char)s[i]))
      i++;
    if (i == w0)
      goto bad;
    if (i < n && s[i] == '.' && i + 1 < n && word_char((unsigned char)s[i + 1])) {
      i++;
      continue;
    }
    break;
  }
  if (i >= sizeof o->split)
    goto bad;
  memcpy(o->split, s, i);
  o->split[i] = 0;
  bool from_pct = false, to_pct = false;
  if (i < n && s[i] == '[') {
    i++;
    size_t a = i;
    while (i < n && s[i] != ':' && s[i] != ']')
      i++;
    if (i >= n || s[i] != ':')
      goto bad;
    size_t ae = i;
    if (ae > a && s[ae - 1] == '%')
      from_pct = true, ae--;
    if (ae > a) {
      if (!py_int(s + a, ae - a, &o->from))
        goto bad;
      o->has_from = true;
    } else if (from_pct) {
      goto bad;
    }
    i++;
    size_t b = i;
    while (i < n && s[i] != ']')
      i++;
    if (i >= n)
      goto bad;
    size_t be = i;
    if (be > b && s[be - 1] == '%')
      to_pct = true, be--;
    if (be > b) {
      if (!py_int(s + b, be - b, &o->to))
        goto bad;
      o->has_to = true;
    } else if (to_pct) {
      goto bad;
    }
    i++;
  }
  const char *rounding = NULL;
  size_t rlen = 0;
  if (i < n && s[i] == '(') {
    size_t r = ++i;
    while (i < n && s[i] != ')')
      i++;
    if (i >= n)
      goto bad;
    rounding = s + r;
    rlen = i - r;
    i++;
  }
  if (i != n)
    goto bad;
  o->pct = from_pct || to_pct;
  /* _RelativeInstruction.__post_init__ */
  if (rounding) {
    bool closest = rlen == 7 && !memcmp(rounding, "closest", 7);
    bool pct1 = rlen == 18 && !memcmp(rounding, "pct1_dropremainder", 18);
    if (!closest && !pct1)
      return split_fail(why, wn, "rounding must be either closest or pct1_dropremainder");
    if (!o->pct)
      return split_fail(why, wn, "It is forbidden to specify rounding if not using percent slicing.");
    o->pct1 = pct1;
  }
  if (o->pct && ((o->has_from && llabs(o->from) > 100) || (o->has_to && llabs(o->to) > 100)))
    return split_fail(why, wn, "Percent slice boundaries must be > -100 and < 100.");
  return 0;
bad:
  return split_fail(why, wn, "Unrecognized instruction format: %.*s", (int)n, s);
}

static bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* NamedSplit's check, which load_dataset makes first: each '+'-separated
 * part, up to its first '[', must match ^\w+(\.\w+)*$ as it stands. */
static int named_split_check(const char *spec, char *why, size_t wn) {
  const char *p = spec;
  for (;;) {
    const char *plus = strchr(p, '+');
    size_t n = plus ? (size_t)(plus - p) : strlen(p);
    const char *br = memchr(p, '[', n);
    size_t m = br ? (size_t)(br - p) : n;
    bool ok = m > 0;
    for (size_t i = 0; i < m && ok;) {
      size_t w = i;
      while (i < m && word_char((unsigned char)p[i]))
        i++;
      ok = i > w && (i == m || (p[i] == '.' && ++i < m));
    }
    if (!ok)
      return split_fail(why, wn, "Split name should match '^\\w+(\\.\\w+)*$' but got '%.*s'.", (int)m, p);
    if (!plus)
      return 0;
    p = plus + 1;
  }
}

int split_parse(const char *spec, SplitSpec *out, int max, char *why, size_t wn) {
  int k = 0;
  size_t n = strlen(spec), i = 0;
  if (named_split_check(spec, why, wn) != 0)
    return -1;
  for (;;) {
    /* re.split(r"\s*\+\s*"): a sub ends at the whitespace before a '+' */
    size_t s = i, e = i;
    while (e < n && spec[e] != '+')
      e++;
    size_t next = e;
    if (e < n)
      while (e > s && py_space(spec[e - 1]))
        e--;
    if (k == max)
      return split_fail(why, wn, "more than %d splits added together", max);
    if (parse_sub(spec + s, e - s, &out[k], why, wn) != 0)
      return -1;
    k++;
    if (next >= n)
      break;
    i = next + 1;
    while (i < n && py_space(spec[i]))
      i++;
  }
  /* ReadInstruction.__add__: percent subs must agree with the first on rounding */
  for (int j = 1; j < k; j++)
    if (out[0].pct && out[j].pct && out[0].pct1 != out[j].pct1)
      return split_fail(why, wn, "It is forbidden to sum ReadInstruction instances with different rounding values.");
  return k;
}

/* Python's round() of the double x: to nearest, ties to even. */
static int64_t py_round(double x) { return (int64_t)nearbyint(x); }

int split_absolute(const SplitSpec *s, int64_t n, int64_t *from, int64_t *to, char *why, size_t wn) {
  int64_t f, t;
  if (s->pct) {
    if (s->pct1 && n < 100)
      return split_fail(why, wn,
                        "Using \"pct1_dropremainder\" rounding on a split with less than 100 elements is forbidden: "
                        "it always results in an empty dataset.");
    /* _pct_to_abs_closest: int(round(boundary * num_examples / 100.0));
     * _pct_to_abs_pct1: boundary * math.trunc(num_examples / 100.0) */
    if (s->pct1) {
      int64_t unit = (int64_t)trunc((double)n / 100.0);
      f = s->has_from ? s->from * unit : 0;
      t = s->has_to ? s->to * unit : n;
    } else {
      f = s->has_from ? py_round((double)(s->from * n) / 100.0) : 0;
      t = s->has_to ? py_round((double)(s->to * n) / 100.0) : n;
    }
  } else {
    f = s->has_from ? s->from : 0;
    t = s->has_to ? s->to : n;
  }
  if (f < 0)
    f = MAX(n + f, 0);
  if (t < 0)
    t = MAX(n + t, 0);
  *from = MIN(f, n);
  *to = MIN(t, n);
  return 0;
}

/* ---- tables ----------------------------------------------------------------------- */

void hf_table_free(HfTable *t) {
  for (int i = 0; i < t->n; i++)
    json_decref(t->rows[i]);
  free(t->rows);
  free(t->pos);
  for (int i = 0; i < t->nfiles; i++) {
    free((char *)t->files[i].name);
    free((char *)t->files[i].text);
  }
  free(t->files);
  for (int i = 0; i < t->ncols; i++) {
    free((char *)t->cols[i].name);
    free((char *)t->cols[i].why);
  }
  free(t->cols);
  *t = (HfTable){0};
}

int hf_find_column(const HfTable *t, const char *name) {
  for (int i = 0; i < t->ncols; i++)
    if (strcmp(t->cols[i].name, name) == 0)
      return i;
  return -1;
}

static void add_column_why(HfTable *t, const char *name, HfColumnKind kind, const char *why) {
  int i = hf_find_column(t, name);
  if (i < 0) {
    t->cols = realloc(t->cols, sizeof(HfColumn) * (size_t)(t->ncols + 1));
    ASSERT(t->cols);
    t->cols[t->ncols].name = strdup(name);
    ASSERT(t->cols[t->ncols].name);
    t->cols[t->ncols] = (HfColumn){t->cols[t->ncols].name, HF_COL_OK, NULL};
    i = t->ncols++;
  }
  if (kind != HF_COL_OK && t->cols[i].kind == HF_COL_OK) {
    t->cols[i].kind = kind;
    if (why) {
      t->cols[i].why = strdup(why);
      ASSERT(t->cols[i].why);
    }
  }
}

static void add_column(HfTable *t, const char *name, HfColumnKind kind) { add_column_why(t, name, kind, NULL); }

static int add_file(HfTable *t, const char *name, char *text, size_t len) {
  t->files = realloc(t->files, sizeof(SrcFile) * (size_t)(t->nfiles + 1));
  ASSERT(t->files);
  char *nm = strdup(name);
  ASSERT(nm);
  t->files[t->nfiles] = (SrcFile){nm, text, len};
  return t->nfiles++;
}

/* Takes the reference to obj; with scan, its keys join the columns. */
static void add_row_at(HfTable *t, json_t *obj, HfRowPos pos, bool scan) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 256;
    t->rows = realloc(t->rows, sizeof(json_t *) * (size_t)t->cap);
    t->pos = realloc(t->pos, sizeof(HfRowPos) * (size_t)t->cap);
    ASSERT(t->rows && t->pos);
  }
  t->rows[t->n] = obj;
  t->pos[t->n++] = pos;
  if (!scan)
    return;
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) add_column(t, key, HF_COL_OK);
}

static void add_row(HfTable *t, json_t *obj, HfRowPos pos) { add_row_at(t, obj, pos, true); }

void hf_row_message(const HfTable *t, int i, bool warning, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  HfRowPos p = t->pos[i];
  const SrcFile *f = &t->files[p.file];
  Buf b = {0};
  buf_vprintf(&b, fmt, ap);
  va_end(ap);
  if (p.line > 0 && !warning)
    error_at((SrcPos){f, p.line, p.col}, "%s", b.data);
  else if (p.line > 0)
    diag_printf("%s:%d:%d: warning: %s (line skipped)\n", f->name, p.line, p.col, b.data);
  else if (!warning)
    error("%s: row %lld: %s", f->name, (long long)p.index, b.data);
  else
    diag_printf("%s: row %lld: warning: %s (row skipped)\n", f->name, (long long)p.index, b.data);
  buf_free(&b);
}

/* ---- JSON and JSON Lines --------------------------------------------------------------
 * datasets' json builder: a file whose first byte (after a UTF-8 BOM) is '['
 * is one JSON array of objects (or of strings, each then {"text": s});
 * anything else is JSON Lines, one object per line, blank lines ignored. */

typedef struct {
  HfTable *t;
  bool skip_bad;
  int *bad; /* malformed lines skipped, over all files */
} JsonCtx;

static void bad_json(JsonCtx *c, SrcPos pos, int nbad_here, const char *fmt, ...) PRINTF(4, 5);
static void bad_json(JsonCtx *c, SrcPos pos, int nbad_here, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!c->skip_bad) {
    verror_at(pos, fmt, ap);
  } else if (*c->bad + nbad_here <= 10) {
    Buf b = {0};
    buf_vprintf(&b, fmt, ap);
    diag_printf("%s:%d:%d: warning: %s (line skipped)\n", pos.file->name, pos.line, pos.col, b.data);
    buf_free(&b);
  }
  va_end(ap);
}

static bool load_json_lines(JsonCtx *c, int fi, size_t start) {
  const SrcFile *src = &c->t->files[fi];
  const char *text = src->text;
  size_t len = src->len, i = start;
  int bad_here = 0;
  bool ok = true;
  for (int line = 1; i < len && ok; line++) {
    size_t s = i;
    while (i < len && text[i] != '\n')
      i++;
    size_t e = i++;
    if (e > s && text[e - 1] == '\r')
      e--;
    size_t k = s;
    while (k < e && (text[k] == ' ' || text[k] == '\t'))
      k++;
    if (k == e)
      continue;
    SrcPos pos = {src, line, (int)(k - s) + 1};
    json_error_t err;
    json_t *obj = json_loadb(text + s, e - s, 0, &err);
    if (!obj || !json_is_object(obj)) {
      bad_here++;
      if (!obj) {
        pos.col = MAX(err.position, 1);
        bad_json(c, pos, bad_here, "malformed JSON: %s", err.text);
      } else {
        bad_json(c, pos, bad_here, "a line must be a JSON object");
      }
      json_decref(obj);
      ok = c->skip_bad;
      continue;
    }
    add_row(c->t, obj, (HfRowPos){fi, pos.line, pos.col, 0});
  }
  *c->bad += bad_here;
  return ok;
}

/* Where the JSON value starting at text[i] ends (one past it), scanning
 * only strings and brackets (jansson parses it after); len on a value that
 * never ends. */
static size_t json_value_end(const char *text, size_t len, size_t i) {
  int depth = 0;
  for (; i < len; i++) {
    char ch = text[i];
    if (ch == '"') {
      for (i++; i < len && text[i] != '"'; i++)
        if (text[i] == '\\')
          i++;
      if (depth == 0)
        return i + 1 < len ? i + 1 : len;
    } else if (ch == '[' || ch == '{') {
      depth++;
    } else if (ch == ']' || ch == '}') {
      if (--depth <= 0)
        return depth < 0 ? i : i + 1;
    } else if (depth == 0 && (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r')) {
      return i;
    }
  }
  return len;
}

static size_t skip_ws(const char *t, size_t len, size_t i) {
  while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r'))
    i++;
  return i;
}

/* A JSON array of objects (or strings): each element parsed on its own, so
 * a row's position is its element's. */
static bool load_json_array(JsonCtx *c, int fi, size_t start) {
  const SrcFile *src = &c->t->files[fi];
  const char *text = src->text;
  size_t len = src->len, i = skip_ws(text, len, start + 1);
  int kind = 0; /* 1 objects, 2 strings */
  if (i < len && text[i] == ']') {
    i = skip_ws(text, len, i + 1);
    if (i != len) {
      error_at(srcpos_of(src, i), "unexpected text after the JSON array");
      return false;
    }
    return true;
  }
  for (;;) {
    if (i >= len) {
      error_at(srcpos_of(src, len), "malformed JSON: the array is not closed");
      return false;
    }
    size_t e = json_value_end(text, len, i);
    json_error_t err;
    json_t *v = json_loadb(text + i, e - i, JSON_DECODE_ANY, &err);
    if (!v) {
      error_at(srcpos_of(src, i + (size_t)MAX(err.position - 1, 0)), "malformed JSON: %s", err.text);
      return false;
    }
    SrcPos pos = srcpos_of(src, i);
    int k = json_is_object(v) ? 1 : json_is_string(v) ? 2 : 0;
    if (!k || (kind && k != kind)) {
      error_at(pos, "the elements of a JSON array file must all be objects (or all strings)");
      json_decref(v);
      return false;
    }
    kind = k;
    if (k == 2) {
      json_t *o = json_object();
      json_object_set_new(o, "text", v);
      v = o;
    }
    add_row(c->t, v, (HfRowPos){fi, pos.line, pos.col, 0});
    i = skip_ws(text, len, e);
    if (i < len && text[i] == ',') {
      i = skip_ws(text, len, i + 1);
      continue;
    }
    if (i < len && text[i] == ']') {
      i = skip_ws(text, len, i + 1);
      if (i != len) {
        error_at(srcpos_of(src, i), "unexpected text after the JSON array");
        return false;
      }
      return true;
    }
    error_at(srcpos_of(src, MIN(i, len)), i >= len ? "malformed JSON: the array is not closed"
                                                   : "malformed JSON: expected ',' or ']' in the array");
    return false;
  }
}

static bool load_json_file(HfTable *t, const char *path, SrcPos at, const char *what, bool skip_bad, int *bad) {
  if (!data_can_open(path, at, what))
    return false;
  size_t len;
  char *text = file_read(path, &len);
  if (!text)
    return false;
  int fi = add_file(t, path, text, len);
  size_t i = len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
  JsonCtx c = {t, skip_bad, bad};
  return i < len && text[i] == '[' ? load_json_array(&c, fi, i) : load_json_lines(&c, fi, i);
}

/* ---- Parquet files: each row an object of its flat columns ------------------------------------ */

/* Every flat column into the rows. A column that cannot be read (nested,
 * binary, an encoding or codec optc lacks, text that is not UTF-8 or holds
 * a NUL) is listed with why, and is an error only if the dataset reads it. */
static bool load_parquet_file(HfTable *t, const char *path, SrcPos at, const char *what) {
  if (!data_can_open(path, at, what))
    return false;
  ParquetFile *f = parquet_open(path);
  if (!f)
    return false;
  int fi = add_file(t, path, NULL, 0);
  int nc = parquet_num_columns(f);
  int64_t nr = parquet_num_rows(f);
  int row0 = t->n;
  for (int64_t r = 0; r < nr; r++)
    add_row_at(t, json_object(), (HfRowPos){fi, 0, 0, r}, false);
  for (int c = 0; c < nc; c++) {
    const PqColumn *col = parquet_column(f, c);
    if (col->nested || col->type == PQ_INT96 || col->type == PQ_FIXED_LEN_BYTE_ARRAY ||
        (col->type == PQ_BYTE_ARRAY && !col->text)) {
      add_column(t, col->name, col->nested ? HF_COL_NESTED : HF_COL_BINARY);
      continue;
    }
    PqValues v;
    Buf msg = {0};
    parquet_quiet(f, &msg);
    int rc = parquet_read_column(f, c, &v);
    parquet_quiet(f, NULL);
    /* the values, each a JSON value; text must be UTF-8 without NULs */
    json_t **vals = rc == 0 ? calloc((size_t)nr + 1, sizeof(json_t *)) : NULL;
    int64_t bad = -1;
    for (int64_t r = 0; r < nr && rc == 0 && bad < 0; r++) {
      size_t len = v.off ? (size_t)(v.off[r + 1] - v.off[r]) : 0;
      if (!v.valid[r])
        vals[r] = json_null();
      else if (col->type == PQ_BYTE_ARRAY)
        vals[r] = memchr(v.bytes + v.off[r], 0, len) ? NULL : json_stringn(v.bytes + v.off[r], len);
      else if (col->type == PQ_BOOLEAN)
        vals[r] = json_boolean(v.ints[r]);
      else if (col->type == PQ_FLOAT || col->type == PQ_DOUBLE) /* JSON has no NaN: null (never text) */
        vals[r] = isfinite(v.reals[r]) ? json_real(v.reals[r]) : json_null();
      else
        vals[r] = json_integer((json_int_t)v.ints[r]);
      if (!vals[r])
        bad = r;
    }
    if (rc == 0)
      pq_values_free(&v);
    if (bad >= 0) {
      buf_printf(&msg, "%s: row %lld: column '%s' is not UTF-8 text without NULs", path, (long long)bad, col->name);
      rc = -1;
    }
    if (rc != 0) {
      while (msg.len && msg.data[msg.len - 1] == '\n')
        msg.data[--msg.len] = 0;
      add_column_why(t, col->name, HF_COL_UNREADABLE, msg.data);
    } else {
      add_column(t, col->name, HF_COL_OK);
      for (int64_t r = 0; r < nr; r++)
        json_object_set_new(t->rows[row0 + r], col->name, vals[r]), vals[r] = NULL;
    }
    for (int64_t r = 0; vals && r < nr; r++)
      json_decref(vals[r]);
    free(vals);
    buf_free(&msg);
  }
  parquet_close(f);
  return true;
}

/* ---- files and globs ------------------------------------------------------------------------- */

typedef enum { FMT_JSON, FMT_PARQUET } FileFormat;

/* A list of paths (malloc'd strings). */
typedef struct {
  char **v;
  int n, cap;
} Paths;

static void paths_add(Paths *p, const char *s) {
  if (p->n == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 16;
    p->v = realloc(p->v, sizeof(char *) * (size_t)p->cap);
    ASSERT(p->v);
  }
  p->v[p->n] = strdup(s);
  ASSERT(p->v[p->n]);
  p->n++;
}

static void paths_free(Paths *p) {
  for (int i = 0; i < p->n; i++)
    free(p->v[i]);
  free(p->v);
  *p = (Paths){0};
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A data_files entry: a path, or a glob pattern (sorted matches, as
 * datasets' resolve_pattern gives them). base: the directory relative
 * patterns are in (a hub snapshot), or NULL for the working directory. */
static bool resolve_pattern(const char *base, const char *pat, SrcPos at, const char *what, Paths *out) {
  char full[4096];
  if (base && pat[0] != '/')
    snprintf(full, sizeof full, "%s/%s", base, pat);
  else
    snprintf(full, sizeof full, "%s", pat);
  if (!strpbrk(pat, "*?[")) {
    paths_add(out, full);
    return true;
  }
  glob_t g;
  int rc = glob(full, 0, NULL, &g);
  if (rc != 0 || g.gl_pathc == 0) {
    if (rc == 0)
      globfree(&g);
    error_at(at, "%s: no file matches '%s'", what, full);
    return false;
  }
  qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), cmp_str);
  for (size_t i = 0; i < g.gl_pathc; i++)
    paths_add(out, g.gl_pathv[i]);
  globfree(&g);
  return true;
}

/* ---- a dataset directory (a hub snapshot, or a local folder) -------------------------------------
 * datasets' data file inference when the repo declares no configs: the files
 * with a data extension (not hidden, not in a __dir__, not README.md,
 * dataset_info.json, ...), the module of the most common extension (parquet
 * on a tie), and splits from the names:
 *   1. data/{split}-NNNNN-of-NNNNN*.*                                  (each split its name)
 *   2. a directory named train, training / validation, valid, dev, val /
 *      test, testing, eval, evaluation, alone or beside a separator (-._ 0-9)
 *   3. a file name starting with such a keyword and a separator, or holding one
 *      between separators
 *   4. else every file is train. */

static const char *const split_keywords[3][5] = {
    {"train", "training"}, {"validation", "valid", "dev", "val"}, {"test", "testing", "eval", "evaluation"}};
static const char *const split_names[3] = {"train", "validation", "test"};

static bool sep_char(char c) { return c == '-' || c == '.' || c == '_' || c == ' ' || (c >= '0' && c <= '9'); }

/* Does a name (one path component) hold keyword kw as fnmatch's
 * {kw}[sep]* (starts), *[sep]{kw}[sep]* (inside) -- and, for a directory,
 * also {kw} and *[sep]{kw} (whole, ends)? */
static bool name_has_keyword(const char *name, size_t n, const char *kw, bool dir) {
  size_t k = strlen(kw);
  for (size_t i = 0; i + k <= n; i++) {
    if (memcmp(name + i, kw, k) != 0)
      continue;
    bool before = i == 0 || sep_char(name[i - 1]);
    bool at_start = i == 0;
    bool after_sep = i + k < n && sep_char(name[i + k]);
    bool at_end = i + k == n;
    if (at_start && after_sep)
      return true;
    if (!at_start && before && after_sep)
      return true;
    if (dir && at_start && at_end)
      return true;
    if (dir && !at_start && before && at_end)
      return true;
  }
  return false;
}

/* rel: a path relative to the dataset directory. */
static bool path_in_split_dir(const char *rel, int split) {
  const char *s = rel;
  for (const char *slash; (slash = strchr(s, '/')); s = slash + 1)
    for (int k = 0; k < 5 && split_keywords[split][k]; k++)
      if (name_has_keyword(s, (size_t)(slash - s), split_keywords[split][k], true))
        return true;
  return false;
}

static bool path_in_split_name(const char *rel, int split) {
  const char *base = strrchr(rel, '/');
  base = base ? base + 1 : rel;
  for (int k = 0; k < 5 && split_keywords[split][k]; k++)
    if (name_has_keyword(base, strlen(base), split_keywords[split][k], false))
      return true;
  return false;
}

/* The split of data/{split}-NNNNN-of-NNNNN*.* (the greedy match datasets'
 * string_to_dict makes), or false. */
static bool sharded_split(const char *rel, char *split, size_t cap) {
  if (strncmp(rel, "data/", 5) != 0 || strchr(rel + 5, '/'))
    return false;
  const char *b = rel + 5;
  size_t n = strlen(b);
  if (!strchr(b, '.'))
    return false;
  for (size_t i = n; i-- > 1;) {
    /* -DDDDD-of-DDDDD at b[i..] */
    if (i + 15 > n || b[i] != '-' || strncmp(b + i + 6, "-of-", 4) != 0)
      continue;
    bool digits = true;
    for (int d = 1; d <= 5; d++)
      digits &= b[i + d] >= '0' && b[i + d] <= '9' && b[i + 10 + d - 1] >= '0' && b[i + 10 + d - 1] <= '9';
    /* then [0-9]*.*: a '.' somewhere after */
    if (!digits || !strchr(b + i + 15, '.') || i >= cap)
      continue;
    memcpy(split, b, i);
    split[i] = 0;
    for (size_t j = 0; j < i; j++)
      if (!word_char((unsigned char)split[j]) && split[j] != '.')
        return false;
    return true;
  }
  return false;
}

static const char *const ignored_files[] = {"README.md", "config.json", "dataset_info.json", "dataset_infos.json",
                                            "dummy_data.zip", "dataset_dict.json"};

/* Every regular file under dir (following symlinks, as the hub cache's
 * snapshots are), relative paths; hidden and __special__ entries skipped. */
static void list_files(const char *dir, const char *rel, Paths *out, int depth) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s%s", dir, *rel ? "/" : "", rel);
  DIR *d = opendir(path);
  if (!d || depth > 16) {
    if (d)
      closedir(d);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || !strncmp(e->d_name, "__", 2))
      continue;
    char r[4096], full[8192];
    snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
    snprintf(full, sizeof full, "%s/%s", dir, r);
    struct stat st;
    if (stat(full, &st) != 0)
      continue;
    if (S_ISDIR(st.st_mode))
      list_files(dir, r, out, depth + 1);
    else if (S_ISREG(st.st_mode))
      paths_add(out, r);
  }
  closedir(d);
}

/* A split's files, by name. */
typedef struct {
  char name[128];
  Paths files;
} SplitFiles;

typedef struct {
  SplitFiles *v;
  int n;
  FileFormat fmt;
} SplitMap;

static SplitFiles *split_get(SplitMap *m, const char *name) {
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->v[i].name, name))
      return &m->v[i];
  m->v = realloc(m->v, sizeof(SplitFiles) * (size_t)(m->n + 1));
  ASSERT(m->v);
  SplitFiles *s = &m->v[m->n++];
  *s = (SplitFiles){0};
  snprintf(s->name, sizeof s->name, "%s", name);
  return s;
}

static void split_map_free(SplitMap *m) {
  for (int i = 0; i < m->n; i++)
    paths_free(&m->v[i].files);
  free(m->v);
  *m = (SplitMap){0};
}

static int ext_rank(const char *ext) { return !strcmp(ext, ".parquet") ? 3 : !strcmp(ext, ".jsonl") ? 2 : !strcmp(ext, ".json") ? 1 : 0; }

/* Infers the splits of the data files in dir. false (error printed at
 * `at`) when there are none that optc reads. */
static bool infer_splits(const char *dir, const char *desc, SrcPos at, const char *what, SplitMap *m) {
  Paths all = {0}, data = {0};
  list_files(dir, "", &all, 0);
  /* datasets counts every suffix of every file and takes the most common
   * (parquet, then jsonl, then json on a tie) */
  static const char *const exts[] = {".parquet", ".jsonl", ".json"};
  int count[3] = {0}, other = 0;
  char other_ext[64] = "";
  for (int i = 0; i < all.n; i++) {
    const char *base = strrchr(all.v[i], '/');
    base = base ? base + 1 : all.v[i];
    bool ignored = false;
    for (size_t k = 0; k < ARRAY_LEN(ignored_files); k++)
      ignored |= !strcmp(base, ignored_files[k]);
    if (ignored)
      continue;
    for (const char *dot = strchr(base, '.'); dot; dot = strchr(dot + 1, '.')) {
      const char *end = strchr(dot + 1, '.');
      size_t n = end ? (size_t)(end - dot) : strlen(dot);
      char ext[64];
      snprintf(ext, sizeof ext, "%.*s", (int)MIN(n, sizeof ext - 1), dot);
      for (char *c = ext; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
      int k = 0;
      while (k < 3 && strcmp(ext, exts[k]))
        k++;
      if (k < 3)
        count[k]++;
      else if (strcmp(ext, ".md") && strcmp(ext, ".txt") && strcmp(ext, ".py") && strcmp(ext, ".gitattributes") &&
               ++other > 0 && !*other_ext)
        snprintf(other_ext, sizeof other_ext, "%s", ext);
    }
  }
  int best = -1;
  for (int k = 0; k < 3; k++)
    if (count[k] && (best < 0 || count[k] > count[best] || (count[k] == count[best] && ext_rank(exts[k]) > ext_rank(exts[best]))))
      best = k;
  if (best < 0) {
    if (*other_ext)
      error_at(at, "%s: %s holds %s files; optc reads json, jsonl and parquet data files", what, desc, other_ext);
    else
      error_at(at, "%s: %s holds no data files (json, jsonl or parquet)", what, desc);
    paths_free(&all);
    return false;
  }
  m->fmt = best == 0 ? FMT_PARQUET : FMT_JSON;
  for (int i = 0; i < all.n; i++) {
    const char *base = strrchr(all.v[i], '/');
    base = base ? base + 1 : all.v[i];
    bool ignored = false;
    for (size_t k = 0; k < ARRAY_LEN(ignored_files); k++)
      ignored |= !strcmp(base, ignored_files[k]);
    if (!ignored && (best == 0 ? ends_with(base, ".parquet") : ends_with(base, ".json") || ends_with(base, ".jsonl")))
      paths_add(&data, all.v[i]);
  }
  paths_free(&all);
  qsort(data.v, (size_t)data.n, sizeof(char *), cmp_str);
  char full[8192];
  /* 1. sharded names */
  char sp[128];
  bool sharded = false;
  for (int i = 0; i < data.n; i++)
    sharded |= sharded_split(data.v[i], sp, sizeof sp);
  if (sharded) {
    for (int s = 0; s < 3; s++) /* datasets' order: train, validation, test, then the rest sorted */
      for (int i = 0; i < data.n; i++)
        if (sharded_split(data.v[i], sp, sizeof sp) && !strcmp(sp, split_names[s]))
          split_get(m, sp);
    for (int i = 0; i < data.n; i++)
      if (sharded_split(data.v[i], sp, sizeof sp)) {
        snprintf(full, sizeof full, "%s/%s", dir, data.v[i]);
        paths_add(&split_get(m, sp)->files, full);
      }
  } else {
    /* 2, 3: keywords in directory names, then in file names; 4: all train */
    for (int family = 0; family < 3 && m->n == 0; family++)
      for (int s = 0; s < 3; s++)
        for (int i = 0; i < data.n; i++) {
          bool in = family == 0 ? path_in_split_dir(data.v[i], s) : family == 1 ? path_in_split_name(data.v[i], s)
                                                                              : s == 0;
          if (in) {
            snprintf(full, sizeof full, "%s/%s", dir, data.v[i]);
            paths_add(&split_get(m, split_names[s])->files, full);
          }
        }
  }
  paths_free(&data);
  return true;
}

/* ---- the hub cache ------------------------------------------------------------------------------- */

void hf_hub_cache_dir(Buf *out) {
  const char *v;
  if ((v = getenv("HF_HUB_CACHE")) && *v)
    buf_puts(out, v);
  else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v)
    buf_puts(out, v);
  else if ((v = getenv("HF_HOME")) && *v)
    buf_printf(out, "%s/hub", v);
  else if ((v = getenv("XDG_CACHE_HOME")) && *v)
    buf_printf(out, "%s/huggingface/hub", v);
  else
    buf_printf(out, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : ".");
}

/* The snapshot directory of dataset repo (OWNER/NAME) in the hub cache:
 * datasets--OWNER--NAME/snapshots/REV, REV from refs/main (or the one
 * snapshot there is). false with the error printed. */
static bool hub_snapshot(const char *repo, SrcPos at, const char *what, Buf *dir) {
  Buf cache = {0}, repo_dir = {0};
  hf_hub_cache_dir(&cache);
  buf_printf(&repo_dir, "%s/datasets--", cache.data);
  for (const char *c = repo; *c; c++)
    if (*c == '/')
      buf_puts(&repo_dir, "--");
    else
      buf_putc(&repo_dir, *c);
  bool ok = false;
  char ref[4200], rev[256] = "";
  snprintf(ref, sizeof ref, "%s/refs/main", repo_dir.data);
  size_t n;
  char *text = file_read_quiet(ref, &n);
  if (text) {
    size_t a = 0, e = n;
    while (a < e && py_space(text[a]))
      a++;
    while (e > a && py_space(text[e - 1]))
      e--;
    if (e - a > 0 && e - a < sizeof rev && !memchr(text + a, '/', e - a))
      memcpy(rev, text + a, e - a), rev[e - a] = 0;
    free(text);
  } else {
    /* no refs/main: the snapshot, when there is exactly one */
    char snaps[4200];
    snprintf(snaps, sizeof snaps, "%s/snapshots", repo_dir.data);
    DIR *d = opendir(snaps);
    int count = 0;
    if (d) {
      struct dirent *e;
      while ((e = readdir(d)))
        if (e->d_name[0] != '.' && ++count == 1)
          snprintf(rev, sizeof rev, "%s", e->d_name);
      closedir(d);
    }
    if (count != 1)
      rev[0] = 0;
  }
  struct stat st;
  if (*rev) {
    buf_printf(dir, "%s/snapshots/%s", repo_dir.data, rev);
    ok = stat(dir->data, &st) == 0 && S_ISDIR(st.st_mode);
  }
  if (!ok)
    error_at(at,
             "%s: the Hugging Face dataset '%s' is not in the local hub cache (no snapshot under %s; the cache is "
             "HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub). optc reads hub datasets from that "
             "cache and never downloads: fetch it first with\n"
             "    huggingface-cli download --repo-type dataset %s\n"
             "  or in Python with datasets.load_dataset(\"%s\"), or give source: json with data_files: FILE",
             what, repo, repo_dir.data, repo, repo);
  buf_free(&cache);
  buf_free(&repo_dir);
  return ok;
}

/* A hub name: OWNER/NAME or NAME, of the characters the hub allows. */
static bool looks_like_repo(const char *s) {
  int slashes = 0;
  if (!*s || *s == '/' || *s == '.')
    return false;
  for (const char *c = s; *c; c++) {
    if (*c == '/')
      slashes++;
    else if (!(word_char((unsigned char)*c) || *c == '-' || *c == '.') || (unsigned char)*c >= 0x80)
      return false;
  }
  return slashes <= 1 && s[strlen(s) - 1] != '/';
}

/* ---- load_dataset ---------------------------------------------------------------------------------- */

/* data_files: a string, a list, or a mapping of split -> string or list. */
static bool read_data_files(const YamlNode *df, const char *where, const char *base, SplitMap *m) {
  char what[300];
  if (df->kind == YAML_MAP) {
    for (int i = 0; i < df->n; i++) {
      SplitFiles *sf = split_get(m, df->keys[i]);
      const YamlNode *v = df->items[i];
      int nv = v->kind == YAML_SEQ ? v->n : 1;
      for (int k = 0; k < nv; k++) {
        const YamlNode *f = v->kind == YAML_SEQ ? v->items[k] : v;
        const char *s;
        snprintf(what, sizeof what, "%s.data_files.%s%s", where, df->keys[i], v->kind == YAML_SEQ ? "[]" : "");
        if (!yaml_string(f, what, &s) || !resolve_pattern(base, s, f->pos, what, &sf->files))
          return false;
      }
    }
    return true;
  }
  int nf = df->kind == YAML_SEQ ? df->n : 1;
  if (nf == 0) {
    error_at(df->pos, "%s.data_files: the list is empty", where);
    return false;
  }
  SplitFiles *sf = split_get(m, "train");
  for (int i = 0; i < nf; i++) {
    const YamlNode *f = df->kind == YAML_SEQ ? df->items[i] : df;
    const char *s;
    if (df->kind == YAML_SEQ)
      snprintf(what, sizeof what, "%s.data_files[%d]", where, i);
    else
      snprintf(what, sizeof what, "%s.data_files", where);
    if (!yaml_string(f, what, &s) || !resolve_pattern(base, s, f->pos, what, &sf->files))
      return false;
  }
  return true;
}

static bool load_files(HfTable *t, const Paths *files, FileFormat fmt, SrcPos at, const char *what, bool skip_bad,
                       int *bad) {
  for (int i = 0; i < files->n; i++) {
    const char *p = files->v[i];
    FileFormat f = fmt;
    if (ends_with(p, ".parquet"))
      f = FMT_PARQUET; /* datasets' json builder would fail on one; read it for what it is */
    if (!(f == FMT_PARQUET ? load_parquet_file(t, p, at, what) : load_json_file(t, p, at, what, skip_bad, bad)))
      return false;
  }
  return true;
}

bool hf_load(const YamlNode *node, const char *where, const char *default_source, bool skip_bad, int *bad_lines,
             HfTable *out) {
  *out = (HfTable){0};
  char what[300];
  const YamlNode *src = yaml_get(node, "source"), *df = yaml_get(node, "data_files"), *sp = yaml_get(node, "split");
  const char *source = default_source, *split = "train";
  snprintf(what, sizeof what, "%s.source", where);
  if (src && !yaml_is_null(src) && !yaml_string(src, what, &source))
    return false;
  if (sp && !yaml_is_null(sp) && !yaml_string(sp, (snprintf(what, sizeof what, "%s.split", where), what), &split))
    return false;
  SrcPos at = src ? src->pos : node->pos;
  if (!source) {
    error_at(node->pos, "%s: needs source: json (or parquet) with data_files: FILE, a FILE.jsonl, or a Hugging Face "
             "dataset name in the local hub cache", where);
    return false;
  }
  if (df && yaml_is_null(df))
    df = NULL;
  SplitMap m = {0};
  bool ok = false;
  Buf dir = {0}, all = {0};
  char desc[4200];
  snprintf(what, sizeof what, "%s.source", where);
  struct stat st;
  if (!strcmp(source, "json") || !strcmp(source, "parquet")) {
    if (!df) {
      error_at(at, "%s: %s needs data_files: FILE (or a list of files, or {SPLIT: FILE})", what, source);
      goto done;
    }
    m.fmt = !strcmp(source, "json") ? FMT_JSON : FMT_PARQUET;
    if (!read_data_files(df, where, NULL, &m))
      goto done;
  } else if (!strcmp(source, "csv") || !strcmp(source, "text") || !strcmp(source, "arrow") ||
             !strcmp(source, "pandas") || !strcmp(source, "webdataset")) {
    error_at(at, "%s: the %s loader is not supported; optc reads json (and JSON Lines) and parquet", what, source);
    goto done;
  } else if (stat(source, &st) == 0 && S_ISREG(st.st_mode)) {
    /* a file: optc's own shorthand, source: FILE.jsonl */
    if (df) {
      error_at(df->pos, "%s.data_files: with data_files, source must be json or parquet (or a dataset), not a file",
               where);
      goto done;
    }
    m.fmt = ends_with(source, ".parquet") ? FMT_PARQUET : FMT_JSON;
    paths_add(&split_get(&m, "train")->files, source);
  } else if (stat(source, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(desc, sizeof desc, "the directory '%s'", source);
    if (df ? !read_data_files(df, where, source, &m) : !infer_splits(source, desc, at, what, &m))
      goto done;
    if (df)
      m.fmt = FMT_JSON;
  } else if (looks_like_repo(source) && !ends_with(source, ".json") && !ends_with(source, ".jsonl") &&
             !ends_with(source, ".parquet")) {
    if (!hub_snapshot(source, at, what, &dir))
      goto done;
    snprintf(desc, sizeof desc, "the hub cache's '%s' (%s)", source, dir.data);
    if (df ? !read_data_files(df, where, dir.data, &m) : !infer_splits(dir.data, desc, at, what, &m))
      goto done;
    if (df)
      m.fmt = FMT_JSON;
  } else {
    error_at(at, "%s: cannot open '%s': %s", what, source, strerror(errno ? errno : ENOENT));
    goto done;
  }

  /* the split string, against the splits there are; "all" is all of them */
  if (!strcmp(split, "all")) {
    for (int k = 0; k < m.n; k++)
      buf_printf(&all, "%s%s", k ? "+" : "", m.v[k].name);
    split = all.data ? all.data : "";
  }
  SplitSpec specs[16];
  int64_t from[16], to[16];
  char why[256];
  int ns = split_parse(split, specs, 16, why, sizeof why);
  SrcPos spos = sp ? sp->pos : node->pos;
  snprintf(what, sizeof what, "%s.split", where);
  if (ns < 0) {
    error_at(spos, "%s: '%s': %s", what, split, why);
    goto done;
  }
  HfTable loaded[16] = {{0}};
  bool have[16] = {0};
  ok = true;
  for (int i = 0; i < ns && ok; i++) {
    int s = 0;
    while (s < m.n && strcmp(m.v[s].name, specs[i].split))
      s++;
    if (s == m.n) {
      Buf names = {0};
      for (int k = 0; k < m.n; k++)
        buf_printf(&names, "%s'%s'", k ? ", " : "", m.v[k].name);
      error_at(spos, "%s: Unknown split \"%s\". Should be one of [%s].", what, specs[i].split, names.data);
      buf_free(&names);
      ok = false;
      break;
    }
    if (s >= 16) {
      error_at(spos, "%s: too many splits", what);
      ok = false;
      break;
    }
    if (!have[s]) {
      SrcPos fpos = df ? df->pos : at;
      char fwhat[300];
      snprintf(fwhat, sizeof fwhat, "%s.%s", where, df ? "data_files" : "source");
      ok = load_files(&loaded[s], &m.v[s].files, m.fmt, fpos, fwhat, skip_bad, bad_lines);
      have[s] = true;
    }
  }
  /* each sub's slice; datasets reads nothing (an error) when every slice
   * is empty, though from > to is an empty slice that counts */
  bool any = false;
  for (int i = 0; i < ns && ok; i++) {
    int s = 0;
    while (strcmp(m.v[s].name, specs[i].split))
      s++;
    if (split_absolute(&specs[i], loaded[s].n, &from[i], &to[i], why, sizeof why) != 0) {
      error_at(spos, "%s: '%s': %s", what, split, why);
      ok = false;
    }
    any |= to[i] != from[i];
  }
  if (ok && !any) {
    error_at(spos, "%s: Instruction \"%s\" corresponds to no data!", what, split);
    ok = false;
  }
  int file_base[16];
  for (int s = 0; s < 16; s++)
    file_base[s] = -1;
  for (int i = 0; i < ns && ok; i++) {
    int s = 0;
    while (strcmp(m.v[s].name, specs[i].split))
      s++;
    HfTable *l = &loaded[s];
    if (file_base[s] < 0) { /* the split's files move to out, texts and all */
      file_base[s] = out->nfiles;
      for (int f = 0; f < l->nfiles; f++) {
        add_file(out, l->files[f].name, (char *)l->files[f].text, l->files[f].len);
        l->files[f].text = NULL;
      }
    }
    for (int c = 0; c < l->ncols; c++)
      add_column_why(out, l->cols[c].name, l->cols[c].kind, l->cols[c].why);
    for (int64_t r = from[i]; r < to[i]; r++) {
      HfRowPos p = l->pos[r];
      p.file += file_base[s];
      add_row_at(out, json_incref(l->rows[r]), p, false);
    }
  }
  for (int s = 0; s < 16; s++)
    hf_table_free(&loaded[s]);
done:
  if (!ok)
    hf_table_free(out);
  split_map_free(&m);
  buf_free(&dir);
  buf_free(&all);
  return ok;
}
