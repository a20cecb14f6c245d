"""Spans: tasks that stream many chunks each, for arrays whose chunks outnumber what a graph may hold.

A chunk plan sizes each chunk to what a task may hold at once. An array so
large that even chunks at that size make more blocks than a computation's
graph may hold (a pebibyte on one machine) is not refused: each task covers a
*span* of consecutive chunks and streams them one after another through a
buffer of one chunk (:mod:`daskstream.compute.streaming.spans`), handing on a small
partial. The chunk stays the buffer, the span becomes the task.

A span groups whole chunks, slowest axis first: along the first axis up to
all of its chunks, then the next, so a span is a run of whole rows of chunks
wherever it can be, and its chunks are read in storage order.

Everything here is a pure function of block counts and byte sizes.
"""

from __future__ import annotations

import math


def plan_span(
    block_counts: tuple[int, ...], chunk_bytes: int, *, max_blocks: int, floor_bytes: int, threads: int = 1
) -> tuple[int, ...] | None:
    """Chunks a task streams along each axis so that the spans number at most ``max_blocks`` and each holds
    ``floor_bytes`` where the array allows; ``None`` where the chunks already fit ``max_blocks``.

    Spans are read in waves over the ``threads`` of the place: where they
    number more than the threads, they grow a little so that the last wave is
    as full as the others can be (a wave one thread in ten uses takes as long
    as a full one).

    >>> plan_span((1_000_000, 1, 1), 2**20, max_blocks=10_000, floor_bytes=0)
    (100, 1, 1)
    >>> plan_span((10, 7), 2**20, max_blocks=18, floor_bytes=0)  # a span of 4 x 1 would leave 21
    (5, 1)
    >>> plan_span((100, 100), 2**20, max_blocks=20_000, floor_bytes=0) is None
    True
    """
    blocks = math.prod(block_counts)
    factor = span_factor(blocks, chunk_bytes, max_blocks=max_blocks, floor_bytes=floor_bytes)
    if factor <= 1:
        return None
    span = span_shape(block_counts, factor)
    # Spans at the grid's edges hold fewer chunks: grow until the spans, edges included, fit.
    while span_blocks(block_counts, span) > max_blocks and span != tuple(block_counts):
        factor = -(-factor * span_blocks(block_counts, span) // max(1, max_blocks))
        span = span_shape(block_counts, factor)
    # Of the spans as planned and those aiming at fewer whole waves, the fullest waves to a percent, then the
    # most spans (a lost task re-reads less).
    waves = span_blocks(block_counts, span) // threads
    candidates = [span] + [
        fewer
        for w in range(waves, max(0, waves - 8), -1)
        if span_blocks(block_counts, fewer := span_shape(block_counts, -(-blocks // (w * threads)))) <= max_blocks
    ]

    def fullest(candidate: tuple[int, ...]) -> tuple[float, int]:
        spans = span_blocks(block_counts, candidate)
        return round(_wave_use(spans, threads), 2), spans

    return max(candidates, key=fullest)


def _wave_use(spans: int, threads: int) -> float:
    """The share of the threads' time spans keep busy, read in waves of ``threads``.

    >>> _wave_use(16_384, 8_000), _wave_use(16_000, 8_000)
    (0.6826666666666666, 1.0)
    """
    return spans / (-(-spans // threads) * threads)


def span_factor(blocks: int, chunk_bytes: int, *, max_blocks: int, floor_bytes: int) -> int:
    """How many chunks a span holds: enough that the spans fit ``max_blocks`` and each holds ``floor_bytes``.

    ``floor_bytes`` is the least a task should cover for the scheduler and the
    first task's start (the plan's floors); 1 where the chunks already fit.

    >>> span_factor(1_000_000, 2**20, max_blocks=10_000, floor_bytes=0)
    100
    >>> span_factor(1_000_000, 2**20, max_blocks=10_000, floor_bytes=2**30)
    1024
    >>> span_factor(100, 2**20, max_blocks=10_000, floor_bytes=2**30)
    1
    """
    if blocks <= max_blocks:
        return 1
    by_count = -(-blocks // max(1, max_blocks))
    by_floor = -(-floor_bytes // max(1, chunk_bytes))
    return max(by_count, by_floor, 1)


def span_shape(block_counts: tuple[int, ...], factor: int) -> tuple[int, ...]:
    """Chunks a span takes along each axis, slowest axis first, holding at least ``factor`` chunks.

    >>> span_shape((1000, 1, 1), 37)
    (37, 1, 1)
    >>> span_shape((10, 300), 37)
    (10, 4)
    >>> span_shape((4, 5), 1000)
    (4, 5)
    """
    shape = []
    left = max(1, factor)
    for count in block_counts:
        take = min(count, left) if left > 1 else 1
        shape.append(max(1, take))
        left = -(-left // max(1, take))
    return tuple(shape)


def span_chunks(dask_chunks: tuple[tuple[int, ...], ...], span: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Dask chunks of spans: ``span[axis]`` consecutive chunk lengths summed along each axis.

    >>> span_chunks(((2, 2, 2, 1), (3, 3)), (2, 1))
    ((4, 3), (3, 3))
    """
    return tuple(
        tuple(sum(lengths[start : start + step]) for start in range(0, len(lengths), step))
        for lengths, step in zip(dask_chunks, span, strict=True)
    )


def span_blocks(block_counts: tuple[int, ...], span: tuple[int, ...]) -> int:
    """Spans over a grid of ``block_counts`` chunks.

    >>> span_blocks((10, 300), (10, 4))
    75
    """
    return math.prod(-(-count // step) for count, step in zip(block_counts, span, strict=True))
