"""Zarr targets: each task writes its own block into a local directory store and marks it done.

(A little longer than most modules: as with the HDF5 target, the states -- recorded, created, blocks
marked, finished -- and the task that writes a block are one protocol over one store.)
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import posixpath
import re
import shutil
from collections.abc import Collection
from typing import Any, Literal

import dask
import dask.array as da
import dask.local
import dask.multiprocessing
import dask.threaded
import numpy as np

from daskstream.advice import keyword, named, passing, said
from daskstream.compute.store.chunk_writer import ChunkWriter, chunk_writer_for
from daskstream.compute.store.named_codecs import named_codec
from daskstream.compute.store.record import (
    COMPLETE_FILE,
    DONE_DIR,
    IDENTITY_FILE,
    MAX_RECORD_BYTES,
    PROGRESS_DIR,
    StoreIdentity,
    chunk_counts,
    chunk_shape,
    parse_block_name,
    reads_spans,
    write_atomically,
)
from daskstream.compute.store.span_writes import ChunksLeft
from daskstream.compute.store.swap import recover_folder, staged_places, swap_folders, swap_when_whole
from daskstream.compute.store.target import (
    OVERWRITE,
    Carried,
    ProgressCallback,
    Target,
)
from daskstream.compute.store.zarr_writes import PendingWrites, block_runner
from daskstream.errors import (
    DaskstreamWarning,
    InvalidArgumentError,
    TargetDamagedError,
    TargetExistsError,
    TargetMismatchError,
    TargetWriteError,
    UnsupportedDtypeError,
    warn,
)
from daskstream.files import open_regular
from daskstream.graph.layers import source_places
from daskstream.safe_writes import lies_within, os_place
from daskstream.sources.base import Source
from daskstream.sources.metadata import ZARR_V2_DIMENSIONS, json_ready
from daskstream.sources.zarr.nodes import folder_node_type

# The temporary files zarr's LocalStore writes before renaming them into place.
ZARR_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")


def _inner_chunks(name: str, inner: tuple[int, ...], shard: tuple[int, ...], zarr_format: int) -> tuple[int, ...]:
    """``inner`` checked as the chunks inside shards of ``shard``: format 3, one size per axis, dividing it."""
    if zarr_format != 3:
        raise InvalidArgumentError(
            said(
                f"{name}: shards are a Zarr format 3 feature; ",
                passing("zarr_format", 3),
                " with ",
                named("inner_chunks"),
            )
        )
    sizes = tuple(min(int(c), s) for c, s in zip(inner, shard))
    if len(inner) != len(shard) or any(c < 1 or s % c for c, s in zip(sizes, shard)):
        raise InvalidArgumentError(
            said(
                f"{name}: ",
                keyword("inner_chunks", tuple(inner)),
                f" must give one size per axis dividing the shard (block) shape {shard}; rechunk the array or "
                "pick sizes that divide it",
            )
        )
    return sizes


class ZarrTarget(Target):
    def __init__(
        self,
        path: str,
        member: str | None,
        compressor: Any,
        zarr_format: Literal[2, 3],
        carried: Carried | None = None,
        inner_chunks: tuple[int, ...] | None = None,
    ) -> None:
        self.path = os_place(path)
        self.member = member
        self.compressor = compressor
        self.zarr_format = zarr_format
        self.inner_chunks = inner_chunks
        self.carried = carried or Carried()
        self.array_dir = os.path.join(self.path, *(member.split("/") if member else ()))
        self.progress_dir = os.path.join(self.array_dir, PROGRESS_DIR)
        self.done_dir = os.path.join(self.progress_dir, DONE_DIR)

    def stored_bytes(self) -> int:
        """Bytes of the array's files (metadata and chunks), its progress record left out."""
        total = 0
        for folder, dirs, files in os.walk(self.array_dir):
            dirs[:] = [d for d in dirs if d != PROGRESS_DIR]
            total += sum(os.lstat(os.path.join(folder, name)).st_size for name in files)
        return total

    def check_sources(self, sources: list[Source]) -> None:
        # Reading the very array replaced is safe: it is replaced by swap, after the new one is whole (see
        # write). Reading what a swap writes beside it, a folder the target lies in, or a file inside the
        # target's folder (removed with the old array) is not.
        staged, aside = self._swap_places()
        for source in sources:
            for location in source_places(source):
                for place in (staged, aside):
                    if lies_within(location, place) or lies_within(place, location):
                        raise self._reads_itself(source, f"which holds {place}, where store writes beside the target")
                inside, around = lies_within(location, self.array_dir), lies_within(self.array_dir, location)
                if inside and not around:
                    # A file inside the array's folder is no part of the array, and goes with the old folder.
                    raise self._reads_itself(source, f"which is stored inside this target, at {location}")
                if around and not inside:
                    raise self._reads_itself(source, f"and this target lies inside it, at {location}")

    # --- replacing by swap (see daskstream.compute.store.swap) ---------------------------------------

    def _swap_places(self) -> tuple[str, str]:
        """Where the new array is written beside the target, and where the old one goes while they swap."""
        return staged_places(self.path, self.array_dir, self.member)

    def recover(self) -> None:
        """Finish (or undo) a swap into this target that a killed process left half done."""
        staged, aside = self._swap_places()
        try:
            recover_folder(self.array_dir, staged, aside)
        except OSError as exc:
            raise self.write_error(exc, "finish replacing the array, which an earlier store began") from exc

    def _replaces(self, identity: StoreIdentity, *, resume: bool) -> bool:
        """Whether an ``overwrite`` store replaces what the target holds (written beside it, then swapped)
        rather than writing in place: always, unless the target holds this very store unfinished."""
        self._check_parents()
        self._check_links()
        kind = self._node_kind()
        if kind not in ("array", None):
            return False  # a group or foreign data: _prepare refuses it
        recorded = self._recorded_identity()
        if recorded is not None and resume and not recorded.differences(identity):
            return False
        return kind == "array" or recorded is not None

    def _staged_target(self) -> ZarrTarget:
        staged, _ = self._swap_places()
        return ZarrTarget(staged, None, self.compressor, self.zarr_format, self.carried, self.inner_chunks)

    def _write_replacing(
        self, x: da.Array, identity: StoreIdentity, *, resume: bool, report: ProgressCallback | None
    ) -> None:
        """Write ``x`` beside the target (resuming a staged store of it), then swap it in whole."""
        staged = self._staged_target()
        finished = staged.completed(x)
        if finished is not None and not finished.differences(identity):
            total = math.prod(chunk_counts(x))  # written whole before a stop cut the swap short
            if report:
                report(total, total)
        else:
            recorded = None
            with contextlib.suppress(TargetMismatchError):
                recorded = staged._recorded_identity()
            if not (resume and recorded is not None and not recorded.differences(identity)):
                # Anything else under the staging name -- another computation's, a store asked not to resume,
                # damaged -- is daskstream's own unfinished work, never the user's data: started again.
                shutil.rmtree(staged.path, ignore_errors=True)
            staged.write(x, identity, resume=True, overwrite=False, report=report)
        swap_when_whole(lambda: self._swap_in(staged.path, x))

    def _swap_in(self, staged: str, x: da.Array) -> None:
        try:
            swap_folders(staged, self.array_dir, self._swap_places()[1])
        except OSError as exc:
            raise self.write_error(exc, f"put the new array in place (it is whole at {staged})") from exc
        self._carry_scales(x)

    def write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:
        if overwrite and self._replaces(identity, resume=resume):
            self._write_replacing(x, identity, resume=resume, report=report)
            return
        done = self._prepare(x, identity, resume=resume, overwrite=overwrite)
        counts = chunk_counts(x)
        total = math.prod(counts)
        pending: Collection[tuple[int, ...]]
        if not x.size:
            pending = []
        elif reads_spans(x):
            pending = ChunksLeft(counts, {index for index in done if all(i < n for i, n in zip(index, counts))})
        else:
            pending = [b for b in np.ndindex(*counts) if b not in done]
        if report:
            report(total - len(pending), total)
        if pending:
            self._run(x, pending, total, report)
        self._finish(identity)

    # The state machine: absent -> recorded (identity.json) -> array created -> blocks marked -> finished.
    def _prepare(self, x: da.Array, identity: StoreIdentity, *, resume: bool, overwrite: bool) -> set[tuple]:
        self._check_parents()
        self._check_links()
        recorded = self._recorded_identity()
        kind = self._node_kind()
        if kind == "group":
            raise TargetMismatchError(
                said(
                    f"{self.name} is a Zarr group; name an array inside it ('{self.path}::name' or ",
                    keyword("dataset", ...),
                    "). store never deletes groups",
                )
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
                finished = self._read_record(COMPLETE_FILE) if kind == "array" and recorded is None else None
                if finished is not None:
                    self._check_existing(x)
                    raise self._refuse_finished(finished, identity)
                if recorded is not None and not resume:
                    raise self._refuse_unfinished()
                if kind == "array":
                    self._check_existing(x)
                if recorded is not None:
                    self._check_identity(recorded, identity)
                raise self._refuse_existing("a Zarr array")
            self._replace_in_place(x)
        missing = self._missing_folders()
        self._record(identity)
        try:
            self._create(x)
        except (InvalidArgumentError, UnsupportedDtypeError):
            # Nothing was written: leave no unfinished store behind for arguments that can never work.
            self._undo_record(missing)
            raise
        return set()

    def _missing_folders(self) -> list[str]:
        parts = self.member.split("/") if self.member else []
        folders = [os.path.join(self.path, *parts[:depth]) for depth in range(len(parts) + 1)]
        return [folder for folder in folders if not os.path.exists(folder)]

    def _undo_record(self, missing: list[str]) -> None:
        """Remove the progress record, and the folders made for it (only while empty: zarr may have put a
        group there)."""
        shutil.rmtree(self.progress_dir, ignore_errors=True)
        for folder in reversed(missing if self.array_dir in missing else [*missing, self.array_dir]):
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def _check_parents(self) -> None:
        """Refuse a member inside an array: only groups hold other nodes, and nothing may be written there."""
        parts = self.member.split("/") if self.member else []
        for depth in range(len(parts)):
            kind = self._parent_kind(parts[:depth])
            if kind is None:
                return  # store creates the missing groups
            if kind == "array":
                inner = "/".join(parts[:depth])
                where = f"{self.path}::{inner}" if inner else self.path
                raise TargetMismatchError(
                    f"{self.name}: {where} is a Zarr array, not a group, so it cannot hold {self.member}; "
                    "name an array outside it. store never writes inside an existing array"
                )

    def _parent_kind(self, parts: list[str]) -> str | None:
        """What the node at ``parts`` of the member's path is (see :func:`zarr_node_kind`), ``None`` if nothing."""
        folder = os.path.join(self.path, *parts)
        return zarr_node_kind(folder) if os.path.isdir(folder) else None

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
        return zarr_node_kind(self.array_dir)

    def recorded(self) -> StoreIdentity | None:
        with contextlib.suppress(TargetMismatchError):
            return self._recorded_identity() or (
                self._read_record(COMPLETE_FILE) if self._node_kind() == "array" else None
            )
        return None

    def completed(self, x: da.Array) -> StoreIdentity | None:
        if self._node_kind() != "array":
            return None
        with contextlib.suppress(TargetMismatchError, TargetDamagedError):
            if self._recorded_identity() is None:  # an unfinished store over a finished one is not complete
                finished = self._read_record(COMPLETE_FILE)
                if finished is not None:
                    self._check_existing(x)
                    return finished
        return None

    def _recorded_identity(self) -> StoreIdentity | None:
        return self._read_record(IDENTITY_FILE)

    def _record_bytes(self, filename: str) -> bytes | None:
        """The bytes of a progress record's file (at most one more than a record may have), ``None`` if absent."""
        try:
            with open_regular(os.path.join(self.progress_dir, filename)) as f:
                return f.read(MAX_RECORD_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _read_record(self, filename: str) -> StoreIdentity | None:
        text = self._record_bytes(filename)
        if text is None:
            return None
        if len(text) > MAX_RECORD_BYTES:
            raise TargetMismatchError(
                said(
                    f"{self.name}: its progress record ({PROGRESS_DIR}/{filename}) is larger than any record "
                    "daskstream writes; ",
                    OVERWRITE,
                    " to start again",
                )
            )
        try:
            return StoreIdentity.from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise self._unreadable_record(f"{PROGRESS_DIR}/{filename}", exc) from None

    def _check_existing(self, x: da.Array) -> None:
        import zarr

        try:
            array = zarr.open_array(store=self._store(read_only=True), path=self.member or "", mode="r")
        except (zarr.errors.NodeNotFoundError, ValueError, TypeError, KeyError) as exc:
            raise TargetDamagedError(
                said(
                    f"{self.name}: zarr could not read the existing array's metadata ({exc}); ",
                    OVERWRITE,
                    " to replace it",
                )
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
            write_atomically(os.path.join(self.progress_dir, IDENTITY_FILE), identity.to_json().encode())
        except OSError as exc:
            raise self.write_error(exc, "record progress") from exc

    def _create(self, x: da.Array) -> None:
        import zarr

        compressors = self._compressors()
        # Zarr chunk sides must be >= 1 even along an empty axis.
        chunks = tuple(max(1, c) for c in chunk_shape(x))
        named: dict[str, Any] = {}
        if self.inner_chunks is not None:
            # Each block one shard, holding chunks of the inner shape.
            named["shards"] = chunks
            chunks = _inner_chunks(self.name, self.inner_chunks, chunks, self.zarr_format)
        attributes = json_ready(dict(self.carried.attrs))
        dims = self.carried.dims
        if dims is not None and self.zarr_format == 3:
            named["dimension_names"] = dims
        elif dims is not None and all(dims):
            attributes[ZARR_V2_DIMENSIONS] = list(dims)  # as xarray names them in format 2
        fill = self.carried.fill_for(x.dtype)
        if fill is not None:
            named["fill_value"] = fill
        elif self.carried.no_fill and self.zarr_format == 2:
            named["fill_value"] = None
        try:
            zarr.create_array(
                self._store(),
                name=self.member,
                shape=x.shape,
                chunks=chunks,
                dtype=x.dtype,
                compressors=compressors,
                zarr_format=self.zarr_format,
                attributes=attributes,
                overwrite=False,
                **named,
            )
            self._carry_scales(x)
        except OSError as exc:
            raise self.write_error(exc, "create the array") from exc
        except (ValueError, TypeError) as exc:
            if not (self.compressor is None or (isinstance(self.compressor, str) and self.compressor == "default")):
                raise InvalidArgumentError(
                    said(
                        f"{self.name}: zarr could not create an array of dtype {x.dtype} with ",
                        keyword("compressor", self.compressor),
                        f' ({exc}); give a zarr compressor, a list of them, None or "default"',
                    )
                ) from None
            raise UnsupportedDtypeError(
                f"{self.name}: zarr could not create an array of dtype {x.dtype} ({exc}); convert the data "
                "to a dtype Zarr stores"
            ) from None

    def _carry_scales(self, x: da.Array) -> None:
        """The source's dimension scales as arrays beside the new one, each named as its dimension and
        naming it (as xarray lays out coordinates); only inside a group, where there is a beside."""
        import zarr

        if self.member is None or not self.carried.scales:
            return
        dims = self.carried.dims or (None,) * x.ndim
        for axis in range(x.ndim):
            found = self.carried.scale_values(axis)
            if found is None:
                continue
            dim = dims[axis] or found[0]
            where = posixpath.join(posixpath.dirname(self.member), dim)
            with contextlib.suppress(FileNotFoundError, KeyError):
                there = zarr.open_array(self._store(read_only=True), path=where, mode="r")
                if not (there.shape == found[1].shape and np.array_equal(np.asarray(there[...]), found[1])):
                    warn(
                        f"{self.name}: the dimension scale of axis {axis} was not copied: {where} already holds "
                        "something else",
                        DaskstreamWarning,
                    )
                continue
            naming: dict[str, Any] = (
                {"dimension_names": [dim]} if self.zarr_format == 3 else {"attributes": {ZARR_V2_DIMENSIONS: [dim]}}
            )
            zarr.create_array(self._store(), name=where, data=found[1], zarr_format=self.zarr_format, **naming)

    def _compressors(self) -> Any:
        if isinstance(self.compressor, str):
            # "default" is zstd at its named level (3): ZstdCodec in format 3, numcodecs.Zstd in format 2.
            name = "zstd" if self.compressor == "default" else self.compressor
            return named_codec(name, "zarr", zarr_format=self.zarr_format)
        return self.compressor

    def _replace_in_place(self, x: da.Array) -> None:
        """Delete what the target holds so that ``x`` is written there (where it cannot be swapped)."""
        self._delete()

    def _delete(self) -> None:
        # Only reached for a Zarr array or an unfinished store's folder: never a group or foreign data.
        try:
            shutil.rmtree(self.array_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self.write_error(exc, "delete the existing array") from exc

    def _remove_partial_files(self) -> None:
        # Temporary files of chunk writes cut short by a kill; zarr never reads them.
        for folder, _, files in os.walk(self.array_dir):
            for name in files:
                if ZARR_PARTIAL.search(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))

    def _done_blocks(self, ndim: int) -> set[tuple[int, ...]]:
        try:
            names = os.listdir(self.done_dir)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        found = (parse_block_name(n, ndim) for n in names)
        return {index for index in found if index is not None}

    def _run(
        self, x: da.Array, pending: Collection[tuple[int, ...]], total: int, report: ProgressCallback | None
    ) -> None:
        writes = PendingWrites(self, x, pending, total, report)
        runner = block_runner()
        try:
            if runner is None:
                writes.write(x, pending)
            else:
                runner(writes)
        finally:
            # Blocks written before a failure or an interruption stay recorded: a resumed store skips them.
            self._flush_written()

    # Where a task finds the store and records its block; an object store's target records blocks itself.
    def _task_store(self) -> Any:
        return self.path

    def _task_done_dir(self) -> str | None:
        return self.done_dir

    def _block_written(self, index: tuple[int, ...]) -> None:
        """A block's task finished (its chunk and its marker are in place)."""

    def _flush_written(self) -> None:
        """Record the blocks written and not yet recorded (the tasks' own markers did, here)."""

    def _compute_options(self, x: da.Array) -> dict[str, Any]:
        """Keywords for ``dask.compute`` of the block tasks: none for a local store."""
        return {}

    def _chunk_writer(self) -> ChunkWriter | None:
        """The writer that encodes chunks in the tasks, when this array's codecs allow (else zarr writes)."""
        import zarr

        if not dask.config.get("daskstream.compute.encode-in-tasks", True):
            return None
        array = zarr.open_array(store=self._store(read_only=True), path=self.member or "", mode="r")
        return chunk_writer_for(self.array_dir, array)

    def _finish(self, identity: StoreIdentity) -> None:
        # What was computed is kept, so the same store run again finds it complete. The identity goes
        # next: from then on the target reads as complete even if the markers' removal is cut short
        # (leftovers are ignored, and removed by overwrite).
        try:
            write_atomically(os.path.join(self.progress_dir, COMPLETE_FILE), identity.to_json().encode())
        except OSError as exc:
            raise self.write_error(exc, "record the finished store") from exc
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.progress_dir, IDENTITY_FILE))
        shutil.rmtree(self.done_dir, ignore_errors=True)


def zarr_node_kind(folder: str) -> str | None:
    """What the Zarr node at ``folder`` is: ``"array"``, ``"group"``, ``"other"`` or ``None`` (nothing)."""
    if not os.path.exists(folder):
        return None
    if not os.path.isdir(folder):
        return "other"
    kind = folder_node_type(folder)
    if kind is not None:
        return "other" if kind == "damaged" else kind
    leftovers = set(os.listdir(folder)) - {PROGRESS_DIR}
    return "other" if leftovers else None
