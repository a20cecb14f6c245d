"""Per-process cache of open file handles.

Sources travel through task graphs as plain descriptions (path, dataset,
dtype...). Each process opens a file the first time one of its tasks reads it
and keeps the handle for the tasks that follow; a forked child starts with an
empty cache, so no handle is ever shared between processes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

_handles: dict[Hashable, Any] = {}
_lock = threading.RLock()  # an opener may open another handle (an HDF5 chunk index opens its file)


def cached_handle(key: Hashable, opener: Callable[[], Any]) -> Any:
    """Return this process's handle for ``key``, opening it with ``opener`` once."""
    handle = _handles.get(key)
    if handle is None:
        with _lock:
            handle = _handles.get(key)
            if handle is None:
                handle = _handles[key] = opener()
    return handle


def forget_handles() -> None:
    """Close every file this process keeps open for reading sources.

    Reads reopen what they need. Call it before rewriting, in the same
    process, an HDF5 file that daskstream has read: HDF5 refuses to truncate a
    file that is still open.
    """
    from daskstream.sources.chunk_cache import forget

    forget()
    with _lock:
        handles = list(_handles.values())
        _handles.clear()
    for handle in handles:
        close = getattr(handle, "close", None)
        if close is not None:
            close()


def _clear_in_child() -> None:
    # The parent's handles (and possibly-held lock) must not be used after fork.
    global _lock
    _handles.clear()
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_clear_in_child)
