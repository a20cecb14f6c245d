"""HDF5 types in words, and as numpy reads them: what a dataset's dtype is, or why numpy has none for it.

h5py's dtype hides what variable-length strings, references and vlen data are
in numpy's repr, and raises for types numpy has no equivalent of (times,
quadruple precision); the words here say which, for errors and listings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskstream.errors import UnsupportedDtypeError


def readable_dtype(name: str, dset: Any, h5py: Any) -> np.dtype:
    """The dataset's dtype as h5py reads it, or :class:`UnsupportedDtypeError` for a type numpy has no equivalent of."""
    try:
        return dset.dtype
    except (TypeError, ValueError):  # h5py's words for H5T_TIME, quad precision and the like
        raise UnsupportedDtypeError(
            f"{name}: its HDF5 type is {unreadable_type_text(dset.id.get_type(), h5py)}, which numpy has no "
            "equivalent of, so neither h5py nor daskstream can read it; convert the dataset to a numpy type "
            "with the program that wrote it"
        ) from None


def unreadable_type_text(file_type: Any, h5py: Any) -> str:
    """Words for an HDF5 type numpy cannot hold: ``'a 128-bit float'``, ``'a time type (H5T_TIME)'``..."""
    type_class = file_type.get_class()
    bits = 8 * file_type.get_size()
    if type_class == h5py.h5t.FLOAT:
        return f"a {bits}-bit float" + (" (quadruple precision)" if bits == 128 else "")
    if type_class == h5py.h5t.INTEGER:
        return f"a {bits}-bit integer"
    names = {h5py.h5t.TIME: "a time type (H5T_TIME)", h5py.h5t.BITFIELD: "a bit field (H5T_BITFIELD)"}
    return names.get(type_class, f"an HDF5 type of class {type_class}")


def hdf5_type_text(dtype: np.dtype, h5py: Any) -> str:
    """What h5py's ``dtype`` of a dataset stands for, in words where numpy's repr hides it (strings, references)."""
    string = h5py.check_string_dtype(dtype)
    if string is not None:
        return f"string ({'variable length' if string.length is None else f'{string.length} bytes'}, {string.encoding})"
    if h5py.check_vlen_dtype(dtype) is not None:
        return f"variable-length {h5py.check_vlen_dtype(dtype)}"
    if dtype.hasobject:
        return "references"
    return str(dtype)
