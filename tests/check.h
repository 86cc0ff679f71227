/* check.h: the runtime unit tests' CHECK and die. A failed CHECK prints its
 * file, line and expression, is counted in nfailed, and the test goes on
 * (it evaluates to whether c held); die stops a test whose environment is
 * broken (a temporary file it cannot make), which is not a test failure.
 * Everything goes to stdout, since the tests redirect stderr while they
 * capture a message. Header-only; a test includes it once. */
#pragma once
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int nchecks, nfailed;

#define CHECK(c) check_at((c), __FILE__, __LINE__, #c)
static bool check_at(bool ok, const char *file, int line, const char *what) {
  nchecks++;
  if (!ok) {
    printf("%s:%d: FAILED: %s\n", file, line, what);
    fflush(stdout);
    nfailed++;
  }
  return ok;
}

#define die(what) die_at(__FILE__, (what))
__attribute__((unused)) static void die_at(const char *file, const char *what) {
  printf("%s: %s: %s\n", file, what, strerror(errno));
  exit(2);
}
