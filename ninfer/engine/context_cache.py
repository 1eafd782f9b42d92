"""The context-cache catalog: ResourceManager's logical view of published checkpoints.

Program owns every physical fact of a checkpoint (slot, pages, bytes, placement, provenance);
this catalog keeps only what the cache *policy* needs, adopted from Program's ResourceResults:

    checkpoint  frontier  digest    placement  retention  session   hits  last_use
    17          412       9f3c..    device     SESSION    chat-1    2     88
    12          380       41aa..    device     PROMPT     -         0     61
    9           256       41aa..    host       STRIDE     -         1     40

- the prefix candidate index: digest of a prefix -> checkpoint; a prompt's best source is the
  published checkpoint with the longest frontier F <= num_prompt_tokens - 1 whose digest equals
  the digest of the prompt's first F tokens (token granularity, independent of the page size; at
  least one prompt token is always computed, so the first output token is sampled from the
  prompt's last position);
- private checkpoints are bound to a session key in the SessionIndex (retention SESSION);
  shared ones are prompt/stride captures and unbound terminal checkpoints;
- retention classes and hit observations order the eviction candidates, least valuable first:
  (class, hits, last use) ascending. Nothing in use (a pinned source) is ever offered.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Sequence

from ninfer.contract.program import CheckpointInfo, InvariantError, Placement, prefix_digest
from ninfer.engine.session_index import SessionIndex


class RetentionClass(enum.IntEnum):
    STRIDE = 0          # a fixed-stride capture inside a long prompt
    PROMPT = 1          # end of a prompt (frontier P - 1)
    TERMINAL = 2        # a finished request's reconstruction frontier, no session bound to it
    SESSION = 3         # bound to a session key (private)


@dataclass(frozen=True)
class CacheConfig:
    """Start-time cache policy (EngineConfig mirrors it; 0 bytes = no separate budget)."""
    enabled: bool = True
    device_bytes: int = 0          # budget for inactive checkpoints on the device (0: the pools bound it)
    host_bytes: int = 0            # budget for host-memory replicas (0: none)
    capture_stride: int = 0        # capture a checkpoint every this many prompt tokens (0: off)

    def __post_init__(self) -> None:
        for name in ("device_bytes", "host_bytes", "capture_stride"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class Entry:
    info: CheckpointInfo
    retention: RetentionClass
    hits: int = 0
    last_use: int = 0

    @property
    def checkpoint_id(self) -> int:
        return self.info.checkpoint_id

    @property
    def frontier(self) -> int:
        return self.info.frontier


class CacheStats:
    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0
        self.hit_tokens = 0
        self.captures = 0
        self.evictions = 0
        self.offloads = 0


class ContextCache:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.entries: dict[int, Entry] = {}
        self._by_digest: dict[str, int] = {}
        self._frontiers: dict[int, int] = {}          # frontier -> number of entries with it
        self.sessions = SessionIndex()
        self.stats = CacheStats()
        self._clock = 0

    def __len__(self) -> int:
        return len(self.entries)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---- lookups -------------------------------------------------------------------------
    def has_digest(self, digest: str) -> int | None:
        return self._by_digest.get(digest)

    def find_source(self, prompt_ids: Sequence[int]) -> Entry | None:
        """The longest published prefix of the prompt with at least one prompt token left."""
        limit = len(prompt_ids) - 1
        for f in sorted((f for f in self._frontiers if f <= limit), reverse=True):
            cid = self._by_digest.get(prefix_digest(prompt_ids[:f]))
            if cid is not None:
                return self.entries[cid]
        return None

    def observe_query(self, hit: Entry | None) -> None:
        self.stats.queries += 1
        if hit is not None:
            self.stats.hits += 1
            self.stats.hit_tokens += hit.frontier
            hit.hits += 1
            hit.last_use = self._tick()

    def eviction_order(self, exclude: Sequence[int] = (), placement: Placement = Placement.DEVICE) -> list[int]:
        ex = set(exclude)
        cands = [e for e in self.entries.values() if e.checkpoint_id not in ex and e.info.placement is placement]
        cands.sort(key=lambda e: (e.retention, e.hits, e.last_use))
        return [e.checkpoint_id for e in cands]

    def capture_points(self, num_prompt_tokens: int, num_reused_tokens: int) -> list[int]:
        """Prompt frontiers where a live capture is published: every stride, and P - 1."""
        P, R = num_prompt_tokens, num_reused_tokens
        points = set()
        if self.config.capture_stride:
            points.update(range(self.config.capture_stride, P - 1, self.config.capture_stride))
        if P >= 2:
            points.add(P - 1)
        return sorted(p for p in points if p > R)

    # ---- adoption of Program's results -------------------------------------------------------
    def add(self, info: CheckpointInfo, retention: RetentionClass) -> Entry:
        if info.checkpoint_id in self.entries:
            raise InvariantError(f"checkpoint {info.checkpoint_id} published twice")
        e = Entry(info, retention, last_use=self._tick())
        self.entries[info.checkpoint_id] = e
        self._by_digest.setdefault(info.digest, info.checkpoint_id)
        self._frontiers[info.frontier] = self._frontiers.get(info.frontier, 0) + 1
        return e

    def remove(self, checkpoint_id: int) -> Entry:
        e = self.entries.pop(checkpoint_id, None)
        if e is None:
            raise InvariantError(f"Program evicted checkpoint {checkpoint_id} which is not in the catalog")
        if self._by_digest.get(e.info.digest) == checkpoint_id:
            del self._by_digest[e.info.digest]
            for other in self.entries.values():          # another entry may prove the same prefix
                if other.info.digest == e.info.digest:
                    self._by_digest[e.info.digest] = other.checkpoint_id
                    break
        n = self._frontiers[e.frontier] - 1
        if n:
            self._frontiers[e.frontier] = n
        else:
            del self._frontiers[e.frontier]
        self.sessions.forget_checkpoint(checkpoint_id)
        return e

    def adopt_evictions(self, evicted: Sequence[int], offloaded: Sequence[int]) -> None:
        for cid in evicted:
            self.remove(cid)
            self.stats.evictions += 1
        for cid in offloaded:
            e = self.entries.get(cid)
            if e is None:
                raise InvariantError(f"Program moved checkpoint {cid} which is not in the catalog")
            e.info = replace(e.info, placement=Placement.HOST)
            self.stats.offloads += 1

    def bind_session(self, key: str, checkpoint_id: int, publication_order: int) -> bool:
        """SessionIndex update at terminal; the replaced checkpoint becomes shared (TERMINAL)."""
        bound, replaced = self.sessions.bind(key, checkpoint_id, publication_order)
        if bound:
            self.entries[checkpoint_id].retention = RetentionClass.SESSION
            if replaced is not None and replaced in self.entries and not self.sessions.keys_of(replaced):
                self.entries[replaced].retention = RetentionClass.TERMINAL
        return bound

    def clear(self) -> None:
        self.entries.clear()
        self._by_digest.clear()
        self._frontiers.clear()
        self.sessions.clear()
