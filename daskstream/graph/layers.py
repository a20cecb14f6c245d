"""Reading a dask graph as daskstream plans it: its layers, what each reads and takes, and what it was opened for.

A dask array's graph is a ``HighLevelGraph`` of layers named as the keys they
hold (until dask's own culling renames them). :func:`describe` turns the layers
a computation needs into :class:`~daskstream.planning.passes.LayerFacts` for the
pure planners: which read daskstream sources (a read of a ``Source``, or a
region array reading its halos itself), how many blocks of each input one
output block takes, and how large its blocks are. Arrays record on their read
layer the memory budget, threads and workers they were planned for
(:func:`record_plan`, read back by :func:`planned_with`), so that a plan is the
same wherever dask optimizes the graph.

Longer than most modules: reading layers and reading back what they were
planned for are one subject (both walk the same annotations and layer kinds),
and splitting them would put each half's helpers in the other's module.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask._task_spec import GraphNode, Task, TaskRef, convert_legacy_task
from dask.blockwise import Blockwise
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.typing import Key
from dask.utils import key_split

from daskstream.graph.flox_steps import flox_chunk_step, groups_found
from daskstream.graph.trees import tree_fan_in
from daskstream.planning.passes import LayerFacts
from daskstream.planning.settings import PlanSettings, Resources
from daskstream.sources.base import Source
from daskstream.sources.objects.places import is_url

# On a region array's layer: the regions each of its blocks reads (see :mod:`daskstream.graph.regions`).
REGIONS_ANNOTATION = "daskstream-regions"
# What a read layer was planned for: the memory budget, threads and workers where its array was opened.
# It travels with the graph: dask may optimize the graph in another process (a distributed scheduler).
PLANNED_FOR = "daskstream-planned-for"

# The annotation of a layer running sibling steps together: their names.
SIBLINGS_ANNOTATION = "daskstream-siblings"

#: On the layer of an operation with an in-memory and an out-of-core way: which it takes, and why.
ROUTE_ANNOTATION = "daskstream-route"

#: On a spanned array's read layer (:mod:`daskstream.planning.spans`): the chunk shape its spans stream in
#: and the bytes a task may hold of one block.
SPAN_ANNOTATION = "daskstream-span"

#: On a rechunked array's layer: its :class:`RechunkRecord`.
RECHUNK_ANNOTATION = "daskstream-rechunk"

#: On a layer whose tasks write what later tasks read back (a rechunk's first pass): writers that
#: compute an array in batches run it once, first, rather than once per batch.
COMPUTED_ONCE = "daskstream-computed-once"

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


def describe(graph: HighLevelGraph, names: Iterable[str] | None = None) -> GraphFacts:
    """The layers ``names`` of ``graph`` (default: all) as :class:`LayerFacts`, in dependency order."""
    described = GraphFacts(facts=[])
    for name in _toposorted(graph, set(graph.layers) if names is None else set(names)):
        layer = graph.layers[name]
        inputs = tuple(sorted(_block_fan_in(graph, name, layer).items()))
        sources = sources_read_by(graph, layer)
        blocks = annotated_blocks(layer)
        if blocks is not None:
            described.blocks[name] = blocks
        if sources:
            described.sources[name] = sources
            names_read = tuple(source.name for source in sources)
            facts = LayerFacts(name, "read", _block_bytes(layer), blocks or 1, inputs, sources=names_read)
        elif (not graph.dependencies.get(name) and blocks is None) or _is_gate(layer):
            # A later pass's gate gives its reads their Source once the pass before is done: an order, no data.
            facts = LayerFacts(name, "constant")
        else:
            facts = LayerFacts(name, "compute", _block_bytes(layer, graph), blocks or 1, inputs)
        described.facts.append(facts)
    described.facts = _reduction_partials(described.facts)
    return described


def _is_gate(layer: Layer) -> bool:
    if not isinstance(layer, MaterializedLayer) or len(layer) != 1:
        return False
    value = next(iter(layer.values()))
    return isinstance(value, Task) and value.func is passed_after


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


def annotated_blocks(layer: Layer) -> int | None:
    chunks = (layer.collection_annotations or {}).get("chunks")
    if chunks is None:
        return None
    return math.prod(len(c) for c in chunks)


def _block_bytes(layer: Layer, graph: HighLevelGraph | None = None) -> int:
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
    flox = flox_chunk_step(layer.task.func) if isinstance(layer, Blockwise) else None
    if flox is not None:  # annotated with its input's blocks, but a value per group and intermediate
        return flox.block_bytes(tuple(int(n) for n in largest), groups_found(graph, layer, flox))
    return int(math.prod(largest)) * itemsize


def sources_read_by(graph: HighLevelGraph, layer: Layer) -> tuple[Source, ...]:
    """The Sources a layer reads: a daskstream read, or a region array (a kernel reading its halos itself)."""
    regions = (layer.collection_annotations or {}).get(REGIONS_ANNOTATION)
    if regions is not None:
        return regions.sources
    source = source_read_by(graph, layer)
    return () if source is None else (source,)


def source_read_by(graph: HighLevelGraph, layer: Layer) -> Source | None:
    """The Source a daskstream read layer reads (a Blockwise taking the Source as a graph constant)."""
    found = source_constant(graph, layer)
    return None if found is None else found[1]


def source_constant(graph: HighLevelGraph, layer: Layer) -> tuple[str, Source] | None:
    """The layer holding the Source a read layer takes, and the Source; ``None`` for a layer reading none.

    The constant may be a later pass's gate (:func:`passed_after`): the
    Source, released once the passes before are done.
    """
    if not isinstance(layer, Blockwise):
        return None
    for name, index in layer.indices:
        key = name.key if isinstance(name, TaskRef) else name
        if index is not None or not isinstance(key, str) or key not in graph.layers:
            continue
        held = graph.layers[key]
        if isinstance(held, MaterializedLayer) and len(held) == 1:
            value = next(iter(held.values()))
            if isinstance(value, Task) and value.func is passed_after and isinstance(value.args[0], TaskRef):
                gated = graph.layers.get(str(value.args[0].key))
                value = next(iter(gated.values())) if isinstance(gated, MaterializedLayer) and len(gated) == 1 else None
            if isinstance(value, Source):
                return key, value
    return None


def passed_after(value: Any, *done: Any) -> Any:
    """``value``, once the tasks giving ``done`` have run: what orders a later pass's reads after the
    aggregates of the passes before."""
    return value


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
            count = annotated_blocks(graph.layers[key]) or 1
        else:
            numblocks = layer.numblocks.get(key, ())
            # Indices missing from the output are reduced over: one output block takes all those blocks.
            count = math.prod(n for letter, n in zip(index, numblocks) if letter not in output)
        fan_in[key] = max(fan_in.get(key, 0), int(count))
    return fan_in


def _sampled_fan_in(graph: HighLevelGraph, name: str, layer: Layer) -> dict[str, int]:
    """Block dependencies of a few output keys, followed through the layer's own inner keys (a task's own,
    for a layer holding whole tree reductions)."""
    tree = tree_fan_in(graph, name, layer, lambda value: _dependencies(value, layer, graph))
    if tree is not None:
        return tree
    outputs = sorted(layer.get_output_keys(), key=_sort_key)
    if not outputs:
        return {}
    picks = {outputs[0], outputs[len(outputs) // 2], outputs[-1]}
    fan_in: dict[str, int] = {}
    for key in list(picks)[:_SAMPLED_KEYS]:
        found: dict[Key, set[Key]] = {}
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
            # A key named as the layer but not held in it (a cumsum's) is the layer's own, not an input.
            if isinstance(dep_name, str) and dep_name in graph.layers and dep_name != name:
                fan_in[dep_name] = max(fan_in.get(dep_name, 0), len(deps))
    return fan_in


def _sort_key(key: Key) -> tuple:
    # A layer's keys may mix block indices and names in one place (a cumsum's ('name', 'extra', i, j)):
    # each part sorts as its kind first, so any two keys compare.
    parts = key if isinstance(key, tuple) else (key,)
    return tuple((isinstance(part, str), str(part) if isinstance(part, str) else part) for part in parts)


def _dependencies(value: Any, layer: Layer, graph: HighLevelGraph) -> Iterable[Key]:
    node = as_node(None, value, layer, graph)
    # A plain value (a Source, an array put in the graph) depends on nothing.
    return node.dependencies if isinstance(node, GraphNode) else ()


def as_node(key: Key | None, value: Any, layer: Layer, graph: HighLevelGraph) -> Any:
    """A task in dask's task-spec form, whatever form the layer holds it in (plain values stay as they are)."""
    if isinstance(value, GraphNode):
        return value
    return convert_legacy_task(key, value, set(_references(value, layer, graph)))


