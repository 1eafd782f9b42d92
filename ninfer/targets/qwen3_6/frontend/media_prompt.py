"""A chat prompt with images and videos: the template's one placeholder per media part expanded as
transformers' Qwen3.5/3.6 processor does, the tower's inputs per placeholder run, and the MRoPE positions.

    image   <|vision_start|><|image_pad|><|vision_end|>   ->  the pad repeated gh*gw/4 times
    video   <|vision_start|><|video_pad|><|vision_end|>   ->  per temporal group g:
            "<t_g seconds>" <|vision_start|> <|video_pad|> x gh*gw/4 <|vision_end|>   (inside the outer pair)

Each placeholder run (an image, or one temporal group of a video) becomes one `MediaPlaceholder` holding its
pixel values and grid: the tower attends within each frame group anyway, so a video group is its own input
(grid (1, gh, gw)). The content digest is that of the preprocessed input (equal pixels, equal digest).

A media part's payload: the Gateway's decoded item under `MEDIA_KEY` (an object with `kind`, `image` (PIL) or
`frames` ([T, H, W, 3] uint8, already sampled) with `source_fps` and `frame_indices`), or in the Python API
the part's own `image` (encoded bytes, a PIL image or an RGB uint8 array) or `video` (an RGB uint8 array
[T, H, W, 3] with `fps`). A URL or a path is the Gateway's to fetch (ninfer.gateway.media.attach_media).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ninfer.contract.frontend import MEDIA_KEY, MediaPlaceholder
from .mrope import IMAGE_PAD_ID, VIDEO_PAD_ID, MediaGrid, rope_positions
from .video_preprocess import preprocess_video
from .vision_preprocess import VisionPreprocessConfig, preprocess_image, video_groups
from .vocab import SPECIAL_START_ID, SPECIAL_TOKENS

VISION_START_ID = SPECIAL_START_ID + SPECIAL_TOKENS.index("<|vision_start|>")
VISION_END_ID = SPECIAL_START_ID + SPECIAL_TOKENS.index("<|vision_end|>")



class MediaPromptError(ValueError):
    """A media part that cannot be read or does not fit the prompt (the message names the part)."""


def raw_media_parts(messages: Any) -> list[tuple[str, Any, str]]:
    """(kind, payload, where) of every image/video content part, in template order, read before the messages
    are normalized (which turns a decoded item into plain values)."""
    out = []
    if not isinstance(messages, (list, tuple)):
        return out
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            where = f"messages[{i}].content[{j}]"
            item = part.get(MEDIA_KEY)
            if item is not None:
                out.append((item.kind, item, where))
            elif "image" in part or "image_url" in part or part.get("type") == "image":
                out.append(("image", part.get("image", part.get("image_url")), where))
            elif "video" in part or part.get("type") == "video":
                out.append(("video", part.get("video"), where))
    return out


def has_pixels(parts: Sequence[tuple[str, Any, str]]) -> bool:
    """Whether every media part carries its pixels (not a URL or a path the Gateway has not fetched): only then
    can the prompt be expanded and run; otherwise it is only rendered (one placeholder per part)."""
    return all(not isinstance(p, (str, dict)) and p is not None for _, p, _ in parts)


def _preprocess(kind: str, payload: Any, cfg: VisionPreprocessConfig, where: str):
    if isinstance(payload, (str, dict)) or payload is None:
        raise MediaPromptError(f"{where}: a {kind} given as {type(payload).__name__} must be fetched first "
                               f"(the Gateway does it: ninfer.gateway.media.attach_media)")
    try:
        if kind == "image":
            image = getattr(payload, "image", payload) if hasattr(payload, "kind") else payload
            return preprocess_image(image, cfg)
        if hasattr(payload, "kind"):
            return preprocess_video(payload.frames, cfg, payload.source_fps, frame_indices=payload.frame_indices)
        if isinstance(payload, np.ndarray):
            return preprocess_video(payload, cfg, None)
        raise ValueError(f"a video must be an RGB uint8 array [T, H, W, 3], got {type(payload).__name__}")
    except ValueError as e:
        raise MediaPromptError(f"{where}: {e}") from None


def expand_media(ids: Sequence[int], parts: Sequence[tuple[str, Any, str]], cfg: VisionPreprocessConfig,
                 encode_text) -> tuple[tuple[int, ...], tuple[MediaPlaceholder, ...], Any, int]:
    """The rendered prompt's ids (one pad per media part) -> (expanded ids, one placeholder per run, MRoPE
    positions [3, L], rope delta). encode_text: the tokenizer's text -> ids (for the video timestamps)."""
    pads = [i for i, t in enumerate(ids) if t in (IMAGE_PAD_ID, VIDEO_PAD_ID)]
    if len(pads) != len(parts):
        raise MediaPromptError(f"the prompt has {len(pads)} media placeholders for {len(parts)} media parts")
    m = cfg.merge_size
    out: list[int] = []
    runs: list[MediaPlaceholder] = []
    grids: list[MediaGrid] = []
    prev = 0
    for pos, (kind, payload, where) in zip(pads, parts):
        want = IMAGE_PAD_ID if kind == "image" else VIDEO_PAD_ID
        if ids[pos] != want:
            raise MediaPromptError(f"{where}: the template put another kind of placeholder where this {kind} goes")
        out.extend(ids[prev:pos])
        x = _preprocess(kind, payload, cfg, where)
        t, h, w = x.grid_thw
        per = h * w // (m * m)
        if kind == "image":
            runs.append(MediaPlaceholder("image", len(out), per * t, x.digest(), x.rows, x.grid_thw))
            out.extend([IMAGE_PAD_ID] * (per * t))
        else:
            rows = h * w
            for g, grp in enumerate(video_groups(x, m)):
                if g:
                    out.append(VISION_START_ID)
                out.extend(encode_text(grp.text))
                out.append(VISION_START_ID)
                pv = x.rows[g * rows:(g + 1) * rows]
                runs.append(MediaPlaceholder("video", len(out), grp.num_pad_tokens, f"{x.digest()}:{g}", pv,
                                             (1, h, w)))
                out.extend([VIDEO_PAD_ID] * grp.num_pad_tokens)
                out.append(VISION_END_ID)
            # NOTE: the template's own <|vision_start|> precedes the first group's text and its <|vision_end|>
            #       follows the last group: transformers replaces only the pad, so both stay.
        grids.append(MediaGrid(kind, x.grid_thw))
        prev = pos + 1
    out.extend(ids[prev:])
    rope = rope_positions(out, grids, spatial_merge_size=m)
    return tuple(out), tuple(runs), rope.positions, int(rope.rope_delta)
