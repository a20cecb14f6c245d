"""Regular grids of chunks: dask's chunk tuples, read amplification, axes.

The one place that turns a chunk shape into dask's tuple-of-tuples chunks and
answers which block holds which cells; the planner, the kernels, store and the
streams all ask it.
"""

from __future__ import annotations

import math

import numpy as np

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
    for n, sc, c in zip(shape, storage_chunks, chunks):
        lengths = axis_chunks(n, c) if isinstance(c, int) else c
        bounds = np.cumsum((0, *lengths), dtype=np.int64)
        starts, stops = bounds[:-1], bounds[1:]
        starts, stops = starts[stops > starts], stops[stops > starts]
        # Summed over tasks rather than storage chunks (there may be far more of those): each task
        # decodes the whole storage chunks it overlaps, from the first to the last.
        covered = np.minimum(n, (stops - 1) // sc * sc + sc) - starts // sc * sc
        total *= int(covered.sum()) / n
    return total


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


def normalize_axes(axis: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """Sorted, non-negative, unique axes; :class:`InvalidAxisError` for any outside ``ndim``.

    >>> normalize_axes((-1, 0), 3)
    (0, 2)
    """
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            valid = f"use 0..{ndim - 1} or -{ndim}..-1" if ndim else "a 0-d array has no axes: give axis=None"
            raise InvalidAxisError(f"axis {a!r} is out of range for an array with {ndim} dimension(s); {valid}")
        out.append(int(a) % ndim)
    return tuple(sorted(set(out)))
