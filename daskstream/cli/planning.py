"""``daskstream plan`` and ``daskstream tune``: the chunk plan of a file, planned or measured."""

from __future__ import annotations

import json
from typing import Any

import click
import dask.config

import daskstream as ds
from daskstream.cli.app import main
from daskstream.cli.options import (
    axes_named,
    axis_option,
    budget_option,
    session_if_asked,
    source_facts,
    storage_option,
    url_options,
    where_options,
    within_int64,
)
from daskstream.cli.words import in_cli_words
from daskstream.tuning import TuneCache, tune


@main.command()
@click.argument("path")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@budget_option
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    callback=within_int64,
    default=None,
    help="Threads per worker to plan for.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    callback=within_int64,
    default=None,
    help="Worker processes to plan for.",
)
@where_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@storage_option
def plan(
    path: str,
    dataset: str | None,
    memory_budget: str | None,
    threads: int | None,
    workers: int | None,
    scheduler: str | None,
    cluster_file: str | None,
    as_json: bool,
    storage_options: dict[str, Any],
) -> None:
    """Show a source's shape, storage and the chunk plan for it, with the reasons.

    Plans for this machine's threads, or for the workers of --scheduler or
    --cluster (which are started or joined to ask them); --budget, --threads
    and --workers override what was found.

    \b
    Examples:
      daskstream plan field.zarr
      daskstream plan scan.h5::/t --budget 2GiB --threads 8
      daskstream plan field.zarr --scheduler processes --json
    """

    source = ds.open_source(path, dataset=dataset, storage_options=url_options(storage_options, path))
    with session_if_asked(scheduler, cluster_file, None):
        chunk_plan = ds.plan(source, memory_budget=memory_budget, threads=threads, workers=workers)
    if not as_json:
        click.echo(repr(source))
        # Its advice (raise memory_budget...) in this command's flags.
        click.echo(in_cli_words(chunk_plan.explain(), click.get_current_context().command))
        return
    click.echo(
        json.dumps(
            {
                **source_facts(source),
                "chunks": chunk_plan.chunks,
                "chunk_bytes": chunk_plan.chunk_bytes,
                "n_tasks": chunk_plan.n_tasks,
                "read_amplification": chunk_plan.read_amplification,
                "projected_peak_bytes": chunk_plan.projected_peak_bytes,
                "memory_budget": chunk_plan.memory_budget,
                "threads": chunk_plan.threads,
                "workers": chunk_plan.workers,
            },
            indent=2,
        )
    )


@main.command("tune")
@click.argument("path", required=False)
@click.option("--op", default="sum", show_default=True, help='Reduction to tune for, or "describe".')
@axis_option("Axis the reduction removes")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option(
    "--time-budget", default=None, help='Longest time to measure, e.g. "10s" (default: daskstream.tune.time-budget).'
)
@click.option(
    "--sample-fraction",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Largest share of the array's bytes measuring may read, e.g. 0.3 (default: daskstream.tune.sample-fraction).",
)
@click.option(
    "--cost-fraction",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Largest share of one full run measuring may take, e.g. 0.2 (default: daskstream.tune.cost-fraction).",
)
@click.option("--refresh", is_flag=True, help="Measure again even when a result is remembered.")
@click.option("--clear", is_flag=True, help="Empty the tuning cache (and tune PATH afterwards, when given).")
@where_options
@budget_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def tune_command(
    path: str | None,
    op: str,
    axis: tuple[str, ...],
    dataset: str | None,
    time_budget: str | None,
    sample_fraction: float | None,
    cost_fraction: float | None,
    refresh: bool,
    clear: bool,
    scheduler: str | None,
    cluster_file: str | None,
    memory_budget: str | None,
    as_json: bool,
) -> None:
    """Measure chunk shapes for PATH on this machine, print the candidates and the winner, and remember it.

    A later `daskstream.open(..., chunks="tune")` of the same kind of data
    (format, codecs, storage chunks, dtype) on this machine uses the winner
    without measuring. --clear empties the remembered results.

    \b
    Examples:
      daskstream tune field.zarr --op sum
      daskstream tune scan.h5::/t --op describe --time-budget 30s
      daskstream tune --clear
    """

    if clear:
        cache = TuneCache()
        removed = cache.clear()
        click.echo(f"removed {removed} remembered result(s) from {cache.path}", err=as_json or path is not None)
    if path is None:
        if not clear:
            raise click.UsageError("give PATH to tune, or --clear")
        return
    fractions = {
        f"daskstream.tune.{name}": value
        for name, value in (("sample-fraction", sample_fraction), ("cost-fraction", cost_fraction))
        if value is not None
    }
    source = ds.open_source(path, dataset=dataset)
    axes = axes_named(axis, source.dims, source.ndim, source.name)
    with dask.config.set(fractions), session_if_asked(scheduler, cluster_file, memory_budget):
        result = tune(
            path,
            op=op,
            axis=axes or None,
            dataset=dataset,
            memory_budget=memory_budget,
            time_budget=time_budget,
            refresh=refresh,
        )
    click.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json else str(result))
