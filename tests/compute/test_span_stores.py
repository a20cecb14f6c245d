"""Stores of arrays read in spans: each task writes the chunks of about one span, one at a time, each once,
resumable chunk by chunk, with numpy's values; what cannot stream is refused before the target is touched."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask
import h5py
import numpy as np
import pytest
import span_store_worker
import zarr
from dask.callbacks import Callback
from span_helpers import BUDGET, SPANNED, Reads

import daskstream as ds
from daskstream.compute.store.record import H5_COMPLETE_ATTR, H5_DONE_ATTR, PROGRESS_DIR
from daskstream.compute.store.span_writes import ChunksLeft, span_writes
from daskstream.compute.store.zarr_writes import ChunkWrites
from daskstream.errors import InvalidArgumentError, InvalidChunksError, MemoryBudgetError
from daskstream.runtime.metering import ReadMeter

WORKER = Path(span_store_worker.__file__)


class StoreTasks(Callback):
    """The store's tasks run (those whose keys begin with ``prefix``), counted by key."""

    def __init__(self, prefix="daskstream-store-spans"):
        super().__init__()
        self.prefix, self.ran = prefix, 0

    def _posttask(self, key, *_):
        if isinstance(key, tuple) and str(key[0]).startswith(self.prefix):
            self.ran += 1


