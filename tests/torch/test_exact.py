"""optc exec against torch.optim itself, byte for byte.

Random cases, drawn from a fixed seed: an optimizer and its options,
hyperparameters, a dtype, tensor shapes (sizes whose ends fall in torch's
vector tails, and tensors big enough that torch splits them over its
threads), torch's thread count, torchtune's scale_grads and clip_grad_norm_,
and the for-loop (foreach=False) or the fused=True kernel. Each case runs
>= 5 steps with fresh grads every step: torch steps its optimizer; optc
runs `optc exec` once per step, each step's OUT (params, states, step) fed
back as the next IN with the new grads. Params and every state must be the
same bytes.

Where torch clips, its total norm (an f32 sum in torch's own order) is given
to optc (grad_norm_given), so the coefficient and the step are torch's; the
norm itself is compared to optc's to 1e-5 relative.
"""
import os
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import run, sqrt_marks

N_CASES = int(os.environ.get("OPTC_EXACT_CASES", "48"))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FUSED = {"AdamW", "Adam", "SGD", "Adagrad"}
SIZES = [1, 7, 16, 33, 100, 1000, 4099, (33, 5), (3, 4, 5), (41, 37), (70001,), (300, 130)]


def draw_hyper(rng, name, dtype):
    eps_lo = 1e-4 if dtype == "fp16" else 1e-9  # fp16 has no 1e-8: avoid 0/0
    if name in ("AdamW", "Adam"):
        kw = dict(lr=rng.choice([1e-3, 3e-4, 2e-3, 0.0]), betas=(rng.choice([0.9, 0.8, 0.3]), rng.choice([0.999, 0.95])),
                  eps=max(eps_lo, rng.choice([1e-8, 1e-6])), weight_decay=rng.choice([0.0, 0.01, 0.1]),
                  amsgrad=rng.random() < 0.3, maximize=rng.random() < 0.2)
    elif name == "SGD":
        m = rng.choice([0.0, 0.9, 0.5])
        nesterov = m > 0 and rng.random() < 0.4
        kw = dict(lr=rng.choice([0.1, 0.01, 0.05]), momentum=m, dampening=0.0 if nesterov else rng.choice([0.0, 0.1]),
                  weight_decay=rng.choice([0.0, 1e-3, 0.01]), nesterov=nesterov, maximize=rng.random() < 0.2)
    elif name == "Adagrad":
        kw = dict(lr=rng.choice([0.01, 0.05]), lr_decay=rng.choice([0.0, 1e-3]), weight_decay=rng.choice([0.0, 0.01]),
                  initial_accumulator_value=rng.choice([0.0, 0.1]), eps=max(eps_lo, 1e-10), maximize=rng.random() < 0.2)
    else:  # RMSprop
        kw = dict(lr=rng.choice([0.01, 1e-3]), alpha=rng.choice([0.99, 0.9]), eps=max(eps_lo, 1e-8),
                  weight_decay=rng.choice([0.0, 0.01]), momentum=rng.choice([0.0, 0.9]),
                  centered=rng.random() < 0.4, maximize=rng.random() < 0.2)
    return kw


def draw_cases(n):
    rng = random.Random(20261201)
    cases = []
    for i in range(n):
        name = rng.choice(["AdamW", "AdamW", "Adam", "SGD", "Adagrad", "RMSprop"])
        dtype = rng.choice(["fp32", "fp32", "bf16", "bf16", "fp16"])
        fused = name in FUSED and rng.random() < 0.35
        shapes = rng.sample(SIZES, rng.randint(1, 4))
        cases.append(dict(
            id=f"{i:02d}-{name}-{dtype}{'-fused' if fused else ''}", name=name, dtype=dtype, fused=fused,
            hyper=draw_hyper(rng, name, dtype), shapes=[s if isinstance(s, tuple) else (s,) for s in shapes],
            threads=rng.choice([1, 2]), steps=rng.choice([5, 6]), seed=rng.randrange(1 << 30),
            num_tokens=rng.choice([None, None, 7, 37]), clip=rng.choice([None, None, 1.0, 0.5])))
    return cases


def yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(repr(float(x)) for x in v) + "]"
    return repr(v)


def recipe(case, torch_cpu):
    lines = ["optimizer:", f"  _component_: torch.optim.{case['name']}"]
    lines += [f"  {k}: {yaml_value(v)}" for k, v in case["hyper"].items()]
    if case["fused"]:
        lines.append("  fused: true")
    lines.append(f"dtype: {case['dtype']}")
    lines.append(f"torch_cpu: {torch_cpu}")
    if case["clip"] is not None:
        lines.append(f"clip_grad_norm: {case['clip']}")
    return "\n".join(lines) + "\n"


def make_torch_optimizer(case, params):
    cls = getattr(torch.optim, case["name"])
    impl = dict(fused=True) if case["fused"] else dict(foreach=False)
    return cls(params, **case["hyper"], **impl)


def same_bytes(a, b):
    """Every element the same bits (a NaN equals any NaN: payloads are not promised)."""
    ia = a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32)
    ib = b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32)
    diff = (ia != ib) & ~(torch.isnan(a) & torch.isnan(b))
    return int(diff.sum()), diff.nonzero()[:3].flatten().tolist()


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"], marks=sqrt_marks(c["name"], c["dtype"], c["fused"]))
                                  for c in draw_cases(N_CASES)])
