"""A slow ``store`` to be killed or starved part-way, for tests/compute/test_store.py.

Run as ``python store_worker.py SOURCE TARGET COUNTER_DIR DELAY [FSIZE_LIMIT]``: it
stores ``slow_double(open(SOURCE))`` to TARGET on the threaded scheduler,
prints ``progress DONE TOTAL`` after each recorded block and, on a daskstream
error, one JSON line describing it. With FSIZE_LIMIT, no file it writes may
grow beyond that many bytes (the kernel's RLIMIT_FSIZE): writes past it fail
with EFBIG, as on a full disk.

The test process imports :func:`build` too, so both sides compute the same
array under the same name.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import dask
import numpy as np

# Chunks of the source array as the worker and the test open it: 1 MiB float32 blocks.
CHUNKS = (64, 4096)


class Pacing:
    """Where ``slow_double`` counts its calls and how long a varying block takes.

    Its token is the same whatever the folder and the delay, which change how the
    blocks are computed but not what they hold: dask versions that append a token
    of the arguments to ``map_blocks(name=...)`` then still name both processes'
    arrays alike.
    """

    def __init__(self, counter_dir: str, delay: float) -> None:
        self.counter_dir = counter_dir
        self.delay = delay

    def __dask_tokenize__(self) -> str:
        return "store-worker-pacing"


def slow_double(block: np.ndarray, pacing: Pacing, block_info: dict | None = None) -> np.ndarray:
    """``2 * block``, leaving one file per computation in ``pacing.counter_dir``.

    Blocks that vary take ``pacing.delay`` seconds; constant ones are quick, so in
    the disk-full test they are written before a slow, incompressible block fails.
    """
    index = ".".join(map(str, block_info[0]["chunk-location"]))  # type: ignore[index]
    # One file per call, named by block: the test counts which blocks were computed where.
    with open(os.path.join(pacing.counter_dir, f"{index}-{os.getpid()}-{uuid.uuid4().hex}"), "wb"):
        pass
    if block.size and block.min() != block.max():
        time.sleep(pacing.delay)
    return block * 2


def build(source: str, counter_dir: str, delay: float):
    """The array both processes store, under the same name in both."""
    import daskstream as ds

    x = ds.open(source, chunks=CHUNKS)
    return x.map_blocks(slow_double, Pacing(counter_dir, delay), dtype=x.dtype, name=f"slow-double-{x.name}")


def main(argv: list[str]) -> int:
    source, target, counter_dir, delay = argv[1], argv[2], argv[3], float(argv[4])
    if len(argv) > 5:
        import resource
        import signal

        # Without this the kernel kills the process (SIGXFSZ) instead of failing the write.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(argv[5])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    from daskstream.compute.store import store
    from daskstream.errors import DaskstreamError

    def report(done: int, total: int) -> None:
        print(f"progress {done} {total}", flush=True)

    # The kernel taken from this file as the module the test imports, not as __main__: dask versions
    # that tokenize a function by its pickle (module included) then name the array as the test does.
    from store_worker import build as build_as_imported

    with dask.config.set(scheduler="threads", num_workers=2):
        try:
            store(build_as_imported(source, counter_dir, delay), target, progress=report)
        except DaskstreamError as exc:
            kinds = [cls.__name__ for cls in type(exc).__mro__]
            print(json.dumps({"error": kinds, "message": str(exc)}), flush=True)
            return 3
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
