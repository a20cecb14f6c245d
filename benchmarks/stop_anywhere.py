"""Signals where the main thread never waits, and budgets too small to plan: how fast the command answers.

Three measurements, each a real ``daskstream`` subprocess, on a quiet machine and beside two busy
processes (one per core of a 2-core machine: "under load"):

* **building** -- ``daskstream reduce`` of a 40 GB ``.npy`` whose data was never written (a sparse file)
  with a budget that cuts it
  into about half as many blocks as ``daskstream.planning.max-tasks`` allows: dask then builds the
  reduction's graph in pure Python for many seconds. SIGINT or SIGTERM is sent ``--after`` seconds after
  the start; the time from the signal to the exit is reported, with the exit status.
* **absurd budget** -- the same command with ``--memory-budget 1000``: refused from the block count. Its
  whole run (start to exit) and peak memory are reported, beside ``daskstream --help``'s (the start alone).

    python -m benchmarks.stop_anywhere [--repeats 3] [--after 2.5] [--out benchmarks/results/stop_anywhere]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.open_sum import machine_info
from benchmarks.timing import write_results

SHAPE = (100_000, 100_000)


def _busy() -> None:
    while True:
        pass


@contextlib.contextmanager
def loaded(on: bool) -> Iterator[None]:
    """Two processes spinning on the CPU within the block, when ``on``."""
    workers = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(2 if on else 0)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.kill()
            worker.join()


# The command as its console script runs it, writing its own peak resident size (VmHWM) as it exits: the
# rusage of a child counts what it shared with its parent before exec too.
PEAK_REPORTED = textwrap.dedent(
    """
    import atexit, runpy, sys
    peak_file = sys.argv.pop(1)

    def report():
        with open("/proc/self/status") as status, open(peak_file, "w") as out:
            out.write(next(line for line in status if line.startswith("VmHWM")))

    atexit.register(report)
    sys.argv[0] = "daskstream"
    runpy.run_module("daskstream", run_name="__main__")
    """
)


def _run(arguments: list[str], signum: int | None, after: float, peak_file: Path) -> dict[str, Any]:
    peak_file.unlink(missing_ok=True)
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", PEAK_REPORTED, str(peak_file), *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    sent = None
    if signum is not None:
        time.sleep(after)
        sent = time.perf_counter()
        process.send_signal(signum)
    _, stderr = process.communicate()
    ended = time.perf_counter()
    # A process ended by its signal handler's os._exit writes no peak (none is left for a stop outside work).
    peak = int(peak_file.read_text().split()[1]) / 1024 if peak_file.exists() else float("nan")
    return {
        "seconds": ended - (sent if sent is not None else started),
        "status": process.returncode,
        "peak_mib": peak,
        "last_line": stderr.strip().splitlines()[-1] if stderr.strip() else "",
    }


def building_budget(path: Path) -> str:
    """A budget whose plan of ``path`` has about half the blocks a graph may hold: seconds of graph building."""
    code = textwrap.dedent(
        f"""
        import math, daskstream as ds
        from daskstream.errors import DaskstreamError
        from daskstream.runtime.resources import resolve_settings
        ceiling, budget = resolve_settings().max_tasks, 1 << 12
        while True:
            try:
                if math.prod(ds.open({str(path)!r}, memory_budget=budget).numblocks) <= ceiling // 2:
                    break
            except DaskstreamError:
                pass
            budget *= 2
        print(budget)
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--after", type=float, default=2.5, help="seconds from the start to the signal")
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    args = parser.parse_args()
    machine = machine_info(os.cpu_count() or 1)
    folder = Path(tempfile.mkdtemp(prefix="daskstream-bench-stop-anywhere-"))
    results = []
    try:
        path = folder / "big.npy"
        header_only = np.lib.format.open_memmap(path, mode="w+", dtype="f4", shape=SHAPE)
        del header_only
        budget = building_budget(path)
        cases: list[tuple[str, list[str], int | None]] = [
            ("building, SIGINT", ["reduce", str(path), "--op", "mean", "--memory-budget", budget], signal.SIGINT),
            ("building, SIGTERM", ["reduce", str(path), "--op", "mean", "--memory-budget", budget], signal.SIGTERM),
            ("absurd budget (1000 B)", ["reduce", str(path), "--op", "mean", "--memory-budget", "1000"], None),
            ("start alone (--help)", ["--help"], None),
        ]
        for load in (False, True):
            for name, arguments, signum in cases:
                with loaded(load):
                    runs = [_run(arguments, signum, args.after, folder / "peak") for _ in range(args.repeats)]
                seconds = [r["seconds"] for r in runs]
                results.append(
                    {
                        "case": name,
                        "load": "2 busy processes" if load else "quiet",
                        "median_s": statistics.median(seconds),
                        "max_s": max(seconds),
                        "statuses": sorted({r["status"] for r in runs}),
                        "peak_mib_max": max(r["peak_mib"] for r in runs),
                        "last_line": runs[-1]["last_line"],
                    }
                )
                print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [
        f"`python -m benchmarks.stop_anywhere --repeats {args.repeats} --after {args.after}` on {machine['cpu']} "
        f"({machine['usable_cores']} usable cores, {machine['ram_bytes'] / 2**30:.0f} GiB); a {SHAPE} float32 "
        f"sparse .npy, building budget {budget} B",
        "",
        "| case | load | seconds, median | seconds, most | exit status | peak memory, most (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['load']} | {r['median_s']:.2f} | {r['max_s']:.2f} | "
            f"{', '.join(map(str, r['statuses']))} | {r['peak_mib_max']:.0f} |"
        )
    lines += ["", "Seconds: from the signal to the exit where one is sent, else the whole run.", ""]
    lines += [f"Last lines: `{r['last_line']}`" for r in results[:3]]
    table = "\n".join(lines)
    write_results(args.out, table, [{"machine": machine}, *results])
    print(table)


if __name__ == "__main__":
    main()
