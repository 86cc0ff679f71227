#!/usr/bin/env bash
# gpu_pack.sh: build what bench/gpu_check.sh runs, for a GPU machine that has
# the CUDA driver and toolkit but not LLVM, libyaml or OpenBLAS (and nothing
# to install them from).
#
#   bench/gpu_pack.sh [DIR]      DIR defaults to .gpu/ (git ignores it)
#
# Configures build-gpu/ without LLVM and MPI (the GPU backend and the
# interpreter it is checked against need neither), builds optc, gpu_bench
# and test_gpu, and copies them into DIR with DIR/lib holding every shared
# library they load that is not glibc's or the CUDA toolkit's. Then, there:
#
#   bench/gpu_check.sh --prebuilt DIR
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

if [ ! -f build-gpu/build.ninja ]; then
  meson setup build-gpu --native-file native.ini -Dllvm=disabled -Dmpi=disabled -Dnccl=disabled \
    -Dcuda=enabled -Dtoolkit_dir="$CUDA_HOME"
fi
ninja -C build-gpu optc gpu_bench tests/test_gpu
rm -rf "$DIR.tmp"
mkdir -p "$DIR.tmp/lib"
cp build-gpu/optc build-gpu/gpu_bench build-gpu/tests/test_gpu "$DIR.tmp/"
# glibc's own libraries and the toolkit's come from the GPU machine
ldd build-gpu/optc build-gpu/gpu_bench build-gpu/tests/test_gpu |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | grep -v -F "$CUDA_HOME" |
  while read -r lib; do cp -L "$lib" "$DIR.tmp/lib/"; done
if ldd "$DIR.tmp/optc" | grep -q 'libLLVM'; then
  echo "gpu_pack.sh: error: build-gpu/ links LLVM; reconfigure it with -Dllvm=disabled" >&2
  exit 1
fi
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
du -sh "$DIR"
ls "$DIR" "$DIR/lib"
