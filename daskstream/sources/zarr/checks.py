"""Chunks zarr-python decodes itself, checked first within the bounds daskstream's own decoders keep.

Where daskstream does not decode an array (its codecs or dtype are zarr's to
decode: transposes, numcodecs' array filters, variable-length strings...),
zarr reads it through :func:`checked_store`: each chunk zarr fetches is first
undone here through the codecs that decompress, every decoder told the most
it may make (:mod:`daskstream.sources.zarr.bounds`), and a variable-length
codec's count of items compared with the chunk's, so a chunk that claims or
makes more is refused before zarr allocates for it. Over a zip file the same
store reads every member itself, within the sizes each may hold
(:mod:`daskstream.sources.zip_members`), metadata documents included.
"""

from __future__ import annotations

import functools
import math
import posixpath
from collections.abc import Callable
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.sources.bounded import DECODE_ERRORS, bounded_decoder
from daskstream.sources.zarr.bounds import (
    decoded_chunk_bytes,
    is_bytes_to_bytes,
    largest_chunk_file,
    largest_v3_chunk,
    reshaped_growth,
)
from daskstream.sources.zarr.decoders import (
    NotDecodedHere,
    declares_no_growth,
    numcodecs_step,
    v2_decoder,
    v3_decoder,
)
from daskstream.sources.zarr.shards import EMPTY
from daskstream.sources.zip_members import ZipMembers


def _check_step(codec: Any, size: int) -> Callable[[Any], Any] | None:
    """How to undo one bytes-to-bytes codec within ``size`` bytes, to check a chunk; ``None`` when it is
    not known here (the check stops there)."""
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    if isinstance(codec, (ZstdCodec, BloscCodec, GzipCodec, Crc32cCodec)):
        return numcodecs_step(codec, size, False)
    config = getattr(codec, "codec_config", None)  # zarr's wrappers of numcodecs codecs ("numcodecs.zlib"...)
    if isinstance(config, dict):
        import numcodecs

        try:
            codec = numcodecs.get_codec(dict(config))
        except (ValueError, TypeError, KeyError, ImportError):
            return None
    bounded = bounded_decoder(codec)
    if bounded is not None:
        return lambda data: bounded(data, size, False)
    if declares_no_growth(codec):
        return codec.decode
    return None


def _is_vlen(codec: Any) -> bool:
    """Whether ``codec`` is one of zarr's or numcodecs' variable-length codecs (strings, bytes, arrays)."""
    name = getattr(codec, "codec_id", None) or type(codec).__name__
    return name in ("vlen-utf8", "vlen-bytes", "vlen-array", "VLenUTF8Codec", "VLenBytesCodec")


def _vlen_count_check(codec: Any, elements: int) -> Callable[[Any], Any] | None:
    """For a variable-length codec: the count of items its header declares, checked against the chunk's
    before numcodecs allocates that many."""
    if not _is_vlen(codec):
        return None

    def check(data: Any) -> None:
        view = memoryview(data).cast("B")
        count = int.from_bytes(view[:4], "little") if len(view) >= 4 else -1
        if count != elements:
            raise ValueError(
                f"the chunk's header declares {count} variable-length items where the chunk holds {elements}"
            )

    return check


class _ChunkCheck:
    """Undo, within bounds, the codecs of a chunk that decompress, stopping at the first not known here.

    ``steps`` undo the codecs last applied first; ``then`` checks what they
    leave (a variable-length codec's count), when every step was known.
    """

    def __init__(self, steps: list[Callable[[Any], Any] | None], then: Callable[[Any], Any] | None = None) -> None:
        self.steps = steps
        self.then = then

    def __call__(self, data: Any) -> Any:
        for step in self.steps:
            if step is None:
                return None
            data = step(data)
        if self.then is not None:
            self.then(data)
        return data


