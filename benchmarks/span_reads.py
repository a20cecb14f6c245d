"""Computations over an array read in spans: what they read, what the plan says beforehand, and their time
beside xarray's.

An array with more chunks than a graph may hold is read in *spans*: each task streams many chunks. Here a
float32 field ``v(t, y, z)`` (1 GiB by default, Zarr format 3, zstd, 256 time steps per chunk, written by
xarray) stands for such an array: daskstream opens it with ``daskstream.planning.max-tasks`` at 64, which
spans it as a pebibyte is spanned at the default ceiling. Three computations:

==================  ================================================================================
weighted mean       ``v.weighted(w).mean("t")``, ``w`` a weight per ``y`` (xarray's two einsums)
picked steps        ``v.isel(t=picked).sum()``, ``picked`` a third of the time steps, in order
plus its reverse    ``(d + d[::-1]).max(axis=0)``, ``d`` the field's dask array
==================  ================================================================================

Contenders, each in a fresh interpreter, on dask's threaded scheduler with the same threads:

* **daskstream**: ``ds.open_dataset(path, memory_budget=...)`` spanned as above, then the same code. It
  reports the bytes its plan says it will read (``plan_compute(...).bytes_to_read``) and the bytes it
  read (:class:`daskstream.runtime.metering.ReadMeter`).
* **xarray**: a competent user's ``xr.open_zarr(path, chunks={"t": 4096})``: 128 MiB dask chunks of 16
  storage chunks each, dask's recommended size.

Timed: ``.compute()`` after opening, the median of ``--repeats`` runs. Peak: the process's resident
high-water mark during the computation (Linux ``clear_refs``), imports included. Answers are compared with numpy's on the whole field.

Run ``python -m benchmarks.span_reads [--size 1GiB] [--repeats 3] [--budget 256MiB]
[--data-dir benchmarks/data] [--out benchmarks/results/span-reads]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.timing import write_results
from daskstream.planning.budget import format_size, parse_budget

COMPUTATIONS = ("weighted mean", "picked steps", "plus its reverse")
CONTENDERS = ("daskstream", "xarray")
ROW_BYTES = 64 * 128 * 4  # one time step

# One contender's computation, in an interpreter of its own: prints its time, peak, answer and reads.
RUN = """
import json, sys, time
import dask, numpy as np, xarray as xr
contender, path, computation, budget = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
import daskstream as ds
from daskstream.runtime.metering import ReadMeter
dask.config.set(scheduler="threads")
if contender == "daskstream":
    dask.config.set({"daskstream.planning.max-tasks": 64, "daskstream.planning.first-task-within": None})
    v = ds.open_dataset(path, memory_budget=budget)["v"]
else:
    v = xr.open_zarr(path, chunks={"t": 4096})["v"]
steps = v.sizes["t"]
if computation == "weighted mean":
    result = v.weighted(xr.DataArray(np.linspace(0.5, 1.5, v.sizes["y"]), dims="y")).mean("t").data
elif computation == "picked steps":
    picked = np.sort(np.random.default_rng(0).choice(steps, steps // 3, replace=False))
    result = v.isel(t=picked).sum(dtype="f8").data
else:
    d = v.data
    result = (d + d[::-1]).max(axis=0)
planned = ds.plan_compute(result).bytes_to_read if contender == "daskstream" else None
with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark from here (not the parent's at fork)
    refs.write("5")
start = time.perf_counter()
with ReadMeter() as meter:
    answer = np.asarray(result.compute())
seconds = time.perf_counter() - start
status = open("/proc/self/status").read().split()
peak = int(status[status.index("VmHWM:") + 1]) * 1024
read = meter.bytes_read if contender == "daskstream" else None
print(json.dumps({"seconds": seconds, "peak": peak, "planned": planned, "read": read,
                  "answer": answer.astype("f8").ravel()[:4096].tolist()}))
"""


def ensure_field(path: Path, nbytes: int) -> np.ndarray:
    """The field, written by xarray once (reused where its shape is right); returned whole for the oracles."""
    import shutil

    import xarray as xr

    steps = max(512, nbytes // ROW_BYTES // 256 * 256)
    data = np.random.default_rng(47).standard_normal((steps, 64, 128), dtype="f4")
    if path.exists() and xr.open_zarr(path)["v"].shape == data.shape:
        return data
    # Written under another name, then renamed: a stopped run never leaves a field that looks whole.
    partial = path.with_name(path.name + ".partial")
    xr.Dataset({"v": (("t", "y", "z"), data)}).to_zarr(
        partial, mode="w", zarr_format=3, consolidated=False, encoding={"v": {"chunks": (256, 64, 128)}}
    )
    if path.exists():
        shutil.rmtree(path)
    os.replace(partial, path)
    return data


def oracle(data: np.ndarray, computation: str) -> np.ndarray:
    if computation == "weighted mean":  # weights along y, a mean along t: each column's own mean
        return data.mean(axis=0, dtype="f8")
    if computation == "picked steps":
        picked = np.sort(np.random.default_rng(0).choice(len(data), len(data) // 3, replace=False))
        return np.asarray([data[picked].sum(dtype="f8")])
    return (data + data[::-1]).max(axis=0)


def run(contender: str, path: Path, computation: str, budget: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", RUN, contender, str(path), computation, budget],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--data-dir", default="benchmarks/data")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    path = Path(args.data_dir) / f"span-field-{parse_budget(args.size)}.zarr"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = ensure_field(path, parse_budget(args.size))
    rows, document = [], []
    for computation in COMPUTATIONS:
        # Interleaved, so that both contenders see the machine alike.
        runs: dict[str, list[dict[str, object]]] = {c: [] for c in CONTENDERS}
        for _ in range(args.repeats):
            for contender in CONTENDERS:
                runs[contender].append(run(contender, path, computation, args.budget))
        expected = oracle(data, computation).ravel()[:4096]
        for contender in CONTENDERS:
            done = [r for r in runs[contender] if "error" not in r]
            if not done:
                rows.append(f"| {computation} | {contender} | {runs[contender][0]['error']} | | | |")
                continue
            right = all(np.allclose(r["answer"], expected, rtol=1e-4) for r in done)
            seconds = statistics.median(float(r["seconds"]) for r in done)  # type: ignore[arg-type]
            peak = statistics.median(int(r["peak"]) for r in done)  # type: ignore[call-overload]
            planned, read = done[0]["planned"], done[0]["read"]
            reads = (
                f"{format_size(int(read))} ({format_size(int(planned))} planned)"  # type: ignore[call-overload]
                if read is not None
                else "-"
            )
            rows.append(
                f"| {computation} | {contender} | {seconds:.2f} s | {format_size(int(peak))} | {reads} | "
                f"{'yes' if right else 'NO'} |"
            )
            kept = [{k: v for k, v in r.items() if k != "answer"} for r in runs[contender]]  # checked above
            document.append({"computation": computation, "contender": contender, "runs": kept, "right": right})
    table = "\n".join(
        [
            f"{format_size(data.nbytes)} float32, Zarr 3 zstd, chunks of 256 steps (8 MiB), "
            f"budget {args.budget}, {args.repeats} runs each, median",
            "",
            "| computation | contender | time | peak | read | numpy's answer |",
            "|---|---|--:|--:|--:|---|",
            *rows,
        ]
    )
    print(table)
    write_results(args.out, table, document)


if __name__ == "__main__":
    main()
