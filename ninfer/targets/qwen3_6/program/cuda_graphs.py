"""CUDA graphs of the single-token decode step, one per exact batch size B in 1..max_batch.

Captured once at Program start (CUDA device, fast op set, not `enforce_eager`), after every large
allocation (KV pool, StateImage planes, weights) exists; nothing they point into is ever rebuilt.
Page ids, state entries and positions are data in static buffers, never graph keys.

    static inputs of graph B (one int64 device buffer; the graph's first node copies it from the graph's
    pinned host buffer, which `run` fills through a numpy view: no host-side copy launch per round)
      input_ids [B]  positions [B]  src [B]  dst [B]  context_lens [B]  delta [B]  block_tables [B, W]
      W = ceil(max_model_len / page_size) (fixed width; entries past a row's table are stale, never read)
      src / dst: physical state images (`StateImageStore.phys` of the Program's entry ids)
      delta: the rope delta of a prompt with media (rotary position = position + delta; 0 for text)
    input_ids < 0 take the row's id from the graph's device buffer `fed` [B] instead (a step fed by
    the previous step's tokens without a host round trip: step_ahead.py)
    graph body
      hidden = model.decode_static(..., src)                  (writes KV at positions; conv and delta
                                                               rule read state at src, write it at dst;
                                                               with the MTP layer also its KV and anchor)
      logits = lm_head(hidden) in fp32  [B, V]                 (static output, overwritten per replay)
    mask graph of B (replayed after the body only on steps of grammar-constrained rows, constraints.py)
      mask [B, ceil(V / 32)] int32 <- pinned host rows         (rows of one device buffer shared by every B)
      logits[~mask] = -inf                                     (apply_token_bitmask_)
    The host fills a step's masks while the body runs on the GPU (`run`, then `mask_logits`): the masks need
    the previous step's tokens, the forward does not, so the grammar's work hides under the forward.

Sampling stays outside (one host sync per round for the token ids). Graph-safety of the body: no
`.item()/.tolist()`, no host tensors, no shapes or Python branches that depend on tensor values;
the fast ops derive launch grids from shapes only (decode attention's split count from W).
The MoE leaf's routed experts must be the fast (sync-free) kernel: the reference loops over
`torch.unique(ids).tolist()`. Capture warms up every B on a side stream first (Triton compiles),
with src = dst = scratch entries and page 0 at position 0: nothing is owned at start.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ninfer.contract.program import mask_words
from ninfer.ops.opset import apply_token_bitmask_
from ninfer.program.stores import StateImageStore
from ninfer.targets.qwen3_6.program.model import Qwen36Model


def decode_body(model: Qwen36Model, state: StateImageStore, g) -> torch.Tensor:
    """The captured region (device tensors of `g` only): forward (the conv and delta-rule kernels read
    each row's state at src and write the stepped state at its provisional entry dst: no separate
    copy; src, the committed slot, is never written), lm_head."""
    ids = torch.where(g.input_ids < 0, g.fed, g.input_ids)
    mtp = model.view.mtp is not None
    known = {"conv", "recurrent", "mtp_hidden"} if mtp else {"conv", "recurrent"}
    for name, plane in state.planes.items():
        if name not in known:                 # a plane no decode op steps: copy it as before
            plane.index_copy_(1, g.dst, plane.index_select(1, g.src))
    hidden = model.decode_static(ids, g.positions, g.dst, g.block_tables, g.context_lens, g.rows,
                                 src_entries=g.src, rope_positions=g.positions + g.delta)
    if mtp:                                   # the MTP KV of position - 1 and the anchor at dst (speculate.py)
        model.mtp_observe(g.src, hidden, ids, g.positions, g.rows, g.block_tables, g.dst)
    return model.logits(hidden)


def fill_static_inputs(host: "torch.Tensor | np.ndarray", W: int, input_ids: Sequence[int], positions: Sequence[int],
                       src: Sequence[int], dst: Sequence[int], tables: Sequence[Sequence[int]],
                       deltas: Sequence[int] | None = None) -> None:
    """Write one step's inputs into a graph's int64 host buffer in the `_Graph` layout: ids,
    positions, src, dst, context lengths (positions + 1), rope deltas (default 0), then row r's pages at
    6B + r*W.

    NOTE: only each row's own pages are written; the entries past them keep stale ids, which no
          kernel reads (attention and the KV write stop at the row's context): padding every row
          to W (= max_model_len / page_size) from a Python list is slow at a long max_model_len.
          The writes go through a numpy view of the buffer, several times cheaper than
          torch.tensor + slice assignments (docs/performance.md, "Decision log")."""
    a = host.numpy() if isinstance(host, torch.Tensor) else host
    B = len(input_ids)
    a[:B], a[B:2 * B], a[2 * B:3 * B], a[3 * B:4 * B] = input_ids, positions, src, dst
    a[4 * B:5 * B] = positions
    a[4 * B:5 * B] += 1
    a[5 * B:6 * B] = 0 if deltas is None else deltas
    for r, t in enumerate(tables):
        if len(t) > W:
            raise ValueError(f"row {r} has {len(t)} pages; the graph's tables hold {W}")
        o = 6 * B + r * W
        a[o:o + len(t)] = t


class PinnedInputs:
    """A graph's static int64 inputs: a device buffer that the graph's first node copies from a pinned host
    buffer (`copy_in`), and the event that says when `host` may be refilled (`wait_reusable`). Used by the
    decode graphs and the prefill graphs (prefill_graphs.py)."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.dev = torch.zeros(n, dtype=torch.long, device=device)
        self.host = torch.zeros(n, dtype=torch.long, pin_memory=True)
        self.host_np = self.host.numpy()     # the same memory (the fill functions write through it)
        # NOTE: recorded inside the graph, right after its first node (the copy out of `host`): `run` may
        #       refill `host` as soon as that copy is over, while the rest of the replay still runs (a
        #       step-ahead launch comes while the step before it is on the GPU).
        self.copied = torch.cuda.Event(external=True)
        self.copied.record()

    def copy_in(self) -> None:
        """The graph's first node (called in the body): host -> dev, then the event inside a capture."""
        self.dev.copy_(self.host, non_blocking=True)
        if torch.cuda.is_current_stream_capturing():
            self.copied.record()

    def wait_reusable(self) -> None:
        """Before refilling `host`: the last replay's copy out of it is over."""
        self.copied.synchronize()


def capture_per_batch(graphs: dict, prepare, body, keep, attr: str = "graph") -> float:
    """Capture one graph per batch size into a shared memory pool, largest B first (the pool then fits the
    rest): prepare(B, g) fills g's capture inputs, body(g) is run twice on a side stream (Triton compiles), then
    captured; keep(g, out) stores the captured outputs and g.<attr> the graph. Returns the seconds it took."""
    import time
    t0 = time.perf_counter()
    pool = torch.cuda.graph_pool_handle()
    for B in sorted(graphs, reverse=True):
        g = graphs[B]
        prepare(B, g)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                body(g)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            keep(g, body(g))
        setattr(g, attr, graph)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


class _Graph(PinnedInputs):
    def __init__(self, B: int, W: int, device: torch.device, mask: torch.Tensor) -> None:
        super().__init__(6 * B + B * W, device)
        self.mask = mask[:B]                  # rows of the shared device mask buffer
        self.B, self.W = B, W
        v = self.dev
        self.input_ids, self.positions = v[0:B], v[B:2 * B]
        self.src, self.dst, self.context_lens = v[2 * B:3 * B], v[3 * B:4 * B], v[4 * B:5 * B]
        self.delta = v[5 * B:6 * B]
        self.block_tables = v[6 * B:].view(B, W)
        self.rows = torch.arange(B, dtype=torch.long, device=device)
        self.fed = torch.zeros(B, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.mask_graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class DecodeGraphs:
    def __init__(self, model: Qwen36Model, state: StateImageStore, max_batch: int, max_model_len: int,
                 page_size: int, device: torch.device) -> None:
        self.model, self.state = model, state
        self.ops = model.ops                  # the op set captured; another set runs eagerly
        self.width = -(-max_model_len // page_size)
        self.device = device
        words = mask_words(model.dims.vocab_size)
        self.mask = torch.full((max_batch, words), -1, dtype=torch.int32, device=device)
        self.mask_host = torch.full((max_batch, words), -1, dtype=torch.int32, pin_memory=True)
        self._graphs = {B: _Graph(B, self.width, device, self.mask) for B in range(1, max_batch + 1)}
        self.capture_s = 0.0
        self.replays = 0
        self.mask_replays = 0

    def _body(self, g: _Graph) -> torch.Tensor:
        # NOTE: the static-input copy is the graph's first node, not a host-side launch per round.
        g.copy_in()
        return decode_body(self.model, self.state, g)

    def _mask_body(self, g: _Graph) -> torch.Tensor:
        g.mask.copy_(self.mask_host[:g.B], non_blocking=True)
        return apply_token_bitmask_(g.logits, g.mask)

    def capture(self) -> None:
        ns = self.state.num_slots

        def prepare(B: int, g: _Graph) -> None:
            g.host.zero_()                                    # src = dst = scratch entries, context 1
            g.host[2 * B:4 * B] = torch.arange(ns, ns + B).repeat(2)
            g.host[4 * B:5 * B] = 1

        def keep(g: _Graph, out: torch.Tensor) -> None:
            g.logits = out

        self.capture_s = capture_per_batch(self._graphs, prepare, self._body, keep)
        # NOTE: the mask graphs run on the bodies' logits with all-ones masks while capturing (nothing changes).
        self.capture_s += capture_per_batch(self._graphs, lambda B, g: None, self._mask_body,
                                            lambda g, out: None, attr="mask_graph")

    def fits(self, B: int, tables: Sequence[Sequence[int]]) -> bool:
        return B in self._graphs and all(len(t) <= self.width for t in tables)

    def run(self, input_ids: Sequence[int] | None, positions: Sequence[int], src: Sequence[int], dst: Sequence[int],
            tables: Sequence[Sequence[int]], fed: torch.Tensor | None = None,
            deltas: Sequence[int] | None = None) -> torch.Tensor:
        """Replay graph B = len(positions); returns its static fp32 logits [B, V] (valid until the next
        replay of the same B: clone to keep them). fed: the rows' input ids as a device tensor [B] (then
        input_ids is None), e.g. the previous step's tokens, copied into the graph's `fed` buffer on
        the stream (no host sync)."""
        B = len(positions)
        g = self._graphs[B]
        g.wait_reusable()                     # this graph's last replay no longer reads its pinned buffer
        if fed is not None:
            g.fed.copy_(fed)
            input_ids = [-1] * B
        fill_static_inputs(g.host_np, self.width, input_ids, positions, src, dst, tables, deltas)
        g.graph.replay()
        self.replays += 1
        return g.logits

    def mask_logits(self, mask: torch.Tensor) -> torch.Tensor:
        """After `run` of B = len(mask) rows: mask that replay's logits in place with the rows' token bitmasks
        on the host [B, W] int32 (the mask graph of B); returns the logits.
        NOTE: the host rows are shared by every B. Masked steps run unpipelined (their tokens are read, a sync,
              before the next step's masks are written), so no pending copy still reads them."""
        B = mask.shape[0]
        g = self._graphs[B]
        self.mask_host[:B].copy_(mask)
        g.mask_graph.replay()
        self.mask_replays += 1
        return g.logits
