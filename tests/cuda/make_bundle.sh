#!/usr/bin/env bash
# Packs test_cuda and cuda_bench with the shared libraries they resolve here (oneDNN, libgomp,
# cudart, ...; not glibc/libstdc++, which the device has, nor the 540 MB cuBLASLt, which ships with
# the device's CUDA) into DIR/bundle.tar.gz, and copies device_run.sh next to it. The device machine
# has no gtest/oneDNN, so the harness is built here and carried (docs/cuda.md).
# Usage: tests/cuda/make_bundle.sh BUILD_DIR DIR
set -euo pipefail
build="${1:?usage: make_bundle.sh BUILD_DIR DIR}"
dir="${2:?usage: make_bundle.sh BUILD_DIR DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$dir"
cp -L "$build/tests/test_cuda" "$build/bench/cuda_bench" "$stage/bin/"
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcublasLt.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
tar czf "$dir/bundle.tar.gz.tmp" -C "$stage" bin lib
mv "$dir/bundle.tar.gz.tmp" "$dir/bundle.tar.gz"
cp "$here/device_run.sh" "$dir/"
ls -la "$dir"
