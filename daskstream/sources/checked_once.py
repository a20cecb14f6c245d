"""Sources a task reads piece by piece, each checked unchanged once rather than around every piece.

:meth:`daskstream.Source.read` checks on both sides of a read that the data
on disk is still what was opened (a stamp: sizes and modification times,
several system calls for a Zarr store). A task streaming a span reads its
source one storage chunk at a time: checked around each, the checks cost
about a tenth of decoding a 1 MiB zstd chunk. Read through a
:class:`CheckedOnce`, a source is checked before its first piece, its pieces
are read without, and :meth:`CheckedOnce.check` checks it once more after
the last: whoever makes one calls it once the task's reads are done. The chunk files themselves are still checked as
each is read, where a format does (Zarr's chunk files, for instance, against
the time the source was opened).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_unchecked = threading.local()


def is_unchecked(source: Any) -> bool:
    """Whether reads of ``source`` in this thread skip their own checks: a :class:`CheckedOnce` checks it."""
    return id(source) in getattr(_unchecked, "ids", ())


@contextlib.contextmanager
def _reading_unchecked(source: Any) -> Iterator[None]:
    held: frozenset[int] = getattr(_unchecked, "ids", frozenset())
    _unchecked.ids = held | {id(source)}
    try:
        yield
    finally:
        _unchecked.ids = held


class CheckedOnce:
    """Reads of the sources of one task: each source checked unchanged before its first read and by
    :meth:`check` after the last, not around every read."""

    def __init__(self) -> None:
        self._read: dict[int, Any] = {}

    def read(self, source: Any, region: Any) -> Any:
        """``source[region]``, ``source`` checked unchanged before the first time it is read here."""
        if not hasattr(source, "check_unchanged"):  # not a Source (a kernel's regions): read as it is
            return source[region]
        if id(source) not in self._read:
            source.check_unchanged()
            self._read[id(source)] = source
        with _reading_unchecked(source):
            return source[region]

    def check(self) -> None:
        """Check every source read here once more: what was read after the first piece is as opened."""
        for source in self._read.values():
            source.check_unchanged()


__all__ = ["CheckedOnce", "is_unchecked"]
