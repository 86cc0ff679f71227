"""optc.torch.integrations.OptcOptimizersContainer in torchtitan 0.3's own
Trainer, against torchtitan's OptimizersContainer (torch.optim), on FSDP2:
2 gloo ranks under torchrun, CPU.

Every case of dist/titan_cases.py (its docstring lists them) runs in one
torchrun of dist/titan_worker.py (whose docstring says what it takes to run
torchtitan's Trainer on the CPU); each case is one test here, failing with
every rank's mismatches. The checks without torchrun (what importing the
module needs, the names and implementations the container builds) run in
this process.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import optc_path, torchrun

pytest.importorskip("torchtitan", reason="torchtitan is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "dist"))
import titan_cases  # noqa: E402

CASES = titan_cases.cases()


@pytest.fixture(scope="module")
def titan_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("titan") / "results.json")
    torchrun(os.path.join(HERE, "dist", "titan_worker.py"), [out])
    with open(out) as f:
        return json.load(f)


def _param(case):
    marks = [pytest.mark.torch_sqrt] if titan_cases.needs_torch_sqrt(case) else []
    return pytest.param(case, id=case["name"], marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_torchtitan_trainer(case, titan_results):
    assert titan_results["world"] == 2
    got = titan_results["cases"].get(case["name"])
    assert got is not None, f"the worker has no result for {case['name']}"
    assert not got["errors"], "\n".join(got["errors"][:40])
    info = got["info"]["rank0"]
    if case["mode"] in ("train", "ckpt"):
        want = set(titan_cases.GROUPS[case["groups"]])
        assert {o.rsplit(".", 1)[1] for o in info["optimizers"]} == want
        assert all(o.startswith("optc.torch.") for o in info["optimizers"]), info["optimizers"]
        assert info["param_dtypes"] == ["torch.bfloat16" if case["dtype"] == "bf16" else "torch.float32"]
        assert len(set(info["losses"])) > 1, "the loss never moved: the case tests nothing"


def test_import_needs_neither_trainer():
    """optc.torch.integrations imports where torchtitan and transformers do
    not; OptcOptimizersContainer then says what it needs."""
    code = ("import sys\n"
            "sys.modules['torchtitan'] = None\n"
            "sys.modules['transformers'] = None\n"
            "import optc.torch.integrations as i\n"
            "assert sorted(i.OPTIMIZERS) == ['Adagrad', 'Adam', 'AdamW', 'Lion', 'RMSprop', 'SGD']\n"
            "try:\n"
            "    i.OptcOptimizersContainer\n"
            "except ImportError as e:\n"
            "    assert 'needs torchtitan' in str(e), e\n"
            "else:\n"
            "    raise AssertionError('no ImportError')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [optc_path(), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


def test_container_builds_optc_classes():
    """Each name and implementation, on a plain model (one process): the
    optimizers and their groups' fused/foreach keys, as the stock container
    writes them; the Config of an existing config; refused what optc does
    not model."""
    import torch
    from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig, default_adamw

    import optc.torch as otorch
    from optc.torch.integrations import OptcOptimizersContainer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    groups = [ParamGroupConfig(pattern=r"^0\.", optimizer_name="SGD", optimizer_kwargs=dict(lr=0.1, momentum=0.9)),
              ParamGroupConfig(pattern=r"^1\.", optimizer_name="RMSprop", optimizer_kwargs=dict(lr=0.01)),
              ParamGroupConfig(pattern=r"weight", optimizer_name="Lion", optimizer_kwargs=dict(lr=1e-4)),
              ParamGroupConfig(pattern=r".*", optimizer_name="Adagrad", optimizer_kwargs=dict(lr=0.01))]
    for impl, fused, foreach in (("for-loop", False, False), ("foreach", False, True), ("fused", True, False)):
        c = OptcOptimizersContainer.Config(param_groups=groups, implementation=impl).build(model_parts=[model])
        assert isinstance(c, OptimizersContainer)
        assert [type(o) for o in c] == [otorch.SGD, otorch.RMSprop, otorch.Lion, otorch.Adagrad]
        for o in c:
            assert all(g["fused"] is fused and g["foreach"] is foreach for g in o.param_groups)
    stock = default_adamw(lr=3e-4)
    cfg = OptcOptimizersContainer.Config.of(stock)
    assert type(cfg) is OptcOptimizersContainer.Config and cfg.param_groups == stock.param_groups
    assert cfg.implementation == stock.implementation
    c = cfg.build(model_parts=[model])
    assert [type(o) for o in c] == [otorch.AdamW] and c.optimizers[0].param_groups[0]["fused"] is True
    sd = c.state_dict()  # the warm-up step, on plain params
    assert "state.0.weight.exp_avg" in sd and "param_groups.2.bias.lr" in sd
    with pytest.raises(ValueError, match="fused_opt_states_bf16"):
        OptcOptimizersContainer.Config(param_groups=stock.param_groups,
                                       implementation="fused_opt_states_bf16").build(model_parts=[model])


def test_config_named_on_the_command_line(tmp_path, monkeypatch):
    """The README's way: a config_registry function that swaps optc's
    container into torchtitan's config; torchtitan's ConfigManager (its
    CLI: --module, --config, overrides) keeps optc's Config."""
    (tmp_path / "optc_titan_configs.py").write_text(
        "from torchtitan.models.llama3.config_registry import llama3_debugmodel\n"
        "from optc.torch.integrations import OptcOptimizersContainer\n"
        "\n"
        "def llama3_debugmodel_optc():\n"
        "    config = llama3_debugmodel()\n"
        "    config.optimizer = OptcOptimizersContainer.Config.of(config.optimizer)\n"
        "    return config\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchtitan.config import ConfigManager

    from optc.torch.integrations import OptcOptimizersContainer
    cfg = ConfigManager().parse_args(["--module", "optc_titan_configs", "--config", "llama3_debugmodel_optc",
                                      "--optimizer.implementation", "for-loop"])
    assert type(cfg.optimizer) is OptcOptimizersContainer.Config
    assert cfg.optimizer.implementation == "for-loop"
    assert [g.optimizer_name for g in cfg.optimizer.param_groups] == ["AdamW"]
