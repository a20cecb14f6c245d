"""Quantiles along axes hold the columns their speed needs, not what the budget would allow."""

from __future__ import annotations

import dask
import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.planning.columns import LARGEST_TASK_BYTES


def _column_task_bytes(result, reduced_length, itemsize=4):
    """Bytes of columns the largest task of a quantile along the first axis holds, from its output chunks."""
    return reduced_length * itemsize * max(np.prod([max(c) for c in result.chunks]), 1)


@pytest.mark.parametrize("storage", [(1, 721, 1440), (24, 90, 180)], ids=["a-day-per-chunk", "blocks"])
def test_a_percentile_over_time_of_a_field_too_large_for_memory_keeps_small_tasks_whatever_the_budget(
    tmp_path, storage
):
    path = tmp_path / "era.zarr"
    zarr.create_array(str(path), shape=(8760, 721, 1440), chunks=storage, dtype="f4")  # 34 GiB, virtual
    plans = []
    for budget in ("4GiB", "64GiB", "1TiB"):
        x = ds.open(path, memory_budget=budget)
        result = ds.reduce(x, "quantile", q=0.95, axis=0)
        assert result.shape == (721, 1440)
        assert _column_task_bytes(result, 8760) <= LARGEST_TASK_BYTES
        plans.append(result.chunks)
    # The budget is a ceiling: a larger one buys no larger tasks.
    assert plans[0] == plans[1] == plans[2]


def test_a_column_larger_than_the_budgets_share_is_refused_by_name(tmp_path):
    path = tmp_path / "long.zarr"
    zarr.create_array(str(path), shape=(2**24, 4), chunks=(2**16, 4), dtype="f4")
    x = ds.open(path, memory_budget="64MiB")
    with pytest.raises(ds.DaskstreamError, match="does not fit the per-task budget"):
        ds.reduce(x, "quantile", q=0.5, axis=0)


@pytest.mark.parametrize("chunks", [(1, 40, 60), (73, 20, 30), None], ids=["day", "blocks", "contiguous"])
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_per_pixel_percentiles_of_a_stored_field_are_numpys(tmp_path, chunks, compression):
    data = np.random.default_rng(1).standard_normal((365, 40, 60)).astype("f4")
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=data, chunks=chunks, compression=compression if chunks else None)
    x = ds.open(f"{path}::/t")
    got = ds.reduce(x, "quantile", q=[0.05, 0.95], axis=0).compute()
    np.testing.assert_array_equal(got, np.quantile(data, [0.05, 0.95], axis=0))
    got = ds.reduce(x, "median", axis=(0, 2)).compute()
    np.testing.assert_array_equal(got, np.median(data, axis=(0, 2)))


@pytest.mark.parametrize(("budget", "route"), [("64MiB", "in memory"), ("2MiB", "by radix select")])
def test_a_quantile_over_all_values_takes_the_fastest_exact_route_that_fits_and_says_why(tmp_path, budget, route):
    path = tmp_path / "values.npy"
    values = np.random.default_rng(8).standard_normal((2000, 300)).astype("f4")
    np.save(path, values)
    x = ds.open(path, memory_budget=budget)
    result = ds.reduce(x, "quantile", q=[0.1, 0.9])
    routes = [line for line in ds.plan_compute(result).explain().splitlines() if line.startswith("Route: ")]
    assert len(routes) == 1
    assert route in routes[0]
    assert ("do not fit" in routes[0]) is (route != "in memory")
    with dask.config.set(scheduler="threads", num_workers=2):
        np.testing.assert_array_equal(result.compute(), np.quantile(values, [0.1, 0.9]))
