"""Stopping a long computation at once on SIGINT or SIGTERM, keeping what it finished.

Python raises :class:`KeyboardInterrupt` in the main thread only, and only for
SIGINT: the threads and processes that run dask's tasks go on with what they
were given, and SIGTERM ends the process without any cleanup (an HDF5 file
open for writing is then left damaged). Within :func:`stopping_on_signals`:

- either signal raises :class:`Interrupted` in the main thread (whose
  ``exit_status`` is the shell's: 130 for SIGINT, 143 for SIGTERM), so the
  code unwinding records the blocks it wrote and closes its files;
- it is raised only where raising is safe: while the main thread waits (on a
  scheduler's results, a future, a thread), while it is in pure work that an
  exception only abandons (building a graph, planning, listing files: every
  frame of the stack outside the modules that hold locks, files or callbacks,
  and the innermost in one known to be such work, :data:`_PURE_WORK`), or
  where the code asks :func:`raise_if_stopped`. Raised anywhere else, as
  Python's own ``KeyboardInterrupt`` is, it can land in a weak reference's
  callback, which swallows it, or between a lock's acquire and the ``try``
  that releases it, where it leaves threads waiting for ever. A signal that
  finds the main thread elsewhere, or inside :func:`deferred_stop` (a region
  that must end whole, such as two renames), is delivered again every few
  milliseconds until it finds it at such a point, or at the end of the block;
- no further task starts on a local scheduler (threads, processes,
  synchronous, a writer's own batches in other threads), and a task that
  writes asks :func:`raise_if_stopped` before each chunk;
- the workers of a process pool, which would first run every task queued to
  them, are ended (each chunk is written whole or not at all); a cluster's
  tasks are cancelled by the code the exception unwinds;
- a second signal while the first is being handled ends the process at once;
- a process ending on a stop (the command line) abandons the tasks its
  threads still run (:func:`abandon_running_tasks`): each stops at its next
  check instead of running to its end while the interpreter waits for it.

The command line runs every command within it; a program using daskstream
may too.
"""

from __future__ import annotations

import contextlib
import dis
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from types import CodeType, FrameType
from typing import Any

from dask.callbacks import Callback

from daskstream.runtime.schedulers import uses_processes

__all__ = [
    "Interrupted",
    "abandon_running_tasks",
    "ctrl_c_kept_from_children",
    "deferred_stop",
    "quiet_workers_when_stopped",
    "quieted_loggers",
    "raise_if_stopped",
    "stop_child_processes",
    "stopping_on_signals",
]

_SHUTDOWN_LOGGERS = ("distributed", "tornado", "asyncio")
# How often a signal that found the main thread busy is delivered to it again (a few thousandths of a
# second of its time each: the handler only looks at where the thread is).
_REDELIVERY_INTERVAL = 0.02


def _acquire_lines(code: CodeType, skip: int = 0) -> frozenset[int]:
    """The lines of ``code`` that call a lock's ``acquire``, after the first ``skip`` of them."""
    lines = [
        instruction.positions.lineno
        for instruction in dis.get_instructions(code)
        if instruction.argval == "acquire" and instruction.positions is not None
    ]
    return frozenset(line for line in lines[skip:] if line is not None)


# Where the main thread blocks in the standard library's waits, inside the ``try`` each keeps so that a
# KeyboardInterrupt leaves the lock and its waiters as they were (queues, events, futures and dask's and
# distributed's waits for results all come down to the first; joining a thread to the second). The first
# acquire in Condition.wait takes a fresh lock before that ``try``.
_SAFE_WAITS: dict[CodeType, frozenset[int]] = {
    threading.Condition.wait.__code__: _acquire_lines(threading.Condition.wait.__code__, skip=1),
    threading.Thread._wait_for_tstate_lock.__code__: _acquire_lines(  # type: ignore[attr-defined]
        threading.Thread._wait_for_tstate_lock.__code__  # type: ignore[attr-defined]
    ),
}


