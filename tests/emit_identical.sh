#!/bin/sh
# emit_identical.sh: what the compiler writes for every recipe and .optir
# in the tree, saved to a folder, so that two builds can be compared byte
# for byte (a refactor must change none of it).
#
#   tests/emit_identical.sh snap OPTC OUTDIR   run OPTC over every input, from
#                                             the source root, into OUTDIR
#   tests/emit_identical.sh diff A B           compare two snapshots; 0 when
#                                             every file is the same
#
# The inputs: every .yaml under recipes/ and tests/ (non-recipes included:
# their error text is compared too), every .optir in the tree, and the
# bundled configs by name. For each: --emit=ir, --emit=plan, --emit=llvm and
# --emit=asm for four CPUs, and --target=cuda --emit=cuda. Each output file
# holds stdout, then stderr, then the exit status. Paths are given relative
# to the source root, so the snapshots of two checkouts compare equal.
# JOBS (default: the cores) runs that many at once.
set -eu

case "${1:-}" in
snap)
  [ $# -eq 3 ] || { echo "usage: $0 snap OPTC OUTDIR" >&2; exit 2; }
  optc=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
  out=$3
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  root=$(cd "$(dirname "$0")/.." && pwd)
  cd "$root"
  list=$(mktemp)
  trap 'rm -f "$list"' EXIT
  {
    git ls-files 'recipes/*.yaml' 'tests/*.yaml' '*.optir' 2>/dev/null || find recipes tests -name '*.yaml' -o -name '*.optir'
    echo llama4/scout_17B_16E_full
    echo llama4/maverick_17B_128E_full
    echo llama4/scout_tiny_full
  } | sort -u >"$list"
  cpus="skylake-avx512 znver4 haswell sapphirerapids"
  # one line per run: INPUT TAG ARGS...
  while read -r f; do
    echo "$f ir --emit=ir"
    echo "$f plan --emit=plan"
    for c in $cpus; do
      echo "$f llvm.$c --emit=llvm --cpu=$c"
      echo "$f asm.$c --emit=asm --cpu=$c"
    done
    echo "$f cuda --target=cuda --emit=cuda --arch=sm_90"
  done <"$list" | OPTC_CACHE=0 OPTC="$optc" OUT="$out" xargs -P "${JOBS:-$(nproc)}" -L 1 sh -c '
    f=$1 tag=$2; shift 2
    dst="$OUT/$(printf %s "$f" | tr / _).$tag"
    rc=0
    "$OPTC" compile "$f" "$@" >"$dst.stdout" 2>"$dst.stderr" || rc=$?
    { cat "$dst.stdout"; echo "----- stderr"; cat "$dst.stderr"; echo "----- exit $rc"; } >"$dst"
    rm -f "$dst.stdout" "$dst.stderr"' sh
  echo "$(ls "$out" | wc -l) outputs in $out"
  ;;
diff)
  [ $# -eq 3 ] || { echo "usage: $0 diff A B" >&2; exit 2; }
  if diff -r -q "$2" "$3"; then
    echo "identical: $(ls "$2" | wc -l) outputs"
  else
    echo "DIFFERENT (diff -r $2 $3)" >&2
    exit 1
  fi
  ;;
*)
  echo "usage: $0 snap OPTC OUTDIR | diff A B" >&2
  exit 2
  ;;
esac
