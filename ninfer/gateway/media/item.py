"""Media values: MediaItem (a decoded image or video), MediaLimits and MediaPolicy (what a server
accepts), MediaError, and the defaults of the `ninfer serve` media flags."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ninfer.contract.frontend import MEDIA_KEY  # noqa: F401  (re-exported: the Gateway's name for it)
MEDIA_KINDS = ("image", "video")

DEFAULT_LIMIT_PER_PROMPT = {"image": 8, "video": 1}
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000            # a 48-megapixel photo passes
DEFAULT_MAX_VIDEO_FRAMES = 256
DEFAULT_VIDEO_FPS = 2.0
DEFAULT_MAX_VIDEO_PIXELS = 1 << 29               # over all kept frames (~1.6 GB of RGB)
# NOTE: frames are decoded in order up to the last kept one, so the video's own frames x frame
# pixels bound the decode work (1 << 35: about 9 minutes of 1080p at 30 fps).
DEFAULT_MAX_VIDEO_DECODE_PIXELS = 1 << 35
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_REDIRECTS = 3
MIN_VIDEO_FRAMES = 4                             # transformers' Qwen3-VL video processor: min_frames

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
VIDEO_FORMATS = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm")   # FFmpeg demuxer names


class MediaError(ValueError):
    """A media source the policy refuses, or bytes that are not a supported, intact image/video."""


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One decoded image or video, ready for the Frontend's preprocessing.

    image:  PIL.Image.Image in mode RGB (kind "image"), else None.
    frames: np.ndarray [T, H, W, 3] uint8, RGB (kind "video"), else None: the sampled frames only.
    fps:    the rate the frames were sampled at (video), else None.
    source_fps, total_frames, frame_indices: the video's own frame rate, its frame count and the
            indices of the kept frames in it (transformers' VideoMetadata: fps, total_num_frames,
            frames_indices; timestamps are frame_indices / source_fps).
    digest: sha256 hex of the source bytes (what the prefix cache keys on).
    source: where it came from, without the data: "data:image/png", the URL, or the path.
    """
    kind: str
    digest: str
    source: str
    image: Any = None
    frames: np.ndarray | None = None
    fps: float | None = None
    source_fps: float | None = None
    total_frames: int | None = None
    frame_indices: tuple[int, ...] = ()

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        if self.kind == "image":
            return self.image.size
        return int(self.frames.shape[2]), int(self.frames.shape[1])


@dataclass(frozen=True)
class MediaLimits:
    per_prompt: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMIT_PER_PROMPT))
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS      # per image and per video frame (the header's size)
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES      # frames kept per video (sampling clamps to it)
    video_fps: float = DEFAULT_VIDEO_FPS                  # frames sampled per second of video
    max_video_pixels: int = DEFAULT_MAX_VIDEO_PIXELS      # kept frames x frame pixels, per video
    max_video_decode_pixels: int = DEFAULT_MAX_VIDEO_DECODE_PIXELS   # the video's frames x frame pixels

    def __post_init__(self):
        for kind, n in self.per_prompt.items():
            if kind not in MEDIA_KINDS:
                raise ValueError(f"limit_mm_per_prompt: unknown modality {kind!r} (image, video)")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"limit_mm_per_prompt[{kind!r}] must be an integer >= 0, got {n!r}")
        for name in ("max_image_pixels", "max_video_frames", "max_video_pixels", "max_video_decode_pixels"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(self.video_fps, (int, float)) and 0 < self.video_fps <= 120):
            raise ValueError(f"video_fps must be in (0, 120], got {self.video_fps!r}")

    def limit(self, kind: str) -> int:
        return int(self.per_prompt.get(kind, DEFAULT_LIMIT_PER_PROMPT[kind]))


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from and how much of it. The defaults fetch nothing and read nothing."""
    limits: MediaLimits = field(default_factory=MediaLimits)
    allowed_domains: tuple[str, ...] = ()
    allow_remote: bool = False
    allowed_local_path: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_bytes: int = DEFAULT_MAX_BYTES
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    # NOTE: only for closed networks and tests: lets http(s) reach private and loopback addresses.
    allow_private_addresses: bool = False

    def __post_init__(self):
        object.__setattr__(self, "allowed_domains", tuple(d.strip().lower().rstrip(".")
                                                          for d in self.allowed_domains if d.strip()))
        if self.allowed_local_path is not None:
            p = Path(self.allowed_local_path).expanduser()
            if not p.is_dir():
                raise ValueError(f"allowed_local_media_path {str(p)!r} is not a directory")
            object.__setattr__(self, "allowed_local_path", p.resolve(strict=True))
        if not self.timeout_s > 0:
            raise ValueError(f"media timeout must be > 0, got {self.timeout_s!r}")
        if self.max_bytes < 1:
            raise ValueError(f"max media bytes must be >= 1, got {self.max_bytes!r}")
        if self.max_redirects < 0:
            raise ValueError(f"max media redirects must be >= 0, got {self.max_redirects!r}")

    @property
    def remote(self) -> bool:
        return self.allow_remote or bool(self.allowed_domains)


def parse_limit_mm_per_prompt(text: str) -> dict[str, int]:
    """vLLM's JSON form: '{"image": 4, "video": 1}' or '{"image": {"count": 4}}' (a modality left out
    keeps its default)."""
    import json
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e.msg}); expected e.g. '{{\"image\": 4, \"video\": 1}}'") from None
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object such as '{\"image\": 4, \"video\": 1}'")
    out = dict(DEFAULT_LIMIT_PER_PROMPT)
    for kind, n in value.items():
        if kind not in MEDIA_KINDS:
            raise ValueError(f"unknown modality {kind!r} (image, video)")
        if isinstance(n, dict):                   # vLLM's newer form: {"image": {"count": 4, ...}}
            n = n.get("count")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{kind!r} must be an integer >= 0, got {n!r}")
        out[kind] = n
    return out
