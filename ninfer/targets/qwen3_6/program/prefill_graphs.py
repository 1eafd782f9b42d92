"""CUDA graphs of whole short prefill stages: one sequence's prompt chunk at any start (over its prefix or
none), padded to a bucket of rows.

Why: a short stage is host bound. Its ~1300 kernel launches (35B-A3B) cost more host time than the GPU
takes to run them. Replaying a graph of the whole stage leaves the GPU time only.

    which stages   one sequence, 2..`max_tokens` tokens, text positions, at any start: a prompt's first
                   stage, a stage after a context-cache hit (a chat's next turn, a shared system prompt)
                   or after an earlier stage of a long prompt; the Program sends the others (prompt
                   log-probs, kept logits, longer stages) to the eager forward
    buckets        BUCKETS up to max_tokens; a stage of L tokens runs at the first bucket N >= L
    static inputs  (one int64 device buffer, copied from the graph's pinned host buffer by the graph's
                   first node, as the decode graphs do)
                     input_ids [N] (0 past L)   L   state entry (physical image)   start   block_tables [2, W]
                   row 0 of the tables: the sequence's pages, then the dummy page; row 1: the dummy page
                   (W = ceil((max_model_len + N) / page_size): the padding's positions run past the
                   stage). The dummy page is one page of the KV store that the ledger does not own: the
                   padding's KV goes there, and no sequence reads it. The state entry holds the state
                   after the prefix, as on the eager path.
    graph body     Qwen36Model.prefill_static (positions start..start+N-1; the padding rows 1 of `rows`;
                   the attention walks the prefix's pages on the device, `prefix_attention_rows`), then
                   the hidden state of token L - 1 [1, H] (a static output: the caller runs the lm_head
                   when the stage is the prompt's last)

Each bucket is captured on its first use (the serve warmup's lengths reach every one): a warm-up run
on a side stream first (Triton compiles, fla-core's autotuning, cuDNN's plan, cuBLAS's heuristics stay
out of the capture), with fla-core called directly (`gated_delta.ungraphed`), the state entry a
scratch entry the caller holds and every page the dummy. Nothing is owned by the capture, and the
real stage then runs once, by the replay. After a capture, a few eager stages over a prefix run on the
same scratch entry and the dummy page (`warm_eager_over_prefix`): what an eager stage over a prefix (one
with prompt log-probs or kept logits) needs on first use, which the warmup's short stages, being graphed,
do not reach. All graphs share one memory
pool: one runs at a time, on the current stream, and its output is read before the next. A capture
that fails warns once, and the Program runs every stage eagerly from then on.
"""
from __future__ import annotations

import bisect
import os
import time
import warnings
from typing import Sequence

import torch

from ninfer.targets.qwen3_6.program.cuda_graphs import PinnedInputs
from ninfer.targets.qwen3_6.program.model import ForwardBatch, Qwen36Model

# NOTE: every bucket up to 256 rows doubles; past it they step by 256 rows, the `sdpa_rows` lengths, so the
#       attention inside pads nothing more. 8 rows is the GEMV's limit (`gemv.MAX_ROWS`).
BUCKETS = (8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048)
MAX_TOKENS = int(os.environ.get("NINFER_PREFILL_GRAPH_TOKENS", "2048"))   # 0: no prefill graphs


# NOTE: a stage is host bound while its kernels take less than the host time the eager path spends on its
#       ~1300 launches; past that the padding only adds GPU work. So graphs go up to the largest bucket whose
#       GEMMs stay under HOST_BOUND_FLOPS, about that host time of GEMMs: the 27B to 512 rows, the 35B-A3B
#       to 2048 (docs/performance.md, "Decision log").
HOST_BOUND_FLOPS = 3e13


def graph_tokens(dims, cap: int = MAX_TOKENS) -> int:
    """The longest stage the prefill graphs take for a model of `dims`: the largest bucket <= cap whose
    GEMMs (2 x the matrix parameters a token goes through, lm_head aside, x rows) are at most
    HOST_BOUND_FLOPS; 0 when none is."""
    from ninfer.targets.qwen3_6.schema import active_matrix_params
    per_row = 2.0 * (active_matrix_params(dims) - dims.vocab_size * dims.hidden_size)
    fit = [b for b in BUCKETS if b <= cap and b * per_row <= HOST_BOUND_FLOPS]
    return fit[-1] if fit else 0


