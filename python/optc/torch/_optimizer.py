"""The step machinery shared by optc.torch's optimizers.

How a step runs, in torch.optim's terms: each param group is gathered by
`_optc_init_group` (torch's `_init_group`: the params with a grad, their
states made lazily as torch makes them), into *runs*: the params of one
layout (device, dtypes, state names, step count and, for a DTensor, its
sharding). Each run is one program of liboptc (`_capi.Step`), built once
per layout and cached on the optimizer, and run in place on the
tensors' own memory (a DTensor's local shard). Hyperparameters are the
program's runtime scalars: changing lr never rebuilds one.
"""
import contextlib
import ctypes
import math
import warnings
from typing import NamedTuple, Optional

import torch
import torch.optim

from .. import _capi
from . import _dist

try:
    from torch.optim.optimizer import _get_scalar_dtype
except ImportError:  # torch moved it: the same rule
    def _get_scalar_dtype(is_fused=None):
        if is_fused:
            return torch.float32
        return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32

try:
    from torch.optim.optimizer import _device_dtype_check_for_fused
except ImportError:
    def _device_dtype_check_for_fused(p, cuda_unsupported=False):
        if not torch.is_floating_point(p):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors")

OPTC_DTYPE = {torch.float32: _capi.OPTC_F32, torch.bfloat16: _capi.OPTC_BF16, torch.float16: _capi.OPTC_F16}
NONFINITE = {"propagate": _capi.OPTC_NONFINITE_PROPAGATE, "skip": _capi.OPTC_NONFINITE_SKIP,
             "error": _capi.OPTC_NONFINITE_ERROR}
_CLIP_NAMES = {_capi.OPTC_CLIP_NONE: "none", _capi.OPTC_CLIP_NORM: "norm", _capi.OPTC_CLIP_GIVEN: "given"}
_BOOLS = {"amsgrad", "maximize", "nesterov", "centered", "stochastic_rounding", "kahan"}
_STEP_CTYPES = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}
_LOW = (torch.bfloat16, torch.float16)
_STRIDED = torch.strided
disable_dynamo = getattr(torch, "_disable_dynamo", lambda f: f)


# ---- torch's sqrt ----------------------------------------------------------------------------

_TORCH_CPU = []
# Which of the probe's inputs MKL's AVX-512 vsSqrt leaves 1 ulp under IEEE
# (torch 2.15's MKL on an Intel Xeon; optc's model, compiler/numerics_mkl.h,
# gives the same 22).
_MKL_AVX512_LOW = (44, 232, 267, 338, 371, 609, 724, 947, 993, 1009, 1107, 1342, 1416, 1980, 3042, 3078, 3096,
                   3372, 3478, 3645, 3659, 4074)


def torch_cpu():
    """The recipe's torch_cpu that gives this torch's bits: "avx512" where its
    f32 sqrt is MKL's AVX-512 one (rsqrt14 and a Newton step, 1 ulp under
    IEEE on 0.6% of inputs), "avx2" where it is IEEE's, "amd" where it is
    MKL's generic kernel (on CPUs MKL does not take for Intel's: this CPU's
    RSQRTPS and a Newton step without fma, 1 ulp off IEEE on about a sixth
    of inputs), and None where it is none of these, which optc does not
    model.

    torch's CPU capability does not decide it: MKL picks its own kernels, by
    the CPU's vendor as well as its features (an AMD EPYC with AVX-512 runs
    the generic kernel). So this asks torch: the square roots of 4096 fixed
    floats in [1, 4), against IEEE's (math.sqrt's double rounded to f32:
    exact for sqrt), the AVX-512 kernel's known 22 and optc's model of the
    generic one on this CPU (optc_torch_sqrt). Asked once per process."""
    if not _TORCH_CPU:
        vals = [1.0 + 3.0 * ((k * 0.7548776662466927) % 1.0) for k in range(4096)]
        xs = torch.tensor(vals, dtype=torch.float32)
        got = torch.sqrt(xs).tolist()
        low = tuple(k for k, (x, y) in enumerate(zip(xs.tolist(), got)) if ctypes.c_float(math.sqrt(x)).value != y)
        if not low:
            found = "avx2"
        elif low == _MKL_AVX512_LOW:
            found = "avx512"
        else:
            found = "amd" if _capi.torch_sqrt("amd", xs.tolist()) == got else None
        _TORCH_CPU.append(found)
        if found is None:
            warnings.warn(f"optc: torch's f32 sqrt on this CPU is none of the MKL kernels optc models ({len(low)} "
                          "of 4096 probe inputs differ from IEEE); optc's f32 for-loop steps that take a square root "
                          "(Adam, AdamW, RMSprop, Adagrad) use IEEE's and may differ from torch's by 1 ulp",
                          RuntimeWarning, stacklevel=3)
    return _TORCH_CPU[0]


# ---- what the subclasses say, and what identifies a program -------------------------------------

class Build(NamedTuple):
    """What optc fixes when it builds a group's step (a subclass's _optc_build)."""
    optimizer: str  # optc's name, e.g. "torch.optim.AdamW"
    fused: bool
    options: tuple  # ((name, value), ...): bools as 0/1, hyperparameters whose zero-ness is built in


