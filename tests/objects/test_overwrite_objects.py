"""Overwrite on an object store, which has no rename to swap with: done only where nothing read can be lost.

moto's S3 server on 127.0.0.1 is the object store; zarr reads what is there.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.compute.store.object_target import filesystem_of, same_store
from daskstream.errors import InvalidArgumentError


def _put(s3, url, data):
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3.options)
    zarr.create_array(store, data=data, chunks=(5, 5), overwrite=True)


def _read(s3, url):
    return zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=s3.options), mode="r")[...]


DATA = np.arange(100, dtype="f4").reshape(10, 10)


@pytest.mark.parametrize("spelling", ["s3", "s3a"])
def test_a_target_read_under_another_protocol_alias_is_this_very_target(s3, spelling):
    bucket = s3.bucket()
    _put(s3, f"s3://{bucket}/a.zarr", DATA)
    x = ds.open(f"{spelling}://{bucket}/a.zarr", storage_options=s3.options)
    with pytest.raises(InvalidArgumentError, match="this very target"):
        ds.store(x * 2, f"s3://{bucket}/a.zarr", storage_options=s3.options, overwrite=True)
    np.testing.assert_array_equal(_read(s3, f"s3://{bucket}/a.zarr"), DATA)  # nothing was deleted


def test_a_reader_daskstream_cannot_place_refuses_the_overwrite_and_deletes_nothing(s3, tmp_path):
    bucket = s3.bucket()
    url = f"s3://{bucket}/a.zarr"
    _put(s3, url, DATA)
    # A zarr.Array in the graph may read from anywhere, this target included: it cannot be shown disjoint.
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3.options)
    unplaced = da.from_zarr(zarr.open_array(store, mode="r"))
    with pytest.raises(InvalidArgumentError, match=r"zarr\.core\.array\.Array.*cannot write the new array beside"):
        ds.store(unplaced * 2, url, storage_options=s3.options, overwrite=True)
    np.testing.assert_array_equal(_read(s3, url), DATA)
    # A closure holding one is found too.
    held = zarr.open_array(store, mode="r")
    hidden = da.zeros((10, 10), chunks=5, dtype="f4").map_blocks(lambda b, z=held: b + z[0, 0])
    with pytest.raises(InvalidArgumentError, match="cannot write the new array beside"):
        ds.store(hidden, url, storage_options=s3.options, overwrite=True)
    np.testing.assert_array_equal(_read(s3, url), DATA)


def test_known_readers_of_other_places_overwrite_as_asked(s3, tmp_path):
    bucket = s3.bucket()
    _put(s3, f"s3://{bucket}/a.zarr", DATA)
    _put(s3, f"s3://{bucket}/b.zarr", -DATA)
    local = tmp_path / "c.zarr"
    zarr.create_array(local, data=DATA + 1, chunks=(5, 5))
    x = ds.open(f"s3://{bucket}/b.zarr", storage_options=s3.options) + ds.open(local) + da.ones((10, 10), chunks=5)
    ds.store(x, f"s3://{bucket}/a.zarr", storage_options=s3.options, overwrite=True)
    np.testing.assert_array_equal(_read(s3, f"s3://{bucket}/a.zarr"), -DATA + DATA + 1 + 1)


def test_protocols_are_compared_by_the_file_system_they_reach():
    assert filesystem_of("s3") == filesystem_of("s3a") == filesystem_of("S3A")
    assert filesystem_of("gs") == filesystem_of("gcs")
    assert filesystem_of("abfs") == filesystem_of("az")
    assert filesystem_of("s3") != filesystem_of("gs")
    # Endpoints: one not given may be the other's (the environment's), two given and different are not one store.
    assert same_store(("fs", "", "b"), ("fs", "http://127.0.0.1:9000", "b"))
    assert not same_store(("fs", "http://127.0.0.1:9000", "b"), ("fs", "http://127.0.0.1:9001", "b"))
    assert not same_store(("fs", "", "b"), ("fs", "", "c"))
