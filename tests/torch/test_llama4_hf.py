"""optc's Llama 4 text decoder against transformers' Llama4ForCausalLM.

Tiny Scout-shaped (every layer MoE, QK-norm, llama3-scaled RoPE) and
Maverick-shaped (dense SwiGLU layers between MoE ones, no QK-norm, plain
RoPE) configs, on random weights: both have chunked attention on the RoPE
layers, a NoPE layer (every 4th) and the NoPE layers' temperature tuning
with a floor_scale small enough that the temperature moves within the
batch. transformers runs the eager attention in float32: its RMSNorm,
QK-norm and RoPE compute in float32 whatever the model's dtype, so float64
would buy nothing. optc runs in double through tests/l4_hf_check
($L4_HF_CHECK, else $OPTC_BUILD/tests/l4_hf_check, default build/), which
reads HF's state_dict by name, so the tensor table is checked too.

Checked: the summed token loss to 1e-6 relative, and each parameter's
gradient to 1e-4 of its largest entry.
"""
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
try:  # absent, too old for Llama 4, or broken against this torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig
except ImportError as e:
    pytest.skip(f"transformers' Llama 4 is not importable: {e}", allow_module_level=True)
st = pytest.importorskip("safetensors.torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("OPTC_BUILD", os.path.join(ROOT, "build"))
TOOL = os.environ.get("L4_HF_CHECK", os.path.join(BUILD, "tests", "l4_hf_check"))

LOSS_RTOL = 1e-6
GRAD_RTOL = 1e-4
B, T = 2, 12

COMMON = dict(
    vocab_size=61, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    num_hidden_layers=4, intermediate_size=16, rms_norm_eps=1e-5, num_experts_per_tok=1,
    attention_chunk_size=4, no_rope_layer_interval=4, attn_temperature_tuning=True, floor_scale=3,
    attn_scale=0.1, max_position_embeddings=64, tie_word_embeddings=False,
)
CONFIGS = {
    # RoPE frequencies 1, 0.32, 0.1, 0.03 (wavelengths 6.3 .. 199): with an old
    # context of 32 and factors 1..8 two are smoothed and two divided
    "scout": dict(num_local_experts=4, interleave_moe_layer_step=1, use_qk_norm=True,
                  rope_parameters=dict(rope_type="llama3", rope_theta=100.0, factor=4.0, low_freq_factor=1.0,
                                       high_freq_factor=8.0, original_max_position_embeddings=32)),
    # dense layers 0 and 2 (width 24), MoE layers 1 and 3
    "maverick": dict(num_local_experts=8, interleave_moe_layer_step=2, intermediate_size_mlp=24, use_qk_norm=False,
                     rope_parameters=dict(rope_type="default", rope_theta=100.0)),
}


def l4_config(cfg):
    """The L4Config fields l4_hf_check reads from metadata, from HF's config."""
    rope = cfg.rope_parameters
    scaled = rope.get("rope_type") == "llama3"
    assert cfg.moe_layers == list(range(cfg.interleave_moe_layer_step - 1, cfg.num_hidden_layers,
                                        cfg.interleave_moe_layer_step))
    assert cfg.no_rope_layers == [int((i + 1) % cfg.no_rope_layer_interval != 0)
                                  for i in range(cfg.num_hidden_layers)]
    meta = dict(
        vocab_size=cfg.vocab_size, num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads, embed_dim=cfg.hidden_size, head_dim=cfg.head_dim,
        hidden_dim=cfg.intermediate_size, shared_hidden_dim=cfg.intermediate_size,
        num_experts=cfg.num_local_experts, moe_every_n_layers=cfg.interleave_moe_layer_step,
        mlp_hidden_dim=cfg.intermediate_size_mlp, skip_rope_interval=cfg.no_rope_layer_interval,
        use_qk_norm=int(cfg.use_qk_norm), attention_chunk_size=cfg.attention_chunk_size,
        rope_base=rope["rope_theta"], rope_scale_factor=rope["factor"] if scaled else 0.0,
        rope_low_freq_factor=rope.get("low_freq_factor", 1.0), rope_high_freq_factor=rope.get("high_freq_factor", 1.0),
        rope_old_context_len=rope.get("original_max_position_embeddings", 8192), norm_eps=cfg.rms_norm_eps,
        attn_temperature_tuning=int(cfg.attn_temperature_tuning), attn_floor_scale=float(cfg.floor_scale),
        attn_scale=cfg.attn_scale,
    )
    return {k: repr(v) for k, v in meta.items()}


def hf_model(name):
    cfg = Llama4TextConfig(**COMMON, **CONFIGS[name])
    cfg._attn_implementation = "eager"
    torch.manual_seed(1234)
    model = Llama4ForCausalLM(cfg).float()
    # weights large enough that attention, routing and the norms all matter;
    # norm weights away from 1 so that none is symmetric by accident
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return cfg, model


def batch(vocab):
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    targets[0, 3] = targets[1, 0] = targets[1, T - 1] = -100
    return tokens, targets


def run_optc(tmp_path, cfg, model, tokens, targets):
    if not os.access(TOOL, os.X_OK):
        pytest.fail(f"{TOOL} is not built (ninja -C build, or set L4_HF_CHECK / OPTC_BUILD)")
    weights = {k: v.detach().double().contiguous() for k, v in model.state_dict().items()}
    st.save_file(weights, str(tmp_path / "weights.safetensors"), metadata=l4_config(cfg))
    st.save_file({"tokens": tokens.int().contiguous(), "targets": targets.int().contiguous()},
                 str(tmp_path / "batch.safetensors"))
    out = tmp_path / "out.safetensors"
    r = subprocess.run([TOOL, str(tmp_path / "weights.safetensors"), str(tmp_path / "batch.safetensors"), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"l4_hf_check failed ({r.returncode}):\n{r.stderr}"
    return st.load_file(str(out))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_llama4_matches_transformers(tmp_path, name):
    cfg, model = hf_model(name)
    tokens, targets = batch(cfg.vocab_size)
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size).float(), targets.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    loss.backward()

    got = run_optc(tmp_path, cfg, model, tokens, targets)
    assert int(got["ntokens"]) == int((targets != -100).sum())
    ref, ours = loss.item(), got["loss"].item()
    loss_rel = abs(ours - ref) / abs(ref)
    print(f"\n{name}: loss transformers {ref:.9f} optc {ours:.9f} rel diff {loss_rel:.2e}")
    assert loss_rel <= LOSS_RTOL, f"{name}: loss {ours!r} vs transformers' {ref!r}"

    worst, where, bad = 0.0, "", []
    kinds = {}
    for pname, p in model.named_parameters():
        g = got[pname]
        assert p.grad is not None and tuple(g.shape) == tuple(p.shape), pname
        scale = g.abs().max().item()
        err = (p.grad.double() - g).abs().max().item() / max(scale, 1e-30)
        kind = ".".join(w for w in pname.split(".") if not w.isdigit() and w not in ("model", "layers", "weight"))
        kinds[kind] = max(kinds.get(kind, 0.0), err)
        if err > worst:
            worst, where = err, pname
        if err > GRAD_RTOL or scale == 0:
            bad.append(f"{pname}: max |diff| / max |g| = {err:.3g} (max |g| {scale:.3g})")
    for kind, err in kinds.items():
        print(f"  {kind:40s} grad max |diff| / max |g| {err:.2e}")
    print(f"  worst gradient: {where} {worst:.2e}")
    assert not bad, f"{name}: gradients differ from transformers':\n" + "\n".join(bad)
