#!/usr/bin/env bash
# Benchmark of `vlac run` on one observation: without a budget and with `--mem-budget` (default
# 2GiB), each under /usr/bin/time -v from a cold page cache. Prints one JSON object: wall, peak RSS
# (meter and time -v), system used above idle, per-phase latency, and whether both runs wrote the
# same action bytes. Not a test. Progress notes on stderr.
# Usage: bench/run_bench.sh PACKAGE OBS [--vlac BIN] [--budget SIZE] [--dtype bf16|fp32] [--warm]
#                           [--work DIR] [-- EXTRA vlac run FLAGS]
#   PACKAGE   a .vlac package or a policy folder (anything `vlac run` accepts)
#   OBS       observation safetensors (e.g. from `vlac_write_pi05 --out DIR --obs-only --write-obs OBS`)
#   --budget  the --mem-budget of the second run (default 2GiB; "none" skips it)
#   --dtype   passed to vlac run (default: none, the package's/config's dtype)
#   --warm    do not drop the page cache before each run
set -euo pipefail

vlac=build/vlac
budget=2GiB
dtype=""
warm=0
work=${TMPDIR:-/tmp}
pos=()
extra=()
while (($#)); do
  case "$1" in
    --vlac) vlac=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --warm) warm=1; shift ;;
    --work) work=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "run_bench: unknown flag $1" >&2; exit 2 ;;
    *) pos+=("$1"); shift ;;
  esac
