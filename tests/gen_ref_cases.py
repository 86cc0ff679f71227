#!/usr/bin/env python3
"""Generate tests/ref_cases.h: torch's own bits, for test_ref_optim.c.

Run from the repository root (needs torch; nothing else):

    .venv/bin/python tests/gen_ref_cases.py

It rewrites tests/ref_cases.h and nothing else. test_ref_optim.c runs the C
reference (ref_optim.c) on the same inputs and must give these bits exactly
(any NaN matches any NaN); it never imports torch.

What each case does:

  * Parameters: one param group of tensors of 1, 29 and 70 elements (the
    big case: 33001 and 29), in the case's dtype: 29 and 70 end in the
    16-bit for-loop's scalar tails (the last size % 32 elements of each of
    torch's loop ranges) and in the fused kernels' scalar remainders
    (numel % 8, % 16 for 16-bit); 33001 elements are two loop ranges at 2
    threads, each with its own tail.
  * Inputs: not stored. Both sides draw them from draw() below (splitmix64;
    test_ref_optim.c has the same function): 24-bit values times a power of
    two, exact in f32, rounded to the dtype (round to nearest even, as
    Tensor.to and ref_store do). Every step has fresh grads, as a new
    backward gives them: p.grad = grads of that step, then the prelude, then
    optimizer.step(). Cases with `specials` put NaN, +-inf, +-0 and an f32
    subnormal into the grads of the second tensor.
  * Prelude, torchtune's order: scale_grads (p.grad *= world_size /
    torch.tensor(num_tokens), an int64 tensor: a 0-dim f32 scale), then
    torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False). The
    total norm torch returned at each step is stored: the reference is given
    it (RefRun.grad_norm), since torch's f32 sum order is its own.
  * Optimizers: torch.optim.X(foreach=False), or fused=True; Lion is not in
    torch: its bits are torch running lion-pytorch's update_fn op by op
    (tests/golden/gen_golden.py's Lion, verbatim), as optc.Lion promises.
  * Mixed dtypes (states in another dtype than the params): made as
    tests/golden/gen_golden.py makes them (states_before, states_after).
  * torch's thread count is 2 (torch.set_num_threads), and RefRun.threads
    says so. The for-loop's f32 sqrt is MKL's where torch dispatched to
    AVX512 here (RefRun.sqrt REF_SQRT_MKL, for the cases that take one: the
    test skips them on a CPU without AVX-512F, as ref_run reports -2).

ref_cases.h holds, per case, every hyperparameter torch ran with (its param
group), how torch ran, the norms, and the expected params and states after
the first and the last step (the last only for the big case; recorded()),
as hex strings of the stored bit patterns (8 digits per f32, 4 per bf16/f16
value): for each such step, for each tensor, the param, then each state in
ref_state_name's order. test_ref_optim.c defines RefCase before it includes
the header. Also torch's defaults (inspect.signature)
and its f32 -> bf16/f16 conversions of some edge values. The output is a
pure function of this file and torch's arithmetic.
"""

import inspect
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "golden"))
from gen_golden import Lion, make_optimizer, states_after, states_before  # noqa: E402

OUT = os.path.join(HERE, "ref_cases.h")
THREADS = 2
SIZES = [1, 29, 70]
BIG = [33001, 29]
M64 = (1 << 64) - 1

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
REF_DTYPES = {"fp32": "REF_F32", "bf16": "REF_BF16", "fp16": "REF_F16"}
KINDS = {"torch.optim.AdamW": "REF_ADAMW", "torch.optim.Adam": "REF_ADAM", "torch.optim.SGD": "REF_SGD",
         "optc.Lion": "REF_LION", "torch.optim.Adagrad": "REF_ADAGRAD", "torch.optim.RMSprop": "REF_RMSPROP"}
TAKES_SQRT = {"torch.optim.AdamW", "torch.optim.Adam", "torch.optim.Adagrad", "torch.optim.RMSprop"}

ADAMW, ADAM, SGD = "torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD"
LION, ADAGRAD, RMSPROP = "optc.Lion", "torch.optim.Adagrad", "torch.optim.RMSprop"


