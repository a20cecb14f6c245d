"""How a stream of batches is cut and what it holds: pure functions of sizes, counts and a budget.

A stream's shards (its unit of reading and shuffling) are planned from the
data and the arguments every rank shares only, so that every rank, whatever
its machine, cuts the same ones; how much a consumer reads at once and how
far ahead is then sized to its own machine's budget. The memory a stream holds
is named term by term (:func:`stream_terms`), the same terms its view shows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from daskstream.advice import named, said
from daskstream.errors import MemoryBudgetError
from daskstream.planning.budget import format_size, plannable_bytes

# The split of an array among ranks is planned as if for this budget unless one is given, so that
# every rank, whatever its machine, cuts the same shards. Shards are at most SHARD_BYTES: a read
# that large costs little per byte, and a shuffle over such shards still mixes well.
SPLIT_BUDGET = 256 * 2**20
SHARD_BYTES = 8 * 2**20
# The reading threads the split assumes, so that a machine with up to this many fits the same shards.
SPLIT_THREADS = 4
# Reads the reader may add ahead of the consumer when it finds the consumer waiting.
MAX_EXTRA_READS = 8
SHARES = ("pad", "drop", "uneven")

#: What a stream's threads, queues, futures and the parts of its reads take whatever the data (Python
#: objects; measured ~100 KiB with every read ahead in flight, tests/test_stream.py's slow loop).
BOOKKEEPING_BYTES = 128 * 2**10
#: One read's entry in an epoch's list of reads (a tuple of two ints: ~120 B).
READ_ENTRY_BYTES = 128


@dataclass(frozen=True)
class StreamLayout:
    """What planning a stream needs to know of it: items, their size, and how it shuffles and reads.

    Attributes
    ----------
    length
        Items along the stream's axis.
    item_bytes
        Bytes of one item across all the zipped arrays.
    shuffle, shuffle_blocks
        Whether it shuffles, and over how many shards at a time.
    threads
        Reading threads on this machine.
    held_windows
        Shuffle windows held at once: 1, or 2 for an elastic stream, whose
        global batches may span two windows.
    decode_bytes
        Bytes one read holds beyond what it returns while it decodes (a
        compressed chunk and its decoded copy; 0 for ``.npy``), across the
        zipped arrays.
    """

    length: int
    item_bytes: int
    shuffle: bool
    shuffle_blocks: int
    threads: int
    held_windows: int = 1
    decode_bytes: int = 0

    def terms(
        self, read: int, batch: int, prefetch: int, extra_reads: int, *, threads: int | None = None
    ) -> dict[str, int]:
        """What the stream holds at most, term by term, for reads of ``read`` bytes and batches of ``batch``.

        >>> StreamLayout(1000, 8, shuffle=False, shuffle_blocks=0, threads=2).terms(800, 80, 2, 0)
        {'read ahead': 2400, 'decoding': 0, 'allocator reserve': 3280, 'shuffle window': 0, 'shuffle order': 0, 'reads kept by batches': 800, 'batches ready': 160, 'batch forming': 160, 'batch in use': 80, 'bookkeeping': 133632}
        """
        threads = self.threads if threads is None else threads
        window_items = self.shuffle_blocks * read // max(1, self.item_bytes)
        if self.shuffle:
            # Reads in flight, one per thread, and the next window while this one is gathered from (the
            # last window's reads leave it before the next read is asked for); the extra reads added when
            # the consumer was found waiting. An elastic batch may be gathered from two windows while a
            # read is asked for: one more.
            ahead = threads + self.shuffle_blocks + extra_reads + (self.held_windows - 1)
        else:
            # Reads in flight, one per thread and the extra ones, one more asked for, and the one batches
            # are being cut from.
            ahead = threads + 1 + extra_reads
        return {
            "read ahead": ahead * read,
            # What each reading thread holds while it decodes, beside the read it fills.
            "decoding": threads * self.decode_bytes,
            # What the C allocator keeps of freed reads and batches, per reading thread's heap, and a freed
            # batch in the heap batches are made in: resident, though nothing uses them. glibc maps a large
            # block and unmaps it when freed, but then raises its thresholds to that block's size, so that a
            # heap keeps up to twice the largest freed block at its top before handing memory back (measured
            # in benchmarks/stream_memory.py over whole epochs).
            "allocator reserve": 2 * threads * max(read, batch) + batch,
            "shuffle window": (self.held_windows * self.shuffle_blocks * read) if self.shuffle else 0,
            # The window's random order (4-byte positions below 2**31 items) and a batch's sorted share of it.
            "shuffle order": (
                self.held_windows * order_bytes(window_items) + 2 * order_bytes(batch // max(1, self.item_bytes))
                if self.shuffle
                else 0
            ),
            "reads kept by batches": 0 if self.shuffle else kept_reads(read, batch, prefetch) * read,
            # The batches in the queue.
            "batches ready": prefetch * batch,
            # The batch being put together, or waiting to enter the queue once made (the same thread does
            # both), and the parts it is made of: a batch across two reads in order, across two windows'
            # gathered rows shuffling.
            "batch forming": 2 * batch,
            # The batch the training loop holds while the next one is taken.
            "batch in use": batch,
            # The lists of this epoch's reads and the next one's, and the reading threads' own objects.
            "bookkeeping": BOOKKEEPING_BYTES + 2 * READ_ENTRY_BYTES * -(-self.length * self.item_bytes // max(1, read)),
        }


def kept_reads(read: int, batch: int, prefetch: int) -> int:
    """Reads an in-order stream's batches keep alive behind the ones it reads ahead.

    A batch that lies in one read is a view of it (no copy), and keeps the
    whole read; one across reads is a copy of its parts. The batches held --
    ``prefetch`` queued, one waiting to enter the queue, one in use -- and the
    rest of a read not yet batched lie in the last ``prefetch + 3`` batches'
    worth of items, so they keep at most as many reads as that span touches.
    Reads smaller than a batch are only kept while a batch is cut from them.

    >>> kept_reads(8 << 20, 1 << 20, 2), kept_reads(1 << 20, 1 << 20, 2), kept_reads(1 << 20, 4 << 20, 2)
    (1, 1, 4)
    """
    if read <= batch:
        return -(-batch // read)
    span = (prefetch + 3) * batch
    return min(prefetch + 3, -(-span // read))


def largest_fitting(high: int, held: Callable[[int], int], budget: int) -> int:
    """The largest ``k`` in ``1..high`` with ``held(k) <= budget``; where none fits, the ``k`` holding least.

    ``held`` falls, then rises, as ``k`` grows: the reads ahead, windows and
    batches grow with the read size, the bookkeeping (an entry per read)
    shrinks.

    >>> largest_fitting(100, lambda k: 10 * k + 1000 // k, 500), largest_fitting(100, lambda k: 10 * k + 1000 // k, 50)
    (48, 10)
    """
    low, high = 1, max(1, high)
    least_at = low
    top = high
    while least_at < top:  # the first k from which held stops falling
        middle = (least_at + top) // 2
        least_at, top = (middle + 1, top) if held(middle + 1) < held(middle) else (least_at, middle)
    if held(least_at) > budget:
        return least_at
    low = least_at
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if held(middle) <= budget else (low, middle - 1)
    return low


def plan_shards(
    layout: StreamLayout, unit: int, world_size: int, *, batch_size: int | None, ready: int, split_budget: int
) -> list[tuple[int, int]]:
    """Storage-aligned shards along the axis, a function of the data and the shared arguments only.

    Whole multiples of ``unit`` items, at most SHARD_BYTES, small enough that
    everything the stream holds fits ``split_budget`` (a fifth left free) with
    SPLIT_THREADS reading, and at least two per rank where the storage grid allows.

    >>> layout = StreamLayout(1000, 8, shuffle=False, shuffle_blocks=0, threads=2)
    >>> plan_shards(layout, 100, 1, batch_size=10, ready=2, split_budget=2**20)[:2]
    [(0, 500), (500, 1000)]
    """
    spread = max(1, math.ceil(layout.length / (2 * world_size)))

    def held(units: int) -> int:
        rows = units * unit
        batch = (rows if batch_size is None else min(int(batch_size), layout.length)) * layout.item_bytes
        return sum(layout.terms(rows * layout.item_bytes, batch, ready, 0, threads=SPLIT_THREADS).values())

    high = min(SHARD_BYTES // max(1, layout.item_bytes * unit), math.ceil(spread / unit))
    rows = largest_fitting(high, held, plannable_bytes(split_budget)) * unit
    return [(start, min(start + rows, layout.length)) for start in range(0, layout.length, rows)]


def plan_reads(
    layout: StreamLayout, shard: int, unit: int, *, batch_bytes: int, ready: int, memory_budget: int, name: str
) -> tuple[int, int]:
    """Items per read and the reads that may be added ahead, as ``memory_budget`` allows on this machine.

    In order, a shard of ``shard`` items is read in parts of whole ``unit``
    items when a whole one does not fit; a shuffle window is made of whole
    shards (``unit == shard``), so a window that does not fit is refused.

    Raises
    ------
    MemoryBudgetError
        Naming the stream (``name``), what it would hold term by term, and what to change.
    """
    budget = plannable_bytes(memory_budget)

    def held(units: int) -> int:
        return sum(layout.terms(units * unit * layout.item_bytes, batch_bytes, ready, 0).values())

    rows = min(shard, largest_fitting(shard // unit, held, budget) * unit)
    least = layout.terms(rows * layout.item_bytes, batch_bytes, ready, 0)
    if sum(least.values()) > budget:
        shown = ", ".join(f"{term} {format_size(n)}" for term, n in least.items() if n)
        raise MemoryBudgetError(
            said(
                f"stream of {name}: one {'shard' if layout.shuffle else 'storage-aligned read'} is "
                f"{format_size(rows * layout.item_bytes)} ({rows} item(s)), and the stream holds {shown} = "
                f"{format_size(sum(least.values()))}, over the {format_size(budget)} it may use of its memory "
                f"budget of {format_size(memory_budget)} (a fifth stays free); raise ",
                named("memory_budget"),
                ", or lower shuffle_blocks, prefetch or batch_size",
            )
        )
    extra = 0
    while (
        extra < MAX_EXTRA_READS
        and sum(layout.terms(rows * layout.item_bytes, batch_bytes, ready, extra + 1).values()) <= budget
    ):
        extra += 1
    return rows, extra


def auto_prefetch(layout: StreamLayout, read_rows: int, extra_reads: int, batch_bytes: int, memory_budget: int) -> int:
    """As many batches as the budget holds beside the reads, at least two and at most 64."""
    held = layout.terms(read_rows * layout.item_bytes, batch_bytes, 0, extra_reads)
    left = plannable_bytes(memory_budget) - sum(held.values())
    return max(2, min(64, left // max(batch_bytes, 1)))


def order_bytes(items: int) -> int:
    """Bytes of a random order of ``items`` positions (4-byte positions below 2**31 items).

    >>> order_bytes(1000), order_bytes(2**31)
    (4000, 17179869184)
    """
    return items * (4 if items < 2**31 else 8)


def window_order(rng: np.random.Generator, items: int) -> np.ndarray:
    """A random order of ``items`` positions: ``rng.permutation(items)``'s, in half its memory below 2**31 items.

    ``Generator.permutation(n)`` shuffles ``arange(n)``; shuffling a narrower
    ``arange`` draws the same numbers, so the order is the same.

    >>> a = window_order(np.random.default_rng(0), 10)
    >>> a.dtype, a.tolist() == np.random.default_rng(0).permutation(10).tolist()
    (dtype('int32'), True)
    """
    order = np.arange(items, dtype=np.int32 if items < 2**31 else np.int64)
    rng.shuffle(order)
    return order


def elastic_steps(total: int, start: int, world_size: int, rank: int, shares: str) -> int:
    """Global batches rank ``rank`` takes from global batch ``start`` on, when rank r takes ``start + r + k * world_size``.

    ``"pad"`` gives every rank as many as the first (the last ones repeat the
    epoch's first batches), ``"drop"`` as many as the last, ``"uneven"`` each
    its own.

    >>> [elastic_steps(10, 0, 4, r, "pad") for r in range(4)], [elastic_steps(10, 0, 4, r, "uneven") for r in range(4)]
    ([3, 3, 3, 3], [3, 3, 2, 2])
    >>> elastic_steps(10, 0, 4, 3, "drop"), elastic_steps(10, 8, 4, 0, "pad")
    (2, 1)
    """
    remaining = max(0, total - start)
    if shares == "uneven":
        return len(range(rank, remaining, world_size))
    return remaining // world_size if shares == "drop" else -(-remaining // world_size)


def elastic_batches(
    total: int, start: int, world_size: int, rank: int, shares: str, worker: int, workers: int
) -> np.ndarray:
    """The global batches a consumer takes, in order, with a global order independent of ranks and workers.

    The epoch's global sequence is cut into ``total`` global batches. From
    global batch ``start`` on (0, or where a resumed job left off), rank ``r``
    of ``world_size`` takes global batches ``start + r``, ``start + r +
    world_size``...: step ``k`` of the job is global batches ``start + k *
    world_size`` to ``start + (k + 1) * world_size - 1``, whatever the world
    size, so a job resumed on another one continues the same sequence. A
    rank's batches go to its loader workers in turn (worker ``w`` of ``workers``
    takes steps ``w``, ``w + workers``...), as a DataLoader takes them back, so
    the loop sees the rank's batches in order. Past ``total`` (``"pad"``) the
    epoch's first global batches are repeated.

    >>> elastic_batches(10, 0, 2, 1, "pad", 0, 1).tolist()
    [1, 3, 5, 7, 9]
    >>> elastic_batches(10, 0, 4, 3, "pad", 1, 2).tolist(), elastic_batches(10, 4, 4, 0, "pad", 0, 1).tolist()
    ([7], [4, 8])
    """
    steps = np.arange(worker, elastic_steps(total, start, world_size, rank, shares), workers, dtype=np.int64)
    return (start + rank + steps * world_size) % max(total, 1)


def elastic_shares(shares: str, drop_last: bool) -> str:
    """The shares an elastic stream's epoch is cut with: with ``drop_last``, ``"pad"``'s last pieces would be
    partial batches, so they are dropped as ``"drop"`` drops them.

    >>> elastic_shares("pad", True), elastic_shares("pad", False), elastic_shares("uneven", True)
    ('drop', 'pad', 'uneven')
    """
    return "drop" if shares == "pad" and drop_last else shares


def elastic_rows(
    length: int,
    batch_size: int,
    drop_last: bool,
    start: int,
    world_size: int,
    rank: int,
    shares: str,
    worker: int,
    workers: int,
) -> np.ndarray:
    """The ``(low, high)`` positions in the epoch's sequence of each batch a consumer of an elastic stream
    takes, in order; ``high`` past ``length`` wraps to the sequence's start (``low`` is always below it).

    The consumer's batches are global batches (:func:`elastic_batches`),
    ``batch_size`` items each, except with ``"pad"`` the last step's: the
    items left after the last step of whole global batches are cut into one
    piece per rank, ``ceil(left / world_size)`` items each, the last piece
    wrapping to the epoch's first items. So every rank takes the same number
    of steps, at most ``ceil(items / world_size)`` items (from ``start``),
    and at most ``world_size - 1`` items are repeated, where whole global
    batches would repeat up to ``world_size - 1`` batches.

    >>> elastic_rows(25, 4, False, 0, 2, 0, "pad", 0, 1).tolist()  # 25 items: 13 each, item 0 twice
    [[0, 4], [8, 12], [16, 20], [24, 25]]
    >>> elastic_rows(25, 4, False, 0, 2, 1, "pad", 0, 1).tolist()
    [[4, 8], [12, 16], [20, 24], [0, 1]]
    >>> elastic_rows(25, 4, False, 0, 2, 0, "uneven", 1, 2).tolist()  # worker 1 of 2 takes steps 1 and 3
    [[8, 12], [24, 25]]
    """
    shares = elastic_shares(shares, drop_last)
    total = batch_count(length, batch_size, drop_last)
    low = elastic_batches(total, start, world_size, rank, shares, worker, workers) * batch_size
    bounds = np.stack([low, np.minimum(low + batch_size, length)], axis=1)
    if shares == "pad":
        left = max(0, length - start * batch_size)
        whole = left // (world_size * batch_size)
        tail = left - whole * world_size * batch_size
        # The pieces are the last step, step `whole`: this worker's last batch, where the worker takes it.
        if tail and whole % workers == worker:
            piece = -(-tail // world_size)
            # Fewer items than ranks wrap more than once: a piece is never longer than the sequence.
            first = ((start + whole * world_size) * batch_size + rank * piece) % length
            bounds[-1] = (first, first + piece)
    return bounds


def shards_digest(bounds: list[tuple[int, int]]) -> str:
    """A short stable name of a list of shards, to tell in a saved state that the split is the same.

    >>> shards_digest([(0, 5), (5, 10)]) == shards_digest([(0, 5), (5, 10)]) != shards_digest([(0, 10)])
    True
    """
    return hashlib.sha256(repr([(int(a), int(b)) for a, b in bounds]).encode()).hexdigest()[:16]


def rank_run(length: int, world_size: int, rank: int, shares: str) -> tuple[int, int]:
    """Positions in an epoch's sequence of ``length`` items that rank ``rank`` takes (see ``shares``).

    >>> rank_run(10, 3, 2, "pad"), rank_run(10, 3, 2, "drop"), rank_run(10, 3, 2, "uneven")
    ((8, 12), (6, 9), (6, 10))
    """
    if shares == "uneven":
        return rank * length // world_size, (rank + 1) * length // world_size
    each = length // world_size if shares == "drop" else -(-length // world_size)
    return rank * each, (rank + 1) * each


def batch_count(items: int, batch_size: int, drop_last: bool) -> int:
    """Batches ``items`` make: whole ones only with ``drop_last``."""
    return items // batch_size if drop_last else -(-items // batch_size)


def worker_share(run: tuple[int, int], batch_size: int, drop_last: bool, worker: int, workers: int) -> tuple[int, int]:
    """The positions of a rank's ``run`` that loader worker ``worker`` of ``workers`` takes: whole batches.

    >>> worker_share((0, 100), 10, False, 1, 3)
    (30, 60)
    """
    low, high = run
    items = high - low
    batches = batch_count(items, batch_size, drop_last)
    first, last = worker * batches // workers, (worker + 1) * batches // workers
    return low + first * batch_size, low + min(last * batch_size, items)


def runs(sequence: list[tuple[int, int]], low: int, high: int, length: int) -> list[tuple[int, int]]:
    """Positions ``low`` to ``high`` of ``sequence`` laid end to end (wrapping past ``length``), as runs of items.

    >>> runs([(4, 8), (0, 4), (8, 10)], 2, 7, 10)
    [(6, 8), (0, 3)]
    >>> runs([(0, 5), (5, 10)], 3, 13, 10)
    [(3, 5), (5, 10), (0, 3)]
    """
    found: list[tuple[int, int]] = []
    if not length:
        return found
    position = low
    while position < high:
        offset = position % length
        at = 0
        for start, stop in sequence:
            size = stop - start
            if offset < at + size:
                take = min(at + size - offset, high - position)
                begin = start + offset - at
                found.append((begin, begin + take))
                position += take
                offset += take
                if position >= high:
                    break
            at += size
    return found


__all__ = [
    "MAX_EXTRA_READS",
    "SHARD_BYTES",
    "SHARES",
    "SPLIT_BUDGET",
    "SPLIT_THREADS",
    "StreamLayout",
    "auto_prefetch",
    "batch_count",
    "elastic_batches",
    "elastic_rows",
    "elastic_shares",
    "elastic_steps",
    "order_bytes",
    "plan_reads",
    "plan_shards",
    "rank_run",
    "runs",
    "shards_digest",
    "window_order",
    "worker_share",
]
