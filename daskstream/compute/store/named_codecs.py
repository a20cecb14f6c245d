"""Codecs by name: what ``store(codec="gzip")`` and ``--codec gzip`` build for each kind of target."""

from __future__ import annotations

from typing import Any

from daskstream.compute.store.codec_candidates import Candidate
from daskstream.errors import InvalidArgumentError

# The codecs store and convert take by name, for Zarr and HDF5 targets alike, at these levels unless
# one is given: zstd level 3 as zarr's default; gzip 4 as h5py's; lz4 as Blosc's lz4 with byte shuffle.
NAMED_CODECS = {"zstd": 3, "lz4": 5, "gzip": 4}
# HDF5's own filters, by the names h5py takes: for HDF5 targets only.
HDF5_FILTER_NAMES = ("lzf", "szip")


def named_codec(name: str, target_format: str, *, zarr_format: int = 3, level: int | None = None) -> Any:
    """The compressor that codec ``name`` is for a ``"zarr"`` (of ``zarr_format``) or ``"hdf5"`` target.

    >>> named_codec("gzip", "zarr", level=5)
    GzipCodec(level=5)
    >>> named_codec("gzip", "hdf5")
    {'compression': 'gzip', 'compression_opts': 4, 'shuffle': True}
    >>> named_codec("lzf", "zarr")
    Traceback (most recent call last):
    ...
    daskstream.errors.InvalidArgumentError: codec 'lzf' is an HDF5 filter; a Zarr target takes zstd, lz4 or gzip
    """
    if name == "none":
        return None
    if target_format == "hdf5" and name in HDF5_FILTER_NAMES:
        return {"compression": name}
    if name not in NAMED_CODECS:
        names = ", ".join(NAMED_CODECS) + (", " + ", ".join(HDF5_FILTER_NAMES) if target_format == "hdf5" else "")
        if name in HDF5_FILTER_NAMES:
            raise InvalidArgumentError(f"codec {name!r} is an HDF5 filter; a Zarr target takes {_or(NAMED_CODECS)}")
        raise InvalidArgumentError(
            f'codec (compressor) {name!r} is not one daskstream knows by name; give {names}, "default", "auto" '
            'or "none"'
        )
    chosen = NAMED_CODECS[name] if level is None else level
    if name == "lz4":
        candidate = Candidate(name, "blosc", chosen, "lz4", "shuffle")
    elif name == "gzip" and target_format == "hdf5":
        candidate = Candidate(name, "gzip+shuffle", chosen)
    else:
        candidate = Candidate(name, name, chosen)
    return candidate.hdf5_compressor() if target_format == "hdf5" else candidate.zarr_compressor(zarr_format)


def _or(names: Any) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1]


__all__ = ["HDF5_FILTER_NAMES", "NAMED_CODECS", "named_codec"]
