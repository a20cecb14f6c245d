"""Sizes a file states about itself (chunk indexes, zip directories, codec headers, .npy headers) are checked
against what the file can hold before anything is allocated for them, on every read path.

The hostile files are real ones (h5py, zarr, zipfile) with bytes patched as a forger would. Each is read in a
fresh interpreter whose address space has no room for the size claimed, and whose resident memory may rise
by no more than the memory budget it reads with (``hostile_files.read_hostile``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import zipfile

import fsspec
import h5py
import numcodecs
import numpy as np
import pytest
import zarr
from hostile_files import (
    BUDGET,
    FORGED,
    INDEX_KINDS,
    MiB,
    claiming,
    deflated,
    forge_chunk_size,
    forge_zip_member_size,
    hdf5_file,
    move_chunk_to_end,
    read_hostile,
    stored_chunks,
    values,
    write_member,
    zipped_store,
    zstd_bomb,
)
from zarr.codecs import TransposeCodec, ZstdCodec

import daskstream as ds
from daskstream.errors import CorruptSourceError

# Every index kind HDF5 writes keeps a size for filtered chunks; the version 1 B-tree for unfiltered ones too.
FORGEABLE = [(kind, "gzip") for kind in sorted(INDEX_KINDS)] + [("btree-v1", None)]


@pytest.mark.parametrize(("kind", "compression"), FORGEABLE, ids=lambda v: str(v or "unfiltered"))
def test_a_chunk_size_forged_to_4_gib_is_refused_before_it_is_allocated(tmp_path, kind, compression):
    intact = hdf5_file(tmp_path / "intact.h5", kind, compression=compression)
    hostile = tmp_path / "hostile.h5"
    shutil.copy(intact, hostile)
    forge_chunk_size(hostile, FORGED)
    assert stored_chunks(hostile)[0].size == FORGED  # what HDF5 itself reports from the index
    growth, outcome = read_hostile(f"{hostile}::x", f"{intact}::x")
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert f"{hostile}::/x: the chunk index says the chunk at (0, 0) is {FORGED} bytes" in outcome
    assert f"past the end of the file ({os.path.getsize(hostile)} bytes)" in outcome
    assert "re-create or re-copy it" in outcome
    assert growth < BUDGET


def test_a_chunk_size_inside_the_file_but_beyond_what_its_filters_make_is_refused(tmp_path):
    # Unfiltered, a chunk of 128 x 128 float32 is stored in exactly 65536 bytes: 100 more is no chunk.
    path = hdf5_file(tmp_path / "a.h5", "btree-v1", compression=None)
    forge_chunk_size(path, 65536 + 100)
    with pytest.raises(CorruptSourceError) as info:
        ds.open(f"{path}::x").compute(scheduler="sync")
    assert "is 65636 bytes at byte" in str(info.value)
    assert "more than its filters can store its 65536 bytes in (at most 65536)" in str(info.value)


def test_the_chunk_index_is_checked_where_h5py_reads_the_chunks_too(tmp_path):
    # LZF is decoded by h5py, not here: the same index, checked before h5py is asked for the chunk.
    path = hdf5_file(tmp_path / "a.h5", "btree-v1", compression="lzf")
    forge_chunk_size(path, FORGED)
    with pytest.raises(CorruptSourceError, match=r"the chunk at \(0, 0\) is 4294967040 bytes .* past the end"):
        ds.open(f"{path}::x").compute(scheduler="sync")


COMPOUND = np.dtype([("a", "<f4"), ("b", "<i4")])


@pytest.mark.parametrize(
    "dtype",
    [
        "f4",  # decoded by daskstream's own chunk reader
        COMPOUND,  # a compound type: read by h5py, whose deflate filter grows its buffer without end
    ],
    ids=["decoded-here", "decoded-by-h5py"],
)
def test_a_deflate_bomb_the_index_points_to_is_refused_at_the_chunk_size(tmp_path, dtype):
    intact = tmp_path / "intact.h5"
    with h5py.File(intact, "w", libver="earliest") as f:
        f.create_dataset("x", data=np.zeros((256, 256), dtype), chunks=(256, 256), compression="gzip")
    hostile = tmp_path / "hostile.h5"
    shutil.copy(intact, hostile)
    chunk_bytes = 256 * 256 * np.dtype(dtype).itemsize
    # 512 times the chunk, in fewer bytes than the chunk itself: within what the index may state.
    move_chunk_to_end(hostile, deflated(512 * chunk_bytes))
    growth, outcome = read_hostile(f"{hostile}::x", f"{intact}::x")
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert f"{hostile}::/x: the chunk at (0, 0)" in outcome
    assert f"does not decode to the {chunk_bytes} bytes the chunk holds" in outcome
    assert growth < BUDGET


def test_contiguous_data_placed_past_the_end_of_the_file_is_refused(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w", libver="earliest") as f:
        f.create_dataset("x", data=values())
        offset = f["x"].id.get_offset()
    raw = bytearray(path.read_bytes())
    # The layout message (version 3, contiguous): its address, then its size.
    at = raw.find(b"\x03\x01" + struct.pack("<Q", offset)) + 2
    raw[at : at + 8] = struct.pack("<Q", len(raw) - 1000)
    path.write_bytes(raw)
    with pytest.raises(CorruptSourceError) as info:
        ds.open(f"{path}::x").compute(scheduler="sync")
    assert str(path) in str(info.value)
    assert "re-create or re-copy" in str(info.value)


def test_a_npy_header_claiming_more_than_the_file_holds_is_refused_at_open(tmp_path):
    path = tmp_path / "a.npy"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (2**40,)})
    path.write_bytes(header.getvalue() + bytes(8000))  # 8 TiB declared, 8 kB there
    with pytest.raises(CorruptSourceError, match=r"truncated: its header declares \(1099511627776,\) float64"):
        ds.open(path)


# --- Zarr -----------------------------------------------------------------------------------------

ZSTD_BOMB = zstd_bomb(2**31 - MiB)  # 2 GiB in 64 KiB


def zarr_store(folder, **options):
    zarr.create_array(folder, shape=(64, 64), chunks=(32, 32), dtype="f4", **options)[...] = values()[:64, :64]
    return folder


def _first_chunk(options) -> str:
    return "0.0" if options.get("zarr_format") == 2 else "c/0/0"


ZIP_CASES = {
    # name: (array options, {member: new bytes} or a callable of the intact chunk, what the refusal says)
    "zstd-claiming-2-GiB": (
        {"compressors": ZstdCodec()},
        lambda raw: claiming(raw, 2**31),
        "the zstd frame claims 2147483648 bytes where the chunk holds 4096",
    ),
    "zstd-bomb": ({"compressors": ZstdCodec()}, lambda raw: ZSTD_BOMB, "claims 2146435072 bytes"),
    "zstd-bomb-format-2": (
        {"compressors": numcodecs.Zstd(), "zarr_format": 2},
        lambda raw: ZSTD_BOMB,
        "claims 2146435072 bytes where the chunk holds 4096",
    ),
    # A transposed array is decoded by zarr: its chunks are checked before zarr decodes them.
    "zstd-bomb-decoded-by-zarr": (
        {"compressors": ZstdCodec(), "filters": [TransposeCodec(order=(1, 0))]},
        lambda raw: ZSTD_BOMB,
        "could not be decoded within its bounds (ValueError: the zstd frame claims 2146435072 bytes",
    ),
    "gzip-bomb": (
        {"compressors": zarr.codecs.GzipCodec()},
        lambda raw: deflated(64 * MiB, wbits=31),  # gzip
        "decodes to more than the 4096 bytes",
    ),
}


@pytest.mark.parametrize("case", sorted(ZIP_CASES))
def test_a_codec_bomb_inside_a_zipped_store_is_refused_within_the_budget(tmp_path, case):
    options, transform, message = ZIP_CASES[case]
    intact = zipped_store(zarr_store(tmp_path / "intact", **options), tmp_path / "intact.zip")
    chunk = _first_chunk(options)
    with zipfile.ZipFile(intact) as z:
        hostile_bytes = transform(z.read(chunk))
    hostile = zipped_store(
        zarr_store(tmp_path / "hostile", **options), tmp_path / "hostile.zip", {chunk: hostile_bytes}
    )
    growth, outcome = read_hostile(hostile, intact)
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert f"{hostile}: chunk {chunk!r}" in outcome
    assert message in outcome
    assert "re-create or re-copy it" in outcome
    assert growth < BUDGET


MEMBER_CASES = {
    # name: (member, its unpacked size, packed how, the size it declares instead (None: its own), the refusal)
    # A deflated member declaring 4 KiB that inflates to 128 MiB: packed in more than 4 KiB can take.
    "deflate-declaring-less": ("c/0/0", 128 * MiB, zipfile.ZIP_DEFLATED, 4096, "it is packed in 13"),
    # The same bomb, small enough to pass that check: it inflates no further than one byte past 4 KiB.
    "deflate-bomb-within-its-packed-size": (
        "c/0/0",
        4 * MiB,
        zipfile.ZIP_DEFLATED,
        4096,
        "it does not unpack to the 4096 bytes it declares",
    ),
    # A member declaring all it inflates to, far more than a chunk of 4 KiB is stored in.
    "deflate-declaring-128-MiB": ("c/0/0", 128 * MiB, zipfile.ZIP_DEFLATED, None, "it declares 134217728 bytes"),
    # bzip2 in zipfile decodes each block it reads whole, however much that makes.
    "bzip2-bomb": ("c/0/0", 64 * MiB, zipfile.ZIP_BZIP2, 4096, "it does not unpack to the 4096 bytes"),
    # zarr reads the metadata document through the zip too.
    "metadata-declaring-80-MiB": (
        "zarr.json",
        80 * MiB,
        zipfile.ZIP_DEFLATED,
        None,
        "member 'zarr.json' cannot be read: it declares 83886080 bytes",
    ),
}


@pytest.mark.parametrize("case", sorted(MEMBER_CASES))
def test_a_zip_member_bomb_is_refused_within_the_budget(tmp_path, case):
    member, size, method, declared, message = MEMBER_CASES[case]
    intact = zipped_store(zarr_store(tmp_path / "intact"), tmp_path / "intact.zip")
    hostile = tmp_path / "hostile.zip"
    folder = zarr_store(tmp_path / "hostile")
    with zipfile.ZipFile(hostile, "w") as z:
        for root, _, files in os.walk(folder):
            for name in sorted(files):
                name = os.path.relpath(os.path.join(root, name), folder)
                if name == member:
                    write_member(z, name, size, method, b" " if name == "zarr.json" else b"\0")
                else:
                    z.writestr(name, (folder / name).read_bytes())
    if declared is not None:
        forge_zip_member_size(hostile, member, declared)
    growth, outcome = read_hostile(hostile, intact)
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert str(hostile) in outcome
    assert message in outcome
    assert growth < BUDGET


@pytest.mark.parametrize(
    "options", [{"compressors": ZstdCodec()}, {"filters": [TransposeCodec(order=(1, 0))]}], ids=["here", "by-zarr"]
)
def test_a_sparse_chunk_file_of_4_gib_is_refused_before_it_is_read(tmp_path, options):
    intact = zarr_store(tmp_path / "intact.zarr", **options)
    hostile = zarr_store(tmp_path / "hostile.zarr", **options)
    os.truncate(hostile / "c" / "0" / "0", 2**32)  # 4 GiB on no disk
    growth, outcome = read_hostile(hostile, intact)
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert "chunk 'c/0/0' is 4294967296 bytes, more than this array's codecs can store a chunk in" in outcome
    assert growth < BUDGET


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_chunk_of_strings_declaring_2_billion_of_them_is_refused(tmp_path, zarr_format):
    # numcodecs allocates the count of strings a chunk's header declares before reading one.
    def store(folder):
        options = {"compressors": numcodecs.Zstd() if zarr_format == 2 else ZstdCodec()}
        array = zarr.create_array(
            folder, shape=(64, 64), chunks=(32, 32), dtype=str, zarr_format=zarr_format, **options
        )
        array[...] = np.full((64, 64), "word")
        return folder

    intact, hostile = store(tmp_path / "intact.zarr"), store(tmp_path / "hostile.zarr")
    chunk = hostile / ("0.0" if zarr_format == 2 else "c/0/0")
    decoded = numcodecs.Zstd().decode(chunk.read_bytes())
    chunk.write_bytes(numcodecs.Zstd().encode(struct.pack("<I", 2**31 - 1) + bytes(decoded)[4:]))
    growth, outcome = read_hostile(hostile, intact)
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert "declares 2147483647 variable-length items where the chunk holds 1024" in outcome
    assert growth < BUDGET


@pytest.mark.parametrize("filters", [None, [TransposeCodec(order=(1, 0))]], ids=["here", "by-zarr"])
def test_a_zstd_chunk_object_claiming_2_gib_is_refused(memory_url, filters):
    store = zarr.storage.FsspecStore.from_url(memory_url)
    zarr.create_array(store, shape=(64, 64), chunks=(32, 32), dtype="f4", compressors=ZstdCodec(), filters=filters)[
        ...
    ] = 1
    fs, root = fsspec.core.url_to_fs(memory_url)
    fs.pipe(f"{root}/c/0/0", claiming(fs.cat(f"{root}/c/0/0"), 2**31))
    with pytest.raises(CorruptSourceError, match=r"chunk 'c/0/0' .*claims 2147483648 bytes"):
        ds.open(memory_url).compute(scheduler="sync")


def test_zipped_stores_written_with_deflate_or_bzip2_still_read(tmp_path):
    for method in (zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2):
        path = zipped_store(
            zarr_store(tmp_path / "a", compressors=None), tmp_path / f"{method}.zip", compression=method
        )
        np.testing.assert_array_equal(ds.open(path).compute(scheduler="sync"), values()[:64, :64])


def test_metadata_stating_chunks_of_16_gib_for_an_array_of_10_values_is_refused_before_a_read(tmp_path):
    # Edge chunks are stored and decoded whole: the plan counts the chunk the metadata states, not the array.
    def store(folder, chunk):
        zarr.create_array(folder, shape=(10,), chunks=(16,), dtype="f8", compressors=ZstdCodec())[...] = 1
        meta = json.loads((folder / "zarr.json").read_text())
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [chunk]
        (folder / "zarr.json").write_text(json.dumps(meta))
        return folder

    intact = store(tmp_path / "intact.zarr", 16)
    hostile = store(tmp_path / "hostile.zarr", 2**31)
    (hostile / "c" / "0").write_bytes(zstd_bomb(2**34))  # what the chunk states: 16 GiB of zeros, in 512 KiB
    growth, outcome = read_hostile(hostile, intact)
    assert outcome.startswith("MemoryBudgetError(ValueError): "), outcome
    assert "32.00 GiB to decode one storage chunk (2147483648,)" in outcome
    assert growth < BUDGET
