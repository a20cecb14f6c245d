"""Kernels: a function run on aligned blocks of lazy arrays, with halos, and a few built-in ones.

(Longer than most modules: the built-in kernels users reach as ``ds.kernels``
are a few lines each over the same machinery, and live beside it so that they
show how to use it.)

:func:`map_blocks` is dask's ``map_blocks`` with what a kernel over large files
needs on top: the inputs are re-chunked onto one grid, each block can carry a
halo of its neighbours' cells (dask's ``overlap``, trimmed after the kernel
ran), the output dtype is declared or inferred once from a tiny sample without
reading data, and a kernel that fails or returns a block of the wrong shape
says which block it was.

The built-in kernels (:func:`standardize`, :func:`clip`, :func:`astype`,
:func:`moving_mean`, :func:`gaussian_filter`) are plain functions over dask
arrays; the two filters need scipy, imported only when they are called.

>>> import dask.array as da
>>> x = da.arange(6, chunks=4)
>>> clip(x, 1, 4).compute()
array([1, 1, 2, 3, 4, 4])
"""

from __future__ import annotations

import functools
import inspect
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.graph_manipulation import bind
from dask.utils import funcname, has_keyword

from daskstream.compute.labels import axes_by_name, is_labelled, relabelled, unlabelled
from daskstream.dependencies import optional_import
from daskstream.errors import InvalidArgumentError, KernelError, KernelShapeError
from daskstream.graph.regions import KernelRegions, Readable, region_array, regions_of
from daskstream.planning.chunks import fit_halo_chunks, plan_chunks
from daskstream.planning.grid import normalize_axes, regular_chunk_shape, regular_grid
from daskstream.planning.settings import PlanSettings
from daskstream.runtime.resources import settings_for

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["astype", "clip", "gaussian_filter", "map_blocks", "moving_mean", "standardize"]


def __dir__() -> list[str]:
    """The kernels, for tab completion on ``ds.kernels.``: not the names this module imports."""
    return list(__all__)


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
            f"chunks={chunks!r} with depth={depth!r}: a block with a halo must keep its shape so the halo "
            "can be trimmed; drop or add axes with drop_axis=/new_axis=, or use depth=0"
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
    chunks = fit_halo_chunks(
        first.shape,
        tuple(max(c) if c else 0 for c in first.chunks),
        halo,
        widest,
        per_task_bytes=resources.per_task_bytes,
        working_set_factor=settings.working_set_factor_for(kernel.dtype),
        decode_bytes=sum(s.decode_bytes for s in sources),
        unit=unit,
        what=f"kernel {funcname(kernel.fn)!r}",
    )
    grid = (
        first.chunks if chunks == tuple(max(c) if c else 0 for c in first.chunks) else regular_grid(first.shape, chunks)
    )
    reader = KernelRegions(kernel, tuple(regions), depths, fill, kernel.dtype, grid)
    return region_array(Readable(reader, constants), grid, resources)


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
                "a kernel that changes the block shape must declare it with drop_axis=, new_axis= or chunks="
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
        raise InvalidArgumentError(f"{name}={dtype!r} is not a numpy dtype; e.g. 'float32', np.int16") from exc


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


def _clip_block(block: np.ndarray, lower: Any, upper: Any) -> np.ndarray:
    return np.clip(block, lower, upper)


