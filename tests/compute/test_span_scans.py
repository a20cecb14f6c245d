"""Cumulative sums and products over spans: each piece scanned and offset by the pieces before it along the
axis, the carry past a span being that span scanned to its end; numpy gives the answers."""

from __future__ import annotations

import operator
import pickle

import dask
import numpy as np
import pytest
import zarr
from dask._task_spec import Task, TaskRef
from dask.blockwise import blockwise_token
from span_helpers import BUDGET, Reads

import daskstream as ds
from daskstream.compute.streaming.span_scans import Scanned
from daskstream.compute.streaming.spans import Reads as SpanReads
from daskstream.compute.streaming.spans import Step
from daskstream.graph.reads import SpanRead
from daskstream.runtime.metering import ReadMeter

# Running counts are integers: exact whatever the order of the additions, as float sums are not.
SCANS = {
    "running count of positives, its last row": (
        lambda x: np.cumsum(x > 0, axis=0)[-1],
        lambda a: np.cumsum(a > 0, axis=0)[-1],
    ),
    "running count of positives, its largest per row": (
        lambda x: np.cumsum(x > 0, axis=0).max(axis=(1, 2)),
        lambda a: np.cumsum(a > 0, axis=0).max(axis=(1, 2)),
    ),
    "running count along the second axis, summed over time": (
        lambda x: np.cumsum(x > 0, axis=1).sum(axis=0),
        lambda a: np.cumsum(a > 0, axis=1).sum(axis=0),
    ),
    "running sum ignoring the NaN, rows around a span's edge": (
        lambda x: np.nancumsum(x[:, :3, :2].astype("f8"), axis=0)[5_995:6_005],
        lambda a: np.nancumsum(a[:, :3, :2].astype("f8"), axis=0)[5_995:6_005],
    ),
    "running product of a slice off the grid": (
        lambda x: np.cumprod(1 + (x[777:, 5] > 1) * 1e-3, axis=0).max(),
        lambda a: np.cumprod(1 + (a[777:, 5] > 1) * 1e-3, axis=0).max(),
    ),
}


@pytest.mark.parametrize("scan", sorted(SCANS))
def test_a_cumulative_step_streams_spans_to_numpys_answer(span_field, spanned, monkeypatch, scan):
    data, paths = span_field
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    plan = ds.plan(paths["zarr"], memory_budget=BUDGET)
    build, oracle = SCANS[scan]
    result = build(x)
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])))
    with dask.config.set(scheduler="threads", num_workers=2), ReadMeter() as meter:
        got = result.compute()
    # Sums of pieces, then of spans, in float64: within its rounding where the values are floats.
    np.testing.assert_allclose(got, oracle(data), rtol=1e-9)
    # One chunk at a time, and no span read more than twice: once for its own values, once for the carry
    # past it (the last span never for a carry), as the plan says beforehand.
    assert max(reads.sizes) <= plan.chunk_bytes < x.nbytes / x.npartitions
    assert meter.bytes_read <= ds.plan_compute(result).bytes_to_read <= 2 * data.nbytes


def test_a_whole_running_count_reads_each_span_at_most_twice(span_field, spanned):
    data, paths = span_field
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    spans = x.numblocks[0]
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = np.cumsum(x > 0, axis=0).sum().compute()
    assert got == np.cumsum(data > 0, axis=0).sum()
    # Each span for its values, each but the last once more for the carry past it.
    assert meter.bytes_read == data.nbytes * (2 * spans - 1) // spans
    # The plan says beforehand that the source is read twice, and why.
    text = ds.plan_compute(np.cumsum(x > 0, axis=0).sum()).explain()
    assert f"read by each step taking its spans in one pass: {paths['zarr']} 2 times" in text


def test_a_running_count_runs_on_the_processes_scheduler(span_field, spanned):
    data, paths = span_field
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    got = np.cumsum(x > 0, axis=0).max(axis=0).compute(scheduler="processes", num_workers=2)
    np.testing.assert_array_equal(got, np.cumsum(data > 0, axis=0).max(axis=0))


def test_a_scan_pickles_without_its_progress(span_field):
    data, paths = span_field
    source = ds.open_source(paths["zarr"])
    step = Step(Task("scan", np.cumsum, TaskRef(blockwise_token(0)), axis=0), ((0, 1, 2),))
    span = SpanRead(source, (slice(0, 600), slice(0, 40), slice(0, 6)), (20, 40, 6))
    scanned = Scanned(step, span, 0, operator.add)
    rows = (slice(40, 60), slice(0, 40), slice(0, 6))
    first = scanned.value(rows, SpanReads())  # carried on from rows 0 to 40
    assert scanned._carries  # where this thread got to
    copy = pickle.loads(pickle.dumps(scanned))
    # The copy is what it scans, without the carries this process made: it starts from the span's start.
    assert copy._carries == {}
    np.testing.assert_array_equal(copy.value(rows, SpanReads()), first)
    np.testing.assert_allclose(first, np.cumsum(data[:600], axis=0)[40:60], atol=1e-4)  # float32, in pieces


def test_a_running_count_stores_to_zarr(span_field, spanned, tmp_path):
    data, paths = span_field
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    ds.store(np.cumsum(x > 0, axis=0).astype("i4"), str(tmp_path / "counts.zarr"))
    written = zarr.open_array(tmp_path / "counts.zarr", mode="r")
    np.testing.assert_array_equal(written[:], np.cumsum(data > 0, axis=0))


def test_a_scan_holds_one_chunk_however_it_is_asked(span_field, spanned, monkeypatch):
    data, paths = span_field
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    plan = ds.plan(paths["zarr"], memory_budget=BUDGET)
    held = []
    read = SpanReads.__call__

    def counted(reads, span, box):
        block = read(reads, span, box)
        held.append(sum(value.nbytes for value in reads._read.values()))
        return block

    monkeypatch.setattr(SpanReads, "__call__", counted)
    counts = np.cumsum(x > 0, axis=0)
    with dask.config.set(scheduler="threads"), ReadMeter() as meter:
        got = (counts * counts).sum().compute()  # each piece of the scan asked for twice
    expected = np.cumsum(data > 0, axis=0)
    assert got == (expected * expected).sum()
    # The totals past each span and the pieces of each span read one chunk at a time, however many steps
    # ask for a piece: never a span's chunks at once, never more than twice over.
    assert max(held) <= plan.chunk_bytes
    assert meter.bytes_read <= 2 * data.nbytes


def test_a_scan_along_an_axis_counted_from_the_end_gives_numpys_answer(span_field, spanned):
    data, paths = span_field
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    scanned = (x > 0).astype("i8").map_blocks(np.cumsum, axis=-3)  # each block's own scan, as written
    np.testing.assert_array_equal(
        scanned.sum(axis=0).compute(scheduler="threads"),
        sum(np.cumsum(block > 0, axis=0).sum(axis=0) for block in np.split(data, np.cumsum(x.chunks[0])[:-1])),
    )
