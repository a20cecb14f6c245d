"""``daskstream info``: what a file holds and how daskstream reads it; the versions of its dependencies."""

from __future__ import annotations

import json
from typing import Any

import click

import daskstream as ds
from daskstream import dependencies
from daskstream.cli.app import main, versions_facts
from daskstream.cli.options import source_facts, storage_option, url_options
from daskstream.planning.budget import format_size
from daskstream.sources.objects.places import is_url


@main.command()
@click.argument("path", required=False)
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--versions", is_flag=True, help="Print the versions of daskstream's dependencies (for bug reports) instead."
)
@storage_option
def info(path: str | None, dataset: str | None, as_json: bool, versions: bool, storage_options: dict[str, Any]) -> None:
    """Show a source's format, shape, dtype, storage chunks, layout, size and codecs.

    For a file or store of several arrays (and no --dataset): its tree of groups and arrays, each with
    its shape, dtype, chunks, codecs, size, dimension names and first attributes.

    With --versions (and no PATH): the versions of daskstream's dependencies and which optional
    features are usable.

    \b
    Examples:
      daskstream info scan.h5
      daskstream info scan.h5::/entry/data --json
      daskstream info s3://bucket/field.zarr --storage-option anon=true
    """
    if versions:
        if as_json:
            click.echo(json.dumps(versions_facts(), indent=2))
        else:
            click.echo(dependencies.report())
        return
    if path is None:
        raise click.UsageError("give the PATH of a file to describe, or --versions")
    if dataset is None and "::" not in path and not is_url(path):
        tree = ds.list(path)
        if len(tree.arrays) != 1:
            # A file of several arrays (or none): its tree, each array with what ds.open(path, dataset=...) takes.
            click.echo(json.dumps(tree.to_dict(), indent=2) if as_json else tree.text())
            return
    source = ds.open_source(path, dataset=dataset, storage_options=url_options(storage_options, path))
    facts = {**source_facts(source), "nbytes": source.nbytes, "storage": source.describe_storage()}
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        shown = format_size(value) if key == "nbytes" else value
        click.echo(f"{key:<15} {shown}")
