"""``daskstream.open``: a Source as a lazy dask array with planned chunks."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from daskstream import config
from daskstream.errors import ChunkSplitWarning, InvalidArgumentError, InvalidChunksError, MemoryBudgetError
from daskstream.planning.chunks import ChunkPlan, read_amplification, regular_grid
from daskstream.sources import Source, open_source

ChunksSpec = str | int | tuple | Mapping | ChunkPlan


def open(
    path: str | os.PathLike[str] | Source,
    *,
    dataset: str | None = None,
    chunks: ChunksSpec = "auto",
    memory_budget: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> da.Array:
    """Open an array on disk as a lazy ``dask.array.Array``.

    Parameters
    ----------
    path
        A ``.npy`` file, HDF5 file or Zarr store (``"scan.h5::/entry/data"``
        names the dataset inline), or an open :class:`Source`.
    dataset
        HDF5 dataset or Zarr member, when the file holds more than one.
    chunks
        ``"auto"`` (default): the planner's choice, aligned to storage and
        sized to ``memory_budget`` and the workers. ``"tune"``: the chunks
        :func:`daskstream.tune` measures fastest on this machine for the
        setting ``daskstream.tune.default-op`` (``"sum"``), remembered per kind
        of data, so a second file of the same kind costs no measuring.
        ``"storage"``: the storage chunks as they are. A tuple, dict or int (dask's meanings) or a
        :class:`ChunkPlan` is used as given; when it splits storage chunks a
        :class:`ChunkSplitWarning` states the read amplification.
    memory_budget
        Bytes one worker may use (``"2GiB"``), for ``chunks="auto"``.
    storage_options
        fsspec options for Zarr URLs.

    Returns
    -------
    dask.array.Array
        Its graph holds only the source's description (path, dataset, dtype,
        regions), never a file handle or the data; the same unchanged file
        gives the same name every time it is opened.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(12.0).reshape(3, 4))
    >>> x = open(path)
    >>> float(x.sum().compute())
    66.0
    """
    if isinstance(path, Source):
        if dataset is not None or storage_options is not None:
            raise InvalidArgumentError(
                f"{path.name}: dataset= and storage_options= apply when opening a path, not an open Source; "
                "pass them to open_source instead"
            )
        source = path
    else:
        source = open_source(path, dataset=dataset, storage_options=storage_options)
    return as_dask_array(source, chunks=chunks, memory_budget=memory_budget)


def as_dask_array(source: Source, *, chunks: ChunksSpec = "auto", memory_budget: int | str | None = None) -> da.Array:
    """A dask array reading ``source`` in the chunks given (see :func:`open`)."""
    dask_chunks = resolve_chunks(source, chunks, memory_budget=memory_budget)
    name = f"daskstream-{source.format}-{tokenize(source.token, dask_chunks)}"
    array = read_array(source, dask_chunks, name)
    from daskstream.compute.layers import record_plan

    # Computations over this array keep the budget and threads it was planned for (the smallest budget,
    # over several arrays), wherever dask optimizes their graph.
    record_plan(array.dask.layers[name], memory_budget)
    return array


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


def resolve_chunks(
    source: Source, chunks: ChunksSpec, *, memory_budget: int | str | None = None
) -> tuple[tuple[int, ...], ...]:
    """Dask's tuple-of-tuples chunks for ``source`` from any accepted chunk spec."""
    if isinstance(chunks, str):
        if chunks == "auto":
            return source.plan(memory_budget=memory_budget).dask_chunks
        if chunks == "tune":
            from daskstream.tuning.tuner import tuned_chunks

            tuned = tuned_chunks(source, memory_budget=memory_budget)
            check_block_count(source, tuned)
            return regular_grid(source.shape, tuned)
        if chunks == "storage":
            if source.storage_chunks is None:
                raise InvalidChunksError(
                    f"{source.name}: chunks='storage' but the data is stored contiguously; "
                    "use chunks='auto' or give a chunk shape"
                )
            check_block_count(source, source.storage_chunks)
            return regular_grid(source.shape, source.storage_chunks)
        raise InvalidChunksError(
            f"chunks={chunks!r} for {source.name}: use 'auto', 'storage', 'tune', a tuple, a dict or a ChunkPlan"
        )
    if isinstance(chunks, ChunkPlan):
        if chunks.shape != source.shape:
            raise InvalidChunksError(
                f"the ChunkPlan is for shape {chunks.shape} but {source.name} has shape {source.shape}; "
                "plan with source.plan(...)"
            )
        dask_chunks = chunks.dask_chunks
    else:
        dask_chunks = _normalize_user_chunks(source, chunks)
    amplification = read_amplification(source.shape, source.storage_chunks, dask_chunks)
    if amplification > 1.0:
        warnings.warn(
            f"{source.name}: these chunks split its storage chunks {source.storage_chunks}, so each "
            f"storage chunk is read and decoded {amplification:.2f} times on average (read "
            "amplification); use chunks='auto' or multiples of the storage chunks",
            ChunkSplitWarning,
            stacklevel=3,
        )
    return dask_chunks


