"""Writing: daskstream's store against plain dask into the same Zarr and HDF5 targets, and the encoders' limit.

For each target codec the same source (the benchmark field as ``.npy``, warm in
the page cache) is written, with the same chunks and codec, by:

* **daskstream**: ``ds.store(ds.open(path), target, compressor=codec)``, chunks
  encoded in the tasks' own threads;
* **daskstream via zarr**: the same with ``daskstream.compute.encode-in-tasks``
  off, every chunk written through zarr (what store did before);
* **dask**: ``da.from_array(np.load(path, mmap_mode="r"), chunks=...).to_zarr(target,
  compressors=codec)`` (and ``da.store`` into an h5py dataset for HDF5).

The **encode limit** is the codec's single-thread rate on the same chunks
(encoding them one after another in this process, untimed once first) times
the threads: no writer that encodes can beat it. "% of limit" is a writer's
rate over it. The 3x3 **stencil** row computes a 3x3 mean filter
(``ds.map_blocks(..., depth=1)`` against ``da.map_overlap``) and stores it.

Every contender runs on dask's threaded scheduler, alternating A B C A B C for
``--repeats`` rounds after one untimed round; the median is reported. Targets
are removed between runs.

    python -m benchmarks.write [--size 512MiB] [--repeats 3] [--threads N] [--out benchmarks/results/write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numcodecs
import numpy as np
from dask.utils import format_bytes, parse_bytes

import daskstream as ds
from benchmarks.open_sum import machine_info
from benchmarks.samples import ensure


def codecs() -> dict[str, tuple[str, Any, Any]]:
    """name: (label, zarr compressor, the numcodecs codec that encodes the same bytes)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    return {
        "zstd-3": ("Zarr v3, zstd 3", ZstdCodec(level=3), numcodecs.Zstd(level=3)),
        "zstd-1": ("Zarr v3, zstd 1", ZstdCodec(level=1), numcodecs.Zstd(level=1)),
        "lz4-bitshuffle": (
            "Zarr v3, blosc lz4 + bit-shuffle",
            BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),
            numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE),
        ),
    }


def encode_rate(source: np.ndarray, chunk_rows: int, codec: Any) -> float:
    """Bytes per second one thread encodes ``source`` at, chunk by chunk (after one untimed chunk)."""
    codec.encode(np.ascontiguousarray(source[:chunk_rows]))
    start = time.perf_counter()
    for row in range(0, source.shape[0], chunk_rows):
        codec.encode(np.ascontiguousarray(source[row : row + chunk_rows]))
    return source.nbytes / (time.perf_counter() - start)


def mean3x3(block: np.ndarray) -> np.ndarray:
    """The 3x3 mean of a block with a halo of 1, the halo trimmed."""
    out = np.zeros((block.shape[0] - 2, block.shape[1] - 2), dtype=block.dtype)
    for dr in range(3):
        for dc in range(3):
            out += block[dr : dr + block.shape[0] - 2, dc : dc + block.shape[1] - 2]
    return out / np.asarray(9, dtype=block.dtype)


def padded_mean3x3(block: np.ndarray) -> np.ndarray:
    """The same in the haloed block's shape: both libraries trim the halo themselves."""
    out = np.zeros_like(block)
    out[1:-1, 1:-1] = mean3x3(block)
    return out


def contenders(path: str, chunks: tuple[int, int], compressor: Any, target: Path) -> dict[str, Callable[[], None]]:
    def daskstream_store(encode_in_tasks: bool, stencil: bool = False) -> Callable[[], None]:
        def run() -> None:
            x = ds.open(path, chunks=chunks)
            if stencil:
                x = ds.map_blocks(padded_mean3x3, x, depth=1, boundary=0)
            with dask.config.set({"daskstream.compute.encode-in-tasks": encode_in_tasks}):
                ds.store(x, target, compressor=compressor)

        return run

    def dask_to_zarr(stencil: bool = False) -> Callable[[], None]:
        def run() -> None:
            x = da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
            if stencil:
                x = x.map_overlap(padded_mean3x3, depth=1, boundary=0, dtype=x.dtype)
            x.to_zarr(str(target), compressors=compressor)

        return run

    return {
        "daskstream": daskstream_store(True),
        "daskstream via zarr": daskstream_store(False),
        "dask to_zarr": dask_to_zarr(),
        "stencil: daskstream": daskstream_store(True, stencil=True),
        "stencil: dask": dask_to_zarr(stencil=True),
    }


