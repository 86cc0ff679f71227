#!/usr/bin/env bash
# One golden case: optc exec of the case's recipe on in.safetensors must
# match what torch.optim computed (expected.safetensors, made by
# gen_golden.py), and every backend must give the interpreter's bytes.
#
# Tolerance against torch: relative 1e-6 per element, plus 1e-6 of the
# tensor's largest magnitude. torch's CPU kernels fuse multiply-adds in
# their vector loops (lerp, addcmul, add with alpha) and optc follows
# torch's scalar formulas, so single ops differ by an ulp; over 3-5 steps
# that stays within a few ulps (observed max: 3 ulp on params where no
# cancellation happens). Where a value is the difference of nearly equal
# terms (p - lr*update landing near 0, g + wd*p), the same ulps are relative
# to the terms, hence the second part.
set -eu
optc=$1 diff=$2 dir=$3 case=$4 steps=$5 extra=$6
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=()
[ "$extra" != "-" ] && sets=(--set "$extra")
run() {
  "$optc" exec "$dir/$case/recipe.yaml" --in "$dir/$case/in.safetensors" --out "$out/$1.safetensors" \
    --steps "$steps" --backend "$1" "${sets[@]}"
}
run interp
"$diff" "$dir/$case/expected.safetensors" "$out/interp.safetensors" --rtol 1e-6 --atol-scale 1e-6
for backend in eager cpu; do
  if [ "$backend" = cpu ] && ! "$optc" compile --help | grep -q -- '--emit=llvm'; then
    continue # built without LLVM
  fi
  run "$backend"
  "$diff" "$out/interp.safetensors" "$out/$backend.safetensors" --exact > "$out/diff.txt" ||
    { echo "--backend $backend differs from the interpreter:"; cat "$out/diff.txt"; exit 1; }
  echo "--backend $backend: identical to the interpreter"
done
