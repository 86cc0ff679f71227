#!/usr/bin/env python3
"""Generate optc's golden files: torch.optim's own numbers, for the C test suite.

Run from the repository root (needs torch; nothing else):

    python3 tests/golden/gen_golden.py

It rewrites, for every case below,

    tests/golden/<case>/recipe.yaml          the optc recipe (torchtune-shaped YAML)
    tests/golden/<case>/in.safetensors       NAME (param) and NAME.grad, float32
    tests/golden/<case>/expected.safetensors NAME (param after the steps), NAME.<state>
                                             for each state torch keeps, and NAME.step
    tests/golden/cases.txt                   "<case> <steps> <NAME=VALUE,... for --set, or ->"

and nothing else. The test suite never imports torch: it runs `optc exec` on
recipe.yaml + in.safetensors for <steps> steps and compares with expected.

What each case does, as torchtune's training loop does it:

  * Parameters: 5 tensors named vec [7], one [1], mat [33, 5], cube [3, 4, 5]
    and wide [41, 37] (adamw_clip also has a 0-element tensor `empty` [0]), in
    the case's dtype (fp32 unless it says bf16 or fp16): sizes whose ends fall
    in torch's scalar tails (every 32 elements for 16-bit for-loops, every 8
    or 16 for the fused kernels).
    Params ~ randn, grads ~ randn * grad_scale (0.1 unless the case says
    otherwise), drawn from a torch.Generator seeded per case (fixed seeds).
  * Every step starts from the SAME grads, as a fresh backward would produce
    them: p.grad = grad.clone(), then the prelude, then optimizer.step().
  * Prelude (only where the case asks for it), in torchtune's order:
      scale_grads: scaler = world_size / torch.tensor(num_tokens) (an int64
                   tensor, as torchtune's token count is; the division gives a
                   float32 0-dim tensor), then p.grad *= scaler for every param;
                   world_size = 1. The extra arg `num_tokens=N` in cases.txt.
      clip:        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False);
                   the recipe has `clip_grad_norm: <max_norm>`. torch's total norm
                   is an f32 sum whose order is torch's own, so cases.txt gives
                   it to optc (grad_norm_given=...); the coefficient and the
                   clipped grads are then torch's, bit for bit.
  * Optimizers: torch.optim.* with foreach=False (the single-tensor path), or
    fused=True where the case says fused (the recipe then says fused: True),
    and optc.Lion implemented below exactly as lion-pytorch's update_fn.
  * The CPU: torch's bits depend on it (its f32 sqrt is MKL's, which on an
    AVX-512 CPU is not IEEE). The recipes say `torch_cpu: avx512` or `avx2`,
    whichever torch dispatched to here, so optc reproduces these files on any
    CPU.
  * Optimizer states start as torch initialises them (in.safetensors holds none).
  * States in another dtype than the params (state_dtype; optc's
    optimizer_state_dtype), which torch never makes itself: each state torch
    would create is made in that dtype, with torch's initial value, before
    the first step (RMSprop, Lion; Adagrad's sum, made at construction, is
    remade), and torch then runs its ops on tensors of mixed dtypes, promoting
    them as it does. SGD's momentum_buffer is grad.clone() on the first step,
    in the grad's dtype, as torch makes it; it is converted to the state dtype
    after that step (it holds the clone exactly), before the next. AdamW and
    Adam cannot run so: torch's lerp_ refuses an f32 exp_avg with a bf16
    grad, and so does RMSprop's centered grad_avg.

expected.safetensors:
  * NAME: the param after the steps.
  * NAME.<state>: every tensor state torch keeps for the configuration, under
    its state_dict name (exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer,
    sum, square_avg, grad_avg); states torch does not create are absent.
  * NAME.step: float32 scalar (shape []). Adam, AdamW, Adagrad and RMSprop keep
    it as a float32 0-dim tensor; SGD and Lion keep none, and the file then
    holds the number of steps taken.
  * __metadata__: {"generator": "tests/golden/gen_golden.py", "torch": <version>}.

The safetensors files are written by the small writer below (no dependency on
the safetensors package): 8-byte little-endian header length, a JSON header
padded with spaces to a multiple of 8, then the raw little-endian data, tensors
in sorted name order. The output is a pure function of the case table, the
seeds and torch's arithmetic: re-running gives byte-identical files.
"""

