"""Decode step-ahead: the next decode step is on the GPU while the host finishes this round.

A decode round ends in one host sync for its token ids; everything the host does after it (the
Engine's commit, the Frontend's detokenisation, streaming, scheduling the next round, the next
round's input fill and graph launch) used to leave the GPU idle: 0.3-0.5 ms per 27B round on the
H200 (bench/NOTES.md, pass 6), more through the server. When a round of plain rows (greedy or drawn,
without penalties, logit bias or log-probs: `Sampler.plain`) runs through the decode graphs, Program
launches one more step of the same rows *before* it reads the round's tokens: the step takes its
input ids from the round's tokens on the device (the graph's `fed` buffer), draws from the rng
states the round's draws leave (host-side generator states, known without a sync), reads the state
the round wrote (its scratch entry) and writes a scratch entry of its own, held here. The next
`decode` of exactly these rows, after the round committed in full (so their committed rng states
are the ones it drew from), adopts it as its first step; anything else discards it. So the tokens,
KV, state and rng every call returns or commits are the ones the plain round would have produced:

    round N      ... replay N, tokens N -> D2H | launch step N+1 (fed N) | wait N's ids -> return
    commit N     the slot takes scratch N's image (a relabel; step N+1 read scratch N itself)
    round N+1    adopt step N+1 | launch step N+2 (fed N+1) | wait N+1's ids (usually done) -> return

What a step-ahead writes before it is adopted stays outside every committed reader: KV at the
position after the frontier (what the round would write; beyond the frontier nobody reads) and a
scratch entry. All work is queued on one CUDA stream, so later writes to freed pages or entries
are ordered after it. A discarded step-ahead costs one step of GPU time; Program therefore launches
one only when the next round is likely to adopt it (below, `eligible`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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
    tokens: DeviceTokens              # its token ids
    source: int                       # batch id of the round whose last tokens fed it
    rng_in: tuple                     # each row's rng state it drew from (the source round's last; greedy: unchanged)
    rng_out: list                     # each row's rng state after its draw
    sampling: Any                     # the rows' SamplingTensors (None: every row greedy), reused by the next round
    confirmed: bool = False           # that round was committed with every produced token accepted
