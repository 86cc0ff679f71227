#!/usr/bin/env bash
# Checkpoint directories, end to end, on the tiny Scout config (no torch):
#   1. a run saving sharded checkpoints (checkpointer.max_shard_size=200KB)
#      writes step_N/ complete: >= 3 shards, the index, config.json,
#      optimizer.safetensors, recipe_state.json, and no temporary names;
#   2. resumed from a sharded step_N/, it continues exactly as a run that
#      was never stopped (the same losses, bit for bit), on 1 rank and on 2;
#      with quantized states (torchao's AdamW8bit and AdamW4bit) too;
#   3. a run started from a checkpoint directory (checkpoint_files given by
#      torchtune's filename_format) with lr 0 writes the same weights back:
#      each shard byte for byte; in bf16 too (bf16 kept as stored); and an
#      fp32 recipe widens bf16 weights and writes F32;
#   4. a checkpoint with a shard missing, a tensor missing from the index,
#      or a config.json that contradicts the recipe's dims, is refused with
#      a message naming the file and the tensor or key; so is
#      checkpoint_files with no checkpoint_dir.
#   ckpt.sh OPTC PYTHON ROOT [MPI]
set -eu
optc=$1 python=$2 root=$3 mpi=${4:-yes}
cfg=$root/recipes/configs/llama4/scout_tiny_full.yaml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# a small held-out split keeps the evaluations short
small="dataset.num_samples=400 checkpointer.max_shard_size=200KB"
run() { "$optc" run full_finetune_distributed --config "$cfg" $small "$@"; }
# losses METRICS N: the N logged steps' losses, or a failure when the log
# does not hold exactly steps 1..N (two empty logs are not the same run)
losses() { "$python" -c 'import json,sys
seen={}
for l in open(sys.argv[1]):
    d=json.loads(l); seen[d["step"]]=d["loss"]
n=int(sys.argv[2])
if sorted(seen) != list(range(1, n + 1)):
    sys.exit("FAIL: %s logs steps %s, not 1..%d" % (sys.argv[1], sorted(seen), n))
print(" ".join("%.9g" % seen[k] for k in sorted(seen)))' "$1" "$2"; }
fail() { echo "FAIL: $*"; exit 1; }

echo "== 1. a sharded checkpoint directory"
run max_steps=4 output_dir="$work/a" 2> "$work/a.log"
d=$work/a/step_4
ls "$d"
n=$(ls "$d" | grep -c '^model-[0-9]\{5\}-of-[0-9]\{5\}\.safetensors$' || true)
[ "$n" -ge 3 ] || fail "$n shards, expected >= 3"
for f in model.safetensors.index.json config.json optimizer.safetensors recipe_state.json; do
  [ -f "$d/$f" ] || fail "no $f in $d"
done
[ "$(cat "$work/a/latest")" = step_4 ] || fail "latest is '$(cat "$work/a/latest")'"
left=$(find "$work/a" -name '*.tmp.*' | wc -l)
[ "$left" = 0 ] || fail "temporary files left: $(find "$work/a" -name '*.tmp.*')"
"$python" - "$d" "$n" <<'PY'
import json, os, sys
d, n = sys.argv[1], int(sys.argv[2])
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
files = sorted(set(idx["weight_map"].values()))
assert files == ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)], files
size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
print("%d tensors in %d shards; total_size %d, files %d bytes (headers included)" % (len(idx["weight_map"]), n, idx["metadata"]["total_size"], size))
assert idx["metadata"]["total_size"] < size
cfg = json.load(open(os.path.join(d, "config.json")))
assert cfg["architectures"] == ["Llama4ForCausalLM"] and cfg["num_hidden_layers"] == 4 and cfg["hidden_size"] == 64
PY

