"""Decompressors that never make more than the chunk they decode.

A compressed chunk says how large it will be once decoded (zstd and blosc in
their headers, deflate by running), and a plain decompressor believes it: a
64 KiB zstd chunk claiming 2 GiB allocates 2 GiB before anything checks it.
Every decoder here is told the size the chunk must decode to (``size``) and
refuses, before allocating, a chunk that claims or produces more. Where the
size is only known as a bound (a codec whose output another codec then
reshapes), ``exact=False`` accepts anything up to it.

>>> import numcodecs, numpy as np
>>> frame = numcodecs.Zstd().encode(np.zeros(1000, "u1"))
>>> zstd_decode(frame, 1000).nbytes
1000
>>> zstd_decode(frame, 10)
Traceback (most recent call last):
...
ValueError: the zstd frame claims 1000 bytes where the chunk holds 10
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

# What decoding a damaged chunk raises: the checks here (ValueError), numcodecs' codecs
# (RuntimeError), zlib, bz2, lzma and libdeflate, and cut-short buffers. Anything else is a
# fault in the code, not in the file, and is left to surface as itself.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    RuntimeError,
    EOFError,
    OSError,
    zlib.error,
    struct.error,
    lzma.LZMAError,
)
try:
    from deflate import DeflateError

    DECODE_ERRORS += (DeflateError,)
except ImportError:  # pragma: no cover - deflate is a dependency
    pass

_ZSTD_MAGIC = 0xFD2FB528


def zstd_content_size(data: Any) -> int | None:
    """The decoded size a zstd frame's header declares; ``None`` when it does not say (RFC 8878, 3.1.1.1).

    >>> zstd_content_size(bytes.fromhex("28b52ffd2064") + bytes(5)) == 100
    True
    """
    view = memoryview(data).cast("B")
    if len(view) < 6 or int.from_bytes(view[:4], "little") != _ZSTD_MAGIC:
        raise ValueError("not a zstd frame")
    descriptor = view[4]
    single_segment = (descriptor >> 5) & 1
    size_bytes = {0: single_segment, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
    if size_bytes == 0:
        return None
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    if len(view) < start + size_bytes:
        raise ValueError("the zstd frame header is cut short")
    declared = int.from_bytes(view[start : start + size_bytes], "little")
    return declared + 256 if size_bytes == 2 else declared


# What compressors add at worst to incompressible data: zlib and zstd about 1/256, lz4 1/255,
# bz2 1/100, blosc and lzma a header (their compressBound), plus headers of at most a few hundred bytes.
_HEADER_ALLOWANCE = 64 * 2**10


def largest_encoding(size: int) -> int:
    """The most bytes any compressor daskstream knows stores ``size`` bytes in, headers included.

    What a stored chunk's size is checked against before its bytes are read:
    a chunk index or zip directory claiming more is damaged or forged.

    >>> largest_encoding(2**20)
    1130496
    """
    return size + size // 64 + _HEADER_ALLOWANCE


def _checked(claimed: int | None, size: int, exact: bool, codec: str) -> None:
    if claimed is None:
        return
    if claimed > size or (exact and claimed != size):
        raise ValueError(f"the {codec} frame claims {claimed} bytes where the chunk holds {size}")


def zstd_decode(data: Any, size: int, *, exact: bool = True, into: np.ndarray | None = None) -> np.ndarray:
    """Decode a zstd frame of at most (or, ``exact``, of exactly) ``size`` bytes.

    ``into``: a writable ``uint8`` array of ``size`` bytes to decode into
    (``exact`` only), instead of a new one -- the chunk's place in a block.
    """

    claimed = zstd_content_size(data)
    _checked(claimed, size, exact, "zstd")
    if into is not None and not exact:
        raise ValueError("a zstd frame decodes into a given buffer only where its size is exact")
    out = np.empty(size if claimed is None else claimed, dtype=np.uint8) if into is None else into
    # Given a buffer, numcodecs decompresses into it and refuses a frame that does not fit.
    import numcodecs

    numcodecs.Zstd().decode(data, out=out)
    return out


def blosc_decode(data: Any, size: int, *, exact: bool = True, into: np.ndarray | None = None) -> np.ndarray:
    """Decode a blosc buffer of at most (``exact``: exactly) ``size`` bytes, as its header declares.

    ``into``: a writable ``uint8`` array of ``size`` bytes to decode into (``exact`` only), instead of a new one.
    """

    from numcodecs import blosc

    claimed = _blosc_decoded_size(data)
    _checked(claimed, size, exact, "blosc")
    if into is not None and not exact:
        raise ValueError("a blosc buffer decodes into a given buffer only where its size is exact")
    out = np.empty(int(claimed), dtype=np.uint8) if into is None else into
    blosc.decompress(data, out)
    return out


def _blosc_decoded_size(data: Any) -> int:
    """The decoded size a Blosc frame declares in its 16-byte header (bytes 4 to 8, little-endian).

    Read from the header as the Blosc format documents it (c-blosc's README_HEADER), rather than
    through numcodecs, whose helper for it is private and was renamed between versions.
    """
    header = memoryview(data).cast("B")[:16]
    if len(header) < 16:
        raise ValueError(f"a blosc frame has a 16-byte header; this one has {len(header)} bytes")
    return int(struct.unpack_from("<I", header, 4)[0])


def _streamed(decompressor: Any, data: Any, size: int, exact: bool, codec: str) -> bytes:
    """Run a stream decompressor for at most ``size + 1`` bytes: one more means the chunk is larger."""
    out = decompressor.decompress(bytes(data), size + 1)
    if len(out) > size or (exact and len(out) != size):
        grew = "more than" if len(out) > size else f"{len(out)} bytes, not"
        raise ValueError(f"the {codec} stream decodes to {grew} the {size} bytes the chunk holds")
    return out


def gzip_decode(data: Any, size: int, *, exact: bool = True) -> bytes | bytearray:
    """Decode a gzip stream (numcodecs' and zarr's ``gzip``) of at most ``size`` bytes."""
    if not exact:
        return _streamed(zlib.decompressobj(16 + zlib.MAX_WBITS), data, size, exact, "gzip")
    return _libdeflate("gzip", data, size)


def zlib_decode(data: Any, size: int, *, exact: bool = True) -> bytes | bytearray:
    """Decode a zlib stream (numcodecs' ``zlib``, HDF5's deflate filter) of at most ``size`` bytes."""
    if not exact:
        return _streamed(zlib.decompressobj(), data, size, exact, "zlib")
    return _libdeflate("zlib", data, size)


def _libdeflate(wrapper: str, data: Any, size: int) -> bytes | bytearray:
    """A whole zlib or gzip stream of exactly ``size`` bytes, decoded by libdeflate.

    libdeflate decodes into a buffer of the size given, failing on more, at
    twice zlib's speed; like zlib it reads one gzip member, as numcodecs and
    zarr write them. Without the ``deflate`` package, zlib does it.
    """
    try:
        import deflate
    except ImportError:  # pragma: no cover - deflate is a dependency
        window = zlib.MAX_WBITS + (16 if wrapper == "gzip" else 0)
        return _streamed(zlib.decompressobj(window), data, size, True, wrapper)
    decompress = deflate.gzip_decompress if wrapper == "gzip" else deflate.zlib_decompress
    try:
        out = decompress(data, size)
    except deflate.DeflateError:
        out = None
    if out is None and wrapper == "gzip":
        # Damaged, larger than it must be, or followed by bytes zlib ignores (libdeflate does not): zlib, bounded
        # as above, decodes it or says which, as it always has for gzip.
        return _streamed(zlib.decompressobj(16 + zlib.MAX_WBITS), data, size, True, wrapper)
    if out is None:
        raise ValueError(f"the {wrapper} stream does not decode to the {size} bytes the chunk holds")
    if len(out) != size:
        raise ValueError(f"the {wrapper} stream decodes to {len(out)} bytes, not the {size} bytes the chunk holds")
    return out


def bz2_decode(data: Any, size: int, *, exact: bool = True) -> bytes:
    return _streamed(bz2.BZ2Decompressor(), data, size, exact, "bz2")


def lzma_decode(data: Any, size: int, *, exact: bool = True) -> bytes:
    return _streamed(lzma.LZMADecompressor(), data, size, exact, "lzma")


def lz4_decode(data: Any, size: int, *, exact: bool = True) -> Any:
    """numcodecs' LZ4 stores the decoded size in its first four bytes: checked before decoding."""

    view = memoryview(data).cast("B")
    if len(view) < 4:
        raise ValueError("the lz4 buffer is cut short")
    _checked(int.from_bytes(view[:4], "little"), size, exact, "lz4")
    import numcodecs

    return numcodecs.LZ4().decode(data)


# numcodecs codec ids and the bounded decoder of each.
BY_CODEC_ID: dict[str, Callable[..., Any]] = {
    "zstd": zstd_decode,
    "blosc": blosc_decode,
    "gzip": gzip_decode,
    "zlib": zlib_decode,
    "bz2": bz2_decode,
    "lzma": lzma_decode,
    "lz4": lz4_decode,
}


#: The decoders that can decode into a buffer given (``into=``): a chunk decoded straight into its place.
DECODE_INTO = frozenset({zstd_decode, blosc_decode})


def bounded_decoder(codec: Any) -> Callable[[Any, int, bool], Any] | None:
    """The bounded decoder for a numcodecs codec, or ``None`` when it does not compress (or is not known)."""
    decode = BY_CODEC_ID.get(getattr(codec, "codec_id", ""))  # "": no codec id, so no decoder
    if decode is None:
        return None
    if decode is lzma_decode and getattr(codec, "format", lzma.FORMAT_XZ) not in (lzma.FORMAT_XZ, lzma.FORMAT_AUTO):
        return None  # raw lzma streams need the codec's own filters: decoded by numcodecs
    return lambda data, size, exact: decode(data, size, exact=exact)


__all__ = [
    "BY_CODEC_ID",
    "DECODE_INTO",
    "blosc_decode",
    "bounded_decoder",
    "gzip_decode",
    "largest_encoding",
    "lz4_decode",
    "zlib_decode",
    "zstd_content_size",
    "zstd_decode",
]
