#!/usr/bin/env bash
# Quick start: install what is missing, build the vlac program only (no tests, no benchmarks),
# run the main job on the built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
cmake --preset release >/dev/null
cmake --build --preset release --target vlac
exec scripts/demo.sh
