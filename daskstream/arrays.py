"""The entry points that build arrays and plans: ``open``, ``plan``, ``plan_chunks``, ``reduce``, ``describe``, ``store``.

Defaults (the memory budget, threads, workers and the planner's settings) are
resolved here, once per call (:func:`daskstream.runtime.resources.resolve_settings`),
and passed down as one frozen value. (Longer than most modules: every public
entry point lives here, so that there is one place where defaults are resolved
and arguments checked; their docstrings are the reference users read.) What
``open`` makes of the sources it opened is :mod:`daskstream.opening`; the work
itself is below, in ``compute``, ``tuning``, ``graph`` and ``sources``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import dask.array as da
from numpy.typing import DTypeLike

from daskstream.advice import keyword, named, said
from daskstream.compute.describe import describe as describe_lazily
from daskstream.compute.labels import axes_by_name, described, is_labelled, reduced, unlabelled
from daskstream.compute.reductions import reduce as reduce_lazily
from daskstream.compute.store import store as store_as_planned
from daskstream.compute.store.labelled import is_dataset, store_labelled
from daskstream.compute.store.result import StoredArray
from daskstream.errors import InvalidArgumentError
from daskstream.graph.reads import ChunksSpec
from daskstream.opening import (
    _joined,
    _sources_to_open,
    _tunes,
    _warn_of_stored_numbers,
    as_dask_array,
    name_of,
    refuse_path_options,
)
from daskstream.planning.chunks import plan_chunks as plan_with_settings
from daskstream.planning.plan import ChunkPlan
from daskstream.runtime.resources import planned_cluster_resources, resolve_settings, settings_for
from daskstream.sources import Source, open_source
from daskstream.tuning.adaptive import AdaptiveRun, adaptive_description, adaptive_reduction, adaptive_store

# Work planned in waves while it runs, named in the advice of the arguments it does not combine with.
_ADAPTIVE = keyword("adaptive", True)


def open(
    path: str | os.PathLike[str] | Source | Sequence[str | os.PathLike[str] | Source],
    *,
    dataset: str | None = None,
    chunks: ChunksSpec = "auto",
    memory_budget: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    axis: int = 0,
    stack: bool = False,
) -> da.Array:
    """Open an array on disk as a lazy ``dask.array.Array``.

    Parameters
    ----------
    path
        A ``.npy`` file, HDF5 file or Zarr store (``"scan.h5::/entry/data"``
        names the dataset inline), or an open :class:`Source`. A list of them,
        or a pattern (``"runs/day-*.h5"``, expanded in natural order: ``day-2``
        before ``day-10``), opens many files of one dtype and shape as one
        array, joined along ``axis`` (each file's own chunks planned alike and
        aligned to its storage; no task reads from two files). Of local HDF5
        files, the first is opened in full and each other on its size (equal
        to the first file's, with the HDF5 signature) or, where the size
        differs, on its dataset's shape and dtype read from its header; each is
        opened in full and checked at its first read.
    dataset
        HDF5 dataset or Zarr member, when the file holds more than one (for
        many files: in every one).
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
        fsspec options for URLs (``s3://``, ``gs://``...: endpoint, ``profile``,
        ``anon``, credentials). Secrets among them are used by this process
        only, never put in the graph: workers use their own credentials.
    axis, stack
        For many files: the axis they are joined along (their lengths along it
        may differ), or with ``stack=True`` the new axis they are stacked
        along (their shapes must agree).

    Returns
    -------
    dask.array.Array
        Its graph holds only the source's description (path, dataset, dtype,
        regions), never a file handle or the data; the same unchanged file
        gives the same name every time it is opened.

    Raises
    ------
    FileFamilyError
        For many files, naming the first whose dtype or shape differs, and how:
        at open, or -- for a file of the first file's size whose full metadata
        differs -- at its first read.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(12.0).reshape(3, 4))
    >>> x = open(path)
    >>> float(x.sum().compute())
    66.0
    """
    sources, axis, many = _sources_to_open(
        path, dataset=dataset, storage_options=storage_options, axis=axis, stack=stack
    )
    _warn_of_stored_numbers(sources[0])
    settings = resolve_settings(memory_budget=memory_budget)
    # The reads that time chunks="tune"'s candidates are planned as any array opened here, whatever budget the
    # candidates are sized for (see daskstream.tune).
    sampling = resolve_settings() if memory_budget is not None and _tunes(chunks) else settings
    if many:
        return _joined(sources, chunks=chunks, settings=settings, sampling=sampling, axis=axis, stack=stack)
    return as_dask_array(sources[0], settings, chunks=chunks, sampling=sampling)


def plan(
    source: str | os.PathLike[str] | Source,
    *,
    dataset: str | None = None,
    memory_budget: int | str | None = None,
    threads: int | None = None,
    workers: int | None = None,
    reduce_axis: int | tuple[int, ...] | None = None,
    target_chunk_bytes: int | str | None = None,
    working_set_factor: float | None = None,
    min_tasks_per_thread: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cluster: str | os.PathLike[str] | None = None,
    memory_limit: int | str | None = None,
) -> ChunkPlan:
    """The chunk plan :func:`open` makes for a file or an open :class:`Source`, and why.

    Parameters
    ----------
    source
        A path as for :func:`open`, or an open :class:`Source`.
    dataset, storage_options
        As for :func:`open`, when ``source`` is a path.
    memory_budget, threads, workers, reduce_axis, target_chunk_bytes, working_set_factor, min_tasks_per_thread
        As for :func:`plan_chunks`; ``None`` takes the settings and the place
        the computation runs (the active session, Client or this machine).
    cluster, memory_limit
        Plan for a dask.distributed cluster that is not running yet, to size a
        job before submitting it: ``cluster`` a cluster file (its workers,
        threads and memory limit), or ``workers``, ``threads`` and
        ``memory_limit`` (bytes per worker) given here, which win over the
        file. The budget is the share of the limit a running cluster of that
        size gives, so the plan is the one it will make.

    Returns
    -------
    ChunkPlan
        ``chunks``, ``n_tasks``, ``read_amplification``, ``explain()``...

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.zeros((1000, 100)))
    >>> plan(path, memory_budget="4MiB", threads=2, workers=1, target_chunk_bytes="64KiB").chunks
    (250, 100)

    The scheduler would not keep up with 64 KiB tasks (``plan(...).explain()``
    says why), so the chunks grow to the parallelism's bound: 2 tasks per thread.
    """
    if not isinstance(source, Source):
        source = open_source(source, dataset=dataset, storage_options=storage_options)
    else:
        refuse_path_options(source, dataset, storage_options, doing="planning")
    planned_cluster = None
    if cluster is not None or memory_limit is not None:
        planned_cluster = planned_cluster_resources(
            cluster, workers=workers, threads=threads, memory_limit=memory_limit
        )
        threads = workers = None
    settings = resolve_settings(
        memory_budget=memory_budget,
        threads=threads,
        workers=workers,
        target_chunk_bytes=target_chunk_bytes,
        working_set_factor=working_set_factor,
        min_tasks_per_thread=min_tasks_per_thread,
        cluster=planned_cluster,
    )
    return source.plan(settings, reduce_axis=reduce_axis)


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
        When the budget leaves a task less than one element. A plan of more
        blocks than a computation may hold (``daskstream.planning.max-tasks``)
        is returned with the least budget within it
        (:attr:`ChunkPlan.budget_within_ceiling`).

    Examples
    --------
    >>> plan = plan_chunks((1000, 1000), "f8", storage_chunks=(100, 100), layout="chunked",
    ...                    memory_budget="64MiB", threads=2, workers=1, target_chunk_bytes="1MiB")
    >>> plan.chunks, plan.n_tasks, plan.read_amplification
    ((1000, 100), 10, 1.0)
    >>> plan_chunks((10_000, 100), "f4", memory_budget="1GiB", threads=2, workers=1,
    ...             target_chunk_bytes="1MiB").chunks
    (2500, 100)
    """
    settings = resolve_settings(
        memory_budget=memory_budget,
        threads=threads,
        workers=workers,
        target_chunk_bytes=target_chunk_bytes,
        working_set_factor=working_set_factor,
        min_tasks_per_thread=min_tasks_per_thread,
    )
    return plan_with_settings(
        shape,
        dtype,
        settings,
        storage_chunks=storage_chunks,
        layout=layout,
        reduce_axis=reduce_axis,
        decode_bytes=decode_bytes,
    )


