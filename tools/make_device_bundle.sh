#!/usr/bin/env bash
# Packs what the device machine needs for tools/bench_cpu_vs_lerobot.py into one tar.xz: build/vlac, the shared
# libraries it resolves (glibc, libstdc++, libgcc_s left to the host), the two Python tools, lerobot's site folder.
# Never builds anything; writes OUT atomically (temp name + rename), so running it again is safe.
#
# Usage: tools/make_device_bundle.sh OUT.tar.xz [--site DIR] [--vlac PATH]
#   --site DIR   pure-Python packages (lerobot 0.6.1, draccus, gymnasium, ...) to put under site/;
#                default: the site/ of the existing .devcarry/bundle.tar.xz (read before OUT is replaced)
#   --vlac PATH  the binary (default: build/vlac of this checkout)
# Layout (as the device expects): ./bin/vlac ./lib/*.so* ./tools/*.py ./site/...
# On the device: tar xJf bundle.tar.xz -C /tmp/cmp; PYTHONPATH=/tmp/cmp/site python3 /tmp/cmp/tools/bench_cpu_vs_lerobot.py \
#   --vlac /tmp/cmp/bin/vlac --vlac-lib /tmp/cmp/lib ...   (or LD_LIBRARY_PATH=/tmp/cmp/lib for everything)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=""
site=""
vlac="$root/build/vlac"
default_bundle="$root/.devcarry/bundle.tar.xz"

die() { echo "make_device_bundle: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --site) [ $# -ge 2 ] || die "--site needs a folder"; site="$2"; shift 2 ;;
    --vlac) [ $# -ge 2 ] || die "--vlac needs a path"; vlac="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$out" ] || die "one OUT.tar.xz only (got '$out' and '$1')"; out="$1"; shift ;;
  esac
done
[ -n "$out" ] || die "usage: tools/make_device_bundle.sh OUT.tar.xz [--site DIR] [--vlac PATH]"
[ -x "$vlac" ] || die "$vlac: not an executable (build vlac first)"
out_dir="$(dirname "$out")"
[ -d "$out_dir" ] || die "$out_dir: output folder does not exist"

stage="$(mktemp -d "${TMPDIR:-/tmp}/vlac_bundle.XXXXXX")"
tmp_out=""
cleanup() { rm -rf "$stage"; [ -z "$tmp_out" ] || rm -f "$tmp_out"; }
trap cleanup EXIT
chmod 755 "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/tools" "$stage/site"

# site/: lerobot and its pure-Python dependencies (torch, transformers, numpy are the device's own).
if [ -n "$site" ]; then
  [ -d "$site/lerobot" ] || die "$site: no lerobot/ package in this site folder"
  cp -a "$site/." "$stage/site/"
else
  [ -f "$default_bundle" ] || die "no --site given and no $default_bundle to take site/ from"
  tar xJf "$default_bundle" -C "$stage" ./site || die "$default_bundle: could not extract ./site"
  [ -d "$stage/site/lerobot" ] || die "$default_bundle: its site/ has no lerobot/ package"
fi

# bin/vlac
cp -L "$vlac" "$stage/bin/vlac"
chmod 755 "$stage/bin/vlac"

# lib/: every library ldd resolves under /lib or /usr/lib, except the C/C++ runtime the host has anyway.
libs=()
while IFS= read -r line; do
  case "$line" in *"=>"*) ;; *) continue ;; esac
  name="$(echo "$line" | awk '{print $1}')"
  path="$(echo "$line" | awk '{print $3}')"
  [ "$path" != "not" ] || die "$vlac: ldd finds no $name"
  case "$name" in
    libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*) continue ;;
    libstdc++.so.*|libgcc_s.so.*|ld-linux*) continue ;;
  esac
  case "$path" in /lib/*|/usr/lib/*|/lib64/*) ;; *) continue ;; esac
  cp -L "$path" "$stage/lib/$name"
  libs+=("$name")
done < <(ldd "$vlac")
for need in libdnnl.so.2 libgomp.so.1; do
  case " ${libs[*]} " in
    *" $need "*) ;;
    *) echo "make_device_bundle: warning: $vlac does not link $need (built before the oneDNN backend?)" >&2 ;;
  esac
done

# tools/: the benchmark and the fixture module it imports.
cp "$root/tools/bench_cpu_vs_lerobot.py" "$root/tools/make_pi05_fixtures.py" "$stage/tools/"

# Reproducible archive: sorted names, fixed times and owners; single-threaded xz.
tmp_out="$(mktemp "$out_dir/.$(basename "$out").XXXXXX")"
tar --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner -C "$stage" -cf - . | xz -T1 -6 > "$tmp_out"
chmod 644 "$tmp_out"
mv -f "$tmp_out" "$out"
tmp_out=""
echo "make_device_bundle: $out: $(du -h "$out" | cut -f1), bin/vlac, lib/ ${libs[*]}, tools/ 2 files, site/ $(ls "$stage/site" | grep -vc dist-info) packages"
