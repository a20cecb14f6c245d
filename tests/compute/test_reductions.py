"""Reductions against numpy: every op, ragged chunks, NaN/inf, empty and 0-d arrays, every axis."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.compute.partials import combine_fan_in
from daskstream.compute.reductions import OPERATIONS
from daskstream.compute.streaming.chains import WAVES
from daskstream.errors import (
    DaskstreamError,
    InvalidArgumentError,
    InvalidAxisError,
    MemoryBudgetError,
    UnknownOperationError,
    UnsupportedDtypeError,
)
from daskstream.planning.settings import Resources
from daskstream.runtime.metering import ReadMeter

# numpy's own function for each op, with float inputs accumulated in float64 as daskstream does.
NUMPY = {
    "sum": lambda a, axis, **kw: np.sum(a, axis=axis, dtype=_acc(a), **kw),
    "mean": lambda a, axis, **kw: np.mean(a, axis=axis, dtype=_acc(a), **kw),
    "prod": lambda a, axis, **kw: np.prod(a, axis=axis, dtype=_acc(a), **kw),
    "nansum": lambda a, axis, **kw: np.nansum(a, axis=axis, dtype=_acc(a), **kw),
    "nanmean": lambda a, axis, **kw: np.nanmean(a, axis=axis, dtype=_acc(a), **kw),
    "var": lambda a, axis, **kw: np.var(a.astype("f8"), axis=axis, **kw),
    "std": lambda a, axis, **kw: np.std(a.astype("f8"), axis=axis, **kw),
    "nanvar": lambda a, axis, **kw: np.nanvar(a.astype("f8"), axis=axis, **kw),
    "nanstd": lambda a, axis, **kw: np.nanstd(a.astype("f8"), axis=axis, **kw),
    "min": np.min,
    "max": np.max,
    "nanmin": np.nanmin,
    "nanmax": np.nanmax,
    "ptp": np.ptp,
    "any": np.any,
    "all": np.all,
    "count_nonzero": lambda a, axis, keepdims=False: np.count_nonzero(a, axis=axis, keepdims=keepdims),
    "median": np.median,
}
ELEMENTWISE_OPS = sorted(NUMPY)


def _acc(a):
    return "f8" if a.dtype.kind == "f" else None


def numpy_answer(op, a, axis, **kw):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return NUMPY[op](a, axis=axis, **kw)


def ours(op, x, axis, **kw):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return ds.reduce(x, op, axis=axis, **kw).compute()


def assert_matches(got, want, op):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (op, got.shape, want.shape)
    if op == "median":
        np.testing.assert_array_equal(got, want)  # exact, not approximate
    elif got.dtype.kind in "fc" or want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    floats = rng.standard_normal((23, 17, 5))
    with_specials = floats.copy()
    with_specials[0, 0, 0] = np.nan
    with_specials[5, 3, 2] = np.inf
    with_specials[7, 1, 4] = -np.inf
    return {
        "float32": floats.astype("f4"),
        "float64-nan-inf": with_specials,
        "int16": rng.integers(-300, 300, (23, 17, 5)).astype("i2"),
        "uint8": rng.integers(0, 255, (23, 17, 5)).astype("u1"),
        "bool": rng.random((23, 17, 5)) > 0.3,
    }


AXES = [None, 1, -1, (0, 1), (0, 2), (-3, -1)]


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ELEMENTWISE_OPS)
@pytest.mark.parametrize("kind", ["float32", "float64-nan-inf", "int16", "uint8", "bool"])
def test_every_op_every_axis_matches_numpy(data, kind, op, axis):
    a = data[kind]
    if op in ("var", "std", "nanvar", "nanstd", "median", "ptp") and a.dtype == bool:
        pytest.skip("numpy itself refuses arithmetic on booleans for this op")
    # Ragged chunks on every axis.
    x = da.from_array(a, chunks=(6, 5, 2))
    assert_matches(ours(op, x, axis), numpy_answer(op, a, axis), op)


@pytest.mark.parametrize("op", ["sum", "mean", "var", "min", "argmax", "count_nonzero", "median", "any"])
def test_keepdims(data, op):
    a = data["float32"]
    x = da.from_array(a, chunks=(6, 5, 2))
    got = ours(op, x, (0, 2), keepdims=True) if op not in ("argmax",) else ours(op, x, 1, keepdims=True)
    want = (
        np.argmax(a, axis=1, keepdims=True)
        if op == "argmax"
        else numpy_answer(op, a, (0, 2), keepdims=True)
        if op in NUMPY
        else None
    )
    assert_matches(got, want, op)


@pytest.mark.parametrize("op", ["argmin", "argmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_arg_reductions(data, op, axis):
    a = data["float32"][:, :, 0]
    x = da.from_array(a, chunks=(6, 5))
    np.testing.assert_array_equal(ours(op, x, axis), getattr(np, op)(a, axis=axis))


def test_float_inputs_accumulate_in_float64():
    a = np.full(10**6, 0.1, dtype="f4")
    x = da.from_array(a, chunks=10**5)
    total = ds.reduce(x, "sum").compute()
    assert total.dtype == np.float64
    assert total == pytest.approx(np.sum(a, dtype="f8"), rel=1e-12)
    assert ds.reduce(x, "sum", dtype="f4").compute().dtype == np.float32


def test_variance_is_stable_under_a_large_offset():
    """1e9 + noise in float32: the merge of per-chunk moments keeps the float64 answer to 1e-6."""
    rng = np.random.default_rng(3)
    a = (np.float32(1e9) + rng.normal(0, 1000, 2_000_000)).astype("f4")
    x = da.from_array(a, chunks=100_003)
    want = np.var(a.astype("f8"))
    assert want > 1e5
    assert ds.reduce(x, "var").compute() == pytest.approx(want, rel=1e-6)
    assert ds.reduce(x, "std", ddof=1).compute() == pytest.approx(np.std(a.astype("f8"), ddof=1), rel=1e-6)


@pytest.mark.parametrize("ddof", [0, 1, 5])
def test_ddof(data, ddof):
    a = data["float32"]
    x = da.from_array(a, chunks=(6, 5, 2))
    assert_matches(ours("var", x, 0, ddof=ddof), np.var(a.astype("f8"), axis=0, ddof=ddof), "var")
    assert_matches(ours("nanstd", x, None, ddof=ddof), np.nanstd(a.astype("f8"), ddof=ddof), "nanstd")


@pytest.mark.parametrize("q", [0.5, 0.0, 1.0, [0.1, 0.5, 0.9], 0.3333333])
@pytest.mark.parametrize("axis", [None, 0, (0, 2), -1])
def test_quantile_is_exactly_numpy(data, q, axis):
    for kind in ("float32", "float64-nan-inf", "int16"):
        a = data[kind]
        x = da.from_array(a, chunks=(6, 5, 2))
        got = ours("quantile", x, axis, q=q)
        want = numpy_answer_quantile(a, q, axis)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def numpy_answer_quantile(a, q, axis):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.quantile(a, q, axis=axis)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"]),
    size=st.integers(1, 400),
    chunk=st.integers(1, 97),
    q=st.one_of(st.floats(0, 1), st.lists(st.floats(0, 1), min_size=1, max_size=5)),
    seed=st.integers(0, 2**16),
    duplicates=st.booleans(),
)
def test_quantile_property_exact_for_any_dtype(dtype, size, chunk, q, seed, duplicates):
    rng = np.random.default_rng(seed)
    raw = rng.standard_normal(size) * 1000
    if duplicates:
        raw = np.round(raw / 300)  # few distinct values: many ties across chunks
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        a = np.clip(raw, max(info.min, -1e15), min(info.max, 1e15)).astype(dtype)
        # The extremes of the dtype, where an order-preserving key is easiest to get wrong.
        a[: min(2, size)] = np.array([info.min, info.max], dtype=dtype)[: min(2, size)]
    else:
        if size > 3:
            raw[:3] = [np.inf, -np.inf, 0.0]
        with np.errstate(over="ignore"):  # float16 cannot hold every draw: inf, as a user would get
            a = raw.astype(dtype)
    # numpy's interpolation between the extremes of a small integer dtype overflows, with a warning;
    # daskstream does the same arithmetic, so the same value and the same warning.
    got = ours("quantile", da.from_array(a, chunks=chunk), None, q=q)
    want = numpy_answer_quantile(a, q, None)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("q", [0.1, 1.0, 1, [0.0, 1.0]], ids=str)
@pytest.mark.parametrize("values", [[-0.0], [-0.0, -0.0, -0.0], [5.0, -0.0]], ids=str)
def test_quantile_keeps_the_sign_of_zero(values, q):
    # assert_array_equal treats -0.0 and 0.0 as equal: compare the sign bits too.
    a = np.array(values)
    got = ds.reduce(da.from_array(a, chunks=1), "quantile", q=q).compute()
    want = np.quantile(a, q)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize(
    ("op", "q", "answer"),
    [("quantile", [0.1, 0.5, 0.9], np.quantile), ("median", None, lambda a, q: np.median(a))],
    ids=["quantile", "median"],
)
def test_each_pass_of_a_radix_select_over_a_slice_reads_it_again(tmp_path, op, q, answer):
    """A pass after the first reads a copy of the array's graph. dask's clone left a slice's tasks taking the
    original's keys (dask/dask#12455): the passes then shared one read, each block held for the next pass.
    The budget is one whose tasks the values do not fit: the radix select's route, not numpy's in one task."""
    a = np.random.default_rng(8).standard_normal((41, 19, 6)).astype("f4")
    np.save(tmp_path / "a.npy", a)
    x = ds.open(tmp_path / "a.npy", chunks=(10, 19, 6), memory_budget="128KiB")

    def passes(y):
        with ReadMeter() as once:
            ds.reduce(y, "max").compute()
        with ReadMeter() as meter:
            got = ds.reduce(y, op, q=q).compute()
        return got, meter.bytes_read / once.bytes_read

    got, sliced = passes(x[3:37, :, 1:])
    np.testing.assert_array_equal(got, answer(a[3:37, :, 1:], q))
    _, whole = passes(x)
    assert whole >= 2  # float32: two 16-bit digits, or four 8-bit ones
    assert sliced == whole


@pytest.mark.parametrize("dtype", ["f2", "f4"])
@pytest.mark.parametrize("axis", [None, 0, 1], ids=str)
@pytest.mark.parametrize("q", [0.25, [0.25, 0.5, 0.75], None], ids=["one q", "three q", "median"])
def test_quantiles_and_medians_of_half_and_single_precision_are_numpys_in_dtype_and_value(dtype, axis, q):
    # A Python number q keeps numpy's result in the data's dtype, a sequence makes it float64; either way
    # numpy interpolates in the data's dtype (2048 - 0.1 in float16 is 2048), not in a float64 upcast.
    a = np.array([[0.1, 2048.0, 7.3], [0.1, 2048.0, -3.0], [-65504.0, 1e-4, 0.5], [3.3, 0.2, 9.9]], dtype=dtype)
    x = da.from_array(a, chunks=(3, 2))
    if q is None:
        got, want = ours("median", x, axis), np.median(a, axis=axis)
    else:
        got, want = ours("quantile", x, axis, q=q), numpy_answer_quantile(a, q, axis)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


# Values at float64's limits: sums and squares of the large ones overflow; 5e-324 is the least subnormal.
EXTREMES = [1e308, -1e308, np.finfo("f8").max, -np.finfo("f8").max, 1e300, -1e300, 1e154, -1e154, 5e-324,
            -5e-324, 0.0, 1.0, -2.5, np.inf, -np.inf, np.nan]  # fmt: skip
SPREADS = ("std", "var", "nanstd", "nanvar")


def describe_std(x, axis, ddof):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return ds.describe(x, axis=axis, ddof=ddof).compute()["std"]


def numpy_nanstd(a, axis, ddof):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanstd(a, axis=axis, ddof=ddof)


@pytest.mark.parametrize("chunks", [1, 2, 3, 5])
@pytest.mark.parametrize("ddof", [0, 1])
def test_the_spread_of_values_whose_sum_overflows_is_numpys_inf(chunks, ddof):
    a = np.array([1e308, 1e308, -1e308, 5e-324, 1e308])
    for op in SPREADS:
        want = numpy_answer(op, a, None, ddof=ddof)
        assert want == np.inf
        assert ours(op, da.from_array(a, chunks=chunks), None, ddof=ddof) == want, op
        # Along an axis too: a column per row of a 2-d array.
        columns = np.stack([a, a[::-1], np.ones(5)], axis=1)
        got = ours(op, da.from_array(columns, chunks=(chunks, 2)), 0, ddof=ddof)
        np.testing.assert_array_equal(got, numpy_answer(op, columns, 0, ddof=ddof), err_msg=op)
    assert describe_std(da.from_array(a, chunks=chunks), None, ddof) == np.inf


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_spread_of_values_at_float64s_limits_is_numpys(data):
    # At most 7 values along the reduced axes: numpy sums them one after another (its pairwise summation
    # starts at 8), so its NaN means a NaN or an infinity among them, inf any overflow of finite values.
    rows = data.draw(st.integers(1, 7))
    columns = data.draw(st.integers(1, 7 // rows))
    a = np.array(data.draw(st.lists(st.sampled_from(EXTREMES), min_size=rows * columns, max_size=rows * columns)))
    a = a.reshape(rows, columns)
    x = da.from_array(a, chunks=(data.draw(st.integers(1, rows)), data.draw(st.integers(1, columns))))
    axis = data.draw(st.sampled_from([None, 0, 1]))
    ddof = data.draw(st.integers(0, 2))
    for op in SPREADS:
        got, want = ours(op, x, axis, ddof=ddof), numpy_answer(op, a, axis, ddof=ddof)
        # Infinities and NaNs where numpy has them; the finite values to float64's precision.
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True, err_msg=op)
    np.testing.assert_allclose(describe_std(x, axis, ddof), numpy_nanstd(a, axis, ddof), rtol=1e-12, equal_nan=True)


def test_finite_values_whose_sums_overflow_both_ways_spread_infinitely_in_any_order():
    """numpy's NaN for some orders of such values is its summation order's (its partial sums +inf and -inf
    meet); the spread itself is past float64's range, which numpy says (inf) for the order below."""
    in_order = np.array([1e308, -1e308, 1e308, -1e308] + [0.0] * 12)
    assert numpy_answer("var", in_order, None) == np.inf
    shuffled = np.zeros(16)
    shuffled[[0, 8]], shuffled[[1, 9]] = 1e308, -1e308
    for a in (in_order, shuffled):
        for chunks in (1, 3, 8, 16):
            x = da.from_array(a, chunks=chunks)
            for op in SPREADS:
                assert ours(op, x, None) == np.inf, (op, chunks)
            assert describe_std(x, None, 0) == np.inf


