"""transformers' Trainer on accelerate's FSDP2 with optc.torch's optimizer
beside torch's: run under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 hf_worker.py OUT.json [CASE ...]

Runs every case of hf_cases.py (or those named) and writes, from rank 0,
{"cases": {name: {"errors": [...], "info": {...}}}} to OUT.json (through a
temporary name); errors are every rank's mismatches, prefixed by the rank.

FSDP on the CPU. accelerate's AcceleratorState turns a Trainer's
fsdp_plugin into DistributedType.FSDP only where PartialState found an
accelerator (MULTI_GPU, MULTI_NPU, MULTI_XPU, ...); with use_cpu (gloo,
MULTI_CPU) it drops the plugin and the model trains unsharded, whatever
ACCELERATE_USE_FSDP or FSDP_VERSION say (both are read only inside that
accelerator branch) -- and no accelerate option reaches it. So
force_fsdp_on_cpu() wraps AcceleratorState.__init__: where it left a
MULTI_CPU state with an fsdp_plugin, it does what the accelerator branch
does (distributed_type = FSDP, the plugin's mixed precision, the plugin
kept). From there on the Trainer and accelerate take their own FSDP2 path:
the Trainer builds the optimizer on the model's plain params, then
accelerate's prepare fully_shards the model and swaps the sharded DTensors
into the optimizer's param_groups (fsdp2_switch_optimizer_parameters).
Each case records what the optimizer was built on and checks that the
same optimizer then stepped sharded DTensors.

CPU offload: TrainingArguments' fsdp_config cpu_offload=True becomes
accelerate's CPUOffloadPolicy(), which pins host memory, which needs an
accelerator; the offload cases set the plugin's policy to
CPUOffloadPolicy(pin_memory=False) in args.fsdp_plugin_args, the dict the
Trainer hands to FullyShardedDataParallelPlugin.
"""
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DistributedType
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.tensor import DTensor, Shard
from transformers import (LlamaConfig, LlamaForCausalLM, Llama4ForCausalLM, Llama4TextConfig, Trainer,
                          TrainerCallback, TrainingArguments)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_cases  # noqa: E402
from bitcmp import compare_floats, compare_params, compare_values  # noqa: E402

import optc.torch as otorch  # noqa: E402
from optc.torch.integrations import optc_optimizer_cls_and_kwargs  # noqa: E402

STEPS = 6
SEQ = 16


