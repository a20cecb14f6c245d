"""Per-process cache of open file handles, bounded, with one open at a time per file.

Sources travel through task graphs as plain descriptions (path, dataset,
dtype...). Each process opens a file the first time one of its tasks reads it
and keeps the handle for the tasks that follow; a forked child starts with an
empty cache, so no handle is ever shared between processes.

As xarray's ``CachingFileManager`` does, the cache is a least-recently-used
table of at most ``daskstream.sources.max-open-files`` handles, and each key
has a lock of its own: a slow open (a remote store, a large HDF5 file's
metadata) holds up only the tasks that need that same file, and the table's
own lock is never held while a file opens. A handle pushed out of the table
is not closed under a task that may still be reading through it: the table
lets go of it, and it closes once nothing uses it (each version of a
rewritten file is a new key, so old versions leave instead of piling up).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

from daskstream import config
from daskstream.caches import LeastRecentlyUsed
from daskstream.sources.chunk_cache import forget

_handles: LeastRecentlyUsed[Any] = LeastRecentlyUsed(lambda: config.setting("sources.max-open-files"))
_lock = threading.Lock()  # guards the per-key locks; never held while a file opens
_opening: dict[Hashable, threading.Lock] = {}


def cached_handle(key: Hashable, opener: Callable[[], Any]) -> Any:
    """Return this process's handle for ``key``, opening it with ``opener`` once.

    ``opener`` runs under ``key``'s own lock only, so it may open other
    handles (an HDF5 chunk index opens its file) and other keys open meanwhile.
    """
    handle = _handles.get(key)
    if handle is not None:
        return handle
    with _lock:
        key_lock = _opening.setdefault(key, threading.Lock())
    with key_lock:
        handle = _handles.get(key)
        if handle is not None:  # opened by the thread this one waited for
            return handle
        handle = opener()
        # Past the bound, the least recently used is let go of; it closes when no task holds it any more.
        _handles.put(key, handle)
        with _lock:
            _opening.pop(key, None)
    return handle


def open_handle_count() -> int:
    """Handles this process's cache holds now."""
    return len(_handles)


def forget_handles() -> None:
    """Close every file this process keeps open for reading sources.

    Reads reopen what they need. Call it, with no computation running in
    this process, before rewriting an HDF5 file that daskstream has read:
    HDF5 refuses to truncate a file that is still open.
    """

    forget()
    handles = _handles.clear()
    for handle in handles:
        close = getattr(handle, "close", None)
        if close is not None:
            close()


def _clear_in_child() -> None:
    # The parent's handles (and possibly-held locks, the cache's own among them) must not be used after fork.
    global _handles, _lock, _opening
    _handles = LeastRecentlyUsed(lambda: config.setting("sources.max-open-files"))
    _lock = threading.Lock()
    _opening = {}


os.register_at_fork(after_in_child=_clear_in_child)
