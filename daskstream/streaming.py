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
import hashlib
import itertools
import math
import os
import queue
import random
import reprlib
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from daskstream.compute.labels import axes_by_name, unlabelled
from daskstream.display import card, grid_figure, table
from daskstream.errors import DaskstreamWarning, InvalidArgumentError, InvalidAxisError, SourceChangedError
from daskstream.graph.layers import opened_source, planned_with
from daskstream.planning.budget import format_size, parse_budget
from daskstream.planning.settings import Resources
from daskstream.planning.streams import (
    SHARES,
    SPLIT_BUDGET,
    StreamLayout,
    auto_prefetch,
    batch_count,
    elastic_batches,
    elastic_steps,
    plan_reads,
    plan_shards,
    rank_run,
    runs,
    shards_digest,
    window_order,
    worker_share,
)
from daskstream.runtime.allocator import cap_malloc_arenas
from daskstream.runtime.resources import resources_for
from daskstream.sources import Source, open_source
from daskstream.sources.base import REREAD_ADVICE

_END = object()
# The layout of what state_dict returns; a state of another layout is refused, not misread.
STATE_FORMAT = "daskstream.stream/1"
# What a state's plan may differ in when an elastic stream resumes from a global position.
_ELASTIC_FREE = ("world_size", "rank", "worker", "num_workers")
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
        elif isinstance(x, np.ndarray):
            # Labels and other small arrays already in memory (a class index per image, say).
            self.array = x
        else:
            raise InvalidArgumentError(
                "stream takes paths, Sources, dask arrays (from daskstream.open) or numpy arrays, "
                f"not {type(x).__name__}"
            )

        held = self.source if self.source is not None else self.array
        self.shape: tuple[int, ...] = tuple(held.shape)
        self.dtype = np.dtype(held.dtype)
        if self.source is not None:
            self.name = self.source.name
        elif isinstance(self.array, np.ndarray):
            self.name = f"numpy array {self.shape} {self.dtype}"
        else:
            self.name = f"dask array {self.array.name}"

    @property
    def identity(self) -> str:
        """What names this data in a saved state: the source's token (path, size, modification time), the
        dask array's name, or a digest of the numpy array's bytes."""
        if self.source is not None:
            return str(self.source.token)
        if isinstance(self.array, np.ndarray):
            digest = hashlib.sha256(np.ascontiguousarray(self.array).view(np.uint8).data).hexdigest()[:16]
            return f"numpy {self.shape} {self.dtype} {digest}"
        return str(self.array.name)

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
            if isinstance(self.array, np.ndarray):
                return np.array(self.array[index])  # a copy: batches never alias the caller's array
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
    elastic: bool = False,
    read_next_epoch: bool = True,
) -> Stream:
    """Batches of ``x`` along ``axis`` as numpy arrays, read ahead in a background thread.

    Parameters
    ----------
    x
        A path, a :class:`Source`, a dask array (from :func:`daskstream.open`
        it is read straight from its source) or a numpy array (labels, say);
        or a tuple of them, all of one length along ``axis``, to get matching
        tuples of batches (features and labels).
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
        draws the same shard order and takes a disjoint share. Without one,
        one is drawn (``stream.seed``), and a saved state carries it.
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
    elastic
        One global order of batches whatever the world size and workers: the
        shards and shuffle windows depend only on the data, ``seed``, the
        epoch and the shuffle settings; the epoch's items, window by window,
        are cut into global batches of ``batch_size``, and rank ``r`` takes
        global batches ``r``, ``r + world_size``... (its workers in turn), so
        step ``k`` of a job is the same ``world_size`` batches on any number
        of ranks, and a job resumed on another number (``load_state_dict``)
        continues the same epoch without repeating or skipping an item. The
        price is read amplification when shuffling: each consumer reads every
        window it takes a batch from, up to ``world_size * num_workers`` bytes
        read per byte delivered (:meth:`Stream.explain` says how many); in
        order, each batch is read by itself.
    read_next_epoch
        Read the next epoch's first batches while the last ones of this epoch
        are consumed, so the next epoch starts without a wait (default).
        Between epochs the stream then keeps its reading threads and those
        reads (at most the "read ahead" term of ``memory_terms``) until the
        next epoch or :meth:`Stream.close`. ``False`` reads nothing ahead
        across epochs and ends the reading threads with each epoch.

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
        shuffle_blocks=shuffle_blocks, shares=shares, worker=worker, num_workers=num_workers, elastic=elastic,
        read_next_epoch=read_next_epoch,
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
    seed
        The seed of the shuffled orders (given, or drawn when none was).

    Notes
    -----
    **Checkpoints.** :meth:`state_dict` says where the batches handed out so
    far end (epoch, batches, seed, and what the data and the plan were);
    :meth:`load_state_dict` on a stream made alike (in a restarted job, say)
    makes the next iteration yield exactly the batches an uninterrupted one
    would have from there, reading only what they need: in order, from the
    first item not yet yielded; shuffled, from the shuffle window it lies in
    (the window's items are mixed, so the window is read again, once).
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
        elastic: bool = False,
        read_next_epoch: bool = True,
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
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        # A seed drawn now, rather than fresh entropy each epoch, so that a saved state can name the order.
        self.seed_given = seed is not None
        self.seed = seed if seed is not None or not shuffle else random.SystemRandom().randrange(2**63)
        self.rank, self.world_size, self.shuffle_blocks = rank, world_size, shuffle_blocks
        self.shares, self.worker, self.num_workers = shares, worker, num_workers
        self.elastic, self.read_next_epoch = bool(elastic), bool(read_next_epoch)
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
        # Where the batches handed out end: [epoch, batches yielded, global batch the epoch started from].
        self._position: list[int] | None = None
        # A loaded state's (epoch, batches, start), applied by the next iteration of that epoch.
        self._resume: tuple[int, int, int] | None = None

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
        # An elastic stream's global batch may span two windows: both are held.
        held = 2 if self.elastic and self.shuffle else 1
        decoding = sum(i.source.decode_bytes for i in self.inputs if i.source is not None)
        return StreamLayout(
            self.length, self.item_bytes, self.shuffle, self.shuffle_blocks, self.threads, held, decoding
        )

    @property
    def _split_ranks(self) -> int:
        """The ranks the shards are cut for: the world size, or one when the order must not depend on it."""
        return 1 if self.elastic else self.world_size

    def _shards(self, split_budget: int, batch_size: int | None, prefetch: int | str) -> list[tuple[int, int]]:
        """Storage-aligned shards along the axis, the same on every rank (see :func:`plan_shards`)."""
        unit = self._unit(max(1, math.ceil(self.length / (2 * self._split_ranks))))
        ready = 2 if prefetch == "auto" else int(prefetch)
        return plan_shards(
            self.layout, unit, self._split_ranks, batch_size=batch_size, ready=ready, split_budget=split_budget
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
        if self.elastic:
            return elastic_steps(self.global_batches, 0, self.world_size, self.rank, self.shares)
        low, high = self._rank_run()
        return self._batches_of(high - low)

    @property
    def global_batches(self) -> int:
        """Batches the epoch's whole sequence makes (an elastic stream's global batches)."""
        return self._batches_of(self.length)

    def _elastic_batches(self, start: int) -> np.ndarray:
        """The global batches this consumer takes from global batch ``start`` on (see :func:`elastic_batches`)."""
        return elastic_batches(
            self.global_batches, start, self.world_size, self.rank, self.shares, self.worker, self.num_workers
        )

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
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch`` does).

        A state loaded for this epoch still applies; one loaded for another
        epoch is dropped, with a warning (the next iteration starts epoch
        ``epoch`` from its first batch).
        """
        epoch = int(epoch)
        if self._resume is not None and self._resume[0] != epoch and self._resume[1:] != (0, 0):
            warnings.warn(
                f"the state loaded into this stream resumes epoch {self._resume[0]} at batch {self._resume[1]}; "
                f"set_epoch({epoch}) starts epoch {epoch} from its first batch instead",
                DaskstreamWarning,
                stacklevel=2,
            )
            self._resume = None
        self.epoch = epoch
        self._position = None

    def _order_rng(self, epoch: int) -> np.random.Generator:
        """The shards' order: shared by every rank and worker (from ``seed``), or fresh without one."""
        return np.random.default_rng(None if self.seed is None else [self.seed, epoch])

    def _items_rng(self, epoch: int) -> np.random.Generator:
        """The order of this consumer's items within its windows."""
        if self.seed is None:
            return np.random.default_rng()
        key = [self.seed, epoch, self.rank, self.worker]
        return np.random.default_rng(key if self.order_entropy is None else [*key, self.order_entropy])

    def _shard_sequence(self, epoch: int) -> list[tuple[int, int]]:
        """The epoch's shards in their order (shared by every rank and worker)."""
        order: Sequence[int] | np.ndarray = range(len(self.block_bounds))
        if self.shuffle:
            order = self._order_rng(epoch).permutation(len(self.block_bounds))
        return [self.block_bounds[i] for i in order]

    def blocks_for(self, epoch: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` runs of items this consumer reads in epoch ``epoch``, in order."""
        if self.elastic:
            return self._elastic_epoch(epoch, 0).reads
        return runs(self._shard_sequence(epoch), *self.share, self.length)

    def _elastic_epoch(self, epoch: int, start: int, first: int = 0) -> _ElasticEpoch:
        """An elastic stream's epoch for this consumer from global batch ``start``, its batch ``first`` on."""
        windows = [[(0, self.length)]]
        if self.shuffle:
            sequence = self._shard_sequence(epoch)
            windows = [sequence[i : i + self.shuffle_blocks] for i in range(0, len(sequence), self.shuffle_blocks)]
        return _ElasticEpoch(windows, self._elastic_batches(start)[first:], self.batch_size, self.length, self.shuffle)

    def __len__(self) -> int:
        if self.elastic:
            return len(self._elastic_batches(0))
        return self._batches_of(self.share[1] - self.share[0])

    # -- iterating -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        cap_malloc_arenas()  # the reader threads share freed memory (daskstream.compute.malloc-arenas)
        epoch, start, first = self.epoch, 0, 0
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] == epoch:
            _, first, start = resume
        self.epoch = epoch + 1
        position = self._position = [epoch, first, start]
        if self.in_caller_thread:
            batches = self._in_caller_thread(epoch, first, start)
        else:
            batches = self._iterate(epoch, first, start)
        return _counted(batches, position)

    def _in_caller_thread(self, epoch: int, first: int, start: int) -> Iterator[Any]:
        stop = threading.Event()
        try:
            yield from self._epoch_batches(epoch, first, start, stop, _Waits())
        finally:
            stop.set()

    def _iterate(self, epoch: int, first: int, start: int) -> Iterator[Any]:
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        waits = _Waits()
        reader = threading.Thread(
            target=self._produce,
            args=(epoch, first, start, ready, stop, waits),
            name=f"daskstream-stream-{epoch}",
            daemon=True,
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

    def _produce(
        self, epoch: int, first: int, start: int, ready: queue.Queue, stop: threading.Event, waits: _Waits
    ) -> None:
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in self._epoch_batches(epoch, first, start, stop, waits):
                if not put(batch):
                    return
            put(_END)
        except BaseException as exc:  # carried to the consumer, raised there
            put(_Failure(exc))

    def _epoch_batches(self, epoch: int, first: int, start: int, stop: threading.Event, waits: _Waits) -> Iterator[Any]:
        """Epoch ``epoch``'s batches from this consumer's batch ``first`` on (``start``: an elastic stream's
        global batch the epoch's shares were cut from)."""
        if self.elastic:
            return self._elastic_batches_of(epoch, start, first, stop, waits)
        return self._batches(epoch, first, stop, waits)

    def _batches(self, epoch: int, first: int, stop: threading.Event, waits: _Waits) -> Iterator[Any]:
        pending: deque[list[np.ndarray]] = deque()  # parts of rows not yet batched, one array per input
        held, left = 0, len(self) - first
        if left <= 0:
            return
        rng = self._items_rng(epoch)
        pieces, skip = self._pieces_from(epoch, first * self.batch_size, rng)
        reads = self._read_ahead(epoch, pieces, stop, waits)
        for parts in self._windows(reads, rng, skip, first * self.batch_size - skip):
            pending.append(parts)
            held += parts[0].shape[self.axis]
            while held >= self.batch_size and left:
                yield self._emit(_take(pending, self.batch_size, self.axis))
                held -= self.batch_size
                left -= 1
        if held and left:
            yield self._emit(_take(pending, held, self.axis))

    def _pieces(self, epoch: int) -> list[tuple[int, int]]:
        """The reads of epoch ``epoch`` from its start: runs cut into reads of at most ``read_rows`` items in
        order, whole runs (one a read, ``shuffle_blocks`` a window) shuffling."""
        runs = self.blocks_for(epoch)
        if self.shuffle or self.elastic:
            return runs
        step = self.read_rows
        return [(s, min(s + step, stop)) for start, stop in runs for s in range(start, stop, step)]

    def _pieces_from(self, epoch: int, skip: int, rng: np.random.Generator) -> tuple[list[tuple[int, int]], int]:
        """The reads left once ``skip`` items of the epoch are yielded, and the items of the first one's
        window still to skip (shuffling; in order the first read starts at the first item left).

        Shuffling, the windows passed whole are not read, but their random
        orders are drawn from ``rng``, so that the rest come out as they would have.
        """
        pieces = self._pieces(epoch)
        if not self.shuffle:
            kept: list[tuple[int, int]] = []
            for low, high in pieces:
                if skip >= high - low:
                    skip -= high - low
                    continue
                kept.append((low + skip, high))
                skip = 0
            return kept, 0
        windows = [pieces[i : i + self.shuffle_blocks] for i in range(0, len(pieces), self.shuffle_blocks)]
        passed = 0
        for window in windows:
            items = sum(high - low for low, high in window)
            if skip < items:
                break
            window_order(rng, items)
            skip -= items
            passed += 1
        return [piece for window in windows[passed:] for piece in window], skip

    def _windows(
        self, blocks: Iterator[list[np.ndarray]], rng: np.random.Generator, skip: int = 0, before: int = 0
    ) -> Iterator[list[np.ndarray]]:
        """The reads as they come, or (shuffling) the rows of each window of ``shuffle_blocks`` reads in one
        random order, gathered a batch at a time from the window's reads (never a copy of the window); the
        first window's first ``skip`` items are left out (a resumed epoch, ``before`` items into it)."""
        if not self.shuffle:
            yield from blocks
            return
        window: list[list[np.ndarray]] = []
        for parts in blocks:
            window.append(parts)
            if len(window) == self.shuffle_blocks:
                yield from _shuffled(window, rng, self.axis, self.batch_size, self.allocate, skip, before)
                before += sum(p[0].shape[self.axis] for p in window)
                window, skip = [], 0
        if window:
            yield from _shuffled(window, rng, self.axis, self.batch_size, self.allocate, skip, before)

    def _emit(self, arrays: list[np.ndarray]) -> Any:
        return tuple(arrays) if self.zipped else arrays[0]

    def _window_rng(self, epoch: int, window: int) -> np.random.Generator:
        """An elastic stream's order of window ``window``'s items: the same on every rank and worker."""
        return np.random.default_rng([self.seed if self.seed is not None else 0, epoch, window])

    def _elastic_batches_of(
        self, epoch: int, start: int, first: int, stop: threading.Event, waits: _Waits
    ) -> Iterator[Any]:
        """An elastic stream's batches: global batches, each gathered from the window(s) it lies in."""
        plan = self._elastic_epoch(epoch, start, first)
        reads = self._read_ahead(epoch, plan.reads, stop, waits)
        if not self.shuffle:
            for parts in reads:
                yield self._emit(parts)
            return
        held: dict[int, tuple[list[list[np.ndarray]], np.ndarray]] = {}
        arrived = 0
        for batch, (low, high) in zip(plan.batches, plan.entries, strict=True):
            while arrived <= high:
                window = plan.needed[arrived]
                shards = [next(reads) for _ in plan.windows[window]]
                held[arrived] = (shards, window_order(self._window_rng(epoch, window), int(plan.sizes[window])))
                arrived += 1
            for entry in [entry for entry in held if entry < low]:
                del held[entry]  # no later batch of this consumer takes from it
            yield self._emit(plan.gather(int(batch), (low, high), held, self.axis, self.allocate))
        for _ in reads:  # none left: lets the reader finish the epoch (and begin the next one's reads)
            pass

    def _read_ahead(
        self, epoch: int, pieces: list[tuple[int, int]], stop: threading.Event, waits: _Waits
    ) -> Iterator[list[np.ndarray]]:
        """Read ``pieces`` of epoch ``epoch`` in order, ``threads`` at once, far enough ahead that the consumer
        need not wait.

        Shuffling, the whole next window is read while the current one is
        consumed. Each time the consumer was found waiting, one more read is
        kept in flight, up to ``extra_reads`` (what the budget allows). Once
        every piece of the epoch is asked for, the first pieces of the next
        epoch are read too (in the same number of reads in flight; unless
        ``read_next_epoch`` is off), so that the next epoch starts without a
        wait; they are dropped if the next iteration is of another epoch or
        starts elsewhere. Leaving early stops the reading threads.
        """

        def read(bounds: tuple[int, int]) -> list[np.ndarray]:
            return [i.read(self.axis, *bounds) for i in self.inputs]

        pool = self._reading_pool()
        primed, self._primed = self._primed, None
        if primed is not None and primed[0] == epoch and primed[1] == pieces:
            _, pieces, in_flight = primed
        else:
            if primed is not None:
                _cancel(primed[2])
            in_flight = deque()
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
                if asked_for_all and self.read_next_epoch and not stop.is_set():
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
            if finished and not stop.is_set() and self.read_next_epoch:
                self._primed = following
            else:
                # Left early, or nothing kept between epochs: the reading threads end with the iteration.
                if following is not None:
                    _cancel(following[2])
                self._close_pool()

    def close(self) -> None:
        """Drop the next epoch's reads begun ahead and end the reading threads now (they start again if the
        stream is iterated again). A stream also releases them when it is garbage collected."""
        primed, self._primed = self._primed, None
        if primed is not None:
            _cancel(primed[2])
        self._close_pool()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checkpoints -----------------------------------------------------------------

    def _plan_identity(self) -> dict[str, Any]:
        """What a saved state must share with this stream for its position to mean the same batches."""
        return {
            "length": self.length,
            "axis": self.axis,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shuffle_blocks": self.shuffle_blocks if self.shuffle else None,
            "shares": self.shares,
            "elastic": self.elastic,
            "shards": f"{len(self.block_bounds)} shards {shards_digest(self.block_bounds)}",
            "world_size": self.world_size,
            "rank": self.rank,
            "worker": self.worker,
            "num_workers": self.num_workers,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the batches handed out so far end, to resume there with :meth:`load_state_dict`.

        Returns
        -------
        dict
            ``epoch`` and ``batches``: the next iteration yields epoch
            ``epoch`` from this consumer's batch ``batches`` (an epoch whose
            batches were all handed out is the next epoch at 0); ``seed``;
            ``data`` and ``plan``: what the arrays and the split were, so that
            a changed source or plan is refused; for an elastic stream,
            ``start`` (the global batch the epoch's shares were cut from) and,
            where one consumer is a whole rank, ``global_batches``: the global
            batches the job has taken, ranks in step, from which a stream on
            any number of ranks resumes. Plain Python values (JSON and
            ``torch.save`` keep them).
        """
        if self._position is not None:
            epoch, batches, start = self._position
        elif self._resume is not None:
            epoch, batches, start = self._resume
        else:
            epoch, batches, start = self.epoch, 0, 0
        if batches >= self._batches_left(start):
            epoch, batches, start = epoch + 1, 0, 0
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "epoch": int(epoch),
            "batches": int(batches),
            "seed": self.seed,
            "order_entropy": self.order_entropy,
            "data": [i.identity for i in self.inputs],
            "plan": self._plan_identity(),
        }
        if self.elastic:
            state["start"] = int(start)
            if self.num_workers == 1:
                state["global_batches"] = int(min(start + batches * self.world_size, self.global_batches))
        return state

    def _batches_left(self, start: int) -> int:
        """Batches this consumer yields in an epoch whose shares were cut from global batch ``start``."""
        return len(self._elastic_batches(start)) if self.elastic else len(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume where ``state`` (from :meth:`state_dict`) ends.

        Raises
        ------
        SourceChangedError
            The arrays are not the ones the state was saved from (another file,
            or the same one rewritten since).
        InvalidArgumentError
            The state is not a stream's, or the stream is cut otherwise (another
            batch size, shuffle, split...; an elastic stream also resumes on
            another world size and number of workers, from a rank's state).
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidArgumentError(
                f"load_state_dict takes what a daskstream stream's state_dict() returned ({STATE_FORMAT!r}), not "
                f"{_shown(state)}"
            )
        data = [i.identity for i in self.inputs]
        if state["data"] != data:
            raise SourceChangedError(
                f"the saved stream state is of other data than this stream's {', '.join(i.name for i in self.inputs)}"
                f" (saved: {state['data']}, now: {data}): the data changed since the state was saved, so its "
                "position would not name the same items; start the epoch again without the state"
            )
        plan = self._plan_identity()
        differs = {key: (state["plan"].get(key), now) for key, now in plan.items() if state["plan"].get(key) != now}
        shuffled = self.shuffle and state.get("seed") is not None
        if shuffled and self.seed_given and state["seed"] != self.seed:
            differs["seed"] = (state["seed"], self.seed)
        epoch, batches, start = int(state["epoch"]), int(state["batches"]), int(state.get("start", 0))
        if self.elastic and "global_batches" in state and set(differs) <= set(_ELASTIC_FREE):
            # The job's global position, cut afresh among this job's ranks and workers (on the same ones,
            # the batches an exact resume would give).
            batches, start = 0, int(state["global_batches"])
        elif differs and self.elastic and set(differs) <= set(_ELASTIC_FREE):
            raise InvalidArgumentError(
                "this state is one DataLoader worker's position, which alone does not say where the job is: "
                "to resume on another world size or number of workers, load the loader's whole state "
                "(StreamDataset.load_state_dict(loader.state_dict()) with torchdata's StatefulDataLoader), or a "
                "state saved with num_workers=0"
            )
        elif differs:
            shown = "; ".join(f"{key} {was!r} then, {now!r} now" for key, (was, now) in differs.items())
            hint = (
                " (make the stream with elastic=True to resume on another world size or number of workers)"
                if set(differs) <= {*_ELASTIC_FREE, "shards"}
                else ""
            )
            raise InvalidArgumentError(
                f"the saved stream state was cut otherwise than this stream ({shown}): its position would not "
                f"name the same batches; make the stream as it was{hint}"
            )
        if shuffled:
            self.seed = state["seed"]
            self.order_entropy = state.get("order_entropy")
        self._resume = (epoch, batches, start)
        self.epoch = epoch
        self._position = None

    # -- showing ---------------------------------------------------------------------

    @property
    def read_amplification(self) -> float:
        """Bytes read per byte delivered in an epoch of this consumer (1.0: each item read once; storage
        chunks read whole count whole)."""
        delivered = sum(high - low for low, high in self._delivered())
        if not delivered:
            return 1.0
        unit = self.inputs[0].unit(self.axis)
        read = 0
        for low, high in self._pieces(0):
            read += min(self.length, -(-high // unit) * unit) - (low // unit) * unit
        return read / delivered

    def _delivered(self) -> list[tuple[int, int]]:
        """The items this consumer yields in an epoch, as runs of the epoch's sequence."""
        if not self.elastic:
            return [(self.share[0], self.share[1])]
        rows = self.batch_size
        return [(int(g) * rows, min(int(g) * rows + rows, self.length)) for g in self._elastic_batches(0)]

    def explain(self) -> str:
        """Plain-text account of the split, the order, the reads and what the stream holds."""
        first_shard = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0
        names = ", ".join(f"{i.name} {i.shape} {i.dtype}" for i in self.inputs)
        terms = self.memory_terms
        held = ", ".join(f"{term} {format_size(n)}" for term, n in terms.items() if n)
        if self.elastic:
            split = (
                f"elastic: one global order of {self.global_batches} batches for any world size; rank "
                f"{self.rank} of {self.world_size} takes global batches {self.rank}, {self.rank + self.world_size}, "
                f"{self.rank + 2 * self.world_size}..."
                + (f", its worker {self.worker} of {self.num_workers} one in {self.num_workers} of those"
                   if self.num_workers > 1 else "")
            )  # fmt: skip
        else:
            split = (
                f"rank {self.rank} of {self.world_size} takes run {self.rank} (counting from 0) of "
                f"{self.world_size} equal runs of the epoch's shards ({self.shares})"
                + (f", its worker {self.worker} of {self.num_workers} a contiguous part" if self.num_workers > 1
                   else "")
            )  # fmt: skip
        order = (
            f"shuffled: shards in a random order, the items of each window of {self.shuffle_blocks} shard(s) "
            f"(up to {self.shuffle_blocks * first_shard} items) mixed; (seed, epoch) fixes it"
            if self.shuffle
            else "in order"
        )
        amplification = self.read_amplification
        cost = (
            "each item read once"
            if amplification < 1.005
            else f"{amplification:.2f} bytes read per byte delivered"
            + (" (every window a batch is taken from is read whole)" if self.elastic and self.shuffle else "")
        )
        return "\n".join(
            [
                f"Stream of {names}: {self.length} items along axis {self.axis} "
                f"({format_size(self.item_bytes)} each), batches of {self.batch_size}",
                f"Shards: {len(self.block_bounds)} storage-aligned runs of up to {first_shard} items, the same on "
                "every rank",
                f"Split: {split}; this consumer yields {len(self)} batches an epoch",
                f"Order: {order}",
                f"Reads: up to {self.read_rows} items a read, {self.threads} reading thread(s); {cost}",
                f"Holds at most {format_size(self.projected_peak_bytes)}: {held}, within its budget of "
                f"{format_size(self.resources.memory_budget)} (a fifth kept free)",
                "Between epochs: "
                + (
                    "the next epoch's first reads are begun during the last batches and kept, with the reading "
                    "threads, until it starts or close()"
                    if self.read_next_epoch
                    else "nothing is read ahead or kept; the reading threads end with each epoch"
                ),
            ]
        )

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


def _counted(batches: Iterator[Any], position: list[int]) -> Iterator[Any]:
    """``batches``, counting in ``position[1]`` each one handed out (before the consumer has it, so that a
    state saved while it is used resumes after it)."""
    try:
        for batch in batches:
            position[1] += 1
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _shown(value: Any) -> str:
    """``value`` for a message: its type and a short repr."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


class _ElasticEpoch:
    """An elastic stream's epoch for one consumer: its global batches, the windows they lie in, and its reads.

    Global batch ``g`` is items ``g * batch_size`` to ``(g + 1) * batch_size``
    of the epoch's sequence: the windows (shards in the epoch's order,
    ``shuffle_blocks`` at a time) laid end to end, each window's items in its
    own random order. In order there is one window, the array, and a batch is
    read by itself.

    Attributes
    ----------
    batches
        The consumer's global batches, in order.
    needed
        The windows the consumer reads, in order (one again if a later batch,
        past a wrap of ``"pad"``, needs it again).
    entries
        For each batch, the first and last place in ``needed`` it takes items from.
    reads
        The shards of ``needed``, in order (in order: one read a batch).
    """

    def __init__(
        self,
        windows: list[list[tuple[int, int]]],
        batches: np.ndarray,
        batch_size: int,
        length: int,
        shuffle: bool,
    ) -> None:
        self.windows, self.batches, self.batch_size, self.length = windows, batches, batch_size, length
        self.needed: list[int] = []
        self.entries: list[tuple[int, int]] = []
        if not shuffle:
            self.reads = [self._bounds(int(g)) for g in batches]
            return
        self.sizes = np.array([sum(high - low for low, high in window) for window in windows], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        for g in batches:
            low, high = self._bounds(int(g))
            first_window = int(np.searchsorted(self.offsets, low, side="right")) - 1
            last_window = int(np.searchsorted(self.offsets, high - 1, side="right")) - 1
            # A window the last batch took from is still held: it is not read again.
            if not self.needed or self.needed[-1] != first_window:
                self.needed.append(first_window)
            first_entry = len(self.needed) - 1
            self.needed.extend(range(first_window + 1, last_window + 1))
            self.entries.append((first_entry, len(self.needed) - 1))
        self.reads = [shard for window in self.needed for shard in windows[window]]

    def _bounds(self, batch: int) -> tuple[int, int]:
        return batch * self.batch_size, min((batch + 1) * self.batch_size, self.length)

    def gather(
        self,
        batch: int,
        entries: tuple[int, int],
        held: dict[int, tuple[list[list[np.ndarray]], np.ndarray]],
        axis: int,
        allocate: Any,
    ) -> list[np.ndarray]:
        """Global batch ``batch``'s items, one array per input, gathered from the held windows' reads.

        Within the part of the batch from each window, items come in the order
        they lie in the window's shards, so each shard's share is one gather.
        """
        low, high = self._bounds(batch)
        first = held[entries[0]][0][0]
        lead = (slice(None),) * axis
        outs = [allocate((*p.shape[:axis], high - low, *p.shape[axis + 1 :]), p.dtype) for p in first]
        at = 0
        for entry in range(entries[0], entries[1] + 1):
            shards, order = held[entry]
            window = self.needed[entry]
            start = int(self.offsets[window])
            begin, end = max(low, start) - start, min(high, start + int(self.sizes[window])) - start
            if begin >= end:
                continue
            chosen = np.sort(order[begin:end])
            shard_offsets = np.cumsum([0, *(b - a for a, b in self.windows[window])])
            edges = np.searchsorted(chosen, shard_offsets)
            for j, (e0, e1) in enumerate(itertools.pairwise(edges)):
                if e0 < e1:
                    for k, out in enumerate(outs):
                        np.take(
                            shards[j][k],
                            chosen[e0:e1] - shard_offsets[j],
                            axis=axis,
                            out=out[(*lead, slice(at + e0, at + e1))],
                            mode="clip",
                        )
            at += end - begin
        return outs


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
    batch: int,
    allocate: Any = np.empty,
    skip: int = 0,
    before: int = 0,
) -> Iterator[list[np.ndarray]]:
    """The items of a window of reads in one random order (the same for every input), a batch at a time.

    Which items form each piece is random; within a piece they come in the
    order they lie in the window (a training step does not depend on the
    order of the rows of its batch), so that each read's share is one gather
    straight into place. Pieces are cut where the epoch's batches are (the
    window starts ``before`` items into the epoch): a batch across two windows
    is the last piece of one and the first of the next, whole, so no piece is
    kept alive by a view once its batch is made. The first ``skip`` items of
    the window's sequence are left out (a resumed epoch): pieces wholly before
    them are not gathered.
    """
    lengths = [parts[0].shape[axis] for parts in window]
    offsets = np.cumsum([0, *lengths])
    order = window_order(rng, int(offsets[-1]))
    lead = (slice(None),) * axis
    first_cut = -before % batch
    cuts = [0, *range(first_cut or batch, order.size, batch), order.size]
    for start, stop in itertools.pairwise(dict.fromkeys(cuts)):
        if stop <= skip:
            continue
        chosen = np.sort(order[start:stop])
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
        if start < skip:
            gathered = [out[(*lead, slice(skip - start, None))] for out in gathered]
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
