"""Runs torchtune's recipes/full_finetune_distributed.py (unchanged) in this
process on the CPU, as a one-rank gloo group, with timing probes.

  python tt_wrap.py STEPS_JSONL --config CFG.yaml [key=value ...]

Needs tests/torch (for torchtune_cpu's CPU shims) and the torchtune source on
sys.path (run.py sets PYTHONPATH and $TORCHTUNE_SRC).

Probes (none changes a number the recipe computes):
- the recipe class's ``_loss_step`` (forward + loss) is wrapped to time it
  and count the batch's counted tokens (labels != ignore_index, what the
  recipe divides by);
- ``torch.autograd.backward`` (what ``Tensor.backward`` calls) is timed;
- global optimizer step pre/post hooks time ``optimizer.step()``;
- ``JsonlLogger`` (the config's ``metric_logger``) writes one JSON line per
  step to STEPS_JSONL: the recipe's logged loss, lr, grad_norm and
  tokens_per_second_per_gpu, the counted tokens, and the probes' seconds.
  The step's time is the recipe's own ``time_per_step`` (tokens /
  tokens_per_second_per_gpu): from the previous step's end to this step's
  optimizer.step + lr step, data loading included.
"""
import importlib.util
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))

import torchtune_cpu  # noqa: E402  (CPU shims; adds $TORCHTUNE_SRC to sys.path)

if __name__ == "__main__":  # the config's tt_wrap.* components must see this module's globals
    sys.modules.setdefault("tt_wrap", sys.modules["__main__"])


def llama4_text(decoder_trainable=True, **kwargs):
    """torchtune's Llama 4 as its Scout builder makes it (an EarlyFusionModel
    around llama4_decoder), with no vision encoder: the parameter names are
    decoder.*, the names FullModelHFCheckpointer's LLAMA4 conversion gives."""
    from torchtune.models.llama4 import llama4_decoder
    from torchtune.modules.model_fusion import EarlyFusionModel
    return EarlyFusionModel(llama4_decoder(**kwargs), encoders={}, encoder_tokens={},
                            decoder_trainable=decoder_trainable)


_acc = {"fwd_s": 0.0, "bwd_s": 0.0, "opt_s": 0.0, "tokens": 0, "micro": 0}
_opt_t0 = [0.0]
_out = [None]


def _reset():
    _acc.update(fwd_s=0.0, bwd_s=0.0, opt_s=0.0, tokens=0, micro=0)


def _num(v):
    return v.item() if torch.is_tensor(v) else v


class JsonlLogger:
    """metric_logger: one JSON line per step (loss, lr, tokens/s, probes)."""

    def __init__(self, log_dir=None, **kwargs):
        self.log_dir = log_dir

    def log(self, name, data, step):
        self.log_dict({name: data}, step)

    def log_config(self, config):
        pass

    def log_dict(self, payload, step):
        rec = {k: _num(v) for k, v in payload.items()}
        if "loss" not in rec:  # e.g. val_loss
            return
        tps = rec.get("tokens_per_second_per_gpu")
        rec.update(step=step, tokens=_acc["tokens"], fwd_s=_acc["fwd_s"], bwd_s=_acc["bwd_s"], opt_s=_acc["opt_s"],
                   micro_batches=_acc["micro"], step_s=(_acc["tokens"] / tps) if tps else None)
        _out[0].write(json.dumps(rec) + "\n")
        _out[0].flush()
        _reset()

    def close(self):
        pass


def _install_probes(recipe_mod):
    cls = recipe_mod.FullFinetuneRecipeDistributed
    loss_step = cls._loss_step

    def timed_loss_step(self, batch):
        # counted before the call: _loss_step pops the labels
        _acc["tokens"] += int((batch["labels"] != self._loss_fn.ignore_index).sum())
        t = time.perf_counter()
        out = loss_step(self, batch)
        _acc["fwd_s"] += time.perf_counter() - t
        _acc["micro"] += 1
        return out

    cls._loss_step = timed_loss_step

    backward = torch.autograd.backward

    def timed_backward(*a, **k):
        t = time.perf_counter()
        try:
            return backward(*a, **k)
        finally:
            _acc["bwd_s"] += time.perf_counter() - t

    torch.autograd.backward = timed_backward

    def pre(opt, args, kwargs):
        _opt_t0[0] = time.perf_counter()

    def post(opt, args, kwargs):
        _acc["opt_s"] += time.perf_counter() - _opt_t0[0]

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def main(argv):
    steps_path, rest = argv[0], argv[1:]
    _out[0] = open(steps_path, "w")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(torchtune_cpu._free_port()))
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    src = os.environ["TORCHTUNE_SRC"]
    path = os.path.join(src, "recipes", "full_finetune_distributed.py")
    spec = importlib.util.spec_from_file_location("full_finetune_distributed", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    torchtune_cpu.install_shims()
    _install_probes(recipe)
    sys.argv = [path] + list(rest)
    print(f"tt_wrap: torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    recipe.recipe_main()
    _out[0].close()


if __name__ == "__main__":
    main(sys.argv[1:])
