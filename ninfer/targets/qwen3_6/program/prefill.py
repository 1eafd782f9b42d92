"""Prefill of the Qwen3.6 Program: a prompt in stages, eager or through a prefill graph.

    stage [start, end) of a prompt of P tokens
      intermediate (end < P)   writes straight into the sequence's slot and moves the frontier;
                               returns no batch
      final (end == P)         writes scratch entry [0][0] (a copy of the slot's image first) and
                               samples the first output token: a PREFILL batch of one row, effective
                               when it commits (the frontier moves to P)

A final stage of one token is a decode step of B=1 (the decode graph runs it when it applies); a short
stage replays the prefill graph of its bucket (prefill_graphs.py); the rest, and every stage asking for
prompt log-probs or kept logits, run the eager forward.
"""
from __future__ import annotations

import torch

from ninfer.contract.program import BatchKind, InvariantError, PendingRow, PrefillStep, SequenceHandle, TokenLogprob
from ninfer.program.transactions import Provisional
from ninfer.targets.qwen3_6.program import prefill_graphs
from ninfer.targets.qwen3_6.program.sampling import prompt_token_logprobs
from ninfer.targets.qwen3_6.program.constraints import advance_row
from ninfer.targets.qwen3_6.program.sequences import LiveSeq


class PrefillOps:
    """Mixed into Qwen36Program: `prefill`. Uses its stores, `_pending`, `model`, `_sampler`,
    `prefill_graphs` and the decode-graph step of DecodeOps (`_graph_step`, `_forward`)."""

    def prefill(self, seq: SequenceHandle, max_tokens: int) -> PrefillStep:
        return self.prefill_with_logits(seq, max_tokens, keep_logits=False)[0]

    def prefill_with_logits(self, seq: SequenceHandle, max_tokens: int, *, keep_logits: bool = True
                            ) -> tuple[PrefillStep, torch.Tensor | None]:
        """`prefill`, also returning the fp32 logits [n, V] of every position this stage computed
        (scoring and parity tests use them; nothing else changes)."""
        s = self._seq(seq)
        self._pending.require_idle(s.handle.seq_id, "prefill")
        self.step_ahead.discard(s.handle.seq_id)
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
            #       capture, leaving one token. Prompt log-probs need the hidden states: eager.
            # NOTE: a stage with media rows or uneven MRoPE positions runs eagerly (media.py); one of text at
            #       a constant rope delta takes the graphs (the decode graph adds the request's rope_delta).
            delta = self.text_stage_delta(s, start, end)
            graphed = (self._graph_step([s], [[s.tokens[start]]], [start], [s.slot], [entry])
                       if final and n == 1 and s.request.prompt_logprobs is None
                       and delta == s.request.rope_delta else None)
            if graphed is None and not keep_logits and delta is not None:
                # NOTE: a short stage (over a prefix or not) replays a graph of the whole stage: such a stage
                #       is host bound (prefill_graphs.py).
                graphed = self._prefill_graph(s, start, end, entry, final, delta)
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
                if self.mtp_on:
                    self.mtp_observe_stage(s, hidden, start, end, entry)
                logits = self.model.logits(hidden) if keep_logits else None
                if s.request.prompt_logprobs is not None:
                    prompt_lp = prompt_token_logprobs(hidden, self.model.view.lm_head, s.tokens, start, end, P,
                                                      s.request.prompt_logprobs)
                if not final:
                    s.frontier = end
                    self._pub_target_reached(s, lambda T: s.slot if T == end else None)
                    return PrefillStep(end, None, prompt_lp), logits
                last = logits[-1:] if logits is not None else self.model.logits(hidden[-1:])
            c = s.request.constraint
            if c is not None:                 # the first output token under the grammar (constraints.py)
                self._token_masks.apply(last, [c])
            toks, lps, rngs = self._sampler.sample(last, [self._row_sampling(s, [])])
            rec.batch.rows = (PendingRow(s.handle, (toks[0],), (lps[0],) if lps[0] is not None else None),)
            rec.data.update(end=end, rng=[[rngs[0]]])
            if c is not None:
                rec.data["grammar"] = [[advance_row(c, toks[:1], f"sequence {s.handle.seq_id}")]]
            return PrefillStep(end, rec.batch, prompt_lp), logits
        except BaseException:
            if rec is not None:
                self._pending.take(rec.batch)
                self._pending.close(rec)
            raise

    def _prefill_graph(self, s: LiveSeq, start: int, end: int, entry: int, final: bool,
                       delta: int = 0) -> torch.Tensor | None:
        """A stage of the prompt, tokens start..end-1 (rotating at their positions + delta) over the prefix
        before them (none at start 0), through
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
        hidden = pg.run(s.tokens[start:end], start, self._state.phys(entry), s.holding.table.pages, delta)
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
