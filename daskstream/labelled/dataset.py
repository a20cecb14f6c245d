"""``open_dataset``: a file's variables as an ``xarray.Dataset`` of daskstream-planned dask arrays.

The labels come from xarray's own readers, so they are what
``xr.open_dataset(path, engine="h5netcdf")`` or ``engine="zarr"`` gives: the
dimension names (NetCDF4 dimension scales, Zarr's ``dimension_names`` or
``_ARRAY_DIMENSIONS``), the attributes, the coordinates, the fill values.
The numbers come from daskstream: each variable is opened as :func:`daskstream.open`
opens it, with chunks aligned to its storage and sized to the memory budget,
read without HDF5's global lock where daskstream decodes the filters itself.
Then xarray's decoders (``xarray.decode_cf``) apply ``scale_factor``,
``add_offset``, ``_FillValue`` and time units, lazily, chunk by chunk.

A variable daskstream does not read (a type numpy has no equivalent of, say)
keeps the reader xarray would have used, so no variable is lost; so do
variable-length strings, which xarray holds as Python strings.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from daskstream.errors import (
    InvalidArgumentError,
)
from daskstream.graph.reads import ChunksSpec
from daskstream.labelled.calendar import check_names
from daskstream.labelled.family import open_family
from daskstream.labelled.variables import (
    DECODERS,
    decoded,
    labelled_variables,
    planned_data,
    xarray_module,
)
from daskstream.planning.settings import PlanSettings
from daskstream.runtime.resources import resolve_settings
from daskstream.sources import Source
from daskstream.sources.many import expand_paths, names_many


def open_dataset(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    group: str | None = None,
    memory_budget: int | str | None = None,
    chunks: ChunksSpec = "auto",
    decode_cf: bool = True,
    drop_variables: str | Iterable[str] | None = None,
    concat_dim: str | None = None,
    storage_options: dict[str, Any] | None = None,
    **decoders: Any,
) -> Any:
    """Open a NetCDF4/HDF5 file or Zarr store as an ``xarray.Dataset`` planned by daskstream.

    Parameters
    ----------
    path
        A NetCDF4 or HDF5 file, a Zarr store (a folder or a URL), or a
        ``.npy`` file (one variable named after the file, axes ``dim_0``...).
        A list of them, or a pattern (``"runs/day-*.nc"``, in natural order),
        opens many and combines them as ``xarray.open_mfdataset`` does: by
        their coordinates, or along ``concat_dim`` when given. Variables
        without the joined dimension are taken from the first file, and
        attributes that differ between files are dropped. Local NetCDF4/HDF5
        files of one family (joined along one dimension) open at the cost of
        one: the first file in full; of each other, in one low-level read of
        its header, its dimension coordinates (values and attributes: those
        along the joined dimension decoded with the file's own units, the
        others compared with the first file's), the shape, dtype and
        attributes of its variables along the joined dimension, and its
        attributes. Each other file's variable is opened in full at its first
        read and checked against what was read at open (shape, dtype,
        dimension names). Other files are each opened in full and combined
        by xarray (:mod:`daskstream.labelled.family` says which).
    group
        The HDF5 or Zarr group whose variables to open (default: the root).
    memory_budget
        Bytes one worker may use: each variable's chunks are planned for it.
    chunks
        As for :func:`daskstream.open`, for every variable: ``"auto"`` (the
        planner's choice, aligned to storage), ``"storage"``, ``"tune"``, or
        by dimension name as xarray takes them (``{"time": 365}``; a variable
        without that dimension keeps its planned chunks). With ``"auto"``,
        chunks along a time coordinate hold whole years where a year fits the
        budget, else whole months, so groupby, resample and rolling along time
        find whole periods in a task.
    decode_cf
        Decode as xarray does (``scale_factor``/``add_offset``, ``_FillValue``
        to NaN, times to datetimes, the ``coordinates`` attribute); ``False``
        gives the numbers as stored.
    drop_variables
        Variables to leave out.
    concat_dim
        For many files: the dimension to join them along (default: combine
        by coordinates).
    storage_options
        fsspec options for a URL (a Zarr store or a NetCDF4/HDF5 object on
        an object store): endpoint, credentials...
    **decoders
        xarray's finer switches, each defaulting to ``decode_cf``:
        ``mask_and_scale``, ``decode_times``, ``concat_characters``,
        ``decode_coords``, ``decode_timedelta``; and ``use_cftime``.

    Returns
    -------
    xarray.Dataset
        Attributes, dimension names and coordinates as the file has them;
        each variable a dask array with daskstream's chunks (its
        ``encoding["preferred_chunks"]`` says them too); dimension
        coordinates up to 64 MiB loaded.

    Raises
    ------
    MissingDependencyError
        Without xarray (``pip install 'daskstream[xarray]'``; NetCDF4/HDF5
        files also need h5netcdf, which that extra installs).
    FileFamilyError
        For many files: naming a file whose variable along the joined
        dimension has another shape elsewhere (at open), or whose full
        metadata differs from what its header said (at its first read).

    Examples
    --------
    >>> import numpy as np, tempfile, os, xarray as xr
    >>> path = os.path.join(tempfile.mkdtemp(), "t.zarr")
    >>> xr.Dataset({"t": ("time", np.arange(4.0), {"units": "K"})}, coords={"time": [10, 20, 30, 40]}).to_zarr(
    ...     path, consolidated=False
    ... )
    <xarray.backends.zarr.ZarrStore object at ...>
    >>> ds = open_dataset(path)
    >>> ds.t.attrs["units"], float(ds.t.sel(time=30))
    ('K', 2.0)
    """
    xr = xarray_module()
    unknown = set(decoders) - {*DECODERS, "use_cftime"}
    if unknown:
        raise InvalidArgumentError(
            f"open_dataset takes no option {sorted(unknown)[0]!r}; its decoding switches are "
            f"{', '.join(DECODERS)} and use_cftime"
        )
    options = {name: decoders.get(name, decode_cf) for name in DECODERS}
    options["use_cftime"] = decoders.get("use_cftime")
    settings = resolve_settings(memory_budget=memory_budget)
    # The reads that time chunks="tune"'s candidates are planned as any array opened here (see daskstream.tune).
    tunes = isinstance(chunks, str) and chunks == "tune"
    sampling = resolve_settings() if memory_budget is not None and tunes else settings
    opened: dict[str, Any] = {
        "group": group, "storage_options": storage_options, "chunks": chunks, "settings": settings,
        "sampling": sampling, "drop_variables": drop_variables, "options": options,
    }  # fmt: skip
    if names_many(path):
        paths = expand_paths(path, storage_options)  # type: ignore[arg-type]
        family = open_family(
            xr, paths, group=group, settings=settings, sampling=sampling, chunks=chunks,
            drop_variables=drop_variables, concat_dim=concat_dim, options=options,
        )  # fmt: skip
        if family is not None:
            return family
        datasets = [_opened(xr, one, **opened) for one in paths]
        # Only what varies along the joined dimension is joined; the rest is taken from the first file
        # (the stations of a time series are not repeated per day), and coordinates must agree exactly.
        combine = {"data_vars": "minimal", "coords": "minimal", "compat": "override", "join": "exact",
                   "combine_attrs": "drop_conflicts"}  # fmt: skip
        if concat_dim is not None:
            return xr.combine_nested(datasets, concat_dim=concat_dim, **combine)
        return xr.combine_by_coords(datasets, **combine)
    return _opened(xr, path, **opened)


def _opened(
    xr: Any, path: Any, *, group: str | None, storage_options: dict[str, Any] | None, chunks: ChunksSpec,
    settings: PlanSettings, sampling: PlanSettings, drop_variables: str | Iterable[str] | None,
    options: dict[str, Any],
) -> Any:  # fmt: skip
    """One file or store as a Dataset: its variables planned within ``settings`` (``sampling``: as for
    :func:`daskstream.opening.as_dask_array`), decoded by xarray's switches ``options``."""

    def data_of(
        source: Source, coordinate: bool, dims: tuple[str, ...], periods: Mapping[str, tuple[tuple[int, ...], ...]]
    ) -> tuple[Any, tuple[tuple[int, ...], ...]]:
        return planned_data(source, chunks, settings, eager=coordinate, sampling=sampling, dims=dims, periods=periods)

    variables, attrs, close = labelled_variables(path, group=group, storage_options=storage_options, data_of=data_of)
    check_names(chunks, {dim for variable in variables.values() for dim in variable.dims}, str(path))
    dataset = decoded(xr, variables, attrs, where=str(path), drop_variables=drop_variables, **options)
    dataset.set_close(close)
    return dataset
