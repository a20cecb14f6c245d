"""Shared fixtures: real files and a real dask cluster of separate processes on 127.0.0.1."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr
from reaper import reaped, released
from stream_helpers import N, indexed


@pytest.fixture(autouse=True, scope="session")
def _private_tune_cache(tmp_path_factory):
    """Keep the tuning cache of the whole run (and of its subprocesses) out of the user's cache folder."""
    import dask.config

    path = str(tmp_path_factory.mktemp("tune-cache") / "tune.json")
    before = os.environ.get("DASK_DASKSTREAM__TUNE__CACHE")
    os.environ["DASK_DASKSTREAM__TUNE__CACHE"] = path
    try:
        with dask.config.set({"daskstream.tune.cache": path}):
            yield path
    finally:
        if before is None:
            del os.environ["DASK_DASKSTREAM__TUNE__CACHE"]
        else:
            os.environ["DASK_DASKSTREAM__TUNE__CACHE"] = before


@pytest.fixture(autouse=True)
def _fresh_handles():
    """Tests rewrite files under the same names: start each with no cached file handles."""
    from daskstream.sources.handles import forget_handles

    forget_handles()
    yield
    forget_handles()


@contextlib.contextmanager
def dask_processes(
    folder: Path,
    *,
    options: tuple[str, ...] = (),
    security=None,
    nworkers: int = 2,
    memory_limit: str = "1GiB",
    scheduler_options: tuple[str, ...] = (),
    worker_options: tuple[str, ...] = (),
):
    """A ``dask scheduler`` and ``nworkers`` single-threaded ``dask worker`` processes on 127.0.0.1.

    Yields the scheduler file path once the workers have joined. The processes
    are real, started from the command line as a user would, and killed on exit.
    ``options`` go to both commands (the TLS flags, say), ``scheduler_options``
    and ``worker_options`` to one (a ``--preload``, say); ``security`` is what
    a Client needs to check that the workers joined.
    """
    scheduler_file = folder / "scheduler.json"
    dask = shutil.which("dask")
    base = [dask] if dask else [sys.executable, "-m", "dask"]
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    logs = [(folder / "scheduler.log").open("w"), (folder / "workers.log").open("w")]
    # Each in a process group of its own, which the reaper ends if this test process dies (see reaper.py).
    scheduler = reaped(
        [*base, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
         "--scheduler-file", str(scheduler_file), *options, *scheduler_options],
        stdout=subprocess.DEVNULL, stderr=logs[0], env=env,
    )  # fmt: skip
    workers = []
    try:
        _wait_for(scheduler_file.exists, "the scheduler file", scheduler)
        workers.append(
            reaped(
                [*base, "worker", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--nworkers",
                 str(nworkers), "--nthreads", "1", "--memory-limit", memory_limit, "--no-dashboard", *options,
                 *worker_options],
                stdout=subprocess.DEVNULL, stderr=logs[1], env=env,
            )
        )  # fmt: skip
        from distributed import Client

        with Client(scheduler_file=str(scheduler_file), security=security, timeout="30s") as client:
            client.wait_for_workers(nworkers, timeout=60)
        yield scheduler_file
    finally:
        for proc in [*workers, scheduler]:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in [*workers, scheduler]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            released(proc)
        for log in logs:
            log.close()


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory):
    """A real scheduler and two one-thread, 1 GiB workers on 127.0.0.1 (see :func:`dask_processes`)."""
    with dask_processes(tmp_path_factory.mktemp("cluster")) as scheduler_file:
        yield scheduler_file


@pytest.fixture
def start_dask_processes():
    """:func:`dask_processes` for one test: call it with the same arguments; stopped after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *args, **kwargs: stack.enter_context(dask_processes(*args, **kwargs))


def _wait_for(condition, what, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"the process waiting for {what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def sample_files(tmp_path) -> dict[str, tuple[str, np.ndarray]]:
    """The same float32 array as .npy, HDF5 (chunked gzip), HDF5 contiguous, Zarr v2 and v3 (sharded)."""
    import h5py
    import zarr

    rng = np.random.default_rng(42)
    data = rng.standard_normal((300, 70)).astype("f4")
    files = {}
    npy = tmp_path / "a.npy"
    np.save(npy, data)
    files["npy"] = (str(npy), data)
    h5 = tmp_path / "a.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("chunked", data=data, chunks=(32, 16), compression="gzip", shuffle=True)
        f.create_dataset("contiguous", data=data)
    files["hdf5-chunked"] = (f"{h5}::/chunked", data)
    files["hdf5-contiguous"] = (f"{h5}::/contiguous", data)
    v2 = zarr.create_array(tmp_path / "v2.zarr", shape=data.shape, chunks=(40, 30), dtype="f4", zarr_format=2)
    v2[...] = data
    files["zarr-v2"] = (str(tmp_path / "v2.zarr"), data)
    v3 = zarr.create_array(tmp_path / "v3.zarr", shape=data.shape, chunks=(20, 35), shards=(60, 70), dtype="f4")
    v3[...] = data
    files["zarr-v3-sharded"] = (str(tmp_path / "v3.zarr"), data)
    return files


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture
def full_opens(monkeypatch):
    """How many times each HDF5 file's full metadata was read (a daskstream source of a dataset in it opened)."""
    from daskstream.sources.hdf5.source import Hdf5Source

    opened = collections.Counter()
    describe = Hdf5Source._describe

    def counted(self, dset, h5py, in_this_file):
        opened[self.path] += 1
        return describe(self, dset, h5py, in_this_file)

    monkeypatch.setattr(Hdf5Source, "_describe", counted)
    return opened


@pytest.fixture
def arrays(tmp_path) -> tuple[str, str]:
    """Features as .npy (rows numbered in their first column) and labels (ten times the number) as Zarr."""
    np.save(tmp_path / "x.npy", indexed())
    zarr.create_array(str(tmp_path / "y.zarr"), shape=(N,), chunks=(100,), dtype="i8")[...] = np.arange(N) * 10
    return str(tmp_path / "x.npy"), str(tmp_path / "y.zarr")


@pytest.fixture(scope="module")
def span_field(tmp_path_factory):
    """The field the tests of spans read (``compute/span_helpers.write_field``), written once for a module's
    tests: they only read it."""
    from span_helpers import write_field  # on the path of the test modules under compute/ that ask for it

    return write_field(tmp_path_factory.mktemp("field"))


@pytest.fixture
def spanned():
    """Few enough tasks in a graph that the field is planned in spans."""
    from span_helpers import SPANNED

    with dask.config.set(SPANNED):
        yield
