"""Zarr targets on an object store (S3, GCS, Azure, memory...): the local target's protocol over objects.

The states are a local Zarr target's -- recorded (``identity.json``), array
created, blocks recorded, finished (``complete.json``) -- kept as objects in
the array's own prefix, under ``.daskstream-store/``. What differs is how
each is made safe:

* A chunk (or shard) is one PUT of its whole object, which object stores make
  atomic: no temporary name, nothing partial to clean up after a kill.
* Blocks are recorded by the calling process, not by each task: as tasks
  finish it collects their blocks and puts one small object listing them
  every ``daskstream.objects.record-every`` blocks or seconds, whichever
  comes first (and when the store ends or fails), instead of one marker object per block.
  A store killed in between writes those blocks again when resumed: the same
  bytes, so nothing is lost but a few requests.
* Requests wait on the network, not on the CPU: on the threaded scheduler the
  block tasks run on more threads than there are cores (as many as the memory
  budget holds blocks, at most ``daskstream.objects.write-threads``), so the
  latency of one PUT overlaps with the others'.
* The array's metadata object is read back before the store is declared
  finished: an array deleted or replaced meanwhile is an error, not a store
  reported complete.

Secrets in ``storage_options`` stay in this process (see
:mod:`daskstream.sources.objects.places`); workers of a cluster use their own
credentials.
"""

from __future__ import annotations

import json
import math
import posixpath
import time
import uuid
from typing import Any, Literal

import dask.array as da

from daskstream import config
from daskstream.advice import said
from daskstream.compute.store.chunk_writer import ChunkWriter, chunk_writer_for
from daskstream.compute.store.record import (
    COMPLETE_FILE,
    DONE_DIR,
    IDENTITY_FILE,
    PROGRESS_DIR,
    StoreIdentity,
    block_name,
    chunk_shape,
    parse_block_name,
)
from daskstream.compute.store.target import OVERWRITE, Carried, write_error
from daskstream.compute.store.zarr_target import ZarrTarget
from daskstream.errors import DaskstreamError, InvalidArgumentError, TargetMismatchError, TargetWriteError
from daskstream.graph.readers import unplaced_readers
from daskstream.planning.settings import Resources
from daskstream.runtime.schedulers import scheduler_kind
from daskstream.sources.base import Source
from daskstream.sources.objects.places import Place, endpoint_of, is_url

_METADATA_KEYS = ("zarr.json", ".zarray", ".zgroup")


