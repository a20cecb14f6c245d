"""Chunks encoded in the tasks are the bytes zarr itself writes, under the keys zarr reads."""

from __future__ import annotations

import filecmp
import os

import dask
import dask.array as da
import numcodecs
import numpy as np
import pytest
import zarr
from packaging.version import Version
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec

import daskstream as ds
from daskstream.compute.store.chunk_writer import chunk_writer_for
from daskstream.errors import InvalidArgumentError

CODECS = {
    "zstd": {},
    "blosc-lz4-bitshuffle": {"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")},
    "blosc-zstd-shuffle": {"compressors": BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")},
    "gzip": {"compressors": GzipCodec(level=1)},
    "zstd-crc32c": {"compressors": [ZstdCodec(level=1), Crc32cCodec()]},
    "none": {"compressors": None},
    "v2-zstd": {"zarr_format": 2},
    "v2-blosc": {"zarr_format": 2, "compressors": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.BITSHUFFLE)},
    "v2-slash-keys": {"zarr_format": 2, "chunk_key_encoding": {"name": "v2", "separator": "/"}},
    "v3-dot-keys": {"chunk_key_encoding": {"name": "default", "separator": "."}},
}


def _without_gzip_time(encoded: bytes) -> bytes:
    """The bytes of a chunk file with a gzip member's MTIME field zeroed.

    gzip stamps the time of encoding into bytes 4-7 of its header (numcodecs' GZip, which zarr
    uses, does not fix it), so two encodings of the same chunk a second apart differ there only.
    """
    if encoded[:2] != b"\x1f\x8b":
        return encoded
    return encoded[:4] + bytes(4) + encoded[8:]


def _files(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, f), folder) for r, _, names in os.walk(folder) for f in names)


@pytest.mark.parametrize("dtype", ["f4", ">i2", "u1", "c8", "?"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_each_chunk_file_is_the_one_zarr_writes(tmp_path, codec, dtype):
    rng = np.random.default_rng(5)
    data = (rng.standard_normal((10, 7)) * 100).astype(dtype)
    data[:4, :4] = 0  # a chunk of fill value: zarr writes no file for it
    by_zarr = zarr.create_array(tmp_path / "zarr.zarr", shape=data.shape, chunks=(4, 4), dtype=dtype, **CODECS[codec])
    by_zarr[...] = data
    here = zarr.create_array(tmp_path / "here.zarr", shape=data.shape, chunks=(4, 4), dtype=dtype, **CODECS[codec])
    writer = chunk_writer_for(str(tmp_path / "here.zarr"), here)
    assert writer is not None
    for index in np.ndindex(3, 2):  # edge chunks are padded with the fill value, as zarr pads them
        writer.write(index, data[index[0] * 4 : index[0] * 4 + 4, index[1] * 4 : index[1] * 4 + 4])
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "here.zarr", mode="r")[...], data)
    assert _files(tmp_path / "here.zarr") == _files(tmp_path / "zarr.zarr")
    if codec.startswith("blosc") and Version(numcodecs.__version__) < Version("0.16"):
        return  # zarr then shuffles by single bytes, not by the item size its metadata declares; both decode
    for name in _files(tmp_path / "zarr.zarr"):
        by_zarr_bytes, here_bytes = (
            (folder / name).read_bytes() for folder in (tmp_path / "zarr.zarr", tmp_path / "here.zarr")
        )
        assert _without_gzip_time(by_zarr_bytes) == _without_gzip_time(here_bytes), name


def test_a_chunk_that_becomes_fill_value_removes_its_file(tmp_path):
    array = zarr.create_array(tmp_path / "a.zarr", shape=(8,), chunks=(4,), dtype="f8", fill_value=np.nan)
    writer = chunk_writer_for(str(tmp_path / "a.zarr"), array)
    writer.write((1,), np.arange(4.0))
    assert (tmp_path / "a.zarr" / "c" / "1").exists()
    writer.write((1,), np.full(4, np.nan))  # NaN fill equals NaN here, as zarr compares it
    assert not (tmp_path / "a.zarr" / "c" / "1").exists()
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a.zarr", mode="r")[...], np.full(8, np.nan))


