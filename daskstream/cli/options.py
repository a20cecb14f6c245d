"""Options several commands share, and how a command opens its session and reads its arguments."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import dataclass
from typing import Any

import click
import dask.config
import numpy as np

import daskstream as ds
from daskstream import dependencies
from daskstream.advice import keyword, said
from daskstream.compute.store.codecs import OBJECTIVES
from daskstream.compute.store.named_codecs import named_codec
from daskstream.errors import InvalidArgumentError
from daskstream.sources.objects.places import is_url

# The largest value a numpy index holds: no axis, chunk or count can be longer.
_INT64_MAX = 2**63 - 1


# Compression levels each codec of `convert` takes; the same for Zarr and HDF5 targets.
# zstd: from ZSTD_minCLevel() = -131072 (negative levels trade ratio for speed) to ZSTD_maxCLevel() = 22,
# as numcodecs' Zstd and hdf5plugin.Zstd document. lz4 is Blosc's lz4 compressor, whose clevel is 0 (stored
# uncompressed) to 9. gzip (deflate, as in zarr's GzipCodec and h5py's gzip filter): 0 to 9.
_CODEC_LEVELS = {"zstd": (-131072, 22), "lz4": (0, 9), "gzip": (0, 9)}


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


def storage_option(fn: Any) -> Any:
    return click.option(
        "--storage-option",
        "storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_parse_storage_options,
        help="fsspec option for a URL (s3://, gs://...), repeatable: profile=NAME, anon=true, "
        "client_kwargs.endpoint_url=http://host:9000. Credentials come from the environment otherwise.",
    )(fn)


def target_storage_option(fn: Any) -> Any:
    return click.option(
        "--target-storage-option",
        "target_storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_parse_storage_options,
        help="fsspec option for a TARGET URL, as --storage-option (which TARGET takes too when this is not given).",
    )(fn)


def url_options(options: dict[str, Any], path: str) -> dict[str, Any] | None:
    """``options`` for ``path`` when it is a URL; ``None`` for a local path (which takes none)."""
    return options if is_url(path.partition("::")[0]) else None


def budget_option(fn: Any) -> Any:
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


def consent_options(fn: Any) -> Any:
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


def where_options(fn: Any) -> Any:
    """--scheduler and --cluster, with daskstream.session's meaning, and the consent a cluster file needs."""
    fn = consent_options(fn)
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


@dataclass(frozen=True)
class WhereItRuns:
    """Where a computing command's work runs (``--scheduler``/``--cluster``), its ``--budget``, and ``--quiet``."""

    scheduler: str | None
    cluster_file: str | None
    memory_budget: str | None
    quiet: bool

    def session(self) -> Any:
        """The command's session: its scheduler or cluster, budget, and a progress bar unless quiet."""
        return command_session(self.scheduler, self.cluster_file, self.memory_budget, self.quiet)


def compute_options(fn: Any) -> Any:
    """Where the work runs, its memory budget, and whether progress shows on stderr: one ``where`` argument
    (:class:`WhereItRuns`) for the command, from the options ``--scheduler``, ``--cluster``, ``--budget``
    and ``--quiet``."""

    @functools.wraps(fn)
    def command(
        *args: Any,
        scheduler: str | None,
        cluster_file: str | None,
        memory_budget: str | None,
        quiet: bool,
        **kwargs: Any,
    ) -> Any:
        return fn(*args, where=WhereItRuns(scheduler, cluster_file, memory_budget, quiet), **kwargs)

    command = click.option("--quiet", is_flag=True, help="Print no progress on stderr.")(command)
    return where_options(budget_option(command))


def command_session(scheduler: str | None, cluster_file: str | None, memory_budget: str | None, quiet: bool) -> Any:
    """The session of a command: ``scheduler`` or ``cluster_file``, ``memory_budget``, a bar unless ``quiet``."""
    return ds.session(scheduler, cluster=cluster_file, memory_budget=memory_budget, progress=not quiet)


def session_if_asked(scheduler: str | None, cluster_file: str | None, memory_budget: str | None) -> Any:
    """A quiet session when --scheduler or --cluster was given (to ask its workers), else nothing."""
    if scheduler is None and cluster_file is None:
        return contextlib.nullcontext()
    return command_session(scheduler, cluster_file, memory_budget, quiet=True)


