"""The variables of a labelled file: planned daskstream arrays under xarray's labels, decoded as xarray decodes them.

Shared by :func:`daskstream.labelled.dataset.open_dataset` (one file, or each
of many) and :mod:`daskstream.labelled.family` (many files of one family).
"""

from __future__ import annotations

import functools
import os
import posixpath
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from daskstream.dependencies import optional_import
from daskstream.errors import (
    AttributeDecodingError,
    DaskstreamError,
    InvalidArgumentError,
    MemberNotFoundError,
    UnknownFormatError,
    first_line,
    shown,
)
from daskstream.graph.reads import ChunksSpec
from daskstream.labelled.calendar import by_axis, calendar_array, calendar_starts
from daskstream.opening import as_dask_array
from daskstream.planning.settings import PlanSettings
from daskstream.sources import Source, open_source
from daskstream.sources.contiguous import ObjectBytes, ObjectFile
from daskstream.sources.detect import guess_format, is_url, local_path
from daskstream.sources.objects.places import Place

# Dimension coordinates up to this size are read when the dataset is opened, as xarray reads its
# indexes: .sel and plots need them at once, and one read beats a graph per lookup.
EAGER_COORDINATE_BYTES = 64 * 2**20

# The decoding options of xarray.decode_cf, all on with decode_cf=True and all off without it.
DECODERS = ("mask_and_scale", "decode_times", "concat_characters", "decode_coords", "decode_timedelta")


@functools.cache
def xarray_module() -> Any:
    """xarray, or a :class:`~daskstream.errors.MissingDependencyError` saying how to install it.

    Checked once a process (a failure is not remembered): the check reads the
    installed packages' metadata, which costs more than opening a small file.
    """
    return optional_import("xarray", package="xarray", needed_for="open_dataset", extra="xarray")


@functools.cache
def h5netcdf_module() -> Any:
    """h5netcdf, which xarray reads NetCDF4/HDF5 labels with, checked once a process as xarray is."""
    return optional_import(
        "h5netcdf", package="h5netcdf", needed_for="open_dataset of NetCDF4/HDF5 files", extra="xarray"
    )


#: How a reader of labelled variables gets each one's data: ``(source, is_dimension_coordinate, dims, periods)``
#: to the data and its chunks.
DataOf = Callable[
    [Source, bool, tuple[str, ...], Mapping[str, tuple[tuple[int, ...], ...]]], tuple[Any, tuple[tuple[int, ...], ...]]
]


def planned_data(
    source: Source,
    chunks: ChunksSpec,
    settings: PlanSettings,
    *,
    eager: bool,
    sampling: PlanSettings | None = None,
    dims: tuple[str, ...] = (),
    periods: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
) -> tuple[Any, tuple[tuple[int, ...], ...]]:
    """``source``'s data as daskstream plans it within ``settings``, and its chunks; read now when ``eager`` and
    small (a dimension coordinate). ``sampling``: as for :func:`daskstream.opening.as_dask_array`.

    ``dims`` name the source's axes, so ``chunks`` may be given by dimension name as xarray takes them
    (``{"time": 365}``); ``periods``: where calendar periods start along the dimensions that have them
    (:func:`calendar_starts`), so planned chunks hold whole years or months (:mod:`daskstream.planning.periods`).
    """
    chunks = by_axis(chunks, dims)
    if isinstance(chunks, str) and chunks == "auto" and periods and not eager:
        data = calendar_array(source, settings, dims, periods)
    else:
        data = as_dask_array(source, settings, chunks=chunks, sampling=sampling)
    if eager and source.nbytes <= EAGER_COORDINATE_BYTES:
        # Read now, as xarray reads its indexes: here, in one read, rather than through a scheduler.
        return source.read(), data.chunks
    return data, data.chunks


