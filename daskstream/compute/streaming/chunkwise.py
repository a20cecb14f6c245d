"""Reductions that read their blocks a few storage chunks at a time, each reduced where it was decoded.

A block of a planned array holds many storage chunks (a task's share of the
budget). Read whole, each of its chunks is decoded into the block, and the
reduction's first step then sums (or counts, or compares) the whole block,
long after the chunks it decoded first have left the processor's caches: a
second pass over memory, and a fresh block's pages to fault in for every
read. Where every step taking a local source's blocks is one that streams
spans piece by piece -- element-wise steps, slices, transposes, the first
steps of reductions whose combine is known, counts and histograms
(:mod:`daskstream.compute.streaming.spans`) -- the read instead gives its
block as a span of pieces a few storage chunks large: each piece is decoded,
taken through the element-wise steps and reduced while it is in the cache,
and the partials are combined as they come. The first steps of reductions
of one read that the planner computes together in one task per block
(:func:`~daskstream.graph.rewrites.fuse_siblings`) are set apart again, and
computed together piece by piece: each piece read once for all of them.

The graph keeps its tasks: only what the read and its takers compute inside
each one changes, so the plan (passes, tasks, memory: a piece holds less than
its block) is the one made for the blocks. Read as before, whole: blocks a
step takes whole (the result itself, dask's ``map_blocks`` of a function not
known to be element-wise); sources on object stores
(a block's chunks are fetched together, concurrently); sharded Zarr arrays
read in part (each piece would open its shard and read its index again); and
sources stored without chunks.
``daskstream.compute.chunkwise: false`` reads every block whole.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

from dask._task_spec import Task, TaskRef
from dask.blockwise import Blockwise, blockwise_token
from dask.core import reverse_dict
from dask.highlevelgraph import HighLevelGraph, Layer
from dask.typing import Key

from daskstream import config
from daskstream.compute.streaming.span_graphs import SpanKinds, classified_spans, streamed_spans
from daskstream.compute.streaming.span_read_counts import largest_block_bytes, layer_chunks, steps_reached
from daskstream.compute.streaming.span_steps import with_tasks
from daskstream.graph.layers import SIBLINGS_ANNOTATION, SPAN_ANNOTATION, blockwise_like, source_read_by, span_reads
from daskstream.graph.reads import read_span
from daskstream.sources.objects.places import is_url

#: The steps that take pieces where they would take the block: each piece computed while it is in the cache.
#: Reductions' first steps, arg-reductions', counts (``ds.reduce``'s histograms, its exact quantiles' counting
#: passes), dask's histograms and flox's groupbys, and the element-wise steps, slices and transposes before them.
STREAMED_KINDS = frozenset({"map", "narrow", "transpose", "reduce", "arg", "counts", "histogram", "grouped"})

#: The fewest bytes a piece holds, storage chunks allowing: a piece's Python work (its read, its steps, its
#: partial's combine; tens of microseconds) stays a few percent of decoding it.
MIN_PIECE_BYTES = 2**20


def chunkwise_reads(graph: HighLevelGraph, keys: list[Key]) -> HighLevelGraph:
    """``graph`` with the reads of local chunked sources whose every taker streams pieces giving spans of
    storage-chunk pieces, and those takers streaming them; ``graph`` itself where no read qualifies.

    A read qualifies where its source is a local file stored in chunks, its
    blocks begin on storage-chunk boundaries, and every step its blocks reach
    (through element-wise steps, slices and transposes) is one of
    :data:`STREAMED_KINDS`, the result none of them.
    """
    found = _qualifying(graph, keys)
    return graph if found is None else streamed_spans(*found[:2])


def pieces_read(graph: HighLevelGraph, keys: list[Key]) -> dict[str, int]:
    """The bytes of a piece each source of ``graph`` that :func:`chunkwise_reads` reads in pieces is read in,
    by the source's name (the largest, where it is read in several ways)."""
    found = _qualifying(graph, keys)
    if found is None:
        return {}
    spanned, _, pieces = found
    sizes: dict[str, int] = {}
    for name, piece in pieces.items():
        source = source_read_by(spanned, spanned.layers[name])
        if source is not None:
            sizes[source.name] = max(sizes.get(source.name, 0), math.prod(piece) * source.dtype.itemsize)
    return sizes


