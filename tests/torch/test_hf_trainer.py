"""optc.torch in transformers' Trainer on accelerate's FSDP2, through
optc.torch.integrations.optc_optimizer_cls_and_kwargs, against torch's
optimizer in the same Trainer: 2 gloo ranks under torchrun, CPU.

Every case of dist/hf_cases.py (its docstring lists them) runs in one
torchrun of dist/hf_worker.py (whose docstring says how FSDP is forced on
the CPU, where accelerate enables it only on accelerators); each case is
one test here, failing with every rank's mismatches. The helper's mapping
of TrainingArguments to class and kwargs is checked in this process.
"""
import json
import os
import sys

import pytest

from conftest import torchrun

pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("accelerate", reason="accelerate is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "dist"))
import hf_cases  # noqa: E402

CASES = hf_cases.cases()


@pytest.fixture(scope="module")
def hf_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf") / "results.json")
    torchrun(os.path.join(HERE, "dist", "hf_worker.py"), [out])
    with open(out) as f:
        return json.load(f)


def _param(case):
    marks = [pytest.mark.torch_sqrt] if hf_cases.needs_torch_sqrt(case) else []
    return pytest.param(case, id=case["name"], marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_hf_trainer_fsdp2(case, hf_results):
    assert hf_results["world"] == 2
    got = hf_results["cases"].get(case["name"])
    assert got is not None, f"the worker has no result for {case['name']}"
    assert not got["errors"], "\n".join(got["errors"][:40])
    info = got["info"]["rank0"]
    want = {"adamw_torch": "AdamW", "adamw_torch_fused": "AdamW", "sgd": "SGD"}[case["optim"]]
    assert info["optimizer"] == f"optc.torch._optimizers.{want}"
    assert info["built_on"] == ["Parameter"], f"the optimizer was built on {info['built_on']}, not plain params"
    assert info["dtypes"] == ["torch.bfloat16" if case["dtype"] == "bf16" else "torch.float32"]
    assert ("fused" in info["kwargs"]) == (case["optim"] == "adamw_torch_fused")
    assert ("CPUOffloadPolicy" in info["offload"]) == case["offload"], info["offload"]
    if case["dtype"] == "mp":
        assert "param_dtype=torch.bfloat16" in info["mp"], info["mp"]
    assert len(set(info["losses"])) > 1 and info["lrs"][0] < max(info["lrs"]), "no training, or no warmup"
    rows = {r for i in got["info"].values() for r in map(tuple, i["embed_rows"])}
    assert len(rows) == 2, f"the embedding's shards are even ({rows}): the odd vocab was meant to split them"


def test_helper_mirrors_hf_choice(tmp_path):
    """For each args.optim HF builds from torch.optim: optc.torch's class of
    the same name, with exactly the kwargs HF's own choice gets; a named
    optimizer; overrides; a refused args.optim."""
    import torch
    from transformers import Trainer, TrainingArguments

    import optc.torch as otorch
    from optc.torch.integrations import optc_optimizer_cls_and_kwargs

    def args(**kw):
        return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=2e-3,
                                 adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-7, weight_decay=0.1, **kw)

    for optim, optim_args, cls in (("adamw_torch", None, otorch.AdamW), ("adamw_torch_fused", None, otorch.AdamW),
                                   ("sgd", "momentum=0.9,nesterov=true", otorch.SGD),
                                   ("adagrad", "lr_decay=0.01", otorch.Adagrad),
                                   ("rmsprop", "alpha=0.9,centered=true", otorch.RMSprop)):
        a = args(optim=optim, optim_args=optim_args)
        got_cls, got_kw = optc_optimizer_cls_and_kwargs(a)
        hf_cls, hf_kw = Trainer.get_optimizer_cls_and_kwargs(a)
        assert got_cls is cls and issubclass(cls, hf_cls) and got_kw == hf_kw, (optim, got_kw, hf_kw)
    a = args(optim="adamw_torch_fused")
    assert optc_optimizer_cls_and_kwargs(a)[1] == dict(lr=2e-3, betas=(0.8, 0.95), eps=1e-7, fused=True)
    assert optc_optimizer_cls_and_kwargs(a, name="Adam") == (otorch.Adam, dict(lr=2e-3, betas=(0.8, 0.95),
                                                                                   eps=1e-7, fused=True))
    assert optc_optimizer_cls_and_kwargs(a, name="Lion") == (otorch.Lion, dict(lr=2e-3))
    assert optc_optimizer_cls_and_kwargs(args(optim="adamw_torch"), name="SGD", momentum=0.9) == \
        (otorch.SGD, dict(lr=2e-3, momentum=0.9))
    assert optc_optimizer_cls_and_kwargs(a, fused=False, nonfinite="skip")[1]["fused"] is False
    with pytest.raises(ValueError, match="adafactor"):
        optc_optimizer_cls_and_kwargs(args(optim="adafactor"))
    with pytest.raises(ValueError, match="no optc.torch optimizer"):
        optc_optimizer_cls_and_kwargs(a, name="Adafactor")
    cls, kw = optc_optimizer_cls_and_kwargs(a)
    model = torch.nn.Linear(3, 2)
    opt = cls(model.parameters(), **kw)
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["betas"] == (0.8, 0.95)
