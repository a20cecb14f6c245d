"""Which steps stream over spans: those known to be element-wise, the transposes, the reductions whose combine
is known, and the functions marked as counting each value or reading spans themselves.

The lists are of what is known: :func:`daskstream.compute.streaming.span_graphs.span_graphs`
applies a step piece by piece only where it is on them, and a function
earns a mark only where what it does of a block is what it does of the
block's pieces put together. :func:`streaming_tasks` makes a layer of
marked steps an array, to be optimized so that the spans they take stream
into them (a store's writes, ``describe``'s statistics).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Container, Mapping
from typing import Any, TypeVar

import dask.array as da
import dask.array.chunk as dask_chunk
import dask.array.reductions as dask_reductions
import numpy as np
from dask._task_spec import Alias, GraphNode, Task, TaskRef, convert_legacy_graph
from dask.array.core import _concatenate2, _enforce_dtype
from dask.array.einsumfuncs import chunk_einsum
from dask.array.routines import _tensordot
from dask.blockwise import Blockwise, blockwise_token
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.typing import Key

from daskstream.compute import moments
from daskstream.graph.pieces import moment_chunk_in_pieces

#: The attribute :func:`counts_each_value` sets on a function.
_COUNTS_EACH_VALUE = "_daskstream_counts_each_value"

Counter = TypeVar("Counter", bound=Callable[..., Any])


def counts_each_value(fn: Counter) -> Counter:
    """Mark ``fn`` (``fn(block, ...)``: one row of counts per block, on a last axis of its own) as counting
    each of a block's values on its own.

    The row of a block is then the sum of the rows of any pieces it is cut
    into, so a span streams through ``fn`` piece by piece
    (:func:`span_counts`) instead of being held whole. Only a function that
    counts values one by one may say so.
    """
    setattr(fn, _COUNTS_EACH_VALUE, True)
    return fn


def is_counting_each_value(fn: Any) -> bool:
    """Whether ``fn`` was marked by :func:`counts_each_value`."""
    return getattr(fn, _COUNTS_EACH_VALUE, False) is True


def counts_rows(layer: Blockwise, taken: set[str]) -> bool:
    """Whether ``layer`` counts each value of the spans (blocks of ``taken``) it takes into one row per block
    (a function marked by :func:`counts_each_value`, its row on one new last axis), the spans indexed block
    for block and any other input taken whole."""
    out = layer.output_indices
    if not is_counting_each_value(layer.task.func) or layer.concatenate or list(layer.new_axes) != [out[-1]]:
        return False
    spanned = [index for name, index in layer.indices if isinstance(name, str) and name in taken]
    others = [index for name, index in layer.indices if not (isinstance(name, str) and name in taken)]
    # Every value the function takes comes through the layer's inputs (none hidden in its keywords).
    tokens = {blockwise_token(i) for i in range(len(layer.indices))}
    return (
        bool(spanned)
        and all(index == out[:-1] for index in spanned)
        and all(index is None for index in others)
        and set(layer.task.dependencies) <= tokens
    )


#: The attribute :func:`streams_spans` sets on a function.
_STREAMS_SPANS = "_daskstream_streams_spans"

Streamer = TypeVar("Streamer", bound=Callable[..., Any])


def streams_spans(fn: Streamer) -> Streamer:
    """Mark ``fn`` as taking the blocks it is given as they come -- spans included -- and reading each only
    part by part, with :func:`piece_of` (a store's task writing chunk by chunk does).

    The steps before it then hand it spans, not data: a task of ``fn`` holds
    what it makes of one part at a time, whatever the spans' size.
    """
    setattr(fn, _STREAMS_SPANS, True)
    return fn


def streaming_tasks(name: str, tasks: Mapping[Any, Task], collections: list[Any], grid: tuple[int, ...]) -> da.Array:
    """``tasks`` (a layer named ``name`` of steps marked
    :func:`streams_spans`, keyed ``(name, *index)`` over ``grid``,
    taking blocks of ``collections``) as an array of one value per task: optimized as one (``to_delayed``,
    ``compute``), the spans they take stream into them."""
    graph = HighLevelGraph.from_collections(name, MaterializedLayer(dict(tasks)), dependencies=collections)
    return da.Array(graph, name, chunks=tuple((1,) * n for n in grid), meta=np.empty((0,) * len(grid), dtype=object))


def is_streaming_spans(fn: Any) -> bool:
    """Whether ``fn`` was marked by :func:`streams_spans`."""
    return getattr(fn, _STREAMS_SPANS, False) is True


ELEMENTWISE: frozenset[Callable[..., Any]] = frozenset(
    {
        *(getattr(operator, name) for name in (
            "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "invert",
            "lt", "le", "gt", "ge", "eq", "ne", "and_", "or_", "xor",
        )),
        np.where,
        dask_chunk.astype,
        # numpy functions of one element at a time that are not ufuncs (dask maps them over blocks)
        np.clip, np.nan_to_num, np.round, np.around, np.fix, np.real, np.imag, np.angle, np.isreal,
        np.iscomplex, np.i0, np.sinc, np.isclose,
    }
)  # fmt: skip

_SELF_COMBINING: frozenset[Callable[..., Any]] = frozenset(
    {
        np.sum, np.prod, np.min, np.max, np.any, np.all, np.nansum, np.nanprod, np.nanmin, np.nanmax,
        dask_chunk.sum, dask_chunk.prod, dask_chunk.min, dask_chunk.max, dask_chunk.any, dask_chunk.all,
        dask_chunk.nansum, dask_chunk.nanprod, dask_chunk.nanmin, dask_chunk.nanmax,
        dask_reductions.chunk_min, dask_reductions.chunk_max,
        dask_reductions._nanmin_skip, dask_reductions._nanmax_skip,
        dask_chunk.topk,  # the k largest (or smallest) of the k of each part
    }
)  # fmt: skip


def is_arg_chunk(task: Any) -> bool:
    """True for dask's first step of an arg-reduction (legacy ``(arg_chunk partial, block, axis, offset)``)."""
    if not (isinstance(task, tuple) and len(task) == 4 and isinstance(task[0], functools.partial)):
        return False
    return task[0].func is dask_reductions.arg_chunk and len(task[0].args) == 2 and isinstance(task[2], tuple)


def is_key_of(value: Any, layers: set[str]) -> bool:
    """True for a key of a block of one of ``layers``."""
    return isinstance(value, tuple) and bool(value) and value[0] in layers


def with_tasks(graph: HighLevelGraph) -> HighLevelGraph:
    """``graph`` with its materialized layers passing blocks on in dask's older tuples (its ``concatenate``
    and ``stack`` still make them: a block's key, ``(getitem, key, index)``) as tasks, which the rewriting of
    spans reads; ``graph`` itself where it has none. Layers of other tuples are left as they are."""
    layers: dict[str, Layer] | None = None
    for name, layer in graph.layers.items():
        first = next(iter(layer.values()), None) if isinstance(layer, MaterializedLayer) else None
        if first is None or isinstance(first, GraphNode) or not graph.dependencies.get(name):
            continue
        keys = _KeysOf({name, *graph.dependencies[name]})
        if not all(value in keys or _is_legacy_getitem(value, keys) for value in layer.values()):
            continue
        layers = dict(graph.layers) if layers is None else layers
        layers[name] = materialized_like(layer, convert_legacy_graph(dict(layer), keys))
    if layers is None:
        return graph
    return HighLevelGraph(layers, graph.dependencies, key_dependencies=dict(graph.key_dependencies))


def _is_legacy_getitem(value: Any, keys: Container[Any]) -> bool:
    """Whether ``value`` is an older tuple taking part of a block: ``(getitem, key, index)``."""
    return isinstance(value, tuple) and len(value) == 3 and value[0] in _GETITEMS and value[1] in keys


class _KeysOf:
    """The keys of blocks of the layers ``names``, as a container: what a tuple of an older task refers to."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and bool(key) and key[0] in self.names


def materialized_like(layer: Layer, tasks: Mapping[Key, Any]) -> MaterializedLayer:
    """``tasks`` as a layer annotated as ``layer``."""
    copy = MaterializedLayer(dict(tasks), annotations=layer.annotations)
    copy.collection_annotations = dict(layer.collection_annotations or {})
    return copy


def is_elementwise(func: Any, kwargs: Mapping[str, Any] | None = None) -> bool:
    """True for a step known to give each element from the same element of its inputs (dask's dtype-enforcing
    wrapper of one, whose ``kwargs`` name it, included)."""
    if func is _enforce_dtype:
        return is_elementwise((kwargs or {}).get("enforce_dtype_function"))
    if isinstance(func, functools.partial):
        # Bound to constants only (decimals=1, rtol=...): an array bound in would not follow the pieces.
        bound = (*func.args, *func.keywords.values())
        return all(value is None or np.isscalar(value) for value in bound) and is_elementwise(func.func)
    return isinstance(func, np.ufunc) or func in ELEMENTWISE


def has_array_constants(layer: Blockwise) -> bool:
    """Whether a blockwise step takes an array (or a list) as a constant, the same for every block (an input
    without axes, or a keyword): applied to a piece, it would not be cut as the piece is."""
    constants = [value for value, index in layer.indices if index is None]
    constants += list(layer.task.kwargs.values())
    return any(isinstance(value, (np.ndarray, list)) and np.ndim(value) > 0 for value in constants)


def reduction_of(task: Task, ndim: int) -> tuple[Callable[..., Any], tuple[int, ...]] | None:
    """The combine of a reduction whose first step is ``task`` (of ``ndim`` axes out), and the axes it
    reduces; ``None`` for one not known to stream. dask's einsum's and tensordot's first steps (``xr.dot``,
    weighted means, ``da.dot`` with a vector) are ones: each block contracted, its contracted axes kept as
    axes of one, summed by the step after."""
    axis: tuple[int, ...] = ()
    if task.func is chunk_einsum:
        contracted = int(task.kwargs.get("ncontract_inds") or 0)
        axis = tuple(range(ndim - contracted, ndim))
    elif (
        task.func is _tensordot
        and not task.kwargs.get("is_sparse")
        # Counted from the left operand's end where negative: its number of axes is not known here.
        and all(int(a) >= 0 for a in task.kwargs["axes"][0])
    ):
        axis = tuple(sorted(int(a) for a in task.kwargs["axes"][0]))
    if axis:
        return concatenated(functools.partial(np.sum, axis=axis, keepdims=True), axis), axis
    combine = combine_of(task)
    return None if combine is None else (combine, tuple(task.kwargs["axis"]))


def combine_of(task: Task) -> Callable[..., Any] | None:
    """The combine of a reduction whose first step is ``task`` (a function of a list nested per reduced axis),
    or ``None`` for one not known to stream."""
    func: Any = task.func
    keywords: dict[str, Any] = {}
    if isinstance(func, functools.partial):
        func, keywords = func.func, dict(func.keywords)
    axis = task.kwargs.get("axis")
    if not isinstance(axis, tuple) or task.kwargs.get("keepdims") is not True:
        return None
    if func in _SELF_COMBINING:
        return concatenated(functools.partial(func, **keywords, axis=axis, keepdims=True), axis)
    # The first step's keywords its combine also takes (how it sums and counts, the moment's order).
    if func is dask_reductions.mean_chunk:
        return functools.partial(
            dask_reductions.mean_combine, **_taken(keywords, "sum", "numel", "dtype"), axis=axis, keepdims=True
        )
    if func is moments._moments_chunk:
        return functools.partial(moments._moments_combine, axis=axis, keepdims=True)
    # daskstream's own first step of a variance (the planner's, in pieces) gives dask's partials.
    if func in (dask_reductions.moment_chunk, moment_chunk_in_pieces):
        return functools.partial(
            dask_reductions.moment_combine, **_taken(keywords, "order", "sum", "dtype"), axis=axis, keepdims=True
        )
    return None


def _taken(keywords: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: keywords[name] for name in names if name in keywords}


def concatenated(func: Callable[..., Any], axis: tuple[int, ...]) -> Callable[..., Any]:
    return functools.partial(_concatenate_then, func, sorted(axis))


def _concatenate_then(func: Callable[..., Any], axes: list[int], nested: list[Any]) -> Any:
    return func(_concatenate2(nested, axes=axes))


_SCANS: dict[Callable[..., Any], Callable[..., Any]] = {
    np.cumsum: dask_reductions._cumsum_merge,
    np.nancumsum: operator.add,
    dask_chunk.nancumsum: operator.add,
    np.cumprod: dask_reductions._cumprod_merge,
    np.nancumprod: operator.mul,
    dask_chunk.nancumprod: operator.mul,
}


def scan_merge_of(task: Task) -> Callable[..., Any] | None:
    """How the blocks of a cumulative step whose first step is ``task`` (each block scanned along an axis:
    cumsum, cumprod and their nan- forms) merge with the carry of those before (dask's binop), or ``None``."""
    func: Any = task.func
    if isinstance(func, functools.partial):
        func = func.func
    axis = task.kwargs.get("axis")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        return None
    return _SCANS.get(func)


def transposition_of(task: Task, ndim: int) -> tuple[int, ...] | None:
    """The permutation of axes a blockwise step of one input gives (``np.transpose``, ``np.swapaxes``), or
    ``None`` for any other step."""
    if task.func is np.transpose:
        axes = task.kwargs.get("axes")
        return tuple(reversed(range(ndim))) if axes is None else tuple(int(a) % ndim for a in axes)
    if task.func is np.swapaxes:
        order = list(range(ndim))
        first, second = int(task.kwargs["axis1"]) % ndim, int(task.kwargs["axis2"]) % ndim
        order[first], order[second] = order[second], order[first]
        return tuple(order)
    return None


def is_narrowing(value: Any) -> bool:
    """True for a task passing a block on, or taking part of it with integers, slices (of any whole-number
    step) and new axes -- not with an array of indices."""
    if isinstance(value, Alias):
        return True
    return (
        isinstance(value, Task)
        and value.func in _GETITEMS
        and len(value.args) == 2
        and isinstance(value.args[0], (TaskRef, Alias))  # a reference (an Alias in a task converted from a tuple)
        and isinstance(value.args[1], tuple)
        and all(item is None or _is_whole_number(item) or _is_slice_of_whole_numbers(item) for item in value.args[1])
    )


def narrowed_piece(layer: Layer, piece: tuple[int, ...]) -> tuple[int, ...]:
    """``piece`` through the index of a ``narrow`` layer's tasks (all alike but at the edges): axes indexed by an
    integer gone, stepped axes shorter, new axes of one."""
    task = next(iter(layer.values()))
    if isinstance(task, Alias):
        return piece
    taken = [item for item in task.args[1] if item is not None]
    index = tuple(task.args[1]) + (slice(None),) * (len(piece) - len(taken))
    pieces = iter(piece)
    found: list[int] = []
    for item in index:
        if item is None:
            found.append(1)
        elif isinstance(item, slice):
            found.append(max(1, -(-next(pieces) // abs(item.step or 1))))
        else:
            next(pieces)
    return tuple(found)


#: The functions dask's slicing puts in a task taking part of a block.
_GETITEMS = (dask_chunk.getitem, operator.getitem)


def _is_whole_number(item: Any) -> bool:
    return isinstance(item, (int, np.integer)) and not isinstance(item, bool)


def _is_slice_of_whole_numbers(item: Any) -> bool:
    return isinstance(item, slice) and all(
        bound is None or _is_whole_number(bound) for bound in (item.start, item.stop, item.step)
    )
