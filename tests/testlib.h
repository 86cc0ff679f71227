/* testlib.h: what every C test shares, on libc alone. CHECK counts a check
 * and, when it fails, prints its file, line, expression and an optional
 * printf-style message, and the test goes on (it evaluates to whether c
 * held); die stops a test whose environment is broken (a temporary file it
 * cannot make), which is not a test failure. A temporary directory
 * (test_dir_make, in_dir, in_dirf, test_dir_remove) and stderr captured into it
 * (capture_begin, capture_end). Everything a test reports goes to stdout,
 * since stderr may be captured. Header-only; a test includes it once. */
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TESTLIB_FN __attribute__((unused)) static

static int nchecks, nfailed;

/* CHECK(c) or CHECK(c, "fmt", ...): the message, when given, after the expression. */
#define CHECK(c, ...) check_at((c), __FILE__, __LINE__, #c, "" __VA_ARGS__)
#pragma GCC diagnostic ignored "-Wformat-zero-length"
__attribute__((format(printf, 5, 6))) TESTLIB_FN bool check_at(bool ok, const char *file, int line,
                                                             const char *what, const char *fmt, ...) {
  nchecks++;
  if (!ok) {
    printf("%s:%d: FAILED: %s", file, line, what);
    if (*fmt) {
      va_list ap;
      va_start(ap, fmt);
      printf(": ");
      vprintf(fmt, ap);
      va_end(ap);
    }
    printf("\n");
    fflush(stdout);
    nfailed++;
  }
  return ok;
}

#define die(what) die_at(__FILE__, (what))
TESTLIB_FN void die_at(const char *file, const char *what) {
  printf("%s: %s: %s\n", file, what, strerror(errno));
  exit(2);
}

/* ---- a temporary directory ------------------------------------------------------------------- */

static char test_dir[64];

/* Makes /tmp/NAME.XXXXXX, or dies. */
TESTLIB_FN void test_dir_make(const char *name) {
  snprintf(test_dir, sizeof test_dir, "/tmp/%s.XXXXXX", name);
  if (!mkdtemp(test_dir))
    die("mkdtemp");
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* Removes the directory and everything in it. */
TESTLIB_FN void test_dir_remove(void) {
  if (*test_dir)
    nftw(test_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A path, returned by value so that nobody's string is overwritten. */
typedef struct {
  char s[256];
} Path;

/* test_dir/ and the rest printf-style; dies when too long. */
__attribute__((format(printf, 1, 2))) TESTLIB_FN Path in_dirf(const char *fmt, ...) {
  Path p;
  int n = snprintf(p.s, sizeof p.s, "%s/", test_dir);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(p.s + n, sizeof p.s - (size_t)n, fmt, ap);
  va_end(ap);
  if (m < 0 || (size_t)(n + m) >= sizeof p.s)
    die("path too long");
  return p;
}

/* test_dir/name */
TESTLIB_FN Path in_dir(const char *name) { return in_dirf("%s", name); }

/* ---- capturing stderr (in test_dir) --------------------------------------------------------- */

static int saved_stderr = -1;
static char captured[65536];

/* From here to capture_end, what goes to stderr goes to a file. */
TESTLIB_FN void capture_begin(void) {
  fflush(stderr);
  int fd = open(in_dir("stderr.txt").s, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || (saved_stderr = dup(2)) < 0 || dup2(fd, 2) < 0)
    die("redirecting stderr");
  close(fd);
}

/* Restores stderr and returns what was written to it meanwhile (its first
 * 64 KiB), valid until the next capture_end. */
TESTLIB_FN const char *capture_end(void) {
  fflush(stderr);
  if (dup2(saved_stderr, 2) < 0)
    die("restoring stderr");
  close(saved_stderr);
  FILE *f = fopen(in_dir("stderr.txt").s, "rb");
  if (!f)
    die("reading the captured stderr");
  size_t n = fread(captured, 1, sizeof captured - 1, f);
  captured[n] = 0;
  fclose(f);
  return captured;
}
