"""Block functions that work through a block piece by piece, so that their temporaries stay small.

daskstream's graph rewrites put them in place of dask's own block steps; the
projection of a computation's memory counts their pieces, not their blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dask.array.reductions import moment_chunk, moment_combine

# Values a kernel works on at a time when its temporaries grow with what it works on (chunk_moments'
# float64 copies, the radix passes' keys and masks): a few MiB, however large the chunk.
PIECE_VALUES = 1 << 18


def moment_chunk_in_pieces(block: np.ndarray, *args: Any, computing_meta: bool = False, **kwargs: Any) -> Any:
    """dask's first step of a variance (``moment_chunk``), worked out piece by piece along the longest axis.

    dask's own step makes a centred copy of the whole block and its powers (two
    block-sized temporaries in the dtype it accumulates in); here each piece
    of ``PIECE_VALUES`` values is one call of dask's step, and the pieces'
    partial results merge with dask's own ``moment_combine`` (along a reduced
    axis) or lie side by side (along a kept one): the partial result dask's
    next step expects, from temporaries that stay in the CPU's cache.
    daskstream's optimizer puts it in place of dask's step.
    """
    axis, keepdims = kwargs.get("axis"), kwargs.get("keepdims")
    if computing_meta or block.ndim == 0 or block.size <= PIECE_VALUES or not keepdims or axis is None:
        # computing_meta goes in with the other keywords: dask's step could take it positionally too (after
        # order, sum, numel, dtype), which mypy counts as a second value since *args has no length.
        return moment_chunk(block, *args, **{**kwargs, "computing_meta": computing_meta})
    axes = tuple(sorted(axis if isinstance(axis, tuple) else (axis,)))
    longest = max(range(block.ndim), key=block.shape.__getitem__)
    step = max(1, PIECE_VALUES * block.shape[longest] // block.size)
    lead = (slice(None),) * longest
    parts = [
        moment_chunk(block[(*lead, slice(start, start + step))], *args, **kwargs)
        for start in range(0, block.shape[longest], step)
    ]
    if len(parts) == 1:
        return parts[0]
    if longest not in axes:
        return {key: np.concatenate([part[key] for part in parts], axis=longest) for key in ("total", "n", "M")}
    order = kwargs.get("order", args[0] if args else 2)
    dtype = kwargs.get("dtype", "f8")
    combine = {"order": order, "dtype": dtype, "axis": axes}
    if "sum" in kwargs:
        combine["sum"] = kwargs["sum"]
    return moment_combine(_nested(parts, axes.index(longest), len(axes)), **combine)


def _nested(parts: list, position: int, depth: int) -> Any:
    """``parts`` laid along level ``position`` of ``depth`` nested lists (one item at the other levels), as
    dask nests the partial results of blocks along the reduced axes."""
    if depth == 0:
        return parts[0]
    if position == 0:
        return [_nested([part], -1, depth - 1) for part in parts]
    return [_nested(parts, position - 1, depth - 1)]


__all__ = ["PIECE_VALUES", "moment_chunk_in_pieces"]
