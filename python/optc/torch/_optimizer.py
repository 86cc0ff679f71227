"""torch.optim optimizers whose step is one of optc's compiled kernels.

    from optc.torch import AdamW
    opt = AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    for batch in data:
        loss = model(batch).backward()
        opt.step()            # torch.optim.AdamW(foreach=False)'s bits (fused=True: fused=True's)
        opt.zero_grad()

AdamW, Adam, SGD, Adagrad and RMSprop take torch.optim's constructor
arguments, with torch's defaults and torch's checks (they are subclasses of
torch's own classes, whose constructors run unchanged), and Lion takes
lion-pytorch's. All are torch.optim.Optimizer: param groups, add_param_group,
zero_grad, hooks, lr_scheduler, and state_dict()/load_state_dict() in
torch's own format, both ways. What a step writes is what torch writes,
bit for bit (README, "Torch's bits"):

- fused=False (the default) or foreach=True: the for-loop's bits
  (torch.optim.X(foreach=False)); in fp32 they are also foreach=True's.
- fused=True: the bits of torch's fused=True CPU kernel (AdamW, Adam, SGD,
  Adagrad; RMSprop and Lion have none, and take no `fused`, as in torch).
- capturable and differentiable are accepted and change nothing but where
  torch keeps the step count (capturable: on the param's device).

Two keyword arguments are optc's own:
- nonfinite: "propagate" (default; torch's behaviour: NaN/Inf grads run
  and spread), "skip" (the whole step is skipped: params, states and step
  counts unchanged; counted in `opt.skipped_steps`), or "error" (raises
  FloatingPointError, nothing changed).
- threads: the threads optc runs on (default: torch.get_num_threads() at
  each step). The bits never depend on it.

`opt.fused_step(grad_scale=None, max_norm=None)` does torchtune's
scale_grads_ and clip_grad_norm_ inside the step (see its docstring), and
`opt.optc_ir()` prints the programs in use.

How a step runs: each param group's params with a grad (grad None: the
param is skipped, as in torch) are grouped by device, dtypes, the step
count and what optc fixes when it builds a step (fused, the bool options,
whether weight_decay and momentum are zero); each such layout is one
program, built once (optc_step_new) and cached on the optimizer, and run in
place on the params', grads' and states' memory. Changing lr or any other
hyperparameter (a float or a 0-dim tensor) never rebuilds one.
"""
import ctypes
import math
import warnings

import torch
import torch.optim

from . import _capi

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

__all__ = ["AdamW", "Adam", "SGD", "Adagrad", "RMSprop", "Lion"]

_OPTC_DTYPE = {torch.float32: _capi.OPTC_F32, torch.bfloat16: _capi.OPTC_BF16, torch.float16: _capi.OPTC_F16}
_NONFINITE = {"propagate": _capi.OPTC_NONFINITE_PROPAGATE, "skip": _capi.OPTC_NONFINITE_SKIP,
              "error": _capi.OPTC_NONFINITE_ERROR}
_CLIP_NAMES = {_capi.OPTC_CLIP_NONE: "none", _capi.OPTC_CLIP_NORM: "norm", _capi.OPTC_CLIP_GIVEN: "given"}
_disable_dynamo = getattr(torch, "_disable_dynamo", lambda f: f)


_TORCH_CPU = []
# Which of the probe's inputs MKL's AVX-512 vsSqrt leaves 1 ulp under IEEE
# (torch 2.15's MKL on an Intel Xeon; optc's model, compiler/numerics_mkl.h,
# gives the same 22).
_MKL_AVX512_LOW = (44, 232, 267, 338, 371, 609, 724, 947, 993, 1009, 1107, 1342, 1416, 1980, 3042, 3078, 3096,
                   3372, 3478, 3645, 3659, 4074)


def torch_cpu():
    """The recipe's torch_cpu that gives this torch's bits: "avx512" where its
    f32 sqrt is MKL's AVX-512 one (rsqrt14 and a Newton step, 1 ulp under
    IEEE on 0.6% of inputs), "avx2" where it is IEEE's, and None where it is
    neither, which optc does not model.

    torch's CPU capability does not decide it: MKL picks its own kernels, by
    the CPU's vendor as well as its features. On one CI machine torch
    reported AVX512 while MKL's sqrt was off IEEE on about a fifth of inputs,
    as MKL's SSE4.2 path is here (MKL_ENABLE_INSTRUCTIONS=SSE4_2), but not
    at the same inputs: that path uses the CPU's own approximations. So this
    asks torch: the square roots of 4096 fixed floats in [1, 4), against
    IEEE's (math.sqrt's double rounded to f32: exact for sqrt). Asked once
    per process."""
    if not _TORCH_CPU:
        xs = torch.tensor([1.0 + 3.0 * ((k * 0.7548776662466927) % 1.0) for k in range(4096)], dtype=torch.float32)
        low = tuple(k for k, (x, y) in enumerate(zip(xs.tolist(), torch.sqrt(xs).tolist()))
                    if ctypes.c_float(math.sqrt(x)).value != y)
        _TORCH_CPU.append("avx2" if not low else "avx512" if low == _MKL_AVX512_LOW else None)
        if _TORCH_CPU[0] is None:
            warnings.warn(f"optc: torch's f32 sqrt on this CPU is neither IEEE's nor MKL's AVX-512 one ({len(low)} "
                          "of 4096 probe inputs differ from IEEE); optc's f32 for-loop steps that take a square root "
                          "(Adam, AdamW, RMSprop, Adagrad) use IEEE's and may differ from torch's by 1 ulp",
                          RuntimeWarning, stacklevel=3)
    return _TORCH_CPU[0]


