"""Streaming tasks: a block's chain of work run in groups inside one task, with the results, memory and
reads of the graph dask built, and far fewer tasks."""

from __future__ import annotations

import dataclasses
import operator
import threading
import time
import weakref

import dask
import numpy as np
import pytest
import zarr
from dask._task_spec import DataNode, List, Task, TaskRef
from formats import in_each_format

import daskstream as ds
from daskstream.compute.streaming.chains import MIN_GROUP, WAVES, Chains, run_chains, stream_chains
from daskstream.compute.streaming.folds import run_folded
from daskstream.compute.streaming.optimizer import chains_ahead
from daskstream.planning.computation import ComputePlan, TaskMemory
from daskstream.runtime.metering import ReadMeter
from daskstream.sources.npy import NpySource

MiB = 2**20


def streamed_graph(result, streaming=True):
    """The graph dask runs for ``result``, after daskstream's optimizer."""
    with dask.config.set({"daskstream.compute.streaming": streaming}):
        return dask.config.get("array_optimize")(result.__dask_graph__(), result.__dask_keys__())


def streaming_tasks(graph):
    """Tasks computing many blocks' work: groups of chains, or combines computing their blocks themselves."""
    return [k for k, node in graph.items() if isinstance(node, Task) and node.func in (run_chains, run_folded)]


@pytest.fixture
def stored(tmp_path):
    """The same float32 field as .npy, chunked HDF5 and Zarr v3, in chunks of 40 rows."""
    data = np.random.default_rng(5).standard_normal((2000, 90)).astype("f4")
    data[7, 3] = np.nan
    return data, in_each_format(tmp_path, data, rows=40)


REDUCTIONS = {
    "sum": (lambda x: ds.reduce(x, "nansum"), lambda a: np.nansum(a, dtype="f8")),
    "mean of rows": (lambda x: ds.reduce(x, "nanmean", axis=0), lambda a: np.nanmean(a, axis=0, dtype="f8")),
    "std": (lambda x: ds.reduce(x, "nanstd", ddof=1), lambda a: np.nanstd(a.astype("f8"), ddof=1)),
    "max": (lambda x: ds.reduce(x, "nanmax"), np.nanmax),
    "argmin of columns": (lambda x: ds.reduce(x, "argmin", axis=0), lambda a: np.argmin(a, axis=0)),
    "dask's own sum of squares": (lambda x: (x**2).sum(axis=0), lambda a: (a.astype("f8") ** 2).sum(axis=0)),
    "histogram": (
        lambda x: ds.reduce(x, "histogram", bins=8, range=(-3, 3))[0],
        lambda a: np.histogram(a[~np.isnan(a)], bins=8, range=(-3, 3))[0],
    ),
}


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "zarr"])
@pytest.mark.parametrize("reduction", sorted(REDUCTIONS))
def test_streamed_reductions_give_numpys_answer_in_far_fewer_tasks(stored, fmt, reduction):
    data, paths = stored
    build, oracle = REDUCTIONS[reduction]
    x = ds.open(paths[fmt], chunks=(40, 90))
    result = build(x)
    graph, unstreamed = streamed_graph(result), streamed_graph(result, streaming=False)
    assert streaming_tasks(graph)
    # The 50 chains of reading and reducing a block became a few streaming tasks for 2 threads (a group's
    # chains feed one combine: a few more where dask's tree combines few at a time).
    assert len(graph) <= len(unstreamed) - 50 + 3 * WAVES
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = result.compute()
    np.testing.assert_allclose(got, oracle(data), rtol=1e-6)
    assert meter.bytes_read == data.nbytes  # every block read once, as before


