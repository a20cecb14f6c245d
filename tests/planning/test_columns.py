"""Whole-column tasks (quantiles along axes): as small as keeps full speed, never over the budget's share."""

from __future__ import annotations

import math

import hypothesis.strategies as st
from hypothesis import given, settings

from daskstream.planning.columns import LARGEST_TASK_BYTES, plan_columns


@st.composite
def layouts(draw):
    ndim = draw(st.integers(2, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5000), min_size=ndim, max_size=ndim)))
    storage = tuple(draw(st.integers(1, n)) for n in shape)
    reduced = tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim - 1))))
    return shape, storage, reduced


@settings(max_examples=200, deadline=None)
@given(layouts(), st.sampled_from([1, 2, 4, 8]), st.integers(1, 64), st.booleans(), st.integers(20, 36))
def test_a_plan_holds_whole_columns_within_the_share_and_covers_the_array(layout, itemsize, threads, decoded, log2):
    shape, storage, reduced = layout
    per_task = 2**log2
    plan = plan_columns(shape, itemsize, reduced, storage=storage, decoded=decoded, threads=threads,
                        per_task_bytes=per_task, copies=3)  # fmt: skip
    column = math.prod(shape[a] for a in reduced) * itemsize
    if column * 3 > per_task:
        assert plan is None  # not one column fits: the caller refuses, naming the budget
        return
    assert plan is not None
    kept = [a for a in range(len(shape)) if a not in reduced]
    assert sorted(plan.chunks) == kept
    assert all(1 <= plan.chunks[a] <= shape[a] for a in kept)
    assert plan.task_bytes == column * math.prod(plan.chunks.values())
    assert plan.task_bytes * 3 <= per_task
    assert plan.tasks == math.prod(math.ceil(shape[a] / plan.chunks[a]) for a in kept)
    assert plan.held_bytes == min(plan.tasks, threads) * plan.task_bytes * 3
    assert plan.reads_again >= 1.0 - 1e-9
    # A ceiling, not a target: tasks grow past the largest planned size only when one column is larger.
    assert plan.task_bytes <= max(LARGEST_TASK_BYTES, column)


def test_the_budget_is_a_ceiling_not_a_target():
    shape, storage = (3650, 180, 360), (365, 45, 90)
    plans = [plan_columns(shape, 4, (0,), storage=storage, decoded=True, threads=2, per_task_bytes=share, copies=3)
             for share in (2**30, 2**32, 2**34)]  # fmt: skip
    # The same plan whatever the budget, once the budget holds it: more memory buys no speed here.
    assert plans[0] == plans[1] == plans[2]
    assert plans[0].held_bytes < 2**30


def test_a_field_stored_a_day_per_chunk_is_read_in_few_tasks_and_a_blocked_one_in_whole_blocks():
    shape = (3650, 180, 360)
    day = plan_columns(shape, 4, (0,), storage=(1, 180, 360), decoded=True, threads=2, per_task_bytes=2**33, copies=3)
    block = plan_columns(shape, 4, (0,), storage=(365, 45, 90), decoded=True, threads=2, per_task_bytes=2**33,
                         copies=3)  # fmt: skip
    # Every task crosses every day's chunk: decoding each again per task costs more than holding more.
    assert day.tasks < block.tasks
    assert day.reads_again == day.tasks
    assert block.reads_again == 1.0
    assert block.task_bytes < day.task_bytes
