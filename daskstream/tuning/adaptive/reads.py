"""What one wave of an adaptive run reads and how it is timed: rows of a source (or of regions computed
from sources) as their own dask array, the run's progress bar moved by the wave's bytes, and the clock of
its tasks -- on this process's threads, or as futures on a distributed cluster (:class:`Cluster`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.callbacks import Callback

from daskstream.compute.plans import plan_compute
from daskstream.graph.regions import Readable, Regions, region_array, regions_of
from daskstream.planning.settings import Resources
from daskstream.runtime.scheduler_loss import guard_scheduler
from daskstream.runtime.schedulers import active_client
from daskstream.sources import Source
from daskstream.sources.base import Region


def rows_array(source: Source, start: int, stop: int, chunks: tuple[int, ...]) -> da.Array:
    """Rows ``[start, stop)`` of ``source``'s first axis as a dask array in ``chunks``, one task per block."""
    rows = Rows(source, start, stop)
    grid = tuple(_cut(0, n, c) for n, c in zip(rows.shape, chunks))
    return da.from_array(
        rows,
        chunks=grid,
        name=f"daskstream-wave-{tokenize(source.token, start, stop, grid)}",
        lock=False,
        asarray=False,
        fancy=False,
        meta=np.empty((0,) * source.ndim, dtype=source.dtype),
    )


