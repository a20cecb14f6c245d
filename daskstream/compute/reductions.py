"""Out-of-core reductions: one entry point, float64 accumulation, budget-sized combine trees.

(Longer than most modules: one entry point dispatches every operation, and the
moment and histogram partials it combines share their checks and combine
logic; split, each would need the others.)

Every function here is lazy: it returns dask arrays and reads nothing until
computed.
"""

from __future__ import annotations

import builtins
import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.utils import deepmap

from daskstream.compute.partials import combine_fan_in, per_chunk_rows, sum_rows
from daskstream.compute.quantiles import order_statistic
from daskstream.errors import (
    InvalidArgumentError,
    MemoryBudgetError,
    UnknownOperationError,
    UnsupportedDtypeError,
    shown,
)
from daskstream.graph.pieces import PIECE_VALUES
from daskstream.planning.budget import format_size
from daskstream.planning.grid import normalize_axes
from daskstream.planning.settings import Resources
from daskstream.runtime.resources import resources_for

_ACCUMULATING = {"sum", "mean", "prod", "nansum", "nanmean"}
_MOMENTS = {"var", "std", "nanvar", "nanstd"}


def reduce(
    x: Any,
    op: str,
    axis: int | Sequence[int] | None = None,
    *,
    dtype: Any = None,
    ddof: int = 0,
    q: float | Sequence[float] | None = None,
    bins: int | Sequence[float] = 10,
    range: tuple[float, float] | None = None,
    keepdims: bool = False,
    split_every: int | None = None,
    memory_budget: int | str | None = None,
) -> Any:
    """Reduce ``x`` with ``op`` over ``axis``, lazily.

    Parameters
    ----------
    x
        A dask array (e.g. from :func:`daskstream.open`) or anything ``dask.array.asarray`` takes.
    op
        One of :data:`OPERATIONS`.
    axis
        ``None`` (all axes), an int or a tuple of ints; negative axes count from the end.
    dtype
        Accumulation dtype for sum, mean, prod and their nan-variants. Float inputs
        accumulate in float64 (complex in complex128) unless this says otherwise.
    ddof
        Delta degrees of freedom for var, std and their nan-variants.
    q
        Quantile(s) in [0, 1] for ``op="quantile"``.
    bins, range
        For ``op="histogram"``: bin count or edges, and the range (computed from the
        data, in an extra pass, when ``bins`` is a count and ``range`` is not given).
    keepdims
        Keep reduced axes with length one.
    split_every
        Fan-in of the combine tree; by default as wide as the memory budget allows
        for the size of the partial results.
    memory_budget
        Bytes a worker may use; default: the budget ``x`` was opened with, else
        as for :func:`daskstream.plan_chunks`.

    Returns
    -------
    dask.array.Array
        For ``histogram``, a pair ``(counts, edges)`` of dask arrays.

    Raises
    ------
    UnknownOperationError
        For an ``op`` not in :data:`OPERATIONS` (the message lists them).
    InvalidAxisError
        For an axis outside the array.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> x = da.from_array(np.arange(12, dtype="f4").reshape(3, 4), chunks=2)
    >>> reduce(x, "mean", axis=0).compute()
    array([4., 5., 6., 7.])
    >>> float(reduce(x, "var", ddof=1).compute())
    13.0
    """
    x = da.asarray(x)
    if op not in OPERATIONS:
        raise UnknownOperationError(f"unknown reduction {op!r}; choose one of: {', '.join(sorted(OPERATIONS))}")
    if op != "histogram":  # (a histogram says what it counts itself)
        refuse_unreducible(op, x.dtype)
    axes = tuple(builtins.range(x.ndim)) if axis is None else normalize_axes(axis, x.ndim)
    if op == "histogram" and axis is not None:
        raise InvalidArgumentError('op="histogram" counts all values, as numpy.histogram does; give no axis')
    if op == "quantile" and q is None:
        raise InvalidArgumentError('op="quantile" needs q=, a number or a sequence of numbers in [0, 1]')
    resources = resources_for(x, memory_budget=memory_budget)
    if op == "histogram":
        return histogram_of(x, bins=bins, range=range, split_every=split_every, resources=resources)
    if op in ("median", "quantile"):
        median = op == "median"
        return order_statistic(x, 0.5 if median else q, axis, keepdims=keepdims, resources=resources, median=median)
    if x.size == 0:
        return _reduce_empty(x, op, axes, keepdims=keepdims, dtype=dtype, ddof=ddof)
    fan_in = split_every or combine_fan_in(x, axes, partial_itemsize=8 * 3, resources=resources)
    if op in _MOMENTS:
        variance = moments(x, axes, ddof=ddof, skipna=op.startswith("nan"), keepdims=keepdims, split_every=fan_in)
        return da.sqrt(variance) if op.endswith("std") else variance
    kwargs: dict[str, Any] = {"axis": axes, "split_every": fan_in}
    if op != "count_nonzero":
        kwargs["keepdims"] = keepdims
    if op in _ACCUMULATING:
        kwargs["dtype"] = accumulation_dtype(x.dtype, dtype)
    if op in ("argmin", "argmax"):
        return _arg_reduction(x, op, axes, keepdims, fan_in)
    if op == "count_nonzero":
        counted = da.count_nonzero(x, axis=axes)
        return da.expand_dims(counted, axis=axes) if keepdims and axes else counted
    squeeze = x.dtype.kind in "mM" and not keepdims
    if squeeze:
        # Older dask builds the scalar result of a date's extreme from an empty array's
        # sum, which dates do not have; kept axes and a squeeze avoid that step.
        kwargs["keepdims"] = True
    result = da.max(x, **kwargs) - da.min(x, **kwargs) if op == "ptp" else getattr(da, op)(x, **kwargs)
    return result.squeeze(axis=axes) if squeeze else result


