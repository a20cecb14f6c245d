"""``daskstream.stream``: exact coverage, shuffling, sharding, zipped arrays, prefetch bounds and clean exits."""

from __future__ import annotations

import gc
import threading
import time

import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import DaskstreamError, InvalidArgumentError, MemoryBudgetError
from daskstream.runtime.metering import bytes_read_here
from daskstream.torch import worker_share

N, WIDTH = 3000, 16


def indexed(n=N, width=WIDTH, dtype="f8"):
    """Rows whose first column is their index, so every item can be told apart."""
    data = np.random.default_rng(0).standard_normal((n, width)).astype(dtype)
    data[:, 0] = np.arange(n)
    return data


@pytest.fixture(params=["npy", "hdf5", "zarr"])
def stored(request, tmp_path):
    data = indexed()
    if request.param == "npy":
        path = str(tmp_path / "x.npy")
        np.save(path, data)
    elif request.param == "hdf5":
        path = str(tmp_path / "x.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=(128, WIDTH), compression="gzip")
    else:
        path = str(tmp_path / "x.zarr")
        zarr.create_array(path, shape=data.shape, chunks=(100, WIDTH), dtype=data.dtype)[...] = data
    return path, data


def stream_threads():
    return [t for t in threading.enumerate() if t.name.startswith("daskstream-")]


def test_in_order_batches_cover_the_array_exactly(stored):
    path, data = stored
    s = ds.stream(path, batch_size=256)
    batches = list(s)
    assert [len(b) for b in batches] == [256] * (N // 256) + [N % 256]
    assert len(s) == len(batches)
    np.testing.assert_array_equal(np.concatenate(batches), data)


def test_the_default_batch_is_one_storage_aligned_block(stored):
    path, data = stored
    s = ds.stream(path)
    source = ds.open_source(path)
    unit = source.storage_chunks[0] if source.storage_chunks else 1
    assert s.batch_size % unit == 0
    assert all(a % unit == 0 for a, _ in s.block_bounds)
    np.testing.assert_array_equal(np.concatenate(list(s)), data)


def test_drop_last_leaves_out_the_short_batch(stored):
    path, data = stored
    s = ds.stream(path, batch_size=256, drop_last=True)
    batches = list(s)
    assert len(batches) == len(s) == N // 256
    np.testing.assert_array_equal(np.concatenate(batches), data[: 256 * (N // 256)])


def test_shuffled_epochs_cover_every_item_once_in_a_new_order(stored):
    path, data = stored
    s = ds.stream(path, batch_size=100, shuffle=True, seed=7)
    first, second = np.concatenate(list(s)), np.concatenate(list(s))
    for epoch in (first, second):
        assert sorted(epoch[:, 0]) == list(range(N))
        np.testing.assert_array_equal(epoch[np.argsort(epoch[:, 0])], data)
    assert not np.array_equal(first[:, 0], second[:, 0])
    # Items are mixed within windows, not only whole blocks moved about.
    assert np.mean(np.diff(first[:, 0]) == 1) < 0.5


def test_a_seed_makes_shuffling_reproducible(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())

    def order(seed, epoch=0):
        s = ds.stream(path, batch_size=64, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        return np.concatenate(list(s))[:, 0]

    np.testing.assert_array_equal(order(3), order(3))
    np.testing.assert_array_equal(order(3, epoch=5), order(3, epoch=5))
    assert not np.array_equal(order(3), order(4))
    assert not np.array_equal(order(3), order(3, epoch=1))


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_take_disjoint_shares_that_cover_the_array(stored, shuffle):
    path, _ = stored
    seen = []
    for rank in range(3):
        s = ds.stream(path, batch_size=50, shuffle=shuffle, seed=11, rank=rank, world_size=3)
        expected = len(s)  # batches of the epoch about to be read
        batches = list(s)
        assert len(batches) == expected
        items = np.concatenate(batches)[:, 0]
        seen.append(set(items.tolist()))
    assert sum(len(s) for s in seen) == N
    assert set.union(*seen) == set(range(N))


def test_zipped_arrays_yield_matching_batches(tmp_path):
    features = indexed()
    labels = np.arange(N, dtype="i8") * 10
    np.save(tmp_path / "x.npy", features)
    zarr.create_array(str(tmp_path / "y.zarr"), shape=labels.shape, chunks=(64,), dtype="i8")[...] = labels
    s = ds.stream((str(tmp_path / "x.npy"), str(tmp_path / "y.zarr")), batch_size=100, shuffle=True, seed=1)
    count = 0
    for x, y in s:
        assert x.shape == (len(y), WIDTH)
        np.testing.assert_array_equal(x[:, 0] * 10, y)
        count += len(y)
    assert count == N


def test_another_axis_and_a_computed_dask_array(tmp_path):
    data = indexed().T.copy()  # items along axis 1
    np.save(tmp_path / "t.npy", data)
    batches = list(ds.stream(str(tmp_path / "t.npy"), axis=1, batch_size=500))
    np.testing.assert_array_equal(np.concatenate(batches, axis=1), data)
    doubled = ds.open(str(tmp_path / "t.npy")) * 2
    np.testing.assert_array_equal(np.concatenate(list(ds.stream(doubled, axis=1, batch_size=700)), axis=1), 2 * data)


def test_leaving_early_stops_the_reader_and_leaves_no_thread(stored):
    path, _ = stored
    before = len(stream_threads())
    for _ in ds.stream(path, batch_size=10, prefetch=2):
        break
    gc.collect()
    assert len(stream_threads()) == before

    iterator = iter(ds.stream(path, batch_size=10))
    next(iterator)
    del iterator
    gc.collect()
    deadline = time.monotonic() + 5
    while len(stream_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stream_threads()) == before


def test_an_error_while_reading_reaches_the_consumer_and_the_reader_ends(tmp_path):
    path = tmp_path / "x.zarr"
    zarr.create_array(str(path), shape=(1000, 4), chunks=(100, 4), dtype="f8")[...] = 1.0
    s = ds.stream(str(path), batch_size=100)
    # A chunk that exists but cannot be decoded is an error naming it, never zeros.
    chunk = next(p for p in path.rglob("*") if p.is_file() and p.name == "0" and p.parent.name == "5")
    chunk.write_bytes(b"garbage")
    with pytest.raises(Exception, match="5"):
        list(s)
    gc.collect()
    assert not stream_threads()


def test_the_reader_stays_within_prefetch_of_a_slow_consumer(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=20000, width=64))
    s = ds.stream(path, batch_size=100, prefetch=2, memory_budget="2MiB")  # small blocks: about 1000 rows
    assert len(s.block_bounds) >= 16
    rows_per_block = s.block_bounds[0][1] - s.block_bounds[0][0]
    start = bytes_read_here()
    iterator = iter(s)
    next(iterator)
    time.sleep(0.3)
    read = bytes_read_here() - start
    # At most the rows of the batches taken, ready and waiting to enter the queue, plus one read in
    # flight per thread, one more queued and the block being taken apart.
    bound_rows = (1 + 2 + 1) * 100 + (s.threads + 2) * rows_per_block
    assert read <= bound_rows * 64 * 8
    assert read < 20000 * 64 * 8
    del iterator


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"axis": 2}, "axis"),
        ({"batch_size": 0}, "batch_size"),
        ({"prefetch": 0}, "prefetch"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"shuffle": True, "world_size": 2}, "seed"),
        ({"shuffle_blocks": 0}, "shuffle_blocks"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, match):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=100))
    with pytest.raises(DaskstreamError, match=match):
        ds.stream(path, **kwargs)


