#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang-19 under
# ASan and UBSan into OUT (default build-fuzz/), compiling optc's sources
# straight from the tree: no meson, no build/ needed. builtins.c and
# numerics_h.c are generated into OUT as meson generates them.
#
#   tests/fuzz/build.sh [OUT] [TARGET...]      (targets: ir recipe safetensors
#                                               dataset tokenizer api; default all)
#
# Every optc object goes into one archive, so each target links only the
# objects it reaches:
#   fuzz_ir           base/ (base.c yamltree.c), compiler/: ir parse verify
#                     print frontend pipeline passes/* layout lower interp codebook
#                     (+ builtins.c)
#   fuzz_recipe       the same
#   fuzz_safetensors  runtime/io/safetensors.c + base/base.c
#   fuzz_dataset      runtime/data/ (data.c hfdata.c parquet.c tokenizer.c)
#                     + base/ (yamltree.c); jansson, pcre2
#   fuzz_tokenizer    runtime/data/tokenizer.c + base/base.c; pcre2
#   fuzz_api          api/optc.c + what liboptc holds: compiler/cpu (LLVM
#                     19), compiler/cuda, runtime/exec/exec_cpu.c
# The include path is every room's: the layers are meson.build's to check
# (tests/layers.py).
# Environment: CC (clang-19), FUZZ_CFLAGS (extra flags, e.g. -O2), JOBS.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build-fuzz}
shift || true
targets=${*:-ir recipe safetensors dataset tokenizer api}
CC=${CC:-clang-19}
LLVM_CONFIG=${LLVM_CONFIG:-llvm-config-19}
JOBS=${JOBS:-$(nproc)}
command -v "$CC" >/dev/null || { echo "build.sh: $CC not found (apt-get install -y clang-19 libclang-rt-19-dev)" >&2; exit 1; }
mkdir -p "$out/obj" "$out/gen"
out=$(cd "$out" && pwd)

san=(-fsanitize=address,undefined -fno-sanitize-recover=all)
# shellcheck disable=SC2207
cflags=(-std=c11 -g -O1 -fno-omit-frame-pointer "${san[@]}" -D_GNU_SOURCE '-DOPTC_VERSION="0.2.0"'
  -ffp-contract=off -Wno-unused-command-line-argument
  -I"$root/base" -I"$root/compiler" -I"$root/compiler/cpu" -I"$root/compiler/cuda" -I"$root/runtime"
  -I"$root/runtime/exec" -I"$root/include" -I"$root/runtime/io" -I"$root/runtime/group" -I"$root/runtime/model"
  -I"$root/runtime/data" -I"$root/runtime/dist" -I"$root/runtime/train"
  $(pkg-config --cflags yaml-0.1 jansson libpcre2-8) ${FUZZ_CFLAGS:-})
llvm_cflags=$($LLVM_CONFIG --cflags)
libs="$($LLVM_CONFIG --ldflags --libs) $(pkg-config --libs yaml-0.1 jansson libpcre2-8) -lopenblas -ldl -lm -lpthread"

# ---- generated sources, as meson.build makes them ---------------------------------
python3 "$root/compiler/gen_builtins.py" optimizers "$out/gen/builtins.c.new" "$root"/recipes/optimizers/*.optir
python3 - "$root/compiler/numerics.h" "$root/compiler/numerics_mkl.h" "$out/gen/numerics_h.c.new" <<'PY'
import json, sys
t = open(sys.argv[1]).read(); m = open(sys.argv[2]).read()
t = t.replace('#include "numerics_mkl.h"', m)
open(sys.argv[3], "w").write("/* Generated from compiler/numerics.h and numerics_mkl.h; do not edit. */\n"
                             "const char optc_numerics_h[] = " + json.dumps(t) + ";\n")
PY
for g in builtins numerics_h; do # kept when unchanged, so that its object is too
  if cmp -s "$out/gen/$g.c.new" "$out/gen/$g.c"; then rm "$out/gen/$g.c.new"; else mv "$out/gen/$g.c.new" "$out/gen/$g.c"; fi
