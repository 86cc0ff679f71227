"""The step inside the backward (`in_backward=True`).

Each param is stepped as soon as its grad is final: a post-accumulate-grad
hook (which FSDP2 calls on the sharded param after its reduce-scatter, and
after the copy to the host when offloaded) hands the param to optc's own
thread and returns at once, so the step runs beside the rest of the
backward. The thread takes every param queued by then as one batch, one
program call per layout. `opt.step()` waits for what is in flight, steps
whatever was not stepped yet, and returns. An element-wise step is the
same whenever it runs, so the bits are those of stepping after the
backward.

What needs every grad first, the clip norm and the skip on a non-finite
grad, is handled one of two ways:
- speculate=False: each grad's sum of squares is measured as it lands, so
  the norm (and whether every grad is finite) is known when the backward
  ends; the step then runs once, after it (the norm's pass is hidden, the
  step is not).
- speculate=True: each param is also stepped as it lands, with the
  coefficient 1, after copying the param and states it overwrites. When
  the backward ends and the coefficient is 1 (and the grads finite), the
  step is done; otherwise the copies are put back and the step is run
  again, exactly, with the coefficient. Once the sum of squares measured so
  far already exceeds max_norm, the coefficient will be below 1, and the
  params still to come wait for the norm instead of speculating.

The norm in this mode is each grad's own f64 sum of squares (fixed 4096
element blocks), added in param order per sharding, then over the ranks in
rank order: the same bits however the grads were batched, on any timing.

Gradient accumulation: `with opt.no_step():` around every micro-batch's
backward but the last; the hooks then leave the grads to accumulate.
"""
import contextlib
import math
import threading
import weakref

import torch

from .. import _capi
from . import _dist
from ._optimizer import _norm_tensor, clip_coef, fold_over_ranks


