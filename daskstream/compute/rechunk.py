"""``rechunk``: an array in other chunks, out of core, decoding every stored chunk once.

dask's own ``rechunk`` of an array read from disk either reads every storage
chunk once per task that overlaps it (rows read as columns: every row chunk
decoded once per column) or gathers pieces of many input blocks in memory. Here
the plan (:mod:`daskstream.planning.rechunk`) reads boxes of whole storage
chunks and, when such boxes cannot also hold whole target chunks within the
budget, writes them as intermediate chunks that a second pass reads in boxes
of whole target chunks, as rechunker does, within one lazy dask graph.

The intermediate is not a Zarr array but one raw file per first-pass box, its
chunks one after another: a second-pass task reads its chunks out of each file
at their offsets. Thousands of small chunk files cost more in creating inodes
than in copying bytes (measured: a quarter of a rows-to-columns run), and no
codec is worth its time for data that is written once and read once.
"""

from __future__ import annotations

import atexit
import itertools
import math
import operator
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.array.core import normalize_chunks
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from daskstream.advice import keyword, named, said
from daskstream.errors import (
    IntermediateNotSharedError,
    InvalidArgumentError,
    InvalidChunksError,
    UnsupportedDtypeError,
)
from daskstream.graph.layers import (
    COMPUTED_ONCE,
    RECHUNK_ANNOTATION,
    RechunkRecord,
    places_read,
    read_layers,
    rechunk_records,
    record_plan,
)
from daskstream.graph.reads import source_array
from daskstream.planning.budget import plannable_bytes
from daskstream.planning.grid import block_slices, regular_chunk_shape, regular_grid
from daskstream.planning.rechunk import RechunkPlan, plan_rechunk
from daskstream.runtime.resources import settings_for
from daskstream.safe_writes import refuse_onto_reads
from daskstream.sources.base import Source, checked_path
from daskstream.sources.contiguous import pread_into

#: Copies of its box a rechunking task holds at most: the box, and the chunk it is encoding or cutting out.
TASK_COPIES = 2

# Intermediate folders this process made, removed when it exits.
_MADE_HERE: set[str] = set()