def test_zipped_arrays_of_different_lengths_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((10, 2)))
    np.save(tmp_path / "b.npy", np.zeros(11))
    with pytest.raises(InvalidArgumentError, match="one length"):
        ds.stream((str(tmp_path / "a.npy"), str(tmp_path / "b.npy")))


def test_the_stream_shows_itself_in_jupyter(stored):
    path, _ = stored
    html = ds.stream(path, batch_size=100)._repr_html_()
    assert "<svg" in html
    assert "Stream" in html
    assert "100 items" in html


def test_worker_shares_are_disjoint_and_cover():
    shares = {worker_share(rank=r, world_size=2, worker_id=w, num_workers=3) for r in range(2) for w in range(3)}
    assert {rank for rank, _ in shares} == set(range(6))
    assert {size for _, size in shares} == {6}


def test_torch_dataset_splits_work_across_dataloader_workers(tmp_path):
    torch = pytest.importorskip("torch")
    from daskstream.torch import StreamDataset

    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    dataset = StreamDataset(path, batch_size=128, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    items = torch.cat(list(loader))[:, 0].numpy()
    assert sorted(items.tolist()) == list(range(N))


@pytest.mark.parametrize("shuffle", [False, True])
def test_what_a_stream_holds_fits_its_budget(stored, shuffle):
    path, data = stored
    budget = 512 * 2**10  # a shuffle window of four 16 KiB HDF5 chunks, with reads and batches, fits
    s = ds.stream(path, shuffle=shuffle, seed=0, memory_budget=budget)
    assert set(s.memory_terms) == {"read ahead", "shuffle window", "batches ready", "batch forming", "batch in use"}
    assert s.projected_peak_bytes <= budget
    assert (s.memory_terms["shuffle window"] > 0) == shuffle
    np.testing.assert_array_equal(np.sort(np.concatenate(list(s))[:, 0]), data[:, 0])


def test_a_shuffle_window_larger_than_the_budget_is_refused_before_reading(tmp_path):
    path = str(tmp_path / "x.zarr")
    zarr.create_array(path, shape=(4096, 256), chunks=(256, 256), dtype="f8")[...] = 0  # 512 KiB chunks
    start = bytes_read_here()
    with pytest.raises(MemoryBudgetError, match=r"shuffle window 32\.00 MiB.*lower shuffle_blocks"):
        ds.stream(path, shuffle=True, shuffle_blocks=64, memory_budget="16MiB")
    assert bytes_read_here() == start


def test_a_stream_keeps_the_budget_its_array_was_opened_with(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=20000, width=64))
    s = ds.stream(ds.open(path, memory_budget="1MiB"), shuffle=True, seed=1)
    assert s.resources.memory_budget == 2**20
    assert s.projected_peak_bytes <= 2**20