class InBackward:
    """The in-backward driver of one optimizer (opt._optc_inbwd)."""

    def __init__(self, opt, speculate):
        self.opt_ref = weakref.ref(opt)
        self.speculate = bool(speculate)
        self.cond = threading.Condition()
        self.queue = []  # (param, CUDA event or None), in arrival order
        self.busy = False
        self.error = None
        self.thread = None
        self.hooks = {}  # id(param) -> (weakref to the param, hook handle)
        self.places = {}  # id(param) -> (group index, index in the group, index over all): when hooks were checked
        self.no_step_depth = 0
        self.grad_scale = None  # (value, is_tensor) set by opt.set_grad_scale for the next step
        self.streams = {}  # CUDA device index -> the side stream the steps run on
        self.spare = {}  # id(tensor) -> (tensor, its backup buffer): kept between steps, so no step allocates
        self._new_iteration()

    def _new_iteration(self):
        self.landed = set()  # ids of params whose grads landed in this backward
        self.stepped = {}  # id(param) -> its committed or speculative runs' param (for the record)
        self.pending = []  # speculative runs, not committed: (runs, backups)
        self.sumsq = {}  # id(param) -> its grad's f64 sum of squares (scaled)
        self.measured_so_far = 0.0  # this rank's sum of those, in arrival order (only to stop speculating)
        self.deferred_any = False
        self.context_scale = self.grad_scale
        self.counts = {"stepped_in_backward": 0, "speculated": 0, "measured_in_backward": 0, "redone": 0,
                       "stepped_after": 0, "batches": 0}

    # ---- hooks ------------------------------------------------------------------------------

    def attach(self):
        """Hooks every param of param_groups that has none of ours (params
        swapped in after construction, as accelerate does, included)."""
        opt = self.opt_ref()
        places = {}
        index = 0
        for gi, group in enumerate(opt.param_groups):
            for pi, p in enumerate(group["params"]):
                places[id(p)] = (gi, pi, index)
                index += 1
                h = self.hooks.get(id(p))
                if h is not None and h[0]() is p:
                    continue
                if not p.requires_grad:
                    continue
                handle = p.register_post_accumulate_grad_hook(_make_hook(weakref.ref(self)))
                self.hooks[id(p)] = (weakref.ref(p), handle)
        for k in [k for k in self.hooks if k not in places]:
            _, handle = self.hooks.pop(k)
            handle.remove()
        self.places = places

    def landed_hook(self, p):
        """A param's grad is final (called by autograd or FSDP2 on the
        thread that runs the backward): queue it and return."""
        if self.no_step_depth or id(p) not in self.places:
            return
        ev = None
        local = _dist.local(p.grad) if p.grad is not None else None
        if local is not None and local.is_cuda:
            ev = torch.cuda.current_stream(local.device).record_event()
        with self.cond:
            self.queue.append((p, ev))
            if self.thread is None:
                self.thread = threading.Thread(target=_worker, args=(weakref.ref(self),), daemon=True,
                                               name="optc-in-backward")
                self.thread.start()
            self.cond.notify_all()

    @contextlib.contextmanager
    def no_step(self):
        self.no_step_depth += 1
        try:
            yield
        finally:
            self.no_step_depth -= 1

    # ---- the thread's work ------------------------------------------------------------------

    def take(self):
        """The worker: the next batch (waits for one); None when the optimizer is gone."""
        with self.cond:
            while not self.queue:
                self.cond.wait(timeout=1.0)
                if self.opt_ref() is None:
                    return None
            batch, self.queue = self.queue, []
            self.busy = True
            return batch

    def done(self):
        with self.cond:
            self.busy = False
            self.cond.notify_all()

    def wait_idle(self):
        with self.cond:
            while self.queue or self.busy:
                self.cond.wait()
        if self.error is not None:  # nothing half-stepped survives it
            e, self.error = self.error, None
            with torch.no_grad():
                self._undo()
            self._new_iteration()
            raise e

    def process(self, batch):
        """Steps (or measures) one batch of params whose grads landed."""
        opt = self.opt_ref()
        if opt is None or self.error is not None:
            return
        params, events = [], []
        for p, ev in batch:
            if id(p) in self.landed:
                raise RuntimeError(f"{type(opt).__name__}: in_backward=True: a param's grad landed twice before "
                                   f"opt.step(); wrap every micro-batch's backward but the last in "
                                   f"`with opt.no_step():`")
            self.landed.add(id(p))
            params.append(p)
            if ev is not None:
                events.append(ev)
        with torch.no_grad(), self._stream(params, events):
            runs = opt._optc_collect_these(sorted((self.places[id(p)] + (p,) for p in params),
                                                  key=lambda x: x[2]))
            if not runs:
                return
            self.counts["batches"] += 1
            ctx = self._context(opt, runs)
            if not self._global(opt):
                self._step_now(opt, runs, ctx)
                return
            self._measure(opt, runs, ctx)
            self.counts["measured_in_backward"] += sum(len(r.owners) for r in runs)
            if self.speculate and self._may_speculate(opt):
                backups = [self._backup(r) for r in runs]
                _, _ = opt._optc_execute(runs, ctx, _capi.OPTC_CLIP_NONE, None, None, "propagate")
                self.pending.append((runs, backups))
                self.counts["speculated"] += sum(len(r.owners) for r in runs)
                for r in runs:
                    for p in _params_of(r):
                        self.stepped[id(p)] = True
            else:
                self.deferred_any = True

    def _global(self, opt):
        """Whether the step waits on every grad: a clip norm, or a skip or
        error on a non-finite grad."""
        return opt._optc_max_norm is not None or opt._optc_nonfinite != "propagate"

    def _may_speculate(self, opt):
        """Not once what was measured so far already clips."""
        m = opt._optc_max_norm
        return m is None or math.sqrt(self.measured_so_far) <= m

    def _context(self, opt, runs):
        scale = self.context_scale
        if scale is None:
            return opt._optc_context(runs, None, False)
        return opt._optc_context(runs, scale[0], scale[1])

    def _step_now(self, opt, runs, ctx):
        _, _ = opt._optc_execute(runs, ctx, _capi.OPTC_CLIP_NONE, None, None, "propagate")
        opt._optc_commit(runs)
        self.counts["stepped_in_backward"] += sum(len(r.owners) for r in runs)
        for r in runs:
            for p in _params_of(r):
                self.stepped[id(p)] = True

    def _measure(self, opt, runs, ctx):
        """Each grad's own sum of squares (one program call per tensor, so
        that the sum does not depend on how the grads were batched)."""
        for r in runs:
            prog = opt._optc_norm_program(r) if r.params else None
            sc = opt._optc_norm_scalars(r, ctx) if r.params else None
            for p, lg in zip(_params_of(r), _grads_of(r)):
                if lg is None:
                    v = 0.0
                else:
                    one = _single(r, lg)
                    v = opt._optc_run(one, prog, dict(sc), ctx.threads).grad_sumsq
                self.sumsq[id(p)] = v
                self.measured_so_far += v

    def _stream(self, params, events):
        """On CUDA: the side stream of the params' device, after the grads'
        producers; on the CPU: nothing."""
        if not events:
            return contextlib.nullcontext()
        dev = _dist.local(params[0]).device
        s = self.streams.get(dev.index)
        if s is None:
            s = self.streams[dev.index] = torch.cuda.Stream(dev)
        for ev in events:
            s.wait_event(ev)
        return torch.cuda.stream(s)

    # ---- the end of the backward: opt.step() ------------------------------------------------

    def finish(self, grad_scale, scale_is_tensor, max_norm, grad_norm):
        """opt.step() / fused_step(): waits, then steps what is left."""
        opt = self.opt_ref()
        self.wait_idle()
        if grad_scale is not None:
            given = (grad_scale, scale_is_tensor)
            if self.landed and self.context_scale != given:
                self._new_iteration()
                raise ValueError(f"{type(opt).__name__}: in_backward=True: grads were stepped in the backward "
                                 f"with grad_scale {self.context_scale and self.context_scale[0]!r}; give the "
                                 f"scale before the backward with opt.set_grad_scale(...)")
            self.context_scale = given
        if max_norm is not None and opt._optc_max_norm is not None and max_norm != opt._optc_max_norm:
            raise ValueError(f"{type(opt).__name__}: max_norm {max_norm} but the optimizer was built with "
                             f"max_norm={opt._optc_max_norm}")
        if max_norm is not None and opt._optc_max_norm is None and self.landed:
            raise ValueError(f"{type(opt).__name__}: in_backward=True steps in the backward, before max_norm "
                             f"given to fused_step is known: build the optimizer with max_norm=...")
        max_norm = max_norm if max_norm is not None else opt._optc_max_norm
        self._flush_streams()
        try:
            with torch.no_grad():
                return self._finish(opt, max_norm, grad_norm)
        finally:
            opt.in_backward_stats = dict(self.counts)
            self.grad_scale = None
            self._new_iteration()
            self.attach()

    def _finish(self, opt, max_norm, grad_norm):
        rest = opt._optc_collect(exclude=self.stepped)
        runs_all = [r for runs, _ in self.pending for r in runs] + rest
        if not runs_all:
            opt._optc_last = []
            return None if max_norm is None else torch.tensor(0.0)
        ctx = self._context(opt, rest or runs_all)
        if not self._global(opt) and max_norm is None:
            if rest:
                opt._optc_execute(rest, ctx, _capi.OPTC_CLIP_NONE, None, None, "propagate")
                opt._optc_commit(rest)
                self.counts["stepped_after"] += sum(len(r.owners) for r in rest)
            opt._optc_end_step()
            return None
        # every grad's sum of squares: those measured in the backward, and the rest now
        unmeasured = [r for r in rest if any(id(p) not in self.sumsq for p in _params_of(r))]
        if unmeasured:
            self._measure(opt, unmeasured, ctx)
        norm_dtype = ctx.norm_dtype
        for r in runs_all:
            norm_dtype = torch.promote_types(norm_dtype, r.grad_dtype)
        ctx = ctx._replace(norm_dtype=norm_dtype)
        sumsq = self._total_sumsq(opt)
        mode = opt._optc_nonfinite
        if mode != "propagate" and not math.isfinite(sumsq):
            self._undo()
            opt._optc_refuse_nonfinite(sumsq)
            return None if max_norm is None else _norm_tensor(math.sqrt(sumsq), norm_dtype, ctx.first)
        total = None
        if max_norm is not None:
            total = grad_norm if grad_norm is not None else math.sqrt(sumsq)
            coef = clip_coef(max_norm, total, norm_dtype)
            if coef != 1.0 and self.pending:
                # the speculation clipped with 1: put back what it overwrote, and step everything again
                self.counts["redone"] = self.counts["speculated"]
                self._undo()
                rest = opt._optc_collect()
        for runs, _ in self.pending:  # speculated with coefficient 1, and 1 it is
            opt._optc_commit(runs)
            self.counts["stepped_in_backward"] += sum(len(r.owners) for r in runs)
        if rest:
            self.counts["stepped_after"] += sum(len(r.owners) for r in rest)
            clip = _capi.OPTC_CLIP_GIVEN if max_norm is not None else _capi.OPTC_CLIP_NONE
            rctx = self._context(opt, rest)._replace(norm_dtype=norm_dtype)
            opt._optc_execute(rest, rctx, clip, max_norm, total, "propagate")
            opt._optc_commit(rest)
        opt._optc_end_step()
        return None if max_norm is None else _norm_tensor(total, norm_dtype, ctx.first)

    def _total_sumsq(self, opt):
        """The grads' sums of squares in param order, per sharding, then over
        the ranks."""
        parts = {}
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                v = self.sumsq.get(id(p))
                if v is None:
                    continue
                key = _dist.reduce_key(p, p.grad, "a param") if _dist.is_dtensor(p) else None
                parts[key] = parts.get(key, 0.0) + v
        return fold_over_ranks(parts)

    def _backup(self, r):
        """Copies of what a step of run r overwrites (its params and states),
        into buffers kept from step to step."""
        out = []
        for t in r.written:
            if not t.numel():
                continue
            kept = self.spare.get(id(t))
            if kept is None or kept[0] is not t:
                kept = self.spare[id(t)] = (t, torch.empty_like(t))
            kept[1].copy_(t)
            out.append((t, kept[1]))
        return out

    def _undo(self):
        """Puts back what the speculative steps overwrote."""
        for runs, backups in self.pending:
            for r, b in zip(runs, backups):
                _restore(r, b)
        self.pending = []
        self.stepped = {}

    def _flush_streams(self):
        for dev, s in self.streams.items():
            torch.cuda.current_stream(dev).wait_stream(s)


def _make_hook(ref):
    def hook(p):
        drv = ref()
        if drv is not None:
            drv.landed_hook(p)
    return hook


def _worker(ref):
    """optc's thread: takes batches of landed params and steps them."""
    while True:
        drv = ref()
        if drv is None:
            return
        batch = drv.take()
        if batch is None:
            return
        try:
            drv.process(batch)
        except BaseException as e:  # raised again by opt.step()
            if drv.error is None:
                drv.error = e
        finally:
            drv.done()
        del drv


def _params_of(r):
    """The params (module-level, DTensors where sharded) of a run, empty
    shards included, in the run's order."""
    return r.owners


def _grads_of(r):
    """Each of _params_of(r)'s local grads, None for an empty shard."""
    return r.owner_grads


def _single(r, lg):
    """A view of run r holding one tensor (the one whose local grad is lg)."""
    k = next(i for i, g in enumerate(r.grads) if g is lg)
    one = type(r).__new__(type(r))
    for f in type(r).__slots__:
        setattr(one, f, getattr(r, f))
    one.params, one.grads, one.states, one.where = [r.params[k]], [r.grads[k]], [r.states[k]], [r.where[k]]
    return one


def _restore(r, backup):
    for t, b in backup:
        t.copy_(b)
