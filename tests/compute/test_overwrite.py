"""Overwrite by swap: whatever reads the target, nothing there changes until the new array is whole.

numpy, zarr and h5py are the oracles; every reader a user may put in a graph is tried, mixed by hypothesis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import dask
import dask.array as da
import h5py
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.compute.store.swap import recover_folder, staged_places, swap_folders
from daskstream.errors import TargetExistsError
from daskstream.safe_writes import os_place

DATA = np.arange(24 * 16, dtype="f8").reshape(24, 16)


def _zarr_target(folder: str, member: str | None = None) -> str:
    path = os.path.join(folder, "a.zarr")
    if member is None:
        zarr.create_array(path, data=DATA, chunks=(6, 8))
        return path
    # No fill value: daskstream reads the numbers as stored, which then need no decoding.
    dataset = xr.Dataset({member: (("t", "x"), DATA)})
    dataset.to_zarr(path, mode="w", consolidated=False, encoding={member: {"_FillValue": None}})
    return f"{path}::{member}"


def _hdf5_target(folder: str) -> str:
    path = os.path.join(folder, "a.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=DATA, chunks=(6, 8))
        f.create_dataset("kept", data=DATA[:2])
    return f"{path}::/x"


def _read_target(target: str) -> np.ndarray:
    path, _, member = target.partition("::")
    if path.endswith(".h5"):
        with h5py.File(path, "r") as f:
            return f[member][()]
    return zarr.open_array(path, path=member or "", mode="r")[...]


# Each reader of the target a graph may hold, as (name, how to build it from the target, its values).
def _readers(target: str, kind: str) -> dict:
    path, _, member = target.partition("::")
    readers = {
        "daskstream": lambda: ds.open(target),
        "daskstream map_blocks": lambda: ds.map_blocks(lambda b: b + 0, ds.open(target)),
        "daskstream clip": lambda: ds.kernels.clip(ds.open(target), -1e9, 1e9),
    }
    if kind == "zarr":
        readers["da.from_zarr path"] = lambda: da.from_zarr(path, component=member or None)
        readers["da.from_zarr array"] = lambda: da.from_zarr(zarr.open_array(path, path=member or "", mode="r"))

        def captured():
            array = zarr.open_array(path, path=member or "", mode="r")
            return da.from_array(np.zeros_like(DATA), chunks=(6, 8)).map_blocks(
                lambda b, block_info=None: b + array[tuple(slice(*r) for r in block_info[0]["array-location"])],
                dtype=DATA.dtype,
            )

        readers["closure over zarr"] = captured
        if member:
            readers["xarray"] = lambda: xr.open_zarr(path, consolidated=False)[member].data
    return readers


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["zarr", "zarr member", "hdf5"]),
    picks=st.lists(st.integers(0, 10), min_size=1, max_size=3),
    scale=st.sampled_from([2.0, -1.0, 0.5]),
)
def test_any_graph_of_readers_stores_onto_its_source_with_the_right_result(kind, picks, scale):
    with tempfile.TemporaryDirectory() as folder:
        target = (
            _hdf5_target(folder) if kind == "hdf5" else _zarr_target(folder, "v" if kind == "zarr member" else None)
        )
        readers = _readers(target, "hdf5" if kind == "hdf5" else "zarr")
        names = sorted(readers)
        chosen = [names[pick % len(names)] for pick in picks]
        x = sum(readers[name]() for name in chosen) * scale
        expected = DATA * len(chosen) * scale
        # HDF5 lets only this process's threads read a file it writes.
        with dask.config.set(scheduler="threads"):
            stored = ds.store(x, target, overwrite=True)
            np.testing.assert_array_equal(stored.compute(), expected)
        np.testing.assert_array_equal(_read_target(target), expected)
        if kind == "hdf5":
            with h5py.File(target.split("::")[0], "r") as f:
                assert sorted(f) == ["kept", "x"]  # nothing staged or set aside is left
                np.testing.assert_array_equal(f["kept"][()], DATA[:2])
        else:
            left = sorted(os.listdir(folder))
            assert left == ["a.zarr"], left


def test_without_overwrite_an_existing_target_is_never_touched(tmp_path):
    target = _zarr_target(str(tmp_path))
    with pytest.raises(TargetExistsError):
        ds.store(da.from_zarr(target) * 2, target)
    np.testing.assert_array_equal(_read_target(target), DATA)


def test_a_stale_staging_of_another_computation_is_replaced_and_the_target_kept_meanwhile(tmp_path):
    target = _zarr_target(str(tmp_path))
    staged, _ = staged_places(target, target, None)
    zarr.create_array(staged, data=np.ones(3))  # left by something else: not this store
    ds.store(ds.open(target) + 1, target, overwrite=True)
    np.testing.assert_array_equal(_read_target(target), DATA + 1)
    assert sorted(os.listdir(tmp_path)) == ["a.zarr"]


@pytest.mark.parametrize("left", ["target and aside", "staged and aside", "aside alone"])
def test_a_swap_cut_short_is_finished_or_undone_by_the_next_store(tmp_path, left):
    target = _zarr_target(str(tmp_path))
    staged, aside = staged_places(target, target, None)
    zarr.create_array(staged, data=DATA * 5, chunks=(6, 8))
    if left == "target and aside":
        swap_folders(staged, target, aside)
        zarr.create_array(aside, data=DATA)  # the old one, whose removal was cut short
        expected = DATA * 5
    elif left == "staged and aside":
        os.replace(target, aside)  # killed between the two renames
        expected = DATA * 5
    else:
        os.replace(target, aside)
        import shutil

        shutil.rmtree(staged)
        expected = DATA
    recover_folder(target, staged, aside)
    np.testing.assert_array_equal(_read_target(target), expected)
    assert not os.path.exists(aside)


def test_a_store_killed_while_replacing_leaves_the_old_array_and_resumes(tmp_path):
    target = _zarr_target(str(tmp_path))
    script = textwrap.dedent(
        f"""
        import time, numpy as np, dask, daskstream as ds
        def slow(b):
            time.sleep(0.2)
            return b * 2
        x = ds.map_blocks(slow, ds.open({target!r}))
        print("started", flush=True)
        with dask.config.set(scheduler="threads", num_workers=1):
            ds.store(x, {target!r}, overwrite=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    staged, _ = staged_places(target, target, None)
    deadline = time.monotonic() + 60
    while not os.path.isdir(os.path.join(staged, ".daskstream-store", "done")) or not os.listdir(
        os.path.join(staged, ".daskstream-store", "done")
    ):
        assert time.monotonic() < deadline, "the store never began writing"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdout.close()
    # Killed mid-write: the target is the old array, whole.
    np.testing.assert_array_equal(_read_target(target), DATA)
    written_before = set(os.listdir(os.path.join(staged, ".daskstream-store", "done")))
    assert written_before
    # Run again: the staged store resumes (its blocks written before are kept), then swaps in.
    done = []
    ds.store(
        ds.map_blocks(lambda b: b * 2, ds.open(target)),
        target,
        overwrite=True,
        progress=lambda d, t: done.append((d, t)),
    )
    np.testing.assert_array_equal(_read_target(target), DATA * 2)
    assert done[0][0] >= 0
    assert sorted(os.listdir(tmp_path)) == ["a.zarr"]


@pytest.fixture
def linked(tmp_path):
    """data/s.zarr and other/s.zarr, and other/L leading to data/sub: other/L/../s.zarr is data/s.zarr for
    the system, where a path read as text would name other/s.zarr."""
    data, other = tmp_path / "data", tmp_path / "other"
    (data / "sub").mkdir(parents=True)
    other.mkdir()
    os.symlink(data / "sub", other / "L")
    zarr.create_array(data / "s.zarr", data=DATA, chunks=(6, 8))
    zarr.create_array(other / "s.zarr", data=-DATA, chunks=(6, 8))
    return data, other


def test_a_target_spelled_through_a_link_and_dotdot_is_where_the_system_goes(linked):
    data, other = linked
    spelled = str(other / "L" / ".." / "s.zarr")
    assert os_place(spelled) == str(data / "s.zarr")
    ds.store(ds.open(data / "s.zarr") * 3, spelled, overwrite=True)
    np.testing.assert_array_equal(_read_target(str(data / "s.zarr")), DATA * 3)
    np.testing.assert_array_equal(_read_target(str(other / "s.zarr")), -DATA)  # never touched


def test_the_command_stores_onto_a_linked_spelling_of_its_source(linked):
    data, other = linked
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "daskstream",
            "store",
            str(data / "s.zarr"),
            str(other / "L" / ".." / "s.zarr"),
            "--overwrite",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(_read_target(str(data / "s.zarr")), DATA)
    np.testing.assert_array_equal(_read_target(str(other / "s.zarr")), -DATA)


@settings(max_examples=40, deadline=None)
@given(hops=st.lists(st.sampled_from(["link", "dir", "dot", "up-after-dir"]), max_size=5))
def test_os_place_reaches_what_the_system_reaches(hops):
    with tempfile.TemporaryDirectory() as root:
        root = os.path.realpath(root)
        os.makedirs(os.path.join(root, "far", "deep"))
        os.makedirs(os.path.join(root, "near"))
        os.symlink(os.path.join(root, "far", "deep"), os.path.join(root, "near", "link"))
        os.symlink(os.path.join(root, "far", "deep"), os.path.join(root, "far", "deep", "link"))
        os.makedirs(os.path.join(root, "far", "deep", "dir"))
        os.makedirs(os.path.join(root, "near", "dir"))
        spelled = os.path.join(root, "near")
        for hop in hops:
            if hop == "link" and os.path.lexists(os.path.join(spelled, "link")):
                spelled = os.path.join(spelled, "link")
            elif hop == "dir" and os.path.isdir(os.path.join(spelled, "dir")):
                spelled = os.path.join(spelled, "dir")
            elif hop == "dot":
                spelled = os.path.join(spelled, ".")
            elif hop == "up-after-dir" and os.path.isdir(os.path.join(spelled, "dir")):
                spelled = os.path.join(spelled, "dir", "..")
        target = os.path.join(spelled, "new.zarr")
        os.mkdir(target)  # the system makes it where it reaches; os_place must name that folder
        placed = os_place(target)
        assert os.path.samefile(placed, target)
        assert os.path.realpath(placed) == placed


def test_a_dataset_stored_onto_its_own_store_swaps_its_variables_together(tmp_path):
    # b is computed from a: were a put in place before b is computed, b would read the new a.
    path = tmp_path / "d.zarr"
    encoding = {name: {"_FillValue": None} for name in ("a", "b")}
    xr.Dataset({"a": (("t", "x"), DATA), "b": (("t", "x"), -DATA)}).to_zarr(path, encoding=encoding, zarr_format=2)
    opened = xr.open_zarr(path)
    new = xr.Dataset({"a": opened.a * 2, "b": opened.a + opened.b + 1})
    ds.store(new, str(path), overwrite=True, zarr_format=2)
    back = xr.open_zarr(path)
    np.testing.assert_array_equal(back.a.values, DATA * 2)
    np.testing.assert_array_equal(back.b.values, np.ones_like(DATA))
    assert sorted(os.listdir(tmp_path)) == ["d.zarr"]


@pytest.mark.parametrize("left", ["target and aside", "staged and aside", "aside alone"])
def test_an_hdf5_swap_cut_short_is_finished_or_undone_by_the_next_store(tmp_path, left):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(".x.daskstream-old", data=DATA)  # the old dataset, moved aside
        if left == "target and aside":
            f.create_dataset("x", data=DATA * 5)
        elif left == "staged and aside":
            f.create_dataset(".x.daskstream-new", data=DATA * 5)
    # The next store into the target finds the state and settles it before anything else.
    ds.store(da.from_array(DATA * 5, chunks=(6, 8)), f"{path}::/x", overwrite=True)
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["x"]
        np.testing.assert_array_equal(f["x"][()], DATA * 5)
    if left == "aside alone":
        # Undone, then replaced by the store as asked: without overwrite the old data is refused to be replaced.
        with h5py.File(path, "a") as f:
            f.move("x", ".x.daskstream-old")
        with pytest.raises(TargetExistsError):
            ds.store(da.from_array(DATA * 7, chunks=(6, 8)), f"{path}::/x")
        with h5py.File(path, "r") as f:
            assert sorted(f) == ["x"]
            np.testing.assert_array_equal(f["x"][()], DATA * 5)
