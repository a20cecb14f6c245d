"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
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


def run_fresh(module: str, spec: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <module> --one <spec as JSON>`` in a fresh interpreter, from the repository with it on the
    path, its output captured (``subprocess.TimeoutExpired`` past ``timeout`` seconds)."""
    repository = Path(__file__).resolve().parent.parent
    path = os.pathsep.join(filter(None, [str(repository), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", module, "--one", json.dumps(spec)]
    return subprocess.run(
        command, cwd=repository, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, timeout=timeout
    )


def marked_report(stdout: str, mark: str) -> Any:
    """The JSON a run printed after ``mark`` on its last line starting with it; ``None`` where none does."""
    line = next((s for s in reversed(stdout.splitlines()) if s.startswith(mark)), None)
    return None if line is None else json.loads(line[len(mark) :])


def write_results(out: str | None, table: str, document: Any) -> None:
    """``table`` to ``<out>.md`` and ``document`` to ``<out>.json`` (nothing when ``out`` is ``None``)."""
    if not out:
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".md").write_text(table + "\n")
    Path(out + ".json").write_text(json.dumps(document, indent=1) + "\n")
