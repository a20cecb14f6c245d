"""Hostile files built the way an attacker would: real HDF5 files and Zarr stores, then bytes patched.

Shared by the tests of sizes read from indexes and headers (``test_hostile_sizes.py``). Each read of a
hostile file happens in a fresh interpreter with its address space limited, so an allocation of the
size a file claims fails there rather than being taken.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import h5py
import numpy as np
from numcodecs.jenkins import jenkins_lookup3

MiB = 2**20
# What a forged chunk size claims: the 4 GiB of the report, in a file of a few hundred KiB.
FORGED = 0xFFFFFF00
# The bound on what reading a hostile file may take beyond what the process held: the memory budget the
# reads are given, far below the sizes the files claim.
BUDGET = 64 * MiB

# HDF5's checksummed metadata blocks (fixed and extensible arrays, version 2 B-trees, object headers):
# patching bytes inside one means computing its checksum again, as a writer of a forged file would.
_CHECKSUMMED = (b"FAHD", b"FADB", b"EAHD", b"EAIB", b"EASB", b"EADB", b"BTHD", b"BTIN", b"BTLF", b"OHDR", b"OCHK")

# Every chunk index HDF5 writes, by how h5py asks for it (the file format's names).
INDEX_KINDS = {
    # libver "earliest": version 1 B-tree, whatever the shape.
    "btree-v1": {"libver": "earliest"},
    # libver "latest": fixed dimensions give a fixed array, one unlimited an extensible array, two a
    # version 2 B-tree, and one chunk the size of the dataset a single-chunk index.
    "fixed-array": {"libver": "latest"},
    "extensible-array": {"libver": "latest", "maxshape": (None, 256)},
    "btree-v2": {"libver": "latest", "maxshape": (None, None)},
    "single-chunk": {"libver": "latest", "chunks": (256, 256)},
}


def values(dtype: str = "f4") -> np.ndarray:
    return np.random.default_rng(0).integers(0, 4, (256, 256)).astype(dtype)


def hdf5_file(path: Path, kind: str, *, compression: str | None = "gzip", dtype: str = "f4", **options) -> Path:
    """A 256 x 256 dataset ``x`` in chunks of 128 x 128 (256 KiB decoded each), indexed as ``kind`` says."""
    settings = {"chunks": (128, 128), **INDEX_KINDS[kind], **options}
    libver = settings.pop("libver")
    with h5py.File(path, "w", libver=libver) as f:
        f.create_dataset("x", data=values(dtype), compression=compression, **settings)
    return path


def stored_chunks(path: Path) -> list:
    with h5py.File(path, "r") as f:
        found: list = []
        f["x"].id.chunk_iter(found.append)
    return found


def forge_chunk_size(path: Path, size: int, which: int = 0) -> None:
    """Rewrite the size the chunk index states for chunk ``which``, wherever the index kind keeps it.

    The index entry is found as the chunk's size next to its address; the
    checksum of the metadata block holding it, if any, is computed again.
    """
    info = stored_chunks(path)[which]
    raw = bytearray(path.read_bytes())
    address = struct.pack("<Q", info.byte_offset)
    # v1 B-tree keys hold the size in 4 bytes, then the filter mask; the newer indexes in as many bytes
    # as the chunk's size needs, then the mask; a filtered single chunk in 8. The mask follows as 0.
    for width in (8, 4):
        field = info.size.to_bytes(width, "little")
        at = next((i for i in _find_all(raw, field) if address in raw[max(0, i - 40) : i + 40]), None)
        if at is not None:
            break
    else:
        raise AssertionError(f"no index entry of {info.size} bytes at byte {info.byte_offset} in {path}")
    blocks = [block for block in _checksummed_blocks(raw) if block[0] <= at < block[1]]
    raw[at : at + width] = size.to_bytes(width, "little")
    for start, end in blocks:
        raw[end : end + 4] = struct.pack("<I", jenkins_lookup3(np.frombuffer(bytes(raw[start:end]), "u1"), 0))
    path.write_bytes(raw)


def move_chunk_to_end(path: Path, content: bytes, which: int = 0) -> None:
    """Point chunk ``which`` of a version 1 B-tree at ``content`` appended to the file, stating its size.

    What a forger does to put a bomb in place of a chunk: the index says the
    new bytes are the chunk, and the superblock's end of file covers them.
    """
    info = stored_chunks(path)[which]
    raw = bytearray(path.read_bytes())
    key, pointer = btree_v1_entry(raw, info, rank=2)
    end = len(raw)
    raw[key : key + 4] = len(content).to_bytes(4, "little")
    raw[pointer : pointer + 8] = struct.pack("<Q", end)
    eof = raw.find(struct.pack("<Q", end), 0, 128)  # superblock version 0: its end-of-file address
    raw += content
    raw[eof : eof + 8] = struct.pack("<Q", len(raw))
    path.write_bytes(raw)


def btree_v1_entry(raw: bytes | bytearray, info, rank: int) -> tuple[int, int]:
    """Where a version 1 B-tree keeps a chunk: ``(its key, its address)``.

    A leaf node holds key, address, key, address...; a key is the chunk's
    size (4 bytes), filter mask (4) and offset (8 bytes an axis, and one more).
    """
    pointer = raw.find(struct.pack("<Q", info.byte_offset))
    key = pointer - 8 - 8 * (rank + 1)
    assert pointer > 0, f"no address {info.byte_offset} in the file"
    assert raw[key : key + 4] == info.size.to_bytes(4, "little"), "the key before it states the chunk's size"
    return key, pointer


def _find_all(raw: bytearray, needle: bytes):
    at = raw.find(needle)
    while at != -1:
        yield at
        at = raw.find(needle, at + 1)


def _checksummed_blocks(raw: bytearray) -> list[tuple[int, int]]:
    """``(start, end)`` of each checksummed block: the checksum is the 4 bytes at ``end``."""
    blocks = []
    for signature in _CHECKSUMMED:
        for start in _find_all(raw, signature):
            for end in range(start + 8, min(len(raw) - 3, start + 2**16)):
                stored = struct.unpack_from("<I", raw, end)[0]
                if jenkins_lookup3(np.frombuffer(bytes(raw[start:end]), "u1"), 0) == stored:
                    blocks.append((start, end))
                    break
    return blocks


def zipped_store(folder: Path, zip_path: Path, replace: dict | None = None, compression: int = zipfile.ZIP_STORED):
    """``folder`` (a Zarr store) as a zip file, the members named in ``replace`` given other bytes."""
    replace = replace or {}
    with zipfile.ZipFile(zip_path, "w", compression) as z:
        for root, _, files in os.walk(folder):
            for name in sorted(files):
                member = os.path.relpath(os.path.join(root, name), folder)
                content = replace.get(member, (Path(root) / name).read_bytes())
                z.writestr(zipfile.ZipInfo(member), content, compress_type=compression)
    shutil.rmtree(folder)
    return zip_path


def forge_zip_member_size(zip_path: Path, member: str, size: int) -> None:
    """Make ``member`` declare ``size`` unpacked bytes, in its local header and in the central directory."""
    with zipfile.ZipFile(zip_path) as z:
        real = struct.pack("<L", z.getinfo(member).file_size)
    raw = bytearray(zip_path.read_bytes())
    for signature, field in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        for at in _find_all(raw, signature):
            if raw[at + field : at + field + 4] == real:
                raw[at + field : at + field + 4] = struct.pack("<L", size)
    zip_path.write_bytes(raw)


def zstd_bomb(size: int, *, declared: bool = True) -> bytes:
    """A zstd frame of ``size`` zero bytes in run-length blocks of 128 KiB: 4 bytes each, 2 GiB in 64 KiB.

    ``declared``: whether its header states the size (else a decoder learns it only by decoding).
    Built block by block, so making it takes none of the memory it decodes to.
    """
    block = 128 * 2**10
    header = bytes([0xE0]) + struct.pack("<Q", size) if declared else bytes([0x00, 0x38])  # 128 KiB window
    parts = [struct.pack("<I", 0xFD2FB528), header]
    full, rest = divmod(size, block)
    sizes = [block] * full + ([rest] if rest else [])
    for position, n in enumerate(sizes):
        last = position == len(sizes) - 1
        parts.append(((n << 3) | (1 << 1) | last).to_bytes(3, "little") + b"\0")  # a run-length block of zeros
    return b"".join(parts)


def deflated(size: int, wbits: int = 15, content: bytes = b"\0") -> bytes:
    """``size`` bytes of ``content`` repeated, deflated (zlib's ``wbits``: 15 zlib, -15 raw, 31 gzip) a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    piece = content * (MiB // len(content))
    parts = [packer.compress(piece) for _ in range(size // MiB)]
    return b"".join([*parts, packer.compress(content * ((size % MiB) // len(content))), packer.flush()])


def write_member(z: zipfile.ZipFile, name: str, size: int, method: int, content: bytes = b"\0") -> None:
    """Add a member of ``size`` bytes of ``content`` repeated, written a MiB at a time."""
    info = zipfile.ZipInfo(name)
    info.compress_type = method
    with z.open(info, "w", force_zip64=size > 2**31) as member:
        piece = content * (MiB // len(content))
        for _ in range(size // MiB):
            member.write(piece)
        member.write(content * ((size % MiB) // len(content)))


def claiming(frame: bytes, size: int) -> bytes:
    """A zstd frame whose header declares ``size`` decoded bytes (the data after it unchanged)."""
    descriptor = frame[4]
    old = {0: 1, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
    start = 5 + (0, 1, 2, 4)[descriptor & 3]
    rewritten = bytes([(3 << 6) | (1 << 5) | (descriptor & 3)])
    return frame[:4] + rewritten + frame[5:start] + size.to_bytes(8, "little") + frame[start + old :]


_READ = """
import resource, sys
import daskstream as ds
from daskstream.errors import DaskstreamError


def status(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1]) * 1024


intact, hostile, budget = sys.argv[1], sys.argv[2], sys.argv[3]
# Every library loaded and every pool started, on a file like the hostile one but intact.
ds.open(intact, memory_budget=budget).compute(scheduler="sync")
# Room for the budget and for what the libraries map as they work; none for a forged size.
room = status("VmSize") + 1024 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (room, room))
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from here
except OSError:
    pass
before = status("VmRSS")
try:
    ds.open(hostile, memory_budget=budget).compute(scheduler="sync")
    outcome = "read"
except DaskstreamError as exc:
    builtins = [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"]
    outcome = f"{type(exc).__name__}({builtins[0]}): " + str(exc).replace(chr(10), " ")
except MemoryError as exc:
    outcome = f"MemoryError: {exc}"
print(status("VmHWM") - before)
print(outcome)
"""


def read_hostile(hostile: str | Path, intact: str | Path) -> tuple[int, str]:
    """Read ``hostile`` in a fresh interpreter whose address space leaves no room for a forged size.

    Returns how far resident memory rose above what the same interpreter held
    after reading ``intact``, and ``"read"``, ``"MemoryError: ..."`` or
    ``"ErrorClass(builtin): message"``.
    """
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(intact), str(hostile), str(BUDGET)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    growth, outcome = done.stdout.strip().splitlines()[-2:]
    return int(growth), outcome
