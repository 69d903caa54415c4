#!/usr/bin/env bash
# Install what is missing, build, and run every test: release build, the Python package and its
# tests (scripts/test_python.sh), then the ASan+UBSan
# build, then each libFuzzer target for a bounded time, then the arm64 cross build's parity tests
# under qemu (scripts/test_arm64.sh; VLAC_SKIP_ARM64=1 leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
fuzz_seconds=${VLAC_FUZZ_SECONDS:-30}
# ccache (where installed) lets the wheel build of scripts/test_python.sh reuse the release
# build's objects instead of compiling libvlac a second time.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER:-ccache} CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
fi

echo "== release build + tests"
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release

# The CPU and lerobot-fixture tests again on the lower CPU paths, so every path is tested on
# every machine: at the scalar cap on every x86-64 (no AVX code: oneDNN's baseline ISA, vlac's
# scalar kernels and widen + sgemm for bf16 weights), and at the AVX2 cap where this machine has
# AVX-512 (oneDNN without a bf16 matmul, vlac's AVX2 register-blocked bf16 kernel). The native
# path is the run above.
cpu_tests='Cpu|RunFixtures|PipelineFixtures|CompileCli|CalibrateCli|DemoCli|PublicApi|Pi05Builder'
if [[ "$(uname -m)" == x86_64 ]]; then
  echo "== CPU + fixture tests again with VLAC_MAX_CPU_ISA=scalar"
  VLAC_MAX_CPU_ISA=scalar ctest --preset release -R "$cpu_tests"
fi
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "== CPU + fixture tests again with VLAC_MAX_CPU_ISA=avx2"
  VLAC_MAX_CPU_ISA=avx2 ctest --preset release -R "$cpu_tests"
else
  echo "== CPU + fixture tests at the AVX2 cap: skipped (this CPU has no ISA above AVX2 to cap; the native run was the AVX2 path)"
fi

echo "== Python package (pip install . in a fresh venv) + tests/python"
scripts/test_python.sh

echo "== ASan + UBSan build + tests"
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan

echo "== fuzz targets (${fuzz_seconds}s each)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
shopt -s nullglob
n=0
for f in build-fuzz/fuzz_*; do
  [[ -x "$f" && -f "$f" ]] || continue
  name=$(basename "$f")
  corpus="fuzz/corpus/${name#fuzz_}"
  mkdir -p "build-fuzz/corpus-$name"
  args=("build-fuzz/corpus-$name")
  [[ -d "$corpus" ]] && args+=("$corpus")
  echo "-- $name"
  "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -print_final_stats=0 "${args[@]}" 2>&1 | tail -n 3
  n=$((n + 1))
done
echo "fuzz: $n targets ran without a crash"

echo "== arm64 (qemu cortex-a76)"
if [[ "${VLAC_SKIP_ARM64:-0}" == 1 ]]; then
  echo "arm64: skipped (VLAC_SKIP_ARM64=1)"
else
  scripts/test_arm64.sh
fi
