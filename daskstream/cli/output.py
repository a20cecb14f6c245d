"""What the computing commands print and write: numbers a person reads, files for arrays.

A scalar result is printed whole; an array result is summarised in a line
(its shape, dtype and range) and written in full with ``--out FILE``: a
``.npy`` file (one array), a ``.csv`` table (a column per array, one row per
element, with the element's index), a Zarr store (``.zarr``) or an HDF5 file
(``.h5``, ``.hdf5``), with one array per name. ``--out`` replaces a file at
FILE, as a shell's ``>`` does, but never a file or folder the computation
reads, never a folder other than a Zarr result it wrote itself, and only once
the new file is whole (see :mod:`daskstream.safe_writes`).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from daskstream.compute.description import format_number, summarised
from daskstream.compute.limits import LIMIT_SHOWN_FROM_BYTES, CodecLimit
from daskstream.errors import DaskstreamError, InvalidArgumentError
from daskstream.files import open_regular
from daskstream.runtime.stopping import raise_if_stopped
from daskstream.safe_writes import check_replaceable, refuse_onto_reads, written_whole
from daskstream.sources.hdf5.filters import import_h5py
from daskstream.sources.objects.places import is_url

OUT_SUFFIXES = (".npy", ".csv", ".zarr", ".h5", ".hdf5")
# The attribute of a Zarr group --out wrote, listing its arrays: only such a group is ever replaced.
RESULT_MARK = "daskstream_result"
_MAX_MARK_BYTES = 1 << 20
# Array results up to this many values are printed as a table too; larger ones are summarised.
SHOWN_VALUES = 20


def out_format(path: str, arrays: Sequence[str] | None = None) -> str:
    """The format ``--out PATH`` names by its suffix, or a clear error listing those there are.

    With the names of the ``arrays`` a result will be, a ``.npy`` file (which
    holds one) is refused for more than one, before anything is computed.
    """
    suffix = pathlib.PurePath(path).suffix.lower()
    if suffix not in OUT_SUFFIXES:
        raise InvalidArgumentError(
            f"--out {path}: write the result as {', '.join(OUT_SUFFIXES)} (chosen by the file's suffix)"
        )
    if suffix == ".npy" and arrays is not None and len(arrays) != 1:
        raise InvalidArgumentError(
            f"--out {path}: a .npy file holds one array and this result is {len(arrays)} "
            f"({', '.join(arrays)}): write .csv, .zarr or .h5 instead"
        )
    return "h5" if suffix == ".hdf5" else suffix[1:]


def check_out(path: str, arrays: Sequence[str], reads: Sequence[tuple[str, str]] = ()) -> str:
    """Refuse ``--out PATH`` before anything is computed when writing there could lose data; its format.

    ``reads`` are the local places the computation reads (``(place, source
    name)``, :func:`daskstream.graph.layers.places_read`): PATH is none of
    them, under any spelling, nor inside or around one. A file replaces a file
    (as a shell's ``>``), never a folder; a Zarr result replaces only a Zarr
    result ``--out`` wrote before.
    """
    kind = out_format(path, arrays)
    option = f"--out {path}"
    if is_url(path) or path.startswith("file://"):
        raise InvalidArgumentError(f"{option}: --out writes a local file; give a path, and copy it from there")
    refuse_onto_reads(path, reads, option=option)
    check_replaceable(path, folder=kind == "zarr", is_own=_own_zarr_result, option=option)
    return kind


def write_arrays(path: str, arrays: Mapping[str, Any], reads: Sequence[tuple[str, str]] = ()) -> str:
    """Write ``arrays`` (name: array) to ``path`` in the format its suffix names; what was written, in words.

    Checked again as :func:`check_out` does, written under a temporary name
    beside ``path`` and renamed into place whole: a failed or interrupted
    write leaves what was at ``path`` as it was.
    """
    kind = check_out(path, list(arrays), reads)
    values = {name: np.asarray(value) for name, value in arrays.items()}
    with written_whole(path, folder=kind == "zarr", is_own=_own_zarr_result, option=f"--out {path}") as temporary:
        target = pathlib.Path(temporary)
        if kind == "npy":
            (value,) = values.values()
            with target.open("wb") as f:  # np.save(path) would add .npy to the temporary name
                np.save(f, value)
        elif kind == "csv":
            _write_csv(target, values, path)
        elif kind == "zarr":
            import zarr

            group = zarr.open_group(str(target), mode="w")
            for name, value in values.items():
                group.create_array(name, data=value)
            group.attrs[RESULT_MARK] = sorted(values)
        else:
            with import_h5py().File(target, "w") as f:
                for name, value in values.items():
                    f.create_dataset(name, data=value)
        # A stop asked while writing is taken before the result replaces anything: nothing was written.
        raise_if_stopped()
    shapes = ", ".join(f"{name} {value.shape} {value.dtype}" for name, value in values.items())
    return f"wrote {shapes} to {path}"


def _own_zarr_result(folder: str) -> bool:
    """Whether ``folder`` is a Zarr group ``--out`` wrote, holding nothing but the arrays it wrote there.

    A folder the user has put anything else in, or one ``--out`` did not
    write, is never replaced.
    """
    try:
        with open_regular(os.path.join(folder, "zarr.json")) as f:
            metadata = json.loads(f.read(_MAX_MARK_BYTES))
        written = metadata["attributes"][RESULT_MARK]
        entries = set(os.listdir(folder))
    except (OSError, ValueError, KeyError, TypeError, DaskstreamError):
        return False
    if metadata.get("node_type") != "group" or not isinstance(written, list):
        return False
    return entries <= {"zarr.json", *map(str, written)}


def _write_csv(target: pathlib.Path, values: dict[str, np.ndarray], path: str) -> None:
    """One row per element: its index along each axis, then each array's value there (same shapes only)."""
    shapes = {value.shape for value in values.values()}
    if len(shapes) != 1:
        described = ", ".join(f"{name} {value.shape}" for name, value in values.items())
        raise InvalidArgumentError(
            f"--out {path}: a .csv table needs arrays of one shape, and these differ ({described}): "
            "write .zarr or .h5 instead"
        )
    (shape,) = shapes
    with target.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(f"axis {a}" for a in range(len(shape))), *values])
        for index in itertools.product(*(range(n) for n in shape)):
            writer.writerow([*index, *(_cell(value[index]) for value in values.values())])


