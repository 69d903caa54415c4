#!/usr/bin/env bash
# End to end with lerobot's real robot client (lerobot 0.6.1 from PyPI, torch from PyPI): the fake
# robot of tests/python/lerobot_robot_vlac_fake (fake cameras and motors, loaded by lerobot as a
# lerobot_robot_* plugin) drives STEPS control steps against `vlac serve` on the tiny pi0.5 policy
# (tests/fixtures/pi05/pipe_b_quantiles compiled to a package); then
# tests/python/check_lerobot_client_e2e.py checks that every action the robot executed is one vlac
# computed for the observation the robot sent (bit for bit) and writes OUT/e2e.json.
# Too heavy for CI (torch); run by hand:  tests/python/run_lerobot_client_e2e.sh [OUT] [STEPS]
# Needs Python >= 3.12 (VLAC_E2E_PYTHON), build/vlac (vlac compile), network access to PyPI
# the first time (the venv is kept in OUT/venv; delete it to measure a fresh install).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=$(realpath -m "${1:-build/e2e}")
steps=${2:-120}
vlac=${VLAC_BIN:-$root/build/vlac}
mkdir -p "$out"
py=${VLAC_E2E_PYTHON:-}
if [[ -z "$py" ]]; then
  for c in python3.12 python3.13 /root/.pyenv/versions/3.12*/bin/python3.12 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      py=$c; break
    fi
  done
fi
[[ -n "$py" ]] || { echo "e2e: lerobot 0.6.1 needs Python >= 3.12 (set VLAC_E2E_PYTHON)" >&2; exit 2; }

venv=$out/venv
# scikit-build-core would hand CMake Python's own compiler name (sysconfig: g++); the CMake build
# picked c++, and ccache keys on the name: the same one lets the wheel build hit its objects.
export CC=${CC:-cc} CXX=${CXX:-c++}
lerobot_s=0
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import lerobot, torch, grpc' 2>/dev/null; then
  t0=$(date +%s)
  rm -rf "$venv"
  "$py" -m venv "$venv"
  links=()
  [[ -d "$root/.whl" ]] && links=(--find-links "$root/.whl")  # lerobot's wheels, where a checkout has them
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${links[@]}" "lerobot[async]==0.6.1"
  lerobot_s=$(( $(date +%s) - t0 ))
  echo "e2e: lerobot 0.6.1 + torch installed in ${lerobot_s} s ($(du -sh "$venv" | cut -f1))"
fi
# vlac and the fake robot from this tree, every run (the wheel build reuses build/py/).
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=2 "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
  . tests/python/lerobot_robot_vlac_fake
vlac_s=$(( $(date +%s) - t0 ))
echo "e2e: vlac + the fake robot installed in ${vlac_s} s"
printf '{"lerobot_torch_install_seconds": %s, "vlac_install_seconds": %s, "venv_bytes": %s}\n' "$lerobot_s" "$vlac_s" \
  "$(du -sb "$venv" | cut -f1)" > "$out/install.json"

pkg=$out/pipe_b.vlac
"$vlac" compile tests/fixtures/pi05/pipe_b_quantiles/policy -o "$pkg" --dtype fp32 --quiet
rm -rf "$out/record" "$out/robot" "$out/port" "$out/calibration"
export HF_HUB_OFFLINE=1 HF_HOME="$out/hf"
"$venv/bin/vlac" serve "$pkg" --port 0 --port-file "$out/port" --record "$out/record" 2> "$out/server.log" &
server=$!
client=""
cleanup() {
  # TERM, not INT: a background job of a script ignores SIGINT.
  [[ -n "$client" ]] && kill -TERM "$client" 2>/dev/null || true
  kill -TERM "$server" 2>/dev/null || true
  sleep 2
  [[ -n "$client" ]] && kill -KILL "$client" 2>/dev/null || true
  kill -KILL "$server" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 600); do [[ -s "$out/port" ]] && break; kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
[[ -s "$out/port" ]] || { echo "e2e: the server did not start:" >&2; cat "$out/server.log" >&2; exit 1; }
port=$(cat "$out/port")
t_start=$(date +%s.%N)
(cd "$out" && exec "$venv/bin/python" -m lerobot.async_inference.robot_client \
  --server_address="127.0.0.1:$port" --robot.type=vlac_fake --robot.id=fake \
  --robot.log_dir="$out/robot" --robot.calibration_dir="$out/calibration" \
  --task="pick up the red cube" --policy_type=pi05 --pretrained_name_or_path="$pkg" --policy_device=cpu \
  --actions_per_chunk=5 --chunk_size_threshold=0.5 --aggregate_fn_name=latest_only --fps=30) > "$out/client.log" 2>&1 &
client=$!
for _ in $(seq 3000); do
  n=$( (wc -l < "$out/robot/actions.jsonl") 2>/dev/null || echo 0)
  (( n >= steps )) && break
  kill -0 "$client" 2>/dev/null || { echo "e2e: the client exited early:" >&2; tail -30 "$out/client.log" >&2; exit 1; }
  sleep 0.1
done
t_end=$(date +%s.%N)
cleanup
trap - EXIT
client=""
echo "e2e: $(wc -l < "$out/robot/actions.jsonl") control steps in $(awk "BEGIN{print $t_end - $t_start}") s"
"$venv/bin/python" tests/python/check_lerobot_client_e2e.py "$out" "$pkg" "$steps" "$(awk "BEGIN{print $t_end - $t_start}")"
