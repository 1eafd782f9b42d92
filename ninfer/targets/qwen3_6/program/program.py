"""Program[Qwen3.6]: the only physical execution entry of one target package.

Owns the fixed resources created at start, the active sequences, the reservations, the
provisional state of every unconsumed PendingBatch and its commit/rollback.

    resources (created once, never resized; sizes: sizing.py)
      PagedKVStore      k, v [attention layers, num_pages, page_size, nkv, hd]   model dtype
      StateImageStore   conv      [gdn layers, num_slots + scratch, C, K-1]     model dtype
                        recurrent [gdn layers, num_slots + scratch, nv, dk, dv] fp32
                        entries [0, num_slots): StateImage slots of sequences
                        entries [num_slots, +num_scratch): provisional area (`sizing.num_scratch`:
                        the caller's batches + the step-ahead's and a capture's entries)
      ResourceLedger    page pool (refcounts, reservations), slot pool, block tables
      PendingLedger     open PendingBatches and the scratch entries they hold

Sequence positions (one sequence; `tokens` = prompt + committed output tokens; sequences.py):

      0 .................. frontier ............ len(tokens) ...... reserved_tokens
      | committed in KV and  | known, not yet fed | free growth, covered by the
      | StateImage slot      | (the prompt suffix | reservation (pages drawn as
      |                      |  or the last token)| the frontier grows)

Model transactions. An intermediate prefill stage writes straight into the sequence's slot and
moves the frontier. The final prefill stage, decode and control never touch the committed slot:
step i of row r reads the previous state image (the slot, or the scratch entry of step i-1) and
writes scratch entry [r][i]; KV of produced positions is written beyond the frontier, where no
committed reader looks. `commit(accepted)` moves scratch entry [r][accepted-1]'s image into the slot
(StateImageStore.swap: a relabel, no copy), moves the frontier by the accepted tokens and stores the
sampler's generator state after the last accepted draw, so an unaccepted draw is never seen again.
Abort copies nothing.

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

Where each concern lives. Qwen36Program builds the state below and mixes in one class per concern;
the concerns that own state of their own are separate objects:

    Qwen36Program (this file)    construction, warmup, scoring entry
      ResourceOps    resources.py     capacity, plan/start_materialize, prove_backfill, release, integrity
      CheckpointOps  checkpoints.py   capture, publication slot, retain, offload, delete
      PrefillOps     prefill.py       prefill stages, eager or through a prefill graph
      DecodeOps      decode.py        decode/control units, the eager forward
      GraphStepOps   graph_steps.py   steps on the decode graphs, pipelined plain rounds
      CommitOps      commit.py        commit / abort_pending of a PendingBatch
    owned objects
      _seqs          SequenceTable (sequences.py)      live sequences, ids, default seeds
      step_ahead     StepAhead (step_ahead.py)          the launched, not yet adopted step
      graphs         DecodeGraphs (cuda_graphs.py)      one decode graph per batch size
      prefill_graphs PrefillGraphs (prefill_graphs.py)  whole-stage prefill graphs
      scoring        WindowScorer (scoring.py)          CausalScoring staging (causal_scoring only)
      _sampler       Sampler (sampling.py)
      _token_masks   TokenMasks (constraints.py)            grammar-constrained rows' masks on the host
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

from ninfer.contract.program import InvariantError
from ninfer.contract.scoring import ScoringWindow, WindowScores
from ninfer.program.ledger import ResourceLedger
from ninfer.program.stores import PagedKVStore, StateImageStore
from ninfer.program.transactions import PendingLedger
from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.patch_rows import PatchRows
from ninfer.targets.qwen3_6.program import prefill_graphs, sizing, warmup
from ninfer.targets.qwen3_6.program.checkpoints import CheckpointOps
from ninfer.targets.qwen3_6.program.commit import CommitOps
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.constraints import TokenMasks
from ninfer.targets.qwen3_6.program.cuda_graphs import DecodeGraphs
from ninfer.targets.qwen3_6.program.decode import DecodeOps
from ninfer.targets.qwen3_6.program.graph_steps import GraphStepOps
from ninfer.targets.qwen3_6.program.leaves import LeafSet
from ninfer.targets.qwen3_6.program.media import MediaOps
from ninfer.targets.qwen3_6.program.model import Qwen36Model, state_planes
from ninfer.targets.qwen3_6.program.model_view import load_model_view
from ninfer.targets.qwen3_6.program.prefill import PrefillOps
from ninfer.targets.qwen3_6.program.resources import ResourceOps
from ninfer.targets.qwen3_6.program.sampling import Sampler
from ninfer.targets.qwen3_6.program.scoring import WindowScorer
from ninfer.targets.qwen3_6.program.sequences import SequenceTable
from ninfer.targets.qwen3_6.program.spec_graphs import SpecGraphs
from ninfer.targets.qwen3_6.program.speculate import Drafter, MtpDrafter, SpecDecodeOps
from ninfer.targets.qwen3_6.program.step_ahead import StepAhead
from ninfer.targets.qwen3_6.program.vision import VisionTower, load_vision_view, patch_rows_tensor


def _tower_encoder(dims: Qwen36Dims, weights: Any, config: ProgramConfig) -> "TowerEncoder | None":
    has = getattr(weights, "has_group", None)
    present = has("vision") if callable(has) else any(str(n).startswith("visual.") for n in weights)
    if dims.vision is None or not present:
        return None
    dev, dt = config.torch_device, config.torch_dtype
    return TowerEncoder(VisionTower(load_vision_view(dims, weights, dev, dt), dims, dev, dt))


class TowerEncoder:
    """The Program's `vision` (media.py): one media input's rows from the vision tower, on the device."""

    def __init__(self, tower: Any) -> None:
        self.tower = tower

    def encode(self, m: Any) -> torch.Tensor:
        pv = m.pixel_values
        if isinstance(pv, PatchRows):            # the Frontend's uint8 values: looked up on the device
            pv = patch_rows_tensor(pv, self.tower.device, self.tower.dtype)
        else:
            pv = torch.as_tensor(pv, dtype=torch.float32).to(self.tower.device)
        rows = self.tower.forward(pv, [tuple(m.grid_thw)])
        if rows.shape[0] != m.length:
            raise InvariantError(f"media at {m.offset}: the tower gave {rows.shape[0]} rows for {m.length} "
                                 f"placeholder tokens (grid {tuple(m.grid_thw)})")
        return rows


def _require_mtp(dims: Qwen36Dims, weights: Any) -> None:
    """Refuse MTP speculation, with a message that says why, for weights without the MTP layer."""
    has = getattr(weights, "has_group", None)
    present = has("mtp") if callable(has) else "mtp.fc.weight" in weights
    if not dims.mtp_num_hidden_layers or not present:
        raise ValueError("speculative method 'mtp' needs the checkpoint's MTP layer (the mtp.* tensors), and "
                         "these weights have none: convert a checkpoint that ships them, or start without "
                         "speculation")


class Qwen36Program(ResourceOps, CheckpointOps, PrefillOps, DecodeOps, SpecDecodeOps, MediaOps, GraphStepOps,
                    CommitOps):
    """Implements `ninfer.contract.program.CheckpointProgram` for any package of the Qwen3.6 family."""

    def __init__(self, dims: Qwen36Dims, leaves: LeafSet, weights: Any, config: ProgramConfig) -> None:
        wd = getattr(weights, "dims", None)
        if wd is not None and wd != dims:
            raise ValueError("the artifact's dimension facts differ from this package's")
        self.dims = dims
        self.config = config
        dev, dt = config.torch_device, config.torch_dtype
        self.device = dev
        spec = config.speculative_method == "mtp"
        if spec:
            _require_mtp(dims, weights)
        view = load_model_view(dims, weights, dev, dt, mtp=spec)
        # NOTE: the vision tower, when the artifact has one (media.py); loaded before the pools are sized.
        self.vision = _tower_encoder(dims, weights, config) if config.purpose == "generation" else None
        num_scratch = sizing.num_scratch(config)
        # NOTE: the vision tower's workspace for the largest admitted media is set aside first (media.py).
        num_pages = sizing.pool_pages(dims, config, num_scratch, workspace_bytes=self.media_workspace_bytes())
        if sizing.fitted_max_model_len(config, num_pages) != config.max_model_len:
            config = self.config = dataclasses.replace(config, max_model_len=sizing.fitted_max_model_len(config,
                                                                                                      num_pages))
        self._ledger = ResourceLedger(num_pages, config.page_size, config.num_slots, config.max_model_len)
        self._pending = PendingLedger(num_scratch)
        # NOTE: one page more than the ledger owns where prefill graphs may run: their padding's KV goes
        #       there (prefill_graphs.py); nothing reads it. Also on the CPU, where tests run the graphs'
        #       contract eagerly over it (test_prefill_graphs.py).
        spare = not config.enforce_eager and config.purpose == "generation" and prefill_graphs.MAX_TOKENS > 0
        self._spare_page = num_pages if spare else None
        self._kv = PagedKVStore(sizing.kv_layers(dims, config), num_pages + (self._spare_page is not None),
                                config.page_size, dims.num_key_value_heads, dims.head_dim, dt, dev)
        self._state = StateImageStore(len(dims.gdn_layers), config.num_slots, num_scratch,
                                      state_planes(dims, dt, mtp=spec), dev)
        self.model = Qwen36Model(view, leaves, self._kv, self._state)
        # NOTE: CausalScoring windows run over their own temporary State/KV and lm_head staging
        # (scoring.py); a Generation Program allocates none of it.
        self.scoring = WindowScorer(view, leaves, config) if config.purpose == "causal_scoring" else None
        self._sampler = Sampler(dims.vocab_size, dev, config.sampleable_vocab_size)
        # NOTE: host staging of grammar-constrained rows' token masks (constraints.py): a speculative round's
        #       K + 1 per row at most.
        self._token_masks = TokenMasks(dims.vocab_size, dev,
                                       config.max_batch * (1 + (config.num_speculative_tokens if spec else 0)))
        self._seqs = SequenceTable(config.seed)
        self._plan_ids = itertools.count(1)
        self._init_checkpoints()
        # NOTE: speculative rounds end where the host's acceptance says; no step is launched ahead of them.
        self.step_ahead = StepAhead(self._pending, config.decode_step_ahead and not spec)
        sampleable = self._sampler.sampleable
        draft_vocab = min(config.draft_vocab_size or sampleable, sampleable)
        self.drafter: Drafter | None = MtpDrafter(config.num_speculative_tokens, draft_vocab) if spec else None
        self.force_accept_len = config.force_accept_len   # a switch for benchmarks (ProgramConfig's meaning)
        # NOTE: last, after every large allocation: the graphs point into the pools and weights.
        self.graphs: DecodeGraphs | None = None
        self.spec_graphs: SpecGraphs | None = None     # the speculative rounds' (with the MTP layer)
        self.graphs_enabled = True   # a switch for benchmarks and tests; eager when False
        # NOTE: the prefill graphs are captured on first use of each bucket (prefill_graphs.py).
        self.prefill_graphs: prefill_graphs.PrefillGraphs | None = None
        self.prefill_graphs_enabled = True   # a switch for benchmarks and tests; eager when False
        if sizing.graphs_may_run(config) and self.model.ops.name == "fast":
            if self._spare_page is not None:
                self.prefill_graphs = prefill_graphs.PrefillGraphs(
                    self.model, config.page_size, self._spare_page, dev, prefill_graphs.graph_tokens(dims),
                    config.max_model_len)
            if spec:
                self.spec_graphs = SpecGraphs(self.model, self._state, config.num_speculative_tokens,
                                              self._sampler.sampleable, draft_vocab, config.max_batch,
                                              config.max_model_len, config.page_size, dev)
                self.spec_graphs.capture()
            # NOTE: with speculation too: a prompt's last token (after the context cache's capture point) and
            #       control tokens are single steps.
            self.graphs = DecodeGraphs(self.model, self._state, config.max_batch, config.max_model_len,
                                       config.page_size, dev)
            self.graphs.capture()

    # ---- switches and counters of the step-ahead (benchmarks and tests) -----------------------
    @property
    def step_ahead_enabled(self) -> bool:
        return self.step_ahead.enabled

    @step_ahead_enabled.setter
    def step_ahead_enabled(self, on: bool) -> None:
        self.step_ahead.enabled = on

    @property
    def step_ahead_counts(self) -> dict[str, int]:
        return self.step_ahead.counts

    # ---- warmup (warmup.py) --------------------------------------------------------------------
    def _fast_on_cuda(self) -> bool:
        return self.model.ops.name == "fast" and self.model.view.embed_tokens.is_cuda

    def warmup_prompt_lengths(self, stage_tokens: int, max_model_len: int) -> list[int]:
        """The prompt lengths whose first prefill compiles, captures or plans what a later request
        would otherwise wait for (serve warmup, `Engine.warm_up`): on the fast ops on CUDA,
        `warmup.warmup_lengths` for the chunk-GDN graph buckets, each within max_model_len - 2 (the
        caller's limit: EngineCore passes its own, already capped at this Program's). [] on the reference
        ops (nothing to compile or capture)."""
        if not self._fast_on_cuda():
            return []
        from ninfer.ops.triton import gated_delta
        pg = self.prefill_graphs
        whole = () if pg is None else tuple(b for b in prefill_graphs.BUCKETS if b <= pg.max_tokens)
        return warmup.warmup_lengths(stage_tokens, max_model_len, gated_delta.BUCKETS,
                                     gated_delta.GRAPH_MAX_TOKENS, whole)

    def warmup_attention_plans(self, stage_tokens: int, max_model_len: int, budget_s: float | None = None
                               ) -> tuple[int, int]:
        """Plan the cuDNN attention calls of prompts longer than one stage (serve warmup; run on the
        Engine's worker thread: PyTorch keeps the plans per thread), `warmup.plan_attention`, with
        budget_s seconds (default `warmup.PREFIX_PLAN_BUDGET_S`). Returns (shapes run, shapes in all);
        (0, 0) on the reference ops or off CUDA (nothing to plan)."""
        if not self._fast_on_cuda():
            return 0, 0
        return warmup.plan_attention(self.dims, self.config.torch_dtype, self.device, stage_tokens, max_model_len,
                                     warmup.PREFIX_PLAN_BUDGET_S if budget_s is None else budget_s)

    # ---- CausalScoring (contract: ninfer.contract.scoring; only for purpose "causal_scoring") ---
    @property
    def scoring_window(self) -> int:
        return self.scoring.window if self.scoring is not None else 0

    def score_window(self, window: ScoringWindow) -> WindowScores:
        if self.scoring is None:
            raise InvariantError("score_window on a Generation Program (it has no scoring staging)")
        return self.scoring.score(window)
