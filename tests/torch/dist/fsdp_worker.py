"""FSDP2 training with optc.torch beside torch.optim: run under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp_worker.py OUT.json [CASE ...]

Runs every case of fsdp_cases.py (or those named) on gloo and writes, from
rank 0, {case name: {"errors": [...], "info": {...}}} to OUT.json (through a
temporary name): errors are every rank's mismatches, each prefixed by its
rank. A case that raises on a rank records the traceback; the ranks agree on
each case's end before the next begins.
"""
import copy
import json
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fsdp_cases  # noqa: E402
import optc.torch as otorch  # noqa: E402

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SIZES = {"net": dict(vocab=300, dim=130, ctx=3, hidden=37, out=5),
         "empty": dict(vocab=301, dim=13, ctx=3, hidden=7, out=1),
         "dim1": dict(vocab=300, dim=130, ctx=3, hidden=37, out=5)}
STEPS = 3


class Net(nn.Module):
    def __init__(self, vocab, dim, ctx, hidden, out):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc1 = nn.Linear(dim * ctx, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(self.emb(x).flatten(1))))


def build(case, seed=0):
    torch.manual_seed(seed)
    m = Net(**SIZES[case["model"]]).to(DT[case["dtype"]])
    kw = {}
    if case["offload"]:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if case["model"] == "dim1":
        world = dist.get_world_size()
        kw["shard_placement_fn"] = lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % world == 0 else None
    for sub in (m.emb, m.fc1, m.fc2):
        fully_shard(sub, **kw)
    fully_shard(m, **kw)
    return m


def forward_backward(m, case, step):
    s = SIZES[case["model"]]
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank() + 1)
    x = torch.randint(0, s["vocab"], (8, s["ctx"]), generator=g)
    y = torch.randn(8, s["out"], generator=g)
    loss = ((m(x).float() - y) ** 2).mean()
    loss.backward()
    return loss.detach()


def torch_opt(case, params):
    kw = dict(case["kw"])
    if case["opt"] == "Lion":
        from lion_pytorch import Lion
        return Lion(params, **kw)
    if not kw.get("fused"):
        kw["foreach"] = False
    cls = getattr(torch.optim, case["opt"])
    if kw.get("fused") and case["opt"] in ON_SHARDS:
        return OnShards(cls, params, kw)
    return cls(params, **kw)


# torch 2.15's fused SGD and Adagrad raise on DTensors (NotImplementedError:
# aten._fused_sgd_ has no sharding strategy registered); their reference
# is the same kernel on each rank's local shards.
ON_SHARDS = ("SGD", "Adagrad")


class OnShards:
    """torch's optimizer run on each rank's local shards, with its state
    shown as DTensors placed as the params, as torch would keep it."""

    def __init__(self, cls, params, kw):
        self.params = list(params)
        self.locals = [local(p) for p in self.params]
        self.opt = cls(self.locals, **kw)

    def step(self):
        for p, lp in zip(self.params, self.locals):
            lp.grad = None if p.grad is None else local(p.grad)
        self.opt.step()

    def zero_grad(self):
        for p, lp in zip(self.params, self.locals):
            p.grad = lp.grad = None

    @property
    def state(self):
        out = {}
        for p, lp in zip(self.params, self.locals):
            st = self.opt.state.get(lp)
            if st is not None:
                out[p] = {k: DTensor.from_local(v, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                                stride=p.stride()) if torch.is_tensor(v) and v.dim() else v
                          for k, v in st.items()}
        return out


def optc_opt(case, params, **extra):
    kw = dict(case["kw"], **fsdp_cases.optc_kw(case))
    if case["opt"] != "Lion" and not kw.get("fused"):
        kw["foreach"] = False
    return getattr(otorch, case["opt"])(params, **kw, **extra)


# ---- comparing bits ---------------------------------------------------------------------------

