"""Quantized states on FSDP2 meshes of 1, 2 and 3 ranks: run under torchrun
with 3 ranks (gloo, CPU).

    python -m torch.distributed.run --standalone --nproc_per_node 3 lowbit_worker.py OUT.json

Each case trains the same params (FSDP2 dim-0 shards over a mesh of the
first n ranks, n = 1, 2, 3; the same full grads every step, so that the
meshes' results are comparable) and gathers the whole params and states on
rank 0, which writes {case: {"errors": [...], "info": {...}}} to OUT.json:

- mesh_*: optc.torch.AdamW8bit/AdamW4bit; the params, codes and scales after
  the steps are the same bytes on 1, 2 and 3 ranks (the shards of 64 x 96
  end inside blocks on 2 and 3 ranks).
- torchao_*: torchao's AdamW8bit beside optc's on the same mesh (1 and 2
  ranks), params whose shards are whole blocks on both: the same bytes,
  local codes and scales included.
- torchao_mesh: torchao's own dependence on the mesh: a 64 x 96 param's
  exp_avg is quantized on 1 rank and plain on 2 (3072 elements a shard,
  below its threshold), and the params after the steps differ.
"""
import hashlib
import json
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import optc.torch as otorch
from optc.torch import QuantState

STEPS = 4


class Params(nn.Module):
    def __init__(self, shapes, dtype, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.ps = nn.ParameterList([nn.Parameter((torch.randn(s, generator=g) * 0.5).to(dtype)) for s in shapes])


def sharded(shapes, dtype, mesh):
    m = Params(shapes, dtype)
    fully_shard(m, mesh=mesh)
    return list(m.ps)


def set_grads(ps, mesh, step):
    g = torch.Generator().manual_seed(1000 + step)
    fulls = []
    for p in ps:
        full = (torch.randn(p.shape, generator=g) * 0.1).to(p.dtype)
        p.grad = distribute_tensor(full, mesh, [Shard(0)])
        fulls.append(full)
    return fulls


def digest(t):
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def whole(opt, ps, group):
    """Digests of every param and state, whole (a collective over the mesh)."""
    out = {}
    for i, p in enumerate(ps):
        out[f"p{i}"] = digest(p.full_tensor())
        st = opt.state[p]
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if k not in st:
                continue
            v = st[k]
            if isinstance(v, QuantState):
                codes, scale = v.gather(group)
                out[f"p{i}.{k}.codes"] = digest(codes)
                out[f"p{i}.{k}.scale"] = digest(scale)
            else:
                out[f"p{i}.{k}"] = digest(v.full_tensor() if isinstance(v, DTensor) else v)
    return out


MESH_SHAPES = [(64, 96), (38, 128), (44, 96), (7, 1024), (8, 1000), (30, 30)]
MESH_CASES = {
    "mesh_8bit_bf16": dict(cls="AdamW8bit", dtype=torch.bfloat16, kw=dict(lr=1e-2)),
    "mesh_4bit_fp32_amsgrad": dict(cls="AdamW4bit", dtype=torch.float32, kw=dict(lr=1e-2, amsgrad=True)),
    # clipped by a norm that is the same on every mesh (the whole grads',
    # given): optc's own norm sums each rank's part, so its last bits follow
    # the mesh, as torch's own clip_grad_norm_ does
    "mesh_8bit_fp32_clip": dict(cls="AdamW8bit", dtype=torch.float32, kw=dict(lr=1e-2), max_norm=0.5),
}


def mesh_case(name, c, meshes, groups, rank, results):
    errors, seen = [], {}
    for n in (1, 2, 3):
        try:
            if rank < n:
                run_mesh(c, n, meshes, groups, rank, results, seen)
        except Exception:  # recorded; every rank still meets the barrier below
            results["errors"].append(f"rank {rank} of {n}: " + traceback.format_exc())
        dist.barrier()
    if rank == 0:
        for n in (2, 3):
            for k, v in seen.get(1, {}).items():
                if seen.get(n, {}).get(k) != v:
                    errors.append(f"{n} ranks: {k} differs from 1 rank's")
    results["errors"] += errors


def run_mesh(c, n, meshes, groups, rank, results, seen):
    ps = sharded(MESH_SHAPES, c["dtype"], meshes[n])
    opt = getattr(otorch, c["cls"])(ps, **c["kw"])
    for step in range(STEPS):
        fulls = set_grads(ps, meshes[n], step)
        if "max_norm" in c:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(f) for f in fulls]))
            opt.fused_step(max_norm=c["max_norm"], grad_norm=norm)
        else:
            opt.step()
    got = whole(opt, ps, groups[n])
    quant = [isinstance(opt.state[p]["exp_avg"], QuantState) for p in ps]
    if rank == 0:
        seen[n] = got
        if n == 1:
            results["info"]["quantized"] = quant
        # a block two ranks share: the 64 x 96 param on 2 ranks ends a shard mid-block
        if n > 1:  # the params whose shards end inside a block on this mesh
            results["info"][f"split_{n}"] = [p._local_tensor.numel() % opt.block_size != 0 for p in ps]