def test_axis_on_a_0d_array_is_refused():
    with pytest.raises(InvalidAxisError, match="0-d"):
        ds.reduce(da.from_array(np.array(3.0)), "sum", axis=0)


def test_histogram_of_an_nd_array_keeps_its_chunks():
    x = da.ones((400, 300), chunks=(100, 100))
    counts, _ = ds.reduce(x, "histogram", bins=4, range=(0, 2))
    np.testing.assert_array_equal(counts.compute(), [0, 0, 120000, 0])
    # Counted chunk by chunk in place: no reshape of the array, so no rechunk tasks.
    assert not any("reshape" in str(name) or "rechunk" in str(name) for name in counts.dask.layers)
    with pytest.raises(InvalidArgumentError, match="axis"):
        ds.reduce(x, "histogram", axis=0)


def test_median_over_all_axes_of_a_multichunk_array(data):
    a = data["float32"]
    x = da.from_array(a, chunks=(6, 5, 2))
    assert ours("median", x, None) == np.median(a)


def test_histogram_matches_numpy(data):
    a = data["float32"]
    x = da.from_array(a, chunks=(6, 5, 2))
    for kwargs in ({"bins": 7}, {"bins": 5, "range": (-1, 2)}, {"bins": [-3, -1, 0, 0.5, 3]}):
        counts, edges = ds.reduce(x, "histogram", **kwargs)
        want_counts, want_edges = np.histogram(a, **kwargs)
        np.testing.assert_array_equal(counts.compute(), want_counts)
        np.testing.assert_array_equal(np.asarray(dask.compute(edges)[0]), want_edges)


