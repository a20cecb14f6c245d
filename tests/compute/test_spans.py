"""Spans: arrays whose chunks outnumber what a graph may hold, each task streaming many chunks through a
buffer of one, with numpy's answers, reads of one chunk at a time, and refusals before any read."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import signal

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from signals import assert_stopped_by, signalled_command
from span_helpers import BUDGET, SPANNED, Reads

import daskstream as ds
from daskstream.compute.streaming.span_folds import MOST_WAITING, WAITING_BYTES, Fold
from daskstream.errors import MemoryBudgetError
from daskstream.planning.spans import _wave_use as wave_use
from daskstream.planning.spans import plan_span, span_blocks
from daskstream.runtime.metering import ReadMeter
from daskstream.sources.npy import NpySource


def opened(path):
    x = ds.open(path, memory_budget=BUDGET)
    plan = ds.plan(path, memory_budget=BUDGET)
    assert plan.span is not None
    assert math.prod(plan.span) > 1
    return x, plan


EXPRESSIONS = {
    "sum": (lambda x: x.sum(), lambda a: np.nansum(a, dtype="f8") + np.nan),
    "nansum": (lambda x: da_nan(x, "nansum"), lambda a: np.nansum(a, dtype="f8")),
    "mean": (lambda x: np.nanmean(x), lambda a: np.nanmean(a, dtype="f8")),
    "std": (lambda x: np.nanstd(x), lambda a: np.nanstd(a.astype("f8"))),
    "var over the first axis": (lambda x: np.nanvar(x, axis=0), lambda a: np.nanvar(a.astype("f8"), axis=0)),
    "max per row": (lambda x: np.nanmax(x, axis=(1, 2)), lambda a: np.nanmax(a, axis=(1, 2))),
    "min per column": (lambda x: np.nanmin(x, axis=0), lambda a: np.nanmin(a, axis=0)),
    "centred std": (
        # The mean cast back to float32, as the guide advises: a float64 difference would not fit the budget.
        lambda x: ds.reduce(x - ds.reduce(x, "nanmean", axis=0).astype(x.dtype), "nanstd"),
        lambda a: np.nanstd(a.astype("f8") - np.nanmean(a, axis=0, dtype="f8")),
    ),
    "weighted sum of a slice": (
        lambda x: (np.where(x[17:23903, 5:33] > 0, x[17:23903, 5:33], 0) * 2 + 1).sum(axis=(0, 2)),
        lambda a: (np.where(a[17:23903, 5:33] > 0, a[17:23903, 5:33], 0).astype("f8") * 2 + 1).sum(axis=(0, 2)),
    ),
    "std as ds.reduce merges it": (
        lambda x: ds.reduce(x, "nanstd", axis=(0, 2), ddof=1),
        lambda a: np.nanstd(a.astype("f8"), axis=(0, 2), ddof=1),
    ),
    "mean as ds.reduce": (lambda x: ds.reduce(x, "nanmean", axis=0), lambda a: np.nanmean(a, axis=0, dtype="f8")),
    # Rows picked by an array, in order: each piece gathered from the chunks they lie in.
    "mean of every seventh row picked by an array": (
        lambda x: ds.reduce(x[np.arange(0, 24_000, 7)], "nanmean", axis=0),
        lambda a: np.nanmean(a[::7], axis=0, dtype="f8"),
    ),
    # Columns picked in no order, one twice, then rows picked across spans in no order.
    "maximum of columns picked in no order": (
        lambda x: np.nanmax(x[:, np.array([3, 1, 1, 39])], axis=(0, 2)),
        lambda a: np.nanmax(a[:, [3, 1, 1, 39]], axis=(0, 2)),
    ),
    # Rechunked: each new block the parts of spans it joins, off the spans' grid and along every axis.
    "maximum of a rechunk off the spans' grid": (
        lambda x: np.nanmax(x.rechunk((4000, 40, 3)), axis=0),
        lambda a: np.nanmax(a, axis=0),
    ),
    "mean over time of a rechunk to whole columns": (
        lambda x: ds.reduce(x.rechunk((24_000, 10, 3)), "nanmean", axis=0),
        lambda a: np.nanmean(a, axis=0, dtype="f8"),
    ),
    # Joined as dask's concatenate, stack, pad and roll join blocks: each block a span (or data) passed on.
    "mean of a concatenation, padded and rolled": (
        lambda x: ds.reduce(
            da.roll(da.pad(da.concatenate([x[12_000:], x[:12_000]]), ((2, 2), (0, 0), (0, 0))), 5, axis=0),
            "nanmean",
            axis=0,
        ),
        lambda a: np.nanmean(
            np.roll(np.pad(np.concatenate([a[12_000:], a[:12_000]]), ((2, 2), (0, 0), (0, 0))), 5, axis=0),
            axis=0,
            dtype="f8",
        ),
    ),
    "maximum over a stack of the array and its double": (
        lambda x: np.nanmax(da.stack([x, x * 2]), axis=(0, 1)),
        lambda a: np.nanmax(np.stack([a, a * 2]), axis=(0, 1)),
    ),
    # Two spans of one source in one step: each reads its own pieces, neither waits for the other.
    "maximum of the array plus its reverse": (
        lambda x: np.nanmax(x + x[::-1], axis=0),
        lambda a: np.nanmax(a + a[::-1], axis=0),
    ),
    "maximum over the array joined to its double": (
        lambda x: np.nanmax(da.concatenate([x, 2 * x]), axis=0),
        lambda a: np.nanmax(np.concatenate([a, 2 * a]), axis=0),
    ),
    # numpy's element-wise functions that are not ufuncs, as dask maps them over blocks.
    "sum of values rounded and clipped": (
        lambda x: ds.reduce(np.clip(da.round(x, 1), -1, 1), "nansum", axis=0),
        lambda a: np.nansum(np.clip(np.round(a, 1), -1, 1), axis=0, dtype="f8"),
    ),
    # xarray's weighted mean (dask's einsum): each piece contracted with its part of the weights, summed; the
    # weights' sum where values are not NaN and the weighted sum computed together, each piece read once.
    "mean weighted by row, as xarray weighs it": (
        lambda x: _weighted_mean(x).data,
        lambda a: _weighted_mean(a).values,
    ),
    # Contracted in another axis order than the array's: each piece read in its own, contracted in the output's.
    "sum per column by einsum": (
        lambda x: da.einsum("tyz->y", x.astype("f8")),
        lambda a: np.einsum("tyz->y", a.astype("f8")),
    ),
    # Over time only: the weights' sum is taken, as it is, by the pass after the one that made it.
    "mean over time weighted by row": (
        lambda x: _weighted_mean(x, ("t",)).data,
        lambda a: _weighted_mean(a, ("t",)).values,
    ),
    "mean weighted by row over every axis": (
        lambda x: _weighted_mean(x, ("t", "y", "z")).data,
        lambda a: _weighted_mean(a, ("t", "y", "z")).values,
    ),
    # dask's tensordot with a vector: each piece contracted along its last axis, whole in every piece.
    "maximum over time of a dot with a vector": (
        lambda x: np.nanmax(da.dot(x, np.linspace(-1, 1, 6).astype("f4")), axis=0),
        lambda a: np.nanmax(np.dot(a, np.linspace(-1, 1, 6).astype("f4")), axis=0),
    ),
    # dask's own histogram: each piece's row of counts, summed.
    "dask's own histogram": (
        lambda x: da.histogram(x, bins=16, range=(-4, 4))[0],
        lambda a: np.histogram(a, bins=16, range=(-4, 4))[0],
    ),
    "sum of rows picked across spans in no order": (
        lambda x: ds.reduce(x[np.array([23_999, 5, 12_000, 6_001, 5])], "nansum", axis=1),
        lambda a: np.nansum(a[[23_999, 5, 12_000, 6_001, 5]], axis=1, dtype="f8"),
    ),
    "any above 4": (lambda x: (x > 4).any(), lambda a: (a > 4).any()),
    "rows as float64": (
        lambda x: np.nanmean(x.astype("f8"), axis=(1, 2)),
        lambda a: np.nanmean(a.astype("f8"), axis=(1, 2)),
    ),
    # Integers and steps in an index: each piece read, then indexed.
    "mean of a column over time": (lambda x: x[:, 3].mean(axis=0), lambda a: a[:, 3].mean(axis=0, dtype="f8")),
    "maximum of every third row, every other column": (
        lambda x: np.nanmax(x[::3, 2:9:2] * 2, axis=(1, 2)),
        lambda a: np.nanmax(a[::3, 2:9:2] * 2, axis=(1, 2)),
    ),
    # Reversing steps and new axes: each piece read from its last position, then reversed; a new axis of one.
    "sums of reversed rows after a step": (
        lambda x: np.nansum((x * 2)[::-1], axis=(1, 2)),
        lambda a: np.nansum((a * 2)[::-1], axis=(1, 2), dtype="f4"),
    ),
    "argmax of every third row backwards, in a slice": (
        lambda x: x[23903:17:-3, ::-2].argmax(axis=0),
        lambda a: a[23903:17:-3, ::-2].argmax(axis=0),
    ),
    "mean over a new axis and time": (
        lambda x: np.nanmean((x[:, None, 3] - x[:, 2][:, None]).astype("f8"), axis=(0, 1)),
        lambda a: np.nanmean((a[:, None, 3] - a[:, 2][:, None]).astype("f8"), axis=(0, 1)),
    ),
    "cumulative sum of a ravel": (
        lambda x: np.cumsum(x[12:].astype("f8").ravel(), axis=0)[-7:],
        lambda a: np.cumsum(a[12:].astype("f8").ravel(), axis=0)[-7:],
    ),
    "sum of an empty part of a new axis": (
        lambda x: np.nansum(x[:, None][:, 1:], dtype="f8"),
        lambda a: np.nansum(a[:, None][:, 1:], dtype="f8"),
    ),
    "cumulative sum of a reversed column": (
        lambda x: np.cumsum(x[::-1, 5, None].astype("f8"), axis=0)[-1],
        lambda a: np.cumsum(a[::-1, 5, None].astype("f8"), axis=0)[-1],
    ),
    # Reshapes: each chunk of whole rows read, then reshaped.
    "row sums of a reshape": (
        lambda x: x.reshape(24_000, 240).sum(axis=1, dtype="f8"),
        lambda a: a.reshape(24_000, 240).sum(axis=1, dtype="f8"),
    ),
    "histogram of a ravel": (
        lambda x: ds.reduce(x.ravel(), "histogram", bins=6, range=(-3, 3))[0],
        lambda a: np.histogram(a.ravel(), bins=6, range=(-3, 3))[0],
    ),
    "maxima of rows split in two": (
        lambda x: np.nanmax(x.reshape(12_000, 2, 40, 6) * 2, axis=(0, 2)),
        lambda a: np.nanmax(a.reshape(12_000, 2, 40, 6) * 2, axis=(0, 2)),
    ),
    # Axes permuted: each piece read, then transposed.
    "sums over the last axis of a transpose": (
        lambda x: np.nansum(x.T, axis=2, dtype="f8"),
        lambda a: np.nansum(a.T, axis=2, dtype="f8"),
    ),
    "argmin of swapped axes": (
        lambda x: np.nanargmin(x.swapaxes(0, 1) * 2, axis=1),
        lambda a: np.nanargmin(a.swapaxes(0, 1) * 2, axis=1),
    ),
    # Where the extremes lie: each piece's, found where the piece lies in the array (NaN first, as numpy).
    "argmax": (lambda x: x.argmax(), lambda a: a.argmax()),
    "nanargmin along the first axis of a product": (
        lambda x: np.nanargmin(x * 2, axis=0),
        lambda a: np.nanargmin(a * 2, axis=0),
    ),
    "nanargmax along a kept axis of a slice": (
        lambda x: np.nanargmax(x[17:23903, 5:33], axis=1),
        lambda a: np.nanargmax(a[17:23903, 5:33], axis=1),
    ),
    # Counting passes: each piece's counts, summed as they come.
    "histogram over a range": (
        lambda x: ds.reduce(x * 2, "histogram", bins=7, range=(-3, 3))[0],
        lambda a: np.histogram(a * 2, bins=7, range=(-3, 3))[0],
    ),
    # Past the NaN in row 11, which would make the data's range and the order statistics NaN.
    "histogram over the data's range": (
        lambda x: ds.reduce(x[12:], "histogram", bins=5)[0],
        lambda a: np.histogram(a[12:], bins=5)[0],
    ),
    # The k largest or smallest of each piece, then of those: dask's topk combines its own partials.
    "three largest of a ravel": (
        lambda x: da.topk(x[12:].ravel(), 3),
        lambda a: np.sort(a[12:].ravel())[::-1][:3],
    ),
    "five smallest along time of a double": (
        lambda x: da.topk(x * 2, -5, axis=0),
        lambda a: np.sort(a * 2, axis=0)[:5],
    ),
    "exact median": (lambda x: ds.reduce(x[12:], "median"), lambda a: np.median(a[12:])),
    "exact quantiles": (
        lambda x: ds.reduce(x[12:] - 1, "quantile", q=[0.01, 0.5, 0.999]),
        lambda a: np.quantile(a[12:] - 1, [0.01, 0.5, 0.999]),
    ),
}

# How many times a computation reads every chunk: once, but for a centred std's mean and difference, a
# histogram's minimum, maximum and counts, and a quantile's passes (one per 16 bits of a float32: its top
# digit, then the next). The spans a task reads are not kept: each pass reads them again.
PASSES = {
    "centred std": 2,
    # Its minimum and maximum read together, then its counts.
    "histogram over the data's range": 2,
    "exact median": 2,
    # Six order statistics' counts (two around each quantile) fit a task's share in 8-bit digits: four passes.
    "exact quantiles": 4,
    # The carry past each span is the span scanned to its end: read once more.
    "cumulative sum of a reversed column": 2,
    "cumulative sum of a ravel": 2,
    # Its blocks are the array's spans and their doubles': each read for its own.
    "maximum over a stack of the array and its double": 2,
    "maximum of the array plus its reverse": 2,
    "maximum over the array joined to its double": 2,
}
# Slices read only the chunks they touch.
SLICED = {
    "weighted sum of a slice",
    "mean of every seventh row picked by an array",
    "maximum of columns picked in no order",
    "sum of rows picked across spans in no order",
    "mean of a column over time",
    "maximum of every third row, every other column",
    "nanargmax along a kept axis of a slice",
    "argmax of every third row backwards, in a slice",
    "mean over a new axis and time",
    "cumulative sum of a reversed column",
    "cumulative sum of a ravel",
    "histogram over the data's range",
    "three largest of a ravel",
    "exact median",
    "exact quantiles",
}


def _labelled(array):
    import xarray as xr

    return xr.DataArray(array, dims=("t", "y", "z"))


def _weighted_mean(array, dims=("y", "z")):
    import xarray as xr

    weights = xr.DataArray(np.linspace(0.1, 1.0, 40), dims="y")
    return _labelled(array).weighted(weights).mean(dims)


def da_nan(x, name):
    import dask.array as da

    return getattr(da, name)(x)


# Every expression over Zarr; over the other formats, whose reads alone differ, one of each kind of step.
ACROSS_FORMATS = (
    "sum",
    "centred std",
    "weighted sum of a slice",
    "mean of a column over time",
    "argmax",
    "histogram over a range",
    "exact median",
)


@pytest.mark.parametrize(
    ("fmt", "expression"),
    [("zarr", e) for e in sorted(EXPRESSIONS)] + [(f, e) for f in ("npy", "hdf5") for e in ACROSS_FORMATS],
)
def test_spans_stream_to_numpys_answer_reading_each_chunk_once(span_field, spanned, fmt, expression):
    data, paths = span_field
    build, oracle = EXPRESSIONS[expression]
    x, plan = opened(paths[fmt])
    assert x.npartitions == plan.span_tasks < plan.n_tasks
    result = build(x)
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = result.compute()
    np.testing.assert_allclose(got, oracle(data), rtol=2e-6, equal_nan=True)
    passes = PASSES.get(expression, 1)
    assert ds.plan_compute(result).bytes_to_read == passes * data.nbytes  # the plan says so beforehand
    sliced = expression in SLICED
    # Each chunk is read once per pass (a slice reads only what it needs, within the chunks it touches).
    assert meter.bytes_read <= passes * data.nbytes
    assert sliced or meter.bytes_read == passes * data.nbytes


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
def test_a_span_is_read_one_chunk_at_a_time(span_field, spanned, monkeypatch, fmt):
    data, paths = span_field
    x, plan = opened(paths[fmt])
    source_class = type(ds.open_source(paths[fmt]))
    reads = Reads(monkeypatch, source_class)
    with dask.config.set(scheduler="threads", num_workers=2):
        got = float(np.nanmean(x).compute())
    assert got == pytest.approx(float(np.nanmean(data, dtype="f8")), rel=1e-6)  # summed in float32, as dask does
    # The spans' blocks are never read whole: every read is one chunk, and no more run than threads.
    assert max(reads.sizes) <= plan.chunk_bytes < x.nbytes / x.npartitions
    assert len(reads.sizes) == plan.n_tasks
    assert reads.most_at_once <= 2


def test_a_spanned_computation_runs_far_fewer_tasks_than_chunks(span_field, spanned):
    _, paths = span_field
    x, plan = opened(paths["zarr"])
    computation = ds.plan_compute(ds.reduce(x - ds.reduce(x, "nanmean", axis=0).astype(x.dtype), "nanstd"))
    assert computation.spans is not None
    assert computation.spans.chunks == math.prod(plan.span)
    assert computation.tasks < 2 * plan.n_tasks  # two passes over every chunk, fewer tasks than chunks
    text = computation.explain()
    assert "each streaming up to" in text
    assert "buffer of one chunk" in text
    assert computation.projected_peak_bytes <= computation.budget
    assert "Spans:" in plan.explain()
    assert f"{plan.span_tasks:,} tasks" in plan.explain()


STEPS_TAKING_WHOLE_BLOCKS = {
    "a sort of dask's map_blocks": lambda x: x.map_blocks(np.sort, axis=0).sum(),
    "map_blocks": lambda x: x.map_blocks(lambda b: b[::-1]).sum(),
    "points picked by vindex after a step": lambda x: (x * 2).vindex[np.array([3, 17_000]), np.array([1, 2])].sum(),
    "a rechunk by p2p": lambda x: x.rechunk((24_000, 40, 1), method="p2p").sum(),
    # Steps of whole axes or of halos, as dask and xarray make them.
    "xarray's rolling mean": lambda x: _labelled(x).rolling(t=3).mean().max().data,
    "xarray's quantile": lambda x: _labelled(x).quantile(0.5, dim="t").max().data,
    "a median along an axis": lambda x: da.median(x, axis=0).max(),
    "dask's percentile": lambda x: da.percentile(x.ravel(), 50),
    "argtopk": lambda x: da.argtopk(x.ravel(), 3),
    # An array of positions beside a new axis: not one of dask's shuffles known to stream.
    "rows picked by an array beside a new axis": lambda x: x[np.array([3, 1]), None].sum(),
    # Element-wise, but with a constant array, applied whole to every block: it would not follow the pieces.
    "a constant array given to map_blocks": lambda x: x.map_blocks(np.add, np.ones((1, 40, 1), "f4")).sum(),
    "a ufunc bound to an array": lambda x: x.map_blocks(functools.partial(np.add, np.ones(6, "f4"))).sum(),
    "the result itself": lambda x: x + 1,
}

# How the refusal names the step and the blocks it takes: as the user called it, never a layer's name.
REFUSED_AS = {
    "a sort of dask's map_blocks": "sort takes whole blocks of {path}",
    "map_blocks": "a function of map_blocks takes whole blocks of {path}",
    "points picked by vindex after a step": "vindex takes whole blocks of what mul makes of {path}",
    "a ufunc bound to an array": "add takes whole blocks of {path}",
    "rows picked by an array beside a new axis": "indexing with an array takes whole blocks of {path}",
    "a constant array given to map_blocks": "add takes whole blocks of {path}",
    "xarray's rolling mean": "map_overlap's halos (xarray's rolling: ds.kernels streams) takes whole blocks",
    # Those daskstream computes exactly name how: ds.reduce streams.
    "xarray's quantile": "a quantile along an axis skipping NaN, as xarray's quantile does "
    '(ds.reduce(x, "quantile", q=..., axis=...) streams, exact, where no value is NaN) takes whole blocks of '
    "what a rechunk makes of {path}",
    "a median along an axis": 'median along an axis (ds.reduce(x, "median", axis=...) streams, exact) takes whole '
    "blocks of what a rechunk makes of {path}",
    "dask's percentile": 'dask\'s percentile, approximate (ds.reduce(x, "quantile", q=..., axis=...) streams, '
    "exact) takes whole blocks of what reshape makes of {path}",
    "argtopk": "argtopk takes whole blocks of what reshape makes of {path}",
    "a rechunk by p2p": 'a rechunk by p2p (one by tasks streams: dask.config "array.rechunk.method": "tasks") takes',
    "the result itself": "the result takes whole blocks of what add makes of {path}",
}


@pytest.mark.parametrize("step", sorted(STEPS_TAKING_WHOLE_BLOCKS))
def test_a_step_taking_whole_spans_is_refused_before_any_read(span_field, spanned, monkeypatch, step):
    _, paths = span_field
    x, _ = opened(paths["zarr"])
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    with pytest.raises(MemoryBudgetError, match="spans of many chunks per task") as refused:
        STEPS_TAKING_WHOLE_BLOCKS[step](x).compute(scheduler="threads")
    assert isinstance(refused.value, MemoryError)
    message = str(refused.value)
    assert "compute a part of the array at a time" in message
    assert REFUSED_AS[step].format(path=paths["zarr"]) in message
    assert "daskstream-" not in message  # no layer's name
    assert reads.sizes == []


def test_parts_small_enough_are_taken_whole(span_field, spanned):
    data, paths = span_field
    x, _ = opened(paths["hdf5"])
    np.testing.assert_array_equal(x[1001:1004].compute(), data[1001:1004])
    np.testing.assert_array_equal(np.cumsum(x[40:43, :2], axis=0).compute(), np.cumsum(data[40:43, :2], axis=0))
    np.testing.assert_array_equal((x[5:7] * 2).compute(), data[5:7] * 2)


def test_spans_run_on_the_processes_scheduler(span_field, spanned):
    data, paths = span_field
    x, _ = opened(paths["zarr"])
    got = np.nanmean(x, axis=0).compute(scheduler="processes", num_workers=2)
    # Summed in float32, as dask does: within float32's rounding of 3,000 values near 0.
    np.testing.assert_allclose(got, np.nanmean(data, axis=0, dtype="f8"), rtol=1e-6, atol=1e-6)


def test_a_real_cluster_runs_spanned_tasks(dask_cluster, span_field):
    from distributed import Client, get_task_stream

    data, paths = span_field
    with Client(scheduler_file=str(dask_cluster)), dask.config.set(SPANNED):
        x = ds.open(paths["zarr"], memory_budget=BUDGET)
        with get_task_stream() as tasks:
            got = float(np.nanstd(x).compute())
        # Taken and joined spans go from worker to worker as any span does.
        picked = x[np.array([23_999, 5, 12_000, 6_001])].rechunk((4, 10, 3))
        picked_max = np.nanmax(picked, axis=0).compute()
    assert got == pytest.approx(float(np.nanstd(data.astype("f8"))), rel=1e-6)  # float32 moments, as dask
    assert len(tasks.data) < ds.plan(paths["zarr"], memory_budget=BUDGET).n_tasks
    np.testing.assert_array_equal(picked_max, np.nanmax(data[[23_999, 5, 12_000, 6_001]], axis=0))


def test_partials_are_combined_as_they_come(span_field, spanned, monkeypatch):
    """Small partials wait to be combined many at a time: a task's few pieces' partials (40 x 6 values each)
    combined once, at its end, where each new one was combined with the running one before; numpy's answer."""
    import daskstream.compute.streaming.spans as spans

    data, paths = span_field
    held = []
    combine = spans.Combine.__call__

    def counted(self, partials):
        held.append(len(partials))
        return combine(self, partials)

    monkeypatch.setattr(spans.Combine, "__call__", counted)
    reads = Reads(monkeypatch, NpySource)
    x, _plan = opened(paths["npy"])
    np.testing.assert_allclose(np.nanmax(x, axis=0).compute(), np.nanmax(data, axis=0))
    assert len(reads.sizes) > 2 * math.prod(x.numblocks)  # several pieces a task
    assert sum(held) == len(reads.sizes)  # each piece's partial combined once
    assert len(held) == math.prod(x.numblocks)  # once a task
    assert max(held) <= MOST_WAITING


