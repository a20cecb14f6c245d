"""Variance by pairwise (Chan et al.) merging of count, mean and squared deviations.

Each chunk gives its count, mean and sum of squared deviations from that mean
(:func:`chunk_moments`), in float64 and piece by piece; groups of them are
merged with Chan's formula (:func:`merge_moments`), so an offset of 1e9
costs no precision. :func:`moments` is the dask reduction over them that
:func:`daskstream.compute.reduce` runs for var, std and their nan-variants;
one-pass statistics (:mod:`daskstream.compute.describe`) and joined
reductions (:mod:`daskstream.compute.joins`) merge the same partials.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.utils import deepmap

from daskstream.errors import UnsupportedDtypeError
from daskstream.graph.pieces import PIECE_VALUES


def moments(
    x: da.Array,
    axes: tuple[int, ...],
    *,
    ddof: int = 0,
    skipna: bool = False,
    keepdims: bool = False,
    split_every: int | dict[int, int] | None = None,
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
