"""The ``daskstream`` command: a thin layer over the Python API.

(Longer than most modules: every command, each a thin function over the API with
its options and its one-line errors, in one place so that their options, help
texts and exit codes stay alike.)
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, NoReturn

import click
import dask.config
import numpy as np
import yaml

import daskstream as ds
from daskstream import dependencies
from daskstream.cli.output import (
    check_out,
    format_exact,
    histogram_lines,
    out_format,
    result_lines,
    table_lines,
    write_arrays,
)
from daskstream.cli.words import in_cli_words, spelled
from daskstream.compute.describe import QUARTILES, STATISTICS
from daskstream.compute.limits import LIMIT_SHOWN_FROM_BYTES, codec_limit
from daskstream.compute.store import stored_bytes, target_format
from daskstream.compute.store.codecs import OBJECTIVES, CodecChoice
from daskstream.compute.store.named_codecs import HDF5_FILTER_NAMES, NAMED_CODECS, named_codec
from daskstream.demo import FORMATS, run_demo
from daskstream.errors import DaskstreamError, DaskstreamWarning
from daskstream.graph.layers import places_read
from daskstream.planning.budget import format_size, parse_budget
from daskstream.runtime.allocator import cap_malloc_arenas
from daskstream.runtime.clusters import check_cluster
from daskstream.runtime.metering import ReadMeter
from daskstream.runtime.progress import BlockProgress, close_open_bars
from daskstream.runtime.resources import resources_for
from daskstream.runtime.stopping import Interrupted, stop_child_processes, stopping_on_signals
from daskstream.sources.detect import split_dataset
from daskstream.sources.hdf5 import import_h5py
from daskstream.sources.objects import is_url
from daskstream.tuning import TuneCache, tune

# The largest value a numpy index holds: no axis, chunk or count can be longer.
_INT64_MAX = 2**63 - 1

# Compression levels each codec of `convert` takes; the same for Zarr and HDF5 targets.
# zstd: from ZSTD_minCLevel() = -131072 (negative levels trade ratio for speed) to ZSTD_maxCLevel() = 22,
# as numcodecs' Zstd and hdf5plugin.Zstd document. lz4 is Blosc's lz4 compressor, whose clevel is 0 (stored
# uncompressed) to 9. gzip (deflate, as in zarr's GzipCodec and h5py's gzip filter): 0 to 9.
_CODEC_LEVELS = {"zstd": (-131072, 22), "lz4": (0, 9), "gzip": (0, 9)}


class _OneLineError(click.ClickException):
    """A click error (unknown option, missing argument, bad value...) shown as one line.

    click shows usage errors as four lines (usage, a hint, a blank line, the
    error); daskstream's promise is one line on stderr, ``daskstream: error:
    ...``, that names the input, and a pointer to the command's ``--help``.
    """

    def __init__(self, error: click.ClickException) -> None:
        super().__init__(error.format_message())
        self.ctx: click.Context | None = getattr(error, "ctx", None)

    @classmethod
    def of(cls, error: click.ClickException) -> _OneLineError:
        """``error`` as one line, exiting with its status (click's exit_code is a class attribute)."""
        kind = _ONE_LINE_KINDS.get(error.exit_code)
        if kind is None:
            kind = _ONE_LINE_KINDS[error.exit_code] = type(cls.__name__, (cls,), {"exit_code": error.exit_code})
        return kind(error)

    def show(self, file: Any = None) -> None:
        line = _one_line(_sentence_start(self.message))
        if self.ctx is not None:
            line = f"{line} (see {self.ctx.command_path} --help)"
        click.echo(f"daskstream: error: {line}", file=file, err=file is None)


# One subclass of _OneLineError per exit status seen, made once.
_ONE_LINE_KINDS: dict[int, type[_OneLineError]] = {}

# click 8.2 raises this usage error where a bare group shows its help; 8.1 exits instead, and has no
# such class (an empty tuple catches nothing).
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


@contextlib.contextmanager
def _one_line_click_errors() -> Any:
    """Re-raise click's errors as :class:`_OneLineError`, which click then shows and exits with."""
    try:
        yield
    except _NO_ARGS_IS_HELP:
        raise  # a bare group shows its help, as click does
    except _OneLineError:
        raise
    except click.ClickException as exc:
        raise _OneLineError.of(exc) from exc


class _Command(click.Command):
    """A command whose parsing errors name it, and whose errors and warnings speak of its flags.

    Parsing errors point to the command's ``--help``; daskstream's errors
    and warnings, written for Python (``pass overwrite=True``), name the
    command's own flags (``pass --overwrite``).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_args_naming(super().parse_args, ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DaskstreamError as exc:
            _fail(exc, self)


def _parse_args_naming(parse_args: Any, ctx: click.Context, args: list[str]) -> list[str]:
    """``parse_args(ctx, args)``, with ``ctx`` set on the usage errors that click raises without one."""
    try:
        return parse_args(ctx, args)
    except click.UsageError as exc:
        # click's option parser raises some (an option missing its values) without the context.
        if exc.ctx is None:
            exc.ctx = ctx
        raise


class _Group(click.Group):
    """Turns usage errors and daskstream's own errors into one line on stderr and exit status 2.

    Applies to every command of the group and of its subgroups (``daskstream
    cluster ...``), which are of this class too. ``--help`` is shown as click
    shows it.
    """

    # Groups made with @group.group() are _Group too, so their errors read the same.
    group_class = type
    command_class = _Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_args_naming(super().parse_args, ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands with their whole first sentence, wrapped (click cuts it short with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        # The group's own options and arguments are parsed here, before any subcommand is found.
        with _one_line_click_errors():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        # Finding the subcommand, parsing its options and running it all happen in here.
        with _one_line_click_errors():
            try:
                with stopping_on_signals():
                    return super().invoke(ctx)
            except DaskstreamError as exc:
                _fail(exc, None)
            except Interrupted as exc:
                _stopped(exc, ctx.invoked_subcommand)


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases, for people to read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _fail(error: DaskstreamError, command: click.Command | None) -> NoReturn:
    """``error`` as one line on stderr, in ``command``'s words where one ran, and exit status 2."""
    flags = getattr(error, "cli_flags", None)
    click.echo(f"daskstream: error: {_one_line(in_cli_words(str(error), command, flags))}", err=True)
    sys.exit(2)


# What is kept when a command is stopped, and how to go on.
_AFTER_STOP = {
    "store": "the blocks written so far are kept: run the same command again to resume (it writes only the rest)",
    "convert": "the blocks written so far are kept: run the same command again to resume (it writes only the rest)",
    "tune": "what earlier runs remembered is kept; run the command again to tune",
    "demo": "the sample files written so far are left in --dir when one was given",
}


def _stopped(interrupted: Interrupted, command: str | None) -> NoReturn:
    """A command stopped by SIGINT or SIGTERM: one line saying what is kept, and the shell's exit status."""
    after = _AFTER_STOP.get(command or "", "nothing was written; run the command again to start over")
    # Workers of a process scheduler or a local cluster: a signal to this process alone never reaches them.
    stop_child_processes()
    close_open_bars()
    # A bar drawn but never advanced is left without its newline by tqdm: the line starts over it.
    start = "\r\x1b[K" if sys.stderr.isatty() else "\r"
    click.echo(f"{start}daskstream: stopped by {interrupted.signal_name}; {after}", err=True)
    sys.exit(interrupted.exit_status)


def _one_line(message: str) -> str:
    """``message`` on one line: its lines joined, without lines that only point (a YAML error's ``^``)."""
    lines = (line.strip() for line in message.splitlines())
    return " ".join(line for line in lines if any(char.isalnum() for char in line))


def _sentence_start(message: str) -> str:
    """click's "No such option: ..." as "no such option: ...", to follow "daskstream: error:"."""
    message = message.rstrip(".")
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        return message[0].lower() + message[1:]
    return message


def _parse_storage_options(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as fsspec options: dotted keys nest (``client_kwargs.endpoint_url=...``), values are
    JSON where they read as JSON (``anon=true``, ``retries=3``) and text otherwise."""
    options: dict[str, Any] = {}
    for item in values:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise click.BadParameter(
                f"{item!r} is not KEY=VALUE (like client_kwargs.endpoint_url=http://127.0.0.1:9000 or profile=NAME)",
                param_hint=f"'--{param.name.replace('_', '-')}'" if param.name else None,
            )
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        level = options
        for part in parts[:-1]:
            nested = level.setdefault(part, {})
            if not isinstance(nested, dict):
                raise click.BadParameter(f"{key!r} sets a key inside {part!r}, which was given a value")
            level = nested
        level[parts[-1]] = value
    return options


def _storage_option(fn: Any) -> Any:
    return click.option(
        "--storage-option",
        "storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_parse_storage_options,
        help="fsspec option for a URL (s3://, gs://...), repeatable: profile=NAME, anon=true, "
        "client_kwargs.endpoint_url=http://host:9000. Credentials come from the environment otherwise.",
    )(fn)


def _target_storage_option(fn: Any) -> Any:
    return click.option(
        "--target-storage-option",
        "target_storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_parse_storage_options,
        help="fsspec option for a TARGET URL, as --storage-option (which TARGET takes too when this is not given).",
    )(fn)


def _url_options(options: dict[str, Any], path: str) -> dict[str, Any] | None:
    """``options`` for ``path`` when it is a URL; ``None`` for a local path (which takes none)."""
    return options if is_url(path.partition("::")[0]) else None


def _budget_option(fn: Any) -> Any:
    return click.option(
        "--budget",
        "--memory-budget",
        "memory_budget",
        default=None,
        help='Bytes one worker may use, e.g. "2GiB" (default: from the scheduler\'s workers or this machine).',
    )(fn)


def _consent(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    # The user's consent for this run, set where a cluster file cannot reach (see runtime/clusters/rules.py),
    # and undone when the command ends.
    if value:
        setting = f"daskstream.cluster-files.{param.name.replace('_', '-')}"
        ctx.with_resource(dask.config.set({setting: True}))


def _consent_options(fn: Any) -> Any:
    """--allow-code and --allow-network-listen: what a cluster file may do in this run."""
    fn = click.option(
        "--allow-network-listen",
        is_flag=True,
        expose_value=False,
        callback=_consent,
        help="Let the cluster file start a scheduler or dashboard that listens beyond loopback "
        "(the ssh, slurm, pbs and kubernetes kinds always do): anyone who reaches a scheduler can run code as you.",
    )(fn)
    return click.option(
        "--allow-code",
        is_flag=True,
        expose_value=False,
        callback=_consent,
        help="Let the cluster file import modules, run files or commands, set environment variables "
        "or name container images (preload, job-script-prologue, image...). Only for files you trust.",
    )(fn)


def _where_options(fn: Any) -> Any:
    """--scheduler and --cluster, with daskstream.session's meaning, and the consent a cluster file needs."""
    fn = _consent_options(fn)
    fn = click.option(
        "--cluster",
        "cluster_file",
        default=None,
        metavar="FILE",
        help="A cluster YAML (see cluster-configs/) to start or join for the run.",
    )(fn)
    return click.option(
        "--scheduler",
        default=None,
        metavar="NAME|ADDRESS",
        help="sync, threads (default), processes, distributed (a LocalCluster on this machine), "
        "or the address of a running scheduler (tcp://host:8786, tls://...).",
    )(fn)


def _compute_options(fn: Any) -> Any:
    """Where the work runs, its memory budget, and whether progress shows on stderr."""
    fn = click.option("--quiet", is_flag=True, help="Print no progress on stderr.")(fn)
    return _where_options(_budget_option(fn))


def _session(scheduler: str | None, cluster_file: str | None, memory_budget: str | None, quiet: bool) -> Any:

    return ds.session(scheduler, cluster=cluster_file, memory_budget=memory_budget, progress=not quiet)


def _session_if_asked(scheduler: str | None, cluster_file: str | None, memory_budget: str | None) -> Any:
    """A quiet session when --scheduler or --cluster was given (to ask its workers), else nothing."""
    if scheduler is None and cluster_file is None:
        return contextlib.nullcontext()
    return _session(scheduler, cluster_file, memory_budget, quiet=True)


# Named, so that a caller with no program name (click's CliRunner) sees the command's own.
def _print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(dependencies.report())
        ctx.exit()


@click.group("daskstream", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="daskstream")
@click.option(
    "--versions",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_versions,
    help="Print the versions of daskstream's dependencies and which optional features are usable, and exit.",
)
def main() -> None:
    """Out-of-core arrays from .npy, HDF5 and Zarr files, with storage-aligned chunks."""
    warnings.showwarning = _one_line_warning
    cap_malloc_arenas()  # this process is daskstream's: its threads share freed memory


_python_showwarning = warnings.showwarning


def _one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """daskstream's warnings as one line on stderr (what to know, not where in daskstream it was said)."""
    if issubclass(category, DaskstreamWarning):
        # Said while a command runs, so its context names the flags the advice should use.
        ctx = click.get_current_context(silent=True)
        click.echo(f"warning: {in_cli_words(str(message), ctx.command if ctx else None)}", err=True)
        return
    _python_showwarning(message, category, filename, lineno, file, line)


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
        _make_folder(folder, "--dir")
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


def _within_int64(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Callback of an int option: its value, refused (as a usage error) beyond what numpy's int64 holds."""
    if value is not None and value > _INT64_MAX:
        raise click.BadParameter(f"{value} is more than 2**63 - 1, the largest int numpy holds")
    return value


def _make_folder(folder: str, option: str) -> None:
    """Make ``folder`` (and its parents) when missing, or say on one line why it cannot be."""

    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.BadParameter(
            f"cannot make the folder {folder!r} ({reason}); give a folder you can write to", param_hint=f"'{option}'"
        ) from None


@main.command()
@click.argument("path", required=False)
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--versions", is_flag=True, help="Print the versions of daskstream's dependencies (for bug reports) instead."
)
@_storage_option
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
            click.echo(json.dumps(_versions_facts(), indent=2))
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
    source = ds.open_source(path, dataset=dataset, storage_options=_url_options(storage_options, path))
    facts = {**_source_facts(source), "nbytes": source.nbytes, "storage": source.describe_storage()}
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        shown = format_size(value) if key == "nbytes" else value
        click.echo(f"{key:<15} {shown}")


def _versions_facts() -> dict[str, Any]:
    return {
        "daskstream": dependencies.installed_version("daskstream"),
        "dependencies": {
            d.name: {"installed": d.installed, "needs": d.specifier, "extra": d.extra}
            for d in dependencies.declared()
            if d.extra not in ("test", "bench")
        },
        "usable_extras": dependencies.usable_extras(),
    }


def _range_option(cost: str) -> Any:
    """--range of a histogram's bins; ``cost`` says what finding the data's range instead takes."""
    return click.option(
        "--range",
        "bin_range",
        type=float,
        nargs=2,
        default=None,
        metavar="LOW HIGH",
        help=f"Edges of the histogram's bins (default: the data's least and largest values, {cost}).",
    )


_out_option = click.option(
    "--out",
    metavar="FILE",
    default=None,
    help="Also write the result to FILE: .npy, .csv, .zarr or .h5 (by its suffix); replaces what is there.",
)
_adaptive_option = click.option(
    "--adaptive",
    is_flag=True,
    help="Try the planner's setting and alternatives (threads, rows per task) on the first rows, "
    "then run the rest with the fastest; prints what it chose.",
)
_adaptive_store_option = click.option(
    "--adaptive",
    is_flag=True,
    help="Zarr targets: try the planner's way of writing and alternatives (threads, chunks written per task) "
    "on the first rows, then write the rest with the fastest; the target is the same. Prints what it chose.",
)


@main.command("reduce")
@click.argument("path")
@click.option(
    "--op", required=True, help="sum, mean, var, std, min, max, median, quantile, ... (see daskstream.reduce)."
)
@click.option("--axis", type=int, multiple=True, help="Axis to reduce; repeat for several (default: all).")
@click.option("--q", type=float, multiple=True, help="Quantile in [0, 1] for --op quantile; repeat for several.")
@click.option(
    "--ddof",
    type=click.IntRange(min=0),
    callback=_within_int64,
    default=0,
    show_default=True,
    help="Delta degrees of freedom for var and std: the divisor is the count minus DDOF.",
)
@click.option("--bins", type=int, default=None, help="Bin count for --op histogram (default 10).")
@_range_option("found in an extra pass")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@_out_option
@_adaptive_option
@_compute_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_storage_option
def reduce_command(
    path: str,
    op: str,
    axis: tuple[int, ...],
    q: tuple[float, ...],
    ddof: int,
    bins: int | None,
    bin_range: tuple[float, float] | None,
    dataset: str | None,
    out: str | None,
    adaptive: bool,
    scheduler: str | None,
    cluster_file: str | None,
    memory_budget: str | None,
    quiet: bool,
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

    out_names = ["counts", "edges"] if op == "histogram" else [op]
    if out is not None:
        # A suffix daskstream cannot write, or a .npy file for a histogram's two arrays, refused before reading.
        out_format(out, out_names)
    options: dict[str, Any] = {"ddof": ddof}
    if q:
        options["q"] = q[0] if len(q) == 1 else list(q)
    if op == "histogram":
        options.update(bins=10 if bins is None else bins, range=bin_range)
    with _session(scheduler, cluster_file, memory_budget, quiet) as s:
        # Opened inside the session, so the chunks are planned for its workers.
        x = ds.open(path, dataset=dataset, storage_options=_url_options(storage_options, path))
        reads = places_read(x)
        if out is not None:
            # Onto the source, or over a folder of the user's: refused before a byte is read.
            check_out(out, out_names, reads)
        adaptation = None
        if adaptive:
            run = ds.reduce(x, op, axis=axis or None, adaptive=True, progress=not quiet, **options)
            passes = 1
            start = time.perf_counter()
            with ReadMeter(s) as meter:
                value = run.compute()
            adaptation = run.adaptation
        else:
            result = ds.reduce(x, op, axis=axis or None, **options)
            passes = ds.plan_compute(*(result if op == "histogram" else (result,))).passes
            start = time.perf_counter()
            # The bar sets its rate beside the codec's limit once one is remembered (measured after a first run).
            known = None if quiet else codec_limit(x, threads=s.resources().threads, measure=False)
            with ReadMeter(s) as meter:
                label = f"{op} of {path}"
                if op == "histogram":
                    value = list(s.compute(*result, label=label, limit=known))
                else:
                    (value,) = s.compute(result, label=label, limit=known)
        seconds = time.perf_counter() - start
        threads = s.resources().threads
    # A rate set beside the codec's limit where the read was long enough to say more than its overheads.
    read_bytes = meter.bytes_read or 0
    rate = None if read_bytes < LIMIT_SHOWN_FROM_BYTES else read_bytes / max(seconds, 1e-9)
    limit = None if rate is None else codec_limit(x, threads=threads)
    written = None
    if out is not None:
        arrays = {"counts": value[0], "edges": value[1]} if op == "histogram" else {op: value}
        written = write_arrays(out, arrays, reads)
    if as_json:
        shown = [_plain(v) for v in value] if op == "histogram" else _plain(value)
        report = {
            "op": op,
            "axis": list(axis) or None,
            "result": shown,
            "seconds": seconds,
            "bytes_read": meter.bytes_read,
            "passes": passes,
            "scheduler": s.cluster_file or s.scheduler,
            "out": out,
            "GBps": None if rate is None else rate / 1e9,
            "limit": None if limit is None or rate is None else {**limit.to_dict(), "share": limit.share(rate)},
        }
        if adaptation is not None:
            report["adaptive"] = adaptation.to_dict()
        click.echo(json.dumps(report))
        return
    read = "" if meter.bytes_read is None else f", {format_size(meter.bytes_read)} read in {passes} pass(es)"
    if limit is not None and rate is not None:
        read += f" at {limit.beside(rate)}"
    over = f"axis {', '.join(map(str, axis))}" if axis else "all axes"
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
@click.option("--axis", type=int, multiple=True, help="Axis to reduce; repeat for several (default: all).")
@click.option("--bins", type=int, default=None, help="Also a histogram with this many bins.")
@_range_option("which takes a second pass")
@click.option(
    "--quartiles",
    is_flag=True,
    help="Also the exact 25th, 50th and 75th percentiles (2 to 4 more passes over the data, by its dtype).",
)
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@_out_option
@_adaptive_option
@_compute_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_storage_option
def describe_command(
    path: str,
    axis: tuple[int, ...],
    bins: int | None,
    bin_range: tuple[float, float] | None,
    quartiles: bool,
    dataset: str | None,
    out: str | None,
    adaptive: bool,
    scheduler: str | None,
    cluster_file: str | None,
    memory_budget: str | None,
    quiet: bool,
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
    if out is not None:
        out_format(out, out_names)  # refused before anything is opened
    adaptation = None
    with _session(scheduler, cluster_file, memory_budget, quiet) as s:
        x = ds.open(path, dataset=dataset, storage_options=_url_options(storage_options, path))
        reads = places_read(x)
        if out is not None:
            check_out(out, out_names, reads)
        options: dict[str, Any] = {"axis": axis or None, "bins": bins, "range": bin_range}
        if adaptive:
            run = ds.describe(x, **options, quartiles=quartiles, adaptive=True, progress=not quiet)
            description = run.compute()
            adaptation = run.adaptation
        else:
            known = None if quiet else codec_limit(x, threads=s.resources().threads, measure=False)
            (description,) = s.compute(
                ds.describe(x, **options, quartiles=quartiles), label=f"describe {path}", limit=known
            )
    written = None
    if out is not None:
        written = write_arrays(out, dict(description), reads)
    if as_json:
        report: dict[str, Any] = {
            "name": description.name,
            "shape": description.shape,
            "dtype": None if description.dtype is None else str(description.dtype),
            "axes": description.axes,
        }
        report.update((key, _plain(value)) for key, value in description.items())
        if adaptation is not None:
            report["adaptive"] = adaptation.to_dict()
        click.echo(json.dumps(report))
        return
    click.echo(repr(description))
    if written is not None:
        click.echo(written)
    if adaptation is not None:
        click.echo(adaptation.explain())


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
    """numpy scalars and arrays as JSON-ready numbers and nested lists: complex numbers as ``[real, imag]``,
    dates and durations as numpy writes them (``"2026-12-01"``, ``"3 days"``), NaN and infinities as JSON's
    nearest (``NaN``, ``Infinity``, which Python's json reads back)."""

    array = np.asarray(value)
    if array.dtype.kind == "c":
        return np.stack([array.real, array.imag], axis=-1).tolist()
    if array.dtype.kind in "mM":
        return np.vectorize(str, otypes=[object])(array).tolist() if array.ndim else str(array[()])
    return array.tolist()


@main.command()
@click.argument("path")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member (or write PATH::NAME).")
@_budget_option
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    callback=_within_int64,
    default=None,
    help="Threads per worker to plan for.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    callback=_within_int64,
    default=None,
    help="Worker processes to plan for.",
)
@_where_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_storage_option
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

    source = ds.open_source(path, dataset=dataset, storage_options=_url_options(storage_options, path))
    with _session_if_asked(scheduler, cluster_file, None):
        chunk_plan = ds.plan(source, memory_budget=memory_budget, threads=threads, workers=workers)
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
                "threads": chunk_plan.threads,
                "workers": chunk_plan.workers,
            },
            indent=2,
        )
    )