def _f32_plus_one(v):
    """torch's `step_t += 1` on a float32 tensor: the sum rounded to f32."""
    return ctypes.c_float(v + 1.0).value


class _Run:
    """One program's run: tensors of one layout and one step count, from one
    param group."""

    __slots__ = ("gi", "ident", "options", "step", "device", "names", "params", "grads", "states", "where",
                 "bumps", "commits", "program", "scale")

    def __init__(self, gi, ident, options, step, device, names):
        self.gi, self.ident, self.options, self.step, self.device, self.names = gi, ident, options, step, device, names
        self.params, self.grads, self.states, self.where = [], [], [], []
        self.bumps, self.commits = [], []
        self.program = self.scale = None


class _OptcOptimizer:
    """The step machinery shared by the optimizers below. A subclass says
    which optc optimizer a group builds (_optc_build), its runtime scalars
    (_optc_scalars) and how torch keeps its state (_optc_state)."""

    # ---- setup ----------------------------------------------------------------------------

    def _optc_setup(self, nonfinite, threads):
        if nonfinite not in _NONFINITE:
            raise ValueError(f"nonfinite must be 'propagate', 'skip' or 'error', not {nonfinite!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 0):
            raise ValueError(f"threads must be None or an int >= 0, not {threads!r}")
        self._optc_nonfinite = nonfinite
        self._optc_threads = threads
        self.skipped_steps = 0
        self._optc_init_cache()
        # torch's fused optimizers take GradScaler's scale and inf flag into
        # the step; these do not, so GradScaler unscales the grads itself.
        self._step_supports_amp_scaling = False

    def _optc_init_cache(self):
        self._optc_programs = {}  # program key -> _capi.Step
        self._optc_seen = {}  # id(param) -> (param, ids of the state tensors last checked, those tensors)
        self._optc_last = []  # the program keys of the last step, in run order
        self.programs_built = 0

    def __getstate__(self):
        s = super().__getstate__()
        s = dict(s)
        s["_optc_nonfinite"] = self._optc_nonfinite
        s["_optc_threads"] = self._optc_threads
        s["skipped_steps"] = self.skipped_steps
        return s

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_optc_nonfinite", "propagate")
        self.__dict__.setdefault("_optc_threads", None)
        self.__dict__.setdefault("skipped_steps", 0)
        if "_optc_programs" not in self.__dict__:
            self._optc_init_cache()
        self._step_supports_amp_scaling = False

    # ---- the public step ------------------------------------------------------------------

    @_disable_dynamo
    def step(self, closure=None):
        """One optimizer step, as torch.optim's; a closure is called under
        enable_grad and its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            self._optc_step(None, False, None, None)
        return loss

    @_disable_dynamo
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
        grad_norm: optional: the total norm to clip with, computed
          elsewhere (e.g. all-reduced over ranks, or torch's own), instead
          of optc's.

        Returns the total norm (of the scaled grads) as a 0-dim tensor of
        the grads' dtype on the first grad's device, as clip_grad_norm_
        does, or None when max_norm is None. optc sums the squares in f64
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
        the same)."""
        scale_is_tensor = torch.is_tensor(grad_scale)
        if grad_scale is not None:
            grad_scale = float(grad_scale)
            if not (grad_scale > 0 and math.isfinite(grad_scale)):
                raise ValueError(f"grad_scale must be a finite number > 0, not {grad_scale!r}")
        if max_norm is not None:
            max_norm = float(max_norm)
        if grad_norm is not None:
            if max_norm is None:
                raise ValueError("grad_norm is the norm to clip with: give max_norm too")
            grad_norm = float(grad_norm)
        self._opt_called = True  # lr_scheduler's check that the optimizer stepped
        with torch.no_grad():
            return self._optc_step(grad_scale, scale_is_tensor, max_norm, grad_norm)

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
                    if p.dtype in _OPTC_DTYPE:
                        k = (self._optc_ident(p.device, p.dtype, p.dtype, build), _capi.OPTC_CLIP_NONE,
                             self._optc_nonfinite, gi)
                        if k not in seen:
                            seen.add(k)
                            keys.append((k, build[2]))
        out = []
        for i, (k, options) in enumerate(keys):
            prog = self._optc_programs.get(k) or self._optc_program(k, options, "optc_ir")
            ir = prog.ir
            out.append(f"// ----- optc program {i + 1} of {len(keys)}: {self._optc_describe(k)} -----\n")
            out.append(ir if ir.endswith("\n") else ir + "\n")
        return "".join(out)

    # ---- subclass hooks -------------------------------------------------------------------

    def _optc_build(self, group):
        """(optc optimizer name, fused, ((option, value), ...)): what optc
        fixes when it builds this group's step. Bool options as 0/1, and
        hyperparameters whose zero-ness the build fixes as their value."""
        raise NotImplementedError

    def _optc_scalars(self, group):
        """The group's runtime scalars, but step."""
        raise NotImplementedError

    def _optc_adjust(self, group, scalars, step):
        """Changes a run's scalars where torch's arithmetic needs it (the
        Adams' tensor lr)."""

    def _optc_state(self, group, p, g):
        """torch's state for p (made as torch makes it, lazily): returns
        (state names, the state tensors in that order, step count for optc,
        the step tensor to bump after the step or None, [(name, tensor)] to
        put into the state after the step)."""
        raise NotImplementedError

    # ---- the machinery --------------------------------------------------------------------

    def _optc_ident(self, device, pdtype, sdtype, build):
        """What identifies a program but its clip and nonfinite mode: the
        target and device, the optimizer, the dtypes, fused, and the options
        as the build fixes them (bools; zero or not)."""
        cuda = device.type == "cuda"
        flags = tuple(n if n in _BOOLS else f"nonzero({n})" for n, v in build[2] if v != 0)
        return (_capi.OPTC_TARGET_CUDA if cuda else _capi.OPTC_TARGET_CPU, device.index if cuda else None,
                build[0], _OPTC_DTYPE[pdtype], _OPTC_DTYPE[sdtype], bool(build[1]), flags)

    def _optc_describe(self, k):
        (target, dev, name, pd, sd, fused, flags), clip, nonfinite, gi = k
        where = "cpu" if target == _capi.OPTC_TARGET_CPU else f"cuda:{dev}"
        return (f"{name} on {where}, {_capi.DTYPE_NAMES[pd]} params and grads, {_capi.DTYPE_NAMES[sd]} states, "
                f"{'fused' if fused else 'for-loop'}, options: {', '.join(flags) or 'none'}, "
                f"clip {_CLIP_NAMES[clip]}, nonfinite {nonfinite}; param group {gi}")

    def _optc_program(self, k, options, where):
        """The cached program for key k = (ident, clip, nonfinite, param
        group), built on first use with these build-time options. Each
        group has its own (a step object keeps the layout of the tensors it
        last ran on, and on CUDA its executor: two groups sharing one would
        rebuild them at every run); building the same step again hits
        liboptc's compile cache."""
        prog = self._optc_programs.get(k)
        if prog is not None:
            return prog
        (target, dev, name, pd, sd, fused, _), clip, nonfinite, _ = k
        spec = dict(optimizer=name, param_dtype=pd, grad_dtype=pd, state_dtype=sd, fused=int(fused), clip=clip,
                    write_back_grads=0, nonfinite=_NONFINITE[nonfinite], torch_cpu=torch_cpu() or "avx2", target=target,
                    options=options)
        try:
            if target == _capi.OPTC_TARGET_CUDA:
                with torch.cuda.device(dev):
                    prog = _capi.Step(spec)
            else:
                prog = _capi.Step(spec)
        except _capi.OptcError as e:
            raise type(e)(f"{type(self).__name__}: {where}: {e}", e.code) from None
        self._optc_programs[k] = prog
        self.programs_built += 1
        return prog

    def _optc_collect(self):
        """The runs of this step, in the order of their first tensor. This
        is the per-tensor Python work of a step, so it is kept lean: a
        grad's checks are one expression (the detailed ones run only to
        word an error), and a param's states are checked when they are new
        objects."""
        order = []
        index = 0
        seen = self._optc_seen
        for gi, group in enumerate(self.param_groups):
            build = None
            runs = {}  # (device, dtype, states dtype, step, state names) -> its run
            for pi, p in enumerate(group["params"]):
                g = p.grad
                index += 1
                if g is None:
                    continue
                if build is None:
                    build = self._optc_build(group)
                # What memory safety needs, each step (p.grad may be any
                # tensor a user assigned): strided, contiguous, the param's
                # dtype, numel and device. Shape and the rest are worded by
                # _check_tensor_pair when this fails.
                pdt = p.dtype
                dev = p.get_device()  # -1: the CPU
                if (g.layout is not _STRIDED or g.dtype is not pdt or pdt not in _OPTC_DTYPE
                        or g.numel() != p.numel() or g.get_device() != dev or not p.is_contiguous()
                        or not g.is_contiguous() or (dev < 0 and not (p.is_cpu and g.is_cpu))):
                    _check_tensor_pair(self, p, g, (gi, pi, index - 1))
                names, ts, step, bump, commits = self._optc_state(group, p, g)
                ids = tuple(map(id, ts))
                old = seen.get(id(p))
                if old is None or old[1] != ids or old[0] is not p:
                    _check_states(self, p, names, ts, (gi, pi, index - 1))
                    seen[id(p)] = (p, ids, ts)  # ts: kept alive, so that their ids stay theirs
                sdtype = ts[0].dtype if ts else pdt
                rk = (dev, pdt, sdtype, step, names)
                run = runs.get(rk)
                if run is None:
                    ident = self._optc_ident(p.device, pdt, sdtype, build)
                    run = runs[rk] = _Run(gi, ident, build[2], step, p.device, names)
                    order.append(run)
                run.params.append(p)
                run.grads.append(g)
                run.states.append(ts)
                run.where.append((gi, pi, index - 1))
                if bump is not None:
                    run.bumps.append(bump)
                if commits:
                    for nm, t in commits:
                        run.commits.append((p, nm, t))
        return order

    def _optc_step(self, grad_scale, scale_is_tensor, max_norm, grad_norm):
        runs = self._optc_collect()
        if not runs:
            self._optc_last = []
            return None if max_norm is None else torch.tensor(0.0)
        mode = self._optc_nonfinite
        threads = self._optc_threads if self._optc_threads is not None else torch.get_num_threads()
        prelude = {"torch_threads": float(torch.get_num_threads())}
        if grad_scale is not None:
            for r in runs:
                r.scale = _run_scale(grad_scale, scale_is_tensor, r.grads[0].dtype)
        first_grad = runs[0].grads[0]
        norm_dtype = first_grad.dtype
        for r in runs[1:]:
            norm_dtype = torch.promote_types(norm_dtype, r.grads[0].dtype)

        clip, clip_scalars, total = _capi.OPTC_CLIP_NONE, {}, None
        if max_norm is not None:
            clip_scalars["max_norm"] = max_norm
            if grad_norm is not None:
                clip, total = _capi.OPTC_CLIP_GIVEN, grad_norm
                clip_scalars["grad_norm_given"] = grad_norm
            else:
                clip = _capi.OPTC_CLIP_NORM
        run_mode = mode
        if len(runs) > 1 and (clip == _capi.OPTC_CLIP_NORM or mode != "propagate"):
            # Several programs: the norm is global, and skip/error must be
            # all or nothing, so first measure every grad (optc.grad_norm,
            # which writes nothing) before any program writes. Its f64 sum
            # of squares is finite exactly when every scaled grad is: finite
            # f32 grads cannot overflow it.
            sumsq = 0.0
            for r in runs:
                (target, dev, _, pd, sd, _, _) = r.ident
                k = ((target, dev, "optc.grad_norm", pd, sd, False, ()), _capi.OPTC_CLIP_NONE, "propagate", r.gi)
                prog = self._optc_program(k, (), _name(r.where[0]))
                sc = dict(prelude) if grad_scale is None else dict(prelude, grad_scale=r.scale)
                sumsq += self._optc_run(r, prog, sc, threads).grad_sumsq
            if mode != "propagate" and not math.isfinite(sumsq):
                if mode == "error":
                    raise _capi.NonfiniteError(f"{type(self).__name__}: non-finite grads (their sum of squares "
                                               f"is {sumsq}): the step was not taken, nothing changed",
                                               _capi.OPTC_ERR_NONFINITE)
                self.skipped_steps += 1
                return None if max_norm is None else _norm_tensor(math.sqrt(sumsq), norm_dtype, first_grad)
            if clip == _capi.OPTC_CLIP_NORM:
                clip, total = _capi.OPTC_CLIP_GIVEN, math.sqrt(sumsq)
                clip_scalars["grad_norm_given"] = total
            run_mode = "propagate"

        # Each run's clip and scalars. Where a run's grads are not of the
        # total norm's dtype (mixed dtypes: torch promotes the norm, and
        # computes the coefficient in that dtype), optc's GIVEN would
        # compute the coefficient in the run's own dtype; so the
        # coefficient is computed here, torch's way, and given as the
        # grad scale (one f32 multiply, as torch's g.mul_(coef) is).
        plans = [(clip, clip_scalars)] * len(runs)
        if clip == _capi.OPTC_CLIP_GIVEN and grad_scale is None and \
                any(r.grads[0].dtype != norm_dtype for r in runs):
            tn = _norm_tensor(total, norm_dtype, torch.empty(0))
            coef = float(torch.clamp(max_norm / (tn + 1e-6), max=1.0))
            for i, r in enumerate(runs):
                if r.grads[0].dtype == norm_dtype or coef == 0.0 or math.isnan(coef):
                    continue  # 0 and NaN are the same in every dtype
                plans[i] = (_capi.OPTC_CLIP_NONE, {} if coef >= 1.0 else {"grad_scale": coef})

        self._optc_last = []
        for r, (c, _) in zip(runs, plans):
            k = (r.ident, c, run_mode, r.gi)
            r.program = self._optc_program(k, r.options, _name(r.where[0]))
            self._optc_last.append(k)
        skipped = False
        for r, (c, cs) in zip(runs, plans):
            group = self.param_groups[r.gi]
            scalars = self._optc_scalars(group)
            scalars["step"] = r.step
            self._optc_adjust(group, scalars, r.step)
            scalars.update(prelude)
            if grad_scale is not None:
                scalars["grad_scale"] = r.scale
            scalars.update(cs)
            res = self._optc_run(r, r.program, scalars, threads)
            if c == _capi.OPTC_CLIP_NORM:
                total = res.grad_norm
            skipped = skipped or bool(res.skipped)  # only a single run can skip: several were checked above
        if skipped:
            self.skipped_steps += 1
        else:
            self._optc_commit(runs)
        return None if max_norm is None else _norm_tensor(total, norm_dtype, first_grad)

    def _optc_run(self, r, prog, scalars, threads):
        n = len(r.params)
        sptr = []
        for nm, _, _, _ in prog.states:
            if nm not in r.names:
                raise KeyError(f"{type(self).__name__}: {_name(r.where[0])}: optc's step needs the state {nm!r}, "
                               f"which this param's state lacks")
            k = r.names.index(nm)
            sptr += [ts[k].data_ptr() for ts in r.states]
        numel = (ctypes.c_int64 * n)(*[p.numel() for p in r.params])
        param = (ctypes.c_void_p * n)(*[p.data_ptr() for p in r.params])
        grad = (ctypes.c_void_p * n)(*[g.data_ptr() for g in r.grads])
        state = (ctypes.c_void_p * max(1, len(sptr)))(*sptr)
        if "torch_threads" not in prog.scalars:  # only torch's for-loop bodies read it
            del scalars["torch_threads"]
        try:
            if r.device.type == "cuda":
                with torch.cuda.device(r.device):
                    stream = torch.cuda.current_stream(r.device).cuda_stream
                    return prog.run(n, numel, param, grad, state, scalars, threads, stream)
            return prog.run(n, numel, param, grad, state, scalars, threads)
        except _capi.OptcError as e:
            more = f" (and {n - 1} more of its layout)" if n > 1 else ""
            raise type(e)(f"{type(self).__name__}: {_name(r.where[0])}{more}: {e}", e.code) from None

    def _optc_commit(self, runs):
        """After a step that was taken: the step counts as torch counts
        them, new states into self.state, and the autograd version
        counters of what optc wrote (torch's in-place ops bump them)."""
        written = []
        for r in runs:
            written += r.params
            for ts in r.states:
                written += ts
            new = r.step
            for t in r.bumps:  # torch's step_t += 1, whose result the step ran with
                ct = _STEP_CTYPES.get(t.dtype) if t.is_cpu and not t.requires_grad else None
                if ct is not None:  # in place (a ctypes store: torch's add_ costs microseconds a tensor)
                    ct.from_address(t.data_ptr()).value = new
                else:
                    t.add_(1)
            for p, nm, t in r.commits:
                self.state[p][nm] = t
        torch.autograd.graph.increment_version(written)
        self._optc_after_step(runs)

    def _optc_after_step(self, runs):
        pass


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


_STEP_CTYPES = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}
_STRIDED = torch.strided
_BOOLS = {"amsgrad", "maximize", "nesterov", "centered"}