def test_the_tasks_follow_the_threads_not_the_data(tmp_path):
    """Ten times the blocks: as many streaming tasks, and only the combines' few more."""
    counts = []
    for rows in (4000, 40000):
        path = tmp_path / f"{rows}.zarr"
        zarr.create_array(path, shape=(rows, 100), chunks=(40, 100), dtype="f4", fill_value=1.0)
        x = ds.open(str(path), chunks=(40, 100), memory_budget="1GiB")
        graph = streamed_graph(ds.reduce(x, "sum"))
        counts.append((len(streaming_tasks(graph)), len(graph)))
        assert float(ds.reduce(x, "sum").compute()) == rows * 100
    (streams_small, tasks_small), (streams_large, tasks_large) = counts
    # A few a thread (2 here), however many blocks: the first combines, each computing its blocks.
    assert 2 * WAVES <= streams_small < 4 * WAVES
    assert 2 * WAVES <= streams_large < 4 * WAVES
    assert tasks_large < 2 * tasks_small  # the blocks grew tenfold


class AliveBlocks(NpySource):
    """A real .npy source that counts the blocks it read which are still alive, and the most at once."""

    lock = threading.Lock()
    alive = 0
    most = 0

    def _read_box(self, box):
        block = super()._read_box(box)
        with AliveBlocks.lock:
            AliveBlocks.alive += 1
            AliveBlocks.most = max(AliveBlocks.most, AliveBlocks.alive)
        weakref.finalize(block, AliveBlocks._released)
        return block

    @staticmethod
    def _released():
        with AliveBlocks.lock:
            AliveBlocks.alive -= 1


def test_a_streaming_task_holds_one_block_at_a_time(tmp_path):
    data = np.random.default_rng(2).standard_normal((4000, 250))
    np.save(tmp_path / "a.npy", data)
    x = ds.open(AliveBlocks(tmp_path / "a.npy"), chunks=(50, 250))
    result = ds.reduce((x - 1) * 2, "mean")
    assert len(streaming_tasks(streamed_graph(result))) == 2 * WAVES
    AliveBlocks.most = 0
    with dask.config.set(scheduler="threads", num_workers=2):
        assert float(result.compute()) == pytest.approx(((data - 1) * 2).mean(), rel=1e-12)
    assert AliveBlocks.most <= 2  # one per thread: each streaming task's chains one after another


def test_work_taking_an_aggregate_streams_and_a_later_pass_reads_again(tmp_path):
    data = np.random.default_rng(3).standard_normal((3000, 60)).astype("f4")
    np.save(tmp_path / "a.npy", data)
    x = ds.open(tmp_path / "a.npy", chunks=(30, 60), memory_budget="64MiB")
    result = ds.reduce((x - x.mean(axis=0)) ** 2, "sum")
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = result.compute()
    want = ((data.astype("f8") - data.astype("f8").mean(axis=0)) ** 2).sum()
    assert float(got) == pytest.approx(want, rel=1e-6)
    assert meter.bytes_read <= 2 * data.nbytes


def block_of(i, *taken):
    return np.full(3, float(i))


def chain(name, i, *taken):
    """A block's chain: a 'read' of block ``i`` taking ``taken``, and its partial sum."""
    read = Task((f"read-{name}", i), block_of, i, *(TaskRef(t) for t in taken))
    partial = Task((f"part-{name}", i), np.sum, TaskRef(read.key))
    return {read.key: read, partial.key: partial}


def summed(name, n):
    return Task((f"total-{name}",), sum, List(*(TaskRef((f"part-{name}", i)) for i in range(n))))


def test_chains_stream_only_where_nothing_waits_for_them():
    # Twelve chains taking one description, as a source's reads do: streamed.
    graph = {("description",): DataNode(("description",), 0)}
    for i in range(12):
        graph |= chain("a", i, ("description",))
    graph[("total-a",)] = summed("a", 12)
    streamed = stream_chains(graph, [("total-a",)], threads=1)
    assert len(streaming_tasks(streamed)) == 12 // MIN_GROUP
    assert dask.get(streamed, ("total-a",)) == 3 * sum(range(12))
    # Chains that each take a block another task takes too: that block would wait for the group. Not streamed.
    graph = {}
    for i in range(12):
        graph[("shared", i)] = Task(("shared", i), np.zeros, 1)
        graph[("other", i)] = Task(("other", i), np.sum, TaskRef(("shared", i)))
        graph |= chain("b", i, ("shared", i))
    graph[("total-b",)] = summed("b", 12)
    outputs = [("total-b",), *((("other", i)) for i in range(12))]
    assert not streaming_tasks(stream_chains(graph, outputs, threads=1))