def test_0d_and_empty_arrays():
    scalar = da.from_array(np.float32(2.5))
    assert ds.reduce(scalar, "sum").compute() == 2.5
    assert ds.reduce(scalar, "median").compute() == 2.5
    empty = da.from_array(np.empty((0, 4), dtype="f4"), chunks=2)
    assert ds.reduce(empty, "sum").compute() == 0
    np.testing.assert_array_equal(ds.reduce(empty, "sum", axis=0).compute(), np.zeros(4))
    assert np.isnan(ours("mean", empty, None))
    with pytest.raises(InvalidArgumentError, match="empty"):
        ds.reduce(empty, "max")
    with pytest.raises(InvalidArgumentError, match="empty"):
        ds.reduce(empty, "median")
    # Reducing a non-empty axis of an empty array is fine, as in numpy.
    assert ds.reduce(empty, "max", axis=1).compute().shape == (0,)


def test_unknown_op_lists_the_choices():
    x = da.ones(4, chunks=2)
    with pytest.raises(UnknownOperationError) as info:
        ds.reduce(x, "average")
    assert isinstance(info.value, ValueError)
    for op in OPERATIONS:
        assert op in str(info.value)


@pytest.mark.parametrize("axis", [2, -3, (0, 5)])
def test_bad_axis(axis):
    x = da.ones((3, 4), chunks=2)
    with pytest.raises(InvalidAxisError):
        ds.reduce(x, "sum", axis=axis)


