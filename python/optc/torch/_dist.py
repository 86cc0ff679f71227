"""Sharded params: FSDP2's DTensors, stepped on their local shards.

FSDP2 (`fully_shard`) holds every param, grad and optimizer state as a
DTensor whose own data_ptr() is 0; its memory is the local shard
(`to_local()`, here `_local_tensor`, which to_local() returns under
no_grad). An element-wise step is the same on the shard as on the whole,
so optc runs the shard; only what spans every element, the clip norm and
the decision to skip on a non-finite grad, needs the other ranks.

The total norm's square is each rank's f64 sum of squares of its shards,
gathered over the mesh dims on which the grads are sharded and summed in
rank order on every rank: one all-gather per mesh dim, and the same bits on
every rank whatever the timing (an all-reduce sums in an order its
algorithm picks).
"""
import torch

try:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial, Shard
except ImportError:  # a torch built without distributed
    dist = None
    DTensor = Partial = Shard = None


def is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def local(t):
    """The tensor whose memory optc runs: a DTensor's local shard, else t."""
    if DTensor is not None and isinstance(t, DTensor):
        return t._local_tensor
    return t


class ReduceKey:
    """Where a grad's sum of squares must be summed: the mesh and its dims on
    which the grad is sharded. Equal keys compare equal (the mesh's own
    equality)."""

    __slots__ = ("mesh", "dims", "_hash")

    def __init__(self, mesh, dims):
        self.mesh, self.dims = mesh, dims
        self._hash = hash((id(mesh), dims))

    def __eq__(self, other):
        return isinstance(other, ReduceKey) and self.dims == other.dims and \
            (self.mesh is other.mesh or self.mesh == other.mesh)

    def __hash__(self):
        return self._hash


def reduce_key(p, g, what):
    """The ReduceKey of a DTensor param's grad, or None for plain tensors (and
    for DTensors replicated on every mesh dim: nothing to sum). Raises
    ValueError where p and g do not describe one sharding."""
    pd, gd = is_dtensor(p), is_dtensor(g)
    if not pd and not gd:
        return None
    if pd != gd:
        raise TypeError(f"{what}: the param is {'a DTensor' if pd else 'a plain tensor'} but its grad is "
                        f"{'a DTensor' if gd else 'a plain tensor'}; optc steps a shard with its own grad")
    if g.device_mesh != p.device_mesh or tuple(g.placements) != tuple(p.placements):
        raise ValueError(f"{what}: the grad's sharding ({g.placements} on {g.device_mesh}) is not the param's "
                         f"({p.placements} on {p.device_mesh})")
    dims = []
    for d, pl in enumerate(g.placements):
        if isinstance(pl, Partial):
            raise ValueError(f"{what}: the grad is Partial on mesh dim {d} (not yet reduced); optc steps "
                             f"reduced grads, as torch.optim does after FSDP's reduce-scatter")
        if isinstance(pl, Shard):
            dims.append(d)
    if not dims:
        return None
    return ReduceKey(g.device_mesh, tuple(dims))


def sum_over_ranks(key, value):
    """The f64 sum of `value` over the ranks of key's mesh dims, in rank order:
    one all-gather per dim, so that every rank gets the same bits."""
    mesh = key.mesh
    device = mesh.device_type if mesh.device_type != "cpu" else "cpu"
    if device != "cpu":
        device = torch.device(device, torch.accelerator.current_device_index()
                              if hasattr(torch, "accelerator") else torch.cuda.current_device())
    for d in key.dims:
        group = mesh.get_group(d)
        n = dist.get_world_size(group)
        if n == 1:
            continue
        mine = torch.tensor([value], dtype=torch.float64, device=device)
        out = torch.empty(n, dtype=torch.float64, device=device)
        dist.all_gather_into_tensor(out, mine, group=group)
        value = 0.0
        for v in out.tolist():  # rank order
            value += v
    return value