def _name(where):
    gi, pi, index = where
    return f"param {index} (param_groups[{gi}]['params'][{pi}])"


def _check_tensor_pair(opt, p, g, where):
    if g.is_sparse or p.is_sparse or g.layout != torch.strided:
        raise RuntimeError(f"{type(opt).__name__}: {_name(where)}: sparse grads are not supported "
                           f"(torch.optim.SparseAdam handles them)")
    if p.dtype not in _OPTC_DTYPE:
        raise TypeError(f"{type(opt).__name__}: {_name(where)} is {p.dtype}; optc steps float32, bfloat16 "
                        f"and float16 params")
    if g.dtype != p.dtype:
        raise TypeError(f"{type(opt).__name__}: {_name(where)} is {p.dtype} but its grad is {g.dtype}")
    if g.shape != p.shape:
        raise RuntimeError(f"{type(opt).__name__}: {_name(where)} has shape {tuple(p.shape)} but its grad "
                           f"{tuple(g.shape)}")
    if g.device != p.device:
        raise RuntimeError(f"{type(opt).__name__}: {_name(where)} is on {p.device} but its grad on {g.device}")
    if p.device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"{type(opt).__name__}: {_name(where)} is on {p.device}; optc runs on the CPU "
                           f"and CUDA")
    if not p.is_contiguous():
        raise ValueError(f"{type(opt).__name__}: {_name(where)} is not contiguous (strides "
                         f"{p.stride()}); optc steps contiguous tensors")
    if not g.is_contiguous():
        raise ValueError(f"{type(opt).__name__}: the grad of {_name(where)} is not contiguous (strides "
                         f"{g.stride()}); optc steps contiguous tensors")
    raise RuntimeError(f"{type(opt).__name__}: {_name(where)}: its grad ({g.dtype}, {tuple(g.shape)}, on "
                       f"{g.device}) does not fit it ({p.dtype}, {tuple(p.shape)}, on {p.device})")


