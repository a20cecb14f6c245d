"""The tuner's search, as pure functions: which chunk shapes may be tried, and how to climb among them.

Nothing here reads a file or runs a task. A candidate is a tuple of
*multiples*: how many storage units each chunk spans along each axis, where
the unit is one storage chunk (chunked data) or one slab index along the
slowest axis (contiguous data). Every candidate is therefore aligned to
storage by construction, so no storage chunk is decoded twice.

The climb is told how to measure a candidate (``measure``), so tests drive it
with a timing model and the tuner with real reads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from daskstream.planning.budget import format_size

Multiples = tuple[int, ...]
# A step of the climb: the axis, and whether the chunk doubles (True) or halves along it.
Step = tuple[int, bool]


@dataclass(frozen=True)
class SearchSpace:
    """The chunk shapes the tuner may choose from for one array.

    Attributes
    ----------
    shape
        The array's shape.
    itemsize
        Bytes per element.
    unit
        The smallest chunk the tuner considers along each axis: the storage
        chunk (clipped to the array), or for contiguous data one index of the
        slowest axis and the other axes whole.
    axes
        Axes along which chunks may grow or shrink (for contiguous data only
        the slowest, so that every task reads one contiguous byte range).
    per_task_bytes
        Memory one task may hold: the memory budget divided by the threads
        sharing it.
    concurrency
        Tasks that run at once (threads times workers).
    """

    shape: tuple[int, ...]
    itemsize: int
    unit: tuple[int, ...]
    axes: tuple[int, ...]
    per_task_bytes: int
    concurrency: int

    @property
    def n_units(self) -> tuple[int, ...]:
        """Units along each axis (the last may be partial)."""
        return tuple(max(1, math.ceil(n / u)) for n, u in zip(self.shape, self.unit))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def chunks(self, multiples: Multiples) -> tuple[int, ...]:
        """The chunk shape of ``multiples``, clipped to the array."""
        return tuple(min(u * m, n) for u, m, n in zip(self.unit, multiples, self.shape))

    def chunk_bytes(self, multiples: Multiples) -> int:
        return math.prod(self.chunks(multiples)) * self.itemsize

    def n_tasks(self, multiples: Multiples) -> int:
        """Chunks (read tasks) over the whole array."""
        return math.prod(math.ceil(n / c) for n, c in zip(self.shape, self.chunks(multiples)) if n)

    def multiples_of(self, chunks: tuple[int, ...]) -> Multiples | None:
        """The multiples giving ``chunks``, or ``None`` when ``chunks`` is not a whole number of units."""
        out = []
        for axis, (c, u, n) in enumerate(zip(chunks, self.unit, self.shape)):
            if c == n:
                out.append(self.n_units[axis])
            elif c % u == 0 and (axis in self.axes or c == u):
                out.append(c // u)
            else:
                return None
        return tuple(out)

    def clip(self, multiples: Multiples) -> Multiples:
        """``multiples`` limited to ``[1, units along the axis]``; fixed axes stay at their start."""
        return tuple(max(1, min(m, n)) for m, n in zip(multiples, self.n_units))

    def neighbours(self, multiples: Multiples) -> Iterator[tuple[Step, Multiples]]:
        """One step from ``multiples``: each free axis doubled, then each halved (when that changes it).

        Yields ``((axis, up), multiples)``, the step and where it leads.
        """
        for up in (True, False):
            for axis in self.axes:
                m = multiples[axis]
                stepped = min(m * 2, self.n_units[axis]) if up else max(1, m // 2)
                if stepped != m:
                    yield (axis, up), (*multiples[:axis], stepped, *multiples[axis + 1 :])

    def rejection(self, multiples: Multiples, memory_factor: float) -> str | None:
        """Why ``multiples`` may not run at all (memory or parallelism), or ``None``."""
        nbytes = self.chunk_bytes(multiples)
        projected = memory_factor * nbytes
        if projected > self.per_task_bytes:
            return (
                f"projected {format_size(projected)} per task ({memory_factor:.1f} x the chunk) exceeds "
                f"the budget's {format_size(self.per_task_bytes)} per task"
            )
        tasks = self.n_tasks(multiples)
        if tasks < min(self.concurrency, math.prod(self.n_units)):
            return f"{tasks} task(s) for {self.concurrency} concurrent slots: some would idle"
        return None

    def sweep(self, memory_factor: float) -> list[Multiples]:
        """Every power-of-two multiple of the unit (and each whole axis) that the budget admits."""

        def steps(axis: int) -> list[int]:
            if axis not in self.axes:
                return [1]
            n = self.n_units[axis]
            powers = [2**k for k in range(n.bit_length()) if 2**k < n]
            return [*powers, n]

        grid: list[Multiples] = [()]
        for axis in range(len(self.shape)):
            grid = [(*g, m) for g in grid for m in steps(axis)]
        return [m for m in grid if self.rejection(m, memory_factor) is None]


@dataclass(frozen=True)
class Measurement:
    """What one timed sample of a candidate showed.

    Attributes
    ----------
    throughput
        Projected bytes per second over the whole array (see :func:`project_seconds`).
    spread
        Relative half-range of the per-batch throughputs: the noise a rival must beat.
    task_seconds
        Median seconds one task took (wall time of a batch per wave).
    sample_bytes
        Bytes read for this measurement.
    seconds
        Wall time the measurement took.
    peak_task_bytes
        Peak memory of one task, when it was measured.
    """

    throughput: float
    spread: float
    task_seconds: float
    sample_bytes: int
    seconds: float
    peak_task_bytes: int | None = None


@dataclass
class Trial:
    """One candidate the search looked at: measured, or pruned with the reason."""

    multiples: Multiples
    measurement: Measurement | None = None
    pruned: str | None = None
    origin: str = "climb"


@dataclass
class Limits:
    """When the search must stop: a time budget (from ``started``, default now) and a cap on bytes sampled."""

    time_budget: float
    sample_cap: int
    clock: Callable[[], float] = time.perf_counter
    started: float | None = None
    sampled: int = 0

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock()

    @property
    def elapsed(self) -> float:
        assert self.started is not None  # __post_init__ sets it
        return self.clock() - self.started

    def over_sample(self, sample_bytes: int) -> str | None:
        """Why a measurement reading ``sample_bytes`` more would pass the sample cap, or ``None``."""
        if self.sampled + sample_bytes > self.sample_cap:
            return (
                f"would read {format_size(sample_bytes)} more, past the sample cap of "
                f"{format_size(self.sample_cap)} ({format_size(self.sampled)} read)"
            )
        return None

    def out_of_time(self, seconds_estimate: float) -> str | None:
        """Why a measurement taking about ``seconds_estimate`` may not start in the time left, or ``None``."""
        if self.elapsed + seconds_estimate > self.time_budget:
            return f"time budget reached: {self.elapsed:.2f} s spent of {self.time_budget:.2f} s"
        return None


def project_seconds(space: SearchSpace, multiples: Multiples, task_seconds: float, overhead: float) -> float:
    """Seconds the whole array would take: full waves of tasks, plus the tasks that combine them.

    A wave is ``concurrency`` tasks running side by side; the last one may be
    partly idle, which the sample cannot show. Each read task's partial result
    is combined by further tasks costing about ``overhead`` each.
    """
    tasks = space.n_tasks(multiples)
    waves = math.ceil(tasks / space.concurrency)
    return waves * task_seconds + tasks * overhead / space.concurrency


def beats(challenger: Measurement, holder: Measurement, min_gain: float) -> bool:
    """True when ``challenger`` is faster by more than the noise of both and ``min_gain``."""
    margin = max(min_gain, challenger.spread + holder.spread)
    return challenger.throughput > holder.throughput * (1 + margin)


def _held(best: Trial) -> Measurement:
    """The measurement of the climb's best trial: only a measured trial ever becomes the best."""
    assert best.measurement is not None
    return best.measurement


