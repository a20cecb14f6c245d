"""The benchmark data sets: one float32 field, written once per storage layout and cached.

The field is :func:`daskstream.demo.sample_slabs`' smooth signal plus noise
rounded to 0.01 (so codecs see realistic data), 1024 items a row, written a
32 MiB slab at a time: generating a data set larger than memory streams. Each
is written under a temporary name and renamed when complete, so an
interrupted run never leaves one that looks finished; a later run reuses it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daskstream.demo import sample_shape, sample_slabs

DATA_DIR = Path(__file__).resolve().parent / "data"
ROWS_PER_CHUNK = 256  # 1 MiB storage chunks of 256 x 1024 float32
ROWS_PER_SHARD = 4096  # 16 MiB shards of sixteen 1 MiB chunks


@dataclass(frozen=True)
class Layout:
    """One way the field is stored.

    Attributes
    ----------
    key
        The name ``--only`` takes.
    label
        How tables name it.
    suffix
        File or directory suffix.
    member
        The dataset (HDF5) or array (Zarr group) inside, ``None`` for .npy.
    """

    key: str
    label: str
    suffix: str
    member: str | None


LAYOUTS = {
    layout.key: layout
    for layout in (
        Layout("npy", ".npy", ".npy", None),
        Layout("hdf5-contiguous", "HDF5 contiguous", ".h5", "field"),
        Layout("hdf5-chunked", "HDF5 chunked, uncompressed", ".h5", "field"),
        Layout("hdf5-gzip", "HDF5 chunked, gzip 1 + shuffle", ".h5", "field"),
        Layout("zarr-zstd", "Zarr v3, zstd 3", ".zarr", "field"),
        Layout("zarr-lz4", "Zarr v3, blosc lz4 + shuffle", ".zarr", "field"),
        Layout("zarr-sharded", "Zarr v3 sharded, zstd 3", ".zarr", "field"),
    )
}


def location(key: str, nbytes: int, data_dir: Path = DATA_DIR) -> tuple[Path, str]:
    """The file or directory of a data set, and what ``ds.open`` takes (``path::member``)."""
    layout = LAYOUTS[key]
    path = data_dir / f"{key}-{nbytes}{layout.suffix}"
    return path, str(path) if layout.member is None else f"{path}::{layout.member}"


def ensure(key: str, nbytes: int, data_dir: Path = DATA_DIR, echo: Callable[[str], None] = print) -> str:
    """Write the data set unless a complete one is there; return its location for ``ds.open``."""
    path, where = location(key, nbytes, data_dir)
    if path.exists():
        return where
    data_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.partial{path.suffix}")
    _remove(partial)
    start = time.perf_counter()
    shape = sample_shape(nbytes)
    writer = _WRITERS[key.split("-")[0]]
    writer(partial, key, shape)
    os.replace(partial, path)
    echo(f"{key}: wrote {path} ({shape[0]} x {shape[1]} float32) in {time.perf_counter() - start:.1f} s")
    return where


def _write_npy(path: Path, key: str, shape: tuple[int, int]) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    for start, slab in sample_slabs(shape):
        out[start : start + len(slab)] = slab
        out.flush()
    del out


def _write_hdf5(path: Path, key: str, shape: tuple[int, int]) -> None:
    import h5py

    options = {
        "hdf5-contiguous": {},
        "hdf5-chunked": {"chunks": (ROWS_PER_CHUNK, shape[1])},
        "hdf5-gzip": {"chunks": (ROWS_PER_CHUNK, shape[1]), "compression": "gzip", "compression_opts": 1,
                      "shuffle": True},
    }[key]  # fmt: skip
    with h5py.File(path, "w") as f:
        dset = f.create_dataset("field", shape=shape, dtype="f4", **options)
        # Dimension scales, so xarray (h5netcdf) opens it as a netCDF-4 variable.
        for axis, name in enumerate(("y", "x")):
            scale = f.create_dataset(name, data=np.arange(shape[axis], dtype="i8"))
            scale.make_scale(name)
            dset.dims[axis].attach_scale(scale)
        for start, slab in sample_slabs(shape):
            dset[start : start + len(slab)] = slab


def _write_zarr(path: Path, key: str, shape: tuple[int, int]) -> None:
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    options = {
        "zarr-zstd": {"compressors": ZstdCodec(level=3)},
        "zarr-lz4": {"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")},
        "zarr-sharded": {"compressors": ZstdCodec(level=3), "shards": (ROWS_PER_SHARD, shape[1])},
    }[key]
    # A group holding the array with named dimensions: what xarray's open_zarr reads.
    group = zarr.open_group(path, mode="w")
    array = group.create_array(
        "field", shape=shape, dtype="f4", chunks=(ROWS_PER_CHUNK, shape[1]), dimension_names=("y", "x"), **options
    )
    for start, slab in sample_slabs(shape):
        array[start : start + len(slab)] = slab


_WRITERS = {"npy": _write_npy, "hdf5": _write_hdf5, "zarr": _write_zarr}


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
