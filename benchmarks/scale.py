"""Scale: virtual arrays from a gibibyte to a pebibyte, a real scheduler summing up to a million chunks.

Three sections, each contender in a fresh interpreter:

``virtual``
    Zarr v3 arrays of metadata only (no chunk written: every chunk reads as the
    fill value, so the disk is no limit) in three layouts: ``small`` (square,
    (512, 512) float32 storage chunks of 1 MiB), ``era5`` ((time, 721, 1440)
    in (24, 721, 1440) chunks) and ``levels`` ((time, 37, 721, 1440) in
    (1, 37, 721, 1440) chunks), of ``--sizes`` bytes. For ``x.mean()`` and the
    centred ``(x - x.mean(axis=0)).std()``: the time to open, to build the
    expression and from ``.compute()`` to the first task starting (a dask
    callback stops the run there: the graph is built and optimized, nothing
    read), the tasks, and the interpreter's peak memory (the client's; on
    dask's threaded scheduler it is also the scheduler's). ``--expressions``
    adds daskstream's exact ``median`` and ``histogram``, and ``store``: ``x +
    1`` stored to a Zarr folder beside the array (``ds.store`` against
    ``da.to_zarr`` with zstd, the first task being the first write), and the
    ``monthly mean`` of labelled data: ``v.groupby("time.month").mean()`` of
    ``ds.open_dataset(path)`` against ``xr.open_zarr(path)`` (flox's map-reduce
    in both), on an hourly time coordinate written beside the ``era5`` layout's
    array (up to 4.9 million hours). Contenders:
    ``ds.open(path)``, ``da.from_zarr(path)`` and ``xr.open_zarr(path)``. A
    run has ``--timeout`` seconds and ``--memory`` bytes of address space; a
    contender that runs out of either at one size is not run at the larger
    ones. With ``--held-tasks K``, daskstream's computation then runs for
    real until ``K`` tasks reading data have finished: the process's peak
    beside the memory budget (arrays with more chunks than a graph may hold
    are read in spans, each task streaming many chunks).
``cluster``
    A real ``dask scheduler`` and ``dask worker`` processes (one thread each)
    on 127.0.0.1, fresh for every run; a client process sums a virtual array of
    ``K`` storage chunks of (256, 256) float32. Wall time of ``.sum().compute()``,
    tasks, the scheduler's CPU seconds and its peak memory; daskstream against
    ``da.from_zarr``. Runs are ``chunks:workers`` pairs (``--runs``).
``model``
    A 1,000-worker cluster of 8 threads and 32 GiB each on a 1 PiB array,
    planned with ``ds.plan(path, workers=, threads=, memory_limit=)`` (no
    cluster needed): blocks, tasks, the scheduler's load at the per-task cost
    measured in ``cluster`` and the projected time.

    python -m benchmarks.scale [--sections virtual,cluster,model] [--sizes 1GiB,100GiB,10TiB,1PiB]
                               [--layouts small,era5,levels] [--contenders daskstream,dask,xarray]
                               [--timeout 60] [--memory 16GiB] [--held-tasks 0]
                               [--runs 10000:2,10000:4,10000:8,50000:4,200000:4,1000000:4]
                               [--cluster-timeout 600] [--cluster-from REPORT.json]
                               [--out benchmarks/results/scale]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import dask.config
import psutil
from dask.utils import format_bytes, parse_bytes

from benchmarks.open_sum import machine_info, usable_cpus
from benchmarks.timing import write_results

REPOSITORY = Path(__file__).resolve().parent.parent
CONTENDERS = ("daskstream", "dask", "xarray")
EXPRESSIONS = ("mean", "centred std")
# Expressions only daskstream computes as written (plain dask has no exact median of a whole n-d array).
DASKSTREAM_ONLY = ("median", "histogram")  # ds.reduce(x, "median"); a histogram of 100 bins over (-1, 1)
# Expressions of labelled data: daskstream's open_dataset against xarray's open_zarr (plain dask has no labels).
# The array gets an hourly time coordinate from 1700: numpy's nanosecond dates reach 2262, so 4.9 million hours.
LABELLED = ("monthly mean",)
MOST_HOURS = 4_900_000
LAYOUTS = {
    # name: (the shape of an array of ``nbytes`` float32, storage chunks, dimension names)
    "small": (lambda n: (_side(n), _side(n)), (512, 512), ["y", "x"]),
    "era5": (lambda n: (max(1, n // (721 * 1440 * 4)), 721, 1440), (24, 721, 1440), ["time", "lat", "lon"]),
    "levels": (
        lambda n: (max(1, n // (37 * 721 * 1440 * 4)), 37, 721, 1440),
        (1, 37, 721, 1440),
        ["time", "level", "lat", "lon"],
    ),
}

# One contender's open, build and time to the first task over a virtual array, in an interpreter of its own.
VIRTUAL_RUN = """
import json, resource, sys, time
contender, path, expression, memory, held = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
import dask
import dask.array as da
import xarray as xr
import daskstream as ds
from dask.callbacks import Callback


