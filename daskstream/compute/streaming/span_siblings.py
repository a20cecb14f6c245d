"""Reductions over the same spans computed together: each piece read once for all of them.

A span holds no data, so every step taking one reads its chunks itself:
``dask.compute(x.mean(), x.std())`` would read ``x`` once for each. Here the
first steps of reductions taking blocks of the same span reads, block for
block on one grid, become one task per block
(:func:`~daskstream.compute.streaming.spans.span_reductions`) that reads each
piece once and folds it into every reduction's partials; each reduction's
block is then its part of that task's result.
"""

from __future__ import annotations

import graphlib
import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
from dask._task_spec import Task, TaskRef
from dask.base import tokenize
from dask.blockwise import Blockwise
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer

from daskstream.compute.streaming.span_steps import materialized_like
from daskstream.compute.streaming.spans import Combine, Step, span_reductions


def sibling_reductions(
    graph: HighLevelGraph, kinds: Mapping[str, str | None], spans: set[str], reads: set[str]
) -> list[tuple[str, ...]]:
    """Groups of two or more reductions' first steps (``reduce`` layers) taking blocks of the same span reads
    (through the layers whose blocks are ``spans``), block for block on one grid."""
    memo: dict[str, frozenset[str]] = {}

    def reads_of(name: str) -> frozenset[str]:
        if name not in memo:
            inputs = [reads_of(d) for d in graph.dependencies.get(name, ()) if d in spans]
            memo[name] = frozenset({name}) if name in reads else frozenset().union(*inputs)
        return memo[name]

    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, kind in kinds.items():
        layer = graph.layers[name]
        if kind != "reduce" or not isinstance(layer, Blockwise):
            continue
        if any(
            not isinstance(n, str) or index is None or not set(index) <= set(layer.output_indices)
            for n, index in layer.indices
        ):
            continue  # an input whole, or contracted by dask: not block for block
        chunks = (layer.collection_annotations or {}).get("chunks")
        if chunks is not None:
            groups.setdefault((reads_of(name), tuple(map(len, chunks))), []).append(name)
    ancestry = _ancestry(graph)
    found = []
    for group in groups.values():
        # One reduction needing another's result (a centred std needs the mean) runs after it, not with it.
        while group:
            together = [group[0]]
            for name in group[1:]:
                if all(name not in ancestry[other] and other not in ancestry[name] for other in together):
                    together.append(name)
            group = [name for name in group if name not in together]
            if len(together) > 1:
                found.append(tuple(sorted(together)))
    return found


def _block_of(layer: Blockwise, name: str, axes: Any, index: tuple[int, ...]) -> tuple[int, ...]:
    """The block of input ``name`` (of ``axes``, the output's in its own order) that block ``index`` of ``layer``
    takes, as blockwise takes it: the output's block along each axis, the first where it has one block (broadcast,
    as an einsum's weights)."""
    out = layer.output_indices
    return tuple(0 if n == 1 else index[out.index(axis)] for axis, n in zip(axes, layer.numblocks[name]))


def _ancestry(graph: HighLevelGraph) -> dict[str, set[str]]:
    """The layers each layer of ``graph`` needs, directly or not."""
    found: dict[str, set[str]] = {}
    for name in graphlib.TopologicalSorter(graph.dependencies).static_order():
        direct = graph.dependencies.get(name, set())
        found[name] = set(direct).union(*(found.get(d, set()) for d in direct))
    return found


def fused_reductions(
    graph: HighLevelGraph, group: tuple[str, ...], parts: Callable[[Blockwise], tuple[Step, Combine]]
) -> tuple[dict[str, Layer], dict[str, set[str]]]:
    """The layers of ``group`` (:func:`sibling_reductions`; ``parts`` gives each one's step and combine) as one
    layer of tasks computing all their first steps, and each as its part of those: the layers and their
    dependencies."""
    name = f"span-reductions-{tokenize(*group)}"
    layers: dict[str, Blockwise] = {}
    layout = []
    for n in group:
        layer = graph.layers[n]
        assert isinstance(layer, Blockwise)  # a group holds blockwise reductions only
        layers[n] = layer
        step, combine = parts(layer)
        layout.append((step, combine, len(layer.indices)))
    grid = tuple(map(len, (layers[group[0]].collection_annotations or {})["chunks"]))
    fused: dict[Any, Task] = {}
    taken: dict[str, dict[Any, Task]] = {n: {} for n in group}
    for index in np.ndindex(*grid):
        key = (name, *index)
        # Every input is a layer's name (sibling_reductions takes no other), read block for block.
        refs = [
            TaskRef((cast(str, input_name), *_block_of(layer, cast(str, input_name), axes, index)))
            for layer in layers.values()
            for input_name, axes in layer.indices
        ]
        fused[key] = Task(key, span_reductions, tuple(layout), *refs)
        for position, n in enumerate(group):
            taken[n][(n, *index)] = Task((n, *index), operator.getitem, TaskRef(key), position)
    new_layers: dict[str, Layer] = {name: MaterializedLayer(fused)}
    new_layers.update({n: materialized_like(layers[n], taken[n]) for n in group})
    dependencies = {name: set().union(*(graph.dependencies[n] for n in group))}
    dependencies.update({n: {name} for n in group})
    return new_layers, dependencies
