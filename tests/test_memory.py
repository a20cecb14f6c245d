"""The memory budget is a promise: work over a source eight times the budget stays within it.

Each measurement runs in a fresh interpreter and reads the kernel's high-water
mark of its resident memory (VmHWM), which counts mapped file pages too, as
distributed's worker memory monitor does. The baseline is the same interpreter
with the same imports having computed a tiny array: what remains is what the
computation held at its peak.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

MiB = 2**20
BUDGET = 64 * MiB

_CHILD = """
import sys
import numpy as np
import daskstream as ds
import dask
path, budget, work = sys.argv[1], sys.argv[2], sys.argv[3]
with dask.config.set(scheduler="threads"):
    x = ds.open(path, memory_budget=budget)
    if work == "baseline":
        ds.describe(ds.open(sys.argv[4])).compute()
        ds.reduce(ds.open(sys.argv[4]), "std", axis=1).compute()
        ds.reduce(ds.open(sys.argv[4]), "median").compute()
        ds.store(ds.kernels.moving_mean(ds.open(sys.argv[4]), 3, axis=0), sys.argv[4] + ".zarr", overwrite=True)
    elif work == "sum":
        x.sum(dtype="f8").compute()
    elif work == "describe":
        ds.describe(x, memory_budget=budget).compute()
    elif work == "std":
        ds.reduce(x, "std", axis=1, memory_budget=budget).compute()
    elif work == "median":
        ds.reduce(x, "median", memory_budget=budget).compute()
    elif work == "stencil":
        y = ds.kernels.moving_mean(x, 3, axis=0)
        ds.store(y, sys.argv[4], overwrite=True)
print(int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024)
"""


def _peak(path, work, extra="") -> int:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(BUDGET), work, str(extra)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.fixture(scope="module")
def eight_budgets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory")
    path = folder / "field.npy"
    rows = 8 * BUDGET // (4 * 1024)  # 512 MiB of float32
    out = np.lib.format.open_memmap(path, mode="w+", dtype="f4", shape=(rows, 1024))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 4096):
        out[start : start + 4096] = rng.standard_normal((min(4096, rows - start), 1024), dtype="f4")
    out.flush()
    del out
    tiny = folder / "tiny.npy"
    np.save(tiny, np.ones((64, 64), dtype="f4"))
    baseline = _peak(tiny, "baseline", tiny)
    return folder, path, baseline


@pytest.mark.parametrize("work", ["sum", "describe", "std", "median", "stencil"])
def test_peak_memory_stays_within_the_budget_over_a_source_eight_times_larger(eight_budgets, work):
    folder, path, baseline = eight_budgets
    peak = _peak(path, work, folder / f"{work}.zarr")
    held = peak - baseline
    assert held <= BUDGET, f"{work}: held {held / MiB:.0f} MiB above the interpreter, budget {BUDGET / MiB:.0f} MiB"
