"""Writing: daskstream's store against plain dask into the same Zarr and HDF5 targets, and the encoders' limit.

For each target codec the same source (the benchmark field as ``.npy``, warm in
the page cache) is written, with the same chunks and codec, by:

* **daskstream**: ``ds.store(ds.open(path), target, compressor=codec)``, chunks
  encoded in the tasks' own threads;
* **daskstream via zarr**: the same with ``daskstream.compute.encode-in-tasks``
  off, every chunk written through zarr (what store did before);
* **dask**: ``da.from_array(np.load(path, mmap_mode="r"), chunks=...).to_zarr(target,
  compressors=codec)`` (and ``da.store`` into an h5py dataset for HDF5);
* **xarray** (with ``.[bench]`` installed): ``Dataset.to_zarr`` of the same dask array.

The **sharded** target holds each task's block as one shard of 256-row chunks
(``store(..., inner_chunks=)`` against ``to_zarr(..., shards=, chunks=)``). The
**from hdf5-gzip / zarr-zstd** rows store the same field read from an HDF5
(gzip 1 + shuffle) or Zarr (zstd 3) copy instead, against ``da.from_array`` of
the h5py dataset and ``da.from_zarr``.

The **HDF5 from spans** rows store the field read in spans (a graph ceiling
set low, so each task of the source streams several chunks; the target gets a
task per chunk, gathered by the one writer) against daskstream storing the same
chunks read a chunk per task: "vs plain dask" is then against the latter.

The **encode limit** is the codec's single-thread rate on the same chunks
(encoding them one after another in this process, untimed once first) times
the threads: no writer that encodes can beat it. "% of limit" is a writer's
rate over it. The 3x3 **stencil** row computes a 3x3 mean filter
(``ds.map_blocks(..., depth=1)`` against ``da.map_overlap``) and stores it.

Every contender runs on dask's threaded scheduler, alternating A B C A B C for
``--repeats`` rounds after one untimed round; the median is reported. Targets
are removed between runs. **Peak** is the most the process's resident memory
rose above where it stood when a run began (sampled every 5 ms), the largest
over the rounds.

    python -m benchmarks.write [--size 512MiB] [--repeats 3] [--threads N] [--targets zarr,sources,hdf5,hdf5-spans]
                               [--out benchmarks/results/write]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numcodecs
import numpy as np
import psutil
from dask.utils import format_bytes, parse_bytes

import daskstream as ds
from benchmarks.open_sum import machine_info
from benchmarks.samples import ensure

# Chunks inside a shard of the sharded target: 1 MiB of 1024-float32 rows.
SHARD_INNER_ROWS = 256


def codecs() -> dict[str, tuple[str, Any, Any, bool]]:
    """name: (label, zarr compressor, the numcodecs codec that encodes the same bytes, sharded)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    return {
        "zstd-3": ("Zarr v3, zstd 3", ZstdCodec(level=3), numcodecs.Zstd(level=3), False),
        "zstd-1": ("Zarr v3, zstd 1", ZstdCodec(level=1), numcodecs.Zstd(level=1), False),
        "lz4-bitshuffle": (
            "Zarr v3, blosc lz4 + bit-shuffle",
            BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),
            numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE),
            False,
        ),
        "sharded-zstd-3": (
            f"Zarr v3 sharded ({SHARD_INNER_ROWS}-row chunks in each shard), zstd 3",
            ZstdCodec(level=3),
            numcodecs.Zstd(level=3),
            True,
        ),
    }


