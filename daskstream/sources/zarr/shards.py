"""Shards of Zarr format 3 arrays read in part: the index first, then only the inner chunks a box needs.

A shard file holds its inner chunks, each encoded on its own, and an index of
their offsets and sizes, at its end or its start. A task whose box covers
part of a shard reads the index and then the byte ranges of the inner chunks
it needs, neighbours merged into one read (inner chunks are written in C
order, so a row of them is usually one run of bytes), and decodes each into
its place in the task's block. Tasks can then be sized in inner chunks
rather than whole shards, for less memory and more of them to spread over
the cores, at no cost in reading: measured on 64 MiB shards of 1 MiB chunks,
eight-chunk tasks read the same bytes as whole-shard tasks in the same
number of system calls per byte.

Nothing the index says is believed before it is checked: a range past the
end of the shard, or larger than the codecs can make of an inner chunk, is a
:class:`~daskstream.errors.CorruptSourceError` before a byte of it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from daskstream.sources.base import Region, storage_pieces

EMPTY = np.uint64(2**64 - 1)  # a shard index's offset and size of an inner chunk absent from the shard

# Inner chunks this close are read as one run, the gap read and dropped: a local system call or an object
# store's request costs more than reading 64 kiB more.
MERGE_GAP = 64 * 2**10
# A run stops growing past this many bytes (unless one inner chunk alone is larger): a task holds one run
# at a time from a local file, so this bounds what it holds besides its block.
MOST_RUN_BYTES = 8 * 2**20


class ShardBytes(Protocol):
    """One shard's bytes, read by range: a local file, an object."""

    size: int
    identity: Any  # what names these bytes for the index kept of them (``None``: keep nothing)

    def read(self, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, Any]]:
        """``(position in ranges, bytes)`` of each ``(start, stop)``, in any order."""
        ...


@dataclass(frozen=True)
class Piece:
    """An inner chunk within a run: where its bytes lie in the run, the part of it wanted and where it goes."""

    offset: int
    nbytes: int
    part: Region
    target: Region


