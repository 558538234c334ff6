"""A mapping that forgets its least recently used keys: bookkeeping keyed by what clients
choose (reject budgets, log and notice throttles, the writer's device ids) stays flat in
memory whatever names arrive."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["MAX_KEYS", "Bounded"]

#: Keys a Bounded holds unless told otherwise.
MAX_KEYS = 50_000

K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """A dict that keeps at most `limit` keys, dropping the least recently used."""

    def __init__(self, limit: int = MAX_KEYS) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V) -> V:
        value = self._items.get(key)
        if value is None:
            return default
        self._items.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def find(self, key: K) -> V | None:
        """The value of `key` (now the most recently used), or None."""
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def clear(self) -> None:
        self._items.clear()

    def ordered_keys(self) -> list[K]:
        """Every key, least recently used first (their order unchanged)."""
        return list(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
