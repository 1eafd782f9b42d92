"""Decode steps through the captured decode graphs (cuda_graphs.py), and the pipelined plain rounds.

    _graph_step         one token per row through the graph of exact B, the host feeding the ids
    _pipelined_steps    a round of plain rows: each step fed by the previous step's tokens on the device,
                        then the step-ahead launched (step_ahead.py), then one wait for all the ids
    _launch_forward_ahead   after a round of one-at-a-time steps: the next step's forward, its logits aside

A graph applies when it exists, is switched on (`graphs_enabled`), was captured for the model's op set
and every row's pages up to the step's position fit its block tables; otherwise the caller runs eagerly.
Entry ids go to a graph as physical images (`StateImageStore.phys`).
"""
from __future__ import annotations

import torch

from ninfer.program.transactions import Provisional
from ninfer.targets.qwen3_6.program.sequences import LiveSeq
from ninfer.targets.qwen3_6.program.step_ahead import Ahead, DeviceTokens


class GraphStepOps:
    """Mixed into Qwen36Program: decode steps on its `graphs`. Uses its `_state`, `_pending`, `_seqs`,
    `_sampler` and `step_ahead`."""

    def _graph_step(self, seqs: list[LiveSeq], inputs: list[list[int]], positions: list[int], srcs: list[int],
                    dsts: list[int]) -> torch.Tensor | None:
        """One token per row through the captured graph of exact B (state copy src -> dst, forward,
        lm_head), launched, not waited for; None when graphs are off or do not apply (then the caller runs
        eagerly). Token masks follow with `graphs.mask_logits`."""
        if not self._graphs_fit(seqs, [p + 1 for p in positions]):
            return None
        return self._replay(seqs, [t[0] for t in inputs], positions, srcs, dsts)

    def _replay(self, seqs: list[LiveSeq], input_ids: list[int] | None, positions: list[int], srcs: list[int],
                dsts: list[int], fed: torch.Tensor | None = None) -> torch.Tensor:
        """`_graph_step` where `_graphs_fit` has already said yes for these positions; fed: the rows'
        input ids on the device instead of `input_ids`. Entry ids go to the graph as physical images."""
        ph = self._state.phys
        return self.graphs.run(input_ids, positions, [ph(e) for e in srcs], [ph(e) for e in dsts],
                               [s.holding.table.pages for s in seqs], fed=fed, deltas=self.rope_deltas(seqs))

    def _graphs_fit(self, seqs: list[LiveSeq], ends: list[int]) -> bool:
        """Whether the rows' steps up to position ends[r] - 1 replay a decode graph (maps their pages)."""
        g = self.graphs
        if g is None or not self.graphs_enabled or self.model.ops is not g.ops:
            return False
        for s, e in zip(seqs, ends):
            s.holding.table.ensure(e)
        return g.fits(len(seqs), [s.holding.table.pages for s in seqs])

    def _draw(self, seqs: list[LiveSeq], logits: torch.Tensor, st, rng: list) -> tuple[DeviceTokens, list]:
        """One pipelined step's tokens (left on the device) and the rows' rng states after it."""
        if st is None:                       # every row greedy: argmax, rng unchanged
            return DeviceTokens.of(self._sampler.greedy_ids(logits)), rng
        ids, new = self._sampler.sample_ids(logits, st, [s.request.sampling for s in seqs], rng)
        return DeviceTokens.of(ids), new

    def _pipelined_steps(self, seqs: list[LiveSeq], rec: Provisional, num_steps: int, ahead: Ahead | None,
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

    def _launch_ahead(self, seqs: list[LiveSeq], rec: Provisional, num_steps: int, last: DeviceTokens,
                      rng: list, st) -> None:
        """Launch the step after this round's last (fed by `last`, drawing from the rows' rng states `rng`
        after it) when `StepAhead.wanted` says the next round is likely to adopt it and it fits a graph."""
        def run(positions, srcs, dsts) -> dict:
            logits = self._replay(seqs, None, positions, srcs, dsts, fed=last.dev)
            tokens, rng_out = self._draw(seqs, logits, st, rng)
            return dict(tokens=tokens, rng_in=tuple(rng), rng_out=rng_out, sampling=st)
        self._launch_step_ahead(seqs, rec, num_steps, run)

    def _launch_forward_ahead(self, seqs: list[LiveSeq], rec: Provisional, num_steps: int, last: list[int]) -> None:
        """After a round whose steps ran one at a time (a grammar-masked round), its tokens read: launch the next
        step's forward fed by the rows' last tokens `last` and keep its logits aside, for the next round to
        mask and sample (step_ahead.py); when `StepAhead.wanted` says that round is likely to adopt it and the
        step fits a graph."""
        def run(positions, srcs, dsts) -> dict:
            # NOTE: a copy: another unit (a final 1-token prefill stage) may replay this graph before the adoption
            logits = self._replay(seqs, list(last), positions, srcs, dsts).clone()
            return dict(tokens=None, rng_in=(), rng_out=[], sampling=None, logits=logits)
        self._launch_step_ahead(seqs, rec, num_steps, run)

    def _launch_step_ahead(self, seqs: list[LiveSeq], rec: Provisional, num_steps: int, run) -> None:
        """A step-ahead after a round of `num_steps` steps, if wanted and graphed: run(positions, srcs, dsts)
        replays it (reading the round's last scratch entries, writing entries held for it) and returns its
        Ahead fields besides the rows, frontiers, entries and source."""
        B = len(seqs)
        if not self.step_ahead.wanted(seqs, num_steps, len(self._seqs)):
            return
        if not self._graphs_fit(seqs, [s.frontier + num_steps + 1 for s in seqs]):
            return
        entries = self._pending.hold(B)
        try:
            srcs = [self._state.scratch_entry(rec.scratch[r][num_steps - 1]) for r in range(B)]
            dsts = [self._state.scratch_entry(e) for e in entries]
            fields = run([s.frontier + num_steps for s in seqs], srcs, dsts)
        except BaseException:
            self._pending.unhold(entries)
            raise
        self.step_ahead.launched(Ahead(tuple(s.handle.seq_id for s in seqs),
                                       tuple(s.frontier + num_steps for s in seqs),
                                       entries, source=rec.batch.batch_id, **fields))
