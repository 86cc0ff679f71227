"""optc.torch.AdamW8bit and AdamW4bit against torchao 0.18's, on the CPU,
byte for byte: params, codes and scales, step for step over five steps;
fp32 and bf16 params; quantized tensors beside plain ones (fewer than 4096
elements, or not a multiple of the block); amsgrad; both branches of the
lerp's weight. state_dict() both ways, training on with the same bits.
Stochastic rounding and Kahan compensation keep a small-lr update that
plain bf16 loses.

torchao's default path compiles each param's step with torch.compile (its
first step takes seconds), so the torchao comparisons use few, small
tensors. The code books are checked against torchao's own construction.

amsgrad with quantized states cannot run in torchao 0.18 (its state
subclasses have no aten.maximum: the step raises NotImplementedError), so
there optc is compared with lowbit_ref.py, a plain-torch reference of
torchao's step that is itself checked against torchao here where both run.
"""
import io
import math
import os

import pytest
import torch

torchao_optim = pytest.importorskip("torchao.optim")
from torchao.optim.quant_utils import create_dynamic_map  # noqa: E402

import lowbit_ref  # noqa: E402
import optc.torch as otorch  # noqa: E402
from optc import _capi  # noqa: E402
from optc.torch import QuantState  # noqa: E402

STEPS = 5


def bits_of(t):
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def params(dtype, shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.5).to(dtype)) for s in shapes]


def set_grads(ps_list, step):
    """The same grads, scale 0.1, for each list of params."""
    g = torch.Generator().manual_seed(100 + step)
    for i in range(len(ps_list[0])):
        gr = (torch.randn(ps_list[0][i].shape, generator=g) * 0.1).to(ps_list[0][i].dtype)
        for ps in ps_list:
            ps[i].grad = gr.clone()


def same_state(a, b):
    """torchao's state (its subclass or a plain tensor) against optc's
    (a QuantState or a plain tensor); a description of the first mismatch."""
    if isinstance(b, QuantState):
        if not hasattr(a, "codes"):
            return f"torchao's is plain ({type(a).__name__}), optc's quantized"
        if not torch.equal(a.codes.reshape(-1), b.codes.reshape(-1)):
            return "codes differ"
        if not torch.equal(bits_of(a.scale), bits_of(b.scale)):
            return "scales differ"
        return None
    if hasattr(a, "codes"):
        return "torchao's is quantized, optc's plain"
    return None if torch.equal(bits_of(a), bits_of(b)) else "plain states differ"


def compare(ao, oc, pa, pb, where):
    for i, (x, y) in enumerate(zip(pa, pb)):
        assert torch.equal(bits_of(x.detach()), bits_of(y.detach())), f"{where}: param {i} differs"
        sa, sb = ao.state[x], oc.state[y]
        assert sa["step"].item() == sb["step"].item(), f"{where}: param {i}: step"
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if k in sa or k in sb:
                bad = same_state(sa[k], sb[k])
                assert bad is None, f"{where}: param {i} {k}: {bad}"


# (64, 96): quantized; (100,) and (8, 513): below 4096, not a multiple of the
# block; (33, 128): 4224, a multiple of 128 (4-bit: quantized) not of 256
SHAPES = [(64, 96), (100,), (33, 128), (8, 513)]
CASES = [
    (8, torch.float32, dict()),
    (8, torch.bfloat16, dict(betas=(0.3, 0.6))),  # 1 - beta1 >= 0.5: the lerp's other branch
    (4, torch.float32, dict(betas=(0.8, 0.95), eps=1e-6)),
    (4, torch.bfloat16, dict(betas=(0.4, 0.9), weight_decay=0.1)),
]


@pytest.mark.parametrize("bits,dtype,kw", CASES, ids=[f"{b}bit-{str(d)[6:]}" for b, d, _ in CASES])
def test_equals_torchao(bits, dtype, kw):
    AO = torchao_optim.AdamW8bit if bits == 8 else torchao_optim.AdamW4bit
    OC = otorch.AdamW8bit if bits == 8 else otorch.AdamW4bit
    pa, pb = params(dtype, SHAPES), params(dtype, SHAPES)
    ao, oc = AO(pa, lr=1e-2, **kw), OC(pb, lr=1e-2, **kw)
    for step in range(STEPS):
        set_grads([pa, pb], step)
        ao.step()
        oc.step()
        compare(ao, oc, pa, pb, f"step {step + 1}")
        # the reference too, where torchao runs
        if step == 0:
            pr = params(dtype, SHAPES)
            rs = [{} for _ in pr]
        set_grads([pr], step)
        for x, st in zip(pr, rs):
            lowbit_ref.ref_adamw_lowbit_step(x.data, x.grad, st, torch.tensor(1e-2), kw.get("betas", (0.9, 0.999)),
                                             kw.get("eps", 1e-8), kw.get("weight_decay", 1e-2), bits=bits)
        for i, (x, y) in enumerate(zip(pa, pr)):
            assert torch.equal(bits_of(x.detach()), bits_of(y.detach())), f"step {step + 1}: the reference's param {i}"
    # what was quantized: torchao's rule, per tensor
    quant = [isinstance(oc.state[p]["exp_avg"], QuantState) for p in pb]
    block = 256 if bits == 8 else 128
    assert quant == [math.prod(s) >= 4096 and math.prod(s) % block == 0 for s in SHAPES]
    assert any(quant) and not all(quant)


