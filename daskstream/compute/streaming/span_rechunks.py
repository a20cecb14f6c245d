"""Rechunks of spans: each new block the spans' parts it joins, still a span, read a piece at a time.

dask rechunks an array with a layer of its own: tasks cutting the old
blocks into parts (slices, ``getitem``), and tasks joining the parts of each
new block (``concatenate_shaped``), or passing one part on. Over spans, a
cut is a narrower span, and a join a
:class:`~daskstream.compute.streaming.span_takes.Concatenated` one, nested
axis by axis as dask nests its parts: nothing is read until a step reads a
piece, and a piece lies within one part, so it reads no more than one chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dask._task_spec import Alias, Task, TaskRef
from dask.array.core import concatenate_shaped, reshapelist
from dask.highlevelgraph import Layer, MaterializedLayer
from dask.typing import Key

from daskstream.compute.streaming.span_steps import is_narrowing, materialized_like
from daskstream.compute.streaming.span_takes import Concatenated
from daskstream.compute.streaming.spans import is_span, span_narrow, span_narrow_whole, whole


def span_concatenate_shaped(parts: list[Any], shape: list[int]) -> Any:
    """dask's join of a new block's ``parts`` (``shape``: how many along each axis, in C order): of spans, a
    :class:`Concatenated` span of them, nested axis by axis; of data, the data's."""
    if not any(is_span(part) for part in parts):
        return concatenate_shaped(parts, shape)
    return _nested(reshapelist(shape, parts) if len(shape) > 1 else list(parts), 0)


def span_concatenate_shaped_whole(parts: list[Any], shape: list[int]) -> Any:
    """:func:`span_concatenate_shaped` whose block is taken whole by the step after."""
    return whole(span_concatenate_shaped(parts, shape))


def _nested(parts: Any, axis: int) -> Any:
    """Nested lists of parts (the outer along ``axis``, the inner along the axes after) as one span."""
    if not isinstance(parts, list):
        return parts
    joined = [_nested(part, axis + 1) for part in parts]
    return joined[0] if len(joined) == 1 else Concatenated(joined, axis)


def is_rechunk_layer(values: Sequence[Any]) -> bool:
    """Whether ``values``, a layer's, are dask's rechunk's: cuts of old blocks (slices, or whole blocks passed
    on) and joins of the cuts."""
    joins = [v for v in values if _is_join(v)]
    return bool(joins) and all(_is_join(v) or is_narrowing(v) for v in values)


def streaming_rechunk_layer(layer: Layer, name: str, *, taken_whole: bool) -> MaterializedLayer:
    """The layer ``name`` of dask's rechunk (:func:`is_rechunk_layer`) streaming spans: its cuts give narrower
    spans, its joins concatenated ones; its blocks (keys of ``name``) given whole where the step after takes
    them so (``taken_whole``)."""
    tasks: dict[Key, Any] = {}
    for key, value in layer.items():
        block = taken_whole and isinstance(key, tuple) and key[0] == name
        if _is_join(value):
            join = span_concatenate_shaped_whole if block else span_concatenate_shaped
            tasks[key] = Task(key, join, *value.args, **value.kwargs)
        else:
            tasks[key] = narrowing_task(key, value, whole=block)
    return materialized_like(layer, tasks)


def narrowing_task(key: Key, value: Any, *, whole: bool) -> Any:
    """A task cutting a block (``value``: a slice of it, or the block passed on by an alias, as dask's
    concatenate and rechunk do) streaming spans; its block given whole where the step after takes it so."""
    if not isinstance(value, Alias):
        return Task(key, span_narrow_whole if whole else span_narrow, *value.args)
    return Task(key, span_narrow_whole, TaskRef(next(iter(value.dependencies))), ()) if whole else value


def _is_join(value: Any) -> bool:
    return isinstance(value, Task) and value.func is concatenate_shaped