def _nbytes(partial):
    return sum(_nbytes(v) for v in partial.values()) if isinstance(partial, dict) else partial.nbytes


@pytest.mark.parametrize("partial_bytes", [8, 4_000, 40_000, 200_000])
@pytest.mark.parametrize("kept", [1, 3, 40])
@pytest.mark.parametrize("as_dict", [False, True], ids=["arrays", "dicts of arrays"])
def test_a_fold_holds_its_running_partials_and_little_beside(partial_bytes, kept, as_dict):
    """However large the partials (arrays, or dicts of them as a variance's), and however many kept positions,
    a fold holds one running partial per kept position and, beside them, WAITING_BYTES at most once a piece is
    added; small partials are combined many at a time; its result is every partial combined."""
    pieces, length = 400, max(1, partial_bytes // 8 // (2 if as_dict else 1))
    held_at_most, combined_lists = 0, []

    def partial_of(i):
        values = np.full((1, length), float(i))
        return {"total": values, "n": np.ones((1, length))} if as_dict else values

    def combined(partials):
        combined_lists.append(len(partials))
        if as_dict:
            return {key: np.sum([p[key] for p in partials], axis=0) for key in ("total", "n")}
        return np.sum(partials, axis=0)

    combined.join = None
    fold = Fold((0,), combined, partial_of, 2)
    for i in range(pieces):
        fold.add((i, i % kept), i)
        held = sum(_nbytes(p) for waiting in fold.partials.values() for p in waiting)
        held_at_most = max(held_at_most, held)
    result = fold.result()
    total = result["total"] if as_dict else result
    assert total.shape == (1, length * kept)
    for k in range(kept):
        np.testing.assert_array_equal(total[0, k * length : (k + 1) * length], sum(range(k, pieces, kept)))
    one = _nbytes(partial_of(0))
    assert held_at_most <= kept * one + WAITING_BYTES
    if one * kept <= WAITING_BYTES // 8:  # small partials: combined many at a time, not one by one
        assert len(combined_lists) * 4 <= pieces


def test_partials_of_a_kind_not_known_are_combined_as_they_come():
    class Opaque:
        def __init__(self, value):
            self.value = value

    fold = Fold((0,), lambda partials: Opaque(sum(p.value for p in partials)), Opaque, 1)
    for i in range(10):
        fold.add((i,), i)
        assert len(fold.partials[()]) == 1  # too large to wait, for all a fold knows
    assert fold.result().value == 45


def test_empty_slices_and_small_spans_taken_whole_give_numpys_answer(span_field, spanned):
    data, paths = span_field
    x, plan = opened(paths["zarr"])
    np.testing.assert_array_equal(x[100:100].sum(axis=0).compute(), data[100:100].sum(axis=0))
    assert float(x[100:100].sum().compute()) == 0.0
    assert x[:, 5:5].sum(axis=0).compute().shape == (0, 6)
    # Small parts joined, picked or rechunked as the result: each block computed whole, as numpy's.
    ends = da.concatenate([x[:5], x[-5:]])
    np.testing.assert_array_equal(ends.compute(), np.concatenate([data[:5], data[-5:]]))
    np.testing.assert_array_equal(x[np.array([23_999, 7])].compute(), data[[23_999, 7]])
    np.testing.assert_array_equal(ends.rechunk((3, 40, 6)).compute(), np.concatenate([data[:5], data[-5:]]))
    # A plan whose spans fit a task's share: steps taking whole blocks get them read at once.
    small = dataclasses.replace(plan, chunks=(20, 40, 6), span=(5, 1, 1))
    y = ds.open(paths["zarr"], chunks=small, memory_budget=BUDGET)
    np.testing.assert_array_equal(y.argmax(axis=0).compute(), np.argmax(data, axis=0))
    np.testing.assert_array_equal(y[:, 3].compute(), data[:, 3])
    np.testing.assert_allclose(
        ((y[20:] - y[20:].mean()) ** 2).mean(axis=0).compute(),
        ((data[20:] - data[20:].mean()) ** 2).mean(axis=0),
        rtol=1e-5,
    )


def test_chunks_too_small_to_step_through_are_not_spanned(span_field):
    # A budget of kilobytes cuts the array into chunks of a few hundred bytes: stepping through them would
    # cost more than reading them, so the whole at once is refused with the budget that fits, as without spans.
    _, paths = span_field
    with dask.config.set(SPANNED):
        plan = ds.plan(paths["npy"], memory_budget="1MiB")
        assert plan.beyond_graph_ceiling
        assert plan.span is None
        assert plan.chunk_bytes < plan.scheduler.span_chunk_floor_bytes
        with pytest.raises(MemoryBudgetError, match="whose graph the client and scheduler may hold"):
            ds.open(paths["npy"], memory_budget="1MiB").sum().compute()


def test_a_pebibyte_is_planned_in_spans_and_its_mean_is_built_not_refused(tmp_path):
    # 1 PiB of (time, 721, 1440) float32 in day chunks, metadata only: every chunk reads as the fill value.
    n = 2**50 // (721 * 1440 * 4)
    zarr.create_array(tmp_path / "v.zarr", shape=(n, 721, 1440), chunks=(24, 721, 1440), dtype="f4", fill_value=0)
    x = ds.open(str(tmp_path / "v.zarr"), memory_budget="8GiB")
    plan = ds.plan(str(tmp_path / "v.zarr"), memory_budget="8GiB")
    assert plan.span is not None
    assert plan.n_tasks > 1_000_000
    computation = ds.plan_compute(x.mean())
    # Tasks follow the graph's ceiling, not the data: a few per span, far fewer than the chunks.
    assert computation.tasks <= 4 * plan.span_tasks < plan.n_tasks
    assert computation.projected_peak_bytes <= computation.budget
    np.testing.assert_array_equal(x[n - 3 :, :2, :2].mean(axis=0).compute(), np.zeros((2, 2)))


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(1, 400), min_size=1, max_size=4).map(tuple),
    max_blocks=st.integers(1, 5000),
    floor_chunks=st.integers(0, 50),
    threads=st.sampled_from([1, 2, 8, 64, 1000]),
)
def test_spans_fit_the_graph_and_hold_whole_chunks(counts, max_blocks, floor_chunks, threads):
    span = plan_span(counts, 1, max_blocks=max_blocks, floor_bytes=floor_chunks, threads=threads)
    if math.prod(counts) <= max_blocks:
        assert span is None
        return
    assert span is not None
    assert all(1 <= s <= c for s, c in zip(span, counts))
    assert span_blocks(counts, span) <= max_blocks
    # Read in waves over the threads: no fewer busy than the spans first planned for the floor would keep.
    first = plan_span(counts, 1, max_blocks=max_blocks, floor_bytes=floor_chunks)
    assert round(wave_use(span_blocks(counts, span), threads), 2) >= round(
        wave_use(span_blocks(counts, first), threads), 2
    )
    # Slowest axis first: an axis is spanned past one chunk only where the axes before it are whole.
    for axis in range(1, len(span)):
        if span[axis] > 1:
            assert span[:axis] == counts[:axis]