SHARDED = {
    "index-at-end": {"shards": (8, 8), "chunks": (4, 4)},
    "crc32c-inside": {"shards": (8, 8), "chunks": (4, 4), "compressors": [ZstdCodec(level=1), Crc32cCodec()]},
    "blosc-inside": {"shards": (8, 4), "chunks": (2, 4), "compressors": BloscCodec(cname="lz4", shuffle="bitshuffle")},
    "index-at-start": {"chunks": (8, 8), "compressors": None, "serializer": ShardingCodec(
        chunk_shape=(4, 4), codecs=[BytesCodec(), ZstdCodec()], index_location="start")},
    "index-without-checksum": {"chunks": (8, 8), "compressors": None, "serializer": ShardingCodec(
        chunk_shape=(4, 4), codecs=[BytesCodec(), ZstdCodec()], index_codecs=[BytesCodec()])},
}  # fmt: skip


@pytest.mark.parametrize("layout", list(SHARDED))
def test_each_shard_file_is_the_one_zarr_writes(tmp_path, layout):
    data = (np.random.default_rng(7).standard_normal((20, 14)) * 100).astype("f4")
    data[:4, :4] = 0  # an inner chunk of fill value: left out of its shard
    data[8:16, :8] = 0  # a whole shard of fill value: no file at all
    by_zarr = zarr.create_array(tmp_path / "zarr.zarr", shape=data.shape, dtype="f4", **SHARDED[layout])
    by_zarr[...] = data
    here = zarr.create_array(tmp_path / "here.zarr", shape=data.shape, dtype="f4", **SHARDED[layout])
    writer = chunk_writer_for(str(tmp_path / "here.zarr"), here)
    assert writer is not None
    assert writer.inner_chunks is not None
    rows, cols = writer.chunk_shape
    for index in np.ndindex(-(-20 // rows), -(-14 // cols)):
        writer.write(index, data[index[0] * rows : (index[0] + 1) * rows, index[1] * cols : (index[1] + 1) * cols])
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "here.zarr", mode="r")[...], data)
    assert _files(tmp_path / "here.zarr") == _files(tmp_path / "zarr.zarr")
    assert "c/1/0" not in _files(tmp_path / "here.zarr")
    if layout == "blosc-inside" and Version(numcodecs.__version__) < Version("0.16"):
        return  # zarr then shuffles by single bytes, not by the item size its metadata declares; both decode
    for name in _files(tmp_path / "zarr.zarr"):
        assert filecmp.cmp(tmp_path / "zarr.zarr" / name, tmp_path / "here.zarr" / name, shallow=False), name


def test_a_sharded_store_writes_one_shard_per_block_that_zarr_and_daskstream_read(tmp_path):
    data = np.random.default_rng(2).standard_normal((300, 70)).astype("f4")
    x = da.from_array(data, chunks=(64, 32)) * 2
    ds.store(x, tmp_path / "here.zarr", inner_chunks=(16, 16))
    with dask.config.set({"daskstream.compute.encode-in-tasks": False}):
        ds.store(x, tmp_path / "zarr.zarr", inner_chunks=(16, 16))
    array = zarr.open_array(tmp_path / "here.zarr", mode="r")
    assert (array.shards, array.chunks) == ((64, 32), (16, 16))
    shard_files = [name for name in _files(tmp_path / "zarr.zarr") if name.startswith("c/")]
    assert len(shard_files) == 5 * 3
    for name in shard_files:
        assert filecmp.cmp(tmp_path / "zarr.zarr" / name, tmp_path / "here.zarr" / name, shallow=False), name
    np.testing.assert_array_equal(ds.open(tmp_path / "here.zarr").compute(), data * 2)


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"inner_chunks": (10, 16)}, "dividing the shard"), ({"inner_chunks": (16, 16), "zarr_format": 2}, "format 3")],
)
def test_inner_chunks_that_cannot_make_shards_are_refused(tmp_path, kw, match):
    with pytest.raises(InvalidArgumentError, match=match):
        ds.store(da.zeros((64, 64), chunks=32), tmp_path / "o.zarr", **kw)
    with pytest.raises(InvalidArgumentError, match="for Zarr targets"):
        ds.store(da.zeros((64, 64), chunks=32), f"{tmp_path}/o.h5::/x", inner_chunks=(16, 16))


