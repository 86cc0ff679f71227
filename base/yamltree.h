/* yamltree.h: YAML documents (through libyaml) as trees of nodes that know
 * their source positions, with OmegaConf's ${key} interpolation, typed
 * reads that report a user's mistake at the value, and a printer that the
 * reader reads back. The compiler's recipes and the runtime's config
 * blocks (data, checkpoints, schedules) are read with it. */
#pragma once
#include "base.h"

/* ---- yamltree.c: a YAML document as a tree with source positions ------------- */
typedef enum { YAML_NULL, YAML_SCALAR, YAML_SEQ, YAML_MAP } YamlKind;

typedef struct YamlNode YamlNode;
struct YamlNode {
  YamlKind kind;
  const char *str;  /* SCALAR: the text */
  bool plain;       /* SCALAR: written without quotes */
  int n;            /* SEQ: items; MAP: pairs */
  YamlNode **items; /* SEQ items, or MAP values */
  const char **keys;     /* MAP keys */
  SrcPos *key_pos;       /* MAP key positions */
  SrcPos pos;
};

/* Parses src into a tree in arena a; NULL (error printed) on bad YAML. */
YamlNode *yaml_load(const SrcFile *src, Arena *a);
YamlNode *yaml_get(const YamlNode *map, const char *key);
int yaml_index(const YamlNode *map, const char *key);
/* Sets map[key] = value, appending the key when absent. */
void yaml_set(YamlNode *map, const char *key, YamlNode *value, Arena *a);
YamlNode *yaml_scalar(Arena *a, const char *s, bool plain, SrcPos pos);
/* Removes map[key]; false when absent. */
bool yaml_remove(YamlNode *map, const char *key);
/* Resolves OmegaConf's ${a.b} interpolations in place: a whole value takes the
 * named node (and its type), ${x} inside a string its text. A reference to no
 * key (or a resolver such as ${oc.env:X}) stays as written, an error only where
 * the value is used; false (error printed) on a cycle. */
bool yaml_interpolate(YamlNode *root, Arena *a);
/* Appends n as block-style YAML that yaml_load reads back to the same tree. */
void yaml_print(Buf *b, const YamlNode *n);
/* Where an unresolved ${...} starts in scalar n's text, or NULL. */
const char *yaml_unresolved(const YamlNode *n);
bool yaml_is_null(const YamlNode *n);
/* Typed reads; `what` names the key in messages (e.g. "optimizer.lr"). */
bool yaml_double(const YamlNode *n, const char *what, double *out);
bool yaml_int(const YamlNode *n, const char *what, long *out);
/* An integer in [lo, hi]; one outside (a long or not) is an error at n that
 * names the range. */
bool yaml_int_in(const YamlNode *n, const char *what, long lo, long hi, long *out);
bool yaml_bool(const YamlNode *n, const char *what, bool *out);
bool yaml_string(const YamlNode *n, const char *what, const char **out);

/* ---- yamltree.c: key tables ---------------------------------------------- */
/* What a key's value may be. */
typedef enum { K_ANY, K_STR, K_INT, K_INT_OR_NULL, K_NUM_OR_NULL, K_BOOL, K_MAP, K_MAP_OR_NULL,
               K_SEQ, K_BOOL_OR_MAP, K_MAP_OR_SEQ } KeyKind;

typedef struct {
  const char *key;
  KeyKind kind;
} KeySpec;

/* Whether n is what k allows; an error at n naming `key` when not. An
 * integer is checked by its spelling, even past a long, so that where the
 * key is read its range is what the message names. */
bool yaml_check_kind(const YamlNode *n, const char *key, KeyKind k);
/* Checks each key of map against the table: an unknown key is an error
 * listing the table's, a value of the wrong kind one at the value. `where`
 * (e.g. "model") prefixes the key in messages. */
bool yaml_check_keys(const YamlNode *map, const KeySpec *keys, int nkeys, const char *where);
