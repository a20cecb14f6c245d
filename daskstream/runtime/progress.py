"""Progress bars: tqdm on stderr (a live widget in Jupyter), or nothing; the one way daskstream shows progress.

Every bar is labelled with the operation and the source (``mean of x.npy``,
``store out.zarr``) and counts bytes where daskstream can plan them: the
bytes a session's computation will read (so the bar shows the rate read and
the time left, also for a reduction of a whole file into one chunk), the
bytes ``store`` or ``convert`` writes. Otherwise it counts tasks. tqdm is imported only when a bar is asked for; where it is
missing, work runs exactly as it would with ``progress=False``. Bars appear
only for work that takes longer than half a second. A bar only watches; it
never changes what runs or what comes back.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import dask
from dask.callbacks import Callback

from daskstream.graph.layers import merged_graph
from daskstream.graph.optimize import plan_graph
from daskstream.planning.budget import format_size
from daskstream.planning.settings import Resources
from daskstream.sources.reads import bytes_read_here


def progress_bar(*, total: int = 0, unit: str = "task", desc: str = "daskstream", **options: Any) -> Any:
    """A tqdm bar on stderr (``tqdm.auto`` picks a widget in Jupyter); ``None`` without tqdm.

    ``options`` go to tqdm (``unit_scale=True`` for bytes).
    """
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    # ``delay``: work done within half a second shows no bar at all.
    bar = tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=True, dynamic_ncols=True, delay=0.5, **options)
    _OPEN_BARS.add(bar)
    return bar


# The bars progress_bar made that are still alive, closed together when a command is stopped.
_OPEN_BARS: weakref.WeakSet[Any] = weakref.WeakSet()


def close_open_bars() -> None:
    """Close every bar still showing, so that a line printed next starts on a line of its own."""
    for bar in list(_OPEN_BARS):
        bar.close()


class BlockProgress:
    """Progress of work done block by block, such as ``store`` and ``convert``, as a bar counting bytes.

    Called as ``progress(done, total)`` with blocks, as ``store`` calls a
    progress callback: the bar shows the bytes of the blocks done (the array's
    ``nbytes`` in all) and so the rate in bytes per second.

    Examples
    --------
    >>> progress = BlockProgress("store out.zarr", nbytes=4000)
    >>> progress(1, 4); progress(4, 4)
    >>> progress.done_bytes
    4000
    """

    #: It draws a bar: work before the blocks (a rechunk's first pass) shows a bar of its own beside it.
    shows = True

    def __init__(self, label: str, nbytes: int) -> None:
        self.label = label
        self.nbytes = int(nbytes)
        self.done_bytes = 0
        self._bar: Any = None
        self._started = False

    def __call__(self, done: int, total: int) -> None:
        if not self._started:
            self._started = True
            self._bar = progress_bar(total=self.nbytes, unit="B", desc=self.label, unit_scale=True, unit_divisor=1024)
        # Blocks of a regular grid hold the same bytes but for the edges: the share done is exact at the end.
        now = self.nbytes if done >= total else self.nbytes * done // max(total, 1)
        if self._bar is not None:
            self._bar.update(now - self.done_bytes)
            if done >= total:
                self._bar.close()
        self.done_bytes = now


class TaskProgress(Callback):
    """Moves ``bar`` on by one for every task a local dask scheduler finishes.

    Local schedulers (sync, threads, processes) call ``_posttask`` in the
    thread that called ``dask.compute``, so the bar is only touched from there.

    Examples
    --------
    >>> import dask, dask.array as da
    >>> class Count:
    ...     total = n = 0
    ...     def update(self, k): self.n += k
    ...     def refresh(self): pass
    >>> bar = Count()
    >>> with TaskProgress(bar):
    ...     _ = dask.compute(da.ones(8, chunks=2).sum(), scheduler="sync")
    >>> bar.n == bar.total > 0
    True
    """

    def __init__(self, bar: Any) -> None:
        super().__init__()
        self._bar = bar
        self._read_before = bytes_read_here()
        self._started = self._shown = time.perf_counter()

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        # Added rather than set: a graph computed inside a task starts another state.
        self._bar.total += sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))
        self._bar.refresh()

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        # Sources count what they deliver in the process that reads; threads and sync read here. Worked out
        # at most every tenth of a second: this runs after every task, and a graph may have a great many.
        now = time.perf_counter()
        if now - self._shown >= 0.1 and hasattr(self._bar, "set_postfix_str"):
            self._shown = now
            read = bytes_read_here() - self._read_before
            if read:
                rate = read / max(now - self._started, 1e-9)
                self._bar.set_postfix_str(f"read {format_size(read)}, {format_size(rate)}/s", refresh=False)
        self._bar.update(1)


def planned_bytes(objs: tuple[Any, ...], resources: Resources) -> int | None:
    """The bytes computing ``objs`` within ``resources`` will read from sources, as daskstream plans it;
    ``None`` where unknown.

    A bar that counts these shows how far the reading is, its rate and the
    time left, whatever the shape of the graph (one output chunk of a
    reduction over a whole file is still a long bar).
    """
    found = [obj for obj in objs if dask.is_dask_collection(obj)]
    if not found:
        return None
    try:
        graph, keys = merged_graph(found)
        total = plan_graph(graph, keys, resources)[1].bytes_to_read
    except Exception:  # a bar only watches: a graph it cannot plan is computed with a bar of tasks
        return None
    return int(total) or None


class ReadProgress(Callback):
    """Moves ``bar``, counting bytes, on by the bytes sources deliver, with the tasks done beside it.

    ``read_so_far()`` is the bytes read since the computation began, wherever
    the local scheduler's tasks run (this process's threads, or the pool of a
    ``processes`` session through its shared counter). Updated at most every
    tenth of a second, from the thread that called ``dask.compute``.
    """

    def __init__(self, bar: Any, read_so_far: Callable[[], int], limit: Any = None) -> None:
        super().__init__()
        self._bar = bar
        self._read = read_so_far
        self._limit = limit
        self._tasks = self._done = 0
        self._shown = 0.0
        self._started = time.perf_counter()

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        self._tasks += sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        self._done += 1
        now = time.perf_counter()
        if now - self._shown >= 0.1:
            self._shown = now
            self.show()

    def show(self) -> None:
        """Bring the bar to the bytes read so far (never past its total, which a re-read could pass)."""
        read = self._read()
        if min(read, self._bar.total) > self._bar.n:
            self._bar.update(min(read, self._bar.total) - self._bar.n)
        beside = rate_beside(self._limit, read, self._started)
        self._bar.set_postfix_str(f"{self._done}/{self._tasks} tasks{beside}", refresh=False)


#: A rate is set beside a limit once the computation has run this long: before, its start-up is most of it.
RATE_SHOWN_AFTER_SECONDS = 0.5


def rate_beside(limit: Any, read: int, started: float) -> str:
    """``", 0.94 GB/s, 55% of zstd 3's decode limit here"``: the rate of ``read`` bytes since ``started``
    (``time.perf_counter``) beside ``limit`` (anything with ``beside(rate)``); ``""`` without one, or too
    early to say."""
    elapsed = time.perf_counter() - started
    if limit is None or read <= 0 or elapsed < RATE_SHOWN_AFTER_SECONDS:
        return ""
    return f", {limit.beside(read / elapsed)}"
