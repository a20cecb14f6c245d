"""Bytes read, counted wherever the reading tasks run: threads, processes, workers."""

from __future__ import annotations

import json

import numpy as np
import pytest

import daskstream as ds
from daskstream.runtime.metering import ReadMeter
from daskstream.runtime.session import session


@pytest.fixture
def npy(tmp_path):
    data = np.random.default_rng(3).standard_normal((2000, 300))
    path = tmp_path / "field.npy"
    np.save(path, data)
    return str(path), data


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes", "distributed"])
def test_one_pass_reads_each_byte_once_on_every_scheduler(npy, scheduler):
    path, data = npy
    with session(scheduler, progress=False) as s:
        x = ds.open(path, chunks=(250, 300))
        with ReadMeter(s) as meter:
            (total,) = s.compute(x.sum())
    assert total == pytest.approx(data.sum(), rel=1e-12)
    assert meter.bytes_read == data.nbytes


def test_workers_of_a_running_cluster_are_counted(npy, dask_cluster):
    path, data = npy
    address = json.loads(dask_cluster.read_text())["address"]
    with session(address, progress=False) as s:
        x = ds.open(path, chunks=(100, 300))
        with ReadMeter() as meter:
            (column_means,) = s.compute(x.mean(axis=0))
    np.testing.assert_allclose(column_means, data.mean(axis=0), rtol=1e-12)
    assert meter.bytes_read == data.nbytes


@pytest.mark.parametrize(
    ("dtype", "budget", "passes"),
    [("f8", "24MiB", 4), ("f4", "24MiB", 2), ("i2", "24MiB", 1), ("f8", "8MiB", 8), ("f8", None, 1)],
    ids=["f8", "f4", "i2", "f8-narrow-digits", "f8-values-fit-a-task"],
)
def test_exact_median_reads_the_data_once_per_radix_pass(npy, tmp_path, dtype, budget, passes):
    # At 24 MiB the values (in float64 copies) do not fit a task, their counts do: 16 bits of the keys per
    # pass; at 8 MiB 8 bits. A later pass must not read an earlier pass's data again, neither for the state
    # it hands on (a few bytes, held) nor its blocks (nor hold them in memory waiting for it). With the
    # default budget the values fit one task: numpy's selection, one read.
    _, data = npy
    values = (data * 1000).astype(dtype)
    path = tmp_path / f"{dtype}.npy"
    np.save(path, values)
    x = ds.open(path, chunks=(400, 300), memory_budget=budget)
    with ReadMeter() as meter:
        median = ds.reduce(x, "median").compute(scheduler="threads")
    assert median == np.median(values)
    assert meter.bytes_read == passes * values.nbytes


def test_bytes_read_is_unknown_for_a_process_pool_outside_a_session(npy):
    import dask

    path, data = npy
    with dask.config.set(scheduler="processes"), ReadMeter() as meter:
        assert ds.open(path).sum().compute() == pytest.approx(data.sum())
    assert meter.bytes_read is None
