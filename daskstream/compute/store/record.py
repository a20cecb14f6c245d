"""The progress record of a store: what it computes, which blocks are done, and that it finished."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import dask.array as da

from daskstream.compute.streaming.span_graphs import span_piece_of
from daskstream.errors import (
    InvalidChunksError,
)
from daskstream.planning.grid import regular_chunk_shape

ProgressCallback = Callable[[int, int], None]

# Where a Zarr target keeps its progress record: hidden inside the array's own
# directory, so replacing or deleting the array removes it too, and zarr never
# reads it (chunk keys never start with a dot).
PROGRESS_DIR = ".daskstream-store"
IDENTITY_FILE = "identity.json"
# A record is a few hundred bytes; a file far larger is not one daskstream wrote.
MAX_RECORD_BYTES = 1 << 20
DONE_DIR = "done"
# What a finished store computed, kept beside the array (Zarr: in PROGRESS_DIR; HDF5: an attribute):
# running the same store again finds it complete and writes nothing.
COMPLETE_FILE = "complete.json"
H5_COMPLETE_ATTR = "daskstream_stored"
# HDF5 attributes holding the progress record while a store is unfinished.
H5_IDENTITY_ATTR = "daskstream_store"
H5_DONE_ATTR = "daskstream_store_done"
# An HDF5 attribute lives in the object header, whose messages are limited to 64 KiB.
H5_MAX_BLOCKS = 8 * 60_000
RECORD_FORMAT = "daskstream.store/1"


def chunk_shape(x: da.Array) -> tuple[int, ...]:
    """One full chunk of the target ``x`` is stored in: its blocks' shape, on the grid store has made regular
    first, or for an array read in spans (:mod:`daskstream.planning.spans`), the pieces its spans stream in.

    >>> import dask.array as da
    >>> chunk_shape(da.ones((10, 7), chunks=(4, 7)))
    (4, 7)
    """
    piece = span_chunk_shape(x)
    if piece is not None:
        return piece
    shape = regular_chunk_shape(x.chunks)
    if shape is None:
        raise InvalidChunksError(f"{x.name}: store writes arrays on a regular chunk grid; rechunk it first")
    return shape


def span_chunk_shape(x: da.Array) -> tuple[int, ...] | None:
    """The chunk the target of ``x`` is stored in where ``x``'s blocks are spans (many chunks per task,
    streamed, each covering many target chunks): the piece they stream in; ``None`` for other arrays."""
    piece = span_piece_of(x.dask, x.name)
    # A span is the task, the piece its buffer: the target's chunk is the piece.
    return None if piece is None else tuple(max(1, min(p, n)) for p, n in zip(piece, x.shape))


def chunk_counts(x: da.Array) -> tuple[int, ...]:
    """How many chunks of :func:`chunk_shape` the target of ``x`` has along each axis.

    >>> import dask.array as da
    >>> chunk_counts(da.ones((10, 7), chunks=(4, 7)))
    (3, 1)
    """
    piece = span_chunk_shape(x)
    if piece is None:
        return tuple(x.numblocks)
    return tuple(max(1, -(-n // c)) for n, c in zip(x.shape, piece))


def reads_spans(x: da.Array) -> bool:
    """Whether ``x``'s blocks are spans (many chunks per task, streamed), each covering many target chunks."""
    return span_chunk_shape(x) is not None


@dataclass(frozen=True)
class StoreIdentity:
    """What a progress record belongs to: a resumed store must compute the same thing.

    Examples
    --------
    >>> a = StoreIdentity(shape=(4,), dtype="float32", chunks=(2,), name="x-1")
    >>> StoreIdentity.from_json(a.to_json()) == a
    True
    >>> a.differences(StoreIdentity(shape=(4,), dtype="float32", chunks=(2,), name="x-2"))
    ["other data or operations: dask name 'x-2' (recorded: 'x-1')"]
    """

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    name: str

    @classmethod
    def of(cls, x: da.Array) -> StoreIdentity:
        return cls(shape=tuple(int(n) for n in x.shape), dtype=str(x.dtype), chunks=chunk_shape(x), name=x.name)

    def to_json(self) -> str:
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)})

    @classmethod
    def from_json(cls, text: str | bytes) -> StoreIdentity:
        record = json.loads(text)
        if record.get("format") != RECORD_FORMAT:
            raise ValueError(f"unknown progress record format {record.get('format')!r}")
        return cls(
            shape=tuple(record["shape"]),
            dtype=record["dtype"],
            chunks=tuple(record["chunks"]),
            name=record["name"],
        )

    def differences(self, other: StoreIdentity) -> list[str]:
        """What ``other`` (the new computation) changes from this recorded one."""
        found = [
            f"{field} {getattr(other, field)!r} (recorded: {getattr(self, field)!r})"
            for field in ("shape", "dtype", "chunks")
            if getattr(self, field) != getattr(other, field)
        ]
        if self.name != other.name:
            # dask names the same computation of the same data alike; another source, a changed file or
            # other operations name it otherwise.
            found.append(f"other data or operations: dask name {other.name!r} (recorded: {self.name!r})")
        return found


def block_name(index: tuple[int, ...]) -> str:
    return ".".join(map(str, index)) or "0"


def parse_block_name(name: str, ndim: int) -> tuple[int, ...] | None:
    parts = name.split(".")
    if ndim == 0:
        return () if name == "0" else None
    if len(parts) != ndim or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def write_atomically(path: str, data: bytes | memoryview, *, suffix: str = "tmp") -> None:
    """``data`` in a file beside ``path`` (``path.<32 hex digits>.<suffix>``), then renamed onto it: whole or absent."""
    tmp = f"{path}.{uuid.uuid4().hex}.{suffix}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
