"""A daskstream command signalled while it works: what the signal tests of several modules share."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

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
    except subprocess.TimeoutExpired:
        process.send_signal(signum)
        status = process.wait(timeout=within)
    else:
        pytest.fail(f"the command ended before it was signalled: {process.stderr.read()}")  # type: ignore[union-attr]
    finally:
        process.kill()
    assert process.stderr is not None
    lines = process.stderr.read().strip().splitlines()
    process.stderr.close()
    return status, lines


def assert_stopped_by(status: int, lines: list[str], signum: int) -> None:
    """The exit status and the one last line a command stopped by ``signum`` gives."""
    assert status == 128 + signum
    assert lines[-1].startswith(f"daskstream: stopped by {signal.Signals(signum).name}")