class _ReadsRecorded:
    """An array read region by region, each region kept."""

    def __init__(self, data):
        self.data, self.regions = data, []

    def __getitem__(self, region):
        self.regions.append(region)
        return self.data[region]


@st.composite
def _indexed_spans(draw):
    shape = tuple(draw(st.lists(st.integers(1, 23), min_size=1, max_size=3)))
    piece = tuple(draw(st.integers(1, n)) for n in shape)
    index = []
    for n in shape:
        index.extend([None] * draw(st.integers(0, 1)))
        if draw(st.booleans()):
            index.append(draw(st.integers(-n, n - 1)))
        else:
            bounds = st.none() | st.integers(-n - 2, n + 2)
            step = draw(st.none() | st.integers(-5, 5).filter(bool))
            index.append(slice(draw(bounds), draw(bounds), step))
    index.extend([None] * draw(st.integers(0, 1)))
    return shape, piece, tuple(index)


@settings(max_examples=300, deadline=None)
@given(_indexed_spans())
def test_an_indexed_span_reads_each_piece_within_one_chunk_as_numpy_indexes(case):
    from daskstream.compute.streaming.spans import Reads as PieceReads
    from daskstream.compute.streaming.spans import _boxes, read_part, span_narrow, whole
    from daskstream.graph.reads import SpanRead

    shape, piece, index = case
    data = np.arange(math.prod(shape)).reshape(shape)
    expected = data[index]
    source = _ReadsRecorded(data)
    span = span_narrow(SpanRead(source, tuple(slice(0, n) for n in shape), piece), index)
    assert span.shape == expected.shape
    for _, box in _boxes(span.cuts()):
        np.testing.assert_array_equal(read_part(span, box, PieceReads()), expected[box])
        np.testing.assert_array_equal(whole(span.narrowed(box)), expected[box])
    # Every piece read lies within one storage chunk.
    for region in source.regions:
        for cell, step in zip(region, piece, strict=True):
            assert cell.stop <= cell.start or cell.start // step == (cell.stop - 1) // step


