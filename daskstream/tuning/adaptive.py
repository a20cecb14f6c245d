"""Adaptive runs: a reduction that tries settings on its own first rows, then runs the rest with the winner.

``ds.reduce(x, op, adaptive=True)`` and ``ds.describe(x, adaptive=True)``
return an :class:`AdaptiveRun`.
Computing it cuts the array along its first axis into waves
(:mod:`daskstream.tuning.waves`): the first waves try the planner's setting
(or the one an earlier adaptive run of this kind of data chose) and a few
alternatives — more threads, larger tasks — interleaved, as
real work whose results are part of the answer; the rest then runs with the
fastest. Nothing is read twice. The pieces' results are joined as the
reduction's own combine step joins chunks (:mod:`daskstream.compute.joins`).

What was tried, what won and why is the :class:`Adaptation` (``explain()``,
the progress bar's postfix while it runs), and the winner is remembered in the
tuning cache under the same kind-of-data key :func:`daskstream.tune` uses, so
the next adaptive run of that kind of data starts from it.

Adaptation needs the threaded scheduler (threads are one of its knobs); on
another scheduler, or an array too small for trials, the reduction runs as
planned and the :class:`Adaptation` says why.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import dask
import numpy as np

from daskstream import config
from daskstream.compute.describe import describe
from daskstream.compute.joins import PieceDescription, PieceReduction
from daskstream.compute.reductions import reduce
from daskstream.graph.reads import source_array
from daskstream.planning.budget import format_size
from daskstream.planning.grid import normalize_axes
from daskstream.runtime.progress import progress_bar
from daskstream.runtime.resources import resolve_settings
from daskstream.runtime.schedulers import current, scheduler_kind
from daskstream.runtime.tune_cache import TuneCache
from daskstream.sources import Source
from daskstream.tuning.adaptation import Adaptation, Tried
from daskstream.tuning.tuner import cache_key, search_space, source_of
from daskstream.tuning.wave_reads import WaveBar, compute_wave, rows_array
from daskstream.tuning.waves import (
    Choice,
    Setting,
    Wave,
    choose,
    in_budget,
    lay_out_trials,
    rest_wave,
    settings_to_try,
    wave_rows,
)
from daskstream.tuning.work import work_for


class AdaptiveRun:
    """A reduction or ``describe`` computed adaptively: :meth:`compute` runs it; ``adaptation`` then tells
    what happened.

    Made by ``daskstream.reduce(x, op, adaptive=True)`` and
    ``daskstream.describe(x, adaptive=True)``.

    Attributes
    ----------
    source
        What is read.
    operation
        The reduction's name, or ``"describe"``.
    adaptation
        The :class:`~daskstream.tuning.adaptation.Adaptation`, once computed.
    """

    def __init__(
        self,
        source: Source,
        operation: str,
        axis: Any,
        pieces: PieceReduction | PieceDescription,
        single_run: Any,
        *,
        memory_budget: int | str | None,
        progress: bool | None,
    ) -> None:
        self.source = source
        self.operation = operation
        self.axis = axis
        self.pieces = pieces
        # The computation done in one piece, as planned (what runs when nothing can be tried).
        self.single_run = single_run
        self.memory_budget = memory_budget
        self.progress = progress
        self.adaptation: Adaptation | None = None

    @property
    def dtype(self) -> np.dtype | None:
        """The answer's dtype (reductions)."""
        return getattr(self.single_run, "dtype", None)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The answer's shape (reductions)."""
        return getattr(self.single_run, "shape", None)

    def __repr__(self) -> str:
        state = "not computed yet" if self.adaptation is None else f"chose {self.adaptation.chunks}"
        return f"<daskstream AdaptiveRun {self.operation} over {self.source.name}: {state}>"

    def compute(self) -> Any:
        """Run it adaptively and return the answer: a numpy array or scalar, or a :class:`Description`."""
        result, self.adaptation = _Runner(self).run()
        return result

    def explain(self) -> str:
        """What the run tried and chose (after :meth:`compute`), or what it will try."""
        if self.adaptation is None:
            return f"{self!r}: compute() tries the planner's setting and alternatives on the first waves"
        return self.adaptation.explain()


