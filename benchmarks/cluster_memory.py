"""Reductions on a LocalCluster whose workers may use 1 GiB, over a source four times that.

The planner's budget must follow the cluster's limits: inside a session on the
cluster, ``ds.open`` plans chunks for the workers' memory limit, and the
workers must never reach distributed's spill, pause or restart thresholds.

While each reduction runs, a monitor thread samples every worker process's
resident memory (psutil, every 20 ms: what distributed's own memory monitor
reads), and the scheduler's view of each worker (status, spilled bytes). The
report says, per workload, the peak RSS of any worker against the thresholds,
whether a worker was ever paused, how many bytes were spilled, and whether
any worker process was replaced.

Run ``python -m benchmarks.cluster_memory --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import numpy as np
import psutil

import daskstream as ds
from benchmarks.open_sum import DATA_DIR, ensure_dataset, machine_info
from daskstream.planning.budget import format_size, parse_budget
from daskstream.runtime.metering import ReadMeter


@dataclass
class Observed:
    """What the monitor saw during one workload."""

    peak_rss: int = 0
    statuses: set[str] = field(default_factory=set)
    spilled_bytes: int = 0
    samples: int = 0


class Monitor(threading.Thread):
    """Samples worker RSS (psutil) and the scheduler's worker table until stopped."""

    def __init__(self, client: Any, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.processes = [psutil.Process(pid) for pid in pids]
        self.observed = Observed()
        self._halt = threading.Event()

    def run(self) -> None:
        last_scheduler_look = 0.0
        while not self._halt.is_set():
            for process in self.processes:
                try:
                    self.observed.peak_rss = max(self.observed.peak_rss, process.memory_info().rss)
                except psutil.NoSuchProcess:
                    self.observed.statuses.add("gone")
            self.observed.samples += 1
            now = time.monotonic()
            if now - last_scheduler_look > 0.2:
                last_scheduler_look = now
                for worker in self.client.scheduler_info(n_workers=-1)["workers"].values():
                    self.observed.statuses.add(str(worker.get("status", "running")))
                    spilled = worker.get("metrics", {}).get("spilled_bytes", {})
                    self.observed.spilled_bytes = max(self.observed.spilled_bytes, int(spilled.get("disk", 0)))
            self._halt.wait(0.02)

    def stop(self) -> Observed:
        self._halt.set()
        self.join()
        # A pause shorter than the scheduler's heartbeat is only in the worker's log.
        if self.pauses_logged() > self._pauses_before:
            self.observed.statuses.add("paused")
        return self.observed

    def start(self) -> None:
        self._pauses_before = self.pauses_logged()
        super().start()

    def pauses_logged(self) -> int:
        logs = self.client.get_worker_logs()
        return sum("Pausing worker" in message for lines in logs.values() for _, message in lines)


def workloads(x: Any) -> dict[str, Any]:
    return {
        "sum": lambda: ds.reduce(x, "sum", dtype="f8"),
        "mean over axis 0": lambda: ds.reduce(x, "mean", axis=0),
        "std over axis 1": lambda: ds.reduce(x, "std", axis=1),
        "describe": lambda: ds.describe(x),
        "exact median": lambda: ds.reduce(x, "median"),
    }


def run(size: int, formats: list[str], workers: int, memory_limit: int, data_dir: Path) -> dict[str, Any]:
    from distributed import LocalCluster

    locations = {fmt: ensure_dataset(fmt, size, data_dir, lambda line: print(line, file=sys.stderr)) for fmt in formats}
    thresholds = {
        name: dask.config.get(f"distributed.worker.memory.{name}") for name in ("target", "spill", "pause", "terminate")
    }
    rows = []
    with LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        memory_limit=memory_limit,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        processes=True,
    ) as cluster, ds.session(cluster.scheduler_address, progress=False) as session:  # fmt: skip
        client = session.client
        pids = sorted(client.run(lambda: __import__("os").getpid()).values())
        for fmt, location in locations.items():
            x = ds.open(location)
            for name, build in workloads(x).items():
                monitor = Monitor(client, pids)
                monitor.start()
                start = time.perf_counter()
                try:
                    with ReadMeter(session) as meter:
                        session.compute(build())
                finally:
                    seconds = time.perf_counter() - start
                    observed = monitor.stop()
                now_pids = sorted(client.run(lambda: __import__("os").getpid()).values())
                rows.append(
                    {
                        "format": fmt,
                        "workload": name,
                        "seconds": seconds,
                        "chunk_bytes": int(np.prod(x.chunksize)) * x.dtype.itemsize,
                        "n_tasks": x.npartitions,
                        "bytes_read": meter.bytes_read,
                        "peak_worker_rss": observed.peak_rss,
                        "peak_fraction_of_limit": observed.peak_rss / memory_limit,
                        "paused": "paused" in observed.statuses,
                        "spilled_bytes": observed.spilled_bytes,
                        "workers_replaced": now_pids != pids or "gone" in observed.statuses,
                    }
                )
                print(_row_line(rows[-1]), file=sys.stderr)
    return {"thresholds": thresholds, "memory_limit": memory_limit, "workers": workers, "size": size, "rows": rows}


