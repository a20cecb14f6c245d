"""Codec choice by measurement: encode and decode blocks of the data itself with each candidate, here.

How fast a codec encodes and how small it makes the data depend on the data
(a smooth field, noise, integers with runs of zeros), on this machine's CPU
and on the disk behind the target: on one noisy float32 field zstd level 3
encoded at a tenth of blosc-lz4's speed for a ratio 1.6 times higher. So
``store(..., codec="auto")`` computes a few blocks spread over the array
(``sample_bytes`` in all, at most a sixteenth of it), encodes and decodes them with every candidate in
one thread, times a write to the target's folder, and picks the candidate
that best serves what the user says the output is for:

* ``"write"``: the fastest store (encoding by every thread, the encoded bytes
  reaching the disk at its measured rate; whichever is slower sets the pace);
* ``"read"``: the fastest reads afterwards (decoding, and the bytes read);
* ``"size"``: the smallest output (the faster writer among equals);
* ``"balanced"``: the fastest write and one read together.

The choice, and the table of what was measured, is remembered in the tuning
cache per kind of data (format and codec of the source, dtype, chunk size,
target format, objective, threads and machine), so a second array of the
same kind is stored without measuring again. Only measurements that deserve it
are remembered: timings that agree, taken while the measuring thread had the
CPU, and consistent with one another (see :mod:`.codec_timing`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any

import dask
import dask.array as da
import deflate
import numpy as np

from daskstream import config
from daskstream.advice import keyword, said
from daskstream.compute.store.codec_candidates import Candidate, _candidates
from daskstream.compute.store.codec_timing import distrust, timed
from daskstream.compute.store.hdf5_encoder import Hdf5ChunkEncoder
from daskstream.compute.store.record import chunk_counts, reads_spans, span_chunk_shape
from daskstream.display import columns_table
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import read_layers, rechunk_records
from daskstream.planning.budget import format_size
from daskstream.runtime.remembered import TuneCache, machine_fingerprint
from daskstream.runtime.resources import resolve_resources

#: What a choice can optimize for; see the module's description.
OBJECTIVES = ("write", "read", "size", "balanced")

#: Bytes of the array computed and encoded to choose, by default.
SAMPLE_BYTES = 16 * 2**20

# Bytes written (and synced) to the target's folder to time its disk.
_DISK_PROBE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Measured:
    """What one candidate did with the sample.

    Attributes
    ----------
    candidate
        The codec.
    ratio
        Bytes in over bytes encoded.
    encode_rate, decode_rate
        Bytes of data per second one thread encodes and decodes.
    encoding_threads
        Threads that encode it in a store: all of them, or one where h5py
        encodes in the writing process.
    write_rate, read_rate
        Bytes of data per second a store and a read would take, estimated:
        the slower of the threads' codec rate and the disk's rate for the
        encoded bytes.
    spread
        The larger of the encoding's and the decoding's spread: how far apart
        their two closest timing rounds were (see :mod:`.codec_timing`).
    cpu_share
        The smaller share of a CPU the timing thread got while encoding or
        decoding (well under 1: other work was running).
    """

    candidate: Candidate
    ratio: float
    encode_rate: float
    decode_rate: float
    encoding_threads: int
    write_rate: float
    read_rate: float
    spread: float
    cpu_share: float

    @property
    def label(self) -> str:
        return self.candidate.label

    @property
    def family(self) -> str:
        return self.candidate.family

    @property
    def level(self) -> int:
        return self.candidate.level

    @property
    def variant(self) -> str:
        return self.candidate.variant

    def cost(self, optimize: str) -> tuple[float, float]:
        """Seconds per byte of data for ``optimize`` (lower is better), then a tie-break."""
        write, read = 1 / self.write_rate, 1 / self.read_rate
        if optimize == "write":
            return write, read
        if optimize == "read":
            return read, write
        if optimize == "size":
            return 1 / self.ratio, write
        return write + read, 1 / self.ratio


@dataclass(frozen=True)
class CodecChoice:
    """The codec chosen for a target, and the table of measurements it was chosen from.

    ``str()`` is the table as text, ``to_dict()`` as JSON-ready data, and
    Jupyter shows it as an HTML table.
    """

    chosen: Candidate
    optimize: str
    target_format: str
    measured: tuple[Measured, ...]
    threads: int
    disk_rate: float
    sample_bytes: int
    remembered: bool = False
    not_remembered: str = ""
    key: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def compressor(self, zarr_format: int = 3) -> Any:
        """The chosen codec as ``store``'s ``compressor`` for the target's format."""
        if self.target_format == "hdf5":
            return self.chosen.hdf5_compressor()
        return self.chosen.zarr_compressor(zarr_format)

    def why(self) -> str:
        source = "remembered from an earlier measurement" if self.remembered else "measured now"
        if self.not_remembered:
            source = f"measured now, not remembered ({self.not_remembered})"
        disk = f"disk {self.disk_rate / 1e9:.2f} GB/s" if math.isfinite(self.disk_rate) else "disk not measured"
        return (
            f"{self.chosen.label}: best for {self.optimize!r} ({_OBJECTIVE_WORDS[self.optimize]}), {source} on "
            f"{format_size(self.sample_bytes)} of the data, {self.threads} thread(s), {disk}"
        )

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "codec": m.candidate.label,
                "chosen": m.candidate == self.chosen,
                "ratio": m.ratio,
                "encode_GBps_per_thread": m.encode_rate / 1e9,
                "decode_GBps_per_thread": m.decode_rate / 1e9,
                "write_GBps": m.write_rate / 1e9,
                "read_GBps": m.read_rate / 1e9,
                "spread": m.spread,
                "cpu_share": m.cpu_share,
            }
            for m in self.measured
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.name,
            "label": self.chosen.label,
            "optimize": self.optimize,
            "target_format": self.target_format,
            "remembered": self.remembered,
            "not_remembered": self.not_remembered or None,
            "threads": self.threads,
            "disk_GBps": self.disk_rate / 1e9 if math.isfinite(self.disk_rate) else None,
            "sample_bytes": self.sample_bytes,
            "candidates": self.rows(),
        }

    def _cells(self) -> list[list[str]]:
        return [
            [
                ("> " if row["chosen"] else "  ") + row["codec"],
                f"{row['ratio']:.2f}",
                f"{row['encode_GBps_per_thread']:.2f}",
                f"{row['decode_GBps_per_thread']:.2f}",
                f"{row['write_GBps']:.2f}",
                f"{row['read_GBps']:.2f}",
            ]
            for row in self.rows()
        ]

    def __str__(self) -> str:
        header = ["codec", "ratio", "encode GB/s", "decode GB/s", "store GB/s", "read GB/s"]
        cells = self._cells()
        widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
        lines = [
            "  ".join(text.ljust(w) if i == 0 else text.rjust(w) for i, (text, w) in enumerate(zip(r, widths)))
            for r in [header, *cells]
        ]
        note = "(encode and decode: one thread; store and read: estimated for the threads and this disk)"
        return "\n".join([self.why(), *lines, note])

    def _repr_html_(self) -> str:
        header = ["codec", "ratio", "encode GB/s (1 thread)", "decode GB/s (1 thread)", "store GB/s", "read GB/s"]
        rows = [[cell.strip().removeprefix("> "), *rest] for cell, *rest in self._cells()]
        marked = [row["chosen"] for row in self.rows()]
        return f"<div><p>{escape(self.why())}</p>{columns_table(header, rows, marked=marked)}</div>"


_OBJECTIVE_WORDS = {
    "write": "the fastest store",
    "read": "the fastest reads",
    "size": "the smallest output",
    "balanced": "the fastest store and read together",
}


def choose_codec(
    x: da.Array,
    target_format: str = "zarr",
    *,
    optimize: str = "balanced",
    folder: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    sample_bytes: int = SAMPLE_BYTES,
    cache: TuneCache | None = None,
    remember: bool = True,
) -> CodecChoice:
    """Measure the candidate codecs on blocks of ``x`` and choose one for ``optimize``.

    Parameters
    ----------
    x
        The array to be stored, in the chunks it will be stored in.
    target_format
        ``"zarr"`` or ``"hdf5"``: which codecs are candidates.
    optimize
        ``"write"``, ``"read"``, ``"size"`` or ``"balanced"`` (see the module).
    folder
        Where the target will be, to time its disk (default: the temporary folder).
    threads
        Threads that will encode (default: those of the place work runs, as ``open`` plans for).
    sample_bytes
        Bytes of ``x`` computed and encoded (whole blocks spread over it, at
        least one).
    cache
        Where choices are remembered (default: the tuning cache).
    remember
        Reuse a choice remembered for data of this kind, and remember this one
        when its measurements deserve it (``daskstream.tune.codec``: timings
        that agree, taken while this thread had the CPU, and consistent with
        one another); ones that do not are measured again once, and a choice
        still made from them is used but not remembered, saying why.

    Returns
    -------
    CodecChoice

    Examples
    --------
    >>> import dask.array as da
    >>> choice = choose_codec(da.zeros((256, 256), chunks=64), optimize="size", remember=False)
    >>> choice.chosen.name != "none"
    True
    """
    if optimize not in OBJECTIVES:
        raise InvalidArgumentError(
            said(keyword("optimize", optimize), f": give one of {', '.join(map(repr, OBJECTIVES))}")
        )
    if target_format not in ("zarr", "hdf5"):
        raise InvalidArgumentError(f"target_format={target_format!r}: give 'zarr' or 'hdf5'")
    threads = threads or resolve_resources().threads
    # The chunk the target will be written in: a block, or the piece a span streams in.
    chunk = span_chunk_shape(x) or tuple(max(sizes, default=1) for sizes in x.chunks)
    block_bytes = int(x.dtype.itemsize * math.prod(chunk))
    key = {
        "kind": "codec",
        "target": target_format,
        "data": _data_kind(x),
        "dtype": x.dtype.str,
        "chunk_bytes": 2 ** round(math.log2(max(block_bytes, 1))),
        "optimize": optimize,
        "threads": threads,
        "machine": machine_fingerprint(),
    }
    cache = cache or TuneCache()
    if remember:
        found = _remembered(cache.get(key), key, target_format)
        if found is not None:
            return found
    candidates = _candidates(target_format)
    samples = _samples(_cheaply_sampled(x), sample_bytes, chunk)
    disk_rate = _disk_rate(folder)
    measured = tuple(_measure(c, samples, target_format, threads, disk_rate) for c in candidates)
    doubt = _doubt(measured)
    if doubt is not None:  # measured once more: a moment's other work should not decide
        measured = tuple(_measure(c, samples, target_format, threads, disk_rate) for c in candidates)
        doubt = _doubt(measured)
    chosen = min(measured, key=lambda m: m.cost(optimize)).candidate
    choice = CodecChoice(chosen, optimize, target_format, measured, threads, disk_rate,
                         sum(s.nbytes for s in samples), not_remembered=(doubt or "") if remember else "",
                         key=key)  # fmt: skip
    if remember and doubt is None:
        cache.put(key, {"codec_choice": choice.to_dict(), "measured": [_as_json(m) for m in measured]})
    return choice


def _doubt(measured: tuple[Measured, ...]) -> str | None:
    """Why ``measured`` should not be remembered (see :func:`.codec_timing.distrust`), or ``None``."""
    return distrust(
        measured,
        most_spread=config.setting("tune.codec.most-spread"),
        least_cpu_share=config.setting("tune.codec.least-cpu-share"),
    )


def _data_kind(x: da.Array) -> str:
    """What decides how well ``x`` compresses, as far as a key can say: the one file it reads, or "computed"."""
    x = _cheaply_sampled(x)
    reads = read_layers(x)
    if len(reads) != 1:
        return "computed"
    name, source, _ = reads[0]
    kind = f"{source.format}: {source.describe_storage()}"
    return kind if name == x.name else f"computed from {kind}"


def _cheaply_sampled(x: da.Array) -> da.Array:
    """``x``, or the array a rechunk of it reads: a block of a two-pass rechunk needs a whole first pass."""
    records = rechunk_records(x)
    if records and records[-1].read is not None and records[-1].read.shape == x.shape:
        return records[-1].read
    return x


def _samples(x: da.Array, sample_bytes: int, piece: tuple[int, ...]) -> list[np.ndarray]:
    """Blocks of ``x`` spread evenly over its grid, ``sample_bytes`` of them (at least one, at most a
    sixteenth of the array), cut into pieces of at most the ``piece`` shape: the chunks to be encoded."""
    # A span's block is more than a task holds: its chunks are sampled instead, one region each.
    spanned = reads_spans(x)
    grid = chunk_counts(x) if spanned else x.numblocks
    count = math.prod(grid)
    if count == 0 or x.size == 0:
        return [np.zeros(1, dtype=x.dtype)]
    block_bytes = max(1, x.nbytes // count)
    wanted = int(max(1, min(count // 16, sample_bytes // block_bytes)))
    picks = [np.unravel_index(i, grid) for i in sorted({int(i) for i in np.linspace(0, count - 1, wanted)})]
    if spanned:
        regions = [tuple(slice(i * p, (i + 1) * p) for i, p in zip(cell, piece)) for cell in picks]
        blocks = dask.compute(*(x[region] for region in regions))
    else:
        blocks = dask.compute(*(x.blocks[cell] for cell in picks))
    pieces = []
    for block in blocks:
        for corner in itertools.product(*(range(0, n, p) for n, p in zip(block.shape, piece))):
            pieces.append(np.ascontiguousarray(block[tuple(slice(c, c + p) for c, p in zip(corner, piece))]))
    return pieces


def _disk_rate(folder: str | os.PathLike[str] | None) -> float:
    """Bytes per second this folder's disk takes a synced write at (a probe file, removed); the temporary
    folder's where this one cannot be written, and no limit where neither can."""
    places = [os.fspath(folder)] if folder is not None and os.path.isdir(folder) else []
    data = memoryview(os.urandom(2**20) * (_DISK_PROBE_BYTES // 2**20))
    for where in [*places, tempfile.gettempdir()]:
        try:
            fd, path = tempfile.mkstemp(dir=where, prefix=".daskstream-disk-probe-")
        except OSError:
            continue
        try:
            start = time.perf_counter()
            written = 0
            while written < len(data):  # a write may take less than it is given
                written += os.write(fd, data[written:])
            os.fsync(fd)
            return len(data) / max(time.perf_counter() - start, 1e-9)
        except OSError:
            continue
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return math.inf


def _codec_pair(candidate: Candidate, target_format: str, sample: np.ndarray) -> tuple[Any, Any]:
    """Functions encoding a block to bytes and decoding them, as the target's writer and readers would."""
    if candidate.family == "none":
        return (lambda block: block.tobytes()), (lambda data: np.frombuffer(data, np.uint8).copy())
    if candidate.family == "gzip+shuffle":
        encoder = Hdf5ChunkEncoder(sample.shape, sample.dtype, 0, True, candidate.level)
        itemsize = sample.dtype.itemsize

        def decode(data: bytes) -> np.ndarray:
            raw = np.frombuffer(deflate.zlib_decompress(data, sample.nbytes), np.uint8)
            return raw.reshape(itemsize, -1).T.copy()  # HDF5's shuffle undone

        return encoder.encode, decode
    import numcodecs

    codec = candidate.zarr_compressor(2)  # numcodecs codecs: what daskstream encodes and decodes Zarr chunks with
    assert isinstance(codec, numcodecs.abc.Codec)
    return codec.encode, codec.decode


def _measure(
    candidate: Candidate, samples: list[np.ndarray], target_format: str, threads: int, disk_rate: float
) -> Measured:
    import numcodecs.blosc

    encode, decode = _codec_pair(candidate, target_format, samples[0])
    # One thread measured: blosc would otherwise use its own pool from this (the main) thread.
    previous = numcodecs.blosc.use_threads
    numcodecs.blosc.use_threads = False
    raw = sum(s.nbytes for s in samples)
    try:
        encoded = [encode(s) for s in samples]
        encoding = timed(lambda: [encode(s) for s in samples], raw)
        decoding = timed(lambda: [decode(data) for data in encoded], raw)
    finally:
        numcodecs.blosc.use_threads = previous
    ratio = raw / max(1, sum(len(memoryview(e).cast("B")) for e in encoded))
    encode_rate, decode_rate = encoding.rate, decoding.rate
    # h5py encodes plugin filters in the one writing process; daskstream encodes gzip and none in every task.
    encoding_threads = 1 if target_format == "hdf5" and candidate.family in ("zstd", "blosc") else threads
    write_rate = min(encode_rate * encoding_threads, disk_rate * ratio)
    read_rate = min(decode_rate * threads, disk_rate * ratio)
    return Measured(candidate, ratio, encode_rate, decode_rate, encoding_threads, write_rate, read_rate,
                    max(encoding.spread, decoding.spread), min(encoding.cpu_share, decoding.cpu_share))  # fmt: skip


def _as_json(m: Measured) -> dict[str, Any]:
    return {**asdict(m), "candidate": asdict(m.candidate)}


def _remembered(entry: dict[str, Any] | None, key: dict[str, Any], target_format: str) -> CodecChoice | None:
    """The choice a cache entry holds, or ``None`` when there is none, it cannot be read, or its
    measurements do not deserve trust (entries from before measurements carried their spread and
    CPU share included): those are measured again."""
    try:
        tuned = (entry or {})["tuned"]
        measured = tuple(Measured(**{**m, "candidate": Candidate(**m["candidate"])}) for m in tuned["measured"])
        if _doubt(measured) is not None:
            return None
        saved = tuned["codec_choice"]
        chosen = next(m.candidate for m in measured if m.candidate.name == saved["chosen"])
        return CodecChoice(chosen, saved["optimize"], target_format, measured, int(saved["threads"]),
                           math.inf if saved["disk_GBps"] is None else float(saved["disk_GBps"]) * 1e9,
                           int(saved["sample_bytes"]), remembered=True,
                           key=key)  # fmt: skip
    except (KeyError, TypeError, ValueError, StopIteration):
        return None


__all__ = ["OBJECTIVES", "SAMPLE_BYTES", "CodecChoice", "Measured", "choose_codec"]
