/* emit_cuda.c: the phase plan as CUDA C.
 *
 * Each phase becomes one kernel with the CPU backend's contract:
 *
 *   extern "C" __global__ void optc_phaseK(const OptcChunk *chunks, long long nchunks,
 *       void *const *bufs, const OptcScalar *step, const OptcScalar *tvals, double *partials)
 *
 * over chunks of at most OPTC_REDUCE_BLOCK = 4096 elements of one tensor,
 * so one launch covers every tensor of the group.
 *
 * An element-wise phase runs one chunk per block (128 threads). Thread t
 * takes 8 consecutive elements (j = 8t, 8t + 8 * threads, ...): when every
 * pointer of the chunk is 16-byte aligned and all 8 are in the chunk, one
 * 16-byte vector of bf16 (two of f32) per buffer, every load of the
 * iteration issued before the first is used, with the streaming cache hint
 * (ld.global.cs, st.global.cs); else one by one, the tail storing only
 * what is in the chunk. Each buffer's pointer is loaded once per chunk.
 *
 * A phase with reductions runs 16 chunks per block, 8 threads per chunk:
 * element j of a chunk goes to lane j % 8 of each reduction, and lane l is
 * thread l's own chain, elements l, l + 8, l + 16, ... summed in element
 * order in f64. The 8 lanes meet in shared memory, and numerics.h's
 * optc_lanes_combine makes the chunk's partial: the interpreter's bits.
 * A chain of 512 dependent adds is slow alone; with one chain per thread,
 * as many run at once as threads do, and the norm pass reads at memory
 * speed (bench/results.md, "Measurements behind the emitters' choices").
 *
 * Every op is the IEEE op the interpreter performs: NVRTC compiles with
 * --fmad=false --prec-div=true --prec-sqrt=true, f16 rounding and the
 * stochastic-rounding hash are numerics.h itself, pasted in, and bf16
 * rounding is the hardware's cvt.rn with numerics.h's bits (optc_bf16_rn,
 * optc_bf16_hold in `helpers`). pow, exp
 * and log at element scope are CUDA's (max 1-2 ulp), not glibc's: those
 * (F_TRANSC) values may differ in the last bits from the interpreter; at
 * step scope they are computed on the host and exact.
 *
 * The text is table-driven (op_fmt, and the Lang target description) and
 * stable: a value used once is inlined into its user, any other gets a
 * name from its SSA name (v_<name>; x_ loads, s_ step values, t_ tensor
 * values, o_ stores, a_ a lane's accumulator, ln_ the lanes of a block),
 * so expected-output files diff cleanly. */
#include "gpu.h"

#include <string.h>

/* ---- the target language ------------------------------------------------------------ */

typedef struct {
  const char *kernel;       /* before the kernel's name; %d: threads per block */
  const char *block_index;  /* this block's index */
  const char *thread_index; /* this thread's index in its block */
  const char *barrier;
  const char *shared;       /* a block-shared variable */
  const char *type[NUM_TYPES];
  const char *field[NUM_TYPES]; /* how an OptcScalar holds a value of the type */
} Lang;

static const Lang cuda_lang = {
    .kernel = "extern \"C\" __global__ void __launch_bounds__(%d)\n",
    .block_index = "blockIdx.x",
    .thread_index = "threadIdx.x",
    .barrier = "__syncthreads()",
    .shared = "__shared__",
    .type = {[TY_BOOL] = "bool", [TY_I32] = "int", [TY_I64] = "long long", [TY_F16] = "unsigned short",
             [TY_BF16] = "unsigned short", [TY_F32] = "float", [TY_F64] = "double", [TY_U8] = "unsigned char",
             [TY_U4] = "unsigned char"},
    .field = {[TY_BOOL] = ".i != 0", [TY_I32] = ".i", [TY_I64] = ".i", [TY_F16] = ".h", [TY_BF16] = ".h",
              [TY_F32] = ".f", [TY_F64] = ".d"},
};

/* Each op in C: column 0 on f32 (and on bf16/f16, computed in f32),
 * column 1 on f64. Comparisons and logic read the same in both. The
 * optc_ helpers are in `helpers` below, written as interp.c computes. */
static const char *const op_fmt[NUM_OPS][2] = {
    [OP_ADD] = {"(%s + %s)", "(%s + %s)"},
    [OP_SUB] = {"(%s - %s)", "(%s - %s)"},
    [OP_MUL] = {"(%s * %s)", "(%s * %s)"},
    [OP_DIV] = {"(%s / %s)", "(%s / %s)"},
    [OP_MIN] = {"optc_minf(%s, %s)", "optc_mind(%s, %s)"},
    [OP_MAX] = {"optc_maxf(%s, %s)", "optc_maxd(%s, %s)"},
    [OP_POW] = {"powf(%s, %s)", "pow(%s, %s)"},
    [OP_NEG] = {"(-%s)", "(-%s)"},
    [OP_ABS] = {"fabsf(%s)", "fabs(%s)"},
    [OP_SQRT] = {"sqrtf(%s)", "sqrt(%s)"},
    [OP_SIGN] = {"optc_signf(%s)", "optc_signd(%s)"},
    [OP_RSQRT] = {"(1.0f / sqrtf(%s))", "(1.0 / sqrt(%s))"},
    [OP_EXP] = {"expf(%s)", "exp(%s)"},
    [OP_LOG] = {"logf(%s)", "log(%s)"},
    [OP_FMA] = {"fmaf(%s, %s, %s)", "fma(%s, %s, %s)"},
    [OP_LERP] = {"optc_lerpf(%s, %s, %s)", "optc_lerpd(%s, %s, %s)"},
    [OP_SQRT_MKL] = {"optc_sqrt_mkl_f32(%s)", "sqrt(%s)"},
    [OP_SQRT_MKL_EX] = {"optc_sqrt_mkl_ex_f32(%s)", "sqrt(%s)"}, /* its table: emit_rsqrtps_table */
    [OP_EQ] = {"(%s == %s)", "(%s == %s)"},
    [OP_NE] = {"(%s != %s)", "(%s != %s)"},
    [OP_LT] = {"(%s < %s)", "(%s < %s)"},
    [OP_LE] = {"(%s <= %s)", "(%s <= %s)"},
    [OP_GT] = {"(%s > %s)", "(%s > %s)"},
    [OP_GE] = {"(%s >= %s)", "(%s >= %s)"},
    [OP_ISFINITE] = {"optc_isfinite(%s)", "optc_isfinite(%s)"},
    [OP_AND] = {"(%s && %s)", "(%s && %s)"},
    [OP_OR] = {"(%s || %s)", "(%s || %s)"},
    [OP_NOT] = {"(!%s)", "(!%s)"},
    [OP_SELECT] = {"(%s ? %s : %s)", "(%s ? %s : %s)"},
};

/* After numerics.h: the shared types, the interpreter's helpers, and the
 * 8-element loads and stores. */
