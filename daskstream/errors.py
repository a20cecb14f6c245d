"""Exceptions raised by daskstream.

Every error raised on purpose derives from :class:`DaskstreamError`, and most
also derive from the builtin a Python user would expect (``FileNotFoundError``,
``ValueError``, ``TypeError``...), so ``except FileNotFoundError`` keeps working.
Messages name the offending input and say what to do next.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from typing import Any

__all__ = [
    "AttributeDecodingError",
    "ChunkSplitWarning",
    "ClusterConnectionError",
    "ClusterVersionError",
    "ConfigFileNotFoundError",
    "CorruptSourceError",
    "DaskstreamError",
    "DaskstreamWarning",
    "FileFamilyError",
    "IntermediateNotSharedError",
    "InvalidArgumentError",
    "InvalidAxisError",
    "InvalidBudgetError",
    "InvalidChunksError",
    "InvalidIndexError",
    "KernelError",
    "KernelShapeError",
    "MatlabLayoutWarning",
    "MemberNotFoundError",
    "MemoryBudgetError",
    "MissingDependencyError",
    "NotARegularFileError",
    "NotAZarrStoreError",
    "NotAnArrayError",
    "ObjectStoreCredentialsError",
    "ObjectStoreUnreachableError",
    "OutsideFileError",
    "PackedDataWarning",
    "SkippedImagesWarning",
    "SourceChangedError",
    "SourceNotFoundError",
    "SourcePermissionError",
    "SourceRemovedError",
    "TargetDamagedError",
    "TargetExistsError",
    "TargetMismatchError",
    "TargetWriteError",
    "TuneCacheWarning",
    "UnknownFormatError",
    "UnknownOperationError",
    "UnsupportedDtypeError",
    "UnsupportedShapeError",
]


class DaskstreamError(Exception):
    """Base class of every error daskstream raises on purpose."""


class SourceNotFoundError(DaskstreamError, FileNotFoundError):
    """The path given does not exist."""


class UnknownFormatError(DaskstreamError, ValueError):
    """The file is neither .npy, HDF5 nor Zarr."""


class NotAZarrStoreError(UnknownFormatError):
    """A directory was given that holds no Zarr metadata."""


class CorruptSourceError(DaskstreamError, OSError):
    """The file is truncated, damaged or not what its signature claims."""


class UnsupportedDtypeError(DaskstreamError, TypeError):
    """The array's dtype cannot be read safely (object, variable-length...)."""


class UnsupportedShapeError(DaskstreamError, ValueError):
    """The array has more dimensions than numpy holds, or a shape too large to address."""


class NotARegularFileError(DaskstreamError, OSError):
    """The path is a pipe, socket or device rather than a file or folder: reading it could block forever."""


class OutsideFileError(DaskstreamError, PermissionError):
    """A file reaches data in another file outside its folder (HDF5 external storage, links, virtual datasets).

    Refused unless ``daskstream.sources.allow-outside-files`` is set.
    """


class MemberNotFoundError(DaskstreamError, KeyError):
    """The HDF5 dataset or Zarr member named does not exist."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a sentence reads better unquoted.
        return str(self.args[0]) if self.args else ""


class NotAnArrayError(DaskstreamError, TypeError):
    """A group was named where an array was expected."""


class InvalidBudgetError(DaskstreamError, ValueError):
    """A memory budget that is not a positive number of bytes."""


class MemoryBudgetError(InvalidBudgetError, MemoryError):
    """The work cannot be done within the memory budget.

    Raised before anything is read: the message names the operation, what one
    task or the whole plan would hold (term by term, in human units) against
    the budget, and what to change.
    """


class InvalidChunksError(DaskstreamError, ValueError):
    """A chunk specification that does not fit the array."""


class SourceChangedError(DaskstreamError, RuntimeError):
    """The file changed on disk after it was opened."""


class SourceRemovedError(SourceChangedError, FileNotFoundError):
    """The file was removed after it was opened."""


class DaskstreamWarning(UserWarning):
    """Base class of daskstream's warnings: filter them all with ``warnings.filterwarnings(..., category=DaskstreamWarning)``."""


class ChunkSplitWarning(DaskstreamWarning):
    """Chunks split storage chunks, so some are read more than once."""


class PackedDataWarning(DaskstreamWarning):
    """The file says its numbers are packed or hold a fill value (CF conventions), and they are given as stored."""


class MatlabLayoutWarning(DaskstreamWarning):
    """A MATLAB 7.3 MAT-file's array, given as HDF5 stores it: transposed, and characters as UTF-16 codes."""


