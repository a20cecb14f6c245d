"""The path every command that computes takes: its input opened in its session, computed with a bar
and a meter, and its rate set beside the codec's limit once the session is over.

``reduce``, ``describe``, ``store`` and ``convert`` each say only what they
compute and how they print it; opening inside the session (so chunks are
planned for its workers), refusing ``--out`` onto what is read, timing,
counting bytes and finding the limit are here, once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import daskstream as ds
from daskstream.cli.options import WhereItRuns, axes_named, url_options
from daskstream.cli.output import RateBesideLimit, check_out, out_format
from daskstream.compute.limits import CodecLimit, codec_limit
from daskstream.graph.layers import opened_source, places_read
from daskstream.runtime.metering import ReadMeter
from daskstream.runtime.session import Session


@dataclass
class Opened:
    """A command's input, opened in its session: the session, the array, and the places it reads."""

    session: Session
    array: Any
    reads: list[tuple[str, str]]
    quiet: bool

    def axes(self, axis: tuple[str, ...], name: str) -> tuple[int, ...]:
        """``--axis`` values as axis numbers: names by the dimensions the input names (a NetCDF variable's, a
        Zarr array's ``dimension_names``, an HDF5 dataset's scales)."""
        source = opened_source(self.array)
        return axes_named(axis, None if source is None else source.dims, self.array.ndim, name)

    def bar_limit(self) -> CodecLimit | None:
        """The codec's limit the progress bar shows the rate beside, where one is remembered (never measured
        here: measuring would delay the work the user asked for)."""
        if self.quiet:
            return None
        return codec_limit(self.array, threads=self.session.resources().threads, measure=False)


@dataclass
class Measured:
    """What computing took: the value, the seconds, the bytes the tasks read, and the threads that read them."""

    value: Any
    seconds: float
    bytes_read: int | None
    threads: int
    array: Any = field(repr=False)

    def rate(self) -> RateBesideLimit:
        """The bytes read a second beside the source codec's decode limit (measured now if never before).

        Asked once the session is over, so a measurement never runs beside the
        session's workers.
        """
        return RateBesideLimit.of(
            self.bytes_read or 0, self.seconds, lambda: codec_limit(self.array, threads=self.threads)
        )


@contextlib.contextmanager
def opened_in_session(
    path: str,
    where: WhereItRuns,
    *,
    dataset: str | None,
    storage_options: dict[str, Any],
    out: str | None = None,
    out_names: Sequence[str] = (),
    chunks: Any = "auto",
    prepare: Callable[[Any], Any] | None = None,
) -> Iterator[Opened]:
    """Open ``path`` within the command's session (``where`` it runs) and check ``--out`` against what it reads.

    A suffix ``--out`` cannot write, or one file for several arrays, is
    refused before anything is opened. ``prepare`` (for example a rechunk)
    is applied to the array as opened.
    """
    if out is not None:
        out_format(out, list(out_names))
    with where.session() as session:
        # Opened inside the session, so the chunks are planned for its workers.
        array = ds.open(path, dataset=dataset, chunks=chunks, storage_options=url_options(storage_options, path))
        if prepare is not None:
            array = prepare(array)
        reads = places_read(array)
        if out is not None:
            # Onto the source, or over a folder of the user's: refused before a byte is read.
            check_out(out, list(out_names), reads)
        yield Opened(session, array, reads, where.quiet)


def measured(opened: Opened, compute: Callable[[], Any]) -> Measured:
    """Run ``compute``, timing it and counting the bytes its tasks read in whichever process read them."""
    start = time.perf_counter()
    with ReadMeter(opened.session) as meter:
        value = compute()
    seconds = time.perf_counter() - start
    return Measured(value, seconds, meter.bytes_read, opened.session.resources().threads, opened.array)


__all__ = ["Measured", "Opened", "measured", "opened_in_session"]
