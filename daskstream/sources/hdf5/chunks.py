"""Chunked HDF5 datasets read without h5py's global lock.

h5py serialises every call on one lock, decompression included, so threads
reading a gzip dataset through it take turns. Here h5py is asked once per
process for where each chunk lies (its byte offset, size and filter mask);
after that a task reads its chunks' raw bytes with ``os.preadv`` (or, for a
file on an object store, fetches all the chunks of its box at once with
concurrent ranged GETs) and undoes the filters itself: libdeflate (or zlib)
for deflate, numpy for shuffle, numcodecs for the Fletcher-32 checksum, zstd
and blosc. All of these release the GIL, so two threads decode two chunks at
once.

Only pipelines made of those filters take this path; any other filter
(szip, n-bit, scale-offset, LZF, LZ4...) and datasets outside the file
(external links, external storage, virtual datasets) are read through h5py.

Every size the chunk index states is checked before a byte is allocated for
it (:meth:`ChunkIndex.of`): a chunk must lie inside the file and be no larger
than its filters can make of the chunk's bytes. HDF5 itself checks neither
(it believes its end-of-file address, which the file states too) and its
deflate and bzip2 filters grow their output for as long as a stream
decodes: a chunk h5py will decode through those is first decoded here, within
bounds, and refused if it makes more (:class:`FilterCheck`).

An unfiltered chunk need not be read whole: where its runs cost less than the
chunk, the part a block needs is read alone, straight into the block.

Longer than most modules: the chunk index, the reader and the filter check
share what a stored chunk is and what its bytes may be trusted to hold; apart,
each would restate the others' bounds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.sources.base import Region, storage_pieces
from daskstream.sources.bounded import (
    DECODE_ERRORS,
    blosc_decode,
    bz2_decode,
    largest_encoding,
    zlib_decode,
    zstd_decode,
)
from daskstream.sources.chunk_cache import keep, kept, on_surface
from daskstream.sources.contiguous import FileBytes, ObjectBytes

# HDF5's filter identifiers: the library's own, and the registered plugin ids.
DEFLATE, SHUFFLE, FLETCHER32 = 1, 2, 3
BLOSC, ZSTD = 32001, 32015
DECODABLE = frozenset({DEFLATE, SHUFFLE, FLETCHER32, BLOSC, ZSTD})
SZIP, NBIT, SCALEOFFSET, LZF, BZIP2, LZ4, BITSHUFFLE, BLOSC2 = 4, 5, 6, 32000, 307, 32004, 32008, 32026
# Filters that compress (or pack) a chunk: what they store is at most a compressor's worst case.
_COMPRESSING = frozenset({DEFLATE, SZIP, NBIT, SCALEOFFSET, LZF, BZIP2, BLOSC, LZ4, BITSHUFFLE, ZSTD, BLOSC2})


def largest_stored_size(pipeline: Sequence[tuple[int, tuple[int, ...]]], filter_mask: int, nbytes: int) -> int:
    """The most bytes HDF5 can store a chunk of ``nbytes`` in through the filters the mask says were applied.

    Shuffle keeps the size, Fletcher-32 adds its 4-byte checksum, a
    compressor stays within :func:`~daskstream.sources.bounded.largest_encoding`;
    a filter not known here is allowed twice its input and 64 KiB.

    >>> largest_stored_size([(SHUFFLE, ()), (DEFLATE, (4,))], 0, 1000)
    66551
    >>> largest_stored_size([(DEFLATE, (4,))], 0b1, 1000)  # the filter was skipped for this chunk
    1000
    """
    size = nbytes
    for position, (code, _) in enumerate(pipeline):
        if filter_mask & (1 << position) or code == SHUFFLE:
            continue
        if code == FLETCHER32:
            size += 4
        elif code in _COMPRESSING:
            size = largest_encoding(size)
        else:
            size = 2 * size + 2**16
    return size


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
    def of(
        cls,
        dset: Any,
        chunk_shape: tuple[int, ...],
        *,
        name: str,
        file_size: int,
        pipeline: Sequence[tuple[int, tuple[int, ...]]] = (),
        chunk_bytes: int | None = None,
    ) -> ChunkIndex:
        """Ask HDF5 for every allocated chunk of ``dset`` (one walk of its index), checking each as it comes.

        Whatever kind the index is (B-tree version 1 or 2, fixed or
        extensible array, single chunk, implicit), a chunk it places past the
        end of the file (``file_size`` bytes: measured, not what the file
        says), or states as larger than ``pipeline`` can make of
        ``chunk_bytes``, is a :class:`CorruptSourceError` naming ``name`` and
        the chunk, raised before anything is allocated for it.
        """
        found: dict[tuple[int, ...], StoredChunk] = {}

        def add(info: Any) -> None:
            if info.byte_offset is None or info.chunk_offset is None:
                return  # an entry at the undefined address: a chunk never written, read as the fill value
            grid = tuple(o // c for o, c in zip(info.chunk_offset, chunk_shape))
            stored = StoredChunk(int(info.byte_offset), int(info.size), int(info.filter_mask))
            _check_stored(name, tuple(info.chunk_offset), stored, file_size, pipeline, chunk_bytes)
            found[grid] = stored

        dsid = dset.id
        if hasattr(dsid, "chunk_iter"):  # HDF5 1.12.3 and later
            dsid.chunk_iter(add)
        else:
            for i in range(dsid.get_num_chunks()):
                add(dsid.get_chunk_info(i))
        return cls(found)


def _check_stored(
    name: str,
    origin: tuple[int, ...],
    stored: StoredChunk,
    file_size: int,
    pipeline: Sequence[tuple[int, tuple[int, ...]]],
    chunk_bytes: int | None,
) -> None:
    where = f"{name}: the chunk index says the chunk at {origin} is {stored.size} bytes at byte {stored.byte_offset}"
    if stored.byte_offset < 0 or stored.size < 0 or stored.byte_offset + stored.size > file_size:
        raise CorruptSourceError(
            f"{where}, past the end of the file ({file_size} bytes); the file is damaged, cut short or forged: "
            "re-create or re-copy it"
        )
    if chunk_bytes is None:
        return
    largest = largest_stored_size(pipeline, stored.filter_mask, chunk_bytes)
    if stored.size > largest:
        raise CorruptSourceError(
            f"{where}, more than its filters can store its {chunk_bytes} bytes in (at most {largest}); the file "
            "is damaged or forged: re-create or re-copy it"
        )


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
    data
        The file's bytes: a local file (:class:`~daskstream.sources.contiguous.FileBytes`,
        one ``preadv`` per chunk as it is decoded) or an object
        (:class:`~daskstream.sources.contiguous.ObjectBytes`: every chunk a box
        needs fetched at once, by concurrent ranged GETs, chunks next to each
        other in the file in one).
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
        self,
        data: FileBytes | ObjectBytes,
        name: str,
        index: ChunkIndex,
        decoder: ChunkDecoder,
        fill_value: Any,
        token: str = "",
    ) -> None:
        self.data = data
        self.name = name
        self.token = token
        self.index = index
        self.decoder = decoder
        self.fill_value = fill_value

    def close(self) -> None:
        """Close the file (idempotent)."""
        self.data.close()

    def read_box(self, box: Region, out: np.ndarray) -> None:
        """Fill ``out`` (native byte order, the box's shape) with ``box`` of the dataset."""
        shape = self.decoder.chunk_shape
        first = tuple(s.start // c for s, c in zip(box, shape))
        last = tuple((s.stop - 1) // c for s, c in zip(box, shape))
        pieces = list(storage_pieces(box, shape))
        fetched = self._fetch_all(pieces, first, last) if self.data.concurrent else {}
        for grid, inside, target in pieces:
            stored = self.index.chunks.get(grid)
            if stored is None:
                out[target] = self.fill_value
                continue
            destination = out[target]
            raw = fetched.get(grid)
            if raw is None and self._reads_in_part(stored, inside):
                self._read_part_into(grid, stored, inside, destination)
                continue
            if self._reads_straight_into(destination, stored):
                if raw is None:
                    self._read_raw_into(grid, stored, destination)
                else:
                    destination.reshape(-1).view(np.uint8)[...] = np.frombuffer(raw, dtype=np.uint8)
                continue
            destination[...] = self._chunk(grid, stored, on_surface(grid, first, last), raw)[inside]

    def _fetch_all(
        self, pieces: list[tuple[tuple[int, ...], Region, Region]], first: tuple[int, ...], last: tuple[int, ...]
    ) -> dict[tuple[int, ...], Any]:
        """The stored bytes of every chunk of the box not already kept decoded, fetched together.

        On an object store each request waits a round trip: asked for one
        after another, a box of many chunks would wait for each in turn.
        """
        wanted: dict[tuple[int, ...], StoredChunk] = {}
        for grid, _, _ in pieces:
            stored = self.index.chunks.get(grid)
            if stored is None or (on_surface(grid, first, last) and kept(self._kept_key(stored)) is not None):
                continue
            wanted[grid] = stored
        runs = [(s.byte_offset, s.byte_offset + s.size) for s in wanted.values()]
        try:
            return dict(zip(wanted, self.data.read_runs(runs)))
        except EOFError as exc:
            raise CorruptSourceError(
                f"{self.name}: a chunk lies beyond the end of the object ({exc}); the file is damaged or was cut "
                "short: re-create or re-copy it"
            ) from None

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

    def _reads_in_part(self, stored: StoredChunk, inside: Region) -> bool:
        """Whether the part ``inside`` of an unfiltered chunk is read alone: from a local file, where each run
        of it is one system call, and where it is not the whole chunk (read straight into place instead)."""
        unfiltered = all(stored.filter_mask & (1 << i) for i in range(len(self.decoder.pipeline)))
        whole = all(s.start == 0 and s.stop == c for s, c in zip(inside, self.decoder.chunk_shape))
        if not unfiltered or whole or self.data.concurrent or stored.size != self.decoder.nbytes:
            return False
        runs, run_elements, _ = _runs_of(inside, self.decoder.chunk_shape)
        # Each run is a system call: a part in many short runs costs more than reading the chunk whole.
        return runs * RUN_COST_BYTES + runs * run_elements * self.decoder.dtype.itemsize <= stored.size

    def _read_part_into(
        self, grid: tuple[int, ...], stored: StoredChunk, inside: Region, destination: np.ndarray
    ) -> None:
        """Read only the bytes of ``inside`` of an unfiltered chunk, run by run, into ``destination``."""
        _, run_elements, starts = _runs_of(inside, self.decoder.chunk_shape)
        itemsize = self.decoder.dtype.itemsize
        straight = destination.flags.c_contiguous and destination.dtype == self.decoder.dtype
        part = destination if straight else np.empty(destination.shape, dtype=self.decoder.dtype)
        flat = part.reshape(-1).view(np.uint8).data
        run_bytes = run_elements * itemsize
        try:
            for i, start in enumerate(starts):
                self.data.read_into(flat[i * run_bytes : (i + 1) * run_bytes], stored.byte_offset + start * itemsize)
        except (OSError, EOFError) as exc:
            if isinstance(exc, DaskstreamError):
                raise
            raise self._damaged(grid, stored, exc) from None
        if not straight:
            destination[...] = part  # into native byte order, where the file's differs

    def _read_raw_into(self, grid: tuple[int, ...], stored: StoredChunk, destination: np.ndarray) -> None:
        # One copy fewer: the file's bytes land in the task's output.
        try:
            # .data is the array's memoryview (numpy's stubs give ndarray the buffer protocol on 3.12+ only).
            self.data.read_into(destination.reshape(-1).view(np.uint8).data, stored.byte_offset)
        except (OSError, EOFError) as exc:
            if isinstance(exc, DaskstreamError):
                raise
            raise self._damaged(grid, stored, exc) from None

    def _kept_key(self, stored: StoredChunk) -> tuple[Any, ...]:
        return (self.token, self.name, stored.byte_offset, stored.size)

    def _chunk(self, grid: tuple[int, ...], stored: StoredChunk, keep_it: bool = False, raw: Any = None) -> np.ndarray:
        # While a kernel reads haloed regions, a chunk shared with the next block is decoded once.
        if not keep_it:
            return self._decoded(grid, stored, raw)
        kept_key = self._kept_key(stored)
        chunk = kept(kept_key)
        if chunk is None:
            chunk = self._decoded(grid, stored, raw)
            keep(kept_key, chunk)
        return chunk

    def _decoded(self, grid: tuple[int, ...], stored: StoredChunk, raw: Any = None) -> np.ndarray:
        if raw is None:
            try:
                raw = self.data.read_runs([(stored.byte_offset, stored.byte_offset + stored.size)])[0]
            except (OSError, EOFError) as exc:
                if isinstance(exc, DaskstreamError):
                    raise
                raise self._damaged(grid, stored, exc) from None
        try:
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


#: What one more read call costs, in bytes read: a part of an unfiltered chunk is read alone, run by run,
#: only where its runs cost less than reading the whole chunk (a band of columns of a day's map, 180 runs
#: of 100 bytes, is read whole: 7 million calls took 2.3 s where whole chunks took 0.5 s).
RUN_COST_BYTES = 32 * 2**10


def _runs_of(inside: Region, chunk_shape: tuple[int, ...]) -> tuple[int, int, Iterator[int]]:
    """The contiguous runs of a part of a C-ordered chunk: how many, elements in each, and where each starts
    (in elements from the chunk's first, in order).

    >>> count, each, starts = _runs_of((slice(1, 3), slice(0, 4)), (5, 4))
    >>> count, each, list(starts)
    (1, 8, [4])
    >>> count, each, starts = _runs_of((slice(1, 3), slice(1, 3)), (5, 4))
    >>> count, each, list(starts)
    (2, 2, [5, 9])
    """
    ndim = len(chunk_shape)
    extents = [s.stop - s.start for s in inside]
    # The run spans the last axes the part covers whole, and the axis before them as far as the part goes.
    first = ndim - 1
    while first > 0 and extents[first] == chunk_shape[first]:
        first -= 1
    run_elements = math.prod(extents[first:])
    strides = [math.prod(chunk_shape[a + 1 :]) for a in range(ndim)]
    count = math.prod(extents[:first])
    base = sum(s.start * st for s, st in zip(inside, strides))
    starts = (
        base + sum(i * st for i, st in zip(index, strides))
        for index in itertools.product(*(range(e) for e in extents[:first]))
    )
    return count, run_elements, starts


# Filters HDF5 decodes without bounding what they make: deflate and bzip2 grow their buffer for as long
# as the stream decodes, and the lz4, zstd and blosc plugins allocate what the chunk's header claims.
_UNBOUNDED_IN_HDF5 = frozenset({DEFLATE, BZIP2, LZ4, ZSTD, BLOSC})


class FilterCheck:
    """Decodes, within bounds, the compressing filters h5py would decode without any, and drops the result.

    For chunks h5py reads (types whose bytes are not numpy's, filters not
    decoded here): each stored chunk is decoded here first, from its outer
    filter inwards, each step told the most it may make (exactly the chunk's
    bytes where only shuffle and Fletcher-32 lie below it), and stopping at a
    filter not decoded here. A chunk that claims or makes more is refused
    before h5py is asked for it.

    Parameters
    ----------
    pipeline
        ``(filter id, client values)`` in the order HDF5 applied them on write.
    itemsize
        Bytes of one element as the file stores it (shuffle's element size).
    chunk_bytes
        Bytes of one chunk, decoded.
    """

    def __init__(self, pipeline: Sequence[tuple[int, tuple[int, ...]]], itemsize: int, chunk_bytes: int) -> None:
        self.pipeline = tuple(pipeline)
        self.itemsize = itemsize
        self.chunk_bytes = chunk_bytes

    @property
    def needed(self) -> bool:
        """Whether h5py would decode any filter of the pipeline without a bound."""
        return any(code in _UNBOUNDED_IN_HDF5 for code, _ in self.pipeline)

    def check(self, raw: Any, filter_mask: int) -> None:
        """Raise ``ValueError`` (or a codec's own error) when the chunk claims or decodes to more than it may."""
        applied = [i for i in range(len(self.pipeline)) if not filter_mask & (1 << i)]
        data = raw
        for i in reversed(applied):
            code = self.pipeline[i][0]
            below = [self.pipeline[j][0] for j in applied if j < i]
            # What undoing filter i may make: exactly known when only shuffle and checksums lie below it.
            exact = all(c in (SHUFFLE, FLETCHER32) for c in below)
            size = largest_stored_size(self.pipeline[:i], filter_mask, self.chunk_bytes)
            if code == DEFLATE:
                data = zlib_decode(data, size, exact=exact)
            elif code == ZSTD:
                data = zstd_decode(data, size, exact=exact)
            elif code == BLOSC:
                data = blosc_decode(data, size, exact=exact)
            elif code == BZIP2:
                data = bz2_decode(data, size, exact=exact)
            elif code == SHUFFLE:
                from numcodecs import Shuffle

                data = Shuffle(elementsize=self.itemsize).decode(data)
            elif code == FLETCHER32:
                from numcodecs.fletcher32 import Fletcher32

                data = Fletcher32().decode(data)
            elif code == LZ4:
                # HDF5's lz4 filter: the decoded size as a big-endian 64-bit integer, then the blocks.
                claimed = int.from_bytes(bytes(memoryview(data).cast("B")[:8]), "big")
                if claimed > size or (exact and claimed != size):
                    raise ValueError(f"the lz4 chunk claims {claimed} bytes where the chunk holds {size}")
                return
            else:
                return  # a filter not decoded here: what it makes is bounded by what h5py gives it
        if len(memoryview(data).cast("B")) != self.chunk_bytes:
            raise ValueError(
                f"decoded to {len(memoryview(data).cast('B'))} bytes where the chunk holds {self.chunk_bytes}"
            )


class CheckedChunks:
    """A chunked dataset's index, checked, and its chunks checked before h5py decodes them; one per process.

    Parameters
    ----------
    index
        The dataset's chunks, their sizes checked (:meth:`ChunkIndex.of`).
    chunk_shape
        The dataset's chunk shape (its own axes: an array element's are not chunked).
    check
        The bounded decoding of the dataset's filters.
    name
        ``path::dataset``, for error messages.
    """

    def __init__(self, index: ChunkIndex, chunk_shape: tuple[int, ...], check: FilterCheck, name: str) -> None:
        self.index = index
        self.chunk_shape = chunk_shape
        self.check = check
        self.name = name
        self._passed: set[tuple[int, int]] = set()

    def check_box(self, dsid: Any, box: Region) -> None:
        """Check every stored chunk ``box`` (of the dataset's axes) touches and was not checked before.

        ``dsid``: the dataset's h5py identifier, whose ``read_direct_chunk``
        gives a chunk's stored bytes wherever the file lies.
        """
        if not self.check.needed:
            return
        for grid, _, _ in storage_pieces(box, self.chunk_shape):
            stored = self.index.chunks.get(grid)
            if stored is None or (stored.byte_offset, stored.size) in self._passed:
                continue
            origin = tuple(g * c for g, c in zip(grid, self.chunk_shape))
            mask, raw = dsid.read_direct_chunk(origin)  # its failures are the caller's, as h5py's reads are
            try:
                self.check.check(raw, mask)
            except DaskstreamError:
                raise
            except DECODE_ERRORS as exc:
                raise CorruptSourceError(
                    f"{self.name}: the chunk at {origin} ({stored.size} bytes at byte {stored.byte_offset}) could "
                    f"not be decoded ({type(exc).__name__}: {exc}); the file is damaged or forged: re-create or "
                    "re-copy it"
                ) from None
            self._passed.add((stored.byte_offset, stored.size))