def test_exec_equals_torch(case, optc_bin, torch_cpu, tmp_path):
    dt = DTYPES[case["dtype"]]
    torch.set_num_threads(case["threads"])
    g = torch.Generator().manual_seed(case["seed"])
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(dt)) for s in case["shapes"]]
    names = [f"p{i}" for i in range(len(params))]
    state = {n: p.detach().clone() for n, p in zip(names, params)}
    opt = make_torch_optimizer(case, params)
    (tmp_path / "r.yaml").write_text(recipe(case, torch_cpu))
    ir = run([optc_bin, str(tmp_path / "r.yaml"), "--dump-ir"]).stdout
    for step in range(case["steps"]):
        grads = [(torch.randn(p.shape, generator=g) * 0.1 * 10 ** torch.empty(p.shape).uniform_(-1, 1, generator=g))
                 .to(dt) for p in params]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        sets = []
        if "%torch_threads =" in ir:
            sets += ["--set", f"torch_threads={case['threads']}"]
        with torch.no_grad():
            if case["num_tokens"] is not None:  # torchtune's scale_grads_
                scaler = 1 / torch.tensor(case["num_tokens"])
                torch._foreach_mul_([p.grad for p in params], scaler)
                sets += ["--set", f"num_tokens={case['num_tokens']}"]
            if case["clip"] is not None:
                norm = torch.nn.utils.clip_grad_norm_(params, max_norm=case["clip"])
                sets += ["--set", f"grad_norm_given={norm.item()!r}"]
        opt.step()
        for n, gr in zip(names, grads):
            state[n + ".grad"] = gr
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "in.st"))
        run([optc_bin, "exec", str(tmp_path / "r.yaml"), "--in", str(tmp_path / "in.st"), "--out",
             str(tmp_path / "out.st"), "--backend", "cpu"] + sets)
        state = load_file(str(tmp_path / "out.st"))
    bad = []
    for n, p in zip(names, params):
        cmp = [(n, p.detach())] + [(f"{n}.{k}", v) for k, v in opt.state[p].items()
                                  if torch.is_tensor(v) and v.dim() > 0]
        for key, want in cmp:
            assert key in state, f"optc's OUT has no {key}"
            nd, where = same_bytes(want, state[key])
            if nd:
                bad.append(f"{key}: {nd} of {want.numel()} elements differ, first at {where}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("fused", [False, True], ids=["forloop", "fused"])
@pytest.mark.parametrize("cpu", [None, "haswell"], ids=["host", "haswell"])
@pytest.mark.parametrize("start,beta2", [(0, 0.999), (2933, 0.999), (0, 0.95)])
def test_table_equals_torch(start, beta2, cpu, fused, optc_bin, torch_cpu, tmp_path):
    """bf16 AdamW on a call large enough (one thread, 5 x 65536 + 37 elements)
    that optc's compiled for-loop step, on AVX-512, computes the denominator
    (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps, every op rounded) once
    for each of the 65536 bit patterns of exp_avg_sq and looks it up
    (emit_llvm.c, tab_find). exp_avg_sq starts as every bit pattern, 5 times
    (NaNs, Infs, negatives and subnormals included); 3 steps, from step 1
    and from step 2934 (where a multiply by 1/bias_correction2_sqrt would not
    round as the divide): torch's bytes. Also with fused=True's bits, and
    with the code for haswell (OPTC_CPU), which widens bf16 in lane_elem's
    order and stores NaNs from the packed words (emit_llvm.c, perm_find):
    on AVX2 every store of every NaN and Inf; and rounds the for-loop's
    holds of one op on one bf16 half up where none of the 65536 inputs
    rounds a tie (emit_llvm.c, tie_find): with beta2 0.999 none does, with
    0.95 exp_avg_sq * beta2 does on 3062 patterns, which exp_avg_sq holds."""
    n = 5 * 65536 + 37  # and a tail: a masked vector, and fused=True's scalar remainder
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(20261203 + start)
    p = torch.nn.Parameter(torch.randn(n, generator=g).to(torch.bfloat16))
    hyper = dict(lr=1e-3, betas=(0.9, beta2), eps=1e-8, weight_decay=0.01)
    opt = torch.optim.AdamW([p], **(dict(fused=True) if fused else dict(foreach=False)), **hyper)
    exp_avg = (torch.randn(n, generator=g) * 1e-2).to(torch.bfloat16)
    exp_avg_sq = (torch.arange(n, dtype=torch.int32) % 65536).to(torch.int16).view(torch.bfloat16)
    opt.state[p] = {"step": torch.tensor(float(start)), "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
    state = {"p": p.detach().clone(), "p.exp_avg": exp_avg, "p.exp_avg_sq": exp_avg_sq,
             "p.step": torch.tensor(float(start))}
    case = dict(name="AdamW", hyper=hyper, fused=fused, dtype="bf16", clip=None)
    (tmp_path / "r.yaml").write_text(recipe(case, torch_cpu))
    env = dict(os.environ, OPTC_CPU=cpu) if cpu else None
    for _ in range(3):
        grad = (torch.randn(n, generator=g) * 1e-2).to(torch.bfloat16)
        p.grad = grad.clone()
        opt.step()
        state["p.grad"] = grad
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "in.st"))
        run([optc_bin, "exec", str(tmp_path / "r.yaml"), "--in", str(tmp_path / "in.st"), "--out",
             str(tmp_path / "out.st"), "--backend", "cpu", "--threads", "1"], env=env)
        state = load_file(str(tmp_path / "out.st"))
    bad = []
    for key, want in [("p", p.detach()), ("p.exp_avg", opt.state[p]["exp_avg"]),
                      ("p.exp_avg_sq", opt.state[p]["exp_avg_sq"])]:
        nd, where = same_bytes(want, state[key])
        if nd:
            bad.append(f"{key}: {nd} of {want.numel()} elements differ, first at {where}")
    assert not bad, "\n".join(bad)
