"""SessionIndex: session key -> the checkpoint its latest completion published.

A session key is only a lookup hint (architecture.md §4): it owns no continuation, and a request
with a session key is admitted exactly like any other. A binding is replaced only by a completion
with a later `publication_order` (the order requests entered the Engine), so a slow earlier turn
that finishes last never overwrites the later turn's checkpoint.

    key          checkpoint   publication_order
    "chat-1"     17           42
    "agent-7"    9            38
"""
from __future__ import annotations

from typing import NamedTuple


class Binding(NamedTuple):
    checkpoint_id: int
    publication_order: int


class SessionIndex:
    def __init__(self) -> None:
        self._by_key: dict[str, Binding] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def lookup(self, key: str) -> Binding | None:
        return self._by_key.get(key)

    def bind(self, key: str, checkpoint_id: int, publication_order: int) -> tuple[bool, int | None]:
        """Bind `key` if this completion is newer than the binding. Returns (bound, replaced id)."""
        old = self._by_key.get(key)
        if old is not None and old.publication_order >= publication_order:
            return False, None
        self._by_key[key] = Binding(checkpoint_id, publication_order)
        return True, old.checkpoint_id if old is not None else None

    def forget_checkpoint(self, checkpoint_id: int) -> list[str]:
        """The checkpoint is gone (evicted or deleted): drop the keys bound to it."""
        keys = [k for k, b in self._by_key.items() if b.checkpoint_id == checkpoint_id]
        for k in keys:
            del self._by_key[k]
        return keys

    def keys_of(self, checkpoint_id: int) -> list[str]:
        return [k for k, b in self._by_key.items() if b.checkpoint_id == checkpoint_id]

    def clear(self) -> None:
        self._by_key.clear()
