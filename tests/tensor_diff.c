/* tensor_diff: compares the tensors of two safetensors files.
 *
 *   tensor_diff EXPECTED ACTUAL [--exact] [--rtol R] [--atol A] [--atol-scale S]
 *
 * Every tensor of EXPECTED must be in ACTUAL with the same dtype and shape.
 * --exact: the bytes must be identical. Otherwise each element must satisfy
 * |a - e| <= atol + rtol * |e| (NaNs must match NaNs); --atol-scale S adds
 * S * max|e| over the tensor to atol, for values that came out of a
 * cancellation, whose error is relative to the terms, not the result. Prints, per tensor,
 * the largest difference in ulps and relative terms and where it is, as
 * llm.c's check_tensor does; exits 1 if anything is off. */
#include "numerics.h"
#include "tensor.h"

#include <math.h>
#include <string.h>

static double elem(const Tensor *t, int64_t i) {
  switch (t->dtype) {
  case TY_F64: return ((const double *)t->data)[i];
  case TY_F32: return ((const float *)t->data)[i];
  case TY_BF16: return optc_bf16_to_f32(((const uint16_t *)t->data)[i]);
  case TY_F16: return optc_f16_to_f32(((const uint16_t *)t->data)[i]);
  case TY_I64: return (double)((const int64_t *)t->data)[i];
  case TY_I32: return ((const int32_t *)t->data)[i];
  default: return 0;
  }
}

/* The distance in units in the last place of the expected value's type. */
static double ulps(double a, double e, Type t) {
  if (a == e)
    return 0;
  int mant = t == TY_F64 ? 52 : t == TY_F32 ? 23 : t == TY_BF16 ? 7 : t == TY_F16 ? 10 : 0;
  if (!mant)
    return fabs(a - e);
  int exp;
  frexp(e != 0 ? e : a, &exp);
  return fabs(a - e) / ldexp(1.0, exp - 1 - mant);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: tensor_diff EXPECTED ACTUAL [--exact] [--rtol R] [--atol A]\n");
    return 2;
  }
  bool exact = false;
  double rtol = 0, atol = 0, atol_scale = 0;
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--exact"))
      exact = true;
    else if (!strcmp(argv[i], "--rtol") && i + 1 < argc)
      rtol = atof(argv[++i]);
    else if (!strcmp(argv[i], "--atol") && i + 1 < argc)
      atol = atof(argv[++i]);
    else if (!strcmp(argv[i], "--atol-scale") && i + 1 < argc)
      atol_scale = atof(argv[++i]);
    else {
      fprintf(stderr, "tensor_diff: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  TensorFile e = {0}, a = {0};
  if (st_read(argv[1], &e) != 0 || st_read(argv[2], &a) != 0)
    return 2;
  int bad = 0;
  for (int k = 0; k < e.n; k++) {
    const Tensor *te = &e.tensors[k];
    const Tensor *ta = tf_find(&a, te->name);
    if (!ta) {
      printf("%-28s MISSING from %s\n", te->name, argv[2]);
      bad++;
      continue;
    }
    bool same_shape = ta->ndim == te->ndim && ta->numel == te->numel;
    for (int d = 0; same_shape && d < te->ndim; d++)
      same_shape = ta->shape[d] == te->shape[d];
    if (ta->dtype != te->dtype || !same_shape) {
      printf("%-28s dtype/shape differ: %s vs %s\n", te->name, st_dtype_name(te->dtype), st_dtype_name(ta->dtype));
      bad++;
      continue;
    }
    size_t bytes = (size_t)te->numel * (size_t)type_size(te->dtype);
    if (exact) {
      int64_t first = -1;
      for (int64_t i = 0; i < te->numel && first < 0; i++)
        if (memcmp((char *)te->data + i * type_size(te->dtype), (char *)ta->data + i * type_size(te->dtype),
                   (size_t)type_size(te->dtype)))
          first = i;
      if (bytes && first >= 0) {
        printf("%-28s NOT byte-identical: first at [%lld]: %.9g vs %.9g\n", te->name, (long long)first,
               elem(te, first), elem(ta, first));
        bad++;
      }
      continue;
    }
    double max_ulp = 0, max_rel = 0, max_abs = 0;
    int64_t at = -1, nbad = 0;
    for (int64_t i = 0; i < te->numel; i++)
      if (isfinite(elem(te, i)))
        max_abs = MAX(max_abs, fabs(elem(te, i)));
    double tol_abs = atol + atol_scale * max_abs;
    for (int64_t i = 0; i < te->numel; i++) {
      double x = elem(te, i), y = elem(ta, i);
      if (isnan(x) || isnan(y)) {
        if (isnan(x) != isnan(y))
          nbad++, at = i;
        continue;
      }
      double u = ulps(y, x, te->dtype);
      double rel = x != 0 ? fabs(y - x) / fabs(x) : fabs(y - x);
      if (u > max_ulp)
        max_ulp = u, at = at < 0 || nbad == 0 ? i : at;
      max_rel = MAX(max_rel, rel);
      if (fabs(y - x) > tol_abs + rtol * fabs(x))
        nbad++;
    }
    printf("%-28s max %.2f ulp, max rel %.3g%s", te->name, max_ulp, max_rel, nbad ? "  <-- OUT OF TOLERANCE" : "");
    if (at >= 0)
      printf(" (at [%lld]: expected %.9g, got %.9g)", (long long)at, elem(te, at), elem(ta, at));
    printf("\n");
    bad += nbad > 0;
  }
  tf_free(&e);
  tf_free(&a);
  if (bad)
    printf("tensor_diff: %d tensor(s) differ\n", bad);
  return bad ? 1 : 0;
}
