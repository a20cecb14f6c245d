"""Safe defaults: no unpickling, no data destroyed by a store, nothing read from outside a file's folder, no
waiting on pipes, no writing through links out of a target, loopback only, config read as data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dask
import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    InvalidArgumentError,
    OutsideFileError,
    TargetWriteError,
    TuneCacheWarning,
    UnsupportedDtypeError,
)


def test_store_never_follows_a_link_out_of_its_target(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    np.save(tmp_path / "a.npy", np.arange(64.0).reshape(8, 8))
    target = tmp_path / "out.zarr"
    # An interrupted store's folder, with a link where chunk files would go.
    target.mkdir()
    os.symlink(outside, target / "c")
    with pytest.raises(TargetWriteError) as info:
        ds.store(ds.open(str(tmp_path / "a.npy")), str(target))
    assert "symbolic link" in str(info.value)
    assert str(outside) in str(info.value)
    assert sorted(os.listdir(outside)) == ["precious.txt"]
    assert (outside / "precious.txt").read_text() == "keep me"


def test_a_link_that_stays_inside_the_target_is_allowed(tmp_path):
    data = np.arange(64.0).reshape(8, 8)
    np.save(tmp_path / "a.npy", data)
    target = tmp_path / "out.zarr"
    ds.store(ds.open(str(tmp_path / "a.npy")), str(target))
    os.symlink(target / "zarr.json", target / "alias.json")
    ds.store(ds.open(str(tmp_path / "a.npy")) + 1, str(target), overwrite=True)
    np.testing.assert_array_equal(zarr.open_array(str(target), mode="r")[...], data + 1)


class _Planted:
    """Unpickling this creates a file: the proof that something was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_zarr_object_codecs_are_refused_not_unpickled(tmp_path):
    import numcodecs

    marker = str(tmp_path / "unpickled")
    path = tmp_path / "obj.zarr"
    path.mkdir()
    # A format 2 array of Python objects whose chunk is a pickle: what a hostile store would hold.
    meta = {"zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "|O", "compressor": None,
            "fill_value": None, "filters": [{"id": "pickle"}], "order": "C"}  # fmt: skip
    (path / ".zarray").write_text(json.dumps(meta))
    (path / "0").write_bytes(numcodecs.Pickle().encode(np.array([_Planted(marker)], dtype=object)))
    with pytest.raises(DaskstreamError) as info:
        ds.open(str(path)).compute()
    assert isinstance(info.value, (UnsupportedDtypeError, OSError))
    assert "obj.zarr" in str(info.value)
    assert not os.path.exists(marker)


def test_a_local_cluster_listens_on_loopback_only():
    with ds.session("distributed", progress=False) as s:
        assert s.address.startswith("tcp://127.0.0.1:")
        info = s.client.scheduler_info()
        assert all(address.startswith("tcp://127.0.0.1:") for address in info["workers"])
        services = info.get("services", {})
        # No dashboard at all, or one on loopback.
        assert all(str(port).isdigit() for port in services.values())
        assert s.cluster.scheduler.http_server is None or all(
            sock.getsockname()[0] == "127.0.0.1" for sock in s.cluster.scheduler.http_server._sockets.values()
        )


def test_cluster_files_are_read_as_data_not_code(tmp_path):
    from daskstream.runtime.clusters import load_cluster_config

    marker = tmp_path / "ran"
    evil = tmp_path / "evil.yaml"
    evil.write_text("cluster: !!python/object/apply:os.system ['touch " + str(marker) + "']\n")
    with pytest.raises(DaskstreamError):
        load_cluster_config(str(evil))
    assert not marker.exists()


def test_the_tune_cache_is_read_as_json_only(tmp_path):
    import dask.config

    from daskstream.tuning import TuneCache

    path = tmp_path / "tune.json"
    path.write_text("__import__('os').system('touch " + str(tmp_path / "ran") + "')")
    with dask.config.set({"daskstream.tune.cache": str(path)}), pytest.warns(TuneCacheWarning):
        assert TuneCache().entries() == {}
    assert not (tmp_path / "ran").exists()
    path.write_text(json.dumps({"version": 1, "entries": {"k": {"tuned": {"multiples": [1]}}}}))
    assert TuneCache(path).entries() == {"k": {"tuned": {"multiples": [1]}}}


# ---------------------------------------------------------------------------
# Storing an array onto the data it reads, under another spelling


