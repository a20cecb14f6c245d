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
concurrently (see :mod:`daskstream.sources.objects.places`), and so are arrays in
zip files (:mod:`daskstream.sources.zarr.files`). Every decompressor is told
the size it must give (:mod:`daskstream.sources.bounded`). Any other codec
goes through zarr, whose reads are checked first
(:mod:`daskstream.sources.zarr.checks`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import google_crc32c
import numpy as np

from daskstream.caches import LeastRecentlyUsed
from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.sources.base import Region, storage_pieces
from daskstream.sources.bounded import DECODE_ERRORS, blosc_decode, bounded_decoder, gzip_decode, zstd_decode
from daskstream.sources.chunk_cache import active, keep, kept, on_surface
from daskstream.sources.zarr.bounds import is_bytes_to_bytes, largest_chunk_file, largest_v3_chunk
from daskstream.sources.zarr.files import ChunkObjects, LocalChunkFiles, ZipChunkFiles
from daskstream.sources.zarr.shards import ShardLayout


def chunk_reader_for(array: Any, objects: ChunkObjects | None = None) -> ZarrChunkReader | None:
    """A reader for ``array`` when its codecs are decoded here and its chunks are local files, zip members
    (its store a :func:`~daskstream.sources.zarr.checks.checked_store` over a zip) or ``objects``.

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
        shards = None
        if metadata.zarr_format == 2:
            storage_chunks = tuple(metadata.chunks)
            decode = v2_decoder(metadata)
        else:
            # The grid of chunk files: shards when the array is sharded.
            storage_chunks = tuple(metadata.chunk_grid.chunk_shape)
            decode = v3_decoder(metadata.codecs, storage_chunks, metadata)
            shards = shard_layout_of(metadata.codecs, storage_chunks, metadata)
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
    return ZarrChunkReader(
        fetch, metadata.encode_chunk_key, storage_chunks, decode, fill, keepable=whole, shards=shards
    )


def reads_shards_in_part(array: Any, local_or_objects: bool) -> bool:
    """Whether tasks may read ``array``'s shards in part (and so be planned in inner chunks): a sharded
    array in a local directory or on an object store, whose shard bytes are its inner chunks and index as
    they are (no codec around the whole shard), and which zarr reads in part too where this module does not."""
    metadata = array.metadata
    if not local_or_objects or metadata.zarr_format != 3 or getattr(array, "shards", None) is None:
        return False
    try:
        return shard_layout_of(metadata.codecs, tuple(metadata.chunk_grid.chunk_shape), metadata) is not None
    except NotDecodedHere:
        return True  # zarr decodes it, fetching the byte ranges of the inner chunks it needs


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
    shards
        How a shard holds its inner chunks, for sharded arrays whose shard
        files are read in part (:mod:`daskstream.sources.zarr.shards`).
    """

    def __init__(
        self,
        chunks: LocalChunkFiles | ZipChunkFiles | ChunkObjects,
        chunk_key: Callable[[tuple[int, ...]], str],
        storage_chunks: tuple[int, ...],
        decode: Callable[[bytes, Region, Any], np.ndarray],
        fill_value: Any,
        keepable: bool = False,
        shards: ShardLayout | None = None,
    ) -> None:
        self.chunks = chunks
        self.shards = shards
        # Shard indexes read from object stores, by object and version: each costs a request to read again.
        self._indexes: LeastRecentlyUsed[np.ndarray] = LeastRecentlyUsed(KEPT_INDEX_BYTES, lambda i: i.nbytes)
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
            if self._in_part(inside):
                with self._decoding(name, key):
                    self._read_shard_part(key, inside, out[target], name, written_before_ns)
                continue
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
            with self._decoding(name, key):
                if kept_key is not None:
                    chunk = self.decode(data, self._whole, self.fill_value)
                    keep(kept_key, chunk)
                    out[target] = chunk[inside]
                elif self.shards is not None:  # a whole shard read (a zip member, an object): decoded into place
                    self.shards.read_whole(data, inside, out[target], self.fill_value)
                else:
                    out[target] = self.decode(data, inside, self.fill_value)

    def _in_part(self, inside: Region) -> bool:
        """Whether a shard's part ``inside`` is read by its index and ranges: always from a local file (one
        run of inner chunks held at a time), from an object store unless the whole shard is wanted (one GET,
        fetched with the task's other objects, rather than two)."""
        if self.shards is None or not hasattr(self.chunks, "open_shard"):
            return False
        whole = all(s.start == 0 and s.stop >= c for s, c in zip(inside, self.storage_chunks))
        return not (whole and self.chunks.whole_when_covered)  # type: ignore[union-attr]

    def _read_shard_part(
        self, key: str, inside: Region, into: np.ndarray, name: str, written_before_ns: int | None
    ) -> None:
        """Fill ``into`` with ``inside`` of the shard at ``key``: its index, then the inner chunks needed."""
        assert self.shards is not None
        with self.chunks.open_shard(key, name, written_before_ns) as shard:  # type: ignore[union-attr]
            if shard is None:
                into[...] = self.fill_value  # a shard never written
                return
            index = None if shard.identity is None else self._indexes.get(shard.identity)
            if index is None:
                index = self.shards.read_index(shard)
                if shard.identity is not None:
                    self._indexes.put(shard.identity, index)
            self.shards.read(shard, inside, into, self.fill_value, index)

    @staticmethod
    @contextlib.contextmanager
    def _decoding(name: str, key: str) -> Iterator[None]:
        """Each codec's own errors, all meaning a damaged chunk, as one error naming the chunk."""
        try:
            yield
        except DaskstreamError:
            raise
        except DECODE_ERRORS as exc:
            raise CorruptSourceError(
                f"{name}: chunk {key!r} could not be decoded ({type(exc).__name__}: {exc}); the store is "
                "damaged: re-create or re-copy it"
            ) from exc


# The most bytes of shard indexes a reader keeps (indexes read from object stores, each a request saved).
KEPT_INDEX_BYTES = 16 * 2**20


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
    layout = shard_layout(sharding, shard_shape, metadata)

    def decode(data: bytes, inside: Region, fill: Any) -> np.ndarray:
        out = np.empty(tuple(s.stop - s.start for s in inside), dtype=layout.dtype)
        layout.read_whole(unwrap(data), inside, out, fill)
        return out

    return decode


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
    return ShardLayout(
        inner_shape=inner_shape,
        per_shard=per_shard,
        index_size=16 * math.prod(per_shard) + 4 * checksums,
        at_end=sharding.index_location == ShardingCodecIndexLocation.end,
        index_unwrap=_bytes_steps(index_codecs[1:], 16 * math.prod(per_shard), True),
        index_dtype=np.dtype("<u8" if endian is None or endian.value == "little" else ">u8"),
        inner_unwrap=_bytes_steps(inner_codecs, inner_bytes, True),
        dtype=_v3_dtype(metadata, inner_to_bytes[0]),
        largest_inner=largest_v3_chunk(tuple(sharding.codecs), inner_shape, dtype),
    )


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
