"""Bytes sources have delivered in this process: the figure a read meter adds up.

Every :meth:`daskstream.Source.read` adds the bytes it returns here. In a
worker process that a ``processes`` session starts, :func:`count_into` points
the count at a counter the session shares, since the pool's processes (and
their own counts) end with each computation. How the counts of many processes
are added up over a computation is :mod:`daskstream.runtime.metering`'s job.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_bytes_read_here = 0
# In a worker process of a daskstream "processes" session: the session's shared counter.
_shared_counter: Any = None


def record_read(nbytes: int) -> None:
    """Add ``nbytes`` read from a source to this process's count (or its session's shared one)."""
    global _bytes_read_here
    shared = _shared_counter
    if shared is not None:
        with shared.get_lock():
            shared.value += nbytes
        return
    with _lock:
        _bytes_read_here += nbytes


def bytes_read_here() -> int:
    """Bytes sources have delivered in this process since it started (runs on workers too)."""
    return _bytes_read_here


def count_into(counter: Any) -> None:
    """Count this process's reads into ``counter``, a ``multiprocessing.Value`` of a session's pool."""
    global _shared_counter
    _shared_counter = counter