static const char helpers[] =
    "/* plan.h's Chunk and Scalar, byte for byte */\n"
    "typedef struct {\n"
    "  int tensor, block;\n"
    "  long long start, len, flat, numel;\n"
    "} OptcChunk;\n"
    "typedef union {\n"
    "  double d;\n"
    "  float f;\n"
    "  unsigned short h;\n"
    "  long long i;\n"
    "} OptcScalar;\n"
    "\n"
    "/* interp.c's arithmetic: NaN-propagating min and max, torch.sign,\n"
    " * isfinite, and float to integer (toward zero, NaN to 0, saturating) */\n"
    "OPTC_FN float optc_minf(float a, float b) { return a != a ? a : b != b ? b : (b < a ? b : a); }\n"
    "OPTC_FN float optc_maxf(float a, float b) { return a != a ? a : b != b ? b : (a < b ? b : a); }\n"
    "OPTC_FN double optc_mind(double a, double b) { return a != a ? a : b != b ? b : (b < a ? b : a); }\n"
    "OPTC_FN double optc_maxd(double a, double b) { return optc_max_nan(a, b); }\n"
    "OPTC_FN float optc_signf(float x) { return (float)((0.0f < x) - (x < 0.0f)); }\n"
    "OPTC_FN double optc_signd(double x) { return (double)((0.0 < x) - (x < 0.0)); }\n"

    "OPTC_FN bool optc_isfinite(double x) { return fabs(x) <= 1.7976931348623157e308; }\n"
    "OPTC_FN long long optc_to_int(double d, bool i32) {\n"
    "  const double lo = i32 ? -2147483648.0 : -9223372036854775808.0;\n"
    "  const double hi = i32 ? 2147483647.0 : 9223372036854775807.0;\n"
    "  if (d != d)\n"
    "    return 0;\n"
    "  if (d <= lo)\n"
    "    return (long long)lo;\n"
    "  if (d >= hi)\n"
    "    return i32 ? 2147483647LL : 9223372036854775807LL;\n"
    "  return (long long)d;\n"
    "}\n"
    "\n"
    "/* bf16 rounding with numerics.h's bits on the hardware's conversion:\n"
    " * cvt.rn.bf16x2.f32 (sm_80) rounds two floats to nearest even, subnormals\n"
    " * kept and overflow to infinity, the first into the high half: for every\n"
    " * non-NaN, optc_f32_to_bf16's bits. Its NaN (canonical 0x7fff) is never\n"
    " * used: one select gives numerics.h's 0x7fc0 | sign. tests/cuda_emu.h\n"
    " * defines optc_cvt_bf16x2 in software; before sm_80, numerics.h's code.\n"
    " * optc_bf16_hold is cvt(cvt(f : bf16) : f32): the bf16 in the high half,\n"
    " * the low half the rounded-off zeros (one cvt, no shift). */\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
    "OPTC_FN uint32_t optc_cvt_bf16x2(float hi, float lo) {\n"
    "  uint32_t d;\n"
    "  asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(d) : \"f\"(hi), \"f\"(lo));\n"
    "  return d;\n"
    "}\n"
    "#endif\n"
    "#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(OPTC_CUDA_EMU_H)\n"
    "OPTC_FN uint16_t optc_bf16_rn(float f) {\n"
    "  const uint32_t r = optc_cvt_bf16x2(0.0f, f); /* first: not a branch around the asm */\n"
    "  return (uint16_t)(f != f ? ((optc_f32_bits(f) >> 16) & 0x8000u) | 0x7fc0u : r);\n"
    "}\n"
    "OPTC_FN float optc_bf16_hold(float f) {\n"
    "  const uint32_t r = optc_cvt_bf16x2(f, 0.0f);\n"
    "  return optc_bits_f32(f != f ? (optc_f32_bits(f) & 0x80000000u) | 0x7fc00000u : r);\n"
    "}\n"
    "OPTC_FN float optc_bf16_hold_any(float f) { return optc_bits_f32(optc_cvt_bf16x2(f, 0.0f)); }\n"
    "#else\n"
    "OPTC_FN uint16_t optc_bf16_rn(float f) { return optc_f32_to_bf16(f); }\n"
    "OPTC_FN float optc_bf16_hold(float f) { return optc_bf16_to_f32(optc_f32_to_bf16(f)); }\n"
    "OPTC_FN float optc_bf16_hold_any(float f) { return optc_bf16_hold(f); }\n"
    "#endif\n"
    "/* a held f32 (its low half zero, a NaN 0x7fc0 | sign) as its bf16 */\n"
    "OPTC_FN uint16_t optc_bf16_bits(float f) { return (uint16_t)(optc_f32_bits(f) >> 16); }\n"
    "\n"
    "/* 8 elements at p. optc_vload8 and optc_vstore8: 16-byte vectors, p\n"
    " * 16-byte aligned, in the global space with the streaming hint (each\n"
    " * element is read once and written once: evict first); the host's\n"
    " * plain accesses in tests/cuda_emu.h. optc_load8 and optc_store8: the\n"
    " * first n one by one, the rest read as 0 and never stored. */\n"
    "#ifdef __CUDA_ARCH__\n"
    "#define OPTC_LDV(p) __ldcs(p)\n"
    "#define OPTC_STV(p, v) __stcs(p, v)\n"
    "#else\n"
    "#define OPTC_LDV(p) (*(p))\n"
    "#define OPTC_STV(p, v) (*(p) = (v))\n"
    "#endif\n"
    "OPTC_FN bool optc_aligned16(const void *p) { return ((unsigned long long)p & 15u) == 0; }\n"
    "\n"
    "OPTC_FN void optc_vload8_f32(float *d, const float *p) {\n"
    "  const float4 a = OPTC_LDV((const float4 *)p), b = OPTC_LDV((const float4 *)p + 1);\n"
    "  d[0] = a.x, d[1] = a.y, d[2] = a.z, d[3] = a.w, d[4] = b.x, d[5] = b.y, d[6] = b.z, d[7] = b.w;\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_vstore8_f32(float *p, const float *d) {\n"
    "  OPTC_STV((float4 *)p, make_float4(d[0], d[1], d[2], d[3]));\n"
    "  OPTC_STV((float4 *)p + 1, make_float4(d[4], d[5], d[6], d[7]));\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_vload8_u16(unsigned short *d, const unsigned short *p) {\n"
    "  const uint4 q = OPTC_LDV((const uint4 *)p);\n"
    "  d[0] = (unsigned short)q.x, d[1] = (unsigned short)(q.x >> 16);\n"
    "  d[2] = (unsigned short)q.y, d[3] = (unsigned short)(q.y >> 16);\n"
    "  d[4] = (unsigned short)q.z, d[5] = (unsigned short)(q.z >> 16);\n"
    "  d[6] = (unsigned short)q.w, d[7] = (unsigned short)(q.w >> 16);\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_vstore8_u16(unsigned short *p, const unsigned short *d) {\n"
    "  OPTC_STV((uint4 *)p, make_uint4(d[0] | (unsigned)d[1] << 16, d[2] | (unsigned)d[3] << 16,\n"
    "                                  d[4] | (unsigned)d[5] << 16, d[6] | (unsigned)d[7] << 16));\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_vload8_f64(double *d, const double *p) {\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++) {\n"
    "    const double2 a = OPTC_LDV((const double2 *)p + k);\n"
    "    d[2 * k] = a.x, d[2 * k + 1] = a.y;\n"
    "  }\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_vstore8_f64(double *p, const double *d) {\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++)\n"
    "    OPTC_STV((double2 *)p + k, make_double2(d[2 * k], d[2 * k + 1]));\n"
    "}\n"
    "\n"
    "/* n lanes' elements at p for a reduction phase's thread (n = 2 or 4; 8 is\n"
    " * optc_vload8): one load of n elements, p aligned to it */\n"
    "OPTC_FN bool optc_aligned(const void *p, unsigned n) { return ((unsigned long long)p & (n - 1u)) == 0; }\n"
    "OPTC_FN void optc_vload2_u16(unsigned short *d, const unsigned short *p) {\n"
    "  const unsigned q = OPTC_LDV((const unsigned *)p);\n"
    "  d[0] = (unsigned short)q, d[1] = (unsigned short)(q >> 16);\n"
    "}\n"
    "OPTC_FN void optc_vload4_u16(unsigned short *d, const unsigned short *p) {\n"
    "  const uint2 q = OPTC_LDV((const uint2 *)p);\n"
    "  d[0] = (unsigned short)q.x, d[1] = (unsigned short)(q.x >> 16);\n"
    "  d[2] = (unsigned short)q.y, d[3] = (unsigned short)(q.y >> 16);\n"
    "}\n"
    "OPTC_FN void optc_vload2_f32(float *d, const float *p) {\n"
    "  const float2 a = OPTC_LDV((const float2 *)p);\n"
    "  d[0] = a.x, d[1] = a.y;\n"
    "}\n"
    "OPTC_FN void optc_vload4_f32(float *d, const float *p) {\n"
    "  const float4 a = OPTC_LDV((const float4 *)p);\n"
    "  d[0] = a.x, d[1] = a.y, d[2] = a.z, d[3] = a.w;\n"
    "}\n"
    "OPTC_FN void optc_vload2_f64(double *d, const double *p) {\n"
    "  const double2 a = OPTC_LDV((const double2 *)p);\n"
    "  d[0] = a.x, d[1] = a.y;\n"
    "}\n"
    "OPTC_FN void optc_vload4_f64(double *d, const double *p) {\n"
    "  const double2 a = OPTC_LDV((const double2 *)p), b = OPTC_LDV((const double2 *)p + 1);\n"
    "  d[0] = a.x, d[1] = a.y, d[2] = b.x, d[3] = b.y;\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_load8_f32(float *d, const float *p, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    d[e] = e < n ? p[e] : 0.0f;\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_store8_f32(float *p, const float *d, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    if (e < n)\n"
    "      p[e] = d[e];\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_load8_u16(unsigned short *d, const unsigned short *p, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    d[e] = e < n ? p[e] : (unsigned short)0;\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_store8_u16(unsigned short *p, const unsigned short *d, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    if (e < n)\n"
    "      p[e] = d[e];\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_load8_f64(double *d, const double *p, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    d[e] = e < n ? p[e] : 0.0;\n"
    "}\n"
    "\n"
    "OPTC_FN void optc_store8_f64(double *p, const double *d, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    if (e < n)\n"
    "      p[e] = d[e];\n"
    "}\n";

/* Quantized states' codes, for a graph that has them: 8 u8 or u4 codes a
 * thread (a u4 thread's 4 bytes at byte j / 2: element 2k in byte k's high
 * nibble), and the block reduction's max (NaN-propagating: the block's
 * value is the default NaN when it met one, as interp.c's). */