def rechunk(
    x: da.Array,
    chunks: Any,
    *,
    memory_budget: int | str | None = None,
    intermediate: str | os.PathLike[str] | None = None,
) -> da.Array:
    """``x`` in ``chunks``, lazily, within the memory budget and decoding each stored chunk once.

    Parameters
    ----------
    x
        A dask array. When it is a plain read of one file (``daskstream.open``),
        the file is read afresh in boxes of whole storage chunks; otherwise
        each of its blocks is computed once.
    chunks
        The regular chunk shape wanted: one size per axis (``-1`` or ``None``
        for a whole axis) or a dict ``{axis: size}`` (other axes keep ``x``'s
        largest chunk).
    memory_budget
        Bytes one worker may use (``"2GiB"``); default: the budget ``x`` was
        opened with, else as for :func:`daskstream.open`.
    intermediate
        A folder for the intermediate array of a two-pass plan; it must be on
        a file system every worker shares. Default: dask's
        ``temporary-directory`` setting, else the system's temporary folder.
        The intermediate array is removed when this process exits, and by
        :func:`daskstream.store` once the store it fed is complete.

    Returns
    -------
    dask.array.Array
        Lazy, with chunks ``chunks``; :func:`rechunk_plan_of` gives its plan,
        whose ``explain()`` says why it has the passes it has.

    Raises
    ------
    InvalidChunksError
        ``chunks`` is not a regular chunk shape for ``x``.
    MemoryBudgetError
        One source or target chunk alone is larger than a task may hold.
    UnsupportedDtypeError
        A two-pass plan for Python objects, which cannot be written to files as they are.

    Notes
    -----
    **One pass** when boxes holding whole source chunks *and* whole target
    chunks (along each axis, a multiple of both: their ``lcm``) fit in a task:
    each task reads one box and cuts it into target chunks. **Two passes**
    otherwise (rows into columns: such a box is the whole array): pass 1 reads
    boxes of whole source chunks, grown towards the target's shape, and writes
    them as raw intermediate chunks; pass 2 reads boxes of whole
    intermediate chunks grown towards the source's shape. Each intermediate
    chunk is written once and read once; a task holds at most one box (a
    ``1 / (2 * threads)`` share of four fifths of the budget).

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> x = da.from_array(np.arange(64).reshape(8, 8), chunks=(1, 8))
    >>> y = rechunk(x, (8, 2), memory_budget="1MiB")
    >>> y.chunks
    ((8,), (2, 2, 2, 2))
    >>> bool((y.compute() == np.arange(64).reshape(8, 8)).all())
    True
    """
    if not isinstance(x, da.Array):
        raise InvalidArgumentError(
            f"rechunk takes a dask array, not {type(x).__name__}; open a file with daskstream.open"
        )
    target = _target_chunks(x, chunks)
    settings = settings_for(x, memory_budget=memory_budget)
    source = _plain_read_of(x)
    if source is not None:
        source_chunks = source.storage_chunks
    else:
        source_chunks = tuple(max(sizes) if sizes else 1 for sizes in x.chunks)
    plan = plan_rechunk(
        x.shape,
        x.dtype.itemsize,
        source_chunks,
        target,
        task_bytes=plannable_bytes(settings.memory_budget) // (settings.threads * TASK_COPIES),
        preferred_bytes=settings.target_chunk_bytes,
    )
    read_grid = regular_grid(x.shape, plan.read_chunks)
    if source is not None:
        boxes = source_array(source, read_grid, settings)
    else:
        boxes = x if x.chunks == read_grid else x.rechunk(read_grid, method="tasks")
    read = boxes
    folder = None
    if plan.intermediate_chunks is not None:
        if x.dtype.hasobject:
            held = "variable-length strings" if x.dtype.kind == "T" else "Python objects"
            raise UnsupportedDtypeError(
                said(
                    f"{x.name}: dtype {x.dtype} holds {held}, which a two-pass rechunk cannot write to its "
                    "intermediate files; convert it to a fixed-width dtype, or give a ",
                    named("memory_budget"),
                    " that fits one pass",
                )
            )
        folder = _intermediate_folder(intermediate, boxes, plan)
        boxes = _through_intermediate(boxes, plan, folder)
    record_plan(boxes.dask.layers[boxes.name], settings)
    # Named by the data and the chunks only: the same values whatever the plan (a store resumed with another
    # budget plans other boxes but keeps the blocks it wrote).
    name = f"daskstream-rechunk-{tokenize(source.token if source is not None else x.name, target)}"
    out = _cut(boxes, regular_grid(x.shape, plan.target_chunks), name)
    out.dask.layers[name].collection_annotations = {
        **(out.dask.layers[name].collection_annotations or {}),
        RECHUNK_ANNOTATION: RechunkRecord(plan, folder, read),
    }
    return out


def rechunk_plan_of(x: da.Array) -> RechunkPlan | None:
    """The plan of the last :func:`rechunk` in ``x``'s graph, or ``None``; ``.explain()`` says why.

    >>> import dask.array as da
    >>> y = rechunk(da.ones((100, 100), chunks=(1, 100)), (100, 1), memory_budget="64KiB")
    >>> rechunk_plan_of(y).passes
    2
    """
    found = rechunk_records(x)
    return found[-1].plan if found else None


def _target_chunks(x: da.Array, chunks: Any) -> tuple[int, ...]:
    hint = "give one positive size per axis (-1 or None for a whole axis) or a dict {axis: size}"
    if isinstance(chunks, Mapping):
        for axis in chunks:
            if not isinstance(axis, int) or not -x.ndim <= axis < x.ndim:
                raise InvalidChunksError(
                    said(keyword("chunks", chunks), f": axis {axis!r} is out of range for {x.ndim} axes; {hint}")
                )
        given = {axis % x.ndim: size for axis, size in chunks.items()}
        chunks = tuple(given.get(axis, max(sizes) if sizes else 1) for axis, sizes in enumerate(x.chunks))
    if not isinstance(chunks, tuple | list) or len(chunks) != x.ndim:
        raise InvalidChunksError(said(keyword("chunks", chunks), f" for an array of {x.ndim} axes: {hint}"))
    for size in chunks:
        valid = size is None or (isinstance(size, int | np.integer) and not isinstance(size, bool) and size >= -1)
        if not valid or size == 0:
            raise InvalidChunksError(said(keyword("chunks", chunks), f": {size!r} is not a positive size; {hint}"))
    whole = tuple(n if size in (None, -1) else int(size) for size, n in zip(chunks, x.shape))
    grid = normalize_chunks(tuple(max(1, min(c, n)) if n else 1 for c, n in zip(whole, x.shape)), x.shape)
    shape = regular_chunk_shape(grid)
    if shape is None:
        raise InvalidChunksError(said(keyword("chunks", chunks), f": a regular chunk shape is needed; {hint}"))
    return tuple(max(1, c) for c in shape)