def local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def bits(t):
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def diff(a, b):
    """"" when a and b are the same bits (any NaN equals any NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if not a.is_floating_point():
        return "" if torch.equal(a, b) else f"{a.tolist()} vs {b.tolist()}"
    d = (bits(a) != bits(b)) & ~(torch.isnan(a) & torch.isnan(b))
    n = int(d.sum())
    if not n:
        return ""
    i = d.flatten().nonzero()[0].item()
    return f"{n} of {a.numel()} differ, first at {i}: {a.flatten()[i].item()!r} vs {b.flatten()[i].item()!r}"


def compare_params(ma, mb, errs, what):
    for (n, a), (_, b) in zip(ma.named_parameters(), mb.named_parameters()):
        if type(a) is not type(b):
            errs.append(f"{what}: {n}: {type(a).__name__} vs {type(b).__name__}")
        elif d := diff(local(a), local(b)):
            errs.append(f"{what}: {n}: {d}")


def compare_states(ma, oa, mb, ob, errs, what):
    """optimizer a's state against b's, param by param: the same keys, the
    same kinds (a DTensor with the same placements, or a plain tensor on the
    same device), the same bits."""
    for (n, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        sa, sb = oa.state.get(pa, {}), ob.state.get(pb, {})
        if sorted(sa) != sorted(sb):
            errs.append(f"{what}: {n}: state keys {sorted(sa)} vs {sorted(sb)}")
            continue
        for k in sa:
            a, b = sa[k], sb[k]
            if type(a) is not type(b):
                errs.append(f"{what}: {n}.{k}: {type(a).__name__} vs {type(b).__name__}")
            elif isinstance(a, DTensor) and (a.placements != b.placements or a.device_mesh != b.device_mesh):
                errs.append(f"{what}: {n}.{k}: placed {a.placements} vs {b.placements}")
            elif torch.is_tensor(a):
                if local(a).device != local(b).device:
                    errs.append(f"{what}: {n}.{k}: on {local(a).device} vs {local(b).device}")
                elif d := diff(local(a), local(b)):
                    errs.append(f"{what}: {n}.{k}: {d}")
            elif a != b:
                errs.append(f"{what}: {n}.{k}: {a!r} vs {b!r}")


def snapshot(m, o):
    return ([local(p).clone() for p in m.parameters()],
            {id(p): {k: (local(v).clone() if torch.is_tensor(v) else v) for k, v in o.state[p].items()}
             for p in m.parameters() if p in o.state})


def compare_snapshot(m, o, snap, errs, what):
    ps, states = snap
    for (n, p), before in zip(m.named_parameters(), ps):
        if d := diff(local(p), before):
            errs.append(f"{what}: {n} changed: {d}")
    for p in m.parameters():
        for k, v in o.state.get(p, {}).items():
            old = states.get(id(p), {}).get(k)
            if old is None:
                errs.append(f"{what}: state {k} appeared")
            elif torch.is_tensor(v) and (d := diff(local(v), old)):
                errs.append(f"{what}: state {k} changed: {d}")


def step_pair(case, mt, ot, mo, oo, step, errs, after=None, info=None):
    lt, lo = forward_backward(mt, case, step), forward_backward(mo, case, step)
    if diff(lt, lo):
        errs.append(f"step {step}: loss {lt.item()!r} vs {lo.item()!r}")
    ot.step()
    oo.step()
    count_inbwd(oo, info)
    ot.zero_grad()
    oo.zero_grad()
    if after:
        after()
    compare_params(mt, mo, errs, f"after step {step}")


# ---- the modes --------------------------------------------------------------------------------

def count_inbwd(oo, info):
    """Adds the optimizer's last in-backward counts to info's."""
    st = getattr(oo, "in_backward_stats", None)
    if st is None or info is None:
        return
    for k, v in st.items():
        info[k] = info.get(k, 0) + v


def mode_step(case, errs, info):
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters())
    for s in range(STEPS):
        step_pair(case, mt, ot, mo, oo, s, errs, info=info)
    compare_states(mt, ot, mo, oo, errs, "states")
    info["empty_shards"] = sum(1 for p in mo.parameters() if local(p).numel() == 0)
    info["placements"] = sorted({str(p.placements) for p in mo.parameters()})


def mode_fused(case, errs, info):
    """torchtune's scale_grads (a 0-dim f32 tensor) and clip_grad_norm_, then
    the step, against fused_step given torch's norm: the same bits."""
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters())
    scale = torch.tensor(0.75)
    max_norm = 0.05
    clipped = 0
    for s in range(STEPS):
        lt, lo = forward_backward(mt, case, s), forward_backward(mo, case, s)
        if diff(lt, lo):
            errs.append(f"step {s}: loss {lt.item()!r} vs {lo.item()!r}")
        for p in mt.parameters():
            p.grad *= scale
        tn = torch.nn.utils.clip_grad_norm_(mt.parameters(), max_norm)
        if isinstance(tn, DTensor):
            tn = tn.full_tensor()
        clipped += float(tn) > max_norm
        ot.step()
        no = oo.fused_step(grad_scale=scale, max_norm=max_norm, grad_norm=tn)
        if d := diff(no, tn):
            errs.append(f"step {s}: returned norm {no!r} vs torch's {tn!r}: {d}")
        ot.zero_grad()
        oo.zero_grad()
        compare_params(mt, mo, errs, f"after step {s}")
    compare_states(mt, ot, mo, oo, errs, "states")
    info["clipped_steps"] = clipped


