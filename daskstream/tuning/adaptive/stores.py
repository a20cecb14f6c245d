"""Adaptive stores: a store that tries ways of writing on its first rows, then writes the rest with the fastest.

``ds.store(x, target, adaptive=True)`` of an array computed region by region
from its sources (a source opened with ``ds.open``, ``ds.map_blocks``
kernels over it, element-wise expressions of those) into a Zarr target
writes it in waves along the first axis, as adaptive reductions read
(:mod:`daskstream.tuning.adaptive.reductions`). The target's chunks are fixed by the
planner before the first write, so what is tried is how the writing runs:
chunks written per task (a task computes the region of several chunks at
once -- one read of their sources and one halo instead of one per chunk --
then encodes and writes each) and threads. Every trial wave writes its part
of the target, so nothing is computed or read twice.

On a distributed cluster each wave's tasks are submitted as futures and write
from the workers, as a planned store's do there, each block once and marked
done as it is written. A store that cannot run in waves (an HDF5 target,
written by one process; a resumed store; an array that is not computed region
by region; the ``sync`` or ``processes`` scheduler) writes as planned, and its
:class:`~daskstream.tuning.adaptive.record.Adaptation` says why.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import dask.array as da

from daskstream.compute.store import store
from daskstream.compute.store.record import reads_spans
from daskstream.compute.store.result import StoredArray
from daskstream.compute.store.target import target_format
from daskstream.compute.store.zarr_writes import PendingWrites, runs_blocks_with
from daskstream.graph.layers import read_layers
from daskstream.planning.settings import PlanSettings
from daskstream.runtime.schedulers import scheduler_kind
from daskstream.sources.detect import split_dataset
from daskstream.tuning.adaptive.engine import AdaptiveJob, WaveRunner, row_bytes
from daskstream.tuning.adaptive.reads import Cluster, RegionWaves, WaveBar, clocked, readable_for_waves
from daskstream.tuning.adaptive.record import Adaptation, Tried
from daskstream.tuning.adaptive.trials import Setting, Wave
from daskstream.tuning.candidates import Multiples, SearchSpace
from daskstream.tuning.measured_work import Work
from daskstream.tuning.tuner import cache_key


def adaptive_store(
    x: da.Array,
    target: str | os.PathLike[str],
    *,
    settings: PlanSettings,
    progress: Any = None,
    **options: Any,
) -> StoredArray:
    """``store(x, target, ..., adaptive=True)``: the stored array, with the run's
    :class:`~daskstream.tuning.adaptive.record.Adaptation` as its ``adaptation`` attribute.

    ``progress``: a callable gets the store's block counts as without
    ``adaptive``; ``True``/``None`` shows the adaptive run's own bar (whose
    postfix names the setting tried), as the active session shows progress
    by default.
    """
    started = time.perf_counter()
    job = StoreJob(target, settings=settings, progress=None if callable(progress) else progress)
    with runs_blocks_with(job.write):
        stored = store(x, target, progress=progress if callable(progress) else False, **options)
    if job.adaptation is None:
        # The target never handed its blocks over: an HDF5 target (written by this process, in batches), or
        # a finished store of the same computation (nothing left to write).
        hdf5 = target_format(split_dataset(os.fspath(target), None)[0]) == "hdf5"
        job.adaptation = job.as_planned(
            x,
            "an HDF5 target is written by this process in batches; adaptive stores write Zarr targets"
            if hdf5
            else "the target already holds this computation, complete: nothing was written",
            seconds=time.perf_counter() - started,
            written=hdf5,
        )
    # The stored array as without adaptive=, carrying what the run did (dask arrays take attributes).
    stored.adaptation = job.adaptation  # type: ignore[attr-defined]
    return stored


class StoreJob(AdaptiveJob):
    """The blocks a store has left to write, as waves of an adaptive run."""

    operation = "store"

    def __init__(self, target: Any, *, settings: PlanSettings, progress: bool | None) -> None:
        self.name = os.fspath(target)
        self.settings = settings
        self.progress = progress
        self.writes: PendingWrites | None = None
        self.waves: RegionWaves | None = None
        self.not_readable = ""
        self.adaptation: Adaptation | None = None

    # -- entered by the store, with what it has left to write ----------------------

    def write(self, writes: PendingWrites) -> None:
        self.writes = writes
        self.name = writes.target.name
        readable, self.not_readable = readable_for_waves(writes.x, writes.x, self.settings.resources)
        self.waves = None if readable is None else RegionWaves(readable, self.settings.resources)
        _, self.adaptation = WaveRunner(self).run()

    def as_planned(self, x: da.Array, reason: str, *, seconds: float, written: bool) -> Adaptation:
        """The record of a store the adaptive run never entered, and why (``written``: it wrote ``x``)."""
        chunks = tuple(c[0] if c else 0 for c in x.chunks)
        cluster = Cluster.active() if scheduler_kind() == "distributed" else None
        row = Tried(
            role="planner",
            chunks=chunks,
            chunk_bytes=math.prod(chunks) * x.dtype.itemsize,
            threads=self.settings.resources.threads if cluster is None else cluster.threads,
            waves=int(written),
            nbytes=int(x.nbytes) if written else 0,
            seconds=seconds if written else 0.0,
            throughput=None,
            spread=0.0,
        )
        return Adaptation(
            source=self.name,
            operation=self.operation,
            nbytes=int(x.nbytes),
            tried=(row,),
            chosen=0,
            reason=reason,
            trial_bytes=0,
            trial_seconds=0.0,
            seconds=seconds,
            started_from="planner",
            adapted=False,
            cluster=None if cluster is None else str(cluster),
        )

    @property
    def _writes(self) -> PendingWrites:
        assert self.writes is not None, "the store has not handed over its blocks yet"
        return self.writes

    # -- the job -------------------------------------------------------------------

    def search_space(self, settings: PlanSettings) -> SearchSpace:
        x = self._writes.x
        resources = settings.resources
        return SearchSpace(
            shape=tuple(x.shape),
            itemsize=x.dtype.itemsize,
            unit=tuple(max(1, min(c, n)) for c, n in zip(self._writes.chunks, x.shape)),
            axes=(0,) if x.ndim else (),
            per_task_bytes=resources.per_task_bytes,
            concurrency=resources.threads * resources.workers,
        )

    def cache_key(self, space: SearchSpace, settings: PlanSettings) -> dict[str, Any]:
        sources = [source for _, source, _ in read_layers(self._writes.x)]
        label = "store" if self.waves is None else f"store {self.waves.readable.regions.label}"
        if not sources:
            return {"work": label, "chunks": list(space.unit), "dtype": self._writes.x.dtype.str}
        key = cache_key(sources[0], space, Work(label=label, title=label), settings.resources)
        key["target_chunks"] = list(space.unit)
        return key

    def planned_multiples(self, space: SearchSpace, settings: PlanSettings) -> Multiples | None:
        return (1,) * len(space.shape)  # the planner's task: one chunk of the target

    def memory_factor(self, settings: PlanSettings) -> float:
        return settings.working_set_factor_for(self._writes.x.dtype)

    def planned_threads(self, settings: PlanSettings) -> int:
        return self._writes.planned_threads or settings.resources.threads

    def why_not(self, space: SearchSpace) -> str | None:
        writes = self._writes
        if writes.done:
            return "a resumed store writes the blocks it has left as planned"
        if reads_spans(writes.x):
            return "an array read in spans is written span by span, each task streaming its chunks"
        if self.waves is None:
            return self.not_readable
        if not space.shape:
            return "a 0-d array is one chunk"
        return None

    def run_wave(
        self, space: SearchSpace, setting: Setting, wave: Wave, bar: Any, cluster: Cluster | None
    ) -> tuple[Any, float, float]:
        writes = self._writes
        assert self.waves is not None
        rows = space.unit[0]
        per_task = space.chunks(setting.multiples)[0]
        chunks = (per_task, *(c[0] for c in writes.x.chunks[1:]))
        tasks = self.waves.rows(wave.start, wave.stop, chunks)
        blocks = [b for b in writes.pending if wave.start <= b[0] * rows < wave.stop]
        nbytes = (wave.stop - wave.start) * row_bytes(space)

        if cluster is not None:
            # Futures on the cluster's workers (the store's own way there), which write and mark each block.
            wall = cluster.clocked(lambda: writes.write(tasks, blocks, first_row=wave.start), bar, nbytes)
            return None, wall, wall

        def run(callbacks: list[Any]) -> None:
            writes.write(tasks, blocks, first_row=wave.start, threads=setting.threads, callbacks=callbacks)

        wall, busy = clocked(run, bar, nbytes)
        return None, wall, busy

    def run_whole(self, bar: Any) -> tuple[Any, float]:
        writes = self._writes
        t0 = time.perf_counter()
        writes.write(
            writes.x, writes.pending, callbacks=[WaveBar(bar, int(writes.x.nbytes))] if bar is not None else []
        )
        return None, time.perf_counter() - t0

    def join(self, parts: list[Any]) -> Any:
        return None