def reduce(
    x: Any,
    op: str,
    axis: int | Sequence[int] | None = None,
    *,
    adaptive: bool = False,
    progress: bool | None = None,
    **options: Any,
) -> Any:
    """Reduce ``x`` with ``op`` over ``axis``: lazily, or adaptively with ``adaptive=True``.

    Without ``adaptive`` this is :func:`daskstream.compute.reduce` (every
    option there: ``dtype``, ``ddof``, ``q``, ``bins``, ``range``, ``keepdims``,
    ``split_every``, ``memory_budget``): a lazy dask array.

    Parameters
    ----------
    x
        A dask array or an ``xarray.DataArray`` (whose result is then a
        DataArray with the dimensions and coordinates that remain, see
        :mod:`daskstream.compute.labels`), or with ``adaptive`` a path,
        :class:`Source`, an array as :func:`open` returns it or one computed
        from it region by region (:func:`daskstream.map_blocks` kernels,
        element-wise expressions such as ``x - x.mean()``): adaptive runs cut
        its reads anew. Another array runs as planned, and ``adaptation`` says why.
    op, axis
        The reduction (one of :data:`daskstream.compute.OPERATIONS`) and the
        axes it removes (for a DataArray, by position or dimension name).
    adaptive
        Return an :class:`~daskstream.tuning.adaptive.AdaptiveRun`
        instead: its ``compute()`` tries the planner's setting (rows per task,
        threads) and alternatives on the first rows of the array, interleaved
        and as part of the real work, runs the rest with the fastest and
        returns the answer; ``adaptation`` (``explain()``) says what it tried
        and chose, and the choice is remembered for the next adaptive run of
        this kind of data. Integer, extreme and count results equal a single
        run's exactly, floating-point sums and moments within rounding.
        Histograms are refused; argmin/argmax/median/quantile over the first
        axis run as planned.
    progress
        With ``adaptive``: a bar in bytes whose postfix names the setting
        being tried, then the one chosen (default: as the active session shows
        progress).
    **options
        As for :func:`daskstream.compute.reduce`.

    Returns
    -------
    dask.array.Array or AdaptiveRun

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(12.0).reshape(3, 4))
    >>> float(reduce(open(path), "sum").compute())
    66.0
    >>> run = reduce(path, "max", axis=1, adaptive=True)
    >>> run.compute()
    array([ 3.,  7., 11.])
    >>> run.adaptation.adapted  # three rows leave no room for trials
    False
    """
    labelled, axis = x if is_labelled(x) else None, axes_by_name(x, axis)
    x = unlabelled(x)
    if not adaptive:
        if progress is not None:
            raise InvalidArgumentError(
                said("progress= applies to ", _ADAPTIVE, "; a lazy reduction shows progress when computed")
            )
        result = reduce_lazily(x, op, axis, **options)
        if labelled is None or op == "histogram":
            return result
        return reduced(labelled, result, op, axis, keepdims=options.get("keepdims", False), q=options.get("q"))
    if op == "histogram":
        raise InvalidArgumentError(
            said(
                _ADAPTIVE,
                " does not apply to ",
                keyword("op", "histogram"),
                ": its bins come from the whole array; run it without ",
                keyword("adaptive"),
            )
        )
    unknown = set(options) - {"dtype", "ddof", "q", "keepdims", "memory_budget"}
    if unknown:
        raise InvalidArgumentError(
            said(
                _ADAPTIVE,
                " takes dtype, ddof, q, keepdims and ",
                named("memory_budget"),
                "; not ",
                ", ".join(sorted(unknown)),
            )
        )
    settings = settings_for(x, memory_budget=options.pop("memory_budget", None))
    run = adaptive_reduction(x, op, axis, settings=settings, progress=progress, **options)
    if labelled is not None:
        keepdims, q = options.get("keepdims", False), options.get("q")
        run.relabel = functools.partial(reduced, labelled, op=op, axis=axis, keepdims=keepdims, q=q)
    return run


