"""Regular grids of chunks: dask's chunk tuples, read amplification, axes.

The one place that turns a chunk shape into dask's tuple-of-tuples chunks and
answers which block holds which cells; the planner, the kernels, store and the
streams all ask it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from daskstream.advice import keyword, said
from daskstream.errors import InvalidAxisError


def read_amplification(
    shape: tuple[int, ...],
    storage_chunks: tuple[int, ...] | None,
    chunks: tuple[int, ...] | tuple[tuple[int, ...], ...],
) -> float:
    """Bytes decoded over bytes stored when tasks of ``chunks`` read ``storage_chunks``.

    ``chunks`` is one chunk's shape (a regular grid) or dask's tuple of tuples.
    Each storage chunk is decoded once per task that overlaps it. The count
    factorises over axes, so this is the product, over axes, of the mean number
    of task chunks overlapping each storage chunk, weighted by its length.

    >>> read_amplification((100,), (10,), (5,))
    2.0
    >>> read_amplification((100, 10), (10, 10), (20, 10))
    1.0
    >>> read_amplification((10,), (5,), ((3, 7),))
    1.5
    """
    if storage_chunks is None or math.prod(shape) == 0:
        return 1.0
    total = 1.0
    # One entry per axis in either form (typed so, as zip over the union of the two forms types it object).
    per_axis: tuple[int | tuple[int, ...], ...] = chunks
    for n, sc, c in zip(shape, storage_chunks, per_axis):
        if isinstance(c, int):
            if c % sc == 0 or c >= n:
                continue  # whole storage chunks per task (the last clipped to the axis): each decoded once
            total *= _regular_axis_covered(n, sc, c) / n
            continue
        bounds = np.cumsum((0, *c), dtype=np.int64)
        total *= _covered(n, sc, bounds[:-1], bounds[1:]) / n
    return total


def _covered(n: int, sc: int, starts: np.ndarray, stops: np.ndarray) -> int:
    """Elements decoded along an axis by tasks spanning ``[starts, stops)``, each decoding the whole storage
    chunks it overlaps, from the first to the last (summed over tasks: there may be far more storage chunks)."""
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    return int((np.minimum(n, (stops - 1) // sc * sc + sc) - starts // sc * sc).sum())


# Tasks along one axis whose bounds are listed at once: a regular grid repeats, so longer axes are summed
# over one period of the pattern (or in batches of this many), never listed whole.
_LISTED_TASKS = 1 << 20


def _regular_axis_covered(n: int, sc: int, c: int) -> int:
    """:func:`_covered` for tasks of ``c`` along an axis of ``n``, in memory bounded however long the axis is."""
    tasks = -(-n // c)

    def span(first: int, last: int) -> int:
        starts = np.arange(first, last, dtype=np.int64) * c
        return _covered(n, sc, starts, np.minimum(starts + c, n))

    if tasks <= _LISTED_TASKS:
        return span(0, tasks)
    # Task j starts at j*c: the pattern of starts within storage chunks repeats every lcm(c, sc) elements.
    period = math.lcm(c, sc) // c
    if period <= _LISTED_TASKS:
        full = (tasks - 1) // period  # whole periods before the last (possibly clipped) task's period
        one = span(0, period)
        return full * one + span(full * period, tasks)
    return sum(span(first, min(first + _LISTED_TASKS, tasks)) for first in range(0, tasks, _LISTED_TASKS))


def regular_grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Dask's chunks for a regular grid of ``chunks`` over ``shape`` (the last ones ragged).

    >>> regular_grid((10, 4), (4, 4))
    ((4, 4, 2), (4,))
    """
    return tuple(axis_chunks(n, c) for n, c in zip(shape, chunks))


def axis_chunks(n: int, c: int) -> tuple[int, ...]:
    """The lengths of chunks of ``c`` along an axis of ``n`` (the last one ragged).

    >>> axis_chunks(10, 4), axis_chunks(0, 4)
    ((4, 4, 2), (0,))
    """
    if n == 0:
        return (0,)
    full, rest = divmod(n, c)
    return (c,) * full + ((rest,) if rest else ())


def normalize_axes(axis: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """Sorted, non-negative, unique axes; :class:`InvalidAxisError` for any outside ``ndim``.

    >>> normalize_axes((-1, 0), 3)
    (0, 2)
    """
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            valid = (
                f"use 0..{ndim - 1} or -{ndim}..-1"
                if ndim
                else said("a 0-d array has no axes: give ", keyword("axis", None))
            )
            raise InvalidAxisError(said(f"axis {a!r} is out of range for an array with {ndim} dimension(s); ", valid))
        out.append(int(a) % ndim)
    return tuple(sorted(set(out)))


def regular_chunk_shape(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...] | None:
    """The chunk shape of a regular grid (along each axis every chunk full but the last), else ``None``.

    >>> regular_chunk_shape(((4, 4, 2), (7,))), regular_chunk_shape(((2, 4, 4),))
    ((4, 7), None)
    """
    shape = []
    for sizes in chunks:
        if any(c != sizes[0] for c in sizes[:-1]) or sizes[-1] > sizes[0]:
            return None
        shape.append(int(sizes[0]))
    return tuple(shape)


def block_slices(chunks: tuple[tuple[int, ...], ...], index: tuple[int, ...]) -> tuple[slice, ...]:
    """Where block ``index`` of any grid of dask chunks sits in the array.

    >>> block_slices(((2, 5, 3), (4,)), (1, 0))
    (slice(2, 7, None), slice(0, 4, None))
    """
    return tuple(slice(int(sum(c[:i])), int(sum(c[: i + 1]))) for c, i in zip(chunks, index))


def regular_block_slices(chunks: tuple[tuple[int, ...], ...], index: tuple[int, ...]) -> tuple[slice, ...]:
    """:func:`block_slices` for a regular grid, in constant time however many blocks it has.

    >>> regular_block_slices(((4, 4, 2), (3,)), (2, 0))
    (slice(8, 10, None), slice(0, 3, None))
    """
    return tuple(slice(i * sizes[0], i * sizes[0] + sizes[i]) for sizes, i in zip(chunks, index))
