#!/usr/bin/env bash
# Installs the Debian packages vlac needs (only those missing). Usage: scripts/deps.sh [build|test]
set -euo pipefail
want=(g++ cmake ninja-build pkg-config libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      libcli11-dev libxxhash-dev libopenblas-dev libdnnl-dev libsentencepiece-dev liblzma-dev time)
# libdnnl-dev only recommends ocl-icd-opencl-dev, yet its CMake config calls find_package(OpenCL).
want+=(ocl-icd-opencl-dev)
if [[ "${1:-build}" == test ]]; then
  # clang + its runtime for the libFuzzer targets (libomp-14-dev: clang has no omp.h of its own; a
  # fresh bookworm chroot failed the fuzz build without it); chromium renders the snapshot HTML.
  want+=(clang libclang-rt-14-dev libomp-14-dev chromium g++-aarch64-linux-gnu qemu-user-static)
  # The Python tests (scripts/test_python.sh): a venv, Python's headers for the extension, and
  # ccache so that `pip install .` reuses the release build's objects.
  want+=(python3-venv python3-dev ccache)
fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
