"""Byte budgets: normalised once at the boundary, plain ints afterwards."""

from __future__ import annotations

import math
from numbers import Integral, Real

from dask.utils import format_bytes, parse_bytes

from daskstream.advice import keyword, named, said
from daskstream.errors import InvalidBudgetError, shown

#: The largest budget :func:`parse_budget` accepts: 1 EiB (1024 PiB, ``2**60`` bytes). The largest
#: machines hold a few TiB of memory, a million times less, so a budget beyond this is a
#: typo or a mixed-up unit; refusing it also keeps the planner's arithmetic within int64.
MAX_BUDGET_BYTES = 2**60

# The memory model's named terms beside a task's chunk (the planner's working-set factor) and a
# computation's projected terms (planning.computation.TERMS): what work that holds blocks outside
# tasks (streams, writers) and whole-column kernels count.

#: Copies of a block a task applying ``numpy.quantile`` holds: the block, numpy's partitioned copy
#: and the sort keys.
QUANTILE_BLOCK_COPIES = 3
#: Copies of a block a filtered HDF5 write holds: the block, its shuffled copy, the compressed bytes.
FILTERED_WRITE_COPIES = 3


def plannable_bytes(memory_budget: int) -> int:
    """The part of a worker's budget work may plan to fill: a fifth stays free for what the allocator
    keeps of freed blocks and for the loop around the work.

    >>> plannable_bytes(1000)
    800
    """
    return memory_budget * 4 // 5


# Longer reprs (a pasted 400-digit int) are shortened in messages, which are one line.


def parse_budget(value: int | float | str, *, name: str = "memory_budget") -> int:
    """Return ``value`` as a positive number of bytes, at most :data:`MAX_BUDGET_BYTES`.

    Parameters
    ----------
    value
        An int or float of bytes, or a string with a unit such as ``"512MiB"``
        or ``"2 GB"``.
    name
        What the value is called, for the error message.

    Returns
    -------
    int
        The number of bytes, from 1 to ``2**60`` (1 EiB).

    Raises
    ------
    InvalidBudgetError
        When the value is not a size (a bool, ``None``, text without a number),
        is not finite (``inf``, ``nan``, ``"1e400"``), is not more than 0 bytes,
        or is more than 1 EiB, more memory than any machine has.

    Examples
    --------
    >>> parse_budget("512MiB")
    536870912
    >>> parse_budget(4096)
    4096
    """
    text = shown(value)
    hint = said("give ", named(name), ' as bytes (an int) or a string with a unit, e.g. "512MiB" or "2GiB"')
    if isinstance(value, bool) or not isinstance(value, (Integral, Real, str)):
        raise InvalidBudgetError(said(keyword(name, text=text), " is not a size; ", hint))
    if isinstance(value, str) and not value.strip():
        # dask reads text without a number as one of its unit ("" is 1 byte, "MB" one megabyte).
        raise InvalidBudgetError(said(keyword(name, text=text), " is empty; ", hint))
    if _is_infinite_or_nan(value):
        raise InvalidBudgetError(said(keyword(name, text=text), " is not a finite size; ", hint))
    if isinstance(value, Integral):
        nbytes = int(value)  # exact, however large: compared with the limit below
    else:
        try:
            nbytes = int(parse_bytes(float(value) if isinstance(value, Real) else value))
        except OverflowError as exc:  # "1e400 kB" is a float infinity once read
            raise InvalidBudgetError(said(keyword(name, text=text), " is not a finite size; ", hint)) from exc
        except (ValueError, TypeError) as exc:
            raise InvalidBudgetError(said(keyword(name, text=text), " is not a size; ", hint)) from exc
    if nbytes <= 0:
        raise InvalidBudgetError(said(keyword(name, text=text), " must be more than 0 bytes; ", hint))
    if nbytes > MAX_BUDGET_BYTES:
        raise InvalidBudgetError(
            said(
                keyword(name, text=text),
                " is more than 1 EiB (1024 PiB, 2**60 bytes), the most daskstream accepts and more memory than "
                "any machine has; ",
                hint,
            )
        )
    return nbytes


def format_size(nbytes: float) -> str:
    """Human-readable bytes, e.g. ``"1.00 GiB"``.

    >>> format_size(3 * 2**20)
    '3.00 MiB'
    """
    return format_bytes(int(nbytes))


def _is_infinite_or_nan(value: Real | str) -> bool:
    """Whether ``value`` is, or is text that Python reads as, an infinite or NaN float ("inf", "1e400")."""
    if isinstance(value, Integral):
        return False
    try:
        return not math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False  # text with a unit, which dask reads