def force_fsdp_on_cpu():
    init = AcceleratorState.__init__

    def __init__(self, mixed_precision=None, cpu=False, dynamo_plugin=None, deepspeed_plugin=None,
                 fsdp_plugin=None, *args, **kwargs):
        init(self, mixed_precision, cpu, dynamo_plugin, deepspeed_plugin, fsdp_plugin, *args, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = __init__


# ---- models, data, arguments ------------------------------------------------------------------

def build_model(case):
    torch.manual_seed(0)
    if case["model"] == "llama":
        cfg = LlamaConfig(vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = LlamaForCausalLM(cfg)
    else:  # a tiny Scout: MoE in every layer, QK-norm, llama3-scaled RoPE, chunked attention
        cfg = Llama4TextConfig(vocab_size=61, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=8, num_hidden_layers=2, intermediate_size=16, intermediate_size_mlp=24,
                               num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
                               use_qk_norm=True, attention_chunk_size=8, no_rope_layer_interval=2,
                               max_position_embeddings=64, tie_word_embeddings=False,
                               rope_parameters=dict(rope_type="llama3", rope_theta=100.0, factor=4.0,
                                                    low_freq_factor=1.0, high_freq_factor=8.0,
                                                    original_max_position_embeddings=32))
        model = Llama4ForCausalLM(cfg)
    if case["dtype"] == "bf16":
        model = model.to(torch.bfloat16)
    return model


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences, the labels the inputs (the model shifts)."""

    def __init__(self, vocab, n=64):
        self.x = torch.randint(0, vocab, (n, SEQ), generator=torch.Generator().manual_seed(7))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def training_args(case, out):
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, max_steps=STEPS, learning_rate=3e-3, weight_decay=0.1,
        adam_beta2=0.99, warmup_steps=2, lr_scheduler_type="cosine", max_grad_norm=1.0, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0, dataloader_num_workers=0,
        bf16=case["dtype"] == "mp", optim=case["optim"],
        optim_args="momentum=0.9" if case["optim"] == "sgd" else None,
        fsdp=True, fsdp_config={"version": 2, "cpu_offload": case["offload"], "reshard_after_forward": True})
    if case["offload"]:
        args.fsdp_plugin_args["cpu_offload"] = CPUOffloadPolicy(pin_memory=False)
    return args


class StepSpy(TrainerCallback):
    """What the optimizer is about to step, at every step."""

    def __init__(self):
        self.seen = []

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        ps = [p for g in opt.param_groups for p in g["params"]]
        self.seen.append(dict(
            optimizer=f"{type(opt).__module__}.{type(opt).__name__}",
            dtensors=all(isinstance(p, DTensor) and isinstance(p.grad, DTensor) for p in ps),
            sharded=all(isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements) for p in ps),
            dtypes=sorted({str(p.dtype) for p in ps}),
            params=len(ps)))


def train(case, which, root):
    """One Trainer: which = "optc" (the helper's class and kwargs) or
    "torch" (torch's class: the helper's kwargs with foreach=False for
    adamw_torch, else HF's own choice for args.optim)."""
    AcceleratorState._reset_state()  # each Trainer makes its Accelerator anew (PartialState kept)
    GradientState._reset_state()
    args = training_args(case, os.path.join(root, case["name"], which))
    cls, kwargs = optc_optimizer_cls_and_kwargs(args)
    if which == "optc":
        extra = dict(optimizer_cls_and_kwargs=(cls, kwargs))
    elif case["optim"] == "adamw_torch":
        extra = dict(optimizer_cls_and_kwargs=(torch.optim.AdamW, dict(kwargs, foreach=False)))
    else:
        extra = {}
    model = build_model(case)
    spy = StepSpy()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(model.config.vocab_size), callbacks=[spy],
                      **extra)
    built = {}
    create = trainer.create_optimizer

    def create_optimizer(*a, **kw):  # what the optimizer is built on: the model's plain params
        opt = create(*a, **kw)
        built.update(opt=opt, kinds=sorted({type(p).__name__ for g in opt.param_groups for p in g["params"]}))
        return opt
    trainer.create_optimizer = create_optimizer
    trainer.train()
    plugin = trainer.accelerator.state.fsdp_plugin
    logs = [h for h in trainer.state.log_history if "loss" in h]
    opt = trainer.optimizer.optimizer
    if trainer.optimizer.optimizer is not built.get("opt"):
        raise AssertionError("the optimizer that stepped is not the one create_optimizer built")
    return dict(built_on=built["kinds"], losses=[h["loss"] for h in logs], norms=[h["grad_norm"] for h in logs],
                lrs=[h["learning_rate"] for h in logs], seen=spy.seen, fsdp=trainer.is_fsdp_enabled,
                offload=repr(plugin.cpu_offload), mp=repr(plugin.mixed_precision_policy),
                params=[(n, p.detach().clone()) for n, p in trainer.model.named_parameters()],
                state=opt.state_dict(), kwargs=kwargs)


def check_seen(run, want_optc, errs, what):
    if len(run["seen"]) != STEPS:
        errs.append(f"{what}: {len(run['seen'])} optimizer steps, not {STEPS}")
    if not run["fsdp"]:
        errs.append(f"{what}: the Trainer has no FSDP")
    for s in run["seen"]:
        if not s["dtensors"] or not s["sharded"]:
            errs.append(f"{what}: {s['optimizer']} stepped params or grads that are not sharded DTensors")
        if s["optimizer"].startswith("optc.") != want_optc:
            errs.append(f"{what}: stepped by {s['optimizer']}")


def run_case(case, errs, info, root):
    runs = {w: train(case, w, root) for w in ("torch", "optc")}
    t, o = runs["torch"], runs["optc"]
    for w, r in runs.items():
        check_seen(r, w == "optc", errs, w)
    compare_floats(t["losses"], o["losses"], errs, "losses")
    compare_floats(t["norms"], o["norms"], errs, "grad norms")
    compare_floats(t["lrs"], o["lrs"], errs, "learning rates")
    compare_params(t["params"], o["params"], errs, f"params after {STEPS} steps")
    # the groups' keys but foreach, which the adamw_torch reference sets
    groups = [[{k: v for k, v in g.items() if k != "foreach"} for g in r["state"]["param_groups"]]
              for r in (t, o)]
    compare_values(groups[0], groups[1], errs, "param_groups")
    compare_values(t["state"]["state"], o["state"]["state"], errs, "optimizer state")
    seen = o["seen"][0]
    info.update(built_on=o["built_on"], losses=o["losses"], lrs=o["lrs"], norms=o["norms"],
                optimizer=seen["optimizer"], dtypes=seen["dtypes"], params=seen["params"],
                kwargs={k: repr(v) for k, v in o["kwargs"].items()}, offload=o["offload"], mp=o["mp"],
                embed_rows=[tuple(p._local_tensor.shape) for n, p in o["params"] if "embed_tokens" in n])


def main():
    out = sys.argv[1]
    want = set(sys.argv[2:])
    from datetime import timedelta
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    force_fsdp_on_cpu()
    box = [tempfile.mkdtemp(prefix="optc-hf-") if rank == 0 else None]
    dist.broadcast_object_list(box)
    root = box[0]
    results = {}
    for case in hf_cases.cases():
        if want and case["name"] not in want:
            continue
        errs, info = [], {}
        t0 = time.perf_counter()
        try:
            run_case(case, errs, info, root)
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
