"""Zarr arrays in a local directory, read chunk by chunk in the calling thread.

zarr-python 3 runs every read through one event loop and decodes on its own
thread pool, so dask threads calling it queue behind each other and compete
with that pool for the cores. For arrays in a local directory whose codecs
numcodecs decodes (zstd, blosc, gzip; crc32c checksums, checked with
google-crc32c as zarr does; the bytes codec; sharding over those), a task here
reads each chunk or shard file with one system call and decodes it with
numcodecs in its own thread. numcodecs releases the GIL while
it decompresses, so two tasks decode on two cores, and nothing else spawns
threads.

Arrays on object stores are read the same way, their chunk objects fetched
concurrently (see :mod:`daskstream.sources.objects`), and so are arrays in
zip files (:mod:`daskstream.sources.zarr_files`). Every decompressor is told
the size it must give (:mod:`daskstream.sources.bounded`). Any other codec
goes through zarr, whose reads are checked first
(:mod:`daskstream.sources.zarr_checks`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import google_crc32c
import numpy as np

from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.sources.base import Region, storage_pieces
from daskstream.sources.bounded import DECODE_ERRORS, blosc_decode, bounded_decoder, gzip_decode, zstd_decode
from daskstream.sources.chunk_cache import active, keep, kept, on_surface
from daskstream.sources.zarr_bounds import is_bytes_to_bytes, largest_chunk_file
from daskstream.sources.zarr_files import ChunkObjects, LocalChunkFiles, ZipChunkFiles

EMPTY = np.uint64(2**64 - 1)  # a shard index's offset and size of an inner chunk absent from the shard


def chunk_reader_for(array: Any, objects: ChunkObjects | None = None) -> ZarrChunkReader | None:
    """A reader for ``array`` when its codecs are decoded here and its chunks are local files, zip members
    (its store a :func:`~daskstream.sources.zarr_checks.checked_store` over a zip) or ``objects``.

    ``objects``: the array's chunk objects on an object store, for an array
    zarr opened through fsspec; without it only local directories and zip files are read here.
    """
    from zarr.storage import LocalStore

    store = getattr(array.store, "inner", array.store)  # beneath a checked_store
    members = getattr(array.store, "members", None)
    local = isinstance(store, LocalStore)
    if not local and objects is None and members is None:
        return None
    metadata = array.metadata
    try:
        if metadata.zarr_format == 2:
            storage_chunks = tuple(metadata.chunks)
            decode = v2_decoder(metadata)
        else:
            # The grid of chunk files: shards when the array is sharded.
            storage_chunks = tuple(metadata.chunk_grid.chunk_shape)
            decode = v3_decoder(metadata.codecs, storage_chunks, metadata)
    except NotDecodedHere:
        return None
    largest = largest_chunk_file(array)
    fetch: LocalChunkFiles | ZipChunkFiles | ChunkObjects
    if local:
        fetch = LocalChunkFiles(os.path.join(str(store.root), array.path or ""), largest)
    elif members is not None:
        fetch = ZipChunkFiles(members, array.path or "", largest)
    else:
        assert objects is not None
        objects.largest = largest
        fetch = objects
    fill = array.fill_value if array.fill_value is not None else 0
    # A shard decodes only the inner chunks a box needs: only whole chunks are worth keeping for halos.
    whole = tuple(array.chunks) == storage_chunks
    return ZarrChunkReader(fetch, metadata.encode_chunk_key, storage_chunks, decode, fill, keepable=whole)  # type: ignore[arg-type]


class NotDecodedHere(Exception):
    """A codec or layout this module leaves to zarr."""


class ZarrChunkReader:
    """Reads boxes of one array from its chunk (or shard) files.

    Parameters
    ----------
    chunks
        Where the chunk files or objects are (:class:`LocalChunkFiles`,
        :class:`ChunkObjects`): what fetches a box's chunks, all at once.
    chunk_key
        Maps a position in the storage grid to the file's key ("c/0/1", "0.1").
    storage_chunks
        The storage grid: shards when sharded, else chunks.
    decode
        ``decode(file bytes, box inside the storage chunk) -> array of that box``.
    fill_value
        What a missing chunk file reads as.
    keepable
        Whether decoded chunks may be kept for neighbouring halos
        (:mod:`daskstream.sources.chunk_cache`): whole chunks, not shards.
    """

    def __init__(
        self,
        chunks: LocalChunkFiles | ChunkObjects,
        chunk_key: Callable[[tuple[int, ...]], str],
        storage_chunks: tuple[int, ...],
        decode: Callable[[bytes, Region, Any], np.ndarray],
        fill_value: Any,
        keepable: bool = False,
    ) -> None:
        self.chunks = chunks
        self.root = chunks.root
        self.chunk_key = chunk_key
        self.storage_chunks = storage_chunks
        self.decode = decode
        self.fill_value = fill_value
        self.keepable = keepable
        self._whole = tuple(slice(0, c) for c in storage_chunks)

    def read_box(self, box: Region, out: np.ndarray, name: str, written_before_ns: int | None = None) -> None:
        """Fill ``out`` with ``box`` of the array; ``name`` is the source's, for errors.

        A chunk file modified after ``written_before_ns`` (when the source was
        opened) raises :class:`SourceChangedError`: chunk files deep in a
        format 3 store change no metadata or directory the source stamps.
        """
        first = tuple(s.start // c for s, c in zip(box, self.storage_chunks))
        last = tuple((s.stop - 1) // c for s, c in zip(box, self.storage_chunks))
        wanted: list[tuple[str, Any, Region, Region]] = []  # (key, kept key or None, part in the chunk, where it goes)
        for grid, inside, target in storage_pieces(box, self.storage_chunks):
            key = self.chunk_key(grid)
            kept_key = (self.root, key, written_before_ns)
            keeping = self.keepable and active() and on_surface(grid, first, last)
            chunk = kept(kept_key) if keeping else None
            if chunk is not None:
                out[target] = chunk[inside]
            else:
                wanted.append((key, kept_key if keeping else None, inside, target))
        # Asked for together: an object store serves a task's chunks concurrently, each decoded as it arrives.
        for position, data in self.chunks.fetch_each([key for key, *_ in wanted], name, written_before_ns):
            key, kept_key, inside, target = wanted[position]
            if data is None:
                out[target] = self.fill_value  # Zarr: a chunk never written is the fill value
                continue
            try:
                if kept_key is not None:
                    chunk = self.decode(data, self._whole, self.fill_value)
                    keep(kept_key, chunk)
                    out[target] = chunk[inside]
                else:
                    out[target] = self.decode(data, inside, self.fill_value)
            except DaskstreamError:
                raise
            except DECODE_ERRORS as exc:  # each codec's own errors, all meaning a damaged chunk
                raise CorruptSourceError(
                    f"{name}: chunk {key!r} could not be decoded ({type(exc).__name__}: {exc}); the store is "
                    "damaged: re-create or re-copy it"
                ) from exc


# --- format 2 -------------------------------------------------------------------------------------


def v2_decoder(metadata: Any) -> Callable[[bytes, Region, Any], np.ndarray]:
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

    return decode


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


def v3_decoder(
    codecs: tuple, chunk_shape: tuple[int, ...], metadata: Any
) -> Callable[[bytes, Region, Any], np.ndarray]:
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

    return decode


def _shard_decoder(
    sharding: Any, shard_shape: tuple[int, ...], unwrap: Callable[[Any], Any], metadata: Any
) -> Callable[[bytes, Region, Any], np.ndarray]:
    from zarr.codecs import BytesCodec, ShardingCodecIndexLocation

    inner_shape = tuple(sharding.chunk_shape)
    per_shard = tuple(s // c for s, c in zip(shard_shape, inner_shape))
    inner_to_bytes = [c for c in sharding.codecs if not is_bytes_to_bytes(c)]
    if len(inner_to_bytes) != 1 or not isinstance(inner_to_bytes[0], BytesCodec):
        raise NotDecodedHere  # nested shards, transposes: zarr's
    inner_bytes = math.prod(inner_shape) * max(np.dtype(metadata.data_type.to_native_dtype()).itemsize, 1)
    inner_unwrap = _bytes_steps([c for c in sharding.codecs if is_bytes_to_bytes(c)], inner_bytes, True)
    index_codecs = list(sharding.index_codecs)
    if not isinstance(index_codecs[0], BytesCodec):
        raise NotDecodedHere
    index_size = 16 * math.prod(per_shard) + 4 * sum(type(c).__name__ == "Crc32cCodec" for c in index_codecs[1:])
    index_unwrap = _bytes_steps(index_codecs[1:], 16 * math.prod(per_shard), True)
    at_end = sharding.index_location == ShardingCodecIndexLocation.end
    index_dtype = np.dtype(
        "<u8" if index_codecs[0].endian is None or index_codecs[0].endian.value == "little" else ">u8"
    )
    dtype = _v3_dtype(metadata, inner_to_bytes[0])

    def decode(data: bytes, inside: Region, fill: Any) -> np.ndarray:
        shard = memoryview(unwrap(data))  # the inner chunks are sliced out without copies
        raw_index = shard[len(shard) - index_size :] if at_end else shard[:index_size]
        index = np.frombuffer(index_unwrap(raw_index), dtype=index_dtype).reshape((*per_shard, 2))
        out = np.empty(tuple(s.stop - s.start for s in inside), dtype=dtype)
        for grid, part, target in storage_pieces(inside, inner_shape):
            offset, nbytes = index[grid]
            if offset == EMPTY and nbytes == EMPTY:
                out[target] = fill
                continue
            encoded = shard[int(offset) : int(offset) + int(nbytes)]
            out[target] = np.frombuffer(inner_unwrap(encoded), dtype=dtype).reshape(inner_shape)[part]
        return out

    return decode


def _v3_dtype(metadata: Any, to_bytes: Any) -> np.dtype:
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    if dtype.hasobject or dtype.itemsize == 0:
        raise NotDecodedHere
    if to_bytes.endian is not None and dtype.itemsize > 1:
        dtype = dtype.newbyteorder("<" if to_bytes.endian.value == "little" else ">")
    return dtype


def _bytes_steps(codecs: list, size: int, exact: bool) -> Callable[[Any], Any]:
    """Undo bytes-to-bytes codecs, last applied first, with decoders bounded by the ``size`` they must give.

    A checksum adds 4 bytes: a compressor that decodes to the checksummed
    bytes must give ``size`` plus 4 for each checksum undone after it.
    """
    undo = list(reversed(codecs))
    steps = []
    for position, codec in enumerate(undo):
        checksums = sum(type(c).__name__ == "Crc32cCodec" for c in undo[position + 1 :])
        steps.append(numcodecs_step(codec, size + 4 * checksums, exact))

    def unwrap(data: Any) -> Any:
        for step in steps:
            data = step(data)
        return data

    return unwrap


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
