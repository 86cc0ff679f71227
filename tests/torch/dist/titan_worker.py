"""torchtitan's Trainer with optc's optimizers container beside its own: run
under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 titan_worker.py OUT.json [CASE ...]

Runs every case of titan_cases.py (or those named) and writes, from rank 0,
{"cases": {name: {"errors": [...], "info": {...}}}} to OUT.json (through a
temporary name); errors are every rank's mismatches, prefixed by the rank.

The Trainer is torchtitan 0.3's own (train(), its FSDP2 parallelize_llama,
its clip_grad_norm_, LR schedule and DCP checkpointer) on the llama3
"debugmodel" cut to 2 layers, in bf16 (training.dtype) or fp32 params.
torchtitan targets accelerators; what it takes to run it on the CPU with
gloo, and nothing else, is done here:
- torch._utils._get_available_device_type says "cpu" before torchtitan is
  imported (torchtitan picks "cuda" where it finds no accelerator);
- the device-memory monitor is a stub (torch.cpu has no memory stats);
- set_pg_timeouts is skipped (its barrier passes device_ids=["cpu"]) and
  so is the 2 s sleep at the end of train();
- the FSDP modules sum their reduce-scatter (set_force_sum_reduction_for_
  comms): torchtitan divides by the token count itself and gives FSDP a
  factor of 1, which FSDP sends as PREMUL_SUM, which gloo lacks;
- attention is torchtitan's ScaledDotProductAttention (causal) in place of
  FlexAttention, which has no backward on the CPU; the data has no
  document boundaries, so the two are the same attention;
- every Trainer of this process shares the first one's ParallelDims (its
  device meshes): under the default spmd_backend ("spmd_types") a
  second Trainer's meshes, equal to the first's but other objects, fail
  fully_shard's check that a param's mesh is the very mesh it was given
  (the param comes out of spmd_types on the first Trainer's mesh);
- a synthetic tokenizer and dataloader (fixed random tokens per rank and
  step), each a torchtitan Configurable named in the config.
"""
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, replace

import torch
import torch._utils

torch._utils._get_available_device_type = lambda: "cpu"

import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

import torchtitan.components.metrics as tt_metrics  # noqa: E402
import torchtitan.distributed.utils as tt_dist  # noqa: E402
import torchtitan.trainer as tt_trainer  # noqa: E402
from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig  # noqa: E402
from torchtitan.components.tokenizer import BaseTokenizer  # noqa: E402
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_cases  # noqa: E402
from bitcmp import compare_flat, compare_floats, compare_params  # noqa: E402

import optc.torch as otorch  # noqa: E402
from optc.torch.integrations import OptcOptimizersContainer  # noqa: E402

STEPS = 6
CKPT_STEP = 3
LAYERS = 2
VOCAB = 2048  # the debugmodel's


# ---- running torchtitan on the CPU -------------------------------------------------------------

class _CpuMemory:
    device_name = "cpu"

    def get_peak_stats(self):
        return tt_metrics.DeviceMemStats(0, 0, 0, 0, 0, 0)

    def reset_peak_stats(self):
        pass


tt_metrics.build_device_memory_monitor = _CpuMemory
tt_dist.set_pg_timeouts = lambda **kw: None
tt_trainer.time = types.SimpleNamespace(perf_counter=time.perf_counter, sleep=lambda s: None)
_init_distributed = tt_trainer.Trainer.init_distributed
_PARALLEL_DIMS = {}


def _one_parallel_dims(self):
    key = repr(self.config.parallelism)
    if key not in _PARALLEL_DIMS:
        _PARALLEL_DIMS[key] = _init_distributed(self)
    return _PARALLEL_DIMS[key]


tt_trainer.Trainer.init_distributed = _one_parallel_dims


class SyntheticTokenizer(BaseTokenizer):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = VOCAB

    def __init__(self, config=None, *, tokenizer_path=None):
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args, **kwargs):
        return []

    def decode(self, *args, **kwargs):
        return ""

    def get_vocab_size(self):
        return self.vocab_size


