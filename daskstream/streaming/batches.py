"""Batches cut from reads: taken off the reads in order, or gathered from a shuffle window in random order.

Pure functions over numpy arrays: no threads and no stream state, so the
reading threads (:mod:`daskstream.streaming.readers`) hand them what they read.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from daskstream.planning.streams import window_order


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