@main.command("tune")
@click.argument("path", required=False)
@click.option("--op", default="sum", show_default=True, help='Reduction to tune for, or "describe".')
@click.option("--axis", type=int, multiple=True, help="Axis the reduction removes; repeat for several (default: all).")
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
@_where_options
@_budget_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def tune_command(
    path: str | None,
    op: str,
    axis: tuple[int, ...],
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
    with dask.config.set(fractions), _session_if_asked(scheduler, cluster_file, memory_budget):
        result = tune(
            path,
            op=op,
            axis=axis or None,
            dataset=dataset,
            memory_budget=memory_budget,
            time_budget=time_budget,
            refresh=refresh,
        )
    click.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json else str(result))


def _inner_chunks_option(command: Any) -> Any:
    return click.option(
        "--inner-chunks",
        default=None,
        help="Write a sharded Zarr array: each block one shard file of chunks of these sizes (like 256,256, "
        "dividing the block's).",
    )(command)


def _sizes(text: str | None, option: str) -> tuple[int, ...] | None:
    """A list of positive sizes like ``256,256`` given to ``option``; ``None`` when it was not given."""
    if text is None:
        return None
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{text!r} is not a list of positive sizes like 256,256", param_hint=f"'{option}'")
    return sizes


def _optimize_option(command: Any) -> Any:
    return click.option(
        "--optimize",
        type=click.Choice(list(OBJECTIVES)),
        default="balanced",
        show_default=True,
        help="What an auto codec is chosen for: the fastest store (write), reads (read), the smallest output "
        "(size), or store and one read together (balanced).",
    )(command)


