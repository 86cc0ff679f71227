"""torchao's AdamW8bit and AdamW4bit, stepped by optc.

The arithmetic is torchao 0.18's single_param_adam as torch.compile runs
it (its default path), op for op in f32, and the states are torchao's: a
param of at least 4096 elements whose count is a multiple of the block
keeps each moment as codes (8-bit: uint8, the param's shape; 4-bit: two a
byte, flat, element 2k in byte k's high nibble) of torchao's code books
and an f32 scale per block of 256 (128) elements of the flattened param;
any other param keeps plain states of its own dtype. optc computes
torchao's bits: params, codes and scales (tests/torch/test_lowbit.py).

The states live in self.state as QuantState objects (their codes and
scales are the tensors optc steps in place); state_dict() gives torchao's
own tensor subclasses (OptimState8bit, OptimState4bit) where torchao is
installed, so it loads into torchao's optimizer, and load_state_dict()
takes either.

Sharded params (FSDP2's dim-0 shards, DTensors): the threshold and the
blocks are the whole tensor's, not each rank's shard's (torchao quantizes
each shard on its own, so its states' precision depends on the mesh). A
rank keeps the codes and scales of every block its shard touches; a block
that spans two ranks (the shards end anywhere) is kept by both, and each
computes the whole block: the params and grads of its other part come from
the other rank (one all-gather a step of those edge elements, f32), and
both ranks compute the same bits. So 1, 2 or 3 ranks give the same states
and params (tests/torch/test_lowbit_dist.py).
"""
import ctypes
import functools
import math
import sys

import torch
import torch.optim

from .. import _capi
from . import _dist
from ._optimizer import OPTC_DTYPE, Build, OptcOptimizer, ParamState, _where_of, next_step

__all__ = ["AdamW8bit", "AdamW4bit", "QuantState"]

_BOOK = {(8, True): "dyn8s", (8, False): "dyn8u", (4, True): "dyn4s", (4, False): "lin4u"}
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
_SIGNED = {"exp_avg": True, "exp_avg_sq": False, "max_exp_avg_sq": False}
THRESHOLD = 4096  # torchao (after bitsandbytes) quantizes tensors of at least this many elements


@functools.lru_cache(maxsize=None)
def _book_values(bits, signed):
    return tuple(_capi.code_book(_BOOK[bits, signed]))


def qmap(bits, signed, device=None):
    """The code book of bits and signedness as an f32 tensor: torchao's qmap."""
    return torch.tensor(_book_values(bits, signed), dtype=torch.float32, device=device)


def _torchao_classes():
    try:
        from torchao.optim.subclass_4bit import OptimState4bit
        from torchao.optim.subclass_8bit import OptimState8bit
    except ImportError:
        return None
    return OptimState8bit, OptimState4bit


