"""Local files opened for reading without ever blocking: regular files only.

A named pipe, socket or device where a data or settings file is expected would
make a plain ``open`` or ``read`` wait forever (a pipe with no writer) or never
end (``/dev/zero``). Every file daskstream reads on its own goes through
:func:`open_regular`, which checks the type on the descriptor it reads from.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from daskstream.errors import NotARegularFileError, SourcePermissionError

__all__ = ["not_regular_error", "open_regular"]


def not_regular_error(path: str, mode: int) -> NotARegularFileError:
    kind = (
        "a named pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )
    return NotARegularFileError(
        f"{path}: is {kind}, not a file daskstream reads (reading it could wait forever); give a regular file"
    )


def open_regular(path: str) -> BinaryIO:
    """Open a local file for reading, refusing anything but a regular file before reading a byte.

    The file is opened without blocking, so a named pipe in its place cannot
    stall the open, and its type is checked on the descriptor opened (no gap
    between the check and the read). Raises :class:`FileNotFoundError` (the
    builtin, as ``open`` does) for a missing file, so callers keep their own
    meaning for that case.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        raise SourcePermissionError(f"{path}: permission denied; check the file's permissions") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", path)
            raise not_regular_error(path, mode)
        # Regular files never block; clearing the flag keeps reads plain.
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
