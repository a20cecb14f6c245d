"""What a file says about its array beside the numbers: attributes and dimension names.

HDF5 keeps attributes on the dataset and names dimensions by labels or by the
dimension scales attached to each axis (as NetCDF4 files do); Zarr keeps
attributes in its metadata and names dimensions in ``dimension_names``
(format 3) or the ``_ARRAY_DIMENSIONS`` attribute xarray writes (format 2).
Both are read here into plain values: strings decoded, numpy scalars as
Python scalars, arrays as numpy arrays. The attributes that only encode the
dimension bookkeeping itself are left out, as are daskstream's own store
records.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from typing import Any

import numpy as np

# HDF5 attributes that encode dimension scales (HDF5's and NetCDF4's bookkeeping), not the data.
_HDF5_BOOKKEEPING = frozenset(
    {
        "DIMENSION_LIST",
        "DIMENSION_LABELS",
        "REFERENCE_LIST",
        "CLASS",
        "NAME",
        "_Netcdf4Dimid",
        "_Netcdf4Coordinates",
        "_nc3_strict",
    }
)
# The attribute xarray writes dimension names to in Zarr format 2.
ZARR_V2_DIMENSIONS = "_ARRAY_DIMENSIONS"
# Attributes of daskstream's own store records (see daskstream.compute.store.record).
_OWN_PREFIX = "daskstream_store"


def plain(value: Any) -> Any:
    """``value`` as a plain Python or numpy value: bytes decoded, numpy scalars as Python ones.

    >>> plain(b"metres"), plain(np.float32(1.5)), plain(np.array([b"a", b"b"])).tolist()
    ('metres', 1.5, ['a', 'b'])
    """
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "S":
            return np.char.decode(value, "utf-8", errors="replace")
        if value.dtype.kind == "O":
            return np.array([plain(v) for v in value.ravel()], dtype=object).reshape(value.shape)
    return value


def plain_scalar(value: Any) -> Any:
    """A one-element attribute (HDF5 stores them as arrays) as its single value.

    >>> plain_scalar(np.array([0.01])), plain_scalar(np.array([1, 2])).tolist()
    (0.01, [1, 2])
    """
    if isinstance(value, np.ndarray | np.generic) and np.size(value) == 1:
        return plain(np.asarray(value).reshape(()).item())
    return value


def json_ready(value: Any) -> Any:
    """``value`` as JSON holds it (Zarr attributes): arrays as lists, numpy scalars as Python ones.

    >>> json_ready({"scale": np.float64(0.5), "range": np.array([0, 10])})
    {'scale': 0.5, 'range': [0, 10]}
    """
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    return plain(value)


def hdf5_ready(value: Any) -> Any:
    """``value`` as an HDF5 attribute holds it: numbers, strings and arrays of them as they are (text
    arrays as variable-length UTF-8), anything else (mappings, mixed lists, None, as Zarr's JSON
    attributes may hold) as its JSON text.

    >>> hdf5_ready([1, 2]).tolist(), hdf5_ready({"a": 1}), hdf5_ready("K"), hdf5_ready([1, "K"])
    ([1, 2], '{"a": 1}', 'K', '[1, "K"]')
    """
    if isinstance(value, (list, tuple)):
        array = exact_array(value)
        if array is not None and array.dtype.kind in "biufcU" and array.size:
            return hdf5_ready(array)
    elif isinstance(value, np.ndarray) and value.dtype.kind == "U":
        import h5py

        # HDF5 has no fixed-width UTF-32 strings: text as h5py writes a str, variable-length UTF-8.
        return value.astype(h5py.string_dtype())
    elif isinstance(value, (str, int, float, complex, np.generic, np.ndarray)) and not isinstance(value, bool):
        return value
    elif isinstance(value, bool):
        return np.bool_(value)
    return json.dumps(json_ready(value))


def exact_array(value: Any) -> np.ndarray | None:
    """The array numpy makes of ``value`` (a list, a tuple, or the list of an object array), if it holds every
    item as it is (equal, or both NaN); ``None`` if numpy would change one or makes no array of it.

    numpy makes text of ``[1, "K"]`` and floats of ``[2**63 + 1, -1]``; xarray compares an attribute with the
    list read back in its place through the array numpy makes of that list.

    >>> exact_array([1, 2]).tolist(), exact_array([1, "K"]), exact_array([2**63 + 1, -1]), exact_array([[1], []])
    ([1, 2], None, None, None)
    """
    try:
        array = np.asarray(value.tolist() if isinstance(value, np.ndarray) else value)
        items = np.asarray(value, dtype=object)
        if array.shape != items.shape:
            return None
        pairs = zip(array.ravel().tolist(), items.ravel().tolist())
        return array if all(bool(a == b) or (a != a and b != b) for a, b in pairs) else None  # (x != x: NaN)
    except (ValueError, TypeError, OverflowError):  # ragged, or items that compare as arrays
        return None


def hdf5_keeps(key: str) -> bool:
    """Whether an HDF5 attribute named ``key`` is read back as one: not dimension bookkeeping or a store record.

    >>> hdf5_keeps("units"), hdf5_keeps("DIMENSION_LIST")
    (True, False)
    """
    return key not in _HDF5_BOOKKEEPING and not key.startswith(_OWN_PREFIX)


def hdf5_attrs(dset: Any) -> dict[str, Any]:
    """The dataset's attributes, those encoding dimension scales and store records left out."""
    found: dict[str, Any] = {}
    for key in dset.attrs:
        if not hdf5_keeps(key):
            continue
        # An attribute h5py cannot turn into numpy (references, unusual types) is not carried.
        with contextlib.suppress(OSError, TypeError, ValueError, KeyError):
            found[key] = plain(dset.attrs[key])
    return found


