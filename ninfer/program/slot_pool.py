"""StateImage slot pool: ids of fixed per-sequence state entries (conv + recurrent state).

A slot holds the complete recurrent state image of one sequence (or one immutable checkpoint) at
one frontier. Slots are never shared: copy-on-write copies a checkpoint's slot into the
continuation's own slot, so each slot has exactly one owner (a sequence, its publication slot, or
a checkpoint). Slots are handed out lowest id first.

    slot ids   0 ............................... total-1
              +----------------------+----------------+
              | owned (one owner)    | free           |
              +----------------------+----------------+
    owned + free == total
"""
from __future__ import annotations

import heapq

from ninfer.contract.program import InvariantError


class SlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.total = num_slots
        self._free: list[int] = list(range(num_slots))
        self._owner: dict[int, object] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_owned(self) -> int:
        return len(self._owner)

    def owner(self, slot: int) -> object | None:
        return self._owner.get(slot)

    def alloc(self, owner: object) -> int:
        if not self._free:
            raise InvariantError("no free StateImage slot")
        slot = heapq.heappop(self._free)
        self._owner[slot] = owner
        return slot

    def hand_over(self, slot: int, owner: object, new_owner: object) -> int:
        """Give an owned slot to its next owner (the slot's contents stay: it never becomes free)."""
        if self._owner.get(slot) is not owner:
            raise InvariantError(f"slot {slot} handed over by a non-owner")
        self._owner[slot] = new_owner
        return slot

    def free(self, slot: int, owner: object) -> None:
        if self._owner.get(slot) is not owner:
            raise InvariantError(f"slot {slot} freed by a non-owner")
        del self._owner[slot]
        heapq.heappush(self._free, slot)

    def check(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise InvariantError("a slot is on the free list twice")
        if free & self._owner.keys():
            raise InvariantError("a free slot has an owner")
        if len(free) + len(self._owner) != self.total:
            raise InvariantError(f"slots: free {len(free)} + owned {len(self._owner)} != total {self.total}")
