"""Zarr chunks encoded and written by the task that computed them, beside zarr's event loop.

zarr-python 3 runs every write through one event loop and encodes on its own
thread pool, so dask threads writing through it queue behind each other, as
reads did (see :mod:`daskstream.sources.zarr_chunks`). For a local array
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

    def path(self, index: tuple[int, ...]) -> str:
        parts = [self.key_root] if self.key_root else []
        key = self.separator.join([*parts, *map(str, index)]) or "0"  # a 0-d array's one chunk
        return os.path.join(self.array_dir, *key.split("/"))

    def encode(self, block: np.ndarray) -> bytes | memoryview | None:
        """The chunk file's bytes for ``block`` (the chunk's part inside the array); ``None`` for a fill-value chunk."""
        chunk = whole_chunk(block, self.chunk_shape, self.dtype, self.fill_value)
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
            return b"".join((encoded, int(google_crc32c.value(np.frombuffer(encoded, np.uint8))).to_bytes(4, "little")))
        return data if isinstance(data, bytes) else encoded

    def write(self, index: tuple[int, ...], block: np.ndarray) -> None:
        """Encode ``block`` and put it in place whole, or remove its chunk file when it is all fill value.

        Raises
        ------
        MetadataChangedError
            The array's metadata is not the one the store began with.
        """
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


def chunk_writer_for(array_dir: str, array: Any) -> ChunkWriter | None:
    """The writer for the zarr ``array`` stored at ``array_dir``, or ``None`` where zarr must write it."""
    metadata = array.metadata
    if array.shards is not None:
        return None
    shape = tuple(int(c) for c in array.chunks)
    fill = metadata.fill_value
    try:
        if metadata.zarr_format == 2:
            if metadata.filters or metadata.order != "C":
                return None
            dtype = np.dtype(metadata.dtype.to_native_dtype())
            encoders: tuple[Any, ...] = () if metadata.compressor is None else (metadata.compressor,)
            checksum = False
            root, separator = "", metadata.dimension_separator
        else:
            found = _v3_encoders(metadata.codecs, metadata)
            if found is None:
                return None
            dtype, encoders, checksum = found
            encoding = metadata.chunk_key_encoding
            separator = encoding.separator
            root = "c" if type(encoding).__name__ == "DefaultChunkKeyEncoding" else ""
    except (AttributeError, TypeError, ValueError):
        return None  # metadata of a kind not foreseen here: zarr knows it
    metadata_file = os.path.join(array_dir, ".zarray" if metadata.zarr_format == 2 else "zarr.json")
    try:
        stamp = _stamp(metadata_file)
    except OSError:
        return None
    writer = ChunkWriter(array_dir, root, separator, shape, dtype, fill, encoders, checksum, metadata_file, stamp)
    # The chunk keys must be zarr's own; one that differs (another encoding) leaves the writing to zarr.
    sample = tuple(range(1, len(shape) + 1))
    expected = os.path.join(array_dir, *metadata.encode_chunk_key(sample).split("/"))
    return writer if writer.path(sample) == expected else None


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
