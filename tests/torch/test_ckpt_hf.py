"""optc run against Hugging Face checkpoint directories, with transformers.

A random tiny Llama 4 with the dims of recipes/configs/llama4/scout_tiny_full.yaml
is written by transformers' save_pretrained in shards of 200 KB (>= 3
shards and model.safetensors.index.json). `optc run` starts from that
directory (checkpointer.checkpoint_dir, checkpoint_files by torchtune's
filename_format), trains a few steps and writes step_N/; transformers loads
step_N/ back with from_pretrained, strictly (no missing, unexpected or
mismatched keys), and runs a forward pass.

  - Llama4ForCausalLM: trained 3 steps; the output's shards are grouped and
    named as huggingface_hub's split_torch_state_dict_into_shards groups the
    same state dict (torchtune saves through it);
  - lr 0: every tensor comes back bit for bit, in fp32 and in bf16 (bf16
    weights kept as stored), and with Maverick's interleaved dense layers;
  - from a seeded init, the config.json optc writes builds the same model
    in transformers (MoE in every layer, or interleaved dense layers);
  - a real finetune's inputs together: the Scout-shaped tiny model with
    Llama 4's whole vocabulary, torchtune's llama4_transform on the small
    tiktoken model, alpaca_dataset on a local alpaca json file, and HF
    shards in; the output loads strictly;
  - Llama4ForConditionalGeneration (text_config nested, the decoder under
    language_model., a vision tower optc does not train): the decoder
    trained, the vision tower and projector passed through unchanged, and
    the whole loads as Llama4ForConditionalGeneration.

Needs transformers (skipped without it) and build/optc (or $OPTC_BUILD).
"""
import json
import math
import os

import pytest
import torch

from conftest import ROOT, run

transformers = pytest.importorskip("transformers")
yaml = pytest.importorskip("yaml")
from safetensors.torch import load_file  # noqa: E402
from huggingface_hub import split_torch_state_dict_into_shards  # noqa: E402

RECIPE = os.path.join(ROOT, "recipes", "configs", "llama4", "scout_tiny_full.yaml")
SHARD = "200KB"


