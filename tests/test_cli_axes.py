"""``--axis`` by dimension name for labelled inputs: the same result as the axis number, numpy the oracle."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

xr = pytest.importorskip("xarray")


@pytest.fixture
def labelled(tmp_path):
    data = np.random.default_rng(1).standard_normal((20, 6, 8)).astype("f4")
    path = tmp_path / "t.nc"
    xr.Dataset({"t": (("time", "lat", "lon"), data)}).to_netcdf(path, engine="h5netcdf")
    return f"{path}::t", data


def _daskstream(*args):
    return subprocess.run(
        [sys.executable, "-m", "daskstream", *map(str, args)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(("names", "axes"), [(["time"], (0,)), (["lat", "lon"], (1, 2)), (["lon", "0"], (2, 0))])
def test_reduce_takes_dimension_names_as_the_file_names_them(labelled, names, axes):
    path, data = labelled
    flags = [part for name in names for part in ("--axis", name)]
    done = _daskstream("reduce", path, "--op", "max", *flags, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["axis"] == list(axes)
    np.testing.assert_array_equal(np.asarray(report["result"]), data.max(axis=axes))


def test_describe_takes_a_dimension_name(labelled):
    path, data = labelled
    done = _daskstream("describe", path, "--axis", "time", "--json")
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(np.asarray(json.loads(done.stdout)["mean"]), data.astype("f8").mean(axis=0), rtol=1e-9)


def test_an_unknown_name_is_one_line_listing_the_dimensions(labelled):
    path, _ = labelled
    done = _daskstream("reduce", path, "--op", "mean", "--axis", "depth")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "--axis depth" in line
    assert "time, lat, lon" in line


def test_a_file_without_dimension_names_says_so(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 4), "f4"))
    done = _daskstream("reduce", tmp_path / "a.npy", "--op", "mean", "--axis", "time")
    assert done.returncode == 2
    assert "names no dimensions" in done.stderr