def _cell(value: Any) -> str:
    # repr of a Python float is the shortest text that reads back as the same number.
    item = np.asarray(value)[()].item()
    return repr(item) if isinstance(item, float) else str(item)


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns aligned under ``header``: text to the left, numbers to the right.

    >>> print("\\n".join(table_lines(["q", "value"], [["0.25", "1.5"], ["0.5", "10"]])))
       q  value
    0.25    1.5
     0.5     10
    """
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(f"{cell:>{width}}" for cell, width in zip(line, widths)).rstrip() for line in [header, *rows]]


def result_lines(value: Any, *, name: str, written: bool = False) -> list[str]:
    """An array result as a person reads it: a summary line, and its values as a table when there are few.

    Of more values, a pointer to ``--out``, unless they were ``written`` with it.
    """
    array = np.asarray(value)
    if array.ndim == 0:
        return [format_exact(array)]
    lines = [summarised(array)]
    if array.size <= SHOWN_VALUES:
        header = [*(f"axis {a}" for a in range(array.ndim)), name]
        rows = [[*map(str, index), format_exact(array[index])] for index in np.ndindex(*array.shape)]
        lines += table_lines(header, rows)
    elif not written:
        lines.append(f"({array.size} values: write them all with --out FILE, as {', '.join(OUT_SUFFIXES)})")
    return lines


def histogram_lines(counts: Any, edges: Any) -> list[str]:
    """A histogram as a table of bins: the low and high edge, the count (the last bin holds its high edge)."""
    counts, edges = np.asarray(counts), np.asarray(edges)
    rows = [[format_number(edges[i]), format_number(edges[i + 1]), str(int(counts[i]))] for i in range(counts.size)]
    return table_lines(["low", "high", "count"], rows)


def format_exact(value: Any) -> str:
    """A scalar result in full: the shortest text that reads back as the same number (numpy's repr rules).

    >>> format_exact(np.float32(0.1)), format_exact(np.float64(1) / 3), format_exact(np.int64(7))
    ('0.1', '0.3333333333333333', '7')
    """
    return str(np.asarray(value)[()])


@dataclasses.dataclass(frozen=True)
class RateBesideLimit:
    """A command's rate (bytes a second read or written) and the codec's limit it is set beside, where enough
    was moved to say more about the data than about starting (``None`` for each where there is nothing to say)."""

    rate: float | None = None
    limit: CodecLimit | None = None

    @classmethod
    def of(cls, nbytes: int, seconds: float, find_limit: Callable[[], CodecLimit | None]) -> RateBesideLimit:
        """The rate of ``nbytes`` in ``seconds``, and the limit ``find_limit`` gives (asked only when shown)."""
        if nbytes < LIMIT_SHOWN_FROM_BYTES:
            return cls()
        return cls(nbytes / max(seconds, 1e-9), find_limit())

    def text(self) -> str:
        """``" at 0.24 GB/s, 57% of zstd 3's encode limit here"``, or ``""``."""
        return "" if self.limit is None or self.rate is None else f" at {self.limit.beside(self.rate)}"

    def json(self) -> dict[str, Any]:
        """``GBps`` and ``limit`` (the limit's facts and the rate's share of it) for ``--json``."""
        limit = (
            None
            if self.limit is None or self.rate is None
            else {**self.limit.to_dict(), "share": self.limit.share(self.rate)}
        )
        return {"GBps": None if self.rate is None else self.rate / 1e9, "limit": limit}


__all__ = [
    "OUT_SUFFIXES",
    "RateBesideLimit",
    "check_out",
    "format_exact",
    "histogram_lines",
    "out_format",
    "result_lines",
    "table_lines",
    "write_arrays",
]
