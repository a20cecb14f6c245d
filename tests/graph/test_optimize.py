"""Whole computations over files, with plain dask operators: numpy's answers, in the fewest passes, planned
and refused before anything is read when they cannot fit.
"""

from __future__ import annotations

import dask
import dask.array as da
import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import DaskstreamError, MemoryBudgetError
from daskstream.runtime.metering import ReadMeter
from daskstream.views import compute_plan_html

SHAPE = (600, 256)
# A budget an eighth of the array: statistics over all of it need a pass of their own.
BUDGET = 96 * 2**10


@pytest.fixture
def field(tmp_path):
    rng = np.random.default_rng(3)
    data = (rng.standard_normal(SHAPE) * 2 + 5).astype("f4")
    npy = tmp_path / "field.npy"
    np.save(npy, data)
    other = (rng.standard_normal(SHAPE) + 1).astype("f4")
    # Storage chunks small enough for a task's share of the budget to decode one.
    zarr.create_array(tmp_path / "other.zarr", shape=SHAPE, chunks=(20, 64), dtype="f4")[...] = other
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("x", data=other, chunks=(9, 128), compression="gzip")
    return {"npy": str(npy), "zarr": str(tmp_path / "other.zarr"), "h5": f"{tmp_path / 'other.h5'}::x"}, data, other


def read_twice_as_much(meter, passes, nbytes):
    return meter.bytes_read == passes * nbytes


COMPOSITIONS = {
    # (what a user writes, numpy's answer, passes over the data)
    "centering": (lambda x: ds.reduce(x - x.mean(), "std"), lambda a: np.std(a - a.mean(dtype="f8")), 2),
    "anomaly-axis-0": (lambda x: (x - x.mean(axis=0)).std(axis=0), lambda a: (a - a.mean(axis=0)).std(axis=0), 2),
    "anomaly-axis-1": (
        lambda x: (x - x.mean(axis=1, keepdims=True)).max(),
        lambda a: (a - a.mean(axis=1, keepdims=True)).max(),
        1,  # a block holds whole rows: each row's mean is known within its block
    ),
    "standardizing": (
        lambda x: (x - x.mean(axis=0)) / x.std(axis=0),
        lambda a: (a - a.mean(axis=0)) / a.std(axis=0),
        2,
    ),
    "global-max": (lambda x: x / x.max(), lambda a: a / a.max(), 2),
    "above-a-quantile": (
        lambda x: da.where(x > ds.reduce(x, "quantile", q=0.99), x, 0).sum(),
        lambda a: np.where(a > np.quantile(a, 0.99), a, 0).sum(),
        # A radix select over float32 in 8-bit digits (16-bit counts would not fit this budget), then the
        # selection: four passes and one.
        5,
    ),
}


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_compositions_equal_numpy_in_the_fewest_passes(field, name, scheduler):
    paths, data, _ = field
    build, oracle, passes = COMPOSITIONS[name]
    with ds.session(scheduler, progress=False) as s:
        x = ds.open(paths["npy"], memory_budget=BUDGET)
        y = build(x)
        assert ds.plan_compute(y).passes == passes
        with ReadMeter(s) as meter:
            (got,) = s.compute(y)
    np.testing.assert_allclose(got, oracle(data), rtol=2e-5, atol=2e-5)
    assert meter.bytes_read == passes * data.nbytes


def test_several_results_computed_together_share_their_passes(field):
    paths, data, _ = field
    x = ds.open(paths["npy"], memory_budget=BUDGET)
    with ReadMeter() as meter:
        mean, centred_std, ratio_max = dask.compute(x.mean(), (x - x.mean()).std(), (x / x.max()).max())
    np.testing.assert_allclose(
        [mean, centred_std, ratio_max], [data.mean(), (data - data.mean()).std(), 1.0], rtol=1e-5
    )
    # The mean and the maximum in one pass, the centred and scaled work in a second: not one pass each.
    assert meter.bytes_read == 2 * data.nbytes


@pytest.mark.parametrize("other", ["zarr", "h5"])
def test_element_wise_work_between_sources_of_different_formats_and_chunks(field, other):
    paths, data, second = field
    x = ds.open(paths["npy"], memory_budget=BUDGET)
    y = ds.open(paths[other], memory_budget=BUDGET)
    assert x.chunks != y.chunks
    with ReadMeter() as meter:
        got = ((x - y) / (x + y).mean()).std().compute()
    np.testing.assert_allclose(got, ((data - second) / (data + second).mean()).std(), rtol=1e-5)
    # Two passes over each source (the mean, then the result), read in the chunks the work needs.
    assert meter.bytes_read == 2 * (data.nbytes + second.nbytes)