def text_config_kwargs(**model):
    """The recipe's model block (with `model`'s keys changed) as HF's Llama4TextConfig keys."""
    m = {**yaml.safe_load(open(RECIPE))["model"], **model}
    heads = m["num_heads"]
    return dict(
        vocab_size=m["vocab_size"], hidden_size=m["embed_dim"], intermediate_size=m["hidden_dim"],
        intermediate_size_mlp=2 * m["hidden_dim"], num_hidden_layers=m["num_layers"], num_attention_heads=heads,
        num_key_value_heads=m["num_kv_heads"], head_dim=m["embed_dim"] // heads, num_local_experts=m["num_experts"],
        num_experts_per_tok=m["experts_per_token"], interleave_moe_layer_step=m["moe_every_n_layers"],
        use_qk_norm=m["use_qk_norm"], no_rope_layer_interval=m["skip_rope_interval"],
        attention_chunk_size=m["attention_chunk_size"], max_position_embeddings=m["max_seq_len"],
        rms_norm_eps=float(m["norm_eps"]), tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": float(m["rope_base"]),
                         "factor": float(m["rope_scale_factor"]), "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                         "original_max_position_embeddings": m["rope_old_context_len"]})


def randomize(model, seed):
    """Every weight random (norms near 1), so that a tensor put in the wrong place shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.05
            p.copy_((1.0 + noise) if "norm" in name else noise)


def shards(d):
    return sorted(f for f in os.listdir(d) if f.startswith("model-") and f.endswith(".safetensors"))


def save_hf(model, d):
    model.save_pretrained(d, max_shard_size=SHARD)
    files = shards(d)
    assert len(files) >= 3 and os.path.exists(os.path.join(d, "model.safetensors.index.json")), os.listdir(d)
    return files


def optc_run(optc_bin, ckpt_dir, nfiles, out, *extra, cwd=None):
    files = '{filename_format: "model-{}-of-{}.safetensors", max_filename: "%05d"}' % nfiles
    r = run([optc_bin, "run", "full_finetune_distributed", "--config", RECIPE, f"output_dir={out}",
             "dataset.num_samples=400", f"checkpointer.checkpoint_dir={ckpt_dir}",
             f"checkpointer.checkpoint_files={files}", f"checkpointer.max_shard_size={SHARD}", *extra], cwd=cwd)
    latest = open(os.path.join(out, "latest")).read().strip()
    return os.path.join(out, latest), r.stderr


def load_strict(cls, d, **kw):
    model, info = cls.from_pretrained(d, output_loading_info=True, **kw)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), f"{d}: {k}: {info.get(k)}"
    return model


def state(d):
    out = {}
    for f in shards(d) or ["model.safetensors"]:
        out.update(load_file(os.path.join(d, f)))
    return out


def losses(out):
    return [json.loads(line)["loss"] for line in open(os.path.join(out, "logs", "metrics.jsonl"))]


def test_causal_lm_sharded(optc_bin, tmp_path):
    cfg = transformers.Llama4TextConfig(**text_config_kwargs())
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(cfg)
    randomize(model, 1)
    hf = str(tmp_path / "hf")
    files = save_hf(model, hf)
    step, log = optc_run(optc_bin, hf, len(files), str(tmp_path / "out"), "max_steps=3")
    assert step.endswith("step_3"), log
    # the first loss is the HF model's, not a random init's (ln 259 = 5.56)
    first = losses(str(tmp_path / "out"))[0]
    print(f"{len(files)} HF shards in; first loss {first:.4f}")

    out = load_strict(transformers.Llama4ForCausalLM, step)
    x = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loss = out(x, labels=x).loss
    assert torch.isfinite(loss)
    # trained: moved, and not far
    before, after = model.state_dict(), out.state_dict()
    assert before.keys() == after.keys()
    moved = sum(not torch.equal(before[k], after[k]) for k in before)
    assert moved == len(before), f"{len(before) - moved} tensors did not change in 3 steps"
    worst = max((before[k] - after[k]).abs().max().item() for k in before)
    assert worst < 0.1, worst

    # the output's shards: huggingface_hub's grouping and names for the same
    # state dict in the model's order, and its index
    sd = {k: v.detach().clone() for k, v in after.items()}
    split = split_torch_state_dict_into_shards(sd, max_shard_size=SHARD)
    text = open(os.path.join(step, "model.safetensors.index.json")).read()
    idx = json.loads(text)
    assert idx["weight_map"] == split.tensor_to_filename
    # the very text save_torch_state_dict writes (json.dump, indent=2)
    assert text == json.dumps({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, indent=2)
    assert idx["metadata"]["total_size"] == split.metadata["total_size"]
    got = {}
    for k, f in idx["weight_map"].items():
        got.setdefault(f, []).append(k)
    assert got == split.filename_to_tensors
    for f in shards(step):
        with open(os.path.join(step, f), "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            assert json.loads(fh.read(n))["__metadata__"] == {"format": "pt"}
    print(f"{len(shards(step))} optc shards out, grouped as huggingface_hub groups them; loss on random tokens {loss:.4f}")


def test_scout_tokenizer_alpaca_json(optc_bin, tmp_path):
    """The Scout-shaped tiny model with Llama 4's vocabulary (202048: the
    tokenizer's ids are never remapped), torchtune's llama4_transform on the
    small tiktoken model, alpaca_dataset from a local alpaca json file, and
    >= 3 HF shards in: the losses fall from the HF model's, not a random
    init's, and the output loads strictly."""
    dims = dict(vocab_size=202048, embed_dim=32, hidden_dim=32)
    cfg = transformers.Llama4TextConfig(**text_config_kwargs(**dims))
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(cfg)
    randomize(model, 3)
    hf = str(tmp_path / "hf")
    files = save_hf(model, hf)
    data = os.path.join(ROOT, "tests", "data")
    out = str(tmp_path / "out")
    common = ["batch_size=2", *(f"model.{k}={v}" for k, v in dims.items()),
              "tokenizer._component_=torchtune.models.llama4.llama4_transform",
              "tokenizer.path=../tokenizer/tiktoken_small_llama4.model", "tokenizer.max_seq_len=96",
              "~dataset.num_samples", "dataset._component_=torchtune.datasets.alpaca_dataset",
              "dataset.source=json", "dataset.data_files=alpaca_small.json"]
    step, log = optc_run(optc_bin, hf, len(files), out, "max_steps=4", *common, cwd=data)
    assert "alpaca_dataset" in log and step.endswith("step_4"), log
    got = losses(out)
    # the same batch on optc's own seeded init: the first loss differs, so the
    # weights came from the shards
    seeded = str(tmp_path / "seeded")
    run([optc_bin, "run", "full_finetune_distributed", "--config", RECIPE, f"output_dir={seeded}", "max_steps=1",
         *common], cwd=data)
    print(f"{len(files)} HF shards in; losses {got}; seeded init's first {losses(seeded)[0]}")
    assert all(map(math.isfinite, got)) and got[-1] < got[0], got
    assert got[0] != losses(seeded)[0]
    trained = load_strict(transformers.Llama4ForCausalLM, step)
    before, after = model.state_dict(), trained.state_dict()
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("dtype,dense", [("fp32", False), ("bf16", False), ("fp32", True)],
                         ids=["fp32", "bf16", "interleaved_dense"])
def test_lr0_round_trip(optc_bin, tmp_path, dtype, dense):
    kw = text_config_kwargs()
    extra = []
    if dense:  # Maverick's layout: MoE every second layer, dense SwiGLU between
        kw.update(interleave_moe_layer_step=2, intermediate_size_mlp=128)
        extra = ["model.moe_every_n_layers=2", "model.mlp_hidden_dim=128"]
    cfg = transformers.Llama4TextConfig(**kw)
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(cfg)
    randomize(model, 3)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    hf = str(tmp_path / "hf")
    files = save_hf(model, hf)
    step, log = optc_run(optc_bin, hf, len(files), str(tmp_path / "out"), "max_steps=2", "optimizer.lr=0",
                         f"dtype={dtype}", *extra)
    a, b = state(hf), state(step)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    # config.json and generation_config.json copied, as torchtune copies them
    for f in ("config.json", "generation_config.json"):
        assert open(os.path.join(hf, f)).read() == open(os.path.join(step, f)).read()
    load_strict(transformers.Llama4ForCausalLM, step)
    print(f"{dtype}: {len(a)} tensors back bit for bit through optc")


def test_conditional_generation(optc_bin, tmp_path):
    tc = text_config_kwargs()
    vc = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vision_output_dim=64,
              image_size=28, patch_size=14, projector_input_dim=64, projector_output_dim=64, pixel_shuffle_ratio=0.5)
    cfg = transformers.Llama4Config(text_config=tc, vision_config=vc, boi_token_index=250, eoi_token_index=251,
                                    image_token_index=252)
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration(cfg)
    randomize(model, 4)
    hf = str(tmp_path / "hf")
    files = save_hf(model, hf)
    step, log = optc_run(optc_bin, hf, len(files), str(tmp_path / "out"), "max_steps=2")
    out = load_strict(transformers.Llama4ForConditionalGeneration, step)
    a, b = model.state_dict(), out.state_dict()
    assert a.keys() == b.keys()
    vision = [k for k in a if not k.startswith("language_model.")]
    assert vision and all(torch.equal(a[k], b[k]) for k in vision)
    text = [k for k in a if k.startswith("language_model.")]
    assert all(not torch.equal(a[k], b[k]) for k in text)
    x = torch.randint(0, 250, (1, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():  # text only: transformers 5.24's text-only forward of the whole model fails on its own
        assert torch.isfinite(out.language_model(input_ids=x, labels=x).loss)
    print(f"multimodal: {len(text)} decoder tensors trained, {len(vision)} vision tensors passed through")


@pytest.mark.parametrize("dense", [False, True], ids=["moe", "interleaved_dense"])
def test_generated_config(optc_bin, tmp_path, dense):
    """A run from a seeded init writes config.json from the recipe's dims;
    transformers builds the same model from it (Maverick's interleaved dense
    layers too) and loads the weights strictly."""
    out = str(tmp_path / "out")
    extra = ["model.moe_every_n_layers=2", "model.mlp_hidden_dim=128"] if dense else []
    run([optc_bin, "run", "full_finetune_distributed", "--config", RECIPE, f"output_dir={out}",
         "dataset.num_samples=400", "max_steps=1", *extra])
    step = os.path.join(out, open(os.path.join(out, "latest")).read().strip())
    cfg = transformers.AutoConfig.from_pretrained(step)
    want = text_config_kwargs()
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "num_local_experts", "use_qk_norm", "attention_chunk_size"):
        assert getattr(cfg, k) == want[k], k
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["factor"] == want["rope_parameters"]["factor"]
    assert cfg.no_rope_layers == [1, 1, 1, 0]
    assert cfg.moe_layers == ([1, 3] if dense else [0, 1, 2, 3])
    if dense:
        assert cfg.intermediate_size_mlp == 128
    model = load_strict(transformers.Llama4ForCausalLM, step)
    x = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.isfinite(model(x, labels=x).loss)
