"""Chunked HDF5 datasets read without h5py's global lock.

h5py serialises every call on one lock, decompression included, so threads
reading a gzip dataset through it take turns. Here h5py is asked once per
process for where each chunk lies (its byte offset, size and filter mask);
after that a task reads its chunks' raw bytes with ``os.preadv`` and undoes
the filters itself: libdeflate (or zlib) for deflate, numpy for shuffle,
numcodecs for the Fletcher-32 checksum, zstd and blosc. All of these release
the GIL, so two threads decode two chunks at once.

Only pipelines made of those filters take this path; any other filter
(szip, n-bit, scale-offset, LZF, LZ4...) and datasets outside the file
(external links, external storage, virtual datasets) are read through h5py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.sources.base import Region, storage_pieces
from daskstream.sources.bounded import DECODE_ERRORS, blosc_decode, zlib_decode, zstd_decode
from daskstream.sources.chunk_cache import keep, kept, on_surface
from daskstream.sources.contiguous import pread_into

# HDF5's filter identifiers: the library's own, and the registered plugin ids.
DEFLATE, SHUFFLE, FLETCHER32 = 1, 2, 3
BLOSC, ZSTD = 32001, 32015
DECODABLE = frozenset({DEFLATE, SHUFFLE, FLETCHER32, BLOSC, ZSTD})


@dataclass(frozen=True)
class StoredChunk:
    """Where one chunk's bytes lie in the file, and which filters were skipped for it."""

    byte_offset: int
    size: int
    filter_mask: int


