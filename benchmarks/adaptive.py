"""Adaptive runs against the planner's setting and an exhaustive sweep, warm and cold.

For each workload (``--workload``: ``sum``, a full sum; ``stencil-store``, a
3x3 box stencil stored to Zarr), benchmark layout (``benchmarks.samples``,
float32, 1 GiB by default) and page-cache state (warm; cold:
``sync; echo 3 > /proc/sys/vm/drop_caches`` before every run, needs root),
whole runs are timed for:

* ``auto``: the planner's chunks on the machine's threads
  (``ds.reduce(ds.open(path), "sum").compute()``; ``ds.store(kernel, target)``);
* ``adaptive``: the same with ``adaptive=True``, nothing remembered (a private
  tuning cache, emptied before each run): what a first adaptive run costs,
  trials included;
* every setting of the sweep: tasks of 4 to 32 MiB (aligned, powers of two of
  the storage unit) on 2 or 8 threads (for the store the target's chunks
  follow the tasks', as a user choosing chunks gets); the fastest is the
  sweep's best.

Contenders alternate in rounds (A B C ..., the order rotated each round) after
one untimed run each; medians of ``--repeats``. The figures: adaptive / auto
and adaptive / best (as speeds: above 1 is faster), and the adaptive run's
own trial cost (time its trials took beyond what their rows would have taken
with its choice).

    python -m benchmarks.adaptive [--workload sum|stencil-store] [--size 1GiB] [--only npy,hdf5-chunked,zarr-zstd]
                                  [--states warm,cold] [--repeats 3] [--out benchmarks/results/adaptive]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
from dask.utils import parse_bytes

import daskstream as ds
from benchmarks.run import box3, drop_page_cache
from benchmarks.samples import LAYOUTS, ensure

SETTING_BYTES = [4 * 2**20, 8 * 2**20, 16 * 2**20, 32 * 2**20]
SETTING_THREADS = [2, 8]


def contenders(where: str, cache: Path, workload: str, scratch: Path) -> dict[str, Callable[[], Any]]:
    """Name -> a whole run of ``workload``; the adaptive one keeps its last adaptation on the function."""
    source = ds.open_source(where)
    row_bytes = source.nbytes // source.shape[0]
    unit = source.storage_chunks[0] if source.storage_chunks else 1
    runs: dict[str, Callable[[], Any]] = {}
    target = str(scratch / "stencil.zarr")

    def run(x: Any, adaptive: bool = False, **compute: Any) -> Any:
        if workload == "sum":
            if adaptive:
                summed = ds.reduce(where, "sum", adaptive=True)
                return summed.compute(), summed.adaptation
            return ds.reduce(x, "sum").compute(**compute), None
        kernel = ds.map_blocks(box3, x, depth=1, boundary="nearest", dtype="f4")
        stored = ds.store(kernel, target, overwrite=True, adaptive=adaptive)
        return None, getattr(stored, "adaptation", None)

    def auto() -> Any:
        return run(ds.open(where))[0]

    def adaptive() -> Any:
        cache.unlink(missing_ok=True)
        value, adaptive.last = run(ds.open(where), adaptive=True)  # type: ignore[attr-defined]
        return value

    runs["auto"] = auto
    runs["adaptive"] = adaptive
    for nbytes in SETTING_BYTES:
        rows = max(unit, nbytes // row_bytes // unit * unit)
        for threads in SETTING_THREADS:

            def fixed(rows: int = rows, threads: int = threads) -> Any:
                with dask.config.set(num_workers=threads, scheduler="threads"):
                    x = ds.open(where, chunks=(rows, *source.shape[1:]))
                    return run(x, scheduler="threads", num_workers=threads)[0]

            runs[f"{rows} rows x {threads} threads"] = fixed
    return runs


def time_interleaved(runs: dict[str, Callable[[], Any]], repeats: int, cold: bool) -> dict[str, list[float]]:
    names = list(runs)
    for name in names:  # untimed: code paths warm, and (warm state) the page cache
        runs[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if cold and not drop_page_cache():
                raise SystemExit("could not drop the page cache (it needs root); pass --states warm")
            start = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def measure(
    key: str, where: str, state: str, repeats: int, cache: Path, echo: Any, workload: str, scratch: Path
) -> dict[str, Any]:
    runs = contenders(where, cache, workload, scratch)
    seconds = time_interleaved(runs, repeats, cold=state == "cold")
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    sweep = {n: m for n, m in medians.items() if n not in ("auto", "adaptive")}
    best = min(sweep, key=sweep.get)
    adaptation = runs["adaptive"].last  # type: ignore[attr-defined]
    row = {
        "workload": workload,
        "layout": LAYOUTS[key].label,
        "state": state,
        "nbytes": ds.open_source(where).nbytes,
        "seconds": seconds,
        "auto_seconds": medians["auto"],
        "auto_chunks": list(ds.plan(where).chunks),
        "adaptive_seconds": medians["adaptive"],
        "best": best,
        "best_seconds": sweep[best],
        "adaptive_vs_auto": medians["auto"] / medians["adaptive"],
        "adaptive_vs_best": sweep[best] / medians["adaptive"],
        "auto_vs_best": sweep[best] / medians["auto"],
        "adaptation": adaptation.to_dict(),
    }
    chose = f"{tuple(adaptation.chunks)} x {adaptation.threads} threads" if adaptation.adapted else "as planned"
    echo(
        f"{workload} {key} {state}: auto {medians['auto']:.2f} s, adaptive {medians['adaptive']:.2f} s ({chose}), "
        f"best {best} {sweep[best]:.2f} s: adaptive/auto {row['adaptive_vs_auto']:.2f}, "
        f"adaptive/best {row['adaptive_vs_best']:.2f}, auto/best {row['auto_vs_best']:.2f}"
    )
    return row


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| workload | layout | cache | auto | adaptive | what adaptive did | trial cost | sweep best | best | "
        "adaptive / auto | adaptive / best | auto / best |",
        "|---|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        a = r["adaptation"]
        did = (
            f"chose {a['tried'][a['chosen']]['role']} {tuple(a['chunks'])} x {a['threads']}"
            if a["adapted"]
            else "ran as planned (" + a["reason"].split(":")[-1].strip() + ")"
        )
        lines.append(
            f"| {r['workload']} | {r['layout']} | {r['state']} | {r['auto_seconds']:.2f} s | {r['adaptive_seconds']:.2f} s | {did} | "
            f"{a['trial_cost_seconds']:.2f} s | {r['best']} | {r['best_seconds']:.2f} s | "
            f"**{r['adaptive_vs_auto']:.2f}** | **{r['adaptive_vs_best']:.2f}** | {r['auto_vs_best']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=["sum", "stencil-store"], default="sum")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--only", default="npy,hdf5-chunked,zarr-zstd")
    parser.add_argument("--states", default="warm,cold")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/adaptive"))
    args = parser.parse_args(argv)
    nbytes = parse_bytes(args.size)
    states = args.states.split(",")
    if "cold" in states and os.geteuid() != 0:
        parser.error("cold runs drop the page cache, which needs root; pass --states warm")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "tune.json"
        with dask.config.set({"daskstream.tune.cache": str(cache), "daskstream.tune.feedback": False}):
            for key in args.only.split(","):
                where = ensure(key, nbytes)
                for state in states:
                    rows.append(measure(key, where, state, args.repeats, cache, print, args.workload, Path(scratch)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2, default=str))
    header = (
        f"Adaptive runs ({args.workload}) against the planner and a sweep of "
        f"{len(SETTING_BYTES) * len(SETTING_THREADS)} settings, {args.size} float32, medians of {args.repeats}, "
        f"interleaved (`python -m benchmarks.adaptive --workload {args.workload} --size {args.size} --only "
        f"{args.only} --states {args.states} --repeats {args.repeats}`)"
    )
    (args.out / "results.md").write_text(markdown(rows, header))
    print(markdown(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
