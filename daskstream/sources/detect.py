"""Which reader a path needs: magic bytes first, the file extension as a fallback."""

from __future__ import annotations

import os
import zipfile

from daskstream.errors import (
    CorruptSourceError,
    InvalidArgumentError,
    NotAZarrStoreError,
    SourcePermissionError,
    UnknownFormatError,
)
from daskstream.files import open_regular
from daskstream.sources.base import file_stamp
from daskstream.sources.hdf5 import HDF5_MAGIC
from daskstream.sources.npy import NPY_MAGIC
from daskstream.sources.zarr_ import ZARR_METADATA_FILES, is_url, local_path

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
                f"{path}: dataset given twice, as {inner!r} after '::' and as dataset={dataset!r}; give it once"
            )
        return path, inner
    return path, dataset


def guess_format(path: str) -> str:
    """``"npy"``, ``"hdf5"`` or ``"zarr"`` for a local path or URL.

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
        return "zarr"
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
