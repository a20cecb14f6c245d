"""HDF5 datasets, read through h5py with one cached file handle per process.

One dataset is described the same way wherever its file lies, a local path or an object on an
object store, and read by one of three paths -- raw bytes at an offset, raw chunks decoded here,
h5py -- chosen from that description. What it is described with lives in the ``hdf5_*`` modules
beside this one: filters, types, layout, finding the dataset, and files on an object store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from daskstream.errors import CorruptSourceError, DaskstreamError, NotAnArrayError, UnsupportedDtypeError, first_line
from daskstream.sources.base import (
    Region,
    Source,
    checked_element,
    checked_shape,
    file_stamp,
    native,
    now_ns,
    sample_box,
    string_dtype,
    string_element_bytes,
)
from daskstream.sources.contiguous import READ_BATCH_BYTES, FileBytes, ObjectBytes, read_contiguous_box
from daskstream.sources.handles import cached_handle
from daskstream.sources.hdf5.chunks import (
    DECODABLE,
    CheckedChunks,
    ChunkDecoder,
    ChunkedReader,
    ChunkIndex,
    FilterCheck,
)
from daskstream.sources.hdf5.datasets import _find_dataset
from daskstream.sources.hdf5.filters import (
    HDF5_LOCK_NOTE,
    PARALLEL_DECODE_NOTE,
    _first_chunk_filtered_by_missing,
    _missing_filter,
    filter_names,
    import_h5py,
)
from daskstream.sources.hdf5.layout import (
    _RAW_READABLE_KINDS,
    _chunk_addresses_hold,
    _leaves_buffer_unfilled,
    _stored_itemsize,
)
from daskstream.sources.hdf5.linked import (
    LinkedFile,
    check_external_links,
    check_linked_files,
    external_prefix,
    linked_files,
    refuse_links_out_of_object,
)
from daskstream.sources.hdf5.objects import _ObjectHdf5, object_hdf5
from daskstream.sources.hdf5.types import hdf5_type_text, readable_dtype
from daskstream.sources.metadata import hdf5_attrs, hdf5_dims, hdf5_scales
from daskstream.sources.objects.places import Got, Place, is_url
from daskstream.sources.tokens import source_token

if TYPE_CHECKING:
    from daskstream.planning.plan import ChunkPlan
    from daskstream.planning.settings import PlanSettings

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


class Hdf5Source(Source):
    """One dataset of an HDF5 file: chunked, contiguous or compact.

    Parameters
    ----------
    path
        The HDF5 file, or an fsspec URL of one (``s3://bucket/scan.h5``).
    dataset
        Path of the dataset inside the file; may be omitted when the file holds
        exactly one.
    storage_options
        fsspec options for a URL (endpoint, credentials...). Secrets among
        them stay in this process: see :mod:`daskstream.sources.objects.places`.
    head
        The object's first bytes as :func:`daskstream.sources.detect.probe_url`
        fetched them, which saves opening a URL one request.

    Notes
    -----
    Every filter h5py can decode is supported (gzip, lzf, shuffle, fletcher32,
    scaleoffset, and the ``hdf5plugin`` filters when that package is
    installed). Unwritten chunks read as the dataset's fill value. Contiguous
    datasets of plain numeric types are read straight from their byte offset,
    without h5py's global lock; so are chunked ones whose filters are among
    deflate, shuffle, Fletcher-32, zstd and blosc, decoded in parallel (see
    :mod:`daskstream.sources.hdf5.chunks`).

    On an object store (``path`` an fsspec URL), the file is opened with
    h5py reading through an :class:`~daskstream.sources.contiguous.ObjectFile`:
    its metadata costs a few ranged GETs of 256 KiB blocks, the first bytes
    already fetched to tell the format among them. Chunks decoded here are
    fetched directly, all those of a box at once by concurrent ranged GETs,
    and so are contiguous datasets; anything else is read through h5py. Every
    response's version (ETag) is compared with the one seen at open, and the
    token holds it. A dataset whose data another file holds (external links,
    external storage, virtual datasets) is refused: those name local paths.
    """

    format = "hdf5"
    dataset: str  # found in the file even when not given: every HDF5 dataset has a path
    linked_files: tuple[LinkedFile, ...]
    external_prefix: str | None

    def __init__(
        self,
        path: str | os.PathLike[str],
        dataset: str | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        head: Got | None = None,
    ) -> None:
        self.opened_ns = now_ns()
        self.object: ObjectBytes | None = None
        self._head = b""
        if is_url(os.fspath(path)):
            self._open_object(os.fspath(path), dataset, storage_options, head)
            return
        self.path = os.path.abspath(os.fspath(path))
        own_stamp = file_stamp(self.path)
        h5py = import_h5py()
        try:
            f = h5py.File(self.path, "r")
        except OSError as exc:
            raise CorruptSourceError(
                f"{self.path}: HDF5 could not open the file ({first_line(exc)}); it may be "
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
        self.stamp = self._file_stamps() if self.linked_files else own_stamp
        self.token = source_token(self.format, self.path, *self.stamp, dataset=self.dataset)

    def _open_object(
        self, url: str, dataset: str | None, storage_options: dict[str, Any] | None, head: Got | None
    ) -> None:
        self.path = url
        self.object, self._head = ObjectBytes.open(Place(url, storage_options), url, head)
        h5py = import_h5py()
        try:
            f = self._object_file().h5
        except OSError as exc:
            if isinstance(exc, DaskstreamError):
                raise
            raise CorruptSourceError(
                f"{url}: HDF5 could not open the object ({first_line(exc)}); it may be truncated or "
                "damaged: re-create or re-copy it"
            ) from None
        with self._h5py_failures("read the file's metadata"):
            # HDF5 would open the files such links name from this machine's disk.
            refuse_links_out_of_object(f, f"{url}::{dataset}" if dataset else url, dataset, None, h5py)
            dset = _find_dataset(f, url, dataset, h5py)
            self.dataset = dset.name
            refuse_links_out_of_object(f, self.name, dataset, dset, h5py)
            self._describe(dset, h5py, in_this_file=True)
        self.linked_files = ()
        self.external_prefix = None
        # No stamp to check per read: every ranged GET's version is compared with the one seen now.
        self.token = source_token(self.format, url, self.object.size, self.object.version, dataset=self.dataset)

    def __getstate__(self) -> dict[str, Any]:
        # The first bytes are not sent with every task: a process that opens the file fetches its own.
        return {**self.__dict__, "_head": b""}

    def _object_file(self) -> _ObjectHdf5:
        """This process's h5py file over the object, opened once per version of it."""
        data = self.object
        assert data is not None  # only for sources on an object store
        return object_hdf5(self.path, data, self._head)

    @contextlib.contextmanager
    def _h5py_failures(self, doing: str) -> Iterator[None]:
        """Errors of the object's reads (changed, removed...) as themselves, and HDF5's own as damage."""
        try:
            yield
        except OSError as exc:
            if isinstance(exc, DaskstreamError):
                raise
            failure = self._read_failure(exc)
            if failure is not None:
                raise failure from None
            raise CorruptSourceError(
                f"{self.path}: HDF5 could not {doing} "
                f"({first_line(exc)}); it may be truncated or damaged: re-create or re-copy it"
            ) from None

    def _read_failure(self, exc: OSError) -> BaseException | None:
        """What a read of the object raised inside h5py, when that is why h5py failed with ``exc``."""
        if self.object is None or isinstance(exc, DaskstreamError):
            return None
        try:
            return self._object_file().take_failure()
        except OSError:  # the file did not open in this process: nothing was read through it
            return None

    def _describe(self, dset: Any, h5py: Any, in_this_file: bool) -> None:
        if dset.shape is None:
            raise NotAnArrayError(f"{self.name}: the dataset has an empty (null) dataspace and holds no array")
        file_dtype = readable_dtype(self.name, dset, h5py)
        string = h5py.check_string_dtype(file_dtype)
        self.strings = string is not None and string.length is None  # variable-length: read as StringDType
        if not self.strings and (file_dtype.hasobject or h5py.check_vlen_dtype(file_dtype) is not None):
            raise UnsupportedDtypeError(
                f"{self.name}: dtype {hdf5_type_text(file_dtype, h5py)} is variable-length or holds references, "
                "which cannot be read as a numpy array; store fixed-width data instead"
            )
        if self.strings:
            element_dtype = string_dtype(self.name)
            self.shape = checked_shape(self.name, tuple(dset.shape), element_dtype.itemsize)
        else:
            # An array element type (H5T_ARRAY) reads as h5py reads it: its axes join the dataset's.
            self.shape, element_dtype = checked_element(self.name, tuple(dset.shape), file_dtype)
        self.element_ndim = self.ndim - len(dset.shape)
        self.dtype = native(element_dtype)
        dcpl = dset.id.get_create_plist()
        kind = dcpl.get_layout()
        self.filters = filter_names(dcpl)
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
        if kind == h5py.h5d.CONTIGUOUS and in_this_file and dcpl.get_external_count() == 0:
            self._check_contiguous_extent(dset)
        self.file_dtype = file_dtype
        # (filter id, client values) in the order HDF5 applies them on write.
        self.pipeline = tuple(
            (int(code), tuple(int(v) for v in values))
            for code, _, values, _ in (dcpl.get_filter(i) for i in range(dcpl.get_nfilters()))
        )
        # With an undefined fill value, or a fill time of "never", HDF5 leaves a reader's buffer as it
        # was for data never written; h5py reads into zeros, so zeros are what such data reads as here too.
        self.buffer_kept = _leaves_buffer_unfilled(dcpl, h5py)
        if self.strings:
            self.fill_value = ""
        elif self.buffer_kept:
            self.fill_value = np.zeros(1, dtype=dset.dtype)[0]
        else:
            self.fill_value = dset.fillvalue
        self.attrs = hdf5_attrs(dset)
        self.dims = hdf5_dims(dset, self.ndim)
        self.scales = hdf5_scales(dset)
        if self.strings:
            box = sample_box(self.shape)
            if self.size:
                self._check_before_h5py(dset, box)
            sample = self._strings_of(dset, box) if self.size else np.empty(0, self.dtype)
            self.element_bytes = string_element_bytes(sample)
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

    def _measured_size(self, dset: Any) -> int:
        """The bytes of the file holding ``dset``, measured: HDF5 believes the end-of-file address the file states."""
        if self.object is not None:
            return self.object.size
        return os.path.getsize(dset.file.filename)

    def _check_contiguous_extent(self, dset: Any) -> None:
        """Refuse contiguous data that its layout places past the end of the file, before any of it is read.

        Read straight from the file it would fail at the end; read through
        HDF5, data past the file's end reads as zeros when the file states a
        larger end-of-file address than it has.
        """
        offset = dset.id.get_offset()
        if offset is None:
            return  # never written: the fill value
        size = max(dset.id.get_storage_size(), math.prod(dset.shape) * dset.id.get_type().get_size())
        measured = self._measured_size(dset)
        if offset + size > measured:
            raise CorruptSourceError(
                f"{self.name}: the dataset's layout places its {size} bytes at byte {offset}, past the end of the "
                f"file ({measured} bytes); the file is damaged, cut short or forged: re-create or re-copy it"
            )

    def _chunk_index(self, dset: Any, chunk_shape: tuple[int, ...], chunk_bytes: int) -> ChunkIndex:
        """The dataset's chunk index, every chunk's place and size checked (:meth:`ChunkIndex.of`)."""
        with self._h5py_failures("list the dataset's chunks"):
            return ChunkIndex.of(
                dset,
                chunk_shape,
                name=self.name,
                file_size=self._measured_size(dset),
                pipeline=self.pipeline,
                chunk_bytes=chunk_bytes,
            )

    def _checked_chunks(self, dset: Any) -> CheckedChunks | None:
        """This process's checks of the chunks h5py decodes: ``None`` when HDF5 bounds every filter itself."""
        if self.storage_kind != "chunked" or not self.pipeline or dset.chunks is None:
            return None
        chunk_shape = tuple(int(c) for c in dset.chunks)

        def build() -> CheckedChunks:
            chunk_bytes = math.prod(chunk_shape) * _stored_itemsize(dset, import_h5py())
            index = self._chunk_index(dset, chunk_shape, chunk_bytes)
            check = FilterCheck(self.pipeline, _stored_itemsize(dset, import_h5py()), chunk_bytes)
            return CheckedChunks(index, chunk_shape, check, self.name)

        if not hasattr(self, "token"):
            return build()  # while the source opens (a sample of its strings): once
        return cached_handle(("hdf5-checked-chunks", self.path, self.token, self.dataset), build)

    def _check_before_h5py(self, dset: Any, box: Region) -> None:
        """Check the stored chunks ``box`` touches before h5py decodes them (see :class:`FilterCheck`)."""
        checked = self._checked_chunks(dset)
        if checked is not None:
            checked.check_box(dset.id, box[: len(checked.chunk_shape)])

    def _dataset(self) -> Any:
        h5py = import_h5py()
        if self.object is not None:
            return self._object_file().h5[self.dataset]

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
            decoder = ChunkDecoder(self.pipeline, self.file_dtype, chunks)
            index = self._chunk_index(self._dataset(), chunks, decoder.nbytes)
            data = self.object if self.object is not None else FileBytes(self.path, self.name)
            return ChunkedReader(data, self.name, index, decoder, self.fill_value, token=self.token)

        return cached_handle(("hdf5-chunks", self.path, self.token, self.dataset), build)

    def current_stamp(self) -> tuple[Any, ...] | None:
        """The file's stamp, and those of the files its data comes from (external storage, links, virtual sources)."""
        if self.object is not None:
            return None  # every ranged GET checks the object's version instead
        return self._file_stamps()

    def _file_stamps(self) -> tuple[Any, ...]:
        stamps: list[Any] = list(file_stamp(self.path))
        for linked in self.linked_files:
            stamps.extend((linked.path, *file_stamp(linked.path)))
        return tuple(stamps)

    def _read_box(self, box: Region) -> np.ndarray:
        where = self.object if self.object is not None else self.path
        if self.raw_offset is not None:
            return read_contiguous_box(where, self.raw_offset, self.file_dtype, self.shape, False, box)
        out = np.empty(tuple(s.stop - s.start for s in box), dtype=self.dtype)
        if self.raw_chunks:
            self._chunk_reader().read_box(box, out)  # fills chunks never written with the fill value itself
            return out
        try:
            dset = self._dataset()
            self._check_before_h5py(dset, box)
            if self.strings:
                return self._strings_of(dset, box)
            if self.buffer_kept:
                out[...] = 0  # what h5py reads data never written as, where HDF5 leaves the buffer as it was
            if self.element_ndim:
                outer = self.ndim - self.element_ndim
                block = dset[box[:outer]] if outer else dset[()]
                out[...] = block[(slice(None),) * outer + box[outer:]]
            elif self.ndim == 0:
                out[...] = dset[()]
            else:
                dset.read_direct(out, source_sel=box)
        except OSError as exc:
            if isinstance(exc, DaskstreamError):
                raise
            failure = self._read_failure(exc)
            if failure is not None:
                raise failure from None
            missing = _missing_filter(self.name, self.pipeline, self.filters, import_h5py())
            if missing is not None:
                raise missing from None
            raise CorruptSourceError(
                f"{self.name}: HDF5 could not read region {_box_text(box)} ({first_line(exc)}); "
                "the file may be damaged: re-create or re-copy it"
            ) from None
        return out

    def _strings_of(self, dset: Any, box: Region) -> np.ndarray:
        """The variable-length strings in ``box``, decoded as UTF-8 (of which ASCII is the first half)."""
        h5py = import_h5py()
        declared = h5py.check_string_dtype(dset.dtype).encoding
        # Through Python strings, which check every string's bytes: h5py's own StringDType reading (3.14)
        # keeps invalid UTF-8 as it is, an array that fails when looked at, and finds no way to read ASCII.
        # Files marked ASCII often hold UTF-8: theirs are decoded as UTF-8 too, nothing lost.
        reader = dset.asstr("utf-8")
        try:
            return np.asarray(reader[box], dtype=self.dtype)
        except UnicodeDecodeError as exc:
            raise CorruptSourceError(
                f"{self.name}: holds strings that are not valid UTF-8 ({exc.reason}), though the file declares "
                f"them {declared}; read their bytes with h5py instead: f[{self.dataset!r}][...]"
            ) from None

    @property
    def decode_bytes(self) -> int:
        """A filtered chunk is held as stored, decoded and (shuffle) reordered while it is read.

        Contiguous data on an object store holds the parts in flight while they are copied into the block.
        """
        if self.storage_chunks is None:
            return 0 if self.object is None else min(READ_BATCH_BYTES, self.nbytes)
        if self.raw_chunks and not self.pipeline and self.object is None:
            return 0  # unfiltered chunks of a local file: the part a block needs is read straight into it
        # Whole chunks, as the layout states them: a chunk reaching past the dataset's edge is stored whole.
        return (3 if self.pipeline else 1) * math.prod(self.storage_chunks) * self.dtype.itemsize

    def plan(
        self, settings: PlanSettings | None = None, *, reduce_axis: int | tuple[int, ...] | None = None, **given: Any
    ) -> ChunkPlan:
        """The planner's plan, saying whether threads decompress in parallel or queue on h5py's lock."""
        chunk_plan = super().plan(settings, reduce_axis=reduce_axis, **given)
        shared = settings is not None and settings.resources.threads_share_process
        if self.filters and self.storage_chunks is not None and shared:
            # Only filters h5py must decode serialise threads; those daskstream decodes itself do not.
            note = PARALLEL_DECODE_NOTE if self.raw_chunks else HDF5_LOCK_NOTE
            filters = "+".join(self.filters)
            chunk_plan = dataclasses.replace(
                chunk_plan, axis_notes=(*chunk_plan.axis_notes, note.format(filters=filters))
            )
        return chunk_plan

    def describe_storage(self) -> str:
        if self.storage_chunks is None:
            return f"{self.storage_kind}"
        filters = "+".join(self.filters) if self.filters else "no filters"
        return f"chunked {self.storage_chunks}, {filters}"


def _box_text(box: Region) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in box) + "]"
