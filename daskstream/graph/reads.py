"""Sources as dask arrays: one read task per block, and the plan they were made for recorded in the graph."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np
from dask._task_spec import Task
from dask.array.core import normalize_chunks
from dask.base import tokenize

from daskstream.advice import keyword, named, said
from daskstream.errors import ChunkSplitWarning, InvalidChunksError, MemoryBudgetError, warn
from daskstream.graph.layers import SPAN_ANNOTATION, blockwise_like, record_plan
from daskstream.planning.budget import format_size
from daskstream.planning.grid import read_amplification, regular_grid
from daskstream.planning.plan import ChunkPlan
from daskstream.planning.settings import PlanSettings
from daskstream.sources.base import Source
from daskstream.sources.objects.places import is_url

ChunksSpec = str | int | tuple | Mapping | ChunkPlan


def source_array(source: Source, chunks: ChunksSpec, settings: PlanSettings) -> da.Array:
    """A dask array reading ``source`` in ``chunks`` (see :func:`resolve_chunks`), planned with ``settings``.

    Its graph holds only the source's description, never a file handle or the
    data; the same unchanged file in the same chunks gives the same name.
    """
    if isinstance(chunks, ChunkPlan) and chunks.span is not None:
        return span_array(source, chunks, settings)
    if isinstance(chunks, str) and chunks == "auto":
        plan = planned(source, settings)
        if plan.span is not None:
            return span_array(source, plan, settings)
        return chunked_source_array(source, plan.dask_chunks, settings)
    return chunked_source_array(source, resolve_chunks(source, chunks, settings), settings)


def planned(source: Source, settings: PlanSettings) -> ChunkPlan:
    """``source``'s ``"auto"`` chunk plan within ``settings``, its chunk lengths checked before dask lists them."""
    plan = source.plan(settings)
    check_block_count(source, plan.chunks, settings.max_tasks, within=plan.budget_within_ceiling)
    return plan


def span_array(source: Source, plan: ChunkPlan, settings: PlanSettings) -> da.Array:
    """A dask array reading ``source`` a span of ``plan``'s chunks per block (:mod:`daskstream.planning.spans`).

    Its blocks are :class:`~daskstream.compute.streaming.spans.SpanRead` values, not
    data: the optimizer streams them chunk by chunk into the element-wise
    steps, slices and reductions that take them
    (:mod:`daskstream.graph.spans`), or refuses the computation.
    """
    _check_plan_shape(source, plan)
    name = f"daskstream-{source.format}-{tokenize(source.token, plan.chunks, plan.span)}"
    array = read_array(source, plan.span_dask_chunks, name)
    layer = array.dask.layers[name]
    task = layer.task
    spanned = blockwise_like(layer, task=Task(task.key, read_span, *task.args, piece=plan.chunks))
    spanned.collection_annotations = {
        **(spanned.collection_annotations or {}),
        SPAN_ANNOTATION: {"piece": plan.chunks, "cap": plan.per_chunk_cap},
    }
    array.dask.layers[name] = spanned
    record_plan(spanned, settings)
    return array


def _check_plan_shape(source: Source, plan: ChunkPlan) -> None:
    if plan.shape != source.shape:
        raise InvalidChunksError(
            f"the ChunkPlan is for shape {plan.shape} but {source.name} has shape {source.shape}; "
            "plan with daskstream.plan(source, ...)"
        )


def chunked_source_array(source: Source, dask_chunks: tuple[tuple[int, ...], ...], settings: PlanSettings) -> da.Array:
    """A dask array reading ``source`` in ``dask_chunks`` already resolved (a plan made once for many files
    of one shape), recorded as planned with ``settings``."""
    name = f"daskstream-{source.format}-{tokenize(source.token, dask_chunks)}"
    array = read_array(source, dask_chunks, name)
    # Computations over this array keep the budget and threads it was planned for (the smallest budget,
    # over several arrays), wherever dask optimizes their graph.
    record_plan(array.dask.layers[name], settings)
    return array


