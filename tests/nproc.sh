#!/usr/bin/env bash
# optc exec --nproc N equals --nproc 1, byte for byte: every built-in
# optimizer x clipping on and off x the three dtype layouts, on tensors
# whose sizes do and do not divide by the ranks (the group spans several
# 4096-element blocks, so each rank owns a real slice and the last one
# a ragged or empty one).
#   nproc.sh OPTC TENSOR_DIFF PYTHON ROOT BACKEND NPROC
set -eu
optc=$1 diff=$2 python=$3 root=$4 backend=$5 nproc=$6
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mk() { "$python" "$root/tests/mkst.py" "$@"; }
for dt in F32 BF16; do
  mk "$work/in_$dt.safetensors" \
    big=$dt:9001:rand:1 big.grad=$dt:9001:rand:2:0.3 \
    mid=$dt:33x5:rand:3 mid.grad=$dt:33x5:rand:4:0.3 \
    one=$dt:1:rand:5 one.grad=$dt:1:rand:6:0.3 \
    odd=$dt:4097:rand:7 odd.grad=$dt:4097:rand:8:0.3 \
    cube=$dt:3x5x7:rand:9 cube.grad=$dt:3x5x7:rand:10:0.3
done
optimizers=(
  "torch.optim.AdamW"
  "torch.optim.AdamW|  amsgrad: true"
  "torch.optim.Adam|  weight_decay: 0.1"
  "torch.optim.SGD|  lr: 0.1"
  "torch.optim.SGD|  lr: 0.1\n  momentum: 0.9\n  nesterov: true"
  "optc.Lion|  weight_decay: 0.1"
  "torch.optim.Adagrad|  lr_decay: 0.01"
  "torch.optim.RMSprop|  centered: true\n  momentum: 0.9"
)
layouts=("fp32|F32|dtype: fp32" "bf16|BF16|dtype: bf16" "bf16-fp32states|BF16|dtype: bf16\noptimizer_state_dtype: fp32")
n=0 fail=0
for opt in "${optimizers[@]}"; do
  comp=${opt%%|*}
  extra=""; [[ "$opt" == *"|"* ]] && extra=${opt#*|}
  for lay in "${layouts[@]}"; do
    IFS='|' read -r lname ldt lyaml <<< "$lay"
    for clip in no yes; do
      y="$work/r.yaml"
      printf "optimizer:\n  _component_: %s\n%b\n%b\n" "$comp" "$extra" "$lyaml" > "$y"
      [ "$clip" = yes ] && printf "clip_grad_norm: 0.5\n" >> "$y"
      args=(exec "$y" --in "$work/in_$ldt.safetensors" --steps 3 --backend "$backend" --set num_tokens=3)
      "$optc" "${args[@]}" --out "$work/one.safetensors"
      "$optc" "${args[@]}" --out "$work/many.safetensors" --nproc "$nproc"
      n=$((n + 1))
      if ! "$diff" "$work/one.safetensors" "$work/many.safetensors" --exact > "$work/d.txt"; then
        echo "FAIL: $comp $extra / $lname / clip=$clip: --nproc $nproc differs from --nproc 1"
        cat "$work/d.txt"
        fail=1
      fi
    done
  done
done
echo "$n cases: --nproc $nproc and --nproc 1 $( [ $fail = 0 ] && echo identical || echo DIFFER )"
exit $fail
