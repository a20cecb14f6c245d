"""Many files as one array: ds.open of a list or a pattern, against numpy's concatenate and stack."""

from __future__ import annotations

import itertools

import dask
import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import (
    DaskstreamError,
    FileFamilyError,
    InvalidAxisError,
    MemoryBudgetError,
    SourceNotFoundError,
)


def write_days(folder, count, rows=50, fmt="h5"):
    """Files day-1 ... day-<count>, each of ``rows`` rows of 8 float32, stored in chunks of 10 rows."""
    written = []
    for day in range(1, count + 1):
        values = (np.arange(rows * 8, dtype="f4") + 1000 * day).reshape(rows, 8)
        if fmt == "h5":
            path = folder / f"day-{day}.h5"
            with h5py.File(path, "w") as f:
                f.create_dataset("t", data=values, chunks=(10, 8), compression="gzip")
        else:
            path = folder / f"day-{day}.zarr"
            zarr.create_array(str(path), data=values, chunks=(10, 8))
        written.append(values)
    return written


def test_a_pattern_joins_the_files_in_natural_order_with_each_files_reads_aligned_to_its_storage(tmp_path):
    values = write_days(tmp_path, 11)
    x = ds.open(str(tmp_path / "day-*.h5::t"))
    np.testing.assert_array_equal(x.compute(), np.concatenate(values))  # day-2 before day-10
    # No task spans two files and every task holds whole storage chunks of its file.
    edges = list(itertools.accumulate(x.chunks[0]))
    assert set(range(50, 551, 50)) <= set(edges)
    assert all(edge % 10 == 0 for edge in edges)
    # The files share the parallelism a plan asks for instead of each asking for all of it.
    one = ds.open(str(tmp_path / "day-1.h5::t"))
    assert x.npartitions < 11 * one.npartitions


def test_many_files_of_more_blocks_than_a_computation_may_hold_open_and_compute_in_parts(tmp_path):
    values = [np.arange(50 * 16, dtype="f4").reshape(50, 16) + day for day in range(12)]
    for day, part in enumerate(values):
        with h5py.File(tmp_path / f"day-{day}.h5", "w") as f:
            f.create_dataset("t", data=part, chunks=(10, 8))
    with h5py.File(tmp_path / "whole.h5", "w") as f:
        f.create_dataset("t", data=np.concatenate(values), chunks=(10, 8))
    with dask.config.set({"daskstream.planning.max-tasks": 70}):
        x = ds.open(str(tmp_path / "day-*.h5::t"), chunks=(10, 8))  # 120 blocks, as one file of 600 rows
        alone = ds.open(tmp_path / "whole.h5", dataset="t", chunks=(10, 8))
        assert x.npartitions == alone.npartitions == 120
        np.testing.assert_array_equal(x[95:130].compute(), np.concatenate(values)[95:130])
        for array in (x, alone):  # many files as one file of as many blocks: the whole at once is refused
            with pytest.raises(MemoryBudgetError, match="max-tasks"):
                array.sum().compute()


def test_opening_many_files_reads_the_full_metadata_of_one_and_each_other_at_its_first_read(tmp_path, full_opens):
    values = write_days(tmp_path, 30)
    x = ds.open(str(tmp_path / "day-*.h5::t"))
    assert list(full_opens) == [str(tmp_path / "day-1.h5")]  # the others: their size and signature
    np.testing.assert_array_equal(x.compute(scheduler="sync"), np.concatenate(values))
    # Each file was opened in full at its first read, once, whatever number of its blocks were read.
    assert full_opens == {str(tmp_path / f"day-{day}.h5"): 1 for day in range(1, 31)}
    x.compute(scheduler="sync")
    assert sum(full_opens.values()) == 30


