"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def clocked(run: Callable[[], Any]) -> float:
    """Seconds ``run()`` took."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def warm_median(seconds: Callable[[], float], repeats: int) -> float:
    """The median of ``repeats`` calls of ``seconds`` (each returns its time), after one that warms
    the page cache and the code paths."""
    seconds()
    return statistics.median(seconds() for _ in range(repeats))
