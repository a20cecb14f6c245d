"""Files nobody here wrote: the test and sample data installed packages ship, read exactly or refused clearly.

Every HDF5 dataset in them is opened and computed with daskstream and read
with h5py, the oracle: the two agree exactly, or daskstream refuses with a
DaskstreamError naming the file. NetCDF-3 and MATLAB 5 files are named for
what they are. No other exception, no wrong answer.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import warnings

import h5py
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import DaskstreamError, MatlabLayoutWarning
from daskstream.sources.detect import guess_format

# Packages whose wheels ship data files of these formats (among the test extras).
SHIPPING = ("h5py", "xarray", "scipy", "netCDF4", "h5netcdf", "tables", "pandas")
EXTENSIONS = ("h5", "hdf5", "hdf", "he5", "nc", "nc4", "mat", "nwb", "h5ad")


def installed_data_files() -> list[str]:
    found = []
    for package in SHIPPING:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for extension in EXTENSIONS:
                found += glob.glob(os.path.join(folder, "**", f"*.{extension}"), recursive=True)
    return sorted(found)


FILES = installed_data_files()


def _refusal(call, *args):
    """(the DaskstreamError ``call(*args)`` raised, None) or (None, its result); any other error fails the test."""
    try:
        return None, call(*args)
    except DaskstreamError as exc:
        return exc, None


def hdf5_datasets(path: str) -> list[str]:
    names: list[str] = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, node: names.append(name) if isinstance(node, h5py.Dataset) else None)
    return names


@pytest.mark.skipif(not FILES, reason="no installed package ships data files here")
@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.relpath(p, os.path.dirname(os.path.dirname(p))))
def test_each_installed_data_file_is_read_exactly_or_refused_by_name(path):
    refusal, fmt = _refusal(guess_format, path)
    if refusal is not None:
        assert path in str(refusal)
        with open(path, "rb") as f:
            if f.read(3) == b"CDF":
                assert "netCDF-3" in str(refusal)  # named for what it is, not "damaged"
        return
    if fmt != "hdf5":
        return
    for name in hdf5_datasets(path):
        with h5py.File(path, "r") as f:
            strings = _variable_length_strings(f[name])
            try:
                # Variable-length strings are read as text (UTF-8, of which ASCII is part), the rest as h5py reads it.
                want = np.asarray(f[name].asstr("utf-8")[()], dtype="T") if strings else f[name][()]
            except UnicodeDecodeError:
                want = None  # not the text the file says it is: refused, not guessed
            except (OSError, TypeError, ValueError):
                want = None  # h5py itself cannot read it: daskstream must refuse, not invent
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ds.errors.DaskstreamWarning)
            refusal, got = _refusal(lambda member: ds.open(path, dataset=member).compute(), name)
        if refusal is not None:
            assert os.path.basename(path) in str(refusal), str(refusal)
            # Text is read wherever numpy holds it (StringDType), unless it is not the UTF-8 it claims to be.
            assert not strings or want is None or not hasattr(np.dtypes, "StringDType"), str(refusal)
            continue
        assert want is not None, f"{path}::{name}: h5py cannot read it, daskstream returned data"
        want = np.asarray(want)
        assert got.shape == want.shape, name
        # Big-endian data is read into this machine's byte order, the same numbers.
        assert got.dtype == (want.dtype if strings else want.dtype.newbyteorder("=")), name
        if want.dtype.names:
            assert got.tobytes() == want.astype(got.dtype).tobytes(), name
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{path}::{name}")


def _variable_length_strings(dset) -> bool:
    try:
        string = h5py.check_string_dtype(dset.dtype)
    except (TypeError, ValueError):  # a type numpy has no equivalent of
        return False
    return string is not None and string.length is None


def test_the_scan_covers_files_of_each_kind():
    # What the scan above stands on: without these it would pass on nothing.
    kinds = {os.path.splitext(path)[1] for path in FILES}
    assert {".h5", ".nc", ".mat"} <= kinds, kinds
    assert sum(len(hdf5_datasets(p)) for p in FILES if p.endswith(".h5")) >= 5


def write_matlab_73(path, arrays):
    """A MATLAB 7.3 MAT-file as MATLAB writes one: HDF5 behind a 512-byte header, arrays column-major."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, (values, matlab_class) in arrays.items():
            f[name] = values.T  # column-major: HDF5 holds MATLAB's m-by-n array as n-by-m
            f[name].attrs["MATLAB_class"] = np.bytes_(matlab_class)
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Tue Dec  1 10:00:00 2026 HDF5 schema 1.00 ."
    with open(path, "r+b") as f:
        f.write(header.ljust(116) + b"\0" * 8 + b"\x00\x02" + b"IM")


def test_a_matlab_73_array_says_it_is_the_transpose_of_what_matlab_shows(tmp_path):
    path = tmp_path / "session.mat"
    matrix = np.arange(12.0).reshape(3, 4)  # as MATLAB shows it: 3x4
    write_matlab_73(path, {"A": (matrix, "double"), "label": (np.frombuffer(b"h\0i\0", "<u2")[None, :], "char")})
    with pytest.warns(
        MatlabLayoutWarning, match=r"shape \(4, 3\) is the transpose of the 3x4 array MATLAB shows"
    ) as seen:
        stored = ds.open(path, dataset="A")
    assert seen[0].filename == __file__
    np.testing.assert_array_equal(stored.T.compute(), matrix)  # the advice gives MATLAB's array
    with pytest.warns(MatlabLayoutWarning, match="char array, so its numbers are UTF-16 codes"):
        codes = ds.open(path, dataset="label").compute()
    assert "".join(map(chr, codes.ravel())) == "hi"
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["A"] = matrix
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.open(tmp_path / "plain.h5", dataset="A")  # an HDF5 file that is not MATLAB's: nothing said