def C(name, comp, dtype="fp32", **kw):
    """A case: name, component, dtype, then the optimizer's kwargs and, prefixed
    by an underscore, how to run it: _sdt, _fused, _steps, _clip, _tokens,
    _world, _grad_log2 (grads are below 2^this), _specials, _big."""
    run = {k[1:]: v for k, v in kw.items() if k.startswith("_")}
    opt = {k: v for k, v in kw.items() if not k.startswith("_")}
    return dict(name=name, component=comp, dtype=dtype, kwargs=opt, **run)


AMS = dict(lr=2e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True, maximize=True)
ADAM_LO = dict(lr=1e-2, betas=(0.3, 0.9), weight_decay=0.05, amsgrad=True)  # 1 - beta1 >= 0.5: lerp's other form
SGD_MOM = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)
SGD_NES = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True)
ADAGRAD_FULL = dict(lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1, eps=1e-8)
RMS_MOM = dict(lr=0.01, alpha=0.9, weight_decay=0.01, momentum=0.5)
RMS_CEN = dict(lr=0.01, alpha=0.95, centered=True, maximize=True)
RMS_ALL = dict(lr=2e-3, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.9, centered=True)
LION_WD = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
F16_EPS = 1e-4  # fp16 has no 1e-8: eps 1e-4 keeps Adam and RMSprop away from 0/0

