"""The Source protocol: what every format reader exposes.

(Longer than most modules: the protocol comes with what every format shares -- regions and
their normalisation, file stamps and change detection, this process's own writes -- which
would otherwise be imported from each other in circles.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from daskstream.advice import joined, keyword, said
from daskstream.allocator import pad_heap_tops
from daskstream.display import card, grid_figure, table
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    InvalidArgumentError,
    InvalidIndexError,
    SourceChangedError,
    SourceNotFoundError,
    SourcePermissionError,
    SourceRemovedError,
    UnsupportedDtypeError,
    UnsupportedShapeError,
)
from daskstream.files import not_regular_error
from daskstream.planning.budget import format_size
from daskstream.planning.chunks import plan_chunks
from daskstream.planning.plan import ChunkPlan
from daskstream.planning.settings import PlanSettings
from daskstream.sources.checked_once import is_unchecked
from daskstream.sources.objects.places import is_url
from daskstream.sources.reads import record_read

Region = tuple[slice, ...]

# Linux's limits on a file name and a path (NAME_MAX, PATH_MAX).
_NAME_MAX = 255
_PATH_MAX = 4096

# numpy's limits: axes of one array, and bytes its index arithmetic (int64) can address.
_MAX_NDIM = 64
_MAX_BYTES = 2**63 - 1

# What to do about data that changed under a computation; a stream says it its own way.
REREAD_ADVICE = "open it again (ds.open) and compute again"


class Source(ABC):
    """A lazily read array on disk: a small, picklable description of it.

    A Source holds no open file handle and none of the array's data, so it can
    sit in a dask graph and travel to worker processes; :meth:`read` opens the
    file in whichever process it runs (see :mod:`daskstream.sources.handles`).

    Attributes
    ----------
    format
        ``"npy"``, ``"hdf5"`` or ``"zarr"``.
    path
        Where the data is (a local path or a URL).
    dataset
        The HDF5 dataset or Zarr member, ``None`` for a .npy file or a root array.
    shape, dtype
        The array's shape and its dtype in native byte order (what reads return).
    storage_chunks
        The on-disk chunk grid (the shard grid for sharded Zarr); ``None`` when
        the data is stored contiguously.
    layout
        ``"C"`` or ``"F"`` for contiguous data, ``"chunked"`` otherwise.
    token
        A stable identity from the path, size, modification time and dataset:
        equal for the same unchanged data, different once it is rewritten.
    stamp
        What :meth:`current_stamp` returned when the source was opened: every
        read checks it again, before and after, and raises
        :class:`~daskstream.errors.SourceChangedError` when it differs, so a
        computation never mixes old and new data.
    opened_ns
        When the source was opened (``time.time_ns()``).
    attrs
        The array's attributes as the file holds them (HDF5 attributes, Zarr
        attributes; strings decoded, numpy scalars as Python scalars); empty
        for ``.npy``. ``store`` carries them to its target.
    dims
        One name per axis (HDF5 dimension labels or scales, as NetCDF4 files
        attach them; Zarr ``dimension_names`` or format 2's
        ``_ARRAY_DIMENSIONS``), ``None`` for an unnamed axis; ``None`` when
        the file names none.
    fill_value
        What unwritten parts of the array read as, where the format has one.
    scales
        Per axis, the path in the same file of the one-dimensional array that
        labels it (an HDF5 dimension scale: times, depths...), ``None`` for an
        axis without; ``None`` when no axis has one. ``store`` copies them.
    element_bytes
        Memory one element takes while read, where that is more than the
        dtype's itemsize (variable-length strings, whose text lives outside
        the array: estimated from the first strings); plans count it.
    """

    format: ClassVar[str]

    path: str
    dataset: str | None
    shape: tuple[int, ...]
    dtype: np.dtype
    storage_chunks: tuple[int, ...] | None
    layout: str
    token: str
    stamp: tuple[Any, ...] | None = None
    opened_ns: int = 0
    attrs: Mapping[str, Any] = MappingProxyType({})
    dims: tuple[str | None, ...] | None = None
    fill_value: Any = None
    scales: tuple[str | None, ...] | None = None
    # Bytes one element occupies in memory while read, where that is not the dtype's itemsize
    # (variable-length strings: the string itself lives outside the array).
    element_bytes: int | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the whole array occupies in memory."""
        return self.size * self.dtype.itemsize

    @property
    def name(self) -> str:
        """``path`` or ``path::dataset``, as a user would write it."""
        return self.path if self.dataset is None else f"{self.path}::{self.dataset}"

    def read(self, region: Any = ()) -> np.ndarray:
        """Read ``region`` (a tuple of slices and ints, like numpy indexing) into memory.

        Returns a new native-byte-order numpy array that owns its data.
        """
        pad_heap_tops()  # once a process: a read's memory, freed, serves the next (daskstream.allocator)
        box, post = normalize_region(region, self.shape)
        shape = tuple(s.stop - s.start for s in box)
        if math.prod(shape) == 0:
            out = np.empty(shape, dtype=self.dtype)
        else:
            # Checked on both sides: a file rewritten while this task read it is caught too (once for all the
            # pieces a task streams: daskstream.sources.checked_once).
            checking = not is_unchecked(self)
            if checking:
                self.check_unchanged()
            try:
                out = self._read_box(box)
            except (OSError, EOFError, ValueError):
                # A file cut short or rewritten mid-read fails in the reader: say so when that is why.
                self.check_unchanged()
                raise
            if checking:
                self.check_unchanged()
        record_read(out.nbytes)
        if not post:
            return out
        # The Ellipsis keeps an all-int index an array rather than a numpy scalar; the copy keeps a
        # strided pick from holding the whole bounding box in memory.
        picked = out[(*post, Ellipsis)]
        return picked if picked.size == out.size else picked.copy()

    def __getitem__(self, region: Any) -> np.ndarray:
        return self.read(region)

    def current_stamp(self) -> tuple[Any, ...] | None:
        """What identifies the data on disk now (size, modification times...); ``None`` where not checked."""
        return None

    def check_unchanged(self) -> None:
        """Raise :class:`SourceChangedError` when the data on disk is no longer what was opened."""
        if self.stamp is None:
            return
        try:
            now = self.current_stamp()
        except SourceNotFoundError:
            raise SourceRemovedError(
                f"{self.name} was removed after it was opened; a computation over it cannot finish. "
                f"Put it back, or {REREAD_ADVICE}",
            ) from None
        kept = own_writes.explain(self.stamp, now) if now is not None and now != self.stamp else None
        if kept is not None:
            # This process changed the file itself, writing other data of it: the data read is as opened.
            self.stamp = kept
            return
        if now != self.stamp:
            raise SourceChangedError(
                f"{self.name} changed on disk after it was opened (its size, modification time or "
                f"metadata differ), so this computation would mix old and new data; {REREAD_ADVICE}"
            )

    @abstractmethod
    def _read_box(self, box: Region) -> np.ndarray:
        """Read a non-empty box of unit-step slices within bounds."""

    @property
    def decode_bytes(self) -> int:
        """Bytes a read holds beyond the block it returns while it decodes one storage chunk.

        0 where data goes straight from the file into the block (``.npy``,
        contiguous HDF5); formats that decode override it.
        """
        return 0

    def storage_chunk_bytes(self) -> int:
        """Bytes of one storage chunk, decoded (0 for contiguous data)."""
        if self.storage_chunks is None:
            return 0
        return math.prod(min(c, n) for c, n in zip(self.storage_chunks, self.shape)) * self.dtype.itemsize

    def plan(
        self, settings: PlanSettings | None = None, *, reduce_axis: int | tuple[int, ...] | None = None, **given: Any
    ) -> ChunkPlan:
        """Plan chunks for this source with ``settings``, resolved where the call entered daskstream.

        :func:`daskstream.plan` plans a source with the defaults of the place
        its computation runs (the memory budget, threads and workers found
        there); this method takes them already resolved.

        Raises
        ------
        InvalidArgumentError
            Without settings, or with the keywords of :func:`daskstream.plan`.
        """
        if settings is None or given:
            keywords = [keyword(k, ...) for k in given] or [keyword("memory_budget", ...)]
            raise InvalidArgumentError(
                said(
                    f"{self.name}: Source.plan takes resolved PlanSettings; plan with daskstream.plan(source, ",
                    joined(keywords, ", "),
                    ") instead",
                )
            )
        if is_url(self.path) and settings.object_store_task_bytes > settings.target_chunk_bytes:
            settings = dataclasses.replace(settings, target_chunk_bytes=settings.object_store_task_bytes)
        if self.element_bytes is not None:
            # Blocks hold more than their itemsize says: the budget counts what they really take.
            held = self.element_bytes / max(self.dtype.itemsize, 1)
            factor = max(settings.working_set_factor_for(self.dtype), held)
            settings = dataclasses.replace(settings, working_set_factor=factor)
        return plan_chunks(
            self.shape,
            self.dtype,
            settings,
            storage_chunks=self.storage_chunks,
            layout=self.layout,
            reduce_axis=reduce_axis,
            decode_bytes=self.decode_bytes,
        )

    def describe_storage(self) -> str:
        """One line on how the data sits on disk (codecs, chunks...)."""
        if self.storage_chunks is None:
            return f"contiguous, {self.layout} order"
        return f"chunked {self.storage_chunks}"

    def __repr__(self) -> str:
        return (
            f"<daskstream {type(self).__name__} {self.name!r} shape={self.shape} dtype={self.dtype} "
            f"{self.describe_storage()}>"
        )

    def _repr_html_(self) -> str:
        rows = [
            ("format", self.format),
            ("path", self.path),
            ("dataset", self.dataset or "-"),
            ("shape", self.shape),
            ("dtype", self.dtype),
            ("size", format_size(self.nbytes)),
            ("storage", self.describe_storage()),
        ]
        return card(
            "daskstream Source",
            table(rows),
            picture=grid_figure(self.shape, self.storage_chunks, None),
            caption=self.name,
        )


