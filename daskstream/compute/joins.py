"""A reduction (or ``describe``) computed in pieces along the first axis, and the pieces joined into the answer.

An adaptive run (:mod:`daskstream.tuning.adaptive`) computes consecutive row
ranges of an array one after the other, each with its own chunks and threads.
What each piece computes, and how the pieces join, depends on the operation:

* the first axis is kept: each piece's result holds its own rows of the
  answer, and they are laid side by side, the same numbers a single run gives;
* the first axis is reduced: each piece yields a partial result (sums in the
  accumulation dtype, extremes, counts, or the count/mean/squared-deviation
  triple of variances) and the partials are merged as the reduction's own
  combine step merges chunks. Integers, extremes and counts come out exactly
  as a single run's; floating-point sums and moments to within the rounding
  any other choice of chunks gives.

Argmin/argmax, median, quantiles and histograms over the first axis are not
split into pieces (:meth:`PieceReduction.why_not` says why): their partials need positions,
several passes or a range known in advance.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, said
from daskstream.compute.describe import Description, finish, histogram_edges, merge_statistics, statistics_of
from daskstream.compute.moments import _moments_chunk, _moments_combine, merge_moments, variance_from
from daskstream.compute.partials import combine_fan_in
from daskstream.compute.reductions import accumulation_dtype, reduce
from daskstream.errors import InvalidArgumentError
from daskstream.planning.grid import normalize_axes
from daskstream.planning.settings import Resources

# Partials merged by the same numpy function, or (for sums and counts) by a sum.
_MERGED_BY = {
    "sum": "sum",
    "nansum": "sum",
    "prod": "prod",
    "min": "min",
    "max": "max",
    "nanmin": "nanmin",
    "nanmax": "nanmax",
    "any": "any",
    "all": "all",
}
_MOMENT_OPS = {"var", "std", "nanvar", "nanstd", "mean", "nanmean"}


@dataclass(frozen=True)
class PieceReduction:
    """``reduce(x, op, axis, ...)`` as pieces along the first axis.

    Attributes
    ----------
    op, axes, keepdims, dtype, ddof, q
        The reduction, as :func:`daskstream.reduce` takes it (``axes``
        normalized).
    """

    op: str
    axes: tuple[int, ...]
    keepdims: bool = False
    dtype: Any = None
    ddof: int = 0
    q: Any = None

    @property
    def reduces_first_axis(self) -> bool:
        return 0 in self.axes

    def piece(self, x: da.Array) -> Any:
        """The lazy partial result of one piece (rows of the array ``x``)."""
        if not self.reduces_first_axis:
            return reduce(x, self.op, self.axes, keepdims=self.keepdims, dtype=self.dtype, ddof=self.ddof, q=self.q)
        if self.op in _MERGED_BY:
            return reduce(x, self.op, self.axes, keepdims=True, dtype=self._accumulation(x))
        if self.op == "count_nonzero":
            return da.count_nonzero(x, axis=self.axes)
        if self.op == "ptp":
            return [reduce(x, "max", self.axes, keepdims=True), reduce(x, "min", self.axes, keepdims=True)]
        # Means and variances: each piece's count, mean and squared deviations (Chan's merge joins them).
        return _moment_partials(x, self.axes, skipna=self.op.startswith("nan"))

    def join(self, parts: Sequence[Any], like: np.dtype | None) -> Any:
        """The answer from the pieces' computed results, in row order; ``like`` is a single run's dtype."""
        if not self.reduces_first_axis:
            # The first axis is kept: it is the answer's first axis, after a quantile's own leading axis.
            along = 1 if self.op == "quantile" and np.ndim(self.q) > 0 else 0
            return np.concatenate([np.asarray(p) for p in parts], axis=along)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            # All-NaN pieces give NaN partials and numpy warns about them, as a single run's dask does.
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.asarray(self._merged(parts), dtype=like)

    def _merged(self, parts: Sequence[Any]) -> Any:
        if self.op in _MERGED_BY:
            merged = getattr(np, _MERGED_BY[self.op])(np.concatenate(parts, axis=0), axis=0, keepdims=True)
            return merged if self.keepdims else np.squeeze(merged, axis=self.axes)
        if self.op == "count_nonzero":
            total = np.sum(np.stack(parts), axis=0)
            return np.expand_dims(total, self.axes) if self.keepdims else total
        if self.op == "ptp":
            merged = np.max(np.concatenate([p[0] for p in parts]), axis=0, keepdims=True) - np.min(
                np.concatenate([p[1] for p in parts]), axis=0, keepdims=True
            )
            return merged if self.keepdims else np.squeeze(merged, axis=self.axes)
        # Each piece's [n, mean, m2] rows (see _moment_partials), gathered field by field.
        stacked = {
            k: np.concatenate([np.asarray(p)[i : i + 1] for p in parts], axis=0)
            for i, k in enumerate(("n", "mean", "m2"))
        }
        merged = merge_moments(stacked, (0,))
        if self.op in ("mean", "nanmean"):
            with np.errstate(invalid="ignore", divide="ignore"):
                out = np.where(merged["n"] > 0, merged["mean"], np.nan)
            return out if self.keepdims else np.squeeze(out, axis=self.axes)
        variance = variance_from(merged, self.ddof, self.axes, self.keepdims, skipna=self.op.startswith("nan"))
        return np.sqrt(variance) if self.op.endswith("std") else variance

    def why_not(self, ndim: int) -> str | None:
        """Why this reduction cannot be cut into pieces along the first axis, or ``None`` when it can."""
        op = self.op
        if ndim == 0:
            return "a 0-d array has no first axis to cut"
        if op == "histogram":
            return "a histogram's bins come from the whole array's range"
        if not self.reduces_first_axis:
            return None
        if op in ("argmin", "argmax"):
            return f"{op} over the first axis needs every piece's positions"
        if op in ("median", "quantile"):
            return f"an exact {op} over the first axis takes passes over the whole array"
        if op in ("mean", "nanmean") and self.dtype is not None:
            return f"{op} with dtype={self.dtype!r} accumulates as a single run does only in one piece"
        if op in _MERGED_BY or op in _MOMENT_OPS or op in ("count_nonzero", "ptp"):
            return None
        return f"{op} has no piecewise form"

    def _accumulation(self, x: da.Array) -> Any:
        return accumulation_dtype(x.dtype, self.dtype) if self.op in ("sum", "nansum", "prod") else None


@dataclass(frozen=True)
class PieceDescription:
    """``describe(x, axis, ...)`` as pieces along the first axis: each piece's merged statistics, then
    merged (first axis reduced) or laid side by side (kept), then finished as a single run finishes them.

    Attributes
    ----------
    axes, edges, ddof, dtype
        As :func:`daskstream.compute.describe.describe` resolves them.
    fan_in
        The merge tree's fan-in within a piece.
    """

    axes: tuple[int, ...]
    edges: np.ndarray | None
    ddof: int
    dtype: np.dtype
    fan_in: int

    @classmethod
    def of(
        cls, x: da.Array, axis: Any, *, bins: Any, bin_range: Any, ddof: int, resources: Resources
    ) -> PieceDescription:
        """The pieces of ``describe(x, axis, bins, range=bin_range, ddof=ddof)`` planned for ``resources``,
        checked and planned as it checks and plans them."""
        axes = tuple(range(x.ndim)) if axis is None else normalize_axes(axis, x.ndim)
        edges = histogram_edges(x.dtype, bins, bin_range, resources=resources)
        if bins is not None and edges is None:
            raise InvalidArgumentError(
                said(
                    keyword("bins", bins),
                    " without ",
                    keyword("range"),
                    ": an adaptive describe reads the data once, so it cannot spread the bins over a range it "
                    "has not read yet; give ",
                    keyword("range", text="(low, high)"),
                    ", or leave out ",
                    keyword("adaptive", True),
                    " (the range is then found by the statistics' pass, and the counts take a second)",
                )
            )
        width = 8 * (5 + (0 if edges is None else len(edges)))
        fan_in = combine_fan_in(x, axes, partial_itemsize=width, resources=resources)
        return cls(axes, edges, ddof, x.dtype, fan_in)

    def piece(self, x: da.Array) -> Any:
        return statistics_of(x, self.axes, self.edges, self.fan_in)

    def join(self, parts: Sequence[dict[str, np.ndarray]], like: Any = None) -> Description:
        if 0 in self.axes:
            whole = merge_statistics(list(parts), (0,))
        else:
            whole = {k: np.concatenate([p[k] for p in parts], axis=0) for k in parts[0]}
        return finish(whole, self.axes, self.edges, self.ddof, self.dtype)

    def why_not(self, ndim: int) -> str | None:
        return None if ndim else "a 0-d array has no first axis to cut"


def _moment_partials(x: da.Array, axes: tuple[int, ...], *, skipna: bool) -> da.Array:
    """Count, mean and squared deviations over ``axes`` of the first axis's piece, kept dims, as one array.

    The reduction's own chunk and combine steps; the last step keeps the
    triple instead of dividing, stacked along the (reduced, so length 1)
    first axis: ``[n, mean, m2]``.
    """
    reduced = da.reduction(
        x,
        chunk=functools.partial(_moments_chunk, skipna=skipna),
        combine=_moments_combine,
        aggregate=_stack_moments,
        axis=axes,
        keepdims=True,
        dtype=np.dtype("f8"),
        concatenate=False,
        meta=np.empty((0,) * x.ndim, dtype="f8"),
    )
    # The aggregate returns three rows along the first axis where the reduction would keep one.
    return da.Array(reduced.dask, reduced.name, ((3,), *reduced.chunks[1:]), dtype=np.dtype("f8"))


def _stack_moments(pairs: Any, axis: tuple[int, ...], keepdims: bool, computing_meta: bool = False) -> np.ndarray:
    if computing_meta:
        return np.empty((0,), dtype="f8")
    merged = _moments_combine(pairs, axis, keepdims)
    return np.concatenate([merged["n"].astype("f8"), merged["mean"], merged["m2"]], axis=0)
