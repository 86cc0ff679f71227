"""optc.torch beyond one optimizer on one model: param groups with their own
hyperparameters and dtypes, add_param_group, lr schedulers and tensor lrs
(no rebuilds), fused_step's scale_grads and clip_grad_norm_ against torch's,
state_dict both ways mid-training, lr = 0, the nonfinite modes, bad inputs,
closures, pickling, optc_ir. Each against torch.optim itself, bit for bit.
"""
import copy
import math
import pickle

import pytest
import torch
import torch.nn as nn

from test_optc_torch import (Net, assert_same_params, assert_same_state, batches, capi, diff, loss_of,
                             make_models, optc_optimizer, otorch, torch_optimizer, train_pair)


def step_both(mt, mo, ot, oo, xy, before=None):
    lt, lo = loss_of(mt, xy), loss_of(mo, xy)
    assert not diff(lt.detach(), lo.detach()), f"loss {lt.item()!r} vs {lo.item()!r}"
    lt.backward()
    lo.backward()
    if before:
        before()
    ot.step()
    oo.step()
    ot.zero_grad()
    oo.zero_grad()


def groups_of(m, **extra):
    """Three groups with their own hyperparameters."""
    return [dict(params=[m.emb.weight], lr=3e-3, **extra),
            dict(params=[m.fc1.weight, m.fc1.bias], weight_decay=0.0, betas=(0.8, 0.9)),
            dict(params=[m.fc2.weight, m.fc2.bias], lr=1e-2, eps=1e-6)]


# ---- param groups, add_param_group, mixed dtypes ----------------------------------------------

@pytest.mark.torch_sqrt
@pytest.mark.parametrize("fused", [False, True])
def test_param_groups(fused):
    mt, mo = make_models(torch.float32)
    ot = torch.optim.AdamW(groups_of(mt), **(dict(fused=True) if fused else dict(foreach=False)))
    oo = otorch.AdamW(groups_of(mo), **(dict(fused=True) if fused else dict(foreach=False)))
    for xy in batches(10):
        step_both(mt, mo, ot, oo, xy)
    assert_same_params(mt, mo)
    assert_same_state(ot, oo)


@pytest.mark.torch_sqrt
def test_mixed_dtypes_in_a_group():
    """One group, fp32 and bf16 params: one program per layout."""
    mt, mo = make_models(torch.float32)
    for m in (mt, mo):
        m.emb.to(torch.bfloat16)
        m.fc2.to(torch.float16)
    ot = torch.optim.Adam(mt.parameters(), eps=1e-4, foreach=False)
    oo = otorch.Adam(mo.parameters(), eps=1e-4, foreach=False)

    def fwd(m, xy):
        x, y = xy
        h = m.emb(x).flatten(1).float()
        return nn.functional.cross_entropy(m.fc2(torch.tanh(m.fc1(h)).half()).float(), y)

    for xy in batches(8):
        for m, o in ((mt, ot), (mo, oo)):
            fwd(m, xy).backward()
            o.step()
            o.zero_grad()
    assert_same_params(mt, mo)
    assert_same_state(ot, oo)
    assert oo.programs_built == 3


@pytest.mark.torch_sqrt
def test_add_param_group():
    """A group added mid-training starts at step 0: its own run of the step."""
    mt, mo = make_models(torch.float32)
    ot = torch.optim.AdamW([mt.fc1.weight, mt.fc1.bias, mt.fc2.weight, mt.fc2.bias], foreach=False)
    oo = otorch.AdamW([mo.fc1.weight, mo.fc1.bias, mo.fc2.weight, mo.fc2.bias], foreach=False)
    data = batches(10)
    for xy in data[:4]:
        step_both(mt, mo, ot, oo, xy)
    ot.add_param_group(dict(params=[mt.emb.weight], lr=1e-2, weight_decay=0.0))
    oo.add_param_group(dict(params=[mo.emb.weight], lr=1e-2, weight_decay=0.0))
    for xy in data[4:]:
        step_both(mt, mo, ot, oo, xy)
    assert_same_params(mt, mo)
    assert_same_state(ot, oo)
    assert oo.state[mo.emb.weight]["step"].item() == 6.0 and oo.state[mo.fc1.weight]["step"].item() == 10.0


