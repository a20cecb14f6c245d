"""Which labels of a DataArray or Dataset read back as they are stored: the rest is refused before a write.

Names that Zarr reads as paths (``"a/b"``) or as its own metadata, attributes
that JSON does not hold or gives back as something else (bytes come back as
str), attributes that xarray reads as CF encoding (``scale_factor``, time
``units``), and data variables of dtype object, which daskstream stores only
as fixed-width data. The guard lists what it knows to round-trip
(:data:`STORABLE_ATTRIBUTES`); anything else is refused with the reason.

xarray is never imported here: a DataArray exists only where xarray is loaded.
"""

from __future__ import annotations

import datetime
import sys
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from daskstream.errors import InvalidArgumentError, UnsupportedDtypeError, first_line, shown
from daskstream.sources.metadata import ZARR_V2_DIMENSIONS, exact_array, hdf5_keeps


def is_dataset(x: Any) -> bool:
    """Whether ``x`` is an ``xarray.Dataset``.

    >>> is_dataset([1, 2])
    False
    """
    xarray = sys.modules.get("xarray")
    return xarray is not None and isinstance(x, xarray.Dataset)


#: What an attribute may hold, as every refusal of one says: what Zarr's JSON attributes keep and xarray reads
#: back equal (``xr.testing.assert_identical``). An HDF5 target keeps complex numbers as well (and, as before,
#: dicts, None and mixed lists as their JSON text: see :func:`daskstream.sources.metadata.hdf5_ready`).
STORABLE_ATTRIBUTES = (
    "str (UTF-8 text), int, float, bool, None, numpy integer, bool and float (up to 64 bits) scalars, numpy "
    "arrays of those or of str, lists and tuples of all these, and dicts with str keys of str, int, float (not "
    "NaN), bool, None, lists and dicts"
)

