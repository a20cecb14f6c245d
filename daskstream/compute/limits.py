"""How fast this machine can decode (or encode) what a source stores: the ceiling a read (or a store) is
measured against.

No reader of a compressed array is faster than its codec decodes on the
threads it has, so "0.94 GB/s" says little until it is put beside that
limit: "0.94 GB/s, 55% of zstd 3's decode limit here". The limit is
measured on the data itself: a few storage chunks' worth of the source's
values, encoded with the source's own codec and settings and decoded again
in one thread, times the threads the computation runs on (the codecs
release the GIL; the rate of one thread times the threads is what parallel
decoding reaches at best). The limit leaves out reading the stored bytes and
reducing the values: a read can only come near it. Uncompressed data in one
file (``.npy``, HDF5) is limited by reading its bytes from the page cache
into memory, timed the same way.

The encode limit of a store is measured the same way on what it wrote, the
encoding timed instead of the decoding: a store encodes on all its threads,
but HDF5's plugin filters (zstd, blosc) are encoded by h5py in the one
process that writes, so their limit is one thread's rate.

A limit is measured once per codec, dtype, kind of data, threads and machine
and remembered in the tuning cache, as the tuner's results are; a
measurement taken while other work held the CPU, or noisy, is used once and
not remembered (see :mod:`daskstream.compute.store.codec_timing`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import dask.array as da

from daskstream.compute.store.codec_candidates import Candidate
from daskstream.compute.store.codec_timing import timed
from daskstream.compute.store.codecs import Measured, _doubt, _measure, _samples
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import read_layers
from daskstream.graph.reads import read_array
from daskstream.runtime.remembered import TuneCache, machine_fingerprint
from daskstream.runtime.resources import resources_for

#: Bytes of the source's values a limit is measured on.
SAMPLE_BYTES = 8 * 2**20

#: Bytes of a file read to time the page cache: more than a CPU's caches hold, or it times them.
COPY_SAMPLE_BYTES = 256 * 2**20

#: Bytes a computation reads at least before its rate is set beside the limit: less, and the rate says
#: more about starting the computation than about reading.
LIMIT_SHOWN_FROM_BYTES = 64 * 2**20

# HDF5 filter identifiers (the HDF Group's registry) of the codecs daskstream can time.
_DEFLATE, _SHUFFLE, _ZSTD, _BLOSC = 1, 2, 32015, 32001
_BLOSC_SHUFFLES = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}
_BLOSC_CODECS = {0: "blosclz", 1: "lz4", 2: "lz4hc", 4: "zlib", 5: "zstd"}


@dataclass(frozen=True)
class CodecLimit:
    """The rate this machine decodes (or encodes) a source's codec at, on the source's data.

    Attributes
    ----------
    codec
        The codec as a person names it ("zstd 3", "gzip 1 + shuffle", "no compression").
    per_thread
        Bytes of values one thread decodes a second.
    threads
        Threads the limit is for.
    remembered
        Whether it was found in the tuning cache rather than measured now.
    not_remembered
        Why a measurement taken now was not remembered ("" when it was, or was found).
    direction
        ``"decode"`` (a read's limit) or ``"encode"`` (a store's).
    """

    codec: str
    per_thread: float
    threads: int
    remembered: bool = False
    not_remembered: str = ""
    direction: str = "decode"

    @property
    def rate(self) -> float:
        """Bytes a second all the threads decode together, at best."""
        return self.per_thread * self.threads

    def share(self, throughput: float) -> float:
        """``throughput`` (bytes a second) as a share of the limit."""
        return throughput / self.rate if self.rate > 0 else math.nan

    def beside(self, throughput: float) -> str:
        """``throughput`` said beside the limit: "0.94 GB/s, 55% of zstd 3's decode limit here"."""
        what = self.codec if self.codec.startswith("a page-cache") else f"{self.codec}'s {self.direction}"
        return f"{rate_text(throughput)}, {self.share(throughput):.0%} of {what} limit here"

    def __str__(self) -> str:
        how = "remembered" if self.remembered else "measured now"
        if self.not_remembered:
            how = f"measured now, not remembered ({self.not_remembered})"
        does = "runs" if self.codec.startswith("a page-cache") else f"{self.direction}s"
        return (
            f"{self.codec} {does} at {self.rate / 1e9:.2f} GB/s here ({self.threads} thread(s) x "
            f"{self.per_thread / 1e9:.2f} GB/s; {how})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "codec": self.codec,
            "direction": self.direction,
            "GBps": self.rate / 1e9,
            "GBps_per_thread": self.per_thread / 1e9,
            "threads": self.threads,
            "remembered": self.remembered,
            "not_remembered": self.not_remembered or None,
        }


def rate_text(throughput: float) -> str:
    """Bytes a second as a person reads them: GB/s, or MB/s below a tenth of one.

    >>> rate_text(9.4e8), rate_text(4.5e7)
    ('0.94 GB/s', '45.0 MB/s')
    """
    return f"{throughput / 1e9:.2f} GB/s" if throughput >= 1e8 else f"{throughput / 1e6:.1f} MB/s"


def codec_limit(
    x: da.Array,
    *,
    threads: int | None = None,
    cache: TuneCache | None = None,
    measure: bool = True,
    direction: str = "decode",
) -> CodecLimit | None:
    """The decode (or encode) limit of the one source ``x`` reads, for ``threads`` threads; ``None`` where
    there is none to say (``x`` reads several sources or none, or its codec is one daskstream cannot time;
    for ``"encode"``, data stored as it is), or, with ``measure=False``, where none is remembered yet.

    Parameters
    ----------
    x
        An array reading one daskstream source (``ds.open(...)``, or work on it).
    threads
        Threads the limit is for (default: those ``x`` was planned for).
    cache
        Where limits are remembered (default: the tuning cache).
    measure
        Measure the limit when none is remembered (a fraction of a second, on
        a few MiB of the source); ``False``: only look it up.
    direction
        ``"decode"``: what reading the source can reach; ``"encode"``: what
        writing it could (for an array ``store`` wrote, opened again).

    Examples
    --------
    >>> import os, tempfile, numpy as np, daskstream as ds
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(2**20, dtype="f4"))
    >>> limit = codec_limit(ds.open(path), threads=2, cache=TuneCache(path + ".tune.json"))
    >>> limit.codec, limit.threads, limit.rate > 0
    ('a page-cache read', 2, True)
    """
    reads = read_layers(x)
    if len(reads) != 1:
        return None
    name, source, _ = reads[0]
    threads = threads or resources_for(x).threads
    if direction not in ("decode", "encode"):
        raise InvalidArgumentError(f'direction={direction!r}: give "decode" or "encode"')
    candidate = codec_of(source)
    if candidate is None or (direction == "encode" and candidate.family == "none"):
        return None
    cache = cache or TuneCache()
    key = {
        "kind": "codec-limit",
        "codec": candidate.name,
        "data": f"{source.format}: {source.describe_storage()}",
        "dtype": source.dtype.str,
        "threads": threads,
        "machine": machine_fingerprint(),
    }
    target = "hdf5" if source.format == "hdf5" else "zarr"
    # h5py encodes its plugin filters in the one writing process; the tasks encode everything else.
    encoding_threads = 1 if target == "hdf5" and candidate.family in ("zstd", "blosc") else threads
    used = threads if direction == "decode" else encoding_threads
    rate_key = f"{direction}_rate"
    found = _remembered(cache.get(key), candidate, rate_key)
    if found is not None:
        label = "a page-cache read" if candidate.family == "none" else candidate.label
        return CodecLimit(label, found, used, remembered=True, direction=direction)
    if not measure:
        return None
    if candidate.family == "none":
        return _copy_limit(source, key, cache, threads)
    storage = tuple(int(s) for s in (source.storage_chunks or tuple(max(c, default=1) for c in x.chunks)))
    # The source's values as stored, in storage chunks: what its codec decodes, whatever x computes from them.
    array = x if name == x.name else read_array(source, da.core.normalize_chunks(storage, source.shape),
                                                f"codec-limit-sample-{source.token}")  # fmt: skip
    samples = _samples(array, SAMPLE_BYTES, storage)
    # HDF5's shuffle is timed as h5py's filter pipeline runs it; every other codec the same in either format.
    measured = _measure(candidate, samples, "hdf5" if candidate.family == "gzip+shuffle" else "zarr", 1, math.inf)
    doubt = _doubt((measured,))
    if doubt is None:
        cache.put(key, {"decode_rate": measured.decode_rate, "encode_rate": measured.encode_rate,
                        "spread": measured.spread, "cpu_share": measured.cpu_share})  # fmt: skip
    rate = measured.decode_rate if direction == "decode" else measured.encode_rate
    return CodecLimit(candidate.label, rate, used, not_remembered=doubt or "", direction=direction)


def _copy_limit(source: Any, key: dict[str, Any], cache: TuneCache, threads: int) -> CodecLimit | None:
    """For data stored as it is: the rate one thread reads the file's bytes from the page cache into a buffer
    (read once untimed, so they are there), times the threads; ``None`` for data not in one local file."""
    path = getattr(source, "path", "")
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    size = min(os.path.getsize(path), COPY_SAMPLE_BYTES)
    if size == 0:
        return None
    buffer = bytearray(size)
    with open(path, "rb", buffering=0) as file:

        def read() -> None:
            file.seek(0)
            view = memoryview(buffer)
            while view:
                got = file.readinto(view)
                if not got:
                    break
                view = view[got:]

        read()  # untimed: the bytes into the page cache
        timing = timed(read, size)
    measured = Measured(Candidate("none", "none"), 1.0, timing.rate, timing.rate, 1, timing.rate, timing.rate,
                        timing.spread, timing.cpu_share)  # fmt: skip
    doubt = _doubt((measured,))
    if doubt is None:
        cache.put(key, {"decode_rate": timing.rate, "spread": timing.spread, "cpu_share": timing.cpu_share})
    return CodecLimit("a page-cache read", timing.rate, threads, not_remembered=doubt or "")


def _remembered(entry: dict[str, Any] | None, candidate: Candidate, rate_key: str) -> float | None:
    """A remembered rate (``rate_key``: ``"decode_rate"``, ``"encode_rate"``) that still deserves trust (the
    thresholds may have changed since), or ``None``."""
    try:
        tuned = (entry or {})["tuned"]
        rate, spread, share = (float(tuned[k]) for k in (rate_key, "spread", "cpu_share"))
    except (KeyError, TypeError, ValueError):
        return None
    stored = Measured(candidate, 1.0, rate, rate, 1, rate, rate, spread, share)
    return rate if rate > 0 and _doubt((stored,)) is None else None


def codec_of(source: Any) -> Candidate | None:
    """The codec ``source`` stores its chunks with, as a candidate daskstream can time; ``None`` when it is
    one it cannot (a filter or codec beyond zstd, gzip, blosc and HDF5's shuffle)."""
    configs = getattr(source, "codec_configs", None)
    if configs is not None:
        return _zarr_codec(configs)
    pipeline = getattr(source, "pipeline", None)
    if pipeline is not None:
        return _hdf5_codec(pipeline)
    return Candidate("none", "none") if source.format == "npy" else None


def _zarr_codec(configs: tuple[dict[str, Any], ...]) -> Candidate | None:
    compressing = [c for c in configs if (c.get("id") or c.get("name")) not in ("bytes", "sharding_indexed", "crc32c")]
    if not compressing:
        return Candidate("none", "none")
    if len(compressing) > 1:
        return None
    (config,) = compressing
    name = config.get("id") or config.get("name")
    settings = config.get("configuration", config)
    if name == "zstd":
        return Candidate(f"zstd-{settings.get('level', 0)}", "zstd", int(settings.get("level", 0)))
    if name == "gzip":
        return Candidate(f"gzip-{settings.get('level', 6)}", "gzip", int(settings.get("level", 6)))
    if name == "blosc":
        shuffle = settings.get("shuffle", "noshuffle")
        shuffle = _BLOSC_SHUFFLES.get(shuffle, "noshuffle") if isinstance(shuffle, int) else str(shuffle)
        level = int(settings.get("clevel", 5))
        cname = str(settings.get("cname", "lz4"))
        return Candidate(f"blosc-{cname}-{shuffle}", "blosc", level, cname, shuffle)
    return None


def _hdf5_codec(pipeline: tuple[tuple[int, tuple[int, ...]], ...]) -> Candidate | None:
    codes = [code for code, _ in pipeline]
    if not codes:
        return Candidate("none", "none")
    options = dict(pipeline)
    if codes == [_SHUFFLE, _DEFLATE]:
        level = int((options[_DEFLATE] or (4,))[0])
        return Candidate(f"gzip-{level}", "gzip+shuffle", level)
    if codes == [_DEFLATE]:
        level = int((options[_DEFLATE] or (4,))[0])
        return Candidate(f"gzip-{level}", "gzip", level)
    if codes == [_ZSTD]:  # hdf5plugin's Zstd: the level is its one setting
        level = int((options[_ZSTD] or (3,))[0])
        return Candidate(f"zstd-{level}", "zstd", level)
    if codes == [_BLOSC] and len(options[_BLOSC]) >= 7:  # (version, version, typesize, bytes, level, shuffle, codec)
        values = options[_BLOSC]
        cname = _BLOSC_CODECS.get(int(values[6]))
        shuffle = _BLOSC_SHUFFLES.get(int(values[5]))
        if cname is not None and shuffle is not None:
            return Candidate(f"blosc-{cname}-{shuffle}", "blosc", int(values[4]), cname, shuffle)
    return None


__all__ = ["LIMIT_SHOWN_FROM_BYTES", "SAMPLE_BYTES", "CodecLimit", "codec_limit", "codec_of"]
