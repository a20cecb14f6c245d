"""A distributed scheduler that went away: noticed at once and said in one line.

distributed's Client, on losing its scheduler, cancels every future it holds
and retries the connection until its timeout runs out; what waits on it sees
``CancelledError`` or long tracebacks. These helpers turn that into one
:class:`~daskstream.errors.ClusterConnectionError` naming the scheduler and
what was being done, and close such a Client quietly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from daskstream.errors import ClusterConnectionError, error_chain
from daskstream.runtime.stopping import quieted_loggers

__all__ = ["close_client", "guard_scheduler", "lost_scheduler_error", "scheduler_lost"]


def scheduler_lost(client: Any) -> bool:
    """Whether ``client`` has lost its scheduler (it stopped, or the connection to it broke).

    distributed's Client then cancels every future it holds and retries the
    connection until its connect timeout (30 s by default) runs out; calls
    that need the scheduler wait all that time, so they are best not made.
    """
    return getattr(client, "status", "running") not in ("running", "newly-created")


@contextlib.contextmanager
def guard_scheduler(client: Any, doing: str) -> Iterator[None]:
    """Around work on ``client``'s scheduler: losing the scheduler raises ClusterConnectionError at once.

    Parameters
    ----------
    client
        The distributed Client the block computes on.
    doing
        What the block does, for the message: ``"computing sum of x.npy"``.

    Raises
    ------
    ClusterConnectionError
        The scheduler was lost before or during the block: the message names
        its address and what was being done, in place of the cancelled
        futures and connection errors distributed raises.
    """
    if scheduler_lost(client):
        raise _lost(client, doing)
    try:
        yield
    except Exception as exc:
        lost = lost_scheduler_error(client, exc, doing)
        if lost is not None:
            raise lost from exc
        raise


def lost_scheduler_error(client: Any, exc: BaseException, doing: str) -> ClusterConnectionError | None:
    """The ClusterConnectionError to raise for ``exc`` when it came of losing ``client``'s scheduler, else ``None``.

    An error that already says so (a ClusterConnectionError) is left as it is.
    """
    if isinstance(exc, ClusterConnectionError):
        return None
    if scheduler_lost(client) or _cancelled_by_lost_connection(exc) or _broke_with_scheduler(client, exc):
        return _lost(client, doing)
    return None


def _broke_with_scheduler(client: Any, exc: BaseException) -> bool:
    """Whether ``exc`` is a connection to ``client``'s scheduler breaking (a call made as the scheduler died,
    before the Client noticed and changed its status)."""
    try:
        address = client.scheduler.address
    except AttributeError:
        return False
    broken = [e for e in error_chain(exc) if isinstance(e, OSError) or type(e).__name__ == "CommClosedError"]
    return bool(address) and any(f"remote={address}" in str(e) for e in broken)


def _cancelled_by_lost_connection(exc: BaseException) -> bool:
    # Futures cancelled because the Client lost its scheduler say so in their reason.
    return "scheduler-connection-lost" in str(getattr(exc, "reason", "") or "") or (
        "lost the connection to the scheduler" in str(exc)
    )


def _lost(client: Any, doing: str) -> ClusterConnectionError:
    try:
        address = client.scheduler.address
    except AttributeError:
        address = "its address"
    return ClusterConnectionError(
        f"lost the scheduler at {address} while {doing}; it stopped or can no longer be reached, and the work it "
        "held is gone: check that it runs and that the network reaches it, then run again"
    )


def close_client(client: Any) -> None:
    """Close ``client``; one that lost its scheduler is closed at once and without its error log.

    distributed logs the cancelled reconnection of such a Client as errors with
    tracebacks; the loss was already reported by :func:`guard_scheduler`.
    """
    if not scheduler_lost(client):
        client.close()
        return

    with quieted_loggers(("distributed",)), contextlib.suppress(Exception):
        client.close(timeout=2)
