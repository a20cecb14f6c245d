"""Histograms counted exactly as ``numpy.histogram`` counts them, with edges by numpy's rules.

Edges known before reading (explicit, or a bin count over a range) are
checked here (:func:`known_bin_edges`), and a bin count is refused before
numpy is asked to allocate what the budget cannot hold (:func:`check_bin_count`);
a bin count without a range is spread over the data's extremes, found in an
extra pass (:func:`edges_of_data_range`). Each chunk's counts are one row,
summed down a tree sized to the budget (:func:`histogram_of`).
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, named, said
from daskstream.compute.partials import combine_fan_in, per_chunk_rows, sum_rows
from daskstream.compute.streaming.span_steps import counts_each_value
from daskstream.errors import InvalidArgumentError, MemoryBudgetError, UnsupportedDtypeError
from daskstream.planning.budget import format_size
from daskstream.planning.settings import Resources

# The advice for bins spread over a range the caller chooses.
_RANGE = keyword("range", text="(low, high)")


def histogram_of(
    x: da.Array,
    *,
    bins: int | Sequence[float],
    range: tuple[float, float] | None,
    split_every: int | None,
    resources: Resources,
) -> tuple[da.Array, Any]:
    """:func:`~daskstream.compute.reductions.histogram` of a dask array ``x`` within ``resources``, resolved by
    the caller."""
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
    # One row of counts per chunk, in place of the chunk (no reshape, so no rechunk), summed down. Edges found
    # from the data go in as a graph input (see per_chunk_rows); known ones as a value.
    if isinstance(edges, da.Array):
        rows = per_chunk_rows(x, _chunk_counts, len(edges) - 1, edges)
    else:
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
        raise InvalidArgumentError(said(keyword("bins", bins), " must be a positive int or a sequence of edges"))
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
            said(
                keyword("bins", count),
                " over ",
                keyword("range", bin_range),
                f" do not make increasing {edge_dtype} edges (the data's dtype is {dtype}): the range is too "
                f"narrow for that many bins, or beyond what {edge_dtype} holds; give fewer bins or another range",
            )
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
        said(
            keyword("bins", bins),
            f" needs {_bytes(edge_bytes + count_bytes)} in every task that counts ({_bytes(edge_bytes)} of "
            f"edges and {_bytes(count_bytes)} of counts), more than the {format_size(resources.per_task_bytes)}"
            " one task may hold (",
            keyword("memory_budget", text=format_size(resources.memory_budget)),
            f" shared by {resources.threads} thread(s)); give fewer bins or a larger ",
            named("memory_budget"),
        )
    )


def _checked_edges(bins: Any) -> np.ndarray:
    """Explicit bin edges, as numpy.histogram takes them, or a clear error."""
    edges = np.asarray(bins)
    hint = said("give at least two increasing, finite numbers, e.g. ", keyword("bins", [0, 0.5, 1]))
    if edges.dtype.kind not in "iuf":
        raise InvalidArgumentError(said(keyword("bins", bins), ": edges must be numbers; ", hint))
    # Compared, not differenced: a difference of unsigned edges wraps around instead of going negative.
    if edges.size < 2 or np.any(edges[1:] < edges[:-1]):
        raise InvalidArgumentError(said(keyword("bins", bins), ": edges must be at least two, increasing; ", hint))
    if edges.dtype.kind == "f" and not np.all(np.isfinite(edges)):
        raise InvalidArgumentError(said(keyword("bins", bins), ": edges must be finite; ", hint))
    return edges


def _checked_range(bin_range: Any) -> tuple[float, float]:
    """``(low, high)`` as two finite floats with ``low <= high``, or a clear error."""
    hint = said("give ", _RANGE, " with finite numbers and low <= high, e.g. ", keyword("range", text="(0, 1)"))
    try:
        low, high = (float(value) for value in bin_range)
    except OverflowError:  # an int beyond any float
        raise InvalidArgumentError(said(keyword("range", bin_range), " must be finite; ", hint)) from None
    except (TypeError, ValueError):
        raise InvalidArgumentError(said(keyword("range", bin_range), " is not two numbers; ", hint)) from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise InvalidArgumentError(said(keyword("range", bin_range), " must be finite; ", hint))
    if low > high:
        raise InvalidArgumentError(
            said(keyword("range", bin_range), ": the first value must not exceed the second; ", hint)
        )
    if not math.isfinite(high - low):
        raise InvalidArgumentError(
            said(keyword("range", bin_range), f" is wider than the largest float64 ({np.finfo('f8').max:g}); ", hint)
        )
    return low, high


def edges_of_data_range(extremes: np.ndarray, bins: int) -> np.ndarray:
    """numpy's edges for ``bins`` over the data's ``[min, max]``, found by reading it."""
    low, high = extremes
    if not np.all(np.isfinite(extremes)):
        raise InvalidArgumentError(
            said(
                f"the data's range [{low}, {high}] is not finite (it holds inf or NaN), so ",
                keyword("bins", bins),
                " cannot be spread over it; give ",
                _RANGE,
            )
        )
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return _increasing(np.histogram_bin_edges(extremes, bins))
    except ValueError:  # "Too many bins for data range"
        raise InvalidArgumentError(
            said(
                keyword("bins", bins),
                f" over the data's range [{low}, {high}] do not make increasing {_edge_dtype(extremes.dtype)} "
                "edges; give fewer bins, or ",
                _RANGE,
            )
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


@counts_each_value
def _chunk_counts(block: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.histogram(block, bins=edges)[0].reshape((1,) * block.ndim + (-1,))
