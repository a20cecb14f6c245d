"""Reading boxes out of a contiguous array stored at a byte offset in a file.

Shared by .npy files and contiguous HDF5 datasets. Full slabs (every axis
after the slowest one whole) are one ``preadv`` into a fresh buffer: no memory
map outlives the read, so a worker's RSS holds only the chunks it works on.
Other boxes (a column of a row-major array, say) are copied out of memory maps
of at most ``_MAP_WINDOW`` bytes at a time, each unmapped before the next:
mapped file pages count in a process's resident memory, and a box's span can
be the whole file.
"""

from __future__ import annotations

import math
import mmap
import os

import numpy as np

from daskstream.files import open_regular
from daskstream.sources.base import Region, to_native

# Linux transfers at most this many bytes per read call.
_MAX_READ = 0x7FFFF000
# The most bytes of a file mapped at once to copy a strided box out of it.
_MAP_WINDOW = 8 * 2**20


def read_contiguous_box(
    path: str,
    offset: int,
    file_dtype: np.dtype,
    shape: tuple[int, ...],
    fortran_order: bool,
    box: Region,
) -> np.ndarray:
    """Read ``box`` of an array of ``shape`` stored contiguously at ``offset`` of ``path``."""
    if fortran_order:
        # An F-ordered array is the C-ordered transpose: read that and transpose back.
        block = read_contiguous_box(path, offset, file_dtype, shape[::-1], False, box[::-1])
        return block.T
    itemsize = file_dtype.itemsize
    # One contiguous byte range when, after the first axis spanning more than one index, all axes are whole.
    spanning = next((a for a, s in enumerate(box) if s.stop - s.start > 1), len(shape))
    contiguous = all(box[a] == slice(0, shape[a]) for a in range(spanning + 1, len(shape)))
    strides = _c_strides(shape, itemsize)
    start = offset + sum(s.start * st for s, st in zip(box, strides))
    out_shape = tuple(s.stop - s.start for s in box)
    # The file may have been replaced since it was opened: a pipe in its place must not block the task.
    with open_regular(path) as f:
        if contiguous:
            out = np.empty(out_shape, dtype=file_dtype)
            # A byte view: memoryview refuses datetime, timedelta and some record dtypes. .data is the
            # array's memoryview (numpy's stubs give ndarray the buffer protocol on Python 3.12+ only).
            pread_into(f.fileno(), out.reshape(-1).view(np.uint8).data, start)
            return to_native(out)
        return _copy_from_map(f.fileno(), start, offset, file_dtype, shape, box, strides)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(math.prod(shape[a + 1 :]) * itemsize for a in range(len(shape)))


def pread_into(fd: int, view: memoryview, position: int) -> None:
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done : done + _MAX_READ]], position + done)
        if n == 0:
            raise EOFError(f"file ended {total - done} bytes before the data it declares")
        done += n


def _copy_from_map(
    fd: int,
    start: int,
    offset: int,
    file_dtype: np.dtype,
    shape: tuple[int, ...],
    box: Region,
    strides: tuple[int, ...],
) -> np.ndarray:
    out = np.empty(tuple(s.stop - s.start for s in box), dtype=file_dtype)
    _copy_windows(fd, offset, file_dtype, box, strides, out)
    return to_native(out)


def _copy_windows(
    fd: int, offset: int, file_dtype: np.dtype, box: Region, strides: tuple[int, ...], out: np.ndarray
) -> None:
    """Copy ``box`` into ``out`` through maps of at most ``_MAP_WINDOW`` bytes, splitting the slowest axes."""
    first = offset + sum(s.start * st for s, st in zip(box, strides))
    last = offset + sum((s.stop - 1) * st for s, st in zip(box, strides)) + file_dtype.itemsize
    if last - first <= _MAP_WINDOW or len(box) == 1:
        _copy_span(fd, first, last, file_dtype, box, strides, out)
        return
    head = box[0]
    rows = max(1, _MAP_WINDOW // strides[0])
    for start in range(head.start, head.stop, rows):
        stop = min(start + rows, head.stop)
        part = (slice(start, stop), *box[1:])
        target = out[start - head.start : stop - head.start]
        if rows == 1 and stop - start == 1:
            # One index of the slowest axis already spans more than a window: split the next axis.
            _copy_windows(fd, offset + start * strides[0], file_dtype, box[1:], strides[1:], target[0])
        else:
            _copy_windows(fd, offset, file_dtype, part, strides, target)


def _copy_span(
    fd: int, first: int, last: int, file_dtype: np.dtype, box: Region, strides: tuple[int, ...], out: np.ndarray
) -> None:
    # Map only the span from the box's first to last byte, aligned down to a page.
    page_start = first - first % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, last - page_start, access=mmap.ACCESS_READ, offset=page_start) as mapped:
        view = np.ndarray(
            shape=tuple(s.stop - s.start for s in box),
            dtype=file_dtype,
            buffer=mapped,
            offset=first - page_start,
            strides=strides,
        )
        out[...] = view
        del view  # release the buffer before the map closes
