"""The cases of hf_worker.py: transformers' Trainer with accelerate's FSDP2
(fsdp=True, fsdp_config={"version": 2, ...}) on 2 gloo ranks, once with
optimizer_cls_and_kwargs from optc.torch.integrations.optc_optimizer_cls_and_
kwargs(args) and once with torch's optimizer, 6 steps of fixed synthetic
tokens, max_grad_norm=1.0, a cosine schedule with 2 warmup steps; the
logged losses and grad norms, each rank's final param shards and the
optimizer's state_dict() are the same bits.

model: "llama" (LlamaForCausalLM) or "llama4" (Llama4ForCausalLM, a tiny
Llama4TextConfig with MoE layers); both have an odd vocab, so their
embedding's shards are uneven.
dtype: "bf16" (the model's params in bf16, as torchtune trains: no mixed
precision), "fp32", or "mp" (fp32 params, args.bf16=True: accelerate's
mixed precision, FSDP2 computing in bf16).
optim (args.optim): "adamw_torch", against torch.optim.AdamW(foreach=False)
with the helper's kwargs; "adamw_torch_fused" and "sgd" (optim_args
momentum=0.9), against HF's own choice for args.optim (no
optimizer_cls_and_kwargs: torch's fused AdamW, torch's SGD).
offload: fsdp_config cpu_offload=True (accelerate's CPUOffloadPolicy).
"""

SQRT_OPTIMS = {"adamw_torch"}  # fused AdamW has torch's fused kernel's bits; SGD takes no sqrt


def _case(model, dtype, optim, offload=False):
    return dict(name=f"{model}-{dtype}-{optim}{'-offload' if offload else ''}", model=model, dtype=dtype,
                optim=optim, offload=offload)


def cases():
    return [
        _case("llama", "bf16", "adamw_torch"),
        _case("llama", "bf16", "adamw_torch_fused"),
        _case("llama", "fp32", "adamw_torch_fused"),
        _case("llama", "fp32", "adamw_torch"),
        _case("llama", "mp", "adamw_torch_fused"),
        _case("llama", "bf16", "sgd"),
        _case("llama", "fp32", "sgd"),
        _case("llama", "bf16", "adamw_torch", offload=True),
        _case("llama", "fp32", "adamw_torch_fused", offload=True),
        _case("llama4", "bf16", "adamw_torch"),
        _case("llama4", "bf16", "adamw_torch_fused"),
        _case("llama4", "fp32", "adamw_torch"),
    ]


def needs_torch_sqrt(case):
    """fp32 params (also under mixed precision) stepped by the for-loop AdamW."""
    return case["dtype"] in ("fp32", "mp") and case["optim"] in SQRT_OPTIMS
