"""Building and optimizing a computation's graph grows no faster than its tasks.

Work is counted, never timed: the Python calls made building an expression
and optimizing its graph (daskstream's planning and dask's own passes), over
virtual Zarr arrays (no chunk written) whose block count doubles.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import pytest
import zarr
from dask.core import flatten

import daskstream as ds
from daskstream.graph.optimize import optimize

#: How much faster than the tasks the counted work may grow from the smallest size to the largest.
SLACK = 1.2


def counted(work: Callable[[], Any]) -> tuple[Any, int, int]:
    """``work()``'s result, the Python calls it made, and how many of them were daskstream's own."""
    calls = ours = 0

    def profile(frame: Any, event: str, _: Any) -> None:
        nonlocal calls, ours
        if event == "call":
            calls += 1
            ours += "/daskstream/" in frame.f_code.co_filename

    sys.setprofile(profile)
    try:
        result = work()
    finally:
        sys.setprofile(None)
    return result, calls, ours


def centred_std(x):
    return (x - x.mean(axis=0)).std()


def mean(x):
    return x.mean()


LAYOUTS = {
    # Small 2-D storage chunks, the many-task case.
    "small-2d": (lambda rows: (rows * 256, 2048), (256, 256)),
    # ERA5's layout, narrowed: one time step block per task.
    "era5": (lambda rows: (rows * 4, 72, 144), (4, 72, 144)),
}


@pytest.mark.parametrize("expression", [mean, centred_std], ids=["mean", "centred-std"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_building_and_optimizing_a_graph_grows_with_its_tasks(tmp_path, layout, expression):
    shape_of, storage = LAYOUTS[layout]
    measured = []
    for rows in (16, 32, 64, 128):
        path = tmp_path / f"{rows}.zarr"
        zarr.create_array(str(path), shape=shape_of(rows), chunks=storage, dtype="f4")
        x = ds.open(path, chunks="storage")
        result, build_calls, _ = counted(functools.partial(expression, x))
        graph, keys = result.__dask_graph__(), list(flatten(result.__dask_keys__()))
        optimized, optimize_calls, ours = counted(functools.partial(optimize, graph, keys))
        measured.append((len(optimized), build_calls, optimize_calls, ours))
    (tasks_0, build_0, optimize_0, ours_0), (tasks_n, build_n, optimize_n, ours_n) = measured[0], measured[-1]
    growth = tasks_n / tasks_0
    assert growth >= 7  # the sizes did grow the work eightfold
    assert build_n / build_0 <= SLACK * growth, measured
    assert optimize_n / optimize_0 <= SLACK * growth, measured
    # daskstream's own planning of the graph walks its layers, not its tasks.
    assert ours_n / ours_0 <= SLACK * growth, measured
    assert ours_n < 0.2 * optimize_n, measured


class _Started(Exception):
    pass


def test_no_full_collection_runs_while_a_graph_is_optimized(tmp_path):
    """Python's collector walks every live object on each older-generation collection: while a graph of
    thousands of tasks is optimized (millions of objects alive), none runs, and the collector is on after."""
    import gc

    from dask.callbacks import Callback

    class StopAtFirstTask(Callback):
        def _start(self, dsk):
            raise _Started(len(dsk))

    # 8 GiB of metadata only, in 8,281 storage chunks: the centred std's graph keeps thousands of tasks.
    zarr.create_array(tmp_path / "v.zarr", shape=(46_592, 46_592), chunks=(512, 512), dtype="f4")
    x = ds.open(str(tmp_path / "v.zarr"))
    centred = (x - x.mean(axis=0)).std()
    # From a clean slate: what earlier tests left would otherwise bring the older generations' next
    # collection within the few young ones made outside the optimizer (building the expression, scheduling).
    gc.collect()
    before = [generation["collections"] for generation in gc.get_stats()]
    with pytest.raises(_Started) as started, StopAtFirstTask():
        centred.compute(scheduler="threads")
    collections = [generation["collections"] - count for generation, count in zip(gc.get_stats(), before)]
    assert started.value.args[0] > 1_000
    # Without the pause: some 90 collections of the youngest generation here, and 9 of the older ones.
    assert collections[1:] == [0, 0]
    assert collections[0] < 10
    assert gc.isenabled()