import json
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = "tests/golden/gen_golden.py"

SHAPES = [("vec", [7]), ("one", [1]), ("mat", [33, 5]), ("cube", [3, 4, 5]), ("wide", [41, 37])]
EMPTY = ("empty", [0])

# Each case: name, torch component, kwargs (written to the recipe verbatim, in
# this order, and passed to the optimizer; what is omitted takes torch's
# default), and optionally steps, clip (max_norm), num_tokens, grad_scale,
# empty (add the 0-element param), dtype (fp32, bf16, fp16), state_dtype (the
# states' dtype when it is not dtype) and fused. New cases go at the end: a
# case's seed is its index.
CASES = [
    # AdamW with torch's defaults (lr 1e-3, weight_decay 0.01); betas and eps
    # are left out of the recipe so optc's defaults are checked against torch's.
    dict(name="adamw", component="torch.optim.AdamW",
         kwargs=dict(lr=1e-3, weight_decay=0.01)),
    dict(name="adamw_amsgrad", component="torch.optim.AdamW",
         kwargs=dict(lr=2e-3, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.05, amsgrad=True)),
    dict(name="adamw_maximize", component="torch.optim.AdamW",
         kwargs=dict(lr=5e-3, betas=[0.85, 0.99], weight_decay=0.1, maximize=True)),
    dict(name="adamw_5steps", component="torch.optim.AdamW", steps=5,
         kwargs=dict(lr=1e-2, betas=[0.9, 0.98], eps=1e-7, weight_decay=0.02)),
    dict(name="adam", component="torch.optim.Adam",
         kwargs=dict(lr=3e-3, betas=[0.8, 0.99], eps=1e-6)),
    dict(name="adam_amsgrad_wd", component="torch.optim.Adam",
         kwargs=dict(lr=1e-3, betas=[0.9, 0.95], weight_decay=0.1, amsgrad=True)),
    dict(name="adam_maximize_amsgrad", component="torch.optim.Adam",
         kwargs=dict(lr=2e-3, eps=1e-5, amsgrad=True, maximize=True)),
    dict(name="sgd", component="torch.optim.SGD",
         kwargs=dict(lr=0.1)),
    dict(name="sgd_momentum", component="torch.optim.SGD",
         kwargs=dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    dict(name="sgd_nesterov", component="torch.optim.SGD",
         kwargs=dict(lr=0.05, momentum=0.9, nesterov=True)),
    dict(name="sgd_maximize_momentum", component="torch.optim.SGD",
         kwargs=dict(lr=0.1, momentum=0.8, maximize=True)),
    dict(name="adagrad", component="torch.optim.Adagrad",
         kwargs=dict(lr=0.05)),
    dict(name="adagrad_full", component="torch.optim.Adagrad",
         kwargs=dict(lr=0.05, lr_decay=0.01, weight_decay=0.1,
                     initial_accumulator_value=0.1, eps=1e-8)),
    dict(name="rmsprop", component="torch.optim.RMSprop",
         kwargs=dict(lr=5e-3, alpha=0.9, eps=1e-6)),
    dict(name="rmsprop_centered", component="torch.optim.RMSprop",
         kwargs=dict(lr=0.01, alpha=0.95, centered=True)),
    dict(name="rmsprop_momentum", component="torch.optim.RMSprop",
         kwargs=dict(lr=0.01, momentum=0.9)),
    dict(name="rmsprop_centered_momentum_wd", component="torch.optim.RMSprop",
         kwargs=dict(lr=2e-3, alpha=0.9, eps=1e-6, weight_decay=0.01,
                     momentum=0.9, centered=True)),
    dict(name="lion", component="optc.Lion",
         kwargs=dict(lr=1e-4, betas=[0.9, 0.99], weight_decay=0.1)),
    # Prelude cases. grad_scale 1.0 makes the grad norm ~15, so clipping at
    # 1.0 is active; adamw_clip also carries the 0-element param.
    dict(name="adamw_clip", component="torch.optim.AdamW", clip=1.0, grad_scale=1.0,
         empty=True, kwargs=dict(lr=1e-3, weight_decay=0.01)),
    dict(name="adamw_scaled", component="torch.optim.AdamW", num_tokens=37,
         kwargs=dict(lr=1e-3, weight_decay=0.01)),
    # Scaled by 1/11 the grad norm is ~1.4, so clipping at 0.5 is active.
    dict(name="sgd_nesterov_clip_scaled", component="torch.optim.SGD", clip=0.5,
         num_tokens=11, grad_scale=1.0,
         kwargs=dict(lr=0.05, momentum=0.9, nesterov=True)),
    # 16-bit storage: every torch op rounds to the dtype. (fp16 has no 1e-8: with
    # the default eps, Adam divides 0 by 0 and the NaNs' payloads are torch's own.)
    dict(name="adamw_bf16", component="torch.optim.AdamW", dtype="bf16", steps=5,
         kwargs=dict(lr=1e-3, weight_decay=0.01)),
    dict(name="adam_wd_fp16", component="torch.optim.Adam", dtype="fp16",
         kwargs=dict(lr=1e-3, eps=1e-4, weight_decay=0.05, amsgrad=True)),
    dict(name="sgd_momentum_bf16", component="torch.optim.SGD", dtype="bf16",
         kwargs=dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    dict(name="adagrad_bf16", component="torch.optim.Adagrad", dtype="bf16",
         kwargs=dict(lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    dict(name="rmsprop_centered_momentum_bf16", component="torch.optim.RMSprop", dtype="bf16",
         kwargs=dict(lr=2e-3, weight_decay=0.01, momentum=0.9, centered=True)),
    dict(name="lion_bf16", component="optc.Lion", dtype="bf16",
         kwargs=dict(lr=1e-4, betas=[0.9, 0.99], weight_decay=0.1)),
    dict(name="adamw_clip_bf16", component="torch.optim.AdamW", dtype="bf16", clip=1.0, grad_scale=1.0,
         num_tokens=5, kwargs=dict(lr=1e-3, weight_decay=0.01)),
    # torch's fused CPU kernels: f32 math, one rounding per store.
    dict(name="adamw_fused", component="torch.optim.AdamW", fused=True, steps=5,
         kwargs=dict(lr=1e-3, weight_decay=0.01)),
    dict(name="adamw_fused_bf16", component="torch.optim.AdamW", fused=True, dtype="bf16",
         kwargs=dict(lr=2e-3, betas=[0.8, 0.95], weight_decay=0.05, amsgrad=True)),
    dict(name="adam_fused_wd_maximize", component="torch.optim.Adam", fused=True,
         kwargs=dict(lr=1e-3, weight_decay=0.05, maximize=True)),
    dict(name="sgd_fused_nesterov", component="torch.optim.SGD", fused=True,
         kwargs=dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    dict(name="sgd_fused_momentum_fp16", component="torch.optim.SGD", fused=True, dtype="fp16",
         kwargs=dict(lr=0.05, momentum=0.9, dampening=0.1)),
    dict(name="adagrad_fused", component="torch.optim.Adagrad", fused=True,
         kwargs=dict(lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    dict(name="adamw_fused_clip_scaled", component="torch.optim.AdamW", fused=True, clip=1.0,
         grad_scale=1.0, num_tokens=7, kwargs=dict(lr=1e-3, weight_decay=0.01)),
    # States in f32 with 16-bit params (and bf16 with f32 params): an op between
    # a state and a param or grad is an f32 op in torch, an op on the grad and
    # the param alone is 16-bit. torch's fused kernels refuse mixed dtypes.
    dict(name="sgd_momentum_bf16_fp32states", component="torch.optim.SGD", dtype="bf16", state_dtype="fp32",
         steps=4, kwargs=dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    dict(name="sgd_nesterov_bf16_fp32states", component="torch.optim.SGD", dtype="bf16", state_dtype="fp32",
         steps=4, kwargs=dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True)),
    dict(name="sgd_nesterov_clip_scaled_fp16_fp32states", component="torch.optim.SGD", dtype="fp16",
         state_dtype="fp32", clip=0.5, num_tokens=11, grad_scale=1.0,
         kwargs=dict(lr=0.05, momentum=0.9, nesterov=True)),
    dict(name="adagrad_bf16_fp32states", component="torch.optim.Adagrad", dtype="bf16", state_dtype="fp32",
         kwargs=dict(lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    dict(name="rmsprop_momentum_bf16_fp32states", component="torch.optim.RMSprop", dtype="bf16",
         state_dtype="fp32", kwargs=dict(lr=0.01, alpha=0.9, weight_decay=0.01, momentum=0.9)),
    dict(name="lion_bf16_fp32states", component="optc.Lion", dtype="bf16", state_dtype="fp32",
         kwargs=dict(lr=1e-4, betas=[0.9, 0.99], weight_decay=0.1)),
    dict(name="sgd_momentum_fp32_bf16states", component="torch.optim.SGD", state_dtype="bf16",
         kwargs=dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    dict(name="rmsprop_momentum_fp32_bf16states", component="torch.optim.RMSprop", state_dtype="bf16",
         kwargs=dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.9)),
]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

STATE_NAMES = ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
               "sum", "square_avg", "grad_avg"]


class Lion(torch.optim.Optimizer):
    """optc.Lion: lion-pytorch's Lion (update_fn), state `exp_avg` = zeros_like(p)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                # lion-pytorch update_fn, verbatim
                p.data.mul_(1.0 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1.0 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)


def make_optimizer(case, params):
    kw = dict(case["kwargs"])
    comp = case["component"]
    if comp == "optc.Lion":
        return Lion(params, **kw)
    cls = {"torch.optim.AdamW": torch.optim.AdamW, "torch.optim.Adam": torch.optim.Adam,
           "torch.optim.SGD": torch.optim.SGD, "torch.optim.Adagrad": torch.optim.Adagrad,
           "torch.optim.RMSprop": torch.optim.RMSprop}[comp]
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    if case.get("fused"):
        return cls(params, fused=True, **kw)
    return cls(params, foreach=False, **kw)


# ---------------------------------------------------------------- safetensors

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors(path, tensors, metadata):
    names = sorted(tensors)
    header = {}
    blobs = []
    off = 0
    for n in names:
        t = tensors[n].detach().contiguous()
        assert t.dtype in _DTYPES, (n, t.dtype)
        if t.dtype == torch.float32:
            data = struct.pack("<%df" % t.numel(), *t.reshape(-1).tolist())
        else:  # the 16-bit patterns
            data = struct.pack("<%dH" % t.numel(), *(t.reshape(-1).view(torch.int16).to(torch.int32) & 0xffff).tolist())
        header[n] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                     "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = metadata
    hj = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- recipe YAML

def yaml_scalar(v):
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = repr(v)
        if "e" in s and "." not in s.split("e")[0]:   # 1e-08 -> 1.0e-08 (YAML 1.1 float)
            m, e = s.split("e")
            s = m + ".0e" + e
        return s
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    raise TypeError(v)


def recipe_text(case):
    lines = [f"# Golden case {case['name']}: generated by {GENERATOR}; do not edit.",
             "optimizer:",
             f"  _component_: {case['component']}"]
    for k, v in case["kwargs"].items():
        lines.append(f"  {k}: {yaml_scalar(v)}")
    if case.get("fused"):
        lines.append("  fused: True")
    lines.append(f"dtype: {case.get('dtype', 'fp32')}")
    if case.get("state_dtype"):
        lines.append(f"optimizer_state_dtype: {case['state_dtype']}")
    lines.append(f"torch_cpu: {torch_cpu()}  # the CPU build torch dispatched to where these files were made")
    if case.get("clip") is not None:
        lines.append(f"clip_grad_norm: {yaml_scalar(float(case['clip']))}")
    return "\n".join(lines) + "\n"


def torch_cpu():
    from optc.torch import torch_cpu as probe  # torch's own sqrt decides, not its CPU capability
    return probe()


# ---------------------------------------------------------------- running

def states_before(case, opt, params, sdt):
    """Makes the states torch would make, in sdt, before the first step."""
    comp, kw = case["component"], case["kwargs"]
    assert comp not in ("torch.optim.AdamW", "torch.optim.Adam") and not kw.get("centered"), \
        "torch's lerp_ refuses mixed dtypes"
    assert not case.get("fused"), "torch's fused kernels refuse mixed dtypes"
    for p in params:
        z = lambda: torch.zeros_like(p, dtype=sdt)
        st = opt.state[p]
        if comp == "torch.optim.Adagrad":
            st["sum"] = torch.full_like(p, kw.get("initial_accumulator_value", 0.0), dtype=sdt)
        elif comp == "torch.optim.RMSprop":
            st["step"] = torch.zeros((), dtype=torch.float32)
            st["square_avg"] = z()
            if kw.get("momentum", 0) > 0:
                st["momentum_buffer"] = z()
        elif comp == "optc.Lion":
            st["exp_avg"] = z()


def states_after(opt, params, sdt):
    """SGD's first step made momentum_buffer in the grad's dtype: keep it in sdt."""
    for p in params:
        st = opt.state[p]
        if st.get("momentum_buffer") is not None:
            st["momentum_buffer"] = st["momentum_buffer"].to(sdt)


def run_case(idx, case):
    steps = case.get("steps", 3)
    gen = torch.Generator().manual_seed(1000 + idx)
    shapes = list(SHAPES) + ([EMPTY] if case.get("empty") else [])
    gscale = case.get("grad_scale", 0.1)
    dt = TORCH_DTYPES[case.get("dtype", "fp32")]
    names, params, grads = [], [], []
    for name, shape in shapes:
        p = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
        g = (torch.randn(shape, generator=gen, dtype=torch.float32) * gscale).to(dt)
        names.append(name)
        params.append(torch.nn.Parameter(p.clone()))
        grads.append(g)
    inputs = {}
    for n, p, g in zip(names, params, grads):
        inputs[n] = p.detach().clone()
        inputs[n + ".grad"] = g.clone()

    opt = make_optimizer(case, params)
    sdt = TORCH_DTYPES[case.get("state_dtype", case.get("dtype", "fp32"))]
    if sdt != dt:
        states_before(case, opt, params, sdt)
    norm = None
    for _ in range(steps):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        with torch.no_grad():
            if case.get("num_tokens") is not None:
                # torchtune: scale_grads(model, world_size / num_tokens), num_tokens an int tensor
                world_size = 1
                scaler = world_size / torch.tensor(case["num_tokens"])
                assert scaler.dtype == torch.float32 and scaler.dim() == 0
                for p in params:
                    if p.grad is not None:
                        p.grad *= scaler
        if case.get("clip") is not None:
            total = torch.nn.utils.clip_grad_norm_(params, max_norm=case["clip"], foreach=False)
            assert total.item() > case["clip"], (case["name"], total.item())  # clipping active
            assert norm is None or norm == total.item()  # the same grads every step
            norm = total.item()
        opt.step()
        if sdt != dt:
            states_after(opt, params, sdt)

    expected = {}
    sd = opt.state_dict()["state"]
    for i, (n, p) in enumerate(zip(names, params)):
        expected[n] = p.detach().clone()
        st = sd.get(i, {})
        for k, v in st.items():
            if k == "step":
                continue
            assert k in STATE_NAMES, (case["name"], k)
            if v is None:
                continue
            assert torch.is_tensor(v) and v.dtype == sdt and v.shape == p.shape, (k, v)
            expected[f"{n}.{k}"] = v.detach().clone()
        if "step" in st:
            s = st["step"]
            s = s if torch.is_tensor(s) else torch.tensor(float(s))
            assert s.dtype == torch.float32 and s.dim() == 0 and s.item() == steps, s
            expected[n + ".step"] = s.detach().clone()
        else:
            expected[n + ".step"] = torch.tensor(float(steps), dtype=torch.float32)
    return steps, inputs, expected, norm


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    meta = {"generator": GENERATOR, "torch": torch.__version__}
    names = [c["name"] for c in CASES]
    assert len(set(names)) == len(names)
    lines = []
    for idx, case in enumerate(CASES):
        steps, inputs, expected, norm = run_case(idx, case)
        d = os.path.join(HERE, case["name"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "recipe.yaml"), "w") as f:
            f.write(recipe_text(case))
        write_safetensors(os.path.join(d, "in.safetensors"), inputs, meta)
        write_safetensors(os.path.join(d, "expected.safetensors"), expected, meta)
        sets = []
        if case.get("num_tokens") is not None:
            sets.append(f"num_tokens={case['num_tokens']}")
        if norm is not None:
            sets.append(f"grad_norm_given={norm!r}")
        extra = ",".join(sets) or "-"
        lines.append(f"{case['name']} {steps} {extra}")
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(CASES)} cases under {os.path.relpath(HERE)}", file=sys.stderr)


if __name__ == "__main__":
    main()
