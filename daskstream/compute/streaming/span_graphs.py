"""The graph of a computation over spanned arrays, rewritten so that every step taking a span streams it.

Runs before dask's own optimizations, on the high-level graph (see
:mod:`daskstream.compute.streaming.spans` for what streams and how). Each layer taking
blocks that may be spans is one of:

``map``
    a blockwise element-wise step over them, block for block;
``transpose``
    their axes permuted (``np.transpose``, ``np.swapaxes``);
``reshape``
    each reshaped to its block's shape (``x.reshape``, ``x.ravel``;
    :mod:`~daskstream.compute.streaming.span_reshapes`);
``narrow``
    slices of them, integers, steps (reversing ones too) and new axes in
    their index (or whole blocks passed on);
``take``
    dask's index of them with an array of positions along an axis: its
    picks of each block's positions and their concatenations in the order
    asked (:mod:`~daskstream.compute.streaming.span_takes`);
``rechunk``
    dask's rechunk of them: their parts cut and joined into new blocks
    (:mod:`~daskstream.compute.streaming.span_rechunks`);
``reduce``
    a reduction's first step whose combine is known, block for block along
    the axes it keeps;
``arg``
    an arg-reduction's first step (dask's ``arg_chunk``), block for block;
``grouped``
    flox's first step of a map-reduce groupby, block for block
    (:mod:`~daskstream.compute.streaming.span_groups`);
``scan``
    a cumulative step's first step (each block scanned along an axis), block for block;
``carry``
    the rest of a cumulative step: the carry past each block merged into the
    next (dask's ``extra`` blocks), the carry past a span being the span
    scanned to its end;
``histogram``
    dask's own histogram's counts of each block
    (:mod:`~daskstream.compute.streaming.span_histograms`);
``streams``
    a step reading the spans it takes part by part itself (a function
    marked :func:`~daskstream.compute.streaming.span_steps.streams_spans`: a
    store's writes), left as it is;
anything else
    a step that takes them whole: the layer giving them then gives its blocks
    whole where each fits a task's share of the budget, or the computation is
    refused before it runs.
"""

from __future__ import annotations

import copy as copy_module
import functools
import graphlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dask._task_spec import Task, TaskRef
from dask.blockwise import Blockwise, blockwise_token
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.typing import Key

from daskstream.compute.streaming.span_groups import grouped_combine, joined_groups
from daskstream.compute.streaming.span_histograms import is_histogram_layer, streaming_histogram_layer
from daskstream.compute.streaming.span_read_counts import PASSING_SPANS, layer_chunks, read_counts
from daskstream.compute.streaming.span_rechunks import is_rechunk_layer, narrowing_task, streaming_rechunk_layer
from daskstream.compute.streaming.span_refusals import check_whole, source_name
from daskstream.compute.streaming.span_reshapes import (
    is_reshaping,
    reshaped_layer_piece,
    span_reshape,
    span_reshape_whole,
)
from daskstream.compute.streaming.span_scans import carries_scans, carry_layers, span_scan, span_scan_whole
from daskstream.compute.streaming.span_siblings import fused_reductions, sibling_reductions
from daskstream.compute.streaming.span_steps import (
    counts_rows,
    has_array_constants,
    is_arg_chunk,
    is_elementwise,
    is_key_of,
    is_narrowing,
    is_streaming_spans,
    materialized_like,
    narrowed_piece,
    reduction_of,
    scan_merge_of,
    transposition_of,
    with_tasks,
)
from daskstream.compute.streaming.span_takes import is_take_layer, streaming_take_layer
from daskstream.compute.streaming.spans import (
    Combine,
    Step,
    read_whole,
    span_arg,
    span_counts,
    span_map,
    span_map_whole,
    span_reduce,
    span_transpose,
    span_transpose_whole,
)
from daskstream.graph.layers import (
    blockwise_like,
    layer_names,
    planned_with,
    span_reads,
)
from daskstream.graph.optimize import plan_graph
from daskstream.graph.projection import HOLDS_NO_DATA
from daskstream.planning.computation import Spans


