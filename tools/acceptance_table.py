#!/usr/bin/env python3
"""Prints issue 14's acceptance table from tools/bench_cuda_vs_lerobot.py's JSON: per package (the
main one and each --extra-dtypes entry) the recorded chunk, host RSS + GPU above idle, and the
distance from lerobot fp32 of the same run (max |delta action_normalized|, its multiple of the
bf16-all package's and of lerobot bf16's, mean action cosine), then lerobot's own chunk times.

Usage: tools/acceptance_table.py BENCH.json [BENCH.json ...]   (standard library only)
"""
from __future__ import annotations

import json
import sys


def gib(b):
    return f"{b / 2**30:.3f} GiB" if isinstance(b, (int, float)) and b else "-"


def ms(v):
    return f"{v:.2f} ms" if isinstance(v, (int, float)) else "-"


def rows(d: dict) -> list[tuple[str, float | None, float | None, float | None, float | None]]:
    """(name, recorded median ms, rss + gpu bytes, max |delta| vs lerobot fp32, mean cosine)."""
    out = []
    v = d.get("vlac") or {}
    acc = d.get("accuracy") or {}
    rec = (v.get("recorded_chunk") or {}).get("summary") or {}
    mem = v.get("memory") or {}
    setting = d.get("setting") if isinstance(d.get("setting"), dict) else {}
    out.append((str(setting.get("vlac_dtype") or v.get("dtype") or "main"), rec.get("median_ms"), mem.get("host_rss_plus_gpu_above_idle_bytes"),
                (acc.get("max_abs_delta_action_normalized") or {}).get("vlac_vs_lerobot_fp32"),
                (acc.get("mean_action_cosine") or {}).get("vlac_vs_lerobot_fp32")))
    for name, x in (d.get("extra") or {}).items():
        xa = x.get("accuracy_vs_lerobot_fp32") or {}
        out.append((name, (x.get("recorded_chunk") or {}).get("median_ms"), (x.get("memory") or {}).get("sum_bytes"),
                    xa.get("max_abs_delta"), xa.get("mean_action_cosine")))
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for p in paths:
        try:
            d = json.load(open(p))
        except (OSError, ValueError) as e:
            print(f"{p}: {e}", file=sys.stderr)
            return 1
        rs = rows(d)
        base = next((r[3] for r in rs if r[0].startswith("bf16-all") and r[3]), None)
        lr_bf16 = ((d.get("accuracy") or {}).get("max_abs_delta_action_normalized") or {}).get(
            "lerobot_bf16_vs_lerobot_fp32")
        print(f"== {p}")
        print(f"{'package':34s} {'recorded':>10s} {'rss+gpu':>11s} {'max|d|':>8s} {'/bf16-all':>9s} "
              f"{'/lr bf16':>8s} {'cosine':>9s}")
        for name, rec, mem, dm, cos in rs:
            ratio = f"{dm / base:.2f}x" if dm and base else "-"
            rl = f"{dm / lr_bf16:.2f}x" if dm and lr_bf16 else "-"
            print(f"{name:34s} {ms(rec):>10s} {gib(mem):>11s} {dm if dm is not None else float('nan'):8.4f} "
                  f"{ratio:>9s} {rl:>8s} {cos if cos is not None else float('nan'):9.6f}")
        for k in ("lerobot_bf16", "lerobot_fp32"):
            s = ((d.get(k) or {}).get("summary") or {}).get("chunk") or {}
            if s.get("median_ms") is not None:
                print(f"{k:34s} {ms(s['median_ms']):>10s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