def test_arrays_zarr_must_write_get_no_writer(tmp_path):
    sharded = zarr.create_array(tmp_path / "s.zarr", shape=(8, 8), dtype="f4", chunks=(4, 4), compressors=None,
                                serializer=ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec(endian="big")],
                                                         index_codecs=[BytesCodec(endian="big")]))  # fmt: skip
    transposed = zarr.create_array(tmp_path / "t.zarr", shape=(8, 8), chunks=(4, 4), dtype="f4",
                                   filters=[TransposeCodec(order=(1, 0))])  # fmt: skip
    filtered = zarr.create_array(tmp_path / "f.zarr", shape=(8,), chunks=(4,), dtype="f4", zarr_format=2,
                                 filters=[numcodecs.Delta(dtype="f4")])  # fmt: skip
    for path, array in (("s.zarr", sharded), ("t.zarr", transposed), ("f.zarr", filtered)):
        assert chunk_writer_for(str(tmp_path / path), array) is None, path


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_store_encoded_in_tasks_equals_one_written_through_zarr(tmp_path, zarr_format):
    data = np.random.default_rng(1).standard_normal((300, 70)).astype("f4")
    x = da.from_array(data, chunks=(64, 32)) * 2
    ds.store(x, tmp_path / "here.zarr", zarr_format=zarr_format)
    with dask.config.set({"daskstream.compute.encode-in-tasks": False}):
        ds.store(x, tmp_path / "zarr.zarr", zarr_format=zarr_format)
    chunk_files = [
        name for name in _files(tmp_path / "zarr.zarr") if not name.startswith((".daskstream", "zarr.json", ".z"))
    ]
    assert len(chunk_files) == 5 * 3
    assert _files(tmp_path / "here.zarr") == _files(tmp_path / "zarr.zarr")
    for name in chunk_files:
        assert filecmp.cmp(tmp_path / "zarr.zarr" / name, tmp_path / "here.zarr" / name, shallow=False), name
    np.testing.assert_array_equal(ds.open(tmp_path / "here.zarr").compute(), data * 2)


HDF5_FILTERS = {
    "none": {},
    "gzip-1": {"compression": "gzip", "compression_opts": 1},
    "gzip-9-shuffle": {"compression": "gzip", "compression_opts": 9, "shuffle": True},
    "store-default": {"compression": "gzip", "compression_opts": 1, "shuffle": True},
}


@pytest.mark.parametrize("dtype", ["f4", ">i2", "u1", "c8", "?"])
@pytest.mark.parametrize("filters", list(HDF5_FILTERS))
def test_hdf5_chunks_encoded_here_read_back_through_hdf5(tmp_path, filters, dtype):
    import h5py

    from daskstream.compute.store.hdf5_encoder import hdf5_encoder_for

    data = (np.random.default_rng(2).standard_normal((10, 7)) * 100).astype(dtype)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        dset = f.create_dataset("x", shape=data.shape, dtype=dtype, chunks=(4, 4),
                                **HDF5_FILTERS[filters])  # fmt: skip
        encoder = hdf5_encoder_for(dset)
        assert encoder is not None
        for index in np.ndindex(3, 2):  # edge chunks padded to the chunk shape, as HDF5 stores them
            block = data[index[0] * 4 : index[0] * 4 + 4, index[1] * 4 : index[1] * 4 + 4]
            dset.id.write_direct_chunk((index[0] * 4, index[1] * 4), encoder.encode(block))
    with h5py.File(tmp_path / "a.h5", "r") as f:
        np.testing.assert_array_equal(f["x"][...], data)


