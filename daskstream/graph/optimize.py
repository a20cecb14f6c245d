"""Whole computations within the memory budget: dask's array optimizer, with passes planned first.

daskstream installs :func:`optimize` as dask's ``array_optimize``, so it runs on
every ``.compute()``, ``dask.compute``, ``persist``, ``Client.compute`` and
``daskstream.store`` of dask arrays, in the process that builds the graph. A
graph that reads no daskstream source goes straight to dask's own optimizer.
One that does is first described layer by layer (:func:`describe`), its passes
planned (:func:`daskstream.planning.passes.plan_passes`), rewritten so that
every pass reads the sources again instead of holding blocks from an earlier
pass (:mod:`daskstream.graph.rewrites`), and projected task by task
(:mod:`daskstream.graph.projection`); dask's blockwise fusion then puts each
re-read into the task that consumes it, so no block waits in memory for an
aggregate.

Set ``daskstream.compute.rewrite: false`` to compute graphs exactly as dask
builds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import dask
import dask.config
import numpy as np
from dask.array.optimization import optimize as dask_optimize
from dask.callbacks import Callback
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.optimization import cull
from dask.typing import Key
from dask.utils import ensure_dict

from daskstream import config
from daskstream.graph.layers import (
    COMPUTED_ONCE,
    describe,
    layer_array,
    layer_names,
    needed_layers,
    planned_max_tasks,
    planned_with,
    reads_sources,
    routes_of,
    span_reads,
)
from daskstream.graph.linking import source_links
from daskstream.graph.ordering import gate_expansions
from daskstream.graph.projection import project
from daskstream.graph.rewrites import fuse_siblings, reread_rechunks, rewrite, variance_in_pieces
from daskstream.planning.computation import ComputePlan
from daskstream.planning.grid import block_slices
from daskstream.planning.passes import plan_passes
from daskstream.planning.settings import Resources


def optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """dask's array optimizer, after planning the passes of graphs that read daskstream sources.

    The budget and threads planned for are those the graph's arrays were
    opened with (recorded in it), wherever dask calls this.

    Raises
    ------
    MemoryBudgetError
        When the computation's projected peak exceeds its memory budget, before anything runs.
    """
    return dask_optimize(planned_graph(dsk, keys)[0], keys, **kwargs)


def planned_graph(dsk: Any, keys: Any) -> tuple[Any, ComputePlan | None, Resources | None]:
    """``dsk`` with its passes planned and checked against the budget, before dask's optimizations; the plan,
    and the resources it planned for (None where it planned nothing: a graph reading no daskstream source, or
    ``daskstream.compute.rewrite: false``)."""
    plan: ComputePlan | None = None
    planned: Resources | None = None
    if isinstance(dsk, HighLevelGraph) and config.get("compute.rewrite") and reads_sources(dsk):
        planned = planned_with(dsk)
        # Spans are streamed a chunk at a time by the steps that take them (daskstream.compute.streaming.span_graphs),
        # and refused there past the budget: their blocks are not what a task holds.
        if planned is not None and not span_reads(dsk):
            wanted = requested_keys(keys)
            dsk, plan = plan_graph(dsk, wanted, planned)
            ceiling = planned_max_tasks(dsk)
            if ceiling is not None and plan.tasks > ceiling:
                # The plan counts every block of the layers it reads, a part of the array or not: what the
                # keys need is counted by culling, which costs as many steps as the tasks it keeps.
                plan = dataclasses.replace(plan, tasks=_needed_tasks(dsk, wanted, ceiling))
            dataclasses.replace(plan, max_tasks=ceiling).check()
    return dsk, plan, planned


def requested_keys(keys: Any) -> list[Key]:
    """The keys dask hands an optimizer (one key, or nested lists of them), as one flat list."""
    return list(flatten(keys)) if isinstance(keys, (list, set, tuple)) else [keys]


def _needed_tasks(graph: HighLevelGraph, keys: list[Key], ceiling: int) -> int:
    """Tasks computing ``keys`` takes: ``graph`` culled to what they need.

    Culled layer by layer first (most of a huge graph goes: a part of an
    array), then, where that leaves no more than :data:`RECOUNTED` times the
    ``ceiling``, task by task: the layer-wise cull keeps whole layers that a
    join (many files concatenated) takes only a few blocks of. A graph still
    larger is not listed task by task: listing it is what the ceiling spares.
    """
    culled = graph.cull(set(keys))
    tasks = sum(len(layer) for layer in culled.layers.values())
    if tasks > RECOUNTED * ceiling:
        return tasks
    return len(cull(ensure_dict(culled), keys)[0])


#: How far past the task ceiling a layer-wise count is recounted task by task (see :func:`_needed_tasks`).
RECOUNTED = 4


def plan_graph(
    graph: HighLevelGraph, keys: list[Key], resources: Resources, *, holds: bool = True
) -> tuple[HighLevelGraph, ComputePlan]:
    """Plan the passes of what ``keys`` need within ``resources`` and rewrite ``graph`` to re-read
    sources in each pass.

    Layers are named as the keys they hold here: this runs on the graph as
    built, before dask's own optimizations (whose culling renames layers).
    With ``holds=False`` no block is held from one pass for the next: every
    pass reads again (as spans do, whose blocks are what to read).

    Returns
    -------
    The rewritten graph, and its :class:`~daskstream.planning.computation.ComputePlan`.
    """

    graph = reread_rechunks(graph, needed_layers(graph, keys), resources.per_task_bytes)
    graph = variance_in_pieces(graph, needed_layers(graph, keys))
    described = describe(graph, needed_layers(graph, keys))
    budget, threads = resources.memory_budget, resources.threads
    hold_limit = budget // threads if holds else 0
    plan = plan_passes(described.facts, hold_limit=hold_limit, linked=source_links(graph, described.facts))
    read_passes, planned_passes = plan.read_passes, (plan, described.facts)
    if plan.recomputed:
        graph = rewrite(graph, plan)
    fused = fuse_siblings(graph, needed_layers(graph, keys), keys)
    if plan.recomputed or fused is not graph:
        graph = fused
        described = describe(graph, needed_layers(graph, keys))
        # The rewritten graph computes what each pass needs in that pass: planned again, nothing is recomputed.
        plan = plan_passes(described.facts, hold_limit=hold_limit, linked=source_links(graph, described.facts))
    outputs = layer_names(keys)
    computation = project(
        graph, described, plan, budget=budget, concurrency=threads, outputs=outputs, read_passes=read_passes
    )
    computation = dataclasses.replace(computation, routes=routes_of(graph, needed_layers(graph, keys)))
    # Orders work, changes nothing computed or held as projected: after the projection. The passes are those
    # planned before the rewrite: after it, the layers of each pass are apart.
    graph = gate_expansions(graph, planned_passes[1], planned_passes[0], budget // threads)
    return graph, computation


def with_aggregates_computed(x: Any, resources: Resources) -> Any:
    """``x`` with the aggregates its later passes take (a mean, a quantile's state) computed now.

    For writers that compute an array's blocks in batches: each batch would
    otherwise compute every earlier pass again. Returns ``x`` itself when it
    needs one pass; else the same array over a graph that holds those
    aggregates as data. ``resources``: what to plan for when ``x``'s arrays
    recorded nothing (they are not from daskstream).
    """

    graph = x.__dask_graph__()
    keys = list(flatten(x.__dask_keys__()))
    planned = planned_with(graph) or resources
    graph = reread_rechunks(graph, needed_layers(graph, keys), planned.per_task_bytes)
    described = describe(graph, needed_layers(graph, keys))
    plan = plan_passes(described.facts, hold_limit=planned.per_task_bytes, linked=source_links(graph, described.facts))
    if plan.passes <= 1:
        return x
    takers: dict[str, list[str]] = {f.name: [] for f in described.facts}
    for f in described.facts:
        for name, _ in f.inputs:
            takers[name].append(f.name)
    # Computed once and taken whole by work that streams: what enters a pass as a constant.
    streaming = {f.name for f in described.facts if f.kind != "constant" and f.name not in plan.shared}
    frontier = [
        f.name
        for f in described.facts
        if f.kind == "compute" and f.name in plan.shared and any(t in streaming for t in takers[f.name])
    ]
    return with_layers_computed(x, frontier, graph=graph)


def computed_once_layers(x: Any) -> list[str]:
    """The layers ``x`` needs that ask to be computed once, first (:data:`COMPUTED_ONCE`: a rechunk's first pass)."""
    graph = x.__dask_graph__()
    needed = needed_layers(graph, list(flatten(x.__dask_keys__())))
    return [name for name in needed if (graph.layers[name].collection_annotations or {}).get(COMPUTED_ONCE)]


def with_layers_computed(
    x: Any, names: list[str], *, graph: Any = None, on_task: Callable[[int, int], None] | None = None
) -> Any:
    """``x`` over a graph whose layers ``names`` are computed now and held as data.

    ``on_task(done, total)`` is called as their tasks finish (local schedulers).
    ``x`` itself when there is nothing to compute (or a layer cannot be made an array).
    """
    graph = x.__dask_graph__() if graph is None else graph
    keys = list(flatten(x.__dask_keys__()))
    arrays = [layer_array(graph, name) for name in names]
    if not names or any(a is None for a in arrays):
        return x
    wanted = {key for array in arrays for key in flatten(array.__dask_keys__())}
    done = 0

    def count(key: Any, *_: Any) -> None:
        nonlocal done
        if on_task is not None and key in wanted:
            done += 1
            on_task(done, len(wanted))

    with Callback(posttask=count):
        values = dask.compute(*arrays)
    layers = dict(graph.layers)
    dependencies = {name: set(deps) for name, deps in graph.dependencies.items()}
    for name, array, value in zip(names, arrays, values):
        layers[name] = MaterializedLayer(
            {
                (name, *index): np.asarray(value)[block_slices(array.chunks, index)]
                for index in np.ndindex(*array.numblocks)
            },
            collection_annotations=dict(graph.layers[name].collection_annotations or {}),
        )
        dependencies[name] = set()
    computed = HighLevelGraph(layers, dependencies)
    kept = needed_layers(computed, keys)
    computed = HighLevelGraph({n: layers[n] for n in kept}, {n: dependencies[n] for n in kept})
    return type(x)(computed, x.name, x.chunks, meta=x._meta)


__all__ = [
    "computed_once_layers",
    "optimize",
    "plan_graph",
    "planned_graph",
    "requested_keys",
    "with_aggregates_computed",
    "with_layers_computed",
]
