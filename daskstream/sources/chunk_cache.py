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
from collections import OrderedDict
from collections.abc import Hashable, Iterator

import numpy as np

_active = threading.local()
_lock = threading.Lock()
_kept: OrderedDict[Hashable, np.ndarray] = OrderedDict()


def capacity() -> int:
    """Decoded chunks one process keeps: four per usable CPU (a block's two halo chunks and its two ends)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return 4 * cpus


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
    if not active():
        return None
    with _lock:
        chunk = _kept.get(key)
        if chunk is not None:
            _kept.move_to_end(key)
        return chunk


def keep(key: Hashable, chunk: np.ndarray) -> None:
    """Keep a decoded chunk (read-only to whoever takes it), when keeping is active."""
    if not active():
        return
    with _lock:
        _kept[key] = chunk
        _kept.move_to_end(key)
        while len(_kept) > capacity():
            _kept.popitem(last=False)


def forget() -> None:
    """Drop every kept chunk (their sources were reopened or changed)."""
    with _lock:
        _kept.clear()


os.register_at_fork(after_in_child=forget)

__all__ = ["capacity", "forget", "keep", "keeping_decoded_chunks", "kept", "on_surface"]
