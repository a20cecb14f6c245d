"""Rewriting a dask graph so that a computation keeps its memory budget.

Each rewrite keeps every output key and what it computes:

* :func:`rewrite` computes again, in each pass, the reads (and the element-wise
  work on them) that the pass takes from earlier ones, under keys of its own,
  rather than holding their blocks (see :mod:`daskstream.planning.passes`);
* :func:`fuse_siblings` runs the steps of one pass that take the same read in
  one task per block;
* :func:`reread_rechunks` reads a source in the chunks a re-chunking of it asks
  for, instead of splitting and holding its blocks;
* :func:`variance_in_pieces` runs dask's variance step piece by piece.

:func:`clone_array` is not a rewrite: it makes a copy of an array's graph under
keys of its own, for a pass that must read the data again.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, cast

import dask.array as da
from dask._task_spec import Alias, GraphNode, Task, TaskRef
from dask.array.reductions import moment_chunk
from dask.base import tokenize
from dask.blockwise import Blockwise, blockwise_token
from dask.graph_manipulation import clone_key
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.typing import Key
from dask.utils import key_split

from daskstream.graph.layers import (
    PLANNED_FOR,
    SIBLINGS_ANNOTATION,
    as_node,
    blockwise_like,
    layer_names,
    needed_layers,
    passed_after,
    source_constant,
    source_read_by,
    sources_read_by,
)
from daskstream.graph.ordering import done_layer
from daskstream.graph.pieces import moment_chunk_in_pieces
from daskstream.graph.reads import read_array
from daskstream.planning.grid import read_amplification
from daskstream.planning.passes import PassPlan
from daskstream.sources.base import Source


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
        keys: set[Key] = set()
        for name in names:
            keys |= set(graph.layers[name].get_output_keys())
        renamed = {name: clone_key(name, seed) for name in names}
        earlier = sorted(b for b in plan.barriers if plan.levels[b] < level)
        for name in names:
            layers[renamed[name]] = _clone(graph.layers[name], keys, seed, graph)
            dependencies[renamed[name]] = {renamed.get(dep, dep) for dep in graph.dependencies.get(name, ())}
            constant = source_constant(graph, graph.layers[name])
            if constant is not None and earlier:
                _gate(layers, dependencies, renamed[name], constant[0], earlier, seed)
    for name, level in plan.levels.items():
        # Layers of pass ``level`` take its copies of what earlier passes streamed: of those it has (a small
        # constant an earlier pass made, the weights of an einsum, is taken as it is).
        copied = plan.recomputed.get(level, ())
        wanted = {
            dep: clone_key(dep, pass_seed(level))
            for dep in graph.dependencies.get(name, ())
            if dep not in plan.shared and plan.levels[dep] < level and dep in copied
        }
        if wanted:
            layers[name] = _redirect(graph.layers[name], wanted, graph)
            dependencies[name] = {wanted.get(dep, dep) for dep in dependencies[name]}
    return HighLevelGraph(layers, dependencies)


def _gate(
    layers: dict[str, Layer],
    dependencies: dict[str, set[str]],
    read: str,
    constant: str,
    barriers: list[str],
    seed: Hashable,
) -> None:
    """Make the read layer ``read`` of a later pass start only once ``barriers`` are computed.

    Nothing else orders a pass's reads after the aggregates it waits for: a
    scheduler free to read early holds every block read (and everything split
    from it) until the aggregate is known, the memory the pass was planned to
    save. The read takes its Source (layer ``constant``) through a task that
    waits for a ``None`` from each barrier block, made where that block is:
    no aggregate moves (:mod:`daskstream.graph.ordering`).
    """
    done = [done_layer(layers, dependencies, b, layers[b].get_output_keys()) for b in barriers]
    done_keys = sorted((k for name in done for k in layers[name].get_output_keys()), key=str)
    gate = clone_key(f"after-{constant}", seed)
    layers[gate] = MaterializedLayer({gate: Task(gate, passed_after, TaskRef(constant), *map(TaskRef, done_keys))})
    dependencies[gate] = {constant, *done}
    layers[read] = _redirect(layers[read], {constant: gate}, HighLevelGraph(layers, dependencies))
    dependencies[read] = (dependencies[read] - {constant}) | {gate}


def _clone(layer: Layer, keys: set[Key], seed: Hashable, graph: HighLevelGraph) -> Layer:
    """A copy of ``layer`` with its keys, and its references to ``keys``, renamed by ``seed``."""
    if isinstance(layer, Blockwise):
        cloned, _ = layer.clone(keys, seed)
        cloned.collection_annotations = dict(layer.collection_annotations or {})
        return cloned
    renamed = _key_renamer(seed)
    tasks = {}
    for key, value in layer.items():
        node = as_node(key, value, layer, graph)
        new_key = renamed(key)
        if not isinstance(node, GraphNode):
            tasks[new_key] = value
            continue
        tasks[new_key] = _renamed(node, {dep: renamed(dep) for dep in node.dependencies if dep in keys}, new_key)
    return MaterializedLayer(
        tasks, annotations=layer.annotations, collection_annotations=dict(layer.collection_annotations or {})
    )


def _key_renamer(seed: Hashable) -> Any:
    """``clone_key(key, seed)``, with each layer name's new name worked out once (a tokenize each)."""
    names: dict[str, str] = {}

    def renamed(key: Key) -> Key:
        name = key[0] if isinstance(key, tuple) else key
        if not isinstance(name, str):
            return clone_key(key, seed)
        if name not in names:
            names[name] = clone_key(name, seed)
        return (names[name], *key[1:]) if isinstance(key, tuple) else names[name]

    return renamed