@dataclass
class SpanKinds:
    """The layers of a graph reading spans: what each step taking them is, and which take them whole."""

    reads: dict[str, Mapping[str, Any]]
    kinds: dict[str, str | None] = field(default_factory=dict)
    spans: set[str] = field(default_factory=set)  # layers whose blocks may be spans
    taken_whole: set[str] = field(default_factory=set)
    results: set[str] = field(default_factory=set)  # the layers of the keys asked for
    siblings: list[tuple[str, ...]] = field(default_factory=list)  # reductions computed together


class SpanGraphs(NamedTuple):
    """A graph reading spans, streamed; annotated in pieces for projecting a task's memory; how many times each
    source read in spans is read, and how many times over beyond those (:func:`~.span_read_counts.read_counts`)."""

    streamed: HighLevelGraph
    pieced: HighLevelGraph
    read_counts: dict[str, int]
    read_again: dict[str, float]


def classified_spans(graph: HighLevelGraph, keys: list[Key]) -> SpanKinds:
    """What each step taking the spans of ``graph``'s span reads is, which of them pass spans on, which take
    them whole (``keys``' layers among them) and which reductions are computed together."""
    found = SpanKinds(reads=span_reads(graph))
    found.spans = set(found.reads)
    for name in graphlib.TopologicalSorter(graph.dependencies).static_order():
        taken = graph.dependencies.get(name, set()) & found.spans
        if name in found.reads or not taken or name not in graph.layers:
            continue
        kind = found.kinds[name] = _kind(graph, name, taken)
        if kind in PASSING_SPANS:
            found.spans.add(name)
    found.results = layer_names(keys)
    found.taken_whole = found.results & found.spans
    for name, kind in found.kinds.items():
        if kind is None:
            found.taken_whole |= graph.dependencies[name] & found.spans
    found.siblings = sibling_reductions(graph, found.kinds, found.spans, set(found.reads))
    return found


def span_graphs(graph: Any, keys: list[Key]) -> SpanGraphs | None:
    """``graph`` with every step taking spans rewritten to stream them, ``graph`` with the blocks of those
    steps annotated as the pieces they hold at once, for projecting a task's memory, and the times each
    source is read; ``None`` where it reads no span. All from one reading of which steps take spans and how.

    Raises
    ------
    MemoryBudgetError
        When a step not known to stream (or the result) would take whole
        blocks larger than a task's share of the budget.
    """
    if not span_reads(graph):
        return None
    graph = with_tasks(graph)
    found = classified_spans(graph, keys)
    counted = read_counts(
        graph,
        found.kinds,
        reads=set(found.reads),
        results=found.results,
        siblings=found.siblings,
        pieces=_layer_pieces(graph, found),
        source_of=functools.partial(source_name, graph),
    )
    return SpanGraphs(streamed_spans(graph, found), _pieced(graph, found), *counted)


def checked_spans(graph: Any, keys: list[Key]) -> HighLevelGraph | None:
    """``graph`` with its spans streamed (:func:`span_graphs`), its chunks' work projected against the budget its
    arrays were opened with (``None`` where it reads no span).

    Raises
    ------
    MemoryBudgetError
        When a step takes whole blocks past the budget, or one chunk's work does.
    """
    found = span_graphs(graph, keys)
    if found is None:
        return None
    streamed, pieced, _, _ = found
    planned = planned_with(graph)
    if planned is not None:
        plan_graph(pieced, keys, planned, holds=False)[1].check()
    return streamed


def streamed_spans(graph: HighLevelGraph, found: SpanKinds) -> HighLevelGraph:
    """``graph`` with each step ``found`` classified rewritten to stream its spans, reads taken whole read at once.

    Raises
    ------
    MemoryBudgetError
        When a step takes whole blocks past the reads' cap.
    """
    cap = min(int(planned["cap"]) for planned in found.reads.values())
    for name in found.taken_whole:
        takers = [d for d, kind in found.kinds.items() if kind is None and name in graph.dependencies[d]]
        check_whole(graph, name, cap, takers, read=name in found.reads)
    layers, dependencies = dict(graph.layers), dict(graph.dependencies)
    together = {name for group in found.siblings for name in group}  # rewritten with their siblings, below
    for name, kind in found.kinds.items():
        if name in together:
            continue
        if kind == "carry":  # with a layer of its own: the spans' totals
            carried, needs = carry_layers(graph, name, whole=name in found.taken_whole)
            layers.update(carried)
            dependencies.update(needs)
        elif kind not in (None, "streams"):  # a step streaming spans itself takes them as they come
            layers[name] = _rewritten(graph, name, kind, whole=name in found.taken_whole)
    for group in found.siblings:
        fused, depending = fused_reductions(graph, group, _reduction_parts)
        layers.update(fused)
        dependencies.update(depending)
    for name in found.taken_whole & set(found.reads):
        # A read whose blocks a step takes whole (they fit a task's share): read at once. A span read is a
        # blockwise read of its source or a kernel's regions (daskstream.graph.reads.span_array, region_array).
        read = graph.layers[name]
        if isinstance(read, Blockwise):
            task = read.task
            layers[name] = blockwise_like(read, task=Task(task.key, read_whole, task.func, *task.args, **task.kwargs))
    return HighLevelGraph(layers, dependencies, key_dependencies=dict(graph.key_dependencies))


