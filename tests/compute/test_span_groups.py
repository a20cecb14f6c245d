"""Groupby-style reductions over spans: flox's map-reduce steps reduce each piece of a span by group, the
partials combined with flox's own combine as they come; xarray over the data in memory gives the answers."""

from __future__ import annotations

import math
import pickle
import warnings

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from span_helpers import BUDGET, SPANNED, Reads

import daskstream as ds
from daskstream.errors import MemoryBudgetError
from daskstream.runtime.metering import ReadMeter

# Latitudes first: a span grows along the first axis first, so each holds both pieces of the latitudes, and
# the partials of its pieces join along an axis the reduction keeps.
SHAPE = (40, 24_000, 6)  # six-hourly from 2000: 16 years and a half
STORAGE = (20, 1_500, 6)  # 720 kB: a piece is one chunk, half the latitudes


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """A six-hourly field with a NaN as a Zarr store xarray writes, and the field in memory."""
    folder = tmp_path_factory.mktemp("groups")
    data = np.random.default_rng(11).standard_normal(SHAPE).astype("f4")
    data[3, 5, 2] = np.nan
    times = pd.date_range("2000-01-01", periods=SHAPE[1], freq="6h")
    field = xr.DataArray(data, dims=("lat", "time", "lon"), coords={"time": times}, name="t")
    path = str(folder / "t.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note on consolidated metadata in format 3
        field.to_dataset().to_zarr(
            path, encoding={"t": {"chunks": STORAGE, "_FillValue": None}}, zarr_format=3, consolidated=False
        )
    return field, path


def spanned_field(path, field):
    """The store's array read in spans, with the field's labels."""
    x = ds.open(f"{path}::t", memory_budget=BUDGET)
    plan = ds.plan(f"{path}::t", memory_budget=BUDGET)
    assert plan.span is not None
    assert math.prod(plan.span) > 1
    assert x.chunks[0] == (SHAPE[0],)  # a span holds both pieces of the latitudes
    return xr.DataArray(x, dims=field.dims, coords=field.coords), plan


GROUPED = {
    "monthly mean": lambda v: v.groupby("time.month").mean(),
    "monthly maximum": lambda v: v.groupby("time.month").max(),
    "seasonal standard deviation": lambda v: v.groupby("time.season").std(),
    "sum per hour of the day, in float64": lambda v: v.astype("f8").groupby("time.hour").sum(),
    "values per month": lambda v: v.groupby("time.month").count(),
    "monthly mean over the longitudes": lambda v: v.groupby("time.month").mean(("time", "lon")),
}


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_a_groupby_reduction_streams_spans_to_xarrays_answer(labelled, spanned, monkeypatch, name):
    field, path = labelled
    v, plan = spanned_field(path, field)
    reads = Reads(monkeypatch, type(ds.open_source(f"{path}::t")))
    result = GROUPED[name](v)
    assert ds.plan_compute(result.data).bytes_to_read == field.nbytes  # one pass, as the plan says beforehand
    with dask.config.set(scheduler="threads", num_workers=2), ReadMeter() as meter:
        got = result.compute()
    want = GROUPED[name](field)
    xr.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # float32 partials, summed in another order
    # Every chunk read once, one at a time: no block of a span is ever held.
    assert meter.bytes_read == field.nbytes
    assert max(reads.sizes) == math.prod(STORAGE) * 4 == plan.chunk_bytes
    assert len(reads.sizes) == plan.n_tasks


def test_labelled_data_too_large_for_whole_periods_is_read_in_spans(labelled, spanned):
    field, path = labelled
    v = ds.open_dataset(path, memory_budget=BUDGET)["t"]
    # Chunks of whole years outnumber what a graph may hold: spans, whose months flox reduces piece by piece.
    assert v.data.npartitions <= SPANNED["daskstream.planning.max-tasks"]
    result = v.groupby("time.month").mean()
    said = str(ds.plan_compute(result.data))
    assert "Passes over the data: 1" in said
    assert "pass 2" not in said
    got = result.compute()
    xr.testing.assert_allclose(got, field.groupby("time.month").mean(), rtol=1e-5, atol=1e-6)


def test_grouped_spans_run_on_the_processes_scheduler(labelled, spanned):
    field, path = labelled
    v, _ = spanned_field(path, field)
    result = v.groupby("time.season").max()
    pickle.loads(pickle.dumps(result.data.__dask_graph__()))
    got = result.compute(scheduler="processes", num_workers=2)
    xr.testing.assert_equal(got, field.groupby("time.season").max())


def test_a_groupby_flox_does_not_map_and_reduce_is_refused_before_any_read(labelled, spanned, monkeypatch):
    field, path = labelled
    v, _ = spanned_field(path, field)
    reads = Reads(monkeypatch, type(ds.open_source(f"{path}::t")))
    # A median per year is computed by flox on whole groups: the spans' blocks taken whole, past the budget.
    with pytest.raises(MemoryBudgetError, match="groupby reductions"):
        v.groupby("time.year").median().compute()
    assert reads.sizes == []


def test_floxs_first_step_is_projected_as_the_partials_it_makes(labelled):
    from daskstream.graph.flox_steps import flox_chunk_step
    from daskstream.graph.layers import describe

    _, path = labelled
    v = ds.open_dataset(path)["t"]  # read in blocks, not spans
    graph = v.groupby("time.month").mean().data.__dask_graph__()
    name = next(n for n in graph.layers if "-chunk-" in n)
    step = flox_chunk_step(graph.layers[name].task.func)
    assert step is not None
    assert step.groups == 12  # the months
    assert step.intermediate_bytes == 4 + 8  # a float32 sum and an int64 count
    # dask annotates the step with its input's blocks; each makes a value per month and intermediate instead.
    block = [max(lengths) for lengths in graph.layers[name].collection_annotations["chunks"]]
    kept = math.prod(n for axis, n in enumerate(block) if axis not in step.axis)
    rows = math.prod(block[axis] for axis in step.axis)
    assert step.block_bytes(tuple(block)) == kept * min(rows, 12) * 12 < math.prod(block) * 4
    facts = {f.name: f for f in describe(graph).facts}
    assert facts[name].block_bytes <= step.block_bytes(tuple(block))
    # Anything else is not taken for it.
    assert flox_chunk_step(np.sum) is None


@pytest.mark.parametrize("how", ["mean", "max", "std"])
def test_a_groupby_flox_reduces_by_cohorts_streams_spans_too(labelled, spanned, monkeypatch, how):
    field, path = labelled
    v, plan = spanned_field(path, field)
    grouped = v.groupby("time.month")
    result = getattr(grouped, how)(method="cohorts")  # each block's partial holds the months it found
    assert any("cohorts" in name for name in result.data.__dask_graph__().layers)
    reads = Reads(monkeypatch, type(ds.open_source(f"{path}::t")))
    with dask.config.set(scheduler="threads", num_workers=2):
        got = result.compute()
    xr.testing.assert_allclose(got, getattr(field.groupby("time.month"), how)(), rtol=1e-5, atol=1e-6)
    # The pieces of a span found different months: their partials were joined on all they found.
    assert len(reads.sizes) == plan.n_tasks


def test_a_climatology_of_an_hourly_terabyte_in_spans_is_planned_within_the_budget(tmp_path):
    import zarr

    # A terabyte of ERA5-like hours, metadata only (every chunk reads as the fill value), with its hours.
    hours = 2**40 // (721 * 1440 * 4)
    group = zarr.open_group(str(tmp_path / "era5.zarr"), mode="w", zarr_format=3)
    dims = ["time", "lat", "lon"]
    group.create_array("v", shape=(hours, 721, 1440), chunks=(24, 721, 1440), dtype="f4", dimension_names=dims)
    time = group.create_array("time", shape=(hours,), chunks=(2**20,), dtype="i8", dimension_names=["time"])
    time[:] = np.arange(hours)
    time.attrs.update(units="hours since 1950-01-01", calendar="proleptic_gregorian")
    with dask.config.set({"daskstream.planning.max-tasks": 2_000}):
        v = ds.open_dataset(str(tmp_path / "era5.zarr"))["v"]
        climatology = v.groupby("time.month").mean()  # flox reduces blocks of a few weeks by cohorts
        plan = ds.plan_compute(climatology.data)
    assert plan.spans is not None
    assert plan.tasks < hours // 24 // 4  # far fewer than the days stored: a task streams a span of them
    # Each block's partial holds the one or two months it found, not a row per hour: within the budget.
    assert plan.projected_peak_bytes <= plan.budget


def test_a_resample_flox_rechunks_is_refused_with_the_method_that_streams(labelled, spanned, monkeypatch):
    field, path = labelled
    v, _ = spanned_field(path, field)
    reads = Reads(monkeypatch, type(ds.open_source(f"{path}::t")))
    with pytest.raises(MemoryBudgetError, match='method="map-reduce"'):
        v.resample(time="1MS").mean().compute()  # flox rechunks to whole months first
    assert reads.sizes == []
    got = v.resample(time="1MS").mean(method="map-reduce").compute()
    xr.testing.assert_allclose(got, field.resample(time="1MS").mean(), rtol=1e-5, atol=1e-6)
