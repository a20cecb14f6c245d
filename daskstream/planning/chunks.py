"""The chunk planner: storage-aligned chunks sized to a memory budget.

Everything here is a pure function of shapes, dtypes and budgets: nothing
reads files or settings or asks a scheduler. :func:`plan_chunks`
takes the frozen :class:`~daskstream.planning.settings.PlanSettings` resolved
where the call entered daskstream and hands plain ints to
:func:`plan_chunks_exact`.

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

The module is longer than most modules: these rules bind one another (a
budget cut changes what balance and reductions may do), so they are kept
beside each other, with the halo fitting that applies them to kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from numpy.typing import DTypeLike

from daskstream.advice import keyword, named, said
from daskstream.errors import InvalidArgumentError, InvalidBudgetError, InvalidChunksError, MemoryBudgetError
from daskstream.planning.budget import MAX_BUDGET_BYTES, format_size
from daskstream.planning.grid import normalize_axes, read_amplification
from daskstream.planning.plan import LAYOUTS, ChunkPlan, aim_with_reason, per_task_cap
from daskstream.planning.settings import PlanSettings, SchedulerCost, checked_dtype
from daskstream.planning.spans import plan_span


def plan_chunks(
    shape: tuple[int, ...],
    dtype: DTypeLike,
    settings: PlanSettings,
    *,
    storage_chunks: tuple[int, ...] | None = None,
    layout: str = "C",
    reduce_axis: int | tuple[int, ...] | None = None,
    decode_bytes: int = 0,
) -> ChunkPlan:
    """Plan storage-aligned chunks for an array, within the budget ``settings`` give.

    Parameters
    ----------
    shape, dtype
        The array's shape and dtype.
    settings
        The resources and planner settings, resolved where the call entered
        daskstream (:func:`daskstream.runtime.resources.resolve_settings`).
    storage_chunks
        The on-disk chunk grid (for sharded Zarr, the shard grid); ``None`` when
        the data is contiguous.
    layout
        ``"C"`` or ``"F"`` for contiguous data, ``"chunked"`` for chunked storage.
    reduce_axis
        Axes a following reduction removes; chunks then span them first.
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
        would have more than ``settings.max_tasks`` tasks.

    Examples
    --------
    >>> from daskstream.planning.settings import PlanSettings, Resources
    >>> settings = PlanSettings(Resources(64 * 2**20, threads=2, workers=1, origin="arguments"),
    ...                         target_chunk_bytes=2**20)
    >>> plan = plan_chunks((1000, 1000), "f8", settings, storage_chunks=(100, 100), layout="chunked")
    >>> plan.chunks, plan.n_tasks, plan.read_amplification
    ((1000, 100), 10, 1.0)
    >>> plan_chunks((10_000, 100), "f4", settings.with_budget(2**30)).chunks
    (2500, 100)
    """
    resources = settings.resources
    return plan_chunks_exact(
        shape,
        dtype,
        storage_chunks=storage_chunks,
        layout=layout,
        memory_budget=resources.memory_budget,
        threads=resources.threads,
        workers=resources.workers,
        reduce_axis=reduce_axis,
        target_chunk_bytes=settings.target_chunk_bytes,
        working_set_factor=settings.working_set_factor_for(dtype),
        min_tasks_per_thread=settings.min_tasks_per_thread,
        decode_bytes=decode_bytes,
        scheduler=settings.scheduler,
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
    decode_bytes: int = 0,
    scheduler: SchedulerCost | None = None,
) -> ChunkPlan:
    """:func:`plan_chunks` with every input given as a plain value.

    ``scheduler`` (default: :class:`SchedulerCost`'s defaults, no task ceiling)
    sets the floors chunks grow to; a plan whose chunks at the per-chunk cap
    still make more tasks than its ``max_tasks`` is returned with the budget
    that would bring it within (``budget_within_ceiling``): parts of such an
    array compute, the whole at once is refused where it is computed.
    """
    scheduler = scheduler or SchedulerCost()
    shape = _normalize_shape(shape)
    dtype = checked_dtype(dtype)
    ndim = len(shape)
    if layout not in LAYOUTS:
        raise InvalidChunksError(f"layout={layout!r} is not one of {LAYOUTS}")
    for name, value in (("threads", threads), ("workers", workers), ("min_tasks_per_thread", min_tasks_per_thread)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(said(keyword(name, value), " must be a positive int"))
    if not working_set_factor >= 1:
        raise InvalidChunksError(f"working_set_factor={working_set_factor!r} must be at least 1")
    if storage_chunks is not None:
        storage_chunks = _normalize_storage_chunks(storage_chunks, shape)
    elif layout == "chunked":
        raise InvalidChunksError('layout="chunked" needs storage_chunks; give them or use layout "C" or "F"')
    reduce_axes = None if reduce_axis is None else normalize_axes(reduce_axis, ndim)

    itemsize = max(dtype.itemsize, 1)
    nbytes = math.prod(shape) * itemsize

    def cut(budget: int, notes: list[tuple[int, str]]) -> tuple[int, ...]:
        # The chunk shape for ``budget``: grown towards the aim, in whole storage chunks or slabs.
        cap = per_task_cap(budget, threads, working_set_factor, decode_bytes)
        target, _ = aim_with_reason(
            cap,
            target_chunk_bytes,
            nbytes // (min_tasks_per_thread * threads * workers),
            itemsize,
            load_floor=scheduler.load_floor_bytes(threads * workers),
            graph_floor=scheduler.graph_floor_bytes(nbytes),
            start_floor=scheduler.start_floor_bytes(nbytes),
        )
        if nbytes == 0:
            notes.append((-1, "the array is empty: one task"))
            return tuple(max(n, 0) for n in shape)
        while True:
            said: list[tuple[int, str]] = []
            if storage_chunks is None or (layout in ("C", "F") and storage_chunks == shape):
                order = range(ndim) if layout != "F" else range(ndim - 1, -1, -1)
                chunks = _contiguous_slabs(shape, itemsize, list(order), target, said)
            else:
                chunks = _aligned_chunks(shape, itemsize, storage_chunks, reduce_axes, target, cap, said)
            # Whole storage chunks, evened out, hold less than the aim: where the graph's ceiling or the time to
            # the first task set it, the aim grows (an eighth at a time, within the cap) until the blocks are
            # within both.
            if most_blocks is None or tasks(chunks) <= most_blocks or target >= cap:
                notes.extend(said)
                return chunks
            target = min(cap, target + max(target // 8, itemsize))

    def tasks(chunks: tuple[int, ...]) -> int:
        return math.prod(math.ceil(n / c) if c else 1 for n, c in zip(shape, chunks))

    ceiling = scheduler.max_blocks
    most_blocks = min((b for b in (ceiling, scheduler.start_blocks) if b is not None), default=None)

    def few_decodes(budget: int) -> bool:
        # A budget whose plan fits an element and decodes each storage chunk a few times at most.
        if per_task_cap(budget, threads, working_set_factor, decode_bytes) < itemsize:
            return False
        if storage_chunks is None or not decode_bytes:
            return True
        return read_amplification(shape, storage_chunks, cut(budget, [])) <= MAX_DECODED_AMPLIFICATION

    cap = per_task_cap(memory_budget, threads, working_set_factor, decode_bytes)
    if cap < itemsize:
        decoding = (
            f", after {format_size(decode_bytes)} to decode one storage chunk {storage_chunks}" if decode_bytes else ""
        )
        least = _least_budget(memory_budget, few_decodes)
        raise _refused(
            memory_budget,
            f" leaves {format_size(max(cap, 0))} per chunk for {threads} thread(s) at working-set factor "
            f"{working_set_factor:g}{decoding}, less than one {dtype} element",
            least or threads * (decode_bytes + math.ceil(working_set_factor * itemsize)),
        )
    notes: list[tuple[int, str]] = []
    chunks = cut(memory_budget, notes)
    within = None
    if ceiling is not None and tasks(chunks) > ceiling:
        # Even chunks at the per-chunk cap make too many tasks: the least budget whose plan is within the
        # ceiling, found by planning (chunks are whole storage chunks, evened out: only a plan says how many).
        within = _least_budget(memory_budget, lambda budget: tasks(cut(budget, [])) <= ceiling)
    span = (
        _span(shape, chunks, itemsize, scheduler, ceiling, threads * workers)
        if ceiling is not None and within is not None and scheduler.spans
        else None
    )
    if storage_chunks is None or (layout in ("C", "F") and storage_chunks == shape):
        storage_chunks = None  # contiguous: cut in slabs, each one byte range
        amplification = 1.0
    else:
        amplification = 1.0 if nbytes == 0 else read_amplification(shape, storage_chunks, chunks)
    if decode_bytes and amplification > MAX_DECODED_AMPLIFICATION:
        raise _refused(
            memory_budget,
            f" fits only pieces of the storage chunks {storage_chunks} ({format_size(decode_bytes)} to decode "
            f"each), so each would be decoded {amplification:,.0f} times on average",
            _least_budget(memory_budget, few_decodes),
            ", or store the data in smaller chunks (daskstream convert ... --chunks)",
        )
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
        scheduler=scheduler,
        axis_notes=tuple(text for _, text in sorted(notes, key=lambda note: note[0])),
        budget_within_ceiling=within,
        span=span,
    )


def _span(
    shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int, scheduler: SchedulerCost, ceiling: int, threads: int
) -> tuple[int, ...] | None:
    """Chunks per task along each axis for chunks outnumbering ``ceiling`` (see :mod:`daskstream.planning.spans`)."""
    if math.prod(chunks) * itemsize < scheduler.span_chunk_floor_bytes:
        return None  # chunks so small that stepping through them would cost more than reading them
    counts = tuple(-(-n // max(1, c)) for n, c in zip(shape, chunks, strict=True))
    nbytes = math.prod(shape) * itemsize
    floor = max(scheduler.graph_floor_bytes(nbytes), scheduler.start_floor_bytes(nbytes))
    return plan_span(counts, math.prod(chunks) * itemsize, max_blocks=ceiling, floor_bytes=floor, threads=threads)


def span_of_blocks(
    shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int, scheduler: SchedulerCost, threads: int
) -> tuple[int, ...] | None:
    """Blocks of ``chunks`` per task along each axis, where blocks of a size fixed otherwise (a kernel's, each
    what a task may compute at once with its halo) outnumber what a graph may hold and ``scheduler`` plans
    spans; else ``None`` (see :mod:`daskstream.planning.spans`).

    >>> cost = SchedulerCost(max_tasks=400, spans=True)
    >>> span_of_blocks((1_000_000, 100), (1000, 100), 8, cost, threads=2)
    (10, 1)
    >>> span_of_blocks((1_000_000, 100), (1000, 100), 8, SchedulerCost(max_tasks=400), threads=2) is None
    True
    """
    ceiling = scheduler.max_blocks
    if ceiling is None or not scheduler.spans:
        return None
    return _span(shape, chunks, itemsize, scheduler, ceiling, threads)


def dividing_chunk(length: int, at_most: int, unit: int = 1) -> int:
    """The longest chunk of at most ``at_most`` cells that cuts ``length`` evenly, a multiple of ``unit`` where
    one is (so that blocks line up with spans of ``length`` and stay whole storage chunks).

    >>> dividing_chunk(6000, 740, 20), dividing_chunk(6000, 740, 7), dividing_chunk(7, 3)
    (600, 600, 1)
    """
    divisors = {d for i in range(1, math.isqrt(max(length, 1)) + 1) if length % i == 0 for d in (i, length // i)}
    fitting = [d for d in divisors if d <= max(at_most, 1)]
    whole_units = [d for d in fitting if d % max(unit, 1) == 0]
    return max(whole_units or fitting)


# How many times the planned chunk's cells a block with a halo may hold (within the task's memory share):
# larger blocks read their halos fewer times.
HALO_BLOCK_GROWTH = 4


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
    """``chunks``, or where their blocks with ``halo`` cells on each side do not fit one task, the largest that do.

    A task holds its haloed block times ``working_set_factor`` plus
    ``decode_bytes``. Chunks shrink by halving, each time, the axis whose
    halving adds the least halo per cell computed (the slowest of those
    within 1% of it, so a block of a contiguous array stays one byte range
    while the halo is shallow; a deep halo gets blocks near square), staying
    multiples of ``unit`` (the storage chunks) as long as one unit fits.

    Raises
    ------
    MemoryBudgetError
        When even a block of one cell, with its halo, does not fit: the halo is too deep for the budget.

    Examples
    --------
    >>> fit_halo_chunks((1000, 1000), (500, 1000), (1, 1), 8, per_task_bytes=4 * 2**20, working_set_factor=4)
    (125, 1000)
    >>> fit_halo_chunks((16384, 16384), (8192, 16384), (48, 48), 4, per_task_bytes=8 * 2**20, working_set_factor=3)
    (512, 1024)
    """

    def cost(c: tuple[int, ...]) -> int:
        haloed = math.prod(min(n, k + 2 * h) for n, k, h in zip(shape, c, halo))
        return math.ceil(haloed * itemsize * working_set_factor) + decode_bytes

    smallest = tuple(1 if n else 0 for n in shape)
    if cost(smallest) > per_task_bytes:
        widest = tuple(min(n, 1 + 2 * h) for n, h in zip(shape, halo))
        raise MemoryBudgetError(
            said(
                f"{what} with a halo of {halo} cells needs blocks of at least {widest} with the halo "
                f"({format_size(math.prod(widest) * itemsize)}), {format_size(cost(smallest))} with its working set "
                f"(x{working_set_factor:g}{f', and {format_size(decode_bytes)} to decode storage' if decode_bytes else ''}),"
                f" more than the {format_size(per_task_bytes)} one task may hold; lower the depth or raise ",
                named("memory_budget"),
            )
        )
    # ``chunks`` as they are when their blocks fit with the halo (the planner's, or the user's own). When
    # they must change anyway: blocks of any shape (the halving below makes them as square as the halo
    # wants) up to HALO_BLOCK_GROWTH times the cells of ``chunks``, within the task's share, since each
    # block reads its halo again.
    current = [max(1, min(c, n)) if n else 0 for c, n in zip(chunks, shape)]
    cells = math.prod(current)
    if any(halo) and cost(tuple(current)) > per_task_bytes:
        cells *= HALO_BLOCK_GROWTH
        current = [max(1, n) if n else 0 for n in shape]
    steps = [max(1, min(u, n)) if n else 1 for u, n in zip(unit or smallest, shape)]

    def growth(axis: int) -> float:
        # How much halving this axis raises the cells read per cell computed: (c + 4h) / (c + 2h).
        c, h = current[axis], halo[axis]
        return (c + 4 * h) / (c + 2 * h)

    while cost(tuple(current)) > per_task_bytes or math.prod(current) > cells:
        # Whole storage units first; below one unit (read amplification) only when nothing else fits.
        above = [a for a, c in enumerate(current) if c > steps[a]]
        candidates = above or [a for a, c in enumerate(current) if c > 1]
        # The axis whose halving adds the least halo per cell, the slowest of those within 1% of it: a
        # deep halo then gets blocks near square rather than slabs one cell thin, each reading its halo.
        least = min(growth(a) for a in candidates)
        axis = next(a for a in candidates if growth(a) <= least * 1.01)
        step = steps[axis] if above else 1
        current[axis] = max(step, (current[axis] // 2) // step * step)
    return tuple(current)


def _refused(budget: int, why: str, enough: int | None, besides: str = "") -> MemoryBudgetError:
    """The error for a ``budget`` no plan fits, ``why``, naming the least that does (``enough``)."""
    return MemoryBudgetError(
        said(
            keyword("memory_budget", text=format_size(budget)),
            f"{why}; raise ",
            named("memory_budget"),
            f" to at least {format_size(enough)}" if enough else "",
            " or lower ",
            named("threads"),
            besides,
        )
    )


def _least_budget(budget: int, fits: Callable[[int], bool]) -> int | None:
    """The least budget above ``budget`` (to a sixteenth) that ``fits``; ``None`` if not even 1 EiB does.

    Doubling finds one that fits, bisection the least; a plan costs
    microseconds, so some hundred of them stay well within a second.
    """
    high = max(budget, 1) * 2
    while not fits(high):
        if high > MAX_BUDGET_BYTES:
            return None
        high *= 2
    low = high // 2
    while high - low > max(high // 16, 1):
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def _balanced(n_units: int, k: int) -> int:
    """Largest even share of ``n_units`` in ``ceil(n_units / k)`` pieces, at most ``k``."""
    return math.ceil(n_units / math.ceil(n_units / k))


def _contiguous_slabs(
    shape: tuple[int, ...], itemsize: int, order: list[int], target: int, notes: list[tuple[int, str]]
) -> tuple[int, ...]:
    """Slabs along ``order[0]`` (the slowest axis); cut further axes only if one slab is too big.

    A chunk is a contiguous byte range only if every axis after the cut one is
    whole and every axis before it holds one index, so the cut goes on the
    first axis (in storage order) whose one index, with everything after it,
    fits the target.
    """
    if math.prod(shape) * itemsize <= target:
        notes.extend((a, f"axis {a}: kept whole ({shape[a]}), the whole array fits one chunk") for a in sorted(order))
        return tuple(shape)
    chunks = list(shape)
    for position, axis in enumerate(order):
        inner = math.prod(shape[a] for a in order[position + 1 :]) * itemsize
        if inner > target:
            chunks[axis] = 1
            notes.append(
                (
                    axis,
                    f"axis {axis}: one index per chunk, since one slab of it ({format_size(inner)}) exceeds the chunk size",
                ),
            )
            continue
        k = _balanced(shape[axis], max(1, target // inner))
        chunks[axis] = k
        notes.append(
            (
                axis,
                f"axis {axis}: cut into {math.ceil(shape[axis] / k)} slab(s) of {k} "
                f"({format_size(k * inner)} each, target {format_size(target)}); each task reads "
                "one contiguous byte range",
            ),
        )
        notes.extend((a, f"axis {a}: kept whole ({shape[a]}), inside the slab") for a in order[position + 1 :])
        break
    return tuple(chunks)


def _aligned_chunks(
    shape: tuple[int, ...],
    itemsize: int,
    storage_chunks: tuple[int, ...],
    reduce_axes: tuple[int, ...] | None,
    target: int,
    cap: int,
    notes: list[tuple[int, str]],
) -> tuple[int, ...]:
    """Whole multiples of the storage chunks, grown axis by axis up to ``target``."""
    ndim = len(shape)
    unit = [min(sc, n) for sc, n in zip(storage_chunks, shape)]
    unit_bytes = math.prod(unit) * itemsize
    if unit_bytes > cap:
        return _split_storage_chunks(shape, itemsize, unit, cap, notes)

    # Reduced axes first (a shallow combine tree), then from the slowest axis: while only the slowest axis
    # holds more than one storage chunk, each chunk is one contiguous run of the task's block, so an
    # unfiltered chunk is read straight into it and a decoded one copied in one piece (growing the
    # fastest axis first made every chunk a strided copy: 1.6x slower to sum an unfiltered HDF5 dataset).
    rest = [a for a in range(ndim) if reduce_axes is None or a not in reduce_axes]
    order = list(reduce_axes or ()) + rest
    multiples = [1] * ndim
    chunk_bytes = unit_bytes
    for axis in order:
        n_units = math.ceil(shape[axis] / unit[axis])
        room = target // chunk_bytes
        if room <= 1:
            if n_units > 1:
                notes.append(
                    (axis, f"axis {axis}: one storage chunk ({unit[axis]}) per task; larger chunks exceed the target")
                )
            else:
                notes.append((axis, f"axis {axis}: kept whole ({shape[axis]}), one storage chunk"))
            continue
        k = _balanced(n_units, min(n_units, room))
        multiples[axis] = k
        chunk_bytes *= k
        why = "reduced axis, spanned first" if reduce_axes and axis in reduce_axes else "grown towards the target"
        if k >= n_units:
            notes.append((axis, f"axis {axis}: kept whole ({shape[axis]} = {n_units} storage chunk(s)); {why}"))
        else:
            notes.append(
                (
                    axis,
                    f"axis {axis}: {k} storage chunks of {unit[axis]} per task ({math.ceil(n_units / k)} tasks "
                    f"along it); {why}, evened out so the last chunk is not a sliver",
                ),
            )
    return tuple(min(u * k, n) for u, k, n in zip(unit, multiples, shape))


def _split_storage_chunks(
    shape: tuple[int, ...], itemsize: int, unit: list[int], cap: int, notes: list[tuple[int, str]]
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
            (
                axis,
                f"axis {axis}: storage chunks of {unit[axis]} cut into pieces of {chunks[axis]}, "
                f"since one storage chunk ({format_size(math.prod(unit) * itemsize)}) exceeds the "
                f"per-chunk budget of {format_size(cap)}",
            ),
        )
    else:
        if math.prod(chunks) * itemsize > cap:
            raise InvalidBudgetError(f"no chunk fits the per-chunk budget of {format_size(cap)}")
    return tuple(chunks)


#: The most times a plan may decode each storage chunk on average (its tasks reading pieces of chunks that
#: are decoded whole): beyond, reading is that many times slower than the data, and the budget is refused.
MAX_DECODED_AMPLIFICATION = 16

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