class ParamState(NamedTuple):
    """A param's state as this step runs it (a subclass's _optc_state)."""
    names: tuple  # the state names, in the order of `tensors`
    tensors: tuple  # torch's state tensors (DTensors where the param is one)
    step: float  # the step count the program runs with (after torch's increment)
    bump: Optional[torch.Tensor]  # torch's step tensor, incremented after the step; None: none
    new: tuple  # ((name, tensor), ...): put into self.state[p] once the step is taken
    state_dtype: Optional[int] = None  # the program's state dtype (OPTC_U8, OPTC_U4: quantized states);
    #                                    None: the state tensors' own


class Layout(NamedTuple):
    """What identifies a program but its clip and nonfinite mode."""
    target: int
    device_index: Optional[int]
    optimizer: str
    param_dtype: int
    state_dtype: int
    fused: bool
    flags: tuple  # the options as the build fixes them: bools, nonzero(x)


class ProgramKey(NamedTuple):
    layout: Layout
    clip: int
    nonfinite: str
    group: int  # each param group has its own programs (a program keeps its last tensor table)


def layout_of(device, pdtype, sdtype, build, state_code=None):
    """state_code: the program's state dtype as optc's code, where it is not
    a torch dtype (quantized states)."""
    cuda = device.type == "cuda"
    flags = tuple(n if n in _BOOLS else f"nonzero({n})" for n, v in build.options if v != 0)
    return Layout(_capi.OPTC_TARGET_CUDA if cuda else _capi.OPTC_TARGET_CPU, device.index if cuda else None,
                  build.optimizer, OPTC_DTYPE[pdtype], OPTC_DTYPE[sdtype] if state_code is None else state_code,
                  bool(build.fused), flags)


class Where(NamedTuple):
    group: int
    index_in_group: int
    index: int  # over every group, as torch numbers params in state_dict

    def __str__(self):
        return f"param {self.index} (param_groups[{self.group}]['params'][{self.index_in_group}])"


class Run:
    """The tensors one program runs this step: one layout, one step count,
    one param group, one sharding. `params`, `grads` and `states` hold the
    local tensors with elements (an empty shard has none to run, but its
    step count and new states are committed with the rest)."""

    __slots__ = ("group_index", "layout", "options", "step", "device", "state_names", "reduce", "params", "grads",
                 "states", "where", "owners", "owner_grads", "bumps", "new_states", "written", "program",
                 "grad_scale")

    def __init__(self, group_index, layout, options, step, device, state_names, reduce):
        self.group_index, self.layout, self.options = group_index, layout, options
        self.step, self.device, self.state_names, self.reduce = step, device, state_names, reduce
        self.params, self.grads, self.states, self.where = [], [], [], []
        self.owners, self.owner_grads = [], []  # every param (as in param_groups) and its local grad or None
        self.bumps, self.new_states, self.written = [], [], []
        self.program = self.grad_scale = None

    @property
    def grad_dtype(self):
        return self.written[0].dtype


class StepContext(NamedTuple):
    """What every run of one step shares."""
    prelude: dict  # scalars every program reads (torch_threads)
    threads: int  # optc's threads
    grad_scale: Optional[float]  # fused_step's, as given; each run has its own rounding (Run.grad_scale)
    norm_dtype: torch.dtype  # the dtype torch computes the total norm in (the grads' promoted)
    first: torch.Tensor  # the first param: where clip_grad_norm_ puts the norm


def clip_coef(max_norm, total, dtype):
    """clip_grad_norm_'s coefficient in the norm's dtype, as a float:
    (total + 1e-6).reciprocal() * max_norm, clamped to 1."""
    tn = _norm_tensor(total, dtype, torch.empty(0))
    return float(torch.clamp(max_norm / (tn + 1e-6), max=1.0))


def fold_over_ranks(parts):
    """The total of per-sharding sums ({ReduceKey or None: this rank's sum},
    in a fixed order): each sharded one summed over its ranks."""
    total = 0.0
    for key, s in parts.items():
        total += s if key is None else _dist.sum_over_ranks(key, s)
    return total


