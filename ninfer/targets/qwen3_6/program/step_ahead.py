"""Decode step-ahead: the next decode step is on the GPU while the host finishes this round.

A decode round ends in one host sync for its token ids; everything the host does after it (the
Engine's commit, the Frontend's detokenisation, streaming, scheduling the next round, the next
round's input fill and graph launch) would leave the GPU idle. When a round of plain rows (greedy
or drawn, without penalties, logit bias or log-probs: `Sampler.plain`) runs through the decode
graphs, Program launches one more step of the same rows *before* it reads the round's tokens: the step takes its
input ids from the round's tokens on the device (the graph's `fed` buffer), draws from the rng
states the round's draws leave (host-side generator states, known without a sync), reads the state
the round wrote (its scratch entry) and writes a scratch entry of its own, held here. The next
`decode` of exactly these rows, after the round committed in full (so their committed rng states
are the ones it drew from), adopts it as its first step; anything else discards it. So the tokens,
KV, state and rng every call returns or commits are the ones the plain round would have produced:

    round N      ... replay N, tokens N -> D2H | launch step N+1 (fed N) | wait N's ids -> return
    commit N     the slot takes scratch N's image (a relabel; step N+1 read scratch N itself)
    round N+1    adopt step N+1 | launch step N+2 (fed N+1) | wait N+1's ids (usually done) -> return

A round whose steps run one at a time (a grammar-masked round: each step's masks need the tokens of the
step before, constraints.py) launches a forward-only step-ahead instead, right after it has read its last
tokens: the next step's forward fed by those tokens from the host, its logits copied aside (another unit may
replay the same graph before the adoption). The next round of exactly these rows adopts it as its first step
and only then fills the masks, masks the logits and samples; the Engine's work between the rounds overlaps the
forward as it does for plain rows.

What a step-ahead writes before it is adopted stays outside every committed reader: KV at the
position after the frontier (what the round would write; beyond the frontier nobody reads) and a
scratch entry. All work is queued on one CUDA stream, so later writes to freed pages or entries
are ordered after it. A discarded step-ahead costs one step of GPU time; Program therefore launches
one only when the next round is likely to adopt it (`StepAhead.wanted`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ninfer.contract.program import BatchKind, InvariantError, PendingBatch
from ninfer.program.transactions import PendingLedger


@dataclass(eq=False)
class DeviceTokens:
    """One step's token ids: `dev` on the device (feeds the next step), `host` (pinned on CUDA) filled
    by an asynchronous copy that `event` follows."""
    dev: torch.Tensor
    host: torch.Tensor
    event: "torch.cuda.Event | None"

    @classmethod
    def of(cls, ids: torch.Tensor) -> "DeviceTokens":
        if ids.device.type != "cuda":
            return cls(ids, ids, None)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return cls(ids, host, ev)

    def tolist(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass(eq=False)
class Ahead:
    """One launched, not yet adopted step."""
    seq_ids: tuple[int, ...]          # rows, in order
    frontier: tuple[int, ...]         # each row's frontier once its source round is committed in full
    entries: list[int]                # PendingLedger scratch ids it wrote (held by the ledger for it)
    tokens: DeviceTokens | None       # its token ids (None: a forward-only step-ahead)
    source: int                       # batch id of the round whose last tokens fed it
    rng_in: tuple                     # each row's rng state it drew from (the source round's last; greedy: unchanged)
    rng_out: list                     # each row's rng state after its draw
    sampling: Any                     # the rows' SamplingTensors (None: every row greedy), reused by the next round
    confirmed: bool = False           # that round was committed with every produced token accepted
    logits: torch.Tensor | None = None   # a forward-only step-ahead's logits [B, V] (a copy), not yet masked


class StepAhead:
    """The Program's one launched, not yet adopted step (`pending`), its switch and counters.

    The scratch entries a step-ahead wrote are held in the PendingLedger for it until the next round
    adopts them (they become that round's first step) or it is discarded (they go back)."""

    def __init__(self, ledger: PendingLedger, enabled: bool) -> None:
        self._ledger = ledger
        self.enabled = enabled                         # a switch for benchmarks and tests
        self.pending: Ahead | None = None
        self.counts = {"launched": 0, "adopted": 0}    # for benchmarks and tests

    def wanted(self, seqs: list, num_steps: int, num_live: int) -> bool:
        """Whether to launch the step after a round of `num_steps` steps of `seqs`: the next round is
        likely to be these rows again (every one of the `num_live` live sequences is in this round, so no
        other is about to join) and every row may produce another token after it (budget and reservation).
        The caller also checks that the step fits a decode graph."""
        B = len(seqs)
        if not self.enabled or num_live != B or self._ledger.num_free_scratch < B:
            return False
        return all(len(s.tokens) - s.num_prompt + num_steps < s.request.max_output_tokens
                   and s.frontier + num_steps + 1 <= s.holding.reserved_tokens for s in seqs)

    def launched(self, ahead: Ahead) -> None:
        self.pending = ahead
        self.counts["launched"] += 1

    def adopt(self, seqs: list, kind: BatchKind, pipelined: bool, stepwise: bool = False) -> Ahead | None:
        """The pending step when this round is exactly its rows' next step (else it is discarded): a drawn
        step-ahead for a pipelined round, a forward-only one for a round whose steps run one at a time
        (`stepwise`: it samples the adopted logits itself)."""
        a, self.pending = self.pending, None
        if a is None:
            return None
        if (kind is BatchKind.DECODE and a.confirmed
                and a.seq_ids == tuple(s.handle.seq_id for s in seqs)
                and all(s.frontier == f == len(s.tokens) - 1 for s, f in zip(seqs, a.frontier))
                and (stepwise if a.logits is not None
                     else pipelined and all(s.rng_state is r for s, r in zip(seqs, a.rng_in)))):
            self.counts["adopted"] += 1
            return a
        self._ledger.unhold(a.entries)
        return None

    def on_commit(self, batch: PendingBatch, accepted: list[int], seq_ids) -> None:
        """Before `batch` commits: confirm the pending step if `batch` is its source, committed in full;
        discard it if any of the batch's rows (`seq_ids`) is one of its rows otherwise."""
        a = self.pending
        if (a is not None and batch.batch_id == a.source
                and all(n == row.produced_tokens for row, n in zip(batch.rows, accepted))):
            a.confirmed = True
        else:
            self.discard(*seq_ids)

    def discard(self, *seq_ids: int) -> None:
        """Drop the pending step if any of `seq_ids` is one of its rows."""
        a = self.pending
        if a is not None and set(seq_ids) & set(a.seq_ids):
            self.pending = None
            self._ledger.unhold(a.entries)

    def check(self, live_ids: set[int]) -> None:
        a = self.pending
        if a is not None and (not set(a.seq_ids) <= live_ids or len(a.entries) != len(a.seq_ids)):
            raise InvariantError(f"step-ahead of rows {a.seq_ids} outlived its sequences or entries")