class Started(Exception):
    pass


class StopAtFirstTask(Callback):
    def _start(self, dsk):
        raise Started(len(dsk))


result = {}
try:
    began = time.perf_counter()
    if expression == "monthly mean":  # labelled: a monthly climatology, flox's map-reduce in both
        v = ds.open_dataset(path)["v"] if contender == "daskstream" else xr.open_zarr(path, consolidated=False)["v"]
        x = v.data
    elif contender == "daskstream":
        x = ds.open(path + "/v")
    elif contender == "dask":
        x = da.from_zarr(path, component="v")
    else:
        x = xr.open_zarr(path, consolidated=False)["v"].data
    opened = time.perf_counter()
    if expression == "monthly mean":
        y = v.groupby("time.month").mean().data
    elif expression == "median":
        y = ds.reduce(x, "median")
    elif expression == "histogram":
        y = ds.reduce(x, "histogram", bins=100, range=(-1, 1))[0]
    elif expression == "store":
        y = x + 1
    elif expression == "flattened std":  # each first-axis position's grid flattened: a std per time step
        y = x.reshape(x.shape[0], -1).std(axis=1)
    elif expression == "moving mean":  # a kernel with a halo, reduced: a moving mean of 5 along the first axis
        from scipy import ndimage
        if contender == "daskstream":
            y = ds.kernels.moving_mean(x, 5, axis=0).mean()
        else:  # as a user of dask writes it: map_overlap with scipy's filter, mirrored at the edges
            y = da.map_overlap(ndimage.uniform_filter1d, x, depth={0: 2}, boundary="reflect", size=5, axis=0,
                               mode="reflect", dtype=x.dtype).mean()
    else:
        y = x.mean() if expression == "mean" else (x - x.mean(axis=0)).std()
    built = time.perf_counter()
    result.update(open_s=opened - began, build_s=built - opened, blocks=x.npartitions,
                  chunk_bytes=x.nbytes // x.npartitions)

    def run():
        if expression != "store":
            y.compute(scheduler="threads")
        elif contender == "daskstream":
            ds.store(y, path + "-stored.zarr", overwrite=True)
        else:  # as a user of dask stores: to_zarr on the threaded scheduler, zstd as daskstream writes
            import zarr
            with dask.config.set(scheduler="threads"):
                da.to_zarr(y, path + "-stored.zarr", overwrite=True, compressors=[zarr.codecs.ZstdCodec(level=3)])

    try:
        with StopAtFirstTask():
            run()
    except Started as started:
        result.update(first_task_s=time.perf_counter() - built, tasks=started.args[0], outcome="started")
    if held and contender == "daskstream":
        # Run the real work until `held` tasks reading the data have finished: what a task holds, read for real.
        class StopAfter(Callback):
            done = 0

            def _posttask(self, key, value, dsk, state, id):
                name = str(key[0] if isinstance(key, tuple) else key)
                if name.lstrip("_").startswith(("mean_chunk", "var", "stream-", "top_digit_counts", "chunk_counts",
                                                "daskstream-store-spans", "groupby_")):
                    StopAfter.done += 1
                    if StopAfter.done >= held:
                        raise Started(StopAfter.done)

        running = time.perf_counter()
        try:
            with StopAfter():
                run()
        except Started:
            result.update(held_tasks=StopAfter.done, held_s=time.perf_counter() - running,
                          held_peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          budget_bytes=ds.plan(path + "/v").memory_budget)
except ds.DaskstreamError as error:  # before MemoryError: a MemoryBudgetError is one too
    result.update(outcome="refused", message=str(error).splitlines()[0][:400])
    if "build_s" in result:
        result["refused_s"] = time.perf_counter() - built
except MemoryError:
    result["outcome"] = "out of memory"
result["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(result))
"""

# A client summing a virtual array on a running cluster; prints the wall time and the tasks.
CLUSTER_RUN = """
import json, sys, time
import dask, dask.array as da
import daskstream as ds
from distributed import Client

contender, path, scheduler_file = sys.argv[1:4]
with Client(scheduler_file=scheduler_file) as client:
    began = time.perf_counter()
    x = ds.open(path + "/v") if contender == "daskstream" else da.from_zarr(path, component="v")
    total = float(x.sum().compute())
    seconds = time.perf_counter() - began
    (optimized,) = dask.optimize(x.sum())
    print(json.dumps({"seconds": seconds, "sum": total, "blocks": x.npartitions,
                      "tasks": len(dict(optimized.__dask_graph__()))}))
"""


def _side(nbytes: int) -> int:
    """The side of a square float32 array of about ``nbytes``, in whole 512-element storage chunks."""
    return max(512, round(math.sqrt(nbytes / 4) / 512) * 512)


def virtual_array(
    folder: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dims: list[str], *, labelled: bool = False
) -> Path:
    """A Zarr v3 group holding array ``v`` of ``shape`` float32 in ``chunks``, with no chunk written; with
    ``labelled`` and a first dimension ``time`` of at most :data:`MOST_HOURS`, a real hourly time coordinate."""
    import numpy as np
    import zarr

    group = zarr.open_group(str(folder), mode="w", zarr_format=3)
    group.create_array("v", shape=shape, chunks=chunks, dtype="f4", fill_value=0.0, dimension_names=dims)
    if labelled and dims[0] == "time" and shape[0] <= MOST_HOURS:
        hours = group.create_array("time", shape=(shape[0],), chunks=(2**20,), dtype="i8", dimension_names=["time"])
        hours[:] = np.arange(shape[0], dtype="i8")
        hours.attrs.update(units="hours since 1700-01-01", calendar="proleptic_gregorian")
    return folder


def run_child(code: str, args: list[str], timeout: float, *, until: str = "started") -> dict[str, Any]:
    """``code`` run with ``args`` in a fresh interpreter (this repository's daskstream), its last line as JSON."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPOSITORY, env=environment, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"outcome": f"not {until} in {timeout:g} s"}
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        last = (err.strip().splitlines() or ["no output"])[-1]
        return {"outcome": "failed", "message": last[:400]}
    return json.loads(lines[-1])


def virtual(
    sizes: list[int],
    layouts: list[str],
    timeout: float,
    memory: int,
    folder: Path,
    contenders: list[str],
    held: int = 0,
    expressions: tuple[str, ...] = EXPRESSIONS,
) -> list[dict[str, Any]]:
    """Every layout x size x expression x contender, smallest size first; out-of-time contenders stop growing."""
    rows = []
    for layout in layouts:
        shape_of, chunks, dims = LAYOUTS[layout]
        stopped: set[tuple[str, str]] = set()
        for nbytes in sizes:
            shape = shape_of(nbytes)
            labelled = any(e in LABELLED for e in expressions)
            path = virtual_array(folder / f"{layout}-{nbytes}.zarr", shape, chunks, dims, labelled=labelled)
            for expression in expressions:
                if expression in LABELLED and (dims[0] != "time" or shape[0] > MOST_HOURS):
                    continue  # no time to group by
                for contender in contenders:
                    if (expression in DASKSTREAM_ONLY and contender != "daskstream") or (
                        expression in LABELLED and contender == "dask"
                    ):
                        continue
                    row = {"layout": layout, "nbytes": 4 * math.prod(shape), "shape": list(shape),
                           "storage_chunks": list(chunks), "expression": expression, "contender": contender}  # fmt: skip
                    if (contender, expression) in stopped:
                        row["outcome"] = "not run (out of time or memory at a smaller size)"
                    else:
                        arguments = [contender, str(path), expression, str(memory), str(held)]
                        row.update(run_child(VIRTUAL_RUN, arguments, timeout))
                        if row["outcome"] not in ("started", "refused"):
                            stopped.add((contender, expression))
                    rows.append(row)
                    print(_virtual_line(row), file=sys.stderr, flush=True)
            shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(f"{path}-stored.zarr", ignore_errors=True)
    return rows


class SchedulerWatch(threading.Thread):
    """The scheduler process's peak memory, sampled every 0.2 s while a run lasts."""

    def __init__(self, process: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.process, self.peak, self.done = process, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return


def cluster_run(path: Path, contender: str, workers: int, timeout: float, folder: Path) -> dict[str, Any]:
    """One contender's sum on a fresh ``dask scheduler`` and ``workers`` one-thread workers on 127.0.0.1."""
    scheduler_file = folder / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    base = [shutil.which("dask") or "dask"]
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    limit = psutil.virtual_memory().total // (workers + 2)
    started = [
        subprocess.Popen(
            [*base, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(scheduler_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, start_new_session=True,
        )
    ]  # fmt: skip
    try:
        while not scheduler_file.exists():
            time.sleep(0.1)
        started.append(
            subprocess.Popen(
                [*base, "worker", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--nworkers",
                 str(workers), "--nthreads", "1", "--memory-limit", str(limit), "--no-dashboard"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, start_new_session=True,
            )
        )  # fmt: skip
        from distributed import Client

        with Client(scheduler_file=str(scheduler_file), timeout="60s") as client:
            client.wait_for_workers(workers, timeout=120)
            # A scheduler imports the libraries a graph names once, at its first graph: not a cost of this one.
            client.run_on_scheduler(_import_array_libraries)
        scheduler = psutil.Process(started[0].pid)
        # What the scheduler spends with nothing to run (heartbeats, its own checks): a rate, not per GiB.
        idle_before, idle_began = _cpu(scheduler), time.perf_counter()
        time.sleep(IDLE_SECONDS)
        idle_rate = (_cpu(scheduler) - idle_before) / (time.perf_counter() - idle_began)
        before, began = _cpu(scheduler), time.perf_counter()
        watch = SchedulerWatch(scheduler)
        watch.start()
        row = run_child(CLUSTER_RUN, [contender, str(path), str(scheduler_file)], timeout, until="finished")
        watch.done.set()
        wall = time.perf_counter() - began
        row["scheduler_cpu_s"] = _cpu(scheduler) - before
        row["scheduler_idle_cpu_s"] = idle_rate * wall
        row["scheduler_peak_bytes"] = watch.peak
        row.setdefault("outcome", "finished")
        if contender == "daskstream" and row["outcome"] == "finished":
            row["scheduler_busy_cpu_s"] = _busy_scheduler_seconds(scheduler, scheduler_file, workers, wall)
        return row
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


#: Seconds an idle scheduler is watched before a run, for its CPU time with nothing to run.
IDLE_SECONDS = 5.0


# A client keeping every worker's thread busy with Python work for as long as a run took, as a run does.
BUSY_RUN = """
import json, sys, time
from distributed import Client

scheduler_file, workers, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


def spin(seconds):
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        sum(range(1000))


with Client(scheduler_file=scheduler_file) as client:
    began = time.perf_counter()
    client.gather(client.map(spin, [seconds] * workers, pure=False))
    print(json.dumps({"seconds": time.perf_counter() - began}))
"""


def _busy_scheduler_seconds(scheduler: psutil.Process, scheduler_file: Path, workers: int, wall: float) -> float:
    """The scheduler's CPU seconds while a fresh client keeps every worker busy for ``wall`` seconds with work
    of no data: what a run of that length costs it without the run's graph, tasks or data."""
    before = _cpu(scheduler)
    run_child(BUSY_RUN, [str(scheduler_file), str(workers), str(wall)], wall + 120, until="finished")
    return _cpu(scheduler) - before


def _import_array_libraries() -> None:
    import daskstream  # noqa: F401  (and dask.array, which it imports)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cluster(
    runs: list[tuple[int, int]], timeout: float, folder: Path, contenders: tuple[str, ...] = ("daskstream", "dask")
) -> list[dict[str, Any]]:
    """Each ``(chunks, workers)`` run for ``contenders`` (daskstream and plain dask); plain dask is not run past
    a size it ran out of time at."""
    rows = []
    out_of_time: int | None = None
    for chunks, workers in runs:
        columns = 100
        shape = (math.ceil(chunks / columns) * 256, columns * 256)
        path = virtual_array(folder / f"sum-{chunks}.zarr", shape, (256, 256), ["y", "x"])
        for contender in (c for c in ("daskstream", "dask") if c in contenders):
            row = {"storage_chunks": chunks, "workers": workers, "contender": contender, "shape": list(shape)}
            if contender == "dask" and out_of_time is not None and chunks > out_of_time:
                row["outcome"] = f"not run (out of time at {out_of_time:,} chunks)"
            else:
                row.update(cluster_run(path, contender, workers, timeout, folder))
                if row["outcome"] != "finished" and contender == "dask":
                    out_of_time = chunks if out_of_time is None else min(out_of_time, chunks)
            rows.append(row)
            print(_cluster_line(row), file=sys.stderr, flush=True)
        shutil.rmtree(path, ignore_errors=True)
    return rows


def model(cluster_rows: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """A 1,000-worker cluster on 1 PiB, from its plan and the per-task scheduler cost measured here."""
    import daskstream as ds
    from daskstream.runtime.resources import scheduler_cost

    cost = scheduler_cost(distributed=True)
    per_task = marginal_task_seconds(cluster_rows) or cost.task_seconds
    local_per_task = local_task_seconds()
    per_block = built_block_seconds(cluster_rows, per_task)
    graph_bytes = parse_bytes(dask.config.get("daskstream.planning.task-graph-bytes"))
    workers, threads, memory_limit = 1000, 8, "32GiB"
    rows = []
    for layout in ("small", "era5"):
        shape_of, chunks, dims = LAYOUTS[layout]
        shape = shape_of(2**50)
        path = virtual_array(folder / f"model-{layout}.zarr", shape, chunks, dims)
        began = time.perf_counter()
        plan = ds.plan(str(path / "v"), workers=workers, threads=threads, memory_limit=memory_limit)
        planning_s = time.perf_counter() - began
        read_s = plan.nbytes / (workers * threads * cost.thread_bytes_per_second)
        if plan.span is not None:
            # Each task streams a span of chunks: the graph is built a span at a time, and its tasks are counted
            # as dask optimizes it; the reading goes in waves of whole spans over the threads.
            blocks = plan.span_tasks
            tasks = built = ds.plan_compute(ds.open(str(path / "v"), chunks=plan).sum()).tasks
            span_s = math.prod(plan.span) * plan.chunk_bytes / cost.thread_bytes_per_second
            read_s = math.ceil(blocks / (workers * threads)) * span_s
        else:
            blocks = plan.n_tasks
            built = blocks * 2  # a read and its share of the sum per block, the combining tree's few besides
            tasks = streamed_tasks(cluster_rows, blocks, workers * threads) or built
        # The scheduler builds and optimizes the graph block by block (span by span) before streaming folds it.
        scheduler_s = tasks * per_task + blocks * per_block
        rows.append({
            "layout": layout, "shape": list(shape), "chunks": list(plan.chunks), "chunk_bytes": plan.chunk_bytes,
            "span": list(plan.span) if plan.span is not None else None, "blocks": blocks, "tasks": tasks,
            "built_tasks": built, "planning_s": planning_s, "scheduler_s": scheduler_s, "read_s": read_s,
            "projected_s": max(read_s, scheduler_s), "size_set_by": plan.size_terms()[1],
            "graph_bytes": built * graph_bytes,
        })  # fmt: skip
        shutil.rmtree(path, ignore_errors=True)
    return {"workers": workers, "threads": threads, "memory_limit": memory_limit, "per_task_s": per_task,
            "per_block_s": per_block,
            "local_per_task_s": local_per_task,
            "thread_bytes_per_second": cost.thread_bytes_per_second, "rows": rows}  # fmt: skip


def streamed_tasks(cluster_rows: list[dict[str, Any]], blocks: int, threads: int) -> int | None:
    """Tasks a scheduler runs for a sum of ``blocks`` blocks on ``threads`` threads with streaming tasks: four
    streaming tasks a thread, and the combines above them at the rate per block of the largest daskstream run
    above (its workers have one thread each); None without such a run."""
    from daskstream.compute.streaming.chains import WAVES

    runs = [r for r in cluster_rows if r.get("contender") == "daskstream" and r.get("outcome") == "finished"
            and r.get("blocks")]  # fmt: skip
    if not runs:
        return None
    largest = max(runs, key=lambda r: r["blocks"])
    above = max(0, largest["tasks"] - largest["workers"] * WAVES) / largest["blocks"]
    return threads * WAVES + math.ceil(above * blocks)


def built_block_seconds(cluster_rows: list[dict[str, Any]], per_task: float) -> float:
    """The scheduler's CPU seconds per block beyond the tasks it runs (receiving the graph, sending each task's work), the
    slope over daskstream's finished runs; 0 with fewer than two."""
    points = [(r["blocks"], net_scheduler_seconds(r) - r["tasks"] * per_task) for r in cluster_rows
              if r.get("contender") == "daskstream" and r.get("outcome") == "finished" and r.get("blocks")]  # fmt: skip
    if len({blocks for blocks, _ in points}) < 2:
        return 0.0
    mean_b = sum(b for b, _ in points) / len(points)
    mean_c = sum(c for _, c in points) / len(points)
    slope = sum((b - mean_b) * (c - mean_c) for b, c in points) / sum((b - mean_b) ** 2 for b, _ in points)
    return max(slope, 0.0)


def local_task_seconds(tasks: int = 200_000) -> float:
    """Seconds dask's threaded scheduler takes per task, over ``tasks`` tasks that do nothing (median of 3)."""
    import statistics

    import dask.threaded

    graph = {("empty", i): (int,) for i in range(tasks)}
    keys = list(graph)
    seconds = []
    for _ in range(3):
        began = time.perf_counter()
        dask.threaded.get(graph, keys, num_workers=usable_cpus())
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds) / tasks


def marginal_task_seconds(rows: list[dict[str, Any]]) -> float | None:
    """The scheduler's CPU seconds per task: the slope of a least-squares line through the finished runs
    (their intercept is the scheduler's own start and the client's connection), or ``None`` with fewer than two
    task counts."""
    points = [(r["tasks"], net_scheduler_seconds(r)) for r in rows if r.get("outcome") == "finished"]
    if len({tasks for tasks, _ in points}) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_c = sum(c for _, c in points) / len(points)
    slope = sum((t - mean_t) * (c - mean_c) for t, c in points) / sum((t - mean_t) ** 2 for t, _ in points)
    return slope if slope > 0 else None


def net_scheduler_seconds(row: dict[str, Any]) -> float:
    """The scheduler's CPU seconds in a run beyond what it spends idle over as long (0 before runs measured
    their idle scheduler)."""
    return float(row["scheduler_cpu_s"] - row.get("scheduler_idle_cpu_s", 0.0))


def _per_gib_read(row: dict[str, Any], beyond: str) -> str:
    if beyond not in row or "seconds" not in row:
        return "—"
    gib = math.prod(row["shape"]) * 4 / 2**30
    return f"{(row['scheduler_cpu_s'] - row[beyond]) / gib * 1e3:.2f}"


def _seconds(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "—"


def _first_task(row: dict[str, Any]) -> str:
    if "refused_s" in row:
        return f"refused after {row['refused_s']:.2f}"
    return _seconds(row, "first_task_s")


def _held(row: dict[str, Any]) -> str:
    if "held_peak_bytes" not in row:
        return "—"
    return (f"{format_bytes(row['held_peak_bytes'])} after {row['held_tasks']} tasks in {row['held_s']:.0f} s "
            f"({format_bytes(row['budget_bytes'])})")  # fmt: skip


def _count(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:,}" if key in row else "—"


def _virtual_line(row: dict[str, Any]) -> str:
    said = row["outcome"] if row.get("outcome") != "started" else "started"
    return (f"{row['layout']} {format_bytes(row['nbytes'])} {row['expression']} {row['contender']}: "
            f"open {_seconds(row, 'open_s')} s, build {_seconds(row, 'build_s')} s, first task "
            f"{_seconds(row, 'first_task_s')} s, refused after {_seconds(row, 'refused_s')} s, "
            f"{row.get('tasks', '—')} tasks ({said})")  # fmt: skip


def _cluster_line(row: dict[str, Any]) -> str:
    return (f"{row['storage_chunks']:,} chunks, {row['workers']} workers, {row['contender']}: "
            f"{_seconds(row, 'seconds')} s, {row.get('tasks', '—')} tasks ({row['outcome']})")  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    lines = [
        f"`{report['command']}` on {machine['cpu']} ({machine['usable_cores']} usable cores, "
        f"{machine['ram_bytes'] / 2**30:.0f} GiB), dask {machine['versions']['dask']}, zarr "
        f"{machine['versions']['zarr']}; each run in a fresh interpreter",
    ]
    if report.get("virtual"):
        lines += [
            "",
            "### Virtual arrays: open, build, time to the first task (threaded scheduler)",
            "",
            "| layout | size | expression | contender | open (s) | build (s) | first task (s) | tasks | chunk "
            "| peak memory | first task vs plain dask (xarray for labelled data) | peak after tasks read data (budget) |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for row in report["virtual"]:
            baseline = "xarray" if row["expression"] in LABELLED else "dask"
            dask_row = next(
                (r for r in report["virtual"] if r["contender"] == baseline and r["layout"] == row["layout"]
                 and r["nbytes"] == row["nbytes"] and r["expression"] == row["expression"]), None,
            )  # fmt: skip
            ratio = (
                f"{row['first_task_s'] / dask_row['first_task_s']:.2f}x"
                if "first_task_s" in row and dask_row and "first_task_s" in dask_row
                else "—"
            )
            outcome = (
                ""
                if row["outcome"] == "started"
                else f" ({row['outcome']}{': ' + row['message'] if 'message' in row else ''})"
            )
            lines.append(
                f"| {row['layout']} | {format_bytes(row['nbytes'])} | {row['expression']} | {row['contender']}"
                f"{outcome} | {_seconds(row, 'open_s')} | {_seconds(row, 'build_s')} | "
                f"{_first_task(row)} | {_count(row, 'tasks')} | "
                f"{format_bytes(row['chunk_bytes']) if 'chunk_bytes' in row else '—'} | "
                f"{format_bytes(row['peak_bytes']) if 'peak_bytes' in row else '—'} | {ratio} | {_held(row)} |"
            )
    if report.get("cluster"):
        lines += [
            "",
            "### A real scheduler and workers on 127.0.0.1 summing virtual storage chunks of (256, 256) float32",
            "",
            "Scheduler CPU is the scheduler process's over the run, which had imported daskstream and dask.array "
            "before (a scheduler does once, at its first graph); idle is its CPU over 5 s with nothing to run, "
            "scaled to the run's wall time (heartbeats and its own checks); busy is its CPU while a fresh client "
            "keeps every worker busy for as long with Python work of no data (daskstream's runs). Per GiB summed: "
            "the scheduler's CPU beyond idle, and beyond busy (what the graph, its tasks and its data cost it).",
            "",
            "| storage chunks | workers | contender | wall (s) | tasks | scheduler CPU (s) | idle (s) | busy (s) | "
            "beyond idle, per GiB (ms) | beyond busy, per GiB (ms) | scheduler peak | plain dask / daskstream |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in report["cluster"]:
            mine = next(
                (r for r in report["cluster"] if r["contender"] == "daskstream"
                 and r["storage_chunks"] == row["storage_chunks"] and r["workers"] == row["workers"]), None,
            )  # fmt: skip
            ratio = "—"
            if row["contender"] == "dask" and mine and "seconds" in mine:
                if "seconds" in row:
                    ratio = f"{row['seconds'] / mine['seconds']:.1f}x"
                elif row["outcome"].startswith("not finished"):
                    ratio = f"> {report['cluster_timeout'] / mine['seconds']:.0f}x"
            outcome = "" if row["outcome"] == "finished" else f" ({row['outcome']})"
            lines.append(
                f"| {row['storage_chunks']:,} | {row['workers']} | {row['contender']}{outcome} | "
                f"{_seconds(row, 'seconds')} | {_count(row, 'tasks')} | {_seconds(row, 'scheduler_cpu_s')} | "
                f"{_seconds(row, 'scheduler_idle_cpu_s')} | {_seconds(row, 'scheduler_busy_cpu_s')} | "
                f"{_per_gib_read(row, 'scheduler_idle_cpu_s')} | {_per_gib_read(row, 'scheduler_busy_cpu_s')} | "
                f"{format_bytes(row['scheduler_peak_bytes']) if row.get('scheduler_peak_bytes') else '—'} | {ratio} |"
            )
    if report.get("model"):
        m = report["model"]
        lines += [
            "",
            f"### Model: {m['workers']:,} workers x {m['threads']} threads, {m['memory_limit']} each, on 1 PiB",
            "",
            f"Per-task scheduler cost: {m['per_task_s'] * 1e3:.2f} ms (the slope of the scheduler's CPU time over "
            f"the tasks of the runs above; dask's threaded scheduler here: {m['local_per_task_s'] * 1e6:.0f} us a "
            f"task, {200_000:,} empty tasks); each thread reads {format_bytes(m['thread_bytes_per_second'])}/s. "
            "Where the plan has spans (more chunks than a graph may hold), each task streams a span of chunks: "
            "the tasks are those dask's optimizer leaves of a sum over the spans, and reading goes in waves of "
            "whole spans over the threads. Without, the graph is built with about two tasks per block (its memory "
            "below) and the scheduler runs four streaming tasks a thread and the combines above them, at the rate "
            "per block of the largest daskstream run above. Either way it spends "
            f"{m.get('per_block_s', 0) * 1e3:.2f} ms a block beyond the tasks it runs (receiving the graph, "
            "sending each task's work; the slope of daskstream's runs above, net of idle, less their tasks).",
            "",
            "| layout | chunks | chunk | chunks per task | blocks | tasks built | tasks run | graph memory "
            "| planning (s) | scheduler (s) | reading (s) | projected (s) | chunk size set by |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in m["rows"]:
            lines.append(
                f"| {r['layout']} | {tuple(r['chunks'])} | {format_bytes(r['chunk_bytes'])} | "
                f"{tuple(r['span']) if r.get('span') else 1} | {r['blocks']:,} | "
                f"{r.get('built_tasks', r['tasks']):,} | {r['tasks']:,} | {format_bytes(r['graph_bytes'])} | "
                f"{r['planning_s']:.3f} | {r['scheduler_s']:.0f} | {r['read_s']:.0f} | {r['projected_s']:.0f} | "
                f"{r['size_set_by']} |"
            )
    return "\n".join(lines)


def _keep(path: Path | None, report: dict[str, Any]) -> None:
    """``report`` as JSON at ``path`` (nothing when ``None``)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="virtual,cluster,model")
    parser.add_argument("--sizes", default="1GiB,100GiB,10TiB,1PiB")
    parser.add_argument("--layouts", default="small,era5,levels")
    parser.add_argument(
        "--expressions",
        default=",".join(EXPRESSIONS),
        help=f"of the virtual section, from "
        f"{', '.join((*EXPRESSIONS, *DASKSTREAM_ONLY, 'store', 'moving mean', 'flattened std', *LABELLED))} "
        "(median and histogram daskstream's; store: x + 1 stored to Zarr, ds.store against da.to_zarr; flattened "
        "std: x.reshape(x.shape[0], -1).std(axis=1), a std per first-axis position of its grid; moving mean: "
        "the mean of a moving mean of 5 along the first axis, ds.kernels.moving_mean against dask's map_overlap; "
        "monthly mean: v.groupby('time.month').mean() of ds.open_dataset against xarray's open_zarr, with flox, "
        "on an hourly time coordinate, era5 layout up to 4.9 million hours: about 18.7 TiB)",
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="of the virtual and cluster sections")
    parser.add_argument(
        "--held-tasks",
        type=int,
        default=0,
        help="then run daskstream's computation until this many tasks reading data finish",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a virtual run may take")
    parser.add_argument("--memory", default="16GiB", help="address space a virtual run may take")
    parser.add_argument("--runs", default="10000:2,10000:4,10000:8,50000:4,200000:4,1000000:4")
    parser.add_argument("--cluster-timeout", type=float, default=600.0)
    parser.add_argument(
        "--cluster-from", default=None, help="a JSON report whose cluster runs the model takes, instead of running them"
    )
    parser.add_argument("--folder", default=None, help="where the virtual arrays go (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    folder = Path(tempfile.mkdtemp(prefix="daskstream-bench-scale-", dir=args.folder))
    command = "python -m benchmarks.scale " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report: dict[str, Any] = {"command": command.strip(), "machine": machine_info(usable_cpus()),
                              "cluster_timeout": args.cluster_timeout}  # fmt: skip
    # The figures so far are kept after each section: a later one that fails loses only its own.
    kept = Path(args.out + ".json") if args.out else None
    try:
        if "cluster" in sections:
            runs = [tuple(int(n) for n in run.split(":")) for run in args.runs.split(",")]
            contenders = tuple(args.contenders.split(","))
            report["cluster"] = cluster(runs, args.cluster_timeout, folder, contenders)  # type: ignore[arg-type]
            _keep(kept, report)
        if "model" in sections:
            measured = report.get("cluster")
            if measured is None and args.cluster_from:
                measured = json.loads(Path(args.cluster_from).read_text())["cluster"]
            report["model"] = model(measured or [], folder)
            _keep(kept, report)
        if "virtual" in sections:
            sizes = [parse_bytes(s) for s in args.sizes.split(",")]
            report["virtual"] = virtual(
                sizes,
                args.layouts.split(","),
                args.timeout,
                parse_bytes(args.memory),
                folder,
                args.contenders.split(","),
                held=args.held_tasks,
                expressions=tuple(args.expressions.split(",")),
            )
            _keep(kept, report)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    table = markdown(report)
    print(table)
    write_results(args.out, table, report)


if __name__ == "__main__":
    main()
