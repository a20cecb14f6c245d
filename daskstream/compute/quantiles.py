"""Exact quantiles and medians out of core, equal to ``numpy.quantile(..., method="linear")``.

(Longer than most modules: the two strategies share numpy's typing and interpolation rules, which
must stay in one place to stay exactly numpy's.)

Two strategies, both lazy (one dask graph, nothing read until computed):

* **Along axes** (``axis`` given, the rest kept): the array is rechunked so
  each task holds the whole extent of the reduced axes for a slice of the kept
  ones, sized to the memory budget, and numpy computes each slice. One pass
  over the data (plus the rechunk).
* **Over everything** (``axis=None``, or reduced axes too long for one task):
  a radix select on the bits of the values. Floats and ints are mapped to
  unsigned keys whose order is the values' order; each pass counts, in every
  chunk, the next 16 bits of the keys that share the prefix found so far, and
  the summed counts say which 16-bit digit holds each wanted order statistic.
  After ``bits / 16`` passes each wanted key is known exactly. Passes over the
  data: 1 for 8- and 16-bit dtypes, 2 for 32-bit (float32, int32), 4 for
  64-bit. A task holds its chunk, its keys and one 65,536-bin count per
  order statistic wanted (two per quantile); past four quantiles, or when
  those counts (512 KiB each) would take more than a quarter of a task's
  share of the memory budget, the digits narrow to 8 bits, which doubles the
  passes.

numpy sorts -0.0 and 0.0 as equal, so which of them it returns where both occur
depends on where they sit in memory; here -0.0 always ranks first. Values are
equal either way.

The two order statistics around numpy's virtual index are finally interpolated
by numpy itself, on a two-element array, so the result is numpy's to the bit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, named, said
from daskstream.compute.partials import per_chunk_rows, sum_rows
from daskstream.compute.streaming.span_steps import counts_each_value
from daskstream.errors import InvalidArgumentError, UnsupportedDtypeError
from daskstream.graph.layers import read_layers, record_route
from daskstream.graph.pieces import PIECE_VALUES
from daskstream.graph.rewrites import clone_array
from daskstream.planning.budget import QUANTILE_BLOCK_COPIES, format_size
from daskstream.planning.columns import ColumnPlan, plan_columns
from daskstream.planning.grid import normalize_axes
from daskstream.planning.settings import Resources
from daskstream.runtime.resources import refuse_unbuildable, resources_for

DIGIT_BITS = 16
# Up to this many wanted order statistics (two per quantile) use 16-bit digits: 8 x 512 KiB of counts per task.
_WIDE_DIGIT_TARGETS = 8


def quantile(
    x: Any,
    q: float | Sequence[float],
    axis: int | Sequence[int] | None = None,
    *,
    keepdims: bool = False,
    memory_budget: int | str | None = None,
) -> da.Array:
    """The ``q``-th quantile(s) of ``x`` over ``axis``, exactly as ``numpy.quantile`` (linear).

    See :func:`median` for ``numpy.median``, which averages the two middle values
    rather than interpolating, and so can differ from ``quantile(x, 0.5)`` in the last bit.

    Parameters
    ----------
    x
        A dask array of real numbers (ints or floats).
    q
        A number or a sequence of numbers in [0, 1]; a sequence puts a leading
        axis of that length on the result, as numpy does.
    axis
        ``None`` for all values, an int or a tuple of ints.
    keepdims
        Keep reduced axes with length one.
    memory_budget
        Bytes a worker may use; default: the budget ``x`` was opened with, else
        as for :func:`daskstream.plan_chunks`.

    Returns
    -------
    dask.array.Array
        Float64 for integer input, the input's dtype for floats (numpy's rule).
        NaN wherever the values reduced over hold a NaN, as numpy gives.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> x = da.from_array(np.array([[1.0, 4.0], [3.0, 2.0]]), chunks=1)
    >>> quantile(x, [0.25, 0.5]).compute()
    array([1.75, 2.5 ])
    >>> quantile(x, 0.5, axis=0).compute()
    array([2., 3.])
    """
    x = da.asarray(x)
    resources = resources_for(x, memory_budget=memory_budget)
    return order_statistic(x, q, axis, keepdims=keepdims, resources=resources, median=False)


def nanquantile(
    x: da.Array,
    q: float | Sequence[float],
    axis: int | Sequence[int] | None = None,
    *,
    resources: Resources,
    keepdims: bool = False,
    each_alone: bool = False,
) -> da.Array:
    """The ``q``-th quantile(s) of ``x``'s values that are not NaN, exactly as ``numpy.nanquantile`` (linear).

    As :func:`quantile`, but NaNs are left out rather than making the result
    NaN; where every value reduced over is NaN, the result is NaN. With
    ``each_alone``, a sequence ``q`` gives what ``numpy.nanquantile`` gives
    each of its numbers asked alone (as a Python float, interpolated in the
    data's float dtype: float16 and float32 stay so), computed in the same
    passes: ``[numpy.nanquantile(x, v) for v in q]`` stacked. Planned within
    ``resources``, as the caller's entry point resolved them.

    >>> import dask.array as da, numpy as np
    >>> x = da.from_array(np.array([1.0, np.nan, 3.0, 2.0]), chunks=2)
    >>> resources = Resources(2**30, threads=4, workers=1, origin="arguments")
    >>> nanquantile(x, [0.25, 0.5], resources=resources).compute()
    array([1.5, 2. ])
    """
    return order_statistic(
        x, q, axis, keepdims=keepdims, resources=resources, median=False, skipna=True, each_alone=each_alone
    )


def median(
    x: Any, axis: int | Sequence[int] | None = None, *, keepdims: bool = False, memory_budget: int | str | None = None
) -> da.Array:
    """The median, exactly as ``numpy.median``; see :func:`quantile` for how it is found.

    >>> import dask.array as da
    >>> float(median(da.arange(10, chunks=4)).compute())
    4.5
    """
    x = da.asarray(x)
    resources = resources_for(x, memory_budget=memory_budget)
    return order_statistic(x, 0.5, axis, keepdims=keepdims, resources=resources, median=True)


def order_statistic(
    x: da.Array,
    q: Any,
    axis: int | Sequence[int] | None,
    *,
    keepdims: bool,
    resources: Resources,
    median: bool,
    skipna: bool = False,
    each_alone: bool = False,
) -> da.Array:
    """The quantiles ``q`` (or with ``median``, numpy's median) of the dask array ``x`` over ``axis``, planned
    within ``resources``; ``skipna`` leaves NaNs out and ``each_alone`` is as for :func:`nanquantile`."""
    refuse_unbuildable(x, resources)
    if x.dtype.kind not in "iuf":
        raise UnsupportedDtypeError(
            f"quantiles of dtype {x.dtype} are not defined; numpy refuses them too. Use a real numeric dtype"
        )
    q_array = _check_quantiles(q)
    # numpy gives a Python number "weak" typing: it interpolates with a Python float, and the
    # result keeps the data's float dtype. Carry that through to the final interpolation.
    weak = type(q) in (int, float) or each_alone
    axes = tuple(range(x.ndim)) if axis is None else normalize_axes(axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):
        raise InvalidArgumentError(f"quantile of an empty selection (shape {x.shape}, axes {axes}) has no value")
    kept = [a for a in range(x.ndim) if a not in axes]
    column_bytes = math.prod(x.shape[a] for a in axes) * max(x.dtype.itemsize, 8) * QUANTILE_BLOCK_COPIES
    columns = _column_plan(x, axes, resources) if kept else None
    share = format_size(resources.per_task_bytes)
    what = "median" if median else "quantile"
    if columns is not None:
        result = _quantile_along_axes(x, q, columns.chunks, axes, q_array, median, skipna, each_alone)
        record_route(
            result,
            f"{what} in memory, numpy's selection over whole columns: a column of the reduced axes, "
            f"{format_size(column_bytes)} in the float64 copies it is selected in, fits a task's share ({share})",
        )
    elif not kept and column_bytes <= resources.per_task_bytes:
        # Every value fits one task: numpy's one pass beats the radix select's passes over the data.
        result = _quantile_along_axes(x, q, {}, axes, q_array, median, skipna, each_alone)
        record_route(
            result,
            f"{what} in memory, numpy's selection in one task: all values, {format_size(column_bytes)} in the "
            f"float64 copies they are selected in, fit a task's share ({share})",
        )
    elif not kept:
        result = _radix_quantile(x, 0.5 if each_alone else q, q_array, weak, median, resources, skipna)
        record_route(
            result,
            f"{what} by radix select, a pass over the data per digit: all values, {format_size(column_bytes)} in "
            f"the float64 copies numpy would select them in, do not fit a task's share ({share})",
        )
    else:
        # The reduced extent is too long for one task: radix select per kept position would hold a
        # 65,536-bin count per position. Move the kept axes first and select slice by slice instead.
        raise InvalidArgumentError(
            said(
                f"quantile over axes {axes} of shape {x.shape}: one column of the reduced axes "
                f"({column_bytes // QUANTILE_BLOCK_COPIES} bytes) does not fit the per-task budget "
                f"({resources.per_task_bytes} bytes); raise ",
                named("memory_budget"),
                ", or reduce over all axes (",
                keyword("axis", None),
                ")",
            )
        )
    if keepdims:
        shape = list(result.shape)
        for a in axes:
            shape.insert(a + (1 if q_array.ndim else 0), 1)
        result = result.reshape(shape)
    return result


def _check_quantiles(q: Any) -> np.ndarray:
    """``q`` as numpy.quantile holds it internally (a Python number stays float64, weakly typed)."""
    q_array = np.asanyarray(q)
    if q_array.dtype.kind not in "iuf" or q_array.ndim > 1:
        raise InvalidArgumentError(said(keyword("q", q), " must be a number or a 1-d sequence of numbers in [0, 1]"))
    if q_array.size and not (np.all(q_array >= 0) and np.all(q_array <= 1)):
        raise InvalidArgumentError(said(keyword("q", q), ": quantiles must be in the range [0, 1]"))
    return q_array


# ---------------------------------------------------------------------------
# Along axes: whole columns per task.


def _column_plan(x: da.Array, axes: tuple[int, ...], resources: Resources) -> ColumnPlan | None:
    """How many positions of the kept axes each task holds whole columns of (see
    :mod:`daskstream.planning.columns`), from the storage chunks ``x`` is read in where it is a source
    read as it is, else from its chunks; ``None`` when one column does not fit a task's budget."""
    storage = tuple(max(sizes, default=1) for sizes in x.chunks)
    decoded = False
    reads = read_layers(x)
    if len(reads) == 1 and reads[0][0] == x.name:
        source = reads[0][1]
        if source.storage_chunks is not None:
            storage = tuple(source.storage_chunks)
        # A read holding more than the chunk beside its block decodes it (and does so whole).
        decoded = source.decode_bytes > source.storage_chunk_bytes()
    itemsize = x.dtype.itemsize
    return plan_columns(
        x.shape,
        itemsize,
        axes,
        storage=storage,
        decoded=decoded,
        threads=resources.threads,
        per_task_bytes=resources.per_task_bytes,
        # numpy selects in at least 8-byte values (integers are interpolated as float64).
        copies=QUANTILE_BLOCK_COPIES * max(1, 8 // max(itemsize, 1)),
    )


def _quantile_along_axes(
    x: da.Array,
    q: Any,
    kept_chunks: dict[int, int],
    axes: tuple[int, ...],
    q_array: np.ndarray,
    median: bool,
    skipna: bool = False,
    each_alone: bool = False,
) -> da.Array:
    # Whole reduced axes in every chunk; the kept axes cut as the column plan says.
    chunks: dict[int, Any] = {**dict.fromkeys(axes, -1), **kept_chunks}
    columns = x.rechunk(chunks)
    moved = da.moveaxis(columns, list(axes), list(range(len(axes))))
    out_dtype = _result_dtype(x.dtype, 0.5 if each_alone else q, median)
    q_axes = 1 if q_array.ndim else 0
    return moved.map_blocks(
        _block_quantile,
        q=None if median else q,
        n_reduced=len(axes),
        skipna=skipna,
        each_alone=each_alone,
        dtype=out_dtype,
        drop_axis=list(range(len(axes))),
        new_axis=[0] if q_axes else None,
        chunks=((len(q_array),) if q_axes else ()) + tuple(moved.chunks[len(axes) :]),
    )


def _result_dtype(dtype: np.dtype, q: Any, median: bool = False) -> np.dtype:
    sample = np.ones(2, dtype=dtype)
    return (np.median(sample) if median else np.quantile(sample, q)).dtype


def _block_quantile(
    block: np.ndarray, q: Any, n_reduced: int, skipna: bool = False, each_alone: bool = False
) -> np.ndarray:
    axis = tuple(range(n_reduced))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns about the NaNs it returns
        if q is None:
            return np.median(block, axis=axis)
        select = np.nanquantile if skipna else np.quantile
        if each_alone and np.ndim(q):
            return np.stack([select(block, float(v), axis=axis) for v in q])
        return select(block, q, axis=axis)


# ---------------------------------------------------------------------------
# Over all values: radix select on order-preserving keys.


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned integers whose order is the order of ``values`` (NaN excluded by the caller).

    >>> ordered_keys(np.array([-2.0, -0.5, 0.0, 3.0])).argsort().tolist()
    [0, 1, 2, 3]
    >>> ordered_keys(np.array([-3, 0, 2], dtype="i2")).tolist()
    [32765, 32768, 32770]
    """
    bits = values.dtype.itemsize * 8
    unsigned = np.dtype(f"u{values.dtype.itemsize}")
    raw = values.view(unsigned)
    sign = unsigned.type(1 << (bits - 1))
    if values.dtype.kind == "u":
        return raw
    if values.dtype.kind == "i":
        return raw ^ sign
    # Floats: flip every bit of negatives (their order reverses), set the sign bit of positives.
    return np.where(raw & sign, ~raw, raw | sign)


def values_from_keys(keys: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`ordered_keys`.

    >>> values_from_keys(ordered_keys(np.array([-2.5, 7.0])), np.dtype("f8")).tolist()
    [-2.5, 7.0]
    """
    unsigned = np.dtype(f"u{dtype.itemsize}")
    keys = keys.astype(unsigned)
    sign = unsigned.type(1 << (dtype.itemsize * 8 - 1))
    if dtype.kind == "u":
        raw = keys
    elif dtype.kind == "i":
        raw = keys ^ sign
    else:
        raw = np.where(keys & sign, keys ^ sign, ~keys)
    return raw.astype(unsigned).view(dtype)


def _radix_quantile(
    x: da.Array,
    q_given: Any,
    q: np.ndarray,
    weak: bool,
    median: bool,
    resources: Resources,
    skipna: bool = False,
) -> da.Array:
    bits = x.dtype.itemsize * 8
    digit_bits = min(_digit_bits(_n_targets(q), resources.per_task_bytes), bits)
    levels = bits // digit_bits
    # Level 0 counts every value's top digit and the NaNs; it fixes n and so the ranks wanted.
    counts = sum_rows(
        per_chunk_rows(x, _top_digit_counts, (1 << digit_bits) + 1, digit_bits=digit_bits), resources=resources
    )
    state = da.map_blocks(
        _first_state, counts, q=q, median=median, digit_bits=digit_bits, dtype="u8", chunks=((_state_len(q),),)
    )
    for level in range(1, levels):
        width = _n_targets(q) * (1 << digit_bits)
        # A pass of its own over the source: with the read tasks shared, every chunk of the first
        # pass would wait in memory for the state that the whole pass decides. The clone's reads
        # are fused into the tasks that count them, which wait for the state.
        again = clone_array(x, seed=level)
        rows = per_chunk_rows(again, _next_digit_counts, width, state, level=level, digit_bits=digit_bits)
        counts = sum_rows(rows, resources=resources)
        # The state goes in as a graph input, not a keyword: see per_chunk_rows.
        state = da.blockwise(
            _next_state, "s", counts, "c", state, "s", concatenate=True, level=level, digit_bits=digit_bits, dtype="u8"
        )
    out_dtype = _result_dtype(x.dtype, q_given, median)
    finish = {"q": q, "weak": weak, "median": median, "dtype_in": x.dtype, "dtype": out_dtype, "skipna": skipna}
    if q.ndim:
        return state.map_blocks(_interpolate, chunks=((len(q),),), **finish)
    return state.map_blocks(_interpolate, chunks=(), drop_axis=0, **finish)


def _digit_bits(targets: int, per_task_bytes: int) -> int:
    """Bits counted per pass: 16, unless the counts (one per digit and wanted order statistic, int64) would
    take more than a fifth of a task's share, or many quantiles are wanted. The task taking a pass's counts
    holds four rows (its input and three of workspace); the fifth leaves room for what waits between tasks,
    so a budget that fits wide digits is never refused where narrower ones would have run.

    Narrower digits cost more passes (four for float32 instead of two), never more memory.

    >>> _digit_bits(2, 64 * 2**20), _digit_bits(2, 1 * 2**20), _digit_bits(20, 64 * 2**20)
    (16, 8, 8)
    """
    wide_row = targets * (1 << DIGIT_BITS) * 8
    if targets <= _WIDE_DIGIT_TARGETS and 5 * wide_row <= per_task_bytes:
        return DIGIT_BITS
    return 8


def _n_targets(q: np.ndarray) -> int:
    # The order statistics below and above each quantile's virtual index.
    return 2 * max(q.size, 1)


def _state_len(q: np.ndarray) -> int:
    # n, the NaN count, then per target: its rank left within the prefix, and the prefix.
    return 2 + 2 * _n_targets(q)


def _valid_keys(block: np.ndarray) -> np.ndarray:
    values = block.ravel()
    if values.dtype.kind == "f":
        values = values[~np.isnan(values)]
    return ordered_keys(values)


def _pieces(block: np.ndarray) -> Iterator[np.ndarray]:
    """The block's values, flat, in pieces of ``PIECE_VALUES``.

    The counting below makes several temporaries the size of what it counts
    (keys, masks, digits); counting piece by piece keeps them small, so a task
    holds little more than its block whatever the block's size.
    """
    flat = block.reshape(-1)
    for start in range(0, flat.size, PIECE_VALUES):
        yield flat[start : start + PIECE_VALUES]


@counts_each_value
def _top_digit_counts(block: np.ndarray, digit_bits: int) -> np.ndarray:
    shift = block.dtype.itemsize * 8 - digit_bits
    counts = np.zeros(1 << digit_bits, dtype=np.int64)
    n_valid = 0
    for piece in _pieces(block):
        keys = _valid_keys(piece)
        counts += np.bincount((keys >> shift).astype(np.intp), minlength=1 << digit_bits)
        n_valid += keys.size
    return np.append(counts, block.size - n_valid).reshape((1,) * block.ndim + (-1,))


def _target_ranks(n: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's virtual index for each quantile, and the order statistics on either side of it."""
    virtual = (n - 1) * np.atleast_1d(q)
    below = np.floor(virtual)
    above_end = virtual >= n - 1
    lower = np.where(above_end, n - 1, below).astype(np.int64)
    upper = np.where(above_end, n - 1, below + 1).astype(np.int64)
    return virtual, lower, upper


def _first_state(counts: np.ndarray, q: np.ndarray, median: bool, digit_bits: int) -> np.ndarray:
    histogram, nans = counts[:-1], int(counts[-1])
    n = int(histogram.sum())
    if median:
        # numpy.median: the middle value, or the two middle values of an even count.
        lower, upper = np.array([(n - 1) // 2]), np.array([n // 2])
    else:
        _, lower, upper = _target_ranks(n, q)
    ranks = np.concatenate([lower, upper])
    state = np.zeros(_state_len(q), dtype=np.uint64)
    state[0], state[1] = n, nans
    _descend(state, ranks, np.zeros(len(ranks), dtype=np.uint64), histogram[None, :].repeat(len(ranks), 0))
    return state


def _descend(state: np.ndarray, ranks: np.ndarray, prefixes: np.ndarray, histograms: np.ndarray) -> None:
    """For each target, pick the digit whose bin holds its rank; record the longer prefix and the rank left."""
    cumulative = np.cumsum(histograms, axis=1)
    digits = np.array([np.searchsorted(c, r, side="right") for c, r in zip(cumulative, ranks)], dtype=np.int64)
    before = np.array([c[d - 1] if d > 0 else 0 for c, d in zip(cumulative, digits)], dtype=np.int64)
    width = histograms.shape[1].bit_length() - 1
    targets = len(ranks)
    state[2 : 2 + targets] = (ranks - before).astype(np.uint64)
    state[2 + targets : 2 + 2 * targets] = (prefixes << np.uint64(width)) | digits.astype(np.uint64)


@counts_each_value
def _next_digit_counts(block: np.ndarray, state: np.ndarray, level: int, digit_bits: int) -> np.ndarray:
    targets = (len(state) - 2) // 2
    prefixes = state[2 + targets :]
    wanted = np.unique(prefixes)
    bits = block.dtype.itemsize * 8
    prefix_shift = bits - level * digit_bits
    digit_shift = prefix_shift - digit_bits
    digit_mask = np.uint64((1 << digit_bits) - 1)
    counted = np.zeros((wanted.size, 1 << digit_bits), dtype=np.int64)
    for piece in _pieces(block):
        keys = _valid_keys(piece)
        key_prefix = (keys >> prefix_shift).astype(np.uint64) if prefix_shift < 64 else np.zeros(keys.size, np.uint64)
        for i, prefix in enumerate(wanted):
            selected = keys[key_prefix == prefix]
            digits = ((selected >> digit_shift).astype(np.uint64) & digit_mask).astype(np.intp)
            counted[i] += np.bincount(digits, minlength=1 << digit_bits)
    rows = counted[np.searchsorted(wanted, prefixes)]
    return rows.reshape((1,) * block.ndim + (-1,))


def _next_state(counts: np.ndarray, state: np.ndarray, level: int, digit_bits: int) -> np.ndarray:
    targets = (len(state) - 2) // 2
    histograms = counts.reshape(targets, 1 << digit_bits)
    out = state.copy()
    _descend(out, state[2 : 2 + targets].astype(np.int64), state[2 + targets :], histograms)
    return out


def _lerp_at_end(last: Any, virtual: Any, weak: bool) -> Any:
    """numpy's interpolation at or past the last value: both ends are that value, weight index + 1.

    numpy marks the neighbours of such an index as -1 (the last element), so its weight is
    ``virtual + 1``; the arithmetic below is numpy's ``_lerp`` for equal ends, which decides the
    sign of a zero and NaN for an infinite end.
    """
    value = np.asarray(last)
    weight = float(virtual) + 1 if weak else np.asarray(virtual + 1, dtype=np.asarray(virtual).dtype)
    difference = value - value
    ahead = np.add(value, difference * weight)
    return np.subtract(value, difference * (1 - weight)).astype(ahead.dtype) if weight >= 0.5 else ahead


def _interpolate(
    state: np.ndarray, q: np.ndarray, weak: bool, median: bool, dtype_in: np.dtype, skipna: bool = False
) -> np.ndarray:
    n, nans = int(state[0]), int(state[1])
    if skipna:
        if n == 0:  # every value NaN: numpy.nanquantile's NaN
            shape = q.shape if q.ndim else ()
            return np.full(shape, np.nan, dtype=_result_dtype(dtype_in, 0.5 if weak else q))
        nans = 0  # left out: the order statistics are those of the other values
    targets = (len(state) - 2) // 2
    values = values_from_keys(state[2 + targets :], dtype_in)
    half = targets // 2
    lower, upper = values[:half], values[half:]
    if median:
        middle = np.array([lower[0]] if n % 2 else [lower[0], upper[0]], dtype=dtype_in)
        with np.errstate(invalid="ignore"):
            result = np.asarray(np.median(middle))
        return np.asarray(np.nan, dtype=result.dtype) if nans else result
    if q.dtype.kind in "iu":
        # Integer quantiles (0 or 1) are integer virtual indexes: numpy takes the value, no interpolation.
        result = lower.astype(_result_dtype(dtype_in, 0 if weak else q))
        if nans:
            result = result.astype(np.result_type(result.dtype, np.float16))
            result[...] = np.nan
        return result if q.ndim else result.reshape(())
    virtual, _, _ = _target_ranks(n, q)
    # numpy's weight between the two order statistics, in the dtype numpy holds it in.
    gamma = (virtual - np.floor(virtual)).astype(virtual.dtype)
    out = []
    with np.errstate(invalid="ignore"):
        for lo, hi, v, g, at_end in zip(lower, upper, virtual, gamma, virtual >= n - 1):
            if at_end:
                out.append(_lerp_at_end(hi, v, weak))
                continue
            pair = np.array([lo, hi], dtype=dtype_in)
            # For two values numpy's virtual index is the weight itself, so numpy interpolates
            # these two exactly as it would inside the whole array.
            out.append(np.quantile(pair, float(g) if weak else np.asarray(g, dtype=virtual.dtype)))
    result = np.array(out, dtype=_result_dtype(dtype_in, 0.5 if weak else q))
    if nans:
        result[...] = np.nan
    return result if q.ndim else result.reshape(())
