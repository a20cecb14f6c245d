"""Spans streamed: each task of a spanned array reads its span chunk by chunk into the steps that take it.

(Longer than most modules: the kinds of span still to compute -- read, mapped,
indexed, transposed -- and the run-time steps that read them piece by piece
and fold the pieces' partials are one design, read together.)

An array planned in spans (:mod:`daskstream.planning.spans`) has blocks of
many chunks, too large for a task to hold. Its read tasks give a
:class:`SpanRead` -- what to read, not the data; a kernel's tasks over such
an array, or over blocks outnumbering what a graph may hold, give one of its
blocks with their halos (:func:`~daskstream.graph.regions.region_array`) -- and :func:`~daskstream.compute.streaming.span_graphs.span_graphs`
rewrites, before dask's own optimizations, the steps that take such blocks:

- an **element-wise step** (numpy ufuncs, arithmetic and comparison
  operators, ``where``, ``astype``, ``clip``, ``round``...) gives a
  :class:`Mapped` value, the step still to apply piece by piece; a block
  passed on as it is (dask's ``concatenate``, ``stack``) stays the span it is;
- a **cumulative sum or product** along an axis (and their nan- forms)
  gives a :class:`~daskstream.compute.streaming.span_scans.Scanned` span, each piece scanned and merged with the
  carry of the pieces before it; the carry past a span (what dask adds to
  the next block) is the span scanned to its end, so each span is read
  once more for it;
- a **slice** (``x[a:b, ...]``) gives a narrower span, and an index with
  integers, steps or new axes (``x[:, 3]``, ``x[::-2]``, ``x[:, None]``) an
  :class:`Indexed` one, each piece read then indexed, and an index with an
  array of positions along one axis (``x[[5, 17, 3]]``) a
  :class:`~daskstream.compute.streaming.span_takes.Taken` one, each piece
  gathered from the chunks its rows lie in; a **rechunk** joins parts of spans
  (:mod:`~daskstream.compute.streaming.span_rechunks`); a **transpose** (``np.transpose``,
  ``np.swapaxes``) a :class:`Transposed` one; a **reshape** (``x.reshape``,
  ``x.ravel``) a :class:`~daskstream.compute.streaming.span_reshapes.Reshaped`
  one, each piece read as whole rows, then reshaped;
- a **reduction's first step** (sums, products, means, extremes, moments:
  what var and std combine, any, all, and their nan- forms) reads the span
  one chunk at a time, applies the element-wise steps before it and its own
  to that chunk alone, and combines the partials as it goes with the
  reduction's own combine, so a task holds one chunk's work and the partials
  of the axes it keeps, whatever its span;
- an **arg-reduction's first step** (argmin, argmax and their nan- forms)
  finds each piece's extreme and its index where the piece lies in the
  array, and keeps the first extreme as pieces come, as dask's combine does;
- a **counting step** (a function marked
  :func:`~daskstream.compute.streaming.span_steps.counts_each_value`:
  ``ds.reduce``'s histograms and the counting passes of its exact medians
  and quantiles) counts each chunk's values as it is read and sums the rows;
- a **step reading spans itself** (a function marked
  :func:`~daskstream.compute.streaming.span_steps.streams_spans`: a store's
  task writing its span chunk by chunk, ``describe``'s statistics) is given
  the spans as they are, and reads one part at a time (:func:`piece_of`,
  :func:`fold_pieces`).

A span holds no data: every step that takes one reads its chunks itself, so
a source whose spans two steps take is read twice (the plan counts it) --
except reductions computed together, whose first steps read each piece once
for all of them (:func:`span_reductions`).

Any other step taking a span's blocks (dask's ``map_blocks``, a rechunk by
p2p, ``vindex``, the result of ``compute``) gets its blocks whole where they fit a task's share
of the budget (a small slice), and is refused before anything is read where
they do not, naming the step. The lists of what is known to stream are
:mod:`daskstream.compute.streaming.span_steps`: a step not on them is never
applied piece by piece.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array.reductions as dask_reductions
import numpy as np
from dask._task_spec import Task
from dask.blockwise import blockwise_token

from daskstream.compute.streaming.span_folds import Fold
from daskstream.compute.streaming.span_steps import concatenated
from daskstream.graph.reads import SpanRead
from daskstream.runtime.stopping import raise_if_stopped
from daskstream.sources.checked_once import CheckedOnce

Box = tuple[slice, ...]


@dataclass(frozen=True)
class Step:
    """A blockwise step's task, applied to its inputs' values: ``axes`` maps each input's axes to the output's."""

    task: Task
    axes: tuple[tuple[int | None, ...] | None, ...]

    def __call__(self, values: Sequence[Any]) -> Any:
        return self.task({blockwise_token(i): value for i, value in enumerate(values)})

    def parts(self, values: Sequence[Any], box: Box, shape: tuple[int, ...], read: Reads) -> list[Any]:
        """Each input's part in the output's ``box``: pieces of spans, slices of blocks as large as the output."""
        return [_part(value, axes, box, shape, read) for value, axes in zip(values, self.axes)]


class StepToApply:
    """A span with a step still to apply to it, piece by piece: ``shape``, ``cuts()`` (where its pieces begin
    along each axis), ``narrowed(box)`` (a part of it, still a span) and ``value(box, read)`` (a part's data)."""

    __slots__ = ()
    shape: tuple[int, ...]

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        raise NotImplementedError

    def narrowed(self, box: Box) -> Any:
        raise NotImplementedError

    def value(self, box: Box, read: Reads) -> Any:
        raise NotImplementedError


class Mapped(StepToApply):
    """An element-wise step still to apply to spans, piece by piece."""

    __slots__ = ("inputs", "shape", "step")

    def __init__(self, step: Step, inputs: Sequence[Any], shape: tuple[int, ...]) -> None:
        self.step, self.inputs, self.shape = step, tuple(inputs), shape

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        return _cuts([v for v in self.inputs if is_span(v)])

    def value(self, box: Box, read: Reads) -> Any:
        return self.step(self.step.parts(self.inputs, box, self.shape, read))

    def narrowed(self, index: Box) -> Mapped:
        inputs = [_part(v, axes, index, self.shape) for v, axes in zip(self.inputs, self.step.axes)]
        return Mapped(self.step, inputs, tuple(s.stop - s.start for s in index))

    def __repr__(self) -> str:
        return f"<Mapped {self.shape}>"


class Indexed(StepToApply):
    """A span indexed with integers, slices with steps (reversing ones too) and new axes: the index still to apply
    to each piece once read.

    ``index`` has one entry per axis of ``inner`` -- an integer (the axis is
    dropped) or ``(start, stop, step)`` within it, ``step`` not 0 -- and a
    ``None`` where a new axis of length one comes.
    """

    __slots__ = ("index", "inner", "shape")

    def __init__(self, inner: Any, index: Sequence[int | tuple[int, int, int] | None], shape: tuple[int, ...]) -> None:
        self.inner, self.index, self.shape = inner, tuple(index), shape

    @classmethod
    def of(cls, inner: Any, index: tuple[Any, ...]) -> Indexed:
        """``inner[index]`` (integers, slices and ``None``)."""
        entries: list[int | tuple[int, int, int] | None] = []
        shape: list[int] = []
        taken = sum(item is not None for item in index)
        lengths = iter(inner.shape)
        for item in tuple(index) + (slice(None),) * (len(inner.shape) - taken):
            if item is None:
                entries.append(None)
                shape.append(1)
                continue
            n = next(lengths)
            if isinstance(item, slice):
                start, stop, step = item.indices(n)
                entries.append((start, stop, step))
                shape.append(len(range(start, stop, step)))
            else:
                position = operator.index(item)
                entries.append(position + n if position < 0 else position)
        return cls(inner, entries, tuple(shape))

    def _inner_box(self, box: Box) -> tuple[Box, tuple[Any, ...]]:
        """The region of ``inner`` that ``box`` (of this span) reads, and the index to apply to it once read."""
        region: list[slice] = []
        after: list[Any] = []
        boxes = iter(box)
        for entry in self.index:
            if entry is None:
                next(boxes)  # the new axis: its one position is the whole of it
                after.append(None)
                continue
            if isinstance(entry, int):
                region.append(slice(entry, entry + 1))
                after.append(0)
                continue
            start, _, step = entry
            cell = next(boxes)
            first, last = start + cell.start * step, start + (cell.stop - 1) * step
            if cell.stop <= cell.start:
                region.append(slice(first, first))
            else:  # a reversing step reads from its last position up, then reverses
                region.append(slice(min(first, last), max(first, last) + 1))
            after.append(slice(None, None, step))
        return tuple(region), tuple(after)

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        """Where pieces begin along each axis kept, each piece within one piece of ``inner``."""
        found: list[tuple[int, ...]] = []
        inner_cuts = iter(self.inner.cuts())
        for entry in self.index:
            if entry is None:
                found.append((0, self.shape[len(found)]))  # of one, or none in an empty part
                continue
            cuts = next(inner_cuts)
            if isinstance(entry, int):
                continue
            start, _, step = entry
            length = self.shape[len(found)]
            # The first position at or after each of inner's cuts (before it, with a reversing step).
            firsts = (-(-(c - start) // step) for c in cuts) if step > 0 else ((start - c) // -step + 1 for c in cuts)
            found.append((0, *sorted({p for p in firsts if 0 < p < length}), length))
        return tuple(found)

    def narrowed(self, box: Box) -> Indexed:
        region, after = self._inner_box(box)
        regions = iter(region)
        index: list[int | tuple[int, int, int] | None] = []
        for item in after:
            if item is None or isinstance(item, int):
                if isinstance(item, int):
                    next(regions)
                index.append(item)
                continue
            n = (r := next(regions)).stop - r.start
            index.append((0, n, item.step) if item.step > 0 else (n - 1, -1, item.step))
        return Indexed(self.inner.narrowed(region), index, tuple(b.stop - b.start for b in box))

    def value(self, box: Box, read: Reads) -> Any:
        region, after = self._inner_box(box)
        data = _part(self.inner, None, region, self.inner.shape, read)[after]
        # A new axis gives one position: none where the box is empty along it.
        return data[tuple(slice(0, b.stop - b.start) for b in box)]

    def __repr__(self) -> str:
        return f"<Indexed {self.shape}>"


class Transposed(StepToApply):
    """A span with its axes permuted (``np.transpose(inner, axes)``): each piece read, then transposed."""

    __slots__ = ("axes", "inner", "shape")

    def __init__(self, inner: Any, axes: Sequence[int]) -> None:
        self.inner, self.axes = inner, tuple(axes)
        self.shape = tuple(inner.shape[axis] for axis in self.axes)

    def _inner_box(self, box: Box) -> Box:
        region = [slice(0, 0)] * len(self.axes)
        for cell, axis in zip(box, self.axes, strict=True):
            region[axis] = cell
        return tuple(region)

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        inner = self.inner.cuts()
        return tuple(inner[axis] for axis in self.axes)

    def narrowed(self, box: Box) -> Transposed:
        return Transposed(self.inner.narrowed(self._inner_box(box)), self.axes)

    def value(self, box: Box, read: Reads) -> Any:
        return np.transpose(_part(self.inner, None, self._inner_box(box), self.inner.shape, read), self.axes)

    def __repr__(self) -> str:
        return f"<Transposed {self.shape}>"


def is_span(value: Any) -> bool:
    """Whether ``value`` is a span (a region not read yet, or a step still to apply to one), not data."""
    return isinstance(value, (SpanRead, StepToApply))


class Reads:
    """The source regions one piece's evaluation has read: each read once, however many steps take it."""

    def __init__(self, sources: CheckedOnce | None = None) -> None:
        self._read: dict[tuple[int, tuple[tuple[int, int], ...]], Any] = {}
        # A task's sources, checked unchanged once for all its pieces (each piece's Reads shares them).
        self._sources = CheckedOnce() if sources is None else sources

    def __call__(self, span: SpanRead, box: Box) -> Any:
        region = span.narrowed(box).region
        key = (id(span.source), tuple((s.start, s.stop) for s in region))
        if key not in self._read:
            self._read[key] = self._sources.read(span.source, region)
        return self._read[key]

    def apart(self) -> Reads:
        """Reads of their own (let go with them), their sources checked with these."""
        return Reads(self._sources)

    def check(self) -> None:
        """Check the sources read once more, after the last piece (:class:`CheckedOnce`)."""
        self._sources.check()


def _part(
    value: Any, axes: tuple[int | None, ...] | None, box: Box, shape: tuple[int, ...], read: Reads | None = None
) -> Any:
    """``value``'s part in ``box`` of an output of ``shape``: with ``read``, a span's piece, else a narrower span;
    a block's slice along the axes it spans whole; anything else as it is (constants, blocks broadcast along an
    axis)."""
    if is_span(value) and axes is not None and set(axes) == set(range(len(box))) and len(axes) == len(box):
        box = tuple(box[axis] for axis in axes if axis is not None)  # a span whose axes the step permutes
    if isinstance(value, SpanRead):
        return value.narrowed(box) if read is None else read(value, box)
    if isinstance(value, StepToApply):
        return value.narrowed(box) if read is None else value.value(box, read)
    if axes is None or not hasattr(value, "shape") or len(getattr(value, "shape", ())) != len(axes):
        return value
    index = tuple(
        box[axis] if axis is not None and length == shape[axis] else slice(None)
        for length, axis in zip(value.shape, axes)
    )
    return value[index]


def _cuts(spans: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    """Where pieces begin along each axis so that each lies within one piece of every span."""
    found = [span.cuts() for span in spans]
    return tuple(tuple(sorted(set().union(*axis))) for axis in zip(*found))


def _boxes(cuts: tuple[tuple[int, ...], ...]) -> Iterator[tuple[tuple[int, ...], Box]]:
    """Each piece's position and box, in C order."""
    ranges = [[(i, slice(a, b)) for i, (a, b) in enumerate(itertools.pairwise(axis))] for axis in cuts]
    for cells in itertools.product(*ranges):
        yield tuple(i for i, _ in cells), tuple(s for _, s in cells)


# Run-time steps of the rewritten graph.


def read_part(value: Any, box: Box, read: Reads) -> Any:
    """The data of the span ``value`` in ``box`` (unit-step slices relative to it), its reads shared through
    ``read``."""
    return _part(value, None, box, value.shape, read)


def whole(value: Any) -> Any:
    """A span's data at once (a block that fits the task's share), anything else as it is."""
    if not is_span(value):
        return value
    return _checked_part(value, tuple(slice(0, n) for n in value.shape))


def piece_of(value: Any, box: Box, read: Reads | None = None) -> Any:
    """The data of ``value`` in ``box`` (unit-step slices relative to it): of a span, that part alone read and
    computed (its reads shared through ``read``); of data, its slice."""
    if not is_span(value):
        return value[box]
    return _checked_part(value, box) if read is None else _part(value, None, box, value.shape, read)


def _checked_part(value: Any, box: Box) -> Any:
    """A span's part read with reads of its own, its sources checked once more after its last piece."""
    read = Reads()
    part = _part(value, None, box, value.shape, read)
    read.check()
    return part


def read_whole(read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A span read (``read(*args, **kwargs)``: a source's or a kernel's) whose block a step takes whole (it fits
    the task's share): the data at once."""
    return whole(read(*args, **kwargs))


def span_map(step: Step, *values: Any) -> Any:
    """An element-wise step: its result where no input is a span, else the step to apply piece by piece."""
    spans = [v for v in values if is_span(v)]
    return step(values) if not spans else Mapped(step, values, spans[0].shape)


def span_map_whole(step: Step, *values: Any) -> Any:
    """:func:`span_map` whose block is taken whole by the step after."""
    return whole(span_map(step, *values))


def span_narrow(value: Any, index: tuple[Any, ...]) -> Any:
    """A slice: of a span, a narrower span (or, with integers or steps, an indexed one); of data, the data's
    slice."""
    if not is_span(value):
        return value[index]
    if all(isinstance(item, slice) and item.step in (None, 1) for item in index):
        return value.narrowed(_unit_slices(index, value.shape))
    return Indexed.of(value, index)


def span_transpose(value: Any, axes: tuple[int, ...]) -> Any:
    """A transpose: of a span, the span with its axes permuted; of data, the data's transpose."""
    return Transposed(value, axes) if is_span(value) else np.transpose(value, axes)


def span_transpose_whole(value: Any, axes: tuple[int, ...]) -> Any:
    """:func:`span_transpose` whose block is taken whole by the step after."""
    return whole(span_transpose(value, axes))


def span_narrow_whole(value: Any, index: tuple[slice, ...]) -> Any:
    """:func:`span_narrow` whose block is taken whole by the step after."""
    return whole(span_narrow(value, index))


def _unit_slices(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    full = tuple(index) + (slice(None),) * (len(shape) - len(index))
    bounds = (s.indices(n)[:2] for s, n in zip(full, shape))
    return tuple(slice(start, max(start, stop)) for start, stop in bounds)  # an empty slice stays empty


@dataclass(frozen=True)
class Combine:
    """How a reduction's partials combine: ``func`` over a list nested one level per reduced axis."""

    func: Callable[..., Any]
    reduced: tuple[int, ...]
    ndim: int
    #: How the combined partials at the kept positions join into the block's partial (``join(partials by
    #: position, kept axes)``), where not as arrays (or dicts of arrays) are joined.
    join: Callable[[Mapping[tuple[int, ...], Any], list[int]], Any] | None = None

    def __call__(self, partials: list[Any]) -> Any:
        # One level per reduced axis: the partials along the first, each alone along the others.
        nested = [functools.reduce(lambda inner, _: [inner], range(len(self.reduced) - 1), p) for p in partials]
        return self.func(nested)


def span_reduce(step: Step, combine: Combine, *values: Any) -> Any:
    """A reduction's first step: over a span, read piece by piece, each piece's partial combined as it comes."""
    # Each span's axes in the step's output order (an einsum may order them otherwise): its pieces cut so.
    spans = [_in_order(v, axes) for v, axes in zip(values, step.axes) if is_span(v)]
    if not spans or 0 in spans[0].shape:  # an empty slice: nothing to read, its partial as numpy gives it
        return step([whole(v) for v in values])
    shape = spans[0].shape
    return _folded(spans, combine.reduced, combine, lambda box, read: step(step.parts(values, box, shape, read)))


def _in_order(span: Any, axes: tuple[int | None, ...] | None) -> Any:
    """``span`` with its axes in the output's order, where a step puts them there (``axes``: the output's
    axis of each of its own)."""
    if axes is None or list(axes) == list(range(len(axes))) or None in axes:
        return span
    return Transposed(span, [axes.index(axis) for axis in range(len(axes))])


def span_arg(chunk: functools.partial[Any], value: Any, axis: tuple[int, ...], offset_info: Any) -> Any:
    """An arg-reduction's first step (dask's ``arg_chunk``: argmin, argmax and their nan- forms): over a span,
    each piece's values and indices found where the piece lies in the array, combined as they come."""
    if not is_span(value) or 0 in value.shape:
        return chunk(whole(value), axis, offset_info)
    argfunc = chunk.args[1]  # functools.partial(arg_chunk, func, argfunc)
    combine = Combine(
        concatenated(functools.partial(dask_reductions.arg_combine, argfunc, axis=axis, keepdims=True), axis),
        axis,
        len(value.shape),
    )
    # dask gives an index into the whole array raveled where all its axes are reduced (and for one axis).
    ravelled = len(axis) == len(value.shape)

    def partial_of(box: Box, read: Reads) -> Any:
        if ravelled:  # the piece's corner within the whole array
            offset, total_shape = offset_info
            at = (tuple(o + b.start for o, b in zip(offset, box)), total_shape)
        else:
            at = offset_info + box[axis[0]].start
        return chunk(piece_of(value, box, read), axis, at)

    return _folded([value], axis, combine, partial_of)


def fold_pieces(
    value: Any, reduced: tuple[int, ...], of_piece: Callable[[Any], Any], merge: Callable[[list[Any]], Any]
) -> Any:
    """``of_piece`` of each piece of the span ``value`` (its data, read then), the partials merged as they
    come along the ``reduced`` axes (``merge`` of a list of them, keeping those axes as length 1) and joined
    along the others (dicts of partials field by field): what ``of_piece`` of the whole block would give
    where ``merge`` is its own combine."""
    return _folded([value], reduced, merge, lambda box, read: of_piece(piece_of(value, box, read)))


def span_reductions(layout: tuple[tuple[Step, Combine, int], ...], *values: Any) -> tuple[Any, ...]:
    """The first steps of several reductions over the same spans (``layout``: each one's step, combine and
    number of ``values``, in turn), each piece read once for all of them: a tuple of their partials."""
    taken, at = [], 0
    for step, combine, count in layout:
        taken.append((step, combine, values[at : at + count]))
        at += count
    # Each span's axes in its step's output order (an einsum may order them otherwise): its pieces cut so.
    spans = [_in_order(v, axes) for step, _, inputs in taken for v, axes in zip(inputs, step.axes) if is_span(v)]
    shapes = {span.shape for span in spans}
    if len(shapes) != 1 or 0 in spans[0].shape:  # not one span's shape: each reads its own
        return tuple(span_reduce(step, combine, *inputs) for step, combine, inputs in taken)
    shape = spans[0].shape

    def partial_of(step: Step, inputs: Sequence[Any]) -> Callable[[Box, Reads], Any]:
        return lambda box, read: step(step.parts(inputs, box, shape, read))

    folds = [Fold(combine.reduced, combine, partial_of(step, inputs), len(shape)) for step, combine, inputs in taken]
    return tuple(_folded_together(spans, folds))


def _folded_together(spans: Sequence[Any], folds: Sequence[Fold]) -> list[Any]:
    """Each fold of the pieces of ``spans``, every piece read once (its reads shared) for all of them."""
    first = Reads()
    for position, box in _boxes(_cuts(spans)):
        raise_if_stopped()
        read = first.apart()
        for fold in folds:
            fold.add(position, box, read)
    first.check()
    return [fold.result() for fold in folds]


def _folded(
    spans: Sequence[Any],
    reduced: tuple[int, ...],
    combine: Callable[[list[Any]], Any],
    partial_of: Callable[[Box, Reads], Any],
) -> Any:
    """The partials of the pieces of ``spans`` (``partial_of`` a piece's box and its reads), combined as they
    come along the ``reduced`` axes and joined along the kept ones."""
    fold = Fold(reduced, combine, partial_of, len(spans[0].shape))
    return _folded_together(spans, [fold])[0]


def span_counts(step: Step, *values: Any) -> Any:
    """A counting step (:func:`~daskstream.compute.streaming.span_steps.counts_each_value`): over a span, the
    rows of its pieces, read one at a time, summed as they come."""
    spans = [v for v in values if is_span(v)]
    if not spans or 0 in spans[0].shape:
        return step([whole(v) for v in values])
    shape = spans[0].shape
    total, first = None, Reads()
    for _, box in _boxes(_cuts(spans)):
        raise_if_stopped()
        row = step(step.parts(values, box, shape, first.apart()))
        total = row if total is None else total + row
    first.check()
    return total