def _reduce_empty(x: da.Array, op: str, axes: tuple[int, ...], **kwargs: Any) -> da.Array:
    """An empty array holds nothing to read: numpy's answer for that shape, computed now."""
    empty = np.empty(x.shape, dtype=x.dtype)
    numpy_op = getattr(np, op)
    options: dict[str, Any] = {"axis": axes, "keepdims": kwargs["keepdims"]}
    if op in _ACCUMULATING:
        options["dtype"] = accumulation_dtype(x.dtype, kwargs["dtype"])
    if op in _MOMENTS:
        options["ddof"] = kwargs["ddof"]
        empty = empty.astype("f8")
    if op in ("argmin", "argmax"):
        options["axis"] = None if len(axes) != 1 else axes[0]
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            # numpy warns that the mean of nothing is NaN; the NaN itself says so.
            warnings.simplefilter("ignore", RuntimeWarning)
            answer = numpy_op(empty, **options)
    except ValueError as exc:
        raise InvalidArgumentError(
            f"{op} of an empty array (shape {x.shape}) over axes {axes} has no value: {exc}"
        ) from None
    return da.from_array(np.asarray(answer))


OPERATIONS = frozenset(
    {
        "sum",
        "mean",
        "var",
        "std",
        "min",
        "max",
        "argmin",
        "argmax",
        "prod",
        "any",
        "all",
        "count_nonzero",
        "nansum",
        "nanmean",
        "nanvar",
        "nanstd",
        "nanmin",
        "nanmax",
        "ptp",
        "median",
        "quantile",
        "histogram",
    }
)
"""The reductions :func:`reduce` knows."""


# Beside numbers, which reductions numpy defines for durations and dates (they compare; durations add up).
_ON_DURATIONS = frozenset({"sum", "nansum", "mean", "nanmean", "min", "max", "nanmin", "nanmax", "ptp", "argmin",
                           "argmax", "count_nonzero", "any", "all", "median", "quantile"})  # fmt: skip
_ON_DATES = frozenset({"min", "max", "nanmin", "nanmax", "ptp", "argmin", "argmax", "count_nonzero", "any", "all"})
_KIND_NAMES = {"S": "byte strings", "U": "strings", "V": "records (compound data)", "O": "Python objects",
               "M": "dates", "m": "durations", "T": "strings"}  # fmt: skip


