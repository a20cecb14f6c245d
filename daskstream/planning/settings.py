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
import math
from dataclasses import dataclass, field

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
class SchedulerCost:
    """What tasks cost the scheduler: the terms that set how many tasks a plan may have.

    A plan's chunks grow past the preferred size until the scheduler keeps up
    with every thread of the cluster and the task graph fits in memory (up to
    the per-task cap the budget allows); see :func:`scheduler_floor_bytes`.

    Attributes
    ----------
    task_seconds
        Scheduler time one task takes (building, ordering, dispatching and
        finishing it): about 1 ms on dask.distributed, 0.1 ms on the local
        schedulers (``benchmarks/scale.py`` measures both).
    thread_bytes_per_second
        Bytes one thread reads, decodes and reduces a second.
    scheduler_share
        The largest share of a computation's time the scheduler's per-task
        work may take.
    max_tasks
        Tasks whose graph the client and scheduler hold at once: the graph
        memory over the memory one task takes in it (``None``: no ceiling).
    tasks_per_block
        Tasks a computation makes for each block it reads (the read, the work
        on it, its share of the combining): an array is planned for
        ``max_tasks / tasks_per_block`` blocks at most.
    build_seconds
        Client time one task takes before the first task runs (dask builds,
        culls, converts and fuses the graph task by task: about 50 us here).
    first_task_seconds
        The longest a computation over a whole array may wait for its first
        task: chunks grow so that building its graph takes no longer
        (``None``: no such floor).
    spans
        Whether an array whose chunks, at the most a task may hold, still
        outnumber :attr:`max_blocks` is planned in spans: tasks that stream
        many chunks each (:mod:`daskstream.planning.spans`). Without, computing
        all of such an array at once is refused.
    span_chunk_seconds
        What streaming one more chunk through a span costs beside reading it
        (the read's call, the steps' and the partial's overhead: about 60 us
        here): spans stream chunks of at least :meth:`span_chunk_floor_bytes`.
    """

    task_seconds: float = 1e-4
    thread_bytes_per_second: float = 5e8
    scheduler_share: float = 0.1
    max_tasks: int | None = None
    tasks_per_block: int = 4
    build_seconds: float = 5e-5
    first_task_seconds: float | None = None
    spans: bool = False
    span_chunk_seconds: float = 5e-5

    @property
    def max_blocks(self) -> int | None:
        """Blocks an array is planned for at most, so that a computation over it stays within :attr:`max_tasks`."""
        return None if self.max_tasks is None else max(1, self.max_tasks // self.tasks_per_block)

    def load_floor_bytes(self, threads: int) -> int:
        """The smallest chunk whose tasks the scheduler dispatches as fast as ``threads`` threads finish them.

        ``threads`` threads finish ``threads * thread_bytes_per_second / chunk``
        tasks a second; the scheduler spends ``task_seconds`` on each, which is
        at most ``scheduler_share`` of its time when the chunk holds at least
        ``task_seconds * threads * thread_bytes_per_second / scheduler_share``
        bytes.

        >>> SchedulerCost(task_seconds=1e-3).load_floor_bytes(threads=8)
        40000000
        """
        return math.ceil(self.task_seconds * threads * self.thread_bytes_per_second / self.scheduler_share)

    @property
    def span_chunk_floor_bytes(self) -> int:
        """The smallest chunk a span streams: its per-chunk cost at most ``scheduler_share`` of reading it.

        Smaller chunks (a budget of a few kilobytes) would take longer to step
        through than to read: such arrays are not spanned, and computing all
        of one at once is refused with the budget that fits.

        >>> SchedulerCost(span_chunk_seconds=5e-5).span_chunk_floor_bytes
        250000
        """
        return math.ceil(self.span_chunk_seconds * self.thread_bytes_per_second / self.scheduler_share)

    def graph_floor_bytes(self, nbytes: int) -> int:
        """The smallest chunk that cuts ``nbytes`` into no more than :attr:`max_blocks` blocks (0: no ceiling).

        >>> SchedulerCost(max_tasks=4000).graph_floor_bytes(2**30)
        1073742
        """
        blocks = self.max_blocks
        return 0 if blocks is None else -(-nbytes // blocks)

    @property
    def start_blocks(self) -> int | None:
        """Blocks whose computation's graph is built within :attr:`first_task_seconds` (``None``: no limit)."""
        if self.first_task_seconds is None or self.first_task_seconds <= 0:
            return None
        return max(1, int(self.first_task_seconds / (self.tasks_per_block * self.build_seconds)))

    def start_floor_bytes(self, nbytes: int) -> int:
        """The smallest chunk whose computation over ``nbytes`` starts within :attr:`first_task_seconds` (0: none).

        Building a graph costs the client ``build_seconds`` a task before any
        runs, ``tasks_per_block`` tasks a block: ``nbytes`` in blocks of at
        least ``nbytes * tasks_per_block * build_seconds / first_task_seconds``
        bytes start in time.

        >>> SchedulerCost(first_task_seconds=5.0).start_floor_bytes(10 * 2**40)
        439804652
        """
        if self.first_task_seconds is None or self.first_task_seconds <= 0:
            return 0
        return math.ceil(nbytes * self.tasks_per_block * self.build_seconds / self.first_task_seconds)


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
    scheduler
        What tasks cost the scheduler (:class:`SchedulerCost`).
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
    scheduler: SchedulerCost = field(default_factory=SchedulerCost)
    object_store_task_bytes: int = 64 * 2**20

    @property
    def memory_budget(self) -> int:
        """Bytes per worker process."""
        return self.resources.memory_budget

    @property
    def threads(self) -> int:
        """Tasks a worker runs at once."""
        return self.resources.threads

    @property
    def max_tasks(self) -> int | None:
        """Tasks whose graph the client and scheduler hold at most (``None``: no ceiling)."""
        return self.scheduler.max_tasks

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


__all__ = ["PlanSettings", "Resources", "SchedulerCost", "analysis_working_set_factor", "checked_dtype"]