def adaptive_reduction(
    x: Any,
    op: str,
    axis: Any = None,
    *,
    keepdims: bool = False,
    dtype: Any = None,
    ddof: int = 0,
    q: Any = None,
    memory_budget: int | str | None = None,
    progress: bool | None = None,
) -> AdaptiveRun:
    """``reduce(x, op, ..., adaptive=True)``: ``x`` a path, a :class:`Source` or an array made by ``daskstream.open``."""
    source = source_of(x, as_opened=True)
    axes = tuple(range(source.ndim)) if axis is None else normalize_axes(axis, source.ndim)
    single = reduce(
        source_array(source, "auto", resolve_settings(memory_budget=memory_budget)),
        op,
        axis,
        keepdims=keepdims,
        dtype=dtype,
        ddof=ddof,
        q=q,
    )
    pieces = PieceReduction(op, axes, keepdims=keepdims, dtype=dtype, ddof=ddof, q=q)
    return AdaptiveRun(source, op, axis, pieces, single, memory_budget=memory_budget, progress=progress)


def adaptive_description(
    x: Any,
    axis: Any = None,
    bins: Any = None,
    *,
    bin_range: Any = None,
    ddof: int = 0,
    memory_budget: int | str | None = None,
    progress: bool | None = None,
) -> AdaptiveRun:
    """``describe(x, ..., adaptive=True)``: ``x`` as for :func:`adaptive_reduction`."""
    source = source_of(x, as_opened=True)
    planned = source_array(source, "auto", resolve_settings(memory_budget=memory_budget))
    single = describe(planned, axis, bins, range=bin_range, ddof=ddof, memory_budget=memory_budget)
    pieces = PieceDescription.of(planned, axis, bins=bins, bin_range=bin_range, ddof=ddof, memory_budget=memory_budget)
    return AdaptiveRun(source, "describe", axis, pieces, single, memory_budget=memory_budget, progress=progress)


