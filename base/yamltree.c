/* yamltree.c: libyaml's document, copied into a tree that keeps source positions,
 * and typed reads that report mistakes at the value's line and column. */
#include "yamltree.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

static SrcPos mark_pos(const SrcFile *src, yaml_mark_t m) {
  return (SrcPos){src, (int)m.line + 1, (int)m.column + 1};
}

/* How deep mappings and sequences may nest: recipes use four or five levels. */
enum { YAML_MAX_DEPTH = 64 };

static YamlNode *convert(yaml_document_t *doc, yaml_node_t *y, const SrcFile *src, Arena *a, int depth) {
  YamlNode *n = arena_alloc(a, sizeof(YamlNode));
  n->pos = mark_pos(src, y->start_mark);
  if (depth > YAML_MAX_DEPTH) {
    error_at(n->pos, "YAML nested too deeply");
    return NULL;
  }
  switch (y->type) {
  case YAML_SCALAR_NODE:
    n->kind = YAML_SCALAR;
    n->str = arena_strndup(a, (const char *)y->data.scalar.value, y->data.scalar.length);
    n->plain = y->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    if (n->plain && (strcmp(n->str, "null") == 0 || strcmp(n->str, "Null") == 0 ||
                     strcmp(n->str, "NULL") == 0 || strcmp(n->str, "~") == 0 || n->str[0] == 0))
      n->kind = YAML_NULL;
    return n;
  case YAML_SEQUENCE_NODE: {
    n->kind = YAML_SEQ;
    int count = (int)(y->data.sequence.items.top - y->data.sequence.items.start);
    n->items = arena_alloc(a, sizeof(YamlNode *) * (size_t)(count + 1));
    for (yaml_node_item_t *it = y->data.sequence.items.start; it < y->data.sequence.items.top; it++) {
      YamlNode *c = convert(doc, yaml_document_get_node(doc, *it), src, a, depth + 1);
      if (!c)
        return NULL;
      n->items[n->n++] = c;
    }
    return n;
  }
  case YAML_MAPPING_NODE: {
    n->kind = YAML_MAP;
    int count = (int)(y->data.mapping.pairs.top - y->data.mapping.pairs.start);
    n->items = arena_alloc(a, sizeof(YamlNode *) * (size_t)(count + 1));
    n->keys = arena_alloc(a, sizeof(char *) * (size_t)(count + 1));
    n->key_pos = arena_alloc(a, sizeof(SrcPos) * (size_t)(count + 1));
    for (yaml_node_pair_t *p = y->data.mapping.pairs.start; p < y->data.mapping.pairs.top; p++) {
      yaml_node_t *k = yaml_document_get_node(doc, p->key);
      SrcPos kp = mark_pos(src, k->start_mark);
      if (k->type != YAML_SCALAR_NODE) {
        error_at(kp, "a mapping key must be a plain name");
        return NULL;
      }
      const char *key = arena_strndup(a, (const char *)k->data.scalar.value, k->data.scalar.length);
      if (yaml_index(n, key) >= 0) {
        error_at(kp, "key '%s' appears twice", key);
        note_at(n->key_pos[yaml_index(n, key)], "first here");
        return NULL;
      }
      YamlNode *v = convert(doc, yaml_document_get_node(doc, p->value), src, a, depth + 1);
      if (!v)
        return NULL;
      n->keys[n->n] = key;
      n->key_pos[n->n] = kp;
      n->items[n->n++] = v;
    }
    return n;
  }
  default:
    n->kind = YAML_NULL;
    return n;
  }
}

/* The nesting depth, checked on libyaml's event stream before its document
 * is built: building a document 100,000 levels deep takes libyaml tens of
 * seconds, the events stop at the first level too many. False, with the
 * error at that level's start, when too deep; a syntax error is left to
 * yaml_load to report. */
static bool depth_ok(const SrcFile *src) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser))
    return true;
  yaml_parser_set_input_string(&parser, (const unsigned char *)src->text, src->len);
  bool ok = true;
  for (int depth = 0;;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev))
      break;
    yaml_event_type_t t = ev.type;
    if (t == YAML_MAPPING_START_EVENT || t == YAML_SEQUENCE_START_EVENT) {
      if (++depth > YAML_MAX_DEPTH + 1) {
        error_at(mark_pos(src, ev.start_mark), "YAML nested too deeply (more than %d levels)", YAML_MAX_DEPTH);
        ok = false;
      }
    } else if (t == YAML_MAPPING_END_EVENT || t == YAML_SEQUENCE_END_EVENT) {
      depth--;
    }
    yaml_event_delete(&ev);
    if (!ok || t == YAML_STREAM_END_EVENT)
      break;
  }
  yaml_parser_delete(&parser);
  return ok;
}