def mode_own_norm(case, errs, info):
    """optc's own norm over both ranks' shards against clip_grad_norm_'s:
    within one rounding of the grads' dtype, the same bits on every rank,
    and (no clipping at this max_norm) the same step."""
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters())
    rel = []
    for s in range(STEPS):
        forward_backward(mt, case, s), forward_backward(mo, case, s)
        tn = torch.nn.utils.clip_grad_norm_(mt.parameters(), 1e9)
        if isinstance(tn, DTensor):
            tn = tn.full_tensor()
        ot.step()
        no = oo.fused_step(max_norm=1e9)
        if no.dtype != tn.dtype:
            errs.append(f"step {s}: norm dtype {no.dtype} vs {tn.dtype}")
        eps = torch.finfo(tn.dtype).eps
        r = abs(float(no) - float(tn)) / float(tn)
        rel.append(r)
        if r > eps:
            errs.append(f"step {s}: optc's norm {float(no)!r} vs torch's {float(tn)!r}: relative {r:.3g} > {eps:.3g}")
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, float(no))
        if len(set(everyone)) != 1:
            errs.append(f"step {s}: the ranks' norms differ: {everyone}")
        ot.zero_grad()
        oo.zero_grad()
        compare_params(mt, mo, errs, f"after step {s}")
    info["norm_rel_diff_max"] = max(rel)


def mode_skip(case, errs, info):
    """nonfinite='skip' with a NaN in one grad on one rank only: every rank
    skips the whole step (nothing changes), and training goes on as torch's
    with that step left out."""
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters(), nonfinite="skip")
    for s in range(STEPS + 1):
        if s != 1:
            step_pair(case, mt, ot, mo, oo, s, errs)
            continue
        forward_backward(mt, case, s), forward_backward(mo, case, s)
        if dist.get_rank() == dist.get_world_size() - 1:
            g = next(local(p.grad) for p in mo.parameters() if local(p).numel())
            g.view(-1)[0] = float("nan")
        snap = snapshot(mo, oo)
        oo.step()
        compare_snapshot(mo, oo, snap, errs, f"step {s} (skipped)")
        ot.zero_grad()
        oo.zero_grad()
    if oo.skipped_steps != 1:
        errs.append(f"skipped_steps {oo.skipped_steps}, not 1")
    compare_states(mt, ot, mo, oo, errs, "states")


