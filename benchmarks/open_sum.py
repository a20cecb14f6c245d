"""Open and sum a sample field: daskstream against plain dask, side by side in one run.

Each timing covers what a user types, from opening the file to the computed
sum, on dask's threaded scheduler with the same number of threads for every
contender, on a warm page cache. Contenders of one format run interleaved
(A B A B ...), so drift in the machine's state hits all of them alike.

Run ``python -m benchmarks.open_sum --help`` for the options; ``README.md``
next to this file says what is measured and which requirement it checks.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np

import daskstream as ds
from daskstream.demo import FORMATS, sample_shape, sample_slabs, write_sample
from daskstream.errors import DaskstreamError
from daskstream.planning.budget import format_size, parse_budget

DATA_DIR = Path(__file__).resolve().parent / "data"
REQUIRED_NPY_SPEEDUP = 6.0
SUM_RTOL = 1e-5
READ_BUFFER_BYTES = 64 * 2**20
HDF5_DATASET = "/field"
SUFFIXES = {"npy": ".npy", "hdf5": ".h5", "zarr": ".zarr"}

OPEN_AND_SUM = "open + sum"
SUM_ONLY = "sum only"
REFERENCE = "reference"


class SumMismatchError(RuntimeError):
    """Two contenders computed different sums of the same data."""


@dataclass(frozen=True)
class Contender:
    """One way of getting the sum, as the table describes it; :data:`Run` is its code.

    Attributes
    ----------
    name
        The code being timed, as shown in the table.
    library
        ``"daskstream"``, ``"dask"`` or ``"reference"``.
    scope
        What the timer covers: ``"open + sum"`` (open, graph build and
        compute), ``"sum only"`` (the array was built before the timer) or
        ``"reference"`` (a physical bound, not a contender).
    nbytes
        Bytes one run processes, for GB/s.
    tasks
        Chunks of the dask array, where there is one.
    """

    name: str
    library: str
    scope: str
    nbytes: int
    tasks: int | None = None


# A contender's code: does the work once with the given accumulator dtype (None: the default,
# as timed) and returns the sum, or None when it computes none.
Run = Callable[[Any], Any]


@dataclass
class Timing:
    """The timed runs of one contender."""

    contender: Contender
    seconds: list[float] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)
    float64_sum: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def gbps(self) -> float:
        return self.contender.nbytes / self.median / 1e9

    def as_dict(self, speedup: float | None) -> dict[str, Any]:
        c = self.contender
        return {
            "name": c.name,
            "library": c.library,
            "scope": c.scope,
            "tasks": c.tasks,
            "nbytes": c.nbytes,
            "seconds": self.seconds,
            "median_s": self.median,
            "min_s": min(self.seconds),
            "max_s": max(self.seconds),
            "gbps": self.gbps,
            "speedup_vs_dask": speedup,
            "sums": self.sums,
            "float64_accumulator_sum": self.float64_sum,
        }


# -- data --------------------------------------------------------------------------------------------------------


def dataset_location(fmt: str, nbytes: int, data_dir: Path) -> tuple[Path, str]:
    """The file or store holding the ``fmt`` sample of ``nbytes``, and the location to open.

    Examples
    --------
    >>> dataset_location("hdf5", 1024, Path("/d"))
    (PosixPath('/d/field-1024.h5'), '/d/field-1024.h5::/field')
    """
    target = data_dir / f"field-{nbytes}{SUFFIXES[fmt]}"
    return target, f"{target}::{HDF5_DATASET}" if fmt == "hdf5" else str(target)


def ensure_dataset(fmt: str, nbytes: int, data_dir: Path, echo: Callable[[str], None]) -> str:
    """Write the sample field as ``fmt`` unless a complete copy of the right size is there; return its location.

    The sample is written under a temporary name and renamed when complete, so
    an interrupted run never leaves a file that looks finished.
    """
    target, location = dataset_location(fmt, nbytes, data_dir)
    if target.exists():
        if _holds_sample(location, nbytes):
            echo(f"{fmt}: reusing {target}")
            return location
        echo(f"{fmt}: {target} does not hold the {format_size(nbytes)} sample; writing it again")
        _remove(target)
    partial = target.with_name(f"{target.stem}.partial{target.suffix}")
    _remove(partial)
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    write_sample(str(partial), fmt, nbytes)
    os.replace(partial, target)
    echo(f"{fmt}: wrote {target} in {time.perf_counter() - t0:.1f} s")
    if not _holds_sample(location, nbytes):
        raise RuntimeError(f"{location} does not read back as the sample just written; delete it and run again")
    return location


def _holds_sample(location: str, nbytes: int) -> bool:
    try:
        source = ds.open_source(location)
    except DaskstreamError:
        return False
    return source.shape == sample_shape(nbytes) and source.dtype == np.float32


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


@dataclass(frozen=True)
class SampleSums:
    """The sample field's sums in float64, from its generator: an oracle independent of every reader.

    Attributes
    ----------
    total
        The sum.
    total_abs
        The sum of absolute values, which bounds rounding in any order of summation.
    count
        Items summed.
    """

    total: float
    total_abs: float
    count: int

    @property
    def float32_tolerance(self) -> float:
        """Absolute error a float32 accumulator may make over the field, summed pairwise or chunk by chunk.

        Rounding in a tree of sums is at most about ``eps * depth * sum(|x|)``.
        The sample's sum nearly cancels (it is tiny next to ``sum(|x|)``), so a
        float32 sum cannot match it to ``SUM_RTOL``; only float64 accumulation can.

        Examples
        --------
        >>> SampleSums(total=1.0, total_abs=2.0**20, count=2**10).float32_tolerance
        1.25
        """
        depth = math.ceil(math.log2(max(self.count, 2)))
        return float(np.finfo(np.float32).eps) * depth * self.total_abs


def sample_sums(nbytes: int) -> SampleSums:
    """Sum the sample field of ``nbytes`` as generated, slab by slab, in float64."""
    shape = sample_shape(nbytes)
    total = total_abs = 0.0
    for _, slab in sample_slabs(shape):
        total += float(np.sum(slab, dtype=np.float64))
        total_abs += float(np.sum(np.abs(slab), dtype=np.float64))
    return SampleSums(total=total, total_abs=total_abs, count=math.prod(shape))


def files_under(path: Path) -> Iterator[Path]:
    """``path`` itself when it is a file, else every file below it."""
    if path.is_file():
        yield path
        return
    for folder, _, names in os.walk(path):
        for name in sorted(names):
            yield Path(folder) / name


def read_file(path: Path, buffer: bytearray) -> int:
    """Read all of ``path`` sequentially into ``buffer`` (reused); return the bytes read."""
    total = 0
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            total += n
    return total


def warm_page_cache(path: Path, buffer: bytearray) -> int:
    """Read every byte of the file or store once, so timed runs find it in the page cache."""
    return sum(read_file(p, buffer) for p in files_under(path))


# -- contenders ----------------------------------------------------------------------------------------------------


def npy_contenders(path: str, nbytes: int, buffer: bytearray) -> list[tuple[Contender, Run]]:
    """daskstream and plain dask, end to end and compute only, plus numpy and read-speed references."""
    built_ds = ds.open(path)
    built_dask = da.from_array(np.load(path, mmap_mode="r"), chunks="auto")
    in_ram = np.load(path)
    file_bytes = os.path.getsize(path)

    def read_whole_file(dtype: Any) -> None:
        # Returns no sum, so the sum checks skip it.
        read_file(Path(path), buffer)

    return [
        (
            Contender("ds.open(path).sum().compute()", "daskstream", OPEN_AND_SUM, nbytes, built_ds.npartitions),
            lambda dtype: ds.open(path).sum(dtype=dtype).compute(),
        ),
        (
            Contender(
                "da.from_array(np.load(path, mmap_mode='r'), chunks='auto').sum().compute()",
                "dask",
                OPEN_AND_SUM,
                nbytes,
                built_dask.npartitions,
            ),
            lambda dtype: da.from_array(np.load(path, mmap_mode="r"), chunks="auto").sum(dtype=dtype).compute(),
        ),
        (
            Contender("x.sum().compute(), x = ds.open(path)", "daskstream", SUM_ONLY, nbytes, built_ds.npartitions),
            lambda dtype: built_ds.sum(dtype=dtype).compute(),
        ),
        (
            Contender(
                "x.sum().compute(), x = da.from_array(np.load(path, mmap_mode='r'), chunks='auto')",
                "dask",
                SUM_ONLY,
                nbytes,
                built_dask.npartitions,
            ),
            lambda dtype: built_dask.sum(dtype=dtype).compute(),
        ),
        (
            Contender("np.sum(a), a = np.load(path) in RAM (1 thread)", REFERENCE, REFERENCE, nbytes),
            lambda dtype: np.sum(in_ram, dtype=dtype),
        ),
        (
            Contender("read the file into a reused 64 MiB buffer (1 thread)", REFERENCE, REFERENCE, file_bytes),
            read_whole_file,
        ),
    ]


def hdf5_contenders(location: str, nbytes: int) -> list[tuple[Contender, Run]]:
    """daskstream against ``da.from_array`` over an h5py dataset, with the lock dask's docs show."""
    import h5py

    path = location.split("::")[0]

    def dask_sum(dtype: Any) -> Any:
        with h5py.File(path, "r") as f:
            return da.from_array(f[HDF5_DATASET], chunks="auto", lock=True).sum(dtype=dtype).compute()

    with h5py.File(path, "r") as f:
        dask_tasks = da.from_array(f[HDF5_DATASET], chunks="auto", lock=True).npartitions
    return [
        (
            Contender(
                f"ds.open('{Path(path).name}::{HDF5_DATASET}').sum().compute()",
                "daskstream",
                OPEN_AND_SUM,
                nbytes,
                ds.open(location).npartitions,
            ),
            lambda dtype: ds.open(location).sum(dtype=dtype).compute(),
        ),
        (
            Contender(
                f"da.from_array(h5py.File(path)['{HDF5_DATASET}'], chunks='auto', lock=True).sum().compute()",
                "dask",
                OPEN_AND_SUM,
                nbytes,
                dask_tasks,
            ),
            dask_sum,
        ),
    ]