def _references(value: Any, layer: Layer, graph: HighLevelGraph) -> Iterable[Key]:
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
    # A block index may hold floats: dask's overlap layer names its halo pieces ("getitem-...", 0, 0.9).
    return (
        type(item) is tuple
        and bool(item)
        and isinstance(item[0], str)
        and all(isinstance(i, (int, float)) for i in item[1:])
    )


def layer_names(keys: Iterable[Key]) -> set[str]:
    """The names of the layers holding ``keys``: a key is its layer's name, or ``(name, *block index)``."""
    names = (key[0] if isinstance(key, tuple) else key for key in keys)
    # A number is a key of a plain dask graph, never a layer's name.
    return {name for name in names if isinstance(name, str)}


def needed_layers(graph: HighLevelGraph, keys: Iterable[Key]) -> set[str]:
    """The layers holding ``keys`` and every layer they depend on."""
    stack = [name for name in layer_names(keys) if name in graph.layers]
    needed: set[str] = set()
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(graph.dependencies.get(name, ()))
    return needed


def span_reads(graph: Any) -> dict[str, Mapping[str, Any]]:
    """The spanned read layers of ``graph`` (:func:`daskstream.graph.reads.span_array`), each with what it was
    planned in: the chunk shape its spans stream in (``piece``) and the bytes a task may hold (``cap``)."""
    if not isinstance(graph, HighLevelGraph):
        return {}
    return {
        name: annotations[SPAN_ANNOTATION]
        for name, layer in graph.layers.items()
        if SPAN_ANNOTATION in (annotations := layer.collection_annotations or {})
    }