def _renamed(node: GraphNode, subs: Mapping[Key, Key], key: Key) -> GraphNode:
    """``node`` under ``key``, taking ``subs`` in place of its dependencies.

    dask's ``Alias.substitute`` keeps the alias's own key when its target is
    not renamed; a node stored under a key must carry that key.
    """
    if isinstance(node, Alias):
        return Alias(key, subs.get(node.target, node.target))
    return node.substitute(dict(subs), key=key)


def clone_array(x: da.Array, seed: Hashable) -> da.Array:
    """``x`` over a copy of its whole graph with keys of its own: computing it reads the data again.

    What ``dask.graph_manipulation.clone(x, seed=seed)`` means to do. dask's
    own (2026.8) renames the keys of a materialized layer but not the keys its
    tasks take (the ``Alias`` or ``Task`` of a slice, ``x[:730]``: dask/dask#12455),
    so the copy still takes the original's blocks: the pass meant to read again
    holds the first pass's blocks instead, and once the first pass's graph is
    optimized (its keys fused away) the copy's tasks take keys that exist nowhere.
    Here every layer is copied as :func:`rewrite` copies a layer for a later
    pass, annotations (chunks, dtype, the plan) included.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> x = (da.arange(10, chunks=5) + 1)[2:7]
    >>> again = clone_array(x, seed=1)
    >>> again.compute().tolist(), set(dict(again.dask)).isdisjoint(dict(x.dask))
    ([3, 4, 5, 6, 7], True)
    """
    graph = cast(HighLevelGraph, x.__dask_graph__())  # a dask array's graph is a HighLevelGraph
    names = needed_layers(graph, [x.name])
    keys: set[Key] = set().union(*(graph.layers[name].get_output_keys() for name in names))
    layers = {clone_key(name, seed): _clone(graph.layers[name], keys, seed, graph) for name in names}
    dependencies = {
        clone_key(name, seed): {clone_key(dep, seed) for dep in graph.dependencies.get(name, ())} for name in names
    }
    return da.Array(HighLevelGraph(layers, dependencies), clone_key(x.name, seed), x.chunks, meta=x._meta)


def _redirect(layer: Layer, renamed: Mapping[str, str], graph: HighLevelGraph) -> Layer:
    """``layer`` taking the layers in ``renamed`` under their new names; its own keys unchanged."""
    if isinstance(layer, Blockwise):
        indices = []
        for ref, index in layer.indices:
            # Layer names are text: a key of another form is no layer's.
            if isinstance(ref, TaskRef) and isinstance(ref.key, str) and ref.key in renamed:
                ref = TaskRef(renamed[ref.key])
            elif isinstance(ref, str) and ref in renamed:
                ref = renamed[ref]
            indices.append((ref, index))
        numblocks = {renamed.get(name, name): blocks for name, blocks in layer.numblocks.items()}
        return blockwise_like(layer, indices=indices, numblocks=numblocks)
    tasks = {}
    for key, value in layer.items():
        node = as_node(key, value, layer, graph)
        if not isinstance(node, GraphNode):
            tasks[key] = value
            continue
        subs: dict[Key, Key | GraphNode] = {
            dep: (renamed[dep[0]], *dep[1:]) if isinstance(dep, tuple) else renamed[dep]
            for dep in node.dependencies
            if (dep[0] if isinstance(dep, tuple) else dep) in renamed
        }
        tasks[key] = node.substitute(subs) if subs else node
    return MaterializedLayer(
        tasks, annotations=layer.annotations, collection_annotations=dict(layer.collection_annotations or {})
    )


