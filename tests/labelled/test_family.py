"""Many NetCDF4 files of one family: ds.open_dataset reads one file's labels and a header of each other, and
gives the Dataset xarray.open_mfdataset gives (the oracle), files written by xarray itself."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import daskstream as ds
from daskstream.errors import FileFamilyError

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

# What ds.open_dataset does with many files, as open_mfdataset's arguments.
COMBINE = {"data_vars": "minimal", "coords": "minimal", "compat": "override", "join": "exact",
           "combine_attrs": "drop_conflicts"}  # fmt: skip


def write_days(folder, count, *, lat=6, shape_of=None, packed=False, bounds=False, history=True, first=0):
    """Daily files day-<n>.nc as xarray writes them (h5netcdf): each its own date as its time units, a
    float32 field, a static field without time; optionally packed with a scale of its own, and time bounds.
    """
    paths = []
    for day in range(first, first + count):
        rows = (shape_of or {}).get(day, lat)
        time: object = pd.date_range("2001-01-01", periods=400)[day : day + 1]
        tas = np.random.default_rng(day).standard_normal((1, rows, 8)).astype("f4")
        variables = {
            "tas": (("time", "lat", "lon"), tas, {"units": "K", "long_name": "air temperature"}),
            "orography": (("lat", "lon"), np.full((rows, 8), float(day))),
        }
        if bounds:
            # As stored, in hours since the file's day; the bounds without units of their own (CF lets them
            # take the coordinate's).
            variables["time_bnds"] = (("time", "nv"), np.array([[0.0, 24.0]]))
            since = {"units": f"hours since 2001-01-{day + 1:02d}", "calendar": "standard", "bounds": "time_bnds"}
            time = ("time", np.array([12.0]), since)
        coords = {"time": time, "lat": np.linspace(-60, 60, rows), "lon": np.arange(8.0)}
        attrs = {"title": "days", **({"history": f"written as day {day}"} if history else {})}
        dataset = xr.Dataset(variables, coords=coords, attrs=attrs)
        encoding = {}
        if packed:
            encoding["tas"] = {"dtype": "i2", "scale_factor": 0.001 * (day + 1), "add_offset": 0.5, "_FillValue": -1}
        path = folder / f"day-{day}.nc"
        dataset.to_netcdf(path, engine="h5netcdf", encoding=encoding)
        paths.append(path)
    return paths


def oracle(paths, **options):
    return xr.open_mfdataset(paths, engine="h5netcdf", **COMBINE, **options)


@pytest.mark.parametrize(
    ("writing", "options", "opened"),
    [
        # xarray's daily files: each file's time in units of its own date, attributes that differ dropped
        ({}, {}, 1),
        # packed numbers, each file with its own scale: each decoded with its own
        ({"packed": True}, {}, 1),
        # time bounds, which take their units from each file's time: decoding times reads their first and
        # last values (xarray's decoders do, to choose the dtype), so each file is opened at once
        ({"bounds": True}, {}, 12),
        # the numbers as stored
        ({"packed": True}, {"decode_cf": False, "concat_dim": "time"}, 1),
        # dropped variables are not read in any file
        ({}, {"drop_variables": ["orography"]}, 1),
    ],
    ids=["daily", "packed", "bounds", "undecoded", "dropped"],
)
def test_a_family_opens_as_open_mfdataset_combines_it_reading_one_files_metadata(
    tmp_path, full_opens, writing, options, opened
):
    paths = write_days(tmp_path, 12, **writing)
    ours = ds.open_dataset(str(tmp_path / "day-*.nc"), **options)
    # One file's labels and sources were opened in full; the others only through their headers.
    assert str(paths[0]) in full_opens
    assert len(full_opens) == opened
    nested = {"combine": "nested", "concat_dim": options.pop("concat_dim")} if "concat_dim" in options else {}
    want = oracle(paths, **nested, **{k: v for k, v in options.items() if k != "decode_cf"},
                  **({"decode_cf": False} if "decode_cf" in options else {}))  # fmt: skip
    xr.testing.assert_identical(ours, want)
    # Each other file is opened in full at its first read, once.
    ours.load(scheduler="sync")
    assert set(full_opens) == {str(p) for p in paths}
    xr.testing.assert_identical(ours, want.load())


def test_files_listed_out_of_order_are_ordered_by_their_coordinate(tmp_path):
    paths = write_days(tmp_path, 6)
    shuffled = [paths[i] for i in (3, 0, 5, 1, 4, 2)]
    ours = ds.open_dataset(shuffled)
    xr.testing.assert_identical(ours, oracle(shuffled))
    assert ours.orography.values[0, 0] == 0.0  # what is not joined comes from the first file in time, as in xarray
    # Along concat_dim the files stay in the order given.
    nested = ds.open_dataset(shuffled, concat_dim="time")
    xr.testing.assert_identical(nested, oracle(shuffled, combine="nested", concat_dim="time"))


def test_the_engine_opens_a_pattern_as_open_dataset_does(tmp_path):
    write_days(tmp_path, 5)
    pattern = str(tmp_path / "day-*.nc")
    ours = ds.open_dataset(pattern)
    xr.testing.assert_identical(xr.open_dataset(pattern, engine="daskstream"), ours)
    chunked = xr.open_dataset(pattern, engine="daskstream", chunks={})  # daskstream's chunks, as for one file
    xr.testing.assert_identical(chunked, ours)
    assert chunked.tas.chunks == ours.tas.chunks
    with pytest.raises(ds.DaskstreamError, match="concat_dim='time' joins many files"):
        xr.open_dataset(tmp_path / "day-0.nc", engine="daskstream", concat_dim="time")


def test_a_file_of_another_shape_is_named_at_open_with_what_differs(tmp_path):
    write_days(tmp_path, 4, shape_of={2: 7})
    with pytest.raises(FileFamilyError) as caught:
        ds.open_dataset(str(tmp_path / "day-*.nc"))
    message = str(caught.value)
    assert "day-2.nc: variable 'tas' has shape (1, 7, 8), not (1, 6, 8) (lat: 7, not 6)" in message
    assert "cannot be joined along 'time'" in message
    assert isinstance(caught.value, ValueError)


def test_files_that_are_not_one_family_are_combined_as_xarray_combines_them(tmp_path, full_opens):
    # Tiles along two dimensions: every file is opened in full and xarray combines them.
    paths = []
    for row in range(2):
        for day in range(2):
            tile = xr.Dataset(
                {"tas": (("time", "lat"), np.full((1, 3), 10.0 * row + day, "f4"))},
                coords={"time": pd.date_range("2001-01-01", periods=2)[day : day + 1],
                        "lat": np.arange(3.0) + 3 * row},
            )  # fmt: skip
            paths.append(tmp_path / f"tile-{row}-{day}.nc")
            tile.to_netcdf(paths[-1], engine="h5netcdf")
    ours = ds.open_dataset(paths)
    xr.testing.assert_identical(ours, oracle(paths))
    assert set(full_opens) == {str(p) for p in paths}
