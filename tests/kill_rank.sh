#!/usr/bin/env bash
# A rank that dies mid-run ends the job: mpirun stops the other ranks,
# optc exec exits non-zero with one line naming the rank and the cause (in
# place of mpirun's banners), and no output (not even a partial one) is
# left behind.
#   kill_rank.sh OPTC PYTHON ROOT
set -u
optc=$1 python=$2 root=$3
work=$(mktemp -d)
trap 'rm -rf "$work"; pkill -9 -f "$work" 2>/dev/null' EXIT
"$python" "$root/tests/mkst.py" "$work/in.safetensors" w=F32:200000:rand:1 w.grad=F32:200000:rand:2:0.1
printf "optimizer:\n  _component_: torch.optim.AdamW\ndtype: fp32\nclip_grad_norm: 1.0\n" > "$work/r.yaml"
"$optc" exec "$work/r.yaml" --in "$work/in.safetensors" --out "$work/out.safetensors" --steps 100000 \
  --backend interp --nproc 2 > "$work/log.txt" 2>&1 &
launcher=$!
# wait until both ranks run, then kill rank 1 (the second rank's process)
for _ in $(seq 100); do
  [ "$(pgrep -f -- "--mpi-rank" | wc -l)" -ge 2 ] && break
  sleep 0.1
done
sleep 1
victim=$(pgrep -f -- "$work/r.yaml.*--mpi-rank" | sort -n | tail -1)
[ -n "$victim" ] || { echo "FAIL: no rank to kill"; cat "$work/log.txt"; exit 1; }
kill -9 "$victim"
start=$(date +%s)
wait "$launcher"
rc=$?
took=$(( $(date +%s) - start ))
cat "$work/log.txt"
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0 after a rank was killed"; fail=1; }
[ "$took" -le 20 ] || { echo "FAIL: the job took ${took}s to end"; fail=1; }
grep -qiE "signal 9|killed" "$work/log.txt" || { echo "FAIL: the message does not say how the rank died"; fail=1; }
grep -qE "rank [0-9]" "$work/log.txt" || { echo "FAIL: the message does not name the rank"; fail=1; }
[ "$(grep -c "killed by signal" "$work/log.txt")" -eq 1 ] || { echo "FAIL: not one line says how the rank died"; fail=1; }
grep -qE "^-{20,}$|mpirun noticed" "$work/log.txt" && { echo "FAIL: mpirun's banner came through"; fail=1; }
ls "$work" | grep -q "out.safetensors" && { echo "FAIL: an output file was left: $(ls "$work")"; fail=1; }
[ "$(pgrep -f -- "$work/r.yaml.*--mpi-rank" | wc -l)" -eq 0 ] || { echo "FAIL: ranks are still running"; fail=1; }
[ $fail = 0 ] && echo "ok: exit $rc after ${took}s, no output left"
exit $fail
