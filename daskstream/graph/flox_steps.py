"""flox's first step of a groupby reduction, read from a dask layer's task: what it reduces, and what it makes.

xarray's groupby reductions (with flox installed) reduce each block by group
with flox's ``chunk_reduce``: a blockwise layer whose task is
``partial(Compose(..., partial(chunk_reduce, func=..., dtype=...)), axis=...,
expected_groups=...)``. dask's annotation of that layer still has its
input's blocks, but a block's result is far smaller: one value per group
present and per intermediate (a sum and a count for a mean) along the
reduced axes, whatever their length. :func:`flox_chunk_step` reads this
from the task, for projecting memory (:mod:`daskstream.graph.layers`) and
for streaming the step over spans
(:mod:`daskstream.compute.streaming.span_groups`). flox is not imported:
its functions are known by name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from toolz.functoolz import Compose


@dataclass(frozen=True)
class FloxChunkStep:
    """flox's first step of a groupby reduction.

    Attributes
    ----------
    axis
        The axes it reduces (by group).
    groups
        How many groups it may find (the expected groups given to it), or
        ``None`` where unknown.
    intermediate_bytes
        Bytes of one group's intermediates at one kept position (a float32
        sum and an int64 count: 12).
    reindexed
        Whether each block's partial holds every expected group (flox's
        map-reduce), rather than those it found (its cohorts).
    """

    axis: tuple[int, ...]
    groups: int | None
    intermediate_bytes: int
    reindexed: bool = True

    def block_bytes(self, block: tuple[int, ...], found: int | None = None) -> int:
        """The largest result of a block of ``block`` (its shape): a value per group and intermediate at each
        kept position, the groups no more than the reduced cells, nor than ``found`` in a block where each
        block's partial holds the groups it found (:func:`groups_found`)."""
        kept = int(np.prod([n for axis, n in enumerate(block) if axis not in self.axis]))
        groups = int(np.prod([block[axis] for axis in self.axis if axis < len(block)]))
        if self.groups is not None:
            groups = min(groups, self.groups)
        if found is not None and not self.reindexed:
            groups = min(groups, found)
        return kept * max(groups, 1) * self.intermediate_bytes


#: Blocks of group labels whose distinct labels :func:`groups_found` counts, spread over the layer's.
_SAMPLED_LABELS = 64


def groups_found(graph: Any, layer: Any, step: FloxChunkStep) -> int | None:
    """The most groups a block of flox's ``step`` (the blockwise ``layer`` of ``graph``) finds: distinct
    labels in blocks of the labels it takes (arrays dask holds in the graph), sampled across them; ``None``
    where they are not there to count."""
    letters = tuple(layer.output_indices[axis] for axis in step.axis)
    labels = next((name for name, index in layer.indices if index == letters and isinstance(name, str)), None)
    if graph is None or labels is None or labels not in getattr(graph, "layers", {}):
        return None
    values = list(graph.layers[labels].values())
    if not values:
        return None
    every = max(1, len(values) // _SAMPLED_LABELS)
    most = 0
    for value in values[::every]:
        data = getattr(value, "value", value)  # a DataNode holds the array it gives
        if not isinstance(data, np.ndarray) or data.dtype.kind not in "iu":
            return None
        most = max(most, int(np.unique(data[data >= 0]).size))
    return most


def flox_chunk_step(func: Any) -> FloxChunkStep | None:
    """The :class:`FloxChunkStep` a blockwise task's function is, or ``None`` where it is not flox's
    ``chunk_reduce`` (its arg-reductions, scans and anything else included)."""
    if not isinstance(func, functools.partial) or not isinstance(func.func, Compose) or "axis" not in func.keywords:
        return None
    chunk = next((f for f in (func.func.first, *func.func.funcs) if is_flox(f, "chunk_reduce")), None)
    if chunk is None:
        return None
    dtypes = chunk.keywords.get("dtype") if isinstance(chunk, functools.partial) else None
    try:
        itemsizes = [np.dtype(d).itemsize for d in (dtypes if isinstance(dtypes, (tuple, list)) else (dtypes,))]
    except TypeError:
        itemsizes = [8, 8]  # unknown: a float64 and an int64 per group, the largest flox's reductions keep
    expected = func.keywords.get("expected_groups")
    try:
        groups = None if expected is None else len(expected)
    except TypeError:
        groups = None
    reindexed = bool(chunk.keywords.get("reindex", False)) if isinstance(chunk, functools.partial) else False
    return FloxChunkStep(tuple(func.keywords["axis"]), groups, sum(itemsizes) or 16, reindexed)


def is_flox(step: Any, name: str) -> bool:
    """Whether ``step`` (or the function a ``functools.partial`` wraps) is flox's function ``name`` (any of
    flox's, for an empty ``name``)."""
    func = step.func if isinstance(step, functools.partial) else step
    named = not name or getattr(func, "__name__", None) == name
    return named and str(getattr(func, "__module__", "")).startswith("flox.")


__all__ = ["FloxChunkStep", "flox_chunk_step", "groups_found", "is_flox"]
