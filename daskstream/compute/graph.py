"""Whole computations within the memory budget: dask's array optimizer, with passes planned first.

daskstream installs :func:`optimize` as dask's ``array_optimize``, so it runs on
every ``.compute()``, ``dask.compute``, ``persist``, ``Client.compute`` and
``daskstream.store`` of dask arrays, in the process that builds the graph. A
graph that reads no daskstream source goes straight to dask's own optimizer.
One that does is first described layer by layer (:func:`describe`), its passes
planned (:func:`daskstream.planning.passes.plan_passes`), and rewritten so that
every pass reads the sources again instead of holding blocks from an earlier
pass (:func:`rewrite`); dask's blockwise fusion then puts each re-read into the
task that consumes it, so no block waits in memory for an aggregate.

Set ``daskstream.compute.rewrite: false`` to compute graphs exactly as dask
builds them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import dask.config
import numpy as np
from dask._task_spec import GraphNode, TaskRef, convert_legacy_task
from dask.base import tokenize
from dask.blockwise import Blockwise
from dask.core import flatten
from dask.graph_manipulation import clone_key
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.utils import key_split

from daskstream import config
from daskstream.errors import InvalidArgumentError
from daskstream.planning.budget import parse_budget
from daskstream.planning.computation import ComputePlan
from daskstream.planning.passes import LayerFacts, PassPlan, plan_passes
from daskstream.sources.base import Source

# What a read layer was planned for: the memory budget and threads per worker where its array was opened.
# It travels with the graph: dask may optimize the graph in another process (a distributed scheduler).
PLANNED_FOR = "daskstream-planned-for"
# The annotation of a layer running sibling steps together: their names.
SIBLINGS_ANNOTATION = "daskstream-siblings"
# Output keys sampled per layer whose block dependencies are not known from its structure.
_SAMPLED_KEYS = 3


@dataclass
class GraphFacts:
    """A computation's layers as the planners see them, with what the rewrite needs to find them again."""

    facts: list[LayerFacts]
    sources: dict[str, tuple[Source, ...]] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)

    @property
    def reads(self) -> list[str]:
        return [f.name for f in self.facts if f.kind == "read"]


def optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """dask's array optimizer, after planning the passes of graphs that read daskstream sources.

    Installed as dask's ``array_optimize`` when daskstream is imported.

    Raises
    ------
    MemoryBudgetError
        When the computation's projected peak exceeds its memory budget, before anything runs.
    """
    from dask.array.optimization import optimize as dask_optimize

    if isinstance(dsk, HighLevelGraph) and config.get("compute.rewrite") and _reads_sources(dsk):
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

    graph = reread_rechunks(graph, _needed_layers(graph, keys))
    graph = variance_in_pieces(graph, _needed_layers(graph, keys))
    described = describe(graph, _needed_layers(graph, keys))
    budget = memory_budget_for(graph) if memory_budget is None else parse_budget(memory_budget)
    threads = concurrency(graph)
    plan = plan_passes(described.facts, hold_limit=budget // threads)
    read_passes = plan.read_passes
    if plan.recomputed:
        graph = rewrite(graph, plan)
    fused = fuse_siblings(graph, _needed_layers(graph, keys), keys)
    if plan.recomputed or fused is not graph:
        graph = fused
        described = describe(graph, _needed_layers(graph, keys))
        # The rewritten graph computes what each pass needs in that pass: planned again, nothing is recomputed.
        plan = plan_passes(described.facts, hold_limit=budget // threads)
    outputs = {key[0] if isinstance(key, tuple) else key for key in keys}
    computation = project(
        graph, described, plan, budget=budget, concurrency=threads, outputs=outputs, read_passes=read_passes
    )
    return graph, computation


def _needed_layers(graph: HighLevelGraph, keys: Iterable[Hashable]) -> set[str]:
    """The layers holding ``keys`` and every layer they depend on."""
    names = {key[0] if isinstance(key, tuple) else key for key in keys}
    stack = [name for name in names if name in graph.layers]
    needed: set[str] = set()
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(graph.dependencies.get(name, ()))
    return needed


def _reads_sources(dsk: HighLevelGraph) -> bool:
    return any(name.startswith("daskstream-") for name in dsk.layers)


# ---------------------------------------------------------------------------
# Describing a graph


def describe(graph: HighLevelGraph, names: Iterable[str] | None = None) -> GraphFacts:
    """The layers ``names`` of ``graph`` (default: all) as :class:`LayerFacts`, in dependency order."""
    described = GraphFacts(facts=[])
    for name in _toposorted(graph, set(graph.layers) if names is None else set(names)):
        layer = graph.layers[name]
        inputs = tuple(sorted(_block_fan_in(graph, name, layer).items()))
        sources = _sources_read_by(graph, layer)
        blocks = _annotated_blocks(layer)
        if blocks is not None:
            described.blocks[name] = blocks
        if sources:
            described.sources[name] = sources
            names_read = tuple(source.name for source in sources)
            facts = LayerFacts(name, "read", _block_bytes(layer), blocks or 1, inputs, sources=names_read)
        elif not graph.dependencies.get(name) and blocks is None:
            facts = LayerFacts(name, "constant")
        else:
            facts = LayerFacts(name, "compute", _block_bytes(layer), blocks or 1, inputs)
        described.facts.append(facts)
    described.facts = _reduction_partials(described.facts)
    return described


def _reduction_partials(facts: list[LayerFacts]) -> list[LayerFacts]:
    """Facts with the first step of each dask tree reduction sized as the partial results it makes.

    dask's ``reduction`` shrinks the chunks of its first (blockwise) step after
    making the layer, so the layer's annotation still has the input's blocks;
    its partial results are the size of the ``-partial``/``-aggregate`` layers'.
    """
    takers: dict[str, list[LayerFacts]] = {f.name: [] for f in facts}
    for f in facts:
        for name, _ in f.inputs:
            takers[name].append(f)
    fixed = []
    for f in facts:
        reducers = takers[f.name]
        if f.kind == "compute" and reducers and all(key_split(t.name).endswith(_TREE_STEPS) for t in reducers):
            f = replace(f, block_bytes=min(f.block_bytes, max(t.block_bytes for t in reducers)))
        fixed.append(f)
    return fixed


# The layers of dask's tree reductions after the first step (dask.array.reductions._tree_reduce).
_TREE_STEPS = ("-partial", "-aggregate")


def _toposorted(graph: HighLevelGraph, names: set[str]) -> list[str]:
    order: list[str] = []
    seen: set[str] = set()
    for root in sorted(names):
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if expanded:
                order.append(name)
                continue
            if name in seen:
                continue
            seen.add(name)
            stack.append((name, True))
            stack.extend((dep, False) for dep in sorted(graph.dependencies.get(name, ())) if dep not in seen)
    return order


def _annotated_blocks(layer: Layer) -> int | None:
    chunks = (layer.collection_annotations or {}).get("chunks")
    if chunks is None:
        return None
    return math.prod(len(c) for c in chunks)


def _block_bytes(layer: Layer) -> int:
    """Bytes of the layer's largest output block, from the array it makes (0 when unknown)."""
    annotations = layer.collection_annotations or {}
    chunks, dtype = annotations.get("chunks"), annotations.get("dtype")
    if chunks is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        return 0
    largest = [max(c, default=0) for c in chunks]
    if any(isinstance(n, float) and math.isnan(n) for n in largest):
        return 0
    return int(math.prod(largest)) * itemsize


def _sources_read_by(graph: HighLevelGraph, layer: Layer) -> tuple[Source, ...]:
    """The Sources a layer reads: a daskstream read, or a region array (a kernel reading its halos itself)."""
    from daskstream.compute.regions import REGIONS_ANNOTATION

    regions = (layer.collection_annotations or {}).get(REGIONS_ANNOTATION)
    if regions is not None:
        return regions.sources
    source = _source_read_by(graph, layer)
    return () if source is None else (source,)


def _source_read_by(graph: HighLevelGraph, layer: Layer) -> Source | None:
    """The Source a daskstream read layer reads (a Blockwise taking the Source as a graph constant)."""
    if not isinstance(layer, Blockwise):
        return None
    for name, index in layer.indices:
        key = name.key if isinstance(name, TaskRef) else name
        if index is not None or not isinstance(key, str) or key not in graph.layers:
            continue
        held = graph.layers[key]
        if isinstance(held, MaterializedLayer) and len(held) == 1:
            value = next(iter(held.values()))
            if isinstance(value, Source):
                return value
    return None


def _block_fan_in(graph: HighLevelGraph, name: str, layer: Layer) -> dict[str, int]:
    """For each layer ``name`` takes: how many of its blocks one output block needs (at most)."""
    if not graph.dependencies.get(name):
        return {}
    if isinstance(layer, Blockwise):
        return _blockwise_fan_in(graph, layer)
    return _sampled_fan_in(graph, name, layer)


def _blockwise_fan_in(graph: HighLevelGraph, layer: Blockwise) -> dict[str, int]:
    fan_in: dict[str, int] = {}
    output = set(layer.output_indices)
    for ref, index in layer.indices:
        key = ref.key if isinstance(ref, TaskRef) else ref
        if not isinstance(key, str) or key not in graph.layers:
            continue  # a literal argument, or an io dependency (block positions)
        if index is None:
            count = _annotated_blocks(graph.layers[key]) or 1
        else:
            numblocks = layer.numblocks.get(key, ())
            # Indices missing from the output are reduced over: one output block takes all those blocks.
            count = math.prod(n for letter, n in zip(index, numblocks) if letter not in output)
        fan_in[key] = max(fan_in.get(key, 0), int(count))
    return fan_in


def _sampled_fan_in(graph: HighLevelGraph, name: str, layer: Layer) -> dict[str, int]:
    """Block dependencies of a few output keys, followed through the layer's own inner keys."""
    outputs = sorted(layer.get_output_keys(), key=_sort_key)
    if not outputs:
        return {}
    picks = {outputs[0], outputs[len(outputs) // 2], outputs[-1]}
    fan_in: dict[str, int] = {}
    for key in list(picks)[:_SAMPLED_KEYS]:
        found: dict[str, set[Hashable]] = {}
        stack, seen = [key], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            for dep in _dependencies(layer[current], layer, graph):
                if dep in layer:
                    stack.append(dep)
                else:
                    dep_name = dep[0] if isinstance(dep, tuple) else dep
                    found.setdefault(dep_name, set()).add(dep)
        for dep_name, deps in found.items():
            if dep_name in graph.layers:
                fan_in[dep_name] = max(fan_in.get(dep_name, 0), len(deps))
    return fan_in


def _sort_key(key: Hashable) -> tuple:
    return (str(key[0]), *key[1:]) if isinstance(key, tuple) else (str(key),)


def _dependencies(value: Any, layer: Layer, graph: HighLevelGraph) -> Iterable[Hashable]:
    node = _as_node(None, value, layer, graph)
    # A plain value (a Source, an array put in the graph) depends on nothing.
    return node.dependencies if isinstance(node, GraphNode) else ()


def _as_node(key: Hashable, value: Any, layer: Layer, graph: HighLevelGraph) -> Any:
    """A task in dask's task-spec form, whatever form the layer holds it in (plain values stay as they are)."""
    if isinstance(value, GraphNode):
        return value
    return convert_legacy_task(key, value, set(_references(value, layer, graph)))


def _references(value: Any, layer: Layer, graph: HighLevelGraph) -> Iterable[Hashable]:
    """Keys a task written as nested tuples refers to: those of this layer or named after a layer."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            if _looks_like_key(item) and (item[0] in graph.layers or item in layer):
                yield tuple(item)
                continue
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, str) and (item in graph.layers or item in layer):
            yield item


def _looks_like_key(item: Any) -> bool:
    return type(item) is tuple and bool(item) and isinstance(item[0], str) and all(isinstance(i, int) for i in item[1:])


def layer_array(graph: HighLevelGraph, name: Any) -> Any:
    """The dask array a layer of ``graph`` makes, from the chunks and dtype it is annotated with (or ``None``)."""
    import dask.array as da

    if not isinstance(name, str) or name not in graph.layers:
        return None
    annotations = graph.layers[name].collection_annotations or {}
    chunks, dtype = annotations.get("chunks"), annotations.get("dtype")
    if chunks is None or dtype is None:
        return None
    needed = _needed_layers(graph, [name])
    sub = HighLevelGraph({n: graph.layers[n] for n in needed}, {n: set(graph.dependencies.get(n, ())) for n in needed})
    return da.Array(sub, name, chunks, meta=np.empty((0,) * len(chunks), dtype=dtype))


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
    graph = reread_rechunks(graph, _needed_layers(graph, keys))
    described = describe(graph, _needed_layers(graph, keys))
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
    kept = _needed_layers(done, keys)
    done = HighLevelGraph({n: layers[n] for n in kept}, {n: dependencies[n] for n in kept})
    return type(x)(done, x.name, x.chunks, meta=x._meta)


def _block_slices(chunks: tuple[tuple[int, ...], ...], index: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(sum(c[:i]), sum(c[: i + 1])) for c, i in zip(chunks, index))


# ---------------------------------------------------------------------------
# Re-chunked reads


def reread_rechunks(graph: HighLevelGraph, names: Iterable[str]) -> HighLevelGraph:
    """``graph`` with every re-chunking of a source read replaced by a read of the source in the new chunks.

    dask re-chunks by splitting and concatenating blocks, which holds each
    block until all its pieces have been taken (element-wise work on two
    sources of different chunks re-chunks both). A source can be read in any
    chunks: read it in those directly.
    """
    replaced = {}
    for name in names:
        if not key_split(name).startswith("rechunk"):
            continue
        layer = graph.layers[name]
        annotations = layer.collection_annotations or {}
        chunks = annotations.get("chunks")
        source, read = _rechunked_source(graph, name)
        if chunks is None or source is None:
            continue
        replaced[name] = (source, chunks, read)
    if not replaced:
        return graph
    layers = dict(graph.layers)
    dependencies = {name: set(deps) for name, deps in graph.dependencies.items()}
    for name, (source, chunks, read) in replaced.items():
        new = _read_layers(source, chunks, name, graph.layers[read])
        for layer_name, layer in new.layers.items():
            layers[layer_name] = layer
            dependencies[layer_name] = set(new.dependencies.get(layer_name, ()))
    return HighLevelGraph(layers, dependencies)


def _rechunked_source(graph: HighLevelGraph, name: str) -> tuple[Source | None, str | None]:
    """The Source a chain of re-chunking layers starting at ``name`` reads, and that read layer's name."""
    while True:
        deps = graph.dependencies.get(name, set())
        if len(deps) != 1:
            return None, None
        (dep,) = deps
        source = _source_read_by(graph, graph.layers[dep])
        if source is not None:
            return source, dep
        if not key_split(dep).startswith("rechunk"):
            return None, None
        name = dep


def _read_layers(source: Source, chunks: tuple[tuple[int, ...], ...], name: str, read: Layer) -> HighLevelGraph:
    """The layers of a read of ``source`` in ``chunks`` under the name ``name``, annotated as ``read`` is."""
    import dask.array as da

    array = da.from_array(
        source,
        chunks=chunks,
        name=name,
        lock=False,
        asarray=False,
        fancy=False,
        meta=np.empty((0,) * source.ndim, dtype=source.dtype),
    )
    planned = (read.collection_annotations or {}).get(PLANNED_FOR)
    if planned is not None:
        array.dask.layers[name].collection_annotations[PLANNED_FOR] = planned
    return array.__dask_graph__()


# ---------------------------------------------------------------------------
# dask's variance, piece by piece


def variance_in_pieces(graph: HighLevelGraph, names: Iterable[str]) -> HighLevelGraph:
    """``graph`` with dask's first variance step (``x.std()``, ``x.var()``, their nan- forms) replaced by
    :func:`~daskstream.compute.reductions.moment_chunk_in_pieces`: the same partial results, from
    temporaries a few pieces large instead of two copies of the block."""
    import functools

    from dask._task_spec import Task
    from dask.array.reductions import moment_chunk

    from daskstream.compute.reductions import moment_chunk_in_pieces

    replaced = {}
    for name in names:
        layer = graph.layers[name]
        func = getattr(getattr(layer, "task", None), "func", None)
        if not isinstance(layer, Blockwise) or not isinstance(func, functools.partial) or func.func is not moment_chunk:
            continue
        task = layer.task
        pieces = functools.partial(moment_chunk_in_pieces, *func.args, **func.keywords)
        replaced[name] = _blockwise_like(layer, task=Task(task.key, pieces, *task.args, **task.kwargs))
    if not replaced:
        return graph
    return HighLevelGraph({**graph.layers, **replaced}, graph.dependencies)


def _blockwise_like(layer: Blockwise, *, task: Any = None, indices: Any = None, numblocks: Any = None) -> Blockwise:
    """A copy of a blockwise layer (its name, blocks and annotations), with another task or inputs."""
    copy = Blockwise(
        output=layer.output,
        output_indices=layer.output_indices,
        task=layer.task if task is None else task,
        indices=layer.indices if indices is None else indices,
        numblocks=layer.numblocks if numblocks is None else numblocks,
        concatenate=layer.concatenate,
        new_axes=layer.new_axes,
        output_blocks=layer.output_blocks,
        annotations=layer.annotations,
        io_deps=layer.io_deps,
    )
    copy.collection_annotations = dict(layer.collection_annotations or {})
    return copy


# ---------------------------------------------------------------------------
# Budget


def record_plan(layer: Layer, memory_budget: int | str | None = None) -> None:
    """Write on ``layer`` the budget and threads its array is planned for: ``memory_budget`` when given,
    else what :func:`daskstream.runtime.resources.resolve_resources` finds here and now."""
    from daskstream.runtime.resources import resolve_resources

    found = resolve_resources(memory_budget=memory_budget)
    layer.collection_annotations[PLANNED_FOR] = {"memory_budget": found.memory_budget, "threads": found.threads}


def _planned(graph: Any) -> list[dict[str, int]]:
    if hasattr(graph, "__dask_graph__"):
        graph = graph.__dask_graph__()
    layers = getattr(graph, "layers", {})
    return [p for p in ((layer.collection_annotations or {}).get(PLANNED_FOR) for layer in layers.values()) if p]


def opened_budget(graph: Any) -> int | None:
    """The smallest memory budget the arrays in ``graph`` (a graph or a collection) were opened with, if any."""
    return min((int(p["memory_budget"]) for p in _planned(graph)), default=None)


def budget_of(x: Any, memory_budget: int | str | None = None) -> int | str | None:
    """``memory_budget`` when given, else the one ``x``'s arrays were opened with (``None``: the default)."""
    return memory_budget if memory_budget is not None else opened_budget(x)


def memory_budget_for(graph: HighLevelGraph) -> int:
    """The budget a computation over ``graph`` keeps: the smallest one its arrays were opened with.

    Recorded in the graph, so that the same plan is made wherever dask
    optimizes it; arrays recorded nothing only when not from daskstream.
    """
    from daskstream.runtime.resources import resolve_resources

    return resolve_resources(memory_budget=opened_budget(graph)).memory_budget


def concurrency(graph: Any = None) -> int:
    """Tasks one worker runs at once: the most any of ``graph``'s arrays was opened for, else here and now."""
    from daskstream.runtime.resources import resolve_resources

    recorded = [int(p["threads"]) for p in _planned(graph)] if graph is not None else []
    return max(recorded, default=0) or resolve_resources().threads


def pass_seed(level: int) -> str:
    """What renames a layer's copy for pass ``level`` (deterministic: the same graph gets the same keys)."""
    return f"daskstream-pass-{level}"


def rewrite(graph: HighLevelGraph, plan: PassPlan) -> HighLevelGraph:
    """``graph`` with the layers each pass needs from earlier passes computed again in that pass.

    Every recomputed layer gets a copy with keys renamed for its pass, its
    inputs pointing at their own copies (barriers and constants are shared);
    layers of that pass take the copies instead of the originals.
    """
    layers = dict(graph.layers)
    dependencies = {name: set(deps) for name, deps in graph.dependencies.items()}
    for level, names in plan.recomputed.items():
        seed = pass_seed(level)
        keys: set[Hashable] = set()
        for name in names:
            keys |= set(graph.layers[name].get_output_keys())
        renamed = {name: clone_key(name, seed) for name in names}
        for name in names:
            layers[renamed[name]] = _clone(graph.layers[name], keys, seed, graph)
            dependencies[renamed[name]] = {renamed.get(dep, dep) for dep in graph.dependencies.get(name, ())}
    for name, level in plan.levels.items():
        # Layers of pass ``level`` take its copies of what earlier passes streamed.
        wanted = {
            dep: clone_key(dep, pass_seed(level))
            for dep in graph.dependencies.get(name, ())
            if dep not in plan.shared and plan.levels[dep] < level
        }
        if wanted:
            layers[name] = _redirect(graph.layers[name], wanted, graph)
            dependencies[name] = {wanted.get(dep, dep) for dep in dependencies[name]}
    return HighLevelGraph(layers, dependencies)


def fuse_siblings(graph: HighLevelGraph, names: Iterable[str], keys: Iterable[Hashable]) -> HighLevelGraph:
    """``graph`` with the blockwise steps that share a read computed in one task per block.

    When a read feeds several steps of one pass (a mean's and a variance's
    first steps), dask keeps each block until every step has taken it, and a
    process scheduler ships it to the parent process and back. Here the steps
    become one blockwise layer whose task reads the block once and returns
    every step's result; each step's layer then picks its own out of it.
    """
    names = set(names)
    outputs = {key[0] if isinstance(key, tuple) else key for key in keys}
    takers: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        for dep in graph.dependencies.get(name, ()):
            if dep in takers:
                takers[dep].append(name)
    layers = dict(graph.layers)
    dependencies = {name: set(deps) for name, deps in graph.dependencies.items()}
    changed = False
    for name in sorted(names):
        siblings = sorted(takers[name])
        if len(siblings) < 2 or not _sources_read_by(graph, graph.layers[name]):
            continue
        # A step that also waits for something computed from this read cannot run beside the others.
        siblings = [t for t in siblings if _fusable_sibling(graph.layers[t], name) and not _waits_on(graph, t, name)]
        if name in outputs or len(siblings) < 2:
            continue
        together = f"daskstream-together-{tokenize(name, siblings)}"
        layers[together], dependencies[together] = _together(graph, siblings, together)
        for position, sibling in enumerate(siblings):
            layers[sibling] = _pick(graph.layers[sibling], together, position)
            dependencies[sibling] = {together}
        changed = True
    return HighLevelGraph(layers, dependencies) if changed else graph


def _waits_on(graph: HighLevelGraph, step: str, read: str) -> bool:
    """Whether ``step`` takes, besides ``read`` itself, something computed from ``read``."""
    others = [dep for dep in graph.dependencies.get(step, ()) if dep != read]
    return read in _needed_layers(graph, others) if others else False


def _fusable_sibling(layer: Layer, read: str) -> bool:
    """A blockwise step taking ``read`` block by block, aligned with its own blocks, and nothing else big."""
    if not isinstance(layer, Blockwise) or layer.new_axes or layer.output_blocks or layer.concatenate:
        return False
    aligned = [index for ref, index in layer.indices if getattr(ref, "key", ref) == read]
    return len(aligned) >= 1 and all(index == layer.output_indices for index in aligned)


def _together(graph: HighLevelGraph, siblings: list[str], name: str) -> tuple[Blockwise, set[str]]:
    """One blockwise layer running every sibling's task on its own inputs, returning their results as a tuple."""
    from dask._task_spec import Task
    from dask.blockwise import blockwise_token

    indices: list[tuple[Any, Any]] = []
    numblocks: dict[str, Any] = {}
    io_deps: dict[str, Any] = {}
    tasks = []
    for sibling in siblings:
        layer = graph.layers[sibling]
        renamed = {}
        for i, (ref, index) in enumerate(layer.indices):
            # One entry per distinct input: dask's blockwise fusion leaves alone an input named twice.
            position = next(
                (j for j, (r, ind) in enumerate(indices) if ind is not None and r == ref and ind == index), None
            )
            if position is None:
                position = len(indices)
                indices.append((ref, index))
            renamed[blockwise_token(i)] = blockwise_token(position)
        tasks.append(layer.task.substitute(renamed))
        numblocks.update(layer.numblocks)
        io_deps.update(layer.io_deps)
    first = graph.layers[siblings[0]]
    fused = Blockwise(
        output=name,
        output_indices=first.output_indices,
        task=Task(name, _results, *tasks),
        indices=indices,
        numblocks=numblocks,
        concatenate=None,
        new_axes={},
        annotations=first.annotations,
        io_deps=io_deps,
    )
    # What the fused task does, for explanations: the siblings' own names.
    fused.collection_annotations = {SIBLINGS_ANNOTATION: tuple(key_split(sibling) for sibling in siblings)}
    deps = set().union(*(graph.dependencies.get(sibling, set()) for sibling in siblings))
    return fused, deps


def _results(*results: Any) -> tuple[Any, ...]:
    """The task of a fused group of siblings: each sibling's result, in order."""
    return results


def _pick(layer: Blockwise, together: str, position: int) -> Blockwise:
    """A sibling's layer, now taking its result out of the fused layer's tuple (same name, same blocks)."""
    import operator

    from dask._task_spec import Task
    from dask.blockwise import blockwise_token

    picked = Blockwise(
        output=layer.output,
        output_indices=layer.output_indices,
        task=Task(layer.output, operator.getitem, TaskRef(blockwise_token(0)), position),
        indices=[(together, layer.output_indices)],
        numblocks={together: _numblocks_of(layer)},
        concatenate=None,
        new_axes={},
        annotations=layer.annotations,
    )
    picked.collection_annotations = dict(layer.collection_annotations or {})
    return picked


def _numblocks_of(layer: Blockwise) -> tuple[int, ...]:
    """Blocks along each of ``layer``'s output indices, from the inputs that share them."""
    sizes: dict[str, int] = {}
    for ref, index in layer.indices:
        key = getattr(ref, "key", ref)
        if index is None or key not in layer.numblocks:
            continue
        for letter, n in zip(index, layer.numblocks[key]):
            sizes[letter] = max(sizes.get(letter, 1), n)
    return tuple(sizes.get(letter, 1) for letter in layer.output_indices)


def _clone(layer: Layer, keys: set[Hashable], seed: str, graph: HighLevelGraph) -> Layer:
    """A copy of ``layer`` with its keys, and its references to ``keys``, renamed by ``seed``."""
    if isinstance(layer, Blockwise):
        cloned, _ = layer.clone(keys, seed)
        cloned.collection_annotations = dict(layer.collection_annotations or {})
        return cloned
    subs = {key: clone_key(key, seed) for key in keys}
    tasks = {}
    for key, value in layer.items():
        node = _as_node(key, value, layer, graph)
        new_key = clone_key(key, seed)
        if not isinstance(node, GraphNode):
            tasks[new_key] = value
            continue
        tasks[new_key] = node.substitute({k: v for k, v in subs.items() if k in node.dependencies}, key=new_key)
    return MaterializedLayer(
        tasks, annotations=layer.annotations, collection_annotations=dict(layer.collection_annotations or {})
    )


def _redirect(layer: Layer, renamed: Mapping[str, str], graph: HighLevelGraph) -> Layer:
    """``layer`` taking the layers in ``renamed`` under their new names; its own keys unchanged."""
    if isinstance(layer, Blockwise):
        indices = []
        for ref, index in layer.indices:
            if isinstance(ref, TaskRef) and ref.key in renamed:
                ref = TaskRef(renamed[ref.key])
            elif isinstance(ref, str) and ref in renamed:
                ref = renamed[ref]
            indices.append((ref, index))
        numblocks = {renamed.get(name, name): blocks for name, blocks in layer.numblocks.items()}
        return _blockwise_like(layer, indices=indices, numblocks=numblocks)
    tasks = {}
    for key, value in layer.items():
        node = _as_node(key, value, layer, graph)
        if not isinstance(node, GraphNode):
            tasks[key] = value
            continue
        subs = {
            dep: (renamed[dep[0]], *dep[1:]) if isinstance(dep, tuple) else renamed[dep]
            for dep in node.dependencies
            if (dep[0] if isinstance(dep, tuple) else dep) in renamed
        }
        tasks[key] = node.substitute(subs) if subs else node
    return MaterializedLayer(
        tasks, annotations=layer.annotations, collection_annotations=dict(layer.collection_annotations or {})
    )


def install() -> None:
    """Make :func:`optimize` dask's array optimizer, unless something else already is, and cap the
    allocator's arenas (see :mod:`daskstream.runtime.allocator`)."""
    from daskstream.runtime.allocator import limit_malloc_arenas

    dask.config.update_defaults({"array_optimize": optimize})
    limit_malloc_arenas(config.get("compute.malloc-arenas"))


__all__ = ["GraphFacts", "describe", "install", "optimize", "plan_compute", "plan_graph", "rewrite"]
