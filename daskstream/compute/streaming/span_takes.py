"""Indexes of spans with an array of positions (``x[[5, 17, 3]]``, ``x[:, mask]``): each piece gathered from
the pieces of the span its rows lie in, one at a time.

dask indexes an array with an array of positions along one axis by its
shuffle: a task per input block picks that block's positions
(``_getitem``), and a task per output block concatenates those picks and
puts them in the order asked (``concatenate_arrays``). Over spans, a pick
is a :class:`Taken` span, the concatenation a :class:`Concatenated` one
taken in the order asked: nothing is read until a step reads a piece.

A piece of a taken span reads, for each piece of the span before it that
its rows lie in, the rows between the first and the last it takes there,
one such region at a time, and gathers them: it holds its own rows and one
region read. Its pieces are runs of as many positions as the longest piece
of the span before has rows, wherever they lie: positions in order read
each region about once, and positions in no order read each piece of the
span before at most once per piece taken (not once per position).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from dask._task_spec import DataNode, Task
from dask.array._shuffle import _getitem, concatenate_arrays
from dask.highlevelgraph import Layer, MaterializedLayer
from dask.typing import Key

from daskstream.compute.streaming.span_steps import materialized_like
from daskstream.compute.streaming.spans import Box, Reads, StepToApply, is_span, piece_of, read_part, whole


class Taken(StepToApply):
    """``np.take(inner, positions, axis)`` of a span ``inner``: the rows of each piece gathered from the pieces
    of ``inner`` they lie in."""

    __slots__ = ("_cuts", "axis", "inner", "positions", "shape")

    def __init__(self, inner: Any, axis: int, positions: Sequence[int] | np.ndarray) -> None:
        self.inner, self.axis = inner, axis
        self.positions = np.asarray(positions, dtype=np.intp).reshape(-1)
        self.shape = (*inner.shape[:axis], len(self.positions), *inner.shape[axis + 1 :])
        self._cuts: tuple[tuple[int, ...], ...] | None = None

    def _inner_pieces(self, rows: np.ndarray) -> np.ndarray:
        """Which piece of ``inner`` along the axis each of ``rows`` (positions in ``inner``) lies in."""
        return np.searchsorted(np.asarray(self.inner.cuts()[self.axis]), rows, side="right") - 1

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        """``inner``'s along the other axes; along the axis, runs of as many positions as ``inner``'s longest
        piece has rows, wherever they lie."""
        if self._cuts is None:
            found = list(self.inner.cuts())
            longest = max(1, int(np.diff(found[self.axis]).max(initial=1)))
            found[self.axis] = (*range(0, len(self.positions), longest), len(self.positions))
            self._cuts = tuple(tuple(int(c) for c in axis) for axis in found)
        return self._cuts

    def _region(self, box: Box, rows: np.ndarray) -> Box:
        """The region of ``inner`` from the first to the last of ``rows`` along the axis, ``box`` along the others."""
        first, last = (int(rows.min()), int(rows.max()) + 1) if len(rows) else (0, 0)
        return (*box[: self.axis], slice(first, last), *box[self.axis + 1 :])

    def narrowed(self, box: Box) -> Taken:
        rows = self.positions[box[self.axis]]
        region = self._region(box, rows)
        return Taken(self.inner.narrowed(region), self.axis, rows - region[self.axis].start)

    def value(self, box: Box, read: Reads) -> Any:
        rows = self.positions[box[self.axis]]
        pieces = self._inner_pieces(rows)
        distinct = np.unique(pieces)
        if len(distinct) <= 1:
            return self._gathered(box, rows, read)
        # Rows from several pieces: each piece's region read, gathered and let go before the next is read.
        gathered = None
        for piece in distinct:
            where = np.flatnonzero(pieces == piece)
            part = self._gathered(box, rows[where], read.apart())
            if gathered is None:
                gathered = np.empty(tuple(b.stop - b.start for b in box), dtype=part.dtype)
            gathered[(slice(None),) * self.axis + (where,)] = part
        return gathered

    def _gathered(self, box: Box, rows: np.ndarray, read: Reads) -> Any:
        region = self._region(box, rows)
        return np.take(read_part(self.inner, region, read), rows - region[self.axis].start, axis=self.axis)

    def __repr__(self) -> str:
        return f"<Taken {self.shape}>"


class Concatenated(StepToApply):
    """``np.concatenate(parts, axis)`` of spans (or blocks of data among them): each piece within one part."""

    __slots__ = ("_cuts", "axis", "parts", "shape", "starts")

    def __init__(self, parts: Sequence[Any], axis: int) -> None:
        self.parts, self.axis = tuple(parts), axis
        self._cuts: tuple[tuple[int, ...], ...] | None = None
        lengths = [part.shape[axis] for part in self.parts]
        self.starts = tuple(int(s) for s in np.cumsum((0, *lengths)))
        first = self.parts[0].shape
        self.shape = (*first[:axis], self.starts[-1], *first[axis + 1 :])

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        """Its parts' cuts, each part's along the axis where the part begins; found once (a taken span asks
        for them for every piece it reads)."""
        if self._cuts is None:
            found: list[set[int]] = [set() for _ in self.shape]
            for part, start in zip(self.parts, self.starts):
                cuts = part.cuts() if is_span(part) else tuple((0, n) for n in part.shape)
                for axis, along in enumerate(cuts):
                    found[axis].update(c + start if axis == self.axis else c for c in along)
            self._cuts = tuple(tuple(sorted(axis)) for axis in found)
        return self._cuts

    def _overlapping(self, box: Box) -> list[tuple[Any, Box]]:
        """The parts ``box`` overlaps, each with its region in the part (one part, for a box empty along the
        axis: an empty part of it)."""
        cell = box[self.axis]
        spans = list(zip(self.parts, self.starts, self.starts[1:]))
        if cell.stop <= cell.start:
            part, start, _ = next((s for s in spans if s[1] <= cell.start < s[2]), spans[-1])
            spans, cell = [(part, start, start)], slice(start, start)
        found = []
        for part, start, stop in spans:
            first, last = max(cell.start, start), min(cell.stop, stop)
            if first < last or stop == start:
                found.append((part, (*box[: self.axis], slice(first - start, last - start), *box[self.axis + 1 :])))
        return found

    def narrowed(self, box: Box) -> Any:
        parts = [part.narrowed(region) if is_span(part) else part[region] for part, region in self._overlapping(box)]
        return parts[0] if len(parts) == 1 else Concatenated(parts, self.axis)

    def value(self, box: Box, read: Reads) -> Any:
        pieces = [piece_of(part, region, read) for part, region in self._overlapping(box)]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=self.axis)

    def __repr__(self) -> str:
        return f"<Concatenated {self.shape}>"


def taken(inner: Any, axis: int, positions: np.ndarray) -> Taken:
    """``np.take(inner, positions, axis)`` of a span: of a span taken along the same axis, its positions taken."""
    if isinstance(inner, Taken) and inner.axis == axis:
        return Taken(inner.inner, axis, inner.positions[positions])
    return Taken(inner, axis, positions)


# Run-time steps of the rewritten graph, in place of dask's shuffle's.


def span_take(value: Any, taker: tuple[int, tuple[Any, ...]]) -> Any:
    """dask's pick of a block's positions (``taker``: ``(1, index)``, one array in ``index``, whole slices
    elsewhere): of a span, a :class:`Taken` one; of data, the data's."""
    if not is_span(value):
        return _getitem(value, taker)
    index = taker[1]
    axis = next(i for i, item in enumerate(index) if isinstance(item, np.ndarray))
    return taken(value, axis, index[axis])


