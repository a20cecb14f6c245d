"""describe: every statistic against numpy, in one pass that reads each chunk once."""

from __future__ import annotations

import collections
import importlib.util
import math
import re
import threading
import warnings
from typing import ClassVar

import dask
import dask.array as da
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import InvalidArgumentError, UnsupportedDtypeError
from daskstream.sources.npy import NpySource

_COMPILED = importlib.util.find_spec("numba") is not None


def expected(a, axis=None, edges=None, ddof=0):
    values = a.astype("f8")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        out = {
            "count": np.sum(~np.isnan(values), axis=axis),
            "nan_count": np.sum(np.isnan(values), axis=axis),
            "mean": np.nanmean(values, axis=axis),
            "std": np.nanstd(values, axis=axis, ddof=ddof),
            "min": np.nanmin(values, axis=axis),
            "max": np.nanmax(values, axis=axis),
        }
    return out


def check(description, want):
    for key in ("count", "nan_count"):
        np.testing.assert_array_equal(description[key], want[key], err_msg=key)
    # describe's documented precision: with numba, numpy's float64 answers to about 1e-12 relative; without
    # it (float chunks summed in rows of 1024 in their own dtype), to about 1e-7 of the data's spread.
    spread = 0.0 if _COMPILED else float(np.nanmax(np.asarray(want["std"], dtype="f8")))
    for key in ("mean", "std"):
        np.testing.assert_allclose(
            description[key], want[key], rtol=1e-7, atol=1e-7 * spread, equal_nan=True, err_msg=key
        )
    for key in ("min", "max"):
        np.testing.assert_array_equal(np.asarray(description[key], dtype="f8"), want[key], err_msg=key)


@pytest.fixture(scope="module")
def field():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((41, 19, 6)).astype("f4")
    a[0, 0, :] = np.nan  # a fully-NaN column for the per-axis case
    a[7, 3, 2] = np.nan
    return a


@pytest.mark.parametrize("axis", [None, 0, 1, 2, (0, 2), (1, 2), (0, 1, 2)], ids=str)
def test_statistics_match_numpy(field, axis):
    x = da.from_array(field, chunks=(6, 5, 4))
    check(ds.describe(x, axis=axis).compute(), expected(field, axis))


def test_histogram_with_range_and_edges(field):
    x = da.from_array(field, chunks=(6, 5, 4))
    valid = field[~np.isnan(field)]
    d = ds.describe(x, bins=9, range=(-2, 2)).compute()
    counts, edges = np.histogram(valid, bins=9, range=(-2, 2))
    np.testing.assert_array_equal(d["histogram"], counts)
    np.testing.assert_array_equal(d["bin_edges"], edges)
    d = ds.describe(x, bins=[-4, -1, 0, 1, 4]).compute()
    np.testing.assert_array_equal(d["histogram"], np.histogram(valid, bins=[-4, -1, 0, 1, 4])[0])


def test_histogram_per_kept_position(field):
    x = da.from_array(field, chunks=(6, 5, 4))
    d = ds.describe(x, axis=(0, 2), bins=4, range=(-1.5, 1.5)).compute()
    for j in range(field.shape[1]):
        column = field[:, j, :]
        want = np.histogram(column[~np.isnan(column)], bins=4, range=(-1.5, 1.5))[0]
        np.testing.assert_array_equal(d["histogram"][j], want)


def test_integer_and_bool_inputs():
    a = np.arange(-50, 70, dtype="i2").reshape(12, 10)
    d = ds.describe(da.from_array(a, chunks=5)).compute()
    check(d, expected(a))
    assert d["min"].dtype == np.int16
    b = np.arange(30).reshape(5, 6) % 3 == 0
    check(ds.describe(da.from_array(b, chunks=2)).compute(), expected(b))


def test_stable_std_under_offset():
    rng = np.random.default_rng(5)
    a = (np.float32(1e9) + rng.normal(0, 1000, 500_000)).astype("f4")
    d = ds.describe(da.from_array(a, chunks=30_011)).compute()
    assert d["std"] == pytest.approx(np.std(a.astype("f8")), rel=1e-6)


