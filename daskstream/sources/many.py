"""Many files as one array: the paths a list or a glob pattern names, and the check that they are one family.

A family is what can be joined without guessing: one dtype, one number of
axes, and the same length on every axis but the one the files are joined
along (or on every axis, when they are stacked along a new one). The first
file that differs is named with what differs, so a stray file in a folder is
found at once rather than as a shape error deep in a computation.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import Any

from daskstream.errors import FileFamilyError, InvalidArgumentError, SourceNotFoundError
from daskstream.planning.grid import normalize_axes
from daskstream.sources.base import Source
from daskstream.sources.detect import is_url, split_dataset

GLOB_CHARACTERS = frozenset("*?[")


def names_many(path: Any) -> bool:
    """Whether ``path`` names several files: a list or tuple of paths, or a pattern no file is named by.

    >>> names_many(["a.h5", "b.h5"]), names_many("run-*.h5"), names_many("scan.h5")
    (True, True, False)
    """
    if isinstance(path, list | tuple):
        return True
    if not isinstance(path, str):
        return False
    file_part = path.partition("::")[0]
    return bool(GLOB_CHARACTERS & set(file_part)) and not os.path.exists(file_part)


def expand_paths(paths: str | Sequence[Any], storage_options: dict[str, Any] | None = None) -> list[Any]:
    """The files ``paths`` names, in the order they are joined.

    A list or tuple is taken in its own order. A pattern (``"run-*.h5"``,
    ``"s3://bucket/day-??.zarr"``, ``"scans/*.h5::/entry/data"``) is expanded
    in natural order, so ``day-2`` comes before ``day-10``; the dataset after
    ``::`` applies to every file.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ("day-10.npy", "day-2.npy", "day-1.npy"):
    ...     (folder / name).touch()
    >>> [pathlib.Path(p).name for p in expand_paths(str(folder / "day-*.npy"))]
    ['day-1.npy', 'day-2.npy', 'day-10.npy']
    """
    if isinstance(paths, list | tuple):
        if not paths:
            raise InvalidArgumentError("no files given: pass a non-empty list of paths or a pattern like 'run-*.h5'")
        return list(paths)
    pattern, dataset = split_dataset(str(paths), None)
    if is_url(pattern):
        import fsspec

        fs, _, _ = fsspec.core.get_fs_token_paths(pattern, storage_options=storage_options or {})
        found = [fs.unstrip_protocol(name) for name in fs.glob(pattern)]
    else:
        found = glob.glob(os.path.expanduser(pattern))
    if not found:
        raise SourceNotFoundError(f"{pattern}: no file matches this pattern; check the folder and the pattern")
    found.sort(key=natural_order)
    return [f"{name}::{dataset}" if dataset is not None else name for name in found]


def natural_order(name: str) -> list[Any]:
    """A sort key reading runs of digits as numbers: ``"day-2"`` before ``"day-10"``.

    >>> sorted(["f10", "f9", "f1"], key=natural_order)
    ['f1', 'f9', 'f10']
    """
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def check_family(sources: Sequence[Source], *, axis: int, stack: bool) -> int:
    """Check ``sources`` can be joined along ``axis`` (or stacked); the axis, made non-negative.

    Raises
    ------
    FileFamilyError
        Naming the first file that differs from the first one, and how.
    InvalidAxisError
        For an axis the files (or the stack) do not have.
    """
    first = sources[0]
    (axis,) = normalize_axes(axis, first.ndim + 1 if stack else first.ndim)
    for other in sources[1:]:
        what = _difference(first, other, axis, stack)
        if what:
            how = "stacked" if stack else f"joined along axis {axis}"
            raise FileFamilyError(
                f"{other.name}: {what}, so it cannot be {how} with {first.name}; "
                "leave it out of the list or pattern, or open it on its own"
            )
    return axis


def _difference(first: Source, other: Source, axis: int, stack: bool) -> str:
    """What keeps ``other`` from joining ``first`` ('' when nothing does)."""
    if other.dtype != first.dtype:
        return f"its dtype is {other.dtype}, not {first.dtype}"
    if other.ndim != first.ndim:
        return f"it has {other.ndim} axes (shape {other.shape}), not {first.ndim} (shape {first.shape})"
    for index, (length, expected) in enumerate(zip(other.shape, first.shape, strict=True)):
        if length != expected and (stack or index != axis):
            return f"its shape is {other.shape}, not {first.shape} (axis {index}: {length}, not {expected})"
    return ""