def test_hdf5_pipelines_h5py_must_apply_get_no_encoder(tmp_path):
    import h5py

    from daskstream.compute.store.hdf5_encoder import hdf5_encoder_for

    with h5py.File(tmp_path / "a.h5", "w") as f:
        for name, options in {"lzf": {"compression": "lzf"}, "fletcher32": {"fletcher32": True},
                              "scaleoffset": {"scaleoffset": 2}}.items():  # fmt: skip
            assert hdf5_encoder_for(f.create_dataset(name, shape=(8,), dtype="f4", chunks=(4,), **options)) is None
        assert hdf5_encoder_for(f.create_dataset("contiguous", shape=(8,), dtype="f4")) is None


def test_an_hdf5_store_encoded_in_tasks_equals_one_written_through_h5py(tmp_path):
    data = np.random.default_rng(1).standard_normal((300, 70)).astype("f4")
    x = da.from_array(data, chunks=(64, 32)) * 2
    here = ds.store(x, f"{tmp_path}/here.h5::/x")
    with dask.config.set({"daskstream.compute.encode-in-tasks": False}):
        there = ds.store(x, f"{tmp_path}/h5py.h5::/x")
    np.testing.assert_array_equal(here.compute(), there.compute())
    np.testing.assert_array_equal(here.compute(), data * 2)


@pytest.mark.parametrize("fill", [0.0, 7.0, np.nan])
def test_a_chunk_is_fill_value_only_when_every_element_is(tmp_path, fill):
    array = zarr.create_array(tmp_path / "a.zarr", shape=(8,), chunks=(8,), dtype="f8", fill_value=fill)
    writer = chunk_writer_for(str(tmp_path / "a.zarr"), array)
    ends_only = np.full(8, fill)
    ends_only[3] = 1.0  # the first and last elements are the fill value, one inside is not
    assert writer.encode(ends_only) is not None
    assert writer.encode(np.full(8, fill)) is None
    writer.write((0,), ends_only)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a.zarr", mode="r")[...], ends_only)


@pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification")
def test_records_and_bytes_are_written_as_zarr_writes_them(tmp_path):
    for dtype, data in ((np.dtype([("a", "<i4"), ("b", "<f8")]), np.array([(0, 0.0), (1, 2.5), (0, 0.0)],
                        dtype=[("a", "<i4"), ("b", "<f8")])), (np.dtype("S3"), np.array([b"", b"ab", b""], "S3"))):  # fmt: skip
        for zarr_format in (2, 3):
            path = tmp_path / f"{dtype.kind}{zarr_format}.zarr"
            array = zarr.create_array(path, shape=(3,), chunks=(1,), dtype=dtype, zarr_format=zarr_format)
            writer = chunk_writer_for(str(path), array)
            if writer is None:
                continue  # zarr writes it
            for index in range(3):
                writer.write((index,), data[index : index + 1])
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)


@pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification")
@pytest.mark.parametrize("codec", ["zstd", "none", "v2-zstd", "v2-none"])
@pytest.mark.parametrize("dtype", ["M8[s]", "m8[ms]", "V4"])
def test_datetimes_and_raw_bytes_are_written_with_any_codec(tmp_path, codec, dtype):
    options = {"zstd": {}, "none": {"compressors": None}, "v2-zstd": {"zarr_format": 2},
               "v2-none": {"zarr_format": 2, "compressors": None}}[codec]  # fmt: skip
    data = np.arange(1, 6, dtype="i4").view("V4") if dtype == "V4" else np.arange(1, 6).astype(dtype)
    try:
        array = zarr.create_array(tmp_path / "a.zarr", shape=(5,), chunks=(2,), dtype=dtype, **options)
    except (ValueError, TypeError):
        pytest.skip(f"zarr does not store {dtype} as {codec}")
    writer = chunk_writer_for(str(tmp_path / "a.zarr"), array)
    if writer is None:
        pytest.skip("zarr writes it")
    for index in range(3):
        writer.write((index,), data[2 * index : 2 * index + 2])
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a.zarr", mode="r")[...], data)
