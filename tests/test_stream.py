"""``daskstream.stream``: exact coverage, shuffling, sharding, zipped arrays, prefetch bounds and clean exits."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import DaskstreamError, InvalidArgumentError, MemoryBudgetError, SourceChangedError
from daskstream.sources.reads import bytes_read_here

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


def threads_settled() -> int:
    """Stream threads once those of streams dropped earlier (ended by garbage collection) are gone."""
    gc.collect()
    deadline = time.monotonic() + 5
    while stream_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(stream_threads())


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
    before = threads_settled()
    for _ in ds.stream(path, batch_size=10, prefetch=2):
        break
    gc.collect()
    assert len(stream_threads()) == before

    iterator = iter(ds.stream(path, batch_size=10))
    next(iterator)
    del iterator
    assert threads_settled() == before


def test_an_error_while_reading_reaches_the_consumer_and_the_reader_ends(tmp_path):
    path = tmp_path / "x.zarr"
    zarr.create_array(str(path), shape=(1000, 4), chunks=(100, 4), dtype="f8")[...] = 1.0
    s = ds.stream(str(path), batch_size=100)
    # A chunk that exists but cannot be decoded is an error naming it, never zeros.
    chunk = next(p for p in path.rglob("*") if p.is_file() and p.name == "0" and p.parent.name == "5")
    chunk.write_bytes(b"garbage")
    with pytest.raises(Exception, match="5"):
        list(s)
    assert threads_settled() == 0  # the stream is still referenced: its reading threads ended with the error


def settled(measure, *, quiet: float = 0.3, deadline: float = 20.0) -> int:
    """``measure()`` once it has not changed for ``quiet`` seconds: what a reader that stopped has read.

    Waiting for the count to settle (rather than sleeping a fixed time) keeps an upper bound from
    passing only because a slow machine had not read anything yet.
    """
    last, since, end = measure(), time.monotonic(), time.monotonic() + deadline
    while time.monotonic() < end:
        time.sleep(0.01)
        now = measure()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def test_the_reader_stays_within_prefetch_of_a_slow_consumer(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=20000, width=64))
    s = ds.stream(path, batch_size=100, prefetch=2, memory_budget="2MiB")  # small blocks: about 1000 rows
    assert len(s.block_bounds) >= 16
    rows_per_block = s.block_bounds[0][1] - s.block_bounds[0][0]
    start = bytes_read_here()
    iterator = iter(s)
    next(iterator)
    read = settled(lambda: bytes_read_here() - start)
    # The reader went ahead of the consumer: the batch taken and the two prefetched...
    assert read >= (1 + 2) * 100 * 64 * 8
    # ...and then stopped: at most the rows of the batches taken, ready and waiting to enter the
    # queue, plus one read in flight per thread, one more queued and the block being taken apart.
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


@pytest.mark.parametrize("shuffle", [False, True])
def test_what_a_stream_holds_fits_its_budget(stored, shuffle):
    path, data = stored
    budget = 2**20  # a shuffle window of four 16 KiB HDF5 chunks, with reads, decoding and batches, fits
    s = ds.stream(path, shuffle=shuffle, seed=0, memory_budget=budget)
    assert set(s.memory_terms) == {
        "read ahead",
        "decoding",
        "allocator reserve",
        "shuffle window",
        "shuffle order",
        "reads kept by batches",
        "batches ready",
        "batch forming",
        "batch in use",
        "bookkeeping",
    }
    assert s.projected_peak_bytes <= budget
    assert (s.memory_terms["shuffle window"] > 0) == shuffle
    np.testing.assert_array_equal(np.sort(np.concatenate(list(s))[:, 0]), data[:, 0])


@pytest.mark.parametrize("kind", ["npy", "hdf5", "zarr"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [64, 1536])  # 1536: batches across shuffle windows
def test_a_slow_loop_never_holds_more_than_the_projection(tmp_path, kind, shuffle, batch_size):
    # The worst case: a loop that first takes batches as fast as they come (the stream adds reads ahead
    # each time it is found waiting), then steps slowly, so that every read ahead, window and queued
    # batch is full. What Python and numpy allocate meanwhile stays within the projection (benchmarks/
    # stream_memory.py measures how close to it, and the resident size).
    import tracemalloc

    data = indexed(n=65536, width=32)  # 16 MiB, in 256 KiB storage chunks
    path = str(tmp_path / {"npy": "x.npy", "hdf5": "x.h5", "zarr": "x.zarr"}[kind])
    if kind == "npy":
        np.save(path, data)
    elif kind == "hdf5":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=(1024, 32), compression="gzip")
    else:
        zarr.create_array(path, shape=data.shape, chunks=(1024, 32), dtype=data.dtype)[...] = data
    threads_settled()
    s = ds.stream(path, batch_size=batch_size, shuffle=shuffle, seed=0, memory_budget="16MiB")
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for n, batch in enumerate(s):
            if n > len(s) // 2:
                time.sleep(0.002)
            del batch
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    # The allocator's reserve is resident memory no Python object holds: tracemalloc does not see it.
    assert 0 < peak <= s.projected_peak_bytes - s.memory_terms["allocator reserve"]


def test_a_shuffle_window_larger_than_the_budget_is_refused_before_reading(tmp_path):
    path = str(tmp_path / "x.zarr")
    zarr.create_array(path, shape=(4096, 256), chunks=(256, 256), dtype="f8")[...] = 0  # 512 KiB chunks
    start = settled(bytes_read_here)  # the reads of streams earlier tests stopped may still be landing
    with pytest.raises(MemoryBudgetError, match=r"shuffle window 32\.00 MiB.*lower shuffle_blocks"):
        ds.stream(path, shuffle=True, shuffle_blocks=64, memory_budget="16MiB")
    assert bytes_read_here() == start


def test_a_stream_keeps_the_budget_its_array_was_opened_with(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=20000, width=64))
    s = ds.stream(ds.open(path, memory_budget="1MiB"), shuffle=True, seed=1)
    assert s.resources.memory_budget == 2**20
    assert s.projected_peak_bytes <= 2**20


# --- ranks and workers: the same split everywhere, equal shares ---------------------------------


@pytest.mark.parametrize(("shares", "each"), [("pad", 1001), ("drop", 1000), ("uneven", None)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_rank_gets_the_share_it_is_promised(tmp_path, shares, each, shuffle):
    n = 3001
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=n))
    seen = []
    for rank in range(3):
        s = ds.stream(path, batch_size=64, shuffle=shuffle, seed=5, rank=rank, world_size=3, shares=shares)
        items = np.concatenate(list(s))[:, 0].astype(int)
        assert len(items) == (each or s.share[1] - s.share[0])
        assert len(np.unique(items)) == len(items) or shares == "pad"
        assert len(s) == s.rank_batches == -(-len(items) // 64)
        seen.append(items)
    everything = np.concatenate(seen)
    if shares == "uneven":
        assert sorted(everything.tolist()) == list(range(n))
        assert {len(items) for items in seen} <= {1000, 1001}
    elif shares == "drop":
        assert len(set(everything.tolist())) == 3000  # one item of the epoch's sequence left out
    else:
        assert set(everything.tolist()) == set(range(n))  # every item, two of them twice
        assert len(everything) == 3003


def test_workers_split_a_ranks_batches_without_changing_them(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=2000))
    whole = ds.stream(path, batch_size=50, rank=1, world_size=2)
    expected = np.concatenate(list(whole))[:, 0]
    for workers in (2, 3, 7):
        parts = [
            ds.stream(path, batch_size=50, rank=1, world_size=2, worker=w, num_workers=workers) for w in range(workers)
        ]
        assert sum(len(p) for p in parts) == len(whole) == whole.rank_batches
        np.testing.assert_array_equal(np.concatenate([np.concatenate(list(p)) for p in parts])[:, 0], expected)


RANK_ITEMS = """
import json, os, sys
os.sched_setaffinity(0, {cpus})
import daskstream as ds
s = ds.stream(sys.argv[1], shuffle=True, seed=3, rank=int(sys.argv[2]), world_size=2, batch_size=256)
items = [int(v) for batch in s for v in batch[:, 0]]
print(json.dumps({{"threads": s.threads, "budget": s.resources.memory_budget, "items": items}}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to give the ranks different ones")
def test_ranks_on_machines_of_different_sizes_split_alike(tmp_path):
    path = str(tmp_path / "x.zarr")
    n = 60_001
    data = indexed(n=n, width=32, dtype="f4")
    zarr.create_array(path, shape=data.shape, chunks=(500, 32), dtype="f4")[...] = data
    cpus = sorted(os.sched_getaffinity(0))
    ranks = []
    # Machines of different sizes: one CPU and a quarter of the memory, two CPUs and half of it.
    for rank, (allowed, share) in enumerate([(cpus[:1], "0.25"), (cpus[:2], "0.5")]):
        script = RANK_ITEMS.format(cpus=set(allowed))
        env = {**os.environ, "DASK_DASKSTREAM__PLANNING__MACHINE_MEMORY_FRACTION": share}
        done = subprocess.run(
            [sys.executable, "-c", script, path, str(rank)], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        ranks.append(json.loads(done.stdout))
    assert ranks[0]["threads"] != ranks[1]["threads"]
    assert ranks[0]["budget"] != ranks[1]["budget"]
    first, second = (r["items"] for r in ranks)
    assert len(first) == len(second) == 30_001
    assert set(first) | set(second) == set(range(n))
    assert len(set(first) & set(second)) == 1  # the one item padding repeats


def test_a_change_under_a_stream_says_what_to_do_in_a_training_loop(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, indexed(n=4000))
    s = ds.stream(str(path), batch_size=100, prefetch=1, memory_budget="512KiB")
    batches = iter(s)
    next(batches)
    np.save(path, indexed(n=4000) + 1)
    with pytest.raises(SourceChangedError) as info:
        list(batches)
    message = str(info.value)
    assert "this epoch would mix old and new data" in message
    assert "make the stream again" in message
    assert "start the epoch again" in message


# --- reads hidden behind the training step -------------------------------------------------------


def test_the_next_window_is_read_while_the_current_one_is_consumed(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=20000, width=64))  # 10 MiB of 512-byte rows
    s = ds.stream(path, batch_size=100, shuffle=True, seed=0, shuffle_blocks=2, memory_budget="4MiB")
    shard = (s.block_bounds[0][1] - s.block_bounds[0][0]) * 512
    assert len(s.block_bounds) >= 6
    start = bytes_read_here()
    batches = iter(s)
    next(batches)
    deadline = time.monotonic() + 10
    while bytes_read_here() - start < 4 * shard and time.monotonic() < deadline:
        time.sleep(0.01)
    # The window being consumed and the whole next one, while the loop holds the first batch.
    assert bytes_read_here() - start >= 4 * shard
    del batches


def test_the_next_epoch_begins_reading_during_this_one_and_nothing_is_read_twice(tmp_path):
    path = str(tmp_path / "x.npy")
    data = indexed(n=20000, width=64)
    np.save(path, data)
    s = ds.stream(path, batch_size=100, shuffle=True, seed=0, memory_budget="64MiB")
    assert len(s.block_bounds) <= s.threads + s.shuffle_blocks  # every shard fits the reads kept in flight
    start = bytes_read_here()

    def read_settles_at(expected: int) -> int:
        deadline = time.monotonic() + 10
        while bytes_read_here() - start < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        return bytes_read_here() - start

    for _ in s:
        pass
    assert read_settles_at(2 * data.nbytes) == 2 * data.nbytes  # epoch 0, and epoch 1 read ahead
    epoch = np.concatenate(list(s))
    np.testing.assert_array_equal(epoch[np.argsort(epoch[:, 0])], data)
    assert read_settles_at(3 * data.nbytes) == 3 * data.nbytes  # epoch 1 read nothing again; epoch 2 ahead
    # Reads begun for an epoch that does not come are dropped; the epoch asked for is whole.
    s.set_epoch(7)
    assert sorted(np.concatenate(list(s))[:, 0]) == list(range(20000))


def test_a_stream_left_between_epochs_keeps_no_thread_once_dropped(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    before = threads_settled()
    s = ds.stream(path, batch_size=100, shuffle=True, seed=0)
    list(s)
    assert stream_threads()  # kept between epochs, with the next epoch's first reads
    del s
    assert threads_settled() == before


def test_the_torch_adapter_without_torch_says_what_to_install():
    script = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if PyTorch were not installed\n"
        "try:\n"
        "    import daskstream.torch\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MissingDependencyError daskstream.torch needs torch"), done.stdout
    assert "pip install 'daskstream[torch]'" in done.stdout
