"""A stream's epochs: reads run ahead in a pool of reading threads, batches handed over through a queue.

Each iteration is one epoch. A reader thread forms the batches (in order, or
from shuffle windows) and puts them on a queue of ``prefetch`` batches; the
reads themselves run ahead in a pool of threads that the stream keeps between
epochs, so that the next epoch's first reads begin during the last batches of
this one. Leaving an epoch early stops the reader and frees what it held.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any, Self

import numpy as np

from daskstream.allocator import cap_malloc_arenas
from daskstream.planning.streams import window_order
from daskstream.streaming.batches import _shuffled, _take
from daskstream.streaming.plan import StreamPlan

_END = object()


class _Failure:
    """An exception raised in the reader thread, carried to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class StreamReading(StreamPlan):
    """Iterating a :class:`~daskstream.streaming.Stream`: its reader thread, reading threads and batches."""

    # Set by Stream.__init__ (see there), like StreamPlan's; only iterating reads these.
    zipped: bool
    allocate: Any
    in_caller_thread: bool
    _pool: concurrent.futures.ThreadPoolExecutor | None
    _primed: tuple[int, list[tuple[int, int]], deque] | None

    def __iter__(self) -> Iterator[Any]:
        cap_malloc_arenas()  # the reader threads share freed memory (daskstream.compute.malloc-arenas)
        epoch, start, first = self.epoch, 0, 0
        resume = self._resume
        if resume is not None and resume[0] == epoch:
            _, first, start = resume
        # Where the batches handed out end is this epoch's from now on (a state saved before the first batch
        # is this epoch's start); but the epoch and a loaded state are taken with the first batch asked for,
        # so an iterator made and dropped unused (torchdata's loaders make one to restore a state, then
        # another) leaves the next one the same epoch.
        position = self._position = [epoch, first, start, 0]
        return self._claimed(position)

    def _claimed(self, position: list[int]) -> Iterator[Any]:
        epoch, first, start, _ = position
        self._resume = None
        self.epoch = epoch + 1
        if self.in_caller_thread:
            batches = self._in_caller_thread(epoch, first, start)
        else:
            batches = self._iterate(epoch, first, start)
        yield from _counted(batches, position)

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

    def _elastic_batches_of(
        self, epoch: int, start: int, first: int, stop: threading.Event, waits: _Waits
    ) -> Iterator[Any]:
        """An elastic stream's batches: global batches, each gathered from the window(s) it lies in."""
        plan = self._elastic_epoch(epoch, start, first)
        reads = self._read_ahead(epoch, plan.reads, stop, waits)
        if not self.shuffle:
            for parts in plan.parts:
                read = [next(reads) for _ in parts]
                # A batch past the end of the epoch's sequence ("pad") wraps to its start: two reads.
                yield self._emit(read[0] if len(read) == 1 else _joined(read, self.axis))
            return
        held: dict[int, tuple[list[list[np.ndarray]], np.ndarray]] = {}
        arrived = 0
        for entries in plan.entries:
            while arrived <= entries[-1][1]:
                window = plan.needed[arrived]
                shards = [next(reads) for _ in plan.windows[window]]
                held[arrived] = (shards, window_order(self._window_rng(epoch, window), int(plan.sizes[window])))
                arrived += 1
            for entry in [entry for entry in held if entry < entries[0][0]]:
                del held[entry]  # no later batch of this consumer takes from it
            yield self._emit(plan.gather(entries, held, self.axis, self.allocate))
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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


def _counted(batches: Iterator[Any], position: list[int]) -> Iterator[Any]:
    """``batches``, counting in ``position[1]`` each one handed out (before the consumer has it, so that a
    state saved while it is used resumes after it), and setting ``position[3]`` once the consumer has
    asked past the last (the epoch is over for it: a state saved then resumes at the next epoch)."""
    try:
        for batch in batches:
            position[1] += 1
            yield batch
        position[3] = 1
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _joined(reads: list[list[np.ndarray]], axis: int) -> list[np.ndarray]:
    """Reads of the same inputs, one after the other along ``axis``."""
    return [np.concatenate(parts, axis=axis) for parts in zip(*reads, strict=True)]


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