@main.command("store")
@click.argument("source")
@click.argument("target")
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member of SOURCE (or write SOURCE::NAME).")
@click.option("--target-dataset", default=None, help="Dataset or member to write in TARGET (or TARGET::NAME).")
@click.option("--overwrite", is_flag=True, help="Replace an array already at TARGET.")
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
@_optimize_option
@click.option(
    "--zarr-format", type=click.Choice(["2", "3"]), default="3", show_default=True, help="Format of a new Zarr array."
)
@_inner_chunks_option
@_adaptive_store_option
@_compute_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_storage_option
@_target_storage_option
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
    scheduler: str | None,
    cluster_file: str | None,
    memory_budget: str | None,
    quiet: bool,
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

    with _session(scheduler, cluster_file, memory_budget, quiet):
        x = ds.open(source, dataset=dataset, storage_options=_url_options(storage_options, source))
        target_options = _url_options(target_storage_options or storage_options, target)
        choice = None
        if compressor == "auto":
            compressor, choice = _auto_codec(
                x, target, target_dataset, overwrite, optimize, int(zarr_format), quiet, as_json
            )
        tally = _StoreTally(None if quiet else BlockProgress(f"store {target}", int(x.nbytes)))
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
                inner_chunks=_sizes(inner_chunks, "--inner-chunks"),
                progress=tally,
                storage_options=target_options,
                adaptive=adaptive,
            )
    adaptation = getattr(stored, "adaptation", None)
    _print_store_summary(tally, x, source, target, target_dataset, as_json, choice, target_options, adaptation)


