"""Rechunking plans: from the chunks data can be read in to other chunks, within a memory budget.

A storage chunk decoded by two tasks is decoded twice, so a task that reads
must cover whole source chunks; a task that writes must hold whole target
chunks. Along each axis the two grids meet every ``lcm(source, target)``
elements (the axis's *period*): a box one period long on every axis holds
whole chunks of both, and reading such boxes rechunks in **one pass**.

When a period box is larger than a task may hold (rows into columns: the
box is the whole array) the data goes through an **intermediate** array, as
rechunker does: the first pass reads boxes of whole source chunks, grown
towards the target's shape as far as the budget allows, and writes them as
intermediate chunks; the second reads boxes of whole intermediate chunks,
grown towards the source's shape, and cuts them into target chunks. The
intermediate chunk is, along each axis, the largest length whose multiples
hold both passes' box boundaries, so both passes read and write whole
intermediate chunks and each is written once and read once.

Pure arithmetic on shapes; the graph that carries a plan out is built in
:mod:`daskstream.graph.rechunk`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from daskstream.advice import named, said
from daskstream.errors import MemoryBudgetError
from daskstream.planning.budget import format_size


@dataclass(frozen=True)
class RechunkPlan:
    """How an array moves from one chunk grid to another.

    Attributes
    ----------
    shape, itemsize
        The array.
    source_chunks
        The chunks it can be read in without decoding anything twice: its
        storage chunks (ones for a contiguous file, readable in any box).
    target_chunks
        The chunks asked for.
    read_chunks
        The box each task of the first (or only) pass reads: whole source chunks.
    intermediate_chunks
        The intermediate array's chunks; ``None`` for a one-pass plan.
    write_chunks
        The box each task of the last pass holds and cuts into target chunks
        (the first pass's box in a one-pass plan).
    task_bytes
        The most one task was allowed to hold.
    contiguous
        The source is a contiguous file (``source_chunks`` all ones).
    """

    shape: tuple[int, ...]
    itemsize: int
    source_chunks: tuple[int, ...]
    target_chunks: tuple[int, ...]
    read_chunks: tuple[int, ...]
    intermediate_chunks: tuple[int, ...] | None
    write_chunks: tuple[int, ...]
    task_bytes: int
    contiguous: bool = False

    @property
    def passes(self) -> int:
        """1, or 2 through the intermediate array."""
        return 1 if self.intermediate_chunks is None else 2

    @property
    def peak_task_bytes(self) -> int:
        """The largest box any task of the plan holds, in bytes."""
        return max(_box_bytes(self.read_chunks, self.itemsize), _box_bytes(self.write_chunks, self.itemsize))

    @property
    def intermediate_chunk_count(self) -> int:
        """Chunks of the intermediate array (0 for a one-pass plan)."""
        if self.intermediate_chunks is None:
            return 0
        return math.prod(_count(n, c) for n, c in zip(self.shape, self.intermediate_chunks))

    def explain(self) -> str:
        """Why the plan has the passes and boxes it has, in a sentence or three.

        >>> plan_rechunk((1000, 1000), 8, (10, 1000), (1000, 10), task_bytes=800_000).explain().splitlines()[0]
        'two passes: whole source and target chunks meet only in boxes of (1000, 1000) (7.63 MiB), more than the 781.25 kiB one task may hold'
        """
        period = periods(self.shape, self.source_chunks, self.target_chunks)
        period_size = format_size(_box_bytes(period, self.itemsize))
        cap = format_size(self.task_bytes)
        if self.intermediate_chunks is None:
            read = "out of the contiguous file" if self.contiguous else f"of whole source chunks {self.source_chunks}"
            return (
                f"one pass: each task reads a box of {self.read_chunks} ({format_size(self.peak_task_bytes)}) "
                f"{read} and cuts it into target chunks {self.target_chunks}; nothing is decoded twice"
            )
        return (
            f"two passes: whole source and target chunks meet only in boxes of {period} ({period_size}), more "
            f"than the {cap} one task may hold\n"
            f"pass 1 reads boxes of {self.read_chunks} (whole source chunks {self.source_chunks}) and writes them "
            f"as {self.intermediate_chunk_count:,} intermediate chunks of {self.intermediate_chunks}\n"
            f"pass 2 reads boxes of {self.write_chunks} (whole intermediate chunks) and cuts them into target "
            f"chunks {self.target_chunks}"
        )


def plan_rechunk(
    shape: tuple[int, ...],
    itemsize: int,
    source_chunks: tuple[int, ...] | None,
    target_chunks: tuple[int, ...],
    *,
    task_bytes: int,
    preferred_bytes: int | None = None,
) -> RechunkPlan:
    """Plan moving an array from ``source_chunks`` to ``target_chunks`` with tasks of at most ``task_bytes``.

    Parameters
    ----------
    shape, itemsize
        The array.
    source_chunks
        The chunk shape it is stored (or computed) in; ``None`` for a
        contiguous file, which any box can be read out of.
    target_chunks
        The chunk shape wanted.
    task_bytes
        The most one task may hold of the data (its box).
    preferred_bytes
        How large a one-pass box grows (in whole periods) when it is smaller:
        fewer, larger tasks; at most ``task_bytes``, which is the default.

    Returns
    -------
    RechunkPlan
        One pass when boxes of whole source and target chunks fit in a task;
        else two, through an intermediate array.

    Raises
    ------
    MemoryBudgetError
        When one source chunk or one target chunk alone is larger than a task
        may hold: no plan reads or writes less than one whole chunk.

    Examples
    --------
    >>> plan = plan_rechunk((1000, 1000), 8, (100, 1000), (1000, 100), task_bytes=8_000_000)
    >>> plan.passes, plan.read_chunks
    (1, (1000, 1000))
    >>> plan = plan_rechunk((1000, 1000), 8, (10, 1000), (1000, 10), task_bytes=800_000)
    >>> plan.passes, plan.read_chunks, plan.intermediate_chunks, plan.write_chunks
    (2, (100, 1000), (100, 100), (1000, 100))
    """
    shape = tuple(int(n) for n in shape)
    source = _clipped(shape, source_chunks if source_chunks is not None else (1,) * len(shape))
    target = _clipped(shape, target_chunks)
    for name, chunks in (("source", source), ("target", target)):
        if _box_bytes(chunks, itemsize) > task_bytes:
            raise MemoryBudgetError(
                said(
                    f"one {name} chunk {chunks} holds {format_size(_box_bytes(chunks, itemsize))}, more than the "
                    f"{format_size(task_bytes)} one task may hold; give smaller chunks or a larger ",
                    named("memory_budget"),
                )
            )
    period = periods(shape, source, target)
    meet = tuple(math.lcm(s, t) for s, t in zip(source, target))
    if _box_bytes(period, itemsize) <= task_bytes:
        preferred = min(task_bytes, preferred_bytes or task_bytes)
        box = _grow(shape, period, meet, itemsize, max(preferred, _box_bytes(period, itemsize)), beyond=True)
        return RechunkPlan(shape, itemsize, source, target, box, None, box, task_bytes, source_chunks is None)

    read = _grow(shape, source, meet, itemsize, task_bytes, beyond=False)
    write = _grow(shape, target, meet, itemsize, task_bytes, beyond=False)
    intermediate = tuple(_common_step(n, r, w) for n, r, w in zip(shape, read, write))
    return RechunkPlan(shape, itemsize, source, target, read, intermediate, write, task_bytes)


def periods(shape: tuple[int, ...], source: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """Per axis, where the source and target grids next meet: ``lcm`` of the two, at most the axis.

    >>> periods((100, 100), (10, 100), (100, 4))
    (100, 100)
    >>> periods((100, 100), (4, 6), (6, 4))
    (12, 12)
    """
    return tuple(min(n, math.lcm(s, t)) if n else 1 for n, s, t in zip(shape, source, target))


def _grow(
    shape: tuple[int, ...],
    base: tuple[int, ...],
    meet: tuple[int, ...],
    itemsize: int,
    task_bytes: int,
    *,
    beyond: bool,
) -> tuple[int, ...]:
    """``base`` grown, axis by axis, while a box stays within ``task_bytes``.

    An axis grows only to lengths whose boundaries keep meeting the other
    grid: multiples of its base that divide ``meet`` (where the two grids
    meet; unclipped), the whole axis, and (``beyond``) multiples of ``meet``.
    The axis furthest from ``meet`` grows first: that is where boxes of the
    base shape would cut most.
    """
    box = list(base)
    order = sorted(range(len(shape)), key=lambda axis: base[axis] / max(min(meet[axis], shape[axis]), 1))
    for axis in order:
        rest = _box_bytes(tuple(box[:axis] + box[axis + 1 :]), itemsize)
        most = task_bytes // rest if rest else shape[axis]
        box[axis] = max(box[axis], _longest(shape[axis], base[axis], meet[axis], most, beyond=beyond))
    return tuple(box)


def _longest(n: int, base: int, meet: int, most: int, *, beyond: bool) -> int:
    """The longest box length along an axis of ``n``, at most ``most``, that :func:`_grow` allows."""
    if n <= most:
        return n  # the whole axis: no inner boundary to meet anything
    ratio = meet // base
    # Divisors of the ratio, found in pairs up to its square root: lengths k * base with k * base dividing meet.
    divisors = {d for k in range(1, math.isqrt(ratio) + 1) if ratio % k == 0 for d in (k, ratio // k)}
    fitting = [k * base for k in divisors if k * base <= most]
    if beyond and meet <= most:
        fitting.append(most // meet * meet)
    return max(fitting, default=base)


def _common_step(n: int, read: int, write: int) -> int:
    """The longest intermediate chunk along an axis whose boundaries include every box boundary of both passes.

    A box as long as the axis has no inner boundary, so only the other pass's count.
    """
    if read >= n and write >= n:
        return max(n, 1)
    if read >= n:
        return write
    if write >= n:
        return read
    return math.gcd(read, write)


def _clipped(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(1, min(int(c), n)) for c, n in zip(chunks, shape))


def _count(n: int, c: int) -> int:
    return max(1, -(-n // c))


def _box_bytes(box: tuple[int, ...], itemsize: int) -> int:
    return math.prod(box) * itemsize


__all__ = ["RechunkPlan", "periods", "plan_rechunk"]
