#!/usr/bin/env python3
"""Which formula reproduces torch's bits, op by op, on this CPU.

    .venv/bin/python tests/torch/probe_ops.py [--markdown] [--quick]

For every torch op that the built-in optimizers' single-tensor paths
(torch.optim.{Adam,AdamW,SGD,Adagrad,RMSprop}, foreach=False), lion-pytorch,
and torchtune's scale_grads_ / clip_grad_norm_ call, this runs the op in
torch on random data and tries candidate formulas written in exact
IEEE arithmetic (numpy, with an exactly rounded fused multiply-add). It
prints, per op and dtype, which candidates give torch's bits on every
element, separately for

  * the vector body: elements that torch's vectorized loop computes, and
  * the tail: elements left over at the end of an inner loop, in
    contiguous tensors (what an optimizer has), and in the rows of a
    strided tensor, which torch's CPU loops compute with scalar code.

Each row of r elements is its own contiguous tensor, or a row of a
non-contiguous view (a (k, r) slice of a (k, r + 1) tensor), which makes
every row one inner loop: its first floor(r / 2V) * 2V elements are the
body and the rest the tail, where V is the vector width (torch's loops
run two vectors per iteration). Rows of 7 and 29 elements are all tail
for every vector width; rows of 1024 all body. The formulas are named in the IR's vocabulary: fma(a, b, c)
is a*b + c rounded once; every other op rounds to f32 once; for bf16 and
fp16 the inputs are widened to f32 and the result rounded once to the
dtype, unless the candidate says "rounds x" where it rounds in between.

torch is the reference: nothing here reasons from torch's source.
"""
import argparse
import os
import platform
import sys

import numpy as np
import torch

F32 = np.float32
F64 = np.float64


# ---- exact arithmetic -----------------------------------------------------------

def f32(x):
    return np.asarray(x, dtype=F64).astype(F32)


def fma(a, b, c):
    """a*b + c rounded once to f32 (a, b, c are f32 arrays or scalars).

    The product of two f32 is exact in f64. The f64 sum is made
    round-to-odd from its exact error (TwoSum), and round-to-odd in 53
    bits then round-to-nearest-even in 24 is the correctly rounded result.
    """
    a, b, c = (np.asarray(v, dtype=F32).astype(F64) for v in (a, b, c))
    p = a * b
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bb = s - p
        e = (p - (s - bb)) + (c - bb)
        bits = s.view(np.uint64) if s.ndim else np.array([s]).view(np.uint64)
        even = (bits & 1) == 0
        nudge = np.isfinite(s) & (e != 0) & even
        toward = np.where(e > 0, np.inf, -np.inf)
        s = np.where(nudge, np.nextafter(s, toward), s)
    return s.astype(F32)


def bf16_round(x):
    """f32 -> bf16 -> f32, round to nearest even, NaN -> quiet NaN."""
    x = np.asarray(x, dtype=F32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, r)
    return (r.astype(np.uint32) << 16).view(F32)


def f16_round(x):
    return np.asarray(x, dtype=F32).astype(np.float16).astype(F32)


ROUND = {"fp32": lambda x: np.asarray(x, dtype=F32), "bf16": bf16_round, "fp16": f16_round}
TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---- data -------------------------------------------------------------------------

class Rows:
    """k rows of r elements, as non-contiguous views, and their f32 values."""

    def __init__(self, rng, k, r, dtype, scale=1.0, positive=False, spread=2.0):
        exps = rng.uniform(-spread, spread, size=(k, r))
        v = rng.standard_normal((k, r)) * scale * (10.0 ** exps)
        if positive:
            v = np.abs(v) + 1e-30
        base = torch.zeros((k, r + 1), dtype=TORCH_DTYPE[dtype])
        base[:, :r] = torch.from_numpy(v.astype(F32)).to(TORCH_DTYPE[dtype])
        self.t = base[:, :r]  # each row is one inner loop
        self.np = self.t.float().numpy().astype(F32)


