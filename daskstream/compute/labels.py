"""``xarray.DataArray`` in, labelled results out: the dimension names, coordinates and name kept.

Reductions, kernels, stores and streams take a DataArray (from
:func:`daskstream.open_dataset`, say) where they take an array: axes may be
given by dimension name (``axis="time"``), the work runs on the DataArray's
dask array as on any other, and a reduction's or a kernel's result comes back
as a DataArray with the dimensions that remain and the coordinates along them.
xarray is never imported here: a DataArray exists only where xarray is loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from daskstream.errors import InvalidAxisError
from daskstream.planning.grid import normalize_axes

# Reductions whose result is in the data's units, so its attributes (units, long_name...) still hold.
_UNITS_KEPT = frozenset(
    {"sum", "nansum", "mean", "nanmean", "min", "max", "nanmin", "nanmax", "std", "nanstd", "ptp", "median",
     "quantile"}
)  # fmt: skip


def is_labelled(x: Any) -> bool:
    """Whether ``x`` is an ``xarray.DataArray``.

    >>> is_labelled([1, 2])
    False
    """
    xarray = sys.modules.get("xarray")
    return xarray is not None and isinstance(x, xarray.DataArray)


def unlabelled(x: Any) -> Any:
    """The array inside ``x`` when it is a DataArray (its dask array, or its numpy array), else ``x``."""
    return x.data if is_labelled(x) else x


def axes_by_name(x: Any, axis: Any) -> Any:
    """``axis`` with dimension names of the DataArray ``x`` replaced by their positions.

    Raises
    ------
    InvalidAxisError
        For a name ``x`` has no dimension of, listing those it has.
    """
    if axis is None or not is_labelled(x):
        return axis
    if isinstance(axis, str) or not isinstance(axis, Sequence):
        return _position(x, axis)
    return tuple(_position(x, one) for one in axis)


def _position(x: Any, axis: Hashable) -> Any:
    if isinstance(axis, int):
        return axis
    if axis not in x.dims:
        raise InvalidAxisError(
            f"{x.name or 'the DataArray'} has no dimension {axis!r}; its dimensions are {', '.join(map(str, x.dims))}"
        )
    return x.dims.index(axis)


def reduced(x: Any, result: Any, op: str, axis: Any, *, keepdims: bool = False, q: Any = None) -> Any:
    """``result``, the reduction ``op`` of the DataArray ``x`` over ``axis``, as a DataArray.

    The dimensions left keep their coordinates; reduced ones are dropped (or
    kept with length one under ``keepdims``); a quantile with several ``q``
    gets a leading ``quantile`` dimension, as in xarray. Attributes are kept
    where the result is in the data's units (sum, mean, extremes, std,
    quantiles...), dropped otherwise (variance, counts, argmin...).
    """
    xarray = sys.modules["xarray"]
    axes = set(range(x.ndim)) if axis is None else set(normalize_axes(axis, x.ndim))
    kept = [dim for index, dim in enumerate(x.dims) if index not in axes]
    dims: list[Hashable] = list(x.dims) if keepdims else kept
    coords = {name: coord.variable for name, coord in x.coords.items() if set(coord.dims) <= set(kept)}
    if op == "quantile" and q is not None and np.ndim(q) == 1:
        dims = ["quantile", *dims]
        coords["quantile"] = xarray.Variable("quantile", np.asarray(q, dtype="f8"))
    elif op == "quantile" and q is not None:
        coords["quantile"] = xarray.Variable((), np.float64(q))
    attrs = dict(x.attrs) if op in _UNITS_KEPT else {}
    if len(dims) != np.ndim(result):
        return result  # (a shape the labels do not describe, as numpy's argmax over all axes)
    return xarray.DataArray(result, dims=dims, coords=coords, name=x.name, attrs=attrs)


# describe's statistics, by the reduction each is (counts drop the data's units, the rest keep them).
_STATISTIC_OPS = {"count": "count_nonzero", "nan_count": "count_nonzero", "mean": "mean", "std": "std",
                  "min": "min", "max": "max", "25%": "quantile", "50%": "quantile", "75%": "quantile"}  # fmt: skip


def described(x: Any, description: Any, axis: Any) -> Any:
    """``description``, :func:`daskstream.describe`'s statistics of the DataArray ``x``, with its labels.

    Each statistic becomes a DataArray over the dimensions left (named after
    the statistic, its coordinates kept; units kept where the statistic is
    in the data's units); the histogram has a last ``bin`` dimension, whose
    edges stay ``bin_edges``.
    """
    xarray = sys.modules["xarray"]
    values: dict[str, Any] = {}
    for key, value in description.items():
        if key in _STATISTIC_OPS:
            values[key] = reduced(x, value, _STATISTIC_OPS[key], axis).rename(key)
        elif key == "histogram":
            counts = reduced(x, np.zeros(np.shape(value)[:-1]), "count_nonzero", axis)
            values[key] = xarray.DataArray(value, dims=(*counts.dims, "bin"), coords=counts.coords, name=key)
        else:
            values[key] = value
    return description.replaced(values)


def relabelled(template: Any, result: Any) -> Any:
    """``result`` with the labels of ``template`` (a DataArray) when it has its shape, else as it is.

    The dimension names and coordinates carry over; attributes do not, since
    a kernel's output is rarely in its input's units.
    """
    if getattr(result, "shape", None) != template.shape:
        return result
    xarray = sys.modules["xarray"]
    return xarray.DataArray(result, dims=template.dims, coords=template.coords, name=template.name)
