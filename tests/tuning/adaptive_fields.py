"""The fields and kernels the adaptive-run tests compute over: real files written with numpy, h5py and zarr."""

from __future__ import annotations

import os

import h5py
import numpy as np
import zarr

SHAPE = (16384, 512)


def write(tmp_path, kind: str, values: np.ndarray) -> str:
    """``values`` as a .npy file, a gzip+shuffle HDF5 dataset or a Zarr array (64-row chunks), opened by path."""
    if kind == "npy":
        path = tmp_path / "a.npy"
        np.save(path, values)
        return str(path)
    if kind == "hdf5":
        path = tmp_path / "a.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=values, chunks=(64, SHAPE[1]), compression="gzip", shuffle=True)
        return f"{path}::x"
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=values.shape, chunks=(64, SHAPE[1]), dtype=values.dtype)[:] = values
    return str(path)


def three_rows(block: np.ndarray) -> np.ndarray:
    """The mean of each cell and its neighbours along the first axis (a stencil reaching one row)."""
    out = block.copy()
    out[1:-1] = (block[:-2] + block[1:-1] + block[2:]) / 3
    return out


def three_rows_of(values: np.ndarray) -> np.ndarray:
    """numpy's :func:`three_rows` of the whole array, the edges repeated: the oracle."""
    padded = np.pad(values, ((1, 1), (0, 0)), mode="edge")
    return ((padded[:-2] + padded[1:-1] + padded[2:]) / 3).astype("f4")


def cli_environment(tmp_path) -> dict[str, str]:
    """The environment of ``daskstream ... --adaptive`` processes: the ``adaptive`` fixture's settings,
    as environment variables, with a tuning cache the processes share."""
    return {
        **os.environ,
        "DASK_DASKSTREAM__TUNE__CACHE": str(tmp_path / "cli-tune.json"),
        "DASK_DASKSTREAM__ADAPTIVE__MIN_SECONDS": "0",
        "DASK_DASKSTREAM__ADAPTIVE__TRIAL_FRACTION": "0.5",
        "DASK_DASKSTREAM__PLANNING__TARGET_CHUNK_BYTES": "256KiB",
        "DASK_DASKSTREAM__PLANNING__TASK_OVERHEAD": "10us",
    }
