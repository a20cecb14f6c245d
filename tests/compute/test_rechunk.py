"""``rechunk``: any chunks from any chunks, within the budget, each stored chunk decoded once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import dask.array as da
import h5py
import numpy as np
import pytest
import zarr
from dask.callbacks import Callback

import daskstream as ds
from daskstream.compute.rechunk import rechunk_plan_of
from daskstream.compute.streaming.chains import Chains
from daskstream.errors import (
    IntermediateNotSharedError,
    InvalidChunksError,
    MemoryBudgetError,
    UnsupportedDtypeError,
)
from daskstream.graph.layers import read_layers
from daskstream.planning.grid import read_amplification


@pytest.fixture
def rows(tmp_path):
    """A 4 MiB float32 field stored in Zarr chunks of whole rows."""
    data = np.random.default_rng(4).standard_normal((1024, 1024)).astype("f4")
    array = zarr.create_array(tmp_path / "rows.zarr", shape=data.shape, chunks=(16, 1024), dtype="f4")
    array[...] = data
    return str(tmp_path / "rows.zarr"), data


def _intermediates(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith("daskstream-rechunk-")]


def test_rows_into_columns_go_through_an_intermediate_and_match_numpy(rows, tmp_path):
    path, data = rows
    x = ds.open(path, memory_budget="2MiB")
    y = ds.rechunk(x, (1024, 16), intermediate=tmp_path / "work")
    plan = rechunk_plan_of(y)
    assert plan.passes == 2
    assert y.chunks == ((1024,), (16,) * 64)
    # The source is read in boxes of whole storage chunks: each decoded once.
    ((_, source, _),) = [read for read in read_layers(y) if read[1].path == path]
    assert read_amplification(source.shape, source.storage_chunks, plan.read_chunks) == 1.0
    np.testing.assert_array_equal(y.compute(), data)
    assert len(_intermediates(tmp_path / "work")) == 1


def test_nested_chunks_take_one_pass_with_nothing_written(rows, tmp_path):
    path, data = rows
    with dask.config.set({"temporary-directory": str(tmp_path / "work")}):
        y = ds.rechunk(ds.open(path), (128, 256), memory_budget="256MiB")
        np.testing.assert_array_equal(y.compute(), data)
    assert rechunk_plan_of(y).passes == 1
    assert not (tmp_path / "work").exists() or not _intermediates(tmp_path / "work")


@pytest.mark.parametrize("budget", ["1MiB", "64MiB"])
def test_a_computed_array_is_computed_block_by_block_once(budget):
    data = np.arange(256 * 300, dtype="i8").reshape(256, 300)
    x = da.from_array(data, chunks=(8, 300)) * 3
    y = ds.rechunk(x, {1: 10, 0: -1}, memory_budget=budget)
    assert y.chunks == ((256,), (10,) * 30)
    np.testing.assert_array_equal(y.compute(), data * 3)


@pytest.mark.parametrize(
    "dtype",
    ["f8", ">i2", "?", "M8[s]", "c8", [("t", "<f4"), ("n", "u1")]],
    ids=["f8", "i2be", "bool", "M8", "c8", "record"],
)
def test_every_fixed_width_dtype_goes_through_the_intermediate_as_it_is(dtype):
    data = np.frombuffer(np.random.default_rng(6).bytes(30 * 20 * 6 * np.dtype(dtype).itemsize), dtype=dtype)
    data = data.reshape(30, 20, 6)
    if data.dtype.kind == "b":
        data = data.view("u1") % 2 == 1
    x = da.from_array(data, chunks=(1, 20, 6))
    y = ds.rechunk(x, (30, 3, 2), memory_budget=f"{40 * 6 * data.itemsize * 20}")
    assert rechunk_plan_of(y).passes == 2
    got = y.compute()
    assert got.dtype == data.dtype
    assert got.tobytes() == data.tobytes()  # bit for bit (records holding NaN compare unequal to themselves)


def test_a_contiguous_npy_is_read_straight_into_the_new_chunks(tmp_path):
    data = np.random.default_rng(2).integers(0, 100, (500, 64)).astype("u2")
    np.save(tmp_path / "a.npy", data)
    y = ds.rechunk(ds.open(tmp_path / "a.npy"), (500, 3), memory_budget="1MiB")
    assert rechunk_plan_of(y).passes == 1
    np.testing.assert_array_equal(y.compute(), data)


def test_the_fill_value_survives_the_intermediate(tmp_path):
    array = zarr.create_array(tmp_path / "f.zarr", shape=(64, 64), chunks=(4, 64), dtype="f8", fill_value=np.nan)
    array[8:16] = 1.5  # the rest is never written: it reads as NaN
    y = ds.rechunk(ds.open(tmp_path / "f.zarr"), (64, 4), memory_budget="64KiB", intermediate=tmp_path)
    assert rechunk_plan_of(y).passes == 2
    np.testing.assert_array_equal(y.compute(), array[...])


def test_a_store_of_a_rechunk_resumes_with_another_budget_and_removes_its_intermediate(rows, tmp_path):
    path, data = rows
    out = str(tmp_path / "cols.zarr")
    y = ds.rechunk(ds.open(path, memory_budget="2MiB"), (1024, 16), intermediate=tmp_path / "work")
    ds.store(y, out)
    assert _intermediates(tmp_path / "work") == []
    assert zarr.open_array(out).chunks == (1024, 16)
    np.testing.assert_array_equal(zarr.open_array(out)[...], data)
    # The same data in the same chunks under another budget (another plan) is the same computation.
    again = ds.rechunk(ds.open(path, memory_budget="64MiB"), (1024, 16))
    assert rechunk_plan_of(again).passes == 1
    assert again.name == y.name
    calls = []
    ds.store(again, out, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (64, 64)


class _CountFirstPass(Callback):
    def __init__(self):
        super().__init__()
        self.count = 0

    def _posttask(self, key, result, dsk, state, id):
        # A streaming task runs the chains of many blocks' writes: each counts.
        task = dsk.get(key)
        chains = next((arg for arg in getattr(task, "args", ()) if isinstance(arg, Chains)), None)
        keys = [key] if chains is None else [k for _, tasks in chains.chains for k in tasks]
        self.count += sum(isinstance(k, tuple) and k[0].startswith("daskstream-rechunk-write") for k in keys)


def test_an_hdf5_store_runs_the_first_pass_once_though_it_computes_in_batches(rows, tmp_path):
    path, data = rows
    y = ds.rechunk(ds.open(path, memory_budget="2MiB"), (1024, 16), intermediate=tmp_path / "work")
    counter = _CountFirstPass()
    with counter:
        ds.store(y, f"{tmp_path}/cols.h5::/x", memory_budget="2MiB")
    assert counter.count == len(y.dask.layers[next(n for n in y.dask.layers if "rechunk-write" in n)])
    ds.close_files()
    with h5py.File(tmp_path / "cols.h5", "r") as f:
        np.testing.assert_array_equal(f["x"][...], data)
    # The store removed the intermediate it was fed from; the lazy array still computes.
    assert _intermediates(tmp_path / "work") == []
    np.testing.assert_array_equal(y.compute(), data)


def test_a_second_pass_that_cannot_see_the_first_passs_chunks_says_the_folder_must_be_shared(rows, tmp_path):
    y = ds.rechunk(ds.open(rows[0], memory_budget="2MiB"), (1024, 16), intermediate=tmp_path / "work")
    graph = dict(y.__dask_graph__())
    written = {key: True for key in graph if isinstance(key, tuple) and key[0].startswith("daskstream-rechunk-write")}
    # As on a worker whose temporary folder is not the one pass 1 wrote to: nothing there.
    with pytest.raises(IntermediateNotSharedError, match="every worker shares"):
        dask.get({**graph, **written}, y.__dask_keys__()[0][0])


@pytest.mark.parametrize(("shape", "chunks"), [((0, 5), (1, 1)), ((3, 0, 4), (3, 1, 1)), ((), ())])
def test_empty_and_zero_dimensional_arrays_rechunk_to_themselves(shape, chunks):
    x = da.zeros(shape, chunks=2) if shape else da.from_array(np.array(5.0))
    y = ds.rechunk(x, chunks, memory_budget="1KiB")
    assert y.shape == x.shape
    np.testing.assert_array_equal(y.compute(), x.compute())


def test_python_objects_cannot_take_two_passes():
    x = da.from_array(np.array([["a"] * 64] * 64, dtype=object), chunks=(1, 64))
    with pytest.raises(UnsupportedDtypeError, match="Python objects"):
        ds.rechunk(x, (64, 1), memory_budget="4KiB")


@pytest.mark.parametrize(
    ("chunks", "error", "match"),
    [
        ((10,), InvalidChunksError, "2 axes"),
        ((0, 10), InvalidChunksError, "not a positive size"),
        ({5: 10}, InvalidChunksError, "out of range"),
        ((1024, 1024), MemoryBudgetError, "one target chunk"),
    ],
)
def test_chunks_that_cannot_be_made_are_refused_by_name(rows, chunks, error, match):
    with pytest.raises(error, match=match):
        ds.rechunk(ds.open(rows[0]), chunks, memory_budget="2MiB")


def test_convert_rows_into_columns_from_the_command_line(rows, tmp_path):
    path, data = rows
    out = str(tmp_path / "cols.h5") + "::/x"
    done = subprocess.run(
        [sys.executable, "-m", "daskstream", "convert", path, out, "--codec", "gzip", "--chunks", "-1,32", "--budget", "4MiB",
         "--intermediate", str(tmp_path / "work"), "--json", "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blocks_written"] == 32
    with h5py.File(tmp_path / "cols.h5", "r") as f:
        assert f["x"].chunks == (1024, 32)
        np.testing.assert_array_equal(f["x"][...], data)
    assert _intermediates(tmp_path / "work") == []
