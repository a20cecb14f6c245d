"""Shards read in part: the index, then only the inner chunks a box needs; zarr is the oracle."""

from __future__ import annotations

import os

import google_crc32c
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, ShardingCodec, ShardingCodecIndexLocation, ZstdCodec

import daskstream
import daskstream as ds
from daskstream.errors import CorruptSourceError
from daskstream.sources.zarr.shards import EMPTY, MERGE_GAP, MOST_RUN_BYTES, ShardLayout

SHAPE, INNER, SHARD = (150, 130), (10, 20), (40, 60)
DATA = np.random.default_rng(3).standard_normal(SHAPE).round(3).astype("f4")


def _sharded(path, *, index_location="end", compressors=None, data=DATA, fill_value=0.0, write=None):
    if index_location == "end":
        array = zarr.create_array(path, shape=data.shape, chunks=INNER, shards=SHARD, dtype=data.dtype,
                                  compressors=compressors or ZstdCodec(), fill_value=fill_value)  # fmt: skip
    else:
        sharding = ShardingCodec(
            chunk_shape=INNER, codecs=[zarr.codecs.BytesCodec(), compressors or ZstdCodec()],
            index_location=ShardingCodecIndexLocation.start,
        )  # fmt: skip
        array = zarr.create_array(path, shape=data.shape, chunks=SHARD, dtype=data.dtype, serializer=sharding,
                                  compressors=None, fill_value=fill_value)  # fmt: skip
    if write is None:
        array[...] = data
    else:
        array[write] = data[write]
    return zarr.open_array(path, mode="r")


boxes = st.tuples(*(st.tuples(st.integers(0, n - 1), st.integers(1, n)) for n in SHAPE)).map(
    lambda pairs: tuple(slice(min(a, b - 1), max(a + 1, b)) for a, b in pairs)
)


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")
@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("compressors", [None, BloscCodec(cname="lz4", shuffle="shuffle")], ids=["zstd", "blosc"])
def test_any_box_of_shards_read_in_part_equals_zarr(tmp_path_factory, index_location, compressors):
    path = tmp_path_factory.mktemp("s") / "a.zarr"
    # Shards partly written: absent inner chunks and a whole absent shard read as the fill value.
    written = (slice(15, 140), slice(0, 100))
    array = _sharded(path, index_location=index_location, compressors=compressors, fill_value=-2.5, write=written)
    want = array[...]
    assert (want == -2.5).any()
    assert not (want == -2.5).all()
    source = daskstream.open_source(path)
    assert source.storage_chunks == INNER
    assert source.shard_chunks == SHARD

    @settings(max_examples=60, deadline=None)
    @given(boxes)
    def reads(box):
        np.testing.assert_array_equal(source.read(box), want[box])

    reads()


def _bytes_read(run):
    """Bytes this process read through system calls (read, pread...) while ``run`` ran."""

    def rchar():
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))

    before = rchar()
    result = run()
    return result, rchar() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes read from /proc/self/io (Linux)")
def test_a_box_within_a_shard_reads_its_index_and_inner_chunks_not_the_shard(tmp_path):
    data = np.random.default_rng(0).standard_normal((512, 512)).astype("f4")  # incompressible: ~1 MiB a shard
    zarr.create_array(tmp_path / "a.zarr", data=data, chunks=(64, 64), shards=(512, 512))
    shard_bytes = os.path.getsize(tmp_path / "a.zarr" / "c" / "0" / "0")
    source = daskstream.open_source(tmp_path / "a.zarr")
    source.read((slice(0, 1), slice(0, 1)))  # opens the array and its reader: not what is counted
    one_chunk = (slice(64, 128), slice(128, 192))
    got, read = _bytes_read(lambda: source.read(one_chunk))
    np.testing.assert_array_equal(got, data[one_chunk])
    # The index (64 entries of 16 bytes and a checksum) and one inner chunk of 16 kiB, compressed.
    assert read < 64 * 64 * 4 + 64 * 16 + 4096 < shard_bytes // 10
    row = (slice(64, 128), slice(0, 512))  # a row of inner chunks, wherever the writer put their bytes
    got, read = _bytes_read(lambda: source.read(row))
    np.testing.assert_array_equal(got, data[row])
    raw = (tmp_path / "a.zarr" / "c" / "0" / "0").read_bytes()
    sizes = np.frombuffer(raw[-4 - 64 * 16 : -4], dtype="<u8").reshape(8, 8, 2)[1, :, 1]
    # Its chunks, and at most a gap between each two merged into one read.
    assert read <= int(sizes.sum()) + 7 * MERGE_GAP + 64 * 16 + 4096
    assert read < shard_bytes // 4  # a row is an eighth of the shard