CASES = [
    # the for-loop, in each dtype
    C("adamw", ADAMW, lr=1e-3, weight_decay=0.01, _steps=5),
    C("adamw_bf16", ADAMW, "bf16", lr=1e-3, weight_decay=0.01, _steps=5),
    C("adamw_fp16", ADAMW, "fp16", lr=1e-3, weight_decay=0.01, eps=F16_EPS),
    C("adamw_amsgrad_maximize_specials", ADAMW, **AMS, _specials=True),
    C("adamw_amsgrad_maximize_bf16", ADAMW, "bf16", **AMS),
    C("adam_lerp_hi_amsgrad_wd", ADAM, **ADAM_LO),
    C("adam_lerp_hi_amsgrad_wd_bf16", ADAM, "bf16", **ADAM_LO),
    C("adam_lerp_hi_amsgrad_wd_fp16", ADAM, "fp16", **dict(ADAM_LO, eps=F16_EPS)),
    C("adam_maximize_specials_bf16", ADAM, "bf16", lr=1e-3, maximize=True, _specials=True),
    C("sgd", SGD, lr=0.1),
    C("sgd_bf16", SGD, "bf16", lr=0.1),
    C("sgd_fp16", SGD, "fp16", lr=0.1),
    C("sgd_momentum", SGD, **SGD_MOM, _steps=4),
    C("sgd_momentum_bf16", SGD, "bf16", **SGD_MOM, _steps=4),
    C("sgd_momentum_fp16", SGD, "fp16", **SGD_MOM, _steps=4),
    C("sgd_nesterov", SGD, **SGD_NES),
    C("sgd_nesterov_bf16", SGD, "bf16", **SGD_NES),
    C("sgd_nesterov_fp16", SGD, "fp16", **SGD_NES),
    C("adagrad", ADAGRAD, lr=0.05),
    C("adagrad_full", ADAGRAD, **ADAGRAD_FULL),
    C("adagrad_full_bf16", ADAGRAD, "bf16", **ADAGRAD_FULL),
    C("adagrad_full_fp16", ADAGRAD, "fp16", **ADAGRAD_FULL),
    C("rmsprop", RMSPROP, lr=5e-3, alpha=0.9, eps=1e-6),
    C("rmsprop_bf16", RMSPROP, "bf16", lr=5e-3, alpha=0.9, eps=1e-6),
    C("rmsprop_fp16", RMSPROP, "fp16", lr=5e-3, alpha=0.9, eps=F16_EPS),
    C("rmsprop_momentum", RMSPROP, **RMS_MOM),
    C("rmsprop_momentum_bf16", RMSPROP, "bf16", **RMS_MOM),
    C("rmsprop_centered_maximize", RMSPROP, **RMS_CEN),
    C("rmsprop_centered_maximize_bf16", RMSPROP, "bf16", **RMS_CEN),
    C("rmsprop_centered_momentum_wd", RMSPROP, **RMS_ALL),
    C("rmsprop_centered_momentum_wd_bf16", RMSPROP, "bf16", **RMS_ALL),
    C("rmsprop_centered_momentum_wd_fp16", RMSPROP, "fp16", **dict(RMS_ALL, eps=F16_EPS)),
    C("lion", LION, **LION_WD),
    C("lion_bf16", LION, "bf16", **LION_WD),
    C("lion_fp16", LION, "fp16", **LION_WD),
    # torch's fused=True kernels
    C("adamw_fused", ADAMW, lr=1e-3, weight_decay=0.01, _fused=True, _steps=5),
    C("adamw_fused_bf16", ADAMW, "bf16", lr=1e-3, weight_decay=0.01, _fused=True),
    C("adamw_fused_fp16", ADAMW, "fp16", lr=1e-3, weight_decay=0.01, eps=F16_EPS, _fused=True),
    C("adamw_fused_amsgrad_maximize_specials", ADAMW, **AMS, _fused=True, _specials=True),
    C("adam_fused_lerp_hi_amsgrad_wd", ADAM, **ADAM_LO, _fused=True),
    C("adam_fused_lerp_hi_amsgrad_wd_bf16", ADAM, "bf16", **ADAM_LO, _fused=True),
    C("sgd_fused_momentum", SGD, **SGD_MOM, _fused=True, _steps=4),
    C("sgd_fused_momentum_fp16", SGD, "fp16", **SGD_MOM, _fused=True, _steps=4),
    C("sgd_fused_nesterov", SGD, **SGD_NES, _fused=True),
    C("sgd_fused_nesterov_bf16", SGD, "bf16", **SGD_NES, _fused=True),
    C("adagrad_fused_full", ADAGRAD, **ADAGRAD_FULL, _fused=True),
    C("adagrad_fused_full_bf16", ADAGRAD, "bf16", **ADAGRAD_FULL, _fused=True),
    C("adagrad_fused_full_fp16", ADAGRAD, "fp16", **ADAGRAD_FULL, _fused=True),
    # torchtune's prelude: scale_grads, then clip_grad_norm_ with clipping active
    C("adamw_scaled_clip", ADAMW, lr=1e-3, weight_decay=0.01, _tokens=37, _world=2, _clip=0.05, _grad_log2=0),
    C("adamw_scaled_clip_bf16", ADAMW, "bf16", lr=1e-3, weight_decay=0.01, _tokens=37, _world=2, _clip=0.05,
      _grad_log2=0),
    C("adamw_fused_scaled_clip", ADAMW, lr=1e-3, weight_decay=0.01, _fused=True, _tokens=7, _clip=0.2,
      _grad_log2=0),
    C("sgd_nesterov_scaled_clip_bf16", SGD, "bf16", **SGD_NES, _tokens=11, _world=2, _clip=0.1, _grad_log2=0),
    C("rmsprop_clip_fp16", RMSPROP, "fp16", lr=5e-3, alpha=0.9, eps=F16_EPS, _clip=1.0, _grad_log2=0),
    C("adagrad_fused_clip_bf16", ADAGRAD, "bf16", **ADAGRAD_FULL, _fused=True, _clip=1.0, _grad_log2=0),
    # states in f32 with 16-bit params, and in bf16 with f32 params (AdamW, Adam
    # and centered RMSprop cannot run so: torch's lerp_ refuses mixed dtypes;
    # nor can the fused kernels)
    C("sgd_momentum_bf16_fp32states", SGD, "bf16", **SGD_MOM, _sdt="fp32", _steps=4),
    C("sgd_nesterov_bf16_fp32states", SGD, "bf16", **SGD_NES, _sdt="fp32", _steps=4),
    C("sgd_nesterov_scaled_clip_fp16_fp32states", SGD, "fp16", **SGD_NES, _sdt="fp32", _tokens=11, _clip=0.1,
      _grad_log2=0),
    C("adagrad_full_bf16_fp32states", ADAGRAD, "bf16", **ADAGRAD_FULL, _sdt="fp32"),
    C("rmsprop_momentum_bf16_fp32states", RMSPROP, "bf16", **RMS_MOM, _sdt="fp32"),
    C("lion_bf16_fp32states", LION, "bf16", **LION_WD, _sdt="fp32"),
    C("sgd_momentum_fp32_bf16states", SGD, **SGD_MOM, _sdt="bf16", _steps=4),
    C("adagrad_full_fp32_bf16states", ADAGRAD, **ADAGRAD_FULL, _sdt="bf16"),
    C("rmsprop_momentum_fp32_bf16states", RMSPROP, **dict(RMS_MOM, eps=1e-6), _sdt="bf16"),
    C("lion_fp32_bf16states", LION, **LION_WD, _sdt="bf16"),
    # two of torch's loop ranges in one tensor, each with its own 16-bit tail
    C("sgd_wd_maximize_bf16_two_ranges", SGD, "bf16", lr=0.1, weight_decay=0.01, maximize=True, _big=True),
]

