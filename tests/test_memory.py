"""The memory budget is a promise for whole analyses, over sources eight times the budget.

Each composition runs in a fresh interpreter, written as a user writes it
(dask's own operators on arrays from ``ds.open(..., memory_budget=...)``, then
``.compute()`` or ``ds.store``), and reads the kernel's high-water mark of its
resident memory (VmHWM), which counts mapped file pages too, as distributed's
worker memory monitor does. The same interpreter first runs the composition on
a tiny file, so that imports, thread pools and caches are in the baseline:
what remains is what the computation held at its peak. The bytes read are
counted too: each composition reads its sources the fewest times it can.

The distributed case runs compositions on real ``dask scheduler`` and
``dask worker`` processes whose memory limit is below the source's size, and
checks that no worker paused, spilled or restarted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import zarr

MiB = 2**20
BUDGET = 64 * MiB
ROWS = 8 * BUDGET // (4 * 1024)  # 512 MiB of float32, 1024 values a row

_CHILD = """
import json, sys
import dask, dask.array as da, numpy as np
import daskstream as ds
from daskstream.runtime.metering import ReadMeter

big, tiny, budget, work, folder = sys.argv[1:6]


def laplacian(block):
    out = -4 * block
    out[1:-1] += block[:-2] + block[2:]
    out[:, 1:-1] += block[:, :-2] + block[:, 2:]
    return out


def run(path, other, suffix):
    x = ds.open(path, memory_budget=budget)
    if work == "sum":
        return x.sum(dtype="f8").compute()
    if work == "describe":
        return ds.describe(x).compute()["std"]
    if work == "median":
        return ds.reduce(x, "median").compute()
    if work == "centering":
        return ds.reduce(x - x.mean(), "std").compute()
    if work == "anomaly-axis-0":
        return (x - x.mean(axis=0)).std(axis=0).max().compute()
    if work == "anomaly-axis-1":
        return (x - x.mean(axis=1, keepdims=True)).max().compute()
    if work == "standardized-stored":
        z = (x - x.mean(axis=0)) / x.std(axis=0)
        return ds.store(z, f"{folder}/z{suffix}.zarr", overwrite=True)[0, 0].compute()
    if work == "divided-by-global-max":
        return (x / x.max()).sum().compute()
    if work == "stencil-reduced":
        return ds.reduce(ds.map_blocks(laplacian, x, depth=1, boundary="nearest"), "max").compute()
    if work == "stencil-stored":
        y = ds.kernels.moving_mean(x, 3, axis=0)
        return ds.store(y, f"{folder}/s{suffix}.h5::/s", overwrite=True)[0, 0].compute()
    if work == "two-stencils":
        return ds.map_blocks(laplacian, ds.map_blocks(laplacian, x, depth=1), depth=1).max().compute()
    if work == "two-sources":
        y = ds.open(other, memory_budget=budget)
        return ((x - y) / (x + y).mean()).std().compute()
    if work == "above-the-quantile":
        return da.where(x > ds.reduce(x, "quantile", q=0.99), x, 0).sum().compute()
    if work == "stencil-of-standardized":
        z = (x - x.mean(axis=0)) / x.std(axis=0)
        return ds.map_blocks(laplacian, z, depth=1).max().compute()
    if work == "deep-halo-reflect":  # a halo of 48 cells a side, reflected at the edges
        return ds.map_blocks(lambda b: b * 2, x, depth=48, boundary="reflect", dtype="f4").sum().compute()
    if work == "deep-halo-constant-rows":  # a deep halo along one axis only, a constant beyond the edges
        return ds.map_blocks(lambda b: b - 1, x, depth={0: 60}, boundary=0.0, dtype="f4").max().compute()
    if work == "shuffled-stream":
        return sum(len(batch) for batch in ds.stream(x, shuffle=True, seed=0, shuffle_blocks=16))
    raise SystemExit(f"unknown work {work}")


def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024


with dask.config.set(scheduler="threads"):
    run(tiny, tiny.replace(".npy", ".zarr"), "-tiny")
    baseline = peak()
    with ReadMeter() as meter:
        result = run(big, big.replace(".npy", ".zarr"), "")
