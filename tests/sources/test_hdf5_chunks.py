"""Chunked HDF5 read from raw chunk bytes, decoded outside h5py's lock; h5py is the oracle."""

from __future__ import annotations

import threading
import zlib

import h5py
import numpy as np
import pytest

import daskstream
from daskstream.errors import CorruptSourceError

hdf5plugin = pytest.importorskip("hdf5plugin")

DATA = np.random.default_rng(11).standard_normal((301, 77)).astype("f4").round(2)


def _write(path, name, data=DATA, **options):
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=data, chunks=(32, 16), **options)
    return f"{path}::{name}"


@pytest.mark.parametrize(
    ("options", "decoded_here"),
    [
        ({}, True),
        ({"compression": "gzip", "compression_opts": 1}, True),
        ({"compression": "gzip", "shuffle": True}, True),
        ({"compression": "gzip", "shuffle": True, "fletcher32": True}, True),
        ({"shuffle": True}, True),
        ({"fletcher32": True}, True),
        (dict(hdf5plugin.Zstd(clevel=5)), True),
        (dict(hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.SHUFFLE)), True),
        (dict(hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.BITSHUFFLE)), True),
        (dict(hdf5plugin.LZ4()), False),
        ({"compression": "lzf"}, False),
        ({"scaleoffset": 2}, False),
    ],
    ids=["none", "gzip", "gzip-shuffle", "gzip-shuffle-fletcher32", "shuffle", "fletcher32", "zstd", "blosc-lz4",
         "blosc-zstd-bitshuffle", "lz4-through-h5py", "lzf-through-h5py", "scaleoffset-through-h5py"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", ["f4", ">f8", "<i2", "u1"])
def test_every_region_equals_h5py(tmp_path, options, decoded_here, dtype):
    data = (DATA * 100).astype(dtype)
    location = _write(tmp_path / "a.h5", "x", data, **options)
    source = daskstream.open_source(location)
    assert source.raw_chunks is decoded_here
    with h5py.File(tmp_path / "a.h5") as f:
        want = f["x"][...]
    # Whole, chunk-aligned, and cutting through chunks (edge chunks are stored padded).
    for region in [(), (slice(32, 96), slice(16, 48)), (slice(5, 290), slice(3, 70)), (300, slice(None))]:
        got = source.read(region)
        np.testing.assert_array_equal(got, want[region])
        assert got.dtype == want.dtype.newbyteorder("=")


def test_chunks_stored_with_a_filter_skipped_are_decoded_by_their_mask(tmp_path):
    # HDF5 may store a chunk without a filter that did not help (bit i of the mask: filter i skipped).
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        dset = f.create_dataset("x", shape=(64, 16), chunks=(32, 16), dtype="f4", compression="gzip")
        dset.id.write_direct_chunk((0, 0), zlib.compress(DATA[:32, :16].tobytes()), filter_mask=0)
        dset.id.write_direct_chunk((32, 0), DATA[32:64, :16].tobytes(), filter_mask=1)
    source = daskstream.open_source(f"{path}::x")
    assert source.raw_chunks
    np.testing.assert_array_equal(source.read(), DATA[:64, :16])


def test_unwritten_chunks_read_as_the_fill_value(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        dset = f.create_dataset("x", shape=(100, 60), chunks=(32, 16), dtype="i2", fillvalue=-7, compression="gzip")
        dset[40:50, 20:30] = 5
        want = dset[...]
    got = daskstream.open_source(f"{path}::x").read()
    np.testing.assert_array_equal(got, want)
    assert (got == -7).sum() == 100 * 60 - 100


def test_a_damaged_chunk_is_an_error_naming_it_never_zeros(tmp_path):
    path = tmp_path / "a.h5"
    location = _write(path, "x", compression="gzip", fletcher32=True)
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info_by_coord((64, 32))
    with open(path, "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        f.write(b"\x00\xff\x00")
    source = daskstream.open_source(location)
    np.testing.assert_array_equal(source.read((slice(0, 32), slice(None))), DATA[:32])  # other chunks still read
    with pytest.raises(CorruptSourceError) as caught:
        source.read((slice(64, 96), slice(32, 48)))
    assert "the chunk at (64, 32)" in str(caught.value)
    assert str(path) in str(caught.value)
    assert caught.value.__cause__ is not None  # the decoder's own error, kept for a bug report


def test_a_fault_in_the_decoder_is_not_taken_for_a_damaged_file(tmp_path, monkeypatch):
    from daskstream.sources.hdf5 import chunks as hdf5_chunks

    location = _write(tmp_path / "a.h5", "x", compression="gzip")
    source = daskstream.open_source(location)

    def broken(self, raw, filter_mask):
        raise AttributeError("a bug in the decoder")

    monkeypatch.setattr(hdf5_chunks.ChunkDecoder, "decode", broken)
    with pytest.raises(AttributeError, match="a bug in the decoder"):
        source.read((slice(0, 32), slice(None)))


def test_reads_proceed_while_another_thread_holds_h5pys_lock(tmp_path):
    # What lets threads decode in parallel: once the chunk index is built, a read takes no h5py lock.
    location = _write(tmp_path / "a.h5", "x", compression="gzip", shuffle=True)
    source = daskstream.open_source(location)
    source.read((slice(0, 1), slice(0, 1)))  # builds this process's chunk index
    from h5py._objects import phil

    got: list[np.ndarray] = []
    with phil:
        reader = threading.Thread(target=lambda: got.append(source.read()))
        reader.start()
        reader.join(timeout=30)
        assert not reader.is_alive(), "the read waited for h5py's lock"
    np.testing.assert_array_equal(got[0], DATA)


def test_threads_and_processes_read_the_same_sum(tmp_path):
    location = _write(tmp_path / "a.h5", "x", compression="gzip", shuffle=True)
    x = daskstream.open(location, chunks=(64, 32))
    want = DATA.sum(dtype="f8")
    for scheduler in ("threads", "processes", "sync"):
        assert x.sum(dtype="f8").compute(scheduler=scheduler) == pytest.approx(want, rel=1e-12)
