"""Folded blocks: a reduction's combines compute the blocks they take, so the graph a scheduler loads holds no
task per block, with the answers, reads and memory of the graph dask built."""

from __future__ import annotations

import pickle
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask._task_spec import GraphNode, Task
from formats import in_each_format

import daskstream as ds
from daskstream.compute.streaming.chains import WAVES
from daskstream.compute.streaming.folds import FOLDED_PREFIX, Folded, fold_blocks, run_folded
from daskstream.graph.optimize import requested_keys
from daskstream.runtime.metering import ReadMeter
from daskstream.sources.npy import NpySource


def optimized(result, streaming=True):
    """The graph dask runs for ``result``, after daskstream's optimizer."""
    with dask.config.set({"daskstream.compute.streaming": streaming}):
        return dask.config.get("array_optimize")(result.__dask_graph__(), result.__dask_keys__())


def folded_tasks(graph):
    return [key for key, node in graph.items() if isinstance(node, Task) and node.func is run_folded]


def task_objects(value):
    """Task objects a scheduler loads for ``value``: a graph's nodes and the tasks nested in their arguments."""
    if isinstance(value, dict):
        return sum(task_objects(v) for v in value.values())
    if isinstance(value, GraphNode):
        nested = getattr(value, "args", ())
        return 1 + sum(task_objects(a) for a in nested)
    if isinstance(value, Folded):
        return task_objects(value.combine) + sum(task_objects(b) for b in value.below)
    if isinstance(value, (tuple, list)):
        return sum(task_objects(v) for v in value)
    return 0


@pytest.fixture
def stored(tmp_path):
    """The same float32 field as .npy, chunked HDF5 and Zarr v3, in chunks of 20 rows: 300 blocks."""
    data = np.random.default_rng(11).standard_normal((6000, 40)).astype("f4")
    return data, in_each_format(tmp_path, data, rows=20)


# dask's own reductions and daskstream's, each with the element-wise work before it.
FOLDED = {
    "dask sum": (lambda x: x.sum(), lambda a: a.sum(dtype="f8")),
    "dask mean of columns": (lambda x: (x * 2 + 1).mean(axis=0), lambda a: (a.astype("f8") * 2 + 1).mean(axis=0)),
    "dask std": (lambda x: x.std(), lambda a: a.astype("f8").std()),
    "dask max": (lambda x: abs(x).max(), lambda a: np.abs(a).max()),
    "nansum": (lambda x: ds.reduce(x, "nansum"), lambda a: np.nansum(a, dtype="f8")),
    "var of columns": (lambda x: ds.reduce(x, "var", axis=0, ddof=1), lambda a: a.astype("f8").var(axis=0, ddof=1)),
    "histogram": (
        lambda x: ds.reduce(x, "histogram", bins=6, range=(-2, 2))[0],
        lambda a: np.histogram(a, bins=6, range=(-2, 2))[0],
    ),
}


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "zarr"])
@pytest.mark.parametrize("reduction", sorted(FOLDED))
def test_folded_reductions_give_numpys_answer_reading_each_block_once(stored, fmt, reduction):
    data, paths = stored
    build, oracle = FOLDED[reduction]
    x = ds.open(paths[fmt], chunks=(20, 40))
    result = build(x)
    graph = optimized(result)
    # No task per block: the read and its element-wise work are made into tasks where the combines run.
    assert folded_tasks(graph)
    assert not [key for key in graph if isinstance(key, tuple) and str(key[0]).startswith("daskstream-")]
    assert len(graph) < x.npartitions / 4
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = result.compute()
    np.testing.assert_allclose(got, oracle(data), rtol=1e-5)
    assert meter.bytes_read == data.nbytes


def test_what_a_scheduler_loads_follows_the_threads_not_the_blocks(tmp_path):
    """Sixteen times the blocks: as many tasks, and no more task objects, only the combines' plain tuples."""
    loaded = []
    for rows in (25_600, 409_600):
        path = tmp_path / f"{rows}.zarr"
        zarr.create_array(path, shape=(rows, 64), chunks=(64, 64), dtype="f4", fill_value=1.0)
        x = ds.open(str(path), chunks=(64, 64), memory_budget="1GiB")
        graph = optimized(x.sum())
        assert float(x.sum().compute()) == rows * 64
        loaded.append((x.npartitions, len(graph), task_objects(graph)))
    (blocks_small, tasks_small, objects_small), (blocks_large, tasks_large, objects_large) = loaded
    assert blocks_large == 16 * blocks_small
    assert tasks_large == tasks_small
    assert objects_large == objects_small
    # Without folding, dask's graph holds a task object per block at least.
    assert task_objects(optimized(x.sum(), streaming=False)) > blocks_large


