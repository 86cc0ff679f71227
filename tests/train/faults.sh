#!/usr/bin/env bash
# Faults end cleanly, on the tiny Scout config: one error line, a non-zero
# exit, and nothing half-written (no step_N incomplete, `latest` unchanged
# and naming a complete checkpoint, no temporary files left):
#   1. a full disk: a 16 MB tmpfs, where the first checkpoint fits and the
#      second does not, and a 2 MB one, where none does (without permission
#      to mount: a file-size limit, ulimit -f with SIGXFSZ ignored, so that
#      writes fail with EFBIG, which no checkpoint fits);
#   2. resuming a corrupt checkpoint: model.safetensors truncated,
#      optimizer.safetensors's header garbled, recipe_state.json not JSON,
#      or with a field missing or not an integer, `latest` naming a missing
#      directory or empty: the error names the file, and the output
#      directory is left byte for byte as it was;
#   3. (MPI) a rank killed -9 mid-run under --nproc 2 ends the job within
#      20 s, naming the rank; `latest` names a complete checkpoint, from
#      which the run resumes, removing the dead save's temporary directory.
#   faults.sh OPTC PYTHON ROOT [MPI]
set -u
optc=$1 python=$2 root=$3 mpi=${4:-yes}
cfg=$root/recipes/configs/llama4/scout_tiny_full.yaml
work=$(mktemp -d)
mnt=
trap '[ -n "$mnt" ] && umount "$mnt" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
small="dataset.num_samples=400 save_every_n_steps=1"
run() { "$optc" run full_finetune_distributed --config "$cfg" $small "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

# tree.py DIR LATEST [TMP_OK]: LATEST ('-': none) is what `latest` names,
# every step_N there is complete, and (unless TMP_OK) no temporary names
cat > "$work/tree.py" <<'PY'
import json, os, re, struct, sys
d, want = sys.argv[1], sys.argv[2]
tmp_ok = len(sys.argv) > 3
def bad(msg):
    print("FAIL: %s: %s" % (d, msg)); sys.exit(1)
def whole(p):
    with open(p, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            bad("%s is truncated" % p)
        n = struct.unpack("<Q", raw)[0]
        h = json.loads(f.read(n))
    end = max([v["data_offsets"][1] for k, v in h.items() if k != "__metadata__"] + [0])
    if os.path.getsize(p) != 8 + n + end:
        bad("%s is %d bytes, its header says %d" % (p, os.path.getsize(p), 8 + n + end))
latest = "-"
if os.path.exists(os.path.join(d, "latest")):
    latest = open(os.path.join(d, "latest")).read().strip()
if latest != want:
    bad("latest is '%s', expected '%s'" % (latest, want))
for s in sorted(os.listdir(d)):
    if ".tmp." in s and not tmp_ok:
        bad("a temporary name is left: %s" % s)
    if not re.fullmatch(r"step_\d+", s):
        continue
    names = os.listdir(os.path.join(d, s))
    for f in ("model.safetensors", "config.json", "optimizer.safetensors", "recipe_state.json"):
        if f not in names:
            bad("%s is incomplete: no %s (it has %s)" % (s, f, sorted(names)))
    if [f for f in names if ".tmp." in f]:
        bad("%s has temporary files: %s" % (s, sorted(names)))
    whole(os.path.join(d, s, "model.safetensors"))
    whole(os.path.join(d, s, "optimizer.safetensors"))
    if json.load(open(os.path.join(d, s, "recipe_state.json")))["step"] != int(s[5:]):
        bad("%s/recipe_state.json has another step" % s)
print("  %s: latest %s, %s" % (d, latest, " ".join(sorted(s for s in os.listdir(d) if s not in ("logs", "latest")))))
PY
tree() { "$python" "$work/tree.py" "$@" || exit 1; }
# one_error LOG NEEDLE: the run's stderr has exactly one error line, naming NEEDLE
one_error() {
  n=$(grep -c 'error:' "$1")
  [ "$n" = 1 ] || { cat "$1"; fail "$n error lines, expected one"; }
  grep -qF -- "$2" "$1" || { cat "$1"; fail "the error does not name '$2'"; }
  echo "  $(grep 'error:' "$1")"
}

echo "== 1. a full disk"
full_disk() { # full_disk MB LATEST
  d=$mnt/o$1
  run max_steps=4 output_dir="$d" 2> "$work/full$1.log" && fail "a run on a full disk succeeded"
  one_error "$work/full$1.log" "No space left on device"
  tree "$d" "$2"
  rm -rf "$d"
}
mnt=$work/mnt
mkdir -p "$mnt"
if mount -t tmpfs -o size=16m tmpfs "$mnt" 2> /dev/null; then
  echo "-- a 16 MB tmpfs: step_1 (11 MB) fits, step_2 does not"
  full_disk 16 step_1
  umount "$mnt"
  mount -t tmpfs -o size=2m tmpfs "$mnt" || fail "cannot mount a second tmpfs"
  echo "-- a 2 MB tmpfs: no checkpoint fits"
  full_disk 2 -
  umount "$mnt"
  mnt=
else
  mnt=
  echo "-- no permission to mount a tmpfs: a 2 MB file-size limit instead (SIGXFSZ ignored: EFBIG)"
  d=$work/fsz
  (trap '' XFSZ; ulimit -f 2048; exec "$optc" run full_finetune_distributed --config "$cfg" $small max_steps=4 \
    output_dir="$d") 2> "$work/fsz.log" && fail "a run over the file-size limit succeeded"
  one_error "$work/fsz.log" "File too large"
  tree "$d" -
fi

echo "== 2. resuming a corrupt checkpoint"
run max_steps=2 output_dir="$work/good" 2> "$work/good.log" || { cat "$work/good.log"; fail "the run to corrupt failed"; }
tree "$work/good" step_2
snapshot() { (cd "$1" && find . -type f | sort | xargs md5sum); }
corrupt() { # corrupt NAME NEEDLE COMMAND...: COMMAND breaks $c, whose resume must fail naming NEEDLE
  name=$1 needle=$2; shift 2
  echo "-- $name"
  c=$work/$name
  rm -rf "$c"; cp -r "$work/good" "$c"
  "$@"
  before=$(snapshot "$c")
  run max_steps=4 output_dir="$c" resume_from_checkpoint=true 2> "$c.log" && { cat "$c.log"; fail "$name: the resume succeeded"; }
  one_error "$c.log" "$needle"
  [ "$(snapshot "$c")" = "$before" ] || fail "$name: the failed resume changed $c"
}
c=
corrupt truncated "$work/truncated/step_2/model.safetensors" eval 'truncate -s 1000000 "$c/step_2/model.safetensors"'
corrupt garbled "$work/garbled/step_2/optimizer.safetensors" \
  eval 'printf "garbage!garbage!" | dd of="$c/step_2/optimizer.safetensors" bs=1 seek=8 conv=notrunc 2> /dev/null'
corrupt not-json "$work/not-json/step_2/recipe_state.json" eval 'echo "{ not json" > "$c/step_2/recipe_state.json"'
corrupt no-world-size '"world_size"' eval 'echo "{\"step\": 2, \"epoch\": 0, \"batch\": 2}" > "$c/step_2/recipe_state.json"'
corrupt string-step '"step"' \
  eval 'echo "{\"step\": \"2\", \"epoch\": 0, \"batch\": 2, \"world_size\": 1}" > "$c/step_2/recipe_state.json"'
corrupt missing-dir "$work/missing-dir/step_9" eval 'echo step_9 > "$c/latest"'
corrupt empty-latest "$work/empty-latest/latest" eval ': > "$c/latest"'

echo "== 3. a rank killed under --nproc 2"
if [ "$mpi" != yes ]; then
  echo "SKIP: no MPI: part 3 cannot run (parts 1 and 2 passed)"
  exit 77
fi
m=$work/m
"$optc" run --nproc 2 full_finetune_distributed --config "$cfg" $small max_steps=100000 output_dir="$m" > "$work/m.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do
  [ -s "$m/latest" ] && break
  sleep 0.1
done
[ -s "$m/latest" ] || { kill $launcher; cat "$work/m.log"; fail "no checkpoint after 60 s"; }
sleep 0.3 # into a later step, or its save
victim=$(pgrep -f -- "output_dir=$m .*--mpi-rank" | sort -n | tail -1)
[ -n "$victim" ] || { cat "$work/m.log"; fail "no rank to kill"; }
kill -9 "$victim"
start=$(date +%s)
wait $launcher
rc=$?
took=$(( $(date +%s) - start ))
grep -E 'error:|rank [0-9]' "$work/m.log" | sed 's/^/  /'
[ $rc -ne 0 ] || fail "exit status 0 after a rank was killed"
[ $took -le 20 ] || fail "the job took ${took}s to end"
grep -qE "rank [0-9]" "$work/m.log" || { cat "$work/m.log"; fail "the message does not name the rank"; }
grep -qiE "signal 9|killed" "$work/m.log" || { cat "$work/m.log"; fail "the message does not say how the rank died"; }
[ "$(grep -c 'error:' "$work/m.log")" -le 1 ] || { cat "$work/m.log"; fail "more than one error line"; }
[ "$(pgrep -f -- "output_dir=$m .*--mpi-rank" | wc -l)" = 0 ] || fail "ranks are still running"
at=$(cat "$m/latest")
tree "$m" "$at" tmp-ok
next=$(( ${at#step_} + 1 ))
"$optc" run --nproc 2 full_finetune_distributed --config "$cfg" $small max_steps=$next output_dir="$m" \
  resume_from_checkpoint=true > "$work/m2.log" 2>&1 || { cat "$work/m2.log"; fail "the resume after the kill failed"; }
grep resuming "$work/m2.log" | sed 's/^/  /'
tree "$m" step_$next
echo "ok: exit $rc after ${took}s; resumed from $at to step_$next"