echo "== 2. resumed from a sharded checkpoint"
# resumed_same NAME NPROC STEPS OVERRIDES...: a run of STEPS steps, and one
# of STEPS/2 resumed to STEPS, give the same losses and the same files
resumed_same() {
  local name=$1 np=$2 steps=$3 half=$(($3 / 2))
  shift 3
  "$optc" run --nproc "$np" full_finetune_distributed --config "$cfg" $small "$@" max_steps="$steps" \
    output_dir="$work/$name-u" 2> "$work/$name-u.log" || { tail -3 "$work/$name-u.log"; fail "$name: the run failed"; }
  "$optc" run --nproc "$np" full_finetune_distributed --config "$cfg" $small "$@" max_steps="$half" \
    output_dir="$work/$name-k" 2> "$work/$name-k.log" || { tail -3 "$work/$name-k.log"; fail "$name: the run failed"; }
  "$optc" run --nproc "$np" full_finetune_distributed --config "$cfg" $small "$@" max_steps="$steps" \
    output_dir="$work/$name-k" resume_from_checkpoint=true 2> "$work/$name-r.log" ||
    { tail -3 "$work/$name-r.log"; fail "$name: the resume failed"; }
  grep resuming "$work/$name-r.log"
  a=$(losses "$work/$name-u/logs/metrics.jsonl" "$steps"); b=$(losses "$work/$name-k/logs/metrics.jsonl" "$steps")
  echo "$name, uninterrupted: $a"; echo "$name, resumed:       $b"
  [ "$a" = "$b" ] || fail "$name: the resumed run's losses differ"
  for f in $(cd "$work/$name-u/step_$steps" && ls *.safetensors); do
    cmp "$work/$name-u/step_$steps/$f" "$work/$name-k/step_$steps/$f" ||
      fail "$name: step_$steps/$f differs after the resume"
  done
}
resumed_same 1-rank 1 8
[ "$mpi" = yes ] && resumed_same 2-ranks 2 8

echo "== 2b. resumed with quantized states (torchao's AdamW8bit on 1 rank, AdamW4bit on 2): the same"
# codes two a byte and a scale a block, written flat and read back into
# each rank's pieces
resumed_same adamw8bit 1 6 optimizer._component_=torchao.optim.AdamW8bit
[ "$mpi" = yes ] && resumed_same adamw4bit 2 6 optimizer._component_=torchao.optim.AdamW4bit
"$python" - "$work/adamw8bit-u/step_6/optimizer.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
k = "model.layers.0.self_attn.q_proj.weight"
codes, scale = h[k + ".exp_avg"], h[k + ".exp_avg.scale"]
n = 1
for d in codes["shape"]:
    n *= d