done

# ---- optc, instrumented for coverage ----------------------------------------------
srcs="base/base.c compiler/ir.c compiler/print.c compiler/parse.c compiler/verify.c base/yamltree.c
  compiler/frontend.c compiler/pipeline.c compiler/passes/dce.c compiler/passes/canonicalize.c
  compiler/passes/cse.c compiler/passes/hoist.c compiler/passes/drop_grad_writeback.c
  compiler/passes/partition.c compiler/layout.c compiler/interp.c compiler/lower.c compiler/cache.c compiler/codebook.c
  compiler/cpu/emit_llvm.c compiler/cpu/blocks.c compiler/cpu/lanes.c compiler/cpu/variants.c compiler/cpu/jit.c compiler/cuda/emit_cuda.c compiler/cuda/nvrtc.c compiler/cuda/driver.c
  runtime/exec/exec_cpu.c runtime/exec/exec_cuda.c runtime/io/safetensors.c runtime/group/group.c
  runtime/model/inventory.c runtime/train/sched.c runtime/dist/fsdp.c runtime/dist/launch.c runtime/data/data.c runtime/data/hfdata.c runtime/data/parquet.c
  runtime/train/train.c runtime/train/config.c runtime/io/ckpt.c runtime/train/ckpt_config.c runtime/model/llama4.c runtime/model/blas.c
  runtime/data/tokenizer.c runtime/exec/eager.c runtime/dist/coll_local.c runtime/dist/coll_mpi_none.c
  runtime/dist/coll_nccl_none.c api/optc.c"
objs=()
failed=0
compile() { # SRC OBJ [FLAGS...]
  local src=$1 obj=$2
  shift 2
  "$CC" "${cflags[@]}" "$@" -fsanitize=fuzzer-no-link -MMD -MF "$obj.d" -c "$src" -o "$obj" ||
    echo "$src" >>"$out/obj/failed"
}
# Whether OBJ is newer than every file its .d lists (and the flags are the same).
up_to_date() { # OBJ
  local obj=$1 dep
  [ -f "$obj" ] && [ -f "$obj.d" ] && [ "$obj" -nt "$out/obj/flags" ] || return 1
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
    [ "$dep" -nt "$obj" ] && return 1
  done
  return 0
}
flags="$CC ${cflags[*]} $llvm_cflags"
[ -f "$out/obj/flags" ] && [ "$(cat "$out/obj/flags")" = "$flags" ] || printf '%s\n' "$flags" >"$out/obj/flags"
rm -f "$out/obj/failed"
for s in $srcs; do
  [ -f "$root/$s" ] || { echo "build.sh: $s is missing (skipped)" >&2; continue; }
  o=$out/obj/$(echo "$s" | tr / _).o
  objs+=("$o")
  extra=()
  case $s in compiler/cpu/*.c) read -ra extra <<<"$llvm_cflags" ;; esac
  up_to_date "$o" && continue
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  compile "$root/$s" "$o" "${extra[@]}" &
done
for g in builtins numerics_h; do
  objs+=("$out/obj/gen_$g.o")
  up_to_date "$out/obj/gen_$g.o" && continue
  compile "$out/gen/$g.c" "$out/obj/gen_$g.o" &
done
wait
if [ -s "$out/obj/failed" ]; then
  echo "build.sh: failed to compile: $(tr '\n' ' ' <"$out/obj/failed")" >&2
  exit 1
fi
rm -f "$out/liboptc_fuzz.a"
ar rcs "$out/liboptc_fuzz.a" "${objs[@]}"

# ---- the targets --------------------------------------------------------------------
for t in $targets; do
  # shellcheck disable=SC2086
  "$CC" "${cflags[@]}" -fsanitize=fuzzer -DOPTC_SOURCE_ROOT="\"$root\"" "$here/fuzz_$t.c" \
    "$out/liboptc_fuzz.a" -Wl,--as-needed $libs -o "$out/fuzz_$t"
  echo "built $out/fuzz_$t"
done