def test_the_plan_says_what_each_pass_reads_and_does(field):
    paths, _data, _ = field
    x = ds.open(paths["npy"], memory_budget=BUDGET)
    plan = ds.plan_compute(ds.reduce(x - x.mean(), "std"))
    text = plan.explain()
    assert plan.passes == 2
    assert "Passes over the data: 2" in text
    assert "pass 1: reads" in text
    assert "pass 2: reads" in text
    assert "again" in text
    assert plan.projected_peak_bytes <= plan.budget == BUDGET
    assert plan.worst is not None
    assert plan.worst.peak_bytes * plan.concurrency <= plan.projected_peak_bytes
    assert {name for name, _ in plan.worst.terms} <= {
        "input",
        "decoded copy",
        "halo",
        "intermediate",
        "workspace",
        "output",
    }
    assert "projected peak" in compute_plan_html(plan)


def test_a_plan_that_cannot_fit_is_refused_before_a_byte_is_read(field):
    paths, _, _ = field
    # Chunks chosen by hand, far larger than a task's share of the budget.
    x = ds.open(paths["npy"], chunks=(600, 256), memory_budget=64 * 2**10)
    with ReadMeter() as meter, pytest.raises(MemoryBudgetError) as refused:
        (x - x.mean()).std().compute()
    assert meter.bytes_read == 0
    message = str(refused.value)
    assert "over its memory budget of 64.00 kiB" in message
    assert "input" in message
    assert isinstance(refused.value, MemoryError)
    assert isinstance(refused.value, DaskstreamError)


def test_graphs_without_daskstream_sources_are_left_to_dask(tmp_path):
    from dask.array.optimization import optimize as dask_optimize

    from daskstream.graph.optimize import optimize

    x = da.from_array(np.arange(1000.0), chunks=100)
    y = (x - x.mean()).std()
    ours = optimize(y.__dask_graph__(), y.__dask_keys__())
    theirs = dask_optimize(y.__dask_graph__(), y.__dask_keys__())
    assert set(dict(ours)) == set(dict(theirs))


def test_the_rewrite_can_be_turned_off(field):
    paths, data, _ = field
    x = ds.open(paths["npy"], memory_budget=BUDGET)
    with dask.config.set({"daskstream.compute.rewrite": False}), ReadMeter() as meter:
        got = ds.reduce(x - x.mean(), "std").compute()
    np.testing.assert_allclose(got, np.std(data - data.mean()), rtol=1e-5)
    assert meter.bytes_read == data.nbytes  # shared reads, held between the mean and the rest


def test_store_of_a_two_pass_composition_writes_numpys_answer(field, tmp_path):
    paths, data, _ = field
    x = ds.open(paths["npy"], memory_budget=BUDGET)
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    expected = (data - data.mean(axis=0)) / data.std(axis=0)
    for target in (tmp_path / "z.zarr", f"{tmp_path / 'z.h5'}::/z"):
        with ReadMeter() as meter:
            written = ds.store(z, target)
        np.testing.assert_allclose(written.compute(), expected, rtol=1e-5, atol=1e-5)
        # HDF5 computes the statistics once, not once per batch of blocks.
        assert meter.bytes_read == 2 * data.nbytes


@pytest.mark.parametrize("axis", [0, 1])
def test_cumulative_sums_are_planned_and_give_numpys_answer(field, axis):
    # A cumsum's layer holds keys named as itself with a name inside ('cumsum-…', 'extra', i, j): describing
    # it once raised a TypeError (keys that did not compare) and took the layer for one of its own inputs.
    paths, data, _ = field
    x = ds.open(paths["npy"], chunks=(100, 64))
    np.testing.assert_allclose(
        np.cumsum(x, axis=axis).sum(axis=axis).compute(), np.cumsum(data, axis=axis).sum(axis=axis), rtol=1e-5
    )
    np.testing.assert_allclose(np.cumsum(x, axis=axis)[3:250].compute(), np.cumsum(data, axis=axis)[3:250], rtol=1e-5)


# numpy's element-wise functions that are not ufuncs, as dask maps them over blocks.
ELEMENT_WISE_FUNCTIONS = {
    "clip": lambda m, x: m.clip(x, -1, 1),
    "round": lambda m, x: m.round(x, 2),
    "nan_to_num": lambda m, x: m.nan_to_num(x),
    "fix": lambda m, x: m.fix(x),
    "angle": lambda m, x: m.angle(x),
    "isreal": lambda m, x: m.isreal(x),
    "iscomplex": lambda m, x: m.iscomplex(x),
}


@pytest.mark.parametrize("dtype", ["f2", "f4", "f8"])
@pytest.mark.parametrize("name", sorted(ELEMENT_WISE_FUNCTIONS))
def test_an_element_wise_function_holds_no_more_than_its_projection(name, dtype):
    import tracemalloc

    apply = ELEMENT_WISE_FUNCTIONS[name]
    block = np.random.default_rng(5).standard_normal((512, 512)).astype(dtype)
    block[0, :3] = [np.nan, np.inf, -np.inf]
    worst = ds.plan_compute(apply(da, da.from_array(block, chunks=block.shape))).worst
    tracemalloc.start()
    try:
        result = apply(np, block)
        _, held = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.shape == block.shape
    # Beside its input (allocated before), what it held at its peak, output included.
    assert block.nbytes + held <= worst.peak_bytes
