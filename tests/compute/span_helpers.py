"""What the tests of spans share: the settings that plan small files in spans, and a counter of reads."""

from __future__ import annotations

import threading

import h5py
import numpy as np
import zarr

#: Few enough tasks in a graph that the small files here are planned in spans.
SPANNED = {"daskstream.planning.max-tasks": 24, "daskstream.planning.first-task-within": None}
BUDGET = "16MiB"  # chunks of about 1.1 MiB: large enough to stream (span_chunk_floor_bytes)


class Reads:
    """Every read a source class makes while installed (through ``method``: ``read`` for a kernel's, which
    reads its regions itself): its region, its bytes, and how many run at once at most."""

    def __init__(self, monkeypatch, source_class, method="__getitem__"):
        self.sizes: list[int] = []
        self.regions: list[tuple[tuple[int, int], ...]] = []
        self.running = self.most_at_once = 0
        lock = threading.Lock()
        read = getattr(source_class, method)

        def counted(source, index):
            with lock:
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            try:
                block = read(source, index)
            finally:
                with lock:
                    self.running -= 1
            with lock:
                self.sizes.append(block.nbytes)
                self.regions.append(tuple((s.start, s.stop) for s in index))
            return block

        monkeypatch.setattr(source_class, method, counted)


def write_field(folder):
    """One float32 field as .npy, chunked HDF5 and Zarr v3, with a NaN, in storage chunks of 20 rows: the
    data and each file's path."""
    data = np.random.default_rng(7).standard_normal((24_000, 40, 6)).astype("f4")
    data[11, 3, 2] = np.nan
    np.save(folder / "a.npy", data)
    with h5py.File(folder / "a.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(20, 40, 6))
    zarr.create_array(folder / "a.zarr", data=data, chunks=(20, 40, 6))
    return data, {"npy": str(folder / "a.npy"), "hdf5": f"{folder / 'a.h5'}::/x", "zarr": str(folder / "a.zarr")}