def labelled_variables(
    path: str | os.PathLike[str], *, group: str | None, storage_options: dict[str, Any] | None,
    data_of: DataOf,
) -> tuple[dict[str, Any], dict[str, Any], Callable[[], None]]:  # fmt: skip
    """The undecoded variables of ``group`` in ``path``, their attributes and how to close the file.

    Dimensions, attributes and encodings are xarray's reader's; each variable's
    data and chunks are ``data_of(source, is_dimension_coordinate, dims, periods)``
    for the daskstream source of the same array (``periods``: where the
    file's calendar periods start, by dimension, see :func:`calendar_starts`),
    or xarray's reader's own data where daskstream does not read it.
    """
    xr = xarray_module()
    location = str(path) if is_url(str(path)) else local_path(os.fspath(path))
    fmt = guess_format(location, storage_options)
    if group and group.strip("/"):
        _check_group(location, fmt, group, storage_options)
    labels = _labels_reader(location, fmt, group, storage_options)
    if labels is None:  # a .npy file: one array, named after the file
        array = open_source(location)
        name = posixpath.splitext(posixpath.basename(location.rstrip("/")))[0]
        dims = tuple(f"dim_{axis}" for axis in range(array.ndim))
        return {name: _variable(xr, *data_of(array, False, dims, {}), dims, {}, {})}, {}, lambda: None
    variables = {}
    raws = dict(labels.get_variables())
    # Where years and months start along each time coordinate, so chunks along it hold whole periods.
    periods = calendar_starts(xr, raws)
    for name, raw in raws.items():
        member = posixpath.join("/", group or "", name)
        source: Source | None
        try:
            source = open_source(location, dataset=member, storage_options=storage_options)
        except DaskstreamError:
            source = None  # types numpy has no equivalent of, text not UTF-8...: xarray's reader reads them
        # Variable-length strings stay xarray's too: its operations expect them as Python strings, not StringDType.
        if source is None or source.shape != raw.shape or source.dtype.kind == "T":  # (or shaped as characters)
            variables[name] = raw
            continue
        data, chunks = data_of(source, raw.dims == (name,), tuple(raw.dims), periods)
        variables[name] = _variable(xr, data, chunks, raw.dims, raw.attrs, raw.encoding)
    return variables, dict(labels.get_attrs()), labels.close


def decoded(xr: Any, variables: Mapping[str, Any], attrs: Mapping[str, Any], *, where: str, **options: Any) -> Any:
    """A Dataset of ``variables`` decoded by xarray's own decoders, as ``xarray.decode_cf`` decodes a store.

    Attributes the decoders would fail on -- now, or later inside a task of
    ``.load()`` -- are an :class:`~daskstream.errors.AttributeDecodingError`
    naming ``where`` (the file), the variable and the attribute.
    """
    variables, attrs, coord_names = decoded_variables(xr, variables, attrs, where=where, **options)
    dataset = xr.Dataset(variables, attrs=attrs)
    return dataset.set_coords(set(coord_names).intersection(variables))


def decoded_variables(
    xr: Any, variables: Mapping[str, Any], attrs: Mapping[str, Any], *, where: str, **options: Any
) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """``variables`` and ``attrs`` decoded by ``xarray.conventions.decode_cf_variables``, with the names of
    the coordinates; failures as in :func:`decoded`."""
    if options.get("mask_and_scale", True):
        for name, variable in variables.items():
            if name not in dropped_names(options.get("drop_variables")):
                _check_packing(where, name, variable)
    try:
        found, found_attrs, coord_names = xr.conventions.decode_cf_variables(variables, attrs, **options)
    except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:
        raise _decoding_error(xr, where, variables, options, exc) from None
    return dict(found), dict(found_attrs), set(coord_names)


# The attributes xarray's mask_and_scale applies to a variable's numbers: each one number.
_PACKING = ("scale_factor", "add_offset")
# The values it masks: numbers for a variable of numbers (missing_value may list several).
_MASKS = ("_FillValue", "missing_value", "valid_min", "valid_max", "valid_range")


def dropped_names(drop: Any) -> set[str]:
    """The variables ``drop_variables=`` names, as a set.

    >>> sorted(dropped_names("a")), sorted(dropped_names(["a", "b"])), dropped_names(None)
    (['a'], ['a', 'b'], set())
    """
    return set() if drop is None else {drop} if isinstance(drop, str) else set(drop)


def _check_packing(where: str, name: str, variable: Any) -> None:
    """Refuse the CF attributes of ``variable`` that xarray would apply to its numbers and cannot."""
    numeric = np.dtype(variable.dtype).kind in "biufc"
    advice = (
        "fix the attribute in the file, or open it with mask_and_scale=False (or decode_cf=False) to read the "
        "stored numbers as they are"
    )
    for attribute in (*_PACKING, *(_MASKS if numeric else ())):
        if attribute not in variable.attrs:
            continue
        value = np.asarray(variable.attrs[attribute])
        if value.dtype.kind not in "biuf":
            raise AttributeDecodingError(
                f"{where}: variable {name!r} has {attribute} {shown(variable.attrs[attribute], 60)}, which is not a "
                f"number; {advice}"
            )
        if attribute in _PACKING and value.size != 1:
            raise AttributeDecodingError(
                f"{where}: variable {name!r} has {value.size} values of {attribute} ({shown(value, 60)}) where CF "
                f"takes one number; {advice}"
            )