def chunk_check_for(array: Any) -> Callable[[Any, Any], None]:
    """What each chunk zarr fetches for ``array`` is checked with before zarr decodes it.

    ``check(chunk bytes, byte range or None)``: undoes the codecs that
    decompress within the bounds :func:`decoded_chunk_bytes` sets, checks a
    variable-length codec's count of items, and for a shard, every inner chunk
    its index places (or the inner chunk a ranged read fetches). Raises the
    codec's error (``ValueError``...) for a chunk that claims or makes more.
    """
    metadata = array.metadata
    if metadata.zarr_format == 2:
        shape = tuple(metadata.chunks)
        dtype = np.dtype(metadata.dtype.to_native_dtype())
        size = decoded_chunk_bytes(shape, dtype) * reshaped_growth(dtype, bool(metadata.filters))
        # Undone as zarr does: the compressor, then the filters last applied first, down to a vlen codec.
        undo = ([metadata.compressor] if metadata.compressor is not None else []) + list(
            reversed(metadata.filters or ())
        )
        vlen = next((c for c in undo if _is_vlen(c)), None)
        known = undo[: undo.index(vlen)] if vlen is not None else undo
        return _whole_chunk(
            _ChunkCheck([_check_step(c, size) for c in known], _vlen_count_check(vlen, math.prod(shape)))
        )
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    return _v3_chunk_check(tuple(metadata.codecs), tuple(metadata.chunk_grid.chunk_shape), dtype)


def _v3_chunk_check(codecs: tuple, shape: tuple[int, ...], dtype: np.dtype) -> Callable[[Any, Any], None]:
    from zarr.codecs import BytesCodec, ShardingCodec

    bytes_codecs = [c for c in codecs if is_bytes_to_bytes(c)]
    to_bytes = next((c for c in codecs if not is_bytes_to_bytes(c) and not _is_array_to_array(c)), None)
    reshaped = any(not is_bytes_to_bytes(c) and not isinstance(c, BytesCodec) for c in codecs)
    if isinstance(to_bytes, ShardingCodec):
        size = largest_v3_chunk(codecs, shape, dtype)
        outer = _ChunkCheck([_check_step(c, size) for c in reversed(bytes_codecs)])
        return _shard_check(to_bytes, shape, dtype, outer)
    size = decoded_chunk_bytes(shape, dtype) * reshaped_growth(dtype, reshaped)
    steps = [_check_step(c, size) for c in reversed(bytes_codecs)]
    return _whole_chunk(_ChunkCheck(steps, _vlen_count_check(to_bytes, math.prod(shape))))


def _whole_chunk(check: _ChunkCheck) -> Callable[[Any, Any], None]:
    """A check of chunks fetched whole (of an array not sharded): a byte range is none of its reads."""

    def checked(data: Any, byte_range: Any) -> None:
        check(data)

    return checked


def _shard_check(
    sharding: Any, shape: tuple[int, ...], dtype: np.dtype, outer: _ChunkCheck
) -> Callable[[Any, Any], None]:
    from zarr.codecs import BytesCodec, ShardingCodecIndexLocation

    inner_shape = tuple(sharding.chunk_shape)
    per_shard = tuple(-(-s // c) for s, c in zip(shape, inner_shape))
    inner = _v3_chunk_check(tuple(sharding.codecs), inner_shape, dtype)
    index_codecs = list(sharding.index_codecs)
    checksums = sum(type(c).__name__ == "Crc32cCodec" for c in index_codecs[1:])
    index_size = 16 * math.prod(per_shard) + 4 * checksums
    plain_index = isinstance(index_codecs[0], BytesCodec) and all(
        type(c).__name__ == "Crc32cCodec" for c in index_codecs[1:]
    )
    at_end = sharding.index_location == ShardingCodecIndexLocation.end
    little = index_codecs[0].endian is None or index_codecs[0].endian.value == "little" if plain_index else True

    def check(data: Any, byte_range: Any) -> None:
        view = memoryview(data).cast("B")
        if byte_range is not None:
            if len(view) != index_size:
                inner(view, None)  # zarr fetches one inner chunk: checked as one
            return
        shard = outer(view)
        if shard is None or not plain_index or len(shard) < index_size:
            return  # a shard whose outer codecs or index are not known here: zarr's own reading checks it
        shard = memoryview(shard).cast("B")
        raw_index = shard[len(shard) - index_size :] if at_end else shard[:index_size]
        index = np.frombuffer(raw_index[: 16 * math.prod(per_shard)], dtype="<u8" if little else ">u8").reshape(-1, 2)
        for offset, nbytes in index:
            if offset == EMPTY and nbytes == EMPTY:
                continue
            if int(offset) + int(nbytes) > len(shard):
                raise ValueError(
                    f"the shard's index places {nbytes} bytes at byte {offset}, past its {len(shard)} bytes"
                )
            inner(shard[int(offset) : int(offset) + int(nbytes)], None)

    return check


def _is_array_to_array(codec: Any) -> bool:
    from zarr.abc.codec import ArrayArrayCodec

    return isinstance(codec, ArrayArrayCodec)


# Metadata documents: read within the metadata limit, and never checked as chunks.
_METADATA_KEYS = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})