def test_ddof():
    a = np.random.default_rng(1).random((20, 3))
    d = ds.describe(da.from_array(a, chunks=7), axis=0, ddof=1).compute()
    np.testing.assert_allclose(d["std"], np.std(a, axis=0, ddof=1))


def test_all_nan_and_empty():
    nan = np.full((4, 3), np.nan)
    d = ds.describe(da.from_array(nan, chunks=2)).compute()
    assert d["count"] == 0
    assert d["nan_count"] == 12
    for key in ("mean", "std", "min", "max"):
        assert np.isnan(d[key])


def test_result_object_is_a_mapping_with_html(field):
    d = ds.describe(da.from_array(field, chunks=10)).compute()
    assert set(d) == {"count", "nan_count", "mean", "std", "min", "max"}
    assert "<table>" in d._repr_html_()
    assert "mean" in repr(d)
    assert dict(d)["count"] == d["count"]


class CountingNpySource(NpySource):
    """A real .npy source that also counts the chunk reads it serves (per process)."""

    reads: ClassVar[list] = []
    lock = threading.Lock()

    def _read_box(self, box):
        with self.lock:
            self.reads.append(tuple((s.start, s.stop) for s in box))
        return super()._read_box(box)


@pytest.mark.parametrize("bins", [None, 8])
def test_one_pass_reads_each_chunk_exactly_once(tmp_path, bins):
    a = np.random.default_rng(2).standard_normal((400, 30)).astype("f4")
    np.save(tmp_path / "a.npy", a)
    source = CountingNpySource(tmp_path / "a.npy")
    CountingNpySource.reads.clear()
    x = ds.open(source, chunks=(25, 30))
    lazy = ds.describe(x, bins=bins, range=(-3, 3) if bins else None)
    assert CountingNpySource.reads == []  # lazy: nothing read yet
    with dask.config.set(scheduler="threads"):
        d = lazy.compute()
    assert sorted(CountingNpySource.reads) == sorted(set(CountingNpySource.reads))
    assert len(CountingNpySource.reads) == x.npartitions == 16
    check(d, expected(a))


@pytest.mark.parametrize("axis", [None, 0, (1, 2)], ids=str)
def test_a_bin_count_without_a_range_spreads_over_the_datas_range_in_a_second_pass(tmp_path, field, axis):
    np.save(tmp_path / "a.npy", field)
    source = CountingNpySource(tmp_path / "a.npy")
    CountingNpySource.reads.clear()
    x = ds.open(source, chunks=(10, 19, 6))
    with dask.config.set(scheduler="threads"):
        d = ds.describe(x, axis=axis, bins=7).compute()
    valid = field[~np.isnan(field)]
    edges = np.histogram_bin_edges(valid, bins=7)  # the range of the values that are not NaN
    np.testing.assert_array_equal(d["bin_edges"], edges)
    if axis is None:
        np.testing.assert_array_equal(d["histogram"], np.histogram(valid, bins=edges)[0])
    else:
        kept = [a for a in range(field.ndim) if a not in np.atleast_1d(axis)]
        moved = np.moveaxis(field, kept, list(range(len(kept))))
        rows = moved.reshape(math.prod(field.shape[a] for a in kept), -1)
        want = np.stack([np.histogram(r[~np.isnan(r)], bins=edges)[0] for r in rows])
        np.testing.assert_array_equal(d["histogram"].reshape(want.shape), want)
    check(d, expected(field, axis))
    # Two passes: every chunk read once for the statistics, once for the counts.
    assert len(CountingNpySource.reads) == 2 * x.npartitions


# Arrays whose graph ends in a slice: a getitem layer of dask's task-spec nodes, as xarray's .isel makes.
# Each: what is done before slicing, and the elements the slice takes.
SLICED = {
    "a slice": (None, np.s_[3:37]),
    "a step and a slice": (None, np.s_[::3, 2:]),
    "a slice of a sum": (lambda x: x * 2 + 1, np.s_[5:30, :, 1:]),
}


