"""Byte runs of local files and of objects on an object store, and boxes of contiguous arrays read from them.

Shared by .npy files and contiguous HDF5 datasets. Full slabs (every axis
after the slowest one whole) are one ``preadv`` into a fresh buffer: no memory
map outlives the read, so a worker's RSS holds only the chunks it works on.
Other boxes (a column of a row-major array, say) are copied out of memory maps
of at most ``_MAP_WINDOW`` bytes at a time, each unmapped before the next:
mapped file pages count in a process's resident memory, and a box's span can
be the whole file.

On an object store (:class:`ObjectBytes`) the same boxes are ranged GETs: a
slab is fetched in parts of at most ``_PART`` bytes, concurrently, and copied
into the block as each batch arrives; any other box is fetched as windows of
its span, as the memory maps above cover it, never one request per element.
Every response's version (S3's ETag) and object size are compared with those
seen when the source was opened, so data rewritten since is refused rather
than mixed in. :class:`ObjectFile` puts a file's interface over such an
object for libraries that read through one (h5py).
"""

from __future__ import annotations

import errno
import io
import math
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from daskstream.caches import LeastRecentlyUsed
from daskstream.errors import DaskstreamError, SourceChangedError, SourceNotFoundError, SourceRemovedError
from daskstream.files import open_regular
from daskstream.sources.base import REREAD_ADVICE, Region, to_native
from daskstream.sources.objects.places import Got, Place, version_of

# Linux transfers at most this many bytes per read call.
_MAX_READ = 0x7FFFF000
# The most bytes of a file mapped at once to copy a strided box out of it.
_MAP_WINDOW = 8 * 2**20

# What is fetched of an object when it is opened: its format's signature, any header numpy writes
# without pickle (at most 10 kB), and an HDF5 file's superblock and first object headers.
HEAD_BYTES = 64 * 2**10
# The most bytes one ranged GET asks for: larger runs go as parts in parallel.
_PART = 4 * 2**20
# The most bytes of parts in flight while one read fills a block: they are held besides the block.
READ_BATCH_BYTES = 32 * 2**20
# Runs this close in an object are fetched as one request: the gap costs less than another round trip.
_MERGE_GAP = 64 * 2**10


class FileBytes:
    """A local file's bytes, read with ``os.preadv``; the file stays open until :meth:`close`.

    Parameters
    ----------
    path
        The file.
    name
        How errors name it (``path::dataset``).
    """

    concurrent = False  # each run is one system call: nothing to gain from asking for them together

    def __init__(self, path: str, name: str) -> None:
        self.name = name
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

    def read_into(self, view: memoryview, position: int) -> None:
        """Fill ``view`` with the file's bytes from ``position``."""
        pread_into(self._open_fd(), view, position)

    def read_runs(self, runs: Sequence[tuple[int, int]]) -> list[Any]:
        """Bytes ``start:stop`` of each run."""
        found = []
        for start, stop in runs:
            raw = bytearray(stop - start)
            self.read_into(memoryview(raw), start)
            found.append(raw)
        return found


