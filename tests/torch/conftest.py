"""pytest setup for the tests that run real torch beside optc.

The C suite never needs torch; these tests do, and run in the .venv that
./setup.sh test makes. They find the optc binary in $OPTC_BUILD (default
build/ at the repository root).
"""
import os
import sys
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("OPTC_BUILD", os.path.join(ROOT, "build"))


@pytest.fixture(scope="session")
def optc_bin():
    path = os.path.join(BUILD, "optc")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not built (run ./setup.sh first, or set OPTC_BUILD)")
    return path


SQRT_OPTIMIZERS = {"AdamW", "Adam", "RMSprop", "Adagrad"}


def probe_torch_cpu():
    """optc.torch.torch_cpu(): which f32 sqrt this torch computes (None: one
    optc does not model)."""
    from optc.torch import torch_cpu as probe
    return probe()


def pytest_configure(config):
    config.addinivalue_line("markers", "torch_sqrt: compares an f32 for-loop step that takes a square root "
                            "with torch's bits; skipped where torch's sqrt is one optc does not model")


def pytest_runtest_setup(item):
    if item.get_closest_marker("torch_sqrt") and probe_torch_cpu() is None:
        pytest.skip("torch's f32 sqrt on this CPU is none of the MKL kernels optc models (optc.torch.torch_cpu): "
                    "optc does not model it")


def sqrt_marks(name, dtype, fused):
    """The torch_sqrt mark for a case whose f32 for-loop step takes a square
    root (optc's mkl_sqrt: states in f32, not fused)."""
    return [pytest.mark.torch_sqrt] if name in SQRT_OPTIMIZERS and dtype == "fp32" and not fused else []


@pytest.fixture(scope="session")
def torch_cpu():
    """The torch_cpu recipe key that matches the torch running here (its sqrt,
    probed); IEEE's where torch's is not modelled (those cases are skipped)."""
    return probe_torch_cpu() or "avx2"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r


def optc_path():
    """The folder the optc package the tests import lives in (site-packages, or
    the source tree's python/), for the processes they start."""
    import optc
    return os.path.dirname(os.path.dirname(os.path.abspath(optc.__file__)))


def torchrun(script, args, nproc=2, timeout=900, env=None):
    """Runs `script args` under torchrun (--standalone, nproc ranks) with this
    python, the optc these tests import on its path, and a torch thread per
    rank; returns the CompletedProcess, or fails the test with the output's
    end when it exits non-zero or runs past timeout."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([optc_path()] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           script] + list(args)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    except subprocess.TimeoutExpired as ex:
        out = (ex.stdout or b"")[-4000:] if isinstance(ex.stdout, bytes) else (ex.stdout or "")[-4000:]
        pytest.fail(f"{' '.join(cmd)}: still running after {timeout} s\n{out}")
    if r.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {r.returncode}:\n{(r.stdout + r.stderr)[-6000:]}")
    return r