@pytest.mark.torch_sqrt
def test_adagrad_add_param_group():
    mt, mo = make_models(torch.float32)
    ot = torch.optim.Adagrad([mt.fc1.weight], initial_accumulator_value=0.1, foreach=False)
    oo = otorch.Adagrad([mo.fc1.weight], initial_accumulator_value=0.1, foreach=False)
    data = batches(6)
    for xy in data[:3]:
        step_both(mt, mo, ot, oo, xy)
    ot.add_param_group(dict(params=[mt.fc2.weight], initial_accumulator_value=0.5))
    oo.add_param_group(dict(params=[mo.fc2.weight], initial_accumulator_value=0.5))
    for xy in data[3:]:
        step_both(mt, mo, ot, oo, xy)
    assert_same_params(mt, mo)
    assert_same_state(ot, oo)


@pytest.mark.torch_sqrt
def test_grads_none_are_skipped():
    """A param without a grad is not stepped and gets no state, as in torch."""
    mt, mo = make_models(torch.float32)
    ot = torch.optim.AdamW(mt.parameters(), foreach=False)
    oo = otorch.AdamW(mo.parameters(), foreach=False)
    for i, xy in enumerate(batches(6)):
        for m, o in ((mt, ot), (mo, oo)):
            loss_of(m, xy).backward()
            if i % 2:
                m.fc2.bias.grad = None
            o.step()
            o.zero_grad()
    assert_same_params(mt, mo)
    assert_same_state(ot, oo)
    assert oo.state[mo.fc2.bias]["step"].item() == 3.0


# ---- lr: schedulers, tensors, no rebuilds -----------------------------------------------------

@pytest.mark.parametrize("sched", ["lambda", "cosine", "onecycle"])
def test_lr_scheduler(sched):
    mt, mo = make_models(torch.bfloat16)
    ot = torch.optim.AdamW(mt.parameters(), lr=1e-3, eps=1e-6, foreach=False)
    oo = otorch.AdamW(mo.parameters(), lr=1e-3, eps=1e-6, foreach=False)

    def make(o):
        if sched == "lambda":
            return torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 4) * 0.97 ** s)
        if sched == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12)
        return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-2, total_steps=13)

    st, so = make(ot), make(oo)
    built = None
    for i, xy in enumerate(batches(12)):
        step_both(mt, mo, ot, oo, xy)
        st.step()
        so.step()
        assert ot.param_groups[0]["lr"] == oo.param_groups[0]["lr"]
        if i == 0:
            built, calls = oo.programs_built, capi.step_new_calls
    assert_same_params(mt, mo)
    assert_same_state(ot, oo)
    assert oo.programs_built == built and capi.step_new_calls == calls, "an lr change rebuilt a program"


@pytest.mark.torch_sqrt
def test_tensor_lr_and_hyperparameter_changes_never_rebuild():
    mt, mo = make_models(torch.float32)
    ot = torch.optim.AdamW(mt.parameters(), lr=torch.tensor(1e-3), foreach=False)
    oo = otorch.AdamW(mo.parameters(), lr=torch.tensor(1e-3), foreach=False)
    data = batches(10)
    step_both(mt, mo, ot, oo, data[0])
    calls = capi.step_new_calls
    changes = [dict(lr=torch.tensor(3e-3)), dict(lr=2e-3), dict(betas=(0.85, 0.99)), dict(eps=1e-6),
               dict(weight_decay=0.3), dict(lr=0.0), dict(lr=torch.tensor(5e-4), betas=(0.9, 0.95))]
    for ch, xy in zip(changes, data[1:]):
        for o in (ot, oo):
            for g in o.param_groups:
                if isinstance(ch.get("lr"), torch.Tensor) and isinstance(g["lr"], torch.Tensor):
                    g["lr"].fill_(ch["lr"])
                    g.update({k: v for k, v in ch.items() if k != "lr"})
                else:
                    g.update(ch)
        step_both(mt, mo, ot, oo, xy)
    assert capi.step_new_calls == calls, "a hyperparameter change rebuilt a program"
    assert_same_params(mt, mo)
    # zero-ness of weight_decay is fixed when a step is built: one new program
    for g in oo.param_groups + ot.param_groups:
        g["weight_decay"] = 0.0
    step_both(mt, mo, ot, oo, data[-1])
    assert capi.step_new_calls == calls + 1
    assert_same_params(mt, mo)


