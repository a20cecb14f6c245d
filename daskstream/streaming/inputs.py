"""The arrays a stream reads: one :class:`_Input` per array, whatever form it was given in.

A path or a :class:`~daskstream.sources.Source` is read from its source; a
dask array from :func:`daskstream.open` is read from the source it was opened
on, without dask in the loop; any other dask array is computed slice by
slice; a numpy array (labels, say) is copied out of memory.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import numpy as np

from daskstream.errors import InvalidArgumentError, SourceChangedError
from daskstream.graph.layers import opened_source
from daskstream.sources import Source, open_source
from daskstream.sources.base import REREAD_ADVICE

_STREAM_ADVICE = (
    "make the stream again over the new data (ds.stream, or StreamDataset and its DataLoader) and start the "
    "epoch again; batches already yielded this epoch came from the old data"
)


class _Input:
    """One array to stream: read directly from its Source, or computed from a dask array slice by slice."""

    def __init__(self, x: Any) -> None:
        self.source: Source | None = None
        self.array: Any = None
        if isinstance(x, Source):
            self.source = x
        elif hasattr(x, "__dask_graph__"):
            # An array straight from daskstream.open is read from its Source, without dask in the loop.
            self.source = opened_source(x)
            if self.source is None:
                self.array = x
        elif isinstance(x, (str, os.PathLike)):
            self.source = open_source(x)
        elif isinstance(x, np.ndarray):
            # Labels and other small arrays already in memory (a class index per image, say).
            self.array = x
        else:
            raise InvalidArgumentError(
                "stream takes paths, Sources, dask arrays (from daskstream.open) or numpy arrays, "
                f"not {type(x).__name__}"
            )

        held = self.source if self.source is not None else self.array
        self.shape: tuple[int, ...] = tuple(held.shape)
        self.dtype = np.dtype(held.dtype)
        if self.source is not None:
            self.name = self.source.name
        elif isinstance(self.array, np.ndarray):
            self.name = f"numpy array {self.shape} {self.dtype}"
        else:
            self.name = f"dask array {self.array.name}"

    @property
    def identity(self) -> str:
        """What names this data in a saved state: the source's token (path, size, modification time), the
        dask array's name, or a digest of the numpy array's bytes."""
        if self.source is not None:
            return str(self.source.token)
        if isinstance(self.array, np.ndarray):
            digest = hashlib.sha256(np.ascontiguousarray(self.array).view(np.uint8).data).hexdigest()[:16]
            return f"numpy {self.shape} {self.dtype} {digest}"
        return str(self.array.name)

    def unit(self, axis: int) -> int:
        """Rows along ``axis`` that one storage chunk spans (1 for contiguous data or dask arrays)."""
        if self.source is None or self.source.storage_chunks is None:
            return 1
        return max(1, min(self.source.storage_chunks[axis], self.shape[axis]))

    def item_bytes(self, axis: int) -> int:
        return math.prod(n for a, n in enumerate(self.shape) if a != axis) * self.dtype.itemsize

    def read(self, axis: int, start: int, stop: int) -> np.ndarray:
        index = (slice(None),) * axis + (slice(start, stop),)
        try:
            if self.source is not None:
                return self.source.read(index)
            if isinstance(self.array, np.ndarray):
                return np.array(self.array[index])  # a copy: batches never alias the caller's array
            return np.asarray(self.array[index].compute(scheduler="sync"))
        except SourceChangedError as exc:
            # Advice for a training loop rather than for a computation.
            message = str(exc).replace("this computation", "this epoch").replace(REREAD_ADVICE, _STREAM_ADVICE)
            raise type(exc)(message) from None
