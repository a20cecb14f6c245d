"""Whole analyses over a source sixteen times the memory budget: daskstream, plain dask and cubed, side by side.

Each composition is written the way its library's users write it, with the
same arithmetic for every contender:

* **daskstream**: ``x = ds.open(path, memory_budget=B)``, then dask's own operators
  (``x - x.mean()``...), ``ds.map_blocks`` for stencils, ``.compute()`` or ``ds.store``;
* **dask**: the same code on ``da.from_zarr(store, component)`` (and
  ``da.from_array(np.load(path, mmap_mode="r"), chunks="auto")`` for the ``.npy``);
* **cubed**: the same operations through ``cubed.array_api`` on
  ``cubed.from_zarr(..., spec=cubed.Spec(allowed_mem=B, executor_name="threads"))``.

Every run is a fresh interpreter on dask's (or cubed's) threaded executor. It
first runs the composition on a tiny array, so imports and pools are in its
baseline, then on the real source: the figures are its resident high-water mark
over that baseline (VmHWM, file pages included), wall time, and the stored bytes
it read (``rchar`` of ``/proc/self/io``) over the sources' stored size, i.e.
passes over the data (cubed also reads back the intermediate arrays it writes).
A watchdog kills any run whose resident memory passes ``--limit`` (default
2 GiB): a contender that cannot keep the budget fails instead of swapping the
machine. "of target" is the composition's rate against daskstream's own sum of
the same source divided by the passes the composition needs (target: 80%).

    python -m benchmarks.compositions [--size 1GiB] [--budget 64MiB] [--limit 2GiB]
                                      [--only centering,stencil-reduced] [--contenders daskstream,dask,cubed]
                                      [--out benchmarks/results/compositions]

cubed is an extra: ``pip install cubed`` (or ``pip install '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from dask.utils import format_bytes, parse_bytes

from benchmarks.open_sum import machine_info
from benchmarks.samples import ensure, location

CONTENDERS = ("daskstream", "dask", "cubed")

# name: (what it is, passes over the data it needs, contenders that can write it with the same code)
COMPOSITIONS = {
    "sum": ("x.sum(), the single-pass reference", 1, CONTENDERS),
    "centering": ("std(x - mean(x))", 2, CONTENDERS),
    "anomaly-axis-0": ("max(std(x - mean(x, axis=0), axis=0))", 2, CONTENDERS),
    "standardized-stored": ("(x - mean(x, axis=0)) / std(x, axis=0), stored to Zarr", 2, CONTENDERS),
    "divided-by-max": ("sum(x / max(x))", 2, CONTENDERS),
    "stencil-reduced": ("max(laplacian(x)), a 5-point stencil, zeros beyond the edges", 1, CONTENDERS),
    "two-stencils": ("max(laplacian(laplacian(x)))", 1, CONTENDERS),
    "two-sources": ("std((x - y) / mean(x + y)), x Zarr and y .npy of other chunks", 2, CONTENDERS),
    "above-the-quantile": ("sum(where(x > quantile(x, 0.99), x, 0)), the quantile exact", 3, ("daskstream",)),
}


def laplacian(block: np.ndarray) -> np.ndarray:
    out = -4 * block
    out[1:-1] += block[:-2] + block[2:]
    out[:, 1:-1] += block[:, :-2] + block[:, 2:]
    return out


def trimmed_laplacian(block: np.ndarray) -> np.ndarray:
    """cubed's map_overlap does not trim: the kernel returns its block without the halo."""
    return laplacian(block)[1:-1, 1:-1]


# ---------------------------------------------------------------------------
# One run, in a child interpreter


def _open(contender: str, zarr_path: str, npy_path: str | None, budget: int, work_dir: str) -> tuple[Any, Any, Any]:
    """``x`` (Zarr), ``y`` (.npy, when asked for) and the namespace of array functions, as users open them."""
    store, _, member = zarr_path.partition("::")
    if contender == "daskstream":
        import dask.array as da

        import daskstream as ds

        y = None if npy_path is None else ds.open(npy_path, memory_budget=budget)
        return ds.open(zarr_path, memory_budget=budget), y, da
    if contender == "dask":
        import dask.array as da

        # Plain dask names an array from_array wraps by hashing its values: the whole memory-mapped file.
        y = None if npy_path is None else da.from_array(np.load(npy_path, mmap_mode="r"), chunks="auto")
        return da.from_zarr(store, component=member or None), y, da
    import cubed
    import cubed.array_api as xp

    spec = cubed.Spec(work_dir, allowed_mem=budget, executor_name="threads")
    x = cubed.from_zarr(store, path=member or None, spec=spec)
    y = None if npy_path is None else cubed.from_array(np.load(npy_path, mmap_mode="r"), chunks=x.chunksize, spec=spec)
    return x, y, xp


