"""``daskstream reduce`` and ``daskstream describe``: a reduction or one-pass statistics of a file."""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np

import daskstream as ds
from daskstream.cli.app import main
from daskstream.cli.options import (
    WhereItRuns,
    adaptive_option,
    axis_option,
    compute_options,
    out_option,
    plain_json,
    range_option,
    storage_option,
    within_int64,
)
from daskstream.cli.output import (
    format_exact,
    histogram_lines,
    result_lines,
    table_lines,
    write_arrays,
)
from daskstream.cli.running import measured, opened_in_session
from daskstream.compute.describe import QUARTILES, STATISTICS
from daskstream.planning.budget import format_size


@main.command("reduce")
@click.argument("path")
@click.option(
    "--op", required=True, help="sum, mean, var, std, min, max, median, quantile, ... (see daskstream.reduce)."
)
@axis_option("Axis to reduce")
@click.option("--q", type=float, multiple=True, help="Quantile in [0, 1] for --op quantile; repeat for several.")
@click.option(
    "--ddof",
    type=click.IntRange(min=0),
    callback=within_int64,
    default=0,
    show_default=True,
    help="Delta degrees of freedom for var and std: the divisor is the count minus DDOF.",
)
@click.option("--bins", type=int, default=None, help="Bin count for --op histogram (default 10).")
@range_option("found in an extra pass")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@out_option
@adaptive_option
@compute_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@storage_option
def reduce_command(
    path: str,
    op: str,
    axis: tuple[str, ...],
    q: tuple[float, ...],
    ddof: int,
    bins: int | None,
    bin_range: tuple[float, float] | None,
    dataset: str | None,
    out: str | None,
    adaptive: bool,
    where: WhereItRuns,
    as_json: bool,
    storage_options: dict[str, Any],
) -> None:
    """Reduce a source with one operation and print the result.

    A number is printed in full; an array is summarised (shape, dtype, least,
    mean and largest value, and its values when there are few) and written
    whole with --out; a histogram is printed as a table of bins.

    \b
    Examples:
      daskstream reduce field.zarr --op mean
      daskstream reduce scan.h5::/t --op mean --axis 0 --out mean.npy
      daskstream reduce field.zarr --op quantile --q 0.05 --q 0.95
      daskstream reduce field.zarr --op histogram --bins 20

    JSON keys: op, axis, result (a number or nested lists; for histogram
    [counts, edges]), seconds, bytes_read (decoded bytes the tasks read; more
    than the array's size when the operation passes over it several times),
    passes (over the data, as planned), scheduler, out (the file written, or
    null), GBps (bytes read a second), limit (the source codec's decode limit
    on this machine for the threads used: codec, GBps, share of it reached;
    null where it is not known); with --adaptive, adaptive (what was tried,
    chosen and why).
    """

    # A suffix daskstream cannot write, or a .npy file for a histogram's two arrays, is refused before reading.
    out_names = ["counts", "edges"] if op == "histogram" else [op]
    options: dict[str, Any] = {"ddof": ddof}
    if q:
        options["q"] = q[0] if len(q) == 1 else list(q)
    if op == "histogram":
        options.update(bins=10 if bins is None else bins, range=bin_range)
    with opened_in_session(
        path,
        where,
        dataset=dataset,
        storage_options=storage_options,
        out=out,
        out_names=out_names,
    ) as opened:
        x, s = opened.array, opened.session
        axes = opened.axes(axis, path)
        adaptation = None
        if adaptive:
            run = ds.reduce(x, op, axis=axes or None, adaptive=True, progress=not where.quiet, **options)
            passes = 1
            done = measured(opened, run.compute)
            value = done.value
            adaptation = run.adaptation
        else:
            result = ds.reduce(x, op, axis=axes or None, **options)
            collections = tuple(result) if op == "histogram" else (result,)
            passes = ds.plan_compute(*collections).passes
            # The bar sets its rate beside the codec's limit once one is remembered (measured after a first run).
            limit = opened.bar_limit()
            done = measured(opened, lambda: s.compute(*collections, label=f"{op} of {path}", limit=limit))
            value = list(done.value) if op == "histogram" else done.value[0]
    seconds = done.seconds
    # A rate set beside the codec's limit where the read was long enough to say more than its overheads.
    at = done.rate()
    written = None
    if out is not None:
        arrays = {"counts": value[0], "edges": value[1]} if op == "histogram" else {op: value}
        written = write_arrays(out, arrays, opened.reads)
    if as_json:
        shown = [plain_json(v) for v in value] if op == "histogram" else plain_json(value)
        report = {
            "op": op,
            "axis": list(axes) or None,
            "result": shown,
            "seconds": seconds,
            "bytes_read": done.bytes_read,
            "passes": passes,
            "scheduler": s.cluster_file or s.scheduler,
            "out": out,
            **at.json(),
        }
        if adaptation is not None:
            report["adaptive"] = adaptation.to_dict()
        click.echo(json.dumps(report))
        return
    read = "" if done.bytes_read is None else f", {format_size(done.bytes_read)} read in {passes} pass(es)"
    read += at.text()
    over = f"axis {', '.join(map(str, axes))}" if axes else "all axes"
    if op == "histogram":
        lines = histogram_lines(*value)
    elif op == "quantile" and len(q) > 1 and np.ndim(value) == 1:
        lines = table_lines(["q", "value"], [[str(one), format_exact(v)] for one, v in zip(q, value)])
    else:
        lines = result_lines(value, name=op, written=out is not None)
    if len(lines) == 1:
        click.echo(f"{op} over {over} of {path}: {lines[0]} ({seconds:.2f} s{read})")
    else:
        click.echo(f"{op} over {over} of {path} ({seconds:.2f} s{read}):")
        for line in lines:
            click.echo(f"  {line}")
    if written is not None:
        click.echo(written)
    if adaptation is not None:
        click.echo(adaptation.explain())