class ObjectBytes:
    """One object on an object store, read by ranged GETs checked against the version it had when opened.

    A small, picklable description (the place travels without its secrets):
    any process can read through it.

    Parameters
    ----------
    place
        Where the object is (its URL is the place's).
    name
        How errors name it (``url`` or ``url::dataset``).
    size, version
        The object's size and version (ETag) when the source was opened.
        ``version`` is ``None`` where the store gives none.
    """

    concurrent = True  # every run of a read is asked for at once, their latencies overlapping

    def __init__(self, place: Place, name: str, size: int, version: str | None) -> None:
        self.place = place
        self.name = name
        self.size = size
        self.version = version

    @classmethod
    def open(cls, place: Place, name: str, head: Got | None = None) -> tuple[ObjectBytes, bytes]:
        """The object at ``place`` and its first :data:`HEAD_BYTES` bytes (one ranged GET, unless ``head`` has them).

        Stores whose responses carry no size or version (``memory://``, some
        HTTP servers) are asked for them once more.

        Raises
        ------
        SourceNotFoundError
            Where there is no object.
        """
        if head is None:
            place.check_reachable()  # endpoint, credentials and bucket: one clear line first
            head = place.get_head("", HEAD_BYTES)
        if head.data is None:
            raise SourceNotFoundError(f"{place.url}: no such object; check the URL")
        size, version = head.size, head.version
        if size is None or version is None:
            with place.errors("open"):
                info = place.fs.info(place.path(""))
            size = int(info["size"]) if size is None else size
            version = version or version_of(info)
        return cls(place, name, int(size), version), bytes(head.data)

    def close(self) -> None:
        """Nothing to close: requests go through the process's filesystem."""

    def read_into(self, view: memoryview, position: int) -> None:
        """Fill ``view`` with the object's bytes from ``position``: parts fetched in parallel, a batch at a time."""
        stop = position + len(view)
        parts = [(start, min(start + _PART, stop)) for start in range(position, stop, _PART)]
        per_batch = max(1, READ_BATCH_BYTES // _PART)
        for first in range(0, len(parts), per_batch):
            batch = parts[first : first + per_batch]
            for (start, end), data in zip(batch, self._get(batch)):
                view[start - position : end - position] = data

    def read_runs(self, runs: Sequence[tuple[int, int]]) -> list[Any]:
        """Bytes ``start:stop`` of each run, fetched concurrently.

        Runs that touch or nearly touch (``_MERGE_GAP``) are fetched as one
        request, and no request asks for more than ``_PART`` bytes. Every
        run's bytes are held until all have come.
        """
        spans: list[list[int]] = []
        for start, stop in sorted({(int(a), int(b)) for a, b in runs if b > a}):
            if spans and start <= spans[-1][1] + _MERGE_GAP:
                spans[-1][1] = max(spans[-1][1], stop)
            else:
                spans.append([start, stop])
        parts = [(a, min(a + _PART, stop)) for start, stop in spans for a in range(start, stop, _PART)]
        fetched = iter(self._get(parts))
        joined: list[tuple[int, memoryview]] = []
        for start, stop in spans:
            buffer = bytearray(stop - start)
            for a in range(start, stop, _PART):
                data = next(fetched)
                buffer[a - start : a - start + len(data)] = data
            joined.append((start, memoryview(buffer)))
        found: list[Any] = []
        for start, stop in runs:
            if stop <= start:
                found.append(b"")
                continue
            # The span holding the run: the last one starting at or before it.
            at, span = next(span for span in reversed(joined) if span[0] <= start)
            found.append(span[start - at : stop - at])
        return found

    def _get(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        beyond = [(a, b) for a, b in ranges if b > self.size]
        if beyond:
            a, b = beyond[0]
            raise EOFError(f"bytes {a}:{b} lie beyond the object's end ({self.size} bytes when opened)")
        try:
            gots = self.place.get_ranges("", ranges)
        except OSError as exc:
            # S3 refuses (416) a range that starts past the end: the object is shorter than it was.
            if isinstance(exc, DaskstreamError) or exc.errno != errno.EINVAL:
                raise
            raise self._changed(f"it is shorter than the {self.size} bytes it had") from None
        found = []
        for got, (start, stop) in zip(gots, ranges):
            if got.data is None:
                raise SourceRemovedError(
                    f"{self.name} was removed from the object store after it was opened; a computation over it "
                    f"cannot finish. Put it back, or {REREAD_ADVICE}"
                )
            if got.version is not None and self.version is not None and got.version != self.version:
                raise self._changed(f"version {self.version} when opened, {got.version} now")
            if (got.size is not None and got.size != self.size) or len(got.data) != stop - start:
                raise self._changed(f"{self.size} bytes when opened, {got.size} now")
            found.append(got.data)
        return found

    def _changed(self, how: str) -> SourceChangedError:
        return SourceChangedError(
            f"{self.name} changed on the object store after it was opened ({how}), so this computation "
            f"would mix old and new data; {REREAD_ADVICE}"
        )


class ObjectFile(io.RawIOBase):
    """A read-only, seekable file over an :class:`ObjectBytes`, for libraries that read through a file (h5py).

    fsspec's own file would ask for the object's size with a HEAD and check
    no version; this one knows both from the source. Small reads are served
    from blocks of ``block_size`` bytes, the least recently used let go
    beyond ``max_blocks``, so the scattered small reads of a file's metadata
    cost one GET per block, and the bytes fetched at open (``head``) none.
    Reads of a block or more go straight to ranged GETs, in parallel parts.

    A read that fails raises its own error (``SourceChangedError``...) and
    keeps it as :attr:`failure`, for a caller to whom the library reports
    it otherwise.
    """

    def __init__(self, data: ObjectBytes, head: bytes = b"", block_size: int = 256 * 2**10, max_blocks: int = 32):
        super().__init__()
        self.data = data
        self.head = head
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.failure: BaseException | None = None
        self._position = 0
        self._blocks: LeastRecentlyUsed[Any] = LeastRecentlyUsed(max_blocks)
        self._lock = threading.Lock()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.data.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        with self._lock:
            start = self._position
            n = max(0, min(len(view), self.data.size - start))
            try:
                self._fill(view[:n], start)
            except BaseException as exc:
                self.failure = exc
                raise
            self._position = start + n
        return n

    def _fill(self, view: memoryview, start: int) -> None:
        stop = start + len(view)
        if not view:
            return
        if stop <= len(self.head):
            view[:] = self.head[start:stop]
            return
        if len(view) >= self.block_size:
            self.data.read_into(view, start)
            return
        size = self.block_size
        wanted = range(start // size, (stop - 1) // size + 1)
        missing = [b for b in wanted if b not in self._blocks]
        runs = [(b * size, min((b + 1) * size, self.data.size)) for b in missing]
        fetched = dict(zip(missing, self.data.read_runs(runs)))
        for b in wanted:
            block = fetched[b] if b in fetched else self._blocks.get(b)
            assert block is not None  # kept since the check above: this file's lock is held
            lo, hi = max(start, b * size), min(stop, (b + 1) * size)
            view[lo - start : hi - start] = block[lo - b * size : hi - b * size]
        for b, data in fetched.items():
            self._blocks.put(b, data)


def read_contiguous_box(
    where: str | ObjectBytes,
    offset: int,
    file_dtype: np.dtype,
    shape: tuple[int, ...],
    fortran_order: bool,
    box: Region,
) -> np.ndarray:
    """Read ``box`` of an array of ``shape`` stored contiguously at ``offset`` of a file (its path) or an object."""
    if fortran_order:
        # An F-ordered array is the C-ordered transpose: read that and transpose back.
        block = read_contiguous_box(where, offset, file_dtype, shape[::-1], False, box[::-1])
        return block.T
    itemsize = file_dtype.itemsize
    # One contiguous byte range when, after the first axis spanning more than one index, all axes are whole.
    spanning = next((a for a, s in enumerate(box) if s.stop - s.start > 1), len(shape))
    contiguous = all(box[a] == slice(0, shape[a]) for a in range(spanning + 1, len(shape)))
    strides = _c_strides(shape, itemsize)
    start = offset + sum(s.start * st for s, st in zip(box, strides))
    out_shape = tuple(s.stop - s.start for s in box)
    if isinstance(where, ObjectBytes):
        out = np.empty(out_shape, dtype=file_dtype)
        if contiguous:
            where.read_into(out.reshape(-1).view(np.uint8).data, start)
        else:
            _copy_object_windows(where, offset, file_dtype, box, strides, out)
        return to_native(out)
    # The file may have been replaced since it was opened: a pipe in its place must not block the task.
    with open_regular(where) as f:
        if contiguous:
            out = np.empty(out_shape, dtype=file_dtype)
            # A byte view: memoryview refuses datetime, timedelta and some record dtypes. .data is the
            # array's memoryview (numpy's stubs give ndarray the buffer protocol on Python 3.12+ only).
            pread_into(f.fileno(), out.reshape(-1).view(np.uint8).data, start)
            return to_native(out)
        return _copy_from_map(f.fileno(), offset, file_dtype, box, strides)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(math.prod(shape[a + 1 :]) * itemsize for a in range(len(shape)))


def pread_into(fd: int, view: memoryview, position: int) -> None:
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done : done + _MAX_READ]], position + done)
        if n == 0:
            raise EOFError(f"file ended {total - done} bytes before the data it declares")
        done += n


