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
   runs at once, and one task holds about ``working_set_factor`` times its
   chunk (the chunk, a decoded or converted copy, the op's output). So a
   chunk may hold at most ``memory_budget // (threads * working_set_factor)``
   bytes. Only a storage chunk larger than that is split, into pieces whose
   size divides it; the plan then reports how often each is decoded.
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

from daskstream.errors import InvalidAxisError, InvalidBudgetError, InvalidChunksError
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
    def projected_peak_bytes(self) -> int:
        """Memory one worker needs: ``threads`` tasks at ``working_set_factor`` times its chunk."""
        return math.ceil(self.threads * self.working_set_factor * self.chunk_bytes)

    @property
    def min_tasks(self) -> int:
        """Tasks the plan aims for at least, so that no thread idles."""
        return self.min_tasks_per_thread * self.threads * self.workers

    @property
    def aim_bytes(self) -> int:
        """The chunk size the plan grows towards: the tightest of its three bounds."""
        cap = _per_task_cap(self.memory_budget, self.threads, self.working_set_factor)
        return _aim(cap, self.target_chunk_bytes, self.nbytes // self.min_tasks, self.dtype.itemsize)

    @property
    def splits_storage_chunks(self) -> bool:
        """True when some storage chunk is read by more than one task."""
        return self.read_amplification > 1.0

    def explain(self) -> str:
        """Plain-text account of the inputs and why each axis was cut as it was."""
        per_task = _per_task_cap(self.memory_budget, self.threads, self.working_set_factor)
        storage = "contiguous" if self.storage_chunks is None else f"storage chunks {self.storage_chunks}"
        lines = [
            f"Chunk plan for {self.shape} {self.dtype} ({format_size(self.nbytes)}), layout {self.layout}, {storage}",
            f"Budget: {format_size(self.memory_budget)} per worker, {self.threads} thread(s) x "
            f"{self.workers} worker(s); working-set factor {self.working_set_factor:g}, "
            f"so at most {format_size(per_task)} per chunk",
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
        Projected peak memory of one task as a multiple of its chunk.
    min_tasks_per_thread
        Tasks each thread gets at least, when the storage grid allows.

    Returns
    -------
    ChunkPlan

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
        working_set_factor=float(config.get("planning.working-set-factor", working_set_factor)),
        min_tasks_per_thread=int(config.get("planning.min-tasks-per-thread", min_tasks_per_thread)),
    )


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
) -> ChunkPlan:
    """:func:`plan_chunks` with every input given: a pure function, no defaults looked up."""
    shape = _normalize_shape(shape)
    dtype = np.dtype(dtype)
    ndim = len(shape)
    if layout not in LAYOUTS:
        raise InvalidChunksError(f"layout={layout!r} is not one of {LAYOUTS}")
    for name, value in (("threads", threads), ("workers", workers), ("min_tasks_per_thread", min_tasks_per_thread)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidChunksError(f"{name}={value!r} must be a positive int")
    if not working_set_factor >= 1:
        raise InvalidChunksError(f"working_set_factor={working_set_factor!r} must be at least 1")
    if storage_chunks is not None:
        storage_chunks = _normalize_storage_chunks(storage_chunks, shape)
    elif layout == "chunked":
        raise InvalidChunksError('layout="chunked" needs storage_chunks; give them or use layout "C" or "F"')
    reduce_axes = None if reduce_axis is None else normalize_axes(reduce_axis, ndim)

    itemsize = max(dtype.itemsize, 1)
    cap = _per_task_cap(memory_budget, threads, working_set_factor)
    if cap < itemsize:
        raise InvalidBudgetError(
            f"memory_budget={format_size(memory_budget)} leaves {format_size(cap)} per chunk for "
            f"{threads} thread(s) at working-set factor {working_set_factor:g}, less than one "
            f"{dtype} element; raise memory_budget or lower threads"
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
        axis_notes=tuple(notes),
    )


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
        bounds = np.cumsum((0, *lengths))
        starts = np.arange(0, n, sc)
        stops = np.minimum(starts + sc, n)
        # Tasks overlapping [start, stop): those whose chunk starts before stop and ends after start.
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, stops, side="left") - 1
        total *= int(((stops - starts) * (last - first + 1)).sum()) / n
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


def _per_task_cap(memory_budget: int, threads: int, working_set_factor: float) -> int:
    return int(memory_budget // (threads * working_set_factor))


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
        fitting = [d for d in _divisors(unit[axis]) if d * inner <= cap]
        chunks[axis] = max(fitting) if fitting else 1
        notes.append(
            f"axis {axis}: storage chunks of {unit[axis]} cut into pieces of {chunks[axis]}, "
            f"since one storage chunk ({format_size(math.prod(unit) * itemsize)}) exceeds the "
            f"per-chunk budget of {format_size(cap)}"
        )
    else:
        if math.prod(chunks) * itemsize > cap:
            raise InvalidBudgetError(f"no chunk fits the per-chunk budget of {format_size(cap)}")
    return tuple(chunks)


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
