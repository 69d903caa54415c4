#!/usr/bin/env python3
"""Relative RMS weight error of vlac's 8-bit codes against bf16 rounding, by weight distribution.

Paper arithmetic for docs/quantization.md: how far each code is from the weights before any
activation touches them. Rows of K weights, one scale per row (or per group of G along K) mapping
the absolute maximum to the top code: int8 (127) and e4m3 (448, 3 mantissa bits, round to nearest
even), against rounding the same weights to bf16. Uniform rows are what `vlac_write_pi05` and
torch's default Linear init give; normal rows are closer to trained checkpoints.

Usage: tools/quant_weight_error.py [--rows 256] [--k 2048] [--seed 0]   (numpy only; prints a table)
"""
import argparse

import numpy as np


def bf16(x):
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def e4m3(x):
    """Nearest e4m3 value (normals 2^-6..448 with 3 mantissa bits, subnormals in steps of 2^-9)."""
    ax = np.abs(x)
    e = np.clip(np.floor(np.log2(np.maximum(ax, 2.0 ** -6))), -6, 8)
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(ax / step) * step, 448.0)


def quant(w, group, top, code):
    rows, k = w.shape
    x = w.reshape(rows, k // group, group)
    s = np.abs(x).max(axis=2, keepdims=True) / top
    s[s == 0] = 1.0
    return (code(x / s) * s).reshape(rows, k)


def rel_rms(q, w):
    return float(np.sqrt(((q - w) ** 2).mean() / (w ** 2).mean()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    dists = {"uniform": rng.uniform(-1, 1, (a.rows, a.k)), "normal": rng.standard_normal((a.rows, a.k))}
    print(f"relative RMS weight error, {a.rows} rows x K = {a.k}; x = times bf16's")
    print(f"{'weights':8s} {'bf16':>8s} {'int8 row':>16s} {'int8 g128':>16s} {'e4m3 row':>16s}")
    for name, w in dists.items():
        w = w.astype(np.float32)
        b = rel_rms(bf16(w), w)
        cells = [rel_rms(quant(w, a.k, 127, np.round), w), rel_rms(quant(w, 128, 127, np.round), w),
                 rel_rms(quant(w, a.k, 448, e4m3), w)]
        print(f"{name:8s} {b:8.5f} " + " ".join(f"{c:8.5f} ({c / b:4.1f}x)" for c in cells))


if __name__ == "__main__":
    main()