def shared_settings(settings: PlanSettings, files: int) -> PlanSettings:
    """``settings`` for planning each of ``files`` files read together as one array.

    The parallelism a plan asks for is the whole array's: each file supplies
    its share of the tasks, rather than each asking for all of them.
    """
    share = -(-settings.min_tasks_per_thread // max(files, 1))
    return dataclasses.replace(settings, min_tasks_per_thread=max(1, share))


class SharedPlans:
    """The ``"auto"`` chunks of many sources planned with one ``settings``, planned once per kind of source.

    The files of a family share shape, dtype and storage: planning each of ten
    thousand alike would make the same plan ten thousand times. A plan depends
    on nothing else of a source (see :meth:`Source.plan`), so it is looked up
    by those.
    """

    def __init__(self, settings: PlanSettings) -> None:
        self.settings = settings
        self._made: dict[tuple[Any, ...], tuple[tuple[int, ...], ...]] = {}

    def chunks(self, source: Source) -> tuple[tuple[int, ...], ...]:
        """``source``'s planned chunks, as ``resolve_chunks(source, "auto", settings)`` gives them."""
        kind = (
            source.shape, source.dtype.str, source.storage_chunks, source.layout, source.decode_bytes,
            source.element_bytes, is_url(source.path),
        )  # fmt: skip
        if kind not in self._made:
            self._made[kind] = resolve_chunks(source, "auto", self.settings)
        return self._made[kind]


def read_array(source: Source, chunks: tuple[tuple[int, ...], ...], name: str) -> da.Array:
    """The dask array named ``name`` reading ``source`` in ``chunks``, one task per block.

    Blocks are read through the source's own ``__getitem__`` (no lock: sources
    are safe to read from many threads) and never converted with ``np.asarray``
    first, so a block is decoded once, straight into its result.
    """
    return da.from_array(
        source,
        chunks=chunks,
        name=name,
        lock=False,
        asarray=False,
        fancy=False,
        meta=np.empty((0,) * source.ndim, dtype=source.dtype),
    )


# The advice for chunks the planner should choose.
_AUTO = keyword("chunks", "auto")


def resolve_chunks(source: Source, chunks: ChunksSpec, settings: PlanSettings) -> tuple[tuple[int, ...], ...]:
    """Dask's tuple-of-tuples chunks for ``source`` from a chunk spec: ``"auto"`` (planned with
    ``settings``), ``"storage"``, a tuple, dict or int (dask's meanings) or a :class:`ChunkPlan`."""
    if isinstance(chunks, str):
        if chunks == "auto":
            return planned(source, settings).dask_chunks
        if chunks == "storage":
            if source.storage_chunks is None:
                raise InvalidChunksError(
                    said(
                        f"{source.name}: ",
                        keyword("chunks", "storage"),
                        " but the data is stored contiguously; use ",
                        _AUTO,
                        " or give a chunk shape",
                    )
                )
            check_block_count(source, source.storage_chunks, settings.max_tasks)
            return regular_grid(source.shape, source.storage_chunks)
        raise InvalidChunksError(
            said(
                keyword("chunks", chunks),
                f" for {source.name}: use 'auto', 'storage', 'tune', a tuple, a dict or a ChunkPlan",
            )
        )
    if isinstance(chunks, ChunkPlan):
        _check_plan_shape(source, chunks)
        dask_chunks = chunks.dask_chunks
    else:
        dask_chunks = _normalize_user_chunks(source, chunks, settings.max_tasks)
    amplification = read_amplification(source.shape, source.storage_chunks, dask_chunks)
    if amplification > 1.0:
        warn(
            said(
                f"{source.name}: these chunks split its storage chunks {source.storage_chunks}, so each storage "
                f"chunk is read and decoded {amplification:.2f} times on average (read amplification); use ",
                _AUTO,
                " or multiples of the storage chunks",
            ),
            ChunkSplitWarning,
        )
    return dask_chunks


#: Chunk lengths dask may list per task a graph may hold: a listed length is an int in the chunks' tuples and
#: their cumulative sums, about 1/64 of the 4 KiB a task takes in a graph.
LISTED_PER_TASK = 64


def check_block_count(
    source: Source, chunk_shape: tuple[int, ...], max_tasks: int | None, *, within: int | None = None
) -> None:
    """Refuse chunks whose grid dask would list with more lengths than this machine holds, before listing them.

    Opening lists the chunk lengths along each axis (their sum, not their
    product, is what opening holds), at most :data:`LISTED_PER_TASK` per task
    of ``max_tasks``: an array of more blocks than a computation may take
    opens, and its parts compute; computing more blocks at once than the graph
    may hold is refused where it is computed
    (:meth:`daskstream.planning.computation.ComputePlan.check`).

    Raises
    ------
    MemoryBudgetError
        Naming the source, the chunks and how many lengths they would list;
        for planned chunks, ``within``: the least budget whose plan lists few
        enough.
    """
    listed = sum(math.ceil(n / c) if n and c > 0 else 1 for n, c in zip(source.shape, chunk_shape))
    most = None if max_tasks is None else max_tasks * LISTED_PER_TASK
    if most is not None and listed > most:
        advice = (
            said("give larger chunks, or ", _AUTO)
            if within is None
            else said("raise ", named("memory_budget"), f" to at least {format_size(within)}")
        )
        raise MemoryBudgetError(
            said(
                f"{source.name}: chunks {tuple(chunk_shape)} cut its shape {source.shape} into {listed:,} chunks "
                f"along its axes, more than the {most:,} chunk lengths dask may list here ({LISTED_PER_TASK} per "
                "task of daskstream.planning.max-tasks): ",
                advice,
            )
        )


def _normalize_user_chunks(source: Source, chunks: Any, max_tasks: int | None) -> tuple[tuple[int, ...], ...]:
    hint = "give one positive size per axis (-1 or None for a whole axis), a dict {axis: size} or a ChunkPlan"
    if isinstance(chunks, tuple) and len(chunks) != source.ndim:
        raise InvalidChunksError(
            said(
                keyword("chunks", chunks),
                f" has {len(chunks)} entries but {source.name} has {source.ndim} axes; {hint}",
            )
        )
    flat = chunks.values() if isinstance(chunks, Mapping) else chunks if isinstance(chunks, tuple) else (chunks,)
    for entry in flat:
        sizes = entry if isinstance(entry, tuple) else (entry,)
        for size in sizes:
            if size is None or size == -1 or size == "auto":
                continue
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise InvalidChunksError(
                    said(keyword("chunks", chunks), f" for {source.name}: {size!r} is not a positive size; {hint}")
                )
            if size >= 2**63:
                raise InvalidChunksError(
                    said(
                        keyword("chunks", chunks),
                        f" for {source.name}: {size} is longer than any axis can be (at most 2**63 - 1); {hint}",
                    )
                )
    if isinstance(chunks, Mapping):
        for axis in chunks:
            if not isinstance(axis, int) or not -source.ndim <= axis < source.ndim:
                raise InvalidChunksError(
                    said(keyword("chunks", chunks), f": axis {axis!r} is out of range for {source.name}; {hint}")
                )
    if isinstance(chunks, tuple) and all(isinstance(c, (int, np.integer)) for c in chunks):
        check_block_count(source, tuple(int(c) for c in chunks), max_tasks)
    try:
        out = normalize_chunks(chunks, source.shape, dtype=source.dtype)
    except (ValueError, TypeError) as exc:
        raise InvalidChunksError(
            said(keyword("chunks", chunks), f" do not fit {source.name} of shape {source.shape}: {exc}; {hint}")
        ) from None
    if any(sum(c) != n for c, n in zip(out, source.shape)) or math.prod(map(len, out)) < 1:
        raise InvalidChunksError(
            said(keyword("chunks", chunks), f" do not cover {source.name} of shape {source.shape}; {hint}")
        )
    return out


Box = tuple[slice, ...]


class SpanRead:
    """A region of a source not read yet: a span's block, read piece by piece along the storage-aligned grid.

    Parameters
    ----------
    source
        What ``__getitem__`` reads from (a :class:`~daskstream.Source`).
    region
        The absolute region, unit-step slices.
    piece
        The chunk shape the source is planned in: pieces are its grid's cells
        within the region.
    """

    __slots__ = ("piece", "region", "source")

    def __init__(self, source: Any, region: Box, piece: tuple[int, ...]) -> None:
        self.source, self.region, self.piece = source, region, piece

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.region)

    def cuts(self) -> tuple[tuple[int, ...], ...]:
        """Where pieces begin along each axis, relative to the region, with its end last."""
        return tuple(
            (0, *range(-(-s.start // step) * step - s.start or step, s.stop - s.start, step), s.stop - s.start)
            if s.stop > s.start
            else (0, 0)
            for s, step in zip(self.region, self.piece, strict=True)
        )

    def narrowed(self, index: Box) -> SpanRead:
        """The span's part ``index`` (unit-step slices relative to the region)."""
        return SpanRead(
            self.source,
            tuple(slice(r.start + b.start, r.start + b.stop) for r, b in zip(self.region, index)),
            self.piece,
        )

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise MemoryBudgetError(
            said(
                f"a block spanning {self.shape} of {getattr(self.source, 'name', 'the source')} reached a step "
                "without daskstream's optimizer (dask's array_optimize was replaced, or ",
                named("daskstream.compute.rewrite"),
                " is false): spans are streamed only there; compute a part of the array at a time",
            )
        )

    def __repr__(self) -> str:  # what dask prints of a failed task's arguments
        return f"<SpanRead {self.shape} in pieces of {self.piece}>"


def read_span(source: Any, region: Box, *, piece: tuple[int, ...]) -> SpanRead:
    """A span read's task: what to read, for the steps after it to read piece by piece."""
    return SpanRead(source, tuple(slice(s.start or 0, s.stop) for s in region), piece)


__all__ = [
    "LISTED_PER_TASK",
    "ChunksSpec",
    "SharedPlans",
    "SpanRead",
    "check_block_count",
    "chunked_source_array",
    "planned",
    "read_array",
    "read_span",
    "resolve_chunks",
    "shared_settings",
    "source_array",
    "span_array",
]