def mode_state_dict(case, errs, info):
    """state_dict() in torch's format, both ways: optc's loads into
    torch.optim and torch's into optc, and all four go on with one bits."""
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters())
    for s in range(2):
        step_pair(case, mt, ot, mo, oo, s, errs)
    sd_t, sd_o = ot.state_dict(), oo.state_dict()
    if sd_t["param_groups"] != sd_o["param_groups"]:
        errs.append(f"param_groups {sd_t['param_groups']} vs {sd_o['param_groups']}")
    mt2, mo2 = build(case, seed=5), build(case, seed=5)
    mt2.load_state_dict(mo.state_dict())
    mo2.load_state_dict(mt.state_dict())
    ot2, oo2 = torch_opt(case, mt2.parameters()), optc_opt(case, mo2.parameters())
    ot2.load_state_dict(copy.deepcopy(sd_o))
    oo2.load_state_dict(copy.deepcopy(sd_t))
    compare_states(mt, ot, mt2, ot2, errs, "torch loaded from optc")
    compare_states(mt, ot, mo2, oo2, errs, "optc loaded from torch")
    for s in range(2, 4):
        step_pair(case, mt, ot, mo, oo, s, errs)
        step_pair(case, mt2, ot2, mo2, oo2, s, errs)
        compare_params(mt, mt2, errs, f"after step {s}, the loaded pair")
    compare_states(mt, ot, mo2, oo2, errs, "states at the end")


