"""What was measured on this machine and remembered: tuning winners and observations, codec limits and choices.

One JSON file, the tuning cache (``daskstream.tune.cache``; ``"auto"`` puts it in the user's
cache folder). It is read as data only, written whole to a temporary file
and renamed into place, under a lock file so that two processes tuning at
once do not lose each other's entries. A file that cannot be parsed (not
JSON, not UTF-8, or nested too deeply for the parser) is treated as empty
(with a :class:`~daskstream.errors.TuneCacheWarning`) and never replaced: a
path set by mistake to a data file loses nothing.

Entries are keyed by what decides the best chunks, not by the file's path:
format, storage layout and codecs, the storage unit, dtype, the work, the
scheduler kind, threads and workers, and a fingerprint of this machine. A
second file of the same kind therefore reuses the first one's result.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from daskstream import config
from daskstream.errors import TargetExistsError, TuneCacheWarning, warn
from daskstream.files import open_regular
from daskstream.runtime.resources import _usable_cpus, last_level_cache_bytes
from daskstream.safe_writes import check_replaceable, written_whole

VERSION = 1
# Observations kept per entry: the most recent ones, one per chunk shape.
MAX_OBSERVATIONS = 32
# A cache far larger than any daskstream writes is not one: not read whole into memory.
MAX_CACHE_BYTES = 64 << 20


def cache_path() -> Path:
    """Where the cache lives: setting ``daskstream.tune.cache``, else ``$XDG_CACHE_HOME/daskstream/tune.json``."""

    where = config.get("tune.cache")
    if where in (None, "auto"):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "daskstream" / "tune.json"
    return Path(os.path.expanduser(os.fspath(where)))


@functools.cache
def machine_fingerprint() -> str:
    """A short hash of what makes this machine fast or slow: CPU model and count, memory, cache size.

    >>> len(machine_fingerprint())
    12
    """

    model = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    facts = [
        platform.machine(),
        model,
        _usable_cpus(),
        round(psutil.virtual_memory().total / 2**30),
        last_level_cache_bytes() or 0,
    ]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:12]


def key_text(key: dict[str, Any]) -> str:
    """The canonical text of a key (sorted JSON), as the file stores it."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


class TuneCache:
    """The cache file at ``path`` (default: :func:`cache_path`)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else cache_path()

    def __repr__(self) -> str:
        return f"<daskstream TuneCache {str(self.path)!r}>"

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every entry, by key text."""
        try:
            return self._read()
        except _NotACache as exc:
            warn(
                f"{self.path}: the tuning cache cannot be read ({exc}); it is treated as empty, and that file is "
                "left as it is. Set daskstream.tune.cache to another file, or move it away.",
                TuneCacheWarning,
            )
            return {}

    def _read(self) -> dict[str, dict[str, Any]]:
        """The entries, or :class:`_NotACache` when a file is there that is not a tuning cache."""
        try:
            # A pipe or device in the cache's place would block the read: refused as unreadable.
            with open_regular(os.fspath(self.path)) as f:
                data = json.loads(f.read(MAX_CACHE_BYTES + 1).decode("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            # RecursionError: JSON nested deeper than the parser's stack (a damaged or planted file).
            reason = "it nests too deeply" if isinstance(exc, RecursionError) else exc
            raise _NotACache(str(reason)) from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) or "version" not in data:
            raise _NotACache("it is not a tuning cache daskstream wrote")
        if data["version"] != VERSION:
            return {}  # another version's cache: its entries are not this one's, and it is replaced
        return data["entries"]

    def get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The entry for ``key``, or ``None``."""
        return self.entries().get(key_text(key))

    def put(self, key: dict[str, Any], winner: dict[str, Any]) -> None:
        """Remember a tuning's ``winner`` (and what it measured) for ``key``, keeping its observations."""
        with self._editing() as entries:
            entry = entries.setdefault(key_text(key), {"key": key})
            entry["tuned"] = winner

    def observe(self, key: dict[str, Any], observation: dict[str, Any]) -> None:
        """Add what a real computation showed for ``key`` (one per chunk shape, newest kept)."""
        with self._editing() as entries:
            entry = entries.setdefault(key_text(key), {"key": key})
            kept = [o for o in entry.get("observations", []) if o.get("chunks") != observation.get("chunks")]
            entry["observations"] = [*kept, observation][-MAX_OBSERVATIONS:]

    def adapted(self, key: dict[str, Any], setting: dict[str, Any]) -> None:
        """Remember the setting an adaptive run chose for ``key`` (the next adaptive run starts from it)."""
        with self._editing() as entries:
            entry = entries.setdefault(key_text(key), {"key": key})
            entry["adaptive"] = setting

    def clear(self) -> int:
        """Remove every entry; returns how many there were.

        Raises
        ------
        TargetExistsError
            When a file is at the cache's place that is not a tuning cache:
            it is not daskstream's to empty.
        """
        with self._editing(strict=True) as entries:
            count = len(entries)
            entries.clear()
        return count

    @contextlib.contextmanager
    def _editing(self, *, strict: bool = False) -> Iterator[dict[str, dict[str, Any]]]:
        """The entries to change, written back whole under the lock; nothing written over a file of another kind.

        The cache's place may be set to any path: a file there that is not a
        tuning cache (a data file named by mistake) is never replaced, and the
        change is not saved (:class:`~daskstream.errors.TuneCacheWarning`; with
        ``strict``, a :class:`~daskstream.errors.TargetExistsError`).
        """
        option = f"the tuning cache {self.path}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115 - held to the end
        except OSError as exc:
            warn(
                f"{self.path}: the tuning cache cannot be written ({exc.strerror}); nothing is saved", TuneCacheWarning
            )
            yield {}
            return
        with lock:
            _lock_exclusively(lock)
            try:
                entries = self._read()
                check_replaceable(os.fspath(self.path), folder=False, is_own=lambda _: False, option=option)
            except (_NotACache, TargetExistsError) as exc:
                reason = exc if isinstance(exc, _NotACache) else "a folder or a device is there"
                if strict:
                    raise TargetExistsError(
                        f"{self.path}: the tuning cache cannot be read ({reason}); daskstream empties only a cache "
                        "it wrote, so nothing was removed: move the file away yourself, or set "
                        "daskstream.tune.cache to another file"
                    ) from None
                warn(
                    f"{self.path}: the tuning cache cannot be read ({reason}); this result is not saved, and that "
                    "file is left as it is. Set daskstream.tune.cache to another file, or move it away.",
                    TuneCacheWarning,
                )
                yield {}
                return
            yield entries
            place = os.fspath(self.path)
            with written_whole(place, folder=False, is_own=lambda _: False, option=option) as temporary:
                Path(temporary).write_text(json.dumps({"version": VERSION, "entries": entries}, indent=1, default=str))


class _NotACache(Exception):
    """A file is at the cache's place that is not a tuning cache; the reason is the message."""


def _lock_exclusively(lock: Any) -> None:
    """Hold ``lock`` (an open file) exclusively until it is closed, where the system has such locks.

    POSIX systems have ``fcntl``; elsewhere two processes tuning at once may
    lose one of their entries, never the file: it is replaced by an atomic rename.
    """
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(lock, fcntl.LOCK_EX)