def _keeps_labels(kernel: Callable[..., da.Array]) -> Callable[..., Any]:
    """``kernel`` taking a DataArray too: its array computed on, ``axis`` given by dimension name or
    position, and a result of its shape given its dimensions and coordinates back (as map_blocks does)."""
    signature = inspect.signature(kernel)

    @functools.wraps(kernel)
    def labelled(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_labelled(x):
            return kernel(x, *args, **kwargs)
        bound = signature.bind(unlabelled(x), *args, **kwargs)
        if "axis" in bound.arguments:
            bound.arguments["axis"] = axes_by_name(x, bound.arguments["axis"])
        return relabelled(x, kernel(*bound.args, **bound.kwargs))

    return labelled


@_keeps_labels
def standardize(x: da.Array | np.ndarray, axis: int | Sequence[int] | None = None) -> da.Array:
    """Subtract the mean and divide by the standard deviation, computed out of core.

    Mean and standard deviation (``ddof=0``, as numpy) are dask reductions
    accumulated in float64. ``x`` is then computed a second time for the
    result, after the statistics, so no block waits in memory for them:
    files are read twice, and an ``x`` that is expensive to compute and fits
    in memory is worth persisting first. Where the standard deviation is 0
    it is taken as 1, as scikit-learn's ``StandardScaler`` does, so constant
    slices come out as zeros rather than NaN.

    Parameters
    ----------
    x
        A real-valued array.
    axis
        Axis or axes the statistics run over; ``None``: all of them.

    Returns
    -------
    dask.array.Array
        Of ``x``'s dtype when it is a float, else float64.

    Examples
    --------
    >>> import dask.array as da
    >>> x = da.from_array([1.0, 2.0, 3.0, 4.0], chunks=2)
    >>> standardize(x).compute().round(4)
    array([-1.3416, -0.4472,  0.4472,  1.3416])
    """

    x = _as_dask_array(x, 0)
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool) or np.issubdtype(x.dtype, np.complexfloating):
        raise InvalidArgumentError(f"standardize needs a real-valued array, not {x.dtype}; astype() it first")
    axes = None if axis is None else normalize_axes(axis, x.ndim)
    out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)
    mean = x.mean(axis=axes, dtype=np.float64, keepdims=True)
    std = x.std(axis=axes, dtype=np.float64, keepdims=True)
    std = da.where(std == 0, 1.0, std)
    # A copy of x's graph whose reads start after the statistics are done; sharing x's tasks would
    # keep every block in memory until the last one had entered the mean.
    x_again = bind(x, [mean, std])
    return ((x_again - mean) / std).astype(out_dtype)


@_keeps_labels
def clip(x: da.Array | np.ndarray, lower: Any, upper: Any) -> da.Array:
    """Limit values to ``[lower, upper]``, blockwise, as ``np.clip`` (dtype included).

    Parameters
    ----------
    x
        The array.
    lower, upper
        Scalar bounds; either may be ``None`` for no bound on that side.

    Returns
    -------
    dask.array.Array
        Of the dtype ``np.clip`` gives: ``x``'s for bounds it can hold
        (an int16 array with int bounds stays int16).

    Examples
    --------
    >>> import dask.array as da
    >>> clip(da.arange(6, chunks=4, dtype="int16"), 1, 4).compute()
    array([1, 1, 2, 3, 4, 4], dtype=int16)
    """
    for name, bound in (("lower", lower), ("upper", upper)):
        if bound is not None and np.ndim(bound) != 0:
            raise InvalidArgumentError(
                f"{name}={bound!r} is not a scalar; for bounds that vary across the array use "
                "map_blocks(np.clip, x, lower_array, upper_array)"
            )
    return map_blocks(_clip_block, x, lower=lower, upper=upper)


@_keeps_labels
def astype(x: da.Array | np.ndarray, dtype: DTypeLike) -> da.Array:
    """Cast to ``dtype``, blockwise and lazily (numpy's unsafe casting, as ``ndarray.astype``).

    The same as ``x.astype(dtype)``; here so a pipeline of kernels reads as calls of one module.

    Examples
    --------
    >>> import dask.array as da
    >>> astype(da.from_array([1.7, -2.5], chunks=1), "int8").compute()
    array([ 1, -2], dtype=int8)
    """
    return _as_dask_array(x, 0).astype(_as_dtype(dtype, "dtype"))


