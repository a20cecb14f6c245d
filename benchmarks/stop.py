"""Ctrl-C and SIGTERM: how long a running ``daskstream store`` takes to stop, on each scheduler.

A ``daskstream store`` of a random float32 field into a gzip Zarr store (slow
to encode: every task runs for a while) or an HDF5 dataset is started as a
real subprocess; as soon as its first block is written (a block marked done,
or the HDF5 file growing past 4 MiB) it is sent the signal, and the time from
the signal to the process's exit is measured, with the blocks written after
the signal (a store that went on writing shows here) and the last line it
printed. Each (scheduler, signal, target) is run ``--repeats`` times; the
median and the largest are reported.

    python -m benchmarks.stop [--size 128MiB] [--repeats 3] [--out benchmarks/results/stop]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from dask.utils import parse_bytes

from benchmarks.open_sum import machine_info
from benchmarks.timing import write_results

DONE = Path(".daskstream-store") / "done"
CASES = [
    ("threads", signal.SIGINT, "zarr"),
    ("threads", signal.SIGTERM, "zarr"),
    ("processes", signal.SIGINT, "zarr"),
    ("processes", signal.SIGTERM, "zarr"),
    ("sync", signal.SIGINT, "zarr"),
    ("distributed", signal.SIGINT, "zarr"),
    ("threads", signal.SIGINT, "hdf5"),
    ("threads", signal.SIGTERM, "hdf5"),
]


def _written(target: Path, kind: str) -> int:
    if kind == "zarr":
        folder = target / DONE
        return len(os.listdir(folder)) if folder.is_dir() else 0
    return target.stat().st_size if target.exists() else 0


def run_once(source: Path, folder: Path, scheduler: str, signum: int, kind: str) -> dict[str, Any]:
    target = folder / ("out.zarr" if kind == "zarr" else "out.h5")
    shutil.rmtree(target, ignore_errors=True)
    if target.is_file():
        target.unlink()
    name = str(target) if kind == "zarr" else f"{target}::/x"
    command = [sys.executable, "-m", "daskstream", "store", str(source), name, "--codec", "gzip"]
    command += ["--memory-budget", "16MiB", "--scheduler", scheduler, "--quiet"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = (lambda: _written(target, kind) >= 1) if kind == "zarr" else (lambda: _written(target, kind) > 4 << 20)
    while not started():
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(command)} ended before writing: {process.communicate()[1]}")
        time.sleep(0.01)
    at_signal = _written(target, kind)
    sent = time.perf_counter()
    process.send_signal(signum)
    _, stderr = process.communicate()
    seconds = time.perf_counter() - sent
    last = stderr.replace("\r", "\n").strip().splitlines()[-1] if stderr.strip() else ""
    return {
        "seconds": seconds,
        "status": process.returncode,
        "written_after": (_written(target, kind) - at_signal) if kind == "zarr" else None,
        "last_line": last,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="128MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    args = parser.parse_args()
    machine = machine_info(os.cpu_count() or 1)
    folder = Path(tempfile.mkdtemp(prefix="daskstream-bench-stop-"))
    try:
        rows = 4096
        source = folder / "field.npy"
        cols = parse_bytes(args.size) // 4 // rows
        np.save(source, np.random.default_rng(0).standard_normal((rows, cols)).astype("f4"))
        results = []
        for scheduler, signum, kind in CASES:
            runs = [run_once(source, folder, scheduler, signum, kind) for _ in range(args.repeats)]
            seconds = [r["seconds"] for r in runs]
            after = [r["written_after"] for r in runs if r["written_after"] is not None]
            results.append(
                {
                    "scheduler": scheduler,
                    "signal": signal.Signals(signum).name,
                    "target": kind,
                    "median_s": statistics.median(seconds),
                    "max_s": max(seconds),
                    "statuses": sorted({r["status"] for r in runs}),
                    "blocks_after_signal_max": max(after) if after else None,
                    "last_line": runs[-1]["last_line"],
                }
            )
            print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [
        f"`python -m benchmarks.stop --size {args.size} --repeats {args.repeats}` on {machine['cpu']} "
        f"({machine['usable_cores']} usable cores, {machine['ram_bytes'] / 2**30:.0f} GiB)",
        "",
        "| scheduler | signal | target | stop, median (s) | stop, most (s) | exit status | blocks done after the signal (most) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        most_after = "—" if r["blocks_after_signal_max"] is None else str(r["blocks_after_signal_max"])
        lines.append(
            f"| {r['scheduler']} | {r['signal']} | {r['target']} | {r['median_s']:.2f} | {r['max_s']:.2f} | "
            f"{', '.join(map(str, r['statuses']))} | {most_after} |"
        )
    lines += ["", f"Last line printed: `{results[0]['last_line']}`"]
    table = "\n".join(lines)
    results = [{"machine": machine}, *results]
    print(table)
    write_results(args.out, table, results)


if __name__ == "__main__":
    main()
