"""python -m optc.bench: optc's AdamW step against torch's, in one process,
on the same tensors.

The workload is Llama 4 Scout's tensor mix (torchtune's layout, 627
tensors, as `optc bench optimizer` takes it from runtime/model/inventory.c),
scaled so that params, grads and AdamW's two states fill --gib GiB (default
1: no cache holds it). Params ~ U(-1, 1), grads ~ U(-0.01, 0.01).

Six cases: fp32 and bf16 (params, grads and states), each plain, with
torchtune's scale_grads_ (grads *= world_size / num_tokens) in front of the
step (the Scout recipe: clip_grad_norm null), and with scale_grads_ and
clip_grad_norm_(max_norm=1.0). Competitors:

  torch for-loop     torch.optim.AdamW(foreach=False)   (the CPU default)
  torch foreach      foreach=True
  torch fused        fused=True
  torch.compile      torch.compile(opt.step), as torchtune's
                     compile.optimizer_step does it (its compile on a line
                     of its own)
  optc               optc.torch.AdamW(...).fused_step(grad_scale, max_norm):
                     the for-loop's bits
  optc fused         the same with fused=True: torch fused=True's bits
  deepspeed          DeepSpeed's DeepSpeedCPUAdam (adamw_mode, its AVX-512
                     or AVX2 C++ step; its cpu_adam op is built with ninja
                     at first use, ~40 s, then cached): its states are
                     always fp32, so in bf16 it moves 22 B an element
  optc fp32 states   optc.torch.AdamW with its states made fp32 before the
                     first step (bf16 only): DeepSpeed's layout

torch's scale and clip run eagerly around its step, as in torchtune's
recipe; optc's run inside its step. GB/s counts the traffic model's bytes
(optc_step_bytes_per_element of optc's program, times the elements) for
every competitor: the same useful work. The ceiling is an in-place update
a += s*b (torch, f64, 24 B/element) over as many bytes as the step's
buffers.

The competitors run in turns: each case is --warmup + --reps rounds, and a
round times the ceiling once and every competitor's step once, in an order
that rotates from round to round. A machine whose memory bandwidth drifts
(a shared VM's moves by half between one minute and the next) moves every
figure of a round together, so the ratios are taken within rounds: a
speed-up is the median over rounds of one step's time over the other's,
and % ceiling the median of the step's GB/s over the ceiling's in the same
round. Times are the median, fastest and slowest over the rounds; every
competitor's optimizer (its states: half of --gib) stays alive until all
three cases have run. optc's
first step (its states' allocation, its compile with the disk cache off,
and the step) is reported too.

--lowbit adds, after the dtypes' cases, quantized states against bf16
ones, bf16 params and grads, in turns as above (competitors: LOWBIT):

  torch fused bf16   torch.optim.AdamW(fused=True), bf16 states: the
                     reference of the "x fused" column
  optc bf16          optc.torch.AdamW, bf16 states
  optc 8-bit/4-bit   optc.torch.AdamW8bit/AdamW4bit
  torchao 8-bit/4-bit  torchao.optim.AdamW8bit/AdamW4bit (each param's
                     step compiled by torch.compile, one graph a shape)

on the mix with each tensor of at least 4096 elements rounded to a
multiple of 256 elements, the one shape torchao (and optc, which follows
it) quantizes: scaled_mix's own sizes are never multiples of the block,
so no state of the plain mix is quantized. State bytes count every
tensor in opt.state (codes, scales, torchao's per-state code book,
plain states, steps). Each competitor's first step and the peaks run in
a fresh process (--lowbit-probe) whose torch.compile cache
(TORCHINDUCTOR_CACHE_DIR) and optc kernel cache (XDG_CACHE_HOME) are
fresh, empty directories: the first step includes torchao's compile and
optc's. A peak is the growth of the process's resident set over a step:
VmHWM, reset through /proc/self/clear_refs, less VmRSS before the step,
with glibc's mmap threshold fixed (MALLOC_MMAP_THRESHOLD_=65536) so that
a freed temporary leaves the resident set rather than staying in the heap
for the next step to reuse unseen.
"""
import argparse
import functools
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


