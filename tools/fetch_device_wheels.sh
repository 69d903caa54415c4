#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that the GPU machine lacks for lerobot's PI05
# (tools/bench_cuda_vs_lerobot.py, tools/make_pi05_fixtures.py): lerobot 0.6.1 and the pure-Python
# packages it needs that the device image does not hold (torch, transformers, numpy,
# huggingface-hub, safetensors ... are the device's own; .library/device/KINDS.md lists them).
# Each is fetched with --no-deps for CPython 3.12 on x86_64, as the device README says; the device
# call then installs them with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# (tools/device_cuda_ab.sh does). Needs PyPI; writes nothing outside .whl/.
# Usage: tools/fetch_device_wheels.sh [DIR]     (default: .whl in the repository root)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.whl}"
pins=(lerobot==0.6.1 draccus==0.11.6 gymnasium==1.4.0 termcolor==3.3.0 mergedeep==1.3.4 toml==0.10.2
      farama-notifications==0.0.6)
mkdir -p "$dir"
for p in "${pins[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dir" "$p"
done
echo "fetch_device_wheels: $(ls "$dir" | wc -l) wheels in $dir ($(du -sh "$dir" | cut -f1))"
