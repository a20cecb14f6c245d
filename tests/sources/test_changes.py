"""A source rewritten under a running job: reads raise SourceChangedError instead of mixing old and new data."""

from __future__ import annotations

import os
import shutil
import time

import dask
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


def restore_times(path, before):
    """Put a file's access and modification times back, as ``cp -p``, ``rsync -a`` and ``tar x`` do."""
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def rewrite_npy_keeping_its_times(tmp_path):
    # Same size, same modification time: only the change time (and the bytes) tell.
    path = tmp_path / "k.npy"
    np.save(path, np.zeros(SHAPE))

    def change():
        before = os.stat(path)
        time.sleep(0.02)  # a tick of the coarsest file-system clock
        with open(path, "r+b") as f:
            f.seek(-8, os.SEEK_END)
            f.write(np.float64(3).tobytes())
        restore_times(path, before)

    return str(path), change


def replace_zarr_chunk_with_an_older_copy(tmp_path):
    path = tmp_path / "c.zarr"
    # A fill value other than the data's, so that every chunk file is written.
    zarr.create_array(str(path), shape=SHAPE, chunks=(8, 32), dtype="f8", fill_value=-1)[...] = 0
    other = tmp_path / "other.zarr"
    zarr.create_array(str(other), shape=SHAPE, chunks=(8, 32), dtype="f8", fill_value=-1)[...] = 9
    old = os.stat(other / "c" / "0" / "0").st_mtime_ns - 10**10
    os.utime(other / "c" / "0" / "0", ns=(old, old))

    def change():
        time.sleep(0.02)
        shutil.copy2(other / "c" / "0" / "0", path / "c" / "0" / "0")  # cp -p: an older modification time

    return str(path), change


def overwrite_zarr_v2_chunk_in_place(tmp_path):
    path = tmp_path / "v2.zarr"
    zarr.create_array(str(path), shape=SHAPE, chunks=(8, 32), dtype="f8", zarr_format=2, fill_value=-1)[...] = 0
    other = tmp_path / "v2-other.zarr"
    zarr.create_array(str(other), shape=SHAPE, chunks=(8, 32), dtype="f8", zarr_format=2, fill_value=-1)[...] = 9

    def change():
        chunk = path / "0.0"
        before = os.stat(chunk)
        time.sleep(0.02)
        chunk.write_bytes((other / "0.0").read_bytes())  # the same file, overwritten: same inode
        restore_times(chunk, before)

    return str(path), change


def edit_zarr_that_zarr_reads(tmp_path):
    # A transpose codec: zarr-python reads this array, not daskstream's chunk reader.
    from zarr.codecs import BytesCodec, TransposeCodec

    path = tmp_path / "t.zarr"
    array = zarr.create_array(
        str(path),
        shape=SHAPE,
        chunks=(8, 32),
        dtype="f8",
        serializer=BytesCodec(),
        filters=[TransposeCodec(order=(1, 0))],
    )
    array[...] = 0

    def change():
        time.sleep(0.02)
        zarr.open_array(str(path), mode="r+")[0:8] = 7

    return str(path), change


def hdf5_with_external_storage(tmp_path):
    raw = tmp_path / "raw.bin"
    np.zeros(SHAPE).tofile(raw)
    path = tmp_path / "ext.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=SHAPE, dtype="f8", external=[(str(raw), 0, raw.stat().st_size)])

    def change():
        before = os.stat(raw)
        time.sleep(0.02)
        np.ones(SHAPE).tofile(raw)
        restore_times(raw, before)

    return f"{path}::x", change


def hdf5_through_an_external_link(tmp_path):
    target = tmp_path / "target.h5"
    with h5py.File(target, "w") as f:
        f["x"] = np.zeros(SHAPE)
    path = tmp_path / "links.h5"
    with h5py.File(path, "w") as f:
        f["x"] = h5py.ExternalLink("target.h5", "/x")

    def change():
        ds.close_files()
        time.sleep(0.02)
        with h5py.File(target, "r+") as f:
            f["x"][0, 0] = 5

    return f"{path}::x", change


