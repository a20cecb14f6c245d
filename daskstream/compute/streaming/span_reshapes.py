"""Reshapes of spans: each piece read as the rows of the reshape it makes, then reshaped.

dask reshapes an array block by block (``x.reshape(n, -1)``, ``x.ravel()``:
each block's ``reshape`` to its own shape), once every block holds whole
rows of the axes it merges. A reshape's axes fall in groups, each a run of
the old axes whose product is a run of the new ones': the old run's first
axis cut into rows of the others, the new run's first axis into rows of the
others. A piece of the old array is a run of its group's rows, so the new rows it falls in are
a piece of the new array: chunks of whole rows (storage chunks of whole rows
of the grid merged, as a field stored by time is) stream one at a time, each
read once. A piece starting or ending mid-row is read with the rest of its
first and last rows, and the old rows around them whole: more is read at its
edges, and held, than the chunk, by at most a row either side, which
:func:`reshaped_piece` adds to the projection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, Layer
from dask.utils import M

from daskstream.compute.streaming.spans import Box, Reads, StepToApply, is_span, read_part, whole

#: One group of a reshape: the old axes and the new axes whose lengths have the same product.
Group = tuple[tuple[int, ...], tuple[int, ...]]


def reshape_groups(old: Sequence[int], new: Sequence[int]) -> list[Group] | None:
    """The groups of axes of a reshape from ``old`` to ``new`` (axes of length one their own groups), or
    ``None`` where the shapes hold different numbers of elements or none."""
    if math.prod(old) != math.prod(new) or math.prod(old) == 0:
        return None
    groups: list[Group] = []
    i = j = 0
    while i < len(old) or j < len(new):
        if i < len(old) and old[i] == 1:
            groups.append(((i,), ()))  # an axis of one dropped
            i += 1
            continue
        if j < len(new) and new[j] == 1:
            groups.append(((), (j,)))  # an axis of one added
            j += 1
            continue
        taken, made, old_length, new_length = [i], [j], old[i], new[j]
        while old_length != new_length:
            if old_length < new_length:
                i += 1
                taken.append(i)
                old_length *= old[i]
            else:
                j += 1
                made.append(j)
                new_length *= new[j]
        groups.append((tuple(taken), tuple(made)))
        i, j = i + 1, j + 1
    return groups


def _row(shape: Sequence[int], axes: tuple[int, ...]) -> int:
    """The elements in one position of ``axes``' first: the product of the others' lengths."""
    return math.prod(shape[a] for a in axes[1:])


def _group_cuts(cuts: Sequence[int], old_row: int, new_row: int) -> tuple[int, ...]:
    """Where pieces begin along a group's first new axis: at the new row each old cut (a position along its
    first old axis) falls in, so that a piece holds the rows its old pieces fill and at most one more."""
    return tuple(sorted({c * old_row // new_row for c in cuts}))


class Reshaped(StepToApply):
    """A part ``box`` of a span reshaped to ``full`` (``inner.reshape(full)[box]``), still to read: each piece
    read as the old rows it lies in, then reshaped."""

    __slots__ = ("box", "full", "groups", "inner", "shape")

    def __init__(self, inner: Any, full: tuple[int, ...], groups: list[Group], box: Box | None = None) -> None:
        self.inner, self.full, self.groups = inner, full, groups
        self.box = box or tuple(slice(0, n) for n in full)
        self.shape = tuple(b.stop - b.start for b in self.box)

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        inner_cuts, old = self.inner.cuts(), self.inner.shape
        found: list[tuple[int, ...]] = [(0, n) for n in self.full]
        for taken, made in self.groups:
            if taken and made:
                found[made[0]] = _group_cuts(inner_cuts[taken[0]], _row(old, taken), _row(self.full, made))
        return tuple(
            (0, *sorted({c - b.start for c in cuts if b.start < c < b.stop}), b.stop - b.start)
            for cuts, b in zip(found, self.box, strict=True)
        )

    def narrowed(self, box: Box) -> Reshaped:
        composed = tuple(slice(b.start + s.start, b.start + s.stop) for b, s in zip(self.box, box, strict=True))
        return Reshaped(self.inner, self.full, self.groups, composed)

    def value(self, box: Box, read: Reads) -> Any:
        wanted = self.narrowed(box).box
        old = self.inner.shape
        region: list[slice] = [slice(0, n) for n in old]
        flat: list[slice] = []  # each group's wanted rows, along its axes flattened
        rows: list[int] = []  # each group's new shape, its first axis the rows wanted
        for taken, made in self.groups:
            new_row = _row(self.full, made) if made else 1
            first, last = (wanted[made[0]].start, wanted[made[0]].stop) if made else (0, 1)
            if taken:
                old_row = _row(old, taken)
                start = first * new_row // old_row
                region[taken[0]] = slice(start, max(start, -(-last * new_row // old_row)))
                offset = start * old_row
            else:
                offset = 0
            flat.append(slice(first * new_row - offset, last * new_row - offset))
            rows.extend([last - first, *(self.full[a] for a in made[1:])] if made else [])
        data = read_part(self.inner, tuple(region), read)
        data = data.reshape([math.prod(data.shape[a] for a in taken) for taken, _ in self.groups])
        firsts = {made[0] for _, made in self.groups if made}  # their rows already cut to those wanted
        within = tuple(slice(None) if i in firsts else cell for i, cell in enumerate(wanted))
        return data[tuple(flat)].reshape(rows)[within]


def span_reshape(value: Any, shape: tuple[int, ...]) -> Any:
    """A reshape: of a span, the span reshaped (:class:`Reshaped`); of data, the data's reshape."""
    if not is_span(value):
        return value.reshape(shape)
    groups = reshape_groups(value.shape, shape)
    if groups is None:
        return whole(value).reshape(shape)  # none of it: nothing to stream
    return Reshaped(value, tuple(shape), groups)


