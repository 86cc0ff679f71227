/* cpu_none.c: the CPU backend in a build without LLVM. Every entry point
 * says so; nothing else changes. */
#include "cpu.h"

bool cpu_backend_available(void) { return false; }
int cpu_compile_count(void) { return 0; }

CpuProgram *cpu_compile(const Graph *g, const CpuTarget *t, CompileTimes *times) {
  (void)g, (void)t, (void)times;
  error("this optc was built without LLVM (meson -Dllvm=disabled): no cpu backend");
  return NULL;
}

PhaseFn cpu_program_phase(const CpuProgram *p, int k) { return (void)p, (void)k, NULL; }
void cpu_program_free(CpuProgram *p) { (void)p; }

int cpu_emit_llvm(const Graph *g, const CpuTarget *t, bool optimized, Buf *out) {
  (void)optimized, (void)out;
  return cpu_compile(g, t, NULL) ? 0 : -1;
}

int cpu_emit_asm(const Graph *g, const CpuTarget *t, Buf *out) {
  (void)out;
  return cpu_compile(g, t, NULL) ? 0 : -1;
}
