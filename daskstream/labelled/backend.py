"""xarray's ``engine="daskstream"``: ``xr.open_dataset(path, engine="daskstream")`` and ``xr.open_mfdataset``.

Registered as an ``xarray.backends`` entry point, so xarray imports this
module (and this module imports xarray) only when the engine is used.

Variables are read through daskstream's sources (no HDF5 global lock where
daskstream decodes the filters) and each says the chunks daskstream plans
for it in ``encoding["preferred_chunks"]``: ``chunks={}`` gives those chunks,
aligned to storage and sized to the memory budget. With ``chunks=None``
(xarray's default) variables load lazily, as with any engine.
:func:`daskstream.open_dataset` gives daskstream's own dask arrays instead.

A list of files or a pattern (``xr.open_dataset("runs/day-*.nc",
engine="daskstream")``) opens many files as :func:`daskstream.open_dataset`
does: the first file's labels in full and a header of each other file (see
:mod:`daskstream.labelled.family`), its variables daskstream's dask arrays.
``xr.open_mfdataset(paths, engine="daskstream")`` works too, but xarray then
opens every file in full itself, one call of this engine each.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xarray as xr
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from daskstream.errors import DaskstreamError, InvalidArgumentError
from daskstream.labelled.calendar import calendar_array
from daskstream.labelled.dataset import open_dataset
from daskstream.labelled.variables import decoded, labelled_variables
from daskstream.runtime.resources import resolve_settings
from daskstream.sources import Source
from daskstream.sources.detect import guess_format, is_url, local_path
from daskstream.sources.many import names_many


class SourceArray(BackendArray):
    """A daskstream source as xarray's lazily indexed backend array (basic indexing: slices and integers)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.shape = source.shape
        self.dtype = source.dtype

    def __getitem__(self, key: Any) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self._read)

    def _read(self, key: tuple[Any, ...]) -> np.ndarray:
        return np.asarray(self.source[key])


class DaskstreamBackendEntrypoint(BackendEntrypoint):
    """Open NetCDF4/HDF5 files, Zarr stores and .npy files with daskstream's reads and chunk plans."""

    description = "NetCDF4/HDF5, Zarr and .npy through daskstream: storage-aligned, budget-sized chunks"
    url = "https://github.com/daskstream/daskstream#labelled-data"
    open_dataset_parameters = (
        "filename_or_obj", "drop_variables", "mask_and_scale", "decode_times", "concat_characters",
        "decode_coords", "use_cftime", "decode_timedelta", "group", "memory_budget", "storage_options", "concat_dim",
    )  # fmt: skip

    def open_dataset(
        self,
        filename_or_obj: Any,
        *,
        drop_variables: str | Iterable[str] | None = None,
        mask_and_scale: bool = True,
        decode_times: bool = True,
        concat_characters: bool = True,
        decode_coords: bool = True,
        use_cftime: bool | None = None,
        decode_timedelta: bool | None = None,
        group: str | None = None,
        memory_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        concat_dim: str | None = None,
    ) -> Any:
        if names_many(filename_or_obj):
            decoders: dict[str, Any] = {
                "mask_and_scale": mask_and_scale, "decode_times": decode_times, "concat_characters": concat_characters,
                "decode_coords": decode_coords, "use_cftime": use_cftime, "decode_timedelta": decode_timedelta,
            }  # fmt: skip
            return open_dataset(
                filename_or_obj, group=group, memory_budget=memory_budget, drop_variables=drop_variables,
                concat_dim=concat_dim, storage_options=storage_options, **decoders,
            )  # fmt: skip
        if concat_dim is not None:
            raise InvalidArgumentError(
                f"concat_dim={concat_dim!r} joins many files; {filename_or_obj} is one: give a list or a pattern"
            )
        settings = resolve_settings(memory_budget=memory_budget)

        def lazily(
            source: Source, coordinate: bool, dims: tuple[str, ...], periods: Mapping[str, Any]
        ) -> tuple[Any, tuple[tuple[int, ...], ...]]:
            # The chunks ds.open_dataset would give, whole periods along time included, as the preferred ones.
            planned = calendar_array(source, settings, dims, periods).chunks
            return indexing.LazilyIndexedArray(SourceArray(source)), planned

        variables, attrs, close = labelled_variables(
            filename_or_obj, group=group, storage_options=storage_options, data_of=lazily
        )
        dataset = decoded(
            xr, variables, attrs, where=str(filename_or_obj), drop_variables=drop_variables, mask_and_scale=mask_and_scale,
            decode_times=decode_times, concat_characters=concat_characters, decode_coords=decode_coords,
            use_cftime=use_cftime, decode_timedelta=decode_timedelta,
        )  # fmt: skip
        dataset.set_close(close)
        return dataset

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        if names_many(filename_or_obj):
            return False  # (many files are opened by this engine when it is named)
        if not isinstance(filename_or_obj, str | os.PathLike):
            return False
        location = str(filename_or_obj)
        if is_url(location):
            return False  # (an object's first bytes are a request: let the engine be named)
        try:
            return guess_format(local_path(location)) in ("hdf5", "zarr", "npy")
        except (DaskstreamError, OSError):  # what it cannot tell is not for this engine to claim
            return False
