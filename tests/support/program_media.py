"""Prompts with media for Program and Engine tests: a stand-in vision encoder (seeded rows per media digest),
a prompt with two images and MRoPE-like positions, and a greedy generation driver."""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from ninfer.contract.program import MediaInput, SamplingParams, SequenceRequest

GREEDY = SamplingParams(temperature=0.0)
PAD = 248056                         # a placeholder id (any id; the rows replace its embedding)


class FakeEncoder:
    def __init__(self, hidden):
        self.hidden, self.calls = hidden, []

    def encode(self, m):
        self.calls.append(m.digest)
        seed = int(hashlib.sha256(m.digest.encode()).hexdigest()[:8], 16)
        return torch.randn(m.length, self.hidden, generator=torch.Generator().manual_seed(seed)) * 0.5


def media_request(n_out=12, K=0):
    ids = [11, 12, 13] + [PAD] * 6 + [21, 22] + [PAD] * 4 + [31, 32, 33]
    media = (MediaInput("image", 3, 6, "img-a", None, (1, 4, 6)), MediaInput("image", 11, 4, "img-b", None, (1, 4, 4)))
    # MRoPE-like positions: text continues, each image spans a small grid (the values only need to differ
    # from the KV positions)
    rope = np.zeros((3, len(ids)), dtype=np.int64)
    p = 0
    for i in range(len(ids)):
        if 3 <= i < 9:
            j = i - 3
            rope[:, i] = (3, 3 + j // 3, 3 + j % 3)
            p = 6
        elif 11 <= i < 15:
            j = i - 11
            rope[:, i] = (9, 9 + j // 2, 9 + j % 2)
            p = 11
        else:
            rope[:, i] = p
            p += 1
    delta = int(rope.max()) + 1 - len(ids)
    return SequenceRequest(tuple(ids), n_out, GREEDY, lookahead=K, media=media, rope_positions=rope, rope_delta=delta)


def generate(prog, req, stages, n):
    s = prog.start_materialize(prog.plan_materialize(req)).sequence
    for size in stages:
        st = prog.prefill(s, size)
    prog.commit(st.pending, [1])
    out = list(st.pending.rows[0].tokens)
    while len(out) < n:
        b = prog.decode([s])
        c = min(b.rows[0].produced_tokens, n - len(out))
        out += b.rows[0].tokens[:c]
        prog.commit(b, [c])
    prog.release(s)
    prog.check_integrity()
    return out
