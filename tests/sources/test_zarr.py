"""Zarr stores: formats 2 and 3, groups, zip files, shards, missing chunks, URLs and wrong paths."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from source_helpers import assert_same_array

import daskstream
import daskstream as ds
from daskstream.errors import (
    DaskstreamError,
    MemberNotFoundError,
    MissingDependencyError,
    NotAnArrayError,
    NotAZarrStoreError,
    SourceNotFoundError,
    UnknownFormatError,
)
from daskstream.sources import ZarrSource, guess_format


def values(shape=(10, 9), dtype="float64") -> np.ndarray:
    n = int(np.prod(shape))
    return ((np.arange(n) * 13) % 97).reshape(shape).astype(dtype)


def check_reads(source: daskstream.Source, expected: np.ndarray) -> None:
    assert isinstance(source, ZarrSource)
    assert_same_array(source.read(), expected)
    assert_same_array(source.read((slice(2, 9), slice(None, None, -2))), expected[2:9, ::-2])
    assert_same_array(source.read((-1, slice(3, 8))), expected[-1, 3:8])
    assert_same_array(daskstream.open(source).compute(), expected)


# Arrays at the root of a store and at several depths inside groups, in both formats.
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("member", [None, "a", "a/b/c"], ids=["root", "in-group", "nested-groups"])
def test_array_at_any_depth(tmp_path, zarr_format, member):
    path, data = str(tmp_path / "store.zarr"), values()
    if member is None:
        zarr.create_array(path, data=data, chunks=(4, 4), zarr_format=zarr_format)
    else:
        root = zarr.open_group(path, mode="w", zarr_format=zarr_format)
        root.create_array(member, data=data, chunks=(4, 4))
        root.create_array("elsewhere", data=np.zeros(2))  # so the member must be named
    source = daskstream.open_source(path, dataset=member)
    assert source.zarr_format == zarr_format
    assert source.dataset == member
    assert source.storage_chunks == (4, 4)
    check_reads(source, data)
    if member is not None:
        assert_same_array(daskstream.open_source(f"{path}::{member}").read(), data)
        assert_same_array(daskstream.open_source(path, dataset=f"/{member}/").read(), data)
        assert daskstream.open_source(path, dataset=f"/{member}").token == source.token


# One array anywhere in the store is unambiguous, however deep it sits.
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_only_array_opens_without_naming_it(tmp_path, zarr_format):
    path, data = str(tmp_path / "store.zarr"), values()
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    root.create_group("empty")
    root.create_array("x/y", data=data, chunks=(5, 5))
    source = daskstream.open_source(path)
    assert source.dataset == "x/y"
    check_reads(source, data)


# Zip stores as zarr-python writes them, including a group inside the zip.
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("member", [None, "g/values"], ids=["root", "in-group"])
def test_zip_store(tmp_path, zarr_format, member):
    path, data = str(tmp_path / "store.zip"), values()
    store = zarr.storage.ZipStore(path, mode="w")
    try:
        if member is None:
            zarr.create_array(store, data=data, chunks=(3, 4), zarr_format=zarr_format)
        else:
            root = zarr.open_group(store, mode="w", zarr_format=zarr_format)
            root.create_array(member, data=data, chunks=(3, 4))
            root.create_array("other", data=np.zeros(2))
    finally:
        store.close()
    assert guess_format(path) == "zarr"
    check_reads(daskstream.open_source(path, dataset=member), data)


def test_local_shards_are_read_in_part_so_tasks_are_planned_in_inner_chunks(tmp_path):
    # A shard file is read by its index and byte ranges: a task of a few inner chunks reads no more than it needs.
    path, data = str(tmp_path / "sharded.zarr"), values((12, 10))
    zarr.create_array(path, data=data, chunks=(2, 5), shards=(6, 10))
    source = daskstream.open_source(path)
    assert source.storage_chunks == source.inner_chunks == (2, 5)
    assert source.shard_chunks == (6, 10)
    assert "shards (6, 10) of chunks (2, 5)" in source.describe_storage()
    assert all(n % 2 == 0 for n in ds.plan(source).dask_chunks[0][:-1])
    check_reads(source, data)


def test_shards_in_a_zip_are_read_whole_so_tasks_keep_to_whole_shards(tmp_path):
    path, data = str(tmp_path / "sharded.zarr.zip"), values((12, 10))
    store = zarr.storage.ZipStore(path, mode="w")
    try:
        zarr.create_array(store, data=data, chunks=(2, 5), shards=(6, 10))
    finally:
        store.close()
    source = daskstream.open_source(path)
    assert source.storage_chunks == source.shard_chunks == (6, 10)
    assert all(n % 6 == 0 for n in ds.plan(source).dask_chunks[0][:-1])
    check_reads(source, data)


# Chunks nobody wrote are absent from the store; the format says they read as fill_value.
@pytest.mark.parametrize(
    ("zarr_format", "shards", "fill", "dtype"),
    [
        (2, None, -3, "int16"),
        (3, None, -3, "int16"),
        (3, None, np.nan, "float32"),
        (3, (4, 6), 9, "uint8"),
        (2, None, np.nan, "float64"),
    ],
    ids=["v2-int", "v3-int", "v3-nan", "v3-sharded-partial-shard", "v2-nan"],
)
def test_missing_chunks_read_as_fill_value(tmp_path, zarr_format, shards, fill, dtype):
    path = str(tmp_path / "sparse.zarr")
    array = zarr.create_array(
        path, shape=(10, 9), chunks=(2, 3), shards=shards, dtype=dtype, fill_value=fill, zarr_format=zarr_format
    )
    array[2:4, 3:6] = 1
    expected = np.full((10, 9), fill, dtype=dtype)
    expected[2:4, 3:6] = 1
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], expected)
    check_reads(daskstream.open_source(path), expected)


# Format 2 records the byte order in the dtype and zarr hands it back unchanged; reads must still be native.
@pytest.mark.parametrize("dtype", [">i4", ">f8", ">c8", "<i4"])
def test_v2_byte_order(tmp_path, dtype):
    path, data = str(tmp_path / "endian.zarr"), values(dtype=dtype)
    zarr.create_array(path, data=data, chunks=(4, 4), zarr_format=2)
    source = daskstream.open_source(path)
    assert source.dtype == np.dtype(dtype).newbyteorder("=")
    check_reads(source, data)
    assert daskstream.open(source).dtype.isnative


def test_v3_big_endian_serializer(tmp_path):
    path, data = str(tmp_path / "endian.zarr"), values(dtype="int32")
    zarr.create_array(path, data=data, chunks=(4, 4), serializer=zarr.codecs.BytesCodec(endian="big"))
    check_reads(daskstream.open_source(path), data)


# Other dtypes zarr stores with a fixed width.
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(values(dtype="int8") % 2 == 0, id="bool"),
        pytest.param(values(dtype="uint64"), id="uint64"),
        pytest.param(values().astype("datetime64[s]"), id="datetime64"),
        pytest.param(values(dtype="float16"), id="float16"),
    ],
)
def test_other_dtypes(tmp_path, zarr_format, data):
    path = str(tmp_path / "typed.zarr")
    zarr.create_array(path, data=data, chunks=(4, 4), zarr_format=zarr_format)
    check_reads(daskstream.open_source(path), zarr.open_array(path, mode="r")[...])


@pytest.mark.parametrize("member", [None, "group/x"], ids=["root", "in-group"])
def test_memory_url(memory_url, member):
    # memory:// lives in this process only, so every read here happens in-process.
    url, data = f"{memory_url}/store.zarr", values()
    store = zarr.storage.FsspecStore.from_url(url, read_only=False)
    if member is None:
        zarr.create_array(store, data=data, chunks=(3, 3))
    else:
        root = zarr.open_group(store, mode="w")
        root.create_array(member, data=data, chunks=(3, 3))
        root.create_array("other", data=np.zeros(2))
    source = daskstream.open_source(url, dataset=member)
    assert source.path == url
    check_reads(source, data)


def test_memory_url_missing_member_lists_arrays(memory_url):
    url = f"{memory_url}/store.zarr"
    root = zarr.open_group(zarr.storage.FsspecStore.from_url(url, read_only=False), mode="w")
    root.create_array("a", data=np.zeros(2))
    root.create_array("g/b", data=np.zeros(2))
    with pytest.raises(MemberNotFoundError) as info:
        daskstream.open_source(url, dataset="nope")
    assert "a, g/b" in str(info.value)


@pytest.fixture
def group_store(tmp_path) -> str:
    """A v3 store whose root group holds two arrays and a subgroup holding a third."""
    path = str(tmp_path / "group.zarr")
    root = zarr.open_group(path, mode="w")
    root.create_array("temperature", data=values(), chunks=(5, 5))
    root.create_array("pressure", data=values(), chunks=(5, 5))
    root.create_group("derived").create_array("anomaly", data=values(), chunks=(5, 5))
    return path


def test_group_without_dataset_lists_arrays(group_store):
    with pytest.raises(MemberNotFoundError) as info:
        daskstream.open_source(group_store)
    assert isinstance(info.value, KeyError)
    message = str(info.value)
    assert "dataset=" in message
    assert "derived/anomaly, pressure, temperature" in message


def test_missing_member_lists_arrays(group_store):
    with pytest.raises(MemberNotFoundError) as info:
        daskstream.open_source(group_store, dataset="humidity")
    message = str(info.value)
    assert "humidity" in message
    assert group_store in message
    assert "derived/anomaly, pressure, temperature" in message


def test_group_named_where_array_expected(group_store):
    with pytest.raises(NotAnArrayError) as info:
        daskstream.open_source(group_store, dataset="derived")
    assert isinstance(info.value, TypeError)
    assert "derived/anomaly" in str(info.value)


def test_directory_without_zarr_metadata(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a store")
    with pytest.raises(NotAZarrStoreError) as info:
        daskstream.open_source(tmp_path / "plain")
    assert isinstance(info.value, UnknownFormatError)
    assert isinstance(info.value, ValueError)
    assert str(tmp_path / "plain") in str(info.value)


def test_zip_holding_zarr_json_is_zarr_whatever_its_name(tmp_path):
    path, data = str(tmp_path / "archive.data"), values()
    store = zarr.storage.ZipStore(path, mode="w")
    try:
        zarr.create_array(store, data=data, chunks=(5, 5))
    finally:
        store.close()
    assert guess_format(path) == "zarr"
    check_reads(daskstream.open_source(path), data)


def test_zip_without_zarr_metadata_is_refused(tmp_path):
    import zipfile

    path = str(tmp_path / "notes.zip")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "no arrays here")
    with pytest.raises(DaskstreamError, match=r"notes\.zip"):
        daskstream.open_source(path)


def test_file_url_is_a_local_path(tmp_path):
    path, data = str(tmp_path / "store.zarr"), values()
    zarr.create_array(path, data=data, chunks=(5, 5))
    source = daskstream.open_source(f"file://{path}")
    assert source.path == path
    assert source.token == daskstream.open_source(path).token
    check_reads(source, data)


def test_token_follows_the_array_found_in_a_group(tmp_path):
    # Opened without a dataset, the token must stamp the array found, not the root group's files,
    # which stay as they were when data is written into the array inside.
    path = str(tmp_path / "store.zarr")
    root = zarr.open_group(path, mode="w", zarr_format=2)
    array = root.create_array("x/y", data=values(), chunks=(5, 5))
    before = daskstream.open_source(path)
    array[...] = values() + 1
    after = daskstream.open_source(path)
    assert after.dataset == before.dataset == "x/y"
    assert after.token != before.token
    assert_same_array(after.read(), values() + 1)


def test_token_follows_chunks_written_into_a_v3_array(tmp_path):
    # Format 3 keeps chunks in nested c/... folders that no metadata file or the array's folder reflects.
    path = str(tmp_path / "store.zarr")
    array = zarr.create_array(path, shape=(10, 9), chunks=(5, 9), dtype="int32", fill_value=0)
    array[...] = 1
    before = daskstream.open_source(path)
    array[5:] = 4
    after = daskstream.open_source(path)
    assert after.token != before.token
    expected = np.ones((10, 9), dtype="int32")
    expected[5:] = 4
    assert_same_array(after.read(), expected)


def test_token_follows_chunks_written_into_a_v2_array(tmp_path):
    # Format 2 keeps chunk files beside .zarray, so new chunks change the array directory's stamp.
    path = str(tmp_path / "store.zarr")
    array = zarr.create_array(path, shape=(10, 9), chunks=(5, 9), dtype="int32", fill_value=0, zarr_format=2)
    before = daskstream.open_source(path)
    array[5:] = 4
    after = daskstream.open_source(path)
    assert after.token != before.token
    expected = np.zeros((10, 9), dtype="int32")
    expected[5:] = 4
    assert_same_array(after.read(), expected)


def test_url_without_a_store(memory_url):
    with pytest.raises(SourceNotFoundError) as info:
        daskstream.open_source(f"{memory_url}/nothing.zarr")
    assert isinstance(info.value, FileNotFoundError)
    assert "memory://" in str(info.value)


# A 0-d array and zero-length axes, where no chunk is ever stored.
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("shape", [(), (0,), (4, 0)], ids=["scalar", "empty", "4x0"])
def test_degenerate_shapes(tmp_path, zarr_format, shape):
    path = str(tmp_path / "degenerate.zarr")
    zarr.create_array(path, shape=shape, dtype="float64", fill_value=1.5, zarr_format=zarr_format)
    expected = np.asarray(zarr.open_array(path, mode="r")[...])
    source = daskstream.open_source(path)
    assert source.shape == shape
    assert_same_array(source.read(), expected)
    assert_same_array(source[...], expected)
    assert_same_array(daskstream.open(source).compute(), expected)


# Fixed-width strings have a numpy dtype of their own; format 2 stores them without codecs of note.
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(np.array([[b"ab", b"c"], [b"", b"xyz"]], dtype="S3"), id="bytes"),
        pytest.param(np.array([["ab", "ü"], ["", "wxyz"]], dtype="<U4"), id="unicode"),
    ],
)
def test_v2_fixed_width_strings(tmp_path, data):
    path = str(tmp_path / "strings.zarr")
    zarr.create_array(path, data=data, chunks=(1, 2), zarr_format=2)
    expected = zarr.open_array(path, mode="r")[...]
    source = daskstream.open_source(path)
    assert_same_array(source.read(), expected)
    assert_same_array(source.read((slice(None, None, -1), 1)), expected[::-1, 1])


# Variable-length strings come back as Python objects (v2) or numpy's StringDType (v3).
def _name_a_codec(path, zarr_format: int, codec: str) -> None:
    """Rewrite the metadata of the array at ``path`` to compress with ``codec``, as another installation wrote it."""
    import json

    if zarr_format == 2:
        metadata = json.loads((path / ".zarray").read_text())
        metadata["compressor"] = {"id": codec}
        (path / ".zarray").write_text(json.dumps(metadata))
    else:
        metadata = json.loads((path / "zarr.json").read_text())
        metadata["codecs"] = [metadata["codecs"][0], {"name": codec, "configuration": {}}]
        (path / "zarr.json").write_text(json.dumps(metadata))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_codec_not_available_here_names_it_and_what_to_install(tmp_path, zarr_format):
    path = tmp_path / "a.zarr"
    zarr.create_array(path, shape=(20,), chunks=(10,), dtype="f8", zarr_format=zarr_format)[:] = np.arange(20.0)
    _name_a_codec(path, zarr_format, "no-such-codec")
    with pytest.raises(
        MissingDependencyError, match="codec 'no-such-codec' is not available in this installation"
    ) as caught:
        daskstream.open_source(path)
    assert isinstance(caught.value, ImportError)
    assert "install the package that provides it" in str(caught.value)
    assert "re-create" not in str(caught.value)  # the store is sound


def test_a_numcodecs_codec_whose_package_is_missing_names_the_package(tmp_path):
    import importlib.util

    if importlib.util.find_spec("pcodec") is not None:
        pytest.skip("pcodec is installed here")
    path = tmp_path / "a.zarr"
    zarr.create_array(path, shape=(20,), chunks=(10,), dtype="f8", zarr_format=2)[:] = np.arange(20.0)
    _name_a_codec(path, 2, "pcodec")
    with pytest.raises(
        MissingDependencyError, match=r"(?i)codec 'pcodec' is not available .*; pip install pcodec, then"
    ):
        daskstream.open_source(path)
