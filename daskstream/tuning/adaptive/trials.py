"""Adaptive runs, as pure functions: which settings to try, where each runs, and which one wins.

An adaptive run cuts the array along its first axis into *waves*, each a
contiguous run of storage-aligned rows computed as one piece with one
*setting* (rows per task, threads). The first waves are trials: the
planner's setting and a few alternatives, interleaved in rounds whose order
rotates so a machine getting busier or a cache warming up does not favour
one of them. Every trial wave is real work: its result is part of the answer,
so trying costs no extra bytes read. The rest of the array then runs in one
wave with the winner.

Nothing here reads a file or runs a task; :mod:`daskstream.tuning.adaptive.engine`
runs the waves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from daskstream.planning.budget import format_size
from daskstream.tuning.candidates import Multiples, SearchSpace


@dataclass(frozen=True)
class Setting:
    """One way to run a wave.

    Attributes
    ----------
    multiples
        Storage units per task along each axis (see :class:`SearchSpace`).
    threads
        Tasks run at once.
    role
        Why it is tried: ``"planner"`` (the rule's choice), ``"remembered"``
        (an earlier run's winner), ``"more threads"`` (more reads waiting
        at once, on tasks as large as the budget allows: for latency-bound reads),
        ``"larger tasks"`` (fewer tasks: for per-task costs).
    """

    multiples: Multiples
    threads: int
    role: str

    def describe(self, space: SearchSpace) -> str:
        """``"(2048, 1024), 8.00 MiB x 2 threads"``."""
        return (
            f"{space.chunks(self.multiples)}, {format_size(space.chunk_bytes(self.multiples))} x {self.threads} threads"
        )


def settings_to_try(
    space: SearchSpace,
    start: Multiples,
    threads: int,
    *,
    memory_factor: float,
    max_threads: int,
    budget_bytes: int,
    role: str = "planner",
) -> list[Setting]:
    """The setting to start from and the alternatives an adaptive run tries beside it.

    Alternatives change only the first axis (the one waves cut along) and
    hold the memory budget (:func:`in_budget`: ``budget_bytes``, what one
    worker's tasks may hold at once).

    * more threads: four times the threads (at most ``max_threads``), on the
      same tasks when the budget holds four times as many at once, else on
      tasks cut (halving their rows) until it does: four times the reads
      waiting at once on a disk or an object store;
    * larger tasks: twice the rows per task on the same threads, when the
      budget admits it and the array has enough tasks left for every thread.

    Examples
    --------
    >>> space = SearchSpace((65536, 1024), 4, (256, 1024), (0, 1), 2**27, 2)
    >>> tried = settings_to_try(space, (8, 1), 2, memory_factor=2.0, max_threads=16, budget_bytes=2**28)
    >>> [(s.multiples, s.threads, s.role) for s in tried]
    [((8, 1), 2, 'planner'), ((8, 1), 8, 'more threads'), ((16, 1), 2, 'larger tasks')]
    """
    n_rows = space.n_units[0]

    def admitted(multiples: Multiples, with_threads: int) -> bool:
        tasks = math.ceil(n_rows / multiples[0])
        in_memory = in_budget(space, multiples, with_threads, memory_factor=memory_factor, budget_bytes=budget_bytes)
        return in_memory and tasks >= with_threads

    out = [Setting(start, threads, role)]
    more = min(max_threads, threads * 4)
    if more > threads:
        # The same tasks if the budget holds them all at once, else the largest fewer rows that fit.
        rows = start[0]
        while rows > 1 and not admitted((rows, *start[1:]), more):
            rows //= 2
        candidate = (rows, *start[1:])
        if admitted(candidate, more):
            out.append(Setting(candidate, more, "more threads"))
    larger = (min(start[0] * 2, n_rows), *start[1:])
    if larger != start and admitted(larger, threads):
        out.append(Setting(larger, threads, "larger tasks"))
    return out


def in_budget(
    space: SearchSpace, multiples: Multiples, threads: int, *, memory_factor: float, budget_bytes: int
) -> bool:
    """Whether ``threads`` tasks of ``multiples`` at once, each ``memory_factor`` times its chunk, fit ``budget_bytes``.

    >>> space = SearchSpace((65536, 1024), 4, (256, 1024), (0, 1), 2**27, 2)
    >>> in_budget(space, (8, 1), 8, memory_factor=2.0, budget_bytes=2**28), in_budget(space, (64, 1), 8, memory_factor=2.0, budget_bytes=2**28)
    (True, False)
    """
    return memory_factor * space.chunk_bytes(multiples) * threads <= budget_bytes


@dataclass(frozen=True)
class Wave:
    """Rows ``[start, stop)`` of the first axis (in elements), run with ``settings[setting]``.

    ``trial`` is the round it belongs to (from 0), -1 for the warm-up wave
    (computed, not timed), ``None`` for the wave that runs the rest with the
    winner.
    """

    setting: int
    start: int
    stop: int
    trial: int | None


def wave_rows(space: SearchSpace, setting: Setting, tasks_per_thread: int) -> int:
    """Rows (elements of the first axis) of ``tasks_per_thread`` tasks per thread of ``setting``."""
    return space.unit[0] * setting.multiples[0] * setting.threads * tasks_per_thread


def lay_out_trials(
    space: SearchSpace,
    settings: Sequence[Setting],
    *,
    rounds: int,
    tasks_per_thread: int,
    trial_fraction: float,
) -> tuple[list[Wave], str | None]:
    """The trial waves, in the order they run, and why there are none when the array is too small.

    First a warm-up wave of the first setting (``trial == -1``: one task per
    thread, computed but not timed, since it carries the run's start-up), then
    as many rounds as ``rounds`` and ``trial_fraction`` of the first axis
    allow, each wave ``tasks_per_thread`` tasks per thread of its setting (so
    each ends with the same share of its time spent finishing its last
    tasks while other threads idle). Fewer than one
    round, or a single setting, means no trials (the reason says which).
    Round ``r`` runs the settings starting from the ``r``-th, so each setting
    runs early once and late once.

    Examples
    --------
    >>> space = SearchSpace((65536, 1024), 4, (256, 1024), (0, 1), 2**27, 2)
    >>> settings = settings_to_try(space, (8, 1), 2, memory_factor=2.0, max_threads=16, budget_bytes=2**28)
    >>> waves, why = lay_out_trials(space, settings, rounds=2, tasks_per_thread=1, trial_fraction=0.9)
    >>> [(w.setting, w.start, w.stop, w.trial) for w in waves]
    [(0, 0, 4096, -1), (0, 4096, 8192, 0), (1, 8192, 24576, 0), (2, 24576, 32768, 0)]
    >>> why
    """
    n = space.shape[0]
    if len(settings) < 2:
        return [], "no alternative fits the memory budget and the array's tasks"
    warm_up = wave_rows(space, settings[0], 1)
    sizes = [wave_rows(space, s, tasks_per_thread) for s in settings]
    one_round = sum(sizes)
    allowed = int(n * trial_fraction) - warm_up
    fit = min(rounds, max(0, allowed) // one_round)
    if fit < 1:
        return [], (
            f"one round of trials ({warm_up + one_round} of {n} rows along the first axis) would be more than "
            f"{trial_fraction:.0%} of the array: too small to try alternatives"
        )
    waves = [Wave(0, 0, warm_up, -1)]
    start = warm_up
    for r in range(fit):
        for i in range(len(settings)):
            index = (i + r) % len(settings)
            waves.append(Wave(index, start, start + sizes[index], r))
            start += sizes[index]
    return waves, None


def rest_wave(waves: Sequence[Wave], n_rows: int, setting: int) -> Wave | None:
    """The wave running everything after ``waves`` with ``setting``, or ``None`` when nothing is left."""
    start = max((w.stop for w in waves), default=0)
    return Wave(setting, start, n_rows, None) if start < n_rows else None


@dataclass(frozen=True)
class Choice:
    """The winner of the trials and why.

    Attributes
    ----------
    setting
        Index of the winning setting.
    throughputs
        Median bytes per second of each setting's trial waves.
    spreads
        Half the range of each setting's throughputs over their median
        (0 with one wave): the noise.
    reason
        One sentence for people.
    """

    setting: int
    throughputs: tuple[float, ...]
    spreads: tuple[float, ...]
    reason: str


def choose(settings: Sequence[Setting], measured: Sequence[Sequence[float]], *, min_gain: float) -> Choice:
    """The setting to run the rest with: the fastest, unless it beats the first by no more than the noise.

    ``measured[i]`` holds the throughputs (bytes per second) of setting
    ``i``'s trial waves. The first setting (the planner's or the remembered
    one) is kept unless another's median is faster by more than
    ``min_gain`` and the two settings' spreads together.

    Examples
    --------
    >>> space = SearchSpace((65536, 1024), 4, (256, 1024), (0, 1), 2**27, 2)
    >>> settings = settings_to_try(space, (8, 1), 2, memory_factor=2.0, max_threads=16, budget_bytes=2**28)
    >>> choose(settings, [[1.0e9, 1.1e9], [2.0e9, 2.1e9], [0.9e9, 1.0e9]], min_gain=0.05).setting
    1
    >>> choose(settings, [[1.0e9, 1.1e9], [1.08e9, 1.1e9], [0.9e9, 1.0e9]], min_gain=0.05).setting
    0
    """
    medians = tuple(statistics.median(m) if m else 0.0 for m in measured)
    spreads = tuple(
        (max(m) - min(m)) / 2 / statistics.median(m) if len(m) > 1 and medians[i] else 0.0
        for i, m in enumerate(measured)
    )
    best = max(range(len(settings)), key=lambda i: medians[i])
    first = settings[0]
    if best == 0 or not medians[0]:
        return Choice(0, medians, spreads, f"the {first.role}'s setting ran fastest")
    gain = medians[best] / medians[0] - 1
    margin = max(min_gain, spreads[0] + spreads[best])
    if gain <= margin:
        return Choice(
            0,
            medians,
            spreads,
            f"{settings[best].role} ran {gain:.0%} faster than the {first.role}'s setting, within the noise "
            f"({margin:.0%}): kept the {first.role}'s",
        )
    return Choice(
        best,
        medians,
        spreads,
        f"{settings[best].role} ran {gain:.0%} faster than the {first.role}'s setting, beyond the noise ({margin:.0%})",
    )
