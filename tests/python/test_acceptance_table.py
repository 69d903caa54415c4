"""tools/acceptance_table.py holds each package to issue 14's memory and accuracy bounds, and with
--check exits 1 when one is broken (session 35's 8-bit memory regression was found only by eye)."""
import json
import subprocess
import sys

from conftest import ROOT

TOOL = ROOT / "tools" / "acceptance_table.py"
GIB = 2**30


def bench(tmp_path, int8_bytes, int8_delta, cosine=0.99997):
    d = {
        "setting": {"vlac_dtype": "bf16-all"},
        "vlac": {"recorded_chunk": {"summary": {"median_ms": 18.3}},
                 "memory": {"host_rss_plus_gpu_above_idle_bytes": int(5.92 * GIB)}},
        "accuracy": {"max_abs_delta_action_normalized": {"vlac_vs_lerobot_fp32": 0.0146,
                                                         "lerobot_bf16_vs_lerobot_fp32": 0.0224},
                     "mean_action_cosine": {"vlac_vs_lerobot_fp32": 0.999992}},
        "extra": {"int8": {"recorded_chunk": {"median_ms": 24.9}, "memory": {"sum_bytes": int8_bytes},
                           "accuracy_vs_lerobot_fp32": {"max_abs_delta": int8_delta, "mean_action_cosine": cosine}}},
        "lerobot_bf16": {"summary": {"chunk": {"median_ms": 220.3}}},
    }
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(d))
    return p


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True)


def test_within_bounds_passes_the_check(tmp_path):
    r = run("--check", bench(tmp_path, int(3.458 * GIB), 0.0291))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BROKEN" not in r.stdout
    assert "aim <= 12 ms: not met" in r.stdout  # the latency aim is reported, never a failure


def test_memory_over_the_bound_fails_the_check(tmp_path):
    p = bench(tmp_path, int(3.545 * GIB), 0.0291)
    r = run("--check", p)
    assert r.returncode == 1
    assert "BROKEN: memory 3.545 > 3.5 GiB" in r.stdout
    assert run(p).returncode == 0  # without --check it only prints


def test_accuracy_over_the_bound_fails_the_check(tmp_path):
    r = run("--check", bench(tmp_path, int(3.458 * GIB), 0.0306, cosine=0.998))
    assert r.returncode == 1
    assert "max|d| 2.10x > 2x bf16-all" in r.stdout and "cosine 0.998000 < 0.999" in r.stdout


def test_unreadable_file_is_one_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = run(bad)
    assert r.returncode == 1 and str(bad) in r.stderr
