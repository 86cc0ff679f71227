"""optc.torch.AdamW inside torchtune's own full_finetune_distributed recipe.

What is tested: torchtune's recipe (recipes/full_finetune_distributed.py, used
unchanged) fine-tunes a tiny Llama 4 (torchtune's own llama4_decoder builder:
MoE with a shared expert, chunked-attention RoPE layer plus a global NoPE
layer, scaled RoPE, qk-norm) on the CPU for a few steps, twice from the same
random checkpoint, seed and data: once with
``optimizer: {_component_: optc.torch.AdamW, lr: ...}`` and once with
``torch.optim.AdamW(lr=..., fused=False, foreach=False)``. The per-step losses
the recipe logs, the final weights it saves, and the optimizer state in the
recipe_state.pt it saves mid-run must be bit-identical.

The cases: one rank (the recipe's params are plain tensors), and two ranks
under torchrun (gloo), where the recipe shards the model with FSDP2's
fully_shard and optc steps DTensors: with and without ``fsdp_cpu_offload``
(CPUOffloadPolicy, unpinned on the CPU), and with ``clip_grad_norm: 1.0``
(torch's clip_grad_norm_ on the offloaded DTensor grads, then the step).
fp32 cases take torch's f32 sqrt, so they carry the torch_sqrt mark.

Why: optc.torch.AdamW claims to be a drop-in torch.optim optimizer that gives
torch's for-loop (foreach=False) bits. The recipe is the real consumer: it
builds the optimizer from YAML through config.instantiate, calls zero_grad,
step, param_groups (lr logging) and state_dict (the recipe state checkpoint
it writes every save_every_n_steps=2 steps; sharded, it gathers the
optimizer's DTensor states into full tensors). A difference in the update
shows in a later step's loss or, if too small to move a loss, in the final
weights and optimizer state, which are compared with torch.equal. The first
step's loss is taken before any update and is equal by construction; steps
2.. are what tests the optimizer.

Needs torchtune's source (with Llama 4: newer than PyPI's torchtune 0.6.1,
and not on PyPI): $TORCHTUNE_SRC, a checkout (github.com/pytorch/torchtune).
Without it every case skips, saying so. Its other imports (torchao,
torchvision, torchdata, omegaconf, sentencepiece, psutil, pillow, datasets,
tiktoken) are in the .venv that ./setup.sh makes; a missing one fails. CPU
shims for torchtune's GPU-only spots are in torchtune_cpu.py.
"""
import glob
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENIZER = os.path.join(ROOT, "tests", "tokenizer", "tiktoken_small_llama4.model")

STEPS = 5
LR = 1e-3          # large enough that a wrong update shows within a step
SEED = 1234
VOCAB = 3072       # 2000 tokenizer ranks + the 923 special tokens Llama4Tokenizer requires, renumbered
TORCH_THREADS = "2"

# Short alpaca-style records (instruction / input / output), enough for STEPS
# batches of 2. Written to a local json file; HF datasets reads it offline.
_WORDS = ("the sun rises in the east and sets in the west while rivers run to the sea "
          "birds sing at dawn and owls call at night under a sky full of stars").split()


def _records(n):
    out = []
    for i in range(n):
        w = _WORDS[i % len(_WORDS):] + _WORDS[:i % len(_WORDS)]
        out.append({"instruction": f"Repeat the words {i}: " + " ".join(w[:6]),
                    "input": " ".join(w[6:9]) if i % 2 else "",
                    "output": " ".join(w[:12 + i % 5])})
    return out


