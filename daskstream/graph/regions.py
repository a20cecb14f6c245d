"""Any region of an array computed inside one task: halos read straight from storage.

(Longer than most modules: the region protocol, its three kinds of readable
regions -- sources, kernels, element-wise expressions over them -- and the task
that computes a block from them are one design, read together.)

dask's ``map_overlap`` gives each block its halo by slicing its neighbours,
which keeps every neighbour in memory until all its slices are taken, and
makes several tasks per block. Here a block of a kernel over files is one
task: it reads its own region, halo included, from the sources (a
:class:`SourceRegions`), or computes it from another kernel over a wider
region (a :class:`KernelRegions`), then runs the kernel and trims the halo.
Chained stencils become one task per block reading the sum of their halos.

Beyond the array's edges the halo follows dask's boundary modes
(:mod:`daskstream.graph.halos`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import dask.array as da
import numpy as np
from dask.array.core import ArrayBlockIdDep
from dask.base import tokenize
from dask.blockwise import Blockwise, blockwise_token
from dask.utils import funcname, key_split

from daskstream.graph.halos import halo_widths, haloed
from daskstream.graph.layers import (
    REGIONS_ANNOTATION,
    SPAN_ANNOTATION,
    layer_array,
    read_layers,
    record_plan,
    whole_input,
)
from daskstream.graph.reads import SpanRead
from daskstream.planning.grid import block_slices
from daskstream.planning.settings import Resources
from daskstream.sources.base import Region, Source
from daskstream.sources.chunk_cache import keeping_decoded_chunks


class Regions:
    """An array whose every region can be computed on its own, in whichever process asks.

    Subclasses are small picklable descriptions (sources, kernels, depths), never data.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def read(self, box: Region) -> np.ndarray:
        """The array's values in ``box`` (unit-step slices within bounds), as a new array."""
        raise NotImplementedError

    @property
    def sources(self) -> tuple[Source, ...]:
        """The sources the regions are read from."""
        return ()

    @property
    def reach(self) -> tuple[int, ...]:
        """Cells read beyond a region, per axis (the halos of every kernel on the way)."""
        return (0,) * len(self.shape)

    @property
    def label(self) -> str:
        """What a person calls it."""
        return type(self).__name__

    @property
    def constants(self) -> tuple[str, ...]:
        """Names of the small arrays (aggregates) the regions are computed with, whole."""
        return ()

    def bind(self, values: dict[str, np.ndarray]) -> Regions:
        """These regions with the values of their constants (by name), as a task computes them."""
        return self

    def __getitem__(self, box: Region) -> np.ndarray:
        # What a span read asks of what it reads (daskstream.graph.reads.SpanRead): a region, as a source gives it.
        return self.read(box)

    @property
    def name(self) -> str:
        """What an error names: the sources, or the regions' label where they read none."""
        return ", ".join(source.name for source in self.sources) or self.label

    def __dask_tokenize__(self) -> Any:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class SourceRegions(Regions):
    """Regions read from a :class:`~daskstream.Source`."""

    source: Source

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.source.shape

    @property
    def dtype(self) -> np.dtype:  # type: ignore[override]
        return self.source.dtype

    def read(self, box: Region) -> np.ndarray:
        return self.source.read(box)

    @property
    def sources(self) -> tuple[Source, ...]:
        return (self.source,)

    @property
    def label(self) -> str:
        return f"read {self.source.name}"

    def __dask_tokenize__(self) -> Any:
        return ("daskstream-source-regions", self.source.token)


@dataclass(frozen=True, eq=False)
class ArrayRegions(Regions):
    """Regions of an array in memory (for examples and tests)."""

    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:  # type: ignore[override]
        return self.array.dtype

    def read(self, box: Region) -> np.ndarray:
        return self.array[box].copy()

    def __dask_tokenize__(self) -> Any:
        return ("daskstream-array-regions", tokenize(self.array))


