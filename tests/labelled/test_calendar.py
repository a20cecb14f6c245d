"""Chunks that fit calendar analyses: whole years (else months) along time, chunks by dimension name, and
rolling windows planned as the views they are; xarray's own engine is the oracle."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

import daskstream as ds
from daskstream.errors import InvalidChunksError

xr = pytest.importorskip("xarray")
pytest.importorskip("flox")


def write_daily(path, start="2001-03-01", days=6 * 365 + 40, calendar=None, storage_days=1):
    """A daily field (time, lat, lon), NetCDF4 with ``storage_days`` days per chunk; the dataset written."""
    if calendar is None:
        time = pd.date_range(start, periods=days, freq="D")
    else:
        time = xr.date_range(start, periods=days, freq="D", calendar=calendar, use_cftime=True)
    rng = np.random.default_rng(5)
    values = (10 + rng.standard_normal((days, 6, 8))).astype("f4")
    written = xr.Dataset(
        {"t": (("time", "lat", "lon"), values), "mask": (("lat", "lon"), np.ones((6, 8), "f4"))},
        coords={"time": time, "lat": np.arange(6.0), "lon": np.arange(8.0)},
    )
    written.to_netcdf(path, engine="h5netcdf", encoding={"t": {"chunksizes": (storage_days, 6, 8)}})
    return written


def starts(index, attribute):
    values = getattr(index, attribute)
    return {i for i in range(1, len(index)) if values[i] != values[i - 1]}


def ends(chunks):
    return set(itertools.accumulate(chunks[:-1]))


def test_chunks_along_time_hold_whole_years_and_groupby_results_are_xarrays(tmp_path):
    path = tmp_path / "daily.nc"
    written = write_daily(path)
    t = ds.open_dataset(path)["t"]
    time = written.indexes["time"]
    assert ends(t.data.chunks[0]) == starts(time, "year")
    assert t.data.chunks[1:] == ((6,), (8,))
    oracle = xr.open_dataset(path, engine="h5netcdf")["t"].load()
    climatology = t.groupby("time.month").mean()
    anomaly = (t.groupby("time.month") - climatology).std("time")
    np.testing.assert_allclose(climatology.values, oracle.groupby("time.month").mean().values, rtol=1e-6)
    np.testing.assert_allclose(
        anomaly.values,
        (oracle.groupby("time.month") - oracle.groupby("time.month").mean()).std("time").values,
        rtol=1e-5,
    )
    monthly = t.resample(time="MS").mean()
    np.testing.assert_allclose(monthly.values, oracle.resample(time="MS").mean().values, rtol=1e-6)


def test_under_a_budget_a_year_does_not_fit_the_grid_is_cut_before_the_year(tmp_path):
    path = tmp_path / "daily.nc"
    written = write_daily(path)
    time = written.indexes["time"]
    year = 366 * 8 * 4  # a leap year of one latitude row
    # A thread's share of the budget over a calendar analysis's working set (11 for float32: the block and five
    # float64 copies) holds a year of 2.5 of the 6 rows.
    cut = ds.open_dataset(path, memory_budget=2 * 11 * int(2.5 * year))["t"]
    assert ends(cut.data.chunks[0]) == starts(time, "year")
    assert cut.data.chunks[1] == (2, 2, 2)
    oracle = xr.open_dataset(path, engine="h5netcdf")["t"].load()
    np.testing.assert_allclose(
        cut.groupby("time.month").std().values, oracle.groupby("time.month").std().values, rtol=1e-5
    )
    # Not a year of one row: whole months of the whole grid.
    by_month = ds.open_dataset(path, memory_budget=2 * 11 * 40 * 6 * 8 * 4)["t"]
    assert ends(by_month.data.chunks[0]) <= starts(time, "month")
    assert max(by_month.data.chunks[0]) <= 40
    assert by_month.data.chunks[1] == (6,)
    by_planner = ds.open_dataset(path, memory_budget=2 * 11 * 20 * 6 * 8 * 4)["t"]
    assert not ends(by_planner.data.chunks[0]) <= starts(time, "month")


def test_a_cftime_calendar_and_storage_chunks_of_several_days(tmp_path):
    path = tmp_path / "noleap.nc"
    written = write_daily(path, start="2001-01-01", days=4 * 365, calendar="noleap", storage_days=5)
    t = ds.open_dataset(path)["t"]
    assert t.data.chunks[0] == (365,) * 4  # every year starts on a multiple of 5 days here
    np.testing.assert_array_equal(t.values, written.t.values)
    shifted = tmp_path / "shifted.nc"
    write_daily(shifted, start="2001-01-03", days=4 * 365, calendar="noleap", storage_days=5)
    # Years start two days into a storage chunk: no period is whole in storage chunks, so no chunk moves.
    assert all(c % 5 == 0 for c in ds.open_dataset(shifted)["t"].data.chunks[0][:-1])


def test_chunks_by_dimension_name_as_xarray_takes_them(tmp_path):
    path = tmp_path / "daily.nc"
    write_daily(path)
    opened = ds.open_dataset(path, chunks={"time": 100, "lon": -1})
    assert opened.t.data.chunks[0][:3] == (100, 100, 100)
    assert opened.t.data.chunks[2] == (8,)
    assert opened.mask.data.chunks == ((6,), (8,))  # no time: the other dimensions as given
    with pytest.raises(InvalidChunksError, match=r"no dimension 'tme'; its dimensions are lat, lon, time"):
        ds.open_dataset(path, chunks={"tme": 100})


def test_a_rolling_window_is_planned_as_a_view_of_its_block_not_window_copies(tmp_path):
    path = tmp_path / "daily.nc"
    write_daily(path)
    t = ds.open_dataset(path)["t"]
    rolled = t.rolling(time=30).mean().max("time")
    plan = ds.plan_compute(rolled.data)
    block = max(t.data.chunks[0]) * 6 * 8 * 4
    assert plan.worst is not None
    assert plan.worst.peak_bytes < 10 * block
    oracle = xr.open_dataset(path, engine="h5netcdf")["t"].load()
    np.testing.assert_allclose(rolled.values, oracle.rolling(time=30).mean().max("time").values, rtol=1e-5)


def test_a_climatology_flox_reduces_by_cohorts_is_projected_by_what_each_task_takes(tmp_path):
    path = tmp_path / "daily.nc"
    written = write_daily(path)
    # A day per block: flox reduces each month's days as a cohort, a tree of combines per month in one layer.
    t = ds.open_dataset(path, chunks={"time": 1})["t"]
    climatology = t.groupby("time.month").mean()
    assert any("cohorts" in name for name in climatology.data.__dask_graph__().layers)
    plan = ds.plan_compute(climatology.data)
    partial_bytes = 6 * 8 * 12  # a day's partial: a float32 sum and an int64 count per cell, one month
    # Each combine holds the few partials it takes (flox combines 4 at a time here), not the dozens of days a
    # level of the month's tree reaches through the layer.
    assert plan.worst.peak_bytes <= 10 * partial_bytes
    assert plan.projected_peak_bytes <= plan.budget
    got = climatology.compute()
    xr.testing.assert_allclose(got, written["t"].groupby("time.month").mean(), rtol=1e-6)


@pytest.mark.parametrize(
    ("units", "calendar", "values"),
    [
        ("hours since 1700-01-01", "proleptic_gregorian", np.arange(0, 4_000_000, 997)),
        ("days since 2001-03-01 00:00:00", None, np.arange(3_000)),
        ("minutes since 1970-01-01T06:00:00", "standard", np.arange(0, 10**6, 7, dtype="u4")),
        ("seconds since 1900-02-28 12:00", "proleptic_gregorian", np.arange(0, 10**9, 86_399)),
    ],
)
def test_time_offsets_are_the_dates_xarray_decodes(units, calendar, values):
    from daskstream.labelled.calendar import gregorian_dates, period_starts

    attrs = {"units": units} if calendar is None else {"units": units, "calendar": calendar}
    raw = xr.Variable(("time",), values, attrs)
    fast = gregorian_dates(raw)
    decoded = xr.conventions.decode_cf_variable("time", raw).values
    assert fast is not None
    np.testing.assert_array_equal(fast.astype("datetime64[ns]"), decoded.astype("datetime64[ns]"))
    assert period_starts(fast) == period_starts(decoded)


@pytest.mark.parametrize(
    "attrs",
    [
        {"units": "days since 2000-01-01", "calendar": "noleap"},  # not numpy's calendar
        {"units": "days since 1500-01-01"},  # the standard calendar before its reform is Julian
        {"units": "days since 2000-01-01", "_FillValue": -1},
        {"units": "days since 2000-01-01 00:00:00 +05:00"},  # a time zone numpy does not read
        {"units": "months since 2000-01-01"},
    ],
)
def test_time_offsets_numpy_would_misdate_are_left_to_xarray(attrs):
    from daskstream.labelled.calendar import gregorian_dates

    assert gregorian_dates(xr.Variable(("time",), np.arange(10), attrs)) is None
    assert gregorian_dates(xr.Variable(("time",), np.arange(10.0), {"units": "days since 2000-01-01"})) is None