@dataclass(frozen=True)
class Run:
    """Bytes ``start:stop`` of a shard, read at once, and the inner chunks within them."""

    start: int
    stop: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class ShardLayout:
    """Where a shard keeps its index and inner chunks, and how each decodes.

    Parameters
    ----------
    inner_shape
        An inner chunk's shape.
    per_shard
        Inner chunks along each axis of a shard.
    index_size
        The stored index's bytes (16 per inner chunk, and any checksum).
    at_end
        Whether the index ends the shard (else it starts it).
    index_unwrap
        Undoes the index's bytes-to-bytes codecs (its checksum).
    index_dtype
        The index's offsets and sizes, as stored.
    inner_unwrap
        Undoes an inner chunk's bytes-to-bytes codecs (decompression, checksum), bounded by its size.
    dtype
        The values of an inner chunk, as stored.
    largest_inner
        The most bytes one inner chunk can be stored in.
    inner_into
        ``inner_into(encoded, place)`` decodes a whole inner chunk straight
        into ``place`` where its codecs can and ``place`` is one run of memory
        of its shape and dtype, else says ``False`` and does nothing.
    """

    inner_shape: tuple[int, ...]
    per_shard: tuple[int, ...]
    index_size: int
    at_end: bool
    index_unwrap: Callable[[Any], Any]
    index_dtype: np.dtype
    inner_unwrap: Callable[[Any], Any]
    dtype: np.dtype
    largest_inner: int
    inner_into: Callable[[Any, np.ndarray], bool] | None = None

    def index_range(self, size: int) -> tuple[int, int]:
        """Where the index lies in a shard of ``size`` bytes."""
        if size < self.index_size:
            raise ValueError(f"a shard of {size} bytes cannot hold its {self.index_size}-byte index")
        return (size - self.index_size, size) if self.at_end else (0, self.index_size)

    def index(self, raw: Any, size: int) -> np.ndarray:
        """The index (``(*per_shard, 2)``: offset, size) from its stored bytes, every range checked
        against a shard of ``size`` bytes."""
        index = np.frombuffer(self.index_unwrap(raw), dtype=self.index_dtype).reshape((*self.per_shard, 2))
        offsets, sizes = index[..., 0], index[..., 1]
        present = ~((offsets == EMPTY) & (sizes == EMPTY))
        data_start, data_stop = (0, size - self.index_size) if self.at_end else (self.index_size, size)
        # Compared as unsigned integers: offset + size cannot wrap past 2**64 within these bounds.
        bad = present & (
            (sizes > self.largest_inner)
            | (offsets < data_start)
            | (offsets > data_stop)
            | (sizes > data_stop - offsets)
        )
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            offset, nbytes = (int(v) for v in index[where])
            raise ValueError(
                f"the shard index places inner chunk {where} at bytes {offset}:{offset + nbytes} of a "
                f"{size}-byte shard (at most {self.largest_inner} bytes, between {data_start} and {data_stop})"
            )
        return index

    def runs(self, index: np.ndarray, inside: Region) -> tuple[list[Run], list[Region]]:
        """The runs of bytes to read for ``inside`` (a box within the shard), and the parts of it that no inner
        chunk holds (they read as the fill value)."""
        wanted: list[tuple[int, int, Region, Region]] = []
        absent: list[Region] = []
        for grid, part, target in storage_pieces(inside, self.inner_shape):
            offset, nbytes = index[grid]
            if offset == EMPTY and nbytes == EMPTY:
                absent.append(target)
            else:
                wanted.append((int(offset), int(nbytes), part, target))
        wanted.sort(key=lambda chunk: chunk[0])
        runs: list[Run] = []
        start = stop = 0
        pieces: list[Piece] = []
        for offset, nbytes, part, target in wanted:
            if pieces and (offset - stop > MERGE_GAP or offset + nbytes - start > MOST_RUN_BYTES):
                runs.append(Run(start, stop, tuple(pieces)))
                pieces = []
            if not pieces:
                start = stop = offset
            pieces.append(Piece(offset - start, nbytes, part, target))
            stop = max(stop, offset + nbytes)
        if pieces:
            runs.append(Run(start, stop, tuple(pieces)))
        return runs, absent

    def decode_run(self, data: Any, run: Run, into: np.ndarray) -> None:
        """Decode each inner chunk of ``run`` (its bytes ``data``) into its place in ``into``."""
        view = memoryview(data).cast("B")
        if len(view) != run.stop - run.start:
            raise ValueError(f"bytes {run.start}:{run.stop} of the shard came back as {len(view)} bytes")
        for piece in run.pieces:
            encoded = view[piece.offset : piece.offset + piece.nbytes]
            place = into[piece.target]
            if self.inner_into is None or not self.inner_into(encoded, place):
                place[...] = self.decode_inner(encoded)[piece.part]

    def decode_inner(self, encoded: Any) -> np.ndarray:
        return np.frombuffer(self.inner_unwrap(encoded), dtype=self.dtype).reshape(self.inner_shape)

    def read(self, shard: ShardBytes, inside: Region, into: np.ndarray, fill: Any, index: np.ndarray | None) -> None:
        """Fill ``into`` with ``inside`` of ``shard``: its index (unless given) and then the runs it needs."""
        if index is None:
            index = self.read_index(shard)
        runs, absent = self.runs(index, inside)
        for target in absent:
            into[target] = fill
        for position, data in shard.read([(run.start, run.stop) for run in runs]):
            self.decode_run(data, runs[position], into)

    def read_index(self, shard: ShardBytes) -> np.ndarray:
        """The index of ``shard``, read and checked."""
        ((_, raw),) = shard.read([self.index_range(shard.size)])
        return self.index(raw, shard.size)

    def read_whole(self, shard: Any, inside: Region, into: np.ndarray, fill: Any) -> None:
        """Fill ``into`` with ``inside`` from a whole shard's bytes already read (its inner chunks sliced out
        without copies)."""
        self.read(ReadShard(shard), inside, into, fill, None)


class ReadShard:
    """A shard's bytes already in memory, read by range as views of them."""

    identity = None

    def __init__(self, data: Any) -> None:
        self.view = memoryview(data).cast("B")
        self.size = len(self.view)

    def read(self, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, Any]]:
        for position, (start, stop) in enumerate(ranges):
            yield position, self.view[start:stop]


__all__ = ["EMPTY", "Run", "ShardBytes", "ShardLayout"]
