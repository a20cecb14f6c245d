"""One process pool for many computations in a row, when dask's process scheduler is active.

dask's ``processes`` scheduler starts (and imports everything into) a fresh pool
of processes for every ``dask.compute``; a writer that computes its blocks in
batches keeps one pool for all of them instead.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing.context
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import dask
import dask.multiprocessing
from dask.system import cpu_count

from daskstream.runtime.schedulers import uses_processes
from daskstream.runtime.stopping import ctrl_c_kept_from_children


@contextlib.contextmanager
def one_process_pool() -> Iterator[None]:
    """Keep one process pool for all batches when dask's process scheduler is active.

    Left alone, that scheduler starts (and imports everything into) a fresh pool
    of processes for every ``dask.compute``: once per batch.
    """

    if not uses_processes() or dask.config.get("pool", None) is not None:
        yield
        return

    initializer = partial(
        dask.multiprocessing.initialize_worker_process,
        user_initializer=dask.config.get("multiprocessing.initializer", None),
    )
    workers = dask.config.get("num_workers", None) or max(1, cpu_count())  # as dask's own pool counts them
    context = without_ctrl_c(dask.multiprocessing.get_context())
    with (
        worker_hash_seed(),
        ProcessPoolExecutor(workers, mp_context=context, initializer=initializer) as pool,
        # The pool carries the initializer: dask warns when one is configured beside a pool.
        dask.config.set({"pool": pool, "multiprocessing.initializer": None}),
    ):
        yield


# Started by dask.multiprocessing's contexts; pickled by name to a spawned child, so defined here.
class _SpawnProcess(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with ctrl_c_kept_from_children():
            return multiprocessing.context.SpawnProcess._Popen(process_obj)


class _ForkServerProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        # The fork server itself starts here the first time: its children inherit its mask.
        with ctrl_c_kept_from_children():
            return multiprocessing.context.ForkServerProcess._Popen(process_obj)


class _ForkProcess(multiprocessing.context.ForkProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with ctrl_c_kept_from_children():
            return multiprocessing.context.ForkProcess._Popen(process_obj)


_WITHOUT_CTRL_C = {"spawn": _SpawnProcess, "forkserver": _ForkServerProcess, "fork": _ForkProcess}


def without_ctrl_c(context: Any) -> Any:
    """``context`` (a multiprocessing context) whose processes never take SIGINT.

    Ctrl-C reaches every process of the terminal's job; the pool's workers are
    ended by the process that takes it instead (see
    :func:`daskstream.runtime.stopping.ctrl_c_kept_from_children`). A context
    of another kind is returned as it is.
    """
    process = _WITHOUT_CTRL_C.get(context.get_start_method())
    if process is None:
        return context
    quiet = copy.copy(context)
    quiet.Process = process
    return quiet


_HASH_SEED_LOCK = threading.Lock()
_hash_seed_users = 0
_hash_seed_before: str | None = None


@contextlib.contextmanager
def worker_hash_seed() -> Iterator[None]:
    """One hash seed for the worker processes while the pool lives; the environment as it was after.

    dask.multiprocessing.get sets ``PYTHONHASHSEED`` when it starts its own pool (dask issue 6640):
    with ``spawn``, each worker would otherwise salt ``hash()`` of strings differently, and tasks that
    partition by ``hash()`` (dask.bag's groupby) would disagree across workers. A worker takes the seed
    from the environment it is started in, and ``ProcessPoolExecutor`` neither takes an environment of
    its own nor starts its workers before tasks arrive; so the variable is set for the pool's lifetime
    only, and put back (or removed) when the last store using a pool ends. A seed already chosen is
    left alone.
    """
    global _hash_seed_users, _hash_seed_before
    with _HASH_SEED_LOCK:
        if _hash_seed_users == 0:
            _hash_seed_before = os.environ.get("PYTHONHASHSEED")
            if _hash_seed_before in (None, "0"):
                os.environ["PYTHONHASHSEED"] = "6640"
        _hash_seed_users += 1
    try:
        yield
    finally:
        with _HASH_SEED_LOCK:
            _hash_seed_users -= 1
            if _hash_seed_users == 0 and os.environ.get("PYTHONHASHSEED") == "6640" and _hash_seed_before != "6640":
                if _hash_seed_before is None:
                    del os.environ["PYTHONHASHSEED"]
                else:
                    os.environ["PYTHONHASHSEED"] = _hash_seed_before


__all__ = ["one_process_pool", "without_ctrl_c"]
