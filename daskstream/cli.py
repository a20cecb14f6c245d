"""The ``daskstream`` command: a thin layer over the Python API."""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import click

from daskstream.errors import DaskstreamError


class _Group(click.Group):
    """Turns daskstream's own errors into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DaskstreamError as exc:
            click.echo(f"daskstream: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="daskstream")
def main() -> None:
    """Out-of-core arrays from .npy, HDF5 and Zarr files, with storage-aligned chunks."""


@main.command()
@click.option("--size", default="256MiB", show_default=True, help="Size of the sample data set.")
@click.option("--dir", "folder", default=None, help="Where to write it (default: a temporary folder, removed after).")
@click.option("--formats", default="npy,hdf5,zarr", show_default=True, help="Comma-separated formats to demo.")
def demo(size: str, folder: str | None, formats: str) -> None:
    """Write a sample data set, open it, print the chunk plan and a timed reduction."""
    from daskstream.demo import FORMATS, run_demo

    chosen = tuple(f.strip() for f in formats.split(",") if f.strip())
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown:
        raise click.BadParameter(
            f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}", param_hint="--formats"
        )
    if folder is not None:
        run_demo(folder, size=size, formats=chosen, echo=click.echo)
        return
    with tempfile.TemporaryDirectory(prefix="daskstream-demo-") as tmp:
        run_demo(tmp, size=size, formats=chosen, echo=click.echo)


@main.command()
@click.argument("path")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def info(path: str, dataset: str | None, as_json: bool) -> None:
    """Show a source's format, shape, dtype, storage chunks, layout, size and codecs."""
    import daskstream as ds
    from daskstream.planning.budget import format_size

    source = ds.open_source(path, dataset=dataset)
    facts = {**_source_facts(source), "nbytes": source.nbytes, "storage": source.describe_storage()}
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        shown = format_size(value) if key == "nbytes" else value
        click.echo(f"{key:<15} {shown}")


@main.command("reduce")
@click.argument("path")
@click.option(
    "--op", required=True, help="sum, mean, var, std, min, max, median, quantile, ... (see daskstream.reduce)."
)
@click.option("--axis", type=int, multiple=True, help="Axis to reduce; repeat for several (default: all).")
@click.option("--q", type=float, multiple=True, help="Quantile in [0, 1] for --op quantile; repeat for several.")
@click.option("--ddof", type=int, default=0, show_default=True, help="Delta degrees of freedom for var and std.")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option("--memory-budget", default=None, help='Bytes one worker may use, e.g. "2GiB".')
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def reduce_command(
    path: str,
    op: str,
    axis: tuple[int, ...],
    q: tuple[float, ...],
    ddof: int,
    dataset: str | None,
    memory_budget: str | None,
    as_json: bool,
) -> None:
    """Reduce a source with one operation and print the result."""
    import time

    import daskstream as ds

    x = ds.open(path, dataset=dataset, memory_budget=memory_budget)
    options: dict[str, Any] = {"ddof": ddof, "memory_budget": memory_budget}
    if q:
        options["q"] = q[0] if len(q) == 1 else list(q)
    start = time.perf_counter()
    result = ds.reduce(x, op, axis=axis or None, **options)
    value = (
        [part.compute() if hasattr(part, "compute") else part for part in result]
        if op == "histogram"
        else result.compute()
    )
    seconds = time.perf_counter() - start
    if as_json:
        shown = [_plain(v) for v in value] if op == "histogram" else _plain(value)
        click.echo(json.dumps({"op": op, "axis": list(axis) or None, "result": shown, "seconds": seconds}))
        return
    click.echo(f"{op} over {list(axis) if axis else 'all axes'} of {path}: {value} ({seconds:.2f} s)")


@main.command("describe")
@click.argument("path")
@click.option("--axis", type=int, multiple=True, help="Axis to reduce; repeat for several (default: all).")
@click.option("--bins", type=int, default=None, help="Also a histogram with this many bins (needs --range).")
@click.option("--range", "bin_range", type=float, nargs=2, default=None, help="Low and high edge of the histogram.")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option("--memory-budget", default=None, help='Bytes one worker may use, e.g. "2GiB".')
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def describe_command(
    path: str,
    axis: tuple[int, ...],
    bins: int | None,
    bin_range: tuple[float, float] | None,
    dataset: str | None,
    memory_budget: str | None,
    as_json: bool,
) -> None:
    """Count, NaN count, mean, std, min and max (and a histogram) of a source, in one pass."""
    import daskstream as ds

    x = ds.open(path, dataset=dataset, memory_budget=memory_budget)
    description = ds.describe(x, axis=axis or None, bins=bins, range=bin_range, memory_budget=memory_budget).compute()
    if as_json:
        click.echo(json.dumps({key: _plain(value) for key, value in description.items()}))
        return
    click.echo(repr(description))


def _source_facts(source: Any) -> dict[str, Any]:
    """What a source is, for the commands that describe one."""
    return {
        "path": source.path,
        "dataset": source.dataset,
        "format": source.format,
        "shape": source.shape,
        "dtype": str(source.dtype),
        "storage_chunks": source.storage_chunks,
        "layout": source.layout,
    }


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON-ready numbers and nested lists."""
    import numpy as np

    return np.asarray(value).tolist()


@main.command()
@click.argument("path")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option("--memory-budget", default=None, help='Bytes one worker may use, e.g. "2GiB".')
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def plan(path: str, dataset: str | None, memory_budget: str | None, as_json: bool) -> None:
    """Show a source's shape, storage and the chunk plan for it, with the reasons."""
    import daskstream as ds

    source = ds.open_source(path, dataset=dataset)
    chunk_plan = source.plan(memory_budget=memory_budget)
    if not as_json:
        click.echo(repr(source))
        click.echo(chunk_plan.explain())
        return
    click.echo(
        json.dumps(
            {
                **_source_facts(source),
                "chunks": chunk_plan.chunks,
                "chunk_bytes": chunk_plan.chunk_bytes,
                "n_tasks": chunk_plan.n_tasks,
                "read_amplification": chunk_plan.read_amplification,
                "projected_peak_bytes": chunk_plan.projected_peak_bytes,
                "memory_budget": chunk_plan.memory_budget,
            },
            indent=2,
        )
    )