STATES = {  # ref_state_name's order
    ADAMW: lambda kw: ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if kw.get("amsgrad") else []),
    ADAM: lambda kw: ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if kw.get("amsgrad") else []),
    SGD: lambda kw: ["momentum_buffer"] if kw.get("momentum", 0) != 0 else [],
    LION: lambda kw: ["exp_avg"],
    ADAGRAD: lambda kw: ["sum"],
    RMSPROP: lambda kw: (["square_avg"] + (["momentum_buffer"] if kw.get("momentum", 0) > 0 else [])
                         + (["grad_avg"] if kw.get("centered") else [])),
}


# ---------------------------------------------------------------- inputs

def mix64(x):
    """splitmix64's output function on x + the golden gamma."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def draw(seed, tensor, what, i, top_log2):
    """Input element i of a tensor: what 0 is the param, 1 + s step s's grad.
    A 24-bit signed integer over 2^23, times 2^(top_log2 - e) with e in 0..3:
    in [-2^top_log2, 2^top_log2), exact in f32 (and in a Python float)."""
    u = mix64((seed << 40) ^ (tensor << 36) ^ (what << 32) ^ i)
    mant = (u >> 40) - (1 << 23)
    e = (u >> 8) & 3
    return math.ldexp(mant, top_log2 - e - 23)


# test_ref_optim.c has the same table
SPECIALS = {3: math.nan, 5: math.inf, 6: -math.inf, 7: -0.0, 8: 0.0, 9: math.ldexp(1.0, -130)}


def inputs(idx, case, sizes):
    grad_log2 = case.get("grad_log2", -3)
    steps = case.get("steps", 3)
    params, grads = [], []
    for t, n in enumerate(sizes):
        params.append([draw(idx, t, 0, i, 1) for i in range(n)])
        gs = []
        for s in range(steps):
            g = [draw(idx, t, 1 + s, i, grad_log2) for i in range(n)]
            if case.get("specials") and t == 1:
                for i, v in SPECIALS.items():
                    g[i] = v
            gs.append(g)
        grads.append(gs)
    return params, grads


# ---------------------------------------------------------------- running

def run_case(idx, case):
    dt = TORCH_DTYPES[case["dtype"]]
    sdt = TORCH_DTYPES[case.get("sdt", case["dtype"])]
    sizes = BIG if case.get("big") else SIZES
    steps = case.get("steps", 3)
    pv, gv = inputs(idx, case, sizes)
    params = [torch.nn.Parameter(torch.tensor(v, dtype=torch.float32).to(dt)) for v in pv]
    opt = make_optimizer(dict(case, kwargs=dict(case["kwargs"])), params)
    if sdt != dt:
        states_before(case, opt, params, sdt)
    names = STATES[case["component"]](case["kwargs"])
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}  # every hyperparameter torch runs with
    norms, expect = [], []
    for s in range(steps):
        for p, g in zip(params, gv):
            p.grad = torch.tensor(g[s], dtype=torch.float32).to(dt)
        with torch.no_grad():
            if case.get("tokens") is not None:
                scaler = case.get("world", 1) / torch.tensor(case["tokens"])
                assert scaler.dtype == torch.float32 and scaler.dim() == 0
                for p in params:
                    p.grad *= scaler
        if case.get("clip") is not None:
            total = torch.nn.utils.clip_grad_norm_(params, max_norm=case["clip"], foreach=False)
            assert total.item() > case["clip"], (case["name"], total.item())  # clipping active
            norms.append(total.item())
        opt.step()
        if sdt != dt:
            states_after(opt, params, sdt)
        if not recorded(case, s + 1, steps):
            continue
        for p in params:
            st = opt.state[p]
            assert sorted(k for k in st if k != "step") == sorted(names), (case["name"], list(st))
            bufs = [p.detach()] + [st[k] for k in names]
            for k, b in zip(["param"] + names, bufs):
                assert b.dtype == (dt if k == "param" else sdt) and b.shape == p.shape, (case["name"], k)
            expect.append([hexbits(b) for b in bufs])
    return sizes, steps, norms, expect, group


def recorded(case, step, steps):
    """The steps whose results are stored: the first and the last (the last
    only for the big case). test_ref_optim.c follows the same rule."""
    return step == steps or (step == 1 and not case.get("big"))


def hexbits(t):
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.float32:
        return "".join("%08x" % (v & 0xFFFFFFFF) for v in t.view(torch.int32).tolist())
    return "".join("%04x" % (v & 0xFFFF) for v in t.view(torch.int16).tolist())


# ---------------------------------------------------------------- the header

def c_double(v):
    r = repr(float(v))
    return r if any(ch in r for ch in ".en") else r + ".0"


def c_hyper(case, kw):
    f = [f".kind = {KINDS[case['component']]}"]
    for k in ("lr", "eps", "weight_decay", "momentum", "dampening", "alpha", "lr_decay",
              "initial_accumulator_value"):
        if k in kw:
            f.append(f".{k} = {c_double(kw[k])}")
    if "betas" in kw:
        f.append(f".beta1 = {c_double(kw['betas'][0])}, .beta2 = {c_double(kw['betas'][1])}")
    for k in ("amsgrad", "maximize", "nesterov", "centered"):
        if kw.get(k):
            f.append(f".{k} = 1")
    return "{" + ", ".join(f) + "}"


def c_string(hexs, indent):
    """A hex string as C literals of at most 96 digits a line."""
    if not hexs:
        return '""'
    return ("\n" + indent).join('"%s"' % hexs[i:i + 96] for i in range(0, len(hexs), 96))


def torch_defaults():
    out = {}
    for comp, cls in ((ADAMW, torch.optim.AdamW), (ADAM, torch.optim.Adam), (SGD, torch.optim.SGD),
                      (ADAGRAD, torch.optim.Adagrad), (RMSPROP, torch.optim.RMSprop), (LION, Lion)):
        sig = inspect.signature(cls.__init__).parameters
        d = {k: v.default for k, v in sig.items() if v.default is not inspect.Parameter.empty}
        if isinstance(d.get("lr"), torch.Tensor):
            d["lr"] = d["lr"].item()
        out[comp] = d
    return out


def c_defaults(comp, d):
    kw = {k: d[k] for k in ("lr", "eps", "weight_decay", "momentum", "dampening", "alpha", "lr_decay",
                            "initial_accumulator_value", "betas", "amsgrad", "maximize", "nesterov",
                            "centered") if k in d and d[k] is not None}
    return c_hyper(dict(component=comp), kw)


ROUND_INPUTS = [1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-23, 1.0 + 2**-8 - 2**-23, -(1.0 + 3 * 2**-8),
                1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-11 + 2**-23, 65504.0, 65519.99609375, 65520.0,
                3.4028234663852886e38, 3.3895313892515355e38, math.inf, -math.inf, -0.0, 0.0,
                math.ldexp(1, -149), math.ldexp(3, -134), math.ldexp(1, -133), math.ldexp(1, -24),
                math.ldexp(1, -25), math.ldexp(3, -26), math.ldexp(1, -14) - math.ldexp(1, -25), 0.1, -2.5e-5,
                1e-8, 1e-6, 0.999]


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(THREADS)
    assert torch.get_num_threads() == THREADS
    from optc.torch import torch_cpu  # torch's own sqrt decides, not its CPU capability
    mkl = torch_cpu() == "avx512"
    names = [c["name"] for c in CASES]
    assert len(set(names)) == len(names)
    w = []
    w.append("/* ref_cases.h: torch's own bits for test_ref_optim.c. Generated by")
    w.append(" * tests/gen_ref_cases.py (see there for what each case does); do not edit.")
    w.append(f" * torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()},"
             f" {THREADS} threads. */")
    w.append("")
    w.append(f'#define REF_CASES_TORCH "{torch.__version__}"')
    w.append(f"#define REF_CASES_THREADS {THREADS}")
    w.append("")
    w.append("/* torch's defaults (inspect.signature; Lion: lion-pytorch's), in RefOptim order */")
    w.append("static const RefHyper ref_case_defaults[] = {")
    dfl = torch_defaults()
    for comp in (ADAMW, ADAM, SGD, LION, ADAGRAD, RMSPROP):
        w.append(f"    {c_defaults(comp, dfl[comp])},")
    w.append("};")
    w.append("")
    w.append("/* f32 bits; Tensor.to(torch.bfloat16) and .to(torch.float16) of them; that f16 .float() */")
    w.append("static const uint32_t ref_case_rounding[][4] = {")
    for v in ROUND_INPUTS:
        t = torch.tensor([v], dtype=torch.float32)
        f = t.view(torch.int32).item() & 0xFFFFFFFF
        b = t.to(torch.bfloat16).view(torch.int16).item() & 0xFFFF
        h = t.to(torch.float16).view(torch.int16).item() & 0xFFFF
        hw = t.to(torch.float16).float().view(torch.int32).item() & 0xFFFFFFFF
        w.append(f"    {{0x{f:08x}, 0x{b:04x}, 0x{h:04x}, 0x{hw:08x}}},")
    w.append("};")
    w.append("")
    total = 0
    bodies = []
    for idx, case in enumerate(CASES):
        sizes, steps, norms, expect, group = run_case(idx, case)
        var = f"expect_{idx}"
        lines = [f"static const char *const {var}[] = {{ /* {case['name']} */"]
        for bufs in expect:
            for hx in bufs:
                lines.append("    " + c_string(hx, "    ") + ",")
                total += len(hx)
        lines.append("};")
        bodies.append("\n".join(lines))
        sdt = case.get("sdt", case["dtype"])
        sqrt = "REF_SQRT_MKL" if (mkl and not case.get("fused") and case["component"] in TAKES_SQRT
                                  and sdt == "fp32") else "REF_SQRT_IEEE"
        norm_s = "{" + ", ".join(repr(n) for n in norms) + "}" if norms else "{0}"
        case["_c"] = (f'    {{"{case["name"]}",\n     {c_hyper(case, group)},\n'
                      f'     {REF_DTYPES[case["dtype"]]}, {REF_DTYPES[sdt]}, {int(bool(case.get("fused")))},'
                      f' {sqrt}, {c_double(case.get("tokens", 1))}, {c_double(case.get("world", 1))},'
                      f' {c_double(case.get("clip", 0))}, {norm_s},\n'
                      f'     {steps}, {int(not case.get("big"))}, {len(sizes)}, {{{", ".join(map(str, sizes))}}},'
                      f' {idx}, {case.get("grad_log2", -3)}, {int(bool(case.get("specials")))}, {var}}},')
    w.extend(bodies)
    w.append("")
    w.append("static const RefCase ref_cases[] = {")
    for case in CASES:
        w.append(case["_c"])
    w.append("};")
    with open(OUT, "w") as f:
        f.write("\n".join(w) + "\n")
    print(f"wrote {len(CASES)} cases, {total} hex digits, to {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
