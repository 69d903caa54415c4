#!/usr/bin/env bash
# The CPU paths side by side: a bf16 and an fp32 package of one random-weight pi0.5, each run with
# `vlac run --repeat N` natively and with VLAC_MAX_CPU_ISA=avx2 (the AVX2 path: oneDNN without a
# bf16 matmul, vlac's register-blocked bf16 kernel). Per run: latency per stage (prefix, denoise;
# the last repeat and every repeat), CPU seconds, peak RSS (meter and time -v), weight bytes, the
# path that ran. With --rounds R the runs are interleaved R times (round 1: every cap's bf16 then
# fp32, round 2: the same, ...) and the summary gives the median, min and max of the per-round
# bf16/fp32 ratios: on a shared machine, compare runs of one round.
# Prints one JSON object and writes it to bench/results/cpu_isa_<size>_<date>[_<label>].json. Not a test.
# Usage: bench/cpu_isa_bench.sh [SIZE] [--vlac BIN] [--writer BIN] [--work DIR] [--repeat N]
#                               [--threads N] [--folder DIR] [--caps "native avx2"] [--rounds R]
#                               [--label NAME]
#   SIZE      medium (default; ~260 M parameters, 1 GB fp32, minutes on 2 cores) or full (the
#             released sizes, 16.5 GB fp32 folder: writing it ~3 min, two compiles ~3 min, and
#             each full-size run takes ~1-3 min on 2 cores at the AVX2 cap (prefix of 3 cameras at
#             ~100 GFLOP/s): budget about 25-30 minutes for the 4 runs x 3 repeats)
#   --caps    the VLAC_MAX_CPU_ISA values to run ("native": no cap); on an AVX2-only machine
#             "native" alone (avx2 is the same path)
#   --folder  an existing policy folder to use instead of writing one (e.g. /work/big/pi05_full)
#   --work    scratch folder (default $TMPDIR or /tmp); everything made there is deleted at exit
set -euo pipefail
cd "$(dirname "$0")/.."

size=medium
vlac=build/vlac
writer=build/vlac_write_pi05
work=${TMPDIR:-/tmp}
repeat=3
threads=2
folder=""
caps="native avx2"
rounds=1
label=""
while (($#)); do
  case "$1" in
    --vlac) vlac=$2; shift 2 ;;
    --writer) writer=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --folder) folder=$2; shift 2 ;;
    --caps) caps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "cpu_isa_bench: unknown flag $1" >&2; exit 2 ;;
    *) size=$1; shift ;;
  esac