@pytest.mark.parametrize("q", [-0.1, 1.5, [0.2, 2.0], "half"])
def test_bad_quantile(q):
    x = da.ones(4, chunks=2)
    with pytest.raises(InvalidArgumentError):
        ds.reduce(x, "quantile", q=q)


def test_quantile_refuses_complex_and_bool():
    from daskstream.errors import UnsupportedDtypeError

    for a in (np.array([1 + 1j, 2]), np.array([True, False])):
        with pytest.raises(UnsupportedDtypeError):
            ds.reduce(da.from_array(a), "median")


def test_fan_in_comes_from_the_budget():
    x = da.ones((65536, 4096), chunks=(64, 4096))
    # Scalar partials are tiny: one combine level merges many.
    wide = combine_fan_in(x, (0, 1), partial_itemsize=24, resources=Resources(2**30, 2, 1, origin="arguments"))
    # Per-row partials along a kept axis of 4096: a small budget merges few at a time.
    narrow = combine_fan_in(x, (0,), partial_itemsize=24, resources=Resources(4 * 2**20, 2, 1, origin="arguments"))
    assert wide > 100
    assert 2 <= narrow < 32
    assert narrow != 4 or wide != 4


@pytest.mark.parametrize(("threads", "workers"), [(2, 1), (4, 1), (8, 16)])
def test_the_first_combines_give_every_thread_a_few_tasks(threads, workers):
    # Whatever the budget allows, the first level of the tree has a few combines a thread: each computes its
    # blocks itself (folded), so fewer would leave threads idle.
    x = da.ones((2**18, 64), chunks=(64, 64))
    resources = Resources(2**40, threads, workers, origin="arguments")
    fan_in = combine_fan_in(x, (0, 1), partial_itemsize=24, resources=resources)
    first_level = -(-x.numblocks[0] // fan_in)
    assert threads * workers * WAVES <= first_level < 2 * threads * workers * WAVES
    # Few blocks, a thread or two's worth: the budget alone decides, as before.
    small = da.ones((640, 64), chunks=(64, 64))
    assert combine_fan_in(small, (0, 1), partial_itemsize=24, resources=resources) == 1024


def test_reductions_are_lazy_and_read_once_per_chunk(tmp_path):
    """A reduction over an opened file reads nothing until computed."""
    path = tmp_path / "a.npy"
    np.save(path, np.arange(1000.0).reshape(100, 10))
    x = ds.open(path, memory_budget="64KiB")
    result = ds.reduce(x, "mean", axis=0)
    path.unlink()  # nothing was read at graph-building time; reading now fails
    with pytest.raises(FileNotFoundError):
        result.compute()


@pytest.mark.parametrize("op", ["sum", "var", "median"])
def test_on_an_opened_file_every_scheduler(tmp_path, op):
    a = np.random.default_rng(0).standard_normal((300, 40)).astype("f4")
    np.save(tmp_path / "a.npy", a)
    x = ds.open(tmp_path / "a.npy", memory_budget="256KiB")
    for scheduler in ("sync", "threads", "processes"):
        with dask.config.set(scheduler=scheduler):
            assert_matches(ds.reduce(x, op, axis=0).compute(), numpy_answer(op, a, 0), op)


def test_every_documented_op_computes_what_numpy_does():
    data = np.arange(1, 9, dtype="f8").reshape(2, 4)
    x = da.from_array(data, chunks=1)
    oracles = {
        "ptp": np.ptp,
        "quantile": lambda a: np.quantile(a, 0.5),
        "histogram": lambda a: np.histogram(a, bins=10),
    }
    for op in sorted(OPERATIONS):
        kwargs = {"q": 0.5} if op == "quantile" else {}
        got = dask.compute(ds.reduce(x, op, **kwargs))[0]
        expected = oracles.get(op, getattr(np, op))(data)
        if op == "histogram":
            for part, want in zip(got, expected, strict=True):
                np.testing.assert_allclose(part, want, err_msg=op)
        else:
            np.testing.assert_allclose(got, expected, err_msg=op)


# --- histogram bins and ranges: refused before anything is allocated or read -------------------------

HISTOGRAM_ENTRY_POINTS = {
    "reduce": lambda x, **kwargs: ds.reduce(x, "histogram", **kwargs),
    "describe": lambda x, **kwargs: ds.describe(x, **kwargs),
}


@pytest.mark.parametrize("bins", [10**12, 2**70, np.uint64(2**63), 10**400])
@pytest.mark.parametrize("entry", sorted(HISTOGRAM_ENTRY_POINTS))
def test_more_bins_than_the_budget_holds_are_refused_before_the_edges_exist(entry, bins):
    x = da.ones(100, chunks=50)
    # numpy would fail allocating the edges (MemoryError, or ValueError past its largest array); the
    # budget check comes first, so the error is daskstream's, naming the bins and the bytes.
    with pytest.raises(MemoryBudgetError) as caught:
        HISTOGRAM_ENTRY_POINTS[entry](x, bins=bins, range=(0, 1), memory_budget="64MiB")
    assert isinstance(caught.value, DaskstreamError)
    assert isinstance(caught.value, MemoryError)
    message = str(caught.value)
    assert message.startswith("bins=")
    assert str(int(bins))[:10] in message
    assert "of edges" in message
    assert "memory_budget=64.00 MiB" in message
    assert "give fewer bins" in message
    assert "\n" not in message


def test_a_bin_count_without_a_range_is_checked_too():
    x = da.ones(100, chunks=50)
    with pytest.raises(MemoryBudgetError, match=r"bins=1000000000000 needs 14\.55 TiB"):
        ds.reduce(x, "histogram", bins=10**12, memory_budget="64MiB")


def test_the_bin_check_counts_the_edges_and_a_row_of_counts_against_a_tasks_share():
    x = da.ones(100, chunks=50)
    # 2**16 bins: 512 KiB of float64 edges and 512 KiB of int64 counts, within a share of 1 GiB ...
    counts, edges = ds.reduce(x, "histogram", bins=2**16, range=(0, 2), memory_budget="1GiB")
    assert counts.compute().sum() == 100
    assert len(edges) == 2**16 + 1
    # ... and not within 1 MiB, whatever the number of threads sharing it.
    with pytest.raises(MemoryBudgetError, match=r"needs 1\.00 MiB"):
        ds.reduce(x, "histogram", bins=2**16, range=(0, 2), memory_budget="1MiB")


@pytest.mark.parametrize(
    ("bin_range", "says"),
    [
        ((0, float("nan")), "must be finite"),
        ((float("nan"), 1), "must be finite"),
        ((float("-inf"), float("inf")), "must be finite"),
        ((0, float("inf")), "must be finite"),
        ((0, 10**400), "must be finite"),
        ((1, 0), "the first value must not exceed the second"),
        ((-1e308, 1e308), "wider than the largest float64"),
        ((0, 1, 2), "is not two numbers"),
        ((0,), "is not two numbers"),
        ("ab", "is not two numbers"),
    ],
)
@pytest.mark.parametrize("entry", sorted(HISTOGRAM_ENTRY_POINTS))
def test_a_range_must_be_two_finite_ordered_numbers(entry, bin_range, says):
    x = da.ones(100, chunks=50)
    with pytest.raises(InvalidArgumentError) as caught:
        HISTOGRAM_ENTRY_POINTS[entry](x, bins=10, range=bin_range)
    assert isinstance(caught.value, DaskstreamError)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith("range=")
    assert says in str(caught.value)
    assert "e.g. range=(0, 1)" in str(caught.value)


@pytest.mark.parametrize(
    ("edges", "says"),
    [
        ([0, float("nan"), 1], "edges must be finite"),
        ([0, 1, float("inf")], "edges must be finite"),
        (["a", "b"], "edges must be numbers"),
        (np.array([5, 3], dtype="u8"), "at least two, increasing"),
        ([2, 1], "at least two, increasing"),
        ([1], "at least two, increasing"),
    ],
)
@pytest.mark.parametrize("entry", sorted(HISTOGRAM_ENTRY_POINTS))
def test_bin_edges_must_be_increasing_finite_numbers(entry, edges, says):
    x = da.ones(100, chunks=50)
    with pytest.raises(InvalidArgumentError, match=says) as caught:
        HISTOGRAM_ENTRY_POINTS[entry](x, bins=edges)
    assert isinstance(caught.value, ValueError)


def test_more_bins_than_a_narrow_float32_range_holds_are_refused():
    x = da.from_array(np.linspace(1, 1.0001, 100, dtype="f4"), chunks=50)
    with pytest.raises(InvalidArgumentError, match=r"bins=1000000 over range=\(1\.0, 1\.0001\).*float32"):
        ds.reduce(x, "histogram", bins=10**6, range=(1, 1.0001))
    # Over the data's own range, found by reading it, the same is said when computed.
    counts, _ = ds.reduce(x, "histogram", bins=10**6)
    with pytest.raises(InvalidArgumentError, match=r"bins=1000000 over the data's range"):
        counts.compute()


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_data_with_inf_or_nan_needs_a_range(bad):
    x = da.from_array(np.array([0.0, 1.0, bad, 2.0]), chunks=2)
    counts, _ = ds.reduce(x, "histogram", bins=4)
    with pytest.raises(InvalidArgumentError, match=r"the data's range .* is not finite.*give range="):
        counts.compute()
    # With a range, numpy's rule holds: values outside it are not counted.
    counts, _ = ds.reduce(x, "histogram", bins=4, range=(0, 2))
    np.testing.assert_array_equal(counts.compute(), np.histogram(np.array([0.0, 1.0, 2.0]), bins=4, range=(0, 2))[0])


@pytest.mark.parametrize("values", [np.array(["2020-01-01", "2021-01-01"], dtype="M8[D]"), np.array(["a", "b"])])
def test_a_histogram_of_what_is_not_numbers_is_refused(values):
    with pytest.raises(UnsupportedDtypeError, match=re.escape(f"dtype {values.dtype} is not supported")) as caught:
        ds.reduce(da.from_array(values), "histogram", bins=3, range=(0, 2))
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize(
    ("values", "what"),
    [
        (np.array([b"ab", b"cd"] * 20), "byte strings"),
        (np.array(["ab", "cd"] * 20), "strings"),
        (np.zeros(40, dtype=[("a", "f4"), ("b", "i2")]), "records"),
        (np.arange(40).astype("M8[D]"), "dates"),
    ],
)
@pytest.mark.parametrize("op", ["sum", "mean", "prod", "any", "max", "std", "median", "nanmean"])
def test_reductions_numpy_does_not_define_for_the_data_are_refused_clearly(tmp_path, values, what, op):
    path = tmp_path / "a.npy"
    np.save(path, values)
    x = ds.open(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = getattr(np, op)(values)
    except (TypeError, ValueError):
        want = None
    if want is not None:  # numpy defines it (the max of dates): the same answer
        assert ds.reduce(x, op).compute() == want
        return
    with pytest.raises(UnsupportedDtypeError, match=f"{op} of {what}") as caught:
        ds.reduce(x, op)
    assert str(values.dtype) in str(caught.value)
    if values.dtype.names:
        assert "x['a']" in str(caught.value)


def test_the_cli_reduces_complex_numbers_and_dates_to_json_and_refuses_strings_in_one_line(tmp_path):
    np.save(tmp_path / "z.npy", (np.arange(100) + 1j).astype("c8"))
    np.save(tmp_path / "d.npy", np.arange(10).astype("M8[D]"))
    np.save(tmp_path / "s.npy", np.array([b"ab"] * 10))

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "daskstream", "reduce", *args, "--quiet"], capture_output=True, text=True
        )

    summed = cli(str(tmp_path / "z.npy"), "--op", "sum", "--json")
    assert summed.returncode == 0, summed.stderr
    assert json.loads(summed.stdout)["result"] == [4950.0, 100.0]
    latest = cli(str(tmp_path / "d.npy"), "--op", "max", "--json")
    assert latest.returncode == 0, latest.stderr
    assert json.loads(latest.stdout)["result"] == "1970-01-10"
    refused = cli(str(tmp_path / "s.npy"), "--op", "max")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "daskstream: error: max of byte strings (dtype |S2) is not defined: reduce numbers"
    ]