def _zarr_group_member(tmp_path, data):
    zarr.open_group(str(tmp_path / "g.zarr"), mode="w").create_array("x", data=data, chunks=(4, 8))
    return f"{tmp_path}/g.zarr::x", f"{tmp_path}/g.zarr/x"


def _zarr_through_a_linked_folder(tmp_path, data):
    (tmp_path / "real").mkdir()
    zarr.open_group(str(tmp_path / "real" / "g.zarr"), mode="w").create_array("x", data=data, chunks=(4, 8))
    os.symlink(tmp_path / "real", tmp_path / "link")
    return f"{tmp_path}/real/g.zarr::x", f"{tmp_path}/link/g.zarr::x"


def _zarr_v2_folder_as_member(tmp_path, data):
    group = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    group.create_array("x", data=data, chunks=(4, 8))
    return f"{tmp_path}/v2.zarr/x", f"{tmp_path}/v2.zarr/./sub/..::x"


def _hdf5_hard_linked_dataset(tmp_path, data):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(4, 8), compression="gzip")
        f["y"] = f["x"]  # a second name for the same dataset
    return f"{tmp_path}/f.h5::x", f"{tmp_path}/f.h5::y"


def _hdf5_hard_linked_group(tmp_path, data):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("g/x", data=data, chunks=(4, 8), compression="gzip")
        f["g2"] = f["g"]  # deleting g2/x would unlink g/x
    return f"{tmp_path}/f.h5::g/x", f"{tmp_path}/f.h5::g2/x"


def _hdf5_through_a_linked_file(tmp_path, data):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["x"] = data
    os.symlink(tmp_path / "f.h5", tmp_path / "alias.h5")
    return f"{tmp_path}/f.h5::x", f"{tmp_path}/alias.h5::x"


def _hdf5_file_hard_link(tmp_path, data):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(4, 8))
    os.link(tmp_path / "f.h5", tmp_path / "same.h5")
    return f"{tmp_path}/f.h5::x", f"{tmp_path}/same.h5::x"


def _npy_inside_the_target(tmp_path, data):
    zarr.create_array(str(tmp_path / "t.zarr"), data=data, chunks=(4, 8))
    np.save(tmp_path / "t.zarr" / "inner.npy", data)
    return f"{tmp_path}/t.zarr/inner.npy", f"{tmp_path}/t.zarr"


SPELLINGS = [
    _zarr_group_member,
    _zarr_through_a_linked_folder,
    _zarr_v2_folder_as_member,
    _hdf5_hard_linked_dataset,
    _hdf5_hard_linked_group,
    _hdf5_through_a_linked_file,
    _hdf5_file_hard_link,
    _npy_inside_the_target,
]


def _read_back(where):
    path, _, member = where.partition("::")
    if path.endswith(".npy"):
        return np.load(path)
    if path.endswith(".h5"):
        with h5py.File(path, "r") as f:
            return f[member][...]
    return zarr.open_array(path, path=member or "", mode="r")[...]


@pytest.mark.parametrize("spell", SPELLINGS, ids=lambda f: f.__name__.strip("_"))
def test_storing_onto_its_own_data_under_another_name_gives_the_result_or_changes_nothing(tmp_path, spell):
    data = np.arange(64.0).reshape(8, 8)
    source, target = spell(tmp_path, data)
    if spell is _npy_inside_the_target:
        # A file inside the target's folder is no part of the array there, and would go with it: refused.
        with pytest.raises(InvalidArgumentError) as info:
            ds.store(ds.open(source) + 1, target, overwrite=True)
        assert "destroy the data" in str(info.value)
        ds.close_files()
        np.testing.assert_array_equal(_read_back(source), data)
        return
    # The very array read is replaced by swap, once the new one is whole: the source then holds the result.
    with dask.config.set(scheduler="threads"):
        ds.store(ds.open(source) + 1, target, overwrite=True)
    ds.close_files()
    if spell is _hdf5_hard_linked_dataset:
        # The target's name now leads to the new dataset; the other name keeps the old one, as a file's other
        # hard link keeps its content when a new file is renamed onto one name.
        np.testing.assert_array_equal(_read_back(target), data + 1)
        np.testing.assert_array_equal(_read_back(source), data)
        return
    np.testing.assert_array_equal(_read_back(source), data + 1)
    if spell is not _zarr_v2_folder_as_member:  # (its spelling runs through a folder that is not there)
        np.testing.assert_array_equal(_read_back(target), data + 1)


