/* args.c: reading a subcommand's arguments (args.h). */
#include "args.h"

#include "base.h"

#include <errno.h>
#include <math.h>
#include <string.h>

void args_init(Args *p, const char *cmd, int argc, char **argv) {
  *p = (Args){.cmd = cmd, .argc = argc, .argv = argv, .i = -1};
}

bool args_next(Args *p) {
  if (p->rc || p->i + 1 >= p->argc)
    return false;
  p->a = p->argv[++p->i];
  return true;
}

bool args_help(Args *p) { return !strcmp(p->a, "-h") || !strcmp(p->a, "--help"); }

bool args_flag(Args *p, const char *name) { return !strcmp(p->a, name); }

bool args_value_eq(Args *p, const char *name, const char **out) {
  size_t n = strlen(name);
  if (strncmp(p->a, name, n) != 0 || p->a[n] != '=')
    return false;
  *out = p->a + n + 1;
  return true;
}

bool args_value(Args *p, const char *name, const char **out) {
  if (args_value_eq(p, name, out))
    return true;
  if (strcmp(p->a, name) != 0)
    return false;
  if (p->i + 1 >= p->argc) {
    error("%s needs a value (see %s --help)", name, p->cmd);
    p->rc = 2;
    *out = NULL;
    return true;
  }
  *out = p->argv[++p->i];
  return true;
}

bool parse_long(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno == ERANGE || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

bool parse_positive(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !(v > 0) || !isfinite(v))
    return false;
  *out = v;
  return true;
}

bool args_long(Args *p, const char *name, long lo, long hi, long *out) {
  const char *v;
  if (!args_value(p, name, &v))
    return false;
  if (v && !parse_long(v, lo, hi, out)) {
    error("%s needs a whole number from %ld to %ld, not '%s'", name, lo, hi, v);
    p->rc = 2;
  }
  return true;
}

bool args_int(Args *p, const char *name, int lo, int hi, int *out) {
  long x = 0;
  bool mine = args_long(p, name, lo, hi, &x);
  if (mine && !p->rc)
    *out = (int)x;
  return mine;
}

bool args_positive(Args *p, const char *name, double *out) {
  const char *v;
  if (!args_value(p, name, &v))
    return false;
  if (v && !parse_positive(v, out)) {
    error("%s needs a positive number, not '%s'", name, v);
    p->rc = 2;
  }
  return true;
}

bool args_option(const Args *p) { return p->a[0] == '-' && p->a[1]; }

void args_unknown(Args *p) {
  error("unknown option '%s' (see %s --help)", p->a, p->cmd);
  p->rc = 2;
}

void args_unexpected(Args *p) {
  error("unexpected argument '%s' (see %s --help)", p->a, p->cmd);
  p->rc = 2;
}

bool args_is_override(const char *a) { return a[0] == '~' || (a[0] != '-' && strchr(a, '=')); }
