"""Program[Qwen3.6]: the only physical execution entry of one target package.

Owns the fixed resources created at start, the active sequences, the reservations, the
provisional state of every unconsumed PendingBatch and its commit/rollback.

    resources (created once, never resized)
      PagedKVStore      k, v [attention layers, num_pages, page_size, nkv, hd]   model dtype
      StateImageStore   conv      [gdn layers, num_slots + scratch, C, K-1]     model dtype
                        recurrent [gdn layers, num_slots + scratch, nv, dk, dv] fp32
                        entries [0, num_slots): StateImage slots of sequences
                        entries [num_slots, +num_scratch): provisional area (`_num_scratch`:
                        the caller's batches + the step-ahead's and a capture's entries)
      ResourceLedger    page pool (refcounts, reservations), slot pool, block tables
      PendingLedger     open PendingBatches and the scratch entries they hold

Sequence positions (one sequence; `tokens` = prompt + committed output tokens):

      0 .................. frontier ............ len(tokens) ...... reserved_tokens
      | committed in KV and  | known, not yet fed | free growth, covered by the
      | StateImage slot      | (the prompt suffix | reservation (pages drawn as
      |                      |  or the last token)| the frontier grows)

Model transactions. An intermediate prefill stage writes straight into the sequence's slot and
moves the frontier. The final prefill stage, decode and control never touch the committed slot:
step i of row r reads the previous state image (the slot, or the scratch entry of step i-1) and
writes scratch entry [r][i]; KV of produced positions is written beyond the frontier, where no
committed reader looks. `commit(accepted)` moves scratch entry [r][accepted-1]'s image into the slot
(StateImageStore.swap: a relabel, no copy) and
moves the frontier by the accepted tokens and stores the sampler's generator state after the
last accepted draw, so an unaccepted draw is never seen again. Abort copies nothing.

Semantics the Engine relies on:
  prefill(seq, n)       stages of any size; a non-final stage commits at once (pending None); the
                        final stage returns num_computed_tokens == num_prompt_tokens, effective
                        when its PREFILL batch (1 row, the first sampled token) commits.
  decode(seqs, k)       exact B = len(seqs) rows, k <= max_steps tokens per row; row input is the
                        row's last committed token that is not yet in the state.
  control(seq, tokens)  forced tokens (len <= max_steps), no sampler, no RNG advance.
  commit(b, accepted)   0 <= accepted[r] <= produced; 0 is a cancelled row (nothing committed).
Rounds of plain rows (greedy or drawn, without penalties, logit bias or log-probs) through the decode
graphs launch one more step of the same rows before they read their own tokens (`step_ahead.py`);
the next round adopts it only where it equals what that round would compute, so none of the
semantics above changes.
An exception inside a unit leaves no open batch; one inside a non-final prefill stage leaves the
sequence's slot undefined (the Engine fails as a whole on any execution error).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ninfer.program.ledger import Holding, ResourceLedger
from ninfer.program.stores import PagedKVStore, StateImageStore
from ninfer.program.transactions import PendingLedger, Provisional
from ninfer.ops.reference.attention import sdpa_rows
from ninfer.contract.scoring import ScoringWindow, WindowScores
from ninfer.contract.program import (
    BatchKind, CapacitySummary, InvariantError, PendingBatch, PendingRow, PrefillStep, Refusal, RefusalKind,
    ResourcePlan, ResourceResult, SequenceHandle, SequenceRequest, TokenLogprob)
from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.program import prefill_graphs
from ninfer.targets.qwen3_6.program.checkpoints import CheckpointOps
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.cuda_graphs import DecodeGraphs
from ninfer.targets.qwen3_6.program.leaves import LeafSet
from ninfer.targets.qwen3_6.program.model import ForwardBatch, Qwen36Model, state_planes
from ninfer.targets.qwen3_6.program.model_view import load_model_view
from ninfer.targets.qwen3_6.program.sampling import RowSampling, Sampler, prompt_token_logprobs
from ninfer.targets.qwen3_6.program.scoring import WindowScorer
from ninfer.targets.qwen3_6.program.step_ahead import Ahead, DeviceTokens


def _stream_seed(run_seed: int, index: int) -> int:
    """The seed of the index-th unseeded sequence of a run (splitmix64 of both, low 32 bits)."""
    m = (1 << 64) - 1
    z = (run_seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9 + 0x5EED) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return (z ^ (z >> 31)) & 0xFFFFFFFF


def _free_device_bytes(device: torch.device) -> tuple[int, int]:
    """`torch.cuda.mem_get_info` once the caching allocator has given its unused blocks back.

    A load leaves blocks cached, not free (a fused matrix's parts, model_view.fuse_rows; a checkpoint's
    staging), and the driver counts them as used. When the loader still fused after loading every
    tensor, the 27B's parts held ~21 GiB of an 80 GB card: `ninfer serve` saw 6.1 GiB free and sized
    0 KV pages (bench/NOTES.md, session 32)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)


