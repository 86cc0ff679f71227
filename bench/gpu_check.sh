#!/usr/bin/env bash
# gpu_check.sh: optc's GPU backend on a real GPU, in one run of under 8
# minutes on an H200 (any CUDA GPU with the CUDA toolkit and PyTorch).
#
#   bench/gpu_check.sh            build, the gpu test suite, then the benchmark:
#                                 2^30 parameters (4 GiB of fp32 params), fp32 and bf16
#   bench/gpu_check.sh --quick    the same on 2^26 parameters, fp32 only (about 2 minutes)
#   bench/gpu_check.sh --prebuilt DIR
#                                 no build: DIR holds optc, gpu_bench and test_gpu built
#                                 elsewhere and the libraries they need in DIR/lib
#                                 (bench/gpu_pack.sh makes it), for a GPU machine that
#                                 has the CUDA driver and toolkit but not LLVM or libyaml
#
# Steps:
#   1. build optc (meson/ninja, or ./setup.sh when meson is missing);
#   2. the gpu suite: meson test --suite gpu when the build has it, else
#      tests/test_gpu.c built here against build/liboptc_core.a;
#   3. bench/gpu_bench.c: optc's compiled step (scale_grads + clip_grad_norm
#      + AdamW), fp32 and bf16, with the device-to-device copy ceiling;
#   4. optc bench optimizer (64M parameters; fp32, and the Scout recipe in bf16): the compiled step on the CPU
#      and, in a row of its own, on the GPU;
#      bench/gpu_torch.py (when PyTorch with CUDA is there): torch.optim.AdamW foreach=True, fused=True, and
#      the foreach step under torch.compile, each with scale_grads and
#      clip_grad_norm_, on the same values;
#   5. the table (ms, GB/s, % of the copy ceiling, optc's speed-up).
# Everything lands in build/gpu_check/ (results.jsonl, logs), or in $GPU_CHECK_OUT.
#
# Environment: CUDA_HOME (default /usr/local/cuda), PYTHON (default
# python3), GPU_CHECK_TORCH_TIMEOUT (seconds for step 4, default 300).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
QUICK=0
PREBUILT=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --prebuilt) [ $# -ge 2 ] || { echo "gpu_check.sh: --prebuilt needs a folder" >&2; exit 2; }
                [ -d "$2" ] || { echo "gpu_check.sh: --prebuilt: no folder '$2' (bench/gpu_pack.sh makes .gpu)" >&2; exit 2; }
                PREBUILT=$(cd "$2" && pwd); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${GPU_CHECK_OUT:-$ROOT/build/gpu_check}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PYTHON=${PYTHON:-python3}
START=$(date +%s)
FAILED=0
say() { printf '\n== %s (%ds)\n' "$*" $(( $(date +%s) - START )); }
die() { echo "gpu_check.sh: error: $*" >&2; exit 1; }

# ---- 0. what is here ---------------------------------------------------------------------
say "device"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
    || die "nvidia-smi sees no GPU"
else
  echo "(no nvidia-smi; relying on the driver library)"
fi
# optc opens NVRTC at run time: $CUDA_HOME/lib64's, among the places it looks
export CUDA_HOME
compgen -G "$CUDA_HOME/lib64/libnvrtc.so.1[0-9]" >/dev/null \
  || die "no NVRTC: no $CUDA_HOME/lib64/libnvrtc.so.NN (set CUDA_HOME to the toolkit)"
TORCH=1
"$PYTHON" - <<'EOF' || { TORCH=0; echo "note: no PyTorch with a CUDA device: the torch comparison (step 4) is skipped"; }
import torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print("torch %s (CUDA %s) on %s" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)))
EOF