def within_int64(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Callback of an int option: its value, refused (as a usage error) beyond what numpy's int64 holds."""
    if value is not None and value > _INT64_MAX:
        raise click.BadParameter(f"{value} is more than 2**63 - 1, the largest int numpy holds")
    return value


def make_folder(folder: str, option: str) -> None:
    """Make ``folder`` (and its parents) when missing, or say on one line why it cannot be."""

    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.BadParameter(
            f"cannot make the folder {folder!r} ({reason}); give a folder you can write to", param_hint=f"'{option}'"
        ) from None


def range_option(cost: str) -> Any:
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


out_option = click.option(
    "--out",
    metavar="FILE",
    default=None,
    help="Also write the result to FILE: .npy, .csv, .zarr or .h5 (by its suffix); replaces what is there.",
)


def axis_option(what: str) -> Any:
    """``--axis``, by number or, for a labelled input, by dimension name; repeated for several."""
    return click.option(
        "--axis",
        multiple=True,
        metavar="AXIS",
        help=f"{what}, by number or, for a labelled file, by dimension name (--axis time); repeat for several "
        "(default: all).",
    )


def axes_named(axis: tuple[str, ...], dims: tuple[str | None, ...] | None, ndim: int, name: str) -> tuple[int, ...]:
    """``--axis`` values as axis numbers: numbers as given (negative ones count from the end), names by the
    dimension names ``dims`` of the input ``name``.

    >>> axes_named(("0", "lon"), ("time", "lat", "lon"), 3, "t.nc")
    (0, 2)
    """
    found = []
    for given in axis:
        text = given.strip()
        if text.lstrip("-").isdigit():
            found.append(int(text))
        elif dims is not None and text in dims:
            found.append(dims.index(text))
        else:
            have = (
                f"its dimensions are {', '.join(str(d) for d in dims)}"
                if dims is not None and any(d is not None for d in dims)
                else "it names no dimensions"
            )
            raise InvalidArgumentError(
                said(
                    keyword("axis", given),
                    f": {name} has no dimension of that name ({have}); give a dimension name or an axis number "
                    f"from 0 to {ndim - 1}",
                )
            )
    return tuple(found)


adaptive_option = click.option(
    "--adaptive",
    is_flag=True,
    help="Try the planner's setting and alternatives (threads, rows per task) on the first rows, "
    "then run the rest with the fastest; prints what it chose.",
)


adaptive_store_option = click.option(
    "--adaptive",
    is_flag=True,
    help="Zarr targets: try the planner's way of writing and alternatives (threads, chunks written per task) "
    "on the first rows, then write the rest with the fastest; the target is the same. Prints what it chose.",
)


def source_facts(source: Any) -> dict[str, Any]:
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


def plain_json(value: Any) -> Any:
    """numpy scalars and arrays as JSON-ready numbers and nested lists: complex numbers as ``[real, imag]``,
    dates and durations as numpy writes them (``"2026-12-01"``, ``"3 days"``), NaN and infinities as JSON's
    nearest (``NaN``, ``Infinity``, which Python's json reads back)."""

    array = np.asarray(value)
    if array.dtype.kind == "c":
        return np.stack([array.real, array.imag], axis=-1).tolist()
    if array.dtype.kind in "mM":
        return np.vectorize(str, otypes=[object])(array).tolist() if array.ndim else str(array[()])
    return array.tolist()


def inner_chunks_option(command: Any) -> Any:
    return click.option(
        "--inner-chunks",
        default=None,
        help="Write a sharded Zarr array: each block one shard file of chunks of these sizes (like 256,256, "
        "dividing the block's).",
    )(command)


def parsed_sizes(text: str | None, option: str) -> tuple[int, ...] | None:
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


def optimize_option(command: Any) -> Any:
    return click.option(
        "--optimize",
        type=click.Choice(list(OBJECTIVES)),
        default="balanced",
        show_default=True,
        help="What an auto codec is chosen for: the fastest store (write), reads (read), the smallest output "
        "(size), or store and one read together (balanced).",
    )(command)


def chunk_spec(chunks: str) -> str | tuple[int, ...]:
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


def cli_compressor(codec: str, level: int, *, hdf5: bool) -> Any:
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