def hdf5_virtual_dataset(tmp_path):
    source = tmp_path / "part.h5"
    with h5py.File(source, "w") as f:
        f["x"] = np.zeros(SHAPE)
    path = tmp_path / "vds.h5"
    layout = h5py.VirtualLayout(shape=SHAPE, dtype="f8")
    layout[...] = h5py.VirtualSource("part.h5", "x", shape=SHAPE)
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("x", layout)

    def change():
        ds.close_files()
        time.sleep(0.02)
        with h5py.File(source, "r+") as f:
            f["x"][0, 0] = 5

    return f"{path}::x", change


CHANGES = [
    rewrite_npy,
    grow_npy,
    edit_hdf5,
    edit_zarr_chunk,
    edit_zarr_metadata,
    remove_npy,
    rewrite_npy_keeping_its_times,
    replace_zarr_chunk_with_an_older_copy,
    overwrite_zarr_v2_chunk_in_place,
    edit_zarr_that_zarr_reads,
    hdf5_with_external_storage,
    hdf5_through_an_external_link,
    hdf5_virtual_dataset,
]


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


@pytest.mark.parametrize(
    "make",
    [
        rewrite_npy,
        edit_hdf5,
        edit_zarr_chunk,
        rewrite_npy_keeping_its_times,
        # (A chunk copied over in place between two opens keeps its inode: only reads catch it.)
        edit_zarr_that_zarr_reads,
        hdf5_with_external_storage,
        hdf5_through_an_external_link,
        hdf5_virtual_dataset,
    ],
)
def test_opening_again_reads_the_new_data(tmp_path, make):
    where, change = make(tmp_path)
    before = ds.open(where)
    before.sum().compute()
    change()
    fresh = ds.open(where)
    assert float(fresh.sum().compute()) != 0.0
    # A new identity too: results (and unfinished stores) of the old data are never taken for the new.
    assert fresh.name != before.name


def test_a_change_while_streaming_is_raised_in_the_loop(tmp_path):
    path = tmp_path / "s.npy"
    np.save(path, np.zeros((4000, 32)))
    # Small blocks (64 rows) and one batch of prefetch: most of the file is still unread after one batch.
    batches = iter(ds.stream(str(path), batch_size=8, prefetch=1, memory_budget="512KiB"))
    next(batches)
    np.save(path, np.ones((4000, 32)))
    later(path)
    with pytest.raises(SourceChangedError):
        for _ in batches:
            pass


@pytest.mark.parametrize(
    ("zarr_format", "name", "old", "new"),
    [
        (3, "zarr.json", b'"float64"', b'"int64"  '),  # the same size: only the content says it changed
        (2, ".zarray", b'"<f8"', b'"<i8"'),
        (2, ".zarray", b'"fill_value": 0.0', b'"fill_value": 5.0'),
        (2, ".zattrs", b'"K"', b'"C"'),
    ],
    ids=["v3-dtype", "v2-dtype", "v2-fill", "v2-zattrs"],
)
@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_local_metadata_rewritten_after_opening_is_refused_even_with_its_old_times(
    tmp_path, zarr_format, name, old, new, scheduler
):
    path = tmp_path / "m.zarr"
    array = zarr.create_array(str(path), shape=(8, 8), chunks=(4, 4), dtype="f8", zarr_format=zarr_format)
    array[...] = np.arange(64.0).reshape(8, 8)
    array.attrs["units"] = "K"
    x = ds.open(str(path))
    meta = path / name
    times = os.stat(meta)
    content = meta.read_bytes()
    assert old in content, content
    meta.write_bytes(content.replace(old, new))
    os.utime(meta, ns=(times.st_atime_ns, times.st_mtime_ns))  # the old modification time put back
    with dask.config.set(scheduler=scheduler, num_workers=2), pytest.raises(SourceChangedError):
        x.sum().compute()
