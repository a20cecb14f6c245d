"""What every store target does: find its state, refuse writing over what it reads, record progress."""

from __future__ import annotations

import abc
import dataclasses
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any

import dask.array as da
import numpy as np

from daskstream.advice import keyword, passing, said
from daskstream.compute.store.record import StoreIdentity
from daskstream.errors import (
    CorruptSourceError,
    InvalidArgumentError,
    TargetExistsError,
    TargetMismatchError,
    TargetWriteError,
    UnknownFormatError,
    first_line,
)
from daskstream.graph.layers import read_layers
from daskstream.runtime.schedulers import scheduler_kind
from daskstream.sources.base import Source, file_stamp, native
from daskstream.sources.detect import EXTENSIONS, guess_format
from daskstream.sources.hdf5.filters import import_h5py
from daskstream.sources.zarr.source import is_url

#: The advice to write over what a target holds.
OVERWRITE = passing("overwrite", True)

ProgressCallback = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class Carried:
    """What a target keeps of its source beside the numbers: attributes, dimension names, fill value.

    Only what still holds for the array stored: all three for a plain read of
    one source; the dimension names alone when it computes something of the
    same shape from one source (its units or scale may no longer apply);
    nothing otherwise.
    """

    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dims: tuple[str | None, ...] | None = None
    fill_value: Any = None
    #: Per axis, the HDF5 dimension scale labelling it (a path in ``scale_file``), as ``Source.scales``.
    scales: tuple[str | None, ...] | None = None
    scale_file: str | None = None
    #: A Zarr format 2 array is made with no fill value (``null``), not zarr's 0: xarray reads format 2 fill
    #: values as missing, so a 0 would turn every zero of the data into NaN.
    no_fill: bool = False

    def fill_for(self, dtype: np.dtype) -> Any:
        """The fill value as a scalar of ``dtype`` (a record from a tuple), or ``None`` if it is not one."""
        if self.fill_value is None:
            return None
        try:
            return np.asarray(self.fill_value, dtype=dtype)[()]
        except (TypeError, ValueError, OverflowError):
            return None

    @classmethod
    def of(cls, x: da.Array) -> Carried:
        reads = read_layers(x)
        if len(reads) != 1:
            return cls()
        name, source, _ = reads[0]
        # Names and scales label the axes, which an array of the same shape computed from the source keeps.
        axes = cls(dims=source.dims, scales=source.scales, scale_file=source.path if source.scales else None)
        if tuple(source.shape) != tuple(x.shape):
            return cls()
        if name != x.name:
            return axes
        return dataclasses.replace(axes, attrs=dict(source.attrs), fill_value=source.fill_value)

    def scale_values(self, axis: int, open_file: Any = None) -> tuple[str, np.ndarray] | None:
        """The name and values of the scale labelling ``axis``, read from its file (``open_file`` when it is
        that file, open for writing), or ``None`` when there is none or it cannot be read."""
        path = self.scales[axis] if self.scales and axis < len(self.scales) else None
        if path is None or self.scale_file is None:
            return None
        try:
            same = open_file is not None and os.path.samefile(open_file.filename, self.scale_file)
            if same:
                return posixpath.basename(path), np.asarray(open_file[path][()])
            with import_h5py().File(self.scale_file, "r") as f:
                return posixpath.basename(path), np.asarray(f[path][()])
        except (OSError, KeyError, TypeError, ValueError):
            return None


HDF5_ERRNO = re.compile(r"errno = (\d+)")


HDF5_SUFFIXES = tuple(ext for ext, fmt in EXTENSIONS.items() if fmt == "hdf5")


def target_format(path: str) -> str:
    """``"hdf5"`` for an existing HDF5 file or an HDF5 file name, ``"zarr-url"`` for a URL, else ``"zarr"``."""
    if not path.strip():
        raise InvalidArgumentError(
            "store needs a target: an empty path would write into the current folder; give a Zarr folder "
            "(out.zarr) or an HDF5 file and dataset (out.h5::/data)"
        )
    if path.startswith("file://"):
        raise InvalidArgumentError(f"{path}: give a local target as a path, without file://")
    if is_url(path):
        if path.lower().rstrip("/").endswith((*HDF5_SUFFIXES, ".zip")):
            raise InvalidArgumentError(
                f"{path}: store writes Zarr to object stores (each chunk one object, put whole); an HDF5 or zip "
                "file is one object that cannot be written chunk by chunk there. Store to a .zarr URL, or to a "
                "local file and copy it"
            )
        return "zarr-url"
    if os.path.lexists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        if os.path.islink(path):
            raise TargetExistsError(
                f"{path}: a symbolic link to nothing ({os.readlink(path)}); remove it or choose another target"
            )
        file_stamp(path)  # a pipe, socket or device: NotARegularFileError naming what it is
    if path.lower().rstrip("/").endswith(".zip") and not os.path.isdir(path):
        raise InvalidArgumentError(
            f"{path}: store writes Zarr folders, not zip files; store to a folder (out.zarr), then zip it "
            "(zip -r -0 out.zip out.zarr, or zarr's ZipStore)"
        )
    if os.path.isfile(path):
        try:
            fmt = guess_format(path)
        except (UnknownFormatError, CorruptSourceError):
            fmt = "other"
        if fmt != "hdf5":
            raise TargetExistsError(
                f"{path}: a file that is not HDF5 is there, and store writes Zarr directories or HDF5 files; "
                "choose another target (daskstream will not delete it)"
            )
        return "hdf5"
    if os.path.isdir(path):
        return "zarr"
    return "hdf5" if path.lower().endswith(HDF5_SUFFIXES) else "zarr"


