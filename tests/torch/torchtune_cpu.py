"""Run torchtune's own full_finetune_distributed recipe on the CPU, with a tiny Llama 4.

This is a helper of tests/torch/test_torchtune_recipe.py, run as a subprocess
(never imported by pytest itself, so pytest's process never imports torchtune).
torchtune's files are used unchanged; what this module adds is:

- CPU shims (monkeypatches, installed before the recipe builds anything), each
  for a spot where torchtune assumes a GPU:
  * Llama 4's chunked (local) attention is written for flex attention only
    (``get_chunked_attention_mask`` raises without a CUDA SM75+ device). The
    shim gives the same mask as a dense boolean [b, s, s] tensor (causal and
    within the same chunk), which torchtune's SDPA path takes.
  * The MoE router counts tokens per expert with ``torch.histc`` on the int64
    expert indices; CPU histc has no int64 kernel. The shim bins integer input
    as float and casts the counts back to the input's dtype (exact for these
    small counts).
  * ``training.get_memory_stats`` raises on CPU: the shim returns zeros there.
  * ``torch.distributed.barrier(device_ids=[device.index])`` gets
    ``device_ids=[None]`` on CPU, which gloo rejects: the shim drops it.
  * ``torch.cpu.empty_cache`` / ``reset_peak_memory_stats`` do not exist: the
    shim adds no-ops.
  * ``fsdp_cpu_offload: True`` builds ``CPUOffloadPolicy()``, which pins host
    memory and so needs a CUDA device: without one the shim makes it
    ``CPUOffloadPolicy(pin_memory=False)``; and its distributed backend for a
    CPU device with offload reads "cpu:gloo,cpu:gloo", which
    init_process_group refuses: the shim gives "gloo".
- ``tiny_llama4``: torchtune's own ``llama4_decoder`` component builder with
  tiny sizes (a config's ``model._component_`` points here).
- ``ExactDiskLogger``: torchtune's DiskLogger, but it writes tensors as Python
  floats (the recipe logs the loss as a 0-dim tensor, which DiskLogger would
  print as ``tensor(7.6543)``, 4 decimals; the test needs every bit).

Commands:
  python torchtune_cpu.py prepare OUT_DIR VOCAB_SIZE SEED
      writes OUT_DIR/model.pt (random init of tiny_llama4, torchtune's key
      names, loadable by FullModelTorchTuneCheckpointer) and
      OUT_DIR/special_tokens.json (the 923 special tokens Llama4Tokenizer requires, renumbered
      to follow the small test tokenizer's 2000 ranks, so the embedding stays
      VOCAB_SIZE rows instead of 200k).
  python torchtune_cpu.py run --config CFG.yaml [key=value ...]
      installs the shims and runs the recipe's ``recipe_main`` in this process:
      a one-rank gloo group, or, under torchrun, one rank of its group.

Needs torchtune's source on sys.path ($TORCHTUNE_SRC is added when set), and
torchao, torchvision, torchdata, omegaconf importable.
"""
import functools
import json
import os
import socket
import sys

_SRC = os.environ.get("TORCHTUNE_SRC")
if _SRC and _SRC not in sys.path:
    sys.path.insert(0, _SRC)

import torch  # noqa: E402

# Sizes of the tiny model. dim 64, 4 heads of 16, 2 kv heads, 4 experts with a
# shared expert, top-1 routing (as Scout); layer 0 is a chunked-attention RoPE
# layer with qk-norm, layer 1 a global NoPE layer (skip_rope_interval=2).
TINY = dict(num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, hidden_dim=64, max_seq_len=256,
            num_experts=4, experts_per_token=1, use_shared_expert=True, use_qk_norm=True,
            skip_rope_interval=2, attention_chunk_size=16, use_scaled_rope=True, old_context_len=64)


def tiny_llama4(vocab_size=3072, **overrides):
    """torchtune.models.llama4.llama4_decoder with the tiny sizes of TINY."""
    from torchtune.models.llama4._component_builders import llama4_decoder
    kw = dict(TINY)
    kw.update(overrides)
    return llama4_decoder(vocab_size=vocab_size, **kw)


try:
    from torchtune.training.metric_logging import DiskLogger as _DiskLogger
except ImportError:  # only `run` needs it; `prepare` reports the import error itself
    _DiskLogger = object


class ExactDiskLogger(_DiskLogger):
    """DiskLogger that writes 0-dim tensors as Python floats (repr: every bit)."""

    def log(self, name, data, step):
        super().log(name, data.item() if torch.is_tensor(data) else data, step)

    def log_dict(self, payload, step):
        super().log_dict({k: (v.item() if torch.is_tensor(v) else v) for k, v in payload.items()}, step)


# ---- shims ------------------------------------------------------------------------------------