def mode_dcp(case, errs, info):
    """torch.distributed.checkpoint: get_optimizer_state_dict, dcp.save, a
    fresh model and optimizer, dcp.load, set_optimizer_state_dict; optc's
    checkpoint loads into torch.optim and torch's into optc (each fresh
    optimizer first takes DCP's zero-lr step that makes its state)."""
    root = os.environ["OPTC_FSDP_TMP"]
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters())
    for s in range(2):
        step_pair(case, mt, ot, mo, oo, s, errs)
    dirs = {}
    for tag, m, o in (("torch", mt, ot), ("optc", mo, oo)):
        dirs[tag] = os.path.join(root, case["name"], tag)
        dcp.save({"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, o)},
                 checkpoint_id=dirs[tag])
    loaded = []
    for tag, make in (("optc", torch_opt), ("torch", optc_opt)):
        m = build(case, seed=7)
        o = make(case, m.parameters())
        sd = {"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, o)}
        dcp.load(sd, checkpoint_id=dirs[tag])
        set_model_state_dict(m, sd["model"])
        set_optimizer_state_dict(m, o, sd["optim"])
        loaded.append((m, o))
    (mt2, ot2), (mo2, oo2) = loaded
    compare_states(mt, ot, mt2, ot2, errs, "torch loaded from optc's checkpoint")
    compare_states(mt, ot, mo2, oo2, errs, "optc loaded from torch's checkpoint")
    for s in range(2, 4):
        step_pair(case, mt, ot, mo, oo, s, errs)
        step_pair(case, mt2, ot2, mo2, oo2, s, errs)
        compare_params(mt, mt2, errs, f"after step {s}, the loaded pair")
    compare_states(mt, ot, mo2, oo2, errs, "states at the end")


def mode_groups(case, errs, info):
    """What trainers put in param groups: param_names (named params), per
    group hyperparameters, LambdaLR's initial_lr, fused/foreach keys, and a
    tensor lr in one group."""
    mt, mo = build(case), build(case)

    def groups(m):
        named = list(m.named_parameters())
        emb = [(n, p) for n, p in named if n.startswith("emb")]
        rest = [(n, p) for n, p in named if not n.startswith("emb")]
        lr0 = case["kw"]["lr"]
        return [dict(params=[p for _, p in emb], param_names=[n for n, _ in emb], lr=torch.tensor(lr0)),
                dict(params=[p for _, p in rest], param_names=[n for n, _ in rest], lr=lr0 * 2, weight_decay=0.0)]

    ot, oo = torch_opt(case, groups(mt)), optc_opt(case, groups(mo))
    st = torch.optim.lr_scheduler.LambdaLR(ot, lambda s: 1.0 / (1 + s))
    so = torch.optim.lr_scheduler.LambdaLR(oo, lambda s: 1.0 / (1 + s))
    for s in range(STEPS):
        step_pair(case, mt, ot, mo, oo, s, errs, after=lambda: (st.step(), so.step()))
    compare_states(mt, ot, mo, oo, errs, "states")
    gt, go = ot.state_dict()["param_groups"], oo.state_dict()["param_groups"]
    if [sorted(g) for g in gt] != [sorted(g) for g in go]:
        errs.append(f"group keys {[sorted(g) for g in gt]} vs {[sorted(g) for g in go]}")
    info["group_keys"] = sorted(go[0])


def first_norm(case):
    """The total grad norm of the first step (torch's, on a model of its own):
    where max_norm is put as a fraction of it."""
    m = build(case)
    forward_backward(m, case, 0)
    tn = torch.nn.utils.clip_grad_norm_(m.parameters(), float("inf"))
    return float(tn.full_tensor() if isinstance(tn, DTensor) else tn)


def mode_clip(case, errs, info):
    """in_backward with max_norm (speculating or not) and torchtune's
    scale_grads: the scale set before the backward (set_grad_scale), the
    norm torch's (given at fused_step), against scale_grads_, clip_grad_norm_
    and the step after the backward."""
    scale = torch.tensor(0.75)
    max_norm = case["frac"] * float(scale) * first_norm(case)
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters(), max_norm=max_norm)
    clipped = 0
    for s in range(STEPS):
        lt = forward_backward(mt, case, s)
        oo.set_grad_scale(scale)
        lo = forward_backward(mo, case, s)
        if diff(lt, lo):
            errs.append(f"step {s}: loss {lt.item()!r} vs {lo.item()!r}")
        for p in mt.parameters():
            p.grad *= scale
        tn = torch.nn.utils.clip_grad_norm_(mt.parameters(), max_norm)
        tn = tn.full_tensor() if isinstance(tn, DTensor) else tn
        clipped += float(tn) > max_norm
        ot.step()
        no = oo.fused_step(grad_norm=tn)
        count_inbwd(oo, info)
        if d := diff(no, tn):
            errs.append(f"step {s}: returned norm {no!r} vs torch's {tn!r}: {d}")
        ot.zero_grad()
        oo.zero_grad()
        compare_params(mt, mo, errs, f"after step {s}")
    compare_states(mt, ot, mo, oo, errs, "states")
    info["clipped_steps"] = clipped
    # optc's own norm, in the backward, on every rank the same, within a rounding of torch's
    lt, lo = forward_backward(mt, case, STEPS), forward_backward(mo, case, STEPS)
    tn = torch.nn.utils.clip_grad_norm_(mt.parameters(), max_norm)
    tn = tn.full_tensor() if isinstance(tn, DTensor) else tn
    oo.step()
    no = oo.last_grad_norm
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, float(no))
    if len(set(everyone)) != 1:
        errs.append(f"the ranks' own norms differ: {everyone}")
    r = abs(float(no) - float(tn)) / float(tn)
    if r > torch.finfo(tn.dtype).eps:
        errs.append(f"optc's own norm {float(no)!r} vs torch's {float(tn)!r}: relative {r:.3g}")


