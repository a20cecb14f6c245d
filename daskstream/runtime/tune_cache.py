"""The tuning cache: winners, observations and codec choices, remembered per kind of data and machine.

One JSON file (``daskstream.tune.cache``; ``"auto"`` puts it in the user's
cache folder). It is read as data only, written whole to a temporary file
and renamed into place, under a lock file so that two processes tuning at
once do not lose each other's entries. A file that cannot be parsed (not
JSON, not UTF-8, or nested too deeply for the parser) is treated as empty
(with a :class:`~daskstream.errors.TuneCacheWarning`) and replaced on the
next write.

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
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from daskstream import config
from daskstream.errors import TuneCacheWarning, warn
from daskstream.files import open_regular
from daskstream.runtime.resources import _usable_cpus, last_level_cache_bytes

VERSION = 1
# Observations kept per entry: the most recent ones, one per chunk shape.
MAX_OBSERVATIONS = 32


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
            # A pipe or device in the cache's place would block the read: refused as unreadable.
            with open_regular(os.fspath(self.path)) as f:
                data = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            # RecursionError: JSON nested deeper than the parser's stack (a damaged or planted file).
            reason = "it nests too deeply" if isinstance(exc, RecursionError) else exc
            warn(
                f"{self.path}: the tuning cache cannot be read ({reason}); it is treated as empty and will be "
                "replaced. Run `daskstream tune --clear` to remove it.",
                TuneCacheWarning,
            )
            return {}
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
            return {}
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
        """Remove every entry; returns how many there were."""
        with self._editing() as entries:
            count = len(entries)
            entries.clear()
        return count

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            _lock_exclusively(lock)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TuneCacheWarning)
                entries = self.entries()
            yield entries
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".tune-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"version": VERSION, "entries": entries}, f, indent=1, default=str)
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise


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
