"""``daskstream.open``: chunk specs, graph hygiene, names and every scheduler."""

from __future__ import annotations

import os
import pickle
import warnings

import cloudpickle
import dask
import dask.array as da
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import ChunkSplitWarning, InvalidArgumentError, InvalidChunksError

FORMATS = ["npy", "hdf5-chunked", "hdf5-contiguous", "zarr-v2", "zarr-v3-sharded"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_open_is_lazy_and_computes_the_oracle(sample_files, fmt):
    path, data = sample_files[fmt]
    x = ds.open(path, memory_budget="64MiB")
    assert isinstance(x, da.Array)
    assert x.shape == data.shape
    assert x.dtype == data.dtype
    np.testing.assert_array_equal(x.compute(), data)
    np.testing.assert_allclose(x.mean(axis=0).compute(), data.mean(axis=0), rtol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_chunks_follow_the_plan_and_storage(sample_files, fmt):
    path, _ = sample_files[fmt]
    source = ds.open_source(path)
    plan = ds.plan(source, memory_budget="64MiB")
    x = ds.open(source, memory_budget="64MiB")
    assert x.chunks == plan.dask_chunks
    assert plan.read_amplification == 1.0
    if source.storage_chunks is not None:
        # Every chunk boundary is a storage boundary: no storage chunk is decoded twice.
        for n, sc, sizes in zip(source.shape, source.storage_chunks, x.chunks):
            edges = set(np.cumsum((0, *sizes)).tolist())
            assert edges <= {*range(0, n, sc), n}


def test_storage_chunks_option(sample_files):
    path, data = sample_files["zarr-v3-sharded"]
    x = ds.open(path, chunks="storage")
    # Sharded Zarr in a directory: shards are read in part, so the storage chunks are the inner chunks.
    assert x.chunksize == ds.open_source(path).inner_chunks == (20, 35)
    np.testing.assert_array_equal(x.compute(), data)


def test_storage_chunks_of_contiguous_data_is_refused(sample_files):
    path, _ = sample_files["npy"]
    with pytest.raises(InvalidChunksError, match="contiguously"):
        ds.open(path, chunks="storage")


def test_explicit_chunks_that_split_storage_warn_with_amplification(sample_files):
    path, data = sample_files["hdf5-chunked"]  # storage chunks (32, 16)
    with pytest.warns(ChunkSplitWarning, match=r"decoded 3\.75 times"):
        x = ds.open(path, chunks=(16, 8))
    np.testing.assert_array_equal(x.compute(), data)


def test_explicit_aligned_chunks_do_not_warn(sample_files):
    path, _ = sample_files["hdf5-chunked"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = ds.open(path, chunks={0: 64, 1: -1})
    assert x.chunks[0][:2] == (64, 64)
    assert x.chunks[1] == (70,)


def test_chunk_plan_is_used_as_given(sample_files):
    path, data = sample_files["npy"]
    plan = ds.plan_chunks(data.shape, data.dtype, memory_budget="1MiB", threads=1, workers=1, target_chunk_bytes="8KiB")
    x = ds.open(path, chunks=plan)
    assert x.chunks == plan.dask_chunks
    np.testing.assert_array_equal(x.compute(), data)


@pytest.mark.parametrize(
    "chunks",
    [(0, 10), (-5, 10), (10,), (10, 10, 10), "lots", {5: 10}, (10.5, 10)],
    ids=["zero", "negative", "too-few-axes", "too-many-axes", "unknown-word", "axis-out-of-range", "float"],
)
def test_invalid_chunk_specs(sample_files, chunks):
    path, _ = sample_files["npy"]
    with pytest.raises(InvalidChunksError) as info:
        ds.open(path, chunks=chunks)
    assert isinstance(info.value, ValueError)
    assert "a.npy" in str(info.value)


def test_chunk_plan_for_another_shape_is_refused(sample_files):
    path, _ = sample_files["npy"]
    plan = ds.plan_chunks((5, 5), "f4", memory_budget="1MiB", threads=1, workers=1)
    with pytest.raises(InvalidChunksError, match="shape"):
        ds.open(path, chunks=plan)


# ---------------------------------------------------------------------------
# Graph hygiene: descriptions, not handles or data.


@pytest.mark.parametrize("fmt", FORMATS)
def test_graph_pickles_small_whatever_the_size(tmp_path, fmt, sample_files):
    path, _ = sample_files[fmt]
    x = ds.open(path)
    assert len(cloudpickle.dumps(x)) < 64 * 1024
    restored = pickle.loads(cloudpickle.dumps(x))
    np.testing.assert_array_equal(restored.compute(), x.compute())


def test_large_npy_graph_stays_small(tmp_path):
    # 256 MiB on disk, written sparsely: the graph must not grow with the data.
    path = tmp_path / "big.npy"
    big = np.lib.format.open_memmap(path, mode="w+", dtype="f8", shape=(4096, 8192))
    big[-1, -1] = 3.0
    del big
    x = ds.open(path)
    assert len(cloudpickle.dumps(x)) < 64 * 1024
    assert float(x[-1, -1].compute()) == 3.0


def test_graph_holds_no_open_handle_or_array(sample_files):
    path, _ = sample_files["hdf5-chunked"]
    x = ds.open(path)
    import h5py

    for task in dict(x.__dask_graph__()).values():
        for value in _leaves(task):
            assert not isinstance(value, (h5py.File, h5py.Dataset, np.memmap))
            assert not (isinstance(value, np.ndarray) and value.size > 1)


def _leaves(obj, depth=0):
    if depth > 6:
        return
    yield obj
    for child in getattr(obj, "args", ()) or ():
        yield from _leaves(child, depth + 1)
    if isinstance(obj, (tuple, list)):
        for child in obj:
            yield from _leaves(child, depth + 1)
    value = getattr(obj, "value", None)
    if value is not None and value is not obj:
        yield from _leaves(value, depth + 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_file_same_name_rewritten_file_new_name(sample_files, fmt):
    path, data = sample_files[fmt]
    first = ds.open(path)
    assert ds.open(path).name == first.name
    _rewrite(path, fmt, data + 1)
    second = ds.open(path)
    assert second.name != first.name
    np.testing.assert_array_equal(second.compute(), data + 1)


def _rewrite(path, fmt, data):
    import h5py
    import zarr

    file_path, _, dataset = path.partition("::")
    if fmt == "npy":
        np.save(file_path, data)
    elif fmt.startswith("hdf5"):
        with h5py.File(file_path, "a") as f:
            f[dataset][...] = data
    else:
        zarr.open_array(file_path, mode="r+")[...] = data
    # Same-second rewrites must still be seen: bump the mtime explicitly, as a slow writer would.
    st = os.stat(file_path)
    os.utime(file_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    if os.path.isdir(file_path):
        for name in ("zarr.json", ".zarray"):
            meta = os.path.join(file_path, name)
            if os.path.exists(meta):
                st = os.stat(meta)
                os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


# ---------------------------------------------------------------------------
# Every scheduler gives the same answer.


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_local_schedulers(sample_files, fmt, scheduler):
    path, data = sample_files[fmt]
    x = ds.open(path, memory_budget="8MiB")
    assert x.npartitions > 1
    with dask.config.set(scheduler=scheduler, num_workers=2):
        # Summed in float64: a float32 sum's rounding depends on how rows are split into chunks.
        np.testing.assert_allclose(x.sum(axis=1, dtype="f8").compute(), data.sum(axis=1, dtype="f8"), rtol=1e-10)


@pytest.mark.parametrize("fmt", FORMATS)
def test_distributed_cluster_of_real_processes(dask_cluster, sample_files, fmt):
    from distributed import Client

    path, data = sample_files[fmt]
    with Client(scheduler_file=str(dask_cluster)) as client:
        x = ds.open(path)
        # Inside a Client, the plan sees its workers: 2 workers x 1 thread.
        plan = ds.plan(ds.open_source(path))
        assert (plan.workers, plan.threads) == (2, 1)
        # 60% of the workers' 1 GiB (distributed starts spilling there), less what the idle worker holds.
        assert 2**30 // 8 <= plan.memory_budget < 0.6 * 2**30
        assert x.npartitions >= 4
        result = client.compute(x.mean(axis=0)).result()
        np.testing.assert_allclose(result, data.mean(axis=0), rtol=1e-5)
        # The tasks ran in the worker processes, each of which opened the file itself.
        pids = set(client.run(os.getpid).values())
        assert os.getpid() not in pids
        if fmt.startswith("hdf5-chunked"):

            def cached_handle_formats():
                # Defined here so it travels by value: the workers cannot import this test module.
                from daskstream.sources import handles

                return sorted({key[0] for key in handles._handles})

            opened = client.run(cached_handle_formats)
            assert all("hdf5" in formats for formats in opened.values()), opened


def test_source_with_dataset_argument_is_refused(sample_files):
    source = ds.open_source(sample_files["npy"][0])
    with pytest.raises(InvalidArgumentError):
        ds.open(source, dataset="x")


@pytest.mark.parametrize("call", ["open", "plan"])
@pytest.mark.parametrize("given", [{"dataset": "/x"}, {"storage_options": {"anon": True}}])
def test_options_for_opening_a_path_are_refused_beside_an_open_source(tmp_path, call, given):
    # They would be silently ignored: the Source is already open.
    np.save(tmp_path / "a.npy", np.zeros((4, 3)))
    source = ds.open_source(str(tmp_path / "a.npy"))
    with pytest.raises(InvalidArgumentError, match=r"a\.npy: dataset= and storage_options= apply when") as caught:
        getattr(ds, call)(source, **given)
    assert "pass them to open_source instead" in str(caught.value)
