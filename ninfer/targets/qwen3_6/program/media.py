"""Prompts with images and video in the Qwen3.6 Program: the vision tower's rows in place of the placeholder
tokens, the MRoPE positions of the prompt, and the rope delta after it.

    request.media[i]     one image or video: placeholder run prompt[offset:offset + length], its pixel values
    request.rope_positions   [3, P] the prompt's MRoPE positions (text after media no longer rotates at its
                         KV position)
    request.rope_delta   a token at KV position p >= P rotates at p + rope_delta on every axis

Prefix identity: checkpoints are keyed on `identity_tokens` (each media run as ids of its content), so the
same image reuses a checkpoint and a different one never does.

A prefill stage [start, end) that overlaps a media run takes that run's rows from the tower's output, computed
once per sequence when the first stage reaches the run (a stage may split a run: the later stage slices the
same rows) and dropped when a stage has consumed the run's last row. A stage with media rows, or whose rotary
positions are not its KV positions plus one constant, runs the eager forward; any other stage (the text after
the last image, which the next turn of a chat prefills over its cached prefix) runs as text does, the prefill
and decode graphs taking its constant delta as data (`text_stage_delta`). Decode steps and speculative rounds
add the delta to their rotary positions; the MTP layer keeps KV positions (its own cache is consistent in them).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ninfer.contract.program import Refusal, RefusalKind, SequenceRequest
from ninfer.targets.qwen3_6.program.sequences import LiveSeq


class MediaOps:
    """Mixed into Qwen36Program. Uses its `vision` (an encoder with `encode(MediaInput) -> [length, H]` on the
    device, or None: no media accepted), `dims` and `device`."""

    @property
    def supports_media(self) -> bool:
        return self.vision is not None

    @property
    def media_patch_limit(self) -> int:
        """Patches (t x h x w) of the largest media input admitted (0: none); the tower's workspace is planned
        for it at start."""
        return self.config.max_media_patches if self.vision is not None else 0

    def media_workspace_bytes(self) -> int:
        """The tower's activations for the largest admitted media input: a square grid of media_patch_limit
        patches (the bound grows with the patch count; a square has the largest position tables)."""
        if self.vision is None:
            return 0
        side = max(2, int(self.config.max_media_patches ** 0.5) // 2 * 2)
        return self.vision.tower.activation_bytes([(1, side, side)])

    def _validate_media(self, request: SequenceRequest) -> Refusal | None:
        P = len(request.prompt_token_ids)
        if request.media and self.vision is None:
            return Refusal(RefusalKind.INFEASIBLE, "this model has no vision tower: the prompt's media cannot be read")
        end = 0
        for i, m in enumerate(request.media):
            t, h, w = m.grid_thw
            if t * h * w > self.media_patch_limit:
                return Refusal(RefusalKind.INFEASIBLE, f"media {i}: {t * h * w} patches ({t}x{h}x{w}) over the "
                                                       f"{self.media_patch_limit} the vision tower is planned for")
            if m.offset < end or m.length < 1 or m.offset + m.length > P:
                return Refusal(RefusalKind.INFEASIBLE, f"media {i}: placeholder run [{m.offset}, "
                                                       f"{m.offset + m.length}) overlaps another or leaves the prompt")
            end = m.offset + m.length
        rp = request.rope_positions
        if rp is not None and tuple(getattr(rp, "shape", ())) != (3, P):
            return Refusal(RefusalKind.INFEASIBLE, f"rope_positions must be [3, {P}], got "
                                                   f"{tuple(getattr(rp, 'shape', ()))}")
        return None

    def media_rows(self, seqs: Sequence[LiveSeq], lens: Sequence[int], starts: Sequence[int],
                   positions: torch.Tensor) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
        """For one packed batch (row r: lens[r] tokens from starts[r]; positions [N] host): the rotary positions
        ([3, N] on the device, None when every row rotates at its position) and the embedding rows to replace
        ((rows [M], values [M, H]) on the device, or None)."""
        if not any(s.request.media or s.request.rope_positions is not None or s.request.rope_delta for s in seqs):
            return None, None
        rope = positions.unsqueeze(0).repeat(3, 1)
        rows: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        base = 0
        for s, n, st in zip(seqs, lens, starts):
            req = s.request
            P = len(req.prompt_token_ids)
            if req.rope_positions is not None and st < P:
                k = min(st + n, P) - st
                rope[:, base:base + k] = torch.as_tensor(req.rope_positions[:, st:st + k], dtype=torch.long)
            if req.rope_delta:
                past = max(P - st, 0)
                rope[:, base + past:base + n] += req.rope_delta
            for i, m in enumerate(req.media):
                a, b = max(m.offset, st), min(m.offset + m.length, st + n)
                if a >= b:
                    continue
                emb = s.media_embeds.get(i)
                if emb is None:
                    emb = s.media_embeds[i] = self.vision.encode(m)
                rows.append(torch.arange(base + a - st, base + b - st, dtype=torch.long))
                values.append(emb[a - m.offset:b - m.offset])
                if b == m.offset + m.length:
                    del s.media_embeds[i]
            base += n
        embeds = None
        if rows:
            embeds = (torch.cat(rows).to(self.device), torch.cat(values))
        return rope.to(self.device), embeds

    def identity_tokens(self, s: LiveSeq, n: int) -> tuple[int, ...]:
        """The first n ids of the sequence as a checkpoint's identity sees them: media runs as ids of their
        content (`ninfer.contract.program.identity_token_ids`), then the output tokens."""
        if not s.request.media:
            return tuple(s.tokens[:n])
        return s.request.identity_prompt()[:n] + tuple(s.tokens[s.num_prompt:n])

    def text_stage_delta(self, s: LiveSeq, start: int, end: int) -> int | None:
        """d when the prompt stage [start, end) runs as text does: no media row in it, and every token rotating
        at its position + d on every MRoPE axis (0 for a text prompt; the request's rope_delta for the text
        after its last media, e.g. the next turn of a chat about an image). The graphs take d as data. None
        otherwise: the stage runs eagerly (`media_rows`)."""
        req = s.request
        if any(m.offset < end and start < m.offset + m.length for m in req.media):
            return None
        if req.rope_positions is None:
            return 0
        rot = torch.as_tensor(req.rope_positions[:, start:end], dtype=torch.long)
        d = rot - torch.arange(start, end, dtype=torch.long)
        first = int(d[0, 0])
        return first if bool((d == first).all()) else None

    def rope_deltas(self, seqs: Sequence[LiveSeq]) -> list[int]:
        return [s.request.rope_delta for s in seqs]