def refuse_unreducible(op: str, dtype: np.dtype) -> None:
    """Refuse ``op`` over data of ``dtype`` it is not defined for (strings, records...), naming both.

    >>> refuse_unreducible("sum", np.dtype("f4"))
    >>> refuse_unreducible("max", np.dtype("S4"))
    Traceback (most recent call last):
    ...
    daskstream.errors.UnsupportedDtypeError: max of byte strings (dtype |S4) is not defined: reduce numbers
    """
    kind = dtype.kind
    if kind in "biufc":
        return
    handled = (kind == "m" and op in _ON_DURATIONS) or (kind == "M" and op in _ON_DATES)
    # numpy takes a string's truth (not empty) from version 2 on: whether this numpy defines it decides.
    handled = handled or (kind in "SUT" and op in ("count_nonzero", "any", "all"))
    if handled and _numpy_defines(op, dtype):
        return
    advice = "reduce numbers"
    if kind == "V" and dtype.names:
        advice = f"reduce one field of the records, e.g. x[{dtype.names[0]!r}]"
    raise UnsupportedDtypeError(
        f"{op} of {_KIND_NAMES.get(kind, f'data of kind {kind!r}')} (dtype {dtype}) is not defined: {advice}"
    )


@functools.lru_cache(maxsize=256)
def _numpy_defines(op: str, dtype: np.dtype) -> bool:
    """Whether this numpy computes ``op`` over ``dtype`` (its answer on a few zeros tells)."""
    probe = np.zeros(3, dtype=dtype)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.quantile(probe, 0.5) if op == "quantile" else getattr(np, op)(probe)
    except (TypeError, ValueError):
        return False
    return True


def accumulation_dtype(dtype: np.dtype, requested: Any = None) -> np.dtype | None:
    """The dtype sums accumulate in: float64 for floats, complex128 for complex, else numpy's default.

    >>> accumulation_dtype(np.dtype("f4"))
    dtype('float64')
    >>> accumulation_dtype(np.dtype("i2")) is None
    True
    """
    if requested is not None:
        return np.dtype(requested)
    if dtype.kind == "f":
        return np.dtype("f8")
    if dtype.kind == "c":
        return np.dtype("c16")
    return None


def _arg_reduction(x: da.Array, op: str, axes: tuple[int, ...], keepdims: bool, fan_in: int) -> da.Array:
    if len(axes) == x.ndim and x.ndim > 1:
        # numpy's argmin/argmax over all axes index the flattened array.
        out = getattr(da, op)(x.reshape(-1), axis=0, split_every=fan_in)
        return out.reshape((1,) * x.ndim) if keepdims else out
    if len(axes) > 1:
        raise InvalidArgumentError(f"{op} takes one axis or None, as in numpy; got axes {axes}")
    axis = axes[0] if axes else None
    return getattr(da, op)(x, axis=axis, split_every=fan_in, keepdims=keepdims)


# ---------------------------------------------------------------------------
# Variance by pairwise (Chan et al.) merging of count, mean and squared deviations.


def moments(
    x: da.Array,
    axes: tuple[int, ...],
    *,
    ddof: int = 0,
    skipna: bool = False,
    keepdims: bool = False,
    split_every: int | None = None,
) -> da.Array:
    """Variance over ``axes``, merging per-chunk (count, mean, M2) with Chan's formula.

    Each chunk's mean is taken first and deviations from it squared, in float64;
    merging groups adds ``n_i (mean_i - mean)^2`` terms rather than subtracting
    large sums of squares, so an offset of 1e9 costs no precision.
    """
    if x.dtype.kind == "c":
        # numpy's variance of complex data is the mean of |z - mean(z)|^2, the sum of the variances of the
        # real and imaginary parts; skipping NaN skips an element whichever part is NaN.
        real, imag = da.real(x), da.imag(x)
        if skipna:
            missing = da.isnan(x)
            real, imag = da.where(missing, np.nan, real), da.where(missing, np.nan, imag)
        options: dict[str, Any] = {"ddof": ddof, "skipna": skipna, "keepdims": keepdims, "split_every": split_every}
        return moments(real, axes, **options) + moments(imag, axes, **options)
    if x.dtype.kind not in "biuf":
        raise UnsupportedDtypeError(f"variance of dtype {x.dtype} is not supported; use a real numeric dtype")
    return da.reduction(
        x,
        chunk=functools.partial(_moments_chunk, skipna=skipna),
        combine=_moments_combine,
        aggregate=functools.partial(_moments_aggregate, ddof=ddof, skipna=skipna),
        axis=axes,
        keepdims=keepdims,
        dtype=np.dtype("f8"),
        split_every=split_every,
        concatenate=False,
        meta=np.empty((0,) * (x.ndim if keepdims else x.ndim - len(axes)), dtype="f8"),
    )


