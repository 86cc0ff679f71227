#!/usr/bin/env python3
"""optc run vs torchtune's full_finetune_distributed recipe: same config,
weights and data, interleaved, on the CPU. See README.md.

  .venv/bin/python bench/vs_torchtune/run.py                       # tiny,100m; 3 reps of 20 steps
  .venv/bin/python bench/vs_torchtune/run.py --smoke               # tiny, 1 rep of 4 steps
  .venv/bin/python bench/vs_torchtune/run.py --configs 100m --steps 8 --reps 1 --json out.json
"""
import argparse
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# a git repository (bare or not) of github.com/pytorch/torchtune, where $TORCHTUNE_SRC is not given
MIRROR = os.environ.get("TORCHTUNE_MIRROR", "")
TOKENIZER = os.path.join(ROOT, "tests", "tokenizer", "tiktoken_small_llama4.model")
VOCAB = 202048  # Llama4Tokenizer's special tokens sit at 200000..202047 (never remapped by optc)

# Model dims in torchtune's llama4_decoder vocabulary. Both are Scout-shaped:
# MoE in every layer (16 routed experts, top-1 sigmoid router, a shared
# expert), qk-norm, NoPE every 4th layer, chunked attention elsewhere,
# scaled RoPE (llama3 type).
CONFIGS = {
    # recipes/configs/llama4/scout_tiny_full.yaml's model, at Llama 4's vocabulary
    "tiny": dict(model=dict(num_layers=4, num_heads=4, num_kv_heads=2, embed_dim=64, hidden_dim=64, num_experts=16,
                            experts_per_token=1, use_shared_expert=True, use_qk_norm=True, skip_rope_interval=4,
                            moe_every_n_layers=1, attention_chunk_size=32, max_seq_len=128, rope_base=500000,
                            rope_scale_factor=16.0, rope_old_context_len=64, norm_eps=1e-5),
                 batch_size=4, seq_len=128, lr=3e-3),
    # ~112M parameters in the layers (+ 207M in the 202048-row embedding and output)
    "100m": dict(model=dict(num_layers=8, num_heads=8, num_kv_heads=2, embed_dim=512, hidden_dim=512, num_experts=16,
                            experts_per_token=1, use_shared_expert=True, use_qk_norm=True, skip_rope_interval=4,
                            moe_every_n_layers=1, attention_chunk_size=64, max_seq_len=256, rope_base=500000,
                            rope_scale_factor=16.0, rope_old_context_len=64, norm_eps=1e-5),
                 batch_size=4, seq_len=256, lr=3e-4),
}
SEED = 1234


def param_counts(m):
    d, h, kv, f, e, layers = (m["embed_dim"], m["num_heads"], m["num_kv_heads"], m["hidden_dim"], m["num_experts"],
                              m["num_layers"])
    hd = d // h
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d
    moe = e * 3 * d * f + (3 * d * f if m["use_shared_expert"] else 0) + d * e
    per_layer = attn + moe + 2 * d
    active = attn + 3 * d * f * (m["experts_per_token"] + (1 if m["use_shared_expert"] else 0)) + d * e + 2 * d
    emb = 2 * VOCAB * d
    return dict(total=layers * per_layer + emb + d, layers=layers * per_layer, embedding_and_output=emb,
                active_per_token=layers * active + VOCAB * d + d)


# ---- inputs ---------------------------------------------------------------------------------

def torchtune_src(work):
    env = os.environ.get("TORCHTUNE_SRC")
    if env:
        if not os.path.isfile(os.path.join(env, "recipes", "full_finetune_distributed.py")):
            sys.exit(f"$TORCHTUNE_SRC={env} has no recipes/full_finetune_distributed.py")
        return env
    dest = os.path.join(work, "torchtune_src")
    if not os.path.isfile(os.path.join(dest, "recipes", "full_finetune_distributed.py")):
        if not MIRROR or not os.path.isdir(MIRROR):
            sys.exit("no torchtune source: set $TORCHTUNE_SRC (a checkout with Llama 4) or $TORCHTUNE_MIRROR (a git "
                     f"repository of github.com/pytorch/torchtune){': no directory ' + MIRROR if MIRROR else ''}")
        tar = subprocess.run(["git", "-C", MIRROR, "archive", "HEAD", "torchtune", "recipes"],
                             check=True, capture_output=True).stdout
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(dest, filter="data")
    return dest