@main.command("store")
@click.argument("source")
@click.argument("target")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member of SOURCE (or write SOURCE::NAME).")
@click.option("--target-dataset", default=None, help="Dataset or member to write in TARGET (or TARGET::NAME).")
@click.option("--overwrite", is_flag=True, help="Replace an array already at TARGET.")
@click.option("--no-resume", "resume", flag_value=False, default=True, help="Refuse to finish an interrupted store.")
@click.option("--compressor", default="default", show_default=True, help='"default", "none", or an HDF5 filter name.')
@click.option(
    "--zarr-format", type=click.Choice(["2", "3"]), default="3", show_default=True, help="Format of a new Zarr array."
)
@click.option("--memory-budget", default=None, help='Bytes one worker may use, e.g. "2GiB".')
@click.option("--quiet", is_flag=True, help="Print no progress on stderr.")
def store(
    source: str,
    target: str,
    dataset: str | None,
    target_dataset: str | None,
    overwrite: bool,
    resume: bool,
    compressor: str,
    zarr_format: str,
    memory_budget: str | None,
    quiet: bool,
) -> None:
    """Copy SOURCE (.npy, HDF5 or Zarr) to TARGET (Zarr or HDF5) out of core; run it again to resume."""
    import daskstream as ds

    x = ds.open(source, dataset=dataset, memory_budget=memory_budget)
    ds.store(
        x,
        target,
        dataset=target_dataset,
        resume=resume,
        overwrite=overwrite,
        compressor=None if compressor == "none" else compressor,
        zarr_format=int(zarr_format),
        memory_budget=memory_budget,
        progress=not quiet,
    )


@main.command()
@click.argument("source")
@click.argument("target")
@click.option("--codec", type=click.Choice(["zstd", "lz4", "gzip", "none"]), default="zstd", show_default=True)
@click.option("--level", type=int, default=3, show_default=True, help="Compression level of the codec.")
@click.option(
    "--chunks",
    default="auto",
    show_default=True,
    help='"auto" (the planner), "storage", or sizes per axis like 256,1024.',
)
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member of SOURCE (or write SOURCE::NAME).")
@click.option("--overwrite", is_flag=True, help="Replace an array already at TARGET.")
@click.option("--memory-budget", default=None, help='Bytes one worker may use, e.g. "2GiB".')
@click.option("--quiet", is_flag=True, help="Print no progress on stderr.")
def convert(
    source: str,
    target: str,
    codec: str,
    level: int,
    chunks: str,
    dataset: str | None,
    overwrite: bool,
    memory_budget: str | None,
    quiet: bool,
) -> None:
    """Re-encode SOURCE into a Zarr store or an HDF5 dataset (TARGET::/name) with new chunks and codec."""
    import daskstream as ds
    from daskstream.compute.store import target_format

    spec: Any = chunks
    if chunks not in ("auto", "storage"):
        try:
            spec = tuple(int(part) for part in chunks.split(","))
        except ValueError:
            raise click.BadParameter(
                f"{chunks!r}: give auto, storage or integers like 256,1024", param_hint="--chunks"
            ) from None
    x = ds.open(source, dataset=dataset, chunks=spec, memory_budget=memory_budget)
    hdf5 = target_format(target.partition("::")[0]) == "hdf5"
    ds.store(
        x,
        target,
        overwrite=overwrite,
        compressor=_compressor(codec, level, hdf5),
        memory_budget=memory_budget,
        progress=not quiet,
    )


def _compressor(codec: str, level: int, hdf5: bool) -> Any:
    """The codec named on the command line, in the target format's own terms."""
    if codec == "none":
        return None
    if hdf5:
        if codec == "gzip":
            return {"compression": "gzip", "compression_opts": level, "shuffle": True}
        try:
            import hdf5plugin
        except ImportError:
            raise click.UsageError(
                f"--codec {codec} for HDF5 needs the hdf5plugin filters: pip install 'daskstream[hdf5plugin]'"
            ) from None
        return {
            "zstd": hdf5plugin.Zstd(clevel=level),
            "lz4": hdf5plugin.Blosc(cname="lz4", clevel=level, shuffle=hdf5plugin.Blosc.SHUFFLE),
        }[codec]
    import zarr.codecs

    return {
        "zstd": zarr.codecs.ZstdCodec(level=level),
        "lz4": zarr.codecs.BloscCodec(cname="lz4", clevel=level, shuffle="shuffle"),
        "gzip": zarr.codecs.GzipCodec(level=level),
    }[codec]


@main.group()
def cluster() -> None:
    """Cluster configuration files (see cluster-configs/)."""


@cluster.command("check")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def cluster_check(file: str, as_json: bool) -> None:
    """Validate a cluster YAML without starting anything; print the job script or cluster spec it makes."""
    import yaml

    from daskstream.runtime.clusters import check_cluster_config

    check = check_cluster_config(file)
    if as_json:
        click.echo(
            json.dumps(
                {"kind": check.kind, "lines": check.lines, "job_script": check.job_script, "spec": check.spec},
                default=str,
            )
        )
        return
    for line in check.lines:
        click.echo(line)
    if check.job_script:
        click.echo("\n" + check.job_script)
    if check.spec:
        click.echo("\n" + yaml.safe_dump(check.spec, sort_keys=False))