def chunk_moments(block: np.ndarray, axis: tuple[int, ...], skipna: bool) -> dict[str, np.ndarray]:
    """Count, mean and sum of squared deviations of one chunk, kept dims, in float64.

    Worked out piece by piece along the block's longest axis: the float64
    copies and squared deviations of a piece take a few MiB, where those of the
    whole block would take six times its size (the planner counts on three).
    Pieces side by side along a reduced axis are merged with Chan's formula;
    along a kept axis they are laid side by side.
    """
    if block.size <= PIECE_VALUES or block.ndim == 0:
        return _piece_moments(block, axis, skipna)
    longest = max(range(block.ndim), key=block.shape.__getitem__)
    step = max(1, PIECE_VALUES * block.shape[longest] // block.size)
    pieces = [
        chunk_moments(block[(slice(None),) * longest + (slice(start, start + step),)], axis, skipna)
        for start in range(0, block.shape[longest], step)
    ]
    if len(pieces) == 1:
        return pieces[0]
    laid = {key: np.concatenate([piece[key] for piece in pieces], axis=longest) for key in ("n", "mean", "m2")}
    return merge_moments(laid, (longest,)) if longest in axis else laid


def _piece_moments(block: np.ndarray, axis: tuple[int, ...], skipna: bool) -> dict[str, np.ndarray]:
    values = block.astype("f8", copy=False)
    valid = ~np.isnan(values) if skipna else True  # True: every value counts
    n = np.sum(valid, axis=axis, keepdims=True, dtype="i8") if skipna else _count(block, axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.sum(values, axis=axis, keepdims=True, where=valid)
        mean = np.where(n > 0, total / np.maximum(n, 1), 0.0)
        deviation = np.subtract(values, mean)
        m2 = np.sum(deviation * deviation, axis=axis, keepdims=True, where=valid)
    undefined = np.isnan(m2)
    if undefined.any():
        # A NaN from finite values is a sum past float64's range in both directions (inf - inf): their
        # spread is past it too, inf as numpy gives it. A NaN or an infinity among them stays NaN.
        finite = np.all(np.isfinite(values) | ~np.asarray(valid), axis=axis, keepdims=True)
        m2 = np.where(undefined & finite, np.inf, m2)
    return {"n": n, "mean": mean, "m2": m2}


def merge_moments(parts: dict[str, np.ndarray], axis: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Merge groups laid side by side along ``axis`` into one, with Chan's pairwise formula.

    Past float64's range the result is numpy's: a group's ``m2`` is NaN only
    where it holds a NaN or an infinity (numpy's variance of such values is
    NaN), and infinite where its finite values overflowed (numpy's is inf).
    The merge keeps both: a sum of means that overflows (``inf - inf`` in the
    spread) makes the merged ``m2`` infinite, never NaN.

    >>> big = {"n": np.array([2, 3]), "mean": np.array([np.inf, -np.inf]), "m2": np.array([np.inf, np.inf])}
    >>> merge_moments(big, (0,))["m2"]
    array([inf])
    """
    n_parts, mean_parts, m2_parts = parts["n"], parts["mean"], parts["m2"]
    n = np.sum(n_parts, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        weighted = np.sum(n_parts * mean_parts, axis=axis, keepdims=True)
        mean = np.where(n > 0, weighted / np.maximum(n, 1), 0.0)
        spread = n_parts * (mean_parts - mean) ** 2
        # An infinite or NaN mean makes the spread NaN even for empty groups; those contribute nothing.
        spread = np.where(n_parts > 0, spread, 0.0)
        m2 = np.sum(m2_parts, axis=axis, keepdims=True) + np.sum(spread, axis=axis, keepdims=True)
    holds_nan = np.any(np.isnan(m2_parts) & (n_parts > 0), axis=axis, keepdims=True)
    m2 = np.where(np.isnan(m2) & ~holds_nan, np.inf, m2)
    return {"n": n, "mean": mean, "m2": m2}


def _count(block: np.ndarray, axis: tuple[int, ...]) -> np.ndarray:
    shape = [1 if a in axis else n for a, n in enumerate(block.shape)]
    return np.full(shape, math.prod(block.shape[a] for a in axis), dtype="i8")


def _moments_chunk(block, axis, keepdims, skipna=False, computing_meta=False):
    if computing_meta:  # dask probes with an empty array for the output's type
        return block
    return chunk_moments(block, axis, skipna)


def gather_partials(pairs: Any, key: str, axis: tuple[int, ...]) -> np.ndarray:
    """Concatenate one field of nested partial results along the reduced axes (as dask nests them)."""
    return _joined(deepmap(lambda part: part[key], pairs), list(axis))


def _joined(nested: Any, axes: list[int]) -> Any:
    """Partial results nested in lists, one level per axis of ``axes``, joined into one array."""
    if not isinstance(nested, list | tuple) or not axes:
        return nested
    return np.concatenate([_joined(part, axes[1:]) for part in nested], axis=axes[0])


def _merged(pairs: Any, axis: tuple[int, ...], keys: Sequence[str]) -> dict[str, np.ndarray]:
    return merge_moments({k: gather_partials(pairs, k, axis) for k in keys}, axis)


def _moments_combine(pairs, axis, keepdims, computing_meta=False):
    if computing_meta:
        return pairs
    return _merged(pairs, axis, ("n", "mean", "m2"))


def _moments_aggregate(pairs, axis, keepdims, ddof=0, skipna=False, computing_meta=False):
    if computing_meta:
        return np.empty((0,), dtype="f8")
    merged = _merged(pairs, axis, ("n", "mean", "m2"))
    return variance_from(merged, ddof, axis, keepdims, skipna=skipna)


def variance_from(
    merged: dict[str, np.ndarray], ddof: int, axis: tuple[int, ...], keepdims: bool, *, skipna: bool = False
) -> np.ndarray:
    """``m2 / max(n - ddof, 0)``, as numpy divides (NaN or inf where that is zero).

    With ``skipna`` (nanvar, nanstd) NaN wherever ``n - ddof <= 0``, as
    ``numpy.nanvar`` gives it where ``numpy.var`` divides by zero.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        out = merged["m2"] / np.maximum(merged["n"] - ddof, 0)
    if skipna:
        out = np.where(merged["n"] - ddof > 0, out, np.nan)
    return out if keepdims else np.squeeze(out, axis=axis)


# ---------------------------------------------------------------------------
# Histograms.


def histogram(
    x: da.Array,
    *,
    bins: int | Sequence[float] = 10,
    range: tuple[float, float] | None = None,
    split_every: int | None = None,
    memory_budget: int | str | None = None,
) -> tuple[da.Array, Any]:
    """Counts and edges, exactly as ``numpy.histogram`` gives them; lazily.

    Edges follow numpy's rules (``numpy.histogram_bin_edges``, in the data's
    dtype). With a bin count and no ``range``, the range is the data's min and
    max, found in an extra pass, so the edges are a lazy array too.

    ``memory_budget``: as for :func:`reduce`.

    >>> import dask.array as da, numpy as np
    >>> counts, edges = histogram(da.arange(10, chunks=3), bins=5)
    >>> counts.compute().tolist(), np.asarray(edges).tolist()
    ([2, 2, 2, 2, 2], [0.0, 1.8, 3.6, 5.4, 7.2, 9.0])
    """
    x = da.asarray(x)
    return histogram_of(
        x, bins=bins, range=range, split_every=split_every, resources=resources_for(x, memory_budget=memory_budget)
    )


def histogram_of(
    x: da.Array,
    *,
    bins: int | Sequence[float],
    range: tuple[float, float] | None,
    split_every: int | None,
    resources: Resources,
) -> tuple[da.Array, Any]:
    """:func:`histogram` of a dask array ``x`` within ``resources``, resolved by the caller."""
    edges = known_bin_edges(bins, range, x.dtype, empty=x.size == 0, resources=resources)
    if edges is None:
        assert isinstance(bins, (int, np.integer))  # known_bin_edges leaves only a bin count's edges unknown
        fan_in = split_every or combine_fan_in(
            x, tuple(builtins.range(x.ndim)), partial_itemsize=8, resources=resources
        )
        extremes = da.stack([da.min(x, split_every=fan_in), da.max(x, split_every=fan_in)]).rechunk(2)
        edge_dtype = _edge_dtype(x.dtype)
        edges = extremes.map_blocks(
            edges_of_data_range,
            int(bins),
            dtype=edge_dtype,
            chunks=((int(bins) + 1,),),
            meta=np.empty(0, dtype=edge_dtype),
        )
    # One row of counts per chunk, in place of the chunk (no reshape, so no rechunk), summed down.
    rows = per_chunk_rows(x, _chunk_counts, len(edges) - 1, edges=edges)
    return sum_rows(rows, split_every=split_every, resources=resources), edges


def known_bin_edges(
    bins: Any,
    bin_range: tuple[float, float] | None,
    dtype: np.dtype,
    *,
    resources: Resources,
    empty: bool = False,
) -> np.ndarray | None:
    """Histogram edges that are known before reading, by numpy's rules; ``None`` for a bare count.

    Explicit edges are checked; a count with a range (or over no data at all) gives
    ``numpy.histogram_bin_edges`` in the data's dtype. A count without a range needs
    the data's min and max, so the caller decides.

    Parameters
    ----------
    bins
        A positive bin count, or the edges (at least two, increasing, finite).
    bin_range
        ``(low, high)`` for a bin count: finite, ``low <= high``; ignored with edges, as numpy does.
    dtype
        The data's dtype; the edges are in numpy's dtype for it.
    resources
        The budget a bin count is checked against (see :func:`check_bin_count`).
    empty
        Whether there is no data, so that a count without a range takes numpy's ``(0, 1)``.

    Returns
    -------
    numpy.ndarray or None
        The edges, or ``None`` when they depend on the data's range.

    Raises
    ------
    UnsupportedDtypeError
        For data that are not numbers (strings, dates...).
    InvalidArgumentError
        For bins that are neither a positive int nor increasing finite edges, for a range
        that is not two finite numbers with ``low <= high``, and for more bins than the
        range can be cut into in the edges' dtype.
    MemoryBudgetError
        For a bin count whose edges and counts do not fit one task's share of the memory
        budget; checked before anything is allocated.

    Examples
    --------
    >>> resources = Resources(2**30, threads=4, workers=1, origin="arguments")
    >>> known_bin_edges(4, (0, 1), np.dtype("f8"), resources=resources).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    >>> known_bin_edges(4, None, np.dtype("f8"), resources=resources) is None
    True
    """
    if np.dtype(dtype).kind not in "biufc":
        raise UnsupportedDtypeError(f"a histogram counts numbers; dtype {dtype} is not supported")
    if np.ndim(bins) == 1:
        return _checked_edges(bins)
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise InvalidArgumentError(f"bins={shown(bins)} must be a positive int or a sequence of edges")
    count = int(bins)
    check_bin_count(count, dtype, resources=resources)
    if bin_range is not None:
        bin_range = _checked_range(bin_range)
    if bin_range is None and not empty:
        return None
    try:
        # An overflow to inf shows as edges that do not increase, which numpy refuses below.
        with np.errstate(over="ignore", invalid="ignore"):
            return _increasing(np.histogram_bin_edges(np.empty(0, dtype=dtype), count, range=bin_range))
    except ValueError:  # "Too many bins for data range"
        edge_dtype = _edge_dtype(dtype)
        raise InvalidArgumentError(
            f"bins={count} over range={bin_range!r} do not make increasing {edge_dtype} edges (the data's dtype "
            f"is {dtype}): the range is too narrow for that many bins, or beyond what {edge_dtype} holds; "
            "give fewer bins or another range"
        ) from None


def check_bin_count(bins: int, dtype: np.dtype, *, resources: Resources) -> None:
    """Refuse a bin count whose edges and one row of counts do not fit a task's share of the budget.

    Every task that counts holds all the edges and a row of int64 counts, so a
    count too large for the budget is refused here, before numpy is asked to
    allocate them (which would fail with a bare ``MemoryError``, or a
    ``ValueError`` past numpy's largest array).

    Parameters
    ----------
    bins
        The number of bins.
    dtype
        The data's dtype, which decides the edges' dtype.
    resources
        The budget and threads of the place the counting runs.

    Raises
    ------
    MemoryBudgetError
        Naming the bins, the bytes they need and the share of the budget.

    Examples
    --------
    >>> resources = Resources(2**30, threads=4, workers=1, origin="arguments")
    >>> check_bin_count(10**6, np.dtype("f8"), resources=resources)
    >>> check_bin_count(10**9, np.dtype("f8"), resources=resources)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskstream.errors.MemoryBudgetError: bins=1000000000 needs 14.90 GiB in every task that counts ...
    """
    edge_bytes = (bins + 1) * _edge_dtype(dtype).itemsize
    count_bytes = bins * np.dtype("i8").itemsize
    if edge_bytes + count_bytes <= resources.per_task_bytes:
        return
    raise MemoryBudgetError(
        f"bins={shown(bins)} needs {_bytes(edge_bytes + count_bytes)} in every task that counts "
        f"({_bytes(edge_bytes)} of edges and {_bytes(count_bytes)} of counts), more than the "
        f"{format_size(resources.per_task_bytes)} one task may hold (memory_budget="
        f"{format_size(resources.memory_budget)} shared by {resources.threads} thread(s)); give fewer bins"
        " or a larger memory_budget"
    )


def _checked_edges(bins: Any) -> np.ndarray:
    """Explicit bin edges, as numpy.histogram takes them, or a clear error."""
    edges = np.asarray(bins)
    hint = "give at least two increasing, finite numbers, e.g. bins=[0, 0.5, 1]"
    if edges.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"bins={shown(bins)}: edges must be numbers; {hint}")
    # Compared, not differenced: a difference of unsigned edges wraps around instead of going negative.
    if edges.size < 2 or np.any(edges[1:] < edges[:-1]):
        raise InvalidArgumentError(f"bins={shown(bins)}: edges must be at least two, increasing; {hint}")
    if edges.dtype.kind == "f" and not np.all(np.isfinite(edges)):
        raise InvalidArgumentError(f"bins={shown(bins)}: edges must be finite; {hint}")
    return edges


def _checked_range(bin_range: Any) -> tuple[float, float]:
    """``(low, high)`` as two finite floats with ``low <= high``, or a clear error."""
    hint = "give range=(low, high) with finite numbers and low <= high, e.g. range=(0, 1)"
    try:
        low, high = (float(value) for value in bin_range)
    except OverflowError:  # an int beyond any float
        raise InvalidArgumentError(f"range={shown(bin_range)} must be finite; {hint}") from None
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"range={shown(bin_range)} is not two numbers; {hint}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise InvalidArgumentError(f"range={shown(bin_range)} must be finite; {hint}")
    if low > high:
        raise InvalidArgumentError(f"range={shown(bin_range)}: the first value must not exceed the second; {hint}")
    if not math.isfinite(high - low):
        raise InvalidArgumentError(
            f"range={shown(bin_range)} is wider than the largest float64 ({np.finfo('f8').max:g}); {hint}"
        )
    return low, high


def edges_of_data_range(extremes: np.ndarray, bins: int) -> np.ndarray:
    """numpy's edges for ``bins`` over the data's ``[min, max]``, found by reading it."""
    low, high = extremes
    if not np.all(np.isfinite(extremes)):
        raise InvalidArgumentError(
            f"the data's range [{low}, {high}] is not finite (it holds inf or NaN), so bins={bins} cannot be "
            "spread over it; give range=(low, high)"
        )
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return _increasing(np.histogram_bin_edges(extremes, bins))
    except ValueError:  # "Too many bins for data range"
        raise InvalidArgumentError(
            f"bins={bins} over the data's range [{low}, {high}] do not make increasing "
            f"{_edge_dtype(extremes.dtype)} edges; give fewer bins, or range=(low, high)"
        ) from None


def _increasing(edges: np.ndarray) -> np.ndarray:
    """``edges`` when they increase; else the ValueError numpy 2 raises itself ("Too many bins"), which
    numpy 1.26 does not: its edges may then repeat, and would count values in the wrong bins."""
    if edges.size > 1 and not (np.all(np.isfinite(edges)) and np.all(np.diff(edges) > 0)):
        raise ValueError("the edges do not increase")
    return edges


@functools.cache
def _edge_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of numpy's histogram edges for data of ``dtype`` (float64 for integers)."""
    return np.histogram_bin_edges(np.zeros(1, dtype), 1).dtype


def _bytes(nbytes: int) -> str:
    """``format_size``, for byte counts too large for a float too."""
    if nbytes >= 2**100:
        return f"more than 2**{nbytes.bit_length() - 1} bytes"
    return format_size(nbytes)


def _chunk_counts(block: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.histogram(block, bins=edges)[0].reshape((1,) * block.ndim + (-1,))


__all__ = ["OPERATIONS", "histogram", "reduce"]
