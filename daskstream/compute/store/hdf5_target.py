"""HDF5 targets: blocks computed on the active scheduler, written by this process, a bounded number at a time.

(A little longer than most modules: the target's states -- recorded, created, blocks
marked, finished -- and its one writer are one protocol over one file.)
"""

from __future__ import annotations

import contextlib
import math
import os
import posixpath
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, said
from daskstream.compute.computation import computation_plan
from daskstream.compute.store.hdf5_writer import H5_WRITE_ERRORS, Hdf5Writer, flat_index
from daskstream.compute.store.named_codecs import named_codec
from daskstream.compute.store.record import (
    H5_COMPLETE_ATTR,
    H5_DONE_ATTR,
    H5_IDENTITY_ATTR,
    H5_MAX_BLOCKS,
    StoreIdentity,
    chunk_counts,
    chunk_shape,
    span_chunk_shape,
)
from daskstream.compute.store.span_writes import scans_before, span_chunks
from daskstream.compute.store.swap import aside_name, staging_name
from daskstream.compute.store.target import (
    Carried,
    ProgressCallback,
    Target,
    first_line,
    in_process_scheduler,
)
from daskstream.errors import (
    DaskstreamWarning,
    InvalidArgumentError,
    InvalidChunksError,
    MemoryBudgetError,
    TargetDamagedError,
    TargetMismatchError,
    TargetWriteError,
    UnsupportedDtypeError,
    warn,
)
from daskstream.graph.layers import source_places
from daskstream.planning.budget import FILTERED_WRITE_COPIES, format_size, plannable_bytes
from daskstream.planning.settings import Resources
from daskstream.runtime.stopping import deferred_stop
from daskstream.safe_writes import os_place, same_path
from daskstream.sources.base import Source, own_writes
from daskstream.sources.handles import forget_handles
from daskstream.sources.hdf5.filters import import_h5py
from daskstream.sources.metadata import hdf5_ready


def _names_in(h5file: Any) -> set[str]:
    """Every object's path in an open HDF5 file."""
    names: set[str] = set()
    h5file.visit(names.add)
    return names


def _first_missing(folder: str) -> str | None:
    """The outermost folder of ``folder`` (``folder`` itself included) that does not exist yet, or ``None``."""
    missing = None
    while folder and not os.path.exists(folder):
        missing, parent = folder, os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


# Below this many bytes per batch, the HDF5 writer gathers more blocks per batch than threads need.
BATCH_BYTES = 16 * 2**20


