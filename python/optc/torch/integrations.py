"""optc.torch's optimizers in the trainers people use: torchtitan and HF Trainer.

Each adapter is small: it names optc.torch's class where the trainer would
name torch.optim's, and leaves the rest (param groups, LR schedules, grad
clipping, FSDP2 sharding, checkpoints) to the trainer. optc.torch's
optimizers are torch.optim.Optimizers that step FSDP2's DTensors on their
local shards and resolve every pointer at each step, so nothing else has to
change.

torchtitan (0.3), in a config_registry function:

    from optc.torch.integrations import OptcOptimizersContainer
    config = llama3_debugmodel()
    config.optimizer = OptcOptimizersContainer.Config.of(config.optimizer)

HF Trainer (transformers 5):

    from optc.torch.integrations import optc_optimizer_cls_and_kwargs
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      optimizer_cls_and_kwargs=optc_optimizer_cls_and_kwargs(args))

Importing this module needs neither torchtitan nor transformers:
OptcOptimizersContainer is made on first use (it subclasses torchtitan's
class), and the HF helper imports transformers only when called.
"""
from ._optimizers import SGD, Adagrad, Adam, AdamW, Lion, RMSprop

# OptcOptimizersContainer is made on first use (module __getattr__), and is not in
# __all__ so that `import *` does not need torchtitan.
__all__ = ["OPTIMIZERS", "optc_optimizer_cls_and_kwargs"]

# The names trainers use for optimizers, and optc.torch's class for each.
OPTIMIZERS = {"AdamW": AdamW, "Adam": Adam, "SGD": SGD, "Adagrad": Adagrad, "RMSprop": RMSprop, "Lion": Lion}

# Those with a fused=True (torch's fused CPU/CUDA kernel); the others have
# one implementation: torch's for-loop (RMSprop), lion-pytorch's update_fn (Lion).
_FUSED = ("AdamW", "Adam", "SGD", "Adagrad")


# ---- HF Trainer ----------------------------------------------------------------------------

# args.optim -> the optc.torch class of the torch.optim class HF builds for it.
_HF_OPTIM = {"adamw_torch": "AdamW", "adamw_torch_fused": "AdamW", "sgd": "SGD", "adagrad": "Adagrad",
             "rmsprop": "RMSprop"}


