#!/usr/bin/env bash
# The Python tests (tests/python): `pip install .` into a fresh venv under build/ (vlac.Policy,
# `vlac serve`, the vlac program; grpcio and numpy from PyPI), then pytest against the
# lerobot fixtures and the release build's vlac program (build/vlac). Prints how long each
# part took. The lerobot robot-client end-to-end run is tests/python/run_lerobot_client_e2e.sh
# (torch makes it too heavy for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${VLAC_TEST_PYTHON:-python3}
venv=build/py-venv
# scikit-build-core would hand CMake Python's own compiler name (sysconfig: g++); the CMake build
# picked c++, and ccache keys on the name: the same one lets the wheel build hit its objects.
export CC=${CC:-cc} CXX=${CXX:-c++}
t0=$(date +%s)
rm -rf "$venv"
"$py" -m venv "$venv"
# The wheel build reuses ccache where the machine has it (CMakeLists.txt) and runs 2 jobs.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$venv/bin/python" -m pip install -q --disable-pip-version-check . pytest
t1=$(date +%s)
"$venv/bin/python" -c "import vlac; print('python: vlac', vlac.__version__, 'from', vlac.__file__)"
# From outside the source tree, so `import vlac` is the installed package.
(cd build && VLAC_BIN="$PWD/vlac" "$OLDPWD/$venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/python")
t2=$(date +%s)
echo "python: pip install . $((t1 - t0)) s, tests $((t2 - t1)) s"