static const char quant_helpers[] =
    "OPTC_FN void optc_vload8_u8(unsigned char *d, const unsigned char *p) {\n"
    "  const uint2 q = OPTC_LDV((const uint2 *)p);\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++)\n"
    "    d[k] = (unsigned char)(q.x >> 8 * k), d[4 + k] = (unsigned char)(q.y >> 8 * k);\n"
    "}\n"
    "OPTC_FN void optc_vstore8_u8(unsigned char *p, const unsigned char *d) {\n"
    "  OPTC_STV((uint2 *)p, make_uint2(d[0] | (unsigned)d[1] << 8 | (unsigned)d[2] << 16 | (unsigned)d[3] << 24,\n"
    "                                  d[4] | (unsigned)d[5] << 8 | (unsigned)d[6] << 16 | (unsigned)d[7] << 24));\n"
    "}\n"
    "OPTC_FN void optc_load8_u8(unsigned char *d, const unsigned char *p, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    d[e] = e < n ? p[e] : (unsigned char)0;\n"
    "}\n"
    "OPTC_FN void optc_store8_u8(unsigned char *p, const unsigned char *d, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    if (e < n)\n"
    "      p[e] = d[e];\n"
    "}\n"
    "OPTC_FN void optc_vload8_u4(unsigned char *d, const unsigned char *p) {\n"
    "  const unsigned q = OPTC_LDV((const unsigned *)p);\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++)\n"
    "    d[2 * k] = (unsigned char)(q >> (8 * k + 4) & 15u), d[2 * k + 1] = (unsigned char)(q >> 8 * k & 15u);\n"
    "}\n"
    "OPTC_FN void optc_vstore8_u4(unsigned char *p, const unsigned char *d) {\n"
    "  unsigned q = 0;\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++)\n"
    "    q |= ((unsigned)d[2 * k] << 4 | d[2 * k + 1]) << 8 * k;\n"
    "  OPTC_STV((unsigned *)p, q);\n"
    "}\n"
    "OPTC_FN void optc_load8_u4(unsigned char *d, const unsigned char *p, int n) {\n"
    "#pragma unroll\n"
    "  for (int e = 0; e < 8; e++)\n"
    "    d[e] = e < n ? (unsigned char)(p[e / 2] >> (e % 2 ? 0 : 4) & 15u) : (unsigned char)0;\n"
    "}\n"
    "OPTC_FN void optc_store8_u4(unsigned char *p, const unsigned char *d, int n) {\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++)\n"
    "    if (2 * k < n) /* a tensor of odd length ends in half a byte, its low nibble 0 */\n"
    "      p[k] = (unsigned char)(d[2 * k] << 4 | (2 * k + 1 < n ? d[2 * k + 1] : 0));\n"
    "}\n"
    "/* the code of y: how many of the n - 1 thresholds t are at most y (codebook.c) */\n"
    "OPTC_FN unsigned char optc_code_count(const float *t, int n, float y) {\n"
    "  unsigned c = 0;\n"
    "  for (int s = n / 2; s >= 1; s /= 2)\n"
    "    c += y >= t[c + s - 1] ? (unsigned)s : 0u;\n"
    "  return (unsigned char)c;\n"
    "}\n"
    "OPTC_FN double optc_bmax(double a, double v) { return a != a ? a : v != v ? v : (v > a ? v : a); }\n"
    "OPTC_FN float optc_bmaxf(float a, float v) { return a != a ? a : v != v ? v : (v > a ? v : a); }\n";

/* The load/store helper suffix of a buffer element type. */
static const char *mem_suffix(Type t) {
  switch (t) {
  case TY_F32: return "f32";
  case TY_F64: return "f64";
  case TY_BF16: case TY_F16: return "u16";
  case TY_U8: return "u8";
  case TY_U4: return "u4";
  default: unreachable();
  }
}

/* ---- names ----------------------------------------------------------------------------- */

typedef struct {
  const Graph *g;
  const PlanPhase *ph;
  const Lang *L;
  Arena *a;
  Buf *out;
  const char **stem; /* (nins) a C identifier per value: its SSA name, or the printer's number */
  const char **bstem;/* (nbufs) per buffer */
  int *uses;         /* (nins) uses by this phase's element and tensor instructions */
  const char **expr; /* (nins) an element value as its users read it */
  int threads;
  int min_blocks; /* an element-wise kernel's blocks per SM, for its register budget */
  int lanes;      /* the lanes of its chunk a reduction phase's thread takes */
} E;

static bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static char *sanitize(Arena *a, const char *s) {
  char *t = arena_strdup(a, s);
  for (char *p = t; *p; p++)
    if (!ident_char(*p))
      *p = '_';
  return t;
}

/* Stems: SSA names made identifiers; unnamed values numbered as print.c
 * numbers them, so a kernel reads next to --dump-ir; a store's, its
 * buffer's name. A stem that two values (or two stores) would share
 * ("a.b", "a_b") gets the second one's ref appended. */
static void name_values(E *e) {
  const Graph *g = e->g;
  e->stem = arena_alloc(e->a, sizeof(char *) * (size_t)(g->nins + 1));
  int next = 0;
  for (int i = 0; i < g->nins; i++) {
    const Ins *x = &g->ins[i];
    if (x->name) {
      e->stem[i] = sanitize(e->a, x->name);
    } else if (x->op != OP_STORE) {
      char tmp[16];
      do
        snprintf(tmp, sizeof tmp, "%d", next++);
      while (graph_find_value(g, tmp) != NOREF);
      e->stem[i] = arena_strdup(e->a, tmp);
    } else {
      /* a store's output array: o_<buffer> */
      e->stem[i] = sanitize(e->a, g->bufs[x->buf].name);
    }
  }
  for (int i = 0; i < g->nins; i++)
    for (int k = 0; k < i; k++)
      if ((g->ins[i].op == OP_STORE) == (g->ins[k].op == OP_STORE) && !strcmp(e->stem[i], e->stem[k])) {
        e->stem[i] = arena_printf(e->a, "%s_%d", e->stem[i], i);
        break;
      }
  e->bstem = arena_alloc(e->a, sizeof(char *) * (size_t)(g->nbufs + 1));
  for (int b = 0; b < g->nbufs; b++) {
    e->bstem[b] = sanitize(e->a, g->bufs[b].name);
    for (int k = 0; k < b; k++)
      if (!strcmp(e->bstem[b], e->bstem[k])) { /* "a.b" and "a_b": p_a_b, then p_a_b_<b> */
        e->bstem[b] = arena_printf(e->a, "%s_%d", e->bstem[b], b);
        break;
      }
  }
}

/* ---- values ----------------------------------------------------------------------------- */

/* A literal of type t, reading back as exactly the interpreter's value. */
static const char *literal(E *e, Type t, double v) {
  char s[48];
  switch (t) {
  case TY_BOOL: return v != 0 ? "true" : "false";
  case TY_I32: return arena_printf(e->a, v < 0 ? "(%lld)" : "%lld", (long long)v);
  case TY_I64: return arena_printf(e->a, v < 0 ? "(%lldLL)" : "%lldLL", (long long)v);
  case TY_BF16: case TY_F16: {
    float f = (float)v;
    return arena_printf(e->a, "(unsigned short)0x%04x", t == TY_BF16 ? optc_f32_to_bf16(f) : optc_f32_to_f16(f));
  }
  case TY_F32: {
    float f = (float)v;
    if (f != f || f - f != 0)
      return arena_printf(e->a, "optc_bits_f32(0x%08xu)", optc_f32_bits(f));
    /* the shortest text if a C compiler reads it back to f (decimal to
     * float directly), else the float's exact double */
    fmt_double(s, f, true);
    if (strtof(s, NULL) != f)
      fmt_double(s, (double)f, false);
    return arena_printf(e->a, s[0] == '-' ? "(%sf)" : "%sf", s);
  }
  case TY_F64:
    if (v != v || v - v != 0) {
      /* through f32: exact for NaN and the infinities */
      return arena_printf(e->a, "(double)optc_bits_f32(0x%08xu)", optc_f32_bits((float)v));
    }
    fmt_double(s, v, false);
    return arena_printf(e->a, s[0] == '-' ? "(%s)" : "%s", s);
  default: unreachable();
  }
}

static bool is_tensor_value(const Ins *x) { return x->scope == SCOPE_TENSOR; }

/* How instruction r reads as an operand inside the element loop (or, for
 * tensor-scope users, in the chunk's prologue). */
static const char *operand(E *e, Ref r) {
  const Ins *x = &e->g->ins[r];
  if (x->op == OP_CONST)
    return literal(e, (Type)x->type, x->imm);
  if (x->scope == SCOPE_STEP)
    return arena_printf(e->a, "s_%s", e->stem[r]);
  if (is_tensor_value(x))
    return arena_printf(e->a, "t_%s", e->stem[r]);
  if (x->scope == SCOPE_BLOCK)
    return arena_printf(e->a, "b_%s", e->stem[r]);
  if (x->op == OP_LOAD)
    return arena_printf(e->a, "x_%s[e]", e->stem[r]);
  ASSERT(e->expr[r]);
  return e->expr[r];
}

static const char *to_f32(E *e, const char *s, Type t) {
  if (t == TY_BF16)
    return arena_printf(e->a, "optc_bf16_to_f32(%s)", s);
  if (t == TY_F16)
    return arena_printf(e->a, "optc_f16_to_f32(%s)", s);
  return s;
}

static const char *from_f32(E *e, const char *s, Type t) {
  if (t == TY_BF16)
    return arena_printf(e->a, "optc_bf16_rn(%s)", s);
  if (t == TY_F16)
    return arena_printf(e->a, "optc_f32_to_f16(%s)", s);
  return s;
}

/* interp.c's as_f64: a float type through f32, an integer as a double. */
static const char *to_f64(E *e, const char *s, Type t) {
  if (t == TY_F64)
    return s;
  if (type_is_float(t))
    return arena_printf(e->a, "(double)%s", to_f32(e, s, t));
  return arena_printf(e->a, "(double)%s", s);
}

/* interp.c's convert(), op for op. */
static const char *convert(E *e, const char *s, Type from, Type to) {
  if (from == to)
    return s;
  if (type_is_float(from) && type_is_float(to)) {
    if (to == TY_F64)
      return to_f64(e, s, from);
    if (from == TY_F64) /* to a 16-bit type, through f32 */
      return from_f32(e, arena_printf(e->a, "(float)%s", s), to);
    return from_f32(e, to_f32(e, s, from), to);
  }
  if (type_is_float(from))
    return arena_printf(e->a, "(%s)optc_to_int(%s, %s)", e->L->type[to], to_f64(e, s, from),
                        to == TY_I32 ? "true" : "false");
  const char *i = arena_printf(e->a, from == TY_I32 ? "(long long)(int)%s" : "(long long)%s", s);
  if (to == TY_F64)
    return arena_printf(e->a, "(double)%s", i);
  if (type_is_float(to))
    return from_f32(e, arena_printf(e->a, "(float)%s", i), to);
  return arena_printf(e->a, "(%s)%s", e->L->type[to], i);
}

