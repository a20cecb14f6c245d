"""Many NetCDF4/HDF5 files of one family as one Dataset, at the cost of one file's labels and a header per other.

``xarray.open_mfdataset`` opens every file in full -- its dimension scales,
every variable, every attribute decoded -- and then compares what it read.
For ten thousand daily files that is ten thousand full opens. A family
(files written alike, joined along one dimension) needs less, and this module
reads less:

At open
    The first file in full, as :func:`daskstream.open_dataset` opens one
    file. Of each other file, through h5py's low-level API in one open
    (:func:`daskstream.sources.hdf5.headers.file_header`): the number of
    links in the group; the values, dtype and attributes of every dimension
    coordinate, which must equal the first file's (decoded, as
    ``join="exact"`` compares them) except along the joined dimension, whose
    values are decoded as xarray decodes them (with each file's own
    ``units`` and ``calendar``); the shape, dtype and attributes of each
    variable along the joined dimension; the group's attributes. A variable
    whose shape does not fit is a :class:`~daskstream.errors.FileFamilyError`
    naming the file and what differs. (xarray's time decoder reads the first
    and last value of a variable of times along the joined dimension, time
    bounds say, to choose its dtype: such a variable is read at open, once
    for each run of files of the same attributes.)
At each file's first read (in each process)
    The file's variable is opened in full and must have the shape, dtype and
    dimension names it was opened with
    (:class:`~daskstream.sources.many.FamilyMember`); else a
    :class:`~daskstream.errors.FileFamilyError` naming the file and what
    differs.
Never
    Variables without the joined dimension in the other files (taken from
    the first, as ``compat="override"`` takes them).

What this reads gives the Dataset ``xarray.combine_by_coords`` (or
``combine_nested`` along ``concat_dim``) gives with ``data_vars="minimal"``,
``coords="minimal"``, ``compat="override"``, ``join="exact"`` and
``combine_attrs="drop_conflicts"``: files ordered by the joined coordinate,
each variable decoded with its own file's attributes (files of equal
attributes decoded together), attributes whose stored values differ between
files dropped. Where the files are not such a family -- not local HDF5, more
than one dimension differing, a coordinate not monotonic, a variable along
the joined dimension only xarray reads (strings), a number of links or a
group attribute the first file has not -- :func:`open_family` returns ``None`` and
the caller opens every file in full and lets xarray combine them.

Longer than most modules: telling a family from files that only look alike
takes one check per way they can differ (coordinates, variables, attributes,
links), and each is small; apart, the checks would lose the header they share.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dask.array as da
import numpy as np

from daskstream.errors import DaskstreamError, FileFamilyError
from daskstream.graph.reads import ChunksSpec, SharedPlans, chunked_source_array, shared_settings
from daskstream.labelled.variables import decoded, decoded_variables, dropped_names, labelled_variables, planned_data
from daskstream.opening import as_dask_array
from daskstream.planning.settings import PlanSettings
from daskstream.sources.base import Source, file_stamp
from daskstream.sources.detect import guess_format, is_url
from daskstream.sources.hdf5.filters import import_h5py
from daskstream.sources.hdf5.headers import FileHeader, StoredAttr, file_header
from daskstream.sources.many import FamilyMember
from daskstream.sources.zarr.source import local_path

# netCDF's own bookkeeping attributes, which xarray's h5netcdf reader hides: never read, never compared.
NETCDF_HIDDEN_ATTRS = frozenset(
    {"REFERENCE_LIST", "CLASS", "DIMENSION_LIST", "NAME", "_Netcdf4Dimid", "_Netcdf4Coordinates", "_nc3_strict",
     "_NCProperties"}
)  # fmt: skip


def open_family(
    xr: Any,
    paths: Sequence[Any],
    *,
    group: str | None,
    settings: PlanSettings,
    sampling: PlanSettings,
    chunks: ChunksSpec,
    drop_variables: str | Iterable[str] | None,
    concat_dim: str | None,
    options: dict[str, Any],
) -> Any | None:
    """The files ``paths`` as one Dataset, read as the module says; ``None`` where they are not such a family.

    Parameters
    ----------
    xr
        The xarray module.
    paths
        Two or more local NetCDF4/HDF5 files, in the order given.
    group, chunks, drop_variables, concat_dim
        As for :func:`daskstream.open_dataset`.
    settings, sampling
        What the variables are planned for, and for ``chunks="tune"`` the
        reads that time candidates (see :func:`daskstream.opening.as_dask_array`).
    options
        xarray's decoding switches (``mask_and_scale``, ``decode_times``...).

    Raises
    ------
    FileFamilyError
        For a file whose variable along the joined dimension has another
        shape (at open), or whose full metadata differs from its header (at
        its first read).
    """
    locations = _local_files(paths)
    if locations is None:
        return None
    try:
        fmt = guess_format(locations[0])
    except DaskstreamError:
        return None  # (the file's own open says what is wrong with it)
    if fmt != "hdf5":
        return None
    return _Family(xr, locations, group, settings, sampling, chunks, drop_variables, concat_dim, options).open()


def _local_files(paths: Sequence[Any]) -> list[str] | None:
    if len(paths) < 2:
        return None
    found = []
    for path in paths:
        if not isinstance(path, str | os.PathLike):
            return None
        text = os.fspath(path)
        if not isinstance(text, str) or "::" in text or is_url(text):
            return None
        found.append(os.path.abspath(local_path(text)))
    return found


class _Family:
    """One opening of a family of files (see the module): what the first file gave, and what the others add."""

    def __init__(
        self, xr: Any, locations: list[str], group: str | None, settings: PlanSettings, sampling: PlanSettings,
        chunks: ChunksSpec, drop_variables: str | Iterable[str] | None, concat_dim: str | None,
        options: dict[str, Any],
    ) -> None:  # fmt: skip
        self.xr, self.locations, self.group = xr, locations, group
        self.settings, self.sampling = settings, sampling
        self.chunks, self.concat_dim = chunks, concat_dim
        self.drop_variables, self.options = drop_variables, options
        self.sources: dict[str, Source] = {}
        self.plans: SharedPlans | None = None

    def member(self, name: str) -> str:
        return posixpath.join("/", self.group or "", name)

    def open(self) -> Any | None:
        def data_of(
            source: Source, coordinate: bool, dims: tuple[str, ...], periods: Mapping[str, Any]
        ) -> tuple[Any, tuple[tuple[int, ...], ...]]:
            # Each file of a family is one piece of the joined dimension: its own periods do not place its chunks.
            self.sources[source.dataset or ""] = source
            return planned_data(source, self.chunks, self.settings, eager=coordinate, sampling=self.sampling, dims=dims)

        self.variables, attrs, close = labelled_variables(
            self.locations[0], group=self.group, storage_options=None, data_of=data_of
        )
        # As read, before xarray's decoders see them: they give bounds their coordinate's units in place.
        self.attrs_of = {name: dict(v.attrs) for name, v in self.variables.items()}
        self.encoding_of = {name: dict(v.encoding) for name, v in self.variables.items()}
        try:
            found = self._joined(attrs)
        except BaseException:
            close()
            raise
        if isinstance(found, list):
            close()
            # xarray takes what is not joined from the file first along the dimension: that file comes first.
            reordered = [self.locations[i] for i in found]
            return _Family(
                self.xr, reordered, self.group, self.settings, self.sampling, self.chunks, self.drop_variables,
                self.concat_dim, self.options,
            ).open()  # fmt: skip
        if found is None:
            close()
            return None
        found.set_close(close)
        return found

    def _joined(self, attrs: dict[str, Any]) -> Any:
        """The joined Dataset; ``None`` where the files are not such a family; or the order of the files
        when the first file given is not the first along the joined coordinate."""
        xr, first = self.xr, self.locations[0]
        self.first = decoded(xr, self.variables, attrs, where=first, drop_variables=self.drop_variables, **self.options)
        kept = {k: v for k, v in self.variables.items() if k not in dropped_names(self.drop_variables)}
        coords = [name for name, v in kept.items() if v.dims == (name,)]
        if any(not isinstance(kept[c].data, np.ndarray) or self.member(c) not in self.sources for c in coords):
            return None  # a dimension coordinate only xarray reads (strings) or too large to compare
        dims = {dim for v in kept.values() for dim in v.dims}
        joined_dim = self._joined_dimension(coords, dims)
        if joined_dim is None:
            return None
        joined = [n for n, v in kept.items() if joined_dim in v.dims and n != joined_dim]
        if any(self.member(n) not in self.sources for n in joined):
            return None  # a variable along the joined dimension only xarray reads
        stamps, headers = self._headers(coords, joined)
        if headers is None:
            return None
        self._check_shapes(headers, joined, joined_dim)
        if not self._coordinates_agree(headers, coords, joined_dim):
            return None
        coordinate, order = self._joined_coordinate(headers, joined_dim, coords)
        if order is None:
            return None
        if order[0] != 0:
            return order
        root = self._merged_attrs(headers)
        if root is None:
            return None
        variables = dict(self.first.variables)
        if coordinate is not None:
            variables[joined_dim] = coordinate
        for name in joined:
            variables[name] = self._joined_variable(name, joined_dim, headers, stamps, order)
        return xr.Dataset(variables, attrs=root).set_coords(list(self.first.coords))

    def _joined_dimension(self, coords: list[str], dims: set[str]) -> str | None:
        """The dimension the files join along: ``concat_dim``, or the one coordinate the second file holds
        other values of."""
        if self.concat_dim is not None:
            return self.concat_dim if self.concat_dim in dims else None
        pair = [file_header(path, self.group, coords, values=coords, attrs=coords, skip=NETCDF_HIDDEN_ATTRS)
                for path in self.locations[:2]]  # fmt: skip
        if pair[0] is None or pair[1] is None:
            return None
        differ = [c for c in coords if not self._same_coordinate([pair[0], pair[1]], c)]
        return differ[0] if len(differ) == 1 else None

    def _same_coordinate(self, headers: list[FileHeader], name: str) -> bool:
        """Whether the last file of ``headers`` holds the first one's coordinate ``name``, compared as xarray
        compares indexes: decoded (daily files often hold one same stored value, each in units of its own
        date), where what is stored differs at all."""
        if _stored(headers[0], name) == _stored(headers[-1], name):
            return True
        import pandas as pd

        pieces, _ = self._decoded_pieces([headers[0], headers[-1]], name)
        return bool(pd.Index(pieces[0]).equals(pd.Index(pieces[1])))

    def _headers(self, coords: list[str], joined: list[str]) -> tuple[list[tuple[int, ...]], list[FileHeader] | None]:
        """Each file's stamp and header (:func:`file_header`): its coordinates' values and attributes (which
        decode them), its joined variables' shapes, dtypes and attributes."""
        names = [*coords, *joined]
        stamps, headers = [], []
        for path in self.locations:
            stamps.append(file_stamp(path))  # before the header: a later change is caught at the read
            header = file_header(path, self.group, names, values=coords, attrs=names, skip=NETCDF_HIDDEN_ATTRS)
            if header is None:
                return stamps, None
            headers.append(header)
        return stamps, headers

    def _check_shapes(self, headers: list[FileHeader], joined: list[str], joined_dim: str) -> None:
        """Refuse a file whose variable along the joined dimension has another shape elsewhere than along it."""
        first = headers[0]
        for path, header in zip(self.locations[1:], headers[1:], strict=True):
            length = None
            if joined_dim in header.datasets:
                length = header.datasets[joined_dim].shape[0]
            for name in joined:
                dims = self.variables[name].dims
                got, expected = header.datasets[name].shape, list(first.datasets[name].shape)
                axis = dims.index(joined_dim)
                # Along the joined dimension a file has its own length: its coordinate's, where it has one.
                if len(got) == len(expected):
                    expected[axis] = got[axis] if length is None else length
                if got != tuple(expected):
                    raise FileFamilyError(
                        f"{path}: variable {name!r} has shape {got}, not {tuple(expected)} "
                        f"({_named_difference(dims, got, tuple(expected))}), so it cannot be joined along {joined_dim!r} "
                        f"with {self.locations[0]}; leave it out of the list or pattern, or open it on its own"
                    )

    def _coordinates_agree(self, headers: list[FileHeader], coords: list[str], joined_dim: str) -> bool:
        """Whether every file holds the first file's links and, but along the joined dimension, its coordinates
        (as ``join="exact"`` compares them)."""
        first = headers[0]
        for header in headers[1:]:
            if header.links != first.links:
                return False
            if any(c != joined_dim and not self._same_coordinate([first, header], c) for c in coords):
                return False
        return True

    def _joined_coordinate(
        self, headers: list[FileHeader], joined_dim: str, coords: list[str]
    ) -> tuple[Any, list[int] | None]:
        """The joined dimension's coordinate, decoded, and the order of the files along it."""
        count = len(headers)
        if joined_dim not in coords:
            return None, list(range(count))  # (combine_nested along a dimension without coordinate)
        pieces, attrs = self._decoded_pieces(headers, joined_dim)
        order = list(range(count)) if self.concat_dim is not None else _order(pieces)
        if order is None:
            return None, None
        xr = self.xr
        values = np.concatenate([pieces[i] for i in order])
        like = self.first.variables[joined_dim]
        coordinate = xr.Variable((joined_dim,), values, _merged(xr, joined_dim, attrs), dict(like.encoding))
        return coordinate, order

    def _decoded_pieces(self, headers: list[FileHeader], name: str) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
        """Each file's values of the coordinate ``name`` decoded, and the distinct attributes left after decoding.

        Files whose coordinate has the same dtype and attributes are decoded
        together, in one call of xarray's decoders.
        """
        xr = self.xr
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, header in enumerate(headers):
            stored = header.datasets[name]
            groups.setdefault((stored.dtype.str, stored.attrs), []).append(index)
        pieces: list[np.ndarray] = [np.empty(0)] * len(headers)
        left: dict[str, dict[str, Any]] = {}
        for indexes in groups.values():
            held = [_values(headers[i], name) for i in indexes]
            attrs = self._shown(headers, indexes[0], name)
            variable = xr.Variable((name,), np.concatenate(held), attrs, self.encoding_of[name])
            found, _, _ = decoded_variables(xr, {name: variable}, {}, where=self.locations[indexes[0]], **self.options)
            values = np.asarray(found[name].values)
            left.setdefault(repr(sorted(found[name].attrs.items())), dict(found[name].attrs))
            start = 0
            for i, piece in zip(indexes, held, strict=True):
                pieces[i] = values[start : start + len(piece)]
                start += len(piece)
        return pieces, list(left.values())

    def _joined_variable(
        self, name: str, joined_dim: str, headers: list[FileHeader], stamps: list[tuple[int, ...]], order: list[int]
    ) -> Any:
        """Variable ``name`` of every file, in ``order``, joined and decoded: each run of files whose variable
        has the same dtype and attributes is joined as stored and decoded in one."""

        xr = self.xr
        raw = self.variables[name]
        like = self.sources[self.member(name)]
        axis = raw.dims.index(joined_dim)
        # Bounds take their units from the joined coordinate (CF): files of other units are decoded apart.
        with_bounds = self.attrs_of.get(joined_dim, {}).get("bounds") == name

        def key(index: int) -> tuple[Any, ...]:
            stored = headers[index].datasets[name]
            return (stored.dtype.str, stored.attrs, headers[index].datasets[joined_dim].attrs if with_bounds else ())

        runs: list[list[int]] = []
        for index in order:
            if runs and key(runs[-1][-1]) == key(index):
                runs[-1].append(index)
            else:
                runs.append([index])
        first = self._planned(like)
        encoding = dict(self.encoding_of[name])
        # The chunks of each file are planned as a share of the whole: the first file's too.
        encoding["preferred_chunks"] = {d: c[0] if c else 0 for d, c in zip(raw.dims, first.chunks, strict=True)}
        decoded_runs = []
        for run in runs:
            arrays = []
            for index in run:
                if index == 0:
                    arrays.append(first)
                    continue
                stored = headers[index].datasets[name]
                member = FamilyMember(
                    self.locations[index], self.member(name), like=like, shape=stored.shape, dtype=stored.dtype,
                    stamp=stamps[index], dims=like.dims,
                )  # fmt: skip
                arrays.append(self._planned(member))
            data = arrays[0] if len(arrays) == 1 else da.concatenate(arrays, axis=axis)
            attrs = self._shown(headers, run[0], name)
            variables = {name: xr.Variable(raw.dims, data, attrs, encoding)}
            if with_bounds:
                held = _values(headers[run[0]], joined_dim)
                shown = self._shown(headers, run[0], joined_dim)
                variables[joined_dim] = xr.Variable((joined_dim,), held, shown, self.encoding_of[joined_dim])
            found, _, _ = decoded_variables(xr, variables, {}, where=self.locations[run[0]], **self.options)
            decoded_runs.append(found[name])
        if len(decoded_runs) == 1:
            return decoded_runs[0]
        return xr.Variable.concat(decoded_runs, dim=joined_dim, combine_attrs="drop_conflicts")

    def _planned(self, source: Source) -> Any:
        """A dask array of ``source`` in the chunks asked for: for ``"auto"``, the plan of one file among
        all of them (:func:`~daskstream.graph.reads.shared_settings`), made once per kind of file."""
        if not (isinstance(self.chunks, str) and self.chunks == "auto"):
            return as_dask_array(source, self.settings, chunks=self.chunks, sampling=self.sampling)
        if self.plans is None:
            self.plans = SharedPlans(shared_settings(self.settings, len(self.locations)))
        return chunked_source_array(source, self.plans.chunks(source), self.plans.settings)

    def _merged_attrs(self, headers: list[FileHeader]) -> dict[str, Any] | None:
        """The group's attributes of every file merged as ``combine_attrs="drop_conflicts"`` merges them:
        those stored alike in every file that has them; ``None`` when a file has one the first has not."""
        first = dict(headers[0].attrs)
        conflicting = set()
        for header in headers[1:]:
            if header.attrs == headers[0].attrs:
                continue
            for key, stored in header.attrs:
                if key not in first:
                    return None
                if stored != first[key]:
                    conflicting.add(key)
        return {k: v for k, v in self.first.attrs.items() if k not in conflicting}

    def _shown(self, headers: list[FileHeader], index: int, name: str) -> dict[str, Any]:
        """The attributes of variable ``name`` of file ``index`` as xarray's h5netcdf reader presents them:
        the first file's where they are stored alike, else rebuilt from what the header read."""
        stored = headers[index].datasets[name].attrs
        if stored == headers[0].datasets[name].attrs:
            return dict(self.attrs_of[name])
        shown = {}
        for key, attr in stored:
            value = _shown_value(key, attr)
            if value is _NOT_PLAIN:
                return self._presented(index, name)
            shown[key] = value
        return shown

    def _presented(self, index: int, name: str) -> dict[str, Any]:
        """The attributes of variable ``name`` of file ``index`` as xarray's h5netcdf reader presents them,
        read through h5py and h5netcdf as it reads them (for kinds :func:`_shown_value` does not rebuild)."""
        from h5netcdf.attrs import Attributes

        h5py = import_h5py()
        with h5py.File(self.locations[index], "r") as f:
            shown = Attributes(f[self.member(name)].attrs, lambda dtype: None, h5py)
            attrs = {}
            for key in shown:
                value = shown[key]
                if key not in ("_FillValue", "missing_value") and isinstance(value, bytes):
                    with contextlib.suppress(UnicodeDecodeError):  # (xarray keeps such bytes as they are)
                        value = value.decode("utf-8")
                attrs[key] = value
        return attrs


