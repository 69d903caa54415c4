#!/usr/bin/env bash
# Benchmark of `vlac convert` fp32 -> bf16 on a generated checkpoint (default 4 GiB), next to a
# read+write baseline (`cat IN > /dev/null` + `dd` of the output's size with conv=fsync).
# Prints one JSON object. Every timed step starts cold: the page cache is dropped before it
# (/proc/sys/vm/drop_caches as root; otherwise the input's own pages via dd iflag=nocache).
# Usage: bench/convert_bench.sh [VLAC_BINARY] [SIZE] [WORK_DIR]    (not a test; deletes its files)
set -euo pipefail
vlac=${1:-build/vlac}
size=${2:-4GiB}
work=${3:-${TMPDIR:-/tmp}}
[[ -x "$vlac" ]] || { echo "convert_bench: no vlac binary at $vlac (build first)" >&2; exit 1; }
dir=$(mktemp -d "$work/vlac-convert-bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
in="$dir/in.safetensors"; out="$dir/out.safetensors"; zero="$dir/dd.out"

now() { date +%s.%N; }
cache_mode="cold (drop_caches before each timed step)"
drop() {
  sync
  if ! (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    cache_mode="cold (input pages dropped with dd iflag=nocache; no permission for drop_caches)"
    dd if="$in" iflag=nocache count=0 status=none 2>/dev/null || true
  fi
}

# Disk: the input plus half of it for the output, plus slack.
avail_kib=$(df -Pk "$dir" | awk 'NR==2 {print $4}')

"$vlac" demo --synthetic-bytes "$size" "$in" --quiet >/dev/null
in_file_bytes=$(stat -c %s "$in")
if (( avail_kib * 1024 < in_file_bytes * 2 )); then echo "convert_bench: not enough disk in $work" >&2; exit 1; fi

# 1. convert, under /usr/bin/time -v when it exists.
drop
timev="$dir/time.txt"; : > "$timev"
t0=$(now)
if [[ -x /usr/bin/time ]]; then
  /usr/bin/time -v -o "$timev" "$vlac" convert "$in" "$out" --dtype bf16 --report-json "$dir/r.json" --quiet >/dev/null
else
  "$vlac" convert "$in" "$out" --dtype bf16 --report-json "$dir/r.json" --quiet >/dev/null
fi
t1=$(now)
convert_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
field() { awk -v k="\"$1\"" -F': *' '$1 ~ k {gsub(/[ ,]/, "", $2); print $2; exit}' "$dir/r.json"; }
input_bytes=$(field input_bytes)
output_bytes=$(field output_bytes)
rss_meter=$(field peak_rss_bytes)
sys_meter=$(field peak_system_above_idle_bytes)
rss_timev=$(awk -F': *' '/Maximum resident set size/ {print $2 * 1024}' "$timev")
rss_timev=${rss_timev:-null}
rm -f "$out"

# 2. baseline: read the input, then write as many bytes as the output (fsync'd, like convert).
drop
t0=$(now); cat "$in" > /dev/null; t1=$(now)
cat_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
drop
t0=$(now)
dd if=/dev/zero of="$zero" bs=8M count="$output_bytes" iflag=count_bytes conv=fsync status=none
t1=$(now)
dd_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
rm -f "$zero"

awk -v ib="$input_bytes" -v ob="$output_bytes" -v fb="$in_file_bytes" -v cs="$convert_s" -v ks="$cat_s" \
    -v ds="$dd_s" -v rm="$rss_meter" -v rt="$rss_timev" -v sm="$sys_meter" -v mode="$cache_mode" 'BEGIN {
  ct = ib / cs; bt = ib / (ks + ds); ratio = ct / bt;
  rss_ok = (rm <= 67108864) && (rt == "null" || rt + 0 <= 67108864) ? "true" : "false";
  tp_ok = (ratio >= 0.7) ? "true" : "false";
  printf "{\n";
  printf "  \"cache\": \"%s\",\n", mode;
  printf "  \"input_file_bytes\": %.0f,\n  \"input_tensor_bytes\": %.0f,\n  \"output_bytes\": %.0f,\n", fb, ib, ob;
  printf "  \"convert_seconds\": %s,\n  \"convert_throughput_bytes_per_second\": %.0f,\n", cs, ct;
  printf "  \"cat_seconds\": %s,\n  \"dd_seconds\": %s,\n  \"baseline_throughput_bytes_per_second\": %.0f,\n", ks, ds, bt;
  printf "  \"throughput_ratio\": %.3f,\n", ratio;
  printf "  \"peak_rss_bytes_meter\": %.0f,\n  \"peak_rss_bytes_time_v\": %s,\n", rm, rt;
  printf "  \"peak_system_above_idle_bytes_meter\": %.0f,\n", sm;
  printf "  \"target_peak_rss_le_64MiB\": %s,\n", rss_ok;
  printf "  \"target_throughput_ratio_ge_0_7\": %s\n", tp_ok;
  printf "}\n";
}'