/* A bf16 value whose NaNs are numerics.h's 0x7fc0 | sign: what the element
 * loop rounds (a cvt, bf16 arithmetic, stochastic rounding), a select of
 * such, a literal; not a load, whose memory may hold any NaN. */
static bool bf16_canonical(const Graph *g, Ref r) {
  const Ins *x = &g->ins[r];
  if (x->op == OP_CONST)
    return true;
  if (x->scope != SCOPE_ELEM)
    return false;
  switch (op_info[x->op].type_rule) {
  case TR_ARITH: case TR_CVTSR: return true;
  case TR_CVT: return g->ins[x->args[0]].type != TY_BF16 || bf16_canonical(g, x->args[0]);
  case TR_SELECT: return bf16_canonical(g, x->args[1]) && bf16_canonical(g, x->args[2]);
  default: return false;
  }
}

/* The element loop computes elem-scope values, and the stores and the
 * reductions of them (whose own scope is their target's). */
static bool per_element(const Ins *x) { return x->scope == SCOPE_ELEM || x->op == OP_REDUCE; }

/* Whether no user of element value r can tell one NaN from another: each
 * is f32 arithmetic (whose NaN result is the GPU's canonical 0x7fffffff,
 * whatever NaN went in), a comparison or a test. A store, a select, min,
 * max, neg, abs and conversions pass a NaN's bits on. */
static bool nan_bits_unseen(E *e, Ref r) {
  const Graph *g = e->g;
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    bool uses = false;
    for (int k = 0; k < op_info[x->op].nargs; k++)
      uses |= x->args[k] == r;
    if (!uses || !per_element(x))
      continue;
    switch (x->op) {
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_SQRT: case OP_RSQRT: case OP_FMA: case OP_LERP:
      if (x->type != TY_F32 && x->type != TY_BF16)
        return false;
      break;
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_ISFINITE: break;
    default: return false;
    }
  }
  return true;
}

/* The expression of instruction i; `index` is the element's index in its
 * tensor (the stochastic-rounding hash reads it). */
static const char *render(E *e, Ref i, const char *index) {
  const Ins *x = &e->g->ins[i];
  Op op = (Op)x->op;
  Type t = (Type)x->type;
  const char *a[3] = {"", "", ""};
  Type at[3] = {TY_VOID, TY_VOID, TY_VOID};
  for (int k = 0; k < op_info[op].nargs; k++) {
    a[k] = operand(e, x->args[k]);
    at[k] = (Type)e->g->ins[x->args[k]].type;
  }
  switch (op_info[op].type_rule) {
  case TR_ARITH: {
    if (t == TY_F64)
      return arena_printf(e->a, op_fmt[op][1], a[0], a[1], a[2]);
    const char *f[3] = {"", "", ""};
    for (int k = 0; k < op_info[op].nargs; k++)
      f[k] = to_f32(e, a[k], t);
    return from_f32(e, arena_printf(e->a, op_fmt[op][0], f[0], f[1], f[2]), t);
  }
  case TR_CMP:
    if (type_is_int(at[0]))
      return arena_printf(e->a, op_fmt[op][1], arena_printf(e->a, "(double)%s", a[0]),
                          arena_printf(e->a, "(double)%s", a[1]));
    return arena_printf(e->a, op_fmt[op][at[0] == TY_F64], to_f32(e, a[0], at[0]), to_f32(e, a[1], at[0]));
  case TR_TEST: return arena_printf(e->a, op_fmt[op][1], to_f64(e, a[0], at[0]));
  case TR_LOGIC:
  case TR_SELECT: return arena_printf(e->a, op_fmt[op][0], a[0], a[1], a[2]);
  case TR_CVT: {
    const Graph *g = e->g;
    Ref y = x->args[0];
    const Ins *in = &g->ins[y];
    if (x->scope != SCOPE_ELEM || in->op != OP_CVT || in->scope != SCOPE_ELEM)
      return convert(e, a[0], at[0], t);
    Type from = (Type)g->ins[in->args[0]].type;
    /* a hold, cvt(cvt(v : bf16) : f32), its bf16 inlined: one rounding,
     * kept in the f32 bits */
    if (t == TY_F32 && at[0] == TY_BF16 && e->uses[y] == 1 && type_is_float(from) && from != TY_BF16)
      return arena_printf(e->a, nan_bits_unseen(e, i) ? "optc_bf16_hold_any(%s)" : "optc_bf16_hold(%s)",
                          convert(e, operand(e, in->args[0]), from, TY_F32));
    /* cvt(cvt(h : f32) : bf16) of a canonical h is h: the held f32's high half */
    if (t == TY_BF16 && at[0] == TY_F32 && from == TY_BF16 && bf16_canonical(g, in->args[0]))
      return arena_printf(e->a, "optc_bf16_bits(%s)", a[0]);
    return convert(e, a[0], at[0], t);
  }
  case TR_CVTSR:
    return arena_printf(e->a, "%s(%s, optc_sr_bits(k_%s, (uint64_t)(%s)))",
                        t == TY_BF16 ? "optc_f32_to_bf16_sr" : "optc_f32_to_f16_sr", a[0], e->stem[i], index);
  case TR_TAILPOS:
    return arena_printf(e->a, "optc_tailpos((long long)(%s), ch.numel, %s, %s)", index, a[0], a[1]);
  case TR_LOOKUP: return arena_printf(e->a, "optc_%s_q[%s]", codebook((Book)x->book)->name, a[0]);
  case TR_SEARCH: {
    const CodeBook *cb = codebook((Book)x->book);
    return arena_printf(e->a, "optc_code_count(optc_%s_t, %d, %s)", cb->name, cb->n, a[0]);
  }
  default: unreachable();
  }
}

/* ---- one phase --------------------------------------------------------------------------- */

static bool red_is_max(RedKind k) { return k == RED_MAX || k == RED_ABSMAX; }

static bool used_here(E *e, Ref r) {
  const PlanPhase *ph = e->ph;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &e->g->ins[i];
    for (int k = 0; k < op_info[x->op].nargs; k++)
      if (x->args[k] == r && (x->scope != SCOPE_STEP || x->op == OP_STORE || x->op == OP_REDUCE))
        return true;
  }
  return false;
}

/* The loads (op OP_LOAD) or the stores (OP_STORE) of an element-wise
 * phase's 8 elements at j: when `full`, 16-byte vectors, every load issued
 * before the first is used; else one by one, only what is in the chunk. */
static void emit_vectors(E *e, Op op) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  Buf *o = e->out;
  bool any = false;
  for (Ref i = ph->lo; i < ph->hi; i++)
    any |= g->ins[i].op == op && !g->bufs[g->ins[i].buf].per_block;
  if (!any)
    return;
  for (int vec = 1; vec >= 0; vec--) {
    buf_puts(o, vec ? "    if (full) {\n" : "    } else {\n");
    for (Ref i = ph->lo; i < ph->hi; i++) {
      const Ins *x = &g->ins[i];
      if (x->op != op)
        continue;
      if (g->bufs[x->buf].per_block)
        continue; /* a block's, loaded and stored once per block */
      const char *sfx = mem_suffix((Type)g->bufs[x->buf].type), *b = e->bstem[x->buf], *v = e->stem[i];
      const char *at = g->bufs[x->buf].type == TY_U4 ? "j / 2" : "j";
      if (op == OP_LOAD)
        buf_printf(o, vec ? "      optc_vload8_%s(x_%s, p_%s + %s);\n" : "      optc_load8_%s(x_%s, p_%s + %s, n);\n",
                   sfx, v, b, at);
      else
        buf_printf(o, vec ? "      optc_vstore8_%s(p_%s + %s, o_%s);\n" : "      optc_store8_%s(p_%s + %s, o_%s, n);\n",
                   sfx, b, at, v);
    }
  }
  buf_puts(o, "    }\n");
}

/* Per-element arrays of n slots: x_ for each load's values (op OP_LOAD), o_
 * for each store's (OP_STORE). */
static void emit_slots(E *e, Op op, const char *ind, int n) {
  const Graph *g = e->g;
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->op == op && !g->bufs[x->buf].per_block)
      buf_printf(e->out, "%s%s %s_%s[%d];\n", ind, e->L->type[op == OP_LOAD ? x->type : g->bufs[x->buf].type],
                 op == OP_LOAD ? "x" : "o", e->stem[i], n);
  }
}

/* Each store's slot `slot` written to its buffer at `at`, one by one. */
static void emit_writes(E *e, const char *ind, const char *at, const char *slot) {
  const Graph *g = e->g;
  for (Ref i = e->ph->lo; i < e->ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->op == OP_STORE)
      buf_printf(e->out, "%sp_%s[%s] = o_%s[%s];\n", ind, e->bstem[x->buf], at, e->stem[i], slot);
  }
}

/* The element values of one element (e), its stores into o_ and its
 * reductions into the a_ accumulators; `index` is its index in its tensor. */
