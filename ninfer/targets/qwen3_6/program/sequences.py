"""The live sequences of one Program: what each holds and where it stands.

One sequence (`tokens` = prompt + committed output tokens):

      0 .................. frontier ............ len(tokens) ...... reserved_tokens
      | committed in KV and  | known, not yet fed | free growth, covered by the
      | StateImage slot      | (the prompt suffix | reservation (pages drawn as
      |                      |  or the last token)| the frontier grows)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ninfer.contract.program import InvariantError, SequenceHandle, SequenceRequest
from ninfer.program.ledger import Holding


@dataclass(eq=False)
class LiveSeq:
    handle: SequenceHandle
    request: SequenceRequest
    holding: Holding
    tokens: list[int]              # prompt + committed output tokens
    rng_state: torch.Tensor        # sampler generator state after the last committed sampled token
    frontier: int = 0              # tokens whose effect is in committed KV and state
    source: int | None = None      # the checkpoint it was materialized from (None: root)
    pub_target: int | None = None  # publication target: the frontier to keep in the publication slot
    pub_frontier: int | None = None  # the frontier whose state the publication slot holds
    media_embeds: dict = field(default_factory=dict)   # media index -> the tower's rows not yet consumed (media.py)

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def slot(self) -> int:
        return self.holding.slot


def stream_seed(run_seed: int, index: int) -> int:
    """The seed of the index-th unseeded sequence of a run (splitmix64 of both, low 32 bits)."""
    m = (1 << 64) - 1
    z = (run_seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9 + 0x5EED) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return (z ^ (z >> 31)) & 0xFFFFFFFF


class SequenceTable:
    """The live sequences by id, the next id and the seeds of unseeded sequences."""

    def __init__(self, run_seed: int) -> None:
        self._by_id: dict[int, LiveSeq] = {}
        self._ids = itertools.count(1)
        # NOTE: unseeded sequences draw consecutive streams of the run seed, mixed (splitmix64) into
        #       32 bits because the CPU generator keeps only the low 32 bits of a seed.
        self._default_seeds = (stream_seed(run_seed, i) for i in itertools.count())

    def new_id(self) -> int:
        return next(self._ids)

    def default_seed(self) -> int:
        return next(self._default_seeds)

    def add(self, s: LiveSeq) -> None:
        self._by_id[s.handle.seq_id] = s

    def get(self, handle: SequenceHandle) -> LiveSeq:
        s = self._by_id.get(handle.seq_id)
        if s is None or s.handle != handle:
            raise InvariantError(f"unknown or released sequence {handle}")
        return s

    def remove(self, seq_id: int) -> None:
        del self._by_id[seq_id]

    def ids(self) -> set[int]:
        return set(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[LiveSeq]:
        return iter(self._by_id.values())
