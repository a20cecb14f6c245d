"""Whole climate analyses: daskstream against a competent xarray user, xarray's automatic chunks, and a tight budget.

Each analysis is what a climate scientist writes, run on a daily float32 field ``t(time, lat, lon)``
(3650 x 180 x 360 by default: ten years on a 1-degree grid, 946 MB), stored in NetCDF-4 (h5netcdf, no
filter) and in Zarr (format 3, zarr-python's default codecs: zstd), each with one day per storage chunk
and with a year per storage chunk:

=================  ======================================================================================
climatology        ``t.groupby("time.month").mean()``
anomaly-std        ``(t.groupby("time.month") - climatology).std("time")``
resample           ``t.resample(time="MS").mean()``
rolling            ``t.rolling(time=30).mean().max("time")``
percentile         95th percentile of each pixel over time (numpy's ``quantile``, NaN not skipped)
weighted-mean      ``t.weighted(cos(lat)).mean(("lat", "lon"))``
stencil            3 x 3 box mean of each day, summed over the interior (an imaging stencil)
standardized       ``z = (g - g.mean()) / g.std()`` by month, then ``(abs(z) > 2).sum("time")``
=================  ======================================================================================

Contenders, each in a fresh interpreter, all on dask's threaded scheduler with the same threads:

* **xarray** -- a competent user: ``xr.open_dataset(path, chunks={"time": 365})`` (a year per chunk,
  each storage chunk read by one task; flox chooses its method: ``map-reduce`` for a monthly groupby
  over year chunks). For the percentile, the whole time axis per chunk: ``chunks={"time": -1, "lat": L}``
  with ``L`` latitudes making about 96 MiB a chunk, and ``quantile(0.95, "time", skipna=False)`` (the
  same answer as numpy's ``quantile``, which daskstream's is; ``skipna=True`` runs numpy's
  ``nanquantile``, 3x slower here).
* **xarray auto** -- ``chunks="auto"`` (dask's 128 MiB chunks), ``.chunk(time=-1)`` for the percentile.
* **daskstream** -- ``ds.open_dataset(path)`` at the default budget, then the same xarray code; the
  percentile is ``ds.reduce(t, "quantile", q=0.95, axis="time")`` and the stencil ``ds.kernels.moving_mean``
  along lat, then lon.
* **daskstream tight** -- the same with ``memory_budget`` a quarter of the competent xarray's peak,
  measured in the first round.

Timed: ``.compute()`` of the analysis, after opening (untimed). Memory: the process's resident high-water
mark during the run, less its resident size at the start (Linux ``clear_refs``). For daskstream, the
projection is ``ds.plan_compute`` of the same analysis, made before the run. Every result is compared
with the competent xarray's.

Run ``python -m benchmarks.analyses`` (``--help`` for the options); at the default shape, 4 layouts and 3
repeats it takes about 90 minutes on 2 cores (``--repeats 1``: 30) and 3.4 GB of disk in ``--data-dir`` (kept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers import (
    climate_dataset,
    compare_results,
    disk_bytes,
    machine,
    measure,
    remove,
    warm,
)
from benchmarks.timing import marked_report, run_fresh

REPO = Path(__file__).resolve().parent.parent
RESULT_MARK = "ANALYSES-RESULT "
SHAPE = (3650, 180, 360)

# Layouts: (format, days per storage chunk).
LAYOUTS = {
    "nc-day": ("netcdf", 1),
    "nc-year": ("netcdf", 365),
    "zarr-day": ("zarr", 1),
    "zarr-year": ("zarr", 365),
}
ANALYSES = (
    "climatology", "anomaly-std", "resample", "rolling", "percentile", "weighted-mean", "stencil", "standardized",
)  # fmt: skip
XARRAY, XARRAY_AUTO, DASKSTREAM, TIGHT = "xarray", "xarray auto", "daskstream", "daskstream tight"
CONTENDERS = (XARRAY, XARRAY_AUTO, DASKSTREAM, TIGHT)
#: Bytes a competent user's percentile chunk holds: the whole time axis for this many bytes of pixels.
PERCENTILE_CHUNK_BYTES = 96 * 2**20


# --- data ------------------------------------------------------------------------------------------


def data_path(layout: str, shape: tuple[int, int, int], data_dir: Path) -> Path:
    fmt, _ = LAYOUTS[layout]
    return data_dir / f"analyses-{'x'.join(map(str, shape))}-{layout}.{'nc' if fmt == 'netcdf' else 'zarr'}"


def ensure_data(layout: str, shape: tuple[int, int, int], data_dir: Path, echo: Callable[[str], None]) -> Path:
    """Write the field in ``layout`` unless it is there (written under a temporary name, renamed once whole)."""
    import dask

    path = data_path(layout, shape, data_dir)
    if path.exists():
        return path
    fmt, days = LAYOUTS[layout]
    ntime, nlat, nlon = shape
    dataset = climate_dataset(shape)
    chunks = (min(days, ntime), nlat, nlon)
    partial = path.with_name(f"{path.stem}.partial{path.suffix}")
    remove(partial)
    data_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        if fmt == "netcdf":
            dataset.to_netcdf(partial, engine="h5netcdf", encoding={"t": {"chunksizes": chunks}})
        else:
            dataset.chunk(time=min(days, ntime) if days > 1 else 365).to_zarr(
                partial, encoding={"t": {"chunks": chunks}}, zarr_format=3, consolidated=True
            )
    os.replace(partial, path)
    echo(f"{layout}: wrote {path} in {time.perf_counter() - start:.1f} s, {disk_bytes(path) / 2**20:,.0f} MiB on disk")
    return path


# --- in the child: one contender, one analysis -----------------------------------------------------


def opened(spec: dict[str, Any]) -> Any:
    """The variable ``t`` as the contender opens it."""
    import xarray as xr

    path, contender, analysis = spec["path"], spec["contender"], spec["analysis"]
    engine = "zarr" if path.endswith(".zarr") else "h5netcdf"
    if contender in (DASKSTREAM, TIGHT):
        import daskstream as ds

        budget = spec.get("budget")
        return ds.open_dataset(path, **({"memory_budget": budget} if budget else {}))["t"]
    if contender == XARRAY_AUTO:
        return xr.open_dataset(path, engine=engine, chunks="auto")["t"]
    if analysis == "percentile":
        ntime, nlat, nlon = spec["shape"]
        lats = max(1, min(nlat, PERCENTILE_CHUNK_BYTES // (ntime * nlon * 4)))
        return xr.open_dataset(path, engine=engine, chunks={"time": -1, "lat": lats})["t"]
    return xr.open_dataset(path, engine=engine, chunks={"time": 365})["t"]


def analysis(t: Any, name: str, contender: str) -> Any:
    """The lazy result of analysis ``name`` on ``t``, written as the contender writes it."""
    ours = contender in (DASKSTREAM, TIGHT)
    if name == "climatology":
        return t.groupby("time.month").mean()
    if name == "anomaly-std":
        return (t.groupby("time.month") - t.groupby("time.month").mean()).std("time")
    if name == "resample":
        return t.resample(time="MS").mean()
    if name == "rolling":
        return t.rolling(time=30).mean().max("time")
    if name == "percentile":
        if ours:
            import daskstream as ds

            return ds.reduce(t, "quantile", q=0.95, axis="time")
        whole = t if contender == XARRAY else t.chunk(time=-1)
        return whole.quantile(0.95, dim="time", skipna=False)
    if name == "weighted-mean":
        return t.weighted(np.cos(np.deg2rad(t.lat))).mean(("lat", "lon"))
    if name == "stencil":
        if ours:
            import daskstream as ds

            box = ds.kernels.moving_mean(ds.kernels.moving_mean(t, 3, axis="lat"), 3, axis="lon")
        else:
            box = t.rolling(lat=3, lon=3, center=True).mean()
        return box.isel(lat=slice(1, -1), lon=slice(1, -1)).sum(dtype="f8")
    if name == "standardized":
        months = t.groupby("time.month")
        # Grouped again for the division: the anomaly (a DataArray) divided by the monthly std as it is
        # would broadcast over month, (time, lat, lon, month), twelve times the work.
        z = (months - months.mean()).groupby("time.month") / months.std()
        return (abs(z) > 2).sum("time")
    raise ValueError(name)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh interpreter: open (untimed), project (daskstream), time the computation, keep its result."""
    import dask

    dask.config.set(scheduler="threads", num_workers=spec["threads"])
    with contextlib.suppress(ImportError):
        import distributed  # noqa: F401  (dask imports it at the first compute where installed: untimed here)
    with contextlib.suppress(ImportError):
        import flox.xarray  # noqa: F401  (xarray imports it at the first groupby: an import, untimed as the others)
    t = opened(spec)
    report: dict[str, Any] = {"chunks": [list(c[:3]) for c in t.data.chunks]}
    if spec["contender"] in (DASKSTREAM, TIGHT):
        import daskstream as ds

        try:
            plan = ds.plan_compute(analysis(t, spec["analysis"], spec["contender"]).data)
            report["projected"] = plan.projected_peak_bytes
            report["budget"] = plan.budget
        except ds.errors.MemoryBudgetError as refused:
            return report | {"refused": str(refused)}
    result, measured = measure(lambda: analysis(t, spec["analysis"], spec["contender"]).compute())
    values = np.asarray(getattr(result, "values", result))
    np.save(spec["save"], values)
    return report | measured