def span_piece_of(graph: Any, name: str) -> tuple[int, ...] | None:
    """The piece the blocks of layer ``name`` of ``graph`` stream in, where they are spans (or a reduction's
    first step over spans): the chunk of the reads they come from, through the steps between; else ``None``."""
    if not span_reads(graph):
        return None
    graph = with_tasks(graph)
    found = classified_spans(graph, [])
    return _layer_pieces(graph, found).get(name) if name in found.spans or name in found.kinds else None


def _layer_pieces(graph: HighLevelGraph, found: SpanKinds, *, at_most: bool = False) -> dict[str, tuple[int, ...]]:
    """The piece of each layer whose blocks are spans or take them: a read's own, the smallest of a step's
    inputs along each axis, a slice's or index's of its input (axes indexed by an integer gone, stepped
    axes shorter), a reshape's rows (``at_most``: the most a piece holds, for the projection)."""
    pieces = {name: tuple(planned["piece"]) for name, planned in found.reads.items()}
    for name in graphlib.TopologicalSorter(graph.dependencies).static_order():
        kind = found.kinds.get(name)
        inputs = [pieces[d] for d in sorted(graph.dependencies.get(name, ())) if d in pieces]
        if name in pieces or kind is None or not inputs:
            continue
        if kind == "narrow":
            pieces[name] = narrowed_piece(graph.layers[name], inputs[0])
        elif kind == "reshape":
            reshaped = reshaped_layer_piece(graph, graph.layers[name], inputs[0], at_most=at_most)
            if reshaped is not None:
                pieces[name] = reshaped
        elif kind == "transpose":
            layer = graph.layers[name]
            assert isinstance(layer, Blockwise)  # a "transpose" layer is one
            order = transposition_of(layer.task, len(inputs[0]))
            pieces[name] = tuple(inputs[0][axis] for axis in order or ())
        elif kind in ("carry", "take", "rechunk"):  # their pieces hold at most as much as their input's
            pieces[name] = inputs[0]
        elif kind in ("map", "reduce", "arg", "scan"):
            layer = graph.layers[name]
            if kind == "reduce" and isinstance(layer, Blockwise):  # its inputs' axes in its order (an einsum's)
                out = layer.output_indices
                inputs = [
                    tuple(pieces[n][index.index(o)] for o in out)
                    for n, index in layer.indices
                    if isinstance(n, str) and n in pieces and index is not None and sorted(index) == sorted(out)
                ] or inputs
            ndim = len(layer_chunks(layer) or inputs[0])
            alike = [p for p in inputs if len(p) == ndim]
            if alike:
                pieces[name] = tuple(min(p[axis] for p in alike) for axis in range(ndim))
    return pieces


