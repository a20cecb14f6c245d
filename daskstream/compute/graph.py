"""Whole computations within the memory budget: dask's array optimizer, with passes planned first.

daskstream installs :func:`optimize` as dask's ``array_optimize``, so it runs on
every ``.compute()``, ``dask.compute``, ``persist``, ``Client.compute`` and
``daskstream.store`` of dask arrays, in the process that builds the graph. A
graph that reads no daskstream source goes straight to dask's own optimizer.
One that does is first described layer by layer (:func:`describe`), its passes
planned (:func:`daskstream.planning.passes.plan_passes`), rewritten so that
every pass reads the sources again instead of holding blocks from an earlier
pass (:mod:`daskstream.compute.rewrites`), and projected task by task
(:mod:`daskstream.compute.projection`); dask's blockwise fusion then puts each
re-read into the task that consumes it, so no block waits in memory for an
aggregate.

Set ``daskstream.compute.rewrite: false`` to compute graphs exactly as dask
builds them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import dask.config
import numpy as np
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from daskstream import config
from daskstream.compute.layers import (
    concurrency,
    describe,
    layer_array,
    memory_budget_for,
    needed_layers,
    reads_sources,
)
from daskstream.compute.rewrites import fuse_siblings, reread_rechunks, rewrite, variance_in_pieces
from daskstream.errors import InvalidArgumentError
from daskstream.planning.budget import parse_budget
from daskstream.planning.computation import ComputePlan
from daskstream.planning.passes import plan_passes


def optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """dask's array optimizer, after planning the passes of graphs that read daskstream sources.

    Installed as dask's ``array_optimize`` when daskstream is imported.

    Raises
    ------
    MemoryBudgetError
        When the computation's projected peak exceeds its memory budget, before anything runs.
    """
    from dask.array.optimization import optimize as dask_optimize

    if isinstance(dsk, HighLevelGraph) and config.get("compute.rewrite") and reads_sources(dsk):
        dsk, plan = plan_graph(dsk, list(flatten(keys)) if isinstance(keys, (list, set, tuple)) else [keys])
        plan.check()
    return dask_optimize(dsk, keys, **kwargs)


def plan_compute(*collections: Any, memory_budget: int | str | None = None) -> ComputePlan:
    """How computing ``collections`` together will run: its passes over the data and its projected memory.

    This is what daskstream plans, and checks against the memory budget,
    before every computation that reads its sources (``.compute()``,
    ``dask.compute``, ``daskstream.store``...); here nothing is computed.

    Parameters
    ----------
    *collections
        Dask arrays (or other dask collections).
    memory_budget
        Bytes per worker to plan for; by default the smallest budget the
        arrays were opened with, else as for :func:`daskstream.plan_chunks`.

    Returns
    -------
    ComputePlan
        ``passes``, ``read_passes``, ``worst`` (the largest task, term by
        term), ``projected_peak_bytes``, ``explain()``.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import daskstream as ds
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.ones((1000, 1000), dtype="f4"))  # 4 MB, four times the budget
    >>> x = ds.open(path, memory_budget="1MiB")
    >>> plan = ds.plan_compute(ds.reduce(x - x.mean(), "std"))
    >>> plan.passes, plan.projected_peak_bytes <= plan.budget
    (2, True)
    """
    found = [c for c in collections if hasattr(c, "__dask_graph__")]
    if not found:
        raise InvalidArgumentError("plan_compute needs dask collections, e.g. plan_compute(x.mean(), y.std())")
    graph = HighLevelGraph.merge(*[c.__dask_graph__() for c in found])
    keys = list(flatten([c.__dask_keys__() for c in found]))
    return plan_graph(graph, keys, memory_budget=memory_budget)[1]


def plan_graph(
    graph: HighLevelGraph, keys: list[Hashable], *, memory_budget: int | str | None = None
) -> tuple[HighLevelGraph, ComputePlan]:
    """Plan the passes of what ``keys`` need and rewrite ``graph`` to re-read sources in each pass.

    Layers are named as the keys they hold here: this runs on the graph as
    built, before dask's own optimizations (whose culling renames layers).

    Returns
    -------
    The rewritten graph, and its :class:`~daskstream.planning.computation.ComputePlan`.
    """
    from daskstream.compute.projection import project

    graph = reread_rechunks(graph, needed_layers(graph, keys))
    graph = variance_in_pieces(graph, needed_layers(graph, keys))
    described = describe(graph, needed_layers(graph, keys))
    budget = memory_budget_for(graph) if memory_budget is None else parse_budget(memory_budget)
    threads = concurrency(graph)
    plan = plan_passes(described.facts, hold_limit=budget // threads)
    read_passes = plan.read_passes
    if plan.recomputed:
        graph = rewrite(graph, plan)
    fused = fuse_siblings(graph, needed_layers(graph, keys), keys)
    if plan.recomputed or fused is not graph:
        graph = fused
        described = describe(graph, needed_layers(graph, keys))
        # The rewritten graph computes what each pass needs in that pass: planned again, nothing is recomputed.
        plan = plan_passes(described.facts, hold_limit=budget // threads)
    outputs = {key[0] if isinstance(key, tuple) else key for key in keys}
    computation = project(
        graph, described, plan, budget=budget, concurrency=threads, outputs=outputs, read_passes=read_passes
    )
    return graph, computation


def with_aggregates_computed(x: Any) -> Any:
    """``x`` with the aggregates its later passes take (a mean, a quantile's state) computed now.

    For writers that compute an array's blocks in batches: each batch would
    otherwise compute every earlier pass again. Returns ``x`` itself when it
    needs one pass; else the same array over a graph that holds those
    aggregates as data.
    """
    import dask

    graph = x.__dask_graph__()
    keys = list(flatten(x.__dask_keys__()))
    graph = reread_rechunks(graph, needed_layers(graph, keys))
    described = describe(graph, needed_layers(graph, keys))
    plan = plan_passes(described.facts, hold_limit=memory_budget_for(graph) // concurrency(graph))
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
    arrays = [layer_array(graph, name) for name in frontier]
    if not frontier or any(a is None for a in arrays):
        return x
    values = dask.compute(*arrays)
    layers = dict(graph.layers)
    dependencies = {name: set(deps) for name, deps in graph.dependencies.items()}
    for name, array, value in zip(frontier, arrays, values):
        layers[name] = MaterializedLayer(
            {
                (name, *index): np.asarray(value)[_block_slices(array.chunks, index)]
                for index in np.ndindex(*array.numblocks)
            },
            collection_annotations=dict(graph.layers[name].collection_annotations or {}),
        )
        dependencies[name] = set()
    done = HighLevelGraph(layers, dependencies)
    kept = needed_layers(done, keys)
    done = HighLevelGraph({n: layers[n] for n in kept}, {n: dependencies[n] for n in kept})
    return type(x)(done, x.name, x.chunks, meta=x._meta)


def _block_slices(chunks: tuple[tuple[int, ...], ...], index: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(sum(c[:i]), sum(c[: i + 1])) for c, i in zip(chunks, index))


def install() -> None:
    """Make :func:`optimize` dask's array optimizer, unless something else already is, and cap the
    allocator's arenas (see :mod:`daskstream.runtime.allocator`)."""
    from daskstream.runtime.allocator import limit_malloc_arenas

    dask.config.update_defaults({"array_optimize": optimize})
    limit_malloc_arenas(config.get("compute.malloc-arenas"))


__all__ = ["install", "optimize", "plan_compute", "plan_graph", "with_aggregates_computed"]
