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

Modules: item.py (MediaItem, MediaLimits, MediaPolicy, MediaError, the defaults), sources.py (data:
URLs, local files, http(s) without SSRF), decode.py (Pillow, PyAV), acquire.py (load_media, load_file,
attach_media). The package imports nothing else of NInfer: pure host code (Pillow, PyAV, numpy,
the standard library).
"""
from __future__ import annotations

from ninfer.gateway.media.acquire import MediaPartError, attach_media, load_file, load_media
from ninfer.gateway.media.decode import array_item, decode, decode_image, decode_video, image_item, sample_indices
from ninfer.gateway.media.item import (DEFAULT_LIMIT_PER_PROMPT, DEFAULT_MAX_BYTES, DEFAULT_MAX_IMAGE_PIXELS,
                                       DEFAULT_MAX_REDIRECTS, DEFAULT_MAX_VIDEO_DECODE_PIXELS,
                                       DEFAULT_MAX_VIDEO_FRAMES, DEFAULT_MAX_VIDEO_PIXELS, DEFAULT_TIMEOUT_S,
                                       DEFAULT_VIDEO_FPS, IMAGE_FORMATS, MEDIA_KEY, MEDIA_KINDS, MIN_VIDEO_FRAMES,
                                       VIDEO_FORMATS, MediaError, MediaItem, MediaLimits, MediaPolicy,
                                       parse_limit_mm_per_prompt)
from ninfer.gateway.media.sources import address_refused, fetch, parse_data_url, read_local, resolve

__all__ = ["DEFAULT_LIMIT_PER_PROMPT", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_IMAGE_PIXELS", "DEFAULT_MAX_REDIRECTS",
           "DEFAULT_MAX_VIDEO_DECODE_PIXELS", "DEFAULT_MAX_VIDEO_FRAMES", "DEFAULT_MAX_VIDEO_PIXELS",
           "DEFAULT_TIMEOUT_S", "DEFAULT_VIDEO_FPS", "IMAGE_FORMATS", "MEDIA_KEY", "MEDIA_KINDS", "MIN_VIDEO_FRAMES",
           "VIDEO_FORMATS", "MediaError", "MediaItem", "MediaLimits", "MediaPartError", "MediaPolicy",
           "address_refused", "array_item", "attach_media", "decode", "decode_image", "decode_video", "fetch",
           "image_item", "load_file", "load_media", "parse_data_url", "parse_limit_mm_per_prompt", "read_local",
           "resolve", "sample_indices"]