def _plain_read_of(x: da.Array) -> Source | None:
    """The source ``x`` reads as it is (no computation on it), or ``None``."""
    reads = read_layers(x)
    if len(reads) == 1 and reads[0][0] == x.name:
        return reads[0][1]
    return None


def _intermediate_folder(given: str | os.PathLike[str] | None, boxes: da.Array, plan: RechunkPlan) -> str:
    if given is not None:
        parent = checked_path(given, "intermediate")
    else:
        parent = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    # Named by the computation and the plan: the same rechunk built again (a resumed store) finds its own.
    folder = os.path.join(parent, f"daskstream-rechunk-{tokenize(boxes.name, plan)}")
    # Its files are written, then removed: never inside (or around) what the rechunk reads.
    refuse_onto_reads(folder, places_read(boxes), option=said(keyword("intermediate", parent)))
    os.makedirs(parent, exist_ok=True)
    return folder


def _through_intermediate(boxes: da.Array, plan: RechunkPlan, folder: str) -> da.Array:
    """Pass 1 writing ``boxes`` as intermediate chunks, pass 2 reading them back in ``plan.write_chunks``."""
    assert plan.intermediate_chunks is not None
    os.makedirs(folder, exist_ok=True)
    _MADE_HERE.add(folder)
    token = tokenize(boxes.name, plan, folder)
    written = da.map_blocks(
        _write_box,
        boxes,
        folder=folder,
        chunk_shape=plan.intermediate_chunks,
        chunks=(1,) * boxes.ndim,
        dtype=bool,
        name=f"daskstream-rechunk-write-{token}",
        meta=np.empty((0,) * boxes.ndim, dtype=bool),
    )
    written.dask.layers[written.name].collection_annotations = {
        **(written.dask.layers[written.name].collection_annotations or {}),
        COMPUTED_ONCE: True,
    }
    name = f"daskstream-rechunk-read-{token}"
    write_grid = regular_grid(boxes.shape, plan.write_chunks)
    layer: dict[Any, Any] = {}
    for index in itertools.product(*(range(len(sizes)) for sizes in write_grid)):
        box = block_slices(write_grid, index)
        needed = list(
            itertools.product(
                *(range(s.start // r, max(s.start, s.stop - 1) // r + 1) for s, r in zip(box, plan.read_chunks))
            )
        )
        read_boxes = [block_slices(boxes.chunks, block) for block in needed]
        layer[(name, *index)] = (
            _read_box,
            folder,
            box,
            boxes.dtype,
            plan.intermediate_chunks,
            list(zip(needed, read_boxes)),
            [(written.name, *block) for block in needed],
        )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=_collections(written))
    return da.Array(graph, name, chunks=write_grid, meta=np.empty((0,) * boxes.ndim, dtype=boxes.dtype))


def _pieces(box: tuple[slice, ...], chunk_shape: tuple[int, ...]) -> list[tuple[tuple[slice, ...], int]]:
    """The intermediate chunks inside a pass-1 ``box``: where each lies in the array, and its offset in the
    box's file (the chunks one after another in C order, each its own elements in C order)."""
    found = []
    offset = 0
    starts = [range(s.start, s.stop, c) for s, c in zip(box, chunk_shape)]
    for corner in itertools.product(*starts):
        piece = tuple(slice(a, min(a + c, s.stop)) for a, c, s in zip(corner, chunk_shape, box))
        found.append((piece, offset))
        offset += math.prod(p.stop - p.start for p in piece)
    return found


def _box_file(folder: str, block: tuple[int, ...]) -> str:
    return os.path.join(folder, "box-" + "-".join(map(str, block)))


def _write_box(block: np.ndarray, *, folder: str, chunk_shape: tuple[int, ...], block_info: Any = None) -> np.ndarray:
    """Pass 1: ``block`` written as its intermediate chunks, one after another, in one file put in place whole."""
    location = block_info[0]["array-location"]
    box = tuple(slice(start, stop) for start, stop in location)
    # Made again if a store this array fed removed it: the array can be computed again.
    os.makedirs(folder, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".partial", delete=False) as f:
        try:
            for piece, _ in _pieces(box, chunk_shape):
                local = tuple(slice(p.start - b.start, p.stop - b.start) for p, b in zip(piece, box))
                f.write(np.ascontiguousarray(block[local]).reshape(-1).view(np.uint8).data)
        except BaseException:
            os.unlink(f.name)
            raise
    os.replace(f.name, _box_file(folder, tuple(block_info[0]["chunk-location"])))
    return np.ones((1,) * block.ndim, dtype=bool)


def _read_box(
    folder: str,
    box: tuple[slice, ...],
    dtype: np.dtype,
    chunk_shape: tuple[int, ...],
    sources: list[tuple[tuple[int, ...], tuple[slice, ...]]],
    written: list[Any],
) -> np.ndarray:
    """Pass 2: ``box`` gathered from the intermediate chunks of the pass-1 boxes it overlaps."""
    out = np.empty(tuple(s.stop - s.start for s in box), dtype=dtype)
    for block, read_box in sources:
        path = _box_file(folder, block)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise IntermediateNotSharedError(
                f"{path}: what pass 1 wrote for block {block} is not there; the folder must be on a file system "
                "every worker shares: pass rechunk(..., intermediate=) a shared folder"
            ) from None
        try:
            for piece, offset in _pieces(read_box, chunk_shape):
                if any(p.start >= b.stop or p.stop <= b.start for p, b in zip(piece, box)):
                    continue  # an intermediate chunk of another pass-2 box
                data = np.empty(tuple(p.stop - p.start for p in piece), dtype=dtype)
                try:
                    pread_into(fd, data.reshape(-1).view(np.uint8).data, offset * dtype.itemsize)
                except EOFError:
                    raise IntermediateNotSharedError(f"{path}: shorter than pass 1 wrote it; was it changed?") from None
                out[tuple(slice(p.start - b.start, p.stop - b.start) for p, b in zip(piece, box))] = data
        finally:
            os.close(fd)
    return out


def _cut(boxes: da.Array, grid: tuple[tuple[int, ...], ...], name: str) -> da.Array:
    """``boxes`` cut into the finer ``grid``, as ``name``: each block a view of the one box holding it.

    (Not dask's ``rechunk``: a source read followed by one is read again in the
    new chunks when the graph is optimized, which would split storage chunks.)
    """
    box_shape = tuple(max(1, sizes[0]) for sizes in boxes.chunks)  # an empty axis has one block of 0
    layer: dict[Any, Any] = {}
    for index in itertools.product(*(range(len(sizes)) for sizes in grid)):
        inside = block_slices(grid, index)
        box = tuple(s.start // b for s, b in zip(inside, box_shape))
        local = tuple(slice(s.start - i * b, s.stop - i * b) for s, i, b in zip(inside, box, box_shape))
        layer[(name, *index)] = (operator.getitem, (boxes.name, *box), local)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=_collections(boxes))
    return da.Array(graph, name, chunks=grid, meta=boxes._meta)


def _collections(array: da.Array) -> list[Any]:
    # dask's annotations type a collection by a protocol its own Array does not match in every release.
    return [array]


def _remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    _MADE_HERE.discard(folder)


@atexit.register
def _remove_made_here() -> None:
    for folder in list(_MADE_HERE):
        _remove(folder)


__all__ = ["rechunk", "rechunk_plan_of"]
