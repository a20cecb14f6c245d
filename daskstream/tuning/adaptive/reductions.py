"""Adaptive reductions: a reduction that tries settings on its own first rows, then runs the rest with the winner.

``ds.reduce(x, op, adaptive=True)`` and ``ds.describe(x, adaptive=True)``
return an :class:`AdaptiveRun`.
Computing it cuts the array along its first axis into waves
(:mod:`daskstream.tuning.adaptive.trials`): the first waves try the planner's setting
(or the one an earlier adaptive run of this kind of data chose) and a few
alternatives — more threads, larger tasks — interleaved, as
real work whose results are part of the answer; the rest then runs with the
fastest. Nothing is read twice. The pieces' results are joined as the
reduction's own combine step joins chunks (:mod:`daskstream.compute.joins`).

What was tried, what won and why is the :class:`Adaptation` (``explain()``,
the progress bar's postfix while it runs), and the winner is remembered in the
tuning cache under the same kind-of-data key :func:`daskstream.tune` uses, so
the next adaptive run of that kind of data starts from it.

Waves run on this process's threads, or as futures on a distributed cluster
(:mod:`daskstream.tuning.adaptive.engine`); on another scheduler, or an array too
small for trials, the reduction runs as planned and the :class:`Adaptation`
says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np

from daskstream.advice import keyword, passing, said
from daskstream.compute.describe import describe
from daskstream.compute.joins import PieceDescription, PieceReduction
from daskstream.compute.reductions import reduce
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import read_layers
from daskstream.graph.reads import source_array
from daskstream.planning.grid import normalize_axes
from daskstream.planning.settings import PlanSettings
from daskstream.sources import Source
from daskstream.tuning.adaptive.engine import AdaptiveJob, WaveRunner, row_bytes
from daskstream.tuning.adaptive.reads import (
    Cluster,
    RegionWaves,
    WaveBar,
    compute_wave,
    readable_for_waves,
    rows_array,
)
from daskstream.tuning.adaptive.record import Adaptation
from daskstream.tuning.adaptive.trials import (
    Setting,
    Wave,
)
from daskstream.tuning.candidates import Multiples, SearchSpace
from daskstream.tuning.measured_work import work_for
from daskstream.tuning.tuner import cache_key, search_space, source_of


class AdaptiveRun(AdaptiveJob):
    """A reduction or ``describe`` computed adaptively: :meth:`compute` runs it; ``adaptation`` then tells
    what happened.

    Made by ``daskstream.reduce(x, op, adaptive=True)`` and
    ``daskstream.describe(x, adaptive=True)``.

    Attributes
    ----------
    source
        What is read.
    operation
        The reduction's name, or ``"describe"``.
    adaptation
        The :class:`~daskstream.tuning.adaptive.record.Adaptation`, once computed.
    """

    def __init__(
        self,
        source: Source,
        operation: str,
        axis: Any,
        pieces: PieceReduction | PieceDescription,
        single_run: Any,
        *,
        settings: PlanSettings,
        progress: bool | None,
        computed: Computed | None = None,
    ) -> None:
        self.source = source
        # What is reduced when it is computed from the source (a kernel, an expression), else None.
        self.computed = computed
        self.name = source.name if computed is None else f"{computed.label} of {source.name}"
        self.operation = operation
        self.axis = axis
        self.pieces = pieces
        # The computation done in one piece, as planned (what runs when nothing can be tried).
        self.single_run = single_run
        self.settings = settings
        self.progress = progress
        self.adaptation: Adaptation | None = None
        # What turns the answer into the one given back (labelling it for a DataArray), or None.
        self.relabel: Callable[[Any], Any] | None = None

    @property
    def dtype(self) -> np.dtype | None:
        """The answer's dtype (reductions)."""
        return getattr(self.single_run, "dtype", None)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The answer's shape (reductions)."""
        return getattr(self.single_run, "shape", None)

    def __repr__(self) -> str:
        state = "not computed yet" if self.adaptation is None else f"chose {self.adaptation.chunks}"
        return f"<daskstream AdaptiveRun {self.operation} over {self.source.name}: {state}>"

    def compute(self) -> Any:
        """Run it adaptively and return the answer: a numpy array or scalar, or a :class:`Description`."""
        result, self.adaptation = WaveRunner(self).run()
        return result if self.relabel is None else self.relabel(result)

    def explain(self) -> str:
        """What the run tried and chose (after :meth:`compute`), or what it will try."""
        if self.adaptation is None:
            return f"{self!r}: compute() tries the planner's setting and alternatives on the first waves"
        return self.adaptation.explain()

    # -- the job -------------------------------------------------------------------

    def search_space(self, settings: PlanSettings) -> SearchSpace:
        space = search_space(self.source, settings.resources)
        if self.computed is None:
            return space
        # Tasks hold the source's blocks and the computed ones: sized by the wider of the two.
        return dataclasses.replace(space, itemsize=max(space.itemsize, self.computed.dtype.itemsize))

    def cache_key(self, space: SearchSpace, settings: PlanSettings) -> dict[str, Any]:
        work = work_for(
            self.operation if self.operation != "count_nonzero" else "sum",
            None,
            ndim=self.source.ndim,
            dtype=self.source.dtype,
            axis=self.axis,
            depth=0,
        )
        key = cache_key(self.source, space, work, settings.resources)
        if self.computed is not None:
            key["computed"] = self.computed.label
        return key

    def planned_multiples(self, space: SearchSpace, settings: PlanSettings) -> Multiples | None:
        planned = self.source.plan(settings).chunks if self.computed is None else self.computed.chunks
        return space.multiples_of(planned)

    def memory_factor(self, settings: PlanSettings) -> float:
        dtype = self.source.dtype if self.computed is None else self.computed.dtype
        return settings.working_set_factor_for(dtype)

    def why_not(self, space: SearchSpace) -> str | None:
        if self.computed is not None and self.computed.waves is None:
            return self.computed.why_not
        if self.source.ndim and self.source.storage_chunks is None and space.axes != (0,):
            return "the data is stored with its last axis slowest; waves cut the first"
        return self.pieces.why_not(self.source.ndim)

    def run_wave(
        self, space: SearchSpace, setting: Setting, wave: Wave, bar: Any, cluster: Cluster | None
    ) -> tuple[Any, float, float]:
        chunks = space.chunks(setting.multiples)
        if self.computed is not None and self.computed.waves is not None:
            piece = self.computed.waves.rows(wave.start, wave.stop, chunks)
        else:
            piece = rows_array(self.source, wave.start, wave.stop, chunks)
        nbytes = (wave.stop - wave.start) * row_bytes(space)
        return compute_wave(self.pieces.piece(piece), setting.threads, bar, nbytes, cluster)

    def run_whole(self, bar: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        with WaveBar(bar, int(bar.total)) if bar is not None else contextlib.nullcontext():
            (result,) = dask.compute(self.single_run)
        return result, time.perf_counter() - t0

    def join(self, parts: list[Any]) -> Any:
        return self.pieces.join(parts, self.dtype)


@dataclass(frozen=True)
class Computed:
    """An array computed from a source (a kernel, an expression over it) that an adaptive run reduces:
    its waves (``None`` when it cannot be cut into them, ``why_not`` saying why), label, dtype and the
    planner's chunks."""

    waves: RegionWaves | None
    why_not: str
    label: str
    dtype: np.dtype
    chunks: tuple[int, ...]


def _as_run(x: Any, settings: PlanSettings, planned: Callable[[Any], Any]) -> tuple[Source, Any, Any, Computed | None]:
    """The source read, the array as planned, ``planned`` of it (the computation as one run) and, for an
    array computed from a source, what it computes."""
    opened = hasattr(x, "__dask_graph__") and any(name == x.name for name, _, _ in read_layers(x))
    if not hasattr(x, "__dask_graph__") or opened:
        source = source_of(x, as_opened=True)
        array = source_array(source, "auto", settings)
        return source, array, planned(array), None
    single = planned(x)
    readable, why = readable_for_waves(x, single, settings.resources)
    sources = list(readable.regions.sources) if readable is not None else [s for _, s, _ in read_layers(x)]
    if not sources:
        raise InvalidArgumentError(
            said(
                keyword("adaptive", True),
                " cuts the reads of files into waves; this array reads none: ",
                passing("adaptive", False),
            )
        )
    source = sources[0]
    if readable is not None and (len({s.token for s in sources}) != 1 or source.shape != tuple(x.shape)):
        readable, why = None, "the array is computed from several sources, or from one of another shape"
    label = readable.regions.label if readable is not None else "computed array"
    computed = Computed(
        None if readable is None else RegionWaves(readable, settings.resources),
        why,
        label,
        np.dtype(x.dtype),
        tuple(c[0] if c else 0 for c in x.chunks),
    )
    return source, x, single, computed


def adaptive_reduction(
    x: Any,
    op: str,
    axis: Any = None,
    *,
    keepdims: bool = False,
    dtype: Any = None,
    ddof: int = 0,
    q: Any = None,
    settings: PlanSettings,
    progress: bool | None = None,
) -> AdaptiveRun:
    """``reduce(x, op, ..., adaptive=True)``: ``x`` a path, a :class:`Source`, an array made by
    ``daskstream.open`` or one computed from it region by region (``map_blocks`` kernels, element-wise
    expressions); ``settings`` resolved where the call entered."""
    options = {"keepdims": keepdims, "dtype": dtype, "ddof": ddof, "q": q}
    budget = settings.resources.memory_budget
    source, _, single, computed = _as_run(x, settings, lambda a: reduce(a, op, axis, memory_budget=budget, **options))
    axes = tuple(range(source.ndim)) if axis is None else normalize_axes(axis, source.ndim)
    pieces = PieceReduction(op, axes, keepdims=keepdims, dtype=dtype, ddof=ddof, q=q)
    return AdaptiveRun(source, op, axis, pieces, single, settings=settings, progress=progress, computed=computed)


def adaptive_description(
    x: Any,
    axis: Any = None,
    bins: Any = None,
    *,
    bin_range: Any = None,
    ddof: int = 0,
    settings: PlanSettings,
    progress: bool | None = None,
) -> AdaptiveRun:
    """``describe(x, ..., adaptive=True)``: ``x`` and ``settings`` as for :func:`adaptive_reduction`."""

    def described(a: Any) -> Any:
        return describe(a, axis, bins, range=bin_range, ddof=ddof, memory_budget=settings.resources.memory_budget)

    source, planned, single, computed = _as_run(x, settings, described)
    pieces = PieceDescription.of(planned, axis, bins=bins, bin_range=bin_range, ddof=ddof, resources=settings.resources)
    return AdaptiveRun(
        source, "describe", axis, pieces, single, settings=settings, progress=progress, computed=computed
    )
