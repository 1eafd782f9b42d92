"""Media acquisition: image and video sources -> validated, decoded `MediaItem`s, safe by default.

    policy = MediaPolicy()                                   # defaults: data: URLs only
    item = load_media("image", "data:image/png;base64,...", policy)
    part = {"type": "image", "image": item.source, MEDIA_KEY: item}   # what the Frontend receives

Sources, and what each needs from the policy:
  data:<mime>;base64,...     always (bounded by the request body and `max_bytes`)
  http(s)://host/...         `allow_remote` (any public host) or host in `allowed_domains` (exact,
                             case-insensitive); the name is resolved once, every address it has must
                             be public (no private, loopback, link-local, multicast, reserved or
                             unspecified one: no SSRF), and the connection goes to the checked
                             address (TLS still verifies the host name). At most `max_redirects`
                             redirects, each hop checked again; `timeout_s` for the whole fetch;
                             `max_bytes` for the body.
  file:///abs/path or a path only under `allowed_local_path` (symlinks and `..` resolved first)
  a file named on the command line (`load_file`: the CLI's --image/--video, chat's /image)
A server started with no media flags fetches no URL and reads no file.

Decoding: images with Pillow (PNG, JPEG, WebP, GIF and BMP; an animated GIF/WebP gives its first
frame), the header's size checked against `max_image_pixels` before any pixel is decoded; videos
(MP4, WebM, Matroska, QuickTime) with PyAV, the header's frame size checked the same way, frames
sampled as transformers' Qwen3-VL video processor samples them (`video_fps` frames per second, at
least 4, at most `max_video_frames`, uniform over the whole video) and only those kept. Every
refusal is a `MediaError` (a ValueError) whose message names the problem; the caller names the part.

The decoded item reaches the Frontend inside the content part, under the private key MEDIA_KEY:
    {"type": "image", "image": "<source>", MEDIA_KEY: MediaItem(kind="image", image=<PIL RGB>, ...)}
    {"type": "video", "video": "<source>", MEDIA_KEY: MediaItem(kind="video", frames=[T,H,W,3] uint8, ...)}
The chat template sees the part as an image/video part (its placeholder); the Frontend reads
MEDIA_KEY from the messages it was given (before its own normalisation, which turns objects into
plain values). `MediaItem.digest` is the sha256 of the source bytes (the media identity).

This module imports nothing of NInfer: pure host code (Pillow, PyAV, numpy, the standard library).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import io
import ipaddress
import os
import re
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

MEDIA_KEY = "_ninfer_media"
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
_REDIRECTS = (301, 302, 303, 307, 308)


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


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------
def load_media(kind: str, source: Any, policy: MediaPolicy) -> MediaItem:
    """A source (data:/http(s)/file URL, a path, bytes, a PIL image or an RGB array) -> MediaItem."""
    if kind not in MEDIA_KINDS:
        raise MediaError(f"unknown media kind {kind!r}")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode(kind, bytes(source), "bytes", policy.limits)
    if kind == "image" and _is_pil(source):
        return image_item(source, policy.limits, "PIL image")
    if isinstance(source, np.ndarray):
        return array_item(kind, source, policy.limits)
    if isinstance(source, Path):
        return decode(kind, read_local(str(source), policy), str(source), policy.limits)
    if not isinstance(source, str) or not source:
        raise MediaError(f"the {kind} source must be a non-empty URL string")
    scheme = source.split(":", 1)[0].lower() if ":" in source else ""
    if scheme == "data":
        data, mime = parse_data_url(source, policy.max_bytes)
        return decode(kind, data, f"data:{mime}", policy.limits)
    if scheme in ("http", "https"):
        return decode(kind, fetch(source, policy), source, policy.limits)
    if scheme in ("file", ""):
        return decode(kind, read_local(source, policy), source, policy.limits)
    raise MediaError(f"unsupported URL scheme {scheme!r}: use data:, http(s): or file:")


def load_file(kind: str, path: str | Path, policy: MediaPolicy) -> MediaItem:
    """A file the user named on the command line (the CLI's --image/--video, chat's /image): read as
    given, within `max_bytes`; HTTP requests reach files only through `read_local`."""
    p = Path(path).expanduser()
    try:
        if not p.is_file():
            raise MediaError(f"{path}: no such file" if not p.exists() else f"{path} is not a regular file")
        size = p.stat().st_size
        if size > policy.max_bytes:
            raise MediaError(f"{path} has {size} bytes, over the limit of {policy.max_bytes}")
        data = p.read_bytes()
    except OSError as e:
        raise MediaError(f"cannot read {path}: {e.strerror}") from None
    return decode(kind, data, str(path), policy.limits)


def parse_data_url(url: str, max_bytes: int) -> tuple[bytes, str]:
    """data:<mime>[;params];base64,<payload> -> (bytes, mime)."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaError("malformed data: URL (no ',' before the payload)")
    params = [p.strip().lower() for p in head.split(";")]
    mime = params[0] or "text/plain"
    if "base64" not in params[1:]:
        raise MediaError("data: URLs of media must be base64 (data:<mime>;base64,...)")
    payload = "".join(payload.split())
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise MediaError(f"the media is larger than the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the data: URL's payload is not valid base64") from None
    if not data:
        raise MediaError("the data: URL is empty")
    return data, mime


