"""Rechunking plans: every box holds whole chunks of what it reads and writes, within the task's bytes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskstream.errors import MemoryBudgetError
from daskstream.planning.grid import read_amplification, regular_grid
from daskstream.planning.rechunk import periods, plan_rechunk


def _whole(box: int, chunk: int, n: int) -> bool:
    """A box length along an axis holds whole chunks: a multiple of the chunk, or the whole axis."""
    return box >= n or box % chunk == 0


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 400)) for _ in range(ndim))
    source = tuple(draw(st.integers(1, n)) for n in shape)
    target = tuple(draw(st.integers(1, n)) for n in shape)
    itemsize = draw(st.sampled_from([1, 4, 8]))
    smallest = max(math.prod(source), math.prod(target)) * itemsize
    task_bytes = draw(st.integers(smallest, max(smallest, math.prod(shape) * itemsize * 2)))
    return shape, itemsize, source, target, task_bytes


@settings(max_examples=400, deadline=None)
@given(cases())
def test_every_box_holds_whole_chunks_and_fits_a_task(case):
    shape, itemsize, source, target, task_bytes = case
    plan = plan_rechunk(shape, itemsize, source, target, task_bytes=task_bytes)
    assert plan.peak_task_bytes <= task_bytes
    # Reading the source in its boxes decodes every stored chunk once.
    assert read_amplification(shape, source, regular_grid(shape, plan.read_chunks)) == 1.0
    for n, r, w, s, t in zip(shape, plan.read_chunks, plan.write_chunks, source, target):
        assert _whole(r, s, n)
        assert _whole(w, t, n)
    if plan.intermediate_chunks is None:
        assert plan.read_chunks == plan.write_chunks
        assert all(_whole(r, t, n) for n, r, t in zip(shape, plan.read_chunks, target))
    else:
        # Both passes cut along intermediate chunk boundaries: each is written once and read once.
        for n, r, w, i in zip(shape, plan.read_chunks, plan.write_chunks, plan.intermediate_chunks):
            assert _whole(r, i, n)
            assert _whole(w, i, n)
        # Two passes only where one could not fit.
        assert math.prod(periods(shape, source, target)) * itemsize > task_bytes


def test_rows_to_columns_goes_through_an_intermediate_of_square_tiles():
    plan = plan_rechunk((65536, 16384), 4, (256, 16384), (16384, 256), task_bytes=50 * 2**20)
    assert plan.passes == 2
    assert plan.read_chunks == (512, 16384)
    assert plan.intermediate_chunks == (512, 512)
    assert plan.write_chunks == (16384, 512)
    assert "pass 1 reads boxes of (512, 16384)" in plan.explain()


def test_chunks_that_nest_take_one_pass_and_grow_towards_the_preferred_size():
    plan = plan_rechunk((4096, 4096), 4, (64, 4096), (128, 1024), task_bytes=64 * 2**20, preferred_bytes=8 * 2**20)
    assert plan.passes == 1
    assert plan.read_chunks == (512, 4096)
    assert "nothing is decoded twice" in plan.explain()


def test_a_contiguous_file_is_read_straight_in_target_chunks():
    plan = plan_rechunk((1000, 1000), 8, None, (1000, 10), task_bytes=2**20, preferred_bytes=80_000)
    assert plan.passes == 1
    assert plan.read_chunks == (1000, 10)


@pytest.mark.parametrize(
    ("source", "target", "which"), [((500, 500), (10, 10), "source"), ((1, 1), (1000, 500), "target")]
)
def test_a_chunk_larger_than_a_task_may_hold_is_refused_by_name(source, target, which):
    with pytest.raises(MemoryBudgetError, match=f"one {which} chunk .* more than the .* one task may hold"):
        plan_rechunk((1000, 1000), 8, source, target, task_bytes=2**20)
