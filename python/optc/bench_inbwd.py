"""python -m optc.bench_inbwd: the step inside the backward, on the CPU, as a
proxy of the offloaded finetune where the GPU computes and the host steps.

The model's forward and backward run on torch's threads (standing for the
GPU) and optc's step on threads of its own (the host): --split 1+1 gives
each one core of two. The iteration is timed two ways, in turns:

  after      forward, backward, then opt.step(): the step waits for the
             backward, as in an offloaded finetune today (the GPU idles
             while the host steps)
  in-bwd     the same optimizer with in_backward=True: each param is stepped
             by optc's thread as its grad lands, beside the rest of the
             backward; opt.step() waits for what is left

Both give the same bits (tests/torch/test_fsdp.py). The model is an
optional embedding and a stack of Linear layers (bf16 or fp32, AdamW); the batch is the largest that leaves the step
at least --step-share of the serial iteration (default 0.34: "a third or
more").
--split shared runs both on every core (torch's threads and optc's
threads all the cores): what in_backward gains where the step and the
backward compete for the same cores, so that the figures are not read as
more than they are. --clip adds max_norm (speculate or not).
"""
import argparse
import json
import os
import statistics
import sys
import time


def build(torch, width, depth, vocab, dtype, seed=0):
    """An embedding of vocab tokens (its backward is a scatter into a dense
    grad: little compute for many params, as a language model's embedding
    and output layers are), then depth Linear + GELU layers."""
    torch.manual_seed(seed)
    layers = [torch.nn.Embedding(vocab, width)] if vocab else []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(dtype)


