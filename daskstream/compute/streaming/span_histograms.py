"""dask's own histograms of spans (``da.histogram``): each block's row of counts, the rows of its pieces
summed as they are read.

dask counts a histogram block by block (``_block_hist``: a row of counts
per block) and sums the rows. Counting each value alone, a block's row is
the sum of the rows of any pieces it is cut into: over a span, its pieces
are read and counted one at a time. Weighted histograms (weights a block
of their own) and bins computed by dask are left to take whole blocks.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import reduce
from typing import Any

from dask._task_spec import Task, TaskRef
from dask.array.routines import _block_hist
from dask.highlevelgraph import Layer, MaterializedLayer

from daskstream.compute.streaming.span_steps import is_key_of, materialized_like
from daskstream.compute.streaming.spans import fold_pieces, is_span, whole


def span_block_hist(value: Any, bins_range: tuple[Any, Any]) -> Any:
    """dask's row of counts of a block: of a span, the rows of its pieces, read one at a time, summed."""
    if not is_span(value) or 0 in value.shape:
        return _block_hist(whole(value), bins_range)
    return fold_pieces(
        value,
        tuple(range(len(value.shape))),
        lambda piece: _block_hist(piece, bins_range),
        lambda rows: reduce(operator.add, rows),
    )


def is_histogram_layer(values: Sequence[Any], taken: set[str]) -> bool:
    """Whether ``values``, a layer's, are dask's unweighted counts of blocks of ``taken`` with bins given."""
    return bool(values) and all(
        isinstance(v, Task)
        and v.func is _block_hist
        and len(v.args) == 2
        and not v.kwargs
        and isinstance(v.args[0], TaskRef)
        and is_key_of(v.args[0].key, taken)
        and len(v.dependencies) == 1  # the block alone: no weights, no bins computed by dask
        for v in values
    )


def streaming_histogram_layer(layer: Layer) -> MaterializedLayer:
    """A layer of dask's counts of blocks (:func:`is_histogram_layer`) counting spans piece by piece."""
    return materialized_like(layer, {key: Task(key, span_block_hist, *value.args) for key, value in layer.items()})