# --- in the launcher -------------------------------------------------------------------------------


def launch(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        done = run_fresh("benchmarks.analyses", spec, timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    report = marked_report(done.stdout, RESULT_MARK)
    if done.returncode != 0 or report is None:
        lines = [s for s in done.stderr.strip().splitlines() if s.strip()]
        return {"error": (lines[-1] if lines else f"exit status {done.returncode}")[:300]}
    return report


def run(args: argparse.Namespace, echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every (layout, analysis, contender), rounds interleaved; one row per case with its runs."""
    shape = args.shape
    scratch = args.data_dir / "analyses-results"
    scratch.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for layout in args.layouts:
        path = ensure_data(layout, shape, args.data_dir, echo)
        echo(f"{layout}: warming the page cache ({warm(path) / 2**20:,.0f} MiB)")
        cases = [
            {"layout": layout, "analysis": name, "contender": contender, "runs": []}
            for name in args.analyses
            for contender in args.contenders
        ]
        rows.extend(cases)
        for repeat in range(args.repeats):
            for case in cases:
                if case.get("failed"):
                    continue
                spec = {
                    "path": str(path), "shape": shape, "threads": args.threads, "analysis": case["analysis"],
                    "contender": case["contender"],
                    "save": str(scratch / f"{layout}-{case['analysis']}-{case['contender'].replace(' ', '-')}.npy"),
                }  # fmt: skip
                if case["contender"] == TIGHT:
                    competent = _peak(_case(cases, case["analysis"], XARRAY))
                    if competent is None:
                        case["failed"] = "no competent xarray peak to take a quarter of"
                        continue
                    spec["budget"] = max(2**20, int(competent // 4))
                report = launch(spec, args.timeout)
                label = f"[{repeat + 1}/{args.repeats}] {layout} {case['analysis']} {case['contender']}"
                if "error" in report or "refused" in report:
                    case["failed"] = report.get("error") or "refused: " + report["refused"]
                    echo(f"  {label}: {case['failed'][:200]}")
                    continue
                report["budget_given"] = spec.get("budget")
                case["runs"].append(report)
                echo(
                    f"  {label}: {report['seconds']:.2f} s, {report['peak_above_start'] / 2**20:,.0f} MiB"
                    + (f" (projected {report['projected'] / 2**20:,.0f})" if "projected" in report else "")
                )
                if repeat == 0 and case["contender"] != XARRAY:
                    theirs = scratch / f"{layout}-{case['analysis']}-{XARRAY}.npy"
                    if theirs.exists():
                        case["check"] = compare_results(np.load(theirs), np.load(spec["save"]))
    return rows


def _case(cases: list[dict[str, Any]], name: str, contender: str) -> dict[str, Any] | None:
    return next((c for c in cases if c["analysis"] == name and c["contender"] == contender), None)


def _median(case: dict[str, Any] | None, key: str) -> float | None:
    values = [r[key] for r in (case or {}).get("runs", []) if r.get(key) is not None]
    return statistics.median(values) if values else None


def _peak(case: dict[str, Any] | None) -> float | None:
    return _median(case, "peak_above_start")


def table(rows: list[dict[str, Any]]) -> str:
    """One markdown table per layout: time, peak and projection per contender, ratios to the competent xarray."""
    out = []
    for layout in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == layout]
        fmt, days = LAYOUTS[layout]
        out.append(f"\n**{'NetCDF-4' if fmt == 'netcdf' else 'Zarr v3 (zstd)'}, {days} day(s) per storage chunk**\n")
        out.append("| analysis | contender | time | peak | time / xarray | peak / xarray | projected / peak | result |")
        out.append("|---|---|---|---|---|---|---|---|")
        for row in mine:
            base = _case(mine, row["analysis"], XARRAY)
            seconds, peak = _median(row, "seconds"), _peak(row)
            if seconds is None or peak is None:
                out.append(
                    f"| {row['analysis']} | {row['contender']} | {row.get('failed', 'no run')[:120]} | | | | | |"
                )
                continue
            base_seconds, base_peak = _median(base, "seconds"), _peak(base)
            projected = _median(row, "projected")
            budget = _median(row, "budget_given")
            peak_text = f"{peak / 2**20:,.0f} MiB" + (f" (budget {budget / 2**20:,.0f})" if budget else "")
            out.append(
                f"| {row['analysis']} | {row['contender']} | {seconds:.2f} s | {peak_text} | "
                f"{_ratio(seconds, base_seconds)} | {_ratio(peak, base_peak)} | "
                f"{_ratio(projected, peak)} | {row.get('check', '') if row['contender'] != XARRAY else 'oracle'} |"
            )
    return "\n".join(out)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.analyses", description=__doc__.split("\n")[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--shape", default=",".join(map(str, SHAPE)), help="time,lat,lon (default %(default)s)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="of %(default)s")
    parser.add_argument("--analyses", default=",".join(ANALYSES), help="of %(default)s")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="of %(default)s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--data-dir", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--json", type=Path, help="write every run and the machine here")
    args = parser.parse_args(argv)
    if args.one:
        return args
    args.shape = tuple(int(n) for n in args.shape.split(","))
    for name, known in (("layouts", LAYOUTS), ("analyses", ANALYSES), ("contenders", CONTENDERS)):
        chosen = [s.strip() for s in getattr(args, name).split(",") if s.strip()]
        unknown = [s for s in chosen if s not in known]
        if unknown:
            parser.error(f"--{name}: {unknown[0]!r} is not one of {', '.join(known)}")
        setattr(args, name, chosen)
    if TIGHT in args.contenders and XARRAY not in args.contenders:
        parser.error("--contenders: 'daskstream tight' takes a quarter of 'xarray''s peak; list xarray too")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(RESULT_MARK + json.dumps(run_one(json.loads(args.one))), flush=True)
        return 0

    def echo(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    command = "python -m benchmarks.analyses " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = run(args, echo)
    size = math.prod(args.shape) * 4
    print(f"`{command}` ({args.threads} threads; field {args.shape} float32, {size / 2**20:,.0f} MiB; medians of "
          f"{args.repeats} runs, each in a fresh process, contenders interleaved)")  # fmt: skip
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(args.threads), "command": command, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
