#!/usr/bin/env python3
"""Prints issue 14's acceptance table from tools/bench_cuda_vs_lerobot.py's JSON: per package (the
main one and each --extra-dtypes entry) the recorded chunk, host RSS + GPU above idle, and the
distance from lerobot fp32 of the same run (max |delta action_normalized|, its multiple of the
bf16-all package's and of lerobot bf16's, mean action cosine), then lerobot's own chunk times.
Each package is also held to issue 14's bounds ("bounds" column): host RSS + GPU above idle
<= 6.0 GiB for bf16 and fp32 packages, <= 3.5 GiB for 8-bit ones (int8, fp8, fp8-w8a8); max |delta|
<= lerobot bf16's own distance for bf16 packages, <= 2x the bf16-all package's with a mean cosine
>= 0.999 for 8-bit ones. The latency aims (bf16-all <= 12 ms, fp8 <= 7 ms) are shown apart
("aim"). With --check the exit status is 1 when a memory or accuracy bound is broken, so a change
that grows memory shows in the benchmark's own output (session 35's regression was found by eye).

Usage: tools/acceptance_table.py [--check] BENCH.json [BENCH.json ...]   (standard library only)
"""
from __future__ import annotations

import json
import sys


def gib(b):
    return f"{b / 2**30:.3f} GiB" if isinstance(b, (int, float)) and b else "-"


def ms(v):
    return f"{v:.2f} ms" if isinstance(v, (int, float)) else "-"


GIB = 2**30
EIGHT_BIT = ("int8", "fp8")


def is_eight_bit(name: str) -> bool:
    return name.split("@")[0].startswith(EIGHT_BIT)


def bounds(name, rec, mem, dm, cos, base, lr_bf16) -> tuple[list[str], str]:
    """(broken bounds, e.g. ["memory 3.545 > 3.5 GiB"], the latency aim's verdict or "")."""
    broken = []
    eight = is_eight_bit(name)
    limit = 3.5 if eight else 6.0
    if isinstance(mem, (int, float)) and mem > limit * GIB:
        broken.append(f"memory {mem / GIB:.3f} > {limit} GiB")
    if isinstance(dm, (int, float)):
        if eight and base and dm > 2 * base:
            broken.append(f"max|d| {dm / base:.2f}x > 2x bf16-all")
        if not eight and lr_bf16 and dm > lr_bf16:
            broken.append(f"max|d| {dm / lr_bf16:.2f}x > lerobot bf16")
    if eight and isinstance(cos, (int, float)) and cos < 0.999:
        broken.append(f"cosine {cos:.6f} < 0.999")
    base_name = name.split("@")[0]
    aim = 12.0 if base_name == "bf16-all" else 7.0 if base_name.startswith("fp8") else None
    verdict = ""
    if aim is not None and isinstance(rec, (int, float)):
        verdict = f"<= {aim:g} ms: {'met' if rec <= aim else 'not met'}"
    return broken, verdict


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


def main(args: list[str]) -> int:
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    broken_any = False
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
              f"{'/lr bf16':>8s} {'cosine':>9s}  bounds / aim")
        for name, rec, mem, dm, cos in rs:
            ratio = f"{dm / base:.2f}x" if dm and base else "-"
            rl = f"{dm / lr_bf16:.2f}x" if dm and lr_bf16 else "-"
            broken, aim = bounds(name, rec, mem, dm, cos, base, lr_bf16)
            broken_any = broken_any or bool(broken)
            verdict = ("BROKEN: " + "; ".join(broken)) if broken else "ok"
            print(f"{name:34s} {ms(rec):>10s} {gib(mem):>11s} {dm if dm is not None else float('nan'):8.4f} "
                  f"{ratio:>9s} {rl:>8s} {cos if cos is not None else float('nan'):9.6f}  {verdict}"
                  + (f" / aim {aim}" if aim else ""))
        for k in ("lerobot_bf16", "lerobot_fp32"):
            s = ((d.get(k) or {}).get("summary") or {}).get("chunk") or {}
            if s.get("median_ms") is not None:
                print(f"{k:34s} {ms(s['median_ms']):>10s}")
    return 1 if check and broken_any else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
