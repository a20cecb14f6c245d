""".npy and HDF5 objects on an S3 API (moto's server on 127.0.0.1): told by their bytes, read exactly, with few requests."""

from __future__ import annotations

import math
import pickle
import zipfile

import dask
import h5py
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import (
    CorruptSourceError,
    MemberNotFoundError,
    OutsideFileError,
    SourceChangedError,
    SourceNotFoundError,
    SourceRemovedError,
    UnknownFormatError,
)
from daskstream.sources import Hdf5Source, NpySource, ZarrSource, guess_format, open_source

PART = 4 * 2**20  # the most bytes one ranged GET asks for


def _upload(s3, local, name=None) -> str:
    """Put a local file into a new bucket; its URL."""
    bucket = s3.bucket()
    name = name or local.name
    s3.fs.put_file(str(local), f"{bucket}/{name}")
    return f"s3://{bucket}/{name}"


def _npy(tmp_path, data, name="a.npy"):
    path = tmp_path / name
    with open(path, "wb") as f:  # np.save(path) would add ".npy" to a name without it
        np.save(f, data)
    return path


def _h5(tmp_path, data, name="scan.h5", **create):
    """An HDF5 file holding ``data`` at /group/dset (with attributes and dimension scales) and a small /other."""
    path = tmp_path / name
    with h5py.File(path, "w") as f:
        dset = f.create_group("group").create_dataset("dset", data=data, **create)
        dset.attrs["units"] = "kelvin"
        for axis, label in enumerate("tyx"[-data.ndim :]):
            f[label] = np.arange(data.shape[axis])
            f[label].make_scale(label)
            dset.dims[axis].attach_scale(f[label])
        f["other"] = np.arange(3)
    return path


def _field(shape, dtype="f4", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _compute(x, **config):
    with dask.config.set(scheduler="threads", **config):
        return x.compute()


# --- .npy --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        # The common case: a C-ordered slab, read in parts.
        pytest.param(_field((300, 2000)), id="C-2d"),
        # Fortran order is the C-ordered transpose on disk.
        pytest.param(np.asfortranarray(_field((300, 2000))), id="F-2d"),
        # Big-endian bytes come back in native order.
        pytest.param(_field((40, 50, 60)).astype(">f8"), id="big-endian-3d"),
        # One axis: every box is one byte run.
        pytest.param(np.arange(10**6, dtype="i8"), id="1d"),
    ],
)
def test_an_npy_object_reads_exactly_with_ranged_gets_and_no_head(s3, tmp_path, data):
    url = _upload(s3, _npy(tmp_path, data))
    x = ds.open(url, storage_options=s3.options, memory_budget="16MiB")
    s3.reset()
    np.testing.assert_array_equal(_compute(x), data)
    assert x.dtype == data.dtype.newbyteorder("=")
    requests = s3.requests()
    # Each block is its bytes' ranged GETs, at most PART bytes each, and nothing else.
    blocks = math.prod(x.numblocks)
    assert blocks <= requests.get("GET", 0) <= blocks + data.nbytes // PART + 1, requests
    assert requests.get("HEAD", 0) == 0, requests
    assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)


def test_opening_an_npy_object_is_one_get_of_its_first_bytes(s3, tmp_path):
    url = _upload(s3, _npy(tmp_path, _field((100, 100))))
    s3.reset()
    source = open_source(url, storage_options=s3.options)
    requests = s3.requests()
    assert isinstance(source, NpySource)
    assert requests.get("GET", 0) == 1, requests  # the format, the header, the size and the ETag at once
    assert requests.get("HEAD", 0) <= 1, requests  # the bucket, checked once


