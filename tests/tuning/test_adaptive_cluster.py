"""Adaptive runs on a distributed cluster: waves as futures, the same answers, a target written once, and the
winner remembered apart from this process's threads."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import zarr
from adaptive_fields import SHAPE, write

import daskstream as ds
from daskstream.errors import KernelError
from daskstream.runtime.metering import ReadMeter

distributed = pytest.importorskip("distributed")

CLUSTER_SIZE = "2 workers x 1 thread"


@pytest.fixture(scope="module")
def cluster():
    """Two one-thread worker processes on 127.0.0.1, shared by this module's tests."""
    # Without a dashboard the scheduler still serves /health, on 8787 unless told otherwise: a free port
    # keeps it from colliding with another cluster's (and leaving a socket behind).
    with distributed.LocalCluster(
        host="127.0.0.1",
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
    ) as running:
        yield running


def data() -> np.ndarray:
    rng = np.random.default_rng(5)
    return (rng.standard_normal(SHAPE) * 100 + 1e4).astype("f4")


def assert_adapted_on(adaptation, cluster_kind: str) -> None:
    """Trials ran, on the cluster's threads, and the record says which cluster."""
    assert adaptation.adapted, adaptation.explain()
    assert adaptation.trial_bytes > 0
    assert len(adaptation.tried) >= 2
    assert adaptation.cluster.startswith(cluster_kind), adaptation.cluster
    assert CLUSTER_SIZE in adaptation.cluster
    # Every setting has the cluster's threads in flight; the rows per task are what is tried.
    assert {t.threads for t in adaptation.tried} == {2}
    assert len({t.chunks for t in adaptation.tried}) == len(adaptation.tried)
    assert f"on {adaptation.cluster}" in adaptation.explain()
    assert "in flight" in adaptation.explain()


def test_an_adaptive_mean_and_describe_on_a_cluster_adapt_and_give_numpys_answer(tmp_path, adaptive, cluster):
    values = data()
    path = write(tmp_path, "zarr", values)
    # A Client made the default, as a user's own.
    with distributed.Client(cluster):
        run = ds.reduce(path, "mean", axis=0, adaptive=True)
        with ReadMeter() as meter:
            means = run.compute()
        # The workers read every byte once: trial waves are part of the answer.
        assert meter.bytes_read == values.nbytes
    assert_adapted_on(run.adaptation, "LocalCluster")
    np.testing.assert_allclose(means, values.astype("f8").mean(axis=0), rtol=1e-9)
    # A session joining the cluster by its address.
    with ds.session(cluster.scheduler_address, progress=False):
        described = ds.describe(path, adaptive=True)
        stats = described.compute()
    assert_adapted_on(described.adaptation, "joined cluster")
    wide = values.astype("f8")
    np.testing.assert_allclose(stats["mean"], wide.mean(), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], wide.std(), rtol=1e-6)
    assert stats["min"] == values.min()
    assert stats["max"] == values.max()
    assert stats["count"] == values.size


def fails_where_flagged(block: np.ndarray, flag: str) -> np.ndarray:
    """``block + 1``, failing on negative values while the file ``flag`` exists (a store cut short)."""
    if os.path.exists(flag) and (block < 0).any():
        raise RuntimeError("interrupted on purpose")
    return block + 1


def test_an_adaptive_store_on_a_cluster_writes_each_block_once_and_resumes(tmp_path, adaptive, cluster):
    values = np.abs(data())
    values[-100] = -1.0  # the rows the interrupted store fails on: past every trial wave
    path = write(tmp_path, "zarr", values)
    with ds.session(cluster.scheduler_address, progress=False):
        with ReadMeter() as meter:
            copied = ds.store(ds.open(path), str(tmp_path / "copy.zarr"), adaptive=True)
        assert_adapted_on(copied.adaptation, "joined cluster")
        # Written from the workers, each block computed (read) once: the target is the source.
        assert meter.bytes_read == values.nbytes
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "copy.zarr"), mode="r")[:], values)
        again = ds.store(ds.open(path), str(tmp_path / "copy.zarr"), adaptive=True)
        assert "nothing was written" in again.adaptation.reason
        # Cut short after its trials: what its waves wrote stays written, and the store resumes from it.
        flag = tmp_path / "fail"
        flag.touch()
        y = ds.map_blocks(functools.partial(fails_where_flagged, flag=str(flag)), ds.open(path), dtype="f4")
        with pytest.raises(KernelError, match="interrupted on purpose"):
            ds.store(y, str(tmp_path / "resumed.zarr"), adaptive=True)
        done = os.listdir(tmp_path / "resumed.zarr" / ".daskstream-store" / "done")
        assert 0 < len(done) < SHAPE[0] // 64
        flag.unlink()
        resumed = ds.store(y, str(tmp_path / "resumed.zarr"), adaptive=True)
    assert "resumed" in resumed.adaptation.reason
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "resumed.zarr"), mode="r")[:], values + 1)


def test_a_clusters_choice_is_remembered_apart_from_this_process_threads(tmp_path, adaptive, cluster):
    path = write(tmp_path, "zarr", data())
    with ds.session(cluster.scheduler_address, progress=False):
        on_cluster = ds.reduce(path, "sum", adaptive=True)
        on_cluster.compute()
    assert on_cluster.adaptation.adapted
    # This process's threads do not start from the cluster's choice, nor the cluster from theirs.
    on_threads = ds.reduce(path, "sum", adaptive=True)
    on_threads.compute()
    assert on_threads.adaptation.started_from == "planner's setting"
    assert on_threads.adaptation.cluster is None
    keys = [e["key"] for e in adaptive.entries().values() if "adaptive" in e]
    assert len(keys) == 2
    (cluster_key,) = [k for k in keys if k["scheduler"] == "distributed"]
    (threads_key,) = [k for k in keys if k["scheduler"] == "threads"]
    assert cluster_key["cluster"] == f"joined cluster: {CLUSTER_SIZE}"
    assert "cluster" not in threads_key
    # The next run on a cluster of that kind and size starts from its choice.
    with ds.session(cluster.scheduler_address, progress=False):
        again = ds.reduce(path, "sum", adaptive=True)
        again.compute()
    assert "remembered" in again.adaptation.started_from
    assert again.adaptation.tried[0].threads == 2
