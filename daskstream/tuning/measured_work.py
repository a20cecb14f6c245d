"""The work a tuning measures: a reduction, ``describe`` or a kernel, run on sampled blocks of a source.

The same labels name the work when the tuner measures it and when a session
observes a real computation (:mod:`daskstream.tuning.session_feedback`), so both land
on the same cache entry: a reduction is labelled by the dask layer that
consumes the read blocks (``"sum"``, ``"moments_chunk"``...), a kernel by its
function's name, ``describe`` as such.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from dask.utils import funcname, key_split

from daskstream.advice import keyword, said
from daskstream.compute.describe import chunk_statistics
from daskstream.compute.reductions import OPERATIONS, reduce
from daskstream.errors import InvalidArgumentError, UnknownOperationError
from daskstream.planning.grid import block_slices, normalize_axes
from daskstream.sources import Source

# Layers that only move data between the read and the work (halos, re-chunking, casts).
_PLUMBING = {"getitem", "concatenate", "overlap", "rechunk-merge", "rechunk-split", "astype", "asarray"}

Box = tuple[slice, ...]


def consumer_label(graph: Any, read_name: str) -> tuple[str, str] | None:
    """The first layer after ``read_name`` that does work (not halos or re-chunking): ``(name, label)``."""
    dependents = getattr(graph, "dependents", {})
    frontier = sorted(dependents.get(read_name, ()))
    seen = set(frontier)
    while frontier:
        name = frontier.pop(0)
        label = key_split(name)
        if label not in _PLUMBING:
            return name, label
        for nxt in sorted(dependents.get(name, ())):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return None


@dataclass(frozen=True)
class Work:
    """What to run on each sampled block, and its label.

    Attributes
    ----------
    label
        Names the work in the tuning cache (for a reduction, the dask layer
        that does it: ``mean_chunk``).
    title
        Names it for people: the operation asked for (``"mean"``,
        ``"describe"``) or the kernel's name.
    build
        For a reduction: makes the lazy result from a dask array; the sampled
        tasks are then the real graph's first work on each block (read and
        chunk step fused, as dask runs them).
    block_fn
        For ``describe`` and kernels: called on each block read (with its halo).
    halo
        Cells borrowed from neighbours along each axis (kernels).
    """

    label: str
    title: str = ""
    build: Callable[[da.Array], Any] | None = None
    block_fn: Callable[[np.ndarray], Any] | None = None
    halo: tuple[int, ...] = ()

    def sample_graph(
        self, source: Source, x: da.Array, blocks: list[tuple[int, ...]], built: dict | None = None
    ) -> tuple[dict, list]:
        """A graph computing this work on ``blocks`` (block indices of ``x``) and the keys to ask for.

        ``built`` caches the lazy result for ``x`` between calls (one graph per candidate).
        """
        if self.build is not None:
            if built is None or built.get("name") != x.name:
                result = self.build(x)
                graph = result.__dask_graph__()
                found = consumer_label(graph, x.name)
                # The consumer's tasks are the work on each read block only when it keeps the read grid.
                if found is None or len(graph.layers[found[0]].get_output_keys()) != math.prod(x.numblocks):
                    found = (x.name, "read")
                built = {} if built is None else built
                built.update(name=x.name, result=result, graph=graph, layer=found[0])
            keys = [(built["layer"], *b) for b in blocks]
            return built["result"].__dask_optimize__(built["graph"], keys), keys
        graph, keys = {}, []
        for index, block in enumerate(blocks):
            box = self._haloed(block_slices(x.chunks, block), source.shape)
            key = (f"tune-{self.label}", index)
            graph[key] = (_run_block, source, box, self.block_fn)
            keys.append(key)
        return graph, keys

    def run_once(self, source: Source, box: Box) -> None:
        """Read ``box`` (with the halo) and run the work on it in this thread, as one task would."""
        if self.build is None:
            if self.block_fn is None:
                # A Work made only to name a cache entry (feedback's) has nothing to run.
                raise TypeError(f"work {self.label!r} has neither build nor block_fn: nothing to run")
            _run_block(source, self._haloed(box, source.shape), self.block_fn)
            return
        block = source.read(box)
        self.build(da.from_array(block, chunks=block.shape)).compute(scheduler="sync")

    def _haloed(self, box: Box, shape: tuple[int, ...]) -> Box:
        halo = self.halo or (0,) * len(box)
        return tuple(slice(max(0, s.start - h), min(n, s.stop + h)) for s, h, n in zip(box, halo, shape))


def _run_block(source: Source, box: Box, fn: Callable[[np.ndarray], Any]) -> tuple[int, ...]:
    # Only the output's shape travels back: the sample measures the work, not the transfer.
    out = fn(source.read(box))
    return getattr(out, "shape", ())


def work_for(
    op: str | None,
    kernel: Callable[..., Any] | None,
    *,
    ndim: int,
    dtype: np.dtype,
    axis: int | tuple[int, ...] | None = None,
    depth: int | tuple[int, ...] = 0,
) -> Work:
    """The :class:`Work` for ``op`` (a reduction name or ``"describe"``) or for ``kernel``.

    Raises
    ------
    UnknownOperationError
        For an ``op`` that is neither a reduction nor ``"describe"``.
    InvalidArgumentError
        When ``kernel`` is not callable.
    """

    if kernel is not None:
        if not callable(kernel):
            raise InvalidArgumentError(f"kernel={kernel!r} is not a function; give the map-blocks function to tune for")
        halo = (depth,) * ndim if isinstance(depth, int) else tuple(depth)
        if len(halo) != ndim or any(not isinstance(h, int) or h < 0 for h in halo):
            raise InvalidArgumentError(f"depth={depth!r}: give one non-negative int, or one per axis ({ndim})")
        return Work(label=funcname(kernel), title=funcname(kernel), block_fn=kernel, halo=halo)
    if op == "describe":
        axes = tuple(builtins.range(ndim)) if axis is None else normalize_axes(axis, ndim)
        return Work(label="describe", title="describe", block_fn=_Statistics(axes, None))
    if op not in OPERATIONS:
        choices = ", ".join(sorted({*OPERATIONS, "describe"}))
        raise UnknownOperationError(
            said("cannot tune for ", keyword("op", op), f"; choose one of: {choices}, or give kernel=")
        )
    build = _Reduction(op, axis)
    probe = da.zeros((2,) * ndim, dtype=dtype, chunks=1)
    found = consumer_label(build(probe).__dask_graph__(), probe.name)
    return Work(label=found[1] if found is not None else op, title=op, build=build)


@dataclass(frozen=True)
class _Reduction:
    op: str
    axis: int | tuple[int, ...] | None

    def __call__(self, x: da.Array) -> Any:

        result = reduce(x, self.op, self.axis, q=0.5) if self.op == "quantile" else reduce(x, self.op, self.axis)
        return result[0] if isinstance(result, tuple) else result


@dataclass(frozen=True)
class _Statistics:
    axes: tuple[int, ...]
    edges: Any

    def __call__(self, block: np.ndarray) -> Any:

        return chunk_statistics(block, self.axes, self.edges)


def spread_blocks(numblocks: tuple[int, ...], count: int, offset: float = 0.5) -> list[tuple[int, ...]]:
    """``count`` block indices spread evenly over the grid (in C order), never only the first rows.

    >>> spread_blocks((8, 2), 4)
    [(1, 0), (3, 0), (5, 0), (7, 0)]
    """
    total = 1
    for n in numblocks:
        total *= n
    count = min(count, total)
    flat = sorted({min(total - 1, int((i + offset) * total / count)) for i in builtins.range(count)})
    return [tuple(int(v) for v in np.unravel_index(f, numblocks)) for f in flat]


__all__ = ["Work", "consumer_label", "spread_blocks", "work_for"]