# ---- 1. build ------------------------------------------------------------------------------
OPTC=build/optc
TEST_GPU=
if [ -n "$PREBUILT" ]; then
  say "prebuilt: $PREBUILT"
  for f in optc gpu_bench test_gpu; do [ -x "$PREBUILT/$f" ] || die "$PREBUILT/$f is missing (bench/gpu_pack.sh makes it)"; done
  export LD_LIBRARY_PATH=$PREBUILT/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  OPTC=$PREBUILT/optc GPU_BENCH=$PREBUILT/gpu_bench TEST_GPU=$PREBUILT/test_gpu
  mkdir -p "$OUT"
  "$OPTC" --version
else
  say "build"
  if [ ! -f build/build.ninja ]; then
    if command -v meson >/dev/null && command -v ninja >/dev/null; then
      meson setup build --native-file native.ini -Dcuda=enabled -Dtoolkit_dir="$CUDA_HOME"
    else
      ./setup.sh
    fi
  fi
  ninja -C build
  mkdir -p "$OUT"
  grep -q "cuda (NVRTC.*: YES" build/meson-logs/meson-log.txt 2>/dev/null \
    || echo "note: this build does not list NVRTC; the GPU pieces are built here against $CUDA_HOME"

  # The GPU pieces: from the meson build when it has them, else built here.
  LIBS=(-lyaml -ljansson -lopenblas -lm -lpthread -ldl)
  if grep -q emit_llvm build/compile_commands.json 2>/dev/null; then
    LLVM_CONFIG=$(command -v llvm-config-19 || command -v llvm-config || true)
    [ -n "$LLVM_CONFIG" ] || die "the build uses LLVM but llvm-config-19 is not on PATH"
    read -ra LLVM_LIBS <<< "$("$LLVM_CONFIG" --ldflags --libs | tr '\n' ' ')"
    LIBS+=("${LLVM_LIBS[@]}")
  fi
  VERSION=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" meson.build | head -1)
  CFLAGS=(-std=c11 -O2 -g -D_GNU_SOURCE "-DOPTC_VERSION=\"$VERSION\"" -ffp-contract=off
    -Ibase -Icompiler -Icompiler/cpu -Icompiler/cuda -Iruntime/exec -Iinclude -Iruntime/io -Iruntime/group
    -Iruntime/model -Iruntime/data -Iruntime/dist -Iruntime/train -Itools)
  EXTRA=()
  SYMS=$(nm build/liboptc_core.a 2>/dev/null || true)
  if grep -q ' T cuda_compile$' <<< "$SYMS" && ! grep -q ' B nvrtc$' <<< "$SYMS"; then
    die "build/ has the GPU backend without its NVRTC loader (-Dcuda=disabled): meson configure build -Dcuda=enabled"
  fi
  if ! grep -q ' T cuda_compile$' <<< "$SYMS"; then
    echo "building emit_cuda.c, nvrtc.c, driver.c, exec_cuda.c here (liboptc_core.a does not have them yet)"
    "$PYTHON" -c 'import sys, json; t = open(sys.argv[1]).read(); open(sys.argv[2], "w").write(
  "/* generated from compiler/numerics.h */\nconst char optc_numerics_h[] = " + json.dumps(t) + ";\n")' \
      compiler/numerics.h "$OUT/numerics_h.c"
    cc "${CFLAGS[@]}" -c "$OUT/numerics_h.c" -o "$OUT/numerics_h.o"
    cc "${CFLAGS[@]}" -c compiler/cuda/emit_cuda.c -o "$OUT/emit_cuda.o"
    cc "${CFLAGS[@]}" -DOPTC_HAVE_NVRTC -c compiler/cuda/nvrtc.c -o "$OUT/nvrtc.o"
    cc "${CFLAGS[@]}" -c compiler/cuda/driver.c -o "$OUT/driver.o"
    cc "${CFLAGS[@]}" -c runtime/exec/exec_cuda.c -o "$OUT/exec_cuda.o"
    EXTRA=("$OUT/numerics_h.o" "$OUT/emit_cuda.o" "$OUT/nvrtc.o" "$OUT/driver.o" "$OUT/exec_cuda.o")
  fi
  GPU_BENCH=build/gpu_bench
  [ -x "$GPU_BENCH" ] || GPU_BENCH=build/bench/gpu_bench
  if [ ! -x "$GPU_BENCH" ]; then
    GPU_BENCH=$OUT/gpu_bench
    cc "${CFLAGS[@]}" bench/gpu_bench.c tools/args.c ${EXTRA[@]+"${EXTRA[@]}"} build/liboptc_core.a "${LIBS[@]}" \
      -o "$GPU_BENCH"
  fi