def describe(
    x: Any,
    axis: int | Sequence[int] | None = None,
    bins: int | Sequence[float] | None = None,
    *,
    range: tuple[float, float] | None = None,
    ddof: int = 0,
    quartiles: bool = False,
    split_every: int | None = None,
    memory_budget: int | str | None = None,
    adaptive: bool = False,
    progress: bool | None = None,
) -> Any:
    """Count, NaN count, mean, std, min and max of ``x`` (and quartiles, a histogram), in one pass.

    Without ``adaptive`` this is :func:`daskstream.compute.describe`: a
    ``LazyDescription`` whose ``compute()`` gives the ``Description``.

    Parameters
    ----------
    x, axis, bins, range, ddof, quartiles, split_every, memory_budget
        As for :func:`daskstream.compute.describe`; with ``adaptive``, ``x``
        may also be a path or a :class:`Source`. The description is named after
        the source ``x`` was opened from (or the DataArray's name).
    adaptive
        Return an :class:`~daskstream.tuning.adaptive.AdaptiveRun` instead
        (see :func:`reduce`): the same statistics, its first rows run with
        alternative settings as trials and the rest with the fastest.
        ``split_every`` does not apply.
    progress
        With ``adaptive``, as for :func:`reduce`.

    Returns
    -------
    LazyDescription or AdaptiveRun

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(12.0).reshape(3, 4))
    >>> float(describe(path, adaptive=True).compute()["mean"])
    5.5
    """
    labelled, axis = x if is_labelled(x) else None, axes_by_name(x, axis)
    x = unlabelled(x)
    # A DataArray's statistics come back as DataArrays over the dimensions left.
    relabel = None if labelled is None else functools.partial(described, labelled, axis=axis)
    if not adaptive:
        if progress is not None:
            raise InvalidArgumentError(
                said("progress= applies to ", _ADAPTIVE, "; a lazy describe shows progress when computed")
            )
        name = str(labelled.name) if labelled is not None and labelled.name is not None else name_of(x)
        lazy = describe_lazily(
            x,
            axis,
            bins,
            range=range,
            ddof=ddof,
            quartiles=quartiles,
            split_every=split_every,
            memory_budget=memory_budget,
            name=name,
        )
        lazy.relabel = relabel
        return lazy
    if split_every is not None:
        raise InvalidArgumentError(said(_ADAPTIVE, " plans each wave's merge tree itself; leave split_every out"))
    if quartiles:
        raise InvalidArgumentError(
            "quartiles take passes of their own, which an adaptive describe (one pass, in waves) does not "
            "make: leave adaptive out, or quartiles"
        )
    run = adaptive_description(
        x, axis, bins, bin_range=range, ddof=ddof, settings=settings_for(x, memory_budget=memory_budget),
        progress=progress,
    )  # fmt: skip
    run.relabel = relabel
    return run


