"""Stores into an S3 API (moto's server on 127.0.0.1): exact, resumable after a kill, secrets kept, clear errors."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from s3_helpers import running_s3_server

import daskstream as ds
from daskstream.compute.store.object_target import ObjectZarrTarget
from daskstream.errors import InvalidArgumentError, TargetExistsError


def _array(shape=(240, 180), chunks=(60, 60), seed=1):
    return da.random.default_rng(seed).standard_normal(shape, chunks=chunks).astype("f4")


def _zarr_at(s3, url, path=""):
    return zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=s3.options), path=path, mode="r")


def _objects(s3, url):
    return sorted(p.split("/", 2)[2] for p in s3.fs.find(url.removeprefix("s3://")))


@pytest.mark.parametrize(
    ("kwargs", "chunk_objects"),
    [({}, 12), ({"zarr_format": 2}, 12), ({"inner_chunks": (30, 30)}, 12)],
    ids=["v3", "v2", "sharded"],
)
def test_a_store_to_s3_puts_each_chunk_once_whole_and_reads_back_exactly(s3, kwargs, chunk_objects):
    x = _array()
    expected = x.compute()
    url = f"s3://{s3.bucket()}/out.zarr"
    s3.reset()
    y = ds.store(x, url, storage_options=s3.options, **kwargs)
    puts = s3.requests().get("PUT", 0)
    # One PUT per chunk (or shard) object, plus the metadata and a handful of progress records.
    assert chunk_objects <= puts <= chunk_objects + 5, puts
    np.testing.assert_array_equal(_zarr_at(s3, url)[...], expected)  # zarr is the oracle
    np.testing.assert_array_equal(y.compute(), expected)
    left = _objects(s3, url)
    # Finished: only the record of what was computed is left of the progress record.
    assert [k for k in left if k.startswith(".daskstream-store")] == [".daskstream-store/complete.json"]


def test_the_same_store_again_finds_it_complete_and_puts_no_chunk(s3):
    x = _array()
    url = f"s3://{s3.bucket()}/out.zarr"
    ds.store(x, url, storage_options=s3.options)
    s3.reset()
    ds.store(x, url, storage_options=s3.options)
    assert s3.requests().get("PUT", 0) == 0
    with pytest.raises(TargetExistsError, match="finished store of another computation"):
        ds.store(x + 1, url, storage_options=s3.options)


def test_a_member_of_a_group_on_s3_and_the_source_onto_itself(s3):
    x = _array()
    url = f"s3://{s3.bucket()}/g.zarr"
    y = ds.store(x, f"{url}::runs/a", storage_options=s3.options)
    np.testing.assert_array_equal(_zarr_at(s3, url, "runs/a")[...], x.compute())
    with pytest.raises(InvalidArgumentError, match="which is this very target"):
        ds.store(y * 2, f"{url}::runs/a", storage_options=s3.options, overwrite=True)
    np.testing.assert_array_equal(_zarr_at(s3, url, "runs/a")[...], x.compute())  # nothing was lost


def test_hdf5_targets_on_object_stores_are_refused_with_what_to_do(s3):
    with pytest.raises(InvalidArgumentError, match="store writes Zarr to object stores"):
        ds.store(_array(), f"s3://{s3.bucket()}/out.h5::/x", storage_options=s3.options)


def test_no_secret_travels_to_the_tasks_that_write(s3):
    url = f"s3://{s3.bucket()}/out.zarr"
    options = {**s3.options, "key": "testing", "secret": "sup3r-s3cret-value"}
    x = _array()
    target = ObjectZarrTarget(url, None, "default", 3, storage_options=options)
    ds.store(x, url, storage_options=options)
    assert b"sup3r-s3cret-value" not in pickle.dumps(target._chunk_writer())
    # Process workers unpickle the writer without the secret and write with their environment's credentials.
    with dask.config.set(scheduler="processes", num_workers=2):
        y = ds.store(x * 2, f"s3://{s3.bucket()}/twice.zarr", storage_options=options)
    np.testing.assert_array_equal(y.compute(), x.compute() * 2)


@pytest.fixture
def slow_s3(s3):
    """A server of its own whose every request waits 20 ms, so that a store runs long enough to be killed
    (with the credentials ``s3`` puts in the environment)."""
    with running_s3_server(latency=0.02) as server:
        yield server


def test_a_killed_cli_store_resumes_writing_only_what_it_had_not_recorded(slow_s3, tmp_path):
    s3 = slow_s3
    data = np.random.default_rng(3).standard_normal((2048, 512)).astype("f4")
    source = tmp_path / "field.npy"
    np.save(source, data)
    url = f"s3://{s3.bucket()}/field.zarr"
    endpoint = f"client_kwargs.endpoint_url={s3.endpoint}"
    command = [sys.executable, "-m", "daskstream", "store", str(source), url, "--storage-option", endpoint, "--quiet"]
    # Blocks of 18 rows (36 KiB, over a hundred), a record every 4 blocks, one writing thread: seconds.
    env = {
        **os.environ,
        "DASK_DASKSTREAM__OBJECTS__RECORD_EVERY__BLOCKS": "4",
        "DASK_DASKSTREAM__OBJECTS__WRITE_THREADS": "1",
        "DASK_NUM_WORKERS": "1",
    }
    chunks = ["--budget", "256KiB"]
    proc = subprocess.Popen([*command, *chunks], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    records = url.removeprefix("s3://") + "/.daskstream-store/done"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if len(s3.fs.find(records)) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    chunk_objects = [k for k in _objects(s3, url) if k.startswith("c/")]
    assert chunk_objects, "the killed store had written some chunks"

    s3.reset()
    done = subprocess.run([*command, *chunks, "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    # The two records seen before the kill hold 8 blocks, which are not written again...
    assert summary["blocks_written"] <= summary["blocks"] - 8
    # ...and the rest are: a PUT each, a record per 4 blocks, the completion record.
    assert s3.requests().get("PUT", 0) <= summary["blocks_written"] * 1.25 + 3
    np.testing.assert_array_equal(_zarr_at(s3, url)[...], data)


def test_the_cli_stores_to_s3_with_storage_options_and_reads_it_back(s3, tmp_path):
    data = np.arange(40_000, dtype="i4").reshape(200, 200)
    np.save(tmp_path / "a.npy", data)
    url = f"s3://{s3.bucket()}/a.zarr"
    option = ["--storage-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    run = subprocess.run(
        [sys.executable, "-m", "daskstream", "store", str(tmp_path / "a.npy"), url, *option, "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["blocks_written"] == summary["blocks"]
    assert 0 < summary["bytes_stored"] < data.nbytes
    info = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", url, *option, "--json"], capture_output=True, text=True
    )
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["shape"] == [200, 200]
    total = subprocess.run(
        [sys.executable, "-m", "daskstream", "reduce", url, "--op", "sum", *option, "--json", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert total.returncode == 0, total.stderr
    assert json.loads(total.stdout)["result"] == int(data.sum())


def test_an_adaptive_store_to_s3_puts_each_chunk_once_and_starts_from_the_targets_threads(s3, tmp_path):
    values = np.random.default_rng(5).standard_normal((8192, 256)).astype("f4")
    np.save(tmp_path / "a.npy", values)
    url = f"s3://{s3.bucket()}/adaptive.zarr"
    with dask.config.set(
        {
            "daskstream.tune.cache": str(tmp_path / "tune.json"),
            "daskstream.adaptive.min-seconds": 0,
            "daskstream.adaptive.trial-fraction": 0.5,
            "daskstream.memory-budget": "64MiB",
            "daskstream.planning.target-chunk-bytes": "64KiB",
            "daskstream.planning.task-overhead": "10us",  # a scheduler that keeps up with tasks this small
            "daskstream.objects.task-bytes": "64KiB",
            "daskstream.objects.write-threads": 4,
            "daskstream.adaptive.tasks-per-thread": 1,
            "scheduler": "threads",
        }
    ):
        x = ds.open(str(tmp_path / "a.npy"))
        chunks = -(-values.shape[0] // x.chunks[0][0])
        s3.reset()
        stored = ds.store(x * 2, url, storage_options=s3.options, adaptive=True)
    adaptation = stored.adaptation
    assert adaptation.adapted, adaptation.explain()
    # The planner's setting writes with the threads the object-store target writes with (more than the cores).
    assert adaptation.tried[0].threads > 2
    puts = s3.requests().get("PUT", 0)
    assert chunks <= puts <= chunks + 8, puts
    np.testing.assert_array_equal(_zarr_at(s3, url)[...], values * 2)


def test_a_store_of_spans_to_s3_puts_each_chunk_once_and_records_them(s3, tmp_path):
    # Few enough tasks in a graph that this small array is read in spans: each task writes many chunks.
    data = np.random.default_rng(3).standard_normal((24_000, 40, 6)).astype("f4")
    zarr.create_array(tmp_path / "a.zarr", data=data, chunks=(20, 40, 6))
    url = f"s3://{s3.bucket()}/spans.zarr"
    with dask.config.set({"daskstream.planning.max-tasks": 24, "daskstream.planning.first-task-within": None}):
        x = ds.open(str(tmp_path / "a.zarr"), memory_budget="16MiB")
        chunks = ds.plan(str(tmp_path / "a.zarr"), memory_budget="16MiB").n_tasks
        assert x.npartitions < chunks
        s3.reset()
        y = ds.store(x * 2, url, storage_options=s3.options)
    assert y.result.written == chunks
    # One PUT per chunk, plus the metadata and a handful of progress records.
    assert chunks <= s3.requests().get("PUT", 0) <= chunks + 5
    np.testing.assert_array_equal(_zarr_at(s3, url)[...], data * 2)