class SyntheticData(BaseDataLoader):
    """Batch k of rank r: tokens from a generator seeded 1000 k + r; its
    state (k) is checkpointed with the rest."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        vocab_size: int = VOCAB

    def __init__(self, config, *, dp_world_size, dp_rank, tokenizer, seq_len, local_batch_size,
                 snapshot_every_n_steps=None):
        self.vocab, self.rank, self.seq_len, self.batch = config.vocab_size, dp_rank, seq_len, local_batch_size
        self.k = 0

    def __iter__(self):
        while True:
            g = torch.Generator().manual_seed(1000 * self.k + self.rank)
            self.k += 1
            t = torch.randint(0, self.vocab, (self.batch, self.seq_len + 1), generator=g)
            positions = torch.arange(self.seq_len).expand(self.batch, self.seq_len).contiguous()
            yield {"input": t[:, :-1], "positions": positions}, t[:, 1:]

    def state_dict(self):
        return {"k": self.k}

    def load_state_dict(self, state_dict):
        self.k = state_dict["k"]


def _sum_reductions(parallelize):
    def parallelize_summing(model, **kwargs):
        model = parallelize(model, **kwargs)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
        return model
    return parallelize_summing


class TorchNamesContainer(OptimizersContainer):
    """The stock container, naming torch's SGD, Adagrad and RMSprop and
    lion-pytorch's Lion as well: the reference for optc's other names."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        pass

    @staticmethod
    def _resolve_optimizer_factory(name):
        if name == "Lion":
            from lion_pytorch import Lion
            return Lion
        if name in ("SGD", "Adagrad", "RMSprop"):
            return getattr(torch.optim, name)
        return OptimizersContainer._resolve_optimizer_factory(name)


def param_groups(case):
    if case["groups"] == "adamw":  # torchtitan's default_adamw
        return [ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                                 optimizer_kwargs=dict(lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))]
    if case["groups"] == "mixed":
        return [ParamGroupConfig(pattern=r"norm", optimizer_name="Adam",
                                 optimizer_kwargs=dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)),
                ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                                 optimizer_kwargs=dict(lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))]
    if case["groups"] == "nosqrt":
        return [ParamGroupConfig(pattern=r"tok_embeddings|norm", optimizer_name="SGD",
                                 optimizer_kwargs=dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
                ParamGroupConfig(pattern=r".*", optimizer_name="Lion",
                                 optimizer_kwargs=dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1))]
    return [ParamGroupConfig(pattern=r"tok_embeddings", optimizer_name="SGD",
                             optimizer_kwargs=dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
            ParamGroupConfig(pattern=r"norm", optimizer_name="Adagrad", optimizer_kwargs=dict(lr=0.01)),
            ParamGroupConfig(pattern=r"layers\.0\.", optimizer_name="RMSprop",
                             optimizer_kwargs=dict(lr=1e-3, momentum=0.5, weight_decay=0.01)),
            ParamGroupConfig(pattern=r"layers\.1\.", optimizer_name="Lion",
                             optimizer_kwargs=dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)),
            ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                             optimizer_kwargs=dict(lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))]


