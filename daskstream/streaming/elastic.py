"""An elastic stream's epoch for one consumer: global batches, the shuffle windows they lie in, and the reads.

An elastic stream (``stream(..., elastic=True)``) cuts one global order of
batches whatever the world size; :class:`_ElasticEpoch` says which windows a
consumer's global batches need and gathers each batch from the windows held.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np


def wrapped_runs(low: int, high: int, length: int) -> list[tuple[int, int]]:
    """Positions ``low`` to ``high`` of a sequence of ``length``: one run, or two where ``high`` passes the end
    and wraps to the start ("pad"'s last piece; ``low`` is below ``length``).

    >>> wrapped_runs(2, 5, 10), wrapped_runs(8, 12, 10)
    ([(2, 5)], [(8, 10), (0, 2)])
    """
    if high <= length:
        return [(low, high)]
    return [(low, length), (0, high - length)]


class _ElasticEpoch:
    """An elastic stream's epoch for one consumer: its batches, the windows they lie in, and its reads.

    A batch is a run of the epoch's sequence, ``(low, high)`` (global batch
    ``g`` is ``g * batch_size`` to ``(g + 1) * batch_size``; ``"pad"``'s last
    pieces are shorter, the last one wrapping past the end to the sequence's
    start): the windows (shards in the epoch's order, ``shuffle_blocks`` at a
    time) laid end to end, each window's items in its own random order. In
    order there is one window, the array, and a batch is read by itself.

    Attributes
    ----------
    bounds
        The consumer's batches, in order, as ``(low, high)`` positions.
    needed
        The windows the consumer reads, in order (one again if a later part
        of a batch, past the wrap, needs it again).
    entries
        For each batch, its parts: the first and last place in ``needed`` it
        takes items from, and the positions of the sequence they hold.
    reads
        The shards of ``needed``, in order (in order: the batches' parts).
    """

    def __init__(
        self,
        windows: list[list[tuple[int, int]]],
        bounds: np.ndarray,
        length: int,
        shuffle: bool,
    ) -> None:
        self.windows, self.bounds, self.length = windows, bounds, length
        self.needed: list[int] = []
        self.entries: list[list[tuple[int, int, int, int]]] = []
        if not shuffle:
            self.parts = [wrapped_runs(int(low), int(high), length) for low, high in bounds]
            self.reads = [part for parts in self.parts for part in parts]
            return
        self.sizes = np.array([sum(high - low for low, high in window) for window in windows], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        for low, high in bounds:
            entries = []
            for part_low, part_high in wrapped_runs(int(low), int(high), length):
                first_window = int(np.searchsorted(self.offsets, part_low, side="right")) - 1
                last_window = int(np.searchsorted(self.offsets, part_high - 1, side="right")) - 1
                # A window the last batch took from is still held: it is not read again.
                if not self.needed or self.needed[-1] != first_window:
                    self.needed.append(first_window)
                first_entry = len(self.needed) - 1
                self.needed.extend(range(first_window + 1, last_window + 1))
                entries.append((first_entry, len(self.needed) - 1, part_low, part_high))
            self.entries.append(entries)
        self.reads = [shard for window in self.needed for shard in windows[window]]

    def gather(
        self,
        entries: list[tuple[int, int, int, int]],
        held: dict[int, tuple[list[list[np.ndarray]], np.ndarray]],
        axis: int,
        allocate: Any,
    ) -> list[np.ndarray]:
        """A batch's items, one array per input, gathered from the held windows' reads.

        Within the part of the batch from each window, items come in the order
        they lie in the window's shards, so each shard's share is one gather.
        """
        first = held[entries[0][0]][0][0]
        size = sum(high - low for _, _, low, high in entries)
        lead = (slice(None),) * axis
        outs = [allocate((*p.shape[:axis], size, *p.shape[axis + 1 :]), p.dtype) for p in first]
        at = 0
        for first_entry, last_entry, low, high in entries:
            for entry in range(first_entry, last_entry + 1):
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
