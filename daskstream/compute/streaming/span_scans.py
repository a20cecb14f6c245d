"""Cumulative steps over spans: each piece scanned, and dask's carries past each block merged into the next.

dask's ``cumreduction`` scans each block on its own (a ``scan`` layer,
:class:`Scanned` over spans), then adds to each block the carry past the
blocks before it: the carry before merged with the last slice of the block
before. Over spans, that last slice is the span's total, the span scanned to
its end piece by piece (:func:`span_total`) in a task of its own, so that
the spans' totals are read side by side and only their merges wait on each
other; the merge of a carry with a span is a step still to apply to its
pieces (:func:`span_merged`).
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from dask._task_spec import Alias, Task, TaskRef
from dask.base import tokenize
from dask.blockwise import Blockwise, blockwise_token
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.utils import apply

from daskstream.compute.streaming.span_steps import is_key_of, materialized_like, scan_merge_of
from daskstream.compute.streaming.spans import Box, Mapped, Reads, Step, StepToApply, is_span, read_part, span_narrow
from daskstream.compute.streaming.spans import whole as whole_of
from daskstream.runtime.stopping import raise_if_stopped


class Scanned(StepToApply):
    """A cumulative step along ``axis`` of a span (dask's first step of a cumulative sum or product: each
    block scanned on its own), still to apply: each piece read and scanned, then merged (``merge``, dask's
    ``_cumsum_merge`` or ``_cumprod_merge``) with the carry of the pieces before it along the axis.

    ``region`` is the part of the scan this span is (a slice of it keeps the
    scan's start). Pieces asked for in order along the axis, as a reduction
    asks for them, carry on from the last (per thread: two tasks may read
    one span at once); any other asks from the span's start again.
    """

    __slots__ = ("_carries", "axis", "inner", "merge", "region", "shape", "step")

    def __init__(self, step: Step, inner: Any, axis: int, merge: Callable[..., Any], region: Box | None = None):
        self.step, self.inner, self.axis, self.merge = step, inner, axis, merge
        self.region = region or tuple(slice(0, n) for n in inner.shape)
        self.shape = tuple(r.stop - r.start for r in self.region)
        self._carries: dict[tuple[Any, ...], tuple[int, Any, int, Any]] = {}

    def __reduce__(self) -> Any:  # the carries are this process's progress, not the span's
        return Scanned, (self.step, self.inner, self.axis, self.merge, self.region)

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        return tuple(
            (0, *(c - r.start for c in cuts if r.start < c < r.stop), r.stop - r.start)
            for cuts, r in zip(self.inner.cuts(), self.region, strict=True)
        )

    def narrowed(self, box: Box) -> Scanned:
        return Scanned(self.step, self.inner, self.axis, self.merge, _within(self.region, box))

    def value(self, box: Box, read: Reads) -> Any:
        """The scan in ``box`` (of this span), one piece of ``inner`` across the kept axes at a time."""
        absolute = _within(self.region, box)
        kept = [
            [slice(a, b) for a, b in itertools.pairwise((s.start, *(c for c in cuts if s.start < c < s.stop), s.stop))]
            if axis != self.axis
            else [s]
            for axis, (s, cuts) in enumerate(zip(absolute, self.inner.cuts(), strict=True))
        ]
        parts = [(cells, self._scanned(cells, read)) for cells in itertools.product(*kept)]
        if len(parts) == 1:
            return parts[0][1]
        out = np.empty(tuple(s.stop - s.start for s in absolute), dtype=parts[0][1].dtype)
        for cells, part in parts:
            out[tuple(slice(c.start - a.start, c.stop - a.start) for c, a in zip(cells, absolute))] = part
        return out

    def _scanned(self, box: Box, read: Reads) -> Any:
        axis, start, stop = self.axis, box[self.axis].start, box[self.axis].stop
        key = (threading.get_ident(), *((s.start, s.stop) for i, s in enumerate(box) if i != axis))
        # Where this thread got to along the axis and the carry there, and where its last part began (the same
        # part asked again, by two steps of one piece, starts there): carried on from the latest before ``start``.
        reached, carry_reached, began, carry_began = self._carries.get(key, (0, None, 0, None))
        done, carry = (
            (reached, carry_reached) if reached <= start else (began, carry_began) if began <= start else (0, None)
        )
        # The parts before the box's own along the axis: each read (its reads let go) for its last slice alone.
        for cut in [c for c in self.inner.cuts()[axis] if done < c <= start]:
            raise_if_stopped()
            carry = self._carry(carry, self._piece(box, done, cut, read.apart()))
            done = cut
        scanned = self._piece(box, done, stop, read)  # from the last cut before the box: one read of its chunk
        if carry is not None:
            scanned = self.merge(carry, scanned)
        # Kept at the span's end too (a slice per kept part): another step may ask for its last part again.
        self._carries[key] = (stop, self._last(scanned), done, carry)
        return scanned[(slice(None),) * axis + (slice(start - done, None),)]

    def _piece(self, box: Box, start: int, stop: int, read: Reads) -> Any:
        cells = tuple(slice(start, stop) if i == self.axis else s for i, s in enumerate(box))
        return self.step([read_part(self.inner, cells, read)])

    def _last(self, scanned: Any) -> Any:
        return scanned[(slice(None),) * self.axis + (slice(-1, None),)]

    def _carry(self, carry: Any, scanned: Any) -> Any:
        return self._last(scanned) if carry is None else self.merge(carry, self._last(scanned))

    def __repr__(self) -> str:
        return f"<Scanned {self.shape} along axis {self.axis}>"


def _within(region: Box, box: Box) -> Box:
    """``box`` (relative to ``region``) in ``region``'s coordinates."""
    return tuple(slice(r.start + b.start, r.start + b.stop) for r, b in zip(region, box, strict=True))


def span_scan(step: Step, merge: Callable[..., Any], value: Any, axis: int) -> Any:
    """A cumulative step's first step (each block scanned along ``axis``): of a span, the scan still to apply."""
    return Scanned(step, value, axis, merge) if is_span(value) else step([value])


def span_scan_whole(step: Step, merge: Callable[..., Any], value: Any, axis: int) -> Any:
    """:func:`span_scan` whose block is taken whole by the step after."""
    return whole_of(span_scan(step, merge, value, axis))


def span_total(scanned: Any, last: tuple[slice, ...]) -> Any:
    """A scanned block's ``last`` slice: of a span, the span scanned to its end, piece by piece."""
    return whole_of(span_narrow(scanned, last))


def span_merged(merge: Callable[..., Any], carry: Any, scanned: Any) -> Any:
    """A scanned block merged with the carry of the blocks before it: of a span, the merge still to apply."""
    if not is_span(scanned):
        return merge(carry, scanned)
    tokens = [blockwise_token(0), blockwise_token(1)]
    axes = tuple(range(len(scanned.shape)))
    return Mapped(Step(Task("merge", merge, *map(TaskRef, tokens)), (axes, axes)), (carry, scanned), scanned.shape)


def span_merged_whole(merge: Callable[..., Any], carry: Any, scanned: Any) -> Any:
    """:func:`span_merged` whose block is taken whole by the step after."""
    return whole_of(span_merged(merge, carry, scanned))


def carries_scans(graph: HighLevelGraph, name: str, values: list[Any], taken: set[str]) -> bool:
    """Whether a layer's tasks are the rest of a cumulative step over the ``scan`` layer it takes (dask's
    ``cumreduction``): blocks passed on, carries made of ``full_like``, and merges of a carry with a block or
    with a block's last slice."""
    scans = graph.dependencies.get(name, set())
    if len(scans) != 1 or not scans <= taken:  # dask's carries take the scanned blocks alone
        return False
    (scan,) = scans
    layer = graph.layers[scan]
    merge = scan_merge_of(layer.task) if isinstance(layer, Blockwise) else None
    return merge is not None and all(_carry_kind(value, merge, scan) is not None for value in values)


def _carry_kind(value: Any, merge: Any, scan: str) -> str | None:
    """What a task of a cumulative step's carry layer is: ``pass`` (a block of ``scan``), ``start`` (a carry of
    ``full_like``), ``carry`` (merge of a carry and a block's last slice), ``merge`` (of a carry and a block)."""
    if is_key_of(value, {scan}):
        return "pass"
    if not isinstance(value, tuple) or not value:
        return None
    if value[0] is apply and len(value) > 1 and value[1] is np.full_like:
        return "start"
    if value[0] is not merge or len(value) != 3 or not isinstance(value[1], tuple):
        return None
    last = value[2]
    if isinstance(last, tuple) and len(last) == 3 and last[0] is operator.getitem and is_key_of(last[1], {scan}):
        return "carry"
    return "merge" if is_key_of(last, {scan}) else None


def carry_layers(graph: HighLevelGraph, name: str, *, whole: bool) -> tuple[dict[str, Layer], dict[str, set[str]]]:
    """A carry layer (:func:`carries_scans`) taking spans, and the layer of the spans' totals it merges: the
    layers, and what each needs."""
    layer = graph.layers[name]
    (scan,) = graph.dependencies[name]  # a carry layer takes its scan layer alone
    scanning = graph.layers[scan]
    assert isinstance(scanning, Blockwise)  # as carries_scans found it
    merging = scan_merge_of(scanning.task)
    totals_name = f"span-totals-{tokenize(name)}"
    tasks: dict[Any, Any] = {}
    totals: dict[Any, Task] = {}
    for key, value in layer.items():
        kind = _carry_kind(value, merging, scan)
        if kind == "start":
            tasks[key] = value  # a carry of zeros or ones, as dask makes it
        elif kind == "pass":
            tasks[key] = Task(key, whole_of, TaskRef(value)) if whole else Alias(key, value)
        elif kind == "carry":
            # The carry past a span: its total, made beside the other spans' (not after their carries).
            merge, carry, (_, block, last) = value
            total = (totals_name, *block[1:])
            totals[total] = Task(total, span_total, TaskRef(block), last)
            tasks[key] = Task(key, merge, TaskRef(carry), TaskRef(total))
        else:
            merge, carry, block = value
            tasks[key] = Task(key, span_merged_whole if whole else span_merged, merge, TaskRef(carry), TaskRef(block))
    layers: dict[str, Layer] = {name: materialized_like(layer, tasks), totals_name: MaterializedLayer(totals)}
    return layers, {name: {scan, totals_name}, totals_name: {scan}}