def test_a_large_slab_is_fetched_in_parallel_parts(s3, tmp_path):
    data = _field((5 * 2**20 // 2,), "f8")  # 20 MiB
    source = open_source(_upload(s3, _npy(tmp_path, data)), storage_options=s3.options)
    s3.reset()
    np.testing.assert_array_equal(source.read(), data)
    assert s3.requests().get("GET", 0) == math.ceil(data.nbytes / PART), s3.requests()


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_strided_box_is_read_in_windows_of_its_span_not_element_by_element(s3, tmp_path, order):
    data = np.asarray(_field((3000, 250), "f8"), order=order)  # 6 MB; a column (C) or row (F) is strided
    source = open_source(_upload(s3, _npy(tmp_path, data)), storage_options=s3.options)
    s3.reset()
    np.testing.assert_array_equal(source.read((slice(None), 7)), data[:, 7])
    np.testing.assert_array_equal(source.read((slice(10, 2990), slice(100, 103))), data[10:2990, 100:103])
    np.testing.assert_array_equal(source.read((7,)), data[7])
    # A few windows of at most PART bytes per read: never one request per element.
    assert s3.requests().get("GET", 0) <= 3 * math.ceil(data.nbytes / PART) + 1, s3.requests()


def test_a_truncated_npy_object_is_refused_at_open(s3, tmp_path):
    path = _npy(tmp_path, _field((100, 100)))
    path.write_bytes(path.read_bytes()[:-100])
    url = _upload(s3, path)
    with pytest.raises(CorruptSourceError, match=r"the \.npy object is truncated") as info:
        ds.open(url, storage_options=s3.options)
    assert url in str(info.value)


def test_an_npy_object_named_with_a_dataset_is_refused(s3, tmp_path):
    url = _upload(s3, _npy(tmp_path, np.arange(4)))
    with pytest.raises(MemberNotFoundError, match="holds one array"):
        ds.open(f"{url}::/x", storage_options=s3.options)


# --- HDF5 --------------------------------------------------------------------------------------


def test_a_gzip_hdf5_object_reads_exactly_with_its_chunks_fetched_directly(s3, tmp_path):
    data = _field((64, 200, 300))
    path = _h5(tmp_path, data, chunks=(16, 50, 100), compression="gzip", shuffle=True)
    url = _upload(s3, path)
    x = ds.open(f"{url}::/group/dset", storage_options=s3.options, chunks=(16, 100, 300))
    source = open_source(f"{url}::/group/dset", storage_options=s3.options)
    assert isinstance(source, Hdf5Source)
    assert source.raw_chunks  # decoded here, from chunks fetched by ranged GETs
    assert source.attrs == {"units": "kelvin"}
    assert source.dims == ("t", "y", "x")
    assert source.storage_chunks == (16, 50, 100)
    s3.reset()
    np.testing.assert_array_equal(_compute(x), data)
    requests = s3.requests()
    chunks = 4 * 4 * 3
    # One GET per chunk at most (neighbours in the file share one), plus the chunk index's own blocks.
    assert math.prod(x.numblocks) <= requests.get("GET", 0) <= chunks + 3, requests
    assert requests.get("HEAD", 0) == 0, requests
    assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-5)


def test_opening_an_hdf5_object_takes_a_few_gets(s3, tmp_path):
    url = _upload(s3, _h5(tmp_path, _field((64, 200, 300)), chunks=(16, 50, 100), compression="gzip"))
    s3.reset()
    source = open_source(url, dataset="/group/dset", storage_options=s3.options)
    requests = s3.requests()
    assert source.shape == (64, 200, 300)
    # The first bytes tell the format and hold the superblock; the dimension scales lie at the file's end.
    assert requests.get("GET", 0) <= 4, requests
    assert requests.get("HEAD", 0) <= 1, requests


@pytest.mark.parametrize(
    ("create", "decoded_here"),
    [
        # Straight from its byte offset, by ranged GETs as for .npy.
        pytest.param({}, True, id="contiguous"),
        # A filter not decoded here: through h5py, reading the object through a file of blocks.
        pytest.param({"chunks": (10, 20), "compression": "lzf"}, False, id="lzf"),
        # Chunked without filters: chunks copied straight into the block.
        pytest.param({"chunks": (10, 30)}, True, id="chunked-unfiltered"),
        # Fletcher-32 with big-endian data: checked and swapped here.
        pytest.param({"chunks": (5, 30), "fletcher32": True, "dtype": ">i4"}, True, id="fletcher32-big-endian"),
    ],
)
def test_other_hdf5_layouts_read_exactly(s3, tmp_path, create, decoded_here):
    data = (_field((50, 120)) * 100).astype(create.get("dtype", "f4"))
    url = _upload(s3, _h5(tmp_path, data, **create))
    source = open_source(f"{url}::/group/dset", storage_options=s3.options)
    assert (source.raw_offset is not None or source.raw_chunks) == decoded_here
    x = ds.open(source, chunks=(20, 60))
    np.testing.assert_array_equal(_compute(x), data)
    np.testing.assert_array_equal(source.read((slice(3, 40), 17)), data[3:40, 17])
    assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)


