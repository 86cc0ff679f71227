#!/usr/bin/env bash
# gpu_offload.sh: issue 34's device check. The seed's setting in miniature
# (bench/gpu_offload.py: a Scout-shaped Llama 4, bf16, FSDP2 with CPU
# offload on one GPU, batch 1 x 2048 tokens) with four optimizers: torch's
# AdamW (fused: False, as the config has it), its step under torch.compile,
# optc.torch.AdamW, and optc.torch.AdamW(in_backward=True). Fits 10 minutes
# on one H100 or H200.
#
# Here (a machine with the build tools), once:
#   bench/gpu_offload.sh --prepare        builds the wheel (tools/build_wheel.sh) into .whl/
# There (the GPU machine: torch and transformers installed, no network),
# with .whl carried:
#   bench/gpu_offload.sh [ARGS...]        installs the wheel into /tmp/optc-site, runs
#                                         gpu_offload.py ARGS (default: --layers 2), and
#                                         writes $OUT/gpu_offload.json (or build/gpu_offload.json)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  tools/build_wheel.sh
  mkdir -p .whl
  rm -f .whl/optc-*.whl
  cp dist/optc-*.whl .whl/
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  ls -l .whl
  exit 0
fi
PYTHON=${PYTHON:-python3}
whl=$(ls .whl/optc-*.whl 2>/dev/null | head -1) || true
[ -n "$whl" ] || { echo "gpu_offload.sh: no .whl/optc-*.whl: run bench/gpu_offload.sh --prepare first (and carry .whl)" >&2; exit 2; }
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/optc-site --upgrade "$whl"
export PYTHONPATH=/tmp/optc-site${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-build}/gpu_offload.json
mkdir -p "$(dirname "$out")"
[ $# -gt 0 ] || set -- --layers 2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
PYTHONUNBUFFERED=1 "$PYTHON" bench/gpu_offload.py "$@" --json "$out"
