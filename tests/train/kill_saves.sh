#!/usr/bin/env bash
# Checkpoints survive kill -9 at any moment of a save, on the tiny Scout
# config saving every step (save_every_n_steps=1):
#   1. kill -9 after a random delay (seeded), at least 50 times (and until
#      one kill has landed mid-save, at most 200), each run
#      resuming where the killed one left off: after every kill `latest`
#      names a complete checkpoint (every file there, each safetensors file
#      whole, recipe_state.json's step its N), no step_N is incomplete, and
#      every loss any run logged is the uninterrupted run's at that step;
#      the chain's last checkpoint is the uninterrupted one, byte for byte;
#   2. (with strace's fault injection: no hook in optc) a kill at each file
#      operation of one save in turn, from its mkdir to the pruning of the
#      step before (keep_last_n_checkpoints=1): every mkdir, file creation,
#      rename, unlink and rmdir, and the first write of each file, each
#      followed by the same checks, then a resume to the uninterrupted run's
#      losses and weights, and no temporary files left.
#   kill_saves.sh OPTC PYTHON ROOT [MPI]
set -u
optc=$1 python=$2 root=$3
cfg=$root/recipes/configs/llama4/scout_tiny_full.yaml
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
small="dataset.num_samples=400 save_every_n_steps=1"
run() { "$optc" run full_finetune_distributed --config "$cfg" $small "$@"; }
fail() { echo "FAIL: $*"; exit 1; }
N=6
KILLS=${KILL_SAVES_KILLS:-50}

# check.py REF: reads lines "DIR [EXPECT_LATEST]" and answers each with a
# line, "ok LATEST" or "FAIL: ...", about DIR's checkpoints and losses (one
# process for all the checks: python's start-up would double the test's time)
cat > "$work/check.py" <<'PY'
import json, os, re, struct, sys
class Bad(Exception):
    pass
def whole(p):  # a safetensors file: its header parses and its size is what the header says
    with open(p, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise Bad("%s is truncated" % p)
        n = struct.unpack("<Q", raw)[0]
        h = json.loads(f.read(n))
    end = max([v["data_offsets"][1] for k, v in h.items() if k != "__metadata__"] + [0])
    if os.path.getsize(p) != 8 + n + end:
        raise Bad("%s is %d bytes, its header says %d" % (p, os.path.getsize(p), 8 + n + end))
def complete(d, s):
    p = os.path.join(d, s)
    names = set(os.listdir(p))
    for f in ("config.json", "optimizer.safetensors", "recipe_state.json"):
        if f not in names:
            raise Bad("%s has no %s (it has %s)" % (s, f, sorted(names)))
    if any(".tmp." in f for f in names):
        raise Bad("%s has temporary files: %s" % (s, sorted(names)))
    if "model.safetensors" in names:
        whole(os.path.join(p, "model.safetensors"))
    else:
        idx = json.load(open(os.path.join(p, "model.safetensors.index.json")))
        for f in set(idx["weight_map"].values()):
            whole(os.path.join(p, f))
    whole(os.path.join(p, "optimizer.safetensors"))
    st = json.load(open(os.path.join(p, "recipe_state.json")))
    if "step_%d" % st["step"] != s:
        raise Bad("%s/recipe_state.json says step %d" % (s, st["step"]))
def check(d, want, refl):
    if not os.path.isdir(d):  # killed before it made its output_dir
        if want:
            raise Bad("no output_dir")
        return "-"
    latest = None
    if os.path.exists(os.path.join(d, "latest")):
        latest = open(os.path.join(d, "latest")).read().strip()
        if not os.path.isdir(os.path.join(d, latest)):
            raise Bad("latest names '%s', which is not there" % latest)
    if want is not None and latest != want:
        raise Bad("latest is %s, expected %s" % (latest, want))
    for s in os.listdir(d):
        if re.fullmatch(r"step_\d+", s):
            complete(d, s)
    m = os.path.join(d, "logs", "metrics.jsonl")
    for i, l in enumerate(open(m) if os.path.exists(m) else []):
        j = json.loads(l)
        if j["loss"] != refl[j["step"]]:
            raise Bad("metrics.jsonl line %d: step %d loss %r, uninterrupted %r" % (i + 1, j["step"], j["loss"], refl[j["step"]]))
    return latest or "-"
refl = {}
for l in open(sys.argv[1]):
    j = json.loads(l); refl[j["step"]] = j["loss"]
for line in sys.stdin:
    args = line.split()
    try:
        print("ok", check(args[0], args[1] if len(args) > 1 else None, refl))
    except Exception as e:
        print("FAIL: %s: %s" % (args[0], e))
    sys.stdout.flush()
PY
# check DIR [EXPECT_LATEST]: sets $at to what latest names, or says why not
# and fails (not in a subshell: the checker's pipes are this shell's)
check() {
  echo "$@" >&"${CHECK[1]}"
  local answer
  read -r answer <&"${CHECK[0]}" || fail "the checker died"
  case $answer in
    ok\ *) at=${answer#ok } ;;
    *) echo "$answer"; return 1 ;;
  esac
}
same_weights() { # same_weights DIR STEP: DIR/step_STEP's safetensors are the reference's
  for f in $(cd "$work/ref/step_$2" && ls *.safetensors); do
    cmp -s "$work/ref/step_$2/$f" "$1/step_$2/$f" || fail "$1/step_$2/$f differs from the uninterrupted run's"
  done
}

