/* llvm_emit.h: between the two files of the CPU backend (emit_llvm.c builds
 * the module, jit.c optimizes, caches and links it). */
#pragma once
#include "cpu.h"

#include <llvm-c/Core.h>

/* The module of a planned graph: one function optc_phaseK per phase, for a
 * target CPU of this LLVM name ("znver4"; NULL when unknown) with these
 * LLVM features ("+avx512f,..."; NULL or "" when unknown: code that runs on
 * any x86-64 with AVX2). */
LLVMModuleRef llvm_emit_module(const Graph *g, LLVMContextRef c, const char *cpu, const char *features);
/* Whether the module can be emitted: a phase with block scope runs no
 * reductions over the group (error printed where it does). */
bool block_phases_supported(const Graph *g);
