"""``.npy`` files, read without numpy's pickle path and without a lasting memory map."""

from __future__ import annotations

import ast
import io
import os
import struct
import tokenize
from typing import Any, BinaryIO

import numpy as np

from daskstream.errors import CorruptSourceError, UnsupportedDtypeError
from daskstream.files import open_regular
from daskstream.sources.base import Region, Source, checked_element, file_stamp, native, now_ns
from daskstream.sources.contiguous import READ_BATCH_BYTES, ObjectBytes, read_contiguous_box
from daskstream.sources.objects.places import Got, Place, is_url
from daskstream.sources.tokens import source_token

NPY_MAGIC = b"\x93NUMPY"
# The largest header numpy parses without allow_pickle (numpy.lib.format reads no larger by default).
_MAX_HEADER_BYTES = 10000


class NpySource(Source):
    """A ``.npy`` file (format versions 1, 2 and 3), on disk or on an object store.

    Parameters
    ----------
    path
        The file, or an fsspec URL of an object (``s3://bucket/a.npy``).
    storage_options
        fsspec options for a URL (endpoint, credentials...). Secrets among
        them stay in this process: see :mod:`daskstream.sources.objects.places`.
    head
        The object's first bytes as :func:`daskstream.sources.detect.probe_url`
        fetched them, which saves opening a URL one request.

    Notes
    -----
    Object dtypes are refused: reading them would unpickle data from the file.
    Big-endian files are read into native byte order.

    On an object store, opening is one ranged GET of the object's first
    :data:`~daskstream.sources.contiguous.HEAD_BYTES` (the header and the
    object's size and version come with it). A read is the ranged GETs its
    bytes need, in parallel; each response's version (ETag) is compared with
    the one seen at open, and the token holds it, so a rewritten object is a
    :class:`~daskstream.errors.SourceChangedError` and gets a new name when
    opened again.
    """

    format = "npy"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        head: Got | None = None,
    ) -> None:
        path = os.fspath(path)
        self.dataset = None
        self.opened_ns = now_ns()
        self.object: ObjectBytes | None = None
        if is_url(path):
            self.path = path
            # The ETag seen now is what every ranged GET is compared with: no stamp to check per read.
            self.object, first = ObjectBytes.open(Place(path, storage_options), path, head)
            size = self.object.size
            self.offset, file_dtype, self.fortran_order, shape = parse_npy_header(io.BytesIO(first), path)
            stamp: tuple[Any, ...] = (size, self.object.version)
        else:
            self.path = os.path.abspath(path)
            self.stamp = stamp = file_stamp(self.path)
            size = stamp[0]
            self.offset, file_dtype, self.fortran_order, shape = read_npy_header(self.path)
        if file_dtype.subdtype is not None and self.fortran_order and len(shape) > 1:
            # Each element's values are together, but the elements run in Fortran order: neither layout.
            raise UnsupportedDtypeError(
                f"{self.path}: a Fortran-ordered array of subarray elements ({file_dtype}) is laid out in "
                "neither C nor Fortran order; save it again with numpy.save(np.ascontiguousarray(a))"
            )
        # A subarray element is read as numpy's memory map reads it: its axes join the array's.
        self.shape, self.file_dtype = checked_element(self.path, shape, file_dtype)
        self.dtype = native(self.file_dtype)
        self.layout = "F" if self.fortran_order and self.ndim > 1 else "C"
        self.storage_chunks = None
        expected = self.offset + self.nbytes
        if size < expected:
            what = "object" if self.object is not None else "file"
            raise CorruptSourceError(
                f"{self.path}: the .npy {what} is truncated: its header declares {self.shape} "
                f"{self.dtype} ({expected} bytes with the header) but the {what} has {size} bytes; "
                f"re-create or re-copy the {what}"
            )
        self.token = source_token(self.format, self.path, *stamp)

    def current_stamp(self) -> tuple[int, ...] | None:
        # An object's version is checked by every ranged GET instead: a stat here would be a request.
        return None if self.object is not None else file_stamp(self.path)

    @property
    def decode_bytes(self) -> int:
        """Parts of an object in flight while a read copies them into its block (nothing for a file)."""
        return 0 if self.object is None else min(READ_BATCH_BYTES, self.nbytes)

    def _read_box(self, box: Region) -> np.ndarray:
        where = self.object if self.object is not None else self.path
        return read_contiguous_box(where, self.offset, self.file_dtype, self.shape, self.fortran_order, box)

    def describe_storage(self) -> str:
        return f"contiguous {self.layout} order at byte {self.offset}"


