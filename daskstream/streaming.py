"""Batches for training loops: storage-aligned reads ahead of the loop, shuffled in bounded windows.

(Longer than most modules: how a stream is cut and what it holds is planned in
:mod:`daskstream.planning.streams`; what remains is one object's reading threads,
shuffle windows and batch handover, which share state across threads and are
reasoned about together.)

The array is cut into shards that depend only on the data and the arguments,
so that every rank of a distributed training run splits it alike; each epoch
the shards are laid end to end (in a shared random order when shuffling) and
every rank takes an equal run of that sequence. Reads run ahead in a thread
pool, the next shuffle window and the next epoch's first reads included.

>>> import numpy as np, tempfile, os
>>> import daskstream as ds
>>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
>>> np.save(path, np.arange(20.0).reshape(10, 2))
>>> [batch[:, 0].tolist() for batch in ds.stream(path, batch_size=4)]
[[0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0], [16.0, 18.0]]
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from daskstream.compute.labels import axes_by_name, unlabelled
from daskstream.display import card, grid_figure, table
from daskstream.errors import InvalidArgumentError, InvalidAxisError, SourceChangedError
from daskstream.graph.layers import opened_source, planned_with
from daskstream.planning.budget import format_size, parse_budget
from daskstream.planning.settings import Resources
from daskstream.planning.streams import (
    SHARES,
    SPLIT_BUDGET,
    StreamLayout,
    auto_prefetch,
    batch_count,
    plan_reads,
    plan_shards,
    rank_run,
    runs,
    worker_share,
)
from daskstream.runtime.resources import resources_for
from daskstream.sources import Source, open_source
from daskstream.sources.base import REREAD_ADVICE

_END = object()
_STREAM_ADVICE = (
    "make the stream again over the new data (ds.stream, or StreamDataset and its DataLoader) and start the "
    "epoch again; batches already yielded this epoch came from the old data"
)


class _Failure:
    """An exception raised in the reader thread, carried to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Input:
    """One array to stream: read directly from its Source, or computed from a dask array slice by slice."""

    def __init__(self, x: Any) -> None:
        self.source: Source | None = None
        self.array: Any = None
        if isinstance(x, Source):
            self.source = x
        elif hasattr(x, "__dask_graph__"):
            # An array straight from daskstream.open is read from its Source, without dask in the loop.
            self.source = opened_source(x)
            if self.source is None:
                self.array = x
        elif isinstance(x, (str, os.PathLike)):
            self.source = open_source(x)
        else:
            raise InvalidArgumentError(
                f"stream takes paths, Sources or dask arrays (from daskstream.open), not {type(x).__name__}"
            )

        held = self.source if self.source is not None else self.array
        self.shape: tuple[int, ...] = tuple(held.shape)
        self.dtype = np.dtype(held.dtype)
        self.name = self.source.name if self.source is not None else f"dask array {self.array.name}"

    def unit(self, axis: int) -> int:
        """Rows along ``axis`` that one storage chunk spans (1 for contiguous data or dask arrays)."""
        if self.source is None or self.source.storage_chunks is None:
            return 1
        return max(1, min(self.source.storage_chunks[axis], self.shape[axis]))

    def item_bytes(self, axis: int) -> int:
        return math.prod(n for a, n in enumerate(self.shape) if a != axis) * self.dtype.itemsize

    def read(self, axis: int, start: int, stop: int) -> np.ndarray:
        index = (slice(None),) * axis + (slice(start, stop),)
        try:
            if self.source is not None:
                return self.source.read(index)
            return np.asarray(self.array[index].compute(scheduler="sync"))
        except SourceChangedError as exc:
            # Advice for a training loop rather than for a computation.
            message = str(exc).replace("this computation", "this epoch").replace(REREAD_ADVICE, _STREAM_ADVICE)
            raise type(exc)(message) from None


