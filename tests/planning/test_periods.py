"""Chunks on calendar periods: every chunk whole periods, within the cap, the coarsest periods that fit."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from daskstream.planning.periods import calendar_chunks


@st.composite
def axes(draw):
    length = draw(st.integers(3, 400))
    months = sorted(draw(st.sets(st.integers(1, length - 1), min_size=1, max_size=40)))
    years = sorted(draw(st.sets(st.sampled_from(months), max_size=len(months))))
    return length, years, months


@given(axes(), st.integers(1, 64), st.integers(1, 4000), st.integers(1, 200), st.sampled_from([None, 1, 2, 5]))
def test_chunks_are_whole_periods_of_the_coarsest_kind_that_fits(axis, row_bytes, cap_bytes, planned, storage):
    length, years, months = axis
    found = calendar_chunks(
        length, row_bytes=row_bytes, cap_bytes=cap_bytes, planned_rows=planned, period_starts=[years, months],
        storage_rows=storage,
    )  # fmt: skip
    step = storage or 1

    def periods(starts):
        bounds = sorted({0, length, *(s for s in starts if s % step == 0)})
        return [b - a for a, b in itertools.pairwise(bounds)]

    fitting = [
        starts
        for starts in (years, months)
        if len(periods(starts)) > 1 and max(periods(starts)) * row_bytes <= cap_bytes
    ]
    if not fitting:
        assert found is None
        return
    assert found is not None
    assert sum(found) == length
    bounds = set(itertools.accumulate(found))
    usable = {s for s in fitting[0] if s % step == 0} | {length}
    assert bounds <= usable  # every chunk ends where a period of the chosen kind starts
    assert all(rows * row_bytes <= cap_bytes for rows in found)
    # Periods are joined only up to the planner's length: a chunk longer than it is one period.
    single = set(periods(fitting[0]))
    assert all(rows <= planned or rows in single for rows in found)


def test_a_year_that_does_not_fit_falls_back_to_months_and_nothing_that_fits_to_the_planner():
    years, months = [365], [31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365, 396]
    assert calendar_chunks(400, row_bytes=1, cap_bytes=400, planned_rows=30, period_starts=[years, months]) == (365, 35)
    by_month = calendar_chunks(400, row_bytes=1, cap_bytes=100, planned_rows=30, period_starts=[years, months])
    assert by_month is not None
    assert by_month[:3] == (31, 28, 31)
    assert sum(by_month) == 400
    assert calendar_chunks(400, row_bytes=1, cap_bytes=20, planned_rows=30, period_starts=[years, months]) is None
