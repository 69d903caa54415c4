#!/usr/bin/env bash
# Benchmark of `vlac compile` on a policy folder (default: the full-size pi0.5 at /work/big/pi05_full),
# next to a read+write baseline measured in the same run, and the same compile inside a 1 GiB
# memory cgroup (v1). Prints one JSON object on stdout; progress notes on stderr. Not a test.
# Usage: bench/compile_bench.sh [FOLDER] [--vlac BIN] [--work DIR] [--cap SIZE] [--limit SIZE]
#                               [--twice] [--no-cgroup] [--stand-in-convert]
#   FOLDER            policy folder (config.json + *.safetensors)
#   --vlac BIN        vlac binary (default build/vlac)
#   --work DIR        scratch folder for packages, engines and the dd file (default $TMPDIR or /tmp);
#                     every file the script makes there is deleted at exit
#   --cap SIZE        --engine-cap passed to compile (default: compile's own default)
#   --limit SIZE      memory cgroup limit in bytes or with K/M/G suffix (default 1G)
#   --twice           an extra unconstrained compile for the byte-identity check, even when the
#                     cgroup compile already gave a second package (at most 2 compiles otherwise)
#   --no-cgroup       skip (c)
#   --keep PATH       keep the first package at PATH (moved there at the end; e.g. for run_bench.sh)
#   --stand-in-convert  time `vlac convert FOLDER OUT --dtype bf16` instead of compile (dry runs of
#                     the script before `vlac compile` exists; automatic when it does not)
# Every timed step starts cold: `sync; echo 3 > /proc/sys/vm/drop_caches` (root) before it.
set -euo pipefail

folder=/work/big/pi05_full
vlac=build/vlac
work=${TMPDIR:-/tmp}
cap=""
limit=1G
twice=0
use_cgroup=1
stand_in=0
keep=""
while (($#)); do
  case "$1" in
    --vlac) vlac=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --cap) cap=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --twice) twice=1; shift ;;
    --no-cgroup) use_cgroup=0; shift ;;
    --keep) keep=$2; shift 2 ;;
    --stand-in-convert) stand_in=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "compile_bench: unknown flag $1" >&2; exit 2 ;;
    *) folder=$1; shift ;;
  esac