class Hdf5Target(Target):
    member: str  # an HDF5 target always names its dataset

    _after_failure = (
        "run store again: it resumes where it stopped (HDF5 has no journal: if it cannot reopen the file, delete "
        "it and store again)"
    )

    def __init__(
        self,
        path: str,
        member: str,
        compressor: Any,
        resources: Resources,
        carried: Carried | None = None,
    ) -> None:
        # Sources of the array stored that read other datasets of this file (see check_sources).
        self._same_file: list[Source] = []
        # The dataset the new array is written to when it replaces one (see _prepare_staged), else None.
        self._staged: str | None = None
        self.path = os_place(path)
        self.member = member
        self.compressor = compressor
        # The budget and parallelism the store plans for: they bound the blocks held at once (see window).
        self.resources = resources
        self.carried = carried or Carried()

    def write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:

        piece = span_chunk_shape(x)  # its size checked by store, before the target was touched (check_size)
        if piece is not None:
            # Every chunk passes through this process: spans come as one task per target chunk (see span_chunks).
            x = span_chunks(x, piece)
        blocks = list(np.ndindex(*x.numblocks))
        # HDF5 refuses to open for writing a file this process still holds open for reading.
        forget_handles()
        # The array may read other datasets of this very file (threads of this process, see check_sources):
        # the writes are this store's own, not a change under those reads.
        with own_writes.writing(self.path) if self._same_file else contextlib.nullcontext():
            self._write(x, identity, blocks, resume=resume, overwrite=overwrite, report=report)

    def check_size(self, x: da.Array) -> None:
        """Refuse ``x`` before anything is written where its target has more chunks than a progress record holds,
        or where its chunks, read in spans, would each scan their span from its start."""
        count = math.prod(chunk_counts(x))
        piece = span_chunk_shape(x)
        if piece is not None and scans_before(x):
            raise InvalidArgumentError(
                f"{self.name}: a cumulative step (cumsum, cumprod) of an array read in spans is stored to HDF5 a "
                "chunk per task, each scanning its span from its start, so each span would be read as many times "
                "as it has chunks: store it to a Zarr folder, whose tasks scan each span once, or a part of the "
                "array at a time (x[...])"
            )
        if count <= H5_MAX_BLOCKS:
            return
        if piece is None:
            raise InvalidChunksError(
                f"{self.name}: {count:,} blocks is more than an HDF5 progress record holds "
                f"({H5_MAX_BLOCKS:,}); rechunk to larger chunks before storing"
            )
        raise InvalidChunksError(
            f"{self.name}: the array is read in spans and stored in the chunks they stream in, "
            f"{format_size(math.prod(piece) * x.dtype.itemsize)} each: {count:,} chunks is more than an "
            f"HDF5 progress record holds ({H5_MAX_BLOCKS:,}); store to a Zarr folder, or a part of the array at "
            "a time (x[...])"
        )

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
        # What was there before this store, so that a store refused once the dataset is made leaves it so.
        file_existed = os.path.exists(self.path)
        folder = _first_missing(os.path.dirname(self.path))
        h5file = self._open_file()
        self._staged = None
        names_before = _names_in(h5file) if file_existed else set()
        try:
            dset, done = self._prepare(h5file, x, identity, resume=resume, overwrite=overwrite)
            pending = [b for b in blocks if not done[flat_index(b, x.numblocks)]] if x.size else []
            total = len(blocks)
            if pending:
                try:
                    writer = Hdf5Writer(self, h5file, dset, x, done, total, report)
                except MemoryBudgetError:
                    # The tasks' projection (which depends on the dataset's filters) refuses them: what this
                    # store made for them goes, as if it had been refused before the target was touched.
                    self._undo_created(h5file, names_before if file_existed else None, folder)
                    raise
            if report:
                report(total - len(pending), total)
            if pending:
                writer.run(pending)
            try:
                # What was computed is kept, so the same store run again finds it complete.
                dset.attrs[H5_COMPLETE_ATTR] = identity.to_json()
                for attribute in (H5_IDENTITY_ATTR, H5_DONE_ATTR):
                    if attribute in dset.attrs:  # (a staged dataset found whole has none left)
                        del dset.attrs[attribute]
                h5file.flush()
            except H5_WRITE_ERRORS as exc:
                raise self.write_error(exc, "remove the progress record") from exc
            self._swap_in(h5file)
            try:
                h5file.close()
            except H5_WRITE_ERRORS as exc:
                raise self.write_error(exc, "close the file") from exc
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

    def _undo_created(self, h5file: Any, names_before: set[str] | None, folder: str | None) -> None:
        """Remove what this store created: in a file that was there (``names_before``: its objects then), the
        groups, dataset and dimension scales it added; else the file, and the folder it made for it."""
        with contextlib.suppress(*H5_WRITE_ERRORS):
            if names_before is not None:
                added = sorted(_names_in(h5file) - names_before)
                # The outermost first: deleting a group deletes what it holds.
                for name in added:
                    if not any(name.startswith(f"{other}/") for other in added if other != name):
                        del h5file[name]
            h5file.close()
            if names_before is None:
                os.remove(self.path)
                # The folders it made, innermost first, each only while empty.
                inner = os.path.dirname(self.path)
                while folder is not None and inner.startswith(folder) and not os.listdir(inner):
                    os.rmdir(inner)
                    if inner == folder:
                        break
                    inner = os.path.dirname(inner)

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
            for location in source_places(source):
                if not same_path(location, self.path):
                    continue
                if location != source.path or source.format != "hdf5":
                    raise self._reads_itself(source, f"whose data comes from {self.path} (linked from it)")
                # The very dataset replaced is read too: it is replaced by swap, once the new one is whole.
                self._same_file.append(source)
        if self._same_file and not in_process_scheduler():
            raise InvalidArgumentError(
                f"{self.name}: the array stored reads from {self.path}, the file being written, and HDF5 lets "
                "no other process read a file open for writing; use the threaded scheduler, or write to "
                "another file"
            )

    def _open_file(self) -> Any:

        h5py = import_h5py()
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        except OSError as exc:
            raise self.write_error(exc, "create the folder") from exc
        existed = os.path.exists(self.path)
        try:
            return h5py.File(self.path, "a")
        except PermissionError as exc:
            raise self.write_error(exc, "open the file for writing") from exc
        except OSError as exc:
            if not existed:
                raise self.write_error(exc, "create the file") from exc
            raise TargetDamagedError(
                f"{self.path}: HDF5 could not open the file for writing ({first_line(exc)}). Another process "
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
                    raise self._refuse_unfinished()
                self._check_shape_dtype(existing.shape, existing.dtype, x)
                finished = self._read_identity(existing, H5_COMPLETE_ATTR) if recorded is None else None
                if finished is not None:
                    raise self._refuse_finished(finished, identity)
                if recorded is not None:
                    self._check_identity(recorded, identity)
                raise self._refuse_existing("an HDF5 dataset")
            # Replaced by swap: written beside the old dataset, which stays until the new one is whole.
            return self._prepare_staged(h5file, x, identity, resume=resume, nblocks=nblocks)
        return self._create(h5file, x, identity, nblocks, self.member), np.zeros(nblocks, dtype=bool)

    # --- replacing by swap (see daskstream.compute.store.swap) ---------------------------------------

    def _beside(self, name_of: Callable[[str], str]) -> str:
        folder, name = posixpath.split(self.member)
        return posixpath.join(folder or "/", name_of(name))

    def _prepare_staged(
        self, h5file: Any, x: da.Array, identity: StoreIdentity, *, resume: bool, nblocks: int
    ) -> tuple[Any, np.ndarray]:
        """The dataset the new array is written to beside the target, resumed where it holds this store."""
        h5py = import_h5py()
        self._staged = self._beside(staging_name)
        staged = h5file.get(self._staged)
        if isinstance(staged, h5py.Dataset):
            with contextlib.suppress(TargetMismatchError):  # a record of ours that cannot be read: made again
                recorded = self._recorded_identity(staged)
                finished = self._read_identity(staged, H5_COMPLETE_ATTR) if recorded is None else None
                same_shape = (tuple(staged.shape), np.dtype(staged.dtype)) == (tuple(x.shape), x.dtype)
                if same_shape and resume and recorded is not None and not recorded.differences(identity):
                    return staged, self._recorded_done(staged, nblocks)
                if same_shape and finished is not None and not finished.differences(identity):
                    return staged, np.ones(nblocks, dtype=bool)
        try:
            if staged is not None:
                del h5file[self._staged]  # what another computation staged there: daskstream's own
        except H5_WRITE_ERRORS as exc:
            raise self.write_error(exc, "remove an earlier store's unfinished replacement") from exc
        return self._create(h5file, x, identity, nblocks, self._staged), np.zeros(nblocks, dtype=bool)

    def _swap_in(self, h5file: Any) -> None:
        """Put the finished staged dataset in the target's place (two link renames), then delete the old one."""
        if self._staged is None:
            return
        aside = self._beside(aside_name)
        try:
            with deferred_stop():
                if aside in h5file:
                    del h5file[aside]
                h5file.move(self.member, aside)
                h5file.move(self._staged, self.member)
                del h5file[aside]
                h5file.flush()
        except H5_WRITE_ERRORS as exc:
            raise self.write_error(exc, f"put the new dataset in place (it is whole at {self._staged})") from exc

    def recover(self) -> None:
        """Finish (or undo) a swap that a killed process left half done: the old dataset still aside."""
        h5py = import_h5py()
        aside, staged = self._beside(aside_name), self._beside(staging_name)
        try:
            with h5py.File(self.path, "r") as f:
                if aside not in f:
                    return
        except (OSError, ValueError):
            return  # absent or unreadable: the store reports it when it opens the file
        forget_handles()
        try:
            with h5py.File(self.path, "a") as f, deferred_stop():
                if self.member not in f:
                    f.move(staged if staged in f else aside, self.member)
                if aside in f:
                    del f[aside]
        except H5_WRITE_ERRORS as exc:
            raise self.write_error(exc, "finish replacing the dataset, which an earlier store began") from exc

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
        return self._read_dataset(
            lambda dset: self._recorded_identity(dset) or self._read_identity(dset, H5_COMPLETE_ATTR)
        )

    def completed(self, x: da.Array) -> StoreIdentity | None:
        def finished(dset: Any) -> StoreIdentity | None:
            if self._recorded_identity(dset) is not None:
                return None  # an unfinished store over a finished one is not complete
            identity = self._read_identity(dset, H5_COMPLETE_ATTR)
            if identity is not None:
                self._check_shape_dtype(dset.shape, dset.dtype, x)
            return identity

        return self._read_dataset(finished)

    def _read_dataset(self, read: Callable[[Any], StoreIdentity | None]) -> StoreIdentity | None:
        """``read(dataset)`` of the target dataset opened read-only; ``None`` if it or its record cannot be read."""
        if not os.path.isfile(self.path):
            return None
        h5py = import_h5py()
        try:
            with h5py.File(self.path, "r") as f:
                dset = f.get(self.member)
                return read(dset) if isinstance(dset, h5py.Dataset) else None
        except (OSError, KeyError, ValueError, TargetMismatchError):
            return None

    def _recorded_identity(self, dset: Any) -> StoreIdentity | None:
        return self._read_identity(dset, H5_IDENTITY_ATTR)

    def _read_identity(self, dset: Any, attribute: str) -> StoreIdentity | None:
        if attribute not in dset.attrs:
            return None
        try:
            text = dset.attrs[attribute]
            return StoreIdentity.from_json(text.decode() if isinstance(text, bytes) else str(text))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise self._unreadable_record(f"attribute {attribute!r}", exc) from None

    def _recorded_done(self, dset: Any, nblocks: int) -> np.ndarray:
        try:
            packed = np.asarray(dset.attrs[H5_DONE_ATTR], dtype=np.uint8)
        except (OSError, KeyError) as exc:
            raise self._unreadable_record(f"attribute {H5_DONE_ATTR!r}", exc) from None
        return np.unpackbits(packed, count=nblocks).astype(bool)

    def _create(self, h5file: Any, x: da.Array, identity: StoreIdentity, nblocks: int, name: str) -> Any:
        chunks = chunk_shape(x)
        options: dict[str, Any] = {}
        # HDF5 cannot chunk (or so compress) a scalar or an empty dataset.
        if x.ndim and x.size:
            if math.prod(chunks) * x.dtype.itemsize >= 2**32:
                raise InvalidChunksError(
                    f"{self.name}: chunks {chunks} hold 4 GiB or more, the most one HDF5 chunk may; rechunk smaller"
                )
            options = {"chunks": chunks, **self._filters()}
        fill = self.carried.fill_for(x.dtype)
        if fill is not None:
            options["fillvalue"] = fill
        try:
            dset = h5file.create_dataset(name, shape=x.shape, dtype=x.dtype, **options)
            self._carry(dset)
            # The record is in place before any block is written; both reach the disk with one flush.
            dset.attrs[H5_IDENTITY_ATTR] = identity.to_json()
            dset.attrs[H5_DONE_ATTR] = np.packbits(np.zeros(nblocks, dtype=bool))
            h5file.flush()
        except H5_WRITE_ERRORS as exc:
            raise self.write_error(exc, "create the dataset") from exc
        except (ValueError, TypeError) as exc:
            if self.compressor is None or (isinstance(self.compressor, str) and self.compressor == "default"):
                # Not the compressor's doing: the dtype and the path were checked, so say what h5py said.
                raise InvalidArgumentError(
                    f"{self.name}: h5py could not create a dataset of shape {x.shape}, dtype {x.dtype} and "
                    f"chunks {chunks} ({exc})"
                ) from exc
            raise InvalidArgumentError(
                said(
                    f"{self.name}: h5py could not create the dataset with dtype {x.dtype} and ",
                    keyword("compressor", self.compressor),
                    f' ({exc}); give a filter name, a mapping of h5py create_dataset keywords, None or "default"',
                )
            ) from exc
        return dset

    def _carry(self, dset: Any) -> None:
        """The source's attributes, dimension names (as dimension labels) and dimension scales on the new
        dataset; a scale is copied beside it under its own name, or one already there with the same values
        is used."""
        for key, value in self.carried.attrs.items():
            dset.attrs[key] = hdf5_ready(value)
        for axis, name in enumerate(self.carried.dims or ()):
            if name is not None and axis < dset.ndim:
                dset.dims[axis].label = name
        for axis in range(dset.ndim):
            found = self.carried.scale_values(axis, dset.file)
            if found is None:
                continue
            scale_name, values = found
            where = posixpath.join(posixpath.dirname(dset.name), scale_name)
            scale = dset.file.get(where)
            if scale is None:
                scale = dset.file.create_dataset(where, data=values)
            elif not (isinstance(scale, type(dset)) and np.array_equal(scale[()], values)):
                warn(
                    f"{self.name}: the dimension scale of axis {axis} was not copied: {where} already holds "
                    "something else",
                    DaskstreamWarning,
                )
                continue
            scale.make_scale((self.carried.dims or (None,) * dset.ndim)[axis] or scale_name)
            dset.dims[axis].attach_scale(scale)

    def _filters(self) -> dict[str, Any]:
        if self.compressor is None:
            return {}
        if isinstance(self.compressor, str):
            # "default" is gzip level 1 with shuffle: fast to write, and every HDF5 reader decodes it.
            named = (
                named_codec("gzip", "hdf5", level=1)
                if self.compressor == "default"
                else named_codec(self.compressor, "hdf5")
            )
            return dict(named or {})
        if isinstance(self.compressor, Mapping):
            return dict(self.compressor)
        raise InvalidArgumentError(
            said(
                f"{self.name}: ",
                keyword("compressor", self.compressor),
                ' is not an HDF5 filter; give a filter name ("gzip", "lzf"), a mapping of h5py create_dataset '
                'keywords (an hdf5plugin filter), None or "default"',
            )
        )

    def window(self, x: da.Array) -> int:
        """How many computed blocks one batch holds.

        Enough to keep every thread busy twice over, or to make up ``BATCH_BYTES``
        when blocks are small (each batch costs a round trip to the scheduler), but
        no more than the budget holds beside the tasks computing the next batch
        (their projected peak, :func:`daskstream.plan_compute`) and the block being
        written with its filtered copies: a batch is written while the next one is
        computed, so two batches are in memory.
        """

        resources = self.resources
        block_bytes = max(1, math.prod(chunk_shape(x)) * x.dtype.itemsize)
        wanted = max(2 * resources.threads * resources.workers, BATCH_BYTES // block_bytes)
        computing = computation_plan([x], resources).projected_peak_bytes
        # HDF5 writes a block through its filters: a shuffled copy and the compressed bytes beside it.
        free = plannable_bytes(resources.memory_budget) - computing - FILTERED_WRITE_COPIES * block_bytes
        return max(1, min(wanted, free // (2 * block_bytes)))
