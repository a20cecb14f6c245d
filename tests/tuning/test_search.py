"""The tuner's search logic, driven by a timing model instead of real reads."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskstream.tuning.candidates import Limits, Measurement, SearchSpace, hill_climb, project_seconds

MiB = 2**20


def space(shape=(4096, 4096), unit=(256, 256), axes=(0, 1), per_task=1024 * MiB, concurrency=2, itemsize=4):
    return SearchSpace(shape, itemsize, unit, axes, per_task, concurrency)


class Model:
    """Throughput peaked at ``best`` multiples (unimodal in log2 of each axis), with a given noise."""

    def __init__(self, space, best, *, spread=0.0, task_seconds=None, sample=MiB, seconds=0.01):
        self.space, self.best, self.spread = space, best, spread
        self.task_seconds, self.sample, self.seconds = task_seconds, sample, seconds
        self.measured = []

    def __call__(self, multiples):
        self.measured.append(multiples)
        distance = sum((math.log2(m) - math.log2(b)) ** 2 for m, b in zip(multiples, self.best))
        rate = 1e9 / (1 + distance)
        per_task = self.task_seconds or self.space.chunk_bytes(multiples) / rate
        return Measurement(rate, self.spread, per_task, self.sample, self.seconds)


def climb(sp, start, model, *, cap=10**15, budget=1e9, factor=1.0, floor=0.0, min_gain=0.05, clock=None, **kw):
    limits = Limits(budget, cap) if clock is None else Limits(budget, cap, clock=clock)
    return hill_climb(
        sp,
        start,
        model,
        limits=limits,
        sample_bytes=lambda m: model.sample,
        memory_factor=lambda: factor,
        overhead_floor=floor,
        min_gain=min_gain,
        **kw,
    )


def powers(n):
    return [2**k for k in range(n.bit_length()) if 2**k <= n]


@settings(max_examples=150, deadline=None)
@given(
    log_units=st.tuples(st.integers(0, 6), st.integers(0, 6)),
    best=st.tuples(st.integers(0, 6), st.integers(0, 6)),
    start=st.tuples(st.integers(0, 6), st.integers(0, 6)),
)
def test_climb_reaches_the_best_candidate_of_a_unimodal_model(log_units, best, start):
    sp = space(shape=(256 * 2 ** log_units[0], 256 * 2 ** log_units[1]), concurrency=1)
    n = sp.n_units
    best = tuple(min(2**b, u) for b, u in zip(best, n))
    start = tuple(min(2**s, u) for s, u in zip(start, n))
    model = Model(sp, best)
    outcome = climb(sp, start, model, min_gain=0.0)
    assert outcome.best.multiples == best
    assert outcome.trials[0].origin == "planner"
    assert outcome.stopped.startswith("converged")


@settings(max_examples=100, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 5000), st.integers(1, 5000)),
    unit=st.tuples(st.integers(1, 700), st.integers(1, 700)),
    per_task=st.integers(4, 64 * MiB),
    best=st.tuples(st.integers(0, 5), st.integers(0, 5)),
)
def test_no_candidate_splits_storage_chunks_or_passes_the_budget(shape, unit, per_task, best):
    unit = tuple(min(u, n) for u, n in zip(unit, shape))
    sp = space(shape=shape, unit=unit, per_task=per_task, concurrency=1)
    model = Model(sp, tuple(2**b for b in best))
    outcome = climb(sp, (1, 1), model, factor=2.0)
    for trial in outcome.trials:
        chunks = sp.chunks(trial.multiples)
        for c, u, n in zip(chunks, unit, shape):
            assert c == n or c % u == 0, (chunks, unit, shape)
    for multiples in model.measured:
        assert 2.0 * sp.chunk_bytes(multiples) <= per_task or multiples == (1, 1)
    for multiples in sp.sweep(2.0):
        assert 2.0 * sp.chunk_bytes(multiples) <= per_task


def test_candidates_over_the_memory_budget_are_pruned_not_measured():
    sp = space(per_task=8 * MiB)  # 256x256 f4 is 256 KiB; 8 MiB / factor 3 allows 2.67 MiB chunks
    model = Model(sp, (16, 16))
    outcome = climb(sp, (2, 2), model, factor=3.0)
    assert all(3.0 * sp.chunk_bytes(m) <= 8 * MiB for m in model.measured)
    pruned = [t for t in outcome.trials if t.pruned]
    assert pruned
    assert all("exceeds the budget" in t.pruned for t in pruned)
    assert 3.0 * sp.chunk_bytes(outcome.best.multiples) <= 8 * MiB


def test_candidates_with_too_few_tasks_for_the_threads_are_pruned():
    sp = space(shape=(1024, 256), unit=(256, 256), concurrency=4)
    model = Model(sp, (4, 1))
    outcome = climb(sp, (1, 1), model)
    assert (2, 1) in [t.multiples for t in outcome.trials if t.pruned and "idle" in t.pruned]
    assert outcome.best.multiples == (1, 1)


def test_tasks_under_the_overhead_floor_are_not_tried():
    sp = space(unit=(1, 4096), axes=(0,))  # contiguous slabs: 16 KiB per row
    measured = []

    def smaller_is_faster(multiples):  # 1 ms per MiB, but the model ranks smaller slabs higher
        measured.append(multiples)
        return Measurement(1e9 * (1 + 1 / multiples[0]), 0.0, sp.chunk_bytes(multiples) / 1e9, MiB, 0.01)

    outcome = hill_climb(
        sp,
        (256, 1),
        smaller_is_faster,
        limits=Limits(1e9, 10**15),
        sample_bytes=lambda m: MiB,
        memory_factor=lambda: 1.0,
        overhead_floor=0.001,
        min_gain=0.0,
    )
    # Halving from 1 MiB (1 ms per task) would give 0.5 ms tasks: pruned, not measured.
    assert min(sp.chunk_bytes(m) for m in measured) == MiB
    assert any(t.pruned and "overhead floor" in t.pruned for t in outcome.trials)
    assert outcome.best.multiples == (64, 1)


def test_a_step_must_beat_the_measured_noise():
    sp = space()
    quiet = climb(sp, (2, 2), Model(sp, (8, 8)))
    noisy = climb(sp, (2, 2), Model(sp, (8, 8), spread=0.6))
    assert quiet.best.multiples == (8, 8)
    assert noisy.best.multiples == (2, 2)  # no step wins by more than 2 x 60% noise
    assert noisy.stopped.startswith("converged")


def test_the_sample_cap_and_time_budget_stop_the_search():
    sp = space()
    model = Model(sp, (16, 16), sample=10 * MiB)
    capped = climb(sp, (1, 1), model, cap=35 * MiB)
    assert len(model.measured) == 3
    assert "sample cap" in capped.stopped

    ticks = iter(range(1000))
    timed = Model(sp, (16, 16), seconds=1.0)
    outcome = climb(sp, (1, 1), timed, budget=4.5, clock=lambda: next(ticks))
    assert "time budget" in outcome.stopped
    assert len(timed.measured) <= 4


def test_observed_starts_are_measured_and_the_climb_starts_from_the_best():
    sp = space()
    model = Model(sp, (8, 8))
    outcome = climb(sp, (1, 1), model, extra_starts=((4, 4),))
    assert model.measured[:2] == [(1, 1), (4, 4)]
    assert outcome.trials[1].origin == "observed"
    assert outcome.best.multiples == (8, 8)
    assert len(model.measured) < len(climb(sp, (1, 1), Model(sp, (8, 8))).trials)


def test_projection_counts_partial_waves_and_combine_tasks():
    sp = space(shape=(768, 256), unit=(256, 256), concurrency=2)
    # Three tasks on two slots take two waves; each task adds its share of combine overhead.
    assert project_seconds(sp, (1, 1), 1.0, 0.1) == pytest.approx(2 * 1.0 + 3 * 0.1 / 2)


def test_sweep_lists_powers_of_two_and_whole_axes():
    sp = space(shape=(1280, 256), unit=(256, 256), concurrency=1)
    assert sorted(sp.sweep(1.0)) == [(1, 1), (2, 1), (4, 1), (5, 1)]
    contiguous = space(shape=(64, 1024), unit=(1, 1024), axes=(0,), concurrency=2)
    assert [m[1] for m in contiguous.sweep(1.0)] == [1] * 6  # 64 rows in one task would idle a thread
    assert sorted(m[0] for m in contiguous.sweep(1.0)) == powers(32)
