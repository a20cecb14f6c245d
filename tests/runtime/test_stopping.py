"""Ctrl-C and SIGTERM on the command line: real subprocesses signalled mid-run stop, keep what they finished,
say in one line how to go on, and exit with the shell's status; the store then resumes to the exact data.

Each run is signalled as soon as it shows it has started writing (a block marked done, or the HDF5
file growing); a store that went on after the signal would write every block and is caught by the
count. How fast it stops is measured in benchmarks/bench_stop.py, not here.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import dask.array as da
import h5py
import numpy as np
import pytest
import zarr

from daskstream.compute.store.record import DONE_DIR, H5_DONE_ATTR, PROGRESS_DIR
from daskstream.runtime.stopping import Interrupted, stopping_on_signals

# gzip of random numbers is slow (some 20 MB/s a core): a few seconds of work in blocks of a MiB or two.
SHAPE = (4096, 4096)
STORE = ["--codec", "gzip", "--memory-budget", "8MiB"]


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    path = tmp_path_factory.mktemp("stop") / "field.npy"
    data = np.random.default_rng(3).standard_normal(SHAPE).astype("f4")
    np.save(path, data)
    return path, data


@pytest.fixture(scope="module")
def tall_field(tmp_path_factory):
    # A median or quartiles of `field` take under a second, about when the progress bar first shows (0.5 s):
    # four times the rows run for some seconds, time to be stopped mid-way on a fast machine too.
    path = tmp_path_factory.mktemp("stop") / "tall.npy"
    np.save(path, np.random.default_rng(4).standard_normal((4 * SHAPE[0], SHAPE[1])).astype("f4"))
    return path


def _daskstream(*args, job=False):
    # job: a process group of its own, as a shell starts a command; Ctrl-C signals the whole group.
    return subprocess.Popen(
        [sys.executable, "-m", "daskstream", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=job,
    )


def _wait_until(started, process, limit=120.0):
    deadline = time.monotonic() + limit
    while not started():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command never started writing"
        time.sleep(0.02)


def _zarr_done(target):
    folder = target / PROGRESS_DIR / DONE_DIR
    return len(os.listdir(folder)) if folder.is_dir() else 0


def _last_line(stderr):
    # Progress bars redraw with carriage returns: the last line is what stays on the screen.
    return stderr.replace("\r", "\n").strip().splitlines()[-1]


STOPPED = {
    signal.SIGINT: "daskstream: stopped by SIGINT; the blocks written so far are kept: run the same command "
    "again to resume (it writes only the rest)",
    signal.SIGTERM: "daskstream: stopped by SIGTERM; the blocks written so far are kept: run the same command "
    "again to resume (it writes only the rest)",
}


@pytest.mark.parametrize(
    ("scheduler", "signum", "extra"),
    [
        ("threads", signal.SIGINT, ()),
        ("threads", signal.SIGTERM, ()),
        ("processes", signal.SIGINT, ()),  # the pool's workers would first run every task queued to them
        ("processes", signal.SIGTERM, ()),
        ("distributed", signal.SIGINT, ()),  # a LocalCluster of worker processes: its tasks cancelled
        ("threads", signal.SIGINT, ("--adaptive",)),  # waves of blocks, tried and chosen while it runs
        # Ctrl-C in a terminal: every process of the job is signalled, the workers too. They leave the
        # stopping to this process: no traceback of theirs on the screen, no task cut short.
        ("processes", signal.SIGINT, ("job",)),
        ("distributed", signal.SIGINT, ("job",)),
    ],
    ids=[
        "threads-SIGINT",
        "threads-SIGTERM",
        "processes-SIGINT",
        "processes-SIGTERM",
        "distributed-SIGINT",
        "adaptive-SIGINT",
        "processes-Ctrl-C",
        "distributed-Ctrl-C",
    ],
)
def test_a_store_into_zarr_stops_on_a_signal_keeps_its_blocks_and_resumes(field, tmp_path, scheduler, signum, extra):
    path, data = field
    target = tmp_path / "out.zarr"
    job = "job" in extra
    args = ["store", path, target, *STORE, "--scheduler", scheduler, *(flag for flag in extra if flag != "job")]
    process = _daskstream(*args, job=job)
    _wait_until(lambda: _zarr_done(target) >= 1, process)
    if job:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    assert _last_line(stderr) == STOPPED[signum]
    assert "Traceback" not in stderr
    chunks = zarr.open_array(str(target), mode="r").chunks
    total = math.prod(-(-n // c) for n, c in zip(SHAPE, chunks))
    kept = _zarr_done(target)
    assert 1 <= kept < total  # stopped: it did not go on to write every block
    again = _daskstream(*args, "--json")
    out, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr
    assert f'"blocks_written": {total - kept},' in out  # only the rest
    np.testing.assert_array_equal(zarr.open_array(str(target), mode="r")[...], data)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_store_into_hdf5_stops_on_a_signal_with_the_file_readable_and_resumes(field, tmp_path, signum):
    # SIGTERM would end Python at once, HDF5 file open for writing: without a journal, often unreadable.
    path, data = field
    target = tmp_path / "out.h5"
    args = ["store", path, f"{target}::/x", *STORE]
    process = _daskstream(*args)
    _wait_until(lambda: target.exists() and target.stat().st_size > 4 * 2**20, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    assert _last_line(stderr) == STOPPED[signum]
    with h5py.File(target, "r") as f:
        done = np.unpackbits(f["x"].attrs[H5_DONE_ATTR])
        total = math.prod(-(-n // c) for n, c in zip(SHAPE, f["x"].chunks))
        assert 1 <= done[:total].sum() < total
    again = _daskstream(*args)
    _, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr
    with h5py.File(target, "r") as f:
        np.testing.assert_array_equal(f["x"][...], data)


@pytest.mark.parametrize(
    "command",
    [
        ["reduce", "--op", "median", "--axis", "0"],
        ["describe", "--quartiles"],
    ],
    ids=["reduce", "describe"],
)
def test_a_reduction_stops_on_ctrl_c_with_one_line(tall_field, tmp_path, command):
    path = tall_field
    out = tmp_path / "result.zarr"
    process = _daskstream(command[0], path, *command[1:], "--out", out, "--memory-budget", "8MiB")
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: process.stderr.read(1), "")), daemon=True)
    reader.start()
    # Signalled once its progress bar shows: the computation has run for half a second.
    _wait_until(lambda: "%|" in "".join(seen), process)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=120)
    reader.join(timeout=10)
    process.stdout.close()
    process.stderr.close()
    stderr = "".join(seen)
    assert process.returncode == 130, stderr
    assert (
        _last_line(stderr) == "daskstream: stopped by SIGINT; nothing was written; run the command again to start over"
    )
    assert "Traceback" not in stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial result left behind


# ---------------------------------------------------------------------------
# Where the stop is raised, in this process


def _raised_in(info: pytest.ExceptionInfo) -> tuple[str, str]:
    """The file name and function of the frame the signal handler raised the stop in."""
    names = [entry.name for entry in info.traceback]
    frame = info.traceback[names.index("_on_signal") - 1]
    return os.path.basename(str(frame.path)), frame.name


def _busy(seconds: float) -> None:
    """Run Python code for ``seconds``: where Python itself would raise KeyboardInterrupt."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _signal_in_a_locked_region_then_wait(lock: threading.Lock, finished: list[str]) -> None:
    with stopping_on_signals():
        with lock:
            os.kill(os.getpid(), signal.SIGINT)
            _busy(0.3)
            finished.append("locked region")
        threading.Event().wait(60)