def hdf5_dims(dset: Any, ndim: int) -> tuple[str | None, ...] | None:
    """Each axis's name: its dimension label, else the name of the first dimension scale attached to it.

    ``ndim`` may exceed the dataset's rank (array element axes, unnamed).
    ``None`` when no axis has a name.
    """
    names: list[str | None] = []
    try:
        for axis in dset.dims:
            name = axis.label or None
            if name is None and len(axis):
                name = posixpath.basename(axis[0].name) or None
            names.append(name)
    except (OSError, RuntimeError, TypeError, ValueError, KeyError):
        return None
    names += [None] * (ndim - len(names))
    return tuple(names) if any(names) else None


def hdf5_scales(dset: Any) -> tuple[str | None, ...] | None:
    """Per axis, the path of the first dimension scale attached to it that labels it element by element
    (one-dimensional, as long as the axis); ``None`` when no axis has one."""
    paths: list[str | None] = []
    try:
        for length, axis in zip(dset.shape, dset.dims):
            scale = axis[0] if len(axis) else None
            if scale is not None and scale.shape == (length,) and scale.dtype.kind in "biufcSUMm":
                paths.append(scale.name)
            else:
                paths.append(None)
    except (OSError, RuntimeError, TypeError, ValueError, KeyError):
        return None
    return tuple(paths) if any(paths) else None


def zarr_attrs(array: Any) -> dict[str, Any]:
    """The array's attributes, the format 2 dimension names and store records left out."""
    attrs = dict(array.attrs.asdict())
    return {
        key: plain(value)
        for key, value in attrs.items()
        if key != ZARR_V2_DIMENSIONS and not key.startswith(_OWN_PREFIX)
    }


def zarr_dims(array: Any) -> tuple[str | None, ...] | None:
    """Format 3 ``dimension_names``, or format 2's ``_ARRAY_DIMENSIONS`` attribute; ``None`` if neither."""
    names = getattr(array.metadata, "dimension_names", None)
    if names is None:
        names = array.attrs.get(ZARR_V2_DIMENSIONS)
    if not isinstance(names, (list, tuple)) or len(names) != array.ndim:
        return None
    found = tuple(str(n) if n is not None else None for n in names)
    return found if any(found) else None


# The CF attributes that change what the stored numbers mean: packing, and values that mark missing data.
CF_ENCODING_ATTRIBUTES = ("scale_factor", "add_offset", "_FillValue", "missing_value")


def cf_encoding(attrs: Any, dtype: np.dtype) -> dict[str, Any]:
    """The CF packing and missing-value attributes in ``attrs`` that make stored numbers mean something else.

    A NaN fill value of floating-point data is left out: the stored NaN already
    says "missing".

    >>> cf_encoding({"scale_factor": 0.01, "units": "K", "_FillValue": -32767}, np.dtype("i2"))
    {'scale_factor': 0.01, '_FillValue': -32767}
    >>> cf_encoding({"_FillValue": float("nan")}, np.dtype("f4"))
    {}
    """
    found = {}
    for name in CF_ENCODING_ATTRIBUTES:
        if name not in attrs:
            continue
        value = attrs[name]
        if name in ("_FillValue", "missing_value") and dtype.kind == "f":
            with contextlib.suppress(TypeError, ValueError):
                if np.all(np.isnan(np.asarray(value, dtype="f8"))):
                    continue
        found[name] = value
    return found
