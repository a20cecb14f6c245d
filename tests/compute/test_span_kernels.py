"""Kernels with halos over spans: each task computes a span of the kernel's blocks one block at a time, each
block reading its haloed region, into the reductions, element-wise steps and stores that stream spans; scipy
and numpy give the answers."""

from __future__ import annotations

import math

import dask
import numpy as np
import pytest
import zarr
from span_helpers import BUDGET, SPANNED, Reads, write_field

import daskstream as ds
from daskstream.errors import MemoryBudgetError
from daskstream.runtime.metering import ReadMeter

ndimage = pytest.importorskip("scipy.ndimage")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The spans' field without its NaN (a NaN spreads through scipy's running sums to the end of its line,
    through a block's only to the block's end), as Zarr in chunks of 20 rows, written once: the tests only
    read it."""
    folder = tmp_path_factory.mktemp("field")
    data = np.nan_to_num(write_field(folder)[0])
    zarr.create_array(folder / "k.zarr", data=data, chunks=(20, 40, 6))
    return data, {"zarr": str(folder / "k.zarr")}


def moving(a, window=5):
    return ndimage.uniform_filter1d(a, window, axis=0, mode="reflect")


def twice_with_neighbours(block):
    """A kernel reading one cell of halo along the first axis: each cell plus the one before it."""
    out = block.astype("f8")
    out[1:] += block[:-1]
    return out


KERNELS = {
    "mean of a moving mean, per row": (
        lambda x: ds.kernels.moving_mean(x, 5).mean(axis=(1, 2)),
        lambda a: moving(a).mean(axis=(1, 2), dtype="f8"),
    ),
    "std of a gaussian filter": (
        lambda x: ds.kernels.gaussian_filter(x, 1.0).std(),
        lambda a: ndimage.gaussian_filter(a, 1.0, mode="reflect").astype("f8").std(),
    ),
    "largest departure from a moving mean, per column": (
        lambda x: (ds.kernels.moving_mean(x, 3) - x).max(axis=0),
        lambda a: (moving(a, 3) - a).max(axis=0),
    ),
    "where a map_blocks with a halo is largest": (
        lambda x: np.nanargmax(ds.map_blocks(twice_with_neighbours, x, depth={0: 1}, boundary=0, dtype="f8")),
        lambda a: np.nanargmax(twice_with_neighbours(a)),
    ),
}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_a_kernel_over_spans_streams_to_scipys_answer(stored, spanned, monkeypatch, kernel):
    data, paths = stored
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    plan = ds.plan(paths["zarr"], memory_budget=BUDGET)
    assert plan.span is not None
    build, oracle = KERNELS[kernel]
    result = build(x)
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])), "read")
    with dask.config.set(scheduler="threads", num_workers=2), ReadMeter() as meter:
        got = result.compute()
    np.testing.assert_allclose(got, oracle(data), rtol=2e-5, atol=2e-6)
    # Block by block: no read larger than a chunk of the plan with its halo (4 rows at most, the gaussian's
    # radius), never a span's whole block.
    haloed_chunk = math.prod((plan.chunks[0] + 2 * 4, *plan.chunks[1:])) * data.itemsize
    assert max(reads.sizes) <= haloed_chunk < x.nbytes / x.npartitions
    # Each cell read once, and once more for each step beside the kernel reading the source (x itself) and
    # for the halos around each block.
    takers = 2 if "departure" in kernel else 1
    assert takers * data.nbytes <= meter.bytes_read <= takers * data.nbytes * 1.02
    computation = ds.plan_compute(result)
    assert computation.spans is not None
    assert computation.projected_peak_bytes <= computation.budget


def test_a_kernel_keeps_the_spans_it_reads(stored, spanned):
    _, paths = stored
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    smooth = ds.kernels.moving_mean(x, 5)
    assert smooth.chunks == x.chunks  # so that it lines up with x, no rechunk between them
    graph = (x - smooth).__dask_graph__()
    assert not any("rechunk" in name for name in graph.layers)
    # Fewer tasks than chunks: one per span, whatever the kernel's blocks.
    assert smooth.npartitions == x.npartitions < ds.plan(paths["zarr"], memory_budget=BUDGET).n_tasks


def test_a_kernel_gets_spans_of_its_own_where_its_blocks_outnumber_the_graph(stored):
    data, paths = stored
    x = ds.open(paths["zarr"], memory_budget=BUDGET)  # no ceiling on tasks: read in chunks, not spans
    with dask.config.set(SPANNED):
        smooth = ds.map_blocks(twice_with_neighbours, x, depth={0: 1}, boundary=0, dtype="f8")
        blocks = ds.plan(paths["zarr"], memory_budget=BUDGET).n_tasks
        assert smooth.npartitions < blocks
        with dask.config.set(scheduler="threads"):
            got = smooth.sum(axis=0).compute()
    np.testing.assert_allclose(got, twice_with_neighbours(data).sum(axis=0), rtol=1e-9)
    # Without a ceiling, one task per block, as before.
    assert ds.map_blocks(twice_with_neighbours, x, depth={0: 1}, boundary=0, dtype="f8").npartitions >= blocks


def test_a_kernel_over_spans_stores_to_zarr_chunk_by_chunk(stored, spanned, tmp_path):
    data, paths = stored
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    target = tmp_path / "smooth.zarr"
    ds.store(ds.kernels.moving_mean(x, 5) * 2, str(target))
    written = zarr.open_array(target, mode="r")
    np.testing.assert_allclose(written[:], moving(data) * 2, rtol=1e-6, atol=1e-6)
    # Stored in the blocks the kernel computes, each a chunk of the target, none a span.
    assert written.chunks[0] * math.prod(written.chunks[1:]) * 4 < x.nbytes / x.npartitions


@pytest.mark.parametrize(
    ("step", "build"),
    [
        ("the result", lambda smooth: smooth),
        ("sort", lambda smooth: smooth.map_blocks(np.sort, axis=0).sum()),
    ],
)
def test_a_step_taking_a_kernels_whole_spans_is_refused_before_any_read(stored, spanned, monkeypatch, step, build):
    _, paths = stored
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    reads = Reads(monkeypatch, type(ds.open_source(paths["zarr"])), "read")
    with pytest.raises(MemoryBudgetError, match="spans of many chunks per task") as refused:
        build(ds.kernels.moving_mean(x, 5)).compute(scheduler="threads")
    assert f"{step} takes whole blocks of what uniform_filter1d makes of {paths['zarr']}" in str(refused.value)
    assert reads.sizes == []


def test_a_kernel_over_a_pebibyte_builds_a_graph_of_spans(tmp_path):
    # 1 PiB of float32 in 4096 x 4096 chunks, metadata only: every chunk reads as the fill value.
    side = 2**24
    zarr.create_array(tmp_path / "v.zarr", shape=(side, side), chunks=(4096, 4096), dtype="f4", fill_value=0)
    x = ds.open(str(tmp_path / "v.zarr"), memory_budget="8GiB")
    plan = ds.plan(str(tmp_path / "v.zarr"), memory_budget="8GiB")
    result = ds.kernels.moving_mean(x, 5).mean()
    computation = ds.plan_compute(result)
    # Tasks follow the spans, a few per span, not the kernel's blocks (a block per task made 2.8 million).
    assert computation.tasks <= 4 * plan.span_tasks
    assert computation.spans is not None
    assert computation.projected_peak_bytes <= computation.budget
    corner = ds.kernels.moving_mean(x[:8, :8], 5).mean().compute()
    assert corner == 0.0


def test_a_kernels_blocks_cut_the_spans_evenly_and_each_is_numbered_once(stored, spanned):
    _, paths = stored
    x = ds.open(paths["zarr"], memory_budget=BUDGET)
    seen = {}

    def noting(block, block_info=None):
        seen.setdefault(block_info[0]["chunk-location"], set()).add(block.shape)
        return block

    # In float64 with a halo on every axis, the blocks that fit a task are shorter than the spans' chunks.
    wide = x.astype("f8")
    ds.map_blocks(noting, wide, depth=4, boundary="reflect", dtype="f8").max().compute(scheduler="threads")
    # Every block of the kernel's grid is computed, each once and whole: none cut in two by a span's edge.
    assert all(len(shapes) == 1 for shapes in seen.values())
    rows = max(shape[0] for shapes in seen.values() for shape in shapes) - 8
    assert all(length % rows == 0 for length in x.chunks[0][:-1])
