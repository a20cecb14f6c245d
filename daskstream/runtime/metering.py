"""Counting the bytes sources deliver, wherever the tasks that read them run.

Every :meth:`daskstream.Source.read` adds the bytes it returns to a counter of
the process it runs in. A :class:`ReadMeter` adds those counters up over a
computation: this process's (threads and sync), the workers' of a distributed
Client (asked before and after), and, inside a ``session("processes")``, one
shared by the session's worker processes (dask starts a new pool for every
computation, so their own counters would vanish with them).

The figure is the data delivered to tasks, decoded: a computation that passes
over an array twice (an exact quantile of float32 data, say) reads twice its
``nbytes``.

>>> import numpy as np, tempfile, os
>>> import daskstream as ds
>>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
>>> np.save(path, np.ones((100, 10), dtype="f8"))
>>> with ReadMeter() as meter:
...     _ = ds.open(path).sum().compute(scheduler="threads")
>>> meter.bytes_read
8000
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dask.multiprocessing import get_context

from daskstream.runtime.scheduler_loss import guard_scheduler, scheduler_lost
from daskstream.runtime.schedulers import active_client, current, uses_processes
from daskstream.sources.reads import bytes_read_here, count_into

if TYPE_CHECKING:
    from types import TracebackType


def shared_counter() -> Any:
    """A counter that processes started by dask's ``processes`` scheduler can add to."""

    return get_context().Value("Q", 0)


def process_initializer(counter: Any, then: Any = None) -> None:
    """Run in each new worker process of a session's pool: count into ``counter``, then ``then()``."""
    count_into(counter)
    if then is not None:
        then()


class ReadMeter:
    """Bytes read from sources while the ``with`` block runs, on this session's scheduler.

    Parameters
    ----------
    session
        The :class:`daskstream.Session` computing inside the block; default the
        active one. Outside any session, tasks running as threads of this
        process or on the default distributed Client are counted.

    Attributes
    ----------
    bytes_read
        Bytes counted, once the block has ended; ``None`` when they could not be
        counted: the block raised (nothing is asked of the workers then, so
        that the error comes out at once and unchanged), the distributed
        scheduler was lost, or the ``processes`` scheduler was set outside a
        daskstream session (its pool processes are gone with their counters).

    Raises
    ------
    ClusterConnectionError
        On entering, when the distributed scheduler to ask is already lost.
    """

    def __init__(self, session: Any = None) -> None:

        self._session = session if session is not None else current()
        self.bytes_read: int | None = None
        self._start: int | None = None

    def __enter__(self) -> ReadMeter:

        client = self._client()
        if client is None:
            self._start = self._total(None)
        else:
            with guard_scheduler(client, "counting the bytes the workers read"):
                self._start = self._total(client)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:

        # Asking the workers now would wait on a scheduler that may be gone, and replace the error.
        client = self._client()
        if exc_type is not None or self._start is None or (client is not None and scheduler_lost(client)):
            self.bytes_read = None
            return
        end = self._total(client)
        self.bytes_read = None if end is None else end - self._start

    def so_far(self) -> int:
        """Bytes counted since the block began, while it runs (a progress bar's count); 0 where not counted."""
        client = self._client()
        if self._start is None or (client is not None and scheduler_lost(client)):
            # A Client that lost its scheduler would wait out its reconnection to ask the workers.
            return 0
        total = self._total(client)
        return 0 if total is None else total - self._start

    def _client(self) -> Any:
        session = self._session
        return session.client if session is not None else active_client()

    def _total(self, client: Any) -> int | None:
        total = bytes_read_here()
        session = self._session
        if session is not None:
            counter = session.read_counter
        else:
            counter = None
            if client is None and uses_processes():
                return None
        if counter is not None:
            total += counter.value
        if client is not None:
            # Workers that joined or left between the two readings make the figure approximate.
            total += sum(client.run(bytes_read_here).values())
        return total