done
note() { echo "cpu_isa_bench: $*" >&2; }
[[ "$size" == medium || "$size" == full || "$size" == demo ]] || { note "SIZE must be medium, full or demo"; exit 2; }
[[ -x "$vlac" ]] || { note "no vlac binary at $vlac (build first)"; exit 1; }
command -v python3 >/dev/null || { note "python3 is needed to read the reports"; exit 1; }
timev=(/usr/bin/time -v -o)  # peak RSS and CPU seconds per run; the meter's report where it is missing
[[ -x /usr/bin/time ]] || { note "no /usr/bin/time: peak RSS from vlac's meter only"; timev=(); }
tv() { if ((${#timev[@]})); then "${timev[@]}" "$@"; else shift; "$@"; fi; }

dir=$(mktemp -d "$work/vlac-cpu-isa-bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
t_start=$(date +%s)

if [[ -z "$folder" ]]; then
  [[ -x "$writer" ]] || { note "no writer at $writer (build vlac_write_pi05)"; exit 1; }
  folder=$dir/pi05_$size
  note "writing a $size pi0.5 folder to $folder"
  "$writer" --size "$size" --out "$folder" --write-obs "$dir/obs.safetensors" >&2
else
  "$writer" --out "$folder" --obs-only --write-obs "$dir/obs.safetensors" >&2
fi
for dt in bf16 fp32; do
  note "compiling the $dt package"
  tv "$dir/compile_$dt.t.txt" "$vlac" compile "$folder" -o "$dir/pi05_$dt.vlac" --dtype "$dt" \
    --report-json "$dir/compile_$dt.r.json" --quiet >&2
done

for ((r = 1; r <= rounds; r++)); do
  for cap in $caps; do
    for dt in bf16 fp32; do
      tag=${cap}_${dt}_r$r
      env=()
      [[ "$cap" == native ]] || env=(VLAC_MAX_CPU_ISA="$cap")
      note "round $r/$rounds, $cap $dt: run --repeat $repeat"
      tv "$dir/$tag.t.txt" env "${env[@]}" "$vlac" run "$dir/pi05_$dt.vlac" --obs "$dir/obs.safetensors" \
        --out "$dir/$tag.out.safetensors" --repeat "$repeat" --threads "$threads" --report-json "$dir/$tag.r.json" \
        >"$dir/$tag.stdout.txt" 2>"$dir/$tag.err.txt" || { note "$tag failed: $(tail -n 3 "$dir/$tag.err.txt")"; exit 1; }
      grep -E '^  (cpu|latency)' "$dir/$tag.stdout.txt" >&2 || true
    done
  done
done

SIZE=$size DIR=$dir CAPS=$caps ROUNDS=$rounds LABEL=$label REPEAT=$repeat THREADS=$threads FOLDER=$folder T_START=$t_start python3 - <<'EOF'
import json, os, re, time, datetime, subprocess
d = os.environ["DIR"]
def time_v(path):
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        m = re.match(r"\s*(User|System) time \(seconds\): ([\d.]+)", line)
        if m: out["cpu_seconds"] = out.get("cpu_seconds", 0.0) + float(m.group(2))
        m = re.match(r"\s*Maximum resident set size \(kbytes\): (\d+)", line)
        if m: out["peak_rss_bytes_time_v"] = int(m.group(1)) * 1024
        m = re.match(r"\s*Elapsed \(wall clock\) time.*: (.*)", line)
        if m: out["wall"] = m.group(1)
    return out
runs = {}
rounds = int(os.environ["ROUNDS"])
for r in range(1, rounds + 1):
  for cap in os.environ["CAPS"].split():
    for dt in ("bf16", "fp32"):
        tag = f"{cap}_{dt}_r{r}"
        rj = json.load(open(f"{d}/{tag}.r.json"))
        ex = rj.get("extra", rj)
        def g(k):
            return ex.get(k, rj.get(k))
        runs[tag] = {
            "cap": cap, "package_dtype": dt, "round": r,
            "cpu_isa": g("cpu_isa"), "cpu_isa_native": g("cpu_isa_native"), "onednn_isa": g("onednn_isa"),
            "bf16_path": g("bf16_path"), "bf16_matmul": g("bf16_matmul"),
            "latency_ms_last_repeat": g("latency_ms"), "stage_ms_last_repeat": g("stage_ms"),
            "iterations_ms": g("iterations_ms"),
            "weight_bytes": g("weight_bytes") or g("package_weight_bytes"),
            "peak_rss_bytes_meter": rj.get("peak_rss_bytes"),
            **time_v(f"{d}/{tag}.t.txt"),
        }
        runs[tag]["stdout"] = [l.rstrip() for l in open(f"{d}/{tag}.stdout.txt") if l.startswith("  ")]
pk = {dt: os.path.getsize(f"{d}/pi05_{dt}.vlac") for dt in ("bf16", "fp32")}
def stats(per_round):
    v = sorted(x for x in per_round if x is not None)
    if not v:
        return None
    n = len(v)
    med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"median": med, "min": v[0], "max": v[-1], "per_round": per_round}
summary = {}
for cap in os.environ["CAPS"].split():
    per = {"prefix": [], "denoise": [], "cpu_seconds": []}
    for r in range(1, rounds + 1):
        a, b = runs[f"{cap}_bf16_r{r}"], runs[f"{cap}_fp32_r{r}"]
        for key in ("prefix", "denoise"):
            try:
                per[key].append(a["latency_ms_last_repeat"][key] / b["latency_ms_last_repeat"][key])
            except Exception:
                per[key].append(None)
        per["cpu_seconds"].append(a["cpu_seconds"] / b["cpu_seconds"] if a.get("cpu_seconds") and b.get("cpu_seconds") else None)
    summary[cap] = {f"bf16_over_fp32_{k}": stats(v) for k, v in per.items()}
    for dt in ("bf16", "fp32"):
        summary[cap][f"{dt}_ms"] = {key: stats([runs[f"{cap}_{dt}_r{r}"]["latency_ms_last_repeat"].get(key)
                                               for r in range(1, rounds + 1)]) for key in ("prefix", "denoise")}
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
out = {
    "what": "vlac run of a bf16 and an fp32 package, natively and at VLAC_MAX_CPU_ISA caps",
    "size": os.environ["SIZE"], "folder": os.environ["FOLDER"], "repeat": int(os.environ["REPEAT"]),
    "threads": int(os.environ["THREADS"]), "rounds": rounds, "cpu_model": cpu, "nproc": os.cpu_count(),
    "load_note": "shared 2-core machine: other jobs may run; compare runs of one invocation",
    "package_bytes": pk, "package_bytes_bf16_over_fp32": pk["bf16"] / pk["fp32"],
    "runs": runs, "summary": summary,
    "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
    "bench_wall_s": time.time() - int(os.environ["T_START"]),
}
text = json.dumps(out, indent=2)
print(text)
os.makedirs("bench/results", exist_ok=True)
label = os.environ["LABEL"]
path = f"bench/results/cpu_isa_{os.environ['SIZE']}_{datetime.date.today().isoformat()}{'_' + label if label else ''}.json"
open(path, "w").write(text + "\n")
import sys
print(f"cpu_isa_bench: wrote {path}", file=sys.stderr)
EOF