def span_reshape_whole(value: Any, shape: tuple[int, ...]) -> Any:
    """:func:`span_reshape` whose block is taken whole by the step after."""
    return whole(span_reshape(value, shape))


def reshaped_piece(
    old: Sequence[int], new: Sequence[int], piece: Sequence[int], *, at_most: bool = False
) -> tuple[int, ...] | None:
    """A piece of a block of shape ``old`` (pieces of ``piece``) reshaped to ``new``: the new rows a piece of the
    first old axis of each group fills; ``at_most``, the most a piece holds wherever the pieces start -- a row
    more where one starts mid-row, and the old rows read whole at either end."""
    groups = reshape_groups(old, new)
    if groups is None:
        return None
    found = list(new)
    for taken, made in groups:
        if taken and made:
            old_row, new_row = _row(old, taken), _row(new, made)
            rows = -(-min(piece[taken[0]], old[taken[0]]) * old_row // new_row)
            edges = 1 + -(-2 * old_row // new_row) if at_most else 0
            found[made[0]] = min(new[made[0]], rows + edges)
    return tuple(found)


def is_reshaping(value: Any) -> bool:
    """True for dask's task reshaping one block to a shape of its own (``M.reshape``)."""
    return (
        isinstance(value, Task)
        and value.func is M.reshape
        and len(value.args) == 2
        and isinstance(value.args[0], TaskRef)
        and isinstance(value.args[1], tuple)
        and all(isinstance(n, (int, np.integer)) for n in value.args[1])
    )


def reshaped_layer_piece(
    graph: HighLevelGraph, layer: Layer, piece: tuple[int, ...], *, at_most: bool = False
) -> tuple[int, ...] | None:
    """``piece`` (of the blocks a layer of :func:`is_reshaping` tasks takes) through the reshape, of its first
    block (:func:`reshaped_piece`)."""
    task = next(iter(layer.values()))
    block, shape = task.args[0].key, task.args[1]
    chunks = (graph.layers[block[0]].collection_annotations or {}).get("chunks")
    if chunks is None:
        return None
    old = tuple(lengths[i] for lengths, i in zip(chunks, block[1:], strict=True))
    return reshaped_piece(old, shape, piece, at_most=at_most)
