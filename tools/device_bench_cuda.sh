#!/usr/bin/env bash
# On the GPU machine (one device call, <= 9 min): unpacks make_cuda_bench_bundle.sh's bundle,
# installs lerobot's wheels from .whl into /tmp/site (torch, transformers and numpy are the
# device's own), and runs tools/bench_cuda_vs_lerobot.py at full size, writing bench_cuda.json
# (and the work folder's small JSONs) under $OUT. Usage: device_bench_cuda.sh DIR [extra args...]
set -uo pipefail
dir="${1:?usage: device_bench_cuda.sh DIR [args...]}"
shift
out="${OUT:-/tmp/vlac_bench_out}"
mkdir -p "$out" /tmp/vlac_bench
tar xJf "$dir/bundle.tar.xz" -C /tmp/vlac_bench
lt="$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
echo "cublasLt: ${lt:-not found}"
export LD_LIBRARY_PATH="/tmp/vlac_bench/lib:${lt:+$(dirname "$lt"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv
df -h /tmp | tail -1
free -g | head -2
rc=0
timeout 540 python3 /tmp/vlac_bench/tools/bench_cuda_vs_lerobot.py --bin /tmp/vlac_bench/bin --work /tmp/vlac_bench/work \
  --out "$out/bench_cuda.json" "$@" || rc=$?
echo "bench_cuda_vs_lerobot rc=$rc"
cp /tmp/vlac_bench/work/*.json "$out/" 2>/dev/null || true
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
exit $rc
