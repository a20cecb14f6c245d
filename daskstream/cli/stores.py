"""``daskstream store`` and ``daskstream convert``: a file written to Zarr or HDF5, resumably."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any

import click

import daskstream as ds
from daskstream.cli.app import main
from daskstream.cli.options import (
    WhereItRuns,
    adaptive_store_option,
    chunk_spec,
    cli_compressor,
    compute_options,
    inner_chunks_option,
    optimize_option,
    parsed_sizes,
    storage_option,
    target_storage_option,
    url_options,
)
from daskstream.cli.output import RateBesideLimit
from daskstream.cli.running import opened_in_session
from daskstream.cli.words import spelled
from daskstream.compute.limits import codec_limit
from daskstream.compute.store import stored_bytes, target_format
from daskstream.compute.store.codecs import CodecChoice
from daskstream.compute.store.named_codecs import HDF5_FILTER_NAMES, NAMED_CODECS
from daskstream.compute.store.result import StoreResult
from daskstream.planning.budget import format_size
from daskstream.runtime.progress import BlockProgress
from daskstream.runtime.resources import resources_for
from daskstream.sources.detect import split_dataset
from daskstream.sources.hdf5.filters import import_h5py


@main.command("store")
@click.argument("source")
@click.argument("target")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member of SOURCE (or write SOURCE::NAME).")
@click.option("--target-dataset", default=None, help="Dataset or member to write in TARGET (or TARGET::NAME).")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an array already at TARGET: the new one is written beside it and swapped in once whole.",
)
@click.option("--no-resume", "resume", flag_value=False, default=True, help="Refuse to finish an interrupted store.")
@click.option(
    "--codec",
    "--compressor",
    "compressor",
    default="default",
    show_default=True,
    help=f'"default", "none", "auto" (measured on the data: see --optimize), {", ".join(NAMED_CODECS)} (Zarr '
    f"and HDF5) or {', '.join(HDF5_FILTER_NAMES)} (HDF5).",
)
@optimize_option
@click.option(
    "--zarr-format", type=click.Choice(["2", "3"]), default="3", show_default=True, help="Format of a new Zarr array."
)
@inner_chunks_option
@adaptive_store_option
@compute_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@storage_option
@target_storage_option
def store(
    source: str,
    target: str,
    dataset: str | None,
    target_dataset: str | None,
    overwrite: bool,
    resume: bool,
    compressor: str,
    optimize: str,
    zarr_format: str,
    inner_chunks: str | None,
    adaptive: bool,
    where: WhereItRuns,
    as_json: bool,
    storage_options: dict[str, Any],
    target_storage_options: dict[str, Any],
) -> None:
    """Copy SOURCE (.npy, HDF5 or Zarr) to TARGET (Zarr or HDF5) out of core; run it again to resume.

    Prints what was written: blocks, bytes in and on disk, seconds. Once it
    has finished, running it again finds the target complete and writes nothing.

    \b
    Examples:
      daskstream store scan.h5::/t field.zarr
      daskstream store field.zarr out.h5::/field --codec gzip
      daskstream store scan.h5::/t s3://bucket/t.zarr --codec auto --optimize read
    """

    with opened_in_session(
        source,
        where,
        dataset=dataset,
        storage_options=storage_options,
    ) as opened:
        x = opened.array
        target_options = url_options(target_storage_options or storage_options, target)
        choice = None
        if compressor == "auto":
            compressor, choice = _auto_codec(
                x, target, target_dataset, overwrite, optimize, int(zarr_format), where.quiet, as_json
            )
        bar = False if where.quiet else BlockProgress(f"store {target}", int(x.nbytes))
        with spelled(dataset="--target-dataset", storage_options="--target-storage-option"):
            stored = ds.store(
                x,
                target,
                dataset=target_dataset,
                resume=resume,
                overwrite=overwrite,
                codec=None if compressor == "none" else compressor,
                optimize=optimize,
                zarr_format=int(zarr_format),
                inner_chunks=parsed_sizes(inner_chunks, "--inner-chunks"),
                progress=bar,
                storage_options=target_options,
                adaptive=adaptive,
            )
    adaptation = getattr(stored, "adaptation", None)
    _print_store_summary(stored.result, x, source, target, target_dataset, as_json, choice, target_options, adaptation)


def _auto_codec(
    x: Any,
    target: str,
    dataset: str | None,
    overwrite: bool,
    optimize: str,
    zarr_format: int,
    quiet: bool,
    as_json: bool,
) -> tuple[Any, CodecChoice | None]:
    """The codec measured for a new target (its table shown on stderr), or ``"auto"`` for store to settle
    where an array is already there (a resumed store keeps its codec; another is refused)."""
    path, member = split_dataset(target, dataset)
    kind = target_format(path)
    if kind == "zarr-url" or (not overwrite and _array_exists(path, member, kind)):
        return "auto", None  # store measures for a new array on an object store itself
    choice = ds.choose_codec(x, kind, optimize=optimize, folder=os.path.dirname(os.path.abspath(path)))
    if not quiet and not as_json:
        click.echo(str(choice), err=True)
    return choice.compressor(zarr_format), choice


def _array_exists(path: str, member: str | None, kind: str) -> bool:
    if kind != "hdf5":
        return os.path.exists(os.path.join(path, (member or "").strip("/")))
    if not os.path.exists(path):
        return False
    with contextlib.suppress(Exception), import_h5py().File(path, "r") as f:
        return (member or "/").strip("/") in f
    return True  # a file h5py cannot open: store says what is wrong with it


def _print_store_summary(
    result: StoreResult,
    x: Any,
    source: str,
    target: str,
    target_dataset: str | None,
    as_json: bool,
    choice: CodecChoice | None = None,
    storage_options: dict[str, Any] | None = None,
    adaptation: Any = None,
) -> None:
    # Named as the command was given it (a --target-dataset apart).
    done = dataclasses.replace(result, target=target)
    on_disk = stored_bytes(target, dataset=target_dataset, storage_options=storage_options)
    summary = {
        "source": source,
        "target": target,
        "blocks": done.blocks,
        "blocks_written": done.written,
        "blocks_done_before": done.done_before,
        "already_complete": done.already_complete,
        "bytes_in": int(x.nbytes),
        "bytes_stored": on_disk,
        "ratio": round(int(x.nbytes) / on_disk, 3) if on_disk else None,
        "seconds": round(done.seconds, 3),
    }
    # The rate of the blocks written in this run beside the codec's encode limit, once there is enough to say.
    at = RateBesideLimit.of(
        int(x.nbytes) * done.written // max(done.blocks, 1),
        done.seconds,
        lambda: codec_limit(
            ds.open(target, dataset=target_dataset, storage_options=storage_options),
            threads=resources_for(x).threads,
            direction="encode",
        ),
    )
    summary.update(at.json())
    if choice is not None:
        summary["codec"] = choice.to_dict()
    if adaptation is not None:
        summary["adaptive"] = adaptation.to_dict()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    elif summary["already_complete"]:
        click.echo(str(done))
    else:
        resumed = f", {done.done_before} done before" if done.done_before else ""
        ratio = f" (ratio {summary['ratio']:.2f})" if summary["ratio"] else ""
        click.echo(
            f"{source} -> {target}: {done.written} of {done.blocks} blocks written{resumed}, "
            f"{format_size(int(x.nbytes))} in, {format_size(on_disk)} on disk{ratio}, {done.seconds:.2f} s{at.text()}"
        )
    if adaptation is not None and not as_json and not summary["already_complete"]:
        click.echo(adaptation.explain())


@main.command()
@click.argument("source")
@click.argument("target")
@click.option(
    "--codec",
    type=click.Choice(["zstd", "lz4", "gzip", "none", "auto"]),
    default="zstd",
    show_default=True,
    help="auto: measured on blocks of the data for what --optimize says (the table goes to stderr).",
)
@optimize_option
@click.option(
    "--level",
    type=int,
    default=3,
    show_default=True,
    help="Compression level of the codec: zstd -131072 (fastest) to 22, lz4 and gzip 0 to 9.",
)
@click.option(
    "--chunks",
    default="auto",
    show_default=True,
    help='"auto" (the planner), "storage", or sizes per axis like 256,1024 (-1: a whole axis), rechunked out '
    "of core: each stored chunk is decoded once, through an intermediate array when the budget needs one.",
)
@click.option(
    "--intermediate",
    default=None,
    help="Folder for the intermediate array of a two-pass rechunk (default: the temporary folder); on a "
    "cluster, one every worker shares.",
)
@inner_chunks_option
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member of SOURCE (or write SOURCE::NAME).")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an array already at TARGET: the new one is written beside it and swapped in once whole.",
)
@adaptive_store_option
@compute_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@storage_option
@target_storage_option
def convert(
    source: str,
    target: str,
    codec: str,
    optimize: str,
    level: int,
    chunks: str,
    intermediate: str | None,
    inner_chunks: str | None,
    dataset: str | None,
    overwrite: bool,
    adaptive: bool,
    where: WhereItRuns,
    as_json: bool,
    storage_options: dict[str, Any],
    target_storage_options: dict[str, Any],
) -> None:
    """Re-encode SOURCE into a Zarr store or an HDF5 dataset (TARGET::/name) with new chunks and codec.

    Prints what was written, as store does; run again, it resumes or finds the target complete.

    \b
    Examples:
      daskstream convert scan.h5::/t field.zarr --chunks 64,256,256 --codec zstd --level 3
      daskstream convert field.zarr field.h5::/field --codec gzip
      daskstream convert scan.h5::/t field.zarr --codec auto
    """

    spec = chunk_spec(chunks)
    # Built (and its level checked) before anything is read or written.
    compressor = (
        "auto"
        if codec == "auto"
        else cli_compressor(codec, level, hdf5=target_format(target.partition("::")[0]) == "hdf5")
    )
    target_options = url_options(target_storage_options or storage_options, target)
    # Other chunks than the planner's: rechunked out of core, each stored chunk decoded once.
    rechunked = isinstance(spec, tuple)
    with opened_in_session(
        source,
        where,
        dataset=dataset,
        storage_options=storage_options,
        chunks="auto" if rechunked else spec,
        prepare=(lambda opened: ds.rechunk(opened, spec, intermediate=intermediate)) if rechunked else None,
    ) as opened:
        x = opened.array
        choice = None
        if codec == "auto":
            compressor, choice = _auto_codec(x, target, None, overwrite, optimize, 3, where.quiet, as_json)
        bar = False if where.quiet else BlockProgress(f"convert {source} -> {target}", int(x.nbytes))
        # The target's options, as the convert command names them.
        with spelled(storage_options="--target-storage-option"):
            stored = ds.store(x, target, overwrite=overwrite, codec=compressor, optimize=optimize, progress=bar,
                              inner_chunks=parsed_sizes(inner_chunks, "--inner-chunks"), storage_options=target_options,
                              adaptive=adaptive)  # fmt: skip
    adaptation = getattr(stored, "adaptation", None)
    _print_store_summary(stored.result, x, source, target, None, as_json, choice, target_options, adaptation)
