"""python -m optc.bench: its competitors run in turns (in_turns), and a
small run prints every case and writes JSON whose ratios are the medians
of the rounds' own ratios."""
import json
import os
import statistics
import sys

from conftest import ROOT

try:
    import optc.bench as bench
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    for m in [m for m in sys.modules if m == "optc" or m.startswith("optc.")]:
        del sys.modules[m]
    import optc.bench as bench


def test_in_turns_rotates_and_pairs():
    calls = []
    ceil = iter(range(100, 200))

    def step(name):
        return lambda: calls.append(name)

    steps = {k: step(k) for k in "abc"}
    befores = []
    times, ceils = bench.in_turns(steps, lambda: next(ceil), rounds=4, warmup=2,
                                  before=lambda: befores.append(len(calls)))
    # every round runs each step once, in an order rotated by one a round
    rounds = [calls[3 * r:3 * r + 3] for r in range(6)]
    assert rounds == [list("abc"), list("bca"), list("cab"), list("abc"), list("bca"), list("cab")]
    assert befores == list(range(18))  # before() ahead of every step
    # the warm-up rounds are left out; round r's ceiling is the r-th kept
    assert ceils == [102, 103, 104, 105]
    assert all(len(v) == 4 and all(t >= 0 for t in v) for v in times.values())


