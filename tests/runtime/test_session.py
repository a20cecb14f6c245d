"""daskstream.session: real schedulers, real clusters on 127.0.0.1, real files."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import socket
import time
from urllib.parse import urlparse

import dask
import dask.config
import numpy as np
import pytest
from distributed import Client

import daskstream as ds
from daskstream.errors import InvalidArgumentError, InvalidBudgetError
from daskstream.runtime.resources import machine_resources, resolve_settings
from daskstream.runtime.schedulers import current, scheduler_kind
from daskstream.runtime.session import SCHEDULERS, session

MiB = 2**20
SHAPE, DTYPE = (4000, 500), "f8"  # 16 MB: big enough that the budget shapes the plan


@pytest.fixture
def npy(tmp_path):
    data = np.random.default_rng(0).standard_normal((600, 90)).astype("f4")
    path = tmp_path / "field.npy"
    np.save(path, data)
    return str(path), data


def _cpus():
    return machine_resources().threads


def _refuses_connections(address: str) -> bool:
    parsed = urlparse(address)
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.parametrize(
    ("scheduler", "threads", "workers"),
    [
        pytest.param("sync", lambda: 1, lambda: 1, id="sync-one-task-at-a-time"),
        pytest.param("threads", _cpus, lambda: 1, id="threads-one-process"),
        pytest.param("processes", lambda: 1, _cpus, id="processes-one-thread-each"),
    ],
)
def test_local_scheduler_computes_and_planner_sees_it(npy, scheduler, threads, workers):
    path, data = npy
    outside = ds.plan_chunks(SHAPE, DTYPE)
    with session(scheduler, memory_budget="64MiB", progress=False) as s:
        assert current() is s
        assert dask.config.get("scheduler") == scheduler
        plan = ds.plan_chunks(SHAPE, DTYPE)
        x = ds.open(path)
        total, col_max = s.compute(x.sum(dtype="f8"), x.max(axis=0))
        # An explicit argument to the planner still wins over the session.
        explicit = ds.plan_chunks(SHAPE, DTYPE, memory_budget="8MiB", threads=3, workers=5)
    assert (plan.memory_budget, plan.threads, plan.workers) == (64 * MiB, threads(), workers())
    assert (explicit.memory_budget, explicit.threads, explicit.workers) == (8 * MiB, 3, 5)
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)
    np.testing.assert_array_equal(col_max, data.max(axis=0))
    # Outside, the planner is back to this machine.
    assert current() is None
    assert dask.config.get("scheduler", None) is None
    after = ds.plan_chunks(SHAPE, DTYPE)
    assert (after.threads, after.workers) == (outside.threads, outside.workers) == (_cpus(), 1)
    assert after.memory_budget != 64 * MiB


def test_processes_session_splits_machine_memory_among_processes():
    with session("processes", progress=False):
        plan = ds.plan_chunks(SHAPE, DTYPE)
    machine = machine_resources()
    # Available memory moves between the two readings; the split is what matters.
    assert plan.workers == machine.workers * _cpus()
    assert plan.memory_budget == pytest.approx(machine.memory_budget / _cpus(), rel=0.2)


def test_distributed_starts_a_local_cluster_and_closes_it(npy):
    path, data = npy
    with session("distributed", progress=False) as s:
        address = s.address
        assert address.startswith("tcp://127.0.0.1:")
        info = s.client.scheduler_info(n_workers=-1)["workers"].values()
        plan = ds.plan_chunks(SHAPE, DTYPE)
        (result,) = s.compute(ds.open(path).mean(axis=0, dtype="f8"))
        # Plain dask.compute also goes to the session's cluster.
        assert dask.base.get_scheduler().__self__ is s.client
    _assert_within_worker_thresholds(plan.memory_budget, info)
    assert (plan.threads, plan.workers) == (min(w["nthreads"] for w in info), len(info))
    np.testing.assert_allclose(result, data.mean(axis=0, dtype="f8"), rtol=1e-12)
    assert s.client.status == "closed"
    assert _refuses_connections(address)
    assert current() is None
    assert dask.config.get("scheduler", None) is None


def _assert_within_worker_thresholds(budget, workers):
    """The budget leaves distributed's lowest memory threshold unreached, with the worker's own memory on top."""
    from daskstream.runtime.resources import worker_memory_fraction

    limit = min(w["memory_limit"] for w in workers)
    # An idle worker process holds some 100-300 MiB: the interpreter, numpy, dask, zarr, h5py.
    assert limit // 8 <= budget <= worker_memory_fraction() * limit - 16 * MiB


def test_distributed_budget_is_the_lowest_threshold_less_an_idle_worker_whatever_the_workers_hold(dask_cluster):
    from daskstream.runtime.resources import worker_memory_fraction

    with session(_address(dask_cluster), progress=False) as s:
        found = s.resources()
        # A worker holding 64 MiB more changes nothing: the budget is the cluster's configuration's.
        held = s.client.submit(np.ones, 2**23, pure=False)
        held.result()
        again = s.resources()
        del held
    expected = int(worker_memory_fraction() * 2**30) - 256 * MiB  # daskstream.planning.idle-worker-bytes
    assert found.memory_budget == again.memory_budget == expected
    assert "60% of the workers' memory limit (1.00 GiB) less the 256.00 MiB an idle worker holds" in found.origin


def _address(scheduler_file) -> str:
    return json.loads(scheduler_file.read_text())["address"]


def test_address_joins_a_running_scheduler_and_leaves_it_running(dask_cluster, npy):
    path, data = npy
    address = _address(dask_cluster)
    with session(address, progress=False) as s:
        assert s.cluster is None
        plan = ds.plan_chunks(SHAPE, DTYPE)
        (total,) = s.compute(ds.open(path).sum(dtype="f8"))
    # The fixture's workers: two processes of one thread, 1 GiB each.
    assert (plan.threads, plan.workers) == (1, 2)
    _assert_within_worker_thresholds(plan.memory_budget, [{"memory_limit": 2**30}])
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)
    assert s.client.status == "closed"
    with Client(address, timeout="10s") as again:
        assert len(again.scheduler_info(n_workers=-1)["workers"]) == 2
        assert again.submit(sum, [1, 2]).result() == 3


@pytest.mark.parametrize(
    "scheduler",
    [
        pytest.param("threads", id="local-counts-tasks"),
        pytest.param("distributed", id="distributed-counts-output-chunks"),
    ],
)
def test_progress_bar_reaches_the_end_and_changes_nothing(npy, capfd, scheduler):
    pytest.importorskip("tqdm")
    path, _ = npy
    with session(scheduler, progress=False) as quiet:
        x = _slowly(ds.open(path, chunks=(60, 90)))
        expected = quiet.compute(x.sum(axis=1), x.std(dtype="f8"))
    assert "%|" not in capfd.readouterr().err
    with session(scheduler, progress=True) as loud:
        x = _slowly(ds.open(path, chunks=(60, 90)))
        got = loud.compute(x.sum(axis=1), x.std(dtype="f8"))
    err = capfd.readouterr().err
    assert "100%|" in err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    # The bytes read of those planned, with their rate and the time left, and the tasks beside them.
    assert final.startswith(f"compute {path}: 100%|"), final
    read, planned = final.split("|")[-1].split()[0].split("/")
    assert read == planned
    assert "B/s" in final
    # Beside the bytes: tasks finished here, output chunks finished on a cluster's workers.
    unit = "chunks" if scheduler == "distributed" else "tasks"
    done, total = re.search(rf"(\d+)/(\d+) {unit}", final).groups()
    assert done == total
    assert int(total) > 1
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scheduler", ["threads", "distributed"])
def test_a_bar_sets_its_read_rate_beside_the_codec_limit_it_is_given(npy, capfd, tmp_path, scheduler):
    pytest.importorskip("tqdm")
    from daskstream.compute import codec_limit
    from daskstream.runtime.remembered import TuneCache

    path, data = npy
    cache = TuneCache(str(tmp_path / "tune.json"))
    with session(scheduler, progress=False):
        x = ds.open(path, chunks=(60, 90))
        assert codec_limit(x, cache=cache, measure=False) is None  # nothing remembered yet
        measured = codec_limit(x, cache=cache)  # measured, and remembered unless it says why not
        remembered = codec_limit(x, cache=cache, measure=False)
        if measured.not_remembered:
            # A measurement too noisy to trust (this machine busy) is used once and not remembered.
            assert remembered is None
        else:
            assert remembered.rate == measured.rate
    # As if this machine read 300 kB/s: the small file's slowed tasks then read at a share of it worth reading.
    limit = dataclasses.replace(measured, per_thread=3e5, threads=1)
    with session(scheduler, progress=True) as loud:
        (total,) = loud.compute(_slowly(ds.open(path, chunks=(60, 90))).sum(dtype="f8"), limit=limit)
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)
    final = capfd.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    rate, share = re.search(r"(\d+\.\d) MB/s, (\d+)% of a page-cache read limit here", final).groups()
    # The rate of the bytes read over the time taken (tasks slowed on purpose), as a share of the limit's.
    assert float(rate) > 0
    # Both rounded as shown: the rate to 0.1 MB/s, the share to 1%.
    assert abs(int(share) / 100 * limit.rate / 1e6 - float(rate)) <= 0.05 + 0.005 * limit.rate / 1e6


def _slowly(x):
    """``x``, each block a little late: bars appear only for computations longer than half a second."""
    import time

    def late(block):
        time.sleep(0.15)
        return block

    return x.map_blocks(late, dtype=x.dtype)


def test_a_bar_names_the_operation_given_and_counts_the_bytes_of_a_single_output_chunk(npy, capfd):
    pytest.importorskip("tqdm")
    path, data = npy
    with session("threads", progress=True) as s:
        x = _slowly(ds.open(path, chunks=(60, 90)))
        (total,) = s.compute(x.sum(dtype="f8"), label=f"sum of {path}")
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)
    final = capfd.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith(f"sum of {path}: 100%|"), final
    read, planned = final.split("|")[-1].split()[0].split("/")
    assert read == planned  # one output chunk, yet the bar moved with every block read
    assert planned != "1"


def test_store_shows_its_bar_as_the_session_says(npy, capfd, tmp_path):
    pytest.importorskip("tqdm")
    path, data = npy
    x = _slowly(ds.open(path, chunks=(60, 90)))
    ds.store(x, tmp_path / "outside.zarr")  # outside a session: no bar, as compute shows none
    with session("threads", progress=False):
        ds.store(x, tmp_path / "quiet.zarr")
    assert "%|" not in capfd.readouterr().err
    with session("threads", progress=True):
        y = ds.store(x, tmp_path / "loud.zarr")
    err = capfd.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith(f"store {tmp_path / 'loud.zarr'}: 100%|"), final
    assert "B/s" in final
    np.testing.assert_array_equal(y.compute(), data)


def test_progress_without_tqdm_computes_without_a_bar(npy, capfd, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # importing it now raises ImportError
    path, data = npy
    with session("threads", progress=True) as s:
        (total,) = s.compute(ds.open(path).sum(dtype="f8"))
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)
    assert capfd.readouterr().err == ""


def test_unknown_scheduler_lists_the_choices():
    with pytest.raises(InvalidArgumentError) as info:
        session("thread")
    for choice in SCHEDULERS:
        assert repr(choice) in str(info.value)
    assert "tcp://" in str(info.value)


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("tcp://127.0.0.1:99999", "has port 99999, outside 1-65535"),
        ("tcp://127.0.0.1:0", "has port 0, outside 1-65535"),
        ("tcp://127.0.0.1", "has no port; write tcp://127.0.0.1:PORT"),
        ("tcp://[::1", "has an unclosed '['"),
        ("tcp://::1:8786", "without the brackets of [ADDRESS]:PORT"),
        ("tcp://:8786", "has no valid host"),
        ("tcp://999.1.1.1:8786", "has no valid host"),
        ("tcp://127.0.0.1:8786/path", "is not tcp://HOST:PORT"),
        ("inproc://x", "uses inproc://, which daskstream does not connect over"),
        ("ucx://127.0.0.1:8786", "uses ucx://"),
        ("foo://bar", "uses foo://"),
    ],
)
def test_an_address_daskstream_cannot_join_is_refused_before_anything_starts(address, message):
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError) as info:
        session(address)
    assert time.monotonic() - started < 1  # nothing was contacted
    assert str(info.value).startswith(f"scheduler address {address!r}")
    assert message in str(info.value)
    assert "tcp://" in str(info.value)  # what a valid one looks like


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:99999", "tcp://[::1", "inproc://x", "tcp://127.0.0.1"])
def test_the_command_line_refuses_such_an_address_in_one_line(npy, address):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "daskstream", "reduce", npy[0], "--op", "sum", "--scheduler", address],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"daskstream: error: scheduler address {address!r}")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"scheduler": "threads", "cluster": "c.yaml"}, InvalidArgumentError, id="scheduler-and-cluster"),
        pytest.param({"memory_budget": "-1GiB"}, InvalidBudgetError, id="negative-budget"),
    ],
)
def test_contradictory_arguments_are_refused(kwargs, error):
    with pytest.raises(error):
        session(**kwargs)


def test_nested_sessions_restore_the_outer_one():
    with session("threads", memory_budget="64MiB", progress=False) as outer:
        with session("sync", memory_budget="32MiB", progress=False) as inner:
            assert current() is inner
            assert dask.config.get("scheduler") == "sync"
            plan = ds.plan_chunks(SHAPE, DTYPE)
            assert (plan.memory_budget, plan.threads) == (32 * MiB, 1)
        assert current() is outer
        assert dask.config.get("scheduler") == "threads"
        plan = ds.plan_chunks(SHAPE, DTYPE)
        assert (plan.memory_budget, plan.threads) == (64 * MiB, _cpus())
    assert current() is None
    assert dask.config.get("daskstream.memory-budget") == "auto"


def test_session_left_by_an_error_restores_everything():
    with pytest.raises(ZeroDivisionError), session("sync", memory_budget="32MiB", progress=False):
        1 / 0  # noqa: B018
    assert current() is None
    assert dask.config.get("scheduler", None) is None
    assert dask.config.get("daskstream.memory-budget") == "auto"


def test_compute_outside_the_session_is_refused(npy):
    s = session("sync", progress=False)
    with pytest.raises(InvalidArgumentError, match="inside"):
        s.compute(ds.open(npy[0]).sum())


@pytest.fixture
def filtered_hdf5(tmp_path):
    """One file, two compressed datasets: gzip+shuffle (daskstream decodes it) and LZF (only h5py does)."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "filtered.h5"
    data = np.arange(64 * 64, dtype="f4").reshape(64, 64)
    with h5py.File(path, "w") as f:
        f.create_dataset("gzip", data=data, chunks=(16, 64), compression="gzip", shuffle=True)
        f.create_dataset("lzf", data=data, chunks=(16, 64), compression="lzf")
    return path