def reads_sources(dsk: HighLevelGraph) -> bool:
    return any(name.startswith("daskstream-") for name in dsk.layers)


def layer_array(graph: HighLevelGraph, name: Any) -> Any:
    """The dask array a layer of ``graph`` makes, from the chunks and dtype it is annotated with (or ``None``)."""

    if not isinstance(name, str) or name not in graph.layers:
        return None
    annotations = graph.layers[name].collection_annotations or {}
    chunks, dtype = annotations.get("chunks"), annotations.get("dtype")
    if chunks is None or dtype is None:
        return None
    needed = needed_layers(graph, [name])
    sub = HighLevelGraph({n: graph.layers[n] for n in needed}, {n: set(graph.dependencies.get(n, ())) for n in needed})
    return da.Array(sub, name, chunks, meta=np.empty((0,) * len(chunks), dtype=dtype))


def blockwise_like(layer: Blockwise, *, task: Any = None, indices: Any = None, numblocks: Any = None) -> Blockwise:
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


def record_plan(layer: Layer, settings: PlanSettings | Resources) -> None:
    """Write on ``layer`` the budget, threads, workers and task ceiling its array is planned for, resolved where
    it was opened."""
    annotations = layer.collection_annotations
    if not isinstance(annotations, MutableMapping):
        # None when dask's collection_annotations setting is unset and no array annotated the layer yet.
        annotations = layer.collection_annotations = dict(annotations or {})
    resources = settings.resources if isinstance(settings, PlanSettings) else settings
    annotations[PLANNED_FOR] = {
        "memory_budget": resources.memory_budget,
        "threads": resources.threads,
        "workers": resources.workers,
        "max_tasks": settings.max_tasks if isinstance(settings, PlanSettings) else None,
    }


def record_route(array: Any, route: str) -> None:
    """Write on the layer making ``array`` which way its operation computes, and why (``ComputePlan.routes``)."""
    layer = array.__dask_graph__().layers[array.name]
    annotations = layer.collection_annotations
    if not isinstance(annotations, MutableMapping):
        annotations = layer.collection_annotations = dict(annotations or {})
    annotations[ROUTE_ANNOTATION] = route


def routes_of(graph: HighLevelGraph, names: Iterable[str]) -> tuple[str, ...]:
    """The routes recorded on the layers ``names`` (:func:`record_route`), each once."""
    found = ((graph.layers[n].collection_annotations or {}).get(ROUTE_ANNOTATION) for n in sorted(names))
    return tuple(dict.fromkeys(route for route in found if route))


def _planned(graph: Any) -> list[dict[str, int]]:
    if hasattr(graph, "__dask_graph__"):
        graph = graph.__dask_graph__()
    layers = getattr(graph, "layers", {})
    return [p for p in ((layer.collection_annotations or {}).get(PLANNED_FOR) for layer in layers.values()) if p]


def planned_max_tasks(graph: Any) -> int | None:
    """The fewest tasks the arrays in ``graph`` were opened to hold at once (``None``: no ceiling recorded)."""
    return min((int(p["max_tasks"]) for p in _planned(graph) if p.get("max_tasks") is not None), default=None)


def planned_with(*collections: Any) -> Resources | None:
    """What the arrays in ``collections`` were planned with where they were opened; ``None`` when none is
    from daskstream.

    The smallest memory budget and the most threads and workers recorded on
    their read layers (:func:`record_plan`). Recorded in the graph, so that the
    same plan is made wherever dask optimizes it.

    Parameters
    ----------
    *collections
        Dask collections or their graphs; anything else (a path, a Source, a
        numpy array) records nothing and is passed over.

    Examples
    --------
    >>> import dask.array as da
    >>> planned_with(da.ones(4)) is None
    True
    """
    planned = [p for collection in collections for p in _planned(collection)]
    if not planned:
        return None
    return Resources(
        memory_budget=min(int(p["memory_budget"]) for p in planned),
        threads=max(int(p["threads"]) for p in planned),
        workers=max(int(p.get("workers", 1)) for p in planned),
        origin="the budget the arrays were opened with",
    )