ALIGNED_SHAPES = [(32, 256), (10, 10)]  # shards of whole blocks on 1 and 2 ranks, and a small one


def torchao_case(meshes, rank, results):
    from torchao.optim import AdamW8bit as TAO8
    for n in (1, 2):
        try:
            if rank < n:
                torchao_steps(TAO8, n, meshes, rank, results)
        except Exception:  # recorded; every rank still meets the barrier below
            results["errors"].append(f"rank {rank} of {n}: " + traceback.format_exc())
        dist.barrier()


def torchao_steps(TAO8, n, meshes, rank, results):
    # f32 params: torchao 0.18 cannot step bf16 DTensors with quantized
    # states on the CPU (its compiled step views an OptimState8bit as
    # another dtype: NotImplementedError), see torchao_bf16 below
    pa = sharded(ALIGNED_SHAPES, torch.float32, meshes[n])
    pb = sharded(ALIGNED_SHAPES, torch.float32, meshes[n])
    ao, oc = TAO8(pa, lr=1e-2), otorch.AdamW8bit(pb, lr=1e-2)
    for step in range(STEPS):
        set_grads(pa, meshes[n], step)
        set_grads(pb, meshes[n], step)
        ao.step()
        oc.step()
        for i, (x, y) in enumerate(zip(pa, pb)):
            if not torch.equal(x._local_tensor.view(torch.int32), y._local_tensor.view(torch.int32)):
                results["errors"].append(f"rank {rank} of {n}: step {step + 1}: param {i} differs")
            for k in ("exp_avg", "exp_avg_sq"):
                a, b = ao.state[x][k], oc.state[y][k]
                a = a._local_tensor if isinstance(a, DTensor) else a
                if isinstance(b, QuantState):
                    ok = hasattr(a, "codes") and torch.equal(a.codes.reshape(-1), b.codes.reshape(-1)) and \
                        torch.equal(a.scale.view(torch.int32), b.scale.view(torch.int32))
                else:
                    b = b._local_tensor if isinstance(b, DTensor) else b
                    ok = not hasattr(a, "codes") and torch.equal(a.view(torch.int32), b.view(torch.int32))
                if not ok:
                    results["errors"].append(f"rank {rank} of {n}: step {step + 1}: param {i} {k} differs")


def torchao_mesh(meshes, groups, rank, results):
    """torchao's states follow each rank's shard: documented, not a failure of optc's."""
    from torchao.optim import AdamW8bit as TAO8
    seen = {}
    for n in (1, 2):
        if rank < n:
            ps = sharded([(64, 96)], torch.float32, meshes[n])
            ao = TAO8(ps, lr=1e-2)
            for step in range(STEPS):
                set_grads(ps, meshes[n], step)
                ao.step()
            local = ao.state[ps[0]]["exp_avg"]
            local = local._local_tensor if isinstance(local, DTensor) else local
            full = ps[0].full_tensor()
            if rank == 0:
                seen[n] = (type(local).__name__, digest(full))
        dist.barrier()
    if rank == 0:
        results["info"]["torchao_state_1_rank"] = seen[1][0]
        results["info"]["torchao_state_2_ranks"] = seen[2][0]
        results["info"]["torchao_params_same"] = seen[1][1] == seen[2][1]


def main():
    out = sys.argv[1]
    only = set(sys.argv[2:])  # case names, for debugging; default all
    if os.environ.get("OPTC_HANG_DUMP"):  # every rank's stacks after this many seconds
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["OPTC_HANG_DUMP"]), exit=True)
    import datetime
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 3, "run with 3 ranks"
    torch.set_num_threads(1)
    groups = {n: dist.new_group(list(range(n))) for n in (1, 2, 3)}
    meshes = {n: DeviceMesh.from_group(groups[n], "cpu") if rank < n else None for n in (1, 2, 3)}
    report = {"world": world, "cases": {}}
    cases = [(name, lambda name=name, c=c: mesh_case(name, c, meshes, groups, rank, res)) for name, c in
             MESH_CASES.items()]
    cases += [("torchao_same_mesh", lambda: torchao_case(meshes, rank, res)),
              ("torchao_mesh", lambda: torchao_mesh(meshes, groups, rank, res))]
    for name, fn in cases:
        if only and name not in only:
            continue
        res = {"errors": [], "info": {}}
        try:
            fn()
        except Exception:
            res["errors"].append(f"rank {rank}: " + traceback.format_exc())
        # every rank's errors to rank 0
        allres = [None] * world
        dist.all_gather_object(allres, res)
        merged = {"errors": [e for r in allres for e in r["errors"]], "info": allres[0]["info"]}
        report["cases"][name] = merged
        dist.barrier()
    if rank == 0:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(out)))
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    from leave import leave  # (after main: an exception in it exits as Python does)
    leave()
