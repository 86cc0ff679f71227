#!/usr/bin/env python3
"""Does compiler/numerics_mkl.h give torch's f32 sqrt bits on this CPU?

    .venv/bin/python tests/torch/probe_sqrt.py [--all] [--seed N]

It compiles a small shared object from compiler/numerics.h and
compiler/numerics_mkl.h with `cc` (in a temporary directory) and checks:

  * optc_rsqrt14_f32 against the VRSQRT14PS instruction, bit for bit, NaNs
    included (only where the CPU has avx512f);
  * torch.sqrt of a contiguous f32 tensor against two flavors:
      - "mkl-avx512": optc_sqrt_mkl_f32, bit for bit (MKL's AVX-512 path);
      - "ieee": IEEE sqrt; results that are NaN need only be NaN here, since
        the payload is the library's choice (MKL's is printed below).

By default it checks about 2^24 inputs: 2^15 for each sign and biased
exponent (random fractions, with the smallest and largest), which covers
subnormals, zeros, infinities and NaN payloads, plus dense runs where the
behaviour changes (the smallest subnormals, MKL's 2^-102 threshold, 1.0,
FLT_MAX). --all checks all 2^32 inputs, in chunks of 2^26 (a few minutes).

It exits 0 when torch matches one flavor exactly (and rsqrt14 matches the
hardware); otherwise it prints the first mismatches and exits 1. Where
torch's sqrt is IEEE it says so ("torch's sqrt here is IEEE"). Under
MKL_ENABLE_INSTRUCTIONS=AVX2 it is IEEE except on tiny normals (below
2^-104, about 1.9 million inputs): the probe says that, and exits 1.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHUNK = 1 << 26

C_SOURCE = r"""
#include "numerics.h"
#include "numerics_mkl.h"

void probe_sqrt_mkl(const float *x, float *y, long n) {
  for (long i = 0; i < n; i++)
    y[i] = optc_sqrt_mkl_f32(x[i]);
}