def sliced(take, x):
    before, region = SLICED[take]
    return (x if before is None else before(x))[region]


def reads_of_each_chunk(compute):
    """How many times each chunk was read while ``compute()`` ran (threads: one process counts them all)."""
    CountingNpySource.reads.clear()
    with dask.config.set(scheduler="threads"):
        result = compute()
    return result, set(collections.Counter(CountingNpySource.reads).values())


def times_each_value_was_read(shape):
    """How many times each element of an array of ``shape`` was read, by the reads counted last."""
    times = np.zeros(shape, dtype=int)
    for box in CountingNpySource.reads:
        times[tuple(slice(start, stop) for start, stop in box)] += 1
    return times


@pytest.mark.parametrize("take", sorted(SLICED))
def test_each_later_pass_over_a_sliced_array_reads_it_again(tmp_path, field, take):
    """The counts' pass and the quartiles' passes read a copy of the data's graph, under keys of their own.

    dask's clone left a slice's tasks taking the original's keys (dask/dask#12455): a later pass then
    took the first pass's blocks (held in memory for it), or failed with a missing dependency where the
    first pass's optimized graph had fused those keys away. At this budget the whole array's values do not
    fit a task: its quartiles take the radix select's passes. A slice may fit one (numpy's selection in one
    task): each of its values is read as often as the same values stored alone.
    """
    np.save(tmp_path / "a.npy", field)
    x = ds.open(CountingNpySource(tmp_path / "a.npy"), chunks=(10, 19, 6), memory_budget="128KiB")
    a = sliced(take, field)
    valid = a[~np.isnan(a)]

    def described(y):
        return ds.describe(y, bins=7, quartiles=True).compute()

    d, _ = reads_of_each_chunk(lambda: described(sliced(take, x)))
    times = times_each_value_was_read(field.shape)
    edges = np.histogram_bin_edges(valid, bins=7)
    np.testing.assert_array_equal(d["bin_edges"], edges)
    np.testing.assert_array_equal(d["histogram"], np.histogram(valid, bins=edges)[0])
    got = np.stack([np.asarray(d[k]) for k in ("25%", "50%", "75%")])
    np.testing.assert_array_equal(got, [np.nanquantile(a, q) for q in (0.25, 0.5, 0.75)])
    check(d, expected(a))
    # Statistics, counts and the radix select's passes over the whole array, each reading every chunk once.
    _, whole = reads_of_each_chunk(lambda: described(x))
    assert len(whole) == 1
    assert min(whole) >= 4
    # As many passes over each chunk of the slice as over the same values stored alone.
    np.save(tmp_path / "alone.npy", a)
    alone = ds.open(CountingNpySource(tmp_path / "alone.npy"), chunks=(10, 19, 6), memory_budget="128KiB")
    reads_of_each_chunk(lambda: described(alone))
    times_alone = set(times_each_value_was_read(a.shape).ravel().tolist())
    assert len(times_alone) == 1
    assert times_alone == set(times[SLICED[take][1]].ravel().tolist())
    along = ds.describe(sliced(take, x), axis=0, bins=5).compute()
    kept = np.moveaxis(a, 0, -1).reshape(-1, a.shape[0])
    want = np.stack([np.histogram(c[~np.isnan(c)], bins=along["bin_edges"])[0] for c in kept])
    np.testing.assert_array_equal(along["histogram"].reshape(want.shape), want)


@pytest.mark.parametrize("take", sorted(SLICED))
def test_a_bin_count_over_a_sliced_dask_array_spreads_over_its_range(field, take):
    """The same over plain dask arrays, which daskstream's optimizer leaves to dask."""
    a = sliced(take, field)
    valid = a[~np.isnan(a)]
    x = sliced(take, da.from_array(field, chunks=(10, 7, 6)))
    d = ds.describe(x, bins=7).compute()
    edges = np.histogram_bin_edges(valid, bins=7)
    np.testing.assert_array_equal(d["bin_edges"], edges)
    np.testing.assert_array_equal(d["histogram"], np.histogram(valid, bins=edges)[0])
    d = ds.describe(x, quartiles=True).compute()
    got = np.stack([np.asarray(d[k]) for k in ("25%", "50%", "75%")])
    np.testing.assert_array_equal(got, [np.nanquantile(a, q) for q in (0.25, 0.5, 0.75)])


