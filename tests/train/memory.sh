#!/usr/bin/env bash
# optc plan's per-rank memory for what optc run holds (rank_memory: the
# shards of params, reduced grads and states, the spans of the units in
# use, the activation workspace, the process) against the peak resident
# memory a run reports (getrusage's maxrss, rank 0, which also writes the
# checkpoint), on a ~30M-param Scout-shaped config, in fp32 for 1 rank
# and, with MPI, 2 and 3, and in bf16 (f32 copies of the units in use) for
# 1 and 2 (and with fsdp_overlap, and activation checkpointing, which
# must hold less; and with AdamW8bit's quantized states), each within 10%. With MPI, a 196M-param one too, on 1 and 2
# ranks: within 10%, and two ranks' peak below 60% of one's (FSDP shards
# params, grads and states at rest).
#   memory.sh OPTC PYTHON ROOT [MPI yes|no] [SANITIZE]
# Under a sanitizer the RSS is its shadow memory's as much as optc's: skip.
set -u
optc=$1 python=$2 root=$3 mpi=${4:-yes} sanitize=${5:-none}
if [ "$sanitize" != none ] && [ -n "$sanitize" ]; then
  echo "SKIP: built with -Db_sanitize=$sanitize (its shadow memory is in every RSS)"
  exit 77
fi
cfg=$root/recipes/configs/llama4/scout_tiny_full.yaml
small="model.embed_dim=256 model.hidden_dim=256 model.vocab_size=32000 max_steps=2 dataset.holdout_fraction=0"
# the same with the units' collectives on their own thread: the next unit's params and the last one's grads too
overlap="$small fsdp_overlap=true"
# with activation checkpointing: one layer's activations, batch 8 (more activations to save)
checkpointed="$small enable_activation_checkpointing=true batch_size=8"
kept="$small batch_size=8"
# quantized states (torchao's AdamW8bit): codes a byte an element, a scale a block
lowbit="$small optimizer._component_=torchao.optim.AdamW8bit"
# 196M params in 26 units, none over 8M: the shards dominate, as in a real model
big="model.num_layers=24 model.num_heads=6 model.num_kv_heads=2 model.embed_dim=384 model.hidden_dim=384
     model.vocab_size=8192 max_steps=2 dataset.holdout_fraction=0 batch_size=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cases="small:1:fp32 small:1:bf16 lowbit:1:bf16"
[ "$mpi" = yes ] && cases="small:1:fp32 small:2:fp32 small:3:fp32 small:1:bf16 small:2:bf16 overlap:2:bf16 kept:2:fp32
  checkpointed:2:fp32 lowbit:1:bf16 lowbit:2:bf16 big:1:fp32 big:2:fp32"
failed=0
for c in $cases; do
  size=${c%%:*} rest=${c#*:}
  n=${rest%:*} dtype=${rest#*:}
  dims=${!size}
  "$optc" plan "$cfg" --nproc "$n" --json $dims dtype=$dtype > "$work/plan$c.json" 2> "$work/plan$c.err" ||
    { cat "$work/plan$c.err"; echo "FAIL: optc plan --nproc $n dtype=$dtype ($size)"; exit 1; }
  np=()
  [ "$n" -gt 1 ] && np=(--nproc "$n")
  "$optc" run "${np[@]}" full_finetune_distributed --config "$cfg" $dims dtype=$dtype output_dir="$work/out$c" \
    > "$work/run$c.log" 2>&1 || { tail -5 "$work/run$c.log"; echo "FAIL: optc run --nproc $n dtype=$dtype ($size)"; exit 1; }
  "$python" - "$work/plan$c.json" "$work/run$c.log" "$size $n $dtype" "$work/peaks" <<'PY' || failed=1
import json, re, sys
plan = json.load(open(sys.argv[1]))["run_memory_per_rank_bytes"]
peaks = re.findall(r"peak ([0-9.]+) GiB", open(sys.argv[2]).read())
if not peaks:
    print("FAIL: no peak in the run's log"); sys.exit(1)
run = float(peaks[-1]) * 2**30
off = plan["total"] / run - 1
parts = ", ".join("%s %.0f MiB" % (k, plan[k] / 2**20) for k in
                  ("params", "grads", "optimizer_states", "unit_spans", "activations", "process"))
size, n, dtype = sys.argv[3].split()
open(sys.argv[4], "a").write("%s %s %s %r\n" % (size, n, dtype, run))
print("%s, %s rank%s, %s: plan %.3f GiB (%s), run's peak %.3f GiB: %+.1f%%" %
      (size, n, "" if n == "1" else "s", dtype, plan["total"] / 2**30, parts, run / 2**30, 100 * off))
if abs(off) > 0.10:
    print("FAIL: the plan is off by more than 10%"); sys.exit(1)
PY
done
if [ "$mpi" = yes ]; then
  # FSDP shards params, grads and states at rest: two ranks hold about half
  "$python" - "$work/peaks" <<'PY' || failed=1
import sys
peak = {tuple(l.split()[:3]): float(l.split()[3]) for l in open(sys.argv[1])}
one, two = peak[("big", "1", "fp32")], peak[("big", "2", "fp32")]
print("196M params, fp32: 1 rank's peak %.3f GiB, 2 ranks' %.3f GiB each: %.1f%% of one (needs < 60%%)" %
      (one / 2**30, two / 2**30, 100 * two / one))
ok = two < 0.6 * one
kept, ck = peak[("kept", "2", "fp32")], peak[("checkpointed", "2", "fp32")]
print("batch 8, 2 ranks: %.3f GiB keeping every layer's activations, %.3f GiB with activation checkpointing" %
      (kept / 2**30, ck / 2**30))
sys.exit(0 if ok and ck < kept else 1)
PY
fi
[ $failed = 0 ] && echo "ok: optc plan within 10% of the measured peak: $cases"
exit $failed
