"""ds.list and `daskstream info FILE`: the tree of real HDF5 files and Zarr stores, as h5py and zarr see them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import DaskstreamError, UnknownFormatError


@pytest.fixture
def scan(tmp_path):
    """A NeXus-like HDF5 file: groups with attributes, a chunked gzip dataset with a dimension scale and
    units, variable-length strings, and a soft link."""
    path = tmp_path / "scan.h5"
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "a scan"
        entry = f.create_group("entry")
        entry.attrs["NX_class"] = "NXentry"
        time = entry.create_dataset("time", data=np.arange(10.0))
        time.make_scale("time")
        data = entry.create_dataset("data", data=np.ones((10, 20), "f4"), chunks=(5, 20), compression="gzip")
        data.dims[0].attach_scale(time)
        data.attrs["units"] = "K"
        entry.create_dataset("names", data=["a", "bb"], dtype=h5py.string_dtype())
        f["shortcut"] = h5py.SoftLink("/entry/data")
    return path


def test_an_hdf5_files_tree_lists_what_h5py_sees(scan):
    tree = ds.list(scan)
    assert isinstance(tree, ds.Listing)
    with h5py.File(scan, "r") as f:
        datasets = []
        f.visititems(lambda name, obj: datasets.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
        assert tree.arrays == sorted(datasets)
        data = tree["/entry/data"]
        assert data.shape == f["entry/data"].shape
        assert data.dtype == "float32"
        assert data.chunks == f["entry/data"].chunks
        assert data.codecs == ("deflate",)
        assert data.nbytes == f["entry/data"].nbytes
    assert data.dims == ("time", None)
    assert data.attrs == {"units": "K"}
    assert tree["/entry"].kind == "group"
    assert tree["/entry"].attrs == {"NX_class": "NXentry"}
    assert tree["/"].attrs == {"title": "a scan"}
    assert tree["/entry/names"].dtype.startswith("string (variable length")
    link = tree["/shortcut"]
    assert (link.kind, link.target) == ("link", "/entry/data")
    # Every array listed opens by the path the tree gives.
    for path in tree.arrays:
        if path != "/entry/names":
            assert ds.open(scan, dataset=path).shape == tree[path].shape
    text = tree.text()
    assert "entry/" in text
    assert "data  float32 (10, 20)  chunks (5, 20)  deflate" in text
    assert "@units = 'K'" in text
    assert "shortcut -> /entry/data" in text
    html = tree._repr_html_()
    for shown in ("<table>", "NXentry", "float32", "shortcut"):
        assert shown in html
    assert json.loads(json.dumps(tree.to_dict()))["entries"][0]["path"] == "/"


def test_a_zarr_stores_tree_and_a_npy_file(tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    temperature = group.create_array("t", shape=(100, 4), chunks=(10, 4), dtype="i2", dimension_names=["time", "x"])
    temperature.attrs["units"] = "degC"
    group.create_group("sub").create_array("u", shape=(3,), dtype="f8")
    tree = ds.list(tmp_path / "g.zarr")
    assert tree.format == "zarr"
    assert tree.arrays == ["/sub/u", "/t"]
    t = tree["t"]
    assert (t.shape, t.dtype, t.chunks, t.dims, t.attrs) == (
        (100, 4),
        "int16",
        (10, 4),
        ("time", "x"),
        {"units": "degC"},
    )
    assert "zstd" in t.codecs
    np.save(tmp_path / "a.npy", np.zeros((5, 6), "u1"))
    one = ds.list(tmp_path / "a.npy")
    assert [(e.kind, e.shape, e.dtype) for e in one] == [("array", (5, 6), "uint8")]


def test_info_prints_the_tree_of_a_file_of_several_arrays(scan):
    shown = subprocess.run([sys.executable, "-m", "daskstream", "info", str(scan)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "3 array(s)" in shown.stdout
    assert "data  float32 (10, 20)" in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", str(scan), "--json"], capture_output=True, text=True
    )
    assert as_json.returncode == 0, as_json.stderr
    paths = [e["path"] for e in json.loads(as_json.stdout)["entries"] if e["kind"] == "array"]
    assert paths == ["/entry/data", "/entry/names", "/entry/time"]
    # One dataset named: its facts, as before.
    one = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", f"{scan}::/entry/data", "--json"], capture_output=True, text=True
    )
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["shape"] == [10, 20]


def test_a_netcdf3_file_is_named_for_what_it_is(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    path = tmp_path / "classic.nc"
    with scipy_io.netcdf_file(path, "w") as f:
        f.createDimension("time", 4)
        f.createVariable("t", "f4", ("time",))[:] = np.arange(4)
    with pytest.raises(UnknownFormatError, match=r"netCDF-3 file \(classic format\)") as caught:
        ds.open(path)
    assert isinstance(caught.value, DaskstreamError)
    assert "nccopy" in str(caught.value)
    shown = subprocess.run([sys.executable, "-m", "daskstream", "info", str(path)], capture_output=True, text=True)
    assert shown.returncode == 2
    assert len(shown.stderr.strip().splitlines()) == 1
    assert "netCDF-3" in shown.stderr


FIXTURE = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "zarr-v2-fixture"


@pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"the zarr v2 fixture is not at {FIXTURE}")
def test_the_zarr_v2_fixture_lists_every_array_zarr_opens_and_flags_those_it_cannot():
    fixture = FIXTURE
    tree = ds.list(fixture)
    assert len(tree.arrays) > 150
    for path in tree.arrays:
        entry = tree[path]
        try:
            array = zarr.open_array(str(fixture / path.strip("/")), mode="r")
        except Exception:
            assert entry.dtype.startswith("not readable by zarr"), path
            assert entry.shape is None
            continue
        assert (entry.shape, entry.dtype) == (tuple(array.shape), str(array.dtype)), path
        assert entry.nbytes == array.nbytes, path
    assert "not readable by zarr" in tree.text()