@pytest.mark.parametrize("bits,dtype", [(8, torch.bfloat16), (4, torch.float32)])
def test_amsgrad_equals_reference(bits, dtype):
    """amsgrad, with max_exp_avg_sq quantized (unsigned code book): against
    lowbit_ref (torchao itself fails there)."""
    OC = otorch.AdamW8bit if bits == 8 else otorch.AdamW4bit
    pb, pr = params(dtype, SHAPES), params(dtype, SHAPES)
    oc = OC(pb, lr=1e-2, amsgrad=True, betas=(0.9, 0.99))
    rs = [{} for _ in pr]
    for step in range(STEPS):
        set_grads([pb, pr], step)
        oc.step()
        for x, st in zip(pr, rs):
            lowbit_ref.ref_adamw_lowbit_step(x.data, x.grad, st, torch.tensor(1e-2), (0.9, 0.99), 1e-8, 1e-2,
                                             bits=bits, amsgrad=True)
        for i, (x, y) in enumerate(zip(pr, pb)):
            assert torch.equal(bits_of(x.detach()), bits_of(y.detach())), f"step {step + 1}: param {i}"
            for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                a, b = rs[i][k], oc.state[y][k]
                if isinstance(b, QuantState):
                    assert torch.equal(a.codes.reshape(-1), b.codes.reshape(-1)), f"step {step + 1}: {i} {k} codes"
                    assert torch.equal(bits_of(a.scale), bits_of(b.scale)), f"step {step + 1}: {i} {k} scales"
                else:
                    assert torch.equal(bits_of(a), bits_of(b)), f"step {step + 1}: {i} {k}"
    assert isinstance(oc.state[pb[0]]["max_exp_avg_sq"], QuantState)


def test_state_dict_both_ways(tmp_path):
    """torchao -> optc and optc -> torchao mid-training (through torch.save
    and a weights_only load): the two go on with the same bits."""
    dtype = torch.bfloat16
    for bits, AO, OC in ((8, torchao_optim.AdamW8bit, otorch.AdamW8bit), (4, torchao_optim.AdamW4bit,
                                                                          otorch.AdamW4bit)):
        pa, pb = params(dtype, SHAPES[:2]), params(dtype, SHAPES[:2])
        ao, oc = AO(pa, lr=1e-2), OC(pb, lr=1e-2)
        for step in range(2):  # both train apart, from the same start
            set_grads([pa, pb], step)
            ao.step()
            oc.step()
        compare(ao, oc, pa, pb, f"{bits}-bit before the swap")
        # each loads the other's state_dict, saved and loaded as torch does
        f1, f2 = io.BytesIO(), io.BytesIO()
        torch.save(ao.state_dict(), f1)
        torch.save(oc.state_dict(), f2)
        f1.seek(0)
        f2.seek(0)
        sd_ao = torch.load(f1, weights_only=True)
        sd_oc = torch.load(f2, weights_only=True)
        assert type(sd_oc["state"][0]["exp_avg"]).__name__ == f"OptimState{bits}bit"
        ao2, oc2 = AO(pa, lr=1.0), OC(pb, lr=1.0)
        ao2.load_state_dict(sd_oc)  # torchao from optc's
        oc2.load_state_dict(sd_ao)  # optc from torchao's
        assert isinstance(oc2.state[pb[0]]["exp_avg"], QuantState)
        assert float(oc2.param_groups[0]["lr"]) == pytest.approx(1e-2)
        for step in range(2, 4):
            set_grads([pa, pb], step)
            ao2.step()
            oc2.step()
            compare(ao2, oc2, pa, pb, f"{bits}-bit step {step + 1} after the swap")


def test_code_books():
    """optc's tables are torchao's (and bitsandbytes' linear maps), entry for entry."""
    want = {"dyn8s": create_dynamic_map(True, 7, 8), "dyn8u": create_dynamic_map(False, 7, 8),
            "dyn4s": create_dynamic_map(True, 3, 4), "lin4u": torch.linspace(0, 1, 17)[1:].tolist(),
            "lin8s": torch.linspace(-1.0, 1.0, 256).tolist(), "lin8u": torch.linspace(0.0, 1.0, 256).tolist()}
    for name, vals in want.items():
        got = torch.tensor(_capi.code_book(name), dtype=torch.float32)
        assert torch.equal(bits_of(got), bits_of(torch.tensor(vals, dtype=torch.float32))), name


