"""A cluster file's dotted keys (``distributed.comm.timeouts.connect: 5s``) spread into sections.

dask.config.set reads ``a.b: 1`` as ``a: {b: 1}`` and ``a_b`` as ``a-b``:
:func:`sections` spreads a file's document the same way, once, so that the
screen of :mod:`~daskstream.runtime.clusters.rules`, the kind's options and
dask.config.set all see the same settings, and refuses one setting written twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from daskstream.errors import InvalidArgumentError

__all__ = ["sections"]


def _canonical(key: str) -> str:
    # dask treats "pre_spawn_environ" and "pre-spawn-environ" as one setting.
    return key.replace("_", "-")


def sections(document: dict, path: Path) -> dict:
    """The document with dotted keys spread into sections, as dask.config.set would read it.

    Every reader of the settings (the screen, the kind's options, dask.config.set)
    then sees the same settings. Keys that are not text, and one setting
    written twice (``a.b`` and ``a: {b: }``, or ``a_b`` and ``a-b``), are refused.
    daskstream's own setting names are spelled with dashes from here on.
    """
    out: dict = {}
    written: dict[str, tuple[str, bool]] = {}  # canonical name -> (as written, is a section)
    for dotted, value in _document_leaves(document, path):
        parts = dotted.split(".")
        if "" in parts:
            raise InvalidArgumentError(
                f"cluster configuration {path}: key {dotted!r} has an empty part; write sections.like.this"
            )
        if parts[0] == "daskstream":
            # Section and option names; the keyword arguments under daskstream.ssh keep their spelling.
            parts[:3] = [_canonical(part) for part in parts[:3]]
        canonical = [_canonical(part) for part in parts]
        for end in range(1, len(parts) + 1):
            name = ".".join(canonical[:end])
            section = end < len(parts)
            before = written.get(name)
            if before is not None and not (section and before[1]):
                raise InvalidArgumentError(
                    f"cluster configuration {path} sets {'.'.join(parts[:end])!r} twice (also as {before[0]!r}); "
                    "keep one of them"
                )
            written.setdefault(name, (".".join(parts[:end]), section))
        place = out
        for part in parts[:-1]:
            place = place.setdefault(part, {})
        place[parts[-1]] = value
    return out


def _document_leaves(document: Mapping, path: Path, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in document.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(
                f"cluster configuration {path}: key {key!r} under {prefix.rstrip('.') or 'the top level'} is not "
                "text (YAML reads yes, no, on, off, null and numbers as values); quote it"
            )
        if isinstance(value, Mapping) and value:
            yield from _document_leaves(value, path, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
