"""Host-side image and video preprocessing for the Qwen3.6 vision tower (numpy and Pillow, no torch).

The output equals what Hugging Face transformers (5.24) hands the model for the same input and
the same `preprocessor_config.json` / `video_preprocessor_config.json`:

    cfg = VisionPreprocessConfig.from_resources(artifact.frontend_resources())
    img = preprocess_image(png_bytes, cfg, max_image_pixels=64_000_000)
    img.pixel_values        # float32 [gh*gw, 3*2*16*16], img.grid_thw == (1, gh, gw)
    img.rows                # the same rows as uint8 patch values + lookup table (patch_rows.py): the Program's input
    vid = preprocess_video(frames_thwc_uint8, cfg, fps=29.97)      # video_preprocess.py
    video_placeholder_text(vid, cfg.merge_size)      # what replaces the prompt's one <|video_pad|>

Images (transformers' `Qwen2VLImageProcessorPil`, the PIL backend):
  1. Input: a PIL image (taken as given), an RGB uint8 array [H, W, 3], or encoded bytes. Bytes are
     opened with Pillow restricted to ALLOWED_IMAGE_FORMATS (PNG, JPEG, WebP, GIF, BMP; a GIF
     or animated WebP/PNG gives its first frame). The header's size is checked against
     `max_image_pixels` before any pixel is decoded (decompression bombs), then the EXIF
     orientation is applied (`ImageOps.exif_transpose`, as transformers' `load_image` does for a
     URL, path or base64 image).
  2. RGB: an image with an alpha band or a `transparency` entry (RGBA, LA, palette or grayscale
     with a transparent colour) is converted to RGBA and composited onto opaque white; any other
     mode goes through `Image.convert("RGB")` (grayscale repeated, palette looked up, CMYK converted).
  3. (h, w) = smart_resize(H, W, factor=patch_size*merge_size, min_pixels, max_pixels), then a
     Pillow BICUBIC resize of the uint8 RGB image (no reducing gap). Small images are enlarged.
  4. x = float32(float64(x) * rescale_factor); x = (x - mean) / std in float32, per channel.
  5. Patchify: grid (gh, gw) = (h/patch, w/patch); each patch is the frame repeated
     temporal_patch_size times, flattened in (channel, time, row, column) order; the patch sequence
     is merge-block-major: for each merge_size x merge_size block (row-major over blocks), its
     patches row-major. pixel_values [gh*gw, C*T*P*P], grid_thw (1, gh, gw).
  `image_backend="torchvision"` instead reproduces `Qwen2VLImageProcessor` (the "Fast" class the
  checkpoint's image_processor_type names, which transformers picks when torchvision is installed,
  as under vLLM): steps 3 and 4 become the video path's steps 4 and 5 (torch's uint8 bicubic and the
  fused normalisation). Both backends give the same grid; pixel values differ slightly.

Videos: video_preprocess.py (transformers' `Qwen3VLVideoProcessor`); the uint8 antialiased bicubic
resampler both paths use where torchvision would: resample.py.

Prompt expansion (transformers' `Qwen3VLProcessor`, also used for Qwen3.5/3.6):
  - Image: the chat template's one `<|image_pad|>` becomes t*h*w / merge_size^2 copies; the
    template's `<|vision_start|>`/`<|vision_end|>` around it stay.
  - Video: the template emits `<|vision_start|><|video_pad|><|vision_end|>`; the one
    `<|video_pad|>` is replaced by, for each temporal group g (grid t groups):
        f"<{timestamps[g]:.1f} seconds>" + "<|vision_start|>" + "<|video_pad|>" * (h*w/merge^2) + "<|vision_end|>"
    so the template's own start/end tokens enclose the whole sequence (a `<|vision_start|>`
    directly followed by the first timestamp text, and `<|vision_end|><|vision_end|>` at the end).
    The timestamp text is ordinary text, tokenized with the rest of the prompt. The model's
    `get_rope_index` then treats each group as a grid (1, h, w).

Configs: `VisionPreprocessConfig.from_dicts(image_cfg, video_cfg)`. A file that is present is read
as transformers reads it: a key it omits takes the transformers class default (Qwen2VL image
processor, Qwen3VL video processor). A file that is absent (an artifact converted before these
files were stored, or a checkpoint without them) takes the Qwen3.6 family values (FAMILY_IMAGE_CONFIG,
FAMILY_VIDEO_CONFIG: the official checkpoints' files). Settings this module does not implement
(do_resize/do_rescale/do_normalize/do_convert_rgb false, a resample filter other than bicubic,
image and video patch geometry that differ) are refused with a ValueError naming the key.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ninfer.targets.qwen3_6.patch_rows import PatchRows, patch_values

from .resample import resize_uint8_bicubic_torch

PREPROCESSOR_CONFIG = "preprocessor_config.json"
VIDEO_PREPROCESSOR_CONFIG = "video_preprocessor_config.json"

# Encoded formats preprocess_image opens (Pillow format names; "JPEG" also opens the multi-picture
# JPEGs many cameras write, which Pillow reports as MPO). Everything else is refused before decoding.
ALLOWED_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")

_BICUBIC = 3    # PIL.Image.Resampling.BICUBIC, the value transformers stores as "resample"
IMAGE_BACKENDS = ("pil", "torchvision")

# The official Qwen3.6 files (qwen3_6.md 2.3), used when a file is absent.
FAMILY_IMAGE_CONFIG: dict[str, Any] = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
FAMILY_VIDEO_CONFIG: dict[str, Any] = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}

# transformers' class defaults, for keys a present file omits.
_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_IMAGE_CLASS_DEFAULTS: dict[str, Any] = {       # Qwen2VLImageProcessor(Pil)
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}, "patch_size": 14,
    "temporal_patch_size": 2, "merge_size": 2, "image_mean": _OPENAI_CLIP_MEAN, "image_std": _OPENAI_CLIP_STD,
    "rescale_factor": 1 / 255, "resample": _BICUBIC, "do_resize": True, "do_rescale": True,
    "do_normalize": True, "do_convert_rgb": True}
_VIDEO_CLASS_DEFAULTS: dict[str, Any] = {       # Qwen3VLVideoProcessor
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, "patch_size": 16,
    "temporal_patch_size": 2, "merge_size": 2, "image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5),
    "rescale_factor": 1 / 255, "resample": _BICUBIC, "do_resize": True, "do_rescale": True,
    "do_normalize": True, "do_convert_rgb": True, "fps": 2, "num_frames": None, "min_frames": 4,
    "max_frames": 768, "do_sample_frames": True, "cap_pixels_per_frame": None, "max_video_tokens": 768}


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

def _as_int(d: Mapping, key: str, what: str, *, minimum: int = 1) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
        raise ValueError(f"{what}: {key} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _as_triple(d: Mapping, key: str, what: str) -> tuple[float, float, float]:
    v = d[key]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * 3
    if (not isinstance(v, (list, tuple)) or len(v) != 3
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
        raise ValueError(f"{what}: {key} must be 3 numbers (one per RGB channel), got {v!r}")
    return tuple(float(x) for x in v)


def _pixels(d: Mapping, what: str) -> tuple[int, int]:
    """(min_pixels, max_pixels) as transformers reads them: size.shortest_edge / size.longest_edge,
    overridden by top-level min_pixels / max_pixels (the older Qwen2-VL names)."""
    size = d.get("size")
    size = dict(size) if isinstance(size, Mapping) else {}
    if d.get("min_pixels") is not None:
        size["shortest_edge"] = d["min_pixels"]
    if d.get("max_pixels") is not None:
        size["longest_edge"] = d["max_pixels"]
    if size.get("shortest_edge") is None and size.get("min_pixels") is not None:
        size["shortest_edge"] = size["min_pixels"]
    if size.get("longest_edge") is None and size.get("max_pixels") is not None:
        size["longest_edge"] = size["max_pixels"]
    for key in ("shortest_edge", "longest_edge"):
        if size.get(key) is None:
            raise ValueError(f"{what}: size must hold 'shortest_edge' and 'longest_edge' (min and max pixels)")
    lo = _as_int(size, "shortest_edge", f"{what} size")
    hi = _as_int(size, "longest_edge", f"{what} size")
    if lo > hi:
        raise ValueError(f"{what}: size.shortest_edge ({lo}) exceeds size.longest_edge ({hi})")
    return lo, hi


def _merged(raw: Mapping | None, defaults: Mapping, family: Mapping, what: str) -> dict:
    if raw is None:
        return {**defaults, **family}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(raw).__name__}")
    out = dict(defaults)
    out.update({k: v for k, v in raw.items() if v is not None or k in ("num_frames", "fps", "cap_pixels_per_frame")})
    return out


def _require_flags(d: Mapping, what: str) -> None:
    for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if d.get(key) is not True:
            raise ValueError(f"{what}: {key}={d.get(key)!r} is not supported (the Qwen3.6 processors set it true)")
    if d.get("resample") != _BICUBIC:
        raise ValueError(f"{what}: resample={d.get('resample')!r} is not supported (only bicubic, {_BICUBIC})")
    rf = d.get("rescale_factor")
    if isinstance(rf, bool) or not isinstance(rf, (int, float)) or not rf > 0:
        raise ValueError(f"{what}: rescale_factor must be a positive number, got {rf!r}")


@dataclass(frozen=True)
class VisionPreprocessConfig:
    """Image and video preprocessing settings (transformers' names; see the module docstring)."""
    # patch geometry (shared by images and videos: one tower)
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    # images: size.shortest_edge / size.longest_edge are pixel counts, not edges
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    image_backend: str = "pil"              # "pil" | "torchvision" (see the module docstring)
    # videos
    video_min_pixels: int = 4096
    video_max_pixels: int = 25165824
    video_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    video_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    video_rescale_factor: float = 1 / 255
    fps: float | None = 2.0                 # sampling rate (frames per second of video)
    num_frames: int | None = None           # fixed frame count (transformers: exclusive with fps)
    min_frames: int = 4
    max_frames: int = 768
    do_sample_frames: bool = True
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    @property
    def factor(self) -> int:
        """Spatial resize granularity: patch_size * merge_size."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Length of one pixel_values row: 3 * temporal_patch_size * patch_size^2."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def __post_init__(self) -> None:
        if self.image_backend not in IMAGE_BACKENDS:
            raise ValueError(f"image_backend must be one of {', '.join(IMAGE_BACKENDS)}, got {self.image_backend!r}")

    @classmethod
    def from_dicts(cls, image_cfg: Mapping | None = None, video_cfg: Mapping | None = None, *,
                   image_backend: str = "pil") -> "VisionPreprocessConfig":
        """From the parsed preprocessor_config.json / video_preprocessor_config.json (None: absent)."""
        im = _merged(image_cfg, _IMAGE_CLASS_DEFAULTS, FAMILY_IMAGE_CONFIG, PREPROCESSOR_CONFIG)
        vd = _merged(video_cfg, _VIDEO_CLASS_DEFAULTS, FAMILY_VIDEO_CONFIG, VIDEO_PREPROCESSOR_CONFIG)
        _require_flags(im, PREPROCESSOR_CONFIG)
        _require_flags(vd, VIDEO_PREPROCESSOR_CONFIG)
        geometry = {}
        for key in ("patch_size", "temporal_patch_size", "merge_size"):
            a = _as_int(im, key, PREPROCESSOR_CONFIG)
            b = _as_int(vd, key, VIDEO_PREPROCESSOR_CONFIG)
            if a != b:
                raise ValueError(f"{key} differs between {PREPROCESSOR_CONFIG} ({a}) and "
                                 f"{VIDEO_PREPROCESSOR_CONFIG} ({b}); the vision tower has one")
            geometry[key] = a
        lo, hi = _pixels(im, PREPROCESSOR_CONFIG)
        vlo, vhi = _pixels(vd, VIDEO_PREPROCESSOR_CONFIG)
        fps, num_frames = vd.get("fps"), vd.get("num_frames")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0):
            raise ValueError(f"{VIDEO_PREPROCESSOR_CONFIG}: fps must be a positive number or null, got {fps!r}")
        if num_frames is not None:
            num_frames = _as_int(vd, "num_frames", VIDEO_PREPROCESSOR_CONFIG)
            if fps is not None and vd.get("do_sample_frames", True):
                raise ValueError(f"{VIDEO_PREPROCESSOR_CONFIG}: num_frames and fps are mutually exclusive "
                                 "(set fps to null to sample a fixed number of frames)")
        min_frames = _as_int(vd, "min_frames", VIDEO_PREPROCESSOR_CONFIG)
        max_frames = _as_int(vd, "max_frames", VIDEO_PREPROCESSOR_CONFIG)
        if min_frames > max_frames:
            raise ValueError(f"{VIDEO_PREPROCESSOR_CONFIG}: min_frames ({min_frames}) exceeds "
                             f"max_frames ({max_frames})")
        std = _as_triple(im, "image_std", PREPROCESSOR_CONFIG)
        vstd = _as_triple(vd, "image_std", VIDEO_PREPROCESSOR_CONFIG)
        if 0.0 in std or 0.0 in vstd:
            raise ValueError("image_std must not contain 0")
        return cls(
            **geometry, min_pixels=lo, max_pixels=hi,
            image_mean=_as_triple(im, "image_mean", PREPROCESSOR_CONFIG), image_std=std,
            rescale_factor=float(im["rescale_factor"]), image_backend=image_backend,
            video_min_pixels=vlo, video_max_pixels=vhi,
            video_mean=_as_triple(vd, "image_mean", VIDEO_PREPROCESSOR_CONFIG), video_std=vstd,
            video_rescale_factor=float(vd["rescale_factor"]),
            fps=None if fps is None else float(fps), num_frames=num_frames,
            min_frames=min_frames, max_frames=max_frames,
            do_sample_frames=bool(vd.get("do_sample_frames", True)),
            cap_pixels_per_frame=bool(vd.get("cap_pixels_per_frame")),
            max_video_tokens=_as_int(vd, "max_video_tokens", VIDEO_PREPROCESSOR_CONFIG))

    @classmethod
    def from_resources(cls, resources: Mapping[str, bytes | str], *,
                       image_backend: str = "pil") -> "VisionPreprocessConfig":
        """From an artifact's frontend resources (`Artifact.frontend_resources()`); absent files
        take the family values."""
        def load(name: str) -> Any:
            raw = resources.get(name)
            if raw is None:
                return None
            try:
                return json.loads(raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw)
            except ValueError as e:
                raise ValueError(f"{name} is not valid JSON: {e}") from None
        return cls.from_dicts(load(PREPROCESSOR_CONFIG), load(VIDEO_PREPROCESSOR_CONFIG), image_backend=image_backend)

    def check_tower(self, *, patch_size: int, temporal_patch_size: int, spatial_merge_size: int) -> None:
        """Raise ValueError when the preprocessing geometry does not fit the vision tower's config."""
        ours = (self.patch_size, self.temporal_patch_size, self.merge_size)
        tower = (patch_size, temporal_patch_size, spatial_merge_size)
        if ours != tower:
            raise ValueError(f"the preprocessor's (patch_size, temporal_patch_size, merge_size) {ours} "
                             f"does not match the vision tower's {tower}")


# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------

def _check_aspect(height: int, width: int) -> None:
    if min(height, width) <= 0:
        raise ValueError(f"image size {height}x{width} is empty")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image aspect ratio {max(height, width) / min(height, width):.1f} exceeds 200 "
                         f"(size {height}x{width})")


