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
      llvm-19-dev llvm-19-tools libyaml-dev libjansson-dev
      libopenmpi-dev openmpi-bin libopenblas-dev gnuplot-nox libpcre2-dev libzstd1
      clang-19 libclang-rt-19-dev strace)  # clang: the fuzz targets; strace: tests/train/kill_saves.sh

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
# that run torch beside optc need. The C suite never needs it.
VENV_PKGS=("torch==2.15.*" numpy safetensors pytest meson-python meson ninja)
venv() {
  if ! { [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, numpy, safetensors, pytest, mesonpy' 2>/dev/null; }; then
    echo "setup.sh: making .venv/ with ${VENV_PKGS[*]}"
    python3 -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q "${VENV_PKGS[@]}"
  fi
  # optc itself, as a user installs it (pip install .), rebuilt in
  # build-pip/ only where the sources changed
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
