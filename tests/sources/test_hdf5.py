"""HDF5 datasets: every layout and filter h5py writes, how datasets are named, and damaged files."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from source_helpers import assert_same_array

import daskstream
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    MemberNotFoundError,
    NotAnArrayError,
    UnsupportedDtypeError,
)
from daskstream.sources import Hdf5Source, guess_format

# Regions of the (20, 12) test arrays that cross chunk edges, step backwards and drop axes.
REGIONS = [
    pytest.param((), id="all"),
    pytest.param((slice(3, 17), slice(5, 6)), id="across-chunks"),
    pytest.param((slice(None, None, -3), 4), id="reversed-strided"),
    pytest.param((-1, slice(2, None, 2)), id="last-row"),
]


def h5_path(tmp_path, name="data.h5") -> str:
    return str(tmp_path / name)


def h5py_reads(path: str, dataset: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[dataset][()]


def check_reads(path: str, dataset: str | None, expected: np.ndarray) -> Hdf5Source:
    source = daskstream.open_source(path, dataset=dataset)
    assert isinstance(source, Hdf5Source)
    assert_same_array(source.read(), expected)
    for region in (p.values[0] for p in REGIONS):
        if expected.shape == (20, 12):
            assert_same_array(source.read(region), np.asarray(expected[region]))
    assert_same_array(daskstream.open(source).compute(), expected)
    return source


def values(shape=(20, 12), dtype="float64") -> np.ndarray:
    n = int(np.prod(shape))
    return ((np.arange(n) * 7) % 101 - 50).reshape(shape).astype(dtype)


def write_compact(path: str, name: str, data: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple(data.shape)
        dsid = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(data.dtype), space, dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(data))


# The three ways HDF5 lays data out; contiguous data is read without h5py, the others through it.
@pytest.mark.parametrize(
    ("layout", "kind"),
    [("chunked", "chunked"), ("contiguous", "contiguous"), ("compact", "compact")],
    ids=["chunked", "contiguous", "compact"],
)
def test_layouts(tmp_path, layout, kind):
    path, data = h5_path(tmp_path), values()
    if layout == "compact":
        write_compact(path, "x", data)
    else:
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=(7, 5) if layout == "chunked" else None)
    source = check_reads(path, "x", h5py_reads(path, "x"))
    assert source.storage_kind == kind
    assert source.storage_chunks == ((7, 5) if layout == "chunked" else None)
    assert (source.raw_offset is not None) == (layout == "contiguous")


# Lossless filters h5py ships: what comes back must be what went in.
@pytest.mark.parametrize(
    "filters",
    [
        pytest.param({"compression": "gzip", "compression_opts": 9}, id="gzip"),
        pytest.param({"compression": "lzf"}, id="lzf"),
        pytest.param({"shuffle": True}, id="shuffle"),
        pytest.param({"fletcher32": True}, id="fletcher32"),
        pytest.param({"compression": "gzip", "shuffle": True, "fletcher32": True}, id="gzip+shuffle+fletcher32"),
        pytest.param({"scaleoffset": 0}, id="scaleoffset-int"),
    ],
)
def test_lossless_filters(tmp_path, filters):
    path, data = h5_path(tmp_path), values(dtype="int32")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(6, 6), **filters)
    source = check_reads(path, "/x", data)
    assert source.filters


def test_float_scaleoffset_reads_what_h5py_reads(tmp_path):
    # Scale-offset on floats keeps only `scaleoffset` decimal digits: h5py's decoded values are the oracle.
    path, data = h5_path(tmp_path), values() / 7
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(5, 4), scaleoffset=2)
    expected = h5py_reads(path, "x")
    assert not np.array_equal(expected, data)  # the filter really is lossy here
    np.testing.assert_allclose(expected, data, atol=0.01)
    check_reads(path, "x", expected)


# Filters from the hdf5plugin package, which daskstream registers when it is installed.
@pytest.mark.parametrize(
    "make_filter",
    [
        pytest.param(lambda p: p.Blosc(), id="blosc"),
        pytest.param(lambda p: p.Blosc(cname="zstd", clevel=5, shuffle=2), id="blosc-zstd-bitshuffle"),
        pytest.param(lambda p: p.Blosc2(), id="blosc2"),
        pytest.param(lambda p: p.Zstd(), id="zstd"),
        pytest.param(lambda p: p.LZ4(), id="lz4"),
        pytest.param(lambda p: p.Bitshuffle(), id="bitshuffle"),
        pytest.param(lambda p: p.Bitshuffle(cname="lz4"), id="bitshuffle-lz4"),
    ],
)
def test_hdf5plugin_filters(tmp_path, make_filter):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    path, data = h5_path(tmp_path), values(dtype="float32")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(8, 6), **make_filter(hdf5plugin))
    check_reads(path, "x", data)


# HDF5 never stores a chunk nobody wrote; it must read as the fill value, not zeros or garbage.
@pytest.mark.parametrize(
    ("fill", "dtype"),
    [(-7, "int16"), (np.nan, "float64"), (2.5, ">f4")],
    ids=["int", "nan", "big-endian-float"],
)
def test_unwritten_chunks_read_as_fill_value(tmp_path, fill, dtype):
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        dset = f.create_dataset("x", shape=(20, 12), dtype=dtype, chunks=(5, 4), fillvalue=fill)
        dset[5:10, 4:8] = 1
    expected = np.full((20, 12), fill, dtype=dtype)
    expected[5:10, 4:8] = 1
    np.testing.assert_array_equal(h5py_reads(path, "x"), expected)
    check_reads(path, "x", expected)


def test_never_written_contiguous_dataset_reads_as_fill_value(tmp_path):
    # A contiguous dataset gets its storage only on first write: there is no byte offset to read from.
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(6, 4), dtype="int32", fillvalue=42)
    source = check_reads(path, "x", np.full((6, 4), 42, dtype="int32"))
    assert source.raw_offset is None


# Big-endian data: the contiguous path swaps bytes itself, the chunked path lets h5py convert.
@pytest.mark.parametrize("chunks", [None, (4, 5)], ids=["contiguous", "chunked"])
@pytest.mark.parametrize("dtype", [">f8", ">i2", ">c8", ">u8"])
def test_big_endian(tmp_path, chunks, dtype):
    path, data = h5_path(tmp_path), values(dtype=dtype)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=chunks)
    expected = h5py_reads(path, "x")
    source = check_reads(path, "x", data)
    assert source.dtype.isnative
    assert_same_array(source.read(), expected)


# Other dtypes HDF5 maps onto numpy ones: bool (an enum), fixed-width strings, records.
@pytest.mark.parametrize("chunks", [None, (3, 4)], ids=["contiguous", "chunked"])
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(values(dtype="int8") % 3 == 0, id="bool"),
        pytest.param(np.char.add(b"x", values(dtype="int8").astype("S3")), id="fixed-bytes"),
        pytest.param(values(dtype="float16"), id="float16"),
        pytest.param(
            np.rec.fromarrays([values(dtype="int16"), values() / 4], names="a,b").view(np.ndarray), id="record"
        ),
    ],
)
def test_other_dtypes(tmp_path, chunks, data):
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=chunks)
    check_reads(path, "x", h5py_reads(path, "x"))


# Degenerate shapes: a scalar dataset and arrays with a zero-length axis.
@pytest.mark.parametrize(
    ("shape", "chunked"),
    [((), False), ((0,), False), ((0,), True), ((4, 0), False), ((4, 0), True)],
    ids=["scalar", "empty", "empty-chunked", "4x0", "4x0-chunked"],
)
def test_degenerate_shapes(tmp_path, shape, chunked):
    path, data = h5_path(tmp_path), np.full(shape, 3.5)
    with h5py.File(path, "w") as f:
        if chunked:
            # HDF5 only chunks a zero-length axis that may grow.
            f.create_dataset("x", data=data, chunks=(2,) * len(shape), maxshape=(None,) * len(shape))
        else:
            f.create_dataset("x", data=data)
    source = check_reads(path, "x", h5py_reads(path, "x"))
    assert source.shape == shape


@pytest.fixture
def scan(tmp_path) -> tuple[str, np.ndarray]:
    """A file with several datasets in nested groups, as a NeXus file has."""
    path, data = h5_path(tmp_path, "scan.nxs"), values()
    with h5py.File(path, "w") as f:
        f.create_dataset("entry/instrument/detector/data", data=data, chunks=(10, 6))
        f.create_dataset("entry/mask", data=np.ones(12, dtype=bool))
        f.create_dataset("entry/title", data=b"run 7")
    return path, data


# The spellings a user may use for the same dataset.
@pytest.mark.parametrize(
    ("location", "dataset"),
    [
        pytest.param("{path}", "/entry/instrument/detector/data", id="dataset-absolute"),
        pytest.param("{path}", "entry/instrument/detector/data", id="dataset-relative"),
        pytest.param("{path}::/entry/instrument/detector/data", None, id="inline"),
        pytest.param("{path}::/entry/instrument/detector/data", "/entry/instrument/detector/data", id="both-agreeing"),
    ],
)
def test_naming_the_dataset(scan, location, dataset):
    path, data = scan
    source = daskstream.open_source(location.format(path=path), dataset=dataset)
    assert source.path == path
    assert source.dataset == "/entry/instrument/detector/data"
    assert source.name == f"{path}::/entry/instrument/detector/data"
    assert_same_array(source.read(), data)
    assert_same_array(daskstream.open(location.format(path=path), dataset=dataset).compute(), data)


def test_same_dataset_by_any_spelling_has_one_token(scan):
    path, _ = scan
    tokens = {
        daskstream.open_source(path, dataset="/entry/instrument/detector/data").token,
        daskstream.open_source(path, dataset="entry/instrument/detector/data").token,
        daskstream.open_source(f"{path}::/entry/instrument/detector/data").token,
    }
    assert len(tokens) == 1
    assert daskstream.open_source(path, dataset="/entry/mask").token not in tokens


def test_single_dataset_opens_without_naming_it(tmp_path):
    path, data = h5_path(tmp_path), values()
    with h5py.File(path, "w") as f:
        f.create_dataset("deep/inside/only", data=data)
        f.create_group("empty/group")
    source = daskstream.open_source(path)
    assert source.dataset == "/deep/inside/only"
    assert_same_array(source.read(), data)


def test_missing_dataset_lists_what_the_file_has(scan):
    path, _ = scan
    with pytest.raises(MemberNotFoundError) as info:
        daskstream.open_source(path, dataset="/entry/nope")
    assert isinstance(info.value, KeyError)
    message = str(info.value)
    assert "/entry/nope" in message
    assert path in message
    for name in ("/entry/instrument/detector/data", "/entry/mask", "/entry/title"):
        assert name in message


def test_several_datasets_and_none_named_lists_them(scan):
    path, _ = scan
    with pytest.raises(MemberNotFoundError, match="dataset=") as info:
        daskstream.open_source(path)
    assert "/entry/instrument/detector/data" in str(info.value)
    assert "/entry/mask" in str(info.value)


def test_file_without_datasets(tmp_path):
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        f.create_group("nothing/here")
    with pytest.raises(MemberNotFoundError, match="no datasets"):
        daskstream.open_source(path)


def test_group_is_not_an_array(scan):
    path, _ = scan
    with pytest.raises(NotAnArrayError) as info:
        daskstream.open_source(path, dataset="/entry/instrument")
    assert isinstance(info.value, TypeError)
    assert "/entry/instrument/detector/data" in str(info.value)


# Types with no fixed-width numpy equivalent: reading them would give object arrays. (Variable-length
# strings are read, as StringDType: tests/sources/test_strings.py.)
@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(h5py.vlen_dtype(np.int32), id="vlen-int"),
        pytest.param(h5py.ref_dtype, id="object-reference"),
    ],
)
def test_variable_length_dtypes_refused(tmp_path, dtype):
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(3,), dtype=dtype)
    with pytest.raises(UnsupportedDtypeError) as info:
        daskstream.open_source(path, dataset="x")
    assert isinstance(info.value, TypeError)
    assert "x" in str(info.value)


def test_null_dataspace_is_not_an_array(tmp_path):
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        f["x"] = h5py.Empty("f8")
    with pytest.raises(NotAnArrayError, match="null"):
        daskstream.open_source(path, dataset="x")


# A user block pushes the HDF5 signature to byte 512 (or later); contiguous offsets must account for it.
@pytest.mark.parametrize("userblock", [512, 4096])
@pytest.mark.parametrize("chunks", [None, (5, 5)], ids=["contiguous", "chunked"])
def test_userblock(tmp_path, userblock, chunks):
    path, data = h5_path(tmp_path, "with-userblock.bin"), values(dtype=">i4")
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f.create_dataset("x", data=data, chunks=chunks)
    with open(path, "r+b") as f:
        f.write(b"user block text, not HDF5".ljust(userblock, b"\0"))
    assert guess_format(path) == "hdf5"
    check_reads(path, None, data)


# Cut the file short in its superblock, its metadata and its data.
@pytest.mark.parametrize("keep", [0.99, 0.5, 0.02], ids=["last-percent", "half", "superblock-only"])
@pytest.mark.parametrize("chunks", [None, (4, 4)], ids=["contiguous", "chunked"])
def test_truncated_file(tmp_path, keep, chunks):
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values((64, 64)), chunks=chunks)
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))

    with pytest.raises(DaskstreamError) as info:
        daskstream.open_source(path, dataset="x")
    assert type(info.value) is CorruptSourceError
    assert path in str(info.value)


def test_corrupted_chunk_is_reported_as_ours(tmp_path):
    # fletcher32 lets HDF5 notice a flipped byte in a chunk; the error must name the source and region.
    path = h5_path(tmp_path)
    with h5py.File(path, "w") as f:
        dset = f.create_dataset("x", data=values(), chunks=(20, 12), fletcher32=True)
        offset = dset.id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset + 10)
        f.write(b"\xff\x00\xff")
    source = daskstream.open_source(path, dataset="x")
    with pytest.raises(CorruptSourceError) as info:
        source.read()
    assert path in str(info.value)


# Datasets reached through links, or whose data lives outside the file's own dataset storage.
@pytest.mark.parametrize("chunks", [None, (4, 4)], ids=["contiguous", "chunked"])
def test_soft_and_external_links(tmp_path, chunks):
    data, own = values(), np.ones(5)
    other = h5_path(tmp_path, "other.h5")
    with h5py.File(other, "w") as f:
        f["padding"] = np.zeros(3000)  # so the linked data sits past the end of the linking file
        f.create_dataset("target", data=data, chunks=chunks)
    path = h5_path(tmp_path, "links.h5")
    with h5py.File(path, "w") as f:
        f["group/own"] = own
        f["alias"] = h5py.SoftLink("/group/own")
        f["linked"] = h5py.ExternalLink("other.h5", "/target")

    alias = check_reads(path, "alias", own)
    assert alias.dataset == "/alias"
    linked = check_reads(path, "linked", data)
    assert linked.dataset == "/linked"
    assert linked.name == f"{path}::/linked"


def test_external_raw_storage(tmp_path):
    # Raw data in a separate flat file: its offsets are not offsets into the HDF5 file.
    path, data = h5_path(tmp_path), values()
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, external=[(str(tmp_path / "raw.bin"), 0, h5py.h5f.UNLIMITED)])
    source = check_reads(path, "x", data)
    assert source.raw_offset is None


def test_virtual_dataset(tmp_path):
    source_file = h5_path(tmp_path, "parts.h5")
    parts = values((2, 12))
    with h5py.File(source_file, "w") as f:
        f["row0"], f["row1"] = parts[0], parts[1]
    layout = h5py.VirtualLayout(shape=(20, 12), dtype="float64")
    layout[3] = h5py.VirtualSource(source_file, "row0", shape=(12,))
    layout[17] = h5py.VirtualSource(source_file, "row1", shape=(12,))
    path = h5_path(tmp_path, "virtual.h5")
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    expected = np.full((20, 12), -1.0)
    expected[3], expected[17] = parts
    np.testing.assert_array_equal(h5py_reads(path, "v"), expected)
    source = check_reads(path, "v", expected)
    assert source.storage_kind == "virtual"
    assert "virtual" in source.describe_storage()


def test_an_array_element_type_reads_as_h5py_reads_it(tmp_path):
    # H5T_ARRAY elements: h5py returns them as trailing axes.
    element = np.dtype(("<f8", (3,)))
    values = np.arange(24.0).reshape(8, 3)
    path = tmp_path / "arr.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", shape=(8,), dtype=element, chunks=(4,))[...] = values
    with h5py.File(path, "r") as f:
        expected = f["a"][...]
    assert daskstream.open_source(f"{path}::a").storage_chunks == (4, 3)
    x = daskstream.open(f"{path}::a", chunks=(4, 3))
    assert x.shape == (8, 3)
    assert x.dtype == np.float64
    assert_same_array(x.compute(), expected)
    assert_same_array(daskstream.open_source(f"{path}::a")[2:7, 1:], expected[2:7, 1:])


_WITHOUT_HDF5PLUGIN = """
import json, sys
sys.modules["hdf5plugin"] = None  # installed, but not loaded: its filters are not registered
import numpy as np
import daskstream as ds
from daskstream.errors import DaskstreamError

