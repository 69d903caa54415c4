#!/usr/bin/env python3
"""Writes tests/fixtures/preprocessing/resize_with_pad.safetensors: lerobot's own
resize_with_pad_torch (lerobot.policies.common.vla_utils, as pi0.5's _preprocess_images calls it:
an HWC float image, batch dim added) on synthetic float CHW images, for vlac's unit tests.

Input of case (C, H, W, R): x[i] = ((i * 37) % 101) / 100 over the C*H*W elements in CHW order
(float32). Output key "out.C.H.W.R" = the [C, R, R] result (channels first again).
Run: /work/venv-fixtures/bin/python tools/make_resize_fixtures.py
"""
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from lerobot.policies.common.vla_utils import resize_with_pad_torch

CASES = [
    (3, 5, 7, 12),    # upscale, non-square (wider): pad top/bottom
    (3, 30, 20, 8),   # downscale, non-square (taller): pad left/right
    (3, 6, 6, 4),     # downscale, square: no pad
    (3, 4, 9, 9),     # one side already at R: copy, pad only
    (3, 3, 2, 16),    # large upscale, taller
]


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/preprocessing/resize_with_pad.safetensors")
    tensors = {}
    for c, h, w, r in CASES:
        i = np.arange(c * h * w)
        x = torch.from_numpy(((i * 37) % 101 / 100.0).astype(np.float32).reshape(c, h, w))
        hwc = x.permute(1, 2, 0).contiguous()[None]  # pi0.5 permutes CHW -> HWC before resizing
        y = resize_with_pad_torch(hwc, r, r)[0].permute(2, 0, 1).contiguous()
        tensors[f"out.{c}.{h}.{w}.{r}"] = y
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={"torch": torch.__version__, "producer": "tools/make_resize_fixtures.py"})
    print(f"wrote {out}: {len(tensors)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
