#!/usr/bin/env bash
# On the GPU machine, after device_run.sh unpacked the bundle: Nsight Compute reports (clocks left
# alone) of one attention launch and its combine per case, to $OUT/ncu_<case>.txt.
set -uo pipefail
out="${OUT:-/tmp/vlac_cuda_out}"
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[ -n "$ncu" ] || { echo "no ncu"; exit 0; }
export LD_LIBRARY_PATH="/tmp/vlac_cuda/lib:$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"):${LD_LIBRARY_PATH:-}"
for c in expert prefix; do
  timeout 120 "$ncu" --clock-control none -k regex:attn_ --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis /tmp/vlac_cuda/bin/cuda_bench --case "$c" --reps 1 --inner 1 > "$out/ncu_$c.txt" 2>&1
  echo "ncu $c rc=$?"; grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|Stall" "$out/ncu_$c.txt" | head -40
done
