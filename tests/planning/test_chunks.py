"""The chunk planner, checked against hand-worked cases and a brute-force oracle."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskstream.errors import InvalidArgumentError, InvalidAxisError, InvalidBudgetError, InvalidChunksError
from daskstream.planning.chunks import plan_chunks_exact
from daskstream.planning.grid import read_amplification, regular_grid
from daskstream.views import chunk_plan_html

MiB = 2**20


def plan(shape, dtype="f4", **kw):
    """The planner with every input explicit, so the cases do not depend on this machine."""
    defaults = {
        "storage_chunks": None,
        "layout": "C",
        "memory_budget": 1024 * MiB,
        "threads": 2,
        "workers": 1,
        "reduce_axis": None,
        "target_chunk_bytes": 8 * MiB,
        "working_set_factor": 3.0,
        "min_tasks_per_thread": 2,
    }
    return plan_chunks_exact(shape, dtype, **{**defaults, **kw})


@pytest.mark.parametrize(
    ("kw", "chunks"),
    [
        # 1 GiB C-order .npy: slabs of whole rows, sized to the 8 MiB target.
        ({"shape": (262144, 1024)}, (2048, 1024)),
        # Fortran order: slabs along the last axis instead.
        ({"shape": (1024, 262144), "layout": "F"}, (1024, 2048)),
        # One row is larger than the target: one index of axis 0, axis 1 cut.
        ({"shape": (4, 8 * MiB)}, (1, 2 * MiB)),
        # A small array: cut for parallelism (2 tasks per thread), not kept in one task.
        ({"shape": (1000, 10)}, (250, 10)),
        # 101 rows in 50-row pieces would leave a 1-row sliver; balanced to 34.
        (
            {"shape": (101, 2**15), "target_chunk_bytes": 50 * 2**17, "threads": 1, "min_tasks_per_thread": 1},
            (34, 2**15),
        ),
        # Chunked storage: grown in whole storage chunks, slowest axis first, so each storage chunk is one
        # contiguous run of the block.
        ({"shape": (4000, 4000), "storage_chunks": (100, 100), "layout": "chunked"}, (4000, 500)),
        ({"shape": (40, 4000, 4000), "storage_chunks": (1, 100, 100), "layout": "chunked"}, (40, 500, 100)),
        # A reduction over axis 0 spans axis 0 first, so the combine tree stays shallow.
        ({"shape": (4000, 4000), "storage_chunks": (100, 100), "layout": "chunked", "reduce_axis": 0}, (4000, 500)),
        # Storage chunks bigger than the target but within the budget: one per task, never split.
        ({"shape": (64, 4096, 4096), "storage_chunks": (1, 4096, 4096), "layout": "chunked"}, (1, 4096, 4096)),
        # Storage chunk larger than the per-task budget: split into divisors of its length.
        (
            {
                "shape": (1000, 1000),
                "dtype": "f8",
                "storage_chunks": (1000, 1000),
                "layout": "chunked",
                "memory_budget": 6 * MiB,
            },
            (125, 1000),
        ),
        # A 0-d array is one task.
        ({"shape": ()}, ()),
    ],
    ids=[
        "npy-1GiB",
        "fortran",
        "huge-rows",
        "small",
        "no-sliver",
        "chunked",
        "chunked-3d",
        "reduce-axis0",
        "big-storage-chunks",
        "split",
        "0d",
    ],
)
def test_plan_examples(kw, chunks):
    assert plan(**kw).chunks == chunks


def test_split_storage_chunks_reports_amplification():
    p = plan((1000, 1000), "f8", storage_chunks=(1000, 1000), layout="chunked", memory_budget=6 * MiB)
    assert p.read_amplification == 8.0
    assert p.splits_storage_chunks
    assert "decoded 8.00 times" in p.explain()


def test_aligned_plan_never_splits():
    p = plan((4000, 4000), storage_chunks=(100, 100), layout="chunked")
    assert p.read_amplification == 1.0
    assert not p.splits_storage_chunks
    assert "Warning" not in p.explain()


def test_empty_array_is_one_task():
    p = plan((0, 5))
    assert p.dask_chunks == ((0,), (5,))
    assert p.n_tasks == 1


def test_explain_names_inputs_and_each_axis():
    text = plan((4000, 4000), storage_chunks=(100, 100), layout="chunked", reduce_axis=0).explain()
    for fragment in (
        "(4000, 4000)",
        "storage chunks (100, 100)",
        "1.00 GiB per worker",
        "axis 0:",
        "axis 1:",
        "Reduction over axes (0,)",
    ):
        assert fragment in text


def test_html_repr_shows_the_plan():
    html = chunk_plan_html(plan((100, 100)))
    assert "<table>" in html
    assert "read amplification" in html


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        # Too small a budget for even one element per thread.
        ({"memory_budget": 10, "dtype": "f8"}, InvalidBudgetError),
        ({"layout": "Z"}, InvalidChunksError),
        ({"layout": "chunked"}, InvalidChunksError),
        ({"storage_chunks": (10,), "layout": "chunked"}, InvalidChunksError),
        ({"storage_chunks": (0, 10), "layout": "chunked"}, InvalidChunksError),
        ({"threads": 0}, InvalidArgumentError),
        ({"reduce_axis": 2}, InvalidAxisError),
        ({"reduce_axis": -3}, InvalidAxisError),
    ],
    ids=[
        "budget-below-one-element",
        "bad-layout",
        "chunked-without-grid",
        "grid-wrong-rank",
        "zero-storage-chunk",
        "zero-threads",
        "axis-too-big",
        "axis-too-negative",
    ],
)
def test_bad_inputs(kw, error):
    kw = {"shape": (100, 100), **kw}
    with pytest.raises(error):
        plan(**kw)


def test_axis_error_is_also_a_builtin():
    with pytest.raises(IndexError):
        plan((10,), reduce_axis=1)


def test_negative_reduce_axis_is_normalised():
    assert plan((10, 10), reduce_axis=-1).reduce_axis == (1,)


# ---------------------------------------------------------------------------
# Properties against a brute-force oracle.


@st.composite
def planner_inputs(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 24), min_size=ndim, max_size=ndim)))
    layout = draw(st.sampled_from(["C", "F", "chunked"]))
    storage = None
    if layout == "chunked":
        storage = tuple(draw(st.integers(1, max(1, n + 3))) for n in shape)
    reduce_axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1)))
    return {
        "shape": shape,
        "dtype": draw(st.sampled_from(["i1", "f2", "f4", "f8", "c16"])),
        "storage_chunks": storage,
        "layout": layout,
        "memory_budget": draw(st.integers(16, 2**16)),
        "threads": draw(st.integers(1, 4)),
        "workers": draw(st.integers(1, 3)),
        "reduce_axis": reduce_axis,
        "target_chunk_bytes": draw(st.integers(1, 2**14)),
        "working_set_factor": draw(st.sampled_from([1.0, 1.5, 2.0, 3.0])),
        "min_tasks_per_thread": draw(st.integers(1, 3)),
    }


def boxes(shape, grid):
    """Every block of a dask-style chunk grid, as a tuple of (start, stop) per axis."""
    per_axis = []
    for sizes in grid:
        edges = np.cumsum((0, *sizes))
        per_axis.append([(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a])
    return list(itertools.product(*per_axis))


def overlaps(a, b):
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


def brute_force_amplification(shape, storage_chunks, dask_chunks):
    """Bytes decoded / bytes stored, by testing every storage chunk against every task."""
    storage = boxes(shape, regular_grid(shape, storage_chunks))
    tasks = boxes(shape, dask_chunks)
    decoded = sum(math.prod(hi - lo for lo, hi in s) * sum(overlaps(s, t) for t in tasks) for s in storage)
    return decoded / math.prod(shape)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planner_inputs())
def test_planner_invariants(kw):
    itemsize = np.dtype(kw["dtype"]).itemsize
    cap = kw["memory_budget"] // (kw["threads"] * kw["working_set_factor"])
    if cap < itemsize:
        with pytest.raises(InvalidBudgetError):
            plan(**kw)
        return
    p = plan(**kw)
    shape = kw["shape"]

    # Coverage: the chunks tile the array exactly.
    assert len(p.dask_chunks) == len(shape)
    for n, sizes in zip(shape, p.dask_chunks):
        assert sum(sizes) == n
        assert all(c > 0 for c in sizes) or sizes == (0,)

    # Budget: the projected peak of a worker's concurrent tasks stays within its budget.
    assert p.chunk_bytes <= cap
    assert p.projected_peak_bytes <= kw["memory_budget"]

    if math.prod(shape) == 0:
        assert p.n_tasks == 1
        return

    # Task count agrees with the grid, and every thread gets work when the storage allows it.
    assert p.n_tasks == len(boxes(shape, p.dask_chunks))
    min_tasks = kw["min_tasks_per_thread"] * kw["threads"] * kw["workers"]
    if kw["storage_chunks"] is None:
        units = math.prod(shape)
    else:
        units = math.prod(math.ceil(n / c) for n, c in zip(shape, kw["storage_chunks"]))
    assert p.n_tasks >= min(min_tasks, units)

    # Alignment: the reported read amplification is the brute-force one, and it is 1.0
    # (each storage chunk read by one task) unless one storage chunk exceeds the per-task budget.
    if kw["storage_chunks"] is not None and kw["layout"] == "chunked":
        expected = brute_force_amplification(shape, kw["storage_chunks"], p.dask_chunks)
        assert p.read_amplification == pytest.approx(expected)
        unit_bytes = math.prod(min(c, n) for c, n in zip(kw["storage_chunks"], shape)) * itemsize
        if unit_bytes <= cap:
            assert p.read_amplification == 1.0
            storage = boxes(shape, regular_grid(shape, kw["storage_chunks"]))
            tasks = boxes(shape, p.dask_chunks)
            assert all(sum(overlaps(s, t) for t in tasks) == 1 for s in storage)
    else:
        assert p.read_amplification == 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=3).flatmap(
        lambda shape: st.tuples(
            st.just(tuple(shape)),
            st.tuples(*(st.integers(1, n + 2) for n in shape)),
            st.tuples(*(st.lists(st.integers(1, n), min_size=1, max_size=6) for n in shape)),
        )
    )
)
def test_read_amplification_matches_brute_force_for_irregular_chunks(case):
    shape, storage_chunks, raw = case
    # Turn random piece lengths into a valid irregular grid covering each axis.
    grid = []
    for n, pieces in zip(shape, raw):
        out, left = [], n
        for piece in pieces:
            if left == 0:
                break
            out.append(min(piece, left))
            left -= out[-1]
        if left:
            out.append(left)
        grid.append(tuple(out))
    grid = tuple(grid)
    assert read_amplification(shape, storage_chunks, grid) == pytest.approx(
        brute_force_amplification(shape, storage_chunks, grid)
    )


@settings(max_examples=200, deadline=None)
@given(planner_inputs())
def test_contiguous_chunks_are_single_byte_ranges(kw):
    """A C-order chunk is one byte range: axes before the cut hold one index, axes after are whole."""
    kw = {**kw, "layout": "C", "storage_chunks": None, "memory_budget": 2**20}
    p = plan(**kw)
    shape, chunks = kw["shape"], p.chunks
    if math.prod(shape) == 0:
        return
    cut_axes = [a for a, (c, n) in enumerate(zip(chunks, shape)) if c != n]
    if not cut_axes:
        return
    last_cut = cut_axes[-1]
    assert all(c == 1 for c in chunks[:last_cut])
