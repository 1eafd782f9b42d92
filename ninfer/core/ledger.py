"""Resource ledger: feasibility, reservations and ownership of KV pages and StateImage slots.

One ledger per Program. A sequence's `Holding` is everything it owns: a block table (mapped pages
plus the reservation of its complete growth) and one StateImage slot. `resource_revision`
advances on every topology change (acquire, release), so a sealed plan can detect staleness.

    pages  +--------------------------+----------------------+--------------------+
           | mapped by holdings        | reserved by holdings | available           |
           | (refcount >= 1)           | (not yet mapped)     | (new plans count    |
           |                           |                      |  only on these)     |
           +--------------------------+----------------------+--------------------+
    slots  +--------------------------+-------------------------------------------+
           | one per holding           | free                                      |
           +--------------------------+-------------------------------------------+
    free + owned == total for both; every holding's pages + remaining reservation
    == pages_for(its reserved tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from ninfer.core.block_table import BlockTable, pages_for
from ninfer.core.page_pool import PagePool
from ninfer.core.slot_pool import SlotPool
from ninfer.runtime.contract.types import InvariantError, Refusal, RefusalKind


class Need(NamedTuple):
    tokens: int
    pages: int
    slots: int


@dataclass(eq=False)
class Holding:
    owner_id: int
    table: BlockTable
    slot: int
    reserved_tokens: int

    @property
    def pages_held(self) -> int:
        return len(self.table.pages) + self.table.reservation.remaining


class ResourceLedger:
    def __init__(self, num_pages: int, page_size: int, num_slots: int, max_model_len: int) -> None:
        self.pages = PagePool(num_pages)
        self.slots = SlotPool(num_slots)
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.revision = 0
        self._holdings: dict[int, Holding] = {}

    # ---- pure planning ----
    def need(self, tokens: int) -> Need:
        return Need(tokens, pages_for(tokens, self.page_size), 1)

    def refusal(self, tokens: int) -> Refusal | None:
        """Why a sequence growing to `tokens` positions cannot be acquired now (None: it can)."""
        n = self.need(tokens)
        if tokens > self.max_model_len:
            return Refusal(RefusalKind.INFEASIBLE,
                           f"{tokens} tokens exceed max_model_len {self.max_model_len}")
        if n.pages > self.pages.total:
            return Refusal(RefusalKind.INFEASIBLE,
                           f"needs {n.pages} pages ({tokens} tokens at page size {self.page_size}), "
                           f"pool has {self.pages.total} in total")
        if n.slots > self.slots.total:
            return Refusal(RefusalKind.INFEASIBLE, f"needs {n.slots} slots, pool has {self.slots.total}")
        short = []
        if n.pages > self.pages.num_available:
            short.append(f"needs {n.pages} pages, {self.pages.num_available} available "
                         f"({self.pages.num_free} free, {self.pages.num_reserved} reserved)")
        if n.slots > self.slots.num_free:
            short.append(f"needs {n.slots} slot, {self.slots.num_free} free")
        if short:
            return Refusal(RefusalKind.SHORT_NOW, "; ".join(short))
        return None

    def prove_backfill(self, head_tokens: int, donors: Iterable[int], borrower_tokens: int) -> bool:
        """True iff the borrower fits now and, with the borrower holding its complete reservation
        until it ends, the donor set finishing frees enough for the head to enter from root."""
        if self.refusal(borrower_tokens) is not None:
            return False
        head, borrower = self.need(head_tokens), self.need(borrower_tokens)
        if head_tokens > self.max_model_len or head.pages > self.pages.total:
            return False
        pages = self.pages.num_available - borrower.pages
        slots = self.slots.num_free - borrower.slots
        for owner_id in set(donors):
            h = self._holdings.get(owner_id)
            if h is None:
                raise InvariantError(f"donor {owner_id} holds no resources")
            # NOTE: a page another owner also maps (a checkpoint) is not freed by the donor finishing.
            pages += sum(1 for p in h.table.pages if self.pages.refcount(p) == 1)
            pages += h.table.reservation.remaining
            slots += 1
        return head.pages <= pages and head.slots <= slots

    # ---- topology changes ----
    def acquire(self, owner_id: int, tokens: int) -> Holding:
        if owner_id in self._holdings:
            raise InvariantError(f"owner {owner_id} already holds resources")
        why = self.refusal(tokens)
        if why is not None:
            raise InvariantError(f"acquire without feasibility: {why.reason}")
        n = self.need(tokens)
        reservation = self.pages.reserve(n.pages)
        slot = self.slots.alloc(owner_id)
        h = Holding(owner_id, BlockTable(self.page_size, reservation), slot, tokens)
        self._holdings[owner_id] = h
        self.revision += 1
        return h

    def release(self, owner_id: int) -> tuple[list[int], int]:
        """Unmap every page, close the reservation, free the slot; return (freed pages, slot)."""
        h = self._holdings.pop(owner_id, None)
        if h is None:
            raise InvariantError(f"owner {owner_id} holds no resources")
        freed = h.table.release(self.pages)
        self.slots.free(h.slot, owner_id)
        self.revision += 1
        return freed, h.slot

    def holding(self, owner_id: int) -> Holding:
        try:
            return self._holdings[owner_id]
        except KeyError:
            raise InvariantError(f"owner {owner_id} holds no resources") from None

    def check(self) -> None:
        self.pages.check()
        self.slots.check()
        mapped: dict[int, int] = {}
        for h in self._holdings.values():
            if h.table.reservation.closed:
                raise InvariantError(f"owner {h.owner_id} holds a closed reservation")
            if h.pages_held != pages_for(h.reserved_tokens, self.page_size):
                raise InvariantError(f"owner {h.owner_id} holds {h.pages_held} pages, "
                                     f"reservation is {pages_for(h.reserved_tokens, self.page_size)}")
            if self.slots.owner(h.slot) != h.owner_id:
                raise InvariantError(f"slot {h.slot} is not owned by {h.owner_id}")
            for p in h.table.pages:
                mapped[p] = mapped.get(p, 0) + 1
        for p, n in mapped.items():
            if self.pages.refcount(p) != n:
                raise InvariantError(f"page {p} has refcount {self.pages.refcount(p)}, mapped {n} times")
        if sum(1 for _ in mapped) != self.pages.num_owned:
            raise InvariantError(f"{self.pages.num_owned} pages owned, {len(mapped)} mapped by holdings")
        reserved = sum(h.table.reservation.remaining for h in self._holdings.values())
        if reserved != self.pages.num_reserved:
            raise InvariantError(f"holdings reserve {reserved} pages, pool says {self.pages.num_reserved}")
        if len(self._holdings) != self.slots.num_owned:
            raise InvariantError(f"{len(self._holdings)} holdings but {self.slots.num_owned} slots owned")
