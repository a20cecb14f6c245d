"""daskstream beside the fastest peers: zarr-python, zarrs, tensorstore, h5py, plain dask and xarray.

Three parts, each on the same files for every contender:

* **reads**: the float64 sum of a float32 field of ``--size`` (shape ``(N, 4096)``) stored as
  ``.npy``, HDF5 (chunked raw, gzip 1 + shuffle, zstd, blosc lz4 + shuffle), Zarr v2 (zstd,
  blosc lz4 + shuffle, gzip 1), Zarr v3 (zstd, blosc lz4 + shuffle) and Zarr v3 sharded (512 x 512
  chunks in 4096 x 4096 shards, zstd), in 1024 x 1024 storage chunks (4 MiB; ``--chunk 512``: 1 MiB). Contenders:
  daskstream, plain dask, zarr-python (default pipeline and the zarrs pipeline), tensorstore,
  h5py (+ hdf5plugin), numpy's memory map, xarray + dask, and the **decode limit**: the stored
  chunks' bytes read from the page cache and decoded into reused buffers by the codec's fastest
  library in a pool of the same threads, plus the sum, which no reader decoding with those
  libraries can pass (for .npy a page-cache read into a buffer: a memory map, which skips that
  copy, can pass it).
* **writes**: the same field, from a numpy array in memory, written to Zarr v2 and v3 (zstd, blosc
  lz4), Zarr v3 sharded (zstd) and HDF5 (gzip 1 + shuffle, zstd) by daskstream (``ds.store``),
  plain dask (``to_zarr``/``to_hdf5``), zarr-python (both pipelines), tensorstore and h5py, and the
  **encode limit** (every chunk encoded by numcodecs/libdeflate in the thread pool and written to
  a file). Each write goes to a fresh target that is removed afterwards.
* **analyses**, against xarray + dask, on NetCDF-4 files (h5netcdf) of a float32 field
  ``t(time, lat, lon)`` (3650 x 180 x 360 by default, ``--analysis-shape``) stored a day per chunk,
  in (365, 45, 90) blocks, and in those blocks with zlib 1 + shuffle: the per-pixel 95th
  percentile over time, the largest absolute anomaly from the time mean, and the sum of a 3 x 3
  box mean over the interior.

How it is timed: every run is a fresh interpreter (``python -m benchmarks.peers --one SPEC``) that
imports and opens untimed, then times only the computation and prints its seconds, its memory and
its result as JSON. Contenders of a data set run interleaved (A B C A B C ...) for ``--repeats``
rounds; medians are reported. Every file is read once before a data set's rounds (warm page
cache). Every contender gets ``--threads`` threads (2): dask's threaded scheduler with
``num_workers``; tensorstore's ``data_copy_concurrency`` and ``file_io_concurrency`` limits;
zarr's ``threading.max_workers`` (its decode threads, and the zarrs pipeline's Rust threads);
and the peers without a scheduler read in a thread pool of that size.

Memory: ``peak above start`` is the process's resident high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` just before the timed part) less its resident size just before it;
``process peak`` is the whole interpreter's high-water mark, imports and opening included.
``getrusage``'s ``ru_maxrss`` is kept in the JSON but not used: a child started by ``subprocess``
(vfork + exec) inherits the launching process's high-water mark in it.

``python -m benchmarks.peers --help`` for the options. At ``--size 1GiB``, the full analysis shape
and 5 repeats, extrapolated from smaller runs on 2 cores: reads about 30 minutes, writes about 25,
analyses about 40 (``--repeats 3`` takes three fifths of that). The data sets take about 9 GiB of
disk in ``--data-dir`` (6.7 GiB for the reads, 2.4 GiB for the analyses; kept for later runs), and
a write's target up to 1 GiB more while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import os
import platform
import queue
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import marked_report, run_fresh

REPO = Path(__file__).resolve().parent.parent
COLS = 4096
#: The side of HDF5 and unsharded Zarr storage chunks (``--chunk``; run children take it from the environment).
CHUNK_SIDE = int(os.environ.get("DASKSTREAM_PEERS_CHUNK", "1024"))
CHUNK = (CHUNK_SIDE, CHUNK_SIDE)  # 4 MiB of float32 by default; 1 MiB with --chunk 512
SHARD = (4096, 4096)  # sharded Zarr: 64 MiB shards ...
INNER = (512, 512)  # ... of 1 MiB chunks
SLAB_ROWS = 1024  # peers without a scheduler read a row of storage chunks (16 MiB) per call
GZIP_LEVEL, ZSTD_LEVEL, LZ4_LEVEL = 1, 3, 5
ANALYSIS_SHAPE = (3650, 180, 360)
ANALYSIS_BLOCK = (365, 45, 90)
RESULT_MARK = "PEERS-RESULT "
SUM_RTOL = 1e-6


# --- what is measured -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """One way the field is stored.

    Attributes
    ----------
    key
        The name ``--formats`` takes.
    label
        How tables name it.
    kind
        ``"npy"``, ``"hdf5"`` or ``"zarr"``.
    codec
        ``"none"``, ``"gzip"`` (level 1; HDF5 with shuffle), ``"zstd"`` (level 3) or ``"blosc-lz4"``
        (Blosc lz4, level 5, byte shuffle).
    zarr_format
        2 or 3 for Zarr.
    sharded
        Zarr v3 sharded: 512 x 512 chunks in 4096 x 4096 shards.
    """

    key: str
    label: str
    kind: str
    codec: str
    zarr_format: int | None = None
    sharded: bool = False

    @property
    def suffix(self) -> str:
        return {"npy": ".npy", "hdf5": ".h5", "zarr": ".zarr"}[self.kind]


FORMATS = {
    f.key: f
    for f in (
        Format("npy", ".npy", "npy", "none"),
        Format("hdf5-raw", "HDF5 chunked, no filter", "hdf5", "none"),
        Format("hdf5-gzip", "HDF5 gzip 1 + shuffle", "hdf5", "gzip"),
        Format("hdf5-zstd", "HDF5 zstd 3 (hdf5plugin)", "hdf5", "zstd"),
        Format("hdf5-blosc-lz4", "HDF5 blosc lz4 + shuffle (hdf5plugin)", "hdf5", "blosc-lz4"),
        Format("zarr2-zstd", "Zarr v2 zstd 3", "zarr", "zstd", 2),
        Format("zarr2-blosc-lz4", "Zarr v2 blosc lz4 + shuffle", "zarr", "blosc-lz4", 2),
        Format("zarr2-gzip", "Zarr v2 gzip 1", "zarr", "gzip", 2),
        Format("zarr3-zstd", "Zarr v3 zstd 3", "zarr", "zstd", 3),
        Format("zarr3-blosc-lz4", "Zarr v3 blosc lz4 + shuffle", "zarr", "blosc-lz4", 3),
        Format("zarr3-sharded-zstd", "Zarr v3 sharded (512x512 in 4096x4096), zstd 3", "zarr", "zstd", 3, True),
    )
}
WRITE_FORMATS = ("zarr2-zstd", "zarr2-blosc-lz4", "zarr3-zstd", "zarr3-blosc-lz4", "zarr3-sharded-zstd")
WRITE_FORMATS += ("hdf5-gzip", "hdf5-zstd")

# The analysis files: (label, chunks for the full shape, zlib 1 + shuffle).
LAYOUTS = {
    "nc-day": ("a day per chunk, uncompressed", (1, *ANALYSIS_SHAPE[1:]), False),
    "nc-block": ("blocks, uncompressed", ANALYSIS_BLOCK, False),
    "nc-block-zlib": ("blocks, zlib 1 + shuffle", ANALYSIS_BLOCK, True),
}
ANALYSES = {
    "quantile": "95th percentile over time, per pixel",
    "anomaly": "max abs(t - its mean over time), per pixel",
    "stencil": "3x3 box mean per day, summed over the interior",
}

DASKSTREAM, PLAIN, ZARR, ZARRS = "daskstream", "plain dask", "zarr-python", "zarr-python + zarrs"
TENSORSTORE, H5PY, NUMPY, XARRAY = "tensorstore", "h5py", "numpy memmap", "xarray + dask"
DECODE_LIMIT, ENCODE_LIMIT = "decode limit", "encode limit"
LIMITS = (DECODE_LIMIT, ENCODE_LIMIT)
CONTENDERS = (DASKSTREAM, PLAIN, ZARR, ZARRS, TENSORSTORE, H5PY, NUMPY, XARRAY, DECODE_LIMIT, ENCODE_LIMIT)

# What each contender runs, for the legend under the tables.
HOW = {
    ("read", DASKSTREAM): '`ds.open(p).sum(dtype="f8").compute()` (HDF5 `p::/field`, Zarr `p::field`)',
    ("read", PLAIN): '`da.from_array(np.load(p, mmap_mode="r"), chunks="auto")`, '
    '`da.from_array(h5py_dataset, chunks=(1024, 1024))`, `da.from_zarr(p, component="field")`; '
    '`.sum(dtype="f8").compute()`',
    ("read", ZARR): '`zarr.open_array(p, path="field")[a:b]` for each 1024-row slab in a pool of the threads, '
    "each slab summed; zarr's default codec pipeline, `threading.max_workers` = threads",
    ("read", ZARRS): "the same with `codec_pipeline.path = zarrs.ZarrsCodecPipeline` (strict: no fallback), "
    "`threading.max_workers` and `chunk_concurrent_maximum` = threads",
    ("read", TENSORSTORE): "`ts.open({driver: zarr|zarr3}).result()[a:b].read().result()` for each 1024-row slab in "
    "a pool of the threads; `data_copy_concurrency` and `file_io_concurrency` limits = threads",
    ("read", H5PY): '`h5py.File(p)["field"][a:b]` (hdf5plugin imported) for each 1024-row slab in a pool of the '
    "threads (HDF5's global lock serialises the decoding)",
    ("read", NUMPY): '`np.load(p, mmap_mode="r")[a:b].sum(dtype="f8")` for each 1024-row slab in a pool of the threads',
    ("read", XARRAY): '`xr.open_dataset(p, engine="h5netcdf", chunks={})` / `xr.open_zarr(p, chunks={})`; '
    '`["field"].sum(dtype="f8").compute()` (skipna: a NaN-skipping sum, as xarray does by default)',
    ("read", DECODE_LIMIT): "each stored chunk's bytes `preadv` from the page cache into a buffer, decoded into an "
    "array (both allocated per thread before the timing; numcodecs Zstd/Blosc, libdeflate for gzip and HDF5's "
    "deflate, numcodecs Shuffle) and summed, chunks spread over a pool of the threads; for .npy the file read in "
    "16 MiB slabs the same way",
    ("write", DASKSTREAM): "`ds.store(da.from_array(arr, chunks=storage chunks or shards), target, codec=..., "
    "zarr_format=..., inner_chunks=(512, 512) if sharded)`",
    ("write", PLAIN): "`da.from_array(arr, chunks=...).to_zarr(target, compressors=..., zarr_format=..., "
    '[shards=..., chunks=...])`, `da.to_hdf5(target, "/field", x, chunks=..., **filters)`',
    ("write", ZARR): "`zarr.create_array(target, ..., compressors=..., [shards=...])[...] = arr`, default pipeline",
    ("write", ZARRS): "the same with the zarrs pipeline",
    ("write", TENSORSTORE): "`ts.open(spec, create=True).result().write(arr).result()`",
    ("write", H5PY): '`h5py.File(target, "w").create_dataset("field", data=arr, chunks=..., **filters)` '
    "(one thread: HDF5 filters run in the calling thread)",
    ("write", ENCODE_LIMIT): "every chunk copied out of `arr`, encoded by numcodecs (libdeflate for HDF5's deflate, "
    "after numcodecs Shuffle) and written to a file of its own, chunks spread over a pool of the threads; a sharded "
    "target's inner chunks encoded in the pool and each shard written as one file",
    ("analysis", XARRAY): '`xr.open_dataset(p, engine="h5netcdf", chunks={})["t"]`',
    ("analysis", DASKSTREAM): '`ds.open_dataset(p)["t"]` (daskstream\'s planned dask arrays under xarray)',
}
ANALYSIS_CODE = {
    ("quantile", XARRAY): '`v.chunk(time=-1).quantile(0.95, dim="time")`',
    ("quantile", DASKSTREAM): '`ds.reduce(v, "quantile", q=0.95, axis=0)`',
    ("anomaly", XARRAY): '`abs(v - v.mean("time")).max("time")`',
    ("anomaly", DASKSTREAM): '`abs(v - v.mean("time")).max("time")` (the same xarray code)',
    ("stencil", XARRAY): "`v.rolling(lat=3, lon=3, center=True).mean().isel(lat=slice(1, -1), lon=slice(1, -1))"
    '.sum(dtype="f8")`',
    ("stencil", DASKSTREAM): '`m = ds.kernels.moving_mean(ds.kernels.moving_mean(v, 3, axis="lat"), 3, axis="lon")`; '
    '`m.data[:, 1:-1, 1:-1].sum(dtype="f8")`',
}


def read_contenders(fmt: Format) -> list[str]:
    """The contenders that read ``fmt``, in table order."""
    if fmt.kind == "npy":
        return [DASKSTREAM, PLAIN, NUMPY, DECODE_LIMIT]
    if fmt.kind == "hdf5":
        return [DASKSTREAM, PLAIN, H5PY, XARRAY, DECODE_LIMIT]
    return [DASKSTREAM, PLAIN, ZARR, ZARRS, TENSORSTORE, XARRAY, DECODE_LIMIT]


def write_contenders(fmt: Format) -> list[str]:
    """The contenders that write ``fmt``, in table order."""
    if fmt.kind == "hdf5":
        return [DASKSTREAM, PLAIN, H5PY, ENCODE_LIMIT]
    return [DASKSTREAM, PLAIN, ZARR, ZARRS, TENSORSTORE, ENCODE_LIMIT]


def missing_module(task: str, contender: str, fmt: Format | None) -> str | None:
    """The first module a contender needs that is not installed, else ``None``."""
    import importlib.util

    needs = {ZARRS: ["zarrs"], TENSORSTORE: ["tensorstore"], XARRAY: ["xarray", "h5netcdf"]}.get(contender, [])
    if task == "analysis":
        needs = ["xarray", "h5netcdf", "scipy"] if contender == DASKSTREAM else ["xarray", "h5netcdf"]
    if fmt is not None and fmt.kind == "hdf5" and fmt.codec in ("zstd", "blosc-lz4"):
        needs = [*needs, "hdf5plugin"]
    if contender in (DECODE_LIMIT, ENCODE_LIMIT) and fmt is not None and fmt.codec == "gzip":
        needs = [*needs, "deflate"]
    return next((name for name in needs if importlib.util.find_spec(name) is None), None)


# --- the data sets --------------------------------------------------------------------------------


def field_rows(nbytes: int) -> int:
    """Rows of the (rows, 4096) float32 field of about ``nbytes``: whole rows of 1024-row chunks."""
    return max(CHUNK[0], nbytes // (COLS * 4) // CHUNK[0] * CHUNK[0])


def field_blocks(rows: int, block_rows: int = SHARD[0]) -> Iterator[tuple[int, np.ndarray]]:
    """``(first_row, block)`` of the field: ``daskstream.demo.sample_slabs`` (a smooth signal plus noise
    rounded to 0.01, deterministic), gathered into blocks of ``block_rows`` so writes align with shards."""
    from daskstream.demo import sample_slabs

    pending: list[np.ndarray] = []
    first = 0
    for start, slab in sample_slabs((rows, COLS)):
        pending.append(slab)
        if sum(len(p) for p in pending) >= block_rows or start + len(slab) == rows:
            block = pending[0] if len(pending) == 1 else np.concatenate(pending)
            yield first, block
            first += len(block)
            pending = []


def data_path(fmt: Format, rows: int, data_dir: Path) -> Path:
    # Chunks other than the default are in the name: a data set in other chunks is another data set.
    side = "" if CHUNK_SIDE == 1024 or fmt.sharded or fmt.kind == "npy" else f"-chunks{CHUNK_SIDE}"
    return data_dir / f"peers-{rows}x{COLS}-{fmt.key}{side}{fmt.suffix}"


def reference_sum(rows: int, data_dir: Path) -> float:
    """The field's float64 sum from its generator, independent of every reader (cached beside the data)."""
    path = data_dir / f"peers-{rows}x{COLS}.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return float(json.loads(path.read_text())["sum"])
    total = math.fsum(float(block.sum(dtype="f8")) for _, block in field_blocks(rows))
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "cols": COLS, "dtype": "float32", "sum": total}) + "\n")
    return total


