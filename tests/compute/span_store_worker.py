"""A slow store of an array read in spans, to be killed part-way, for tests/compute/test_span_stores.py.

Run as ``python span_store_worker.py SOURCE TARGET DELAY``: it stores
:func:`build` of SOURCE (a Zarr array opened in spans) to TARGET (Zarr, or
HDF5 as ``path::/name``) on the threaded scheduler, every read of the source
taking DELAY seconds more, printing ``progress N`` as N chunks are recorded. The
test process imports :func:`build` too, so both sides store the same array
under the same name.
"""

from __future__ import annotations

import sys
import time

import dask
from span_helpers import BUDGET, SPANNED


def build(source: str):
    """The array both processes store: an element-wise expression of the source, read in spans."""
    import daskstream as ds

    return ds.open(source, memory_budget=BUDGET) * 2 + 1


def main(argv: list[str]) -> int:
    source, target, delay = argv[1], argv[2], float(argv[3])
    import daskstream as ds

    source_class = type(ds.open_source(source))
    read = source_class.__getitem__

    def slow_read(self, index):
        time.sleep(delay)
        return read(self, index)

    source_class.__getitem__ = slow_read
    with dask.config.set({**SPANNED, "scheduler": "threads", "num_workers": 2}):
        ds.store(build(source), target, progress=lambda done, total: print("progress", done, flush=True))
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
