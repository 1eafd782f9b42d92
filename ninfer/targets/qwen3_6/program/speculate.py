"""Speculative decoding rounds of the Qwen3.6 Program (`ProgramConfig.speculative_method`).

With speculation on, a decode unit is one round per row (B rows, K = num_speculative_tokens, T = K + 1);
row r stands at frontier f with its last token x not yet in the state:

    draft     the drafter proposes d_1..d_K (MtpDrafter: the MTP layer K times, chained from the main
              model's final hidden state of position f-1, the "anchor", kept in the StateImage)
    verify    one forward of the T tokens [x, d_1..d_K] at positions f..f+K (model.verify_static): their KV
              written past the frontier, the GDN state after token t written at scratch entry [r][t], and
              the final hidden state of position f+t into that entry's mtp_hidden plane
    observe   the MTP layer's KV of positions f-1..f+K-1, each pairing the final hidden state of its
              position with the token after it (model.mtp_kv)
    accept    lossless acceptance on the T target distributions (ops.reference.speculative.verify_drafts):
              a drafts accepted, then one token of the target's; the row produces a + 1 tokens
              (a grammar-constrained row: the T distributions masked by its grammar after x, d_1, .., d_t;
              see constraints.py)

Committing c tokens of a row (1 <= c <= a + 1; commit.py, unchanged) swaps scratch entry [r][c-1] into
the slot: the GDN state and the anchor of frontier f + c. The MTP KV then holds every position below
f + c - 1 (the entry at position f-1+j pairs the hidden state of that position with the j-th token fed,
a committed one for j < c). Every path that feeds tokens keeps this invariant for the MTP layer:

    a sequence at frontier F >= 1 holds in its slot's mtp_hidden the final hidden state of position
    F - 1, and the MTP KV of every position below F - 1

(prefill stages: `mtp_observe_stage`; decode and control steps, eager or in the decode graphs, and the rounds:
`model.mtp_observe`; the prefill graphs: prefill_graphs.prefill_body). A checkpoint copies the image and shares the pages,
so a continuation drafts exactly as the producer would have. The drafts decide only how many tokens a
round keeps, never which: a stale MTP state costs acceptance, not correctness.

Drafts are the drafter's argmax (a point-mass proposal q); sampled rows are verified against the
request's full sampling distribution p (accept d with probability p(d), else draw from p without d),
which is exact sampling from p whatever the drafts (speculative.md, 4.2).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ninfer.contract.program import BatchKind, PendingBatch, PendingRow, SequenceHandle, TokenLogprob
from ninfer.ops.opset import apply_token_bitmask_
from ninfer.ops.reference.sampling import SamplingTensors, drawing_rows
from ninfer.ops.reference.speculative import verify_drafts
from ninfer.program.transactions import Provisional
from ninfer.targets.qwen3_6.program.constraints import draft_masks, rollback_rows
from ninfer.targets.qwen3_6.program.sequences import LiveSeq


class Drafter(Protocol):
    """Proposes each row's K draft tokens for a round: [B, K] int64 on the Program's device."""

    def propose(self, program, seqs: Sequence[LiveSeq]) -> torch.Tensor: ...


class MtpDrafter:
    """Drafts with the checkpoint's MTP layer: step i (i = 0..K-1) of row r at position f-1+i reads the
    anchor (i = 0) or the previous step's output as hidden state, and x (i = 0) or the previous draft as
    token; the draft is the argmax of the shared lm_head over the first `vocab` token ids."""

    def __init__(self, num_speculative_tokens: int, vocab: int) -> None:
        self.k = num_speculative_tokens
        self.vocab = vocab

    def propose(self, program, seqs: Sequence[LiveSeq]) -> torch.Tensor:
        dev = program.device
        return program.model.mtp_draft_chain(
            program.anchors([s.slot for s in seqs]),
            torch.tensor([s.tokens[-1] for s in seqs], dtype=torch.long, device=dev),
            torch.tensor([s.frontier - 1 for s in seqs], dtype=torch.long, device=dev),
            program.block_tables(seqs), torch.arange(len(seqs), dtype=torch.long, device=dev), self.k, self.vocab)


class SpecDecodeOps:
    """Mixed into Qwen36Program: the speculative round (`_spec_round`, what `decode` runs with a method) and
    the MTP layer's bookkeeping on every path that feeds tokens. Uses its stores, `_pending`, `model`,
    `_sampler` and `drafter`."""

    # ---- the MTP state: anchors and KV --------------------------------------------------------------
    def anchors(self, entries: Sequence[int]) -> torch.Tensor:
        """The mtp_hidden images of StateImage entries [len(entries), H]."""
        idx = torch.tensor([self._state.phys(e) for e in entries], dtype=torch.long, device=self.device)
        return self._state.planes["mtp_hidden"][0].index_select(0, idx)

    def _set_anchors(self, entries: Sequence[int], hidden: torch.Tensor) -> None:
        """Write hidden [n, H] into the mtp_hidden images of the n entries."""
        idx = torch.tensor([self._state.phys(e) for e in entries], dtype=torch.long, device=self.device)
        plane = self._state.planes["mtp_hidden"][0]
        plane.index_copy_(0, idx, hidden.to(plane.dtype))

    @property
    def mtp_on(self) -> bool:
        return self.model.view.mtp is not None

    def mtp_observe_stage(self, s: LiveSeq, hidden: torch.Tensor, start: int, end: int, entry: int) -> None:
        """After a prefill stage fed tokens start..end-1 (final hidden states `hidden` [n, H]) into `entry`
        (which held the state, and anchor, of frontier `start`): the MTP KV of positions start-1..end-2 and
        the anchor of frontier `end`."""
        toks = s.tokens[start:end]
        if start == 0:
            prev, toks, first = hidden[:-1], toks[1:], 0
        else:
            prev, first = torch.cat([self.anchors([entry]), hidden[:-1]]), start - 1
        if toks:
            dev = self.device
            n = len(toks)
            self.model.mtp_kv(prev, torch.tensor(toks, dtype=torch.long, device=dev),
                              torch.arange(first, first + n, dtype=torch.long, device=dev),
                              torch.zeros(n, dtype=torch.long, device=dev), self.block_tables([s]))
        self._set_anchors([entry], hidden[-1:])

    def mtp_observe_step(self, seqs: Sequence[LiveSeq], inputs: Sequence[int], positions: Sequence[int],
                         srcs: Sequence[int], dsts: Sequence[int], hidden: torch.Tensor) -> None:
        """After one eager decode or control step (row r fed inputs[r] at positions[r], state read at srcs[r]
        and written at dsts[r], final hidden states `hidden` [B, H]): the MTP KV of positions[r] - 1 and the
        anchors at dsts."""
        dev = self.device
        ph = self._state.phys
        self.model.mtp_observe(torch.tensor([ph(e) for e in srcs], dtype=torch.long, device=dev), hidden,
                               torch.tensor(list(inputs), dtype=torch.long, device=dev),
                               torch.tensor(list(positions), dtype=torch.long, device=dev),
                               torch.arange(len(seqs), dtype=torch.long, device=dev), self.block_tables(seqs),
                               torch.tensor([ph(e) for e in dsts], dtype=torch.long, device=dev))

    # ---- the round ------------------------------------------------------------------------------------
    def _spec_round(self, handles: Sequence[SequenceHandle]) -> PendingBatch:
        K = self.config.num_speculative_tokens
        T = K + 1
        seqs = self._decode_ready(handles, T, BatchKind.DECODE)
        B = len(seqs)
        for s in seqs:
            s.holding.table.ensure(s.frontier + T)
        rec = self._pending.open(BatchKind.DECODE, [s.handle.seq_id for s in seqs], [], [T] * B)
        try:
            g = self.spec_graphs
            if (g is not None and self.graphs_enabled and isinstance(self.drafter, MtpDrafter)
                    and self.model.ops is g.ops and g.fits(B, [s.holding.table.pages for s in seqs])):
                ph = self._state.phys
                drafts, logits, target = g.run(
                    [s.tokens[-1] for s in seqs], [s.frontier for s in seqs], [ph(s.slot) for s in seqs],
                    [ph(self._state.scratch_entry(e)) for r in range(B) for e in rec.scratch[r][:T]],
                    [s.holding.table.pages for s in seqs], self.rope_deltas(seqs))
            else:
                drafts = self.drafter.propose(self, seqs)
                logits = self._verify(seqs, rec, drafts)
                target = None
            cons = [s.request.constraint for s in seqs]
            constrained = any(c is not None for c in cons)
            if constrained:
                # NOTE: the K + 1 verify distributions under the grammar, each after the drafts before it; the
                #       acceptance then keeps only drafts the grammar allows (constraints.py).
                masks = draft_masks(self._token_masks, cons, drafts.tolist())
                apply_token_bitmask_(logits.view(B * T, logits.shape[-1]), masks.to(logits.device, non_blocking=True))
                target = None
            produced, lps, rngs = self._accept(seqs, logits, drafts, target)
            if constrained:
                rec.data["grammar"] = self._advance_grammar(seqs, produced, False)
            rec.batch.rows = tuple(
                PendingRow(s.handle, tuple(produced[r]),
                           tuple(lps[r]) if s.request.sampling.logprobs is not None else None, drafted=K)
                for r, s in enumerate(seqs))
            rec.data.update(rng=[[rngs[r]] * T for r in range(B)])
            return rec.batch
        except BaseException:
            rollback_rows([s.request.constraint for s in seqs], rec.data.get("grammar"), None)
            self._pending.take(rec.batch)
            self._pending.close(rec)
            raise

    def _verify(self, seqs: list[LiveSeq], rec: Provisional, drafts: torch.Tensor) -> torch.Tensor:
        """The verify forward and the MTP observe of one round (module docstring); fp32 logits [B, T, V]."""
        B, K = drafts.shape
        T = K + 1
        dev = self.device
        ph = self._state.phys
        last = torch.tensor([s.tokens[-1] for s in seqs], dtype=torch.long, device=dev)
        ids = torch.cat([last[:, None], drafts], dim=1).flatten()
        pos = torch.tensor([[s.frontier + t for t in range(T)] for s in seqs], dtype=torch.long).flatten().to(dev)
        rows = torch.arange(B, dtype=torch.long, device=dev).repeat_interleave(T)
        src = torch.tensor([ph(s.slot) for s in seqs], dtype=torch.long, device=dev)
        dst = torch.tensor([[ph(self._state.scratch_entry(e)) for e in rec.scratch[r][:T]] for r in range(B)],
                           dtype=torch.long, device=dev)
        tables = self.block_tables(seqs)
        delta = torch.tensor(self.rope_deltas(seqs), dtype=torch.long, device=dev).repeat_interleave(T)
        hidden = self.model.verify_static(ids, pos, rows, src, dst, tables, cos_sin=self.model.rotary(pos + delta))
        if self.mtp_on:
            self.model.mtp_observe(src, hidden, ids, pos, rows, tables, dst.flatten())
        return self.model.logits(hidden).view(B, T, -1)

    def _accept(self, seqs: list[LiveSeq], logits: torch.Tensor, drafts: torch.Tensor,
                target: torch.Tensor | None = None) -> tuple[list[list[int]], list[list[TokenLogprob | None]], list]:
        """Each row's produced tokens (accepted drafts, then the target's), their log-probs (the target's raw
        distribution) and its rng state after the round. target: the logits' argmax over the sampleable
        vocabulary [B, T] when already computed."""
        B, T, V = logits.shape
        K = T - 1
        L = self.force_accept_len
        ps = [s.request.sampling for s in seqs]
        if all(self._sampler.plain_greedy(p) for p in ps):
            if target is None:
                target = self._sampler.greedy_ids(logits.view(B * T, V)).view(B, T)
            both = torch.cat([drafts, target], dim=1).tolist()       # the round's one wait for the device
            produced = []
            for row in both:
                d, t = row[:K], row[K:]
                a = L - 1 if L else next((i for i in range(K) if d[i] != t[i]), K)
                produced.append(d[:a] + [t[a]])
            counts = [len(p) for p in produced]
            rngs = [s.rng_state for s in seqs]
        else:
            draft_rows = drafts.tolist()
            hist = [s.tokens[s.num_prompt:] for s in seqs]
            rep = [p.repetition_penalty != 1.0 for p in ps]
            st = SamplingTensors.build(
                vocab_size=V, device=logits.device,
                temperature=[p.temperature for p in ps for _ in range(T)],
                top_k=[p.top_k for p in ps for _ in range(T)], top_p=[p.top_p for p in ps for _ in range(T)],
                min_p=[p.min_p for p in ps for _ in range(T)],
                repetition_penalty=[p.repetition_penalty for p in ps for _ in range(T)],
                presence_penalty=[p.presence_penalty for p in ps for _ in range(T)],
                frequency_penalty=[p.frequency_penalty for p in ps for _ in range(T)],
                logit_bias=[p.logit_bias for p in ps for _ in range(T)],
                prompt_tokens=[s.request.prompt_token_ids if rep[r] else ()
                               for r, s in enumerate(seqs) for _ in range(T)],
                output_tokens=[hist[r] + draft_rows[r][:t] for r in range(B) for t in range(T)])
            res = verify_drafts(self._sampler._sampleable(logits.view(B * T, V)).view(B, T, V), drafts, st,
                                [s.rng_state for s in seqs], drawn=drawing_rows([p.temperature for p in ps]),
                                force_accept=L)
            counts = (res.num_accepted + 1).tolist()
            tok_rows = res.tokens.tolist()
            produced = [tok_rows[r][:counts[r]] for r in range(B)]
            rngs = res.rng_states
        lps: list[list[TokenLogprob | None]] = [[None] * c for c in counts]
        want = [r for r, p in enumerate(ps) if p.logprobs is not None]
        if want:
            rows = [(r, t) for r in want for t in range(counts[r])]
            recs = self._sampler.logprobs_of(logits[[r for r, _ in rows], [t for _, t in rows]],
                                             [produced[r][t] for r, t in rows], [ps[r].logprobs for r, _ in rows])
            for (r, t), lp in zip(rows, recs):
                lps[r][t] = lp
        return produced, lps, rngs
