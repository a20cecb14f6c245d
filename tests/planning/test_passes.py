"""The pass planner: hand-worked computations, and properties over random ones."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskstream.planning.passes import LayerFacts, copy_level, plan_passes

MiB = 2**20
BLOCK = 4 * MiB
LIMIT = 32 * MiB  # what one task may hold: eight blocks


def read(name="x", source="x.npy", blocks=100):
    return LayerFacts(name, "read", block_bytes=BLOCK, blocks=blocks, sources=(source,))


def step(name, *inputs, block_bytes=BLOCK, blocks=100):
    """A layer taking ``inputs`` as ``(name, blocks of it per output block)``."""
    return LayerFacts(name, "compute", block_bytes=block_bytes, blocks=blocks, inputs=tuple(inputs))


def aggregate(name, taken, fan_in=100):
    """A reduction's result: one small block from ``fan_in`` blocks of ``taken``."""
    return step(name, (taken, fan_in), block_bytes=8, blocks=1)


@pytest.mark.parametrize(
    ("facts", "passes", "recomputed"),
    [
        # x.sum() and x.max() together: both take the blocks as they are read, in one pass.
        pytest.param([read(), aggregate("sum", "x"), aggregate("max", "x")], 1, {}, id="two-aggregates-one-pass"),
        # x - x.mean(): the centred blocks need the mean of every block, so x is read again.
        pytest.param(
            [read(), aggregate("mean", "x"), step("centred", ("x", 1), ("mean", 1)), aggregate("std", "centred")],
            2,
            {1: ("x",)},
            id="centering",
        ),
        # (x - mean) / std: both statistics in the first pass, one more pass for the result.
        pytest.param(
            [
                read(),
                aggregate("mean", "x"),
                aggregate("std", "x"),
                step("centred", ("x", 1), ("mean", 1)),
                step("standardized", ("centred", 1), ("std", 1)),
            ],
            2,
            {1: ("x",)},
            id="standardizing",
        ),
        # The mean of each row when a block holds whole rows needs only that block: no second pass.
        pytest.param(
            [read(), step("row_mean", ("x", 1), block_bytes=1024), step("centred", ("x", 1), ("row_mean", 1))],
            1,
            {},
            id="row-means-within-blocks",
        ),
        # A quantile's two passes, then a selection that needs it: three reads.
        pytest.param(
            [
                read(),
                aggregate("counts", "x"),
                step("state", ("counts", 1), block_bytes=48, blocks=1),
                read("x2"),
                step("counts2", ("x2", 1), ("state", 1), block_bytes=1024),
                aggregate("merged", "counts2"),
                step("quantile", ("merged", 1), ("state", 1), block_bytes=8, blocks=1),
                step("selected", ("x", 1), ("quantile", 1)),
            ],
            3,
            {1: ("x2",), 2: ("x",)},
            id="quantile-then-selection",
        ),
        # Element-wise work before the aggregate is computed again in the later pass, from the source.
        pytest.param(
            [
                read(),
                step("scaled", ("x", 1)),
                aggregate("mean", "scaled"),
                step("centred", ("scaled", 1), ("mean", 1)),
            ],
            2,
            {1: ("x", "scaled")},
            id="element-wise-work-recomputed",
        ),
    ],
)
def test_hand_worked_computations(facts, passes, recomputed):
    plan = plan_passes(facts, hold_limit=LIMIT)
    assert plan.passes == passes
    assert dict(plan.recomputed) == recomputed


def test_small_aggregates_and_constants_are_shared_between_passes():
    facts = [
        LayerFacts("source-description", "constant"),
        read(),
        aggregate("mean", "x"),
        step("centred", ("x", 1), ("mean", 1)),
    ]
    plan = plan_passes(facts, hold_limit=LIMIT)
    assert {"mean", "source-description"} <= plan.shared
    assert copy_level("mean", 1, plan.levels, plan.shared) == plan.levels["mean"]
    assert copy_level("x", 1, plan.levels, plan.shared) == 1