YamlNode *yaml_load(const SrcFile *src, Arena *a) {
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!depth_ok(src))
    return NULL;
  if (!yaml_parser_initialize(&parser)) {
    error("cannot initialise libyaml");
    return NULL;
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)src->text, src->len);
  if (!yaml_parser_load(&parser, &doc)) {
    SrcPos pos = mark_pos(src, parser.problem_mark);
    if (parser.context)
      error_at(pos, "YAML syntax error: %s %s", parser.problem ? parser.problem : "", parser.context);
    else
      error_at(pos, "YAML syntax error: %s", parser.problem ? parser.problem : "malformed document");
    yaml_parser_delete(&parser);
    return NULL;
  }
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  YamlNode *n;
  if (!root) {
    n = arena_alloc(a, sizeof(YamlNode));
    n->kind = YAML_MAP;
    n->pos = (SrcPos){src, 1, 1};
  } else {
    n = convert(&doc, root, src, a, 0);
  }
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  return n;
}

int yaml_index(const YamlNode *map, const char *key) {
  if (!map || map->kind != YAML_MAP)
    return -1;
  for (int i = 0; i < map->n; i++)
    if (strcmp(map->keys[i], key) == 0)
      return i;
  return -1;
}

YamlNode *yaml_get(const YamlNode *map, const char *key) {
  int i = yaml_index(map, key);
  return i < 0 ? NULL : map->items[i];
}

void yaml_set(YamlNode *map, const char *key, YamlNode *value, Arena *a) {
  int i = yaml_index(map, key);
  if (i >= 0) {
    map->items[i] = value;
    return;
  }
  YamlNode **items = arena_alloc(a, sizeof(YamlNode *) * (size_t)(map->n + 1));
  const char **keys = arena_alloc(a, sizeof(char *) * (size_t)(map->n + 1));
  SrcPos *kp = arena_alloc(a, sizeof(SrcPos) * (size_t)(map->n + 1));
  if (map->n) {
    memcpy(items, map->items, sizeof(YamlNode *) * (size_t)map->n);
    memcpy(keys, map->keys, sizeof(char *) * (size_t)map->n);
    memcpy(kp, map->key_pos, sizeof(SrcPos) * (size_t)map->n);
  }
  items[map->n] = value;
  keys[map->n] = arena_strdup(a, key);
  kp[map->n] = value->pos;
  map->items = items;
  map->keys = keys;
  map->key_pos = kp;
  map->n++;
}

YamlNode *yaml_scalar(Arena *a, const char *s, bool plain, SrcPos pos) {
  YamlNode *n = arena_alloc(a, sizeof(YamlNode));
  n->kind = YAML_SCALAR;
  n->str = arena_strdup(a, s);
  n->plain = plain;
  n->pos = pos;
  if (plain && (strcmp(s, "null") == 0 || strcmp(s, "~") == 0 || s[0] == 0))
    n->kind = YAML_NULL;
  return n;
}

bool yaml_is_null(const YamlNode *n) { return !n || n->kind == YAML_NULL; }

static const char *kind_name(const YamlNode *n) {
  switch (n->kind) {
  case YAML_NULL: return "null";
  case YAML_SCALAR: return n->plain ? "a plain value" : "a quoted string";
  case YAML_SEQ: return "a list";
  case YAML_MAP: return "a mapping";
  }
  return "?";
}

bool yaml_double(const YamlNode *n, const char *what, double *out) {
  if (n->kind != YAML_SCALAR || !n->plain) {
    error_at(n->pos, "%s: expected a number, found %s", what, kind_name(n));
    return false;
  }
  const char *s = n->str;
  char *end;
  errno = 0;
  double v;
  bool spelled_inf = true; /* YAML's .inf (and inf); each number's range decides whether it may be infinite */
  if (strcasecmp(s, ".inf") == 0 || strcasecmp(s, "+.inf") == 0 || strcasecmp(s, "inf") == 0)
    v = INFINITY, end = (char *)s + strlen(s);
  else if (strcasecmp(s, "-.inf") == 0 || strcasecmp(s, "-inf") == 0)
    v = -INFINITY, end = (char *)s + strlen(s);
  else
    v = strtod(s, &end), spelled_inf = false;
  /* strtod's hex floats, nan and infinity spellings are not YAML numbers */
  if (end == s || *end || (!spelled_inf && strpbrk(s, "xXnN")) || (errno == ERANGE && isinf(v))) {
    error_at(n->pos, "%s: expected a number, found '%s'", what, s);
    return false;
  }
  *out = v;
  return true;
}