void probe_rsqrt14(const float *x, float *y, long n) {
  for (long i = 0; i < n; i++)
    y[i] = optc_rsqrt14_f32(x[i]);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

int probe_has_avx512f(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

__attribute__((target("avx512f"))) void probe_rsqrt14_hw(const float *x, float *y, long n) {
  for (long i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_rsqrt14_ps(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
#else
int probe_has_avx512f(void) { return 0; }
void probe_rsqrt14_hw(const float *x, float *y, long n) { (void)x, (void)y, (void)n; }
#endif
"""


def build(tmp):
    src = os.path.join(tmp, "probe_sqrt.c")
    so = os.path.join(tmp, "probe_sqrt.so")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    cmd = ["cc", "-O2", "-std=c99", "-fPIC", "-shared", "-I", os.path.join(ROOT, "compiler"), src, "-o", so]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("probe_sqrt: %s failed:\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    lib = ctypes.CDLL(so)
    arr = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    for name in ("probe_sqrt_mkl", "probe_rsqrt14", "probe_rsqrt14_hw"):
        getattr(lib, name).argtypes = arr
        getattr(lib, name).restype = None
    lib.probe_has_avx512f.restype = ctypes.c_int
    return lib


def call(fn, bits):
    x = np.ascontiguousarray(bits, dtype=np.uint32).view(np.float32)
    y = np.empty_like(x)
    fn(x.ctypes.data, y.ctypes.data, x.size)
    return y.view(np.uint32)


def ieee_sqrt(bits):
    with np.errstate(invalid="ignore"):
        return np.sqrt(bits.view(np.float32)).view(np.uint32)


def is_nan(bits):
    return (bits & 0x7FFFFFFF) > 0x7F800000


def sample(seed):
    """2^15 inputs for each of the 512 sign-and-exponent values, plus dense runs."""
    rng = np.random.default_rng(seed)
    per = 1 << 15
    frac = rng.integers(0, 1 << 23, size=(512, per), dtype=np.uint32)
    frac[:, 0], frac[:, 1], frac[:, 2] = 0, 1, 0x7FFFFF
    top = np.arange(512, dtype=np.uint32)[:, None] << 23
    runs = [(0x00000000, 1 << 16), (0x0C7F8000, 1 << 16), (0x3F7F8000, 1 << 16), (0x7F7F0000, (1 << 16) + 1),
            (0x80000000, 1 << 12), (0xFF7FF000, 1 << 12)]
    dense = [np.arange(lo, lo + n, dtype=np.uint64).astype(np.uint32) for lo, n in runs]
    return [np.concatenate([(top | frac).ravel()] + dense)]


def everything():
    for lo in range(0, 1 << 32, CHUNK):
        yield np.arange(lo, lo + CHUNK, dtype=np.uint64).astype(np.uint32)


class Tally:
    """Mismatch count and the first few mismatching rows of one comparison."""

    def __init__(self):
        self.bad, self.first = 0, []
        self.lo, self.hi = 1 << 32, -1  # the range of the mismatching inputs' bits

    def add(self, x, bad, cols):
        idx = np.flatnonzero(bad)
        self.bad += idx.size
        if idx.size:
            self.lo, self.hi = min(self.lo, int(x[idx].min())), max(self.hi, int(x[idx].max()))
        for i in idx[: max(0, 10 - len(self.first))]:
            self.first.append([x[i]] + [c[i] for c in cols])

    def where(self):
        return "inputs %08x..%08x" % (self.lo, self.hi) if self.bad else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="all 2^32 inputs instead of a sample of about 2^24")
    ap.add_argument("--seed", type=int, default=0, help="seed of the default sample")
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        hw = bool(lib.probe_has_avx512f())
        isa = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "(unset)")
        print("torch %s, MKL %s, MKL_ENABLE_INSTRUCTIONS=%s, avx512f: %s" % (
            torch.__version__, "yes" if torch.backends.mkl.is_available() else "no", isa, "yes" if hw else "no"))

        n = 0
        rsq = Tally()
        mkl = Tally()
        ieee = Tally()
        nan_out = {}  # (input class, torch's NaN bits) -> count
        for x in everything() if args.all else sample(args.seed):
            n += x.size
            if hw:
                h, e = call(lib.probe_rsqrt14_hw, x), call(lib.probe_rsqrt14, x)
                rsq.add(x, h != e, [h, e])
            t = torch.sqrt(torch.from_numpy(x.view(np.float32))).numpy().view(np.uint32)
            m = call(lib.probe_sqrt_mkl, x)
            s = ieee_sqrt(x)
            mkl.add(x, t != m, [t, m, s])
            tn, sn = is_nan(t), is_nan(s)
            ieee.add(x, np.where(sn, ~tn, t != s), [t, m, s])
            for cls, sel in (("NaN", is_nan(x)), ("negative", ~is_nan(x) & (x > 0x80000000))):
                k = np.flatnonzero(sel & tn)
                quiet = t[k] == (x[k] | 0x00400000)
                if quiet.any():
                    nan_out[(cls, "the input quieted")] = nan_out.get((cls, "the input quieted"), 0) + int(quiet.sum())
                vals, counts = np.unique(t[k[~quiet]], return_counts=True)
                for v, c in zip(vals, counts):
                    nan_out[(cls, "%08x" % v)] = nan_out.get((cls, "%08x" % v), 0) + int(c)

    print("%d inputs (%s), %.1f s" % (n, "all" if args.all else "sample", time.time() - t0))
    if hw:
        print("rsqrt14: optc_rsqrt14_f32 vs VRSQRT14PS: %d mismatches" % rsq.bad)
        for row in rsq.first:
            print("  x %08x  hardware %08x  optc %08x" % tuple(row))
    else:
        print("rsqrt14: no avx512f here, not checked")
    print("sqrt: torch vs optc_sqrt_mkl_f32: %d mismatches (%s)" % (mkl.bad, mkl.where()))
    print("sqrt: torch vs IEEE sqrt:         %d mismatches (%s)" % (ieee.bad, ieee.where()))
    for (cls, what), c in sorted(nan_out.items()):
        print("  torch's NaN for %s inputs: %s (%d)" % (cls, what, c))

    ok_rsq = rsq.bad == 0
    if mkl.bad == 0 and ieee.bad == 0:
        print("torch's sqrt here matches both flavors on these inputs")
    elif mkl.bad == 0:
        print("torch's sqrt here is MKL's AVX-512 sqrt: optc_sqrt_mkl_f32 gives its bits")
    elif ieee.bad == 0:
        print("torch's sqrt here is IEEE (use IEEE sqrt, not optc_sqrt_mkl_f32)")
    else:
        if 0x00800000 <= ieee.lo and ieee.hi < 0x0B800000:
            # MKL's AVX2 path: rsqrtps, then an FMA Goldschmidt step and a
            # residual correction; the residual underflows below 2^-104.
            print("torch's sqrt here is IEEE except on %d tiny normal inputs (below 2^-104), as MKL's AVX2 path"
                  " gives: neither flavor exactly; first mismatches:" % ieee.bad)
        else:
            print("torch's sqrt here is neither flavor; first mismatches:")
        for name, tally in (("mkl-avx512", mkl), ("ieee", ieee)):
            print("  against %s:" % name)
            for row in tally.first:
                print("    x %08x  torch %08x  optc_sqrt_mkl %08x  ieee %08x" % tuple(row))
    sys.exit(0 if ok_rsq and (mkl.bad == 0 or ieee.bad == 0) else 1)


if __name__ == "__main__":
    main()
