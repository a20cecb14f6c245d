"""Chunks that fit how labelled data is analysed: given by dimension name, and whole calendar periods along time.

xarray users give chunks by dimension (``chunks={"time": 365}``), and their
analyses group, resample and roll along a time coordinate. Here the file's
time coordinates are decoded once, where each year and month starts is
found, and the planner's chunks along those dimensions are moved onto those
starts (:func:`daskstream.planning.periods.calendar_chunks`): whole years
where a year fits the budget, else whole months.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from daskstream.advice import keyword, said
from daskstream.errors import ChunkSplitWarning, InvalidChunksError
from daskstream.graph.reads import ChunksSpec
from daskstream.graph.rewrites import REREAD_CHUNK_BYTES
from daskstream.opening import as_dask_array
from daskstream.planning.periods import calendar_chunks
from daskstream.planning.plan import per_task_cap
from daskstream.planning.settings import PlanSettings, analysis_working_set_factor
from daskstream.sources import Source

#: Float64 copies of its block a task of a calendar analysis holds, for the chunks along time: flox's
#: monthly standard deviation holds 8.4 float32 blocks beside its input, its mean 6, a rolling window's
#: overlap and counts about as many (measured with tracemalloc on a 1-degree daily field); the planner's
#: general assumption (PlanSettings.float64_copies, 3) would let a tight budget be passed by a third.
CALENDAR_FLOAT64_COPIES = 5

# A time coordinate longer than this is not decoded to find its periods (its chunks stay the planner's).
LARGEST_CALENDAR = 10_000_000


def by_axis(chunks: ChunksSpec, dims: tuple[str, ...]) -> ChunksSpec:
    """``chunks`` with dimension names replaced by axes (``{"time": 365}`` to ``{0: 365}``), as xarray takes them.

    >>> by_axis({"time": 365, "lat": -1}, ("time", "lat", "lon"))
    {0: 365, 1: -1}
    >>> by_axis({"time": 10}, ("lat", "lon"))
    {}

    A name that is no dimension of any variable is refused by the caller (:func:`check_names`); a variable
    without that dimension keeps its planned chunks along the others, as in xarray.
    """
    if not isinstance(chunks, Mapping) or not any(isinstance(key, str) for key in chunks):
        return chunks
    axes: dict[Any, Any] = {}
    for key, size in chunks.items():
        if isinstance(key, str):
            if key in dims:
                axes[dims.index(key)] = size
        else:
            axes[key] = size
    return axes


def check_names(chunks: ChunksSpec, dims: set[str], where: str) -> None:
    """Refuse chunks named by a dimension the file does not have, naming those it has."""
    if not isinstance(chunks, Mapping):
        return
    unknown = sorted(str(key) for key in chunks if isinstance(key, str) and key not in dims)
    if unknown:
        raise InvalidChunksError(
            said(
                keyword("chunks", dict(chunks)),
                f": {where} has no dimension {unknown[0]!r}; its dimensions are {', '.join(sorted(dims)) or 'none'}",
            )
        )


def calendar_starts(xr: Any, variables: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """For each dimension coordinate holding increasing dates: where its years start, and where its months do.

    ``variables``: the file's variables as read, undecoded. A coordinate that
    does not decode as dates (or is not increasing) has no periods.
    """
    found = {}
    for name, raw in variables.items():
        units = str(raw.attrs.get("units", ""))
        if raw.dims != (name,) or " since " not in units or not 2 < raw.shape[0] <= LARGEST_CALENDAR:
            continue
        try:
            dates = gregorian_dates(raw)
            if dates is None:
                dates = np.asarray(xr.conventions.decode_cf_variable(name, raw, decode_times=True).values)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError):
            continue  # (the decoders say what is wrong when the dataset is decoded)
        starts = period_starts(dates)
        if starts is not None:
            found[name] = starts
    return found


#: CF time units numpy counts in, and the calendars whose dates are numpy's (proleptic Gregorian; the mixed
#: "standard" calendar only from its reform on).
_NUMPY_UNITS = {"days": "D", "hours": "h", "minutes": "m", "seconds": "s", "milliseconds": "ms", "microseconds": "us"}
_GREGORIAN = frozenset({"proleptic_gregorian", "standard", "gregorian"})
_REFORM = np.datetime64("1582-10-15")
_PLAIN_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?$")


def gregorian_dates(raw: Any) -> np.ndarray | None:
    """A time coordinate's whole-number offsets ``units since`` a date as numpy dates, where numpy's dates are
    the calendar's and no value is missing; else ``None`` (xarray's decoders then decode it).

    Where periods start needs the dates once, not their decoding as the dataset's index: xarray decodes a
    long coordinate date by date (49 s for 4.2 million hours here), numpy adds the offsets at once.

    >>> import xarray as xr
    >>> gregorian_dates(xr.Variable(("time",), np.arange(3), {"units": "hours since 1990-01-01"}))
    array(['1990-01-01T00', '1990-01-01T01', '1990-01-01T02'],
          dtype='datetime64[h]')
    """
    step, _, since = str(raw.attrs.get("units", "")).strip().partition(" since ")
    unit = _NUMPY_UNITS.get(step.strip().lower())
    calendar = str(raw.attrs.get("calendar", "standard")).lower()
    if unit is None or calendar not in _GREGORIAN or "_FillValue" in raw.attrs or "missing_value" in raw.attrs:
        return None
    values = np.asarray(raw.values)
    if values.dtype.kind not in "iu" or "scale_factor" in raw.attrs or "add_offset" in raw.attrs:
        return None
    if not _PLAIN_DATE.match(since.strip()):
        return None  # a time zone, or a date numpy does not read: xarray's decoders then
    start = np.datetime64(since.strip().replace(" ", "T")).astype(f"datetime64[{unit}]")
    if calendar != "proleptic_gregorian" and start < _REFORM:
        return None
    return start + values.astype(np.int64).astype(f"timedelta64[{unit}]")


def period_starts(dates: np.ndarray) -> tuple[tuple[int, ...], ...] | None:
    """``(year starts, month starts)`` of increasing ``dates`` (numpy datetimes or cftime dates), else ``None``.

    >>> days = np.arange("2000-12-30", "2001-02-02", dtype="datetime64[D]")
    >>> period_starts(days)
    ((2,), (2, 33))
    """
    if dates.dtype.kind == "M":
        if np.isnat(dates).any() or not bool(np.all(dates[1:] > dates[:-1])):
            return None
        years = dates.astype("datetime64[Y]").astype(np.int64)
        months = dates.astype("datetime64[M]").astype(np.int64)
    elif dates.dtype.kind == "O" and all(hasattr(d, "year") and hasattr(d, "month") for d in dates):
        try:
            if not all(a < b for a, b in itertools.pairwise(dates)):
                return None
        except TypeError:  # dates of different calendars
            return None
        years = np.array([d.year for d in dates], dtype=np.int64)
        months = years * 12 + np.array([d.month for d in dates], dtype=np.int64)
    else:
        return None
    return tuple(tuple(int(i) for i in np.flatnonzero(p[1:] != p[:-1]) + 1) for p in (years, months))


def calendar_planned(
    source: Source, settings: PlanSettings, dims: tuple[str, ...], periods: Mapping[str, tuple[tuple[int, ...], ...]]
) -> ChunksSpec:
    """The planner's chunks for ``source``, moved onto whole periods along the dimensions that have them;
    ``"auto"`` when none moves.

    A period's chunk is held to the bounds the planner works to: a thread's
    share of the budget over the working set, and a share of the array that
    keeps every thread busy.
    """
    if not any(dim in periods for dim in dims) or source.ndim != len(dims):
        return "auto"
    plan = source.plan(settings)
    if plan.span is not None:
        # Chunks at the most a task may hold outnumber what a graph may: tasks stream spans of them, whose
        # groups (months, years) flox reduces piece by piece (daskstream.compute.streaming.span_groups).
        return "auto"
    factor = max(plan.working_set_factor, analysis_working_set_factor(source.dtype, CALENDAR_FLOAT64_COPIES))
    cap = min(
        per_task_cap(plan.memory_budget, plan.threads, factor, plan.decode_bytes),
        source.nbytes // max(1, plan.min_tasks),
    )
    dask_chunks = list(plan.dask_chunks)
    moved = False
    for axis, dim in enumerate(dims):
        # Contiguous data is cut into slabs along its first axis only: other cuts would read strided bytes.
        if dim not in periods or (source.storage_chunks is None and axis != 0):
            continue
        storage_rows = source.storage_chunks[axis] if source.storage_chunks else None
        split = _years_split(source, plan.chunks, axis, cap, periods[dim])
        found: tuple[int, ...] | None
        if split is not None:
            (across, pieces), found = split
            dask_chunks[across] = tuple(_pieces(source.shape[across], pieces))
        else:
            others = math.prod(c for a, c in enumerate(plan.chunks) if a != axis)
            found = calendar_chunks(
                source.shape[axis], row_bytes=others * source.dtype.itemsize, cap_bytes=cap,
                planned_rows=plan.chunks[axis], period_starts=periods[dim], storage_rows=storage_rows,
            )  # fmt: skip
        if found is not None and found != dask_chunks[axis]:
            dask_chunks[axis], moved = found, True
    return tuple(dask_chunks) if moved else "auto"


def calendar_array(
    source: Source, settings: PlanSettings, dims: tuple[str, ...], periods: Mapping[str, tuple[tuple[int, ...], ...]]
) -> Any:
    """``source`` as a dask array in :func:`calendar_planned`'s chunks.

    Cutting a grid's small storage chunks to keep whole years is the plan's
    own choice, not a user's chunks to warn about.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChunkSplitWarning)
        return as_dask_array(source, settings, chunks=calendar_planned(source, settings, dims, periods))


