"""Dependencies: declared ranges that hold, optional APIs that fail naming versions, and a report for bug reports."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import numpy as np
import pytest
import zarr
from packaging.requirements import Requirement

from daskstream import dependencies
from daskstream.errors import DaskstreamError, MissingDependencyError


def test_every_core_dependency_is_installed_in_its_declared_range():
    core = [d for d in dependencies.declared() if d.extra is None]
    assert {d.name for d in core} >= {"dask", "distributed", "numpy", "zarr", "h5py", "numcodecs", "fsspec"}
    for dependency in core:
        assert dependency.satisfied, f"{dependency.name} {dependency.installed} is outside {dependency.specifier}"


def test_a_version_outside_the_range_is_not_satisfied():
    assert not dependencies.Dependency("numpy", ">=999", None, np.__version__).satisfied
    assert not dependencies.Dependency("numpy", ">=1", None, None).satisfied
    assert dependencies.Dependency("numpy", ">=1", None, np.__version__).satisfied


def test_a_missing_package_names_itself_and_how_to_install_it():
    with pytest.raises(MissingDependencyError) as caught:
        dependencies.optional_import("no_such_module", package="no-such-package", needed_for="this feature")
    assert isinstance(caught.value, ImportError)
    assert isinstance(caught.value, DaskstreamError)
    assert (
        str(caught.value) == "this feature needs no-such-package, which is not installed; pip install 'no-such-package'"
    )


def test_an_api_the_installed_version_lacks_names_the_version_found_and_needed():
    with pytest.raises(MissingDependencyError) as caught:
        dependencies.optional_import("numpy.no_such_api", package="numpy", needed_for="this feature")
    message = str(caught.value)
    assert f"numpy {np.__version__} cannot import" in message
    assert dependencies.floor("numpy") in message  # the range daskstream declares, e.g. >=1.26
    assert message.startswith("this feature needs numpy.no_such_api from numpy>=")


def test_the_declared_floors_are_those_of_pyproject(repo_root):
    import tomllib

    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        assert dependencies.floor(requirement.name) == str(requirement.specifier), requirement.name


_WITHOUT_CRC32C = """
import sys
import numcodecs.checksum32
# As numcodecs 0.15 is where no crc32c package is installed: without its CRC32C checksum.
del numcodecs.checksum32.CRC32C
import daskstream as ds
try:
    ds.open(sys.argv[1]).compute()
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


def test_a_zarr_checksum_without_the_crc32c_package_names_it(tmp_path):
    # The failure this replaces: "ImportError: cannot import name 'CRC32C' from 'numcodecs.checksum32'".
    array = zarr.create_array(tmp_path / "a.zarr", shape=(40,), chunks=(10,), shards=(20,), dtype="f4")
    array[:] = np.arange(40, dtype="f4")
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CRC32C, str(tmp_path / "a.zarr")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MissingDependencyError reading Zarr chunks with a crc32c checksum needs"), (
        done.stdout
    )
    assert f"numcodecs {importlib.metadata.version('numcodecs')} defines only beside a crc32c package" in done.stdout
    assert "pip install crc32c" in done.stdout


def test_the_command_prints_the_versions_for_bug_reports():
    for command in (["daskstream", "--versions"], [sys.executable, "-m", "daskstream", "info", "--versions"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("daskstream ")
        for name in ("dask", "zarr", "h5py", "numcodecs"):
            line = next(line for line in lines if line.split()[:1] == [name])
            assert importlib.metadata.version(name) in line
        assert any(line.strip().startswith("torch ") for line in lines)  # an optional feature, usable or not


def test_the_versions_as_json():
    done = subprocess.run(
        ["daskstream", "info", "--versions", "--json"], capture_output=True, text=True, timeout=120, check=True
    )
    facts = json.loads(done.stdout)
    assert facts["dependencies"]["numpy"]["installed"] == np.__version__
    assert facts["dependencies"]["numpy"]["needs"] == dependencies.floor("numpy")
    assert set(facts["usable_extras"]) >= {"torch", "scipy", "jobqueue"}
