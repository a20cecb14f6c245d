"""Per-chunk partial results, and the trees that combine them within the memory budget."""

from __future__ import annotations

import builtins
import math
from typing import Any

import dask.array as da
import numpy as np

from daskstream.compute.streaming.chains import WAVES
from daskstream.graph.layers import whole_input
from daskstream.planning.settings import Resources

# Python's per-object overhead of one partial result held by a combine task, on top of its array bytes.
_PARTIAL_OVERHEAD_BYTES = 1024
# The widest combine we allow: beyond it the list handling in one task costs more than a tree level.
_MAX_SPLIT_EVERY = 1024


def combine_fan_in(x: da.Array, axes: tuple[int, ...], *, partial_itemsize: int, resources: Resources) -> int:
    """How many partial results one combine task may merge, from the memory budget.

    A partial result of one chunk holds ``partial_itemsize`` bytes per element of
    the chunk's output (the chunk's extent along the kept axes). A combine task
    holds ``split_every`` of them, within its share of the worker's budget
    (``resources``, as the caller's entry point resolved them).

    Where the blocks reduced give every thread of the place a few first
    combines at that width, it is narrowed until they do.

    >>> import dask.array as da
    >>> one_thread = Resources(2**20, threads=1, workers=1, origin="arguments")
    >>> combine_fan_in(da.ones((30, 10), chunks=10), (0,), partial_itemsize=8, resources=one_thread)
    237
    >>> combine_fan_in(da.ones((1000, 10), chunks=10), (0,), partial_itemsize=8, resources=one_thread)
    25
    """
    kept = [max(x.chunksize[a], 1) for a in range(x.ndim) if a not in axes]
    partial_bytes = math.prod(kept) * partial_itemsize + _PARTIAL_OVERHEAD_BYTES
    # A combine task holds its inputs and its output; the partials waiting for it are held too, so a
    # group of them takes at most a quarter of a task's share.
    fan_in = max(2, min(_MAX_SPLIT_EVERY, resources.per_task_bytes // (4 * partial_bytes)))
    # The first combines compute their blocks themselves (daskstream.compute.streaming.folds) where they give
    # every thread of the place a few: a wider tree would leave threads idle, or the blocks to the scheduler.
    blocks = math.prod(x.numblocks[a] for a in axes)
    wanted = resources.threads * resources.workers * WAVES
    if blocks >= 2 * wanted:
        fan_in = max(2, min(fan_in, blocks // wanted))
    return int(fan_in)


def fan_in_by_axis(x: da.Array, axes: tuple[int, ...], fan_in: int) -> dict[int, int]:
    """``fan_in`` partials per combine, shared among the reduced axes that have several blocks.

    dask spreads an integer ``split_every`` evenly over every reduced axis, its
    root per axis: a sum over rows and columns of a file chunked by rows
    combined 32 partials per task where the budget allowed 1,024, and made 32
    times the combines.

    >>> import dask.array as da
    >>> fan_in_by_axis(da.ones((1000, 10), chunks=(10, 10)), (0, 1), 1024)
    {0: 1024, 1: 2}
    >>> fan_in_by_axis(da.ones((1000, 1000), chunks=10), (0, 1), 1024)
    {0: 32, 1: 32}
    """
    several = [a for a in axes if x.numblocks[a] > 1]
    each = max(2, round(fan_in ** (1 / len(several)))) if several else 2
    return {a: each if a in several else 2 for a in axes}


def per_chunk_rows(x: da.Array, fn: Any, width: int, *arrays: da.Array, **kwargs: Any) -> da.Array:
    """``fn(block, *arrays, **kwargs)`` gives one row of ``width`` int64 counts per chunk, on a new last axis.

    Each of ``arrays`` reaches every call whole, as a numpy array. They go in
    as one graph input each: as keyword values, dask would turn each into a
    separate copy of its whole graph and compute that copy again; as indexed
    block inputs, the read of ``x``'s chunk would no longer be fused into the
    task that counts it, and chunks could be read long before they are counted.
    """
    block_index = tuple(f"a{i}" for i in builtins.range(x.ndim))
    wholes = [(whole_input(array), None) for array in arrays]
    return da.blockwise(
        fn,
        (*block_index, "row"),
        x,
        block_index,
        *(part for whole in wholes for part in whole),
        new_axes={"row": width},
        adjust_chunks=dict.fromkeys(block_index, 1),
        dtype="i8",
        meta=np.empty((0,) * (x.ndim + 1), dtype="i8"),
        **kwargs,
    )


def sum_rows(rows: da.Array, *, resources: Resources, split_every: int | None = None) -> da.Array:
    """Sum per-chunk rows of counts into one row, in a tree as wide as ``resources`` allow."""
    reduced = tuple(builtins.range(rows.ndim - 1))
    fan_in = split_every or combine_fan_in(rows, reduced, partial_itemsize=8, resources=resources)
    return rows.sum(axis=reduced, split_every=fan_in)


__all__ = ["combine_fan_in", "fan_in_by_axis", "per_chunk_rows", "sum_rows"]
