#!/usr/bin/env bash
# Every .optir file under recipes/ and tests/ that is meant to parse is in
# canonical form: `optc --emit=ir F` prints F back byte for byte. (Files
# whose RUN line expects a failure, with %not, are the malformed programs;
# tests/fuzz holds fuzz seeds and reproducers, which need not parse.)
set -u
optc=$1
root=$2
fail=0
n=0
while IFS= read -r -d '' f; do
  grep -q 'RUN: %not' "$f" && continue
  n=$((n + 1))
  if ! "$optc" --emit=ir "$f" | cmp -s - "$f"; then
    echo "FAIL: $f does not round-trip:"
    "$optc" --emit=ir "$f" | diff -u "$f" - | head -20
    fail=1
  fi
done < <(find "$root/recipes" "$root/tests" -path "$root/tests/fuzz" -prune -o -name '*.optir' -print0)
echo "$n .optir files checked"
[ "$n" -gt 0 ] || fail=1
exit $fail
