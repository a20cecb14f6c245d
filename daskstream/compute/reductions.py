"""Out-of-core reductions: one entry point, float64 accumulation, budget-sized combine trees.

:func:`reduce` dispatches every operation of :data:`OPERATIONS`: dask's own
reductions with a fan-in sized to the budget, variances merged with Chan's
formula (:mod:`daskstream.compute.moments`), histograms counted exactly as
numpy does (:mod:`daskstream.compute.histograms`) and order statistics
(:mod:`daskstream.compute.quantiles`).

Every function here is lazy: it returns dask arrays and reads nothing until
computed.
"""

from __future__ import annotations

import builtins
import functools
import warnings
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, said
from daskstream.compute.histograms import histogram_of
from daskstream.compute.moments import moments
from daskstream.compute.partials import combine_fan_in, fan_in_by_axis
from daskstream.compute.quantiles import order_statistic
from daskstream.errors import InvalidArgumentError, UnknownOperationError, UnsupportedDtypeError
from daskstream.planning.grid import normalize_axes
from daskstream.runtime.resources import refuse_unbuildable, resources_for

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
        raise InvalidArgumentError(
            said(keyword("op", "histogram"), " counts all values, as numpy.histogram does; give no axis")
        )
    if op == "quantile" and q is None:
        raise InvalidArgumentError(
            said(keyword("op", "quantile"), " needs ", keyword("q"), ", a number or a sequence of numbers in [0, 1]")
        )
    resources = resources_for(x, memory_budget=memory_budget)
    refuse_unbuildable(x, resources)
    if op == "histogram":
        return histogram_of(x, bins=bins, range=range, split_every=split_every, resources=resources)
    if op in ("median", "quantile"):
        median = op == "median"
        return order_statistic(x, 0.5 if median else q, axis, keepdims=keepdims, resources=resources, median=median)
    if x.size == 0:
        return _reduce_empty(x, op, axes, keepdims=keepdims, dtype=dtype, ddof=ddof)
    fan_in = split_every or combine_fan_in(x, axes, partial_itemsize=8 * 3, resources=resources)
    by_axis = split_every or fan_in_by_axis(x, axes, fan_in)
    if op in _MOMENTS:
        variance = moments(x, axes, ddof=ddof, skipna=op.startswith("nan"), keepdims=keepdims, split_every=by_axis)
        return da.sqrt(variance) if op.endswith("std") else variance
    kwargs: dict[str, Any] = {"axis": axes, "split_every": by_axis}
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


__all__ = ["OPERATIONS", "histogram", "reduce"]
