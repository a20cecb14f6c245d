"""torchdata's ``StatefulDataLoader`` resumed at any position yields exactly what was left, with any workers.

With 0 to 4 workers, persistent or not, at the positions where a loader's
workers differ: before any has yielded, while some have not, the last batches
(workers whose share has ended), after the last, and after the loop over the
epoch has ended; and the batches a rank yields with any number of loader
workers. The same edges for ``Stream`` alone: tests/test_resume_edges.py.
"""

from __future__ import annotations

import pytest
from test_resume_edges import ENDED, rows, stored_rows

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from daskstream.torch import StreamDataset  # noqa: E402 - only where torch is installed


@pytest.fixture(scope="module")
def sizes_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("resume-edges-torch")


ROWS, BATCH = 203, 10  # 21 batches, the last of 3 rows: shares of 21 batches split unevenly among workers


def loader_positions(workers: int, batches: int) -> list[int]:
    """The states worth saving with ``workers``: none yielded, some workers not yet, the last batches
    (some workers' shares over), after the last, after the loop."""
    early = range(min(workers + 2, batches + 1))
    late = range(max(0, batches - workers - 1), batches + 1)
    return [*sorted({*early, *late}), ENDED]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # more workers than cores here
@pytest.mark.parametrize(
    ("workers", "persistent"), [(0, False), (1, False), (2, False), (2, True), (3, False), (4, True)]
)
@pytest.mark.parametrize("elastic", [False, True], ids=["split", "elastic"])
def test_a_stateful_dataloader_resumed_anywhere_yields_exactly_the_rest(sizes_folder, workers, persistent, elastic):
    path = stored_rows(sizes_folder, ROWS)

    def loader():
        torch.manual_seed(5)  # the DataLoader's seed mixes the items of workers started afresh each epoch
        dataset = StreamDataset(path, batch_size=BATCH, shuffle=True, seed=1, elastic=elastic)
        return stateful.StatefulDataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=persistent)

    uninterrupted = loader()
    epoch_zero = [rows(b) for b in uninterrupted]
    epoch_one = [rows(b) for b in uninterrupted]
    assert sorted(r for b in epoch_zero for r in b) == list(range(ROWS))
    for position in loader_positions(workers, len(epoch_zero)):
        interrupted = loader()
        batches = iter(interrupted)
        before = [rows(b) for b in batches] if position == ENDED else [rows(next(batches)) for _ in range(position)]
        state = interrupted.state_dict()
        del batches, interrupted
        resumed = loader()
        resumed.load_state_dict(state)
        after = [rows(b) for b in resumed]
        if position == ENDED:
            assert after == epoch_one, "a state saved after the loop resumes at the next epoch"
            continue
        assert before + after == epoch_zero, f"resumed after {position} of {len(epoch_zero)} batches"
        assert [rows(b) for b in resumed] == epoch_one, f"and the epoch after, from {position}"


# --- the batches a rank yields, whatever the number of loader workers -------------------------------


def loader_batches(path: str, workers: int, **options) -> list[list[int]]:
    torch.manual_seed(0)
    dataset = StreamDataset(path, batch_size=BATCH, seed=4, **options)
    dataset.set_epoch(1)
    return [rows(b) for b in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # more workers than cores here
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_an_elastic_dataset_yields_the_same_batches_in_order_for_any_number_of_workers(sizes_folder, shuffle):
    path = stored_rows(sizes_folder, ROWS)
    alone = loader_batches(path, 0, shuffle=shuffle, elastic=True)
    assert sorted(r for b in alone for r in b) == list(range(ROWS))
    for workers in (1, 2, 3):
        assert loader_batches(path, workers, shuffle=shuffle, elastic=True) == alone, f"{workers} workers"


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_workers_split_a_rank_in_runs_the_same_rows_and_in_order_the_same_batches(sizes_folder):
    # What the docstrings say of the default split: the rank's rows and batch count whatever the workers;
    # in order, the same batches too, in the order the loader takes them from its workers.
    path = stored_rows(sizes_folder, ROWS)
    alone = loader_batches(path, 0)
    for workers in (1, 2, 3):
        split = loader_batches(path, workers)
        assert len(split) == len(alone)
        assert sorted(split) == sorted(alone), f"{workers} workers"
    shuffled = {workers: loader_batches(path, workers, shuffle=True) for workers in (0, 2)}
    assert sorted(r for b in shuffled[2] for r in b) == sorted(r for b in shuffled[0] for r in b)