def test_a_bin_count_over_data_with_no_finite_range_says_to_give_one():
    a = np.array([1.0, np.inf, 2.0])
    with pytest.raises(InvalidArgumentError, match=r"not finite.*range="):
        ds.describe(da.from_array(a, chunks=2), bins=4).compute()


def test_an_adaptive_describe_of_a_bin_count_without_range_says_why(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(100.0))
    with pytest.raises(InvalidArgumentError, match="reads the data once"):
        ds.describe(str(tmp_path / "a.npy"), bins=4, adaptive=True)


@pytest.mark.parametrize("dtype", ["f4", "f8", "i2", "u8"])
@pytest.mark.parametrize("axis", [None, 0, (0, 2)], ids=str)
def test_quartiles_are_numpys_nanquantile_exactly(field, dtype, axis):
    a = field if dtype[0] == "f" else (np.nan_to_num(field) * 1000).astype(dtype)
    if dtype == "f8":
        a = a.astype("f8")
    d = ds.describe(da.from_array(a, chunks=(9, 7, 4)), axis=axis, quartiles=True).compute()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the all-NaN column
        # Each quartile is numpy's for that q asked alone, as a user checks "25%" against it.
        want = [np.nanquantile(a, q, axis=axis) for q in (0.25, 0.5, 0.75)]
    for key, one in zip(("25%", "50%", "75%"), want):
        assert np.asarray(d[key]).dtype == np.asarray(one).dtype, key
        np.testing.assert_array_equal(d[key], one)
    assert list(d) == ["count", "nan_count", "mean", "std", "min", "25%", "50%", "75%", "max"]
    check(d, expected(a, axis))


@pytest.mark.parametrize("dtype", ["f2", "f4"])
@pytest.mark.parametrize("axis", [None, 0, 1], ids=str)
def test_quartiles_of_half_and_single_precision_are_numpys_in_dtype_and_value(dtype, axis):
    # numpy interpolates between two order statistics in their own dtype (2048 - 0.1 in float16 is 2048),
    # so its quartiles are not those of the float64 upcast. 65504 is float16's largest finite value.
    a = np.array(
        [[0.1, 2048.0, np.nan, 7.3], [0.1, 2048.0, -3.0, 65504.0], [-65504.0, 1e-4, 0.5, np.inf], [3.3, 0.2, 9.9, 1.7]],
        dtype=dtype,
    )
    d = ds.describe(da.from_array(a, chunks=(3, 2)), axis=axis, quartiles=True).compute()
    got = np.stack([np.asarray(d[k]) for k in ("25%", "50%", "75%")])
    # numpy 2's nanquantile(a, 0.25) of float16 data is float16, interpolated in float16 (numpy 1 gives
    # float64): "25%" is whatever numpy gives.
    want = np.stack([np.nanquantile(a, q, axis=axis) for q in (0.25, 0.5, 0.75)])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if want.dtype == np.dtype(dtype):
        upcast = np.stack([np.nanquantile(a.astype("f8"), q, axis=axis) for q in (0.25, 0.5, 0.75)])
        assert not np.array_equal(want.astype("f8"), upcast, equal_nan=True)  # (the data tell the two apart)


def test_quartiles_of_what_has_no_order_are_refused():
    with pytest.raises(UnsupportedDtypeError, match="quartiles"):
        ds.describe(da.from_array(np.array([1 + 1j, 2j])), quartiles=True)


