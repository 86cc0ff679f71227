"""optc.torch on FSDP2 (fully_shard), against torch.optim on the same
sharded model: 2 gloo ranks under torchrun, CPU, with and without
CPUOffloadPolicy(pin_memory=False).

Every case of dist/fsdp_cases.py (its docstring lists them) runs in one
torchrun of dist/fsdp_worker.py, which trains the model twice from one init
on the same per-rank data, once with each optimizer, and compares each
rank's losses, local param shards and local states bit for bit; each case
is one test here, failing with every rank's mismatches.

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
    if case["mode"] == "fused":
        assert got["info"]["rank0"]["clipped_steps"] > 0, "max_norm never clipped: the case tests nothing"