def test_the_branches_of_a_tree_are_never_run_one_after_another():
    # Two combines of six chains each, and a total of the two: only the lowest combines' chains stream.
    graph = {}
    for i in range(12):
        graph |= chain("c", i)
    for half in range(2):
        parts = List(*(TaskRef(("part-c", i)) for i in range(6 * half, 6 * half + 6)))
        graph[("half", half)] = Task(("half", half), sum, parts)
    graph[("total",)] = Task(("total",), operator.add, TaskRef(("half", 0)), TaskRef(("half", 1)))
    streamed = stream_chains(graph, [("total",)], threads=2)
    assert ("half", 0) in streamed
    assert ("half", 1) in streamed
    assert streaming_tasks(streamed)
    assert dask.get(streamed, ("total",)) == 3 * sum(range(12))


def test_a_chains_repr_names_no_task():
    assert repr(Chains((), ())) == "Chains(0 chains taking 0 keys, 0 ahead)"


class UnderWay:
    """Counts the chains under way at once (a block 'read' that waits a little, as a GET does)."""

    lock = threading.Lock()
    now = 0
    most = 0

    @classmethod
    def read(cls, i):
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        time.sleep(0.02)
        with cls.lock:
            cls.now -= 1
        return np.full(3, float(i))


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_chains_ahead_are_under_way_together_and_hand_on_in_order(ahead):
    chains = []
    for i in range(10):
        read = Task(("read", i), UnderWay.read, i)
        partial = Task(("part", i), np.sum, TaskRef(("read", i)))
        chains.append((partial.key, {read.key: read, partial.key: partial}))
    UnderWay.most = 0
    assert run_chains(Chains(tuple(chains), (), ahead)) == tuple(3.0 * i for i in range(10))
    assert UnderWay.most == ahead + 1


def test_chains_ahead_only_for_object_stores_and_within_the_budget():
    worst = TaskMemory("read", (("input", 10 * MiB),))
    plan = ComputePlan(budget=100 * MiB, concurrency=2, tasks=9, passes=1, read_passes={"s3://b/x.zarr": (0,)},
                       source_bytes={}, pass_work={}, worst=worst)  # fmt: skip
    assert chains_ahead(plan) == 2  # the setting's default: the budget holds four more tasks' peaks
    with dask.config.set({"daskstream.objects.chains-ahead": 8}):
        assert chains_ahead(plan) == 4
    assert chains_ahead(dataclasses.replace(plan, budget=25 * MiB)) == 0
    assert chains_ahead(dataclasses.replace(plan, read_passes={"/data/x.zarr": (0,)})) == 0


def test_streaming_can_be_switched_off(stored):
    _, paths = stored
    x = ds.open(paths["npy"], chunks=(40, 90))
    assert not streaming_tasks(streamed_graph(ds.reduce(x, "sum"), streaming=False))


def test_a_real_cluster_runs_the_streaming_tasks(dask_cluster, stored):
    from distributed import Client, get_task_stream

    data, paths = stored
    with Client(scheduler_file=str(dask_cluster)) as client:
        x = ds.open(paths["zarr"], chunks=(40, 90))
        with get_task_stream(client) as tasks:
            got = ds.reduce(x, "nanmean").compute()
    assert float(got) == pytest.approx(np.nanmean(data.astype("f8")), rel=1e-9)
    names = [str(t["key"]) for t in tasks.data]
    assert any("stream-" in name for name in names)
    assert len(names) < 50  # 50 blocks, each a read and a partial, before
