#!/usr/bin/env bash
# Quick start: install what is missing, build vlac, run the main job on the built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
cmake --preset release >/dev/null
cmake --build --preset release
exec scripts/demo.sh