# ---- Scout's tensor mix (runtime/model/inventory.c, torchtune's layout) -------------------------------

SCOUT = dict(vocab_size=202048, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, head_dim=128,
             hidden_dim=8192, shared_hidden_dim=8192, num_experts=16, use_shared_expert=True)


def scout_tensors(m=SCOUT):
    """(name, shape) of every parameter in torchtune's layout, in order."""
    D, V, E, H, Hs = m["embed_dim"], m["vocab_size"], m["num_experts"], m["hidden_dim"], m["shared_hidden_dim"]
    q, kv = m["num_heads"] * m["head_dim"], m["num_kv_heads"] * m["head_dim"]
    out = [("tok_embeddings.weight", (V, D))]
    for layer in range(m["num_layers"]):
        parts = [("sa_norm.scale", (D,)), ("attn.q_proj.weight", (q, D)), ("attn.k_proj.weight", (kv, D)),
                 ("attn.v_proj.weight", (kv, D)), ("attn.output_proj.weight", (D, q)), ("mlp_norm.scale", (D,)),
                 ("mlp.router.gate.weight", (E, D)), ("mlp.experts.gate_proj", (E, D, H)),
                 ("mlp.experts.down_proj", (E, H, D)), ("mlp.experts.up_proj", (E, D, H)),
                 ("mlp.shared_expert.w1.weight", (Hs, D)), ("mlp.shared_expert.w2.weight", (D, Hs)),
                 ("mlp.shared_expert.w3.weight", (Hs, D))]
        for part, shape in parts:
            if not m["use_shared_expert"] and "shared_expert" in part:
                continue
            out.append((f"layers.{layer}.{part}", shape))
    out.append(("norm.scale", (D,)))
    out.append(("output.weight", (V, D)))
    return out


def scaled_mix(n):
    """The mix's sizes scaled to about n elements in all, each at least 1
    (bench.c's scaled_mix: llround of numel * n / total)."""
    numels = [math.prod(s) for _, s in scout_tensors()]
    total = float(sum(numels))
    return [max(1, int(math.floor(k * n / total + 0.5))) for k in numels]


# ---- timing -------------------------------------------------------------------------------------

