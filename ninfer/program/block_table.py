"""Block table: one sequence's map from logical KV pages to physical page ids.

Logical page j holds token positions [j * page_size, (j + 1) * page_size). The table grows by
drawing pages from the sequence's reservation; it never shrinks while the sequence lives (a
rolled-back frontier keeps its pages, they are still inside the reservation).
"""
from __future__ import annotations

import torch

from ninfer.program.page_pool import PagePool, PageReservation


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class BlockTable:
    def __init__(self, page_size: int, reservation: PageReservation) -> None:
        self.page_size = page_size
        self.pages: list[int] = []
        self.reservation = reservation

    @property
    def capacity(self) -> int:
        """Token positions the mapped pages can hold."""
        return len(self.pages) * self.page_size

    def ensure(self, num_tokens: int) -> list[int]:
        """Map enough pages for positions [0, num_tokens); return the pages newly mapped."""
        need = pages_for(num_tokens, self.page_size) - len(self.pages)
        if need <= 0:
            return []
        new = self.reservation.take(need)
        self.pages.extend(new)
        return new

    def release(self, pool: PagePool) -> list[int]:
        """Unmap every page and close the reservation; return the pages that became free."""
        freed = pool.unref(self.pages)
        self.pages = []
        self.reservation.close()
        return freed

    def as_tensor(self, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Page ids as int32 `[width]`, padded with 0 (padding is never read: lengths bound reads)."""
        out = torch.zeros(width, dtype=torch.int32)
        out[: len(self.pages)] = torch.tensor(self.pages, dtype=torch.int32)
        return out.to(device)
