/* codegen.h: the backends that turn a phase plan into machine code, and the
 * disk cache they share. */
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

/* ---- emit_llvm.c, jit.c: the CPU backend ---------------------------------------- */
typedef struct {
  const char *cpu;      /* NULL: the host CPU */
  const char *features; /* NULL: the host CPU's features */
  bool no_cache;        /* also off when OPTC_CACHE=0 */
} CpuTarget;

typedef struct CpuProgram CpuProgram;

/* A call (a thread's share of a phase) of at least this many elements
 * computes a bf16 value that is a function of one bf16 alone once for each
 * of its 65536 bit patterns, and looks it up (emit_llvm.c, tab_find). */
enum { CPU_TABLE_MIN = 1 << 18 };
/* ... and without AVX-512, of at least this many checks its holds of one
 * op on one bf16 for ties on all 65536 inputs, and where there are none
 * rounds them half up (emit_llvm.c, tie_find). */
enum { CPU_TIE_MIN = 1 << 17 };

bool cpu_backend_available(void);
/* Compiles every phase of a planned graph into one object, JIT-linked.
 * NULL (error printed) on failure. */
CpuProgram *cpu_compile(const Graph *g, const CpuTarget *t, CompileTimes *times);
PhaseFn cpu_program_phase(const CpuProgram *p, int k);
void cpu_program_free(CpuProgram *p);
/* How many times cpu_compile built code (not counting cache hits). */
int cpu_compile_count(void);
/* The LLVM IR of the phases, before or after default<O3>; the assembly. */
int cpu_emit_llvm(const Graph *g, const CpuTarget *t, bool optimized, Buf *out);
int cpu_emit_asm(const Graph *g, const CpuTarget *t, Buf *out);

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
