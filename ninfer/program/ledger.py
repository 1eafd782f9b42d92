"""Resource ledger: feasibility, reservations and ownership of KV pages and StateImage slots.

One ledger per Program. A sequence's `Holding` is everything it owns: a block table (mapped pages
plus the reservation of its complete growth), one StateImage slot and, when it may publish a
checkpoint at its terminal step, one publication slot. A `CheckpointHolding` is what one published,
immutable checkpoint owns: one slot and one reference on each KV page of its prefix (a host replica
owns neither). `resource_revision` advances on every topology change (acquire, release, capture,
retain, delete, offload), so a sealed plan can detect staleness.

    pages  +--------------------------+----------------------+--------------------+
           | mapped by holdings        | reserved by holdings | available           |
           | (refcount >= 1)           | (not yet mapped)     | (new plans count    |
           |                           |                      |  only on these)     |
           +--------------------------+----------------------+--------------------+
    slots  +-------------------------+-----------------------+------------------------+
           | 1 or 2 per holding       | 1 per device checkpoint | free                  |
           +-------------------------+-----------------------+------------------------+
    free + owned == total for both; every holding's pages + remaining reservation
    == pages_for(its reserved tokens); a page's refcount == the holdings and checkpoints mapping it.

    A continuation of checkpoint C (frontier F) maps C's full pages (shared, one more reference each;
    the Program says how many) and draws everything else from its own reservation, including a
    private copy of the partial page F % page_size != 0: it never writes a page or slot a checkpoint owns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from ninfer.program.block_table import BlockTable, pages_for
from ninfer.program.page_pool import PagePool
from ninfer.program.slot_pool import SlotPool
from ninfer.contract.program import InvariantError, Refusal, RefusalKind


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
    pub_slot: int | None = None            # publication slot (terminal checkpoint), if asked; owned by
                                           # the Holding object itself (the StateImage slot by owner_id)

    @property
    def pages_held(self) -> int:
        return len(self.table.pages) + self.table.reservation.remaining

    @property
    def num_slots(self) -> int:
        return 1 + (self.pub_slot is not None)


@dataclass(eq=False)
class CheckpointHolding:
    checkpoint_id: int
    frontier: int
    slot: int | None                       # None: host replica (owns no device resource)
    pages: list[int]                       # pages_for(frontier) page ids, shared by reference
    pins: int = 0                          # in use as the source of a running transition

    @property
    def on_device(self) -> bool:
        return self.slot is not None


class ResourceLedger:
    def __init__(self, num_pages: int, page_size: int, num_slots: int, max_model_len: int) -> None:
        self.pages = PagePool(num_pages)
        self.slots = SlotPool(num_slots)
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.revision = 0
        self._holdings: dict[int, Holding] = {}
        self._checkpoints: dict[int, CheckpointHolding] = {}

    # ---- pure planning ----
    def need(self, tokens: int, publication: bool = False, shared_pages: int = 0) -> Need:
        return Need(tokens, pages_for(tokens, self.page_size) - shared_pages, 1 + int(publication))

    def refusal(self, tokens: int, publication: bool = False, shared_pages: int = 0) -> Refusal | None:
        """Why a sequence growing to `tokens` positions cannot be acquired now (None: it can)."""
        n = self.need(tokens, publication, shared_pages)
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

    def prove_backfill(self, head_tokens: int, donors: Iterable[int], borrower_tokens: int,
                       head_publication: bool = False, borrower_publication: bool = False) -> bool:
        """True iff the borrower fits now and, with the borrower holding its complete reservation
        until it ends, the donor set finishing frees enough for the head to enter from root with
        every inactive checkpoint released (they are releasable, a pinned source is not)."""
        if self.refusal(borrower_tokens, borrower_publication) is not None:
            return False
        head, borrower = self.need(head_tokens, head_publication), self.need(borrower_tokens, borrower_publication)
        if head_tokens > self.max_model_len or head.pages > self.pages.total or head.slots > self.slots.total:
            return False
        donor_set = set(donors)
        for owner_id in donor_set:
            if owner_id not in self._holdings:
                raise InvariantError(f"donor {owner_id} holds no resources")
        pages = self.pages.num_available - borrower.pages
        slots = self.slots.num_free - borrower.slots
        drop: dict[int, int] = {}            # references that go away: donors and unpinned checkpoints
        for h in self._holdings.values():
            if h.owner_id in donor_set:
                pages += h.table.reservation.remaining
                slots += h.num_slots
                for p in h.table.pages:
                    drop[p] = drop.get(p, 0) + 1
        for c in self._checkpoints.values():
            if not c.pins and c.on_device:
                slots += 1
                for p in c.pages:
                    drop[p] = drop.get(p, 0) + 1
        # NOTE: a page any other owner (a non-donor sequence, a pinned source) maps is not freed.
        pages += sum(1 for p, n in drop.items() if n == self.pages.refcount(p))
        return head.pages <= pages and head.slots <= slots

    def victims(self, need: Need, candidates: Iterable[int], keep: Iterable[int] = ()) -> list[int] | None:
        """The shortest prefix of `candidates` (inactive checkpoints, least valuable first) whose
        eviction makes `need` fit now; [] when it fits already; None when even all do not suffice."""
        keep = set(keep)
        pages, slots = self.pages.num_available, self.slots.num_free
        if need.pages <= pages and need.slots <= slots:
            return []
        drop: dict[int, int] = {}
        chosen: list[int] = []
        for cid in candidates:
            c = self._checkpoints.get(cid)
            if c is None or cid in keep or c.pins or not c.on_device or cid in chosen:
                continue
            chosen.append(cid)
            slots += 1
            for p in c.pages:
                drop[p] = drop.get(p, 0) + 1
                if drop[p] == self.pages.refcount(p):
                    pages += 1
            if need.pages <= pages and need.slots <= slots:
                return chosen
        return None

        # ---- topology changes ----
    def acquire(self, owner_id: int, tokens: int, *, publication: bool = False,
                shared_pages: Iterable[int] = ()) -> Holding:
        """Reserve a sequence's complete growth. `shared_pages`: a source checkpoint's full pages,
        mapped first (one more reference each) and not drawn from the reservation."""
        if owner_id in self._holdings:
            raise InvariantError(f"owner {owner_id} already holds resources")
        shared = list(shared_pages)
        why = self.refusal(tokens, publication, len(shared))
        if why is not None:
            raise InvariantError(f"acquire without feasibility: {why.reason}")
        n = self.need(tokens, publication, len(shared))
        reservation = self.pages.reserve(n.pages)
        slot = self.slots.alloc(owner_id)
        h = Holding(owner_id, BlockTable(self.page_size, reservation), slot, tokens)
        if publication:
            h.pub_slot = self.slots.alloc(h)
        self.pages.share(shared)
        h.table.pages.extend(shared)
        self._holdings[owner_id] = h
        self.revision += 1
        return h

    def release(self, owner_id: int) -> tuple[list[int], int]:
        """Unmap every page, close the reservation, free the slot(s); return (freed pages, slot)."""
        h = self._holdings.pop(owner_id, None)
        if h is None:
            raise InvariantError(f"owner {owner_id} holds no resources")
        freed = h.table.release(self.pages)
        self.slots.free(h.slot, owner_id)
        if h.pub_slot is not None:
            self.slots.free(h.pub_slot, h)
        self.revision += 1
        return freed, h.slot

    # ---- checkpoints ----
    def checkpoint(self, checkpoint_id: int) -> CheckpointHolding:
        try:
            return self._checkpoints[checkpoint_id]
        except KeyError:
            raise InvariantError(f"unknown checkpoint {checkpoint_id}") from None

    @property
    def checkpoints(self) -> tuple[CheckpointHolding, ...]:
        return tuple(self._checkpoints.values())

    def _new_checkpoint(self, checkpoint_id: int, frontier: int, pages: list[int]) -> CheckpointHolding:
        if checkpoint_id in self._checkpoints:
            raise InvariantError(f"checkpoint {checkpoint_id} published twice")
        c = CheckpointHolding(checkpoint_id, frontier, None, pages)
        self._checkpoints[checkpoint_id] = c
        return c

    def capture(self, owner_id: int, checkpoint_id: int, frontier: int) -> CheckpointHolding:
        """Publish a checkpoint of a live sequence at `frontier`: a new slot (the caller copies the
        state into it) and a shared reference on the sequence's pages of [0, frontier)."""
        h = self.holding(owner_id)
        n = pages_for(frontier, self.page_size)
        if not (1 <= frontier and n <= len(h.table.pages)):
            raise InvariantError(f"capture of owner {owner_id} at {frontier} beyond its mapped pages")
        if self.slots.num_free < 1:
            raise InvariantError("capture without a free slot")
        pages = h.table.pages[:n]
        c = self._new_checkpoint(checkpoint_id, frontier, list(pages))
        c.slot = self.slots.alloc(c)
        self.pages.share(pages)
        self.revision += 1
        return c

    def retain(self, owner_id: int, checkpoint_id: int, frontier: int, use_pub_slot: bool
               ) -> tuple[CheckpointHolding, list[int]]:
        """Terminal step: the checkpoint takes over the publication slot (or the sequence's own
        slot) and one reference on the pages of [0, frontier); the rest of the holding is released.
        Returns the checkpoint and the pages that became free."""
        h = self.holding(owner_id)
        n = pages_for(frontier, self.page_size)
        if not (1 <= frontier and n <= len(h.table.pages)):
            raise InvariantError(f"retain of owner {owner_id} at {frontier} beyond its mapped pages")
        if use_pub_slot and h.pub_slot is None:
            raise InvariantError(f"owner {owner_id} has no publication slot")
        pages = h.table.pages[:n]
        c = self._new_checkpoint(checkpoint_id, frontier, list(pages))
        self.pages.share(pages)
        own, pub = (h.slot, h.owner_id), (h.pub_slot, h)
        (kept, kept_owner), (other, other_owner) = (pub, own) if use_pub_slot else (own, pub)
        c.slot = self.slots.hand_over(kept, kept_owner, c)
        if other is not None:
            self.slots.free(other, other_owner)
        del self._holdings[owner_id]
        freed = h.table.release(self.pages)
        self.revision += 1
        return c, freed

    def delete_checkpoint(self, checkpoint_id: int) -> list[int]:
        """Drop a checkpoint (device or host); return the pages that became free."""
        c = self.checkpoint(checkpoint_id)
        if c.pins:
            raise InvariantError(f"deleting checkpoint {checkpoint_id} while it is in use")
        del self._checkpoints[checkpoint_id]
        freed = self._unplace(c)
        self.revision += 1
        return freed

    def offload(self, checkpoint_id: int) -> list[int]:
        """The checkpoint keeps only its host replica (the caller copied it): free slot and pages."""
        c = self.checkpoint(checkpoint_id)
        if c.pins or not c.on_device:
            raise InvariantError(f"offloading checkpoint {checkpoint_id}: pinned or already on host")
        freed = self._unplace(c)
        self.revision += 1
        return freed

    def _unplace(self, c: CheckpointHolding) -> list[int]:
        if not c.on_device:
            return []
        freed = self.pages.unref(c.pages)
        self.slots.free(c.slot, c)
        c.slot, c.pages = None, []
        return freed

    def pin(self, checkpoint_id: int) -> CheckpointHolding:
        c = self.checkpoint(checkpoint_id)
        c.pins += 1
        return c

    def unpin(self, checkpoint_id: int) -> None:
        c = self.checkpoint(checkpoint_id)
        if c.pins < 1:
            raise InvariantError(f"checkpoint {checkpoint_id} unpinned more often than pinned")
        c.pins -= 1

    def inactive_pages(self) -> int:
        """Pages only checkpoints map (no active sequence): what releasing inactive cache frees."""
        live = {p for h in self._holdings.values() for p in h.table.pages}
        return len({p for c in self._checkpoints.values() for p in c.pages} - live)

    @property
    def owner_ids(self) -> frozenset[int]:
        return frozenset(self._holdings)

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
            if h.pub_slot is not None and self.slots.owner(h.pub_slot) is not h:
                raise InvariantError(f"publication slot {h.pub_slot} is not owned by {h.owner_id}")
            for p in h.table.pages:
                mapped[p] = mapped.get(p, 0) + 1
        for c in self._checkpoints.values():
            if c.on_device:
                if self.slots.owner(c.slot) is not c:
                    raise InvariantError(f"slot {c.slot} is not owned by checkpoint {c.checkpoint_id}")
                if len(c.pages) != pages_for(c.frontier, self.page_size):
                    raise InvariantError(f"checkpoint {c.checkpoint_id} maps {len(c.pages)} pages "
                                         f"for frontier {c.frontier}")
            elif c.pages:
                raise InvariantError(f"host checkpoint {c.checkpoint_id} still maps device pages")
            for p in c.pages:
                mapped[p] = mapped.get(p, 0) + 1
        for p, n in mapped.items():
            if self.pages.refcount(p) != n:
                raise InvariantError(f"page {p} has refcount {self.pages.refcount(p)}, mapped {n} times")
        if sum(1 for _ in mapped) != self.pages.num_owned:
            raise InvariantError(f"{self.pages.num_owned} pages owned, {len(mapped)} mapped by holdings "
                                 f"and checkpoints")
        reserved = sum(h.table.reservation.remaining for h in self._holdings.values())
        if reserved != self.pages.num_reserved:
            raise InvariantError(f"holdings reserve {reserved} pages, pool says {self.pages.num_reserved}")
        owners = sum(h.num_slots for h in self._holdings.values()) + sum(
            c.on_device for c in self._checkpoints.values())
        if owners != self.slots.num_owned:
            raise InvariantError(f"holdings and checkpoints own {owners} slots, pool says {self.slots.num_owned}")
