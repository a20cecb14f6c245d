"""``.npy`` files: every header version, order, byte order and dtype numpy writes, and damaged files."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from source_helpers import assert_same_array

import daskstream
from daskstream.errors import CorruptSourceError, DaskstreamError, UnsupportedDtypeError
from daskstream.sources import NpySource

RECORD = np.dtype([("id", "<i4"), ("pos", "<f8", (2,)), ("tag", "S3"), ("é", "<u2")])

# Byte-order-free dtypes have one spelling; the others are written both ways round.
DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "datetime64[ns]",
    "datetime64[D]",
    "timedelta64[s]",
    "S7",
    "U5",
    "record",
]


def as_dtype(name: str) -> np.dtype:
    return RECORD if name == "record" else np.dtype(name)


def with_byteorder(dtype: np.dtype, order: str) -> np.dtype:
    return dtype.newbyteorder(order)


def sample(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct, deterministic values of ``dtype``, including each type's awkward ones."""
    n = int(np.prod(shape))
    i = np.arange(n)
    if dtype.fields:
        out = np.zeros(n, dtype=dtype)
        out["id"] = i - 3
        out["pos"] = np.stack([i * 0.5, -i * 1.25], axis=1)
        out["tag"] = [f"t{k}".encode() for k in i]
        out["é"] = i * 1000
        return out.reshape(shape)
    kind = dtype.kind
    if kind == "b":
        values = i % 3 == 0
    elif kind in "iu":
        info = np.iinfo(dtype)
        i = i.astype(dtype)
        values = np.where(i % 2 == 0, info.min + i, np.asarray(info.max, dtype=dtype) - i)
    elif kind == "f":
        values = (i - n / 2) * 1.5
        if n > 2:
            values[1], values[2] = np.nan, -np.inf
    elif kind == "c":
        values = (i - 1.5) + 1j * (n - i)
    elif kind == "M":
        values = np.datetime64("1969-12-25", "D") + i.astype("timedelta64[D]") * 400
        values[0] = np.datetime64("NaT")
    elif kind == "m":
        values = (i - 2).astype("timedelta64[s]") * 3600
    elif kind == "S":
        values = np.array([(b"s" * (k % 8))[:7] for k in i])
    elif kind == "U":
        values = np.array([f"ü{k}"[:5] for k in i])
    else:
        raise AssertionError(dtype)
    return np.asarray(values).astype(dtype).reshape(shape)


def save(path: str, array: np.ndarray, version: tuple[int, int]) -> str:
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=version, allow_pickle=False)
    return path


def header_version(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        return np.lib.format.read_magic(f)


def matrix():
    for name in DTYPES:
        dtype = as_dtype(name)
        orders = ["little", "big"] if dtype.byteorder != "|" else ["-"]
        for byteorder in orders:
            for version in (1, 2, 3):
                for layout in ("C", "F"):
                    yield pytest.param(name, byteorder, version, layout, id=f"v{version}-{layout}-{byteorder}-{name}")


# Every header version x memory order x byte order x dtype numpy can write without pickling.
@pytest.mark.parametrize(("name", "byteorder", "version", "layout"), list(matrix()))
def test_reads_what_numpy_wrote(tmp_path, name, byteorder, version, layout):
    dtype = as_dtype(name)
    if byteorder != "-":
        dtype = with_byteorder(dtype, "<" if byteorder == "little" else ">")
    data = sample(dtype, (4, 3, 2))
    data = np.asfortranarray(data) if layout == "F" else np.ascontiguousarray(data)
    path = save(str(tmp_path / "a.npy"), data, (version, 0))
    assert header_version(path) == (version, 0)
    expected = np.load(path)

    source = daskstream.open_source(path)
    assert isinstance(source, NpySource)
    assert source.shape == expected.shape
    assert source.fortran_order == (layout == "F")
    assert_same_array(source.read(), expected)
    assert_same_array(source.read((slice(None, None, -1), 1)), expected[::-1, 1])
    assert_same_array(source.read((slice(1, 3), slice(0, 2), 1)), expected[1:3, 0:2, 1])


# The dask path goes through plan + from_array: each dtype once is enough to show it survives.
@pytest.mark.parametrize("name", DTYPES)
def test_open_computes_every_dtype(tmp_path, name):
    data = sample(as_dtype(name).newbyteorder(">"), (5, 4))
    path = save(str(tmp_path / "a.npy"), data, (1, 0))
    assert_same_array(daskstream.open(path).compute(), np.load(path))


def test_version_3_header_with_non_latin1_field_names(tmp_path):
    # Version 3 exists for UTF-8 headers; numpy picks it itself when a field name needs it.
    dtype = np.dtype([("温度", "<f4"), ("ok", "?")])
    data = np.zeros(6, dtype=dtype)
    data["温度"] = np.linspace(-5, 5, 6)
    data["ok"][::2] = True
    path = str(tmp_path / "utf8.npy")
    with pytest.warns(UserWarning, match="format 3.0"):
        np.save(path, data)
    assert header_version(path) == (3, 0)
    assert_same_array(daskstream.open_source(path).read(), np.load(path))


# 0-d arrays have an empty shape tuple in the header and a single element of data.
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(np.array(3.25), id="float64"),
        pytest.param(np.array(-7, dtype=">i8"), id="big-endian-int64"),
        pytest.param(np.array("héllo", dtype="U5"), id="unicode"),
        pytest.param(sample(RECORD, (1,)).reshape(()), id="record"),
    ],
)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_zero_dimensional(tmp_path, value, version):
    path = save(str(tmp_path / "scalar.npy"), value, (version, 0))
    expected = np.load(path)
    source = daskstream.open_source(path)
    assert source.shape == ()
    assert source.size == 1
    assert_same_array(source.read(), expected)
    assert_same_array(source[...], expected)
    assert_same_array(source.read(()), expected)
    assert_same_array(daskstream.open(path).compute(), expected)