class QuantState:
    """A quantized state of one param, as optc steps it: `codes` (uint8; for
    an unsharded 8-bit state the param's shape, else flat; 4-bit: two a
    byte) and `scale` (f32, one per block) of the param's elements [lo, hi)
    (the whole param, or on a rank of a sharded one the blocks its shard
    touches), of a param of `numel` elements shaped `shape` and of dtype
    `dtype`."""

    def __init__(self, codes, scale, bits, signed, block_size, shape, dtype, lo=0, hi=None):
        self.codes, self.scale = codes, scale
        self.bits, self.signed, self.block_size = int(bits), bool(signed), int(block_size)
        self.shape, self.dtype = torch.Size(shape), dtype
        self.numel = math.prod(self.shape)
        self.lo, self.hi = int(lo), int(self.numel if hi is None else hi)

    @classmethod
    def zeros(cls, shape, bits, signed, block_size, dtype, device, lo=0, hi=None):
        numel = math.prod(shape)
        hi = numel if hi is None else hi
        n = hi - lo
        if bits == 8:
            codes = torch.zeros(shape if (lo, hi) == (0, numel) else (n,), dtype=torch.uint8, device=device)
        else:
            codes = torch.zeros((n + 1) // 2, dtype=torch.uint8, device=device)
        scale = torch.zeros((n + block_size - 1) // block_size, dtype=torch.float32, device=device)
        return cls(codes, scale, bits, signed, block_size, shape, dtype, lo, hi)

    @property
    def sharded(self):
        return (self.lo, self.hi) != (0, self.numel)

    def dequantize(self):
        """The f32 values of elements [lo, hi), flat: code book times scale."""
        c = self.codes.reshape(-1)
        if self.bits == 4:
            c = torch.stack([c >> 4, c & 15], dim=-1).reshape(-1)[:self.hi - self.lo]
        v = qmap(self.bits, self.signed, c.device)[c.long()]
        return v * self.scale.repeat_interleave(self.block_size)[:v.numel()]

    def to_torchao(self):
        """torchao's OptimState8bit or OptimState4bit holding the same codes
        and scale (the same memory), or None without torchao."""
        cls = _torchao_classes()
        if cls is None:
            return None
        if self.sharded:
            raise ValueError("a sharded param's quantized state has no torchao form: torchao quantizes each rank's "
                             "shard on its own, optc the whole tensor (QuantState.gather gives the whole state)")
        q = qmap(self.bits, self.signed, self.codes.device)
        if self.bits == 8:
            return cls[0](self.codes, self.scale, q, self.signed, dtype=self.dtype)
        return cls[1](self.codes, self.scale, q, self.signed, self.shape, dtype=self.dtype)

    @classmethod
    def from_torchao(cls, t, bits):
        """A QuantState over the memory of torchao's OptimState8bit or
        OptimState4bit t (whose code book must be optc's)."""
        want = qmap(bits, t.signed, t.qmap.device)
        if not torch.equal(t.qmap.float(), want):
            raise ValueError("this state's code book is not torchao's default one, which optc's code holds")
        return cls(t.codes, t.scale, bits, t.signed, t.block_size, tuple(t.shape), t.dtype)

    def gather(self, group=None):
        """The whole param's codes and scale (flat) from every rank of a
        sharded state (a collective: every rank calls it), else its own."""
        if not self.sharded:
            return self.codes.reshape(-1), self.scale
        import torch.distributed as dist
        B, n = self.block_size, self.numel
        per = 8 // self.bits
        mine = torch.tensor([self.lo, self.hi], dtype=torch.int64)
        ranges = [torch.zeros(2, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
        dist.all_gather(ranges, mine, group=group)
        nbytes = (n + per - 1) // per
        codes = torch.zeros(nbytes, dtype=torch.uint8)
        scale = torch.zeros(n // B, dtype=torch.float32)
        width = max(int(r[1] - r[0]) for r in ranges)
        bufc = torch.zeros((width + per - 1) // per, dtype=torch.uint8)
        bufc[:self.codes.numel()] = self.codes.reshape(-1).cpu()
        bufs = torch.zeros((width + B - 1) // B, dtype=torch.float32)
        bufs[:self.scale.numel()] = self.scale.cpu()
        allc = [torch.zeros_like(bufc) for _ in ranges]
        alls = [torch.zeros_like(bufs) for _ in ranges]
        dist.all_gather(allc, bufc, group=group)
        dist.all_gather(alls, bufs, group=group)
        for (lo, hi), c, s in zip(ranges.__reversed__(), allc.__reversed__(), alls.__reversed__()):
            lo, hi = int(lo), int(hi)  # rank order reversed: the lowest rank's copy of a shared block stays
            if hi > lo:
                codes[lo // per:(hi + per - 1) // per] = c[:(hi - lo + per - 1) // per]
                scale[lo // B:(hi + B - 1) // B] = s[:(hi - lo + B - 1) // B]
        return codes, scale

    def __repr__(self):
        where = f", elements [{self.lo}, {self.hi})" if self.sharded else ""
        return (f"QuantState({self.bits}-bit, {'signed' if self.signed else 'unsigned'}, block_size={self.block_size}, "
                f"shape={tuple(self.shape)}{where})")


def _shard_range(p):
    """A DTensor param's local shard as a range [a, b) of its flattened
    elements: FSDP2's dim-0 shard (torch.chunk's rows of each rank). None
    for a plain tensor. ValueError for other shardings."""
    if not _dist.is_dtensor(p):
        return None
    from torch.distributed.tensor.placement_types import Replicate, Shard
    pls = tuple(p.placements)
    sharded = [d for d, pl in enumerate(pls) if isinstance(pl, Shard)]
    if any(not isinstance(pl, (Shard, Replicate)) for pl in pls) or len(sharded) > 1 or \
            (sharded and pls[sharded[0]].dim != 0):
        raise ValueError(f"optc's quantized states shard a param on its dim 0 (FSDP2's default), in runs of its "
                         f"flattened elements; this one is placed {pls}")
    if not sharded:
        return 0, p.numel()
    mesh = p.device_mesh
    d = sharded[0]
    n, r = mesh.size(d), mesh.get_local_rank(d)
    rows = p.shape[0]
    per_row = p.numel() // rows if rows else 0
    c = (rows + n - 1) // n
    a, b = min(r * c, rows), min((r + 1) * c, rows)
    lp = _dist.local(p)
    if (b - a) * per_row != lp.numel():
        raise ValueError(f"the local shard has {lp.numel()} elements; FSDP2's dim-0 shard of rank {r} of {n} would "
                         f"have {(b - a) * per_row}")
    return a * per_row, b * per_row


def _all_ranges(p):
    """Every rank's range (as _shard_range) of a dim-0 sharded DTensor, in
    rank order, and the process group of its mesh dim."""
    from torch.distributed.tensor.placement_types import Shard
    pls = tuple(p.placements)
    d = next(i for i, pl in enumerate(pls) if isinstance(pl, Shard))
    mesh = p.device_mesh
    n = mesh.size(d)
    rows = p.shape[0]
    per_row = p.numel() // rows if rows else 0
    c = (rows + n - 1) // n
    return [(min(r * c, rows) * per_row, min((r + 1) * c, rows) * per_row) for r in range(n)], mesh.get_group(d)


class _LowBitAdamW(OptcOptimizer, torch.optim.Optimizer):
    _bits = 8

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 block_size=None, bf16_stochastic_round=False, stochastic_rounding=False, seed=0,
                 compensation=None, nonfinite="propagate", threads=None, in_backward=False, max_norm=None,
                 speculate=False):
        # torchao's checks and messages
        if not 0.0 <= lr:
            raise ValueError("Invalid learning rate: {}".format(lr))
        if not 0.0 <= eps:
            raise ValueError("Invalid epsilon value: {}".format(eps))
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError("Invalid beta parameter at index 0: {}".format(betas[0]))
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError("Invalid beta parameter at index 1: {}".format(betas[1]))
        block_size = (256 if self._bits == 8 else 128) if block_size is None else int(block_size)
        if block_size < 16 or block_size > 4096 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two from 16 to 4096 (optc's blocks), not {block_size}")
        self.block_size = block_size
        self.bf16_stochastic_round = bool(bf16_stochastic_round)
        self.is_adamw = True
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        torch.optim.Optimizer.__init__(self, params, defaults)
        # torchao's bf16_stochastic_round is optc's stochastic rounding of bf16
        # params (optc's stream, keyed on seed: reproducible, not torch's RNG's bits)
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate,
                         stochastic_rounding or self.bf16_stochastic_round, seed, compensation)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        # torchao keeps lr as an f32 0-dim tensor
        group = self.param_groups[-1]
        if not torch.is_tensor(group["lr"]):
            group["lr"] = torch.tensor(group["lr"], dtype=torch.float32)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)

    # ---- what optc builds and runs -------------------------------------------------------

    def _optc_build(self, group):
        return Build(f"torchao.optim.AdamW{self._bits}bit", False,
                     (("amsgrad", int(bool(group["amsgrad"]))), ("block_size", self.block_size)))

    def _optc_scalars(self, group):
        b1, b2 = group["betas"]
        return {"lr": float(group["lr"]), "beta1": float(b1), "beta2": float(b2), "eps": float(group["eps"]),
                "weight_decay": float(group["weight_decay"])}

    def _quantized(self, p):
        n = p.numel()
        return n >= THRESHOLD and n % self.block_size == 0

    def _new_state(self, p, signed):
        """A zero state for p as torchao makes it, but with the threshold and
        blocks of the whole tensor: quantized, or zeros_like(p)."""
        if not self._quantized(p):
            return torch.zeros_like(p, memory_format=torch.preserve_format)
        lp = _dist.local(p)
        rng = _shard_range(p)
        if rng is None or rng == (0, p.numel()):
            return QuantState.zeros(tuple(p.shape), self._bits, signed, self.block_size, p.dtype, lp.device)
        a, b = rng
        B = self.block_size
        lo, hi = (a // B * B, min((b + B - 1) // B * B, p.numel())) if b > a else (a, a)
        return QuantState.zeros(tuple(p.shape), self._bits, signed, B, p.dtype, lp.device, lo, hi)

    def _as_state(self, state, key, p):
        """state[key] as optc runs it: a QuantState (from torchao's subclass
        where a state_dict put one) or a plain tensor."""
        v = state[key]
        # (only torchao makes its states: where it is not imported, none is
        # one, and importing it would cost the first step ~0.4 s)
        cls = _torchao_classes() if "torchao.optim" in sys.modules else None
        if cls is not None and isinstance(v, cls):
            v = state[key] = QuantState.from_torchao(v, self._bits)
        return v

    def _optc_state(self, group, p, g):
        state = self.state[p]
        if len(state) == 0:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = self._new_state(p, True)
            state["exp_avg_sq"] = self._new_state(p, False)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = self._new_state(p, False)
        keys = _MOMENTS if group["amsgrad"] else _MOMENTS[:2]
        names, tensors, quant = (), (), None
        for k in keys:
            if k not in state:
                raise KeyError(f"{type(self).__name__}: its state has no {k!r} (made before amsgrad was set)")
            v = self._as_state(state, k, p)
            if isinstance(v, QuantState):
                names += (k, k + ".scale")
                tensors += (v.codes, v.scale)
                quant = v
            else:
                names += (k,)
                tensors += (v,)
        t = state["step"]
        code = None
        if quant is not None:
            code = _capi.OPTC_U8 if self._bits == 8 else _capi.OPTC_U4
        return ParamState(names, tensors, next_step(t), t, (), code)

    def _optc_check_states(self, lp, st, local_states, where):
        if st.state_dtype is None:
            return super()._optc_check_states(lp, st, local_states, where)
        for nm, t in zip(st.names, local_states):
            ok = t.device == lp.device and t.is_contiguous() and \
                t.dtype == (torch.float32 if nm.endswith(".scale") else torch.uint8)
            if not ok:
                raise ValueError(f"{type(self).__name__}: {where}: its quantized state '{nm}' ({t.dtype}, "
                                 f"{tuple(t.shape)}, on {t.device}) does not fit it")

    def _optc_run(self, r, prog, scalars, threads):
        if r.layout.optimizer == "optc.grad_norm" or not r.params or r.reduce is None or \
                r.layout.state_dtype not in (_capi.OPTC_U8, _capi.OPTC_U4):
            return super()._optc_run(r, prog, scalars, threads)
        return self._run_sharded(r, prog, scalars, threads)

    # ---- sharded quantized states: blocks that span ranks ---------------------------------

    def _run_sharded(self, r, prog, scalars, threads):
        """A run of dim-0 shards with quantized states: each param's whole
        blocks in place, and each block its shard shares with another rank
        whole, from both ranks' params and grads (gathered), on a copy."""
        if self._optc_inbwd is not None:
            raise ValueError(f"{type(self).__name__}: in_backward=True with sharded params and quantized states: "
                             f"a block two ranks share needs both ranks' grads, which a backward hook does not have")
        B = self.block_size
        per = 8 // self._bits
        owners = [p for p, g in zip(r.owners, r.owner_grads) if g is not None]
        parts = []  # per param: (p, lp, lg, states, a, b, ranges)
        group = None
        for p, lp, lg, sts in zip(owners, r.params, r.grads, r.states):
            ranges, group = _all_ranges(p)
            a, b = _shard_range(p)
            parts.append((p, lp, lg, sts, a, b, ranges))
        # the edges: each rank's elements in blocks it shares, per param, as f32
        def edges(a, b):
            out = []
            if a % B and a < b:
                out.append((a, min(b, (a // B + 1) * B)))
            if b % B and b > a and (not out or out[-1][1] < b):
                out.append((max(a, b // B * B), b))
            return out
        import torch.distributed as dist
        world = dist.get_world_size(group)
        lens = [0] * world
        for *_, ranges in parts:
            for rk, (ra, rb) in enumerate(ranges):
                lens[rk] += 2 * sum(e1 - e0 for e0, e1 in edges(ra, rb))
        width = max(lens) if lens else 0
        mine = torch.zeros(width, dtype=torch.float32)
        at = 0
        for p, lp, lg, sts, a, b, ranges in parts:
            for e0, e1 in edges(a, b):
                n = e1 - e0
                mine[at:at + n] = lp.reshape(-1)[e0 - a:e1 - a].float()
                mine[at + n:at + 2 * n] = lg.reshape(-1)[e0 - a:e1 - a].float()
                at += 2 * n
        gathered = [torch.zeros(width, dtype=torch.float32) for _ in range(world)]
        if width:
            dist.all_gather(gathered, mine, group=group)
        offs = [0] * world  # where each rank's next edge starts in its buffer
        numel, params, grads, states = [], [], [], []
        keep = []  # temporaries, alive for the call
        back = []  # (temp param, local param, where in the temp, where in the local) to copy back
        for p, lp, lg, sts, a, b, ranges in parts:
            esz = lp.element_size()
            qs = [self.state[p][k] for k in _MOMENTS if k in self.state[p] and isinstance(self.state[p][k], QuantState)]
            lo = qs[0].lo
            # where each rank's edges lie in its gathered buffer
            rank_edges = []
            for rk, (ra, rb) in enumerate(ranges):
                es = []
                for e0, e1 in edges(ra, rb):
                    es.append((e0, e1, offs[rk]))
                    offs[rk] += 2 * (e1 - e0)
                rank_edges.append(es)
            i0, i1 = (a + B - 1) // B * B, b // B * B
            if i1 > i0:  # the whole blocks: in place
                numel.append(i1 - i0)
                params.append(lp.data_ptr() + (i0 - a) * esz)
                grads.append(lg.data_ptr() + (i0 - a) * esz)
                states.append([(q.codes.data_ptr() + (i0 - lo) // per, q.scale.data_ptr() + (i0 - lo) // B * 4)
                               for q in qs])
            for e0, e1 in edges(a, b):  # each shared block: whole, on a copy
                k0 = e0 // B * B
                k1 = min(k0 + B, p.numel())
                tp = torch.empty(k1 - k0, dtype=lp.dtype)
                tg = torch.empty(k1 - k0, dtype=lg.dtype)
                for rk, es in enumerate(rank_edges):
                    for f0, f1, off in es:
                        if f0 >= k0 and f1 <= k1:
                            n = f1 - f0
                            buf = gathered[rk]
                            tp[f0 - k0:f1 - k0] = buf[off:off + n].to(lp.dtype)
                            tg[f0 - k0:f1 - k0] = buf[off + n:off + 2 * n].to(lg.dtype)
                keep += [tp, tg]
                numel.append(k1 - k0)
                params.append(tp.data_ptr())
                grads.append(tg.data_ptr())
                states.append([(q.codes.data_ptr() + (k0 - lo) // per, q.scale.data_ptr() + (k0 - lo) // B * 4)
                               for q in qs])
                back.append((tp, lp, e0 - k0, e1 - k0, e0 - a))
        n = len(numel)
        # the program's states, in its order: each moment's codes, then its scales
        names = [nm for nm, _, _, _ in prog.states]
        sptr = []
        for nm in names:
            base = nm[:-len(".scale")] if nm.endswith(".scale") else nm
            k = [m for m in _MOMENTS if m in self.state[owners[0]] and
                 isinstance(self.state[owners[0]][m], QuantState)].index(base)
            sptr += [st[k][1 if nm.endswith(".scale") else 0] for st in states]
        c_numel = (ctypes.c_int64 * n)(*numel)
        c_param = (ctypes.c_void_p * n)(*params)
        c_grad = (ctypes.c_void_p * n)(*grads)
        c_state = (ctypes.c_void_p * max(1, len(sptr)))(*sptr)
        scalars.pop("torch_threads", None)
        if "seed" in prog.scalars:
            scalars["seed"] = float(self._optc_seed)
        try:
            res = prog.run(n, c_numel, c_param, c_grad, c_state, scalars, threads)
        except _capi.OptcError as e:
            raise type(e)(f"{type(self).__name__}: {_where_of(r)}: {e}", e.code) from None
        for tp, lp, t0, t1, l0 in back:  # this rank's part of each shared block
            lp.view(-1)[l0:l0 + (t1 - t0)] = tp[t0:t1]
        return res

    # ---- torchao's state_dict -------------------------------------------------------------

    def state_dict(self):
        """torch.optim's state_dict, each quantized state as torchao's
        OptimState8bit/OptimState4bit (where torchao is installed and the
        param is not sharded), so that torchao's optimizer loads it."""
        sd = super().state_dict()
        for st in sd["state"].values():
            for k, v in list(st.items()):
                if isinstance(v, QuantState) and not v.sharded:
                    t = v.to_torchao()
                    if t is not None:
                        st[k] = t
        return sd

    def load_state_dict(self, state_dict):
        """torch.optim's, taking torchao's quantized states (or optc's) as
        they are: codes and scales are not cast to the param's dtype."""
        cls = _torchao_classes() or ()
        quant = {}
        sd = dict(state_dict)
        sd["state"] = {}
        for pid, st in state_dict["state"].items():
            st = dict(st)
            for k, v in list(st.items()):
                if isinstance(v, QuantState) or (cls and isinstance(v, cls)):
                    quant[pid, k] = st.pop(k)
            sd["state"][pid] = st
        super().load_state_dict(sd)
        params = [p for g in self.param_groups for p in g["params"]]
        for (pid, k), v in quant.items():
            p = params[pid]
            if cls and isinstance(v, cls):
                v = QuantState.from_torchao(v, self._bits)
            v.codes, v.scale = v.codes.to(_dist.local(p).device), v.scale.to(_dist.local(p).device)
            self.state[p][k] = v
        for group in self.param_groups:  # torchao's lr is an f32 tensor; a float lr from elsewhere becomes one
            if not torch.is_tensor(group["lr"]):
                group["lr"] = torch.tensor(group["lr"], dtype=torch.float32)


class AdamW8bit(_LowBitAdamW):
    """torchao.optim.AdamW8bit, stepped by optc: torchao's bits (params, codes,
    scales), its constructor (lr, betas, eps, weight_decay, amsgrad,
    block_size=256, bf16_stochastic_round) and its states; the threshold
    and blocks of a sharded param are the whole tensor's. Also optc's
    nonfinite, threads, max_norm, stochastic_rounding/seed and compensation."""

    _bits = 8


class AdamW4bit(_LowBitAdamW):
    """torchao.optim.AdamW4bit, stepped by optc (block_size=128): as AdamW8bit."""

    _bits = 4