def storage_pieces(box: Region, grid_shape: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], Region, Region]]:
    """For each storage chunk ``box`` touches: its grid position, the part inside it, and where that goes in ``box``.

    >>> [(g, i, t) for g, i, t in storage_pieces((slice(3, 12),), (5,))]  # doctest: +NORMALIZE_WHITESPACE
    [((0,), (slice(3, 5, None),), (slice(0, 2, None),)),
     ((1,), (slice(0, 5, None),), (slice(2, 7, None),)),
     ((2,), (slice(0, 2, None),), (slice(7, 9, None),))]
    """
    ranges = [range(s.start // c, (s.stop - 1) // c + 1) for s, c in zip(box, grid_shape)]
    for grid in itertools.product(*ranges):
        origin = [g * c for g, c in zip(grid, grid_shape)]
        inside = tuple(slice(max(s.start, o) - o, min(s.stop, o + c) - o) for s, o, c in zip(box, origin, grid_shape))
        target = tuple(
            slice(o + piece.start - s.start, o + piece.stop - s.start) for s, o, piece in zip(box, origin, inside)
        )
        yield grid, inside, target


def normalize_region(region: Any, shape: tuple[int, ...]) -> tuple[Region, tuple]:
    """Split a numpy-style index into a unit-step bounding box and what to apply after.

    Returns ``(box, post)``: ``box`` is one ``slice(start, stop)`` per axis; ``post``
    is an index into the box that yields the requested result (empty when the
    box already is it).

    >>> normalize_region((slice(2, 8, 3), 1), (10, 4))
    ((slice(2, 6, None), slice(1, 2, None)), (slice(0, 4, 3), 0))
    """
    if not isinstance(region, tuple):
        region = (region,)
    if any(r is Ellipsis for r in region):
        at = next(i for i, r in enumerate(region) if r is Ellipsis)
        fill = (slice(None),) * (len(shape) - len(region) + 1)
        region = region[:at] + fill + region[at + 1 :]
    if len(region) > len(shape):
        raise InvalidIndexError(f"index {region!r} has {len(region)} entries but the array has {len(shape)} axes")
    region = tuple(region) + (slice(None),) * (len(shape) - len(region))
    box: list[slice] = []
    post: list[slice | int] = []
    trivial = True
    for index, n in zip(region, shape):
        if isinstance(index, slice):
            picked = range(*index.indices(n))
            if len(picked) == 0:
                box.append(slice(0, 0))
                post.append(slice(None))
                continue
            lo, hi = min(picked[0], picked[-1]), max(picked[0], picked[-1]) + 1
            box.append(slice(lo, hi))
            if picked.step == 1:
                post.append(slice(None))
                continue
            stop = picked[-1] - lo + (1 if picked.step > 0 else -1)
            post.append(slice(picked[0] - lo, stop if stop >= 0 else None, picked.step))
            trivial = False
        elif isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            i = int(index) + n if index < 0 else int(index)
            if not 0 <= i < n:
                raise InvalidIndexError(f"index {index} is out of bounds for an axis of length {n}")
            box.append(slice(i, i + 1))
            post.append(0)
            trivial = False
        else:
            raise InvalidIndexError(f"index {index!r} is not supported; use slices and ints")
    return tuple(box), (() if trivial else tuple(post))


def now_ns() -> int:
    """The time a source is opened, to compare files' modification times with."""
    return time.time_ns()


def checked_path(path: Any, what: str = "path") -> str:
    """``path`` as a string, refusing what no file system call takes: other types, NUL bytes, names too long.

    >>> checked_path(b"data/a.npy")
    'data/a.npy'
    """
    if isinstance(path, (str, bytes, os.PathLike)):
        text = os.fsdecode(path)
    else:
        raise InvalidArgumentError(
            said(keyword(what, path), f" is a {type(path).__name__}; give a path (str or pathlib.Path)")
        )
    if "\0" in text:
        raise InvalidArgumentError(
            said(keyword(what, text), " holds a NUL byte, which no file name can; check the path")
        )
    longest = max((len(os.fsencode(part)) for part in text.split(os.sep)), default=0)
    if longest > _NAME_MAX or len(os.fsencode(text)) > _PATH_MAX:
        raise InvalidArgumentError(
            said(
                keyword(what, text=_shortened(text)),
                f" is longer than file names can be ({_NAME_MAX} bytes a name, {_PATH_MAX} a path); check the path",
            )
        )
    return text


def _shortened(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:40]!r}...{text[-20:]!r} ({len(text)} characters)"


def file_stamp(path: str) -> tuple[int, ...]:
    """What identifies a local file's contents: ``(size, mtime_ns, ctime_ns, device, inode)``.

    The change time is set by the kernel on every write, rename or restore, so a
    file replaced by one with an older modification time (``cp -p``, ``rsync -a``,
    ``tar x``) still stamps differently; so does another file moved into its
    place. Raises our errors for missing or unreadable paths, and
    :class:`NotARegularFileError` for pipes, sockets and devices, which a read
    could wait on forever.
    """
    st = _stat(path)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise not_regular_error(path, st.st_mode)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SourceNotFoundError(f"{path}: no such file or directory; check the path") from None
    except PermissionError:
        raise SourcePermissionError(f"{path}: permission denied; check the file's permissions") from None
    except OSError as exc:  # a name too long, a loop of symbolic links...
        raise SourceNotFoundError(f"{path}: cannot be reached ({exc.strerror}); check the path") from None


def checked_shape(name: str, shape: tuple[int, ...], itemsize: int = 1) -> tuple[int, ...]:
    """``shape`` as ints, refusing what numpy cannot hold: more than 64 axes, or more bytes than it addresses.

    numpy refuses an array whose non-empty axes multiply (by the item size)
    past ``2**63``, even when another axis is empty.

    >>> checked_shape("a.npy", (2, 3))
    (2, 3)
    """
    shape = tuple(int(n) for n in shape)
    if len(shape) > _MAX_NDIM:
        raise UnsupportedShapeError(
            f"{name}: the array has {len(shape)} dimensions and numpy holds at most {_MAX_NDIM}; "
            "daskstream cannot read it as one array (read a lower-dimensional view of the data with its own library)"
        )
    if any(n < 0 for n in shape):
        raise CorruptSourceError(f"{name}: the shape {shape} has a negative length; the metadata is damaged")
    addressed = math.prod(n for n in shape if n) * max(itemsize, 1)
    if addressed > _MAX_BYTES:
        raise UnsupportedShapeError(
            f"{name}: the shape {shape} spans {addressed:.3g} bytes, more than numpy can address (2**63); "
            "the metadata is damaged, or the array is too large to read as one"
        )
    return shape


def checked_element(name: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
    """Fold a subarray dtype's shape into the array's, as numpy reads such data: ``(4,)`` of ``('<f8', (3,))`` is ``(4, 3)`` float64.

    >>> checked_element("a.npy", (4,), np.dtype(("<f8", (3,))))
    ((4, 3), dtype('float64'))
    """
    if dtype.subdtype is not None:
        base, inner = dtype.subdtype
        if base.subdtype is not None or base.hasobject or 0 in inner:
            raise UnsupportedDtypeError(
                f"{name}: dtype {dtype} has elements that are empty, nested or objects; store the data with a plain dtype"
            )
        shape, dtype = (*shape, *inner), base
    return checked_shape(name, shape, dtype.itemsize), dtype


def string_dtype(name: str) -> np.dtype:
    """The dtype variable-length strings are read as: numpy's ``StringDType`` (numpy 2 on).

    numpy 1 holds them only as Python objects, which daskstream does not
    produce: there they are refused, naming the upgrade that reads them.
    """
    if not hasattr(np.dtypes, "StringDType"):
        raise UnsupportedDtypeError(
            f"{name}: holds variable-length strings, which daskstream reads as numpy's StringDType; "
            f"numpy {np.__version__} has none: pip install 'numpy>=2'"
        )
    return np.dtype(np.dtypes.StringDType())


# Per element of a block of strings while it is read: its slot in the StringDType array, and the
# reader's Python string (pointer and object header) beside it; each string's bytes count twice.
_STRING_SLOT_BYTES = 16 + 8 + 56
_STRING_SAMPLE = 1024


def string_element_bytes(sample: np.ndarray) -> int:
    """Memory one string element takes while read, estimated from ``sample`` (the array's first strings).

    >>> string_element_bytes(np.array(["ab", "cdef"], dtype=object))
    86
    """
    lengths = [len(str(s).encode("utf-8", "surrogatepass")) for s in sample.ravel()[:_STRING_SAMPLE]]
    return _STRING_SLOT_BYTES + 2 * math.ceil(sum(lengths) / max(len(lengths), 1))


def sample_box(shape: tuple[int, ...]) -> Region:
    """A box of at most about 1024 elements at the array's start, for sampling what its elements hold.

    >>> sample_box((10, 5000))
    (slice(0, 10, None), slice(0, 32, None))
    """
    side = max(1, int(_STRING_SAMPLE ** (1 / max(len(shape), 1))))
    return tuple(slice(0, min(n, side)) for n in shape)


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in this machine's byte order (what reads return)."""
    return dtype.newbyteorder("=") if not dtype.isnative else dtype


def to_native(array: np.ndarray) -> np.ndarray:
    """Swap bytes in place where the array is not in native order."""
    if array.dtype.isnative:
        return array
    array.byteswap(inplace=True)
    return array.view(native(array.dtype))


def listing(names: list[str], *, empty: str = "nothing", limit: int = 20) -> str:
    """Names for an error message, shortened after ``limit``.

    >>> listing(["a", "b"])
    'a, b'
    >>> listing([str(i) for i in range(25)], limit=3)
    '0, 1, 2 and 22 more'
    """
    if not names:
        return empty
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


class OwnWrites:
    """Files this process writes into itself while its sources read other data of them.

    ``store`` may write one dataset of an HDF5 file while the array it stores
    reads another dataset of that file (threads of this process only). Every
    read checks its file's stamp, and those writes move it. Rather than turning
    change detection off on Source objects others share, the writer says what
    it is doing here (:meth:`writing`); a source whose file changed consults
    :meth:`explain`, which accepts a change only while this process writes the
    file, or when the stamps before and after are ones its own writes left.
    Files are told apart by device and inode, however their paths are spelled.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[tuple[int, int], int] = {}
        self._stamps: dict[tuple[int, int], set[tuple[int, ...]]] = {}

    @contextlib.contextmanager
    def writing(self, path: str) -> Iterator[None]:
        """While the block runs, this process writes ``path`` (an existing file) itself."""
        before = file_stamp(path)
        key = (before[3], before[4])
        with self._lock:
            self._writers[key] = self._writers.get(key, 0) + 1
            self._stamps.setdefault(key, set()).add(before)
        try:
            yield
        finally:
            with self._lock:
                self._writers[key] -= 1
                if not self._writers[key]:
                    del self._writers[key]
                with contextlib.suppress(OSError, DaskstreamError):
                    self._stamps[key].add(file_stamp(path))

    def explain(self, was: tuple[Any, ...], now: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The stamp a source should hold when this process's own writes explain why its file's stamp went
        from ``was`` to ``now``, else ``None``.

        Stamps start with :func:`file_stamp` of the source's file; what follows
        (the stamps of files an HDF5 dataset links to) must not have changed.
        While a write goes on, the source keeps ``was``; once it has ended,
        ``now``, the stamp the write left.
        """
        if len(was) < 5 or len(now) < 5 or was[5:] != now[5:]:
            return None
        key = (int(now[3]), int(now[4]))
        with self._lock:
            own = self._stamps.get(key, set())
            if tuple(was[:5]) not in own:
                return None
            if key in self._writers:
                return was
            return now if tuple(now[:5]) in own else None


#: The one record of this process's own writes into files its sources read.
own_writes = OwnWrites()
