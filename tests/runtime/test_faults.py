"""Faults with real processes: a worker or the scheduler killed mid-computation, and a kernel failing on one block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import ClusterConnectionError, KernelError
from daskstream.runtime.metering import ReadMeter

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
        assert s.compute(x.sum()) == (data.sum(),)


# --- the scheduler killed ---------------------------------------------------------------------------


def _scheduler_of(scheduler_file) -> tuple[str, int]:
    """The scheduler's address and process id, asked of it by a Client closed again at once."""
    from distributed import Client

    address = json.loads(scheduler_file.read_text())["address"]
    with Client(address, timeout="30s") as client:
        return address, client.run_on_scheduler(os.getpid)


@pytest.mark.parametrize("progress", [False, True], ids=["quiet", "progress-bar"])
def test_a_scheduler_killed_mid_computation_is_one_clear_error_within_seconds(
    tmp_path, start_dask_processes, monkeypatch, progress
):
    (tmp_path / "slowkernels.py").write_text(SLOW_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    import slowkernels

    np.save(tmp_path / "x.npy", np.ones((400, 64)))
    address, scheduler_pid = _scheduler_of(start_dask_processes(tmp_path, nworkers=1))
    killed_at = []

    def kill_the_scheduler():
        killed_at.append(time.monotonic())
        os.kill(scheduler_pid, signal.SIGKILL)

    with ds.session(address, progress=progress) as s:
        x = ds.open(str(tmp_path / "x.npy"), chunks=(5, 64))  # 80 blocks of 50 ms on one thread: 4 s of work
        work = ds.reduce(ds.map_blocks(slowkernels.slow_double, x, dtype="f8"), "sum")
        killer = threading.Timer(1.0, kill_the_scheduler)
        meters = []

        def compute_while_counting() -> None:
            # The counting of bytes read is in the way too, as in `daskstream reduce`. The scheduler
            # is killed once the meter has asked the workers, so the loss comes during the computation.
            with ReadMeter(s) as meter:
                meters.append(meter)
                killer.start()
                s.compute(work)

        with pytest.raises(ClusterConnectionError) as info:
            compute_while_counting()
        (meter,) = meters
        raised_at = time.monotonic()
        killer.join()
    # Not a speed target: without the guard the Client waits out its 30 s reconnection timeout first.
    assert raised_at - killed_at[0] < 20, "the loss was reported only after the Client's reconnection timeout"
    message = str(info.value)
    assert message.startswith(f"lost the scheduler at {address} while computing 1 result(s)")
    assert "run again" in message
    assert meter.bytes_read is None  # nothing could be counted, and nothing waited to try


def test_a_call_that_breaks_as_the_scheduler_dies_is_the_lost_scheduler(tmp_path, start_dask_processes):
    # The connection breaks before the Client has noticed (its status still "running"): the error of the broken
    # connection to the scheduler, whatever distributed calls it, is the scheduler lost, said in one line.
    from distributed import Client

    from daskstream.runtime.scheduler_loss import close_client, guard_scheduler, lost_scheduler_error

    address, scheduler_pid = _scheduler_of(start_dask_processes(tmp_path, nworkers=1))
    client = Client(address, timeout="30s")
    try:
        os.kill(scheduler_pid, signal.SIGKILL)
        lost = pytest.raises(ClusterConnectionError, match=f"lost the scheduler at {address} while counting")
        with lost, guard_scheduler(client, "counting"):
            client.run(os.getpid)
        # A broken connection to another place (a worker) is not the scheduler's loss.
        elsewhere = ConnectionResetError(f"in <TCP (closed) local={address} remote=tcp://127.0.0.1:1>: reset")
        assert lost_scheduler_error(_RunningClient(address), elsewhere, "counting") is None
        named = ConnectionResetError(f"in <TCP (closed) local=tcp://127.0.0.1:1 remote={address}>: reset")
        assert isinstance(lost_scheduler_error(_RunningClient(address), named, "counting"), ClusterConnectionError)
    finally:
        close_client(client)


class _RunningClient:
    """What a Client shows of itself before it notices that its scheduler died."""

    status = "running"

    def __init__(self, address):
        self.scheduler = type("Scheduler", (), {"address": address})()


@pytest.mark.parametrize(
    ("command", "doing"),
    [(["reduce", "{x}", "--op", "median", "--json"], "while computing"), (["store", "{x}", "{out}"], "while working")],
    ids=["reduce", "store"],
)
def test_the_command_line_says_in_one_line_that_the_scheduler_was_lost(tmp_path, start_dask_processes, command, doing):
    from distributed import Client

    from daskstream.runtime.scheduler_loss import close_client

    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((6000, 2500)).astype("f4"))
    address, scheduler_pid = _scheduler_of(start_dask_processes(tmp_path, nworkers=1))
    watcher = Client(address, timeout="30s")
    args = [a.format(x=tmp_path / "x.npy", out=tmp_path / "out.zarr") for a in command]
    command = subprocess.Popen(
        [sys.executable, "-m", "daskstream", *args, "--scheduler", address, "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Killed as soon as the command's tasks reach the worker: the work takes a second or more after that.
        deadline = time.monotonic() + 60
        while not any(watcher.processing().values()):
            assert command.poll() is None, command.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(scheduler_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        out, err = command.communicate(timeout=60)
    finally:
        close_client(watcher)
        if command.poll() is None:
            command.kill()
            command.communicate()
    assert time.monotonic() - killed_at < 20  # before the Client's 30 s reconnection timeout
    assert command.returncode == 2, err
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"daskstream: error: lost the scheduler at {address} {doing}")