@main.command("describe")
@click.argument("path")
@axis_option("Axis to reduce")
@click.option("--bins", type=int, default=None, help="Also a histogram with this many bins.")
@range_option("which takes a second pass")
@click.option(
    "--quartiles",
    is_flag=True,
    help="Also the exact 25th, 50th and 75th percentiles (2 to 4 more passes over the data, by its dtype).",
)
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@out_option
@adaptive_option
@compute_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@storage_option
def describe_command(
    path: str,
    axis: tuple[str, ...],
    bins: int | None,
    bin_range: tuple[float, float] | None,
    quartiles: bool,
    dataset: str | None,
    out: str | None,
    adaptive: bool,
    where: WhereItRuns,
    as_json: bool,
    storage_options: dict[str, Any],
) -> None:
    """Count, NaN count, mean, std, min and max of a source in one pass; quartiles and a histogram on request.

    Prints a table: what was described (name, shape, dtype, axes), each
    statistic (over some axes: its shape and range), the histogram's bins.
    With --out, writes every statistic (and the histogram) to a file.

    \b
    Examples:
      daskstream describe field.zarr
      daskstream describe field.zarr --bins 20 --quartiles
      daskstream describe scan.h5::/t --axis 0 --out stats.zarr

    JSON keys: name, shape, dtype, axes (reduced), then the statistics
    (numbers, or nested lists over the kept axes); with --adaptive, adaptive
    (what was tried, chosen and why).
    """

    # The names are those the description will have.
    out_names = [*STATISTICS, *(QUARTILES if quartiles else ()), *(("histogram", "bin_edges") if bins else ())]
    adaptation = None
    options: dict[str, Any] = {"bins": bins, "range": bin_range}
    with opened_in_session(
        path,
        where,
        dataset=dataset,
        storage_options=storage_options,
        out=out,
        out_names=out_names,
    ) as opened:
        options["axis"] = opened.axes(axis, path) or None
        if adaptive:
            run = ds.describe(opened.array, **options, quartiles=quartiles, adaptive=True, progress=not where.quiet)
            description = run.compute()
            adaptation = run.adaptation
        else:
            described = ds.describe(opened.array, **options, quartiles=quartiles)
            (description,) = opened.session.compute(described, label=f"describe {path}", limit=opened.bar_limit())
    written = None
    if out is not None:
        written = write_arrays(out, dict(description), opened.reads)
    if as_json:
        report: dict[str, Any] = {
            "name": description.name,
            "shape": description.shape,
            "dtype": None if description.dtype is None else str(description.dtype),
            "axes": description.axes,
        }
        report.update((key, plain_json(value)) for key, value in description.items())
        if adaptation is not None:
            report["adaptive"] = adaptation.to_dict()
        click.echo(json.dumps(report))
        return
    click.echo(repr(description))
    if written is not None:
        click.echo(written)
    if adaptation is not None:
        click.echo(adaptation.explain())