def stream(
    x: Any,
    *,
    axis: int = 0,
    batch_size: int | None = None,
    prefetch: int | str = 2,
    shuffle: bool = False,
    seed: int | None = None,
    drop_last: bool = False,
    memory_budget: int | str | None = None,
    rank: int = 0,
    world_size: int = 1,
    shuffle_blocks: int = 4,
    shares: str = "pad",
    worker: int = 0,
    num_workers: int = 1,
) -> Stream:
    """Batches of ``x`` along ``axis`` as numpy arrays, read ahead in a background thread.

    Parameters
    ----------
    x
        A path, a :class:`Source`, or a dask array (from :func:`daskstream.open`
        it is read straight from its source); or a tuple of them, all of one
        length along ``axis``, to get matching tuples of batches (features and
        labels).
    axis
        The axis that indexes items.
    batch_size
        Items per batch; default one shard (see ``shares``).
    prefetch
        Batches kept ready ahead of the consumer, or ``"auto"``: as many as a
        quarter of the memory budget holds (at least 2). Reads run further
        ahead by themselves when the consumer is found waiting, within the
        budget.
    shuffle
        A different order every epoch: shards in random order, then the items
        of each window of ``shuffle_blocks`` shards shuffled together. Never a
        random read per item; every item appears exactly once per epoch (per
        rank: see ``shares``). The next window is read while the current one
        is consumed.
    seed
        Makes shuffled orders reproducible: epoch ``e`` uses ``(seed, e)``.
        Needed with ``shuffle`` and ``world_size > 1``, so that every rank
        draws the same shard order and takes a disjoint share.
    drop_last
        Leave out a last batch shorter than ``batch_size``.
    memory_budget
        Bytes the stream may hold (default as for the planner): checked
        against everything the stream holds, sizes its reads and ``prefetch="auto"``.
        When given (or when ``x`` was opened with one) it also sizes the
        shards, so give every rank the same.
    rank, world_size
        Data-parallel training. The epoch's shards, in their (shared) order,
        are laid end to end and rank ``rank`` takes the ``rank``-th of
        ``world_size`` equal runs of that sequence. The shards depend only on
        the array (shape, dtype, storage chunks), ``world_size``, ``shuffle``,
        ``shuffle_blocks`` and ``memory_budget`` when given -- never on the
        machine -- so ranks on different machines split the same way.
    shuffle_blocks
        Shards shuffled together: the bound on the shuffle buffer.
    shares
        How ranks get equal shares when the items do not divide evenly:
        ``"pad"`` (default; as ``DistributedSampler`` does, the last shares
        repeat the first items of the epoch's sequence, so every rank has
        ``ceil(n / world_size)`` items and the same number of batches, which
        distributed training needs), ``"drop"`` (every rank has ``n //
        world_size`` items; the last few of the epoch's sequence are left out)
        or ``"uneven"`` (every item once; shares differ by at most one item).
    worker, num_workers
        This consumer's place among the loader workers of one rank (a
        DataLoader's ``worker_info``): the rank's batches are split among the
        workers in contiguous runs, so the rank yields the same batches
        whatever the number of workers.

    Returns
    -------
    Stream
        Iterate it once per epoch (``for batch in s``); ``len(s)`` is the
        number of batches this consumer yields each epoch.
    """
    # A DataArray streams its data (its labels name axes the batches do not keep).
    axis = axes_by_name(x[0] if isinstance(x, tuple) else x, axis)
    x = tuple(unlabelled(one) for one in x) if isinstance(x, tuple) else unlabelled(x)
    items = x if isinstance(x, (tuple, list)) else (x,)
    # The budget given, else the smallest the arrays were opened with, which the stream keeps.
    planned = planned_with(*items)
    given = memory_budget if memory_budget is not None or planned is None else planned.memory_budget
    resources = resources_for(*items, memory_budget=memory_budget)
    # The shards are the same on every rank: sized by a budget given or opened with, never by this machine's.
    split_budget = SPLIT_BUDGET if given is None else parse_budget(given)
    return Stream(
        x, axis=axis, batch_size=batch_size, prefetch=prefetch, shuffle=shuffle, seed=seed, drop_last=drop_last,
        resources=resources, split_budget=split_budget, rank=rank, world_size=world_size,
        shuffle_blocks=shuffle_blocks, shares=shares, worker=worker, num_workers=num_workers,
    )  # fmt: skip