def test_tasks_of_inner_chunks_sum_as_numpy_on_every_scheduler(tmp_path):
    _sharded(tmp_path / "a.zarr")
    x = ds.open(tmp_path / "a.zarr", memory_budget="64MiB")
    assert all(n % INNER[0] == 0 for n in x.chunks[0][:-1])
    for scheduler in ("threads", "sync", "processes"):
        assert float(x.sum(dtype="f8").compute(scheduler=scheduler)) == pytest.approx(DATA.sum(dtype="f8"), rel=1e-9)


def _forge_index_entry(path, entry, offset, nbytes):
    """Rewrite one inner chunk's entry in a shard's index (at its end), with a checksum that matches."""
    raw = bytearray(path.read_bytes())
    count = (SHARD[0] // INNER[0]) * (SHARD[1] // INNER[1])
    start = len(raw) - 4 - 16 * count
    index = np.frombuffer(bytes(raw[start : len(raw) - 4]), dtype="<u8").reshape(count, 2).copy()
    index[entry] = (offset, nbytes)
    body = index.tobytes()
    raw[start:] = body + google_crc32c.value(body).to_bytes(4, "little")
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("offset", "nbytes", "why"),
    [(2**40, 100, "at bytes 1099511627776:"), (0, 2**40, "at most"), (2**64 - 2, 10, "at bytes")],
    ids=["past-the-end", "larger-than-a-chunk-can-be", "wrapping-around"],
)
def test_a_forged_shard_index_is_refused_before_its_range_is_read(tmp_path, offset, nbytes, why):
    _sharded(tmp_path / "a.zarr")
    _forge_index_entry(tmp_path / "a.zarr" / "c" / "0" / "0", 1, offset, nbytes)
    source = daskstream.open_source(tmp_path / "a.zarr")
    with pytest.raises(CorruptSourceError, match=rf"chunk 'c/0/0' could not be decoded .*{why}"):
        source.read((slice(0, 10), slice(0, 60)))
    np.testing.assert_array_equal(source.read((slice(40, 80), slice(0, 60))), DATA[40:80, :60])  # others read


def _layout(per_shard=(4,), inner=(10,)):
    return ShardLayout(
        inner_shape=inner, per_shard=per_shard, index_size=16 * int(np.prod(per_shard)), at_end=True,
        index_unwrap=lambda raw: raw, index_dtype=np.dtype("<u8"), inner_unwrap=lambda raw: raw,
        dtype=np.dtype("u1"), largest_inner=2**30,
    )  # fmt: skip


def test_neighbouring_inner_chunks_are_one_run_and_far_or_large_ones_are_not():
    layout = _layout()
    whole = (slice(0, 40),)
    contiguous = np.array([[0, 100], [100, 100], [200, 100], [300, 100]], dtype="<u8")
    runs, absent = layout.runs(contiguous, whole)
    assert [(r.start, r.stop) for r in runs] == [(0, 400)]
    assert not absent
    gap = np.array([[0, 100], [100 + MERGE_GAP + 1, 100], [EMPTY, EMPTY], [2 * MERGE_GAP, 100]], dtype="<u8")
    runs, absent = layout.runs(gap, whole)
    assert [(r.start, r.stop) for r in runs] == [(0, 100), (100 + MERGE_GAP + 1, 2 * MERGE_GAP + 100)]
    assert absent == [(slice(20, 30),)]
    big = MOST_RUN_BYTES // 2 + 1
    large = np.array([[0, big], [big, big], [2 * big, big], [3 * big, big]], dtype="<u8")
    runs, _ = layout.runs(large, whole)
    assert len(runs) == 4
    # Only the chunks a box touches, in the order their bytes lie (written out of order here).
    far = 3 * MERGE_GAP
    shuffled = np.array([[far, 100], [0, 100], [200, 100], [100, 100]], dtype="<u8")
    runs, _ = layout.runs(shuffled, (slice(5, 15),))
    assert [(r.start, r.stop) for r in runs] == [(0, 100), (far, far + 100)]
    assert [p.target for r in runs for p in r.pieces] == [(slice(5, 10),), (slice(0, 5),)]