bool yaml_int(const YamlNode *n, const char *what, long *out) {
  if (n->kind != YAML_SCALAR || !n->plain) {
    error_at(n->pos, "%s: expected an integer, found %s", what, kind_name(n));
    return false;
  }
  char *end;
  errno = 0;
  long v = strtol(n->str, &end, 10);
  if (end == n->str || *end || errno == ERANGE) {
    error_at(n->pos, "%s: expected an integer, found '%s'", what, n->str);
    return false;
  }
  *out = v;
  return true;
}

bool yaml_int_in(const YamlNode *n, const char *what, long lo, long hi, long *out) {
  /* all digits but past a long is out of range too: strtol clamps it */
  const char *s = n->kind == YAML_SCALAR && n->plain ? n->str : "";
  const char *d = s + (*s == '-' || *s == '+');
  long v;
  errno = 0;
  if (*d && strspn(d, "0123456789") == strlen(d))
    v = strtol(s, NULL, 10);
  else if (!yaml_int(n, what, &v))
    return false;
  if (v < lo || v > hi || errno == ERANGE) {
    error_at(n->pos, "%s: %s is out of range [%ld, %ld]", what, s, lo, hi);
    return false;
  }
  *out = v;
  return true;
}

bool yaml_bool(const YamlNode *n, const char *what, bool *out) {
  if (n->kind == YAML_SCALAR && n->plain) {
    const char *s = n->str;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
      return *out = true, true;
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
      return *out = false, true;
    error_at(n->pos, "%s: expected true or false, found '%s'", what, s);
    return false;
  }
  error_at(n->pos, "%s: expected true or false, found %s", what, kind_name(n));
  return false;
}

bool yaml_string(const YamlNode *n, const char *what, const char **out) {
  if (n->kind != YAML_SCALAR) {
    error_at(n->pos, "%s: expected a string, found %s", what, kind_name(n));
    return false;
  }
  const char *ref = yaml_unresolved(n);
  if (ref) {
    /* as OmegaConf, a reference to nothing is an error where it is used */
    int len = (int)strcspn(ref + 2, "}");
    if (memchr(ref + 2, ':', (size_t)len) || ref[2] == '.')
      error_at(n->pos, "%s: ${%.*s} is not resolved: optc resolves references to the config's own keys only", what,
               len, ref + 2);
    else
      error_at(n->pos, "%s: ${%.*s} names no key of the config; set it on the command line (%.*s=VALUE)", what,
               len, ref + 2, len, ref + 2);
    return false;
  }
  *out = n->str;
  return true;
}

bool yaml_remove(YamlNode *map, const char *key) {
  int i = yaml_index(map, key);
  if (i < 0)
    return false;
  int rest = map->n - i - 1;
  memmove(map->items + i, map->items + i + 1, sizeof(YamlNode *) * (size_t)rest);
  memmove(map->keys + i, map->keys + i + 1, sizeof(char *) * (size_t)rest);
  memmove(map->key_pos + i, map->key_pos + i + 1, sizeof(SrcPos) * (size_t)rest);
  map->n--;
  return true;
}

/* ---- ${key} interpolation, as OmegaConf resolves torchtune's configs ----- */

/* The node a dotted path (batch_size, checkpointer.output_dir) names. */
static YamlNode *lookup_path(YamlNode *root, const char *path, size_t len) {
  YamlNode *n = root;
  const char *p = path, *end = path + len;
  while (n && p < end) {
    const char *dot = memchr(p, '.', (size_t)(end - p));
    size_t k = (size_t)((dot ? dot : end) - p);
    char key[256];
    if (k == 0 || k >= sizeof key)
      return NULL;
    memcpy(key, p, k);
    key[k] = 0;
    n = yaml_get(n, key);
    p = dot ? dot + 1 : end;
  }
  return n;
}

static bool resolve_node(YamlNode *root, YamlNode *n, Arena *a, int depth);

/* Resolves what ${...} names in s into *out: NULL when it names nothing (a
 * resolver such as ${oc.env:X}, a relative ${.x} or a key the config lacks),
 * which stays as written. False on a cycle. */
