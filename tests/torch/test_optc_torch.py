"""optc.torch's optimizers against torch.optim itself, bit for bit.

Every optimizer x its options x dtype (fp32, bf16, fp16) x fused=True where
torch has a fused kernel, each trained for 12 steps on a small model (a
2-layer MLP with biases over a small embedding, cast to the dtype) beside
torch.optim.X(foreach=False) (or fused=True) on a copy of it: the losses,
the params and every state must be the same bits, and optc's state_dict
must be torch's (same keys, dtypes, shapes, values; same param_groups).
Lion is checked against lion-pytorch's Lion when it is installed, else
against a copy of its update_fn.

The helpers here (the model, the byte comparison, the torch reference)
are shared with the other test_optc_torch_*.py files.

These run in the .venv with the optc package installed, or from the source
tree with OPTC_LIBRARY set (python/ is then put on the path).
"""
import os
import sys

import pytest
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import optc.torch as otorch
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    for m in [m for m in sys.modules if m == "optc" or m.startswith("optc.")]:
        del sys.modules[m]
    import optc.torch as otorch
import optc._capi as capi
from conftest import sqrt_marks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FUSED = {"AdamW", "Adam", "SGD", "Adagrad"}
STEPS = 12


# ---- the model and the data ---------------------------------------------------------------------

class Net(nn.Module):
    """An embedding (39000 elements: torch splits it over 2 threads), then
    a 2-layer MLP with biases; sizes whose ends fall in the vector tails."""

    def __init__(self, vocab=300, dim=130, ctx=3, hidden=37, out=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc1 = nn.Linear(dim * ctx, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(self.emb(x).flatten(1))))


def make_models(dtype, seed=0, n=2):
    torch.manual_seed(seed)
    a = Net().to(dtype)
    out = [a]
    for _ in range(n - 1):
        b = Net().to(dtype)
        b.load_state_dict(a.state_dict())
        out.append(b)
    return out


def batches(steps, seed=1, vocab=300, ctx=3, batch=24, classes=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (batch, ctx), generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(steps)]


def loss_of(model, xy):
    x, y = xy
    return nn.functional.cross_entropy(model(x).float(), y)


# ---- comparing bits -----------------------------------------------------------------------------

def bits(t):
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def diff(a, b):
    """"" when a and b are the same bits (any NaN equals any NaN), else
    what differs."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if a.is_floating_point():
        if torch.equal(bits(a), bits(b)):
            return ""
        d = (bits(a) != bits(b)) & ~(torch.isnan(a) & torch.isnan(b))
    else:
        d = a != b
    n = int(d.sum())
    if not n:
        return ""
    i = d.flatten().nonzero()[0].item()
    return (f"{n} of {a.numel()} differ, first at {i}: {a.flatten()[i].item()!r} vs {b.flatten()[i].item()!r}")


def assert_same_params(ma, mb, what=""):
    bad = [f"{n}: {d}" for (n, a), (_, b) in zip(ma.named_parameters(), mb.named_parameters()) if (d := diff(a, b))]
    assert not bad, what + "\n".join(bad)


def assert_same_state(opt_a, opt_b, what=""):
    """Both state_dicts the same: param_groups equal, the same state keys,
    and every state value the same dtype, shape, device and bits."""
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    assert sa["param_groups"] == sb["param_groups"], what + f"param_groups: {sa['param_groups']} vs {sb['param_groups']}"
    assert sa["state"].keys() == sb["state"].keys(), what + f"state of params {sorted(sa['state'])} vs {sorted(sb['state'])}"
    bad = []
    for i in sa["state"]:
        a, b = sa["state"][i], sb["state"][i]
        if list(a) != list(b):
            bad.append(f"param {i}: keys {list(a)} vs {list(b)}")
            continue
        for k in a:
            if torch.is_tensor(a[k]) != torch.is_tensor(b[k]):
                bad.append(f"param {i} {k}: {type(a[k])} vs {type(b[k])}")
            elif torch.is_tensor(a[k]):
                if a[k].device != b[k].device:
                    bad.append(f"param {i} {k}: on {a[k].device} vs {b[k].device}")
                elif d := diff(a[k], b[k]):
                    bad.append(f"param {i} {k}: {d}")
            elif a[k] != b[k]:
                bad.append(f"param {i} {k}: {a[k]!r} vs {b[k]!r}")
    assert not bad, what + "\n".join(bad)


# ---- the torch side -----------------------------------------------------------------------------

def _lion_update_fn(p, grad, exp_avg, lr, wd, beta1, beta2):
    # lion-pytorch 0.2.5's update_fn (lucidrains/lion-pytorch, MIT), verbatim
    p.data.mul_(1. - lr * wd)
    update = exp_avg.clone().mul_(beta1).add(grad, alpha=1. - beta1).sgn_()
    p.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1. - beta2)


class RefLion(torch.optim.Optimizer):
    """lion-pytorch's Lion (its step and update_fn), for when it is not installed."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, use_triton=False,
                 decoupled_weight_decay=False):
        self._init_lr = lr
        self.decoupled_wd = decoupled_weight_decay
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in filter(lambda p: p.grad is not None, group["params"]):
                wd = group["weight_decay"]
                if self.decoupled_wd:
                    wd /= self._init_lr
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                _lion_update_fn(p, p.grad, state["exp_avg"], group["lr"], wd, *group["betas"])
        return loss