def zarr_contenders(path: str, nbytes: int) -> list[tuple[Contender, Run]]:
    """daskstream against ``da.from_zarr``."""
    return [
        (
            Contender("ds.open(path).sum().compute()", "daskstream", OPEN_AND_SUM, nbytes, ds.open(path).npartitions),
            lambda dtype: ds.open(path).sum(dtype=dtype).compute(),
        ),
        (
            Contender(
                "da.from_zarr(path).sum().compute()", "dask", OPEN_AND_SUM, nbytes, da.from_zarr(path).npartitions
            ),
            lambda dtype: da.from_zarr(path).sum(dtype=dtype).compute(),
        ),
    ]


# -- timing --------------------------------------------------------------------------------------------------------


def check_sum(
    fmt: str, contender: Contender, value: Any, expected: float, *, atol: float, accumulator: str
) -> float | None:
    """``value`` as a float; raises :class:`SumMismatchError` unless it is close to ``expected``.

    Close means ``np.isclose`` with ``rtol=SUM_RTOL`` and ``atol``; ``None`` (no sum) passes.
    """
    if value is None:
        return None
    got = float(value)
    if not np.isclose(got, expected, rtol=SUM_RTOL, atol=atol):
        raise SumMismatchError(
            f"{fmt}: {contender.name} with a {accumulator} accumulator summed to {got!r}, but the float64 sum "
            f"of the sample is {expected!r} (difference {abs(got - expected):.3g}, allowed "
            f"{atol + SUM_RTOL * abs(expected):.3g}); the timings would compare different results, so none are reported"
        )
    return got


