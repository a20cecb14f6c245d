"""A task's requests to an object store: started in order, a bounded count and a bounded number of bytes on
their way at once, so the first objects arrive early and memory holds no more than the bound."""

from __future__ import annotations

import asyncio

import dask
import numpy as np
import pytest
import zarr
from s3_helpers import running_s3_server

import daskstream as ds
from daskstream.sources.objects.places import Place
from daskstream.sources.objects.requests import Gate

LATENCY = 0.05  # long enough that the requests a client keeps on their way overlap at the server


def test_requests_start_in_order_within_their_count_and_bytes_and_a_large_one_goes_alone():
    sizes = [10, 10, 30, 5, 5, 50, 10, None, 10]
    started: list[int] = []
    seen = {"running": 0, "bytes": 0, "most running": 0}
    alone: list[bool] = []

    async def request(gate: Gate, position: int) -> None:
        async with gate.admitted(position):
            # Started in order: every request before it has started (those let go together run in any order).
            assert all(gate.started[earlier].is_set() for earlier in range(position)), position
            started.append(position)
            seen["running"] += 1
            seen["bytes"] += sizes[position] or 0
            seen["most running"] = max(seen["most running"], seen["running"])
            assert seen["bytes"] <= 25 or seen["running"] == 1, (position, seen)
            alone.append(seen["running"] == 1)
            await asyncio.sleep(0.002 * (1 + position % 3))
            seen["running"] -= 1
            seen["bytes"] -= sizes[position] or 0

    async def all_of_them() -> None:
        gate = Gate(sizes, limit=3, most_bytes=25)
        # Asked in reverse: the gate still starts them in their order.
        await asyncio.gather(*(request(gate, i) for i in reversed(range(len(sizes)))))

    asyncio.run(all_of_them())
    assert sorted(started) == list(range(len(sizes)))
    assert seen["most running"] == 3  # 5, 5 and a size not known: three, the count's bound
    assert alone[2]
    assert alone[5]


@pytest.fixture(scope="module")
def slow_s3(s3_credentials):
    """An S3 server answering each request after LATENCY seconds."""
    with running_s3_server(LATENCY) as server:
        yield server


def _objects(server, count: int, nbytes: int) -> tuple[Place, list[str], list[bytes]]:
    bucket = server.bucket()
    place = Place(f"s3://{bucket}/objects", server.options)
    bodies = [np.random.default_rng(i).bytes(nbytes) for i in range(count)]
    keys = [f"o{i}" for i in range(count)]
    place.put_many(dict(zip(keys, bodies)))
    return place, keys, bodies


def test_objects_of_known_size_are_fetched_a_few_bytes_at_a_time_in_order(slow_s3):
    place, keys, bodies = _objects(slow_s3, 6, 64 * 2**10)
    sizes = [len(body) for body in bodies]
    with dask.config.set({"daskstream.objects.bytes-in-flight": 100 * 2**10}):
        slow_s3.reset()
        arrived = list(place.get_each(keys, sizes=sizes))
    assert [position for position, _ in arrived] == list(range(6))  # one at a time: in order
    assert [got.data for _, got in arrived] == bodies
    assert slow_s3.most_gets_at_once() == 1
    with dask.config.set({"daskstream.objects.bytes-in-flight": 200 * 2**10}):
        slow_s3.reset()
        assert sorted(position for position, _ in place.get_each(keys, sizes=sizes)) == list(range(6))
    assert slow_s3.most_gets_at_once() == 3
    # Sizes not known: the count of requests alone bounds them.
    slow_s3.reset()
    assert sorted(position for position, _ in place.get_each(keys)) == list(range(6))
    assert slow_s3.most_gets_at_once() == 6


def test_an_empty_range_among_others_takes_its_turn_and_holds_none_up(slow_s3):
    place, keys, bodies = _objects(slow_s3, 1, 1000)
    with dask.config.set({"daskstream.objects.requests-per-task": 1}):
        got = place.get_ranges(keys[0], [(5, 5), (0, 10), (10, 10), (990, 1000)])
    assert [g.data for g in got] == [b"", bodies[0][:10], b"", bodies[0][990:]]


def test_a_sharded_array_reads_exactly_with_its_shards_a_bounded_number_at_once(slow_s3):
    data = np.random.default_rng(3).standard_normal((240, 60)).astype("f4")
    url = f"s3://{slow_s3.bucket()}/sharded.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=slow_s3.options)
    array = zarr.create_array(store, shape=data.shape, dtype=data.dtype, shards=(40, 60), chunks=(20, 30))
    array[...] = data
    x = ds.open(url, storage_options=slow_s3.options, chunks=(240, 60))  # one task: all six shards
    one_shard = max(slow_s3.fs.sizes([f"{url}/c/{i}/0" for i in range(6)]))
    with dask.config.set({"daskstream.objects.bytes-in-flight": 2 * one_shard, "scheduler": "sync"}):
        slow_s3.reset()
        np.testing.assert_array_equal(x.compute(), data)
        assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)
    assert slow_s3.most_gets_at_once() == 2
    # Each shard once per computation, whole, and the array's metadata as this process opens it.
    assert 12 <= slow_s3.requests().get("GET", 0) <= 12 + 2, slow_s3.requests()
