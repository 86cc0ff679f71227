#!/usr/bin/env bash
# gpu_shapes.sh: the GPU kernels' launch shapes side by side, one GPU, one run.
#
#   bench/gpu_shapes.sh DIR [PARAMS]
#
# DIR holds gpu_bench (bench/gpu_pack.sh makes it, with its libraries in
# DIR/lib); DIR/old/gpu_bench, when there, is another build's (the code
# before a change) and runs first. PARAMS defaults to 2^28. Each shape
# (threads per block of the element-wise and of the reduction phases, the
# lanes of a chunk each thread of a reduction phase takes in one load, and
# the blocks per SM an element-wise kernel's registers are budgeted for:
# gpu_bench's --threads, --red-threads, --red-lanes and --min-blocks) runs the
# scale_grads + clip_grad_norm + AdamW step in fp32 and in bf16; gpu_bench
# prints each kernel's time. The lines land in $GPU_CHECK_OUT/shapes.jsonl
# (default build/gpu_check/) and a table at the end: bench/results.md's
# "The shapes" came from this script.
set -euo pipefail
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: bench/gpu_shapes.sh DIR [PARAMS] (DIR: bench/gpu_pack.sh's folder)" >&2; exit 2; }
DIR=$(cd "$1" && pwd)
P=${2:-$((1 << 28))}
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH=$DIR/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT=${GPU_CHECK_OUT:-$PWD/build/gpu_check}
mkdir -p "$OUT"
J=$OUT/shapes.jsonl
rm -f "$J"

# label, then gpu_bench's options
SHAPES=(
  "default|"
  "256 threads|--threads 256"
  "8 blocks per SM|--min-blocks 8"
  "reductions 256 threads|--red-threads 256"
  "reductions 2 lanes a thread|--red-lanes 2"
  "reductions 4 lanes a thread|--red-lanes 4"
  "reductions 8 lanes a thread|--red-lanes 8"
)
run() { # label bench options...
  local label=$1 bench=$2
  shift 2
  for layout in fp32 bf16; do
    echo "== $label, $layout"
    if "$bench" --params "$P" --layout "$layout" --reps 10 --json "$OUT/one.jsonl" "$@" > "$OUT/one.txt" 2>&1; then
      grep -E "^(step|  phase|  optc_phase)" "$OUT/one.txt" || true
      sed "s|^{|{\"shape\": \"$label\", |" "$OUT/one.jsonl" >> "$J"
    else
      cat "$OUT/one.txt"
    fi
    rm -f "$OUT/one.jsonl"
  done
}
[ -x "$DIR/old/gpu_bench" ] && run "before" "$DIR/old/gpu_bench"
for s in "${SHAPES[@]}"; do
  IFS='|' read -r label opts <<< "$s"
  read -ra args <<< "$opts"
  run "$label" "$DIR/gpu_bench" ${args[@]+"${args[@]}"}
done

python3 - "$J" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n%-28s %-5s %9s %9s  %s" % ("shape", "dtype", "kernels", "% copy", "per phase (ms)"))
for r in rows:
    gbs = r["bytes_per_element"] * r["params"] / (r["kernel_ms"] * 1e6)
    print("%-28s %-5s %8.3f  %7.1f%%  %s" % (r["shape"], r["layout"], r["kernel_ms"], 100 * gbs / r["copy_GBps"],
          " ".join("%.3f" % m for m in r.get("phase_ms", []))))
EOF
