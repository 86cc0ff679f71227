/* test_numerics: the bit-level rounding every backend shares (numerics.h).
 *
 * - f32 -> f16 round-to-nearest-even against the compiler's _Float16
 *   conversion (IEEE, done by libgcc or F16C), and f16 -> f32 exactly, over
 *   every f16 and a dense sweep of f32 bit patterns;
 * - f32 -> bf16 against an independent formula on doubles;
 * - stochastic rounding: only the two neighbours come out, the mean is the
 *   value (unbiased), and the hash is a pure function of its inputs. */
#include "numerics.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;
#define CHECK(c, ...) \
  do { \
    if (!(c)) { \
      if (failures++ < 20) { \
        printf("FAIL %s:%d: ", __FILE__, __LINE__); \
        printf(__VA_ARGS__); \
        printf("\n"); \
      } \
    } \
  } while (0)

static uint16_t f16_hw(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

/* bf16 RNE from first principles: the nearest of the two bf16 neighbours
 * (truncation, and truncation plus one ulp) in exact double arithmetic,
 * ties to the even mantissa. */
static uint16_t bf16_ref(float f) {
  uint32_t u = optc_f32_bits(f);
  if (isnan(f))
    return (uint16_t)(((u >> 16) & 0x8000) | 0x7fc0);
  if (isinf(f))
    return (uint16_t)(u >> 16);
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  double x = fabs((double)f), a = fabs((double)optc_bf16_to_f32(lo)), b = fabs((double)optc_bf16_to_f32(hi));
  if ((lo & 0x7fff) == 0x7f7f) /* above the largest finite: the next step up is 2^128, i.e. infinity */
    b = ldexp(1.0, 128);
  if (x - a < b - x)
    return lo;
  if (x - a > b - x)
    return hi;
  return (lo & 1) ? hi : lo;
}

static void test_f16(void) {
  /* every f16 converts to f32 and back unchanged (NaNs become canonical) */
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = optc_f16_to_f32((uint16_t)h);
    uint16_t back = optc_f32_to_f16(f);
    bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    CHECK(nan ? back == ((h & 0x8000) | 0x7e00) : back == h, "f16 %04x -> %a -> %04x", h, f, back);
    if (!nan) {
      _Float16 hw;
      uint16_t hh = (uint16_t)h;
      memcpy(&hw, &hh, 2);
      CHECK(optc_f32_bits(f) == optc_f32_bits((float)hw), "f16 %04x widens to %a", h, f);
    }
  }
  /* a dense sweep of f32: every 251st bit pattern, both signs */
  for (uint64_t u = 0; u < 0x100000000ull; u += 251) {
    float f = optc_bits_f32((uint32_t)u);
    if (isnan(f))
      continue;
    CHECK(optc_f32_to_f16(f) == f16_hw(f), "f32 %08x (%a): %04x vs %04x", (uint32_t)u, f, optc_f32_to_f16(f),
          f16_hw(f));
  }
}

static void test_bf16(void) {
  for (uint64_t u = 0; u < 0x100000000ull; u += 397) {
    float f = optc_bits_f32((uint32_t)u);
    CHECK(optc_f32_to_bf16(f) == bf16_ref(f), "bf16 of %08x: %04x vs %04x", (uint32_t)u, optc_f32_to_bf16(f),
          bf16_ref(f));
  }
  /* ties go to even */
  CHECK(optc_f32_to_bf16(optc_bits_f32(0x3f808000)) == 0x3f80, "tie down to even");
  CHECK(optc_f32_to_bf16(optc_bits_f32(0x3f818000)) == 0x3f82, "tie up to even");
}

/* Rounds x stochastically n times with different element indices: the
 * results are the two neighbours only, and their mean is x. */
static void check_sr(float x, bool bf16) {
  enum { N = 200000 };
  uint32_t key = optc_sr_key(1234, 7, 3);
  double sum = 0;
  float lo = INFINITY, hi = -INFINITY;
  for (uint64_t i = 0; i < N; i++) {
    uint32_t bits = optc_sr_bits(key, i);
    float r = bf16 ? optc_bf16_to_f32(optc_f32_to_bf16_sr(x, bits)) : optc_f16_to_f32(optc_f32_to_f16_sr(x, bits));
    sum += r;
    lo = fminf(lo, r);
    hi = fmaxf(hi, r);
  }
  double mean = sum / N;
  double ulp = hi - lo;
  CHECK(lo <= x && x <= hi, "%s SR of %a gave [%a, %a]", bf16 ? "bf16" : "f16", x, lo, hi);
  /* The mean of N Bernoulli draws is within a few sigma: sigma <= ulp/(2 sqrt N). */
  CHECK(fabs(mean - x) <= 5 * ulp / (2 * sqrt(N)) + 1e-30, "%s SR of %a: mean %.9g, spread %g", bf16 ? "bf16" : "f16",
        x, mean, ulp);
  if (x == (bf16 ? optc_bf16_to_f32(optc_f32_to_bf16(x)) : optc_f16_to_f32(optc_f32_to_f16(x))))
    CHECK(lo == hi, "an exactly representable %a must not move", x);
}

static void test_sr(void) {
  float vals[] = {1.0f + 1.0f / 3, -2.71828f, 1e-3f, 3.14159e4f, 1.00001f, 0.5f, -1e-6f, 65500.0f};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    check_sr(vals[i], true);
    check_sr(vals[i], false);
  }
  /* f16 subnormals: a value between the two smallest steps */
  check_sr(1.7f * 5.9604644775390625e-8f, false);
  check_sr(-123.3f * 5.9604644775390625e-8f, false);
  /* the hash is a pure function: same inputs, same bits; others differ */
  CHECK(optc_sr_bits(optc_sr_key(1, 2, 3), 42) == optc_sr_bits(optc_sr_key(1, 2, 3), 42), "hash not pure");
  CHECK(optc_sr_key(1, 2, 3) != optc_sr_key(1, 3, 3), "step must change the key");
  CHECK(optc_sr_key(1, 2, 3) != optc_sr_key(2, 2, 3), "seed must change the key");
  CHECK(optc_sr_key(1, 2, 3) != optc_sr_key(1, 2, 4), "tensor must change the key");
  CHECK(optc_sr_bits(7, 1ull << 32) != optc_sr_bits(7, 0), "high index bits must matter");
  /* NaN and infinity round as usual */
  CHECK(optc_f32_to_bf16_sr(INFINITY, 0xffffffff) == 0x7f80, "inf");
  CHECK(optc_f32_to_f16_sr(-INFINITY, 0xffffffff) == 0xfc00, "-inf");
  CHECK(optc_f32_to_f16_sr(NAN, 5) == 0x7e00, "nan");
}

int main(void) {
  test_f16();
  test_bf16();
  test_sr();
  printf("test_numerics: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
  return failures != 0;
}
