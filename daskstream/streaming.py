"""Batches for training loops: storage-aligned reads in a background thread, shuffled in bounded windows.

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
import math
import os
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from daskstream.errors import InvalidArgumentError, InvalidAxisError, MemoryBudgetError
from daskstream.planning.budget import format_size
from daskstream.sources import Source, open_source

_END = object()


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
            from daskstream.arrays import read_layers

            layers = read_layers(x)
            # An array straight from daskstream.open is read from its Source, without dask in the loop.
            if len(layers) == 1 and layers[0][0] == x.name:
                self.source = layers[0][1]
            else:
                self.array = x
        elif isinstance(x, (str, os.PathLike)):
            self.source = open_source(x)
        else:
            raise InvalidArgumentError(
                f"stream takes paths, Sources or dask arrays (from daskstream.open), not {type(x).__name__}"
            )
        from daskstream.compute.layers import opened_budget

        # The budget an array from daskstream.open was opened with, for the stream to keep.
        self.opened_budget = opened_budget(x) if hasattr(x, "__dask_graph__") else None
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
        if self.source is not None:
            return self.source.read(index)
        return np.asarray(self.array[index].compute(scheduler="sync"))


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
        Items per batch; default one planned block (a storage-aligned read of
        about the planner's chunk size).
    prefetch
        Batches kept ready ahead of the consumer, or ``"auto"``: as many as a
        quarter of the memory budget holds (at least 2).
    shuffle
        A different order every epoch: storage-aligned blocks in random order,
        then the items of each window of ``shuffle_blocks`` blocks shuffled
        together. Never a random read per item; every item still appears
        exactly once per epoch.
    seed
        Makes shuffled orders reproducible: epoch ``e`` uses ``(seed, e)``.
        Needed with ``shuffle`` and ``world_size > 1``, so that every rank
        draws the same block order and takes a disjoint share.
    drop_last
        Leave out a last batch shorter than ``batch_size``.
    memory_budget
        Bytes the stream may hold (default as for the planner): sizes blocks and ``prefetch="auto"``.
    rank, world_size
        Data-parallel training: this consumer takes every ``world_size``-th
        block from ``rank`` on, so the ranks' shares are disjoint and cover
        the array.
    shuffle_blocks
        Blocks shuffled together: the bound on the shuffle buffer.

    Returns
    -------
    Stream
        Iterate it once per epoch (``for batch in s``); ``len(s)`` is the
        number of batches of the next epoch.
    """
    return Stream(
        x, axis=axis, batch_size=batch_size, prefetch=prefetch, shuffle=shuffle, seed=seed, drop_last=drop_last,
        memory_budget=memory_budget, rank=rank, world_size=world_size, shuffle_blocks=shuffle_blocks,
    )  # fmt: skip