def test_a_file_of_the_same_size_but_another_shape_is_named_at_its_first_read(tmp_path):
    for day in (1, 2, 3):
        with h5py.File(tmp_path / f"day-{day}.h5", "w") as f:
            f["t"] = np.full((50, 8) if day != 2 else (100, 4), day, dtype="f4")
    assert len({(tmp_path / f"day-{day}.h5").stat().st_size for day in (1, 2, 3)}) == 1
    x = ds.open(str(tmp_path / "day-*.h5::t"))
    assert x.shape == (150, 8)  # as its size says, until it is read
    with pytest.raises(FileFamilyError, match=r"day-2.h5::/t: its shape is \(100, 4\), not \(50, 8\)") as caught:
        x.compute(scheduler="sync")
    assert "its full metadata, read now, differs" in str(caught.value)
    np.testing.assert_array_equal(x[:50].compute(), np.full((50, 8), 1, "f4"))  # the files that fit still read


def test_a_list_is_taken_in_its_order_and_files_of_different_lengths_join_along_the_axis(tmp_path):
    write_days(tmp_path, 2)
    np.save(tmp_path / "short.npy", np.full((7, 8), -1, dtype="f4"))
    x = ds.open([f"{tmp_path}/day-2.h5::t", str(tmp_path / "short.npy"), f"{tmp_path}/day-1.h5::t"])
    want = np.concatenate(
        [
            h5py.File(tmp_path / "day-2.h5")["t"][...],
            np.load(tmp_path / "short.npy"),
            h5py.File(tmp_path / "day-1.h5")["t"][...],
        ]
    )
    np.testing.assert_array_equal(x.compute(), want)
    assert float(ds.reduce(x, "sum").compute()) == pytest.approx(float(want.astype("f8").sum()))


def test_zarr_stores_join_along_a_later_axis_and_stack_along_a_new_one(tmp_path):
    values = write_days(tmp_path, 3, fmt="zarr")
    stores = [str(tmp_path / f"day-{day}.zarr") for day in (1, 2, 3)]
    np.testing.assert_array_equal(ds.open(stores, axis=1).compute(), np.concatenate(values, axis=1))
    stacked = ds.open(str(tmp_path / "day-?.zarr"), stack=True)
    assert stacked.shape == (3, 50, 8)
    np.testing.assert_array_equal(stacked.compute(), np.stack(values))
    np.testing.assert_array_equal(ds.open(stores, stack=True, axis=-1).compute(), np.stack(values, axis=-1))


@pytest.mark.parametrize(
    ("odd", "message"),
    [
        (np.zeros((50, 9), "f4"), r"its shape is \(50, 9\), not \(50, 8\) \(axis 1: 9, not 8\)"),
        (np.zeros((50, 8), "f8"), "its dtype is float64, not float32"),
        (np.zeros((50, 8, 1), "f4"), "it has 3 axes"),
    ],
)
def test_a_file_that_does_not_belong_is_named_with_what_differs(tmp_path, odd, message):
    write_days(tmp_path, 2)
    with h5py.File(tmp_path / "day-3.h5", "w") as f:
        f["t"] = odd
    with pytest.raises(FileFamilyError, match=message) as caught:
        ds.open(str(tmp_path / "day-*.h5"), dataset="t")
    assert "day-3.h5" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_stacking_needs_equal_shapes_and_axes_in_range(tmp_path):
    write_days(tmp_path, 1)
    with h5py.File(tmp_path / "day-2.h5", "w") as f:
        f["t"] = np.zeros((40, 8), "f4")
    pattern = str(tmp_path / "day-*.h5::t")
    assert ds.open(pattern).shape == (90, 8)
    with pytest.raises(FileFamilyError, match="cannot be stacked"):
        ds.open(pattern, stack=True)
    with pytest.raises(InvalidAxisError, match="axis 2 is out of range"):
        ds.open(pattern, axis=2)


def test_a_pattern_nothing_matches_and_an_empty_list_say_so(tmp_path):
    with pytest.raises(SourceNotFoundError, match="no file matches this pattern") as caught:
        ds.open(str(tmp_path / "run-*.h5"))
    assert isinstance(caught.value, FileNotFoundError)
    with pytest.raises(DaskstreamError, match="no files given"):
        ds.open([])


def test_the_command_line_reduces_many_files_given_as_a_pattern(tmp_path):
    import json
    import subprocess
    import sys

    values = write_days(tmp_path, 3)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "daskstream",
            "reduce",
            str(tmp_path / "day-*.h5::t"),
            "--op",
            "max",
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == float(np.concatenate(values).max())