def _decoding_error(
    xr: Any, where: str, variables: Mapping[str, Any], options: Mapping[str, Any], exc: BaseException
) -> AttributeDecodingError:
    """xarray's decoding failure as one clear error, naming the variable it failed on (found by decoding
    each alone) and the decoder to turn off."""
    culprit = None
    single = {k: v for k, v in options.items() if k in (*DECODERS, "use_cftime")}
    for name, variable in variables.items():
        if name in dropped_names(options.get("drop_variables")):
            continue
        try:
            xr.conventions.decode_cf_variable(name, variable, **_variable_options(single))
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError):
            culprit = name
            break
    which = f"variable {culprit!r}" if culprit else "its variables"
    times = "units" in str(exc) or "calendar" in str(exc) or "time" in str(exc)
    switch = "decode_times=False" if times else "decode_cf=False"
    return AttributeDecodingError(
        f"{where}: xarray could not decode {which} ({first_line(exc)}); fix its attributes in the file, or open it "
        f"with {switch} to read the stored values"
    )


def _variable_options(options: Mapping[str, Any]) -> dict[str, Any]:
    # decode_cf_variable takes decode_endianness and stack_char_dim rather than decode_coords.
    return {k: v for k, v in options.items() if k != "decode_coords"}


def _variable(
    xr: Any, data: Any, chunks: tuple[tuple[int, ...], ...], dims: tuple[str, ...], attrs: Mapping[str, Any],
    encoding: Mapping[str, Any],
) -> Any:  # fmt: skip
    """An xarray Variable of ``data``, its encoding naming the ``chunks`` daskstream plans for it."""
    preferred = {dim: sizes[0] if sizes else 0 for dim, sizes in zip(dims, chunks, strict=True)}
    return xr.Variable(dims, data, dict(attrs), {**encoding, "preferred_chunks": preferred})


def _labels_reader(location: str, fmt: str, group: str | None, storage_options: dict[str, Any] | None) -> Any:
    """xarray's own store for the file's labels (``None`` for a .npy file, which has none)."""
    xr = xarray_module()
    if fmt == "npy":
        if group:
            raise InvalidArgumentError(f"{location}: a .npy file holds one array and no groups; open it without group=")
        return None
    if fmt == "hdf5":
        h5netcdf_module()
        where = _hdf5_file(location, storage_options)
        # phony_dims="sort": axes of plain HDF5 data without dimension scales get names as NetCDF-C gives them.
        return _translated(
            location, lambda: xr.backends.H5NetCDFStore.open(where, mode="r", group=group, phony_dims="sort")
        )
    if fmt == "zarr":

        def open_group() -> Any:
            with warnings.catch_warnings():
                # A store without consolidated metadata is read as it is: nothing the user must act on.
                warnings.filterwarnings("ignore", "Failed to open Zarr store with consolidated metadata")
                return xr.backends.ZarrStore.open_group(
                    location, mode="r", group=group, consolidated=None, storage_options=storage_options
                )

        return _translated(location, open_group)
    raise UnknownFormatError(f"{location}: not a NetCDF4/HDF5 file, Zarr store or .npy file")


def _check_group(location: str, fmt: str, group: str, storage_options: dict[str, Any] | None) -> None:
    """Refuse a ``group`` that is not a group of the file, naming the groups it has."""
    if fmt == "npy":
        return  # (refused by _labels_reader, saying why)
    if fmt == "hdf5":
        import h5py

        where = _hdf5_file(location, storage_options)
        with h5py.File(where, "r") as f:
            node = f.get(group, getlink=False)
            if isinstance(node, h5py.Group):
                return
            found = sorted(name for name, item in f.items() if isinstance(item, h5py.Group))
    else:
        import zarr

        root = zarr.open_group(location, mode="r", storage_options=storage_options)
        try:
            if isinstance(root[group.strip("/")], zarr.Group):
                return
        except KeyError:
            pass
        found = sorted(name for name, _ in root.groups())
    has = f"its groups are: {', '.join(found)}" if found else "it has no groups below the root"
    raise MemberNotFoundError(f"{location}: no such group {group!r}; {has} (daskstream.list shows the tree)")


def _hdf5_file(location: str, storage_options: dict[str, Any] | None) -> Any:
    """The path of a local HDF5 file, or a file over the object at an object-store URL (read by h5py, for the labels).

    The object's file asks for what h5py reads in blocks of ranged GETs and
    checks every response's version against the one it opened; it closes
    when h5py's file over it is closed and let go.
    """
    if not is_url(location):
        return location
    data, head = ObjectBytes.open(Place(location, storage_options), location)
    return ObjectFile(data, head)


def _translated(location: str, opener: Any) -> Any:
    """``opener()``, its failures told as daskstream's errors naming ``location``."""
    try:
        return opener()
    except DaskstreamError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UnknownFormatError(f"{location}: xarray cannot read its labels: {exc}") from None