def time_interleaved(
    fmt: str, contenders: Sequence[tuple[Contender, Run]], repeats: int, sums: SampleSums, echo: Callable[[str], None]
) -> list[Timing]:
    """Check each contender's sum, run each once untimed, then ``repeats`` rounds running each once in turn.

    The strict check runs each contender's code once with a float64
    accumulator: it must give the float64 sum to ``SUM_RTOL``, which shows
    every contender read the same data. The timed code uses the default
    accumulator (float32 for this data), so its sums are checked within
    float32 rounding only.
    """
    timings = [Timing(c) for c, _ in contenders]
    for timing, (c, run) in zip(timings, contenders):
        timing.float64_sum = check_sum(fmt, c, run(np.float64), sums.total, atol=0.0, accumulator="float64")
    atol = sums.float32_tolerance
    for c, run in contenders:
        # Warm-up: starts the thread pool and fills first-use caches (imports, file handles).
        check_sum(fmt, c, run(None), sums.total, atol=atol, accumulator="default")
    for round_ in range(repeats):
        for timing, (c, run) in zip(timings, contenders):
            gc.collect()  # so no run pays for collecting another's garbage
            t0 = time.perf_counter()
            value = run(None)
            timing.seconds.append(time.perf_counter() - t0)
            got = check_sum(fmt, c, value, sums.total, atol=atol, accumulator="default")
            if got is not None:
                timing.sums.append(got)
        echo(f"{fmt}: round {round_ + 1}/{repeats}: " + ", ".join(f"{t.seconds[-1]:.3f}" for t in timings) + " s")
    return timings