static void emit_element(E *e, const char *ind, const char *index) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  Buf *o = e->out;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (!per_element(x) || x->op == OP_LOAD)
      continue;
    if (x->op == OP_STORE) {
      buf_printf(o, "%so_%s[e] = %s;\n", ind, e->stem[i], operand(e, x->args[0]));
    } else if (x->op == OP_REDUCE) {
      /* interp.c's fold: the operand as f64 (a float type through f32) */
      Ref a = x->args[0];
      const char *v = to_f64(e, operand(e, a), (Type)g->ins[a].type), *s = e->stem[i];
      switch ((RedKind)x->red) {
      case RED_SUM: buf_printf(o, "%sa_%s[e] = a_%s[e] + %s;\n", ind, s, s, v); break;
      case RED_SUMSQ:
        buf_printf(o, "%s{\n%s  const double x = %s;\n%s  a_%s[e] = a_%s[e] + x * x;\n%s}\n", ind, ind, v, ind, s, s,
                   ind);
        break;
      case RED_MAX: buf_printf(o, "%sa_%s[e] = optc_max_nan(a_%s[e], %s);\n", ind, s, s, v); break;
      case RED_ABSMAX: buf_printf(o, "%sa_%s[e] = optc_max_nan(a_%s[e], fabs(%s));\n", ind, s, s, v); break;
      default: unreachable();
      }
    } else if (e->uses[i] == 1) {
      e->expr[i] = render(e, i, index);
    } else if (e->uses[i] > 1) {
      buf_printf(o, "%sconst %s v_%s = %s;\n", ind, e->L->type[x->type], e->stem[i], render(e, i, index));
      e->expr[i] = arena_printf(e->a, "v_%s", e->stem[i]);
    }
  }
}

/* The chunk's first element of each buffer the phase touches, p_NAME
 * (touched[b] set for each): a u4 buffer's byte, a per-block buffer's
 * block (the chunk starts on one). Returns how many. */
static int emit_pointers(E *e, const char *ind, bool *touched) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  const Lang *L = e->L;
  Buf *o = e->out;
  bool *written = arena_alloc(e->a, (size_t)g->nbufs + 1);
  for (int i = 0; i < ph->nreads; i++)
    touched[ph->reads[i].buf] = true;
  for (int i = 0; i < ph->nwrites; i++)
    touched[ph->writes[i].buf] = written[ph->writes[i].buf] = true;
  int ntouched = 0;
  buf_printf(o, "%svoid *const *const row = bufs + (long long)ch.tensor * %d; /* the chunk's tensor's buffers */\n",
             ind, g->nbufs);
  for (int b = 0; b < g->nbufs; b++) {
    if (!touched[b])
      continue;
    const char *ty = L->type[g->bufs[b].type];
    const char *q = written[b] ? "" : "const ";
    const char *at = g->bufs[b].per_block ? arena_printf(e->a, "ch.start / %d", g->block)
                     : g->bufs[b].type == TY_U4 ? "ch.start / 2" : "ch.start";
    buf_printf(o, "%s%s%s *const p_%s = (%s%s *)row[%d] + %s;\n", ind, q, ty, e->bstem[b], q, ty, b, at);
    ntouched++;
  }
  return ntouched;
}

/* Whether every per-element buffer's vectors can be 16-byte loads (a u4
 * buffer's 4 bytes a thread, 4-byte ones). */
static void emit_vec_check(E *e, const bool *touched) {
  const Graph *g = e->g;
  Buf *o = e->out;
  buf_puts(o, "  const bool vec = ");
  int n = 0;
  for (int b = 0; b < g->nbufs; b++) {
    if (!touched[b] || g->bufs[b].per_block)
      continue;
    if (g->bufs[b].type == TY_U4)
      buf_printf(o, "%soptc_aligned(p_%s, 4)", n++ ? " && " : "", e->bstem[b]);
    else
      buf_printf(o, "%soptc_aligned16(p_%s)", n++ ? " && " : "", e->bstem[b]);
  }
  if (!n)
    buf_puts(o, "true");
  buf_puts(o, ";\n");
}

/* Step values, tensor values and stochastic-rounding keys, once per chunk. */
static void emit_chunk_values(E *e, const char *ind) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  const Lang *L = e->L;
  Buf *o = e->out;
  for (Ref r = 0; r < g->nins; r++) {
    const Ins *x = &g->ins[r];
    if (x->scope != SCOPE_STEP || x->op == OP_CONST || x->op == OP_STORE || !used_here(e, r))
      continue;
    if (x->type == TY_I32)
      buf_printf(o, "%sconst int s_%s = (int)step[%d].i;\n", ind, e->stem[r], r);
    else
      buf_printf(o, "%sconst %s s_%s = step[%d]%s;\n", ind, L->type[x->type], e->stem[r], r, L->field[x->type]);
  }
  for (Ref r = 0; r < g->nins; r++) {
    const Ins *x = &g->ins[r];
    if (x->scope == SCOPE_TENSOR && x->op == OP_REDUCE && used_here(e, r))
      buf_printf(o, "%sconst double t_%s = tvals[(long long)ch.tensor * %d + %d].d;\n", ind, e->stem[r], g->nins, r);
  }
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->op == OP_CVT_SR)
      buf_printf(o, "%sconst uint32_t k_%s = optc_sr_key((uint64_t)%s, (uint64_t)%s, (uint32_t)ch.tensor);\n", ind,
                 e->stem[i], operand(e, x->args[1]), operand(e, x->args[2]));
    if (x->scope == SCOPE_TENSOR && x->op != OP_REDUCE)
      buf_printf(o, "%sconst %s t_%s = %s;\n", ind, L->type[x->type], e->stem[i], render(e, i, "0"));
  }
}

/* Phase k as one kernel. An element-wise phase runs one chunk per block,
 * thread t taking the 8 elements at 8t, 8t + 8 * threads, ... A phase with
 * reductions runs 8 / lanes threads per chunk: the thread of lanes l .. l +
 * lanes - 1 takes elements l, l + 8, l + 16, ... of each of its lanes in
 * order, so that each lane is one thread's own chain of adds, and as many
 * chains run at once as threads take lanes. With lanes > 1 it loads its
 * lanes' elements at j .. j + lanes - 1 in one access (fp32's 4-byte loads
 * reach the copy's speed with one lane; bf16's 2-byte ones do not). */
/* The buffers a phase reads and writes, in its header comment: " @name
 * type ..." after "reads:", then "\n *   writes:" and its own. */
static void phase_io_comment(Buf *o, const Graph *g, const PlanPhase *ph) {
  for (int i = 0; i < ph->nreads; i++)
    buf_printf(o, " @%s %s", g->bufs[ph->reads[i].buf].name, type_names[ph->reads[i].type]);
  if (!ph->nreads)
    buf_puts(o, " (none)");
  buf_puts(o, "\n *   writes:");
  for (int i = 0; i < ph->nwrites; i++)
    buf_printf(o, " @%s %s", g->bufs[ph->writes[i].buf].name, type_names[ph->writes[i].type]);
  if (!ph->nwrites)
    buf_puts(o, " (none)");
}

