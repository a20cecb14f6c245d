"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
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


def write_results(out: str | None, table: str, document: Any) -> None:
    """``table`` to ``<out>.md`` and ``document`` to ``<out>.json`` (nothing when ``out`` is ``None``)."""
    if not out:
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".md").write_text(table + "\n")
    Path(out + ".json").write_text(json.dumps(document, indent=1) + "\n")