class _Runner:
    """One adaptive run of an :class:`AdaptiveRun`."""

    def __init__(self, job: AdaptiveRun) -> None:
        self.job = job
        self.source = job.source
        self.settings = resolve_settings(memory_budget=job.memory_budget)
        self.space = search_space(self.source, self.settings.resources)
        self.row_bytes = math.prod(self.source.shape[1:]) * self.source.dtype.itemsize
        self.work = work_for(
            job.operation if job.operation != "count_nonzero" else "sum",
            None,
            ndim=self.source.ndim,
            dtype=self.source.dtype,
            axis=job.axis,
            depth=0,
        )
        self.key = cache_key(self.source, self.space, self.work, self.settings.resources)
        # The planner's chunks as whole storage units (None when they are not: then nothing is tried).
        self.planned_multiples = self.space.multiples_of(self.source.plan(self.settings).chunks)
        self.planner = Setting(
            self.planned_multiples or (1,) * self.source.ndim, self.settings.resources.threads, "planner"
        )
        self.memory_factor = self.settings.working_set_factor_for(self.source.dtype)
        # What one worker's tasks may hold at once.
        self.budget = self.space.per_task_bytes * self.settings.resources.threads
        # Seconds each wave took (wall, and first task to last), by its first row.
        self.spent: dict[int, float] = {}
        self.busy: dict[int, float] = {}

    # -- what to try -------------------------------------------------------------

    def _start(self) -> tuple[Setting, str]:
        entry = TuneCache().get(self.key) or {}
        remembered = entry.get("adaptive")
        if isinstance(remembered, dict) and isinstance(remembered.get("multiples"), list):
            setting = Setting(
                self.space.clip(tuple(int(m) for m in remembered["multiples"])),
                int(remembered.get("threads", self.planner.threads)),
                "remembered",
            )
            if self._in_budget(setting):
                return (
                    setting,
                    f"setting remembered from an adaptive run over {remembered.get('source', 'data of this kind')}",
                )
        return self.planner, "planner's setting"

    def _in_budget(self, setting: Setting) -> bool:
        return in_budget(
            self.space, setting.multiples, setting.threads, memory_factor=self.memory_factor, budget_bytes=self.budget
        )

    def _settings(self, start: Setting) -> list[Setting]:
        tried = settings_to_try(
            self.space,
            start.multiples,
            start.threads,
            memory_factor=self.memory_factor,
            max_threads=int(config.setting("adaptive.max-threads")),
            budget_bytes=self.budget,
            role=start.role,
        )
        planner = self.planner
        if start.role == "remembered" and (planner.multiples, planner.threads) != (start.multiples, start.threads):
            # The planner's own setting is tried second, so a remembered one that no longer wins is left.
            others = [s for s in tried[1:] if (s.multiples, s.threads) != (planner.multiples, planner.threads)]
            return [start, planner, *others]
        return tried

    # -- running -----------------------------------------------------------------

    def run(self) -> tuple[Any, Adaptation]:
        started = time.perf_counter()
        start, started_from = self._start()
        why_not = self._why_not()
        settings = [start] if why_not else self._settings(start)
        waves: list[Wave] = []
        while why_not is None:
            waves, why_not = lay_out_trials(
                self.space,
                settings,
                rounds=int(config.setting("adaptive.rounds")),
                tasks_per_thread=int(config.setting("adaptive.tasks-per-thread")),
                trial_fraction=float(config.setting("adaptive.trial-fraction")),
            )
            if waves or len(settings) <= 2:
                break
            # A round of every alternative does not fit: try fewer, the last (largest waves) first.
            settings, why_not = settings[:-1], None
        bar = self._bar()
        try:
            if why_not is not None:
                result, seconds = self._run_whole(bar)
                choice = Choice(0, (0.0,), (0.0,), why_not)
                return result, self._adaptation([start], [seconds], choice, [], None, started, started_from)
            return self._adapt(settings, waves, bar, started, started_from)
        finally:
            if bar is not None:
                bar.close()

    def _why_not(self) -> str | None:
        """Why this run cannot adapt, or ``None``."""
        job = self.job
        if scheduler_kind() != "threads":
            return (
                f"adaptive runs choose threads, so they need the threaded scheduler; this one is {scheduler_kind()!r}"
            )
        if self.planned_multiples is None:
            return "the planner's chunks are not whole storage chunks"
        if self.source.ndim and self.source.storage_chunks is None and self.space.axes != (0,):
            return "the data is stored with its last axis slowest; waves cut the first"
        return job.pieces.why_not(self.source.ndim)

    def _adapt(
        self, settings: list[Setting], waves: list[Wave], bar: Any, started: float, started_from: str
    ) -> tuple[Any, Adaptation]:
        n_rows = self.source.shape[0]
        parts: dict[int, Any] = {}
        measured: list[list[float]] = [[] for _ in settings]
        seconds_of = [0.0] * len(settings)
        ran: list[Wave] = []

        def run(wave: Wave) -> None:
            setting = settings[wave.setting]
            if bar is not None and wave.trial is not None:
                bar.set_postfix_str(f"trying {setting.role}", refresh=True)
            parts[wave.start], spent, busy = self._run_wave(setting, wave, bar)
            self.spent[wave.start], self.busy[wave.start] = spent, busy
            if wave.trial is not None and wave.trial >= 0:
                measured[wave.setting].append((wave.stop - wave.start) * self.row_bytes / max(busy, 1e-9))
            seconds_of[wave.setting] += spent
            ran.append(wave)

        # The warm-up wave (whose start-up makes it the slowest: if even it projects a short run, the run
        # is short), then the starting setting's first timed one: what the whole run would take.
        shortest = float(config.setting("adaptive.min-seconds"))
        run(waves[0])
        warm_up_bytes = (waves[0].stop - waves[0].start) * self.row_bytes
        projected = self.space.nbytes * self.busy[waves[0].start] / max(warm_up_bytes, 1)
        if projected >= shortest:
            run(waves[1])
            projected = self.space.nbytes / measured[0][0]
        if projected < shortest:
            # The whole run is about as long as the trials would be: they cannot pay for themselves.
            timed = ran[-1]
            why = (
                f"its first {format_size((timed.stop - timed.start) * self.row_bytes)} project "
                f"{projected:.2f} s for the whole array, less than daskstream.adaptive.min-seconds ({shortest:g} s): "
                "too short for trials to pay"
            )
            rest = rest_wave(ran, n_rows, 0)
            if rest is not None:
                run(rest)
            result = self.job.pieces.join([parts[k] for k in sorted(parts)], self.job.dtype)
            choice = Choice(0, (measured[0][0] if measured[0] else 0.0,), (0.0,), why)
            return result, self._adaptation(settings[:1], seconds_of[:1], choice, [], None, started, started_from)
        for wave in waves[2:]:
            run(wave)
        min_gain = float(config.setting("tune.min-gain"))
        choice = choose(settings, measured, min_gain=min_gain)
        if choice.setting != 0 and min(len(measured[0]), len(measured[choice.setting])) < 2:
            # One trial each tells no noise: the starting setting and the challenger run once more before
            # the rest is committed to either.
            again = []
            at = ran[-1].stop
            per_thread = int(config.setting("adaptive.tasks-per-thread"))
            for index in (0, choice.setting):
                rows = wave_rows(self.space, settings[index], per_thread)
                again.append(Wave(index, at, min(at + rows, n_rows), 1))
                at += rows
            if at < n_rows:
                for wave in again:
                    run(wave)
                choice = choose(settings, measured, min_gain=min_gain)
        trials = list(ran)
        winner = settings[choice.setting]
        if bar is not None:
            bar.set_postfix_str(f"chose {winner.role}: {winner.describe(self.space)}", refresh=True)
        rest = rest_wave(ran, n_rows, choice.setting)
        if rest is not None:
            run(rest)
        result = self.job.pieces.join([parts[k] for k in sorted(parts)], self.job.dtype)
        adaptation = self._adaptation(settings, seconds_of, choice, trials, rest, started, started_from)
        self._remember(winner, adaptation)
        return result, adaptation

    def _bar(self) -> Any:
        show = self.job.progress
        if show is None:
            active = current()
            show = bool(active is not None and active.progress)
        if not show:
            return None
        return progress_bar(
            total=self.space.nbytes,
            unit="B",
            unit_scale=True,
            desc=f"{self.job.operation} {self.source.name} (adaptive)",
        )

    def _run_whole(self, bar: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        with WaveBar(bar, self.space.nbytes) if bar is not None else contextlib.nullcontext():
            (result,) = dask.compute(self.job.single_run)
        return result, time.perf_counter() - t0

    def _run_wave(self, setting: Setting, wave: Wave, bar: Any) -> tuple[Any, float, float]:
        """Rows ``[wave.start, wave.stop)`` reduced with ``setting``: the partial result, its seconds, and
        the seconds from its first task's start to its last task's end (see :func:`compute_wave`)."""
        piece = rows_array(self.source, wave.start, wave.stop, self.space.chunks(setting.multiples))
        nbytes = (wave.stop - wave.start) * self.row_bytes
        return compute_wave(self.job.pieces.piece(piece), setting.threads, bar, nbytes)

    # -- the record ----------------------------------------------------------------

    def _adaptation(
        self,
        settings: list[Setting],
        seconds_of: list[float],
        choice: Choice,
        trials: list[Wave],
        rest: Wave | None,
        started: float,
        started_from: str,
    ) -> Adaptation:
        """The record of the run; no ``trials`` means it ran as planned (``choice.reason`` says why)."""
        adapted = bool(trials)
        rows = []
        for i, s in enumerate(settings):
            mine = [w for w in trials if w.setting == i] + ([rest] if rest is not None and rest.setting == i else [])
            rows.append(
                Tried(
                    role=s.role,
                    chunks=self.space.chunks(s.multiples),
                    chunk_bytes=self.space.chunk_bytes(s.multiples),
                    threads=s.threads,
                    waves=len(mine) if adapted else 1,
                    nbytes=sum(w.stop - w.start for w in mine) * self.row_bytes if adapted else self.space.nbytes,
                    seconds=seconds_of[i],
                    throughput=choice.throughputs[i] or None,
                    spread=choice.spreads[i],
                )
            )
        return Adaptation(
            source=self.source.name,
            operation=self.job.operation,
            nbytes=self.space.nbytes,
            tried=tuple(rows),
            chosen=choice.setting,
            reason=choice.reason,
            trial_bytes=sum(w.stop - w.start for w in trials) * self.row_bytes,
            trial_seconds=sum(self.spent.get(w.start, 0.0) for w in trials),
            seconds=time.perf_counter() - started,
            started_from=started_from,
            adapted=adapted,
        )

    def _remember(self, winner: Setting, adaptation: Adaptation) -> None:
        TuneCache().adapted(
            self.key,
            {
                "multiples": list(winner.multiples),
                "chunks": list(self.space.chunks(winner.multiples)),
                "threads": winner.threads,
                "role": winner.role,
                "throughput": adaptation.tried[adaptation.chosen].throughput,
                "source": self.source.name,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
