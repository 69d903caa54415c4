#!/usr/bin/env bash
# On the GPU machine: the preload GEMM (src/backends/cuda/preload_gemm.h) against cuBLASLt with
# bench/preload_gemm_bench, once per setting (each NAME or NAME:VAR=VALUE[,VAR=VALUE...]), one
# JSON each under $OUT/preload_NAME.json and a line per shape. DIR holds the bundle of
# tools/make_cuda_bench_bundle.sh. TEST=1 runs the kernel's tests first. Example (session 29):
#   bash tools/device_preload_bench.sh .devcarry base p4:VLAC_PRELOAD_MAX_PARTS=4 nomath:VLAC_PRELOAD_PROBE=1
set -uo pipefail
d="${1:?usage: device_preload_bench.sh DIR [NAME[:VAR=VALUE,...]]...}"
shift
out="${OUT:-/tmp/vlac_preload_out}"
mkdir -p /tmp/vb "$out"
tar xJf "$d/bundle.tar.xz" -C /tmp/vb  # always: /tmp may hold an earlier session's binaries
lt="$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="/tmp/vb/lib:${lt:+$(dirname "$lt"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# TEST=1: the kernel's tests first (test_cuda --gtest_filter='*Preload*'), their log under $OUT.
if [ "${TEST:-0}" = 1 ]; then
  timeout 120 /tmp/vb/bin/test_cuda --gtest_filter='*Preload*' > "$out/test_preload.log" 2>&1
  echo "test_cuda *Preload* rc=$?"; grep -E '^\[  (FAILED|PASSED) |Failure|Expected|actual|left to cuBLASLt' "$out/test_preload.log" | head -20
fi
for spec in "$@"; do
  name="${spec%%:*}"; envs=(); [[ "$spec" == *:* ]] && IFS=',' read -r -a envs <<< "${spec#*:}"
  echo "== $name ${envs[*]}"
  env "${envs[@]}" timeout 120 /tmp/vb/bin/preload_gemm_bench --reps "${REPS:-10}" --out "$out/preload_$name.json" 2>&1 | tail -6
done
# The setting (no timing probe) whose expert chain ran fastest, as NAME and its environment with
# VLAC_PRELOAD_GEMM=1, for tools/device_cuda_ab.sh (e.g. best:$(cat $OUT/preload_best.env)).
python3 - "$out" "$@" <<'PY' | tee "$out/preload_best.txt"
import json, sys
out, specs = sys.argv[1], sys.argv[2:]
best = None
for spec in specs:
    name, _, env = spec.partition(":")
    if "PROBE" in env:
        continue
    try:
        c = json.load(open(f"{out}/preload_{name}.json"))["chain"]
    except Exception:
        continue
    us = c["preload_us_per_layer"]
    print(f"{name:10s} chain per layer: preload {us:7.2f} us, cuBLASLt {c['cublaslt_us_per_layer']:7.2f} us")
    if best is None or us < best[1]:
        best = (name, us, env)
if best:
    env = ",".join(["VLAC_PRELOAD_GEMM=1"] + ([best[2]] if best[2] else []))
    open(f"{out}/preload_best.env", "w").write(env)
    print(f"best: {best[0]} ({best[1]:.2f} us a layer): {env}")
PY
