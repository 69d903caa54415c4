"""Shared helpers of the Python tests: the lerobot fixtures (tests/fixtures/pi05), the vlac
program (VLAC_BIN, default build/vlac), packages compiled once per session."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "pi05"
CASES = ["tiny_a", "tiny_b", "tiny_b_absent_cam", "tiny_a_bf16", "pipe_b_quantiles", "pipe_b_meanstd_relative",
         "pipe_a_truncated_relative"]
FP32_CASES = [c for c in CASES if c != "tiny_a_bf16"]

_NP = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """{name: array}, metadata: a small reader for the tests (no safetensors package needed)."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {}) or {}
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=_NP[t["dtype"]]).reshape(t["shape"]).copy()
    return out, meta


def vlac_bin():
    p = Path(os.environ.get("VLAC_BIN", ROOT / "build" / "vlac"))
    if not p.is_file():
        pytest.skip(f"the vlac program is not built ({p}; set VLAC_BIN)")
    return p


def run_vlac(*args, check=True):
    r = subprocess.run([str(vlac_bin()), *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"vlac {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}")
    return r


def case_batch(case):
    """The fixture's observation as a lerobot batch: its tensors, and the task of its metadata."""
    obs, meta = read_safetensors(FIXTURES / case / "obs.safetensors")
    batch = dict(obs)
    if "task" in meta:
        batch["task"] = meta["task"]
    return batch


def case_noise(case):
    return read_safetensors(FIXTURES / case / "noise.safetensors")[0]["noise"]


@pytest.fixture(scope="session")
def packages(tmp_path_factory):
    """case -> a .vlac package compiled from its policy folder (fp32, or bf16 for tiny_a_bf16)."""
    d = tmp_path_factory.mktemp("pkg")
    cache = {}

    def get(case):
        if case not in cache:
            out = d / f"{case}.vlac"
            dtype = "bf16" if case.endswith("bf16") else "fp32"
            run_vlac("compile", FIXTURES / case / "policy", "-o", out, "--dtype", dtype, "--quiet")
            cache[case] = out
        return cache[case]

    return get