def hdf5_filters(fmt: Format) -> dict[str, Any]:
    """The h5py ``create_dataset`` keywords of an HDF5 format."""
    if fmt.codec == "gzip":
        return {"compression": "gzip", "compression_opts": GZIP_LEVEL, "shuffle": True}
    if fmt.codec == "zstd":
        import hdf5plugin

        return dict(hdf5plugin.Zstd(clevel=ZSTD_LEVEL))
    if fmt.codec == "blosc-lz4":
        import hdf5plugin

        return dict(hdf5plugin.Blosc(cname="lz4", clevel=LZ4_LEVEL, shuffle=hdf5plugin.Blosc.SHUFFLE))
    return {}


def zarr_compressor(fmt: Format) -> Any:
    """The compressor ``zarr.create_array`` takes for a Zarr format (numcodecs for v2, zarr.codecs for v3)."""
    if fmt.zarr_format == 2:
        import numcodecs

        return {
            "zstd": numcodecs.Zstd(level=ZSTD_LEVEL),
            "blosc-lz4": numcodecs.Blosc(cname="lz4", clevel=LZ4_LEVEL, shuffle=numcodecs.Blosc.SHUFFLE),
            "gzip": numcodecs.GZip(level=GZIP_LEVEL),
        }[fmt.codec]
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    return {
        "zstd": ZstdCodec(level=ZSTD_LEVEL),
        "blosc-lz4": BloscCodec(cname="lz4", clevel=LZ4_LEVEL, shuffle="shuffle"),
        "gzip": GzipCodec(level=GZIP_LEVEL),
    }[fmt.codec]


def zarr_layout(fmt: Format) -> dict[str, Any]:
    """``chunks`` (and ``shards``) keywords of ``zarr.create_array``."""
    return {"chunks": INNER, "shards": SHARD} if fmt.sharded else {"chunks": CHUNK}


