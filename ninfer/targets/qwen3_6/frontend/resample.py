"""The uint8 antialiased bicubic resize that torch (and so torchvision) runs on the CPU, reproduced bit for bit
in numpy: the Qwen3.6 video processor's frame resize, and the image processor's under its torchvision backend
(vision_preprocess.py, video_preprocess.py). precision=22 gives Pillow's BICUBIC instead."""
from __future__ import annotations

import math

import numpy as np

_BLOCK_ELEMENTS = 1 << 18      # resampler working-set size (elements of one output block)


def _cubic_keys(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _aa_bicubic_int_weights(in_size: int, out_size: int, precision: int | None = None):
    """(first tap, integer weights [out, taps], precision) of one antialiased bicubic pass.

    precision None: torch's uint8 rule (largest p < 22 keeping round(max weight * 2^(p+1)) < 2^15);
    22 gives Pillow's fixed precision."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    taps = int(math.ceil(support)) * 2 + 1
    center = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    xsize = np.clip(xmax - xmin, 0, taps)
    j = np.arange(taps)
    w = _cubic_keys((j[None, :] + xmin[:, None] - center[:, None] + 0.5) * invscale)
    w = np.where(j[None, :] < xsize[:, None], w, 0.0)
    total = np.zeros(out_size)
    for k in range(taps):              # sequential sum, as the reference does
        total = total + w[:, k]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    if precision is None:
        wt_max = float(w.max()) if w.size else 0.0
        precision = 0
        while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
            precision += 1
    v = w * float(1 << precision)
    iw = np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int64)
    return xmin, iw, precision


def _resample_axis(x: np.ndarray, axis: int, out_size: int, precision: int | None) -> np.ndarray:
    in_size = x.shape[axis]
    if in_size == out_size:
        return x
    xmin, iw, p = _aa_bicubic_int_weights(in_size, out_size, precision)
    acc_t = np.int32 if p <= 16 else np.int64
    lead, trail = x.shape[:axis], x.shape[axis + 1:]
    n_lead, n_trail = math.prod(lead), math.prod(trail)
    flat = x.reshape(n_lead, in_size, n_trail)
    out = np.empty((n_lead, out_size, n_trail), dtype=np.uint8)
    # blocks small enough for the temporaries to stay in cache
    cols = min(n_trail, max(1, _BLOCK_ELEMENTS // out_size))
    rows = max(1, _BLOCK_ELEMENTS // (out_size * cols))
    taps = [(np.minimum(xmin + k, in_size - 1), iw[:, k].astype(acc_t).reshape(1, -1, 1))
            for k in range(iw.shape[1]) if iw[:, k].any()]      # zero weights where the window is shorter
    for r in range(0, n_lead, rows):
        for c in range(0, n_trail, cols):
            block = flat[r:r + rows, :, c:c + cols]
            acc = np.full((block.shape[0], out_size, block.shape[2]), 1 << (p - 1), dtype=acc_t)
            tmp = np.empty_like(acc)
            for idx, wk in taps:
                np.multiply(np.take(block, idx, axis=1), wk, out=tmp)
                acc += tmp
            np.right_shift(acc, p, out=acc)
            np.clip(acc, 0, 255, out=acc)
            out[r:r + rows, :, c:c + cols] = acc
    return out.reshape(*lead, out_size, *trail)


def resize_uint8_bicubic_torch(frames: np.ndarray, height: int, width: int, *,
                               precision: int | None = None) -> np.ndarray:
    """Antialiased bicubic resize of uint8 [..., H, W, C] frames, bit-exact with
    torch.nn.functional.interpolate(mode="bicubic", antialias=True) on uint8 (CPU) and so with
    torchvision's resize. precision=22 gives Pillow's BICUBIC instead.

    Cost: each pass does (taps per output sample) multiply-adds per output sample, taps about
    4 * max(1, in/out) + 1, so roughly 4 per input sample when shrinking; pure numpy, int32."""
    if frames.dtype != np.uint8 or frames.ndim < 3:
        raise ValueError(f"frames must be uint8 [..., H, W, C], got {frames.dtype} {frames.shape}")
    out = _resample_axis(frames, frames.ndim - 2, width, precision)      # width pass first
    return _resample_axis(out, frames.ndim - 3, height, precision)