def span_take_whole(value: Any, taker: tuple[int, tuple[Any, ...]]) -> Any:
    """:func:`span_take` whose block is taken whole by the step after."""
    return whole(span_take(value, taker))


def span_gather(parts: list[Any], sorter: tuple[int, np.ndarray], axis: int) -> Any:
    """dask's concatenation of the picks of an output block, put in the order asked (``sorter``: ``(1, order)``,
    the order that sorts it): of spans, a :class:`Taken` span of their :class:`Concatenated` one; of data, the
    data's."""
    if not any(is_span(part) for part in parts):
        return concatenate_arrays(parts, sorter, axis)
    order = np.argsort(sorter[1])
    if all(isinstance(part, Taken) and part.axis == axis for part in parts):
        # Picks of spans: the positions asked, in the spans they were picked from, concatenated.
        inners = [part.inner for part in parts]
        offsets = np.cumsum([0, *(inner.shape[axis] for inner in inners[:-1])])
        positions = np.concatenate([part.positions + offset for part, offset in zip(parts, offsets)])
        return Taken(Concatenated(inners, axis), axis, positions[order])
    return Taken(Concatenated(parts, axis), axis, order)


def span_gather_whole(parts: list[Any], sorter: tuple[int, np.ndarray], axis: int) -> Any:
    """:func:`span_gather` whose block is taken whole by the step after."""
    return whole(span_gather(parts, sorter, axis))