def test_a_truncated_hdf5_object_is_refused_at_open(s3, tmp_path):
    path = _h5(tmp_path, _field((50, 100)), chunks=(10, 50), compression="gzip")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    url = _upload(s3, path)
    with pytest.raises(CorruptSourceError, match="HDF5 could not open the object") as info:
        ds.open(f"{url}::/group/dset", storage_options=s3.options)
    assert url in str(info.value)


def test_an_hdf5_dataset_is_found_alone_and_a_missing_one_is_listed(s3, tmp_path):
    with h5py.File(tmp_path / "one.h5", "w") as f:
        f.create_group("entry")["data"] = np.arange(12).reshape(3, 4)
    url = _upload(s3, tmp_path / "one.h5")
    np.testing.assert_array_equal(ds.open(url, storage_options=s3.options).compute(), np.arange(12).reshape(3, 4))
    with pytest.raises(MemberNotFoundError, match=r"dataset '/nope' not found in s3://.*one\.h5; it has: /entry/data"):
        ds.open(f"{url}::/nope", storage_options=s3.options)


def test_an_external_link_in_an_hdf5_object_is_refused(s3, tmp_path):
    with h5py.File(tmp_path / "target.h5", "w") as f:
        f["data"] = np.arange(3)
    with h5py.File(tmp_path / "links.h5", "w") as f:
        f["linked"] = h5py.ExternalLink("target.h5", "/data")
        f["own"] = np.arange(4)
    url = _upload(s3, tmp_path / "links.h5")
    with pytest.raises(OutsideFileError, match=r"external link from 'target\.h5'"):
        ds.open(f"{url}::/linked", storage_options=s3.options)
    np.testing.assert_array_equal(ds.open(f"{url}::/own", storage_options=s3.options).compute(), np.arange(4))


# --- changes -----------------------------------------------------------------------------------


def _write_npy(tmp_path, data):
    return _npy(tmp_path, data, "v.npy")


def _write_h5(tmp_path, data):
    return _h5(tmp_path, data, "v.h5", chunks=(10, 25), compression="gzip", shuffle=True)


@pytest.mark.parametrize("writer", [_write_npy, _write_h5], ids=["npy", "hdf5"])
def test_an_object_rewritten_after_opening_is_refused_and_reopens_under_a_new_name(s3, tmp_path, writer):
    data = _field((50, 100))
    url = _upload(s3, writer(tmp_path, data))
    where = f"{url}::/group/dset" if url.endswith(".h5") else url
    x = ds.open(where, storage_options=s3.options)
    s3.fs.put_file(str(writer(tmp_path, data * 2)), url.removeprefix("s3://"))
    with pytest.raises(SourceChangedError, match="changed on the object store after it was opened") as info:
        _compute(x)
    assert url in str(info.value)
    assert "ds.open" in str(info.value)
    again = ds.open(where, storage_options=s3.options)
    assert again.name != x.name  # the same URL, other data: another name, so no cached result is reused
    np.testing.assert_array_equal(_compute(again), data * 2)