def bucket(L: int, max_tokens: int = MAX_TOKENS) -> int | None:
    """The row count a stage of L tokens runs at, or None when no graph takes it (a 1-token stage is a
    decode step: the eager path runs it with the decode kernels, the final one through a decode graph)."""
    if L < 2 or L > min(max_tokens, BUCKETS[-1]):
        return None
    return BUCKETS[bisect.bisect_left(BUCKETS, L)]


def fill_prefill_inputs(a, N: int, W: int, tokens: Sequence[int], entry: int, pages: Sequence[int],
                        dummy_page: int, start: int, page_size: int, delta: int = 0) -> None:
    """Write one stage's inputs into a prefill graph's int64 host buffer (numpy, `_Graph` layout): the
    tokens then zeros up to N, L, the state entry, the start, the rope delta (the stage's tokens rotate at
    their position + delta on every axis: text after media), row 0 of the tables (the pages, then the
    dummy page up to W) and row 1 (the dummy page). The tables must reach the padding's last position
    (start + N - 1, at page_size tokens a page)."""
    L = len(tokens)
    if not 1 <= L <= N:
        raise ValueError(f"a prefill stage of {L} tokens in a graph of {N} rows")
    if len(pages) > W:
        raise ValueError(f"{len(pages)} pages for a prefill graph's tables of {W}")
    if start < 0 or start + N > W * page_size:
        raise ValueError(f"a prefill stage at {start} padded to {N} rows past tables of {W} pages of {page_size}")
    a[:L] = tokens
    a[L:N] = 0
    a[N], a[N + 1], a[N + 2], a[N + 3] = L, entry, start, delta
    a[N + 4:N + 4 + len(pages)] = pages
    a[N + 4 + len(pages):] = dummy_page


def prefill_body(model: Qwen36Model, g) -> torch.Tensor:
    """The captured region, from the device tensors of `g` only (`_Graph`'s views: input_ids [N], length
    [1], entry [1], start [1], delta [1], block_tables [2, W], positions = arange(N), zero [1]): the stage's
    forward, then the hidden state of its last real token [1, H]."""
    valid = g.positions < g.length
    rows = (~valid).long()
    cu = torch.cat([g.zero, g.length])
    hidden = model.prefill_static(g.input_ids, g.positions + g.start, rows, valid, cu, g.entry, g.block_tables,
                                  g.start, rope_delta=g.delta)
    last = hidden.index_select(0, g.length - 1)
    if model.view.mtp is not None:
        # NOTE: the MTP layer's KV of positions start-1.. (the hidden state of each position with the token
        #       after it; at start 0 the entry of position -1 goes to the padding's pages) and the anchor of
        #       the stage's end (speculate.py).
        plane = model.state.planes["mtp_hidden"][0]
        prev = torch.cat([plane.index_select(0, g.entry), hidden[:-1]])
        mpos = g.positions + g.start - 1
        model.mtp_kv(prev, g.input_ids, mpos.clamp_min(0), torch.where(mpos < 0, 1, rows), g.block_tables)
        plane.index_copy_(0, g.entry, last.to(plane.dtype))
    return last


def eager_warm_rows(N: int, chunk_lengths: Sequence[int]) -> list[int]:
    """The eager stages over a prefix that the capture of bucket N warms (`warm_eager_over_prefix`): N - 1
    rows, and each chunk-GDN length (`gated_delta.graphed_lengths()`) above the bucket below N and at most
    N, so the buckets' captures together reach every one."""
    i = BUCKETS.index(N)
    below = BUCKETS[i - 1] if i else 0
    return sorted({N - 1} | {t for t in chunk_lengths if below < t <= N})


