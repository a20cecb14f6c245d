"""An aggregate whose blocks join the data read for it: over chunks that straddle its groups a climatology
joins every block read, so the anomaly from it reads the data again after it rather than holding all of
it; over chunks within its groups it joins the blocks of one group, which one pass holds. xarray over the
same file is the oracle."""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest
from dask.core import flatten

import daskstream as ds
from daskstream.errors import ChunkSplitWarning
from daskstream.graph.layers import describe, needed_layers, planned_with
from daskstream.graph.linking import source_links
from daskstream.graph.optimize import plan_graph

xr = pytest.importorskip("xarray")
pytest.importorskip("flox")

# Four years of a year per storage chunk (4.7 MB each: large enough that a rechunk of them is not read
# again piece by piece), 19 MB in all: more than a task's share (12 MiB) of the budget below.
DAYS, LAT, LON = 4 * 365, 40, 80
BUDGET = "24MiB"


@pytest.fixture(scope="module")
def daily(tmp_path_factory):
    path = tmp_path_factory.mktemp("linking") / "daily.nc"
    rng = np.random.default_rng(3)
    xr.Dataset(
        {"t": (("time", "lat", "lon"), (rng.standard_normal((DAYS, LAT, LON)) + 5).astype("f4"))},
        coords={"time": pd.date_range("2001-01-01", periods=DAYS, freq="D")},
    ).to_netcdf(path, engine="h5netcdf", encoding={"t": {"chunksizes": (365, LAT, LON)}})
    return path


def anomaly_std(t, group="time.month"):
    groups = t.groupby(group)
    return (groups - groups.mean()).std("time")


def opened(path, days):
    with pytest.warns(ChunkSplitWarning):  # 73 or 100 days of a year per storage chunk: read in parts
        return ds.open_dataset(path, memory_budget=BUDGET, chunks={"time": days})["t"]


def oracle(path, group="time.month"):
    return anomaly_std(xr.open_dataset(path, engine="h5netcdf")["t"].load(), group).values


def planned(result):
    graph, keys = result.__dask_graph__(), list(flatten(result.__dask_keys__()))
    return plan_graph(graph, keys, planned_with(graph))


def test_chunks_straddling_months_are_read_again_after_the_climatology(daily):
    result = anomaly_std(opened(daily, 73)).data
    graph, plan = planned(result)
    # One block of the climatology depends on one month of each year (2.7 MB, within a task's share), but a
    # block of 73 days holds parts of three months: months join blocks, and blocks months, to the whole field.
    assert plan.passes == 2
    gates = [name for name in graph.layers if name.startswith("after-")]
    assert gates, "the second pass's reads wait for the climatology"
    gated = [name for name, deps in graph.dependencies.items() if set(gates) & set(deps)]
    assert gated
    assert all(name.startswith("daskstream-") for name in gated)
    with dask.config.set(scheduler="threads", num_workers=2):
        np.testing.assert_allclose(result.compute(), oracle(daily), rtol=1e-5)


@pytest.mark.parametrize(("days", "straddle"), [(73, False), (100, True)])
def test_yearly_means_link_one_year_over_chunks_within_years(daily, days, straddle):
    # 73 days divide a year: each yearly mean joins the five blocks of its year, which one pass may hold.
    # Blocks of 100 days straddle years: the means join every block.
    t = opened(daily, days)
    result = anomaly_std(t, "time.year").data
    graph = result.__dask_graph__()
    described = describe(graph, needed_layers(graph, list(flatten(result.__dask_keys__()))))
    links = source_links(graph, described.facts)
    means = [f.name for f in described.facts if f.name.startswith("groupby_nanmean-") and f.inputs]
    year = LAT * LON * 4 * 365
    assert any(links(name, set(), year) for name in means) is straddle
    if not straddle:
        assert planned(result)[1].passes == 1
        with dask.config.set(scheduler="threads", num_workers=2):
            np.testing.assert_allclose(result.compute(), oracle(daily, "time.year"), rtol=1e-5)
