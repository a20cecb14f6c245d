"""``describe``: count, NaN count, mean, std, min, max (quartiles, a histogram) in one pass over the data.

Each chunk is read once and every statistic is taken from it while it is in
memory; partial results merge pairwise (Chan's formula for mean and variance),
in a tree as wide as the memory budget allows. Of an array read in spans
(many chunks per block), each block's statistics are taken piece by piece
and merged as they come.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask._task_spec import Task, TaskRef
from dask.base import tokenize
from dask.delayed import Delayed

from daskstream.compute.description import Description, LazyDescription
from daskstream.compute.histograms import edges_of_data_range, known_bin_edges
from daskstream.compute.moments import chunk_moments, merge_moments
from daskstream.compute.partials import combine_fan_in
from daskstream.compute.quantiles import nanquantile
from daskstream.compute.streaming.span_steps import streaming_tasks, streams_spans
from daskstream.compute.streaming.spans import fold_pieces, is_span
from daskstream.errors import UnsupportedDtypeError
from daskstream.graph.layers import span_reads
from daskstream.graph.rewrites import clone_array
from daskstream.planning.grid import normalize_axes
from daskstream.planning.settings import Resources
from daskstream.runtime.resources import refuse_unbuildable, resources_for

STATISTICS = ("count", "nan_count", "mean", "std", "min", "max")


def describe(
    x: Any,
    axis: int | Sequence[int] | None = None,
    bins: int | Sequence[float] | None = None,
    *,
    range: tuple[float, float] | None = None,
    ddof: int = 0,
    quartiles: bool = False,
    split_every: int | None = None,
    memory_budget: int | str | None = None,
    name: str | None = None,
) -> LazyDescription:
    """Count, NaN count, mean, std, min and max of ``x`` (and quartiles, a histogram), in one pass.

    Parameters
    ----------
    x
        A dask array of numbers. Of complex numbers, ``mean``, ``min`` and
        ``max`` are complex (the extremes in numpy's order: by real part, then
        imaginary) and ``std`` is real, as numpy gives them; an element with
        NaN in either part is a NaN.
    axis
        ``None`` for one set of statistics over everything, or the axes to reduce.
    bins
        A histogram too: a bin count or the bin edges, as for ``op="histogram"``
        of :func:`daskstream.reduce`. A count without ``range`` spreads the bins
        over the data's least and largest values (NaN left out, as from every
        statistic here), found by the statistics' pass: the counts take a second
        pass.
    range
        ``(low, high)`` for ``bins`` given as a count; the edges follow ``numpy.histogram``.
    ddof
        Delta degrees of freedom of ``std``.
    quartiles
        Also the 25th, 50th and 75th percentiles (keys ``"25%"``, ``"50%"``,
        ``"75%"``), of the values that are not NaN, each exactly as
        ``numpy.nanquantile(x, 0.25)`` (and so on) gives it, in the data's
        float dtype (float16 stays float16): by the exact quantile machinery of
        :func:`daskstream.reduce`, in the same computation. Over all axes that
        takes its own passes (2 for 8- to 32-bit data, 4 for 64-bit) beside
        the statistics' pass; along axes, one pass over the data rechunked to
        whole columns.
    split_every
        Fan-in of the merge tree; by default as wide as the memory budget allows.
    memory_budget
        Bytes a worker may use; default: the budget ``x`` was opened with, else
        as for :func:`daskstream.plan_chunks`.
    name
        What the description calls the array (:func:`daskstream.describe` gives a
        source's name).

    Returns
    -------
    LazyDescription
        ``.compute()`` gives a :class:`Description`. NaNs are left out of every
        statistic but ``nan_count``; with no values left, mean, std, min and max are NaN.

    Notes
    -----
    Speed and precision: a float chunk reduced whole is summed in one pass by a
    numba kernel when numba is installed (``pip install 'daskstream[fast]'``):
    deviations from a shift near the data, accumulated in float64. Without
    numba, numpy sums rows of 1024 values in the data's dtype (pairwise) and
    the row sums in float64, over a few passes. Either way a large offset
    costs nothing. With numba, results agree with numpy's float64 answers to
    about 1e-12 relative; without it, to about 1e-7 of the data's spread
    (its standard deviation) for float32 data.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> x = da.from_array(np.array([1.0, 2.0, np.nan, 5.0]), chunks=2)
    >>> d = describe(x).compute()
    >>> int(d["count"]), int(d["nan_count"]), float(d["mean"]), float(d["max"])
    (3, 1, 2.6666666666666665, 5.0)
    """
    x = da.asarray(x)
    if x.dtype.kind not in "biufc":
        raise UnsupportedDtypeError(
            f"describe needs numbers (integer, float or complex); dtype {x.dtype} is not one of them"
        )
    if x.dtype.kind == "c" and bins is not None:
        raise UnsupportedDtypeError(
            f"a histogram of complex numbers (dtype {x.dtype}) has no bins numpy defines: describe abs(x), "
            "x.real or x.imag with bins, or leave bins out"
        )
    if quartiles and x.dtype.kind not in "iuf":
        raise UnsupportedDtypeError(
            f"quartiles of dtype {x.dtype} are not defined (numpy refuses them too): describe without quartiles"
        )
    axes = tuple(builtins.range(x.ndim)) if axis is None else normalize_axes(axis, x.ndim)
    resources = resources_for(x, memory_budget=memory_budget)
    refuse_unbuildable(x, resources)
    edges = histogram_edges(x.dtype, bins, range, resources=resources)
    fan_in = split_every or combine_fan_in(
        x, axes, partial_itemsize=8 * (5 + (0 if edges is None else len(edges))), resources=resources
    )
    whole = statistics_of(x, axes, edges, fan_in)
    if bins is not None and edges is None:
        # A bin count without a range: the statistics' pass finds the range, a second pass counts. The
        # second reads a clone of the data, so that no chunk of the first waits in memory for the range.
        assert isinstance(bins, (int, np.integer))  # known_bin_edges leaves only a bin count's edges unknown
        edges = dask.delayed(_edges_of_described_range, pure=True)(whole, int(bins), x.dtype)
        counted = _fanned(clone_array(x, seed=1), axes, fan_in, edges)
        whole = dask.delayed(_with_histogram, pure=True)(whole, counted)
    quartile_values = None
    if quartiles:
        # Each quartile as numpy.nanquantile gives it asked alone ("25%" is nanquantile(x, 0.25)), in the
        # data's float dtype, the three found in the same passes.
        quartile_values = nanquantile(x, list(QUARTILES.values()), axis=axes, resources=resources, each_alone=True)
    facts = {"name": name, "shape": tuple(int(n) for n in x.shape), "dtype": x.dtype, "axes": axes}
    finished = dask.delayed(finish, pure=True)(whole, axes, edges, ddof, x.dtype, quartile_values, facts)
    return LazyDescription(finished, n_chunks=math.prod(x.numblocks))


# The quartiles describe gives, by key.
QUARTILES = {"25%": 0.25, "50%": 0.5, "75%": 0.75}


def _edges_of_described_range(whole: dict[str, np.ndarray], bins: int, dtype: np.dtype) -> np.ndarray:
    """numpy's edges for ``bins`` over the least and largest values the statistics found (NaN left out)."""
    valid = whole["n"] > 0
    if not valid.any():
        # No values: numpy's histogram of an empty array spreads the bins over [0, 1].
        return np.histogram_bin_edges(np.empty(0, dtype=dtype), bins)
    extremes = np.array([np.min(whole["min"][valid]), np.max(whole["max"][valid])], dtype=whole["min"].dtype)
    return edges_of_data_range(extremes, bins)


def _fanned(x: da.Array, axes: tuple[int, ...], fan_in: int, edges: Any) -> Any:
    """Each chunk's histogram counts (only those), merged over ``axes`` as the statistics are."""
    return _merged_over(x, axes, fan_in, chunk_histogram, _merge_histograms, edges)


def chunk_histogram(block: np.ndarray, axes: tuple[int, ...], edges: np.ndarray) -> dict[str, np.ndarray]:
    values = block.astype(np.float64) if block.dtype.kind == "b" else block
    out_shape = tuple(1 if a in axes else n for a, n in enumerate(values.shape))
    kept_shape = tuple(n for a, n in enumerate(values.shape) if a not in axes)
    return {"hist": _bin_counts(values, edges, kept_shape, axes).reshape((*out_shape, len(edges) - 1))}


def _merge_histograms(parts: list[dict[str, np.ndarray]], axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {"hist": np.sum(np.concatenate([p["hist"] for p in parts], axis=axes[0]), axis=axes[0], keepdims=True)}


def _with_histogram(whole: dict[str, np.ndarray], counted: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**whole, "hist": counted["hist"]}


def statistics_of(x: da.Array, axes: tuple[int, ...], edges: np.ndarray | None, fan_in: int) -> Any:
    """The merged partial statistics of ``x`` over ``axes`` (kept dims), lazily: a ``dask.delayed`` dict.

    ``n``, ``nan``, ``mean``, ``m2``, ``min``, ``max`` (and ``hist`` with
    ``edges``), each laid out over the kept axes; :func:`finish` turns them
    into a :class:`Description`. Pieces of an array along a reduced axis merge
    with :func:`merge_statistics`; along a kept axis they lie side by side.
    """
    return _merged_over(x, axes, fan_in, chunk_statistics, merge_statistics, edges)


def _merged_over(x: da.Array, axes: tuple[int, ...], fan_in: int, of_chunk: Any, merging: Any, edges: Any) -> Any:
    """``of_chunk(block, axes, edges)`` of every chunk, merged over ``axes`` by ``merging(parts, axes)`` and
    laid out over the kept axes."""
    if span_reads(x.dask):
        partials = _span_partials(x, axes, of_chunk, merging, edges)
    else:
        partial = dask.delayed(of_chunk, pure=True)
        blocks = x.to_delayed(optimize_graph=True)
        partials = {index: partial(blocks[index], axes, edges) for index in np.ndindex(*x.numblocks)}
    kept = [a for a in builtins.range(x.ndim) if a not in axes]
    # Group the chunks by their position along the kept axes; each group is reduced on its own.
    groups: dict[tuple[int, ...], list[Any]] = {}
    for index in itertools.product(*(builtins.range(n) for n in x.numblocks)):
        key = tuple(index[a] for a in kept)
        groups.setdefault(key, []).append(partials[index])
    merge = dask.delayed(merging, pure=True)
    reduced = {key: _tree(parts, merge, axes, fan_in) for key, parts in groups.items()}
    grid = [n for a, n in enumerate(x.numblocks) if a in kept]
    return dask.delayed(_gather, pure=True)(
        [reduced[key] for key in itertools.product(*(builtins.range(n) for n in grid))], grid, axes
    )


def _span_partials(x: da.Array, axes: tuple[int, ...], of_chunk: Any, merging: Any, edges: Any) -> dict[Any, Any]:
    """``of_chunk`` of each block of ``x`` read in spans (many chunks per block), by block index: each span
    streamed piece by piece (:func:`of_pieces`), lazily."""
    name = f"describe-spans-{tokenize(x.name, axes, of_chunk, merging, edges)}"
    collections: list[Any] = [x]
    given = edges
    if isinstance(edges, Delayed):  # edges the data decide: computed first, taken by every task
        collections.append(edges)
        given = TaskRef(edges.key)
    tasks = {
        (name, *index): Task((name, *index), of_pieces, TaskRef((x.name, *index)), axes, of_chunk, merging, given)
        for index in np.ndindex(*x.numblocks)
    }
    partials = streaming_tasks(name, tasks, collections, x.numblocks).to_delayed(optimize_graph=True)
    return {index: partials[index] for index in np.ndindex(*x.numblocks)}


@streams_spans
def of_pieces(block: Any, axes: tuple[int, ...], of_chunk: Any, merging: Any, edges: Any) -> Any:
    """``of_chunk(block, axes, edges)``, of a span piece by piece, merged along ``axes`` by ``merging``."""
    if not is_span(block):
        return of_chunk(block, axes, edges)
    return fold_pieces(block, axes, lambda piece: of_chunk(piece, axes, edges), lambda parts: merging(parts, axes))


def histogram_edges(dtype: np.dtype, bins: Any, bin_range: Any, *, resources: Resources) -> np.ndarray | None:
    """The histogram's edges where they are known before reading: ``None`` without bins, or for a bin count
    without a range (the data's range decides them). Checked against the budget before numpy allocates them."""
    if bins is None:
        return None
    return known_bin_edges(bins, bin_range, dtype, resources=resources)


def _tree(parts: list[Any], merge: Any, axes: tuple[int, ...], fan_in: int) -> Any:
    while len(parts) > 1:
        parts = [merge(parts[i : i + fan_in], axes) for i in builtins.range(0, len(parts), fan_in)]
    return parts[0]


def _bin_counts(values: np.ndarray, edges: np.ndarray, out_shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """Per kept position, counts in each bin, with numpy.histogram's rule (last bin closed)."""
    kept = [a for a in builtins.range(values.ndim) if a not in axes]
    moved = np.moveaxis(values, kept, list(builtins.range(len(kept)))).reshape(math.prod(out_shape), -1)
    nbins = len(edges) - 1
    index = np.searchsorted(edges, moved, side="right") - 1
    index[moved == edges[-1]] = nbins - 1
    inside = (moved >= edges[0]) & (moved <= edges[-1])
    rows = np.broadcast_to(np.arange(moved.shape[0])[:, None], moved.shape)
    flat = np.bincount((rows[inside] * nbins + index[inside]).ravel(), minlength=moved.shape[0] * nbins)
    return flat.reshape((*out_shape, nbins))


def chunk_statistics(block: np.ndarray, axes: tuple[int, ...], edges: np.ndarray | None) -> dict[str, np.ndarray]:
    if block.dtype.kind == "c":
        return _complex_statistics(block, axes)
    values = block.astype(np.float64) if block.dtype.kind == "b" else block
    stats = _finite_float_statistics(values) if len(axes) == values.ndim and values.dtype.kind == "f" else None
    if stats is None:
        stats = _masked_statistics(values, axes)
    if edges is not None:
        out_shape = tuple(1 if a in axes else n for a, n in enumerate(values.shape))
        kept_shape = tuple(n for a, n in enumerate(values.shape) if a not in axes)
        stats["hist"] = _bin_counts(values, edges, kept_shape, axes).reshape((*out_shape, len(edges) - 1))
    return stats


# Values summed together in the data's own precision before the partial sums go to float64.
_ROW = 1024


def _sums_of_rows(flat: np.ndarray) -> float:
    """Sum in float64 of pairwise sums of rows of 1024 values in the data's dtype.

    Each row's pairwise sum errs by at most about 10 units in the last place of
    the row's absolute sum, and float64 carries the rest: float64 accuracy for
    all practical purposes, at the speed of a float32 sum rather than a cast.
    """
    whole = flat.size - flat.size % _ROW
    rows = flat[:whole].reshape(-1, _ROW).sum(axis=1)
    return float(np.sum(rows, dtype=np.float64) + np.sum(flat[whole:], dtype=np.float64))


@functools.cache
def _compiled_shifted_sums() -> Any:
    """numba's one-pass kernel when numba is installed, else ``None`` (numpy takes a few passes)."""
    try:
        from daskstream.compute.fused import shifted_sums
    except ImportError:
        return None
    return shifted_sums


def _finite_float_statistics(block: np.ndarray, *, compiled: bool = True) -> dict[str, np.ndarray] | None:
    """Statistics of a whole float chunk in a few vectorised passes; ``None`` if it holds NaN or inf."""
    flat = block.reshape(-1)
    n = flat.size
    if n == 0 or flat.dtype not in (np.float32, np.float64):
        return None  # half precision squares overflow: the float64 masked path takes it
    kernel = _compiled_shifted_sums() if compiled else None
    if kernel is not None:
        # Deviations from a shift near the data, summed in float64: a large offset costs nothing.
        shift = float(np.mean(flat[:_ROW], dtype=np.float64))
        deviation_sum, deviation_squares = kernel(flat, shift)
        if not (np.isfinite(deviation_sum) and np.isfinite(deviation_squares)):
            return None  # NaN or inf inside: the masked path handles them
        mean = shift + deviation_sum / n
        m2 = deviation_squares - deviation_sum * deviation_sum / n
    else:
        total = _sums_of_rows(flat)
        if not np.isfinite(total):
            return None
        # Deviations from a shift near the mean, in the data's dtype: the subtraction is exact for values
        # near the shift, so their small sums fix the mean and M2 whatever the offset.
        shift = flat.dtype.type(total / n)
        deviations = np.subtract(flat, shift)
        deviation_sum = _sums_of_rows(deviations)
        np.square(deviations, out=deviations)
        mean = float(shift) + deviation_sum / n
        m2 = _sums_of_rows(deviations) - deviation_sum * deviation_sum / n
    if not np.isfinite(m2):
        return None  # squares past the dtype's range: the float64 masked path takes it
    shape = (1,) * block.ndim
    return {
        "n": np.full(shape, n, dtype="i8"),
        "mean": np.full(shape, mean),
        "m2": np.full(shape, max(m2, 0.0)),
        "nan": np.zeros(shape, dtype="i8"),
        "min": np.full(shape, flat.min()),
        "max": np.full(shape, flat.max()),
    }


def _masked_statistics(values: np.ndarray, axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    skipna = values.dtype.kind == "f"
    stats = chunk_moments(values, axes, skipna=skipna)
    valid = ~np.isnan(values) if skipna else np.ones(values.shape, dtype=bool)
    stats["nan"] = np.sum(~valid, axis=axes, keepdims=True, dtype="i8")
    low, high = _extremes(values.dtype)
    stats["min"] = np.min(values, axis=axes, keepdims=True, where=valid, initial=high)
    stats["max"] = np.max(values, axis=axes, keepdims=True, where=valid, initial=low)
    return stats


def _complex_statistics(values: np.ndarray, axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The moments of the real and imaginary parts over the same elements, and numpy's complex extremes.

    An element with NaN in either part is left out of both (a NaN, counted
    once), so ``std`` is numpy's: the root of the two parts' variances added.
    """
    nan = np.isnan(values)  # True where either part is NaN
    real = np.where(nan, np.nan, values.real)
    imag = np.where(nan, np.nan, values.imag)
    stats = chunk_moments(real, axes, skipna=True)
    imaginary = chunk_moments(imag, axes, skipna=True)
    stats["mean_imag"], stats["m2_imag"] = imaginary["mean"], imaginary["m2"]
    stats["nan"] = np.sum(nan, axis=axes, keepdims=True, dtype="i8")
    low, high = _extremes(values.dtype)
    stats["min"] = np.min(values, axis=axes, keepdims=True, where=~nan, initial=high)
    stats["max"] = np.max(values, axis=axes, keepdims=True, where=~nan, initial=low)
    return stats


def _extremes(dtype: np.dtype) -> tuple[Any, Any]:
    if dtype.kind == "c":  # past every number in numpy's order of complex numbers (real part first)
        return complex(-np.inf, -np.inf), complex(np.inf, np.inf)
    if dtype.kind == "f":
        return -np.inf, np.inf
    info = np.iinfo(dtype)
    return info.min, info.max


def merge_statistics(parts: list[dict[str, np.ndarray]], axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    # Lay the partials side by side along the first reduced axis, then merge along it.
    along = axes[:1]
    stacked = {k: np.concatenate([p[k] for p in parts], axis=along[0]) for k in parts[0]}
    merged = merge_moments({k: stacked[k] for k in ("n", "mean", "m2")}, along)
    if "mean_imag" in stacked:  # complex data: the imaginary parts' moments, over the same elements
        imaginary = merge_moments({"n": stacked["n"], "mean": stacked["mean_imag"], "m2": stacked["m2_imag"]}, along)
        merged["mean_imag"], merged["m2_imag"] = imaginary["mean"], imaginary["m2"]
    merged["nan"] = np.sum(stacked["nan"], axis=along, keepdims=True)
    merged["min"] = np.min(stacked["min"], axis=along, keepdims=True)
    merged["max"] = np.max(stacked["max"], axis=along, keepdims=True)
    if "hist" in stacked:
        merged["hist"] = np.sum(stacked["hist"], axis=along, keepdims=True)
    return merged


def _gather(reduced: list[dict[str, np.ndarray]], grid: list[int], axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The groups' statistics reassembled over the kept axes, in block order."""
    return {k: _assemble([r[k] for r in reduced], grid, axes) for k in reduced[0]}


def finish(
    whole: dict[str, np.ndarray],
    axes: tuple[int, ...],
    edges: np.ndarray | None,
    ddof: int,
    dtype: np.dtype,
    quartile_values: np.ndarray | None = None,
    facts: dict[str, Any] | None = None,
) -> Description:
    """The :class:`Description` from merged statistics (see :func:`statistics_of`), and the quartiles."""
    n = whole["n"]
    empty = n == 0
    complex_data = "mean_imag" in whole
    # Of complex data the variance is the parts' variances added, and the mean has both parts.
    m2 = whole["m2"] + whole["m2_imag"] if complex_data else whole["m2"]
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(m2 / np.maximum(n - ddof, 0))
    # NaN where no degree of freedom is left, as numpy.nanstd gives it (numpy.std would divide by zero).
    std = np.where(n - ddof > 0, std, np.nan)
    mean = whole["mean"] + 1j * whole["mean_imag"] if complex_data else whole["mean"]
    mean = np.where(empty, np.nan, mean)
    low = np.where(empty, np.nan, whole["min"]) if empty.any() else whole["min"]
    high = np.where(empty, np.nan, whole["max"]) if empty.any() else whole["max"]
    as_found = empty.any() or dtype.kind in "fc"  # integers' extremes go back to the data's dtype
    values = {
        "count": _squeeze(n, axes),
        "nan_count": _squeeze(whole["nan"], axes),
        "mean": _squeeze(mean, axes),
        "std": _squeeze(np.where(empty, np.nan, std), axes),
        "min": _squeeze(low, axes) if as_found else _squeeze(low, axes).astype(dtype),
    }
    if quartile_values is not None:
        for key, value in zip(QUARTILES, quartile_values):
            values[key] = value[()] if np.ndim(value) == 0 else value
    values["max"] = _squeeze(high, axes) if as_found else _squeeze(high, axes).astype(dtype)
    if edges is not None:
        counts = whole["hist"]
        values["histogram"] = counts.reshape(
            tuple(n for a, n in enumerate(counts.shape[:-1]) if a not in axes) + counts.shape[-1:]
        )
        values["bin_edges"] = edges
    return Description(values, **(facts or {}))


def _assemble(pieces: list[np.ndarray], grid: list[int], axes: tuple[int, ...]) -> np.ndarray:
    if not grid:
        return pieces[0]
    ndim = len(grid) + len(axes)  # a histogram's extra bins axis, last, is never concatenated
    kept = [a for a in builtins.range(ndim) if a not in axes]
    nested: Any = np.empty(grid, dtype=object)
    for flat_index, piece in enumerate(pieces):
        nested[np.unravel_index(flat_index, grid)] = piece
    # Concatenate along each kept axis in turn, innermost grid axis first.
    for depth in reversed(builtins.range(len(grid))):
        axis = kept[depth]
        merged = np.empty(nested.shape[:-1], dtype=object)
        for index in itertools.product(*(builtins.range(n) for n in nested.shape[:-1])):
            merged[index] = np.concatenate(list(nested[index]), axis=axis)
        nested = merged
    return nested[()]


def _squeeze(value: np.ndarray, axes: tuple[int, ...]) -> Any:
    out = np.squeeze(value, axis=axes)
    return out[()] if out.ndim == 0 else out
