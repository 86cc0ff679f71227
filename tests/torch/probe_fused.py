#!/usr/bin/env python3
"""Which formula reproduces torch's fused=True CPU kernels, bit for bit.

    .venv/bin/python tests/torch/probe_fused.py [--quick]

torch's fused CPU optimizers (aten's FusedAdamKernel, FusedSGDKernel,
FusedAdagradKernel) compute each element in f32 (opmath) and round once
per store. Their C++ is compiled with contraction on, so where an a*b + c
becomes a fused multiply-add, and whether a python scalar is rounded to
the tensor's dtype first, is decided by the compiler and the source: this
probe decides it by running them. For each kernel it enumerates the
choices (fma or not at each multiply-add, scalars as f32 or as the dtype)
and prints those that give torch's bits on every element, separately for

  * the vector body: a tensor of 2^k elements (every element vectorized),
  * the tail: many tensors of 7 and 13 elements, which the kernels' scalar
    remainder loops compute (each thread's range is a whole number of
    64-byte units, so only a tensor's last numel % V elements are tail).

Exactly one combination should survive for each part.
"""
import argparse
import itertools
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe_ops import F32, ROUND, TORCH_DTYPE, f32, fma  # noqa: E402


def mad(use_fma, a, b, c):
    """a*b + c: fused or rounded twice."""
    return fma(a, b, c) if use_fma else f32(f32(a * b) + c)


# ---- emulations: one step on f32 copies of the tensors --------------------------------
# Each takes (state dict of f32 arrays, hyper dict, choice dict, R) and returns the
# new state dict (before the final rounding to the dtype). R rounds to the dtype.

def adam(st, h, c, R):
    p, g, m, v = st["param"], st["grad"], st["exp_avg"], st["exp_avg_sq"]
    S = (lambda x: R(F32(x))[()]) if c["scalars_as_dtype"] else F32
    if h["maximize"]:
        g = -g
    if h["weight_decay"] != 0:
        if h["adamw"]:
            p = f32(p * S(1 - h["lr"] * h["weight_decay"]))
        else:
            g = mad(c["fma_wd"], p, S(h["weight_decay"]), g)
    w = S(1 - h["beta1"])
    if abs(w) < 0.5:
        m1 = mad(c["fma_lerp"], w, f32(g - m), m)
    else:
        m1 = mad(c["fma_lerp"], -f32(g - m), f32(F32(1) - w), g)
    cg = f32(S(1 - h["beta2"]) * g)
    vb = f32(v * S(h["beta2"]))
    if c["v_form"] == 0:
        v1 = f32(vb + f32(cg * g))
    elif c["v_form"] == 1:
        v1 = fma(cg, g, vb)
    else:
        v1 = fma(v, S(h["beta2"]), f32(cg * g))
    out = dict(exp_avg=m1, exp_avg_sq=v1)
    vh = v1
    if h["amsgrad"]:
        vh = np.maximum(st["max_exp_avg_sq"], v1)
        out["max_exp_avg_sq"] = vh
    bc1 = 1 - h["beta1"] ** h["step"]
    bc2 = 1 - h["beta2"] ** h["step"]
    ss = h["lr"] / bc1
    denom = f32(f32(np.sqrt(vh) / S(bc2 ** 0.5)) + S(h["eps"]))
    if c["m_rounded"]:
        m1 = R(m1)
    out["param"] = f32(p + f32(f32(S(-ss) * m1) / denom))
    return out


