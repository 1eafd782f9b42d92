"""Decode and control of the Qwen3.6 Program: multi-step units over B rows, and the eager forward.

    unit of B rows x k steps (k <= max_steps); row r at frontier f, its last token t not yet in the state
      step 0       reads the slot, feeds t at position f, writes scratch entry [r][0]
      step i > 0   reads scratch entry [r][i-1], feeds step i-1's token, writes scratch entry [r][i]
      KV           positions f .. f+k-1, beyond the frontier: no committed reader looks there

The unit's batch stays open until the Engine commits or aborts it (commit.py). A decode step samples
(or takes the argmax of plain greedy rows); a control step takes its forced token and samples nothing.
Each step replays the decode graph of exact B when one applies (graph_steps.py), else runs eagerly;
plain rows through the graphs are pipelined (graph_steps.py, step_ahead.py). A unit with a grammar-
constrained row is not pipelined (each step's masks come from the tokens of the step before, constraints.py),
unless it is one step and every such row is still inside its reasoning, where any token is allowed; such a
masked round launches a forward-only step-ahead once it has its tokens, and the next one adopts it.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ninfer.contract.program import (BatchKind, InvariantError, PendingBatch, PendingRow, SequenceHandle,
                                     TokenLogprob)
from ninfer.ops.opset import apply_token_bitmask_
from ninfer.program.transactions import Provisional
from ninfer.targets.qwen3_6.program.constraints import advance_row, rollback_rows
from ninfer.targets.qwen3_6.program.model import ForwardBatch
from ninfer.targets.qwen3_6.program.sampling import RowSampling
from ninfer.targets.qwen3_6.program.sequences import LiveSeq
from ninfer.targets.qwen3_6.program.step_ahead import Ahead


class DecodeOps:
    """Mixed into Qwen36Program: `decode`, `control` and the eager forward every unit shares. Uses its
    stores, `_pending`, `model`, `_sampler`, `step_ahead` and GraphStepOps."""

    def decode(self, seqs: Sequence[SequenceHandle], num_steps: int = 1) -> PendingBatch:
        """With a speculative method, one round per row (speculate.py) whatever num_steps says: each row
        produces 1..K+1 tokens."""
        if self.drafter is not None:
            return self._spec_round(seqs)
        return self.decode_with_logits(seqs, num_steps, keep_logits=False)[0]

    def control(self, seq: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        return self._multi_step([seq], len(tokens), forced=[list(tokens)], keep_logits=False)[0]

    def decode_with_logits(self, seqs: Sequence[SequenceHandle], num_steps: int = 1, *, keep_logits: bool = True
                           ) -> tuple[PendingBatch, torch.Tensor | None]:
        """`decode`, also returning the fp32 logits [B, num_steps, V] each step sampled from."""
        return self._multi_step(seqs, num_steps, forced=None, keep_logits=keep_logits)

    def _row_sampling(self, s: LiveSeq, provisional: list[int], rng: torch.Tensor | None = None) -> RowSampling:
        return RowSampling(s.request.sampling, s.rng_state if rng is None else rng,
                           s.request.prompt_token_ids, s.tokens[s.num_prompt:] + provisional)

    def _decode_ready(self, handles: Sequence[SequenceHandle], num_steps: int, kind: BatchKind) -> list[LiveSeq]:
        """The rows of a unit, each at its last token with `num_steps` steps inside its reservation."""
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
        return seqs

    def _multi_step(self, handles: Sequence[SequenceHandle], num_steps: int, forced: list[list[int]] | None,
                    keep_logits: bool) -> tuple[PendingBatch, torch.Tensor | None]:
        kind = BatchKind.CONTROL if forced is not None else BatchKind.DECODE
        seqs = self._decode_ready(handles, num_steps, kind)
        B = len(seqs)
        if forced is not None and any(not (0 <= t < self.dims.vocab_size) for t in forced[0]):
            raise InvariantError("forced control token outside the vocabulary")
        # NOTE: plain greedy rows (the common serving case) skip the sampler's tensor building: one argmax
        #       per step, RNG unchanged (what `sample` returns for them). Plain rows (greedy or drawn; no
        #       penalties, bias or log-probs) through the decode graphs are also pipelined: steps after the
        #       first take their ids from the previous step's tokens on the device, one host sync per round,
        #       and one more step is launched before that sync (step_ahead.py).
        greedy = forced is None and all(self._sampler.plain_greedy(s.request.sampling) for s in seqs)
        plain = forced is None and all(self._sampler.plain(s.request.sampling) for s in seqs)
        constrained = any(s.request.constraint is not None for s in seqs)
        # NOTE: a constrained row whose reasoning is still open (free) takes any token: a one-step round of such
        #       rows is pipelined like a plain one. Its step-ahead is adopted only by a round that may be
        #       pipelined too, so never after the `</think>` that ends the freedom.
        masked = any(s.request.constraint is not None and (num_steps > 1 or not s.request.constraint.free)
                     for s in seqs)
        pipelined = (plain and not keep_logits and not masked
                     and self._graphs_fit(seqs, [s.frontier + num_steps for s in seqs]))
        # NOTE: a masked round's steps run one at a time; it adopts and launches forward-only step-aheads.
        stepwise = masked and forced is None and not keep_logits
        ahead = self.step_ahead.adopt(seqs, kind, pipelined, stepwise)
        try:
            rec = self._pending.open(kind, [s.handle.seq_id for s in seqs], [], [num_steps] * B,
                                     adopt=None if ahead is None else [[e] for e in ahead.entries])
        except BaseException:
            if ahead is not None:
                self._pending.unhold(ahead.entries)
            raise
        try:
            step_logits: list[torch.Tensor] = []
            if pipelined:
                produced, rngs = self._pipelined_steps(seqs, rec, num_steps, ahead, greedy)
                lps: list[list[TokenLogprob | None]] = [[None] * num_steps for _ in seqs]
            else:
                produced, lps, rngs = self._steps(seqs, rec, num_steps, forced, greedy,
                                                  step_logits if keep_logits else None, ahead)
                if stepwise:
                    self._launch_forward_ahead(seqs, rec, num_steps, [p[-1] for p in produced])
            if constrained:
                rec.data["grammar"] = self._advance_grammar(seqs, produced, forced is not None)
            rec.batch.rows = tuple(
                PendingRow(s.handle, tuple(produced[r]),
                           tuple(lps[r]) if s.request.sampling.logprobs is not None else None)
                for r, s in enumerate(seqs))
            rec.data.update(rng=rngs)
            out_logits = torch.stack(step_logits, dim=1) if keep_logits else None
            return rec.batch, out_logits
        except BaseException:
            rollback_rows([s.request.constraint for s in seqs], rec.data.get("grammar"), None)
            self._pending.take(rec.batch)
            self._pending.close(rec)
            raise

    def _advance_grammar(self, seqs: list[LiveSeq], produced: list[list[int]], control: bool) -> list[list[int]]:
        """Advance the rows' constraints over the tokens a unit produced: rec.data["grammar"] (constraints.py).
        Sampled tokens were drawn under the masks (a refusal is an invariant break); forced control tokens
        are taken as far as the grammar goes."""
        cons = [s.request.constraint for s in seqs]
        consumed: list[list[int]] = [[] for _ in seqs]
        try:
            for r, c in enumerate(cons):
                n = 0
                for t in produced[r]:
                    if c is not None:
                        n += c.advance([t]) if control else advance_row(c, [t], f"sequence {seqs[r].handle.seq_id}")
                    consumed[r].append(n)
        except BaseException:
            rollback_rows(cons, consumed, None)
            raise
        return consumed

    def _step_masks(self, seqs: list[LiveSeq], produced: list[list[int]]) -> torch.Tensor | None:
        """The rows' masks of this step on the host [B, W] (None: no row constrained now)."""
        cons = [s.request.constraint for s in seqs]
        moved = [c.advance(produced[r]) if c is not None and produced[r] else 0 for r, c in enumerate(cons)]
        try:
            return self._token_masks.host(cons)
        finally:
            for c, n in zip(cons, moved):
                if n:
                    c.rollback(n)

    def _steps(self, seqs: list[LiveSeq], rec: Provisional, num_steps: int, forced: list[list[int]] | None,
               greedy: bool, step_logits: list[torch.Tensor] | None, ahead: Ahead | None = None
               ) -> tuple[list, list, list]:
        """The unit's steps one at a time (a graph replay or the eager forward each), the host choosing every
        step's tokens. Returns the tokens, log-probs and rng state after each step, per row; appends each
        step's logits [B, V] to `step_logits` when given. Constrained rows' logits are masked (graph input
        data on the graphs, after the lm_head eagerly). ahead: an adopted forward-only step-ahead, whose
        logits are step 0's (its forward wrote step 0's scratch entries)."""
        B = len(seqs)
        constrained = forced is None and any(s.request.constraint is not None for s in seqs)
        produced: list[list[int]] = [[] for _ in seqs]
        lps: list[list[TokenLogprob | None]] = [[] for _ in seqs]
        rngs: list[list] = [[] for _ in seqs]
        for i in range(num_steps):
            dsts = [self._state.scratch_entry(rec.scratch[r][i]) for r in range(B)]
            srcs = [s.slot if i == 0 else self._state.scratch_entry(rec.scratch[r][i - 1])
                    for r, s in enumerate(seqs)]
            inputs = [[s.tokens[-1] if i == 0 else produced[r][i - 1]] for r, s in enumerate(seqs)]
            positions = [s.frontier + i for s in seqs]
            # NOTE: with the MTP layer each step also writes its KV and anchor (speculate.py; the graph's body
            #       does it too).
            adopted = i == 0 and ahead is not None
            logits = ahead.logits if adopted else self._graph_step(seqs, inputs, positions, srcs, dsts)
            graphed = logits is not None and not adopted
            if logits is None:
                for dst, src in zip(dsts, srcs):
                    self._state.copy_entry(dst, src)
                hidden = self._forward(seqs, inputs, positions, dsts)
                if self.mtp_on:
                    self.mtp_observe_step(seqs, [t[0] for t in inputs], positions, srcs, dsts, hidden)
                logits = self.model.logits(hidden)
            # NOTE: the masks come after the forward's launch: the host's grammar work overlaps the GPU's.
            masks = self._step_masks(seqs, produced) if constrained else None
            if masks is not None and graphed:
                logits = self.graphs.mask_logits(masks)
            elif masks is not None:
                apply_token_bitmask_(logits, masks.to(logits.device, non_blocking=True))
            if graphed and step_logits is not None:
                logits = logits.clone()       # the graph's output buffer is overwritten by the next replay
            if step_logits is not None:
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
                step_lps = self._sampler.logprobs_of(logits, toks, [s.request.sampling.logprobs for s in seqs])
                step_rngs = [None] * B
            for r in range(B):
                produced[r].append(toks[r])
                lps[r].append(step_lps[r])
                rngs[r].append(step_rngs[r])
        return produced, lps, rngs

    def block_tables(self, seqs: Sequence[LiveSeq]) -> torch.Tensor:
        """The rows' page tables [B, W] on the device (W: the longest row's; shorter rows padded)."""
        width = max(len(s.holding.table.pages) for s in seqs)
        return torch.stack([s.holding.table.as_tensor(width) for s in seqs]).to(self.device)

    def _forward(self, seqs: list[LiveSeq], inputs: list[list[int]], starts: list[int], entries: list[int]
                 ) -> torch.Tensor:
        """Run the model over one packed batch; rows write KV at [start, start + len) of their pages. A row
        inside a prompt with media takes its MRoPE positions and its media embeddings (media.py); a row past
        one rotates at its position + the prompt's rope delta."""
        for s, toks, st in zip(seqs, inputs, starts):
            s.holding.table.ensure(st + len(toks))
        dev = self.device
        positions = torch.cat([torch.arange(st, st + len(toks), dtype=torch.long) for toks, st in zip(inputs, starts)])
        rope, embeds = self.media_rows(seqs, [len(t) for t in inputs], starts, positions)
        fb = ForwardBatch(
            input_ids=torch.tensor([t for row in inputs for t in row], dtype=torch.long, device=dev),
            positions=positions.to(dev),
            seqlens=tuple(len(t) for t in inputs),
            starts=tuple(starts),
            state_entries=torch.tensor([self._state.phys(e) for e in entries], dtype=torch.long, device=dev),
            block_tables=self.block_tables(seqs),
            rope_positions=rope, embeds=embeds)
        return self.model.forward(fb)