def hdf5_contenders(path: str, chunks: tuple[int, int], target: Path) -> dict[str, Callable[[], None]]:
    import h5py

    def daskstream_store() -> None:
        ds.store(ds.open(path, chunks=chunks), f"{target}::/x", compressor={"compression": "gzip", "compression_opts": 1,
                                                                             "shuffle": True})  # fmt: skip

    def dask_store() -> None:
        x = da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
        with h5py.File(target, "w") as f:
            out = f.create_dataset("x", shape=x.shape, dtype=x.dtype, chunks=chunks, compression="gzip",
                                   compression_opts=1, shuffle=True)  # fmt: skip
            da.store(x, out, lock=True)

    return {"daskstream (HDF5, gzip 1)": daskstream_store, "dask da.store (HDF5, gzip 1)": dask_store}


def timed(runs: dict[str, Callable[[], None]], target: Path, repeats: int) -> dict[str, float]:
    def once(run: Callable[[], None]) -> float:
        shutil.rmtree(target, ignore_errors=True)
        if target.is_file():
            target.unlink()
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        shutil.rmtree(target, ignore_errors=True)
        if target.is_file():
            target.unlink()
        return seconds

    for run in runs.values():
        once(run)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(once(run))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--chunk-rows", type=int, default=4096, help="rows per chunk (1024 float32 a row)")
    parser.add_argument("--out", default="benchmarks/results/write")
    args = parser.parse_args(argv)

    path = ensure("npy", parse_bytes(args.size))
    source = np.load(path, mmap_mode="r")
    _ = np.asarray(source).sum()  # warm the page cache
    chunks = (args.chunk_rows, int(source.shape[1]))
    rows = []
    with dask.config.set(scheduler="threads", num_workers=args.threads), tempfile.TemporaryDirectory() as scratch:
        for name, (label, compressor, codec) in codecs().items():
            limit = encode_rate(np.asarray(source), args.chunk_rows, codec) * args.threads
            target = Path(scratch) / f"{name}.zarr"
            medians = timed(contenders(path, chunks, compressor, target), target, args.repeats)
            for contender, seconds in medians.items():
                rate = source.nbytes / seconds
                rows.append({"target": label, "writer": contender, "seconds": seconds, "GB/s": rate / 1e9,
                             "of_limit": rate / limit, "vs_dask": None})  # fmt: skip
            for row in rows[-len(medians) :]:
                other = "stencil: dask" if row["writer"].startswith("stencil") else "dask to_zarr"
                row["vs_dask"] = medians[other] / row["seconds"]
            print(f"{label}: encode limit {limit / 1e9:.2f} GB/s ({args.threads} threads)", flush=True)
        target = Path(scratch) / "out.h5"
        medians = timed(hdf5_contenders(path, chunks, target), target, args.repeats)
        for contender, seconds in medians.items():
            rows.append({"target": "HDF5, gzip 1 + shuffle", "writer": contender, "seconds": seconds,
                         "GB/s": source.nbytes / seconds / 1e9, "of_limit": None,
                         "vs_dask": medians["dask da.store (HDF5, gzip 1)"] / seconds})  # fmt: skip

    lines = [
        f"Writing a {format_bytes(source.nbytes)} float32 field (.npy, warm) in chunks of {chunks}, "
        f"{args.threads} threads, median of {args.repeats}",
        "",
        "| target | writer | s | GB/s | % of encode limit | vs plain dask |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        share = f"{row['of_limit']:.0%}" if row["of_limit"] is not None else "-"
        lines.append(f"| {row['target']} | {row['writer']} | {row['seconds']:.2f} | {row['GB/s']:.2f} | {share} | "
                     f"{row['vs_dask']:.2f}x |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps({"machine": machine_info(args.threads), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
