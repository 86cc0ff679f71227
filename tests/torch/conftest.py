"""pytest setup for the tests that run real torch beside optc.

The C suite never needs torch; these tests do, and run in the .venv that
./setup.sh test makes. They find the optc binary in $OPTC_BUILD (default
build/ at the repository root).
"""
import os
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


@pytest.fixture(scope="session")
def torch_cpu():
    """The torch_cpu recipe key that matches the torch running here."""
    return "avx512" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "avx2"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r