def mode_accum(case, errs, info):
    """Two micro-batches a step: optc's first backward under no_step()
    (FSDP2 reduce-scattering each micro-batch, or only the last with
    set_requires_gradient_sync(False)), against torch's accumulation."""
    max_norm = case["frac"] * first_norm(case) if case["frac"] else None
    mt, mo = build(case), build(case)
    extra = {} if max_norm is None else dict(max_norm=max_norm)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters(), **extra)
    for s in range(STEPS):
        for m, o in ((mt, None), (mo, oo)):
            if not case["sync"]:
                m.set_requires_gradient_sync(False)
            if o is not None:
                with o.no_step():
                    forward_backward(m, case, 2 * s)
            else:
                forward_backward(m, case, 2 * s)
            if not case["sync"]:
                m.set_requires_gradient_sync(True)
        lt, lo = forward_backward(mt, case, 2 * s + 1), forward_backward(mo, case, 2 * s + 1)
        if diff(lt, lo):
            errs.append(f"step {s}: loss {lt.item()!r} vs {lo.item()!r}")
        if max_norm is not None:
            tn = torch.nn.utils.clip_grad_norm_(mt.parameters(), max_norm)
            tn = tn.full_tensor() if isinstance(tn, DTensor) else tn
            ot.step()
            oo.fused_step(grad_norm=tn)
        else:
            ot.step()
            oo.step()
        count_inbwd(oo, info)
        ot.zero_grad()
        oo.zero_grad()
        compare_params(mt, mo, errs, f"after step {s}")
    compare_states(mt, ot, mo, oo, errs, "states")


def mode_nan(case, errs, info):
    """nonfinite='skip' in the backward: one rank's loss is NaN at step 1, so
    every grad is after the reduce-scatter; every rank skips the step
    (speculative steps put back), and training goes on as torch's with that
    step left out."""
    mt, mo = build(case), build(case)
    ot, oo = torch_opt(case, mt.parameters()), optc_opt(case, mo.parameters())
    for s in range(STEPS + 1):
        if s != 1:
            step_pair(case, mt, ot, mo, oo, s, errs, info=info)
            continue
        forward_backward(mt, case, s)
        snap = snapshot(mo, oo)
        sz = SIZES[case["model"]]
        g = torch.Generator().manual_seed(1000 * s + dist.get_rank() + 1)
        x = torch.randint(0, sz["vocab"], (8, sz["ctx"]), generator=g)
        y = torch.randn(8, sz["out"], generator=g)
        if dist.get_rank() == dist.get_world_size() - 1:
            y[0, 0] = float("nan")
        ((mo(x).float() - y) ** 2).mean().backward()
        oo.step()
        count_inbwd(oo, info)
        compare_snapshot(mo, oo, snap, errs, f"step {s} (skipped)")
        ot.zero_grad()
        oo.zero_grad()
    if oo.skipped_steps != 1:
        errs.append(f"skipped_steps {oo.skipped_steps}, not 1")
    compare_states(mt, ot, mo, oo, errs, "states")


MODES = {"clip": mode_clip, "accum": mode_accum, "nan": mode_nan, "step": mode_step, "fused": mode_fused, "own_norm": mode_own_norm, "skip": mode_skip,
         "state_dict": mode_state_dict, "dcp": mode_dcp, "groups": mode_groups}


def main():
    out = sys.argv[1]
    want = set(sys.argv[2:])
    from datetime import timedelta
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    results = {}
    tmp = tempfile.mkdtemp(prefix="optc-fsdp-") if rank == 0 else None
    box = [tmp]
    dist.broadcast_object_list(box)
    os.environ["OPTC_FSDP_TMP"] = box[0]
    for case in fsdp_cases.cases():
        if want and case["name"] not in want:
            continue
        errs, info = [], {}
        try:
            MODES[case["mode"]](case, errs, info)
        except Exception:
            errs.append(traceback.format_exc())
        everyone = [None] * world
        dist.all_gather_object(everyone, (errs, info))
        if rank == 0:
            results[case["name"]] = {
                "errors": [f"rank {r}: {e}" for r, (es, _) in enumerate(everyone) for e in es],
                "info": {f"rank{r}": i for r, (_, i) in enumerate(everyone)}}
    if rank == 0:
        tmp_out = out + ".tmp"
        with open(tmp_out, "w") as f:
            json.dump({"world": world, "torch": torch.__version__, "cases": results}, f, indent=1)
        os.replace(tmp_out, out)
        import shutil
        shutil.rmtree(box[0], ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    from leave import leave  # (after main: an exception in it exits as Python does)
    leave()
