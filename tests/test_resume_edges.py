"""A resume at any position of an epoch, the first batch to past the last, yields exactly what was left.

``Stream`` over generated sizes, splits and positions (hypothesis), and elastic
padding; torchdata's loaders at the same edges: tests/test_resume_edges_torch.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_helpers import indexed

import daskstream as ds

ENDED = -1  # a position: the loop over the epoch ran to its end, then the state was saved


def rows(batch) -> list[int]:
    part = batch[0] if isinstance(batch, tuple) else batch
    return [int(v) for v in np.asarray(part)[:, 0]]


@pytest.fixture(scope="module")
def sizes_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("resume-edges")


def stored_rows(folder, n: int) -> str:
    path = folder / f"rows-{n}.npy"
    if not path.exists():
        np.save(path, indexed(n=n, width=2))
    return str(path)


def cut_and_resume(made, position: int) -> tuple[list, list, list, list]:
    """The uninterrupted epochs 0 and 1, and the batches before and after a state saved at ``position``
    (then the epoch after the resumed one)."""
    uninterrupted = made()
    epoch_zero = [rows(b) for b in uninterrupted]
    epoch_one = [rows(b) for b in uninterrupted]
    first = made()
    if position == ENDED:
        before = [rows(b) for b in first]
    else:
        batches = iter(first)
        before = [rows(next(batches)) for _ in range(position)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = made()
    resumed.load_state_dict(state)
    after = [rows(b) for b in resumed]
    return epoch_zero, epoch_one, before, after + [rows(b) for b in resumed]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 400),
    batch_size=st.integers(1, 48),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    elastic=st.booleans(),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    data=st.data(),
)
def test_a_stream_resumed_at_any_position_yields_exactly_the_rest(
    sizes_folder, n, batch_size, drop_last, shuffle, elastic, world, workers, data
):
    rank = data.draw(st.integers(0, world - 1), label="rank")
    worker = data.draw(st.integers(0, workers - 1), label="worker")
    path = stored_rows(sizes_folder, n)

    def made():
        return ds.stream(
            path, batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, seed=11, elastic=elastic,
            rank=rank, world_size=world, worker=worker, num_workers=workers, shuffle_blocks=2, memory_budget="1MiB",
        )  # fmt: skip

    batches = len(made())
    position = data.draw(st.sampled_from([ENDED, *range(batches + 1)]), label="position")
    epoch_zero, epoch_one, before, after = cut_and_resume(made, position)
    if position == ENDED:
        # The loop over the epoch had ended: the state is the next epoch's start.
        assert after[: len(epoch_one)] == epoch_one
    else:
        # The rest of the epoch (nothing after its last batch), then the next epoch as it would have come.
        assert before + after == epoch_zero + epoch_one


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), batch_size=st.integers(1, 40), world=st.integers(1, 5), shuffle=st.booleans())
def test_elastic_padding_repeats_fewer_items_than_ranks(sizes_folder, n, batch_size, world, shuffle):
    path = stored_rows(sizes_folder, n)
    ranks = [
        ds.stream(path, batch_size=batch_size, shuffle=shuffle, seed=2, elastic=True, rank=r, world_size=world)
        for r in range(world)
    ]
    taken = [[row for batch in rank for row in rows(batch)] for rank in ranks]
    assert len({len(rank) for rank in ranks}) == 1  # the same number of steps on every rank
    assert all(len(items) <= -(-n // world) for items in taken)
    every = [row for items in taken for row in items]
    assert set(every) == set(range(n))
    assert len(every) - n <= world - 1
