"""A store of an array read in spans: each task writes the target chunks of about one span, one at a time.

An array read in spans (:mod:`daskstream.planning.spans`) has blocks of many
chunks, more than a task may hold. Its target is chunked in the pieces the
spans stream in, and each task covers the target chunks lying in about one
span: it computes one chunk from the spans (:func:`~daskstream.compute.streaming.spans.piece_of`),
writes it and marks it done, then the next, so a task holds one chunk's work
whatever its span, and a resumed store reads and writes only the chunks not
marked. A span is a description of what to read, not data: a task whose
chunks straddle two spans (an array sliced off the source's grid) takes both.

A target written by one process (HDF5) takes its chunks from tasks instead:
:func:`span_chunks` makes the array one task per target chunk, each
computing its chunk from the spans it lies in, for the writer to gather a
window at a time as it does any array's blocks.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
from dask._task_spec import List, Task, TaskRef
from dask.base import tokenize
from dask.blockwise import Blockwise
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from daskstream.compute.streaming.span_graphs import checked_spans
from daskstream.compute.streaming.span_steps import scan_merge_of, streaming_tasks, streams_spans
from daskstream.compute.streaming.spans import piece_of
from daskstream.graph.projection import holds_its_output_only
from daskstream.planning.grid import regular_block_slices, regular_grid

if TYPE_CHECKING:
    from daskstream.compute.store.zarr_writes import ChunkWrites

Index = tuple[int, ...]


class ChunksLeft:
    """The target chunks a store of spans has left: every chunk of the grid of ``counts`` but those ``done``,
    found as they are needed (a pebibyte's chunks are never listed at once)."""

    def __init__(self, counts: tuple[int, ...], done: set[Index]) -> None:
        self.counts, self.done = counts, done

    def __len__(self) -> int:
        return math.prod(self.counts) - len(self.done)

    def __iter__(self) -> Iterator[Index]:
        return (index for index in np.ndindex(*self.counts) if index not in self.done)

    def __contains__(self, index: object) -> bool:
        within = isinstance(index, tuple) and all(0 <= i < n for i, n in zip(index, self.counts))
        return within and len(index) == len(self.counts) and index not in self.done  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class TaskChunks:
    """The target chunks one task writes: those of a box of the chunk grid (a range of indices per axis), but
    the ones ``done`` before, in C order."""

    box: tuple[tuple[int, int], ...]
    done: frozenset[Index] = frozenset()

    def __iter__(self) -> Iterator[Index]:
        ranges = (range(start, stop) for start, stop in self.box)
        return (index for index in itertools.product(*ranges) if index not in self.done)

    def __len__(self) -> int:
        return math.prod(stop - start for start, stop in self.box) - len(self.done)


def span_writes(x: da.Array, writes: ChunkWrites, left: ChunksLeft) -> tuple[da.Array, list[TaskChunks]]:
    """The tasks writing the chunks ``left`` of ``x``'s target, and the chunks each writes.

    The tasks make a one-axis array of one value each, only the tasks with
    chunks left to write: their keys are what to compute. They number about
    ``x``'s blocks, whatever the chunks.
    """
    chunks = writes.chunks
    # Per axis, where tasks begin, in target chunks: at x's block edges, each rounded to the nearest chunk.
    edges = [_task_edges(sizes, c, n) for sizes, c, n in zip(x.chunks, chunks, x.shape)]
    done_in: dict[Index, set[Index]] = {}
    for index in left.done:
        done_in.setdefault(_task_of(edges, index), set()).add(index)
    block_starts = [np.cumsum((0, *sizes)) for sizes in x.chunks]
    name = f"daskstream-store-spans-{tokenize(x.name, writes, sorted(left.done))}"
    tasks: dict[tuple[str, int], Task] = {}
    writing: list[TaskChunks] = []
    for task in np.ndindex(*(len(e) - 1 for e in edges)):
        box = tuple((int(e[t]), int(e[t + 1])) for e, t in zip(edges, task))
        covered = TaskChunks(box, frozenset(done_in.get(task, ())))
        if not len(covered):
            continue
        region = tuple((start * c, min(stop * c, n)) for (start, stop), c, n in zip(box, chunks, x.shape))
        blocks = list(itertools.product(*(_overlapping(s, r) for s, r in zip(block_starts, region))))
        key = (name, len(writing))
        tasks[key] = Task(
            key,
            write_span_chunks,
            List(*(TaskRef((x.name, *block)) for block in blocks)),
            [tuple(int(s[b]) for s, b in zip(block_starts, block)) for block in blocks],
            x.shape,
            x.dtype,
            covered,
            writes,
        )
        writing.append(covered)
    return streaming_tasks(name, tasks, [x], (len(tasks),)), writing


def refuse_unstreamed(x: da.Array) -> None:
    """Refuse ``x`` before anything is created where its store could not stream it: a step before the store
    takes whole spans past the budget (the refusal its tasks would meet, met on one task's graph)."""
    key = (f"daskstream-store-spans-check-{tokenize(x.name)}", 0)
    first = (x.name, *(0,) * x.ndim)
    origin = (0,) * x.ndim
    # Never run: what its graph makes of the steps before it is the check.
    task = Task(key, write_span_chunks, List(TaskRef(first)), [origin], x.shape, x.dtype, TaskChunks(()), None)
    checked_spans(streaming_tasks(key[0], {key: task}, [x], (1,)).dask, [key])


def span_chunks(x: da.Array, piece: tuple[int, ...]) -> da.Array:
    """``x`` (read in spans) on the grid of its target's chunks, ``piece``: a task per chunk computes it from
    the spans it lies in, one piece read at a time, for a writer through which every chunk passes.

    Its blocks are the target's chunks, computed alone: a graph of as many
    tasks as the target has chunks, each holding one.
    """
    grid = regular_grid(x.shape, piece)
    # Per axis and chunk along it: the blocks of x it overlaps, each with where it begins.
    along = [_blocks_along(sizes, lengths) for sizes, lengths in zip(x.chunks, grid)]
    name = f"daskstream-span-chunks-{tokenize(x.name, piece)}"
    tasks: dict[tuple[Any, ...], Task] = {}
    for index in np.ndindex(*(len(lengths) for lengths in grid)):
        parts = [axis[i] for axis, i in zip(along, index)]
        blocks = list(itertools.product(*(blocks for blocks, _ in parts)))
        key = (name, *index)
        tasks[key] = Task(
            key,
            span_chunk,
            List(*(TaskRef((x.name, *block)) for block in blocks)),
            list(itertools.product(*(origins for _, origins in parts))),
            regular_block_slices(grid, index),
            x.dtype,
        )
    inputs: list[Any] = [x]
    graph = HighLevelGraph.from_collections(name, MaterializedLayer(tasks), dependencies=inputs)
    return da.Array(graph, name, chunks=grid, meta=x._meta)


def scans_before(x: da.Array) -> bool:
    """Whether a cumulative step (``cumsum``, ``cumprod``) makes ``x``: a chunk of its spans computed alone is
    scanned from its span's start, so a task per chunk would read each span as many times as it has chunks."""
    return any(
        isinstance(layer, Blockwise) and scan_merge_of(layer.task) is not None for layer in x.dask.layers.values()
    )


def _blocks_along(sizes: tuple[int, ...], lengths: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """For each chunk of ``lengths`` along an axis of blocks of ``sizes``: the blocks it overlaps, and where
    each begins."""
    starts = np.cumsum((0, *sizes))
    found = []
    for start, length in zip(itertools.accumulate((0, *lengths[:-1])), lengths):
        blocks = list(_overlapping(starts, (start, start + length)))
        found.append((blocks, [int(starts[b]) for b in blocks]))
    return found


def _task_of(edges: list[np.ndarray], index: Index) -> Index:
    """The task (its position along each axis) whose box holds the chunk ``index``."""
    return tuple(int(np.searchsorted(e, i, side="right")) - 1 for e, i in zip(edges, index))


def _task_edges(sizes: tuple[int, ...], chunk: int, length: int) -> np.ndarray:
    """Where the tasks along an axis begin, in chunks of ``chunk``, and the chunks' count last: at each
    block edge of ``sizes``, rounded to the nearest chunk."""
    count = max(1, -(-length // chunk))
    edges = {0, count}
    for start in itertools.accumulate(sizes[:-1]):
        edges.add(min(count, round(start / chunk)))
    return np.array(sorted(edges))


def _overlapping(starts: np.ndarray, region: tuple[int, int]) -> range:
    """The blocks (beginning at ``starts``, with the end last) overlapping ``region`` along an axis."""
    first = int(np.searchsorted(starts, region[0], side="right")) - 1
    last = int(np.searchsorted(starts, max(region[0], region[1] - 1), side="right")) - 1
    return range(max(0, first), min(len(starts) - 2, last) + 1)


@streams_spans
def write_span_chunks(
    blocks: list[Any],
    origins: list[Index],
    shape: tuple[int, ...],
    dtype: np.dtype,
    indices: TaskChunks,
    writes: ChunkWrites,
) -> np.ndarray:
    """Write the target chunks ``indices`` of an array of ``shape`` and ``dtype`` from its ``blocks`` (spans,
    or data) that begin at ``origins``, one chunk at a time, each marked done once in place; runs in a task."""
    write = writes.opened()
    for index in indices:
        region = writes.region(index, shape)
        write(index, region, span_chunk(blocks, origins, region, dtype))
    return np.ones(1, dtype=bool)


@streams_spans
@holds_its_output_only
def span_chunk(blocks: list[Any], origins: list[Index], region: tuple[slice, ...], dtype: np.dtype) -> np.ndarray:
    """The part ``region`` of an array from its ``blocks`` (spans, or data) that begin at ``origins``: one
    target chunk, read a piece at a time; runs in a task."""
    found = ((block, origin, _within(region, origin, block.shape)) for block, origin in zip(blocks, origins))
    parts = [(block, origin, within) for block, origin, within in found if all(w.stop > w.start for w in within)]
    if len(parts) == 1:
        # The chunk lies in one block (the chunks tile the blocks they overlap): its part, computed alone.
        block, _, within = parts[0]
        return np.asarray(piece_of(block, within), dtype=dtype)
    data = np.empty(tuple(r.stop - r.start for r in region), dtype=dtype)
    for block, origin, within in parts:
        place = tuple(slice(o + w.start - r.start, o + w.stop - r.start) for o, w, r in zip(origin, within, region))
        data[place] = piece_of(block, within)
    return data


def _within(region: tuple[slice, ...], origin: Index, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The part of ``region`` inside a block of ``shape`` beginning at ``origin``, relative to the block."""
    return tuple(slice(max(r.start, o) - o, min(r.stop, o + n) - o) for r, o, n in zip(region, origin, shape))
