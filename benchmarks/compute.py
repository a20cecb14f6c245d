"""describe against sum, and an exact median of an array four times the memory budget.

Run ``python -m benchmarks.compute [--size 1GiB] [--repeats 5]``. It reuses the
sample .npy that ``benchmarks.open_sum`` writes (or writes it), and prints a
markdown table with the machine and the command.

1. **describe vs sum.** ``ds.describe(x).compute()`` (count, NaN count, mean,
   std, min, max in one pass) against ``x.sum().compute()`` on the same opened
   array, interleaved, medians; and against what plain dask users write for
   the same statistics: ``dask.compute(x.mean(), x.std(), x.min(), x.max(),
   da.isnan(x).sum())``.
2. **Exact median out of core.** In a fresh process whose planner budget is a
   quarter of the file, ``ds.reduce(x, "median").compute()``: its peak RSS
   (``resource.getrusage``), wall time and passes over the data, checked for
   exact equality against ``numpy.median`` of the array loaded in another
   process, whose own peak RSS is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np

import daskstream as ds
from daskstream.demo import write_sample
from daskstream.planning.budget import format_size, parse_budget

DATA_DIR = Path(__file__).resolve().parent / "data"


def sample_npy(nbytes: int) -> Path:
    """The sample field as .npy, written once into benchmarks/data."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = DATA_DIR / f"field-{nbytes}.npy"
    if not path.exists():
        partial = path.with_suffix(".partial.npy")
        write_sample(str(partial), "npy", nbytes)
        partial.rename(path)
    return path


def interleaved(contenders: dict, repeats: int) -> dict[str, list[float]]:
    """Time each contender once per round, A B C A B C ..., after one untimed run each."""
    for run in contenders.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def describe_vs_sum(path: Path, repeats: int) -> list[tuple[str, float, float, float]]:
    x = ds.open(path)

    def plain_dask_five():
        y = da.from_array(np.load(path, mmap_mode="r"), chunks="auto")
        return dask.compute(y.mean(), y.std(), y.min(), y.max(), da.isnan(y).sum())

    times = interleaved(
        {
            "x.sum().compute()": lambda: x.sum().compute(),
            "ds.describe(x).compute()": lambda: ds.describe(x).compute(),
            "ds.reduce(x, 'sum') (float64 accumulation)": lambda: ds.reduce(x, "sum").compute(),
            "plain dask: open + dask.compute(mean, std, min, max, isnan.sum)": plain_dask_five,
        },
        repeats,
    )
    base = statistics.median(times["x.sum().compute()"])
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        rows.append((name, median, x.nbytes / median / 1e9, median / base))
    return rows


# Peak RSS from the kernel's high-water mark of this process's own memory map: unlike
# getrusage's ru_maxrss, it does not carry over the parent's peak across fork and exec.
_PEAK_RSS = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"

_MEDIAN_CHILD = """
import json, sys, time
import numpy as np
import daskstream as ds
from daskstream.runtime.metering import ReadMeter
path, budget = sys.argv[1], sys.argv[2]
start = time.perf_counter()
x = ds.open(path, memory_budget=budget)
with ReadMeter() as meter:
    value = ds.reduce(x, "median", memory_budget=budget).compute()
print(json.dumps({"median": float(value), "seconds": time.perf_counter() - start,
                  "peak_rss": PEAK_RSS, "chunks": x.npartitions, "passes": meter.bytes_read / x.nbytes}))
""".replace("PEAK_RSS", _PEAK_RSS)

_NUMPY_CHILD = """
import json, sys, time
import numpy as np
start = time.perf_counter()
value = np.median(np.load(sys.argv[1]))
print(json.dumps({"median": float(value), "seconds": time.perf_counter() - start, "peak_rss": PEAK_RSS}))
""".replace("PEAK_RSS", _PEAK_RSS)


def median_out_of_core(path: Path, nbytes: int) -> dict:
    budget = nbytes // 4
    ours = json.loads(
        subprocess.run(
            [sys.executable, "-c", _MEDIAN_CHILD, str(path), str(budget)], check=True, capture_output=True, text=True
        ).stdout
    )
    numpy = json.loads(
        subprocess.run(
            [sys.executable, "-c", _NUMPY_CHILD, str(path)], check=True, capture_output=True, text=True
        ).stdout
    )
    baseline = json.loads(subprocess.run([sys.executable, "-c", f"import json, daskstream; print({_PEAK_RSS})"], check=True, capture_output=True, text=True).stdout)  # fmt: skip
    if ours["median"] != numpy["median"]:
        raise AssertionError(f"median {ours['median']!r} differs from numpy's {numpy['median']!r}")
    return {"budget": budget, "ours": ours, "numpy": numpy, "import_baseline_rss": baseline}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    nbytes = parse_budget(args.size, name="--size")
    path = sample_npy(nbytes)
    command = "python -m benchmarks.compute " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"## describe and exact median ({format_size(nbytes)} float32 .npy)\n")
    print(f"Command: `{command.strip()}`  ")
    print(f"Machine: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores; "
          f"python {platform.python_version()}, dask {dask.__version__}, numpy {np.__version__}\n")  # fmt: skip
    print("| what (warm page cache, threaded scheduler) | median s | GB/s | time / `x.sum()` |")
    print("|---|--:|--:|--:|")
    for name, seconds, gbps, ratio in describe_vs_sum(path, args.repeats):
        print(f"| `{name}` | {seconds:.3f} | {gbps:.2f} | {ratio:.2f}x |")
    result = median_out_of_core(path, nbytes)
    ours, numpy = result["ours"], result["numpy"]
    print(
        f"\nExact median, budget {format_size(result['budget'])} (a quarter of the data): "
        f"{ours['median']!r}, equal to numpy.median; {ours['passes']:g} passes over {ours['chunks']} chunks "
        f"(bytes read / bytes in the file; float32 takes two 16-bit radix passes) in {ours['seconds']:.2f} s; peak RSS {format_size(ours['peak_rss'])} "
        f"(the interpreter with daskstream imported alone: {format_size(result['import_baseline_rss'])}). "
        f"numpy.median on the loaded array: {numpy['seconds']:.2f} s, peak RSS {format_size(numpy['peak_rss'])}."
    )


if __name__ == "__main__":
    main()