done
note() { echo "run_bench: $*" >&2; }
((${#pos[@]} == 2)) || { note "usage: bench/run_bench.sh PACKAGE OBS [flags] (see --help)"; exit 2; }
pkg=${pos[0]}; obs=${pos[1]}
[[ -x "$vlac" ]] || { note "no vlac binary at $vlac (build first)"; exit 1; }
[[ -e "$pkg" ]] || { note "$pkg: no such package or folder"; exit 2; }
[[ -f "$obs" ]] || { note "$obs: no such observation file"; exit 2; }
py=$(command -v python3 || true)
[[ -n "$py" ]] || { note "python3 is needed to read the reports and actions"; exit 1; }
has_budget=1
"$vlac" run --help 2>/dev/null | grep -q -- '--mem-budget' || has_budget=0
if [[ "$budget" != none ]] && ((!has_budget)); then note "this vlac run has no --mem-budget: second run skipped"; fi

dir=$(mktemp -d "$work/vlac-run-bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
cache_mode="cold (drop_caches before each run)"
drop() {
  ((warm)) && { cache_mode="warm (page cache kept)"; return; }
  sync
  (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null || cache_mode="warm or partial (no permission for drop_caches)"
}
now() { date +%s.%N; }

# $1: tag; remaining: extra flags. Writes $dir/$tag.{out.safetensors,r.json,t.txt,err.txt,rc,wall}.
one_run() {
  local tag=$1; shift
  local cmd=("$vlac" run "$pkg" --obs "$obs" --out "$dir/$tag.out.safetensors" --report-json "$dir/$tag.r.json" --quiet)
  [[ -z "$dtype" ]] || cmd+=(--dtype "$dtype")
  cmd+=("$@" "${extra[@]}")
  drop
  note "$tag: ${cmd[*]}"
  local t0 t1 rc=0
  t0=$(now)
  /usr/bin/time -v -o "$dir/$tag.t.txt" "${cmd[@]}" >"$dir/$tag.stdout.txt" 2>"$dir/$tag.err.txt" || rc=$?
  t1=$(now)
  echo "$rc" > "$dir/$tag.rc"
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}' > "$dir/$tag.wall"
  ((rc == 0)) || note "$tag failed (exit $rc): $(tail -n 3 "$dir/$tag.err.txt")"
}

one_run plain
runs=(plain)
if [[ "$budget" != none ]] && ((has_budget)); then
  one_run budget --mem-budget "$budget"
  runs+=(budget)
fi

"$py" - "$dir" "$pkg" "$obs" "$cache_mode" "$budget" "${runs[@]}" <<'PY'
import hashlib, json, os, struct, sys

d, pkg, obs, cache, budget, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
GiB = 1 << 30

def read(p):
    try:
        with open(p) as f:
            return f.read()
    except OSError:
        return None

def timev(p):
    out = {}
    for line in (read(p) or "").splitlines():
        k, _, v = line.strip().rpartition(": ")
        if k == "Maximum resident set size (kbytes)":
            out["peak_rss_bytes_time_v"] = int(v) * 1024
        elif k.startswith("Elapsed (wall clock) time"):
            s = 0.0
            for part in v.split(":"):
                s = s * 60 + float(part)
            out["wall_seconds_time_v"] = round(s, 3)
    return out

def tensors(p):
    """name -> sha256 of its bytes, for the action outputs of one run (safetensors header walk)."""
    try:
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            base = 8 + n
            out = {}
            for name, t in header.items():
                if name == "__metadata__" or not name.startswith("action"):
                    continue
                b, e = t["data_offsets"]
                f.seek(base + b)
                out[name] = hashlib.sha256(f.read(e - b)).hexdigest()
            return out
    except (OSError, ValueError, KeyError, struct.error):
        return None

known = {"command", "wall_seconds", "peak_rss_bytes", "system_idle_used_bytes", "peak_system_above_idle_bytes",
         "peak_gpu_above_idle_bytes", "phases"}
res = {"package": pkg, "obs": obs, "cache": cache, "runs": {}}
digests = {}
for tag in runs:
    r = {"mem_budget": budget if tag == "budget" else None,
         "exit_code": int(read(f"{d}/{tag}.rc") or -1),
         "wall_seconds": float(read(f"{d}/{tag}.wall") or "nan")}
    r.update(timev(f"{d}/{tag}.t.txt"))
    rep = None
    try:
        rep = json.loads(read(f"{d}/{tag}.r.json") or "")
    except ValueError:
        pass
    if rep:
        r["peak_rss_bytes_meter"] = rep.get("peak_rss_bytes")
        r["peak_system_above_idle_bytes_meter"] = rep.get("peak_system_above_idle_bytes")
        r["wall_seconds_meter"] = rep.get("wall_seconds")
        r["phases"] = [{"name": p["name"], "wall_ms": round(p["wall_seconds"] * 1000, 3),
                        "peak_rss_bytes": p["peak_rss_bytes"],
                        "peak_system_above_idle_bytes": p["peak_system_above_idle_bytes"]}
                       for p in rep.get("phases", [])]
        r["report_extra"] = {k: v for k, v in rep.items() if k not in known}
    else:
        err = (read(f"{d}/{tag}.err.txt") or "").strip().splitlines()
        r["error"] = err[-1] if err else None
    digests[tag] = tensors(f"{d}/{tag}.out.safetensors") if r["exit_code"] == 0 else None
    r["action_sha256"] = digests[tag]
    res["runs"][tag] = r

def peak(r):
    v = [x for x in (r.get("peak_rss_bytes_meter"), r.get("peak_rss_bytes_time_v")) if x is not None]
    return max(v) if v else None

plain = res["runs"].get("plain", {})
p = peak(plain)
res["target_plain_peak_rss_le_6GiB"] = p is not None and plain.get("exit_code") == 0 and p <= 6 * GiB
if "budget" in res["runs"]:
    b = res["runs"]["budget"]
    pb = peak(b)
    try:
        from_budget = b["mem_budget"].upper().rstrip("B").rstrip("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(from_budget[-1:], 1)
        limit = float(from_budget.rstrip("KMG")) * mult
    except (ValueError, AttributeError):
        limit = None
    res["target_budget_peak_rss_le_budget"] = (pb is not None and limit is not None and b.get("exit_code") == 0
                                              and pb <= limit)
    # Identical actions: every action* tensor's bytes equal between the two runs.
    da, db = digests.get("plain"), digests.get("budget")
    res["actions_identical"] = (da == db) if (da and db) else None
else:
    res["target_budget_peak_rss_le_budget"] = None
    res["actions_identical"] = None
print(json.dumps(res, indent=2))
PY
