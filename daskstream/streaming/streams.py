"""The :class:`Stream` object and :func:`stream`, which resolves its budget and makes one.

The array is cut into shards that depend only on the data and the arguments,
so that every rank of a distributed training run splits it alike; each epoch
the shards are laid end to end (in a shared random order when shuffling) and
every rank takes an equal run of that sequence. Reads run ahead in a thread
pool, the next shuffle window and the next epoch's first reads included.

A :class:`Stream` checks its arguments here; what it does lives beside this
module: its plan in :mod:`~daskstream.streaming.plan`, its epochs in
:mod:`~daskstream.streaming.readers`, its checkpoints in
:mod:`~daskstream.streaming.checkpoints` and its views in
:mod:`~daskstream.streaming.view`.

>>> import numpy as np, tempfile, os
>>> import daskstream as ds
>>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
>>> np.save(path, np.arange(20.0).reshape(10, 2))
>>> [batch[:, 0].tolist() for batch in ds.stream(path, batch_size=4)]
[[0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0], [16.0, 18.0]]
"""

from __future__ import annotations

import concurrent.futures
import random
from collections import deque
from typing import Any

import numpy as np

from daskstream.advice import keyword, said
from daskstream.compute.labels import axes_by_name, unlabelled
from daskstream.errors import InvalidArgumentError, InvalidAxisError
from daskstream.graph.layers import planned_with
from daskstream.planning.budget import parse_budget
from daskstream.planning.settings import Resources
from daskstream.planning.streams import SHARES, SPLIT_BUDGET
from daskstream.runtime.resources import resources_for
from daskstream.streaming.checkpoints import StreamCheckpoints
from daskstream.streaming.inputs import _Input
from daskstream.streaming.readers import StreamReading
from daskstream.streaming.view import StreamView


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
        workers in contiguous runs, each worker reading (and shuffling) only
        its own run. The rank yields the same items and the same number of
        batches whatever the number of workers, but not the same batches: a
        DataLoader takes its workers' batches in turn, so their order
        changes, and shuffled batches are drawn within each worker's run. For
        the same batches in the same order with any number of workers (and
        ranks), make the stream ``elastic``.
    elastic
        One global order of batches whatever the world size and workers: the
        shards and shuffle windows depend only on the data, ``seed``, the
        epoch and the shuffle settings; the epoch's items, window by window,
        are cut into global batches of ``batch_size``, and rank ``r`` takes
        global batches ``r``, ``r + world_size``... (its workers in turn), so
        step ``k`` of a job is the same ``world_size`` batches on any number
        of ranks, and a job resumed on another number (``load_state_dict``)
        continues the same epoch without repeating or skipping an item. With
        ``shares="pad"`` the last step's items are cut into one piece per
        rank, so ranks take the same number of steps and at most
        ``world_size - 1`` items are repeated. The price is read
        amplification when shuffling: each consumer reads every window it
        takes a batch from, up to ``world_size * num_workers`` bytes read per
        byte delivered (:meth:`Stream.explain` says how many); in order, each
        batch is read by itself.
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


class Stream(StreamReading, StreamCheckpoints, StreamView):
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
                said(keyword("axis", axis), f" is out of range for {first.name} with {ndim} axes; use 0..{ndim - 1}")
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
                raise InvalidArgumentError(said(keyword(name, value), f" must be an int of at least {low}"))
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
        # Whether an epoch ends with the loop over it, so that a state saved after the loop resumes at the next
        # epoch. Not in a loader worker: its share may end while the loader's epoch goes on, and the loader
        # itself starts the next epoch once every worker's has ended.
        self.loop_ends_epoch = True
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
        # Where the batches handed out end: [epoch, batches yielded, global batch the epoch started from,
        # whether the loop over the epoch has ended].
        self._position: list[int] | None = None
        # A loaded state's (epoch, batches, start), applied by the next iteration of that epoch.
        self._resume: tuple[int, int, int] | None = None