def _dense_chunked_attention_mask(mask, chunk_size, bsz, seq_len):
    """get_chunked_attention_mask's mask as a dense bool [b, s, s] (True: attend)."""
    q = torch.arange(seq_len).view(-1, 1)
    kv = torch.arange(seq_len).view(1, -1)
    dense = (kv <= q) & (q // chunk_size == kv // chunk_size)
    dense = dense.unsqueeze(0).expand(bsz, seq_len, seq_len)
    if mask is not None:
        if not torch.is_tensor(mask):
            raise ValueError("torchtune_cpu: chunked attention shim takes only dense masks")
        dense = dense.to(mask.device) & mask.bool()
    return dense


def install_shims():
    import torch.distributed as dist
    import torchtune.training as training
    import torchtune.models.llama4._component_builders as l4b
    import torchtune.models.llama4._chunked_attention as l4c
    from torchtune.utils._import_guard import _SUPPORTS_FLEX_ATTENTION

    if not _SUPPORTS_FLEX_ATTENTION:
        l4b.get_chunked_attention_mask = _dense_chunked_attention_mask
        l4c.get_chunked_attention_mask = _dense_chunked_attention_mask

    histc = torch.histc

    @functools.wraps(histc)
    def histc_int(input, *args, **kwargs):
        if input.device.type == "cpu" and not input.is_floating_point():
            return histc(input.to(torch.float32), *args, **kwargs).to(input.dtype)
        return histc(input, *args, **kwargs)

    torch.histc = histc_int

    get_memory_stats = training.get_memory_stats

    def get_memory_stats_cpu(device, reset_stats=True):
        if torch.device(device).type == "cpu":
            return {"peak_memory_active": 0.0, "peak_memory_alloc": 0.0, "peak_memory_reserved": 0.0}
        return get_memory_stats(device, reset_stats)

    training.get_memory_stats = get_memory_stats_cpu

    barrier = dist.barrier

    @functools.wraps(barrier)
    def barrier_cpu(*args, device_ids=None, **kwargs):
        if device_ids is not None and all(d is None for d in device_ids):
            device_ids = None
        return barrier(*args, device_ids=device_ids, **kwargs)

    dist.barrier = barrier_cpu

    # fsdp_cpu_offload: torchtune's shard_model builds CPUOffloadPolicy(),
    # whose pinned host memory needs a CUDA device; on the CPU the same
    # policy unpinned.
    import torchtune.training._distributed as tdist
    if not torch.cuda.is_available():
        from torch.distributed.fsdp import CPUOffloadPolicy
        tdist.CPUOffloadPolicy = functools.partial(CPUOffloadPolicy, pin_memory=False)

    # ... and its backend string names the CPU twice ("cpu:gloo,cpu:gloo"),
    # which init_process_group refuses: on the CPU, gloo alone.
    get_backend = training.get_distributed_backend

    def get_distributed_backend_cpu(device_type, offload_ops_to_cpu=False):
        if device_type == "cpu":
            return get_backend(device_type)
        return get_backend(device_type, offload_ops_to_cpu)

    training.get_distributed_backend = get_distributed_backend_cpu

    for name in ("empty_cache", "reset_peak_memory_stats"):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda *a, **k: None)


# ---- commands ---------------------------------------------------------------------------------

def prepare(out_dir, vocab_size, seed):
    from torchtune.models.llama4._tokenizer import LLAMA4_SPECIAL_TOKENS
    from torchtune.modules.moe.experts import GroupedExperts

    os.makedirs(out_dir, exist_ok=True)
    base = 2000  # ranks in tiktoken_small_llama4.model
    # the ones Llama4Tokenizer._validate_special_tokens requires (its own test for "reserved")
    named = [t for t in LLAMA4_SPECIAL_TOKENS if "_reserved_special_token_" not in t]
    if base + len(named) > vocab_size:
        raise SystemExit(f"vocab_size {vocab_size} < {base + len(named)} (2000 ranks + named special tokens)")
    with open(os.path.join(out_dir, "special_tokens.json"), "w") as f:
        json.dump({"added_tokens": [{"id": base + i, "content": t} for i, t in enumerate(named)]}, f, indent=1)

    torch.manual_seed(seed)
    model = tiny_llama4(vocab_size=vocab_size)
    for m in model.modules():  # GroupedExperts' weights are torch.empty until reset
        if isinstance(m, GroupedExperts):
            m.reset_parameters()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for k, v in sd.items():
        if not torch.isfinite(v).all():
            raise SystemExit(f"non-finite initial weight {k}")
    torch.save(sd, os.path.join(out_dir, "model.pt"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv):
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import importlib.util
    import torchtune
    src = _SRC or os.path.dirname(os.path.dirname(os.path.abspath(torchtune.__file__)))
    path = os.path.join(src, "recipes", "full_finetune_distributed.py")
    spec = importlib.util.spec_from_file_location("full_finetune_distributed", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    install_shims()
    sys.argv = [path] + list(argv)
    recipe.recipe_main()


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "prepare":
        prepare(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "run":
        run(sys.argv[2:])
    else:
        raise SystemExit(__doc__)