done
note() { echo "compile_bench: $*" >&2; }
[[ -x "$vlac" ]] || { note "no vlac binary at $vlac (build first)"; exit 1; }
[[ -f "$folder/config.json" ]] || { note "$folder: not a policy folder (no config.json)"; exit 2; }
shopt -s nullglob
weights=("$folder"/*.safetensors)
shopt -u nullglob
((${#weights[@]})) || { note "$folder: no .safetensors files"; exit 2; }
if ((!stand_in)) && ! "$vlac" --help 2>/dev/null | grep -qE "^ +compile "; then
  note "this vlac has no 'compile' subcommand: timing 'vlac convert --dtype bf16' as a stand-in"
  stand_in=1
fi
limit_bytes=$(awk -v s="$limit" 'BEGIN {
  n = s + 0; u = toupper(substr(s, length(s)));
  if (u == "K") n *= 1024; else if (u == "M") n *= 1048576; else if (u == "G") n *= 1073741824;
  printf "%.0f", n }')

dir=$(mktemp -d "$work/vlac-compile-bench.XXXXXX")
cg=""
cleanup() {
  if [[ -n "$cg" && -d "$cg" ]]; then
    # Any process left in it (a compile killed by the limit is already gone) moves to the root.
    while read -r p; do echo "$p" > /sys/fs/cgroup/memory/cgroup.procs 2>/dev/null || true; done < "$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null || note "could not remove cgroup $cg"
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 130" INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }
cache_mode="cold (drop_caches before each timed step)"
drop() {
  sync
  if ! (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    cache_mode="warm or partial (no permission for drop_caches)"
  fi
}
# A top-level integer/number field of a vlac report (one key per line, as MemReport writes it).
field() { awk -v k="\"$2\"" -F': *' '$1 ~ "^ *" k {gsub(/[ ,]/, "", $2); print $2; exit}' "$1"; }
timev_rss() { awk -F': *' '/Maximum resident set size/ {printf "%.0f", $2 * 1024}' "$1"; }
timev_wall() {  # "Elapsed (wall clock) time (h:mm:ss or m:ss): 1:02.35" -> seconds
  awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i];
              printf "%.3f", s}' "$1"
}
json_or_null() { [[ -n "${1:-}" ]] && echo "$1" || echo null; }

weights_bytes=0
for w in "${weights[@]}"; do weights_bytes=$((weights_bytes + $(stat -L -c %s "$w"))); done
# Disk: two packages (about half the fp32 bytes each) plus engine files and the dd file.
avail=$(( $(df -Pk "$dir" | awk 'NR==2 {print $4}') * 1024 ))
if ((avail < weights_bytes * 3 / 2)); then
  note "not enough free disk in $work: $avail bytes free, want about $((weights_bytes * 3 / 2))"; exit 1
fi

# The command to time, into the array CMD. $1: output path, $2: report path, $3: engine dir.
compile_cmd() {
  if ((stand_in)); then
    CMD=("$vlac" convert "$folder" "$1" --dtype bf16 --report-json "$2" --quiet)
  else
    CMD=("$vlac" compile "$folder" -o "$1" --dtype bf16 --engine-dir "$3" --report-json "$2" --quiet)
    [[ -z "$cap" ]] || CMD+=(--engine-cap "$cap")
  fi
}

# (b) compile, unconstrained, under time -v.
pkg1="$dir/a.vlac"; [[ $stand_in == 1 ]] && pkg1="$dir/a.safetensors"
mkdir -p "$dir/eng1"
# Noise floor of the meter's system figure: how much MemTotal - MemAvailable moves over 5 s with
# nothing of ours running (other users of the machine). Compare it with the compile's figure.
sys_used() { awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} END {printf "%.0f", (t - a) * 1024}' /proc/meminfo; }
drop
idle_lo=$(sys_used); idle_hi=$idle_lo
for _ in $(seq 50); do
  u=$(sys_used); ((u < idle_lo)) && idle_lo=$u; ((u > idle_hi)) && idle_hi=$u; sleep 0.1
done
idle_noise=$((idle_hi - idle_lo))
compile_cmd "$pkg1" "$dir/r1.json" "$dir/eng1"
note "compile (1): ${CMD[*]}"
t0=$(now)
set +e
/usr/bin/time -v -o "$dir/t1.txt" "${CMD[@]}" >"$dir/out1.txt" 2>"$dir/err1.txt"
rc1=$?
set -e
t1=$(now)
compile_s=$(elapsed "$t0" "$t1")
if ((rc1 != 0)); then note "compile failed (exit $rc1): $(tail -n 3 "$dir/err1.txt")"; fi
pkg_bytes=0; [[ -f "$pkg1" ]] && pkg_bytes=$(stat -c %s "$pkg1")
rss_meter=$(field "$dir/r1.json" peak_rss_bytes 2>/dev/null || true)
sys_meter=$(field "$dir/r1.json" peak_system_above_idle_bytes 2>/dev/null || true)
wall_meter=$(field "$dir/r1.json" wall_seconds 2>/dev/null || true)
rss_timev=$(timev_rss "$dir/t1.txt")
rm -rf "$dir/eng1"

# (a) baseline: read every .safetensors of the folder, then write as many bytes as the package.
drop
note "baseline: cat ${#weights[@]} file(s), $weights_bytes bytes"
t0=$(now); cat "${weights[@]}" > /dev/null; t1=$(now)
cat_s=$(elapsed "$t0" "$t1")
drop
note "baseline: dd $pkg_bytes bytes (conv=fsync)"
t0=$(now)
dd if=/dev/zero of="$dir/dd.out" bs=8M count="$pkg_bytes" iflag=count_bytes conv=fsync status=none
t1=$(now)
dd_s=$(elapsed "$t0" "$t1")
rm -f "$dir/dd.out"
baseline_s=$(awk -v a="$cat_s" -v b="$dd_s" 'BEGIN {printf "%.3f", a + b}')

# (c) the same compile inside a memory cgroup v1 limited to $limit.
cg_anon=null; cg_dirty=null; cg_mapped=null
cg_rc=null; cg_max=null; cg_failcnt=null; cg_oom_kills=null; cg_rss_timev=null; cg_wall=null; cg_note=null
pkg2=""
if ((use_cgroup)); then
  root=/sys/fs/cgroup/memory
  if [[ -w "$root" ]]; then
    cg="$root/vlac-compile-bench-$$"
    mkdir "$cg"
    echo "$limit_bytes" > "$cg/memory.limit_in_bytes"
    pkg2="$dir/b.vlac"; [[ $stand_in == 1 ]] && pkg2="$dir/b.safetensors"
    mkdir -p "$dir/eng2"
    drop
    compile_cmd "$pkg2" "$dir/r2.json" "$dir/eng2"
    note "compile (2) in cgroup $cg, memory.limit_in_bytes=$limit_bytes"
    t0=$(now)
    set +e
    # The shell joins the cgroup, then execs time -v, which runs the compile as its child.
    # Sampler: peaks of the cgroup's anonymous memory (rss, incl. THP), dirty+writeback and mapped
    # file pages, every 100 ms from memory.stat; what the limit was spent on besides clean cache.
    touch "$dir/cg.run"
    ( max_a=0; max_d=0; max_m=0
      while [[ -f "$dir/cg.run" ]]; do
        read -r a d m < <(awk '$1 == "rss" {a = $2} $1 == "dirty" {d += $2} $1 == "writeback" {d += $2}
                               $1 == "mapped_file" {m = $2} END {print a + 0, d + 0, m + 0}' "$cg/memory.stat")
        ((a > max_a)) && max_a=$a; ((d > max_d)) && max_d=$d; ((m > max_m)) && max_m=$m
        echo "$max_a $max_d $max_m" > "$dir/cg.peaks"; sleep 0.1
      done ) &
    sampler=$!
    bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
      /usr/bin/time -v -o "$dir/t2.txt" "${CMD[@]}" >"$dir/out2.txt" 2>"$dir/err2.txt"
    cg_rc=$?
    rm -f "$dir/cg.run"; wait "$sampler" 2>/dev/null || true
    [[ -f "$dir/cg.peaks" ]] && read -r cg_anon cg_dirty cg_mapped < "$dir/cg.peaks"
    set -e
    t1=$(now)
    cg_wall=$(elapsed "$t0" "$t1")
    cg_max=$(cat "$cg/memory.max_usage_in_bytes")
    cg_failcnt=$(cat "$cg/memory.failcnt")
    cg_oom_kills=$(awk '/^oom_kill / {print $2}' "$cg/memory.oom_control")
    cg_oom_kills=${cg_oom_kills:-null}
    cg_rss_timev=$(timev_rss "$dir/t2.txt"); cg_rss_timev=${cg_rss_timev:-null}
    ((cg_rc == 0)) || note "compile in the cgroup failed (exit $cg_rc): $(tail -n 3 "$dir/err2.txt")"
    rm -rf "$dir/eng2"
    # A process killed by the limit may take a moment to leave the cgroup.
    for _ in $(seq 50); do if rmdir "$cg" 2>/dev/null; then cg=""; break; fi; sleep 0.1; done
  else
    cg_note='"no write access to /sys/fs/cgroup/memory (run as root on a cgroup v1 host)"'
  fi
fi

# (d) byte identity: the cgroup's package against the first, or an extra compile with --twice.
identical=null; identical_from=null
if ((twice)) || [[ -z "$pkg2" || ! -f "$pkg2" ]]; then
  if ((twice)); then
    [[ -n "$pkg2" ]] && rm -f "$pkg2"
    pkg2="$dir/c.vlac"; [[ $stand_in == 1 ]] && pkg2="$dir/c.safetensors"
    mkdir -p "$dir/eng3"
    note "compile (3) for the identity check"
    compile_cmd "$pkg2" "$dir/r3.json" "$dir/eng3"
    "${CMD[@]}" >/dev/null 2>"$dir/err3.txt" || note "compile (3) failed"
    identical_from='"extra compile (--twice)"'
  fi
else
  identical_from='"the cgroup compile"'
fi
if [[ -f "$pkg1" && -n "$pkg2" && -f "$pkg2" ]]; then
  if cmp -s "$pkg1" "$pkg2"; then identical=true; else identical=false; fi
fi

kept=null
if [[ -n "$keep" && -f "$pkg1" ]]; then
  if mv "$pkg1" "$keep"; then kept="\"$keep\""; else note "could not move the package to $keep"; fi
fi

ratio=$(awk -v c="$compile_s" -v b="$baseline_s" 'BEGIN {if (b > 0) printf "%.3f", c / b; else print "null"}')
cmd_name=compile; ((stand_in)) && cmd_name="convert --dtype bf16 (stand-in: vlac compile missing)"
mib=1048576
t_rss=$(awk -v m="$(json_or_null "$rss_meter")" -v t="$(json_or_null "$rss_timev")" -v mib=$mib \
  'BEGIN {print (m != "null" && t != "null" && m + 0 <= 512 * mib && t + 0 <= 512 * mib) ? "true" : "false"}')
t_sys=$(awk -v s="$(json_or_null "$sys_meter")" -v mib=$mib 'BEGIN {print (s != "null" && s + 0 <= 768 * mib) ? "true" : "false"}')
t_ratio=$(awk -v r="$ratio" 'BEGIN {print (r != "null" && r + 0 <= 1.5) ? "true" : "false"}')
t_cg=$( [[ "$cg_rc" == 0 ]] && echo true || echo false )

cat <<EOF
{
  "folder": "$folder",
  "command": "$cmd_name",
  "cache": "$cache_mode",
  "weights_files": ${#weights[@]},
  "weights_bytes": $weights_bytes,
  "package_bytes": $pkg_bytes,
  "compile_exit_code": $rc1,
  "compile_wall_seconds": $compile_s,
  "compile_wall_seconds_meter": $(json_or_null "$wall_meter"),
  "compile_peak_rss_bytes_meter": $(json_or_null "$rss_meter"),
  "compile_peak_rss_bytes_time_v": $(json_or_null "$rss_timev"),
  "compile_peak_system_above_idle_bytes_meter": $(json_or_null "$sys_meter"),
  "system_used_idle_noise_bytes": $idle_noise,
  "baseline_cat_seconds": $cat_s,
  "baseline_dd_seconds": $dd_s,
  "baseline_wall_seconds": $baseline_s,
  "compile_over_baseline": $ratio,
  "cgroup_limit_bytes": $( ((use_cgroup)) && echo "$limit_bytes" || echo null ),
  "cgroup_compile_exit_code": $cg_rc,
  "cgroup_compile_wall_seconds": $(json_or_null "$cg_wall"),
  "cgroup_max_usage_in_bytes": $cg_max,
  "cgroup_failcnt": $cg_failcnt,
  "cgroup_oom_kills": $cg_oom_kills,
  "cgroup_compile_peak_rss_bytes_time_v": $cg_rss_timev,
  "cgroup_peak_anon_bytes": $cg_anon,
  "cgroup_peak_dirty_writeback_bytes": $cg_dirty,
  "cgroup_peak_mapped_file_bytes": $cg_mapped,
  "cgroup_note": $cg_note,
  "byte_identical": $identical,
  "byte_identical_compared_with": $identical_from,
  "package_kept_at": $kept,
  "target_peak_rss_le_512MiB": $t_rss,
  "target_system_above_idle_le_768MiB": $t_sys,
  "target_compile_over_baseline_le_1_5": $t_ratio,
  "target_compiles_in_cgroup": $t_cg
}
EOF