@pytest.mark.parametrize("name", ["AdamW", "Adam", "SGD", "Adagrad", "RMSprop"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lr_zero_equals_torch(name, dtype):
    """lr = 0 is torch eager's step (torch.compile's AdamW goes NaN there)."""
    kw = dict(lr=0.0)
    if name == "SGD":
        kw.update(momentum=0.9, weight_decay=0.01)
    if name in ("AdamW", "Adam"):
        kw.update(weight_decay=0.1, eps=1e-6)
    mt, mo, ot, oo = train_pair(name, kw, dtype, steps=6)
    assert_same_state(ot, oo)
    for p in mo.parameters():
        assert torch.isfinite(p).all()


# ---- fused_step: scale_grads and clip_grad_norm_ ------------------------------------------------

def torchtune_scale_grads_(params, scaler):
    """torchtune.training.scale_grads_ on CPU tensors: torch._foreach_mul_."""
    grads = [p.grad for p in params if p.grad is not None]
    torch._foreach_mul_(grads, scaler)


def scale_cases():
    num_tokens = torch.tensor(37)
    return {"float": 1 / 37, "tensor": 2 / num_tokens, "one": 1.0}


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", list(scale_cases()))
@pytest.mark.parametrize("fused", [False, True])
def test_grad_scale_equals_foreach_mul(dtype, scale, fused):
    s = scale_cases()[scale]
    mt, mo = make_models(dtype)
    ot = torch_optimizer("AdamW", mt.parameters(), dict(eps=1e-4), fused)
    oo = optc_optimizer("AdamW", mo.parameters(), dict(eps=1e-4), fused)
    for xy in batches(8):
        loss_of(mt, xy).backward()
        loss_of(mo, xy).backward()
        grads_before = [p.grad.clone() for p in mo.parameters()]
        with torch.no_grad():
            torchtune_scale_grads_(list(mt.parameters()), s)
        ot.step()
        assert oo.fused_step(grad_scale=s) is None
        for g, p in zip(grads_before, mo.parameters()):
            assert not diff(g, p.grad), "fused_step changed p.grad"
        ot.zero_grad()
        oo.zero_grad()
        assert_same_params(mt, mo)
    assert_same_state(ot, oo)


def clip_run(dtype, groups, max_norm, scale=None, steps=8, give_norm=False, name="AdamW", kw=None):
    """torch: (scale_grads_), clip_grad_norm_, step; optc: fused_step. The
    norms agree to 1e-6 relative; where they are the same bits (or torch's
    is given), the steps are too. Where the norms' last bits differ, torch's
    step is taken again from the same params, states and grads with optc's
    norm (clip_grads_with_norm_), and that must be optc's step, bit for bit:
    every step compares every param. Returns the steps whose norms had the
    same bits."""
    kw = dict(kw or dict(eps=1e-4))
    mt, mo = make_models(dtype)
    if groups:
        ot = torch_optimizer(name, groups_of(mt), kw)
        oo = optc_optimizer(name, groups_of(mo), kw)
    else:
        ot = torch_optimizer(name, mt.parameters(), kw)
        oo = optc_optimizer(name, mo.parameters(), kw)
    same = 0
    for i, xy in enumerate(batches(steps)):
        loss_of(mt, xy).backward()
        loss_of(mo, xy).backward()
        with torch.no_grad():
            if scale is not None:
                torchtune_scale_grads_(list(mt.parameters()), scale)
            before = ([p.detach().clone() for p in mt.parameters()], [p.grad.clone() for p in mt.parameters()],
                      copy.deepcopy(ot.state_dict()))
            nt = torch.nn.utils.clip_grad_norm_(mt.parameters(), max_norm)
        ot.step()
        no = oo.fused_step(grad_scale=scale, max_norm=max_norm, grad_norm=nt.item() if give_norm else None)
        assert no.dtype == nt.dtype and no.device == nt.device and no.dim() == 0
        assert math.isclose(no.item(), nt.item(), rel_tol=1e-6 if dtype == torch.float32 else 1e-2), \
            f"step {i}: norm {no.item()!r} vs torch's {nt.item()!r}"
        # the coefficient min(1, max_norm / (norm + 1e-6)) is the same when
        # the norms are, or when both clamp to 1
        if give_norm or not diff(no, nt) or min(no.item(), nt.item()) + 1e-6 <= max_norm * (1 - 1e-3):
            same += not diff(no, nt)
        else:  # the norms' last bits differ: torch's step again, with optc's norm
            params, grads, state = before
            with torch.no_grad():
                for p, v, g in zip(mt.parameters(), params, grads):
                    p.copy_(v)
                    p.grad = g
                ot.load_state_dict(state)
                torch.nn.utils.clip_grads_with_norm_(mt.parameters(), max_norm, no)
            ot.step()
        assert_same_params(mt, mo, f"step {i}, norm {nt.item()!r} (optc's {no.item()!r}): ")
        ot.zero_grad()
        oo.zero_grad()
    return same


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [False, True], ids=["one-program", "three-groups"])
@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 100.0])
def test_clip_equals_torch(dtype, groups, max_norm):
    same = clip_run(dtype, groups, max_norm)  # every step's params compared bit for bit
    if dtype == torch.bfloat16:  # fp32 norms often differ in the last bit; bf16's rarely
        assert same >= 1, "optc's norm never had torch's last bits"


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("groups", [False, True], ids=["one-program", "three-groups"])
def test_clip_given_torch_norm_is_torch_bits(dtype, groups):
    clip_run(dtype, groups, 0.05, give_norm=True)


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("groups", [False, True], ids=["one-program", "three-groups"])
def test_scale_and_clip(groups):
    clip_run(torch.bfloat16, groups, 0.5, scale=2 / torch.tensor(61), give_norm=True)
    clip_run(torch.float32, groups, 0.5, scale=2 / torch.tensor(61))


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("name,kw", [("SGD", dict(lr=0.1, momentum=0.9)), ("Lion", dict(lr=1e-3)),
                                     ("RMSprop", dict(centered=True)), ("Adagrad", dict())])