def optc_optimizer_cls_and_kwargs(args, name=None, **overrides):
    """`optimizer_cls_and_kwargs` for transformers' Trainer: optc.torch's
    optimizer with the arguments HF's own choice would get from `args` (a
    TrainingArguments).

    name=None: the optimizer args.optim names, which must be one HF builds
    from torch.optim: "adamw_torch" (AdamW: the for-loop's bits),
    "adamw_torch_fused" (AdamW, fused=True: torch's fused kernel's bits;
    TrainingArguments' default with torch >= 2.8), "sgd", "adagrad" or
    "rmsprop". The kwargs are what Trainer.get_optimizer_cls_and_kwargs(args)
    gives torch.optim's class (lr; Adam's betas and eps; optim_args), so
    the step has the bits of the optimizer HF would have made.

    name="AdamW", "Adam", "SGD", "Adagrad", "RMSprop" or "Lion": that class,
    with lr = args.learning_rate, Adam's and AdamW's betas and eps from
    args.adam_beta1/2 and adam_epsilon, and fused=True where args.optim is
    "adamw_torch_fused" and the class has a fused kernel.

    overrides are set last (e.g. nonfinite="skip", or fused=False).
    weight_decay is not among the kwargs, as in HF's own choice: Trainer's
    create_optimizer puts args.weight_decay in one param group and 0.0 in
    the group of biases and norms. Under FSDP2, Trainer builds the optimizer
    on the model's plain params and accelerate then swaps FSDP2's sharded
    DTensors into its param_groups; optc.torch resolves its params at every
    step, so it steps the shards."""
    optim = str(getattr(args.optim, "value", args.optim))
    if name is None:
        name = _HF_OPTIM.get(optim)
        if name is None:
            raise ValueError(f"optc_optimizer_cls_and_kwargs: args.optim={optim!r} is not one optc.torch gives: "
                             f"use one of {sorted(_HF_OPTIM)}, or name the optimizer (name=one of "
                             f"{sorted(OPTIMIZERS)})")
        from transformers import Trainer

        torch_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
        if torch_cls.__name__ != name:  # HF changed what it builds for args.optim
            raise ValueError(f"optc_optimizer_cls_and_kwargs: transformers builds {torch_cls.__module__}."
                             f"{torch_cls.__name__} for args.optim={optim!r}, not torch.optim.{name}")
        kwargs = dict(kwargs)
    else:
        if name not in OPTIMIZERS:
            raise ValueError(f"optc_optimizer_cls_and_kwargs: no optc.torch optimizer {name!r}; one of "
                             f"{sorted(OPTIMIZERS)}")
        kwargs = {"lr": args.learning_rate}
        if name in ("AdamW", "Adam"):
            kwargs.update(betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
        if optim == "adamw_torch_fused" and name in _FUSED:
            kwargs["fused"] = True
    kwargs.update(overrides)
    return OPTIMIZERS[name], kwargs


# ---- torchtitan ----------------------------------------------------------------------------

def _torchtitan_container():
    from dataclasses import dataclass, fields

    from torchtitan.components.optimizer import OptimizersContainer

    class OptcOptimizersContainer(OptimizersContainer):
        """torchtitan's OptimizersContainer whose optimizers are optc.torch's.

        Named in a torchtitan config as its optimizer
        (`config.optimizer = OptcOptimizersContainer.Config(...)`, or
        `.Config.of(config.optimizer)` to keep an existing config's
        param groups and implementation). Everything else is torchtitan's
        own: param groups by FQN pattern, the flat FQN-keyed state_dict()
        its checkpointer saves (torch.optim's states and group keys, so a
        checkpoint of either container loads into the other), and
        init_optim_state's warm-up step before a save or load (zero grads,
        lr = 0: an ordinary step, which leaves the params as they are).

        optimizer_name: "AdamW", "Adam", "SGD", "Adagrad", "RMSprop" or
        "Lion" (optc.torch's); any other (torchtitan's "DistMuon") is
        torchtitan's own, stepped by torch. optimizer_factory_kwargs_by_name
        may carry optc's own options, e.g. {"AdamW": {"nonfinite": "skip"}}.

        implementation: "for-loop" and "foreach" give the for-loop's bits
        (torch.optim.X(foreach=False); in fp32 also foreach's), "fused"
        gives torch's fused kernel's bits (fused=True: on the CPU too). The
        groups keep torchtitan's 'fused' and 'foreach' keys, as the stock
        container writes them, so that checkpoints of either container
        load into the other. RMSprop and Lion have one implementation
        (torch's for-loop; lion-pytorch's update_fn) and ignore those keys,
        as torch's RMSprop does.
        "fused_opt_states_bf16" (fp32 params, bf16 Adam states, from
        torchtitan's step pre-hook, for torch's CUDA-only mixed-precision
        fused kernel) is refused: optc does not promise that kernel's bits,
        and torch's CPU Adam refuses the mixed dtypes, so there are none
        here to match."""

        @dataclass(kw_only=True, slots=True)
        class Config(OptimizersContainer.Config):
            @classmethod
            def of(cls, config):
                """This Config with the fields of another
                OptimizersContainer.Config (e.g. torchtitan's
                default_adamw(...))."""
                return cls(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})

        def __init__(self, config, *, model_parts):
            if config.implementation == "fused_opt_states_bf16":
                raise ValueError("OptcOptimizersContainer: implementation 'fused_opt_states_bf16' (fp32 params "
                                 "with bf16 Adam states, torch's CUDA mixed-precision kernel) has no bits optc "
                                 "promises; use 'fused', 'foreach' or 'for-loop'")
            super().__init__(config, model_parts=model_parts)

        @staticmethod
        def _resolve_optimizer_factory(name):
            cls = OPTIMIZERS.get(name)
            return cls if cls is not None else OptimizersContainer._resolve_optimizer_factory(name)

    OptcOptimizersContainer.__module__ = OptcOptimizersContainer.Config.__module__ = __name__
    OptcOptimizersContainer.__qualname__ = "OptcOptimizersContainer"
    OptcOptimizersContainer.Config.__qualname__ = "OptcOptimizersContainer.Config"
    return OptcOptimizersContainer


_LAZY = {}


def __getattr__(name):
    # OptcOptimizersContainer subclasses torchtitan's class: it is made when
    # first asked for, so that importing this module does not need torchtitan.
    if name == "OptcOptimizersContainer":
        if name not in _LAZY:
            try:
                _LAZY[name] = _torchtitan_container()
            except ImportError as e:
                raise ImportError(f"optc.torch.integrations.OptcOptimizersContainer needs torchtitan "
                                  f"(pip install torchtitan): {e}") from e
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
