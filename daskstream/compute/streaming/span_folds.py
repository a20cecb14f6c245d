"""Partials of pieces folded into a block's partial: combined as they come, few held at once.

A reduction streaming a span computes a partial of each piece (a sum, a
count, a variance's moments, kept axes and all) and merges them with the
reduction's own combine. Large partials (of the axes a reduction keeps) are
combined two at a time, a running one and the next, so a task holds them
twice at most; small ones (a whole piece reduced to a few numbers) wait to be
combined many at a time, since each combine costs the same few dozen numpy
calls whatever it merges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from dask.array.core import _concatenate2

#: The most partials of one kept position combined at once. Large ones (of the axes a reduction keeps) are
#: combined two at a time, a running partial and the next; small ones wait, together, while the partials
#: waiting beside the running ones hold :data:`WAITING_BYTES` at most: a combine is a few dozen numpy calls
#: whatever it merges (dask's variance: tens of microseconds), which, once per piece, cost a variance of 1 MiB
#: pieces a fifth more CPU than the decoding and the moments themselves.
MOST_WAITING = 64

#: The bytes partials may hold beside the running partial of each kept position.
WAITING_BYTES = 2**16


class Fold:
    """One reduction's partials of pieces, combined as they come along its ``reduced`` axes and joined along the
    kept ones: ``partial_of(*where)`` gives a piece's partial, ``combine`` merges a list of them (its reduced axes
    kept as length 1), ``combine.join`` (where it has one) joins the kept positions' partials.

    A fold holds a running partial per kept position and, beside them, waiting partials of
    :data:`WAITING_BYTES` at most, or one partial where a partial alone is larger.
    """

    def __init__(self, reduced: tuple[int, ...], combine: Callable[[list[Any]], Any], partial_of: Any, ndim: int):
        self.combine, self.partial_of = combine, partial_of
        self.kept = [axis for axis in range(ndim) if axis not in reduced]
        self.partials: dict[tuple[int, ...], list[Any]] = {}
        self._waiting: dict[tuple[int, ...], float] = {}  # bytes beside each running partial
        self._waiting_bytes = 0.0  # beside all of them

    def add(self, position: tuple[int, ...], *where: Any) -> None:
        """The partial of the piece at ``position`` (in pieces along each axis), found with ``where``."""
        at = tuple(position[axis] for axis in self.kept)
        waiting = self.partials.setdefault(at, [])
        waiting.append(self.partial_of(*where))
        if len(waiting) == 1:
            return  # the running partial
        size = held_bytes(waiting[-1])
        self._waiting[at] = self._waiting.get(at, 0.0) + size
        self._waiting_bytes += size
        if self._waiting_bytes > WAITING_BYTES:
            # Every position's waiting partials combined, not this one's alone: with many kept positions each
            # holding one, this one's would otherwise be combined in pairs from then on.
            for position in self._waiting:
                self.partials[position][:] = [self.combine(self.partials[position])]
            self._waiting.clear()
            self._waiting_bytes = 0.0
        elif len(waiting) >= MOST_WAITING:
            self._waiting_bytes -= self._waiting.pop(at)
            waiting[:] = [self.combine(waiting)]

    def result(self) -> Any:
        """The partials combined at each kept position, joined."""
        combined = {
            p: self.combine(waiting) if len(waiting) > 1 else waiting[0] for p, waiting in self.partials.items()
        }
        return (getattr(self.combine, "join", None) or joined_partials)(combined, self.kept)


def held_bytes(partials: Any) -> float:
    """The bytes ``partials`` hold (arrays, numbers, and dicts, lists and tuples of them); anything else counted
    as too large to wait."""
    if isinstance(partials, (np.ndarray, np.generic)):
        return partials.nbytes
    if isinstance(partials, (int, float, complex)):
        return 16
    if isinstance(partials, Mapping):
        partials = list(partials.values())
    if isinstance(partials, (list, tuple)):
        return sum(held_bytes(partial) for partial in partials)
    return float(WAITING_BYTES + 1)  # not known: combined as soon as it comes


def joined_partials(parts: Mapping[tuple[int, ...], Any], axes: list[int]) -> Any:
    """The partials at each kept position, joined along the kept ``axes`` (dicts of partials field by field)."""
    if not axes:
        return parts[()]
    counts = [max(position[i] for position in parts) + 1 for i in range(len(axes))]

    def nest(prefix: tuple[int, ...]) -> Any:
        if len(prefix) == len(counts):
            return parts[prefix]
        return [nest((*prefix, i)) for i in range(counts[len(prefix)])]

    nested = nest(())
    first = next(iter(parts.values()))
    if isinstance(first, dict):
        return {field: _concatenate2(_field(nested, field), axes=axes) for field in first}
    return _concatenate2(nested, axes=axes)


def _field(nested: Any, field: str) -> Any:
    return [_field(item, field) for item in nested] if isinstance(nested, list) else nested[field]


__all__ = ["MOST_WAITING", "WAITING_BYTES", "Fold", "held_bytes", "joined_partials"]
