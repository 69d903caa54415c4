#!/usr/bin/env bash
# `vlac compile` of one policy folder by several backends in the same run (default: cpu, then cuda),
# each inside a memory cgroup v1 of LIMIT (default 128M), cache dropped before each, under
# /usr/bin/time -v and with the vlac meter (--report-json). Prints one JSON object on stdout;
# progress notes on stderr. Not a test. Needs root (cgroup, drop_caches) on a cgroup v1 host.
# Usage: bench/compile_backends_bench.sh FOLDER [--vlac BIN] [--work DIR] [--limit SIZE]
#                                        [--backends cpu,cuda] [--dtype bf16|fp32] [--nice N]
#   --work DIR   scratch folder for the packages and engine files (default: FOLDER's parent);
#                everything the script makes there is deleted at exit
set -euo pipefail

folder=""
vlac=build/vlac
work=""
limit=128M
backends=cpu,cuda
dtype=bf16
niceness=10
while (($#)); do
  case "$1" in
    --vlac) vlac=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --backends) backends=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --nice) niceness=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    -*) echo "compile_backends_bench: unknown flag $1" >&2; exit 2 ;;
    *) folder=$1; shift ;;
  esac
done
note() { echo "compile_backends_bench: $*" >&2; }
[[ -n "$folder" && -f "$folder/config.json" ]] || { note "give a policy folder (config.json + *.safetensors)"; exit 2; }
[[ -x "$vlac" ]] || { note "no vlac binary at $vlac"; exit 1; }
root=/sys/fs/cgroup/memory
[[ -w "$root" ]] || { note "no write access to $root (run as root on a cgroup v1 host)"; exit 1; }
[[ -n "$work" ]] || work=$(dirname "$folder")
limit_bytes=$(awk -v s="$limit" 'BEGIN {
  n = s + 0; u = toupper(substr(s, length(s)));
  if (u == "K") n *= 1024; else if (u == "M") n *= 1048576; else if (u == "G") n *= 1073741824;
  printf "%.0f", n }')