def test_small_run_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = bench.main(["--gib", "0.01", "--dtypes", "bf16", "--competitors", "fused,optc,optc-fused",
                     "--reps", "3", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "the competitors in turns, 3 rounds" in text
    doc = json.loads(out.read_text())
    assert [c["case"] for c in doc["cases"]] == ["plain", "scale", "scale+clip"]
    for case in doc["cases"]:
        assert case["ceiling_gbs_min"] <= case["ceiling_gbs"] <= case["ceiling_gbs_max"]
        res = case["results"]
        assert set(res) == {"fused", "optc", "optc-fused"}
        gb = case["bytes_per_element"] * case["elements"] / 1e9
        for r in res.values():
            ms = r["rounds_ms"]
            assert len(ms) == 3 and r["ms"] == statistics.median(ms) and (r["ms_min"], r["ms_max"]) == (min(ms), max(ms))
            # % ceiling within each round, then the median
            pct = [100 * gb / (t * 1e-3) / g for t, g in zip(ms, case["ceiling_rounds_gbs"])]
            assert r["pct_ceiling"] == statistics.median(pct)
        # a speed-up is the median of the rounds' ratios, not a ratio of medians
        for comp in ("fused", "optc-fused"):
            ratios = [t / u for t, u in zip(res[comp]["rounds_ms"], res["optc"]["rounds_ms"])]
            assert res[comp]["optc_speedup"] == statistics.median(ratios)
        assert res["optc"]["optc_speedup"] is None


def test_deepspeed_competitor(tmp_path, capsys):
    """DeepSpeedCPUAdam (PyPI deepspeed; its cpu_adam op builds at first use)
    runs beside optc, and the bits it computes differently are counted."""
    out = tmp_path / "d.json"
    rc = bench.main(["--gib", "0.005", "--dtypes", "fp32,bf16", "--competitors", "deepspeed,optc,optc-f32states",
                     "--reps", "2", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "DeepSpeedCPUAdam" in text and "optc fp32 states" in text
    doc = json.loads(out.read_text())
    for case in doc["cases"]:
        assert case["results"]["deepspeed"]["optc_speedup"] > 0
        assert ("optc-f32states" in case["results"]) == (case["dtype"] == "bf16")
    for dname in ("fp32", "bf16"):
        bits = doc["deepspeed_bits"][dname]
        assert set(bits) == {"deepspeed vs torch", "optc vs torch"}
        # DeepSpeed's own formula: some elements differ from torch.optim's in either dtype
        assert bits["deepspeed vs torch"][0] > 0


def test_in_backward_bench(tmp_path, capsys):
    """python -m optc.bench_inbwd: both orders of a round, the split and
    shared-core runs, and where the in-backward steps ran."""
    import optc.bench_inbwd as bi
    out = tmp_path / "i.json"
    rc = bi.main(["--width", "128", "--depth", "3", "--vocab", "0", "--batch", "16", "--rounds", "2", "--warmup", "1",
                  "--split", "1+1,shared", "--clip", "after,speculate", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [r["split"] for r in doc["runs"]] == ["1+1", "shared"]
    for r in doc["runs"]:
        modes = r["modes"]
        assert set(modes) == {"after", "in-bwd", "after+clip", "in-bwd+clip(after)", "in-bwd+clip(speculate)"}
        assert modes["after"]["vs_after"] == 1.0
        assert modes["in-bwd"]["in_backward_stats"]["stepped_in_backward"] == 6  # 3 weights, 3 biases
        assert modes["in-bwd+clip(after)"]["in_backward_stats"]["stepped_after"] == 6
        assert modes["in-bwd+clip(speculate)"]["in_backward_stats"]["speculated"] > 0


def test_gpu_offload_script_on_the_cpu(tmp_path):
    """bench/gpu_offload.py, the device check of the offloaded Scout, runs
    its code path on the CPU (a tiny Llama 4, FSDP2 with CPU offload on one
    gloo rank): every variant trains, and optc's losses are torch's."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_offload", os.path.join(ROOT, "bench", "gpu_offload.py"))
    go = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(go)
    out = tmp_path / "go.json"
    rc = go.main(["--device", "cpu", "--tiny", "--layers", "2", "--seq", "32", "--steps", "2",
                  "--variants", "torch,optc,optc-inbwd", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    got = {r["variant"]: r for r in doc["results"]}
    assert set(got) == {"torch", "optc", "optc-inbwd"}
    assert got["optc"]["losses_equal_torch"] and got["optc-inbwd"]["losses_equal_torch"]
    assert len(set(s["loss"] for s in got["torch"]["steps"])) == 2, "the model did not train"


def test_lowbit_sizes_quantize_most_bytes():
    """The low-bit mix: tensors torchao quantizes (>= 4096 elements, a
    multiple of its block) hold nearly every element; the plain mix's hold
    none."""
    for gib in (0.25, 1.0):
        sizes = bench.lowbit_sizes(gib)
        plain = bench.scaled_mix(int(gib * (1 << 30)) // 8 + 1)
        assert len(sizes) == len(plain) == 627
        assert not [k for k in plain if k >= 4096 and k % 256 == 0]
        quantized = sum(k for k in sizes if k >= 4096 and k % 256 == 0)
        assert quantized > 0.99 * sum(sizes)
        assert all(abs(k - k0) <= 128 for k, k0 in zip(sizes, plain))


def test_lowbit_run(tmp_path, capsys):
    """--lowbit: a row per competitor, with state bytes from the states
    themselves (8-bit below bf16's, 4-bit below 8-bit's; optc's 8-bit
    states are torchao's but for torchao's code book of 256 f32 a state),
    first steps and peaks from fresh processes."""
    out = tmp_path / "l.json"
    rc = bench.main(["--gib", "0.005", "--dtypes", "", "--lowbit", "optc-bf16,optc-8bit,optc-4bit,torchao-8bit",
                     "--reps", "2", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "state B/param" in text and "caches cold" in text
    doc = json.loads(out.read_text())
    lb = doc["lowbit"]
    res = lb["results"]
    assert list(res) == ["fused-bf16", "optc-bf16", "optc-8bit", "optc-4bit", "torchao-8bit"]
    for comp, r in res.items():
        assert r["label"] in text
        ms = r["rounds_ms"]
        assert len(ms) == 2 and r["ms"] == statistics.median(ms)
        assert r["first_step_ms"] > 0 and r["first_step_peak_bytes"] >= 0 and r["step_peak_bytes"] >= 0
        assert r["state_bytes"] == r["state_bytes_here"]  # the fresh process's states are this one's
        assert r["state_bytes_per_param"] == r["state_bytes"] / lb["elements"]
    assert res["fused-bf16"]["x_fused"] == 1.0
    bpp = {k: r["state_bytes_per_param"] for k, r in res.items()}
    assert bpp["optc-bf16"] == bpp["fused-bf16"]
    assert bpp["optc-4bit"] < bpp["optc-8bit"] < bpp["fused-bf16"]
    assert bpp["torchao-8bit"] < bpp["fused-bf16"]
    quantized = [k for k in bench.lowbit_sizes(0.005) if k >= 4096 and k % 256 == 0]
    assert lb["quantizable_elements"] == sum(quantized)
    assert res["torchao-8bit"]["state_bytes"] == res["optc-8bit"]["state_bytes"] + 2 * 1024 * len(quantized)