_NOT_PLAIN = object()


def _shown_value(key: str, attr: StoredAttr) -> Any:
    """An attribute as xarray's h5netcdf reader shows it (h5py's read, h5netcdf's and xarray's conversions),
    rebuilt from how it is stored; ``_NOT_PLAIN`` for kinds left to that reader itself (empty attributes,
    compounds, references, element arrays).

    >>> _shown_value("units", StoredAttr(np.dtype("S4"), (), b"days"))
    'days'
    >>> _shown_value("scale_factor", StoredAttr(np.dtype("f4"), (1,), np.float32(0.5).tobytes()))
    np.float32(0.5)
    """
    import h5py

    held = attr.array()
    if held is None or attr.dtype.fields is not None or attr.dtype.subdtype is not None:
        return _NOT_PLAIN
    string = h5py.check_string_dtype(attr.dtype)
    if attr.dtype.kind == "O" and string is None:
        return _NOT_PLAIN
    if string is not None and string.length is None:  # h5py decodes variable-length strings
        held = np.array([b.decode("utf-8", "surrogateescape") for b in held.flat], dtype=attr.dtype)
        held = held.reshape(attr.shape)
    value: Any = held[()] if held.ndim == 0 else held  # (h5py's read: a scalar, or an array)
    if string is not None:  # h5netcdf decodes fixed-width strings longer than one, and lists arrays of them
        if string.length is not None and string.length > 1:
            texts = [bytes(b).decode(string.encoding, "surrogateescape") for b in held.flat]
            value = texts[0] if held.ndim == 0 else texts
        elif held.ndim:
            value = held.tolist()
    if isinstance(value, np.ndarray | list) and len(value) == 1:
        value = value[0]
    if key not in ("_FillValue", "missing_value") and isinstance(value, bytes):  # xarray decodes the rest
        with contextlib.suppress(UnicodeDecodeError):
            value = value.decode("utf-8")
    return value


