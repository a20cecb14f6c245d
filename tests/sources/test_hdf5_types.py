"""HDF5 datasets as other programs write them: fill values undefined or never written, types numpy lacks.

h5py cannot write these through its high-level API, so the files are made
with HDF5's own functions, called on the library h5py has loaded (the one
whose identifiers h5py's objects hold).
"""

from __future__ import annotations

import ctypes

import h5py
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import UnsupportedDtypeError

HID = ctypes.c_int64


def loaded_hdf5() -> ctypes.CDLL | None:
    """The HDF5 library this process loaded for h5py (found in the process's memory map), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libhdf5" in line and "hl" not in line.rsplit("/", 1)[-1]}
    except OSError:
        return None
    paths = {p for p in paths if p.startswith("/")}
    if len(paths) != 1:
        return None
    library = ctypes.CDLL(paths.pop())
    library.H5Pset_fill_value.argtypes = [HID, HID, ctypes.c_void_p]
    library.H5Dcreate2.argtypes = [HID, ctypes.c_char_p, HID, HID, HID, HID, HID]
    library.H5Dcreate2.restype = HID
    library.H5Dwrite.argtypes = [HID, HID, HID, HID, HID, ctypes.c_void_p]
    library.H5Dclose.argtypes = [HID]
    library.H5Tcopy.argtypes = [HID]
    library.H5Tcopy.restype = HID
    return library


HDF5 = loaded_hdf5()
needs_hdf5_calls = pytest.mark.skipif(HDF5 is None, reason="the HDF5 library h5py loaded cannot be called here")


def chunked_dataset(f, name: str, dcpl, shape=(10,), dtype="f4"):
    file_type = h5py.h5t.py_create(np.dtype(dtype))
    return h5py.Dataset(h5py.h5d.create(f.id, name.encode(), file_type, h5py.h5s.create_simple(shape), dcpl=dcpl))


@needs_hdf5_calls
def test_an_undefined_fill_value_opens_and_unwritten_data_reads_as_h5py_reads_it(tmp_path):
    path = tmp_path / "undefined.h5"
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        float_type = h5py.h5t.py_create(np.dtype("f4"))  # held: its identifier closes with it
        HDF5.H5Pset_fill_value(dcpl.id, float_type.id, None)  # as a C program may
        assert dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_UNDEFINED
        chunked_dataset(f, "x", dcpl)[0:4] = np.arange(4)
        with pytest.raises(RuntimeError):
            _ = f["x"].fillvalue  # what made such files impossible to open
    x = ds.open(f"{path}::/x")
    with h5py.File(path, "r") as f:
        want = f["x"][()]
    for _ in range(3):  # HDF5 leaves the buffer as it was for unwritten chunks: never whatever memory held
        np.testing.assert_array_equal(x.compute(), want)
    assert ds.open_source(f"{path}::/x").fill_value == 0


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_fill_value_never_written_reads_as_h5py_reads_it(tmp_path, compression):
    # Fill time "never": HDF5 does not fill unwritten chunks, so h5py reads zeros, not the fill value.
    path = tmp_path / "never.h5"
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        if compression:
            dcpl.set_deflate(4)
        dcpl.set_fill_value(np.array(5, "f4"))
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        chunked_dataset(f, "x", dcpl)[0:4] = 1
    with h5py.File(path, "r") as f:
        want = f["x"][()]
    np.testing.assert_array_equal(want, [1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(ds.open(f"{path}::/x").compute(), want)


@needs_hdf5_calls
def test_a_time_type_is_refused_naming_it(tmp_path):
    path = tmp_path / "time.h5"
    with h5py.File(path, "w") as f:
        time_type = HDF5.H5Tcopy(HID.in_dll(HDF5, "H5T_UNIX_D32LE_g").value)
        space = h5py.h5s.create_simple((3,))  # held: its identifier closes with it
        dataset = HDF5.H5Dcreate2(f.id.id, b"stamps", time_type, space.id, 0, 0, 0)
        stamps = np.array([0, 86400, 10**9], "<i4")
        assert HDF5.H5Dwrite(dataset, time_type, 0, 0, 0, stamps.ctypes.data) >= 0
        HDF5.H5Dclose(dataset)
        f["plain"] = np.arange(3)
    with pytest.raises(UnsupportedDtypeError, match=r"time.h5::/stamps: its HDF5 type is a time type \(H5T_TIME\)"):
        ds.open(f"{path}::/stamps")
    assert "a time type (H5T_TIME) (not readable as numpy)" in str(ds.list(path))
    np.testing.assert_array_equal(ds.open(f"{path}::/plain").compute(), np.arange(3))  # the rest of the file reads


def test_quadruple_precision_is_refused_naming_it(tmp_path):
    path = tmp_path / "quad.h5"
    with h5py.File(path, "w") as f:
        quad = h5py.h5t.IEEE_F64LE.copy()
        quad.set_size(16)
        quad.set_precision(128)
        quad.set_fields(127, 112, 15, 0, 112)  # IEEE binary128: sign, 15-bit exponent, 112-bit mantissa
        quad.set_ebias(16383)
        h5py.h5d.create(f.id, b"q", quad, h5py.h5s.create_simple((2,)))
    with pytest.raises(UnsupportedDtypeError, match=r"quad.h5::/q: its HDF5 type is a 128-bit float"):
        ds.open(f"{path}::/q")