def test_clip_other_optimizers(name, kw):
    clip_run(torch.float32, False, 0.1, name=name, kw=kw, give_norm=True, steps=5)


def test_clip_mixed_dtypes_norm_is_global():
    """Two programs (fp32 and bf16 params): the norm is over both."""
    m = Net()
    m.emb.to(torch.bfloat16)
    o = otorch.AdamW(m.parameters())
    x, y = batches(1)[0]
    h = m.emb(x).flatten(1).float()
    nn.functional.cross_entropy(m.fc2(torch.tanh(m.fc1(h))), y).backward()
    want = torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)  # measures, does not clip
    got = o.fused_step(max_norm=1.0)
    assert got.dtype == want.dtype == torch.float32
    # torch rounds each bf16 grad's norm to bf16 before it sums them
    assert math.isclose(got.item(), want.item(), rel_tol=1e-2)
    assert o.programs_built == 2 + 2  # two steps, two optc.grad_norm


# ---- state_dict both ways -----------------------------------------------------------------------

@pytest.mark.torch_sqrt
@pytest.mark.parametrize("name,kw,dtype,fused", [
    ("AdamW", dict(amsgrad=True), torch.float32, False),
    ("AdamW", dict(eps=1e-6), torch.bfloat16, True),
    ("Adam", dict(weight_decay=0.01), torch.bfloat16, False),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True), torch.float32, True),
    ("Adagrad", dict(lr_decay=1e-3), torch.bfloat16, False),
    ("RMSprop", dict(momentum=0.5, centered=True), torch.float32, False),
    ("Lion", dict(weight_decay=0.1), torch.bfloat16, False),
])
def test_state_dict_both_ways(name, kw, dtype, fused):
    """torch trains 5 steps; its state_dict loads into optc, which continues;
    optc's loads back into a fresh torch, which continues: all equal to
    torch trained straight through."""
    data = batches(15)
    ref, m = make_models(dtype)
    oref = torch_optimizer(name, ref.parameters(), kw, fused)
    ot = torch_optimizer(name, m.parameters(), kw, fused)
    for xy in data[:5]:
        for mm, o in ((ref, oref), (m, ot)):
            loss_of(mm, xy).backward()
            o.step()
            o.zero_grad()
    # torch -> optc, on a fresh copy of the model
    mo = make_models(dtype)[0]
    mo.load_state_dict(m.state_dict())
    oo = optc_optimizer(name, mo.parameters(), kw, fused)
    oo.load_state_dict(copy.deepcopy(ot.state_dict()))
    for xy in data[5:10]:
        step_both(ref, mo, oref, oo, xy)
    assert_same_params(ref, mo)
    assert_same_state(oref, oo)
    # optc -> torch
    mt = make_models(dtype)[0]
    mt.load_state_dict(mo.state_dict())
    ot2 = torch_optimizer(name, mt.parameters(), kw, fused)
    ot2.load_state_dict(copy.deepcopy(oo.state_dict()))
    for xy in data[10:]:
        step_both(ref, mt, oref, ot2, xy)
    assert_same_params(ref, mt)
    assert_same_state(oref, ot2)


