/* cpu.h: the CPU backend. A phase plan becomes LLVM IR (emit_llvm.c, with
 * its lane arithmetic and loop variants beside it), which LLVM 19 optimizes
 * and compiles into one object, JIT-linked and cached on disk (jit.c);
 * cpu_none.c stands in where optc is built without LLVM. */
#pragma once
#include "codegen.h"

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
