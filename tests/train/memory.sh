#!/usr/bin/env bash
# optc plan's per-rank memory for what optc run holds (rank_memory: params
# and grads whole, slices of the reduced grads and the states, the
# activation workspace, the process) against the peak resident memory a
# run reports (getrusage's maxrss, rank 0, which also writes the
# checkpoint), on a ~30M-param Scout-shaped config (0.5-0.7 GiB per rank),
# in fp32 for 1 rank and, with MPI, 2 and 3, and in bf16 (f32 working
# copies of params and grads) for 1: each within 10%.
#   memory.sh OPTC PYTHON ROOT [MPI yes|no] [SANITIZE]
# Under a sanitizer the RSS is its shadow memory's as much as optc's: skip.
set -u
optc=$1 python=$2 root=$3 mpi=${4:-yes} sanitize=${5:-none}
if [ "$sanitize" != none ] && [ -n "$sanitize" ]; then
  echo "SKIP: built with -Db_sanitize=$sanitize (its shadow memory is in every RSS)"
  exit 77
fi
cfg=$root/recipes/configs/llama4/scout_tiny_full.yaml
dims="model.embed_dim=256 model.hidden_dim=256 model.vocab_size=32000 max_steps=2 dataset.holdout_fraction=0"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cases="1:fp32 1:bf16"
[ "$mpi" = yes ] && cases="1:fp32 2:fp32 3:fp32 1:bf16"
failed=0
for c in $cases; do
  n=${c%:*} dtype=${c#*:}
  "$optc" plan "$cfg" --nproc "$n" --json $dims dtype=$dtype > "$work/plan$c.json" 2> "$work/plan$c.err" ||
    { cat "$work/plan$c.err"; echo "FAIL: optc plan --nproc $n dtype=$dtype"; exit 1; }
  np=()
  [ "$n" -gt 1 ] && np=(--nproc "$n")
  "$optc" run "${np[@]}" full_finetune_distributed --config "$cfg" $dims dtype=$dtype output_dir="$work/out$c" \
    > "$work/run$c.log" 2>&1 || { tail -5 "$work/run$c.log"; echo "FAIL: optc run --nproc $n dtype=$dtype"; exit 1; }
  "$python" - "$work/plan$c.json" "$work/run$c.log" "$n $dtype" <<'PY' || failed=1
import json, re, sys
plan = json.load(open(sys.argv[1]))["run_memory_per_rank_bytes"]
peaks = re.findall(r"peak ([0-9.]+) GiB", open(sys.argv[2]).read())
if not peaks:
    print("FAIL: no peak in the run's log"); sys.exit(1)
run = float(peaks[-1]) * 2**30
off = plan["total"] / run - 1
parts = ", ".join("%s %.0f MiB" % (k, plan[k] / 2**20) for k in
                  ("params", "grads", "f32_working_copies", "reduced_grads_slice", "optimizer_states", "activations", "process"))
n, dtype = sys.argv[3].split()
print("%s rank%s, %s: plan %.3f GiB (%s), run's peak %.3f GiB: %+.1f%%" %
      (n, "" if n == "1" else "s", dtype, plan["total"] / 2**30, parts, run / 2**30, 100 * off))
if abs(off) > 0.10:
    print("FAIL: the plan is off by more than 10%"); sys.exit(1)
PY
done
[ $failed = 0 ] && echo "ok: optc plan within 10% of the measured peak: $cases"
exit $failed