@dataclass
class ClimbOutcome:
    """The climb's result: every trial in order, the winner, and why it stopped."""

    trials: list[Trial]
    best: Trial | None
    stopped: str


def hill_climb(
    space: SearchSpace,
    start: Multiples,
    measure: Callable[[Multiples], Measurement],
    *,
    limits: Limits,
    sample_bytes: Callable[[Multiples], int],
    memory_factor: Callable[[], float],
    overhead_floor: float,
    min_gain: float,
    extra_starts: tuple[Multiples, ...] = (),
) -> ClimbOutcome:
    """Climb from ``start`` by doubling or halving one axis at a time while a step wins.

    Parameters
    ----------
    space
        The candidates allowed.
    start
        Where to begin: the planner's choice.
    measure
        Times a candidate; called only for candidates that pass the checks.
    limits
        Time budget and sample cap; checked before every measurement.
    sample_bytes
        Bytes a measurement of a candidate would read.
    memory_factor
        Peak memory of a task as a multiple of its chunk, as known so far.
    overhead_floor
        Seconds per task below which the scheduler's own cost dominates:
        candidates projected to run shorter tasks are pruned.
    min_gain
        Smallest relative gain a step must show, on top of the measured noise.
    extra_starts
        Other candidates to measure first (e.g. chunks observed in earlier
        runs); the climb starts from the best of all starts.

    Returns
    -------
    ClimbOutcome
    """
    trials: dict[Multiples, Trial] = {}
    stopped = ""

    def attempt(multiples: Multiples, origin: str) -> Trial | None:
        nonlocal stopped
        if multiples in trials:
            return trials[multiples]
        trial = Trial(multiples, origin=origin)
        trial.pruned = space.rejection(multiples, memory_factor())
        if trial.pruned is None and best is not None:
            per_byte = _held(best).task_seconds / space.chunk_bytes(best.multiples)
            projected = per_byte * space.chunk_bytes(multiples)
            if projected < overhead_floor:
                trial.pruned = (
                    f"projected {projected * 1e3:.2f} ms per task, under the scheduler's overhead "
                    f"floor of {overhead_floor * 1e3:.2f} ms"
                )
        if trial.pruned is None:
            trial.pruned = limits.over_sample(sample_bytes(multiples))
        if trial.pruned is None:
            # The next measurement takes about as long per byte as the last one did (with a margin).
            last = next((t.measurement for t in reversed(trials.values()) if t.measurement), None)
            per_byte = 0.0 if last is None else last.seconds / max(last.sample_bytes, 1)
            stopped = limits.out_of_time(1.25 * per_byte * sample_bytes(multiples)) or ""
            if stopped:
                return None
            trial.measurement = measure(multiples)
            limits.sampled += trial.measurement.sample_bytes
        trials[multiples] = trial
        return trial

    best: Trial | None = None
    for multiples, origin in ((start, "planner"), *((m, "observed") for m in extra_starts)):
        trial = attempt(space.clip(multiples), origin)
        if trial is None:
            break
        if trial.measurement is not None and (best is None or beats(trial.measurement, _held(best), 0.0)):
            best = trial
    if best is None:
        return ClimbOutcome(list(trials.values()), None, stopped or "no candidate could be measured")

    last_step: Step | None = None
    while not stopped:
        # Keep going the way that last won before trying the others, as a climber would.
        moves = sorted(space.neighbours(best.multiples), key=lambda move: move[0] != last_step)
        for step, multiples in moves:
            trial = attempt(multiples, "climb")
            if trial is None:
                break
            if trial.measurement is not None and beats(trial.measurement, _held(best), min_gain):
                best, last_step = trial, step
                break
        else:
            capped = any(t.pruned and "sample cap" in t.pruned for t in trials.values())
            stopped = (
                "no step from the winner that fits the sample cap beats it by more than the noise"
                if capped
                else "converged: no step from the winner beats it by more than the noise"
            )
    return ClimbOutcome(list(trials.values()), best, stopped)