@pytest.mark.torch_sqrt
def test_pickle_and_deepcopy():
    mt, mo, ot, oo = train_pair("AdamW", dict(weight_decay=0.1), torch.float32, steps=3, nonfinite="skip")
    o2 = copy.deepcopy(oo)
    assert o2._optc_nonfinite == "skip" and o2.programs_built == 0
    assert_same_state(oo, o2)
    o3 = pickle.loads(pickle.dumps(oo))
    assert_same_state(oo, o3)


# ---- nonfinite grads ------------------------------------------------------------------------------

def poison(m, which):
    with torch.no_grad():
        if which == "nan":
            m.fc1.weight.grad[3, 4] = float("nan")
        else:
            m.fc2.bias.grad[1] = float("inf")


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("which", ["nan", "inf"])
@pytest.mark.parametrize("groups", [False, True], ids=["one-program", "three-groups"])
def test_nonfinite_propagate_is_torch(which, groups):
    mt, mo = make_models(torch.float32)
    ot = torch.optim.AdamW(groups_of(mt) if groups else mt.parameters(), foreach=False)
    oo = otorch.AdamW(groups_of(mo) if groups else mo.parameters(), foreach=False)
    for i, xy in enumerate(batches(4)):
        loss_of(mt, xy).backward()
        loss_of(mo, xy).backward()
        if i == 2:
            poison(mt, which)
            poison(mo, which)
        ot.step()
        oo.step()
        ot.zero_grad()
        oo.zero_grad()
        assert_same_params(mt, mo)
    assert oo.skipped_steps == 0


@pytest.mark.torch_sqrt
@pytest.mark.parametrize("mode", ["skip", "error"])
@pytest.mark.parametrize("groups", [False, True], ids=["one-program", "three-groups"])
@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("dtypes", ["fp32", "mixed"])
def test_nonfinite_skip_and_error(mode, groups, clip, dtypes):
    """The poisoned step changes nothing (params, states, step counts), in
    every program; the others are torch's (torch not stepping there)."""
    mt, mo = make_models(torch.float32)
    if dtypes == "mixed":
        for m in (mt, mo):
            m.fc2.to(torch.bfloat16)

    def fwd(m, xy):
        x, y = xy
        h = torch.tanh(m.fc1(m.emb(x).flatten(1)))
        return nn.functional.cross_entropy(m.fc2(h.to(m.fc2.weight.dtype)).float(), y)

    ot = torch.optim.AdamW(groups_of(mt) if groups else mt.parameters(), foreach=False)
    oo = otorch.AdamW(groups_of(mo) if groups else mo.parameters(), foreach=False, nonfinite=mode)
    for i, xy in enumerate(batches(6)):
        fwd(mt, xy).backward()
        fwd(mo, xy).backward()
        if i in (2, 4):
            poison(mo, "nan" if i == 2 else "inf")
            before = copy.deepcopy(oo.state_dict())
            params = [p.detach().clone() for p in mo.parameters()]
            if mode == "error":
                with pytest.raises(FloatingPointError, match="non-finite|nonfinite|NaN|nan|inf"):
                    oo.fused_step(max_norm=clip)
            else:
                oo.fused_step(max_norm=clip)
            for a, p in zip(params, mo.parameters()):
                assert not diff(a, p.detach())
            after = oo.state_dict()
            for k in before["state"]:
                for s in before["state"][k]:
                    assert not diff(before["state"][k][s], after["state"][k][s]), f"state {k} {s} changed"
        else:
            if clip is not None:
                with torch.no_grad():
                    nt = torch.nn.utils.clip_grad_norm_(mt.parameters(), clip)
                ot.step()
                oo.fused_step(max_norm=clip, grad_norm=nt.item())
            else:
                ot.step()
                oo.fused_step()
        ot.zero_grad()
        oo.zero_grad()
        assert_same_params(mt, mo, f"step {i}: ")
    assert oo.skipped_steps == (2 if mode == "skip" else 0)
    assert_same_state(ot, oo)