def _torchtune_src():
    """$TORCHTUNE_SRC, checked to be a torchtune checkout with Llama 4; skips without it."""
    env = os.environ.get("TORCHTUNE_SRC")
    if not env:
        pytest.skip("no torchtune source: set $TORCHTUNE_SRC to a checkout of github.com/pytorch/torchtune "
                    "(with Llama 4; PyPI's torchtune 0.6.1 has none)")
    if not os.path.isfile(os.path.join(env, "torchtune", "models", "llama4", "__init__.py")) or \
            not os.path.isfile(os.path.join(env, "recipes", "full_finetune_distributed.py")):
        pytest.fail(f"$TORCHTUNE_SRC={env} is not a torchtune checkout with torchtune/models/llama4 and "
                    f"recipes/full_finetune_distributed.py")
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    src = _torchtune_src()
    missing = [m for m in ("torchao", "torchvision", "torchdata", "omegaconf", "datasets", "tiktoken",
                           "sentencepiece", "psutil", "PIL") if importlib.util.find_spec(m) is None]
    assert not missing, "torchtune's recipe needs these modules (./setup.sh puts them in .venv): " + \
        ", ".join(missing)
    tok = TOKENIZER
    assert os.path.isfile(tok), f"{tok} is missing"
    root = tmp_path_factory.mktemp("torchtune_recipe")
    env = dict(os.environ)
    env["TORCHTUNE_SRC"] = src
    env["PYTHONPATH"] = os.pathsep.join([HERE, src, os.path.join(ROOT, "python")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(OMP_NUM_THREADS=TORCH_THREADS, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(root / "hf"), TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    ckpt = root / "ckpt"
    _run([sys.executable, os.path.join(HERE, "torchtune_cpu.py"), "prepare", str(ckpt), str(VOCAB), str(SEED)],
         env, "prepare")
    data = root / "alpaca.json"
    data.write_text(json.dumps(_records(4 * STEPS + 4)))  # STEPS batches of 2 on each of 2 ranks
    return dict(root=root, env=env, ckpt=ckpt, data=data, tok=tok)


def _run(cmd, env, what):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"{what} failed (rc {p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
    return p


def _config(s, name, optimizer, dtype, offload=False, clip=None):
    out = s["root"] / name
    return {
        "output_dir": str(out),
        "model": {"_component_": "torchtune_cpu.tiny_llama4", "vocab_size": VOCAB},
        "tokenizer": {"_component_": "torchtune.models.llama4.llama4_transform", "path": s["tok"],
                      "special_tokens_path": str(s["ckpt"] / "special_tokens.json"),
                      "max_seq_len": 64, "max_num_tiles": 1},
        "checkpointer": {"_component_": "torchtune.training.FullModelTorchTuneCheckpointer",
                         "checkpoint_dir": str(s["ckpt"]), "checkpoint_files": ["model.pt"],
                         "recipe_checkpoint": None, "output_dir": str(out), "model_type": "LLAMA4"},
        "resume_from_checkpoint": False,
        "dataset": {"_component_": "torchtune.datasets.alpaca_dataset", "source": "json",
                    "data_files": str(s["data"]), "split": "train", "packed": False},
        "seed": SEED, "shuffle": True,
        "epochs": 1, "max_steps_per_epoch": STEPS, "save_every_n_steps": 2, "batch_size": 2, "gradient_accumulation_steps": 1,
        "optimizer": optimizer, "optimizer_in_bwd": False,
        "loss": {"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"},
        "clip_grad_norm": clip,
        "device": "cpu", "dtype": dtype,
        "enable_activation_checkpointing": False, "enable_activation_offloading": False,
        "fsdp_cpu_offload": offload, "compile": False,
        "tensor_parallel_dim": 1, "data_parallel_shard_dim": -1, "data_parallel_replicate_dim": 1,
        "metric_logger": {"_component_": "torchtune_cpu.ExactDiskLogger", "log_dir": str(out / "logs")},
        "log_every_n_steps": 1, "log_peak_memory_stats": False, "log_level": "INFO",
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }


def _train(s, name, optimizer, dtype, nproc=1, offload=False, clip=None):
    """Runs the recipe on nproc ranks (torchrun for 2); returns ({step: loss},
    {step: lr}, final model state dict, the optimizer's state_dict from the
    recipe state saved at the last save_every_n_steps)."""
    import torch
    cfg = _config(s, name, optimizer, dtype, offload, clip)
    path = s["root"] / f"{name}.yaml"
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc_per_node={nproc}"]
    _run(launch + [os.path.join(HERE, "torchtune_cpu.py"), "run", "--config", str(path)], s["env"],
         f"torchtune recipe ({name})")
    logs = glob.glob(os.path.join(cfg["output_dir"], "logs", "*.txt"))
    assert len(logs) == 1, logs
    losses, lrs, norms = {}, {}, {}
    for line in open(logs[0]):
        m = re.match(r"Step (\d+) \| (.*)", line.strip())
        if not m:
            continue
        fields = dict(kv.split(":", 1) for kv in m.group(2).split())
        if "loss" in fields:
            losses[int(m.group(1))] = float(fields["loss"])
            lrs[int(m.group(1))] = float(fields["lr"])
            if "grad_norm" in fields:
                norms[int(m.group(1))] = float(fields["grad_norm"])
    finals = sorted(glob.glob(os.path.join(cfg["output_dir"], "epoch_*", "*.bin")))
    assert finals, f"no final checkpoint in {cfg['output_dir']}"
    weights = torch.load(finals[-1], map_location="cpu", weights_only=True)
    states = sorted(glob.glob(os.path.join(cfg["output_dir"], "epoch_*", "recipe_state.pt")))
    assert states, f"no recipe_state.pt in {cfg['output_dir']}"
    recipe_state = torch.load(states[-1], map_location="cpu", weights_only=False)  # written by this test's run
    return losses, lrs, weights, recipe_state["optimizer"], norms


CASES = [  # dtype, ranks, fsdp_cpu_offload, clip_grad_norm
    pytest.param("fp32", 1, False, None, marks=pytest.mark.torch_sqrt, id="fp32-1rank"),
    pytest.param("bf16", 1, False, None, id="bf16-1rank"),
    pytest.param("bf16", 2, False, None, id="bf16-2ranks-fsdp2"),
    pytest.param("bf16", 2, True, None, id="bf16-2ranks-fsdp2-offload"),
    pytest.param("bf16", 2, True, 1.0, id="bf16-2ranks-fsdp2-offload-clip"),
    pytest.param("fp32", 2, True, None, marks=pytest.mark.torch_sqrt, id="fp32-2ranks-fsdp2-offload"),
]


@pytest.mark.parametrize("dtype,nproc,offload,clip", CASES)
def test_recipe_losses_bit_identical_to_torch_adamw(setup, dtype, nproc, offload, clip):
    """Same seed, checkpoint, data and lr; the optimizer is the only difference."""
    import torch
    tag = f"{dtype}_{nproc}_{int(offload)}_{clip}"
    ref_losses, ref_lrs, ref_w, ref_opt, ref_norms = _train(setup, f"torch_adamw_{tag}",
                                                 {"_component_": "torch.optim.AdamW", "lr": LR,
                                                  "fused": False, "foreach": False}, dtype, nproc, offload, clip)
    optc_losses, optc_lrs, optc_w, optc_opt, optc_norms = _train(setup, f"optc_adamw_{tag}",
                                                     {"_component_": "optc.torch.AdamW", "lr": LR}, dtype, nproc,
                                                     offload, clip)

    print("step  torch.optim.AdamW(foreach=False)  optc.torch.AdamW")
    for k in sorted(ref_losses):
        print(f"{k:4d}  {ref_losses[k]!r:32}  {optc_losses.get(k)!r}")

    assert sorted(ref_losses) == list(range(1, STEPS + 1)), ref_losses
    assert sorted(optc_losses) == sorted(ref_losses)
    assert all(math.isfinite(v) for v in ref_losses.values())
    # The model trains: the losses move (a no-op optimizer on both sides would pass the equality).
    assert len(set(ref_losses.values())) == STEPS, ref_losses
    assert ref_lrs == optc_lrs == {k: LR for k in ref_losses}
    if clip is not None:  # torch's clip_grad_norm_ on both sides, over the same grads
        assert sorted(ref_norms) == sorted(ref_losses) and ref_norms == optc_norms, (ref_norms, optc_norms)
        assert any(v > clip for v in ref_norms.values()), f"clip_grad_norm {clip} never clipped: {ref_norms}"
    diff = {k: (ref_losses[k], optc_losses[k]) for k in ref_losses if ref_losses[k] != optc_losses[k]}
    assert not diff, f"per-step losses differ (step: (torch, optc)): {diff}"

    assert ref_w.keys() == optc_w.keys()
    bad = [k for k in ref_w if not torch.equal(ref_w[k], optc_w[k])]
    assert not bad, f"final weights differ in {len(bad)} tensors, e.g. {bad[:5]}"
    init = torch.load(setup["ckpt"] / "model.pt", map_location="cpu", weights_only=True)
    moved = [k for k in ref_w if not torch.equal(ref_w[k].float(), init[k].float())]
    assert moved, "no weight changed: the optimizer did not step"

    # The optimizer state the recipe checkpoints (torch's state_dict format on both sides).
    assert ref_opt["state"].keys() == optc_opt["state"].keys() and ref_opt["state"]
    for k, st in ref_opt["state"].items():
        assert st.keys() == optc_opt["state"][k].keys(), k
        for name, v in st.items():
            w = optc_opt["state"][k][name]
            assert v.dtype == w.dtype and torch.equal(v, w), f"optimizer state {k}.{name} differs"
    for g, h in zip(ref_opt["param_groups"], optc_opt["param_groups"]):
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "params"):
            assert g[key] == h[key], key
