"""Opening many daily NetCDF-4 files as one: daskstream against ``xarray.open_mfdataset(parallel=True)``.

``--files`` daily files (``day-00000.nc`` ...) are written by the NetCDF-C
library (netCDF4) as xarray's ``to_netcdf`` writes them: a float32 field
``tas`` of shape ``(1, lat, lon)``, ``lat`` and ``lon`` coordinates, a
``time`` coordinate in days since the file's own date, a title and a creation
date of the file's own. Then each contender opens the pattern in a fresh
interpreter, timed from the call to the opened result (imports timed
apart), in rounds A B C A B C... after one untimed pass over every file's
bytes (a warm page cache); medians of ``--repeats``:

* ``ds.open_dataset(pattern)``;
* ``ds.open(pattern + "::tas")``;
* ``xr.open_mfdataset(pattern, engine="h5netcdf", parallel=True)``: xarray's
  NetCDF-4 reader on h5py, as daskstream reads them (its netcdf4 engine,
  loaded beside h5py's HDF5 library in one process, is not a fair or safe
  contender: the two HDF5 libraries clash);
* for the numbers of files ``--engine`` names, also ``xr.open_mfdataset(pattern,
  engine="daskstream", parallel=True)``: xarray opening each file through
  daskstream's engine, one call each.

In the first round every contender also reads the whole field and the time
coordinate, and their SHA-1 must equal xarray's: the same values, in the same
order. The files are deleted afterwards.

    python -m benchmarks.many_files [--files 1000,10000] [--repeats 3] [--shape 45,90] [--engine 1000]
                                    [--out benchmarks/results/many_files]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.open_sum import machine_info, usable_cpus
from benchmarks.timing import write_results

REPOSITORY = Path(__file__).resolve().parent.parent
XARRAY = "xr.open_mfdataset(parallel=True)"
CONTENDERS = {
    "ds.open_dataset": "ds.open_dataset(pattern)",
    "ds.open": 'ds.open(pattern + "::tas")',
    XARRAY: 'xr.open_mfdataset(pattern, engine="h5netcdf", parallel=True)',
}
ENGINE = 'xr.open_mfdataset(engine="daskstream")'
ENGINE_CODE = 'xr.open_mfdataset(pattern, engine="daskstream", parallel=True)'

# Writes files start..stop-1 of a family; run in processes of its own (netCDF4 brings its own HDF5 library).
WRITER = """
import sys
import numpy as np
import netCDF4
import pandas as pd

folder, start, stop, lat, lon = sys.argv[1], *map(int, sys.argv[2:6])
for day in range(start, stop):
    date = pd.Timestamp("2000-01-01") + pd.Timedelta(days=day)
    with netCDF4.Dataset(f"{folder}/day-{day:05d}.nc", "w") as f:
        f.title = "daily near-surface air temperature"
        f.date_created = str(pd.Timestamp("2024-01-01") + pd.Timedelta(seconds=day))
        f.createDimension("time", 1)
        f.createDimension("lat", lat)
        f.createDimension("lon", lon)
        time = f.createVariable("time", "i8", ("time",))
        time.units, time.calendar = f"days since {date:%Y-%m-%d} 00:00:00", "proleptic_gregorian"
        time[:] = [0]
        f.createVariable("lat", "f8", ("lat",))[:] = np.linspace(-89.0, 89.0, lat)
        f.createVariable("lon", "f8", ("lon",))[:] = np.linspace(0.0, 360.0, lon, endpoint=False)
        tas = f.createVariable("tas", "f4", ("time", "lat", "lon"), fill_value=np.float32("nan"))
        tas.units, tas.long_name = "K", "near-surface air temperature"
        tas[:] = 280 + np.random.default_rng(day).standard_normal((1, lat, lon)).astype("f4")
"""

# Opens the pattern as one contender and prints what it took; with a check, the SHA-1 of what it opened.
OPENER = """
import hashlib, json, sys, time
contender, pattern, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
started = time.perf_counter()
import numpy as np
import xarray as xr
import daskstream as ds
imported = time.perf_counter()
opened = eval(sys.argv[4])
done = time.perf_counter()
result = {"import_s": imported - started, "open_s": done - imported}
if check:
    field = opened if contender == "ds.open" else opened["tas"].data
    values = np.ascontiguousarray(np.asarray(field.compute()))
    result["shape"] = list(values.shape)
    result["values_sha1"] = hashlib.sha1(values.tobytes()).hexdigest()
    if contender != "ds.open":
        times = np.ascontiguousarray(opened["time"].values)
        result["time_sha1"] = hashlib.sha1(times.tobytes()).hexdigest()
