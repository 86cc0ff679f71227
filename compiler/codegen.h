/* codegen.h: what the two backends that turn a phase plan into machine
 * code share: the kernels' calling convention, where a compile's time went,
 * and the disk cache. The backends themselves are compiler/cpu/cpu.h and
 * compiler/cuda/gpu.h. */
#pragma once
#include "plan.h"

/* Where the time of one compile went, in milliseconds. */
typedef struct {
  double frontend, passes, build, opt, codegen, link;
  bool cache_hit;
} CompileTimes;

/* One phase kernel: runs chunks[0, n) of a group. bufs[b] is the flat
 * buffer of graph buffer b; step[r] the value of step-scope value r;
 * tvals[t * nins + r] the value of tensor-scope value r for tensor t;
 * partials[c * nred + i] receives chunk c's partial of the phase's i-th
 * reduction. */
typedef void (*PhaseFn)(const Chunk *chunks, int64_t n, void *const *bufs, const Scalar *step,
                        const Scalar *tvals, double *partials);

/* ---- cache.c: compiled code on disk ------------------------------------------------
 * Entries live in $XDG_CACHE_HOME/optc (else ~/.cache/optc), named by a
 * hash of their key text, which they also hold; each carries a checksum of
 * its payload. A missing, truncated, corrupt or colliding entry is a miss.
 * OPTC_CACHE=0 turns the cache off. */
bool cache_enabled(void);
/* 1 and a malloc'd copy of the payload on a hit, 0 on a miss. */
int cache_get(const char *kind, const char *key, void **data, size_t *len);
/* Stores atomically; a failure to store is not an error (the next run
 * compiles again). */
void cache_put(const char *kind, const char *key, const void *data, size_t len);
/* The path an entry would have, for tests and messages (malloc'd). */
char *cache_path(const char *kind, const char *key);
/* Creates the cache directory if it is missing. */
void cache_mkdir(void);
