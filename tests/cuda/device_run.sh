#!/usr/bin/env bash
# On the GPU machine: unpacks the bundle from make_bundle.sh and runs the op harness and the
# bench, writing test_cuda.xml and cuda_bench.json under $OUT. Usage: device_run.sh DIR [GTEST_FILTER]
set -uo pipefail
dir="${1:?usage: device_run.sh DIR [GTEST_FILTER]}"
filter="${2:-*}"
out="${OUT:-/tmp/vlac_cuda_out}"
mkdir -p "$out" /tmp/vlac_cuda
tar xzf "$dir/bundle.tar.gz" -C /tmp/vlac_cuda
lt="$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
echo "cublasLt: ${lt:-not found}"
export LD_LIBRARY_PATH="/tmp/vlac_cuda/lib:${lt:+$(dirname "$lt"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
nproc
rc=0
timeout 420 /tmp/vlac_cuda/bin/test_cuda --gtest_filter="$filter" --gtest_output="xml:$out/test_cuda.xml" || rc=$?
echo "test_cuda rc=$rc"
timeout 120 /tmp/vlac_cuda/bin/cuda_bench --out "$out/cuda_bench.json" || echo "cuda_bench rc=$?"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
exit $rc
