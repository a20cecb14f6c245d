"""Many files as one array: the paths a list or a glob pattern names, and the check that they are one family.

A family is what can be joined without guessing: one dtype, one number of
axes, and the same length on every axis but the one the files are joined
along (or on every axis, when they are stacked along a new one). The first
file that differs is named with what differs, so a stray file in a folder is
found at once rather than as a shape error deep in a computation.

Opening ten thousand files must not cost ten thousand full opens. The first
file is opened in full; each other local HDF5 file of the family is a
:class:`FamilyMember`, opened on what proves it belongs -- its size equal to
the first file's and the HDF5 signature at its start, or, where its size
differs, its dataset's shape and dtype read from its header -- and opened in
full, and checked again, at its first read in each process. A file whose full
metadata then differs from what it was opened as is a
:class:`~daskstream.errors.FileFamilyError` naming it and what differs, never
a wrong answer.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from daskstream.advice import said
from daskstream.errors import (
    FileFamilyError,
    InvalidArgumentError,
    MemberNotFoundError,
    SourceNotFoundError,
)
from daskstream.files import open_regular
from daskstream.planning.grid import normalize_axes
from daskstream.sources import open_source
from daskstream.sources.base import Region, Source, checked_path, file_stamp, now_ns
from daskstream.sources.detect import is_url, split_dataset
from daskstream.sources.handles import cached_handle
from daskstream.sources.hdf5.headers import dataset_header, is_plain
from daskstream.sources.hdf5.source import HDF5_MAGIC, Hdf5Source
from daskstream.sources.tokens import source_token
from daskstream.sources.zarr.source import local_path

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


def family_sources(
    paths: str | Sequence[Any], *, dataset: str | None, storage_options: dict[str, Any] | None
) -> list[Source]:
    """The sources of the files ``paths`` names: the first opened in full, the others as members of its family.

    Where the first is a plain local HDF5 dataset (numbers or fixed-width
    bytes, its data in the file itself), each other local file is a
    :class:`FamilyMember`: of the first file's shape and dtype when its size is
    the first file's and it starts with the HDF5 signature, else of the shape
    and dtype its header states. Anything else (an open :class:`Source`, a
    URL, another format, a header that does not read) is opened in full.
    """
    items = expand_paths(paths, storage_options)
    first = items[0] if isinstance(items[0], Source) else open_source(
        items[0], dataset=dataset, storage_options=storage_options
    )  # fmt: skip
    family = first if _founds_family(first) else None
    sources = [first]
    for item in items[1:]:
        member: Source | None = None
        if family is not None and not isinstance(item, Source):
            member = FamilyMember.of(item, dataset, family)
        if member is None:
            member = item if isinstance(item, Source) else open_source(
                item, dataset=dataset, storage_options=storage_options
            )  # fmt: skip
        sources.append(member)
    return sources


def _founds_family(source: Source) -> bool:
    """Whether files like ``source`` can be opened as its :class:`FamilyMember`: a plain dataset of a local HDF5
    file, its data in that file (no links to others) and no element axes folded into its shape."""
    return (
        isinstance(source, Hdf5Source)
        and source.object is None
        and not source.linked_files
        and not source.strings
        and source.element_ndim == 0
        and is_plain(source.dtype)
        and source.stamp is not None
    )


class FamilyMember(Source):
    """A dataset of a local HDF5 file of a family: described at open by what proves it belongs, checked in full
    at its first read.

    Its shape and dtype are what its open found (the first file's, for a file
    of the same size; its header's otherwise); its storage (chunks, layout,
    filters) is taken as the first file's for planning. The first read of it in
    each process opens the file in full (:func:`~daskstream.sources.open_source`)
    and compares: a shape, dtype -- or, with ``dims``, dimension names -- other
    than those it was opened with is a :class:`~daskstream.errors.FileFamilyError`
    naming the file and what differs. Reads then go through that full source.
    Like every source it holds no file handle, so it travels in task graphs;
    its token is the one a full open of the same unchanged file gives.

    Parameters
    ----------
    path, dataset
        The local file and the dataset's path in it.
    like
        The first file's source, whose storage it is planned as.
    shape, dtype
        What it was opened as.
    stamp
        The file's :func:`~daskstream.sources.base.file_stamp` at open.
    dims
        Dimension names its full metadata must state (``None``: not checked).
    """

    format = "hdf5"
    linked_files: tuple[Any, ...] = ()

    def __init__(
        self,
        path: str,
        dataset: str,
        *,
        like: Source,
        shape: tuple[int, ...],
        dtype: np.dtype,
        stamp: tuple[int, ...],
        dims: tuple[str | None, ...] | None = None,
    ) -> None:
        self.path = path
        self.dataset = dataset
        self.shape = shape
        self.dtype = dtype
        self.stamp = stamp
        self.expected_dims = dims
        self.opened_ns = now_ns()
        self.family = like.name
        self.storage_chunks = (
            like.storage_chunks if like.storage_chunks and len(like.storage_chunks) == len(shape) else None
        )
        self.layout = "chunked" if self.storage_chunks else "C"
        self._decode_bytes = like.decode_bytes if self.storage_chunks == like.storage_chunks else 0
        self._storage = like.describe_storage() if self.storage_chunks == like.storage_chunks else "contiguous"
        self.token = source_token(self.format, path, *stamp, dataset=dataset)

    @classmethod
    def of(
        cls, item: Any, dataset: str | None, like: Source, dims: tuple[str | None, ...] | None = None
    ) -> FamilyMember | None:
        """``item`` (a path, ``"path::dataset"`` allowed) as a member of ``like``'s family, or ``None`` where
        it must be opened in full (a URL, not a local HDF5 file, a dataset its header does not state plainly)."""
        location, name = split_dataset(checked_path(os.fspath(item)), dataset)
        if is_url(location):
            return None
        path = os.path.abspath(local_path(location))
        stamp = file_stamp(path)  # a missing or unreadable file says so here, as a full open would
        if not _starts_as_hdf5(path):
            return None
        name = like.dataset if name is None else "/" + name.strip("/")
        if name is None:
            return None
        if stamp[0] == like.stamp[0] and name == like.dataset:  # type: ignore[index]
            # A file of the first one's size, written by the same program, holds the same array; the
            # first read proves it.
            shape, dtype = like.shape, like.dtype
        else:
            header = dataset_header(path, name)
            if header is None:
                return None
            shape, dtype = header.shape, header.dtype
        return cls(path, name, like=like, shape=shape, dtype=dtype, stamp=stamp, dims=dims)

    def current_stamp(self) -> tuple[Any, ...] | None:
        return file_stamp(self.path)

    @property
    def decode_bytes(self) -> int:
        return self._decode_bytes

    def describe_storage(self) -> str:
        return f"{self._storage} (as {self.family}; checked at its first read)"

    def _read_box(self, box: Region) -> np.ndarray:
        full = self.full_source()
        if full.linked_files:  # (its own stamp covers this file alone; the full source's covers its links)
            full.check_unchanged()
        return full._read_box(box)

    def full_source(self) -> Hdf5Source:
        """This process's full open of the file, checked once against what the member was opened as."""
        key = ("family-member", self.token, self.shape, self.dtype.str, self.expected_dims)
        return cached_handle(key, self._opened_and_checked)

    def _opened_and_checked(self) -> Hdf5Source:
        try:
            full = open_source(self.path, dataset=self.dataset)
        except MemberNotFoundError as exc:
            raise FileFamilyError(
                said(
                    f"{self.name}: ",
                    exc,
                    f"; it was opened as a file of the family of {self.family}, whose dataset it lacks: leave it "
                    "out of the list or pattern, or open it on its own",
                )
            ) from None
        if not isinstance(full, Hdf5Source):
            what = f"it is a {full.format} file, not HDF5"
        else:
            # What it was opened as, compared on every axis (as files stacked are): the family's own check.
            what = _difference(self, full, axis=0, stack=True)
        if not what and self.expected_dims is not None and full.dims != self.expected_dims:
            what = f"its dimensions are {full.dims}, not {self.expected_dims}"
        if what:
            raise FileFamilyError(
                f"{self.name}: {what}; it was joined to {self.family} on its size or header alone, and its full "
                "metadata, read now, differs, so it cannot be read as part of that family; leave it out of the "
                "list or pattern, or open it on its own"
            )
        return full  # type: ignore[return-value]


def _starts_as_hdf5(path: str) -> bool:
    """Whether the file starts with the HDF5 signature (a family member's cheapest proof of its format)."""
    try:
        with open_regular(path) as f:
            return f.read(len(HDF5_MAGIC)) == HDF5_MAGIC
    except OSError:
        return False
