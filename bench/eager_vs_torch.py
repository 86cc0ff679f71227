#!/usr/bin/env python3
"""optc's eager backend against torch's own for-loop, on the same tensors.

optc's eager executor (runtime/exec/eager.c) is the baseline that `optc bench`
and `compile.optimizer_step: false` show, and stands for torch's
`_single_tensor_adamw`: torch.optim.AdamW(foreach=False) on the CPU. This
times both in one run, round after round (the machine is shared, so they
are compared round by round, not against an old figure):

  optc eager        `optc bench optimizer --strategies eager --json` (its
                    graph includes torchtune's scale_grads, grad *= 1)
  torch for-loop    AdamW(foreach=False).step() over Scout's tensor mix
                    scaled to --params elements (bench.c's scaled_mix),
                    params ~ U(-1, 1), grads ~ U(-0.01, 0.01)
  + scale_grads     the same, with p.grad.mul_(scale) per tensor in front
                    (what optc's graph does too)

    .venv/bin/python bench/eager_vs_torch.py --params 64M --layouts fp32,bf16 --rounds 3
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_mix():
    """python/optc/bench.py's scaled_mix, without loading liboptc."""
    spec = importlib.util.spec_from_file_location("optc_bench_mix", os.path.join(ROOT, "python", "optc", "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.scaled_mix


def parse_count(s):
    mult = {"k": 1e3, "M": 1e6, "G": 1e9}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def optc_eager(optc, params, layout, reps, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [optc, "bench", "optimizer", "--params", str(params), "--layout", layout, "--strategies", "eager",
               "--reps", str(reps), "--json", f.name]
        if threads:
            cmd += ["--threads", str(threads)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        r = json.load(open(f.name))["results"][0]
    return r["ms_median"], r["ms_min"], r["ms_max"]


def torch_forloop(torch, sizes, dtype, reps, scale_grads):
    g = torch.Generator().manual_seed(12345)
    ps = []
    for n in sizes:
        p = torch.empty(n, dtype=dtype).uniform_(-1, 1, generator=g)
        p.grad = torch.empty(n, dtype=dtype).uniform_(-0.01, 0.01, generator=g)
        ps.append(p)
    opt = torch.optim.AdamW(ps, lr=2e-5, weight_decay=0.01, foreach=False)
    scale = torch.tensor(1.0)
    times = []
    with torch.no_grad():
        for i in range(2 + reps):
            t0 = time.perf_counter()
            if scale_grads:
                for p in ps:
                    p.grad.mul_(scale)
            opt.step()
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
    del opt, ps
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="64M")
    ap.add_argument("--layouts", default="fp32,bf16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="default: torch's (all cores)")
    ap.add_argument("--optc", default=os.path.join(ROOT, "build", "optc"))
    a = ap.parse_args()
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    n = parse_count(a.params)
    sizes = load_mix()(n)
    print(f"{sum(sizes)} elements in {len(sizes)} tensors, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; ms per step, median (min-max) of {a.reps}")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    print(f"{'layout':6} {'round':>5}  {'optc eager':>24}  {'torch for-loop':>24}  {'+ scale_grads':>24}  ratio")
    for layout in a.layouts.split(","):
        for rnd in range(a.rounds):
            e = optc_eager(a.optc, n, layout, a.reps, a.threads)
            t = torch_forloop(torch, sizes, dtypes[layout], a.reps, False)
            ts = torch_forloop(torch, sizes, dtypes[layout], a.reps, True)
            fmt = lambda r: f"{r[0]:8.1f} ({r[1]:.1f}-{r[2]:.1f})"
            print(f"{layout:6} {rnd:>5}  {fmt(e):>24}  {fmt(t):>24}  {fmt(ts):>24}  {e[0] / ts[0]:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