@st.composite
def _taken_spans(draw):
    shape = tuple(draw(st.lists(st.integers(1, 23), min_size=1, max_size=3)))
    piece = tuple(draw(st.integers(1, n)) for n in shape)
    axis = draw(st.integers(0, len(shape) - 1))
    positions = draw(st.lists(st.integers(0, shape[axis] - 1), max_size=40))
    blocks = draw(st.integers(1, min(3, shape[axis])))  # the spans dask's shuffle picks from along the axis
    return shape, piece, axis, positions, blocks


@settings(max_examples=300, deadline=None)
@given(_taken_spans())
def test_rows_picked_by_an_array_read_each_piece_within_one_chunk_as_numpy_takes(case):
    from daskstream.compute.streaming.span_takes import span_gather, span_take
    from daskstream.compute.streaming.spans import Reads as PieceReads
    from daskstream.compute.streaming.spans import _boxes, read_part, whole
    from daskstream.graph.reads import SpanRead

    shape, piece, axis, positions, blocks = case
    data = np.arange(math.prod(shape)).reshape(shape)
    expected = np.take(data, positions, axis=axis)
    source = _ReadsRecorded(data)
    span = SpanRead(source, tuple(slice(0, n) for n in shape), piece)
    # As dask's shuffle does: each block's positions picked in order, concatenated, put in the order asked.
    edges = np.linspace(0, shape[axis], blocks + 1).astype(int)
    order = np.argsort(positions, kind="stable")
    in_order = np.asarray(positions, dtype=int)[order]
    picks = []
    for start, stop in itertools.pairwise(edges):
        mine = in_order[(in_order >= start) & (in_order < stop)] - start
        block = span.narrowed(tuple(slice(start, stop) if a == axis else slice(0, n) for a, n in enumerate(shape)))
        index = tuple(mine if a == axis else slice(None) for a in range(len(shape)))
        picks.append(span_take(block, (1, index)))
    taken = span_gather(picks, (1, order), axis)
    assert taken.shape == expected.shape
    np.testing.assert_array_equal(whole(taken), expected)
    for _, box in _boxes(taken.cuts()):
        np.testing.assert_array_equal(whole(taken.narrowed(box)), expected[box])
        before = len(source.regions)
        np.testing.assert_array_equal(read_part(taken, box, PieceReads()), expected[box])
        # A piece holds at most as many rows as a chunk, and reads each chunk it needs once, within it.
        assert box[axis].stop - box[axis].start <= piece[axis]
        read = [tuple((c.start, c.stop) for c in region) for region in source.regions[before:]]
        assert len(set(read)) == len(read)
        for region in read:
            for (start, stop), step in zip(region, piece, strict=True):
                assert stop <= start or start // step == (stop - 1) // step