def read_npy_header(path: str) -> tuple[int, np.dtype, bool, tuple[int, ...]]:
    """Return ``(data offset, dtype, fortran_order, shape)`` of a .npy file.

    Raises :class:`CorruptSourceError` for a damaged header and
    :class:`UnsupportedDtypeError` for object dtypes, without unpickling anything.
    """
    with open_regular(path) as f:
        return parse_npy_header(f, path)


def parse_npy_header(f: BinaryIO, name: str) -> tuple[int, np.dtype, bool, tuple[int, ...]]:
    """:func:`read_npy_header` of the .npy data ``f`` reads from its start (a file, or the first bytes of an object).

    ``name`` is the file's or object's, for errors.

    >>> buffer = io.BytesIO()
    >>> np.save(buffer, np.zeros((2, 3), ">f4"))
    >>> parse_npy_header(io.BytesIO(buffer.getvalue()), "a.npy")
    (128, dtype('>f4'), False, (2, 3))
    """
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        _check_header_length(f, version)
        shape, fortran_order, dtype = _read_header(f, version)
        # numpy's parser lets booleans through as ints, then fails on them when it reads.
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise ValueError(f"shape {shape} is not a tuple of integers")
        if any(n < 0 for n in shape):
            raise ValueError(f"negative dimension in shape {shape}")
    # TokenError: numpy re-tokenizes headers it cannot parse, in case Python 2 wrote them.
    # RecursionError, MemoryError: a header nested or repeated beyond what its parser holds.
    except (
        ValueError,
        EOFError,
        SyntaxError,
        TypeError,
        KeyError,
        RecursionError,
        MemoryError,
        tokenize.TokenError,
    ) as exc:
        raise CorruptSourceError(f"{name}: not a readable .npy file ({exc}); re-create it with numpy.save") from None
    offset = f.tell()
    if dtype.hasobject:
        raise UnsupportedDtypeError(
            f"{name}: dtype {dtype} holds Python objects, which daskstream never unpickles; "
            "save the data with a fixed-width dtype (numbers, 'S'/'U' strings) instead"
        )
    return offset, dtype, bool(fortran_order), tuple(int(n) for n in shape)


def _read_header(f: Any, version: tuple[int, int]) -> tuple[tuple[int, ...], bool, np.dtype]:
    fmt = np.lib.format
    if version == (1, 0):
        return fmt.read_array_header_1_0(f)
    if version == (2, 0):
        return fmt.read_array_header_2_0(f)
    if version == (3, 0):
        # Version 3 is version 2 with a UTF-8 header; numpy exposes no public reader for it.
        return _read_header_3_0(f)
    raise ValueError(f"unknown .npy format version {version}")


def _check_header_length(f: Any, version: tuple[int, int]) -> None:
    """Refuse a header longer than numpy parses before reading it: numpy reads first and checks after."""
    if version not in ((2, 0), (3, 0)):
        return  # version 1 lengths are 2 bytes: at most 64 KiB
    start = f.tell()
    (length,) = struct.unpack("<I", _read_exactly(f, 4))
    if length > _MAX_HEADER_BYTES:
        raise ValueError(f"header of {length} bytes is larger than numpy reads without allow_pickle")
    f.seek(start)


def _read_header_3_0(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Parse a version 3.0 header with the checks numpy applies to versions 1 and 2."""
    (length,) = struct.unpack("<I", _read_exactly(f, 4))
    if length > _MAX_HEADER_BYTES:
        raise ValueError(f"header of {length} bytes is larger than numpy reads without allow_pickle")
    text = _read_exactly(f, length).decode("utf-8")
    header = ast.literal_eval(text)
    if not isinstance(header, dict) or header.keys() != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"header is not a dict of descr, fortran_order and shape: {text.strip()!r}")
    shape, fortran_order = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) for n in shape):
        raise ValueError(f"shape is not a tuple of ints: {shape!r}")
    if not isinstance(fortran_order, bool):
        raise ValueError(f"fortran_order is not a bool: {fortran_order!r}")
    return shape, fortran_order, np.lib.format.descr_to_dtype(header["descr"])


def _read_exactly(f: Any, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError(f"the file ends inside the header ({len(data)} of {n} bytes)")
    return data
