"""Choosing the reader: magic bytes first, the extension only to explain a mismatch."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import zarr

import daskstream
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    NotAZarrStoreError,
    SourceNotFoundError,
    SourcePermissionError,
    UnknownFormatError,
)
from daskstream.sources import Hdf5Source, NpySource, ZarrSource, guess_format


def write_npy(path, data) -> str:
    with open(path, "wb") as f:  # np.save(path) would add ".npy" to a name without it
        np.save(f, data)
    return str(path)


def write_h5(path, data) -> str:
    with h5py.File(path, "w") as f:
        f["x"] = data
    return str(path)


def write_zarr_zip(path, data) -> str:
    store = zarr.storage.ZipStore(path, mode="w")
    try:
        zarr.create_array(store, data=data, chunks=(2,))
    finally:
        store.close()
    return str(path)


# Bytes decide; a misleading or missing extension must not.
@pytest.mark.parametrize(
    ("writer", "name", "fmt", "reader"),
    [
        pytest.param(write_npy, "a.npy", "npy", NpySource, id="npy-as-npy"),
        pytest.param(write_h5, "a.h5", "hdf5", Hdf5Source, id="hdf5-as-h5"),
        pytest.param(write_npy, "renamed.h5", "npy", NpySource, id="npy-named-h5"),
        pytest.param(write_h5, "renamed.npy", "hdf5", Hdf5Source, id="hdf5-named-npy"),
        pytest.param(write_h5, "renamed.zarr", "hdf5", Hdf5Source, id="hdf5-named-zarr"),
        pytest.param(write_npy, "no-extension", "npy", NpySource, id="npy-without-extension"),
        pytest.param(write_h5, "data.bin", "hdf5", Hdf5Source, id="hdf5-unknown-extension"),
        pytest.param(write_zarr_zip, "store.zip", "zarr", ZarrSource, id="zarr-zip"),
        pytest.param(write_zarr_zip, "store.h5", "zarr", ZarrSource, id="zarr-zip-named-h5"),
    ],
)
def test_magic_bytes_decide(tmp_path, writer, name, fmt, reader):
    data = np.arange(6.0)
    path = writer(tmp_path / name, data)
    assert guess_format(path) == fmt
    source = daskstream.open_source(path)
    assert type(source) is reader
    np.testing.assert_array_equal(source.read(), data)


def test_zarr_directory_with_any_name(tmp_path):
    path = str(tmp_path / "not-called-zarr")
    zarr.create_array(path, data=np.arange(4), chunks=(2,))
    assert guess_format(path) == "zarr"
    assert guess_format(f"file://{path}") == "zarr"


def test_a_url_with_no_object_at_it_is_a_zarr_prefix():
    # What an object at a URL is comes from its bytes (see tests/objects/test_formats.py, against S3).
    assert guess_format("memory://anything") == "zarr"


# Bytes no reader recognises: unknown when nothing claims them, corrupt when the name claims a format.
@pytest.mark.parametrize(
    ("name", "error"),
    [
        pytest.param("mystery.dat", UnknownFormatError, id="unknown-extension"),
        pytest.param("mystery", UnknownFormatError, id="no-extension"),
        pytest.param("broken.npy", CorruptSourceError, id="named-npy"),
        pytest.param("broken.h5", CorruptSourceError, id="named-h5"),
        pytest.param("broken.nc", CorruptSourceError, id="named-nc"),
    ],
)
def test_unrecognised_bytes(tmp_path, name, error):
    path = tmp_path / name
    path.write_bytes(b"GIF89a" + bytes(200))
    with pytest.raises(error) as info:
        daskstream.open_source(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, DaskstreamError)


def test_unknown_format_is_a_value_error(tmp_path):
    path = tmp_path / "mystery.dat"
    path.write_bytes(b"\x00\x01\x02" * 50)
    with pytest.raises(ValueError, match=r"not a \.npy, HDF5 or Zarr file"):
        guess_format(str(path))


@pytest.mark.parametrize("name", ["empty.npy", "empty.h5", "empty"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.touch()
    with pytest.raises(CorruptSourceError, match="empty") as info:
        daskstream.open_source(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["missing.npy", "missing.h5", "missing.zarr", "missing.h5::/x", "missing"])
def test_missing_path(tmp_path, name):
    path = str(tmp_path / name)
    with pytest.raises(SourceNotFoundError) as info:
        daskstream.open_source(path)
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path / name.partition("::")[0]) in str(info.value)
    with pytest.raises(FileNotFoundError):
        daskstream.open(path)


def test_directory_without_metadata(tmp_path):
    with pytest.raises(NotAZarrStoreError, match="without Zarr metadata"):
        guess_format(str(tmp_path))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file regardless of mode")
@pytest.mark.parametrize("writer", [write_npy, write_h5], ids=["npy", "hdf5"])
def test_unreadable_file(tmp_path, writer):
    path = writer(tmp_path / "locked", np.arange(3))
    os.chmod(path, 0)
    try:
        with pytest.raises(SourcePermissionError) as info:
            daskstream.open_source(path)
        assert isinstance(info.value, PermissionError)
        assert path in str(info.value)
    finally:
        os.chmod(path, 0o644)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to switch to another user")
def test_unreadable_as_unprivileged_user(tmp_path):
    # Root reads everything, so the opens run with the effective user switched to "nobody".
    shared = tmp_path / "shared"
    shared.mkdir()
    locked_file = write_npy(shared / "mode-000.npy", np.arange(3))
    os.chmod(locked_file, 0)
    locked_dir = shared / "private"
    locked_dir.mkdir(mode=0o700)
    hidden = write_h5(locked_dir / "inside.h5", np.arange(3))
    # Let "nobody" reach the shared folder through pytest's private tmp directories.
    opened = [p for p in (shared, *shared.parents) if p.is_relative_to(tmp_path.parents[1])]
    modes = {p: p.stat().st_mode for p in opened}
    errors = {}
    try:
        for p in opened:
            os.chmod(p, modes[p] | 0o711)
        os.seteuid(65534)
        try:
            for path in (locked_file, hidden):
                with pytest.raises(SourcePermissionError) as info:
                    daskstream.open_source(path)
                errors[path] = info.value
        finally:
            os.seteuid(0)
    finally:
        for p in opened:
            os.chmod(p, modes[p])
    for path, error in errors.items():
        assert isinstance(error, PermissionError)
        assert path in str(error)
    assert len(errors) == 2
