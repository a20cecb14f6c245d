"""``daskstream.torch.StreamDataset`` with real PyTorch: start methods, epochs, lengths and a two-rank gloo run."""

from __future__ import annotations

import io
import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stream_helpers import WIDTH, N, indexed  # noqa: E402

from daskstream.errors import InvalidArgumentError  # noqa: E402 - after the skip without torch
from daskstream.torch import Batch, StreamDataset  # noqa: E402 - after the skip without torch


def epoch_rows(loader) -> list[int]:
    rows = []
    for x, y in loader:
        assert isinstance(x, torch.Tensor)
        np.testing.assert_array_equal(x[:, 0].numpy() * 10, y.numpy())
        rows += x[:, 0].long().tolist()
    return rows


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_start_method_streams_every_row_once_as_tuples(arrays, method):
    dataset = StreamDataset(arrays, batch_size=128, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=method)
    batches = list(loader)
    assert all(type(batch) is Batch for batch in batches)
    assert len(batches) == len(loader) == len(dataset)
    rows = epoch_rows(batches)
    assert sorted(rows) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 CPUs
def test_len_is_what_a_rank_yields_whatever_the_workers(arrays, num_workers):
    dataset = StreamDataset(arrays[0], batch_size=100, shuffle=True, seed=1, rank=1, world_size=2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == len(loader) == len(dataset) == 16  # ceil(1501 / 100): shares padded to 1501
    assert sum(len(b) for b in batches) == 1501


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh-workers", "persistent-workers"])
@pytest.mark.parametrize("call_set_epoch", [False, True], ids=["no-set-epoch", "set-epoch"])
def test_orders_change_every_epoch_and_repeat_with_the_seeds(arrays, persistent, call_set_epoch):
    def three_epochs() -> list[list[int]]:
        torch.manual_seed(0)  # the DataLoader's per-epoch seed, for workers started afresh
        dataset = StreamDataset(arrays, batch_size=64, shuffle=True, seed=11)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=persistent)
        orders = []
        for epoch in range(3):
            if call_set_epoch:
                dataset.set_epoch(epoch)
            orders.append(epoch_rows(loader))
        return orders

    first = three_epochs()
    for order in first:
        assert sorted(order) == list(range(N))
    assert first[0] != first[1] != first[2] != first[0]
    assert three_epochs() == first


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_set_epoch_reaches_persistent_workers_with_every_start_method(arrays, method):
    epochs = [0, 0, 0, 10, 20, 3]  # the same epoch again, jumps, and back
    dataset = StreamDataset(arrays, batch_size=128, shuffle=True, seed=4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=method
    )
    seen = []
    for epoch in epochs:
        dataset.set_epoch(epoch)
        seen.append(epoch_rows(loader))
    for epoch, order in zip(epochs, seen):
        fresh = StreamDataset(arrays, batch_size=128, shuffle=True, seed=4)
        fresh.set_epoch(epoch)
        assert order == epoch_rows(torch.utils.data.DataLoader(fresh, batch_size=None, num_workers=2))
    assert seen[0] == seen[1] == seen[2] != seen[3]


def test_a_dataset_pickles_without_its_open_files(arrays):
    import pickle

    dataset = StreamDataset(arrays, batch_size=64)
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(copy) == len(dataset)
    assert sorted(epoch_rows(copy)) == list(range(N))