# Zarr's own metadata documents in a group, by format: an array of that name would be written over one.
_ZARR_METADATA = {2: frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata"}), 3: frozenset({"zarr.json"})}
# Attributes xarray reads as its own bookkeeping: the names of a variable's coordinates (written here from the
# coordinates themselves) and, in format 2, the dimension names.
_ZARR_RESERVED = {2: ("coordinates", ZARR_V2_DIMENSIONS), 3: ("coordinates",)}

# Why bytes and times are refused, for a scalar and (formatted) for an array of them.
_BYTES = (
    "is {what}, which are read back as str, not as these bytes (Zarr's attributes are JSON text, and xarray "
    "itself refuses bytes): decode it if it is text ({decode}), else store it as a list of ints or as base64 text"
)
_TIMES = (
    "is {what}, for which attributes have no type: store it as ISO text ({text}), or as a number with its units "
    "in another attribute"
)


def refuse_unstorable_labels(x: Any, variables: Mapping[Hashable, Any], where: str, *, zarr_format: int | None) -> None:
    """Refuse, before anything is written, a label of ``x`` that would not read back as it is.

    Every name (of the data variables, coordinates and dimensions) and every
    attribute (of the Dataset, its variables and coordinates, to any depth)
    is checked against what is known to read back: for a Zarr target, as
    ``xr.open_zarr`` reads it; for an HDF5 target, as the DataArray's
    dimension labels and attributes are read back from the dataset.

    Parameters
    ----------
    x
        The ``xarray.DataArray`` or ``xarray.Dataset`` to store.
    variables
        The data variables written, by the names they are stored under (a
        DataArray's name, else :data:`UNNAMED`, or the member of the target
        it is stored at); not used for an HDF5 target, whose path names the
        dataset.
    where
        The target, to begin each message with.
    zarr_format
        2 or 3 for a Zarr store (the coordinates and the Dataset's
        attributes are stored too); ``None`` for an HDF5 target.

    Raises
    ------
    UnsupportedDtypeError
        For a data variable of dtype object: daskstream stores fixed-width data.
    InvalidArgumentError
        For the first name or attribute that would not read back as it is,
        named, with why and what to do instead.
    """
    hdf5 = zarr_format is None
    data = {None: x} if hdf5 else variables
    for name, variable in data.items():
        if np.dtype(variable.dtype).kind == "O":
            what = "the DataArray" if name is None else _described(x, name)
            raise UnsupportedDtypeError(
                f"{where}: {what} has dtype object (Python objects, such as text of any length), which daskstream "
                "stores only as fixed-width data: convert it first, e.g. .astype('U16') for text of up to 16 "
                "characters, or write it with xarray (to_zarr, to_netcdf), which stores variable-length text; "
                "nothing was written"
            )
    problem = _label_problem(x, variables, zarr_format)
    if problem is not None:
        raise InvalidArgumentError(f"{where}: {problem}; nothing was written")


def _label_problem(x: Any, variables: Mapping[Hashable, Any], zarr_format: int | None) -> str | None:
    """The first label of ``x`` that would not read back as it is, and why; ``None`` when all would."""
    hdf5 = zarr_format is None
    for dim in x.sizes:
        found = _name_problem(dim, node=False, zarr_format=zarr_format)
        if found is not None:
            return f"the dimension name {shown(dim)} {found}"
    # Whose attributes are stored: (who, attributes, name, the variable decoded with them, whether xarray encodes it).
    kept: list[tuple[str, Mapping[Any, Any], str, Any, bool]] = []
    if hdf5:
        kept.append(("the DataArray", x.attrs, "", None, False))
    else:
        for name, variable in variables.items():
            found = _name_problem(name, node=True, zarr_format=zarr_format)
            if found is not None:
                return f"the name of {_described(x, name)} {found}"
            if not is_dataset(x) and name in x.coords:
                return (
                    f"the DataArray's name {name!r} is also the name of one of its coordinates, which would be "
                    "written over it; "
                    "rename the DataArray (x.rename(...))"
                )
            kept.append((_described(x, name), variable.attrs, str(name), variable, False))
        for name, coord in x.coords.items():
            found = _name_problem(name, node=True, zarr_format=zarr_format)
            if found is None and name not in x.dims and name.split() != [name]:
                # Non-dimension coordinates are listed in a "coordinates" attribute, separated by whitespace.
                found = "holds whitespace, which splits it in the list of coordinates xarray reads; rename it"
            if found is not None:
                return f"the name of coordinate {name!r} {found}"
            kept.append((f"coordinate {name!r}", coord.attrs, str(name), coord, True))
        if is_dataset(x):
            kept.append(("the Dataset", x.attrs, "", None, False))
    for what, attrs, name, variable, encoded in kept:
        for key, value in attrs.items():
            found = _key_problem(key, hdf5=hdf5, zarr_format=zarr_format)
            if found is not None:
                return f"the attribute {shown(key)} of {what} {found}"
            inside = _attribute_problem(value, hdf5=hdf5)
            if inside is not None:
                at = f", at {inside[0]}," if inside[0] else ""
                return f"the attribute {key!r} of {what}{at} {inside[1]}"
        if variable is not None:
            found = _decoding_problem(name, variable, encoded=encoded)
            if found is not None:
                return f"{what} {found}"
    return None


def _described(x: Any, name: Hashable) -> str:
    return f"data variable {shown(name)}" if is_dataset(x) else f"the DataArray {shown(name)}"


def _text_problem(text: str, *, hdf5: bool) -> str | None:
    """Why ``text`` would not be stored as it is; ``None`` when it would.

    >>> _text_problem("K", hdf5=True) is None, _text_problem("a" + chr(0xDC80), hdf5=False)[:19]
    (True, 'is not valid text: ')
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return (
            "is not valid text: it holds an unpaired surrogate, which UTF-8 (Zarr's JSON, HDF5's strings) cannot "
            "encode; fix the text (a surrogate usually comes from decoding bytes with errors='surrogateescape')"
        )
    if hdf5 and "\x00" in text:
        return "holds a NUL character, which ends an HDF5 string; remove it"
    return None


def _name_problem(name: Hashable, *, node: bool, zarr_format: int | None) -> str | None:
    """Why ``name`` would not read back as the same name; ``None`` when it would.

    ``node``: the name is a Zarr array's, a path in the store, not only a
    dimension's (metadata, where any text is kept but where format 2 and
    HDF5 take an empty name for none). ``zarr_format`` is ``None`` for an
    HDF5 target.

    >>> _name_problem("a/b", node=False, zarr_format=3) is None, _name_problem("a/b", node=True, zarr_format=3)[:10]
    (True, "holds '/' ")
    """
    if not isinstance(name, str):
        return (
            f"is of type {type(name).__name__}, and names are stored as text: it would read back as {str(name)!r}; "
            "rename it with a str"
        )
    if not name and (node or zarr_format != 3):
        return "is empty, which names nothing there; give it a name"
    if "\x00" in name and (node or zarr_format is None):
        return "holds a NUL character, which no file name or HDF5 label can; rename it"
    found = _text_problem(name, hdf5=False)
    if found is not None or not node:
        return found
    if "/" in name or "\\" in name:
        return (
            "holds '/' or '\\', which Zarr reads as a group separator: the array would be stored in a group, where "
            "xr.open_zarr of the store does not find it; rename it without them"
        )
    if name in (".", ".."):
        return "is a path segment, which Zarr refuses as a name; rename it"
    if zarr_format is not None and name in _ZARR_METADATA[zarr_format]:
        return (
            f"is the name of Zarr's own metadata document (format {zarr_format}), which the array would replace; "
            "rename it"
        )
    return None


def _key_problem(key: Any, *, hdf5: bool, zarr_format: int | None) -> str | None:
    """Why an attribute named ``key`` would not read back under that name; ``None`` when it would."""
    if not isinstance(key, str):
        return (
            f"has a name of type {type(key).__name__}, and attribute names are text: it would read back as "
            f"{str(key)!r}; name it with a str"
        )
    if hdf5 and not key:
        return "has an empty name, which HDF5 refuses; name it"
    found = _text_problem(key, hdf5=hdf5)
    if found is not None:
        return found
    if hdf5 and not hdf5_keeps(key):
        return "is one that HDF5 dimension scales or daskstream's store records keep for themselves; rename it"
    if zarr_format is not None and key in _ZARR_RESERVED[zarr_format]:
        return (
            f"is one that xarray reads as its own bookkeeping in Zarr format {zarr_format} (the names of a "
            "variable's coordinates or dimensions), not as an attribute; rename it, or make the variables it names "
            "coordinates (assign_coords)"
        )
    return None


def _attribute_problem(value: Any, *, hdf5: bool, in_dict: bool = False, top: bool = True) -> tuple[str, str] | None:
    """Where inside the attribute ``value`` (``""``, ``"[2]['k']"``) and why it would not read back as it is;
    ``None`` when it would: when it is one of :data:`STORABLE_ATTRIBUTES`, checked to any depth.

    ``in_dict``: inside a dict, which xarray compares with ``==`` (so NaN, a
    tuple or a numpy array there never equals what is read back); ``top``:
    the attribute itself, not a part of it (HDF5 keeps a complex number there).

    >>> _attribute_problem([1, 2.5, "K", None], hdf5=False) is None
    True
    >>> _attribute_problem({"range": [0, bytes([255])]}, hdf5=False)[0]
    "['range'][1]"
    """
    if isinstance(value, bytes):  # np.bytes_ too
        return "", _BYTES.format(what="bytes", decode="value.decode()")
    if isinstance(value, str):
        found = _text_problem(value, hdf5=hdf5)
        return None if found is None else ("", found)
    if value is None or isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (np.datetime64, np.timedelta64, datetime.date, datetime.time, datetime.timedelta)):
        return "", _TIMES.format(what="a time", text="str(value)")  # before int: numpy's timedelta64 is one
    if isinstance(value, (int, np.integer)):
        if hdf5 and top and not -(2**63) <= int(value) < 2**64:
            return "", "is an int wider than 64 bits, which an HDF5 attribute does not hold; store it as a str"
        return None
    if isinstance(value, (float, np.floating)):
        if isinstance(value, np.floating) and value.dtype.itemsize > 8:
            return "", f"is a {value.dtype}, wider than the 64-bit floats JSON holds; convert it (float(value))"
        if in_dict and value != value:
            return "", (
                "is NaN inside a dict, which xarray compares with ==, where NaN never equals the NaN read back; "
                "use None there, or keep the value in an attribute of its own"
            )
        return None
    if isinstance(value, (complex, np.complexfloating)):
        if hdf5 and top:
            return None
        return "", "is complex, for which JSON has no number; store it as [real, imag]"
    if isinstance(value, np.ndarray):
        return _array_problem(value, hdf5=hdf5, in_dict=in_dict, top=top)
    if isinstance(value, (list, tuple)):
        if in_dict and isinstance(value, tuple):
            return (
                "",
                "is a tuple inside a dict: it reads back as a list, which == does not find equal there; give a list",
            )
        for index, item in enumerate(value):
            inside = _attribute_problem(item, hdf5=hdf5, in_dict=in_dict, top=False)
            if inside is not None:
                return f"[{index}]{inside[0]}", inside[1]
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (
                    "",
                    f"has the key {key!r}, and JSON keys are text: it would read back as {str(key)!r}; use str keys",
                )
            found = _text_problem(key, hdf5=hdf5)
            inside = ("", found) if found is not None else _attribute_problem(item, hdf5=hdf5, in_dict=True, top=False)
            if inside is not None:
                return f"[{key!r}]{inside[0]}", inside[1]
        return None
    return (
        "",
        f"is a {type(value).__name__}, which is none of what an attribute keeps: {STORABLE_ATTRIBUTES}; convert it "
        "to one of these",
    )


def _array_problem(value: np.ndarray, *, hdf5: bool, in_dict: bool, top: bool) -> tuple[str, str] | None:
    """As :func:`_attribute_problem`, for a numpy array."""
    kind = value.dtype.kind
    if in_dict:
        return (
            "",
            "is a numpy array inside a dict, which == cannot compare with the list read back; give a list "
            "(value.tolist())",
        )
    if kind in "biu" or (kind == "f" and value.dtype.itemsize <= 8) or (kind == "c" and hdf5 and top):
        return None
    if kind == "U":
        for index, text in np.ndenumerate(value):
            found = _text_problem(str(text), hdf5=hdf5)
            if found is not None:
                return f"[{', '.join(map(str, index))}]", found
        return None
    if kind == "S":
        return "", _BYTES.format(what="a numpy array of bytes", decode="np.char.decode(value)")
    if kind in "mM":
        return "", _TIMES.format(what="a numpy array of times", text="value.astype(str).tolist()")
    if kind == "O":
        if exact_array(value) is None:
            return (
                "",
                "is a numpy array of Python objects that numpy would not make again of the list read back (text and "
                "numbers mixed, say), which xarray compares it through; give a list (value.tolist())",
            )
        for position, item in enumerate(value.ravel().tolist()):
            inside = _attribute_problem(item, hdf5=hdf5, in_dict=in_dict, top=False)
            if inside is not None:
                return f"[{position}]{inside[0]}", inside[1]
        return None
    return (
        "",
        f"is a numpy array of dtype {value.dtype}, which an attribute does not keep as it is; convert it to one "
        f"of: {STORABLE_ATTRIBUTES}",
    )


def _decoding_problem(name: str, variable: Any, *, encoded: bool) -> str | None:
    """Why xarray would not read the attributes of ``variable`` back as attributes; ``None`` when it would.

    One element of the variable, as it is written (its values as they are for
    a data variable, which daskstream writes; CF-encoded by xarray for a
    coordinate, which xarray writes), is decoded by xarray's own decoder, as
    ``xr.open_zarr`` decodes it: the attributes it takes for encoding
    (``scale_factor``, ``_FillValue``, time ``units``...) are not read back
    as attributes, and the values read back are decoded with them.
    """
    xarray = sys.modules["xarray"]
    if encoded:
        sample = variable.variable[{dim: slice(0, 1) for dim in variable.dims}].compute()
    else:  # the values do not matter, only their dtype: no need to read any
        zeros = np.zeros(tuple(min(1, n) for n in variable.shape), dtype=variable.dtype)
        sample = xarray.Variable(variable.dims, zeros, dict(variable.attrs))
    with warnings.catch_warnings():
        # xarray's notes on the attributes it leaves alone: those read back as they are, which is all that counts.
        warnings.simplefilter("ignore")
        try:
            if encoded:
                sample = xarray.conventions.encode_cf_variable(sample, name=name)
            decoded = xarray.conventions.decode_cf_variable(name, sample)
        except (ValueError, TypeError, OverflowError) as exc:
            return (
                f"would not be written or read back by xarray with its attributes ({first_line(exc)}); remove or "
                "rename the attribute xarray names"
            )
    taken = [key for key in variable.attrs if key not in decoded.attrs]
    if not taken:
        return None
    many = len(taken) > 1
    return (
        f"has the attribute{'s' * many} {', '.join(map(repr, taken))}, which xarray reads as CF encoding rather than "
        f"as {'attributes' if many else 'an attribute'} (it decodes the values with {'them' if many else 'it'} and "
        f"keeps {'them' if many else 'it'} in .encoding); store the decoded values (xr.decode_cf), or rename "
        f"{'them' if many else 'it'}"
    )
