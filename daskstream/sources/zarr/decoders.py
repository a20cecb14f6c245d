"""How a Zarr array's chunk (or shard) files decode here: codecs undone by numcodecs, each bounded.

A decoder gives a box of a chunk as an array, or writes a whole chunk
straight into its place in a block (:meth:`ChunkDecoder.into`). Every
decompressor is told the size it must give
(:mod:`daskstream.sources.bounded`). A codec or layout not decoded here
raises :class:`NotDecodedHere`: zarr decodes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import google_crc32c
import numpy as np

from daskstream.sources.base import Region
from daskstream.sources.bounded import BY_CODEC_ID, DECODE_INTO, blosc_decode, bounded_decoder, gzip_decode, zstd_decode
from daskstream.sources.zarr.bounds import is_bytes_to_bytes, largest_v3_chunk
from daskstream.sources.zarr.shards import ShardLayout


class NotDecodedHere(Exception):
    """A codec or layout this module leaves to zarr."""


class ChunkDecoder:
    """How one array's chunk files decode: a box of a chunk as an array, or a whole chunk into its place.

    Decoding a whole chunk straight into the block that holds it saves a copy
    of every chunk and the memory traffic of a buffer per chunk: measured on
    4 MiB zstd chunks summed in two threads, the copy was the largest cost
    after the decompression itself.

    Parameters
    ----------
    box
        ``box(file bytes, box inside the chunk, fill) -> array of that box``.
    shape, dtype
        The chunk's shape and stored values, which a place must have to be decoded into.
    unwrap
        The chunk file's codecs undone, able to decode into a buffer
        (:meth:`Unwrap.into`); ``None`` where the chunk is never decoded into a place.
    """

    def __init__(
        self,
        box: Callable[[Any, Region, Any], np.ndarray],
        shape: tuple[int, ...] = (),
        dtype: np.dtype | None = None,
        unwrap: Unwrap | None = None,
    ) -> None:
        self.box = box
        self.into = in_place(unwrap, shape, dtype)

    def __call__(self, data: Any, inside: Region, fill: Any) -> np.ndarray:
        return self.box(data, inside, fill)


def in_place(
    unwrap: Unwrap | None, shape: tuple[int, ...], dtype: np.dtype | None
) -> Callable[[Any, np.ndarray], bool]:
    """``into(file bytes, place)``: decode a whole chunk (of ``shape`` and stored ``dtype``) into ``place``,
    ``False`` with nothing done where ``unwrap`` cannot or ``place`` is not the chunk's shape and dtype in one
    C-ordered run of writable memory. A place of the chunk's shape is the whole chunk's."""

    def into(data: Any, place: np.ndarray) -> bool:
        if (
            unwrap is None
            or not unwrap.decodes_into
            or place.shape != shape
            or place.dtype != dtype
            or not place.flags.c_contiguous
            or not place.flags.writeable
        ):
            return False
        unwrap.into(data, place.reshape(-1).view(np.uint8))
        return True

    return into


# --- format 2 -------------------------------------------------------------------------------------


def v2_decoder(metadata: Any) -> ChunkDecoder:
    """``decode(chunk file, box inside the chunk, fill)`` for a format 2 array; :class:`NotDecodedHere` when
    zarr must decode it."""
    dtype = np.dtype(metadata.dtype.to_native_dtype())
    if dtype.hasobject:
        raise NotDecodedHere
    compressor, filters = metadata.compressor, tuple(metadata.filters or ())
    shape, order = tuple(metadata.chunks), metadata.order
    nbytes = math.prod(shape) * dtype.itemsize
    bounded = bounded_decoder(compressor) if compressor is not None else None
    if compressor is not None and bounded is None and not declares_no_growth(compressor):
        raise NotDecodedHere  # a codec that could expand a chunk past its size unchecked: zarr's

    def decompress(data: bytes) -> Any:
        if bounded is None:
            return compressor.decode(data)
        # Filters may store the chunk in another dtype: then its size is only bounded.
        return bounded(data, nbytes if not filters else _FILTERED_BOUND * nbytes + 65536, not filters)

    # A filter may be a compressor too: each is bounded as the compressor is.
    unfilter = [_v2_filter_step(codec, _FILTERED_BOUND * nbytes + 65536) for codec in reversed(filters)]

    def decode(data: bytes, inside: Region, fill: Any) -> np.ndarray:
        buffer: Any = decompress(data) if compressor is not None else data
        for step in unfilter:
            buffer = step(buffer)
        chunk = np.frombuffer(buffer, dtype=np.uint8).view(dtype).reshape(shape, order=order)
        return chunk[inside]

    # A chunk stored in C order through its compressor alone decodes into its place as it is.
    direct = BY_CODEC_ID.get(getattr(compressor, "codec_id", ""))
    if not filters and order == "C" and bounded is not None and direct in DECODE_INTO:
        return ChunkDecoder(decode, shape, dtype, Unwrap((), direct, nbytes))
    return ChunkDecoder(decode)


# numcodecs filters whose output is their input reordered, retyped or repacked: at most 8 times its size.
_RESHAPING_FILTERS = frozenset({"delta", "fixedscaleoffset", "quantize", "bitround", "astype", "packbits"})


def _v2_filter_step(codec: Any, size: int) -> Callable[[Any], Any]:
    """Undo one format 2 filter: a compressor within ``size`` bytes, a filter that cannot grow past a
    multiple of its input as numcodecs does; any other is left to zarr."""
    bounded = bounded_decoder(codec)
    if bounded is not None:
        return lambda data: bounded(data, size, False)
    if declares_no_growth(codec) or getattr(codec, "codec_id", None) in _RESHAPING_FILTERS:
        return codec.decode
    raise NotDecodedHere


# --- format 3 -------------------------------------------------------------------------------------


def v3_decoder(codecs: tuple, chunk_shape: tuple[int, ...], metadata: Any) -> ChunkDecoder:
    """``decode(chunk or shard file, box inside it, fill)`` for a format 3 array; :class:`NotDecodedHere`
    when zarr must decode it."""
    from zarr.codecs import BytesCodec, ShardingCodec

    *array_codecs, to_bytes = [c for c in codecs if not is_bytes_to_bytes(c)]
    if array_codecs:
        raise NotDecodedHere  # transpose and other array-to-array codecs: zarr's
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    nbytes = math.prod(chunk_shape) * max(dtype.itemsize, 1)
    if isinstance(to_bytes, ShardingCodec):
        # A shard holds its inner chunks (each compressed) and an index: its size is only bounded.
        unwrap = _bytes_steps([c for c in codecs if is_bytes_to_bytes(c)], _FILTERED_BOUND * nbytes + 65536, False)
        return _shard_decoder(to_bytes, chunk_shape, unwrap, metadata)
    if not isinstance(to_bytes, BytesCodec):
        raise NotDecodedHere
    unwrap = _bytes_steps([c for c in codecs if is_bytes_to_bytes(c)], nbytes, True)
    dtype = _v3_dtype(metadata, to_bytes)

    def decode(data: bytes, inside: Region, fill: Any) -> np.ndarray:
        chunk = np.frombuffer(unwrap(data), dtype=dtype).reshape(chunk_shape)
        return chunk[inside]

    return ChunkDecoder(decode, chunk_shape, dtype, unwrap)


def _shard_decoder(
    sharding: Any, shard_shape: tuple[int, ...], unwrap: Callable[[Any], Any], metadata: Any
) -> ChunkDecoder:
    layout = shard_layout(sharding, shard_shape, metadata)

    def decode(data: bytes, inside: Region, fill: Any) -> np.ndarray:
        out = np.empty(tuple(s.stop - s.start for s in inside), dtype=layout.dtype)
        layout.read_whole(unwrap(data), inside, out, fill)
        return out

    return ChunkDecoder(decode)


def shard_layout_of(codecs: tuple, shard_shape: tuple[int, ...], metadata: Any) -> ShardLayout | None:
    """The layout of a sharded array's shards when their files are its inner chunks and index as they are
    (``None`` unsharded, or with a codec around the whole shard); :class:`NotDecodedHere` when zarr must decode
    them."""
    from zarr.codecs import ShardingCodec

    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    return shard_layout(codecs[0], shard_shape, metadata)


def shard_layout(sharding: Any, shard_shape: tuple[int, ...], metadata: Any) -> ShardLayout:
    """Where a shard of ``sharding`` keeps its index and inner chunks, and how they decode."""
    from zarr.codecs import BytesCodec, ShardingCodecIndexLocation

    inner_shape = tuple(sharding.chunk_shape)
    per_shard = tuple(s // c for s, c in zip(shard_shape, inner_shape))
    inner_to_bytes = [c for c in sharding.codecs if not is_bytes_to_bytes(c)]
    if len(inner_to_bytes) != 1 or not isinstance(inner_to_bytes[0], BytesCodec):
        raise NotDecodedHere  # nested shards, transposes: zarr's
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    inner_bytes = math.prod(inner_shape) * max(dtype.itemsize, 1)
    inner_codecs = [c for c in sharding.codecs if is_bytes_to_bytes(c)]
    index_codecs = list(sharding.index_codecs)
    if not isinstance(index_codecs[0], BytesCodec):
        raise NotDecodedHere
    checksums = sum(type(c).__name__ == "Crc32cCodec" for c in index_codecs[1:])
    endian = index_codecs[0].endian
    inner_unwrap = _bytes_steps(inner_codecs, inner_bytes, True)
    inner_dtype = _v3_dtype(metadata, inner_to_bytes[0])
    return ShardLayout(
        inner_shape=inner_shape,
        per_shard=per_shard,
        index_size=16 * math.prod(per_shard) + 4 * checksums,
        at_end=sharding.index_location == ShardingCodecIndexLocation.end,
        index_unwrap=_bytes_steps(index_codecs[1:], 16 * math.prod(per_shard), True),
        index_dtype=np.dtype("<u8" if endian is None or endian.value == "little" else ">u8"),
        inner_unwrap=inner_unwrap,
        dtype=inner_dtype,
        largest_inner=largest_v3_chunk(tuple(sharding.codecs), inner_shape, dtype),
        inner_into=in_place(inner_unwrap, inner_shape, inner_dtype),
    )


def _v3_dtype(metadata: Any, to_bytes: Any) -> np.dtype:
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    if dtype.hasobject or dtype.itemsize == 0:
        raise NotDecodedHere
    if to_bytes.endian is not None and dtype.itemsize > 1:
        dtype = dtype.newbyteorder("<" if to_bytes.endian.value == "little" else ">")
    return dtype


def _bytes_steps(codecs: list, size: int, exact: bool) -> Unwrap:
    """Undo bytes-to-bytes codecs, last applied first, with decoders bounded by the ``size`` they must give.

    A checksum adds 4 bytes: a compressor that decodes to the checksummed
    bytes must give ``size`` plus 4 for each checksum undone after it.
    """
    undo = list(reversed(codecs))
    steps = []
    for position, codec in enumerate(undo):
        checksums = sum(type(c).__name__ == "Crc32cCodec" for c in undo[position + 1 :])
        steps.append(numcodecs_step(codec, size + 4 * checksums, exact))
    # The last codec undone makes the chunk's own bytes: a compressor that decodes into a buffer given can
    # write them into the chunk's place.
    last = _DIRECT.get(type(undo[-1]).__name__) if undo and exact else None
    return Unwrap(tuple(steps[:-1]), last, size) if last is not None else Unwrap(tuple(steps))


class Unwrap:
    """Bytes-to-bytes codecs undone in turn; where the last is a compressor that decodes into a buffer given
    (``last``), it can write the chunk's ``size`` bytes into its place (:meth:`into`)."""

    def __init__(self, steps: tuple[Callable[[Any], Any], ...], last: Any = None, size: int = 0) -> None:
        self.steps, self.last, self.size = steps, last, size

    @property
    def decodes_into(self) -> bool:
        return self.last is not None

    def __call__(self, data: Any) -> Any:
        for step in self.steps:
            data = step(data)
        return data if self.last is None else self.last(data, self.size)

    def into(self, data: Any, buffer: np.ndarray) -> None:
        """Decode into ``buffer`` (``uint8``, ``size`` bytes)."""
        for step in self.steps:
            data = step(data)
        self.last(data, self.size, into=buffer)


