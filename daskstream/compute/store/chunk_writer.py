"""Zarr chunks encoded and written by the task that computed them, beside zarr's event loop.

zarr-python 3 runs every write through one event loop and encodes on its own
thread pool, so dask threads writing through it queue behind each other, as
reads did (see :mod:`daskstream.sources.zarr.chunks`). For a local array
whose codecs numcodecs encodes -- the bytes codec, then zstd, blosc or gzip
and an optional crc32c checksum (format 3), or one numcodecs compressor and
no filters (format 2) -- a task here pads its block to the chunk shape with
the fill value, encodes it with numcodecs in its own thread (the encoders
release the GIL, so threads encode in parallel) and writes the chunk file
beside its final name before renaming it into place, as zarr's LocalStore
does: a chunk file is whole or absent. A chunk equal to the fill value is not
written (and a stale one removed), as zarr does by default. Any other array
is written through zarr.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np

from daskstream.compute.store.record import write_atomically


@dataclass(frozen=True)
class ChunkWriter:
    """How one Zarr array's chunks are named, padded and encoded: small and picklable, for any worker.

    Attributes
    ----------
    array_dir
        The array's folder.
    key_root, separator
        Chunk ``(1, 2)`` lies at ``key_root``, ``"1"`` and ``"2"`` joined by
        ``separator``: ``"c/1/2"`` in format 3's default encoding (root ``"c"``),
        ``"1.2"`` in format 2's (no root).
    chunk_shape
        Every chunk file holds a whole chunk, edge chunks padded with the fill value.
    dtype
        The bytes' dtype on disk, byte order included.
    fill_value
        What a missing chunk reads as.
    encoders
        numcodecs codecs applied in order.
    checksum
        Whether a crc32c checksum follows the encoded bytes (Zarr's ``crc32c`` codec).
    metadata_file, metadata_stamp
        The array's metadata file and its inode, size and modification time
        when the store began: checked before each chunk is written, so chunks
        never go into an array deleted, replaced or damaged meanwhile.
    inner_chunks
        For a sharded array (format 3): the shape of the chunks inside each
        shard, which ``encoders`` and ``checksum`` then apply to; ``chunk_shape``
        is the shard's. ``None`` for an array without shards.
    index_checksum, index_at_start
        How the shard's index is stored: followed by a crc32c checksum, and
        before the chunks rather than after them.
    place
        For an array on an object store: its prefix there
        (:class:`~daskstream.sources.objects.places.Place`, which travels without
        its secrets). Each chunk is then one PUT of its whole object, which
        object stores make atomic; ``array_dir`` and the metadata stamp are
        unused (the target checks its metadata's version when it finishes).
    """

    array_dir: str
    key_root: str
    separator: str
    chunk_shape: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    encoders: tuple[Any, ...]
    checksum: bool
    metadata_file: str = ""
    metadata_stamp: tuple[int, ...] = ()
    inner_chunks: tuple[int, ...] | None = None
    index_checksum: bool = True
    index_at_start: bool = False
    place: Any = None

    def key(self, index: tuple[int, ...]) -> str:
        """The chunk's key inside the array, as zarr names it (``"c/1/2"``, ``"1.2"``)."""
        parts = [self.key_root] if self.key_root else []
        return self.separator.join([*parts, *map(str, index)]) or "0"  # a 0-d array's one chunk

    def path(self, index: tuple[int, ...]) -> str:
        return os.path.join(self.array_dir, *self.key(index).split("/"))

    def encode(self, block: np.ndarray) -> bytes | memoryview | None:
        """The chunk file's bytes for ``block`` (the chunk's part inside the array); ``None`` for a fill-value chunk."""
        chunk = whole_chunk(block, self.chunk_shape, self.dtype, self.fill_value)
        if self.inner_chunks is not None:
            return self._encode_shard(chunk, self.inner_chunks)
        return self._encode_chunk(chunk)

    def _encode_shard(self, shard: np.ndarray, inner: tuple[int, ...]) -> bytes | None:
        """A shard as zarr's sharding codec lays it out: its chunks that are not all fill value, in Morton
        order, and an index of (offset, length) per chunk in C order (``2**64 - 1`` twice for a missing one)."""
        from zarr.core.indexing import morton_order_iter

        per_shard = tuple(s // c for s, c in zip(self.chunk_shape, inner))
        index = np.full((*per_shard, 2), _MISSING, dtype="<u8")
        pieces: list[bytes | memoryview] = []
        offset = 0
        for position in morton_order_iter(per_shard):
            encoded = self._encode_chunk(shard[tuple(slice(p * c, (p + 1) * c) for p, c in zip(position, inner))])
            if encoded is None:
                continue
            index[position] = (offset, len(encoded))
            pieces.append(encoded)
            offset += len(encoded)
        if not pieces:
            return None
        if self.index_at_start:
            index_size = index.nbytes + (4 if self.index_checksum else 0)
            index[index[..., 0] != _MISSING, 0] += index_size
        raw = index.tobytes()
        index_bytes = raw + _crc32c(raw) if self.index_checksum else raw
        return b"".join([index_bytes, *pieces] if self.index_at_start else [*pieces, index_bytes])

    def _encode_chunk(self, chunk: np.ndarray) -> bytes | memoryview | None:
        if _all_fill(chunk, self.fill_value):
            return None
        data: Any = np.ascontiguousarray(chunk)
        for encoder in self.encoders:
            data = encoder.encode(data)
        if isinstance(data, np.ndarray):
            # Nothing encoded: the chunk's own bytes, as bytes (datetimes and records have no buffer format).
            data = data.reshape(-1).view(np.uint8)
        # The encoders' output as it is (no copy): bytes, or the chunk's own memory when nothing encodes.
        encoded = memoryview(data).cast("B")
        if self.checksum:
            return b"".join((encoded, _crc32c(encoded)))
        return data if isinstance(data, bytes) else encoded

    def write(self, index: tuple[int, ...], block: np.ndarray) -> None:
        """Encode ``block`` and put it in place whole, or remove its chunk file when it is all fill value.

        Raises
        ------
        MetadataChangedError
            The array's metadata is not the one the store began with.
        """
        if self.place is not None:
            encoded = self.encode(block)
            if encoded is None:
                self.place.delete([self.key(index)])  # a chunk of fill value is no object, as zarr leaves it
            else:
                self.place.put(self.key(index), encoded)
            return
        if self.metadata_file:
            try:
                now = _stamp(self.metadata_file)
            except FileNotFoundError as exc:
                raise MetadataChangedError(f"the array's metadata file {self.metadata_file} is gone") from exc
            if now != self.metadata_stamp:
                raise MetadataChangedError(f"the array's metadata file {self.metadata_file} was rewritten")
        destination = self.path(index)
        encoded = self.encode(block)
        if encoded is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(destination)
            return
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        # Named as zarr's LocalStore names its temporary files, which a resumed store removes.
        write_atomically(destination, encoded, suffix="partial")


def whole_chunk(block: np.ndarray, chunk_shape: tuple[int, ...], dtype: np.dtype, fill_value: Any) -> np.ndarray:
    """``block`` as the whole chunk holding it, in ``dtype``: an edge block padded with the fill value.

    Zarr and HDF5 both store every chunk whole, the part beyond the array's edge
    included.

    >>> whole_chunk(np.array([1, 2]), (4,), np.dtype("i2"), -1).tolist()
    [1, 2, -1, -1]
    """
    chunk = np.asarray(block, dtype=dtype)
    if chunk.shape == chunk_shape:
        return chunk
    padded = np.full(chunk_shape, fill_value, dtype=dtype)
    padded[tuple(slice(0, n) for n in chunk.shape)] = chunk
    return padded


# A shard index's entry for a chunk it does not hold.
_MISSING = 2**64 - 1


def _crc32c(data: bytes | memoryview) -> bytes:
    """Zarr's crc32c codec: the checksum of the bytes, four bytes little-endian."""
    return int(google_crc32c.value(np.frombuffer(data, np.uint8))).to_bytes(4, "little")


class MetadataChangedError(ValueError):
    """The array being written is no longer the one the store created (as zarr's errors, a ValueError)."""


def _stamp(path: str) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _all_fill(chunk: np.ndarray, fill_value: Any) -> bool:
    nan_fill = chunk.dtype.kind in "fc" and fill_value is not None and bool(np.isnan(fill_value))
    # Data chunks rarely start and end with the fill value: two elements decide before a full scan.
    for probe in (chunk.flat[0], chunk.flat[-1]) if chunk.size else ():
        if not (np.isnan(probe) if nan_fill else probe == fill_value):
            return False
    if nan_fill:
        return bool(np.isnan(chunk).all())
    if chunk.dtype.kind in "biufc" and not np.any(fill_value):  # zero: any() scans without a temporary
        return not chunk.any()
    return bool((chunk == fill_value).all())


def chunk_writer_for(array_dir: str, array: Any, place: Any = None) -> ChunkWriter | None:
    """The writer for the zarr ``array`` stored at ``array_dir`` (or at ``place`` on an object store),
    or ``None`` where zarr must write it."""
    metadata = array.metadata
    shape = tuple(int(c) for c in (array.shards if array.shards is not None else array.chunks))
    fill = metadata.fill_value
    sharding: dict[str, Any] = {}
    try:
        if metadata.zarr_format == 2:
            if metadata.filters or metadata.order != "C":
                return None
            dtype = np.dtype(metadata.dtype.to_native_dtype())
            encoders: tuple[Any, ...] = () if metadata.compressor is None else (metadata.compressor,)
            checksum = False
            root, separator = "", metadata.dimension_separator
        else:
            if array.shards is not None:
                found = _shard_layout(metadata)
            else:
                plain = _v3_encoders(metadata.codecs, metadata)
                found = None if plain is None else (*plain, {})
            if found is None:
                return None
            dtype, encoders, checksum, sharding = found
            encoding = metadata.chunk_key_encoding
            separator = encoding.separator
            root = "c" if type(encoding).__name__ == "DefaultChunkKeyEncoding" else ""
    except (AttributeError, TypeError, ValueError):
        return None  # metadata of a kind not foreseen here: zarr knows it
    stamp: tuple[int, ...]
    if place is not None:
        metadata_file, stamp = "", ()
    else:
        metadata_file = os.path.join(array_dir, ".zarray" if metadata.zarr_format == 2 else "zarr.json")
        try:
            stamp = _stamp(metadata_file)
        except OSError:
            return None
    writer = ChunkWriter(
        array_dir,
        root,
        separator,
        shape,
        dtype,
        fill,
        encoders,
        checksum,
        metadata_file,
        stamp,
        **sharding,
        place=place,
    )
    # The chunk keys must be zarr's own; one that differs (another encoding) leaves the writing to zarr.
    sample = tuple(range(1, len(shape) + 1))
    return writer if writer.key(sample) == metadata.encode_chunk_key(sample) else None


def _shard_layout(metadata: Any) -> tuple[np.dtype, tuple[Any, ...], bool, dict[str, Any]] | None:
    """The inner chunks' encoding and the index's layout of a sharded array, or ``None`` where zarr must
    write it (the sharding codec not alone, or an index encoded otherwise than as bytes and a checksum)."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    if len(metadata.codecs) != 1 or not isinstance(metadata.codecs[0], ShardingCodec):
        return None
    sharding = metadata.codecs[0]
    index_codecs = list(sharding.index_codecs)
    little = isinstance(index_codecs[0], BytesCodec) and (
        index_codecs[0].endian is None or index_codecs[0].endian.value == "little"
    )
    if not little or not (
        len(index_codecs) == 1 or (len(index_codecs) == 2 and isinstance(index_codecs[1], Crc32cCodec))
    ):
        return None
    inner = _v3_encoders(sharding.codecs, metadata)
    if inner is None:
        return None
    layout = {
        "inner_chunks": tuple(int(c) for c in sharding.chunk_shape),
        "index_checksum": len(index_codecs) == 2,
        "index_at_start": sharding.index_location.value == "start",
    }
    return (*inner, layout)


def _v3_encoders(codecs: Any, metadata: Any) -> tuple[np.dtype, tuple[Any, ...], bool] | None:
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

    to_bytes, *rest = codecs
    if not isinstance(to_bytes, BytesCodec):
        return None
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    if dtype.hasobject or dtype.itemsize == 0:
        return None
    if to_bytes.endian is not None and dtype.itemsize > 1:
        dtype = dtype.newbyteorder("<" if to_bytes.endian.value == "little" else ">")
    encoders: list[Any] = []
    checksum = False
    for position, codec in enumerate(rest):
        if isinstance(codec, Crc32cCodec) and position == len(rest) - 1:
            checksum = True
        elif isinstance(codec, ZstdCodec):
            encoders.append(numcodecs.Zstd(level=codec.level, checksum=codec.checksum))
        elif isinstance(codec, GzipCodec):
            encoders.append(numcodecs.GZip(level=codec.level))
        elif isinstance(codec, BloscCodec):
            shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[codec.shuffle.value]
            # The typed chunk is encoded, so blosc shuffles by the dtype's item size.
            encoders.append(
                numcodecs.Blosc(
                    cname=codec.cname.value, clevel=codec.clevel, shuffle=shuffle, blocksize=codec.blocksize
                )
            )
        else:
            return None
    return dtype, tuple(encoders), checksum
