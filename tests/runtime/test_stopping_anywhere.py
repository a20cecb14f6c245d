"""A signal lands wherever the main thread is: building a graph for minutes, starting up, after the work.

Real subprocesses signalled; how fast they stop is measured in benchmarks/stop.py, not here: these check
that they stop at all where they used to run on (a graph that takes minutes to build, stopped long before).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from signals import assert_stopped_by, signalled_command

# A graph dask takes minutes to build in pure Python (millions of blocks reduced), inside the stop's block.
BUILDING = textwrap.dedent(
    """
    import sys
    import dask.array as da
    from daskstream.runtime.stopping import Interrupted, stopping_on_signals
    try:
        with stopping_on_signals():
            x = da.ones((40_000, 40_000), chunks=20)
            print("building", flush=True)
            x.mean()
            print("built", flush=True)
    except Interrupted as stop:
        print("stopped", flush=True)
        sys.exit(stop.exit_status)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_graph_building_that_has_no_wait_in_it(signum):
    process = subprocess.Popen([sys.executable, "-c", BUILDING], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "building"
    process.send_signal(signum)
    try:
        # Building the graph takes minutes; stopping, a moment (a generous bound for a loaded machine).
        status = process.wait(timeout=60)
    finally:
        process.kill()
    rest = process.stdout.read()
    process.stdout.close()
    assert "built" not in rest
    assert rest.strip() == "stopped"
    assert status == 128 + signum


# The command, run as its console script runs it, writing its own peak resident size (VmHWM, of this
# program's memory alone: the rusage of a child also counts what it shared with its parent before exec).
PEAK_REPORTED = textwrap.dedent(
    """
    import atexit, runpy, sys
    peak_file = sys.argv.pop(1)

    def report():
        with open("/proc/self/status") as status, open(peak_file, "w") as out:
            out.write(next(line for line in status if line.startswith("VmHWM")))

    atexit.register(report)
    sys.argv[0] = "daskstream"
    runpy.run_module("daskstream", run_name="__main__")
    """
)


def _building_budget(path) -> int:
    """A budget that cuts the array at ``path`` into about half the blocks a graph may hold: seconds of building."""
    import math

    import daskstream as ds
    from daskstream.errors import DaskstreamError
    from daskstream.runtime.resources import resolve_settings

    ceiling, budget = resolve_settings().max_tasks, 1 << 12
    while True:
        with contextlib.suppress(DaskstreamError):
            if math.prod(ds.open(path, memory_budget=budget).numblocks) <= ceiling // 2:
                return budget
        budget *= 2


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_command_stops_while_dask_builds_its_graph_inside_the_scheduler(tmp_path, signum):
    # dask's local schedulers build the graph of an expression when they start, before any task or wait.
    path = tmp_path / "big.npy"
    header_only = np.lib.format.open_memmap(path, mode="w+", dtype="f4", shape=(100_000, 100_000))
    del header_only
    command = ["reduce", path, "--op", "mean", "--memory-budget", _building_budget(path), "--quiet"]
    # Past the start (about a second) and into the graph, which takes tens of seconds to build here.
    status, lines = signalled_command(list(map(str, command)), signum, after=4)
    assert_stopped_by(status, lines, signum)


@pytest.mark.parametrize("budget", ["1000", "3KiB"])
def test_an_absurd_budget_is_refused_from_the_block_count_before_any_graph(tmp_path, budget):
    # A 40 GB .npy whose data was never written (a sparse file): the budget cuts it into tens of millions of
    # blocks, whose graph took minutes and more memory than the machine has before it was refused.
    path = tmp_path / "big.npy"
    header_only = np.lib.format.open_memmap(path, mode="w+", dtype="f4", shape=(100_000, 100_000))
    del header_only
    for command in (["reduce", path, "--op", "mean"], ["describe", path], ["store", path, tmp_path / "out.zarr"]):
        peak_file = tmp_path / "peak"
        done = subprocess.run(
            [sys.executable, "-c", PEAK_REPORTED, peak_file, *map(str, command), "--memory-budget", budget],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert "needs at least" in lines[0]
        assert "--memory-budget" in lines[0]
        # Well under what building the graph would take (gigabytes).
        peak_kib = int(peak_file.read_text().split()[1])
        assert peak_kib < 400 * 1024, peak_kib
    assert not (tmp_path / "out.zarr").exists()


STARTING = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.argv[0] = "daskstream"  # as the console script names the process
    import daskstream.starting as starting
    if sys.argv[1] == "after":
        starting.finished()
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    time.sleep(30)
    """
)


@pytest.mark.parametrize("phase", ["starting", "after"])
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_the_command_answers_a_signal_outside_its_work_with_one_line(phase, name):
    done = subprocess.run([sys.executable, "-c", STARTING, phase, name], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + getattr(signal, name)
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"daskstream: stopped by {name} "
        + ("while starting; nothing was done" if phase == "starting" else "after its work was done")
    ]


def test_a_program_importing_daskstream_keeps_its_own_handlers():
    code = "import signal, daskstream; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"


def test_a_stopped_command_abandons_the_tasks_still_running_in_its_threads():
    import threading

    from daskstream.runtime.stopping import Interrupted, abandon_running_tasks, raise_if_stopped, stopping_on_signals

    # A task of a local scheduler's pool, checking between its chunks (as streaming tasks and writers do).
    checked, stopped_by = threading.Event(), []
    go_on = threading.Event()

    def task():
        while not go_on.wait(0.01):
            try:
                raise_if_stopped()
            except Interrupted as stop:
                stopped_by.append(stop.signal_name)
                return
            checked.set()

    thread = threading.Thread(target=task, daemon=True)
    thread.start()
    assert checked.wait(30)
    raise_if_stopped()  # the main thread outside a stop: nothing to raise
    assert stopped_by == []  # no stop asked: the task goes on
    abandon_running_tasks(signal.SIGTERM)  # the command is ending on SIGTERM
    thread.join(30)
    assert stopped_by == ["SIGTERM"]
    raise_if_stopped()  # the main thread is ending the command itself: not raised there
    # A computation started afterwards is not the one stopped: its tasks run.
    with stopping_on_signals():
        later = threading.Thread(target=task, daemon=True)
        checked.clear()
        later.start()
        assert checked.wait(30)
        go_on.set()
        later.join(30)
    assert stopped_by == ["SIGTERM"]
