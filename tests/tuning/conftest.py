"""Fixtures of the tuning tests."""

from __future__ import annotations

import dask.config
import pytest

from daskstream.runtime.remembered import TuneCache


@pytest.fixture
def adaptive(tmp_path):
    """A private tuning cache, and trials allowed on arrays of a few MiB (the defaults want runs of seconds)."""
    with dask.config.set(
        {
            "daskstream.tune.cache": str(tmp_path / "tune.json"),
            "daskstream.adaptive.min-seconds": 0,
            "daskstream.adaptive.trial-fraction": 0.5,
            "daskstream.memory-budget": "64MiB",
            "daskstream.planning.target-chunk-bytes": "256KiB",
            # Tasks of 256 KiB: a scheduler costed at 10 us a task keeps up with them (the default 0.1 ms
            # would grow them to 1 MB, too few for trials on arrays of a few MiB).
            "daskstream.planning.task-overhead": "10us",
            "scheduler": "threads",
        }
    ):
        yield TuneCache(tmp_path / "tune.json")
