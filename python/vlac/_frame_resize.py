"""The camera-frame resize lerobot's policy server applies before the policy sees a frame
(lerobot.async_inference.helpers.resize_robot_observation_image: the robot's uint8 HWC frame,
torch.nn.functional.interpolate(mode="bilinear", align_corners=False) to the config's image
feature size), redone in numpy without torch.

On a uint8 frame torch's CPU kernel (upsample_bilinear2d on uint8, the AVX2 path for <= 4
channels) is separable and fixed point, Pillow-style: per axis, output i has centre
c = (i + 0.5) * in / out (double), taps xmin = max(trunc(c - 0.5), 0) .. min(trunc(c + 1.5), in)
(2 at most), weights max(0, 1 - |x + xmin - c + 0.5|) normalised to sum 1, then scaled to int16
with the largest precision p (<= 22) for which round(w_max * 2^(p+1)) < 2^15, rounded half away
from zero. Each pass computes (sum(pixel * w) + 2^(p-1)) >> p clamped to [0, 255]: the
horizontal pass first (into a uint8 buffer), then the vertical one; an axis whose size does not
change is not touched. tests/python/test_serve.py checks hand-computed cases (and torch's own
result where torch is installed).
"""
from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=64)
def _taps(n_in: int, n_out: int):
    """(first tap index [n_out], second tap index [n_out], int16 weights [n_out, 2], precision)."""
    scale = n_in / n_out
    idx = np.zeros((n_out, 2), np.int64)
    wts = np.zeros((n_out, 2), np.float64)
    for i in range(n_out):
        c = scale * (i + 0.5)
        xmin = max(int(c - 1.0 + 0.5), 0)
        xsize = min(max(min(int(c + 1.0 + 0.5), n_in) - xmin, 0), 2)
        w = [max(0.0, 1.0 - abs(j + xmin - c + 0.5)) for j in range(xsize)]
        total = sum(w)
        for j in range(xsize):
            idx[i, j] = xmin + j
            wts[i, j] = w[j] / total if total != 0.0 else w[j]
        if xsize < 2:
            idx[i, 1] = idx[i, 0]  # weight 0: any valid index
    w_max = float(wts.max())
    p = 0
    while p < 22 and int(0.5 + w_max * (1 << (p + 1))) < (1 << 15):
        p += 1
    v = wts * (1 << p)
    w16 = np.where(v < 0, (-0.5 + v).astype(np.int64), (0.5 + v).astype(np.int64))
    return idx[:, 0], idx[:, 1], w16, p


def _pass(img: np.ndarray, axis: int, n_out: int) -> np.ndarray:
    i0, i1, w, p = _taps(img.shape[axis], n_out)
    shape = [1] * img.ndim
    shape[axis] = n_out
    w0, w1 = w[:, 0].reshape(shape), w[:, 1].reshape(shape)
    x = img.astype(np.int64, copy=False)
    acc = np.take(x, i0, axis=axis) * w0 + np.take(x, i1, axis=axis) * w1 + (1 << (p - 1) if p else 0)
    return np.clip(acc >> p, 0, 255).astype(np.uint8)


def resize_u8_hwc(frame: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """A uint8 [H, W, C] frame resized to [out_h, out_w, C] as lerobot's server resizes it."""
    if frame.dtype != np.uint8 or frame.ndim != 3:
        raise ValueError("resize_u8_hwc takes a uint8 [H, W, C] frame")
    out = frame
    if frame.shape[1] != out_w:
        out = _pass(out, 1, out_w)
    if frame.shape[0] != out_h:
        out = _pass(out, 0, out_h)
    return out
