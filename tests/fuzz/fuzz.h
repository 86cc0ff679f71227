/* fuzz.h: what the libFuzzer targets share. Each target is one
 * LLVMFuzzerTestOneInput over one reader of optc's; a user's mistake in the
 * input must come back as an error (diagnostics are captured, not printed),
 * and only a property the target checks, or a sanitizer, may stop it. */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"

#ifndef OPTC_SOURCE_ROOT
#define OPTC_SOURCE_ROOT "."
#endif

/* A property failed: print it and abort, so libFuzzer saves the input. */
#define FUZZ_CHECK(c, ...) \
  ((c) ? (void)0 : (fprintf(stderr, "%s:%d: fuzz property '%s' failed: ", __FILE__, __LINE__, #c), \
                    fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), abort()))

/* Diagnostics of one input go to a buffer that is dropped; with
 * OPTC_FUZZ_VERBOSE=1 (reproducing a case) they go to stderr. */
static Buf fuzz_diag;
static inline void fuzz_quiet_begin(void) {
  static int verbose = -1;
  if (verbose < 0)
    verbose = getenv("OPTC_FUZZ_VERBOSE") && atoi(getenv("OPTC_FUZZ_VERBOSE")) > 0;
  if (!verbose)
    diag_capture(&fuzz_diag);
}
static inline void fuzz_quiet_end(void) {
  diag_capture(NULL);
  buf_free(&fuzz_diag);
}

/* data[0..n) with a NUL after it: the readers take NUL-terminated text.
 * malloc'd exactly, so that ASan sees a read past the NUL. */
static inline char *fuzz_text(const uint8_t *data, size_t n) {
  char *s = malloc(n + 1);
  if (n)
    memcpy(s, data, n);
  s[n] = 0;
  return s;
}

/* This process's scratch files, removed at exit. */
static char fuzz_paths[8][512];
static const char *fuzz_names[8];
static void fuzz_files_remove(void) {
  for (int k = 0; k < 8 && fuzz_names[k]; k++)
    unlink(fuzz_paths[k]);
}

/* Writes data to this process's scratch file NAME (in $TMPDIR, or /dev/shm
 * when there is one: a write per input) and returns its path, which holds
 * until the next call with the same name. The pid is zero-padded: a path
 * whose length changed with the pid would change the coverage (strlen's and
 * the parser's loops over it), and a seeded walk would not repeat. */
static inline const char *fuzz_file(const char *name, const void *data, size_t n) {
  int k = 0;
  while (k < 8 && fuzz_names[k] && strcmp(fuzz_names[k], name) != 0)
    k++;
  if (k == 8)
    abort();
  if (!fuzz_names[k]) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
      dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_paths[k], sizeof fuzz_paths[k], "%s/optc-fuzz-%010d-%s", dir, (int)getpid(), name);
    if (k == 0)
      atexit(fuzz_files_remove);
    fuzz_names[k] = name;
  }
  FILE *f = fopen(fuzz_paths[k], "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
    perror(fuzz_paths[k]);
    abort();
  }
  return fuzz_paths[k];
}

/* A little-endian reader of the fuzz bytes, for targets that draw choices
 * from them: past the end it yields zeros. */
typedef struct {
  const uint8_t *p;
  size_t n;
} FuzzIn;
static inline uint8_t fuzz_u8(FuzzIn *in) {
  if (!in->n)
    return 0;
  in->n--;
  return *in->p++;
}
static inline uint32_t fuzz_u32(FuzzIn *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)fuzz_u8(in) << (8 * i);
  return v;
}
static inline double fuzz_f64(FuzzIn *in) {
  uint64_t v = fuzz_u32(in) | (uint64_t)fuzz_u32(in) << 32;
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}