def checked_store(store: Any, members: ZipMembers | None = None, metadata_limit: int = 64 * 2**20) -> Any:
    """``store`` as zarr reads it, with every chunk's size and codecs checked before zarr decodes it.

    A zarr ``WrapperStore`` over ``store``. Over a zip file (``members``
    given), every member is read by
    :class:`~daskstream.sources.zip_members.ZipMembers` instead of zarr's
    :mod:`zipfile` reads, metadata documents within ``metadata_limit`` bytes
    and chunks within :func:`largest_chunk_file`. Once the array is open,
    :func:`check_zarr_reads` gives it the check of its chunks.
    """
    return _checked_store_class()(store, members, metadata_limit)


def check_zarr_reads(array: Any, name: str) -> None:
    """Bound every read zarr makes of ``array`` through its :func:`checked_store`: chunk members within
    :func:`largest_chunk_file`, and, for an array whose chunks zarr decodes, each one checked first
    (:func:`chunk_check_for`). ``name`` is the source's, for errors."""
    store = array.store
    if not hasattr(store, "members"):
        return  # not a checked_store
    store.name = name
    store.chunk_limit = largest_chunk_file(array)
    try:
        metadata = array.metadata
        if metadata.zarr_format == 2:
            v2_decoder(metadata)
        else:
            v3_decoder(metadata.codecs, tuple(metadata.chunk_grid.chunk_shape), metadata)
    except NotDecodedHere:
        store.check = chunk_check_for(array)


@functools.cache
def _checked_store_class() -> type:
    """The class of :func:`checked_store`, made where zarr is first needed (importing it costs most of a second)."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.storage import WrapperStore

    def ranged(data: bytes, byte_range: Any) -> bytes:
        if byte_range is None:
            return data
        if isinstance(byte_range, RangeByteRequest):
            return data[byte_range.start : byte_range.end]
        if isinstance(byte_range, OffsetByteRequest):
            return data[byte_range.offset :]
        if isinstance(byte_range, SuffixByteRequest):
            return data[max(0, len(data) - byte_range.suffix) :]
        raise TypeError(f"unexpected byte range {byte_range!r}")

    class CheckedStore(WrapperStore):
        def __init__(self, store: Any, members: ZipMembers | None = None, metadata_limit: int = 64 * 2**20) -> None:
            super().__init__(store)
            self.members = members
            self.metadata_limit = metadata_limit
            self.chunk_limit: int | None = None
            self.check: Callable[[Any, Any], None] | None = None
            self.name = members.name if members is not None else str(store)

        @property
        def inner(self) -> Any:
            return self._store

        def _with_store(self, store: Any) -> Any:
            copy = type(self)(store, self.members, self.metadata_limit)
            copy.chunk_limit, copy.check, copy.name = self.chunk_limit, self.check, self.name
            return copy

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            metadata = posixpath.basename(key) in _METADATA_KEYS
            if self.members is None:
                buffer = await self._store.get(key, prototype, byte_range)
            else:
                limit = self.metadata_limit if metadata or self.chunk_limit is None else self.chunk_limit
                data = self.members.read(key, limit)
                buffer = None if data is None else prototype.buffer.from_bytes(ranged(data, byte_range))
            if buffer is not None and self.check is not None and not metadata:
                try:
                    self.check(buffer.as_numpy_array(), byte_range)
                except DaskstreamError:
                    raise
                except DECODE_ERRORS as exc:  # each codec's own errors, all meaning a damaged chunk
                    raise CorruptSourceError(
                        f"{self.name}: chunk {key!r} could not be decoded within its bounds ({type(exc).__name__}: "
                        f"{exc}); the store is damaged or forged: re-create or re-copy it"
                    ) from None
            return buffer

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
            return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

        async def _get_many(self, requests: Any) -> Any:
            for key, prototype, byte_range in requests:
                yield key, await self.get(key, prototype, byte_range)

    return CheckedStore
