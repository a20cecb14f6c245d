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

import math
import os
import shutil
from typing import Any, Literal

import dask.array as da

from daskstream.advice import keyword, named, said
from daskstream.compute.store.codecs import choose_codec
from daskstream.compute.store.hdf5_target import Hdf5Target
from daskstream.compute.store.object_target import ObjectZarrTarget
from daskstream.compute.store.record import StoreIdentity, chunk_counts, reads_spans
from daskstream.compute.store.result import StoredArray, StoreTally, log_result
from daskstream.compute.store.span_writes import refuse_unstreamed
from daskstream.compute.store.target import Carried, ProgressCallback, Target, target_format
from daskstream.compute.store.zarr_target import ZarrTarget
from daskstream.errors import (
    DaskstreamError,
    InvalidArgumentError,
    InvalidChunksError,
    UnsupportedDtypeError,
)
from daskstream.graph.layers import read_layers, rechunk_records, span_reads
from daskstream.graph.optimize import computed_once_layers, with_layers_computed
from daskstream.graph.readers import sources_read
from daskstream.graph.reads import source_array
from daskstream.planning.grid import regular_chunk_shape, regular_grid
from daskstream.planning.settings import PlanSettings
from daskstream.runtime.progress import BlockProgress
from daskstream.runtime.resources import refuse_unbuildable, settings_for
from daskstream.runtime.schedulers import current as current_session
from daskstream.sources import open_source
from daskstream.sources.base import checked_path
from daskstream.sources.detect import split_dataset
from daskstream.sources.hdf5.filters import import_h5py

# Marks the ``compressor`` keyword as not given: None is a value it takes (no compression).
_UNSET: Any = object()


