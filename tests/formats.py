"""One array written as .npy, chunked HDF5 and Zarr v3: the same values through each reader."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import zarr


def in_each_format(folder: Path, data: np.ndarray, rows: int) -> dict[str, str]:
    """``data`` saved as ``a.npy``, ``a.h5::/x`` and ``a.zarr`` in ``folder``, stored in chunks of ``rows`` whole
    rows; the paths ``ds.open`` takes, by format."""
    np.save(folder / "a.npy", data)
    chunks = (rows, *data.shape[1:])
    with h5py.File(folder / "a.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=chunks)
    zarr.create_array(folder / "a.zarr", data=data, chunks=chunks)
    return {"npy": str(folder / "a.npy"), "hdf5": f"{folder / 'a.h5'}::/x", "zarr": str(folder / "a.zarr")}