def _pool_pages(dims: Qwen36Dims, config: ProgramConfig, num_scratch: int,
                mem_get_info: Any = None) -> int:
    """KV pages of the pool: `config.num_pages`, or on CUDA with `kv_memory_fraction` > 0 at most
    that share of the memory free once the weights are loaded, less the StateImage entries."""
    if config.kv_memory_fraction <= 0 or (mem_get_info is None and config.torch_device.type != "cuda"):
        return config.num_pages
    free = (mem_get_info or _free_device_bytes)(config.torch_device)[0]
    elem = torch.empty((), dtype=config.torch_dtype).element_size()
    page_bytes = 2 * len(dims.attention_layers) * config.page_size * dims.num_key_value_heads * dims.head_dim * elem
    entry_bytes = sum(math.prod(shape) * torch.empty((), dtype=dt).element_size()
                      for shape, dt in state_planes(dims, config.torch_dtype).values()) * len(dims.gdn_layers)
    entries = config.num_slots + num_scratch
    budget = int(free * config.kv_memory_fraction) - entries * entry_bytes
    pages = min(config.num_pages, max(0, budget) // page_bytes)
    if pages * config.page_size < config.max_model_len:
        raise ValueError(f"kv_memory_fraction {config.kv_memory_fraction} of {free / 2**30:.1f} GiB free leaves "
                         f"{pages} KV pages ({pages * config.page_size} tokens) after {entries} StateImage entries "
                         f"of {entry_bytes / 2**20:.1f} MiB ({entries * entry_bytes / 2**30:.1f} GiB), fewer than "
                         f"max_model_len {config.max_model_len}: raise the fraction or lower max_model_len / "
                         f"max_concurrency")
    return pages


def _graphs_may_run(config: ProgramConfig) -> bool:
    """Whether this Program may capture CUDA graphs (decode, prefill stages): CUDA, not eager, Generation."""
    return config.torch_device.type == "cuda" and not config.enforce_eager and config.purpose == "generation"


def _num_scratch(config: ProgramConfig) -> int:
    """Entries of the provisional area: the caller's open batches (`config.num_scratch`, by default any
    batch of max_batch rows x max_steps steps) and what the Program's own CUDA graphs hold beside them:
    the step-ahead's entry per row between rounds (step_ahead.py) and a prefill graph capture's one."""
    own = 0
    if _graphs_may_run(config):
        own = (config.max_batch if config.decode_step_ahead else 0) + int(prefill_graphs.MAX_TOKENS > 0)
    return (config.num_scratch or config.max_batch * config.max_steps) + own


@dataclass(eq=False)
class _Seq:
    handle: SequenceHandle
    request: SequenceRequest
    holding: Holding
    tokens: list[int]              # prompt + committed output tokens
    rng_state: torch.Tensor        # sampler generator state after the last committed sampled token
    frontier: int = 0              # tokens whose effect is in committed KV and state
    source: int | None = None      # the checkpoint it was materialized from (None: root)
    pub_target: int | None = None  # publication target: the frontier to keep in the publication slot
    pub_frontier: int | None = None  # the frontier whose state the publication slot holds

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def slot(self) -> int:
        return self.holding.slot


class Qwen36Program(CheckpointOps):
    """Implements `ninfer.contract.program.CheckpointProgram` for any package of the Qwen3.6 family."""

    def __init__(self, dims: Qwen36Dims, leaves: LeafSet, weights: Any, config: ProgramConfig) -> None:
        wd = getattr(weights, "dims", None)
        if wd is not None and wd != dims:
            raise ValueError("the artifact's dimension facts differ from this package's")
        self.dims = dims
        self.config = config
        dev, dt = config.torch_device, config.torch_dtype
        self.device = dev
        view = load_model_view(dims, weights, dev, dt)
        num_scratch = _num_scratch(config)
        num_pages = _pool_pages(dims, config, num_scratch)
        self._ledger = ResourceLedger(num_pages, config.page_size, config.num_slots, config.max_model_len)
        self._pending = PendingLedger(num_scratch)
        # NOTE: one page more than the ledger owns where prefill graphs may run: their padding's KV goes
        #       there (prefill_graphs.py); nothing reads it. Also on the CPU, where tests run the graphs'
        #       contract eagerly over it (test_prefill_graphs.py).
        spare = not config.enforce_eager and config.purpose == "generation" and prefill_graphs.MAX_TOKENS > 0
        self._spare_page = num_pages if spare else None
        self._kv = PagedKVStore(len(dims.attention_layers), num_pages + (self._spare_page is not None),
                                config.page_size, dims.num_key_value_heads, dims.head_dim, dt, dev)
        self._state = StateImageStore(len(dims.gdn_layers), config.num_slots, num_scratch,
                                      state_planes(dims, dt), dev)
        self.model = Qwen36Model(view, leaves, self._kv, self._state)
        # NOTE: CausalScoring windows run over their own temporary State/KV and lm_head staging
        # (scoring.py); a Generation Program allocates none of it.
        self.scoring = WindowScorer(view, leaves, config) if config.purpose == "causal_scoring" else None
        self._sampler = Sampler(dims.vocab_size, dev, config.sampleable_vocab_size)
        self._seqs: dict[int, _Seq] = {}
        self._seq_ids = itertools.count(1)
        self._plan_ids = itertools.count(1)
        # NOTE: unseeded sequences draw consecutive streams of the run seed, mixed (splitmix64) into
        # 32 bits because the CPU generator keeps only the low 32 bits of a seed.
        self._default_seeds = (_stream_seed(config.seed, i) for i in itertools.count())
        self._init_checkpoints()
        # NOTE: last, after every large allocation: the graphs point into the pools and weights.
        self.graphs: DecodeGraphs | None = None
        self.graphs_enabled = True   # a switch for benchmarks and tests; eager when False
        self.step_ahead_enabled = config.decode_step_ahead   # a switch for benchmarks and tests
        self._ahead: Ahead | None = None
        self.step_ahead_counts = {"launched": 0, "adopted": 0}   # for benchmarks and tests
        # NOTE: the prefill graphs are captured on first use of each bucket (prefill_graphs.py).
        self.prefill_graphs: prefill_graphs.PrefillGraphs | None = None
        self.prefill_graphs_enabled = True   # a switch for benchmarks and tests; eager when False
        if _graphs_may_run(config) and self.model.ops.name == "fast":
            if self._spare_page is not None:
                self.prefill_graphs = prefill_graphs.PrefillGraphs(
                    self.model, config.page_size, self._spare_page, dev, prefill_graphs.graph_tokens(dims),
                    config.max_model_len)
            self.graphs = DecodeGraphs(self.model, self._state, config.max_batch, config.max_model_len,
                                       config.page_size, dev)
            self.graphs.capture()

    # ------------------------------------------------------------------------------------------
    # Resources
    # ------------------------------------------------------------------------------------------
    @property
    def resource_revision(self) -> int:
        return self._ledger.revision

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    def warmup_prompt_lengths(self, stage_tokens: int, max_model_len: int) -> list[int]:
        """The prompt lengths whose first prefill compiles, captures or plans what a later request
        would otherwise wait for (serve warmup, `Engine.warm_up`): on the fast ops on CUDA,
        `warmup_lengths` for the chunk-GDN graph buckets, each within max_model_len - 2 (the caller's
        limit: EngineCore passes its own, already capped at this Program's). [] on the reference ops
        (nothing to compile or capture)."""
        if self.model.ops.name != "fast" or not self.model.view.embed_tokens.is_cuda:
            return []
        from ninfer.ops.triton import gated_delta
        pg = self.prefill_graphs
        whole = () if pg is None else tuple(b for b in prefill_graphs.BUCKETS if b <= pg.max_tokens)
        return warmup_lengths(stage_tokens, max_model_len, gated_delta.BUCKETS, gated_delta.GRAPH_MAX_TOKENS, whole)

    def warmup_attention_plans(self, stage_tokens: int, max_model_len: int, budget_s: float | None = None
                               ) -> tuple[int, int]:
        """Plan the cuDNN attention calls of prompts longer than one stage (serve warmup; run on the
        Engine's worker thread: PyTorch keeps the plans per thread): `warm_prefix_forms` over
        `prefix_plan_shapes` for prompts up to max_model_len - 1 tokens, shortest contexts first, starting
        no new shape after budget_s seconds (default PREFIX_PLAN_BUDGET_S). Returns (shapes run, shapes
        in all); (0, 0) on the reference ops or off CUDA (nothing to plan)."""
        if self.model.ops.name != "fast" or not self.model.view.embed_tokens.is_cuda:
            return 0, 0
        from ninfer.ops.reference import prefix_routing
        from ninfer.ops.triton import attention
        d = self.dims
        shapes = prefix_routing.prefix_plan_shapes(d.num_attention_heads, d.head_dim, stage_tokens,
                                                   max_model_len - 1)
        n = attention.warm_prefix_forms(shapes, d.num_attention_heads, d.num_key_value_heads, d.head_dim,
                                        self.config.torch_dtype, self.device,
                                        PREFIX_PLAN_BUDGET_S if budget_s is None else budget_s)
        return n, len(shapes)

    def capacity(self) -> CapacitySummary:
        p, s = self._ledger.pages, self._ledger.slots
        return CapacitySummary(p.total, p.num_available, s.total, s.num_free, self.config.page_size)

    @staticmethod
    def _growth(request: SequenceRequest) -> int:
        return len(request.prompt_token_ids) + request.max_output_tokens + request.lookahead

    def _validate_request(self, request: SequenceRequest) -> Refusal | None:
        if not request.prompt_token_ids:
            return Refusal(RefusalKind.INFEASIBLE, "empty prompt")
        if request.max_output_tokens < 1 or request.lookahead < 0:
            return Refusal(RefusalKind.INFEASIBLE,
                           f"max_output_tokens must be >= 1 and lookahead >= 0, got "
                           f"{request.max_output_tokens} and {request.lookahead}")
        bad = [t for t in request.prompt_token_ids if not (0 <= t < self.dims.vocab_size)]
        if bad:
            return Refusal(RefusalKind.INFEASIBLE, f"token id {bad[0]} outside the vocabulary 0..{self.dims.vocab_size - 1}")
        return None

    def plan_materialize(self, request: SequenceRequest, source: int | None = None, evictable: Sequence[int] = (),
                         host_bytes_free: int = 0) -> ResourcePlan | Refusal:
        """source: a checkpoint proving a strict prefix of the prompt (None: root). evictable:
        inactive checkpoints, least valuable first; the plan names those it must evict to fit
        (moving to host memory those that fit in `host_bytes_free`)."""
        why = self._validate_request(request)
        if why is not None:
            return why
        return self._plan_from(request, source, evictable, host_bytes_free)

    def start_materialize(self, plan: ResourcePlan) -> ResourceResult:
        self._require_fresh(plan)
        seq_id = next(self._seq_ids)
        holding, evicted, offloaded = self._start_from(plan, seq_id)
        handle = SequenceHandle(seq_id, self._ledger.revision)
        seed = plan.request.sampling.seed
        # NOTE: an unseeded sequence still gets its own stream, so rollback is exact for it too.
        rng = self._sampler.new_rng_state(seed if seed is not None else next(self._default_seeds))
        s = _Seq(handle, plan.request, holding, list(plan.request.prompt_token_ids), rng,
                 frontier=plan.num_reused_tokens, source=plan.source)
        self._seqs[seq_id] = s
        rp = plan.request.reconstruction_prefix
        if rp is not None and rp >= s.frontier:
            self._set_pub_target(s, rp)
            self._pub_target_reached(s, lambda T: holding.slot if T == s.frontier else None)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision, sequence=handle,
                              num_reused_tokens=plan.num_reused_tokens, pages_held=holding.pages_held,
                              slots_held=holding.num_slots, evicted=evicted, offloaded=offloaded)

    def prove_backfill(self, head: SequenceRequest, donors: Sequence[SequenceHandle],
                       borrower: SequenceRequest) -> bool:
        if self._validate_request(head) or self._validate_request(borrower):
            return False
        donor_ids = [self._seq(d).handle.seq_id for d in donors]
        return self._ledger.prove_backfill(self._growth(head), donor_ids, self._growth(borrower),
                                           head.publication, borrower.publication)

    def release(self, seq: SequenceHandle) -> ResourceResult:
        s = self._seq(seq)
        self._pending.require_idle(s.handle.seq_id, "release")
        self._discard_ahead(s.handle.seq_id)
        self._ledger.release(s.handle.seq_id)
        del self._seqs[s.handle.seq_id]
        return ResourceResult(ok=True, resource_revision=self._ledger.revision)

    def check_integrity(self) -> None:
        self._ledger.check()
        self._pending.check()
        self._check_checkpoints()
        for s in self._seqs.values():
            if self._ledger.holding(s.handle.seq_id) is not s.holding:
                raise InvariantError(f"sequence {s.handle.seq_id} lost its holding")
            if not (0 <= s.frontier <= len(s.tokens) <= s.holding.reserved_tokens):
                raise InvariantError(f"sequence {s.handle.seq_id}: frontier {s.frontier}, "
                                     f"{len(s.tokens)} tokens, reserved {s.holding.reserved_tokens}")
            if s.holding.table.capacity < s.frontier:
                raise InvariantError(f"sequence {s.handle.seq_id}: frontier beyond its mapped pages")
        a = self._ahead
        if a is not None and (not set(a.seq_ids) <= self._seqs.keys() or len(a.entries) != len(a.seq_ids)):
            raise InvariantError(f"step-ahead of rows {a.seq_ids} outlived its sequences or entries")
        if self._ledger.owner_ids != self._seqs.keys():
            raise InvariantError(f"the ledger holds resources for {sorted(self._ledger.owner_ids)}, "
                                 f"live sequences are {sorted(self._seqs)}")

    def _seq(self, handle: SequenceHandle) -> _Seq:
        s = self._seqs.get(handle.seq_id)
        if s is None or s.handle != handle:
            raise InvariantError(f"unknown or released sequence {handle}")
        return s

    # ------------------------------------------------------------------------------------------
    # Model execution
    # ------------------------------------------------------------------------------------------
    def prefill(self, seq: SequenceHandle, max_tokens: int) -> PrefillStep:
        return self.prefill_with_logits(seq, max_tokens, keep_logits=False)[0]

    def decode(self, seqs: Sequence[SequenceHandle], num_steps: int = 1) -> PendingBatch:
        return self.decode_with_logits(seqs, num_steps, keep_logits=False)[0]

    def control(self, seq: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        return self._multi_step([seq], len(tokens), forced=[list(tokens)], keep_logits=False)[0]

    def prefill_with_logits(self, seq: SequenceHandle, max_tokens: int, *, keep_logits: bool = True
                            ) -> tuple[PrefillStep, torch.Tensor | None]:
        """`prefill`, also returning the fp32 logits [n, V] of every position this stage computed
        (scoring and parity tests use them; nothing else changes)."""
        s = self._seq(seq)
        self._pending.require_idle(s.handle.seq_id, "prefill")
        self._discard_ahead(s.handle.seq_id)
        start, P = s.frontier, s.num_prompt
        if start >= P:
            raise InvariantError(f"prefill of sequence {s.handle.seq_id} whose prompt is already computed")
        if max_tokens < 1:
            raise InvariantError(f"prefill stage of {max_tokens} tokens")
        n = min(max_tokens, P - start)
        end = start + n
        final = end == P
        rec: Provisional | None = None
        if final:
            rec = self._pending.open(BatchKind.PREFILL, [s.handle.seq_id], [], [1])
        try:
            entry = self._state.scratch_entry(rec.scratch[0][0]) if rec else s.slot
            prompt_lp: tuple[TokenLogprob | None, ...] = ()
            # NOTE: a final stage of one token is one decode step of the row (KV at `start`, state read at
            #       the slot and written to the scratch entry): the decode graph of B=1 runs it when it
            #       applies. The context cache makes this the common case: prefill stops at P - 1 to
            #       capture, leaving one token (27B: ~14 ms in the graph vs ~54 ms eager on the H200).
            #       Prompt log-probs need the hidden states: eager.
            graphed = (self._graph_step([s], [[s.tokens[start]]], [start], [s.slot], [entry])
                       if final and n == 1 and s.request.prompt_logprobs is None else None)
            if graphed is None and not keep_logits:
                # NOTE: a short stage (over a prefix or not) replays a graph of the whole stage: such a stage
                #       is host bound (prefill_graphs.py).
                graphed = self._prefill_graph(s, start, end, entry, final)
                if graphed is not None and not final:
                    s.frontier = end
                    self._pub_target_reached(s, lambda T: s.slot if T == end else None)
                    return PrefillStep(end, None, prompt_lp), None
            if graphed is not None:
                logits = last = graphed.clone() if keep_logits else graphed
            else:
                if rec:
                    self._state.copy_entry(entry, s.slot)
                hidden = self._forward([s], [s.tokens[start:end]], [start], [entry])
                logits = self.model.logits(hidden) if keep_logits else None
                if s.request.prompt_logprobs is not None:
                    prompt_lp = prompt_token_logprobs(hidden, self.model.view.lm_head, s.tokens, start, end, P,
                                                      s.request.prompt_logprobs)
                if not final:
                    s.frontier = end
                    self._pub_target_reached(s, lambda T: s.slot if T == end else None)
                    return PrefillStep(end, None, prompt_lp), logits
                last = logits[-1:] if logits is not None else self.model.logits(hidden[-1:])
            toks, lps, rngs = self._sampler.sample(last, [self._row_sampling(s, [])])
            rec.batch.rows = (PendingRow(s.handle, (toks[0],), (lps[0],) if lps[0] is not None else None),)
            rec.data.update(end=end, rng=[[rngs[0]]])
            return PrefillStep(end, rec.batch, prompt_lp), logits
        except BaseException:
            if rec is not None:
                self._pending.take(rec.batch)
                self._pending.close(rec)
            raise

    def _prefill_graph(self, s: _Seq, start: int, end: int, entry: int, final: bool) -> torch.Tensor | None:
        """A stage of the prompt, tokens start..end-1 over the prefix before them (none at start 0), through
        the prefill graph of its bucket, with the stage's state in entry `entry` (the slot; a final stage's
        scratch entry, which gets the slot's image first, as on the eager path). Returns the last token's
        fp32 logits [1, V] for a final stage, the graph's hidden output otherwise (unread); None when no
        graph takes the stage (then the caller runs it eagerly). Prompt log-probs need every row's hidden
        state: eager."""
        pg = self.prefill_graphs
        n = end - start
        if (pg is None or not self.prefill_graphs_enabled or self.model.ops is not pg.ops
                or s.request.prompt_logprobs is not None or not pg.fits(n)):
            return None
        if not pg.captured(n) and not self._capture_prefill(pg, n, entry if final else None):
            return None
        s.holding.table.ensure(end)
        if final:
            self._state.copy_entry(entry, s.slot)
        hidden = pg.run(s.tokens[start:end], start, self._state.phys(entry), s.holding.table.pages)
        return self.model.logits(hidden) if final else hidden

    def _capture_prefill(self, pg: "prefill_graphs.PrefillGraphs", n: int, scratch: int | None) -> bool:
        """Capture the prefill graph of a stage of n tokens. Its warm-up run writes a state image nobody
        reads: `scratch`, a final stage's own scratch entry (it gets the slot's image after), or else a
        scratch entry held for the capture (False when none is free)."""
        if scratch is not None:
            return pg.capture(n, self._state.phys(scratch))
        if self._pending.num_free_scratch < 1:
            return False
        held = self._pending.hold(1)
        try:
            return pg.capture(n, self._state.phys(self._state.scratch_entry(held[0])))
        finally:
            self._pending.unhold(held)

    def decode_with_logits(self, seqs: Sequence[SequenceHandle], num_steps: int = 1, *, keep_logits: bool = True
                           ) -> tuple[PendingBatch, torch.Tensor | None]:
        """`decode`, also returning the fp32 logits [B, num_steps, V] each step sampled from."""
        return self._multi_step(seqs, num_steps, forced=None, keep_logits=keep_logits)

    def _row_sampling(self, s: _Seq, provisional: list[int], rng: torch.Tensor | None = None) -> RowSampling:
        return RowSampling(s.request.sampling, s.rng_state if rng is None else rng,
                           s.request.prompt_token_ids, s.tokens[s.num_prompt:] + provisional)

    def _multi_step(self, handles: Sequence[SequenceHandle], num_steps: int, forced: list[list[int]] | None,
                    keep_logits: bool) -> tuple[PendingBatch, torch.Tensor | None]:
        kind = BatchKind.CONTROL if forced is not None else BatchKind.DECODE
        B = len(handles)
        if not (1 <= B <= self.config.max_batch):
            raise InvariantError(f"{kind.value} batch of {B} rows; max_batch is {self.config.max_batch}")
        if not (1 <= num_steps <= self.config.max_steps):
            raise InvariantError(f"{kind.value} of {num_steps} steps; max_steps is {self.config.max_steps}")
        seqs = [self._seq(h) for h in handles]
        for s in seqs:
            if s.frontier != len(s.tokens) - 1 or s.frontier < s.num_prompt:
                raise InvariantError(f"sequence {s.handle.seq_id} is not decode-ready "
                                     f"(frontier {s.frontier}, {len(s.tokens)} tokens)")
            if s.frontier + num_steps > s.holding.reserved_tokens:
                raise InvariantError(f"sequence {s.handle.seq_id}: {num_steps} steps from frontier {s.frontier} "
                                     f"exceed its reservation of {s.holding.reserved_tokens} tokens")
        if forced is not None and any(not (0 <= t < self.dims.vocab_size) for t in forced[0]):
            raise InvariantError("forced control token outside the vocabulary")
        # NOTE: plain greedy rows (the common serving case) skip the sampler's tensor building: one argmax
        #       per step, RNG unchanged (what `sample` returns for them). Plain rows (greedy or drawn; no
        #       penalties, bias or log-probs) through the decode graphs are also pipelined: steps after the
        #       first take their ids from the previous step's tokens on the device, one host sync per round,
        #       and one more step is launched before that sync (step_ahead.py).
        greedy = forced is None and all(self._sampler.plain_greedy(s.request.sampling) for s in seqs)
        plain = forced is None and all(self._sampler.plain(s.request.sampling) for s in seqs)
        pipelined = plain and not keep_logits and self._graphs_fit(seqs, [s.frontier + num_steps for s in seqs])
        ahead = self._adoptable(seqs, kind, pipelined)
        try:
            rec = self._pending.open(kind, [s.handle.seq_id for s in seqs], [], [num_steps] * B,
                                     adopt=None if ahead is None else [[e] for e in ahead.entries])
        except BaseException:
            if ahead is not None:
                self._pending.unhold(ahead.entries)
            raise
        try:
            step_logits = []
            if pipelined:
                produced, rngs = self._pipelined_steps(seqs, rec, num_steps, ahead, greedy)
                lps: list[list[TokenLogprob | None]] = [[None] * num_steps for _ in seqs]
            else:
                produced = [[] for _ in seqs]
                lps, rngs = [[] for _ in seqs], [[] for _ in seqs]
                for i in range(num_steps):
                    dsts = [self._state.scratch_entry(rec.scratch[r][i]) for r in range(B)]
                    srcs = [s.slot if i == 0 else self._state.scratch_entry(rec.scratch[r][i - 1])
                            for r, s in enumerate(seqs)]
                    inputs = [[s.tokens[-1] if i == 0 else produced[r][i - 1]] for r, s in enumerate(seqs)]
                    positions = [s.frontier + i for s in seqs]
                    logits = self._graph_step(seqs, inputs, positions, srcs, dsts)
                    if logits is None:
                        for dst, src in zip(dsts, srcs):
                            self._state.copy_entry(dst, src)
                        hidden = self._forward(seqs, inputs, positions, dsts)
                        logits = self.model.logits(hidden)
                    elif keep_logits:
                        logits = logits.clone()       # the graph's output buffer is overwritten by the next replay
                    if keep_logits:
                        step_logits.append(logits)
                    if greedy:
                        toks = self._sampler.greedy_tokens(logits)
                        step_lps = [None] * B
                        step_rngs = [rngs[r][-1] if i else s.rng_state for r, s in enumerate(seqs)]
                    elif forced is None:
                        toks, step_lps, step_rngs = self._sampler.sample(
                            logits, [self._row_sampling(s, produced[r], rngs[r][-1] if i else None)
                                     for r, s in enumerate(seqs)])
                    else:
                        toks = [forced[0][i]]
                        step_lps = self._sampler.logprobs_of(logits, toks,
                                                             [s.request.sampling.logprobs for s in seqs])
                        step_rngs = [None] * B
                    for r in range(B):
                        produced[r].append(toks[r])
                        lps[r].append(step_lps[r])
                        rngs[r].append(step_rngs[r])
            rec.batch.rows = tuple(
                PendingRow(s.handle, tuple(produced[r]),
                           tuple(lps[r]) if s.request.sampling.logprobs is not None else None)
                for r, s in enumerate(seqs))
            rec.data.update(rng=rngs)
            out_logits = torch.stack(step_logits, dim=1) if keep_logits else None
            return rec.batch, out_logits
        except BaseException:
            self._pending.take(rec.batch)
            self._pending.close(rec)
            raise

    # ---- plain rounds through the decode graphs (step_ahead.py) ---------------------------------
    def _graphs_fit(self, seqs: list[_Seq], ends: list[int]) -> bool:
        """Whether the rows' steps up to position ends[r] - 1 replay a decode graph (maps their pages)."""
        g = self.graphs
        if g is None or not self.graphs_enabled or self.model.ops is not g.ops:
            return False
        for s, e in zip(seqs, ends):
            s.holding.table.ensure(e)
        return g.fits(len(seqs), [s.holding.table.pages for s in seqs])

    def _draw(self, seqs: list[_Seq], logits: torch.Tensor, st, rng: list) -> tuple[DeviceTokens, list]:
        """One pipelined step's tokens (left on the device) and the rows' rng states after it."""
        if st is None:                       # every row greedy: argmax, rng unchanged
            return DeviceTokens.of(self._sampler.greedy_ids(logits)), rng
        ids, new = self._sampler.sample_ids(logits, st, [s.request.sampling for s in seqs], rng)
        return DeviceTokens.of(ids), new

    def _pipelined_steps(self, seqs: list[_Seq], rec: Provisional, num_steps: int, ahead: Ahead | None,
                         greedy: bool) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]:
        """The round's steps on the graphs, each fed by the previous step's tokens on the device (the first
        by the rows' last tokens, or adopted from `ahead`); then the step-ahead; then one wait for the ids.
        Returns the tokens and the rng state after each step, per row."""
        B = len(seqs)
        if ahead is not None:
            st = ahead.sampling
        else:
            st = None if greedy else self._sampler.plain_tensors([s.request.sampling for s in seqs])
        toks: list[DeviceTokens] = []
        rng = [s.rng_state for s in seqs]
        steps_rng = []
        for i in range(num_steps):
            if i == 0 and ahead is not None:
                toks.append(ahead.tokens)
                rng = ahead.rng_out
                steps_rng.append(rng)
                continue
            dsts = [self._state.scratch_entry(rec.scratch[r][i]) for r in range(B)]
            srcs = [s.slot if i == 0 else self._state.scratch_entry(rec.scratch[r][i - 1])
                    for r, s in enumerate(seqs)]
            positions = [s.frontier + i for s in seqs]
            logits = (self._replay(seqs, [s.tokens[-1] for s in seqs], positions, srcs, dsts) if i == 0
                      else self._replay(seqs, None, positions, srcs, dsts, fed=toks[-1].dev))
            t, rng = self._draw(seqs, logits, st, rng)
            toks.append(t)
            steps_rng.append(rng)
        self._launch_ahead(seqs, rec, num_steps, toks[-1], rng, st)
        steps = [t.tolist() for t in toks]
        return ([[steps[i][r] for i in range(num_steps)] for r in range(B)],
                [[steps_rng[i][r] for i in range(num_steps)] for r in range(B)])

    def _launch_ahead(self, seqs: list[_Seq], rec: Provisional, num_steps: int, last: DeviceTokens,
                      rng: list, st) -> None:
        """Launch the step after this round's last (fed by `last`, drawing from the rows' rng states `rng`
        after it), when the next round is likely to be these rows again: every live sequence is in this
        round (no other one about to join), and every row may produce another token after it (budget and
        reservation)."""
        B = len(seqs)
        if not self.step_ahead_enabled or len(self._seqs) != B or self._pending.num_free_scratch < B:
            return
        for s in seqs:
            if (len(s.tokens) - s.num_prompt + num_steps >= s.request.max_output_tokens
                    or s.frontier + num_steps + 1 > s.holding.reserved_tokens):
                return
        if not self._graphs_fit(seqs, [s.frontier + num_steps + 1 for s in seqs]):
            return
        entries = self._pending.hold(B)
        try:
            srcs = [self._state.scratch_entry(rec.scratch[r][num_steps - 1]) for r in range(B)]
            dsts = [self._state.scratch_entry(e) for e in entries]
            logits = self._replay(seqs, None, [s.frontier + num_steps for s in seqs], srcs, dsts, fed=last.dev)
            tokens, rng_out = self._draw(seqs, logits, st, rng)
        except BaseException:
            self._pending.unhold(entries)
            raise
        self._ahead = Ahead(tuple(s.handle.seq_id for s in seqs), tuple(s.frontier + num_steps for s in seqs),
                            entries, tokens, rec.batch.batch_id, tuple(rng), rng_out, st)
        self.step_ahead_counts["launched"] += 1

    def _adoptable(self, seqs: list[_Seq], kind: BatchKind, pipelined: bool) -> Ahead | None:
        """The pending step-ahead when this round is exactly its rows' next step (else it is discarded)."""
        a, self._ahead = self._ahead, None
        if a is None:
            return None
        if (kind is BatchKind.DECODE and pipelined and a.confirmed
                and a.seq_ids == tuple(s.handle.seq_id for s in seqs)
                and all(s.frontier == f == len(s.tokens) - 1 for s, f in zip(seqs, a.frontier))
                and all(s.rng_state is r for s, r in zip(seqs, a.rng_in))):
            self.step_ahead_counts["adopted"] += 1
            return a
        self._pending.unhold(a.entries)
        return None

    def _discard_ahead(self, *seq_ids: int) -> None:
        """Drop the step-ahead if any of `seq_ids` is one of its rows."""
        a = self._ahead
        if a is not None and set(seq_ids) & set(a.seq_ids):
            self._ahead = None
            self._pending.unhold(a.entries)

    def _graph_step(self, seqs: list[_Seq], inputs: list[list[int]], positions: list[int], srcs: list[int],
                    dsts: list[int]) -> torch.Tensor | None:
        """One token per row through the captured graph of exact B (state copy src -> dst, forward,
        lm_head); None when graphs are off or do not apply (then the caller runs eagerly)."""
        if not self._graphs_fit(seqs, [p + 1 for p in positions]):
            return None
        return self._replay(seqs, [t[0] for t in inputs], positions, srcs, dsts)

    def _replay(self, seqs: list[_Seq], input_ids: list[int] | None, positions: list[int], srcs: list[int],
                dsts: list[int], fed: torch.Tensor | None = None) -> torch.Tensor:
        """`_graph_step` where `_graphs_fit` has already said yes for these positions; fed: the rows'
        input ids on the device instead of `input_ids`. Entry ids go to the graph as physical images."""
        ph = self._state.phys
        return self.graphs.run(input_ids, positions, [ph(e) for e in srcs], [ph(e) for e in dsts],
                               [s.holding.table.pages for s in seqs], fed=fed)

    def _forward(self, seqs: list[_Seq], inputs: list[list[int]], starts: list[int], entries: list[int]
                 ) -> torch.Tensor:
        """Run the model over one packed batch; rows write KV at [start, start + len) of their pages."""
        for s, toks, st in zip(seqs, inputs, starts):
            s.holding.table.ensure(st + len(toks))
        width = max(len(s.holding.table.pages) for s in seqs)
        dev = self.device
        fb = ForwardBatch(
            input_ids=torch.tensor([t for row in inputs for t in row], dtype=torch.long, device=dev),
            positions=torch.cat([torch.arange(st, st + len(toks), dtype=torch.long)
                                 for toks, st in zip(inputs, starts)]).to(dev),
            seqlens=tuple(len(t) for t in inputs),
            starts=tuple(starts),
            state_entries=torch.tensor([self._state.phys(e) for e in entries], dtype=torch.long, device=dev),
            block_tables=torch.stack([s.holding.table.as_tensor(width) for s in seqs]).to(dev))
        return self.model.forward(fb)

    # ------------------------------------------------------------------------------------------
    # CausalScoring (contract: ninfer.contract.scoring; only for purpose "causal_scoring")
    # ------------------------------------------------------------------------------------------
    @property
    def scoring_window(self) -> int:
        return self.scoring.window if self.scoring is not None else 0

    def score_window(self, window: ScoringWindow) -> WindowScores:
        if self.scoring is None:
            raise InvariantError("score_window on a Generation Program (it has no scoring staging)")
        return self.scoring.score(window)

    # ------------------------------------------------------------------------------------------
    # Consuming a PendingBatch
    # ------------------------------------------------------------------------------------------
    def commit(self, batch: PendingBatch, accepted: Sequence[int],
               boundaries: Sequence[int | None] | None = None) -> None:
        """boundaries[r]: the Frontend's reconstruction boundary inside row r's accepted span."""
        rec = self._pending.get(batch)
        accepted = list(accepted)
        if len(accepted) != batch.size:
            raise InvariantError(f"commit of batch {batch.batch_id}: {len(accepted)} decisions for {batch.size} rows")
        for row, a in zip(batch.rows, accepted):
            if not (0 <= a <= row.produced_tokens):
                raise InvariantError(f"commit of batch {batch.batch_id}: accepted {a} of {row.produced_tokens} "
                                     f"produced tokens")
        ahead = self._ahead
        if (ahead is not None and batch.batch_id == ahead.source
                and all(a == row.produced_tokens for row, a in zip(batch.rows, accepted))):
            ahead.confirmed = True
        else:                                 # a partial commit of its source, or one of its rows elsewhere
            self._discard_ahead(*rec.seq_ids)
        self._pending.take(batch)
        try:
            for r, (row, a) in enumerate(zip(batch.rows, accepted)):
                if a == 0:
                    continue
                s = self._seq(row.sequence)
                f0 = s.frontier
                s.tokens.extend(row.tokens[:a])
                if batch.kind is BatchKind.PREFILL:
                    s.frontier = rec.data["end"]
                else:
                    s.frontier += a
                if batch.kind is not BatchKind.CONTROL:
                    s.rng_state = rec.data["rng"][r][a - 1]
                self._note_commit(s, rec, r, a, f0, batch.kind is BatchKind.PREFILL,
                                  boundaries[r] if boundaries is not None else None)
                # NOTE: last (the publication copy above reads the scratch image): the slot takes the image
                #       of the last accepted step by a swap; the scratch entry, freed below, gets the old one.
                self._state.swap(s.slot, self._state.scratch_entry(rec.scratch[r][a - 1]))
        finally:
            self._pending.close(rec)

    def abort_pending(self, batch: PendingBatch) -> None:
        rec = self._pending.take(batch)
        self._discard_ahead(*rec.seq_ids)      # the source's rows are the step-ahead's
        self._pending.close(rec)


