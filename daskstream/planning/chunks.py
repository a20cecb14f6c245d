"""The chunk planner: storage-aligned chunks sized to a memory budget.

Everything here is a pure function of shapes, dtypes and budgets; nothing reads
files or imports dask at module level. :func:`plan_chunks` fills arguments left
as ``None`` from configuration and the running machine (lazily), then hands
plain ints to :func:`plan_chunks_exact`.

The rules, in the order they bind:

1. **Alignment.** A chunk boundary falls on every storage-chunk boundary, so
   each storage chunk is read and decoded by exactly one task (read
   amplification 1.0). Contiguous data (``layout="C"`` or ``"F"``) has no
   decode unit: it is cut into slabs along its slowest axis so each task reads
   one contiguous byte range.
2. **Budget.** ``memory_budget`` is shared by the ``threads`` tasks a worker
   runs at once. One task holds its chunk times ``working_set_factor`` (by
   default the chunk itself plus ``float64_copies`` float64 copies of its
   values: the temporaries of one analysis step, such as a centred copy and
   its square in a variance) and, while it reads, ``decode_bytes`` (a storage
   chunk as stored and decoded). So a chunk may hold at most
   ``(memory_budget // threads - decode_bytes) / working_set_factor`` bytes.
   Only a storage chunk larger than that is split, into pieces whose size
   divides it; the plan then reports how often each is decoded. A budget that
   leaves a task less than one element, or a plan of more than ``max_tasks``
   tasks, is a :class:`~daskstream.errors.MemoryBudgetError`.
3. **Parallelism.** Chunks hold at most ``nbytes // (min_tasks_per_thread *
   threads * workers)`` bytes, so every thread gets work whenever the array
   has that many storage chunks.
4. **Preference.** Below those bounds, chunks grow towards
   ``target_chunk_bytes`` (by default sized to the CPU cache, where a
   reduction runs fastest right after the read).
5. **Balance.** Along each axis the chunk length is evened out
   (``ceil(n / ceil(n / k))`` units) so the last chunk is not a sliver.
6. **Reductions.** With ``reduce_axis`` set on chunked storage, chunks grow
   along the reduced axes first, to their full extent when the budget allows:
   each task's partial result then already spans those axes and the combine
   tree has ``ceil(log_split_every(chunks along the reduced axes))`` levels,
   zero when one chunk spans them. Contiguous data keeps its slabs, because a
   strided read costs more than a deeper combine tree over small partials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

import numpy as np

from daskstream.errors import (
    InvalidArgumentError,
    InvalidAxisError,
    InvalidBudgetError,
    InvalidChunksError,
    MemoryBudgetError,
)
from daskstream.planning.budget import format_size, parse_budget

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

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
        cap = _per_task_cap(self.memory_budget, self.threads, self.working_set_factor, self.decode_bytes)
        return _aim(cap, self.target_chunk_bytes, self.nbytes // self.min_tasks, self.dtype.itemsize)

    @property
    def splits_storage_chunks(self) -> bool:
        """True when some storage chunk is read by more than one task."""
        return self.read_amplification > 1.0

    def explain(self) -> str:
        """Plain-text account of the inputs and why each axis was cut as it was."""
        per_task = _per_task_cap(self.memory_budget, self.threads, self.working_set_factor, self.decode_bytes)
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
        from daskstream.display import card, grid_figure, table

        return card(
            "daskstream ChunkPlan",
            grid_figure(self.shape, self.storage_chunks, self.chunks),
            table(rows),
            f"<details><summary>why</summary><pre>{escape(self.explain())}</pre></details>",
        )


def plan_chunks(
    shape: tuple[int, ...],
    dtype: DTypeLike,
    *,
    storage_chunks: tuple[int, ...] | None = None,
    layout: str = "C",
    memory_budget: int | str | None = None,
    threads: int | None = None,
    workers: int | None = None,
    reduce_axis: int | tuple[int, ...] | None = None,
    target_chunk_bytes: int | str | None = None,
    working_set_factor: float | None = None,
    min_tasks_per_thread: int | None = None,
    decode_bytes: int = 0,
) -> ChunkPlan:
    """Plan storage-aligned chunks for an array, within a memory budget.

    Parameters
    ----------
    shape, dtype
        The array's shape and dtype.
    storage_chunks
        The on-disk chunk grid (for sharded Zarr, the shard grid); ``None`` when
        the data is contiguous.
    layout
        ``"C"`` or ``"F"`` for contiguous data, ``"chunked"`` for chunked storage.
    memory_budget
        Bytes one worker process may use, shared by its threads (int or string
        such as ``"2GiB"``). ``None``: setting ``daskstream.memory-budget``,
        else the active Client's worker memory limit, else a share of this
        machine's available memory.
    threads, workers
        Concurrent tasks per worker and number of workers. ``None``: the
        active Client's, else this machine's CPU count and 1.
    reduce_axis
        Axes a following reduction removes; chunks then span them first.
    target_chunk_bytes
        Preferred chunk size below the hard bounds. ``None``: setting
        ``daskstream.planning.target-chunk-bytes`` ("auto" sizes it to the CPU cache).
    working_set_factor
        Projected peak memory of one task as a multiple of its chunk. ``None``:
        setting ``daskstream.planning.working-set-factor``, whose ``"auto"``
        is :func:`analysis_working_set_factor` of the dtype.
    min_tasks_per_thread
        Tasks each thread gets at least, when the storage grid allows.
    decode_bytes
        Bytes a read holds beyond its chunk while it decodes storage chunks
        (:attr:`daskstream.Source.decode_bytes`).

    Returns
    -------
    ChunkPlan

    Raises
    ------
    MemoryBudgetError
        When the budget leaves a task less than one element, or the plan
        would have more than ``daskstream.planning.max-tasks`` tasks.

    Examples
    --------
    >>> plan = plan_chunks((1000, 1000), "f8", storage_chunks=(100, 100), layout="chunked",
    ...                    memory_budget="64MiB", threads=2, workers=1, target_chunk_bytes="1MiB")
    >>> plan.chunks, plan.n_tasks, plan.read_amplification
    ((100, 1000), 10, 1.0)
    >>> plan_chunks((10_000, 100), "f4", memory_budget="1GiB", threads=2, workers=1,
    ...             target_chunk_bytes="1MiB").chunks
    (2500, 100)
    """
    from daskstream import config
    from daskstream.runtime.resources import resolve_resources

    found = resolve_resources(memory_budget=memory_budget, threads=threads, workers=workers)
    target = config.get("planning.target-chunk-bytes", target_chunk_bytes)
    if target == "auto":
        from daskstream.runtime.resources import cache_sized_chunk_bytes

        target = cache_sized_chunk_bytes()
    factor = configured_working_set_factor(dtype, working_set_factor)
    return plan_chunks_exact(
        shape,
        dtype,
        storage_chunks=storage_chunks,
        layout=layout,
        memory_budget=found.memory_budget,
        threads=found.threads,
        workers=found.workers,
        reduce_axis=reduce_axis,
        target_chunk_bytes=parse_budget(target, name="target_chunk_bytes"),
        working_set_factor=factor,
        min_tasks_per_thread=config.setting("planning.min-tasks-per-thread", min_tasks_per_thread),
        decode_bytes=decode_bytes,
        max_tasks=config.setting("planning.max-tasks"),
    )


def configured_working_set_factor(dtype: DTypeLike, value: float | None = None) -> float:
    """``value``, else the setting ``daskstream.planning.working-set-factor`` for ``dtype`` (resolving ``"auto"``)."""
    from daskstream import config

    factor = config.get("planning.working-set-factor", value)
    if factor == "auto":
        return analysis_working_set_factor(dtype, config.setting("planning.float64-copies"))
    return float(factor)


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


def plan_chunks_exact(
    shape: tuple[int, ...],
    dtype: DTypeLike,
    *,
    storage_chunks: tuple[int, ...] | None,
    layout: str,
    memory_budget: int,
    threads: int,
    workers: int,
    reduce_axis: int | tuple[int, ...] | None,
    target_chunk_bytes: int,
    working_set_factor: float,
    min_tasks_per_thread: int,
    decode_bytes: int = 0,
    max_tasks: int | None = None,
) -> ChunkPlan:
    """:func:`plan_chunks` with every input given: a pure function, no defaults looked up.

    ``max_tasks`` (``None``: no ceiling) refuses plans with more tasks.
    """
    shape = _normalize_shape(shape)
    dtype = checked_dtype(dtype)
    ndim = len(shape)
    if layout not in LAYOUTS:
        raise InvalidChunksError(f"layout={layout!r} is not one of {LAYOUTS}")
    for name, value in (("threads", threads), ("workers", workers), ("min_tasks_per_thread", min_tasks_per_thread)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name}={value!r} must be a positive int")
    if not working_set_factor >= 1:
        raise InvalidChunksError(f"working_set_factor={working_set_factor!r} must be at least 1")
    if storage_chunks is not None:
        storage_chunks = _normalize_storage_chunks(storage_chunks, shape)
    elif layout == "chunked":
        raise InvalidChunksError('layout="chunked" needs storage_chunks; give them or use layout "C" or "F"')
    reduce_axes = None if reduce_axis is None else normalize_axes(reduce_axis, ndim)

    itemsize = max(dtype.itemsize, 1)
    cap = _per_task_cap(memory_budget, threads, working_set_factor, decode_bytes)
    if cap < itemsize:
        decoding = (
            f", after {format_size(decode_bytes)} to decode one storage chunk {storage_chunks}" if decode_bytes else ""
        )
        raise MemoryBudgetError(
            f"memory_budget={format_size(memory_budget)} leaves {format_size(max(cap, 0))} per chunk for "
            f"{threads} thread(s) at working-set factor {working_set_factor:g}{decoding}, less than one "
            f"{dtype} element; raise memory_budget to at least "
            f"{format_size(threads * (decode_bytes + math.ceil(working_set_factor * itemsize)))} or lower threads"
        )
    nbytes = math.prod(shape) * itemsize
    target = _aim(cap, target_chunk_bytes, nbytes // (min_tasks_per_thread * threads * workers), itemsize)

    notes: list[str] = []
    if nbytes == 0:
        chunks = tuple(max(n, 0) for n in shape)
        notes.append("the array is empty: one task")
        amplification = 1.0
    elif storage_chunks is None or (layout in ("C", "F") and storage_chunks == shape):
        order = range(ndim) if layout != "F" else range(ndim - 1, -1, -1)
        chunks = _contiguous_slabs(shape, itemsize, list(order), target, notes)
        amplification = 1.0
        storage_chunks = None
    else:
        chunks = _aligned_chunks(shape, itemsize, storage_chunks, reduce_axes, target, cap, notes)
        amplification = None

    n_tasks = math.prod(math.ceil(n / c) if c else 1 for n, c in zip(shape, chunks))
    if max_tasks is not None and n_tasks > max_tasks:
        raise MemoryBudgetError(
            f"memory_budget={format_size(memory_budget)} leaves {format_size(cap)} per chunk for {threads} "
            f"thread(s), so {shape} {dtype} ({format_size(nbytes)}) would take {n_tasks:,} tasks, more than "
            f"the {max_tasks:,} daskstream plans at most (daskstream.planning.max-tasks; the task graph alone "
            f"would outgrow the budget); raise memory_budget to at least "
            f"{format_size(_budget_for_tasks(nbytes, max_tasks, threads, working_set_factor, decode_bytes))}"
        )
    if amplification is None:
        # Only now: it costs one step per task, and a plan past the ceiling must fail at once.
        amplification = read_amplification(shape, storage_chunks, chunks)
    return ChunkPlan(
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        storage_chunks=storage_chunks,
        layout=layout,
        memory_budget=memory_budget,
        threads=threads,
        workers=workers,
        working_set_factor=working_set_factor,
        read_amplification=amplification,
        reduce_axis=reduce_axes,
        target_chunk_bytes=target_chunk_bytes,
        min_tasks_per_thread=min_tasks_per_thread,
        decode_bytes=decode_bytes,
        axis_notes=tuple(notes),
    )


def fit_halo_chunks(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    halo: tuple[int, ...],
    itemsize: int,
    *,
    per_task_bytes: int,
    working_set_factor: float,
    decode_bytes: int = 0,
    unit: tuple[int, ...] | None = None,
    what: str = "a kernel",
) -> tuple[int, ...]:
    """The largest chunks, at most ``chunks``, whose blocks with ``halo`` cells on each side fit one task.

    A task holds its haloed block times ``working_set_factor`` plus
    ``decode_bytes``. Chunks shrink by halving the first axis longer than
    one cell (the slowest in C order, so a block of a contiguous array stays
    one byte range as long as it can), staying multiples of ``unit`` (the
    storage chunks) as long as one unit fits.

    Raises
    ------
    MemoryBudgetError
        When even a block of one cell, with its halo, does not fit: the halo is too deep for the budget.

    Examples
    --------
    >>> fit_halo_chunks((1000, 1000), (500, 1000), (1, 1), 8, per_task_bytes=4 * 2**20, working_set_factor=4)
    (125, 1000)
    """

    def cost(c: tuple[int, ...]) -> int:
        haloed = math.prod(min(n, k + 2 * h) for n, k, h in zip(shape, c, halo))
        return math.ceil(haloed * itemsize * working_set_factor) + decode_bytes

    smallest = tuple(1 if n else 0 for n in shape)
    if cost(smallest) > per_task_bytes:
        widest = tuple(min(n, 1 + 2 * h) for n, h in zip(shape, halo))
        raise MemoryBudgetError(
            f"{what} with a halo of {halo} cells needs blocks of at least {widest} with the halo "
            f"({format_size(math.prod(widest) * itemsize)}), {format_size(cost(smallest))} with its working set "
            f"(x{working_set_factor:g}{f', and {format_size(decode_bytes)} to decode storage' if decode_bytes else ''}),"
            f" more than the {format_size(per_task_bytes)} one task may hold; lower the depth or raise memory_budget"
        )
    current = [max(1, min(c, n)) if n else 0 for c, n in zip(chunks, shape)]
    steps = [max(1, min(u, n)) if n else 1 for u, n in zip(unit or smallest, shape)]
    while cost(tuple(current)) > per_task_bytes:
        # Whole storage units first; below one unit (read amplification) only when nothing else fits.
        above = [a for a, c in enumerate(current) if c > steps[a]]
        axis = above[0] if above else next(a for a, c in enumerate(current) if c > 1)
        step = steps[axis] if above else 1
        current[axis] = max(step, (current[axis] // 2) // step * step)
    return tuple(current)


def read_amplification(
    shape: tuple[int, ...],
    storage_chunks: tuple[int, ...] | None,
    chunks: tuple[int, ...] | tuple[tuple[int, ...], ...],
) -> float:
    """Bytes decoded over bytes stored when tasks of ``chunks`` read ``storage_chunks``.

    ``chunks`` is one chunk's shape (a regular grid) or dask's tuple of tuples.
    Each storage chunk is decoded once per task that overlaps it. The count
    factorises over axes, so this is the product, over axes, of the mean number
    of task chunks overlapping each storage chunk, weighted by its length.

    >>> read_amplification((100,), (10,), (5,))
    2.0
    >>> read_amplification((100, 10), (10, 10), (20, 10))
    1.0
    >>> read_amplification((10,), (5,), ((3, 7),))
    1.5
    """
    if storage_chunks is None or math.prod(shape) == 0:
        return 1.0
    total = 1.0
    for n, sc, c in zip(shape, storage_chunks, chunks):
        lengths = _axis_chunks(n, c) if isinstance(c, int) else c
        bounds = np.cumsum((0, *lengths), dtype=np.int64)
        starts, stops = bounds[:-1], bounds[1:]
        starts, stops = starts[stops > starts], stops[stops > starts]
        # Summed over tasks rather than storage chunks (there may be far more of those): each task
        # decodes the whole storage chunks it overlaps, from the first to the last.
        covered = np.minimum(n, (stops - 1) // sc * sc + sc) - starts // sc * sc
        total *= int(covered.sum()) / n
    return total


def regular_grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Dask's chunks for a regular grid of ``chunks`` over ``shape`` (the last ones ragged).

    >>> regular_grid((10, 4), (4, 4))
    ((4, 4, 2), (4,))
    """
    return tuple(_axis_chunks(n, c) for n, c in zip(shape, chunks))