try:
    from lion_pytorch import Lion as TorchLion
except ImportError:
    TorchLion = RefLion


def torch_optimizer(name, params, kw, fused=False):
    if name == "Lion":
        return TorchLion(params, **kw)
    cls = getattr(torch.optim, name)
    return cls(params, **kw, **(dict(fused=True) if fused else dict(foreach=False)))


def optc_optimizer(name, params, kw, fused=False, **extra):
    """optc's, given what torch's was given (foreach=False too: accepted)."""
    cls = getattr(otorch, name)
    impl = {} if name == "Lion" else dict(fused=True) if fused else dict(foreach=False)
    return cls(params, **kw, **impl, **extra)


def train_pair(name, kw, dtype, fused=False, steps=STEPS, seed=0, threads=None, **extra):
    """Trains the same model with torch's optimizer and optc's, step by
    step, checking the losses and params after every step; returns the
    models and optimizers."""
    if threads is not None:
        torch.set_num_threads(threads)
    mt, mo = make_models(dtype, seed)
    ot = torch_optimizer(name, mt.parameters(), kw, fused)
    oo = optc_optimizer(name, mo.parameters(), kw, fused, **extra)
    for i, xy in enumerate(batches(steps, seed + 1)):
        lt, lo = loss_of(mt, xy), loss_of(mo, xy)
        assert not diff(lt.detach(), lo.detach()), f"step {i}: loss {lt.item()!r} vs {lo.item()!r}"
        lt.backward()
        lo.backward()
        ot.step()
        oo.step()
        ot.zero_grad()
        oo.zero_grad()
        assert_same_params(mt, mo, f"after step {i + 1}:\n")
    return mt, mo, ot, oo


# ---- the matrix ---------------------------------------------------------------------------------

def eps_for(dtype):
    return 1e-4 if dtype == "fp16" else 1e-8  # fp16 has no 1e-8: 0/0 where a grad is 0


OPTIONS = {
    "AdamW": [dict(), dict(weight_decay=0.0), dict(amsgrad=True), dict(maximize=True, weight_decay=0.1),
              dict(betas=(0.8, 0.95), amsgrad=True, maximize=True, weight_decay=0.05)],
    "Adam": [dict(), dict(weight_decay=0.01), dict(amsgrad=True, weight_decay=0.1), dict(maximize=True),
             dict(decoupled_weight_decay=True, weight_decay=0.1)],
    "SGD": [dict(lr=0.05), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
            dict(lr=0.05, momentum=0.5, dampening=0.1, weight_decay=0.01), dict(lr=0.05, maximize=True, weight_decay=0.01),
            dict(lr=0.05, momentum=0.9, maximize=True)],
    "Adagrad": [dict(), dict(lr_decay=1e-3, weight_decay=0.01), dict(initial_accumulator_value=0.1),
                dict(maximize=True, lr_decay=1e-2)],
    "RMSprop": [dict(), dict(momentum=0.9), dict(centered=True), dict(centered=True, momentum=0.5, weight_decay=0.01),
                dict(maximize=True, alpha=0.9)],
    "Lion": [dict(), dict(weight_decay=0.1, lr=3e-4), dict(betas=(0.95, 0.98), weight_decay=1.0,
                                                         decoupled_weight_decay=True)],
}


