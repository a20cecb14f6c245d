"""How many times a computation over spans reads each source: by every way its spans reach the steps that
take them (:func:`read_counts`).

A span holds no data: each step taking one reads its pieces itself, so a
source is read once by every such step and once more by every other way its
spans reach a step (``x + x[::-1]``: the array and its reverse; the halves
of a join read it once in all), except reductions computed together, which
share the reads of the pieces they take the same way. An index of positions
in no order reads each piece once per piece of its result it feeds
(:func:`~daskstream.compute.streaming.span_takes.pieces_read`).
"""

from __future__ import annotations

import graphlib
import math
from collections.abc import Callable, Mapping
from typing import Any

from dask.blockwise import Blockwise
from dask.core import reverse_dict
from dask.highlevelgraph import HighLevelGraph, Layer

from daskstream.compute.streaming.span_steps import transposition_of
from daskstream.compute.streaming.span_takes import pieces_read

#: The kinds of steps whose blocks are spans again where they take spans.
PASSING_SPANS = ("map", "narrow", "take", "rechunk", "transpose", "reshape", "scan", "carry")

#: How a span reaches a step from its read: the steps on the way that change which part of it a piece is (not
#: element-wise ones), what part of the read it reads (how many times over), and whether through an index.
_Way = tuple[tuple[Any, ...], float, bool]


def read_counts(
    graph: HighLevelGraph,
    kinds: Mapping[str, str | None],
    *,
    reads: set[str],
    results: set[str],
    siblings: list[tuple[str, ...]],
    pieces: Mapping[str, tuple[int, ...]],
    source_of: Callable[[str], str],
) -> tuple[dict[str, int], dict[str, float]]:
    """How many times each source read in spans is read: once for every step that takes its spans piece by
    piece or whole, and for every other way they reach it (``x + x[::-1]`` reads ``x`` twice, the halves of
    a join once in all), reductions computed together once for all, and once more where the result is a
    span. A span holds no data, so each of them reads the chunks itself. And how many times over, beyond
    those, indices with positions in no order read it (:func:`pieces_read`).

    ``kinds``: what each step taking spans is (:mod:`~daskstream.compute.streaming.span_graphs`); ``reads``:
    the layers reading spans, ``results`` those of the keys asked for, ``siblings`` the reductions computed
    together, ``pieces`` each layer's piece, ``source_of`` a read's source by name."""
    group_of = {name: group for group in siblings for name in group}
    position = {name: at for at, name in enumerate(graphlib.TopologicalSorter(graph.dependencies).static_order())}
    dependents = reverse_dict(graph.dependencies)
    counts: dict[str, int] = {}
    again: dict[str, float] = {}
    for read in reads:
        ways: dict[str, dict[tuple[Any, ...], _Way]] = {read: {(): ((), 1.0, False)}}
        takers, more = int(read in results), 0.0
        together: set[Any] = set()  # reductions reading it together the same ways, counted once
        # Only the steps after the read, in dependency order: a graph of many files has a read per file.
        for name in sorted(steps_reached(read, dependents, kinds), key=position.__getitem__):
            inputs = [d for d in sorted(graph.dependencies.get(name, ())) if d in ways and d != name]
            if not inputs:
                continue
            kind = kinds.get(name)
            reaching = _ways_to(graph, name, kind, {d: ways[d] for d in inputs}, pieces)
            # A carry reads the spans it takes once more: each scanned to its end, for the next.
            takers += kind == "carry"
            if kind in PASSING_SPANS:
                ways[name] = reaching
                if name not in results:
                    continue
            # Reductions computed together share the reads of the pieces they read the same ways; through an
            # index of positions, their pieces are regions of their own.
            plain = [times for _, times, through_take in reaching.values() if not through_take]
            taken = [times for _, times, through_take in reaching.values() if through_take]
            group = group_of.get(name) if not taken else None
            if group is not None and (group, frozenset(reaching)) in together:
                continue
            together.add((group, frozenset(reaching)))
            # Parts of one read (the halves of a join) read it once in all.
            takers += (max(1, math.ceil(sum(plain) - 1e-6)) if plain else 0) + len(taken)
            more += sum(max(times - 1, 0) for times in taken)
        source = source_of(read)
        counts[source] = counts.get(source, 0) + takers
        if more:
            again[source] = again.get(source, 0.0) + more
    return counts, again


