#!/usr/bin/env bash
# Packs what the GPU run of the CUDA backend needs: test_cuda (kernel + seam harness + chain on
# the fixtures), vlac, cuda_chunk_bench, cuda_bench, vlac_write_pi05 and the shared libraries they
# resolve here (not glibc/libstdc++, nor cuBLASLt, which the device's CUDA has) into
# DIR/bundle.tar.xz, stripped, and copies device_chain.sh next to it.
# Usage: tests/cuda/make_run_bundle.sh BUILD_DIR DIR
set -euo pipefail
build="${1:?usage: make_run_bundle.sh BUILD_DIR DIR}"
dir="${2:?usage: make_run_bundle.sh BUILD_DIR DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$dir"
cp -L "$build/tests/test_cuda" "$build/vlac" "$build/bench/cuda_chunk_bench" "$build/bench/cuda_bench" "$stage/bin/"
cp -L "$(find "$build" -name vlac_write_pi05 -type f -perm -u+x | head -1)" "$stage/bin/"
strip "$stage"/bin/*
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcublasLt.so*|libcublas.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
strip "$stage"/lib/* 2>/dev/null || true
tar cJf "$dir/bundle.tar.xz.tmp" -C "$stage" bin lib
mv "$dir/bundle.tar.xz.tmp" "$dir/bundle.tar.xz"
cp "$here/device_chain.sh" "$dir/"
ls -la "$dir"