static bool resolve_ref(YamlNode *root, const char *s, size_t len, SrcPos pos, Arena *a, int depth,
                        YamlNode **out) {
  *out = NULL;
  if (len == 0 || s[0] == '.' || memchr(s, ':', len) || memchr(s, '$', len))
    return true;
  YamlNode *t = lookup_path(root, s, len);
  if (!t)
    return true;
  if (depth > 32) {
    error_at(pos, "interpolation ${%.*s} refers back to itself", (int)len, s);
    return false;
  }
  if (!resolve_node(root, t, a, depth + 1))
    return false;
  *out = t;
  return true;
}

static bool resolve_node(YamlNode *root, YamlNode *n, Arena *a, int depth) {
  if (n->kind == YAML_SEQ || n->kind == YAML_MAP) {
    for (int i = 0; i < n->n; i++)
      if (!resolve_node(root, n->items[i], a, depth))
        return false;
    return true;
  }
  if (n->kind != YAML_SCALAR || !strstr(n->str, "${"))
    return true;
  const char *s = n->str;
  size_t len = strlen(s);
  /* the whole value: ${batch_size} takes the value's type, not a string's */
  if (s[0] == '$' && s[1] == '{' && s[len - 1] == '}' && !strchr(s + 2, '{') && strchr(s, '}') == s + len - 1) {
    YamlNode *t;
    if (!resolve_ref(root, s + 2, len - 3, n->pos, a, depth, &t))
      return false;
    if (t) {
      SrcPos pos = n->pos;
      *n = *t;
      n->pos = pos;
    }
    return true;
  }
  /* inside a string: ${output_dir}/logs */
  Buf b = {0};
  bool ok = true;
  while (*s) {
    const char *open = strstr(s, "${"), *close = open ? strchr(open, '}') : NULL;
    if (!close) {
      buf_puts(&b, s);
      break;
    }
    buf_put(&b, s, (size_t)(open - s));
    YamlNode *t;
    if (!resolve_ref(root, open + 2, (size_t)(close - open - 2), n->pos, a, depth, &t)) {
      ok = false;
      break;
    }
    if (t && (t->kind == YAML_SCALAR || t->kind == YAML_NULL))
      buf_puts(&b, t->kind == YAML_NULL ? "None" : t->str);
    else
      buf_put(&b, open, (size_t)(close - open + 1));
    s = close + 1;
  }
  if (ok) {
    n->str = arena_strdup(a, b.data ? b.data : "");
  }
  buf_free(&b);
  return ok;
}

bool yaml_interpolate(YamlNode *root, Arena *a) { return resolve_node(root, root, a, 0); }

const char *yaml_unresolved(const YamlNode *n) {
  if (!n || n->kind != YAML_SCALAR)
    return NULL;
  return strstr(n->str, "${");
}

/* ---- printing ------------------------------------------------------------ */

enum { SIMPLE_KEY_MAX = 1000 }; /* below YAML's 1024-character limit on a simple key */

/* s, plain where YAML reads it back as the same text (and plain_ok), else
 * double-quoted with escapes */
static void print_text(Buf *b, const char *s, bool plain_ok) {
  size_t len = strlen(s);
  bool plain = plain_ok && len && !strpbrk(s, "{}[],'\"\n\t") && !strstr(s, ": ") && !strstr(s, " #") &&
               !strchr("&*!|>%@`#?: ", s[0]) && !(s[0] == '-' && (s[1] == 0 || s[1] == ' ')) &&
               /* "--- x" or "... x" at the start of a line is a document marker */
               !((!strncmp(s, "---", 3) || !strncmp(s, "...", 3)) && (s[3] == 0 || s[3] == ' ')) &&
               s[len - 1] != ':' && s[len - 1] != ' ';
  if (plain) {
    buf_puts(b, s);
    return;
  }
  buf_puts(b, "\"");
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      buf_printf(b, "\\%c", *s);
    else if (*s == '\n')
      buf_puts(b, "\\n");
    else if ((unsigned char)*s < 0x20)
      buf_printf(b, "\\x%02x", (unsigned char)*s);
    else
      buf_put(b, s, 1);
  }
  buf_puts(b, "\"");
}

static void print_scalar(Buf *b, const YamlNode *n) {
  if (n->kind == YAML_NULL)
    buf_puts(b, "null");
  else
    print_text(b, n->str, n->plain);
}