@dataclass(frozen=True, eq=False)
class KernelRegions(Regions):
    """Regions of ``kernel`` applied to haloed regions of ``inputs``, trimmed back to the region.

    Attributes
    ----------
    kernel
        Called with one haloed block per input (and ``block_info=`` when it
        takes it, see :func:`block_info_for`); returns a block of the haloed shape.
    inputs
        What the kernel reads, all of one shape.
    depth
        Halo per axis.
    boundary
        dask's boundary mode, or the number a constant halo holds.
    dtype
        The kernel's output dtype.
    grid
        The chunks blocks are numbered on, for the kernel's ``block_info``.
    """

    kernel: Callable[..., np.ndarray]
    inputs: tuple[Regions, ...]
    depth: tuple[int, ...]
    boundary: Any
    dtype: np.dtype
    grid: tuple[tuple[int, ...], ...] = field(default=())

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.inputs[0].shape

    @property
    def sources(self) -> tuple[Source, ...]:
        found: dict[str, Source] = {}
        for regions in self.inputs:
            for source in regions.sources:
                found.setdefault(source.token, source)
        return tuple(found.values())

    @property
    def reach(self) -> tuple[int, ...]:
        inner = [regions.reach for regions in self.inputs]
        return tuple(d + max(r[a] for r in inner) for a, d in enumerate(self.depth))

    @property
    def constants(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for regions in self.inputs for name in regions.constants))

    def bind(self, values: dict[str, np.ndarray]) -> Regions:
        return replace(self, inputs=tuple(regions.bind(values) for regions in self.inputs))

    @property
    def label(self) -> str:

        return funcname(getattr(self.kernel, "fn", self.kernel))

    def read(self, box: Region) -> np.ndarray:

        # The storage chunks beyond this block's edges are the next blocks' first: decoded once.
        with keeping_decoded_chunks():
            blocks = [haloed(regions, box, self.depth, self.boundary) for regions in self.inputs]
        before, after = halo_widths(box, self.shape, self.depth, self.boundary)
        result = self.kernel(*blocks, block_info=block_info_for(box, blocks[0].shape, self.grid, before, self.dtype))
        trimmed = result[tuple(slice(b, n - a) for b, a, n in zip(before, after, result.shape))]
        # A view keeps the whole haloed output alive: copy when the halo is a large part of it.
        return trimmed.copy() if result.nbytes > 1.25 * trimmed.nbytes else trimmed

    def __dask_tokenize__(self) -> Any:
        return (
            "daskstream-kernel-regions",
            tokenize(self.kernel),
            self.inputs,
            self.depth,
            self.boundary,
            str(self.dtype),
        )


