#!/usr/bin/env python3
"""What each part of a recorded chunk costs, from one device call's pi05_chunk_bench runs.

tools/device_cuda_ab.sh with BREAKDOWN=1 runs the package once per setting: the bases as they are,
and the others with some nodes left unlaunched (VLAC_TIMING_SKIP, VLAC_ATTN_PROBE; docs/cuda.md,
"What a recorded chunk spends"). A part costs the bases' mean recorded chunk minus the chunk
without it. Reads the settings' JSON files (ab_NAME.json, or any NAME.json: the name is what
follows the last "ab_" or the call's tag), prints a table, and with --json FILE writes it.

  python3 tools/recorded_breakdown.py /tmp/ab_*.json [--json breakdown.json]
"""
import argparse
import json
import os
import re
import statistics
import sys

# The settings BREAKDOWN=1 runs (tools/device_cuda_ab.sh takes them from --settings, so this is
# the one list): name, the environment that leaves the part out, what it is, and the part's
# launches per chunk (pi0.5: 18 expert layers x 10 steps, 17 full LM layers), for a per-launch figure.
PARTS = [
    ("x_gemm", "VLAC_TIMING_SKIP=expert.*_proj", "expert GEMMs (q|k|v, o, gate|up, down)", 180),
    ("x_att", "VLAC_TIMING_SKIP=expert.*.attention", "expert attention (splits + combine)", 180),
    ("x_att_split", "VLAC_ATTN_PROBE=2", "... its splits' kernel", 180),
    ("x_att_comb", "VLAC_ATTN_PROBE=1", "... its combine", 180),
    ("x_norm", "VLAC_TIMING_SKIP=expert.*layernorm", "expert adaRMS residual norms (2 a layer)", 360),
    ("x_rope", "VLAC_TIMING_SKIP=expert.*.rope", "expert RoPE (q and k, one launch)", 180),
    ("x_geglu", "VLAC_TIMING_SKIP=expert.*.geglu", "expert GeGLU", 180),
    ("lm_gemm", "VLAC_TIMING_SKIP=lm.*_proj", "prefix LM GEMMs", 17),
    ("lm_att", "VLAC_TIMING_SKIP=lm.*.attention", "prefix LM attention", 17),
    ("lm_small", "VLAC_TIMING_SKIP=lm.*layernorm|lm.*.rope|lm.*.geglu|lm.*.residual*",
     "prefix LM norms, RoPE, GeGLU, boundary residuals", 17),
    ("vision", "VLAC_TIMING_SKIP=vision.*", "vision (SigLIP and its projector)", 0),
    ("step", "VLAC_TIMING_SKIP=euler_step|action_*_proj|expert.norm|cond*",
     "per step outside the layers (Euler, action in/out, final norm, cond)", 10),
]


def name_of(path: str) -> str:
    base = os.path.basename(path)
    base = base[:-5] if base.endswith(".json") else base
    m = re.search(r"(?:^|_)ab_(.+)$", base)
    if m:
        return m.group(1)
    m = re.search(r"_call\d+_(.+)$", base)  # bench/results names: ..._callN_<setting>
    return m.group(1) if m else base


def recorded_ms(path: str):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"recorded_breakdown: {path}: {e}", file=sys.stderr)
        return None
    return ((d.get("recorded_chunk") or {}).get("summary") or {}).get("median_ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="pi05_chunk_bench JSON files, one per setting")
    ap.add_argument("--json", help="also write the table here")
    ap.add_argument("--settings", action="store_true",
                    help="print the settings to run (NAME:VAR=VALUE, one a line, between two bases) and exit")
    args = ap.parse_args()
    if args.settings:
        print("base_b1")
        for key, env, _, _ in PARTS:
            print(f"{key}:{env}")
        print("base_b2")
        return 0
    if not args.files:
        ap.error("no files")
    runs = {}
    for p in args.files:
        ms = recorded_ms(p)
        if ms is not None:
            runs[name_of(p)] = ms
    bases = [ms for n, ms in runs.items() if n.startswith("base")]
    if not bases:
        print("recorded_breakdown: no base run (a setting named base...) among the files", file=sys.stderr)
        return 1
    base = statistics.mean(bases)
    print(f"recorded chunk, bases: {', '.join(f'{b:.3f}' for b in bases)} ms (mean {base:.3f}; "
          f"their spread {max(bases) - min(bases):.3f} ms is the noise floor)")
    print(f"{'part':<72} {'ms a chunk':>10} {'us each':>8}")
    rows = []
    for key, _, what, launches in PARTS:
        if key not in runs:
            continue
        cost = base - runs[key]
        each = cost * 1000.0 / launches if launches else None
        rows.append({"setting": key, "part": what, "ms_per_chunk": round(cost, 4),
                     "us_per_launch": round(each, 2) if each is not None else None,
                     "recorded_without_ms": runs[key]})
        print(f"{what:<72} {cost:10.3f} {each:8.2f}" if each is not None else f"{what:<72} {cost:10.3f} {'':>8}")
    known = {k for k, _, _, _ in PARTS}
    for n, ms in sorted(runs.items()):
        if not n.startswith("base") and n not in known:
            print(f"(other setting {n}: recorded {ms:.3f} ms, {base - ms:+.3f} against the bases)")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"base_ms": bases, "base_mean_ms": base, "parts": rows}, f, indent=2)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