@pytest.mark.parametrize("op", ["var", "std", "nanvar", "nanstd"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_the_spread_of_complex_data_is_numpys_from_a_file(tmp_path, op, axis):
    rng = np.random.default_rng(5)
    values = (rng.standard_normal((40, 30)) + 1j * rng.standard_normal((40, 30)) + (5e3 + 2e3j)).astype("c8")
    values[3, 4], values[7, 1] = complex(np.nan, 1.0), complex(2.0, np.nan)  # NaN in one part only
    np.save(tmp_path / "z.npy", values)
    x = ds.open(tmp_path / "z.npy", chunks=(7, 11))
    got = ds.reduce(x, op, axis=axis, ddof=1).compute()
    want = getattr(np, op)(values.astype("c16"), axis=axis, ddof=1)
    assert got.dtype == np.float64  # a spread of complex numbers is real, as in numpy
    np.testing.assert_allclose(got, want, rtol=1e-10, equal_nan=True)


# Each computation of an array, as the user calls it: a budget given to it is passed as memory_budget=.
PLANNED_COMPUTATIONS = {
    "sum": lambda x, **budget: ds.reduce(x, "sum", **budget),
    "var": lambda x, **budget: ds.reduce(x, "var", axis=0, **budget),
    "quantile": lambda x, **budget: ds.reduce(x, "quantile", q=0.25, **budget),
    "median": lambda x, **budget: ds.reduce(x, "median", **budget),
    "histogram": lambda x, **budget: ds.reduce(x, "histogram", bins=10, range=(0, 1), **budget)[0],
    "describe": lambda x, **budget: ds.describe(x, bins=10, range=(0, 1), **budget),
}


@pytest.mark.parametrize("computation", sorted(PLANNED_COMPUTATIONS))
def test_a_computation_plans_for_the_budget_its_array_was_opened_with_and_a_budget_given_wins(tmp_path, computation):
    # Blocks enough that the first combines are set by the budget, not by the threads they keep busy.
    np.save(tmp_path / "a.npy", np.random.default_rng(0).random((8192, 64)))
    x = ds.open(tmp_path / "a.npy", memory_budget="64KiB")
    planned = PLANNED_COMPUTATIONS[computation]
    # A computation's name says what it computes and how it is planned (its combine trees, its passes).
    assert dask.base.tokenize(planned(x)) == dask.base.tokenize(planned(x, memory_budget="64KiB"))
    assert dask.base.tokenize(planned(x)) != dask.base.tokenize(planned(x, memory_budget="1GiB"))
    with dask.config.set({"daskstream.memory-budget": "1GiB"}):
        # The array's own budget over the setting: it was opened (and chunked) for it.
        assert dask.base.tokenize(planned(x)) == dask.base.tokenize(planned(x, memory_budget="64KiB"))