@pytest.mark.parametrize("writer", [_write_npy, _write_h5], ids=["npy", "hdf5"])
def test_an_object_deleted_after_opening_is_refused(s3, tmp_path, writer):
    url = _upload(s3, writer(tmp_path, _field((50, 100))))
    where = f"{url}::/group/dset" if url.endswith(".h5") else url
    x = ds.open(where, storage_options=s3.options)
    s3.fs.rm(url.removeprefix("s3://"))
    with pytest.raises(SourceRemovedError, match="was removed from the object store after it was opened"):
        _compute(x)


def test_an_hdf5_object_rewritten_before_a_process_opens_it_is_refused_there(s3, tmp_path):
    data = _field((50, 100))
    url = _upload(s3, _write_h5(tmp_path, data))
    x = ds.open(f"{url}::/group/dset", storage_options=s3.options)
    s3.fs.put_file(str(_write_h5(tmp_path, data + 1)), url.removeprefix("s3://"))
    # Each worker opens the file itself, and its first read of the object sees the new ETag.
    with dask.config.set(scheduler="processes", num_workers=2), pytest.raises(SourceChangedError):
        x.compute()


# --- detection ---------------------------------------------------------------------------------


def test_formats_are_told_by_bytes_not_by_names(s3, tmp_path):
    npy_named_h5 = _upload(s3, _npy(tmp_path, np.arange(5)), "looks.h5")
    h5_named_npy = _upload(s3, _h5(tmp_path, np.arange(5.0)), "looks.npy")
    assert guess_format(npy_named_h5, s3.options) == "npy"
    assert guess_format(h5_named_npy, s3.options) == "hdf5"
    np.testing.assert_array_equal(ds.open(npy_named_h5, storage_options=s3.options).compute(), np.arange(5))


def test_an_hdf5_object_behind_a_large_user_block_is_found(s3, tmp_path):
    with h5py.File(tmp_path / "ub.h5", "w", userblock_size=128 * 1024) as f:
        f["x"] = np.arange(10.0)
    url = _upload(s3, tmp_path / "ub.h5")
    assert guess_format(url, s3.options) == "hdf5"
    np.testing.assert_array_equal(ds.open(url, storage_options=s3.options).compute(), np.arange(10.0))


def test_a_prefix_without_an_object_is_a_zarr_store(s3):
    bucket = s3.bucket()
    assert guess_format(f"s3://{bucket}/field.zarr", s3.options) == "zarr"
    assert guess_format(f"s3://{bucket}", s3.options) == "zarr"
    with pytest.raises(SourceNotFoundError, match="no Zarr metadata found there"):
        open_source(f"s3://{bucket}/field.zarr", storage_options=s3.options)
    # Named like a file: nothing there is a missing file, not a store.
    with pytest.raises(SourceNotFoundError, match="no such object"):
        open_source(f"s3://{bucket}/scan.h5", storage_options=s3.options)


def test_an_object_in_place_of_a_zarr_prefix_does_not_hide_the_store(s3):
    import zarr

    bucket = s3.bucket()
    url = f"s3://{bucket}/marked.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3.options)
    zarr.create_array(store, shape=(4,), dtype="i4", chunks=(2,))[...] = np.arange(4)
    s3.fs.pipe_file(f"{bucket}/marked.zarr", b"")  # a folder marker some tools write
    assert isinstance(open_source(url, storage_options=s3.options), ZarrSource)


