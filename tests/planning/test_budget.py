"""Memory budgets: what parse_budget takes, what it refuses, and that every entry point refuses the same."""

from __future__ import annotations

from fractions import Fraction

import dask.config
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import DaskstreamError, InvalidBudgetError
from daskstream.planning.budget import MAX_BUDGET_BYTES, parse_budget


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("512MiB", 512 * 2**20),
        ("2 GB", 2 * 10**9),
        (4096, 4096),
        (4096.7, 4096),
        (np.int64(4096), 4096),
        (np.float32(1024), 1024),
        (Fraction(9, 2), 4),
        ("1024PiB", 2**60),
        (2**60, 2**60),
    ],
)
def test_sizes_are_bytes(value, expected):
    assert parse_budget(value) == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (float("inf"), "not a finite size"),
        (float("-inf"), "not a finite size"),
        (float("nan"), "not a finite size"),
        (np.float64("nan"), "not a finite size"),
        ("inf", "not a finite size"),
        ("nan", "not a finite size"),
        ("1e400", "not a finite size"),
        ("-1e400", "not a finite size"),
        ("1e400 kB", "not a finite size"),
        (1e30, "more than 1 EiB"),
        ("1e30", "more than 1 EiB"),
        (np.float32(1e30), "more than 1 EiB"),
        (2**60 + 1, "more than 1 EiB"),
        (2**64, "more than 1 EiB"),
        ("1025PiB", "more than 1 EiB"),
        (True, "not a size"),
        (False, "not a size"),
        (None, "not a size"),
        ([2**20], "not a size"),
        ("lots", "not a size"),
        ("", "is empty"),
        ("   ", "is empty"),
        (0, "more than 0 bytes"),
        (0.5, "more than 0 bytes"),
        ("-1GiB", "more than 0 bytes"),
    ],
)
def test_what_is_not_a_budget_is_refused_naming_the_value_with_an_example(value, says):
    with pytest.raises(InvalidBudgetError) as caught:
        parse_budget(value, name="memory_budget")
    assert isinstance(caught.value, DaskstreamError)
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert f"memory_budget={value!r}" in message
    assert says in message
    assert '"512MiB"' in message


def test_a_huge_int_is_refused_and_shortened_in_the_one_line_message():
    with pytest.raises(InvalidBudgetError) as caught:
        parse_budget(10**400, name="size")
    message = str(caught.value)
    assert message.startswith("size=1000000")
    assert "401 characters" in message
    assert "more than 1 EiB" in message
    assert len(message) < 300
    assert "\n" not in message


def test_the_limit_is_1_eib():
    assert MAX_BUDGET_BYTES == 2**60
    assert parse_budget(MAX_BUDGET_BYTES) == MAX_BUDGET_BYTES


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "small.npy"
    np.save(path, np.arange(1000, dtype="f8").reshape(100, 10))
    return str(path)


ENTRY_POINTS = {
    "open": lambda path, budget: ds.open(path, memory_budget=budget),
    "plan_chunks": lambda path, budget: ds.plan_chunks((100, 10), "f8", memory_budget=budget),
    "session": lambda path, budget: ds.session("sync", memory_budget=budget, progress=False),
    "reduce": lambda path, budget: ds.reduce(ds.open(path), "sum", memory_budget=budget),
    "histogram": lambda path, budget: ds.reduce(ds.open(path), "histogram", range=(0, 1), memory_budget=budget),
    "describe": lambda path, budget: ds.describe(ds.open(path), memory_budget=budget),
    "setting": lambda path, budget: _with_setting(path, budget),
}


def _with_setting(path, budget):
    with dask.config.set({"daskstream.memory-budget": budget}):
        return ds.open(path)


@pytest.mark.parametrize("budget", [float("inf"), float("-inf"), float("nan"), "1e400", 10**400, 1e30])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_refuses_a_non_finite_or_absurd_budget(npy, entry, budget):
    with pytest.raises(InvalidBudgetError) as caught:
        ENTRY_POINTS[entry](npy, budget)
    assert isinstance(caught.value, DaskstreamError)
    assert isinstance(caught.value, ValueError)
    assert "memory_budget=" in str(caught.value)
