"""The ``daskstream`` command's answer to a signal outside its work: while it starts, and after it finished.

Python's own answer to SIGINT while modules import is a ``KeyboardInterrupt``
traceback and exit status 1 (or -2); to SIGTERM, an exit with no word at all.
The command says one line and exits with the shell's status (130, 143) at any
moment: within a command's work :mod:`daskstream.runtime.stopping` answers
(stopping the work cleanly); before it -- the first second, spent importing
dask, numpy and daskstream -- and after it -- printing, the interpreter's
shutdown -- these handlers do, which have nothing to clean up.

Only the command's own process takes them (:func:`command_process`): a
program importing daskstream keeps its signal handlers as it set them.
Standard library only: this module runs before anything else is imported.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
from types import FrameType

__all__ = ["command_process", "finished", "stop_cleanly_outside_work"]

#: What the command is doing when a signal finds no work to stop, for its one line.
_PHASE = {"now": "while starting; nothing was done"}


def command_process() -> bool:
    """Whether this process is the ``daskstream`` command (the console script or ``python -m daskstream``).

    Not a process the command's scheduler or cluster started: a spawned worker imports daskstream with the
    command's ``sys.argv`` but its own interpreter command line, and is stopped by the command, silently.
    """
    started = " ".join(getattr(sys, "orig_argv", ()))
    if "--multiprocessing-fork" in started or "spawn_main" in started or "forkserver" in started:
        return False
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    if program in ("daskstream", "daskstream.exe"):
        return True
    arguments = list(getattr(sys, "orig_argv", ()))
    run_as_module = ("-m", "daskstream") in itertools.pairwise(arguments)
    return run_as_module and program in ("-m", "__main__.py")


def _one_line_and_exit(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    # os.write and os._exit: nothing here may wait on a lock a thread interrupted mid-print holds.
    os.write(2, f"\ndaskstream: stopped by {name} {_PHASE['now']}\n".encode())
    os._exit(128 + signum)


def stop_cleanly_outside_work() -> None:
    """In the command's process, answer SIGINT and SIGTERM with one line and the shell's exit status."""
    if not command_process():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _one_line_and_exit)


def finished() -> None:
    """The command's work is done: a signal from now on says so."""
    _PHASE["now"] = "after its work was done"


# Importing this module, first of daskstream's (see daskstream/__init__.py), is what sets them.
stop_cleanly_outside_work()