# ---- bad inputs ---------------------------------------------------------------------------------

def one_param(t, grad=None):
    p = nn.Parameter(t)
    p.grad = torch.ones_like(t) if grad is None else grad
    return p


def test_sparse_grads():
    emb = nn.Embedding(10, 4, sparse=True)
    o = otorch.AdamW(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="param 0.*sparse"):
        o.step()


def test_non_contiguous():
    p = one_param(torch.randn(5, 4).t())
    with pytest.raises(ValueError, match="param 0.*not contiguous"):
        otorch.AdamW([p]).step()
    q = one_param(torch.randn(4, 5), torch.randn(5, 4).t())
    with pytest.raises(ValueError, match="grad of param 1.*not contiguous"):
        otorch.SGD([one_param(torch.randn(3)), q], lr=0.1).step()


def test_bad_dtypes():
    with pytest.raises(TypeError, match="param 0.*float64"):
        otorch.AdamW([one_param(torch.randn(3, dtype=torch.float64))]).step()
    with pytest.raises(TypeError, match="param 0.*complex"):
        otorch.Adam([one_param(torch.randn(3, dtype=torch.complex64))]).step()
    p = one_param(torch.randn(3))
    p.grad.data = torch.randn(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="param 0 .*float32 but its grad is torch.float64"):
        otorch.AdamW([p]).step()


def test_ranges_as_torch():
    p = [nn.Parameter(torch.randn(3))]
    cases = [(otorch.AdamW, dict(lr=-1.0)), (otorch.AdamW, dict(betas=(1.0, 0.9))), (otorch.Adam, dict(eps=-1.0)),
             (otorch.SGD, dict(momentum=-0.1)), (otorch.SGD, dict(nesterov=True)), (otorch.Adagrad, dict(lr_decay=-1)),
             (otorch.RMSprop, dict(alpha=-1.0)), (otorch.AdamW, dict(weight_decay=-0.1))]
    for cls, kw in cases:
        tcls = getattr(torch.optim, cls.__name__)
        with pytest.raises(ValueError) as want:
            tcls(p, **kw)
        with pytest.raises(ValueError) as got:
            cls(p, **kw)
        assert str(got.value) == str(want.value)
    for kw in (dict(lr=0.0), dict(lr=-1e-3), dict(betas=(0.9, 1.5)), dict(weight_decay=-1.0)):
        with pytest.raises(ValueError):
            otorch.Lion(p, **kw)
    with pytest.raises(ValueError, match="nonfinite"):
        otorch.AdamW(p, nonfinite="ignore")


def test_fused_as_torch():
    p = [nn.Parameter(torch.randn(3))]
    with pytest.raises(TypeError):
        otorch.RMSprop(p, fused=True)
    with pytest.raises(TypeError):
        otorch.Lion(p, fused=True)
    with pytest.raises(RuntimeError, match="fused.*foreach"):
        otorch.AdamW(p, fused=True, foreach=True)
    with pytest.raises(RuntimeError, match="differentiable"):
        otorch.SGD(p, fused=True, differentiable=True)