class ObjectZarrTarget(ZarrTarget):
    """A Zarr array written under a URL (``s3://bucket/out.zarr``), resumably.

    Parameters
    ----------
    url
        The store's URL; ``member`` names an array inside it.
    storage_options
        fsspec options to reach it (endpoint, profile, credentials...).
    resources
        The budget and threads the store plans for, which bound the threads
        writing; ``None`` for a target only read (what it holds, its size).
    """

    def __init__(
        self,
        url: str,
        member: str | None,
        compressor: Any,
        zarr_format: Literal[2, 3],
        carried: Carried | None = None,
        inner_chunks: tuple[int, ...] | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        resources: Resources | None = None,
    ) -> None:
        super().__init__(url, member, compressor, zarr_format, carried, inner_chunks)
        self.resources = resources
        self.path = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.place = Place(self.path, self.storage_options)
        self.array_place = self.place.child(member) if member else self.place
        self.place.check_reachable()  # endpoint, credentials and bucket: one clear line before anything else
        self.array_dir = self.array_place.url
        self._written: list[tuple[int, ...]] = []
        self._recorded_at = time.monotonic()
        self._metadata_version: str | None = None

    # --- what the target holds ---------------------------------------------------------------------

    def stored_bytes(self) -> int:
        """Bytes of the array's objects (metadata and chunks), its progress record left out."""
        sizes = self.array_place.sizes()
        return sum(size for key, size in sizes.items() if key.split("/", 1)[0] != PROGRESS_DIR)

    def check_sources(self, sources: list[Source]) -> None:
        mine = bucket_path(self.array_place)
        for source in sources:
            if not is_url(source.path):
                continue  # a local file cannot be this object store's data
            theirs = bucket_path(Place(source.name.replace("::", "/"), getattr(source, "storage_options", {})))
            if theirs is None or mine is None or not same_store(theirs[0], mine[0]):
                continue
            inside, around = _within(theirs[1], mine[1]), _within(mine[1], theirs[1])
            if inside and around:
                raise self._reads_itself(source, "which is this very target")
            if inside:
                raise self._reads_itself(source, f"which is stored inside this target, at {source.name}")
            if around:
                raise self._reads_itself(source, f"and this target lies inside it, at {source.name}")

    # --- replacing: an object store has no rename to swap with ------------------------------------------

    def recover(self) -> None:
        """Nothing to recover: an object store's target is never swapped."""

    def _replaces(self, identity: StoreIdentity, *, resume: bool) -> bool:
        return False

    def _replace_in_place(self, x: da.Array) -> None:
        """Delete the array there for ``x`` -- only when every reader in ``x``'s graph is known (and, by
        :meth:`check_sources`, reads elsewhere): an object store cannot write beside and swap."""
        unplaced = unplaced_readers(x)
        if unplaced:
            raise InvalidArgumentError(
                said(
                    f"{self.name}: the array stored reads through {', '.join(unplaced[:3])}"
                    f"{' and more' if len(unplaced) > 3 else ''}, whose data may come from this very target, and "
                    "an object store cannot write the new array beside the old and swap them: replacing it would "
                    "delete what is read before it is read. Open the data with daskstream (whose reads name "
                    "their place), or store to a new URL and delete the old one after"
                )
            )
        self._delete()

    def _parent_kind(self, parts: list[str]) -> str | None:
        return remote_node_kind(self.place.child("/".join(parts)) if parts else self.place)

    def _check_links(self) -> None:
        """Object stores have no links to follow."""

    def _node_kind(self) -> str | None:
        return remote_node_kind(self.array_place)

    def _record_bytes(self, filename: str) -> bytes | None:
        # One more byte than a record may have tells an oversized object from a record.
        return self.array_place.get_head(f"{PROGRESS_DIR}/{filename}", _MAX_RECORD_READ).data

    def _store(self, *, read_only: bool = False) -> Any:
        import zarr

        return zarr.storage.FsspecStore.from_url(self.path, storage_options=self.storage_options, read_only=read_only)

    def _done_blocks(self, ndim: int) -> set[tuple[int, ...]]:
        listed = self.array_place.listing(f"{PROGRESS_DIR}/{DONE_DIR}")
        found: set[tuple[int, ...]] = set()
        for got in self.array_place.get_many(sorted(listed)):
            try:
                names = json.loads(got.data or b"[]")
            except ValueError:
                continue  # a record cut short is no record: its blocks are written again
            for name in names if isinstance(names, list) else ():
                index = parse_block_name(str(name), ndim)
                if index is not None:
                    found.add(index)
        return found

    # --- changing it -----------------------------------------------------------------------------

    def _missing_folders(self) -> list[str]:
        return []  # prefixes exist while objects are below them

    def _undo_record(self, missing: list[str]) -> None:
        self.array_place.delete_tree(PROGRESS_DIR)

    def _record(self, identity: StoreIdentity) -> None:
        try:
            # Records left by anything before belong to no computation of ours now.
            self.array_place.delete_tree(PROGRESS_DIR)
            self.array_place.put(f"{PROGRESS_DIR}/{IDENTITY_FILE}", identity.to_json().encode())
        except DaskstreamError:
            raise
        except OSError as exc:
            raise self.write_error(exc, "record progress") from exc

    def _delete(self) -> None:
        # Only reached for a Zarr array or an unfinished store's prefix: never a group or foreign data.
        self.array_place.delete_tree()

    def _remove_partial_files(self) -> None:
        """A PUT is whole or absent: nothing partial is ever left."""

    def _chunk_writer(self) -> ChunkWriter | None:
        import zarr

        array = zarr.open_array(store=self._store(read_only=True), path=self.member or "", mode="r")
        self._metadata_version = _metadata_version(self.array_place)
        return chunk_writer_for(self.array_dir, array, place=self.array_place)

    def _task_store(self) -> Any:
        return self.place  # the store's root: a task opens the member inside it

    def _task_done_dir(self) -> str | None:
        return None  # this process records the blocks (see _block_written)

    def _block_written(self, index: tuple[int, ...]) -> None:
        self._written.append(index)
        blocks, seconds = config.setting("objects.record-every.blocks"), config.setting("objects.record-every.seconds")
        if len(self._written) >= blocks or time.monotonic() - self._recorded_at >= seconds:
            self._flush_written()

    def _flush_written(self) -> None:
        if not self._written:
            return
        names = [block_name(index) for index in self._written]
        try:
            self.array_place.put(f"{PROGRESS_DIR}/{DONE_DIR}/{uuid.uuid4().hex}.json", json.dumps(names).encode())
        except DaskstreamError:
            raise
        except OSError as exc:
            raise self.write_error(exc, "record the blocks written") from exc
        self._written = []
        self._recorded_at = time.monotonic()

    def _compute_options(self, x: da.Array) -> dict[str, Any]:
        """More threads than cores on the threaded scheduler: they wait on requests, each holding a block."""
        resources = self.resources
        if scheduler_kind() != "threads" or resources is None:
            return {}
        block = max(1, math.prod(max(c, 1) for c in chunk_shape(x)) * x.dtype.itemsize) if x.ndim else x.dtype.itemsize
        # A block, its encoded bytes and the array it is computed from, per thread.
        held = max(1, resources.memory_budget // (3 * block))
        most = int(config.setting("objects.write-threads"))
        return {"num_workers": max(resources.threads, min(most, held))}

    def _finish(self, identity: StoreIdentity) -> None:
        if self._metadata_version is not None and _metadata_version(self.array_place) != self._metadata_version:
            raise TargetMismatchError(
                said(
                    f"{self.name}: the array's metadata object was deleted or rewritten while store wrote it; ",
                    OVERWRITE,
                    " to store it again",
                )
            )
        try:
            self.array_place.put(f"{PROGRESS_DIR}/{COMPLETE_FILE}", identity.to_json().encode())
            # From here the target reads as complete; what is left of the record is removed after.
            self.array_place.delete([f"{PROGRESS_DIR}/{IDENTITY_FILE}"])
            self.array_place.delete_tree(f"{PROGRESS_DIR}/{DONE_DIR}")
        except DaskstreamError:
            raise
        except OSError as exc:
            raise self.write_error(exc, "record the finished store") from exc

    def write_error(self, exc: BaseException, doing: str) -> TargetWriteError:
        return write_error(self.name, exc, doing, self._after_failure)


# A record is a few hundred bytes; one more byte than the largest tells an object that is not one.
_MAX_RECORD_READ = (1 << 20) + 1


def remote_node_kind(place: Place) -> str | None:
    """What the Zarr node at ``place`` is: ``"array"``, ``"group"``, ``"other"`` or ``None`` (nothing there)."""
    metadata = dict(zip(_METADATA_KEYS, place.get_many(list(_METADATA_KEYS))))
    v3 = metadata["zarr.json"].data
    if v3 is not None:
        try:
            node_type = json.loads(v3).get("node_type")
        except (ValueError, AttributeError, RecursionError):
            return "other"
        return "array" if node_type == "array" else "group"
    if metadata[".zarray"].data is not None:
        return "array"
    if metadata[".zgroup"].data is not None:
        return "group"
    leftovers = {key.split("/", 1)[0] for key in place.listing()} - {PROGRESS_DIR}
    if not leftovers and place.get().data is not None:
        return "other"  # an object at the prefix itself: a file, not a store
    return "other" if leftovers else None


def _metadata_version(place: Place) -> str | None:
    for key, got in zip(_METADATA_KEYS[:2], place.get_many(list(_METADATA_KEYS[:2]))):
        if got.data is not None:
            return f"{key}:{got.version}:{hash(got.data)}"
    return None


def bucket_path(place: Place) -> tuple[tuple[str, str, str], str] | None:
    """``((file system, endpoint, bucket), path inside it)`` of a place, to compare two places' extents."""
    url = place.url
    if "://" not in url:
        return None
    protocol, rest = url.split("://", 1)
    bucket, _, inside = rest.partition("/")
    return (filesystem_of(protocol), str(endpoint_of(place.storage_options) or ""), bucket), posixpath.normpath(
        "/" + inside
    )


def filesystem_of(protocol: str) -> str:
    """The fsspec file system a URL's ``protocol`` reaches, by fsspec's own table of aliases (``s3``/``s3a``,
    ``gs``/``gcs``, ``abfs``/``az``...), without importing it; the protocol itself where fsspec knows none.

    >>> filesystem_of("s3a") == filesystem_of("S3")
    True
    >>> import s3fs  # registers the class under its own module's name
    >>> filesystem_of("s3a") == filesystem_of("s3")
    True
    """
    from fsspec.registry import known_implementations, registry

    name = protocol.lower()
    # fsspec's table names a class by its public path ("s3fs.S3FileSystem") and its registry, once a file
    # system is imported, by where it is defined ("s3fs.core.S3FileSystem"): the table comes first, so one
    # protocol gives one name whatever has been imported; the registry answers for protocols only it knows.
    if name in known_implementations:
        return str(known_implementations[name]["class"])
    if name in registry:
        kind = registry[name]
        return f"{kind.__module__}.{kind.__qualname__}"
    return name


def same_store(first: tuple[str, str, str], second: tuple[str, str, str]) -> bool:
    """Whether two ``(file system, endpoint, bucket)`` may be one store: one file system and bucket, and
    endpoints that are the same or not both known (the one not given may be the other's, by the environment)."""
    return first[0] == second[0] and first[2] == second[2] and (first[1] == second[1] or not (first[1] and second[1]))


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
