#!/usr/bin/env bash
# Packs what one device call of tools/bench_cuda_vs_lerobot.py needs into DIR: bundle.tar.xz with
# bin/{vlac, vlac_write_pi05, pi05_chunk_bench; test_cuda, cuda_bench, expert_mlp_bench, expert_stream_bench where built} (stripped), lib/ (the shared libraries ldd resolves
# here: oneDNN, libgomp, sentencepiece, xxhash, cudart, ...; not glibc/libstdc++/libgcc, which the
# device has, nor the 540 MB cuBLASLt, which ships with its CUDA), tools/ (the benchmark and the
# fixture module it imports), plus device_bench_cuda.sh next to it. Never builds anything; the
# archive is written to a temporary name and renamed.
# Usage: tools/make_cuda_bench_bundle.sh BUILD_DIR DIR     (then carry DIR and .whl: docs/cuda.md)
set -euo pipefail
build="${1:?usage: make_cuda_bench_bundle.sh BUILD_DIR DIR}"
dir="${2:?usage: make_cuda_bench_bundle.sh BUILD_DIR DIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bins=("$build/vlac" "$build/vlac_write_pi05" "$build/bench/pi05_chunk_bench")
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "make_cuda_bench_bundle: $b missing (build vlac vlac_write_pi05 pi05_chunk_bench)" >&2; exit 2; }; done
# The GPU test harness and the kernel bench travel too where they are built, so one call can test
# and benchmark (.devcarry-s7-style drivers run bin/test_cuda before the benchmark).
# BUNDLE_SKIP names those to leave out (e.g. "expert_mlp_bench expert_stream_bench": a call
# carries 64 MiB in all).
for b in "$build/tests/test_cuda" "$build/bench/cuda_bench" "$build/bench/expert_mlp_bench" "$build/bench/expert_stream_bench" "$build/bench/preload_gemm_bench" "$build/bench/fp8_scale_modes_bench" "$build/bench/cublaslt_host_probe"; do
  [[ " ${BUNDLE_SKIP:-} " == *" $(basename "$b") "* ]] && continue
  [ -x "$b" ] && bins+=("$b")
done
stage="$(mktemp -d "${TMPDIR:-/tmp}/vlac_cuda_bench.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
chmod 755 "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/tools" "$dir"
for b in "${bins[@]}"; do
  cp -L "$b" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$b")"
done
for b in "$stage"/bin/*; do ldd "$b" | awk '/=> \// {print $3}'; done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libmvec.so*|libstdc++.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcublasLt.so*|libcublas.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
cp "$root/tools/bench_cuda_vs_lerobot.py" "$root/tools/make_pi05_fixtures.py" "$stage/tools/"
tar --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner -C "$stage" -cf - bin lib tools | xz -T2 -6 > "$dir/bundle.tar.xz.tmp"
mv -f "$dir/bundle.tar.xz.tmp" "$dir/bundle.tar.xz"
cp "$root/tools/device_bench_cuda.sh" "$dir/"
echo "make_cuda_bench_bundle: $dir/bundle.tar.xz $(du -h "$dir/bundle.tar.xz" | cut -f1): $(ls "$stage/bin" | tr '\n' ' ')| lib: $(ls "$stage/lib" | tr '\n' ' ')"
