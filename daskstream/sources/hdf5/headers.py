"""What a file of a family is checked by when it is opened: shapes, dtypes, small arrays and raw attributes.

Opening many files of one family reads the full metadata of the first only
(:class:`~daskstream.sources.hdf5.source.Hdf5Source`: filters, chunk index, links,
dimension scales, attributes decoded). Each other file is read here through
h5py's low-level API for just what proves it matches: one file open, the
objects named and nothing else, no dimension scale resolved and no attribute
converted beyond its stored value. That costs a fraction of a millisecond a
file, where the full metadata costs several.

Attributes are kept as :data:`RawAttrs`, comparable and hashable, so that
files holding the same attributes are told apart from files that do not
without converting either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from daskstream.sources.base import native
from daskstream.sources.hdf5.filters import import_h5py


@dataclasses.dataclass(frozen=True)
class StoredAttr:
    """One attribute as stored: comparable and hashable, and enough to rebuild what h5py reads.

    Attributes
    ----------
    dtype
        Its dtype as h5py gives it (with h5py's string metadata).
    shape
        Its shape; ``None`` for an empty (null) attribute.
    payload
        The bytes of its values, or for variable-length strings the bytes of each.
    """

    dtype: np.dtype
    shape: tuple[int, ...] | None
    payload: bytes | tuple[bytes, ...]

    def array(self) -> np.ndarray | None:
        """The values as h5py's low-level read gives them (``None`` for an empty attribute)."""
        if self.shape is None:
            return None
        if isinstance(self.payload, tuple):
            held = np.empty(len(self.payload), dtype=self.dtype)
            held[:] = self.payload
            return held.reshape(self.shape)
        return np.frombuffer(self.payload, dtype=self.dtype).reshape(self.shape).copy()


#: Attributes as stored: ``(name, StoredAttr)`` pairs sorted by name, comparable and hashable.
RawAttrs = tuple[tuple[str, StoredAttr], ...]

# Numbers and fixed-width bytes: what the header of a family member's dataset may hold to be read from its
# header alone (anything else -- strings of variable length, compounds, references -- is opened in full).
_PLAIN_KINDS = frozenset("biufcS")


@dataclasses.dataclass(frozen=True)
class DatasetHeader:
    """One dataset as its header states it.

    Attributes
    ----------
    shape, dtype
        As h5py reads them (the dtype in native byte order).
    attrs
        Its attributes as stored (:data:`RawAttrs`), those named in ``skip``
        of :func:`file_header` left out; empty unless asked for.
    values
        Its data, for the datasets :func:`file_header` was asked to read.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    attrs: RawAttrs = ()
    values: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class FileHeader:
    """What :func:`file_header` read of one file: its group's links, attributes and the datasets asked for."""

    links: int
    attrs: RawAttrs
    datasets: Mapping[str, DatasetHeader]


def is_plain(dtype: np.dtype) -> bool:
    """Whether a dataset of ``dtype`` reads the same from its header as from its full metadata: numbers and
    fixed-width bytes, no fields, no element axes.

    >>> is_plain(np.dtype("f4")), is_plain(np.dtype([("a", "f4")])), is_plain(np.dtype(("f8", (3,))))
    (True, False, False)
    """
    return dtype.kind in _PLAIN_KINDS and dtype.fields is None and dtype.subdtype is None


def dataset_header(path: str, dataset: str) -> DatasetHeader | None:
    """The shape and dtype of ``dataset`` in the HDF5 file at ``path``; ``None`` when it is not a plain dataset
    there (missing, of another type, or the file not HDF5): the full open then says what is wrong."""
    h5py = import_h5py()
    file_id = _opened_file(h5py, path)
    if file_id is None:
        return None
    try:
        return _plain(_dataset_id(h5py, file_id, dataset))
    finally:
        file_id.close()


def file_header(
    path: str,
    group: str | None,
    names: Collection[str],
    *,
    values: Collection[str] = (),
    attrs: Collection[str] = (),
    skip: Collection[str] = (),
) -> FileHeader | None:
    """The number of links in ``group`` of the HDF5 file at ``path``, its attributes, and for each of ``names``
    the shape and dtype of that dataset of the group (its data too for those in ``values``, its attributes for
    those in ``attrs``).

    Attributes named in ``skip`` are neither read nor kept. ``None`` when the
    file is not HDF5, or a dataset named is missing or not plain (see
    :func:`is_plain`): the caller then opens the file in full.
    """
    h5py = import_h5py()
    file_id = _opened_file(h5py, path)
    if file_id is None:
        return None
    try:
        where = (group or "/").encode()
        try:
            group_id = h5py.h5g.open(file_id, where)
        except (KeyError, OSError, ValueError):
            return None
        datasets = {}
        for name in names:
            dataset_id = _dataset_id(h5py, group_id, name)
            header = _plain(dataset_id)
            if dataset_id is None or header is None:
                return None
            data = None
            if name in values:
                data = np.empty(header.shape, dtype=header.dtype)
                if data.size:
                    dataset_id.read(h5py.h5s.ALL, h5py.h5s.ALL, data)
            stored = raw_attrs(h5py, dataset_id, skip) if name in attrs else ()
            datasets[name] = dataclasses.replace(header, attrs=stored, values=data)
        return FileHeader(group_id.get_num_objs(), raw_attrs(h5py, group_id, skip), datasets)
    except (KeyError, OSError, RuntimeError, ValueError, TypeError):
        return None  # what HDF5 cannot read here, the full open of the file reports
    finally:
        file_id.close()


def raw_attrs(h5py: Any, object_id: Any, skip: Collection[str] = ()) -> RawAttrs:
    """The attributes of an HDF5 object as stored (see :data:`RawAttrs`), those in ``skip`` left out.

    Only the name of a skipped attribute is read: netCDF's dimension lists
    hold object references, slow to read and of no use in a comparison.
    """
    names: list[bytes] = []
    # One pass over the names, then only the attributes kept are opened.
    h5py.h5a.iterate(object_id, lambda name, *_: names.append(name))
    found = []
    for raw_name in names:
        name = raw_name.decode("utf-8", "surrogateescape")
        if name in skip:
            continue
        attr = h5py.h5a.open(object_id, raw_name)
        dtype = attr.dtype
        if attr.shape is None:  # an empty (null) attribute
            found.append((name, StoredAttr(dtype, None, b"")))
            continue
        data = np.zeros(attr.shape, dtype=dtype)
        attr.read(data, mtype=h5py.h5t.py_create(dtype))
        if not dtype.hasobject:
            payload: bytes | tuple[bytes, ...] = data.tobytes()
        elif h5py.check_string_dtype(dtype) is not None:
            payload = tuple(data.ravel().tolist())  # variable-length strings, as bytes
        else:  # references and the like: compared by what they say, never rebuilt
            payload = tuple(repr(v).encode() for v in data.ravel())
        found.append((name, StoredAttr(dtype, tuple(data.shape), payload)))
    return tuple(sorted(found, key=lambda pair: pair[0]))


def _opened_file(h5py: Any, path: str) -> Any:
    """HDF5's low-level handle of the file at ``path``, read-only; ``None`` when it is not an HDF5 file."""
    try:
        return h5py.h5f.open(path.encode(), h5py.h5f.ACC_RDONLY)
    except (OSError, ValueError):
        return None


def _dataset_id(h5py: Any, parent_id: Any, name: str) -> Any:
    try:
        return h5py.h5d.open(parent_id, name.encode())
    except (KeyError, OSError, ValueError, TypeError):  # missing, or a group
        return None


def _plain(dataset_id: Any) -> DatasetHeader | None:
    if dataset_id is None or dataset_id.shape is None:
        return None
    try:
        dtype = dataset_id.dtype
    except (TypeError, ValueError):  # a type numpy has no equivalent of
        return None
    if not is_plain(dtype):
        return None
    return DatasetHeader(tuple(int(n) for n in dataset_id.shape), native(dtype))
