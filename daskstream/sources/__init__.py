"""Readers for .npy, HDF5 and Zarr behind one :class:`Source` protocol."""

from __future__ import annotations

import os
from typing import Any

from daskstream.errors import MemberNotFoundError
from daskstream.sources.base import Source, checked_path
from daskstream.sources.detect import guess_format, split_dataset
from daskstream.sources.hdf5 import Hdf5Source
from daskstream.sources.npy import NpySource
from daskstream.sources.zarr_ import ZarrSource

__all__ = ["Hdf5Source", "NpySource", "Source", "ZarrSource", "guess_format", "open_source"]


def open_source(
    path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Source:
    """Open an array on disk as a :class:`Source`, reading only its metadata.

    Parameters
    ----------
    path
        A ``.npy`` file, an HDF5 file, a Zarr store (directory, ``.zip`` or
        fsspec URL). ``"file.h5::/entry/data"`` names the dataset inline.
    dataset
        The HDF5 dataset or Zarr member; may be omitted when there is only one.
    storage_options
        fsspec options for Zarr URLs.

    Returns
    -------
    Source
        With ``format``, ``shape``, ``dtype``, ``storage_chunks``, ``layout``,
        ``token``, ``read(region)`` and ``plan(...)``.
    """
    path, dataset = split_dataset(checked_path(path), dataset)
    if dataset is not None:
        dataset = checked_path(dataset, "dataset")
    fmt = guess_format(path)
    if fmt == "npy":
        if dataset:
            raise MemberNotFoundError(f"{path}: a .npy file holds one array; open it without a dataset ({dataset!r})")
        return NpySource(path)
    if fmt == "hdf5":
        return Hdf5Source(path, dataset)
    return ZarrSource(path, dataset, storage_options=storage_options)