def fuse_siblings(graph: HighLevelGraph, names: Iterable[str], keys: Iterable[Key]) -> HighLevelGraph:
    """``graph`` with the blockwise steps that share a read computed in one task per block.

    When a read feeds several steps of one pass (a mean's and a variance's
    first steps), dask keeps each block until every step has taken it, and a
    process scheduler ships it to the parent process and back. Here the steps
    become one blockwise layer whose task reads the block once and returns
    every step's result; each step's layer then picks its own out of it.
    """
    names = set(names)
    outputs = layer_names(keys)
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
        if len(siblings) < 2 or not sources_read_by(graph, graph.layers[name]):
            continue
        # A step that also waits for something computed from this read cannot run beside the others.
        siblings = [t for t in siblings if _fusable_sibling(graph.layers[t], name) and not _waits_on(graph, t, name)]
        if name in outputs or len(siblings) < 2:
            continue
        together = f"daskstream-together-{tokenize(name, siblings)}"
        layers[together], dependencies[together] = _together(graph, siblings, together)
        for position, sibling in enumerate(siblings):
            # _fusable_sibling kept blockwise layers only.
            layers[sibling] = _pick(cast(Blockwise, graph.layers[sibling]), together, position)
            dependencies[sibling] = {together}
        changed = True
    return HighLevelGraph(layers, dependencies) if changed else graph


def _waits_on(graph: HighLevelGraph, step: str, read: str) -> bool:
    """Whether ``step`` takes, besides ``read`` itself, something computed from ``read``."""
    others = [dep for dep in graph.dependencies.get(step, ()) if dep != read]
    return read in needed_layers(graph, others) if others else False


def _fusable_sibling(layer: Layer, read: str) -> bool:
    """A blockwise step taking ``read`` block by block, aligned with its own blocks, and nothing else big."""
    if not isinstance(layer, Blockwise) or layer.new_axes or layer.output_blocks or layer.concatenate:
        return False
    aligned = [index for ref, index in layer.indices if getattr(ref, "key", ref) == read]
    return len(aligned) >= 1 and all(index == layer.output_indices for index in aligned)


def _together(graph: HighLevelGraph, siblings: list[str], name: str) -> tuple[Blockwise, set[str]]:
    """One blockwise layer running every sibling's task on its own inputs, returning their results as a tuple.

    The siblings are blockwise layers (:func:`_fusable_sibling`).
    """

    indices: list[tuple[Any, Any]] = []
    numblocks: dict[str, Any] = {}
    io_deps: dict[str, Any] = {}
    tasks = []
    for sibling in siblings:
        layer = cast(Blockwise, graph.layers[sibling])
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
    first = cast(Blockwise, graph.layers[siblings[0]])
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
        if index is None or not isinstance(key, str) or key not in layer.numblocks:
            continue
        for letter, n in zip(index, layer.numblocks[key]):
            sizes[letter] = max(sizes.get(letter, 1), n)
    return tuple(sizes.get(letter, 1) for letter in layer.output_indices)


#: How much more often a re-read in new chunks may decode storage chunks than the read it replaces.
AMPLIFICATION_SLACK = 1.25
#: Storage chunks up to this size are read again in a rechunk's pieces however often those cut them.
REREAD_CHUNK_BYTES = 4 * 2**20


#: Read blocks a new chunk may draw from for a rechunk to keep them (rather than read again in its chunks).
HELD_FAN_IN = 2


def fan_in(before: tuple[tuple[int, ...], ...], after: tuple[tuple[int, ...], ...]) -> int:
    """The most blocks of ``before`` one chunk of ``after`` overlaps.

    >>> fan_in(((365, 365), (10,)), ((73,) * 10, (10,)))
    1
    >>> fan_in(((365, 365, 365), (10,)), ((1095,), (5, 5)))
    3
    """
    most = 1
    for old, new in zip(before, after, strict=True):
        old_ends = list(itertools.accumulate(old))
        widest, start = 1, 0
        for length in new:
            stop = start + length
            first = bisect.bisect_right(old_ends, start)
            last = bisect.bisect_left(old_ends, stop)
            widest = max(widest, last - first + 1)
            start = stop
        most *= widest
    return most


