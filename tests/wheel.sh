#!/usr/bin/env bash
# wheel.sh: the wheel, installed as a user installs it, run with the
# libraries it was built from out of the loader's reach.
#
#   tests/wheel.sh SOURCE_ROOT WORK_DIR DEV_LIBOPTC
#
# 1. tools/build_wheel.sh makes it (in build-pip/, which ./setup.sh's
#    pip install . has built: then it only packs) into WORK_DIR/dist: at
#    most 40 MB, py3-none-manylinux_2_36_x86_64, no NVRTC inside.
# 2. A fresh venv gets it (pip, --no-index), and .venv's torch through a
#    .pth, which goes after the venv's own site-packages: the wheel's optc
#    is imported, not .venv's (optc.__file__ and the library's path are
#    checked).
# 3. readelf -d on the installed liboptc: NEEDED only glibc's libraries,
#    libstdc++ and libgcc_s; no RPATH or RUNPATH. nm -D: nothing defined
#    but optc_*, nothing undefined but glibc's, libstdc++'s and libgcc's
#    (versioned) and a few weak hooks.
# 4. Beside another LLVM: the system's libLLVM (19, and 14 and 15 where
#    they are) loaded RTLD_GLOBAL first, optc's CPU steps, and theirs used.
# 5. In a mount namespace (unshare -m) that hides /usr/lib/llvm-*, every
#    libLLVM*, libyaml*, libjansson*, libzstd*, libz3* and libxml2* of the
#    system, the CUDA toolkit (/usr/local/cuda and the folder it links to)
#    and the CUDA headers of torch's NVIDIA wheels: the dev build's liboptc
#    (linked to the shared libraries) cannot load, and the wheel's runs
#    `import optc.torch`, the README's PyTorch example, and builds a CUDA
#    step with torch's NVRTC (no toolkit header anywhere).
# 6. As 5, with every NVRTC hidden too: torch's CUDA build cannot load
#    then (it needs NVRTC itself), so optc alone: its CPU step runs, and a
#    CUDA step fails with the one line that says NVRTC was not found and
#    where optc looked.
# Files are hidden by bind mounts: /dev/null over each library file; an
# empty folder over a folder; and for torch's nvidia/*/lib, whose other
# libraries torch needs, a tmpfs folder of links to everything in it but
# libnvrtc*, mounted over it.
#
# Needs root (unshare -m) and .venv with torch (./setup.sh test makes it;
# $OPTC_TEST_VENV names another). Without them it skips (77), except
# under CI (CI=true), where it fails.
set -euo pipefail

fail() { echo "wheel.sh: FAIL: $*" >&2; exit 1; }
skip() {
  [ -z "${CI:-}" ] || fail "$* (CI=true: this test must run)"
  echo "SKIP: $*"
  exit 77
}

# ---- inside the namespace (the script runs itself again under unshare -m) ----------
hide_file() { # FILE: /dev/null over the file it names (through links)
  local f
  f=$(readlink -f "$1")
  if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
}
hide_dir() { # DIR: an empty folder over it
  if [ -d "$1" ]; then mount --bind "$NS/empty" "$(readlink -f "$1")"; fi
}
hide_in_dir() { # DIR GLOB: DIR without the files GLOB matches
  local dir k f
  dir=$(readlink -f "$1")
  k=$((${K:-0} + 1)) K=$k
  mkdir -p "$NS/orig$k" "$NS/copy$k"
  mount --bind "$dir" "$NS/orig$k"
  for f in "$NS/orig$k"/*; do
    # shellcheck disable=SC2254
    case "${f##*/}" in $2) ;; *) ln -s "$f" "$NS/copy$k/" ;; esac
  done
  mount --bind "$NS/copy$k" "$dir"
}
if [ "${1:-}" = --inside ]; then
  shift
  MODE=$1 NS=$2 SITE=$3 NVIDIA=$4
  shift 4
  mount -t tmpfs optc-wheel-test "$NS"
  mkdir "$NS/empty"
  for d in /usr/lib/llvm-* /usr/local/cuda /usr/local/cuda-* "$NVIDIA"/*/include; do
    hide_dir "$d"
  done
  for f in /usr/lib/x86_64-linux-gnu/lib{LLVM,yaml,jansson,zstd,z3,xml2}[.-]*so*; do
    hide_file "$f"
  done
  if [ "$MODE" = no-nvrtc ]; then
    for d in "$NVIDIA"/*/lib; do
      hide_in_dir "$d" 'libnvrtc*'
    done
    for f in /usr/lib/x86_64-linux-gnu/libnvrtc*; do
      hide_file "$f"
    done
  fi
  exec "$@"
fi