static void emit_phase(E *e, int k, CudaKernel *kinfo) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  const Lang *L = e->L;
  Buf *o = e->out;
  int nred = ph->nreds;
  int threads = e->threads;
  int lanes = e->lanes, tpc = OPTC_REDUCE_LANES / lanes; /* lanes a thread takes, threads a chunk has */
  int cpb = nred ? threads / tpc : 1;                     /* chunks per block */

  /* header: what the phase moves */
  buf_printf(o, "/* phase %d: %g bytes/element, %d ops/element\n *   reads:", k, ph->bytes_per_element, ph->nops);
  phase_io_comment(o, g, ph);
  buf_putc(o, '\n');
  for (int i = 0; i < nred; i++) {
    const Ins *x = &g->ins[ph->reds[i]];
    buf_printf(o, " *   partials[c * %d + %d]: %%%s = %s to %s\n", nred, i, e->stem[ph->reds[i]], red_names[x->red],
               scope_names[x->to]);
  }
  buf_puts(o, " */\n");
  if (!nred && e->min_blocks > 1)
    buf_printf(o, "extern \"C\" __global__ void __launch_bounds__(%d, %d)\n", threads, e->min_blocks);
  else
    buf_printf(o, L->kernel, threads);
  buf_printf(o, "optc_phase%d(const OptcChunk *chunks, long long nchunks, void *const *bufs, const OptcScalar *step,\n"
                "            const OptcScalar *tvals, double *partials) {\n",
             k);
  const char *ind = "  ";
  if (nred) {
    for (int i = 0; i < nred; i++)
      buf_printf(o, "  %s double ln_%s[%d]; /* [chunk of the block][lane] */\n", L->shared, e->stem[ph->reds[i]],
                 cpb * OPTC_REDUCE_LANES);
    buf_printf(o, "  const long long c = (long long)%s * %d + %s / %d;\n", L->block_index, cpb, L->thread_index, tpc);
    if (lanes == 1)
      buf_printf(o, "  const int lane = %s %% %d;\n", L->thread_index, tpc);
    else
      buf_printf(o, "  const int lane = %s %% %d * %d; /* this thread's first */\n", L->thread_index, tpc, lanes);
    for (int i = 0; i < nred; i++) {
      Ref r = ph->reds[i];
      const char *init = red_is_max((RedKind)g->ins[r].red) ? "(double)optc_bits_f32(0xff800000u)" : "0.0";
      buf_printf(o, "  double a_%s[%d] = {", e->stem[r], lanes);
      for (int l = 0; l < lanes; l++)
        buf_printf(o, "%s%s", l ? ", " : "", init);
      buf_puts(o, "}; /* this thread's lanes' */\n");
    }
    buf_puts(o, "  if (c < nchunks) {\n");
    buf_puts(o, "    const OptcChunk ch = chunks[c];\n");
    ind = "    ";
  } else {
    buf_printf(o, "  if ((long long)%s >= nchunks)\n    return;\n", L->block_index);
    buf_printf(o, "  const OptcChunk ch = chunks[%s];\n", L->block_index);
  }

  /* the chunk's first element of each buffer the phase touches */
  bool *touched = arena_alloc(e->a, (size_t)g->nbufs + 1);
  int ntouched = emit_pointers(e, ind, touched);
  if (ntouched && !nred)
    emit_vec_check(e, touched);
  if (nred && lanes > 1 && ph->nreads) { /* whether its lanes' loads can be one access each */
    buf_printf(o, "%sconst bool vec = ", ind);
    for (int i = 0; i < ph->nreads; i++)
      buf_printf(o, "%soptc_aligned(p_%s, %d)", i ? " && " : "", e->bstem[ph->reads[i].buf],
                 lanes * type_size(g->bufs[ph->reads[i].buf].type));
    buf_puts(o, ";\n");
  }

  emit_chunk_values(e, ind);

  /* uses within the element loop: who is inlined */
  memset(e->uses, 0, sizeof(int) * (size_t)g->nins);
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (!per_element(x))
      continue;
    for (int a = 0; a < op_info[x->op].nargs; a++)
      e->uses[x->args[a]]++;
  }

  if (nred && lanes == 1) {
    /* lane by lane: element j of the chunk, its loads, its value, its stores */
    buf_printf(o, "#pragma unroll 4\n    for (long long j = lane; j < ch.len; j += %d) {\n", OPTC_REDUCE_LANES);
    for (Ref i = ph->lo; i < ph->hi; i++) {
      const Ins *x = &g->ins[i];
      if (x->op == OP_LOAD)
        buf_printf(o, "      const %s x_%s[1] = {p_%s[j]};\n", L->type[x->type], e->stem[i], e->bstem[x->buf]);
    }
    emit_slots(e, OP_STORE, "      ", 1);
    buf_puts(o, "      const int e = 0; /* the one element: x_ and o_ as in the element-wise phases */\n");
    emit_element(e, "      ", "ch.start + j");
    emit_writes(e, "      ", "j", "0");
    buf_puts(o, "    }\n  }\n");
  } else if (nred) {
    /* lanes at a time: elements j .. j + lanes - 1 of the chunk (the n of
     * them in it), one load per buffer where vec, each element's value in
     * its lane's chain, the stores one by one */
    buf_printf(o, "#pragma unroll 2\n    for (long long j = lane; j < ch.len; j += %d) {\n", OPTC_REDUCE_LANES);
    buf_printf(o, "      const int n = ch.len - j < %d ? (int)(ch.len - j) : %d;\n", lanes, lanes);
    emit_slots(e, OP_LOAD, "      ", lanes);
    emit_slots(e, OP_STORE, "      ", lanes);
    if (ph->nreads) {
      buf_printf(o, "      if (vec && n == %d) {\n", lanes);
      for (Ref i = ph->lo; i < ph->hi; i++) {
        const Ins *x = &g->ins[i];
        if (x->op != OP_LOAD)
          continue;
        const char *sfx = mem_suffix((Type)g->bufs[x->buf].type);
        buf_printf(o, "        optc_vload%d_%s(x_%s, p_%s + j);\n", lanes, sfx, e->stem[i], e->bstem[x->buf]);
      }
      buf_puts(o, "      } else {\n");
      buf_printf(o, "#pragma unroll\n        for (int e = 0; e < %d; e++) {\n", lanes);
      for (Ref i = ph->lo; i < ph->hi; i++) {
        const Ins *x = &g->ins[i];
        if (x->op == OP_LOAD)
          buf_printf(o, "          x_%s[e] = e < n ? p_%s[j + e] : (%s)0;\n", e->stem[i], e->bstem[x->buf],
                     L->type[x->type]);
      }
      buf_puts(o, "        }\n      }\n");
    }
    buf_printf(o, "#pragma unroll\n      for (int e = 0; e < %d; e++) {\n        if (e >= n)\n          break;\n", lanes);
    emit_element(e, "        ", "ch.start + j + e");
    emit_writes(e, "        ", "j + e", "e");
    buf_puts(o, "      }\n    }\n  }\n");
  }
  if (nred) {
    /* the chunk's partial: its 8 lanes (ln_[chunk of the block * 8 + lane],
     * this thread's from at) combined as numerics.h combines them */
    char at[64];
    if (lanes == 1)
      snprintf(at, sizeof at, "%s", L->thread_index);
    else
      snprintf(at, sizeof at, "%s * %d", L->thread_index, lanes);
    for (int i = 0; i < nred; i++)
      for (int l = 0; l < lanes; l++)
        buf_printf(o, "  ln_%s[%s%s] = a_%s[%d];\n", e->stem[ph->reds[i]], at, l ? arena_printf(e->a, " + %d", l) : "",
                   e->stem[ph->reds[i]], l);
    buf_printf(o, "  %s;\n", L->barrier);
    buf_puts(o, "  if (lane == 0 && c < nchunks) {\n");
    for (int i = 0; i < nred; i++) {
      Ref r = ph->reds[i];
      buf_printf(o, "    partials[c * %d + %d] = optc_lanes_combine(ln_%s + %s, %d);\n", nred, i, e->stem[r], at,
                 red_is_max((RedKind)g->ins[r].red));
    }
    buf_puts(o, "  }\n}\n\n");
  } else {
    buf_printf(o, "  for (long long j = (long long)%s * %d; j < ch.len; j += %d) {\n", L->thread_index, CUDA_VEC,
               CUDA_VEC * threads);
    buf_printf(o, "    const int n = ch.len - j < %d ? (int)(ch.len - j) : %d;\n", CUDA_VEC, CUDA_VEC);
    buf_printf(o, "    const bool full = vec && n == %d;\n", CUDA_VEC);
    emit_slots(e, OP_LOAD, "    ", CUDA_VEC);
    emit_vectors(e, OP_LOAD);
    emit_slots(e, OP_STORE, "    ", CUDA_VEC);
    buf_printf(o, "#pragma unroll\n    for (int e = 0; e < %d; e++) {\n", CUDA_VEC);
    emit_element(e, "      ", "ch.start + j + e");
    buf_puts(o, "    }\n");
    emit_vectors(e, OP_STORE);
    buf_puts(o, "  }\n}\n\n");
  }

  if (kinfo) {
    snprintf(kinfo->name, sizeof kinfo->name, "optc_phase%d", k);
    kinfo->threads = threads;
    kinfo->cpb = cpb;
    kinfo->nred = nred;
    kinfo->smem = nred * cpb * OPTC_REDUCE_LANES * 8;
    kinfo->regs = kinfo->spill_stores = kinfo->spill_loads = kinfo->stack = -1;
  }
}


/* ---- a phase with block scope (quantized states) ----------------------------------------- */

static bool is_bred(const Ins *x) { return x->op == OP_REDUCE && x->to == SCOPE_BLOCK; }

/* What a block reduction's partials are kept in: f32 for an operand of
 * f32 or narrower (the max of f32 values is one of them), else f64. */
static const char *bred_type(const Graph *g, Ref i) { return g->ins[g->ins[i].args[0]].type == TY_F64 ? "double" : "float"; }

static bool has_block_scope(const Graph *g, const PlanPhase *ph) {
  for (Ref i = ph->lo; i < ph->hi; i++)
    if (g->ins[i].scope == SCOPE_BLOCK)
      return true;
  return false;
}

/* The element values of block stage bs of one element (e): each stored
 * into its o_ slot, each that a later stage reads into its k_ array, and
 * the block reductions of them folded into a thread's a_. */
static void emit_block_stage(E *e, int bs, const char *ind, const char *index, const bool *cross) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  const uint8_t *bst = g->plan->bstage;
  Buf *o = e->out;
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (is_bred(x)) {
      if (bst[i] == bs + 1) {
        Ref a = x->args[0];
        Type at = (Type)g->ins[a].type;
        bool d = at == TY_F64; /* in f32 for a narrower operand: its max is exact there */
        const char *v = d ? operand(e, a) : to_f32(e, operand(e, a), at);
        buf_printf(o, "%sif (e < n)\n%s  a_%s = optc_bmax%s(a_%s, %s%s%s);\n", ind, ind, e->stem[i], d ? "" : "f",
                   e->stem[i], x->red == RED_ABSMAX ? (d ? "fabs(" : "fabsf(") : "", v, x->red == RED_ABSMAX ? ")" : "");
      }
      continue;
    }
    if (x->scope != SCOPE_ELEM || bst[i] != bs || x->op == OP_LOAD)
      continue;
    if (x->op == OP_STORE) {
      buf_printf(o, "%so_%s[e] = %s;\n", ind, e->stem[i], operand(e, x->args[0]));
    } else if (cross[i]) {
      buf_printf(o, "%sk_%s[e] = %s;\n", ind, e->stem[i], render(e, i, index));
      e->expr[i] = arena_printf(e->a, "k_%s[e]", e->stem[i]);
    } else if (e->uses[i] == 1) {
      e->expr[i] = render(e, i, index);
    } else if (e->uses[i] > 1) {
      buf_printf(o, "%sconst %s v_%s = %s;\n", ind, e->L->type[x->type], e->stem[i], render(e, i, index));
      e->expr[i] = arena_printf(e->a, "v_%s", e->stem[i]);
    }
  }
}

/* Phase k with block scope: a chunk per CUDA block, thread t taking the 8
 * elements at 8t, 8t + 8 * threads, ... as an element-wise phase, in
 * rounds every thread takes part in (for the barriers). The B / 8 threads
 * of one block of the graph's block size (B <= 8 * threads: a round holds
 * whole blocks) compute its stages in turn: stage s's values, stores and
 * block reductions' terms of each element, then each thread's partial
 * max in shared memory, a barrier, and the block's max, the same in each
 * of its threads. */
