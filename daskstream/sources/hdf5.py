"""HDF5 datasets, read through h5py with one cached file handle per process."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from daskstream.dependencies import installed_version, optional_import
from daskstream.errors import (
    CorruptSourceError,
    MemberNotFoundError,
    MissingDependencyError,
    NotAnArrayError,
    UnsupportedDtypeError,
)
from daskstream.sources.base import Region, Source, checked_element, file_stamp, listing, native, now_ns
from daskstream.sources.contiguous import read_contiguous_box
from daskstream.sources.handles import cached_handle
from daskstream.sources.hdf5_chunks import DECODABLE, ChunkDecoder, ChunkedReader, ChunkIndex
from daskstream.sources.linked import (
    LinkedFile,
    check_external_links,
    check_linked_files,
    external_prefix,
    linked_files,
)
from daskstream.sources.metadata import hdf5_attrs, hdf5_dims, hdf5_scales
from daskstream.sources.tokens import source_token

if TYPE_CHECKING:
    from daskstream.planning.plan import ChunkPlan
    from daskstream.planning.settings import PlanSettings

HDF5_LOCK_NOTE = (
    "HDF5 decompression holds h5py's global lock: threads will not run in parallel; "
    "use session('processes') or 'distributed' for compressed HDF5"
)

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

# Raw on-disk bytes equal numpy's for these kinds, so contiguous data can skip h5py.
_RAW_READABLE_KINDS = set("biufcS")


# Filters hdf5plugin provides, by the ids registered with The HDF Group: bzip2, blosc, lz4, bitshuffle,
# zfp, zstd, sz, fcidecomp, sz3, blosc2. Named without importing it, to say what to install.
_HDF5PLUGIN_FILTERS = frozenset({307, 32001, 32004, 32008, 32013, 32015, 32017, 32018, 32024, 32026})


def _missing_filter(name: str, pipeline: tuple, filters: tuple[str, ...], h5py: Any) -> MissingDependencyError | None:
    """The error naming what provides a filter of the dataset that h5py cannot decode here, if one is missing.

    Without it a read that needs the filter fails deep in HDF5 ("can't open
    directory ... plugin"), which reads as a damaged file.
    """
    for (code, _), filter_name in zip(pipeline, filters, strict=True):
        if h5py.h5z.filter_avail(code):
            continue
        needed_for = f"{name}: decoding its HDF5 filter {filter_name!r} (id {code})"
        if code not in _HDF5PLUGIN_FILTERS:
            return MissingDependencyError(
                f"{needed_for} needs an HDF5 filter plugin that neither h5py nor hdf5plugin provides: install the "
                "plugin for that filter and set HDF5_PLUGIN_PATH to the folder holding it"
            )
        try:  # says whether hdf5plugin is missing, too old or cannot load
            optional_import("hdf5plugin", package="hdf5plugin", extra="hdf5plugin", needed_for=needed_for)
        except MissingDependencyError as missing:
            return missing
        return MissingDependencyError(
            f"{needed_for} needs a filter the installed hdf5plugin {installed_version('hdf5plugin')} does not "
            "register; pip install --upgrade 'daskstream[hdf5plugin]'"
        )
    return None


def _first_chunk_filtered_by_missing(dset: Any, pipeline: tuple, h5py: Any) -> bool:
    """Whether the first chunk written went through a filter h5py cannot decode here.

    Filters are optional in HDF5: a writer without one skips it, chunk by chunk
    (the chunk's filter mask says so), and such a file reads without it. So a
    missing filter is refused at open only when a chunk is known to need it;
    otherwise the read of a chunk that does says so.
    """
    if not pipeline or dset.chunks is None:
        return False
    try:
        if dset.id.get_num_chunks() == 0:
            return False
        mask = dset.id.get_chunk_info(0).filter_mask
    except (OSError, RuntimeError):  # a chunk index h5py cannot walk: the read that needs it will say so
        return False
    return any(not h5py.h5z.filter_avail(code) and not mask & (1 << i) for i, (code, _) in enumerate(pipeline))


def import_h5py() -> Any:
    import h5py

    with contextlib.suppress(ImportError):
        # Registers the extra compression filters (blosc, zstd, lz4, bitshuffle...) when installed.
        import hdf5plugin  # noqa: F401
    return h5py


class Hdf5Source(Source):
    """One dataset of an HDF5 file: chunked, contiguous or compact.

    Parameters
    ----------
    path
        The HDF5 file.
    dataset
        Path of the dataset inside the file; may be omitted when the file holds
        exactly one.

    Notes
    -----
    Every filter h5py can decode is supported (gzip, lzf, shuffle, fletcher32,
    scaleoffset, and the ``hdf5plugin`` filters when that package is
    installed). Unwritten chunks read as the dataset's fill value. Contiguous
    datasets of plain numeric types are read straight from their byte offset,
    without h5py's global lock; so are chunked ones whose filters are among
    deflate, shuffle, Fletcher-32, zstd and blosc, decoded in parallel (see
    :mod:`daskstream.sources.hdf5_chunks`).
    """

    format = "hdf5"
    dataset: str  # found in the file even when not given: every HDF5 dataset has a path

    def __init__(self, path: str | os.PathLike[str], dataset: str | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.opened_ns = now_ns()
        own_stamp = file_stamp(self.path)
        h5py = import_h5py()
        try:
            f = h5py.File(self.path, "r")
        except OSError as exc:
            raise CorruptSourceError(
                f"{self.path}: HDF5 could not open the file ({_first_line(exc)}); it may be "
                "truncated or damaged: re-create or re-copy it"
            ) from None
        with f:
            # Links are checked before h5py follows them: following one opens its target file.
            passed = check_external_links(f, self.path, dataset, h5py) if dataset is not None else ()
            dset = _find_dataset(f, self.path, dataset, h5py)
            in_this_file = dset.file.id.fileno == f.id.fileno
            # h5py names a dataset reached through an external link by its path in the other file.
            self.dataset = dset.name if in_this_file else "/" + (dataset or "").strip("/")
            self._describe(dset, h5py, in_this_file)
            reached = () if in_this_file else (LinkedFile("external link", os.path.abspath(dset.file.filename), ""),)
            self.linked_files = tuple(
                {linked.path: linked for linked in (*reached, *passed, *linked_files(self.path, dset, h5py))}.values()
            )
        check_linked_files(self.name, self.path, self.linked_files)
        self.external_prefix = external_prefix(self.linked_files)
        self.stamp = self.current_stamp() if self.linked_files else own_stamp
        self.token = source_token(self.format, self.path, *self.stamp, dataset=self.dataset)

    def _describe(self, dset: Any, h5py: Any, in_this_file: bool) -> None:
        if dset.shape is None:
            raise NotAnArrayError(f"{self.name}: the dataset has an empty (null) dataspace and holds no array")
        file_dtype = dset.dtype
        if (
            file_dtype.hasobject
            or h5py.check_vlen_dtype(file_dtype) is not None
            or (h5py.check_string_dtype(file_dtype) is not None and h5py.check_string_dtype(file_dtype).length is None)
        ):
            raise UnsupportedDtypeError(
                f"{self.name}: dtype {file_dtype} is variable-length or holds references, which "
                "cannot be read as a numpy array; store fixed-width data instead"
            )
        # An array element type (H5T_ARRAY) reads as h5py reads it: its axes join the dataset's.
        self.shape, element_dtype = checked_element(self.name, tuple(dset.shape), file_dtype)
        self.element_ndim = self.ndim - len(dset.shape)
        self.dtype = native(element_dtype)
        dcpl = dset.id.get_create_plist()
        kind = dcpl.get_layout()
        # Plugin filters register long names ("HDF5 zstd filter; see https://..."): keep the name part.
        self.filters = tuple(
            dcpl.get_filter(i)[3].decode(errors="replace").split(";")[0].strip() for i in range(dcpl.get_nfilters())
        )
        # An element's axes are stored whole in every chunk.
        element_shape = self.shape[len(dset.shape) :]
        self.storage_chunks = tuple(int(c) for c in (*dset.chunks, *element_shape)) if dset.chunks else None
        self.layout = "chunked" if self.storage_chunks else "C"
        self.storage_kind = {
            h5py.h5d.COMPACT: "compact",
            h5py.h5d.CONTIGUOUS: "contiguous",
            h5py.h5d.VIRTUAL: "virtual",
        }.get(kind, "chunked")
        self.raw_offset = None
        if (
            kind == h5py.h5d.CONTIGUOUS
            and in_this_file  # an external link's offset is into another file
            and dcpl.get_external_count() == 0
            and file_dtype.kind in _RAW_READABLE_KINDS
            and not file_dtype.fields
            and dset.id.get_type().get_size() == file_dtype.itemsize
        ):
            # None until the data is written; then unwritten data reads as the fill value via h5py.
            self.raw_offset = dset.id.get_offset()
        self.file_dtype = file_dtype
        # (filter id, client values) in the order HDF5 applies them on write.
        self.pipeline = tuple(
            (int(code), tuple(int(v) for v in values))
            for code, _, values, _ in (dcpl.get_filter(i) for i in range(dcpl.get_nfilters()))
        )
        self.fill_value = dset.fillvalue
        self.attrs = hdf5_attrs(dset)
        self.dims = hdf5_dims(dset, self.ndim)
        self.scales = hdf5_scales(dset)
        # Chunks whose bytes can be read and decoded here, in parallel, rather than under h5py's lock.
        self.raw_chunks = (
            self.storage_kind == "chunked"
            and in_this_file
            and dcpl.get_external_count() == 0
            and file_dtype.kind in _RAW_READABLE_KINDS
            and not file_dtype.fields
            and dset.id.get_type().get_size() == file_dtype.itemsize
            and all(code in DECODABLE for code, _ in self.pipeline)
            and _chunk_addresses_hold(dset)
        )
        if not self.raw_chunks and _first_chunk_filtered_by_missing(dset, self.pipeline, h5py):
            missing = _missing_filter(self.name, self.pipeline, self.filters, h5py)
            if missing is not None:
                raise missing

    def _dataset(self) -> Any:
        h5py = import_h5py()

        def open_file() -> Any:
            return h5py.File(self.path, "r")

        f = cached_handle(("hdf5", self.path, self.token), open_file)
        if self.external_prefix is None:
            return f[self.dataset]
        # HDF5 looks for relative external files from the working directory, which differs between
        # processes: every process reads the files checked when the source was opened.
        access = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
        access.set_efile_prefix(self.external_prefix.encode())
        return h5py.Dataset(h5py.h5d.open(f.id, self.dataset.encode(), dapl=access))

    def _chunk_reader(self) -> ChunkedReader:
        chunks = self.storage_chunks
        assert chunks is not None  # read this way only when raw_chunks, so the layout is chunked

        def build() -> ChunkedReader:
            try:
                index = ChunkIndex.of(self._dataset(), chunks)
            except OSError as exc:
                raise CorruptSourceError(
                    f"{self.name}: HDF5 could not list the dataset's chunks ({_first_line(exc)}); the file may be "
                    "damaged: re-create or re-copy it"
                ) from None
            decoder = ChunkDecoder(self.pipeline, self.file_dtype, chunks)
            return ChunkedReader(self.path, self.name, index, decoder, self.fill_value, token=self.token)

        return cached_handle(("hdf5-chunks", self.path, self.token, self.dataset), build)

    def current_stamp(self) -> tuple[Any, ...]:
        """The file's stamp, and those of the files its data comes from (external storage, links, virtual sources)."""
        stamps: list[Any] = list(file_stamp(self.path))
        for linked in self.linked_files:
            stamps.extend((linked.path, *file_stamp(linked.path)))
        return tuple(stamps)

    def _read_box(self, box: Region) -> np.ndarray:
        if self.raw_offset is not None:
            return read_contiguous_box(self.path, self.raw_offset, self.file_dtype, self.shape, False, box)
        out = np.empty(tuple(s.stop - s.start for s in box), dtype=self.dtype)
        if self.raw_chunks:
            self._chunk_reader().read_box(box, out)
            return out
        try:
            dset = self._dataset()
            if self.element_ndim:
                outer = self.ndim - self.element_ndim
                block = dset[box[:outer]] if outer else dset[()]
                out[...] = block[(slice(None),) * outer + box[outer:]]
            elif self.ndim == 0:
                out[...] = dset[()]
            else:
                dset.read_direct(out, source_sel=box)
        except OSError as exc:
            missing = _missing_filter(self.name, self.pipeline, self.filters, import_h5py())
            if missing is not None:
                raise missing from None
            raise CorruptSourceError(
                f"{self.name}: HDF5 could not read region {_box_text(box)} ({_first_line(exc)}); "
                "the file may be damaged: re-create or re-copy it"
            ) from None
        return out

    @property
    def decode_bytes(self) -> int:
        """A filtered chunk is held as stored, decoded and (shuffle) reordered while it is read."""
        if self.storage_chunks is None:
            return 0
        return (3 if self.pipeline else 1) * self.storage_chunk_bytes()

    def plan(
        self, settings: PlanSettings | None = None, *, reduce_axis: int | tuple[int, ...] | None = None, **given: Any
    ) -> ChunkPlan:
        """The planner's plan, noting when threads would queue on h5py's lock to decompress."""
        chunk_plan = super().plan(settings, reduce_axis=reduce_axis, **given)
        shared = settings is not None and settings.resources.threads_share_process
        if self.filters and self.storage_chunks is not None and shared:
            chunk_plan = dataclasses.replace(chunk_plan, axis_notes=(*chunk_plan.axis_notes, HDF5_LOCK_NOTE))
        return chunk_plan

    def describe_storage(self) -> str:
        if self.storage_chunks is None:
            return f"{self.storage_kind}"
        filters = "+".join(self.filters) if self.filters else "no filters"
        return f"chunked {self.storage_chunks}, {filters}"


# From HDF5 1.14.4 the addresses HDF5 gives for chunks count the file's user block; before, they
# started after it (measured: h5py 3.11 with HDF5 1.14.2 reads such a file's chunks at the wrong bytes).
_CHUNK_ADDRESSES_COUNT_USERBLOCK = (1, 14, 4)


def _chunk_addresses_hold(dset: Any) -> bool:
    """Whether the chunk addresses HDF5 reports are where the bytes are in the file.

    They are not in a file with a user block under an HDF5 older than 1.14.4:
    such a file's chunks are read through h5py instead, which knows.
    """
    import h5py

    if dset.file.userblock_size == 0:
        return True
    return tuple(h5py.version.hdf5_version_tuple[:3]) >= _CHUNK_ADDRESSES_COUNT_USERBLOCK


def _find_dataset(f: Any, path: str, dataset: str | None, h5py: Any) -> Any:
    if dataset is None:
        found = _list_datasets(f, h5py)
        if len(found) == 1:
            return f[found[0]]
        have = listing(found, empty="no datasets")
        raise MemberNotFoundError(
            f"{path}: give the dataset to read, as dataset=... or '{path}::/name'; the file has: {have}"
        )
    try:
        obj = f[dataset]
    except KeyError:
        have = listing(_list_datasets(f, h5py), empty="no datasets")
        raise MemberNotFoundError(f"dataset {dataset!r} not found in {path}; it has: {have}") from None
    if not isinstance(obj, h5py.Dataset):
        inside = listing(_list_datasets(obj, h5py), empty="none")
        raise NotAnArrayError(f"{path}::{dataset} is a group, not a dataset; datasets inside it: {inside}")
    return obj


def _list_datasets(group: Any, h5py: Any) -> list[str]:
    names: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            names.append(obj.name)

    group.visititems(visit)
    return names


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _box_text(box: Region) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in box) + "]"