def _pieced(graph: HighLevelGraph, found: SpanKinds) -> HighLevelGraph:
    """The number of blocks of the layers annotated in pieces is then the pieces', not the tasks'."""
    reduced = {n: _reduced_axes(graph.layers[n]) for n, kind in found.kinds.items() if kind in ("reduce", "arg")}
    pieces = _layer_pieces(graph, found, at_most=True)
    layers = dict(graph.layers)
    for name in (found.spans - found.taken_whole) | set(reduced):
        layer, chunks = graph.layers[name], layer_chunks(graph.layers[name])
        piece = pieces.get(name)
        if chunks is None or piece is None or len(piece) != len(chunks):
            continue  # no span read this layer's piece is known from: left as annotated
        copy = copy_module.copy(layer)
        # A reduction's first step makes one partial per block along the axes it reduces (dask's annotation
        # still has its input's blocks there).
        split = tuple(
            (1,) * len(lengths) if axis in reduced.get(name, ()) else _split(lengths, step)
            for axis, (lengths, step) in enumerate(zip(chunks, piece, strict=True))
        )
        # Spans hold no data: each step taking one reads it itself, none waits for a second.
        spans = {HOLDS_NO_DATA: True} if name in found.spans and name not in found.taken_whole else {}
        copy.collection_annotations = {**(layer.collection_annotations or {}), "chunks": split, **spans}
        layers[name] = copy
    return HighLevelGraph(layers, graph.dependencies, key_dependencies=dict(graph.key_dependencies))


def _reduced_axes(layer: Layer) -> tuple[int, ...]:
    """The axes a reduction's first step (a ``reduce`` or ``arg`` layer) reduces."""
    if isinstance(layer, Blockwise):
        reduction = reduction_of(layer.task, len(layer.output_indices))
        assert reduction is not None  # a "reduce" layer is one whose combine is known
        return reduction[1]
    return tuple(next(iter(layer.values()))[2])  # an arg-reduction's (chunk, block, axis, offset)