def _qualifying(
    graph: HighLevelGraph, keys: list[Key]
) -> tuple[HighLevelGraph, SpanKinds, dict[str, tuple[int, ...]]] | None:
    """``graph`` with its qualifying reads giving spans, what takes them, and each one's piece; ``None`` where
    no read qualifies."""
    if not config.get("compute.chunkwise") or not isinstance(graph, HighLevelGraph) or span_reads(graph):
        return None
    pieces = {name: piece for name, layer in graph.layers.items() if (piece := _piece(graph, layer)) is not None}
    if not pieces:
        return None
    graph = with_tasks(graph)
    # A read some step takes whole is read as before; one less read spanned may leave another's step taking a
    # mix of spans and blocks, which streams as well: a few rounds at most, one per read dropped.
    while pieces:
        spanned = _spanned(_unfused(graph, set(pieces)), pieces)
        found = classified_spans(spanned, keys)
        dependents = reverse_dict(spanned.dependencies)
        whole = {name for name in pieces if not _all_stream(name, dependents, found)}
        if not whole:
            return spanned, found, pieces
        pieces = {name: piece for name, piece in pieces.items() if name not in whole}
    return None


def _piece(graph: HighLevelGraph, layer: Any) -> tuple[int, ...] | None:
    """The piece a read layer's blocks would stream in: its source's storage chunk, grown along the first axis
    to :data:`MIN_PIECE_BYTES`, no longer than the longest block; ``None`` for any other layer, a source on an object
    store or without chunks, or blocks not beginning on storage-chunk boundaries."""
    if not isinstance(layer, Blockwise) or SPAN_ANNOTATION in (layer.collection_annotations or {}):
        return None
    source = source_read_by(graph, layer)
    chunks = layer_chunks(layer)
    storage = getattr(source, "storage_chunks", None)
    if source is None or chunks is None or storage is None or is_url(str(source.path)):
        return None
    if getattr(source, "shards_in_part", False):
        return None  # each piece would open its shard and read its index again: a block reads them once
    if not storage or min(storage) < 1 or 0 in source.shape:
        return None  # a scalar, or nothing stored: nothing to stream
    if len(storage) != len(chunks) or not all(_aligned(lengths, step) for lengths, step in zip(chunks, storage)):
        return None
    # Grown along the first axis, a piece's storage chunks lie one after another in it: each decoded in place.
    chunk_bytes = max(1, math.prod(storage) * source.dtype.itemsize)
    grown = min(-(-MIN_PIECE_BYTES // chunk_bytes), -(-max(chunks[0], default=0) // storage[0]))
    piece = (storage[0] * max(1, grown), *storage[1:])
    if all(max(lengths, default=0) <= step for lengths, step in zip(chunks, piece)):
        return None  # every block one piece at most (chunks="storage", say): nothing to stream
    return piece


def _unfused(graph: HighLevelGraph, reads: set[str]) -> HighLevelGraph:
    """``graph`` with the steps the planner computes together in one task per block of ``reads``
    (:func:`~daskstream.graph.rewrites.fuse_siblings`) apart again, each its own layer: where their blocks are
    spans, the reductions among them are computed together piece by piece instead
    (:mod:`~daskstream.compute.streaming.span_siblings`)."""
    layers, dependencies = dict(graph.layers), dict(graph.dependencies)
    for name, layer in graph.layers.items():
        if SIBLINGS_ANNOTATION not in (layer.collection_annotations or {}) or not graph.dependencies[name] & reads:
            continue
        if any(source_read_by(graph, graph.layers[d]) is not None for d in graph.dependencies[name] - reads):
            continue  # apart, another read's blocks read whole would wait for each step taking them
        assert isinstance(layer, Blockwise)  # a fused layer is one
        steps = layer.task.args  # each sibling's task, taking the fused layer's inputs
        picks = {
            taker: taker_layer.task.args[1]
            for taker, needs in graph.dependencies.items()
            if name in needs
            and isinstance(taker_layer := graph.layers[taker], Blockwise)
            and taker_layer.task.func is operator.getitem
        }
        if len(picks) != len(steps):
            continue  # a pick not found: left as fused
        for taker, position in picks.items():
            layers[taker] = _apart(layer, steps[position], graph.layers[taker])
            dependencies[taker] = set(graph.dependencies[name])
        del layers[name], dependencies[name]
    return HighLevelGraph(layers, dependencies, key_dependencies=dict(graph.key_dependencies))


def _apart(fused: Blockwise, step: Task, picked: Layer) -> Blockwise:
    """The layer of one sibling of ``fused``: its ``step`` over the inputs it takes, named as the layer that
    picked its result out of the fused one (``picked``)."""
    used = [i for i in range(len(fused.indices)) if blockwise_token(i) in step.dependencies]
    renamed = {blockwise_token(i): blockwise_token(n) for n, i in enumerate(used)}
    inputs = [fused.indices[i] for i in used]
    task = step.substitute(renamed)
    apart = Blockwise(
        output=picked.output,  # type: ignore[attr-defined]
        output_indices=fused.output_indices,
        task=Task(picked.output, task.func, *task.args, **task.kwargs),  # type: ignore[attr-defined]
        indices=inputs,
        numblocks={_name(n): fused.numblocks[_name(n)] for n, index in inputs if index is not None},
        concatenate=None,
        new_axes={},
        annotations=fused.annotations,
        io_deps=fused.io_deps,
    )
    apart.collection_annotations = dict(picked.collection_annotations or {})
    return apart


def _name(ref: Any) -> Any:
    """A blockwise input's layer name, whether given as itself or as a reference to it."""
    return ref.key if isinstance(ref, TaskRef) else ref


def _aligned(lengths: tuple[int, ...], step: int) -> bool:
    """Whether blocks of ``lengths`` each begin on a multiple of ``step`` (the last may end anywhere)."""
    start = 0
    for length in lengths[:-1]:
        start += length
        if start % step:
            return False
    return True


def _spanned(graph: HighLevelGraph, pieces: Mapping[str, tuple[int, ...]]) -> HighLevelGraph:
    """``graph`` with the read layers named in ``pieces`` giving spans of those pieces (what
    :func:`~daskstream.graph.reads.span_array` makes), never refused: a block is what a task held before."""
    layers = dict(graph.layers)
    for name, piece in pieces.items():
        read = graph.layers[name]
        assert isinstance(read, Blockwise)  # a read layer is one (see _piece)
        task = read.task
        spanned = blockwise_like(read, task=Task(task.key, read_span, *task.args, piece=piece))
        block_bytes = largest_block_bytes(read)
        spanned.collection_annotations = {
            **(read.collection_annotations or {}),
            SPAN_ANNOTATION: {"piece": piece, "cap": block_bytes},
        }
        layers[name] = spanned
    return HighLevelGraph(layers, graph.dependencies, key_dependencies=dict(graph.key_dependencies))


def _all_stream(read: str, dependents: Mapping[str, set[str]], found: SpanKinds) -> bool:
    """Whether every step the spans of ``read`` reach streams pieces (:data:`STREAMED_KINDS`), none taking
    them whole (``dependents``: each layer's takers)."""
    reached = steps_reached(read, dependents, found.kinds)
    if read in found.taken_whole or reached & found.taken_whole:
        return False
    return all(found.kinds.get(step) in STREAMED_KINDS for step in reached)


__all__ = ["MIN_PIECE_BYTES", "STREAMED_KINDS", "chunkwise_reads", "pieces_read"]