print(json.dumps(result))
"""


def write_family(folder: Path, files: int, lat: int, lon: int, processes: int) -> float:
    """Write the files in ``processes`` writers at once; the seconds it took."""
    started = time.perf_counter()
    bounds = [files * i // processes for i in range(processes + 1)]
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(a), str(b), str(lat), str(lon)])
        for a, b in itertools.pairwise(bounds)
        if b > a
    ]
    for writer in writers:
        if writer.wait() != 0:
            raise RuntimeError("a writer failed (is netCDF4 installed?)")
    return time.perf_counter() - started


def warm(folder: Path) -> None:
    """Read every file's bytes once, so every contender meets a warm page cache."""
    for path in folder.iterdir():
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass


def open_once(contender: str, code: str, pattern: str, check: bool) -> dict[str, Any]:
    """One contender's open in a fresh interpreter, run from the repository (its daskstream)."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(
        [sys.executable, "-c", OPENER, contender, pattern, "1" if check else "0", code],
        capture_output=True, text=True, cwd=REPOSITORY, env=environment,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{contender} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(folder: Path, files: int, repeats: int, contenders: dict[str, str]) -> dict[str, Any]:
    """Every contender's open, interleaved round by round; checked against xarray's values in round one."""
    pattern = str(folder / "day-*.nc")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for round_ in range(repeats):
        for name, code in contenders.items():
            runs[name].append(open_once(name, code, pattern, check=round_ == 0))
            print(f"{files} files, round {round_ + 1}, {name}: {runs[name][-1]['open_s']:.2f} s", file=sys.stderr)
    oracle = runs[XARRAY][0]
    rows = []
    for name, timings in runs.items():
        seconds = [t["open_s"] for t in timings]
        checked = timings[0]
        equal = checked["values_sha1"] == oracle["values_sha1"] and checked["shape"] == oracle["shape"]
        if "time_sha1" in checked:
            equal = equal and checked["time_sha1"] == oracle["time_sha1"]
        rows.append({
            "contender": name, "code": contenders[name], "files": files, "median_s": statistics.median(seconds),
            "min_s": min(seconds), "max_s": max(seconds), "seconds": seconds,
            "import_s": statistics.median(t["import_s"] for t in timings), "shape": checked["shape"],
            "equal_to_xarray": equal,
        })  # fmt: skip
    xarray_median = next(r["median_s"] for r in rows if r["contender"] == XARRAY)
    for row in rows:
        row["speedup_vs_xarray"] = xarray_median / row["median_s"]
    return {"files": files, "rows": rows}


def markdown(results: list[dict[str, Any]], machine: dict[str, Any], command: str, shape: tuple[int, int]) -> str:
    lines = [
        f"`{command}` on {machine['cpu']} ({machine['usable_cores']} usable cores, "
        f"{machine['ram_bytes'] / 2**30:.0f} GiB); daily NetCDF-4 files of float32 (1, {shape[0]}, {shape[1]}), "
        "each opened in a fresh interpreter (imports not timed), warm page cache, median of "
        f"{len(results[0]['rows'][0]['seconds'])}",
        "",
        "| files | contender | open, median (s) | min (s) | max (s) | vs xarray | values equal to xarray's |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for r in result["rows"]:
            lines.append(
                f"| {r['files']:,} | `{r['code']}` | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} | "
                f"{r['speedup_vs_xarray']:.1f}x | {'yes' if r['equal_to_xarray'] else 'NO'} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="1000", help="numbers of files, comma-separated: 1000,10000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", default="45,90", help="lat,lon of each day's field")
    parser.add_argument(
        "--engine", default="", help="numbers of files for which xarray also opens each file through daskstream"
    )
    parser.add_argument("--folder", default=None, help="where to write the files (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    args = parser.parse_args()
    lat, lon = (int(n) for n in args.shape.split(","))
    with_engine = {int(n) for n in args.engine.split(",") if n}
    machine = machine_info(usable_cpus())
    results = []
    for files in (int(n) for n in args.files.split(",")):
        contenders = {**CONTENDERS, **({ENGINE: ENGINE_CODE} if files in with_engine else {})}
        folder = Path(tempfile.mkdtemp(prefix=f"daskstream-bench-many-{files}-", dir=args.folder))
        try:
            written = write_family(folder, files, lat, lon, processes=max(1, usable_cpus()))
            print(f"{files} files written in {written:.1f} s", file=sys.stderr)
            warm(folder)
            results.append({**measure(folder, files, args.repeats, contenders), "write_s": written})
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    command = "python -m benchmarks.many_files " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    table = markdown(results, machine, command.strip(), (lat, lon))
    print(table)
    document = {"machine": machine, "command": command.strip(), "shape": [1, lat, lon], "results": results}
    write_results(args.out, table, document)


if __name__ == "__main__":
    main()