def _copy_from_map(fd: int, offset: int, file_dtype: np.dtype, box: Region, strides: tuple[int, ...]) -> np.ndarray:
    out = np.empty(tuple(s.stop - s.start for s in box), dtype=file_dtype)
    for first, last, part, part_strides, target in _windows(offset, file_dtype, box, strides, out, _MAP_WINDOW):
        _copy_span(fd, first, last, file_dtype, part, part_strides, target)
    return to_native(out)


def _copy_object_windows(
    data: ObjectBytes, offset: int, file_dtype: np.dtype, box: Region, strides: tuple[int, ...], out: np.ndarray
) -> None:
    """Copy ``box`` into ``out`` from windows of its span, a batch of windows fetched at a time."""
    batch: list[tuple[int, int, Region, tuple[int, ...], np.ndarray]] = []
    held = 0
    for window in _windows(offset, file_dtype, box, strides, out, _PART):
        batch.append(window)
        held += window[1] - window[0]
        if held >= READ_BATCH_BYTES:
            _copy_fetched(data, file_dtype, batch)
            batch, held = [], 0
    _copy_fetched(data, file_dtype, batch)


def _copy_fetched(
    data: ObjectBytes, file_dtype: np.dtype, windows: list[tuple[int, int, Region, tuple[int, ...], np.ndarray]]
) -> None:
    if not windows:
        return
    fetched = data.read_runs([(first, last) for first, last, *_ in windows])
    for (_, _, part, part_strides, target), raw in zip(windows, fetched):
        target[...] = np.ndarray(
            shape=tuple(s.stop - s.start for s in part), dtype=file_dtype, buffer=raw, strides=part_strides
        )


