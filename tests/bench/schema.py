#!/usr/bin/env python3
"""The JSON that `optc bench optimizer`, `optc bench step` and `optc plan`
write: every field there, every number positive and finite. Small sizes:
a smoke run for CI, not a measurement.

usage: schema.py OPTC ROOT WORKDIR
"""
import json
import math
import os
import subprocess
import sys

optc, root, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
failures = []


def need(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def positive(x, what):
    need(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0,
         "%s = %r is not a positive finite number" % (what, x))


def run(args):
    p = subprocess.run([optc] + args, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        need(False, "optc %s failed with %d" % (" ".join(args), p.returncode))
    return p


# ---- optc bench optimizer ------------------------------------------------------------
out = os.path.join(work, "bench.json")
run(["bench", "optimizer", "--params", "300k", "--reps", "2", "--clip", "--json", out])
b = json.load(open(out))
for k in ("cpu", "cores", "threads", "date"):
    need(k in b["machine"], "machine.%s missing" % k)
positive(b["machine"]["cores"], "machine.cores")
for k in ("copy_gbps", "triad_gbps", "update_gbps"):
    positive(b["ceiling"][k], "ceiling." + k)
rounds = b["ceiling"]["update_in_rounds_gbps"]
need(0 < rounds["min"] <= rounds["median"] <= rounds["max"], "ceiling.update_in_rounds_gbps: min <= median <= max")
strategies = {r["strategy"] for r in b["results"]}
need(strategies == {"eager", "foreach", "fused-reference", "compiled"}, "strategies: %s" % sorted(strategies))
for r in b["results"]:
    need(r["backend"] in ("cpu", "cuda"), "backend %r" % r.get("backend"))
    need(r["clip"] is True, "clip flag")
    need(isinstance(r["layout"], str), "layout")
    for k in ("ms_median", "gbps", "pct_of_triad", "pct_of_update", "speedup_vs_eager", "params_per_s"):
        positive(r[k], "%s.%s" % (r["strategy"], k))
    need(r["ms_min"] <= r["ms_median"] <= r["ms_max"], "%s: min <= median <= max" % r["strategy"])
eager = [r for r in b["results"] if r["strategy"] == "eager"][0]
need(abs(eager["speedup_vs_eager"] - 1) < 1e-12, "eager's speedup over itself is 1")
positive(b["compile_ms"]["cold"], "compile_ms.cold")
positive(b["compile_ms"]["cached"], "compile_ms.cached")
need(b["workload"]["bytes_per_element"] == 32, "AdamW fp32 + clip moves 32 bytes/element")
print("bench optimizer: %d results, compiled %.1f GB/s" %
      (len(b["results"]), [r for r in b["results"] if r["strategy"] == "compiled"][0]["gbps"]))

# every layout runs
for layout in ("bf16", "bf16-fp32states"):
    out = os.path.join(work, "bench_%s.json" % layout)
    run(["bench", "optimizer", "--params", "100k", "--reps", "1", "--layout", layout, "--json", out,
         "--strategies", "eager,compiled"])
    b = json.load(open(out))
    need(b["workload"]["bytes_per_element"] == (14 if layout == "bf16" else 22), layout + " bytes/element")

# ---- optc plan ----------------------------------------------------------------------------
p = run(["plan", os.path.join(root, "recipes/configs/llama4/scout_17B_16E_full.yaml"), "--nproc", "8", "--json",
         "--bandwidth", "50", "--net-bandwidth", "25", "--gflops", "1000"])
plan = json.loads(p.stdout)
need(plan["parameters"] == 107769861120, "Scout has 107,769,861,120 parameters, got %r" % plan["parameters"])
need(plan["tensors"]["torchtune"] == 627, "627 tensors in torchtune's layout")
need(plan["tensors"]["hf"] == 579, "579 tensors in HF's layout")
need(plan["nproc"] == 8, "nproc")
for k in ("params", "grads", "optimizer_states", "total"):
    positive(plan["memory_per_rank_bytes"][k], "memory_per_rank_bytes." + k)
m = plan["memory_per_rank_bytes"]
need(m["params"] + m["grads"] + m["optimizer_states"] == m["total"], "memory adds up")
# bf16 params, grads and two bf16 states: 2+2+4 bytes per element, over 1/8 of the params padded to blocks
per_rank = math.ceil(107769861120 / 8 / 4096) * 4096
need(m["params"] == per_rank * 2 and m["optimizer_states"] == per_rank * 4, "per-rank bytes from the dtypes")
# what optc run holds per rank: its shards of params, grads and states (fsdp.c: each unit's parts padded to
# blocks, so a little over 1/8 of each), and the spans of the units in use: bf16 params gathered and widened to
# f32, f32 grads and their bf16 rounding, one unit at a time (reshard after forward), the largest a decoder layer
rm = plan["run_memory_per_rank_bytes"]
need(rm["params"] == rm["grads"] and rm["optimizer_states"] == 2 * rm["params"], "bf16 shards: params = grads = a state")
need(per_rank * 2 <= rm["params"] < per_rank * 2 * 1.001, "a rank's shard is 1/8 of the params, padded: %r" % rm["params"])
need(rm["spans_f32"] == 2 and rm["spans_16bit"] == 1, "spans: f32 params and grads; a bf16 gather or rounding")
layer = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 16 * 3 * 5120 * 8192 + 3 * 5120 * 8192 + 16 * 5120 + 2 * 5120
need(layer <= rm["span_elements"] < layer * 1.001, "a span is a decoder layer: %r" % rm["span_elements"])
need(rm["unit_spans"] == rm["span_elements"] * (2 * 4 + 1 * 2), "the spans' bytes")
positive(rm["activations"], "run_memory_per_rank_bytes.activations")
need(abs(rm["params"] + rm["grads"] + rm["optimizer_states"] + rm["unit_spans"] + rm["activations"] + rm["process"] -
         rm["total"]) < 1, "optc run's memory adds up")
# FSDP's units and the step model: 48 layers, the embeddings, the root (norm + output)
fs = plan["fsdp"]
units = fs["units"]
need(len(units) == 50 and sum(u["params"] for u in units) == 107769861120, "50 units holding every parameter")
active = sum(u["active_params"] for u in units) + units[0]["params"]  # the embeddings: a lookup, counted by Meta
need(17.0e9 < active < 17.3e9, "Scout's 17B active parameters (Meta's count, embeddings included), got %.4g" % active)
layers = [u for u in units if u["name"].startswith("layers.")]
need(len(layers) == 48 and all(u["active_params"] < u["params"] for u in layers), "top-1 of 16 experts is active")
ps = fs["per_step_per_rank"]
need(fs["reshard_after_forward"] and abs(ps["all_gather_bytes"] - 2 * 107769861120 * 2 * 7 / 8) < 1e3,
     "all-gathers: the params twice (forward, backward), 7/8 of them received per rank")
need(abs(ps["reduce_scatter_bytes"] - 107769861120 * 2 * 7 / 8) < 1e3, "reduce-scatter: the bf16 grads once")
need(ps["optimizer_bytes"] == sum(math.ceil(u["params"] / 8) for u in units) * 14, "optimizer: 14 B per shard element")
ms = fs["model_s"]
need(fs["rates"]["net_gbps"] == 25 and fs["rates"]["gflops"] == 1000, "the given rates")
need(max(ms["forward_compute"] + ms["backward_compute"], ms["optimizer"]) <= ms["step"] <= ms["serial"],
     "the overlapped step lies between the busiest resource and the serial sum")
need(0 <= ms["optimizer_hidden"] <= ms["optimizer"] + 1e-9, "the hidden optimizer time is part of it")
need(abs(ms["backward_compute"] - 2 * ms["forward_compute"]) < 1e-9, "backward = 2 x forward FLOPs")
need(plan["traffic"]["bytes_per_element"] == 14 and plan["traffic"]["phases"] == 1, "Scout's step: 14 B/elem, 1 phase")
need(plan["optimizer_step"]["bytes_per_rank"] == per_rank * 14, "bytes per rank per step")
positive(plan["optimizer_step"]["predicted_ms"], "predicted_ms")
need(abs(plan["optimizer_step"]["predicted_ms"] - per_rank * 14 / 50e9 * 1e3) < 1e-6, "time = bytes / bandwidth")
if plan["compile_ms"] is not None:
    positive(plan["compile_ms"], "compile_ms")
print("plan: Scout, %d tensors, %d parameters, %.1f ms per step at 50 GB/s" %
      (plan["tensors"]["torchtune"], plan["parameters"], plan["optimizer_step"]["predicted_ms"]))

# ---- optc bench step -------------------------------------------------------------------------
out = os.path.join(work, "step.json")
run(["bench", "step", "--config", os.path.join(root, "recipes/configs/llama4/scout_tiny_full.yaml"), "--steps", "3",
     "--reps", "1", "--json", out])
s = json.load(open(out))
need([r["optimizer"] for r in s["results"]] == ["compiled", "eager"], "bench step results")
for r in s["results"]:
    for k in ("tokens_per_second_per_rank", "first_loss", "last_loss", "forward_backward_ms", "optimizer_ms"):
        positive(r[k], "%s.%s" % (r["optimizer"], k))
need(s["results"][0]["last_loss"] == s["results"][1]["last_loss"], "compiled and eager losses identical")
positive(s["speedup"], "speedup")

print("schema: %d failures" % len(failures))
sys.exit(1 if failures else 0)
