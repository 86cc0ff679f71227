/* args.h: how every subcommand of the command line reads its arguments:
 * one argument at a time, options as `--name VALUE` or `--name=VALUE`,
 * numbers checked whole and in range (no atoi: "12x", "" and 1e99 are
 * errors that name the option), recipe overrides as torchtune writes them.
 *
 *   Args p;
 *   args_init(&p, "optc plan", argc, argv);
 *   while (args_next(&p)) {
 *     if (args_help(&p)) ...
 *     else if (args_int(&p, "--nproc", 1, 4096, &nproc)) {}
 *     else if (args_option(&p)) args_unknown(&p);
 *     else ... p.a, a positional argument ...
 *   }
 *   if (p.rc) return p.rc;   (2: an error was printed)
 */
#pragma once
#include <stdbool.h>

typedef struct {
  const char *cmd; /* "optc plan": for messages */
  int argc;
  char **argv;
  int i;           /* the argument being read */
  const char *a;   /* argv[i] */
  int rc;          /* 0, or 2 once an argument was wrong (error printed) */
} Args;

void args_init(Args *p, const char *cmd, int argc, char **argv);
/* Moves to the next argument; false past the last, or once one was wrong. */
bool args_next(Args *p);
/* Whether the argument is -h or --help. */
bool args_help(Args *p);
/* Whether the argument is the flag `name`, exactly. */
bool args_flag(Args *p, const char *name);
/* Whether the argument is option `name`: *out its value, `name=VALUE` or
 * the next argument. With no value it is an error. */
bool args_value(Args *p, const char *name, const char **out);
/* The same for `name=VALUE` alone (where `name` alone is a flag of its own). */
bool args_value_eq(Args *p, const char *name, const char **out);
/* Option `name` with a whole number in [lo, hi], or with a finite number
 * greater than 0; another value is an error naming the option. */
bool args_long(Args *p, const char *name, long lo, long hi, long *out);
bool args_int(Args *p, const char *name, int lo, int hi, int *out);
bool args_positive(Args *p, const char *name, double *out);
/* Whether the argument looks like an option (-x, --x). */
bool args_option(const Args *p);
/* An option nobody took: an error pointing at CMD --help. */
void args_unknown(Args *p);
/* A positional argument nobody took. */
void args_unexpected(Args *p);
/* Whether a is a recipe override, torchtune style: KEY=VALUE, or ~KEY. */
bool args_is_override(const char *a);

/* Checked numbers on their own: the whole of s, in range. */
bool parse_long(const char *s, long lo, long hi, long *out);
bool parse_positive(const char *s, double *out);