def torchtune_commit(src):
    try:
        return subprocess.run(["git", "-C", MIRROR, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() if not os.environ.get("TORCHTUNE_SRC") else src
    except (OSError, subprocess.SubprocessError):
        return src


_WORDS = ("the sun rises in the east and sets in the west while rivers run to the sea birds sing at dawn and "
          "owls call at night under a sky full of stars green hills roll toward a quiet town where bakers "
          "wake early and bread cools on wooden racks").split()


def write_data(path, n):
    """n alpaca rows (instruction / input / output) of varied length, deterministic."""
    rows = []
    for i in range(n):
        k = len(_WORDS)
        w = _WORDS[(7 * i) % k:] + _WORDS[:(7 * i) % k]
        rows.append({"instruction": f"Task {i}: repeat and continue the words " + " ".join(w[:5 + i % 7]),
                     "input": " ".join(w[5:9 + i % 4]) if i % 3 else "",
                     "output": " ".join((w * 3)[:8 + (13 * i) % 50])})
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


def write_weights(d, model, seed):
    """A random Llama4ForCausalLM (transformers' save_pretrained), rewritten as the
    decoder of a Llama4ForConditionalGeneration checkpoint: config.json a
    Llama4Config with the text config under text_config, tensors named
    language_model.*. torchtune's FullModelHFCheckpointer (model_type LLAMA4)
    maps only language_model.* names; optc reads this layout too. Both read the
    same file."""
    stamp = json.dumps({"model": model, "seed": seed, "vocab": VOCAB}, sort_keys=True)
    stamp_path = os.path.join(d, "bench_spec.json")
    if os.path.isfile(os.path.join(d, "model.safetensors")) and os.path.isfile(stamp_path) and \
            open(stamp_path).read() == stamp:
        return
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    m = model
    kw = dict(vocab_size=VOCAB, hidden_size=m["embed_dim"], intermediate_size=m["hidden_dim"],
              intermediate_size_mlp=2 * m["hidden_dim"], num_hidden_layers=m["num_layers"],
              num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"],
              head_dim=m["embed_dim"] // m["num_heads"], num_local_experts=m["num_experts"],
              num_experts_per_tok=m["experts_per_token"], interleave_moe_layer_step=m["moe_every_n_layers"],
              use_qk_norm=m["use_qk_norm"], no_rope_layer_interval=m["skip_rope_interval"],
              attention_chunk_size=m["attention_chunk_size"], max_position_embeddings=m["max_seq_len"],
              rms_norm_eps=float(m["norm_eps"]), tie_word_embeddings=False,
              rope_parameters={"rope_type": "llama3", "rope_theta": float(m["rope_base"]),
                               "factor": float(m["rope_scale_factor"]), "low_freq_factor": 1.0,
                               "high_freq_factor": 1.0, "original_max_position_embeddings": m["rope_old_context_len"]})
    cfg = transformers.Llama4TextConfig(**kw)
    torch.manual_seed(seed)
    lm = transformers.Llama4ForCausalLM(cfg)  # transformers' own init (normal, std initializer_range)
    text = d + ".text"
    lm.save_pretrained(text, max_shard_size="50GB")
    sd = {}
    for f in sorted(os.listdir(text)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(text, f)))
    os.makedirs(d, exist_ok=True)
    save_file({"language_model." + k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    tc = json.load(open(os.path.join(text, "config.json")))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": tc},
                  f, indent=1)
    subprocess.run(["rm", "-rf", text], check=True)
    with open(stamp_path, "w") as f:
        f.write(stamp)


def recipe_config(side, name, spec, work, out, steps, compiled=True):
    """The recipe YAML for one side. Everything but the model block's key
    names (optc takes HF-style rope_old_context_len; torchtune's builder
    takes use_scaled_rope + old_context_len) and the metric logger is the
    same text on both sides."""
    m = dict(spec["model"])
    model = {"_component_": "torchtune.models.llama4.llama4_decoder", "vocab_size": VOCAB, **m}
    if side == "torchtune":
        model["old_context_len"] = model.pop("rope_old_context_len")
        model["use_scaled_rope"] = True
        model["_component_"] = "tt_wrap.llama4_text"
        logger = {"_component_": "tt_wrap.JsonlLogger", "log_dir": os.path.join(out, "logs")}
    else:
        logger = {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": os.path.join(out, "logs")}
    return {
        "output_dir": out,
        "tokenizer": {"_component_": "torchtune.models.llama4.llama4_transform", "path": TOKENIZER,
                      "max_seq_len": spec["seq_len"], "max_num_tiles": 1},
        "dataset": {"_component_": "torchtune.datasets.alpaca_dataset", "source": "json",
                    "data_files": os.path.join(work, "alpaca.json"), "split": "train", "packed": False},
        "seed": SEED, "shuffle": False,
        "model": model,
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer",
                         "checkpoint_dir": os.path.join(work, name, "hf"), "checkpoint_files": ["model.safetensors"],
                         "recipe_checkpoint": None, "output_dir": out, "model_type": "LLAMA4"},
        "resume_from_checkpoint": False,
        "batch_size": spec["batch_size"], "epochs": 1, "max_steps_per_epoch": steps, "save_every_n_steps": steps,
        "gradient_accumulation_steps": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": spec["lr"], "weight_decay": 0.01, "fused": False,
                      "foreach": False},
        "optimizer_in_bwd": False,
        "lr_scheduler": {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                         "num_warmup_steps": 2},
        "loss": {"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"},
        "clip_grad_norm": 1.0,
        "device": "cpu", "dtype": "fp32",
        "enable_activation_checkpointing": False, "enable_activation_offloading": False, "fsdp_cpu_offload": False,
        # torchtune: nothing compiled (eager torch). optc: only its optimizer step is compiled, or not.
        "compile": {"model": False, "loss": False, "optimizer_step": compiled if side == "optc" else False,
                    "scale_grads": False},
        "tensor_parallel_dim": 1, "data_parallel_shard_dim": -1, "data_parallel_replicate_dim": 1,
        "metric_logger": logger, "log_every_n_steps": 1, "log_peak_memory_stats": False, "log_level": "INFO",
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }


# ---- running --------------------------------------------------------------------------------

OPTC_IGNORED = ("optimizer_in_bwd", "device", "enable_activation_checkpointing", "enable_activation_offloading",
                "log_peak_memory_stats", "tensor_parallel_dim", "data_parallel_shard_dim",
                "data_parallel_replicate_dim", "log_level", "profiler")


def run_side(side, cfg, path, env, optc_bin, pin, timeout):
    import yaml
    out = cfg["output_dir"]
    subprocess.run(["rm", "-rf", out], check=True)
    os.makedirs(out)
    if side != "torchtune":
        # optc notes the torchtune-only keys as unused; drop them to keep its log short (they change nothing)
        cfg = {k: v for k, v in cfg.items() if k not in OPTC_IGNORED}
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    steps_file = os.path.join(out, "steps.jsonl")
    if side == "torchtune":
        cmd = [sys.executable, os.path.join(HERE, "tt_wrap.py"), steps_file, "--config", path]
    else:
        cmd = [optc_bin, "run", "full_finetune_distributed", "--config", path]
    if pin:
        cmd = ["taskset", "-c", pin] + cmd
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{side} failed (rc {p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    res = {"side": side, "wall_s": wall, "log_tail": p.stderr[-2000:]}
    if side == "torchtune":
        res["steps"] = [json.loads(line) for line in open(steps_file)]
    else:
        recs = [json.loads(line) for line in open(os.path.join(out, "logs", "metrics.jsonl"))]
        for r in recs:
            r["step_s"] = r["tokens"] / r["tokens_per_second_per_gpu"]
        res["steps"] = recs
        m = re.search(r"optc run: .*?, (\d+) parameters in", p.stderr)
        if m:
            res["optc_param_count"] = int(m.group(1))
        m = re.search(r"time: forward\+backward ([\d.]+) s, collectives ([\d.]+) s, optimizer ([\d.]+) s", p.stderr)
        if m:
            res["totals"] = {"fwd_bwd_s": float(m.group(1)), "coll_s": float(m.group(2)), "opt_s": float(m.group(3))}
    return res


def steady(res, skip):
    st = [s for s in res["steps"] if s["step"] > skip] or res["steps"]
    tok = sum(s["tokens"] for s in st)
    sec = sum(s["step_s"] for s in st)
    out = {"tokens_per_s": tok / sec, "step_ms": 1e3 * sec / len(st), "steps_counted": len(st)}
    if res["side"] == "torchtune":
        out["fwd_ms"] = 1e3 * statistics.mean(s["fwd_s"] for s in st)
        out["bwd_ms"] = 1e3 * statistics.mean(s["bwd_s"] for s in st)
        out["fwd_bwd_ms"] = out["fwd_ms"] + out["bwd_ms"]
        out["opt_ms"] = 1e3 * statistics.mean(s["opt_s"] for s in st)
    elif "totals" in res:  # optc prints totals over all steps, warm-up included
        n = len(res["steps"])
        out["fwd_bwd_ms_all_steps"] = 1e3 * res["totals"]["fwd_bwd_s"] / n
        out["opt_ms_all_steps"] = 1e3 * res["totals"]["opt_s"] / n
    return out


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="tiny,100m", help="comma list of: " + ", ".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    ap.add_argument("--reps", type=int, default=3, help="runs per side, interleaved (default 3)")
    ap.add_argument("--skip", type=int, default=3, help="first steps left out of tokens/s (default 3)")
    ap.add_argument("--optc-modes", default="compiled,eager",
                    help="optc's optimizer step: compiled, eager or both (default compiled,eager)")
    ap.add_argument("--threads", type=int, default=0,
                    help="pin both sides to CPUs 0..N-1 (taskset) with N torch threads; default: all CPUs")
    ap.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "optc_vs_torchtune"))
    ap.add_argument("--optc", default=os.environ.get("OPTC", os.path.join(ROOT, "build", "optc")))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--smoke", action="store_true", help="--configs tiny --steps 4 --reps 1 --skip 2")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run (default 3600)")
    a = ap.parse_args()
    if a.smoke:
        a.configs, a.steps, a.reps, a.skip = "tiny", 4, 1, 2
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            sys.exit(f"unknown config {c!r}; have {', '.join(CONFIGS)}")
    modes = [m for m in a.optc_modes.split(",") if m]
    if any(m not in ("compiled", "eager") for m in modes):
        sys.exit("--optc-modes: compiled and/or eager")
    if not os.path.isfile(a.optc):
        sys.exit(f"no optc binary at {a.optc} (build it, or pass --optc / $OPTC)")
    if a.skip >= a.steps:
        sys.exit("--skip must be below --steps")

    work = os.path.abspath(a.workdir)
    os.makedirs(work, exist_ok=True)
    src = torchtune_src(work)
    cpus = sorted(os.sched_getaffinity(0))
    threads = a.threads or len(cpus)
    pin = ",".join(map(str, cpus[:threads])) if a.threads else None
    env = dict(os.environ)
    env.update(TORCHTUNE_SRC=src, OMP_NUM_THREADS=str(threads), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=os.path.join(work, "hf_home"), TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([HERE, os.path.join(ROOT, "tests", "torch"), src] +
                                          ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)

    max_batch = max(CONFIGS[c]["batch_size"] for c in names)
    write_data(os.path.join(work, "alpaca.json"), a.steps * max_batch)
    sides = ["torchtune"] + [f"optc-{m}" for m in modes]
    print(f"optc vs torchtune: configs {names}, {a.steps} steps x {a.reps} reps, sides {sides} interleaved; "
          f"{threads} threads{' pinned to CPUs ' + pin if pin else ''}; tokens/s over steps > {a.skip}")
    print(f"  torchtune source: {src}; optc: {a.optc}")
    report = {"args": vars(a), "threads": threads, "torchtune_src": src, "torchtune_commit": torchtune_commit(src),
              "machine": {"cpus": len(cpus), "loadavg_start": os.getloadavg()}, "configs": {}}

    for name in names:
        spec = CONFIGS[name]
        pc = param_counts(spec["model"])
        t = time.perf_counter()
        write_weights(os.path.join(work, name, "hf"), spec["model"], SEED)
        print(f"\n== {name}: {pc['total'] / 1e6:.1f}M params ({pc['layers'] / 1e6:.1f}M in layers, "
              f"{pc['embedding_and_output'] / 1e6:.1f}M embedding+output), batch {spec['batch_size']} x seq "
              f"<= {spec['seq_len']}, lr {spec['lr']}; weights {time.perf_counter() - t:.1f} s")
        runs = {s: [] for s in sides}
        for rep in range(a.reps):
            for side in sides:
                kind = "torchtune" if side == "torchtune" else "optc"
                out = os.path.join(work, name, f"out_{side}")
                cfg = recipe_config(kind, name, spec, work, out, a.steps, compiled=(side == "optc-compiled"))
                res = run_side(kind, cfg, os.path.join(work, name, f"{side}.yaml"), env, a.optc, pin, a.timeout)
                res["side"] = kind
                res["steady"] = steady(res, a.skip)
                runs[side].append(res)
                if res.get("optc_param_count") not in (None, pc["total"]):
                    print(f"  note: optc counts {res['optc_param_count']} parameters, run.py {pc['total']}")
                print(f"  rep {rep + 1} {side:14s} {res['steady']['tokens_per_s']:9.1f} counted tokens/s  "
                      f"{res['steady']['step_ms']:8.1f} ms/step  (process {res['wall_s']:.1f} s)", flush=True)
        # summaries
        summary = {}
        for side in sides:
            tps = [r["steady"]["tokens_per_s"] for r in runs[side]]
            keys = [k for k in runs[side][0]["steady"] if k.endswith("_ms") or k.endswith("_ms_all_steps")]
            summary[side] = {"tokens_per_s_median": statistics.median(tps), "tokens_per_s": tps,
                             **{k + "_median": statistics.median(r["steady"][k] for r in runs[side]) for k in keys}}
        ref = runs["torchtune"][0]["steps"]
        agree = {}
        for side in sides:
            for i, r in enumerate(runs[side]):
                if side == "torchtune" and i == 0:
                    continue
                steps = r["steps"]
                n = min(len(ref), len(steps))
                diffs = [rel(ref[k]["loss"], steps[k]["loss"]) for k in range(n)]
                toks = all(ref[k]["tokens"] == steps[k]["tokens"] for k in range(n))
                gn = [rel(ref[k]["grad_norm"], steps[k]["grad_norm"]) for k in range(n)
                      if ref[k].get("grad_norm") is not None and steps[k].get("grad_norm") is not None]
                agree[f"{side}#{i + 1}"] = {"max_rel": max(diffs), "first_rel": diffs[0], "per_step_rel": diffs,
                                            "grad_norm_max_rel": max(gn) if gn else None,
                                            "same_tokens": toks, "steps": n, "same_step_count": len(ref) == len(steps)}
        report["configs"][name] = {"params": pc, "spec": spec, "summary": summary, "loss_agreement": agree,
                                   "runs": {s: [{k: v for k, v in r.items() if k != "log_tail"} for r in runs[s]]
                                            for s in sides}}
        # print
        print(f"\n  {'side':14s} {'tokens/s (median)':>18s} {'ms/step':>9s} {'fwd+bwd ms':>11s} {'optimizer ms':>13s}")
        for side in sides:
            s = summary[side]
            fb = s.get("fwd_bwd_ms_median", s.get("fwd_bwd_ms_all_steps_median"))
            op = s.get("opt_ms_median", s.get("opt_ms_all_steps_median"))
            star = "" if side == "torchtune" else " *"
            print(f"  {side:14s} {s['tokens_per_s_median']:18.1f} {s['step_ms_median']:9.1f} "
                  f"{fb if fb is not None else float('nan'):11.1f} {op if op is not None else float('nan'):13.1f}{star}")
        base = summary["torchtune"]["tokens_per_s_median"]
        for side in sides[1:]:
            print(f"  {side}: {summary[side]['tokens_per_s_median'] / base:.2f}x torchtune's counted tokens/s")
        print("  (* optc's fwd+bwd / optimizer: its totals over all steps, warm-up included, per step)")
        print("  loss vs torchtune rep 1 (relative):")
        for k, v in agree.items():
            gn = v["grad_norm_max_rel"]
            print(f"    {k:18s} first step {v['first_rel']:.2e}  max over {v['steps']} steps {v['max_rel']:.2e}"
                  f"  (grad norm max {gn if gn is not None else float('nan'):.2e})"
                  f"{'' if v['same_tokens'] else '  COUNTED TOKENS DIFFER'}"
                  f"{'' if v['same_step_count'] else '  STEP COUNTS DIFFER'}")
        print("  step  " + "  ".join(f"{s:>18s}" for s in sides))
        for k in range(len(ref)):
            print(f"  {k + 1:4d}  " + "  ".join(f"{runs[s][0]['steps'][k]['loss']:18.9f}"
                                                if k < len(runs[s][0]["steps"]) else f"{'-':>18s}" for s in sides))
        worst_first = max(v["first_rel"] for k, v in agree.items() if not k.startswith("torchtune"))
        if worst_first > 1e-5:
            print(f"  WARNING: first-step losses differ by {worst_first:.2e} relative: the two sides do not "
                  "compute the same model or data")
    report["machine"]["loadavg_end"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