@pytest.mark.parametrize(
    ("scheduler", "shares"),
    [("threads", True), ("sync", False), ("processes", False)],
)
def test_plans_say_whether_threads_decompress_hdf5_in_parallel(filtered_hdf5, scheduler, shares):
    with session(scheduler, progress=False):
        assert resolve_settings().resources.threads_share_process is shares
        parallel = " ".join(ds.plan(f"{filtered_hdf5}::gzip").axis_notes)
        serial = " ".join(ds.plan(f"{filtered_hdf5}::lzf").axis_notes)
    # Advice to leave threads is given only where h5py's lock serialises them, and names the CLI's flag too.
    assert ("shuffle+deflate chunks are read and decoded by daskstream itself" in parallel) is shares
    assert "global lock" not in parallel
    assert ("lzf holds h5py's global lock" in serial) is shares
    assert ("--scheduler processes" in serial) is shares
    assert "session('processes')" not in parallel


clusters_missing = pytest.mark.skipif(
    importlib.util.find_spec("daskstream.runtime.clusters") is None,
    reason="daskstream.runtime.clusters (cluster YAML files) is not written yet",
)


@clusters_missing
def test_cluster_file_budget_beats_workers_and_session_budget_beats_file(tmp_path, npy):
    path, data = npy
    config = tmp_path / "local.yaml"
    config.write_text(
        "daskstream:\n"
        "  cluster: local\n"
        "  memory-budget: 96MiB\n"
        # A free port: the default 8787 may still be held by the cluster a moment ago.
        "  local: {n-workers: 1, threads-per-worker: 2, memory-limit: 512MiB, dashboard-address: '127.0.0.1:0'}\n"
    )
    with session(cluster=config, progress=False) as s:
        plan = ds.plan_chunks(SHAPE, DTYPE)
        (total,) = s.compute(ds.open(path).sum(dtype="f8"))
        address = s.address
    assert (plan.memory_budget, plan.threads, plan.workers) == (96 * MiB, 2, 1)
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)
    assert _refuses_connections(address)
    with session(cluster=config, memory_budget="48MiB", progress=False):
        assert ds.plan_chunks(SHAPE, DTYPE).memory_budget == 48 * MiB