class SkippedImagesWarning(DaskstreamWarning):
    """Files that are not readable images were left out of ``open_images(..., on_error="skip")``; its ``skipped`` says why."""


class TuneCacheWarning(DaskstreamWarning):
    """The tuning cache file could not be read; it is treated as empty."""


class InvalidAxisError(DaskstreamError, ValueError, IndexError):
    """An axis outside the array's dimensions."""


class SourcePermissionError(DaskstreamError, PermissionError):
    """The path exists but cannot be read."""


class InvalidArgumentError(DaskstreamError, ValueError):
    """Arguments that contradict each other or cannot be used together."""


class FileFamilyError(DaskstreamError, ValueError):
    """Files opened as one array differ in dtype or shape where they must agree."""


class InvalidIndexError(DaskstreamError, IndexError):
    """An index into a source that is out of bounds or of an unsupported kind."""


class UnknownOperationError(DaskstreamError, ValueError):
    """A reduction or kernel name that daskstream does not know."""


class KernelError(DaskstreamError, RuntimeError):
    """A user kernel raised on one block; the message names the block."""


class KernelShapeError(DaskstreamError, ValueError):
    """A kernel returned blocks of another shape than it declared."""


class TargetExistsError(DaskstreamError, FileExistsError):
    """The store target already holds an array and overwrite was not asked for."""


class TargetMismatchError(DaskstreamError, ValueError):
    """An existing store target has another shape, dtype or chunking than the array written."""


class TargetWriteError(DaskstreamError, OSError):
    """The store target could not be written (permission denied, disk full...); blocks recorded as done stay."""

    def __str__(self) -> str:
        # OSError formats as "[Errno 28] message"; the message alone already says it.
        return str(self.strerror if self.strerror is not None else (self.args[0] if self.args else ""))


class ConfigFileNotFoundError(DaskstreamError, FileNotFoundError):
    """A settings file named by the user (a cluster file, a certificate it names) does not exist."""


class TargetDamagedError(DaskstreamError, OSError):
    """An existing store target cannot be read or opened for writing: damaged, or held by another process."""


class IntermediateNotSharedError(DaskstreamError, FileNotFoundError):
    """A rechunk's second pass did not find what its first pass wrote: the intermediate folder is not shared."""


class MissingDependencyError(DaskstreamError, ImportError):
    """An optional package that a feature needs is not installed (or not in a version that works)."""


class ObjectStoreUnreachableError(DaskstreamError, ConnectionError):
    """The object store's endpoint did not answer (wrong address, network down) within the bounded time."""


class ObjectStoreCredentialsError(DaskstreamError, PermissionError):
    """No credentials for the object store were found, or the store refused those given."""


class ClusterConnectionError(DaskstreamError, ConnectionError):
    """No scheduler answered at the address given, or it refused the connection."""


class ClusterVersionError(DaskstreamError, RuntimeError):
    """The scheduler or a worker cannot import daskstream, or imports another version of it (or of dask,
    distributed or numpy) than this client: the message names each such process and what it has."""


class AttributeDecodingError(DaskstreamError, ValueError):
    """A variable's CF attributes (scale_factor, add_offset, _FillValue, time units or calendar) cannot be decoded."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for one-line errors."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def shown(value: Any, limit: int = 40) -> str:
    """``value``'s repr for a message (an array's as a list), shortened in the middle when longer than ``limit``
    characters, so that a pasted 400-digit number or a long list still reads on one line.

    >>> shown(10**50)
    '100000000000...000000 (51 characters)'
    >>> shown([1, 2])
    '[1, 2]'
    >>> shown(10**5000)
    'an int of 16610 bits'
    """
    # Arrays as lists ([1, 2] rather than array([1, 2])); scalars as numpy writes them (np.float64(nan)).
    try:
        text = repr(value.tolist() if getattr(value, "ndim", 0) and hasattr(value, "tolist") else value)
    except ValueError:
        # An int past Python's limit on the digits it converts to text (sys.set_int_max_str_digits), alone or
        # inside a container: said by its size.
        return f"an int of {value.bit_length()} bits" if isinstance(value, int) else f"a {type(value).__name__}"
    if len(text) <= limit:
        return text
    return f"{text[: max(12, limit // 2 - 8)]}...{text[-6:]} ({len(text)} characters)"


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, else ``__context__``), in order, each once."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return chain


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the first line outside daskstream: the user's, whatever the depth.

    A fixed ``stacklevel`` points into daskstream whenever the warning is
    said from one call deeper than it was written for; walking the stack
    finds the caller's line from wherever it is said.
    """
    level = 2  # the line that called warn()
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
