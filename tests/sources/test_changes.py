"""A source rewritten under a running job: reads raise SourceChangedError instead of mixing old and new data."""

from __future__ import annotations

import os
import time

import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import DaskstreamError, SourceChangedError

SHAPE = (64, 32)


def later(path):
    """Move a file's modification time on, as a write a little later would (coarse clocks share a tick)."""
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def rewrite_npy(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros(SHAPE))

    def change():
        np.save(path, np.ones(SHAPE))
        later(path)

    return str(path), change


def grow_npy(tmp_path):
    path = tmp_path / "g.npy"
    np.save(path, np.zeros(SHAPE))

    def change():
        with open(path, "ab") as f:
            f.write(b"\0" * 64)

    return str(path), change


def edit_hdf5(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros(SHAPE), chunks=(8, 32))

    def change():
        ds.close_files()  # this process's read-only handle; another process could write without it
        with h5py.File(path, "r+") as f:
            f["x"][0, 0] = 5
        later(path)

    return f"{path}::x", change


def edit_zarr_chunk(tmp_path):
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=SHAPE, chunks=(8, 32), dtype="f8")[...] = 0

    def change():
        time.sleep(0.02)  # past the moment the source was opened, whatever the clock's tick
        zarr.open_array(str(path), mode="r+")[0:8] = 7

    return str(path), change


def edit_zarr_metadata(tmp_path):
    path = tmp_path / "m.zarr"
    zarr.create_array(str(path), shape=SHAPE, chunks=(8, 32), dtype="f8")[...] = 0

    def change():
        zarr.open_array(str(path), mode="r+").attrs["note"] = "edited"
        later(path / "zarr.json")

    return str(path), change


def remove_npy(tmp_path):
    path = tmp_path / "r.npy"
    np.save(path, np.zeros(SHAPE))
    return str(path), lambda: os.remove(path)


CHANGES = [rewrite_npy, grow_npy, edit_hdf5, edit_zarr_chunk, edit_zarr_metadata, remove_npy]


@pytest.mark.parametrize("make", CHANGES)
def test_a_change_after_opening_fails_the_computation(tmp_path, make):
    where, change = make(tmp_path)
    x = ds.open(where, chunks=(8, 32))
    assert float(x.sum().compute()) == 0.0  # unchanged: reads work
    change()
    with pytest.raises(SourceChangedError) as info:
        x.sum().compute()
    assert isinstance(info.value, DaskstreamError)
    assert isinstance(info.value, RuntimeError)
    assert os.path.basename(where.split("::")[0]) in str(info.value)
    assert "open it again" in str(info.value) or "removed" in str(info.value)


@pytest.mark.parametrize("make", [rewrite_npy, edit_hdf5, edit_zarr_chunk])
def test_opening_again_reads_the_new_data(tmp_path, make):
    where, change = make(tmp_path)
    ds.open(where).sum().compute()
    change()
    fresh = ds.open(where)
    assert float(fresh.sum().compute()) != 0.0


def test_a_change_while_streaming_is_raised_in_the_loop(tmp_path):
    path = tmp_path / "s.npy"
    np.save(path, np.zeros((4000, 32)))
    # Small blocks (64 rows) and one batch of prefetch: most of the file is still unread after one batch.
    batches = iter(ds.stream(str(path), batch_size=8, prefetch=1, memory_budget="96KiB"))
    next(batches)
    np.save(path, np.ones((4000, 32)))
    later(path)
    with pytest.raises(SourceChangedError):
        for _ in batches:
            pass
