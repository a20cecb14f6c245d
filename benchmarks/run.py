"""The benchmark suite: daskstream against plain dask and xarray, and against the machine's limits.

For each data set (``benchmarks.samples``: the same float32 field as .npy,
HDF5 contiguous / chunked / gzip+shuffle, Zarr v3 zstd / blosc-lz4 / sharded)
and each workload (full sum, mean over axis 0, std over axis 1, ``describe``,
a 3x3 box filter written to a new Zarr store), every contender runs the
workload the way its documentation shows it, timed from opening the file to
the computed result, on dask's threaded scheduler with the same threads:

* daskstream: ``ds.open(path)`` (and ``ds.reduce``/``ds.describe``/``ds.store``);
* plain dask: ``da.from_array(np.load(p, mmap_mode="r") or h5py_dataset, chunks="auto")``, ``da.from_zarr``;
* xarray: ``xr.open_dataset(p, engine="h5netcdf", chunks="auto")``, ``xr.open_zarr(p, chunks="auto")``;
* limits: the file's bytes read sequentially (1 thread, 64 MiB reads) and
  numpy's single-threaded time for the same operation on the array in memory;
* daskstream on one thread, for the sum: how it scales with threads.

Contenders of one (data set, workload) run interleaved, A B C A B C ..., after
an untimed run each (warm cache), or with the page cache dropped before every
timed run (``--cold``, needs root). Medians are reported. Every contender's
result is checked against the others.

Run ``python -m benchmarks.run --help``; results go to ``--out`` as
``results.md``, ``results.json`` and ``results.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np

import daskstream as ds
from benchmarks import samples
from benchmarks.open_sum import machine_info
from daskstream.planning.budget import format_size, parse_budget
from daskstream.planning.grid import read_amplification

WORKLOADS = ("sum", "mean axis 0", "std axis 1", "describe", "3x3 stencil to Zarr")
DASKSTREAM, PLAIN, XARRAY, ONE_THREAD = "daskstream", "plain dask", "xarray", "daskstream on 1 thread"
SEQUENTIAL, NUMPY = "sequential read", "numpy in memory"
CONTENDERS = (DASKSTREAM, PLAIN, XARRAY, ONE_THREAD, SEQUENTIAL, NUMPY)
READ_BUFFER = 64 * 2**20


@dataclass
class Measurement:
    """Timings of one contender on one (data set, workload)."""

    dataset: str
    workload: str
    contender: str
    seconds: list[float] = field(default_factory=list)
    peak_rss: int = 0
    tasks: int | None = None
    read_amplification: float | None = None
    nbytes: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.median / 1e9


# --- what each contender runs ---------------------------------------------------------------------


def box3(block: np.ndarray) -> np.ndarray:
    """Mean over each cell's 3x3 neighbourhood (edges repeat the edge cell): the stencil workload."""
    padded = np.pad(block, 1, mode="edge")
    out = np.zeros(block.shape, dtype=np.float32)
    rows, cols = block.shape
    for dy in range(3):
        for dx in range(3):
            out += padded[dy : dy + rows, dx : dx + cols]
    out /= 9
    return out


def _plain_array(key: str, where: str) -> da.Array:
    path = where.split("::")[0]
    if key == "npy":
        return da.from_array(np.load(path, mmap_mode="r"), chunks="auto")
    if key.startswith("hdf5"):
        import h5py

        return da.from_array(h5py.File(path, "r")["field"], chunks="auto")
    return da.from_zarr(path, component="field")


def _xarray_variable(key: str, where: str) -> Any:
    import xarray as xr

    path = where.split("::")[0]
    if key.startswith("hdf5"):
        return xr.open_dataset(path, engine="h5netcdf", chunks="auto")["field"]
    return xr.open_zarr(path, chunks="auto", consolidated=False)["field"]


