"""Tasks that hold whole columns: how many positions of the kept axes each task takes.

A quantile along an axis (the 95th percentile over time of every pixel) needs
the whole reduced extent of a position in one task. How many positions a task
takes is a trade between memory and time: every task holds its columns (a few
copies of them while numpy partitions), so fewer positions hold less; but a
task reads every storage chunk its columns cross, so positions that cut
through storage chunks read those chunks again (a file stored one day at a
time is crossed in full by every task, whatever it holds), and very large
tasks run numpy's selection slower per byte and leave threads idle.

The plan estimates, for each candidate (per kept axis: the storage chunk's
extent, halved or doubled, or the whole axis), the seconds of the whole
computation on this many threads (waves of tasks, each costing the storage
chunks it touches and the bytes it selects) and the memory of the tasks
running at once, and takes the one holding the least memory among those
within :data:`SLACK` of the fastest. The memory budget is a ceiling, never a
target: no task holds more than its per-task share, and with none that fits
there is no plan (the caller says so). The rates are this module's
constants, measured on a 2-core machine on the per-pixel 95th percentile of
a 3650 x 180 x 360 float32 NetCDF field stored a day per chunk and in
365 x 45 x 90 blocks (``benchmarks/peers.py`` runs it beside xarray).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Seconds one task spends per storage chunk it touches beyond the bytes it copies: finding, opening
#: and cutting the chunk (a day-per-chunk NetCDF read in 1,080-pixel columns: 87 us a chunk).
TOUCH_SECONDS = 90e-6

#: Bytes a thread decodes a second, for storage chunks decoded whole wherever a task touches them
#: (compressed chunks): the planner's default read rate.
DECODE_RATE = 500e6

#: Bytes a thread reads a second of an uncompressed storage chunk it touches: a chunk cut into
#: short runs costs about what reading it whole does (a copy from the page cache).
COPY_RATE = 3e9

#: Bytes of columns numpy's quantile selects a second on one thread (float32 columns of 3,650: 59 MB
#: in 0.35 s, the same from 16 MB to 237 MB a task).
SELECT_RATE = 170e6

#: Smallest and largest bytes of columns a task is planned to hold, where the array allows: below,
#: tasks are the scheduler's; above, numpy's selection was measured at half its rate (237 MB tasks
#: of a day-per-chunk file), and fewer tasks than threads leave threads idle.
SMALLEST_TASK_BYTES = 8 * 2**20
LARGEST_TASK_BYTES = 128 * 2**20

#: The plan holding the least memory within this share of the fastest estimate is taken.
SLACK = 0.1


@dataclass(frozen=True)
class ColumnPlan:
    """Positions of the kept axes one task holds, and what that costs.

    Attributes
    ----------
    chunks
        Extent per kept axis of one task (the reduced axes are whole).
    tasks
        Tasks of the computation.
    task_bytes
        Bytes of columns the largest task holds.
    held_bytes
        Bytes the tasks running at once hold, copies included.
    seconds
        The estimate the choice was made on.
    reads_again
        Storage chunk reads per storage chunk: 1.0 when no task cuts through
        one, more when columns are split within storage chunks.
    """

    chunks: dict[int, int]
    tasks: int
    task_bytes: int
    held_bytes: int
    seconds: float
    reads_again: float


def plan_columns(
    shape: Sequence[int],
    itemsize: int,
    reduced: Sequence[int],
    *,
    storage: Sequence[int],
    decoded: bool,
    threads: int,
    per_task_bytes: int,
    copies: int,
) -> ColumnPlan | None:
    """Plan the positions each task of a whole-column computation holds; ``None`` when not one fits.

    Parameters
    ----------
    shape
        The array's shape.
    itemsize
        Bytes per value as a task holds it.
    reduced
        Axes each task holds whole.
    storage
        Storage chunk extents per axis (the array's own chunks, for computed arrays).
    decoded
        Whether a touched storage chunk is decoded whole (compressed), rather than cut as it is read.
    threads
        Threads running tasks at once.
    per_task_bytes
        The budget's share of one task: a plan's task never holds more.
    copies
        Copies of its columns a task holds at once.

    Examples
    --------
    A field stored one day per chunk is crossed in full by every task: its
    tasks are as large as keeps the touches cheap, not as small as memory
    allows.

    >>> day = plan_columns((3650, 180, 360), 4, (0,), storage=(1, 180, 360), decoded=False, threads=2,
    ...                    per_task_bytes=2**33, copies=3)
    >>> day.chunks, day.tasks
    ({1: 45, 2: 180}, 8)

    Stored compressed in blocks of 45 x 90 pixels, tasks take whole blocks'
    columns: a block cut in two would be decoded twice.

    >>> block = plan_columns((3650, 180, 360), 4, (0,), storage=(365, 45, 90), decoded=True, threads=2,
    ...                      per_task_bytes=2**33, copies=3)
    >>> block.chunks, block.reads_again
    ({1: 45, 2: 90}, 1.0)

    However large the budget, tasks hold what the speed needs.

    >>> block.held_bytes < 2**30
    True
    """
    kept = [a for a in range(len(shape)) if a not in reduced]
    column = math.prod(shape[a] for a in reduced) * itemsize
    if column * copies > per_task_bytes:
        return None
    units = {a: max(1, min(storage[a], shape[a])) for a in range(len(shape))}
    # Storage chunks a column crosses along the reduced axes, each touched by every task over it.
    reduced_chunks = math.prod(math.ceil(shape[a] / units[a]) for a in reduced)
    chunk_bytes = math.prod(units.values()) * itemsize
    touch = TOUCH_SECONDS + chunk_bytes / (DECODE_RATE if decoded else COPY_RATE)
    options = {a: _extents(shape[a], units[a]) for a in kept}
    candidates = []
    for extents in itertools.product(*(options[a] for a in kept)):
        chunks = dict(zip(kept, extents))
        task_bytes = column * math.prod(extents)
        if task_bytes * copies > per_task_bytes:
            continue
        tasks = math.prod(math.ceil(shape[a] / chunks[a]) for a in kept)
        touched = reduced_chunks * math.prod(_touches(shape[a], chunks[a], units[a]) for a in kept)
        per_task = touched / tasks * touch + task_bytes / SELECT_RATE
        seconds = math.ceil(tasks / threads) * per_task
        held = min(tasks, threads) * task_bytes * copies
        stored = reduced_chunks * math.prod(math.ceil(shape[a] / units[a]) for a in kept)
        candidates.append(ColumnPlan(chunks, tasks, task_bytes, held, seconds, touched / stored))
    if not candidates:
        return None
    sized = [c for c in candidates if SMALLEST_TASK_BYTES <= c.task_bytes <= LARGEST_TASK_BYTES]
    if not sized:  # the array is smaller than a task's least, or one column is larger than its most
        least = min(c.task_bytes for c in candidates)
        sized = [c for c in candidates if c.task_bytes <= max(least, LARGEST_TASK_BYTES)]
    fastest = min(c.seconds for c in sized)
    near = [c for c in sized if c.seconds <= fastest * (1 + SLACK)]
    return min(near, key=lambda c: (c.held_bytes, c.seconds, c.tasks))


def _extents(length: int, unit: int) -> list[int]:
    """Task extents to try along an axis: the storage chunk's, halved and doubled, and the whole axis."""
    found = {length}
    size = unit
    while size >= 1:
        found.add(size)
        size //= 2
    size = unit * 2
    while size < length:
        found.add(size)
        size *= 2
    return sorted(found)


def _touches(length: int, extent: int, unit: int) -> float:
    """Storage chunks of ``unit`` that the tasks of ``extent`` along an axis of ``length`` touch, summed.

    Tasks start at multiples of ``extent``; over a whole period each touches
    ``(extent + unit - gcd(extent, unit)) / unit`` chunks on average.
    """
    if extent >= length:
        return float(math.ceil(length / unit))
    tasks = math.ceil(length / extent)
    return tasks * (extent + unit - math.gcd(extent, unit)) / unit


__all__ = ["ColumnPlan", "plan_columns"]
