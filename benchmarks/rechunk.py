"""Rechunking rows into columns out of core: daskstream against rechunker and plain dask, time and peak memory.

The source is a Zarr format 2 array (zstd, readable by every contender) of
float32 rows chunked by whole rows, ``--factor`` times the memory budget; the
target is the same array in chunks of whole columns (each storage chunk of the
source spans every target chunk: the hardest case). Each contender runs in a
process of its own, whose peak resident memory (``VmHWM``, which starts afresh
with the process's image, unlike ``ru_maxrss``, which keeps its parent's) is
reported beside the time it took, and the same less the peak of an idle
interpreter that imported the same modules (the memory the work itself took,
which is what a budget bounds):

* **daskstream**: ``ds.store(ds.rechunk(ds.open(src, memory_budget=B), T), out)``;
* **rechunker** 0.5.4 (in an interpreter of its own, ``--rechunker-python``:
  it pins zarr < 3): ``rechunk(src, T, max_mem, out, temp).execute()`` with
  ``max_mem`` the bytes daskstream's plan lets one task hold (two fifths of a
  thread's share of the budget), on dask's threaded scheduler;
* **dask**: ``da.from_zarr(src).rechunk(T).to_zarr(out)``, which has no budget.

Every contender uses ``--threads`` threads and writes zstd level 3; the source
is warm in the page cache. Rounds alternate contenders (A B C A B C); the median
of ``--repeats`` is reported.

    python -m benchmarks.rechunk [--budget 256MiB] [--factor 8] [--repeats 2] \
        [--rechunker-python /path/to/venv/bin/python] [--out benchmarks/results/rechunk]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from dask.utils import format_bytes, parse_bytes

from benchmarks.open_sum import machine_info

_DASKSTREAM = """
import time, dask, daskstream as ds
from zarr.codecs import ZstdCodec
start = time.perf_counter()
with dask.config.set(scheduler="threads", num_workers={threads}):
    x = ds.rechunk(ds.open({src!r}, memory_budget={budget}), {target}, intermediate={scratch!r})
    ds.store(x, {out!r}, zarr_format=2, compressor=__import__("numcodecs").Zstd(level=3))
print(time.perf_counter() - start)
"""

_RECHUNKER = """
import time, dask, zarr, numcodecs
from rechunker import rechunk
start = time.perf_counter()
source = zarr.open_array({src!r}, mode="r")
plan = rechunk(source, {target}, max_mem={task_bytes}, target_store={out!r}, temp_store={scratch!r} + "/temp.zarr",
               target_options=dict(compressor=numcodecs.Zstd(level=3)))
with dask.config.set(scheduler="threads", num_workers={threads}):
    plan.execute()
print(time.perf_counter() - start)
"""

_DASK = """
import time, dask, dask.array as da, numcodecs
start = time.perf_counter()
with dask.config.set(scheduler="threads", num_workers={threads}):
    da.from_zarr({src!r}).rechunk({target}).to_zarr({out!r}, zarr_format=2, compressors=numcodecs.Zstd(level=3))
print(time.perf_counter() - start)
"""


def make_source(path: Path, shape: tuple[int, int], rows: int) -> None:
    """A Zarr v2 float32 field of ``shape`` in chunks of ``rows`` whole rows (zstd 3), written once and kept."""
    import numcodecs
    import zarr

    marker = path / ".complete"
    if marker.exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    array = zarr.create_array(path, shape=shape, chunks=(rows, shape[1]), dtype="f4", zarr_format=2,
                              compressors=numcodecs.Zstd(level=3))  # fmt: skip
    rng = np.random.default_rng(0)
    step = max(rows, 2**28 // (shape[1] * 4) // rows * rows)
    for start in range(0, shape[0], step):
        block = rng.standard_normal((min(step, shape[0] - start), shape[1]), dtype="f4")
        array[start : start + len(block)] = np.round(block * 100) / 100  # two decimals, as measured data has
    marker.touch()


_PEAK = """
import re
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024)
"""


def run_one(python: str, script: str) -> tuple[float, int]:
    """Seconds the script reports and the peak resident bytes of its process."""
    done = subprocess.run([python, "-c", script + _PEAK], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{python} failed:\n{done.stderr[-3000:]}")
    seconds, peak = done.stdout.strip().splitlines()[-2:]
    return float(seconds), int(peak)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--factor", type=int, default=8, help="the source is this many times the budget")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rechunker-python", default=None, help="an interpreter with rechunker 0.5.4 and zarr < 3")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "daskstream-bench-rechunk"))
    parser.add_argument("--out", default="benchmarks/results/rechunk")
    args = parser.parse_args(argv)

    budget = parse_bytes(args.budget)
    columns = 32768
    shape = (args.factor * budget // (4 * columns), columns)
    source_rows, target = 64, (shape[0], 256)
    src = Path(args.data) / f"rows-{shape[0]}x{shape[1]}.zarr"
    make_source(src, shape, source_rows)
    task_bytes = budget * 4 // 5 // (args.threads * 2)
    contenders = {"daskstream": (sys.executable, _DASKSTREAM), "dask rechunk + to_zarr": (sys.executable, _DASK)}
    if args.rechunker_python:
        contenders["rechunker 0.5.4"] = (args.rechunker_python, _RECHUNKER)
    # What each interpreter holds having imported its modules, before any work: the script up to its clock.
    idle = {name: run_one(python, template.split("start =")[0] + "print(0)")[1] for name, (python, template) in
            contenders.items()}  # fmt: skip
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, (python, template) in contenders.items():
            with tempfile.TemporaryDirectory(dir=args.data) as scratch:
                script = template.format(src=str(src), target=target, out=f"{scratch}/out.zarr", scratch=scratch,
                                         budget=budget, task_bytes=task_bytes, threads=args.threads)  # fmt: skip
                subprocess.run(["cat", *[str(p) for p in src.rglob("*") if p.is_file()]], stdout=subprocess.DEVNULL,
                               check=True)  # fmt: skip
                results[name].append(run_one(python, script))
                print(name, results[name][-1], flush=True)

    nbytes = shape[0] * shape[1] * 4
    rows = []
    for name, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        peak = max(p for _, p in runs)
        rows.append({"contender": name, "seconds": seconds, "GB/s": nbytes / seconds / 1e9, "peak_rss": peak,
                     "work_peak": peak - idle[name], "work_over_budget": (peak - idle[name]) / budget})  # fmt: skip
    ours = rows[0]["seconds"]
    lines = [
        f"Rechunking a {format_bytes(nbytes)} float32 Zarr v2 array ({args.factor}x the {format_bytes(budget)} budget) "
        f"from chunks ({source_rows}, {columns}) to {target}, zstd 3, {args.threads} threads, median of {args.repeats}",
        "",
        "| contender | s | GB/s | peak RSS | of which the work | work / budget | daskstream faster by |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(f"| {row['contender']} | {row['seconds']:.1f} | {row['GB/s']:.2f} | {format_bytes(row['peak_rss'])} "
                     f"| {format_bytes(row['work_peak'])} | {row['work_over_budget']:.2f} | "
                     f"{row['seconds'] / ours:.2f}x |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps({"machine": machine_info(args.threads), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
