"""What a plan takes besides the array: resources and planner settings, as one frozen value.

The planner reads no configuration and asks no scheduler. Where a call enters
daskstream (``daskstream.open``, ``daskstream.plan``, ``reduce``, ``store``...)
:func:`daskstream.runtime.resources.resolve_settings` fills what the caller
left out, from arguments, then ``daskstream.*`` settings, then the active
session, Client or machine, once; everything below receives the result.

>>> settings = PlanSettings(Resources(2**30, threads=2, workers=1, origin="arguments"))
>>> settings.resources.per_task_bytes, settings.working_set_factor_for("f4")
(536870912, 7.0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike

from daskstream.errors import InvalidArgumentError


@dataclass(frozen=True)
class Resources:
    """Memory and parallelism one computation may use.

    Attributes
    ----------
    memory_budget
        Bytes per worker process, shared by its threads.
    threads
        Tasks a worker runs at once.
    workers
        Worker processes.
    origin
        Where the figures came from, for explanations.
    threads_share_process
        True when the tasks run as threads of the calling process (dask's
        threaded scheduler), so that they share its locks, h5py's among them.
    """

    memory_budget: int
    threads: int
    workers: int
    origin: str
    threads_share_process: bool = dataclasses.field(default=False, compare=False, repr=False)

    @property
    def per_task_bytes(self) -> int:
        """Bytes one of a worker's concurrent tasks may hold."""
        return self.memory_budget // self.threads


@dataclass(frozen=True)
class PlanSettings:
    """Everything a chunk plan depends on besides the array and its storage.

    Attributes
    ----------
    resources
        The budget and parallelism planned for.
    target_chunk_bytes
        Preferred chunk size below the hard bounds.
    working_set_factor
        One task's peak memory as a multiple of its chunk; ``None``:
        :func:`analysis_working_set_factor` of the dtype.
    float64_copies
        Float64 copies of a chunk one analysis step holds, for that default.
    min_tasks_per_thread
        Tasks each thread gets at least, when the storage grid allows.
    max_tasks
        Plans with more tasks are refused (``None``: no ceiling).
    object_store_task_bytes
        Preferred chunk size, at least, for data on an object store: fewer,
        larger tasks keep more requests in flight and decode some objects
        while others arrive (the budget bounds them as any other).
    """

    resources: Resources
    target_chunk_bytes: int = 8 * 2**20
    working_set_factor: float | None = None
    float64_copies: int = 3
    min_tasks_per_thread: int = 2
    max_tasks: int | None = None
    object_store_task_bytes: int = 64 * 2**20

    @property
    def memory_budget(self) -> int:
        """Bytes per worker process."""
        return self.resources.memory_budget

    @property
    def threads(self) -> int:
        """Tasks a worker runs at once."""
        return self.resources.threads

    def working_set_factor_for(self, dtype: DTypeLike) -> float:
        """One task's memory as a multiple of its chunk, for data of ``dtype``."""
        if self.working_set_factor is not None:
            return float(self.working_set_factor)
        return analysis_working_set_factor(dtype, self.float64_copies)

    def with_budget(self, memory_budget: int) -> PlanSettings:
        """The same settings for another memory budget per worker."""
        resources = dataclasses.replace(self.resources, memory_budget=memory_budget, origin="arguments")
        return dataclasses.replace(self, resources=resources)


def analysis_working_set_factor(dtype: DTypeLike, float64_copies: int) -> float:
    """One task's memory as a multiple of its chunk: the chunk and ``float64_copies`` float64 copies of it.

    An analysis step promotes to float64 and makes temporaries the size of its
    block (a variance holds the block, its centred copy and their squares), so
    narrow dtypes need proportionally more room.

    >>> analysis_working_set_factor("f8", 3), analysis_working_set_factor("f4", 3)
    (4.0, 7.0)
    """
    itemsize = max(checked_dtype(dtype).itemsize, 1)
    return 1.0 + float64_copies * 8 / itemsize


def checked_dtype(dtype: DTypeLike) -> np.dtype:
    """``dtype`` as a numpy dtype, or :class:`InvalidArgumentError` naming it.

    >>> checked_dtype("f4")
    dtype('float32')
    """
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"dtype={dtype!r} is not a numpy dtype ({exc}); give one like 'float32'") from None


__all__ = ["PlanSettings", "Resources", "analysis_working_set_factor", "checked_dtype"]