def _split(lengths: tuple[int, ...], step: int) -> tuple[int, ...]:
    """Block lengths cut into pieces of at most ``step``."""
    # Chained in C: a pebibyte's axis is millions of pieces, a generator's step apiece took 0.1 s an axis.
    cut = ((step,) * (n // step) + ((n % step,) if n % step else ()) for n in lengths)
    return tuple(itertools.chain.from_iterable(cut))


def span_facts(streamed: Any, graph: HighLevelGraph) -> Spans:
    """What :class:`~daskstream.planning.computation.Spans` says of ``streamed``, the optimized graph of
    ``graph`` (whose span reads it counts chunks per task of)."""
    found = span_reads(graph)
    most = bytes_most = 0
    for name, planned in found.items():
        layer = graph.layers[name]
        piece = tuple(planned["piece"])
        per_span = math.prod(-(-max(c) // p) for c, p in zip(layer_chunks(layer), piece, strict=True))
        most = max(most, per_span)
        itemsize = getattr((layer.collection_annotations or {}).get("dtype"), "itemsize", 8)
        bytes_most = max(bytes_most, math.prod(piece) * itemsize)
    return Spans(tasks=len(streamed), chunks=most, chunk_bytes=bytes_most)


def _kind(graph: HighLevelGraph, name: str, taken: set[str]) -> str | None:
    layer = graph.layers[name]
    if isinstance(layer, Blockwise):
        return _blockwise_kind(graph, layer, taken)
    if isinstance(layer, MaterializedLayer):
        values = list(layer.values())
        if values and all(isinstance(v, Task) and is_streaming_spans(v.func) for v in values):
            return "streams"
        if values and all(is_arg_chunk(v) and is_key_of(v[1], taken) for v in values):
            return "arg"
        if values and carries_scans(graph, name, values, taken):
            return "carry"
        if all(is_narrowing(value) for value in values):
            return "narrow"
        if is_take_layer(values):
            return "take"
        if is_rechunk_layer(values):
            return "rechunk"
        if is_histogram_layer(values, taken):
            return "histogram"
        if values and all(is_reshaping(value) for value in values):
            return "reshape"
    return None


def _blockwise_kind(graph: HighLevelGraph, layer: Blockwise, taken: set[str]) -> str | None:
    """``map``, ``reduce`` or ``counts`` for a blockwise step that streams the spans it takes block for block,
    else None."""
    if counts_rows(layer, taken):
        return "counts"
    if layer.new_axes or layer.concatenate:
        return None
    out = layer.output_indices
    if len(layer.indices) == 1 and transposition_of(layer.task, len(out)) is not None:
        return "transpose"
    if len(layer.indices) == 1 and layer.indices[0][1] == out and scan_merge_of(layer.task) is not None:
        return "scan"
    spanned_whole = [index == out for name, index in layer.indices if isinstance(name, str) and name in taken]
    if all(spanned_whole) and grouped_combine(graph, layer) is not None:
        return "grouped"
    chunks = layer_chunks(layer)
    spanned = [(name, index or ()) for name, index in layer.indices if isinstance(name, str) and name in taken]
    inputs = [layer_chunks(graph.layers[name]) for name, _ in spanned]
    # Each spanned input has the output's axes, in its order (a reduction's: in any order, an einsum's).
    if chunks is None or any(sorted(index) != sorted(out) for _, index in spanned) or any(c is None for c in inputs):
        return None
    if has_array_constants(layer):
        return None  # a constant array applied whole to every piece would not follow the pieces
    aligned = all(index == out for _, index in spanned)
    if aligned and is_elementwise(layer.task.func, layer.task.kwargs) and all(c == chunks for c in inputs):
        return "map"
    reduction = reduction_of(layer.task, len(out))
    if reduction is None:
        return None
    reduced = reduction[1]
    # A first step keeps its blocks along the axes it keeps (and makes one partial of each along the others).
    kept = [a for a in range(len(out)) if a not in reduced]
    if any(c[index.index(out[a])] != chunks[a] for (_, index), c in zip(spanned, inputs) for a in kept):
        return None
    return "reduce"


def _rewritten(graph: HighLevelGraph, name: str, kind: str, *, whole: bool) -> Layer:
    layer = graph.layers[name]
    if kind == "arg":
        return materialized_like(
            layer,
            {key: Task(key, span_arg, f, TaskRef(block), axis, at) for key, (f, block, axis, at) in layer.items()},
        )
    if kind == "reshape":
        reshape = span_reshape_whole if whole else span_reshape
        return materialized_like(layer, {key: Task(key, reshape, *value.args) for key, value in layer.items()})
    if kind == "take":
        return streaming_take_layer(layer, name, taken_whole=whole)
    if kind == "rechunk":
        return streaming_rechunk_layer(layer, name, taken_whole=whole)
    if kind == "histogram":
        return streaming_histogram_layer(layer)
    if kind == "narrow":
        return materialized_like(layer, {key: narrowing_task(key, value, whole=whole) for key, value in layer.items()})
    assert isinstance(layer, Blockwise)
    out = layer.output_indices
    axes = _step_axes(layer)
    step = Step(layer.task, axes)
    refs = [TaskRef(blockwise_token(i)) for i in range(len(layer.indices))]
    if kind == "transpose":
        order = transposition_of(layer.task, len(out))
        task = Task(layer.task.key, span_transpose_whole if whole else span_transpose, refs[0], order)
    elif kind == "map":
        task = Task(layer.task.key, span_map_whole if whole else span_map, step, *refs)
    elif kind == "counts":
        task = Task(layer.task.key, span_counts, step, *refs)
    elif kind == "grouped":
        grouped = grouped_combine(graph, layer)
        assert grouped is not None  # a "grouped" layer is one whose combine is known
        combine = Combine(grouped[0], grouped[1], len(out), join=joined_groups)
        task = Task(layer.task.key, span_reduce, step, combine, *refs)
    elif kind == "scan":
        merge = scan_merge_of(layer.task)
        scan = span_scan_whole if whole else span_scan
        axis = int(layer.task.kwargs["axis"]) % len(out)  # a scan counts its axes from the first
        task = Task(layer.task.key, scan, Step(layer.task, axes), merge, refs[0], axis)
    else:
        task = Task(layer.task.key, span_reduce, *_reduction_parts(layer), *refs)
    return blockwise_like(layer, task=task)


def _step_axes(layer: Blockwise) -> tuple[tuple[int | None, ...] | None, ...]:
    """Each input's axes as the output's (``None`` for an input taken whole)."""
    out = layer.output_indices
    return tuple(
        None if index is None else tuple(out.index(i) if i in out else None for i in index)
        for _, index in layer.indices
    )


def _reduction_parts(layer: Blockwise) -> tuple[Step, Combine]:
    """A ``reduce`` layer's step and how its partials combine."""
    reduction = reduction_of(layer.task, len(layer.output_indices))
    assert reduction is not None  # a "reduce" layer is one whose combine is known
    return Step(layer.task, _step_axes(layer)), Combine(*reduction, len(layer.output_indices))
