#!/usr/bin/env python3
"""gpu_torch.py: torch's optimizer step on optc's GPU workload, for bench/gpu_check.sh.

  gpu_torch.py bench [--params N] [--layouts fp32,bf16] [--reps N] [--json FILE]
                     [--device cuda] [--no-compile]
  gpu_torch.py report FILE

bench times, on the same parameters as bench/gpu_bench.c (its tensor mix and
value formula, so the very same values), one step of

    scale_grads                  torch._foreach_mul_(grads, scaler)
    clip_grad_norm_(max_norm=1)  foreach=True
    torch.optim.AdamW(lr=1e-3)   foreach=True | fused=True | the foreach step under torch.compile

plus the device-to-device copy bandwidth (the ceiling), and appends JSON lines
to FILE. The scaler is 1.0 here and 1/num_tokens in optc's step, whose grads
are num_tokens times larger: both steps see the same scaled grads every time
(torch's scale_grads writes them back; a scaler of 1 keeps them unchanged, and
the work is the same).

report prints the table: per layout, each variant's median ms, GB/s counted
with optc's traffic model (bytes per element x parameters: the least the step
can move, the same yardstick for every variant), % of the copy ceiling, and
optc's speed-up over it.
"""
import argparse
import gc
import json
import statistics
import sys
import time

MIX = [16777216, 4194304, 4194304, 4096, 58720256, 58720256, 4096, 1048576]


def tensor_sizes(n):
    """gpu_bench.c's tensor mix: MIX in turn until n elements, the last cut."""
    sizes, k = [], 0
    while n > 0:
        s = min(n, MIX[k % len(MIX)])
        sizes.append(s)
        n -= s
        k += 1
    return sizes


def values(torch, n, device, dtype, scale):
    """u(i) = ((i * 2654435761) mod 2^32) / 2^32 * 2 - 1, as gpu_bench.c: double -> float -> dtype."""
    i = torch.arange(n, device=device, dtype=torch.int64)
    u = ((i * 2654435761) % 4294967296).double() / 4294967296.0 * 2 - 1
    return (u * scale).float().to(dtype)


def timed(torch, fn, reps, device, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_ceiling(torch, device, nbytes, reps):
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    ms = timed(torch, lambda: b.copy_(a), reps, device)
    del a, b
    return 2.0 * nbytes / (ms * 1e6)


def free(torch, device):
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def bench(args):
    import torch

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_torch.py: torch sees no CUDA device")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    out = open(args.json, "a") if args.json else None

    def emit(rec):
        rec.update(device=name, torch=torch.__version__, params=args.params)
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    copy = copy_ceiling(torch, device, min(args.params * 4, 4 << 30), max(args.reps, 5))
    emit({"variant": "copy", "copy_GBps": copy})
    sizes = tensor_sizes(args.params)
    variants = [("torch foreach", dict(foreach=True), False), ("torch fused", dict(fused=True), False)]
    if not args.no_compile:
        variants.append(("torch.compile", dict(foreach=True), True))  # last: compiling takes longest
    for vname, kw, compiled in variants:
        for layout in args.layouts.split(","):
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[layout]
            try:
                params, grads = [], []
                for n in sizes:
                    p = torch.nn.Parameter(values(torch, n, device, dtype, 1.0))
                    p.grad = values(torch, n, device, dtype, 1e-3)
                    params.append(p)
                    grads.append(p.grad)
                opt = torch.optim.AdamW(params, lr=1e-3, **kw)
                scaler = 1.0

                def step():
                    torch._foreach_mul_(grads, scaler)
                    torch.nn.utils.clip_grad_norm_(params, max_norm=1.0, foreach=True)
                    opt.step()

                rec = {"variant": vname, "layout": layout, "tensors": len(sizes)}
                fn = step
                if compiled:
                    fn = torch.compile(step, fullgraph=False)
                    t0 = time.perf_counter()
                    fn()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    rec["compile_s"] = time.perf_counter() - t0
                rec["ms"] = timed(torch, fn, args.reps, device)
                emit(rec)
            except Exception as e:  # one variant failing (OOM, a compile error) is reported, not fatal
                emit({"variant": vname, "layout": layout, "error": "%s: %s" % (type(e).__name__, e)})
            finally:
                params = grads = opt = fn = None
                if compiled:
                    torch._dynamo.reset()
                free(torch, device)


def report(path):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    copies = [r["copy_GBps"] for r in rows if r.get("variant") == "copy" and r.get("copy_GBps")]
    optc = {r["layout"]: r for r in rows if r.get("variant") == "optc"}
    if not optc:
        sys.exit("gpu_torch.py report: no optc results in %s" % path)
    dev = next(iter(optc.values())).get("device", "?")
    print("device: %s" % dev)
    ceiling_note = []
    hdr = "%-6s %-22s %10s %9s %8s %12s" % ("layout", "variant", "ms", "GB/s", "% copy", "optc speedup")
    print(hdr)
    print("-" * len(hdr))
    for layout, o in optc.items():
        ceiling = max(copies + [o.get("copy_GBps", 0)]) or float("nan")
        nbytes = o["bytes_per_element"] * o["params"]
        base = o["ms"]

        def line(name, ms, extra=""):
            gbs = nbytes / (ms * 1e6)
            speed = "" if name.startswith("optc") else "%.2fx" % (ms / base)
            print("%-6s %-22s %10.3f %9.0f %7.1f%% %12s%s" % (layout, name, ms, gbs, 100 * gbs / ceiling, speed, extra))

        line("optc step (wall)", o["ms"])
        line("optc kernels only", o["kernel_ms"])
        for r in rows:
            if r.get("layout") != layout or r.get("variant") in ("optc", "copy"):
                continue
            if "error" in r:
                print("%-6s %-22s %s" % (layout, r["variant"], r["error"][:80]))
                continue
            extra = "   (compile %.1f s)" % r["compile_s"] if "compile_s" in r else ""
            line(r["variant"], r["ms"], extra)
        ceiling_note.append("%s: %d bytes/element x %d params; copy ceiling %.0f GB/s" %
                            (layout, o["bytes_per_element"], o["params"], ceiling))
        print("        optc compile: %.1f ms cold (emit + NVRTC), %.2f ms from the disk cache" %
              (o["compile_ms"], o["cache_hit_ms"]))
    for n in ceiling_note:
        print(n)
    print("GB/s counts optc's traffic model (the least the step can move) for every variant; the speed-up is over "
          "optc's wall-clock step (host work and synchronisation included).")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--params", type=lambda s: int(float(s)), default=1 << 30)
    b.add_argument("--layouts", default="fp32,bf16")
    b.add_argument("--reps", type=int, default=10)
    b.add_argument("--json")
    b.add_argument("--device", default="cuda")
    b.add_argument("--no-compile", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("file")
    args = ap.parse_args()
    if args.cmd == "bench":
        bench(args)
    else:
        report(args.file)


if __name__ == "__main__":
    main()
