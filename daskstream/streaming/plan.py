"""A stream's plan: the shards and each rank's share (the same on every rank), the epoch's order, and the reads.

:class:`StreamPlan` binds the pure planning of :mod:`daskstream.planning.streams`
to one stream's arrays and arguments: the storage-aligned shards, the run of
the epoch's sequence each rank and loader worker takes, the shuffled orders
drawn from ``(seed, epoch)``, and the reads, prefetch and memory this machine
allows. The other parts of :class:`~daskstream.streaming.Stream` (reading
threads, checkpoints, its views) build on it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from daskstream.errors import DaskstreamWarning
from daskstream.planning.settings import Resources
from daskstream.planning.streams import (
    StreamLayout,
    auto_prefetch,
    batch_count,
    elastic_rows,
    elastic_shares,
    elastic_steps,
    plan_reads,
    plan_shards,
    rank_run,
    runs,
    window_order,
    worker_share,
)
from daskstream.streaming.elastic import _ElasticEpoch
from daskstream.streaming.inputs import _Input


class StreamPlan:
    """How a :class:`~daskstream.streaming.Stream` is split, ordered and read.

    The base of the stream's other parts (its readers, checkpoints and views).
    The attributes below are set by ``Stream.__init__``, whose docstring says
    what each holds; they are declared here, once, for every part that reads them.
    """

    inputs: list[_Input]
    axis: int
    length: int
    resources: Resources
    shuffle: bool
    drop_last: bool
    seed: int | None
    rank: int
    world_size: int
    shuffle_blocks: int
    shares: str
    worker: int
    num_workers: int
    elastic: bool
    read_next_epoch: bool
    loop_ends_epoch: bool
    threads: int
    order_entropy: int | None
    block_bounds: list[tuple[int, int]]
    batch_size: int
    share: tuple[int, int]
    read_rows: int
    extra_reads: int
    prefetch: int
    epoch: int
    # Where the batches handed out end (epoch, batches, start, whether the epoch's loop has ended), and a loaded
    # state to resume from: see Stream.__init__.
    _position: list[int] | None
    _resume: tuple[int, int, int] | None

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
            shares = elastic_shares(self.shares, self.drop_last)
            return elastic_steps(self.global_batches, 0, self.world_size, self.rank, shares)
        low, high = self._rank_run()
        return self._batches_of(high - low)

    @property
    def global_batches(self) -> int:
        """Batches the epoch's whole sequence makes (an elastic stream's global batches)."""
        return self._batches_of(self.length)

    def _elastic_batches(self, start: int) -> np.ndarray:
        """The ``(low, high)`` positions of the batches this consumer takes from global batch ``start`` on
        (see :func:`elastic_rows`)."""
        return elastic_rows(
            self.length,
            self.batch_size,
            self.drop_last,
            start,
            self.world_size,
            self.rank,
            self.shares,
            self.worker,
            self.num_workers,
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
        if (
            self._resume is not None
            and self._resume[0] != epoch
            and 0 < self._resume[1] < self._batches_left(self._resume[2])
        ):
            warnings.warn(
                f"the state loaded into this stream resumes epoch {self._resume[0]} at batch {self._resume[1]}; "
                f"set_epoch({epoch}) starts epoch {epoch} from its first batch instead",
                DaskstreamWarning,
                stacklevel=2,
            )
            self._resume = None
        self.epoch = epoch
        self._position = None

    def _batches_left(self, start: int) -> int:
        """Batches this consumer yields in an epoch whose shares were cut from global batch ``start``."""
        return len(self._elastic_batches(start)) if self.elastic else len(self)

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
        return _ElasticEpoch(windows, self._elastic_batches(start)[first:], self.length, self.shuffle)

    def __len__(self) -> int:
        if self.elastic:
            return len(self._elastic_batches(0))
        return self._batches_of(self.share[1] - self.share[0])

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

    def _window_rng(self, epoch: int, window: int) -> np.random.Generator:
        """An elastic stream's order of window ``window``'s items: the same on every rank and worker."""
        return np.random.default_rng([self.seed if self.seed is not None else 0, epoch, window])
