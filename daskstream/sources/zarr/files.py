"""Where a Zarr array's chunk bytes come from: files of a directory, objects of a store, members of a zip.

Each fetcher gives a box's chunk (or shard) bytes in turn, checked on the way:
a chunk written after the source was opened is a :class:`SourceChangedError`,
a missing one reads as the fill value, and one larger than the array's codecs
can store a chunk in (:func:`~daskstream.sources.zarr.bounds.largest_chunk_file`)
is refused before it is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

from daskstream.errors import CorruptSourceError, DaskstreamError, SourceChangedError, SourceRemovedError
from daskstream.files import open_regular
from daskstream.sources.base import REREAD_ADVICE, Region, file_stamp, storage_pieces
from daskstream.sources.zarr.bounds import check_chunk_size
from daskstream.sources.zip_members import ZipMembers


class LocalChunkFiles:
    """Chunk files in an array's directory, each read with one system call.

    A file changed after the source was opened, or one missing where its
    folder changed since then (deleted, in a format 3 store whose nested
    ``c/i/j`` folders no stamp covers), raises :class:`SourceChangedError`.
    """

    whole_when_covered = False  # a shard read by runs holds no more than one run: as fast from the page cache

    def __init__(self, root: str, largest: int | None = None) -> None:
        self.root = root
        self.largest = largest

    def fetch_each(
        self, keys: list[str], name: str, written_before_ns: int | None
    ) -> Iterator[tuple[int, bytes | None]]:
        """Each chunk file's bytes in turn, ``(position in keys, bytes or None for a missing chunk)``: one
        file is held at a time, none larger than ``largest``."""
        for position, key in enumerate(keys):
            with self.open_shard(key, name, written_before_ns) as shard:
                yield position, None if shard is None else shard.whole()

    @contextlib.contextmanager
    def open_shard(self, key: str, name: str, written_before_ns: int | None) -> Iterator[LocalShard | None]:
        """The chunk (or shard) file at ``key``, open and checked, to read whole or by range; ``None`` for a
        chunk never written."""
        try:
            f = open_regular(os.path.join(self.root, key))
        except (FileNotFoundError, NotADirectoryError):
            if written_before_ns is not None and self._folder_changed(key, written_before_ns):
                raise SourceRemovedError(
                    f"{name}: chunk {key!r} is missing and its folder changed after the store was opened "
                    f"(a chunk deleted or replaced meanwhile); {REREAD_ADVICE}"
                ) from None
            yield None  # Zarr: a chunk never written is the fill value
            return
        except IsADirectoryError:
            raise CorruptSourceError(
                f"{name}: chunk {key!r} is a directory, not a chunk file; the store is damaged"
            ) from None
        with f:
            st = os.fstat(f.fileno())
            if written_before_ns is not None and _written_since(st, written_before_ns):
                raise _written_error(name, key)
            check_chunk_size(name, key, st.st_size, self.largest)
            yield LocalShard(f, st.st_size)

    def _folder_changed(self, key: str, since_ns: int) -> bool:
        """Whether the nearest existing folder of a missing chunk file changed after ``since_ns``."""
        folder = posixpath.dirname(key)
        while True:
            try:
                st = os.stat(os.path.join(self.root, folder))
            except (FileNotFoundError, NotADirectoryError):
                if not folder:
                    return True  # the array's folder itself is gone
                folder = posixpath.dirname(folder)
                continue
            return _written_since(st, since_ns)


class LocalShard:
    """An open chunk or shard file, read whole or by byte range (``os.pread``: no shared file position, so
    tasks may read one file at once)."""

    identity = None  # a local index costs one system call to read again: nothing is kept

    def __init__(self, file: Any, size: int) -> None:
        self.file = file
        self.size = size

    def whole(self) -> bytes:
        return self.file.read()

    def read(self, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
        fd = self.file.fileno()
        for position, (start, stop) in enumerate(ranges):
            yield position, os.pread(fd, stop - start, start)


class ObjectShard:
    """A shard object as listed when its array was opened, read by ranges fetched concurrently; each response's
    version and size are checked against the listing's."""

    def __init__(self, objects: ChunkObjects, key: str, name: str, version: str, size: int) -> None:
        self.objects, self.key, self.name, self.version, self.size = objects, key, name, version, size
        self.identity = (key, version)  # the index of this version of the object, kept by the reader

    def read(self, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
        try:
            gots = self.objects.place.get_ranges(self.key, ranges)
        except OSError as exc:
            # A range within the size listed that the store cannot satisfy: the object is shorter now.
            if isinstance(exc, DaskstreamError) or exc.errno != errno.EINVAL:
                raise
            raise self._changed("shorter than when opened") from exc
        for position, got in enumerate(gots):
            if got.data is None:
                raise _deleted_error(self.name, self.key)
            if (got.version is not None and got.version != self.version) or got.size not in (None, self.size):
                raise self._changed(f"version {self.version} when opened, {got.version} now")
            yield position, got.data

    def _changed(self, how: str) -> SourceChangedError:
        return _object_written_error(self.name, self.key, f"rewritten ({how})")


class ChunkObjects:
    """Chunk (or shard) objects of an array on an object store, fetched concurrently with their versions.

    Parameters
    ----------
    place
        The array's prefix (:class:`~daskstream.sources.objects.places.Place`).
    versions
        ``versions()`` returns each object's version when the source was
        listed (key relative to the array -> version). A read object whose
        version differs, one missing that was listed, or one listed nowhere,
        raises :class:`SourceChangedError`.
    """

    whole_when_covered = True  # one GET for a shard wanted whole, not one for its index and more for its runs

    def __init__(
        self, place: Any, versions: Callable[[], dict[str, str]], sizes: Callable[[], dict[str, int]] | None = None
    ) -> None:
        self.place = place
        self.versions = versions
        self.sizes = sizes
        self.root = place.url
        self.largest: int | None = None  # the most bytes a chunk object may hold, once the array is known

    def fetch_each(
        self, keys: list[str], name: str, written_before_ns: int | None
    ) -> Iterator[tuple[int, bytes | None]]:
        """Each object's bytes as it arrives, ``(position in keys, bytes or None)``: the caller decodes one
        while the others are on their way."""
        listed = self.versions()
        sizes = self.sizes() if self.sizes is not None else {}
        for position, got in self.place.get_each(keys, sizes=[sizes.get(key) for key in keys]):
            key = keys[position]
            expected = listed.get(key)
            if got.data is None and expected is not None:
                raise _deleted_error(name, key)
            if got.data is not None and (expected is None or (got.version is not None and got.version != expected)):
                how = (
                    "written" if expected is None else f"rewritten (version {expected} when opened, {got.version} now)"
                )
                raise _object_written_error(name, key, how)
            if got.data is not None:
                check_chunk_size(name, key, len(got.data), self.largest)
            yield position, got.data

    @contextlib.contextmanager
    def open_shard(self, key: str, name: str, written_before_ns: int | None) -> Iterator[ObjectShard | None]:
        """The shard object at ``key`` as listed, to read by range; one not listed (never written, or written
        since) is fetched whole, which tells the two apart."""
        version, size = self.versions().get(key), (self.sizes() if self.sizes is not None else {}).get(key)
        if version is None or size is None:
            ((_, data),) = self.fetch_each([key], name, written_before_ns)
            if data is not None:  # pragma: no cover - fetch_each refuses an object not listed
                raise _written_error(name, key)
            yield None
            return
        check_chunk_size(name, key, size, self.largest)
        yield ObjectShard(self, key, name, version, size)


class ZipChunkFiles:
    """Chunk (or shard) members of an array in a zip file, each read within ``largest`` bytes.

    Parameters
    ----------
    members
        The zip file's members (:class:`~daskstream.sources.zip_members.ZipMembers`).
    prefix
        The array's path inside the zip.
    largest
        The most bytes one member may declare.
    """

    def __init__(self, members: ZipMembers, prefix: str, largest: int) -> None:
        self.members = members
        self.prefix = prefix.strip("/")
        self.largest = largest
        self.root = f"{members.path}::{self.prefix}"

    def fetch_each(
        self, keys: list[str], name: str, written_before_ns: int | None
    ) -> Iterator[tuple[int, bytes | None]]:
        """Each member's bytes in turn (``None`` for a chunk never written); the zip's own stamp covers changes."""
        for position, key in enumerate(keys):
            yield position, self.members.read(posixpath.join(self.prefix, key) if self.prefix else key, self.largest)


def check_chunk_files(
    root: str,
    chunk_key: Callable[[tuple[int, ...]], str],
    storage_chunks: tuple[int, ...],
    box: Region,
    name: str,
    written_before_ns: int,
    largest: int | None = None,
) -> None:
    """Check the chunk files ``box`` reads before zarr reads them: regular files, none written since opening,
    none larger than ``largest``.

    For arrays zarr reads itself (transposed, or codecs decoded only by
    zarr): chunk files deep in a store change no metadata or directory the
    source stamps, and a named pipe in a chunk's place would block zarr's read
    forever.
    """
    for grid, _, _ in storage_pieces(box, storage_chunks):
        key = chunk_key(grid)
        path = os.path.join(root, key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue  # never written: the fill value
        if not stat.S_ISREG(st.st_mode):
            file_stamp(path)  # raises NotARegularFileError naming the kind
            raise CorruptSourceError(f"{name}: chunk {key!r} is a directory, not a chunk file; the store is damaged")
        if _written_since(st, written_before_ns):
            raise _written_error(name, key)
        check_chunk_size(name, key, st.st_size, largest)


def _written_since(st: os.stat_result, since_ns: int) -> bool:
    """Whether the file was written or replaced after ``since_ns``.

    The change time, not the modification time: a chunk replaced by a copy
    that keeps an older modification time (``cp -p``, ``rsync -a``) still gets
    a new change time, and a modification time in the future (a copy from a
    machine whose clock runs ahead) tells nothing.
    """
    return since_ns < st.st_ctime_ns <= time.time_ns()


def _object_written_error(name: str, key: str, how: str) -> SourceChangedError:
    """A chunk object ``how`` ("written", "rewritten (...)") since its store was opened."""
    return SourceChangedError(
        f"{name}: chunk object {key!r} was {how} after the store was opened, so this computation would mix "
        f"old and new data; {REREAD_ADVICE}"
    )


def _deleted_error(name: str, key: str) -> SourceRemovedError:
    return SourceRemovedError(f"{name}: chunk object {key!r} was deleted after the store was opened; {REREAD_ADVICE}")


def _written_error(name: str, key: str) -> SourceChangedError:
    return SourceChangedError(
        f"{name}: chunk {key!r} was written after the store was opened, so this "
        f"computation would mix old and new data; {REREAD_ADVICE}"
    )
