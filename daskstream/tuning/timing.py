"""Timing candidates: the real read and work on blocks spread over the array, on the job's scheduler."""

from __future__ import annotations

import math
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.threaded
from dask.optimization import cull

from daskstream.graph.reads import source_array
from daskstream.planning.settings import PlanSettings
from daskstream.runtime.schedulers import active_get
from daskstream.sources import Source
from daskstream.tuning.candidates import Measurement, Multiples, SearchSpace, project_seconds
from daskstream.tuning.measured_work import Work, spread_blocks

Get = Callable[[dict, list], Any]


def scheduler_get() -> Get:
    """The ``get`` function dask would use now (a session's, a default Client's, else threads)."""

    return active_get() or dask.threaded.get


def _noop() -> None:
    return None


def scheduler_overhead(get: Get, concurrency: int, repeats: int = 5) -> float:
    """Seconds the scheduler takes to run ``concurrency`` empty tasks (median of ``repeats``)."""
    keys = [("tune-noop", i) for i in range(concurrency)]
    graph = {k: (_noop,) for k in keys}
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        get(graph, keys)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Sampler:
    """Runs one candidate's sample and turns the timings into a :class:`Measurement`.

    Attributes
    ----------
    source, work, space
        What is read, what runs on each block, and the candidates' geometry.
    settings
        The budget and parallelism the tuning plans for (recorded on the sampled arrays).
    get
        The scheduler's ``get``.
    fixed_overhead
        Seconds the scheduler spends on a computation regardless of its tasks
        (subtracted from each batch's wall time).
    task_overhead
        Seconds per task the scheduler adds (for the tasks the sample cannot show).
    batches
        Timed batches for the first candidate; their spread is taken as the
        noise of every measurement, and later candidates are timed on one
        batch each (so the sample cap admits twice as many of them).
    min_batch_bytes
        Bytes a batch reads at least, so that small chunks run long enough to time.
    """

    source: Source
    work: Work
    space: SearchSpace
    settings: PlanSettings
    get: Get
    fixed_overhead: float
    task_overhead: float
    batches: int = 2
    min_batch_bytes: int = 16 * 2**20
    noise: float = 0.0

    def tasks_per_batch(self, multiples: Multiples) -> int:
        """One task per slot at least, more when the chunks are small."""
        per_wave = self.space.concurrency * self.space.chunk_bytes(multiples)
        waves = max(1, math.ceil(self.min_batch_bytes / max(per_wave, 1)))
        return min(self.space.concurrency * waves, self.space.n_tasks(multiples))

    def sample_bytes(self, multiples: Multiples, *, first: bool = False) -> int:
        """Bytes a measurement of ``multiples`` reads (upper bound: full chunks with their halo)."""
        chunks = self.space.chunks(multiples)
        halo = self.work.halo or (0,) * len(chunks)
        haloed = math.prod(min(c + 2 * h, n) for c, h, n in zip(chunks, halo, self.space.shape))
        tasks = (self.batches if first else 1) * self.tasks_per_batch(multiples)
        # The first measurement also runs the work once on a block an eighth the size, for its peak memory.
        probe = math.prod(self.space.chunks(self.probe_multiples(multiples))) * self.space.itemsize if first else 0
        return tasks * haloed * self.space.itemsize + probe

    def measure(self, multiples: Multiples, *, first: bool = False) -> Measurement:
        """Time ``multiples`` on batches of blocks spread over the array (``batches`` of them when ``first``).

        The first measurement also runs the work once, alone, under
        ``tracemalloc`` on a block an eighth the size for the peak memory of a
        task (scaled to the chunk), which also warms what a first task pays
        once (file handles, chunk index, compiled code) before the timing.
        """

        started = time.perf_counter()
        chunks = self.space.chunks(multiples)
        x = source_array(self.source, chunks, self.settings)
        count = self.tasks_per_batch(multiples)
        wave_bytes = self.space.concurrency * self.space.chunk_bytes(multiples)
        batches = self.batches if first else 1
        plan = [spread_blocks(x.numblocks, count, offset=(b + 0.5) / batches) for b in range(batches)]
        # One graph for every sampled block, built once; each batch runs its part of it.
        every = sorted({block for blocks in plan for block in blocks})
        graph, keys = self.work.sample_graph(self.source, x, every)
        key_of = dict(zip(every, keys))
        sampled, wave_seconds, peak_bytes = 0, [], None
        if first:
            peak_bytes, probed = self.peak_task_bytes(multiples)
            sampled += probed
        for blocks in plan:
            wanted = [key_of[b] for b in blocks]
            part, _ = cull(graph, wanted)
            t0 = time.perf_counter()
            self.get(part, wanted)
            seconds = max(time.perf_counter() - t0 - self.fixed_overhead, 1e-9)
            nbytes = sum(_block_bytes(x.chunks, b, self.space.itemsize) for b in blocks)
            sampled += nbytes
            wave_seconds.append(seconds * wave_bytes / nbytes)
        task_seconds = statistics.median(wave_seconds)
        if len(wave_seconds) > 1:
            self.noise = (max(wave_seconds) - min(wave_seconds)) / 2 / task_seconds
        whole = project_seconds(self.space, multiples, task_seconds, self.task_overhead) + self.fixed_overhead
        return Measurement(
            throughput=self.space.nbytes / whole,
            spread=self.noise,
            task_seconds=task_seconds,
            sample_bytes=sampled,
            seconds=time.perf_counter() - started,
            peak_task_bytes=peak_bytes,
        )

    def probe_multiples(self, multiples: Multiples) -> Multiples:
        """A block an eighth the size of ``multiples`` (whole units), for the memory probe."""
        return tuple(max(1, m // 8) if axis in self.space.axes else m for axis, m in enumerate(multiples))

    def peak_task_bytes(self, multiples: Multiples) -> tuple[int, int]:
        """Peak memory of one task of ``multiples``, and the bytes read to find it.

        The work runs once in this thread under ``tracemalloc`` (which counts
        numpy's buffers) on a smaller block of the same kind; its peak over the
        block's bytes, times the chunk's bytes, is the estimate.
        """
        small = self.space.chunks(self.probe_multiples(multiples))
        grid = tuple(max(1, -(-n // c)) for n, c in zip(self.space.shape, small))
        (block,) = spread_blocks(grid, 1)
        box = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(block, small, self.space.shape))
        nbytes = math.prod(s.stop - s.start for s in box) * self.space.itemsize
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            self.work.run_once(self.source, box)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            if not tracing:
                tracemalloc.stop()
        return math.ceil(max(peak, 0) / max(nbytes, 1) * self.space.chunk_bytes(multiples)), nbytes


def _block_bytes(chunks: tuple[tuple[int, ...], ...], block: tuple[int, ...], itemsize: int) -> int:
    return math.prod(c[i] for c, i in zip(chunks, block)) * itemsize