def _check_states(opt, p, names, ts, where):
    for nm, t in zip(names, ts):
        if t.shape != p.shape or t.device != p.device or not t.is_contiguous() or t.dtype not in _OPTC_DTYPE \
                or t.layout is not _STRIDED:
            raise ValueError(f"{type(opt).__name__}: {_name(where)}: its state '{nm}' ({t.dtype}, shape "
                             f"{tuple(t.shape)}, on {t.device}{'' if t.is_contiguous() else ', not contiguous'}) "
                             f"does not fit the param ({p.dtype}, {tuple(p.shape)}, on {p.device})")
        if t.dtype != ts[0].dtype:
            raise TypeError(f"{type(opt).__name__}: {_name(where)}: its states have different dtypes ({ts[0].dtype} "
                            f"for '{names[0]}', {t.dtype} for '{nm}'); optc keeps one states dtype per tensor")


def _norm_tensor(norm, dtype, like):
    """A total norm as clip_grad_norm_ returns it: 0-dim, the grads' dtype,
    on the first grad's device (from f64 through f32, as torch casts)."""
    t = torch.tensor(norm, dtype=torch.float32)
    if dtype != torch.float32:
        t = t.to(dtype)
    return t.to(like.device)


def _step_tensor(group, p, fused):
    """torch's `state['step']` for Adam, Adagrad, RMSprop: on the param's
    device when capturable or fused, else on the CPU."""
    if group.get("capturable", False) or fused:
        return torch.zeros((), dtype=_get_scalar_dtype(is_fused=fused), device=p.device)
    return torch.tensor(0.0, dtype=_get_scalar_dtype())


