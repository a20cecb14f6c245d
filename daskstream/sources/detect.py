"""Which reader a path needs: magic bytes first, the file extension as a fallback.

A URL is told the same way, from the object's first bytes (one ranged GET,
whose bytes the reader then starts from); no object there means a prefix,
which is a Zarr store.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from daskstream.advice import keyword, said
from daskstream.errors import (
    CorruptSourceError,
    InvalidArgumentError,
    NotAZarrStoreError,
    SourceNotFoundError,
    SourcePermissionError,
    UnknownFormatError,
)
from daskstream.files import open_regular
from daskstream.sources.base import file_stamp
from daskstream.sources.contiguous import HEAD_BYTES
from daskstream.sources.hdf5.source import HDF5_MAGIC
from daskstream.sources.npy import NPY_MAGIC
from daskstream.sources.objects.places import Got, Place, is_url
from daskstream.sources.zarr.nodes import ZARR_METADATA_FILES
from daskstream.sources.zarr.source import local_path

ZIP_MAGIC = b"PK\x03\x04"
EXTENSIONS = {
    ".npy": "npy",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".hdf": "hdf5",
    ".he5": "hdf5",
    ".nc": "hdf5",
    ".nxs": "hdf5",
    ".zarr": "zarr",
    ".zip": "zarr",
}
# HDF5 allows a user block before the superblock: the signature may sit at 0, 512, 1024, 2048...
_HDF5_SIGNATURE_OFFSETS = (0, *(512 * 2**k for k in range(20)))
# Object stores whose URLs name a bucket (or container) first: a URL of the bucket alone is a prefix.
_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})

# The first bytes of netCDF-3 files: classic, 64-bit offset and 64-bit data (CDF-5).
NETCDF3_MAGIC = {b"CDF\x01": "classic", b"CDF\x02": "64-bit offset", b"CDF\x05": "64-bit data, CDF-5"}


# MATLAB 7.3 MAT-files are HDF5 files behind a 512-byte text header that starts so.
MATLAB_73_MAGIC = b"MATLAB 7.3 MAT-file"


def is_matlab_73(path: str) -> bool:
    """Whether the local HDF5 file at ``path`` is a MATLAB 7.3 MAT-file (its header says so)."""
    if is_url(path):
        return False
    try:
        with open_regular(path) as f:
            return f.read(len(MATLAB_73_MAGIC)) == MATLAB_73_MAGIC
    except OSError:
        return False


def split_dataset(path: str, dataset: str | None) -> tuple[str, str | None]:
    """Split ``"file.h5::/entry/data"`` into the path and the dataset.

    >>> split_dataset("scan.h5::/entry/data", None)
    ('scan.h5', '/entry/data')
    >>> split_dataset("s3://bucket/field.zarr", "temp")
    ('s3://bucket/field.zarr', 'temp')
    """
    if "::" in path:
        path, _, inner = path.partition("::")
        if dataset is not None and dataset != inner:
            raise InvalidArgumentError(
                said(
                    f"{path}: dataset given twice, as {inner!r} after '::' and as ",
                    keyword("dataset", dataset),
                    "; give it once",
                )
            )
        return path, inner
    return path, dataset


def guess_format(path: str, storage_options: dict[str, Any] | None = None) -> str:
    """``"npy"``, ``"hdf5"`` or ``"zarr"`` for a local path or URL.

    A URL's object is read for its first bytes (see :func:`probe_url`), with
    ``storage_options`` for fsspec.

    Raises
    ------
    SourceNotFoundError, SourcePermissionError
        When the path does not exist or cannot be read.
    NotAZarrStoreError
        For a directory without Zarr metadata.
    CorruptSourceError
        For an empty file, or one whose extension names a format its bytes do not match.
    UnknownFormatError
        For anything else.
    """
    if is_url(path):
        return probe_url(path, storage_options)[0]
    path = local_path(path)
    size = file_stamp(path)[0]
    if os.path.isdir(path):
        if any(os.path.exists(os.path.join(path, name)) for name in ZARR_METADATA_FILES):
            return "zarr"
        raise NotAZarrStoreError(
            f"{path}: a directory without Zarr metadata ({', '.join(ZARR_METADATA_FILES)}); "
            "give a Zarr store, or the .npy / HDF5 file inside it"
        )
    try:
        with open_regular(path) as f:
            head = f.read(8)
            if head.startswith(NPY_MAGIC):
                return "npy"
            for offset in _HDF5_SIGNATURE_OFFSETS:
                if offset >= size:
                    break
                f.seek(offset)
                if f.read(8) == HDF5_MAGIC:
                    return "hdf5"
    except PermissionError:
        raise SourcePermissionError(f"{path}: permission denied; check the file's permissions") from None
    if head.startswith(ZIP_MAGIC) and _zip_holds_zarr(path):
        return "zarr"
    classic = NETCDF3_MAGIC.get(head[:4])
    if classic is not None:
        # Not damaged: a netCDF file of the classic kind, which is no HDF5 file (netCDF-4 files are).
        raise UnknownFormatError(
            f"{path}: a netCDF-3 file ({classic} format), which daskstream does not read (it reads netCDF-4, "
            "which is HDF5); convert it with `nccopy -k netCDF-4 in.nc out.nc`, or open it with xarray "
            "(engine='scipy' or 'netcdf4')"
        )
    ext = os.path.splitext(path)[1].lower()
    if size == 0:
        raise CorruptSourceError(f"{path}: the file is empty; re-create or re-copy it")
    if ext in EXTENSIONS:
        raise CorruptSourceError(
            f"{path}: named like a {EXTENSIONS[ext]} file but its bytes are not one (no "
            f"{EXTENSIONS[ext]} signature); the file is damaged or mis-named"
        )
    raise UnknownFormatError(
        f"{path}: not a .npy, HDF5 or Zarr file (unrecognised first bytes {head!r}); "
        "daskstream reads .npy files, HDF5 files and Zarr stores"
    )


def _zip_holds_zarr(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return any(os.path.basename(n) in ZARR_METADATA_FILES for n in z.namelist())
    except zipfile.BadZipFile:
        return False


def probe_url(url: str, storage_options: dict[str, Any] | None = None) -> tuple[str, Got | None]:
    """The format at ``url`` and the first bytes fetched of its object (``None`` for a prefix).

    One ranged GET of the object's first bytes, after checking the store can
    be reached; an HDF5 file with a user block larger than those bytes takes
    one more round of 8-byte ranged GETs, at the offsets HDF5 looks at. No
    object at the URL: a prefix, read as a Zarr store (unless its name ends
    like a .npy or HDF5 file's). An object whose bytes no reader recognises
    is a Zarr store only when Zarr metadata lies below it.

    Raises
    ------
    ObjectStoreUnreachableError, ObjectStoreCredentialsError, SourceNotFoundError, SourcePermissionError
        When the store, its credentials or its bucket do not let it be read,
        or nothing is at a URL named like a .npy or HDF5 file.
    UnknownFormatError
        For a zip file (read only from local disk) and for unrecognised bytes.
    CorruptSourceError
        For an empty object, or one whose name claims a format its bytes do not match.
    """
    place = Place(url, storage_options)
    place.check_reachable()
    if url.endswith("/") or (place.protocol in _BUCKET_PROTOCOLS and "/" not in place.root.strip("/")):
        return "zarr", None  # a bucket or a folder: no object to look at
    head = place.get_head("", HEAD_BYTES)
    name = url.rsplit("/", 1)[-1]
    ext = os.path.splitext(name)[1].lower()
    if head.data is None:
        if EXTENSIONS.get(ext, "zarr") != "zarr":
            raise SourceNotFoundError(f"{url}: no such object; check the URL")
        return "zarr", None
    data = head.data
    if data.startswith(NPY_MAGIC):
        return "npy", head
    if any(data[o : o + 8] == HDF5_MAGIC for o in _HDF5_SIGNATURE_OFFSETS) or _hdf5_after(place, head):
        return "hdf5", head
    if data.startswith(ZIP_MAGIC):
        raise UnknownFormatError(
            f"{url}: a zip file; daskstream reads zipped Zarr stores from local disk only. Copy it to a local "
            "path and open that, or unzip it into a prefix of the bucket and open the prefix"
        )
    if any(got.data is not None for got in place.get_many(list(ZARR_METADATA_FILES))):
        return "zarr", None  # an object in the place of a store's prefix (a folder marker, an index page)
    if not data:
        raise CorruptSourceError(f"{url}: the object is empty; upload it again")
    if ext in EXTENSIONS:
        raise CorruptSourceError(
            f"{url}: named like a {EXTENSIONS[ext]} file but its bytes are not one (no {EXTENSIONS[ext]} "
            "signature); the object is damaged or mis-named"
        )
    raise UnknownFormatError(
        f"{url}: not a .npy, HDF5 or Zarr object (unrecognised first bytes {data[:8]!r}); "
        "daskstream reads .npy files, HDF5 files and Zarr stores"
    )


def _hdf5_after(place: Place, head: Got) -> bool:
    """Whether the HDF5 signature sits past the first bytes fetched, behind a user block larger than them."""
    assert head.data is not None
    size = head.size if head.size is not None else len(head.data)
    offsets = [o for o in _HDF5_SIGNATURE_OFFSETS if o >= len(head.data) and o + 8 <= size]
    if not offsets or len(head.data) < HEAD_BYTES:
        return False
    return any(got.data == HDF5_MAGIC for got in place.get_ranges("", [(o, o + 8) for o in offsets]))