# Empty arrays hold no data bytes after the header; reads must not touch the file past its end.
@pytest.mark.parametrize("shape", [(0,), (3, 0, 2)], ids=["0", "3x0x2"])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_empty(tmp_path, shape, layout):
    data = np.zeros(shape, dtype=">f4", order=layout)
    path = save(str(tmp_path / "empty.npy"), data, (1, 0))
    expected = np.load(path)
    source = daskstream.open_source(path)
    assert source.shape == shape
    assert source.nbytes == 0
    assert_same_array(source.read(), expected)
    assert_same_array(source.read(slice(None, None, -1)), expected[::-1])
    assert_same_array(daskstream.open(path).compute(), expected)


class Trap:
    """Unpickling this creates ``marker``: proof that someone unpickled the file's payload."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


# Object arrays are pickles: reading one would run whatever code the file's author chose.
@pytest.mark.parametrize("layout", ["plain", "record-field"])
def test_object_dtype_refused_without_unpickling(tmp_path, layout):
    marker = str(tmp_path / "unpickled")
    if layout == "plain":
        data = np.empty(2, dtype=object)
        data[:] = [Trap(marker), None]
    else:
        data = np.empty(2, dtype=[("x", "<i4"), ("payload", "O")])
        data["payload"] = [Trap(marker), None]
    path = str(tmp_path / "objects.npy")
    np.save(path, data, allow_pickle=True)

    with pytest.raises(UnsupportedDtypeError, match="never unpickles") as info:
        daskstream.open_source(path)
    assert isinstance(info.value, TypeError)
    assert path in str(info.value)
    with pytest.raises(UnsupportedDtypeError):
        daskstream.open(path)
    assert not os.path.exists(marker)

    # The trap is live: numpy itself, allowed to unpickle, springs it.
    np.load(path, allow_pickle=True)
    assert os.path.exists(marker)


def truncate(path: str, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


# Cut at every part of the file: inside the data, right after the header, inside the header.
@pytest.mark.parametrize(
    "keep",
    [
        pytest.param(lambda size, offset: size - 1, id="last-byte-missing"),
        pytest.param(lambda size, offset: offset + (size - offset) // 2, id="half-the-data"),
        pytest.param(lambda size, offset: offset, id="header-only"),
        pytest.param(lambda size, offset: offset // 2, id="half-the-header"),
        pytest.param(lambda size, offset: 9, id="magic-and-version-byte"),
    ],
)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_truncated_file_fails_at_open(tmp_path, keep, version):
    path = save(str(tmp_path / "cut.npy"), np.arange(200, dtype="<f8").reshape(20, 10), (version, 0))
    offset = daskstream.open_source(path).offset
    truncate(path, keep(os.path.getsize(path), offset))

    with pytest.raises(CorruptSourceError) as info:
        daskstream.open_source(path)
    assert path in str(info.value)
    assert isinstance(info.value, OSError)
    with pytest.raises(CorruptSourceError):
        daskstream.open(path)


def npy_file(header: bytes, version: int = 1) -> bytes:
    """A .npy file of ``version`` with ``header`` as its (padded) header and a few data bytes."""
    length_format = "<H" if version == 1 else "<I"
    preamble = 8 + struct.calcsize(length_format)
    header = header + b" " * (-(len(header) + preamble + 1) % 64) + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(length_format, len(header)) + header + bytes(24)


# A file that claims to be .npy by name only, or by magic only.
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"this is not an array\n" * 10, id="text"),
        pytest.param(bytes(range(256)) * 4, id="binary-garbage"),
        pytest.param(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f8',", id="magic-then-broken-header"),
        pytest.param(b"\x93NUMPY\x07\x00" + b" " * 100, id="unknown-version"),
        pytest.param(npy_file(b"{'descr': 'not-a-dtype', 'fortran_order': False, 'shape': (3,), }"), id="bad-dtype"),
        pytest.param(npy_file(b"{'descr': '<f8', 'shape': (3,), }"), id="header-missing-a-key"),
        pytest.param(npy_file(b"{'descr': '<f8', 'fortran_order': False, 'shape': (-3,), }"), id="negative-shape"),
        pytest.param(npy_file(b"__import__('os').getcwd()"), id="header-is-code"),
        pytest.param(npy_file(b"__import__('os').getcwd()", version=3), id="v3-header-is-code"),
        pytest.param(npy_file(b"{'descr': '<f8', 'shape': (3,), }", version=3), id="v3-header-missing-a-key"),
        pytest.param(npy_file(b"{'descr': '<f8', 'fortran_order': 0, 'shape': (3,), }", version=3), id="v3-bad-order"),
        pytest.param(
            npy_file(b"{'descr': '<f8', 'fortran_order': False, 'shape': (-3,), }", 3), id="v3-negative-shape"
        ),
        pytest.param(npy_file("{'descr': '<f8', 'é".encode("latin-1"), version=3), id="v3-header-not-utf8"),
        pytest.param(b"\x93NUMPY\x03\x00\xff\xff\xff\x00{", id="v3-header-length-beyond-file"),
    ],
)
def test_garbage_named_npy(tmp_path, content):
    path = tmp_path / "junk.npy"
    path.write_bytes(content)
    with pytest.raises(CorruptSourceError) as info:
        daskstream.open_source(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, DaskstreamError)


def test_npy_has_no_members(tmp_path):
    path = save(str(tmp_path / "a.npy"), np.arange(3), (1, 0))
    with pytest.raises(KeyError, match="holds one array"):
        daskstream.open_source(path, dataset="x")


def _write_with_header(path, descr, shape, fortran_order, payload: bytes) -> None:
    header = {"descr": descr, "fortran_order": fortran_order, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(payload)


@pytest.mark.parametrize("outer", [(4,), (2, 3), ()])
def test_a_subarray_element_dtype_reads_as_numpys_memory_map_does(tmp_path, outer):
    # np.save never writes this header (numpy folds subarray dtypes), but other writers do.
    values = np.arange(int(np.prod(outer)) * 6, dtype="<f8").reshape(*outer, 2, 3)
    path = tmp_path / "sub.npy"
    _write_with_header(path, ("<f8", (2, 3)), outer, False, values.tobytes())
    expected = np.lib.format.open_memmap(path, mode="r")  # numpy's own reading of such a file
    assert expected.shape == (*outer, 2, 3)
    x = daskstream.open(str(path), chunks="auto")
    assert x.shape == expected.shape
    assert x.dtype == np.float64
    assert_same_array(x.compute(), np.asarray(expected))
    assert float(daskstream.reduce(x, "sum").compute()) == float(values.sum())
    assert_same_array(daskstream.open_source(str(path))[..., 1, :], np.asarray(expected)[..., 1, :])


def test_a_fortran_ordered_subarray_file_is_refused(tmp_path):
    path = tmp_path / "sub_f.npy"
    _write_with_header(path, ("<f8", (3,)), (2, 2), True, np.zeros(12).tobytes())
    with pytest.raises(UnsupportedDtypeError, match="neither C nor Fortran"):
        daskstream.open(str(path))
