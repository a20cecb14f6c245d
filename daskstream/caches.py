"""One bounded cache for everything daskstream keeps in a process: open files, decoded chunks, shard indexes,
blocks of an object read ahead.

>>> kept = LeastRecentlyUsed(2)
>>> kept.put("a", 1); kept.put("b", 2); kept.get("a"); kept.put("c", 3)
1
>>> sorted(kept.keys())
['a', 'c']
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

Value = TypeVar("Value")


class LeastRecentlyUsed(Generic[Value]):
    """A mapping safe to share between threads that keeps at most ``most`` (the sum of ``size`` over its
    values), dropping the least recently used first.

    Parameters
    ----------
    most
        How much it keeps: a number, or a function giving it (read at every
        ``put``, so a setting changed meanwhile counts).
    size
        What one value counts for (default: 1, so ``most`` counts values).
    """

    def __init__(self, most: int | Callable[[], int], size: Callable[[Value], int] | None = None) -> None:
        self._most = most
        self._size = size
        self._values: OrderedDict[Hashable, Value] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Value | None:
        """The value kept under ``key`` (now the most recently used), or ``None``."""
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._values

    def put(self, key: Hashable, value: Value) -> None:
        """Keep ``value`` under ``key``, then drop the least recently used values past the bound."""
        most = self._most() if callable(self._most) else self._most
        with self._lock:
            if key in self._values:
                self._held -= self._count(self._values.pop(key))
            self._values[key] = value
            self._held += self._count(value)
            while len(self._values) > 1 and self._held > most:
                _, dropped = self._values.popitem(last=False)
                self._held -= self._count(dropped)
            if self._held > most:  # one value larger than the bound alone is not kept either
                self._values.clear()
                self._held = 0

    def clear(self) -> list[Value]:
        """Drop everything; what was kept, for the caller to close."""
        with self._lock:
            values = list(self._values.values())
            self._values.clear()
            self._held = 0
            return values

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._values)

    def __iter__(self) -> Iterator[Hashable]:
        """The keys kept now (a copy: other threads may change what is kept meanwhile)."""
        return iter(self.keys())

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def _count(self, value: Value) -> int:
        return 1 if self._size is None else self._size(value)


__all__ = ["LeastRecentlyUsed"]