class Target(abc.ABC):
    """One kind of target: how to find its state, record progress and write blocks."""

    path: str
    member: str | None
    #: What a new array is compressed with, in the terms ``store`` takes (``"default"``, ``None``, a codec...).
    compressor: Any

    @abc.abstractmethod
    def write(
        self,
        x: da.Array,
        identity: StoreIdentity,
        *,
        resume: bool,
        overwrite: bool,
        report: ProgressCallback | None,
    ) -> None:
        """Write the blocks of ``x`` not yet recorded as done, recording each as it lands."""

    def recover(self) -> None:  # noqa: B027 - a target that never swaps has nothing to recover
        """Finish (or undo) a replacement of what the target holds that a killed process left half done."""

    @property
    def name(self) -> str:
        return self.path if self.member is None else f"{self.path}::{self.member}"

    @abc.abstractmethod
    def check_sources(self, sources: list[Source]) -> None:
        """Refuse to write over what the array itself reads, however either is spelled.

        Paths are compared by what they lead to (symbolic links followed,
        folders compared by device and inode), before anything is deleted.
        """

    def _reads_itself(self, source: Source, how: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.name}: the array stored reads {source.name}, {how}; writing would destroy the data "
            "while it is read. Write to another target, then replace the old one"
        )

    def _refuse_existing(self, what: str) -> TargetExistsError:
        return TargetExistsError(
            said(f"{self.name} already holds {what}; ", OVERWRITE, " to replace it, or choose another target")
        )

    def _unreadable_record(self, where: str, exc: BaseException) -> TargetMismatchError:
        """The progress record at ``where`` (a file, an attribute) is there but cannot be read."""
        return TargetMismatchError(
            said(f"{self.name}: its progress record ({where}) cannot be read ({exc}); ", OVERWRITE, " to start again")
        )

    def _refuse_unfinished(self) -> TargetExistsError:
        """An unfinished store here, and ``resume=False``."""
        return TargetExistsError(
            said(
                f"{self.name} holds an unfinished store, which ",
                keyword("resume", False),
                " does not finish: ",
                passing("resume", True),
                " to finish it, or ",
                OVERWRITE,
                " to start again",
            )
        )

    def _check_shape_dtype(self, shape: tuple[int, ...], dtype: np.dtype, x: da.Array) -> None:
        if tuple(shape) != tuple(x.shape) or native(np.dtype(dtype)) != native(x.dtype):
            raise TargetMismatchError(
                said(
                    f"{self.name} holds an array of shape {tuple(shape)} and dtype {dtype}, but the array stored "
                    f"has shape {tuple(x.shape)} and dtype {x.dtype}; ",
                    OVERWRITE,
                    " to replace it, or choose another target",
                )
            )

    def _check_identity(self, recorded: StoreIdentity, identity: StoreIdentity) -> None:
        changes = recorded.differences(identity)
        if not changes:
            return
        if (recorded.shape, recorded.dtype) == (identity.shape, identity.dtype) and recorded.chunks != identity.chunks:
            raise TargetMismatchError(
                said(
                    f"{self.name} holds an unfinished store of this shape and dtype in chunks {recorded.chunks}, "
                    f"but the array stored now has chunks {identity.chunks} (another memory budget or chunking): "
                    "resume it with the chunks (or the memory budget) it was started with, or ",
                    OVERWRITE,
                    " to start again, which writes again the blocks already written",
                )
            )
        raise TargetMismatchError(
            said(
                f"{self.name} holds an unfinished store of another computation ({'; '.join(changes)}); ",
                OVERWRITE,
                " to start it again with this array, or choose another target",
            )
        )

    @abc.abstractmethod
    def recorded(self) -> StoreIdentity | None:
        """The identity a store into this target recorded, unfinished or else finished, if there is one."""

    @abc.abstractmethod
    def completed(self, x: da.Array) -> StoreIdentity | None:
        """What a finished store into this target computed, when the array there still has ``x``'s shape and dtype.

        Reads only: a store found complete writes nothing.
        """

    def _refuse_finished(self, finished: StoreIdentity, identity: StoreIdentity) -> TargetExistsError:
        if (finished.shape, finished.dtype) == (identity.shape, identity.dtype) and finished.chunks != identity.chunks:
            return TargetExistsError(
                said(
                    f"{self.name} holds a finished store of this shape and dtype in chunks {finished.chunks}, but "
                    f"the array stored now has chunks {identity.chunks}; ",
                    OVERWRITE,
                    " to write it again in the new chunks, or choose another target",
                )
            )
        return TargetExistsError(
            said(
                f"{self.name} holds a finished store of another computation "
                f"({'; '.join(finished.differences(identity))}); ",
                OVERWRITE,
                " to replace it, or choose another target",
            )
        )

    def write_error(self, exc: BaseException, doing: str) -> TargetWriteError:
        return write_error(self.name, exc, doing, self._after_failure)

    # What to do after a failed write, beyond fixing its cause.
    _after_failure = "run store again: it resumes where it stopped"


def write_error(
    target_name: str, exc: BaseException, doing: str, after: str = Target._after_failure
) -> TargetWriteError:
    number = getattr(exc, "errno", None)
    if number is None:
        # HDF5 reports the system error inside its message text, often as a RuntimeError.
        found = HDF5_ERRNO.search(str(exc))
        number = int(found.group(1)) if found else None
    reason = os.strerror(number) if number else first_line(exc)
    return TargetWriteError(
        number,
        said(
            f"{target_name}: could not {doing} ({reason}); blocks recorded as done are kept: free space or fix "
            "permissions, then ",
            after,
        ),
    )


def in_process_scheduler() -> bool:
    """Whether tasks run in this process (threads or synchronous), where HDF5 shares one open file."""
    return scheduler_kind() in ("threads", "sync")