weights_bytes=0
for w in "$folder"/*.safetensors; do weights_bytes=$((weights_bytes + $(stat -L -c %s "$w"))); done

dir=$(mktemp -d "$work/vlac-backends-bench.XXXXXX")
cg=""
cleanup() {
  rm -f "$dir/cg.run"
  if [[ -n "$cg" && -d "$cg" ]]; then
    while read -r p; do echo "$p" > "$root/cgroup.procs" 2>/dev/null || true; done < "$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null || note "could not remove cgroup $cg"
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 130" INT TERM
now() { date +%s.%N; }
field() { awk -v k="\"$2\"" -F': *' '$1 ~ "^ *" k {gsub(/[ ,]/, "", $2); print $2; exit}' "$1"; }
timev() { awk -F': ' -v k="$2" 'index($0, k) {print $2; exit}' "$1"; }
timev_wall() {
  awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i];
              printf "%.3f", s}' "$1"
}
orn() { [[ -n "${1:-}" ]] && echo "$1" || echo null; }

rows=()
IFS=, read -ra list <<< "$backends"
for b in "${list[@]}"; do
  pkg="$dir/$b.vlac"
  mkdir -p "$dir/eng-$b"
  cg="$root/vlac-backends-bench-$$-$b"
  mkdir "$cg"
  echo "$limit_bytes" > "$cg/memory.limit_in_bytes"
  sync; echo 3 > /proc/sys/vm/drop_caches
  note "$b: compile in $cg (limit $limit_bytes bytes)"
  touch "$dir/cg.run"
  # Peaks of the cgroup's anonymous memory (rss incl. THP), dirty+writeback and mapped file pages,
  # every 100 ms: what the limit was spent on besides clean page cache.
  ( max_a=0; max_d=0; max_m=0
    while [[ -f "$dir/cg.run" ]]; do
      read -r a d m < <(awk '$1 == "rss" {a = $2} $1 == "dirty" {d += $2} $1 == "writeback" {d += $2}
                             $1 == "mapped_file" {m = $2} END {print a + 0, d + 0, m + 0}' "$cg/memory.stat")
      ((a > max_a)) && max_a=$a; ((d > max_d)) && max_d=$d; ((m > max_m)) && max_m=$m
      echo "$max_a $max_d $max_m" > "$dir/cg.peaks"; sleep 0.1
    done ) &
  sampler=$!
  t0=$(now)
  set +e
  bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    /usr/bin/time -v -o "$dir/t-$b.txt" nice -n "$niceness" "$vlac" compile "$folder" -o "$pkg" --backend "$b" \
    --dtype "$dtype" --engine-dir "$dir/eng-$b" --report-json "$dir/r-$b.json" --quiet >"$dir/out-$b.txt" 2>"$dir/err-$b.txt"
  rc=$?
  set -e
  t1=$(now)
  rm -f "$dir/cg.run"; wait "$sampler" 2>/dev/null || true
  read -r anon dirty mapped < "$dir/cg.peaks" || true
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
  ((rc == 0)) || note "$b: compile failed (exit $rc): $(tail -n 3 "$dir/err-$b.txt")"
  pkg_bytes=null; [[ -f "$pkg" ]] && pkg_bytes=$(stat -c %s "$pkg")
  engines=null; [[ -f "$dir/r-$b.json" ]] && engines=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["engines"]))' "$dir/r-$b.json" 2>/dev/null || echo null)
  rss_tv=$(timev "$dir/t-$b.txt" "Maximum resident set size"); rss_tv=$( [[ -n "$rss_tv" ]] && echo $((rss_tv * 1024)) || echo null)
  rows+=("$(cat <<EOF
    {
      "backend": "$b",
      "exit_code": $rc,
      "wall_seconds": $wall,
      "wall_seconds_time_v": $(orn "$(timev_wall "$dir/t-$b.txt")"),
      "user_seconds": $(orn "$(timev "$dir/t-$b.txt" "User time (seconds)")"),
      "system_seconds": $(orn "$(timev "$dir/t-$b.txt" "System time (seconds)")"),
      "peak_rss_bytes_time_v": $rss_tv,
      "peak_rss_bytes_meter": $(orn "$( [[ -f "$dir/r-$b.json" ]] && field "$dir/r-$b.json" peak_rss_bytes)"),
      "peak_system_above_idle_bytes_meter": $(orn "$( [[ -f "$dir/r-$b.json" ]] && field "$dir/r-$b.json" peak_system_above_idle_bytes)"),
      "major_page_faults": $(orn "$(timev "$dir/t-$b.txt" "Major (requiring I/O) page faults")"),
      "cgroup_max_usage_in_bytes": $(cat "$cg/memory.max_usage_in_bytes"),
      "cgroup_failcnt": $(cat "$cg/memory.failcnt"),
      "cgroup_oom_kills": $(orn "$(awk '/^oom_kill / {print $2}' "$cg/memory.oom_control")"),
      "cgroup_peak_anon_bytes": $(orn "$anon"),
      "cgroup_peak_dirty_writeback_bytes": $(orn "$dirty"),
      "cgroup_peak_mapped_file_bytes": $(orn "$mapped"),
      "package_bytes": $pkg_bytes,
      "engines": $engines,
      "report": $( [[ -f "$dir/r-$b.json" ]] && cat "$dir/r-$b.json" || echo null)
    }
EOF
)")
  for _ in $(seq 50); do if rmdir "$cg" 2>/dev/null; then cg=""; break; fi; sleep 0.1; done
  rm -rf "$dir/eng-$b" "$pkg"
done

joined=$(IFS=,; echo "${rows[*]}")
cat <<EOF
{
  "folder": "$folder",
  "weights_bytes": $weights_bytes,
  "dtype": "$dtype",
  "cgroup_limit_bytes": $limit_bytes,
  "cache": "cold (sync; drop_caches before each compile)",
  "nice": $niceness,
  "vlac": "$vlac",
  "host": {"nproc": $(nproc), "cpu": "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)", "load_average_at_end": "$(cut -d' ' -f1-3 /proc/loadavg)"},
  "runs": [
$joined
  ]
}
EOF