def read_local(source: str, policy: MediaPolicy) -> bytes:
    """A file:// URL or a path, only inside `allowed_local_path` (after resolving symlinks and '..')."""
    root = policy.allowed_local_path
    if root is None:
        raise MediaError("local files are not allowed: start the server with --allowed-local-media-path DIR")
    if source.lower().startswith("file:"):
        parsed = urllib.parse.urlparse(source)
        if parsed.netloc not in ("", "localhost"):
            raise MediaError(f"file: URLs name no host, got {parsed.netloc!r}")
        path_text = urllib.parse.unquote(parsed.path)
    else:
        path_text = source
    path = Path(path_text)
    if not path.is_absolute():
        path = root / path
    try:
        # NOTE: containment first, whether or not the file exists (no existence oracle outside root)
        real = path.resolve(strict=False)
    except (OSError, RuntimeError):
        raise MediaError(f"cannot resolve the media path {path_text}") from None
    if not real.is_relative_to(root):
        raise MediaError(f"{path_text} is outside the allowed media path")
    if not real.exists():
        raise MediaError(f"no such file under the allowed media path: {path_text}")
    if not real.is_file():
        raise MediaError(f"{path_text} is not a regular file")
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise MediaError(f"cannot read {path_text}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        # NOTE: what was opened is checked again (a path swapped after the check stays refused)
        opened = Path(f"/proc/self/fd/{fd}")
        if opened.exists() and not Path(os.readlink(opened)).is_relative_to(root):
            raise MediaError(f"{path_text} is outside the allowed media path")
        size = os.fstat(fd).st_size
        if size > policy.max_bytes:
            raise MediaError(f"{path_text} has {size} bytes, over the limit of {policy.max_bytes}")
        data = f.read(policy.max_bytes + 1)
    if len(data) > policy.max_bytes:
        raise MediaError(f"{path_text} is over the limit of {policy.max_bytes} bytes")
    return data


# ---------------------------------------------------------------------------------------------
# Remote fetch (no SSRF)
# ---------------------------------------------------------------------------------------------
def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (module-level, so that tests can replace it)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def address_refused(addr: str) -> str | None:
    """Why an address may not be fetched from (None: a public unicast address)."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    # NOTE: the specific classes first: ipaddress counts most of them as private too
    for what, bad in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                      ("multicast", ip.is_multicast), ("unspecified", ip.is_unspecified),
                      ("reserved", ip.is_reserved), ("private", ip.is_private),
                      ("non-global", not ip.is_global)):
        if bad:
            return what
    return None


def _check_url(url: str, policy: MediaPolicy) -> tuple[str, str, int, str]:
    """(scheme, host, port, checked address) of a URL the policy lets us fetch."""
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(f"unsupported URL scheme {scheme!r} (http, https)")
    if not policy.remote:
        raise MediaError("remote media URLs are not allowed: start the server with --allowed-media-domains "
                         "DOMAIN... or --allow-remote-media")
    if parsed.username or parsed.password:
        raise MediaError("media URLs may not carry credentials")
    host = (parsed.hostname or "").lower().rstrip(".")
    if not host:
        raise MediaError("the media URL has no host")
    if policy.allowed_domains and not policy.allow_remote and host not in policy.allowed_domains:
        raise MediaError(f"the host {host!r} is not in --allowed-media-domains")
    try:
        port = parsed.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise MediaError("the media URL has an invalid port") from None
    try:
        addrs = resolve(host, port)
    except (socket.gaierror, UnicodeError, OSError):
        raise MediaError(f"cannot resolve the media host {host!r}") from None
    if not addrs:
        raise MediaError(f"cannot resolve the media host {host!r}")
    if not policy.allow_private_addresses:
        for a in addrs:
            why = address_refused(a)
            if why is not None:
                raise MediaError(f"the media host {host!r} resolves to {a} ({why} address); refused")
    return scheme, host, port, addrs[0]


def tls_context() -> ssl.SSLContext:
    """The system's trust store, certificate and host name verification on (tests replace it)."""
    return ssl.create_default_context()


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address, verifying the certificate against the URL's host name."""

    def __init__(self, address: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout, context=tls_context())
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, address: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


def fetch(url: str, policy: MediaPolicy) -> bytes:
    """GET an http(s) URL under the policy: checked hosts and addresses, redirects, time and bytes."""
    deadline = time.monotonic() + policy.timeout_s
    for hop in range(policy.max_redirects + 1):
        scheme, host, port, address = _check_url(url, policy)
        left = deadline - time.monotonic()
        if left <= 0:
            raise MediaError(f"fetching the media timed out after {policy.timeout_s:g}s")
        cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
        conn = cls(address, host, port, timeout=left)
        try:
            parsed = urllib.parse.urlsplit(url)
            target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
            conn.request("GET", target, headers={"User-Agent": "ninfer", "Accept": "image/*, video/*",
                                                 "Accept-Encoding": "identity"})
            resp = conn.getresponse()
            if resp.status in _REDIRECTS:
                location = resp.getheader("Location")
                if not location:
                    raise MediaError(f"the media URL answered {resp.status} without a Location")
                url = urllib.parse.urljoin(url, location)
                continue
            if resp.status != 200:
                raise MediaError(f"fetching the media failed: HTTP {resp.status}")
            length = resp.getheader("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > policy.max_bytes:
                raise MediaError(f"the media has {int(length)} bytes, over the limit of {policy.max_bytes}")
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise MediaError(f"fetching the media timed out after {policy.timeout_s:g}s")
                if conn.sock is not None:
                    conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = resp.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > policy.max_bytes:
                    raise MediaError(f"the media is larger than the limit of {policy.max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        except socket.timeout:
            raise MediaError(f"fetching the media timed out after {policy.timeout_s:g}s") from None
        except (OSError, http.client.HTTPException) as e:
            raise MediaError(f"fetching the media failed: {type(e).__name__}") from None
        finally:
            conn.close()
    raise MediaError(f"the media URL redirected more than {policy.max_redirects} times")


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------
def _is_pil(obj) -> bool:
    try:
        from PIL import Image
    except ImportError:                                   # pragma: no cover - pillow is a dependency
        return False
    return isinstance(obj, Image.Image)


def decode(kind: str, data: bytes, source: str, limits: MediaLimits) -> MediaItem:
    if kind == "image":
        return decode_image(data, source, limits)
    return decode_video(data, source, limits)


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


# ---------------------------------------------------------------------------------------------
# Python API messages
# ---------------------------------------------------------------------------------------------
class MediaPartError(MediaError):
    """A MediaError of one content part; `param` names it (messages[i].content[j])."""

    def __init__(self, message: str, param: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _part_source(part: Mapping) -> tuple[str, Any] | None:
    """(kind, source) of an image/video part in any of the accepted spellings, else None."""
    t = part.get("type")
    for kind in MEDIA_KINDS:
        if t == f"{kind}_url" or (t is None and f"{kind}_url" in part):
            field_ = part.get(f"{kind}_url")
            return kind, field_.get("url") if isinstance(field_, Mapping) else field_
        if t == kind or (t is None and kind in part):
            for key in (kind, "url", "path"):           # transformers also spells them url / path
                if part.get(key) is not None:
                    return kind, part[key]
            return kind, None
    return None


def attach_media(messages: list, policy: MediaPolicy) -> list:
    """Python API messages -> copies whose image/video parts carry their decoded MediaItem.

    Accepts {"type": "image", "image": bytes | PIL image | [H, W, 3] uint8 array | URL | path},
    {"type": "image_url", "image_url": {"url": ...}}, and the same for video ([T, H, W, 3] arrays);
    a part that already carries MEDIA_KEY is kept. Each becomes {"type": kind, kind: source,
    MEDIA_KEY: item}. Raises MediaPartError naming the part (counts, a system message, the source).
    """
    out, counts = [], {k: 0 for k in MEDIA_KINDS}
    todo: list[tuple[int, int, str, Any, str]] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            found = _part_source(part) if isinstance(part, Mapping) and MEDIA_KEY not in part else None
            if found is None:
                continue
            kind, source = found
            param = f"messages[{i}].content[{j}]"
            if m.get("role") in ("system", "developer"):
                raise MediaPartError(f"a {m.get('role')} message cannot contain {kind}s", param)
            counts[kind] += 1
            if counts[kind] > policy.limits.limit(kind):
                raise MediaPartError(f"at most {policy.limits.limit(kind)} {kind}(s) per prompt", param)
            todo.append((i, j, kind, source, param))
    items = {}
    for i, j, kind, source, param in todo:
        try:
            items[(i, j)] = load_media(kind, source, policy)
        except MediaError as e:
            raise MediaPartError(str(e), param) from None
    for i, m in enumerate(messages):
        if not any(key[0] == i for key in items):
            out.append(m)
            continue
        content = [({"type": items[(i, j)].kind, items[(i, j)].kind: items[(i, j)].source,
                     MEDIA_KEY: items[(i, j)]} if (i, j) in items else part)
                   for j, part in enumerate(m["content"])]
        out.append({**m, "content": content})
    return out
