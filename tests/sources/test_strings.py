"""Variable-length strings: read as numpy's StringDType, equal to h5py's and zarr's reads; refused where not text.

They are the metadata of most real files (NWB, AnnData, NeXus): names, units,
descriptions. Reading them must not cost the memory budget its promise, and
the reductions of numbers must refuse them by name.
"""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import CorruptSourceError, UnsupportedDtypeError

needs_string_dtype = pytest.mark.skipif(not hasattr(np.dtypes, "StringDType"), reason="numpy 1 has no StringDType")

WORDS = np.array(["", "a", "température", "日本語のテキスト", "x" * 300, "ends with space "], dtype=object)


def _words(shape: tuple[int, ...]) -> np.ndarray:
    return np.resize(WORDS, shape)


def write_hdf5_strings(path, values, *, encoding="utf-8", **options):
    with h5py.File(path, "w") as f:
        f.create_dataset("text", data=values, dtype=h5py.string_dtype(encoding), **options)
    return f"{path}::/text"


def h5py_text(path, name="text") -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[name].asstr()[()]


@needs_string_dtype
@pytest.mark.parametrize(
    "options",
    [{}, {"chunks": (7, 4)}, {"chunks": (5, 20), "maxshape": (None, None)}],
    ids=["contiguous", "chunked", "chunked-resizable"],
)
def test_hdf5_strings_read_as_h5py_reads_them(tmp_path, options):
    values = _words((20, 9))
    name = write_hdf5_strings(tmp_path / "t.h5", values, **options)
    x = ds.open(name)
    assert x.dtype == np.dtypes.StringDType()
    got = x.compute()
    np.testing.assert_array_equal(got, h5py_text(tmp_path / "t.h5"))
    np.testing.assert_array_equal(x[3:11, 2:7].compute(), got[3:11, 2:7])
    # Element-wise work on text is numpy's: comparisons, counting.
    assert int((x == "température").sum().compute()) == int((got == "température").sum())
    assert int(ds.reduce(x, "count_nonzero").compute()) == np.count_nonzero(got)


@needs_string_dtype
def test_unwritten_strings_read_as_empty_strings(tmp_path):
    path = tmp_path / "sparse.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("text", shape=(12,), chunks=(4,), dtype=h5py.string_dtype())
        d[4:8] = ["e", "f", "g", "h"]
    np.testing.assert_array_equal(ds.open(f"{path}::/text").compute(), ["", "", "", "", "e", "f", "g", "h", *[""] * 4])


@needs_string_dtype
def test_strings_marked_ascii_holding_utf8_are_decoded_as_utf8(tmp_path):
    # h5py writes bytes as ASCII-marked strings whatever they hold; many files carry UTF-8 so.
    path = tmp_path / "ascii.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "text", data=np.array([b"plain", "naïve".encode()], dtype=object), dtype=h5py.string_dtype("ascii")
        )
    np.testing.assert_array_equal(ds.open(f"{path}::/text").compute(), ["plain", "naïve"])


@needs_string_dtype
def test_strings_that_are_not_utf8_are_refused_by_name(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        early = f.create_dataset("early", shape=(3,), dtype=h5py.string_dtype())
        early[0] = b"\xff\xfe"
        late = f.create_dataset("late", shape=(5000,), chunks=(1000,), dtype=h5py.string_dtype())
        late[4999] = b"caf\xe9"  # Latin-1, past the strings looked at when opened
    with pytest.raises(CorruptSourceError, match=r"bad.h5::/early: holds strings that are not valid UTF-8"):
        ds.open(f"{path}::/early")
    late_text = ds.open(f"{path}::/late")
    with pytest.raises(CorruptSourceError, match=r"bad.h5::/late: holds strings that are not valid UTF-8"):
        late_text.compute()


@needs_string_dtype
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_strings_read_as_zarr_reads_them(tmp_path, zarr_format):
    path = str(tmp_path / "text.zarr")
    values = _words((15, 4)).astype("T")
    array = zarr.create_array(path, shape=values.shape, chunks=(4, 3), dtype=str, zarr_format=zarr_format)
    array[...] = values
    x = ds.open(path)
    assert x.dtype == np.dtypes.StringDType()
    np.testing.assert_array_equal(x.compute(), zarr.open_array(path, mode="r")[...])
    np.testing.assert_array_equal(x[5:9].compute(), values[5:9])


@needs_string_dtype
def test_reductions_of_numbers_refuse_strings_by_name(tmp_path):
    x = ds.open(write_hdf5_strings(tmp_path / "t.h5", _words((30,)), chunks=(10,)))
    for op in ("sum", "mean", "max", "std", "median"):
        with pytest.raises(UnsupportedDtypeError, match=rf"{op} of strings \(dtype StringDType\(\)\) is not defined"):
            ds.reduce(x, op)
    with pytest.raises(UnsupportedDtypeError, match=r"describe needs numbers \(integer, float or complex\)"):
        ds.describe(x)
    with pytest.raises(UnsupportedDtypeError, match=r"variable-length strings .* read by daskstream, not stored"):
        ds.store(x, tmp_path / "out.zarr")


@needs_string_dtype
def test_blocks_of_long_strings_are_planned_for_what_they_hold(tmp_path):
    # A block of 2 kB strings holds ~250x what its 16-byte slots say: the budget must count the strings.
    short = write_hdf5_strings(tmp_path / "short.h5", np.array(["ab"] * 40_000, dtype=object), chunks=(500,))
    long = write_hdf5_strings(tmp_path / "long.h5", np.array(["ab" * 1000] * 40_000, dtype=object), chunks=(500,))
    budget = "8MiB"
    short_plan = ds.plan(short, memory_budget=budget, threads=1)
    long_plan = ds.plan(long, memory_budget=budget, threads=1)
    assert long_plan.working_set_factor > 100 * short_plan.working_set_factor / 3
    # Each task's strings (about 4 kB apiece while read) fit the budget.
    assert max(long_plan.chunks) * (4000 + 80) <= 8 * 2**20
    assert max(short_plan.chunks) > max(long_plan.chunks)


@needs_string_dtype
def test_the_cli_shows_strings_and_refuses_their_sums(tmp_path):
    name = write_hdf5_strings(tmp_path / "t.h5", _words((12,)))
    with h5py.File(tmp_path / "t.h5", "a") as f:
        f["numbers"] = np.arange(3)
    shown = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", name, "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(shown.stdout)["dtype"] == "StringDType()"
    listed = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", str(tmp_path / "t.h5")], capture_output=True, text=True
    )
    assert "string (variable length, utf-8)" in listed.stdout
    summed = subprocess.run(
        [sys.executable, "-m", "daskstream", "reduce", name, "--op", "sum"], capture_output=True, text=True
    )
    assert summed.returncode == 2
    assert summed.stderr.count("\n") == 1
    assert "sum of strings" in summed.stderr


@pytest.mark.skipif(hasattr(np.dtypes, "StringDType"), reason="numpy 2 reads variable-length strings")
def test_strings_under_numpy_1_are_refused_naming_the_upgrade(tmp_path):
    name = write_hdf5_strings(tmp_path / "t.h5", _words((4,)))
    with pytest.raises(UnsupportedDtypeError, match=r"numpy>=2"):
        ds.open(name)