echo "== the uninterrupted run ($N steps, a checkpoint every step)"
run max_steps=$N output_dir="$work/ref" 2> "$work/ref.log" || { cat "$work/ref.log"; fail "the reference run failed"; }
coproc CHECK { "$python" "$work/check.py" "$work/ref/logs/metrics.jsonl"; }
# timed again, warm: the kills' delays span one whole run
t0=$(date +%s%N)
run max_steps=$N output_dir="$work/ref2" 2> "$work/ref2.log" || { cat "$work/ref2.log"; fail "the reference run failed"; }
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "took ${ms} ms"
check "$work/ref" step_$N || exit 1

echo "== 1. $KILLS kills at random moments (delays in [0, $((ms * 4 / 5))] ms, seed 17)"
RANDOM=17
chain=0 kills=0 midsave=0 done_runs=0
d=$work/c$chain
# At least KILLS kills, and on until one has landed mid-save (a save is a
# few percent of a run, and shorter with the machine quiet), at most 4x.
while [ $kills -lt "$KILLS" ] || { [ $midsave -eq 0 ] && [ $kills -lt $((KILLS * 4)) ]; }; do
  res=
  [ -f "$d/latest" ] && res=resume_from_checkpoint=true
  # exec: $! is optc itself, not a subshell that would die leaving it running
  (exec "$optc" run full_finetune_distributed --config "$cfg" $small max_steps=$N output_dir="$d" $res 2>> "$d.log") &
  pid=$!
  delay=$(( RANDOM * ms * 4 / 5 / 32767 ))
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  rc=$?
  if [ $rc = 0 ]; then # it finished first: this chain is over
    check "$d" step_$N || exit 1
    same_weights "$d" $N
    done_runs=$((done_runs + 1))
    chain=$((chain + 1)); d=$work/c$chain
    continue
  fi
  [ $rc = 137 ] || { tail -5 "$d.log"; fail "a run ended with status $rc before it was killed"; }
  kills=$((kills + 1))
  ls -a "$d" 2>/dev/null | grep -q '\.tmp\.' && midsave=$((midsave + 1))
  check "$d" || exit 1
  printf '%s ' "$at"
done
echo
res=
[ -f "$d/latest" ] && res=resume_from_checkpoint=true
run max_steps=$N output_dir="$d" $res 2>> "$d.log" || { tail -5 "$d.log"; fail "the last resume failed"; }
check "$d" step_$N || exit 1
same_weights "$d" $N
echo "$kills kills ($midsave left a save's temporary files behind), $((done_runs + 1)) chains run to the end:"
echo "latest always complete, every logged loss the uninterrupted run's, the final weights identical"
[ $midsave -gt 0 ] || fail "no kill landed in a save"

echo "($SECONDS s)"
echo "== 2. a kill at each file operation of the save of step 2"
if ! command -v strace > /dev/null || ! strace -f -qq -o /dev/null true 2> /dev/null; then
  echo "SKIP: no strace (or no ptrace) here: part 2 cannot run (part 1 passed)"
  exit 77
