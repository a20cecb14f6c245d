"""A test run killed outright leaves no server behind: the reaper ends what the test process started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

# A stand-in for a test process: starts a server that would run for ever (a sleeping Python with a child of
# its own, as `dask worker` has its worker processes), says its group, then waits to be killed.
STARTER = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from reaper import reaped
    server = reaped([sys.executable, "-c",
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "time.sleep(600)"])
    print(server.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    # A process ended but not yet reaped by its parent is no longer running.
    states = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:
                states.append(fields[0])
    return any(state != "Z" for state in states)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_test_process_leaves_no_server_running(signum):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(TESTS)], stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    group = int(starter.stdout.readline())
    starter.stdout.close()
    assert _alive(group)
    starter.send_signal(signum)
    starter.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(group):
        assert time.monotonic() < deadline, "the server outlived the process that started it"
        time.sleep(0.1)
