"""Quantized states on FSDP2 meshes (issue 37): optc's AdamW8bit and
AdamW4bit give the same params, codes and scales on 1, 2 and 3 gloo ranks,
because their blocks are the whole tensor's, and a block that two ranks'
shards split is computed whole on both; torchao's AdamW8bit, beside them,
quantizes each rank's shard on its own, so its states depend on the mesh.

One torchrun of dist/lowbit_worker.py (3 ranks, CPU) runs every case; its
docstring says what each does.
"""
import json
import os

import pytest
from conftest import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
MESH_CASES = ["mesh_8bit_bf16", "mesh_4bit_fp32_amsgrad", "mesh_8bit_fp32_clip"]


@pytest.fixture(scope="module")
def lowbit_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lowbit") / "results.json")
    torchrun(os.path.join(HERE, "dist", "lowbit_worker.py"), [out], nproc=3)
    with open(out) as f:
        return json.load(f)


def _case(results, name):
    got = results["cases"].get(name)
    assert got is not None, f"the worker has no result for {name}"
    assert not got["errors"], "\n".join(got["errors"])
    return got["info"]


@pytest.mark.parametrize("name", MESH_CASES)
def test_same_bits_on_1_2_3_ranks(lowbit_results, name):
    info = _case(lowbit_results, name)
    # the case means something only if some params are quantized and some
    # shards end inside a block on each mesh
    assert any(info["quantized"]), info
    for n in (2, 3):
        assert any(q and s for q, s in zip(info["quantized"], info[f"split_{n}"])), \
            f"no quantized param's shard ends inside a block on {n} ranks: {info}"


def test_torchao_bits_on_the_same_mesh(lowbit_results):
    """Where each rank's shard is whole blocks, optc's states and params are
    torchao's on 1 and 2 ranks (local codes and scales)."""
    _case(lowbit_results, "torchao_same_mesh")


def test_torchao_depends_on_the_mesh(lowbit_results):
    """torchao quantizes a 64 x 96 param's exp_avg on 1 rank and keeps it
    plain on 2 (3,072 elements a shard, below its 4,096 threshold): the
    params after the same steps differ. optc's (above) do not."""
    info = _case(lowbit_results, "torchao_mesh")
    assert info["torchao_state_1_rank"] == "OptimState8bit", info
    assert info["torchao_state_2_ranks"] != "OptimState8bit", info
    assert info["torchao_params_same"] is False, info