def inputs(torch, batch, width, vocab, dtype):
    if vocab:
        return torch.randint(0, vocab, (batch,), generator=torch.Generator().manual_seed(1))
    return torch.randn(batch, width).to(dtype)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m optc.bench_inbwd", description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=0, help="an Embedding(vocab, width) first (default 0: none)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                    help="params, grads, states and the model's compute (default bf16, as the Scout's finetune)")
    ap.add_argument("--batch", type=int, default=0, help="tokens a step (default: chosen for --step-share)")
    ap.add_argument("--step-share", type=float, default=0.34)
    ap.add_argument("--split", default="1+1,shared", help="a comma list of T+O (torch's threads + optc's) "
                    "or 'shared' (both all cores); default 1+1,shared")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--clip", default="", help="a comma list of after,speculate: with max_norm too")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)

    import torch
    import optc.torch as otorch

    cores = len(os.sched_getaffinity(0))
    out = dict(cpu=_cpu(), cores=cores, torch=torch.__version__, width=args.width, depth=args.depth, runs=[])
    out["parallel_ratios"] = [parallel_probe(torch) for _ in range(5)]
    out["parallel_ratio"] = sorted(out["parallel_ratios"])[2]
    print(f"  two threads of independent matmuls take {out['parallel_ratio']:.2f}x one thread's time here, the "
          f"median of {', '.join(f'{r:.2f}' for r in out['parallel_ratios'])} (1.0: two free cores; near 2: they "
          f"share one, and overlap cannot pay)")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    out["dtype"] = args.dtype
    nparams = args.depth * (args.width * args.width + args.width) + args.vocab * args.width
    out["vocab"] = args.vocab
    print(f"python -m optc.bench_inbwd: Embedding({args.vocab}, {args.width}) + {args.depth} x Linear({args.width}, "
          f"{args.width}), {nparams / 1e6:.1f}M {args.dtype} params, AdamW; {cores} cores ({out['cpu']})")

    splits = []
    for s in args.split.split(","):
        if s == "shared":
            splits.append(("shared", cores, cores))
        else:
            t, o = (int(v) for v in s.split("+"))
            splits.append((s, t, o))

    batch = args.batch
    for name, tthreads, othreads in splits:
        torch.set_num_threads(tthreads)
        model = build(torch, args.width, args.depth, args.vocab, dtype)
        if not batch:
            batch = _choose_batch(torch, otorch, model, args.width, args.vocab, dtype, args.step_share, othreads)
        x = inputs(torch, batch, args.width, args.vocab, dtype)
        modes = [("after", {}), ("in-bwd", dict(in_backward=True))]
        for c in [c for c in args.clip.split(",") if c]:
            modes += [("after+clip", dict(max_norm=1.0)),
                      (f"in-bwd+clip({c})", dict(in_backward=True, max_norm=1.0, speculate=c == "speculate"))]
        runs = {}
        for mname, kw in modes:
            m = build(torch, args.width, args.depth, args.vocab, dtype)
            o = otorch.AdamW(m.parameters(), lr=1e-4, threads=othreads, **kw)
            runs[mname] = (m, o)
        fb_only = []

        def iteration(m, o):
            """(ms of forward and backward, ms in opt.step() after it)"""
            t0 = time.perf_counter()
            loss = m(x).float().square().mean()
            loss.backward()
            t1 = time.perf_counter()
            o.step()
            t2 = time.perf_counter()
            o.zero_grad()
            return (t1 - t0) * 1e3, (t2 - t1) * 1e3

        def fwd_bwd(m):
            loss = m(x).float().square().mean()
            loss.backward()
            for p in m.parameters():
                p.grad = None

        times = {k: [] for k in runs}
        parts = {k: [] for k in runs}
        for r in range(args.warmup + args.rounds):
            order = list(runs)
            order = order[r % len(order):] + order[:r % len(order)]
            t0 = time.perf_counter()
            fwd_bwd(runs["after"][0])
            fb = (time.perf_counter() - t0) * 1e3
            for k in order:
                t0 = time.perf_counter()
                part = iteration(*runs[k])
                dt = (time.perf_counter() - t0) * 1e3
                if r >= args.warmup:
                    times[k].append(dt)
                    parts[k].append(part)
            if r >= args.warmup:
                fb_only.append(fb)
        base = times["after"]
        fbm = statistics.median(fb_only)
        print(f"\n  {name}: torch {tthreads} thread(s), optc {othreads}; batch {batch}; forward+backward alone "
              f"{fbm:.1f} ms; {args.rounds} rounds in turns")
        print(f"  {'':22s} {'ms/iter':>8s} {'min':>7s} {'max':>7s} {'vs after':>9s} {'fwd+bwd':>8s} "
              f"{'in step()':>9s}")
        rec = dict(split=name, torch_threads=tthreads, optc_threads=othreads, batch=batch, fwd_bwd_ms=fbm,
                   modes={})
        for k, ts in times.items():
            med = statistics.median(ts)
            ratio = statistics.median(a / b for a, b in zip(ts, base))
            fb_k = statistics.median(a for a, _ in parts[k])
            st_k = statistics.median(b for _, b in parts[k])
            stats = getattr(runs[k][1], "in_backward_stats", None)
            print(f"  {k:22s} {med:8.1f} {min(ts):7.1f} {max(ts):7.1f} {ratio:8.3f}x {fb_k:8.1f} {st_k:9.1f}"
                  + (f"   in the backward: {stats['stepped_in_backward']} of "
                     f"{stats['stepped_in_backward'] + stats['stepped_after']} params" if stats else ""))
            rec["modes"][k] = dict(ms=med, ms_min=min(ts), ms_max=max(ts), rounds_ms=ts, vs_after=ratio,
                                   fwd_bwd_ms=fb_k, step_call_ms=st_k, in_backward_stats=stats)
        out["runs"].append(rec)
        batch = args.batch or batch
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
        os.replace(tmp, args.json)
        print(f"\nwrote {args.json}")
    return 0


def _choose_batch(torch, otorch, model, width, vocab, dtype, share, othreads):
    """The largest batch (a power of two) whose serial iteration
    leaves the step at least `share` of it; the smallest when none does."""
    o = otorch.AdamW(model.parameters(), lr=1e-4, threads=othreads)
    chosen = 1
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        x = inputs(torch, b, width, vocab, dtype)
        got = []
        for _ in range(3):
            t0 = time.perf_counter()
            model(x).float().square().mean().backward()
            t1 = time.perf_counter()
            o.step()
            t2 = time.perf_counter()
            o.zero_grad()
            got.append((t2 - t1) / (t2 - t0))
        if sorted(got)[1] < share:
            break
        chosen = b
    return chosen


def parallel_probe(torch, reps=40):
    """How this machine runs two threads of independent work at once: the time
    of two threads each doing `reps` in-cache matmuls, over one thread's. 1.0
    on two real cores; near 2 where the two share one (SMT, or a VM's quota).
    Overlapping the step with the backward can gain only where this is
    well below 2."""
    import threading
    a = torch.randn(640, 640)  # 1.6 MB: in a core's L2; ~0.5 GFLOP a call, so the GIL is not what is timed

    def work():
        for _ in range(reps):
            torch.mm(a, a)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        work()
        t0 = time.perf_counter()
        work()
        one = time.perf_counter() - t0
        ts = [threading.Thread(target=work) for _ in range(2)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        two = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    return two / one


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