@st.composite
def _joined_spans(draw):
    shape = tuple(draw(st.lists(st.integers(1, 23), min_size=1, max_size=3)))
    piece = tuple(draw(st.integers(1, n)) for n in shape)
    # The parts a new block joins, as a rechunk cuts them: where each axis is cut.
    cuts = tuple(sorted({0, n, *draw(st.lists(st.integers(1, n), max_size=3))}) for n in shape)
    return shape, piece, cuts


@settings(max_examples=300, deadline=None)
@given(_joined_spans())
def test_a_rechunk_joins_parts_of_spans_read_a_piece_at_a_time_as_numpy(case):
    from daskstream.compute.streaming.span_rechunks import span_concatenate_shaped
    from daskstream.compute.streaming.spans import Reads as PieceReads
    from daskstream.compute.streaming.spans import _boxes, read_part, whole
    from daskstream.graph.reads import SpanRead

    shape, piece, cuts = case
    data = np.arange(math.prod(shape)).reshape(shape)
    source = _ReadsRecorded(data)
    span = SpanRead(source, tuple(slice(0, n) for n in shape), piece)
    parts = [span.narrowed(tuple(itertools.starmap(slice, cells))) for cells in itertools.product(
        *(list(itertools.pairwise(axis)) for axis in cuts)
    )]  # fmt: skip
    joined = span_concatenate_shaped(parts, [len(axis) - 1 for axis in cuts])
    assert joined.shape == shape
    np.testing.assert_array_equal(whole(joined), data)
    read = []
    for _, box in _boxes(joined.cuts()):
        np.testing.assert_array_equal(whole(joined.narrowed(box)), data[box])
        before = len(source.regions)
        np.testing.assert_array_equal(read_part(joined, box, PieceReads()), data[box])
        read.extend(source.regions[before:])
    # Every piece read lies within one storage chunk and one part, and the pieces read the array once.
    assert sum(math.prod(c.stop - c.start for c in region) for region in read) == data.size
    for region in read:
        for cell, step, axis in zip(region, piece, cuts, strict=True):
            assert cell.start // step == (cell.stop - 1) // step
            assert np.searchsorted(axis, cell.start, side="right") == np.searchsorted(axis, cell.stop - 1, side="right")


