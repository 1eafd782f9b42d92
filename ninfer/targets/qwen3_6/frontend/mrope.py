"""3-D MRoPE positions of a mixed text/image/video prompt (qwen3_6.md sections 5.5 and 7.4), in numpy.

Equal to transformers' `Qwen3_5Model.get_rope_index` for one unpadded sequence:

* The prompt splits into maximal runs of one token type: text, image pad (`<|image_pad|>`) or video
  pad (`<|video_pad|>`). A counter `cur` starts at 0. (Two placeholder runs of one kind with no
  token between them are one run to the model; the processors always put `<|vision_end|>` and
  `<|vision_start|>` between them, and here such a run fails the token-count check.)
* A text run of n tokens gets `cur, cur+1, ..., cur+n-1` on all three axes (t, h, w); `cur += n`.
* A placeholder run takes the next grid `(t, H, W)` (patches, before the spatial merge);
  with `h = H // m`, `w = W // m` its `t*h*w` tokens are in (t, h, w) row-major order and the token
  at grid cell (ti, hi, wi) gets `(cur + ti, cur + hi, cur + wi)`. Then `cur += max(h, w)` (not h*w,
  and t is not added).
* Video: Qwen3.5 writes one `<T seconds><|vision_start|> pads <|vision_end|>` block per temporal
  group, so each group is its own run with grid `(1, H, W)`: every group's tokens share the temporal
  position `cur`. Time enters the positions only through the timestamp text tokens between the
  groups; no seconds-per-grid or tokens-per-second scaling is applied (the model calls its
  position helper with a time interval of 1 on grids of t = 1).
* `rope_delta = max(positions) + 1 - len(token_ids)`.

Decoding: a token at KV position n >= len(token_ids) (its index in the sequence, prompt included)
has rotary position `n + rope_delta` on all three axes. For every prompt the processors build
(images have t = 1), `max(positions) + 1` equals the final `cur`, so a generated token keeps the
same rotary position when a later prompt re-feeds it as text: a continued conversation's positions
extend the earlier ones.

Prompt token i sits at KV position i with rotary position `positions[:, i]`. Those positions depend
only on tokens 0..i and the grids of the runs they open, so a prefix of the prompt has the slice of
the whole prompt's positions (`complete=False` computes them for a prefix that may end inside a
placeholder run): prefill stages may take any slice, and a cached prefix (same tokens, same media
grids) was rotated exactly as the longer prompt would rotate it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .vocab import SPECIAL_START_ID, SPECIAL_TOKENS

IMAGE_PAD_ID = SPECIAL_START_ID + SPECIAL_TOKENS.index("<|image_pad|>")     # 248056
VIDEO_PAD_ID = SPECIAL_START_ID + SPECIAL_TOKENS.index("<|video_pad|>")     # 248057

_TEXT, _IMAGE, _VIDEO = 0, 1, 2
_KIND_CODE = {"image": _IMAGE, "video": _VIDEO}
_KIND_NAME = {_IMAGE: "image", _VIDEO: "video"}


@dataclass(frozen=True, slots=True)
class MediaGrid:
    """One image or video of a prompt, in prompt order.

    grid_thw: (t, h, w) in patches before the spatial merge, as the processor's `image_grid_thw` /
    `video_grid_thw` row. An image covers one placeholder run of `t*h*w / m**2` tokens. A video of
    grid (T, H, W) covers its next T video runs, one per temporal group, each of `H*W / m**2` tokens
    (so T entries of (1, H, W) describe the same video).
    """
    kind: str
    grid_thw: tuple[int, int, int]


class RopePositions(NamedTuple):
    positions: np.ndarray      # int64 [3, L]: temporal, height, width rotary position of each token
    rope_delta: int            # rotary position - KV position of every token after the prompt


def _as_grid(entry, index: int) -> MediaGrid:
    if isinstance(entry, MediaGrid):
        kind, grid = entry.kind, entry.grid_thw
    elif isinstance(entry, (tuple, list)) and len(entry) == 2:
        kind, grid = entry
    else:
        raise ValueError(f"media[{index}] must be a MediaGrid or a (kind, (t, h, w)) pair, got {entry!r}")
    if kind not in _KIND_CODE:
        raise ValueError(f"media[{index}].kind must be 'image' or 'video', got {kind!r}")
    try:
        dims = tuple(grid)
    except TypeError:
        dims = ()
    if (len(dims) != 3 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in dims)
            or min(dims) <= 0):
        raise ValueError(f"media[{index}].grid_thw must be three positive integers, got {grid!r}")
    return MediaGrid(kind, tuple(int(x) for x in dims))


def _placeholder_groups(media: Sequence, m: int) -> list[tuple[int, int, int, int, int, str]]:
    """(kind code, t, h, w merged, media index, label) of each placeholder run, in prompt order."""
    groups = []
    for i, entry in enumerate(media):
        g = _as_grid(entry, i)
        t, hh, ww = g.grid_thw
        if hh % m or ww % m:
            raise ValueError(f"media[{i}].grid_thw {g.grid_thw}: height and width must be multiples of "
                             f"the spatial merge size {m}")
        if g.kind == "image":
            groups.append((_IMAGE, t, hh // m, ww // m, i, "image"))
        else:
            groups.extend((_VIDEO, 1, hh // m, ww // m, i, f"video, temporal group {k + 1} of {t}")
                          for k in range(t))
    return groups


def rope_positions(token_ids: Sequence[int] | np.ndarray, media: Sequence[MediaGrid | tuple] = (), *,
                   spatial_merge_size: int, image_token_id: int = IMAGE_PAD_ID,
                   video_token_id: int = VIDEO_PAD_ID, complete: bool = True) -> RopePositions:
    """The MRoPE positions of a prompt and its rope delta (module docstring).

    token_ids: the expanded prompt (one pad token per merged patch). media: each image and video in
    prompt order (MediaGrid or (kind, (t, h, w)) pairs). complete=False accepts a prefix of a prompt:
    its last placeholder run may stop early and media it does not reach are ignored; its positions
    are the prefix of the whole prompt's (its rope_delta is meaningful for decoding only when the
    prefix is the whole prompt).
    Raises ValueError when the placeholder runs and the media disagree (kind, token count, number).
    """
    m = int(spatial_merge_size)
    if m <= 0:
        raise ValueError(f"spatial_merge_size must be a positive integer, got {spatial_merge_size!r}")
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise ValueError("token_ids must be a 1-D sequence of integers")
    n_tok = int(ids.size)
    if n_tok == 0:
        raise ValueError("token_ids is empty")
    groups = _placeholder_groups(media, m)

    kinds = np.zeros(n_tok, dtype=np.int8)
    kinds[ids == image_token_id] = _IMAGE
    kinds[ids == video_token_id] = _VIDEO
    if not groups and not kinds.any():
        positions = np.ascontiguousarray(np.broadcast_to(np.arange(n_tok, dtype=np.int64), (3, n_tok)))
        return RopePositions(positions, 0)

    cuts = np.flatnonzero(kinds[1:] != kinds[:-1]) + 1
    starts = np.concatenate(([0], cuts)).tolist()
    ends = np.concatenate((cuts, [n_tok])).tolist()
    positions = np.empty((3, n_tok), dtype=np.int64)
    cur, g = 0, 0
    for s, e in zip(starts, ends):
        code, n = int(kinds[s]), e - s
        if code == _TEXT:
            positions[:, s:e] = np.arange(cur, cur + n, dtype=np.int64)
            cur += n
            continue
        name = _KIND_NAME[code]
        if g == len(groups):
            raise ValueError(f"the {name} placeholder run at token {s} ({n} tokens) has no media entry "
                             f"(media lists {len(groups)} placeholder runs)")
        kind, t, h, w, mi, _ = groups[g]
        if kind != code:
            raise ValueError(f"the placeholder run at token {s} is {name} but media[{mi}] is "
                             f"{_KIND_NAME[kind]}")
        need = t * h * w
        if n != need and (complete or e != n_tok or n > need):
            raise ValueError(f"the {name} placeholder run at token {s} has {n} tokens but media[{mi}] "
                             f"needs {need} per run (grid merged to {t}x{h}x{w})")
        cell = np.arange(n, dtype=np.int64)
        positions[0, s:e] = cur + cell // (h * w)
        positions[1, s:e] = cur + (cell // w) % h
        positions[2, s:e] = cur + cell % w
        cur += max(h, w)
        g += 1
    if complete and g != len(groups):
        _, _, _, _, mi, label = groups[g]
        raise ValueError(f"media[{mi}] ({label}) has no placeholder run in token_ids "
                         f"({g} of the {len(groups)} runs media describes found)")
    return RopePositions(positions, int(positions.max()) + 1 - n_tok)


def decode_rope_position(kv_position: int, rope_delta: int) -> int:
    """The rotary position (equal on all three axes) of the token at KV position `kv_position`
    after the prompt: `kv_position + rope_delta`."""
    if isinstance(kv_position, bool) or int(kv_position) != kv_position or kv_position < 0:
        raise ValueError(f"kv_position must be a non-negative integer, got {kv_position!r}")
    if isinstance(rope_delta, bool) or int(rope_delta) != rope_delta:
        raise ValueError(f"rope_delta must be an integer, got {rope_delta!r}")
    return int(kv_position) + int(rope_delta)
