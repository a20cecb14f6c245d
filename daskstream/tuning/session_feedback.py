"""Online feedback: what a real computation inside a session showed, remembered for the next tuning.

:meth:`daskstream.Session.compute` wraps each computation that reads one
daskstream source in an :class:`Observation`: wall time, bytes, tasks, the
time of each read-and-work task (a dask callback, on local schedulers) and
the process's peak memory while it ran (sampled, on local schedulers). When
the computation ran long enough (``daskstream.tune.feedback-min-seconds``),
the figures go into the tuning cache under the same key :func:`daskstream.tune`
uses, and the next tuning of that kind of data starts from the best shapes
observed.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
from dask.callbacks import Callback

from daskstream import config
from daskstream.graph.layers import read_layers
from daskstream.runtime.remembered import TuneCache
from daskstream.sources import Source
from daskstream.tuning.measured_work import Work, consumer_label
from daskstream.tuning.tuner import cache_key, search_space


class _TaskClock(Callback):
    """Seconds each task of one layer took, from dask's pre- and post-task hooks."""

    def __init__(self, layer: str) -> None:
        super().__init__()
        self.layer = layer
        self.started: dict[Any, float] = {}
        self.seconds: list[float] = []

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        if isinstance(key, tuple) and key and key[0] == self.layer:
            self.started[key] = time.perf_counter()

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        began = self.started.pop(key, None)
        if began is not None:
            self.seconds.append(time.perf_counter() - began)


class _PeakMemory:
    """This process's peak resident memory above where it started, sampled every ``interval`` seconds."""

    def __init__(self, interval: float = 0.02) -> None:

        self._process = psutil.Process()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), name="daskstream-peak", daemon=True)
        self._thread.start()

    def _sample(self, interval: float) -> None:
        while not self._done.wait(interval):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
        return self.peak - self.baseline


def observed_work(objs: tuple[Any, ...]) -> tuple[Source, tuple[int, ...], str, str, int] | None:
    """The one source a computation reads: the Source, chunk shape, work layer and label, task count.

    ``None`` when the computation reads no daskstream source, or several
    (their times could not be told apart).
    """
    found = {}
    for obj in objs:
        if not hasattr(obj, "__dask_graph__"):
            continue
        graph = obj.__dask_graph__()
        for name, source, chunks in read_layers(obj):
            consumer = consumer_label(graph, name)
            if chunks is not None and consumer is not None:
                found[(source.token, chunks, consumer[1])] = (source, chunks, consumer)
    if len(found) != 1:
        return None
    source, chunks, (layer, label) = next(iter(found.values()))
    shape = tuple(c[0] if c else 0 for c in chunks)
    return source, shape, layer, label, math.prod(len(c) for c in chunks)


@contextlib.contextmanager
def observation(session: Any, objs: tuple[Any, ...]) -> Iterator[None]:
    """Around ``session``'s computation of ``objs``: measure it and record it in the tuning cache."""
    found = observed_work(objs) if config.get("tune.feedback") else None
    if found is None:
        yield
        return
    source, chunks, layer, label, tasks = found
    local = session.client is None
    clock = _TaskClock(layer) if local else contextlib.nullcontext()
    memory = _PeakMemory() if local else None
    started = time.perf_counter()
    try:
        with clock:
            yield
    finally:
        peak = memory.stop() if memory is not None else None
    seconds = time.perf_counter() - started
    if seconds < config.setting("tune.feedback-min-seconds"):
        return
    _record(session, source, chunks, label, tasks, seconds, peak, getattr(clock, "seconds", []))


def _record(
    session: Any,
    source: Source,
    chunks: tuple[int, ...],
    label: str,
    tasks: int,
    seconds: float,
    peak: int | None,
    task_seconds: list[float],
) -> None:

    resources = session.resources()
    space = search_space(source, resources)
    multiples = space.multiples_of(chunks)
    if multiples is None:
        return  # chunks not aligned to storage: nothing the tuner could choose
    per_task = statistics.median(task_seconds) if task_seconds else seconds * space.concurrency / max(tasks, 1)
    TuneCache().observe(
        cache_key(source, space, Work(label=label), resources),
        {
            "chunks": list(chunks),
            "multiples": list(multiples),
            "tasks": tasks,
            "seconds": seconds,
            "throughput": source.nbytes / seconds,
            "task_seconds": per_task,
            "task_seconds_measured": bool(task_seconds),
            "peak_bytes": peak,
            "source": source.name,
            "observed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )


__all__ = ["observation", "observed_work"]
