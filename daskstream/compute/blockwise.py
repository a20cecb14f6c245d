"""map_blocks: a function run on aligned blocks of lazy arrays, with halos.

:func:`map_blocks` is dask's ``map_blocks`` with what a kernel over large files
needs on top: the inputs are re-chunked onto one grid, each block can carry a
halo of its neighbours' cells (dask's ``overlap``, trimmed after the kernel
ran), the output dtype is declared or inferred once from a tiny sample without
reading data, and a kernel that fails or returns a block of the wrong shape
says which block it was. The built-in kernels over it are
:mod:`daskstream.compute.kernels` (``ds.kernels``).

>>> import dask.array as da
>>> map_blocks(lambda block: block * 2, da.arange(6, chunks=4)).compute()
array([ 0,  2,  4,  6,  8, 10])
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.utils import funcname, has_keyword

from daskstream.advice import keyword, said
from daskstream.compute.labels import is_labelled, relabelled, unlabelled
from daskstream.compute.streaming.span_graphs import span_piece_of
from daskstream.errors import InvalidArgumentError, KernelError, KernelShapeError
from daskstream.graph.regions import KernelRegions, Readable, region_array, regions_of
from daskstream.planning.chunks import dividing_chunk, fit_halo_chunks, plan_chunks, span_of_blocks
from daskstream.planning.grid import normalize_axes, regular_chunk_shape, regular_grid
from daskstream.planning.plan import per_task_cap
from daskstream.planning.settings import PlanSettings
from daskstream.planning.spans import span_chunks
from daskstream.runtime.resources import settings_for

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["map_blocks"]

BOUNDARY_MODES = ("reflect", "nearest", "periodic", "constant", "none")

Depth = int | Sequence[int] | Mapping[int, int]
Boundary = str | float


def map_blocks(
    fn: Callable[..., Any],
    *arrays: da.Array | np.ndarray,
    depth: Depth = 0,
    boundary: Boundary = "reflect",
    dtype: DTypeLike | None = None,
    drop_axis: int | Sequence[int] | None = None,
    new_axis: int | Sequence[int] | None = None,
    chunks: tuple | None = None,
    **kwargs: Any,
) -> da.Array:
    """Run ``fn`` on aligned blocks of one or more arrays, optionally with a halo around each block.

    Parameters
    ----------
    fn
        Called as ``fn(block_0, block_1, ..., **kwargs)`` with one numpy block
        of each array, the same region of each; it returns one block. When it
        accepts a ``block_info`` keyword it gets dask's (for the haloed blocks
        when ``depth`` is set).
    *arrays
        Dask arrays (e.g. from :func:`daskstream.open`) or numpy arrays, all of
        the same shape: nothing is broadcast. ``xarray.DataArray`` inputs are
        computed on their data, and a result of their shape comes back as a
        DataArray with their dimensions and coordinates. When their chunks differ, all
        are re-chunked onto one grid: the planner's chunks
        (:func:`daskstream.plan_chunks`) for the first array, aligned to its
        current chunk grid when that grid is regular, so the first array's
        chunks are only merged, never split (unless one exceeds the memory
        budget), and the others are re-chunked to match.
    depth
        Cells each block borrows from its neighbours on both sides, trimmed
        from the output after ``fn`` ran: an int for every axis, a tuple with
        one per axis, or a dict ``{axis: depth}`` (missing axes get 0). At
        most the array's length along each axis.
    boundary
        What the halo holds beyond the array's edges, in dask's meanings:
        ``"reflect"`` mirrors the edge, repeating the edge cell (numpy's
        ``pad(mode="symmetric")``, scipy.ndimage's ``"reflect"``);
        ``"nearest"`` repeats the edge cell (``"edge"``); ``"periodic"``
        wraps around (``"wrap"``); ``"constant"`` pads zeros and a number pads
        that value; ``"none"`` adds no halo at the array's edges, so ``fn``
        sees the array's edge as its own block edge and the result equals
        ``fn`` over the whole array for any kernel reaching at most ``depth``
        cells.
    dtype
        The output dtype; blocks are cast to it. ``None``: inferred by
        calling ``fn`` once, at graph construction, on small arrays of ones
        of the inputs' dtypes (``min(n, 2 * depth + 2)`` cells per axis,
        ``block_info=None``, warnings silenced): nothing is read.
    drop_axis, new_axis
        Axes ``fn`` removes from or adds to each block, as in
        ``dask.array.map_blocks`` (``new_axis`` counts in the output, after
        ``drop_axis``). Dropped axes are gathered into one chunk first, since
        ``fn`` reduces over all of them; new axes have length 1 unless
        ``chunks`` says otherwise.
    chunks
        The output's block shape when ``fn`` changes it otherwise, as in
        ``dask.array.map_blocks``; only with ``depth=0``, since a haloed
        block must keep its shape to be trimmed.
    **kwargs
        Passed to ``fn`` on every call.

    Returns
    -------
    dask.array.Array
        Lazy; nothing is read until it is computed.

    Raises
    ------
    InvalidArgumentError
        Arrays of different shapes, a bad ``depth`` or ``boundary``, or a
        ``fn`` whose dtype could not be inferred (pass ``dtype=``).
    KernelError
        At compute time, when ``fn`` raises on a block; the message names the
        block's index (in chunks of the aligned inputs) and its shape, and the
        kernel's exception is its ``__cause__``.
    KernelShapeError
        At compute time, when ``fn`` returns a block of another shape than
        declared (by default, its input block's shape).

    Examples
    --------
    A three-point sum, with the edges mirrored:

    >>> import dask.array as da
    >>> def three_point_sum(block):
    ...     out = block.copy()
    ...     out[1:-1] = block[:-2] + block[1:-1] + block[2:]
    ...     return out
    >>> x = da.arange(8, chunks=3)
    >>> map_blocks(three_point_sum, x, depth=1, boundary="reflect").compute()
    array([ 1,  3,  6,  9, 12, 15, 18, 20])

    Two arrays with different chunks, and the dtype inferred from ``fn``:

    >>> a = da.ones((4, 6), dtype="int16", chunks=(2, 3))
    >>> b = da.ones((4, 6), dtype="int16", chunks=(4, 2))
    >>> y = map_blocks(lambda p, q: p + q, a, b)
    >>> y.dtype, int(y.sum().compute())
    (dtype('int16'), 48)
    """
    if not callable(fn):
        raise InvalidArgumentError(
            f"map_blocks needs a function first, got {type(fn).__name__}: map_blocks(fn, x, ...)"
        )
    if not arrays:
        raise InvalidArgumentError("map_blocks needs at least one array after the function: map_blocks(fn, x, ...)")
    template = next((a for a in arrays if is_labelled(a)), None)
    if template is not None:  # DataArrays: the kernel runs on their data; its result gets their labels
        result = map_blocks(
            fn, *(unlabelled(a) for a in arrays), depth=depth, boundary=boundary, dtype=dtype,
            drop_axis=drop_axis, new_axis=new_axis, chunks=chunks, **kwargs,
        )  # fmt: skip
        return relabelled(template, result)
    inputs = [_as_dask_array(a, position) for position, a in enumerate(arrays)]
    shape = inputs[0].shape
    for position, other in enumerate(inputs[1:], start=1):
        if other.shape != shape:
            raise InvalidArgumentError(
                f"array {position} has shape {other.shape} but array 0 has {shape}; map_blocks does not "
                "broadcast: give arrays of one shape (da.broadcast_to makes them so) or pass "
                "constants as keyword arguments"
            )
    ndim = len(shape)
    depths = _normalize_depth(depth, shape)
    fill = _normalize_boundary(boundary)
    dropped = () if drop_axis is None else normalize_axes(drop_axis, ndim)
    added = _normalize_new_axes(new_axis, ndim - len(dropped))
    if chunks is not None and any(depths):
        raise InvalidArgumentError(
            said(
                keyword("chunks", chunks),
                f" with depth={depth!r}: a block with a halo must keep its shape so the halo can be trimmed; "
                "drop or add axes with drop_axis=/new_axis=, or use depth=0",
            )
        )

    passes_block_info = has_keyword(fn, "block_info")
    if dtype is None:
        out_dtype = _infer_dtype(fn, inputs, depths, passes_block_info, kwargs)
    else:
        out_dtype = _as_dtype(dtype, "dtype")

    kernel = _CheckedKernel(fn, out_dtype, depths, passes_block_info, kwargs)
    settings = settings_for(*inputs)
    if not dropped and not added and chunks is None:
        # An aggregate goes whole into every task of the kernel: an eighth of a task's share at most.
        limit = settings.resources.per_task_bytes // 8
        readable = [regions_of(a, constant_limit=limit) for a in inputs]
        if all(r is not None for r in readable):
            return _map_regions(kernel, inputs, readable, depths, fill, settings)
    inputs = _align_chunks(inputs, settings)
    if dropped:
        inputs = [a.rechunk(dict.fromkeys(dropped, -1)) for a in inputs]
    out_ndim = ndim - len(dropped) + len(added)
    block_args = {
        "dtype": out_dtype,
        "meta": np.empty((0,) * out_ndim, dtype=out_dtype),
        "drop_axis": list(dropped),
        "new_axis": list(added) or None,
        "chunks": chunks,
    }
    if not any(depths):
        return da.map_blocks(kernel, *inputs, **block_args)

    # dask's map_overlap is these three steps, but it shifts the trim depths wrongly when a new axis
    # goes before axes of unequal depth (dask 2026.8), so the trim depths are worked out here.
    halo = dict(enumerate(depths))
    edges = dict.fromkeys(range(ndim), fill)
    haloed = [da.overlap.overlap(a, depth=halo, boundary=edges) for a in inputs]
    mapped = da.map_blocks(kernel, *haloed, **block_args)
    out_depth = [d for axis, d in enumerate(depths) if axis not in dropped]
    out_edges = [fill for axis in range(ndim) if axis not in dropped]
    for axis in added:
        out_depth.insert(axis, 0)
        out_edges.insert(axis, "none")
    return da.overlap.trim_internal(mapped, dict(enumerate(out_depth)), boundary=dict(enumerate(out_edges)))


def _map_regions(
    kernel: _CheckedKernel,
    inputs: list[da.Array],
    readable: list[Any],
    depths: tuple[int, ...],
    fill: Any,
    settings: PlanSettings,
) -> da.Array:
    """The kernel as one task per block, each reading its haloed region straight from the sources.

    Blocks follow the first array's chunks, made smaller when a block with
    every halo on the way (this kernel's and those of the kernels it reads
    through) would not fit one task's share of the memory budget (``settings``,
    what the inputs were planned with).
    """
    regions = [r.regions for r in readable]
    constants = {name: array for r in readable for name, array in r.constants.items()}
    first = inputs[0]
    resources = settings.resources
    halo = tuple(d + max(r.reach[a] for r in regions) for a, d in enumerate(depths))
    sources = {s.token: s for r in regions for s in r.sources}.values()
    widest = max([kernel.dtype.itemsize, *(a.dtype.itemsize for a in inputs)])
    unit = next((s.storage_chunks for s in sources if s.storage_chunks is not None), None)
    # Over an array read in spans, the blocks start from the chunk its spans stream in, not the spans.
    spanned = span_piece_of(first.__dask_graph__(), first.name)
    chunks = fit_halo_chunks(
        first.shape,
        spanned or tuple(max(c) if c else 0 for c in first.chunks),
        halo,
        widest,
        per_task_bytes=resources.per_task_bytes,
        working_set_factor=settings.working_set_factor_for(kernel.dtype),
        decode_bytes=sum(s.decode_bytes for s in sources),
        unit=unit,
        what=f"kernel {funcname(kernel.fn)!r}",
    )
    if spanned is not None:
        chunks = _cutting_spans_evenly(chunks, first.chunks, unit)
    grid = (
        first.chunks
        if spanned is None and chunks == tuple(max(c) if c else 0 for c in first.chunks)
        else regular_grid(first.shape, chunks)
    )
    reader = KernelRegions(kernel, tuple(regions), depths, fill, kernel.dtype, grid)
    cap = per_task_cap(resources.memory_budget, resources.threads, settings.working_set_factor_for(kernel.dtype))
    spans = _kernel_spans(first, grid, settings, spanned=spanned is not None)
    return region_array(Readable(reader, constants), grid, resources, spans=spans, cap=cap)


def _cutting_spans_evenly(
    chunks: tuple[int, ...], spans: tuple[tuple[int, ...], ...], unit: tuple[int, ...] | None
) -> tuple[int, ...]:
    """A kernel's ``chunks`` over an array read in ``spans``, made to cut the spans evenly where that keeps
    them at least half as long: a span is then whole blocks, each numbered as on the kernel's grid."""
    units = unit or (1,) * len(chunks)
    cut = []
    for lengths, chunk, step in zip(spans, chunks, units, strict=True):
        # The spans before the last are alike in length (or cut off the grid): the blocks divide each of them.
        even = dividing_chunk(math.gcd(*(lengths[:-1] or lengths)), chunk, step) if lengths else 0
        cut.append(even if 2 * even >= chunk else chunk)
    return tuple(cut)


