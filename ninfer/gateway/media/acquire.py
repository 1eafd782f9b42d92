"""Acquisition entry points: one source -> MediaItem under a policy (`load_media`), a file the CLI
names (`load_file`), and Python API messages -> messages whose parts carry their items (`attach_media`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ninfer.gateway.media.decode import array_item, decode, image_item, is_pil
from ninfer.gateway.media.item import MEDIA_KEY, MEDIA_KINDS, MediaError, MediaItem, MediaPolicy
from ninfer.gateway.media.sources import fetch, parse_data_url, read_local


def load_media(kind: str, source: Any, policy: MediaPolicy) -> MediaItem:
    """A source (data:/http(s)/file URL, a path, bytes, a PIL image or an RGB array) -> MediaItem."""
    if kind not in MEDIA_KINDS:
        raise MediaError(f"unknown media kind {kind!r}")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode(kind, bytes(source), "bytes", policy.limits)
    if kind == "image" and is_pil(source):
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
