#!/usr/bin/env bash
# Cross-builds vlac for arm64 (the aarch64 preset) and runs the pi0.5 parity tests under
# qemu-aarch64-static as a Cortex-A76 (NEON and dot product, no bf16, no SVE: like the Jetson
# Orin's Cortex-A78AE): the lerobot fixtures in fp32 and bf16 (RunFixtures.*), package against
# folder actions (CompileCli.*), and the CPU kernel, linear and executor tests (Cpu*).
# Usage: scripts/test_arm64.sh [extra ctest arguments, e.g. -R RunFixtures]
# Builds only vlac, test_cli and test_cpu. Exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/arm64_sysroot.sh build-aarch64/sysroot

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake --preset aarch64 "${launcher[@]}" >/dev/null
cmake --build --preset aarch64

log=build-aarch64/test_arm64.log
set +e
ctest --preset aarch64 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
ran=$(grep -cE 'Test +#[0-9]+: ' "$log" || true)
passed=$(grep -cE 'Test +#[0-9]+: .* Passed +[0-9.]+ sec' "$log" || true)
# ctest marks a skip '***Skipped' (no space before it), a pass '   Passed'.
skipped=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*| )Skipped +[0-9.]+ sec' "$log" || true)
failed=$((ran - passed - skipped))
echo "arm64 (qemu cortex-a76): $ran tests, $passed passed, $failed failed, $skipped skipped (ctest exit $rc; log $log)"
exit "$rc"