def test_fused_step_arguments():
    o = otorch.AdamW([one_param(torch.randn(3))])
    for s in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grad_scale"):
            o.fused_step(grad_scale=s)
    with pytest.raises(ValueError, match="max_norm"):
        o.fused_step(grad_norm=1.0)


def test_cuda_without_backend():
    """A CUDA param: optc's CUDA step, which then moves the param as torch's
    does; or, where this liboptc has no CUDA backend (or no NVRTC), optc's
    error naming the param and why."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    p = one_param(torch.randn(3, device="cuda"))
    ref = one_param(p.detach().clone())
    ref.grad = p.grad.clone()
    o, ot = otorch.AdamW([p]), torch.optim.AdamW([ref], foreach=False)
    p0 = p.detach().clone()
    try:
        o.step()
    except RuntimeError as e:  # the library has no CUDA backend: optc's message, naming the param
        assert "param 0" in str(e) and ("CUDA" in str(e) or "NVRTC" in str(e)), str(e)
        return
    ot.step()
    assert not torch.equal(p, p0), "the step did nothing"
    torch.testing.assert_close(p, ref, rtol=1e-6, atol=0)


def test_meta_device():
    p = one_param(torch.empty(3, device="meta"))
    with pytest.raises(RuntimeError, match="param 0.*meta"):
        otorch.SGD([p], lr=0.1).step()


# ---- the rest of torch.optim.Optimizer ---------------------------------------------------------

def test_closure():
    mt, mo = make_models(torch.float32)
    ot = torch.optim.SGD(mt.parameters(), lr=0.1, momentum=0.9, foreach=False)
    oo = otorch.SGD(mo.parameters(), lr=0.1, momentum=0.9, foreach=False)
    for xy in batches(4):
        def closure(m=None, o=None):
            o.zero_grad()
            assert torch.is_grad_enabled()
            loss = loss_of(m, xy)
            loss.backward()
            return loss
        with torch.no_grad():
            lt = ot.step(lambda: closure(mt, ot))
            lo = oo.step(lambda: closure(mo, oo))
        assert not diff(lt.detach(), lo.detach())
    assert_same_params(mt, mo)


def test_zero_grad_and_hooks():
    m = Net()
    o = otorch.AdamW(m.parameters())
    calls = []
    o.register_step_pre_hook(lambda opt, a, k: calls.append("pre"))
    o.register_step_post_hook(lambda opt, a, k: calls.append("post"))
    loss_of(m, batches(1)[0]).backward()
    o.step()
    assert calls == ["pre", "post"]
    o.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    assert isinstance(o, torch.optim.Optimizer) and isinstance(o, torch.optim.AdamW)


def test_version_counters_bumped():
    """optc writes through pointers; autograd must still see the params change."""
    m = Net()
    o = otorch.AdamW(m.parameters())
    loss_of(m, batches(1)[0]).backward()
    before = [p._version for p in m.parameters()]
    o.step()
    assert all(p._version > v for p, v in zip(m.parameters(), before))


def test_optc_ir():
    m = Net()
    m.fc2.to(torch.bfloat16)
    o = otorch.AdamW(m.parameters(), fused=True)
    ir = o.optc_ir()  # before any step: what the params need
    assert ir.count("// ----- optc program") == 2
    assert "torch.optim.AdamW" in ir and "bf16" in ir and "param @param" in ir


def test_skip_leaves_no_new_state():
    """A skipped first step makes no momentum buffer (SGD) and counts no Lion step."""
    for name, kw in (("SGD", dict(lr=0.1, momentum=0.9)), ("Lion", dict(lr=1e-3))):
        m = Net()
        o = getattr(otorch, name)(m.parameters(), **kw, nonfinite="skip")
        loss_of(m, batches(1)[0]).backward()
        poison(m, "nan")
        before = [p.detach().clone() for p in m.parameters()]
        o.step()
        assert o.skipped_steps == 1
        assert all(not diff(a, p.detach()) for a, p in zip(before, m.parameters()))
        if name == "SGD":  # torch's SGD looks its states up (so they exist, empty) before it steps
            assert all(len(st) == 0 for st in o.state.values())
        else:
            assert o._optc_lion_steps == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_optc_threads_do_not_change_bits(threads):
    mt, mo, ot, oo = train_pair("AdamW", dict(weight_decay=0.1), torch.bfloat16, steps=4, threads=None)
    m1, m2 = make_models(torch.bfloat16)
    o1 = otorch.AdamW(m1.parameters(), weight_decay=0.1, threads=threads)
    o2 = otorch.AdamW(m2.parameters(), weight_decay=0.1)
    for xy in batches(4):
        for m, o in ((m1, o1), (m2, o2)):
            loss_of(m, xy).backward()
            o.step()
            o.zero_grad()
    assert_same_params(m1, m2)
    with pytest.raises(ValueError, match="threads"):
        otorch.AdamW(m1.parameters(), threads=-1)


@pytest.mark.torch_sqrt
def test_grad_scaler():
    """torch.amp.GradScaler unscales the grads itself (optc's step does not
    take its scale), then steps: as torch's."""
    mt, mo = make_models(torch.float32)
    ot = torch.optim.AdamW(mt.parameters(), foreach=False)
    oo = otorch.AdamW(mo.parameters(), foreach=False)
    st, so = torch.amp.GradScaler("cpu", init_scale=1024.0), torch.amp.GradScaler("cpu", init_scale=1024.0)
    for i, xy in enumerate(batches(6)):
        for m, o, s in ((mt, ot, st), (mo, oo, so)):
            s.scale(loss_of(m, xy)).backward()
            if i == 3:
                poison(m, "inf")  # GradScaler skips this step and lowers its scale
            s.step(o)
            s.update()
            o.zero_grad()
        assert_same_params(mt, mo, f"step {i}: ")
    assert st.get_scale() == so.get_scale()
    assert_same_state(ot, oo)


