"""The tuner against an exhaustive sweep, what tuning costs, and what a remembered result costs.

For each benchmark layout (``benchmarks.samples``) and workload (full sum, 3x3
stencil stored to Zarr), in one run:

* every storage-aligned, in-budget chunk shape (powers of two of the storage
  unit, from 512 KiB to 256 MiB: smaller ones are thousands of tasks, larger
  ones leave threads idle) is timed on a full run; the fastest is the sweep's best;
* ``ds.tune(..., refresh=True)`` chooses chunks on the same file with the
  default settings, and those chunks are timed on a full run too;
* the ratio tuned / best is the figure (target: at least 0.9).

First, on a larger file of the same kind (``--cost-size``, default 4 GiB), the
time ``ds.tune`` takes against one full sum with the planner's chunks (target:
at most 10%), and the time ``ds.open(..., chunks="tune")`` of the 1 GiB file
takes once that result is remembered (target: under 50 ms); the sum sweep
then also times those remembered chunks ("remembered / best").

    python -m benchmarks.tune [--size 1GiB] [--cost-size 4GiB] [--only npy,zarr-zstd]
                              [--stencil npy,hdf5-chunked,zarr-zstd] [--cost-only npy,hdf5-chunked,zarr-zstd,zarr-sharded]
                              [--repeats 2] [--out benchmarks/results/tune]

A private tuning cache is used (under ``--out``), so results remembered by
earlier runs or by the user do not count.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import dask.config
from dask.utils import format_bytes, parse_bytes

import daskstream as ds
from benchmarks.run import box3
from benchmarks.samples import LAYOUTS, ensure
from benchmarks.timing import warm_median
from daskstream.runtime.resources import resolve_resources
from daskstream.tuning.tuner import search_space

SMALLEST, LARGEST = 512 * 2**10, 256 * 2**20


def sweep_chunks(where: str) -> list[tuple[int, ...]]:
    """The exhaustive sweep: aligned power-of-two multiples of the storage unit, in budget, 512 KiB-256 MiB."""
    source = ds.open_source(where)
    space = search_space(source, resolve_resources())
    factor = float(dask.config.get("daskstream.planning.working-set-factor"))
    shapes = [space.chunks(m) for m in space.sweep(factor)]
    return [c for c in shapes if SMALLEST <= source.dtype.itemsize * math.prod(c) <= LARGEST]


def full_run(where: str, chunks: Any, workload: str, scratch: Path) -> float:
    """Seconds for the whole workload with ``chunks``."""
    x = ds.open(where, chunks=chunks)
    start = time.perf_counter()
    if workload == "sum":
        ds.reduce(x, "sum").compute()
    else:
        target = scratch / "stencil.zarr"
        ds.store(ds.map_blocks(box3, x, depth=1, boundary="nearest", dtype="f4"), str(target), overwrite=True)
    return time.perf_counter() - start


def timed(where: str, chunks: Any, workload: str, scratch: Path, repeats: int) -> float:
    return warm_median(lambda: full_run(where, chunks, workload, scratch), repeats)


def tune_for(where: str, workload: str) -> Any:
    if workload == "sum":
        return ds.tune(where, op="sum", refresh=True)
    return ds.tune(where, kernel=box3, depth=1, refresh=True)


def against_sweep(
    key: str, where: str, workload: str, scratch: Path, repeats: int, echo: Any, reused: tuple[int, ...] | None
) -> dict[str, Any]:
    nbytes = ds.open_source(where).nbytes
    sweep = {c: nbytes / timed(where, c, workload, scratch, repeats) for c in sweep_chunks(where)}
    best = max(sweep, key=sweep.get)

    def rate(chunks: tuple[int, ...]) -> float:
        return sweep.get(chunks) or nbytes / timed(where, chunks, workload, scratch, repeats)

    result = tune_for(where, workload)
    tuned = rate(result.chunks)
    row = {
        "layout": LAYOUTS[key].label,
        "workload": workload,
        "sweep": {str(c): v for c, v in sweep.items()},
        "best_chunks": list(best),
        "best_gbps": sweep[best] / 1e9,
        "tuned_chunks": list(result.chunks),
        "tuned_gbps": tuned / 1e9,
        "auto_chunks": list(ds.plan(where).chunks),
        "ratio": tuned / sweep[best],
        "candidates_measured": sum(c.throughput is not None for c in result.candidates),
        "tune_seconds": result.seconds,
        "tune_sampled": result.sampled_bytes,
        "stopped": result.stopped,
        "reused_chunks": None if reused is None else list(reused),
        "reused_ratio": None if reused is None else rate(reused) / sweep[best],
    }
    reuse = "" if reused is None else f"; remembered from the larger file {reused} = {row['reused_ratio']:.2f}"
    echo(
        f"{key} {workload}: best {best} {sweep[best] / 1e9:.2f} GB/s of {len(sweep)}; tuned {result.chunks} "
        f"{tuned / 1e9:.2f} GB/s = {row['ratio']:.2f} ({row['candidates_measured']} measured, "
        f"{result.seconds:.2f} s){reuse}"
    )
    return row


def tuning_cost(key: str, small: str, large: str, scratch: Path, repeats: int, echo: Any) -> dict[str, Any]:
    full = timed(large, "auto", "sum", scratch, repeats)
    start = time.perf_counter()
    result = ds.tune(large, op="sum", refresh=True)
    cost = time.perf_counter() - start
    nbytes = ds.open_source(large).nbytes
    tuned_full = timed(large, result.chunks, "sum", scratch, repeats)
    # A same-kind file opened with chunks="tune" now: the tuner only looks the result up.
    lookups = []
    for _ in range(5):
        start = time.perf_counter()
        x = ds.open(small, chunks="tune")
        lookups.append(time.perf_counter() - start)
    plain = []
    for _ in range(5):
        start = time.perf_counter()
        ds.open(small)
        plain.append(time.perf_counter() - start)
    row = {
        "layout": LAYOUTS[key].label,
        "size": nbytes,
        "full_run_seconds": full,
        "tune_seconds": cost,
        "cost_ratio": cost / full,
        "tuned_chunks": list(result.chunks),
        "auto_chunks": list(result.auto_chunks),
        "tuned_full_run_seconds": tuned_full,
        "candidates_measured": sum(c.throughput is not None for c in result.candidates),
        "stopped": result.stopped,
        "reused_chunks": list(x.chunksize),
        "open_tune_ms": 1e3 * statistics.median(lookups),
        "open_auto_ms": 1e3 * statistics.median(plain),
    }
    echo(
        f"{key} {format_bytes(nbytes)}: tune {cost:.2f} s = {100 * row['cost_ratio']:.1f}% of a {full:.2f} s sum "
        f"({row['candidates_measured']} measured); open(chunks='tune') of a same-kind file "
        f"{row['open_tune_ms']:.1f} ms (chunks='auto' {row['open_auto_ms']:.1f} ms)"
    )
    return row


def markdown(sweeps: list[dict[str, Any]], costs: list[dict[str, Any]], header: str) -> str:
    def ratio(value: float | None) -> str:
        return "-" if value is None else f"**{value:.2f}**"

    lines = [
        header,
        "",
        "| layout | workload | sweep best | GB/s | tuned here | GB/s | tuned / best | measured | tuning "
        "| remembered from the larger file | remembered / best |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in sweeps:
        reused = "-" if r["reused_chunks"] is None else str(tuple(r["reused_chunks"]))
        lines.append(
            f"| {r['layout']} | {r['workload']} | {tuple(r['best_chunks'])} | {r['best_gbps']:.2f} | "
            f"{tuple(r['tuned_chunks'])} | {r['tuned_gbps']:.2f} | {ratio(r['ratio'])} | "
            f"{r['candidates_measured']} | {r['tune_seconds']:.2f} s | {reused} | {ratio(r['reused_ratio'])} |"
        )
    if costs:
        lines += [
            "",
            "| layout | size | full sum | tune | tune / full run | measured | tuned chunks "
            "| open(chunks='tune'), remembered |",
            "|---|---:|---:|---:|---:|---:|---|---:|",
        ]
        for r in costs:
            lines.append(
                f"| {r['layout']} | {format_bytes(r['size'])} | {r['full_run_seconds']:.2f} s | "
                f"{r['tune_seconds']:.2f} s | **{100 * r['cost_ratio']:.1f}%** | {r['candidates_measured']} | "
                f"{tuple(r['tuned_chunks'])} | {r['open_tune_ms']:.1f} ms |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--cost-size", default="4GiB")
    parser.add_argument("--only", default=",".join(LAYOUTS), help="Layouts for the sum sweep.")
    parser.add_argument("--stencil", default="npy,hdf5-chunked,zarr-zstd", help="Layouts for the stencil sweep.")
    parser.add_argument(
        "--cost-only",
        default="npy,hdf5-chunked,zarr-zstd,zarr-sharded",
        help="Layouts for the tuning-cost run ('' for none).",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tune"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size, cost_size = int(parse_bytes(args.size)), int(parse_bytes(args.cost_size))
    scratch = Path(tempfile.mkdtemp(prefix="daskstream-tune-"))
    sweeps, costs = [], []
    try:
        with dask.config.set({"daskstream.tune.cache": str(scratch / "tune.json")}):
            reused: dict[str, tuple[int, ...]] = {}
            # First the larger files: what tuning them costs, and the chunks it remembers for their kind.
            for key in filter(None, args.cost_only.split(",")):
                small, large = ensure(key, size), ensure(key, cost_size)
                costs.append(tuning_cost(key, small, large, scratch, args.repeats, print))
                reused[key] = tuple(costs[-1]["reused_chunks"])
            for workload, keys in (("sum", args.only), ("3x3 stencil to Zarr", args.stencil)):
                for key in filter(None, keys.split(",")):
                    where = ensure(key, size)
                    remembered = reused.get(key) if workload == "sum" else None
                    sweeps.append(against_sweep(key, where, workload, scratch, args.repeats, print, remembered))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    header = (
        f"Tuner vs exhaustive sweep, {format_bytes(size)} float32 sources, warm page cache, "
        f"{resolve_resources().threads} threads; tuning cost on {format_bytes(cost_size)} "
        f"(`python -m benchmarks.tune --size {args.size} --cost-size {args.cost_size}`)"
    )
    (out / "results.md").write_text(markdown(sweeps, costs, header))
    (out / "results.json").write_text(json.dumps({"sweeps": sweeps, "costs": costs}, indent=1))
    print(markdown(sweeps, costs, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
