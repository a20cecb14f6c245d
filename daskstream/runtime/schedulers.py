"""Which scheduler runs a computation now: the one place that answers it.

A daskstream session, a distributed ``Client`` made the default, dask's
``scheduler`` setting, or dask's default threads: the planner, the store,
the read meter, the tuner and the HDF5 lock advice all ask here.

>>> scheduler_kind()
'threads'
>>> import dask
>>> with dask.config.set(scheduler="sync"):
...     scheduler_kind()
'sync'
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import dask.local
import dask.multiprocessing
import dask.threaded
from dask.base import get_scheduler

if TYPE_CHECKING:
    from daskstream.runtime.session import Session

__all__ = ["active_client", "active_get", "current", "scheduler_kind", "uses_processes"]

# Active sessions, innermost last. dask's scheduler setting is process-wide, so
# the session that set it is too: a module-level stack rather than a contextvar.
_active: list[Session] = []
_active_lock = threading.Lock()


def current() -> Session | None:
    """The innermost active :func:`daskstream.session`, or ``None`` outside any.

    Examples
    --------
    >>> current() is None
    True
    """
    with _active_lock:
        return _active[-1] if _active else None


def enter(session: Session) -> None:
    """Make ``session`` the innermost active one (called by the session itself)."""
    with _active_lock:
        _active.append(session)


def leave(session: Session) -> None:
    """Remove ``session`` from the active ones (called by the session itself)."""
    with _active_lock:
        if session in _active:
            _active.remove(session)


def active_client() -> Any:
    """The distributed Client ``dask.compute`` would use now, if any."""
    # Only a program that imported distributed can have a Client; do not import it for nothing.
    if "distributed" not in sys.modules:
        return None
    from distributed import Client

    owner = getattr(active_get(), "__self__", None)
    return owner if isinstance(owner, Client) else None


def active_get(collections: Sequence[Any] | None = None) -> Callable[..., Any] | None:
    """The ``get`` function ``dask.compute(*collections)`` would use: set, a Client's, or the collections' default.

    ``None`` without collections when nothing is set (dask then uses each
    collection's default: threads for arrays).
    """

    return get_scheduler(collections=collections)


def scheduler_kind(collections: Sequence[Any] | None = None) -> str:
    """``"sync"``, ``"threads"``, ``"processes"``, ``"distributed"`` or ``"other"``: where work runs now.

    An active session's kind first; then a default Client; then the get
    function dask would use (its default threads when nothing is set).
    """

    session = current()
    if session is not None:
        return session.kind
    if active_client() is not None:
        return "distributed"
    get = active_get(collections)
    if get is None or get is dask.threaded.get:
        return "threads"
    if get is dask.local.get_sync:
        return "sync"
    if get is dask.multiprocessing.get:
        return "processes"
    return "other"


def uses_processes() -> bool:
    """Whether ``dask.compute`` now starts dask's own pool of processes (the ``processes`` scheduler)."""

    return active_get() is dask.multiprocessing.get