def streaming_take_layer(layer: Layer, name: str, *, taken_whole: bool) -> MaterializedLayer:
    """The layer ``name`` of dask's shuffle (:func:`is_take_layer`) streaming spans: its picks and their
    concatenations give spans, its blocks (keys of ``name``) given whole where the step after takes them so
    (``taken_whole``)."""
    tasks: dict[Key, Any] = {}
    for key, value in layer.items():
        if not _is_taking(value):
            tasks[key] = value  # the positions and orders the tasks take
            continue
        block = taken_whole and isinstance(key, tuple) and key[0] == name
        func: Any
        if value.func is _getitem:
            func = span_take_whole if block else span_take
        else:
            func = span_gather_whole if block else span_gather
        tasks[key] = Task(key, func, *value.args, **value.kwargs)
    return materialized_like(layer, tasks)


def pieces_read(layer: Layer, name: str, chunks: Sequence[Sequence[int]], piece: Sequence[int]) -> float:
    """How many times the blocks of a take layer ``name`` (:func:`is_take_layer`), read as :class:`Taken` reads
    them, read their input along the axis taken: about 1 for positions in order, more for positions in no
    order (a piece of the input once per piece taken that has rows in it), less where they leave rows out.
    The input is in blocks of ``chunks``, cut in pieces of ``piece``."""
    nodes = dict(layer.items())
    picks = [value for value in nodes.values() if isinstance(value, Task) and value.func is _getitem]
    if not picks:
        return 1.0
    axis = _taken_axis(nodes[picks[0].args[1].key].value[1])
    starts = np.cumsum((0, *chunks[axis]))
    step = max(1, int(piece[axis]))
    cuts = np.concatenate([np.arange(start, start + n, step) for start, n in zip(starts, chunks[axis])])
    read, done = 0, set()
    for key, value in nodes.items():
        # Once per block along the taken axis: its blocks along the others take the same rows.
        if not (isinstance(key, tuple) and key[0] == name and _is_taking(value)) or key[1 + axis] in done:
            continue
        done.add(key[1 + axis])
        rows = _output_rows(nodes, value, axis, starts)
        # As a taken span reads: runs of as many positions as its input's longest piece has rows (its pieces),
        # each reading, in each piece of the input it has rows in, the rows from its first there to its last.
        region = (np.arange(len(rows)) // step) * len(cuts) + np.searchsorted(cuts, rows, side="right") - 1
        order = np.argsort(region, kind="stable")
        region, rows = region[order], rows[order]
        firsts = np.flatnonzero(np.diff(region, prepend=-1))
        if len(firsts):
            read += int((np.maximum.reduceat(rows, firsts) - np.minimum.reduceat(rows, firsts) + 1).sum())
    return read / max(1, int(starts[-1]))


def _taken_axis(index: Any) -> int:
    """The axis of the one array in a taker's index (a bare array: the first)."""
    items = index if isinstance(index, tuple) else (index,)
    return next(i for i, item in enumerate(items) if isinstance(item, np.ndarray))


def _output_rows(nodes: dict[Key, Any], value: Task, axis: int, starts: np.ndarray) -> np.ndarray:
    """The rows an output block of dask's shuffle gives, as positions along ``axis`` of its input (whose blocks
    begin at ``starts``), in its order."""
    if value.func is _getitem:
        picks, order = [value], None
    else:  # concatenate_arrays(picks, sorter, axis): the picks concatenated, then put in order
        picks, order = [nodes[ref.key] for ref in value.args[0].args], np.argsort(nodes[value.args[1].key].value[1])
    rows = []
    for pick in picks:
        block, index = pick.args[0].key[1 + axis], nodes[pick.args[1].key].value[1]
        items = index if isinstance(index, tuple) else (index,)
        rows.append(starts[block] + np.asarray(items[axis], dtype=np.intp))
    joined = np.concatenate(rows) if rows else np.zeros(0, dtype=np.intp)
    return joined if order is None else joined[order]


def is_take_layer(values: Sequence[Any]) -> bool:
    """Whether ``values``, a layer's, are dask's shuffle's: picks of positions of blocks, concatenations of
    picks, and the positions (one array, whole slices elsewhere: no new axis) and orders they take."""
    return any(_is_taking(v) for v in values) and all(
        _is_taking(v) or (isinstance(v, DataNode) and _is_positions_or_order(v.value)) for v in values
    )


def _is_positions_or_order(value: Any) -> bool:
    """A taker's ``(1, index)`` of one array and whole slices, or a sorter's ``(1, order)``."""
    if not (isinstance(value, tuple) and len(value) == 2):
        return False
    index = value[1]
    if isinstance(index, np.ndarray):
        return True
    arrays = [item for item in index if isinstance(item, np.ndarray)] if isinstance(index, tuple) else []
    whole = [item for item in index if isinstance(item, slice) and item == slice(None)] if arrays else []
    return len(arrays) == 1 and len(arrays) + len(whole) == len(index)


def _is_taking(value: Any) -> bool:
    func = getattr(value, "func", None)
    return isinstance(value, Task) and (func is _getitem or func is concatenate_arrays)