def matrix():
    out = []
    for name, opts in OPTIONS.items():
        for i, kw in enumerate(opts):
            for dt in DTYPES:
                for fused in ([False, True] if name in FUSED else [False]):
                    out.append(pytest.param(name, kw, dt, fused, id=f"{name}-{i}-{dt}{'-fused' if fused else ''}",
                                            marks=sqrt_marks(name, dt, fused)))
    return out


@pytest.mark.parametrize("name,kw,dtype,fused", matrix())
def test_matrix(name, kw, dtype, fused):
    kw = dict(kw)
    if name in ("AdamW", "Adam", "RMSprop"):
        kw.setdefault("eps", eps_for(dtype))
    if name == "Adagrad" and dtype == "fp16":
        kw.setdefault("eps", 1e-4)
    mt, mo, ot, oo = train_pair(name, kw, DTYPES[dtype], fused)
    assert_same_state(ot, oo)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["AdamW", "SGD", "RMSprop", "Lion"])
def test_torch_threads(name, threads):
    """The 16-bit for-loop bits depend on torch's thread count: optc follows it."""
    old = torch.get_num_threads()
    try:
        kw = dict(lr=0.05, momentum=0.9) if name == "SGD" else dict(momentum=0.5) if name == "RMSprop" else {}
        if name in ("AdamW", "RMSprop"):
            kw["eps"] = 1e-4
        mt, mo, ot, oo = train_pair(name, kw, torch.bfloat16, threads=threads, steps=6)
        assert_same_state(ot, oo)
    finally:
        torch.set_num_threads(old)


def test_state_format_adamw():
    """The state torch keeps, exactly: step a 0-dim f32 CPU tensor, the
    moments zeros_like(p); fused=True keeps step on the param's device."""
    for fused in (False, True):
        mt, mo, ot, oo = train_pair("AdamW", {}, torch.bfloat16, fused, steps=2)
        for p in mo.parameters():
            st = oo.state[p]
            assert list(st) == ["step", "exp_avg", "exp_avg_sq"]
            assert st["step"].dtype == torch.float32 and st["step"].dim() == 0 and st["step"].item() == 2.0
            assert st["exp_avg"].dtype == p.dtype and st["exp_avg"].shape == p.shape


def test_state_format_sgd():
    """SGD: no state at all without momentum; with it, momentum_buffer
    appears at the first step."""
    mt, mo, ot, oo = train_pair("SGD", dict(lr=0.1), torch.float32, steps=2)
    assert len(oo.state) == len(ot.state) == 0
    m = Net()
    o = otorch.SGD(m.parameters(), lr=0.1, momentum=0.9)
    assert len(o.state) == 0
    loss_of(m, batches(1)[0]).backward()
    o.step()
    assert all(list(o.state[p]) == ["momentum_buffer"] for p in m.parameters())


def test_adagrad_state_at_init():
    m = Net()
    o = otorch.Adagrad(m.parameters(), initial_accumulator_value=0.25)
    t = torch.optim.Adagrad(Net().parameters(), initial_accumulator_value=0.25)
    for p, q in zip(m.parameters(), t.param_groups[0]["params"]):
        assert list(o.state[p]) == list(t.state[q]) == ["step", "sum"]
        assert not diff(o.state[p]["sum"], t.state[q]["sum"])
        assert o.state[p]["step"].dtype == t.state[q]["step"].dtype


def test_in_place_no_copies():
    m = Net()
    o = otorch.AdamW(m.parameters())
    ptrs = [p.data_ptr() for p in m.parameters()]
    for xy in batches(3):
        loss_of(m, xy).backward()
        o.step()
    assert ptrs == [p.data_ptr() for p in m.parameters()]
    states = {id(p): (o.state[p]["exp_avg"].data_ptr(), o.state[p]["exp_avg_sq"].data_ptr()) for p in m.parameters()}
    loss_of(m, batches(1)[0]).backward()
    o.step()
    assert states == {id(p): (o.state[p]["exp_avg"].data_ptr(), o.state[p]["exp_avg_sq"].data_ptr())
                      for p in m.parameters()}


def test_library_loaded():
    import optc
    assert optc.library_version == capi.version
    assert os.path.exists(optc.library_path)
    assert capi.STATUS_NAMES[capi.OPTC_OK] == "OPTC_OK"