def test_a_signal_is_raised_where_the_main_thread_waits_not_where_it_holds_a_lock():
    lock = threading.Lock()
    finished: list[str] = []
    with pytest.raises(Interrupted) as info:
        _signal_in_a_locked_region_then_wait(lock, finished)
    assert finished == ["locked region"]
    assert not lock.locked()
    # Raised in the wait (an Event's wait is a Condition's), not at the end of the block a minute later.
    assert _raised_in(info) == ("threading.py", "wait")


class _Held:
    pass


def _signal_in_a_weak_reference_callback_then_wait() -> weakref.ref:
    def busy_when_collected(reference):
        os.kill(os.getpid(), signal.SIGINT)
        _busy(0.2)

    with stopping_on_signals():
        held = _Held()
        reference = weakref.ref(held, busy_when_collected)
        del held  # the callback runs now, and would swallow an exception raised in it
        threading.Event().wait(60)
    return reference


def test_a_signal_that_comes_in_a_weak_reference_callback_is_not_lost(capfd):
    with pytest.raises(Interrupted) as info:
        _signal_in_a_weak_reference_callback_then_wait()
    assert _raised_in(info) == ("threading.py", "wait")
    assert "Exception ignored" not in capfd.readouterr().err


def _signal_then_no_wait(signum: int) -> None:
    with stopping_on_signals():
        os.kill(os.getpid(), signum)
        _busy(0.2)


def test_a_stop_asked_after_the_last_wait_is_raised_as_the_block_ends():
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info:
        _signal_then_no_wait(signal.SIGTERM)
    assert info.value.exit_status == 128 + signal.SIGTERM
    # The handlers are as they were, and a later block starts with no stop asked.
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    with stopping_on_signals():
        threading.Event().wait(0.1)


_SLOW_BLOCKS_RUN: list[int] = []


def _slow_block(block):
    _SLOW_BLOCKS_RUN.append(1)
    time.sleep(0.02)
    return block


def _sum_of_slow_blocks() -> None:
    x = da.ones((400, 100), chunks=(1, 100)).map_blocks(_slow_block, dtype=float)
    with stopping_on_signals():
        x.sum().compute(scheduler="threads", num_workers=2)


def test_a_stop_reaches_a_computation_on_threads_at_once():
    _SLOW_BLOCKS_RUN.clear()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(Interrupted):
        _sum_of_slow_blocks()
    assert len(_SLOW_BLOCKS_RUN) < 400  # stopped: each block takes 20 ms, the whole some 4 s