class ChunkIndex:
    """The stored chunks of a dataset, by their position in the chunk grid."""

    def __init__(self, chunks: dict[tuple[int, ...], StoredChunk]) -> None:
        self.chunks = chunks

    @classmethod
    def of(cls, dset: Any, chunk_shape: tuple[int, ...]) -> ChunkIndex:
        """Ask HDF5 for every allocated chunk of ``dset`` (one walk of its B-tree)."""
        found: dict[tuple[int, ...], StoredChunk] = {}

        def add(info: Any) -> None:
            grid = tuple(o // c for o, c in zip(info.chunk_offset, chunk_shape))
            found[grid] = StoredChunk(int(info.byte_offset), int(info.size), int(info.filter_mask))

        dsid = dset.id
        if hasattr(dsid, "chunk_iter"):  # HDF5 1.12.3 and later
            dsid.chunk_iter(add)
        else:
            for i in range(dsid.get_num_chunks()):
                add(dsid.get_chunk_info(i))
        return cls(found)


class ChunkDecoder:
    """Undoes a dataset's filter pipeline on one chunk's stored bytes.

    Parameters
    ----------
    pipeline
        ``(filter id, client values)`` in the order HDF5 applied them on write.
    dtype
        The dataset's dtype in the file (byte order included).
    chunk_shape
        The storage chunk shape; edge chunks are stored whole too.
    """

    def __init__(self, pipeline: Sequence[tuple[int, tuple[int, ...]]], dtype: np.dtype, chunk_shape: tuple[int, ...]):
        unknown = [code for code, _ in pipeline if code not in DECODABLE]
        if unknown:
            raise ValueError(f"filters {unknown} are not decoded here")
        self.pipeline = tuple(pipeline)
        self.dtype = np.dtype(dtype)
        self.chunk_shape = chunk_shape
        self.nbytes = int(np.prod(chunk_shape)) * self.dtype.itemsize
        self._steps: list[Callable[[Any, int], Any]] = [self._step(code) for code, _ in self.pipeline]

    def decode(self, raw: Any, filter_mask: int) -> np.ndarray:
        """The chunk as an array of ``chunk_shape`` (a new buffer, in the file's byte order).

        Each decompressing filter is told the size it must decode to, and
        refuses a chunk that claims or makes more (see :mod:`daskstream.sources.bounded`).
        """
        data = raw
        applied = [i for i in range(len(self._steps)) if not filter_mask & (1 << i)]
        # Filters undo in reverse order; a set bit i of the mask means filter i was not applied.
        for i in reversed(applied):
            # What this step must give: the chunk, plus four bytes per Fletcher-32 checksum still to undo.
            checksums = sum(self.pipeline[j][0] == FLETCHER32 for j in applied if j < i)
            data = self._steps[i](data, self.nbytes + 4 * checksums)
        array = np.frombuffer(data, dtype=np.uint8)
        if array.size != self.nbytes:
            raise ValueError(f"decoded to {array.size} bytes where the chunk holds {self.nbytes}")
        return array.view(self.dtype).reshape(self.chunk_shape)

    def _step(self, code: int) -> Callable[[Any, int], Any]:
        if code == DEFLATE:
            return lambda data, size: zlib_decode(data, size)
        if code == SHUFFLE:
            # HDF5's shuffle stores byte 0 of every element, then byte 1, ...: numcodecs' Shuffle exactly.
            from numcodecs import Shuffle

            unshuffle = Shuffle(elementsize=self.dtype.itemsize)
            return lambda data, size: unshuffle.decode(data)
        if code == FLETCHER32:
            from numcodecs.fletcher32 import Fletcher32

            checksum = Fletcher32()
            return lambda data, size: checksum.decode(data)
        if code == ZSTD:
            return lambda data, size: zstd_decode(data, size)
        return lambda data, size: blosc_decode(data, size)


class ChunkedReader:
    """Reads boxes of one chunked dataset from its raw chunks; one per process and file version.

    Parameters
    ----------
    path
        The HDF5 file.
    name
        ``path::dataset``, for error messages.
    index
        Where each allocated chunk is.
    decoder
        The dataset's filter pipeline.
    fill_value
        What unallocated chunks read as.
    token
        The source's identity, under which decoded chunks are kept for halos
        (:mod:`daskstream.sources.chunk_cache`).
    """

    def __init__(
        self, path: str, name: str, index: ChunkIndex, decoder: ChunkDecoder, fill_value: Any, token: str = ""
    ) -> None:
        self.name = name
        self.token = token
        self.index = index
        self.decoder = decoder
        self.fill_value = fill_value
        self._fd: int | None = os.open(path, os.O_RDONLY)

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _open_fd(self) -> int:
        # forget_handles may close a reader that a task still holds: say so, not os.preadv's TypeError on None.
        if self._fd is None:
            raise ValueError(f"the reader of {self.name} is closed")
        return self._fd

    def read_box(self, box: Region, out: np.ndarray) -> None:
        """Fill ``out`` (native byte order, the box's shape) with ``box`` of the dataset."""
        shape = self.decoder.chunk_shape
        first = tuple(s.start // c for s, c in zip(box, shape))
        last = tuple((s.stop - 1) // c for s, c in zip(box, shape))
        for grid, inside, target in storage_pieces(box, shape):
            stored = self.index.chunks.get(grid)
            if stored is None:
                out[target] = self.fill_value
                continue
            destination = out[target]
            if self._reads_straight_into(destination, stored):
                self._read_raw_into(grid, stored, destination)
                continue
            destination[...] = self._chunk(grid, stored, keep_it=on_surface(grid, first, last))[inside]

    def _reads_straight_into(self, destination: np.ndarray, stored: StoredChunk) -> bool:
        """Whether the chunk's stored bytes are exactly ``destination``'s: no filter applied, whole, same layout."""
        applied = [i for i in range(len(self.decoder.pipeline)) if not stored.filter_mask & (1 << i)]
        return (
            not applied
            and stored.size == self.decoder.nbytes
            and destination.shape == self.decoder.chunk_shape
            and destination.flags.c_contiguous
            and destination.dtype == self.decoder.dtype
        )

    def _read_raw_into(self, grid: tuple[int, ...], stored: StoredChunk, destination: np.ndarray) -> None:
        # One copy fewer: the file's bytes land in the task's output.
        fd = self._open_fd()
        try:
            # .data is the array's memoryview (numpy's stubs give ndarray the buffer protocol on 3.12+ only).
            pread_into(fd, destination.reshape(-1).view(np.uint8).data, stored.byte_offset)
        except (OSError, EOFError) as exc:
            raise self._damaged(grid, stored, exc) from None

    def _chunk(self, grid: tuple[int, ...], stored: StoredChunk, keep_it: bool = False) -> np.ndarray:
        # While a kernel reads haloed regions, a chunk shared with the next block is decoded once.
        if not keep_it:
            return self._decoded(grid, stored)
        kept_key = (self.token, self.name, stored.byte_offset, stored.size)
        chunk = kept(kept_key)
        if chunk is None:
            chunk = self._decoded(grid, stored)
            keep(kept_key, chunk)
        return chunk

    def _decoded(self, grid: tuple[int, ...], stored: StoredChunk) -> np.ndarray:
        raw = bytearray(stored.size)
        fd = self._open_fd()
        try:
            pread_into(fd, memoryview(raw), stored.byte_offset)
            return self.decoder.decode(raw, stored.filter_mask)
        except DaskstreamError:
            raise
        except DECODE_ERRORS as exc:  # every decoder's own errors, all meaning a damaged chunk
            raise self._damaged(grid, stored, exc) from exc

    def _damaged(self, grid: tuple[int, ...], stored: StoredChunk, exc: BaseException) -> CorruptSourceError:
        origin = tuple(g * c for g, c in zip(grid, self.decoder.chunk_shape))
        return CorruptSourceError(
            f"{self.name}: the chunk at {origin} ({stored.size} bytes at byte {stored.byte_offset}) could not "
            f"be decoded ({type(exc).__name__}: {exc}); the file is damaged: re-create or re-copy it"
        )
