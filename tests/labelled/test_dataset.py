"""ds.open_dataset and xarray's engine="daskstream" against xarray's own engines (h5netcdf, zarr) on real files."""

from __future__ import annotations

import itertools
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

import daskstream as ds
from daskstream.errors import InvalidAxisError
from daskstream.labelled.backend import DaskstreamBackendEntrypoint

xr = pytest.importorskip("xarray")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (NaN means of all-fill columns)


WRITER = Path(__file__).with_name("netcdf_writer.py")


def write_netcdf(path, days=20, first_day=0):
    """A NetCDF4 file as the NetCDF-C library writes it (see netcdf_writer.py); the oracle it decodes.

    netCDF4 runs in a process of its own: its wheel carries its own HDF5
    library, and once loaded beside h5py's it breaks hdf5plugin's filters for
    every later test of this process.
    """
    oracle = Path(f"{path}.chl.npy")
    done = subprocess.run(
        [sys.executable, str(WRITER), str(path), str(days), str(first_day), str(oracle)], capture_output=True, text=True
    )
    if done.returncode != 0:
        if "No module named 'netCDF4'" in done.stderr:
            pytest.skip("netCDF4 is not installed")
        pytest.fail(done.stderr)
    return np.load(oracle)


def opened(path, dataset):
    """``ds.open`` of a packed variable, as stored (its warning is tested on its own)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.errors.PackedDataWarning)
        return ds.open(path, dataset=dataset)


@pytest.fixture
def netcdf(tmp_path):
    path = tmp_path / "ocean.nc"
    return path, write_netcdf(path)


def test_a_netcdf4_file_opens_as_xarray_opens_it_decoded_with_daskstreams_chunks(netcdf):
    path, chlorophyll = netcdf
    ours = ds.open_dataset(path)
    xr.testing.assert_identical(ours, xr.open_dataset(path, engine="h5netcdf"))
    # The packed, mostly-fill variable is decoded: fill is NaN, the numbers scaled.
    np.testing.assert_allclose(ours.chl.values, chlorophyll)
    assert float(ours.chl.mean()) == pytest.approx(float(np.nanmean(chlorophyll)))
    assert float(ours.chl.min()) >= 0.0  # never the fill value -32767 (nor its scaled -277.67)
    # Each variable is a dask array daskstream planned: whole storage chunks (5 times) per task.
    assert isinstance(ours.chl.data, type(opened(path, "chl")))
    assert all(size % 5 == 0 for size in ours.chl.data.chunks[0][:-1])
    assert ours.chl.data.chunks == opened(path, "chl").chunks
    assert ours.chl.encoding["preferred_chunks"]["time"] == ours.chl.data.chunks[0][0]
    # Variable-length strings are read by xarray's reader, as xarray reads them; no variable is lost.
    assert list(ours.station.values[:2]) == ["st-0", "st-1"]
    assert ours.time.dtype.kind == "M"
    assert str(ours.time.values[3])[:10] == "2000-01-04"


def test_groups_undecoded_data_and_a_small_memory_budget(netcdf):
    path, _ = netcdf
    sub = ds.open_dataset(path, group="instrument")
    xr.testing.assert_identical(sub, xr.open_dataset(path, engine="h5netcdf", group="instrument"))
    raw = ds.open_dataset(path, decode_cf=False)
    xr.testing.assert_identical(raw, xr.open_dataset(path, engine="h5netcdf", decode_cf=False))
    assert raw.chl.dtype == np.int16
    assert int(raw.chl.min()) == -32767
    times = ds.open_dataset(path, decode_times=False)
    assert times.time.dtype == np.float64
    assert times.chl.dtype == np.float64
    small = ds.open_dataset(path, memory_budget="256KiB")
    assert max(small.chl.data.chunks[0]) < max(ds.open_dataset(path).chl.data.chunks[0])
    with pytest.raises(KeyError, match="no such group 'nowhere'; its groups are: instrument"):
        ds.open_dataset(path, group="nowhere")
    with pytest.raises(ds.DaskstreamError, match="takes no option 'decode_time'"):
        ds.open_dataset(path, decode_time=False)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_store_xarray_wrote_opens_as_xarrays_zarr_engine_opens_it(tmp_path, zarr_format):
    rng = np.random.default_rng(1)
    values = rng.random((12, 20, 30)).astype("f4")
    values[values > 0.9] = np.nan
    written = xr.Dataset(
        {
            "t": (("time", "y", "x"), values, {"units": "K"}),
            "count": (("y", "x"), rng.integers(0, 100, (20, 30)).astype("i4")),
        },
        coords={
            "time": pd.date_range("2020-01-01", periods=12),
            "y": np.arange(20.0),
            "x": np.arange(30.0),
            "lat": (("y", "x"), rng.random((20, 30))),
        },
        attrs={"source": "model run 7"},
    )
    written["t"].encoding = {"chunks": (4, 10, 10)}
    path = tmp_path / "field.zarr"
    written.to_zarr(path, zarr_format=zarr_format, consolidated=zarr_format == 2)
    ours = ds.open_dataset(path)
    xr.testing.assert_identical(ours, xr.open_dataset(path, engine="zarr"))
    xr.testing.assert_identical(ours, written)
    assert "lat" in ours.coords
    assert ours.t.attrs == {"units": "K"}
    assert all(size % 4 == 0 for size in ours.t.data.chunks[0][:-1])
    assert all(size % 10 == 0 for axis in ours.t.data.chunks[1:] for size in axis[:-1])
    raw = ds.open_dataset(path, decode_cf=False)
    xr.testing.assert_identical(raw, xr.open_dataset(path, engine="zarr", decode_cf=False))
    with pytest.raises(KeyError, match="no such group 't'; it has no groups below the root"):
        ds.open_dataset(path, group="t")


def test_xarrays_open_dataset_and_open_mfdataset_take_the_daskstream_engine(tmp_path):
    paths = [tmp_path / f"day-{first}.nc" for first in (0, 10, 20)]
    for first, path in zip((0, 10, 20), paths, strict=True):
        write_netcdf(path, days=10, first_day=first)
    engine = DaskstreamBackendEntrypoint
    one = xr.open_dataset(paths[0], engine=engine, chunks={})
    xr.testing.assert_identical(one, xr.open_dataset(paths[0], engine="h5netcdf"))
    assert one.chl.chunks == opened(paths[0], "chl").chunks  # chunks={}: daskstream's plan
    lazy = xr.open_dataset(paths[0], engine=engine)  # xarray's default: lazily loaded
    xr.testing.assert_identical(lazy.load(), xr.open_dataset(paths[0], engine="h5netcdf").load())
    # Variables without a time axis (the stations) are taken from the first file, not repeated per file.
    combine = {"data_vars": "minimal", "coords": "minimal", "compat": "override", "join": "exact"}
    many = xr.open_mfdataset(paths, engine=engine, **combine)
    want = xr.open_mfdataset(paths, engine="h5netcdf", **combine, combine_attrs="drop_conflicts")
    xr.testing.assert_identical(many.drop_attrs(), want.drop_attrs())
    assert many.chl.shape == (30, 30, 40)
    # ds.open_dataset of a pattern combines the files by their coordinates, as open_mfdataset does.
    xr.testing.assert_identical(ds.open_dataset(str(tmp_path / "day-*.nc")), want)
    joined = ds.open_dataset(paths[::-1], concat_dim="time")
    assert list(joined.time.values) == list(
        np.concatenate([want.time.values[20:], want.time.values[10:20], want.time.values[:10]])
    )


def test_the_engine_is_registered_with_xarray_by_name(netcdf):
    path, _ = netcdf
    if "daskstream" not in xr.backends.list_engines():
        pytest.fail("daskstream's xarray.backends entry point is not installed: pip install the package")
    xr.testing.assert_identical(
        xr.open_dataset(path, engine="daskstream", chunks={}), xr.open_dataset(path, engine="h5netcdf")
    )


def test_plain_hdf5_and_npy_files_open_with_made_up_dimension_names(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("image", data=np.arange(600, dtype="u2").reshape(20, 30), chunks=(5, 30))
        f["image"].attrs["exposure"] = 0.5
    ours = ds.open_dataset(path)
    xr.testing.assert_identical(ours, xr.open_dataset(path, engine="h5netcdf", phony_dims="sort"))
    np.save(tmp_path / "cube.npy", np.ones((4, 5, 6), "f4"))
    cube = ds.open_dataset(tmp_path / "cube.npy")
    assert cube.cube.dims == ("dim_0", "dim_1", "dim_2")
    assert float(cube.cube.sum()) == 120.0


def test_reductions_kernels_and_streams_take_data_arrays_and_keep_their_labels(netcdf):
    path, chlorophyll = netcdf
    chl = ds.open_dataset(path).chl
    mean = ds.reduce(chl, "nanmean", axis="time")
    assert isinstance(mean, xr.DataArray)
    assert mean.dims == ("lat", "lon")
    assert mean.attrs["units"] == "mg m-3"
    assert list(mean.coords) == ["lat", "lon"]
    xr.testing.assert_allclose(mean, chl.mean("time"))
    np.testing.assert_allclose(mean.sel(lat=60.0).values, np.nanmean(chlorophyll[:, -1], axis=0))
    quartiles = ds.reduce(chl.fillna(0), "quantile", axis=("lat", "lon"), q=[0.25, 0.75])
    assert quartiles.dims == ("quantile", "time")
    assert list(quartiles["quantile"].values) == [0.25, 0.75]
    np.testing.assert_allclose(
        quartiles.values, np.quantile(np.nan_to_num(chlorophyll, nan=0.0), [0.25, 0.75], axis=(1, 2))
    )
    assert ds.reduce(chl, "count_nonzero", axis=0).attrs == {}  # a count is not in mg m-3
    assert ds.reduce(chl, "nanmax", axis=0, keepdims=True).dims == ("time", "lat", "lon")
    doubled = ds.map_blocks(lambda block: block * 2, chl)
    assert isinstance(doubled, xr.DataArray)
    assert doubled.dims == chl.dims
    np.testing.assert_allclose(doubled.sel(lat=-60.0).values, 2 * chlorophyll[:, 0])
    # The built-in kernels too: axes by name, the result labelled as its input.
    filled = chl.fillna(0)
    values = np.nan_to_num(chlorophyll, nan=0.0)
    smoothed = ds.kernels.moving_mean(filled, 3, axis="lat")
    assert isinstance(smoothed, xr.DataArray)
    assert smoothed.dims == chl.dims
    xr.testing.assert_identical(smoothed.coords.to_dataset(), chl.coords.to_dataset())
    np.testing.assert_allclose(smoothed.values, ds.kernels.moving_mean(values, 3, axis=1).compute())
    for labelled in (ds.kernels.gaussian_filter(filled, 1.0), ds.kernels.clip(filled, 0, 1),
                     ds.kernels.astype(filled, "f8"), ds.kernels.standardize(filled, axis="time")):  # fmt: skip
        assert isinstance(labelled, xr.DataArray)
        assert labelled.dims == chl.dims
    np.testing.assert_allclose(ds.kernels.clip(filled, 0, 1).values, np.clip(values, 0, 1))
    described = ds.describe(chl.fillna(0), axis="time").compute()
    np.testing.assert_allclose(described["max"], np.nan_to_num(chlorophyll, nan=0.0).max(axis=0))
    batches = list(itertools.islice(ds.stream(chl, batch_size=4, axis="time"), 2))
    np.testing.assert_allclose(np.concatenate(batches), chlorophyll[:8])
    with pytest.raises(InvalidAxisError, match="chl has no dimension 'depth'; its dimensions are time, lat, lon"):
        ds.reduce(chl, "mean", axis="depth")


def test_describe_and_adaptive_runs_of_data_arrays_come_back_labelled(netcdf):
    path, chlorophyll = netcdf
    chl = ds.open_dataset(path).chl.fillna(0)
    values = np.nan_to_num(chlorophyll, nan=0.0)
    statistics = ds.describe(chl, axis="time", bins=5, range=(0.0, 10.0)).compute()
    for name in ("mean", "std", "min", "max", "count", "nan_count"):
        assert statistics[name].dims == ("lat", "lon"), name
        assert statistics[name].name == name
        assert list(statistics[name].coords) == ["lat", "lon"]
    assert statistics["mean"].attrs["units"] == "mg m-3"
    assert statistics["count"].attrs == {}  # a count is not in mg m-3
    np.testing.assert_allclose(statistics["std"].sel(lat=60.0).values, values[:, -1].std(axis=0))
    np.testing.assert_allclose(statistics["max"].values, values.max(axis=0))
    assert statistics["histogram"].dims == ("lat", "lon", "bin")
    np.testing.assert_array_equal(
        statistics["histogram"].sel(lat=-60.0).values[0], np.histogram(values[:, 0, 0], bins=5, range=(0, 10))[0]
    )
    assert float(ds.describe(chl).compute()["mean"]) == pytest.approx(values.mean())

    run = ds.reduce(chl, "max", axis="time", adaptive=True)
    peak = run.compute()
    assert isinstance(peak, xr.DataArray)
    assert peak.dims == ("lat", "lon")
    np.testing.assert_array_equal(peak.values, values.max(axis=0))
    adaptive_statistics = ds.describe(chl, axis="lat", adaptive=True).compute()
    assert adaptive_statistics["mean"].dims == ("time", "lon")
    np.testing.assert_allclose(adaptive_statistics["mean"].values, values.mean(axis=1))


def test_without_xarray_open_dataset_says_what_to_install(netcdf):
    path, _ = netcdf
    code = f"import sys; sys.modules['xarray'] = None; import daskstream as ds; ds.open_dataset({str(path)!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "MissingDependencyError: open_dataset needs xarray" in done.stderr
    assert "pip install 'daskstream[xarray]'" in done.stderr


def test_ds_open_of_a_packed_variable_warns_that_its_numbers_are_as_stored(netcdf):
    path, _ = netcdf
    with pytest.warns(
        ds.errors.PackedDataWarning, match=r"scale_factor 0\.01, add_offset 50\.0, _FillValue -32767"
    ) as seen:
        stored = ds.open(path, dataset="chl")
    assert "daskstream.open_dataset(path) to decode" in str(seen[0].message)
    assert seen[0].filename == __file__  # the user's line, not daskstream's
    assert int(stored.min().compute()) == -32767  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.open(path, dataset="lat")  # nothing encoded, nothing said
    done = subprocess.run(
        [sys.executable, "-m", "daskstream", "reduce", f"{path}::chl", "--op", "min", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("warning: ")
    assert done.stderr.count("\n") == 1
    assert "-32767" in done.stdout


def test_later_passes_over_a_slice_of_a_decoded_variable_compute_numpys_answers(netcdf):
    """A time slice of a CF-decoded variable (xarray's ``_apply_mask`` and scaling layers, then a getitem),
    described with a bin count (the counts take a second pass) and quartiles, and reduced to quantiles.

    Each later pass reads a copy of the variable's graph; dask's clone left the copied slice's tasks taking
    the original's keys (dask/dask#12455), which the first pass's optimized graph no longer has:
    "Missing dependency ('_apply_mask-...')" in a fresh process.
    """
    path, _ = netcdf
    chl = ds.open_dataset(path).isel(time=slice(0, 12)).chl
    assert len(chl.data.chunks[0]) > 1  # the slice cuts the planned chunks
    values = xr.open_dataset(path, engine="h5netcdf").isel(time=slice(0, 12)).chl.values  # xarray's own decoding
    valid = values[~np.isnan(values)]
    described = ds.describe(chl, bins=40).compute()
    edges = np.histogram_bin_edges(valid, bins=40)
    np.testing.assert_array_equal(described["bin_edges"], edges)
    np.testing.assert_array_equal(described["histogram"], np.histogram(valid, bins=edges)[0])
    assert int(described["count"]) == valid.size
    quartiles = ds.describe(chl, bins=40, quartiles=True).compute()
    np.testing.assert_array_equal(
        [float(quartiles[k]) for k in ("25%", "50%", "75%")], np.nanquantile(values, [0.25, 0.5, 0.75])
    )
    np.testing.assert_array_equal(quartiles["histogram"], described["histogram"])
    along = ds.describe(chl, axis="time", bins=4).compute()
    kept = np.moveaxis(values, 0, -1).reshape(-1, values.shape[0])
    np.testing.assert_array_equal(along["bin_edges"], np.histogram_bin_edges(valid, bins=4))
    want = np.stack([np.histogram(c[~np.isnan(c)], bins=along["bin_edges"])[0] for c in kept])
    np.testing.assert_array_equal(along["histogram"].values.reshape(want.shape), want)
    filled = chl.fillna(0.0)
    np.testing.assert_array_equal(
        ds.reduce(filled, "quantile", q=[0.1, 0.5, 0.9]).values, np.quantile(np.nan_to_num(values), [0.1, 0.5, 0.9])
    )
    assert float(ds.reduce(filled, "median")) == np.median(np.nan_to_num(values))
    counts, bin_edges = ds.reduce(filled.data, "histogram", bins=6)
    want_counts, want_edges = np.histogram(np.nan_to_num(values), bins=6)
    np.testing.assert_array_equal(counts.compute(), want_counts)
    np.testing.assert_array_equal(np.asarray(bin_edges), want_edges)


def _netcdf_with(path, **attrs):
    """A NetCDF-4 file (written by h5netcdf) whose variable 'tas' and coordinate 'time' take ``attrs``."""
    h5netcdf = pytest.importorskip("h5netcdf")
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"time": 4, "x": 3}
        time = f.create_variable("time", ("time",), "f8")
        time[:] = np.arange(4.0)
        time.attrs["units"] = "days since 2000-01-01"
        tas = f.create_variable("tas", ("time", "x"), "i2")
        tas[:] = np.arange(12).reshape(4, 3)
        for key, value in attrs.items():
            (time if key == "calendar" else tas).attrs[key] = value
    return path


@pytest.mark.parametrize(
    ("attrs", "says", "switch"),
    [
        ({"scale_factor": "abc"}, "has scale_factor 'abc', which is not a number", "mask_and_scale=False"),
        ({"scale_factor": np.array([1.0, 2.0, 3.0])}, "3 values of scale_factor", "mask_and_scale=False"),
        ({"add_offset": "x", "_FillValue": np.int16(5)}, "has add_offset 'x'", "mask_and_scale=False"),
        ({"_FillValue": "none"}, "has _FillValue 'none'", "mask_and_scale=False"),
        ({"calendar": "martian"}, "could not decode variable 'time'", "decode_times=False"),
    ],
    ids=["text-scale", "three-scales", "text-offset", "text-fill", "unknown-calendar"],
)
@pytest.mark.parametrize("opener", ["daskstream", "xarray-engine"])
def test_attributes_xarray_cannot_decode_are_one_clear_error_at_open(tmp_path, attrs, says, switch, opener):
    from daskstream.errors import AttributeDecodingError

    path = _netcdf_with(tmp_path / "bad.nc", **attrs)

    def opened_and_loaded():
        # A failure inside a task of .load() would be a traceback from xarray or numpy.
        return (ds.open_dataset(path) if opener == "daskstream" else xr.open_dataset(path, engine="daskstream")).load()

    with pytest.raises(AttributeDecodingError, match=says) as raised:
        opened_and_loaded()
    message = str(raised.value)
    assert message.startswith(f"{path}: ")
    assert switch in message
    assert isinstance(raised.value, ValueError)
    # With that decoder off, the stored numbers read as they are.
    off = {"decode_times": False} if "calendar" in attrs else {"mask_and_scale": False}
    np.testing.assert_array_equal(ds.open_dataset(path, **off).tas.values, np.arange(12).reshape(4, 3))