def _values(header: FileHeader, name: str) -> np.ndarray:
    held = header.datasets[name].values
    assert held is not None  # read for every coordinate
    return held


def _stored(header: FileHeader, name: str) -> tuple[Any, ...]:
    """What identifies dataset ``name`` of a file's header: its dtype, shape, values and attributes as stored."""
    held = header.datasets[name]
    values = held.values
    return (held.dtype.str, held.shape, b"" if values is None else values.tobytes(), held.attrs)


def _order(pieces: list[np.ndarray]) -> list[int] | None:
    """The files' order along the joined coordinate, as ``xarray.combine_by_coords`` orders them; ``None``
    where it would refuse (values neither increasing nor decreasing, files of one first value, an empty file,
    all files alike) or the joined values are not monotonic."""
    import pandas as pd

    indexes = [pd.Index(piece) for piece in pieces]
    if any(index.size == 0 for index in indexes) or all(index.equals(indexes[0]) for index in indexes[1:]):
        return None
    if all(index.is_monotonic_increasing for index in indexes):
        ascending = True
    elif all(index.is_monotonic_decreasing for index in indexes):
        ascending = False
    else:
        return None
    firsts = pd.Index([index[0] for index in indexes]).to_series()
    rank = firsts.rank(method="dense", ascending=ascending, numeric_only=False).astype(int).to_numpy() - 1
    if len(set(rank.tolist())) != len(pieces):
        return None
    order = [int(i) for i in np.argsort(rank, kind="stable")]
    joined = pd.Index(np.concatenate([pieces[i] for i in order]))
    if not (joined.is_monotonic_increasing or joined.is_monotonic_decreasing):
        return None
    return order


def _merged(xr: Any, dim: str, attrs: list[dict[str, Any]]) -> dict[str, Any]:
    """``attrs`` merged as xarray's concatenation merges them with ``combine_attrs="drop_conflicts"``."""
    if len(attrs) == 1:
        return attrs[0]
    empty = [xr.Variable((dim,), np.empty(0), a) for a in attrs]
    return dict(xr.Variable.concat(empty, dim=dim, combine_attrs="drop_conflicts").attrs)


def _named_difference(dims: tuple[str, ...], got: tuple[int, ...], expected: tuple[int, ...]) -> str:
    if len(got) != len(expected):
        return f"{len(got)} dimensions, not {len(expected)}"
    return ", ".join(f"{d}: {g}, not {e}" for d, g, e in zip(dims, got, expected, strict=True) if g != e)


__all__ = ["NETCDF_HIDDEN_ATTRS", "open_family"]
