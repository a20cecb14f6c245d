"""Chunks along a calendar axis that hold whole periods: years where they fit, else months.

Climate analyses group, resample and roll along time: a monthly climatology
(``groupby("time.month")``) reduces each chunk to its twelve months when every
chunk holds whole years, and xarray's flox then combines twelve-row partials;
chunks of a few weeks make it gather each month from every chunk instead, and
an anomaly from that climatology runs a task per day. ``resample`` reduces a
period inside one task when no period straddles a chunk boundary, and a rolling
window borrows from one neighbour at most when chunks are longer than it.

:func:`calendar_chunks` is pure: it takes where the periods start (indices
along the axis, found from the decoded coordinate by the labelled layer) and
the byte limits the chunk planner works to, and returns chunk lengths, or
``None`` when no period fits (the planner's own chunks stand).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def calendar_chunks(
    length: int,
    *,
    row_bytes: int,
    cap_bytes: int,
    planned_rows: int,
    period_starts: Sequence[Sequence[int]],
    storage_rows: int | None = None,
) -> tuple[int, ...] | None:
    """Chunk lengths along an axis of ``length`` rows that start where periods start.

    Parameters
    ----------
    length
        Rows along the axis.
    row_bytes
        Bytes of one row of a chunk (the other axes as planned).
    cap_bytes
        The most a chunk may hold (the chunk planner's budget and parallelism bounds).
    planned_rows
        The planner's own chunk length along the axis: whole periods are joined
        while the chunk stays within it (one period at least).
    period_starts
        For each kind of period, coarsest first (years, then months), the
        indices where one starts. Only starts on a storage-chunk boundary are
        used, so each storage chunk is still read by one task.
    storage_rows
        The storage chunk's length along the axis (``None``: contiguous).

    Returns
    -------
    The chunk lengths for the coarsest kind of period whose every period fits
    ``cap_bytes``, or ``None`` when none fits or fewer than two periods start.

    Examples
    --------
    >>> years, months = [0, 365, 731], [0, 31, 59, 90]
    >>> calendar_chunks(1000, row_bytes=10, cap_bytes=4000, planned_rows=30, period_starts=[years])
    (365, 366, 269)
    >>> calendar_chunks(120, row_bytes=10, cap_bytes=1000, planned_rows=60, period_starts=[years, months])
    (59, 31, 30)
    """
    step = storage_rows or 1
    for starts in period_starts:
        bounds = sorted({0, length, *(s for s in starts if 0 < s < length and s % step == 0)})
        periods = [b - a for a, b in itertools.pairwise(bounds)]
        if len(periods) < 2 or max(periods) * row_bytes > cap_bytes:
            continue
        joined = [periods[0]]
        for rows in periods[1:]:
            if (joined[-1] + rows) <= planned_rows and (joined[-1] + rows) * row_bytes <= cap_bytes:
                joined[-1] += rows
            else:
                joined.append(rows)
        return tuple(joined)
    return None


__all__ = ["calendar_chunks"]
