"""Compressed chunks that claim or decode to more than their chunk: refused before the memory is taken.

Each hostile file is read in a fresh interpreter whose resident high-water mark
(VmHWM) is compared with the same interpreter reading the intact file.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import zlib

import h5py
import numcodecs
import numpy as np
import pytest
import zarr

from daskstream.sources.bounded import blosc_decode, gzip_decode, zlib_decode, zstd_content_size, zstd_decode

CLAIM = 2**31  # what the hostile chunks say they hold: 2 GiB
MiB = 2**20

_READ = """
import sys
import daskstream as ds
from daskstream.errors import CorruptSourceError
try:
    ds.open(sys.argv[1]).compute(scheduler="sync")
    outcome = "read"
except CorruptSourceError as exc:
    outcome = "refused: " + str(exc).replace(chr(10), " ")
print(int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024)
print(outcome)
"""


def read_in_fresh_interpreter(path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    peak, outcome = done.stdout.strip().splitlines()
    return int(peak), outcome


def claiming(frame: bytes, size: int) -> bytes:
    """A zstd frame whose header declares ``size`` decoded bytes (the data after it unchanged)."""
    descriptor = frame[4]
    assert (descriptor >> 5) & 1, "numcodecs writes single-segment frames"
    old = {0: 1, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
    start = 5 + (0, 1, 2, 4)[descriptor & 3]
    rewritten = bytes([(3 << 6) | (1 << 5) | (descriptor & 3)])
    return frame[:4] + rewritten + frame[5:start] + size.to_bytes(8, "little") + frame[start + old :]


def data():
    return np.random.default_rng(0).standard_normal((64, 64)).astype("f4")


def zarr_store(tmp_path, **kwargs):
    path = tmp_path / "a.zarr"
    zarr.create_array(path, shape=(64, 64), chunks=(32, 32), dtype="f4", **kwargs)[...] = data()
    return path


def rewrite_first_chunk(root, transform):
    """Replace the store's first chunk file (format 3: ``c/0/0``, format 2: ``0.0``) with ``transform(its bytes)``."""
    chunk = root / "c" / "0" / "0" if (root / "c").exists() else root / "0.0"
    chunk.write_bytes(transform(chunk.read_bytes()))


@pytest.fixture
def baseline(tmp_path):
    """What a fresh interpreter holds reading the intact store."""
    intact = tmp_path / "intact"
    intact.mkdir()
    peak, outcome = read_in_fresh_interpreter(zarr_store(intact))
    assert outcome == "read"
    return peak


def test_a_zstd_chunk_claiming_2_gib_is_refused_without_allocating_it(tmp_path, baseline):
    path = zarr_store(tmp_path)
    rewrite_first_chunk(path, lambda raw: claiming(raw, CLAIM))
    peak, outcome = read_in_fresh_interpreter(path)
    assert outcome.startswith("refused: ")
    assert "claims 2147483648 bytes where the chunk holds 4096" in outcome
    assert peak - baseline < 64 * MiB


def test_a_zarr_v2_zstd_chunk_claiming_2_gib_is_refused(tmp_path, baseline):
    path = zarr_store(tmp_path, zarr_format=2, compressors=numcodecs.Zstd())
    rewrite_first_chunk(path, lambda raw: claiming(raw, CLAIM))
    peak, outcome = read_in_fresh_interpreter(path)
    assert "claims 2147483648" in outcome
    assert peak - baseline < 64 * MiB


def test_a_gzip_bomb_stops_at_the_chunk_size(tmp_path, baseline):
    path = zarr_store(tmp_path, compressors=zarr.codecs.GzipCodec())
    # 64 KiB on disk: within the most a gzip chunk of 4 KiB can be stored in, so the file is read and decoded.
    bomb = gzip.compress(bytes(64 * MiB), compresslevel=9)
    rewrite_first_chunk(path, lambda raw: bomb)
    peak, outcome = read_in_fresh_interpreter(path)
    assert "decodes to more than the 4096 bytes" in outcome
    assert peak - baseline < 64 * MiB


def test_an_hdf5_zstd_chunk_claiming_2_gib_is_refused(tmp_path, baseline):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data(), chunks=(32, 32), **hdf5plugin.Zstd())
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(0)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset)
        frame = f.read(info.size)
        # Same length on disk: the rewritten header, cut to the chunk's stored size.
        f.seek(info.byte_offset)
        f.write(claiming(frame, CLAIM)[: info.size])
    peak, outcome = read_in_fresh_interpreter(f"{path}::x")
    assert "claims 2147483648" in outcome
    assert peak - baseline < 64 * MiB


@pytest.mark.parametrize(
    ("decode", "encoded", "size", "message"),
    [
        (zstd_decode, numcodecs.Zstd().encode(bytes(1000)), 999, "claims 1000 bytes where the chunk holds 999"),
        (gzip_decode, gzip.compress(bytes(1000), mtime=0), 999, "more than the 999 bytes"),
        (zlib_decode, zlib.compress(bytes(1000)), 999, "does not decode to the 999 bytes"),
        (zlib_decode, zlib.compress(bytes(500)), 999, "500 bytes, not the 999"),
        (gzip_decode, gzip.compress(bytes(500), mtime=0), 999, "500 bytes, not the 999"),
    ],
)
def test_decoders_refuse_chunks_of_another_size(decode, encoded, size, message):
    with pytest.raises(Exception, match=message):
        decode(encoded, size)


def test_bounded_decoders_give_the_chunk_back():
    raw = np.arange(1000, dtype="u1").tobytes()
    assert bytes(zstd_decode(numcodecs.Zstd().encode(raw), 1000)) == raw
    assert gzip_decode(gzip.compress(raw), 1000) == raw
    assert bytes(zlib_decode(zlib.compress(raw), 1000)) == raw
    assert bytes(gzip_decode(gzip.compress(raw), 2000, exact=False)) == raw
    assert zstd_content_size(numcodecs.Zstd().encode(raw)) == 1000


@pytest.mark.parametrize(
    ("decode", "encode"), [(zstd_decode, numcodecs.Zstd().encode), (blosc_decode, numcodecs.Blosc().encode)]
)
def test_a_chunk_decodes_into_a_buffer_given_of_exactly_its_size_and_no_other(decode, encode):
    raw = np.arange(1000, dtype="u1").tobytes()
    place = np.zeros(1000, dtype="u1")
    assert decode(encode(raw), 1000, into=place) is place
    assert place.tobytes() == raw
    short = np.zeros(999, dtype="u1")
    with pytest.raises(ValueError, match="claims 1000 bytes where the chunk holds 999"):
        decode(encode(raw), 999, into=short)
    assert not short.any()  # refused before a byte is written
    with pytest.raises(ValueError, match="only where its size is exact"):
        decode(encode(raw), 1000, exact=False, into=place)
