"""The cases of titan_worker.py: torchtitan's Trainer with
optc.torch.integrations.OptcOptimizersContainer against the same Trainer
with torchtitan's own OptimizersContainer (torch.optim), 2 gloo ranks.

modes:
- train: the stock and optc trainers run 6 steps each; their losses and
  grad norms, final params (local shards) and flat FQN-keyed
  state_dict() are the same bits (but the groups' 'foreach' and 'fused'
  keys, where the two run different implementations).
- ckpt: the stock and optc trainers run 6 steps each, saving torchtitan
  checkpoints (DCP) at steps 3 and 6; then an optc trainer starts from the
  stock trainer's step-3 checkpoint and a stock one from optc's, and both
  run steps 4..6. Every run's losses and grad norms, final params (local
  shards) and the flat FQN-keyed state_dict() are the stock 6-step run's,
  bit for bit.
- warmup: state_dict() before any step (torchtitan's init_optim_state:
  zero grads, lr = 0, one step): both containers' flat dicts are the same,
  the params unchanged; then 6 steps each, the same bits.

param_groups "adamw" is torchtitan's default_adamw (one AdamW group);
"mixed" puts the norms in an Adam group without weight decay and the rest
in AdamW; "names" gives each of optc's other optimizers some params (SGD
with momentum, Adagrad, RMSprop, Lion) against a stock container that
names torch's classes (lion-pytorch's Lion); "nosqrt" is SGD and Lion
only, whose fp32 for-loop steps take no square root and so run everywhere.
"""

SQRT = {"AdamW", "Adam", "Adagrad", "RMSprop"}

GROUPS = {"adamw": ("AdamW",), "mixed": ("Adam", "AdamW"), "names": ("SGD", "Adagrad", "RMSprop", "Lion", "AdamW"),
          "nosqrt": ("SGD", "Lion")}


def _case(mode, dtype, impl, groups="adamw", ref_impl=None):
    vs = f"-vs-torch-{ref_impl}" if ref_impl and ref_impl != impl else ""
    return dict(name=f"{mode}-{groups}-{dtype}-{impl}{vs}", mode=mode, dtype=dtype, impl=impl, groups=groups,
                ref_impl=ref_impl or impl)


def cases():
    return [
        _case("ckpt", "bf16", "for-loop"),
        _case("ckpt", "bf16", "fused"),
        _case("ckpt", "fp32", "fused"),
        _case("ckpt", "fp32", "for-loop"),
        # optc's foreach is the for-loop's bits (torch's foreach in bf16
        # is not): against torch's for-loop
        _case("train", "bf16", "foreach", ref_impl="for-loop"),
        _case("warmup", "bf16", "for-loop"),
        _case("warmup", "fp32", "fused"),
        _case("ckpt", "bf16", "fused", groups="mixed"),
        _case("ckpt", "bf16", "for-loop", groups="names"),
        _case("ckpt", "fp32", "for-loop", groups="names"),
        _case("train", "fp32", "for-loop", groups="nosqrt"),
    ]


def needs_torch_sqrt(case):
    """A fp32 for-loop step that takes torch's f32 sqrt (optc's mkl_sqrt)."""
    return case["dtype"] == "fp32" and case["impl"] != "fused" and bool(SQRT & set(GROUPS[case["groups"]]))
