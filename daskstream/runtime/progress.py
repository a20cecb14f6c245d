"""Progress bars for computations: tqdm on stderr (a live widget in Jupyter), or nothing.

tqdm is imported only when a bar is asked for; where it is missing,
computations run exactly as they would with ``progress=False``. Bars appear
only for computations that take longer than half a second. A bar only
watches; it never changes what runs or what comes back.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from dask.callbacks import Callback


def progress_bar(*, total: int = 0, unit: str = "task", desc: str = "daskstream") -> Any:
    """A tqdm bar on stderr (``tqdm.auto`` picks a widget in Jupyter); ``None`` without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    # ``delay``: a computation done within half a second shows no bar at all.
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=True, dynamic_ncols=True, delay=0.5)


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

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        # Added rather than set: a graph computed inside a task starts another state.
        self._bar.total += sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))
        self._bar.refresh()

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        self._bar.update(1)


def track_futures(futures: list[Any], bar: Any) -> Iterator[Any]:
    """Yield ``futures`` as they finish (in any order), moving ``bar`` on by one for each."""
    from distributed import as_completed

    bar.total += len(futures)
    bar.refresh()
    for future in as_completed(futures):
        bar.update(1)
        yield future
