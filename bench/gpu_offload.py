"""The seed's setting in miniature: a Scout-shaped Llama 4 under FSDP2 with
CPU offload, tokens/s for four optimizers, on one GPU (bench/gpu_offload.sh
runs it there; `--device cpu --tiny` runs the same code on the CPU, for the
test that keeps it working).

The model is HF's Llama4ForCausalLM with Scout's layer shapes (hidden
5120, 40 heads of 128, 8 KV heads, 16 routed experts of 8192 and a shared
one, every layer MoE, chunked RoPE and NoPE, Scout's 202048-token vocab)
but --layers layers (Scout has 48), in bf16, each decoder layer and the
whole model fully_shard-ed with CPUOffloadPolicy (pinned): the params,
grads and optimizer states live in host memory, and the step runs on the
host's cores, as in torchtune's llama4/scout_17B_16E_full (batch 1,
fsdp_cpu_offload: True, enable_activation_checkpointing: True). Each
variant trains --steps steps on random tokens (--seq a sample) after
--warmup untimed ones, and reports tokens/s, the step's time and the
backward's:

  torch          torch.optim.AdamW(lr=2e-5, fused=False), as the config has it
  torch.compile  the same with its step under torch.compile (the seed's change),
                 its compile time reported apart
  optc           optc.torch.AdamW(lr=2e-5)
  optc-inbwd     optc.torch.AdamW(lr=2e-5, in_backward=True): each layer's
                 shard stepped on the host while the GPU runs the backward
                 of the layers before it

Results go to --json (one object per variant) and a table on stdout.
"""
import argparse
import gc
import json
import os
import sys
import time


def scout_config(transformers, layers, tiny):
    if tiny:
        return transformers.Llama4TextConfig(
            vocab_size=1031, hidden_size=64, intermediate_size=64, intermediate_size_mlp=128,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1, use_qk_norm=True,
            no_rope_layer_interval=4, attention_chunk_size=64, max_position_embeddings=4096,
            tie_word_embeddings=False)
    return transformers.Llama4TextConfig(
        vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
        num_hidden_layers=layers, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1, use_qk_norm=True,
        no_rope_layer_interval=4, attention_chunk_size=8192, max_position_embeddings=10485760,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})


def build(torch, transformers, args, device):
    """The model, built on the host in bf16 (HF's own init: buffers such as
    RoPE's inverse frequencies made too), each decoder layer and the whole
    sharded with CPU offload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    torch.manual_seed(0)
    dt = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.Llama4ForCausalLM(scout_config(transformers, args.layers, args.tiny))
    finally:
        torch.set_default_dtype(dt)
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for layer in model.model.layers:
        fully_shard(layer, offload_policy=policy)
    fully_shard(model, offload_policy=policy)
    if device.type == "cuda":
        for name, b in model.named_buffers():  # FSDP2 moves params; the few buffers go to the GPU here
            mod = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            mod.register_buffer(name.rsplit(".", 1)[-1], b.to(device), persistent=False)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def make_optimizer(torch, name, params):
    import optc.torch as otorch
    if name == "torch":
        return torch.optim.AdamW(params, lr=2e-5, fused=False), None
    if name == "torch.compile":
        opt = torch.optim.AdamW(params, lr=2e-5, fused=False)
        return opt, torch.compile(opt.step)
    if name == "optc":
        return otorch.AdamW(params, lr=2e-5), None
    if name == "optc-inbwd":
        return otorch.AdamW(params, lr=2e-5, in_backward=True), None
    raise ValueError(name)


def run_variant(torch, transformers, args, device, name):
    model = build(torch, transformers, args, device)
    opt, step = make_optimizer(torch, name, list(model.parameters()))
    step = step or opt.step
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, model.config.vocab_size, (args.batch, args.seq + 1), generator=gen).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = dict(variant=name, steps=[], compile_s=None)
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = model(input_ids=tokens[:, :-1], labels=tokens[:, 1:]).loss
        loss.backward()
        sync()
        t1 = time.perf_counter()
        step()
        sync()
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if name == "torch.compile" and i == 0:
            out["compile_s"] = t2 - t1
        rec = dict(loss=float(loss), fwd_bwd_s=t1 - t0, step_s=t2 - t1, total_s=t2 - t0)
        if not rec["loss"] == rec["loss"]:
            raise FloatingPointError(f"{name}: the loss is NaN at step {i}")
        if i >= args.warmup:
            out["steps"].append(rec)
        print(f"  {name:14s} step {i}: loss {rec['loss']:.4f}, forward+backward {rec['fwd_bwd_s']:.2f} s, "
              f"opt.step {rec['step_s']:.2f} s{' (warm-up)' if i < args.warmup else ''}", flush=True)
    n = len(out["steps"])
    tot = sorted(r["total_s"] for r in out["steps"])[n // 2]
    out["tokens_per_s"] = args.batch * args.seq / tot
    out["step_s"] = sorted(r["step_s"] for r in out["steps"])[n // 2]
    out["fwd_bwd_s"] = sorted(r["fwd_bwd_s"] for r in out["steps"])[n // 2]
    out["params"] = sum(p.numel() for p in model.parameters())
    del model, opt, step
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--variants", default="torch,torch.compile,optc,optc-inbwd")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny Llama 4 (the CPU smoke test)")
    ap.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    import transformers
    import optc

    device = torch.device(args.device)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        print(f"gpu_offload: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
              f"transformers {transformers.__version__}, optc {optc.library_version}, {os.cpu_count()} host cores")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    results = []
    for name in [v for v in args.variants.split(",") if v]:
        print(f"\n{name}: {args.layers} Scout layer(s), batch {args.batch} x {args.seq} tokens", flush=True)
        try:
            results.append(run_variant(torch, transformers, args, device, name))
        except Exception as e:  # report and go on: one variant's failure must not hide the others
            print(f"  {name}: FAILED: {type(e).__name__}: {e}", flush=True)
            results.append(dict(variant=name, error=f"{type(e).__name__}: {e}"))
    print(f"\n{'variant':16s} {'tokens/s':>10s} {'step s':>8s} {'fwd+bwd s':>10s}  vs torch.compile")
    ref = next((r for r in results if r["variant"] == "torch.compile" and "error" not in r), None)
    for r in results:
        if "error" in r:
            print(f"{r['variant']:16s} FAILED ({r['error'][:60]})")
            continue
        vs = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ref else "-"
        print(f"{r['variant']:16s} {r['tokens_per_s']:10.1f} {r['step_s']:8.2f} {r['fwd_bwd_s']:10.2f}  {vs}")
    if ref and ref.get("compile_s"):
        print(f"torch.compile's first step (its compile): {ref['compile_s']:.1f} s")
    base = next((r for r in results if r["variant"] == "torch" and "error" not in r), None)
    for r in results:  # the same init and data: optc's losses are torch's for-loop's, bit for bit
        if base and "error" not in r and r["variant"].startswith("optc"):
            same = [a["loss"] for a in r["steps"]] == [b["loss"] for b in base["steps"]]
            r["losses_equal_torch"] = same
            print(f"{r['variant']}: losses {'identical to' if same else 'DIFFERENT from'} torch.optim.AdamW's")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    dist.destroy_process_group()
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