class Ceiling:
    """In-place a += s*b in f64 over nbytes of a and b: once() is the
    faster of two updates' GB/s (24 B/element, STREAM's count; STREAM takes
    the best of its runs)."""

    def __init__(self, torch, nbytes):
        self.n = max(1, nbytes // 16)
        self.a = torch.empty(self.n, dtype=torch.float64).uniform_()
        self.b = torch.empty(self.n, dtype=torch.float64).uniform_()
        self.a.add_(self.b, alpha=1e-9)  # its pages touched

    def once(self):
        best = math.inf
        for _ in range(2):
            t0 = time.perf_counter()
            self.a.add_(self.b, alpha=1e-9)
            best = min(best, time.perf_counter() - t0)
        return 24 * self.n / best / 1e9


def in_turns(steps, ceiling, rounds, warmup, before):
    """steps: {name: fn}. Runs warmup + rounds rounds; a round times
    ceiling() once and each step once (before() untimed ahead of each), the
    steps in an order rotated by one each round. Returns ({name: [ms]},
    [ceiling GB/s]) of the timed rounds, index r being round r's."""
    names = list(steps)
    times, ceil = {k: [] for k in names}, []
    for r in range(warmup + rounds):
        g = ceiling()
        got = {}
        for k in names[r % len(names):] + names[:r % len(names)]:
            before()
            t0 = time.perf_counter()
            steps[k]()
            got[k] = (time.perf_counter() - t0) * 1e3
        if r >= warmup:
            ceil.append(g)
            for k in names:
                times[k].append(got[k])
    return times, ceil


def _eager_then(scale_and_clip, clip, step):
    import torch
    with torch.no_grad():
        scale_and_clip(clip)
    step()


def deepspeed_bits(torch, otorch, dname, hyper, n=1 << 20):
    """How DeepSpeedCPUAdam's update differs from torch.optim.AdamW
    (foreach=False) and optc's, over one step of n elements from the same
    params, grads and (zero) states: {name: (elements that differ, most
    ulps apart)}. In bf16 DeepSpeed keeps fp32 states, so its bf16 params
    differ from torch's by design there."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
    gen = torch.Generator().manual_seed(7)
    p0 = torch.empty(n).uniform_(-1, 1, generator=gen).to(dt)
    g0 = torch.empty(n).uniform_(-0.01, 0.01, generator=gen).to(dt)
    out = {}
    for name in ("torch", "deepspeed", "optc"):
        p = torch.nn.Parameter(p0.clone())
        p.grad = g0.clone()
        o = (torch.optim.AdamW([p], **hyper, foreach=False) if name == "torch" else
             DeepSpeedCPUAdam([p], **hyper, adamw_mode=True) if name == "deepspeed" else
             otorch.AdamW([p], **hyper))
        for _ in range(2):
            o.step()
        out[name] = p.detach()
    wide = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dt]
    res = {}
    for a, b in (("deepspeed", "torch"), ("optc", "torch")):
        x, y = out[a].view(wide).long(), out[b].view(wide).long()
        d = (x - y).abs()
        res[f"{a} vs {b}"] = (int((d != 0).sum()), int(d.max()))
    return res


def summary(ms):
    return dict(ms=statistics.median(ms), ms_min=min(ms), ms_max=max(ms), reps=len(ms))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---- the run ------------------------------------------------------------------------------------

COMPETITORS = ["for-loop", "foreach", "fused", "compile", "deepspeed", "optc", "optc-fused", "optc-f32states"]
LABELS = {"for-loop": "torch for-loop", "foreach": "torch foreach", "fused": "torch fused=True",
          "compile": "torch.compile(step)", "deepspeed": "DeepSpeedCPUAdam", "optc": "optc fused_step",
          "optc-fused": "optc fused=True", "optc-f32states": "optc fp32 states"}
OPTC = ("optc", "optc-fused", "optc-f32states")
CASES = {"plain": "", "scale": " + scale_grads", "scale+clip": " + scale_grads + clip_grad_norm"}


def bench_dtype(torch, otorch, capi, dname, args, comps, hyper, out):
    """One dtype's three cases (CASES: plain, scale_grads, scale_grads and clip) over
    every competitor, on one set of tensors: printed, and appended to
    out["cases"]."""
    world_size, num_tokens, max_norm = 1, torch.tensor(4096), 1.0
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
    esize = torch.empty(0, dtype=dt).element_size()
    n = int(args.gib * (1 << 30)) // (4 * esize) + 1  # p, g, exp_avg, exp_avg_sq
    sizes = scaled_mix(n)
    total = sum(sizes)
    gen = torch.Generator().manual_seed(12345)
    params = [torch.empty(k, dtype=torch.float32).uniform_(-1, 1, generator=gen).to(dt) for k in sizes]
    grads = [torch.empty(k, dtype=torch.float32).uniform_(-0.01, 0.01, generator=gen).to(dt) for k in sizes]
    saved = [g.clone() for g in grads]
    params = [torch.nn.Parameter(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    buf_bytes = total * 4 * esize
    print(f"\n{dname}: {total:,} elements in {len(sizes)} tensors, {buf_bytes / (1 << 30):.2f} GiB of params, "
          f"grads and states")
    ceiling = Ceiling(torch, buf_bytes)

    def restore():
        torch._foreach_copy_(grads, saved)

    def scale_and_clip(clip):
        # torchtune's recipe: scale_grads_(model, world_size / num_tokens), then clip_grad_norm_
        torch._foreach_mul_(grads, world_size / num_tokens)
        if clip:
            torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)

    steps = {}  # competitor -> case -> its step
    first = {}
    bpe = {}
    keep = []  # the optimizers, alive until every case has run
    comps = [c for c in comps if not (c == "optc-f32states" and dname == "fp32")]  # the same as optc there
    for comp in comps:
        gc.collect()
        if comp in OPTC:
            t0 = time.perf_counter()
            built0 = capi.step_new_seconds
            opt = otorch.AdamW(params, **hyper, fused=comp == "optc-fused")
            if comp == "optc-f32states":
                for p in params:
                    opt.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p, dtype=torch.float32),
                                        exp_avg_sq=torch.zeros_like(p, dtype=torch.float32))
            with torch.no_grad():
                opt.fused_step()
            first[comp, "plain"] = dict(ms=(time.perf_counter() - t0) * 1e3,
                                        compile_ms=(capi.step_new_seconds - built0) * 1e3)
            steps[comp] = {"plain": opt.fused_step,
                     "scale": functools.partial(opt.fused_step, grad_scale=world_size / num_tokens),
                     "scale+clip": functools.partial(opt.fused_step, grad_scale=world_size / num_tokens,
                                                     max_norm=max_norm)}
            for c in ("scale", "scale+clip"):  # their first steps: the compile of a layout with clip or not
                restore()
                built0 = capi.step_new_seconds
                t0 = time.perf_counter()
                steps[comp][c]()
                first[comp, c] = dict(ms=(time.perf_counter() - t0) * 1e3,
                                      compile_ms=(capi.step_new_seconds - built0) * 1e3)
            for c in CASES if comp == "optc" else ():  # the traffic model of the step: the dtype's own layout
                clip = capi.OPTC_CLIP_NORM if c == "scale+clip" else capi.OPTC_CLIP_NONE
                bpe[c] = opt._optc_programs[next(k for k in opt._optc_programs if k[1] == clip)].bytes_per_element
            keep.append(opt)
            continue
        if comp == "deepspeed":
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            opt = DeepSpeedCPUAdam(params, **hyper, adamw_mode=True)
            step = opt.step
            steps[comp] = {"plain": step, "scale": functools.partial(_eager_then, scale_and_clip, False, step),
                           "scale+clip": functools.partial(_eager_then, scale_and_clip, True, step)}
            keep.append(opt)
            continue
        # torchtune's config says fused: False and leaves foreach to torch (the for-loop on the CPU)
        kw = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True),
              "compile": dict(fused=False)}[comp]
        opt = torch.optim.AdamW(params, **hyper, **kw)
        step = opt.step
        if comp == "compile":
            print("  torch.compile(opt.step): compiling (minutes for 627 tensors on a few cores; --no-compile "
                  "leaves it out)")
            step = torch.compile(opt.step)
            t0 = time.perf_counter()
            step()
            out["compile_s"][dname] = time.perf_counter() - t0
            print(f"  torch.compile(opt.step): first call (its compile) {out['compile_s'][dname]:.1f} s")
            restore()

        def with_scale(step=step, clip=False):
            with torch.no_grad():
                scale_and_clip(clip)
            step()

        steps[comp] = {"plain": step, "scale": with_scale, "scale+clip": functools.partial(with_scale, clip=True)}
        keep.append(opt)

    for c in CASES:
        name = dname + CASES[c]
        clip = c == "scale+clip"
        ms, ceils = in_turns({comp: steps[comp][c] for comp in comps}, ceiling.once, args.reps, args.warmup, restore)
        step_gb = bpe[c] * total / 1e9
        mine = [c for c in OPTC if c in comps]  # the speed-up columns: optc's time over the competitor's
        ceil = statistics.median(ceils)
        print(f"\n  {name}: traffic model {bpe[c]} B/element "
              f"({'two passes' if clip else 'one pass'}), {step_gb:.2f} GB a step; the competitors in turns, "
              f"{args.reps} rounds")
        print(f"  in-place ceiling (a += s*b, f64, the faster of two a round): median {ceil:.1f} GB/s "
              f"({min(ceils):.1f}-{max(ceils):.1f})")
        print(f"  {'':22s} {'ms/step':>9s} {'min':>8s} {'max':>8s} {'GB/s':>7s} {'% ceiling':>9s} "
              + "".join(f"{'vs ' + LABELS[o]:>21s}" for o in mine))
        first0 = first[mine[0], c]
        case = dict(dtype=dname, case=c, scale=c != "plain", clip=clip, elements=total, tensors=len(sizes),
                    buffer_bytes=buf_bytes, bytes_per_element=bpe[c], ceiling_gbs=ceil,
                    ceiling_gbs_min=min(ceils), ceiling_gbs_max=max(ceils), ceiling_rounds_gbs=ceils, results={},
                    optc_first_step_ms=first0["ms"], optc_compile_ms=first0["compile_ms"])
        for comp in comps:
            r = summary(ms[comp])
            gbs = step_gb / (r["ms"] * 1e-3)
            pct = statistics.median(100 * step_gb / (t * 1e-3) / g for t, g in zip(ms[comp], ceils))
            speed = {o: statistics.median(t / u for t, u in zip(ms[comp], ms[o])) for o in mine if o != comp}
            case["results"][comp] = dict(r, rounds_ms=ms[comp], gbs=gbs, pct_ceiling=pct,
                                         optc_speedup=speed.get("optc"), optc_fused_speedup=speed.get("optc-fused"),
                                         optc_f32states_speedup=speed.get("optc-f32states"))
            sp = "".join(f"{f'{speed[o]:.2f}x' if o in speed else '':>21s}" for o in mine)
            print(f"  {LABELS[comp]:22s} {r['ms']:9.1f} {r['ms_min']:8.1f} {r['ms_max']:8.1f} {gbs:7.1f} "
                  f"{pct:8.0f}% {sp}")
        for o in mine:
            f = first[o, c]
            print(f"  {LABELS[o]}'s first step: {f['ms']:.1f} ms"
                  f"{' (allocating the states)' if c == 'plain' else ''}, of which compiling "
                  f"{f['compile_ms']:.1f} ms{' (disk cache off)' if not args.warm_cache else ''}")
        out["cases"].append(case)
    if "deepspeed" in comps:
        bits = deepspeed_bits(torch, otorch, dname, hyper)
        out.setdefault("deepspeed_bits", {})[dname] = bits
        for k, (nd, ulp) in bits.items():
            print(f"  {dname} bits, two steps over 1M elements, {k}: {nd:,} elements differ"
                  f"{f', at most {ulp} ulp' if nd else ''}")
    del keep, steps, ceiling
    if "compile" in comps:
        torch._dynamo.reset()


# ---- low-bit states (--lowbit) -------------------------------------------------------------------

LOWBIT = ["fused-bf16", "optc-bf16", "optc-8bit", "optc-4bit", "torchao-8bit", "torchao-4bit"]
LOWBIT_LABELS = {"fused-bf16": "torch fused bf16", "optc-bf16": "optc bf16", "optc-8bit": "optc 8-bit",
                 "optc-4bit": "optc 4-bit", "torchao-8bit": "torchao 8-bit", "torchao-4bit": "torchao 4-bit"}
LOWBIT_THRESHOLD = 4096  # torchao quantizes a tensor of at least this many elements ...
LOWBIT_BLOCK = 256  # ... that are a multiple of its block (8-bit's; 4-bit's 128 divides it)


def lowbit_sizes(gib):
    """bench_dtype's bf16 mix (params, grads and two bf16 states fill gib
    GiB), each tensor of at least LOWBIT_THRESHOLD elements rounded to the
    nearest multiple of LOWBIT_BLOCK: the tensors torchao quantizes."""
    n = int(gib * (1 << 30)) // 8 + 1
    B = LOWBIT_BLOCK
    return [(k + B // 2) // B * B if k >= LOWBIT_THRESHOLD else k for k in scaled_mix(n)]


def lowbit_params(torch, sizes):
    """bf16 params ~ U(-1, 1), each with a bf16 grad ~ U(-0.01, 0.01), made one
    at a time (no f32 copy of the whole mix raises the resident set's peak)."""
    gen = torch.Generator().manual_seed(12345)
    params = []
    for k in sizes:
        p = torch.nn.Parameter(torch.empty(k).uniform_(-1, 1, generator=gen).to(torch.bfloat16))
        p.grad = torch.empty(k).uniform_(-0.01, 0.01, generator=gen).to(torch.bfloat16)
        params.append(p)
    return params


def lowbit_optimizer(torch, otorch, comp, params, hyper):
    if comp == "fused-bf16":
        return torch.optim.AdamW(params, **hyper, fused=True)
    if comp == "optc-bf16":
        return otorch.AdamW(params, **hyper)
    if comp in ("optc-8bit", "optc-4bit"):
        return (otorch.AdamW8bit if comp == "optc-8bit" else otorch.AdamW4bit)(params, **hyper)
    import torchao.optim
    return (torchao.optim.AdamW8bit if comp == "torchao-8bit" else torchao.optim.AdamW4bit)(params, **hyper)


def state_bytes(torch, opt):
    """Bytes of the storage behind every tensor of opt.state, each storage
    once: a quantized state's codes and scale (and torchao's qmap), a plain
    state, each param's step."""
    seen = {}
    for st in opt.state.values():
        for v in st.values():
            parts = [getattr(v, a) for a in ("codes", "scale", "qmap") if torch.is_tensor(getattr(v, a, None))]
            for t in parts or ([v] if torch.is_tensor(v) else []):
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _vm(field):
    """/proc/self/status's field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _peak_growth(fn):
    """(seconds fn() took, how far the resident set rose above where it
    was before fn(): VmHWM, reset first, less VmRSS)."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to VmRSS (Linux 4.0)
    rss = _vm("VmRSS")
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return dt, _vm("VmHWM") - rss


def lowbit_probe(torch, otorch, comp, gib, hyper):
    """One competitor in this (fresh) process: its first step (states, any
    compile, the step), then a steady step (the third): times, peaks and
    state bytes."""
    params = lowbit_params(torch, lowbit_sizes(gib))
    opt = lowbit_optimizer(torch, otorch, comp, params, hyper)
    first_s, first_peak = _peak_growth(opt.step)
    opt.step()
    step_s, step_peak = _peak_growth(opt.step)
    return dict(first_step_ms=first_s * 1e3, first_step_peak_bytes=first_peak, probe_step_ms=step_s * 1e3,
                step_peak_bytes=step_peak, state_bytes=state_bytes(torch, opt))


def _probe_in_fresh_process(comp, gib, threads, tmp):
    """lowbit_probe in a new python with empty torch.compile and optc caches
    under tmp/comp: its result, and the inductor cache it filled."""
    import optc
    inductor = os.path.join(tmp, comp, "inductor")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor, XDG_CACHE_HOME=os.path.join(tmp, comp, "xdg"),
               MALLOC_MMAP_THRESHOLD_="65536")
    env.pop("OPTC_CACHE", None)  # optc's disk cache on, and empty
    root = os.path.dirname(os.path.dirname(os.path.abspath(optc.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "optc.bench", "--lowbit-probe", comp, "--gib", repr(gib), "--threads", str(threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), inductor


def bench_lowbit(torch, otorch, args, comps, hyper, out):
    """LOWBIT's competitors on bf16 params: each one's first step and peaks
    in a fresh process, then their steady steps here in turns; printed and
    put in out["lowbit"]."""
    sizes = lowbit_sizes(args.gib)
    total = sum(sizes)
    quantized = sum(k for k in sizes if k >= LOWBIT_THRESHOLD)
    threads = torch.get_num_threads()
    print(f"\nlow-bit states, bf16 params and grads: {total:,} elements in {len(sizes)} tensors (the mix, each tensor "
          f"of >= {LOWBIT_THRESHOLD} elements rounded to a multiple of {LOWBIT_BLOCK}: {100 * quantized / total:.1f}% "
          f"of the elements in quantizable tensors, {len(set(sizes))} distinct sizes)")
    res = {}
    old_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="optc-bench-lowbit-") as tmp:
        inductor = {}
        for comp in comps:
            t0 = time.perf_counter()
            res[comp], inductor[comp] = _probe_in_fresh_process(comp, args.gib, threads, tmp)
            print(f"  {LOWBIT_LABELS[comp]}: first step in a fresh process {res[comp]['first_step_ms']:.1f} ms "
                  f"(the process: {time.perf_counter() - t0:.1f} s)")
        params = lowbit_params(torch, sizes)
        ceiling = Ceiling(torch, total * 8)
        steps, keep = {}, []
        for comp in comps:
            gc.collect()
            if comp.startswith("torchao"):  # its probe's inductor cache: a shorter compile here
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor[comp]
            opt = lowbit_optimizer(torch, otorch, comp, params, hyper)
            opt.step()
            res[comp]["state_bytes_here"] = state_bytes(torch, opt)
            steps[comp] = opt.step
            keep.append(opt)
        ms, ceils = in_turns(steps, ceiling.once, args.reps, args.warmup, lambda: None)
        del keep, steps, ceiling, params
        torch._dynamo.reset()
        if old_cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_cache
    mib = 1 << 20
    print(f"  in turns, {args.reps} rounds (ceiling median {statistics.median(ceils):.1f} GB/s); 'x fused': the "
          f"median over rounds of the step's time over torch fused bf16's. First step and peaks: a fresh process a "
          f"competitor, torch.compile's (TORCHINDUCTOR_CACHE_DIR) and optc's (XDG_CACHE_HOME) disk caches cold; a peak "
          f"is the resident set's growth over the step (VmHWM less VmRSS before), the first step's including its "
          f"states and compile")
    print(f"  {'':18s} {'ms/step':>9s} {'min':>8s} {'max':>8s} {'x fused':>8s} {'state B/param':>13s} "
          f"{'step peak MiB':>13s} {'first step ms':>13s} {'first peak MiB':>14s}")
    for comp in comps:
        r = res[comp]
        r.update(summary(ms[comp]), rounds_ms=ms[comp], label=LOWBIT_LABELS[comp],
                 x_fused=statistics.median(t / u for t, u in zip(ms[comp], ms["fused-bf16"])),
                 state_bytes_per_param=r["state_bytes"] / total)
        print(f"  {r['label']:18s} {r['ms']:9.1f} {r['ms_min']:8.1f} {r['ms_max']:8.1f} {r['x_fused']:7.2f}x "
              f"{r['state_bytes_per_param']:13.3f} {r['step_peak_bytes'] / mib:13.1f} {r['first_step_ms']:13.1f} "
              f"{r['first_step_peak_bytes'] / mib:14.1f}")
    out["lowbit"] = dict(
        dtype="bf16", elements=total, tensors=len(sizes), quantizable_elements=quantized, sizes_rounded_to=LOWBIT_BLOCK,
        threshold=LOWBIT_THRESHOLD, reps=args.reps, ceiling_gbs=statistics.median(ceils), ceiling_rounds_gbs=ceils,
        x_fused="median over rounds of ms / fused-bf16's ms",
        first_step="a fresh python process per competitor; TORCHINDUCTOR_CACHE_DIR and XDG_CACHE_HOME (optc's kernel "
                   "cache, OPTC_CACHE unset) fresh empty directories; includes the states' allocation and any compile",
        peak="resident set growth over the step in that process: VmHWM (reset via /proc/self/clear_refs) less VmRSS "
             "before; MALLOC_MMAP_THRESHOLD_=65536; step_peak over its third step, first_step_peak over its first",
        state="bytes of every storage in opt.state (codes, scales, torchao's qmap, plain states, steps) over elements",
        results=res)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m optc.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of params, grads and states (default 1)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per competitor (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="fp32,bf16 (default both)")
    ap.add_argument("--competitors", default=",".join(COMPETITORS),
                    help="a comma list of " + ", ".join(COMPETITORS) + " (default all)")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile (its compile is slow)")
    ap.add_argument("--threads", type=int, default=None, help="torch's (and optc's) threads (default torch's)")
    ap.add_argument("--warm-cache", action="store_true",
                    help="let optc's first step use its disk cache (default: first step compiles cold)")
    ap.add_argument("--lowbit", nargs="?", const=",".join(LOWBIT), metavar="LIST",
                    help="also quantized states against bf16 ones: a comma list of " + ", ".join(LOWBIT) +
                         " (default all; fused-bf16 always)")
    ap.add_argument("--lowbit-probe", choices=LOWBIT, help=argparse.SUPPRESS)  # --lowbit's fresh process
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    hyper = dict(lr=2e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if args.lowbit_probe:
        import torch
        import optc.torch as otorch
        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(lowbit_probe(torch, otorch, args.lowbit_probe, args.gib, hyper)))
        return 0
    sys.stdout.reconfigure(line_buffering=True)  # progress shows as it runs, also into a file
    comps = [c for c in args.competitors.split(",") if c]
    for c in comps:
        if c not in COMPETITORS:
            ap.error(f"unknown competitor {c!r}; expected {', '.join(COMPETITORS)}")
    if args.no_compile and "compile" in comps:
        comps.remove("compile")
    if "optc" not in comps:
        comps.append("optc")
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in ("fp32", "bf16"):
            ap.error(f"unknown dtype {d!r}; expected fp32 or bf16")
    lowbit = [c for c in (args.lowbit or "").split(",") if c]
    for c in lowbit:
        if c not in LOWBIT:
            ap.error(f"unknown low-bit competitor {c!r}; expected {', '.join(LOWBIT)}")
    if lowbit and "fused-bf16" not in lowbit:
        lowbit.insert(0, "fused-bf16")
    if args.reps < 1 or args.warmup < 0 or args.gib <= 0:
        ap.error("--reps >= 1, --warmup >= 0, --gib > 0")
    if not args.warm_cache:
        os.environ["OPTC_CACHE"] = "0"  # read by liboptc when it compiles

    import torch
    import optc
    import optc._capi as capi
    import optc.torch as otorch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    machine = dict(cpu=cpu_model(), threads=threads, torch=torch.__version__, optc=optc.library_version,
                   torch_cpu_capability=torch.backends.cpu.get_cpu_capability(), python=platform.python_version())
    print(f"python -m optc.bench: AdamW over Llama 4 Scout's tensor mix, {args.gib:g} GiB of buffers; "
          f"{threads} thread{'s' * (threads != 1)} on {machine['cpu']}")
    print(f"  torch {torch.__version__} ({machine['torch_cpu_capability']}), optc {optc.library_version}")
    out = dict(machine=machine, gib=args.gib, reps=args.reps, warmup=args.warmup, cases=[], compile_s={})

    for dname in dtypes:
        bench_dtype(torch, otorch, capi, dname, args, comps, hyper, out)
        gc.collect()
    if lowbit:
        bench_lowbit(torch, otorch, args, lowbit, hyper, out)

    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        os.replace(tmp, args.json)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
