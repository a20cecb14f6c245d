"""Kernels whose blocks read their halos straight from storage: numpy's answer over the padded array,
one task per block, one pass, and deep halos refused before anything runs.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.errors import MemoryBudgetError
from daskstream.graph.halos import haloed, source_indices
from daskstream.graph.regions import ArrayRegions
from daskstream.runtime.metering import ReadMeter

NUMPY_PAD_MODE = {"reflect": "symmetric", "nearest": "edge", "periodic": "wrap"}


def padded(a, depth, boundary):
    """``a`` padded in memory the way a halo's ``boundary`` fills cells beyond the edges."""
    if boundary == "none":
        return a
    if boundary in NUMPY_PAD_MODE:
        return np.pad(a, depth, mode=NUMPY_PAD_MODE[boundary])
    return np.pad(a, depth, mode="constant", constant_values=boundary)


def stencil_oracle(a, depth, boundary, fn):
    """``fn`` over the whole array with its padding, trimmed back (for ``"none"``: over the array itself)."""
    out = fn(padded(a, depth, boundary))
    if boundary == "none":
        return out
    return out[tuple(slice(d, n - d) for d, n in zip(depth, out.shape))]


def laplacian(block):
    out = -4 * block
    out[1:-1] += block[:-2] + block[2:]
    out[:, 1:-1] += block[:, :-2] + block[:, 2:]
    return out


def box_sum(block):
    """Each cell plus its two neighbours along each axis: reaches exactly one cell."""
    out = block.copy()
    out[1:-1] += block[:-2] + block[2:]
    out[:, 1:-1] += block[:, :-2] + block[:, 2:]
    return out


def write(tmp_path, fmt, data, chunks):
    if fmt == "npy":
        path = str(tmp_path / "a.npy")
        np.save(path, data)
        return path
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=data.shape, chunks=chunks, dtype=data.dtype, overwrite=True)[...] = data
    return path


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    shape=st.tuples(st.integers(3, 40), st.integers(3, 40)),
    chunk=st.tuples(st.integers(1, 17), st.integers(1, 17)),
    depth=st.integers(1, 3),
    boundary=st.sampled_from(["reflect", "nearest", "periodic", "none", 0.0, 7.5]),
    fmt=st.sampled_from(["npy", "zarr"]),
)
def test_a_stencil_over_a_file_equals_numpy_over_the_padded_array(tmp_path, shape, chunk, depth, boundary, fmt):
    data = np.random.default_rng(sum(shape)).standard_normal(shape).astype("f8")
    path = write(tmp_path, fmt, data, chunk)
    x = ds.open(path, chunks=chunk)
    depth = tuple(min(depth, n) for n in shape)
    y = ds.map_blocks(box_sum, x, depth=depth, boundary=boundary)
    assert y.name.startswith("daskstream-regions-")
    np.testing.assert_allclose(y.compute(scheduler="sync"), stencil_oracle(data, depth, boundary, box_sum), rtol=1e-12)


@pytest.mark.parametrize("boundary", ["reflect", "periodic", "none"])
def test_chained_stencils_read_once_with_the_sum_of_their_halos(tmp_path, boundary):
    data = np.random.default_rng(1).standard_normal((120, 90)).astype("f4")
    x = ds.open(write(tmp_path, "zarr", data, (25, 30)), chunks=(25, 30))
    twice = ds.map_blocks(
        laplacian, ds.map_blocks(laplacian, x, depth=1, boundary=boundary), depth=1, boundary=boundary
    )
    inner = stencil_oracle(data, (1, 1), boundary, laplacian)
    with ReadMeter() as meter:
        got = twice.compute()
    np.testing.assert_allclose(got, stencil_oracle(inner, (1, 1), boundary, laplacian), rtol=1e-4, atol=1e-4)
    # One task per block, each reading its block with two cells of halo: about one pass, not three.
    assert len(dict(twice.__dask_graph__())) <= 2 * twice.npartitions + 2
    assert data.nbytes <= meter.bytes_read < 1.5 * data.nbytes