fi
sys=openat,write,rename,renameat2,mkdir,unlink,rmdir,fsync
# LeakSanitizer cannot run under ptrace: under ASan the traced runs check no leaks
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
prune=checkpointer.keep_last_n_checkpoints=1
strace -f -qq -o "$work/trace" -e trace=$sys "$optc" run full_finetune_distributed --config "$cfg" $small max_steps=3 \
  output_dir="$work/t" $prune 2> "$work/t.log" \
  || { cat "$work/t.log"; fail "the traced run failed"; }
# each point: SYSCALL ORDINAL (its number among the main thread's calls of it) WHAT
"$python" - "$work/trace" > "$work/points" <<'PY'
import re, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1])]
main = lines[0].split()[0]
count, calls = {}, []
for l in lines:
    m = re.match(r"(\d+)\s+(\w+)\((.*)", l)
    if not m or m.group(1) != main:
        continue
    name = m.group(2)
    count[name] = count.get(name, 0) + 1
    args = m.group(3)
    calls.append((name, count[name], ("O_CREAT " if "O_CREAT" in args else "") + args[:90]))
first = next(i for i, c in enumerate(calls) if c[0] == "mkdir" and ".step_2.tmp." in c[2])
last = max(i for i, c in enumerate(calls) if c[0] in ("unlink", "rmdir", "rename") and "step_1" in c[2])
# A kill at a call leaves what the calls before it did: only the calls that
# change the directories make new states (a kill -9 keeps the page cache, so
# an fsync makes none), and the first write of a file stands for the rest.
for i in range(first, last + 1):
    name, k, what = calls[i]
    if name in ("fsync", "openat") and not what.startswith("O_CREAT"):
        continue
    if name == "write" and calls[i - 1][0] == "write":
        continue
    print(name, k, i - first, what)
PY
n=$(wc -l < "$work/points")
commit=$(grep -n '^rename .*"[^"]*/step_2")' "$work/points" | cut -d: -f1)
named=$(grep -n '^rename .*latest' "$work/points" | cut -d: -f1)
[ -n "$commit" ] && [ -n "$named" ] || fail "no rename to step_2 or latest in the trace: $(cat "$work/points")"
echo "$n points, from mkdir .step_2.tmp.PID to the removal of step_1"
i=0
while read -r name k _ what; do
  i=$((i + 1))
  t=$work/p$i
  # (...; exit): bash's "Killed" goes to the subshell's stderr, not the log
  (strace -f -qq -o /dev/null -e trace="$name" -e inject="$name":signal=KILL:when="$k" \
    "$optc" run full_finetune_distributed --config "$cfg" $small max_steps=3 output_dir="$t" $prune 2> "$t.log"
   exit $?) 2> /dev/null
  rc=$?
  [ $rc = 137 ] || { tail -3 "$t.log"; fail "point $i ($name #$k $what): status $rc, not killed"; }
  # the rename to latest is where step_2 becomes the checkpoint
  want=step_1
  [ $i -gt "$named" ] && want=step_2
  check "$t" $want || { echo "  at point $i: $name $what"; exit 1; }
  if [ $i -le "$commit" ] && [ -d "$t/step_2" ]; then fail "point $i ($name $what): step_2 is there before its rename"; fi
  run max_steps=3 output_dir="$t" $prune resume_from_checkpoint=true 2>> "$t.log" || { tail -3 "$t.log"; fail "point $i: the resume failed"; }
  check "$t" step_3 || { echo "  after the resume from point $i: $name $what"; exit 1; }
  same_weights "$t" 3
  [ "$(ls "$t" | grep -c '^step_')" = 1 ] || fail "point $i: keep_last_n_checkpoints=1 left $(ls "$t")"
  left=$(ls -a "$t" | grep '\.tmp\.')
  [ -z "$left" ] || fail "point $i ($name $what): the resumed run left $left"
  printf '%s#%s ' "$name" "$k"
  rm -rf "$t"
done < "$work/points"
echo
echo "ok: $n kill points, each resumed to the uninterrupted run's losses and weights ($SECONDS s)"