def check_block_count(source: Source, chunk_shape: tuple[int, ...]) -> None:
    """Refuse a grid of more blocks than ``daskstream.planning.max-tasks`` before listing them.

    Raises
    ------
    MemoryBudgetError
        Naming the source, the chunks and how many blocks they make.
    """
    blocks = math.prod(math.ceil(n / c) if n and c > 0 else 1 for n, c in zip(source.shape, chunk_shape))
    ceiling = config.setting("planning.max-tasks")
    if blocks > ceiling:
        raise MemoryBudgetError(
            f"{source.name}: chunks {tuple(chunk_shape)} cut its shape {source.shape} into {blocks:,} blocks, "
            f"more than the {ceiling:,} daskstream plans at most (daskstream.planning.max-tasks: the task graph "
            "alone would outgrow memory); give larger chunks, or chunks='auto'"
        )


def _normalize_user_chunks(source: Source, chunks: Any) -> tuple[tuple[int, ...], ...]:
    from dask.array.core import normalize_chunks

    hint = "give one positive size per axis (-1 or None for a whole axis), a dict {axis: size} or a ChunkPlan"
    if isinstance(chunks, tuple) and len(chunks) != source.ndim:
        raise InvalidChunksError(
            f"chunks={chunks!r} has {len(chunks)} entries but {source.name} has {source.ndim} axes; {hint}"
        )
    flat = chunks.values() if isinstance(chunks, Mapping) else chunks if isinstance(chunks, tuple) else (chunks,)
    for entry in flat:
        sizes = entry if isinstance(entry, tuple) else (entry,)
        for size in sizes:
            if size is None or size == -1 or size == "auto":
                continue
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise InvalidChunksError(
                    f"chunks={chunks!r} for {source.name}: {size!r} is not a positive size; {hint}"
                )
            if size >= 2**63:
                raise InvalidChunksError(
                    f"chunks={chunks!r} for {source.name}: {size} is longer than any axis can be "
                    f"(at most 2**63 - 1); {hint}"
                )
    if isinstance(chunks, Mapping):
        for axis in chunks:
            if not isinstance(axis, int) or not -source.ndim <= axis < source.ndim:
                raise InvalidChunksError(f"chunks={chunks!r}: axis {axis!r} is out of range for {source.name}; {hint}")
    if isinstance(chunks, tuple) and all(isinstance(c, (int, np.integer)) for c in chunks):
        check_block_count(source, tuple(int(c) for c in chunks))
    try:
        out = normalize_chunks(chunks, source.shape, dtype=source.dtype)
    except (ValueError, TypeError) as exc:
        raise InvalidChunksError(
            f"chunks={chunks!r} do not fit {source.name} of shape {source.shape}: {exc}; {hint}"
        ) from None
    if any(sum(c) != n for c, n in zip(out, source.shape)) or math.prod(map(len, out)) < 1:
        raise InvalidChunksError(f"chunks={chunks!r} do not cover {source.name} of shape {source.shape}; {hint}")
    return out


def read_layers(collection: Any) -> list[tuple[str, Source, tuple[tuple[int, ...], ...] | None]]:
    """The daskstream read layers in a dask collection's graph: name, the Source read, and its chunks.

    They are the layers :func:`as_dask_array` makes: ``daskstream-<format>-<token>``
    beside ``original-`` of that name, which holds the Source.
    """
    graph = collection.__dask_graph__()
    layers = getattr(graph, "layers", {})
    found = []
    for name in layers:
        if name.startswith("daskstream-") and f"original-{name}" in layers:
            original = layers[f"original-{name}"]
            source = next(iter(original.values()), None) if hasattr(original, "values") else None
            if isinstance(source, Source):
                annotations = getattr(layers[name], "collection_annotations", None) or {}
                found.append((name, source, annotations.get("chunks")))
    return found