@_keeps_labels
def moving_mean(x: da.Array | np.ndarray, window: int, axis: int = 0) -> da.Array:
    """Centered moving average over ``window`` cells along ``axis``, mirrored at the edges.

    Equal to ``scipy.ndimage.uniform_filter1d(x, window, axis, mode="reflect")``
    on the array in memory: each block gets a halo of ``window // 2`` cells
    along ``axis``. As in scipy, an even window reaches one cell further
    before a cell than after it, and the output has ``x``'s dtype (integer
    means are rounded: ``astype`` a float first for exact ones). Needs scipy.

    Parameters
    ----------
    x
        The array.
    window
        Number of cells averaged, a positive int.
    axis
        The axis the window runs along.

    Examples
    --------
    >>> import dask.array as da
    >>> moving_mean(da.from_array([0.0, 3.0, 6.0, 9.0, 12.0], chunks=2), 3).compute()
    array([ 1.,  3.,  6.,  9., 11.])
    """
    ndimage = _scipy_ndimage("moving_mean")
    x = _as_dask_array(x, 0)
    (axis,) = normalize_axes(axis, x.ndim)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise InvalidArgumentError(f"window={window!r} is not a positive int")
    x, depth = _whole_axis_where_halo_exceeds(x, {axis: int(window) // 2})
    return map_blocks(
        ndimage.uniform_filter1d,
        x,
        depth=depth,
        boundary="reflect",
        dtype=x.dtype,
        size=int(window),
        axis=axis,
        mode="reflect",
    )


@_keeps_labels
def gaussian_filter(x: da.Array | np.ndarray, sigma: float | Sequence[float], truncate: float = 4.0) -> da.Array:
    """Gaussian smoothing, equal to ``scipy.ndimage.gaussian_filter(x, sigma, mode="reflect", truncate=truncate)``.

    Each block gets a halo of the kernel's radius, ``int(truncate * sigma + 0.5)``
    cells per axis, so the result equals scipy's over the whole array in
    memory. The output has ``x``'s dtype, as in scipy. Needs scipy.

    Parameters
    ----------
    x
        The array.
    sigma
        Standard deviation of the Gaussian in cells: one for all axes, or one
        per axis (0 leaves an axis unsmoothed).
    truncate
        The kernel is cut at this many standard deviations.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> from scipy import ndimage
    >>> image = np.eye(4)
    >>> smooth = gaussian_filter(da.from_array(image, chunks=2), 1.0)
    >>> smooth.compute().round(2)
    array([[0.5 , 0.32, 0.13, 0.04],
           [0.32, 0.31, 0.23, 0.13],
           [0.13, 0.23, 0.31, 0.32],
           [0.04, 0.13, 0.32, 0.5 ]])
    >>> np.allclose(smooth.compute(), ndimage.gaussian_filter(image, 1.0, mode="reflect"))
    True
    """
    ndimage = _scipy_ndimage("gaussian_filter")
    x = _as_dask_array(x, 0)
    hint = f"give one non-negative number, or one per axis ({x.ndim} for this array)"
    try:
        per_axis: list[Any] = [sigma] * x.ndim if np.ndim(sigma) == 0 else list(cast(Sequence[float], sigma))
        sigmas = tuple(float(s) for s in per_axis)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"sigma={sigma!r}: {hint}") from exc
    if len(sigmas) != x.ndim or not all(s >= 0 for s in sigmas):
        raise InvalidArgumentError(f"sigma={sigma!r}: {hint}")
    if not truncate > 0:
        raise InvalidArgumentError(f"truncate={truncate!r} must be a positive number of standard deviations")
    radii = {axis: int(truncate * s + 0.5) for axis, s in enumerate(sigmas)}
    x, depth = _whole_axis_where_halo_exceeds(x, radii)
    return map_blocks(
        ndimage.gaussian_filter,
        x,
        depth=depth,
        boundary="reflect",
        dtype=x.dtype,
        sigma=sigmas,
        truncate=float(truncate),
        mode="reflect",
    )


def _whole_axis_where_halo_exceeds(x: da.Array, depth: dict[int, int]) -> tuple[da.Array, dict[int, int]]:
    """One chunk, and no halo, along axes where the filter reaches further than the array is long.

    A halo cannot be wider than the array, but scipy mirrors as often as its
    window needs: with the whole axis in each block, scipy's own edge handling
    gives its in-memory answer.
    """
    whole = [axis for axis, d in depth.items() if d > x.shape[axis]]
    if not whole:
        return x, depth
    return x.rechunk(dict.fromkeys(whole, -1)), {a: (0 if a in whole else d) for a, d in depth.items()}


def _scipy_ndimage(caller: str) -> Any:
    return optional_import("scipy.ndimage", package="scipy", needed_for=caller, extra="scipy")
