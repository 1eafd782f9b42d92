"""Host-side video preprocessing for the Qwen3.6 vision tower (numpy, no torch); images, the configuration
and the placeholder text are in vision_preprocess.py.

Videos (transformers' `Qwen3VLVideoProcessor`, which runs on torch/torchvision):
  1. Input: uint8 frames [T, H, W, 3] (RGB) and the source frame rate `fps` (None: 24, as
     transformers assumes when the metadata lacks it).
  2. Frame indices (`sample_frame_indices`): with a sampling rate `cfg.fps`,
     n = clamp(int(T / source_fps * cfg.fps), min_frames, max_frames) and at most T; with a fixed
     `cfg.num_frames` (and no fps), n = num_frames; with neither, n = min(max(T, min_frames),
     max_frames). indices = round-half-even(linspace(0, T-1, n)). `do_sample_frames: false` keeps
     every frame (timestamps then use indices 0..T-1; transformers' processor has no indices to
     time them and fails). Callers that decode only the sampled frames pass them with
     `frame_indices`. `max_frame_pixels` refuses frames larger than a limit.
  3. (h, w) = smart_resize_video(n, H, W, ...): the image rule over the whole clip's pixel count
     (t_bar*h*w against min/max pixels, t_bar = round(n / temporal_patch_size) * temporal_patch_size;
     frames thinner than the factor are first scaled up to it); with `cap_pixels_per_frame`, the
     per-frame budget is max(min(max_video_tokens*factor^2, max_pixels // n), int(1.05*min_pixels)).
  4. Resize every frame with torch's uint8 antialiased bicubic (what torchvision runs on the CPU for
     a uint8 tensor), reproduced exactly here (`resize_uint8_bicubic_torch`): separable, width pass
     then height pass through a uint8 intermediate, Keys cubic a = -0.5 widened by the downscale
     factor, weights normalised then rounded to int16 at the largest precision that keeps the
     biggest weight below 2^15, sums rounded half up and clamped. It differs from Pillow's bicubic
     by one level on about 0.5% of pixels, so images and videos use different resizers on purpose.
  5. Fused rescale+normalise as the torchvision backend does: x = (float32(x) - mean/rescale) /
     (std/rescale), with mean/rescale and std/rescale computed in float32.
  6. Pad the frame count to a multiple of temporal_patch_size by repeating the last frame; grid
     (t, gh, gw) = (n'/temporal_patch_size, h/patch, w/patch); patches in (t, merge-block-major
     rows and columns) order, each flattened in (channel, time, row, column) order.
  7. Timestamps (`Qwen3VLProcessor._calculate_timestamps`): the sampled indices padded like the
     frames, seconds = index / source_fps, and one timestamp per temporal group: the mean of the
     group's first and last frame times.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ninfer.targets.qwen3_6.patch_rows import PatchRows, patch_values

from .resample import resize_uint8_bicubic_torch
from .vision_preprocess import VideoInput, VisionPreprocessConfig, _check_pixels, _table_fused, smart_resize_video


def sample_frame_indices(total_num_frames: int, cfg: VisionPreprocessConfig, fps: float | None = None) -> np.ndarray:
    """Indices of the source frames the video processor keeps (Qwen3VLVideoProcessor.sample_frames).

    fps: the source frame rate (None: 24, transformers' fallback).
    """
    if (isinstance(total_num_frames, bool) or not isinstance(total_num_frames, (int, np.integer))
            or total_num_frames <= 0):
        raise ValueError(f"a video needs at least one frame, got {total_num_frames!r}")
    total = int(total_num_frames)
    if not cfg.do_sample_frames:
        return np.arange(total)
    source_fps = _source_fps(fps)
    num = cfg.num_frames
    if num is None and cfg.fps is not None:
        num = int(total / source_fps * cfg.fps)
        num = min(max(num, cfg.min_frames), cfg.max_frames, total)
    if num is None:
        num = min(max(total, cfg.min_frames), cfg.max_frames)
    return np.linspace(0, total - 1, num).round().astype(int)


def _source_fps(fps: float | None) -> float:
    if fps is None:
        return 24.0
    if (isinstance(fps, bool) or not isinstance(fps, (int, float, np.floating, np.integer))
            or not math.isfinite(fps) or fps <= 0):
        raise ValueError(f"video fps must be a positive number, got {fps!r}")
    return float(fps)


def frame_timestamps(frame_indices: Sequence[int], source_fps: float, temporal_patch_size: int) -> tuple[float, ...]:
    """Seconds of each temporal group: mean of its first and last frame time (indices padded by repeating the last)."""
    idx = [int(i) for i in frame_indices]
    if len(idx) % temporal_patch_size:
        idx.extend(idx[-1] for _ in range(temporal_patch_size - len(idx) % temporal_patch_size))
    secs = [i / source_fps for i in idx]
    return tuple((secs[i] + secs[i + temporal_patch_size - 1]) / 2 for i in range(0, len(secs), temporal_patch_size))


def preprocess_video(frames: np.ndarray, cfg: VisionPreprocessConfig, fps: float | None = None, *,
                     frame_indices: Sequence[int] | None = None, max_frame_pixels: int | None = None) -> VideoInput:
    """RGB uint8 frames [T, H, W, 3] at source rate `fps` -> VideoInput equal to transformers'
    Qwen3VLVideoProcessor and Qwen3VLProcessor timestamps (module docstring).

    frame_indices: the frames are already the sampled ones, taken at these source indices (from
    `sample_frame_indices`), so only those need decoding; None: `frames` is the whole video and
    is sampled here. max_frame_pixels: refuse frames larger than this.
    """
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        got = f"{frames.dtype} {frames.shape}" if isinstance(frames, np.ndarray) else type(frames).__name__
        raise ValueError(f"video frames must be an RGB uint8 array [T, H, W, 3], got {got}")
    total, height, width = frames.shape[:3]
    if total == 0:
        raise ValueError("video has no frames")
    _check_pixels(width, height, max_frame_pixels)
    source_fps = _source_fps(fps)
    if frame_indices is None:
        indices = sample_frame_indices(total, cfg, source_fps)
        frames = frames[indices]
    else:
        indices = np.asarray([int(i) for i in frame_indices], dtype=np.int64)
        if len(indices) != total:
            raise ValueError(f"frame_indices has {len(indices)} entries for {total} frames")
        if (indices < 0).any():
            raise ValueError("frame_indices must be non-negative")
    n = len(indices)
    tp, factor = cfg.temporal_patch_size, cfg.factor
    max_pixels = cfg.video_max_pixels
    if cfg.cap_pixels_per_frame:
        frame_cap = cfg.max_video_tokens * factor * factor
        max_pixels = max(min(frame_cap, cfg.video_max_pixels // n), int(cfg.video_min_pixels * 1.05)) * n
    rh, rw = smart_resize_video(n, height, width, tp, factor, cfg.video_min_pixels, max_pixels)
    if (rh, rw) != (height, width):
        frames = resize_uint8_bicubic_torch(frames, rh, rw)
    table = _table_fused(cfg.video_rescale_factor, cfg.video_mean, cfg.video_std)
    if pad := -len(frames) % tp:             # the last frame repeated up to a whole temporal group
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)], axis=0)
    values, gt, gh, gw = patch_values(frames, cfg.patch_size, cfg.merge_size, tp)
    return VideoInput(rows=PatchRows(values, table), grid_thw=(gt, gh, gw),
                      frame_indices=tuple(int(i) for i in indices), source_fps=source_fps,
                      timestamps=frame_timestamps(indices, source_fps, tp))
