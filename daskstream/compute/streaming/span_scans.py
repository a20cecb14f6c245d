"""The rest of a cumulative step over spans: dask's carries past each block, merged into the next.

dask's ``cumreduction`` scans each block on its own (a ``scan`` layer,
:class:`~daskstream.compute.streaming.spans.Scanned` over spans), then adds
to each block the carry past the blocks before it: the carry before merged
with the last slice of the block before. Over spans, that last slice is the
span scanned to its end, read piece by piece (:func:`~daskstream.compute.streaming.spans.span_carried`),
and the merge of a carry with a span is a step still to apply to its pieces
(:func:`~daskstream.compute.streaming.spans.span_merged`).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
from dask._task_spec import Alias, Task, TaskRef
from dask.blockwise import Blockwise
from dask.highlevelgraph import HighLevelGraph
from dask.typing import Key
from dask.utils import apply

from daskstream.compute.streaming.span_steps import is_key_of, scan_merge_of
from daskstream.compute.streaming.spans import span_carried, span_merged, span_merged_whole
from daskstream.compute.streaming.spans import whole as whole_of


def carries_scans(graph: HighLevelGraph, name: str, values: list[Any], taken: set[str]) -> bool:
    """Whether a layer's tasks are the rest of a cumulative step over the ``scan`` layer it takes (dask's
    ``cumreduction``): blocks passed on, carries made of ``full_like``, and merges of a carry with a block or
    with a block's last slice."""
    scans = graph.dependencies.get(name, set()) & taken
    if len(scans) != 1:
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


def carry_task(key: Key, value: Any, *, whole: bool) -> Any:
    """A task of a carry layer (:func:`_carry_kind`) taking spans: merges of spans still to apply."""
    if isinstance(value, tuple) and value and value[0] is apply:
        return value  # a carry of zeros or ones, as dask makes it
    if not (isinstance(value, tuple) and callable(value[0])):
        return Alias(key, value) if not whole else Task(key, whole_of, TaskRef(value))
    merge, carry, last = value
    if isinstance(last, tuple) and last and last[0] is operator.getitem:
        return Task(key, span_carried, merge, TaskRef(carry), TaskRef(last[1]), last[2])
    return Task(key, span_merged_whole if whole else span_merged, merge, TaskRef(carry), TaskRef(last))
