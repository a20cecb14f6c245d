"""Adaptive stores on real files: the same target as a planned store, nothing computed twice, what was
chosen and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask.config
import numpy as np
import pytest
import zarr
from adaptive_fields import SHAPE, cli_environment, three_rows, three_rows_of, write

import daskstream as ds
from daskstream.errors import KernelError
from daskstream.runtime.metering import ReadMeter


def data() -> np.ndarray:
    rng = np.random.default_rng(11)
    return (rng.standard_normal(SHAPE) * 10 + 100).astype("f4")


def stencil(path: str):
    return ds.map_blocks(three_rows, ds.open(path), depth={0: 1}, boundary="nearest", dtype="f4")


@pytest.mark.parametrize("kind", ["npy", "hdf5", "zarr"])
def test_an_adaptive_store_of_a_stencil_writes_the_planned_target(tmp_path, adaptive, kind):
    values = data()
    y = stencil(write(tmp_path, kind, values))
    with ReadMeter() as planned_reads:
        ds.store(y, str(tmp_path / "planned.zarr"))
    with ReadMeter() as meter:
        stored = ds.store(y, str(tmp_path / "adaptive.zarr"), adaptive=True)
    adaptation = stored.adaptation
    assert adaptation.adapted, adaptation.explain()
    roles = [t.role for t in adaptation.tried]
    assert roles[0] == "planner"
    assert "larger tasks" in roles
    assert sum(t.nbytes for t in adaptation.tried) == values.nbytes
    planned = zarr.open_array(str(tmp_path / "planned.zarr"), mode="r")
    written = zarr.open_array(str(tmp_path / "adaptive.zarr"), mode="r")
    # The same target: chunks as planned, values equal to the planned store's and to numpy's.
    assert written.chunks == planned.chunks
    assert written.chunks[0] < SHAPE[0]
    np.testing.assert_array_equal(written[:], planned[:])
    np.testing.assert_allclose(written[:], three_rows_of(values), rtol=1e-6)
    np.testing.assert_array_equal(stored.compute(), planned[:])
    # Nothing is read twice: tasks covering several chunks read fewer halo rows, never more.
    assert values.nbytes <= meter.bytes_read <= planned_reads.bytes_read
    # The store is finished: running it again finds it complete.
    again = ds.store(y, str(tmp_path / "adaptive.zarr"), adaptive=True)
    assert not again.adaptation.adapted
    assert "nothing was written" in again.adaptation.reason


@pytest.mark.parametrize(
    ("budget", "passes", "scheduler"), [("16MiB", 2, "threads"), ("64MiB", 1, "threads"), ("16MiB", 2, "sync")]
)
def test_an_expression_with_an_aggregate_reads_what_a_planned_store_reads(
    tmp_path, adaptive, budget, passes, scheduler
):
    values = data()  # 32 MiB
    with dask.config.set({"daskstream.memory-budget": budget}), ds.session(scheduler, progress=False):
        x = ds.open(write(tmp_path, "npy", values))
        centred = x - x.mean()
        with ReadMeter() as planned_reads:
            ds.store(centred, str(tmp_path / "planned.zarr"))
        with ReadMeter() as meter:
            stored = ds.store(centred, str(tmp_path / "adaptive.zarr"), adaptive=True)
    # Twice (the mean, then the values written) where the array exceeds the budget; once where the planned
    # store holds it for the mean, and then the adaptive one writes as planned rather than read it twice.
    # (A store that cannot adapt, on another scheduler, leaves the mean to its own graph: computed once.)
    assert meter.bytes_read == planned_reads.bytes_read == passes * values.nbytes
    assert stored.adaptation.adapted == (passes == 2 and scheduler == "threads"), stored.adaptation.explain()
    if passes == 1:
        assert "read it twice" in stored.adaptation.reason
    np.testing.assert_array_equal(
        zarr.open_array(str(tmp_path / "adaptive.zarr"), mode="r")[:],
        zarr.open_array(str(tmp_path / "planned.zarr"), mode="r")[:],
    )


def test_a_conversion_copies_the_source_exactly_and_remembers_its_choice(tmp_path, adaptive):
    values = data()
    path = write(tmp_path, "zarr", values)
    first = ds.store(ds.open(path), str(tmp_path / "copy.zarr"), adaptive=True)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "copy.zarr"), mode="r")[:], values)
    assert first.adaptation.adapted
    assert "adaptive store over" in first.adaptation.explain()
    remembered = [e["adaptive"] for e in adaptive.entries().values() if "adaptive" in e]
    assert len(remembered) == 1
    assert tuple(remembered[0]["chunks"]) == first.adaptation.chunks
    # The next store of this kind of data starts from it.
    second = ds.store(ds.open(path), str(tmp_path / "copy2.zarr"), adaptive=True)
    assert "remembered" in second.adaptation.started_from
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "copy2.zarr"), mode="r")[:], values)


# Blocks the kernel below computes before it fails (None: it never fails).
BLOCKS_BEFORE_FAILING: dict[str, int | None] = {"left": None}


def fails_late(block: np.ndarray) -> np.ndarray:
    left = BLOCKS_BEFORE_FAILING["left"]
    if left is not None:
        if left <= 0:
            raise RuntimeError("interrupted on purpose")
        BLOCKS_BEFORE_FAILING["left"] = left - 1
    return block + 1


def test_what_cannot_run_in_waves_is_stored_as_planned_and_says_why(tmp_path, adaptive):
    values = data()
    path = write(tmp_path, "npy", values)
    y = stencil(path)
    # An HDF5 target: written by this process in batches.
    to_hdf5 = ds.store(y, str(tmp_path / "out.h5::/y"), adaptive=True)
    assert not to_hdf5.adaptation.adapted
    assert "HDF5" in to_hdf5.adaptation.reason
    assert "ran as planned" in to_hdf5.adaptation.explain()
    np.testing.assert_allclose(to_hdf5.compute(), three_rows_of(values), rtol=1e-6)
    # Another scheduler than threads.
    with ds.session("sync", progress=False):
        synced = ds.store(y, str(tmp_path / "sync.zarr"), adaptive=True)
    assert "threaded scheduler" in synced.adaptation.reason
    np.testing.assert_allclose(synced.compute(), three_rows_of(values), rtol=1e-6)
    # An array that is not computed region by region (rechunked on the way).
    rechunked = ds.store(ds.open(path).rechunk((1000, 512)), str(tmp_path / "rechunked.zarr"), adaptive=True)
    assert "region by region" in rechunked.adaptation.reason
    np.testing.assert_array_equal(rechunked.compute(), values)
    # A resumed store writes what is left as planned.
    x = ds.open(path)
    failing = ds.map_blocks(fails_late, x, dtype="f4")
    BLOCKS_BEFORE_FAILING["left"] = 20
    try:
        with pytest.raises(KernelError):
            ds.store(failing, str(tmp_path / "resumed.zarr"))
    finally:
        BLOCKS_BEFORE_FAILING["left"] = None
    assert os.listdir(tmp_path / "resumed.zarr" / ".daskstream-store" / "done")
    resumed = ds.store(failing, str(tmp_path / "resumed.zarr"), adaptive=True)
    assert "resumed" in resumed.adaptation.reason
    np.testing.assert_array_equal(resumed.compute(), values + 1)
    # Nothing adapted, so nothing is remembered.
    assert not [e for e in adaptive.entries().values() if "adaptive" in e]


def test_store_and_convert_print_the_choice(tmp_path, adaptive):
    values = data()
    path = write(tmp_path, "npy", values)
    env = cli_environment(tmp_path)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "daskstream", *args, "--adaptive", "--quiet", "--budget", "64MiB"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    shown = cli("store", path, str(tmp_path / "text.zarr"))
    assert shown.returncode == 0, shown.stderr
    assert "blocks written" in shown.stdout
    assert "adaptive store over" in shown.stdout
    assert "<- chosen" in shown.stdout
    as_json = cli("convert", path, str(tmp_path / "json.zarr"), "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["adaptive"]["adapted"]
    assert report["adaptive"]["operation"] == "store"
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "json.zarr"), mode="r")[:], values)
