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

import daskstream as ds
from daskstream import dependencies
from daskstream.errors import CorruptSourceError, DaskstreamError, MissingDependencyError


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
numcodecs.checksum32.__dict__.pop("CRC32C", None)
sys.modules["crc32c"] = None  # and no crc32c package to import
import numpy as np
import daskstream as ds
print(float(np.asarray(ds.open(sys.argv[1])).sum()))
"""


def test_zarr_checksums_are_checked_without_numcodecs_crc32c(tmp_path):
    # The failure this replaces: "ImportError: cannot import name 'CRC32C' from 'numcodecs.checksum32'".
    array = zarr.create_array(tmp_path / "a.zarr", shape=(40,), chunks=(10,), shards=(20,), dtype="f4")
    array[:] = np.arange(40, dtype="f4")
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CRC32C, str(tmp_path / "a.zarr")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == float(np.arange(40).sum())


def test_zarr_checksums_are_computed_in_c():
    # google-crc32c falls back to pure Python (about 100 times slower, with a RuntimeWarning) where
    # its C extension does not load: as 1.5 does without setuptools' pkg_resources.
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "import google_crc32c; print(google_crc32c.implementation)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "c"


def test_a_zarr_checksum_that_does_not_match_is_an_error_naming_the_chunk(tmp_path):
    from zarr.codecs import Crc32cCodec, ZstdCodec

    array = zarr.create_array(
        tmp_path / "a.zarr", shape=(40,), chunks=(20,), dtype="f4", compressors=[ZstdCodec(), Crc32cCodec()]
    )
    array[:] = np.arange(40, dtype="f4")
    chunk = tmp_path / "a.zarr" / "c" / "1"
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 0xFF  # the stored checksum, so the compressed bytes still decode
    chunk.write_bytes(bytes(raw))
    source = ds.open_source(tmp_path / "a.zarr")
    np.testing.assert_array_equal(source.read((slice(0, 20),)), np.arange(20, dtype="f4"))
    with pytest.raises(CorruptSourceError, match="chunk 'c/1'") as caught:
        source.read((slice(20, 40),))
    assert "crc32c checksum" in str(caught.value.__cause__)


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


def test_tensorflows_cpu_build_meets_a_requirement_on_tensorflow(monkeypatch):
    # tensorflow-cpu installs the package tensorflow under another distribution name (as CI installs it).
    installed = {"tensorflow-cpu": "2.21.0"}
    monkeypatch.setattr(dependencies, "installed_version", installed.get)
    assert dependencies._provided_version("tensorflow") == "2.21.0"
    assert dependencies._provided_version("torch") is None
    monkeypatch.setattr(dependencies, "floor", lambda name: ">=2.16")
    assert dependencies.optional_import("numpy", package="tensorflow", needed_for="a test").__name__ == "numpy"
    installed["tensorflow-cpu"] = "2.15.1"
    with pytest.raises(MissingDependencyError, match=r"needs tensorflow>=2.16, and tensorflow 2.15.1 is installed"):
        dependencies.optional_import("numpy", package="tensorflow", needed_for="a test")