def _next_step(t):
    """This step's count after torch's increment, without changing t."""
    v = t.item()
    return _f32_plus_one(v) if t.dtype == torch.float32 else v + 1.0


def _scalar(x):
    return float(x)


# ---- the optimizers ---------------------------------------------------------------------------


def _decoupled(opt, group):
    return bool(group.get("decoupled_weight_decay", False)) or isinstance(opt, AdamW)


class _AdamBase(_OptcOptimizer):
    def _optc_build(self, group):
        name = "torch.optim.AdamW" if _decoupled(self, group) else "torch.optim.Adam"
        return (name, bool(group["fused"]), (("amsgrad", int(bool(group["amsgrad"]))),
                                             ("maximize", int(bool(group["maximize"]))),
                                             ("weight_decay", _scalar(group["weight_decay"]))))

    def _optc_scalars(self, group):
        b1, b2 = group["betas"]
        return {"lr": _scalar(group["lr"]), "beta1": _scalar(b1), "beta2": _scalar(b2), "eps": _scalar(group["eps"]),
                "weight_decay": _scalar(group["weight_decay"])}

    def _optc_adjust(self, group, scalars, step):
        # torch's for-loop keeps a tensor lr a tensor: step_size = lr /
        # bias_correction1 and 1 - lr * weight_decay are then f32 tensor
        # ops, where a float lr's are double ops rounded once to f32. The
        # optc body computes f32(lr / bc1) and f32(1 - lr * wd) in double,
        # so giving it lr' = S * bc1 and wd' = (1 - K) / lr', with S and K
        # torch's f32 results, makes it compute S and K exactly (the double
        # error is far below f32's half ulp). fused=True takes lr.item().
        lr = group["lr"]
        if not torch.is_tensor(lr) or group["fused"] or torch.is_tensor(group["betas"][0]):
            return
        bc1 = 1 - float(group["betas"][0]) ** step
        s = float(lr / bc1)
        scalars["lr"] = s * bc1
        wd = group["weight_decay"]
        if scalars["lr"] != 0 and wd != 0 and _decoupled(self, group):
            scalars["weight_decay"] = (1 - float(1 - lr * wd)) / scalars["lr"]

    def _optc_state(self, group, p, g):
        state = self.state[p]
        if len(state) == 0:
            if group["fused"]:
                _device_dtype_check_for_fused(p)
            state["step"] = _step_tensor(group, p, bool(group["fused"]))
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        t = state["step"]
        if group["amsgrad"]:
            ts = (state["exp_avg"], state["exp_avg_sq"], _state_key(self, state, "max_exp_avg_sq", p))
            return _ADAM3, ts, _next_step(t), t, ()
        return _ADAM2, (state["exp_avg"], state["exp_avg_sq"]), _next_step(t), t, ()


