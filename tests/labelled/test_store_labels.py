"""ds.store of a DataArray or Dataset: xarray reads back what was stored, labels and all."""

from __future__ import annotations

import warnings

import dask.array as da
import h5py
import numpy as np
import pandas as pd
import pytest
from test_dataset import write_netcdf

import daskstream as ds
from daskstream.errors import InvalidArgumentError

xr = pytest.importorskip("xarray")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (NaN means of all-fill columns)


def _field(dtype="f4"):
    """A labelled field with the values xarray's Zarr encoding trips on: zeros, NaNs, times, a 2-D coordinate."""
    rng = np.random.default_rng(0)
    values = rng.integers(-3, 4, (24, 6, 8)).astype(dtype)  # many zeros
    if np.dtype(dtype).kind == "f":
        values[0, 0, :3] = np.nan
    return xr.DataArray(
        da.from_array(values, chunks=(8, 6, 8)),
        dims=("time", "lat", "lon"),
        coords={
            "time": pd.date_range("2000-01-01", periods=24, freq="D"),
            "lat": np.linspace(-60, 60, 6),
            "lon": np.arange(8) * 45.0,
            "cell_area": (("lat", "lon"), rng.random((6, 8))),  # a coordinate that is no dimension
        },
        name="t",
        attrs={"units": "K", "long_name": "temperature", "valid_max": np.float32(330.0)},
    )


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("dtype", ["f4", "i2"])
def test_a_data_array_stored_reads_back_identical(tmp_path, zarr_format, dtype):
    x = _field(dtype)
    target = str(tmp_path / "out.zarr")
    got = ds.store(x, target, zarr_format=zarr_format)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated, as xarray's own stores: opened with no warning
        back = xr.open_zarr(target)["t"]
    xr.testing.assert_identical(back.compute(), x.compute())
    xr.testing.assert_identical(got.compute(), x.compute())  # what store returns is that too
    assert back.dtype == np.dtype(dtype)  # zeros of an int array not read as missing
    # Written by daskstream in the chunks it planned, resumably: stored again, nothing is left to write.
    done = []
    ds.store(x, target, zarr_format=zarr_format, progress=lambda d, t: done.append((d, t)))
    assert done[0][0] == done[0][1]
    xr.testing.assert_identical(xr.open_zarr(target)["t"].compute(), x.compute())


def test_an_unnamed_data_array_and_a_named_member(tmp_path):
    x = _field().rename(None)
    ds.store(x, str(tmp_path / "a.zarr"))
    xr.testing.assert_identical(xr.open_dataarray(tmp_path / "a.zarr", engine="zarr").compute(), x.compute())
    ds.store(_field(), f"{tmp_path / 'b.zarr'}::air")
    back = xr.open_zarr(tmp_path / "b.zarr")["air"]
    xr.testing.assert_identical(back.compute(), _field().rename("air").compute())


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_dataset_stored_reads_back_identical(tmp_path, zarr_format):
    field = _field()
    dataset = xr.Dataset(
        {"t": field, "mask": (("lat", "lon"), np.arange(48, dtype="i4").reshape(6, 8) % 2)},
        attrs={"title": "a test field", "history": "made here"},
    )
    stored = ds.store(dataset, str(tmp_path / "d.zarr"), zarr_format=zarr_format)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "d.zarr").compute(), dataset.compute())
    xr.testing.assert_identical(stored.compute(), dataset.compute())
    with pytest.raises(InvalidArgumentError, match="root group"):
        ds.store(dataset, f"{tmp_path / 'e.zarr'}::inner")


def test_a_decoded_netcdf_variable_opened_by_daskstream_stores_as_xarray_reads_it(tmp_path):
    path = tmp_path / "ocean.nc"
    write_netcdf(path)
    chl = ds.open_dataset(path)["chl"]  # packed on disk, decoded (scaled, fill masked), times decoded
    ds.store(chl, str(tmp_path / "chl.zarr"))
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "chl.zarr")["chl"].compute(), chl.compute())


def test_an_hdf5_target_keeps_dimension_names_and_attributes_and_refuses_a_dataset(tmp_path):
    x = _field()
    ds.store(x, f"{tmp_path / 'out.h5'}::/t")
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert [dim.label for dim in f["t"].dims] == ["time", "lat", "lon"]
        assert f["t"].attrs["units"] == "K"
        np.testing.assert_array_equal(f["t"][...], x.values)
    with pytest.raises(InvalidArgumentError, match="a Dataset is stored to a Zarr store"):
        ds.store(x.to_dataset(), f"{tmp_path / 'out.h5'}::/d")