DDP_RANK = """
import json, os, sys, time
os.sched_setaffinity(0, {cpus})
import torch, torch.distributed as dist
from daskstream.torch import StreamDataset

rank, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=2,
                        timeout=__import__("datetime").timedelta(seconds=60))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear({width}, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
dataset = StreamDataset(path, batch_size=64, shuffle=True, seed=7, rank=rank, world_size=2)
loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
steps, rows = 0, []
for epoch in range(2):
    dataset.set_epoch(epoch)
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()  # an all-reduce across both ranks every step
        optimizer.step()
        steps += 1
        rows += x[:, 0].long().tolist()
dist.barrier()
dist.destroy_process_group()
print(json.dumps({{"steps": steps, "len": len(loader), "rows": rows}}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scripts: list[str], *args: str) -> list[Any]:
    """Run one Python process per script (rank ``i`` runs ``scripts[i]`` with ``i``, a free port and ``args``),
    and the JSON each prints last."""
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(rank), port, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, script in enumerate(scripts)
    ]
    results = []
    for process in ranks:
        try:
            out, err = process.communicate(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_two_ranks_of_different_sizes_train_an_epoch_in_step(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, indexed())
    cpus = sorted(os.sched_getaffinity(0))
    scripts = [textwrap.dedent(DDP_RANK).format(cpus=set(allowed), width=WIDTH) for allowed in (cpus[:1], cpus[:2])]
    results = run_ranks(scripts, path)
    first, second = results
    # Equal steps, or the all-reduce of the longer rank would wait for ever.
    assert first["steps"] == second["steps"] == 2 * first["len"] == 2 * 24  # ceil(ceil(3001 / 2) / 64) per epoch
    for epoch in range(2):
        one, two = (r["rows"][epoch * 1501 : (epoch + 1) * 1501] for r in results)
        assert set(one) | set(two) == set(range(N))
        assert len(set(one) & set(two)) == 1  # the row padding repeats


# --- checkpoints: torchdata's StatefulDataLoader, and elastic jobs ----------------------------------


def first_rows(loader_or_batches) -> list[int]:
    return [int(batch[0][0, 0]) if isinstance(batch, tuple) else int(batch[0, 0]) for batch in loader_or_batches]


# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which torch 2.13 deprecates.
TORCHDATA_CALLS_SET_VITAL = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@TORCHDATA_CALLS_SET_VITAL
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("elastic", [False, True], ids=["split", "elastic"])
def test_a_stateful_dataloader_resumes_mid_epoch_exactly(arrays, num_workers, elastic):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        torch.manual_seed(5)  # the DataLoader's per-epoch seed mixes fresh workers' items
        dataset = StreamDataset(arrays, batch_size=100, shuffle=True, seed=1, elastic=elastic)
        return stateful.StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers)

    uninterrupted = first_rows(loader())
    interrupted = loader()
    batches = iter(interrupted)
    before = [int(next(batches)[0][0, 0]) for _ in range(7)]
    buffer = io.BytesIO()
    torch.save(interrupted.state_dict(), buffer)  # as a training checkpoint carries it
    del batches
    buffer.seek(0)
    resumed = loader()
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    assert before + first_rows(resumed) == uninterrupted


@TORCHDATA_CALLS_SET_VITAL
def test_a_loader_state_with_workers_resumes_only_an_elastic_dataset_directly(arrays):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = StreamDataset(arrays, batch_size=100, shuffle=True, seed=1)
    loader = stateful.StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    del batches
    with pytest.raises(InvalidArgumentError, match=r"load it into the StatefulDataLoader"):
        StreamDataset(arrays, batch_size=100, shuffle=True, seed=1).load_state_dict(state)


ELASTIC_RANK = """
import json, sys
import torch, torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader
from daskstream.torch import StreamDataset

rank, port, path, checkpoint, phase = sys.argv[1:6]
rank, world = int(rank), {world}
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=world,
                        timeout=__import__("datetime").timedelta(seconds=60))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear({width}, 1))
dataset = StreamDataset(path, batch_size=50, shuffle=True, seed=7, rank=rank, world_size=world, elastic=True)
if phase == "first":
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
else:
    dataset.load_state_dict(torch.load(checkpoint, weights_only=False))  # saved by rank 0 of the first job
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1)
steps = []
for x in loader:
    model(x).sum().backward()  # an all-reduce across the ranks every step
    steps.append(x[:, 0].long().tolist())
    if phase == "first" and len(steps) == 9:
        if rank == 0:
            torch.save(loader.state_dict(), checkpoint)
        break
dist.barrier()
dist.destroy_process_group()
print(json.dumps(steps))
"""


def test_an_elastic_ddp_job_resumes_on_another_world_size_in_the_same_global_order(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    path = str(tmp_path / "x.npy")
    np.save(path, indexed(n=3000))  # 60 global batches of 50: nine steps of two ranks, then 14 of three
    checkpoint = str(tmp_path / "loader.pt")
    first = run_ranks([textwrap.dedent(ELASTIC_RANK).format(width=WIDTH, world=2)] * 2, path, checkpoint, "first")
    second = run_ranks([textwrap.dedent(ELASTIC_RANK).format(width=WIDTH, world=3)] * 3, path, checkpoint, "second")
    job = [batch for step in zip(*first) for batch in step] + [batch for step in zip(*second) for batch in step]
    alone = StreamDataset(path, batch_size=50, shuffle=True, seed=7, elastic=True)
    assert job == [batch[:, 0].long().tolist() for batch in alone]
    assert sorted(list(itertools.chain.from_iterable(job))) == list(range(3000))