__all__ = ["AdaptiveRun", "describe", "open", "plan", "plan_chunks", "reduce"]


def store(
    x: Any,
    target: str | os.PathLike[str],
    *,
    adaptive: bool = False,
    progress: Any = None,
    **options: Any,
) -> StoredArray:
    """Write ``x`` to a Zarr store or an HDF5 dataset, out of core and resumably; adaptively with ``adaptive=True``.

    Without ``adaptive`` this is :func:`daskstream.compute.store` (every
    option there: ``dataset``, ``resume``, ``overwrite``, ``codec``,
    ``zarr_format``, ``inner_chunks``, ``memory_budget``, ``storage_options``...).

    Parameters
    ----------
    x
        The array to write: a dask array, or an ``xarray.DataArray`` or ``Dataset`` (with its labels).
    target
        Where: ``"out.zarr"``, ``"out.h5::/data"``, an object-store URL.
    adaptive
        Write a Zarr target in waves along the first axis: the first waves
        try the planner's way of writing (one chunk per task, the planner's
        threads) and alternatives (more threads; several chunks per task,
        computed from one read of their sources and written one by one), as
        part of the real store, and the rest is written with the fastest. The
        target and its chunks are the same as without ``adaptive``. The
        returned array's ``adaptation`` attribute
        (:class:`~daskstream.tuning.adaptive.record.Adaptation`, ``explain()``)
        says what was tried and chosen; the choice is remembered for the next
        adaptive store of this kind of data. It needs ``x`` computed region by
        region from its sources (``open``, ``map_blocks`` kernels and
        element-wise expressions over them) and the threaded scheduler or a
        distributed cluster (whose workers then write); an HDF5 target, a
        resumed store, another array or scheduler is written as planned, and
        ``adaptation`` says why.
    progress
        As for :func:`daskstream.compute.store`; with ``adaptive``, ``True``
        shows the adaptive run's bar, whose postfix names the setting tried.
    **options
        As for :func:`daskstream.compute.store`.

    Returns
    -------
    dask.array.Array
        The stored array, read back from the target: a
        :class:`~daskstream.compute.store.result.StoredArray`, whose
        ``result`` and repr say what the store wrote and what an earlier,
        interrupted run had written before (every store also logs that line
        on the ``daskstream.store`` logger, at INFO). For an
        ``xarray.DataArray`` or ``Dataset`` (written with their dimension
        names, coordinates and attributes, as xarray writes them to Zarr:
        :mod:`daskstream.compute.store.labelled`), what ``xr.open_zarr`` of
        the target reads back.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> np.save(os.path.join(folder, "a.npy"), np.arange(12.0).reshape(3, 4))
    >>> y = store(open(os.path.join(folder, "a.npy")) * 2, os.path.join(folder, "b.zarr"), adaptive=True)
    >>> y.compute()[2].tolist()
    [16.0, 18.0, 20.0, 22.0]
    >>> y.adaptation.adapted  # three rows leave no room for trials
    False
    """
    # The waves plan as the store does: for a budget given, else for what x (its variables) was planned with.
    arrays = [v.data for v in x.data_vars.values()] if is_dataset(x) else [unlabelled(x)]
    settings = settings_for(*arrays, memory_budget=options.get("memory_budget")) if adaptive else None

    def store_array(array: da.Array, where: Any, **given: Any) -> StoredArray:
        if settings is not None:
            return adaptive_store(array, where, settings=settings, progress=progress, **given)
        return store_as_planned(array, where, progress=progress, **given)

    if is_labelled(x) or is_dataset(x):
        return store_labelled(x, target, store_array, **options)
    return store_array(x, target, **options)
