"""A daskstream command signalled while it works: what the signal tests of several modules share."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest


def signalled_command(
    arguments: Sequence[str],
    signum: int,
    *,
    after: float,
    within: float = 60,
    environment: Mapping[str, str] | None = None,
) -> tuple[int, list[str]]:
    """Run ``python -m daskstream *arguments``, send ``signum`` once ``after`` seconds have passed, and return
    its exit status and the lines of its stderr, the command given ``within`` seconds to stop; fail the test
    where the command ended before it was signalled.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "daskstream", *arguments], stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        process.wait(timeout=after)
        pytest.fail(f"the command ended before it was signalled: {process.stderr.read()}")  # type: ignore[union-attr]
    except subprocess.TimeoutExpired:
        # On a loaded machine the interpreter may not have reached daskstream's import (which answers SIGINT
        # and SIGTERM at once) by then: a signal before it would test Python's start, not the command. Python
        # catches SIGINT itself from its start, SIGTERM only once daskstream does.
        _wait_until_caught(process, signal.SIGTERM, within)
        process.send_signal(signum)
        status = process.wait(timeout=within)
    finally:
        process.kill()
    assert process.stderr is not None
    lines = process.stderr.read().strip().splitlines()
    process.stderr.close()
    return status, lines


def _wait_until_caught(process: subprocess.Popen[str], signum: int, within: float) -> None:
    """Wait until ``process`` catches ``signum`` (its handler set, as Linux shows it in ``SigCgt``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:
            return  # no /proc here: signalled as it is
        caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
        if caught >> (signum - 1) & 1:
            return
        time.sleep(0.05)


def assert_stopped_by(status: int, lines: list[str], signum: int) -> None:
    """The exit status and the one last line a command stopped by ``signum`` gives."""
    assert status == 128 + signum
    assert lines[-1].startswith(f"daskstream: stopped by {signal.Signals(signum).name}")
