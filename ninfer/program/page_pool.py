"""KV page pool: physical page ids with reference counts, and page reservations.

A page is one KV page of `page_size` token positions (its backing lives in `PagedKVStore`; this
module only does the bookkeeping). Pages are handed out lowest id first, so tests can assert exact
page ids. A page's reference count is the number of owners (a continuation's block table, an
immutable checkpoint) that map it; it returns to the free list when the count reaches zero.

A reservation is a promise of pages that are not yet allocated: an Active sequence reserves its
complete growth (prompt + max output + lookahead) at materialization and draws pages from its
reservation as its frontier grows, so growth can never fail.

    page ids   0 ........................................................ total-1
              +----------------+---------------------------+-----------------+
              | owned          | free, reserved            | free, available |
              | refcount >= 1  | promised to reservations  | plannable now   |
              +----------------+---------------------------+-----------------+
    owned + free == total               reserved <= free
    available = free - reserved         (the only number a new plan may count on)
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable

from ninfer.contract.program import InvariantError


class PagePool:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.total = num_pages
        self._free: list[int] = list(range(num_pages))     # a min-heap of free page ids
        self._refcount = [0] * num_pages
        self._reserved = 0

    # ---- read-only summary ----
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_owned(self) -> int:
        return self.total - len(self._free)

    @property
    def num_reserved(self) -> int:
        return self._reserved

    @property
    def num_available(self) -> int:
        return len(self._free) - self._reserved

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    # ---- reservations ----
    def reserve(self, n: int) -> "PageReservation":
        """Promise `n` pages to one owner; raises InvariantError if they are not available."""
        if n < 0:
            raise ValueError(f"cannot reserve {n} pages")
        if n > self.num_available:
            raise InvariantError(f"reserve({n}) with only {self.num_available} pages available")
        self._reserved += n
        return PageReservation(self, n)

    # ---- allocation and references ----
    def _alloc_reserved(self, n: int) -> list[int]:
        if n > self._reserved or n > len(self._free):
            raise InvariantError(f"allocating {n} reserved pages, reserved {self._reserved}, free {len(self._free)}")
        self._reserved -= n
        pages = [heapq.heappop(self._free) for _ in range(n)]
        for p in pages:
            self._refcount[p] = 1
        return pages

    def share(self, pages: Iterable[int]) -> None:
        """Add one reference to already owned pages (a second owner maps them)."""
        for p in pages:
            if self._refcount[p] < 1:
                raise InvariantError(f"sharing page {p} which is free")
            self._refcount[p] += 1

    def unref(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference from each page; return the pages that became free."""
        freed = []
        for p in pages:
            if self._refcount[p] < 1:
                raise InvariantError(f"releasing page {p} which is already free")
            self._refcount[p] -= 1
            if self._refcount[p] == 0:
                heapq.heappush(self._free, p)
                freed.append(p)
        return freed

    def check(self) -> None:
        """`free + owned == total`, refcounts consistent with the free list, reserved <= free."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise InvariantError("a page is on the free list twice")
        owned = sum(1 for c in self._refcount if c > 0)
        if any(c < 0 for c in self._refcount):
            raise InvariantError("negative page reference count")
        if any(self._refcount[p] != 0 for p in free):
            raise InvariantError("a free page has owners")
        if len(free) + owned != self.total:
            raise InvariantError(f"pages: free {len(free)} + owned {owned} != total {self.total}")
        if not (0 <= self._reserved <= len(free)):
            raise InvariantError(f"pages: reserved {self._reserved} exceeds free {len(free)}")


class PageReservation:
    """Pages promised to one owner; `take` turns promised pages into owned ones."""

    def __init__(self, pool: PagePool, n: int) -> None:
        self._pool = pool
        self.remaining = n
        self.closed = False

    def take(self, n: int) -> list[int]:
        if self.closed:
            raise InvariantError("take() from a closed reservation")
        if n > self.remaining:
            raise InvariantError(f"take({n}) exceeds the reservation's remaining {self.remaining} pages")
        pages = self._pool._alloc_reserved(n)
        self.remaining -= n
        return pages

    def close(self) -> int:
        """Return the unused part of the promise to the pool; return how many pages that was."""
        if self.closed:
            return 0
        n, self.remaining, self.closed = self.remaining, 0, True
        self._pool._reserved -= n
        return n
