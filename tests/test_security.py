"""Safe defaults: no unpickling, no writing through links out of a target, loopback only, config read as data."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import DaskstreamError, TargetWriteError, TuneCacheWarning, UnsupportedDtypeError


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