def _years_split(
    source: Source, planned: tuple[int, ...], axis: int, cap: int, starts: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, int], tuple[int, ...]] | None:
    """Whole years along ``axis`` with the next axis cut into the fewest pieces that let a year fit ``cap``:
    ``((that axis, its piece), the years' chunks)``, or ``None``.

    A monthly climatology over chunks of whole years reduces each chunk to its
    twelve months and an anomaly from it runs a task per chunk; over chunks of
    months its groups fall in separate chunks and the anomaly runs a task per
    day (ten times slower, and dask holds those days' blocks between passes).
    So under a budget a year of the whole grid does not fit, the grid is cut
    rather than the year: along the first other axis, where storage chunks
    are small enough to read again in parts (or the cut falls between them).
    """
    others = [a for a in range(source.ndim) if a != axis and source.shape[a] > 1]
    if not others or source.storage_chunks is None:
        return None
    across = others[0]
    rest = math.prod(c for a, c in enumerate(planned) if a not in (axis, across))
    storage = source.storage_chunks
    cheap = source.storage_chunk_bytes() <= REREAD_CHUNK_BYTES
    for count in range(1, source.shape[across] + 1):
        piece = -(-source.shape[across] // count)
        if not cheap and piece % storage[across] and piece < source.shape[across]:
            continue
        found = calendar_chunks(
            source.shape[axis], row_bytes=piece * rest * source.dtype.itemsize, cap_bytes=cap,
            planned_rows=planned[axis], period_starts=starts[:1], storage_rows=storage[axis],
        )  # fmt: skip
        if found is not None:
            return ((across, piece), found) if count > 1 else None
    return None


def _pieces(length: int, piece: int) -> list[int]:
    return [min(piece, length - start) for start in range(0, length, piece)]


__all__ = ["by_axis", "calendar_array", "calendar_planned", "calendar_starts", "check_names", "period_starts"]