_ADAM2 = ("exp_avg", "exp_avg_sq")
_ADAM3 = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class Adam(_AdamBase, torch.optim.Adam):
    """torch.optim.Adam, stepped by optc (decoupled_weight_decay=True: AdamW)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, nonfinite="propagate", threads=None):
        torch.optim.Adam.__init__(self, params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                                  maximize=maximize, capturable=capturable, differentiable=differentiable,
                                  fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        self._optc_setup(nonfinite, threads)


class AdamW(_AdamBase, torch.optim.AdamW):
    """torch.optim.AdamW, stepped by optc."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 nonfinite="propagate", threads=None):
        torch.optim.AdamW.__init__(self, params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                                   foreach=foreach, capturable=capturable, differentiable=differentiable,
                                   fused=fused)
        self._optc_setup(nonfinite, threads)


class SGD(_OptcOptimizer, torch.optim.SGD):
    """torch.optim.SGD, stepped by optc. The momentum buffer appears in the
    state at a param's first step (none when momentum is 0), as in torch."""

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, nonfinite="propagate",
                 threads=None):
        torch.optim.SGD.__init__(self, params, lr, momentum, dampening, weight_decay, nesterov, maximize=maximize,
                                 foreach=foreach, differentiable=differentiable, fused=fused)
        self._optc_setup(nonfinite, threads)

    def _optc_build(self, group):
        return ("torch.optim.SGD", bool(group["fused"]), (("nesterov", int(bool(group["nesterov"]))),
                                                          ("maximize", int(bool(group["maximize"]))),
                                                          ("weight_decay", _scalar(group["weight_decay"])),
                                                          ("momentum", _scalar(group["momentum"]))))

    def _optc_scalars(self, group):
        return {"lr": _scalar(group["lr"]), "momentum": _scalar(group["momentum"]),
                "dampening": _scalar(group["dampening"]), "weight_decay": _scalar(group["weight_decay"])}

    def _optc_state(self, group, p, g):
        if group["fused"] and getattr(self, "_need_device_dtype_check_for_fused", True):
            _device_dtype_check_for_fused(p)
            self._need_device_dtype_check_for_fused = False
        if group["momentum"] == 0:
            return (), (), 1.0, None, ()
        buf = self.state[p].get("momentum_buffer")
        if buf is None:  # torch: buf = grad.clone() (fused: empty_like(grad)), filled by the first step
            buf = torch.zeros_like(g, memory_format=torch.preserve_format)
            return _SGD, (buf,), 1.0, None, (("momentum_buffer", buf),)
        return _SGD, (buf,), 2.0, None, ()