@clusters_missing
def test_cluster_file_for_a_remote_scheduler_leaves_it_running(tmp_path, dask_cluster):
    address = _address(dask_cluster)
    config = tmp_path / "remote.yaml"
    config.write_text(f"scheduler-address: {address}\ndaskstream:\n  cluster: remote\n")
    with session(cluster=config, progress=False) as s:
        assert s.cluster is None
        plan = ds.plan_chunks(SHAPE, DTYPE)
        assert s.compute(dask.delayed(sum)([1, 2])) == (3,)  # a tuple, as dask.compute gives
    _assert_within_worker_thresholds(plan.memory_budget, [{"memory_limit": 2**30}])
    with Client(address, timeout="10s") as again:
        assert again.submit(sum, [1, 2]).result() == 3


@pytest.mark.parametrize("kind", ["sync", "threads", "processes", "distributed"])
def test_one_place_says_where_work_runs_in_a_session_and_outside(kind):
    outside = {"sync": "sync", "threads": "threads", "processes": "processes"}
    if kind in outside:
        with dask.config.set(scheduler=kind):
            assert scheduler_kind() == outside[kind]
    with session(kind, progress=False):
        assert scheduler_kind() == kind
        assert resolve_settings().resources.threads_share_process == (kind == "threads")
    assert scheduler_kind() == "threads"
