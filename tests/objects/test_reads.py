"""Arrays on an S3 API (moto's server on 127.0.0.1): exact reads, few requests, changes noticed, secrets kept."""

from __future__ import annotations

import pickle
import time

import dask
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import SourceChangedError, SourceRemovedError


def _field(shape=(120, 90), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("f4")


def _zarr_on_s3(s3, data, layout, *, name="a.zarr"):
    url = f"s3://{s3.bucket()}/{name}"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3.options)
    kwargs = {"chunks": (30, 30)}
    if layout == "v2":
        kwargs["zarr_format"] = 2
    elif layout == "sharded":
        kwargs = {"shards": (60, 45), "chunks": (30, 15)}
    array = zarr.create_array(store, shape=data.shape, dtype=data.dtype, **kwargs)
    array[...] = data
    return url


@pytest.mark.parametrize("layout", ["v2", "v3", "sharded"])
def test_a_zarr_array_on_s3_reads_exactly_with_one_get_per_object_and_no_head_per_get(s3, layout):
    data = _field()
    url = _zarr_on_s3(s3, data, layout)
    x = ds.open(url, storage_options=s3.options)
    s3.reset()
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(x.compute(), data)
    requests = s3.requests()
    objects = 4 if layout == "sharded" else 12
    # One GET per chunk or shard object, and the array's metadata checked once (format 2 looks for zarr.json first).
    assert objects <= requests.get("GET", 0) <= objects + 2, requests
    assert requests.get("HEAD", 0) <= 3, requests  # zarr opening the array in this process; none per GET
    assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)


def test_a_sum_on_s3_streams_its_blocks_reading_ahead_each_object_once(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "v3")
    x = ds.open(url, storage_options=s3.options, chunks=(30, 30))
    total = ds.reduce(x, "sum")
    explained = ds.plan_compute(total).explain()
    assert "reading 2 ahead" in explained
    s3.reset()
    with dask.config.set(scheduler="threads"):
        assert float(total.compute()) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)
    assert s3.requests().get("GET", 0) <= 12 + 2  # every chunk object once, read ahead or not


def test_objects_rewritten_after_opening_are_refused_not_mixed(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "v3")
    x = ds.open(url, storage_options=s3.options)
    zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=s3.options), mode="r+")[:30] = data[:30] * 3
    with pytest.raises(SourceChangedError, match=r"chunk object 'c/0/\d' was rewritten"):
        x.sum().compute()
    again = ds.open(url, storage_options=s3.options)
    assert again.name != x.name  # the same URL, other data: another name, so no cached result is reused
    np.testing.assert_array_equal(again[:30].compute(), data[:30] * 3)


def test_a_chunk_object_deleted_after_opening_is_refused_not_read_as_fill(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "v3")
    x = ds.open(url, storage_options=s3.options)
    s3.fs.rm(url.removeprefix("s3://") + "/c/1/1")
    with pytest.raises(SourceRemovedError, match="chunk object 'c/1/1' was deleted after the store was opened"):
        x.compute()


def test_a_chunk_object_added_after_opening_is_refused(s3):
    data = _field()
    data[30:60, 30:60] = 0
    url = _zarr_on_s3(s3, data, "v3")  # zarr writes no object for a chunk of fill value
    x = ds.open(url, storage_options=s3.options)
    zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=s3.options), mode="r+")[30:60, 30:60] = 1
    with pytest.raises(SourceChangedError, match="chunk object 'c/1/1' was written after the store was opened"):
        x.compute()


def test_no_secret_travels_in_the_graph_and_workers_use_their_own_credentials(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "v3")
    options = {**s3.options, "key": "testing", "secret": "sup3r-s3cret-value"}
    x = ds.open(url, storage_options=options)
    assert b"sup3r-s3cret-value" not in pickle.dumps(dict(x.__dask_graph__()))
    # Processes: each unpickles the source without the secret and takes the environment's credentials.
    with dask.config.set(scheduler="processes", num_workers=2):
        np.testing.assert_array_equal(x.compute(), data)