def ensure_field(fmt: Format, rows: int, data_dir: Path, echo: Callable[[str], None]) -> Path:
    """Write the field in ``fmt`` unless a file of the right shape and dtype is there; return its path.

    Written under a temporary name and renamed once complete, so an interrupted run never leaves a
    file that looks finished.
    """
    path = data_path(fmt, rows, data_dir)
    if path.exists():
        if _field_is_whole(fmt, path, rows):
            return path
        echo(f"{path}: not a ({rows}, {COLS}) float32 field as expected; writing it again")
        remove(path)
    data_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.partial{path.suffix}")
    remove(partial)
    start = time.perf_counter()
    {"npy": _write_npy, "hdf5": _write_hdf5, "zarr": _write_zarr}[fmt.kind](partial, fmt, rows)
    os.replace(partial, path)
    echo(
        f"{fmt.key}: wrote {path} ({rows} x {COLS} float32, {_size_text(disk_bytes(path))}) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return path


def _field_is_whole(fmt: Format, path: Path, rows: int) -> bool:
    expected = ((rows, COLS), np.dtype("f4"))
    # Any failure to open it means it is not a usable data set: it is written again.
    try:
        if fmt.kind == "npy":
            array = np.load(path, mmap_mode="r")
            return (array.shape, array.dtype) == expected
        if fmt.kind == "hdf5":
            import h5py

            with h5py.File(path, "r") as f:
                dset = f["field"]
                return (dset.shape, dset.dtype) == expected and dset.chunks == CHUNK
        import zarr

        array = zarr.open_array(str(path), path="field", mode="r")
        return (array.shape, array.dtype) == expected and array.metadata.zarr_format == fmt.zarr_format
    except Exception:
        return False


def _write_npy(path: Path, fmt: Format, rows: int) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, COLS))
    for start, block in field_blocks(rows):
        out[start : start + len(block)] = block
    out.flush()
    del out


def _write_hdf5(path: Path, fmt: Format, rows: int) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        dset = f.create_dataset("field", shape=(rows, COLS), dtype="f4", chunks=CHUNK, **hdf5_filters(fmt))
        # Dimension scales, so xarray's h5netcdf engine opens the file as a NetCDF-4 variable.
        for axis, name in enumerate(("y", "x")):
            scale = f.create_dataset(name, data=np.arange(dset.shape[axis], dtype="i8"))
            scale.make_scale(name)
            dset.dims[axis].attach_scale(scale)
        for start, block in field_blocks(rows):
            dset[start : start + len(block)] = block


def _write_zarr(path: Path, fmt: Format, rows: int) -> None:
    import zarr

    # A group holding the array with named dimensions (format 3 dimension_names, format 2 xarray's
    # _ARRAY_DIMENSIONS): what xarray's open_zarr reads. NaN fill: xarray masks nothing.
    names = (
        {"dimension_names": ("y", "x")} if fmt.zarr_format == 3 else {"attributes": {"_ARRAY_DIMENSIONS": ["y", "x"]}}
    )
    group = zarr.open_group(str(path), mode="w", zarr_format=fmt.zarr_format)
    array = group.create_array(
        "field",
        shape=(rows, COLS),
        dtype="f4",
        compressors=zarr_compressor(fmt),
        fill_value=np.nan,
        **zarr_layout(fmt),
        **names,
    )
    for start, block in field_blocks(rows):
        array[start : start + len(block)] = block


def analysis_path(layout: str, shape: tuple[int, int, int], data_dir: Path) -> Path:
    return data_dir / f"peers-clim-{'x'.join(map(str, shape))}-{layout}.nc"


