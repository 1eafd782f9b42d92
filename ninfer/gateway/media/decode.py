"""Decoding: bytes -> MediaItem with Pillow (images) and PyAV (videos), each size checked from the
header before any pixel is decoded; PIL images and RGB arrays from the Python API."""
from __future__ import annotations

import hashlib
import io
import re

import numpy as np

from ninfer.gateway.media.item import (IMAGE_FORMATS, MIN_VIDEO_FRAMES, VIDEO_FORMATS, MediaError, MediaItem,
                                       MediaLimits)


def is_pil(obj) -> bool:
    try:
        from PIL import Image
    except ImportError:                                   # pragma: no cover - pillow is a dependency
        return False
    return isinstance(obj, Image.Image)


def decode(kind: str, data: bytes, source: str, limits: MediaLimits) -> MediaItem:
    """Bytes -> MediaItem; whatever a decoder raises on hostile bytes becomes a MediaError."""
    try:
        if kind == "image":
            return decode_image(data, source, limits)
        return decode_video(data, source, limits)
    except MediaError:
        raise
    except MemoryError:
        raise MediaError(f"the {kind} is too large to decode") from None
    except Exception as e:  # noqa: BLE001 - decoders raise many types (struct.error, IndexError, ...)
        raise MediaError(f"the {kind} is corrupt ({type(e).__name__})") from None


def _check_pixels(w: int, h: int, limits: MediaLimits, what: str) -> None:
    if w < 1 or h < 1:
        raise MediaError(f"the {what} has no pixels ({w}x{h})")
    if w * h > limits.max_image_pixels:
        raise MediaError(f"the {what} is {w}x{h} = {w * h} pixels, over the limit of {limits.max_image_pixels} "
                         f"(--max-image-pixels)")


def decode_image(data: bytes, source: str, limits: MediaLimits) -> MediaItem:
    import warnings

    from PIL import Image, UnidentifiedImageError

    digest = hashlib.sha256(data).hexdigest()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except UnidentifiedImageError:
        raise MediaError("the image is not a supported format (PNG, JPEG, WebP, GIF, BMP) or is corrupt") from None
    except Image.DecompressionBombError as e:
        # NOTE: Pillow's own guard (its MAX_IMAGE_PIXELS, left as it is) read the header first
        claimed = re.search(r"\((\d+) pixels\)", str(e))
        raise MediaError(f"the image is {claimed.group(1) + ' pixels' if claimed else 'a decompression bomb'}, "
                         f"over the limit of {limits.max_image_pixels} (--max-image-pixels)") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise MediaError(f"the image is corrupt or truncated: {e}") from None
    with im:
        w, h = im.size                                # NOTE: from the header; nothing decoded yet
        _check_pixels(w, h, limits, "image")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                im.seek(0)
                im.load()
                rgb = im.convert("RGB")
        except Image.DecompressionBombError:
            raise MediaError(f"the image's size is over the limit of {limits.max_image_pixels} pixels") from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise MediaError(f"the image is corrupt or truncated: {e}") from None
    return MediaItem(kind="image", digest=digest, source=source, image=rgb)


def image_item(im, limits: MediaLimits, source: str) -> MediaItem:
    """A PIL image from the Python API: its pixels (RGB) are the identity."""
    w, h = im.size
    _check_pixels(w, h, limits, "image")
    rgb = im.convert("RGB")
    digest = hashlib.sha256(f"rgb:{w}x{h}:".encode() + rgb.tobytes()).hexdigest()
    return MediaItem(kind="image", digest=digest, source=source, image=rgb)