def warm_eager_over_prefix(model: Qwen36Model, rows: Sequence[int], image: int, spare_page: int,
                           page_size: int) -> None:
    """Run the eager forward of a stage of each `rows` count over a prefix of one page, on the physical
    state image `image` (a scratch entry the caller holds) with every page the spare one; both are zeroed
    first (their content is never read by a sequence). Nothing else is written.
    Why: with the prefill graphs the serve warmup's short stages do not run eagerly, but a stage over a
    prefix with prompt log-probs or kept logits does (the graphs keep the last row only); without this its
    first use would pay the chunk-GDN graph of its length and the Triton forms at odd row counts."""
    dev = model.view.embed_tokens.device
    model.state.zero_image(image)
    model.kv.k[:, spare_page].zero_()
    model.kv.v[:, spare_page].zero_()
    start = page_size
    for r in rows:
        W = -(-(start + r) // page_size)
        model.forward(ForwardBatch(
            input_ids=torch.zeros(r, dtype=torch.long, device=dev),
            positions=torch.arange(start, start + r, dtype=torch.long, device=dev), seqlens=(r,), starts=(start,),
            state_entries=torch.tensor([image], dtype=torch.long, device=dev),
            block_tables=torch.full((1, W), spare_page, dtype=torch.int32, device=dev)))


def table_pages(N: int, page_size: int, max_model_len: int) -> int:
    """W, the block-table width of the graph of N rows: a stage ends within max_model_len, and its padding
    runs N - 1 positions further at most."""
    return -(-(max_model_len + N) // page_size)


class _Graph(PinnedInputs):
    def __init__(self, N: int, W: int, device: torch.device) -> None:
        self.N, self.W = N, W
        super().__init__(N + 4 + 2 * W, device)
        v = self.dev
        self.input_ids, self.length, self.entry, self.start = v[:N], v[N:N + 1], v[N + 1:N + 2], v[N + 2:N + 3]
        self.delta = v[N + 3:N + 4]
        self.block_tables = v[N + 4:].view(2, W)
        self.positions = torch.arange(N, dtype=torch.long, device=device)
        self.zero = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden: torch.Tensor | None = None


class PrefillGraphs:
    def __init__(self, model: Qwen36Model, page_size: int, dummy_page: int, device: torch.device,
                 max_tokens: int, max_model_len: int) -> None:
        self.model = model
        self.ops = model.ops                  # the op set captured; another set runs eagerly
        self.page_size, self.dummy_page, self.device = page_size, dummy_page, device
        self.max_tokens, self.max_model_len = max_tokens, max_model_len
        self._graphs: dict[int, _Graph] = {}
        self.pool = None
        self.failed: str | None = None
        self.capture_s = 0.0
        self.replays = 0

    def fits(self, L: int) -> bool:
        return self.failed is None and bucket(L, self.max_tokens) is not None

    def captured(self, L: int) -> bool:
        return bucket(L, self.max_tokens) in self._graphs

    def _body(self, g: _Graph) -> torch.Tensor:
        g.copy_in()
        return prefill_body(self.model, g)

    def capture(self, L: int, scratch_entry: int) -> bool:
        """Capture the bucket of a stage of L tokens (once); scratch_entry: a physical state image the
        caller holds for the duration (the warm-up run writes it). False when the capture failed (warned;
        every later stage then runs eagerly)."""
        from ninfer.ops.triton import gated_delta
        N = bucket(L, self.max_tokens)
        if N in self._graphs:
            return True
        t0 = time.perf_counter()
        g = _Graph(N, table_pages(N, self.page_size, self.max_model_len), self.device)
        fill_prefill_inputs(g.host_np, N, g.W, [0] * N, scratch_entry, [], self.dummy_page, 0, self.page_size)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side), gated_delta.ungraphed():
                self._body(g)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # NOTE: captured while serving (first use of a bucket): thread_local, so another thread's CUDA
            #       call cannot invalidate it.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                g.hidden = self._body(g)
        except RuntimeError as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"ninfer prefill graphs: the capture of {N} rows failed ({self.failed}); short prefill "
                          "stages run eagerly from now on")
            return False
        g.graph = graph
        self._graphs[N] = g
        warm_eager_over_prefix(self.model, eager_warm_rows(N, gated_delta.graphed_lengths()), scratch_entry,
                               self.dummy_page, self.page_size)
        self.capture_s += time.perf_counter() - t0
        return True

    def run(self, tokens: Sequence[int], start: int, entry: int, pages: Sequence[int], delta: int = 0) -> torch.Tensor:
        """Replay the captured bucket of len(tokens) (`capture` first): the stage at positions start.. (rotary
        positions start + delta.., the same on every MRoPE axis),
        its prefix's KV read from and its own written into `pages` (the sequence's, from position 0), its
        state read (the state after the prefix) and written at the physical image `entry`. Returns the
        hidden state of its last token [1, H] (the graph's static output, valid until the next replay of
        any prefill graph)."""
        g = self._graphs[bucket(len(tokens), self.max_tokens)]
        end = start + len(tokens)
        if end > self.max_model_len:
            raise ValueError(f"a prefill stage ending at {end}, past max_model_len {self.max_model_len}")
        need = -(-end // self.page_size)
        if len(pages) < need:
            raise ValueError(f"{len(pages)} pages of {self.page_size} tokens for a prefill stage ending at {end}")
        g.wait_reusable()                     # this graph's last replay no longer reads its pinned buffer
        fill_prefill_inputs(g.host_np, g.N, g.W, tokens, entry, pages[:need], self.dummy_page, start,
                            self.page_size, delta)
        g.graph.replay()
        self.replays += 1
        return g.hidden