def store(
    x: da.Array,
    target: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    resume: bool = True,
    overwrite: bool = False,
    codec: Any = "default",
    optimize: str = "balanced",
    progress: bool | ProgressCallback | None = None,
    zarr_format: int = 3,
    inner_chunks: tuple[int, ...] | None = None,
    memory_budget: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    compressor: Any = _UNSET,
    carried: Carried | None = None,
) -> StoredArray:
    """Write a dask array to a Zarr store or an HDF5 dataset, out of core and resumably.

    Parameters
    ----------
    x
        The array to write. Irregular chunks are first rechunked to a regular
        grid (each axis cut at its largest chunk), because one block must be
        one storage chunk.
    target
        A Zarr directory (``"out.zarr"``, ``"out.zarr::group/array"``), a
        Zarr store on an object store (``"s3://bucket/out.zarr"``, any fsspec
        URL) or an HDF5 dataset (``"out.h5::/entry/data"``). HDF5 is chosen by
        the file's signature when it exists, else by its extension (``.h5``,
        ``.hdf5``, ``.nc``...); anything else is a Zarr store.
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
        never touched: a finished store of the same computation (same shape,
        dtype and ``x.name``; chunks the planner chose for another budget
        count as the same) is found complete and nothing is written, and
        anything else there is refused, naming what differs. Groups and
        folders that are not arrays are never deleted. An unfinished store of
        the same computation is still resumed when ``resume`` is true: its
        result would be the same. What is replaced stays untouched until its
        replacement is whole: the new array is written beside it (a hidden
        ``.NAME.daskstream-new`` folder beside a Zarr store, or dataset beside
        an HDF5 one), resumably, and swapped in by renames once finished, so
        ``x`` may read the very array it replaces, through any reader; the
        swap needs the space of both. An object store has no rename: there
        the old array is deleted first, and so only when every reader in
        ``x``'s graph is a daskstream source of another place.
    codec
        ``"default"``: zstd level 3 for Zarr (``zarr.codecs.ZstdCodec``,
        ``numcodecs.Zstd`` for format 2), gzip level 1 with shuffle for HDF5
        (every HDF5 reader has gzip). ``None``: no compression. For Zarr, any
        compressor or list of compressors ``zarr.create_array`` takes; for
        HDF5, a filter name (``"lzf"``) or a mapping of ``h5py``
        ``create_dataset`` keywords (an ``hdf5plugin`` filter is one).
        ``"auto"``: chosen by measuring candidates on a few blocks of ``x``
        with :func:`choose_codec` (remembered per kind of data), for a new
        array only (a resumed store keeps its array's codec).
    optimize
        What ``codec="auto"`` chooses for: ``"write"`` (the fastest
        store), ``"read"`` (the fastest reads afterwards), ``"size"`` (the
        smallest output) or ``"balanced"`` (store and one read together).
    progress
        ``True`` shows a bar on stderr, a widget in Jupyter (``store TARGET``,
        bytes written, bytes per second and the time left; none for a store
        done within half a second); a callable is called as
        ``progress(done, total)`` (in blocks) in this process as blocks
        finish. ``None`` (the default): a bar inside a :func:`daskstream.session`
        that shows progress (as its ``compute`` does), none outside one.
    zarr_format
        2 or 3, for a new Zarr array.
    inner_chunks
        Write a sharded Zarr array (format 3): each block of ``x`` is one
        shard file, holding chunks of this shape (one size per axis, each
        dividing the block's), which readers can fetch one by one. The shard
        and its index are encoded in the task, as chunks are.
    memory_budget
        Bytes one worker may use (``"2GiB"``); bounds how many computed blocks
        the HDF5 writer holds at once, and the threads writing to an object
        store; the array returned is planned for it. Default: the budget ``x``
        was opened with, else as for :func:`daskstream.open`.
    storage_options
        fsspec options for a target URL (``s3://bucket/out.zarr``): endpoint
        (``{"client_kwargs": {"endpoint_url": ...}}``), ``profile``, ``anon``,
        credentials. Secrets among them are used by this process only, never
        sent to workers: those use their own environment or profile.
    compressor
        The earlier name of ``codec``, still taken; give one or the other.
    carried
        What the target keeps beside the numbers: attributes, dimension names,
        fill value (:class:`~daskstream.compute.store.target.Carried`).
        Default: what still holds of ``x``'s source. A DataArray's labels are
        given here by :func:`daskstream.store`.

    Returns
    -------
    StoredArray
        ``daskstream.open`` of the written array with the budget the store
        planned for: lazy, reading from disk. A ``dask.array.Array`` whose
        ``result`` (:class:`~daskstream.compute.store.result.StoreResult`)
        says what the store did, as its repr does: blocks written, blocks an
        earlier interrupted run had written and this one resumed from, the
        time taken. The same line goes to the ``daskstream.store`` logger at
        INFO (``logging.basicConfig(level="INFO")`` shows it).

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
        a URL, an unknown compressor; ``x`` reading from a folder the target
        lies in; on an object store, overwrite with a reader in ``x``'s graph
        whose place daskstream cannot name, or that is the target.

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
    >>> y.result.written, y.result.done_before
    (3, 0)
    >>> store(x, os.path.join(folder, "twice.zarr")).result.already_complete
    True
    >>> z = store(x, os.path.join(folder, "twice.h5::/data"))
    >>> int(z.sum().compute())
    90
    """
    if compressor is not _UNSET:
        if not (isinstance(codec, str) and codec == "default"):
            raise InvalidArgumentError(
                said(keyword("codec", codec), " and ", keyword("compressor", compressor), ": give one, codec")
            )
        codec = compressor
    x = _regular(_check_array(x))
    report = tally = StoreTally(_progress_reporter(progress, target, x))
    path, member = split_dataset(checked_path(target, "target"), dataset)
    if member is not None:
        member = checked_path(member, "dataset")
    identity = StoreIdentity.of(x)
    kind = target_format(path)
    if storage_options is not None and kind != "zarr-url":
        raise InvalidArgumentError(
            said(f"{path}: ", named("storage_options"), " are for targets on object stores (URLs), not local paths")
        )
    # What x was planned with (the chunks a resumed store compares with the planner's), and what the store plans
    # for: a budget given wins.
    carried = carried or Carried.of(x)
    as_opened = settings_for(x)
    settings = as_opened if memory_budget is None else settings_for(x, memory_budget=memory_budget)
    refuse_unbuildable(x, settings.resources)
    if kind == "hdf5":
        if not member or not member.strip("/"):
            raise InvalidArgumentError(
                said(f"{path}: name the HDF5 dataset to write, as '{path}::/name' or ", keyword("dataset", "/name"))
            )
        if inner_chunks is not None:
            raise InvalidArgumentError(
                said(f"{path}: ", named("inner_chunks"), " (shards) are for Zarr targets; HDF5 has none")
            )
        hdf5 = Hdf5Target(path, "/" + member.strip("/"), codec, settings.resources, carried)
        hdf5.check_size(x)  # before the target is touched
        writer: Target = hdf5
    else:
        if zarr_format not in (2, 3):
            raise InvalidArgumentError(said(keyword("zarr_format", zarr_format), ": give 2 or 3"))
        member = (member or "").strip("/") or None
        inner = None if inner_chunks is None else tuple(int(c) for c in inner_chunks)
        version: Literal[2, 3] = 2 if zarr_format == 2 else 3
        if kind == "zarr-url":
            writer = ObjectZarrTarget(
                path, member, codec, version, carried, inner, storage_options, resources=settings.resources
            )
        else:
            writer = ZarrTarget(path, member, codec, version, carried, inner)
    # Every source the graph holds, found in its objects, not only in its read layers: a kernel's or a
    # closure's reads count as much.
    if span_reads(x.dask):
        refuse_unstreamed(x)  # before the target is touched
    writer.check_sources(sources_read(x))
    writer.recover()
    # A finished store there, read once: it decides both the chunks to read in and whether anything is left.
    finished = None if overwrite else writer.completed(x)
    if isinstance(codec, str) and codec == "auto":
        # Measured only for an array still to be made: a resumed or finished store keeps the codec it has.
        creating = overwrite or (finished is None and writer.recorded() is None)
        target_kind = "hdf5" if isinstance(writer, Hdf5Target) else "zarr"
        folder = None if kind == "zarr-url" else os.path.dirname(os.path.abspath(path))
        choice = (
            choose_codec(x, target_kind, optimize=optimize, folder=folder, threads=settings.threads)
            if creating
            else None
        )
        writer.compressor = "default" if choice is None else choice.compressor(zarr_format)
    if resume and not overwrite:
        x, identity = _as_recorded(x, identity, writer.recorded(), finished=finished is not None, settings=as_opened)
    if finished is not None and not finished.differences(identity):
        # The same computation stored there before, to the end: nothing to write.
        total = math.prod(chunk_counts(x))
        report(total, total)
    else:
        first = computed_once_layers(x)
        if first:
            # A rechunk's first pass, run once and first (an HDF5 writer computes in batches), with a bar of
            # its own: no block of the target is done before it is.
            bar = BlockProgress(f"rechunk {os.fspath(target)}: pass 1 of 2", int(x.nbytes)) if _shows(report) else None
            x = with_layers_computed(x, first, on_task=bar)
        writer.write(x, identity, resume=resume, overwrite=overwrite, report=report)
    # The target is complete: the intermediate arrays of rechunks feeding it have served.
    for record in rechunk_records(x):
        if record.folder is not None:
            shutil.rmtree(record.folder, ignore_errors=True)

    result = tally.result(os.fspath(target) if dataset is None else f"{os.fspath(target)}::{dataset}")
    log_result(result)
    written = open_source(writer.path, dataset=writer.member, storage_options=storage_options)
    return StoredArray.of(source_array(written, "auto", settings), result)


