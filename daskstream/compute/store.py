"""``store``: write a dask array to Zarr or HDF5 out of core, resumably.

Two writers share one plan. The array is cut on a regular grid (the Zarr or
HDF5 chunk grid), so every block is exactly one storage chunk and no two
blocks ever touch the same chunk.

* **Zarr** (a local directory store): each task writes its own block into the
  store, opening it by path inside the task, then leaves an empty marker file
  in ``<array>/.daskstream-store/done/``. zarr-python's ``LocalStore`` writes
  every key to a temporary file and renames it into place (zarr >= 3.1.3), so
  a chunk file is either whole or absent.
* **HDF5**: HDF5 takes writes from one process only, so blocks are computed
  in parallel on the active scheduler but written by the calling process, a
  bounded number in flight at a time; which blocks are done is a bitmap in
  the dataset's attributes, flushed after each batch.

A record, not the chunk itself, is the proof that a block is done: zarr
writes no chunk file for a block equal to the fill value, so a missing file
may be a finished block, and a chunk present in an HDF5 file may hold data
that never reached the disk.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from itertools import islice
from typing import Any

import dask
import dask.array as da
import dask.local
import dask.multiprocessing
import dask.threaded
import numcodecs
import numpy as np
from dask.base import tokenize
from dask.callbacks import Callback
from dask.core import get_dependencies

from daskstream.compute.computation import plan_compute
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    InvalidArgumentError,
    InvalidChunksError,
    TargetDamagedError,
    TargetExistsError,
    TargetMismatchError,
    TargetWriteError,
    UnknownFormatError,
    UnsupportedDtypeError,
)
from daskstream.files import open_regular
from daskstream.graph.layers import budget_of, read_layers
from daskstream.graph.optimize import with_aggregates_computed
from daskstream.graph.reads import source_array
from daskstream.planning.grid import regular_grid
from daskstream.runtime.resources import resolve_resources, resolve_settings
from daskstream.runtime.schedulers import active_client, active_get, scheduler_kind, uses_processes
from daskstream.sources import open_source
from daskstream.sources.base import Source, checked_path, file_stamp, native
from daskstream.sources.detect import EXTENSIONS, guess_format, split_dataset
from daskstream.sources.handles import forget_handles
from daskstream.sources.hdf5 import import_h5py
from daskstream.sources.zarr_ import is_url

__all__ = ["store"]

ProgressCallback = Callable[[int, int], None]

# Where a Zarr target keeps its progress record: hidden inside the array's own
# directory, so replacing or deleting the array removes it too, and zarr never
# reads it (chunk keys never start with a dot).
PROGRESS_DIR = ".daskstream-store"
_IDENTITY_FILE = "identity.json"
# A record is a few hundred bytes; a file far larger is not one daskstream wrote.
_MAX_RECORD_BYTES = 1 << 20
_DONE_DIR = "done"
# HDF5 attributes holding the progress record while a store is unfinished.
H5_IDENTITY_ATTR = "daskstream_store"
H5_DONE_ATTR = "daskstream_store_done"
# An HDF5 attribute lives in the object header, whose messages are limited to 64 KiB.
_H5_MAX_BLOCKS = 8 * 60_000
# The temporary files zarr's LocalStore writes before renaming them into place.
_ZARR_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")
_HDF5_SUFFIXES = tuple(ext for ext, fmt in EXTENSIONS.items() if fmt == "hdf5")
_RECORD_FORMAT = "daskstream.store/1"
# Below this many bytes per batch, the HDF5 writer gathers more blocks per batch than threads need.
_BATCH_BYTES = 16 * 2**20
_HDF5_ERRNO = re.compile(r"errno = (\d+)")
# What zarr raises when the array it opens is gone or its metadata is damaged: its own errors
# (zarr.errors.BaseZarrError, a ValueError), the ValueError of unreadable JSON, the KeyError of
# metadata missing a field and the TypeError of a field of the wrong type.
_ZARR_NODE_ERRORS = (ValueError, KeyError, TypeError)
# What h5py raises when HDF5 cannot write: OSError mostly, RuntimeError from flush and close.
_H5_WRITE_ERRORS = (OSError, RuntimeError)


@dataclass(frozen=True)
class StoreIdentity:
    """What a progress record belongs to: a resumed store must compute the same thing.

    Examples
    --------
    >>> a = StoreIdentity(shape=(4,), dtype="float32", chunks=(2,), name="x-1")
    >>> StoreIdentity.from_json(a.to_json()) == a
    True
    >>> a.differences(StoreIdentity(shape=(4,), dtype="float32", chunks=(2,), name="x-2"))
    ["name 'x-2' (recorded: 'x-1')"]
    """

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    name: str

    @classmethod
    def of(cls, x: da.Array) -> StoreIdentity:
        return cls(shape=tuple(int(n) for n in x.shape), dtype=str(x.dtype), chunks=_chunk_shape(x.chunks), name=x.name)

    def to_json(self) -> str:
        return json.dumps({"format": _RECORD_FORMAT, **asdict(self)})

    @classmethod
    def from_json(cls, text: str) -> StoreIdentity:
        record = json.loads(text)
        if record.get("format") != _RECORD_FORMAT:
            raise ValueError(f"unknown progress record format {record.get('format')!r}")
        return cls(
            shape=tuple(record["shape"]),
            dtype=record["dtype"],
            chunks=tuple(record["chunks"]),
            name=record["name"],
        )

    def differences(self, other: StoreIdentity) -> list[str]:
        """What ``other`` (the new computation) changes from this recorded one."""
        return [
            f"{field} {getattr(other, field)!r} (recorded: {getattr(self, field)!r})"
            for field in ("shape", "dtype", "chunks", "name")
            if getattr(self, field) != getattr(other, field)
        ]


def store(
    x: da.Array,
    target: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    resume: bool = True,
    overwrite: bool = False,
    compressor: Any = "default",
    progress: bool | ProgressCallback | None = None,
    zarr_format: int = 3,
    memory_budget: int | str | None = None,
) -> da.Array:
    """Write a dask array to a Zarr store or an HDF5 dataset, out of core and resumably.

    Parameters
    ----------
    x
        The array to write. Irregular chunks are first rechunked to a regular
        grid (each axis cut at its largest chunk), because one block must be
        one storage chunk.
    target
        A Zarr directory (``"out.zarr"``, ``"out.zarr::group/array"``) or an
        HDF5 dataset (``"out.h5::/entry/data"``). HDF5 is chosen by the file's
        signature when it exists, else by its extension (``.h5``, ``.hdf5``,
        ``.nc``...); anything else is a Zarr store.
    dataset
        The array inside the target, instead of writing it after ``::``.
        Required for HDF5.
    resume
        When the target holds an unfinished store of the same computation
        (same shape, dtype, chunks and ``x.name``), write only the blocks it
        does not have; the array keeps the format and compressor it was
        created with. A different computation there is an error.
        ``resume=False`` refuses an unfinished target unless ``overwrite``.
    overwrite
        Replace an existing array (or an unfinished store of another
        computation) at the target. Without it an existing complete array is
        never touched. Groups and folders that are not arrays are never
        deleted. An unfinished store of the same computation is still resumed
        when ``resume`` is true: its result would be the same.
    compressor
        ``"default"``: zstd level 3 for Zarr (``zarr.codecs.ZstdCodec``,
        ``numcodecs.Zstd`` for format 2), gzip level 1 with shuffle for HDF5
        (every HDF5 reader has gzip). ``None``: no compression. For Zarr, any
        compressor or list of compressors ``zarr.create_array`` takes; for
        HDF5, a filter name (``"lzf"``) or a mapping of ``h5py``
        ``create_dataset`` keywords (an ``hdf5plugin`` filter is one).
    progress
        ``True`` prints blocks done to stderr; a callable is called as
        ``progress(done, total)`` in this process as blocks finish.
    zarr_format
        2 or 3, for a new Zarr array.
    memory_budget
        Bytes one worker may use (``"2GiB"``); bounds how many computed blocks
        the HDF5 writer holds at once. Default: as for :func:`daskstream.open`.

    Returns
    -------
    dask.array.Array
        ``daskstream.open`` of the written array: lazy, reading from disk.

    Raises
    ------
    TargetExistsError
        The target holds an array (or something that is not one) and
        ``overwrite`` was not given.
    TargetMismatchError
        The target's shape or dtype differs from ``x``'s, or it holds an
        unfinished store of another computation; ``overwrite=True`` replaces it.
        Also: the path runs through an array or dataset (only groups hold
        others), or a Zarr target was deleted or damaged while being written.
    UnsupportedDtypeError
        ``x``'s dtype cannot be stored there (objects anywhere; unicode
        strings, datetime64 or timedelta64 in HDF5).
    TargetWriteError
        Writing failed (permission denied, disk full...). Blocks finished
        before the failure stay; rerun with ``resume=True`` once fixed.
    TargetDamagedError
        An existing target cannot be read or opened for writing (damaged, or
        an HDF5 file held open by another process).
    InvalidArgumentError
        Arguments that cannot work: not a dask array, no HDF5 dataset named,
        a URL, an unknown compressor, or ``x`` reading from the target itself.

    Notes
    -----
    **Memory.** Nothing ever computes ``x`` whole. Zarr: the scheduler runs
    one read-compute-write task per block and each returns a flag, so a worker
    holds only the blocks it is writing. HDF5: at most ``2 * window`` computed
    blocks are in this process at once (one batch being written while the
    next is computed), where ``window`` is enough blocks to keep every
    thread busy twice over (or to make up 16 MiB when blocks are small) but
    at most what the budget holds beside the tasks computing the next batch
    (their projected peak) and the block being written, and at least 1.

    **Schedulers.** Works on the synchronous, threaded, process and
    distributed schedulers. Zarr tasks open the store by path in whichever
    process runs them, so on a distributed cluster the target must be on a
    file system every worker shares. HDF5 blocks travel to this process, the
    only one that opens the file for writing; an array read from the same
    HDF5 file can therefore be stored into it only on the threaded or
    synchronous scheduler (HDF5 lets no other process open a file being
    written).

    **Interruption.** A Zarr chunk is written to a temporary file and renamed
    into place (zarr-python >= 3.1.3), so a killed store leaves whole chunks
    or none (plus, perhaps, an orphaned ``*.partial`` temporary file that a
    resumed store removes); a block's marker is written only after its chunk.
    HDF5 has no journal: blocks are recorded as done only after a flush that
    wrote them, so a resumed store never skips a block that was not flushed,
    but a process killed *while* HDF5 updates the file's metadata can leave the
    file unreadable, and a full disk usually does (HDF5 has then promised
    the file more space than it got; h5py may even crash the process at exit,
    h5py issue 914). The store then reports the file as damaged: delete it
    and start again. Deleting a dataset (``overwrite=True``) does not shrink
    an HDF5 file; ``h5repack`` reclaims the space. Two stores writing to the
    same target at once are not supported.

    Examples
    --------
    >>> import dask.array as da, numpy as np, tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> x = da.arange(10, chunks=4) * 2
    >>> y = store(x, os.path.join(folder, "twice.zarr"))
    >>> y.compute().tolist()
    [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    >>> z = store(x, os.path.join(folder, "twice.h5::/data"))
    >>> int(z.sum().compute())
    90
    """
    x = _regular(_check_array(x))
    report = _progress_reporter(progress, target)
    path, member = split_dataset(checked_path(target, "target"), dataset)
    if member is not None:
        member = checked_path(member, "dataset")
    identity = StoreIdentity.of(x)
    if target_format(path) == "hdf5":
        if not member or not member.strip("/"):
            raise InvalidArgumentError(f"{path}: name the HDF5 dataset to write, as '{path}::/name' or dataset='/name'")
        writer: _Target = _Hdf5Target(path, "/" + member.strip("/"), compressor, memory_budget)
    else:
        if zarr_format not in (2, 3):
            raise InvalidArgumentError(f"zarr_format={zarr_format!r}: give 2 or 3")
        writer = _ZarrTarget(path, (member or "").strip("/") or None, compressor, zarr_format)
    writer.check_sources([source for _, source, _ in read_layers(x)])
    if resume and not overwrite:
        x, identity = _as_recorded(x, identity, writer.recorded())
    writer.write(x, identity, resume=resume, overwrite=overwrite, report=report)

    return source_array(open_source(writer.path, dataset=writer.member), "auto", resolve_settings())


# ---------------------------------------------------------------------------
# Preparing the array


def _as_recorded(
    x: da.Array, identity: StoreIdentity, recorded: StoreIdentity | None
) -> tuple[da.Array, StoreIdentity]:
    """``x`` read again in the chunks an unfinished store recorded, when it is a plain read of one source.

    Resuming with another memory budget plans other chunks for the same data:
    reading in the recorded chunks keeps the blocks already written. Anything
    else (other data, or a computed array) is returned unchanged, for the
    target to refuse.
    """
    if recorded is None or not recorded.differences(identity) or recorded.chunks == identity.chunks:
        return x, identity
    reads = read_layers(x)
    if len(reads) != 1 or reads[0][0] != x.name or (recorded.shape, recorded.dtype) != (identity.shape, identity.dtype):
        return x, identity

    try:
        settings = resolve_settings(memory_budget=budget_of(x))
        again = source_array(reads[0][1], recorded.chunks, settings)
    except DaskstreamError:
        return x, identity
    again_identity = StoreIdentity.of(again)
    return (again, again_identity) if not recorded.differences(again_identity) else (x, identity)


def _check_array(x: Any) -> da.Array:
    if not isinstance(x, da.Array):
        raise InvalidArgumentError(
            f"store writes a dask array, not {type(x).__name__}; wrap it with "
            "dask.array.from_array(a, chunks=...) or open a file with daskstream.open"
        )
    if any(math.isnan(c) for sizes in x.chunks for c in sizes):
        raise InvalidChunksError(
            f"{x.name}: the array's chunk sizes are unknown (NaN); call x.compute_chunk_sizes() before storing it"
        )
    if x.dtype.hasobject:
        raise UnsupportedDtypeError(
            f"{x.name}: dtype {x.dtype} holds Python objects, which neither Zarr nor HDF5 stores as plain data; "
            "convert it to a fixed-width dtype first"
        )
    return x


def _chunk_shape(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """One full chunk of a regular grid (the first chunk along each axis).

    >>> _chunk_shape(((4, 4, 2), (7,)))
    (4, 7)
    """
    return tuple(int(sizes[0]) for sizes in chunks)


def is_regular(chunks: tuple[tuple[int, ...], ...]) -> bool:
    """Whether every chunk but the last along each axis has one size, the last no larger.

    >>> is_regular(((4, 4, 2), (3,)))
    True
    >>> is_regular(((2, 4, 4),))
    False
    """
    return all(all(c == sizes[0] for c in sizes[:-1]) and sizes[-1] <= sizes[0] for sizes in chunks if len(sizes) > 1)


def _regular(x: da.Array) -> da.Array:
    if is_regular(x.chunks):
        return x

    # The largest chunk per axis keeps the number of blocks lowest without splitting any task's input.
    return x.rechunk(regular_grid(x.shape, tuple(max(sizes) for sizes in x.chunks)))


def _in_process_scheduler() -> bool:
    """Whether tasks run in this process (threads or synchronous), where HDF5 shares one open file."""
    return scheduler_kind() in ("threads", "sync")


def _blocks(x: da.Array) -> list[tuple[int, ...]]:
    return list(np.ndindex(*x.numblocks))


def _region(chunks: tuple[tuple[int, ...], ...], index: tuple[int, ...]) -> tuple[slice, ...]:
    """Where block ``index`` of a regular grid sits in the array.

    >>> _region(((4, 4, 2), (3,)), (2, 0))
    (slice(8, 10, None), slice(0, 3, None))
    """
    return tuple(slice(i * sizes[0], i * sizes[0] + sizes[i]) for sizes, i in zip(chunks, index))


def _block_name(index: tuple[int, ...]) -> str:
    return ".".join(map(str, index)) or "0"


def _parse_block_name(name: str, ndim: int) -> tuple[int, ...] | None:
    parts = name.split(".")
    if ndim == 0:
        return () if name == "0" else None
    if len(parts) != ndim or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


# ---------------------------------------------------------------------------
# Where the data goes


def target_format(path: str) -> str:
    """``"hdf5"`` for an existing HDF5 file or an HDF5 file name, else ``"zarr"``; URLs are refused."""
    if not path.strip():
        raise InvalidArgumentError(
            "store needs a target: an empty path would write into the current folder; give a Zarr folder "
            "(out.zarr) or an HDF5 file and dataset (out.h5::/data)"
        )
    if is_url(path) or path.startswith("file://"):
        raise InvalidArgumentError(
            f"{path}: store writes local Zarr directories and HDF5 files; write locally and copy, or give a local path"
        )
    if os.path.lexists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        if os.path.islink(path):
            raise TargetExistsError(
                f"{path}: a symbolic link to nothing ({os.readlink(path)}); remove it or choose another target"
            )
        file_stamp(path)  # a pipe, socket or device: NotARegularFileError naming what it is
    if path.lower().rstrip("/").endswith(".zip") and not os.path.isdir(path):
        raise InvalidArgumentError(
            f"{path}: store writes Zarr folders, not zip files; store to a folder (out.zarr), then zip it "
            "(zip -r -0 out.zip out.zarr, or zarr's ZipStore)"
        )
    if os.path.isfile(path):
        try:
            fmt = guess_format(path)
        except (UnknownFormatError, CorruptSourceError):
            fmt = "other"
        if fmt != "hdf5":
            raise TargetExistsError(
                f"{path}: a file that is not HDF5 is there, and store writes Zarr directories or HDF5 files; "
                "choose another target (daskstream will not delete it)"
            )
        return "hdf5"
    if os.path.isdir(path):
        return "zarr"
    return "hdf5" if path.lower().endswith(_HDF5_SUFFIXES) else "zarr"


def data_locations(source: Source) -> list[str]:
    """The local files and folders a source's data is read from (none for URLs)."""
    if is_url(source.path):
        return []
    if source.format == "zarr" and os.path.isdir(source.path):
        return [os.path.join(source.path, *[part for part in (source.dataset or "").split("/") if part])]
    return [source.path, *(linked.path for linked in getattr(source, "linked_files", ()))]


def lies_within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, whatever links or mounts lead to either.

    Each folder on the way up from ``path`` (links resolved) is compared with
    ``folder`` by device and inode, so two spellings of one place match.
    """
    try:
        wanted = os.stat(folder)
    except OSError:
        return False  # nothing there yet: nothing to lose
    current = os.path.realpath(path)
    while True:
        with contextlib.suppress(OSError):
            st = os.stat(current)
            if (st.st_dev, st.st_ino) == (wanted.st_dev, wanted.st_ino):
                return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _progress_reporter(progress: bool | ProgressCallback | None, target: Any) -> ProgressCallback | None:
    if progress is None or progress is False:
        return None
    if progress is True:
        name = os.fspath(target)

        def to_stderr(done: int, total: int) -> None:
            end = "\n" if done == total else ""
            print(f"\rstore {name}: {done}/{total} blocks", end=end, file=sys.stderr, flush=True)

        return to_stderr
    if callable(progress):
        return progress
    raise InvalidArgumentError(f"progress={progress!r}: give True, None or a callable progress(done, total)")


class _Target(abc.ABC):
    """One kind of target: how to find its state, record progress and write blocks."""

    path: str
    member: str | None

    @abc.abstractmethod
    def write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:
        """Write the blocks of ``x`` not yet recorded as done, recording each as it lands."""

    @property
    def name(self) -> str:
        return self.path if self.member is None else f"{self.path}::{self.member}"

    @abc.abstractmethod
    def check_sources(self, sources: list[Source]) -> None:
        """Refuse to write over what the array itself reads, however either is spelled.

        Paths are compared by what they lead to (symbolic links followed,
        folders compared by device and inode), before anything is deleted.
        """

    def _reads_itself(self, source: Source, how: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.name}: the array stored reads {source.name}, {how}; writing would destroy the data "
            "while it is read. Write to another target, then replace the old one"
        )

    def _refuse_existing(self, what: str) -> TargetExistsError:
        return TargetExistsError(
            f"{self.name} already holds {what}; pass overwrite=True to replace it, or choose another target"
        )

    def _check_shape_dtype(self, shape: tuple[int, ...], dtype: np.dtype, x: da.Array) -> None:
        if tuple(shape) != tuple(x.shape) or native(np.dtype(dtype)) != native(x.dtype):
            raise TargetMismatchError(
                f"{self.name} holds an array of shape {tuple(shape)} and dtype {dtype}, but the array stored "
                f"has shape {tuple(x.shape)} and dtype {x.dtype}; pass overwrite=True to replace it, "
                "or choose another target"
            )

    def _check_identity(self, recorded: StoreIdentity, identity: StoreIdentity) -> None:
        changes = recorded.differences(identity)
        if not changes:
            return
        if (recorded.shape, recorded.dtype) == (identity.shape, identity.dtype) and recorded.chunks != identity.chunks:
            raise TargetMismatchError(
                f"{self.name} holds an unfinished store of this shape and dtype in chunks {recorded.chunks}, "
                f"but the array stored now has chunks {identity.chunks} (another memory budget or chunking): "
                "resume it with the chunks (or the memory budget) it was started with, or pass overwrite=True "
                "to start again, which writes again the blocks already written"
            )
        raise TargetMismatchError(
            f"{self.name} holds an unfinished store of another computation ({'; '.join(changes)}); "
            "pass overwrite=True to start it again with this array, or choose another target"
        )

    @abc.abstractmethod
    def recorded(self) -> StoreIdentity | None:
        """The identity an unfinished store into this target recorded, if there is one."""

    def _write_error(self, exc: BaseException, doing: str) -> TargetWriteError:
        return _write_error(self.name, exc, doing, self._after_failure)

    # What to do after a failed write, beyond fixing its cause.
    _after_failure = "run store again with resume=True"


# ---------------------------------------------------------------------------
# Zarr


class _ZarrTarget(_Target):
    def __init__(self, path: str, member: str | None, compressor: Any, zarr_format: int) -> None:
        self.path = os.path.abspath(path)
        self.member = member
        self.compressor = compressor
        self.zarr_format = zarr_format
        self.array_dir = os.path.join(self.path, *(member.split("/") if member else ()))
        self.progress_dir = os.path.join(self.array_dir, PROGRESS_DIR)
        self.done_dir = os.path.join(self.progress_dir, _DONE_DIR)

    def check_sources(self, sources: list[Source]) -> None:
        for source in sources:
            for location in data_locations(source):
                inside, around = lies_within(location, self.array_dir), lies_within(self.array_dir, location)
                if inside and around:
                    raise self._reads_itself(source, "which is this very target")
                if inside:
                    raise self._reads_itself(source, f"which is stored inside this target, at {location}")
                if around:
                    raise self._reads_itself(source, f"and this target lies inside it, at {location}")

    def write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:
        done = self._prepare(x, identity, resume=resume, overwrite=overwrite)
        blocks = _blocks(x)
        pending = [b for b in blocks if b not in done] if x.size else []
        total = len(blocks)
        if report:
            report(total - len(pending), total)
        if pending:
            self._run(x, pending, total, report)
        self._finish()

    # The state machine: absent -> recorded (identity.json) -> array created -> blocks marked -> finished.
    def _prepare(self, x: da.Array, identity: StoreIdentity, *, resume: bool, overwrite: bool) -> set[tuple]:
        self._check_parents()
        self._check_links()
        recorded = self._recorded_identity()
        kind = self._node_kind()
        if kind == "group":
            raise TargetMismatchError(
                f"{self.name} is a Zarr group; name an array inside it ('{self.path}::name' or dataset=...). "
                "store never deletes groups"
            )
        if kind == "other":
            raise TargetExistsError(
                f"{self.name} exists and is not a Zarr array; choose another target (daskstream will not delete it)"
            )
        if recorded is not None and resume and not recorded.differences(identity):
            if kind is None:
                self._create(x)  # interrupted between recording and creating the array
            else:
                self._check_existing(x)
            self._remove_partial_files()
            return self._done_blocks(x.ndim)
        if kind == "array" or recorded is not None:
            if not overwrite:
                if recorded is not None and not resume:
                    raise TargetExistsError(
                        f"{self.name} holds an unfinished store and resume=False; pass resume=True to finish "
                        "it, or overwrite=True to start again"
                    )
                if kind == "array":
                    self._check_existing(x)
                if recorded is not None:
                    self._check_identity(recorded, identity)
                raise self._refuse_existing("a Zarr array")
            self._delete()
        parts = self.member.split("/") if self.member else []
        folders = [os.path.join(self.path, *parts[:depth]) for depth in range(len(parts) + 1)]
        missing = [folder for folder in folders if not os.path.exists(folder)]
        self._record(identity)
        try:
            self._create(x)
        except (InvalidArgumentError, UnsupportedDtypeError):
            # Nothing was written: leave no unfinished store behind for arguments that can never work,
            # nor the folders made for it (only while empty: zarr may have put a group there).
            shutil.rmtree(self.progress_dir, ignore_errors=True)
            for folder in reversed(missing if self.array_dir in missing else [*missing, self.array_dir]):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            raise
        return set()

    def _check_parents(self) -> None:
        """Refuse a member inside an array: only groups hold other nodes, and nothing may be written there."""
        parts = self.member.split("/") if self.member else []
        for depth in range(len(parts)):
            folder = os.path.join(self.path, *parts[:depth])
            if not os.path.isdir(folder):
                return  # store creates the missing groups
            if _zarr_node_kind(folder) == "array":
                inner = "/".join(parts[:depth])
                where = f"{self.path}::{inner}" if inner else self.path
                raise TargetMismatchError(
                    f"{self.name}: {where} is a Zarr array, not a group, so it cannot hold {self.member}; "
                    "name an array outside it. store never writes inside an existing array"
                )

    def _check_links(self) -> None:
        """Refuse a target holding a symbolic link that leads outside it: chunk files would be written there."""
        if not os.path.isdir(self.path):
            return
        root = os.path.realpath(self.path)
        for folder, dirs, files in os.walk(self.path):
            for entry in [*dirs, *files]:
                link = os.path.join(folder, entry)
                if not os.path.islink(link):
                    continue
                leads_to = os.path.realpath(link)
                if os.path.commonpath([root, leads_to]) != root:
                    raise TargetWriteError(
                        errno.ELOOP,
                        f"{self.name}: {link} is a symbolic link to {leads_to}, outside the target; store "
                        "writes only inside its target folder and will not follow it. Remove the link or "
                        "choose another target",
                    )

    def _node_kind(self) -> str | None:
        """``"array"``, ``"group"``, ``"other"`` (a file or a folder of something else) or ``None``."""
        return _zarr_node_kind(self.array_dir)

    def recorded(self) -> StoreIdentity | None:
        with contextlib.suppress(TargetMismatchError):
            return self._recorded_identity()
        return None

    def _recorded_identity(self) -> StoreIdentity | None:
        try:
            with open_regular(os.path.join(self.progress_dir, _IDENTITY_FILE)) as f:
                text = f.read(_MAX_RECORD_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if len(text) > _MAX_RECORD_BYTES:
            raise TargetMismatchError(
                f"{self.name}: its progress record ({PROGRESS_DIR}/{_IDENTITY_FILE}) is larger than any record "
                "daskstream writes; pass overwrite=True to start again"
            )
        try:
            return StoreIdentity.from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise TargetMismatchError(
                f"{self.name}: its progress record ({PROGRESS_DIR}/{_IDENTITY_FILE}) cannot be read ({exc}); "
                "pass overwrite=True to start again"
            ) from None

    def _check_existing(self, x: da.Array) -> None:
        import zarr

        try:
            array = zarr.open_array(store=self._store(read_only=True), path=self.member or "", mode="r")
        except (zarr.errors.NodeNotFoundError, ValueError, TypeError, KeyError) as exc:
            raise TargetDamagedError(
                f"{self.name}: zarr could not read the existing array's metadata ({exc}); "
                "pass overwrite=True to replace it"
            ) from None
        self._check_shape_dtype(array.shape, np.dtype(array.dtype), x)

    def _store(self, *, read_only: bool = False) -> Any:
        import zarr

        return zarr.storage.LocalStore(self.path, read_only=read_only)

    def _record(self, identity: StoreIdentity) -> None:
        try:
            # Markers left by anything before belong to no computation of ours now.
            shutil.rmtree(self.progress_dir, ignore_errors=True)
            os.makedirs(self.done_dir, exist_ok=True)
            _write_atomically(os.path.join(self.progress_dir, _IDENTITY_FILE), identity.to_json().encode())
        except OSError as exc:
            raise self._write_error(exc, "record progress") from exc

    def _create(self, x: da.Array) -> None:
        import zarr

        compressors = self._compressors()
        # Zarr chunk sides must be >= 1 even along an empty axis.
        chunks = tuple(max(1, c) for c in _chunk_shape(x.chunks))
        try:
            zarr.create_array(
                self._store(),
                name=self.member,
                shape=x.shape,
                chunks=chunks,
                dtype=x.dtype,
                compressors=compressors,
                zarr_format=self.zarr_format,
                overwrite=False,
            )
        except OSError as exc:
            raise self._write_error(exc, "create the array") from exc
        except (ValueError, TypeError) as exc:
            if not (self.compressor is None or (isinstance(self.compressor, str) and self.compressor == "default")):
                raise InvalidArgumentError(
                    f"{self.name}: zarr could not create an array of dtype {x.dtype} with compressor="
                    f'{self.compressor!r} ({exc}); give a zarr compressor, a list of them, None or "default"'
                ) from None
            raise UnsupportedDtypeError(
                f"{self.name}: zarr could not create an array of dtype {x.dtype} ({exc}); convert the data "
                "to a dtype Zarr stores"
            ) from None

    def _compressors(self) -> Any:
        if isinstance(self.compressor, str) and self.compressor == "default":
            if self.zarr_format == 2:
                return numcodecs.Zstd(level=3)
            from zarr.codecs import ZstdCodec

            return ZstdCodec(level=3)
        return self.compressor

    def _delete(self) -> None:
        # Only reached for a Zarr array or an unfinished store's folder: never a group or foreign data.
        try:
            shutil.rmtree(self.array_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._write_error(exc, "delete the existing array") from exc

    def _remove_partial_files(self) -> None:
        # Temporary files of chunk writes cut short by a kill; zarr never reads them.
        for folder, _, files in os.walk(self.array_dir):
            for name in files:
                if _ZARR_PARTIAL.search(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))

    def _done_blocks(self, ndim: int) -> set[tuple[int, ...]]:
        try:
            names = os.listdir(self.done_dir)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        found = (_parse_block_name(n, ndim) for n in names)
        return {index for index in found if index is not None}

    def _run(self, x: da.Array, pending: list[tuple[int, ...]], total: int, report: ProgressCallback | None) -> None:

        writes = x.map_blocks(
            _write_zarr_block,
            self.path,
            self.member,
            self.done_dir,
            self.name,
            chunks=tuple((1,) * n for n in x.numblocks),
            dtype=bool,
            meta=np.empty((0,) * x.ndim, dtype=bool),
            name=f"daskstream-store-{tokenize(x.name, self.path, self.member)}",
        )
        # One optimized graph for all blocks, then only the pending ones: read and write fuse into one task.
        delayed = writes.to_delayed(optimize_graph=True)
        tasks = [delayed[index] for index in pending]
        done = total - len(pending)
        client = active_client()
        if client is not None:
            from distributed import as_completed

            futures = client.compute(tasks)
            try:
                for future in as_completed(futures):
                    future.result()
                    done += 1
                    if report:
                        report(done, total)
            except BaseException:
                client.cancel(futures)
                raise
            return
        if report is None:
            dask.compute(*tasks)
            return

        keys = {t.key for t in tasks}

        def count(key: Any, *_: Any) -> None:
            nonlocal done
            if key in keys:
                done += 1
                report(done, total)

        with Callback(posttask=count):
            dask.compute(*tasks)

    def _finish(self) -> None:
        # The identity goes first: from then on the target reads as complete even if the
        # markers' removal is cut short (leftovers are ignored, and removed by overwrite).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.progress_dir, _IDENTITY_FILE))
        shutil.rmtree(self.progress_dir, ignore_errors=True)


def _zarr_node_kind(folder: str) -> str | None:
    """What the Zarr node at ``folder`` is: ``"array"``, ``"group"``, ``"other"`` or ``None`` (nothing)."""
    if not os.path.exists(folder):
        return None
    if not os.path.isdir(folder):
        return "other"
    meta = os.path.join(folder, "zarr.json")
    if os.path.exists(meta):
        try:
            with open_regular(meta) as f:
                node_type = json.load(f).get("node_type")
        except (OSError, ValueError, AttributeError, RecursionError):
            return "other"
        return "array" if node_type == "array" else "group"
    if os.path.exists(os.path.join(folder, ".zarray")):
        return "array"
    if os.path.exists(os.path.join(folder, ".zgroup")):
        return "group"
    leftovers = set(os.listdir(folder)) - {PROGRESS_DIR}
    return "other" if leftovers else None


def _write_zarr_block(
    block: np.ndarray,
    store_path: str,
    member: str | None,
    done_dir: str,
    target_name: str,
    block_info: dict | None = None,
) -> np.ndarray:
    """Write one block into its chunk and mark it done; runs inside a task, in any process."""
    import zarr

    info = block_info[0]  # type: ignore[index]
    region = tuple(slice(start, stop) for start, stop in info["array-location"])
    name = _block_name(tuple(info["chunk-location"]))
    marker = os.path.join(done_dir, name)
    try:
        # Opened by path here, in whichever process runs the task: no handle travels in the graph.
        array = zarr.open_array(store=zarr.storage.LocalStore(store_path), path=member or "", mode="r+")
        array[region] = block
        # Only after the chunk is in place: an empty file appears whole or not at all.
        with open(marker, "wb"):
            pass
    except _ZARR_NODE_ERRORS as exc:
        # Before OSError: zarr's "node not found" errors are FileNotFoundErrors too, but no disk is to blame.
        # The array was deleted, replaced or damaged while store wrote it: what was recorded no longer holds.
        raise TargetMismatchError(
            f"{target_name}: could not write block {name}: zarr could not open or write the array "
            f"({type(exc).__name__}: {_first_line(exc)}); it was deleted, replaced or damaged while store "
            "was writing it. Pass overwrite=True to store it again"
        ) from exc
    except OSError as exc:
        raise _write_error(target_name, exc, f"write block {name}") from exc
    return np.ones((1,) * block.ndim, dtype=bool)


def _write_error(
    target_name: str, exc: BaseException, doing: str, after: str = _Target._after_failure
) -> TargetWriteError:
    number = getattr(exc, "errno", None)
    if number is None:
        # HDF5 reports the system error inside its message text, often as a RuntimeError.
        found = _HDF5_ERRNO.search(str(exc))
        number = int(found.group(1)) if found else None
    reason = os.strerror(number) if number else _first_line(exc)
    return TargetWriteError(
        number,
        f"{target_name}: could not {doing} ({reason}); blocks recorded as done are kept: free space or "
        f"fix permissions, then {after}",
    )


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------
# HDF5


class _Hdf5Target(_Target):
    _after_failure = (
        "run store again with resume=True (HDF5 has no journal: if it cannot reopen the file, delete it and "
        "store again)"
    )

    def __init__(self, path: str, member: str, compressor: Any, memory_budget: int | str | None) -> None:
        self.path = os.path.abspath(path)
        self.member = member
        self.compressor = compressor
        self.memory_budget = memory_budget

    def write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:

        blocks = _blocks(x)
        if len(blocks) > _H5_MAX_BLOCKS:
            raise InvalidChunksError(
                f"{self.name}: {len(blocks)} blocks is more than an HDF5 progress record holds "
                f"({_H5_MAX_BLOCKS}); rechunk to larger chunks before storing"
            )
        # HDF5 refuses to open for writing a file this process still holds open for reading.
        forget_handles()
        with self._own_writes_expected():
            self._write(x, identity, blocks, resume=resume, overwrite=overwrite, report=report)

    @contextlib.contextmanager
    def _own_writes_expected(self) -> Any:
        """Let sources reading another dataset of the file being written see it change, by this store only.

        Every read checks its file's stamp; the writes of this store change it. The
        same-file sources (threads of this process only, see :meth:`check_sources`)
        skip the check while it writes and take the file's new stamp after.
        """
        same_file = getattr(self, "_same_file", [])
        for source in same_file:
            source.stamp = None
        try:
            yield
        finally:
            for source in same_file:
                with contextlib.suppress(OSError):
                    source.stamp = source.current_stamp()

    def _write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        blocks: list[tuple[int, ...]],
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:
        h5file = self._open_file()
        try:
            dset, done = self._prepare(h5file, x, identity, resume=resume, overwrite=overwrite)
            pending = [b for b in blocks if not done[_flat(b, x.numblocks)]] if x.size else []
            total = len(blocks)
            if report:
                report(total - len(pending), total)
            if pending:
                _Hdf5Writer(self, h5file, dset, x, done, total, report).run(pending)
            try:
                del dset.attrs[H5_IDENTITY_ATTR]
                del dset.attrs[H5_DONE_ATTR]
                h5file.close()
            except _H5_WRITE_ERRORS as exc:
                raise self._write_error(exc, "remove the progress record") from exc
        except TargetWriteError as exc:
            # Closing flushes again; after a failed write that fails too and must not hide the first error.
            with contextlib.suppress(OSError, RuntimeError):
                h5file.close()
            if self._reopens():
                raise
            # HDF5 has no journal: a write cut short (disk full, a file-size limit) can leave the file's
            # metadata behind its data, and then no later run can open it to resume.
            raise TargetWriteError(
                exc.errno,
                f"{exc}".split("; blocks recorded")[0] + f"; the interrupted write left {self.path} unreadable "
                "to HDF5, which keeps no journal, so it cannot be resumed: free space or raise the file-size "
                "limit, then delete the file and store again",
            ) from exc
        except BaseException:
            with contextlib.suppress(OSError, RuntimeError):
                h5file.close()
            raise

    def _reopens(self) -> bool:
        """Whether HDF5 can open the file after a failed write: asked of a fresh process.

        This process's HDF5 library still holds the file it could not flush, and
        would answer from that instead of from what is on disk.
        """

        check = "import sys, h5py; h5py.File(sys.argv[1], 'r').close()"
        try:
            done = subprocess.run([sys.executable, "-c", check, self.path], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return True  # no answer: keep the usual advice
        return done.returncode == 0

    def check_sources(self, sources: list[Source]) -> None:
        self._same_file = []
        if not os.path.exists(self.path):
            return  # a new file: nothing read can be in it
        for source in sources:
            for location in data_locations(source):
                if not _same_path(location, self.path):
                    continue
                if location != source.path or source.format != "hdf5":
                    raise self._reads_itself(source, f"whose data comes from {self.path} (linked from it)")
                if self._same_object(source):
                    raise self._reads_itself(source, f"which is this very dataset ({self.member} is {source.dataset})")
                self._same_file.append(source)
        if self._same_file and not _in_process_scheduler():
            raise InvalidArgumentError(
                f"{self.name}: the array stored reads from {self.path}, the file being written, and HDF5 lets "
                "no other process read a file open for writing; use the threaded scheduler, or write to "
                "another file"
            )

    def _same_object(self, source: Source) -> bool:
        """Whether the dataset written is the one ``source`` reads, under any name (hard links included)."""

        h5py = import_h5py()
        try:
            with h5py.File(self.path, "r") as f:
                target, read = f.get(self.member), f.get(source.dataset)
                return target is not None and read is not None and target.id == read.id
        except (OSError, KeyError, ValueError):
            return False  # unreadable: _open_file reports it

    def _open_file(self) -> Any:

        h5py = import_h5py()
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        except OSError as exc:
            raise self._write_error(exc, "create the folder") from exc
        existed = os.path.exists(self.path)
        try:
            return h5py.File(self.path, "a")
        except PermissionError as exc:
            raise self._write_error(exc, "open the file for writing") from exc
        except OSError as exc:
            if not existed:
                raise self._write_error(exc, "create the file") from exc
            raise TargetDamagedError(
                f"{self.path}: HDF5 could not open the file for writing ({_first_line(exc)}). Another process "
                "may hold it open (HDF5 allows one writer and no readers meanwhile), or an interrupted write "
                "damaged it: close it elsewhere, or delete it and store again"
            ) from None

    def _prepare(
        self, h5file: Any, x: da.Array, identity: StoreIdentity, *, resume: bool, overwrite: bool
    ) -> tuple[Any, np.ndarray]:

        h5py = import_h5py()
        nblocks = math.prod(x.numblocks)
        self._check_parents(h5file, h5py)
        try:
            # Before anything is deleted or created, and before any compressor is involved.
            h5py.h5t.py_create(x.dtype, logical=True)
        except (TypeError, ValueError) as exc:
            raise UnsupportedDtypeError(
                f"{self.name}: HDF5 cannot store dtype {x.dtype} ({exc}); convert the data first (unicode "
                "strings to fixed-width bytes, datetime64 or timedelta64 to integers), or store it to Zarr"
            ) from exc
        existing = h5file.get(self.member)
        if existing is not None and not isinstance(existing, h5py.Dataset):
            raise TargetMismatchError(
                f"{self.name} is an HDF5 group, not a dataset; name a dataset to write. store never deletes groups"
            )
        if existing is not None:
            recorded = self._recorded_identity(existing)
            if recorded is not None and resume and not recorded.differences(identity):
                self._check_shape_dtype(existing.shape, existing.dtype, x)
                return existing, self._recorded_done(existing, nblocks)
            if not overwrite:
                if recorded is not None and not resume:
                    raise TargetExistsError(
                        f"{self.name} holds an unfinished store and resume=False; pass resume=True to finish "
                        "it, or overwrite=True to start again"
                    )
                self._check_shape_dtype(existing.shape, existing.dtype, x)
                if recorded is not None:
                    self._check_identity(recorded, identity)
                raise self._refuse_existing("an HDF5 dataset")
            try:
                del h5file[self.member]
            except _H5_WRITE_ERRORS as exc:
                raise self._write_error(exc, "delete the existing dataset") from exc
        return self._create(h5file, x, identity, nblocks), np.zeros(nblocks, dtype=bool)

    def _check_parents(self, h5file: Any, h5py: Any) -> None:
        """Refuse a dataset path that runs through a dataset: only groups hold other objects."""
        parts = [part for part in self.member.split("/") if part]
        for depth in range(1, len(parts)):
            parent = "/" + "/".join(parts[:depth])
            node = h5file.get(parent)
            if node is None:
                return  # store creates the missing groups
            if isinstance(node, h5py.Dataset):
                raise TargetMismatchError(
                    f"{self.name}: {parent} in {self.path} is an HDF5 dataset, not a group, so it cannot hold "
                    f"{self.member}; name a dataset outside it. store never deletes what is in the way"
                )

    def recorded(self) -> StoreIdentity | None:

        h5py = import_h5py()
        try:
            with h5py.File(self.path, "r") as f:
                dset = f.get(self.member)
                return self._recorded_identity(dset) if isinstance(dset, h5py.Dataset) else None
        except (OSError, KeyError, ValueError, TargetMismatchError):
            return None

    def _recorded_identity(self, dset: Any) -> StoreIdentity | None:
        if H5_IDENTITY_ATTR not in dset.attrs:
            return None
        try:
            text = dset.attrs[H5_IDENTITY_ATTR]
            return StoreIdentity.from_json(text.decode() if isinstance(text, bytes) else str(text))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise TargetMismatchError(
                f"{self.name}: its progress record (attribute {H5_IDENTITY_ATTR!r}) cannot be read ({exc}); "
                "pass overwrite=True to start again"
            ) from None

    def _recorded_done(self, dset: Any, nblocks: int) -> np.ndarray:
        try:
            packed = np.asarray(dset.attrs[H5_DONE_ATTR], dtype=np.uint8)
        except (OSError, KeyError) as exc:
            raise TargetMismatchError(
                f"{self.name}: its progress record (attribute {H5_DONE_ATTR!r}) cannot be read ({exc}); "
                "pass overwrite=True to start again"
            ) from None
        return np.unpackbits(packed, count=nblocks).astype(bool)

    def _create(self, h5file: Any, x: da.Array, identity: StoreIdentity, nblocks: int) -> Any:
        chunks = _chunk_shape(x.chunks)
        options: dict[str, Any] = {}
        # HDF5 cannot chunk (or so compress) a scalar or an empty dataset.
        if x.ndim and x.size:
            if math.prod(chunks) * x.dtype.itemsize >= 2**32:
                raise InvalidChunksError(
                    f"{self.name}: chunks {chunks} hold 4 GiB or more, the most one HDF5 chunk may; rechunk smaller"
                )
            options = {"chunks": chunks, **self._filters()}
        try:
            dset = h5file.create_dataset(self.member, shape=x.shape, dtype=x.dtype, **options)
            # The record is in place before any block is written; both reach the disk with one flush.
            dset.attrs[H5_IDENTITY_ATTR] = identity.to_json()
            dset.attrs[H5_DONE_ATTR] = np.packbits(np.zeros(nblocks, dtype=bool))
            h5file.flush()
        except _H5_WRITE_ERRORS as exc:
            raise self._write_error(exc, "create the dataset") from exc
        except (ValueError, TypeError) as exc:
            if self.compressor is None or (isinstance(self.compressor, str) and self.compressor == "default"):
                # Not the compressor's doing: the dtype and the path were checked, so say what h5py said.
                raise InvalidArgumentError(
                    f"{self.name}: h5py could not create a dataset of shape {x.shape}, dtype {x.dtype} and "
                    f"chunks {chunks} ({exc})"
                ) from exc
            raise InvalidArgumentError(
                f"{self.name}: h5py could not create the dataset with dtype {x.dtype} and "
                f"compressor={self.compressor!r} ({exc}); give a filter name, a mapping of h5py "
                'create_dataset keywords, None or "default"'
            ) from exc
        return dset

    def _filters(self) -> dict[str, Any]:
        if self.compressor is None:
            return {}
        if isinstance(self.compressor, str):
            if self.compressor == "default":
                return {"compression": "gzip", "compression_opts": 1, "shuffle": True}
            return {"compression": self.compressor}
        if isinstance(self.compressor, Mapping):
            return dict(self.compressor)
        raise InvalidArgumentError(
            f"{self.name}: compressor={self.compressor!r} is not an HDF5 filter; give a filter name "
            '("gzip", "lzf"), a mapping of h5py create_dataset keywords (an hdf5plugin filter), None or "default"'
        )

    def window(self, x: da.Array) -> int:
        """How many computed blocks one batch holds.

        Enough to keep every thread busy twice over, or to make up ``_BATCH_BYTES``
        when blocks are small (each batch costs a round trip to the scheduler), but
        no more than the budget holds beside the tasks computing the next batch
        (their projected peak, :func:`daskstream.plan_compute`) and the block being
        written with its filtered copies: a batch is written while the next one is
        computed, so two batches are in memory.
        """

        budget = budget_of(x, self.memory_budget)
        resources = resolve_resources(memory_budget=budget)
        block_bytes = max(1, math.prod(_chunk_shape(x.chunks)) * x.dtype.itemsize)
        wanted = max(2 * resources.threads * resources.workers, _BATCH_BYTES // block_bytes)
        computing = plan_compute(x, memory_budget=resources.memory_budget).projected_peak_bytes
        # HDF5 writes a block through its filters: a shuffled copy and the compressed bytes beside it. As
        # for streams, a fifth of the budget stays free for what the allocator keeps.
        free = resources.memory_budget * 4 // 5 - computing - 3 * block_bytes
        return max(1, min(wanted, free // (2 * block_bytes)))


def _flat(index: tuple[int, ...], numblocks: tuple[int, ...]) -> int:
    return int(np.ravel_multi_index(index, numblocks)) if numblocks else 0


class _Hdf5Writer:
    """The one writer of an HDF5 target: blocks come in computed, go out written and recorded."""

    def __init__(
        self,
        target: _Hdf5Target,
        h5file: Any,
        dset: Any,
        x: da.Array,
        done: np.ndarray,
        total: int,
        report: ProgressCallback | None,
    ) -> None:
        self.target, self.h5file, self.dset, self.x = target, h5file, dset, x
        self.done, self.total, self.report = done, total, report
        self.unrecorded: list[tuple[int, ...]] = []
        self.count = int(done.sum())
        # Aggregates that later passes take (a mean to centre with) are computed once, not per batch.
        x = self.x = with_aggregates_computed(x, resolve_resources())
        # One graph for all blocks, optimized once (as x.to_delayed(optimize_graph=True) does); each
        # batch sends the scheduler only the tasks its blocks need, found by walking back from them.
        # Building one Delayed per block and merging them with dask.compute costs batch² per batch.
        keys = x.__dask_keys__()
        self.graph: dict[Any, Any] = dict(x.__dask_optimize__(x.__dask_graph__(), keys))
        self.dependencies: dict[Any, set[Any]] = {}

    def _key(self, index: tuple[int, ...]) -> tuple:
        return (self.x.name, *index)

    def _subgraph(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """The tasks ``keys`` need: work in proportion to them, not to the whole graph."""

        graph, dependencies = self.graph, self.dependencies
        sub: dict[Any, Any] = {}
        stack = list(keys)
        while stack:
            key = stack.pop()
            if key in sub:
                continue
            sub[key] = graph[key]
            if key not in dependencies:
                dependencies[key] = get_dependencies(graph, key)
            stack.extend(dependencies[key])
        return sub

    def run(self, pending: list[tuple[int, ...]]) -> None:
        window = self.target.window(self.x)
        client = active_client()
        try:
            if client is not None:
                self._run_distributed(client, pending, window)
            else:
                self._run_local(pending, window)
        except BaseException:
            # Blocks written before the failure are kept: record them if the file still takes it.
            with contextlib.suppress(TargetWriteError):
                self._record()
            raise
        self._record()

    def _run_local(self, pending: list[tuple[int, ...]], window: int) -> None:
        # What dask.compute(x) would use: the configured scheduler, else the threaded one.
        schedule = active_get([self.x])
        with _one_process_pool():
            self._run_batches(pending, window, schedule)

    def _run_batches(self, pending: list[tuple[int, ...]], window: int, schedule: Callable[..., Any]) -> None:
        batches = _batched(pending, window)

        def compute(batch: Sequence[tuple[int, ...]]) -> tuple[Sequence[tuple[int, ...]], Sequence[Any]]:
            keys = [self._key(index) for index in batch]
            return batch, schedule(self._subgraph(keys), keys)

        # The next batch computes while this one is written: at most two batches in memory.
        with ThreadPoolExecutor(1, thread_name_prefix="daskstream-store") as pool:
            first = next(batches, None)
            running = pool.submit(compute, first) if first else None
            while running is not None:
                batch, results = running.result()
                following = next(batches, None)
                running = pool.submit(compute, following) if following else None
                for index, block in zip(batch, results):
                    self._write(index, block)
                del results
                self._record()

    def _run_distributed(self, client: Any, pending: list[tuple[int, ...]], window: int) -> None:
        from distributed import as_completed

        queue = iter(pending)
        in_flight: dict[Any, tuple[int, ...]] = {}
        finished = as_completed()

        def submit(n: int) -> None:
            batch = list(islice(queue, n))
            if batch:
                keys = [self._key(index) for index in batch]
                for future, index in zip(client.get(self._subgraph(keys), keys, sync=False), batch):
                    in_flight[future] = index
                    finished.add(future)

        # Top up in groups rather than one by one: each submission sends a graph to the scheduler.
        refill = max(1, window // 2)
        submit(window)
        try:
            for future in finished:
                index = in_flight.pop(future)
                block = future.result()
                future.release()
                self._write(index, block)
                del block
                if len(self.unrecorded) >= refill or not in_flight:
                    self._record()
                if window - len(in_flight) >= refill:
                    submit(window - len(in_flight))
        except BaseException:
            client.cancel(list(in_flight))
            raise

    def _write(self, index: tuple[int, ...], block: np.ndarray) -> None:
        region = _region(self.x.chunks, index)
        try:
            self.dset[region] = block
        except _H5_WRITE_ERRORS as exc:
            raise self.target._write_error(exc, f"write block {_block_name(index)}") from exc
        self.unrecorded.append(index)

    def _record(self) -> None:
        if not self.unrecorded:
            return
        try:
            # Data first, then the record that claims it: a block is never marked done before it is flushed.
            self.h5file.flush()
            for index in self.unrecorded:
                self.done[_flat(index, self.x.numblocks)] = True
            self.dset.attrs[H5_DONE_ATTR] = np.packbits(self.done)
            self.h5file.flush()
        except _H5_WRITE_ERRORS as exc:
            raise self.target._write_error(exc, "record progress") from exc
        self.count += len(self.unrecorded)
        self.unrecorded = []
        if self.report:
            self.report(self.count, self.total)


@contextlib.contextmanager
def _one_process_pool() -> Iterator[None]:
    """Keep one process pool for all batches when dask's process scheduler is active.

    Left alone, that scheduler starts (and imports everything into) a fresh pool
    of processes for every ``dask.compute``: once per batch.
    """

    if not uses_processes() or dask.config.get("pool", None) is not None:
        yield
        return

    initializer = partial(
        dask.multiprocessing.initialize_worker_process,
        user_initializer=dask.config.get("multiprocessing.initializer", None),
    )
    workers = dask.config.get("num_workers", None) or os.cpu_count() or 1
    context = dask.multiprocessing.get_context()
    with (
        _worker_hash_seed(),
        ProcessPoolExecutor(workers, mp_context=context, initializer=initializer) as pool,
        dask.config.set(pool=pool),
    ):
        yield


_HASH_SEED_LOCK = threading.Lock()
_hash_seed_users = 0
_hash_seed_before: str | None = None


@contextlib.contextmanager
def _worker_hash_seed() -> Iterator[None]:
    """One hash seed for the worker processes while the pool lives; the environment as it was after.

    dask.multiprocessing.get sets ``PYTHONHASHSEED`` when it starts its own pool (dask issue 6640):
    with ``spawn``, each worker would otherwise salt ``hash()`` of strings differently, and tasks that
    partition by ``hash()`` (dask.bag's groupby) would disagree across workers. A worker takes the seed
    from the environment it is started in, and ``ProcessPoolExecutor`` neither takes an environment of
    its own nor starts its workers before tasks arrive; so the variable is set for the pool's lifetime
    only, and put back (or removed) when the last store using a pool ends. A seed already chosen is
    left alone.
    """
    global _hash_seed_users, _hash_seed_before
    with _HASH_SEED_LOCK:
        if _hash_seed_users == 0:
            _hash_seed_before = os.environ.get("PYTHONHASHSEED")
            if _hash_seed_before in (None, "0"):
                os.environ["PYTHONHASHSEED"] = "6640"
        _hash_seed_users += 1
    try:
        yield
    finally:
        with _HASH_SEED_LOCK:
            _hash_seed_users -= 1
            if _hash_seed_users == 0 and os.environ.get("PYTHONHASHSEED") == "6640" and _hash_seed_before != "6640":
                if _hash_seed_before is None:
                    del os.environ["PYTHONHASHSEED"]
                else:
                    os.environ["PYTHONHASHSEED"] = _hash_seed_before


def _batched(items: list[tuple[int, ...]], n: int) -> Iterator[list[tuple[int, ...]]]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