# NOTE: why these lengths (bench/first_use.py, bench/NOTES.md session 17): Triton compiles a kernel
#       again for each specialisation of its integer arguments (== 1, divisible by 16), and the prefill
#       kernels take token and pair counts; so a warmup of divisible lengths only (the graph buckets) left
#       a 1023-token stage 476 ms of compiles and a 2999-token one 593 ms on a fresh 35B-A3B server, and
#       a 5-token one 865 ms (the small-row kernels). cuDNN's SDPA plans are per padded length
#       (`sdpa_rows`): one 63 ms first call each.
WARMUP_SMALL = (2, 5, 9, 12)       # odd and even row counts of the GEMV (<= 8 rows) and just past it
# NOTE: the serve warmup's time for the cuDNN plans of prompts longer than one stage
#       (`Qwen36Program.warmup_attention_plans`); shortest contexts first, so a long max_model_len plans
#       what fits and leaves the longest contexts' shapes to their first use (bench/NOTES.md session 29).
PREFIX_PLAN_BUDGET_S = 20.0


def warmup_lengths(stage_tokens: int, max_model_len: int, buckets, graph_max_tokens: int,
                   stage_buckets=()) -> list[int]:
    """`Program.warmup_prompt_lengths` on the fast ops, every one at most the stage size and
    max_model_len - 2 (prompt + the warmup's 2 output tokens): WARMUP_SMALL; each graphed chunk-GDN
    length (buckets up to graph_max_tokens; their first capture, compile and autotuning); each
    prefill-graph bucket (stage_buckets: the whole-stage graphs' captures, prefill_graphs.py); one less
    than each padded attention length (`ninfer.ops.reference.attention.sdpa_rows`: its plan, and odd token
    counts); the full stage and one less. A warmup request runs with the context cache off, so its
    prompt is one prefill stage of exactly its length."""
    stage = min(stage_tokens, max_model_len - 2)
    if stage < 1:
        return []
    out = ({n for n in WARMUP_SMALL if n <= stage} | {b for b in buckets if b <= min(graph_max_tokens, stage)}
           | {b for b in stage_buckets if b <= stage})
    # NOTE: past the prefill graphs the padded lengths themselves too: the eager stages' even (divisible by
    #       16) specialisations, which the graph buckets no longer compile eagerly (a 4001-token prompt's
    #       first use was 2.0 s without them, bench/NOTES.md session 18).
    graphed = max(stage_buckets, default=0)
    r = sdpa_rows(1)
    while r <= stage:
        out.add(r - 1)
        if r > graphed and stage_buckets:
            out.add(r)
        r = sdpa_rows(r + 1)
    out |= {stage, stage - 1} - {0}
    return sorted(out)
