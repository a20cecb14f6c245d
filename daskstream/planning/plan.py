"""The chunk plan: how an array is cut into tasks, and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from daskstream.display import card, details, grid_figure, table
from daskstream.planning.budget import format_size
from daskstream.planning.grid import regular_grid

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
    axis_notes: tuple[str, ...] = field(default=(), repr=False, compare=False)

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
        """Number of chunks, i.e. read tasks."""
        return math.prod(len(c) for c in self.dask_chunks)

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
    def aim_bytes(self) -> int:
        """The chunk size the plan grows towards: the tightest of its three bounds."""
        cap = per_task_cap(self.memory_budget, self.threads, self.working_set_factor, self.decode_bytes)
        return aim(cap, self.target_chunk_bytes, self.nbytes // self.min_tasks, self.dtype.itemsize)

    @property
    def splits_storage_chunks(self) -> bool:
        """True when some storage chunk is read by more than one task."""
        return self.read_amplification > 1.0

    def explain(self) -> str:
        """Plain-text account of the inputs and why each axis was cut as it was."""
        per_task = per_task_cap(self.memory_budget, self.threads, self.working_set_factor, self.decode_bytes)
        storage = "contiguous" if self.storage_chunks is None else f"storage chunks {self.storage_chunks}"
        decode = f" and {format_size(self.decode_bytes)} to decode storage" if self.decode_bytes else ""
        lines = [
            f"Chunk plan for {self.shape} {self.dtype} ({format_size(self.nbytes)}), layout {self.layout}, {storage}",
            f"Budget: {format_size(self.memory_budget)} per worker, {self.threads} thread(s) x "
            f"{self.workers} worker(s); a task holds its chunk times {self.working_set_factor:g} (working "
            f"set){decode}, so at most {format_size(per_task)} per chunk",
            f"Chunk size aim: {format_size(self.aim_bytes)}, the least of the per-chunk budget "
            f"({format_size(per_task)}), the preferred size ({format_size(self.target_chunk_bytes)}) "
            f"and 1/{self.min_tasks} of the array ({format_size(self.nbytes // self.min_tasks)}, "
            f"for at least {self.min_tasks} tasks: {self.min_tasks_per_thread} per thread)",
        ]
        if self.reduce_axis is not None:
            lines.append(f"Reduction over axes {self.reduce_axis}")
        lines.extend(f"  {note}" for note in self.axis_notes)
        lines.append(
            f"Result: chunks {self.chunks} ({format_size(self.chunk_bytes)}), {self.n_tasks} task(s), "
            f"read amplification {self.read_amplification:.2f}, projected peak "
            f"{format_size(self.projected_peak_bytes)} of {format_size(self.memory_budget)}"
        )
        if self.splits_storage_chunks:
            lines.append(
                "Warning: one storage chunk is larger than the per-chunk budget, so storage chunks "
                f"are split and decoded {self.read_amplification:.2f} times on average; raise "
                "memory_budget or lower threads to avoid it."
            )
        return "\n".join(lines)

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

    def _repr_html_(self) -> str:
        rows = [
            ("shape", self.shape),
            ("dtype", self.dtype),
            ("layout", self.layout),
            ("storage chunks", self.storage_chunks if self.storage_chunks is not None else "contiguous"),
            ("chunks", self.chunks),
            ("chunk bytes", format_size(self.chunk_bytes)),
            ("tasks", self.n_tasks),
            ("read amplification", f"{self.read_amplification:.2f}"),
            ("projected peak", f"{format_size(self.projected_peak_bytes)} of {format_size(self.memory_budget)}"),
            ("threads x workers", f"{self.threads} x {self.workers}"),
        ]
        return card(
            "daskstream ChunkPlan",
            table(rows),
            details("why", self.explain()),
            picture=grid_figure(self.shape, self.storage_chunks, self.chunks),
            caption=f"{self.n_tasks} task(s) of {self.chunks} over {self.shape} {self.dtype}",
        )


def aim(cap: int, preferred: int, parallel: int, itemsize: int) -> int:
    """The chunk size a plan grows towards: the tightest of its bounds, at least one element."""
    return max(itemsize, min(cap, preferred, parallel))


def per_task_cap(memory_budget: int, threads: int, working_set_factor: float, decode_bytes: int = 0) -> int:
    """Bytes one chunk may hold: a thread's share of the budget, less decoding, over the working set."""
    return int((memory_budget // threads - decode_bytes) // working_set_factor)


__all__ = ["LAYOUTS", "ChunkPlan", "aim", "per_task_cap"]
