#!/usr/bin/env bash
# Checks that the runtime library and everything it links resolve no symbol from the model
# builder, the partitioner or the folder runner (DESIGN.md, dependency rule). Usage:
#   tools/check_runtime_link.sh [BUILD_DIR]   (default build; needs the static libraries built)
set -euo pipefail
lib="${1:-build}/src"
rt="vlac_runtime vlac_policy vlac_pi05_spec vlac_backends vlac_backend_cpu vlac_exec vlac_ir vlac_package vlac_io vlac_mem vlac_core"
# The CUDA backend, where it was built (its library lives in its own folder).
[ -f "$lib/backends/cuda/libvlac_backend_cuda.a" ] && ln -sf "$(cd "$lib/backends/cuda" && pwd)/libvlac_backend_cuda.a" "$lib/libvlac_backend_cuda.a" && rt="$rt vlac_backend_cuda"
compile_side="vlac_models vlac_partition vlac_policy_folder"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for l in $rt; do nm --undefined-only "$lib/lib$l.a" | awk '$1=="U"{print $2}'; done | sort -u > "$tmp/undef"
for l in $rt; do nm --defined-only "$lib/lib$l.a" | awk 'NF==3{print $3}'; done | sort -u > "$tmp/def"
for l in $compile_side; do nm --defined-only "$lib/lib$l.a" | awk 'NF==3 && $2 ~ /[TBDR]/{print $3}'; done | sort -u > "$tmp/compile"
comm -23 "$tmp/undef" "$tmp/def" | comm -12 - "$tmp/compile" > "$tmp/needed"
if [ -s "$tmp/needed" ]; then
  echo "runtime closure needs $(wc -l < "$tmp/needed") compile-side symbols:"; c++filt < "$tmp/needed"; exit 1
fi
echo "runtime closure ($rt) needs no symbol of $compile_side"