def sgd(st, h, c, R):
    p, g = st["param"], st["grad"]
    S = (lambda x: R(F32(x))[()]) if c["scalars_as_dtype"] else F32
    if h["maximize"]:
        g = -g
    if h["weight_decay"] != 0:
        g = mad(c["fma_wd"], p, S(h["weight_decay"]), g)
    out = {}
    if h["momentum"] != 0:
        if h["first"]:
            buf = g
        else:
            b0 = st["momentum_buffer"]
            if c["buf_form"] == 0:
                buf = f32(f32(b0 * S(h["momentum"])) + f32(S(1 - h["dampening"]) * g))
            elif c["buf_form"] == 1:
                buf = fma(S(1 - h["dampening"]), g, f32(b0 * S(h["momentum"])))
            else:
                buf = fma(b0, S(h["momentum"]), f32(g * S(1 - h["dampening"])))
        out["momentum_buffer"] = buf
        if c["buf_rounded"]:
            buf = R(buf)
        g = mad(c["fma_nesterov"], buf, S(h["momentum"]), g) if h["nesterov"] else buf
    out["param"] = mad(c["fma_p"], g, S(-h["lr"]), p)
    return out


def adagrad(st, h, c, R):
    p, g, s = st["param"], st["grad"], st["sum"]
    S = (lambda x: R(F32(x))[()]) if c["scalars_as_dtype"] else F32
    if h["maximize"]:
        g = -g
    if h["weight_decay"] != 0:
        g = mad(c["fma_wd"], p, S(h["weight_decay"]), g)
    s1 = mad(c["fma_sum"], g, g, s)
    clr = h["lr"] / (1 + (h["step"] - 1) * h["lr_decay"])
    std = f32(np.sqrt(s1) + S(h["eps"]))
    return dict(sum=s1, param=f32(p - f32(f32(S(clr) * g) / std)))


KERNELS = {
    "adam": (adam, dict(scalars_as_dtype=[0, 1], fma_wd=[0, 1], fma_lerp=[0, 1], v_form=[0, 1, 2], m_rounded=[0, 1])),
    "sgd": (sgd, dict(scalars_as_dtype=[0, 1], fma_wd=[0, 1], buf_form=[0, 1, 2], fma_nesterov=[0, 1], fma_p=[0, 1],
                      buf_rounded=[0, 1])),
    "adagrad": (adagrad, dict(scalars_as_dtype=[0, 1], fma_wd=[0, 1], fma_sum=[0, 1])),
}

CASES = [
    ("AdamW", "adam", dict(adamw=True, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, amsgrad=False,
                           maximize=False)),
    ("AdamW amsgrad maximize", "adam", dict(adamw=True, lr=3e-4, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                                            amsgrad=True, maximize=True)),
    ("Adam wd", "adam", dict(adamw=False, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05,
                             amsgrad=False, maximize=False)),
    ("Adam beta1=0.3 (lerp weight >= 0.5)", "adam", dict(adamw=False, lr=1e-2, beta1=0.3, beta2=0.9, eps=1e-8,
                                                          weight_decay=0.0, amsgrad=False, maximize=False)),
    ("SGD momentum dampening wd", "sgd", dict(lr=0.01, momentum=0.9, dampening=0.1, weight_decay=1e-2,
                                              nesterov=False, maximize=False)),
    ("SGD nesterov maximize", "sgd", dict(lr=0.05, momentum=0.8, dampening=0.0, weight_decay=1e-3, nesterov=True,
                                          maximize=True)),
    ("SGD plain", "sgd", dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                              maximize=False)),
    ("Adagrad lr_decay wd", "adagrad", dict(lr=0.01, lr_decay=1e-3, weight_decay=1e-2, eps=1e-10,
                                            initial_accumulator_value=0.1, maximize=False)),
]


def torch_opt(kind, params, h):
    if kind == "adam":
        cls = torch.optim.AdamW if h["adamw"] else torch.optim.Adam
        return cls(params, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], weight_decay=h["weight_decay"],
                   amsgrad=h["amsgrad"], maximize=h["maximize"], fused=True)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                               weight_decay=h["weight_decay"], nesterov=h["nesterov"], maximize=h["maximize"],
                               fused=True)
    return torch.optim.Adagrad(params, lr=h["lr"], lr_decay=h["lr_decay"], weight_decay=h["weight_decay"],
                               eps=h["eps"], initial_accumulator_value=h["initial_accumulator_value"],
                               maximize=h["maximize"], fused=True)


