#!/usr/bin/env python3
"""Distance of action chunks from a reference chunk (e.g. `vlac run POLICY --dtype fp32`'s output).

    python3 tools/action_distance.py REF.safetensors OTHER.safetensors [OTHER ...] [--key action_normalized]

For each OTHER: max |Δ|, RMS of Δ and the mean over actions of the cosine similarity, over the
whole [chunk, width] tensor, and the max as a multiple of the first OTHER's (list the bf16 package
first to get issue 14's ratios); --json prints them as one object. Needs numpy only (safetensors
read from its header).
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def load(path: str, key: str) -> np.ndarray:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        if key not in header:
            raise SystemExit(f"{path}: no tensor '{key}' (has {', '.join(k for k in header if k != '__metadata__')})")
        m = header[key]
        if m["dtype"] not in DTYPES:
            raise SystemExit(f"{path}: '{key}' is {m['dtype']}, not a float tensor")
        a, b = m["data_offsets"]
        f.seek(8 + n + a)
        x = np.frombuffer(f.read(b - a), dtype=DTYPES[m["dtype"]]).astype(np.float64)
    shape = m["shape"]
    return x.reshape(-1, shape[-1] if shape else 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("others", nargs="+")
    ap.add_argument("--key", default="action_normalized")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = ap.parse_args()
    ref = load(args.ref, args.key)
    first = None
    rows = {}
    for p in args.others:
        g = load(p, args.key)
        if g.shape != ref.shape:
            raise SystemExit(f"{p}: shape {g.shape} is not the reference's {ref.shape}")
        d = np.abs(ref - g)
        cos = np.mean(np.sum(ref * g, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(g, axis=1)))
        first = d.max() if first is None else first
        rms = float(np.sqrt((d ** 2).mean()))
        rows[p] = {"max_abs": float(d.max()), "times_first": float(d.max() / first), "rms": rms, "mean_cosine": float(cos)}
        if not args.json:
            print(f"{p}: max {d.max():.5f} ({d.max() / first:.2f}x) rms {rms:.5f} cos {cos:.6f}")
    if args.json:
        print(json.dumps({"reference": args.ref, "key": args.key, "distances": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