def smart_resize(height: int, width: int, factor: int = 32, min_pixels: int = 65536,
                 max_pixels: int = 16777216) -> tuple[int, int]:
    """transformers' image smart_resize: both sides multiples of `factor`, the area within
    [min_pixels, max_pixels], the aspect ratio kept as closely as possible (Python's round-half-even)."""
    _check_aspect(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video(num_frames: int, height: int, width: int, temporal_factor: int = 2, factor: int = 32,
                       min_pixels: int = 4096, max_pixels: int = 25165824) -> tuple[int, int]:
    """transformers' Qwen3-VL video smart_resize: the pixel bounds apply to the whole clip."""
    if num_frames < temporal_factor:
        raise ValueError(f"a video needs at least {temporal_factor} sampled frames, got {num_frames}")
    if min(height, width) <= 0:
        raise ValueError(f"video frame size {height}x{width} is empty")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    _check_aspect(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def num_placeholder_tokens(grid_thw: Sequence[int], merge_size: int) -> int:
    """LLM tokens of one image or video: t*h*w / merge_size^2 (for a video, t groups of h*w/merge^2)."""
    t, h, w = (int(x) for x in grid_thw)
    if min(t, h, w) <= 0 or h % merge_size or w % merge_size:
        raise ValueError(f"grid {tuple(grid_thw)} is not a positive grid divisible by merge_size {merge_size}")
    return t * h * w // (merge_size * merge_size)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

def _digest(kind: str, grid: tuple[int, int, int], rows: PatchRows, extra: str = "") -> str:
    """sha256 of what the tower's input is made of: the uint8 patch values, the lookup table and the repeat
    (equal exactly when the float32 rows are), the grid and `extra`. The values are a quarter of the float32
    rows' bytes (an eighth for an image, whose rows repeat each frame temporal_patch_size times)."""
    h = hashlib.sha256(f"{kind}:{grid}:{extra}:{list(rows.values.shape)}:{rows.repeat}:".encode())
    h.update(np.ascontiguousarray(rows.table).data)
    h.update(np.ascontiguousarray(rows.values).data)
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One preprocessed image: the tower's input rows and its patch grid."""
    rows: PatchRows                    # [t*h*w] rows: uint8 values [N, 3, 1, P*P], repeat T
    grid_thw: tuple[int, int, int]     # (1, gh, gw) in patches

    @functools.cached_property
    def pixel_values(self) -> np.ndarray:
        """The rows in float32 [t*h*w, 3*T*P*P] on the host (transformers' pixel_values)."""
        return self.rows.float32()

    def num_tokens(self, merge_size: int) -> int:
        return num_placeholder_tokens(self.grid_thw, merge_size)

    def digest(self) -> str:
        """sha256 of the grid and the rows (equal inputs to the tower, equal digest)."""
        return _digest("image", self.grid_thw, self.rows)


@dataclass(frozen=True, eq=False)
class VideoInput:
    """One preprocessed video, with the per-group timestamps the prompt needs."""
    rows: PatchRows                    # [t*h*w] rows: uint8 values [N, 3, T, P*P]
    grid_thw: tuple[int, int, int]     # (n_frames_padded / T, gh, gw)
    frame_indices: tuple[int, ...]     # source frame index of each sampled frame (before padding)
    source_fps: float                  # the frame rate the timestamps use
    timestamps: tuple[float, ...]      # seconds, one per temporal group (len == grid_thw[0])

    @functools.cached_property
    def pixel_values(self) -> np.ndarray:
        """The rows in float32 [t*h*w, 3*T*P*P] on the host (transformers' pixel_values_videos)."""
        return self.rows.float32()

    def num_tokens(self, merge_size: int) -> int:
        return num_placeholder_tokens(self.grid_thw, merge_size)

    def digest(self) -> str:
        """sha256 of the grid, the timestamps and the rows (the timestamps reach the prompt text)."""
        return _digest("video", self.grid_thw, self.rows, ",".join(f"{t!r}" for t in self.timestamps))


@dataclass(frozen=True)
class VideoGroup:
    """One temporal group of a video in the prompt: `text` then <|vision_start|>, pad tokens, <|vision_end|>."""
    text: str                  # e.g. "<0.3 seconds>", ordinary text
    num_pad_tokens: int        # <|video_pad|> tokens in this group (gh*gw / merge^2)


def video_groups(video: VideoInput, merge_size: int) -> tuple[VideoGroup, ...]:
    """The per-temporal-group structure Qwen3VLProcessor expands a video's `<|video_pad|>` into."""
    t, h, w = video.grid_thw
    per = num_placeholder_tokens((1, h, w), merge_size)
    if len(video.timestamps) != t:
        raise ValueError(f"video has {len(video.timestamps)} timestamps for {t} temporal groups")
    return tuple(VideoGroup(f"<{ts:.1f} seconds>", per) for ts in video.timestamps)


def video_placeholder_text(video: VideoInput, merge_size: int, *, vision_start: str = "<|vision_start|>",
                           video_pad: str = "<|video_pad|>", vision_end: str = "<|vision_end|>") -> str:
    """The exact text transformers substitutes for the chat template's one `<|video_pad|>`."""
    return "".join(g.text + vision_start + video_pad * g.num_pad_tokens + vision_end
                   for g in video_groups(video, merge_size))


def image_placeholder_text(image: ImageInput, merge_size: int, *, image_pad: str = "<|image_pad|>") -> str:
    """The text transformers substitutes for the chat template's one `<|image_pad|>`."""
    return image_pad * image.num_tokens(merge_size)


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

def _pil():
    try:
        from PIL import Image, ImageOps
    except ImportError as e:     # pragma: no cover - Pillow is a declared dependency
        raise ValueError("image input needs Pillow (pip install pillow)") from e
    return Image, ImageOps


def _check_pixels(width: int, height: int, max_image_pixels: int | None) -> None:
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {width}x{height} is empty")
    if max_image_pixels is not None and width * height > max_image_pixels:
        raise ValueError(f"image of {width}x{height} = {width * height} pixels exceeds the limit of "
                         f"{max_image_pixels} pixels")


def _open_encoded(data: bytes, max_image_pixels: int | None, formats: Sequence[str]):
    Image, ImageOps = _pil()
    if len(data) == 0:
        raise ValueError("image data is empty")
    try:
        im = Image.open(io.BytesIO(data), formats=list(formats))
    except Image.DecompressionBombError as e:
        raise ValueError(f"image is too large to decode safely: {e}") from None
    except Image.UnidentifiedImageError:
        raise ValueError(_unsupported_message(data, formats)) from None
    except Exception as e:      # noqa: BLE001 - a decoder plugin's failure on untrusted bytes
        raise ValueError(f"image data is corrupt or truncated: {e}") from None
    _check_pixels(im.width, im.height, max_image_pixels)
    try:
        im.load()
        im = ImageOps.exif_transpose(im)
    except Image.DecompressionBombError as e:
        raise ValueError(f"image is too large to decode safely: {e}") from None
    except Exception as e:      # noqa: BLE001 - a decoder plugin's failure on untrusted bytes
        raise ValueError(f"image data is corrupt or truncated ({im.format}): {e}") from None
    return im


def _unsupported_message(data: bytes, formats: Sequence[str]) -> str:
    """Name the format when Pillow knows it (header parse only), else say it is unrecognised."""
    Image, _ = _pil()
    allowed = ", ".join(formats)
    try:
        with Image.open(io.BytesIO(data)) as probe:
            name = probe.format
    except Exception:   # noqa: BLE001 - any failure means: not an image Pillow recognises
        name = None
    if name:
        return f"unsupported image format {name} (supported: {allowed})"
    return f"image data is not a recognised image (corrupt, truncated, or not one of: {allowed})"


def _to_rgb_array(im) -> np.ndarray:
    """transformers' convert_to_rgb for a PIL image: alpha composited onto white, else convert('RGB')."""
    Image, _ = _pil()
    try:
        if "A" in im.getbands() or im.info.get("transparency") is not None:
            rgba = im.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            rgb = Image.alpha_composite(white, rgba).convert("RGB")
        else:
            rgb = im.convert("RGB")
    except ValueError as e:
        raise ValueError(f"image mode {im.mode} cannot be converted to RGB: {e}") from None
    except Exception as e:      # noqa: BLE001 - a lazily opened image decodes here
        raise ValueError(f"image data is corrupt or truncated: {e}") from None
    return np.asarray(rgb)


# Normalisation is a per-channel function of the uint8 value, so it is tabulated (3 x 256 float32,
# computed with exactly the reference's float operations) and looked up from the uint8 patch values
# (PatchRows: on the host for `pixel_values`, on the device in the Program).

def _table_rescaled(scale: float, mean, std) -> np.ndarray:
    """The PIL backend: float32(float64(v) * scale), then (v - mean) / std in float32."""
    v = (np.arange(256, dtype=np.float64) * scale).astype(np.float32)
    m = np.asarray(mean, dtype=np.float32).reshape(-1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(-1, 1)
    return (v[None, :] - m) / s


def _table_fused(rescale: float, mean, std) -> np.ndarray:
    """The torchvision backend: (float32(v) - mean/rescale) / (std/rescale), all in float32."""
    scale = np.float32(1.0 / rescale)
    m = (np.asarray(mean, dtype=np.float32) * scale).reshape(-1, 1)
    s = (np.asarray(std, dtype=np.float32) * scale).reshape(-1, 1)
    return (np.arange(256, dtype=np.float32)[None, :] - m) / s


def preprocess_image(image: Any, cfg: VisionPreprocessConfig, *, max_image_pixels: int | None = None,
                     formats: Sequence[str] = ALLOWED_IMAGE_FORMATS) -> ImageInput:
    """One image -> ImageInput equal to transformers' Qwen2VLImageProcessorPil (module docstring).

    image: encoded bytes (bytes/bytearray/memoryview), a PIL.Image.Image, or an RGB uint8 numpy
    array [H, W, 3]. max_image_pixels: refuse larger images (for bytes, from the header, before
    the pixels are decoded). Every problem raises ValueError naming it.
    """
    Image, _ = _pil()
    if isinstance(image, (bytes, bytearray, memoryview)):
        rgb = _to_rgb_array(_open_encoded(bytes(image), max_image_pixels, formats))
    elif isinstance(image, Image.Image):
        _check_pixels(image.width, image.height, max_image_pixels)
        rgb = _to_rgb_array(image)
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"an image array must be RGB uint8 of shape [H, W, 3], got {image.dtype} {image.shape}")
        _check_pixels(image.shape[1], image.shape[0], max_image_pixels)
        rgb = np.ascontiguousarray(image)
    else:
        raise ValueError(f"unsupported image input type {type(image).__name__} "
                         "(expected encoded bytes, a PIL image or an RGB uint8 array)")
    height, width = rgb.shape[:2]
    _check_pixels(width, height, None)
    rh, rw = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    if cfg.image_backend == "pil":
        resized = np.asarray(Image.fromarray(rgb).resize((rw, rh), resample=_BICUBIC))
        table = _table_rescaled(cfg.rescale_factor, cfg.image_mean, cfg.image_std)
    else:
        resized = resize_uint8_bicubic_torch(rgb, rh, rw)
        table = _table_fused(cfg.rescale_factor, cfg.image_mean, cfg.image_std)
    values, _, gh, gw = patch_values(resized[None], cfg.patch_size, cfg.merge_size, 1)
    return ImageInput(rows=PatchRows(values, table, cfg.temporal_patch_size), grid_thw=(1, gh, gw))
