"""The chunk plan: how an array is cut into tasks, and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from daskstream.advice import joined, named, said
from daskstream.planning.budget import format_size
from daskstream.planning.cards import card_of
from daskstream.planning.grid import regular_grid
from daskstream.planning.settings import SchedulerCost
from daskstream.planning.spans import span_blocks, span_chunks

LAYOUTS = ("C", "F", "chunked")


@dataclass(frozen=True)
class ChunkPlan:
    """How an array is cut into tasks, and why.

    Attributes
    ----------
    shape, dtype
        The array planned for.
    chunks
        The shape of one (full) chunk; edge chunks may be smaller.
    storage_chunks
        The on-disk chunk grid the plan aligns to (``None`` for contiguous data).
    layout
        ``"C"``, ``"F"`` or ``"chunked"``.
    memory_budget, threads, workers, working_set_factor
        The budget the plan was sized to.
    decode_bytes
        Bytes a read holds beyond its chunk while it decodes storage (0 for
        data read straight into the chunk).
    read_amplification
        Bytes decoded divided by bytes in the array: 1.0 when no storage chunk
        is read by two tasks.
    reduce_axis
        Axes a following reduction removes, if the caller said.
    target_chunk_bytes
        The preferred chunk size, below the memory and parallelism bounds.
    min_tasks_per_thread
        Tasks each thread gets at least, when the storage grid allows.
    scheduler
        What tasks cost the scheduler: chunks grow past the preferred size
        until the scheduler keeps up and the graph fits (:class:`SchedulerCost`).
    span
        Chunks one task streams along each axis, for an array whose chunks
        outnumber what a graph may hold (:mod:`daskstream.planning.spans`);
        ``None``: a task per chunk.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    storage_chunks: tuple[int, ...] | None
    layout: str
    memory_budget: int
    threads: int
    workers: int
    working_set_factor: float
    read_amplification: float
    reduce_axis: tuple[int, ...] | None
    target_chunk_bytes: int
    min_tasks_per_thread: int
    decode_bytes: int = 0
    scheduler: SchedulerCost = field(default_factory=SchedulerCost)
    axis_notes: tuple[str, ...] = field(default=(), repr=False, compare=False)
    #: For a plan beyond the graph ceiling: the least budget whose plan is within it (found by planning).
    budget_within_ceiling: int | None = field(default=None, repr=False, compare=False)
    span: tuple[int, ...] | None = None

    @property
    def dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """The chunks along every axis, as ``dask.array`` expects them."""
        return regular_grid(self.shape, self.chunks)

    @property
    def chunk_bytes(self) -> int:
        """Bytes in one full chunk."""
        return math.prod(self.chunks) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes in the whole array."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def n_tasks(self) -> int:
        """Number of chunks, i.e. read tasks (counted, not listed: there may be more than memory holds)."""
        return math.prod(max(1, -(-n // c)) if c else 1 for n, c in zip(self.shape, self.chunks))

    @property
    def task_working_set_bytes(self) -> int:
        """Memory one task needs: ``working_set_factor`` times its chunk, and its decode buffers."""
        return math.ceil(self.working_set_factor * self.chunk_bytes) + self.decode_bytes

    @property
    def projected_peak_bytes(self) -> int:
        """Memory one worker needs: ``threads`` tasks' working sets."""
        return self.threads * self.task_working_set_bytes

    @property
    def min_tasks(self) -> int:
        """Tasks the plan aims for at least, so that no thread idles."""
        return self.min_tasks_per_thread * self.threads * self.workers

    @property
    def per_chunk_cap(self) -> int:
        """Bytes one chunk may hold within the budget: a thread's share, less decoding, over the working set."""
        return per_task_cap(self.memory_budget, self.threads, self.working_set_factor, self.decode_bytes)

    @property
    def load_floor_bytes(self) -> int:
        """The smallest chunk the scheduler dispatches as fast as every thread of every worker finishes them."""
        return self.scheduler.load_floor_bytes(self.threads * self.workers)

    @property
    def graph_floor_bytes(self) -> int:
        """The smallest chunk whose tasks fit the graph ceiling (``scheduler.max_tasks``); 0 without one."""
        return self.scheduler.graph_floor_bytes(self.nbytes)

    @property
    def start_floor_bytes(self) -> int:
        """The smallest chunk whose computation over the whole array starts in time (``scheduler.first_task_seconds``)."""
        return self.scheduler.start_floor_bytes(self.nbytes)

    @property
    def aim_bytes(self) -> int:
        """The chunk size the plan grows towards (see :func:`aim_with_reason`)."""
        return self.size_terms()[0]

    def size_terms(self) -> tuple[int, str]:
        """The chunk size the plan grows towards, and the term that set it."""
        return aim_with_reason(
            self.per_chunk_cap,
            self.target_chunk_bytes,
            self.nbytes // self.min_tasks,
            self.dtype.itemsize,
            load_floor=self.load_floor_bytes,
            graph_floor=self.graph_floor_bytes,
            start_floor=self.start_floor_bytes,
        )

    @property
    def beyond_graph_ceiling(self) -> bool:
        """True when even chunks at the per-chunk cap make more blocks than a computation's graph may hold."""
        ceiling = self.scheduler.max_blocks
        return ceiling is not None and self.n_tasks > ceiling

    @property
    def span_dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of the tasks: the spans where the plan has them, else the chunks."""
        return self.dask_chunks if self.span is None else span_chunks(self.dask_chunks, self.span)

    @property
    def span_tasks(self) -> int:
        """Tasks a read of the whole array makes: one per span (one per chunk without spans)."""
        if self.span is None:
            return self.n_tasks
        return span_blocks(tuple(len(c) for c in self.dask_chunks), self.span)

    @property
    def splits_storage_chunks(self) -> bool:
        """True when some storage chunk is read by more than one task."""
        return self.read_amplification > 1.0

    def _repr_html_(self) -> str | None:
        """The plan as an HTML card, for notebooks: drawn when asked by :mod:`daskstream.views`."""
        return card_of(self)

    def explain(self) -> str:
        """Plain-text account of the inputs, the terms of the chunk size, and why each axis was cut as it was."""
        per_task = self.per_chunk_cap
        storage = "contiguous" if self.storage_chunks is None else f"storage chunks {self.storage_chunks}"
        decode = f" and {format_size(self.decode_bytes)} to decode storage" if self.decode_bytes else ""
        cost = self.scheduler
        threads = self.threads * self.workers
        aim_bytes, reason = self.size_terms()
        ceiling = (
            "no ceiling"
            if cost.max_blocks is None
            else f"at most {cost.max_tasks:,} tasks in a graph, {cost.tasks_per_block} per block read"
        )
        lines = [
            f"Chunk plan for {self.shape} {self.dtype} ({format_size(self.nbytes)}), layout {self.layout}, {storage}",
            f"Budget: {format_size(self.memory_budget)} per worker, {self.threads} thread(s) x "
            f"{self.workers} worker(s); a task holds its chunk times {self.working_set_factor:g} (working "
            f"set){decode}, so at most {format_size(per_task)} per chunk",
            f"Scheduler: {cost.task_seconds * 1e3:g} ms per task, {threads} thread(s) at "
            f"{format_size(cost.thread_bytes_per_second)}/s each, at most {cost.scheduler_share:.0%} of the time on "
            f"tasks: chunks of at least {format_size(self.load_floor_bytes)}; {ceiling}"
            + (f": chunks of at least {format_size(self.graph_floor_bytes)}" if cost.max_tasks is not None else "")
            + (
                ""
                if cost.first_task_seconds is None
                else f"; {cost.build_seconds * 1e6:g} us to build a task, the first within "
                f"{cost.first_task_seconds:g} s: chunks of at least {format_size(self.start_floor_bytes)}"
            ),
            f"Chunk size aim: {format_size(aim_bytes)}, set by {reason} (the least of the per-chunk budget "
            f"({format_size(per_task)}), 1/{self.min_tasks} of the array ({format_size(self.nbytes // self.min_tasks)}, "
            f"for at least {self.min_tasks} tasks: {self.min_tasks_per_thread} per thread) and the largest of "
            f"the preferred size ({format_size(self.target_chunk_bytes)}) and the scheduler's floors)",
        ]
        if self.reduce_axis is not None:
            lines.append(f"Reduction over axes {self.reduce_axis}")
        lines.extend(f"  {note}" for note in self.axis_notes)
        lines.append(
            f"Result: chunks {self.chunks} ({format_size(self.chunk_bytes)}), {self.n_tasks} task(s), "
            f"read amplification {self.read_amplification:.2f}, projected peak "
            f"{format_size(self.projected_peak_bytes)} of {format_size(self.memory_budget)}"
        )
        if self.span is not None:
            lines.append(
                said(
                    f"Spans: {self.n_tasks:,} chunks, more than the {cost.max_blocks:,} a graph may hold: each task "
                    f"streams {math.prod(self.span):,} of them {self.span} "
                    f"({format_size(math.prod(self.span) * self.chunk_bytes)}) one after another through a buffer "
                    f"of one chunk ({format_size(self.chunk_bytes)}), {self.span_tasks:,} tasks; element-wise "
                    "steps, slices, indices, transposes, sums, means, extremes and where they lie, moments "
                    "(variances, standard deviations), histograms, exact quantiles, describe and stores to "
                    "Zarr stream, "
                    "other steps are refused past the budget; a task per chunk takes a ",
                    named("memory_budget"),
                    f" of at least {format_size(self.budget_within_ceiling or 0)}",
                )
            )
        elif self.beyond_graph_ceiling:
            lines.append(
                said(
                    f"Warning: {self.n_tasks:,} blocks, more than the {cost.max_blocks:,} a graph may hold, though "
                    "every chunk is as large as the budget allows: parts of the array compute, the whole at once "
                    "is refused; raise ",
                    named("memory_budget"),
                    f" to at least {format_size(self.budget_within_ceiling or 0)}",
                )
            )
        if self.splits_storage_chunks:
            lines.append(
                said(
                    "Warning: one storage chunk is larger than the per-chunk budget, so storage chunks are split "
                    f"and decoded {self.read_amplification:.2f} times on average; raise ",
                    named("memory_budget"),
                    " or lower ",
                    named("threads"),
                    " to avoid it.",
                )
            )
        return joined(lines, "\n")

    def __str__(self) -> str:
        return self.explain()

    def __repr__(self) -> str:
        # What a terminal shows for `plan` at the prompt: the plan in one line (print(plan) for the reasons).
        storage = self.storage_chunks if self.storage_chunks is not None else "contiguous"
        return (
            f"<daskstream ChunkPlan chunks={self.chunks} of {self.shape} {self.dtype}: {self.n_tasks} task(s) of "
            f"{format_size(self.chunk_bytes)}, storage {storage}, read amplification "
            f"{self.read_amplification:.2f}, peak {format_size(self.projected_peak_bytes)} of "
            f"{format_size(self.memory_budget)}>"
        )


def aim_with_reason(
    cap: int,
    preferred: int,
    parallel: int,
    itemsize: int,
    *,
    load_floor: int = 0,
    graph_floor: int = 0,
    start_floor: int = 0,
) -> tuple[int, str]:
    """The chunk size a plan grows towards, and which term set it.

    The preferred size, raised to the scheduler's floors (``load_floor``: the
    scheduler keeps up with the threads; ``graph_floor``: the graph fits its
    ceiling; ``start_floor``: the graph is built soon enough for the first
    task to start in time), then bounded by the per-chunk ``cap`` of the
    budget and by ``parallel`` (every thread gets tasks); at least one element.

    >>> aim_with_reason(2**30, 8 * 2**20, 2**40, 4, graph_floor=32 * 2**20)
    (33554432, "the task graph's ceiling")
    >>> aim_with_reason(16 * 2**20, 8 * 2**20, 2**40, 4, load_floor=40 * 2**20)
    (16777216, 'the per-chunk budget')
    >>> aim_with_reason(2**30, 8 * 2**20, 2**40, 4, start_floor=400 * 2**20)
    (419430400, 'the time to the first task')
    """
    wanted = max((preferred, "the preferred size"), (load_floor, "the scheduler's load"),
                 (graph_floor, "the task graph's ceiling"), (start_floor, "the time to the first task"),
                 key=lambda term: term[0])  # fmt: skip
    bound = min((cap, "the per-chunk budget"), (parallel, "the parallelism: tasks for every thread"), wanted,
                key=lambda term: term[0])  # fmt: skip
    if bound[0] < itemsize:
        return itemsize, "one element, the least a chunk holds"
    return bound


def per_task_cap(memory_budget: int, threads: int, working_set_factor: float, decode_bytes: int = 0) -> int:
    """Bytes one chunk may hold: a thread's share of the budget, less decoding, over the working set."""
    return int((memory_budget // threads - decode_bytes) // working_set_factor)


__all__ = ["LAYOUTS", "ChunkPlan", "aim_with_reason", "per_task_cap"]