def array_item(kind: str, arr: np.ndarray, limits: MediaLimits) -> MediaItem:
    """An RGB uint8 array from the Python API: [H, W, 3] for an image, [T, H, W, 3] for a video."""
    want = 3 if kind == "image" else 4
    if arr.ndim != want or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        shape = "[H, W, 3]" if kind == "image" else "[T, H, W, 3]"
        raise MediaError(f"a {kind} array must be uint8 {shape} RGB, got {arr.dtype} {list(arr.shape)}")
    arr = np.ascontiguousarray(arr)
    h, w = arr.shape[-3], arr.shape[-2]
    _check_pixels(w, h, limits, "image" if kind == "image" else "video frame")
    digest = hashlib.sha256(f"{kind}:{list(arr.shape)}:".encode() + arr.tobytes()).hexdigest()
    if kind == "image":
        from PIL import Image
        return MediaItem(kind="image", digest=digest, source="array", image=Image.fromarray(arr, "RGB"))
    t = arr.shape[0]
    if t < 1 or t > limits.max_video_frames:
        raise MediaError(f"a video array must have 1..{limits.max_video_frames} frames, got {t}")
    return MediaItem(kind="video", digest=digest, source="array", frames=arr, fps=limits.video_fps,
                     source_fps=limits.video_fps, total_frames=t, frame_indices=tuple(range(t)))


def sample_indices(total: int, source_fps: float, limits: MediaLimits, frame_pixels: int) -> np.ndarray:
    """transformers' Qwen3-VL rule: int(total / source_fps * fps) frames, clamped to
    [MIN_VIDEO_FRAMES, max_video_frames] and to the video's own frames, uniform over the video.
    The clamp also keeps kept frames x frame pixels within max_video_pixels."""
    n = int(total / source_fps * limits.video_fps)
    cap = min(limits.max_video_frames, max(1, limits.max_video_pixels // max(1, frame_pixels)))
    n = min(max(n, MIN_VIDEO_FRAMES), cap, total)
    return np.linspace(0, total - 1, n).round().astype(int)


def decode_video(data: bytes, source: str, limits: MediaLimits) -> MediaItem:
    import av

    digest = hashlib.sha256(data).hexdigest()

    def open_container():
        try:
            return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
        except av.FFmpegError:
            raise MediaError("the video is not a supported format (MP4, WebM) or is corrupt") from None

    container = open_container()
    try:
        if container.format.name not in VIDEO_FORMATS:
            raise MediaError(f"the video container {container.format.name!r} is not supported (MP4, WebM)")
        if not container.streams.video:
            raise MediaError("the video has no video stream")
        stream = container.streams.video[0]
        w, h = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
        _check_pixels(w, h, limits, "video frame")      # NOTE: the header's size, before decoding
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        source_fps = float(rate) if rate else 0.0
        if not (0 < source_fps <= 1000):
            raise MediaError("the video has no valid frame rate")
        total = 0
        for packet in container.demux(stream):        # NOTE: counts frames without decoding them
            if packet.size > 0:
                total += 1
    except av.FFmpegError as e:
        raise MediaError(f"the video is corrupt: {e.strerror or type(e).__name__}") from None
    finally:
        container.close()
    if total < 1:
        raise MediaError("the video has no frames")
    if total * w * h > limits.max_video_decode_pixels:
        raise MediaError(f"the video is too long to decode: {total} frames of {w}x{h} "
                         f"(at most {limits.max_video_decode_pixels} frame pixels in all)")
    wanted = sample_indices(total, source_fps, limits, w * h)
    keep = {int(i): k for k, i in enumerate(wanted)}
    frames = np.empty((len(wanted), h, w, 3), np.uint8)
    got = np.zeros(len(wanted), bool)
    container = open_container()
    try:
        stream = container.streams.video[0]
        for i, frame in enumerate(container.decode(stream)):
            if i > wanted[-1]:
                break
            k = keep.get(i)
            if k is None:
                continue
            if (frame.width, frame.height) != (w, h):
                raise MediaError(f"the video changes frame size ({w}x{h} -> {frame.width}x{frame.height})")
            frames[k] = frame.to_ndarray(format="rgb24")
            got[k] = True
    except av.FFmpegError as e:
        raise MediaError(f"the video is corrupt: {e.strerror or type(e).__name__}") from None
    finally:
        container.close()
    if not got.all():
        raise MediaError(f"the video is truncated: {int(got.sum())} of {len(wanted)} sampled frames decoded")
    fps = len(wanted) / (total / source_fps)
    return MediaItem(kind="video", digest=digest, source=source, frames=frames, fps=fps, source_fps=source_fps,
                     total_frames=total, frame_indices=tuple(int(i) for i in wanted))
