"""Reading image files: their tables, their bytes by ``os.pread``, and the threads a read decodes on.

A table (:class:`FolderFiles`, :class:`TarMembers`) is what an image source
holds of its files: names, stamps, a tar's offsets; never an open file, so
the source travels to worker processes. :func:`run_parallel` runs a read's
decodes on the reading thread and helper threads this process shares among
its reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError, SourceChangedError, SourceRemovedError
from daskstream.files import open_regular
from daskstream.sources.base import REREAD_ADVICE

# The fields of os.stat a file's stamp keeps (base.file_stamp's), compared at every read of it.
_STAMP_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_dev", "st_ino")


def read_exactly(fd: int, offset: int, size: int, where: str) -> bytes:
    """``size`` bytes of ``fd`` from ``offset``, with ``os.pread`` (no shared file position: threads read at once)."""
    data = os.pread(fd, size, offset)
    while len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise CorruptSourceError(
                f"{where}: ends {size - len(data)} bytes early (it was cut short since it was opened); {REREAD_ADVICE}"
            )
        data += more
    return data


class Window(io.RawIOBase):
    """``size`` bytes of an open file from ``offset``, as a seekable file that reads with ``os.pread``.

    Pillow reads an image's header through it (wrapped in a buffer), a tar
    member's as a plain file's, without copying the member out first.
    """

    def __init__(self, fd: int, offset: int, size: int) -> None:
        super().__init__()
        self.fd, self.offset, self.size, self.position = fd, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.size - self.position))
        if n == 0:
            return 0
        data = os.pread(self.fd, n, self.offset + self.position)
        view[: len(data)] = data
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position


def stamp_of(st: os.stat_result) -> tuple[int, ...]:
    """What identifies a file's contents (:func:`~daskstream.sources.base.file_stamp`'s fields) from its stat."""
    return tuple(int(getattr(st, name)) for name in _STAMP_FIELDS)


class FolderFiles:
    """Image files on disk: a folder, their names relative to it, and each file's stamp when it was checked.

    Every read of a file compares its stamp (size, modification and change
    times, device and inode: :func:`~daskstream.sources.base.file_stamp`'s)
    on the descriptor it reads, before and after, so a file changed since
    it was opened is a :class:`~daskstream.errors.SourceChangedError` naming
    it, and checking costs nothing for the files a read does not touch.
    """

    def __init__(self, root: str, names: Sequence[str], stamps: np.ndarray) -> None:
        self.root = root
        self.names = tuple(names)
        self.stamps = np.asarray(stamps, dtype=np.int64).reshape(len(self.names), len(_STAMP_FIELDS))

    def __len__(self) -> int:
        return len(self.names)

    def where(self, i: int) -> str:
        return os.path.join(self.root, *self.names[i].split("/"))

    @property
    def largest(self) -> int:
        """Bytes of the largest file."""
        return int(self.stamps[:, 0].max()) if len(self) else 0

    def stamp(self) -> tuple[Any, ...] | None:
        """``None``: the files are checked one by one as they are read, not all at every read."""
        return None

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """What reads share: nothing, each opens its own file."""
        yield None

    def read(self, i: int, shared: Any = None) -> bytes:
        """The bytes of file ``i``, as they were when it was opened.

        Raises
        ------
        SourceChangedError, SourceRemovedError
            When the file changed, or is gone, since it was opened.
        """
        path = self.where(i)
        expected = tuple(int(v) for v in self.stamps[i])
        try:
            f = open_regular(path)
        except FileNotFoundError:
            raise SourceRemovedError(
                f"{path} was removed after it was opened; a computation over it cannot finish. Put it back, or "
                f"{REREAD_ADVICE}"
            ) from None
        with f:
            fd = f.fileno()
            self._check(path, stamp_of(os.fstat(fd)), expected)
            data = read_exactly(fd, 0, expected[0], path)
            self._check(path, stamp_of(os.fstat(fd)), expected)  # written to while it was read
        return data

    @staticmethod
    def _check(path: str, now: tuple[int, ...], expected: tuple[int, ...]) -> None:
        if now != expected:
            raise SourceChangedError(
                f"{path} changed on disk after it was opened (its size, modification time or metadata differ), "
                f"so this computation would mix old and new data; {REREAD_ADVICE}"
            )

    def token_parts(self) -> bytes:
        """What the source's token hashes: every name and stamp."""
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(self.root.encode("utf-8", "surrogateescape"))
        for name in self.names:
            digest.update(b"\0" + name.encode("utf-8", "surrogateescape"))
        digest.update(self.stamps.tobytes())
        return digest.digest()


class TarMembers:
    """Images in one tar file: each member's name, and where its bytes lie.

    The tar file's own stamp is checked at every read (the base protocol's
    :meth:`~daskstream.Source.check_unchanged`): a member cannot change
    without the file changing.
    """

    def __init__(
        self, path: str, names: Sequence[str], offsets: Sequence[int], sizes: Sequence[int], stamp: tuple[int, ...]
    ) -> None:
        self.root = path
        self.names = tuple(names)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.tar_stamp = stamp

    def __len__(self) -> int:
        return len(self.names)

    def where(self, i: int) -> str:
        return f"{self.root}::{self.names[i]}"

    @property
    def largest(self) -> int:
        return int(self.sizes.max()) if len(self) else 0

    def stamp(self) -> tuple[Any, ...] | None:
        return self.tar_stamp

    @contextlib.contextmanager
    def reading(self) -> Iterator[int]:
        """The tar file, opened once for every member a read takes (``os.pread`` needs no lock)."""
        with open_regular(self.root) as f:
            yield f.fileno()

    def read(self, i: int, shared: Any = None) -> bytes:
        """The bytes of member ``i``; ``shared`` is the descriptor :meth:`reading` gave."""
        if shared is None:
            with self.reading() as fd:
                return self.read(i, fd)
        return read_exactly(shared, int(self.offsets[i]), int(self.sizes[i]), self.where(i))

    def token_parts(self) -> bytes:
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(repr((self.root, self.tar_stamp)).encode("utf-8", "surrogateescape"))
        for name in self.names:
            digest.update(b"\0" + name.encode("utf-8", "surrogateescape"))
        digest.update(self.offsets.tobytes() + self.sizes.tobytes())
        return digest.digest()


# Helper threads running in this process, over all reads: a read starts only as many as keep the total
# within its ``threads - 1``, so many reads at once (dask's threads, a stream's) add few threads to theirs.
_helpers_lock = threading.Lock()
_helpers_running = 0


def run_parallel(count: int, work: Callable[[int], None], threads: int) -> None:
    """Call ``work(i)`` for each ``i`` in ``range(count)``: on this thread, joined by up to ``threads - 1`` helpers.

    The calling thread takes items too, so a read makes progress whatever
    else runs; helper threads join it while fewer than ``threads - 1`` run in
    this process (other reads' included), each taking the next item until none
    is left, and end with the call: nothing outlives it, no pool is kept, and
    a forked child inherits none. The first error is raised here once every
    helper has stopped (they write into the caller's array, which must outlive
    them); the others stop taking items.

    >>> seen = []
    >>> run_parallel(5, seen.append, threads=3)
    >>> sorted(seen)
    [0, 1, 2, 3, 4]
    """
    global _helpers_running
    with _helpers_lock:
        helpers = max(0, min(threads - 1 - _helpers_running, count - 1))
        _helpers_running += helpers
    if not helpers:
        for i in range(count):
            work(i)
        return
    lock = threading.Lock()
    taken = 0
    stop = threading.Event()  # set on the first error, and once the caller is done: no item is taken after
    errors: list[BaseException] = []

    def drain() -> None:
        nonlocal taken
        while not stop.is_set():
            with lock:
                i, taken = taken, taken + 1
            if i >= count:
                return
            try:
                work(i)
            except BaseException as exc:  # (carried to the caller, and raised there)
                stop.set()
                errors.append(exc)
                return

    def helper() -> None:
        global _helpers_running
        try:
            drain()
        finally:
            with _helpers_lock:
                _helpers_running -= 1

    started = []
    try:
        for _ in range(helpers):
            thread = threading.Thread(target=helper, name="daskstream-images", daemon=True)
            thread.start()
            started.append(thread)
        drain()
    finally:
        stop.set()
        with _helpers_lock:
            _helpers_running -= helpers - len(started)  # (those that never started)
        for thread in started:
            thread.join()
    if errors:
        raise errors[0]


def _forget_helpers_in_child() -> None:
    # A forked child has none of its parent's threads, and perhaps a lock one of them held.
    global _helpers_lock, _helpers_running
    _helpers_lock = threading.Lock()
    _helpers_running = 0


os.register_at_fork(after_in_child=_forget_helpers_in_child)


__all__ = ["FolderFiles", "TarMembers", "Window", "read_exactly", "run_parallel", "stamp_of"]