class PeakMemory:
    """The most this process's resident memory rose above where it stood at the start, sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        process = psutil.Process()
        start = process.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, process.memory_info().rss - start)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


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


def contenders(
    path: str, chunks: tuple[int, int], compressor: Any, target: Path, sharded: bool
) -> dict[str, Callable[[], None]]:
    inner = (SHARD_INNER_ROWS, chunks[1])
    ours: dict[str, Any] = {"inner_chunks": inner} if sharded else {}
    theirs: dict[str, Any] = {"shards": chunks, "chunks": inner} if sharded else {}

    def daskstream_store(encode_in_tasks: bool, stencil: bool = False) -> Callable[[], None]:
        def run() -> None:
            x = ds.open(path, chunks=chunks)
            if stencil:
                x = ds.map_blocks(padded_mean3x3, x, depth=1, boundary=0)
            with dask.config.set({"daskstream.compute.encode-in-tasks": encode_in_tasks}):
                ds.store(x, target, compressor=compressor, **ours)

        return run

    def dask_to_zarr(stencil: bool = False) -> Callable[[], None]:
        def run() -> None:
            x = da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
            if stencil:
                x = x.map_overlap(padded_mean3x3, depth=1, boundary=0, dtype=x.dtype)
            x.to_zarr(str(target), compressors=compressor, **theirs)

        return run

    runs = {
        "daskstream": daskstream_store(True),
        "daskstream via zarr": daskstream_store(False),
        "dask to_zarr": dask_to_zarr(),
    }
    xarray_run = xarray_to_zarr(path, chunks, compressor, target, theirs)
    if xarray_run is not None:
        runs["xarray to_zarr"] = xarray_run
    if not sharded:
        runs["stencil: daskstream"] = daskstream_store(True, stencil=True)
        runs["stencil: dask"] = dask_to_zarr(stencil=True)
    return runs


def xarray_to_zarr(
    path: str, chunks: tuple[int, int], compressor: Any, target: Path, shards: dict[str, Any]
) -> Callable[[], None] | None:
    """xarray's ``to_zarr`` of the same dask array (``None`` where xarray is not installed: ``.[bench]``)."""
    try:
        import xarray as xr
    except ImportError:
        return None

    def run() -> None:
        x = da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
        encoding = {"compressors": compressor, **shards}
        xr.Dataset({"x": (("y", "x"), x)}).to_zarr(
            str(target), encoding={"x": encoding}, zarr_format=3, consolidated=False
        )

    return run


def source_contenders(key: str, where: str, chunks: tuple[int, int], compressor: Any, target: Path) -> dict[str, Any]:
    """The same store from an HDF5 or Zarr copy of the field: daskstream's reads and encodes against dask's."""
    import h5py
    import zarr

    def daskstream_store() -> None:
        ds.store(ds.open(where, chunks=chunks), target, compressor=compressor)

    def dask_store() -> None:
        path, _, member = where.partition("::")
        if key.startswith("hdf5"):
            with h5py.File(path, "r") as f:
                da.from_array(f[member], chunks=chunks).to_zarr(str(target), compressors=compressor)
        else:
            da.from_zarr(zarr.open_array(path, path=member, mode="r")).rechunk(chunks).to_zarr(
                str(target), compressors=compressor
            )

    return {f"from {key}: daskstream": daskstream_store, f"from {key}: dask to_zarr": dask_store}


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


# A graph ceiling low enough that the field is read in spans of several chunks per task, at SPAN_BUDGET.
SPANNED = {"daskstream.planning.max-tasks": 16, "daskstream.planning.first-task-within": None}
SPAN_BUDGET = "64MiB"


def hdf5_span_contenders(path: str, target: Path) -> dict[str, Callable[[], None]]:
    """The field read in spans (each task streaming several chunks) stored to HDF5, a task per target chunk
    gathered by the one writer, against the same store of the same chunks read a chunk per task."""
    with dask.config.set(SPANNED):
        plan = ds.plan(path, memory_budget=SPAN_BUDGET)
    assert plan.span is not None, "the field is not read in spans at this size"
    gzip = {"compression": "gzip", "compression_opts": 1, "shuffle": True}

    def spanned() -> None:
        with dask.config.set(SPANNED):
            ds.store(ds.open(path, memory_budget=SPAN_BUDGET), f"{target}::/x", compressor=gzip)

    def chunked() -> None:
        ds.store(ds.open(path, chunks=plan.chunks, memory_budget=SPAN_BUDGET), f"{target}::/x", compressor=gzip)

    return {"daskstream, read in spans (HDF5, gzip 1)": spanned, "daskstream, a chunk per task (HDF5, gzip 1)": chunked}