assert codes["dtype"] == "U8" and scale["dtype"] == "F32" and scale["shape"] == [(n + 255) // 256], (codes, scale)
print("optimizer.safetensors: %s.exp_avg U8 %s, its scale F32 %s" % (k, codes["shape"], scale["shape"]))
PY

echo "== 3. started from a checkpoint directory, lr 0: the weights come back unchanged"
files="checkpointer.checkpoint_files={filename_format: \"model-{}-of-{}.safetensors\", max_filename: \"$(printf %05d "$n")\"}"
run max_steps=2 output_dir="$work/z" checkpointer.checkpoint_dir="$d" "$files" optimizer.lr=0 2> "$work/z.log" \
  || { cat "$work/z.log"; fail "the run from $d failed"; }
for f in $(cd "$d" && ls model*.safetensors); do
  cmp "$d/$f" "$work/z/step_2/$f" || fail "$f changed with lr 0"
done
cmp "$d/config.json" "$work/z/step_2/config.json" || fail "config.json was not copied as it was"
echo "fp32: $n shards identical"
run max_steps=2 output_dir="$work/b" dtype=bf16 2> "$work/b.log"
bd=$work/b/step_2
nb=$(ls "$bd" | grep -c '^model-.*safetensors$')
grep -q BF16 "$bd/model-00001-of-$(printf %05d "$nb").safetensors" || fail "the bf16 run did not write BF16"
bfiles="checkpointer.checkpoint_files={filename_format: \"model-{}-of-{}.safetensors\", max_filename: \"$(printf %05d "$nb")\"}"
run max_steps=2 output_dir="$work/bz" dtype=bf16 checkpointer.checkpoint_dir="$bd" "$bfiles" optimizer.lr=0 \
  2> "$work/bz.log" || { cat "$work/bz.log"; fail "the bf16 run from $bd failed"; }
for f in $(cd "$bd" && ls model*.safetensors); do
  cmp "$bd/$f" "$work/bz/step_2/$f" || fail "bf16: $f changed with lr 0"
done
echo "bf16: $nb shards identical (kept as stored)"
run max_steps=1 output_dir="$work/bw" checkpointer.checkpoint_dir="$bd" "$bfiles" optimizer.lr=0 checkpointer.max_shard_size=5GB \
  2> "$work/bw.log" || { cat "$work/bw.log"; fail "the fp32 run from bf16 weights failed"; }
"$python" - "$bd" "$work/bw/step_1/model.safetensors" <<'PY'
import json, os, struct, sys
def header(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n, p
def tensors(paths):
    out = {}
    for p in paths:
        h, base, _ = header(p)
        for k, v in h.items():
            if k != "__metadata__":
                out[k] = (p, base, v)
    return out
bd, wide = sys.argv[1], sys.argv[2]
src = tensors([os.path.join(bd, f) for f in os.listdir(bd) if f.startswith("model-")])
dst = tensors([wide])
assert set(src) == set(dst), set(src) ^ set(dst)
for k, (p, base, v) in src.items():
    q, qbase, w = dst[k]
    assert v["dtype"] == "BF16" and w["dtype"] == "F32" and v["shape"] == w["shape"], (k, v, w)
    with open(p, "rb") as f:
        f.seek(base + v["data_offsets"][0]); a = f.read(v["data_offsets"][1] - v["data_offsets"][0])
    with open(q, "rb") as f:
        f.seek(qbase + w["data_offsets"][0]); b = f.read(w["data_offsets"][1] - w["data_offsets"][0])
    # bf16 widened: the high half of each f32, the low half zero
    assert all(b[4 * i:4 * i + 2] == b"\0\0" and b[4 * i + 2:4 * i + 4] == a[2 * i:2 * i + 2] for i in range(len(a) // 2)), k
print("fp32 recipe from bf16 weights: %d tensors widened exactly, written F32 in one model.safetensors" % len(src))
PY

echo "== 4. bad checkpoints are refused, naming what is wrong"
expect() { # expect LOG NEEDLE...: the run failed and its log has every needle
  log=$1; shift
  for s in "$@"; do grep -qF -- "$s" "$log" || { cat "$log"; fail "the error does not mention '$s'"; }; done
  grep 'error:' "$log" | head -2
}
cp -r "$d" "$work/bad"
rm "$work/bad/model-00002-of-$(printf %05d "$n").safetensors"
if run max_steps=1 output_dir="$work/x1" checkpointer.checkpoint_dir="$work/bad" "$files" 2> "$work/x1.log"; then
  fail "a missing shard was accepted"
fi
expect "$work/x1.log" "model-00002-of-$(printf %05d "$n").safetensors"
rm -rf "$work/bad"; cp -r "$d" "$work/bad"
"$python" - "$work/bad/model.safetensors.index.json" <<'PY'
import json, sys
p = sys.argv[1]; idx = json.load(open(p))
del idx["weight_map"]["model.layers.1.self_attn.q_proj.weight"]
json.dump(idx, open(p, "w"), indent=2)
PY
if run max_steps=1 output_dir="$work/x2" checkpointer.checkpoint_dir="$work/bad" "$files" 2> "$work/x2.log"; then
  fail "a tensor missing from the index was accepted"
fi
expect "$work/x2.log" "model.layers.1.self_attn.q_proj.weight" "model.safetensors.index.json"
if run max_steps=1 output_dir="$work/x3" checkpointer.checkpoint_dir="$d" "$files" model.num_layers=2 2> "$work/x3.log"; then
  fail "a config.json with other dims was accepted"
fi
expect "$work/x3.log" "model.num_layers is 2" "config.json has num_hidden_layers = 4"
if run max_steps=1 output_dir="$work/x4" checkpointer.checkpoint_dir="$d" \
    'checkpointer.checkpoint_files={filename_format: "model-{}.safetensors", max_filename: "00003"}' 2> "$work/x4.log"; then
  fail "a filename_format with one placeholder was accepted"
fi
expect "$work/x4.log" "exactly two"
if run max_steps=1 output_dir="$work/x5" '~checkpointer.checkpoint_dir' 2> "$work/x5.log"; then
  fail "checkpoint_files: [] with no checkpoint_dir was accepted (a random start, silently)"
fi
expect "$work/x5.log" "scout_tiny_full.yaml:47:3: error: checkpointer.checkpoint_files: given without a checkpoint_dir"
echo "ok"