def _array_op(x: da.Array, workload: str, target: Path) -> Any:
    if workload == "sum":
        return x.sum(dtype="f8").compute()
    if workload == "mean axis 0":
        return x.mean(axis=0, dtype="f8").compute()
    if workload == "std axis 1":
        return x.std(axis=1, dtype="f8").compute()
    if workload == "describe":
        return dask.compute(x.mean(dtype="f8"), x.std(dtype="f8"), x.min(), x.max(), da.isnan(x).sum())
    filtered = x.map_overlap(box3, depth=1, boundary="nearest", dtype="f4")
    da.to_zarr(filtered, str(target), overwrite=True)
    return str(target)


def _daskstream_op(where: str, workload: str, target: Path) -> tuple[Any, da.Array]:
    x = ds.open(where)
    if workload == "sum":
        return x.sum(dtype="f8").compute(), x
    if workload == "mean axis 0":
        return x.mean(axis=0, dtype="f8").compute(), x
    if workload == "std axis 1":
        return ds.reduce(x, "std", axis=1).compute(), x
    if workload == "describe":
        d = ds.describe(x).compute()
        return (d["mean"], d["std"], d["min"], d["max"], d["nan_count"]), x
    ds.store(ds.map_blocks(box3, x, depth=1, boundary="nearest", dtype="f4"), str(target), overwrite=True)
    return str(target), x


def _xarray_op(key: str, where: str, workload: str) -> Any:
    v = _xarray_variable(key, where)
    if workload == "sum":
        return float(v.sum(dtype="f8").compute())
    if workload == "mean axis 0":
        return v.mean("y", dtype="f8").compute().values
    if workload == "std axis 1":
        return v.std("x", dtype="f8").compute().values
    values = dask.compute(v.mean(dtype="f8"), v.std(dtype="f8"), v.min(), v.max(), v.isnull().sum())
    return tuple(np.asarray(value) for value in values)


def _numpy_op(field_in_memory: np.ndarray, workload: str) -> Any:
    a = field_in_memory
    if workload == "sum":
        return a.sum(dtype="f8")
    if workload == "mean axis 0":
        return a.mean(axis=0, dtype="f8")
    if workload == "std axis 1":
        return a.std(axis=1, dtype="f8")
    if workload == "describe":
        return (a.mean(dtype="f8"), a.std(dtype="f8"), a.min(), a.max(), np.isnan(a).sum())
    return box3(a)


def _read_sequentially(path: Path) -> int:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    buffer = bytearray(READ_BUFFER)
    total = 0
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total


# --- timing ---------------------------------------------------------------------------------------


def drop_page_cache() -> bool:
    """Drop the page cache (root only); whether it was dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def _timed(run: Callable[[], Any], cold: bool) -> tuple[float, Any]:
    if cold:
        drop_page_cache()
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def _agree(name: str, results: dict[str, Any]) -> None:
    """Every contender's result equals the others' (float32 data: relative 1e-4)."""
    items = [(k, v) for k, v in results.items() if not isinstance(v, str)]
    for (a, va), (b, vb) in itertools.pairwise(items):
        for x, y in zip(np.atleast_1d(np.asarray(va, dtype=object)), np.atleast_1d(np.asarray(vb, dtype=object))):
            if not np.allclose(np.asarray(x, dtype="f8"), np.asarray(y, dtype="f8"), rtol=1e-4, equal_nan=True):
                raise AssertionError(f"{name}: {a} and {b} disagree")


@functools.cache
def _field_in_memory(where: str) -> np.ndarray:
    """The whole field read into memory once, for numpy's reference timings (needs the RAM)."""
    _field_in_memory.cache_clear()  # one data set held at a time
    return np.asarray(ds.open_source(where).read())


def _stencils_agree(name: str, targets: dict[str, Path], where: str) -> None:
    import zarr

    want = box3(ds.open_source(where).read((slice(0, 2050), slice(None))))[:2048]
    for contender, target in targets.items():
        got = zarr.open_array(str(target), mode="r")[:2048]
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"{name}: {contender}'s stencil differs from numpy's on the first rows")