def stored_bytes(
    target: str | os.PathLike[str], *, dataset: str | None = None, storage_options: dict[str, Any] | None = None
) -> int:
    """Bytes the array at ``target`` takes on disk: its chunk files or objects (Zarr) or its dataset's storage (HDF5).

    Examples
    --------
    >>> import dask.array as da, tempfile, os
    >>> out = os.path.join(tempfile.mkdtemp(), "zeros.h5::/z")
    >>> _ = store(da.zeros(1000, chunks=250), out)
    >>> stored_bytes(out) < 8000  # zeros compress
    True
    """
    path, member = split_dataset(checked_path(target, "target"), dataset)
    kind = target_format(path)
    if kind == "hdf5":
        with import_h5py().File(path, "r") as f:
            return int(f[member or "/"].id.get_storage_size())
    if kind == "zarr-url":
        return ObjectZarrTarget(
            path, (member or "").strip("/") or None, None, 3, None, None, storage_options
        ).stored_bytes()
    return ZarrTarget(path, (member or "").strip("/") or None, None, 3).stored_bytes()


def _as_recorded(
    x: da.Array, identity: StoreIdentity, recorded: StoreIdentity | None, *, finished: bool, settings: PlanSettings
) -> tuple[da.Array, StoreIdentity]:
    """``x`` read again in the chunks a store recorded, when it is a plain read of one source.

    Resuming with another memory budget plans other chunks for the same data:
    reading in the recorded chunks keeps the blocks already written. A
    ``finished`` store is taken as complete only when ``x``'s chunks are the
    planner's (another budget), not chunks the caller chose: those ask for the
    data in new chunks. ``settings``: what ``x`` was planned with. Anything
    else (other data, or a computed array) is returned unchanged, for the
    target to refuse.
    """
    if recorded is None or not recorded.differences(identity) or recorded.chunks == identity.chunks:
        return x, identity
    reads = read_layers(x)
    if len(reads) != 1 or reads[0][0] != x.name or (recorded.shape, recorded.dtype) != (identity.shape, identity.dtype):
        return x, identity

    try:
        if finished and source_array(reads[0][1], "auto", settings).chunks != x.chunks:
            return x, identity  # chunks the caller chose, not the planner: theirs to keep
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
    if x.dtype.kind == "T":
        raise UnsupportedDtypeError(
            f"{x.name}: variable-length strings (StringDType) are read by daskstream, not stored; store them as "
            "fixed-width strings (x.astype('U16'), long enough for the longest), or write them with zarr or h5py"
        )
    if x.dtype.hasobject:
        raise UnsupportedDtypeError(
            f"{x.name}: dtype {x.dtype} holds Python objects, which neither Zarr nor HDF5 stores as plain data; "
            "convert it to a fixed-width dtype first"
        )
    return x


def _regular(x: da.Array) -> da.Array:
    if regular_chunk_shape(x.chunks) is not None or reads_spans(x):
        return x  # spans are written in the pieces they stream in, whatever their own lengths

    # The largest chunk per axis keeps the number of blocks lowest without splitting any task's input.
    return x.rechunk(regular_grid(x.shape, tuple(max(sizes) for sizes in x.chunks)))


def _shows(report: ProgressCallback | None) -> bool:
    """Whether ``report`` draws a bar (``BlockProgress``, or a callable that says it does with ``shows``)."""
    return bool(getattr(report, "shows", False))


def _progress_reporter(progress: bool | ProgressCallback | None, target: Any, x: da.Array) -> ProgressCallback | None:
    if progress is None:
        # As the session's compute does: a bar inside a session that shows progress (its default).
        active = current_session()
        progress = active is not None and active.progress
    if progress is False:
        return None
    if progress is True:
        return BlockProgress(f"store {os.fspath(target)}", int(x.nbytes))
    if callable(progress):
        return progress
    raise InvalidArgumentError(f"progress={progress!r}: give True, None or a callable progress(done, total)")