def steps_reached(read: str, dependents: Mapping[str, set[str]], kinds: Mapping[str, str | None]) -> set[str]:
    """The steps the spans of ``read`` reach (``dependents``: each layer's takers): through steps passing them
    on, and the first that does not."""
    found, waiting = set(), [read]
    while waiting:
        for dependent in dependents.get(waiting.pop(), ()):
            if dependent not in found:
                found.add(dependent)
                if kinds.get(dependent) in PASSING_SPANS:
                    waiting.append(dependent)
    return found


def _ways_to(
    graph: HighLevelGraph,
    name: str,
    kind: str | None,
    inputs: Mapping[str, Mapping[tuple[Any, ...], _Way]],
    pieces: Mapping[str, tuple[int, ...]],
) -> dict[tuple[Any, ...], _Way]:
    """The ways a read's spans reach layer ``name`` of ``kind`` through its ``inputs`` (each one's ways):
    alike where only element-wise steps differ (a piece of each is the same part of the read)."""
    found: dict[tuple[Any, ...], _Way] = {}
    for d, ways in inputs.items():
        taking = kind == "take" and layer_chunks(graph.layers[d]) is not None and d in pieces
        factor = _part_read(graph, d, name, kind, pieces.get(d))
        for steps, times, through_take in ways.values():
            if kind in PASSING_SPANS and kind != "map":
                route = (*steps, _step_of_way(graph, name, kind, d))
            elif through_take:  # a taken span's pieces are gathered anew by each input taking it (not cached)
                route = (*steps, (name, d))
            else:
                route = steps
            way = (route, times * factor, through_take or taking)
            found[route] = max(found.get(route, way), way, key=lambda w: w[1])
    return found


def _step_of_way(graph: HighLevelGraph, name: str, kind: str | None, taken: str) -> Any:
    """A step changing which part of the read a piece is, as a way of reaching a later step: transposes and
    reshapes by what they do (xarray transposes the data and its mask alike), any other by the step and the
    input it takes (a join's parts are ways apart)."""
    layer = graph.layers[name]
    if kind == "transpose" and isinstance(layer, Blockwise):
        return (kind, transposition_of(layer.task, len(layer.output_indices)))
    if kind == "reshape":
        return (kind, layer_chunks(layer))
    return (name, taken)


def _part_read(graph: HighLevelGraph, name: str, dependent: str, kind: str | None, piece: Any) -> float:
    """What part of the blocks of ``name`` a step ``dependent`` of ``kind`` taking them reads, in all: a slice
    its own part (as counted by its size), an index of positions how many times over (:func:`pieces_read`)."""
    chunks, out = layer_chunks(graph.layers[name]), layer_chunks(graph.layers[dependent])
    if chunks is None or (kind == "take" and piece is None):
        return 1.0
    if kind == "take":
        return pieces_read(graph.layers[dependent], dependent, chunks, piece)
    if kind == "narrow" and out is not None:  # no more than all of it (a join or a pad makes more of its parts)
        return min(1.0, math.prod(map(sum, out)) / max(1, math.prod(map(sum, chunks))))
    return 1.0


def layer_chunks(layer: Layer) -> Any:
    """A layer's blocks as dask annotates them (``None`` where it does not)."""
    return (layer.collection_annotations or {}).get("chunks")


def largest_block_bytes(layer: Layer) -> int:
    """The bytes of a layer's largest block as dask annotates its blocks and dtype (8-byte values where no dtype
    is annotated; one value where no blocks are)."""
    annotations = layer.collection_annotations or {}
    itemsize = getattr(annotations.get("dtype"), "itemsize", 8)
    return math.prod(max(lengths, default=0) for lengths in annotations.get("chunks") or ()) * itemsize