class OptcOptimizer:
    """The machinery shared by the optimizers. A subclass says which optc
    optimizer a group builds (_optc_build), its runtime scalars
    (_optc_scalars) and how torch keeps its state (_optc_state)."""

    # ---- setup ----------------------------------------------------------------------------

    def _optc_setup(self, nonfinite, threads, in_backward=False, max_norm=None, speculate=False,
                    stochastic_rounding=False, seed=0, compensation=None):
        if nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite must be 'propagate', 'skip' or 'error', not {nonfinite!r}")
        if compensation not in (None, "none", "kahan"):
            raise ValueError(f"compensation must be None or 'kahan', not {compensation!r}")
        if compensation == "kahan" and stochastic_rounding:
            raise ValueError("compensation='kahan' and stochastic_rounding=True both keep the small updates a 16-bit "
                             "param loses; choose one")
        if not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
            raise ValueError(f"seed must be an int in [0, 2**32), not {seed!r}")
        # 16-bit params only: a bf16 or fp16 param rounded stochastically
        # (from a stream keyed on seed, the step and the element: the same
        # bits every run), or its rounding error kept in a state of its
        # dtype (compensation='kahan': state 'kahan_comp')
        self._optc_sr = bool(stochastic_rounding)
        self._optc_seed = int(seed)
        self._optc_kahan = compensation == "kahan"
        if threads is not None and (not isinstance(threads, int) or threads < 0):
            raise ValueError(f"threads must be None or an int >= 0, not {threads!r}")
        for group in self.param_groups:
            if group.get("differentiable"):
                raise ValueError(f"{type(self).__name__}: differentiable=True: optc's step runs outside autograd "
                                 f"and cannot be differentiated through; use torch.optim for a differentiable "
                                 f"step")
        if max_norm is not None and not (float(max_norm) > 0):
            raise ValueError(f"max_norm must be None or a number > 0, not {max_norm!r}")
        if speculate and not in_backward:
            raise ValueError("speculate=True is a way of stepping inside the backward: give in_backward=True too")
        self._optc_nonfinite = nonfinite
        self._optc_threads = threads
        self._optc_max_norm = None if max_norm is None else float(max_norm)
        self._optc_pending_scale = None
        self.skipped_steps = 0
        self.last_grad_norm = None
        self._optc_init_cache()
        self._optc_inbwd = None
        if in_backward:
            from ._inbwd import InBackward
            self._optc_inbwd = InBackward(self, speculate)
            self._optc_inbwd.attach()
        # torch's fused optimizers take GradScaler's scale and inf flag into
        # the step; these do not, so GradScaler unscales the grads itself.
        self._step_supports_amp_scaling = False

    def _optc_init_cache(self):
        self._optc_programs = {}  # ProgramKey -> _capi.Step
        self._optc_seen = {}  # id(param) -> (param, ids of its state tensors last checked, those tensors)
        self._optc_last = []  # the ProgramKeys of the last step, in run order
        self.programs_built = 0

    def add_param_group(self, param_group):
        if param_group.get("differentiable"):
            raise ValueError(f"{type(self).__name__}: differentiable=True: optc's step cannot be differentiated "
                             f"through")
        super().add_param_group(param_group)

    def __getstate__(self):
        s = dict(super().__getstate__())
        s["_optc_nonfinite"] = self._optc_nonfinite
        s["_optc_threads"] = self._optc_threads
        s["_optc_max_norm"] = self._optc_max_norm
        s["_optc_in_backward"] = None if self._optc_inbwd is None else {"speculate": self._optc_inbwd.speculate}
        s["skipped_steps"] = self.skipped_steps
        s["_optc_sr"], s["_optc_seed"], s["_optc_kahan"] = self._optc_sr, self._optc_seed, self._optc_kahan
        return s

    def __setstate__(self, state):
        inbwd = state.pop("_optc_in_backward", None) if isinstance(state, dict) else None
        super().__setstate__(state)
        self.__dict__.setdefault("_optc_nonfinite", "propagate")
        self.__dict__.setdefault("_optc_threads", None)
        self.__dict__.setdefault("_optc_max_norm", None)
        self.__dict__.setdefault("skipped_steps", 0)
        self.__dict__.setdefault("last_grad_norm", None)
        self.__dict__.setdefault("_optc_pending_scale", None)
        self.__dict__.setdefault("_optc_sr", False)
        self.__dict__.setdefault("_optc_seed", 0)
        self.__dict__.setdefault("_optc_kahan", False)
        if "_optc_programs" not in self.__dict__:
            self._optc_init_cache()
        self._step_supports_amp_scaling = False
        if "_optc_inbwd" not in self.__dict__:
            self._optc_inbwd = None
            if inbwd is not None:
                from ._inbwd import InBackward
                self._optc_inbwd = InBackward(self, inbwd["speculate"])
                self._optc_inbwd.attach()

    # ---- the public step ------------------------------------------------------------------

    @disable_dynamo
    def step(self, closure=None):
        """One optimizer step, as torch.optim's; a closure is called under
        enable_grad and its loss returned. Built with max_norm, the step
        clips first (clip_grad_norm_), and set_grad_scale's scale applies;
        the norm is then in opt.last_grad_norm. With in_backward=True,
        waits for the steps running beside the backward and steps what
        they left."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale = self._optc_take_scale()
        with torch.no_grad():
            self.last_grad_norm = self._optc_step(scale[0], scale[1], self._optc_max_norm, None)
        return loss

    @disable_dynamo
    def fused_step(self, grad_scale=None, max_norm=None, *, grad_norm=None):
        """torchtune's scale_grads_ and clip_grad_norm_, then the step, in
        one kernel (two passes over the grads when it clips).

        grad_scale: multiplies every grad first, as
          torch._foreach_mul_(grads, grad_scale) does (> 0): a 0-dim tensor
          such as torchtune's world_size / num_tokens multiplies in f32; a
          python float is rounded to bf16/f16 grads' dtype first, as torch
          rounds a scalar argument.
        max_norm: clip_grad_norm_(params, max_norm) over every param of
          this optimizer that has a grad (all groups): grads *= min(1,
          max_norm / (total + 1e-6)), total the 2-norm of the scaled grads.
          With sharded params (FSDP2's DTensors) the norm is over every
          rank's shards: each rank's f64 sum of squares, gathered and summed
          in rank order, so every rank clips with the same coefficient.
          Default: the optimizer's max_norm (None: no clipping).
        grad_norm: optional: the total norm to clip with, computed
          elsewhere (e.g. torch's own), instead of optc's.

        Returns the total norm (of the scaled grads) as a 0-dim tensor of
        the grads' dtype on the first grad's device, as clip_grad_norm_
        does, or None when it does not clip. optc sums the squares in f64
        in fixed blocks, so its norm can differ from torch's f32 sum in the
        last bits; given the same norm (grad_norm=), the step is torch's
        bit for bit. With params of several dtypes torch computes the
        clip coefficient in the promoted dtype; so does this (it computes
        the coefficient, torch's way, for the programs whose grads are of
        another dtype), except together with grad_scale, where those
        programs' coefficient is computed in their own dtype.

        p.grad is not modified: it still holds the unscaled, unclipped
        grads afterwards (torchtune's scale_grads_ and clip_grad_norm_
        would have scaled and clipped them in place; the step itself is
        the same).

        With in_backward=True the grads were stepped as they landed, so
        grad_scale and max_norm must be the ones they were stepped with:
        give the scale before the backward (set_grad_scale) and max_norm
        when building the optimizer; grad_norm may still be given."""
        scale_is_tensor = torch.is_tensor(grad_scale)
        if grad_scale is not None:
            grad_scale = float(grad_scale)
            if not (grad_scale > 0 and math.isfinite(grad_scale)):
                raise ValueError(f"grad_scale must be a finite number > 0, not {grad_scale!r}")
            if self._optc_pending_scale is not None and self._optc_inbwd is None:
                raise ValueError("a grad scale was set with set_grad_scale() and given to fused_step: give one")
        else:
            grad_scale, scale_is_tensor = self._optc_take_scale()
        if max_norm is not None:
            max_norm = float(max_norm)
        elif self._optc_max_norm is not None:
            max_norm = self._optc_max_norm
        if grad_norm is not None:
            if max_norm is None:
                raise ValueError("grad_norm is the norm to clip with: give max_norm too")
            grad_norm = float(grad_norm)
        self._opt_called = True  # lr_scheduler's check that the optimizer stepped
        with torch.no_grad():
            self.last_grad_norm = self._optc_step(grad_scale, scale_is_tensor, max_norm, grad_norm)
        return self.last_grad_norm

    def set_grad_scale(self, grad_scale):
        """The grad scale of the next step (as fused_step's grad_scale): with
        in_backward=True, give it before the backward that steps, e.g.
        torchtune's world_size / num_tokens after its all-reduce."""
        is_tensor = torch.is_tensor(grad_scale)
        v = float(grad_scale)
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"grad_scale must be a finite number > 0, not {grad_scale!r}")
        if self._optc_inbwd is not None:
            if self._optc_inbwd.landed:
                raise RuntimeError("set_grad_scale: grads have already been stepped in this backward; set the "
                                   "scale before it")
            self._optc_inbwd.grad_scale = self._optc_inbwd.context_scale = (v, is_tensor)
        else:
            self._optc_pending_scale = (v, is_tensor)

    def _optc_take_scale(self):
        if self._optc_inbwd is not None:
            return self._optc_inbwd.context_scale or (None, False)
        s, self._optc_pending_scale = self._optc_pending_scale, None
        return s or (None, False)

    def no_step(self):
        """A context manager for gradient accumulation with in_backward=True:
        the backward inside it leaves the grads to accumulate and steps
        nothing (as DDP's no_sync()). Wrap every micro-batch's backward
        but the last. Without in_backward it does nothing."""
        if self._optc_inbwd is None:
            return contextlib.nullcontext()
        return self._optc_inbwd.no_step()

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)
        if self._optc_inbwd is not None:
            self._optc_inbwd.attach()

    def optc_ir(self):
        """The IR text of the programs of the last step, each headed by a
        comment saying what it is. Before the first step: the programs the
        params would need (grads as their params, no clipping)."""
        if self._optc_last:
            keys = [(k, None) for k in self._optc_last]
        else:
            keys, seen = [], set()
            for gi, group in enumerate(self.param_groups):
                build = self._optc_build(group)
                for p in group["params"]:
                    if p.dtype in OPTC_DTYPE:
                        k = ProgramKey(layout_of(_dist.local(p).device, p.dtype, p.dtype, build),
                                       _capi.OPTC_CLIP_NONE, self._optc_nonfinite, gi)
                        if k not in seen:
                            seen.add(k)
                            keys.append((k, build.options))
        out = []
        for i, (k, options) in enumerate(keys):
            prog = self._optc_programs.get(k) or self._optc_program(k, options, "optc_ir")
            ir = prog.ir
            out.append(f"// ----- optc program {i + 1} of {len(keys)}: {_describe(k)} -----\n")
            out.append(ir if ir.endswith("\n") else ir + "\n")
        return "".join(out)

    # ---- subclass hooks -------------------------------------------------------------------

    def _optc_build(self, group):
        """The group's Build: what optc fixes when it builds its step."""
        raise NotImplementedError

    def _optc_scalars(self, group):
        """The group's runtime scalars, but step."""
        raise NotImplementedError

    def _optc_adjust(self, group, scalars, step):
        """Changes a run's scalars where torch's arithmetic needs it (the
        Adams' tensor lr)."""

    def _optc_state(self, group, p, g):
        """torch's state for p (made as torch makes it, lazily): a ParamState."""
        raise NotImplementedError

    def _optc_after_step(self):
        """Once a step was taken (Lion counts its steps)."""

    # ---- programs -------------------------------------------------------------------------

    def _optc_program(self, k, options, where):
        """The cached program for ProgramKey k, built on first use with these
        build-time options. Each group has its own (a step object keeps the
        layout of the tensors it last ran on, and on CUDA its executor: two
        groups sharing one would rebuild them at every run); building the
        same step again hits liboptc's compile cache."""
        prog = self._optc_programs.get(k)
        if prog is not None:
            return prog
        lay = k.layout
        tc = torch_cpu() or "avx2"
        if tc == "amd" and lay.target == _capi.OPTC_TARGET_CUDA:
            tc = "avx2"  # the host's RSQRTPS has no GPU counterpart; torch's CUDA sqrt is IEEE's
        spec = dict(optimizer=lay.optimizer, param_dtype=lay.param_dtype, grad_dtype=lay.param_dtype,
                    state_dtype=lay.state_dtype, fused=int(lay.fused), clip=k.clip, write_back_grads=0,
                    nonfinite=NONFINITE[k.nonfinite], torch_cpu=tc, target=lay.target, options=options)
        try:
            if lay.target == _capi.OPTC_TARGET_CUDA:
                with torch.cuda.device(lay.device_index):
                    prog = _capi.Step(spec)
            else:
                prog = _capi.Step(spec)
        except _capi.OptcError as e:
            raise type(e)(f"{type(self).__name__}: {where}: {e}", e.code) from None
        self._optc_programs[k] = prog
        self.programs_built += 1
        return prog

    # ---- gathering a step's tensors -------------------------------------------------------

    def _optc_init_group(self, gi, group, first_index, runs, order, exclude=None):
        """torch's _init_group: the group's params that have a grad (but not
        those whose id is in `exclude`), each placed in the run of its
        layout (runs: the group's dict, order: every run in order of its
        first tensor). Returns the index of the group's last param + 1."""
        build = []
        index = first_index
        for pi, p in enumerate(group["params"]):
            index += 1
            if p.grad is None or (exclude and id(p) in exclude):
                continue
            self._optc_add(gi, group, pi, index - 1, p, build, runs, order)
        return index

    def _optc_add(self, gi, group, pi, index, p, build, runs, order):
        """Places param p (group gi's pi-th, index-th of all) in its run.
        build: [] or [the group's Build], filled on first use.

        This is the per-tensor Python work of a step, so it is kept lean: a
        grad's checks are one expression (the detailed ones run only to word
        an error), and a param's states are checked when they are new
        objects."""
        g = p.grad
        if not build:
            build.append(self._optc_build(group))
        b = build[0]
        where = Where(gi, pi, index)
        lp, lg = _dist.local(p), _dist.local(g)
        reduce = _dist.reduce_key(p, g, where) if lp is not p or lg is not g else None
        # What memory safety needs, each step (p.grad may be any tensor a
        # user assigned): strided, contiguous, the param's dtype, numel and
        # device. Shape and the rest are worded by check_pair when this fails.
        pdt = lp.dtype
        dev = lp.get_device()  # -1: the CPU
        if (lg.layout is not _STRIDED or lg.dtype is not pdt or pdt not in OPTC_DTYPE
                or lg.numel() != lp.numel() or lg.get_device() != dev or not lp.is_contiguous()
                or not lg.is_contiguous() or (dev < 0 and not (lp.is_cpu and lg.is_cpu))):
            check_pair(self, lp, lg, where)
        st = self._optc_state(group, p, g)
        if (self._optc_sr or self._optc_kahan) and pdt in _LOW:
            b = self._optc_low_build(b)
            if self._optc_kahan:
                st = self._optc_kahan_state(p, st)
        local_states = tuple(_dist.local(t) for t in st.tensors)
        ids = tuple(map(id, st.tensors))
        old = self._optc_seen.get(id(p))
        if old is None or old[1] != ids or old[0] is not p:
            self._optc_check_states(lp, st, local_states, where)
            self._optc_seen[id(p)] = (p, ids, st.tensors)  # kept alive, so that their ids stay theirs
        sdtype = local_states[0].dtype if local_states else pdt
        rk = (gi, dev, pdt, sdtype, st.step, st.names, reduce)
        run = runs.get(rk)
        if run is None:
            run = runs[rk] = Run(gi, layout_of(lp.device, pdt, sdtype, b, st.state_dtype), b.options, st.step,
                                 lp.device, st.names, reduce)
            order.append(run)
        run.owners.append(p)
        if lp.numel():
            run.params.append(lp)
            run.grads.append(lg)
            run.states.append(local_states)
            run.where.append(where)
            run.owner_grads.append(lg)
        else:
            run.owner_grads.append(None)
        run.written.append(lp)
        run.written.extend(local_states)
        if st.bump is not None:
            run.bumps.append(st.bump)
        for nm, t in st.new:
            run.new_states.append((p, nm, t))

    def _optc_check_states(self, lp, st, local_states, where):
        """Raises where a param's state tensors do not fit it (a subclass with
        states of other shapes checks its own)."""
        check_states(self, lp, st.names, local_states, where)

    def _optc_low_build(self, b):
        """The Build of a 16-bit param's program with stochastic rounding or
        Kahan compensation (build[0] is the group's)."""
        if self._optc_sr and not b.fused and not b.optimizer.startswith("torchao."):
            raise ValueError(f"{type(self).__name__}: stochastic_rounding=True with torch's for-loop bits: those "
                             f"round a 16-bit param to nearest after every op, as torch's for-loop does, so a last "
                             f"stochastic rounding has nothing left to round; give fused=True (one rounding, "
                             f"stochastic)")
        key = (b, self._optc_sr, self._optc_kahan)
        cached = getattr(self, "_optc_low_builds", None)
        if cached is None:
            cached = self._optc_low_builds = {}
        nb = cached.get(key)
        if nb is None:
            extra = (("stochastic_rounding", 1),) if self._optc_sr else (("kahan", 1),)
            nb = cached[key] = b._replace(options=b.options + extra)
        return nb

    def _optc_kahan_state(self, p, st):
        """st with state 'kahan_comp': the rounding error a 16-bit param lost
        (zeros_like(p) at first, kept in self.state[p])."""
        state = self.state[p]
        comp = state.get("kahan_comp")
        if comp is None:
            comp = state["kahan_comp"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st._replace(names=st.names + ("kahan_comp",), tensors=st.tensors + (comp,))

    def _optc_collect(self, exclude=None):
        """The runs of this step (every param with a grad, but those whose id
        is in `exclude`), in the order of their first tensor."""
        order = []
        index = 0
        for gi, group in enumerate(self.param_groups):
            index = self._optc_init_group(gi, group, index, {}, order, exclude)
        return order

    def _optc_collect_these(self, places):
        """The runs of the params in `places`: [(group index, index in the
        group, index over all groups, param)] in that order (the in-backward
        batches: a few params, found without walking every group)."""
        order, runs, builds = [], {}, {}
        for gi, pi, index, p in places:
            if p.grad is None:
                continue
            self._optc_add(gi, self.param_groups[gi], pi, index, p, builds.setdefault(gi, []), runs, order)
        return order

    # ---- the step -------------------------------------------------------------------------

    def _optc_step(self, grad_scale, scale_is_tensor, max_norm, grad_norm):
        if self._optc_inbwd is not None:
            return self._optc_inbwd.finish(grad_scale, scale_is_tensor, max_norm, grad_norm)
        runs = self._optc_collect()
        if not runs:
            self._optc_last = []
            return None if max_norm is None else torch.tensor(0.0)
        ctx = self._optc_context(runs, grad_scale, scale_is_tensor)
        mode = self._optc_nonfinite
        clip, total = _capi.OPTC_CLIP_NONE, None
        if max_norm is not None:
            clip, total = (_capi.OPTC_CLIP_GIVEN, grad_norm) if grad_norm is not None else (_capi.OPTC_CLIP_NORM, None)
        run_mode = mode
        sharded = any(r.reduce is not None for r in runs)
        if (len(runs) > 1 or sharded) and (clip == _capi.OPTC_CLIP_NORM or mode != "propagate"):
            # Several programs, or several ranks: the norm is global, and
            # skip/error must be all or nothing, so first measure every grad
            # (optc.grad_norm, which writes nothing) before any program
            # writes. Its f64 sum of squares is finite exactly when every
            # scaled grad is: finite f32 grads cannot overflow it.
            sumsq = self._optc_sumsq(runs, ctx)
            if mode != "propagate" and not math.isfinite(sumsq):
                self._optc_refuse_nonfinite(sumsq)
                return None if max_norm is None else _norm_tensor(math.sqrt(sumsq), ctx.norm_dtype, ctx.first)
            if clip == _capi.OPTC_CLIP_NORM:
                clip, total = _capi.OPTC_CLIP_GIVEN, math.sqrt(sumsq)
            run_mode = "propagate"
        total, skipped = self._optc_execute(runs, ctx, clip, max_norm, total, run_mode)
        if skipped:
            self.skipped_steps += 1
        else:
            self._optc_commit(runs)
            self._optc_end_step()
        return None if max_norm is None else _norm_tensor(total, ctx.norm_dtype, ctx.first)

    def _optc_context(self, runs, grad_scale, scale_is_tensor):
        """What every run of one step shares: the prelude, threads, each run's
        grad scale, and the dtype torch computes the total norm in."""
        if grad_scale is not None:
            for r in runs:
                r.grad_scale = _run_scale(grad_scale, scale_is_tensor, r.grad_dtype)
        norm_dtype = runs[0].grad_dtype
        for r in runs[1:]:
            norm_dtype = torch.promote_types(norm_dtype, r.grad_dtype)
        threads = self._optc_threads if self._optc_threads is not None else torch.get_num_threads()
        return StepContext({"torch_threads": float(torch.get_num_threads())}, threads, grad_scale, norm_dtype,
                           runs[0].written[0])

    def _optc_refuse_nonfinite(self, sumsq):
        """A step that finds a non-finite grad under nonfinite skip or error."""
        if self._optc_nonfinite == "error":
            raise _capi.NonfiniteError(f"{type(self).__name__}: non-finite grads (their sum of squares is "
                                       f"{sumsq}): the step was not taken, nothing changed",
                                       _capi.OPTC_ERR_NONFINITE)
        self.skipped_steps += 1

    def _optc_execute(self, runs, ctx, clip, max_norm, total, run_mode):
        """Runs each run's program: clip NONE, NORM (a single run measures
        its own norm) or GIVEN (total). Returns (the total norm, whether
        the step was skipped: only a single run checking its own grads can
        skip here). Commits nothing."""
        clip_scalars = {}
        if max_norm is not None:
            clip_scalars["max_norm"] = max_norm
            if clip == _capi.OPTC_CLIP_GIVEN:
                clip_scalars["grad_norm_given"] = total
        # Each run's clip and scalars. Where a run's grads are not of the
        # total norm's dtype (mixed dtypes: torch promotes the norm, and
        # computes the coefficient in that dtype), optc's GIVEN would
        # compute the coefficient in the run's own dtype; so the
        # coefficient is computed here, torch's way, and given as the
        # grad scale (one f32 multiply, as torch's g.mul_(coef) is).
        plans = [(clip, clip_scalars)] * len(runs)
        if clip == _capi.OPTC_CLIP_GIVEN and ctx.grad_scale is None and \
                any(r.grad_dtype != ctx.norm_dtype for r in runs):
            coef = clip_coef(max_norm, total, ctx.norm_dtype)
            for i, r in enumerate(runs):
                if r.grad_dtype == ctx.norm_dtype or coef == 0.0 or math.isnan(coef):
                    continue  # 0 and NaN are the same in every dtype
                plans[i] = (_capi.OPTC_CLIP_NONE, {} if coef >= 1.0 else {"grad_scale": coef})

        last = []
        for r, (c, _) in zip(runs, plans):
            k = ProgramKey(r.layout, c, run_mode, r.group_index)
            r.program = self._optc_program(k, r.options, _where_of(r))
            last.append(k)
        self._optc_last = last
        skipped = False
        for r, (c, cs) in zip(runs, plans):
            if not r.params:  # every shard of this run is empty on this rank
                continue
            group = self.param_groups[r.group_index]
            scalars = self._optc_scalars(group)
            scalars["step"] = r.step
            self._optc_adjust(group, scalars, r.step)
            scalars.update(ctx.prelude)
            if ctx.grad_scale is not None:
                scalars["grad_scale"] = r.grad_scale
            scalars.update(cs)
            res = self._optc_run(r, r.program, scalars, ctx.threads)
            if c == _capi.OPTC_CLIP_NORM:
                total = res.grad_norm
            skipped = skipped or bool(res.skipped)
        return total, skipped

    def _optc_sumsq(self, runs, ctx):
        """The f64 sum of squares of every (scaled) grad of these runs, over
        every rank that holds a shard of them: each run's own (optc's
        grad_norm program, which writes nothing), summed in run order per
        sharding, each sharding's sum gathered over its ranks."""
        parts = {}  # ReduceKey or None -> this rank's sum, in order of first appearance
        for r in runs:
            s = 0.0
            if r.params:
                s = self._optc_run(r, self._optc_norm_program(r), self._optc_norm_scalars(r, ctx),
                                   ctx.threads).grad_sumsq
            parts[r.reduce] = parts.get(r.reduce, 0.0) + s
        return fold_over_ranks(parts)

    def _optc_norm_program(self, r):
        """optc.grad_norm for run r's layout: measures, writes nothing."""
        lay = r.layout
        k = ProgramKey(lay._replace(optimizer="optc.grad_norm", fused=False, flags=(), state_dtype=lay.param_dtype),
                       _capi.OPTC_CLIP_NONE,
                       "propagate", r.group_index)
        return self._optc_program(k, (), _where_of(r))

    def _optc_norm_scalars(self, r, ctx):
        sc = dict(ctx.prelude)
        if ctx.grad_scale is not None:
            sc["grad_scale"] = r.grad_scale
        return sc

    def _optc_run(self, r, prog, scalars, threads):
        n = len(r.params)
        sptr = []
        for nm, _, _, _ in prog.states:
            if nm not in r.state_names:
                raise KeyError(f"{type(self).__name__}: {_where_of(r)}: optc's step needs the state {nm!r}, "
                               f"which this param's state lacks")
            k = r.state_names.index(nm)
            sptr += [ts[k].data_ptr() for ts in r.states]
        numel = (ctypes.c_int64 * n)(*[p.numel() for p in r.params])
        param = (ctypes.c_void_p * n)(*[p.data_ptr() for p in r.params])
        grad = (ctypes.c_void_p * n)(*[g.data_ptr() for g in r.grads])
        state = (ctypes.c_void_p * max(1, len(sptr)))(*sptr)
        if "torch_threads" not in prog.scalars:  # only torch's for-loop bodies read it
            scalars.pop("torch_threads", None)
        if "seed" in prog.scalars:  # stochastic rounding's stream
            scalars["seed"] = float(self._optc_seed)
        try:
            if r.device.type == "cuda":
                with torch.cuda.device(r.device):
                    stream = torch.cuda.current_stream(r.device).cuda_stream
                    return prog.run(n, numel, param, grad, state, scalars, threads, stream)
            return prog.run(n, numel, param, grad, state, scalars, threads)
        except _capi.OptcError as e:
            more = f" (and {n - 1} more of its layout)" if n > 1 else ""
            raise type(e)(f"{type(self).__name__}: {_where_of(r)}{more}: {e}", e.code) from None

    def _optc_commit(self, runs):
        """After runs that were taken: the step counts as torch counts them,
        new states into self.state, and the autograd version counters of
        what optc wrote (torch's in-place ops bump them)."""
        written = []
        for r in runs:
            written += r.written
            new = r.step
            for t in r.bumps:  # torch's step_t += 1, whose result the step ran with
                ct = _STEP_CTYPES.get(t.dtype) if t.is_cpu and not t.requires_grad else None
                if ct is not None:  # in place (a ctypes store: torch's add_ costs microseconds a tensor)
                    ct.from_address(t.data_ptr()).value = new
                else:
                    t.add_(1)
            for p, nm, t in r.new_states:
                self.state[p][nm] = t
        torch.autograd.graph.increment_version(written)

    def _optc_end_step(self):
        """After a whole step was taken (every param's runs committed)."""
        self._optc_after_step()

def _where_of(r):
    return r.where[0] if r.where else "an empty shard"


def _describe(k):
    lay = k.layout
    where = "cpu" if lay.target == _capi.OPTC_TARGET_CPU else f"cuda:{lay.device_index}"
    return (f"{lay.optimizer} on {where}, {_capi.DTYPE_NAMES[lay.param_dtype]} params and grads, "
            f"{_capi.DTYPE_NAMES[lay.state_dtype]} states, {'fused' if lay.fused else 'for-loop'}, "
            f"options: {', '.join(lay.flags) or 'none'}, clip {_CLIP_NAMES[k.clip]}, nonfinite {k.nonfinite}; "
            f"param group {k.group}")


def _run_scale(s, is_tensor, dtype):
    """The grad scale one program multiplies by, as torch._foreach_mul_(grads,
    s) would: a 0-dim tensor multiplies in f32 as it is; a python number is
    rounded to the grads' dtype first (torch's scalar argument to a bf16 or
    f16 kernel)."""
    if is_tensor or dtype == torch.float32:
        return s
    v = torch.tensor(s, dtype=dtype).item()
    if not v > 0 or not math.isfinite(v):
        raise ValueError(f"grad_scale={s!r} is {v!r} in {dtype}; give it as a 0-dim float32 tensor to multiply "
                         f"in float32")
    return v


def _norm_tensor(norm, dtype, like):
    """A total norm as clip_grad_norm_ returns it: 0-dim, the grads' dtype,
    on the first grad's device (from f64 through f32, as torch casts)."""
    t = torch.tensor(norm, dtype=torch.float32)
    if dtype != torch.float32:
        t = t.to(dtype)
    return t.to(like.device)


def check_pair(opt, p, g, where):
    """Raises the error that says why grad g cannot be stepped with param p
    (local tensors)."""
    name = type(opt).__name__
    if g.is_sparse or p.is_sparse or g.layout != torch.strided:
        raise RuntimeError(f"{name}: {where}: sparse grads are not supported (torch.optim.SparseAdam handles them)")
    if p.dtype not in OPTC_DTYPE:
        raise TypeError(f"{name}: {where} is {p.dtype}; optc steps float32, bfloat16 and float16 params")
    if g.dtype != p.dtype:
        raise TypeError(f"{name}: {where} is {p.dtype} but its grad is {g.dtype}")
    if g.shape != p.shape:
        raise RuntimeError(f"{name}: {where} has shape {tuple(p.shape)} but its grad {tuple(g.shape)}")
    if g.device != p.device:
        raise RuntimeError(f"{name}: {where} is on {p.device} but its grad on {g.device}")
    if p.device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"{name}: {where} is on {p.device}; optc runs on the CPU and CUDA")
    if not p.is_contiguous():
        raise ValueError(f"{name}: {where} is not contiguous (strides {p.stride()}); optc steps contiguous tensors")
    if not g.is_contiguous():
        raise ValueError(f"{name}: the grad of {where} is not contiguous (strides {g.stride()}); optc steps "
                         f"contiguous tensors")
    raise RuntimeError(f"{name}: {where}: its grad ({g.dtype}, {tuple(g.shape)}, on {g.device}) does not fit it "
                       f"({p.dtype}, {tuple(p.shape)}, on {p.device})")


def check_states(opt, p, names, ts, where):
    """Raises where a state tensor (local) does not fit its param (local)."""
    for nm, t in zip(names, ts):
        if t.shape != p.shape or t.device != p.device or not t.is_contiguous() or t.dtype not in OPTC_DTYPE \
                or t.layout is not _STRIDED:
            raise ValueError(f"{type(opt).__name__}: {where}: its state '{nm}' ({t.dtype}, shape "
                             f"{tuple(t.shape)}, on {t.device}{'' if t.is_contiguous() else ', not contiguous'}) "
                             f"does not fit the param ({p.dtype}, {tuple(p.shape)}, on {p.device})")
        if t.dtype != ts[0].dtype:
            raise TypeError(f"{type(opt).__name__}: {where}: its states have different dtypes ({ts[0].dtype} "
                            f"for '{names[0]}', {t.dtype} for '{nm}'); optc keeps one states dtype per tensor")


def f32_plus_one(v):
    """torch's `step_t += 1` on a float32 tensor: the sum rounded to f32."""
    return ctypes.c_float(v + 1.0).value


def next_step(t):
    """This step's count after torch's increment, without changing t."""
    v = t.item()
    return f32_plus_one(v) if t.dtype == torch.float32 else v + 1.0


def step_tensor(group, p, fused):
    """torch's `state['step']` for Adam, Adagrad, RMSprop: on the param's
    device when capturable or fused, else on the CPU."""
    if group.get("capturable", False) or fused:
        return torch.zeros((), dtype=_get_scalar_dtype(is_fused=fused), device=p.device)
    return torch.tensor(0.0, dtype=_get_scalar_dtype())


def state_key(opt, state, key, p):
    """state[key], or a KeyError naming the param."""
    t = state.get(key)
    if t is not None:
        return t
    index = next((i for group in opt.param_groups for i, q in enumerate(group["params"]) if q is p), "?")
    raise KeyError(f"{type(opt).__name__}: param {index}: its state has no {key!r} (it was made before the option "
                   f"that needs it was set; torch fails here too)")
