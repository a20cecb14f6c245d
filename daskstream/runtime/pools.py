"""One process pool for many computations in a row, when dask's process scheduler is active.

dask's ``processes`` scheduler starts (and imports everything into) a fresh pool
of processes for every ``dask.compute``; a writer that computes its blocks in
batches keeps one pool for all of them instead.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import dask
import dask.multiprocessing

from daskstream.runtime.schedulers import uses_processes


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
    workers = dask.config.get("num_workers", None) or os.cpu_count() or 1
    context = dask.multiprocessing.get_context()
    with (
        worker_hash_seed(),
        ProcessPoolExecutor(workers, mp_context=context, initializer=initializer) as pool,
        dask.config.set(pool=pool),
    ):
        yield


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


__all__ = ["one_process_pool"]
