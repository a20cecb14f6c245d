"""The engine of adaptive runs: waves along the first axis, trials interleaved, the rest with the winner.

An :class:`AdaptiveJob` says what one wave computes with a setting and how
the waves' results make the answer (a reduction's pieces joined, a store's
blocks written); :class:`WaveRunner` lays out the waves
(:mod:`daskstream.tuning.adaptive.trials`), runs and times them, chooses, records the
:class:`~daskstream.tuning.adaptive.record.Adaptation` and remembers the winner in
the tuning cache under the job's key.

Waves run on this process's threads (the threaded scheduler: how many is one
of the knobs), or on a distributed cluster (an active ``ds.session`` of one,
or a ``distributed.Client`` made the default): there each wave is submitted
as futures and gathered, every thread of the cluster takes its tasks (the
threads knob becomes the tasks in flight, the cluster's threads: no more can
run at once), the rows per task are tried as on threads, and the winner is
remembered under a key naming the cluster's kind and size. On another
scheduler (``sync``, ``processes``), or with an array too small for trials,
the job runs as planned and the record says why.
"""

from __future__ import annotations

import math
import time
from typing import Any

from daskstream import config
from daskstream.planning.budget import format_size
from daskstream.planning.settings import PlanSettings
from daskstream.runtime.progress import progress_bar
from daskstream.runtime.remembered import TuneCache
from daskstream.runtime.schedulers import current, scheduler_kind
from daskstream.tuning.adaptive.reads import Cluster
from daskstream.tuning.adaptive.record import Adaptation, Tried
from daskstream.tuning.adaptive.trials import (
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
from daskstream.tuning.candidates import Multiples, SearchSpace


class AdaptiveJob:
    """What an adaptive run does in each wave; :class:`WaveRunner` decides which waves run how.

    A job knows its array's search space (the units a task is made of and the
    axes they grow along), the planner's setting, what one wave computes with
    a setting, and how the waves' results make the answer.
    """

    #: Shown in the progress bar and the record: what is read or written.
    name: str
    #: The operation: a reduction's name, ``"describe"``, ``"store"``.
    operation: str
    #: The planner's settings, resolved where the run was asked for (the budget, the threads).
    settings: PlanSettings
    progress: bool | None

    def search_space(self, settings: PlanSettings) -> SearchSpace:
        raise NotImplementedError

    def cache_key(self, space: SearchSpace, settings: PlanSettings) -> dict[str, Any]:
        """Where the winner is remembered: the tuning cache's key for this kind of data and work."""
        raise NotImplementedError

    def planned_multiples(self, space: SearchSpace, settings: PlanSettings) -> Multiples | None:
        """The planner's task as whole units of ``space`` (``None`` when it is not: nothing is tried)."""
        raise NotImplementedError

    def memory_factor(self, settings: PlanSettings) -> float:
        """What one task holds, as a multiple of its block's bytes."""
        raise NotImplementedError

    def planned_threads(self, settings: PlanSettings) -> int:
        """The threads the run would have without adapting."""
        return settings.resources.threads

    def why_not(self, space: SearchSpace) -> str | None:
        """Why this job cannot run in waves (``None`` when it can)."""
        return None

    def run_wave(
        self, space: SearchSpace, setting: Setting, wave: Wave, bar: Any, cluster: Cluster | None
    ) -> tuple[Any, float, float]:
        """Rows ``[wave.start, wave.stop)`` computed with ``setting`` on this process's threads, or as
        futures on ``cluster``: the wave's result, its wall seconds and its seconds from first task to last
        (see :func:`daskstream.tuning.adaptive.reads.compute_wave`)."""
        raise NotImplementedError

    def run_whole(self, bar: Any) -> tuple[Any, float]:
        """Everything as planned, in one computation: the answer and its seconds."""
        raise NotImplementedError

    def join(self, parts: list[Any]) -> Any:
        """The answer from the waves' results, in row order."""
        raise NotImplementedError


def row_bytes(space: SearchSpace) -> int:
    """Bytes of one index of the first axis."""
    return math.prod(space.shape[1:]) * space.itemsize


class WaveRunner:
    """One adaptive run of an :class:`AdaptiveJob`."""

    def __init__(self, job: AdaptiveJob) -> None:
        self.job = job
        self.settings = job.settings
        self.kind = scheduler_kind()
        # Where the waves run: this process's threads, or a distributed cluster's as futures.
        self.cluster = Cluster.active() if self.kind == "distributed" else None
        self.space = job.search_space(self.settings)
        self.row_bytes = row_bytes(self.space)
        self.key = job.cache_key(self.space, self.settings)
        if self.cluster is not None:
            # A laptop's choice is not a cluster's, nor a small cluster's a large one's.
            self.key["cluster"] = self.cluster.key
        # The planner's task as whole units (None when it is not: then nothing is tried).
        self.planned_multiples = job.planned_multiples(self.space, self.settings)
        # Tasks at once: the job's threads, or on a cluster all of its threads (a wave's futures fill them).
        threads = job.planned_threads(self.settings) if self.cluster is None else self.cluster.threads
        self.planner = Setting(self.planned_multiples or (1,) * len(self.space.shape), threads, "planner")
        self.memory_factor = job.memory_factor(self.settings)
        # What one worker's tasks may hold at once; on a cluster, all workers' (as many tasks run on each).
        at_once = self.settings.resources.threads if self.cluster is None else self.cluster.threads
        self.budget = self.space.per_task_bytes * at_once
        # Seconds each wave took (wall, and first task to last), by its first row.
        self.spent: dict[int, float] = {}
        self.busy: dict[int, float] = {}

    # -- what to try -------------------------------------------------------------

    def _start(self) -> tuple[Setting, str]:
        entry = TuneCache().get(self.key) or {}
        remembered = entry.get("adaptive")
        if isinstance(remembered, dict) and isinstance(remembered.get("multiples"), list):
            # On a cluster every wave has the cluster's threads in flight, whatever was remembered.
            threads = self.planner.threads
            if self.cluster is None:
                threads = int(remembered.get("threads", threads))
            setting = Setting(self.space.clip(tuple(int(m) for m in remembered["multiples"])), threads, "remembered")
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
            max_threads=self._max_threads(),
            budget_bytes=self.budget,
            role=start.role,
        )
        planner = self.planner
        if start.role == "remembered" and (planner.multiples, planner.threads) != (start.multiples, start.threads):
            # The planner's own setting is tried second, so a remembered one that no longer wins is left.
            others = [s for s in tried[1:] if (s.multiples, s.threads) != (planner.multiples, planner.threads)]
            return [start, planner, *others]
        return tried

    def _max_threads(self) -> int:
        """The most threads a setting may have: ``adaptive.max-threads``; on a cluster, its threads as well
        (more tasks submitted at once than that would wait in the workers' queues)."""
        most = int(config.setting("adaptive.max-threads"))
        return most if self.cluster is None else min(most, self.cluster.threads)

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
            # A round of every alternative does not fit: leave out the one with the largest waves.
            per_thread = int(config.setting("adaptive.tasks-per-thread"))
            largest = max(range(1, len(settings)), key=lambda i: wave_rows(self.space, settings[i], per_thread))
            settings, why_not = [s for i, s in enumerate(settings) if i != largest], None
        bar = self._bar()
        try:
            if why_not is not None:
                result, seconds = self.job.run_whole(bar)
                choice = Choice(0, (0.0,), (0.0,), why_not)
                return result, self._adaptation([start], [seconds], choice, [], None, started, started_from)
            return self._adapt(settings, waves, bar, started, started_from)
        finally:
            if bar is not None:
                bar.close()

    def _why_not(self) -> str | None:
        """Why this run cannot adapt, or ``None``."""
        if self.kind == "distributed":
            if self.cluster is None:
                return "no distributed Client is active to submit waves to"
            if not self.cluster.threads:
                return f"the {self.cluster.kind} at {self.cluster.address} has no workers to run waves on"
        elif self.kind != "threads":
            return (
                "adaptive runs choose how many tasks run at once, so they need the threaded scheduler or a "
                f"distributed cluster; this one is {self.kind!r}"
            )
        own = self.job.why_not(self.space)
        if own is None and self.planned_multiples is None:
            return "the planner's chunks are not whole storage chunks"
        return own

    def _adapt(
        self, settings: list[Setting], waves: list[Wave], bar: Any, started: float, started_from: str
    ) -> tuple[Any, Adaptation]:
        n_rows = self.space.shape[0]
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
            result = self.job.join([parts[k] for k in sorted(parts)])
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
        result = self.job.join([parts[k] for k in sorted(parts)])
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
            desc=f"{self.job.operation} {self.job.name} (adaptive)",
        )

    def _run_wave(self, setting: Setting, wave: Wave, bar: Any) -> tuple[Any, float, float]:
        return self.job.run_wave(self.space, setting, wave, bar, self.cluster)

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
            source=self.job.name,
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
            cluster=None if self.cluster is None else str(self.cluster),
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
                "source": self.job.name,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