class Stream:
    """Epochs of batches over one array or several zipped ones; made by :func:`stream`.

    Attributes
    ----------
    block_bounds
        ``(start, stop)`` along the axis of every storage-aligned block read as one.
    batch_size, prefetch
        Items per batch; batches read ahead.
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
        memory_budget: int | str | None,
        rank: int,
        world_size: int,
        shuffle_blocks: int,
    ) -> None:
        from daskstream.runtime.resources import resolve_resources

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
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name}={value!r} must be an int of at least {low}")
        if rank >= world_size:
            raise InvalidArgumentError(f"rank={rank} must be below world_size={world_size}")
        if shuffle and world_size > 1 and seed is None:
            raise InvalidArgumentError(
                "shuffle=True with world_size > 1 needs seed=: every rank must draw the same block order "
                "to take a disjoint share"
            )
        self.resources = resolve_resources(memory_budget=self._budget(memory_budget))
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.rank, self.world_size, self.shuffle_blocks = rank, world_size, shuffle_blocks
        self.threads = self.resources.threads
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1
        ):
            raise InvalidArgumentError(f"batch_size={batch_size!r} must be a positive int")
        if prefetch != "auto" and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise InvalidArgumentError(f"prefetch={prefetch!r} must be a positive int or 'auto'")
        self.block_bounds = self._blocks(world_size, batch_size, prefetch)
        if batch_size is None:
            batch_size = max(1, self.block_bounds[0][1] - self.block_bounds[0][0]) if self.block_bounds else 1
        self.batch_size = int(batch_size)
        self.prefetch = self._prefetch(prefetch)
        self.epoch = 0

    def _budget(self, memory_budget: int | str | None) -> int | str | None:
        """The budget given, else the smallest one the arrays were opened with."""
        if memory_budget is not None:
            return memory_budget
        return min((i.opened_budget for i in self.inputs if i.opened_budget), default=None)

    # -- planning ------------------------------------------------------------------

    @property
    def item_bytes(self) -> int:
        """Bytes of one item across all zipped arrays."""
        return sum(i.item_bytes(self.axis) for i in self.inputs)

    @property
    def memory_terms(self) -> dict[str, int]:
        """What the stream holds at most, term by term: read ahead, shuffle window, batches ready and forming."""
        rows = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0
        return self._terms(rows * self.item_bytes, min(self.batch_size, self.length) * self.item_bytes, self.prefetch)

    @property
    def projected_peak_bytes(self) -> int:
        return sum(self.memory_terms.values())

    def _terms(self, block: int, batch: int, prefetch: int) -> dict[str, int]:
        # A batch inside one block is a view of it: in order, each batch held keeps its block.
        pinned = batch if self.shuffle else max(batch, block)
        return {
            # A read in flight per thread, one more queued, and the block being taken apart.
            "read ahead": (self.threads + 2) * block,
            "shuffle window": (self.shuffle_blocks * block) if self.shuffle else 0,
            # The batches in the queue, and the one waiting to enter it.
            "batches ready": (prefetch + 1) * pinned,
            # The batch being put together (and, shuffling, the rows gathered for it).
            "batch forming": (2 if self.shuffle else 1) * batch,
            # The batch the training loop holds while the next one is taken.
            "batch in use": pinned,
        }

    def _blocks(self, world_size: int, batch_size: int | None, prefetch: int | str) -> list[tuple[int, int]]:
        """Storage-aligned blocks along the axis: as large as the budget allows beside the window and the
        batches (and no larger than the planner's chunk), enough for every thread and rank.

        Raises :class:`MemoryBudgetError` when even one storage-aligned block does not fit.
        """
        from daskstream.runtime.resources import cache_sized_chunk_bytes

        # A fifth of the budget stays free for what the allocator keeps and the loop's own copies.
        budget = self.resources.memory_budget * 4 // 5
        # At least two blocks per reading thread and per rank, where the storage grid allows.
        spread = math.ceil(self.length / (2 * self.threads * world_size))
        # Blocks whole in every zipped array's storage chunks, unless that makes them too few;
        # then whole in the first array's (the others' chunks at block edges are read twice).
        unit = math.lcm(*(i.unit(self.axis) for i in self.inputs))
        if unit > spread:
            unit = self.inputs[0].unit(self.axis)
        ready = 2 if prefetch == "auto" else int(prefetch)

        def held(rows: int) -> dict[str, int]:
            items = rows if batch_size is None else min(int(batch_size), self.length)
            return self._terms(rows * self.item_bytes, items * self.item_bytes, ready)

        largest = max(1, cache_sized_chunk_bytes() // max(1, self.item_bytes * unit))
        units = max(1, min(largest, math.ceil(spread / unit)))
        # The most storage units per block that fit: what the stream holds grows with the block.
        low, high = 1, units
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if sum(held(middle * unit).values()) <= budget else (low, middle - 1)
        rows = low * unit
        if sum(held(rows).values()) > budget:
            least = held(unit)
            shown = ", ".join(f"{name} {format_size(n)}" for name, n in least.items() if n)
            raise MemoryBudgetError(
                f"stream of {self.inputs[0].name}: one storage-aligned block is "
                f"{format_size(unit * self.item_bytes)} ({unit} item(s)), and the stream holds {shown} = "
                f"{format_size(sum(least.values()))}, over the {format_size(budget)} it may use of its memory "
                f"budget of {format_size(self.resources.memory_budget)} (a fifth stays free); raise "
                "memory_budget, or lower shuffle_blocks, prefetch or batch_size"
            )
        return [(start, min(start + rows, self.length)) for start in range(0, self.length, rows)]

    def _prefetch(self, prefetch: int | str) -> int:
        if prefetch != "auto":
            return int(prefetch)
        # As many batches as the budget holds beside the blocks, at least two and at most 64.
        held = self._terms(
            (self.block_bounds[0][1] - self.block_bounds[0][0]) * self.item_bytes if self.block_bounds else 0,
            self.batch_size * self.item_bytes,
            0,
        )
        left = self.resources.memory_budget * 4 // 5 - sum(held.values())
        return max(2, min(64, left // max(min(self.batch_size, self.length) * self.item_bytes, 1)))

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch`` does)."""
        self.epoch = int(epoch)

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng(None if self.seed is None else [self.seed, epoch])

    def blocks_for(self, epoch: int, rng: np.random.Generator | None = None) -> list[tuple[int, int]]:
        """This rank's blocks in the order epoch ``epoch`` reads them."""
        order = list(range(len(self.block_bounds)))
        if self.shuffle:
            order = list((rng or self._rng(epoch)).permutation(len(order)))
        return [self.block_bounds[i] for i in order[self.rank :: self.world_size]]

    def __len__(self) -> int:
        sizes = {b - a for a, b in self.block_bounds}
        if self.shuffle and self.seed is None and self.world_size > 1 and len(sizes) > 1:
            # Which rank gets the one short block is drawn afresh each epoch.
            raise TypeError("len() of a shuffled, sharded stream without a seed is not fixed; give seed=")
        items = sum(b - a for a, b in self.blocks_for(self.epoch))
        return items // self.batch_size if self.drop_last else math.ceil(items / self.batch_size)

    # -- iterating -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        self.epoch += 1
        return self._iterate(epoch)

    def _iterate(self, epoch: int) -> Iterator[Any]:
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        reader = threading.Thread(
            target=self._produce, args=(epoch, ready, stop), name=f"daskstream-stream-{epoch}", daemon=True
        )
        reader.start()
        try:
            while True:
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

    def _produce(self, epoch: int, ready: queue.Queue, stop: threading.Event) -> None:
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in self._batches(epoch, stop):
                if not put(batch):
                    return
            put(_END)
        except BaseException as exc:  # carried to the consumer, raised there
            put(_Failure(exc))

    def _batches(self, epoch: int, stop: threading.Event) -> Iterator[Any]:
        rng = self._rng(epoch)
        pending: deque[list[np.ndarray]] = deque()  # parts of rows not yet batched, one array per input
        held = 0
        for parts in self._windows(self._read_ahead(self.blocks_for(epoch, rng), stop), rng):
            pending.append(parts)
            held += parts[0].shape[self.axis]
            while held >= self.batch_size:
                yield self._emit(_take(pending, self.batch_size, self.axis))
                held -= self.batch_size
        if held and not self.drop_last:
            yield self._emit(_take(pending, held, self.axis))

    def _windows(self, blocks: Iterator[list[np.ndarray]], rng: np.random.Generator) -> Iterator[list[np.ndarray]]:
        """The blocks as read, or (shuffling) the rows of each window of ``shuffle_blocks`` blocks in one
        random order, gathered a batch at a time from the window's blocks (never a copy of the window)."""
        if not self.shuffle:
            yield from blocks
            return
        window: list[list[np.ndarray]] = []
        for parts in blocks:
            window.append(parts)
            if len(window) == self.shuffle_blocks:
                yield from _shuffled(window, rng, self.axis, self.batch_size)
                window = []
        if window:
            yield from _shuffled(window, rng, self.axis, self.batch_size)

    def _emit(self, arrays: list[np.ndarray]) -> Any:
        return tuple(arrays) if self.zipped else arrays[0]

    def _read_ahead(self, blocks: list[tuple[int, int]], stop: threading.Event) -> Iterator[list[np.ndarray]]:
        """Read ``blocks`` in order, ``threads`` of them at once."""

        def read(bounds: tuple[int, int]) -> list[np.ndarray]:
            return [i.read(self.axis, *bounds) for i in self.inputs]

        with concurrent.futures.ThreadPoolExecutor(
            self.threads, thread_name_prefix="daskstream-read", initializer=_yield_to_consumer
        ) as pool:
            in_flight: deque[concurrent.futures.Future] = deque()
            pending = iter(blocks)
            try:
                for bounds in pending:
                    in_flight.append(pool.submit(read, bounds))
                    if len(in_flight) > self.threads:
                        break
                while in_flight and not stop.is_set():
                    parts = in_flight.popleft().result()
                    nxt = next(pending, None)
                    if nxt is not None:
                        in_flight.append(pool.submit(read, nxt))
                    yield parts
            finally:
                for future in in_flight:
                    future.cancel()

    # -- showing ---------------------------------------------------------------------

    def __repr__(self) -> str:
        names = ", ".join(i.name for i in self.inputs)
        return (
            f"<daskstream Stream of {names}: {self.length} items along axis {self.axis}, batches of "
            f"{self.batch_size}, {len(self.block_bounds)} blocks, prefetch {self.prefetch}"
            f"{', shuffled' if self.shuffle else ''}{f', rank {self.rank}/{self.world_size}' if self.world_size > 1 else ''}>"
        )

    def _repr_html_(self) -> str:
        rows = [
            ("arrays", ", ".join(f"{i.name} {i.shape} {i.dtype}" for i in self.inputs)),
            ("items", f"{self.length} along axis {self.axis} ({format_size(self.item_bytes)} each)"),
            ("batch", f"{self.batch_size} items ({format_size(self.batch_size * self.item_bytes)})"),
            ("blocks", f"{len(self.block_bounds)} storage-aligned reads of up to "
                       f"{self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0} items"),
            ("prefetch", f"{self.prefetch} batches, {self.threads} reading thread(s)"),
            ("order", f"shuffled in windows of {self.shuffle_blocks} blocks" if self.shuffle else "in order"),
            ("shard", f"rank {self.rank} of {self.world_size}"),
        ]  # fmt: skip
        from daskstream.display import card, grid_figure, table

        first = self.inputs[0]
        storage = first.source.storage_chunks if first.source is not None else None
        rows_per_block = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0
        block = tuple(rows_per_block if a == self.axis else n for a, n in enumerate(first.shape))
        return card("daskstream Stream", grid_figure(first.shape, storage, block), table(rows))


def _yield_to_consumer() -> None:
    """Lower this reading thread's scheduling priority (Linux: per thread), so the consumer preempts it.

    Reads keep every core busy; a training step waking up (from a GPU wait, say)
    should run at once, not wait for a time slice behind the prefetch.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _shuffled(
    window: list[list[np.ndarray]], rng: np.random.Generator, axis: int, piece: int
) -> Iterator[list[np.ndarray]]:
    """The items of a window of blocks in one random order (the same for every input), ``piece`` at a time.

    The order is that of the window's items laid end to end; each piece is
    gathered from the blocks it draws on.
    """
    lengths = [parts[0].shape[axis] for parts in window]
    offsets = np.cumsum([0, *lengths])
    order = rng.permutation(int(offsets[-1]))
    lead = (slice(None),) * axis
    for start in range(0, order.size, piece):
        chosen = order[start : start + piece]
        block_of = np.searchsorted(offsets, chosen, side="right") - 1
        gathered = []
        for k in range(len(window[0])):
            first = window[0][k]
            out = np.empty((*first.shape[:axis], chosen.size, *first.shape[axis + 1 :]), dtype=first.dtype)
            for b in np.unique(block_of):
                where = np.flatnonzero(block_of == b)
                out[(*lead, where)] = np.take(window[b][k], chosen[where] - offsets[b], axis=axis)
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