def test_a_description_says_what_it_describes_and_reads_as_a_table(tmp_path, field):
    path = tmp_path / "field.npy"
    np.save(path, field)
    x = ds.open(path)
    d = ds.describe(x, bins=3, range=(-3, 3)).compute()
    text = repr(d)
    assert text.splitlines()[0] == f"describe of {path} (41, 19, 6) float32, over all axes"
    assert "..." not in text
    assert re.search(r"^  count +\d+$", text, re.M)
    assert re.search(r"^  mean +-?\d\.\d+(e-?\d+)?$", text, re.M)  # 6 significant digits, no numpy repr
    assert re.search(r"^ +-3 \.\. -1 +\d+$", text, re.M)  # the histogram as bins
    frame = d.to_dataframe()
    assert list(frame.index) == ["count", "nan_count", "mean", "std", "min", "max"]
    assert frame.loc["count", str(path)] == np.sum(~np.isnan(field))
    html = d._repr_html_()
    assert f"{path} (41, 19, 6) float32" in html
    assert html.count("<rect") == 3  # the histogram's bars beside the table
    # Computed from the source, it is no longer the source: not named after it.
    assert ds.describe(x - 1).compute().name is None


def test_a_per_axis_description_summarises_each_statistic_in_a_line(field):
    d = ds.describe(da.from_array(field, chunks=10), axis=0).compute()
    text = repr(d)
    assert "over axis 0, per position of the other axes (19, 6)" in text
    assert len(text.splitlines()) == 1 + 6  # a title and one line per statistic, not six 19 x 6 arrays
    assert re.search(r"^  mean +\(19, 6\) float64: min -?\d.*, mean .*, max .*$", text, re.M)
    frame = d.to_dataframe()
    assert frame.shape == (19 * 6, 6)
    assert frame.index.names == ["axis 1", "axis 2"]
    np.testing.assert_array_equal(frame["max"].to_numpy().reshape(19, 6), d["max"])


def test_plot_draws_the_histogram(field):
    pytest.importorskip("matplotlib")
    d = ds.describe(da.from_array(field, chunks=10), bins=5, range=(-2, 2)).compute()
    figure = d.plot()
    (ax,) = figure.axes
    assert [int(p.get_height()) for p in ax.patches] == d["histogram"].tolist()
    with pytest.raises(InvalidArgumentError, match="bins="):
        ds.describe(da.from_array(field, chunks=10)).compute().plot()


def complex_expected(a, axis, ddof):
    """numpy's statistics of complex data, each column without its NaN elements (NaN in either part)."""
    moved = np.moveaxis(a, axis, -1)
    columns = [row[~np.isnan(row)] for row in moved.reshape(-1, moved.shape[-1])]
    shape = moved.shape[:-1]

    def each(statistic):
        return np.array([statistic(c) for c in columns]).reshape(shape)

    return {
        "count": each(len),
        "nan_count": each(lambda c: moved.shape[-1] - len(c)),
        "mean": each(np.mean),
        "std": each(lambda c: np.std(c, ddof=ddof)),
        "min": each(np.min),  # numpy's order of complex numbers: real part, then imaginary
        "max": each(np.max),
    }


