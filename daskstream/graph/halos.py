"""The cells a halo reads around a region, and its cells beyond the array's edges.

Beyond the array's edges the halo follows dask's boundary modes, applied to
whatever the region is read from:

==============  ==============================================  ==========================
boundary        cell ``-k`` (before the first) reads             numpy's ``pad`` mode
==============  ==============================================  ==========================
``reflect``     cell ``k - 1``                                   ``symmetric``
``nearest``     cell ``0``                                       ``edge``
``periodic``    cell ``n - k``                                   ``wrap``
a number        that number                                      ``constant``
``none``        nothing: no halo at the array's edges
==============  ==============================================  ==========================

>>> import numpy as np
>>> from daskstream.graph.regions import ArrayRegions
>>> cells = ArrayRegions(np.arange(5.0))
>>> haloed(cells, (slice(0, 2),), (2,), "reflect")
array([1., 0., 0., 1., 2., 3.])
>>> haloed(cells, (slice(3, 5),), (1,), "periodic")
array([2., 3., 4., 0.])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from daskstream.sources.base import Region

if TYPE_CHECKING:
    from daskstream.graph.regions import Regions


def halo_widths(
    box: Region, shape: tuple[int, ...], depth: Sequence[int], boundary: Any
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Cells of halo before and after ``box`` along each axis (none beyond the edges for ``"none"``).

    >>> halo_widths((slice(0, 4),), (10,), (2,), "none"), halo_widths((slice(0, 4),), (10,), (2,), "reflect")
    (((0,), (2,)), ((2,), (2,)))
    """
    if boundary != "none":
        return tuple(depth), tuple(depth)
    before = tuple(min(d, s.start) for d, s in zip(depth, box))
    after = tuple(min(d, n - s.stop) for d, s, n in zip(depth, box, shape))
    return before, after


def source_indices(start: int, stop: int, n: int, boundary: Any) -> np.ndarray:
    """The cell of the array each position in ``[start, stop)`` reads; -1 where a constant halo goes.

    >>> source_indices(-2, 3, 5, "reflect").tolist(), source_indices(3, 7, 5, "nearest").tolist()
    ([1, 0, 0, 1, 2], [3, 4, 4, 4])
    >>> source_indices(-1, 2, 5, "periodic").tolist(), source_indices(-1, 1, 5, 0).tolist()
    ([4, 0, 1], [-1, 0])
    """
    positions = np.arange(start, stop)
    inside = (positions >= 0) & (positions < n)
    if boundary == "reflect":
        # Mirror with the edge cell repeated, folding as often as the halo needs.
        period = 2 * n
        folded = np.mod(positions, period)
        return np.where(folded < n, folded, period - 1 - folded)
    if boundary == "nearest":
        return np.clip(positions, 0, n - 1)
    if boundary == "periodic":
        return np.mod(positions, n)
    return np.where(inside, positions, -1)


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """The fewest ``[start, stop)`` ranges of consecutive cells covering the non-negative ``indices``."""
    cells = np.unique(indices[indices >= 0])
    if cells.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(cells) > 1)
    starts = np.concatenate(([cells[0]], cells[breaks + 1]))
    stops = np.concatenate((cells[breaks], [cells[-1]])) + 1
    return [(int(a), int(b)) for a, b in zip(starts, stops)]


# numpy's pad mode for the boundaries whose halo is made from the block's own edge cells.
_PAD_MODES: dict[str, Literal["symmetric", "edge"]] = {"reflect": "symmetric", "nearest": "edge"}


def haloed(regions: Regions, box: Region, depth: Sequence[int], boundary: Any) -> np.ndarray:
    """``box`` of ``regions`` with ``depth`` cells of halo on each side, edges filled per ``boundary``.

    The cells inside the array are one read of the widened box; beyond its
    edges the halo is padded from that read (``reflect``, ``nearest``, a
    constant), or read from the other end (``periodic``).
    """
    before, after = halo_widths(box, regions.shape, depth, boundary)
    inside = tuple(
        slice(max(0, s.start - b), min(n, s.stop + a)) for s, b, a, n in zip(box, before, after, regions.shape)
    )
    pads = [(max(0, b - s.start), max(0, s.stop + a - n)) for s, b, a, n in zip(box, before, after, regions.shape)]
    if not any(p for pair in pads for p in pair):
        return regions.read(inside)
    lengths = [w.stop - w.start for w in inside]
    if boundary in _PAD_MODES and all(max(p) <= n for p, n in zip(pads, lengths)):
        return np.pad(regions.read(inside), pads, mode=_PAD_MODES[boundary])
    if boundary not in _PAD_MODES and boundary != "periodic":
        return np.pad(regions.read(inside), pads, mode="constant", constant_values=boundary)
    return _gathered(regions, box, before, after, boundary)


def _gathered(regions: Regions, box: Region, before: Sequence[int], after: Sequence[int], boundary: Any) -> np.ndarray:
    """The haloed box assembled cell range by cell range (wrapped halos, or halos deeper than the array)."""
    per_axis = [
        source_indices(s.start - b, s.stop + a, n, boundary) for s, b, a, n in zip(box, before, after, regions.shape)
    ]
    out = np.empty(tuple(len(idx) for idx in per_axis), dtype=regions.dtype)
    for pieces in itertools.product(*(_runs(idx) for idx in per_axis)):
        part = regions.read(tuple(slice(a, b) for a, b in pieces))
        where, offsets = [], []
        for idx, (a, b) in zip(per_axis, pieces):
            taken = np.flatnonzero((idx >= a) & (idx < b))
            where.append(taken)
            offsets.append(idx[taken] - a)
        out[np.ix_(*where)] = part[np.ix_(*offsets)]
    return out


__all__ = ["halo_widths", "haloed", "source_indices"]
