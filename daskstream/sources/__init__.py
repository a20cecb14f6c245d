"""Readers for .npy, HDF5 and Zarr behind one :class:`Source` protocol."""

from __future__ import annotations

import os
from typing import Any

from daskstream.errors import MemberNotFoundError
from daskstream.sources.base import Source, checked_path
from daskstream.sources.detect import guess_format, probe_url, split_dataset
from daskstream.sources.hdf5.source import Hdf5Source
from daskstream.sources.npy import NpySource
from daskstream.sources.objects.places import is_url
from daskstream.sources.zarr.source import ZarrSource, local_path

__all__ = ["Hdf5Source", "NpySource", "Source", "ZarrSource", "guess_format", "open_source", "probe_url"]


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
        A ``.npy`` file, an HDF5 file, a Zarr store (directory or ``.zip``),
        or an fsspec URL of any of them but a zip (``s3://bucket/scan.h5``,
        ``gs://bucket/field.zarr``...): an object's first bytes tell its
        format, and a URL with no object is a Zarr store's prefix.
        ``"file.h5::/entry/data"`` names the dataset inline. An fsspec file
        or ``OpenFile`` (``fs.open(...)``, ``fsspec.open(...)``) is read as the
        URL it names, with its filesystem's options.
    dataset
        The HDF5 dataset or Zarr member; may be omitted when there is only one.
    storage_options
        fsspec options for URLs (endpoint, credentials...). Secrets among them
        stay in this process: see :mod:`daskstream.sources.objects.places`.

    Returns
    -------
    Source
        With ``format``, ``shape``, ``dtype``, ``storage_chunks``, ``layout``,
        ``token``, ``read(region)`` and ``plan(...)``.
    """
    path, storage_options = _fsspec_file_as_url(path, storage_options)
    path, dataset = split_dataset(checked_path(path), dataset)
    if dataset is not None:
        dataset = checked_path(dataset, "dataset")
    if is_url(path):
        # The bytes that told the format are where the reader starts: no second request for them.
        fmt, head = probe_url(path, storage_options)
    else:
        path, head = local_path(path), None
        fmt = guess_format(path)
    if fmt == "npy":
        if dataset:
            raise MemberNotFoundError(f"{path}: a .npy file holds one array; open it without a dataset ({dataset!r})")
        return NpySource(path, storage_options=storage_options, head=head)
    if fmt == "hdf5":
        return Hdf5Source(path, dataset, storage_options=storage_options, head=head)
    return ZarrSource(path, dataset, storage_options=storage_options)


def _fsspec_file_as_url(path: Any, storage_options: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
    """An fsspec file or ``OpenFile`` as its URL and its filesystem's options (given options win); anything
    else as it is. daskstream reads the object itself, in every process, rather than through the handle."""
    fs, inner = getattr(path, "fs", None), getattr(path, "path", None)
    if fs is None or not isinstance(inner, str) or not hasattr(fs, "unstrip_protocol"):
        return path, storage_options
    url = fs.unstrip_protocol(inner)
    if not is_url(url):
        return url, storage_options  # a local file through fsspec: its path
    return url, {**dict(getattr(fs, "storage_options", {}) or {}), **(storage_options or {})}
