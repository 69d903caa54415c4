#!/usr/bin/env bash
# On the GPU machine: the preload GEMM (src/backends/cuda/preload_gemm.h) against cuBLASLt with
# bench/preload_gemm_bench, once per setting (each NAME or NAME:VAR=VALUE[,VAR=VALUE...]), one
# JSON each under $OUT/preload_NAME.json and a line per shape. DIR holds the bundle of
# tools/make_cuda_bench_bundle.sh. Example (session 29):
#   bash tools/device_preload_bench.sh .devcarry base p4:VLAC_PRELOAD_MAX_PARTS=4 nomath:VLAC_PRELOAD_PROBE=1
set -uo pipefail
d="${1:?usage: device_preload_bench.sh DIR [NAME[:VAR=VALUE,...]]...}"
shift
out="${OUT:-/tmp/vlac_preload_out}"
mkdir -p /tmp/vb "$out"
[ -x /tmp/vb/bin/preload_gemm_bench ] || tar xJf "$d/bundle.tar.xz" -C /tmp/vb
lt="$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="/tmp/vb/lib:${lt:+$(dirname "$lt"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for spec in "$@"; do
  name="${spec%%:*}"; envs=(); [[ "$spec" == *:* ]] && IFS=',' read -r -a envs <<< "${spec#*:}"
  echo "== $name ${envs[*]}"
  env "${envs[@]}" timeout 120 /tmp/vb/bin/preload_gemm_bench --reps "${REPS:-10}" --out "$out/preload_$name.json" 2>&1 | tail -6
done
