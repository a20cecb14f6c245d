"""The built-in kernels users reach as ``ds.kernels``, each a few lines over :func:`map_blocks`.

The built-in kernels (:func:`standardize`, :func:`clip`, :func:`astype`,
:func:`moving_mean`, :func:`gaussian_filter`) are plain functions over dask
arrays; the two filters need scipy, imported only when they are called. The
machinery they run on, :func:`map_blocks` (aligned blocks, halos, the output
dtype inferred, a failing block named), is :mod:`daskstream.compute.blockwise`'s;
it is one of ``ds.kernels`` too, so that a pipeline of kernels reads as calls
of one module.

>>> import dask.array as da
>>> x = da.arange(6, chunks=4)
>>> clip(x, 1, 4).compute()
array([1, 1, 2, 3, 4, 4])
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import dask.array as da
import numpy as np
from dask.graph_manipulation import bind

from daskstream.advice import keyword, said
from daskstream.compute.blockwise import _as_dask_array, _as_dtype, map_blocks
from daskstream.compute.labels import axes_by_name, is_labelled, relabelled, unlabelled
from daskstream.dependencies import optional_import
from daskstream.errors import InvalidArgumentError
from daskstream.planning.grid import normalize_axes

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["astype", "clip", "gaussian_filter", "map_blocks", "moving_mean", "standardize"]


def __dir__() -> list[str]:
    """The kernels, for tab completion on ``ds.kernels.``: not the names this module imports."""
    return list(__all__)


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
                said(
                    keyword(name, bound),
                    " is not a scalar; for bounds that vary across the array use "
                    "map_blocks(np.clip, x, lower_array, upper_array)",
                )
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
