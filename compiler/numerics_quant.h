/* numerics_quant.h: a quantized state's code of a value, for the
 * interpreter and the tests (the GPU backend writes its own, from the same
 * thresholds: compiler/cuda/emit_cuda.c). Apart from numerics.h, which every
 * CUDA kernel carries whole, so that a step without quantized states is
 * the same text as before there were any. */
#ifndef OPTC_NUMERICS_QUANT_H
#define OPTC_NUMERICS_QUANT_H

#include "numerics.h"

/* ---- quantized states: a code book's codes ---------------------------------------
 * torchao's quantize_8bit_with_qmap and quantize_4bit_with_qmap, op for
 * op: a branchless binary search over the sorted code book q of n (a power
 * of two) entries, which never compares q[0] (c = the largest i >= 1 with
 * q[i] <= y, else 0), then a step up to c + 1 (at most n - 1) where y's
 * distance from q[c] in f32 is at least half the gap, a tie going up. A
 * NaN gets code 0. */
OPTC_FN uint32_t optc_code_search(const float *q, int n, float y) {
  uint32_t c = 0;
  for (int s = n / 2; s >= 1; s /= 2)
    c += y >= q[c + (uint32_t)s] ? (uint32_t)s : 0u;
  uint32_t up = c + 1 < (uint32_t)n ? c + 1 : (uint32_t)n - 1;
  float resid = y - q[c];
  float half = (q[up] - q[c]) * 0.5f;
  return resid >= half ? up : c;
}

/* The same code as a count: how many of the n - 1 thresholds t (ascending,
 * codebook.c) are at most y, by a binary search of its own. Each step of
 * optc_code_search is monotone in y (f32 subtraction rounds monotonically),
 * so the code rises by one at each t[j], the least f32 whose distance from
 * q[j] reaches half the gap above it; the backends search t. */
OPTC_FN uint32_t optc_code_count(const float *t, int n, float y) {
  uint32_t c = 0;
  for (int s = n / 2; s >= 1; s /= 2)
    c += y >= t[c + (uint32_t)s - 1u] ? (uint32_t)s : 0u;
  return c;
}

#endif