def _axis_chunks(n: int, c: int) -> tuple[int, ...]:
    if n == 0:
        return (0,)
    full, rest = divmod(n, c)
    return (c,) * full + ((rest,) if rest else ())


def _aim(cap: int, preferred: int, parallel: int, itemsize: int) -> int:
    return max(itemsize, min(cap, preferred, parallel))


def _per_task_cap(memory_budget: int, threads: int, working_set_factor: float, decode_bytes: int = 0) -> int:
    return int((memory_budget // threads - decode_bytes) // working_set_factor)


def _budget_for_tasks(nbytes: int, max_tasks: int, threads: int, working_set_factor: float, decode_bytes: int) -> int:
    """The budget whose chunks cut ``nbytes`` into ``max_tasks`` tasks or fewer."""
    return threads * (math.ceil(working_set_factor * math.ceil(nbytes / max_tasks)) + decode_bytes)


def _balanced(n_units: int, k: int) -> int:
    """Largest even share of ``n_units`` in ``ceil(n_units / k)`` pieces, at most ``k``."""
    return math.ceil(n_units / math.ceil(n_units / k))


def _contiguous_slabs(
    shape: tuple[int, ...], itemsize: int, order: list[int], target: int, notes: list[str]
) -> tuple[int, ...]:
    """Slabs along ``order[0]`` (the slowest axis); cut further axes only if one slab is too big.

    A chunk is a contiguous byte range only if every axis after the cut one is
    whole and every axis before it holds one index, so the cut goes on the
    first axis (in storage order) whose one index, with everything after it,
    fits the target.
    """
    if math.prod(shape) * itemsize <= target:
        notes.extend(f"axis {a}: kept whole ({shape[a]}), the whole array fits one chunk" for a in sorted(order))
        return tuple(shape)
    chunks = list(shape)
    for position, axis in enumerate(order):
        inner = math.prod(shape[a] for a in order[position + 1 :]) * itemsize
        if inner > target:
            chunks[axis] = 1
            notes.append(
                f"axis {axis}: one index per chunk, since one slab of it ({format_size(inner)}) exceeds the chunk size"
            )
            continue
        k = _balanced(shape[axis], max(1, target // inner))
        chunks[axis] = k
        notes.append(
            f"axis {axis}: cut into {math.ceil(shape[axis] / k)} slab(s) of {k} "
            f"({format_size(k * inner)} each, target {format_size(target)}); each task reads "
            "one contiguous byte range"
        )
        notes.extend(f"axis {a}: kept whole ({shape[a]}), inside the slab" for a in order[position + 1 :])
        break
    notes.sort(key=_note_axis)
    return tuple(chunks)


def _note_axis(note: str) -> int:
    return int(note.split(":")[0].split()[1])


def _aligned_chunks(
    shape: tuple[int, ...],
    itemsize: int,
    storage_chunks: tuple[int, ...],
    reduce_axes: tuple[int, ...] | None,
    target: int,
    cap: int,
    notes: list[str],
) -> tuple[int, ...]:
    """Whole multiples of the storage chunks, grown axis by axis up to ``target``."""
    ndim = len(shape)
    unit = [min(sc, n) for sc, n in zip(storage_chunks, shape)]
    unit_bytes = math.prod(unit) * itemsize
    if unit_bytes > cap:
        return _split_storage_chunks(shape, itemsize, unit, cap, notes)

    # Reduced axes first (a shallow combine tree), then C order from the fastest axis.
    rest = [a for a in range(ndim - 1, -1, -1) if reduce_axes is None or a not in reduce_axes]
    order = list(reduce_axes or ()) + rest
    multiples = [1] * ndim
    chunk_bytes = unit_bytes
    for axis in order:
        n_units = math.ceil(shape[axis] / unit[axis])
        room = target // chunk_bytes
        if room <= 1:
            if n_units > 1:
                notes.append(f"axis {axis}: one storage chunk ({unit[axis]}) per task; larger chunks exceed the target")
            else:
                notes.append(f"axis {axis}: kept whole ({shape[axis]}), one storage chunk")
            continue
        k = _balanced(n_units, min(n_units, room))
        multiples[axis] = k
        chunk_bytes *= k
        why = "reduced axis, spanned first" if reduce_axes and axis in reduce_axes else "grown towards the target"
        if k >= n_units:
            notes.append(f"axis {axis}: kept whole ({shape[axis]} = {n_units} storage chunk(s)); {why}")
        else:
            notes.append(
                f"axis {axis}: {k} storage chunks of {unit[axis]} per task ({math.ceil(n_units / k)} tasks "
                f"along it); {why}, evened out so the last chunk is not a sliver"
            )
    notes.sort(key=_note_axis)
    return tuple(min(u * k, n) for u, k, n in zip(unit, multiples, shape))


def _split_storage_chunks(
    shape: tuple[int, ...], itemsize: int, unit: list[int], cap: int, notes: list[str]
) -> tuple[int, ...]:
    """Cut storage chunks into equal pieces (divisors of their length) that fit ``cap``."""
    chunks = list(unit)
    for axis in range(len(shape)):
        inner = math.prod(chunks[axis + 1 :]) * itemsize
        if chunks[axis] * inner <= cap:
            break
        if unit[axis] <= _MAX_DIVISOR_SEARCH:
            fitting = [d for d in _divisors(unit[axis]) if d * inner <= cap]
            chunks[axis] = max(fitting) if fitting else 1
        else:
            # Listing the divisors of so long a chunk would take minutes: the most that fits, if uneven.
            chunks[axis] = max(1, cap // inner)
        notes.append(
            f"axis {axis}: storage chunks of {unit[axis]} cut into pieces of {chunks[axis]}, "
            f"since one storage chunk ({format_size(math.prod(unit) * itemsize)}) exceeds the "
            f"per-chunk budget of {format_size(cap)}"
        )
    else:
        if math.prod(chunks) * itemsize > cap:
            raise InvalidBudgetError(f"no chunk fits the per-chunk budget of {format_size(cap)}")
    return tuple(chunks)


# Storage chunks longer than this are cut without looking for an even divisor (sqrt(n) steps).
_MAX_DIVISOR_SEARCH = 10**12


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _normalize_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    try:
        out = tuple(int(n) for n in shape)
    except TypeError as exc:
        raise InvalidChunksError(f"shape={shape!r} must be a tuple of ints") from exc
    if any(n < 0 for n in out):
        raise InvalidChunksError(f"shape={shape!r} has a negative length")
    return out


def _normalize_storage_chunks(storage_chunks: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    out = tuple(int(c) for c in storage_chunks)
    if len(out) != len(shape):
        raise InvalidChunksError(
            f"storage_chunks={storage_chunks!r} has {len(out)} axes but the array has {len(shape)}"
        )
    if any(c < 1 for c in out):
        raise InvalidChunksError(f"storage_chunks={storage_chunks!r} must all be positive")
    return out


def normalize_axes(axis: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """Sorted, non-negative, unique axes; :class:`InvalidAxisError` for any outside ``ndim``.

    >>> normalize_axes((-1, 0), 3)
    (0, 2)
    """
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            valid = f"use 0..{ndim - 1} or -{ndim}..-1" if ndim else "a 0-d array has no axes: give axis=None"
            raise InvalidAxisError(f"axis {a!r} is out of range for an array with {ndim} dimension(s); {valid}")
        out.append(int(a) % ndim)
    return tuple(sorted(set(out)))
