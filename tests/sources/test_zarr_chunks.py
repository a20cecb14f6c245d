"""Zarr chunk and shard files read and decoded in the calling thread; zarr is the oracle."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    ShardingCodecIndexLocation,
    TransposeCodec,
    ZstdCodec,
)

import daskstream
from daskstream.errors import CorruptSourceError
from daskstream.sources.zarr.chunks import chunk_reader_for
from daskstream.sources.zarr.decoders import v2_decoder, v3_decoder

DATA = np.random.default_rng(5).standard_normal((301, 77)).round(2).astype("f4")
# The second and third: chunks whose places in the result are runs of memory (one chunk wide), decoded into them.
REGIONS = [
    (),
    (slice(40, 120), slice(20, 40)),
    (slice(0, 300), slice(60, 77)),
    (slice(40, 120), slice(10, 70)),
    (slice(5, 290), slice(3, 70)),
    (300, slice(None)),
]


def _check(path, decoded_here):
    array = zarr.open_array(path, mode="r")
    assert (chunk_reader_for(array) is not None) is decoded_here
    source = daskstream.open_source(path)
    want = array[...]
    for region in REGIONS:
        np.testing.assert_array_equal(source.read(region), want[region])


@pytest.mark.parametrize(
    "options",
    [
        {"compressors": None},
        {"compressors": ZstdCodec(level=3)},
        {"compressors": ZstdCodec(level=1, checksum=True)},
        {"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")},
        {"compressors": BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")},
        {"compressors": (GzipCodec(level=1), Crc32cCodec())},
        {"serializer": BytesCodec(endian="big"), "compressors": ZstdCodec()},
        {"shards": (80, 40), "compressors": ZstdCodec()},
        {"shards": (80, 40), "compressors": BloscCodec(cname="lz4", shuffle="shuffle")},
    ],
    ids=["raw", "zstd", "zstd-checksum", "blosc-lz4", "blosc-zstd-bitshuffle", "gzip-crc32c", "big-endian",
         "sharded-zstd", "sharded-blosc"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", ["f4", "i8", "u1"])
def test_format_3_equals_zarr(tmp_path, options, dtype):
    data = (DATA * 100).astype(dtype)
    array = zarr.create_array(tmp_path / "a.zarr", shape=data.shape, chunks=(20, 20), dtype=dtype, **options)
    array[...] = data
    _check(tmp_path / "a.zarr", decoded_here=True)


# zarr's create_array takes the index location only from a sharding codec given whole, and warns that it
# then cannot write partial shards: this test writes them whole anyway.
@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")
def test_shard_index_at_the_start_and_partly_filled_shards(tmp_path):
    sharding = ShardingCodec(
        chunk_shape=(20, 20), codecs=[BytesCodec(), ZstdCodec()], index_location=ShardingCodecIndexLocation.start
    )
    array = zarr.create_array(
        tmp_path / "a.zarr", shape=DATA.shape, chunks=(80, 40), dtype="f4", serializer=sharding, fill_value=-1.5
    )
    array[30:50, 10:30] = DATA[30:50, 10:30]  # most inner chunks and shards never written
    _check(tmp_path / "a.zarr", decoded_here=True)


def test_missing_chunk_files_read_as_the_fill_value(tmp_path):
    array = zarr.create_array(tmp_path / "a.zarr", shape=(100, 100), chunks=(30, 30), dtype="i2", fill_value=7)
    array[0:30, 0:30] = 1
    got = daskstream.open_source(tmp_path / "a.zarr").read()
    assert (got[:30, :30] == 1).all()
    assert (got == 7).sum() == 100 * 100 - 900


@pytest.mark.parametrize("sharded", [False, True])
def test_a_damaged_chunk_is_an_error_naming_its_key_never_zeros(tmp_path, sharded):
    array = zarr.create_array(tmp_path / "a.zarr", shape=DATA.shape, chunks=(20, 20), dtype="f4",
                              shards=(80, 40) if sharded else None, compressors=ZstdCodec())  # fmt: skip
    array[...] = DATA
    chunk_file = tmp_path / "a.zarr" / "c" / "1" / "0"
    # Cut short (a copy that did not finish): zstd frames without a checksum cannot tell a flipped byte.
    raw = chunk_file.read_bytes()
    chunk_file.write_bytes(raw[: len(raw) // 2])
    source = daskstream.open_source(tmp_path / "a.zarr")
    first = (slice(0, 20), slice(0, 20))
    np.testing.assert_array_equal(source.read(first), DATA[first])  # other chunks still read
    grid = (80, 40) if sharded else (20, 20)
    with pytest.raises(CorruptSourceError, match="chunk 'c/1/0'") as caught:
        source.read((slice(grid[0], 2 * grid[0]), slice(0, grid[1])))
    # The codec's own error is kept as the cause, for a bug report.
    assert isinstance(caught.value.__cause__, (ValueError, RuntimeError))


@pytest.mark.parametrize("dtype", ["f8", ">i4"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_format_2_equals_zarr(tmp_path, dtype, order):
    from numcodecs import Blosc, Delta

    array = zarr.create_array(tmp_path / "a.zarr", shape=DATA.shape, chunks=(20, 20), dtype=dtype, zarr_format=2,
                              order=order, compressors=Blosc(cname="zstd"), filters=[Delta(dtype=dtype)])  # fmt: skip
    array[...] = (DATA * 100).astype(dtype)
    _check(tmp_path / "a.zarr", decoded_here=True)


def test_transposed_and_zipped_arrays_are_left_to_zarr(tmp_path):
    array = zarr.create_array(tmp_path / "t.zarr", shape=DATA.shape, chunks=(20, 20), dtype="f4",
                              filters=[TransposeCodec(order=(1, 0))])  # fmt: skip
    array[...] = DATA
    _check(tmp_path / "t.zarr", decoded_here=False)
    with zarr.storage.ZipStore(tmp_path / "a.zip", mode="w") as store:
        zarr.create_array(store, shape=DATA.shape, chunks=(20, 20), dtype="f4")[...] = DATA
    np.testing.assert_array_equal(daskstream.open_source(tmp_path / "a.zip").read(), DATA)


def test_threads_sum_equals_numpy(tmp_path):
    array = zarr.create_array(tmp_path / "a.zarr", shape=DATA.shape, chunks=(20, 20), shards=(80, 40), dtype="f4")
    array[...] = DATA
    x = daskstream.open(tmp_path / "a.zarr")
    assert x.sum(dtype="f8").compute(scheduler="threads") == pytest.approx(DATA.sum(dtype="f8"), rel=1e-12)


@pytest.mark.parametrize(
    ("options", "into"),
    [
        ({"compressors": ZstdCodec(level=3)}, True),
        ({"compressors": ZstdCodec(level=1, checksum=True)}, True),
        ({"compressors": (ZstdCodec(), Crc32cCodec())}, True),
        ({"compressors": BloscCodec(cname="lz4", shuffle="shuffle")}, True),
        ({"compressors": (GzipCodec(level=1),)}, False),
        ({"compressors": None}, False),
        ({"serializer": BytesCodec(endian="big"), "compressors": ZstdCodec()}, False),
    ],
    ids=["zstd", "zstd-checksum", "zstd-crc32c", "blosc", "gzip", "raw", "big-endian"],
)
def test_a_whole_chunk_decodes_straight_into_its_place_where_its_codec_can(tmp_path, options, into):
    data = (DATA[:40, :40] * 100).astype("i4")
    array = zarr.create_array(tmp_path / "a.zarr", shape=data.shape, chunks=(20, 40), dtype="i4", **options)
    array[...] = data
    decoder = v3_decoder(array.metadata.codecs, (20, 40), array.metadata)
    stored = (tmp_path / "a.zarr" / "c" / "1" / "0").read_bytes()
    block = np.full((40, 40), -1, dtype="i4")  # two chunks, one above the other: each a run of memory
    assert decoder.into(stored, block[20:40]) is into
    np.testing.assert_array_equal(block[20:40], data[20:40] if into else -1)  # nothing written where it cannot
    np.testing.assert_array_equal(block[:20], -1)
    # Places that are not a run of memory, not the chunk's shape or dtype, or not writable: never decoded into.
    wide = np.full((20, 80), -1, dtype="i4")
    assert not decoder.into(stored, wide[:, :40])
    assert not decoder.into(stored, np.empty((20, 40), dtype="f4"))
    assert not decoder.into(stored, np.empty((10, 40), dtype="i4"))
    read_only = np.zeros((20, 40), dtype="i4")
    read_only.flags.writeable = False
    assert not decoder.into(stored, read_only)
    assert (wide == -1).all()
    assert not read_only.any()
    np.testing.assert_array_equal(decoder(stored, (slice(0, 20), slice(0, 40)), 0), data[20:40])


@pytest.mark.parametrize(("order", "into"), [("C", True), ("F", False)])
def test_a_format_2_chunk_decodes_into_its_place_in_c_order_through_its_compressor_alone(tmp_path, order, into):
    from numcodecs import Blosc, Zstd

    data = (DATA * 100).astype("f8")
    for compressor in (Zstd(level=2), Blosc(cname="zstd")):
        path = tmp_path / f"{order}-{compressor.codec_id}.zarr"
        array = zarr.create_array(path, shape=data.shape, chunks=(20, 77), dtype="f8", zarr_format=2, order=order,
                                  compressors=compressor)  # fmt: skip
        array[...] = data
        block = np.zeros((40, 77))
        assert v2_decoder(array.metadata).into((path / "1.0").read_bytes(), block[20:]) is into
        np.testing.assert_array_equal(block[20:], data[20:40] if into else 0)
        np.testing.assert_array_equal(block[:20], 0)
        _check(path, decoded_here=True)


def test_a_chunk_claiming_another_size_is_refused_before_it_is_decoded_into_its_place(tmp_path):
    array = zarr.create_array(tmp_path / "a.zarr", shape=(40, 40), chunks=(20, 40), dtype="f4",
                              compressors=ZstdCodec())  # fmt: skip
    array[...] = DATA[:40, :40]
    other = zarr.create_array(tmp_path / "b.zarr", shape=(40, 80), chunks=(20, 80), dtype="f4",
                              compressors=ZstdCodec())  # fmt: skip
    other[...] = 1
    (tmp_path / "a.zarr" / "c" / "1" / "0").write_bytes((tmp_path / "b.zarr" / "c" / "1" / "0").read_bytes())
    source = daskstream.open_source(tmp_path / "a.zarr")
    with pytest.raises(CorruptSourceError, match=r"chunk 'c/1/0'.*claims 6400 bytes where the chunk holds 3200"):
        source.read((slice(20, 40), slice(0, 40)))
    np.testing.assert_array_equal(source.read((slice(0, 20), slice(0, 40))), DATA[:20, :40])