static void emit_block_phase(E *e, int k, CudaKernel *kinfo) {
  const Graph *g = e->g;
  const PlanPhase *ph = e->ph;
  const Lang *L = e->L;
  const uint8_t *bst = g->plan->bstage;
  Buf *o = e->out;
  int threads = e->threads, tb = g->block / CUDA_VEC;
  buf_printf(o, "/* phase %d: %g bytes/element, %d ops/element, blocks of %d elements in %d stages\n *   reads:", k,
             ph->bytes_per_element, ph->nops, g->block, ph->nbstages);
  phase_io_comment(o, g, ph);
  buf_puts(o, "\n */\n");
  /* the blocks per SM it is built for, given: with the threads alone,
   * ptxas budgets 64 registers and spills around the divides' calls */
  buf_printf(o, "extern \"C\" __global__ void __launch_bounds__(%d, %d)\n", threads, e->min_blocks);
  buf_printf(o, "optc_phase%d(const OptcChunk *chunks, long long nchunks, void *const *bufs, const OptcScalar *step,\n"
                "            const OptcScalar *tvals, double *partials) {\n",
             k);
  for (int i = 0; i < ph->nbreds; i++)
    buf_printf(o, "  %s %s bm_%s[%d]; /* each thread's partial */\n", L->shared, bred_type(g, ph->breds[i]),
               e->stem[ph->breds[i]], threads);
  buf_printf(o, "  if ((long long)%s >= nchunks)\n    return;\n", L->block_index);
  buf_printf(o, "  const OptcChunk ch = chunks[%s];\n", L->block_index);
  bool *touched = arena_alloc(e->a, (size_t)g->nbufs + 1);
  if (emit_pointers(e, "  ", touched))
    emit_vec_check(e, touched);
  emit_chunk_values(e, "  ");
  /* who is inlined; what a later stage reads */
  memset(e->uses, 0, sizeof(int) * (size_t)g->nins);
  bool *cross = arena_alloc(e->a, (size_t)g->nins + 1);
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->scope == SCOPE_STEP && x->op != OP_STORE && x->op != OP_REDUCE)
      continue;
    for (int a = 0; a < op_info[x->op].nargs; a++) {
      Ref r = x->args[a];
      e->uses[r]++;
      if (g->ins[r].scope == SCOPE_ELEM && x->scope == SCOPE_ELEM && !is_bred(x) && bst[r] < bst[i])
        cross[r] = true;
    }
  }
  buf_printf(o, "  for (long long j0 = 0; j0 < ch.len; j0 += %d) {\n", CUDA_VEC * threads);
  buf_printf(o, "    const long long j = j0 + (long long)%s * %d;\n", L->thread_index, CUDA_VEC);
  buf_printf(o, "    const int n = ch.len - j < %d ? (ch.len > j ? (int)(ch.len - j) : 0) : %d;\n", CUDA_VEC, CUDA_VEC);
  buf_printf(o, "    const bool full = vec && n == %d;\n", CUDA_VEC);
  buf_printf(o, "    const long long kb = j / %d; /* this thread's block in the chunk */\n", g->block);
  emit_slots(e, OP_LOAD, "    ", CUDA_VEC);
  emit_vectors(e, OP_LOAD);
  emit_slots(e, OP_STORE, "    ", CUDA_VEC);
  for (Ref i = ph->lo; i < ph->hi; i++)
    if (cross[i])
      buf_printf(o, "    %s k_%s[%d];\n", L->type[g->ins[i].type], e->stem[i], CUDA_VEC);
  for (int bs = 0; bs < ph->nbstages; bs++) {
    bool reduced = false;
    for (int r = 0; r < ph->nbreds; r++)
      reduced |= bst[ph->breds[r]] == bs;
    if (reduced) {
      /* the block's max of each reduction the last stage folded: its
       * threads' partials, in order (a max: any order gives it) */
      for (int r = 0; r < ph->nbreds; r++)
        if (bst[ph->breds[r]] == bs)
          buf_printf(o, "    bm_%s[%s] = a_%s;\n", e->stem[ph->breds[r]], L->thread_index, e->stem[ph->breds[r]]);
      buf_printf(o, "    %s;\n", L->barrier);
      for (int r = 0; r < ph->nbreds; r++) {
        Ref i = ph->breds[r];
        if (bst[i] != bs)
          continue;
        const char *s = e->stem[i], *ty = bred_type(g, i);
        bool d = !strcmp(ty, "double");
        buf_printf(o, "    %s m_%s = bm_%s[%s / %d * %d];\n", ty, s, s, L->thread_index, tb, tb);
        buf_printf(o, "    for (int t = 1; t < %d; t++)\n      m_%s = optc_bmax%s(m_%s, bm_%s[%s / %d * %d + t]);\n", tb,
                   s, d ? "" : "f", s, s, L->thread_index, tb, tb);
        buf_printf(o, "    const double b_%s = m_%s != m_%s ? %s : (double)m_%s;\n", s, s, s, literal(e, TY_F64, NAN), s);
      }
      buf_printf(o, "    %s; /* the partials are read: the next ones may go in */\n", L->barrier);
    }
    /* the stage's other block values: per-block loads, the ops on block values */
    for (Ref i = ph->lo; i < ph->hi; i++) {
      const Ins *x = &g->ins[i];
      if (x->scope != SCOPE_BLOCK || bst[i] != bs || x->op == OP_STORE || is_bred(x))
        continue;
      if (x->op == OP_LOAD)
        buf_printf(o, "    const %s b_%s = n > 0 ? p_%s[kb] : (%s)0;\n", L->type[x->type], e->stem[i],
                   e->bstem[x->buf], L->type[x->type]);
      else
        buf_printf(o, "    const %s b_%s = %s;\n", L->type[x->type], e->stem[i], render(e, i, "0"));
    }
    for (int r = 0; r < ph->nbreds; r++)
      if (bst[ph->breds[r]] == bs + 1) {
        const char *ty = bred_type(g, ph->breds[r]);
        buf_printf(o, "    %s a_%s = %s;\n", ty, e->stem[ph->breds[r]],
                   literal(e, !strcmp(ty, "double") ? TY_F64 : TY_F32, -INFINITY));
      }
    buf_printf(o, "#pragma unroll\n    for (int e = 0; e < %d; e++) {\n", CUDA_VEC);
    emit_block_stage(e, bs, "      ", "ch.start + j + e", cross);
    buf_puts(o, "    }\n");
  }
  /* each block's own stores (its scales): by its first thread */
  for (Ref i = ph->lo; i < ph->hi; i++) {
    const Ins *x = &g->ins[i];
    if (x->op == OP_STORE && x->scope == SCOPE_BLOCK)
      buf_printf(o, "    if (%s %% %d == 0 && n > 0)\n      p_%s[kb] = %s;\n", L->thread_index, tb, e->bstem[x->buf],
                 operand(e, x->args[0]));
  }
  emit_vectors(e, OP_STORE);
  buf_puts(o, "  }\n}\n\n");
  if (kinfo) {
    snprintf(kinfo->name, sizeof kinfo->name, "optc_phase%d", k);
    kinfo->threads = threads;
    kinfo->cpb = 1;
    kinfo->nred = 0;
    kinfo->smem = 0;
    for (int i = 0; i < ph->nbreds; i++)
      kinfo->smem += threads * (strcmp(bred_type(g, ph->breds[i]), "double") ? 4 : 8);
    kinfo->regs = kinfo->spill_stores = kinfo->spill_loads = kinfo->stack = -1;
  }
}

/* The code books the graph's lookups and searches read, as device tables:
 * each one's values (optc_NAME_q) and search thresholds (optc_NAME_t). */
static void emit_books(const Graph *g, Buf *out) {
  bool used[NUM_BOOKS] = {false};
  for (Ref i = 0; i < g->nins; i++)
    if (g->ins[i].op == OP_LOOKUP || g->ins[i].op == OP_SEARCH)
      used[g->ins[i].book] = true;
  for (int k = 0; k < NUM_BOOKS; k++) {
    if (!used[k])
      continue;
    const CodeBook *cb = codebook((Book)k);
    for (int w = 0; w < 2; w++) {
      int n = w ? cb->n - 1 : cb->n;
      const float *v = w ? cb->t : cb->q;
      buf_printf(out, "/* code book %s: its %s (compiler/codebook.c) */\n__device__ const float optc_%s_%s[%d] = {", cb->name,
                 w ? "search thresholds" : "values", cb->name, w ? "t" : "q", n);
      for (int i = 0; i < n; i++) {
        char num[32]; /* 9 digits read back to the same f32; a point, so that it is a float literal */
        snprintf(num, sizeof num, "%.9g", v[i]);
        buf_printf(out, "%s%s%sf,", i % 8 ? " " : "\n  ", num, strpbrk(num, ".e") ? "" : ".0");
      }
      buf_puts(out, "\n};\n");
    }
  }
}

/* optc_nonfinite: partials[c] = 1 when chunk c holds a NaN or an infinite
 * grad, else 0 (what the executor runs when grads_finite < 0). */
