"""No server a test starts outlives the test run, however the run ends: SIGTERM, Ctrl-C, or SIGKILL.

A test process's fixtures stop their ``dask scheduler``, ``dask worker`` and S3 server processes when
they finish, but a run stopped by SIGKILL (a CI time limit, the OOM killer) runs no ``finally``. So each
server is started in a process group of its own (``start_new_session``: a terminal's Ctrl-C does not
reach it mid-test either) and that group is given to a *reaper*: one small process per test process,
reading group numbers from a pipe. When the pipe closes -- the test process ended, whatever ended it --
the reaper ends every group still listed (SIGTERM, then SIGKILL after a few seconds) and exits.

Run as a script, this file is the reaper.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time

_REAPER: dict[int, subprocess.Popen] = {}  # by the test process's pid: a fork gets its own
_LOCK = threading.Lock()


def _reaper() -> subprocess.Popen:
    with _LOCK:
        reaper = _REAPER.get(os.getpid())
        if reaper is None or reaper.poll() is not None:
            reaper = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                text=True,
                start_new_session=True,  # out of the terminal's job: it outlives a Ctrl-C to do its work
            )
            _REAPER[os.getpid()] = reaper
            atexit.register(_close, reaper)
        return reaper


def _close(reaper: subprocess.Popen) -> None:
    if reaper.stdin is not None and not reaper.stdin.closed:
        reaper.stdin.close()
    reaper.wait(timeout=30)


def _tell(line: str) -> None:
    reaper = _reaper()
    assert reaper.stdin is not None
    reaper.stdin.write(line + "\n")
    reaper.stdin.flush()


def reaped(command: list[str], **options) -> subprocess.Popen:
    """``subprocess.Popen(command, **options)`` in a process group of its own, ended with the test process."""
    process = subprocess.Popen(command, start_new_session=True, **options)
    _tell(f"add {process.pid}")
    return process


def released(process: subprocess.Popen) -> None:
    """``process``'s group was stopped by its fixture: the reaper forgets it."""
    _tell(f"remove {process.pid}")


def _reap() -> None:
    """The reaper's loop: keep the groups listed on stdin; at its end, end those still listed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        action, _, number = line.strip().partition(" ")
        if number.isdigit():
            (groups.add if action == "add" else groups.discard)(int(number))
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        alive = set()
        for group in groups:
            try:
                os.killpg(group, sig)
                alive.add(group)
            except (ProcessLookupError, PermissionError):
                continue
        groups = alive
        deadline = time.monotonic() + wait
        while groups and time.monotonic() < deadline:
            groups = {group for group in groups if _group_alive(group)}
            time.sleep(0.1)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    _reap()