_SGD = ("momentum_buffer",)


class Adagrad(_OptcOptimizer, torch.optim.Adagrad):
    """torch.optim.Adagrad, stepped by optc ('sum' made in __init__, as torch makes it)."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None, nonfinite="propagate",
                 threads=None):
        torch.optim.Adagrad.__init__(self, params, lr, lr_decay, weight_decay, initial_accumulator_value, eps,
                                     foreach, maximize=maximize, differentiable=differentiable, fused=fused)
        self._optc_setup(nonfinite, threads)

    def _optc_build(self, group):
        return ("torch.optim.Adagrad", bool(group["fused"]), (("maximize", int(bool(group["maximize"]))),
                                                              ("weight_decay", _scalar(group["weight_decay"]))))

    def _optc_scalars(self, group):
        return {"lr": _scalar(group["lr"]), "lr_decay": _scalar(group["lr_decay"]),
                "weight_decay": _scalar(group["weight_decay"]), "eps": _scalar(group["eps"])}

    def _optc_state(self, group, p, g):
        if group["fused"] and getattr(self, "_need_device_dtype_check_for_fused", True):
            _device_dtype_check_for_fused(p)
            self._need_device_dtype_check_for_fused = False
        state = self.state[p]
        if len(state) == 0:  # a param added later (add_param_group): torch's lazy init, from self.defaults
            if group["fused"]:
                _device_dtype_check_for_fused(p)
            state["step"] = (torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=p.device)
                             if group["fused"] else torch.tensor(0.0, dtype=_get_scalar_dtype()))
            state["sum"] = torch.full_like(p, self.defaults["initial_accumulator_value"],
                                           memory_format=torch.preserve_format)
        t = state["step"]
        return _ADAGRAD, (state["sum"],), _next_step(t), t, ()


_ADAGRAD = ("sum",)


class RMSprop(_OptcOptimizer, torch.optim.RMSprop):
    """torch.optim.RMSprop, stepped by optc (torch has no fused RMSprop, so neither has this)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False, *, nonfinite="propagate",
                 threads=None):
        torch.optim.RMSprop.__init__(self, params, lr, alpha, eps, weight_decay, momentum, centered, capturable,
                                     foreach, maximize, differentiable)
        self._optc_setup(nonfinite, threads)

    def _optc_build(self, group):
        return ("torch.optim.RMSprop", False, (("centered", int(bool(group["centered"]))),
                                               ("maximize", int(bool(group["maximize"]))),
                                               ("weight_decay", _scalar(group["weight_decay"])),
                                               ("momentum", _scalar(group["momentum"]))))

    def _optc_scalars(self, group):
        return {"lr": _scalar(group["lr"]), "alpha": _scalar(group["alpha"]), "eps": _scalar(group["eps"]),
                "weight_decay": _scalar(group["weight_decay"]), "momentum": _scalar(group["momentum"])}

    def _optc_state(self, group, p, g):
        state = self.state[p]
        if len(state) == 0:
            state["step"] = (torch.zeros((), dtype=_get_scalar_dtype(), device=p.device) if group["capturable"]
                             else torch.zeros((), dtype=_get_scalar_dtype()))
            state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["momentum"] > 0:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["centered"]:
                state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        momentum, centered = group["momentum"] > 0, bool(group["centered"])
        names = _RMSPROP[momentum, centered]
        ts = tuple(_state_key(self, state, k, p) for k in names)
        t = state["step"]
        return names, ts, _next_step(t), t, ()