def test_a_small_result_a_later_pass_takes_is_held_rather_than_computed_again_from_the_data():
    # A radix select: the first digits' state (a few bytes, from an aggregate within what a task may hold)
    # is taken by the next digits' counts, whose aggregate is the barrier, and by the state after them.
    facts = [
        read("x", blocks=4),
        aggregate("top-counts", "x", fan_in=4),
        step("first-state", ("top-counts", 1), block_bytes=48, blocks=1),
        read("again", blocks=4),
        step("counts", ("again", 1), ("first-state", 1), block_bytes=1 * MiB, blocks=4),
        aggregate("next-counts", "counts", fan_in=4),
        step("next-state", ("next-counts", 1), ("first-state", 1), block_bytes=48, blocks=1),
    ]
    plan = plan_passes(facts, hold_limit=LIMIT)
    assert plan.barriers == {"next-counts"}
    assert "first-state" in plan.shared
    assert plan.recomputed == {}
    assert plan.read_passes == {"x.npy": (0,)}
    # Results larger than a sixteenth of what a task may hold: computed again, each pass reading for them.
    large = [dataclasses.replace(f, block_bytes=LIMIT // 8) if "-state" in f.name or f.name == "top-counts" else f
             for f in facts]  # fmt: skip
    plan = plan_passes(large, hold_limit=LIMIT)
    assert plan.read_passes == {"x.npy": (0, 1)}


def test_a_layer_must_follow_its_inputs():
    with pytest.raises(ValueError, match="not described before"):
        plan_passes([step("centred", ("x", 1))], hold_limit=LIMIT)


def test_the_kind_is_checked():
    with pytest.raises(ValueError, match="kind"):
        LayerFacts("x", "table")


# ---------------------------------------------------------------------------
# Properties over random computations.


@st.composite
def computations(draw):
    """Random layer graphs: reads of two sources, element-wise steps, aggregates, steps taking aggregates."""
    facts = [read("a", "a.npy"), read("b", "b.npy")]
    streaming = ["a", "b"]
    small = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["elementwise", "aggregate", "uses-aggregate"]))
        name = f"s{i}"
        if kind == "aggregate" or (not small and kind == "uses-aggregate"):
            facts.append(aggregate(name, draw(st.sampled_from(streaming)), fan_in=draw(st.integers(1, 100))))
            small.append(name)
            continue
        inputs = [(draw(st.sampled_from(streaming)), 1)]
        if kind == "uses-aggregate":
            inputs.append((draw(st.sampled_from(small)), 1))
        facts.append(step(name, *dict(inputs).items()))
        streaming.append(name)
    return facts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(computations())
def test_no_block_is_held_from_one_pass_to_another(facts):
    plan = plan_passes(facts, hold_limit=LIMIT)
    by_name = {f.name: f for f in facts}
    # Each layer runs no earlier than its inputs, and after the barriers it takes.
    for f in facts:
        for name, _ in f.inputs:
            assert plan.levels[f.name] >= plan.levels[name] + (name in plan.barriers)
    # What a layer takes from an earlier pass is either shared (computed once: barriers, small
    # aggregates, constants) or computed again in the taker's pass: never a block kept from before.
    for f in facts:
        for name, _ in f.inputs:
            level = copy_level(name, plan.levels[f.name], plan.levels, plan.shared)
            if name in plan.shared:
                assert level == plan.levels[name]
                assert by_name[name].kind != "read"
            else:
                assert level == plan.levels[f.name]
    # A barrier depends on more than a task may hold; a shared aggregate is small.
    for name in plan.barriers:
        assert plan.reach[name] > LIMIT
    for name in plan.shared - plan.barriers:
        assert by_name[name].kind == "constant" or by_name[name].block_bytes * by_name[name].blocks <= LIMIT


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(computations())
def test_each_source_is_read_once_per_pass_that_needs_it(facts):
    plan = plan_passes(facts, hold_limit=LIMIT)
    # Brute force: the passes that compute something taking a read, directly or through streaming steps.
    takers = {f.name: [g.name for g in facts if any(n == f.name for n, _ in g.inputs)] for f in facts}
    outputs = [f.name for f in facts if not takers[f.name]]
    needed: dict[str, set[int]] = {}

    def need(name, level):
        if level in needed.setdefault(name, set()):
            return
        needed[name].add(level)
        for taken, _ in next(f for f in facts if f.name == name).inputs:
            need(taken, copy_level(taken, level, plan.levels, plan.shared))

    for name in outputs:
        need(name, plan.levels[name])
    for source, read_name in (("a.npy", "a"), ("b.npy", "b")):
        assert plan.read_passes.get(source, ()) == tuple(sorted(needed.get(read_name, ())))
    assert plan.passes == max((len(p) for p in plan.read_passes.values()), default=0)
    # Never more passes than levels: one read per pass at most.
    assert plan.passes <= 1 + max(plan.levels.values())


def test_an_aggregate_linking_more_than_a_task_may_hold_is_a_barrier_only_where_its_reads_wait_for_it():
    # Each group mean takes 2 blocks (200 bytes, within the hold limit), but its groups straddle blocks.
    facts = [
        LayerFacts("read", "read", block_bytes=100, blocks=10, sources=("x.nc",)),
        LayerFacts("means", "compute", block_bytes=8, blocks=5, inputs=(("read", 2),)),
        LayerFacts("anomaly", "compute", block_bytes=100, blocks=10, inputs=(("read", 1), ("means", 1))),
    ]
    asked = []

    def links_more_than(name, barriers, limit):
        asked.append(name)
        return True

    plan = plan_passes(facts, hold_limit=300, linked=links_more_than)
    assert asked == ["means"]
    assert plan.barriers == {"means"}
    assert plan.passes == 2
    assert plan_passes(facts, hold_limit=300, linked=lambda *_: False).passes == 1
    # The means alone, taken by nothing that reads: no block waits for them, nothing to measure.
    asked.clear()
    assert plan_passes(facts[:2], hold_limit=300, linked=links_more_than).passes == 1
    assert asked == []