def speedups(timings: Sequence[Timing]) -> dict[str, float]:
    """Per scope, plain dask's median time over daskstream's."""
    out = {}
    for scope in (OPEN_AND_SUM, SUM_ONLY):
        by_library = {t.contender.library: t for t in timings if t.contender.scope == scope}
        if {"daskstream", "dask"} <= by_library.keys():
            out[scope] = by_library["dask"].median / by_library["daskstream"].median
    return out


# -- report --------------------------------------------------------------------------------------------------------


def usable_cpus() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_info(threads: int) -> dict[str, Any]:
    """CPU model, cores, memory and library versions of this machine."""
    import h5py
    import psutil
    import zarr

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": usable_cpus(),
        "scheduler": f"dask threaded, {threads} threads",
        "ram_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "daskstream": ds.__version__,
            "dask": dask.__version__,
            "numpy": np.__version__,
            "h5py": h5py.__version__,
            "zarr": zarr.__version__,
        },
    }


def markdown_table(results: dict[str, list[Timing]]) -> str:
    """The timings as a markdown table, one row per contender."""
    lines = [
        "| format | contender | timer covers | tasks | median s | min s | max s | GB/s | speedup vs plain dask |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for fmt, timings in results.items():
        ratio = speedups(timings)
        for t in timings:
            c = t.contender
            speedup = ""
            if c.library == "daskstream" and c.scope in ratio:
                speedup = f"**{ratio[c.scope]:.2f}x**"
            elif c.library == "dask":
                speedup = "1x (baseline)"
            label = c.name if c.library == REFERENCE else f"{c.library}: `{c.name}`"
            lines.append(
                f"| {fmt} | {label} | {c.scope} | {c.tasks if c.tasks is not None else ''} | {t.median:.3f} | "
                f"{min(t.seconds):.3f} | {max(t.seconds):.3f} | {t.gbps:.2f} | {speedup} |"
            )
    return "\n".join(lines)


def sum_summary(results: dict[str, list[Timing]], sums: SampleSums) -> str:
    """One paragraph on how the contenders' sums compare with the float64 sum of the sample."""
    timings = [t for ts in results.values() for t in ts]
    f64 = [abs(t.float64_sum - sums.total) / abs(sums.total) for t in timings if t.float64_sum is not None]
    f32 = [abs(s - sums.total) for t in timings for s in t.sums]
    return (
        f"Sums: run once with `.sum(dtype='f8')`, every contender gives the sample's float64 sum "
        f"{sums.total:.10g} to rtol {SUM_RTOL:g} (largest relative difference {max(f64):.1e}). The timed "
        f"`.sum()` accumulates in float32; its results lie within {max(f32):.3g} of that sum, inside the "
        f"float32 rounding bound {sums.float32_tolerance:.3g} (eps x tree depth x sum|x| = {sums.total_abs:.4g})."
    )


def requirement_verdict(results: dict[str, list[Timing]]) -> dict[str, Any] | None:
    """Whether daskstream opens and sums the .npy at least ``REQUIRED_NPY_SPEEDUP`` times faster than plain dask."""
    if "npy" not in results:
        return None
    speedup = speedups(results["npy"])[OPEN_AND_SUM]
    return {"required_speedup": REQUIRED_NPY_SPEEDUP, "speedup": speedup, "met": speedup >= REQUIRED_NPY_SPEEDUP}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.open_sum",
        description="Time opening and summing a sample field with daskstream and with plain dask.",
    )
    parser.add_argument("--size", default="1GiB", help="bytes of the float32 sample field (default: 1GiB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, at least 3 (default: 5)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of npy,hdf5,zarr (default: all)")
    parser.add_argument(
        "--data-dir", type=Path, default=DATA_DIR, help=f"where samples are cached (default: {DATA_DIR})"
    )
    parser.add_argument("--threads", type=int, default=None, help="threads of dask's scheduler (default: usable CPUs)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error(f"--repeats {args.repeats}: give at least 3, so the median means something")
    args.formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = [f for f in args.formats if f not in FORMATS]
    if unknown or not args.formats:
        parser.error(f"--formats {','.join(args.formats)!r}: choose from {', '.join(FORMATS)}")
    try:
        args.nbytes = parse_budget(args.size, name="--size")
    except DaskstreamError as exc:
        parser.error(str(exc))
    if args.threads is None:
        args.threads = usable_cpus()
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: give at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table and write JSON when asked. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.open_sum", *argv])

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    nbytes = args.nbytes
    buffer = bytearray(READ_BUFFER_BYTES)
    locations = {fmt: ensure_dataset(fmt, nbytes, args.data_dir, echo) for fmt in args.formats}
    t0 = time.perf_counter()
    sums = sample_sums(nbytes)
    echo(f"float64 sum of the sample: {sums.total!r}, of |x|: {sums.total_abs!r} ({time.perf_counter() - t0:.1f} s)")

    results: dict[str, list[Timing]] = {}
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        for fmt, location in locations.items():
            target, _ = dataset_location(fmt, nbytes, args.data_dir)
            warm_page_cache(target, buffer)
            if fmt == "npy":
                contenders = npy_contenders(location, nbytes, buffer)
            elif fmt == "hdf5":
                contenders = hdf5_contenders(location, nbytes)
            else:
                contenders = zarr_contenders(location, nbytes)
            results[fmt] = time_interleaved(fmt, contenders, args.repeats, sums, echo)
            del contenders  # frees the .npy's in-RAM copy before the next format

    machine = machine_info(args.threads)
    verdict = requirement_verdict(results)
    shape = sample_shape(nbytes)
    print(f"## Open and sum: daskstream vs plain dask ({format_size(nbytes)} float32, shape {shape})\n")
    print(f"Command: `{command}`\n")
    print(
        f"Machine: {machine['cpu']}; {machine['cores']} cores ({machine['usable_cores']} usable); "
        f"{format_size(machine['ram_bytes'])} RAM; {machine['platform']}\n"
    )
    print(
        f"Scheduler: {machine['scheduler']} for every contender; warm page cache; {args.repeats} interleaved rounds\n"
    )
    print("Versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()) + "\n")
    print(markdown_table(results) + "\n")
    print(sum_summary(results, sums))
    if verdict is not None:
        state = "met" if verdict["met"] else "NOT met"
        print(
            f"Requirement (npy, open + sum, daskstream >= {REQUIRED_NPY_SPEEDUP:g}x faster than plain dask): "
            f"{state} ({verdict['speedup']:.2f}x)."
        )

    if args.json is not None:
        report = {
            "command": command,
            "machine": machine,
            "settings": {
                "size": args.size,
                "nbytes": nbytes,
                "shape": list(shape),
                "dtype": "float32",
                "repeats": args.repeats,
                "threads": args.threads,
                "formats": list(args.formats),
                "data_dir": str(args.data_dir),
            },
            "sample_sums": {"float64_sum": sums.total, "float64_sum_abs": sums.total_abs, "count": sums.count},
            "sum_rtol": SUM_RTOL,
            "float32_sum_atol": sums.float32_tolerance,
            "formats": {
                fmt: {
                    "location": locations[fmt],
                    "contenders": [
                        t.as_dict(speedups(ts).get(t.contender.scope) if t.contender.library == "daskstream" else None)
                        for t in ts
                    ],
                }
                for fmt, ts in results.items()
            },
            "requirement": verdict,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        echo(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
