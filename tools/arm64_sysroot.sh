#!/usr/bin/env bash
# Prepares what the aarch64 preset cross-builds against: Debian's arm64 -dev packages (and their
# runtime libraries) unpacked into a sysroot folder, plus the cross compiler and qemu on the host.
# Usage: tools/arm64_sysroot.sh [DIR]   (default: build-aarch64/sysroot in the checkout)
#
# The arm64 packages are unpacked with dpkg -x, not installed: libdnnl-dev:arm64 cannot be
# installed beside libdnnl-dev:amd64 (both own /usr/include/oneapi/dnnl/dnnl_config.h, which
# differs). The host only gains the arm64 architecture in apt. Runs again in under a second when
# the folder already holds these package versions.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build-aarch64/sysroot}
sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"

# Host tools: the cross compiler (brings libc, libstdc++, libgomp for arm64) and the emulator.
host_want=(g++-aarch64-linux-gnu qemu-user-static)
missing=()
for p in "${host_want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "arm64-sysroot: installing on the host: ${missing[*]}" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# arm64 packages: -dev files for the build, the shared libraries for linking and for qemu.
# nlohmann-json3-dev and libcli11-dev are header-only (Architecture: all); they are unpacked
# too so that CMake finds every package inside the sysroot and nothing from the host.
arm64_pkgs=(libdnnl-dev libdnnl2 libsentencepiece-dev libsentencepiece0 libxxhash-dev libxxhash0
            libgtest-dev libgmock-dev)
all_pkgs=(nlohmann-json3-dev libcli11-dev)

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "arm64-sysroot: adding the arm64 architecture to dpkg/apt" >&2
  $sudo_cmd dpkg --add-architecture arm64
fi
if ! apt-cache show libdnnl-dev:arm64 >/dev/null 2>&1; then
  echo "arm64-sysroot: apt-get update (arm64 package lists)" >&2
  $sudo_cmd apt-get update -qq
fi

# The versions apt would download now (one apt-cache call); the stamp records what DIR holds.
names=()
for p in "${arm64_pkgs[@]}"; do names+=("$p:arm64"); done
names+=("${all_pkgs[@]}")
want_stamp=$(apt-cache policy "${names[@]}" |
  awk '/^[^ ].*:$/ {sub(/:$/, ""); name = $0} /^  Candidate:/ {print name " " $2}')
if [[ $(wc -l <<<"$want_stamp") -ne ${#names[@]} || "$want_stamp" == *"(none)"* ]]; then
  echo "arm64-sysroot: error: apt has no candidate for some of: ${names[*]}" >&2
  echo "$want_stamp" >&2
  exit 1
fi
if [[ -f "$dir/.vlac-sysroot" && "$(cat "$dir/.vlac-sysroot")" == "$want_stamp" ]]; then
  echo "arm64-sysroot: $dir is up to date"
  exit 0
fi

echo "arm64-sysroot: unpacking into $dir:"
sed 's/^/  /' <<<"$want_stamp"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt drops to the _apt user for downloads where it can
(cd "$tmp" && apt-get download -qq "${names[@]}" 2>&1 | grep -v "unsandboxed as root" || true)
rm -rf "$dir"
mkdir -p "$dir"
n=0
for deb in "$tmp"/*.deb; do
  dpkg -x "$deb" "$dir"
  n=$((n + 1))
done
if ((n != ${#names[@]})); then
  echo "arm64-sysroot: error: downloaded $n of ${#names[@]} packages into $tmp" >&2
  exit 1
fi
printf '%s\n' "$want_stamp" >"$dir/.vlac-sysroot"
echo "arm64-sysroot: $n packages, $(du -sh "$dir" | cut -f1) in $dir"