def timed(runs: dict[str, Callable[[], None]], target: Path, repeats: int) -> dict[str, tuple[float, int]]:
    """Per contender: the median seconds of ``repeats`` alternating rounds, and its largest rise in memory."""

    def once(run: Callable[[], None]) -> tuple[float, int]:
        shutil.rmtree(target, ignore_errors=True)
        if target.is_file():
            target.unlink()
        gc.collect()
        with PeakMemory() as memory:
            start = time.perf_counter()
            run()
            seconds = time.perf_counter() - start
        shutil.rmtree(target, ignore_errors=True)
        if target.is_file():
            target.unlink()
        return seconds, memory.peak

    for run in runs.values():
        once(run)
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            results[name].append(once(run))
    return {
        name: (statistics.median(s for s, _ in values), max(p for _, p in values)) for name, values in results.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--chunk-rows", type=int, default=4096, help="rows per chunk (1024 float32 a row)")
    parser.add_argument("--out", default="benchmarks/results/write")
    parser.add_argument("--targets", default="zarr,sources,hdf5,hdf5-spans", help="which rows to measure")
    args = parser.parse_args(argv)
    targets = set(args.targets.split(","))

    path = ensure("npy", parse_bytes(args.size))
    source = np.load(path, mmap_mode="r")
    _ = np.asarray(source).sum()  # warm the page cache
    chunks = (args.chunk_rows, int(source.shape[1]))
    rows = []

    def add(label: str, medians: dict[str, tuple[float, int]], baseline: Callable[[str], str], limit: float | None):
        for contender, (seconds, peak) in medians.items():
            rate = source.nbytes / seconds
            rows.append({"target": label, "writer": contender, "seconds": seconds, "GB/s": rate / 1e9,
                         "of_limit": None if limit is None else rate / limit, "peak_bytes": peak,
                         "vs_dask": medians[baseline(contender)][0] / seconds})  # fmt: skip

    with dask.config.set(scheduler="threads", num_workers=args.threads), tempfile.TemporaryDirectory() as scratch:
        for name, (label, compressor, codec, sharded) in codecs().items() if "zarr" in targets else ():
            limit = encode_rate(np.asarray(source), SHARD_INNER_ROWS if sharded else args.chunk_rows, codec)
            limit *= args.threads
            target = Path(scratch) / f"{name}.zarr"
            medians = timed(contenders(path, chunks, compressor, target, sharded), target, args.repeats)
            add(label, medians, lambda c: "stencil: dask" if c.startswith("stencil") else "dask to_zarr", limit)
            print(f"{label}: encode limit {limit / 1e9:.2f} GB/s ({args.threads} threads)", flush=True)
        zstd = codecs()["zstd-3"][1]
        for key in ("hdf5-gzip", "zarr-zstd") if "sources" in targets else ():
            where = ensure(key, parse_bytes(args.size))
            target = Path(scratch) / f"from-{key}.zarr"
            medians = timed(source_contenders(key, where, chunks, zstd, target), target, args.repeats)
            add("Zarr v3, zstd 3", medians, lambda c: c.replace("daskstream", "dask to_zarr"), None)
        target = Path(scratch) / "out.h5"
        if "hdf5" in targets:
            medians = timed(hdf5_contenders(path, chunks, target), target, args.repeats)
            add("HDF5, gzip 1 + shuffle", medians, lambda c: "dask da.store (HDF5, gzip 1)", None)
        if "hdf5-spans" in targets:
            # Against daskstream itself: plain dask has no spans to store.
            medians = timed(hdf5_span_contenders(path, target), target, args.repeats)
            add(
                "HDF5 from spans, gzip 1 + shuffle",
                medians,
                lambda c: "daskstream, a chunk per task (HDF5, gzip 1)",
                None,
            )

    lines = [
        f"Writing a {format_bytes(source.nbytes)} float32 field (.npy, warm, unless named) in chunks of {chunks}, "
        f"{args.threads} threads, median of {args.repeats}; peak: the most memory rose during a run",
        "",
        "| target | writer | s | GB/s | % of encode limit | vs plain dask | peak |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        share = f"{row['of_limit']:.0%}" if row["of_limit"] is not None else "-"
        lines.append(f"| {row['target']} | {row['writer']} | {row['seconds']:.2f} | {row['GB/s']:.2f} | {share} | "
                     f"{row['vs_dask']:.2f}x | {format_bytes(row['peak_bytes'])} |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps({"machine": machine_info(args.threads), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
