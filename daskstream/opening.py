"""How :func:`daskstream.open` turns what it was given into a dask array in the chunks asked for.

What ``path`` names becomes the sources to read (:func:`_sources_to_open`: one
file, an open :class:`~daskstream.sources.Source`, or a family of many files,
checked alike); one source becomes one array (:func:`as_dask_array`), and many
are each planned on their own and joined into one (:func:`_joined`). Before
either, ``open`` says where the numbers it gives, as stored, are not what the
file's users see: CF packing and fill values, MATLAB's column-major layout.
The settings all of it is planned within are resolved by ``open``
(:mod:`daskstream.arrays`) and passed here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import dask.array as da

from daskstream.advice import keyword, said
from daskstream.errors import InvalidArgumentError, MatlabLayoutWarning, PackedDataWarning, warn
from daskstream.graph.layers import opened_source
from daskstream.graph.reads import (
    ChunksSpec,
    SharedPlans,
    check_block_count,
    chunked_source_array,
    shared_settings,
    source_array,
)
from daskstream.planning.grid import regular_grid
from daskstream.planning.settings import PlanSettings
from daskstream.sources import Source, open_source
from daskstream.sources.detect import is_matlab_73
from daskstream.sources.many import check_family, family_sources, names_many
from daskstream.sources.metadata import cf_encoding, plain_scalar
from daskstream.tuning.tuner import tuned_chunks

__all__ = ["as_dask_array", "name_of"]


def refuse_path_options(source: Source, dataset: Any, storage_options: Any, *, doing: str) -> None:
    """Refuse ``dataset=`` or ``storage_options=`` given beside a Source already open: they say how to open a
    path, and would be silently ignored."""
    if dataset is not None or storage_options is not None:
        raise InvalidArgumentError(
            said(
                f"{source.name}: ",
                keyword("dataset"),
                " and ",
                keyword("storage_options"),
                f" apply when {doing} a path, not an open Source; pass them to open_source instead",
            )
        )


def _sources_to_open(
    path: str | os.PathLike[str] | Source | Sequence[str | os.PathLike[str] | Source],
    *,
    dataset: str | None,
    storage_options: dict[str, Any] | None,
    axis: int,
    stack: bool,
) -> tuple[list[Source], int, bool]:
    """The sources :func:`daskstream.open` reads ``path`` from, the axis many files join along, and whether
    ``path`` names many files (see :func:`~daskstream.sources.many.names_many`)."""
    many = names_many(path)
    if many:
        # The first file is opened in full and the others as members of its family: on their size or header,
        # checked in full at their first read.
        sources = family_sources(path, dataset=dataset, storage_options=storage_options)  # type: ignore[arg-type]
        axis = check_family(sources, axis=axis, stack=stack)
    elif isinstance(path, Source):
        refuse_path_options(path, dataset, storage_options, doing="opening")
        sources = [path]
    else:
        sources = [open_source(path, dataset=dataset, storage_options=storage_options)]  # type: ignore[arg-type]
    return sources, axis, many


def _tunes(chunks: ChunksSpec) -> bool:
    return isinstance(chunks, str) and chunks == "tune"


def _warn_of_stored_numbers(source: Source) -> None:
    """Say where the numbers ``open`` gives, as stored, are not what the file's users see (CF packing,
    MATLAB's layout)."""
    _warn_if_packed(source)
    _warn_if_matlab(source)


def _warn_if_packed(source: Source) -> None:
    """Say so when the file marks the numbers as packed or filled (CF), which ``open`` gives as stored."""
    encoding = cf_encoding(source.attrs, source.dtype)
    if not encoding:
        return
    said = ", ".join(f"{name} {plain_scalar(value)!r}" for name, value in encoding.items())
    warn(
        f"{source.name} holds its numbers encoded ({said}): this array is the numbers as stored, "
        "so means and extremes include the fill value and packed units; open it with "
        "daskstream.open_dataset(path) to decode them as xarray does",
        PackedDataWarning,
    )


def _joined(
    sources: list[Source], *, chunks: ChunksSpec, settings: PlanSettings, sampling: PlanSettings, axis: int,
    stack: bool,
) -> da.Array:  # fmt: skip
    """Many files of one family as one array: each planned on its own within ``settings``, then joined (see
    :func:`daskstream.open`; ``sampling`` as for :func:`as_dask_array`)."""
    if isinstance(chunks, str) and chunks == "auto":
        settings = shared_settings(settings, len(sources))
    arrays = []
    plans = SharedPlans(settings)
    for source in sources:
        if _tunes(chunks):
            arrays.append(as_dask_array(source, settings, chunks="tune", sampling=sampling))
        elif isinstance(chunks, str) and chunks == "auto":
            arrays.append(chunked_source_array(source, plans.chunks(source), settings))
        else:
            arrays.append(source_array(source, chunks, settings))
    # More blocks than a computation may hold open as one file's do: their parts compute, and computing
    # more at once than daskstream.planning.max-tasks is refused where it is computed.
    return da.stack(arrays, axis=axis) if stack else da.concatenate(arrays, axis=axis)


def _warn_if_matlab(source: Source) -> None:
    """Say how a MATLAB 7.3 array differs from what MATLAB shows: HDF5 holds it transposed (MATLAB is
    column-major) and its characters as UTF-16 codes."""
    if source.format != "hdf5" or not is_matlab_73(source.path):
        return
    shown = "x".join(map(str, source.shape[::-1]))
    said = (
        f"{source.name} is an array of a MATLAB 7.3 MAT-file: MATLAB writes arrays column-major, so this "
        f"array of shape {source.shape} is the transpose of the {shown} array MATLAB shows (take x.T)"
    )
    if source.attrs.get("MATLAB_class") == "char":
        said += "; it is a MATLAB char array, so its numbers are UTF-16 codes, not text"
    warn(said, MatlabLayoutWarning)


def as_dask_array(
    source: Source, settings: PlanSettings, *, chunks: ChunksSpec = "auto", sampling: PlanSettings | None = None
) -> da.Array:
    """A dask array reading an open ``source`` in the chunks given (see :func:`daskstream.open`), planned within
    ``settings``.

    ``sampling``: for ``chunks="tune"``, what the reads that time candidates
    are planned for (by default ``settings``; see :func:`daskstream.tune`).
    """
    if _tunes(chunks):
        tuned = tuned_chunks(source, settings, sampling=settings if sampling is None else sampling)
        check_block_count(source, tuned, settings.max_tasks)
        chunks = regular_grid(source.shape, tuned)
    return source_array(source, chunks, settings)


def name_of(x: Any) -> str | None:
    """The name of the source ``x`` reads as it was opened (``path::dataset``), or ``None`` for other arrays."""
    source = opened_source(x)
    return None if source is None else source.name