_RMSPROP = {(m, c): ("square_avg",) + (("momentum_buffer",) if m else ()) + (("grad_avg",) if c else ())
            for m in (False, True) for c in (False, True)}


def _state_key(opt, state, key, p):
    """state[key], or a KeyError naming the param."""
    t = state.get(key)
    if t is not None:
        return t
    index = next((i for group in opt.param_groups for i, q in enumerate(group["params"]) if q is p), "?")
    raise KeyError(f"{type(opt).__name__}: param {index}: its state has no {key!r} (it was made before the option "
                   f"that needs it was set; torch fails here too)")


_LION = ("exp_avg",)


class Lion(_OptcOptimizer, torch.optim.Optimizer):
    """lion-pytorch's Lion (lucidrains), stepped by optc: the bits of its
    update_fn, state {'exp_avg'} as it keeps it. decoupled_weight_decay
    divides weight_decay by the initial lr, as lion-pytorch does; use_triton
    is not supported (optc gives update_fn's bits)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, use_triton=False,
                 decoupled_weight_decay=False, *, nonfinite="propagate", threads=None):
        # lion-pytorch asserts these; torch's optimizers raise ValueError
        if not float(lr) > 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        for i, b in enumerate(betas):
            if not 0.0 <= float(b) <= 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        if not 0.0 <= float(weight_decay):
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if use_triton:
            raise ValueError("use_triton=True: optc gives the bits of lion-pytorch's update_fn, not of its "
                             "triton kernel")
        self._init_lr = lr
        self.decoupled_wd = decoupled_weight_decay
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self._optc_setup(nonfinite, threads)
        self._optc_lion_steps = 0

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_optc_lion_steps", 0)

    def _wd(self, group):
        wd = _scalar(group["weight_decay"])
        return wd / float(self._init_lr) if self.decoupled_wd else wd

    def _optc_build(self, group):
        return ("optc.Lion", False, (("weight_decay", self._wd(group)),))

    def _optc_scalars(self, group):
        b1, b2 = group["betas"]
        return {"lr": _scalar(group["lr"]), "beta1": _scalar(b1), "beta2": _scalar(b2),
                "weight_decay": self._wd(group)}

    def _optc_state(self, group, p, g):
        state = self.state[p]
        if len(state) == 0:
            state["exp_avg"] = torch.zeros_like(p)
        # lion-pytorch keeps no step count; optc's Lion reads none, but every
        # step takes one: the optimizer's own count
        return _LION, (state["exp_avg"],), float(self._optc_lion_steps + 1), None, ()

    def _optc_after_step(self, runs):
        self._optc_lion_steps += 1