class ConcurrentReads(NpySource):
    """A real .npy source that counts the reads under way at once, the most of them, and blocks alive."""

    lock = threading.Lock()
    reading = 0
    most = 0

    def _read_box(self, box):
        with ConcurrentReads.lock:
            ConcurrentReads.reading += 1
            ConcurrentReads.most = max(ConcurrentReads.most, ConcurrentReads.reading)
        try:
            time.sleep(0.002)  # a read that waits, as an object store's does
            return super()._read_box(box)
        finally:
            with ConcurrentReads.lock:
                ConcurrentReads.reading -= 1


@pytest.mark.parametrize("ahead", [0, 2])
def test_a_folded_combine_reads_one_block_at_a_time_or_its_blocks_ahead(tmp_path, ahead):
    data = np.random.default_rng(4).standard_normal((3200, 50))
    np.save(tmp_path / "a.npy", data)
    x = ds.open(ConcurrentReads(tmp_path / "a.npy"), chunks=(20, 50))
    result = (x - 1).sum()
    graph = result.__dask_graph__()
    folded = fold_blocks(graph, requested_keys(result.__dask_keys__()), threads=1, ahead=ahead)
    assert folded is not graph
    assert any(name.startswith(FOLDED_PREFIX) for name in folded.layers)
    ConcurrentReads.most = 0
    with dask.config.set(scheduler="sync"):  # one thread: any overlap is the folded task's own
        (got,) = dask.compute(da.Array(folded, result.name, result.chunks, meta=result._meta), optimize_graph=False)
    assert float(got) == pytest.approx((data - 1).sum(), rel=1e-12)
    assert ConcurrentReads.most == ahead + 1


def test_too_few_combines_for_the_threads_are_not_folded(stored):
    _, paths = stored
    x = ds.open(paths["npy"], chunks=(20, 40))
    result = x.sum(split_every={0: 150, 1: 2})  # two combines for the 300 blocks
    graph = result.__dask_graph__()
    keys = requested_keys(result.__dask_keys__())
    # Two combines: a thread wants WAVES tasks, so even one thread's would idle once they are folded.
    assert WAVES > 2
    unfolded = fold_blocks(graph, keys, threads=1)
    assert not any(name.startswith(FOLDED_PREFIX) for name in unfolded.layers)
    assert float(result.compute()) == pytest.approx(float(np.load(paths["npy"]).sum(dtype="f8")), rel=1e-6)


def test_blocks_taken_by_more_than_a_combine_are_not_folded(stored):
    data, paths = stored
    x = ds.open(paths["npy"], chunks=(20, 40))
    total, first_rows = x.sum(), x[:40] * 2
    graph = optimized(total)
    assert folded_tasks(graph)
    # The blocks feed the sum and an array asked for: the sum's combines do not compute them.
    got_total, got_rows = dask.compute(total, first_rows)
    assert float(got_total) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)
    np.testing.assert_array_equal(got_rows, data[:40] * 2)


def test_a_folded_task_names_no_block_when_printed(stored):
    _, paths = stored
    x = ds.open(paths["npy"], chunks=(20, 40))
    graph = optimized(x.sum())
    task = graph[folded_tasks(graph)[0]]
    folded = task.args[0]
    assert repr(folded).startswith("Folded(")
    assert "daskstream-" not in repr(folded)
    assert len(pickle.dumps(folded)) < 4096


def test_a_real_cluster_runs_the_folded_combines(dask_cluster, stored):
    from distributed import Client, get_task_stream

    data, paths = stored
    with Client(scheduler_file=str(dask_cluster)) as client:
        x = ds.open(paths["zarr"], chunks=(20, 40))
        with get_task_stream(client) as tasks:
            got = (x * 3).mean().compute()
    assert float(got) == pytest.approx(float((data.astype("f8") * 3).mean()), rel=1e-6)
    names = [str(t["key"]) for t in tasks.data]
    assert len(names) < x.npartitions / 4  # 300 blocks
    assert not [name for name in names if "daskstream-zarr" in name and "original" not in name]


def test_the_plan_says_how_many_tasks_the_scheduler_runs_and_would_have_run(stored):
    _, paths = stored
    x = ds.open(paths["npy"], chunks=(20, 40))
    result = ds.reduce(x * 2, "mean")
    streaming = ds.plan_compute(result).streaming
    graph = optimized(result)
    assert streaming.tasks == len(graph)
    assert streaming.streams == len(folded_tasks(graph))
    assert streaming.shared == 1  # the folded layer, given once to every task computing its blocks
    assert streaming.tasks - streaming.streams - streaming.shared + streaming.folded == len(
        optimized(result, streaming=False)
    )
    assert f"the scheduler runs {len(graph)} tasks" in ds.plan_compute(result).explain()