def _windows(
    offset: int, file_dtype: np.dtype, box: Region, strides: tuple[int, ...], out: np.ndarray, limit: int
) -> Iterator[tuple[int, int, Region, tuple[int, ...], np.ndarray]]:
    """Split ``box`` into parts whose spans are at most ``limit`` bytes, splitting the slowest axes first.

    Yields ``(first byte, byte after the last, part, its strides, where it goes in out)``.
    """
    first = offset + sum(s.start * st for s, st in zip(box, strides))
    last = offset + sum((s.stop - 1) * st for s, st in zip(box, strides)) + file_dtype.itemsize
    if last - first <= limit or len(box) == 1:
        # The part's own strides, from its first byte.
        yield first, last, tuple(slice(0, s.stop - s.start) for s in box), strides, out
        return
    head = box[0]
    rows = max(1, limit // strides[0])
    for start in range(head.start, head.stop, rows):
        stop = min(start + rows, head.stop)
        part = (slice(start, stop), *box[1:])
        target = out[start - head.start : stop - head.start]
        if rows == 1 and stop - start == 1:
            # One index of the slowest axis already spans more than a window: split the next axis.
            yield from _windows(offset + start * strides[0], file_dtype, box[1:], strides[1:], target[0], limit)
        else:
            yield from _windows(offset, file_dtype, part, strides, target, limit)


def _copy_span(
    fd: int, first: int, last: int, file_dtype: np.dtype, part: Region, strides: tuple[int, ...], out: np.ndarray
) -> None:
    # Map only the span from the part's first to last byte, aligned down to a page.
    page_start = first - first % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, last - page_start, access=mmap.ACCESS_READ, offset=page_start) as mapped:
        view = np.ndarray(
            shape=tuple(s.stop - s.start for s in part),
            dtype=file_dtype,
            buffer=mapped,
            offset=first - page_start,
            strides=strides,
        )
        out[...] = view
        del view  # release the buffer before the map closes
