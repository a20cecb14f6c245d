"""Members of a zip file, read with every size its directory states checked before anything is allocated.

A zip's central directory says how large each member is, packed and
unpacked, and :mod:`zipfile` believes it: a member declaring 4 GiB is read
into 4 GiB, and a bzip2 or LZMA member decompresses each block of what it
reads whole, however much that makes (a few KiB of bzip2 can make
gigabytes). Here a member is read only when its declared sizes fit the file
and the caller's limit, and unpacked by a decoder that stops one byte past
the size declared (:mod:`daskstream.sources.bounded`); its CRC-32 is then
checked, so a member that decodes to other bytes than it declares is refused
too. Stored (Zarr's default), deflate and bzip2 members are read; LZMA and
encrypted members are refused with what to do instead.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from typing import Any

from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.files import open_regular
from daskstream.sources.bounded import DECODE_ERRORS, bz2_decode, largest_encoding

# A member's local header: its signature, then fields up to the lengths of its name and extra field.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_REZIP = "re-create the zip with its members stored (zip -0) or deflated"


class ZipMembers:
    """One zip file's directory, and its members read by ``os.pread`` within the limits given.

    The directory is read once; each read opens the file again (nothing is
    held open between reads) and checks the places the directory states
    against the file's size then.

    Parameters
    ----------
    path
        The zip file.
    name
        How errors name it.

    Raises
    ------
    CorruptSourceError
        When the file's directory cannot be read.
    """

    def __init__(self, path: str, name: str | None = None) -> None:
        self.path = path
        self.name = name or path
        try:
            # Opened without blocking (a pipe in the zip's place), and only the central directory read.
            with open_regular(path) as f, zipfile.ZipFile(f) as z:
                self.infos = {info.filename: info for info in z.infolist()}
        except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            if isinstance(exc, (DaskstreamError, FileNotFoundError)):
                raise
            raise CorruptSourceError(
                f"{self.name}: the zip file's directory cannot be read ({exc}); the file is damaged: re-create or "
                "re-copy it"
            ) from None

    def __contains__(self, member: str) -> bool:
        return member in self.infos

    def read(self, member: str, limit: int) -> bytes | None:
        """The unpacked bytes of ``member`` (``None`` when the zip has none of that name), at most ``limit``.

        Raises
        ------
        CorruptSourceError
            When the member declares more than ``limit`` bytes, lies (as its
            directory places it) past the end of the file, is packed in more
            bytes than its method can make of what it declares, unpacks to
            other bytes than it declares, or is encrypted or packed by LZMA.
        """
        info = self.infos.get(member)
        if info is None:
            return None
        with open_regular(self.path) as f:
            packed = self._packed(f.fileno(), info, limit)
        try:
            if info.compress_type == zipfile.ZIP_STORED:
                data = packed
            elif info.compress_type == zipfile.ZIP_DEFLATED:
                data = _inflated(packed, info.file_size)
            else:
                data = bz2_decode(packed, info.file_size)
        except DECODE_ERRORS as exc:
            raise self._damaged(info, f"it does not unpack to the {info.file_size} bytes it declares ({exc})") from None
        if zlib.crc32(data) != info.CRC:
            raise self._damaged(info, "its bytes do not match its CRC-32")
        return bytes(data)

    def _packed(self, fd: int, info: zipfile.ZipInfo, limit: int) -> bytes:
        """The member's packed bytes, once every size the directory and its local header state is checked."""
        if info.flag_bits & 0x1:
            raise self._damaged(info, f"it is encrypted, which daskstream does not read; {_REZIP}")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2):
            method = {zipfile.ZIP_LZMA: "LZMA"}.get(info.compress_type, f"compression method {info.compress_type}")
            raise self._damaged(info, f"it is packed by {method}, which daskstream does not read; {_REZIP}")
        if info.file_size > limit:
            raise self._damaged(info, f"it declares {info.file_size} bytes, more than such a member holds ({limit})")
        most = info.file_size if info.compress_type == zipfile.ZIP_STORED else largest_encoding(info.file_size)
        if info.compress_size > most:
            raise self._damaged(
                info, f"it is packed in {info.compress_size} bytes, more than its {info.file_size} bytes can take"
            )
        size = os.fstat(fd).st_size
        header = self._pread(fd, size, _LOCAL_HEADER.size, info.header_offset, info)
        fields = _LOCAL_HEADER.unpack(header)
        if fields[0] != _LOCAL_SIGNATURE:
            raise self._damaged(info, f"no member header at byte {info.header_offset}")
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        return self._pread(fd, size, info.compress_size, start, info)

    def _pread(self, fd: int, size: int, n: int, position: int, info: zipfile.ZipInfo) -> bytes:
        if position < 0 or position + n > size:
            raise self._damaged(
                info, f"its directory places {n} bytes at byte {position}, past the end of the file ({size} bytes)"
            )
        data = os.pread(fd, n, position)
        if len(data) != n:
            raise self._damaged(
                info, f"the file ended {n - len(data)} bytes early (it was cut short since it was opened)"
            )
        return data

    def _damaged(self, info: zipfile.ZipInfo, why: str) -> CorruptSourceError:
        return CorruptSourceError(
            f"{self.name}: member {info.filename!r} cannot be read: {why}; the zip file is damaged or forged: "
            "re-create or re-copy it"
        )


def _inflated(packed: bytes, size: int) -> Any:
    """A raw deflate stream (a zip member's) decoded to exactly ``size`` bytes, never more than one past it."""
    out = zlib.decompressobj(-zlib.MAX_WBITS).decompress(packed, size + 1)
    if len(out) != size:
        grew = "more than" if len(out) > size else f"{len(out)} bytes, not"
        raise ValueError(f"the deflate stream decodes to {grew} {size} bytes")
    return out


__all__ = ["ZipMembers"]
