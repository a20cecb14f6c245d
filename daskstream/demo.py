"""Sample data sets and the ``daskstream demo`` walk-through."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator

import dask
import numpy as np

import daskstream as ds
from daskstream.errors import TargetExistsError
from daskstream.planning.budget import format_size, parse_budget

FORMATS = ("npy", "hdf5", "zarr")
_SAMPLE_NAMES = {"npy": "field.npy", "hdf5": "field.h5", "zarr": "field.zarr"}
_ROW = 1024  # items per row of the sample field
_SLAB_BYTES = 32 * 2**20  # written a slab at a time: never the whole array in memory


def sample_slabs(shape: tuple[int, int], *, seed: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(first_row, slab)`` of a float32 field: a smooth signal plus noise, rounded to 0.01.

    Realistic for codecs (compressible, not constant) and reproducible from ``seed``.
    """
    rows, cols = shape
    step = max(1, _SLAB_BYTES // (cols * 4))
    x = np.linspace(0, 8 * np.pi, cols, dtype=np.float32)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        rng = np.random.default_rng([seed, start])
        y = np.arange(start, stop, dtype=np.float32)[:, None] / max(rows, 1) * 6 * np.pi
        slab = np.sin(x)[None, :] * np.cos(y) + rng.normal(0, 0.1, (stop - start, cols)).astype(np.float32)
        yield start, np.round(slab, 2).astype(np.float32)


def sample_shape(nbytes: int) -> tuple[int, int]:
    """Shape of a float32 sample field of about ``nbytes``, 1024 items a row."""
    return (max(1, nbytes // (4 * _ROW)), _ROW)


def write_sample(path: str, fmt: str, nbytes: int | str, *, seed: int = 0) -> str:
    """Write the sample field of about ``nbytes`` to ``path`` as ``fmt``; return the path to open.

    HDF5 gets chunks of 256 rows with gzip level 1 and shuffle; Zarr gets
    format 3 with zstd, chunks of 256 rows.
    """
    shape = sample_shape(parse_budget(nbytes, name="size"))
    writers: dict[str, Callable[[str, tuple[int, int], int], str]] = {
        "npy": _write_npy,
        "hdf5": _write_hdf5,
        "zarr": _write_zarr,
    }
    return writers[fmt](path, shape, seed)


def _write_npy(path: str, shape: tuple[int, int], seed: int) -> str:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    for start, slab in sample_slabs(shape, seed=seed):
        out[start : start + len(slab)] = slab
        out.flush()
    del out
    return path


def _write_hdf5(path: str, shape: tuple[int, int], seed: int) -> str:
    import h5py

    with h5py.File(path, "w") as f:
        dset = f.create_dataset(
            "/field", shape=shape, dtype="f4", chunks=(min(256, shape[0]), shape[1]),
            compression="gzip", compression_opts=1, shuffle=True,
        )  # fmt: skip
        for start, slab in sample_slabs(shape, seed=seed):
            dset[start : start + len(slab)] = slab
    return f"{path}::/field"


def _write_zarr(path: str, shape: tuple[int, int], seed: int) -> str:
    import zarr

    arr = zarr.create_array(
        path, shape=shape, dtype="f4", chunks=(min(256, shape[0]), shape[1]),
        compressors=zarr.codecs.ZstdCodec(level=3), overwrite=True,
    )  # fmt: skip
    for start, slab in sample_slabs(shape, seed=seed):
        arr[start : start + len(slab)] = slab
    return path


def run_demo(
    folder: str, *, size: int | str = "256MiB", formats: tuple[str, ...] = FORMATS, echo: Callable[[str], None] = print
) -> dict[str, dict[str, float]]:
    """Write the sample in each format, open it, print its plan and a timed reduction.

    Returns, per format, the figures printed (``seconds``, ``gbps``, ``sum``).
    """

    nbytes = parse_budget(size, name="size")
    targets = {fmt: os.path.join(folder, _SAMPLE_NAMES[fmt]) for fmt in formats}
    # Never over a file of the user's: the folder given may hold data with these names.
    existing = [path for path in targets.values() if os.path.lexists(path)]
    if existing:
        raise TargetExistsError(
            f"{', '.join(existing)} already exist(s); the demo writes new sample files only and never replaces "
            "a file: give an empty folder (--dir), or remove them"
        )
    results = {}
    for fmt in formats:
        target = targets[fmt]
        t0 = time.perf_counter()
        location = write_sample(target, fmt, nbytes)
        echo(
            f"== {fmt}: wrote {format_size(math.prod(sample_shape(nbytes)) * 4)} to {location} in {time.perf_counter() - t0:.1f} s"
        )
        source = ds.open_source(location)
        echo(repr(source))
        plan = ds.plan(source)
        echo(plan.explain())
        x = ds.open(source, chunks=plan)
        seconds = math.inf
        for _ in range(2):  # the best of two: the first also pays for starting the thread pool
            t0 = time.perf_counter()
            total, mean_row = dask.compute(x.sum(dtype="f8"), x.mean(axis=0))
            seconds = min(seconds, time.perf_counter() - t0)
        gbps = source.nbytes / seconds / 1e9
        echo(
            f"sum = {float(total):.6g}, mean over axis 0: shape {mean_row.shape}, first values "
            f"{np.round(mean_row[:3].astype(float), 4).tolist()}; one pass over {format_size(source.nbytes)} "
            f"in {seconds:.2f} s = {gbps:.2f} GB/s\n"
        )
        results[fmt] = {"seconds": seconds, "gbps": gbps, "sum": float(total)}
    return results