def run_suite(
    nbytes: int, keys: list[str], workloads: list[str], repeats: int, threads: int, cold: bool, out: Path,
    chosen: set[str], echo: Callable[[str], None],
) -> list[Measurement]:  # fmt: skip
    measurements: list[Measurement] = []
    scratch = out / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    for key in keys:
        where = samples.ensure(key, nbytes, echo=echo)
        path = samples.location(key, nbytes)[0]
        in_memory = functools.partial(_field_in_memory, where)
        storage = ds.open_source(where).storage_chunks
        for workload in workloads:
            name = f"{key} / {workload}"
            targets = {c: scratch / f"{key}-{c.replace(' ', '-').replace(',', '')}.zarr" for c in (DASKSTREAM, PLAIN)}
            runs = {c: r for c, r in contenders(key, where, path, workload, targets, XARRAY in chosen).items()
                    if c in chosen}  # fmt: skip
            ours_array = ds.open(where)
            meta = {
                c: (ours_array.npartitions, _amplification(storage, ours_array.chunks))
                for c in (DASKSTREAM, ONE_THREAD)
            }
            if PLAIN in runs:
                plain_array = _plain_array(key, where)
                meta[PLAIN] = (plain_array.npartitions, _amplification(storage, plain_array.chunks))
                del plain_array
            rows = {
                c: Measurement(key, workload, c, nbytes=nbytes, tasks=meta.get(c, (None, None))[0],
                               read_amplification=meta.get(c, (None, None))[1])
                for c in runs
            }  # fmt: skip
            results: dict[str, Any] = {}
            with dask.config.set(scheduler="threads", num_workers=threads):
                if not cold:
                    for contender, run in runs.items():
                        results[contender] = run()
                for _ in range(repeats):
                    for contender, run in runs.items():
                        seconds, results[contender] = _timed(run, cold)
                        rows[contender].seconds.append(seconds)
            if workload == WORKLOADS[4]:
                _stencils_agree(name, {c: t for c, t in targets.items() if c in runs}, where)
            else:
                _agree(name, {c: r for c, r in results.items() if c != SEQUENTIAL})
            numpy_rows = []
            if NUMPY in chosen:
                numpy_rows.append(Measurement(key, workload, NUMPY, nbytes=nbytes))
                for _ in range(repeats):
                    seconds, _ = _timed(functools.partial(_numpy_op, in_memory(), workload), cold=False)
                    numpy_rows[0].seconds.append(seconds)
            for contender, row in rows.items():
                if contender in (DASKSTREAM, PLAIN, XARRAY):
                    row.peak_rss = peak_rss_alone(contender, key, nbytes, workload, threads, scratch)
            measurements += [*rows.values(), *numpy_rows]
            echo(_progress_line(name, [*rows.values(), *numpy_rows]))
    return measurements


def contenders(
    key: str, where: str, path: Path, workload: str, targets: dict[str, Path], with_xarray: bool
) -> dict[str, Callable[[], Any]]:
    """What each contender runs for ``workload`` on one data set, opening the file each time."""
    runs: dict[str, Callable[[], Any]] = {
        DASKSTREAM: lambda: _daskstream_op(where, workload, targets[DASKSTREAM])[0],
        PLAIN: lambda: _array_op(_plain_array(key, where), workload, targets[PLAIN]),
    }
    if with_xarray and key != "npy" and workload in WORKLOADS[:4]:
        runs[XARRAY] = lambda: _xarray_op(key, where, workload)
    if workload == "sum":
        runs[ONE_THREAD] = lambda: _one_thread(where)
        runs[SEQUENTIAL] = lambda: _read_sequentially(path)
    return runs


