"""Image and video content parts of chat messages -> decoded `MediaItem`s, or a 400 naming the part.

Accepted parts (OpenAI's, and vLLM's video extension):
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..." | "https://..." | "file:///..."}}
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..." | ...}}
(`image_url` / `video_url` may also be the URL string itself.) Where a URL may point is the
server's `MediaPolicy` (ninfer/gateway/media/); by default only data: URLs.

Order of the checks, cheapest first, so that a request refused anyway fetches nothing:
  1. every part: its type, its URL field, an image or video in a system message (400)
  2. the per-prompt counts (`--limit-mm-per-prompt`)
  3. fetch and decode each part in turn (in a worker thread: `acquire_async`); the first failure
     is the 400, naming `messages[i].content[j].image_url` (or `.video_url`)
The result maps (message index, part index) to its MediaItem; `convert.frontend_messages` puts
each item into the Frontend's part under MEDIA_KEY.
"""
from __future__ import annotations

from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from ninfer.gateway.http.errors import bad_request
from ninfer.gateway.media import MediaError, MediaItem, MediaPolicy, load_media

PART_KINDS = {"image_url": "image", "video_url": "video"}


@dataclass(frozen=True, slots=True)
class MediaPart:
    message: int
    part: int
    kind: str            # "image" | "video"
    url: str
    param: str           # messages[i].content[j].image_url


def media_parts(messages) -> list[MediaPart]:
    """The image/video parts of the request's messages, checked for shape (no fetch, no decode)."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.content, str) or m.content is None:
            continue
        for j, part in enumerate(m.content):
            kind = PART_KINDS.get(part.type)
            if kind is None:
                continue
            param = f"messages[{i}].content[{j}].{part.type}"
            if m.role in ("system", "developer"):
                raise bad_request(f"a {m.role} message cannot contain {kind}s", param=param)
            field = getattr(part, part.type, None)
            url = field.get("url") if isinstance(field, dict) else field
            if not isinstance(url, str) or not url:
                raise bad_request(f"`{part.type}` must be an object with a `url` string", param=param)
            out.append(MediaPart(i, j, kind, url, param))
    return out


def check_counts(parts: list[MediaPart], policy: MediaPolicy) -> None:
    for kind in ("image", "video"):
        of_kind = [p for p in parts if p.kind == kind]
        limit = policy.limits.limit(kind)
        if len(of_kind) > limit:
            raise bad_request(f"at most {limit} {kind}(s) per prompt (--limit-mm-per-prompt), got {len(of_kind)}",
                              param=of_kind[limit].param, code="too_many_media")


def acquire(messages, policy: MediaPolicy) -> dict[tuple[int, int], MediaItem]:
    """Check, fetch and decode every media part (blocking: see acquire_async)."""
    parts = media_parts(messages)
    check_counts(parts, policy)
    items = {}
    for p in parts:
        try:
            items[(p.message, p.part)] = load_media(p.kind, p.url, policy)
        except MediaError as e:
            raise bad_request(f"invalid {p.kind}: {e}", param=p.param, code="invalid_media") from None
    return items


async def acquire_async(messages, policy: MediaPolicy) -> dict[tuple[int, int], MediaItem]:
    """acquire() off the event loop (fetching and decoding block); {} at once for text-only messages."""
    if not any(not isinstance(m.content, (str, type(None))) and any(p.type in PART_KINDS for p in m.content)
               for m in messages):
        return {}
    return await run_in_threadpool(acquire, messages, policy)


async def call_with_media(media: dict, fn, *args, **kwargs):
    """fn(*args, **kwargs) in a worker thread when the request has media (preprocessing an image or a video is
    CPU-bound numpy work that would stall every other stream on the event loop), else inline."""
    if media:
        return await run_in_threadpool(fn, *args, **kwargs)
    return fn(*args, **kwargs)