def _stencil(contender: str, x: Any) -> Any:
    if contender == "daskstream":
        import daskstream as ds

        return ds.map_blocks(laplacian, x, depth=1, boundary=0)
    if contender == "dask":
        return x.map_overlap(laplacian, depth=1, boundary=0)
    import cubed

    return cubed.map_overlap(trimmed_laplacian, x, dtype=x.dtype, chunks=x.chunks, depth=1, boundary=0)


def _run(contender: str, name: str, x: Any, y: Any, xp: Any, out: str) -> float:
    """Compute composition ``name``; its result as a number (the first value of a stored array)."""
    if name == "sum":
        result = xp.sum(x)
    elif name == "centering":
        result = xp.std(x - xp.mean(x))
    elif name == "anomaly-axis-0":
        result = xp.max(xp.std(x - xp.mean(x, axis=0), axis=0))
    elif name == "divided-by-max":
        result = xp.sum(x / xp.max(x))
    elif name == "stencil-reduced":
        result = xp.max(_stencil(contender, x))
    elif name == "two-stencils":
        result = xp.max(_stencil(contender, _stencil(contender, x)))
    elif name == "two-sources":
        result = xp.std((x - y) / xp.mean(x + y))
    elif name == "above-the-quantile":
        import daskstream as ds

        result = xp.sum(xp.where(x > ds.reduce(x, "quantile", q=0.99), x, 0))
    elif name == "standardized-stored":
        z = (x - xp.mean(x, axis=0)) / xp.std(x, axis=0)
        shutil.rmtree(out, ignore_errors=True)
        if contender == "daskstream":
            import daskstream as ds

            return float(ds.store(z, out)[0, 0].compute())
        if contender == "dask":
            z.to_zarr(out)
        else:
            import cubed

            cubed.to_zarr(z, out)
        import zarr

        return float(zarr.open_array(out, mode="r")[0, 0])
    else:
        raise SystemExit(f"unknown composition {name}")
    return float(np.asarray(result.compute()))


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def child(args: argparse.Namespace) -> None:
    import dask

    with dask.config.set(scheduler="threads"), tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        second = args.composition == "two-sources"
        tiny = _open(args.contender, args.tiny_zarr, args.tiny_npy if second else None, args.budget, work)
        _run(args.contender, args.composition, *tiny, f"{work}/tiny-out.zarr")
        baseline, read = _vm_hwm(), _rchar()
        x, y, xp = _open(args.contender, args.zarr, args.npy if second else None, args.budget, work)
        started = time.perf_counter()
        value = _run(args.contender, args.composition, x, y, xp, f"{work}/out.zarr")
        seconds = time.perf_counter() - started
        report = {"seconds": seconds, "held": _vm_hwm() - baseline, "read": _rchar() - read, "result": value}
        if args.contender == "daskstream":
            report["passes_planned"] = _planned_passes(args, x, y, xp, work)
    print(json.dumps(report))


def _planned_passes(args: argparse.Namespace, x: Any, y: Any, xp: Any, work: str) -> int | None:
    """What ``ds.plan_compute`` says of the composition (stores excepted: they are not one collection)."""
    import daskstream as ds

    if args.composition == "standardized-stored":
        return ds.plan_compute((x - xp.mean(x, axis=0)) / xp.std(x, axis=0)).passes
    lazy = {
        "sum": lambda: x.sum(),
        "centering": lambda: (x - x.mean()).std(),
        "anomaly-axis-0": lambda: (x - x.mean(axis=0)).std(axis=0).max(),
        "divided-by-max": lambda: (x / x.max()).sum(),
        "stencil-reduced": lambda: _stencil("daskstream", x).max(),
        "two-stencils": lambda: _stencil("daskstream", _stencil("daskstream", x)).max(),
        "two-sources": lambda: ((x - y) / (x + y).mean()).std(),
        "above-the-quantile": lambda: xp.where(x > ds.reduce(x, "quantile", q=0.99), x, 0).sum(),
    }[args.composition]
    return ds.plan_compute(lazy()).passes


# ---------------------------------------------------------------------------
# The parent: data, fresh interpreters under a watchdog, the table