# ---- outside -------------------------------------------------------------------------
ROOT=$(cd "$1" && pwd)
WORK=$2
DEV_LIB=$3
VENV=${OPTC_TEST_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
[ -x "$PY" ] && "$PY" -c 'import torch, mesonpy, auditwheel' 2>/dev/null ||
  skip "no $VENV with torch, meson-python and auditwheel (./setup.sh test makes it)"
[ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null || skip "unshare -m needs root"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

echo "== 1. the wheel"
t0=$(date +%s)
WHL=$(PYTHON=$PY "$ROOT/tools/build_wheel.sh" "$WORK/dist" | tail -1)
size=$(stat -c %s "$WHL")
echo "$WHL: $size bytes ($(( $(date +%s) - t0 )) s)"
[[ $(basename "$WHL") == optc-*-py3-none-manylinux_2_36_x86_64.whl ]] || fail "tag: $(basename "$WHL")"
[ "$size" -le $((40 << 20)) ] || fail "the wheel is over 40 MB"
"$PY" - "$WHL" <<'EOF' || fail "the wheel's contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
libs = [n for n in names if ".so" in n.rsplit("/", 1)[-1]]
assert not [n for n in names if "nvrtc" in n.lower()], names
assert len(libs) == 1 and libs[0].startswith("optc/liboptc.so"), libs
print("in it:", libs[0], "and", len(names) - 1, "other files")
EOF

echo "== 2. a fresh venv"
rm -rf "$WORK/venv"
BASE=$("$PY" -c 'import sys; print(sys._base_executable)')
"$BASE" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-index --no-deps "$WHL"
SITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
TORCH_SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$TORCH_SITE" > "$SITE/optc_test_torch.pth"
NVIDIA=$TORCH_SITE/nvidia
LIB=$(ls "$SITE"/optc/liboptc.so*)
echo "installed: $LIB; torch from $TORCH_SITE"

echo "== 3. what the installed liboptc needs"
readelf -d "$LIB" | grep -E 'NEEDED|RPATH|RUNPATH'
bad=$(readelf -d "$LIB" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
  grep -v -x -E 'lib(c|m|dl|rt|pthread)\.so\.[0-9]+|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1' || true)
[ -z "$bad" ] || fail "liboptc needs $bad"
! readelf -d "$LIB" | grep -q -E 'RPATH|RUNPATH' || fail "liboptc has an RPATH or RUNPATH"
bad=$(nm -D --defined-only "$LIB" | awk '$3 !~ /^optc_/ && $2 != "A"' | head -5)
[ -z "$bad" ] || fail "liboptc exports more than optc_*: $bad"
# Weak hooks nobody defines: the toolchain's, and zstd's tracing (LLVM's
# zstd calls them only when compressing debug sections, which optc never does).
bad=$(nm -D --undefined-only "$LIB" | grep -v -E '@(GLIBC|GLIBCXX|CXXABI|GCC)_' |
  grep -v -E ' w (__gmon_start__|_ITM_(de)?registerTMCloneTable|__morestack|ZSTD_trace_compress_(begin|end))$' || true)
[ -z "$bad" ] || fail "liboptc binds symbols outside glibc and libstdc++: $bad"
echo "NEEDED: glibc, libstdc++, libgcc_s; exported: optc_* only"

CHECK=$ROOT/tests/wheel_check.py
RUN=(env -u OPTC_LIBRARY -u OPTC_NVRTC -u CUDA_HOME -u LD_LIBRARY_PATH -u PYTHONPATH OPTC_CACHE=0
  "$WORK/venv/bin/python" "$CHECK")

echo "== 4. beside another LLVM in the process"
others=()
for f in /usr/lib/x86_64-linux-gnu/libLLVM.so.19.1 /usr/lib/x86_64-linux-gnu/libLLVM-1[45].so.1; do
  [ -f "$f" ] && others+=("$f")
done
[ ${#others[@]} -gt 0 ] || fail "no system libLLVM to load beside optc's (llvm-19-dev is installed by setup.sh)"
"${RUN[@]}" clash "$SITE" "$ROOT/README.md" "${others[@]}"

echo "== 5. LLVM, libyaml, jansson and the CUDA toolkit hidden"
mkdir -p "$WORK/ns"
# the control: the dev build's liboptc, where it needs the shared libLLVM
# (readelf itself needs libzstd, which the namespace hides)
readelf -d "$DEV_LIB" | grep -q 'NEEDED.*libLLVM' || DEV_LIB=-
unshare -m "$0" --inside hidden "$WORK/ns" "$SITE" "$NVIDIA" "${RUN[@]}" hidden "$SITE" "$ROOT/README.md" "$DEV_LIB"

echo "== 6. NVRTC hidden too"
unshare -m "$0" --inside no-nvrtc "$WORK/ns" "$SITE" "$NVIDIA" "${RUN[@]}" no-nvrtc "$SITE"
echo "wheel.sh: OK"
