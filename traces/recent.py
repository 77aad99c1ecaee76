"""A bounded memory of recent entries per key, newest first: what the prompt builder
and the virtual engine's prompt hasher keep of a session's last turns to reuse their
shared prefix. See docs/engine-model.md."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RecentByKey(Generic[K, V]):
    """Up to ``per_key`` entries per key, newest first, and at most ``max_bytes`` of
    them in all (``size`` of an entry); past that, the least recently added key's
    entries go first."""

    def __init__(self, per_key: int, max_bytes: int, size: Callable[[V], int]) -> None:
        self.per_key = per_key
        self.max_bytes = max_bytes
        self._size = size
        self._entries: OrderedDict[K, list[V]] = OrderedDict()
        self.held_bytes = 0

    def get(self, key: K) -> Sequence[V]:
        return self._entries.get(key, ())

    def add(self, key: K, entry: V) -> None:
        size = self._size
        entries = self._entries.pop(key, [])
        entries.insert(0, entry)
        self.held_bytes += size(entry)
        while len(entries) > self.per_key:
            self.held_bytes -= size(entries.pop())
        self._entries[key] = entries
        while self.held_bytes > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self.held_bytes -= sum(size(e) for e in old)