def _measure(argv: list[str], limit: int) -> dict[str, Any]:
    """Run a child; kill it when its resident memory passes ``limit``."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = threading.Event()
    peak = {"rss": 0}

    def watch() -> None:
        try:
            process = psutil.Process(proc.pid)
            while proc.poll() is None:
                rss = sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
                peak["rss"] = max(peak["rss"], rss)
                if rss > limit:
                    killed.set()
                    proc.kill()
                    return
                time.sleep(0.02)
        except psutil.Error:
            return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    if killed.is_set():
        return {"failed": f"killed at {format_bytes(peak['rss'])} resident (limit {format_bytes(limit)})",
                "seconds": time.perf_counter() - started}  # fmt: skip
    if proc.returncode != 0:
        return {"failed": (err.strip().splitlines() or [f"exited with status {proc.returncode}"])[-1][:160]}
    return json.loads(out.strip().splitlines()[-1])


def _stored_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB", help="Bytes of each source.")
    parser.add_argument("--budget", default="64MiB", help="The memory budget every contender gets.")
    parser.add_argument("--limit", default="2GiB", help="Resident memory at which a run is killed.")
    parser.add_argument("--only", default=",".join(COMPOSITIONS), help="Compositions to run.")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--out", default="benchmarks/results/compositions", help="Folder for the results.")
    parser.add_argument("--work-dir", default=None, help="Scratch folder (cubed's intermediate arrays).")
    parser.add_argument("--child", nargs=2, metavar=("CONTENDER", "COMPOSITION"), help=argparse.SUPPRESS)
    parser.add_argument("--sources", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budget, limit, size = parse_bytes(args.budget), parse_bytes(args.limit), parse_bytes(args.size)
    if args.child:
        args.contender, args.composition = args.child
        args.zarr, args.npy, args.tiny_zarr, args.tiny_npy = args.sources
        args.budget = budget
        child(args)
        return

    zarr_source = ensure("zarr-zstd", size)
    npy_source = ensure("npy", size)
    tiny_zarr = ensure("zarr-zstd", 2**20)
    tiny_npy = ensure("npy", 2**20)
    stored = _stored_bytes(location("zarr-zstd", size)[0])
    stored_npy = _stored_bytes(location("npy", size)[0])
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="daskstream-compositions-")
    contenders = [c for c in args.contenders.split(",") if c]
    rows: list[dict[str, Any]] = []
    for name in [n for n in args.only.split(",") if n]:
        what, passes, able = COMPOSITIONS[name]
        for contender in contenders:
            if contender not in able:
                rows.append({"composition": name, "contender": contender, "failed": "n/a: no same code"})
                continue
            command = [sys.executable, "-m", "benchmarks.compositions", "--budget", args.budget,
                       "--work-dir", work_dir, "--child", contender, name,
                       "--sources", zarr_source, npy_source, tiny_zarr, tiny_npy]  # fmt: skip
            measured = _measure(command, limit)
            sources = size * (2 if name == "two-sources" else 1)
            stored_sources = stored + (stored_npy if name == "two-sources" else 0)
            row = {"composition": name, "what": what, "contender": contender, "passes_needed": passes, **measured}
            if "failed" not in measured:
                row["gb_per_s"] = sources / measured["seconds"] / 1e9
                row["held_over_budget"] = measured["held"] / budget
                row["passes_read"] = measured["read"] / stored_sources
            rows.append(row)
            print(_row_text(row), file=sys.stderr, flush=True)
    reference = next(
        (r for r in rows if r["composition"] == "sum" and r["contender"] == "daskstream" and "gb_per_s" in r), None
    )
    for row in rows:
        if reference is not None and "gb_per_s" in row and row["contender"] == "daskstream":
            row["of_target"] = row["gb_per_s"] / (reference["gb_per_s"] / row["passes_needed"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {**machine_info(psutil.cpu_count() or 1), "size": size, "budget": budget, "limit": limit,
            "command": "python -m benchmarks.compositions " + " ".join(argv or sys.argv[1:])}  # fmt: skip
    (out / "results.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=2, default=str))
    table = markdown(rows, info)
    (out / "results.md").write_text(table)
    print(table)
    if args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)


def _row_text(row: dict[str, Any]) -> str:
    if "failed" in row:
        return f"{row['composition']:<22} {row['contender']:<11} {row['failed']}"
    return (
        f"{row['composition']:<22} {row['contender']:<11} {row['held'] / 2**20:7.0f} MiB held "
        f"({row['held_over_budget']:.2f}x budget), {row['passes_read']:.2f} passes read, {row['gb_per_s']:.2f} GB/s"
    )


def markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """The README's table: per composition, each contender's peak over the budget, passes and rate."""
    lines = [
        f"Source {format_bytes(info['size'])} float32 (Zarr v3 zstd; .npy for the second source), budget "
        f"{format_bytes(info['budget'])} ({info['size'] / info['budget']:.0f}x smaller), runs killed past "
        f"{format_bytes(info['limit'])} resident. {info['cpu']}, {info['usable_cores']} cores. `{info['command']}`",
        "",
        "| composition | passes needed | contender | peak / budget | passes read | GB/s | of target | result |",
        "|---|--:|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['composition']} | {row.get('passes_needed', '')} | {row['contender']} | "
                         f"{row['failed']} | | | | |")  # fmt: skip
            continue
        target = f"{row['of_target']:.0%}" if "of_target" in row else ""
        lines.append(
            f"| {row['composition']} | {row['passes_needed']} | {row['contender']} | "
            f"{row['held_over_budget']:.2f}x | {row['passes_read']:.2f} | {row['gb_per_s']:.2f} | {target} | "
            f"{row['result']:.6g} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
