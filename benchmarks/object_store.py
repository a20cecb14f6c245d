"""Arrays on an object store: daskstream against plain dask, xarray and raw parallel GETs, over S3 with latency.

The benchmark field (``benchmarks.samples``: float32, 1024 items a row) is
written once per layout, by zarr, into moto's S3 server on 127.0.0.1
(``tests/objects/s3_server.py``), which waits ``--latency`` seconds before it
answers each request, as a store across a network would, and counts requests
by kind. Layouts: Zarr v3 in 1 MiB chunks, Zarr v3 sharded (16 MiB shards of
1 MiB chunks) and Zarr v2 in 1 MiB chunks, all zstd 3.

**Reads**, each timed from opening the array to its sum:

* daskstream: ``float(ds.reduce(ds.open(url, storage_options=o), "sum"))`` and
  ``ds.open(url, storage_options=o).sum().compute()``; also the reduction alone
  with the array opened before the timer (what opening costs);
* plain dask: ``da.from_zarr(url, storage_options=o).sum().compute()``;
* xarray (where installed, ``pip install '.[bench]'``):
  ``xr.open_zarr(group, storage_options=o, chunks="auto")["field"].sum().compute()``;
* the floor: every chunk or shard object fetched by one s3fs
  ``fs.cat(paths, max_concurrency=1)``, concurrent on fsspec's event loop, one
  GET per object and nothing decoded (``max_concurrency=1``: without it s3fs
  sends a HEAD before each GET, a row of its own); also with ``batch_size`` the
  most requests daskstream keeps in flight (threads x
  ``daskstream.objects.requests-per-task``), and the same GETs followed by zstd
  decoding and a float64 sum of every chunk in the scheduler's threads.

**Writes**: the same array (the field as a warm local ``.npy`` opened by
``ds.open`` in 1 MiB blocks, or 16 MiB blocks for the sharded target) stored by
``ds.store(x, url, storage_options=o, overwrite=True)`` and by dask's
``x.to_zarr(url, storage_options=o, mode="w")`` with the same codec, into an
emptied prefix. Each writer's first result is read back and summed. The
**encode limit** is zstd 3's single-thread rate over the same 1 MiB chunks
times the threads: no writer that encodes can beat it.

Every run is in this process, on dask's threaded scheduler with ``--threads``
threads; each read opens the array afresh (the filesystems and their
connections stay from run to run, as in a long session). Contenders of one
layout alternate, A B C A B C ..., for ``--repeats`` rounds after one untimed
run each; medians are reported. The server's request counter is reset before
each timed run; the table shows the last round's counts. The server is a
Python process on the same machine, so its CPU time is reported next to this
process's: on a small machine the two share the cores.

    python -m benchmarks.object_store [--size 256MiB] [--repeats 3] [--latency 0.01] [--layouts v3,sharded,v2]
                                      [--threads N] [--out benchmarks/results/object_store]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import shlex
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numcodecs
import numpy as np
import psutil

import daskstream as ds
from benchmarks import samples
from benchmarks.open_sum import SUM_RTOL, SampleSums, SumMismatchError, machine_info, sample_sums, usable_cpus
from benchmarks.write import encode_rate
from daskstream import config
from daskstream.demo import sample_shape, sample_slabs
from daskstream.planning.budget import format_size, parse_budget

REPO = Path(__file__).resolve().parents[1]
S3_HELPERS = REPO / "tests" / "objects" / "s3_helpers.py"
LAYOUTS = ("v3", "sharded", "v2")
LAYOUT_LABELS = {
    "v3": "Zarr v3, 1 MiB chunks, zstd 3",
    "sharded": "Zarr v3 sharded, 16 MiB shards of 1 MiB chunks, zstd 3",
    "v2": "Zarr v2, 1 MiB chunks, zstd 3",
}
ARRAY = "field"
METADATA_OBJECTS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")
# The zarr writes that build the layouts are setup, not timed: many in flight hide the latency.
SETUP_CONCURRENCY = 64

# Targets the table states.
REQUIRED_SHARE_OF_RAW = 0.7
REQUIRED_WRITE_SPEEDUP = 2.0
# A sum, the array opened before, against the raw GETs' time: at most this many times it.
MOST_SUM_OVER_RAW = 1.15

DASKSTREAM, DASK, XARRAY, RAW = "daskstream", "dask", "xarray", "raw GETs"
OPEN_AND_SUM, SUM_ONLY, GETS, GETS_DECODE, STORE = (
    "open + sum",
    "sum only",
    "GETs only",
    "GETs, then decode + sum",
    "store",
)


@dataclass
class Contender:
    """One timed way of reading or writing, and what its runs measured.

    Attributes
    ----------
    layout
        The layout (or write target) it runs on.
    name
        The code the timer covers.
    library
        daskstream, dask, xarray or raw GETs.
    scope
        What the timer covers.
    prepare
        Untimed setup before each run (opening, emptying the target); returns the run, which returns the sum
        it computed (``None`` for GETs alone and for writes).
    check
        After the untimed run: raises :class:`SumMismatchError` unless the result is right.
    """

    layout: str
    name: str
    library: str
    scope: str
    prepare: Callable[[], Callable[[], float | None]]
    check: Callable[[float | None], None]
    seconds: list[float] = field(default_factory=list)
    requests: list[dict[str, int]] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "name": self.name,
            "library": self.library,
            "scope": self.scope,
            "seconds": self.seconds,
            "median_s": self.median if self.seconds else None,
            "requests": self.requests,
            "client_cpu_s": self.client_cpu,
            "server_cpu_s": self.server_cpu,
            "error": self.error,
        }


# -- the server ----------------------------------------------------------------------------------------------------


@dataclass
class Server:
    """The S3 server process, its request counter (``tests/objects/s3_helpers.py``'s ``S3``) and the options."""

    process: Any
    s3: Any

    @property
    def options(self) -> dict[str, Any]:
        return self.s3.options

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system


@contextlib.contextmanager
def running_server(latency: float) -> Iterator[Server]:
    """moto's S3 server on 127.0.0.1 with ``latency`` per request; killed with its process group on the way out."""
    missing = [name for name in ("s3fs", "moto") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"this benchmark needs {' and '.join(missing)}: pip install '.[test]'")
    # Loaded by path: tests/ is not a package, and another installed "tests" must not stand in for it.
    spec = importlib.util.spec_from_file_location("s3_helpers", S3_HELPERS)
    if spec is None or spec.loader is None or not S3_HELPERS.is_file():
        raise SystemExit(f"{S3_HELPERS} is missing: run from a checkout of the repository")
    helpers = importlib.util.module_from_spec(spec)
    # The helpers start the server through the tests' reaper (tests/reaper.py), which they import by name.
    if str(S3_HELPERS.parents[1]) not in sys.path:
        sys.path.append(str(S3_HELPERS.parents[1]))
    spec.loader.exec_module(helpers)
    # The server checks no credentials; s3fs wants some. These reach nothing but 127.0.0.1.
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    process, endpoint = helpers.start_s3_server(latency)
    try:
        yield Server(process, helpers.S3(endpoint))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # started in a session of its own: its group is its pid
        process.wait()
        process.stdout.close()


# -- the layouts ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One layout written to the server: where, and the objects that hold its chunks."""

    key: str
    group_url: str
    array_url: str
    objects: tuple[str, ...]  # filesystem paths of the chunk or shard objects
    stored_bytes: int


def write_layout(server: Server, bucket: str, key: str, shape: tuple[int, int]) -> Stored:
    """Write the benchmark field in ``key``'s layout with zarr (a group holding ``field`` with named dimensions)."""
    import zarr
    from zarr.codecs import ZstdCodec

    chunks = (samples.ROWS_PER_CHUNK, shape[1])
    options: dict[str, Any] = {
        "v3": {"chunks": chunks, "compressors": ZstdCodec(level=3), "dimension_names": ("y", "x")},
        "sharded": {
            "shards": (samples.ROWS_PER_SHARD, shape[1]),
            "chunks": chunks,
            "compressors": ZstdCodec(level=3),
            "dimension_names": ("y", "x"),
        },
        # Format 2 has no dimension names; xarray reads them from this attribute.
        "v2": {
            "chunks": chunks,
            "compressors": numcodecs.Zstd(level=3),
            "attributes": {"_ARRAY_DIMENSIONS": ["y", "x"]},
        },
    }[key]
    group_url = f"s3://{bucket}/{key}.zarr"
    with zarr.config.set({"async.concurrency": SETUP_CONCURRENCY}):
        store = zarr.storage.FsspecStore.from_url(group_url, storage_options=server.options)
        group = zarr.open_group(store, mode="w", zarr_format=2 if key == "v2" else 3)
        array = group.create_array(ARRAY, shape=shape, dtype="f4", **options)
        for start, slab in sample_slabs(shape):
            array[start : start + len(slab)] = slab
    array_url = f"{group_url}/{ARRAY}"
    fs = server.s3.fs
    found = fs.find(array_url.removeprefix("s3://"), detail=True)
    objects = {path: info for path, info in found.items() if path.rsplit("/", 1)[-1] not in METADATA_OBJECTS}
    return Stored(key, group_url, array_url, tuple(sorted(objects)), sum(int(i["size"]) for i in objects.values()))


def chunk_sum(data: bytes) -> float:
    """The float64 sum of one zstd chunk of little-endian float32."""
    return float(np.frombuffer(numcodecs.Zstd().decode(data), dtype="<f4").sum(dtype=np.float64))


def shard_sum(data: bytes) -> float:
    """The float64 sum of the chunks of one shard (zarr's default index at its end: offset and size per chunk, crc32c)."""
    inner = samples.ROWS_PER_SHARD // samples.ROWS_PER_CHUNK
    index = np.frombuffer(data[-(16 * inner + 4) : -4], dtype="<u8").reshape(inner, 2)
    empty = np.iinfo(np.uint64).max
    return sum(chunk_sum(data[int(o) : int(o) + int(n)]) for o, n in index if o != empty)


# -- the contenders ------------------------------------------------------------------------------------------------


def sum_checker(layout: str, name: str, sums: SampleSums) -> Callable[[float | None], None]:
    """Raises unless a sum is the field's float64 sum, within float32 rounding (dask and xarray sum in float32)."""
    atol = sums.float32_tolerance

    def check(value: float | None) -> None:
        if value is None:
            raise SumMismatchError(f"{layout}: {name} gave no sum")
        if not np.isclose(value, sums.total, rtol=SUM_RTOL, atol=atol):
            raise SumMismatchError(
                f"{layout}: {name} summed to {value!r}, but the float64 sum of the field is {sums.total!r} "
                f"(allowed difference {atol + SUM_RTOL * abs(sums.total):.3g}); no timings are reported"
            )

    return check


def read_contenders(stored: Stored, server: Server, sums: SampleSums, threads: int) -> list[Contender]:
    """Every reader of one layout, as its documentation shows it; then the raw GETs."""
    options = server.options
    url, key = stored.array_url, stored.key
    fs = server.s3.fs
    paths = list(stored.objects)
    in_flight = threads * int(config.setting("objects.requests-per-task"))
    decode = shard_sum if key == "sharded" else chunk_sum

    def ready(run: Callable[[], float | None]) -> Callable[[], Callable[[], float | None]]:
        return lambda: run

    def opened_then_reduced() -> Callable[[], float]:
        x = ds.open(url, storage_options=options)
        return lambda: float(ds.reduce(x, "sum"))

    def all_objects_came(result: dict[str, bytes]) -> None:
        if len(result) != len(paths):
            raise SumMismatchError(f"{key}: fs.cat returned {len(result)} of {len(paths)} objects")

    # s3fs asks for an object's size (a HEAD) before each whole-object GET unless max_concurrency is 1,
    # to split large ones into ranges; the floor is one GET per object.
    def gets(**keywords: Any) -> Callable[[], None]:
        def run() -> None:
            all_objects_came(fs.cat(paths, **keywords))

        return run

    def gets_then_decode() -> float:
        result = fs.cat(paths, max_concurrency=1)
        all_objects_came(result)
        with ThreadPoolExecutor(threads) as pool:
            return float(sum(pool.map(decode, result.values())))

    def no_check(value: float | None) -> None:
        pass

    runs: list[tuple[str, str, str, Callable[[], Callable[[], float | None]]]] = [
        (
            'float(ds.reduce(ds.open(url, storage_options=o), "sum"))',
            DASKSTREAM,
            OPEN_AND_SUM,
            ready(lambda: float(ds.reduce(ds.open(url, storage_options=options), "sum"))),
        ),
        (
            "ds.open(url, storage_options=o).sum().compute()",
            DASKSTREAM,
            OPEN_AND_SUM,
            ready(lambda: float(ds.open(url, storage_options=options).sum().compute())),
        ),
        ('float(ds.reduce(x, "sum")), x opened before', DASKSTREAM, SUM_ONLY, opened_then_reduced),
        (
            "da.from_zarr(url, storage_options=o).sum().compute()",
            DASK,
            OPEN_AND_SUM,
            ready(lambda: float(da.from_zarr(url, storage_options=options).sum().compute())),
        ),
        (
            f'xr.open_zarr(group, storage_options=o, chunks="auto")["{ARRAY}"].sum().compute()',
            XARRAY,
            OPEN_AND_SUM,
            xarray_reader(stored.group_url, options),
        ),
        ("fs.cat(paths, max_concurrency=1)", RAW, GETS, ready(gets(max_concurrency=1))),
        (
            f"fs.cat(paths, max_concurrency=1, batch_size={in_flight})",
            RAW,
            GETS,
            ready(gets(max_concurrency=1, batch_size=in_flight)),
        ),
        ("fs.cat(paths) (s3fs's default: a HEAD before each GET)", RAW, GETS, ready(gets())),
        (
            f"fs.cat(paths, max_concurrency=1), then zstd decode + sum in {threads} threads",
            RAW,
            GETS_DECODE,
            ready(gets_then_decode),
        ),
    ]
    return [
        Contender(
            LAYOUT_LABELS[key],
            name,
            library,
            scope,
            prepare,
            no_check if scope == GETS else sum_checker(key, name, sums),
        )
        for name, library, scope, prepare in runs
    ]


def xarray_reader(group_url: str, options: dict[str, Any]) -> Callable[[], Callable[[], float | None]]:
    """xarray's ``open_zarr`` and sum; raises ImportError (reported as not available) where xarray is missing."""

    def prepare() -> Callable[[], float]:
        try:
            import xarray as xr
        except ImportError:
            raise ImportError("xarray is not installed (pip install '.[bench]')") from None

        def run() -> float:
            opened = xr.open_zarr(group_url, storage_options=options, chunks="auto", consolidated=False)
            return float(opened[ARRAY].sum().compute())

        return run

    return prepare


def write_contenders(server: Server, bucket: str, npy: str, sums: SampleSums) -> list[Contender]:
    """ds.store against dask's to_zarr of the same array, into a 1 MiB-chunk target and a sharded one."""
    import zarr
    from zarr.codecs import ZstdCodec

    options = server.options
    fs = server.s3.fs
    cols = int(np.load(npy, mmap_mode="r").shape[1])
    chunks, shards = (samples.ROWS_PER_CHUNK, cols), (samples.ROWS_PER_SHARD, cols)
    blocks = {"1 MiB chunks": ds.open(npy, chunks=chunks), "sharded": ds.open(npy, chunks=shards)}

    def emptied(url: str, run: Callable[[], None]) -> Callable[[], Callable[[], None]]:
        def prepare() -> Callable[[], None]:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(url.removeprefix("s3://"), recursive=True)
            fs.invalidate_cache()
            return run

        return prepare

    def read_back(target: str, url: str, name: str) -> Callable[[float | None], None]:
        check = sum_checker(target, name, sums)

        def run(_: float | None) -> None:
            store = zarr.storage.FsspecStore.from_url(url, storage_options=options, read_only=True)
            check(float(np.sum(zarr.open_array(store, mode="r")[...], dtype=np.float64)))

        return run

    def store_with_daskstream(x: da.Array, url: str, ours: dict[str, Any]) -> Callable[[], None]:
        return lambda: ds.store(x, url, storage_options=options, overwrite=True, **ours)

    def store_with_dask(x: da.Array, url: str, theirs: dict[str, Any]) -> Callable[[], None]:
        return lambda: x.to_zarr(url, storage_options=options, mode="w", compressors=ZstdCodec(level=3), **theirs)

    contenders = []
    for target, x in blocks.items():
        ours: dict[str, Any] = {"inner_chunks": chunks} if target == "sharded" else {}
        theirs: dict[str, Any] = {"shards": shards, "chunks": chunks} if target == "sharded" else {}
        label = f"Zarr v3, {target}, zstd 3 (blocks of {x.chunksize})"
        for library, make, extra in ((DASKSTREAM, store_with_daskstream, ours), (DASK, store_with_dask, theirs)):
            keywords = "".join(f", {k}={v}" for k, v in extra.items())
            if library == DASKSTREAM:
                name = f"ds.store(x, url, storage_options=o, overwrite=True{keywords})"
            else:
                name = f'x.to_zarr(url, storage_options=o, mode="w", compressors=ZstdCodec(level=3){keywords})'
            url = f"s3://{bucket}/out-{uuid.uuid4().hex[:8]}.zarr"
            run = make(x, url, extra)
            contenders.append(Contender(label, name, library, STORE, emptied(url, run), read_back(label, url, name)))
    return contenders


# -- timing --------------------------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def timed_run(contender: Contender, server: Server, record: bool) -> float | None:
    """Prepare, reset the request counter, run; record seconds, requests and both processes' CPU when asked."""
    run = contender.prepare()
    gc.collect()  # so no run pays for collecting another's garbage
    server.s3.reset()
    client0, server0 = cpu_seconds(), server.cpu_seconds()
    start = time.perf_counter()
    value = run()
    seconds = time.perf_counter() - start
    if record:
        contender.seconds.append(seconds)
        contender.client_cpu.append(cpu_seconds() - client0)
        contender.server_cpu.append(server.cpu_seconds() - server0)
        contender.requests.append(server.s3.requests())
    return value


def time_interleaved(
    what: str, contenders: Sequence[Contender], server: Server, repeats: int, echo: Callable[[str], None]
) -> None:
    """One untimed, checked run each (a contender that fails there is reported as not available), then
    ``repeats`` rounds running each in turn."""
    for c in contenders:
        try:
            value = timed_run(c, server, record=False)
        except SumMismatchError:
            raise
        except Exception as exc:  # one contender that cannot run is a row of the report, not the end of it
            lines = str(exc).strip().splitlines()
            c.error = f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
            echo(f"{what}: {c.name}: not available ({c.error})")
            continue
        c.check(value)
    running = [c for c in contenders if c.error is None]
    for round_ in range(repeats):
        for c in running:
            timed_run(c, server, record=True)
        echo(f"{what}: round {round_ + 1}/{repeats}: " + ", ".join(f"{c.seconds[-1]:.3f}" for c in running) + " s")


# -- report --------------------------------------------------------------------------------------------------------


def requests_text(requests: dict[str, int], kinds: Sequence[str]) -> list[str]:
    return [str(requests.get(kind, 0)) for kind in kinds]


def reads_table(contenders: Sequence[Contender], nbytes: int) -> str:
    kinds = ("GET", "HEAD", "LIST")
    lines = [
        "| layout | contender | timer covers | median s | min s | max s | MB/s | GET | HEAD | LIST | "
        "client CPU s | server CPU s | % of raw GET speed |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for layout in dict.fromkeys(c.layout for c in contenders):
        rows = [c for c in contenders if c.layout == layout]
        raw = floor(rows)
        for c in rows:
            name = c.name if c.library == RAW else f"{c.library}: `{c.name}`"
            if c.error is not None:
                lines.append(f"| {layout} | {name} | {c.scope} | not available: {c.error} |" + " |" * 9)
                continue
            share = f"{raw.median / c.median:.0%}" if raw is not None else "-"
            if c is raw:
                share = "100% (floor)"
            lines.append(
                f"| {layout} | {name} | {c.scope} | {c.median:.3f} | {min(c.seconds):.3f} | {max(c.seconds):.3f} | "
                f"{nbytes / c.median / 1e6:.0f} | " + " | ".join(requests_text(c.requests[-1], kinds)) + " | "
                f"{statistics.median(c.client_cpu):.2f} | {statistics.median(c.server_cpu):.2f} | {share} |"
            )
    return "\n".join(lines)


def writes_table(contenders: Sequence[Contender], nbytes: int) -> str:
    kinds = ("PUT", "GET", "HEAD", "LIST", "DELETE")
    lines = [
        "| target | writer | median s | min s | max s | MB/s | PUT | GET | HEAD | LIST | DELETE | "
        "client CPU s | server CPU s | vs to_zarr |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in contenders:
        name = f"{c.library}: `{c.name}`"
        if c.error is not None:
            lines.append(f"| {c.layout} | {name} | not available: {c.error} |" + " |" * 11)
            continue
        baseline = next((b for b in contenders if b.layout == c.layout and b.library == DASK), None)
        speedup = "-" if baseline is None or baseline.error else f"{baseline.median / c.median:.2f}x"
        lines.append(
            f"| {c.layout} | {name} | {c.median:.3f} | {min(c.seconds):.3f} | {max(c.seconds):.3f} | "
            f"{nbytes / c.median / 1e6:.0f} | " + " | ".join(requests_text(c.requests[-1], kinds)) + " | "
            f"{statistics.median(c.client_cpu):.2f} | {statistics.median(c.server_cpu):.2f} | {speedup} |"
        )
    return "\n".join(lines)


def floor(rows: Sequence[Contender]) -> Contender | None:
    """The raw ``fs.cat(paths, max_concurrency=1)`` of a layout (one GET per object): the floor of every reader."""
    return next((c for c in rows if c.library == RAW and c.scope == GETS and c.error is None), None)


def read_verdicts(contenders: Sequence[Contender]) -> list[dict[str, Any]]:
    """Per layout: daskstream's open + sum against the raw GETs (the target) and against dask and xarray."""
    verdicts = []
    for layout in dict.fromkeys(c.layout for c in contenders):
        rows = [c for c in contenders if c.layout == layout]
        ours = next(c for c in rows if c.library == DASKSTREAM and c.scope == OPEN_AND_SUM)
        raw = floor(rows)
        if ours.error is not None or raw is None:
            verdicts.append({"layout": layout, "available": False})
            continue
        share = raw.median / ours.median
        others = {c.library: c.median / ours.median for c in rows if c.library in (DASK, XARRAY) and c.error is None}
        # Where the time goes: what opening costs, and the reduction alone against the GETs and the decoding.
        alone = next((c for c in rows if c.library == DASKSTREAM and c.scope == SUM_ONLY and c.error is None), None)
        decoded = next((c for c in rows if c.scope == GETS_DECODE and c.error is None), None)
        # The CPU any reader spends here -- its GETs, the decoding and the server answering, all on this machine's
        # cores -- bounds a sum from below as the GETs' time does.
        cpu_floor = (
            None
            if decoded is None
            else (statistics.median(decoded.client_cpu) + statistics.median(decoded.server_cpu)) / usable_cores()
        )
        over_raw = None if alone is None else alone.median / raw.median
        verdicts.append({"sum_over_raw": over_raw, "most_sum_over_raw": MOST_SUM_OVER_RAW,
                         "sum_met": over_raw is not None and over_raw <= MOST_SUM_OVER_RAW, "cpu_floor_s": cpu_floor,
                         "sum_over_floor": None if alone is None or cpu_floor is None
                         else alone.median / max(raw.median, cpu_floor),"layout": layout, "available": True, "share_of_raw": share,
                         "required_share": REQUIRED_SHARE_OF_RAW, "met": share >= REQUIRED_SHARE_OF_RAW,
                         "speedup_over": others,
                         "open_s": None if alone is None else ours.median - alone.median,
                         "sum_only_share_of_raw": None if alone is None else raw.median / alone.median,
                         "share_of_raw_and_decode": None if decoded is None else decoded.median / ours.median})  # fmt: skip
    return verdicts


def write_verdicts(contenders: Sequence[Contender]) -> list[dict[str, Any]]:
    verdicts = []
    for target in dict.fromkeys(c.layout for c in contenders):
        ours, theirs = (
            next(c for c in contenders if c.layout == target and c.library == lib) for lib in (DASKSTREAM, DASK)
        )
        if ours.error is not None or theirs.error is not None:
            verdicts.append({"target": target, "available": False, "error": ours.error or theirs.error})
            continue
        speedup = theirs.median / ours.median
        verdicts.append({"target": target, "available": True, "speedup": speedup,
                         "required_speedup": REQUIRED_WRITE_SPEEDUP, "met": speedup >= REQUIRED_WRITE_SPEEDUP})  # fmt: skip
    return verdicts


def verdict_lines(reads: list[dict[str, Any]], writes: list[dict[str, Any]]) -> list[str]:
    lines = []
    for v in reads:
        if not v["available"]:
            lines.append(f"- {v['layout']}: daskstream or the raw GETs did not run; no verdict.")
            continue
        others = ", ".join(f"{s:.2f}x faster than {lib}" for lib, s in v["speedup_over"].items())
        state = "met" if v["met"] else "NOT met"
        lines.append(
            f"- {v['layout']}: daskstream (`ds.reduce`, open + sum) runs at {v['share_of_raw']:.0%} of the raw "
            f"parallel-GET speed (target >= {REQUIRED_SHARE_OF_RAW:.0%}: {state}); {others}."
        )
        if v["open_s"] is not None:
            lines.append(
                f"  Opening takes {v['open_s']:.2f} s of it (open + sum less sum only); the sum alone runs at "
                f"{v['sum_only_share_of_raw']:.0%} of the raw GETs, and open + sum at "
                f"{v['share_of_raw_and_decode'] or 0:.0%} of the raw GETs followed by decoding."
            )
        if v["sum_over_raw"] is not None:
            state = "met" if v["sum_met"] else "NOT met"
            floor_text = (
                ""
                if v["cpu_floor_s"] is None
                else f" The CPU every reader spends here (GETs, decoding, and the server on the same {usable_cores()} "
                f"cores) needs at least {v['cpu_floor_s']:.3f} s: the sum takes {v['sum_over_floor']:.2f}x the larger "
                "of the two floors."
            )
            lines.append(
                f"  The sum alone takes {v['sum_over_raw']:.2f}x the raw GETs' time (target <= "
                f"{MOST_SUM_OVER_RAW:g}x: {state}).{floor_text}"
            )
    for v in writes:
        if not v["available"]:
            lines.append(f"- write, {v['target']}: not available ({v['error']}); no verdict.")
            continue
        state = "met" if v["met"] else "NOT met"
        lines.append(
            f"- write, {v['target']}: `ds.store` is {v['speedup']:.2f}x as fast as `to_zarr` "
            f"(target >= {REQUIRED_WRITE_SPEEDUP:g}x: {state})."
        )
    return lines


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def versions() -> dict[str, str]:
    out = {}
    for name in ("s3fs", "fsspec", "moto", "xarray", "numcodecs"):
        with contextlib.suppress(ImportError):
            out[name] = __import__(name).__version__
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.object_store", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB", help="bytes of the float32 field (default: 256MiB)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default: 3)")
    parser.add_argument("--latency", type=float, default=0.01, help="seconds the server waits per request (0.01)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {','.join(LAYOUTS)}")
    parser.add_argument("--no-writes", action="store_true", help="time the reads only")
    parser.add_argument("--threads", type=int, default=usable_cpus(), help="threads of dask's scheduler")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/object_store"))
    args = parser.parse_args(argv)
    args.layouts = tuple(k.strip() for k in args.layouts.split(",") if k.strip())
    if not args.layouts or any(k not in LAYOUTS for k in args.layouts):
        parser.error(f"--layouts {','.join(args.layouts)!r}: choose from {', '.join(LAYOUTS)}")
    if args.repeats < 1 or args.threads < 1 or args.latency < 0:
        parser.error("--repeats and --threads take at least 1, --latency at least 0")
    args.nbytes = parse_budget(args.size, name="--size")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.object_store", *argv])

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    shape = sample_shape(args.nbytes)
    nbytes = int(np.prod(shape)) * 4
    start = time.perf_counter()
    sums = sample_sums(args.nbytes)
    npy = None if args.no_writes else samples.ensure("npy", args.nbytes, echo=echo)
    reads: list[Contender] = []
    writes: list[Contender] = []
    stored: dict[str, Stored] = {}
    encode_limit_s: float | None = None
    zstd = numcodecs.Zstd(level=3)
    plans: dict[str, dict[str, Any]] = {}
    with dask.config.set(scheduler="threads", num_workers=args.threads), running_server(args.latency) as server:
        bucket = server.s3.bucket()
        echo(f"S3 server at {server.s3.endpoint}, {args.latency * 1e3:g} ms per request")
        for key in args.layouts:
            t0 = time.perf_counter()
            stored[key] = write_layout(server, bucket, key, shape)
            x = ds.open(stored[key].array_url, storage_options=server.options)
            plans[key] = {"tasks": x.npartitions, "block": list(x.chunksize), "objects": len(stored[key].objects)}
            echo(f"{key}: wrote {len(stored[key].objects)} objects, {format_size(stored[key].stored_bytes)}, "
                 f"in {time.perf_counter() - t0:.1f} s; daskstream reads it in {x.npartitions} tasks of {x.chunksize}")  # fmt: skip
            layout_rows = read_contenders(stored[key], server, sums, args.threads)
            time_interleaved(key, layout_rows, server, args.repeats, echo)
            reads += layout_rows
        if npy is not None:
            _ = np.asarray(np.load(npy, mmap_mode="r")).sum()  # warm the page cache
            # The codec's limit: one thread's rate encoding the same 1 MiB chunks, times the threads.
            encode_limit_s = nbytes / (
                encode_rate(np.load(npy, mmap_mode="r"), samples.ROWS_PER_CHUNK, zstd) * args.threads
            )
            writes = write_contenders(server, bucket, npy, sums)
            time_interleaved("write", writes, server, args.repeats, echo)

    machine = machine_info(args.threads)
    machine["versions"].update(versions())
    read_v, write_v = read_verdicts(reads), write_verdicts(writes)
    per_task = int(config.setting("objects.requests-per-task"))
    plan_text = "; ".join(
        f"{k}: {p['tasks']} tasks of {tuple(p['block'])} over {p['objects']} objects" for k, p in plans.items()
    )
    lines = [
        f"## Arrays on S3 with {args.latency * 1e3:g} ms per request: daskstream vs plain dask, xarray and raw "
        f"GETs ({format_size(nbytes)} float32, shape {shape})",
        "",
        f"Command: `{command}` ({time.perf_counter() - start:.0f} s)",
        "",
        f"Machine: {machine['cpu']}; {machine['cores']} cores ({machine['usable_cores']} usable); "
        f"{format_size(machine['ram_bytes'])} RAM; {machine['platform']}",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()),
        "",
        f"Server: moto's S3 server (`tests/objects/s3_server.py`) on 127.0.0.1, a Python process on the same "
        f"machine, waiting {args.latency * 1e3:g} ms before each answer. Scheduler: {machine['scheduler']} for "
        f"every contender; daskstream's `objects.requests-per-task` {per_task}. Each run in this process, "
        f"opening the array afresh; {args.repeats} interleaved rounds after an untimed one, medians. MB/s: the "
        f"array's {nbytes / 1e6:.0f} MB over the median. Requests: the server's count for the last round's run.",
        "",
        f"daskstream's plan: {plan_text}.",
        "",
        "### Reads",
        "",
        reads_table(reads, nbytes),
        "",
    ]
    if writes:
        lines += ["### Writes", "", writes_table(writes, nbytes), ""]
        lines += [f"Encode limit: zstd 3 over the same 1 MiB chunks, one thread's rate times {args.threads}, takes "
                  f"{encode_limit_s:.2f} s for the array; no writer that encodes can be faster.", ""]  # fmt: skip
    lines += ["### Targets", "", *verdict_lines(read_v, write_v)]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(table + "\n")
    report = {
        "command": command,
        "machine": machine,
        "settings": {
            "size": args.size,
            "nbytes": nbytes,
            "shape": list(shape),
            "dtype": "float32",
            "latency_s": args.latency,
            "repeats": args.repeats,
            "threads": args.threads,
            "layouts": list(args.layouts),
            "requests_per_task": per_task,
        },
        "sample_sums": {"float64_sum": sums.total, "float64_sum_abs": sums.total_abs, "count": sums.count},
        "layouts": {
            k: {
                "label": LAYOUT_LABELS[k],
                "objects": len(s.objects),
                "stored_bytes": s.stored_bytes,
                "daskstream_plan": plans[k],
            }
            for k, s in stored.items()
        },
        "reads": [c.as_dict() for c in reads],
        "writes": [c.as_dict() for c in writes],
        "encode_limit_s": encode_limit_s,
        "targets": {"reads": read_v, "writes": write_v},
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    echo(f"wrote {args.out / 'results.md'} and {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
