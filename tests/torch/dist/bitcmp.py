"""Bit-for-bit comparison of what two training runs leave on one rank:
local shards of params and states, losses, flat state dicts. Each function
appends a line per mismatch to `errs`."""
import torch
from torch.distributed.tensor import DTensor


def local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def bits(t):
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def diff(a, b):
    """"" when tensors a and b hold the same bits (any NaN equals any NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if not a.is_floating_point():
        return "" if torch.equal(a, b) else f"{a.flatten()[:8].tolist()} vs {b.flatten()[:8].tolist()}"
    d = (bits(a) != bits(b)) & ~(torch.isnan(a) & torch.isnan(b))
    n = int(d.sum())
    if not n:
        return ""
    i = d.flatten().nonzero()[0].item()
    return f"{n} of {a.numel()} differ, first at {i}: {a.flatten()[i].item()!r} vs {b.flatten()[i].item()!r}"


def compare_values(a, b, errs, what):
    """Two values of a state dict: tensors (DTensors by their local shard and
    placements) by their bits, dicts and sequences item by item, the rest
    by ==."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        if type(a) is not type(b):
            errs.append(f"{what}: {type(a).__name__} vs {type(b).__name__}")
        elif isinstance(a, DTensor) and tuple(a.placements) != tuple(b.placements):
            errs.append(f"{what}: placed {a.placements} vs {b.placements}")
        elif local(a).device != local(b).device:
            errs.append(f"{what}: on {local(a).device} vs {local(b).device}")
        elif d := diff(local(a), local(b)):
            errs.append(f"{what}: {d}")
    elif isinstance(a, dict) and isinstance(b, dict):
        if sorted(a, key=str) != sorted(b, key=str):
            errs.append(f"{what}: keys {sorted(a, key=str)} vs {sorted(b, key=str)}")
        for k in a:
            if k in b:
                compare_values(a[k], b[k], errs, f"{what}.{k}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            compare_values(x, y, errs, f"{what}[{i}]")
    elif a != b:
        errs.append(f"{what}: {a!r} vs {b!r}")


def compare_flat(sa, sb, errs, what, ignore=()):
    """Two flat state dicts (torchtitan's FQN-keyed optimizer state): the
    same keys, each value the same; keys whose last part is in `ignore`
    are left out."""
    sa = {k: v for k, v in sa.items() if k.rsplit(".", 1)[-1] not in ignore}
    sb = {k: v for k, v in sb.items() if k.rsplit(".", 1)[-1] not in ignore}
    if sorted(sa) != sorted(sb):
        only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
        errs.append(f"{what}: keys only in the first {only_a[:6]}, only in the second {only_b[:6]}")
    for k in sorted(set(sa) & set(sb)):
        compare_values(sa[k], sb[k], errs, f"{what}: {k}")


def compare_params(named_a, named_b, errs, what):
    """Two models' named params (local shards), in order, by their bits."""
    named_a, named_b = list(named_a), list(named_b)
    if [n for n, _ in named_a] != [n for n, _ in named_b]:
        errs.append(f"{what}: param names differ")
        return
    for (n, a), (_, b) in zip(named_a, named_b):
        compare_values(a.detach(), b.detach(), errs, f"{what}: {n}")


def compare_floats(xs, ys, errs, what):
    """Two lists of python floats (losses, norms): equal, element by element."""
    if len(xs) != len(ys):
        errs.append(f"{what}: {len(xs)} values vs {len(ys)}")
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x != y and not (x != x and y != y):
            errs.append(f"{what}[{i}]: {x!r} vs {y!r}")