# Peak RSS from the kernel's high-water mark of the process: one contender alone in a fresh interpreter.
_RSS_CHILD = """
import sys, dask
from pathlib import Path
from benchmarks import run, samples
contender, key, nbytes, workload, threads, scratch = sys.argv[1:]
targets = {c: Path(scratch) / f"rss-{key}.zarr" for c in (run.DASKSTREAM, run.PLAIN)}
path, where = samples.location(key, int(nbytes))
with dask.config.set(scheduler="threads", num_workers=int(threads)):
    run.contenders(key, where, path, workload, targets, True)[contender]()
print(int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024)
"""


def peak_rss_alone(contender: str, key: str, nbytes: int, workload: str, threads: int, scratch: Path) -> int:
    """Peak RSS of a fresh process that imports everything and runs one contender once."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, contender, key, str(nbytes), workload, str(threads), str(scratch)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return int(done.stdout.split()[-1])


def _one_thread(where: str) -> Any:
    with dask.config.set(num_workers=1):
        return ds.open(where).sum(dtype="f8").compute()


def _amplification(storage: tuple[int, ...] | None, chunks: tuple[tuple[int, ...], ...]) -> float:
    shape = tuple(sum(c) for c in chunks)
    return read_amplification(shape, storage, tuple(tuple(c) for c in chunks))


def _progress_line(name: str, rows: list[Measurement]) -> str:
    return f"{name}: " + ", ".join(f"{r.contender} {r.median:.3f} s" for r in rows)


# --- reporting ------------------------------------------------------------------------------------


def summarize(measurements: list[Measurement]) -> list[dict[str, Any]]:
    """One row per (data set, workload): throughputs and the ratios the targets are stated in."""
    table = []
    groups: dict[tuple[str, str], dict[str, Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.dataset, m.workload), {})[m.contender] = m
    for (key, workload), by in groups.items():
        ours = by[DASKSTREAM]
        row: dict[str, Any] = {
            "dataset": key,
            "workload": workload,
            "daskstream_s": ours.median,
            "daskstream_gbps": ours.gbps,
            "tasks": ours.tasks,
            "read_amplification": ours.read_amplification,
            "peak_rss": ours.peak_rss,
        }
        for contender, label in ((PLAIN, "plain_dask"), (XARRAY, "xarray")):
            if contender in by:
                row[f"{label}_gbps"] = by[contender].gbps
                row[f"vs_{label}"] = by[contender].median / ours.median
                row[f"{label}_tasks"] = by[contender].tasks
                row[f"{label}_peak_rss"] = by[contender].peak_rss
        if NUMPY in by:
            row["of_numpy_in_memory"] = by[NUMPY].median / ours.median
        if SEQUENTIAL in by:
            row["of_sequential_read"] = by[SEQUENTIAL].median / ours.median
        if ONE_THREAD in by:
            row["vs_one_thread"] = by[ONE_THREAD].median / ours.median
        table.append(row)
    return table


def markdown(table: list[dict[str, Any]], header: str) -> str:
    def ratio(row: dict, key: str) -> str:
        return f"{row[key]:.2f}x" if key in row else "n/a"

    def percent(row: dict, key: str) -> str:
        return f"{row[key]:.0%}" if key in row else ""

    lines = [
        header,
        "",
        "| data set | workload | daskstream GB/s | x plain dask | x xarray | of numpy in memory | of sequential read "
        "| x own 1 thread | tasks (dask's) | read ampl. | peak RSS alone (dask's) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in table:
        plain_tasks = row.get("plain_dask_tasks")
        lines.append(
            f"| {samples.LAYOUTS[row['dataset']].label} | {row['workload']} | {row['daskstream_gbps']:.2f} | "
            f"**{ratio(row, 'vs_plain_dask')}** | {ratio(row, 'vs_xarray')} | {percent(row, 'of_numpy_in_memory')} | "
            f"{percent(row, 'of_sequential_read')} | {ratio(row, 'vs_one_thread') if 'vs_one_thread' in row else ''} | "
            f"{row['tasks']} ({plain_tasks if plain_tasks is not None else 'n/a'}) | {row['read_amplification']:.2f} | "
            f"{format_size(row['peak_rss'])} ({format_size(row.get('plain_dask_peak_rss', 0))}) |"
        )
    return "\n".join(lines)


def chart(table: list[dict[str, Any]], path: Path, title: str) -> bool:
    """GB/s of each contender per (data set, workload), as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{row['dataset']}\n{row['workload']}" for row in table]
    series = {
        DASKSTREAM: [row["daskstream_gbps"] for row in table],
        PLAIN: [row.get("plain_dask_gbps", 0) for row in table],
        XARRAY: [row.get("xarray_gbps", 0) for row in table],
    }
    fig, ax = plt.subplots(figsize=(max(8, len(table) * 0.7), 5))
    width = 0.27
    positions = np.arange(len(table))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(positions + (i - 1) * width, values, width, label=name)
    ax.set_xticks(positions, labels, rotation=90, fontsize=7)
    ax.set_ylabel("GB/s of float32 data (higher is better)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB", help="Size of the float32 field (default 1GiB).")
    parser.add_argument("--cold", action="store_true", help="Drop the page cache before every timed run (root).")
    parser.add_argument("--only", default=",".join(samples.LAYOUTS), help="Comma-separated data sets.")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="Comma-separated workloads.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed runs of each contender (default 3).")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="dask threads.")
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"Comma-separated, from: {', '.join(CONTENDERS)} (default all; daskstream always runs).",
    )
    parser.add_argument(
        "--memory-budget", default="2GiB", help="daskstream.memory-budget for every run (default 2GiB)."
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="Where the results go.")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.only.split(",") if k.strip()]
    chosen = {DASKSTREAM} | {c.strip() for c in args.contenders.split(",") if c.strip()}
    if chosen - set(CONTENDERS):
        parser.error(f"unknown contenders {sorted(chosen - set(CONTENDERS))}; choose from {', '.join(CONTENDERS)}")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [k for k in keys if k not in samples.LAYOUTS] + [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown {unknown}; data sets: {', '.join(samples.LAYOUTS)}; workloads: {', '.join(WORKLOADS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    cold = args.cold
    if cold and not drop_page_cache():
        echo("--cold: the page cache cannot be dropped here (needs root); measuring with a warm cache")
        cold = False
    args.out.mkdir(parents=True, exist_ok=True)
    nbytes = parse_budget(args.size, name="--size")
    # Through the environment, so the fresh interpreters measuring peak RSS plan with it too.
    os.environ["DASK_DASKSTREAM__MEMORY_BUDGET"] = str(parse_budget(args.memory_budget, name="--memory-budget"))
    dask.config.refresh()
    with warnings.catch_warnings(), contextlib.suppress(KeyboardInterrupt):
        warnings.simplefilter("ignore")  # xarray and zarr warn about chunk choices the contenders make on purpose
        measurements = run_suite(nbytes, keys, workloads, args.repeats, args.threads, cold, args.out, chosen, echo)
    machine = machine_info(args.threads)
    command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    table = summarize(measurements)
    header = (
        f"`{command.strip()}`: {format_size(nbytes)} float32, {'cold' if cold else 'warm'} page cache, "
        f"{args.threads} dask threads, median of {args.repeats}, interleaved. Machine: {machine['cpu']}, "
        f"{machine['usable_cores']} cores, {format_size(machine['ram_bytes'])} RAM; "
        + ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    )
    text = markdown(table, header)
    print(text)
    (args.out / "results.md").write_text(text + "\n")
    report = {
        "command": command,
        "cold": cold,
        "machine": machine,
        "summary": table,
        "measurements": [asdict(m) | {"median": m.median, "gbps": m.gbps} for m in measurements],
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    chart(table, args.out / "results.png", f"{format_size(nbytes)} float32, {'cold' if cold else 'warm'} cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
