"""optc.torch's optimizers: torch.optim's AdamW, Adam, SGD, Adagrad and
RMSprop (subclasses of torch's own classes, whose constructors and checks
run unchanged) and lion-pytorch's Lion, each stepped by optc."""
import torch
import torch.optim

from ._optimizer import (Build, OptcOptimizer, ParamState, _device_dtype_check_for_fused, _get_scalar_dtype,
                         next_step, state_key, step_tensor)

__all__ = ["AdamW", "Adam", "SGD", "Adagrad", "RMSprop", "Lion"]


def _scalar(x):
    return float(x)


_NO_STATE = ParamState((), (), 1.0, None, ())

def _decoupled(opt, group):
    return bool(group.get("decoupled_weight_decay", False)) or isinstance(opt, AdamW)


class _AdamBase(OptcOptimizer):
    def _optc_build(self, group):
        name = "torch.optim.AdamW" if _decoupled(self, group) else "torch.optim.Adam"
        return Build(name, bool(group["fused"]), (("amsgrad", int(bool(group["amsgrad"]))),
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
            state["step"] = step_tensor(group, p, bool(group["fused"]))
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        t = state["step"]
        if group["amsgrad"]:
            ts = (state["exp_avg"], state["exp_avg_sq"], state_key(self, state, "max_exp_avg_sq", p))
            return ParamState(_ADAM3, ts, next_step(t), t, ())
        return ParamState(_ADAM2, (state["exp_avg"], state["exp_avg_sq"]), next_step(t), t, ())


_ADAM2 = ("exp_avg", "exp_avg_sq")
_ADAM3 = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class Adam(_AdamBase, torch.optim.Adam):
    """torch.optim.Adam, stepped by optc (decoupled_weight_decay=True: AdamW)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, nonfinite="propagate", threads=None, in_backward=False, max_norm=None, speculate=False,
                 stochastic_rounding=False, seed=0, compensation=None):
        torch.optim.Adam.__init__(self, params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                                  maximize=maximize, capturable=capturable, differentiable=differentiable,
                                  fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate, stochastic_rounding, seed,
                         compensation)


class AdamW(_AdamBase, torch.optim.AdamW):
    """torch.optim.AdamW, stepped by optc."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 nonfinite="propagate", threads=None, in_backward=False, max_norm=None, speculate=False,
                 stochastic_rounding=False, seed=0, compensation=None):
        torch.optim.AdamW.__init__(self, params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                                   foreach=foreach, capturable=capturable, differentiable=differentiable,
                                   fused=fused)
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate, stochastic_rounding, seed,
                         compensation)


class SGD(OptcOptimizer, torch.optim.SGD):
    """torch.optim.SGD, stepped by optc. The momentum buffer appears in the
    state at a param's first step (none when momentum is 0), as in torch."""

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, nonfinite="propagate",
                 threads=None, in_backward=False, max_norm=None, speculate=False,
                 stochastic_rounding=False, seed=0, compensation=None):
        torch.optim.SGD.__init__(self, params, lr, momentum, dampening, weight_decay, nesterov, maximize=maximize,
                                 foreach=foreach, differentiable=differentiable, fused=fused)
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate, stochastic_rounding, seed,
                         compensation)

    def _optc_build(self, group):
        return Build("torch.optim.SGD", bool(group["fused"]), (("nesterov", int(bool(group["nesterov"]))),
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
            return _NO_STATE
        buf = self.state[p].get("momentum_buffer")
        if buf is None:  # torch: buf = grad.clone() (fused: empty_like(grad)), filled by the first step
            buf = torch.zeros_like(g, memory_format=torch.preserve_format)
            return ParamState(_SGD, (buf,), 1.0, None, (("momentum_buffer", buf),))
        return ParamState(_SGD, (buf,), 2.0, None, ())


_SGD = ("momentum_buffer",)


class Adagrad(OptcOptimizer, torch.optim.Adagrad):
    """torch.optim.Adagrad, stepped by optc ('sum' made in __init__, as torch makes it)."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None, nonfinite="propagate",
                 threads=None, in_backward=False, max_norm=None, speculate=False,
                 stochastic_rounding=False, seed=0, compensation=None):
        torch.optim.Adagrad.__init__(self, params, lr, lr_decay, weight_decay, initial_accumulator_value, eps,
                                     foreach, maximize=maximize, differentiable=differentiable, fused=fused)
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate, stochastic_rounding, seed,
                         compensation)

    def _optc_build(self, group):
        return Build("torch.optim.Adagrad", bool(group["fused"]), (("maximize", int(bool(group["maximize"]))),
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
        return ParamState(_ADAGRAD, (state["sum"],), next_step(t), t, ())


_ADAGRAD = ("sum",)


class RMSprop(OptcOptimizer, torch.optim.RMSprop):
    """torch.optim.RMSprop, stepped by optc (torch has no fused RMSprop, so neither has this)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False, *, nonfinite="propagate",
                 threads=None, in_backward=False, max_norm=None, speculate=False,
                 stochastic_rounding=False, seed=0, compensation=None):
        torch.optim.RMSprop.__init__(self, params, lr, alpha, eps, weight_decay, momentum, centered, capturable,
                                     foreach, maximize, differentiable)
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate, stochastic_rounding, seed,
                         compensation)

    def _optc_build(self, group):
        return Build("torch.optim.RMSprop", False, (("centered", int(bool(group["centered"]))),
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
        ts = tuple(state_key(self, state, k, p) for k in names)
        t = state["step"]
        return ParamState(names, ts, next_step(t), t, ())


_RMSPROP = {(m, c): ("square_avg",) + (("momentum_buffer",) if m else ()) + (("grad_avg",) if c else ())
            for m in (False, True) for c in (False, True)}


_LION = ("exp_avg",)


class Lion(OptcOptimizer, torch.optim.Optimizer):
    """lion-pytorch's Lion (lucidrains), stepped by optc: the bits of its
    update_fn, state {'exp_avg'} as it keeps it. decoupled_weight_decay
    divides weight_decay by the initial lr, as lion-pytorch does; use_triton
    is not supported (optc gives update_fn's bits)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, use_triton=False,
                 decoupled_weight_decay=False, *, nonfinite="propagate", threads=None, in_backward=False, max_norm=None, speculate=False,
                 stochastic_rounding=False, seed=0, compensation=None):
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
        self._optc_setup(nonfinite, threads, in_backward, max_norm, speculate, stochastic_rounding, seed,
                         compensation)
        self._optc_lion_steps = 0

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_optc_lion_steps", 0)

    def _wd(self, group):
        wd = _scalar(group["weight_decay"])
        return wd / float(self._init_lr) if self.decoupled_wd else wd

    def _optc_build(self, group):
        return Build("optc.Lion", False, (("weight_decay", self._wd(group)),))

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
        return ParamState(_LION, (state["exp_avg"],), float(self._optc_lion_steps + 1), None, ())

    def _optc_after_step(self):
        self._optc_lion_steps += 1