@pytest.mark.parametrize("dtype", ["c8", "c16"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_complex_data_is_described_as_numpy_computes_each_statistic(tmp_path, dtype, axis):
    rng = np.random.default_rng(11)
    a = (rng.normal(3, 2, (60, 41)) + 1j * rng.normal(-1, 5, (60, 41))).astype(dtype)
    a[3, 4] = complex(np.nan, 1.0)  # NaN in one part makes the element a NaN
    a[7, 8] = complex(2.0, np.nan)
    a[50, 40] = complex(a[:, 40].real.min(), -1e9)  # a tie on the real part: the imaginary part decides
    np.save(tmp_path / "z.npy", a)
    x = ds.open(tmp_path / "z.npy", memory_budget="128KiB")  # many chunks: the merges are exercised
    assert x.numblocks != (1, 1)
    got = ds.describe(x, axis=axis, ddof=1).compute()
    flat = a.reshape(1, -1) if axis is None else a
    want = complex_expected(flat, -1 if axis is None else axis, ddof=1)
    for key in ("count", "nan_count", "min", "max"):
        np.testing.assert_array_equal(np.ravel(got[key]), np.ravel(want[key]), err_msg=key)
    tolerance = 1e-5 if dtype == "c8" else 1e-12
    for key in ("mean", "std"):
        np.testing.assert_allclose(np.ravel(got[key]), np.ravel(want[key]), rtol=tolerance, err_msg=key)
    assert np.iscomplexobj(got["mean"])
    assert not np.iscomplexobj(got["std"])


def test_a_histogram_of_complex_data_is_refused_saying_what_to_describe():
    with pytest.raises(UnsupportedDtypeError, match=r"abs\(x\), x.real or x.imag"):
        ds.describe(da.from_array(np.array([1 + 2j])), bins=4, range=(0, 1))


def test_refuses_what_is_not_numbers():
    with pytest.raises(UnsupportedDtypeError, match=r"describe needs numbers \(integer, float or complex\)"):
        ds.describe(da.from_array(np.array(["a", "b"])))


def test_on_every_scheduler(tmp_path):
    a = np.random.default_rng(4).standard_normal((300, 20))
    np.save(tmp_path / "a.npy", a)
    x = ds.open(tmp_path / "a.npy", memory_budget="256KiB")
    for scheduler in ("sync", "threads", "processes"):
        check(ds.describe(x, axis=0).compute(scheduler=scheduler), expected(a, 0))


@pytest.mark.parametrize("offset", [0.0, 1e6], ids=["centred", "offset"])
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_compiled_and_numpy_chunk_paths_agree(offset, dtype):
    """The numba one-pass kernel and the numpy fallback give the same statistics as numpy."""
    from daskstream.compute.describe import _compiled_shifted_sums, _finite_float_statistics

    assert _compiled_shifted_sums() is not None  # the test extra installs numba
    rng = np.random.default_rng(9)
    block = (offset + rng.normal(0, 3, (300, 70))).astype(dtype)
    want_mean = block.astype("f8").mean()
    want_m2 = ((block.astype("f8") - want_mean) ** 2).sum()
    spread = block.astype("f8").std()
    # The compiled kernel accumulates in float64; the numpy fallback sums rows in the data's dtype,
    # which the docs bound by 1e-7 of the data's spread for float32 data.
    for compiled, mean_error in ((True, 1e-12 * abs(want_mean) + 1e-12), (False, 1e-7 * spread)):
        stats = _finite_float_statistics(block, compiled=compiled)
        assert abs(stats["mean"].item() - want_mean) <= mean_error
        assert stats["m2"].item() == pytest.approx(want_m2, rel=1e-6)
        assert stats["min"].item() == block.min()
        assert stats["max"].item() == block.max()
    # NaN or inf in the chunk: both paths hand over to the masked computation.
    block[3, 4] = np.nan
    assert _finite_float_statistics(block, compiled=True) is None
    assert _finite_float_statistics(block, compiled=False) is None


def test_half_precision_does_not_overflow():
    a = np.array([0, 512, 300, 65000], dtype="f2")
    d = ds.describe(da.from_array(a, chunks=2)).compute()
    check(d, expected(a))
    d = ds.describe(da.from_array(a.reshape(2, 2), chunks=1), axis=0).compute()
    check(d, expected(a.reshape(2, 2), 0))


@pytest.mark.parametrize("seed", range(4))
def test_quartiles_of_many_float16_values_are_numpys_float16_quartiles(seed):
    # Interpolating in float16 (numpy's, for q asked alone) and in float64 give other numbers here.
    a = (np.random.default_rng(seed).standard_normal(1000) * 1000).astype("f2")
    d = ds.describe(da.from_array(a, chunks=100), quartiles=True).compute()
    for key, q in (("25%", 0.25), ("50%", 0.5), ("75%", 0.75)):
        want = np.nanquantile(a, q)
        assert np.asarray(d[key]).dtype == want.dtype  # float16 on numpy 2
        assert d[key] == want, (key, d[key], want)