def reread_rechunks(graph: HighLevelGraph, names: Iterable[str], hold_limit: int | None = None) -> HighLevelGraph:
    """``graph`` with every re-chunking of a source read replaced by a read of the source in the new chunks.

    dask re-chunks by splitting and concatenating blocks, which holds each
    block until all its pieces have been taken (element-wise work on two
    sources of different chunks re-chunks both). A source can be read in any
    chunks: read it in those directly, unless those chunks cut its storage
    chunks (larger than :data:`REREAD_CHUNK_BYTES`) more than the read did
    (:data:`AMPLIFICATION_SLACK`) and a task may hold two of them
    (``hold_limit``: a task's share of the budget; ``None``, no limit).
    """
    replaced = {}
    for name in names:
        if not key_split(name).startswith("rechunk"):
            continue
        layer = graph.layers[name]
        annotations = layer.collection_annotations or {}
        chunks = annotations.get("chunks")
        found = _rechunked_source(graph, name)
        if chunks is None or found is None:
            continue
        source, read = found
        # A read in the new chunks that cuts large storage chunks the old one read whole decodes each of them
        # once per piece (a year's chunk read again for every 12 days of an anomaly): dask's split is cheaper,
        # where it holds few of them. Small storage chunks (a day of a 1-degree grid) cost little to read
        # again; under a budget that cannot hold two large ones, reading again is what keeps the promise,
        # however slow; and a new chunk drawn from many read blocks (a column of every year) would keep them
        # all until the last.
        before = (graph.layers[read].collection_annotations or {}).get("chunks")
        if (
            before is not None
            and REREAD_CHUNK_BYTES < source.storage_chunk_bytes() <= (hold_limit or source.nbytes) // 2
            and fan_in(before, chunks) <= HELD_FAN_IN
            and read_amplification(source.shape, source.storage_chunks, chunks)
            > read_amplification(source.shape, source.storage_chunks, before) * AMPLIFICATION_SLACK
        ):
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


def _rechunked_source(graph: HighLevelGraph, name: str) -> tuple[Source, str] | None:
    """The Source a chain of re-chunking layers starting at ``name`` reads, and that read layer's name (or ``None``)."""
    while True:
        deps = graph.dependencies.get(name, set())
        if len(deps) != 1:
            return None
        (dep,) = deps
        source = source_read_by(graph, graph.layers[dep])
        if source is not None:
            return source, dep
        if not key_split(dep).startswith("rechunk"):
            return None
        name = dep


def _read_layers(source: Source, chunks: tuple[tuple[int, ...], ...], name: str, read: Layer) -> HighLevelGraph:
    """The layers of a read of ``source`` in ``chunks`` under the name ``name``, annotated as ``read`` is."""
    array = read_array(source, chunks, name)
    planned = (read.collection_annotations or {}).get(PLANNED_FOR)
    if planned is not None:
        array.dask.layers[name].collection_annotations[PLANNED_FOR] = planned
    return array.dask  # the graph __dask_graph__ returns, which dask's protocol types as a plain Mapping


def variance_in_pieces(graph: HighLevelGraph, names: Iterable[str]) -> HighLevelGraph:
    """``graph`` with dask's first variance step (``x.std()``, ``x.var()``, their nan- forms) replaced by
    :func:`~daskstream.graph.pieces.moment_chunk_in_pieces`: the same partial results, from
    temporaries a few pieces large instead of two copies of the block."""
    replaced = {}
    for name in names:
        layer = graph.layers[name]
        func = getattr(getattr(layer, "task", None), "func", None)
        if not isinstance(layer, Blockwise) or not isinstance(func, functools.partial) or func.func is not moment_chunk:
            continue
        task = layer.task
        pieces = functools.partial(moment_chunk_in_pieces, *func.args, **func.keywords)
        replaced[name] = blockwise_like(layer, task=Task(task.key, pieces, *task.args, **task.kwargs))
    if not replaced:
        return graph
    return HighLevelGraph({**graph.layers, **replaced}, graph.dependencies)


__all__ = ["clone_array", "fuse_siblings", "pass_seed", "reread_rechunks", "rewrite", "variance_in_pieces"]
