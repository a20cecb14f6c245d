"""A DataArray or Dataset stored with its labels, so that xarray reads back what was stored.

Each variable's values are written by :func:`daskstream.compute.store.store`
(out of core, resumable, encoded in the tasks), with its dimension names and
attributes as xarray writes them to Zarr: ``dimension_names`` in format 3,
``_ARRAY_DIMENSIONS`` in format 2, the non-dimension coordinates it has in
its ``coordinates`` attribute; in format 2, which xarray reads fill values
of as missing, floats are filled with NaN and other arrays with no fill value,
as xarray makes them. Then the coordinates (and a Dataset's attributes) are
written by xarray itself, into the same group: they are small beside the
data, and xarray's own encoding of them (times, strings, CF attributes) is
what reads back. ``xr.open_zarr`` of the target then gives a Dataset whose
variables ``xr.testing.assert_identical`` finds identical to those stored.

An HDF5 target keeps a DataArray's dimension names (as dimension labels) and
attributes; its coordinates are not written there.

Labels that would not read back as they are, are refused before anything is
written (:func:`refuse_unstorable_labels`): names that Zarr reads as paths
(``"a/b"``) or as its own metadata, attributes that JSON does not hold or
gives back as something else (bytes come back as str), attributes that
xarray reads as CF encoding (``scale_factor``, time ``units``), and data
variables of dtype object, which daskstream stores only as fixed-width data.

xarray is never imported here: a DataArray exists only where xarray is loaded.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, said
from daskstream.compute.store.label_checks import is_dataset, refuse_unstorable_labels
from daskstream.compute.store.swap import swaps_together
from daskstream.compute.store.target import Carried, target_format
from daskstream.errors import InvalidArgumentError
from daskstream.sources.detect import split_dataset
from daskstream.sources.metadata import json_ready

#: The name xarray gives a DataArray without one when it stores it (``xr.open_dataarray`` takes it back off).
UNNAMED = "__xarray_dataarray_variable__"


def store_labelled(
    x: Any,
    target: str | os.PathLike[str],
    store_array: Callable[..., da.Array],
    *,
    dataset: str | None = None,
    zarr_format: int = 3,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Store the DataArray or Dataset ``x`` at ``target`` with its labels; the stored data read back by xarray.

    Parameters
    ----------
    x
        An ``xarray.DataArray`` (its name, else ``__xarray_dataarray_variable__``,
        names the array in the store unless ``target`` names one) or an
        ``xarray.Dataset`` (every data variable, into a store's root group).
    target
        A Zarr store (``"out.zarr"``, ``"out.zarr::t"``, a URL), or for a
        DataArray an HDF5 dataset (``"out.h5::/t"``).
    store_array
        Stores one dask array: :func:`daskstream.compute.store.store`.
    options
        As for ``store_array`` (``codec``, ``resume``, ``overwrite``...).

    Returns
    -------
    xarray.DataArray or xarray.Dataset
        What was stored, as ``xr.open_zarr`` reads it back (dask arrays in
        the stored chunks); for an HDF5 target, the dask array read back.

    Raises
    ------
    InvalidArgumentError
        Before anything is written, for a name or attribute that would not
        read back as it is (see :func:`refuse_unstorable_labels`).
    UnsupportedDtypeError
        Before anything is written, for a data variable of dtype object.
    """
    xarray = sys.modules["xarray"]  # x is one of its objects: it is loaded
    path, member = split_dataset(os.fspath(target), dataset)
    kind = target_format(path)
    if kind == "hdf5":
        if is_dataset(x):
            raise InvalidArgumentError(
                f"{path}: a Dataset is stored to a Zarr store (out.zarr), where its variables and coordinates "
                "are kept together; store its variables one by one to HDF5 datasets, or use xarray's to_netcdf"
            )
        refuse_unstorable_labels(x, {}, f"{path}::{member}" if member else path, zarr_format=None)
        carried = Carried(attrs=dict(x.attrs), dims=tuple(str(d) for d in x.dims))
        return store_array(_dask(x), target, dataset=dataset, carried=carried, **options)
    if zarr_format not in (2, 3):
        raise InvalidArgumentError(said(keyword("zarr_format", zarr_format), ": give 2 or 3"))
    if is_dataset(x):
        if member:
            raise InvalidArgumentError(
                f"{path}::{member}: a Dataset is stored into a store's root group; give the store alone ({path})"
            )
        named: dict[Hashable, Any] = dict(x.data_vars)
    else:
        named = {member.strip("/") if member else (x.name if x.name is not None else UNNAMED): x}
    refuse_unstorable_labels(x, named, path, zarr_format=zarr_format)
    # The coordinates' attributes (and the Dataset's) as JSON holds them, as the variables' are: xarray passes
    # numpy values inside a list on to zarr, which cannot write them. The copy's variables are its own to change.
    coords = x.coords.to_dataset().copy()
    for coord in coords.variables.values():
        coord.attrs = json_ready(dict(coord.attrs))
    coords.attrs = json_ready(dict(x.attrs)) if is_dataset(x) else {}
    variables = {str(name): variable for name, variable in named.items()}  # every name a str: refused otherwise
    # Variables replacing others are put in place together, once all are whole: one computed from another
    # variable of this store reads the old one, never its replacement.
    with swaps_together():
        for name, variable in variables.items():
            carried = _carried(variable, x.coords, zarr_format)
            store_array(
                _dask(variable),
                path,
                dataset=name,
                zarr_format=zarr_format,
                storage_options=storage_options,
                carried=carried,
                **options,
            )
    # The coordinates, by xarray, beside the variables (written again as they are on a resumed store); then
    # the group's metadata consolidated, as xarray leaves a store it writes, so xr.open_zarr reads it at once.
    where: dict[str, Any] = {"storage_options": storage_options} if storage_options else {}
    with warnings.catch_warnings():
        # zarr's notice that format 3 does not specify consolidated metadata yet: xarray consolidates all the same.
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        coords.to_zarr(path, mode="a", zarr_format=zarr_format, consolidated=True, **where)
    stored = xarray.open_zarr(path, zarr_format=zarr_format, consolidated=True, **where)
    if is_dataset(x):
        return stored
    (name,) = variables
    back = stored[name]
    return back.rename(None) if name == UNNAMED else back


def _dask(variable: Any) -> da.Array:
    data = variable.data
    return data if isinstance(data, da.Array) else da.from_array(np.asarray(data), chunks="auto")


def _carried(variable: Any, coords: Mapping[Hashable, Any], zarr_format: int) -> Carried:
    """A variable's dimension names and attributes as xarray writes them, and the fill value it reads back."""
    attrs = dict(variable.attrs)
    dims = tuple(str(d) for d in variable.dims)
    # Non-dimension coordinates along the variable's dimensions: named in its attribute, as xarray names them.
    along = [str(n) for n, c in coords.items() if n not in variable.dims and set(c.dims) <= set(variable.dims)]
    if along:
        attrs["coordinates"] = " ".join(sorted(along))
    if zarr_format == 3:
        return Carried(attrs=attrs, dims=dims)
    floating = np.dtype(variable.dtype).kind in "fc"
    return Carried(attrs=attrs, dims=dims, fill_value=np.nan if floating else None, no_fill=not floating)
