#!/usr/bin/env bash
# One golden case: optc exec of the case's recipe on in.safetensors must give
# the bytes torch.optim computed (expected.safetensors, made by gen_golden.py
# from torch itself), with no tolerance, and every backend the interpreter's.
#
# The recipe names the torch CPU build the files came from (torch_cpu), so
# the bits do not depend on the CPU this runs on. Where torch clipped, the
# case gives optc torch's own total norm (grad_norm_given), whose last bits
# depend on torch's summation order; the clipped step is then torch's.
set -eu
optc=$1 diff=$2 dir=$3 case=$4 steps=$5 extra=$6
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=()
if [ "$extra" != "-" ]; then
  IFS=, read -ra kv <<< "$extra"
  for s in "${kv[@]}"; do sets+=(--set "$s"); done
fi
run() {
  "$optc" exec "$dir/$case/recipe.yaml" --in "$dir/$case/in.safetensors" --out "$out/$1.safetensors" \
    --steps "$steps" --backend "$1" "${sets[@]}"
}
run interp
"$diff" "$dir/$case/expected.safetensors" "$out/interp.safetensors" --exact > "$out/diff.txt" ||
  { echo "the interpreter differs from torch:"; cat "$out/diff.txt"; exit 1; }
echo "interp: identical to torch"
skipped=
for backend in eager cpu; do
  if [ "$backend" = cpu ] && ! "$optc" compile --help | grep -q -- '--emit=llvm'; then
    skipped=cpu # built without LLVM
    continue
  fi
  run "$backend"
  "$diff" "$out/interp.safetensors" "$out/$backend.safetensors" --exact > "$out/diff.txt" ||
    { echo "--backend $backend differs from the interpreter:"; cat "$out/diff.txt"; exit 1; }
  echo "--backend $backend: identical to the interpreter"
done
if [ -n "$skipped" ]; then
  echo "SKIP: --backend $skipped cannot run here (built without LLVM)"
  exit 77
fi