@st.composite
def _reshaped_spans(draw):
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12]), min_size=1, max_size=3)))
    piece = tuple(draw(st.integers(1, n)) for n in shape)
    # Any reshape: the prime factors of the size, in any order, cut into runs, with axes of one put in.
    factors = draw(st.permutations([p for n in shape for p in _prime_factors(n)]))
    new, run = [], 1
    for factor in factors:
        run *= factor
        if draw(st.booleans()):
            new.append(run)
            run = 1
    new.extend([run] if run > 1 or not new else [])
    for _ in range(draw(st.integers(0, 2))):
        new.insert(draw(st.integers(0, len(new))), 1)
    # The span starts anywhere on the chunks' grid (a slice of the source before the reshape).
    offset = tuple(draw(st.integers(0, p)) for p in piece)
    return shape, piece, tuple(new), offset


def _prime_factors(n):
    found = []
    for p in (2, 3):
        while n % p == 0:
            n //= p
            found.append(p)
    return found


@settings(max_examples=300, deadline=None)
@given(_reshaped_spans(), st.data())
def test_a_reshaped_span_reads_as_numpy_reshapes_within_its_projection(case, data):
    from daskstream.compute.streaming.span_reshapes import reshaped_piece, span_reshape
    from daskstream.compute.streaming.spans import Reads as PieceReads
    from daskstream.compute.streaming.spans import _boxes, read_part, whole
    from daskstream.graph.reads import SpanRead

    shape, piece, new, offset = case
    whole_source = np.arange(math.prod(n + o for n, o in zip(shape, offset))).reshape(
        [n + o for n, o in zip(shape, offset)]
    )
    region = tuple(slice(o, o + n) for n, o in zip(shape, offset))
    expected = whole_source[region].reshape(new)
    source = _ReadsRecorded(whole_source)
    span = span_reshape(SpanRead(source, region, piece), new)
    assert span.shape == expected.shape
    for _, box in _boxes(span.cuts()):
        np.testing.assert_array_equal(read_part(span, box, PieceReads()), expected[box])
    # A piece holds no more than the projection says, wherever the chunks' grid falls.
    most = math.prod(reshaped_piece(shape, new, piece, at_most=True))
    assert max(math.prod(s.stop - s.start for s in region) for region in source.regions) <= most
    # Any part of it, pieces or not, reads as numpy's.
    box = tuple(slice(a, data.draw(st.integers(a, n))) for n in new for a in [data.draw(st.integers(0, n))])
    np.testing.assert_array_equal(whole(span.narrowed(box)), expected[box])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_task_streaming_its_span(tmp_path, signum):
    # 40 GiB of metadata only (every chunk reads as the fill value), spanned: each task streams hundreds of
    # chunks for many seconds; a signal ends it between two chunks.
    zarr.create_array(tmp_path / "v.zarr", shape=(40_000, 512, 512), chunks=(2, 512, 512), dtype="f4")
    environment = {
        **os.environ,
        "DASK_DASKSTREAM__PLANNING__MAX_TASKS": "64",
        "DASK_DASKSTREAM__PLANNING__FIRST_TASK_WITHIN": "null",
    }
    command = ["reduce", str(tmp_path / "v.zarr"), "--op", "mean", "--memory-budget", "256MiB", "--quiet"]
    # Signalled past the start and into the spans' reading.
    status, lines = signalled_command(command, signum, after=6, within=30, environment=environment)
    assert_stopped_by(status, lines, signum)