def test_the_cli_stores_onto_its_source_under_another_name_by_swap(tmp_path):
    data = np.arange(64.0).reshape(8, 8)
    source, target = _zarr_group_member(tmp_path, data)
    done = subprocess.run(
        [sys.executable, "-m", "daskstream", "store", source, target, "--overwrite", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(_read_back(source), data)
    assert not [name for name in os.listdir(tmp_path) if "daskstream-" in name]


# ---------------------------------------------------------------------------
# Files an HDF5 file points to


def _outside_file(tmp_path) -> tuple[Path, bytes]:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    return secret, secret.read_bytes()


def _external_raw_storage(folder, secret):
    with h5py.File(folder / "f.h5", "w") as f:
        f.create_dataset(
            "d", shape=(secret.stat().st_size,), dtype="u1", external=[(str(secret), 0, secret.stat().st_size)]
        )


def _relative_external_raw_storage(folder, secret):
    size = secret.stat().st_size
    with h5py.File(folder / "f.h5", "w") as f:
        # Resolved from the working directory, which the test sets to the file's folder.
        f.create_dataset("d", shape=(size,), dtype="u1", external=[(os.path.relpath(secret, folder), 0, size)])


def _external_link(folder, secret):
    other = secret.parent / "other.h5"
    with h5py.File(other, "w") as f:
        f["d"] = np.frombuffer(secret.read_bytes(), dtype="u1")
    with h5py.File(folder / "f.h5", "w") as f:
        f["d"] = h5py.ExternalLink(str(other), "/d")


def _virtual_dataset(folder, secret):
    other = secret.parent / "other.h5"
    data = np.frombuffer(secret.read_bytes(), dtype="u1")
    with h5py.File(other, "w") as f:
        f["d"] = data
    layout = h5py.VirtualLayout(shape=data.shape, dtype="u1")
    layout[...] = h5py.VirtualSource(os.path.relpath(other, folder), "d", shape=data.shape)
    with h5py.File(folder / "f.h5", "w") as f:
        f.create_virtual_dataset("d", layout)


def _link_inside_the_folder_leading_out(folder, secret):
    # The name HDF5 holds is inside the folder; the file it reaches is not.
    os.symlink(secret, folder / "inside.bin")
    size = secret.stat().st_size
    with h5py.File(folder / "f.h5", "w") as f:
        f.create_dataset("d", shape=(size,), dtype="u1", external=[(str(folder / "inside.bin"), 0, size)])


POINTERS = [
    _external_raw_storage,
    _relative_external_raw_storage,
    _external_link,
    _virtual_dataset,
    _link_inside_the_folder_leading_out,
]


@pytest.mark.parametrize("point", POINTERS, ids=lambda f: f.__name__.strip("_"))
def test_data_from_outside_the_files_folder_is_refused_unless_allowed(tmp_path, point, monkeypatch):
    secret, content = _outside_file(tmp_path)
    folder = tmp_path / "data"
    folder.mkdir()
    point(folder, secret)
    monkeypatch.chdir(folder)
    with pytest.raises(OutsideFileError) as info:
        ds.open(str(folder / "f.h5"), dataset="d")
    assert isinstance(info.value, PermissionError)
    assert str(secret.parent) in str(info.value)
    assert "daskstream.sources.allow-outside-files" in str(info.value)
    with dask.config.set({"daskstream.sources.allow-outside-files": True}):
        got = ds.open(str(folder / "f.h5"), dataset="d").compute()
    assert got.tobytes() == content


def test_files_an_hdf5_file_points_to_inside_its_folder_are_read(tmp_path, monkeypatch):
    (tmp_path / "parts").mkdir()
    part = np.arange(10.0)
    with h5py.File(tmp_path / "parts" / "p.h5", "w") as f:
        f["d"] = part
    layout = h5py.VirtualLayout(shape=(10,), dtype="f8")
    layout[...] = h5py.VirtualSource("parts/p.h5", "d", shape=(10,))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("v", layout)
        f["link"] = h5py.ExternalLink("parts/p.h5", "/d")
    monkeypatch.chdir("/")  # virtual sources and links are found from the file's folder, not here
    np.testing.assert_array_equal(ds.open(str(tmp_path / "v.h5"), dataset="v").compute(), part)
    np.testing.assert_array_equal(ds.open(str(tmp_path / "v.h5"), dataset="link").compute(), part)


def test_external_raw_files_are_read_from_where_they_were_found_in_every_process(tmp_path, monkeypatch):
    data = np.arange(16, dtype="u1")
    data.tofile(tmp_path / "raw.bin")
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("d", shape=(16,), dtype="u1", external=[("raw.bin", 0, 16)])
    monkeypatch.chdir(tmp_path)  # HDF5 finds relative raw files from the working directory
    x = ds.open(str(tmp_path / "f.h5"), dataset="d")
    monkeypatch.chdir("/")
    np.testing.assert_array_equal(x.compute(), data)
    np.testing.assert_array_equal(x.compute(scheduler="processes"), data)


def test_a_virtual_dataset_whose_source_is_missing_is_an_error_not_fill_values(tmp_path):
    layout = h5py.VirtualLayout(shape=(10,), dtype="f8")
    layout[...] = h5py.VirtualSource("gone.h5", "d", shape=(10,))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    with pytest.raises(CorruptSourceError) as info:
        ds.open(str(tmp_path / "v.h5"), dataset="v")
    assert "gone.h5" in str(info.value)
    assert "fill value" in str(info.value)


# ---------------------------------------------------------------------------
# Pipes, sockets and devices where files should be: a clear error, never a wait forever


_FIFO_CASES = {
    "npy": """
os.mkfifo("a.npy")
ds.open("a.npy")
""",
    "zarr-chunk": """
zarr.create_array("z.zarr", shape=(4,), chunks=(2,), dtype="f8", fill_value=-1)[...] = 0
os.unlink("z.zarr/c/0"); os.mkfifo("z.zarr/c/0")
ds.open("z.zarr").compute()
""",
    "zarr-metadata": """
os.mkdir("m.zarr"); os.mkfifo("m.zarr/zarr.json")
ds.open("m.zarr")
""",
    "hdf5-external-storage": """
os.mkfifo("raw")
with h5py.File("f.h5", "w") as f:
    f.create_dataset("d", shape=(8,), dtype="u1", external=[(os.path.abspath("raw"), 0, 8)])
ds.open("f.h5::d").compute()
""",
    "hdf5-external-link": """
os.mkfifo("other.h5")
with h5py.File("f.h5", "w") as f:
    f["d"] = h5py.ExternalLink("other.h5", "/d")
ds.open("f.h5::d")
""",
    "store-target": """
import dask.array as da
os.mkfifo("out.h5")
ds.store(da.ones(4, chunks=2), "out.h5::/d")
""",
    "character-device": """
ds.open("/dev/zero")
""",
    "store-progress-record": """
import dask.array as da
x = da.ones(4, chunks=2)
ds.store(x, "out.zarr")
os.makedirs("out.zarr/.daskstream-store", exist_ok=True)
os.mkfifo("out.zarr/.daskstream-store/identity.json")
ds.store(x, "out.zarr")
""",
    "hdf5-replaced-after-open": """
import numpy as np
with h5py.File("f.h5", "w") as f:
    f["d"] = np.arange(8.0)
x = ds.open("f.h5::d")
os.unlink("f.h5"); os.mkfifo("f.h5")
x.compute()
""",
    "cluster-file": """
os.mkfifo("cluster.yaml")
ds.session(cluster="cluster.yaml").__enter__()
""",
}


@pytest.mark.parametrize("case", sorted(_FIFO_CASES))
def test_a_pipe_or_device_in_place_of_a_file_is_refused_at_once(tmp_path, case):
    script = "import os, h5py, zarr, daskstream as ds\n" + _FIFO_CASES[case] + "\nprint('no error')\n"
    # In a child process: a regression would block forever, and must fail this test instead.
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # A settings file is refused as an invalid argument, data files as not regular files: both clear.
    refusal = "is not a regular file" if case == "cluster-file" else "NotARegularFileError"
    assert refusal in done.stderr, done.stderr[-2000:]
    assert "no error" not in done.stdout


def test_a_pipe_in_place_of_the_tuning_cache_is_treated_as_unreadable(tmp_path):
    script = """
import os, warnings
from daskstream.tuning import TuneCache
os.mkfifo("tune.json")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(TuneCache("tune.json").entries(), [str(w.message) for w in caught])
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("{} ")
    assert "the tuning cache cannot be read" in done.stdout
    assert "named pipe" in done.stdout


def test_zip_members_named_outside_the_store_are_never_listed_or_read(tmp_path):
    import zipfile

    zarr.create_array(str(tmp_path / "good.zarr"), data=np.arange(4, dtype="u1"), chunks=(2,))
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as z:
        for name in ("zarr.json", "c/0", "c/1"):
            content = (tmp_path / "good.zarr" / name).read_bytes()
            for prefix in ("a/", "../up/", "/abs/"):  # writestr keeps the names as given
                z.writestr(prefix + name, content)
    source = ds.open_source(f"{tmp_path}/evil.zip::a")
    assert source.list_arrays() == ["a"]
    np.testing.assert_array_equal(source.read(), np.arange(4, dtype="u1"))
    for member in ("../up", "/abs", "abs"):
        with pytest.raises(DaskstreamError):
            ds.open(f"{tmp_path}/evil.zip::{member}")
    assert not (tmp_path / "up").exists()


# ---------------------------------------------------------------------------
# Sizes a file states about itself, believed by no read before they are checked against what the file holds.
# Each attack is read in a fresh interpreter with no room in its address space for the size claimed, and may
# raise its resident memory by no more than the 64 MiB budget it reads with (tests/sources/hostile_files.py,
# whose builders the source tests use too; tests/sources/test_hostile_sizes.py tries every index kind).


@pytest.fixture
def hostile():
    """The hostile-file builders of the source tests."""
    folder = str(Path(__file__).parent / "sources")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import hostile_files

    return hostile_files


def test_an_hdf5_chunk_index_claiming_4_gib_in_a_small_file_is_refused_without_taking_it(tmp_path, hostile):
    intact = hostile.hdf5_file(tmp_path / "intact.h5", "btree-v1")
    forged = tmp_path / "scan.h5"
    forged.write_bytes(intact.read_bytes())
    hostile.forge_chunk_size(forged, hostile.FORGED)
    assert forged.stat().st_size < 150 * 2**10
    growth, outcome = hostile.read_hostile(f"{forged}::x", f"{intact}::x")
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert f"{forged}::/x: the chunk index says the chunk at (0, 0) is 4294967040 bytes" in outcome
    assert "re-create or re-copy it" in outcome
    assert growth < hostile.BUDGET


def test_a_zstd_bomb_in_a_zipped_zarr_store_is_refused_within_a_64_mib_budget(tmp_path, hostile):
    options = {"shape": (64, 64), "chunks": (32, 32), "dtype": "f4", "compressors": zarr.codecs.ZstdCodec()}
    for name in ("intact", "store"):
        zarr.create_array(tmp_path / name, **options)[...] = 1
    intact = hostile.zipped_store(tmp_path / "intact", tmp_path / "intact.zip")
    bomb = hostile.zstd_bomb(2**31, declared=False)  # 2 GiB of zeros in 64 KiB, its size stated nowhere
    store = hostile.zipped_store(tmp_path / "store", tmp_path / "store.zip", {"c/0/0": bomb})
    growth, outcome = hostile.read_hostile(store, intact)
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert f"{store}: chunk 'c/0/0' could not be decoded" in outcome
    assert growth < hostile.BUDGET


def test_a_zip_member_declaring_4_kib_that_inflates_to_more_is_refused(tmp_path, hostile):
    import zipfile

    for name in ("intact", "store"):
        zarr.create_array(tmp_path / name, shape=(64, 64), chunks=(32, 32), dtype="f4", compressors=None)[...] = 1
    intact = hostile.zipped_store(tmp_path / "intact", tmp_path / "intact.zip")
    store = hostile.zipped_store(tmp_path / "store", tmp_path / "store.zip", compression=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(store) as z:
        names = z.namelist()
    # The chunk again, deflated from 32 MiB of zeros, declaring the 4 KiB a chunk holds.
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w") as z:
        for name in names:
            if name == "c/0/0":
                hostile.write_member(z, name, 32 * 2**20, zipfile.ZIP_DEFLATED)
            else:
                with zipfile.ZipFile(store) as source:
                    z.writestr(name, source.read(name))
    hostile.forge_zip_member_size(tmp_path / "bomb.zip", "c/0/0", 4096)
    growth, outcome = hostile.read_hostile(tmp_path / "bomb.zip", intact)
    assert outcome.startswith("CorruptSourceError(OSError): "), outcome
    assert "member 'c/0/0' cannot be read" in outcome
    assert growth < hostile.BUDGET