def body_mask(k, r, v):
    """Elements a 2-vector-per-iteration loop of width v computes vectorized."""
    j = np.arange(r)
    return np.broadcast_to(j < (r // (2 * v)) * (2 * v), (k, r))


# ---- the ops -------------------------------------------------------------------------
# Each op: a name as torch spells the call, the inputs it needs (name -> kind),
# the scalars it takes, torch's call, and the candidates: name -> function of
# (inputs as f32 arrays, scalars as python floats, S) where S(x) turns a
# python scalar into the f32 that the kernel computes with.

def S32(x):
    return F32(x)


OPS = []


def op(name, inputs, scalars, call, candidates, dtypes=("fp32", "bf16", "fp16")):
    OPS.append(dict(name=name, inputs=inputs, scalars=scalars, call=call, cands=candidates, dtypes=dtypes))


# tensor.lerp_(end, weight): exp_avg.lerp_(grad, 1 - beta1), grad_avg.lerp_(grad, 1 - alpha)
op("self.lerp_(end, w)", {"self": {}, "end": {}}, {"w": [0.1, 0.001, 0.01, 0.7]},
   lambda t, s: t["self"].lerp_(t["end"], s["w"]),
   {
       "self + w*(end - self)":
           lambda x, s, S: f32(x["self"] + f32(S(s["w"]) * f32(x["end"] - x["self"]))) if s["w"] < 0.5 else
           f32(x["end"] - f32(f32(x["end"] - x["self"]) * f32(1 - S(s["w"])))),
       "fma(w, end - self, self)  [w < 0.5; else fma(w - 1, end - self, end)]":
           lambda x, s, S: fma(S(s["w"]), f32(x["end"] - x["self"]), x["self"]) if s["w"] < 0.5 else
           fma(f32(S(s["w"]) - F32(1)), f32(x["end"] - x["self"]), x["end"]),
       "fma(w, end - self, self)  [w < 0.5; else end - (end - self)*(1 - w)]":
           lambda x, s, S: fma(S(s["w"]), f32(x["end"] - x["self"]), x["self"]) if s["w"] < 0.5 else
           f32(x["end"] - f32(f32(x["end"] - x["self"]) * f32(F32(1) - S(s["w"])))),
       "fma(w, end - self, self)  [w < 0.5; else fma(-(end - self), 1 - w, end)]":
           lambda x, s, S: fma(S(s["w"]), f32(x["end"] - x["self"]), x["self"]) if s["w"] < 0.5 else
           fma(-f32(x["end"] - x["self"]), f32(F32(1) - S(s["w"])), x["end"]),
   })

# tensor.mul_(scalar): param.mul_(1 - lr*wd), exp_avg_sq.mul_(beta2), buf.mul_(momentum)
op("self.mul_(c)", {"self": {}}, {"c": [0.999, 0.9999, 0.9, 0.3]},
   lambda t, s: t["self"].mul_(s["c"]),
   {"self * c": lambda x, s, S: f32(x["self"] * S(s["c"]))})

# tensor.mul_(0-dim float32 tensor): torchtune's scale_grads_ and clip's _foreach_mul_
op("self.mul_(tensor0d_f32)", {"self": {}}, {"c": [1 / 3, 2 / 777, 0.123456789]},
   lambda t, s: t["self"].mul_(torch.tensor(s["c"], dtype=torch.float32)),
   {"self * f32(c)": lambda x, s, S: f32(x["self"] * F32(s["c"])),
    "self * dtype(c)  (the scalar rounded to the tensor's dtype first)":
        lambda x, s, S: None})

# tensor.add(other, alpha): grad.add(param, alpha=wd), grad.add(buf, alpha=momentum)
# tensor.add_(other, alpha): param.add_(grad, alpha=-lr), buf.add_(grad, alpha=1-dampening)
for inplace in (False, True):
    nm = "self.add_(other, alpha=a)" if inplace else "self.add(other, alpha=a)"
    op(nm, {"self": {}, "other": {}}, {"a": [0.01, -1e-3, 0.9, 1.0, 0.5]},
       (lambda t, s: t["self"].add_(t["other"], alpha=s["a"])) if inplace else
       (lambda t, s: t["self"].add(t["other"], alpha=s["a"])),
       {"self + a*other": lambda x, s, S: f32(x["self"] + f32(S(s["a"]) * x["other"])),
        "fma(a, other, self)": lambda x, s, S: fma(S(s["a"]), x["other"], x["self"]),
        "self + dtype(a*other)  (rounds a*other)": lambda x, s, S, R: f32(x["self"] + R(f32(S(s["a"]) * x["other"])))})

# tensor.addcmul_(t1, t2, value): exp_avg_sq.addcmul_(grad, grad, value=1 - beta2),
# state_sum.addcmul_(grad, grad, value=1); square_avg.addcmul(grad_avg, grad_avg, value=-1)
for inplace in (True, False):
    nm = "self.addcmul_(t1, t2, value=v)" if inplace else "self.addcmul(t1, t2, value=v)"
    op(nm, {"self": {"positive": True}, "t1": {}, "t2": {}}, {"v": [0.001, 0.01, 1.0, -1.0, 0.3]},
       (lambda t, s: t["self"].addcmul_(t["t1"], t["t2"], value=s["v"])) if inplace else
       (lambda t, s: t["self"].addcmul(t["t1"], t["t2"], value=s["v"])),
       {"self + (v*t1)*t2": lambda x, s, S: f32(x["self"] + f32(f32(S(s["v"]) * x["t1"]) * x["t2"])),
        "fma(v*t1, t2, self)": lambda x, s, S: fma(f32(S(s["v"]) * x["t1"]), x["t2"], x["self"]),
        "fma(v, t1*t2, self)": lambda x, s, S: fma(S(s["v"]), f32(x["t1"] * x["t2"]), x["self"]),
        "self + v*(t1*t2)": lambda x, s, S: f32(x["self"] + f32(S(s["v"]) * f32(x["t1"] * x["t2"])))})

# tensor.addcdiv_(t1, t2, value): param.addcdiv_(exp_avg, denom, value=-step_size),
# param.addcdiv_(grad, std, value=-clr), buf.mul_(momentum).addcdiv_(grad, avg)
op("self.addcdiv_(t1, t2, value=v)", {"self": {}, "t1": {}, "t2": {"positive": True}},
   {"v": [-1e-3, -0.0123, 1.0, -1.0]},
   lambda t, s: t["self"].addcdiv_(t["t1"], t["t2"], value=s["v"]),
   {"self + (v*t1)/t2": lambda x, s, S: f32(x["self"] + f32(f32(S(s["v"]) * x["t1"]) / x["t2"])),
    "self + v*(t1/t2)": lambda x, s, S: f32(x["self"] + f32(S(s["v"]) * f32(x["t1"] / x["t2"]))),
    "fma(v, t1/t2, self)": lambda x, s, S: fma(S(s["v"]), f32(x["t1"] / x["t2"]), x["self"])})

# tensor.sqrt(): exp_avg_sq.sqrt(), state_sum.sqrt(), square_avg.sqrt(), .sqrt_()
def sqrt_mkl(x):
    """MKL's vsSqrt as numerics_mkl.h computes it (built by probe_sqrt.py)."""
    global _SQRT_LIB
    import probe_sqrt
    if _SQRT_LIB is None:
        import tempfile
        _SQRT_LIB = probe_sqrt.build(tempfile.mkdtemp())
    bits = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    return probe_sqrt.call(_SQRT_LIB.probe_sqrt_mkl, bits.ravel()).view(F32).reshape(np.shape(x))


_SQRT_LIB = None
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
op("self.sqrt()", {"self": {"positive": True}}, {},
   lambda t, s: t["self"].sqrt(),
   {"sqrt(self)": lambda x, s, S: np.sqrt(x["self"]),
    "sqrt_mkl(self)  (MKL's vsSqrt on AVX-512: numerics_mkl.h)": lambda x, s, S: sqrt_mkl(x["self"])})

# tensor / python float: exp_avg_sq.sqrt() / bias_correction2_sqrt
op("self / c", {"self": {"positive": True}}, {"c": [0.0316227766, 0.99999, 0.3, 1.7]},
   lambda t, s: t["self"] / s["c"],
   {"self / c": lambda x, s, S: f32(x["self"] / S(s["c"])),
    "self * (1/c)": lambda x, s, S: f32(x["self"] * f32(F32(1) / S(s["c"])))})

# tensor.add_(python float): denom.add_(eps), std.add_(eps), avg.add_(eps); total_norm + 1e-6
op("self.add_(c)", {"self": {"positive": True, "scale": 1e-6}}, {"c": [1e-8, 1e-10, 1e-6, 0.5]},
   lambda t, s: t["self"].add_(s["c"]),
   {"self + c": lambda x, s, S: f32(x["self"] + S(s["c"]))})

# torch.maximum(a, b, out=a): amsgrad
op("torch.maximum(a, b, out=a)", {"a": {"positive": True}, "b": {"positive": True}}, {},
   lambda t, s: torch.maximum(t["a"], t["b"], out=t["a"]),
   {"max(a, b)": lambda x, s, S: np.maximum(x["a"], x["b"])})

# -tensor: maximize
op("-self", {"self": {}}, {},
   lambda t, s: -t["self"],
   {"-self": lambda x, s, S: -x["self"]})

# tensor.sign_(): lion
op("self.sign_()", {"self": {}}, {},
   lambda t, s: t["self"].sign_(),
   {"sign(self)": lambda x, s, S: np.sign(x["self"]).astype(F32)})

# tensor.reciprocal(): python_float / tensor (clip_coef = max_norm / (total_norm + 1e-6))
op("c / self", {"self": {"positive": True}}, {"c": [1.0, 0.5, 3.0]},
   lambda t, s: s["c"] / t["self"],
   {"(1/self)*c  (reciprocal, then multiply)":
        lambda x, s, S: None,
    "c / self": lambda x, s, S: f32(S(s["c"]) / x["self"])})

# torch.clamp(x, max=1.0): clip_coef_clamped
op("torch.clamp(self, max=c)", {"self": {"positive": True}}, {"c": [1.0]},
   lambda t, s: torch.clamp(t["self"], max=s["c"]),
   {"min(self, c)": lambda x, s, S: np.minimum(x["self"], S(s["c"]))})

# tensor.clone().mul_(b1).add(grad, alpha=1-b1): lion's interpolation (one op at a time)
# is covered by mul_ and add above.


def reciprocal_then_mul(x, s, dtype):
    r = ROUND[dtype](f32(F32(1) / x["self"]))
    return f32(r * F32(s["c"]))


# ---- running --------------------------------------------------------------------------------

def run_case(o, dtype, rng, rows, r, svals, vwidth, strided):
    x, t = {}, {}
    for nm, kw in o["inputs"].items():
        rr = Rows(rng, rows, r, dtype, **kw)
        x[nm], t[nm] = rr.np, rr.t
    if strided:
        got = o["call"](t, svals)
    else:  # each row its own contiguous tensor, as an optimizer's are
        got = torch.stack([o["call"]({k: v[i].contiguous() for k, v in t.items()}, svals) for i in range(rows)])
    got = got.float().numpy().astype(F32)
    body = body_mask(rows, r, vwidth)
    res = {}
    # a python scalar reaches the kernel as an f32 (opmath) or, for some ops
    # on bf16/fp16 tensors, rounded to the tensor's dtype first
    convs = [("", S32)]
    if dtype != "fp32" and svals:
        convs.append((f" [scalars as {dtype}]", lambda v: ROUND[dtype](F32(v))[()]))
    for cname, fn in o["cands"].items():
        for suffix, S in convs:
            if cname.startswith("(1/self)*c"):
                want = reciprocal_then_mul(x, svals, dtype)
            elif cname.startswith("self * dtype(c)"):
                if suffix:
                    continue
                want = f32(x["self"] * ROUND[dtype](F32(svals["c"])))
            elif fn.__code__.co_argcount == 4:
                want = fn(x, svals, S, ROUND[dtype])
            else:
                want = fn(x, svals, S)
            want = ROUND[dtype](want)
            same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
            res[cname + suffix] = (bool(same[body].all()), int(body.sum()), bool(same[~body].all()),
                                   int((~body).sum()))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--quick", action="store_true", help="fewer elements (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cap = torch.backends.cpu.get_cpu_capability()
    # torch's vector width in f32 lanes for the capability it dispatched to
    v32 = {"AVX512": 16, "AVX2": 8}.get(cap, 4)
    rng = np.random.default_rng(20261201)
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":")[1].split())
                break
    except OSError:
        pass
    feats = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16") if f in flags]
    print(f"# torch {torch.__version__}, CPU capability {cap} (ATEN_CPU_CAPABILITY="
          f"{os.environ.get('ATEN_CPU_CAPABILITY', '')}), {platform.processor() or platform.machine()}, "
          f"features: {' '.join(feats)}")
    n_big = 20000 if args.quick else 400000
    table = []
    for o in OPS:
        for dtype in o["dtypes"]:
            vw = v32 if dtype == "fp32" else 2 * v32  # reduced types: two f32 vectors per load
            keys = list(o["scalars"])
            combos = [dict()]
            for k in keys:
                combos = [dict(c, **{k: v}) for c in combos for v in o["scalars"][k]]
            agg = {}
            for strided in (False, True):
                for sv in combos:
                    for r in (7, 29, 4 * vw + 3, 1024):
                        rows = max(1, n_big // r) if dtype != "fp32" else max(1, n_big // (4 * r))
                        if not strided:
                            rows = max(1, rows // 8)  # one torch call per row
                        res = run_case(o, dtype, rng, rows, r, sv, vw, strided)
                        for c, (bok, bn, tok, tn) in res.items():
                            a = agg.setdefault(c, [True, 0, True, 0, True, 0])
                            a[0] &= bok or bn == 0
                            a[1] += bn
                            k = 4 if strided else 2
                            a[k] &= tok or tn == 0
                            a[k + 1] += tn
            body = [c for c, a in agg.items() if a[0]]
            tail = [c for c, a in agg.items() if a[2]]
            stail = [c for c, a in agg.items() if a[4]]
            nb = max(a[1] for a in agg.values())
            nt = max(a[3] for a in agg.values())
            table.append((o["name"], dtype, body, tail, stail, nb, nt))
    if args.markdown:
        print("| op | dtype | vector body | tail (contiguous) | tail of a strided row |")
        print("|---|---|---|---|---|")
        for name, dtype, body, tail, stail, nb, nt in table:
            print(f"| `{name}` | {dtype} | {' / '.join(body) or 'none'} | {' / '.join(tail) or 'none'} | "
                  f"{'same' if stail == tail else ' / '.join(stail) or 'none'} |")
    else:
        for name, dtype, body, tail, stail, nb, nt in table:
            print(f"{name:34s} {dtype:5s} body ({nb} elems): {' | '.join(body) or 'NONE'}")
            print(f"{'':34s} {'':5s} tail ({nt} elems): {' | '.join(tail) or 'NONE'}")
            if stail != tail:
                print(f"{'':34s} {'':5s} strided-row tail: {' | '.join(stail) or 'NONE'}")
    bad = [t for t in table if not t[2] or not t[3]]
    if bad:
        print(f"# {len(bad)} op/dtype pairs have no matching candidate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