def analysis_chunks(layout: str, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The layout's chunks for ``shape``: a day and the whole grid, or blocks, clipped to the shape."""
    chunks = LAYOUTS[layout][1]
    if layout == "nc-day":
        return (1, shape[1], shape[2])
    return tuple(min(c, n) for c, n in zip(chunks, shape, strict=True))  # type: ignore[return-value]


def layout_label(layout: str, shape: tuple[int, int, int]) -> str:
    """How tables name a layout, with its chunks for ``shape``."""
    return f"{LAYOUTS[layout][0]} {analysis_chunks(layout, shape)}"


def climate_block(start: int, stop: int, lat: np.ndarray, nlon: int) -> np.ndarray:
    """Days ``start:stop`` of the analysis field: 15 + 15 cos(lat) - 8 cos(2 pi day/365) + N(0, 1), float32.

    Each 365-day block draws its noise from a generator seeded by its first day, so the field is
    the same whatever writes it.
    """
    rng = np.random.default_rng([1, start])
    day = (np.arange(start, stop) % 365)[:, None, None]
    mean = 15 + 15 * np.cos(np.deg2rad(lat))[None, :, None] - 8 * np.cos(2 * np.pi * day / 365)
    return (mean + rng.standard_normal((stop - start, len(lat), nlon))).astype(np.float32)


def climate_dataset(shape: tuple[int, int, int]) -> Any:
    """The analysis field as a lazy xarray Dataset ``t(time, lat, lon)``, daily from 2000-01-01, a year a chunk."""
    import dask.array as da
    import pandas as pd
    import xarray as xr

    ntime, nlat, nlon = shape
    lat = np.linspace(-90 + 90 / nlat, 90 - 90 / nlat, nlat)
    lon = np.arange(nlon) * 360 / nlon + 180 / nlon
    blocks = tuple(min(365, ntime - s) for s in range(0, ntime, 365))

    def block(block_info: dict | None = None) -> np.ndarray:
        first, last = block_info[None]["array-location"][0]  # type: ignore[index]
        return climate_block(first, last, lat, nlon)

    t = da.map_blocks(block, chunks=(blocks, (nlat,), (nlon,)), dtype=np.float32, meta=np.empty((0, 0, 0), "f4"))
    return xr.Dataset(
        {"t": (("time", "lat", "lon"), t, {"units": "degC", "long_name": "temperature"})},
        coords={"time": pd.date_range("2000-01-01", periods=ntime), "lat": lat, "lon": lon},
    )


def ensure_analysis_file(layout: str, shape: tuple[int, int, int], data_dir: Path, echo: Callable[[str], None]) -> Path:
    """Write the NetCDF-4 file of ``layout`` (xarray, h5netcdf) unless a right one is there; return its path."""
    import h5py

    path = analysis_path(layout, shape, data_dir)
    chunks = analysis_chunks(layout, shape)
    zlib = LAYOUTS[layout][2]
    if path.exists():
        # Any failure to read its header means it is not usable: written again.
        try:
            with h5py.File(path, "r") as f:
                t = f["t"]
                if (t.shape, t.dtype, t.chunks, t.compression) == (
                    shape,
                    np.dtype("f4"),
                    chunks,
                    "gzip" if zlib else None,
                ):
                    return path
        except Exception:
            pass
        echo(f"{path}: not the expected {layout} file; writing it again")
        remove(path)
    import dask

    data_dir.mkdir(parents=True, exist_ok=True)
    start_time = time.perf_counter()
    dataset = climate_dataset(shape)
    encoding: dict[str, Any] = {"chunksizes": chunks}
    if zlib:
        encoding |= {"zlib": True, "complevel": 1, "shuffle": True}
    partial = path.with_name(f"{path.stem}.partial.nc")
    remove(partial)
    with dask.config.set(scheduler="threads"):
        dataset.to_netcdf(partial, engine="h5netcdf", encoding={"t": encoding})
    os.replace(partial, path)
    echo(
        f"{layout}: wrote {path} {shape} float32 in chunks {chunks}, {_size_text(disk_bytes(path))}, in "
        f"{time.perf_counter() - start_time:.1f} s"
    )
    return path


def warm(path: Path) -> int:
    """Read every byte of a file or folder once, untimed, so the timed reads find it in the page cache."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    buffer = bytearray(64 * 2**20)
    total = 0
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total


def disk_bytes(path: Path) -> int:
    """Bytes of a file, or of all files under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# --- in the child: measuring one run --------------------------------------------------------------


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _high_water() -> int:
    """This process's resident high-water mark (``VmHWM``), bytes; ``ru_maxrss`` where /proc lacks it."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_high_water() -> bool:
    """Set the high-water mark to the present resident size (Linux ``clear_refs`` 5); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure(run: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """Run ``run`` once, timed; its result and the seconds and memory of the run.

    ``peak_above_start``: the high-water mark, reset just before the run, less the resident size
    then (without a reset it is an upper bound, the opening's peak included: ``peak_reset``).
    """
    gc.collect()
    opened_peak = _high_water()
    start_rss = _resident()
    reset = _reset_high_water()
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    high_water = _high_water()
    return result, {
        "seconds": seconds,
        "start_rss": start_rss,
        "peak_above_start": max(0, high_water - start_rss),
        "process_peak": max(opened_peak, high_water),
        "peak_reset": reset,
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def slab_sum(read: Callable[[int, int], np.ndarray], rows: int, threads: int) -> float:
    """The float64 sum of ``read(a, b)`` over slabs of ``SLAB_ROWS`` rows, slabs spread over ``threads``
    threads, each slab summed in the thread that read it (memory: a slab per thread)."""

    def one(start: int) -> float:
        return float(read(start, min(start + SLAB_ROWS, rows)).sum(dtype="f8"))

    with ThreadPoolExecutor(threads) as pool:
        return math.fsum(pool.map(one, range(0, rows, SLAB_ROWS)))


def zarr_settings(threads: int, zarrs: bool) -> dict[str, Any]:
    """zarr.config for a contender: decode threads, and the zarrs pipeline (strict: no silent fallback)."""
    settings: dict[str, Any] = {"threading.max_workers": threads}
    if zarrs:
        settings["codec_pipeline.path"] = "zarrs.ZarrsCodecPipeline"
        settings["codec_pipeline.chunk_concurrent_maximum"] = threads
        settings["codec_pipeline.chunk_concurrent_minimum"] = 1
        settings["codec_pipeline.strict"] = True
    return settings


def tensorstore_context(threads: int) -> Any:
    import tensorstore as ts

    return ts.Context({"data_copy_concurrency": {"limit": threads}, "file_io_concurrency": {"limit": threads}})


# --- reads: one function per contender family -----------------------------------------------------
# Each opens (untimed) and returns the timed computation: the float64 sum of the whole field.


def _where(fmt: Format, path: str) -> str:
    """What ``ds.open`` takes for the field in ``path``."""
    return {"npy": path, "hdf5": f"{path}::/field", "zarr": f"{path}::field"}[fmt.kind]


def read_daskstream(spec: dict[str, Any]) -> Callable[[], Any]:
    """daskstream as its README shows it: ``ds.open`` plans chunks aligned to the storage, sized to the
    budget and the threads, and the tasks read and decode them (HDF5 filters without HDF5's lock)."""
    import daskstream as ds

    x = ds.open(_where(FORMATS[spec["format"]], spec["path"]))
    return lambda: x.sum(dtype="f8").compute()


def read_plain_dask(spec: dict[str, Any]) -> Callable[[], Any]:
    """Plain dask as its documentation shows it: ``from_array`` over a memory map (``chunks="auto"``: no
    storage chunks to follow) or the h5py dataset (its storage chunks), ``from_zarr`` (the array's chunks)."""
    import dask.array as da

    fmt, path = FORMATS[spec["format"]], spec["path"]
    if fmt.kind == "npy":
        x = da.from_array(np.load(path, mmap_mode="r"), chunks="auto")
    elif fmt.kind == "hdf5":
        import h5py

        if fmt.codec in ("zstd", "blosc-lz4"):
            import hdf5plugin  # noqa: F401  (registers the filters)
        x = da.from_array(h5py.File(path, "r")["field"], chunks=CHUNK)
    else:
        x = da.from_zarr(path, component="field")
    return lambda: x.sum(dtype="f8").compute()


def read_zarr_python(spec: dict[str, Any], zarrs: bool = False) -> Callable[[], Any]:
    """zarr-python's own reader, its default codec pipeline or zarrs' Rust one: a 1024-row slab a call
    (bounded memory, as a user of a larger-than-memory array reads), slabs in a pool of the threads."""
    import zarr

    zarr.config.set(zarr_settings(spec["threads"], zarrs))
    array = zarr.open_array(spec["path"], path="field", mode="r")
    return lambda: slab_sum(lambda a, b: array[a:b], spec["rows"], spec["threads"])


def read_zarrs(spec: dict[str, Any]) -> Callable[[], Any]:
    """zarr-python with the zarrs codec pipeline (Rust: decodes many chunks per call into the output)."""
    return read_zarr_python(spec, zarrs=True)


def read_tensorstore(spec: dict[str, Any]) -> Callable[[], Any]:
    """tensorstore's zarr/zarr3 drivers, a 1024-row slab per ``read()``, slabs in a pool of the threads."""
    import tensorstore as ts

    fmt = FORMATS[spec["format"]]
    driver = "zarr3" if fmt.zarr_format == 3 else "zarr"
    kvstore = {"driver": "file", "path": str(Path(spec["path"]) / "field")}
    array = ts.open({"driver": driver, "kvstore": kvstore}, context=tensorstore_context(spec["threads"]), read=True)
    array = array.result()
    return lambda: slab_sum(lambda a, b: array[a:b].read().result(), spec["rows"], spec["threads"])


def read_h5py(spec: dict[str, Any]) -> Callable[[], Any]:
    """h5py (filters from hdf5plugin), a 1024-row slab per read in a pool of the threads; HDF5's global
    lock lets one thread at a time into the library, so decoding is serial."""
    import h5py

    if FORMATS[spec["format"]].codec in ("zstd", "blosc-lz4"):
        import hdf5plugin  # noqa: F401  (registers the filters)
    dset = h5py.File(spec["path"], "r")["field"]
    return lambda: slab_sum(lambda a, b: dset[a:b], spec["rows"], spec["threads"])


def read_numpy(spec: dict[str, Any]) -> Callable[[], Any]:
    """numpy's memory map of the .npy, a 1024-row slab at a time in a pool of the threads."""
    array = np.load(spec["path"], mmap_mode="r")
    return lambda: slab_sum(lambda a, b: array[a:b], spec["rows"], spec["threads"])


def read_xarray(spec: dict[str, Any]) -> Callable[[], Any]:
    """xarray + dask as its documentation shows it, in the storage chunks (``chunks={}``), with its default
    NaN-skipping sum."""
    import xarray as xr

    fmt, path = FORMATS[spec["format"]], spec["path"]
    if fmt.kind == "hdf5":
        if fmt.codec in ("zstd", "blosc-lz4"):
            import hdf5plugin  # noqa: F401  (registers the filters)
        variable = xr.open_dataset(path, engine="h5netcdf", chunks={})["field"]
    else:
        variable = xr.open_zarr(path, consolidated=False, chunks={})["field"]
    return lambda: float(variable.sum(dtype="f8").compute())


@dataclass(frozen=True)
class StoredChunk:
    """Where a stored chunk's bytes lie: a file, an offset in it and a size."""

    file: str
    offset: int
    size: int


def stored_chunks(fmt: Format, path: Path, rows: int) -> tuple[list[StoredChunk], tuple[int, int]]:
    """Every stored chunk of the field in ``path``, from the file's own index, and the chunk shape.

    ``field_rows`` makes the rows a multiple of 1024, so every chunk (and .npy slab) holds field
    data only and decodes to a whole chunk.
    """
    if fmt.kind == "npy":
        offset = np.load(path, mmap_mode="r").offset  # the data follow the header
        slab = SLAB_ROWS * COLS * 4
        return [StoredChunk(str(path), offset + i * slab, slab) for i in range(rows // SLAB_ROWS)], (SLAB_ROWS, COLS)
    if fmt.kind == "hdf5":
        import h5py

        with h5py.File(path, "r") as f:
            index = f["field"].id
            infos = [index.get_chunk_info(i) for i in range(index.get_num_chunks())]
        return [StoredChunk(str(path), info.byte_offset, info.size) for info in infos], CHUNK
    grid = SHARD if fmt.sharded else CHUNK
    names = [
        path / "field" / (f"{i}.{j}" if fmt.zarr_format == 2 else f"c/{i}/{j}")
        for i in range(-(-rows // grid[0]))
        for j in range(COLS // grid[1])
    ]
    if not fmt.sharded:
        return [StoredChunk(str(name), 0, name.stat().st_size) for name in names], CHUNK
    # A shard ends with its index (zarr's default, "end"): per inner chunk an offset and a size,
    # little-endian uint64, then a crc32c of 4 bytes. An inner chunk past the field's end is absent
    # (2**64 - 1 twice).
    entries = (SHARD[0] // INNER[0]) * (SHARD[1] // INNER[1])
    chunks = []
    for name in names:
        with open(name, "rb") as f:
            f.seek(-(entries * 16 + 4), os.SEEK_END)
            index = np.frombuffer(f.read(entries * 16), "<u8").reshape(entries, 2)
        chunks += [StoredChunk(str(name), int(o), int(n)) for o, n in index if o != 2**64 - 1]
    return chunks, INNER


def chunk_decoder(fmt: Format, chunk_bytes: int) -> Callable[[memoryview, np.ndarray], None] | None:
    """``decode(stored, out)`` for the codec, into the reused array ``out``; ``None``: stored raw.

    The fastest library each codec has here: numcodecs' Zstd and Blosc (the C libraries zarr and
    hdf5plugin call too), libdeflate (``deflate``) for gzip and deflate, numcodecs' Shuffle for
    HDF5's byte shuffle.
    """
    if fmt.codec == "none":
        return None
    import numcodecs

    if fmt.codec == "zstd":
        zstd = numcodecs.Zstd()
        return lambda stored, out: zstd.decode(stored, out=out)
    if fmt.codec == "blosc-lz4":
        blosc = numcodecs.Blosc()
        return lambda stored, out: blosc.decode(stored, out=out)
    import deflate

    if fmt.kind == "zarr":  # numcodecs' GZip: a gzip stream

        def gunzip(stored: memoryview, out: np.ndarray) -> None:
            decoded = deflate.gzip_decompress(stored, chunk_bytes)
            np.copyto(out.reshape(-1).view(np.uint8), np.frombuffer(decoded, np.uint8))

        return gunzip
    unshuffle = numcodecs.Shuffle(elementsize=4)  # HDF5: a zlib stream of shuffled bytes
    return lambda stored, out: unshuffle.decode(deflate.zlib_decompress(stored, chunk_bytes), out=out)


def read_decode_limit(spec: dict[str, Any]) -> Callable[[], Any]:
    """The ceiling for a reader using these codec libraries: each stored chunk's bytes read from the page
    cache (``preadv`` into a buffer) and decoded into an array, then summed, the chunks spread over a
    pool of the threads. A buffer and an array per thread are allocated and touched before the timing:
    no index lookups, no allocation, no scheduler in the timed part."""
    fmt = FORMATS[spec["format"]]
    chunks, shape = stored_chunks(fmt, Path(spec["path"]), spec["rows"])
    decode = chunk_decoder(fmt, shape[0] * shape[1] * 4)
    largest = max(c.size for c in chunks)
    buffers: queue.SimpleQueue[tuple[np.ndarray, memoryview]] = queue.SimpleQueue()
    for _ in range(spec["threads"]):
        buffers.put((np.ones(shape, np.float32), memoryview(bytearray(largest))))  # touched: resident
    local = threading.local()

    def one(chunk: StoredChunk) -> float:
        if not hasattr(local, "out"):
            local.out, local.stored = buffers.get_nowait()
        # Stored raw, the bytes are read straight into the array.
        buffer = local.out.reshape(-1).view(np.uint8) if decode is None else local.stored
        fd = os.open(chunk.file, os.O_RDONLY)
        try:
            os.preadv(fd, [buffer[: chunk.size]], chunk.offset)
        finally:
            os.close(fd)
        if decode is not None:
            decode(local.stored[: chunk.size], local.out)
        return float(local.out.sum(dtype="f8"))

    def run() -> float:
        with ThreadPoolExecutor(spec["threads"]) as pool:
            return math.fsum(pool.map(one, chunks))

    return run


# --- writes: one function per contender family ----------------------------------------------------
# Each gets the field in memory (loaded untimed) and returns the timed write into spec["target"].


def _write_blocks(fmt: Format) -> tuple[int, int]:
    """The blocks a dask writer hands over: shards of a sharded target, storage chunks otherwise."""
    return SHARD if fmt.sharded else CHUNK


def write_daskstream(spec: dict[str, Any], array: np.ndarray) -> Callable[[], Any]:
    """``ds.store`` of the array in storage-chunk (or shard) blocks, encoding in the tasks; HDF5 written
    by the calling process a batch of blocks at a time, as daskstream does."""
    import dask.array as da

    import daskstream as ds

    fmt = FORMATS[spec["format"]]
    x = da.from_array(array, chunks=_write_blocks(fmt))
    if fmt.kind == "hdf5":
        return lambda: ds.store(x, f"{spec['target']}::/field", codec=hdf5_filters(fmt), progress=False)
    extra: dict[str, Any] = {"inner_chunks": INNER} if fmt.sharded else {}
    return lambda: ds.store(
        x, spec["target"], codec=zarr_compressor(fmt), zarr_format=fmt.zarr_format, progress=False, **extra
    )


def write_plain_dask(spec: dict[str, Any], array: np.ndarray) -> Callable[[], Any]:
    """Plain dask: ``to_zarr`` (zarr-python under it, a block per task) or ``to_hdf5`` (``da.store`` into
    an h5py dataset under a lock)."""
    import dask.array as da

    fmt = FORMATS[spec["format"]]
    x = da.from_array(array, chunks=_write_blocks(fmt))
    if fmt.kind == "hdf5":
        return lambda: da.to_hdf5(spec["target"], "/field", x, chunks=CHUNK, **hdf5_filters(fmt))
    extra: dict[str, Any] = {"shards": SHARD, "chunks": INNER} if fmt.sharded else {}
    return lambda: x.to_zarr(spec["target"], compressors=zarr_compressor(fmt), zarr_format=fmt.zarr_format, **extra)


def write_zarr_python(spec: dict[str, Any], array: np.ndarray, zarrs: bool = False) -> Callable[[], Any]:
    """zarr-python: create the array and assign the whole numpy array (zarr splits and encodes it with
    ``threading.max_workers`` threads, or zarrs' Rust threads)."""
    import zarr

    zarr.config.set(zarr_settings(spec["threads"], zarrs))
    fmt = FORMATS[spec["format"]]

    def run() -> None:
        target = zarr.create_array(
            spec["target"],
            shape=array.shape,
            dtype=array.dtype,
            compressors=zarr_compressor(fmt),
            zarr_format=fmt.zarr_format,
            **zarr_layout(fmt),
        )
        target[...] = array

    return run


def write_zarrs(spec: dict[str, Any], array: np.ndarray) -> Callable[[], Any]:
    """zarr-python with the zarrs codec pipeline."""
    return write_zarr_python(spec, array, zarrs=True)


def tensorstore_spec(fmt: Format, target: str, shape: tuple[int, int]) -> dict[str, Any]:
    """The tensorstore spec that creates the same Zarr array as zarr-python's (codec, chunks, shards)."""
    kvstore = {"driver": "file", "path": target}
    if fmt.zarr_format == 2:
        compressor = {
            "zstd": {"id": "zstd", "level": ZSTD_LEVEL},
            "blosc-lz4": {"id": "blosc", "cname": "lz4", "clevel": LZ4_LEVEL, "shuffle": 1},
        }[fmt.codec]
        metadata = {"shape": list(shape), "chunks": list(CHUNK), "dtype": "<f4", "compressor": compressor}
        return {"driver": "zarr", "kvstore": kvstore, "metadata": metadata}
    codec = {
        "zstd": {"name": "zstd", "configuration": {"level": ZSTD_LEVEL, "checksum": False}},
        "blosc-lz4": {
            "name": "blosc",
            "configuration": {"cname": "lz4", "clevel": LZ4_LEVEL, "shuffle": "shuffle", "typesize": 4, "blocksize": 0},
        },
    }[fmt.codec]
    codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}, codec]
    grid = CHUNK
    if fmt.sharded:
        grid = SHARD
        codecs = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": list(INNER),
                    "codecs": codecs,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                },
            }
        ]
    metadata = {
        "shape": list(shape),
        "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid)}},
        "codecs": codecs,
        "fill_value": 0.0,
    }
    return {"driver": "zarr3", "kvstore": kvstore, "metadata": metadata}


def write_tensorstore(spec: dict[str, Any], array: np.ndarray) -> Callable[[], Any]:
    """tensorstore: create the array and write the whole numpy array in one ``write``."""
    import tensorstore as ts

    fmt = FORMATS[spec["format"]]
    context = tensorstore_context(spec["threads"])

    def run() -> None:
        target = ts.open(tensorstore_spec(fmt, spec["target"], array.shape), create=True, context=context).result()
        target.write(array).result()

    return run


def write_h5py(spec: dict[str, Any], array: np.ndarray) -> Callable[[], Any]:
    """h5py: ``create_dataset(data=array)`` with the filters; HDF5 encodes in the calling thread."""
    import h5py

    fmt = FORMATS[spec["format"]]
    filters = hdf5_filters(fmt)

    def run() -> None:
        with h5py.File(spec["target"], "w") as f:
            f.create_dataset("field", data=array, chunks=CHUNK, **filters)

    return run


def chunk_encoder(fmt: Format) -> Callable[[np.ndarray], Any]:
    """``encode(chunk)`` to the stored bytes: numcodecs' codecs, libdeflate for HDF5's deflate after shuffle."""
    import numcodecs

    if fmt.kind == "hdf5" and fmt.codec == "gzip":
        import deflate

        shuffle = numcodecs.Shuffle(elementsize=4)
        return lambda chunk: deflate.zlib_compress(shuffle.encode(chunk), GZIP_LEVEL)
    if fmt.codec == "zstd":
        return numcodecs.Zstd(level=ZSTD_LEVEL).encode
    return numcodecs.Blosc(cname="lz4", clevel=LZ4_LEVEL, shuffle=numcodecs.Blosc.SHUFFLE).encode


def write_encode_limit(spec: dict[str, Any], array: np.ndarray) -> Callable[[], Any]:
    """The ceiling for a writer using these codec libraries: each chunk copied out of the array, encoded
    and written to a file of its own in the target folder, chunks spread over a pool of the threads. A
    sharded target's inner chunks are encoded in the pool and each shard written as one file."""
    fmt = FORMATS[spec["format"]]
    encode = chunk_encoder(fmt)
    target = Path(spec["target"])
    rows = array.shape[0]

    def encoded(corner: tuple[int, int], shape: tuple[int, int]) -> Any:
        r, c = corner
        return encode(np.ascontiguousarray(array[r : r + shape[0], c : c + shape[1]]))

    def write_file(name: str, data: Any) -> None:
        with open(target / name, "wb") as f:
            f.write(data)

    def run() -> None:
        target.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(spec["threads"]) as pool:
            if not fmt.sharded:
                corners = [(r, c) for r in range(0, rows, CHUNK[0]) for c in range(0, COLS, CHUNK[1])]

                def one(corner: tuple[int, int]) -> None:
                    write_file(f"{corner[0] // CHUNK[0]}.{corner[1] // CHUNK[1]}", encoded(corner, CHUNK))

                list(pool.map(one, corners))
                return
            for sr in range(0, rows, SHARD[0]):
                for sc in range(0, COLS, SHARD[1]):
                    inner = [
                        (r, c)
                        for r in range(sr, min(sr + SHARD[0], rows), INNER[0])
                        for c in range(sc, min(sc + SHARD[1], COLS), INNER[1])
                    ]
                    parts = list(pool.map(lambda corner: encoded(corner, INNER), inner))
                    sizes = np.array([len(p) for p in parts], "<u8")
                    index = np.stack([np.cumsum(sizes) - sizes, sizes], axis=1).astype("<u8").tobytes()
                    write_file(f"{sr // SHARD[0]}.{sc // SHARD[1]}", b"".join([*map(bytes, parts), index]))

    return run


def written_matches(fmt: Format, target: str, array: np.ndarray) -> str:
    """Whether the target holds exactly ``array`` (read back by zarr-python or h5py, a slab at a time)."""
    if fmt.kind == "hdf5":
        import h5py

        if fmt.codec in ("zstd", "blosc-lz4"):
            import hdf5plugin  # noqa: F401  (registers the filters)
        with h5py.File(target, "r") as f:
            stored = f["field"]
            return _same_slabs(lambda a, b: stored[a:b], array)
    import zarr

    with zarr.config.set({"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"}):
        stored = zarr.open_array(target, mode="r")
        return _same_slabs(lambda a, b: stored[a:b], array)


def _same_slabs(read: Callable[[int, int], np.ndarray], array: np.ndarray) -> str:
    for start in range(0, array.shape[0], 4 * SLAB_ROWS):
        stop = min(start + 4 * SLAB_ROWS, array.shape[0])
        if not np.array_equal(read(start, stop), array[start:stop]):
            return f"differs from the source in rows {start}:{stop}"
    return "equal"


# --- analyses: daskstream and xarray --------------------------------------------------------------


def analysis_xarray(spec: dict[str, Any]) -> Callable[[], Any]:
    """xarray + dask as its documentation shows it: ``open_dataset(engine="h5netcdf", chunks={})``, the
    storage chunks (a quantile needs the whole time axis in a chunk: ``.chunk(time=-1)``)."""
    import xarray as xr

    variable = xr.open_dataset(spec["path"], engine="h5netcdf", chunks={})["t"]
    analysis = spec["analysis"]
    if analysis == "quantile":
        return lambda: variable.chunk(time=-1).quantile(0.95, dim="time").compute()
    if analysis == "anomaly":
        return lambda: abs(variable - variable.mean("time")).max("time").compute()
    box = variable.rolling(lat=3, lon=3, center=True).mean()
    return lambda: float(box.isel(lat=slice(1, -1), lon=slice(1, -1)).sum(dtype="f8").compute())


def analysis_daskstream(spec: dict[str, Any]) -> Callable[[], Any]:
    """daskstream: ``ds.open_dataset`` (xarray's labels over daskstream's planned dask arrays), with
    ``ds.reduce`` for the quantile, xarray's own code for the anomaly and ``ds.kernels.moving_mean``
    (twice: lat, then lon) for the box mean."""
    import daskstream as ds

    variable = ds.open_dataset(spec["path"])["t"]
    analysis = spec["analysis"]
    if analysis == "quantile":
        return lambda: ds.reduce(variable, "quantile", q=0.95, axis=0).compute()
    if analysis == "anomaly":
        return lambda: abs(variable - variable.mean("time")).max("time").compute()
    box = ds.kernels.moving_mean(ds.kernels.moving_mean(variable, 3, axis="lat"), 3, axis="lon").data
    return lambda: float(box[:, 1:-1, 1:-1].sum(dtype="f8").compute())


READS: dict[str, Callable[[dict[str, Any]], Callable[[], Any]]] = {
    DASKSTREAM: read_daskstream,
    PLAIN: read_plain_dask,
    ZARR: read_zarr_python,
    ZARRS: read_zarrs,
    TENSORSTORE: read_tensorstore,
    H5PY: read_h5py,
    NUMPY: read_numpy,
    XARRAY: read_xarray,
    DECODE_LIMIT: read_decode_limit,
}
WRITES: dict[str, Callable[[dict[str, Any], np.ndarray], Callable[[], Any]]] = {
    DASKSTREAM: write_daskstream,
    PLAIN: write_plain_dask,
    ZARR: write_zarr_python,
    ZARRS: write_zarrs,
    TENSORSTORE: write_tensorstore,
    H5PY: write_h5py,
    ENCODE_LIMIT: write_encode_limit,
}
ANALYSIS_RUNS = {XARRAY: analysis_xarray, DASKSTREAM: analysis_daskstream}


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh interpreter: import and open (untimed), time the computation, check or keep its result."""
    import dask

    dask.config.set(scheduler="threads", num_workers=spec["threads"])
    if importlib.util.find_spec("distributed") is not None:
        # dask's scheduler lookup imports distributed at the first compute where it is installed (0.3 s here):
        # an import, untimed like the others.
        import distributed  # noqa: F401
    task, contender = spec["task"], spec["contender"]
    if task == "read":
        result, report = measure(READS[contender](spec))
        return report | {"value": float(result)}
    if task == "write":
        array = np.load(spec["source"])  # the field in memory, read untimed from the warm .npy
        _, report = measure(WRITES[contender](spec, array))
        if spec.get("verify") and contender != ENCODE_LIMIT:
            report["check"] = written_matches(FORMATS[spec["format"]], spec["target"], array)
        return report
    result, report = measure(ANALYSIS_RUNS[contender](spec))
    values = np.asarray(getattr(result, "values", result))
    np.save(spec["save"], values)
    return report | {"value": float(np.nansum(values, dtype="f8"))}


# --- in the launcher: running children and collecting their results -------------------------------


@dataclass
class Runs:
    """The runs of one contender on one data set (and analysis)."""

    part: str
    dataset: str
    contender: str
    analysis: str | None = None
    reports: list[dict[str, Any]] | None = None
    failure: str | None = None
    check: str | None = None
    stored_bytes: int | None = None
    stderr: str | None = None  # the failed run's

    def median(self, key: str) -> float | None:
        values = [r[key] for r in self.reports or [] if key in r]
        return statistics.median(values) if values else None

    def seconds(self) -> float | None:
        """The time the tables give: the median, or for a limit (a ceiling) its fastest run."""
        values = [r["seconds"] for r in self.reports or []]
        if not values:
            return None
        return min(values) if self.contender in LIMITS else statistics.median(values)


def launch(spec: dict[str, Any], timeout: float, echo: Callable[[str], None]) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; its report, or ``{"error": reason}`` (stderr shown)."""
    try:
        done = run_fresh("benchmarks.peers", spec, timeout)
    except subprocess.TimeoutExpired as stopped:
        stderr = stopped.stderr.decode(errors="replace") if isinstance(stopped.stderr, bytes) else stopped.stderr or ""
        echo(f"    timed out after {timeout:.0f} s; its stderr ends:\n{_tail(stderr)}")
        return {"error": f"timed out after {timeout:.0f} s", "stderr": stderr[-4000:]}
    report = marked_report(done.stdout, RESULT_MARK)
    if done.returncode != 0 or report is None:
        lines = [s for s in done.stderr.strip().splitlines() if s.strip()]
        reason = lines[-1].strip() if lines else f"exit status {done.returncode}"
        echo(f"    failed ({reason}); its stderr ends:\n{_tail(done.stderr)}")
        return {"error": reason[:160], "stderr": done.stderr[-4000:]}
    if done.stderr.strip():
        report["stderr"] = done.stderr[-2000:]
    return report


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("      " + s for s in text.rstrip().splitlines()[-lines:])


def run_rounds(
    cases: list[tuple[Runs, dict[str, Any]]],
    repeats: int,
    timeout: float,
    echo: Callable[[str], None],
    before_each: Callable[[Runs, dict[str, Any]], None] | None = None,
    after_each: Callable[[Runs, dict[str, Any], dict[str, Any]], None] | None = None,
) -> None:
    """Run the cases interleaved, A B C A B C ..., ``repeats`` rounds; a case that fails is dropped."""
    for round_number in range(repeats):
        for runs, spec in cases:
            if runs.failure:
                continue
            spec = dict(spec, repeat=round_number, verify=round_number == 0)
            if before_each:
                before_each(runs, spec)
            report = launch(spec, timeout, echo)
            if after_each:
                after_each(runs, spec, report)
            if "error" in report:
                reason = report["error"].replace("|", "/")  # a table cell
                runs.failure = reason if round_number == 0 else f"run {round_number + 1}: {reason}"
                runs.stderr = report.get("stderr")
                continue
            runs.reports = [*(runs.reports or []), report]
            echo(
                f"  [{round_number + 1}/{repeats}] {runs.dataset} {runs.analysis or ''} {runs.contender}: "
                f"{report['seconds']:.3f} s, peak +{report['peak_above_start'] / 2**20:.0f} MiB"
            )


def run_reads(args: argparse.Namespace, rows: int, echo: Callable[[str], None]) -> list[Runs]:
    """The reads part: for each format, its contenders interleaved on the warm file."""
    total = reference_sum(rows, args.data_dir)
    results = []
    for key in [k for k in FORMATS if k in args.formats]:
        fmt = FORMATS[key]
        cases = []
        for contender in [c for c in read_contenders(fmt) if c in args.contenders]:
            runs = Runs("reads", key, contender)
            results.append(runs)
            missing = missing_module("read", contender, fmt)
            if missing:
                runs.failure = f"{missing} is not installed"
                continue
            cases.append((runs, {"task": "read", "format": key, "contender": contender}))
        if not cases:
            continue
        try:
            path = ensure_field(fmt, rows, args.data_dir, echo)
        except Exception as error:  # a format this machine cannot write (a filter missing) is reported
            for runs, _ in cases:
                runs.failure = f"data set not written: {type(error).__name__}: {error}"[:160]
            continue
        stored = disk_bytes(path)
        echo(f"reads, {fmt.label}: {_size_text(stored)} on disk; warming the page cache")
        warm(path)
        common = {"path": str(path), "rows": rows, "threads": args.threads}
        cases = [(runs, spec | common) for runs, spec in cases]
        for runs, _ in cases:
            runs.stored_bytes = stored
        run_rounds(cases, args.repeats, args.timeout, echo)
        for runs, _ in cases:
            runs.check = _sum_check([r["value"] for r in runs.reports or []], total)
    return results


def _sum_check(values: list[float], total: float) -> str | None:
    if not values:
        return None
    worst = max(abs(v - total) / max(abs(total), 1e-300) for v in values)
    return f"ok (rel {worst:.0e})" if worst <= SUM_RTOL else f"MISMATCH: rel {worst:.1e} from the reference sum"


def run_writes(args: argparse.Namespace, rows: int, echo: Callable[[str], None]) -> list[Runs]:
    """The writes part: for each target format, its writers interleaved, each into a fresh target."""
    source = ensure_field(FORMATS["npy"], rows, args.data_dir, echo)
    scratch = args.data_dir / "peers-scratch"
    results = []
    for key in [k for k in WRITE_FORMATS if k in args.formats]:
        fmt = FORMATS[key]
        cases = []
        for contender in [c for c in write_contenders(fmt) if c in args.contenders]:
            runs = Runs("writes", key, contender)
            results.append(runs)
            missing = missing_module("write", contender, fmt)
            if missing:
                runs.failure = f"{missing} is not installed"
                continue
            slug = contender.replace(" ", "-").replace("+", "")
            target = scratch / f"{key}-{slug}{fmt.suffix}"
            spec = {
                "task": "write",
                "format": key,
                "contender": contender,
                "source": str(source),
                "target": str(target),
                "threads": args.threads,
            }
            cases.append((runs, spec))
        if not cases:
            continue
        echo(f"writes, {fmt.label}: warming the source {source.name}")
        warm(source)
        run_rounds(cases, args.repeats, args.timeout, echo, _fresh_target, _measure_target)
    remove(scratch)
    return results


def _fresh_target(runs: Runs, spec: dict[str, Any]) -> None:
    """Before a write: no target there, and the previous write's dirty pages on disk (not in the timing)."""
    remove(Path(spec["target"]))
    Path(spec["target"]).parent.mkdir(parents=True, exist_ok=True)
    os.sync()


def _measure_target(runs: Runs, spec: dict[str, Any], report: dict[str, Any]) -> None:
    """After a write: note the target's bytes on disk and the read-back check, then remove it."""
    target = Path(spec["target"])
    if "error" not in report and target.exists():
        runs.stored_bytes = disk_bytes(target)
        runs.check = report.get("check", runs.check)
    remove(target)


def run_analyses(args: argparse.Namespace, echo: Callable[[str], None]) -> list[Runs]:
    """The analyses part: for each NetCDF layout and analysis, xarray and daskstream interleaved."""
    shape = args.analysis_shape
    scratch = args.data_dir / "peers-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    results = []
    for layout in [k for k in LAYOUTS if k in args.formats]:
        cases = []
        for analysis in [a for a in ANALYSES if a in args.analyses]:
            for contender in [c for c in (XARRAY, DASKSTREAM) if c in args.contenders]:
                runs = Runs("analyses", layout, contender, analysis)
                results.append(runs)
                missing = missing_module("analysis", contender, None)
                if missing:
                    runs.failure = f"{missing} is not installed"
                    continue
                save = scratch / f"{layout}-{analysis}-{contender.replace(' ', '-').replace('+', '')}.npy"
                cases.append(
                    (
                        runs,
                        {
                            "task": "analysis",
                            "analysis": analysis,
                            "contender": contender,
                            "save": str(save),
                            "threads": args.threads,
                        },
                    )
                )
        if not cases:
            continue
        path = ensure_analysis_file(layout, shape, args.data_dir, echo)
        echo(f"analyses, {layout_label(layout, shape)}: {_size_text(disk_bytes(path))} on disk; warming the page cache")
        warm(path)
        for runs, spec in cases:
            spec["path"] = str(path)
            runs.stored_bytes = disk_bytes(path)
        run_rounds(cases, args.repeats, args.timeout, echo)
        for analysis in [a for a in ANALYSES if a in args.analyses]:
            pair = {r.contender: r for r in results if r.dataset == layout and r.analysis == analysis}
            if XARRAY in pair and DASKSTREAM in pair and not (pair[XARRAY].failure or pair[DASKSTREAM].failure):
                saved = {c: scratch / f"{layout}-{analysis}-{c.replace(' ', '-').replace('+', '')}.npy" for c in pair}
                pair[DASKSTREAM].check = compare_results(np.load(saved[XARRAY]), np.load(saved[DASKSTREAM]))
    remove(scratch)
    return results


def compare_results(theirs: np.ndarray, ours: np.ndarray) -> str:
    """How daskstream's result compares with xarray's: equal, equal once both are float32, or how far."""
    if theirs.shape != ours.shape:
        return f"MISMATCH: shape {ours.shape}, xarray's {theirs.shape}"
    if np.array_equal(theirs, ours, equal_nan=True):
        return "equal"
    if ours.ndim == 0:
        worst = abs(float(theirs) - float(ours)) / max(abs(float(theirs)), 1e-300)
        return f"{'close' if worst <= SUM_RTOL else 'MISMATCH'}: rel diff {worst:.1e}"
    if theirs.dtype != ours.dtype and np.array_equal(theirs.astype("f4"), ours.astype("f4"), equal_nan=True):
        return f"equal in float32 (xarray {theirs.dtype}, daskstream {ours.dtype})"
    a, b = theirs.astype("f8"), ours.astype("f8")
    scale = max(float(np.nanmax(np.abs(a))), 1e-300)
    worst = float(np.nanmax(np.abs(a - b))) / scale
    ulps = float(np.nanmax(np.abs(a - b) / np.spacing(np.abs(a).astype("f4")).astype("f8")))
    tag = "close" if worst <= SUM_RTOL else "MISMATCH"
    return f"{tag}: max diff {worst:.1e} of the largest value ({ulps:.0f} float32 ulp)"


# --- tables ---------------------------------------------------------------------------------------


def _size_text(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value / 2**20:.0f}"


THROUGHPUT_NOTE = (
    "s: the median over the runs; for the limit (a ceiling) its fastest run. GB/s: the field's bytes (decoded) "
    "over that time. % of limit: the limit's time over the contender's (above 100%: a faster codec library, or "
    "for .npy a memory map, which skips the copy the limit makes). daskstream vs fastest peer: the fastest other "
    "contender's time over daskstream's (above 1: daskstream faster). Peaks: the median over the runs."
)


def throughput_table(results: list[Runs], nbytes: int, part: str) -> tuple[str, list[dict[str, Any]]]:
    """The reads or writes table (markdown) and its rows: GB/s, % of the limit, daskstream against the
    fastest peer, memory and the check of each contender."""
    limit_name = DECODE_LIMIT if part == "reads" else ENCODE_LIMIT
    lines = [
        "| data set | on disk | contender | s | GB/s | % of limit | daskstream vs fastest peer | "
        "peak above start MiB | process peak MiB | check |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    rows = []
    for key in dict.fromkeys(r.dataset for r in results if r.part == part):
        group = [r for r in results if r.part == part and r.dataset == key]
        limit = next((r.seconds() for r in group if r.contender == limit_name and not r.failure), None)
        peers = [r.seconds() for r in group if r.contender not in (DASKSTREAM, *LIMITS) and not r.failure]
        peers = [s for s in peers if s is not None]
        fastest_peer = min(peers) if peers else None
        for runs in group:
            seconds = runs.seconds()
            row = {
                "dataset": key,
                "label": FORMATS[key].label,
                "contender": runs.contender,
                "seconds": seconds,
                "stored_bytes": runs.stored_bytes,
                "failure": runs.failure,
                "check": runs.check,
                "runs": [r.get("seconds") for r in runs.reports or []],
            }
            stored = (
                ""
                if runs.stored_bytes is None
                else f"{_size_text(runs.stored_bytes)} ({nbytes / runs.stored_bytes:.2f}x)"
            )
            if runs.failure or seconds is None:
                lines.append(
                    f"| {FORMATS[key].label} | {stored} | {runs.contender} | n/a: {runs.failure} | | | | | | |"
                )
                rows.append(row)
                continue
            gbps = nbytes / seconds / 1e9
            of_limit = "" if limit is None or runs.contender in LIMITS else f"{100 * limit / seconds:.0f}%"
            versus = ""
            if runs.contender == DASKSTREAM and fastest_peer is not None:
                versus = f"**{fastest_peer / seconds:.2f}x**"
            peak, process = runs.median("peak_above_start"), runs.median("process_peak")
            name = f"**{runs.contender}**" if runs.contender == DASKSTREAM else runs.contender
            lines.append(
                f"| {FORMATS[key].label} | {stored} | {name} | {seconds:.3f} | {gbps:.2f} | {of_limit} | {versus} | "
                f"{_mib(peak)} | {_mib(process)} | {runs.check or ''} |"
            )
            rows.append(
                row
                | {
                    "gbps": gbps,
                    "percent_of_limit": None if limit is None else 100 * limit / seconds,
                    "vs_fastest_peer": None if fastest_peer is None else fastest_peer / seconds,
                    "peak_above_start": peak,
                    "process_peak": process,
                }
            )
    return "\n".join(lines), rows


def analysis_table(results: list[Runs], shape: tuple[int, int, int]) -> tuple[str, list[dict[str, Any]]]:
    """The analyses table: seconds and peak memory of each contender, and daskstream / xarray."""
    lines = [
        "| layout | analysis | contender | median s | peak above start MiB | process peak MiB | "
        "time ds/xr | peak ds/xr | check |",
        "|---|---|---|--:|--:|--:|--:|--:|---|",
    ]
    rows = []
    for runs in [r for r in results if r.part == "analyses"]:
        seconds, peak = runs.median("seconds"), runs.median("peak_above_start")
        label, analysis = layout_label(runs.dataset, shape), ANALYSES[runs.analysis or ""]
        row = {
            "layout": runs.dataset,
            "analysis": runs.analysis,
            "contender": runs.contender,
            "seconds": seconds,
            "peak_above_start": peak,
            "process_peak": runs.median("process_peak"),
            "failure": runs.failure,
            "check": runs.check,
            "runs": [r.get("seconds") for r in runs.reports or []],
        }
        rows.append(row)
        if runs.failure or seconds is None:
            lines.append(f"| {label} | {analysis} | {runs.contender} | n/a: {runs.failure} | | | | | |")
            continue
        ratio_time = ratio_peak = ""
        if runs.contender == DASKSTREAM:
            theirs = next(
                (
                    r
                    for r in results
                    if (r.part, r.dataset, r.analysis, r.contender) == ("analyses", runs.dataset, runs.analysis, XARRAY)
                ),
                None,
            )
            their_seconds = theirs.median("seconds") if theirs and not theirs.failure else None
            their_peak = theirs.median("peak_above_start") if theirs and not theirs.failure else None
            if their_seconds:
                ratio_time = f"**{seconds / their_seconds:.2f}**"
                row["time_ratio"] = seconds / their_seconds
            if their_peak and peak is not None:
                ratio_peak = f"**{peak / their_peak:.2f}**"
                row["peak_ratio"] = peak / their_peak
        name = f"**{runs.contender}**" if runs.contender == DASKSTREAM else runs.contender
        lines.append(
            f"| {label} | {analysis} | {name} | {seconds:.2f} | {_mib(peak)} | {_mib(runs.median('process_peak'))} | "
            f"{ratio_time} | {ratio_peak} | {runs.check or ''} |"
        )
    return "\n".join(lines), rows


def legend(part: str, contenders: list[str]) -> str:
    task = {"reads": "read", "writes": "write", "analyses": "analysis"}[part]
    lines = [f"- **{c}**: {HOW[(task, c)]}" for c in contenders if (task, c) in HOW]
    if part == "analyses":
        lines += [f"- {ANALYSES[a]}: {c}: {ANALYSIS_CODE[(a, c)]}" for a in ANALYSES for c in (XARRAY, DASKSTREAM)]
    return "\n".join(lines)


def machine(threads: int) -> dict[str, Any]:
    """The machine and the versions of every library measured."""
    import importlib.metadata

    import psutil

    model = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    versions = {"python": platform.python_version()}
    for name in (
        "daskstream",
        "dask",
        "numpy",
        "zarr",
        "zarrs",
        "tensorstore",
        "h5py",
        "hdf5plugin",
        "numcodecs",
        "xarray",
        "h5netcdf",
        "deflate",
        "scipy",
    ):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    import daskstream

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "threads_per_contender": threads,
        "platform": platform.platform(),
        "daskstream_from": str(Path(daskstream.__file__).parent),
        "versions": versions,
    }


# --- command line ---------------------------------------------------------------------------------


def _shape(text: str) -> tuple[int, int, int]:
    parts = tuple(int(p) for p in text.split(","))
    if len(parts) != 3 or min(parts) < 3:
        raise argparse.ArgumentTypeError(f"{text!r}: give time,lat,lon, each at least 3 (e.g. 365,90,180)")
    return parts  # type: ignore[return-value]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parts = ("reads", "writes", "analyses")
    contenders = list(CONTENDERS)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB", help="Bytes of the float32 field read and written (default 1GiB).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed runs of each contender (default 5).")
    parser.add_argument("--only", default=",".join(parts), help=f"Comma-separated parts, from {', '.join(parts)}.")
    parser.add_argument(
        "--formats",
        default=",".join([*FORMATS, *LAYOUTS]),
        help=f"Comma-separated data sets (default all): {', '.join(FORMATS)} (reads; writes take "
        f"{', '.join(WRITE_FORMATS)}), {', '.join(LAYOUTS)} (analyses).",
    )
    parser.add_argument(
        "--contenders", default=",".join(contenders), help=f"Comma-separated (default all): {', '.join(contenders)}."
    )
    parser.add_argument("--threads", type=int, default=2, help="Threads every contender gets (default 2).")
    parser.add_argument(
        "--chunk",
        type=int,
        default=CHUNK_SIDE,
        help="Side of the HDF5 and unsharded Zarr storage chunks (default 1024: 4 MiB; 512: 1 MiB).",
    )
    parser.add_argument(
        "--analyses", default=",".join(ANALYSES), help=f"Comma-separated analyses (default all): {', '.join(ANALYSES)}."
    )
    parser.add_argument(
        "--analysis-shape",
        type=_shape,
        default=ANALYSIS_SHAPE,
        help="time,lat,lon of the analysis field (default 3650,180,360; 365,90,180 runs in a minute).",
    )
    parser.add_argument("--data-dir", type=Path, default=REPO / "benchmarks" / "data", help="Where the data sets go.")
    parser.add_argument("--out", default="benchmarks/results/peers/peers", help="Results: <out>.md and <out>.json.")
    parser.add_argument("--timeout", type=float, default=1800, help="Seconds one run may take (default 1800).")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return args
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [p for p in args.only if p not in parts]
    unknown += [f for f in args.formats if f not in FORMATS and f not in LAYOUTS]
    unknown += [c for c in args.contenders if c not in contenders]
    args.analyses = [a.strip() for a in args.analyses.split(",") if a.strip()]
    unknown += [a for a in args.analyses if a not in ANALYSES]
    if unknown:
        parser.error(f"unknown {unknown}; see --help for the parts, data sets and contenders")
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    global CHUNK_SIDE, CHUNK
    args = parse_args(argv)
    if args.chunk != CHUNK_SIDE:  # for this process, and through the environment for each run's own
        CHUNK_SIDE, CHUNK = args.chunk, (args.chunk, args.chunk)
        os.environ["DASKSTREAM_PEERS_CHUNK"] = str(args.chunk)
    if args.one:
        spec = json.loads(args.one)
        print(RESULT_MARK + json.dumps(run_one(spec)), flush=True)
        return 0
    from daskstream.planning.budget import parse_budget

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    nbytes_asked = parse_budget(args.size, name="--size")
    rows = field_rows(nbytes_asked)
    nbytes = rows * COLS * 4
    args.data_dir = args.data_dir.resolve()
    command = "python -m benchmarks.peers " + shlex.join(sys.argv[1:] if argv is None else argv)
    info = machine(args.threads)
    results: list[Runs] = []
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: report what has run
        if "reads" in args.only:
            results += run_reads(args, rows, echo)
        if "writes" in args.only:
            results += run_writes(args, rows, echo)
        if "analyses" in args.only:
            results += run_analyses(args, echo)
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    header = (
        f"`{command.strip()}`\n\n"
        f"Machine: {info['cpu']}, {info['usable_cores']} usable cores of {info['cores']}, "
        f"{_size_text(info['memory_bytes'])} memory; {args.threads} threads per contender; medians of "
        f"{args.repeats} runs, each a fresh interpreter, contenders interleaved, warm page cache.\n\n"
        f"Versions: {versions} (daskstream from {info['daskstream_from']})."
    )
    sections, document = [header], {"command": command, "machine": info, "size_bytes": nbytes, "rows": rows}
    for part, title in (
        ("reads", f"Reads: float64 sum of a ({rows}, {COLS}) float32 field ({_size_text(nbytes)})"),
        ("writes", f"Writes: the ({rows}, {COLS}) float32 field from memory ({_size_text(nbytes)})"),
    ):
        if any(r.part == part for r in results):
            table, rows_json = throughput_table(results, nbytes, part)
            used = [c for c in CONTENDERS if any(r.part == part and r.contender == c for r in results)]
            sections.append(f"## {title}\n\n{table}\n\n{THROUGHPUT_NOTE}\n\n{legend(part, used)}")
            document[part] = rows_json
    if any(r.part == "analyses" for r in results):
        table, rows_json = analysis_table(results, args.analysis_shape)
        shape = args.analysis_shape
        sections.append(
            f"## Analyses: t(time, lat, lon) float32 {shape} "
            f"({_size_text(4 * math.prod(shape))}), NetCDF-4 read by h5netcdf\n\n{table}\n\n"
            f"ds/xr: daskstream's median over xarray's (below 1: daskstream faster or smaller). "
            f"check: daskstream's result against xarray's.\n\n{legend('analyses', [XARRAY, DASKSTREAM])}"
        )
        document["analyses"] = rows_json
    document["runs"] = [
        {
            "part": r.part,
            "dataset": r.dataset,
            "analysis": r.analysis,
            "contender": r.contender,
            "failure": r.failure,
            "stderr": r.stderr,
            "check": r.check,
            "stored_bytes": r.stored_bytes,
            "reports": [{k: v for k, v in rep.items() if k != "stderr"} for rep in r.reports or []],
        }
        for r in results
    ]
    text = "\n\n".join(sections)
    print(text)
    from benchmarks.timing import write_results

    write_results(args.out, text, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