@pytest.mark.parametrize(
    "keywords",
    [{}, {"axis": 0}, {"axis": (0, 2), "bins": 5, "range": (-2, 2)}, {"bins": 7}, {"quartiles": True}],
    ids=["whole", "per column", "with a histogram", "over the data's range", "with quartiles"],
)
def test_describe_streams_spans_to_numpys_statistics(span_field, spanned, keywords):
    data, paths = span_field
    x, _ = opened(paths["zarr"])
    axes = keywords.get("axis")
    twice = (data * 2).astype("f8")
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = ds.describe(x * 2, **keywords).compute()
    np.testing.assert_array_equal(got["count"], np.sum(~np.isnan(twice), axis=axes))
    np.testing.assert_array_equal(got["nan_count"], np.sum(np.isnan(twice), axis=axes))
    np.testing.assert_allclose(got["mean"], np.nanmean(twice, axis=axes), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got["std"], np.nanstd(twice, axis=axes), rtol=1e-6)
    np.testing.assert_array_equal(got["min"], np.nanmin(data * 2, axis=axes))
    np.testing.assert_array_equal(got["max"], np.nanmax(data * 2, axis=axes))
    if "bins" in keywords and axes is None:
        values = (data * 2)[~np.isnan(data)]
        counts, edges = np.histogram(values, bins=keywords["bins"], range=keywords.get("range"))
        np.testing.assert_array_equal(got["histogram"], counts)
        np.testing.assert_allclose(got["bin_edges"], edges, rtol=1e-6)
    if keywords.get("quartiles"):
        np.testing.assert_allclose(got["50%"], np.nanquantile(data * 2, 0.5), rtol=1e-6)
    # Whole passes over the data: one; a second where the data's range decides the bins; the quartiles'
    # counting passes beside the statistics' one.
    passes = meter.bytes_read / data.nbytes
    if keywords.get("quartiles"):
        assert passes == int(passes) >= 2
    else:
        assert passes == (2 if "bins" in keywords and "range" not in keywords else 1)


