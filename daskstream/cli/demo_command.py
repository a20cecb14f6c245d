"""``daskstream demo``: a sample field written, opened, planned and reduced in each format."""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import click

from daskstream.cli.app import main
from daskstream.cli.options import make_folder
from daskstream.demo import FORMATS, run_demo
from daskstream.planning.budget import format_size, parse_budget


@main.command()
@click.option("--size", default="256MiB", show_default=True, help="Size of the sample data set.")
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, writable=True),
    metavar="FOLDER",
    default=None,
    help="Folder to write it in, made if missing (default: a temporary folder, removed after).",
)
@click.option("--formats", default="npy,hdf5,zarr", show_default=True, help="Comma-separated formats to demo.")
def demo(size: str, folder: str | None, formats: str) -> None:
    """Write a sample data set, open it, print the chunk plan and a timed reduction."""

    chosen = tuple(f.strip() for f in formats.split(",") if f.strip())
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown:
        raise click.BadParameter(
            f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}", param_hint="'--formats'"
        )
    if folder is not None:
        _check_room(folder, size, len(chosen))
        make_folder(folder, "--dir")
        run_demo(folder, size=size, formats=chosen, echo=click.echo)
        return
    with tempfile.TemporaryDirectory(prefix="daskstream-demo-") as tmp:
        _check_room(tmp, size, len(chosen))
        run_demo(tmp, size=size, formats=chosen, echo=click.echo)


def _check_room(folder: str, size: str, n_formats: int) -> None:
    """Refuse a demo --size that the folder's disk cannot hold, before writing any of it.

    Each format writes up to ``size`` bytes (the compressed ones less); a size
    beyond the free space would fail part way, or at once past the largest file
    the file system allows.
    """

    needed = parse_budget(size, name="size") * n_formats
    # The folder may not exist yet: its disk is the one of the nearest folder above it that does.
    existing = pathlib.Path(folder).absolute()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise click.BadParameter(
            f"{size!r} for {n_formats} format(s) needs up to {format_size(needed)} in {folder}, more than the "
            f"{format_size(free)} free there; give a smaller size or another --dir",
            param_hint="'--size'",
        )