path = sys.argv[1]
outcome = {}
for dataset, region in (("zstd", None), ("bitshuffle", None), ("mixed", slice(0, 10)), ("mixed", slice(10, 20))):
    try:
        source = ds.open_source(path, dataset=dataset)
        outcome[f"{dataset}{'' if region is None else region.start}"] = float(source.read((region or slice(None),)).sum())
    except DaskstreamError as exc:
        outcome[f"{dataset}{'' if region is None else region.start}"] = [type(exc).__name__, isinstance(exc, ImportError), str(exc)]
print(json.dumps(outcome))
"""


def test_a_plugin_filter_without_its_plugin_names_the_filter_and_what_to_install(tmp_path):
    import json
    import subprocess
    import sys

    hdf5plugin = pytest.importorskip("hdf5plugin")
    values = np.arange(20, dtype="f8")
    path = tmp_path / "plugins.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("zstd", data=values, chunks=(10,), **hdf5plugin.Zstd())
        f.create_dataset("bitshuffle", data=values, chunks=(10,), **hdf5plugin.Bitshuffle())
        # The first chunk stored without the filter (its mask says skipped, as a writer without the
        # plugin leaves it), the second through it: only a read of the second needs the plugin.
        mixed = f.create_dataset("mixed", shape=(20,), dtype="f8", chunks=(10,), **hdf5plugin.Bitshuffle())
        mixed[10:] = values[10:]
        mixed.id.write_direct_chunk((0,), values[:10].tobytes(), filter_mask=1)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["mixed"][...], values)  # the file is sound

    done = subprocess.run([sys.executable, "-c", _WITHOUT_HDF5PLUGIN, str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["zstd"] == values.sum()  # zstd daskstream decodes itself
    assert outcome["mixed0"] == values[:10].sum()
    for key in ("bitshuffle", "mixed10"):
        kind, is_import_error, message = outcome[key]
        assert (kind, is_import_error) == ("MissingDependencyError", True), outcome[key]
        assert "decoding its HDF5 filter 'bitshuffle' (id 32008) needs hdf5plugin>=" in message
        assert "pip install 'daskstream[hdf5plugin]'" in message
        assert "damaged" not in message


def test_an_optional_filter_no_chunk_went_through_reads_without_it(tmp_path):
    # HDF5 skips an optional filter it does not have on write; the file reads without it.
    path = tmp_path / "skipped.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(100.0), chunks=(10,), compression=32999, allow_unknown_filter=True)
    np.testing.assert_array_equal(daskstream.open(f"{path}::x").compute(), h5py_reads(path, "x"))