# Modules whose code only builds values that an exception abandons whole: graphs, plans, listings. A signal
# that finds the main thread's innermost frame in one of them (and no frame of _NEVER_RAISE_IN on its stack)
# is raised there at once: graph building can run for minutes without a wait in it.
_PURE_WORK = (
    "dask.array",
    "dask.blockwise",
    "dask.highlevelgraph",
    "dask.core",
    "dask._task_spec",
    "dask.utils",
    "dask.base",
    "dask.tokenize",
    "dask.optimization",
    "dask.layers",
    "dask.delayed",
    "toolz",
    "tlz",
    "cytoolz",
    "numpy",
    "daskstream.planning",
    "daskstream.graph",
    "daskstream.sources.listing",
    "daskstream.compute.reductions",
    "daskstream.compute.moments",
    "daskstream.compute.histograms",
    "daskstream.compute.quantiles",
    "daskstream.compute.describe",
    "daskstream.compute.computation",
    "daskstream.compute.blockwise",
    "daskstream.compute.kernels",
    "daskstream.compute.partials",
    "daskstream.compute.fused",
    "daskstream.compute.joins",
    "daskstream.compute.plans",
)
# Modules where an exception raised between two statements can leave a lock held, a file half written or a
# callback's error swallowed: a stop is never raised while one of their frames is on the stack.
_NEVER_RAISE_IN = (
    "threading",
    "weakref",
    "_weakrefset",
    "queue",
    "concurrent",
    "asyncio",
    "logging",
    "multiprocessing",
    "contextlib",
    "importlib",
    "dask.callbacks",
    "distributed",
    "tornado",
    "h5py",
    "zarr",
    "numcodecs",
    "fsspec",
    "s3fs",
    "daskstream.compute.store",
    "daskstream.safe_writes",
    "daskstream.runtime.stopping",
)
# Code that runs as an object is collected or a block is left: an exception there is swallowed or skips
# the cleanup it does.
_NEVER_RAISE_IN_CODE = frozenset({"__del__", "__exit__", "__aexit__", "_remove"})


def _within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def _in_pure_work(frame: FrameType | None) -> bool:
    """Whether the main thread, at ``frame``, is in pure work (see :data:`_PURE_WORK`) that a stop may abandon."""
    if frame is None or not _within(frame.f_globals.get("__name__", ""), _PURE_WORK):
        return False
    current: FrameType | None = frame
    while current is not None:
        if current.f_code.co_name in _NEVER_RAISE_IN_CODE or _within(
            current.f_globals.get("__name__", ""), _NEVER_RAISE_IN
        ):
            return False
        current = current.f_back
    return True


class _Stop:
    """What the handler and the checkpoints share about the one stop a process can be asked for at a time."""

    def __init__(self) -> None:
        # The signal that asked to stop, until the block ends; None while none has.
        self.signum: int | None = None
        # Interrupted has been raised in the main thread (or is being handled there): not raised again.
        self.delivered = False
        # The signal the handler is about to see was sent by the redelivery thread, not by a user.
        self.redelivering = threading.Event()
        # Held while sending a redelivery, and to end them when the block ends: none arrives after.
        self.lock = threading.Lock()
        self.within = False
        self.redelivery: threading.Thread | None = None
        # How many deferred_stop regions the main thread is in: no stop is raised there.
        self.deferred = 0
        # The signal that stopped a process on its way out (abandon_running_tasks): the tasks still running in
        # its other threads stop at their next check.
        self.abandoned: int | None = None

    @property
    def asked(self) -> bool:
        return self.signum is not None

    def clear(self) -> None:
        self.signum = None
        self.delivered = False
        self.redelivering.clear()

    def deliver(self) -> None:
        """Raise :class:`Interrupted` (once) for the signal asked, marking it delivered."""
        assert self.signum is not None
        self.delivered = True
        raise Interrupted(self.signum)

    def redeliver_until_delivered(self, main: int) -> None:
        """Send the signal asked to the ``main`` thread every few milliseconds until it has been raised there."""
        while True:
            time.sleep(_REDELIVERY_INTERVAL)
            with self.lock:
                if self.delivered or not self.within or self.signum is None:
                    return
                self.redelivering.set()
                signal.pthread_kill(main, self.signum)


