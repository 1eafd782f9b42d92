"""The vision tower's input rows as the Frontend hands them to the Program: uint8 patch values and a per-channel
lookup table, not float32 rows (numpy only: the Frontend imports it, and may not import torch).

    values [N, C, t, P*P] uint8     one row per patch in transformers' row order; t stored frames per row
    table  [C, 256] float32         the row value of a channel-c byte v is table[c, v] (normalisation, computed
                                    with the reference processor's float operations)
    repeat                          each row holds its t frames `repeat` times in a row along the temporal
                                    axis (an image: t = 1, repeat = temporal_patch_size; a video: repeat = 1)

    float32 rows [N, C * t * repeat * P * P] = table[c, values[n, c, tile(frames), p]]   (`float32`)

A 1024 x 1024 image is 1.5 MB of values against 25 MB of float32 rows: the Program copies the values to the
device and looks them up there (`program/vision.patch_rows_tensor`) instead of the host doing the lookup and
the float32 rows' transpose. Both give the same numbers bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class PatchRows:
    values: np.ndarray
    table: np.ndarray
    repeat: int = 1

    def __post_init__(self) -> None:
        v, t = self.values, self.table
        if not isinstance(v, np.ndarray) or v.dtype != np.uint8 or v.ndim != 4:
            raise ValueError(f"patch values must be uint8 [N, C, t, P*P], got {getattr(v, 'dtype', type(v))} "
                             f"{getattr(v, 'shape', '')}")
        if not isinstance(t, np.ndarray) or t.dtype != np.float32 or t.shape != (v.shape[1], 256):
            raise ValueError(f"the lookup table must be float32 [{v.shape[1]}, 256], got "
                             f"{getattr(t, 'dtype', type(t))} {getattr(t, 'shape', '')}")
        if not isinstance(self.repeat, int) or self.repeat < 1:
            raise ValueError(f"repeat must be a positive int, got {self.repeat!r}")

    @property
    def shape(self) -> tuple[int, int]:
        """The float32 rows' shape [N, C * T * P * P]."""
        n, c, t, pp = self.values.shape
        return n, c * t * self.repeat * pp

    def __len__(self) -> int:
        return self.values.shape[0]

    def __getitem__(self, rows: slice) -> "PatchRows":
        """A run of rows (a video's temporal group): the same table, a view of the values."""
        if not isinstance(rows, slice):
            raise TypeError("patch rows are sliced by row ranges only")
        return PatchRows(self.values[rows], self.table, self.repeat)

    def float32(self) -> np.ndarray:
        """The float32 rows on the host [N, C * T * P * P] (what transformers' processors return)."""
        n, c, t, pp = self.values.shape
        out = np.empty((n, c, t * self.repeat, pp), dtype=np.float32)
        for ch in range(c):
            np.take(self.table[ch], self.values[:, ch], out=out[:, ch, :t], mode="clip")
            for k in range(1, self.repeat):
                out[:, ch, k * t:(k + 1) * t] = out[:, ch, :t]
        return out.reshape(self.shape)


def patch_values(frames: np.ndarray, patch: int, merge: int, frames_per_row: int) -> tuple[np.ndarray, int, int, int]:
    """uint8 frames [F, H, W, C] -> (values [gt * gh * gw, C, frames_per_row, P * P], gt, gh, gw), rows in
    transformers' order (time group, merged row, merged column, the merge window's row and column), F =
    gt * frames_per_row, H and W multiples of patch * merge."""
    f, h, w, c = frames.shape
    t = frames_per_row
    gt, gh, gw = f // t, h // patch, w // patch
    p = frames.reshape(gt, t, gh // merge, merge, patch, gw // merge, merge, patch, c)
    p = p.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)            # (gt, gh/m, gw/m, m, m, C, t, P, P)
    return np.ascontiguousarray(p).reshape(gt * gh * gw, c, t, patch * patch), gt, gh, gw