@pytest.mark.parametrize(
    ("name", "content", "error", "match"),
    [
        pytest.param(
            "mystery.dat", b"GIF89a" + bytes(200), UnknownFormatError, r"not a \.npy, HDF5 or Zarr", id="unknown"
        ),
        pytest.param("broken.h5", b"GIF89a" + bytes(200), CorruptSourceError, "named like a hdf5 file", id="named-h5"),
        pytest.param("empty.npy", b"", CorruptSourceError, "the object is empty", id="empty"),
    ],
)
def test_unrecognised_objects_are_refused_naming_the_url(s3, name, content, error, match):
    bucket = s3.bucket()
    s3.fs.pipe_file(f"{bucket}/{name}", content)
    with pytest.raises(error, match=match) as info:
        ds.open(f"s3://{bucket}/{name}", storage_options=s3.options)
    assert f"s3://{bucket}/{name}" in str(info.value)


def test_a_zip_object_is_refused_with_what_to_do(s3, tmp_path):
    with zipfile.ZipFile(tmp_path / "store.zip", "w") as z:
        z.writestr("zarr.json", "{}")
    url = _upload(s3, tmp_path / "store.zip")
    with pytest.raises(UnknownFormatError, match="zipped Zarr stores from local disk only"):
        ds.open(url, storage_options=s3.options)


# --- secrets and processes ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_no_secret_travels_in_the_graph_and_processes_read_with_their_own_credentials(s3, tmp_path, fmt):
    data = _field((60, 80))
    if fmt == "npy":
        url = _upload(s3, _npy(tmp_path, data))
    else:
        url = _upload(s3, _h5(tmp_path, data, chunks=(20, 40), compression="gzip")) + "::/group/dset"
    options = {**s3.options, "key": "testing", "secret": "sup3r-s3cret-value"}
    x = ds.open(url, storage_options=options, chunks=(20, 80))
    assert b"sup3r-s3cret-value" not in pickle.dumps(dict(x.__dask_graph__()))
    with dask.config.set(scheduler="processes", num_workers=2):
        np.testing.assert_array_equal(x.compute(), data)
        assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-5)


def test_an_fsspec_file_is_read_as_the_object_it_names(s3, tmp_path):
    import fsspec

    data = _field((40, 30))
    url = _upload(s3, _npy(tmp_path, data))
    with s3.fs.open(url.removeprefix("s3://")) as f:
        np.testing.assert_array_equal(ds.open(f).compute(), data)
    # An OpenFile carries its filesystem's options (the endpoint) to daskstream's own reads.
    np.testing.assert_array_equal(ds.open(fsspec.open(url, **s3.options)).compute(), data)
    h5 = _upload(s3, _h5(tmp_path, data, compression="gzip", chunks=(10, 30)))
    np.testing.assert_array_equal(ds.open(fsspec.open(h5, **s3.options), dataset="/group/dset").compute(), data)


def test_a_netcdf4_object_opens_as_a_labelled_dataset_equal_to_the_local_file(s3, tmp_path):
    xr = pytest.importorskip("xarray")
    import pandas as pd

    local = tmp_path / "ocean.nc"
    written = xr.Dataset(
        {"t": (("time", "x"), np.arange(80.0).reshape(20, 4), {"units": "K"})},
        coords={"time": pd.date_range("2026-01-01", periods=20), "x": ("x", np.arange(4), {"units": "km"})},
        attrs={"title": "remote"},
    )
    written.to_netcdf(local, engine="h5netcdf", encoding={"t": {"chunksizes": (5, 4), "zlib": True}})
    url = _upload(s3, local)
    s3.reset()
    remote = ds.open_dataset(url, storage_options=s3.options)
    assert remote.t.data.chunks == ((5, 5, 5, 5), (4,))  # daskstream's plan, from the object's storage chunks
    xr.testing.assert_identical(remote.load(), ds.open_dataset(local).load())
    xr.testing.assert_identical(remote.load(), written)
    assert s3.requests().get("HEAD", 0) == 0
    with pytest.raises(MemberNotFoundError, match=r"ocean.nc: no such group 'sensors'"):
        ds.open_dataset(url, storage_options=s3.options, group="sensors")
    through_xarray = xr.open_dataset(url, engine="daskstream", chunks={}, storage_options=s3.options)
    xr.testing.assert_identical(through_xarray.load(), written)