def test_a_stencil_over_standardized_data_computes_its_regions_from_the_source(tmp_path):
    data = (np.random.default_rng(2).standard_normal((2000, 64)) * 3 + 1).astype("f4")  # 500 KiB
    x = ds.open(write(tmp_path, "npy", data, None), memory_budget=64 * 2**10)
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    y = ds.map_blocks(laplacian, z, depth=1, boundary="nearest")
    assert y.name.startswith("daskstream-regions-")
    expected = stencil_oracle((data - data.mean(axis=0)) / data.std(axis=0), (1, 1), "nearest", laplacian)
    with ReadMeter() as meter:
        got = ds.reduce(y, "max").compute()
    np.testing.assert_allclose(got, expected.max(), rtol=1e-4)
    assert ds.plan_compute(ds.reduce(y, "max")).passes == 2
    assert meter.bytes_read < 2.5 * data.nbytes  # the statistics, then the stencil (its halos add a little)


def test_a_halo_too_deep_for_the_budget_is_refused_before_anything_runs(tmp_path):
    data = np.zeros((512, 512), dtype="f4")  # 1 MiB
    x = ds.open(write(tmp_path, "npy", data, None), memory_budget="128KiB")
    with ReadMeter() as meter, pytest.raises(MemoryBudgetError, match=r"halo of \(200, 200\) cells .*lower the depth"):
        ds.map_blocks(laplacian, x, depth=200)
    assert meter.bytes_read == 0


def test_blocks_shrink_to_fit_the_halo_within_the_budget(tmp_path):
    data = np.random.default_rng(4).standard_normal((2048, 256)).astype("f4")  # 2 MiB
    x = ds.open(write(tmp_path, "npy", data, None), chunks=(1024, 256), memory_budget="1MiB")
    y = ds.map_blocks(laplacian, x, depth=8)
    assert max(y.chunks[0]) < 1024
    plan = ds.plan_compute(y.sum())
    assert plan.projected_peak_bytes <= plan.budget
    np.testing.assert_allclose(y.compute(), stencil_oracle(data, (8, 8), "reflect", laplacian), rtol=1e-5, atol=1e-5)


def test_kernels_asking_for_block_info_get_the_haloed_blocks_place(tmp_path):
    data = np.arange(60.0).reshape(12, 5)
    x = ds.open(write(tmp_path, "npy", data, None), chunks=(4, 5))
    seen = []

    def record(block, block_info=None):
        seen.append((block_info[0]["chunk-location"], block_info[0]["array-location"][0], block.shape))
        return block

    dask.compute(ds.map_blocks(record, x, depth=(1, 0), boundary="none", dtype=x.dtype), scheduler="sync")
    assert sorted(seen) == [((0, 0), (0, 5), (5, 5)), ((1, 0), (3, 9), (6, 5)), ((2, 0), (7, 12), (5, 5))]


@pytest.mark.parametrize(
    ("start", "stop", "boundary", "cells"),
    [
        (-2, 3, "reflect", [1, 0, 0, 1, 2]),
        (3, 7, "nearest", [3, 4, 4, 4]),
        (-1, 2, "periodic", [4, 0, 1]),
        (-1, 1, 0.0, [-1, 0]),  # -1: a constant cell, not read
        (-7, -5, "reflect", [3, 4]),  # deeper than the array: folds again
    ],
)
def test_which_cell_a_halo_position_reads(start, stop, boundary, cells):
    assert source_indices(start, stop, 5, boundary).tolist() == cells


def test_a_halo_deeper_than_the_array_is_assembled_cell_range_by_range():
    regions = ArrayRegions(np.arange(3.0))
    np.testing.assert_array_equal(
        haloed(regions, (slice(0, 3),), (4,), "reflect"), np.pad(np.arange(3.0), 4, "symmetric")
    )
    np.testing.assert_array_equal(haloed(regions, (slice(1, 2),), (4,), "periodic"), np.arange(-3, 6) % 3)
