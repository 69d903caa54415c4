#!/usr/bin/env bash
# On the GPU machine (one device call, ~5 min): unpacks tools/make_cuda_bench_bundle.sh's bundle
# from DIR, runs test_cuda (xml and log under $OUT), the acceptance benchmark
# (tools/bench_cuda_vs_lerobot.py --dtype bf16-all, lerobot too unless SKIP_LEROBOT=1), then one
# pi05_chunk_bench process per A/B setting on the benchmark's package: each argument is NAME or
# NAME:VAR=VALUE[,VAR=VALUE...] (environment for that process), printed as one line each and kept
# in $OUT/ab.tar. BENCH_DTYPE (default bf16-all) and BENCH_EXTRA (e.g. fp8,bf16-all: more packages
# of the same folder, each against lerobot fp32), TEST_FILTER (gtest filter of test_cuda), BENCH_CAMERAS
# (camera counts, one benchmark each) and BENCH_ARGS (more benchmark arguments). NAME@DTYPE runs
# that setting on the BENCH_EXTRA package of DTYPE (policy-DTYPE.vlac) instead. CUDA_BENCH=1 also
# runs cuda_bench --gemms-only (each GEMM in bf16 and, on sm_89+, FP8) and STREAM_PROBE=1
# expert_mlp_bench --stream-only, both before the A/B, their JSON under $OUT; FP8_MODES=1 runs
# fp8_scale_modes_bench after test_cuda, EXPERT_STREAM=1 expert_stream_bench (the streamed expert
# chain against cuBLASLt, STREAM_ARGS its arguments) after test_cuda. PRE_AB runs a command before the A/B;
# BREAKDOWN=1 adds the settings that measure the recorded chunk by part (tools/recorded_breakdown.py).
# lerobot's wheels come from .whl (docs/cuda.md). Session 12 used it as
#   bash tools/device_cuda_ab.sh .devcarry base prefix_qkv_off:VLAC_PREFIX_QKV=0 sub1:VLAC_ATTN_SUB=1 base2
set -uo pipefail
d="${1:?usage: device_cuda_ab.sh DIR [NAME[:VAR=VALUE,...]]...}"
shift
out="${OUT:-/tmp/vlac_ab_out}"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# The machine's /tmp can hold an earlier session's bundle, work folder and A/B files (session 33
# found another session's ab_*.json there): start from none of them.
rm -rf /tmp/vb /tmp/bw /tmp/ab_*
mkdir -p /tmp/vb "$out"
tar xJf "$d/bundle.tar.xz" -C /tmp/vb
lt="$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="/tmp/vb/lib:${lt:+$(dirname "$lt"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site VLAC_SOURCE_DIR="$PWD"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv
el "test_cuda"
timeout "${TEST_TIMEOUT:-150}" /tmp/vb/bin/test_cuda --gtest_filter="${TEST_FILTER:-*}" --gtest_output="xml:$out/test_cuda.xml" > "$out/test_cuda.log" 2>&1
el "test_cuda rc=$?"
grep -E '^\[  (FAILED|PASSED) |Failure|Expected|Which is|actual|^\[==' "$out/test_cuda.log" | tail -30
# FP8_MODES=1: which FP8 scale modes cuBLASLt runs here, their layout and speed (JSON under $OUT).
if [ "${FP8_MODES:-0}" = 1 ] && [ -x /tmp/vb/bin/fp8_scale_modes_bench ]; then
  el "fp8_scale_modes_bench"
  timeout 120 /tmp/vb/bin/fp8_scale_modes_bench --reps 10 --out "$out/fp8_modes.json" > "$out/fp8_modes.log" 2>&1
  el "fp8_scale_modes_bench rc=$?"; grep -E '^accuracy' "$out/fp8_modes.log" | cut -c1-160
fi
# EXPERT_STREAM=1: the expert's GEMM chain in one persistent launch a step against cuBLASLt's launches.
if [ "${EXPERT_STREAM:-0}" = 1 ] && [ -x /tmp/vb/bin/expert_stream_bench ]; then
  el "expert_stream_bench ${STREAM_ARGS:-}"
  # shellcheck disable=SC2086
  timeout "${STREAM_TIMEOUT:-200}" /tmp/vb/bin/expert_stream_bench --reps 10 ${STREAM_ARGS:-} --out "$out/expert_stream.json" > "$out/expert_stream.log" 2>&1
  el "expert_stream_bench rc=$?"; tail -40 "$out/expert_stream.log"
fi
skip=(); [ "${SKIP_LEROBOT:-0}" = 1 ] && skip=(--skip-lerobot)
# BENCH_CAMERAS: one benchmark per camera count (default 3: bench_cuda.json; others bench_cuda_cN.json);
# BENCH_ARGS: more arguments for each (e.g. --rounds 2 --chunks 30).
for cams in ${BENCH_CAMERAS:-3}; do
  sfx=""; [ "$cams" = 3 ] || sfx="_c$cams"
  el "bench_cuda_vs_lerobot --cameras $cams ${skip[*]} ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-330}" python3 -u /tmp/vb/tools/bench_cuda_vs_lerobot.py --bin /tmp/vb/bin --work /tmp/bw \
    --cameras "$cams" --dtype "${BENCH_DTYPE:-bf16-all}" --extra-dtypes "${BENCH_EXTRA:-}" "${skip[@]}" ${BENCH_ARGS:-} \
    --out "$out/bench_cuda$sfx.json" > "$out/bench$sfx.log" 2>&1
  el "bench rc=$?"; tail -3 "$out/bench$sfx.log"
  [ -f "$out/bench_cuda$sfx.json" ] && python3 "$VLAC_SOURCE_DIR/tools/acceptance_table.py" "$out/bench_cuda$sfx.json"
done
if [ "${CUDA_BENCH:-0}" = 1 ] && [ -x /tmp/vb/bin/cuda_bench ]; then
  el "cuda_bench --gemms-only"
  timeout 240 /tmp/vb/bin/cuda_bench --gemms-only --reps 10 --out "$out/cuda_bench_gemms.json" > "$out/cuda_bench.log" 2>&1
  el "cuda_bench rc=$?"; grep -E '^gemm|fp8|per chunk' "$out/cuda_bench.log" | head -60
fi
if [ "${STREAM_PROBE:-0}" = 1 ] && [ -x /tmp/vb/bin/expert_mlp_bench ]; then
  el "expert_mlp_bench --stream-only"
  timeout 180 /tmp/vb/bin/expert_mlp_bench --stream-only --reps 10 --out "$out/stream_probe.json" > "$out/stream_probe.log" 2>&1
  el "expert_mlp_bench rc=$?"; tail -30 "$out/stream_probe.log"
fi
obs=/tmp/bw/obs.safetensors; noise=/tmp/bw/noise.safetensors
# BREAKDOWN=1: the recorded chunk by part (tools/recorded_breakdown.py; docs/cuda.md "What a
# recorded chunk spends"): after the given settings, a base, one run per part with its nodes left
# unlaunched, and a second base (~15 s each); the table is printed and kept in $OUT/breakdown.json.
if [ "${BREAKDOWN:-0}" = 1 ]; then
  mapfile -t bd < <(python3 "$VLAC_SOURCE_DIR/tools/recorded_breakdown.py" --settings)
  set -- "$@" "${bd[@]}"
fi
# PRE_AB: a command run before the A/B (e.g. another compile of /tmp/bw/policy into
# /tmp/bw/policy-NAME.vlac, which NAME@NAME settings then run).
if [ -n "${PRE_AB:-}" ]; then el "PRE_AB: $PRE_AB"; bash -c "$PRE_AB"; el "PRE_AB rc=$?"; fi
for spec in "$@"; do
  name="${spec%%:*}"; envs=(); [[ "$spec" == *:* ]] && IFS=',' read -r -a envs <<< "${spec#*:}"
  pkg=/tmp/bw/policy.vlac
  if [[ "$name" == *@* ]]; then pkg="/tmp/bw/policy-${name#*@}.vlac"; name="${name%%@*}"; fi
  env "${envs[@]}" timeout 60 /tmp/vb/bin/pi05_chunk_bench "$pkg" --obs "$obs" --noise "$noise" --warmup 5 --rounds 3 \
    --chunks 50 --out "/tmp/ab_$name.json" --actions "/tmp/ab_$name.actions.safetensors" > "/tmp/ab_$name.log" 2>&1
  python3 - "$name" "/tmp/ab_$name.json" "/tmp/ab_$name.actions.safetensors" /tmp/bw/lerobot_fp32_actions.safetensors <<'PY'
import json, os, sys
name, f, act, ref = sys.argv[1:5]
try:
    d = json.load(open(f))
except Exception as e:
    print(f"{name:28s} failed: {e}"); sys.exit()
s = d.get("summary", {}); r = (d.get("recorded_chunk") or {}).get("summary", {})
g = lambda k: (s.get(k) or {}).get("median_ms", float("nan"))
steps = sum(g(f"step.{i}") for i in range(10))
m = d.get("memory", {})
gk = 'peak_gpu_above_idle_bytes_meter' if 'peak_gpu_above_idle_bytes_meter' in m else 'peak_gpu_above_idle_bytes'
mem = (m.get('peak_rss_bytes') or 0) + (m.get(gk) or 0)
print(f"{name:28s} recorded {r.get('median_ms', float('nan')):7.3f} (min {r.get('min_ms', float('nan')):7.3f})  "
      f"eager: vision {g('vision'):6.3f} prefix_lm {g('prefix_lm'):6.3f} steps {steps:6.3f}  "
      f"rss+gpu {mem / 2**30:.3f} GiB ({m.get('peak_rss_bytes', 0) / 2**20:.0f} + {m.get(gk, 0) / 2**20:.0f} MiB)")
# The host heap by loading step (mem/host_steps.h) and cuBLASLt's plans by kind (each kind it plans
# builds host heap once: docs/cuda-sessions.md, session 37), where the breakdown has them.
g = ((d.get("memory_breakdown") or {}).get("after_timed") or {}).get("gpu") or {}
heap = {k[len("host_heap_step_"):-len("_bytes")]: v for k, v in g.items() if k.startswith("host_heap_step_")}
if heap:
    top = sorted(heap.items(), key=lambda kv: -kv[1])[:4]
    kinds = " ".join(f"{k}={g[f'cublaslt_plans_{k}']}" for k in ("bf16_bf16", "bf16_f32", "f32", "tf32", "fp8")
                     if f"cublaslt_plans_{k}" in g)
    print(f"{name:28s} host heap {sum(heap.values()) / 2**20:.1f} MiB in steps ("
          + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in top) + ")" + (f"; cuBLASLt plans {kinds}" if kinds else ""))
# Accuracy of this setting's first chunk against the benchmark's lerobot fp32 actions (same inputs).
if os.path.exists(act) and os.path.exists(ref):
    from safetensors.torch import load_file
    a = load_file(act)["action_normalized"].float().reshape(-1, load_file(act)["action_normalized"].shape[-1])
    b = load_file(ref)["action_normalized"].float().reshape(a.shape)
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    print(f"{name:28s} vs lerobot fp32: max|d| {(a - b).abs().max().item():.5f}, mean cosine {cos.mean().item():.6f}")
PY
  # A setting with VLAC_PROFILE_OPS prints its per-node GPU profile at exit (op_profile.h).
  grep -A400 "vlac cuda op profile" "/tmp/ab_$name.log" | head -"${PROFILE_LINES:-150}"
done
el "A/B done"
if [ "${BREAKDOWN:-0}" = 1 ]; then
  python3 "$VLAC_SOURCE_DIR/tools/recorded_breakdown.py" /tmp/ab_*.json --json "$out/breakdown.json"
fi
(cd /tmp && ls ab_*.json >/dev/null 2>&1 && tar cf "$out/ab.tar" ab_*.json ab_*.safetensors ab_*.log 2>/dev/null)
# The device tool brings back at most 8 files from $OUT: past that, the logs other than run.log
# (which the caller's tee may still hold open) and the test XML travel in one logs.tar.
if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$out" && ls | grep -E '\.(log|xml)$' | grep -vx run.log | tar cf logs.tar --remove-files -T - 2>/dev/null)
fi
exit 0
