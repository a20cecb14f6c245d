"""The ``daskstream`` command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "daskstream", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_writes_opens_plans_and_reduces(tmp_path):
    done = run("demo", "--size", "8MiB", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for fmt, name in (("npy", "field.npy"), ("hdf5", "field.h5"), ("zarr", "field.zarr")):
        assert f"== {fmt}:" in done.stdout
        assert (tmp_path / name).exists()
    assert done.stdout.count("Chunk plan for") == 3
    assert done.stdout.count("GB/s") == 3
    # The three formats hold the same data, so the three sums printed agree.
    sums = {line.split("sum = ")[1].split(",")[0] for line in done.stdout.splitlines() if line.startswith("sum = ")}
    assert len(sums) == 1


def test_demo_default_folder_is_temporary_and_removed():
    done = run("demo", "--size", "4MiB", "--formats", "npy")
    assert done.returncode == 0, done.stderr
    folder = done.stdout.split(" to ")[1].split("/field.npy")[0]
    import os

    assert not os.path.exists(folder)


def test_plan_json(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1000, 100), dtype="f4"))
    done = run("plan", str(tmp_path / "a.npy"), "--memory-budget", "1MiB", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["format"] == "npy"
    assert out["shape"] == [1000, 100]
    assert out["projected_peak_bytes"] <= 2**20
    assert sum(1 for _ in range(out["n_tasks"])) >= 2


@pytest.mark.parametrize("command", [[], ["demo"], ["plan"]], ids=["main", "demo", "plan"])
def test_help(command):
    done = run(*command, "--help")
    assert done.returncode == 0
    assert "Usage:" in done.stdout


def test_unknown_demo_format_is_a_usage_error():
    done = run("demo", "--formats", "tiff")
    assert done.returncode == 2
    assert "tiff" in done.stderr


def test_store_copies_and_refuses_to_overwrite(tmp_path):
    data = np.arange(3000, dtype="f4").reshape(300, 10)
    np.save(tmp_path / "a.npy", data)
    target = tmp_path / "out.zarr"
    done = run("store", str(tmp_path / "a.npy"), str(target), "--quiet")
    assert done.returncode == 0, done.stderr
    import zarr

    np.testing.assert_array_equal(zarr.open_array(target, mode="r")[...], data)
    again = run("store", str(tmp_path / "a.npy"), str(target), "--quiet")
    assert again.returncode == 2
    assert "out.zarr" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
