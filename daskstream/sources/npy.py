"""``.npy`` files, read without numpy's pickle path and without a lasting memory map."""

from __future__ import annotations

import ast
import os
import struct
import tokenize
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError, UnsupportedDtypeError
from daskstream.files import open_regular
from daskstream.sources.base import Region, Source, checked_element, file_stamp, native, now_ns
from daskstream.sources.contiguous import read_contiguous_box
from daskstream.sources.tokens import source_token

NPY_MAGIC = b"\x93NUMPY"
# The largest header numpy parses without allow_pickle (numpy.lib.format reads no larger by default).
_MAX_HEADER_BYTES = 10000


class NpySource(Source):
    """A ``.npy`` file (format versions 1, 2 and 3).

    Parameters
    ----------
    path
        The file.

    Notes
    -----
    Object dtypes are refused: reading them would unpickle data from the file.
    Big-endian files are read into native byte order.
    """

    format = "npy"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.dataset = None
        self.opened_ns = now_ns()
        self.stamp = file_stamp(self.path)
        size = self.stamp[0]
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
            raise CorruptSourceError(
                f"{self.path}: the .npy file is truncated: its header declares {self.shape} "
                f"{self.dtype} ({expected} bytes with the header) but the file has {size} bytes; "
                "re-create or re-copy the file"
            )
        self.token = source_token(self.format, self.path, *self.stamp)

    def current_stamp(self) -> tuple[int, ...]:
        return file_stamp(self.path)

    def _read_box(self, box: Region) -> np.ndarray:
        return read_contiguous_box(self.path, self.offset, self.file_dtype, self.shape, self.fortran_order, box)

    def describe_storage(self) -> str:
        return f"contiguous {self.layout} order at byte {self.offset}"


def read_npy_header(path: str) -> tuple[int, np.dtype, bool, tuple[int, ...]]:
    """Return ``(data offset, dtype, fortran_order, shape)`` of a .npy file.

    Raises :class:`CorruptSourceError` for a damaged header and
    :class:`UnsupportedDtypeError` for object dtypes, without unpickling anything.
    """
    fmt = np.lib.format
    with open_regular(path) as f:
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
            raise CorruptSourceError(
                f"{path}: not a readable .npy file ({exc}); re-create it with numpy.save"
            ) from None
        offset = f.tell()
    if dtype.hasobject:
        raise UnsupportedDtypeError(
            f"{path}: dtype {dtype} holds Python objects, which daskstream never unpickles; "
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
