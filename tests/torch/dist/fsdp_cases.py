"""The FSDP2 cases: what tests/torch/test_fsdp.py asks of fsdp_worker.py,
which runs them all under one torchrun (gloo, 2 ranks).

Each case trains one model twice from the same init, on the same per-rank
data, under fully_shard: once with torch.optim (foreach=False, or
fused=True; lion-pytorch's Lion), once with optc.torch, and compares every
rank's losses, local param shards and local states, bit for bit.

A case is a dict:
  opt      the optimizer's name (torch.optim's, or Lion)
  kw       its arguments, as given to both
  dtype    fp32 | bf16 | fp16: the params' (and grads', and states') dtype
  offload  CPUOffloadPolicy(pin_memory=False) on every fully_shard
  model    net (uneven dim-0 shards) | empty (a param whose shard is empty on
           rank 1) | dim1 (Shard(1) for the 2-d params whose dim 1 divides)
  mode     step | fused (scale_grads + clip, given torch's norm) | own_norm
           (optc's own norm against torch's) | skip (a NaN grad on one rank)
           | state_dict (torch's format, both ways) | dcp (distributed
           checkpoint save/load, both ways) | groups (named params, param
           groups, LambdaLR's initial_lr, a tensor lr)
  inbwd    optc's in_backward=True (issue 34), with optc_kw's max_norm /
           speculate / nonfinite; modes for it: step | clip (torchtune's
           scale_grads given by set_grad_scale before the backward, then
           clip_grad_norm_ at max_norm = frac x the first step's norm,
           the step given torch's norm) | accum (two micro-batches, the
           first under no_step; sync: FSDP2 reduce-scatters each, or not)
           | nan (a NaN loss on one rank: every grad non-finite)
"""

OPTS = {
    "AdamW": dict(lr=3e-3, weight_decay=0.05),
    "Adam": dict(lr=3e-3, weight_decay=0.01, amsgrad=True),
    "SGD": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "Adagrad": dict(lr=0.05, lr_decay=1e-3, weight_decay=0.01),
    "RMSprop": dict(lr=1e-3, momentum=0.5, centered=True, weight_decay=0.01),
    "Lion": dict(lr=3e-4, weight_decay=0.1),
}
FUSED = ("AdamW", "Adam", "SGD", "Adagrad")
SQRT = ("AdamW", "Adam", "RMSprop", "Adagrad")


def _case(opt, dtype, offload=False, model="net", mode="step", fused=False, inbwd=None, frac=None, sync=None, **kw):
    k = dict(OPTS[opt])
    if dtype == "fp16" and opt in ("AdamW", "Adam", "RMSprop", "Adagrad"):
        k["eps"] = 1e-4  # fp16 has no 1e-8
    if fused:
        k["fused"] = True
    k.update(kw)
    name = f"{opt}-{dtype}{'-fused' if fused else ''}{'-offload' if offload else ''}-{model}-{mode}"
    if inbwd is not None:
        name += "-inbwd" + "".join(f"-{a}={b}" for a, b in sorted(inbwd.items()))
    if frac is not None:
        name += f"-frac={frac}"
    if sync is not None:
        name += f"-sync={sync}"
    return dict(name=name, opt=opt, kw=k, dtype=dtype, offload=offload, model=model, mode=mode, inbwd=inbwd,
                frac=frac, sync=sync)


def cases():
    out = []
    for opt in OPTS:
        for dtype in ("fp32", "bf16", "fp16"):
            out.append(_case(opt, dtype, model="empty"))
        for dtype in ("fp32", "bf16"):
            out.append(_case(opt, dtype, offload=True))
        out.append(_case(opt, "bf16", offload=True, model="dim1"))
        if opt in FUSED:
            for dtype in ("fp32", "bf16"):
                out.append(_case(opt, dtype, fused=True, model="empty"))
            out.append(_case(opt, "bf16", fused=True, offload=True))
    for opt in ("AdamW", "SGD", "Lion"):
        for dtype in ("fp32", "bf16"):
            out.append(_case(opt, dtype, offload=True, model="empty", mode="fused"))
    out.append(_case("AdamW", "bf16", fused=True, model="dim1", mode="fused"))
    for dtype in ("fp32", "bf16"):
        out.append(_case("AdamW", dtype, offload=True, mode="own_norm"))
        out.append(_case("AdamW", dtype, model="empty", mode="skip"))
    out.append(_case("SGD", "bf16", offload=True, mode="skip"))
    for opt in ("AdamW", "SGD", "Adagrad", "RMSprop", "Lion"):
        out.append(_case(opt, "bf16", offload=True, mode="state_dict"))
    for opt in ("AdamW", "Adam", "SGD", "Adagrad", "RMSprop"):
        out.append(_case(opt, "bf16", offload=True, mode="dcp"))
    out.append(_case("AdamW", "fp32", model="empty", mode="dcp"))
    out.append(_case("AdamW", "bf16", mode="groups"))
    out.append(_case("AdamW", "fp32", offload=True, mode="groups"))
    out.append(_case("SGD", "fp32", mode="groups"))
    out += inbwd_cases()
    return out


def inbwd_cases():
    """in_backward=True against torch.optim stepping after the backward."""
    out = []
    for opt in OPTS:
        for dtype in ("fp32", "bf16"):
            for offload in (False, True):
                out.append(_case(opt, dtype, offload=offload, model="empty", inbwd={}))
        if opt in FUSED:
            out.append(_case(opt, "bf16", fused=True, offload=True, inbwd={}))
    for opt in ("AdamW", "SGD", "Lion"):
        for dtype in ("fp32", "bf16"):
            for spec in (False, True):
                for frac in (0.9, 2.0):  # clips (a speculation is redone) / never clips (it is kept)
                    out.append(_case(opt, dtype, offload=True, mode="clip", frac=frac,
                                     inbwd=dict(speculate=spec)))
    for opt in ("Adam", "Adagrad", "RMSprop"):
        out.append(_case(opt, "bf16", offload=True, mode="clip", frac=0.9, inbwd=dict(speculate=True)))
    for opt in ("AdamW", "SGD", "Lion", "Adam"):
        for sync in (True, False):
            out.append(_case(opt, "bf16", offload=True, mode="accum", sync=sync, inbwd={}))
        out.append(_case(opt, "bf16", offload=True, mode="accum", sync=True, frac=0.9,
                         inbwd=dict(speculate=True)))
    for opt in ("AdamW", "SGD", "Lion", "RMSprop"):
        for spec in (False, True):
            out.append(_case(opt, "bf16", offload=True, mode="nan", inbwd=dict(speculate=spec, nonfinite="skip")))
    out.append(_case("AdamW", "fp32", mode="nan", inbwd=dict(speculate=True, nonfinite="skip")))
    return out


def needs_torch_sqrt(case):
    """Whether the case compares an f32 for-loop step that takes a square
    root with torch's (the torch_sqrt mark: optc.torch.torch_cpu())."""
    return case["opt"] in SQRT and case["dtype"] == "fp32" and not case["kw"].get("fused")


def optc_kw(case):
    """What optc's optimizer gets beyond torch's arguments."""
    return dict(case["inbwd"] or {}, in_backward=True) if case.get("inbwd") is not None else {}
