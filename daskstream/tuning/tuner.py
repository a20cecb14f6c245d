"""``daskstream.tune``: measure chunk shapes on this machine, choose the fastest, remember it."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from dask.utils import parse_timedelta

from daskstream import config
from daskstream.advice import keyword, passing, said
from daskstream.errors import DaskstreamWarning, InvalidArgumentError, warn
from daskstream.graph.layers import opened_source, read_layers
from daskstream.planning.budget import parse_budget
from daskstream.planning.settings import PlanSettings, Resources
from daskstream.runtime.remembered import TuneCache, machine_fingerprint
from daskstream.runtime.resources import resolve_settings
from daskstream.runtime.schedulers import scheduler_kind
from daskstream.runtime.session import session
from daskstream.sources import Source, open_source
from daskstream.tuning.candidates import Limits, SearchSpace, Trial, hill_climb
from daskstream.tuning.measured_work import Work, work_for
from daskstream.tuning.result import Candidate, TuneResult
from daskstream.tuning.timing import Sampler, scheduler_get, scheduler_overhead


def tune(
    source: str | os.PathLike[str] | Source | Any,
    *,
    op: str | None = "sum",
    kernel: Callable[..., Any] | None = None,
    axis: int | tuple[int, ...] | None = None,
    depth: int | tuple[int, ...] = 0,
    dataset: str | None = None,
    scheduler: str | None = None,
    memory_budget: int | str | None = None,
    time_budget: str | float | None = None,
    refresh: bool = False,
) -> TuneResult:
    """Measure storage-aligned chunk shapes for ``op`` (or ``kernel``) on this machine and choose the fastest.

    The search starts from the planner's choice (``chunks="auto"``) and climbs
    by doubling or halving the chunk along one axis at a time, keeping a step
    only when it is faster by more than the measured noise. Each candidate is
    timed by running the real read and work on batches of blocks spread over
    the array, on the scheduler the job will use, with at least one task per
    thread. Candidates over the memory budget, with fewer tasks than threads,
    or with tasks shorter than the scheduler's overhead floor are not run.
    The search stops within ``time_budget``, or before it would read more
    than ``daskstream.tune.sample-fraction`` (10%) of the array.

    The winner is remembered in the tuning cache under the kind of data (not
    its path), the work, the scheduler and this machine, so tuning another
    file of the same kind costs one lookup.

    Parameters
    ----------
    source
        A path (``"scan.h5::/entry/data"`` names the dataset), a :class:`Source`,
        or a dask array made by :func:`daskstream.open`.
    op
        A reduction name (see :data:`daskstream.compute.OPERATIONS`) or
        ``"describe"``: the work to tune for.
    kernel
        A map-blocks function to tune for instead of ``op``; with ``depth``,
        its halo (cells per side, an int or one per axis).
    axis
        Axes the reduction removes (default: all).
    dataset
        HDF5 dataset or Zarr member, when ``source`` is a path.
    scheduler
        Where to measure (as for :func:`daskstream.session`); by default the
        active session's scheduler, else dask's default.
    memory_budget
        Bytes a worker may use (``"2GiB"``); default as for the planner.
    time_budget
        Longest time to spend measuring (``"10s"`` or seconds); default the
        setting ``daskstream.tune.time-budget``.
    refresh
        Measure again even when the cache holds a result.

    Returns
    -------
    TuneResult

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import dask
    >>> import daskstream as ds
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.zeros((4096, 256), "f4"))
    >>> with dask.config.set({"daskstream.tune.cache": os.path.join(os.path.dirname(path), "t.json")}):
    ...     result = ds.tune(path, time_budget="2s")
    >>> result.chunks[1], result.auto_chunks[1]
    (256, 256)
    """
    started = time.perf_counter()
    resolved = source_of(source, dataset)
    if scheduler is not None:
        with session(scheduler, memory_budget=memory_budget, progress=False):
            return tune(
                resolved,
                op=op,
                kernel=kernel,
                axis=axis,
                depth=depth,
                memory_budget=memory_budget,
                time_budget=time_budget,
                refresh=refresh,
            )
    if kernel is None and op is None:
        raise InvalidArgumentError(
            said("tune needs ", keyword("op"), " (a reduction name or 'describe') or kernel= (a function)")
        )
    work = work_for(op, kernel, ndim=resolved.ndim, dtype=resolved.dtype, axis=axis, depth=depth)
    seconds = _seconds(config.get("tune.time-budget", time_budget))
    # The candidates are sized to the budget asked for; the sampled reads are planned as any array
    # opened here would be, so that measuring a candidate is not refused by the budget it is tested for.
    tuner = Tuner(resolved, work, resolve_settings(memory_budget=memory_budget), sampling=resolve_settings())
    return tuner.run(seconds, refresh=refresh, started=started)


def source_of(x: Any, dataset: str | None = None, *, as_opened: bool = False) -> Source:
    """The :class:`Source` ``x`` is, names or reads: a Source, a path, or a dask array reading one source.

    ``as_opened``: the array must be the read itself, as :func:`daskstream.open`
    returns it (adaptive runs re-plan its reads, which would drop whatever was
    computed from it).
    """
    if isinstance(x, Source):
        return x
    if hasattr(x, "__dask_graph__"):
        layers = read_layers(x)
        if as_opened and opened_source(x) is None:
            raise InvalidArgumentError(
                said(
                    keyword("adaptive", True),
                    " re-plans the reads, so it needs the array as daskstream.open returns it (or its path); this "
                    "one is computed from it: reduce the opened array, or ",
                    passing("adaptive", False),
                )
            )
        found = {s.token: s for _, s, _ in layers}
        if len(found) != 1:
            raise InvalidArgumentError(
                f"tune needs an array read from one source (made by daskstream.open); this one reads {len(found)}. "
                "Pass the path or the Source instead"
            )
        return next(iter(found.values()))
    return open_source(x, dataset=dataset)


def _seconds(value: str | float) -> float:

    try:
        seconds = float(parse_timedelta(value, default="s"))
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise InvalidArgumentError(
            said(keyword("time_budget", value), ' is not a duration; give seconds or e.g. "10s"')
        ) from exc
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InvalidArgumentError(
            said(keyword("time_budget", value), ' must be a finite duration more than zero, e.g. "10s"')
        )
    return seconds


def search_space(source: Source, resources: Resources) -> SearchSpace:
    """Storage-aligned candidates for ``source``: multiples of its storage chunk, or slabs of contiguous data."""
    shape = source.shape
    if source.storage_chunks is None:
        slowest = 0 if source.layout != "F" else source.ndim - 1
        unit = tuple(1 if axis == slowest else n for axis, n in enumerate(shape))
        axes: tuple[int, ...] = (slowest,) if source.ndim else ()
    else:
        unit = tuple(max(1, min(c, n)) for c, n in zip(source.storage_chunks, shape))
        axes = tuple(range(source.ndim))
    return SearchSpace(
        shape=shape,
        itemsize=source.dtype.itemsize,
        unit=unit,
        axes=axes,
        per_task_bytes=resources.per_task_bytes,
        concurrency=resources.threads * resources.workers,
    )


def cache_key(source: Source, space: SearchSpace, work: Work, resources: Resources) -> dict[str, Any]:
    """What a remembered result depends on: kind of data, work, scheduler, parallelism and machine."""
    return {
        "format": source.format,
        "storage": source.describe_storage(),
        "unit": list(space.unit) if source.storage_chunks is None else list(source.storage_chunks),
        "dtype": source.dtype.str,
        "work": work.label,
        "scheduler": scheduler_kind(),
        "threads": resources.threads,
        "workers": resources.workers,
        "machine": machine_fingerprint(),
    }


class Tuner:
    """One tuning of ``work`` on ``source`` with ``settings``; see :func:`tune`.

    ``sampling``: what the arrays read to time candidates are planned for (by default ``settings``).
    """

    def __init__(
        self, source: Source, work: Work, settings: PlanSettings, *, sampling: PlanSettings | None = None
    ) -> None:
        self.source = source
        self.work = work
        self.settings = settings
        self.sampling = settings if sampling is None else sampling
        self.resources = resources = settings.resources
        self.plan = source.plan(settings)
        self.space = search_space(source, resources)
        self.key = cache_key(source, self.space, work, resources)
        self.cache = TuneCache()

    def run(self, time_budget: float, *, refresh: bool = False, started: float | None = None) -> TuneResult:
        """Look the result up, or search and remember it; ``started`` is when the caller began (default now)."""
        started = time.perf_counter() if started is None else started
        entry = self.cache.get(self.key)
        if entry is not None and not refresh:
            remembered = self.remembered(entry, started)
            if remembered is not None:
                return remembered
        start = self.space.multiples_of(self.plan.chunks)
        if start is None or self.space.nbytes == 0:
            why = "the planner splits storage chunks (one exceeds the per-task budget): nothing aligned to try"
            return self._result([], None, why if start is None else "the array is empty", started, 0)

        fraction = config.setting("tune.sample-fraction")
        cost_fraction = config.setting("tune.cost-fraction")
        sampler = Sampler(
            self.source,
            self.work,
            self.space,
            self.sampling,
            scheduler_get(),
            fixed_overhead=0.0,
            task_overhead=0.0,
            batches=config.setting("tune.batches"),
            min_batch_bytes=parse_budget(config.get("tune.min-batch-bytes"), name="daskstream.tune.min-batch-bytes"),
        )
        # Everything this tuning does counts against its time, from the cache lookup on.
        limits = Limits(time_budget=time_budget, sample_cap=int(fraction * self.space.nbytes), started=started)
        first_sample = sampler.sample_bytes(start, first=True)
        refusal = limits.over_sample(first_sample)
        if refusal is not None:
            share = f"{fraction:.0%}" if fraction < 1 else f"{fraction:g}x"
            # The least fraction that lets the first measurement run: on an array smaller than a measurement's
            # batches, more than the whole array (its blocks are read once per batch).
            needed = math.ceil(100 * first_sample / max(self.space.nbytes, 1)) / 100
            why = (
                f"not worth tuning at this size: measuring even the planner's chunks {refusal}, the "
                f"{share} of the array that tuning may read; the planner's chunks are used and nothing is "
                f"remembered as tuned (give --sample-fraction {needed:g} or more, or set "
                f"daskstream.tune.sample-fraction, to measure anyway)"
            )
            return self._result([], None, why, started, 0)
        sampler.fixed_overhead = scheduler_overhead(sampler.get, self.space.concurrency)
        # What a task costs the scheduler, as measured, goes into the projection of a full run; the
        # configured floor (or the measured cost, when higher) only prunes candidates.
        sampler.task_overhead = sampler.fixed_overhead / self.space.concurrency
        floor = max(_seconds(config.get("tune.task-overhead")), sampler.task_overhead)
        factor = {"value": self.settings.working_set_factor_for(self.source.dtype)}

        def measure(multiples: tuple[int, ...]) -> Any:
            measured = sampler.measure(multiples, first=multiples == start)
            if measured.peak_task_bytes is not None:
                factor["value"] = max(1.0, measured.peak_task_bytes / self.space.chunk_bytes(multiples))
            if multiples == start:
                # Tuning may take at most this share of the full run it is tuning for.
                limits.time_budget = min(limits.time_budget, cost_fraction * self.space.nbytes / measured.throughput)
            return measured

        outcome = hill_climb(
            self.space,
            start,
            measure,
            limits=limits,
            sample_bytes=lambda m: sampler.sample_bytes(m, first=m == start),
            memory_factor=lambda: factor["value"],
            overhead_floor=floor,
            min_gain=config.setting("tune.min-gain"),
            extra_starts=self.observed_starts(entry),
        )
        result = self._result(outcome.trials, outcome.best, outcome.stopped, started, limits.sampled, factor["value"])
        if outcome.best is not None:
            self.cache.put(self.key, self._remembered_form(result, outcome.best, factor["value"]))
        return result

    def observed_starts(self, entry: dict[str, Any] | None) -> tuple[tuple[int, ...], ...]:
        """Chunk shapes real computations ran fastest with (best first), as extra starting points."""
        observations = sorted((entry or {}).get("observations", []), key=lambda o: -o.get("throughput", 0))
        starts = []
        for observation in observations[:2]:
            multiples = observation.get("multiples")
            if isinstance(multiples, list) and len(multiples) == self.source.ndim:
                starts.append(self.space.clip(tuple(int(m) for m in multiples)))
        return tuple(starts)

    def remembered(self, entry: dict[str, Any], started: float) -> TuneResult | None:
        """The cached winner applied to this source, or ``None`` when it no longer fits the budget."""
        tuned = entry.get("tuned")
        if not isinstance(tuned, dict) or not isinstance(tuned.get("multiples"), list):
            return None
        stopped = f"remembered from a tuning of {tuned.get('source', 'a source of the same kind')}"
        overruled = self.overruled(entry, tuned)
        if overruled is not None:
            tuned, stopped = overruled
            self.cache.put(self.key, tuned)
        multiples = self.space.clip(tuple(int(m) for m in tuned["multiples"]))
        if self.space.rejection(multiples, float(tuned.get("memory_factor", 1.0))) is not None:
            return None
        chunks = self.space.chunks(multiples)
        row = Candidate(
            chunks=chunks,
            chunk_bytes=self.space.chunk_bytes(multiples),
            tasks=self.space.n_tasks(multiples),
            throughput=tuned.get("throughput"),
            spread=tuned.get("spread"),
            peak_task_bytes=None,
            peak_measured=False,
            pruned=None,
            origin="remembered",
        )
        return TuneResult(
            chunks=chunks,
            auto_chunks=self.plan.chunks,
            candidates=(row,),
            speedup_vs_auto=tuned.get("speedup_vs_auto"),
            work=self.work.label,
            operation=self.work.title,
            source=self.source.name,
            seconds=time.perf_counter() - started,
            sampled_bytes=0,
            stopped=stopped,
            from_cache=True,
            key=self.key,
            shape=self.source.shape,
            storage_chunks=self.source.storage_chunks,
        )

    def overruled(self, entry: dict[str, Any], tuned: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
        """The remembered winner replaced by the shape real computations ran fastest with, when they disagree.

        A tuning measured on a busy machine, or on a sample unlike the whole,
        is checked against what sessions observed since: only full runs are
        compared with full runs, so the tuned shape must have been observed
        too. When another observed shape ran faster than it by more than the
        noise (the tuning's spread, twice, and at least
        ``daskstream.tune.min-gain``), that shape becomes the remembered
        winner; ``None`` otherwise. Only shapes the budget and the workers
        admit now are considered.
        """
        observations = [o for o in entry.get("observations", []) if isinstance(o.get("multiples"), list)]
        same = [o for o in observations if o["multiples"] == tuned["multiples"] and o.get("throughput")]
        factor = float(tuned.get("memory_factor", 1.0))
        # A shape this budget or these workers cannot run (too large, too few tasks) cannot take over.
        others = [
            o
            for o in observations
            if o["multiples"] != tuned["multiples"]
            and o.get("throughput")
            and len(o["multiples"]) == self.source.ndim
            and self.space.rejection(self.space.clip(tuple(int(m) for m in o["multiples"])), factor) is None
        ]
        if not same or not others:
            return None
        held = max(float(o["throughput"]) for o in same)
        best = max(others, key=lambda o: float(o["throughput"]))
        margin = max(float(config.setting("tune.min-gain")), 2 * float(tuned.get("spread") or 0.0))
        if float(best["throughput"]) <= held * (1 + margin):
            return None
        gain = float(best["throughput"]) / held - 1
        replaced = {
            **tuned,
            "multiples": list(best["multiples"]),
            "chunks": list(best["chunks"]),
            "throughput": float(best["throughput"]),
            "speedup_vs_auto": None,
            "source": best.get("source", tuned.get("source")),
            "overruled": list(tuned["multiples"]),
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        why = (
            f"remembered, and replaced: computations observed since ran {tuple(best['chunks'])} {gain:.0%} faster "
            f"than the tuned {tuple(tuned.get('chunks', ()))}, beyond the noise ({margin:.0%})"
        )
        return replaced, why

    def _result(
        self,
        trials: list[Trial],
        best: Trial | None,
        stopped: str,
        started: float,
        sampled: int,
        memory_factor: float | None = None,
    ) -> TuneResult:
        rows = tuple(self._row(t, memory_factor) for t in trials)
        planner = next((t.measurement for t in trials if t.origin == "planner" and t.measurement is not None), None)
        speedup = None
        if best is not None and planner is not None:
            assert best.measurement is not None  # the climb's best is a measured trial
            speedup = best.measurement.throughput / planner.throughput
        return TuneResult(
            chunks=self.plan.chunks if best is None else self.space.chunks(best.multiples),
            auto_chunks=self.plan.chunks,
            candidates=rows,
            speedup_vs_auto=speedup,
            work=self.work.label,
            operation=self.work.title,
            source=self.source.name,
            seconds=time.perf_counter() - started,
            sampled_bytes=sampled,
            stopped=stopped,
            key=self.key,
            shape=self.source.shape,
            storage_chunks=self.source.storage_chunks,
        )

    def _row(self, trial: Trial, memory_factor: float | None) -> Candidate:
        m = trial.measurement
        nbytes = self.space.chunk_bytes(trial.multiples)
        measured = None if m is None else m.peak_task_bytes
        measured_peak = measured is not None
        peak = (
            measured
            if measured is not None
            else (None if memory_factor is None or trial.pruned else math.ceil(memory_factor * nbytes))
        )
        return Candidate(
            chunks=self.space.chunks(trial.multiples),
            chunk_bytes=nbytes,
            tasks=self.space.n_tasks(trial.multiples),
            throughput=None if m is None else m.throughput,
            spread=None if m is None else m.spread,
            peak_task_bytes=peak,
            peak_measured=measured_peak,
            pruned=trial.pruned,
            origin=trial.origin,
        )

    def _remembered_form(self, result: TuneResult, best: Trial, memory_factor: float) -> dict[str, Any]:
        assert best.measurement is not None  # the climb's best is a measured trial
        return {
            "multiples": list(best.multiples),
            "chunks": list(result.chunks),
            "throughput": best.measurement.throughput,
            "spread": best.measurement.spread,
            "speedup_vs_auto": result.speedup_vs_auto,
            "memory_factor": memory_factor,
            "source": result.source,
            "candidates": len(result.candidates),
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def tuned_chunks(source: Source, settings: PlanSettings, *, sampling: PlanSettings) -> tuple[int, ...]:
    """The chunks ``open(path, chunks="tune")`` uses: remembered, else measured now for the default op.

    As :func:`tune` with its defaults: candidates sized to ``settings``, the
    reads that time them planned for ``sampling``. When nothing could be
    measured, the planner's chunks, with a warning that says why.
    """
    started = time.perf_counter()
    work = work_for(config.get("tune.default-op"), None, ndim=source.ndim, dtype=source.dtype, axis=None, depth=0)
    tuner = Tuner(source, work, settings, sampling=sampling)
    result = tuner.run(_seconds(config.get("tune.time-budget")), started=started)
    if not result.from_cache and result.speedup_vs_auto is None:
        warn(
            said(
                f"{source.name}: ",
                keyword("chunks", "tune"),
                f" measured nothing ({result.stopped}); opened in the planner's chunks {result.chunks}",
            ),
            DaskstreamWarning,
        )
    return result.chunks