def config(case, which, dump, load_from=None):
    """torchtitan's llama3_debugmodel config, small and on the CPU, with the
    stock container ("torch") or optc's ("optc")."""
    cfg = llama3_debugmodel()
    spec = cfg.model_spec
    model = spec.model
    model.layers = model.layers[:LAYERS]
    for _, _, parent, attr in list(model.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = ScaledDotProductAttention.Config()
        else:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    cfg.model_spec = replace(spec, parallelize_fn=_sum_reductions(spec.parallelize_fn))
    cfg.tokenizer = SyntheticTokenizer.Config()
    cfg.dataloader = SyntheticData.Config()
    cfg.training.local_batch_size = 2
    cfg.training.seq_len = 32
    cfg.training.steps = STEPS
    cfg.training.disable_cuda_graphs = True
    cfg.training.dtype = "bfloat16" if case["dtype"] == "bf16" else "float32"
    cfg.activation_checkpoint = None
    cfg.validator.enable = False
    cfg.metrics.log_freq = 1
    cfg.debug.seed = 42
    cfg.dump_folder = dump
    cfg.checkpoint.enable = True
    cfg.checkpoint.interval = CKPT_STEP
    cfg.checkpoint.last_save_model_only = False
    if load_from is not None:
        cfg.checkpoint.initial_load_path = load_from
        cfg.checkpoint.initial_load_model_only = False
        cfg.checkpoint.load_only = True
    cls = TorchNamesContainer if case["groups"] in ("names", "nosqrt") else OptimizersContainer
    cfg.optimizer = cls.Config(param_groups=param_groups(case), implementation=case["ref_impl"])
    if which == "optc":  # as a user swaps optc in: the same config, optc's container
        cfg.optimizer = OptcOptimizersContainer.Config.of(cfg.optimizer)
        cfg.optimizer.implementation = case["impl"]
    return cfg


class Run:
    """One Trainer: built, its losses and grad norms recorded from its
    metrics, what its optimizers step checked at every step."""

    def __init__(self, cfg):
        self.trainer = cfg.build()
        self.losses, self.norms, self.stepped = [], [], []
        mp = self.trainer.metrics_processor
        log = mp.log

        def record(step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs):
            self.losses.append(global_avg_loss)
            self.norms.append(grad_norm)
            return log(step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs)
        mp.log = record
        for opt in self.trainer.optimizers:
            opt.register_step_pre_hook(self._check_step)

    def _check_step(self, opt, args, kwargs):
        ps = [p for g in opt.param_groups for p in g["params"]]
        self.stepped.append(dict(
            optimizer=f"{type(opt).__module__}.{type(opt).__name__}",
            dtensors=all(isinstance(p, DTensor) and isinstance(p.grad, DTensor) for p in ps),
            sharded=all(any(isinstance(pl, Shard) for pl in p.placements) for p in ps if isinstance(p, DTensor)),
            dtypes=sorted({str(p.dtype) for p in ps})))

    def train(self):
        self.trainer.train()
        return self

    def params(self):
        return list(self.trainer.model_parts[0].named_parameters())

    def close(self):
        self.trainer.close()


def check_stepped(run, want_optc, errs, what):
    if not run.stepped:
        errs.append(f"{what}: no optimizer step")
    for s in run.stepped:
        if not s["dtensors"]:
            errs.append(f"{what}: {s['optimizer']} stepped params or grads that are not DTensors")
        if not s["sharded"]:
            errs.append(f"{what}: {s['optimizer']} stepped unsharded params")
        if s["optimizer"].startswith("optc.") != want_optc:
            errs.append(f"{what}: stepped by {s['optimizer']}")


# ---- the modes --------------------------------------------------------------------------------

def train_pair(case, errs, info, dirs):
    """The stock and optc trainers, 6 steps each: the same bits."""
    full = {}
    for which in ("torch", "optc"):
        full[which] = Run(config(case, which, dirs[which])).train()
        check_stepped(full[which], which == "optc", errs, which)
    t, o = full["torch"], full["optc"]
    compare_floats(t.losses, o.losses, errs, "losses")
    compare_floats(t.norms, o.norms, errs, "grad norms")
    compare_params(t.params(), o.params(), errs, "params after 6 steps")
    sd_t = t.trainer.optimizers.state_dict()
    ignore = ("foreach", "fused") if case["impl"] != case["ref_impl"] else ()
    compare_flat(sd_t, o.trainer.optimizers.state_dict(), errs, "state_dict after 6 steps", ignore)
    info["losses"] = t.losses
    info["optimizers"] = sorted({s["optimizer"] for s in o.stepped})
    info["param_dtypes"] = sorted({d for s in o.stepped for d in s["dtypes"]})
    info["state_keys"] = len(sd_t)
    return full


def mode_train(case, errs, info, root):
    dirs = {w: os.path.join(root, case["name"], w) for w in ("torch", "optc")}
    for r in train_pair(case, errs, info, dirs).values():
        r.close()


def mode_ckpt(case, errs, info, root):
    dirs = {w: os.path.join(root, case["name"], w) for w in ("torch", "optc", "optc-from-torch", "torch-from-optc")}
    full = train_pair(case, errs, info, dirs)
    for which, src in (("optc-from-torch", "torch"), ("torch-from-optc", "optc")):
        step3 = os.path.join(dirs[src], "checkpoint", f"step-{CKPT_STEP}")
        r = Run(config(case, which.split("-")[0], dirs[which], load_from=step3)).train()
        check_stepped(r, which.startswith("optc"), errs, which)
        compare_floats(full[src].losses[CKPT_STEP:], r.losses, errs, f"{which}: losses of steps 4..6")
        compare_params(full[src].params(), r.params(), errs, f"{which}: params after step 6")
        compare_flat(full[src].trainer.optimizers.state_dict(), r.trainer.optimizers.state_dict(), errs,
                     f"{which}: state_dict after step 6")
        r.close()
    for r in full.values():
        r.close()


def mode_warmup(case, errs, info, root):
    runs = {}
    for which in ("torch", "optc"):
        r = runs[which] = Run(config(case, which, os.path.join(root, case["name"], which)))
        before = [(n, p.detach().clone()) for n, p in r.params()]
        r.warm = r.trainer.optimizers.state_dict()  # init_optim_state: the zero-grad, lr = 0 step
        compare_params(before, r.params(), errs, f"{which}: params after the warm-up step")
        if any(p.grad is not None for _, p in r.params()):
            errs.append(f"{which}: grads left after the warm-up step")
    t, o = runs["torch"], runs["optc"]
    compare_flat(t.warm, o.warm, errs, "state_dict before any step")
    info["warm_keys"] = len(t.warm)
    for r in runs.values():
        r.train()
    check_stepped(o, True, errs, "optc")
    compare_floats(t.losses, o.losses, errs, "losses")
    compare_params(t.params(), o.params(), errs, "params after 6 steps")
    compare_flat(t.trainer.optimizers.state_dict(), o.trainer.optimizers.state_dict(), errs,
                 "state_dict after 6 steps")
    for r in runs.values():
        r.close()


MODES = {"train": mode_train, "ckpt": mode_ckpt, "warmup": mode_warmup}


def main():
    out = sys.argv[1]
    want = set(sys.argv[2:])
    from datetime import timedelta
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    box = [tempfile.mkdtemp(prefix="optc-titan-") if rank == 0 else None]
    dist.broadcast_object_list(box)
    root = box[0]
    results = {}
    for case in titan_cases.cases():
        if want and case["name"] not in want:
            continue
        errs, info = [], {}
        t0 = time.perf_counter()
        try:
            MODES[case["mode"]](case, errs, info, root)
        except Exception:
            errs.append(traceback.format_exc())
        info["seconds"] = round(time.perf_counter() - t0, 1)
        everyone = [None] * world
        dist.all_gather_object(everyone, (errs, info))
        if rank == 0:
            results[case["name"]] = {
                "errors": [f"rank {r}: {e}" for r, (es, _) in enumerate(everyone) for e in es],
                "info": {f"rank{r}": i for r, (_, i) in enumerate(everyone)}}
    if rank == 0:
        with open(out + ".tmp", "w") as f:
            json.dump({"world": world, "torch": torch.__version__, "optc": otorch.__file__, "cases": results}, f,
                      indent=1)
        os.replace(out + ".tmp", out)
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    from leave import leave  # (after main: an exception in it exits as Python does)
    leave()