def test_reductions_of_one_source_computed_together_read_it_once(span_field, spanned):
    data, paths = span_field
    x, _ = opened(paths["zarr"])
    wanted = (np.nanmean(x), np.nanstd(x), np.nanmax(x, axis=(1, 2)), (x * 2).min(axis=0))
    answers = (
        np.nanmean(data, dtype="f8"),
        np.nanstd(data.astype("f8")),
        np.nanmax(data, axis=(1, 2)),
        (data * 2).min(axis=0),
    )
    assert ds.plan_compute(*wanted).bytes_to_read == data.nbytes  # the plan says so beforehand
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = dask.compute(*wanted)
    for value, answer in zip(got, answers, strict=True):
        np.testing.assert_allclose(value, answer, rtol=2e-6, equal_nan=True)
    # Each chunk read once for all four: one task per span reads it and folds it into every partial.
    assert meter.bytes_read == data.nbytes
    # Apart, each reads the source itself.
    with dask.config.set(scheduler="threads"), ReadMeter() as apart:
        np.nanmean(x).compute()
        np.nanstd(x).compute()
    assert apart.bytes_read == 2 * data.nbytes


_RANDOM = np.random.default_rng(47)
# Positions along time, in order and in no order, and what the plan says beside how many times over they read.
POSITIONS = {
    "every seventh row": (np.arange(0, 24_000, 7), False),
    "rows in order, some twice": (np.sort(_RANDOM.integers(0, 24_000, 5_000)), False),
    "5,000 rows in no order": (_RANDOM.integers(0, 24_000, 5_000), True),
    "every row in no order": (_RANDOM.permutation(24_000), True),
    "the last rows backwards, in no order after a slice": (_RANDOM.permutation(9_000)[::-1], True),
}


@pytest.mark.parametrize("positions", sorted(POSITIONS))
@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside a sum of the whole"])
def test_the_plan_says_how_much_an_index_of_positions_reads(span_field, spanned, positions, beside):
    data, paths = span_field
    x, _ = opened(paths["zarr"])
    rows, unordered = POSITIONS[positions]
    sliced = "slice" in positions
    picked, expected = (x[15_000:][rows], data[15_000:][rows]) if sliced else (x[rows], data[rows])
    wanted = [np.nanmax(picked, axis=0)]
    if beside:  # a reduction of the whole computed with it: its pieces are not the taken ones
        wanted.append(np.nansum(x, axis=0, dtype="f8"))
    computation = ds.plan_compute(*wanted)
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = dask.compute(*wanted)
    np.testing.assert_array_equal(got[0], np.nanmax(expected, axis=0))
    if beside:
        np.testing.assert_allclose(got[1], np.nansum(data, axis=0, dtype="f8"), rtol=1e-6)
    # The plan counts beforehand what a piece of the result reads: each chunk once per piece it feeds, the
    # rows from the first it takes there to the last. In no order, many times the array; in order, the array
    # once (a little less, where the positions leave the last rows of a chunk out).
    if unordered:
        assert computation.bytes_to_read == pytest.approx(meter.bytes_read, rel=0.01)
    else:
        assert (
            computation.bytes_to_read
            == computation.passes * data.nbytes
            >= meter.bytes_read
            > 0.99 * (computation.passes * data.nbytes)
        )
    again = computation.read_again.get(paths["zarr"], 0.0)
    assert (again > 1) is unordered
    text = computation.explain()
    assert ("read again by indices with positions in no order" in text) is unordered
    assert computation.projected_peak_bytes <= computation.budget  # nothing held for a second consumer


def test_the_plan_counts_each_step_gathering_picked_rows_anew(span_field, spanned):
    data, paths = span_field
    x, _ = opened(paths["zarr"])
    rows = np.sort(_RANDOM.choice(24_000, 8_000, replace=False))
    # xarray's sum skips NaN through where(isnull(v), 0, v): two steps taking the picked rows, each gathering them.
    result = _labelled(x).isel(t=rows).sum(dtype="f8").data
    computation = ds.plan_compute(result)
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = result.compute()
    assert got == pytest.approx(np.nansum(data[rows], dtype="f8"), rel=1e-6)
    assert 1.5 * data.nbytes < meter.bytes_read <= computation.bytes_to_read == 2 * data.nbytes


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
def test_a_task_checks_its_source_once_not_around_every_chunk(span_field, spanned, monkeypatch, fmt):
    data, paths = span_field
    x, plan = opened(paths[fmt])
    source_class = type(ds.open_source(paths[fmt]))
    reads = Reads(monkeypatch, source_class)
    checks = []
    check = source_class.check_unchanged
    monkeypatch.setattr(source_class, "check_unchanged", lambda source: checks.append(1) or check(source))
    got = float(np.nanmax(x).compute(scheduler="sync"))
    assert got == float(np.nanmax(data))
    # Before its first chunk and after its last, per task: not on both sides of every chunk (several system
    # calls each, for a Zarr store).
    spans = x.npartitions
    assert len(reads.sizes) == plan.n_tasks > 4 * spans
    assert len(checks) <= 2 * spans


def test_a_source_changed_while_a_task_streams_its_span_is_caught(tmp_path, spanned, monkeypatch):
    from daskstream.errors import SourceChangedError

    data = np.random.default_rng(3).standard_normal((24_000, 40, 6)).astype("f4")
    path = tmp_path / "a.npy"
    np.save(path, data)
    x, plan = opened(str(path))
    read = NpySource.__getitem__
    count = []

    def touching(source, region):
        count.append(1)
        # The file changed before the last task's last chunk: no read checks it after, and no task comes after.
        if len(count) == plan.n_tasks - 1:
            os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
        return read(source, region)

    monkeypatch.setattr(NpySource, "__getitem__", touching)
    with pytest.raises(SourceChangedError, match=r"a\.npy"):
        np.nanmax(x).compute(scheduler="sync")
    assert len(count) == plan.n_tasks  # each chunk read once: the check after the span's last caught it