def _row_line(row: dict[str, Any]) -> str:
    return (
        f"{row['format']:<5} {row['workload']:<17} {row['seconds']:7.2f} s  peak worker RSS "
        f"{format_size(row['peak_worker_rss'])} ({row['peak_fraction_of_limit']:.0%} of limit)  "
        f"paused={row['paused']} spilled={format_size(row['spilled_bytes'])} replaced={row['workers_replaced']}"
    )


def markdown(report: dict[str, Any]) -> str:
    limit = report["memory_limit"]
    marks = ", ".join(f"{name} {fraction:.0%}" for name, fraction in report["thresholds"].items() if fraction)
    lines = [
        f"LocalCluster: {report['workers']} workers x 1 thread, memory limit {format_size(limit)} each "
        f"(distributed's thresholds: {marks}); source {format_size(report['size'])} float32.",
        "",
        "| source | workload | seconds | chunk | tasks | read | peak worker RSS | of limit | paused | spilled | "
        "workers replaced |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for row in report["rows"]:
        read = "?" if row["bytes_read"] is None else format_size(row["bytes_read"])
        lines.append(
            f"| {row['format']} | {row['workload']} | {row['seconds']:.2f} | {format_size(row['chunk_bytes'])} | "
            f"{row['n_tasks']} | {read} | {format_size(row['peak_worker_rss'])} | "
            f"{row['peak_fraction_of_limit']:.0%} | {'yes' if row['paused'] else 'no'} | "
            f"{format_size(row['spilled_bytes'])} | {'yes' if row['workers_replaced'] else 'no'} |"
        )
    spill = report["thresholds"]["spill"]
    ok = all(
        not r["paused"] and not r["spilled_bytes"] and not r["workers_replaced"] and r["peak_fraction_of_limit"] < spill
        for r in report["rows"]
    )
    lines += ["", f"No worker paused, spilled or replaced, and every peak below the spill threshold: **{ok}**"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4GiB", help="Size of the float32 source (default 4GiB).")
    parser.add_argument("--memory-limit", default="1GiB", help="Each worker's memory limit (default 1GiB).")
    parser.add_argument("--workers", type=int, default=2, help="Worker processes of one thread (default 2).")
    parser.add_argument("--formats", default="npy,zarr", help="Comma-separated: npy, hdf5, zarr (default npy,zarr).")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    args = parser.parse_args(argv)
    report = run(
        parse_budget(args.size),
        [f.strip() for f in args.formats.split(",") if f.strip()],
        args.workers,
        parse_budget(args.memory_limit, name="--memory-limit"),
        args.data_dir,
    )
    report["machine"] = machine_info(args.workers)
    report["command"] = "python -m benchmarks.cluster_memory " + " ".join(argv if argv is not None else sys.argv[1:])
    print(markdown(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