fi

# ---- 2. the gpu suite ------------------------------------------------------------------------
say "gpu test suite"
if [ -z "$TEST_GPU" ] && ! meson test -C build --list 2>/dev/null | grep -q ' gpu$\|:gpu / '; then
  cc "${CFLAGS[@]}" tests/test_gpu.c ${EXTRA[@]+"${EXTRA[@]}"} build/liboptc_core.a "${LIBS[@]}" -o "$OUT/test_gpu"
  TEST_GPU=$OUT/test_gpu
fi
if [ -n "$TEST_GPU" ]; then
  rc=0
  timeout 300 "$TEST_GPU" | tee "$OUT/test_gpu.log" || rc=$?
  [ "$rc" = 77 ] && die "test_gpu skipped: it sees no GPU (see $OUT/test_gpu.log)"
  [ "$rc" = 0 ] || { echo "gpu_check.sh: error: test_gpu failed with $rc (see $OUT/test_gpu.log); the benchmark runs on" >&2; FAILED=1; }
else
  timeout 300 meson test -C build --suite gpu --print-errorlogs || { echo "gpu_check.sh: error: the gpu suite failed (build/meson-logs/testlog.txt); the benchmark runs on" >&2; FAILED=1; }
fi

# ---- 3-5. the benchmark -------------------------------------------------------------------------
P=$((1 << 30)); REPS=10; LAYOUTS=fp32,bf16
if [ "$QUICK" = 1 ]; then P=$((1 << 26)); REPS=5; LAYOUTS=fp32; fi
RESULTS=$OUT/results.jsonl
rm -f "$RESULTS"
say "optc: $P parameters, layouts $LAYOUTS"
for layout in ${LAYOUTS//,/ }; do
  "$GPU_BENCH" --layout "$layout" --params "$P" --reps "$REPS" --json "$RESULTS"
done
say "optc bench optimizer: the compiled step on the CPU and on the GPU, one run"
"$OPTC" bench optimizer --params 64M --reps 5 --strategies fused-reference,compiled \
  --json "$OUT/bench_optimizer.json" | tee "$OUT/bench_optimizer.txt"
if [ "$QUICK" = 0 ]; then
  # the Scout recipe's own step: bf16 params, grads and states, scale_grads
  "$OPTC" bench optimizer --config recipes/configs/llama4/scout_17B_16E_full.yaml --layout bf16 \
    --params 64M --reps 5 --strategies fused-reference,compiled | tee -a "$OUT/bench_optimizer.txt"
fi
if [ "$TORCH" = 1 ]; then
  say "torch: foreach, fused, torch.compile"
  rc=0
  timeout "${GPU_CHECK_TORCH_TIMEOUT:-300}" "$PYTHON" bench/gpu_torch.py bench --params "$P" --layouts "$LAYOUTS" \
    --reps "$REPS" --json "$RESULTS" > "$OUT/torch.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || echo "note: the torch run stopped early ($rc; see $OUT/torch.log); the table has what it finished"
fi
say "results"
"$PYTHON" bench/gpu_torch.py report "$RESULTS" | tee "$OUT/table.txt"
echo
echo "gpu_check.sh: done in $(( $(date +%s) - START )) s; results in $OUT"
[ "$FAILED" = 0 ] || echo "gpu_check.sh: the gpu test suite FAILED (above)" >&2
exit "$FAILED"
