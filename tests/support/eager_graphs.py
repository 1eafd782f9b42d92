"""The decode graphs' run contract on the CPU, for tests: inputs through `fill_static_inputs` into the `_Graph`
buffer layout, and `decode_body` run eagerly on views of it (no capture, no pinned memory)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer.targets.qwen3_6.program.cuda_graphs import decode_body


class EagerGraphs:
    """`DecodeGraphs`' run contract on the CPU: the inputs go through `fill_static_inputs` into the
    `_Graph` buffer layout and `decode_body` runs eagerly on views of it (no capture, no pinned memory)."""

    def __init__(self, prog, max_batch: int) -> None:
        self.model, self.state, self.ops = prog.model, prog._state, prog.model.ops
        self.width = -(-prog.config.max_model_len // prog.config.page_size)
        self.max_batch, self.replays, self.mask_replays = max_batch, 0, 0
        self._logits: torch.Tensor | None = None

    def fits(self, B, tables):
        return B <= self.max_batch and all(len(t) <= self.width for t in tables)

    def run(self, input_ids, positions, src, dst, tables, fed=None, deltas=None):
        from ninfer.targets.qwen3_6.program.cuda_graphs import fill_static_inputs
        B, W = len(positions), self.width
        v = torch.zeros(6 * B + B * W, dtype=torch.long)
        if fed is not None:
            assert input_ids is None and fed.shape == (B,)
            input_ids = [-1] * B
        fill_static_inputs(v, W, input_ids, positions, src, dst, tables, deltas)
        g = SimpleNamespace(input_ids=v[:B], positions=v[B:2 * B], src=v[2 * B:3 * B], dst=v[3 * B:4 * B],
                            context_lens=v[4 * B:5 * B], delta=v[5 * B:6 * B], block_tables=v[6 * B:].view(B, W),
                            rows=torch.arange(B),
                            fed=fed.clone() if fed is not None else torch.zeros(B, dtype=torch.long))
        self.replays += 1
        self._logits = decode_body(self.model, self.state, g)
        return self._logits

    def mask_logits(self, mask):
        from ninfer.ops.opset import apply_token_bitmask_
        assert self._logits is not None and mask.shape[0] == self._logits.shape[0]
        self.mask_replays += 1
        return apply_token_bitmask_(self._logits, mask.clone())


class EagerSpecGraphs:
    """`SpecGraphs`' run contract on the CPU: the round's inputs through `_Graph.fill` into the graph's buffer
    layout, and `round_body` run eagerly on views of it."""

    def __init__(self, prog) -> None:
        from ninfer.targets.qwen3_6.program.spec_graphs import _Graph
        self.prog, self.model, self.state, self.ops = prog, prog.model, prog._state, prog.model.ops
        self.k = prog.config.num_speculative_tokens
        self.width = -(-prog.config.max_model_len // prog.config.page_size)
        self._graph_cls, self.replays = _Graph, 0

    def fits(self, B, tables):
        return all(len(t) <= self.width for t in tables)

    def run(self, last, frontier, src, dst, tables, deltas=None):
        from ninfer.targets.qwen3_6.program.spec_graphs import round_body
        g = self._graph_cls.__new__(self._graph_cls)
        B, T, W = len(last), self.k + 1, self.width
        g.B, g.K, g.W = B, self.k, W
        v = torch.zeros(4 * B + B * T + B * W, dtype=torch.long)
        g.host_np = v.numpy()
        g.fill(last, frontier, src, dst, tables, deltas)
        g.last, g.frontier, g.src, g.delta = v[0:B], v[B:2 * B], v[2 * B:3 * B], v[3 * B:4 * B]
        g.dst = v[4 * B:4 * B + B * T]
        g.block_tables = v[4 * B + B * T:].view(B, W)
        g.rows = torch.arange(B)
        g.token_rows = g.rows.repeat_interleave(T)
        g.offsets = torch.arange(T)
        self.replays += 1
        return round_body(self.model, self.state, g, self.prog._sampler.sampleable, self.prog.drafter.vocab)
