"""CausalScoring windows: the temporary State/KV and lm_head staging of a CausalScoring Program.

Created only when `ProgramConfig.purpose == "causal_scoring"`; a Generation Program has none of it.
Nothing here belongs to the Generation pools (no page, slot, holding or PendingBatch):

    ScoringStaging (allocated once at start, reused by every window)
      kv        k, v [attention layers, ceil(window / page_size), page_size, nkv, hd]   model dtype
                one block table 0 .. pages-1; positions of the current window only
      state     conv [gdn layers, 1, C, K-1] model dtype; recurrent [gdn layers, 1, nv, dk, dv] fp32
                entry 0, zeroed before every window (the empty State)
      logits    [LOGIT_ROWS, V] model dtype: lm_head output of up to LOGIT_ROWS positions

A window of n tokens is fed at positions 0 .. n-1 in forward chunks of FORWARD_CHUNK tokens
(staged, as a prefill), so attention scores stay [heads, FORWARD_CHUNK, window]. The hidden
states of the scored positions go through the lm_head LOGIT_ROWS at a time into the staging, and
the fp32 log_softmax over the vocabulary (`ninfer.ops.reference.logprobs`) is taken of each such chunk.
Peak extra memory is therefore independent of the text's length: ~LOGIT_ROWS * V * (2 + 4 + 1)
bytes for logits, log_softmax and the rank mask, plus the window's KV.
"""
from __future__ import annotations

import math

import torch

from ninfer.program.stores import PagedKVStore, StateImageStore
from ninfer.ops.reference.logprobs import logprobs_from_logits
from ninfer.contract.scoring import ScoringWindow, WindowScores
from ninfer.contract.program import InvariantError
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.leaves import LeafSet
from ninfer.targets.qwen3_6.program.model import ForwardBatch, Qwen36Model, state_planes
from ninfer.targets.qwen3_6.program.model_view import ModelView

FORWARD_CHUNK = 512              # tokens per forward stage of a window
LOGIT_BYTES = 128 << 20          # bound on the fp32 [rows, V] log_softmax of one lm_head chunk
MAX_TOP_K = 20


class ScoringStaging:
    def __init__(self, view: ModelView, config: ProgramConfig, window: int) -> None:
        d = view.dims
        dev, dt = config.torch_device, config.torch_dtype
        ps = config.page_size
        self.window = window
        self.num_pages = math.ceil(window / ps)
        self.kv = PagedKVStore(len(d.attention_layers), self.num_pages, ps, d.num_key_value_heads, d.head_dim,
                               dt, dev)
        self.state = StateImageStore(len(d.gdn_layers), 1, 0, state_planes(d, dt), dev)
        self.logit_rows = max(1, LOGIT_BYTES // (d.vocab_size * 4))
        self.logits = torch.empty(self.logit_rows, d.vocab_size, dtype=dt, device=dev)
        self.block_table = torch.arange(self.num_pages, dtype=torch.int32, device=dev).unsqueeze(0)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.state.nbytes + self.logits.numel() * self.logits.element_size()


class WindowScorer:
    """Runs CausalScoring windows with the family schedule over its own ScoringStaging."""

    def __init__(self, view: ModelView, leaves: LeafSet, config: ProgramConfig) -> None:
        self.config = config
        self.window = config.scoring_window or config.max_model_len
        self.staging = ScoringStaging(view, config, self.window)
        self.model = Qwen36Model(view, leaves, self.staging.kv, self.staging.state)
        self.lm_head = view.lm_head
        self.vocab_size = view.dims.vocab_size
        self.device = config.torch_device

    def _check(self, w: ScoringWindow) -> None:
        n = len(w.token_ids)
        if not (2 <= n <= self.window):
            raise InvariantError(f"scoring window of {n} tokens; the staging holds 2..{self.window}")
        if not (1 <= w.first_scored < n):
            raise InvariantError(f"scoring window of {n} tokens with first scored token {w.first_scored}")
        if not (0 <= w.top_k <= MAX_TOP_K):
            raise InvariantError(f"scoring top_k {w.top_k} outside 0..{MAX_TOP_K}")
        if any(not (0 <= t < self.vocab_size) for t in w.token_ids):
            raise InvariantError(f"scoring window holds a token id outside 0..{self.vocab_size - 1}")

    @torch.no_grad()
    def score(self, w: ScoringWindow) -> WindowScores:
        self._check(w)
        ids, n, first = w.token_ids, len(w.token_ids), w.first_scored
        st = self.staging
        st.state.zero_entry(0)                 # the empty State; KV positions are written before read
        dev = self.device
        entries = torch.zeros(1, dtype=torch.long, device=dev)
        lps: list[float] = []
        ranks: list[int] = []
        top: list[tuple[tuple[int, float], ...]] = []
        for s in range(0, n, FORWARD_CHUNK):
            e = min(s + FORWARD_CHUNK, n)
            fb = ForwardBatch(input_ids=torch.tensor(ids[s:e], dtype=torch.long, device=dev),
                              positions=torch.arange(s, e, dtype=torch.long, device=dev), seqlens=(e - s,),
                              starts=(s,), state_entries=entries, block_tables=st.block_table)
            hidden = self.model.forward(fb)                     # [e - s, H]
            # NOTE: position j predicts token j + 1; scored tokens first .. n-1 come from positions first-1 .. n-2.
            lo, hi = max(s, first - 1), min(e, n - 1)
            for a in range(lo, hi, st.logit_rows):
                b = min(a + st.logit_rows, hi)
                logits = st.logits[:b - a]
                torch.mm(hidden[a - s:b - s], self.lm_head.t(), out=logits)
                targets = torch.tensor(ids[a + 1:b + 1], dtype=torch.long, device=dev)
                res = logprobs_from_logits(logits, targets, w.top_k)
                lps += res.token_logprobs.tolist()
                ranks += res.token_ranks.tolist()
                if w.top_k:
                    top += [tuple(zip(i, v)) for i, v in zip(res.top_ids.tolist(), res.top_logprobs.tolist())]
                else:
                    top += [()] * (b - a)
        return WindowScores(tuple(lps), tuple(ranks), tuple(top))
