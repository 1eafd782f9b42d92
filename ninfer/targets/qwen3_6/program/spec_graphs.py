"""CUDA graphs of a whole speculative round with the MTP drafter, one per exact batch size B in 1..max_batch.

Captured once at Program start, after the decode graphs (cuda_graphs.py), which a Program with the MTP layer
keeps for its single steps (a prompt's last token, control tokens).

    static inputs of graph B (one int64 device buffer copied from a pinned host buffer by the first node)
      last [B]  frontier [B]  src [B]  delta [B]  dst [B * T]  block_tables [B, W]     (T = K + 1)
      (delta: the rope delta of a prompt with media; the verify rotates at position + delta)
    graph body (speculate.py for what each part means)
      draft     K MTP steps chained on the device; each draft is the argmax of the lm_head over the first
                draft_vocab token ids, fed to the next step
      verify    model.verify_static over [last, d_1..d_K] at frontier..frontier+K; the state after each
                token at dst[r * T + t]
      observe   the MTP KV of positions frontier-1..frontier+K-1; the anchors at dst
      outputs   drafts [B, K], logits [B, T, V] fp32 and their argmax over the sampleable vocabulary [B, T]
                (static buffers, overwritten by the next replay of the same B)

The host reads drafts and argmaxes with one sync per round and decides acceptance (speculate.py).
Capture warms every B up on a side stream with src = dst = scratch entries at frontier 1 and page 0:
nothing is owned at start.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ninfer.program.stores import StateImageStore
from ninfer.targets.qwen3_6.program.cuda_graphs import PinnedInputs, capture_per_batch
from ninfer.targets.qwen3_6.program.model import Qwen36Model


def round_body(model: Qwen36Model, state: StateImageStore, g: "_Graph", sampleable: int, draft_vocab: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The captured region (device tensors of `g` only): drafts [B, K], logits [B, T, V], argmax [B, T]."""
    B, K, T = g.B, g.K, g.K + 1
    anchor = state.planes["mtp_hidden"][0].index_select(0, g.src)
    d = model.mtp_draft_chain(anchor, g.last, g.frontier - 1, g.block_tables, g.rows, K, draft_vocab)
    ids = torch.cat([g.last[:, None], d], dim=1).flatten()
    pos = (g.frontier[:, None] + g.offsets[None, :]).flatten()
    cos_sin = model.text_rotary(pos + g.delta.repeat_interleave(T))
    hidden = model.verify_static(ids, pos, g.token_rows, g.src, g.dst.view(B, T), g.block_tables, cos_sin=cos_sin)
    model.mtp_observe(g.src, hidden, ids, pos, g.token_rows, g.block_tables, g.dst)
    logits = model.logits(hidden)
    return d, logits.view(B, T, -1), logits[:, :sampleable].argmax(dim=-1).view(B, T)


class _Graph(PinnedInputs):
    def __init__(self, B: int, K: int, W: int, device: torch.device) -> None:
        T = K + 1
        super().__init__(4 * B + B * T + B * W, device)
        self.B, self.K, self.W = B, K, W
        v = self.dev
        self.last, self.frontier, self.src, self.delta = v[0:B], v[B:2 * B], v[2 * B:3 * B], v[3 * B:4 * B]
        self.dst = v[4 * B:4 * B + B * T]
        self.block_tables = v[4 * B + B * T:].view(B, W)
        self.rows = torch.arange(B, dtype=torch.long, device=device)
        self.token_rows = self.rows.repeat_interleave(T)
        self.offsets = torch.arange(T, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def fill(self, last: Sequence[int], frontier: Sequence[int], src: Sequence[int], dst: Sequence[int],
             tables: Sequence[Sequence[int]], deltas: Sequence[int] | None = None) -> None:
        """Write one round's inputs into the pinned host buffer (only each row's own pages: the entries past
        them are stale and never read)."""
        a, B, T, W = self.host_np, self.B, self.K + 1, self.W
        a[:B], a[B:2 * B], a[2 * B:3 * B] = last, frontier, src
        a[3 * B:4 * B] = 0 if deltas is None else deltas
        a[4 * B:4 * B + B * T] = dst
        o = 4 * B + B * T
        for r, t in enumerate(tables):
            if len(t) > W:
                raise ValueError(f"row {r} has {len(t)} pages; the graph's tables hold {W}")
            a[o + r * W:o + r * W + len(t)] = t


class SpecGraphs:
    def __init__(self, model: Qwen36Model, state: StateImageStore, num_speculative_tokens: int, sampleable: int,
                 draft_vocab: int, max_batch: int, max_model_len: int, page_size: int, device: torch.device) -> None:
        self.model, self.state = model, state
        self.ops = model.ops
        self.k = num_speculative_tokens
        self.sampleable = sampleable
        self.draft_vocab = draft_vocab
        self.width = -(-max_model_len // page_size)
        self._graphs = {B: _Graph(B, self.k, self.width, device) for B in range(1, max_batch + 1)}
        self.capture_s = 0.0
        self.replays = 0

    def _body(self, g: _Graph):
        g.copy_in()
        return round_body(self.model, self.state, g, self.sampleable, self.draft_vocab)

    def capture(self) -> None:
        ns, T = self.state.num_slots, self.k + 1

        def prepare(B: int, g: _Graph) -> None:
            g.host.zero_()
            g.fill([0] * B, [1] * B, list(range(ns, ns + B)), [ns + B * T - 1 - i for i in range(B * T)], [[0]] * B)

        def keep(g: _Graph, out) -> None:
            g.out = out

        self.capture_s = capture_per_batch(self._graphs, prepare, self._body, keep)

    def fits(self, B: int, tables: Sequence[Sequence[int]]) -> bool:
        return B in self._graphs and all(len(t) <= self.width for t in tables)

    def run(self, last: Sequence[int], frontier: Sequence[int], src: Sequence[int], dst: Sequence[int],
            tables: Sequence[Sequence[int]], deltas: Sequence[int] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replay graph B = len(last): (drafts [B, K], logits [B, T, V], argmax [B, T]), the static outputs."""
        g = self._graphs[len(last)]
        g.wait_reusable()
        g.fill(last, frontier, src, dst, tables, deltas)
        g.graph.replay()
        self.replays += 1
        return g.out