# Compressors (zarr's codec classes) whose bounded decoders decode into a buffer given.
_DIRECT: dict[str, Callable[..., np.ndarray]] = {"ZstdCodec": zstd_decode, "BloscCodec": blosc_decode}


# A chunk stored through filters (or a shard of compressed inner chunks) decodes to at most this many
# times its array bytes, plus 64 KiB of headers: the bound given to its decompressor.
_FILTERED_BOUND = 2


def declares_no_growth(codec: Any) -> bool:
    """Codecs that do not decompress (checksums, byte shuffles), so a chunk cannot grow through them."""
    return getattr(codec, "codec_id", None) in (
        "crc32",
        "crc32c",
        "adler32",
        "fletcher32",
        "jenkins_lookup3",
        "shuffle",
    )


def numcodecs_step(codec: Any, size: int, exact: bool) -> Callable[[Any], Any]:
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    if isinstance(codec, ZstdCodec):
        return lambda data: zstd_decode(data, size, exact=exact)
    if isinstance(codec, BloscCodec):
        return lambda data: blosc_decode(data, size, exact=exact)
    if isinstance(codec, GzipCodec):
        return lambda data: gzip_decode(data, size, exact=exact)
    if isinstance(codec, Crc32cCodec):
        return _checked_crc32c
    raise NotDecodedHere


def _checked_crc32c(data: Any) -> np.ndarray:
    """The bytes before a crc32c checksum (Zarr's ``crc32c`` codec), once they match it.

    The checksum is computed by ``google_crc32c``, the library zarr itself checks it with, so reading
    needs nothing zarr does not install (numcodecs' CRC32C exists only beside a separate crc32c package
    in some numcodecs releases).
    """
    # As a numpy array: google_crc32c takes one whether or not its memory is writable, a memoryview not.
    view = np.frombuffer(data, dtype=np.uint8)
    if len(view) < 4:
        raise ValueError(f"{len(view)} byte(s) cannot hold a crc32c checksum (4 bytes)")
    body, stored = view[:-4], int.from_bytes(view[-4:].tobytes(), "little")
    computed = google_crc32c.value(body)
    if computed != stored:
        raise ValueError(f"stored crc32c checksum {stored:#010x} does not match the data's {computed:#010x}")
    return body
