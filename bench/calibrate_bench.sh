#!/usr/bin/env bash
# 8-bit packages with and without `vlac compile --calibrate` (GPTQ codes) against the fp32 run of
# the same random-weight pi0.5 folder on the CPU, next to the bf16-all package. The packages are
# calibrated on observations never measured (seeds 101..), and each is measured on --obs-seeds
# observations with their own noise seeds. Per package: compile wall time, peak RSS and system
# memory above idle (the meter, per phase) and /usr/bin/time -v's max RSS, the packed weight bytes,
# then per observation the max and RMS of |Δ action_normalized| from the fp32 run, the mean
# per-action cosine, and the max as a multiple of bf16-all's (tools/action_distance.py).
# Prints one JSON object and writes it to bench/results/calibrate_<size>_<date>[_<label>].json. Not a test.
# Usage: bench/calibrate_bench.sh [SIZE] [--folder DIR] [--work DIR] [--vlac BIN] [--writer BIN]
#                                 [--python PY] [--threads N] [--calibrate-obs N] [--obs-seeds "0 2"]
#                                 [--variants "int8 int8@gptq fp8 fp8@gptq"] [--label NAME]
#   SIZE        medium (default; minutes on 2 cores) or full (16.5 GB folder: each calibrated compile
#               ~2.5 min and each fp32 run ~1 min on 2 cores; about 15 minutes for the defaults)
#   --variants  DTYPE (rounded to nearest) or DTYPE@gptq (--calibrate), optionally followed by
#               compile flags joined with '+', e.g. fp8@gptq+--calibrate-act-order
#   --python    a Python with numpy (for tools/action_distance.py)
set -euo pipefail
cd "$(dirname "$0")/.."

size=medium
vlac=build/vlac
writer=build/vlac_write_pi05
work=${TMPDIR:-/tmp}
python=python3
threads=2
ncal=1
obs_seeds="0 2"
variants="int8 int8@gptq fp8 fp8@gptq"
folder=""
label=""
while (($#)); do
  case "$1" in
    --vlac) vlac=$2; shift 2 ;;
    --writer) writer=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --calibrate-obs) ncal=$2; shift 2 ;;
    --obs-seeds) obs_seeds=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --folder) folder=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "calibrate_bench: unknown flag $1" >&2; exit 2 ;;
    *) size=$1; shift ;;
  esac
done
note() { echo "calibrate_bench: $*" >&2; }
"$python" -c 'import numpy' 2>/dev/null || { note "$python has no numpy (pass --python PY)"; exit 2; }
vlac=$(realpath "$vlac"); writer=$(realpath "$writer")
tmp=$(mktemp -d "$work/calibrate_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [[ -z "$folder" ]]; then
  folder=$tmp/policy
  note "writing a $size folder"
  "$writer" --out "$folder" --size "$size" >/dev/null
fi
obs() { "$writer" --out "$folder" --obs-only --seed "$1" --write-obs "$tmp/obs$1.safetensors" >/dev/null; }
cal=()
for ((i = 0; i < ncal; i++)); do obs $((101 + i)); cal+=(--calibrate "$tmp/obs$((101 + i)).safetensors"); done
for s in $obs_seeds; do obs "$s"; done

# One compile: its meter report and time -v's max RSS as JSON.
compile() {  # name dtype flags...
  local name=$1 dt=$2; shift 2
  note "compile $name"
  /usr/bin/time -v "$vlac" compile "$folder" -o "$tmp/$name.vlac" --dtype "$dt" "$@" --threads "$threads" \
    --report-json "$tmp/c_$name.json" --quiet 2> "$tmp/t_$name.txt" >/dev/null ||
    { cat "$tmp/t_$name.txt" >&2; exit 1; }
}
runs() {  # name: one run per observation seed (noise seed 1000 + seed)
  for s in $obs_seeds; do
    if [[ $1 == fp32 ]]; then args=("$folder" --dtype fp32); else args=("$tmp/$1.vlac"); fi
    "$vlac" run "${args[@]}" --obs "$tmp/obs$s.safetensors" --seed $((1000 + s)) --threads "$threads" \
      --out "$tmp/a_${1}_$s.safetensors" --quiet >/dev/null
  done
}
compile bf16-all bf16-all
names=(bf16-all)
for v in $variants; do
  IFS='+' read -r -a parts <<< "$v"
  spec=${parts[0]}; flags=("${parts[@]:1}")
  dt=${spec%@*}; name=${spec/@/-}
  [[ $spec == *@gptq ]] && flags=("${cal[@]}" "${flags[@]}")
  [[ ${#parts[@]} -gt 1 ]] && name="$name$(printf '%s' "${parts[@]:1}" | tr -c 'a-z0-9' '_')"
  compile "$name" "$dt" "${flags[@]}"
  names+=("$name")
done
note "fp32 runs"; runs fp32
for n in "${names[@]}"; do note "runs $n"; runs "$n"; done

"$python" - "$tmp" "$size" "$threads" "$ncal" "$obs_seeds" "${names[@]}" <<'EOF' > "$tmp/result.json"
import json, re, subprocess, sys, datetime, platform, os
tmp, size, threads, ncal, seeds, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(), sys.argv[6:]
out = {"benchmark": "calibrate (vlac compile --calibrate: GPTQ codes) against the fp32 folder run, CPU",
       "size": size, "threads": threads, "calibration_observations": ncal, "observation_seeds": seeds,
       "date": datetime.date.today().isoformat(), "host": {"nproc": os.cpu_count(), "platform": platform.platform()},
       "packages": {}}
for n in names:
    c = json.load(open(f"{tmp}/c_{n}.json"))
    tv = open(f"{tmp}/t_{n}.txt").read()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", tv)
    out["packages"][n] = {"compile": {k: c.get(k) for k in ("wall_seconds", "peak_rss_bytes", "peak_system_above_idle_bytes",
                                                          "packed_weight_bytes", "package_bytes")},
                          "compile_time_v_max_rss_kb": int(m.group(1)) if m else None,
                          "compile_phases": [{k: p.get(k) for k in ("name", "wall_seconds", "peak_rss_bytes",
                                                                   "peak_system_above_idle_bytes")} for p in c.get("phases", [])],
                          "observations": {}}
for s in seeds:
    d = json.loads(subprocess.run([sys.executable, "tools/action_distance.py", f"{tmp}/a_fp32_{s}.safetensors",
                                   *[f"{tmp}/a_{n}_{s}.safetensors" for n in names], "--json"],
                                  check=True, capture_output=True, text=True).stdout)["distances"]
    for n in names:
        out["packages"][n]["observations"][s] = d[f"{tmp}/a_{n}_{s}.safetensors"]
print(json.dumps(out, indent=1))
EOF
cat "$tmp/result.json"
mkdir -p bench/results
dest=bench/results/calibrate_${size}_$(date +%F)${label:+_$label}.json
cp "$tmp/result.json" "$dest"
note "wrote $dest"