static void emit_nonfinite(E *e, CudaKernel *kinfo) {
  const Graph *g = e->g;
  const Lang *L = e->L;
  Buf *o = e->out;
  int threads = e->threads;
  buf_puts(o, "/* partials[c] = 1 when chunk c holds a NaN or an infinite grad, else 0 */\n");
  buf_printf(o, L->kernel, threads);
  buf_puts(o, "optc_nonfinite(const OptcChunk *chunks, long long nchunks, void *const *bufs, const OptcScalar *step,\n"
              "               const OptcScalar *tvals, double *partials) {\n");
  buf_printf(o, "  %s int bad;\n", L->shared);
  buf_printf(o, "  if ((long long)%s >= nchunks)\n    return;\n", L->block_index);
  buf_printf(o, "  const OptcChunk ch = chunks[%s];\n", L->block_index);
  buf_printf(o, "  if (%s == 0)\n    bad = 0;\n  %s;\n", L->thread_index, L->barrier);
  for (int b = 0; b < g->nbufs; b++) {
    if (g->bufs[b].kind != BUF_GRAD)
      continue;
    Type t = (Type)g->bufs[b].type;
    buf_printf(o, "  {\n    const %s *const p = (const %s *)bufs[ch.tensor * %d + %d] + ch.start;\n", L->type[t], L->type[t],
               g->nbufs, b);
    buf_printf(o, "    for (long long j = %s; j < ch.len; j += %d)\n", L->thread_index, threads);
    buf_printf(o, "      if (!optc_isfinite(%s))\n        bad = 1;\n  }\n", to_f64(e, "p[j]", t));
  }
  buf_printf(o, "  %s;\n", L->barrier);
  buf_printf(o, "  if (%s == 0)\n    partials[%s] = bad;\n}\n", L->thread_index, L->block_index);
  if (kinfo) {
    snprintf(kinfo->name, sizeof kinfo->name, "optc_nonfinite");
    kinfo->threads = threads;
    kinfo->nred = 1;
    kinfo->cpb = 1;
    kinfo->smem = 4;
    kinfo->regs = kinfo->spill_stores = kinfo->spill_loads = kinfo->stack = -1;
  }
}

/* sqrt_mkl_ex's seed on the GPU: this host's RSQRTPS, as a table of its
 * 8192 distinct answers (numerics_mkl.h, optc_rsqrtps_from_tab), and the
 * generic MKL kernel around it, as the host computes it. */
static void emit_rsqrtps_table(Buf *out) {
#if defined(__x86_64__) || defined(__i386__)
  buf_puts(out, "/* this host CPU's RSQRTPS, for torch_cpu amd's sqrt (numerics_mkl.h) */\n"
                "__constant__ uint32_t optc_rsqrtps_tab[OPTC_RSQRTPS_TAB] = {");
  for (uint32_t i = 0; i < OPTC_RSQRTPS_TAB; i++)
    buf_printf(out, "%s0x%08xu,", i % 8 ? " " : "\n  ", optc_f32_bits(optc_rsqrtps_f32(optc_bits_f32(optc_rsqrtps_tab_input(i)))));
  buf_puts(out, "\n};\n"
                "OPTC_FN float optc_sqrt_mkl_ex_f32(float x) {\n"
                "  if (optc_mkl_ex_fast(optc_f32_bits(x)))\n"
                "    return optc_mkl_ex_newton(x, optc_rsqrtps_from_tab(optc_rsqrtps_tab, x));\n"
                "  return optc_mkl_ex_rare(x, sqrtf(x));\n"
                "}\n\n");
#else
  (void)out;
#endif
}

int cuda_emit(const Graph *g, const CudaTarget *t, Buf *out, CudaKernel *kernels) {
  const Plan *p = g->plan;
  if (!p) {
    error("cuda backend: the graph has no plan (run the pass pipeline first)");
    return -1;
  }
  int threads = t && t->threads ? t->threads : 128;
  int red_threads = t && t->red_threads ? t->red_threads : 128;
  int min_blocks = t && t->min_blocks ? t->min_blocks : 1;
  int red_lanes = t && t->red_lanes ? t->red_lanes : 1;
  if (red_lanes != 1 && red_lanes != 2 && red_lanes != 4 && red_lanes != 8) {
    error("cuda backend: lanes per thread of a reduction phase must be 1, 2, 4 or 8 (got %d)", red_lanes);
    return -1;
  }
  if (threads % 32 || red_threads % 32 || threads < 32 || red_threads < 32 || threads > 1024 || red_threads > 1024) {
    error("cuda backend: threads per block must be a multiple of 32 from 32 to 1024 (got %d and %d)", threads,
          red_threads);
    return -1;
  }
  if (min_blocks < 1 || min_blocks > 32) {
    error("cuda backend: blocks per SM must be from 1 to 32 (got %d)", min_blocks);
    return -1;
  }
  bool quant = false;
  for (int i = 0; i < g->nbufs; i++)
    quant |= type_is_code(g->bufs[i].type) || g->bufs[i].per_block;
  for (int k = 0; k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    if (!has_block_scope(g, ph))
      continue;
    quant = true;
    if (ph->nreds > 0) {
      error("cuda backend: phase %d has block reductions and reductions over the group; a phase here runs one or "
            "the other", k);
      return -1;
    }
    if (g->block > CUDA_VEC * threads) {
      error("cuda backend: blocks of %d elements; a block of %d threads takes %d at a time (give threads >= %d)",
            g->block, threads, CUDA_VEC * threads, g->block / CUDA_VEC);
      return -1;
    }
  }
  bool mkl_ex = false;
  for (Ref i = 0; i < g->nins; i++)
    mkl_ex |= g->ins[i].op == OP_SQRT_MKL_EX && g->ins[i].type != TY_F64;
#if !(defined(__x86_64__) || defined(__i386__))
  if (mkl_ex) {
    error("cuda backend: sqrt_mkl_ex (torch_cpu: amd) needs the host's RSQRTPS for its table, and this host is "
          "not x86");
    return -1;
  }
#endif
  E e = {.g = g, .L = &cuda_lang, .out = out, .min_blocks = min_blocks, .lanes = red_lanes};
  e.a = arena_new();
  e.uses = arena_alloc(e.a, sizeof(int) * (size_t)(g->nins + 1));
  e.expr = arena_alloc(e.a, sizeof(char *) * (size_t)(g->nins + 1));
  name_values(&e);
  int rc = 0;
  for (int k = 0; k < p->nphases; k++) {
    const PlanPhase *ph = &p->phases[k];
    if (ph->nreds * red_threads * red_lanes * 8 > 48 * 1024) {
      error("cuda backend: phase %d has %d reductions: more than a block of %d threads, %d lanes each, can combine "
            "in 48 KiB", k, ph->nreds, red_threads, red_lanes);
      rc = -1;
      goto out;
    }
  }

  /* The text names compiler/emit_cuda.c, where this file was until the
   * emitters moved into rooms of their own: every byte of the output is
   * kept, so that the CUDA C of every recipe compares equal across the
   * move (tests/emit_identical.sh). */
  buf_printf(out, "/* Generated by optc %s (compiler/emit_cuda.c): the step of a planned graph as CUDA C.\n",
             OPTC_VERSION);
  buf_printf(out, " *\n * %d phase%s over chunks (at most %d elements of one tensor; the chunk table is in\n",
             p->nphases, p->nphases == 1 ? "" : "s", OPTC_REDUCE_BLOCK);
  buf_puts(out, " * device memory). Launch in order, the host computing the ^stepK values and folding the\n"
                " * partials between phases:\n");
  CudaKernel *ks = kernels ? kernels : arena_alloc(e.a, sizeof(CudaKernel) * (size_t)(p->nphases + 1));
  /* the facts first, so the header can list them */
  Buf scratch = {0};
  for (int k = 0; k < p->nphases; k++) {
    e.ph = &p->phases[k];
    e.threads = e.ph->nreds ? red_threads : threads;
    e.out = &scratch;
    if (has_block_scope(g, e.ph))
      emit_block_phase(&e, k, &ks[k]);
    else
      emit_phase(&e, k, &ks[k]);
  }
  e.threads = threads;
  emit_nonfinite(&e, &ks[p->nphases]);
  buf_free(&scratch);
  for (int k = 0; k <= p->nphases; k++) {
    if (ks[k].cpb > 1)
      buf_printf(out, " *   %-15s grid nchunks / %d, block %d", ks[k].name, ks[k].cpb, ks[k].threads);
    else
      buf_printf(out, " *   %-15s grid nchunks, block %d", ks[k].name, ks[k].threads);
    if (ks[k].nred)
      buf_printf(out, ", %d partial%s per chunk", ks[k].nred, ks[k].nred == 1 ? "" : "s");
    if (ks[k].smem > 4)
      buf_printf(out, ", %d bytes shared", ks[k].smem);
    if (k == p->nphases)
      buf_puts(out, " (when grads_finite < 0)");
    buf_putc(out, '\n');
  }
  buf_puts(out, " */\n\n");
  /* NVRTC has no <stdint.h>; numerics.h takes these names from it elsewhere */
  buf_puts(out, "#ifdef __CUDACC_RTC__\ntypedef unsigned short uint16_t;\ntypedef unsigned int uint32_t;\n"
                "typedef unsigned long long uint64_t;\n#endif\n\n");
  buf_puts(out, "/* ---- compiler/numerics.h ---- */\n");
  buf_puts(out, optc_numerics_h);
  buf_puts(out, "/* ---- end of compiler/numerics.h ---- */\n\n");
  buf_puts(out, helpers);
  buf_putc(out, '\n');
  if (quant) {
    buf_puts(out, quant_helpers);
    emit_books(g, out);
    buf_putc(out, '\n');
  }
  if (mkl_ex)
    emit_rsqrtps_table(out);
  e.out = out;
  for (int k = 0; k < p->nphases; k++) {
    e.ph = &p->phases[k];
    e.threads = e.ph->nreds ? red_threads : threads;
    if (has_block_scope(g, e.ph))
      emit_block_phase(&e, k, NULL);
    else
      emit_phase(&e, k, NULL);
  }
  e.threads = threads;
  emit_nonfinite(&e, NULL);
out:
  arena_free(e.a);
  return rc;
}