# Each expression, numpy's, and the target's chunk from the plan's (the piece the spans stream in, through
# the index where one drops or steps over axes).
EXPRESSIONS = {
    "as read": (lambda x: x, lambda a: a, lambda c: c),
    # Sliced off the source's grid: the target's chunks straddle the spans (and the source's chunks).
    "element-wise of a slice": (lambda x: x[17:23903, 5:33] * 2 + 1, lambda a: a[17:23903, 5:33] * 2 + 1, lambda c: c),
    "as float64": (lambda x: np.sqrt(abs(x.astype("f8"))), lambda a: np.sqrt(abs(a.astype("f8"))), lambda c: c),
    # An integer index drops an axis, a step keeps every other row: the pieces follow.
    "every other row of a column": (lambda x: x[::2, 3] - 1, lambda a: a[::2, 3] - 1, lambda c: (c[0] // 2, c[2])),
    "transposed": (lambda x: x.transpose(1, 0, 2), lambda a: a.transpose(1, 0, 2), lambda c: (c[1], c[0], c[2])),
    # Reversed, with a new axis of one: each chunk read from its last row.
    "reversed, with a new axis": (lambda x: x[::-1, None], lambda a: a[::-1, None], lambda c: (c[0], 1, *c[1:])),
    # Rows picked by an array, in two runs across spans: each chunk gathered from the source's rows it takes.
    "rows picked by an array": (
        lambda x: x[np.r_[100:3000, 9000:9500]],
        lambda a: a[np.r_[100:3000, 9000:9500]],
        lambda c: c,
    ),
    # Rechunked off the spans' grid: each target chunk joined from the parts of spans it lies in.
    "rechunked": (lambda x: x.rechunk((4000, 40, 3)), lambda a: a, lambda c: c),
    # Whole rows merged: each chunk read, then reshaped.
    "rows merged": (lambda x: x.reshape(24_000, 240), lambda a: a.reshape(24_000, 240), lambda c: (c[0], 240)),
}
# Expressions whose reads take the rows between those kept (a step): more is read than stored.
STEPPED = {"every other row of a column"}


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
@pytest.mark.parametrize("expression", sorted(EXPRESSIONS))
def test_a_spanned_array_is_stored_chunk_by_chunk_in_few_tasks(
    span_field, spanned, tmp_path, monkeypatch, fmt, expression
):
    data, paths = span_field
    build, oracle, piece = EXPRESSIONS[expression]
    plan = ds.plan(paths[fmt], memory_budget=BUDGET)
    x = build(ds.open(paths[fmt], memory_budget=BUDGET))
    expected = oracle(data)
    reads = Reads(monkeypatch, type(ds.open_source(paths[fmt])))
    target = str(tmp_path / "out.zarr")
    with dask.config.set(scheduler="threads"), StoreTasks() as tasks, ReadMeter() as meter:
        y = ds.store(x, target)
    stored = zarr.open_array(target, mode="r")
    np.testing.assert_array_equal(stored[...], expected)  # zarr is the oracle
    # The target is chunked in the pieces the spans stream in, and each is written by one of few tasks.
    assert stored.chunks == tuple(min(c, n) for c, n in zip(piece(plan.chunks), expected.shape))
    chunks = math.prod(-(-n // c) for n, c in zip(expected.shape, stored.chunks))
    assert y.result.written == chunks
    assert tasks.ran <= x.npartitions < chunks
    # Each chunk's part of the source is read once, a piece at a time: nothing is read whole.
    assert meter.bytes_read == expected.size * data.itemsize or (
        expression in STEPPED and expected.nbytes < meter.bytes_read <= 2 * expected.size * data.itemsize
    )
    assert max(reads.sizes) <= plan.chunk_bytes < data.nbytes / x.npartitions  # each span more than a chunk
    # What store returns reads the target, in spans too.
    assert float(np.nansum(y, dtype="f8").compute()) == pytest.approx(float(np.nansum(expected, dtype="f8")), rel=1e-9)


def test_a_real_cluster_stores_a_spanned_array_from_its_workers(dask_cluster, span_field, tmp_path):
    from distributed import Client, get_task_stream

    data, paths = span_field
    target = str(tmp_path / "out.zarr")
    with Client(scheduler_file=str(dask_cluster)), dask.config.set(SPANNED):
        x = ds.open(paths["zarr"], memory_budget=BUDGET)
        with get_task_stream() as tasks:
            y = ds.store(x * 2, target)
    np.testing.assert_array_equal(zarr.open_array(target, mode="r")[...], data * 2)
    stores = [t for t in tasks.data if str(t["key"]).startswith("('daskstream-store-spans")]
    assert 0 < len(stores) <= x.npartitions < y.result.written


def test_codecs_are_chosen_from_chunks_of_a_spanned_array(span_field, spanned, tmp_path, monkeypatch):
    data, paths = span_field
    plan = ds.plan(paths["zarr"], memory_budget=BUDGET)
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    target = str(tmp_path / "auto.zarr")
    ds.store(ds.open(paths["zarr"], memory_budget=BUDGET), target, codec="auto", optimize="size")
    np.testing.assert_array_equal(zarr.open_array(target, mode="r")[...], data)
    assert max(reads.sizes) <= plan.chunk_bytes  # the samples too are chunks, not spans


STEPS_NOT_STREAMING = {
    "sort": (lambda x: x.map_blocks(np.sort, axis=0), "sort takes whole blocks of {path}"),
    "points picked by vindex": (
        lambda x: x.vindex[np.array([5, 17_000, 3]), np.array([1, 2, 3])],
        "vindex takes whole blocks of {path}",
    ),
}


@pytest.mark.parametrize("step", sorted(STEPS_NOT_STREAMING))
def test_a_step_that_cannot_stream_is_refused_before_the_target_is_made(
    span_field, spanned, tmp_path, monkeypatch, step
):
    _, paths = span_field
    build, refusal = STEPS_NOT_STREAMING[step]
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    target = tmp_path / "out.zarr"
    with pytest.raises(MemoryBudgetError, match="spans of many chunks per task") as refused:
        ds.store(build(ds.open(paths["zarr"], memory_budget=BUDGET)), str(target))
    assert refusal.format(path=paths["zarr"]) in str(refused.value)
    assert not target.exists()
    assert reads.sizes == []


# A float64 chunk (2.2 MiB) encoded for HDF5 projects past the 16 MiB budget with two threads, spans or not.
HDF5_REFUSED = {"as float64"}


@pytest.mark.parametrize("expression", sorted(set(EXPRESSIONS) - HDF5_REFUSED))
def test_a_spanned_array_is_stored_to_hdf5_by_a_task_per_chunk_each_read_once(
    span_field, spanned, tmp_path, monkeypatch, expression
):
    data, paths = span_field
    build, oracle, piece = EXPRESSIONS[expression]
    plan = ds.plan(paths["zarr"], memory_budget=BUDGET)
    x = build(ds.open(paths["zarr"], memory_budget=BUDGET))
    expected = oracle(data)
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    target = tmp_path / "out.h5"
    with dask.config.set(scheduler="threads"), StoreTasks("daskstream-span-chunks") as tasks, ReadMeter() as meter:
        y = ds.store(x, f"{target}::/x")
    with h5py.File(target, "r") as f:
        np.testing.assert_array_equal(f["x"][...], expected)  # h5py is the oracle
        # Chunked in the pieces the spans stream in, as a Zarr target is; finished, with no progress record left.
        assert f["x"].chunks == tuple(min(c, n) for c, n in zip(piece(plan.chunks), expected.shape))
        assert set(f["x"].attrs) == {H5_COMPLETE_ATTR}
        chunks = math.prod(-(-n // c) for n, c in zip(expected.shape, f["x"].chunks))
    # Each chunk computed by one task, once, its part of the source read once a piece at a time: none whole.
    assert y.result.written == tasks.ran == chunks > x.npartitions
    assert meter.bytes_read == expected.size * data.itemsize or (
        expression in STEPPED and expected.nbytes < meter.bytes_read <= 2 * expected.size * data.itemsize
    )
    assert max(reads.sizes) <= plan.chunk_bytes < data.nbytes / x.npartitions


@pytest.mark.parametrize("expression", sorted(HDF5_REFUSED))
def test_a_chunk_whose_hdf5_encoding_passes_the_budget_is_refused_as_without_spans(span_field, tmp_path, expression):
    _, paths = span_field
    build = EXPRESSIONS[expression][0]
    refusals = []
    for settings in ({}, SPANNED):
        target = tmp_path / f"out-{len(refusals)}.h5"
        with dask.config.set(settings), pytest.raises(MemoryBudgetError) as refused:
            ds.store(build(ds.open(paths["zarr"], memory_budget=BUDGET)), f"{target}::/x")
        assert not target.exists()
        refusals.append(str(refused.value).split(" (")[0])
    assert refusals[0] == refusals[1]
    # Into a file already there: the file and what it holds stay as they were, with no group or dataset added.
    target = tmp_path / "kept.h5"
    with h5py.File(target, "w") as f:
        f["keep"] = np.arange(5)
    with dask.config.set(SPANNED), pytest.raises(MemoryBudgetError):
        ds.store(build(ds.open(paths["zarr"], memory_budget=BUDGET)), f"{target}::/g/sub/x")
    # Into a folder still to make: no folder is left either.
    with dask.config.set(SPANNED), pytest.raises(MemoryBudgetError):
        ds.store(build(ds.open(paths["zarr"], memory_budget=BUDGET)), f"{tmp_path / 'new' / 'deeper' / 'o.h5'}::/x")
    assert not (tmp_path / "new").exists()
    with h5py.File(target, "r") as f:
        assert list(f) == ["keep"]
        np.testing.assert_array_equal(f["keep"][...], np.arange(5))
    assert refusals[0].startswith("this computation projects")
    assert "over its memory budget of 16.00 MiB" in refusals[0]


def test_a_cumulative_step_of_spans_is_refused_for_hdf5_naming_zarr(span_field, spanned, tmp_path, monkeypatch):
    _, paths = span_field
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    target = tmp_path / "out.h5"
    with pytest.raises(InvalidArgumentError) as refused:
        ds.store(np.cumsum(ds.open(paths["zarr"], memory_budget=BUDGET), axis=0), f"{target}::/x")
    assert isinstance(refused.value, ValueError)
    assert "each scanning its span from its start" in str(refused.value)
    assert "store it to a Zarr folder" in str(refused.value)
    assert not target.exists()
    assert reads.sizes == []


def test_a_real_cluster_computes_the_chunks_of_a_spanned_hdf5_store_on_its_workers(dask_cluster, span_field, tmp_path):
    from distributed import Client, get_task_stream

    data, paths = span_field
    target = tmp_path / "out.h5"
    with Client(scheduler_file=str(dask_cluster)), dask.config.set(SPANNED):
        x = ds.open(paths["zarr"], memory_budget=BUDGET)
        with get_task_stream() as tasks:
            y = ds.store(x * 2, f"{target}::/x")
    with h5py.File(target, "r") as f:
        np.testing.assert_array_equal(f["x"][...], data * 2)
    chunk_tasks = {t["key"] for t in tasks.data if "daskstream-span-chunks" in str(t["key"])}
    assert len(chunk_tasks) == y.result.written > x.npartitions


def test_an_hdf5_target_of_more_chunks_than_its_record_holds_is_refused_before_it_is_made(tmp_path):
    # Metadata only: a pebibyte of 1.4 million chunks, none read.
    zarr.create_array(tmp_path / "p.zarr", shape=(2**20, 2**14, 2**14), chunks=(64, 1024, 1024), dtype="f4")
    x = ds.open(str(tmp_path / "p.zarr")) + 1
    assert ds.plan(str(tmp_path / "p.zarr")).span is not None
    target = tmp_path / "out.h5"
    with pytest.raises(InvalidChunksError) as refused:
        ds.store(x, f"{target}::/x")
    assert isinstance(refused.value, ValueError)
    message = str(refused.value)
    assert message.startswith(f"{target}::/x: the array is read in spans and stored in the chunks they stream in")
    assert "is more than an HDF5 progress record holds (480,000); store to a Zarr folder" in message
    assert not target.exists()


def test_a_killed_store_of_spans_resumes_reading_and_writing_only_the_chunks_not_marked(
    span_field, tmp_path, monkeypatch
):
    data, paths = span_field
    target = tmp_path / "out.zarr"
    done_dir = target / PROGRESS_DIR / "done"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), paths["zarr"], str(target), "0.15"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        deadline = time.monotonic() + 120
        while not (done_dir.is_dir() and len(os.listdir(done_dir)) >= 4):
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.kill()
        worker.communicate()
    marked = {tuple(int(i) for i in name.split(".")) for name in os.listdir(done_dir)}
    expected = data * 2 + 1
    partial = zarr.open_array(str(target), mode="r")
    rows = partial.chunks[0]
    assert 4 <= len(marked) < partial.nchunks
    for index in marked:  # every chunk marked done is whole
        np.testing.assert_array_equal(
            partial[index[0] * rows : (index[0] + 1) * rows], expected[index[0] * rows : (index[0] + 1) * rows]
        )

    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    with dask.config.set({**SPANNED, "scheduler": "threads"}):
        y = ds.store(span_store_worker.build(paths["zarr"]), str(target))
    assert (y.result.done_before, y.result.written) == (len(marked), partial.nchunks - len(marked))
    # Only the chunks not marked were read again, each once.
    read_rows = sorted(region[0] for region in reads.regions)
    assert read_rows == sorted(
        (i * rows, min((i + 1) * rows, data.shape[0])) for i in range(partial.nchunks) if (i, 0, 0) not in marked
    )
    np.testing.assert_array_equal(zarr.open_array(str(target), mode="r")[...], expected)


def test_a_killed_hdf5_store_of_spans_resumes_reading_and_writing_only_the_chunks_recorded_missing(
    span_field, tmp_path, monkeypatch
):
    data, paths = span_field
    target = f"{tmp_path / 'out.h5'}::/x"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), paths["zarr"], target, "0.15"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        for line in worker.stdout:
            if line.startswith("progress") and int(line.split()[1]) >= 4:
                worker.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail("the store finished before it could be killed")
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()
    with h5py.File(tmp_path / "out.h5", "r") as f:
        partial = f["x"]
        rows, total = partial.chunks[0], -(-data.shape[0] // partial.chunks[0])
        marked = set(np.flatnonzero(np.unpackbits(partial.attrs[H5_DONE_ATTR], count=total)))
        assert 4 <= len(marked) < total
        for i in marked:  # every chunk recorded done is whole
            np.testing.assert_array_equal(partial[i * rows : (i + 1) * rows], data[i * rows : (i + 1) * rows] * 2 + 1)

    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    with dask.config.set({**SPANNED, "scheduler": "threads"}):
        y = ds.store(span_store_worker.build(paths["zarr"]), target)
    assert (y.result.done_before, y.result.written) == (len(marked), total - len(marked))
    # Only the chunks not recorded were read again, each once.
    assert sorted(region[0] for region in reads.regions) == [
        (i * rows, min((i + 1) * rows, data.shape[0])) for i in range(total) if i not in marked
    ]
    with h5py.File(tmp_path / "out.h5", "r") as f:
        np.testing.assert_array_equal(f["x"][...], data * 2 + 1)


def test_a_pebibyte_store_is_planned_in_tasks_as_few_as_its_spans(tmp_path):
    # Metadata only: every chunk reads as the fill value. The store's tasks are counted, not run.
    zarr.create_array(tmp_path / "p.zarr", shape=(2**20, 2**14, 2**14), chunks=(64, 1024, 1024), dtype="f4")
    x = ds.open(str(tmp_path / "p.zarr")) + 1
    plan = ds.plan(str(tmp_path / "p.zarr"))
    assert plan.span is not None
    writes = ChunkWrites(str(tmp_path / "out.zarr"), None, None, "out", None, plan.chunks)
    counts = tuple(-(-n // c) for n, c in zip(x.shape, plan.chunks))
    done = {(0, 0, 0), (5, 3, 2), (counts[0] - 1, 15, 15)}
    flags, covering = span_writes(x, writes, ChunksLeft(counts, done))
    # As many tasks as spans, however many chunks: each chunk left written by one task, none done before.
    assert flags.npartitions == len(covering) == x.npartitions == plan.span_tasks
    assert sum(len(c) for c in covering) == math.prod(counts) - len(done) > 50 * plan.span_tasks
    assert not any(index in c.done for c in covering for index in c)
