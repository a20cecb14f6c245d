"""Plans at any size: the scheduler's cost model sets how large chunks grow, and the same inputs give the same plan.

Sizes this machine cannot hold are virtual Zarr arrays (metadata only: every chunk reads as the fill
value) and the pure planner; growth is checked by counting tasks, never by timing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import dask.config
import numpy as np
import pytest
import yaml
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.errors import InvalidArgumentError, MemoryBudgetError
from daskstream.planning.budget import MAX_BUDGET_BYTES, format_size
from daskstream.planning.chunks import plan_chunks_exact
from daskstream.planning.plan import per_task_cap
from daskstream.planning.settings import SchedulerCost

MiB, GiB, TiB, PiB = 2**20, 2**30, 2**40, 2**50


def plan(shape, storage_chunks, *, budget, scheduler, dtype="f4", threads=2, workers=1):
    return plan_chunks_exact(
        shape,
        dtype,
        storage_chunks=storage_chunks,
        layout="chunked",
        memory_budget=budget,
        threads=threads,
        workers=workers,
        reduce_axis=None,
        target_chunk_bytes=8 * MiB,
        working_set_factor=7.0,
        min_tasks_per_thread=2,
        decode_bytes=2 * MiB,
        scheduler=scheduler,
    )


@pytest.fixture
def four_tib(tmp_path):
    """The array every plan refused: 4 TiB of (512, 512) float32 storage chunks (no chunk written)."""
    path = tmp_path / "big.zarr"
    zarr.create_array(str(path), shape=(2**20, 2**20), chunks=(512, 512), dtype="f4")
    return path


def test_an_array_of_small_storage_chunks_past_the_old_ceiling_opens_with_chunks_grown_to_fit(four_tib):
    # The graph's ceiling alone: without the floor the time to the first task sets (tested below).
    with dask.config.set({"daskstream.planning.first-task-within": None}):
        x = ds.open(four_tib, memory_budget="1TiB")
        planned = ds.plan(four_tib, memory_budget="1TiB")
    assert x.chunksize == planned.chunks
    assert planned.scheduler.max_blocks is not None
    assert x.npartitions <= planned.scheduler.max_blocks  # grown past the preferred size, within the ceiling
    assert planned.chunk_bytes > planned.target_chunk_bytes
    assert all(c % 512 == 0 for c in planned.chunks)  # still whole storage chunks
    assert "set by the task graph's ceiling" in planned.explain()
    # Parts of it compute as the oracle says: fill values.
    np.testing.assert_array_equal(x[:3, :5].compute(), np.zeros((3, 5), "f4"))


@pytest.mark.parametrize("within", ["5s", "2s"])
def test_chunks_of_a_huge_array_grow_until_its_graph_is_built_within_the_time_to_the_first_task(tmp_path, within):
    # ERA5's layout at 10 TiB: storage chunks of 100 MB would be 110k blocks, 220k tasks for a mean, and
    # dask builds a graph at about 50 us a task before the first runs.
    path = tmp_path / "era5.zarr"
    steps = 10 * 2**40 // (721 * 1440 * 4)
    zarr.create_array(str(path), shape=(steps, 721, 1440), chunks=(24, 721, 1440), dtype="f4")
    with dask.config.set({"daskstream.planning.first-task-within": within, "daskstream.planning.task-build": "50us"}):
        planned = ds.plan(path, memory_budget="16GiB", threads=2, workers=1)
        assert ds.open(path, memory_budget="16GiB").chunksize == ds.plan(path, memory_budget="16GiB").chunks
    seconds = float(within[:-1])
    cost = planned.scheduler
    assert planned.chunks[1:] == (721, 1440)
    assert planned.chunks[0] % 24 == 0  # whole storage chunks
    assert planned.n_tasks * cost.tasks_per_block * cost.build_seconds <= seconds * 1.01
    assert planned.chunk_bytes <= planned.per_chunk_cap
    assert "set by the time to the first task" in planned.explain()
    # With no such floor, the storage chunk is the plan: four times the blocks or more.
    with dask.config.set({"daskstream.planning.first-task-within": None}):
        assert ds.plan(path, memory_budget="16GiB", threads=2, workers=1).n_tasks >= 4 * planned.n_tasks


def test_the_time_to_the_first_task_never_grows_chunks_past_the_budget(tmp_path):
    path = tmp_path / "era5.zarr"
    zarr.create_array(str(path), shape=(2**22, 721, 1440), chunks=(24, 721, 1440), dtype="f4")  # 16 TiB
    planned = ds.plan(path, memory_budget="2GiB", threads=2, workers=1)
    assert planned.chunk_bytes <= planned.per_chunk_cap
    assert "set by the per-chunk budget" in planned.explain()


def test_a_budget_too_small_for_the_ceiling_opens_and_names_the_least_budget_that_fits(tmp_path):
    path = tmp_path / "wide.zarr"
    zarr.create_array(str(path), shape=(2**16, 2**16), chunks=(256, 256), dtype="f4")  # 16 GiB, virtual
    with dask.config.set({"daskstream.planning.max-tasks": 4000, "daskstream.planning.spans": False}):
        small = ds.plan(path, memory_budget="16MiB")
        assert small.beyond_graph_ceiling
        advised = small.budget_within_ceiling
        assert advised is not None
        assert advised > 16 * MiB
        assert f"raise memory_budget to at least {format_size(advised)}" in small.explain()
        # The advice, applied, gives a plan within the ceiling, and a budget a sixteenth below it does not.
        assert not ds.plan(path, memory_budget=advised).beyond_graph_ceiling
        assert ds.plan(path, memory_budget=advised - advised // 16 - 1).beyond_graph_ceiling
        x = ds.open(path, memory_budget="16MiB")  # opens: a part of it computes
        assert float(x[:1024, :1024].sum().compute()) == 0.0
        with pytest.raises(MemoryBudgetError, match="whose graph the client and scheduler may hold at once"):
            x.sum().compute()  # the whole at once is refused before it runs
        assert float(ds.open(path, memory_budget=advised).sum().compute()) == 0.0
    with dask.config.set({"daskstream.planning.max-tasks": 4000}):
        # Planned in spans (the default), the whole computes, a task streaming many chunks; the explanation
        # still names the budget whose plan is a task per chunk.
        spanned = ds.plan(path, memory_budget="16MiB")
        assert spanned.span is not None
        assert f"a task per chunk takes a memory_budget of at least {format_size(advised)}" in spanned.explain()
        assert float(ds.open(path, memory_budget="16MiB").sum().compute()) == 0.0


def test_an_axis_of_more_blocks_than_a_graph_may_hold_opens_and_its_parts_compute(tmp_path):
    # 20,000 blocks along time with room for 1,000 tasks in a graph: the listing of their lengths is small
    # (64 a task), the blocks are not; the whole at once is refused before anything is read.
    path = tmp_path / "long.zarr"
    zarr.create_array(str(path), shape=(20_000, 4, 8), chunks=(1, 4, 8), dtype="f4", fill_value=1.5)
    with dask.config.set({"daskstream.planning.max-tasks": 1000}):
        x = ds.open(path, chunks="storage")
        assert x.npartitions == 20_000
        np.testing.assert_array_equal(x[100:103].compute(), np.full((3, 4, 8), 1.5, "f4"))
        assert float(x[:10].sum().compute()) == 1.5 * 10 * 32
        with pytest.raises(MemoryBudgetError, match="more than the 1,000 whose graph"):
            x.sum().compute()
    # A listing past 64 lengths a task (here 6,400) is refused where it is opened, before dask lists it.
    with (
        dask.config.set({"daskstream.planning.max-tasks": 100}),
        pytest.raises(MemoryBudgetError, match="more than the 6,400 chunk lengths dask may list here"),
    ):
        ds.open(path, chunks="storage")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    log_bytes=st.integers(30, 60),  # 1 GiB to 1 EiB
    storage=st.sampled_from([(512, 512), (64, 4096), (1, 1024), (2048, 2048)]),
    log_budget=st.integers(26, 45),
    threads=st.integers(1, 64),
    workers=st.integers(1, 1024),
)
def test_any_size_plans_without_refusal_whenever_one_storage_chunk_per_thread_fits(
    log_bytes, storage, log_budget, threads, workers
):
    rows = max(1, 2 ** (log_bytes - 2) // 2**20)
    shape = (rows, 2**20)
    budget = min(2**log_budget * threads, MAX_BUDGET_BYTES)
    storage_bytes = math.prod(storage) * 4
    cost = SchedulerCost(task_seconds=1e-3, max_tasks=600_000)
    if per_task_cap(budget, threads, 7.0, 2 * MiB) < storage_bytes:
        return  # a storage chunk per thread does not fit: split (read amplification), another rule's case
    p = plan(shape, storage, budget=budget, scheduler=cost, threads=threads, workers=workers)
    assert p.read_amplification == 1.0
    assert p.chunk_bytes * 7.0 + 2 * MiB <= budget // threads  # a ceiling, never passed
    if p.beyond_graph_ceiling:
        # Only when the budget holds no larger chunk: the advice names one that does.
        assert p.budget_within_ceiling is None or p.budget_within_ceiling > budget
        if p.budget_within_ceiling is not None:
            again = plan(shape, storage, budget=p.budget_within_ceiling, scheduler=cost, threads=threads,
                         workers=workers)  # fmt: skip
            assert not again.beyond_graph_ceiling
    else:
        assert p.n_tasks <= cost.max_blocks


@pytest.mark.parametrize("log_size", [30, 40, 50, 60])
def test_tasks_stay_within_the_ceiling_from_a_gib_to_an_eib_when_the_budget_allows(log_size):
    shape = (2 ** (log_size - 22), 2**20)
    cost = SchedulerCost(max_tasks=600_000)
    p = plan(shape, (512, 512), budget=2**59, scheduler=cost)
    assert p.n_tasks <= cost.max_blocks
    # and no more tasks than the preferred size asks for where that is already within the ceiling
    assert p.n_tasks <= max(math.ceil(p.nbytes / (8 * MiB)), cost.max_blocks)


def test_more_threads_on_a_distributed_scheduler_grow_chunks_until_the_scheduler_keeps_up():
    shape, storage = (2**18, 2**15), (256, 256)
    cost = SchedulerCost(task_seconds=1e-3, thread_bytes_per_second=5e8, scheduler_share=0.1)
    small = plan(shape, storage, budget=16 * GiB, scheduler=cost, threads=2, workers=2)
    large = plan(shape, storage, budget=16 * GiB, scheduler=cost, threads=8, workers=64)
    assert small.chunk_bytes >= cost.load_floor_bytes(4) * 0.8
    assert large.chunk_bytes > small.chunk_bytes
    assert large.chunk_bytes >= cost.load_floor_bytes(512) * 0.8 or large.aim_bytes < cost.load_floor_bytes(512)
    assert "the scheduler's load" in small.explain()


def _plan_in_a_new_process(path, *args):
    code = (
        "import sys, json, daskstream as ds\n"
        "p = ds.plan(sys.argv[1])\n"
        "print(json.dumps({'chunks': p.chunks, 'budget': p.memory_budget, 'max_tasks': p.scheduler.max_tasks}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_same_file_gives_the_same_default_plan_in_two_processes_whatever_memory_is_free(tmp_path):
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=(2**16, 2**16), chunks=(256, 256), dtype="f8")
    first = _plan_in_a_new_process(path)
    # Another process takes 2 GiB meanwhile (touched, so it is resident): what is free changes, the plan not.
    hog = subprocess.Popen(
        [sys.executable, "-c", "import numpy, sys; a = numpy.ones(2**28); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert hog.stdout.readline().strip() == "held"
        second = _plan_in_a_new_process(path)
    finally:
        hog.communicate("")
    assert first == second


@pytest.mark.parametrize("limit", ["1GiB", "auto"])
def test_a_cluster_file_plans_before_it_runs_the_plan_its_running_cluster_makes(tmp_path, limit):
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=(4096, 8192), chunks=(256, 256), dtype="f4")
    # No memory-budget in the file: the budget comes from the workers' memory limit, as on a real cluster.
    cluster_file = tmp_path / "two.yaml"
    cluster_file.write_text(
        yaml.safe_dump(
            {
                "daskstream": {
                    "cluster": "local",
                    "local": {"n-workers": 2, "threads-per-worker": 2, "memory-limit": limit},
                }
            }
        )
    )
    before = ds.plan(path, cluster=cluster_file)
    assert (before.workers, before.threads) == (2, 2)
    assert before.scheduler.task_seconds == pytest.approx(1e-3)  # costed as dask.distributed
    with ds.session(cluster=str(cluster_file)) as s:
        running = ds.plan(path)
        again = ds.plan(path)
        # What a worker holds now changes nothing: the plan is the cluster's, not the moment's.
        held = s.client.submit(np.ones, 2**24, pure=False)
        held.result()
        later = ds.plan(path)
    assert before == running == again == later
    if limit != "auto":
        assert ds.plan(path, workers=2, threads=2, memory_limit=limit) == before


def test_planning_for_a_cluster_not_running_needs_its_size(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((100, 100), "f4"))
    with pytest.raises(InvalidArgumentError, match="are not known before it runs; give workers=, threads="):
        ds.plan(path, memory_limit="1GiB")
