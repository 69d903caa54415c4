#!/usr/bin/env bash
# On the GPU machine, from the repository root: unpacks make_run_bundle.sh's bundle, runs
# test_cuda (xml under $OUT), `vlac run --device cuda` on a fixture, and, unless SKIP_FULL=1,
# writes the full-size pi0.5 folder in /tmp and times whole chunks with cuda_chunk_bench
# (JSON under $OUT) once per BENCH_VISIONS mode (default fp32). Usage: device_chain.sh DIR [GTEST_FILTER]
set -uo pipefail
dir="${1:?usage: device_chain.sh DIR [GTEST_FILTER]}"
filter="${2:-*}"
out="${OUT:-/tmp/vlac_chain_out}"
mkdir -p "$out" /tmp/vlac_chain
tar xJf "$dir/bundle.tar.xz" -C /tmp/vlac_chain
bin=/tmp/vlac_chain/bin
lt="$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="/tmp/vlac_chain/lib:${lt:+$(dirname "$lt"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export VLAC_SOURCE_DIR="$PWD"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv
rc=0
timeout "${TEST_TIMEOUT:-240}" $bin/test_cuda --gtest_filter="$filter" --gtest_output="xml:$out/test_cuda.xml" 2>&1 \
  | grep -v '^\[       OK \]\|^\[ RUN      \]' || rc=$?
rc=${PIPESTATUS[0]}
echo "test_cuda rc=$rc"
f=tests/fixtures/pi05/tiny_b_absent_cam
timeout 60 $bin/vlac run $f/policy --obs $f/obs.safetensors --noise $f/noise.safetensors --out /tmp/vlac_chain/a.safetensors \
  --device cuda --report-json "$out/vlac_run_cuda_tiny.json"
echo "vlac run --device cuda rc=$?"
if [ "${SKIP_FULL:-0}" != 1 ]; then
  t0=$(date +%s)
  timeout 200 $bin/vlac_write_pi05 --out /tmp/vlac_chain/full --size full --write-obs /tmp/vlac_chain/full_obs.safetensors \
    --obs-tokens 200 > "$out/write_full.log" 2>&1
  echo "write full rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 "$out/write_full.log"
  # BENCH_VISIONS: the vision modes to time (fp32 = lerobot's bf16 mode; tf32, bf16 = opt-ins).
  for vis in ${BENCH_VISIONS:-fp32}; do
    sfx=""; [ "$vis" = fp32 ] || sfx="_vision_$vis"
    timeout "${BENCH_TIMEOUT:-200}" $bin/cuda_chunk_bench --policy /tmp/vlac_chain/full --obs /tmp/vlac_chain/full_obs.safetensors \
      --dtype bf16 --vision "$vis" --rounds 3 --chunks 50 --out "$out/cuda_chunk_bench_full_bf16$sfx.json" > "$out/bench$sfx.log" 2>&1
    echo "cuda_chunk_bench --vision $vis rc=$?"; tail -25 "$out/bench$sfx.log"
  done
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,memory.used --format=csv
exit $rc