print(json.dumps({"held": peak() - baseline, "read": meter.bytes_read, "result": float(np.asarray(result))}))
"""


def _measure(folder, work) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(folder / "field.npy"),
            str(folder / "tiny.npy"),
            str(BUDGET),
            work,
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _field(rows, seed=0):
    rng = np.random.default_rng(seed)
    for start in range(0, rows, 4096):
        yield start, rng.standard_normal((min(4096, rows - start), 1024), dtype="f4")


@pytest.fixture(scope="module")
def eight_budgets(tmp_path_factory):
    """512 MiB of float32 as .npy, and a second source as Zarr with other chunks; tiny ones of each."""
    folder = tmp_path_factory.mktemp("memory")
    out = np.lib.format.open_memmap(folder / "field.npy", mode="w+", dtype="f4", shape=(ROWS, 1024))
    other = zarr.create_array(folder / "field.zarr", shape=(ROWS, 1024), chunks=(512, 256), dtype="f4")
    for start, block in _field(ROWS):
        out[start : start + len(block)] = block
        other[start : start + len(block)] = block[::-1] * 0.5 + 3
    out.flush()
    del out
    np.save(folder / "tiny.npy", np.ones((64, 64), dtype="f4"))
    zarr.create_array(folder / "tiny.zarr", shape=(64, 64), chunks=(32, 32), dtype="f4")[...] = 2
    return folder


# The passes over the data each composition needs: its sources read once per pass, no more.
PASSES = {
    "sum": 1,
    "describe": 1,
    "median": 2,
    "centering": 2,
    "anomaly-axis-0": 2,
    "anomaly-axis-1": 1,
    "standardized-stored": 2,
    "divided-by-global-max": 2,
    "stencil-reduced": 1,
    "stencil-stored": 1,
    "two-stencils": 1,
    "two-sources": 2,
    "above-the-quantile": 3,
    "stencil-of-standardized": 2,
    "shuffled-stream": 1,
    "deep-halo-reflect": 1,
    "deep-halo-constant-rows": 1,
}
# A deep halo is read with every block: blocks near square keep that to a share of the source.
HALO_READ = {"deep-halo-reflect": 1.6, "deep-halo-constant-rows": 1.6}


@pytest.mark.parametrize("work", list(PASSES))
def test_a_composition_over_a_source_eight_times_the_budget_stays_within_it(eight_budgets, work):
    measured = _measure(eight_budgets, work)
    held = measured["held"]
    assert held <= BUDGET, f"{work}: held {held / MiB:.0f} MiB above the interpreter, budget {BUDGET / MiB:.0f} MiB"
    nbytes = ROWS * 1024 * 4 * (2 if work == "two-sources" else 1)
    # Halos are read with their blocks: a stencil reads a little more than its source.
    most = PASSES[work] * nbytes * HALO_READ.get(work, 1.05)
    assert PASSES[work] * nbytes <= measured["read"] <= most, (
        f"{work}: read {measured['read'] / nbytes:.2f}x the source"
    )


_DISTRIBUTED = """
import json, sys
import dask
import daskstream as ds


def laplacian(block):
    out = -4 * block
    out[1:-1] += block[:-2] + block[2:]
    return out


results = {}
with ds.session(sys.argv[2], progress=False) as s:
    x = ds.open(sys.argv[1])
    results["budget"] = ds.plan_compute(x.sum()).budget
    results["centering"] = float(s.compute(ds.reduce(x - x.mean(), "std"))[0])
    results["standardized"] = float(s.compute(((x - x.mean(axis=0)) / x.std(axis=0)).max())[0])
    results["stencil"] = float(s.compute(ds.map_blocks(laplacian, x, depth=1).max())[0])
    statuses = [w["status"] for w in s.client.scheduler_info(n_workers=-1)["workers"].values()]
    results["statuses"] = statuses
print(json.dumps(results))
"""


def test_workers_below_the_sources_size_never_pause_spill_or_restart(eight_budgets, start_dask_processes, tmp_path):
    scheduler_file = start_dask_processes(tmp_path, memory_limit="400MiB")
    address = json.loads(scheduler_file.read_text())["address"]
    done = subprocess.run(
        [sys.executable, "-c", _DISTRIBUTED, str(eight_budgets / "field.npy"), address],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    data = np.load(eight_budgets / "field.npy", mmap_mode="r")
    assert results["budget"] < 400 * MiB
    np.testing.assert_allclose(results["centering"], np.std(data[:65536]), rtol=5e-2)  # a standard normal field
    assert results["statuses"] == ["running", "running"]
    logs = (tmp_path / "scheduler.log").read_text() + (tmp_path / "workers.log").read_text()
    for event in ("Pausing worker", "paused", "spill", "Unmanaged memory use is high", "Restarting", "killed"):
        assert event.lower() not in logs.lower(), f"{event!r} in the cluster's logs:\n{logs[-3000:]}"
