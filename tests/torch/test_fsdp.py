"""optc.torch on FSDP2 (fully_shard), against torch.optim on the same
sharded model: 2 gloo ranks under torchrun, CPU, with and without
CPUOffloadPolicy(pin_memory=False).

Every case of dist/fsdp_cases.py (its docstring lists them) runs in one
torchrun of dist/fsdp_worker.py, which trains the model twice from one init
on the same per-rank data, once with each optimizer, and compares each
rank's losses, local param shards and local states bit for bit; each case
is one test here, failing with every rank's mismatches.

The in_backward=True cases (issue 34) step each param as its grad lands in
the backward and are compared with torch.optim stepping after it, as above;
each also checks where its steps ran (in the backward, speculated and kept
or redone, or after it: the optimizer's in_backward_stats), so that a case
cannot pass by quietly stepping everything after the backward.

What torch cannot run itself is compared with torch's kernel on the
shards: torch 2.15's fused SGD and Adagrad have no DTensor sharding
strategy (NotImplementedError), so their reference is the same fused
kernel over each rank's local tensors.
"""
import json
import os
import sys

import pytest

from conftest import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "dist"))
import fsdp_cases  # noqa: E402

CASES = fsdp_cases.cases()


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fsdp") / "results.json")
    torchrun(os.path.join(HERE, "dist", "fsdp_worker.py"), [out])
    with open(out) as f:
        return json.load(f)


def _param(case):
    marks = [pytest.mark.torch_sqrt] if fsdp_cases.needs_torch_sqrt(case) else []
    return pytest.param(case, id=case["name"], marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_fsdp2(case, fsdp_results):
    assert fsdp_results["world"] == 2
    got = fsdp_results["cases"].get(case["name"])
    assert got is not None, f"the worker has no result for {case['name']}"
    assert not got["errors"], "\n".join(got["errors"])
    if case["model"] == "empty":
        assert got["info"]["rank1"].get("empty_shards", 1) > 0 or case["mode"] != "step", \
            "the 'empty' model gave rank 1 no empty shard"
    info = got["info"]["rank0"]
    if case["mode"] == "fused" or (case["mode"] == "clip" and case["frac"] < 1):
        assert info["clipped_steps"] > 0, "max_norm never clipped: the case tests nothing"
    if case["mode"] == "clip" and case["frac"] > 1:
        assert info["clipped_steps"] == 0, "max_norm clipped where the case means it not to"
    if case.get("inbwd") is not None:
        _check_in_backward(case, info)


def _check_in_backward(case, info):
    """That the case stepped where it claims to: in the backward, by
    speculation kept or redone, or after it."""
    spec = case["inbwd"].get("speculate", False)
    waits = case["inbwd"].get("nonfinite", "propagate") != "propagate" or case["frac"] is not None
    if not waits:
        assert info["stepped_in_backward"] > 0 and info["stepped_after"] == 0, info
    elif not spec:
        assert info["stepped_in_backward"] == 0 and info["measured_in_backward"] > 0, info
    else:
        assert info["speculated"] > 0, info
        if case["mode"] == "clip" and case["frac"] < 1 or case["mode"] == "accum":
            assert info["redone"] > 0, f"no speculation was redone: {info}"
        if case["mode"] == "clip" and case["frac"] > 1:
            assert info["redone"] == 0 and info["stepped_after"] == 0, info