def test_optc_ir_after_a_step():
    m = Net()
    o = otorch.AdamW(m.parameters())
    loss_of(m, batches(1)[0]).backward()
    o.fused_step(max_norm=1.0)
    ir = o.optc_ir()
    assert ir.count("// ----- optc program") == 1 and "clip norm" in ir and "grad_norm" in ir


def test_torch_cpu_probe():
    """optc.torch.torch_cpu() names the sqrt this torch computes: IEEE's under
    "avx2", MKL's AVX-512 one (1 ulp under IEEE on about 0.6% of inputs)
    under "avx512", MKL's generic kernel under "amd" (optc's model of it,
    from this CPU's RSQRTPS: the same bits as torch's). Checked on 2^20
    other floats than the probe's own."""
    import numpy as np
    from optc.torch import torch_cpu
    x = torch.empty(1 << 20).uniform_(1e-3, 1e3, generator=torch.Generator().manual_seed(7))
    got = torch.sqrt(x).numpy().view(np.uint32)
    ieee = np.sqrt(x.numpy()).view(np.uint32)  # numpy's f32 sqrt is IEEE's (sqrtps)
    off = int((got != ieee).sum())
    if torch_cpu() == "avx2":
        assert off == 0, f"torch_cpu() says IEEE, but torch's sqrt differs on {off} of {x.numel()} inputs"
    elif torch_cpu() is None:
        assert off > 0, "torch_cpu() says none of optc's models, but torch's sqrt is IEEE's here"
    elif torch_cpu() == "amd":
        model = np.array(capi.torch_sqrt("amd", x.tolist()), dtype=np.float32).view(np.uint32)
        assert (model == got).all(), f"optc's model of MKL's generic sqrt differs from torch's on " \
            f"{int((model != got).sum())} of {x.numel()} inputs"
        assert off > 0.05 * x.numel(), f"MKL's generic sqrt differs from IEEE's on ~17%, here {off}"
    else:
        assert torch_cpu() == "avx512"
        assert 0.002 * x.numel() < off < 0.01 * x.numel(), f"MKL's AVX-512 sqrt differs on ~0.6%, here {off}"
        assert (got.astype(np.int64) - ieee.astype(np.int64)).max() <= 0, "MKL's sqrt is never above IEEE's"
