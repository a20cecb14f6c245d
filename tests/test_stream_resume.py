"""Streams resumed mid-epoch from a saved state, elastic global orders, and what a stream keeps between epochs."""

from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zarr
from stream_helpers import WIDTH, N, indexed

import daskstream as ds
from daskstream.errors import DaskstreamWarning, InvalidArgumentError, SourceChangedError
from daskstream.sources.reads import bytes_read_here


@pytest.fixture(params=["npy", "zarr"])
def stored(request, tmp_path):
    data = indexed()
    if request.param == "npy":
        path = str(tmp_path / "x.npy")
        np.save(path, data)
    else:
        path = str(tmp_path / "x.zarr")
        zarr.create_array(path, shape=data.shape, chunks=(100, WIDTH), dtype=data.dtype)[...] = data
    return path


def rows(batch) -> list[int]:
    return batch[:, 0].astype(int).tolist()


def settled_reads() -> int:
    """Bytes read in this process once the reads of streams dropped earlier have landed."""
    gc.collect()
    last, deadline = bytes_read_here(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = bytes_read_here()
        if now == last:
            return now
        last = now
    return last


SPLITS = {
    "one consumer": {},
    "rank 1 of 3": {"rank": 1, "world_size": 3},
    "worker 1 of 2": {"worker": 1, "num_workers": 2},
}


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("elastic", [False, True], ids=["split", "elastic"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_a_resumed_stream_yields_exactly_what_an_uninterrupted_one_would(stored, shuffle, elastic, split):
    def made():
        return ds.stream(
            stored, batch_size=64, shuffle=shuffle, seed=3, elastic=elastic, shuffle_blocks=2, memory_budget="1MiB",
            **split,
        )  # fmt: skip

    uninterrupted = made()
    epoch_zero = [rows(b) for b in uninterrupted]
    epoch_one = [rows(b) for b in uninterrupted]
    # Cut before the first batch, inside the first window, past several windows, before the last batch.
    for cut in (0, 1, 9, len(epoch_zero) - 1):
        first = made()
        batches = iter(first)
        before = [rows(next(batches)) for _ in range(cut)]
        # Through JSON, as a checkpoint file would carry it.
        state = json.loads(json.dumps(first.state_dict()))
        del batches
        assert (state["epoch"], state["batches"]) == (0, cut)
        resumed = made()
        resumed.load_state_dict(state)
        assert before + [rows(b) for b in resumed] == epoch_zero
        assert [rows(b) for b in resumed] == epoch_one  # and the epochs after it as well
    # A state saved once the epoch is over is the next epoch's start.
    finished = made()
    list(finished)
    state = finished.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    resumed = made()
    resumed.load_state_dict(state)
    assert [rows(b) for b in resumed] == epoch_one


def test_resuming_in_order_reads_only_what_is_left(tmp_path):
    path = str(tmp_path / "x.npy")
    data = indexed(n=40000, width=64)  # 10 MiB
    np.save(path, data)
    s = ds.stream(path, batch_size=100, read_next_epoch=False)
    batches = iter(s)
    for _ in range(300):  # three quarters of the epoch
        next(batches)
    state = s.state_dict()
    del batches, s
    resumed = ds.stream(path, batch_size=100, read_next_epoch=False)
    resumed.load_state_dict(state)
    start = settled_reads()
    rest = np.concatenate(list(resumed))
    np.testing.assert_array_equal(rest, data[30000:])
    assert settled_reads() - start == rest.nbytes  # not a byte of the first three quarters again


def test_resuming_a_shuffled_stream_reads_the_window_it_stopped_in_once_and_nothing_before(tmp_path):
    path = str(tmp_path / "x.npy")
    data = indexed(n=40000, width=64)
    np.save(path, data)

    def made():
        return ds.stream(
            path, batch_size=100, shuffle=True, seed=1, shuffle_blocks=2, read_next_epoch=False, memory_budget="4MiB"
        )

    s = made()
    shard_bytes = (s.block_bounds[0][1] - s.block_bounds[0][0]) * data[0].nbytes
    window_bytes = 2 * shard_bytes
    assert len(s.block_bounds) >= 8
    batches = iter(s)
    for _ in range(250):
        next(batches)
    state = s.state_dict()
    del batches, s
    resumed = made()
    resumed.load_state_dict(state)
    start = settled_reads()
    rest = np.concatenate(list(resumed))
    read = settled_reads() - start
    assert len(rest) == 40000 - 250 * 100
    # What is left, and the part of the window it stopped in that was already yielded: at most a window more.
    assert rest.nbytes <= read <= rest.nbytes + window_bytes


def state_after_one_batch(path: str) -> tuple[ds.Stream, dict]:
    """A shuffled stream of ``path`` (seed 2) and its state once one batch is taken."""
    s = ds.stream(path, batch_size=64, shuffle=True, seed=2)
    batches = iter(s)
    next(batches)
    state = s.state_dict()
    del batches
    return s, state


def test_a_changed_source_or_plan_is_refused_with_what_differs(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    _, state = state_after_one_batch(path)

    with pytest.raises(InvalidArgumentError, match=r"batch_size 64 then, 128 now.*make the stream as it was"):
        ds.stream(path, batch_size=128, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match=r"world_size 1 then, 2 now.*elastic=True"):
        ds.stream(path, batch_size=64, shuffle=True, seed=2, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match=r"seed 2 then, 5 now"):
        ds.stream(path, batch_size=64, shuffle=True, seed=5).load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match=r"takes what a daskstream stream's state_dict\(\) returned"):
        ds.stream(path, batch_size=64).load_state_dict({"epoch": 0})

    time.sleep(0.01)
    np.save(path, indexed())  # the same values, written again: another file as far as positions go
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    with pytest.raises(SourceChangedError, match=r"the data changed since the state was saved") as info:
        ds.stream(path, batch_size=64, shuffle=True, seed=2).load_state_dict(state)
    assert isinstance(info.value, RuntimeError)


def test_a_drawn_seed_travels_in_the_state(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    s = ds.stream(path, batch_size=64, shuffle=True)
    assert isinstance(s.seed, int)
    batches = iter(s)
    before = [rows(next(batches)) for _ in range(5)]
    state = s.state_dict()
    rest_expected = [rows(b) for b in batches]
    again = ds.stream(path, batch_size=64, shuffle=True)  # draws another seed; the state's wins
    again.load_state_dict(state)
    assert again.seed == s.seed
    assert [rows(b) for b in again] == rest_expected
    assert sorted(list(itertools.chain.from_iterable(before + rest_expected))) == list(range(N))


def test_setting_another_epoch_after_loading_a_state_says_the_state_is_dropped(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    s, state = state_after_one_batch(path)
    resumed = ds.stream(path, batch_size=64, shuffle=True, seed=2)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # the state's own epoch: still resumed
    assert len(list(resumed)) == len(s) - 1
    resumed.load_state_dict(state)
    with pytest.warns(DaskstreamWarning, match=r"resumes epoch 0 at batch 1; set_epoch\(4\) starts epoch 4"):
        resumed.set_epoch(4)
    assert len(list(resumed)) == len(s)


# --- elastic: one global order whatever the world size --------------------------------------------


def job_order(path, world_size, num_workers=1, shuffle=True, **options):
    """The batches a job of ``world_size`` ranks takes, step by step (each rank's workers in turn)."""
    consumers = {
        (rank, worker): iter(
            ds.stream(
                path, batch_size=50, shuffle=shuffle, seed=9, elastic=True, rank=rank, world_size=world_size,
                worker=worker, num_workers=num_workers, **options,
            )
        )
        for rank in range(world_size)
        for worker in range(num_workers)
    }  # fmt: skip
    order, step = [], 0
    while True:
        taken = [next(consumers[(rank, step % num_workers)], None) for rank in range(world_size)]
        taken = [rows(b) for b in taken if b is not None]
        if not taken:
            return order
        order += taken
        step += 1


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_an_elastic_order_is_the_same_for_any_world_size_and_workers(stored, shuffle):
    alone = job_order(stored, 1, shuffle=shuffle, shares="uneven")
    assert sorted(list(itertools.chain.from_iterable(alone))) == list(range(N))
    assert job_order(stored, 2, shuffle=shuffle, shares="uneven") == alone
    assert job_order(stored, 3, num_workers=2, shuffle=shuffle, shares="uneven") == alone
    if shuffle:
        assert list(itertools.chain.from_iterable(alone)) != list(range(N))


def test_elastic_ranks_get_equal_batch_counts_when_padded(stored):
    counts = [len(ds.stream(stored, batch_size=50, elastic=True, rank=r, world_size=4)) for r in range(4)]
    assert counts == [16] * 4  # 61 global batches: 15 steps of four whole ones, then the last item cut in four
    order = job_order(stored, 4)
    assert len(order) == 64
    taken = list(itertools.chain.from_iterable(order))
    assert set(taken) == set(range(N))
    assert len(taken) == 4 * -(-N // 4)  # each rank ceil(N / 4) items: 3 repeated, not 3 batches
    assert [len(batch) for batch in order[-4:]] == [1, 1, 1, 1]
    assert set(taken[-3:]) <= set(order[0])  # the padding wraps to the epoch's first items


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_an_elastic_job_resumes_on_another_world_size_without_repeating_or_skipping(stored, shuffle):
    def rank(r, world_size):
        return ds.stream(stored, batch_size=50, shuffle=shuffle, seed=9, elastic=True, rank=r,
                         world_size=world_size, shares="uneven")  # fmt: skip

    alone = job_order(stored, 1, shuffle=shuffle, shares="uneven")
    four = [rank(r, 4) for r in range(4)]
    running = [iter(s) for s in four]
    taken = [rows(next(batches)) for _ in range(5) for batches in running]  # five steps of four ranks
    state = json.loads(json.dumps(four[0].state_dict()))
    assert state["global_batches"] == 20
    del running
    three = [rank(r, 3) for r in range(3)]
    for s in three:
        s.load_state_dict(state)
    running = [iter(s) for s in three]
    while batches := [rows(b) for b in (next(it, None) for it in running) if b is not None]:
        taken += batches
    assert taken == alone


def test_a_worker_state_alone_does_not_move_an_elastic_job_to_other_workers(stored):
    s = ds.stream(stored, batch_size=50, elastic=True, worker=1, num_workers=2)
    next(iter(s))
    with pytest.raises(InvalidArgumentError, match=r"one DataLoader worker's position"):
        ds.stream(stored, batch_size=50, elastic=True, world_size=2, rank=0).load_state_dict(s.state_dict())


def test_explain_says_what_an_elastic_shuffle_costs_in_reads(stored):
    plain = ds.stream(stored, batch_size=50, shuffle=True, seed=1)
    elastic = ds.stream(stored, batch_size=50, shuffle=True, seed=1, elastic=True, rank=1, world_size=4)
    assert "each item read once" in plain.explain() or plain.read_amplification < 1.3
    assert elastic.read_amplification > 2  # each rank reads every window for a quarter of its items
    text = elastic.explain()
    assert f"{elastic.read_amplification:.2f} bytes read per byte delivered" in text
    assert "global batches 1, 5, 9" in text
    assert "Holds at most" in text
    assert "shuffle order" in text


# --- between epochs ---------------------------------------------------------------------------------


def stream_threads():
    return [t for t in threading.enumerate() if t.name.startswith("daskstream-")]


def test_a_stream_that_does_not_read_the_next_epoch_holds_nothing_between_epochs(tmp_path):
    path = str(tmp_path / "x.npy")
    data = indexed(n=20000, width=64)
    np.save(path, data)
    s = ds.stream(path, batch_size=100, shuffle=True, seed=0, read_next_epoch=False)
    start = settled_reads()
    list(s)
    assert not stream_threads()
    assert settled_reads() - start == data.nbytes  # nothing of the next epoch
    assert "nothing is read ahead or kept" in s.explain()


def test_close_ends_the_reading_threads_and_drops_the_next_epochs_reads(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=20000, width=64))
    with ds.stream(path, batch_size=100, shuffle=True, seed=0) as s:
        list(s)
        assert stream_threads()  # kept for the next epoch
        s.close()
        assert not stream_threads()
        assert sorted(np.concatenate(list(s))[:, 0]) == list(range(20000))  # and it streams again
    assert not stream_threads()


def test_numpy_labels_stream_beside_a_file(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    labels = np.arange(N) * 10
    for x, y in ds.stream((path, labels), batch_size=100, shuffle=True, seed=0):
        np.testing.assert_array_equal(x[:, 0].astype(int) * 10, y)
        assert not np.shares_memory(y, labels)


def test_a_state_resumes_in_a_fresh_process(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    s = ds.stream(path, batch_size=64, shuffle=True, seed=8)
    batches = iter(s)
    for _ in range(7):
        next(batches)
    state = json.dumps(s.state_dict())
    expected = [rows(b) for b in batches]
    script = (
        "import json, sys\n"
        "import daskstream as ds\n"
        "s = ds.stream(sys.argv[1], batch_size=64, shuffle=True, seed=8)\n"
        "s.load_state_dict(json.loads(sys.argv[2]))\n"
        "print(json.dumps([b[:, 0].astype(int).tolist() for b in s]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, path, state], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