class _StoreTally:
    """Counts what a store does from its progress reports, passing them on to a bar."""

    def __init__(self, bar: BlockProgress | None) -> None:
        self.bar = bar
        self.shows = bar is not None  # store then shows a rechunk's first pass too
        self.total = 0
        self.done_before: int | None = None
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.done_before is None:  # the first report says how many blocks an earlier run had written
            self.done_before = done
        self.total = total
        if self.bar is not None:
            self.bar(done, total)


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
    tally: _StoreTally,
    x: Any,
    source: str,
    target: str,
    target_dataset: str | None,
    as_json: bool,
    choice: CodecChoice | None = None,
    storage_options: dict[str, Any] | None = None,
    adaptation: Any = None,
) -> None:
    seconds = time.perf_counter() - tally.started
    before = tally.done_before or 0
    written = tally.total - before
    on_disk = stored_bytes(target, dataset=target_dataset, storage_options=storage_options)
    summary = {
        "source": source,
        "target": target,
        "blocks": tally.total,
        "blocks_written": written,
        "already_complete": written == 0 and tally.total > 0,
        "bytes_in": int(x.nbytes),
        "bytes_stored": on_disk,
        "ratio": round(int(x.nbytes) / on_disk, 3) if on_disk else None,
        "seconds": round(seconds, 3),
    }
    # The rate of the blocks written in this run beside the codec's encode limit, once there is enough to say.
    written_bytes = int(x.nbytes) * written // max(tally.total, 1)
    rate = written_bytes / max(seconds, 1e-9) if written_bytes >= LIMIT_SHOWN_FROM_BYTES else None
    limit = None
    if rate is not None:
        stored_array = ds.open(target, dataset=target_dataset, storage_options=storage_options)
        limit = codec_limit(stored_array, threads=resources_for(x).threads, direction="encode")
    summary["GBps"] = None if rate is None else rate / 1e9
    summary["limit"] = None if limit is None or rate is None else {**limit.to_dict(), "share": limit.share(rate)}
    if choice is not None:
        summary["codec"] = choice.to_dict()
    if adaptation is not None:
        summary["adaptive"] = adaptation.to_dict()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    elif summary["already_complete"]:
        click.echo(f"{target}: already complete: {tally.total} blocks; nothing written")
    else:
        resumed = f", {before} done before" if before else ""
        ratio = f" (ratio {summary['ratio']:.2f})" if summary["ratio"] else ""
        at = f" at {limit.beside(rate)}" if limit is not None and rate is not None else ""
        click.echo(
            f"{source} -> {target}: {written} of {tally.total} blocks written{resumed}, "
            f"{format_size(int(x.nbytes))} in, {format_size(on_disk)} on disk{ratio}, {seconds:.2f} s{at}"
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
@_optimize_option
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
@_inner_chunks_option
@click.option("--dataset", default=None, help="HDF5 dataset or Zarr member of SOURCE (or write SOURCE::NAME).")
@click.option("--overwrite", is_flag=True, help="Replace an array already at TARGET.")
@_adaptive_store_option
@_compute_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_storage_option
@_target_storage_option
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
    scheduler: str | None,
    cluster_file: str | None,
    memory_budget: str | None,
    quiet: bool,
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

    spec = _chunk_spec(chunks)
    # Built (and its level checked) before anything is read or written.
    compressor = (
        "auto"
        if codec == "auto"
        else _compressor(codec, level, hdf5=target_format(target.partition("::")[0]) == "hdf5")
    )
    source_options = _url_options(storage_options, source)
    target_options = _url_options(target_storage_options or storage_options, target)
    with _session(scheduler, cluster_file, memory_budget, quiet):
        if isinstance(spec, tuple):
            # Other chunks than the planner's: rechunked out of core, each stored chunk decoded once.
            x = ds.rechunk(ds.open(source, dataset=dataset, storage_options=source_options), spec,
                           intermediate=intermediate)  # fmt: skip
        else:
            x = ds.open(source, dataset=dataset, chunks=spec, storage_options=source_options)
        choice = None
        if codec == "auto":
            compressor, choice = _auto_codec(x, target, None, overwrite, optimize, 3, quiet, as_json)
        tally = _StoreTally(None if quiet else BlockProgress(f"convert {source} -> {target}", int(x.nbytes)))
        # The target's options, as the convert command names them.
        with spelled(storage_options="--target-storage-option"):
            stored = ds.store(x, target, overwrite=overwrite, codec=compressor, optimize=optimize, progress=tally,
                              inner_chunks=_sizes(inner_chunks, "--inner-chunks"), storage_options=target_options,
                              adaptive=adaptive)  # fmt: skip
    adaptation = getattr(stored, "adaptation", None)
    _print_store_summary(tally, x, source, target, None, as_json, choice, target_options, adaptation)


def _chunk_spec(chunks: str) -> str | tuple[int, ...]:
    """``--chunks`` as daskstream.open takes it: "auto", "storage", or one int per axis.

    Sizes are checked only as far as the text goes (whole numbers that an axis
    could have); whether they fit the array is for daskstream.open to say.
    """
    if chunks in ("auto", "storage"):
        return chunks
    hint = "give auto, storage or one size per axis like 256,1024 (-1 for a whole axis)"
    try:
        sizes = tuple(int(part) for part in chunks.split(","))
    except ValueError:
        raise click.BadParameter(f"{chunks!r} is not a list of sizes; {hint}", param_hint="'--chunks'") from None
    for size in sizes:
        if size > _INT64_MAX:
            raise click.BadParameter(
                f"{size} in {chunks!r} is longer than any axis can be (at most 2**63 - 1 elements); {hint}",
                param_hint="'--chunks'",
            )
    return sizes


def _compressor(codec: str, level: int, *, hdf5: bool) -> Any:
    """The codec named on the command line, in the target format's own terms; only that one is built."""
    if codec == "none":
        return None
    lowest, highest = _CODEC_LEVELS[codec]
    if not lowest <= level <= highest:
        raise click.BadParameter(f"{level} is outside {codec}'s levels, {lowest} to {highest}", param_hint="'--level'")
    if hdf5 and codec in ("zstd", "lz4"):
        # Said in the command's words before named_codec says it in the library's.
        dependencies.optional_import(
            "hdf5plugin", package="hdf5plugin", extra="hdf5plugin", needed_for=f"--codec {codec} for an HDF5 target"
        )
    return named_codec(codec, "hdf5" if hdf5 else "zarr", level=level)


@main.group()
def cluster() -> None:
    """Cluster configuration files (see cluster-configs/)."""


@cluster.command("check")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_consent_options
def cluster_check(file: str, as_json: bool) -> None:
    """Validate a cluster YAML without starting anything, and compare versions with its running cluster.

    Prints the job script or cluster spec the file makes, then the versions of
    daskstream, dask, distributed and numpy on this client, the scheduler and
    the workers where its cluster runs. FILE may also be the address of a running
    scheduler (tcp://host:8786). Where the scheduler or a worker differs from this
    client, the command fails with one line naming them.
    """

    check = check_cluster(file)
    if as_json:
        versions = check.versions.as_dict() if check.versions is not None else None
        click.echo(
            json.dumps(
                {"kind": check.kind, "lines": check.lines, "job_script": check.job_script, "spec": check.spec,
                 "versions": versions},
                default=str,
            )
        )  # fmt: skip
    else:
        for line in check.lines:
            click.echo(line)
        if check.job_script:
            click.echo("\n" + check.job_script)
        if check.spec:
            # Written out in full: a value the spec shares (the scheduler's and workers' resources) is
            # repeated rather than shown as a YAML anchor and alias (&id001, *id001).
            click.echo("\n" + yaml.dump(check.spec, Dumper=_PlainDumper, sort_keys=False).rstrip("\n"))
    if check.versions is not None:
        check.versions.check()  # after the listing, which shows what differs