def test_quantize_matches_torchao_everywhere():
    """The code of every f32 pattern near each code's rounding point (its
    threshold, the f32s on both sides) and of a sweep of [-1.5, 1.5]: optc's
    step on one block, read back, against torchao's quantize_*bit_with_qmap."""
    from torchao.optim.quant_utils import quantize_4bit_with_qmap, quantize_8bit_with_qmap
    for bits, signed in ((8, True), (8, False), (4, True), (4, False)):
        q = torch.tensor(_capi.code_book({(8, True): "dyn8s", (8, False): "dyn8u", (4, True): "dyn4s",
                                          (4, False): "lin4u"}[bits, signed]), dtype=torch.float32)
        mids = (q[:-1] + q[1:]) / 2
        near = torch.cat([torch.nextafter(mids, mids - 1), mids, torch.nextafter(mids, mids + 1),
                          torch.linspace(-1.5, 1.5, 20001), q, torch.tensor([float("nan"), 0.0, -0.0])])
        quant = quantize_8bit_with_qmap if bits == 8 else quantize_4bit_with_qmap
        want = quant(near, q)
        got = torch.tensor([_code_of(float(y), q) for y in near.tolist()], dtype=torch.uint8)
        assert torch.equal(want, got), f"{bits}-bit {'signed' if signed else 'unsigned'}"


def _code_of(y, q):
    """torchao's algorithm in python f32, a third reference for the above."""
    f = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731
    n = len(q)
    c = 0
    s = n // 2
    while s >= 1:
        c += s if y >= float(q[c + s]) else 0
        s //= 2
    up = min(c + 1, n - 1)
    return up if f(f(y) - float(q[c])) >= f(f(float(q[up]) - float(q[c])) * 0.5) else c


@pytest.mark.parametrize("mode", ["plain", "kahan", "stochastic"])
def test_small_updates_kept(mode):
    """A step far below half a bf16 ulp of the param (fused=True's bits: f32
    arithmetic, one rounding): plain bf16 rounds every one away; Kahan
    compensation (its error kept in 'kahan_comp', itself bf16) and
    stochastic rounding (seeded) keep them, in the mean over 4096 elements."""
    n, steps, lr = 4096, 200, 1e-4
    p0 = torch.full((n,), 1.0, dtype=torch.bfloat16)  # ulp 2^-7 = 0.0078: an update of ~1e-4 is lost
    p = torch.nn.Parameter(p0.clone())
    kw = {"kahan": dict(compensation="kahan"), "stochastic": dict(stochastic_rounding=True, seed=1234),
          "plain": {}}[mode]
    opt = otorch.AdamW([p], lr=lr, weight_decay=0.0, fused=True, **kw)
    ref = torch.nn.Parameter(p0.float().clone())
    ref_opt = torch.optim.AdamW([ref], lr=lr, weight_decay=0.0)
    for _ in range(steps):
        p.grad = torch.ones(n, dtype=torch.bfloat16)  # Adam's step is ~lr each time
        ref.grad = torch.ones(n)
        opt.step()
        ref_opt.step()
    moved = 1.0 - p.detach().float().mean().item()
    want = 1.0 - ref.detach().mean().item()  # ~steps * lr = 0.02
    if mode == "plain":
        assert moved == 0.0, "plain bf16 kept an update below half an ulp"
        return
    if mode == "kahan":  # the param and its kept error: what the step would have left in f32, within 5%
        eff = p.detach().float() + opt.state[p]["kahan_comp"].float()
        assert abs((1.0 - eff.mean().item()) - want) < 0.05 * want
    assert abs(moved - want) < 0.1 * want, (moved, want)


def test_stochastic_rounding_reproducible():
    """The same seed gives the same bits; another seed others."""
    def run(seed):
        p = torch.nn.Parameter(torch.full((4096,), 1.0, dtype=torch.bfloat16))
        opt = otorch.AdamW8bit([p], lr=1e-3, bf16_stochastic_round=True, seed=seed)
        for step in range(3):
            p.grad = torch.linspace(-1, 1, 4096, dtype=torch.bfloat16) * (step + 1)
            opt.step()
        return p.detach().clone()
    a, b, c = run(7), run(7), run(8)
    assert torch.equal(bits_of(a), bits_of(b))
    assert not torch.equal(bits_of(a), bits_of(c))


def test_first_step_compiles_fast():
    """The first step, compile included, with the disk cache off: well under
    a second (torchao's torch.compile takes seconds per param)."""
    import time
    os.environ["OPTC_CACHE"] = "0"
    try:
        p = torch.nn.Parameter(torch.randn(256, 256))
        opt = otorch.AdamW8bit([p], lr=1e-3)
        p.grad = torch.randn(256, 256)
        t0 = time.perf_counter()
        opt.step()
        took = time.perf_counter() - t0
    finally:
        del os.environ["OPTC_CACHE"]
    assert took < 2.0, f"the first step took {took:.3f} s"


def test_errors():
    p = torch.nn.Parameter(torch.randn(4096))
    with pytest.raises(ValueError, match="block_size"):
        otorch.AdamW8bit([p], block_size=100)
    with pytest.raises(ValueError, match="Invalid beta"):
        otorch.AdamW4bit([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="choose one"):
        otorch.AdamW8bit([p], compensation="kahan", stochastic_rounding=True)
    q = torch.nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    q.grad = torch.randn(64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fused=True"):
        otorch.AdamW([q], stochastic_rounding=True).step()
