"""Decoded storage chunks kept for the halo of the next block.

A block that reads its halo straight from chunked storage decodes, for a
halo of a row or two, the whole storage chunk beyond its edge, which the
neighbouring block decodes again as its own first chunk. While a kernel reads
a haloed region (:func:`keeping_decoded_chunks`), the chunk readers keep the
chunks they decode in a small per-process cache and take them from it
when a neighbour needs them, so a storage chunk shared by two blocks is
decoded once when the two run one after the other in a process. Only chunks
on the surface of what a block reads are kept (those its neighbours read
too), at most four per usable CPU, least recently used first out.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Hashable, Iterator

import numpy as np
from dask.system import cpu_count

from daskstream.caches import LeastRecentlyUsed

_active = threading.local()


def capacity() -> int:
    """Decoded chunks one process keeps: four per usable CPU (a block's two halo chunks and its two ends)."""
    return 4 * max(1, cpu_count())  # dask's count: affinity and cgroup quota counted


_kept: LeastRecentlyUsed[np.ndarray] = LeastRecentlyUsed(capacity)


@contextlib.contextmanager
def keeping_decoded_chunks() -> Iterator[None]:
    """While active in this thread, chunk readers keep what they decode and reuse what is kept."""
    depth = getattr(_active, "depth", 0)
    _active.depth = depth + 1
    try:
        yield
    finally:
        _active.depth = depth


def active() -> bool:
    return getattr(_active, "depth", 0) > 0


def on_surface(grid: tuple[int, ...], first: tuple[int, ...], last: tuple[int, ...]) -> bool:
    """Whether storage chunk ``grid`` is one of the two at either end, along an axis the box spans several
    chunks of, of the chunks a haloed box touches: the halo's chunk and the block's own end chunk, both of
    which the neighbouring block reads too (a box one chunk wide along an axis has no ends there).

    >>> on_surface((3, 0), first=(2, 0), last=(7, 0)), on_surface((4, 0), first=(2, 0), last=(7, 0))
    (True, False)
    >>> on_surface((4, 2), first=(2, 0), last=(7, 5)), on_surface((0, 0), first=(0, 0), last=(0, 0))
    (False, True)
    """
    spanned = [(g, a, b) for g, a, b in zip(grid, first, last) if a < b]
    return not spanned or any(g <= a + 1 or g >= b - 1 for g, a, b in spanned)


def kept(key: Hashable) -> np.ndarray | None:
    """The decoded chunk kept under ``key``, when keeping is active and it is there."""
    return _kept.get(key) if active() else None


def keep(key: Hashable, chunk: np.ndarray) -> None:
    """Keep a decoded chunk (read-only to whoever takes it), when keeping is active."""
    if active():
        _kept.put(key, chunk)


def forget() -> None:
    """Drop every kept chunk (their sources were reopened or changed)."""
    _kept.clear()


def _fresh_in_child() -> None:
    # The parent's chunks go, and with them a lock another of its threads may have held at the fork.
    global _kept
    _kept = LeastRecentlyUsed(capacity)


os.register_at_fork(after_in_child=_fresh_in_child)

__all__ = ["capacity", "forget", "keep", "keeping_decoded_chunks", "kept", "on_surface"]