def readable_for_waves(x: da.Array, planned: Any, resources: Resources) -> tuple[Readable | None, str]:
    """What ``x``'s blocks are computed from region by region, for waves of an adaptive run; ``None`` and why
    not when they are not, or when waves would read more than ``planned`` (the computation as planned).

    Aggregates up to an eighth of a task's share go whole into every task, as kernels take them; waves
    compute them once, first, which reads the data twice where the planned computation holds what it
    reads for them within the budget and reads it once.
    """
    share = resources.per_task_bytes
    readable = regions_of(x, constant_limit=share // 8)
    if readable is None:
        return None, (
            "the array is not computed region by region from its sources (a rechunk or a reduction is on the "
            "way), so its waves cannot be cut anew"
        )
    if readable.constants and plan_compute(planned).passes == 1:
        return None, (
            "the planned computation reads the data once, holding it for its aggregates within the memory "
            "budget; waves would read it twice"
        )
    return readable, ""


class RegionWaves:
    """Rows of what a :class:`Readable` computes, wave by wave, as region arrays; the aggregates it is
    computed with (``x - x.mean()``) computed once, when the first wave needs them, and handed to every
    wave's tasks as the small arrays they are."""

    def __init__(self, readable: Readable, resources: Resources) -> None:
        self.readable = readable
        self.resources = resources
        self.computed = not readable.constants

    def rows(self, start: int, stop: int, chunks: tuple[int, ...]) -> da.Array:
        """Rows ``[start, stop)`` of the first axis in ``chunks``: each task reads its own region, halos from
        the neighbouring rows included."""
        if not self.computed:
            names = list(self.readable.constants)
            values = dask.compute(*(self.readable.constants[n] for n in names))
            arrays = {n: da.from_array(np.asarray(v), name=n) for n, v in zip(names, values)}
            self.readable, self.computed = Readable(self.readable.regions, arrays), True
        rows = RegionRows(self.readable.regions, start, stop)
        grid = tuple(_cut(0, n, c) for n, c in zip(rows.shape, chunks))
        return region_array(Readable(rows, self.readable.constants), grid, self.resources)


def compute_wave(
    lazy: Any, threads: int, bar: Any, nbytes: int, cluster: Cluster | None = None
) -> tuple[Any, float, float]:
    """Compute ``lazy`` on ``threads`` threads, or as futures on ``cluster``: its result, and its seconds as
    :func:`clocked` (:meth:`Cluster.clocked`) gives them."""
    found: list[Any] = []
    if cluster is not None:
        wall = cluster.clocked(lambda: found.append(cluster.gathered(lazy)), bar, nbytes)
        return found[0], wall, wall

    def run(callbacks: list[Callback]) -> None:
        with contextlib.ExitStack() as stack:
            for callback in callbacks:
                stack.enter_context(callback)
            found.extend(dask.compute(lazy, scheduler="threads", num_workers=threads))

    wall, busy = clocked(run, bar, nbytes)
    return found[0], wall, busy


def clocked(run: Callable[[list[Callback]], None], bar: Any, nbytes: int) -> tuple[float, float]:
    """Run one wave, ``run(callbacks)`` computing it with those dask callbacks around it: its wall seconds,
    and the seconds from its first task's start to its last task's end (what trials compare: building and
    optimizing the graph costs every setting the same). ``bar`` (if any) moves by the wave's ``nbytes``."""
    clock = BusyClock()
    t0 = time.perf_counter()
    run([clock, *([WaveBar(bar, nbytes)] if bar is not None else [])])
    wall = time.perf_counter() - t0
    return wall, clock.seconds or wall


@dataclass(frozen=True)
class Cluster:
    """The distributed cluster an adaptive run's waves go to: its Client, what kind of cluster it is and its size.

    Each wave is submitted whole as futures (``client.compute``) and its result
    gathered here; the scheduler spreads its tasks over every worker thread,
    so a wave has as many tasks in flight as the cluster has threads.

    Attributes
    ----------
    client
        The distributed Client ``dask.compute`` uses now.
    kind
        The cluster's class (``"LocalCluster"``, ``"SSHCluster"``...), or
        ``"joined cluster"`` for a scheduler joined by its address.
    address
        The scheduler's address.
    threads_per_worker
        Each connected worker's threads, fewest first.
    """

    client: Any
    kind: str
    address: str
    threads_per_worker: tuple[int, ...]

    @classmethod
    def active(cls) -> Cluster | None:
        """The cluster of the Client ``dask.compute`` would use now, or ``None`` when it uses none."""
        client = active_client()
        if client is None:
            return None
        with guard_scheduler(client, "asking the scheduler for its workers"):
            workers = client.scheduler_info(n_workers=-1)["workers"].values()
        cluster = getattr(client, "cluster", None)
        return cls(
            client,
            "joined cluster" if cluster is None else type(cluster).__name__,
            client.scheduler.address,
            tuple(sorted(int(w["nthreads"]) for w in workers)),
        )

    @property
    def workers(self) -> int:
        return len(self.threads_per_worker)

    @property
    def threads(self) -> int:
        """Threads of all the workers: the tasks a wave has in flight."""
        return sum(self.threads_per_worker)

    @property
    def size(self) -> str:
        """``"2 workers x 1 thread"`` (``"3 workers, 10 threads"`` when they differ).

        >>> Cluster(None, "LocalCluster", "tcp://127.0.0.1:8786", (2, 2)).size
        '2 workers x 2 threads'
        >>> Cluster(None, "SSHCluster", "tcp://10.0.0.5:8786", (1, 4, 4)).size
        '3 workers, 9 threads'
        """
        each = set(self.threads_per_worker)
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        if len(each) == 1:
            (threads,) = each
            return f"{workers} x {threads} thread{'s' if threads != 1 else ''}"
        return f"{workers}, {self.threads} threads"

    @property
    def key(self) -> str:
        """What names it in the tuning cache: its kind and size, not its address (a local cluster's port
        changes with every start)."""
        return f"{self.kind}: {self.size}"

    def __str__(self) -> str:
        return f"{self.kind} at {self.address} ({self.size})"

    def gathered(self, lazy: Any) -> Any:
        """``lazy`` (a dask collection, or a list of them) computed as futures on the cluster, gathered here."""
        futures = self.client.compute(lazy)
        try:
            return self.client.gather(futures)
        except BaseException:
            self.client.cancel(futures)
            raise

    def clocked(self, run: Callable[[], None], bar: Any, nbytes: int) -> float:
        """Run one wave, ``run()`` computing it on the cluster: its wall seconds on this process's clock (no
        task's clock reaches it), submission and gathering included. ``bar`` (if any) moves by ``nbytes``
        once the wave is done."""
        t0 = time.perf_counter()
        with guard_scheduler(self.client, "running a wave of an adaptive run"):
            run()
        wall = time.perf_counter() - t0
        if bar is not None:
            bar.update(nbytes)
        return wall


class WaveBar(Callback):
    """Moves the run's bar by a wave's bytes as its tasks finish."""

    def __init__(self, bar: Any, nbytes: int) -> None:
        super().__init__()
        self.bar, self.nbytes, self.total, self.shown = bar, nbytes, 1, 0

    def _start_state(self, dsk: Any, state: Any) -> None:
        self.total = max(1, len(dsk))

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        done = len(state["finished"])
        target = self.nbytes * done // self.total
        if target > self.shown:
            self.bar.update(target - self.shown)
            self.shown = target

    def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
        if not errored and self.shown < self.nbytes:
            self.bar.update(self.nbytes - self.shown)
            self.shown = self.nbytes


class BusyClock(Callback):
    """Seconds from the first task's start to the last task's end of one computation."""

    def __init__(self) -> None:
        super().__init__()
        self.first: float | None = None
        self.last: float | None = None

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        self.last = time.perf_counter()

    @property
    def seconds(self) -> float | None:
        return None if self.first is None or self.last is None else self.last - self.first


def _cut(start: int, stop: int, step: int) -> tuple[int, ...]:
    """Chunks of ``step`` (the last shorter) over ``[start, stop)``."""
    return tuple(min(step, stop - s) for s in range(start, stop, step)) or (0,)


class Rows:
    """Rows ``[start, stop)`` of a source's first axis, read through the source (so reads are counted and
    checked as any other): the array a wave reads, one task per block, with nothing around it in the graph.

    The wave's setting holds the memory budget by construction
    (:func:`daskstream.tuning.adaptive.trials.settings_to_try`), so the array is made
    directly rather than as a planned read.
    """

    def __init__(self, source: Source, start: int, stop: int) -> None:
        self.source, self.start, self.stop = source, start, stop
        self.shape = (stop - start, *source.shape[1:])
        self.dtype = source.dtype
        self.ndim = source.ndim

    def __getitem__(self, region: tuple[slice, ...]) -> np.ndarray:
        first, *rest = region
        return self.source[(slice(self.start + first.start, self.start + first.stop), *rest)]


class RegionRows(Regions):
    """Rows ``[start, stop)`` of the first axis of other regions: a region of these is that region shifted
    (so a kernel's halo at the rows' edges comes from the rows beyond them, not from a boundary rule)."""

    def __init__(self, regions: Regions, start: int, stop: int) -> None:
        self.regions, self.start, self.stop = regions, start, stop
        self.shape = (stop - start, *regions.shape[1:])
        self.dtype = regions.dtype

    def read(self, box: Region) -> np.ndarray:
        first, *rest = box
        return self.regions.read((slice(self.start + first.start, self.start + first.stop), *rest))

    @property
    def sources(self) -> tuple[Source, ...]:
        return self.regions.sources

    @property
    def label(self) -> str:
        return self.regions.label

    @property
    def constants(self) -> tuple[str, ...]:
        return self.regions.constants

    def bind(self, values: dict[str, np.ndarray]) -> Regions:
        return RegionRows(self.regions.bind(values), self.start, self.stop)

    def __dask_tokenize__(self) -> Any:
        return ("daskstream-region-rows", self.regions, self.start, self.stop)