@dataclass(frozen=True, eq=False)
class ExpressionRegions(Regions):
    """Regions of one element-wise dask operation over other regions, small whole arrays and literals.

    Attributes
    ----------
    task
        The operation's dask task, taking ``operands`` as ``blockwise_token(i)``.
    operands
        Per operand: ``("regions", Regions, axes)``, ``("constant", name, axes)``
        (a small array known whole when the task runs) or ``("literal", value, None)``;
        ``axes`` are the output axes the operand's own axes run along.
    shape, dtype
        Of the result.
    values
        The constants' values once bound (empty in the graph).
    """

    task: Any
    operands: tuple[tuple[str, Any, tuple[int, ...] | None], ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    values: tuple[tuple[str, np.ndarray], ...] = ()

    @property
    def sources(self) -> tuple[Source, ...]:
        found: dict[str, Source] = {}
        for kind, held, _ in self.operands:
            if kind == "regions":
                for source in held.sources:
                    found.setdefault(source.token, source)
        return tuple(found.values())

    @property
    def reach(self) -> tuple[int, ...]:
        inner = [held.reach for kind, held, _ in self.operands if kind == "regions"]
        return tuple(max((r[a] for r in inner), default=0) for a in range(len(self.shape)))

    @property
    def constants(self) -> tuple[str, ...]:
        names: dict[str, None] = {}
        for kind, held, _ in self.operands:
            if kind == "regions":
                names.update(dict.fromkeys(held.constants))
            elif kind == "constant":
                names[held] = None
        return tuple(names)

    @property
    def label(self) -> str:

        return key_split(self.task.key)

    def bind(self, values: dict[str, np.ndarray]) -> Regions:
        operands = tuple(
            (kind, held.bind(values), axes) if kind == "regions" else (kind, held, axes)
            for kind, held, axes in self.operands
        )
        own = tuple((name, values[name]) for kind, name, _ in self.operands if kind == "constant")
        return replace(self, operands=operands, values=own)

    def read(self, box: Region) -> np.ndarray:

        known = dict(self.values)
        arguments = {}
        for i, (kind, held, axes) in enumerate(self.operands):
            if kind == "regions":
                assert axes is not None  # only a literal runs along no output axes
                value = held.read(tuple(box[a] for a in axes))
            elif kind == "constant":
                assert axes is not None
                whole = known[held]
                # A length-one axis broadcasts: it is taken whole, as dask passes it to every block.
                value = whole[tuple(slice(None) if n == 1 else box[a] for a, n in zip(axes, whole.shape))]
            else:
                value = held
            arguments[blockwise_token(i)] = value
        result = np.asarray(self.task(arguments))
        shape = tuple(s.stop - s.start for s in box)
        if result.shape != shape:
            result = np.broadcast_to(result, shape)
        return result if result.dtype == self.dtype else result.astype(self.dtype)

    def __dask_tokenize__(self) -> Any:
        parts = [(kind, held if kind != "literal" else tokenize(held), axes) for kind, held, axes in self.operands]
        return ("daskstream-expression-regions", tokenize(self.task), parts, self.shape, str(self.dtype))


def block_info_for(
    box: Region, haloed_shape: tuple[int, ...], grid: tuple[tuple[int, ...], ...], before: Sequence[int], dtype: Any
) -> dict:
    """dask's ``block_info`` for the haloed block a kernel gets: its place, with the halo, in the array."""
    location = (
        tuple(int(np.searchsorted(np.cumsum(c), s.start, side="right")) for c, s in zip(grid, box)) if grid else ()
    )
    array_location = [(s.start - b, s.start - b + n) for s, b, n in zip(box, before, haloed_shape)]
    shape = tuple(sum(c) for c in grid) if grid else ()
    entry = {
        "shape": shape,
        "num-chunks": tuple(len(c) for c in grid) if grid else (),
        "chunk-location": location,
        "array-location": array_location,
    }
    return {0: entry, None: {**entry, "chunk-shape": tuple(haloed_shape), "dtype": dtype}}


class RegionBlocks:
    """The function of a region array's tasks: ``(block_id, *constants) -> block``.

    A plain class, not a dataclass: dask would take a dataclass argument
    apart and rebuild it in the task, running the dask tasks it holds.
    """

    def __init__(self, regions: Regions, grid: tuple[tuple[int, ...], ...]) -> None:
        self.regions = regions
        self.grid = grid

    def __call__(self, block_id: tuple[int, ...], *values: np.ndarray) -> np.ndarray:
        box = block_slices(self.grid, block_id)
        regions = self.regions.bind(dict(zip(self.regions.constants, values))) if values else self.regions
        return regions.read(box)

    def __dask_tokenize__(self) -> Any:
        return ("daskstream-region-blocks", self.regions, self.grid)


class RegionSpans:
    """The function of a region array's tasks where they stream spans: ``(block_id, *constants) -> SpanRead``.

    Each task's block is a span of many blocks of ``piece`` (what one task
    may compute at once), not data: the steps after it compute it piece by
    piece (:mod:`daskstream.compute.streaming.spans`).
    """

    def __init__(self, regions: Regions, spans: tuple[tuple[int, ...], ...], piece: tuple[int, ...]) -> None:
        self.regions, self.spans, self.piece = regions, spans, piece

    def __call__(self, block_id: tuple[int, ...], *values: np.ndarray) -> SpanRead:
        regions = self.regions.bind(dict(zip(self.regions.constants, values))) if values else self.regions
        return SpanRead(regions, block_slices(self.spans, block_id), self.piece)

    def __dask_tokenize__(self) -> Any:
        return ("daskstream-region-spans", self.regions, self.spans, self.piece)


# The annotation that marks a layer as a region array, holding its Regions.


@dataclass(frozen=True)
class Readable:
    """What :func:`regions_of` finds: the regions, and the dask arrays of their constants by name."""

    regions: Regions
    constants: dict[str, Any] = field(default_factory=dict)


def region_array(
    readable: Readable,
    grid: tuple[tuple[int, ...], ...],
    resources: Resources,
    *,
    spans: tuple[tuple[int, ...], ...] | None = None,
    cap: int = 0,
) -> Any:
    """A dask array whose blocks (on ``grid``) are each read from ``readable`` in one task, planned for
    ``resources``.

    With ``spans`` (the chunks of the tasks, each a span of many blocks of
    ``grid``, which is regular), each task gives its span instead, for the
    steps after it to compute block by block, as they stream a source's spans
    (:func:`~daskstream.graph.reads.span_array`); a step taking such a span
    whole may hold ``cap`` bytes.

    The constants enter every task whole, as one graph input each (computed once, before).
    """
    regions = readable.regions
    out_ind = tuple(f"a{i}" for i in range(len(regions.shape)))
    wholes = []
    for name in regions.constants:
        wholes.extend([whole_input(readable.constants[name]), None])
    name = f"daskstream-regions-{tokenize(regions, grid, spans, *regions.constants)}"
    piece = tuple(max(lengths, default=0) for lengths in grid)
    tasks = grid if spans is None else spans
    array = da.blockwise(
        RegionBlocks(regions, grid) if spans is None else RegionSpans(regions, tasks, piece),
        out_ind,
        ArrayBlockIdDep(tasks),
        out_ind,
        *wholes,
        dtype=regions.dtype,
        meta=np.empty((0,) * len(regions.shape), dtype=regions.dtype),
        name=name,
        concatenate=True,
        align_arrays=False,
    )
    array.dask.layers[name].collection_annotations[REGIONS_ANNOTATION] = regions
    if spans is not None:
        array.dask.layers[name].collection_annotations[SPAN_ANNOTATION] = {"piece": piece, "cap": cap}
    record_plan(array.dask.layers[name], resources)
    return array


def regions_of(array: Any, *, constant_limit: int = 0) -> Readable | None:
    """What ``array``'s blocks can be computed from region by region, or ``None``.

    That is: a source opened with ``daskstream.open``; a region array; or an
    element-wise operation (``x - m``, ``np.where(x > t, x, 0)``...) over those,
    literals and arrays of at most ``constant_limit`` bytes (aggregates such as
    a mean, taken whole).
    """
    graph = array.__dask_graph__()
    layer = graph.layers.get(array.name)
    if layer is None:
        return None
    held = (layer.collection_annotations or {}).get(REGIONS_ANNOTATION)
    if held is not None:
        return Readable(held, _region_constants(graph, layer))
    for name, source, _ in read_layers(array):
        if name == array.name:
            return Readable(SourceRegions(source))
    if not _elementwise(layer):
        return None
    operands: list[tuple[str, Any, tuple[int, ...] | None]] = []
    constants: dict[str, Any] = {}
    out_index = list(layer.output_indices)
    for ref, index in layer.indices:
        key = getattr(ref, "key", ref)
        if index is None:
            if isinstance(key, str) and key in graph.layers:
                return None  # a whole graph value: not an element-wise operand
            operands.append(("literal", ref, None))
            continue
        axes = tuple(out_index.index(letter) for letter in index)
        operand = layer_array(graph, key)
        if operand is None:
            return None
        inner = regions_of(operand, constant_limit=constant_limit)
        if inner is not None and operand.shape == tuple(array.shape[a] for a in axes):
            operands.append(("regions", inner.regions, axes))
            constants.update(inner.constants)
        elif operand.nbytes <= constant_limit:
            operands.append(("constant", operand.name, axes))
            constants[operand.name] = operand
        else:
            return None
    regions = ExpressionRegions(layer.task, tuple(operands), tuple(array.shape), np.dtype(array.dtype))
    if not any(kind == "regions" for kind, _, _ in operands):
        return None
    return Readable(regions, constants)


def _elementwise(layer: Any) -> bool:
    """Whether a layer is one element-wise dask operation: a Blockwise whose inputs all run along its axes."""

    if not isinstance(layer, Blockwise) or layer.new_axes or layer.io_deps or layer.output_blocks:
        return False
    out = list(layer.output_indices)
    for _, index in layer.indices:
        if index is None:
            continue
        if any(letter not in out for letter in index):
            return False
        positions = [out.index(letter) for letter in index]
        # numpy broadcasting lines up trailing axes: an operand's axes are the output's last ones, in order.
        if positions != list(range(len(out) - len(index), len(out))):
            return False
    return True


def _region_constants(graph: Any, layer: Any) -> dict[str, Any]:
    """The dask arrays of the constants a region array's layer takes, by name."""

    regions = layer.collection_annotations[REGIONS_ANNOTATION]
    found = {}
    for name in regions.constants:
        array = layer_array(graph, name)
        if array is not None:
            found[name] = array
    return found


__all__ = [
    "ArrayRegions",
    "ExpressionRegions",
    "KernelRegions",
    "Readable",
    "RegionBlocks",
    "RegionSpans",
    "Regions",
    "SourceRegions",
    "block_info_for",
    "region_array",
    "regions_of",
]
