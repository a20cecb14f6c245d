"""Groupby-style reductions over spans: flox's map-reduce steps, each piece of a span reduced by group.

xarray's ``groupby(...).mean()`` (and ``resample``, and the other
reductions flox computes by "map-reduce") reduces each block to one partial
per group with flox's ``chunk_reduce``, then combines the partials of
neighbouring blocks along the reduced axis with flox's ``_simple_combine``.
A block's partial is what that combine makes of the partials of its pieces,
each piece reduced with the group labels of its own rows: the cut between
pieces is one more cut between blocks. So over a span, the first step
reduces one piece at a time (with the labels it covers) and combines the
partials as they come with the very combine flox put after it
(:func:`grouped_combine`), holding one piece and the partials of the groups.

flox's "cohorts" (what it chooses where a block holds few of the groups: a
day per block of hourly data, months as groups) keep in a block's partial
only the groups it found: the pieces' partials, each with the groups it
found, are then combined on all they found between them
(:func:`_union_combine`), which is the block's partial.

Only these are recognised: flox's ``chunk_reduce`` (not its arg-reductions,
whose indices count from the start of the block they were given), followed
by ``_simple_combine`` (a level of flox's tree, or within the ``_aggregate``
that ends it), or by the cohorts' steps. Any other groupby step takes its
blocks whole, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from dask.blockwise import Blockwise
from dask.core import reverse_dict
from dask.highlevelgraph import HighLevelGraph

from daskstream.compute.streaming.span_folds import joined_partials
from daskstream.graph.flox_steps import flox_chunk_step, is_flox

#: What a flox map-reduce step's partial holds besides its intermediates: the labels of its groups.
_GROUPS = "groups"


def grouped_combine(graph: HighLevelGraph, layer: Blockwise) -> tuple[Callable[..., Any], tuple[int, ...]] | None:
    """flox's combine of the partials of ``layer`` and the axes it reduces, where ``layer`` is flox's first
    step of a map-reduce groupby (``chunk_reduce`` of each block with its rows' group labels) and its partials
    go to that combine alone; else ``None``."""
    step = flox_chunk_step(layer.task.func)
    if step is None:
        return None
    combines = set()
    for dependent in reverse_dict(graph.dependencies).get(layer.output, ()):
        tasks = list(graph.layers[dependent].values())
        combines |= {_task_function(task) for task in tasks}
    if not step.reindexed:
        # Cohorts: each block's partial holds the groups it found, which its pieces' partials, each holding
        # theirs, give once reindexed to all they found between them.
        combine = _union_combine(combines, step.axis)
        return None if combine is None else (combine, step.axis)
    if len(combines) != 1:
        return None
    combine = _simple_combine_of(combines.pop())
    if combine is None or tuple(combine.keywords.get("axis", ())) != step.axis:
        return None
    return combine, step.axis


def _union_combine(functions: set[Any], axis: tuple[int, ...]) -> functools.partial[Any] | None:
    """flox's ``_simple_combine`` of partials holding different groups (reindexed to the groups they hold
    between them first), for the aggregation the steps after name; ``None`` where they name none, or this
    flox has no such combine."""
    aggregations = {id(f.keywords["agg"]): f.keywords["agg"] for f in functions if _names_aggregation(f)}
    if len(aggregations) != 1:
        return None
    try:
        from flox.dask import ReindexStrategy, _simple_combine
    except ImportError:  # another flox: its blocks are taken whole
        return None
    every_group = ReindexStrategy(blockwise=False)
    return functools.partial(
        _simple_combine, agg=next(iter(aggregations.values())), axis=axis, keepdims=True, reindex=every_group
    )


def _names_aggregation(function: Any) -> bool:
    return isinstance(function, functools.partial) and "agg" in function.keywords and is_flox(function, "")


def _simple_combine_of(step: Any) -> functools.partial[Any] | None:
    """flox's ``_simple_combine`` of intermediates where ``step`` is it (a level of the tree), or is the
    ``_aggregate`` around it (the last level, which then finalizes): the same combine either way, keeping the
    axes it reduces (``keepdims``) as a level of the tree does."""
    if not isinstance(step, functools.partial):
        return None
    if is_flox(step, "_simple_combine"):
        return step
    inner = step.keywords.get("combine")
    if not (is_flox(step, "_aggregate") and isinstance(inner, functools.partial)):
        return None
    if not is_flox(inner, "_simple_combine") or "agg" not in step.keywords or "axis" not in step.keywords:
        return None
    return functools.partial(inner, agg=step.keywords["agg"], axis=step.keywords["axis"], keepdims=True)


def _task_function(task: Any) -> Any:
    """The function a task calls: a legacy tuple's first item, a task object's ``func``."""
    if isinstance(task, tuple) and task and callable(task[0]):
        return task[0]
    return getattr(task, "func", None)


def joined_groups(parts: Mapping[tuple[int, ...], Any], axes: list[int]) -> Any:
    """The partials of a block's pieces at each position along the kept ``axes`` (each combined along the
    reduced ones) joined into the block's: each intermediate joined along those axes, the group labels --
    the same at every position, the rows being the same -- kept once."""
    if not axes:
        return parts[()]
    first = next(iter(parts.values()))
    result: dict[str, Any] = {}
    for field, value in first.items():
        if field == _GROUPS:
            result[field] = value
        elif isinstance(value, (list, tuple)):
            result[field] = type(value)(
                joined_partials({at: part[field][i] for at, part in parts.items()}, axes) for i in range(len(value))
            )
        else:
            result[field] = joined_partials({at: part[field] for at, part in parts.items()}, axes)
    return result


__all__ = ["grouped_combine", "joined_groups"]