def run(name, kind, h, dtype, rng, n_body, n_tail, vec):
    """One optimizer step after a few warm-up steps, in torch and in every
    emulation. Returns, for the body and for each offset into the tail,
    the combinations that reproduce torch there."""
    td = TORCH_DTYPE[dtype]
    sizes = [n_body] + [vec - 1] * n_tail  # a tensor of vec-1 elements is all tail
    params = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s).astype(F32)).to(td)) for s in sizes]
    opt = torch_opt(kind, params, h)
    warm = 3
    for it in range(warm + 1):
        for p in params:
            g = rng.standard_normal(p.numel()) * 0.1 * 10 ** rng.uniform(-1, 1, p.numel())
            p.grad = torch.from_numpy(g.astype(F32)).to(td)
        if it == warm:
            st = opt.state[params[0]]
            step = float(st["step"]) + 1 if "step" in st else it + 1
            before = [{"param": p.detach().float().numpy().copy(), "grad": p.grad.float().numpy().copy(),
                       **{k: v.float().numpy().copy() for k, v in opt.state[p].items()
                          if torch.is_tensor(v) and v.dim() > 0}} for p in params]
        opt.step()
    hh = dict(h, step=step, first=False)
    got = [{"param": p.detach().float().numpy(), **{k: v.float().numpy() for k, v in opt.state[p].items()
                                                    if torch.is_tensor(v) and v.dim() > 0}} for p in params]
    cat = lambda ds: {k: np.stack([d[k] for d in ds]) for k in ds[0]}  # noqa: E731
    tb, tg = cat(before[1:]), cat(got[1:])
    fn, space = KERNELS[kind]
    R = ROUND[dtype]
    keys = list(space)
    body, tail = [], [[] for _ in range(vec - 1)]
    for combo in itertools.product(*[space[k] for k in keys]):
        c = dict(zip(keys, combo))
        want = fn(before[0], hh, c, R)
        if all(np.array_equal(R(w).view(np.uint32), got[0][k].astype(F32).view(np.uint32)) for k, w in want.items()):
            body.append(c)
        want = fn(tb, hh, c, R)
        same = np.ones(vec - 1, bool)
        for k, w in want.items():
            same &= (R(w).view(np.uint32) == tg[k].astype(F32).view(np.uint32)).all(axis=0)
        for j in np.nonzero(same)[0]:
            tail[j].append(c)
    return body, tail


def agreed(cs, space):
    """What every surviving combination agrees on, and what made no difference."""
    if not cs:
        return "NONE"
    fixed = {k: cs[0][k] for k in space if all(c[k] == cs[0][k] for c in cs)}
    free = [k for k in space if k not in fixed]
    return ", ".join(f"{k}={v}" for k, v in fixed.items()) + (f"  (no effect: {', '.join(free)})" if free else "")


def describe(c, space):
    live = [k for k in space if len(space[k]) > 1]
    return ", ".join(f"{k}={c[k]}" for k in live)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(7)
    cap = torch.backends.cpu.get_cpu_capability()
    v32 = {"AVX512": 16, "AVX2": 8}.get(cap, 8)
    n_body, n_tail = (1 << 14, 300) if args.quick else (1 << 18, 4000)
    print(f"# torch {torch.__version__}, CPU capability {cap}")
    bad = 0
    for name, kind, h in CASES:
        space = KERNELS[kind][1]
        for dtype in ("fp32", "bf16", "fp16"):
            vec = v32 if dtype == "fp32" else 2 * v32
            body, tail = run(name, kind, h, dtype, rng, n_body, n_tail, vec)
            print(f"{name:38s} {dtype:5s} body: {agreed(body, space)}")
            bad += not body
            j = 0
            while j < len(tail):  # offsets into the tail with the same survivors
                k = j
                while k + 1 < len(tail) and tail[k + 1] == tail[j]:
                    k += 1
                print(f"{'':38s} {'':5s} tail[{j}..{k}]: {agreed(tail[j], space)}")
                bad += not tail[j]
                j = k + 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