class Stream:
    """Epochs of batches over one array or several zipped ones; made by :func:`stream`.

    It reads within ``resources`` and cuts shards for ``split_budget``, as
    :func:`stream` resolved them: the budget and threads of the place it runs,
    and a budget that is the same on every rank.

    Attributes
    ----------
    block_bounds
        ``(start, stop)`` along the axis of every shard: storage-aligned runs
        of items, the same on every rank (see :func:`stream`).
    share
        ``(start, stop)`` positions in each epoch's sequence of shards that
        this consumer takes (``stop`` may pass the array's length: ``"pad"``
        wraps to the start).
    read_rows
        Items one read takes at most (a shard, or a storage-aligned part of
        one when the budget is small).
    batch_size, prefetch
        Items per batch; batches kept ready.
    epoch
        The epoch the next iteration yields (advances on each iteration; see :meth:`set_epoch`).
    """

    def __init__(
        self,
        x: Any,
        *,
        axis: int,
        batch_size: int | None,
        prefetch: int | str,
        shuffle: bool,
        seed: int | None,
        drop_last: bool,
        resources: Resources,
        split_budget: int,
        rank: int,
        world_size: int,
        shuffle_blocks: int,
        shares: str = "pad",
        worker: int = 0,
        num_workers: int = 1,
    ) -> None:

        self.zipped = isinstance(x, (tuple, list))
        self.inputs = [_Input(item) for item in (x if self.zipped else (x,))]
        if not self.inputs:
            raise InvalidArgumentError("stream needs at least one array")
        first = self.inputs[0]
        ndim = len(first.shape)
        if ndim == 0:
            raise InvalidArgumentError(f"{first.name} is a scalar: there are no items to stream")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
            raise InvalidAxisError(
                f"axis={axis!r} is out of range for {first.name} with {ndim} axes; use 0..{ndim - 1}"
            )
        self.axis = axis % ndim
        self.length = first.shape[self.axis]
        for other in self.inputs[1:]:
            if len(other.shape) <= self.axis or other.shape[self.axis] != self.length:
                raise InvalidArgumentError(
                    f"zipped arrays must have one length along axis {self.axis}: {first.name} has "
                    f"{self.length}, {other.name} has shape {other.shape}"
                )
        for name, value, low in (
            ("world_size", world_size, 1),
            ("rank", rank, 0),
            ("shuffle_blocks", shuffle_blocks, 1),
            ("num_workers", num_workers, 1),
            ("worker", worker, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name}={value!r} must be an int of at least {low}")
        if rank >= world_size:
            raise InvalidArgumentError(f"rank={rank} must be below world_size={world_size}")
        if worker >= num_workers:
            raise InvalidArgumentError(f"worker={worker} must be below num_workers={num_workers}")
        if shares not in SHARES:
            raise InvalidArgumentError(f"shares={shares!r}: choose one of {', '.join(map(repr, SHARES))}")
        if shuffle and world_size > 1 and seed is None:
            raise InvalidArgumentError(
                "shuffle=True with world_size > 1 needs seed=: every rank must draw the same shard order "
                "to take a disjoint share"
            )
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1
        ):
            raise InvalidArgumentError(f"batch_size={batch_size!r} must be a positive int")
        if prefetch != "auto" and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise InvalidArgumentError(f"prefetch={prefetch!r} must be a positive int or 'auto'")
        self.resources = resources
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.rank, self.world_size, self.shuffle_blocks = rank, world_size, shuffle_blocks
        self.shares, self.worker, self.num_workers = shares, worker, num_workers
        # Loader workers are the parallelism already: one reading thread each.
        self.threads = 1 if num_workers > 1 else self.resources.threads
        # Mixed into the order of this consumer's items (never into the split): see daskstream.torch.
        self.order_entropy: int | None = None
        # Makes the arrays shuffled batches are gathered into (daskstream.torch: shared memory).
        self.allocate: Any = np.empty
        # Form batches in the iterating thread (reads still run ahead): for a loader worker, which is
        # the prefetching process already, a second thread handing batches over only costs time.
        self.in_caller_thread = False
        # Reading threads, kept between epochs, and the next epoch's first reads, begun during the last one.
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._primed: tuple[int, list[tuple[int, int]], deque] | None = None
        self.block_bounds = self._shards(split_budget, batch_size, prefetch)
        if batch_size is None:
            batch_size = max(1, self.block_bounds[0][1] - self.block_bounds[0][0]) if self.block_bounds else 1
        self.batch_size = int(batch_size)
        self.share = self._share()
        self.read_rows, self.extra_reads = self._reads(prefetch)
        self.prefetch = self._prefetch(prefetch)
        self.epoch = 0

    # -- planning: the split (the same on every rank) ---------------------------------

    @property
    def item_bytes(self) -> int:
        """Bytes of one item across all zipped arrays."""
        return sum(i.item_bytes(self.axis) for i in self.inputs)

    def _unit(self, spread: int) -> int:
        # Shards whole in every zipped array's storage chunks, unless that makes them too few;
        # then whole in the first array's (the others' chunks at shard edges are read twice).
        unit = math.lcm(*(i.unit(self.axis) for i in self.inputs))
        return self.inputs[0].unit(self.axis) if unit > spread else unit

    @property
    def layout(self) -> StreamLayout:
        """What planning the stream needs to know of it (see :mod:`daskstream.planning.streams`)."""
        return StreamLayout(self.length, self.item_bytes, self.shuffle, self.shuffle_blocks, self.threads)

    def _shards(self, split_budget: int, batch_size: int | None, prefetch: int | str) -> list[tuple[int, int]]:
        """Storage-aligned shards along the axis, the same on every rank (see :func:`plan_shards`)."""
        unit = self._unit(max(1, math.ceil(self.length / (2 * self.world_size))))
        ready = 2 if prefetch == "auto" else int(prefetch)
        return plan_shards(
            self.layout, unit, self.world_size, batch_size=batch_size, ready=ready, split_budget=split_budget
        )

    def _rank_run(self) -> tuple[int, int]:
        """Positions in the epoch's sequence this consumer's rank takes (see ``shares``)."""
        return rank_run(self.length, self.world_size, self.rank, self.shares)

    def _batches_of(self, items: int) -> int:
        return batch_count(items, self.batch_size, self.drop_last)

    def _share(self) -> tuple[int, int]:
        """Positions in the epoch's sequence this consumer takes: its rank's run, then its worker's batches."""
        return worker_share(self._rank_run(), self.batch_size, self.drop_last, self.worker, self.num_workers)

    @property
    def rank_batches(self) -> int:
        """Batches this consumer's rank yields each epoch, over all its workers."""
        low, high = self._rank_run()
        return self._batches_of(high - low)

    # -- planning: this machine (reads, prefetch, memory) ------------------------------

    @property
    def memory_terms(self) -> dict[str, int]:
        """What the stream holds at most, term by term: reads ahead, shuffle window, batches ready and forming."""
        return self.layout.terms(self.read_rows * self.item_bytes, self._batch_bytes, self.prefetch, self.extra_reads)

    @property
    def projected_peak_bytes(self) -> int:
        return sum(self.memory_terms.values())

    @property
    def _batch_bytes(self) -> int:
        return min(self.batch_size, self.length) * self.item_bytes

    def _reads(self, prefetch: int | str) -> tuple[int, int]:
        """Items per read and the reads that may be added ahead, as the budget allows on this machine."""
        shard = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 1
        return plan_reads(
            self.layout,
            shard,
            shard if self.shuffle else self._unit(shard),
            batch_bytes=self._batch_bytes,
            ready=2 if prefetch == "auto" else int(prefetch),
            memory_budget=self.resources.memory_budget,
            name=self.inputs[0].name,
        )

    def _prefetch(self, prefetch: int | str) -> int:
        if prefetch != "auto":
            return int(prefetch)
        return auto_prefetch(
            self.layout, self.read_rows, self.extra_reads, self._batch_bytes, self.resources.memory_budget
        )

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch`` does)."""
        self.epoch = int(epoch)

    def _order_rng(self, epoch: int) -> np.random.Generator:
        """The shards' order: shared by every rank and worker (from ``seed``), or fresh without one."""
        return np.random.default_rng(None if self.seed is None else [self.seed, epoch])

    def _items_rng(self, epoch: int) -> np.random.Generator:
        """The order of this consumer's items within its windows."""
        if self.seed is None:
            return np.random.default_rng()
        key = [self.seed, epoch, self.rank, self.worker]
        return np.random.default_rng(key if self.order_entropy is None else [*key, self.order_entropy])

    def blocks_for(self, epoch: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` runs of items this consumer reads in epoch ``epoch``, in order."""
        order: Sequence[int] | np.ndarray = range(len(self.block_bounds))
        if self.shuffle:
            order = self._order_rng(epoch).permutation(len(self.block_bounds))
        sequence = [self.block_bounds[i] for i in order]
        return runs(sequence, *self.share, self.length)

    def __len__(self) -> int:
        return self._batches_of(self.share[1] - self.share[0])

    # -- iterating -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        self.epoch += 1
        return self._in_caller_thread(epoch) if self.in_caller_thread else self._iterate(epoch)

    def _in_caller_thread(self, epoch: int) -> Iterator[Any]:
        stop = threading.Event()
        try:
            yield from self._batches(epoch, stop, _Waits())
        finally:
            stop.set()

    def _iterate(self, epoch: int) -> Iterator[Any]:
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        waits = _Waits()
        reader = threading.Thread(
            target=self._produce, args=(epoch, ready, stop, waits), name=f"daskstream-stream-{epoch}", daemon=True
        )
        reader.start()
        try:
            while True:
                try:
                    item = ready.get_nowait()
                except queue.Empty:
                    # The consumer waits: the reader may read further ahead (see _read_ahead).
                    waits.seen += 1
                    item = ready.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            # Leaving early (break, an exception, garbage collection): stop the reader, free its buffers.
            stop.set()
            while reader.is_alive():
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.05)
            reader.join()

    def _produce(self, epoch: int, ready: queue.Queue, stop: threading.Event, waits: _Waits) -> None:
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in self._batches(epoch, stop, waits):
                if not put(batch):
                    return
            put(_END)
        except BaseException as exc:  # carried to the consumer, raised there
            put(_Failure(exc))

    def _batches(self, epoch: int, stop: threading.Event, waits: _Waits) -> Iterator[Any]:
        pending: deque[list[np.ndarray]] = deque()  # parts of rows not yet batched, one array per input
        held, left = 0, len(self)
        reads = self._read_ahead(epoch, stop, waits)
        for parts in self._windows(reads, self._items_rng(epoch)):
            pending.append(parts)
            held += parts[0].shape[self.axis]
            while held >= self.batch_size and left:
                yield self._emit(_take(pending, self.batch_size, self.axis))
                held -= self.batch_size
                left -= 1
        if held and left:
            yield self._emit(_take(pending, held, self.axis))

    def _pieces(self, epoch: int) -> list[tuple[int, int]]:
        """The runs of this epoch, cut into reads of at most ``read_rows`` items (in order only)."""
        runs = self.blocks_for(epoch)
        if self.shuffle:
            return runs
        step = self.read_rows
        return [(s, min(s + step, stop)) for start, stop in runs for s in range(start, stop, step)]

    def _windows(self, blocks: Iterator[list[np.ndarray]], rng: np.random.Generator) -> Iterator[list[np.ndarray]]:
        """The reads as they come, or (shuffling) the rows of each window of ``shuffle_blocks`` reads in one
        random order, gathered a batch at a time from the window's reads (never a copy of the window)."""
        if not self.shuffle:
            yield from blocks
            return
        window: list[list[np.ndarray]] = []
        for parts in blocks:
            window.append(parts)
            if len(window) == self.shuffle_blocks:
                yield from _shuffled(window, rng, self.axis, self.batch_size, self.allocate)
                window = []
        if window:
            yield from _shuffled(window, rng, self.axis, self.batch_size, self.allocate)

    def _emit(self, arrays: list[np.ndarray]) -> Any:
        return tuple(arrays) if self.zipped else arrays[0]

    def _read_ahead(self, epoch: int, stop: threading.Event, waits: _Waits) -> Iterator[list[np.ndarray]]:
        """Read epoch ``epoch``'s pieces in order, ``threads`` at once, far enough ahead that the consumer
        need not wait.

        Shuffling, the whole next window is read while the current one is
        consumed. Each time the consumer was found waiting, one more read is
        kept in flight, up to ``extra_reads`` (what the budget allows). Once
        every piece of the epoch is asked for, the first pieces of the next
        epoch are read too (in the same number of reads in flight), so that
        the next epoch starts without a wait; they are dropped if the next
        iteration is of another epoch. Leaving early stops the reading threads.
        """

        def read(bounds: tuple[int, int]) -> list[np.ndarray]:
            return [i.read(self.axis, *bounds) for i in self.inputs]

        pool = self._reading_pool()
        primed, self._primed = self._primed, None
        if primed is not None and primed[0] == epoch:
            _, pieces, in_flight = primed
        else:
            if primed is not None:
                _cancel(primed[2])
            pieces, in_flight = self._pieces(epoch), deque()
        pending = iter(pieces[len(in_flight) :])
        following: tuple[int, list[tuple[int, int]], deque] | None = None
        base = self.threads + (self.shuffle_blocks if self.shuffle else 0)
        finished = False
        try:
            while not stop.is_set():
                depth = base + min(waits.seen, self.extra_reads)
                asked_for_all = False
                while len(in_flight) <= depth:
                    nxt = next(pending, None)
                    if nxt is None:
                        asked_for_all = True
                        break
                    in_flight.append(pool.submit(read, nxt))
                if asked_for_all and not stop.is_set():
                    # Every piece of this epoch is asked for: read the next epoch's first ones meanwhile.
                    if following is None:
                        following = (epoch + 1, self._pieces(epoch + 1), deque())
                    ahead = following[2]
                    while len(in_flight) + len(ahead) <= depth and len(ahead) < len(following[1]):
                        ahead.append(pool.submit(read, following[1][len(ahead)]))
                if not in_flight:
                    finished = True
                    return
                yield in_flight.popleft().result()
        finally:
            _cancel(in_flight)
            if finished and not stop.is_set():
                self._primed = following
            else:
                # Left early: nothing is kept, and the reading threads end with the iteration.
                if following is not None:
                    _cancel(following[2])
                self._close_pool()

    def __getstate__(self) -> dict[str, Any]:
        # Threads and reads in flight stay with this process.
        state = {**self.__dict__, "_pool": None, "_primed": None}
        state.pop("_pool_finalizer", None)
        return state

    def _reading_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix="daskstream-read", initializer=_yield_to_consumer
            )
            # Threads idle between epochs end with the stream.
            self._pool_finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool_finalizer.detach()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    # -- showing ---------------------------------------------------------------------

    def __repr__(self) -> str:
        names = ", ".join(i.name for i in self.inputs)
        shard = f", rank {self.rank}/{self.world_size}" if self.world_size > 1 else ""
        if self.num_workers > 1:
            shard += f", worker {self.worker}/{self.num_workers}"
        return (
            f"<daskstream Stream of {names}: {self.length} items along axis {self.axis}, batches of "
            f"{self.batch_size}, {len(self.block_bounds)} shards, prefetch {self.prefetch}"
            f"{', shuffled' if self.shuffle else ''}{shard}>"
        )

    def _repr_html_(self) -> str:
        first_shard = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0
        rows = [
            ("arrays", ", ".join(f"{i.name} {i.shape} {i.dtype}" for i in self.inputs)),
            ("items", f"{self.length} along axis {self.axis} ({format_size(self.item_bytes)} each)"),
            ("batch", f"{self.batch_size} items ({format_size(self.batch_size * self.item_bytes)})"),
            ("shards", f"{len(self.block_bounds)} storage-aligned runs of up to {first_shard} items, "
                       "the same on every rank"),
            ("reads", f"up to {self.read_rows} items, {self.threads} reading thread(s)"),
            ("prefetch", f"{self.prefetch} batches, up to {self.extra_reads} more reads when the loop waits"),
            ("order", f"shuffled in windows of {self.shuffle_blocks} shards" if self.shuffle else "in order"),
            ("share", f"rank {self.rank} of {self.world_size} ({self.shares}): {len(self)} batches"
                      + (f", worker {self.worker} of {self.num_workers}" if self.num_workers > 1 else "")),
        ]  # fmt: skip

        first = self.inputs[0]
        storage = first.source.storage_chunks if first.source is not None else None
        block = tuple(first_shard if a == self.axis else n for a, n in enumerate(first.shape))
        return card("daskstream Stream", table(rows), picture=grid_figure(first.shape, storage, block))


def _cancel(futures: Any) -> None:
    for future in futures:
        future.cancel()


class _Waits:
    """How often the consumer found no batch ready: read by the reader to read further ahead."""

    seen = 0


def _yield_to_consumer() -> None:
    """Lower this reading thread's scheduling priority (Linux: per thread), so the consumer preempts it.

    Reads keep every core busy; a training step waking up (from a GPU wait, say)
    should run at once, not wait for a time slice behind the prefetch.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _shuffled(
    window: list[list[np.ndarray]],
    rng: np.random.Generator,
    axis: int,
    piece: int,
    allocate: Any = np.empty,
) -> Iterator[list[np.ndarray]]:
    """The items of a window of reads in one random order (the same for every input), ``piece`` at a time.

    Which items form each piece is random; within a piece they come in the
    order they lie in the window (a training step does not depend on the
    order of the rows of its batch), so that each read's share is one gather
    straight into place.
    """
    lengths = [parts[0].shape[axis] for parts in window]
    offsets = np.cumsum([0, *lengths])
    order = rng.permutation(int(offsets[-1]))
    lead = (slice(None),) * axis
    for start in range(0, order.size, piece):
        chosen = np.sort(order[start : start + piece])
        # Sorted, each read's items are one run of ``chosen``.
        edges = np.searchsorted(chosen, offsets)
        gathered = []
        for k in range(len(window[0])):
            first = window[0][k]
            out = allocate((*first.shape[:axis], chosen.size, *first.shape[axis + 1 :]), first.dtype)
            for b, (low, high) in enumerate(itertools.pairwise(edges)):
                if low < high:
                    np.take(
                        window[b][k],
                        chosen[low:high] - offsets[b],
                        axis=axis,
                        out=out[(*lead, slice(low, high))],
                        mode="clip",
                    )
            gathered.append(out)
        yield gathered


def _take(pending: deque[list[np.ndarray]], count: int, axis: int) -> list[np.ndarray]:
    """The first ``count`` items of ``pending`` (a view when they lie in one part), removed from it."""
    taken: list[list[np.ndarray]] = []
    need = count
    while need:
        parts = pending[0]
        rows = parts[0].shape[axis]
        if rows <= need:
            taken.append(pending.popleft())
            need -= rows
            continue
        cut = (slice(None),) * axis
        taken.append([p[(*cut, slice(0, need))] for p in parts])
        pending[0] = [p[(*cut, slice(need, None))] for p in parts]
        need = 0
    if len(taken) == 1:
        return taken[0]
    return [np.concatenate([t[k] for t in taken], axis=axis) for k in range(len(taken[0]))]


__all__ = ["Stream", "stream"]
