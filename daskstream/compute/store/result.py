"""What a store did: blocks written, blocks an earlier run had written, the time it took.

A store says this the way the command does ("30 of 115 blocks written, 85
done before"): on the ``daskstream.store`` logger at INFO, and in the repr of
the array it returns (:class:`StoredArray`, a dask array reading the target,
whose ``result`` is the :class:`StoreResult`).
"""

from __future__ import annotations

import html
import logging
import time
from dataclasses import dataclass
from typing import Any

import dask.array as da

from daskstream.compute.store.target import ProgressCallback

#: Where every store logs what it did, once finished.
logger = logging.getLogger("daskstream.store")


@dataclass(frozen=True)
class StoreResult:
    """What one store did to its target.

    Attributes
    ----------
    target
        The target as given (``"out.zarr"``, ``"out.h5::/data"``, a URL).
    blocks
        Blocks of the array, which is the target's chunks (or shards).
    written
        Blocks this store wrote.
    done_before
        Blocks an earlier, interrupted store of the same computation had
        written, which this one resumed from; all of them when the target
        already held the whole computation.
    seconds
        How long the store took, start to finish.

    Examples
    --------
    >>> StoreResult("out.zarr", blocks=115, written=30, done_before=85, seconds=1.5)
    out.zarr: 30 of 115 blocks written, 85 done before, 1.50 s
    >>> StoreResult("out.zarr", blocks=115, written=0, done_before=115, seconds=0.1).already_complete
    True
    """

    target: str
    blocks: int
    written: int
    done_before: int
    seconds: float

    @property
    def resumed(self) -> bool:
        """Whether an earlier run had written some blocks, and this one wrote the rest."""
        return self.done_before > 0 and self.written > 0

    @property
    def already_complete(self) -> bool:
        """Whether the target already held the whole computation, so nothing was written."""
        return self.written == 0 and self.blocks > 0

    def __str__(self) -> str:
        if self.already_complete:
            return f"{self.target}: already complete: {self.blocks} blocks; nothing written"
        before = f", {self.done_before} done before" if self.done_before else ""
        return f"{self.target}: {self.written} of {self.blocks} blocks written{before}, {self.seconds:.2f} s"

    __repr__ = __str__


class StoreTally:
    """Counts a store's progress reports, passing each on to ``report`` (a bar, the caller's callable).

    The first report a target makes says how many blocks were done before
    the store began; the last, how many there are.
    """

    def __init__(self, report: ProgressCallback | None) -> None:
        self.report = report
        # A bar it passes on to: the store then shows a rechunk's first pass with a bar of its own too.
        self.shows = bool(getattr(report, "shows", False))
        self.total = 0
        self.done_before: int | None = None
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.done_before is None:
            self.done_before = done
        self.total = total
        if self.report is not None:
            self.report(done, total)

    def result(self, target: Any) -> StoreResult:
        """What the store did, once it has finished."""
        before = self.done_before or 0
        return StoreResult(
            target=str(target),
            blocks=self.total,
            written=self.total - before,
            done_before=before,
            seconds=time.perf_counter() - self.started,
        )


class StoredArray(da.Array):
    """The array a store wrote, read back from its target, with what the store did as ``result``.

    A dask array in every other way: whatever is computed from it is a plain
    ``dask.array.Array``. Its repr leads with the store's
    :class:`StoreResult`.
    """

    result: StoreResult

    @classmethod
    def of(cls, x: da.Array, result: StoreResult) -> StoredArray:
        stored = cls(x.dask, x.name, x.chunks, meta=x._meta)
        stored.result = result
        return stored

    def __repr__(self) -> str:
        return f"stored {self.result}\n{super().__repr__()}"

    def _repr_html_(self) -> str:
        return f"<p><b>stored</b> {html.escape(str(self.result))}</p>{super()._repr_html_()}"


def log_result(result: StoreResult) -> None:
    logger.info("store %s", result)