static void print_node(Buf *b, const YamlNode *n, int indent) {
  for (int i = 0; i < n->n; i++) {
    const YamlNode *v = n->items[i];
    buf_printf(b, "%*s", indent, "");
    if (n->kind == YAML_MAP) {
      /* a key like "" or "a: b" quoted; one longer than a simple key may be
       * (YAML: 1024 characters, quotes and escapes counted) as an explicit
       * key, "? KEY" and the ':' on the next line */
      Buf key = {0};
      print_text(&key, n->keys[i], true);
      if (key.len > SIMPLE_KEY_MAX)
        buf_printf(b, "? %.*s\n%*s:", (int)key.len, key.data, indent, "");
      else
        buf_printf(b, "%.*s:", (int)key.len, key.data);
      buf_free(&key);
    } else
      buf_puts(b, "-");
    if ((v->kind == YAML_MAP || v->kind == YAML_SEQ) && v->n > 0) {
      buf_puts(b, "\n");
      print_node(b, v, indent + 2);
    } else {
      buf_puts(b, " ");
      if (v->kind == YAML_MAP)
        buf_puts(b, "{}");
      else if (v->kind == YAML_SEQ)
        buf_puts(b, "[]");
      else
        print_scalar(b, v);
      buf_puts(b, "\n");
    }
  }
}

void yaml_print(Buf *b, const YamlNode *n) {
  if (n->kind == YAML_MAP || n->kind == YAML_SEQ)
    print_node(b, n, 0);
  else {
    print_scalar(b, n);
    buf_puts(b, "\n");
  }
}

/* ---- key tables ------------------------------------------------------------------ */

static const char *kind_desc(KeyKind k) {
  switch (k) {
  case K_STR: return "a string";
  case K_INT: return "an integer";
  case K_INT_OR_NULL: return "an integer or null";
  case K_NUM_OR_NULL: return "a number or null";
  case K_BOOL: return "true or false";
  case K_MAP: return "a mapping";
  case K_MAP_OR_NULL: return "a mapping or null";
  case K_SEQ: return "a list";
  case K_BOOL_OR_MAP: return "true, false or a mapping";
  case K_MAP_OR_SEQ: return "a mapping or a list";
  case K_ANY: return "anything";
  }
  return "?";
}

/* An integer as the key check takes it: its spelling, even past a long, so
 * that where the key is read its range is what the message names. */
static bool is_int(const YamlNode *n, const char *key) {
  long l;
  const char *d = n->kind == YAML_SCALAR && n->plain ? n->str + (n->str[0] == '-' || n->str[0] == '+') : "";
  return (*d && strspn(d, "0123456789") == strlen(d)) || yaml_int(n, key, &l);
}

bool yaml_check_kind(const YamlNode *n, const char *key, KeyKind k) {
  double d;
  bool b;
  switch (k) {
  case K_ANY: return true;
  case K_STR: return yaml_string(n, key, &(const char *){0});
  case K_INT: return is_int(n, key);
  case K_INT_OR_NULL: return yaml_is_null(n) || is_int(n, key);
  case K_NUM_OR_NULL: return yaml_is_null(n) || yaml_double(n, key, &d);
  case K_BOOL: return yaml_bool(n, key, &b);
  case K_MAP:
  case K_MAP_OR_NULL:
  case K_SEQ:
  case K_BOOL_OR_MAP:
  case K_MAP_OR_SEQ: {
    bool ok = (n->kind == YAML_MAP && k != K_SEQ) || (n->kind == YAML_SEQ && (k == K_SEQ || k == K_MAP_OR_SEQ)) ||
              (n->kind == YAML_NULL && k == K_MAP_OR_NULL);
    if (k == K_BOOL_OR_MAP && n->kind == YAML_SCALAR)
      return yaml_bool(n, key, &b);
    if (!ok)
      error_at(n->pos, "%s: expected %s", key, kind_desc(k));
    return ok;
  }
  }
  return false;
}

static void list_keys(Buf *b, const KeySpec *keys, int n) {
  for (int i = 0; i < n; i++)
    buf_printf(b, "%s%s", i ? ", " : "", keys[i].key);
}

bool yaml_check_keys(const YamlNode *map, const KeySpec *keys, int nkeys, const char *where) {
  for (int i = 0; i < map->n; i++) {
    int k = 0;
    while (k < nkeys && strcmp(keys[k].key, map->keys[i]) != 0)
      k++;
    char path[256];
    snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", map->keys[i]);
    if (k == nkeys) {
      Buf b = {0};
      list_keys(&b, keys, nkeys);
      error_at(map->key_pos[i], "unknown key '%s'; expected one of: %s", path, b.data);
      buf_free(&b);
      return false;
    }
    if (!yaml_check_kind(map->items[i], path, keys[k].kind))
      return false;
  }
  return true;
}