def _kernel_spans(first: da.Array, grid: tuple[tuple[int, ...], ...], settings: PlanSettings, *, spanned: bool) -> Any:
    """The chunks of a kernel's tasks where each computes a span of its blocks (``grid``), else ``None``.

    Over an array read in spans, the kernel keeps its spans, so that it lines
    up with other steps over that array (``x - moving_mean(x, 5)``); over
    others, its blocks get spans of their own where they outnumber what a
    graph may hold (a kernel over a pebibyte). The steps after it then
    compute each span block by block: the reductions, stores and
    element-wise steps that stream spans.
    """
    if any(len(lengths) > 1 and len(set(lengths[:-1])) > 1 for lengths in grid):
        return None  # the user's own uneven chunks: blocks a span cannot step through
    if spanned and math.prod(first.numblocks) < math.prod(map(len, grid)):
        return first.chunks
    resources = settings.resources
    piece = tuple(max(lengths, default=0) for lengths in grid)
    itemsize = max(first.dtype.itemsize, 1)
    span = span_of_blocks(first.shape, piece, itemsize, settings.scheduler, resources.threads * resources.workers)
    return None if span is None else span_chunks(grid, span)


@dataclass(frozen=True)
class _CheckedKernel:
    """The user's kernel as a dask task: names the failing block, checks the shape, casts the dtype.

    A module-level class rather than a closure, so it pickles for process and
    distributed workers.
    """

    fn: Callable[..., Any]
    dtype: np.dtype
    depth: tuple[int, ...]
    passes_block_info: bool
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def __name__(self) -> str:
        # dask names a task after its function (dask.utils.funcname): the user's, not this wrapper's.
        return funcname(self.fn)

    def __call__(self, *blocks: Any, block_info: dict | None = None) -> Any:
        # dask passes block_info to every call, because this signature names it.
        if block_info is None:
            raise KernelError(f"kernel {funcname(self.fn)!r} was called without dask's block_info")
        kwargs = {**self.kwargs, "block_info": block_info} if self.passes_block_info else self.kwargs
        try:
            result = self.fn(*blocks, **kwargs)
        except MemoryError:
            raise  # the machine's condition, not the kernel's bug: dask and the user must see it as is
        except Exception as exc:
            # Chained, and the kernel's error repeated in the message, which survives pickling
            # back from a worker process where the chain does not.
            raise KernelError(
                f"kernel {funcname(self.fn)!r} failed on {self._which_block(blocks, block_info)}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not hasattr(result, "shape"):
            result = np.asarray(result)
        expected = tuple(block_info[None]["chunk-shape"])
        if tuple(result.shape) != expected:
            raise KernelShapeError(
                f"kernel {funcname(self.fn)!r} returned a block of shape {tuple(result.shape)} for "
                f"{self._which_block(blocks, block_info)}, where the output has a block of shape {expected}; "
                "a kernel that changes the block shape must declare it with drop_axis=, new_axis= or ",
                keyword("chunks"),
            )
        if result.dtype != self.dtype:
            result = result.astype(self.dtype)
        return result

    def _which_block(self, blocks: tuple, block_info: dict) -> str:
        # dask's index of the block among the (aligned) input's chunks, and the shape fn was given.
        location = tuple(block_info[0]["chunk-location"])
        halo = f", halo of depth {self.depth} included" if any(self.depth) else ""
        return f"block {location} of shape {tuple(blocks[0].shape)}{halo}"

    def __dask_tokenize__(self) -> str:
        return tokenize(self.fn, self.dtype.str, self.depth, self.passes_block_info, self.kwargs)


def _as_dask_array(array: Any, position: int) -> da.Array:
    if isinstance(array, da.Array):
        return array
    if isinstance(array, np.ndarray):
        return da.asarray(array)
    raise InvalidArgumentError(
        f"argument {position} after the function is a {type(array).__name__}, not an array; pass dask arrays "
        "(daskstream.open) or numpy arrays, and other values as keyword arguments"
    )


def _as_dtype(dtype: Any, name: str) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise InvalidArgumentError(
            said(keyword(name, dtype), " is not a numpy dtype; e.g. 'float32', np.int16")
        ) from exc


def _normalize_depth(depth: Depth, shape: tuple[int, ...]) -> tuple[int, ...]:
    """One halo width per axis, from an int, a per-axis sequence or a dict ``{axis: depth}``."""
    ndim = len(shape)
    hint = "give an int, one int per axis or a dict {axis: int}"
    if isinstance(depth, Mapping):
        per_axis = [0] * ndim
        seen: set[int] = set()
        for axis, width in depth.items():
            (normalized,) = normalize_axes(axis, ndim)
            if normalized in seen:
                raise InvalidArgumentError(f"depth={depth!r} names axis {normalized} twice")
            seen.add(normalized)
            per_axis[normalized] = width
        widths: Sequence[Any] = per_axis
    elif isinstance(depth, Sequence) and not isinstance(depth, str):
        if len(depth) != ndim:
            raise InvalidArgumentError(f"depth={depth!r} has {len(depth)} entries for {ndim} axes; {hint}")
        widths = depth
    else:
        widths = [depth] * ndim
    for width in widths:
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 0:
            raise InvalidArgumentError(f"depth={depth!r}: {width!r} is not a non-negative int; {hint}")
    out = tuple(int(w) for w in widths)
    for axis, (width, n) in enumerate(zip(out, shape)):
        if width > n:
            raise InvalidArgumentError(
                f"depth {width} along axis {axis} is wider than the array there ({n} cells); a halo borrows "
                "cells from the array, so use a depth of at most its length"
            )
    return out


def _normalize_boundary(boundary: Boundary) -> str | float:
    """dask's boundary value: a mode name, or the number a constant halo holds."""
    if isinstance(boundary, str) and boundary in BOUNDARY_MODES:
        return 0 if boundary == "constant" else boundary
    if isinstance(boundary, numbers.Number) and not isinstance(boundary, bool):
        return boundary
    raise InvalidArgumentError(
        f"boundary={boundary!r} is not one of {', '.join(map(repr, BOUNDARY_MODES))} or a number (a constant halo)"
    )


def _normalize_new_axes(new_axis: int | Sequence[int] | None, kept_ndim: int) -> tuple[int, ...]:
    if new_axis is None:
        return ()
    requested = (new_axis,) if isinstance(new_axis, (int, np.integer)) else tuple(new_axis)
    out = normalize_axes(requested, kept_ndim + len(requested))
    if len(out) != len(requested):
        raise InvalidArgumentError(f"new_axis={new_axis!r} names one output axis twice")
    return out


def _infer_dtype(
    fn: Callable[..., Any],
    inputs: list[da.Array],
    depths: tuple[int, ...],
    passes_block_info: bool,
    kwargs: dict[str, Any],
) -> np.dtype:
    """The dtype ``fn`` returns for blocks of the inputs' dtypes, from one call on small arrays of ones."""
    sample_shape = tuple(min(n, 2 * d + 2) for n, d in zip(inputs[0].shape, depths))
    dtypes = [a.dtype for a in inputs]
    call_kwargs = {**kwargs, "block_info": None} if passes_block_info else kwargs
    try:
        samples = [np.ones(sample_shape, dtype=dt) for dt in dtypes]
        # The sample is made up: a division by zero on it says nothing about the data.
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = fn(*samples, **call_kwargs)
    except Exception as exc:
        raise InvalidArgumentError(
            f"could not infer the output dtype of kernel {funcname(fn)!r}: called on a sample block of ones "
            f"of shape {sample_shape} and dtype(s) {', '.join(map(str, dtypes))} it raised "
            f"{type(exc).__name__}: {exc}; pass dtype= to declare the output dtype"
        ) from exc
    return result.dtype if hasattr(result, "dtype") else np.asarray(result).dtype


def _align_chunks(inputs: list[da.Array], settings: PlanSettings) -> list[da.Array]:
    """All inputs on one chunk grid: the planner's for the first array within ``settings``, aligned to its grid
    when regular."""
    first = inputs[0]
    if all(a.chunks == first.chunks for a in inputs[1:]):
        return inputs
    if first.size == 0:
        target = first.chunks
    else:
        grid = regular_chunk_shape(first.chunks)
        layout = "C" if grid is None else "chunked"
        plan = plan_chunks(first.shape, first.dtype, settings, storage_chunks=grid, layout=layout)
        target = plan.dask_chunks
    return [a.rechunk(target) for a in inputs]
