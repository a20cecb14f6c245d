"""Zarr arrays (format 2 and 3) through zarr-python 3: directories, zip files and fsspec URLs.

The three kinds of store share one source, whose opening, stamps, token and
listing of members each differ by kind; kept together, a change to one is seen
beside the others. What it reads the store's metadata with lives beside it:
nodes (:mod:`~daskstream.sources.zarr.nodes`), codecs
(:mod:`~daskstream.sources.zarr.codecs`) and the digests its token is made of
(:mod:`~daskstream.sources.zarr.digests`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
from typing import Any, Literal

import numpy as np

from daskstream.advice import keyword, said
from daskstream.dependencies import installed_version
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    MemberNotFoundError,
    MissingDependencyError,
    NotAnArrayError,
    SourceChangedError,
    SourceNotFoundError,
    UnsupportedDtypeError,
)
from daskstream.files import open_regular
from daskstream.sources.base import (
    REREAD_ADVICE,
    Region,
    Source,
    checked_shape,
    file_stamp,
    listing,
    native,
    now_ns,
    sample_box,
    string_dtype,
    string_element_bytes,
)
from daskstream.sources.handles import cached_handle
from daskstream.sources.metadata import plain, zarr_attrs, zarr_dims
from daskstream.sources.objects.places import Got, Place, is_url, public_options
from daskstream.sources.tokens import source_token
from daskstream.sources.zarr.bounds import largest_chunk_file
from daskstream.sources.zarr.checks import check_zarr_reads, checked_store
from daskstream.sources.zarr.chunks import chunk_reader_for, reads_shards_in_part
from daskstream.sources.zarr.codecs import _unavailable_codec, codec_configs, codec_names
from daskstream.sources.zarr.digests import _listing_digest, _tree_digest, metadata_digest
from daskstream.sources.zarr.files import ChunkObjects, check_chunk_files
from daskstream.sources.zarr.nodes import (
    _MAX_METADATA_BYTES,
    ZARR_METADATA_FILES,
    _arrays_among,
    _check_metadata_files,
    _member_name,
)
from daskstream.sources.zarr.shards import MOST_RUN_BYTES
from daskstream.sources.zip_members import ZipMembers

# What zarr-python raises for metadata it cannot parse or chunks it cannot decode.
# ImportError: a codec whose package is missing (some numcodecs releases say so on creating it).
_ZARR_READ_ERRORS = (ValueError, TypeError, KeyError, RuntimeError, OSError, ImportError)


def local_path(path: str) -> str:
    """``path`` without a ``file://`` scheme: the one place that reads ``file://`` URLs as local paths.

    >>> local_path("file:///data/a.zarr"), local_path("/data/a.zarr")
    ('/data/a.zarr', '/data/a.zarr')
    """
    return path.removeprefix("file://")


class ZarrSource(Source):
    """An array in a Zarr store.

    Parameters
    ----------
    path
        A store directory, a ``.zip`` file holding a store, or an fsspec URL
        (``s3://``, ``gs://``, ``http://``... whatever fsspec can reach).
    dataset
        The array's path inside the store when the root is a group; may be
        omitted when the store holds exactly one array.
    storage_options
        Passed to fsspec for URLs (credentials, endpoints...). Secrets among
        them stay in this process: see :mod:`daskstream.sources.objects.places`.

    Notes
    -----
    ``storage_chunks`` is the chunk grid: the unit a task reads without
    reading more than it needs. Shards in a directory or on an object store
    are read in part (their index, then the byte ranges of the inner chunks a
    task needs: :mod:`daskstream.sources.zarr.shards`). In a local directory
    that costs no more than reading them whole, so the inner chunks are the
    unit; on an object store each part is a request, and in a zip file shards
    are read whole, so the shards are. ``shard_chunks`` is the grid of files
    or objects either way. Missing chunks read as the fill value, as the format says.

    On an object store, opening lists the array's objects with their versions
    (ETags: one listing request per thousand objects). The token is made from
    that listing, so a rewritten chunk gives the array a new name, and every
    read compares the version each GET returns with the listed one: an object
    rewritten, deleted or added since is a :class:`SourceChangedError`.
    """

    format = "zarr"
    storage_chunks: tuple[int, ...]  # every Zarr array is stored in chunks

    def __init__(
        self,
        path: str | os.PathLike[str],
        dataset: str | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        path = local_path(os.fspath(path))
        self.path = path if is_url(path) else os.path.abspath(path)
        self.storage_options = dict(storage_options or {})
        self.place = Place(self.path, self.storage_options) if is_url(self.path) else None
        self._metadata_seen: dict[str, tuple[str, Got] | None] = {}
        if self.place is None:
            file_stamp(self.path)  # our not-found / permission errors rather than zarr's
        else:
            self.place.check_reachable()  # endpoint, credentials and bucket: one clear line, before zarr
        self.opened_ns = now_ns()
        if not is_url(self.path) and os.path.isdir(self.path):
            _check_metadata_files(self.path, (dataset or "").strip("/"))
        array = self._open_member(dataset)
        self.dataset = _member_name(array)
        # Every task decodes with the metadata its process opens the array with: it must be this one.
        self.metadata_digest = metadata_digest(array)
        # Stamp the array found, not the path given: a root group's files stay as they were
        # when the one array inside it is rewritten.
        stamp = self._stamp(self.dataset)
        dtype = np.dtype(array.dtype)
        if _holds_text(array):  # StringDType where numpy has it (zarr reads text so), refused clearly where not
            dtype = string_dtype(self.name)
        if dtype.hasobject and dtype.kind != "T":  # StringDType counts as holding objects too
            raise UnsupportedDtypeError(
                f"{self.name}: dtype {array.dtype} holds Python objects (variable-length bytes, pickles...), "
                "which daskstream does not read (it never unpickles data); store fixed-width data instead"
            )
        self.shape = checked_shape(self.name, tuple(array.shape), dtype.itemsize)
        # Format 2 keeps the byte order in the dtype and zarr returns data in it.
        self.dtype = native(dtype)
        self.shard_chunks = tuple(int(c) for c in (array.shards or array.chunks))
        self.inner_chunks = tuple(int(c) for c in array.chunks)
        # Planned in inner chunks where a shard read in part costs no more than read whole: a local file. On
        # an object store every part is a request of its own, so tasks keep to whole shards (parts of them are
        # still read by range where a task wants only a part).
        self.shards_in_part = reads_shards_in_part(array, self.place is None and os.path.isdir(self.path))
        self.storage_chunks = self.inner_chunks if self.shards_in_part else self.shard_chunks
        if len(self.shard_chunks) != self.ndim or any(c < 1 for c in (*self.shard_chunks, *self.inner_chunks)):
            raise CorruptSourceError(
                f"{self.name}: the metadata declares chunks {self.inner_chunks} for shape {self.shape}; every "
                "chunk side must be at least 1, one per axis. The metadata is damaged: re-create the store"
            )
        self.zarr_format = array.metadata.zarr_format
        self.attrs = zarr_attrs(array)
        self.dims = zarr_dims(array)
        self.fill_value = plain(array.fill_value)
        self.codecs = codec_names(array)
        self.codec_configs = codec_configs(array)
        self.layout = "chunked"
        self._objects: dict[str, str] | None = None
        self._object_sizes: dict[str, int] = {}
        if self.place is not None:
            self._objects, self._object_sizes = self._array_place().versions_and_sizes()
            tree: tuple[str, ...] = (_listing_digest(self._objects),)
        else:
            tree = () if not os.path.isdir(self.path) else (_tree_digest(self.path, self.dataset),)
        self.objects_digest = tree[0] if self.place is not None else None
        self.token = source_token(self.format, self.path, *stamp, *tree, dataset=self.dataset)
        # Checked by every read, for local stores (a remote one would cost a request per task).
        self.stamp = None if is_url(self.path) else stamp
        if self.dtype.kind == "T":  # variable-length strings: what the first hold says what blocks of them take
            sample = self._read_box(sample_box(self.shape)) if self.size else np.empty(0, self.dtype)
            self.element_bytes = string_element_bytes(sample)

    def __getstate__(self) -> dict[str, Any]:
        # Secrets stay here, and so does the listing of a remote store (a process that reads lists it again).
        state = {**self.__dict__, "storage_options": public_options(self.storage_options), "_objects": None}
        state["_object_sizes"] = {}
        return {**state, "_metadata_seen": {}}

    def _array_place(self) -> Place:
        assert self.place is not None
        return self.place.child(self.dataset) if self.dataset else self.place

    def _object_versions(self) -> dict[str, str]:
        """The remote array's objects and versions as listed when opened (listed again in another process)."""
        if self._objects is None:
            listed, sizes = self._array_place().versions_and_sizes()
            if _listing_digest(listed) != self.objects_digest:
                raise SourceChangedError(
                    f"{self.name}: the store's objects changed after it was opened (listed again by a worker, "
                    f"they differ); {REREAD_ADVICE}"
                )
            self._objects, self._object_sizes = listed, sizes
        return self._objects

    def _listed_sizes(self) -> dict[str, int]:
        """The remote array's objects and their sizes, from the listing the versions came from."""
        self._object_versions()
        return self._object_sizes

    def _store(self) -> Any:
        import zarr

        # Every read zarr makes goes through checked_store: zip members within the sizes they may hold,
        # and the chunks of an array zarr decodes checked first (check_zarr_reads, once it is open).
        if is_url(self.path):
            store = zarr.storage.FsspecStore.from_url(self.path, storage_options=self.storage_options, read_only=True)
            return checked_store(store)
        if os.path.isfile(self.path):
            members = ZipMembers(self.path)
            return checked_store(zarr.storage.ZipStore(self.path, mode="r"), members, _MAX_METADATA_BYTES)
        return checked_store(zarr.storage.LocalStore(self.path, read_only=True))

    def _open_member(self, dataset: str | None) -> Any:
        import zarr

        member = (dataset or "").strip("/")
        try:
            known = self._remote_array_format(member)
            node: Any
            if known is not None:
                # The metadata fetched already says what is there: zarr reads just that document again.
                node = zarr.open_array(store=self._store(), mode="r", path=member, zarr_format=known)
            else:
                node = zarr.open(store=self._store(), mode="r", path=member)
        except zarr.errors.NodeNotFoundError:
            if not member and is_url(self.path):
                raise SourceNotFoundError(f"{self.path}: no Zarr metadata found there; check the URL") from None
            if not member:
                raise CorruptSourceError(f"{self.path}: holds no readable Zarr metadata; check the path") from None
            have = listing(self.list_arrays(), empty="no arrays")
            raise MemberNotFoundError(f"array {dataset!r} not found in {self.path}; it has: {have}") from None
        except _ZARR_READ_ERRORS as exc:
            raise self._metadata_error(member, exc) from None
        if isinstance(node, zarr.Array):
            return node
        inside = self.list_arrays(member)
        if not member and len(inside) == 1:
            return self._open_member(inside[0])
        if member:
            raise NotAnArrayError(
                f"{self.path}::{member} is a group, not an array; arrays inside it: {listing(inside, empty='none')}"
            )
        raise MemberNotFoundError(
            said(
                f"{self.path}: the store's root is a group; give the array to read as ",
                keyword("dataset", ...),
                f" or '{self.path}::name'; it has: {listing(inside, empty='no arrays')}",
            )
        )

    def list_arrays(self, under: str = "") -> list[str]:
        """Paths of the arrays in the store (below ``under``), found from metadata keys alone.

        Listing keys rather than opening every node keeps one unreadable array
        from hiding the others. Zip members named outside the store (``../x``,
        ``/x``) are never listed: zarr would not read them as members.
        """
        if os.path.isfile(self.path) and not is_url(self.path):
            return self._zip_arrays(under)
        import fsspec

        if is_url(self.path):
            fs, root = fsspec.core.url_to_fs(self.path, **self.storage_options)
        else:
            fs, root = fsspec.filesystem("file"), self.path
        base = posixpath.join(root, under) if under else root
        try:
            keys = fs.find(base)
        except (OSError, ValueError):
            return []

        def read(key: str) -> bytes:
            if is_url(self.path):
                return fs.cat_file(key)
            with open_regular(key) as f:  # a pipe in a metadata file's place would block
                return f.read(_MAX_METADATA_BYTES)

        return _arrays_among([(posixpath.relpath(key, root), key) for key in keys], read)

    def _zip_arrays(self, under: str) -> list[str]:

        try:
            members = ZipMembers(self.path)  # members read within the sizes they may hold, not as zipfile believes
        except OSError:
            return []
        names = [n for n in members.infos if not under or n.startswith(under.strip("/") + "/")]
        return _arrays_among([(n, n) for n in names], lambda n: members.read(n, _MAX_METADATA_BYTES) or b"")

    def _metadata_error(self, member: str, exc: BaseException) -> Exception:
        where = f"{self.path}::{member}" if member else self.path
        unavailable = _unavailable_codec(exc)
        if unavailable is not None:
            codec, package = unavailable
            install = (
                f"pip install {package}"
                if package
                else "install the package that provides it (zarr and numcodecs find codecs by entry point)"
            )
            return MissingDependencyError(
                f"{where}: the array's codec {codec!r} is not available in this installation (zarr "
                f"{installed_version('zarr')}, numcodecs {installed_version('numcodecs')}); {install}, then open it again"
            )
        if isinstance(exc, ImportError):
            return MissingDependencyError(
                f"{where}: reading the array needs a package that could not be imported ({exc}); install it, "
                "then open it again"
            )
        dtype = self._declared_dtype(member)
        if dtype is not None and np.dtype(dtype).kind in "SUO":
            return UnsupportedDtypeError(
                f"{where}: zarr-python cannot read this array's metadata (dtype {dtype}: {exc}); "
                "rewrite it with a valid fill_value for that dtype, or convert the data to a numeric dtype"
            )
        return CorruptSourceError(
            f"{where}: zarr could not read the store's metadata ({exc}); check or re-create the store"
        )

    def _declared_dtype(self, member: str) -> str | None:
        if is_url(self.path) or not os.path.isdir(self.path):
            return None
        meta = os.path.join(self.path, member, ".zarray")
        try:
            with open_regular(meta) as f:
                declared = json.load(f).get("dtype")
            np.dtype(declared)
        except (OSError, ValueError, TypeError, AttributeError, RecursionError):
            return None
        return declared

    def current_stamp(self) -> tuple[Any, ...]:
        return self._stamp(self.dataset)

    def _stamp(self, dataset: str | None) -> tuple[Any, ...]:
        """File stamps that change when the array is rewritten."""
        if is_url(self.path):
            return (self._remote_metadata_digest(dataset),)
        if os.path.isfile(self.path):
            return file_stamp(self.path)
        if not os.path.isdir(self.path):
            file_stamp(self.path)  # raises our not-found / permission error
        member_dir = os.path.join(self.path, (dataset or "").strip("/"))
        stamps: list[Any] = []
        # Format 2's attributes are a file of their own, and decoding (CF scale factors, fill values) reads them.
        for name in (*ZARR_METADATA_FILES, ".zattrs"):
            meta = os.path.join(member_dir, name)
            if os.path.exists(meta):
                stamps.extend((name, *file_stamp(meta)))
        # Chunk files appearing or vanishing change the directory's own mtime.
        if os.path.isdir(member_dir):
            stamps.append(os.stat(member_dir).st_mtime_ns)
        return tuple(stamps)

    def _remote_metadata(self, dataset: str | None) -> tuple[str, Got] | None:
        """The name and object of a remote member's metadata document (the first of ``ZARR_METADATA_FILES``
        there), all three asked for at once and kept: the open and the stamp read the same one."""
        member = (dataset or "").strip("/")
        if member not in self._metadata_seen:
            assert self.place is not None
            place = self.place.child(member) if member else self.place
            found = zip(ZARR_METADATA_FILES, place.get_many(list(ZARR_METADATA_FILES)))
            self._metadata_seen[member] = next(((n, got) for n, got in found if got.data is not None), None)
        return self._metadata_seen[member]

    def _remote_array_format(self, member: str) -> Literal[2, 3] | None:
        """2 or 3 when the remote member is an array of that format, ``None`` otherwise (or locally)."""
        if self.place is None:
            return None
        found = self._remote_metadata(member)
        if found is None or found[0] == ".zgroup":
            return None
        if found[0] == ".zarray":
            return 2
        try:
            is_array = json.loads(found[1].data or b"").get("node_type") == "array"
        except (ValueError, AttributeError, RecursionError):
            return None  # zarr says what is wrong with it
        return 3 if is_array else None

    def _remote_metadata_digest(self, dataset: str | None) -> str:
        found = self._remote_metadata(dataset)
        if found is None:
            assert self.place is not None
            member = self.place.child(dataset) if dataset else self.place
            raise SourceNotFoundError(f"{member.url}: no Zarr metadata found there; check the URL and dataset")
        got = found[1]
        # Rewritten data often leaves identical metadata bytes; the object's version does not.
        return hashlib.sha1((got.data or b"") + repr(got.version).encode(), usedforsecurity=False).hexdigest()

    def _array(self) -> Any:
        import zarr

        def open_array() -> Any:
            try:
                array = zarr.open_array(store=self._store(), path=self.dataset or "", mode="r")
            except (*_ZARR_READ_ERRORS, zarr.errors.NodeNotFoundError) as exc:
                raise SourceChangedError(
                    f"{self.name}: the array's metadata can no longer be read as it was when opened "
                    f"({type(exc).__name__}: {exc}); {REREAD_ADVICE}"
                ) from None
            # The handle is kept for the tasks that follow: what they decode with is checked here, once.
            if metadata_digest(array) != self.metadata_digest:
                raise SourceChangedError(
                    f"{self.name}: the array's metadata (dtype, shape, chunks, codecs, fill value or attributes) "
                    f"was rewritten after it was opened, so its chunks would be decoded otherwise; {REREAD_ADVICE}"
                )
            check_zarr_reads(array, self.name)
            return array

        return cached_handle(("zarr", self.path, self.dataset, self.token), open_array)

    def _chunk_reader(self) -> Any:
        # False (not None, which the cache reads as "not opened yet") when zarr must read this array.
        objects = (
            None if self.place is None else ChunkObjects(self._array_place(), self._object_versions, self._listed_sizes)
        )
        return cached_handle(
            ("zarr-chunks", self.path, self.dataset, self.token),
            lambda: chunk_reader_for(self._array(), objects) or False,
        )

    def _read_box(self, box: Region) -> np.ndarray:
        if self.place is None:
            return self._read_box_from(box)
        # A worker opening the array reaches the store for the first time: its failures are one line too.
        with self.place.errors("read"):
            return self._read_box_from(box)

    def _read_box_from(self, box: Region) -> np.ndarray:
        reader = self._chunk_reader()
        if reader:
            out = np.empty(tuple(s.stop - s.start for s in box), dtype=self.dtype)
            reader.read_box(box, out, self.name, written_before_ns=self.opened_ns)
            return out
        local = self.stamp is not None and os.path.isdir(self.path)
        if local:
            self._check_chunk_files(box)
        try:
            out = np.asarray(self._array()[box])
        except DaskstreamError:
            raise  # a chunk refused by the checks zarr reads through: already one line naming it
        except _ZARR_READ_ERRORS as exc:
            region = "[" + ", ".join(f"{s.start}:{s.stop}" for s in box) + "]"
            raise CorruptSourceError(
                f"{self.name}: zarr could not read region {region} ({type(exc).__name__}: {exc}); "
                "a chunk may be damaged: re-create or re-copy the store"
            ) from exc
        if local:
            self._check_chunk_files(box)  # rewritten while zarr read them
        return out if out.dtype.isnative else out.astype(self.dtype)

    def _check_chunk_files(self, box: Region) -> None:
        root = os.path.join(self.path, self.dataset or "")
        array = self._array()
        key, largest = array.metadata.encode_chunk_key, largest_chunk_file(array)
        check_chunk_files(root, key, self.shard_chunks, box, self.name, self.opened_ns, largest)

    @property
    def decode_bytes(self) -> int:
        """A chunk (or shard) file is held as stored while one (inner) chunk of it is decoded; a shard read
        in part, one run of its inner chunks at a time.

        Whole chunks, as the metadata states them: chunks at the array's edge are stored and decoded
        whole, and metadata may state chunks larger than the array.
        """
        stored = math.prod(self.shard_chunks) * self.dtype.itemsize
        inner = math.prod(self.inner_chunks) * self.dtype.itemsize
        if self.shards_in_part:
            stored = min(stored, max(MOST_RUN_BYTES, inner))
        return stored + (inner if self.codecs else 0)

    def describe_storage(self) -> str:
        grid = (
            f"shards {self.shard_chunks} of chunks {self.inner_chunks}"
            if self.shard_chunks != self.inner_chunks
            else f"chunks {self.shard_chunks}"
        )
        codecs = "+".join(self.codecs) or "no codecs"
        return f"zarr v{self.zarr_format}, {grid}, {codecs}"


def _holds_text(array: Any) -> bool:
    """Whether the array's data type is variable-length UTF-8 text (``string`` in format 3, ``vlen-utf8`` in 2)."""
    declared = array.metadata.data_type if array.metadata.zarr_format == 3 else array.metadata.dtype
    return type(declared).__name__ == "VariableLengthUTF8"