def whole_input(array: da.Array) -> Any:
    """``array`` as one graph value, for a blockwise function that takes it whole in every call.

    The value is a task of its own (a materialized layer) over the array's
    unoptimized graph: the pass planner then sees what it depends on, and
    dask's blockwise fusion leaves it alone (fusing a blockwise layer into one
    that takes its key whole breaks, dask 2026.8).
    """
    joined = array.rechunk(array.shape).to_delayed(optimize_graph=False).ravel()[0]
    return dask.delayed(np.asarray, pure=True)(joined, dask_key_name=f"whole-{joined.key[0]}")


@dataclass(frozen=True)
class RechunkRecord:
    """What ``daskstream.rechunk`` left on the array it made: its plan; its intermediate array's folder
    (``None`` for one pass), which a store deletes once the array it fed is written; and the array its
    first pass reads (boxes of whole source chunks), from which a few blocks are cheap to compute."""

    plan: Any
    folder: str | None
    read: Any = None


def rechunk_records(collection: Any) -> list[RechunkRecord]:
    """The records of the rechunks in a dask collection's graph, in the graph's order."""
    graph = collection.__dask_graph__() if hasattr(collection, "__dask_graph__") else None
    layers = getattr(graph, "layers", {})
    found = (
        (getattr(layer, "collection_annotations", None) or {}).get(RECHUNK_ANNOTATION) for layer in layers.values()
    )
    return [record for record in found if isinstance(record, RechunkRecord)]


def read_layers(collection: Any) -> list[tuple[str, Source, tuple[tuple[int, ...], ...] | None]]:
    """The daskstream read layers in a dask collection's graph: name, the Source read, and its chunks.

    They are the layers :func:`daskstream.graph.reads.read_array` makes: blockwise
    reads taking the Source as a graph constant (:func:`source_read_by`), found
    by what they are rather than by how dask names their parts.
    """
    graph = collection.__dask_graph__()
    if not isinstance(graph, HighLevelGraph):
        return []
    found = []
    for name, layer in graph.layers.items():
        source = source_read_by(graph, layer)
        if source is not None:
            annotations = getattr(layer, "collection_annotations", None) or {}
            found.append((name, source, annotations.get("chunks")))
    return found


def source_places(source: Source) -> list[str]:
    """The local files and folders ``source``'s data is read from (none for URLs).

    A Zarr array in a folder is its own folder, not the whole store; an HDF5
    dataset is its file and the files it links to.
    """
    if is_url(source.path):
        return []
    if source.format == "zarr" and os.path.isdir(source.path):
        return [os.path.join(source.path, *[part for part in (source.dataset or "").split("/") if part])]
    return [source.path, *(linked.path for linked in getattr(source, "linked_files", ()))]


def places_read(*collections: Any) -> list[tuple[str, str]]:
    """Each local file or folder the ``collections`` read, with the name of the source reading it."""
    return [
        (place, source.name)
        for collection in collections
        if hasattr(collection, "__dask_graph__")
        for _, source, _ in read_layers(collection)
        for place in source_places(source)
    ]


def opened_source(x: Any) -> Source | None:
    """The Source ``x`` reads when it is an array as :func:`daskstream.open` returns it, else ``None``.

    ``None`` for an array computed from a source (``x - 1``), or reading several.
    """
    if not hasattr(x, "__dask_graph__"):
        return None
    layers = read_layers(x)
    if len(layers) == 1 and layers[0][0] == getattr(x, "name", None):
        return layers[0][1]
    return None


def merged_graph(collections: Iterable[Any]) -> tuple[HighLevelGraph, list[Key]]:
    """One graph of the dask ``collections`` and the keys of their results, for planning them together."""
    found = list(collections)
    graph = HighLevelGraph.merge(*[c.__dask_graph__() for c in found])
    return graph, list(flatten([c.__dask_keys__() for c in found]))


__all__ = [
    "COMPUTED_ONCE",
    "PLANNED_FOR",
    "RECHUNK_ANNOTATION",
    "REGIONS_ANNOTATION",
    "ROUTE_ANNOTATION",
    "SIBLINGS_ANNOTATION",
    "GraphFacts",
    "RechunkRecord",
    "annotated_blocks",
    "as_node",
    "blockwise_like",
    "describe",
    "layer_array",
    "layer_names",
    "merged_graph",
    "needed_layers",
    "opened_source",
    "passed_after",
    "planned_with",
    "read_layers",
    "reads_sources",
    "rechunk_records",
    "record_plan",
    "record_route",
    "routes_of",
    "source_constant",
    "source_read_by",
    "sources_read_by",
    "whole_input",
]