_STOP = _Stop()


class Interrupted(KeyboardInterrupt):
    """The computation was stopped by a signal; ``signal_name`` says which, ``exit_status`` what to exit with."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def raise_if_stopped() -> None:
    """Raise :class:`Interrupted` when a signal asked this process to stop (any thread may ask)."""
    signum = _STOP.signum  # read once: the block's end may clear it meanwhile in the main thread
    if signum is None and threading.current_thread() is not threading.main_thread():
        signum = _STOP.abandoned  # a task of a computation already stopped, still running in its thread
    if signum is not None:
        if threading.current_thread() is threading.main_thread():
            _STOP.deliver()
        # In a task's thread: the task fails with it, and the scheduler raises it in the main thread.
        raise Interrupted(signum)


def abandon_running_tasks(signum: int) -> None:
    """The process, stopped by ``signum``, is ending: tasks still running in its other threads (a local
    scheduler's pool, whose threads the interpreter waits for as it exits) stop at their next check of
    :func:`raise_if_stopped`, instead of running to their end. Only for a process on its way out: a later
    computation's tasks would stop too."""
    _STOP.abandoned = signum


@contextlib.contextmanager
def deferred_stop() -> Iterator[None]:
    """Within the block no stop is raised in the main thread; one asked meanwhile is raised as the block ends.

    For the few steps that must end together or not begin, such as the two
    renames of a swap: the signal waits for them, not for the whole program.
    """
    main = threading.current_thread() is threading.main_thread()
    if main:
        _STOP.deferred += 1
    try:
        yield
    finally:
        if main:
            _STOP.deferred -= 1
    if main and not _STOP.deferred and _STOP.signum is not None and not _STOP.delivered:
        _STOP.deliver()


class _NoNewTasks(Callback):
    """Refuses to start a task once a stop was asked: every local scheduler asks before each one."""

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        raise_if_stopped()


def _handling_interrupted() -> bool:
    """Whether the main thread (where a signal handler runs) is already unwinding an :class:`Interrupted`."""
    error: BaseException | None = sys.exc_info()[1]
    while error is not None:
        if isinstance(error, Interrupted):
            return True
        error = error.__context__
    return False


def _waiting_where_safe(frame: FrameType | None) -> bool:
    """Whether the main thread, at ``frame``, is blocked in a wait that an exception leaves as it was."""
    return frame is not None and frame.f_lineno in _SAFE_WAITS.get(frame.f_code, ())


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _STOP.redelivering.is_set():
        _STOP.redelivering.clear()
    elif _STOP.asked:
        # Asked twice: the user will not wait for the cleanup.
        os._exit(128 + signum)
    else:
        _STOP.signum = signum
        # What a client's event loop logs while its cluster is torn down mid-task (callbacks of cancelled
        # futures, closed comms) is the stop itself, not news: the one line the caller prints says it all.
        _quiet_shutdown_loggers()
        if uses_processes():
            # The process pool's workers run every task queued to them before any exception reaches them, and
            # the pool waits for them: ended now instead. What they write is put in place whole or not at all.
            # (A cluster's workers are told to cancel their tasks by the code the exception unwinds.)
            for child in multiprocessing.active_children():
                child.terminate()
    if _STOP.delivered:
        return
    if _handling_interrupted():
        # A task's thread raised it, and the scheduler raised it here: the main thread is stopping already.
        _STOP.delivered = True
        return
    if not _STOP.deferred and (_waiting_where_safe(frame) or _in_pure_work(frame)):
        _STOP.deliver()
    if _STOP.redelivery is None or not _STOP.redelivery.is_alive():
        _STOP.redelivery = threading.Thread(
            target=_STOP.redeliver_until_delivered,
            args=(threading.main_thread().ident,),
            name="daskstream-stop-redelivery",
            daemon=True,
        )
        _STOP.redelivery.start()


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM stop the computation as the module says.

    A stop asked but not yet raised when the block's code ends is raised as
    the block ends. Only the main thread can take signals; elsewhere the
    block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    levels = {logger.name: logger.level for logger in _loggers_under(_SHUTDOWN_LOGGERS)}
    callback = _NoNewTasks()
    _STOP.clear()
    _STOP.abandoned = None  # a new computation's tasks are not the stopped one's
    _STOP.within = True
    for signum in previous:
        signal.signal(signum, _on_signal)
    callback.register()
    undelivered = None
    try:
        yield
        undelivered = None if _STOP.delivered else _STOP.signum
    finally:
        with _STOP.lock:
            # No redelivery is sent after this; one sent before is taken by this module's handler, which
            # signal.signal runs before it replaces it.
            _STOP.within = False
        callback.unregister()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _restore_levels(levels, _SHUTDOWN_LOGGERS)
        _STOP.clear()
    if undelivered is not None:
        raise Interrupted(undelivered)


@contextlib.contextmanager
def ctrl_c_kept_from_children() -> Iterator[None]:
    """Threads and processes started in this thread within the block never take SIGINT.

    Ctrl-C in a terminal signals every process of the foreground job: a process pool's or a local
    cluster's workers as well as this one. Each would end in a ``KeyboardInterrupt`` traceback on the
    user's screen, mid-task, while this process is already stopping them in order. A blocked signal
    stays blocked across ``fork`` and ``exec`` and in the threads a thread starts, so the workers
    never see it; this process still takes it, in its other threads or here when the block ends (a
    signal that came during the block is not lost). Where threads cannot block signals the block
    runs as it is.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    # multiprocessing starts its resource tracker with the first process or shared object, in whatever
    # thread that happens, and then unblocks SIGINT in that thread instead of restoring its mask: started
    # now, it is not started again within the block.
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _loggers_under(roots: tuple[str, ...]) -> list[logging.Logger]:
    """The loggers named ``roots`` and every logger made so far below them.

    distributed sets the levels of some of its loggers itself: quieting means
    raising each one, not only the parents.
    """
    names = [name for name in list(logging.root.manager.loggerDict) if name.split(".")[0] in roots]
    return [logging.getLogger(name) for name in dict.fromkeys([*roots, *names])]


def _restore_levels(levels: dict[str, int], roots: tuple[str, ...]) -> None:
    """Put back the ``levels`` of the loggers under ``roots``; one made since starts at its default again."""
    for logger in _loggers_under(roots):
        logger.setLevel(levels.get(logger.name, logging.NOTSET))


def _quiet_shutdown_loggers(roots: tuple[str, ...] = _SHUTDOWN_LOGGERS) -> None:
    for logger in _loggers_under(roots):
        logger.setLevel(logging.CRITICAL)


@contextlib.contextmanager
def quieted_loggers(roots: tuple[str, ...] = _SHUTDOWN_LOGGERS) -> Iterator[None]:
    """Within the block the loggers under ``roots`` log nothing below CRITICAL; their levels as they were after."""
    levels = {logger.name: logger.level for logger in _loggers_under(roots)}
    _quiet_shutdown_loggers(roots)
    try:
        yield
    finally:
        _restore_levels(levels, roots)


def quiet_workers_when_stopped(client: Any) -> None:
    """After a stop was asked, quiet the shutdown logs of the worker and nanny processes of ``client``.

    A cluster this process started shares its terminal: torn down mid-task, its
    workers log their interrupted heartbeats and closed comms with tracebacks,
    which would bury the one line that says what was kept. Call it only for
    such a cluster (a remote cluster's logs are its operators'), before the
    client closes. Nothing happens when no stop was asked.
    """
    if not _STOP.asked:
        return
    for nanny in (False, True):
        with contextlib.suppress(Exception):  # a worker already gone has nothing left to say
            client.run(_quiet_shutdown_loggers, nanny=nanny)


def stop_child_processes(timeout: float = 2.0) -> None:
    """End the worker processes this process started and still has (a process pool's, a local
    cluster's), which a signal sent to this process alone never reaches; those still there after
    ``timeout`` are killed. (multiprocessing's own resource tracker is not among them.)"""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout)
        if child.is_alive():
            child.kill()
