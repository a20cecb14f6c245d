"""Faults with real processes: a worker killed mid-computation, and a kernel failing on one block."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import KernelError

SLOW_KERNEL = """
import time


def slow_double(block):
    time.sleep(0.05)  # long enough that the computation is still running when a worker dies
    return block * 2
"""


def test_a_worker_killed_mid_reduction_still_gives_the_exact_answer(tmp_path, start_dask_processes, monkeypatch):
    from distributed import Client, wait

    # The kernel lives in a module both this process and the workers import, as a user's would.
    (tmp_path / "slowkernels.py").write_text(SLOW_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    import slowkernels

    data = np.arange(400 * 64, dtype="f8").reshape(400, 64)  # integers: the sum is exact in float64
    path = tmp_path / "x.npy"
    np.save(path, data)
    scheduler_file = start_dask_processes(tmp_path, nworkers=2)
    with Client(scheduler_file=str(scheduler_file), timeout="30s") as client:
        pids = client.run(os.getpid)
        x = ds.open(str(path), chunks=(10, 64))  # 40 blocks of 50 ms each, on two one-thread workers
        future = client.compute(ds.reduce(ds.map_blocks(slowkernels.slow_double, x, dtype="f8"), "sum"))
        deadline = time.monotonic() + 30
        while not any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # some blocks done and held by the worker about to die
        victim = sorted(pids.values())[0]
        os.kill(victim, signal.SIGKILL)
        wait(future, timeout=120)
        assert future.status == "finished"
        assert future.result() == 2 * data.sum()
        # The nanny started a new worker process in place of the killed one.
        client.wait_for_workers(2, timeout=60)
        assert victim not in client.run(os.getpid).values()


def test_a_kernel_failing_on_one_block_names_it_and_the_session_goes_on(tmp_path):
    data = np.arange(100 * 10, dtype="f8").reshape(100, 10)
    np.save(tmp_path / "x.npy", data)

    def fails_on_block_three(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 3:
            raise ValueError("bad values here")
        return block

    with ds.session("threads", progress=False) as s:
        x = ds.open(str(tmp_path / "x.npy"), chunks=(10, 10))
        with pytest.raises(KernelError) as info:
            s.compute(ds.map_blocks(fails_on_block_three, x, dtype="f8").sum())
        assert "(3, 0)" in str(info.value)
        assert isinstance(info.value.__cause__, ValueError)
        # The same session computes the next thing as usual.
        assert s.compute(x.sum()) == data.sum()