def test_a_worker_that_finds_the_objects_changed_when_it_lists_them_refuses(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "v3")
    x = ds.open(url, storage_options=s3.options)
    zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=s3.options), mode="r+")[:30] = 7
    with dask.config.set(scheduler="processes", num_workers=2), pytest.raises(SourceChangedError):
        x.compute()


def test_a_chunk_file_deleted_from_a_nested_v3_store_after_opening_is_refused(tmp_path):
    data = _field()
    path = tmp_path / "nested.zarr"
    zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(30, 30))[...] = data
    x = ds.open(path)
    time.sleep(0.02)  # a tick of the coarsest file-system clock
    (path / "c" / "1" / "2").unlink()
    with pytest.raises(SourceRemovedError, match="chunk 'c/1/2' is missing and its folder changed"):
        x.compute()


def _rewrite_metadata(s3, url, name, change):
    """``change`` applied to the JSON document ``name`` of the store at ``url``; the chunk objects stay."""
    import json

    key = url.removeprefix("s3://") + "/" + name
    document = json.loads(s3.fs.cat_file(key))
    change(document)
    s3.fs.pipe_file(key, json.dumps(document).encode())


@pytest.mark.parametrize(
    ("layout", "name", "change"),
    [
        ("v3", "zarr.json", lambda d: d.update(data_type="int64")),  # old chunks decoded as another dtype
        ("v3", "zarr.json", lambda d: d.update(fill_value=5.0)),
        ("v3", "zarr.json", lambda d: d["attributes"].update(scale_factor=10)),
        ("v2", ".zarray", lambda d: d.update(dtype="<i8")),
        ("v2", ".zarray", lambda d: d.update(fill_value=5.0)),
        ("v2", ".zattrs", lambda d: d.update(scale_factor=10)),
    ],
    ids=["v3-dtype", "v3-fill", "v3-attrs", "v2-dtype", "v2-fill", "v2-zattrs"],
)
@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_metadata_rewritten_after_opening_is_refused_not_decoded_with(s3, layout, name, change, scheduler):
    data = np.arange(64, dtype="f8").reshape(8, 8) / 63
    url = f"s3://{s3.bucket()}/m.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3.options)
    kwargs = {"zarr_format": 2} if layout == "v2" else {}
    array = zarr.create_array(store, shape=data.shape, dtype=data.dtype, chunks=(4, 4), **kwargs)
    array[...] = data
    if name == ".zattrs":
        array.attrs["units"] = "K"
    x = ds.open(url, storage_options=s3.options)
    _rewrite_metadata(s3, url, name, change)
    with dask.config.set(scheduler=scheduler, num_workers=2), pytest.raises(SourceChangedError, match="metadata"):
        x.sum().compute()


def test_part_of_a_shard_object_is_read_by_its_index_and_one_ranged_get_per_run(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "sharded")  # shards (60, 45) of chunks (30, 15)
    # A source's boxes, as a training stream or a task of a shard too large for the budget reads them.
    source = ds.open_source(url, storage_options=s3.options)
    source.read((slice(0, 1), slice(45, 46)))  # opens the array in this process (in another shard): not counted
    s3.reset()
    part = (slice(30, 60), slice(0, 45))  # the second row of inner chunks of shard (0, 0): one run
    np.testing.assert_array_equal(source.read(part), data[part])
    assert s3.requests() == {"GET": 2}, s3.requests()  # the shard's index, then its run
    s3.reset()
    np.testing.assert_array_equal(source.read((slice(0, 30), slice(0, 45))), data[0:30, 0:45])
    assert s3.requests() == {"GET": 1}, s3.requests()  # the index is kept: the run only
    s3.reset()
    np.testing.assert_array_equal(source.read((slice(0, 60), slice(0, 90))), data[0:60])
    assert s3.requests() == {"GET": 2}, s3.requests()  # shards wanted whole: one GET each


def test_a_shard_object_rewritten_after_opening_is_refused_when_read_in_part(s3):
    data = _field()
    url = _zarr_on_s3(s3, data, "sharded")
    source = ds.open_source(url, storage_options=s3.options)
    zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=s3.options), mode="r+")[:60, :45] = 7
    with pytest.raises(SourceChangedError, match=r"chunk object 'c/0/0' was rewritten"):
        source.read((slice(30, 60), slice(0, 45)))
