#!/usr/bin/env bash
# The main job on the built-in default policy (needs a built ./build/vlac).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${VLAC_DEMO_DIR:-demo}
mkdir -p "$out"
./build/vlac demo "$out" --report-json "$out/demo.report.json"
